"""
Sampled recurrence depth (train.py --loops, nanoloop/loops.py): a loop count T per optimiser step from a Poisson
log-normal (Huginn's) or a uniform range, gradients through the last min(B, T) loops; one draw per step from the
seed and the step alone, so every rank runs the same T and a resume redraws it; a FLOP budget buys steps at the
exact expectation of F over the capped distribution; the identity names the distribution, and only then.
"""
import json
import math
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import flops
from nanoloop import dataloader, runs
from nanoloop.loops import (SIGMA, LoopCounts, backward_loops, draw, expected_flops_per_token, mean_loops, pmf,
                            realised_flops_per_token)
import train
from conftest import stop_train_after

REPO = Path(__file__).resolve().parents[1]
TINY = ["--scale", "1", "--head-dim", "16", "--depth", "6", "--prelude", "1", "--coda", "1",
        "--batch-tokens", "512", "--ref-batch", "512", "--eval-rows", "64", "--log-every", "1", "--r", "2"]
HUGINN = LoopCounts("poisson-lognormal", mean=4, low=1, high=64)
CFG = flops.ModelConfig(r=4, scale=0.25, head_dim=8, vocab_size=2048, seq_len=128)


def test_the_poisson_lognormal_has_the_mean_and_spread_of_its_formula():
    """T = 1 + Poisson(lam), ln lam ~ N(ln(m) - SIGMA^2/2, SIGMA), m = mean - 1: E[T] = mean and
    Var[T] = m + m^2 (e^{SIGMA^2} - 1) (a Poisson's variance plus its rate's); with the cap at 64 the mass cut
    off is negligible. The draws have the same mean and spread."""
    probs = pmf(HUGINN, 4)
    m = HUGINN.mean - 1
    mean = sum(t * p for t, p in probs.items())
    variance = sum((t - mean) ** 2 * p for t, p in probs.items())
    assert math.isclose(sum(probs.values()), 1.0, abs_tol=1e-12)
    assert math.isclose(mean, 4.0, abs_tol=1e-6)
    assert math.isclose(variance, m + m * m * (math.exp(SIGMA ** 2) - 1), rel_tol=1e-5)
    draws = [draw(HUGINN, 0, step, 4) for step in range(40000)]
    assert abs(statistics.fmean(draws) - 4.0) < 0.05 and abs(statistics.pvariance(draws) - variance) < 0.25
    assert min(draws) >= 1 and max(draws) <= 64


def test_the_cap_piles_the_tail_on_the_largest_loop_count():
    capped = replace(HUGINN, high=6)
    probs = pmf(capped, 4)
    assert max(probs) == 6 and math.isclose(sum(probs.values()), 1.0, abs_tol=1e-12)
    assert math.isclose(probs[6], sum(p for t, p in pmf(HUGINN, 4).items() if t >= 6), rel_tol=1e-9)


def test_a_step_draws_the_same_loop_count_on_every_rank_and_after_a_resume(monkeypatch):
    """A draw is a function of (seed, step): not of the rank, the process or how many draws came before."""
    first = [draw(HUGINN, 3, step, 4) for step in range(50)]
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert [draw(HUGINN, 3, step, 4) for step in reversed(range(50))][::-1] == first
    assert [draw(HUGINN, 4, step, 4) for step in range(50)] != first  # another seed, other loop counts


def test_the_expected_flops_are_the_enumerated_distribution_with_truncation():
    """E[F(T, min(B, T))]: every T of the capped distribution at its probability, each step's model the layout
    run T times with min(B, T) trained (Truncate or Not?'s 2 FLOPs per parameter forward-only, 6 trained)."""
    for loops in (HUGINN, replace(HUGINN, high=8, r_bwd=2), LoopCounts("uniform", low=1, high=6, r_bwd=3)):
        enumerated = 0.0
        for t, p in pmf(loops, CFG.r).items():
            b = min(loops.r_bwd, t) if loops.r_bwd else t
            step_cfg = flops.ModelConfig(r=t, r_bwd=b, recur=CFG.recur, scale=0.25, head_dim=8, vocab_size=2048,
                                         seq_len=128)
            enumerated += p * flops.flops_per_token(step_cfg)
        assert math.isclose(expected_flops_per_token(CFG, loops), enumerated, rel_tol=1e-12)
    # truncation to B = 2 of a mean-4 distribution costs less than F at its mean r, and not the nominal one
    assert expected_flops_per_token(CFG, replace(HUGINN, r_bwd=2)) < 0.8 * flops.flops_per_token(CFG)
    assert expected_flops_per_token(CFG, LoopCounts()) == flops.flops_per_token(CFG)


