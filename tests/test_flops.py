"""flops.py is the accounting the scaling law is fitted on: these tests pin it to the paper's numbers
(§3.1, RECIPE §2-3) and to the instantiated model."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import flops
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


@pytest.mark.parametrize("injection, r, r_bwd", [
    ("linear", 4, 4), ("linear", 4, 2), ("linear", 8, 3), ("additive", 4, 1), ("additive", 2, 2),
    ("passthrough", 4, 4), ("hyper", 4, 4), ("hyper", 8, 8), ("linear", 1, 1)])
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
    """§1 / App. G.5: at r = 4 and phi = 0.46 a ~410M looped model matches a ~580M non-looped model
    in loss but costs the FLOPs of a ~1B non-looped model of the same width and depth.
    We count W_inj in N_rec, which puts N_eff 3% above the paper's rounded 580M."""
    looped = flops.param_counts(ModelConfig(r=4, scale=32))
    plain = ModelConfig(r=1, scale=32)
    assert 400e6 < looped["n_params"] < 420e6
    n_eff = flops.effective_params(looped["n_once"], looped["n_rec"], 4, 0.46)
    assert abs(n_eff / 580e6 - 1) < 0.04
    assert 0.99e9 < flops.param_counts(plain)["n_params"] < 1.02e9
    ratio = flops.flops_per_token(ModelConfig(r=4, scale=32)) / flops.flops_per_token(plain)
    assert 1.0 < ratio < 1.03  # the loop adds only W_inj: 4 x 2d^2 per token-step


def test_budget_to_tokens():
    cfg = ModelConfig(r=4, scale=10)
    out = flops.tokens_for_budget(cfg, 1e18, 2 ** 18)
    assert out["tokens"] == out["steps"] * 2 ** 18
    assert abs(out["flops_actual"] / 1e18 - 1) < 0.5 / out["steps"] + 1e-12


def test_mfu_uses_same_flops():
    cfg = ModelConfig(r=4, scale=10)
    m = flops.mfu(cfg, 1e5, 1, "NVIDIA H100 80GB HBM3")
    assert m == pytest.approx(flops.flops_per_token(cfg) * 1e5 / 989e12)
    assert flops.mfu(cfg, 1e5, 1, "cpu") is None
    assert flops.peak_flops("NVIDIA H100 PCIe") == 756e12


@pytest.mark.parametrize("bad, reason", [
    (["--r", "3"], "not divisible"),
    (["--scale", "11"], "head dim"),
    (["--r", "4", "--r-bwd", "2", "--injection", "hyper"], "full BPTT"),
    (["--r", "4", "--r-bwd", "5"], "r-bwd"),
    (["--r", "4", "--injection", "bogus"], "invalid choice"),
])
def test_cli_rejects_bad_combinations(bad, reason):
    proc = subprocess.run([sys.executable, "flops.py", *bad], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode != 0
    assert reason in proc.stderr
    assert proc.stdout == ""


def test_cli_json():
    proc = subprocess.run([sys.executable, "flops.py", "--r", "4", "--scale", "10", "--r-bwd", "2",
                           "--flops", "1e18", "--json"], cwd=REPO, capture_output=True, text=True, check=True)
    out = json.loads(proc.stdout)
    for key in ("n_params", "n_once", "n_rec", "n_embedding", "flops_per_token", "steps", "tokens", "flops_actual"):
        assert key in out
    assert out["r_bwd"] == 2 and out["steps"] * 2 ** 18 == out["tokens"]


def test_custom_fixed_parameter_layouts():
    """truncate-or-not's fixed-N grids: 2/4/2 with T in {1,2,4,8,16} share one parameter count."""
    counts = {T: flops.param_counts(ModelConfig(r=T, prelude=2, recur=4, coda=2, scale=4, head_dim=64))["n_params"]
              for T in (1, 2, 4, 8, 16)}
    assert len(set(counts.values())) == 1
    assert ModelConfig(r=16, prelude=2, recur=4, coda=2, scale=4, head_dim=64).depth == 68
    assert ModelConfig(r=8, depth=24, prelude=4, coda=4).recur == 2  # App. G.4 depth variant
