"""
train.py on CPU, end to end: eager against --compile (torch.compile/inductor) on the cpu-micro shapes,
and train.py's framework overhead against a bare training loop.

    python dev/bench_train.py [--data data/micro-2k --steps 300]          # eager vs --compile
    python dev/bench_train.py --overhead [--scale 0.5 --r 4 --steps 150]  # train.py vs a bare loop

Eager vs compiled: every shape runs `python train.py` twice per round, eager then compiled, one thread
each, and reports the process's whole wall time (Python start, data check, compilation, every step
with its optimiser step, final evaluation), the compile seconds and train.py's timed tokens/s. The two
alternate, so drift on a shared machine hits both. Needs a dataset from prepare_data.py (see README).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
import flops  # noqa: E402
import train  # noqa: E402
from model import GPT  # noqa: E402
from muonh import build_optimizers, learning_rates  # noqa: E402
from prepare_data import RowLoader, read_meta  # noqa: E402

# The cpu-micro grid's flags (sweep.sh), without the horizon.
MICRO = ["--head-dim", "8", "--batch-tokens", "2048", "--ref-width", "32", "--ref-batch", "2048",
         "--ref-tokens", "5e5", "--eval-rows", "64", "--log-every", "1000"]


def run_train(data, scale, r, steps, compile_, tmp):
    """One train.py process; returns (wall seconds of the whole process, its final row)."""
    out = tempfile.mkdtemp(dir=tmp)
    cmd = [sys.executable, "train.py", "--data", data, "--out", out, "--scale", str(scale), "--r", str(r),
           "--tokens", str(steps * 2048), *MICRO] + (["--compile"] if compile_ else [])
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    wall = time.time() - t0
    if proc.returncode != 0 or "torch.compile failed" in proc.stderr:
        sys.exit(f"train.py failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return wall, json.load(open(f"{out}/final.json"))


def compile_grid(args):
    shapes = [(scale, r) for scale in (0.25, 0.5) for r in (1, 4)]
    print(f"{args.steps} steps x 2048 tokens, 1 thread, {args.rounds} round(s); wall = whole process")
    print(f"{'shape':<16}{'eager wall':>11}{'comp wall':>11}{'compile s':>10}{'eager tok/s':>12}"
          f"{'comp tok/s':>11}{'wall ratio':>11}{'step ratio':>11}")
    with tempfile.TemporaryDirectory() as tmp:
        for scale, r in shapes:
            walls, rows = {False: [], True: []}, {False: [], True: []}
            for _ in range(args.rounds):
                for compile_ in (False, True):
                    wall, row = run_train(args.data, scale, r, args.steps, compile_, tmp)
                    walls[compile_].append(wall)
                    rows[compile_].append(row)
            eager_wall, comp_wall = (sum(walls[c]) / args.rounds for c in (False, True))
            eager_tps, comp_tps = (sum(x["tokens_per_s"] for x in rows[c]) / args.rounds for c in (False, True))
            compile_s = sum(x["compile_s"] for x in rows[True]) / args.rounds
            label = f"s={scale:g} d={rows[True][0]['d_model']} r={r}"
            print(f"{label:<16}{eager_wall:>10.1f}s{comp_wall:>10.1f}s"
                  f"{compile_s:>9.1f}s{eager_tps:>12,.0f}{comp_tps:>11,.0f}{eager_wall / comp_wall:>10.2f}x"
                  f"{comp_tps / eager_tps:>10.2f}x", flush=True)


def bare_loop(args, meta, steps):
    """tokens/s of the essential work only, timed like train.py (first step excluded)."""
    torch.manual_seed(0)
    cfg = flops.ModelConfig(r=args.r, scale=args.scale, head_dim=8, vocab_size=meta["vocab_size"],
                            seq_len=meta["seq_len"])
    model = GPT(cfg)
    lrs = learning_rates(cfg.d_model, 2048, steps * 2048, 5e5, ref_width=32, ref_batch=2048)
    opts = [o for o in build_optimizers(model.param_groups(), lrs, compute_dtype=torch.float32) if o]
    loader = RowLoader(args.data, "train", 2048 // meta["seq_len"])
    elapsed = 0.0
    for step in range(steps + 1):
        t0 = time.time()
        x, y = loader.next_batch()
        model(x, y).backward()
        for o in opts:
            o.step()
        model.zero_grad(set_to_none=True)
        if step:
            elapsed += time.time() - t0
    return steps * 2048 / elapsed


def overhead(args):
    torch.set_num_threads(1)
    meta = read_meta(args.data)
    before = bare_loop(args, meta, args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        assert train.main(["--data", args.data, "--out", f"{tmp}/run", "--r", str(args.r), "--scale", str(args.scale),
                           "--tokens", str((args.steps + 1) * 2048), *MICRO]) == 0
        row = json.load(open(f"{tmp}/run/final.json"))
    after = bare_loop(args, meta, args.steps)
    bare = (before + after) / 2
    print(f"\nr={args.r}, d={row['d_model']}, batch 2048 tokens, {args.steps} timed steps, 1 thread")
    print(f"bare loop (before)  {before:>10,.0f} tokens/s")
    print(f"train.py            {row['tokens_per_s']:>10,.0f} tokens/s  (logging, NaN check, stop-flag check, LR schedule)")
    print(f"bare loop (after)   {after:>10,.0f} tokens/s")
    print(f"train.py / bare = {row['tokens_per_s'] / bare:.3f}  -> framework overhead {100 * (1 - row['tokens_per_s'] / bare):.1f}%")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data/micro-2k")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--rounds", type=int, default=1, help="eager/compiled pairs per shape")
    p.add_argument("--overhead", action="store_true", help="train.py against a bare loop instead")
    p.add_argument("--r", type=int, default=4, help="--overhead only")
    p.add_argument("--scale", type=float, default=0.5, help="--overhead only")
    args = p.parse_args()
    overhead(args) if args.overhead else compile_grid(args)


if __name__ == "__main__":
    main()
