"""flops.py is the accounting the scaling law is fitted on: these tests pin it to the paper's numbers
(§3.1, truncate-or-not App. D.1) and to the instantiated model."""
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import flops
from conftest import meta_only_dataset
from flops import ModelConfig
from model import GPT

REPO = Path(__file__).resolve().parents[1]


def non_embedding_params(model):
    return sum(p.numel() for p in model.parameters()) - model.wte.weight.numel() - model.lm_head.weight.numel()


@pytest.mark.parametrize("r, millions", [(1, 98.33), (2, 59.82), (4, 40.15), (8, 30.32)])
def test_paper_parameter_counts_at_s10(r, millions):
    cfg = ModelConfig(r=r, scale=10)
    counts = flops.param_counts(cfg)
    assert round(counts["n_params"] / 1e6, 2) == millions
    assert counts["n_params"] == counts["n_once"] + counts["n_rec"]
    with torch.device("meta"):  # full-size model without allocating its weights
        model = GPT(cfg)
    assert non_embedding_params(model) == counts["n_params"]
    assert model.wte.weight.numel() + model.lm_head.weight.numel() == counts["n_embedding"]


@pytest.mark.parametrize("injection", flops.INJECTIONS)
def test_every_injection_mode_counts_the_parameters_the_model_has(injection):
    """N_rec holds the shared block and the injection's own parameters, N_once the rest: the model's
    parameters outside the shared block and the injection are exactly N_once."""
    cfg = ModelConfig(r=4, scale=2, head_dim=32, injection=injection)
    counts = flops.param_counts(cfg)
    model = GPT(cfg)
    assert non_embedding_params(model) == counts["n_params"]
    shared = sum(p.numel() for p in model.recur.parameters())
    assert counts["n_rec"] == shared + flops.injection_params(cfg)


def test_flops_per_token_matches_paper_example():
    cfg = ModelConfig(r=1, scale=10, vocab_size=32064, seq_len=2048)
    assert flops.flops_per_token(cfg) == 1_027_676_160


def test_iso_depth_means_nearly_iso_flops():
    # r only adds the injection matmul per loop: within 4% of the plain model at s = 10.
    base = flops.flops_per_token(ModelConfig(r=1, scale=10))
    for r in (2, 4, 8):
        assert 1.0 < flops.flops_per_token(ModelConfig(r=r, scale=10)) / base < 1.04


def test_reference_horizon_matches_recipe():
    assert flops.reference_horizon(looped=True) == 1_016_083_200
    assert flops.reference_horizon(looped=False) == 983_315_200


# Every injection mode with full BPTT, then truncation, longer loops and the plain stack.
FLOP_CASES = [(injection, 4, 4) for injection in flops.INJECTIONS] + [
    ("linear", 4, 2), ("linear", 8, 3), ("additive", 4, 1), ("additive", 2, 2), ("hyper", 8, 8), ("linear", 1, 1)]


@pytest.mark.parametrize("injection", flops.UNTIED_INJECTIONS)
def test_the_untied_model_counts_r_copies_of_the_loop_at_the_tied_models_flops(injection):
    """Truncate or Not? App. E.2: every loop its own block, W_inj and loop norm: N_once + r N_rec (and r - 1 more
    loop norms), exactly what model.py builds, at the same FLOPs per token, measured."""
    tied = ModelConfig(r=3, scale=2, head_dim=32, prelude=1, recur=2, coda=1, vocab_size=500, seq_len=64,
                       injection=injection)
    untied = ModelConfig(**{**flops.config_record(tied), "untied": True})
    tied_counts, counts = flops.param_counts(tied), flops.param_counts(untied)
    model = GPT(untied)
    assert non_embedding_params(model) == counts["n_params"]
    assert counts["n_rec"] == 3 * tied_counts["n_rec"] + 2 * tied.d_model and counts["n_once"] == tied_counts["n_once"]
    assert flops.flops_breakdown(untied) == flops.flops_breakdown(tied)
    idx = torch.randint(0, untied.vocab_size, (2, untied.seq_len))
    counter = FlopCounterMode(display=False)
    with counter, sdpa_kernel(SDPBackend.MATH):
        model(idx, idx).backward()
    measured = {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}
    assert measured["aten.mm"] == flops.flops_breakdown(untied)["matmul"] * idx.numel()


