"""Shared test setup: the repo root on sys.path, single-threaded torch (CI has 2 cores), and the
tiny dataset built from the shared FineWeb-Edu sample that the train and sweep tests use."""
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
torch.set_num_threads(1)
SAMPLE = REPO.parent / "shared" / "data" / "fineweb-edu-sample"


@pytest.fixture(scope="session")
def sample_data(tmp_path_factory):
    """FineWeb-Edu sample -> 512-token BPE, rows of 65 tokens; shard 1 is the validation split."""
    if not SAMPLE.exists():
        pytest.skip(f"{SAMPLE} is absent: these tests use the shared FineWeb-Edu sample")
    import prepare_data
    out = tmp_path_factory.mktemp("sample") / "data"
    prepare_data.main(["--source", str(SAMPLE / "shard_00000.parquet"), str(SAMPLE / "shard_00001.parquet"),
                       "--val-shards", "1", "--vocab-size", "512", "--seq-len", "64", "--out", str(out),
                       "--workers", "1"])
    return out