def test_a_backward_count_above_the_drawn_loops_trains_them_all():
    uniform = LoopCounts("uniform", low=1, high=4, r_bwd=3)
    cfg = flops.ModelConfig(r=4, r_bwd=3, scale=0.25, head_dim=8)
    assert [backward_loops(uniform, cfg, t) for t in (1, 2, 3, 4)] == [1, 2, 3, 3]
    assert [backward_loops(replace(uniform, r_bwd=0), cfg, t) for t in (1, 4)] == [1, 4]
    assert backward_loops(LoopCounts(), cfg, 4) == 3  # a fixed run keeps --r-bwd


def identity_of(sample_data, *extra):
    args = train.parse_args(["--data", str(sample_data), *TINY, "--tokens", "5120", *extra])
    meta = dataloader.read_meta(sample_data)
    return runs.run_identity(args, meta, runs.plan_run(args, meta, 1))


def test_the_identity_names_the_distribution_and_nothing_else_changes(sample_data):
    plain, fixed = identity_of(sample_data), identity_of(sample_data, "--loops", "fixed", "--loops-max", "9")
    assert plain[1] == fixed[1] and "loops" not in plain[0]
    huginn = identity_of(sample_data, "--loops", "poisson-lognormal", "--loops-mean", "2.5", "--loops-max", "8")
    assert huginn[0]["loops"] == {"kind": "poisson-lognormal", "mean": 2.5, "low": 1, "high": 8, "r_bwd": 0}
    others = [identity_of(sample_data, "--loops", "poisson-lognormal", "--loops-mean", "3", "--loops-max", "8")[1],
              identity_of(sample_data, "--loops", "uniform", "--loops-min", "1", "--loops-max", "3")[1]]
    assert len({plain[1], huginn[1], *others}) == 4


def test_a_budget_buys_steps_at_the_expected_flops(sample_data):
    budget = ["--flops", "4e10"]
    flags = ["--loops", "uniform", "--loops-min", "1", "--loops-max", "6"]
    args = train.parse_args(["--data", str(sample_data), *TINY, *budget, *flags])
    plan = runs.plan_run(args, dataloader.read_meta(sample_data), 1)
    expected = expected_flops_per_token(plan.cfg, plan.loops)
    assert plan.horizon.steps == round(4e10 / (expected * 512))
    assert expected > flops.flops_per_token(plan.cfg)  # mean 3.5 loops of a model built at r = 2


@pytest.mark.parametrize("bad, said", [(["--loops", "uniform", "--loops-min", "5", "--loops-max", "3"], "--loops-min"),
                                       (["--loops", "poisson-lognormal", "--loops-max", "8"], "--loops-mean"),
                                       (["--loops", "uniform", "--injection", "hyper"], "one shared block")])
def test_a_distribution_that_cannot_train_is_one_line(sample_data, tmp_path, capsys, bad, said):
    with pytest.raises(SystemExit) as exit_:
        train.main(["--data", str(sample_data), "--out", str(tmp_path / "x"), *TINY, "--tokens", "5120", *bad])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and said in err[0], err


SAMPLED = ["--tokens", "5120", "--loops", "uniform", "--loops-min", "1", "--loops-max", "4", "--r-bwd", "2"]


