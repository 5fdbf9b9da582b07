"""train.py end to end on CPU with tiny models and the real FineWeb-Edu sample: it learns, one row per
run is complete and agrees with flops.py, DDP equals one process, and a killed run resumes exactly."""
import errno
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import signal
import threading
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from nanoloop import common
from nanoloop import dataloader
import flops
import muonh
from nanoloop import recipe
from nanoloop import runs
from nanoloop import tracking
import train

REPO = Path(__file__).resolve().parents[1]
# A 6-layer-deep, 64-wide looped model: small enough for seconds per run on 2 cores.
TINY = ["--scale", "1", "--head-dim", "16", "--depth", "6", "--prelude", "1", "--coda", "1",
        "--batch-tokens", "512", "--ref-batch", "512", "--eval-rows", "64", "--log-every", "1"]


def run_inprocess(sample_data, out, *extra):
    return train.main(["--data", str(sample_data), "--out", str(out), *TINY, *extra])


def losses(out):
    return {rec["step"]: rec["loss"] for rec in map(json.loads, (Path(out) / "log.jsonl").read_text().splitlines())}


def run_cli(*args, **kw):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, env=env, **kw)


def unigram_cross_entropy(sample_data):
    """Nats/token of the validation targets under the training split's unigram distribution:
    the loss of a model that learned token frequencies and nothing else."""
    meta = dataloader.read_meta(sample_data)
    train_rows = np.fromfile(sample_data / "train.bin", dtype=np.uint16).reshape(-1, meta["row_len"])
    val_rows = np.fromfile(sample_data / "val.bin", dtype=np.uint16).reshape(-1, meta["row_len"])
    counts = np.bincount(train_rows[:, 1:].ravel(), minlength=meta["vocab_size"]) + 1.0
    logp = np.log(counts / counts.sum())
    return float(-logp[val_rows[:, 1:].ravel()].mean())


def test_learns_beyond_unigram_and_writes_a_complete_row(sample_data, tmp_path):
    results = tmp_path / "results.jsonl"
    assert run_inprocess(sample_data, tmp_path / "run", "--r", "2", "--flops", "4e10", "--ref-tokens", "2e4",
                         "--results", str(results)) == 0
    (row,) = map(json.loads, results.read_text().splitlines())
    for key in ("r", "r_bwd", "injection", "scale", "d_model", "depth", "n_params", "n_once", "n_rec",
                "n_embedding", "tokens", "flops_budget", "flops_actual", "batch_tokens", "steps", "val_loss",
                "seed", "tokens_per_s", "mfu", "wall_s", "data_meta"):
        assert key in row, key
    cfg = flops.ModelConfig(r=2, scale=1, head_dim=16, depth=6, prelude=1, coda=1, vocab_size=512, seq_len=64)
    plan = flops.tokens_for_budget(cfg, 4e10, 512)
    assert (row["steps"], row["tokens"], row["flops_actual"]) == (plan["steps"], plan["tokens"], plan["flops_actual"])
    assert row["n_params"] == flops.param_counts(cfg)["n_params"] and row["flops_budget"] == 4e10
    assert row["val_loss"] < unigram_cross_entropy(sample_data) - 0.3
    assert json.loads((tmp_path / "run" / "final.json").read_text()) == row
    # The row names its run: identity (config, horizon, LRs, seed, eval rows, dtype, data) and its hash.
    assert row["finished"] is True and set(row["identity"]) == {
        "model", "horizon", "lrs", "base_lrs", "lr_rule", "seed", "eval_rows", "dtype", "data"}
    assert row["identity"]["data"] == dataloader.data_identity(dataloader.read_meta(sample_data))
    assert row["run_id"] == hashlib.sha256(json.dumps(row["identity"], sort_keys=True, separators=(",", ":"))
                                           .encode()).hexdigest()
    assert json.loads((tmp_path / "run" / "run.json").read_text()) == {"run_id": row["run_id"],
                                                                       "identity": row["identity"]}


# Each case's id is its mode (`pytest -k gated` runs a new mode's tests), the modes read from flops.INJECTIONS.
MODE_CASES = [pytest.param(["--r", "4", "--injection", injection], id=injection) for injection in flops.INJECTIONS] + [
    pytest.param(["--r", "4", "--injection", "linear", "--r-bwd", "2"], id="linear-truncated"),
    pytest.param(["--r", "4", "--injection", "additive", "--r-bwd", "1"], id="additive-truncated"),
    pytest.param(["--r", "1"], id="plain-r1"),
]


@pytest.mark.parametrize("extra", MODE_CASES)
def test_every_mode_trains(sample_data, tmp_path, extra):
    """Each injection mode, truncated BPTT and the plain r = 1 stack train: the loss falls, the row's counts are
    flops.py's for that model, its LRs are the transfer rule's for its horizon (r = 1 from the r = 1 reference,
    App. E), and --eval-r evaluates at other loop counts (the trained r itself reproduces val_loss)."""
    assert run_inprocess(sample_data, tmp_path / "run", *extra, "--tokens", "2048", "--eval-r", "1,8") == 0
    row = json.loads((tmp_path / "run" / "final.json").read_text())
    flags = dict(zip(extra[::2], extra[1::2]))
    r = int(flags["--r"])
    cfg = flops.ModelConfig(r=r, r_bwd=int(flags.get("--r-bwd", 0)), injection=flags.get("--injection", "linear"),
                            scale=1, head_dim=16, depth=6, prelude=1, coda=1, vocab_size=512, seq_len=64)
    for key, value in flops.summary(cfg).items():
        assert row[key] == value, key
    assert row["steps"] == 4 and row["tokens"] == 2048
    tokens_ref = flops.reference_horizon(looped=r > 1)
    assert row["lrs"] == pytest.approx(muonh.learning_rates(64, 512, 2048, tokens_ref, ref_batch=512), rel=1e-12)
    logged = losses(tmp_path / "run")
    assert logged[4] < logged[1] and row["val_loss"] < math.log(512)  # below the uniform loss it starts at
    assert math.isfinite(row["val_loss_r1"]) and math.isfinite(row["val_loss_r8"])
    if r == 1:
        assert row["val_loss_r1"] == row["val_loss"]
    else:  # one loop instead of r (4 steps in, the loops are close to a fixed point: r = 8 may equal r)
        assert row["val_loss_r1"] != row["val_loss"]


