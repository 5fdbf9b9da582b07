"""Shared test setup: the repo root on sys.path, single-threaded torch (CI has 2 cores), the tiny dataset built
from the in-repo FineWeb-Edu sample (data/) that the train and sweep tests use, and the smoke grid trained on it
once per session (test_sweep's end-to-end test and test_slurm's reference rows). The `slow` marker (pytest.ini)
sets the end-to-end tests apart: `python -m pytest -q tests -m "not slow"` runs the fast subset."""
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
torch.set_num_threads(1)
SAMPLE = REPO / "data" / "fineweb-edu-sample"


@pytest.fixture(scope="session")
def sample_data(tmp_path_factory):
    """FineWeb-Edu sample -> 512-token BPE, rows of 65 tokens; shard 1 is the validation split."""
    import prepare_data
    out = tmp_path_factory.mktemp("sample") / "data"
    prepare_data.main(["--source", str(SAMPLE / "shard_00000.parquet"), str(SAMPLE / "shard_00001.parquet"),
                       "--val-shards", "1", "--vocab-size", "512", "--seq-len", "64", "--out", str(out),
                       "--workers", "1"])
    return out


def sweep(*args, env=None, check=True):
    """bash sweep.sh ARGS in the repository, `env` added to this process's environment; exit 0 unless check=False."""
    full_env = dict(os.environ, **(env or {}))
    proc = subprocess.run(["bash", "sweep.sh", *args], cwd=REPO, capture_output=True, text=True, env=full_env,
                          timeout=1200)  # a hang is a failure, not a stuck suite
    if check:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


@pytest.fixture(scope="session")
def smoke_sweep(sample_data, tmp_path_factory):
    """The smoke grid trained by the real train.py on the sample, two runs at a time, then fitted: (its OUT
    folder, sweep.sh's stdout). Trained once for every test that reads it; a test that changes it works on a copy."""
    out = tmp_path_factory.mktemp("smoke") / "sweep"
    proc = sweep("--grid", "smoke", env={"OUT": str(out), "DATA": str(sample_data), "CPU_JOBS": "2"})
    return out, proc.stdout


def meta_only_dataset(folder, **meta):
    """A dataset folder that passes dataloader.read_meta(verify=False) with no token rows (empty .bin files):
    for what reads only meta.json (flops.py's pricing, sweep.sh). `meta` sets vocab_size, train_tokens, ..."""
    from nanoloop import dataloader
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    full = {"format": dataloader.FORMAT, "tokenizer_kind": "bpe", "tokenizer_file": "tokenizer.tiktoken",
            "tokenizer_sha256": "0" * 64, "vocab_size": 2048, "bos_id": 2047, "seq_len": 128, "row_len": 129,
            "train_rows": 0, "val_rows": 0, "train_tokens": 10 ** 8, "train_sha256": "0" * 64,
            "val_sha256": "0" * 64, "packing": {"method": "split"}}
    full.update(meta)
    full["row_len"] = full["seq_len"] + 1
    (folder / "meta.json").write_text(json.dumps(full))
    for split in ("train", "val"):
        (folder / f"{split}.bin").write_bytes(b"")
    return folder


GPU_SKIP = ("GPU", "CUDA", "cuda")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Only a missing GPU may skip a test: the data every test needs ships with the repository, so a
    skip for anything else (a missing file, a missing package) fails, and a green run means all ran."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not getattr(report, "wasxfail", None):
        reason = str(report.longrepr)
        if not any(word in reason for word in GPU_SKIP):
            report.outcome = "failed"
            report.longrepr = f"skipped for a reason other than a missing GPU (not allowed): {reason}"


def stop_train_after(monkeypatch, steps):
    """Make train.py stop (as on SIGTERM) once `steps` optimiser steps are done: its next train.main returns 143
    with the checkpoint of step `steps`. Returns the function that puts train.py back for the resume."""
    import train
    real_train_step = train.train_step

    def stopping_train_step(run, step, grad_accum):
        if step == steps:
            train.STOP.set()
        return real_train_step(run, step, grad_accum)

    def put_back():
        monkeypatch.setattr(train, "STOP", threading.Event())
        monkeypatch.setattr(train, "train_step", real_train_step)

    monkeypatch.setattr(train, "STOP", threading.Event())
    monkeypatch.setattr(train, "train_step", stopping_train_step)
    return put_back