def test_the_optimizer_term_is_the_newton_schulz_matmuls_muonh_runs():
    """MuonH orthogonalises every matrix the model gives it (NS_ITERATIONS Newton-Schulz steps, counted by
    FlopCounterMode on muonh.orthogonalise), one step for the whole model whatever its (T, B)."""
    from muonh import POLAR_EXPRESS_COEFFICIENTS, orthogonalise
    cfg = ModelConfig(r=4, scale=2, head_dim=32, prelude=1, recur=2, coda=1, vocab_size=500, seq_len=64)
    assert flops.NS_ITERATIONS == len(POLAR_EXPRESS_COEFFICIENTS)
    shapes = sorted(tuple(p.shape) for p in GPT(cfg).param_groups()["matrix"])
    assert shapes == sorted(flops.muonh_matrices(cfg))
    counter = FlopCounterMode(display=False)
    with counter:
        for shape in shapes:
            orthogonalise(torch.randn(shape), compute_dtype=torch.float32)
    elementwise = sum(flops.MUONH_FLOPS_PER_PARAM * r * c for r, c in shapes)
    counts = flops.param_counts(cfg)
    elementwise += flops.ADAMW_FLOPS_PER_PARAM * (counts["n_params"] + counts["n_embedding"] - sum(r * c for r, c in shapes))
    assert flops.optimizer_flops_per_step(cfg) == counter.get_total_flops() + elementwise
    assert flops.optimizer_flops_per_step(ModelConfig(**{**flops.config_record(cfg), "r": 8, "r_bwd": 2})) == \
        flops.optimizer_flops_per_step(cfg)


# Truncate or Not? Table 6: (8, 2) and (4, 4) at 16 D0 (256 sequences of 2,048, 32,768 steps), measured compute.
TABLE_6 = {(12, 2, 4, 2): 2.41, (16, 2, 5, 2): 4.59, (20, 3, 6, 3): 8.28, (26, 3, 7, 4): 15.29, (34, 4, 8, 4): 28.38}


@pytest.mark.parametrize("layout, compute", TABLE_6.items())
def test_measured_compute_is_table_6s_column(layout, compute):
    """Their measured compute adds the optimiser (0.06-5.7%) to the passes: F D alone gives 2.410 ... 28.213e19; the
    matmuls a FLOP counter sees plus the optimiser's steps give the column (F D + steps x optimizer would land 240M
    on 8.29)."""
    s, p, r, c = layout
    for T, B in ((8, 2), (4, 4)):
        cfg = ModelConfig(r=T, r_bwd=B, scale=s, prelude=p, recur=r, coda=c)
        assert round(flops.measured_flops(cfg, 16 * 2 ** 30, 32768) / 1e19, 2) == compute
        assert flops.flops_per_token(cfg) * 16 * 2 ** 30 < flops.measured_flops(cfg, 16 * 2 ** 30, 32768)


@pytest.mark.parametrize("injection, r, r_bwd", FLOP_CASES)
def test_matmul_flops_equal_flop_counter(injection, r, r_bwd):
    """Counted on a real forward+backward. Attention runs through SDPA's math backend so that its
    QK^T and AV are visible as bmm's to FlopCounterMode (the fused CPU kernel is not counted);
    flops.py counts attention as 4dT forward per layer, unhalved for the causal mask, x3 with backward.
    The block norms' 2d parameters are a FLOP *convention* in the paper's formula, not matmuls."""
    cfg = ModelConfig(r=r, r_bwd=r_bwd, scale=2, head_dim=32, vocab_size=500, seq_len=64, injection=injection)
    torch.manual_seed(0)
    model = GPT(cfg)
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    counter = FlopCounterMode(display=False)
    with counter, sdpa_kernel(SDPBackend.MATH):
        model(idx, idx).backward()
    per_token = flops.flops_breakdown(cfg)
    n_tokens = idx.numel()
    measured = {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}
    assert measured["aten.mm"] == per_token["matmul"] * n_tokens
    assert measured["aten.bmm"] == per_token["attention"] * n_tokens
    assert flops.flops_per_token(cfg) == sum(per_token.values())


def test_truncation_reduces_flops_as_2f_plus_6k():
    full = ModelConfig(r=8, scale=10)
    half = ModelConfig(r=8, r_bwd=4, scale=10)
    d, T = 640, 2048
    # Each of the 4 forward-only loops (2 layers + W_inj) drops its backward: 4 FLOPs/param and
    # 8dT of attention per layer.
    per_loop = 4 * (2 * (12 * d * d + 2 * d) + 2 * d * d) + 8 * 2 * d * T
    assert flops.flops_per_token(full) - flops.flops_per_token(half) == 4 * per_loop