def test_lr_schedule_decays_every_group_linearly_to_a_tenth(sample_data, tmp_path, monkeypatch):
    """App. E: no warmup, lr(step) = peak (1 - 0.9 step / (steps - 1)) for the MuonH and every AdamW group,
    peak = the row's transfer-rule LR; log.jsonl records that multiplier at every step."""
    seen = []
    real_train_step = train.train_step

    def recording_train_step(run, step, grad_accum):
        out = real_train_step(run, step, grad_accum)
        seen.append({g["name"]: (g["lr"], g["initial_lr"]) for opt in run.optimizers for g in opt.param_groups})
        return out
    monkeypatch.setattr(train, "train_step", recording_train_step)
    assert run_inprocess(sample_data, tmp_path / "run", "--r", "2", "--tokens", "5120") == 0
    row = json.loads((tmp_path / "run" / "final.json").read_text())
    steps = row["steps"]
    assert steps == 10 == len(seen) and set(seen[0]) == {"matrix", "embedding", "unembedding", "norm"}
    for step, groups in enumerate(seen):
        multiplier = 1 - 0.9 * step / (steps - 1)
        for name, (lr, initial_lr) in groups.items():
            assert initial_lr == row["lrs"][name]
            assert lr == pytest.approx(initial_lr * multiplier, rel=1e-12), (step, name)
    assert seen[-1]["matrix"][0] == pytest.approx(0.1 * row["lrs"]["matrix"], rel=1e-12)
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [rec["step"] for rec in records] == list(range(1, steps + 1))
    assert [rec["lr_mult"] for rec in records] == pytest.approx([1 - 0.9 * s / (steps - 1) for s in range(steps)])


def held_out_loss(model, data, split, n_rows, r):
    """Mean next-token loss of `model` at r loops on the first n_rows rows of `split` in the data order
    (the permutation seeded 1234 for the first pass), computed here without train.py's loader."""
    meta = dataloader.read_meta(data)
    rows = np.fromfile(data / f"{split}.bin", dtype=np.uint16).reshape(-1, meta["row_len"])
    picked = torch.from_numpy(rows[np.random.default_rng([1234, 0]).permutation(len(rows))[:n_rows]].astype(np.int64))
    with torch.no_grad():
        logits = model(picked[:, :-1], r=r)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), picked[:, 1:].reshape(-1)).item()


def test_the_validation_loss_is_the_held_out_rows(sample_data, tmp_path):
    """val_loss is the trained model's mean loss on --eval-rows rows of val.bin (the held-out split), the same
    rows at every loop count: --eval-r at the trained r reproduces it exactly, at r = 4 it is that r's loss on
    those rows; the training split's rows give another number."""
    out = tmp_path / "run"
    assert run_inprocess(sample_data, out, "--r", "2", "--tokens", "2048", "--eval-r", "2,4") == 0
    row = json.loads((out / "final.json").read_text())
    model = runs.load_run_model(out, "cpu")
    assert row["eval_rows"] == 64
    assert row["val_loss"] == pytest.approx(held_out_loss(model, sample_data, "val", 64, r=2), rel=1e-6)
    assert row["val_loss_r2"] == row["val_loss"]
    assert row["val_loss_r4"] == pytest.approx(held_out_loss(model, sample_data, "val", 64, r=4), rel=1e-6)
    assert abs(row["val_loss_r4"] - row["val_loss"]) > 1e-5 * row["val_loss"]  # r matters at this tolerance
    assert held_out_loss(model, sample_data, "train", 64, r=2) != pytest.approx(row["val_loss"], rel=1e-4)


def test_gradient_accumulation_matches_one_big_batch(sample_data, tmp_path):
    run_inprocess(sample_data, tmp_path / "a", "--r", "2", "--tokens", "2048", "--device-batch", "8")
    run_inprocess(sample_data, tmp_path / "b", "--r", "2", "--tokens", "2048", "--device-batch", "2")
    a, b = losses(tmp_path / "a"), losses(tmp_path / "b")
    assert a.keys() == b.keys() and all(abs(a[k] - b[k]) < 1e-4 for k in a)


