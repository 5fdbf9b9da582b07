"""
Synthetic sweeps for trying and testing fit_laws.py: the paper's iso-FLOP grid (Table 7, read from
`./sweep.sh --grid paper --print`, the one place the grid is written down) with each run's counts and
tokens from flops.py exactly as train.py books them, and losses drawn from a known joint law plus
Gaussian noise. The fit should give the truth back, with the truth inside its bootstrap CI. --law
truncate-or-not writes Truncate or Not?'s fixed-N suite instead (`./sweep.sh --grid truncate-or-not --print`,
token horizons under its recipe), its losses from their published law (truncate_law.PUBLISHED) plus noise.

    python dev/synthetic_sweep.py synth.jsonl
    python dev/synthetic_sweep.py trunc.jsonl --truth phi=0.3 --bptt truncated --seed 1
    python fit_laws.py synth.jsonl --compare trunc.jsonl    # delta-phi ~ -0.16
    python dev/synthetic_sweep.py ton.jsonl --law truncate-or-not --noise 0.006
    python fit_laws.py ton.jsonl --law truncate-or-not      # the nine coefficients of their Table 4 back
"""
import argparse
import functools
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import flops  # noqa: E402
from nanoloop import laws  # noqa: E402
from nanoloop import recipe  # noqa: E402
from nanoloop import truncate_law  # noqa: E402

# Chinchilla-like amplitudes and exponents (Epoch's refit of Hoffmann et al. is E 1.82, A 478,
# alpha 0.35, B 2143, beta 0.37) and the paper's phi.
TRUTH = {"E": 1.8, "A": 400.0, "alpha": 0.34, "B": 1500.0, "beta": 0.37, "phi": 0.46}


@functools.cache
def paper_grid():
    """{budget C: widths s} and the loop counts r of sweep.sh's paper grid."""
    out = subprocess.run(["bash", str(ROOT / "sweep.sh"), "--grid", "paper", "--print"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    runs = re.findall(r"--r (\d+) --scale ([\d.]+) --flops ([\d.e+]+)", out)
    if not runs:
        raise RuntimeError(f"no runs in `sweep.sh --grid paper --print`:\n{out[:500]}")
    grid = {}
    for _, s, C in runs:
        grid.setdefault(float(C), set()).add(int(float(s)))
    return {C: tuple(sorted(ws)) for C, ws in sorted(grid.items())}, tuple(sorted({int(r) for r, _, _ in runs}))


def synthetic_rows(truth=None, noise=0.01, seed=0, truncated=False, batch_tokens=2 ** 18, vocab_size=32064,
                   seq_len=2048):
    """One row per run of the paper grid, as train.py writes it, with val_loss from the joint law
    `truth` (TRUTH by default) plus `noise` nats of Gaussian noise; `truncated` trains the last
    ceil(r/2) loops (iso-depth §5.1)."""
    truth, rng = {**TRUTH, **(truth or {})}, np.random.default_rng(seed)
    grid, rs = paper_grid()
    rows = []
    for C, widths in grid.items():
        for r in rs:
            for s in widths:
                cfg = flops.ModelConfig(r=r, scale=s, r_bwd=-(-r // 2) if truncated and r > 1 else 0,
                                        vocab_size=vocab_size, seq_len=seq_len)
                row = flops.summary(cfg, C, batch_tokens)
                loss = float(laws.law_loss(truth, row["n_once"], row["n_rec"], r, row["tokens"]))
                rows.append({**row, "val_loss": loss + noise * float(rng.standard_normal()), "seed": seed})
    return rows


def truncate_or_not_rows(truth=None, noise=0.006, seed=0, vocab_size=32064, seq_len=2048):
    """One row per run of the truncate-or-not suite (sweep.sh's plan), as train.py writes it under --recipe
    truncate-or-not (tokens from the batch rule, tokens_target, d0), val_loss from their law `truth` (the published
    coefficients by default) plus `noise` nats (their in-sample RMSE is 0.006)."""
    truth, rng = {**truncate_law.PUBLISHED, **(truth or {})}, np.random.default_rng(seed)
    out = subprocess.run(["bash", str(ROOT / "sweep.sh"), "--grid", "truncate-or-not", "--print"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    pattern = r"--r (\d+) --r-bwd (\d+) --scale ([\d.]+) --prelude (\d+) --recur (\d+) --coda (\d+) --tokens (\d+)"
    rows = []
    for T, B, s, p, rc, c, tokens in re.findall(pattern, out):
        cfg = flops.ModelConfig(r=int(T), r_bwd=int(B), scale=float(s), prelude=int(p), recur=int(rc), coda=int(c),
                                vocab_size=vocab_size, seq_len=seq_len)
        plan = recipe.RECIPES["truncate-or-not"]
        batch = recipe.ladder_batch(float(tokens), plan) * seq_len
        steps = recipe.ladder_steps(float(tokens), batch)
        row = flops.summary(cfg) | {"tokens": steps * batch, "steps": steps, "batch_tokens": batch,
                                    "tokens_target": float(tokens), "d0": plan.d0, "recipe": plan.name}
        loss = float(truncate_law.law_loss(truth, row["n_once"], row["n_rec"], int(T), int(B), row["tokens"]))
        rows.append({**row, "val_loss": loss + noise * float(rng.standard_normal()), "seed": seed})
    return rows


def write_jsonl(rows, path):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(json.dumps(row) + "\n" for row in rows))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="JSONL file to write")
    parser.add_argument("--truth", default="", help=f"change the true law, e.g. phi=0.3,E=1.8 ({', '.join(TRUTH)})")
    parser.add_argument("--noise", type=float, default=0.01, help="loss noise (nats)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bptt", choices=("full", "truncated"), default="full",
                        help="truncated trains the last ceil(r/2) loops")
    parser.add_argument("--law", choices=("iso-depth", "truncate-or-not"), default="iso-depth",
                        help="truncate-or-not: their fixed-N suite from their published law (--truth is ignored)")
    args = parser.parse_args()
    if args.law == "truncate-or-not":
        rows = truncate_or_not_rows(noise=args.noise, seed=args.seed)
        write_jsonl(rows, args.out)
        print(f"wrote {len(rows)} synthetic runs of the truncate-or-not suite to {args.out}")
        return
    truth = dict(part.split("=") for part in args.truth.split(",") if part.strip())
    if set(truth) - set(TRUTH):
        parser.error(f"unknown truth keys {', '.join(set(truth) - set(TRUTH))} (use {', '.join(TRUTH)})")
    rows = synthetic_rows({k: float(v) for k, v in truth.items()}, args.noise, args.seed, args.bptt == "truncated")
    write_jsonl(rows, args.out)
    print(f"wrote {len(rows)} synthetic runs to {args.out}")


if __name__ == "__main__":
    main()