def test_section1_equivalence_example():
    """§1 / App. G.5: at r = 4 and phi = 0.46 "a 410M looped model performs on par with a 580M
    non-looped model, but incurs the training cost of a 1B non-looped one": s = 32 (d = 2048), depth 20.
    App. G.5 derives the sizes as "purely architectural ratios" of the 1B model. The unique count
    includes W_inj (8 n_b + 2d^2 = 41%, as §3.1's "~41%"), but 580M is the layer ratio
    (l_p + l_c + r^phi l_recur) / l_eff = (4 + 4 * 4^0.46) / 20 = 57.8%, which leaves W_inj out of
    N_rec. With W_inj in N_rec (§3.1's definition, the one the joint law is fitted with) N_eff is 598M:
    the whole 16M gap is 4^0.46 x W_inj, not an accounting difference."""
    d = 2048
    looped = flops.param_counts(ModelConfig(r=4, scale=32))
    plain = flops.param_counts(ModelConfig(r=1, scale=32))["n_params"]
    n_b, w_inj = flops.block_params(d), 2 * d * d
    assert looped["n_once"] == 4 * n_b + 3 * d and looped["n_rec"] == 4 * n_b + w_inj
    assert round(looped["n_params"] / 1e7) == 41 and round(plain / 1e8) == 10       # "410M", "1B"
    layer_ratio = (4 + 4 * 4 ** 0.46) / 20
    assert round(layer_ratio * plain / 1e7) == 58                                     # "580M" (582M)
    n_eff = flops.effective_params(looped["n_once"], looped["n_rec"], 4, 0.46)
    assert round(n_eff / 1e6) == 598
    assert n_eff - 4 ** 0.46 * w_inj == pytest.approx(layer_ratio * plain, rel=1e-5)  # up to the 3d norms
    ratio = flops.flops_per_token(ModelConfig(r=4, scale=32)) / flops.flops_per_token(ModelConfig(r=1, scale=32))
    assert 1.0 < ratio < 1.03  # the loop adds only W_inj: 4 x 2d^2 per token-step


@pytest.mark.parametrize("fraction, steps", [(0.0, 40), (0.3, 40), (0.49, 40), (0.51, 41), (0.75, 41), (0.999, 41)])
def test_budget_to_tokens_rounds_steps_to_the_nearest(fraction, steps):
    """steps = round(C / (F B)), D = steps B (§4.1's iso-FLOP grid): a budget of 40.51 steps buys 41, one of
    40.49 buys 40, and the FLOPs spent are F D."""
    cfg = ModelConfig(r=4, scale=10)
    F, B = flops.flops_per_token(cfg), 2 ** 18
    out = flops.tokens_for_budget(cfg, (40 + fraction) * F * B, B)
    assert out == {"steps": steps, "tokens": steps * B, "flops_actual": F * steps * B}


def test_paper_budget_to_tokens():
    """The paper's 1e18 budget at s = 10, r = 4: F = 1,047,336,960 FLOPs/token, 1e18 / (F 2^18) = 3642.4 steps,
    so 3642 steps of 2^18 tokens (0.955B tokens, 0.9999 of the budget)."""
    out = flops.tokens_for_budget(ModelConfig(r=4, scale=10), 1e18, 2 ** 18)
    assert flops.flops_per_token(ModelConfig(r=4, scale=10)) == 1_047_336_960
    assert (out["steps"], out["tokens"]) == (3642, 3642 * 2 ** 18)
    assert out["flops_actual"] == 1_047_336_960 * 3642 * 2 ** 18


def test_mfu_uses_same_flops():
    cfg = ModelConfig(r=4, scale=10)
    m = flops.mfu(cfg, 1e5, 1, "NVIDIA H100 80GB HBM3")
    assert m == pytest.approx(flops.flops_per_token(cfg) * 1e5 / 989e12)
    assert flops.mfu(cfg, 1e5, 1, "cpu") is None
    assert flops.peak_flops("NVIDIA H100 PCIe") == 756e12


def test_mfu_of_several_gpus_divides_by_all_their_peaks():
    """MFU = F x (tokens/s of the whole job) / (n_gpus x peak): 8 GPUs at 8x the tokens/s of one have its MFU."""
    cfg = ModelConfig(r=4, scale=10)
    one = flops.mfu(cfg, 2e5, 1, "NVIDIA H200")
    assert flops.mfu(cfg, 8 * 2e5, 8, "NVIDIA H200") == pytest.approx(one, rel=1e-12)
    assert flops.mfu(cfg, 2e5, 8, "NVIDIA H200") == pytest.approx(one / 8, rel=1e-12)
    assert one == pytest.approx(1_047_336_960 * 2e5 / 989e12, rel=1e-12)


