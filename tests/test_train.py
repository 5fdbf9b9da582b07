"""train.py end to end on CPU with tiny models and the real FineWeb-Edu sample: it learns, one row per
run is complete and agrees with flops.py, DDP equals one process, and a killed run resumes exactly."""
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import flops
import prepare_data
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
    meta = prepare_data.read_meta(sample_data)
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


@pytest.mark.parametrize("extra", [
    ["--r", "4", "--injection", "linear", "--r-bwd", "2"],
    ["--r", "4", "--injection", "additive", "--r-bwd", "1"],
    ["--r", "2", "--injection", "passthrough"],
    ["--r", "4", "--injection", "hyper", "--hc-lanes", "2"],
    ["--r", "1"],
])
def test_every_mode_trains(sample_data, tmp_path, extra):
    assert run_inprocess(sample_data, tmp_path / "run", *extra, "--tokens", "2048", "--eval-r", "1,8") == 0
    row = json.loads((tmp_path / "run" / "final.json").read_text())
    assert math.isfinite(row["val_loss"]) and math.isfinite(row["val_loss_r8"])


def test_gradient_accumulation_matches_one_big_batch(sample_data, tmp_path):
    run_inprocess(sample_data, tmp_path / "a", "--r", "2", "--tokens", "2048", "--device-batch", "8")
    run_inprocess(sample_data, tmp_path / "b", "--r", "2", "--tokens", "2048", "--device-batch", "2")
    a, b = losses(tmp_path / "a"), losses(tmp_path / "b")
    assert a.keys() == b.keys() and all(abs(a[k] - b[k]) < 1e-4 for k in a)


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


def test_killed_run_resumes_exactly(sample_data, tmp_path):
    args = ["train.py", "--data", str(sample_data), *TINY, "--r", "4", "--tokens", "15360", "--save-every", "0"]
    reference = run_cli(*args, "--out", str(tmp_path / "ref"))
    assert reference.returncode == 0, reference.stderr
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, *args, "--out", str(out)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    deadline = time.time() + 120
    while time.time() < deadline and not ((out / "log.jsonl").exists() and len(losses(out)) >= 5):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "interrupted at step" in stdout
    stopped_at = max(losses(out))
    assert stopped_at < 30 and (out / "ckpt.pt").exists() and not (out / "final.json").exists()
    # Without --resume the checkpoint is not silently overwritten.
    refused = run_cli(*args, "--out", str(out))
    assert refused.returncode == 2 and "--resume" in refused.stderr
    # Nor is it continued with another horizon (the LR schedule would silently change).
    other = [a if a != "15360" else "20480" for a in args]
    mismatch = run_cli(*other, "--out", str(out), "--resume")
    assert mismatch.returncode == 2 and "another configuration or horizon" in mismatch.stderr
    resumed = run_cli(*args, "--out", str(out), "--resume")
    assert resumed.returncode == 0 and f"resumed {out / 'ckpt.pt'} at step {stopped_at}/30" in resumed.stdout
    ref, got = losses(tmp_path / "ref"), losses(out)
    assert set(got) == set(ref) == set(range(1, 31))
    assert all(got[k] == ref[k] for k in ref), "resumed losses differ from the uninterrupted run"
    ref_row = json.loads((tmp_path / "ref" / "final.json").read_text())
    got_row = json.loads((out / "final.json").read_text())
    assert got_row["val_loss"] == ref_row["val_loss"]
    # A finished run is never retrained by accident.
    again = run_cli(*args, "--out", str(out), "--resume")
    assert again.returncode == 0 and "already holds a finished run" in again.stdout


@pytest.mark.parametrize("bad, reason", [
    (["--r", "3"], "not divisible"),
    (["--r", "4", "--r-bwd", "2", "--injection", "hyper"], "full BPTT"),
    (["--batch-tokens", "500"], "not a multiple of the sequence length"),
    (["--flops", "1e12", "--tokens", "1000"], "only one of"),
    (["--seq-len", "128"], "does not match the data"),
    (["--device-batch", "3"], "does not divide"),
])
def test_bad_flags_fail_fast_with_reason(sample_data, tmp_path, bad, reason):
    proc = run_cli("train.py", "--data", str(sample_data), *TINY, "--out", str(tmp_path / "x"), *bad)
    assert proc.returncode == 2 and reason in proc.stderr
    assert not (tmp_path / "x").exists()


def test_missing_data_says_how_to_make_it(tmp_path):
    proc = run_cli("train.py", "--data", str(tmp_path / "nope"), "--r", "4")
    assert proc.returncode == 2 and "prepare_data.py" in proc.stderr


def test_divergence_stops_and_keeps_last_good_checkpoint(sample_data, tmp_path):
    out = tmp_path / "run"
    code = run_inprocess(sample_data, out, "--r", "2", "--tokens", "10240", "--save-every", "2",
                         "--lr-norm", "1e30", "--lr-embedding", "1e30")
    assert code == 1
    assert (out / "ckpt.pt").exists() and not (out / "final.json").exists()
