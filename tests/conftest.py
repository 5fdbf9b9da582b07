"""Shared test setup: the repo root on sys.path, single-threaded torch (CI has 2 cores)."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
torch.set_num_threads(1)