@pytest.mark.parametrize("bad, reason", [
    (["--r", "3"], "not divisible"),
    (["--scale", "11"], "head dim"),
    (["--r", "4", "--r-bwd", "2", "--injection", "hyper"], "full BPTT"),
    (["--r", "4", "--r-bwd", "5"], "r-bwd"),
    (["--r", "4", "--injection", "bogus"], "invalid choice"),
    # each was once a traceback (ZeroDivisionError) or silently accepted
    (["--head-dim", "0"], "argument --head-dim: invalid integer >= 1 value: '0'"),
    (["--seq-len", "0"], "argument --seq-len: invalid integer >= 1 value: '0'"),
    (["--phi", "nan"], "argument --phi: invalid finite number value: 'nan'"),
    (["--flops", "inf"], "argument --flops: invalid positive number value: 'inf'"),
    (["--r", "-1"], "argument --r: invalid integer >= 1 value: '-1'"),
    (["--r", "0"], "argument --r: invalid integer >= 1 value: '0'"),
    (["--batch-tokens", "0"], "argument --batch-tokens: invalid integer >= 1 value: '0'"),
    (["--hc-lanes", "0"], "argument --hc-lanes: invalid integer >= 1 value: '0'"),
    (["--prelude", "-1"], "argument --prelude: invalid integer >= 0 value: '-1'"),
    (["--scale", "nan"], "argument --scale: invalid positive number value: 'nan'"),
])
def test_cli_rejects_bad_input_with_one_reason_and_exit_2(bad, reason):
    proc = subprocess.run([sys.executable, "flops.py", *bad], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert reason in proc.stderr.strip().splitlines()[-1] and "Traceback" not in proc.stderr


def test_python_callers_get_a_reason_too():
    for bad in ({"head_dim": 0}, {"seq_len": 0}):
        with pytest.raises(ValueError, match="must be >= 1"):
            ModelConfig(r=4, scale=10, **bad)


def plan_cli(lines, *args, env=None):
    return subprocess.run([sys.executable, "flops.py", "--plan", *args], cwd=REPO, capture_output=True, text=True,
                          input="".join(line + "\n" for line in lines), env=env)


def test_plan_prices_each_line_with_the_datas_vocab_and_estimates_wall_time(tmp_path):
    """sweep.sh --plan pipes "name|train.py flags" lines into flops.py --plan (so sweep.sh holds no
    Python). Train-only flags are ignored; vocab/seq-len come from the data's meta.json; the wall time
    from --flops-per-s or from the achieved rate of the rows already in a results file."""
    meta_only_dataset(tmp_path, vocab_size=2048, seq_len=128, train_tokens=10 ** 9)
    lines = ["a|--r 1 --scale 0.5 --flops 2e12 --head-dim 8 --batch-tokens 2048 --eval-rows 1024",
             "b|--r 4 --scale 0.5 --flops 2e12 --head-dim 8 --batch-tokens 2048 --lr-matrix 0.056"]
    proc = plan_cli(lines, "--data", str(tmp_path), "--flops-per-s", "1e9")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    cfgs = [ModelConfig(r=r, scale=0.5, head_dim=8, vocab_size=2048, seq_len=128) for r in (1, 4)]
    plans = [flops.tokens_for_budget(cfg, 2e12, 2048) for cfg in cfgs]
    for line, cfg, plan in zip(out[1:3], cfgs, plans):
        cols = line.split()
        assert cols[5] == "-"  # a FLOP budget, not a token level (D/D0)
        assert int(cols[6].replace(",", "")) == flops.param_counts(cfg)["n_params"]
        assert int(cols[7].replace(",", "")) == plan["tokens"]
    total = sum(p["flops_actual"] for p in plans)
    assert f"2 runs, total compute {total:.3e} FLOPs" in proc.stdout
    assert f"estimated wall time {total / 1e9 / 3600:,.1f} h at 1.000e+09 FLOP/s" in proc.stdout
    results = tmp_path / "results.jsonl"
    results.write_text(json.dumps({"tokens_per_s": 1000.0, "flops_per_token": 2e6}) + "\n{torn line\n")
    proc = plan_cli(lines, "--data", str(tmp_path), "--results", str(results))
    assert f"estimated wall time {total / 2e9 / 3600:,.1f} h at 2.000e+09 FLOP/s per run slot (mean achieved " \
           f"rate of the 1 runs in {results})" in proc.stdout


def test_plan_refuses_data_that_the_largest_run_would_repeat(tmp_path):
    meta_only_dataset(tmp_path, vocab_size=2048, seq_len=128, train_tokens=300_000,  # as prepare_data.py writes:
                      settings={"sources": [["a", 9], ["b", 9], ["c", 9], ["v", 4]]},  # three training shards
                      split={"val_files": ["v"]})                                       # of 100k tokens, one val
    line = "big|--r 1 --scale 0.5 --flops 5e12 --head-dim 8 --batch-tokens 2048"
    tokens = flops.tokens_for_budget(ModelConfig(r=1, scale=0.5, head_dim=8, vocab_size=2048, seq_len=128),
                                     5e12, 2048)["tokens"]
    assert tokens > 300_000
    proc = plan_cli([line], "--data", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"flops.py: the largest run reads {tokens:,} tokens but {tmp_path} holds 300,000 "
                                   f"training tokens (3 training shard(s), ~0.1M tokens each): prepare >= "
                                   f"{math.ceil(tokens / 100_000)} training shards (prepare_data.py --shards N), "
                                   f"or set ALLOW_REPEAT=1 to repeat data knowingly")
    allowed = plan_cli([line], "--data", str(tmp_path), env=dict(os.environ, ALLOW_REPEAT="1"))
    assert allowed.returncode == 0 and "runs will repeat data" in allowed.stdout


def test_plan_reads_the_training_shards_from_a_real_prepared_dataset(sample_data):
    """The same check on what prepare_data.py writes (one training file, one validation file)."""
    meta = json.loads((sample_data / "meta.json").read_text())
    proc = plan_cli(["big|--r 1 --scale 1 --head-dim 16 --flops 1e13 --batch-tokens 1024"], "--data", str(sample_data))
    per_file = meta["train_tokens"]  # one training shard
    assert proc.returncode == 2 and f"holds {meta['train_tokens']:,} training tokens (1 training shard(s)" in proc.stderr
    tokens = int(re.search(r"reads ([\d,]+) tokens", proc.stderr).group(1).replace(",", ""))
    assert f"prepare >= {math.ceil(tokens / per_file)} training shards" in proc.stderr


@pytest.mark.parametrize("lines, reason", [
    (["x|--r 4 --scale 10"], "plan line 'x' has no --flops or --tokens horizon"),
    ([], "no plan lines on stdin"),
    (["x|--r 3 --scale 10 --flops 1e18"], "not divisible"),
])
def test_plan_bad_lines_are_one_line_and_exit_2(lines, reason):
    proc = plan_cli(lines)
    assert proc.returncode == 2 and proc.stdout == "" and reason in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_cli_json():
    """flops.py --json for r = 4, s = 10, r_bwd = 2 at 1e18 FLOPs: the counts and F of §3.1's formulas written
    out here, and the budget's steps, tokens and FLOPs spent."""
    proc = subprocess.run([sys.executable, "flops.py", "--r", "4", "--scale", "10", "--r-bwd", "2",
                           "--flops", "1e18", "--json"], cwd=REPO, capture_output=True, text=True, check=True)
    out = json.loads(proc.stdout)
    d, T, V = 640, 2048, 32064
    n_b = 12 * d * d + 2 * d
    n_once, n_rec = 4 * n_b + 3 * d, 4 * n_b + 2 * d * d  # prelude 2 + coda 2 (+ 3 norms); shared 4 + W_inj
    k, f = 2, 2  # loops with and without backward
    F = 6 * (4 * n_b + V * d) + (2 * f + 6 * k) * (4 * n_b + 2 * d * d) + 12 * 4 * d * T + (4 * f + 12 * k) * 4 * d * T
    steps = round(1e18 / (F * 2 ** 18))
    assert (out["n_once"], out["n_rec"], out["n_params"]) == (n_once, n_rec, n_once + n_rec)
    assert out["n_embedding"] == 2 * V * d and out["flops_per_token"] == F and out["r_bwd"] == 2
    assert (out["steps"], out["tokens"], out["flops_actual"]) == (steps, steps * 2 ** 18, F * steps * 2 ** 18)
    assert out == json.loads(json.dumps(flops.summary(ModelConfig(r=4, scale=10, r_bwd=2), 1e18, 2 ** 18)))


def test_custom_fixed_parameter_layouts():
    """truncate-or-not's fixed-N grids: 2/4/2 with T in {1,2,4,8,16} share one parameter count."""
    counts = {T: flops.param_counts(ModelConfig(r=T, prelude=2, recur=4, coda=2, scale=4, head_dim=64))["n_params"]
              for T in (1, 2, 4, 8, 16)}
    assert len(set(counts.values())) == 1
    assert ModelConfig(r=16, prelude=2, recur=4, coda=2, scale=4, head_dim=64).depth == 68
    assert ModelConfig(r=8, depth=24, prelude=4, coda=4).recur == 2  # App. G.4 depth variant