@pytest.mark.slow
def test_torchrun_two_ranks_match_one_process(sample_data, tmp_path):
    # "--" before the script: torchrun's own argparse (Python <= 3.11) would otherwise read our
    # --r as an ambiguous abbreviation of its --rdzv-*/--role flags and refuse to start.
    common = ["train.py", "--data", str(sample_data), *TINY, "--r", "4", "--r-bwd", "2", "--tokens", "3072"]
    single = run_cli(*common, "--out", str(tmp_path / "one"))
    assert single.returncode == 0, single.stderr
    ddp = run_cli("-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                  "--master_port", "29517", "--", *common, "--out", str(tmp_path / "two"))
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert one.keys() == two.keys() == set(range(1, 7))
    assert all(abs(one[k] - two[k]) < 1e-4 for k in one), (one, two)
    v1 = json.loads((tmp_path / "one" / "final.json").read_text())["val_loss"]
    v2 = json.loads((tmp_path / "two" / "final.json").read_text())["val_loss"]
    assert abs(v1 - v2) < 1e-4


def wait_for_steps(out, n, proc):
    """Poll until `out`'s log has n steps, the process has ended, or 120 s have passed (a liveness bound)."""
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not (out / "log.jsonl").exists():
        time.sleep(0.05)
    while time.time() < deadline and proc.poll() is None and len(losses(out)) < n:
        time.sleep(0.05)


@pytest.mark.slow
def test_killed_run_resumes_exactly(sample_data, tmp_path, capsys):
    """SIGTERM: train.py checkpoints and exits 143; kill -9 (no handler runs): the last periodic checkpoint,
    written atomically, and the lock the kernel released with the process are all a resume needs. Either way the
    resumed run's losses and row are the uninterrupted run's, bit for bit. (The three runs train side by side,
    one thread each; what trains nothing is asked of train.main in this process.)"""
    args = ["--data", str(sample_data), *TINY, "--r", "4", "--tokens", "15360", "--save-every", "0"]
    out, out9, args9 = tmp_path / "killed", tmp_path / "killed9", args[:-1] + ["3"]
    with open(tmp_path / "ref.log", "w") as ref_log:
        reference = start_training(*args, "--out", str(tmp_path / "ref"), stdout=ref_log, stderr=subprocess.STDOUT)
    proc = start_training(*args, "--out", str(out))
    proc9 = start_training(*args9, "--out", str(out9), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_steps(out, 5, proc)
    proc.send_signal(signal.SIGTERM)
    wait_for_steps(out9, 8, proc9)
    proc9.kill()
    proc9.wait()
    stdout, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "interrupted at step" in stdout
    stopped_at = max(losses(out))
    assert stopped_at < 30 and (out / "ckpt.pt").exists() and not (out / "final.json").exists()
    assert (out9 / "ckpt.pt").exists() and not (out9 / "final.json").exists()
    # Without --resume the checkpoint is not silently overwritten.
    assert exit_code(train.main, [*args, "--out", str(out)]) == 2 and "--resume" in capsys.readouterr().err
    # Nor is it continued with another horizon (the LR schedule would silently change).
    other = [a if a != "15360" else "20480" for a in args]
    assert exit_code(train.main, [*other, "--out", str(out), "--resume"]) == 2
    assert "differs in horizon.steps (30 -> 40)" in capsys.readouterr().err
    resumed = start_training(*args, "--out", str(out), "--resume")
    resumed9 = start_training(*args9, "--out", str(out9), "--resume", stdout=subprocess.DEVNULL)
    stdout, stderr = resumed.communicate(timeout=600)
    assert resumed.returncode == 0 and f"resumed {out / 'ckpt.pt'} at step {stopped_at}/30" in stdout, stderr[-2000:]
    _, stderr9 = resumed9.communicate(timeout=600)
    assert resumed9.returncode == 0, stderr9[-2000:]
    assert reference.wait(timeout=600) == 0, (tmp_path / "ref.log").read_text()[-2000:]
    ref, ref_row = losses(tmp_path / "ref"), json.loads((tmp_path / "ref" / "final.json").read_text())
    assert set(losses(out)) == set(ref) == set(range(1, 31))
    assert losses(out) == ref, "resumed losses differ from the uninterrupted run"
    assert json.loads((out / "final.json").read_text())["val_loss"] == ref_row["val_loss"]
    assert losses(out9) == ref and json.loads((out9 / "final.json").read_text())["val_loss"] == ref_row["val_loss"]
    # A finished run is never retrained by accident.
    assert train.main([*args, "--out", str(out), "--resume"]) == 0
    assert capsys.readouterr().out.startswith("already done:")


def start_training(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE):
    """train.py as its own process (one thread), its output piped: for the tests that send it signals."""
    return subprocess.Popen([sys.executable, "train.py", *args], cwd=REPO, stdout=stdout, stderr=stderr, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))


def wait_until(done, proc):
    """Poll done() until it holds, the process has ended, or 120 s have passed (a liveness bound, not a timing)."""
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not done():
        time.sleep(0.01)
    assert done(), proc.communicate()[1][-2000:] if proc.poll() is not None else "timed out"


def logged(out, step):
    return lambda: (out / "log.jsonl").exists() and step in losses(out)


# Steps of 64 micro-batches of one row each (gradient accumulation): seconds per step on 2 cores.
ACCUMULATED = ["--r", "4", "--batch-tokens", "4096", "--device-batch", "1", "--tokens", "12288", "--save-every", "0"]


@pytest.mark.slow
def test_a_stop_mid_step_drops_the_step_and_resumes_exactly(sample_data, tmp_path):
    """Old: SIGINT/SIGTERM were honoured between optimiser steps only, so a run whose step accumulates many
    micro-batches ignored Ctrl-C and `timeout` for minutes. Now a SIGINT sent as step 2 begins is said at once
    ("stopping at step 2/3"), step 2 is dropped at its next micro-batch instead of finished, step 1 is
    checkpointed (exit 143), and --resume gives the uninterrupted run's losses bit for bit: the dropped step's
    rows and RNG draws (--random-state-init's noise, drawn every forward) are undone."""
    args = ["--data", str(sample_data), *TINY, *ACCUMULATED, "--random-state-init"]
    reference = run_cli("train.py", *args, "--out", str(tmp_path / "ref"))
    assert reference.returncode == 0, reference.stderr
    out = tmp_path / "stopped"
    proc = start_training(*args, "--out", str(out))
    wait_until(logged(out, 1), proc)
    proc.send_signal(signal.SIGINT)  # step 2 is in flight
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr[-2000:]
    said = [line for line in stdout.splitlines() if line.startswith("train.py: ")]
    assert len(said) == 2 and said[0].startswith("train.py: stopping at step 2/3 (SIGINT): "), said
    assert said[1] == (f"train.py: interrupted at step 1/3; checkpoint saved to {out / 'ckpt.pt'}. Rerun with --resume "
                       f"to continue.")
    assert set(losses(out)) == {1} and torch.load(out / "ckpt.pt", weights_only=True)["step"] == 1
    resumed = run_cli("train.py", *args, "--out", str(out), "--resume")
    assert resumed.returncode == 0 and f"resumed {out / 'ckpt.pt'} at step 1/3" in resumed.stdout, resumed.stderr
    assert losses(out) == losses(tmp_path / "ref"), "resumed losses differ from the uninterrupted run"
    ref_row = json.loads((tmp_path / "ref" / "final.json").read_text())
    assert json.loads((out / "final.json").read_text())["val_loss"] == ref_row["val_loss"]


@pytest.mark.slow
def test_a_second_ctrl_c_exits_at_once_and_keeps_the_last_whole_checkpoint(sample_data, tmp_path):
    """A stop waits for the micro-batch in flight, here a whole step (one micro-batch of 256 rows). A second
    Ctrl-C does not wait: exit 130 during step 2, no checkpoint written for it, so ckpt.pt is step 1's, whole,
    with no temp file beside it."""
    out = tmp_path / "run"
    proc = start_training("--data", str(sample_data), *TINY, "--r", "4", "--batch-tokens", "16384", "--device-batch",
                          "256", "--tokens", "49152", "--save-every", "1", "--out", str(out))
    wait_until(lambda: (out / "ckpt.pt").exists(), proc)  # written after step 1: step 2 is in flight
    step1 = (out / "ckpt.pt").read_bytes()
    proc.send_signal(signal.SIGTERM)
    line = proc.stdout.readline()
    while line and not line.startswith("train.py: stopping at step 2/3 (SIGTERM)"):
        line = proc.stdout.readline()
    proc.send_signal(signal.SIGINT)  # the stop said, step 2 still in flight
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    assert "train.py: interrupted again: exiting now" in stderr and "interrupted at step" not in stdout
    assert (out / "ckpt.pt").read_bytes() == step1 and torch.load(out / "ckpt.pt", weights_only=True)["step"] == 1
    assert sorted(path.name for path in out.iterdir()) == [".lock", "ckpt.pt", "log.jsonl", "run.json"]


def test_a_cpu_run_without_a_horizon_is_refused_with_what_the_default_would_cost(sample_data, tmp_path):
    """Old: no --flops/--tokens/--tokens-per-param on CPU trained the GPU default, 20 tokens per parameter at
    262,144-token steps: 31 steps of 128 micro-batches for the quick start's model, hours. Now one line names
    the flags to add and what the default would have been (steps, micro-batches, tokens), before any work."""
    model = ["--r", "4", "--scale", "1", "--head-dim", "16", "--depth", "6", "--prelude", "1", "--coda", "1"]
    refused = run_cli("train.py", "--data", str(sample_data), "--out", str(tmp_path / "run"), *model, "--device", "cpu",
                      timeout=120)  # a liveness bound: the default itself would train for minutes
    code, err = refused.returncode, refused.stderr.strip().splitlines()
    cfg = flops.ModelConfig(r=4, scale=1, head_dim=16, depth=6, prelude=1, coda=1, vocab_size=512, seq_len=64)
    steps = round(recipe.DEFAULT_TOKENS_PER_PARAM * flops.param_counts(cfg)["n_params"] / flops.BATCH_TOKENS)
    micro = flops.BATCH_TOKENS // 64 // 16  # rows per step over the largest micro-batch of <= 16 rows
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("train.py: no horizon: on CPU give --tokens, --flops or --tokens-per-param")
    assert f"would be {steps} steps of {micro} micro-batches, {steps * flops.BATCH_TOKENS:,} tokens" in err[0]
    assert not (tmp_path / "run").exists()


def progress_lines(stdout):
    """(step, tok/s, ETA in seconds) of each progress line (log_progress)."""
    found = []
    for line in stdout.splitlines():
        if line.startswith("step "):
            fields = line.split(" | ")
            eta = fields[-1].removeprefix("eta ")
            seconds = float(eta[:-1]) * 60 if eta.endswith("m") else float(eta[:-1])
            step = int(fields[0].split()[1].split("/")[0])
            found.append((step, float(fields[3].split()[0].replace(",", "")), seconds))
    return found


def test_the_eta_is_the_steps_left_at_this_process_speed_from_its_first_step(sample_data, tmp_path, monkeypatch,
                                                                               capsys):
    """Old: the ETA read 0 at step 1 (no step timed yet), and after a resume divided the time since the resume by
    every step so far. Now the header says after which step the ETA comes, and every progress line, the first
    included, before and after a resume, is the steps left times the step time this process measures
    (steps left x tokens a step / its tok/s)."""
    real_train_step = train.train_step

    def stop_after_five_steps(run, step, grad_accum):
        if step == 4:
            train.STOP.set()
        return real_train_step(run, step, grad_accum)
    monkeypatch.setattr(train, "STOP", threading.Event())
    monkeypatch.setattr(train, "train_step", stop_after_five_steps)
    horizon = ["--r", "2", "--tokens", "20480"]  # 40 steps of 512 tokens
    assert run_inprocess(sample_data, tmp_path / "run", *horizon) == 143
    stopped = capsys.readouterr().out
    monkeypatch.setattr(train, "STOP", threading.Event())
    monkeypatch.setattr(train, "train_step", real_train_step)
    assert run_inprocess(sample_data, tmp_path / "run", *horizon, "--resume") == 0
    resumed = capsys.readouterr().out
    for out, steps in ((stopped, range(1, 6)), (resumed, range(6, 41))):
        assert f"; ETA after step {steps[0]}\n" in out
        lines = progress_lines(out)
        assert [step for step, _, _ in lines] == list(steps)  # --log-every 1
        for step, tokens_per_s, eta in lines:
            expected = (40 - step) * 512 / tokens_per_s
            assert abs(eta - expected) <= 0.5 + 1e-3 * expected, (step, eta, expected)  # printed rounded


def test_samples_are_printed_with_their_prompt(sample_data, tmp_path, capsys):
    """--sample prints prompt + continuation (old: the continuation alone), after training and again when the
    finished run is asked for (what a rerun of dev/quickstart.sh shows): the same texts, seeded by --seed."""
    args = ["--r", "2", "--tokens", "2048", "--sample", "2", "--sample-tokens", "6", "--prompt", "Once upon a time"]
    assert run_inprocess(sample_data, tmp_path / "run", *args) == 0
    trained = [line for line in capsys.readouterr().out.splitlines() if line.startswith("--- ")]
    assert run_inprocess(sample_data, tmp_path / "run", *args) == 0
    again = capsys.readouterr().out.splitlines()
    assert again[0].startswith("already done: ") and again[1:] == trained
    assert len(trained) == 2 and all(line.startswith("--- 'Once upon a time") for line in trained), trained
    assert all(len(line) > len("--- 'Once upon a time'") for line in trained)  # something was sampled


@pytest.mark.slow
def test_the_quick_start_reruns_in_any_state(tmp_path):
    """dev/quickstart.sh, shortened by flags it passes on to train.py (20 steps; data and run in tmp_path). Stopped
    by Ctrl-C, a rerun resumes it (old: "ckpt.pt exists: pass --resume", and no flag passed on); finished, it ends
    with three samples shown with their prompt; rerun then, it prints the result and samples and trains nothing,
    and `--sample 5` gives five."""
    out = tmp_path / "quickstart"
    env = dict(os.environ, OMP_NUM_THREADS="1", DATA=str(tmp_path / "data"), PYTHON=sys.executable)
    quickstart = ["bash", "dev/quickstart.sh", "--out", str(out), "--tokens", "40960", "--log-every", "1"]
    proc = subprocess.Popen(quickstart, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    wait_until(logged(out, 3), proc)
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches bash and train.py
    stdout, stderr = proc.communicate(timeout=120)
    stopped = re.search(r"train\.py: interrupted at step (\d+)/20;", stdout)
    assert proc.returncode == 143 and stopped, stderr[-2000:]
    resumed = subprocess.run(quickstart, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed {out / 'ckpt.pt'} at step {stopped.group(1)}/20" in resumed.stdout
    samples = [line for line in resumed.stdout.splitlines() if line.startswith("--- ")]
    assert len(samples) == 3 and all(line.startswith("--- 'The capital of France is") for line in samples), samples
    again = subprocess.run([*quickstart, "--sample", "5"], cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0 and again.stdout.startswith(f"already done: {out} holds this run"), again.stderr
    samples = [line for line in again.stdout.splitlines() if line.startswith("--- ")]
    assert len(samples) == 5 and all(line.startswith("--- 'The capital of France is") for line in samples), samples


@pytest.mark.parametrize("bad, reason", [
    (["--r", "3"], "not divisible"),
    (["--r", "4", "--r-bwd", "2", "--injection", "hyper"], "full BPTT"),
    (["--batch-tokens", "500"], "not a multiple of the sequence length"),
    (["--flops", "1e12", "--tokens", "1000"], "only one of"),
    (["--seq-len", "128"], "does not match the data"),
    (["--device-batch", "3"], "does not divide"),
    (["--batch-tokens", "0"], "--batch-tokens: invalid integer >= 1 value"),
    (["--log-every", "0"], "--log-every: invalid integer >= 1 value"),
    (["--device-batch", "-4"], "--device-batch: invalid integer >= 0 value"),
    (["--save-every", "-1"], "--save-every: invalid integer >= 0 value"),
    (["--eval-rows", "0"], "--eval-rows: invalid integer >= 1 value"),
    (["--eval-r", "2,x"], "--eval-r: invalid comma-separated list of integers >= 1 value: '2,x'"),
    (["--lr-matrix", "nan"], "--lr-matrix: invalid finite number value"),
    (["--dtype", "float16"], "invalid choice"),
])
def test_bad_flags_fail_fast_with_one_line(sample_data, tmp_path, capsys, bad, reason):
    with pytest.raises(SystemExit) as exit_:
        run_inprocess(sample_data, tmp_path / "x", "--tokens", "2048", *bad)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and reason in err and err.count("\n") == 1, err
    assert not (tmp_path / "x").exists()


def test_missing_data_says_how_to_make_it(tmp_path):
    proc = run_cli("train.py", "--data", str(tmp_path / "nope"), "--r", "4")
    assert proc.returncode == 2 and "prepare_data.py" in proc.stderr


@pytest.mark.parametrize("lrs, why", [
    (["--lr-norm", "1e8"], "the weights are no longer finite"),
    (["--lr-norm", "1e30", "--lr-embedding", "1e30"], "the weights are no longer finite"),
    (["--lr-unembedding", "30"], "steps above"),  # 12-17 nats, no NaN (uniform: 6.2)
])
def test_divergence_stops_without_a_row_and_keeps_only_finite_checkpoints(sample_data, tmp_path, capsys, lrs, why):
    """Old: the NaN check read the loss before the optimiser step, so the step that made the
    weights non-finite was checkpointed (resume then failed at once); a run sitting 10 nats above
    the uniform loss without NaN wrote its row as if fine."""
    out, results = tmp_path / "run", tmp_path / "results.jsonl"
    code = run_inprocess(sample_data, out, "--r", "2", "--tokens", "40960", "--save-every", "1",
                         "--results", str(results), *lrs)
    assert code == 1 and why in capsys.readouterr().err
    assert results.read_text() == "" and not (out / "final.json").exists()
    weights = torch.load(out / "ckpt.pt", weights_only=True)["model"]  # the last finite one
    assert all(torch.isfinite(w).all() for w in weights.values())


# ----------------------------------------------------------------------------------------------
# Results you can trust: every test below reproduces a way an earlier train.py produced
# a wrong, missing or duplicated result without an error.

def derived_dataset(sample_data, dest, train_rows=None, flip_bytes=False):
    """A copy of the sample dataset. train_rows: keep only the first rows of train.bin and record
    its new size and checksum (a different, valid dataset). flip_bytes: change train.bin behind
    meta.json's back (a corrupted dataset)."""
    shutil.copytree(sample_data, dest)
    meta = json.loads((dest / "meta.json").read_text())
    rows = np.fromfile(dest / "train.bin", dtype=np.uint16).reshape(-1, meta["row_len"])
    if flip_bytes:
        rows[: len(rows) // 10, 1:] = (rows[: len(rows) // 10, 1:] + 1) % meta["vocab_size"]
    if train_rows:
        rows = rows[:train_rows]
        meta.update(train_rows=train_rows, train_tokens=int(rows.size))
    rows.tofile(dest / "train.bin")
    if not flip_bytes:
        meta["train_sha256"] = dataloader.sha256_file(dest / "train.bin")
    (dest / "meta.json").write_text(json.dumps(meta))
    return dest


def stopped_after_one_step(sample_data, out, monkeypatch, *extra):
    """Run until the first step's SIGTERM check: a checkpoint at step 1, exit 143."""
    monkeypatch.setattr(train, "STOP", threading.Event())
    train.STOP.set()
    assert run_inprocess(sample_data, out, "--r", "2", "--tokens", "5120", *extra) == 143
    monkeypatch.setattr(train, "STOP", threading.Event())


def exit_code(fn, *args):
    with pytest.raises(SystemExit) as exit_:
        fn(*args)
    return exit_.value.code


def test_resume_refuses_a_checkpoint_of_other_data_lr_or_seed(sample_data, tmp_path, monkeypatch, capsys):
    """Old: --resume checked only the model config and step count, so a checkpoint continued
    under other data, LRs or seed, and the row recorded only the new flags."""
    out = tmp_path / "run"
    stopped_after_one_step(sample_data, out, monkeypatch)
    other_data = derived_dataset(sample_data, tmp_path / "other", train_rows=2000)
    for data, extra, key in [(sample_data, ["--seed", "1"], "seed (0 -> 1)"),
                             (sample_data, ["--lr-matrix", "0.02"], "base_lrs.matrix (0.014 -> 0.02)"),
                             (other_data, [], "data.train_sha256")]:
        code = exit_code(train.main, ["--data", str(data), "--out", str(out), *TINY, "--r", "2", "--tokens", "5120",
                                      "--resume", *extra])
        assert code == 2 and key in capsys.readouterr().err
    assert run_inprocess(sample_data, out, "--r", "2", "--tokens", "5120", "--resume") == 0


def test_corrupted_dataset_is_refused_before_training(sample_data, tmp_path, capsys):
    """Old: 10% of train.bin's tokens rewritten trained to exit 0 and a row."""
    bad = derived_dataset(sample_data, tmp_path / "bad", flip_bytes=True)
    code = exit_code(train.main, ["--data", str(bad), "--out", str(tmp_path / "run"), *TINY, "--tokens", "2048"])
    assert code == 2 and "sha256" in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_unwritable_results_path_fails_before_compute(sample_data, tmp_path, capsys):
    """Old: --results was first opened after all the compute, and failed with a traceback."""
    (tmp_path / "file").write_text("not a folder")
    code = exit_code(run_inprocess, sample_data, tmp_path / "run", "--tokens", "2048",
                     "--results", str(tmp_path / "file" / "results.jsonl"))
    assert code == 2 and "cannot write the outputs" in capsys.readouterr().err
    assert not (tmp_path / "run" / "log.jsonl").exists() and not (tmp_path / "run" / "ckpt.pt").exists()


def test_checkpoints_load_without_running_code(sample_data, tmp_path, capsys):
    """Old: torch.load(weights_only=False) ran whatever a shared ckpt.pt pickled."""
    class Payload:
        def __reduce__(self):
            return open, (str(tmp_path / "pwned"), "w")
    (tmp_path / "run").mkdir()
    torch.save({"model": Payload()}, tmp_path / "run" / "ckpt.pt")
    code = exit_code(run_inprocess, sample_data, tmp_path / "run", "--tokens", "2048", "--resume")
    assert code == 2 and "cannot be loaded" in capsys.readouterr().err and not (tmp_path / "pwned").exists()


def test_full_disk_leaves_no_half_row_and_a_rerun_writes_it(sample_data, tmp_path, monkeypatch, capsys):
    """Old: a short write left a third of a row without a newline, exit 0 and final.json (so the
    run was never retrained); a kill between the last checkpoint and the row gave null train_loss.
    The disk fills up while the row is written (ENOSPC from fsync of the results file's temp)."""
    results, out = tmp_path / "results.jsonl", tmp_path / "run"
    results.write_text('{"earlier": "row"}\n')
    real_fsync = os.fsync

    def full_disk_fsync(fd):
        if "results.jsonl" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)
    monkeypatch.setattr(os, "fsync", full_disk_fsync)
    code = exit_code(run_inprocess, sample_data, out, "--r", "2", "--tokens", "2048", "--results", str(results))
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert code == 1 and "No space left on device" in capsys.readouterr().err
    assert results.read_text() == '{"earlier": "row"}\n' and not (out / "final.json").exists()
    assert not list(tmp_path.glob(".results.jsonl*"))  # no temp file left behind
    assert run_inprocess(sample_data, out, "--r", "2", "--tokens", "2048", "--results", str(results), "--resume") == 0
    earlier, row = map(json.loads, results.read_text().splitlines())
    assert row["finished"] and math.isfinite(row["train_loss"]) and math.isfinite(row["tokens_per_s"])


def test_second_trainer_on_a_locked_folder_is_busy(sample_data, tmp_path, capsys):
    """Old: two writers on one --out (two sweeps, a requeued job) both trained and both wrote rows."""
    (tmp_path / "run").mkdir()
    with open(tmp_path / "run" / ".lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what a live train.py holds
        assert run_inprocess(sample_data, tmp_path / "run", "--tokens", "2048") == 75
    assert capsys.readouterr().out.startswith("busy:") and not (tmp_path / "run" / "log.jsonl").exists()


def test_a_missing_row_is_restored_from_final_json_and_a_present_row_is_done(sample_data, tmp_path, capsys):
    """Old: final.json alone meant 'finished', so deleting a row never brought it back; then a deleted row
    (or --results added to a finished folder) retrained the whole run although final.json holds the row."""
    results, out = tmp_path / "results.jsonl", tmp_path / "run"
    assert run_inprocess(sample_data, out, "--tokens", "2048", "--results", str(results)) == 0
    first = json.loads(results.read_text())
    assert run_inprocess(sample_data, out, "--tokens", "2048", "--results", str(results)) == 0
    done = capsys.readouterr().out.splitlines()[-1]
    assert done.startswith("already done:") and f"val loss {first['val_loss']:.4f}" in done and str(out) in done
    log_lines = (out / "log.jsonl").read_text()
    for results_now in (results, tmp_path / "added_later.jsonl"):
        results_now.write_text("")
        assert run_inprocess(sample_data, out, "--tokens", "2048", "--results", str(results_now)) == 0
        assert capsys.readouterr().out.splitlines()[-1].startswith("restored:")
        (row,) = map(json.loads, results_now.read_text().splitlines())
        assert row == first
    assert (out / "log.jsonl").read_text() == log_lines  # nothing was trained again


def test_reuse_from_needs_the_exact_identity(sample_data, tmp_path, capsys):
    """Old: a sweep reused sibling runs by name, so another dataset's rows were taken as done."""
    base = tmp_path / "base"
    assert run_inprocess(sample_data, base, "--tokens", "2048", "--results", str(tmp_path / "a.jsonl")) == 0
    assert run_inprocess(sample_data, tmp_path / "same", "--tokens", "2048", "--reuse-from", str(base),
                         "--results", str(tmp_path / "b.jsonl")) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"reused: {base}"
    (reused,) = map(json.loads, (tmp_path / "b.jsonl").read_text().splitlines())
    assert reused["run_id"] == json.loads((base / "final.json").read_text())["run_id"]
    assert reused["out"] == str(tmp_path / "same")
    other_data = derived_dataset(sample_data, tmp_path / "other", train_rows=2000)
    assert train.main(["--data", str(other_data), "--out", str(tmp_path / "other_run"), *TINY, "--tokens", "2048",
                       "--reuse-from", str(base), "--results", str(tmp_path / "b.jsonl")]) == 0
    assert "reused" not in capsys.readouterr().out
    rows = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and rows[1]["identity"]["data"]["train_sha256"] != reused["identity"]["data"]["train_sha256"]
    # Several candidates (a variant sweep offers every sibling grid's run of that name): the first that is
    # this very run is taken, the others are passed over.
    assert run_inprocess(sample_data, tmp_path / "third", "--tokens", "2048", "--reuse-from", str(tmp_path / "other_run"),
                         "--reuse-from", str(base), "--results", str(tmp_path / "c.jsonl")) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"reused: {base}"


def test_a_run_that_repeats_data_says_so(sample_data, tmp_path, capsys):
    """Old: only the row's `epochs` field recorded that the data ran out."""
    small = derived_dataset(sample_data, tmp_path / "small", train_rows=20)
    assert train.main(["--data", str(small), "--out", str(tmp_path / "run"), *TINY, "--tokens", "2048"]) == 0
    err = capsys.readouterr().err
    assert "reads 2,048 tokens but" in err and "holds 1,300 training tokens" in err and "repeats data" in err
    assert json.loads((tmp_path / "run" / "final.json").read_text())["data_meta"]["epochs"] > 1


@pytest.mark.slow
def test_compile_on_cpu_compiles_each_block_to_the_eager_loss_and_gradients(capsys):
    """On CPU, --compile compiles each transformer block's forward (runs.compile_or_eager: one graph serves
    every layer of a width, warm from inductor's cache in seconds), not the whole model. The compiled step's
    loss and gradients are the eager step's to fp32 rounding, and runs.eager_blocks gives every block its
    class's forward back (finish's validation and samples) with the state_dict's keys unchanged."""
    from model import GPT
    cfg = flops.ModelConfig(r=2, scale=0.25, head_dim=8, vocab_size=256, seq_len=32, depth=6, prelude=1, coda=1,
                            injection="gated")
    torch.manual_seed(0)
    model = GPT(cfg)
    assert model.set_device_backend("cpu") == "cpu"  # as train.py: cpu_attention's kernel, compiled around
    keys = list(model.state_dict())
    x = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(1))
    y = torch.roll(x, -1, dims=1)
    eager_loss = model(x, y)
    eager_loss.backward()
    eager_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    compiled, seconds = runs.compile_or_eager(model, 4, 32)
    assert capsys.readouterr().err == ""  # no fallback to eager
    assert compiled is model and seconds > 0
    assert all("forward" in vars(block) for block in model.blocks())  # each block's compiled forward
    loss = compiled(x, y)
    loss.backward()
    assert abs(loss.item() - eager_loss.item()) < 1e-5
    for param, eager_grad in zip(model.parameters(), eager_grads):
        torch.testing.assert_close(param.grad, eager_grad, rtol=1e-4, atol=1e-6)
    runs.eager_blocks(model)
    assert not any("forward" in vars(block) for block in model.blocks())
    assert list(model.state_dict()) == keys


def test_compile_on_cpu_falls_back_to_eager_when_inductor_fails(sample_data, tmp_path, monkeypatch, capsys):
    """Old: --compile was ignored on CPU. Now it compiles there too (dev/bench_train.py measures when
    it pays), and a compiler that fails leaves one line and an eager run with the same losses."""
    def broken_compile(model):
        def fail_at_first_call(*args, **kwargs):
            raise RuntimeError("inductor: no working C++ compiler\nlong traceback")
        return fail_at_first_call
    assert run_inprocess(sample_data, tmp_path / "eager", "--r", "2", "--tokens", "2048") == 0
    monkeypatch.setattr(torch, "compile", broken_compile)
    assert run_inprocess(sample_data, tmp_path / "fallback", "--r", "2", "--tokens", "2048", "--compile") == 0
    err = capsys.readouterr().err
    assert "torch.compile failed (RuntimeError: 'inductor: no working C++ compiler" in err and err.count("\n") == 1
    assert losses(tmp_path / "fallback") == losses(tmp_path / "eager")


# ----------------------------------------------------------------------------------------------
# Faults and bad input, by class: a full disk at any write is one line naming the file and never loses a
# finished run; every file train.py reads fails as one line naming it, before the compute; a horizon the
# batch cannot honour is refused.

def full_disk_at(monkeypatch, name):
    """Make every write to a file called `name` fail with ENOSPC: train.py's atomic writes (run.json,
    ckpt.pt, final.json), common.append_row's (the results file) and the log's open() (tracking.RunLog)."""
    import builtins
    real_atomic, real_open = common.atomic_write, builtins.open

    def atomic(path, data):
        if Path(path).name == name:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_atomic(path, data)

    def log_open(path, mode="r", *args, **kwargs):
        if Path(path).name == name == "log.jsonl":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_open(path, mode, *args, **kwargs)
    for module in (train, runs, common):  # each holds its own name for common.atomic_write
        monkeypatch.setattr(module, "atomic_write", atomic)
    monkeypatch.setattr(tracking, "open", log_open, raising=False)


def code_of(fn, *args):
    """The exit status of fn(*args), returned or raised as SystemExit."""
    try:
        return fn(*args)
    except SystemExit as e:
        return e.code


@pytest.mark.parametrize("name, save_every, row_written", [
    ("run.json", "4", False), ("log.jsonl", "4", False), ("ckpt.pt", "4", False),  # periodic checkpoint
    ("ckpt.pt", "0", True),  # the final checkpoint
    ("results.jsonl", "4", False), ("final.json", "4", True)])
def test_a_full_disk_at_any_write_is_one_line_and_loses_no_finished_run(sample_data, tmp_path, monkeypatch, capsys,
                                                                        name, save_every, row_written):
    """Old: a full disk at the final checkpoint raised a traceback after all the compute (the checkpoint came
    before the evaluation and the row, so the run was lost). Now the row is written whatever fails after the
    training, and a failure before it keeps a whole checkpoint that --resume finishes."""
    results, out = tmp_path / "results.jsonl", tmp_path / "run"
    args = ["--r", "2", "--tokens", "4096", "--save-every", save_every, "--results", str(results)]
    full_disk_at(monkeypatch, name)
    code = code_of(run_inprocess, sample_data, out, *args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and name in err[0] and "No space left on device" in err[0], err
    assert (results.read_text() != "") == row_written
    monkeypatch.undo()
    again = run_inprocess(sample_data, out, *args, "--resume")
    assert again == 0
    (row,) = map(json.loads, results.read_text().splitlines())
    assert row["finished"] and row["steps"] == 8


def test_adding_results_to_a_finished_folder_restores_its_row_without_training(sample_data, tmp_path, capsys):
    out = tmp_path / "run"
    assert run_inprocess(sample_data, out, "--tokens", "2048") == 0
    steps_logged = (out / "log.jsonl").read_text()
    assert run_inprocess(sample_data, out, "--tokens", "2048", "--results", str(tmp_path / "r.jsonl")) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("restored:")
    assert (out / "log.jsonl").read_text() == steps_logged
    assert json.loads((tmp_path / "r.jsonl").read_text()) == json.loads((out / "final.json").read_text())


def damage(path, how):
    if how == "empty":
        path.write_bytes(b"")
    elif how == "garbage":
        path.write_bytes(b"\x00\xffnot what it should be\n" * 7)
    elif how == "wrong structure":
        if path.suffix == ".pt":
            torch.save([1, 2, 3], path)
        else:
            path.write_text(json.dumps([1, 2, 3]))
    elif how.startswith("no "):  # a JSON record without one key
        record = json.loads(path.read_text())
        record.pop(how.removeprefix("no "))
        path.write_text(json.dumps(record))
    else:
        path.unlink()


@pytest.mark.parametrize("how", ["empty", "garbage", "wrong structure"])
def test_a_damaged_checkpoint_is_one_line_naming_it(sample_data, tmp_path, monkeypatch, capsys, how):
    """Old: a 0-byte ckpt.pt ended in an IndexError inside the error handler."""
    out = tmp_path / "run"
    stopped_after_one_step(sample_data, out, monkeypatch)
    damage(out / "ckpt.pt", how)
    code = exit_code(run_inprocess, sample_data, out, "--r", "2", "--tokens", "5120", "--resume")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"{out / 'ckpt.pt'} cannot be loaded" in err[0], err


@pytest.mark.parametrize("key", sorted(runs.RESUME_FIELDS))
def test_a_checkpoint_without_a_key_resume_needs_is_one_line_naming_it(sample_data, tmp_path, monkeypatch, capsys,
                                                                         key):
    """A ckpt.pt that loads but lacks what --resume reads. Old: a KeyError traceback (model: "cannot be
    loaded", as before); the checkpoint stays as it was."""
    out = tmp_path / "run"
    stopped_after_one_step(sample_data, out, monkeypatch)
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    ckpt.pop(key)
    torch.save(ckpt, out / "ckpt.pt")
    before = (out / "ckpt.pt").read_bytes()
    code = exit_code(run_inprocess, sample_data, out, "--r", "2", "--tokens", "5120", "--resume")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "Traceback" not in err[0], err
    if key == "model":
        assert f"{out / 'ckpt.pt'} cannot be loaded" in err[0]
    else:
        assert f"{out / 'ckpt.pt'}: no {key!r}" in err[0]
    assert (out / "ckpt.pt").read_bytes() == before and not (out / "final.json").exists()


@pytest.mark.parametrize("how", ["empty", "garbage", "wrong structure", "no val_loss", "no steps", "no out"])
def test_a_damaged_final_json_is_one_line_naming_it(sample_data, tmp_path, capsys, how):
    """Old, for a final.json without a key "already done" reports: a KeyError traceback."""
    out = tmp_path / "run"
    assert run_inprocess(sample_data, out, "--tokens", "2048") == 0
    damage(out / "final.json", how)
    code = exit_code(run_inprocess, sample_data, out, "--tokens", "2048")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and str(out / "final.json") in err[0], err


@pytest.mark.parametrize("target, how", [("meta.json", "empty"), ("meta.json", "garbage"),
                                         ("meta.json", "wrong structure"), ("val.bin", "missing"),
                                         ("tokenizer.tiktoken", "missing"), ("tokenizer.tiktoken", "garbage")])
def test_damaged_data_files_are_one_line_before_any_training(sample_data, tmp_path, capsys, target, how):
    """Old: --sample with the tokenizer file missing trained to the end, then raised FileNotFoundError; a
    missing val.bin read "val.bin: no file, bytes, meta.json says..."."""
    data = tmp_path / "data"
    shutil.copytree(sample_data, data)
    damage(data / target, how)
    code = exit_code(train.main, ["--data", str(data), "--out", str(tmp_path / "run"), *TINY, "--tokens", "2048",
                                  "--sample", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and target in err[0] and "Traceback" not in err[0], err
    assert not (tmp_path / "run").exists()
    if (target, how) == ("val.bin", "missing"):
        assert "val.bin: missing (meta.json lists" in err[0]


TINY_R2 = flops.ModelConfig(r=2, scale=1, head_dim=16, depth=6, prelude=1, coda=1, vocab_size=512, seq_len=64)
FLOPS_PER_STEP = flops.flops_per_token(TINY_R2) * 512  # TINY's batch


@pytest.mark.parametrize("horizon", [["--flops", "1"], ["--tokens", "1"], ["--tokens", "700"],
                                     ["--flops", repr(1.4 * FLOPS_PER_STEP)], ["--flops", repr(2.6 * FLOPS_PER_STEP)]])
def test_a_horizon_the_batch_cannot_honour_is_refused(sample_data, tmp_path, capsys, horizon):
    """Old: --flops 1 trained one step of ~1e9 FLOPs and recorded flops_budget 1.0. Refused: fewer than
    MIN_STEPS steps (1.4 steps -> 1), or spending more than HORIZON_RTOL away from the budget (2.6 -> 3: +15%)."""
    code = code_of(run_inprocess, sample_data, tmp_path / "run", "--r", "2", *horizon)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and horizon[0] in err[0] and "raise" in err[0], err
    assert not (tmp_path / "run").exists()


def test_budget_rounding_spends_within_the_tolerance(sample_data, tmp_path):
    """steps = round(C / (F B)): a fraction above one half rounds up, and the FLOPs spent stay within
    HORIZON_RTOL of the budget, which the row records next to it."""
    budget = 9.6 * FLOPS_PER_STEP  # 9.6 steps -> 10
    assert run_inprocess(sample_data, tmp_path / "run", "--r", "2", "--flops", repr(budget)) == 0
    row = json.loads((tmp_path / "run" / "final.json").read_text())
    assert row["steps"] == 10 and row["flops_budget"] == budget
    assert abs(row["flops_actual"] / budget - 1) <= recipe.HORIZON_RTOL


def test_eval_rows_beyond_the_split_are_said(sample_data, tmp_path, capsys):
    meta = dataloader.read_meta(sample_data)
    assert run_inprocess(sample_data, tmp_path / "run", "--tokens", "2048", "--eval-rows", "100000") == 0
    assert (f"--eval-rows 100000 is more than the {meta['val_rows']} validation rows" in capsys.readouterr().err)
    assert json.loads((tmp_path / "run" / "final.json").read_text())["eval_rows"] == meta["val_rows"]


def test_a_cpu_run_takes_one_thread_unless_told(monkeypatch, capsys):
    """Old: torch's default (every core) on CPU; with one of 2 cores busy the quick start ran 246-315 tok/s against
    ~3,800 with one thread. Now one thread unless --threads or OMP_NUM_THREADS says otherwise, and --help says why."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert runs.cpu_threads(0) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert runs.cpu_threads(0) == 2 and runs.cpu_threads(3) == 3
    with pytest.raises(SystemExit):
        train.parse_args(["--help"])
    assert "OMP_NUM_THREADS if set, else 1" in " ".join(capsys.readouterr().out.split())


def test_initial_draws_by_name_are_a_run_of_their_own_and_the_default_keeps_every_run_id(sample_data):
    """--init-draws by-name draws other initial weights than the global RNG, so it is in the identity; the default
    (global, how every committed run was drawn) has no entry there, and every run_id stays."""
    meta = dataloader.read_meta(sample_data)
    identities = {}
    for extra in ([], ["--init-draws", "global"], ["--init-draws", "by-name"]):
        args = train.parse_args(["--data", str(sample_data), *TINY, "--tokens", "2048", *extra])
        identities[" ".join(extra)] = runs.run_identity(args, meta, runs.plan_run(args, meta, 1))
    assert identities[""] == identities["--init-draws global"] and "init_draws" not in identities[""][0]
    assert identities["--init-draws by-name"][0]["init_draws"] == "by-name"
    assert identities["--init-draws by-name"][1] != identities[""][1]


def test_the_data_order_is_a_noise_source_of_its_own(sample_data):
    """--data-order SEED reads the training rows in another permutation (dev/noise.sh separates what the order
    moves from what the initialisation moves); its default is the order every committed run read, and then the
    identity has no entry for it (every run_id stays)."""
    meta = dataloader.read_meta(sample_data)
    identities = {}
    for extra in ([], ["--data-order", str(dataloader.ROW_ORDER_SEED)], ["--data-order", "7"]):
        args = train.parse_args(["--data", str(sample_data), *TINY, "--tokens", "2048", *extra])
        identities[" ".join(extra)] = runs.run_identity(args, meta, runs.plan_run(args, meta, 1))
    assert identities[""][1] == identities[f"--data-order {dataloader.ROW_ORDER_SEED}"][1]
    assert "data_order" not in identities[""][0] and identities["--data-order 7"][0]["data_order"] == 7
    default, other = (dataloader.RowLoader(sample_data, "train", 4, order_seed=seed).order(0)
                      for seed in (dataloader.ROW_ORDER_SEED, 7))
    assert sorted(default) == sorted(other) and list(default) != list(other)