def test_a_sampled_run_trains_shows_its_loops_and_resumes_bit_identically(sample_data, tmp_path, monkeypatch,
                                                                         capsys):
    unbroken, resumed = tmp_path / "unbroken", tmp_path / "resumed"
    assert train.main(["--data", str(sample_data), "--out", str(unbroken), *TINY, *SAMPLED]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    shown = [int(line.split("| T ")[1].split()[0]) for line in lines]
    assert shown == [draw(LoopCounts("uniform", low=1, high=4, r_bwd=2), 0, step, 2) for step in range(10)]
    put_back = stop_train_after(monkeypatch, 5)
    assert train.main(["--data", str(sample_data), "--out", str(resumed), *TINY, *SAMPLED]) == 143
    put_back()
    assert train.main(["--data", str(sample_data), "--out", str(resumed), *TINY, *SAMPLED, "--resume"]) == 0
    ours = torch.load(unbroken / "ckpt.pt", weights_only=True)["model"]
    theirs = torch.load(resumed / "ckpt.pt", weights_only=True)["model"]
    assert all(torch.equal(ours[key], theirs[key]) for key in ours)
    row = json.loads((unbroken / "final.json").read_text())
    realised = realised_flops_per_token(flops.ModelConfig(**row["identity"]["model"]),
                                        LoopCounts("uniform", low=1, high=4, r_bwd=2), 0, row["steps"])
    assert math.isclose(row["flops_realised"], realised * row["tokens"], rel_tol=1e-12)
    assert row["loops"]["kind"] == "uniform" and row["flops_actual"] != row["flops_realised"]


@pytest.mark.slow
def test_two_gloo_ranks_draw_the_loop_counts_of_one_process(sample_data, tmp_path):
    """torchrun with 2 CPU ranks (gloo): each step runs one T on both ranks, the same T as a single process, so
    the losses agree (a rank that drew its own T would change the loss of its half of the batch)."""
    common = ["train.py", "--data", str(sample_data), *TINY, *SAMPLED]
    single = subprocess.run([sys.executable, *common, "--out", str(tmp_path / "one")], cwd=REPO, capture_output=True,
                            text=True, timeout=600)
    assert single.returncode == 0, single.stderr
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                          "127.0.0.1", "--master_port", "29523", "--", *common, "--out", str(tmp_path / "two")],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    logs = [[json.loads(line)["loss"] for line in (tmp_path / name / "log.jsonl").read_text().splitlines()]
            for name in ("one", "two")]
    assert len(logs[0]) == len(logs[1]) == 10 and all(abs(a - b) < 1e-4 for a, b in zip(*logs)), logs


def test_a_sampled_run_is_exported_and_scored_at_its_mean_loop_count(sample_data, tmp_path):
    """export_hf.py's default loop count (config.json num_loops) and runs.check_run's record of the distribution:
    a uniform 1..6 run built at r = 2 is used at 4 loops (E[T] = 3.5, rounded half to even); a fixed run at r."""
    import export_hf
    out = tmp_path / "sampled"
    flags = ["--tokens", "2048", "--loops", "uniform", "--loops-min", "1", "--loops-max", "6"]
    assert train.main(["--data", str(sample_data), "--out", str(out), *TINY, *flags]) == 0
    run = runs.check_run(out)
    assert run["loops"] == LoopCounts("uniform", low=1, high=6) and mean_loops(run["loops"], 2) == 4
    model = runs.load_run_model(out, "cpu")
    meta = dataloader.read_meta(sample_data)
    assert export_hf.config_json(run, model, meta)["num_loops"] == 4
    assert mean_loops(LoopCounts(), 2) == 2 and mean_loops(HUGINN, 4) == 4


def test_a_sampled_loop_count_compiles_each_block_on_every_device():
    """#51's compile rule: the whole model is one graph on GPU at a fixed r; a sampled T compiles each block there
    too, as every CPU run does (why: the next test)."""
    assert runs.compiles_per_block(torch.device("cpu"), LoopCounts())
    assert not runs.compiles_per_block(torch.device("cuda"), LoopCounts())
    assert runs.compiles_per_block(torch.device("cuda"), LoopCounts("uniform", low=1, high=7))
    assert runs.compiles_per_block(torch.device("cuda"), HUGINN)


@pytest.mark.slow
def test_the_whole_model_fails_at_a_second_loop_count_where_the_blocks_run_every_one():
    """The whole model under Dynamo fails at the run's second distinct T (it retraces with T symbolic, which the
    loop's gradient switch cannot branch on), while the blocks compiled alone run every drawn T with one graph
    (dev/bench_loops.py prints both)."""
    sys.path.insert(0, str(REPO / "dev"))
    from bench_loops import step_times, whole_model_graphs
    uniform = LoopCounts("uniform", low=1, high=7)
    cfg = flops.ModelConfig(r=4, scale=0.25, head_dim=8, vocab_size=256, seq_len=16)
    assert whole_model_graphs(LoopCounts(), cfg, steps=3, batch=2) == (1, "")
    _, stopped = whole_model_graphs(uniform, cfg, steps=3, batch=2)
    assert stopped.startswith("failed at step 1")
    assert step_times(uniform, cfg, steps=4, batch=2)[0] == 1  # one block graph for every drawn T
