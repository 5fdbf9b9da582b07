"""
train.py on CPU, end to end: eager against --compile (torch.compile/inductor) on the cpu-micro shapes,
and train.py's framework overhead against a bare training loop.

    python dev/bench_train.py [--data data/micro-2k --steps 300]          # eager vs --compile
    python dev/bench_train.py --overhead [--scale 0.5 --r 4 --steps 150]  # train.py vs a bare loop

Eager vs compiled: every shape runs `python train.py` three times, one thread each: eager, compiled with
a cold inductor cache, compiled again with the cache warm (as every later sweep run of that shape is).
Each reports the whole process (Python start, data check, compilation, every step with its optimiser
step, final evaluation) in CPU seconds, which load from other jobs on a shared machine barely moves, and
in wall seconds; plus the compile seconds and the ratio of train.py's timed tokens/s (steps only).
Needs a dataset from prepare_data.py (see README).
"""
import argparse
import json
import os
import resource
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


def run_train(data, scale, r, steps, compile_, tmp, cache=None):
    """One train.py process; returns (wall s, CPU s of the whole process and its children, final row).
    cache: inductor's cache folder (a fresh one compiles cold; a used one is what later sweep runs see)."""
    out = tempfile.mkdtemp(dir=tmp)
    cmd = [sys.executable, "train.py", "--data", data, "--out", out, "--scale", str(scale), "--r", str(r),
           "--tokens", str(steps * 2048), *MICRO] + (["--compile"] if compile_ else [])
    # One compile thread: inductor's worker pool would otherwise borrow the cores other runs use.
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCHINDUCTOR_COMPILE_THREADS="1")
    if cache:
        env["TORCHINDUCTOR_CACHE_DIR"] = cache
    t0, cpu0 = time.time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    wall, cpu1 = time.time() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0 or "torch.compile failed" in proc.stderr:
        sys.exit(f"train.py failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return wall, cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime, json.load(open(f"{out}/final.json"))


def compile_grid(args):
    """Per shape: eager, compiled with a cold inductor cache, compiled again with that cache warm."""
    shapes = [(scale, r) for scale in (0.25, 0.5) for r in (1, 4)]
    print(f"{args.steps} steps x 2048 tokens, 1 thread. cpu s = CPU seconds of the whole process and its children "
          f"(robust to load from other jobs); wall s is the same span on the clock (sensitive to load)")
    print(f"{'shape':<16}{'eager cpu s':>12}{'cold cpu s':>11}{'warm cpu s':>11}{'compile s cold/warm':>20}"
          f"{'cpu ratio cold/warm':>20}{'wall eager/cold/warm':>22}{'step ratio':>11}")
    with tempfile.TemporaryDirectory() as tmp:
        for scale, r in shapes:
            cache = tempfile.mkdtemp(dir=tmp)
            eager, cold, warm = (run_train(args.data, scale, r, args.steps, c, tmp, cache)
                                 for c in (False, True, True))
            label = f"s={scale:g} d={eager[2]['d_model']} r={r}"
            print(f"{label:<16}{eager[1]:>11.1f}s{cold[1]:>10.1f}s{warm[1]:>10.1f}s"
                  f"{cold[2]['compile_s']:>13.1f}/{warm[2]['compile_s']:.1f}s"
                  f"{eager[1] / cold[1]:>14.2f}x/{eager[1] / warm[1]:.2f}x"
                  f"{eager[0]:>11.0f}/{cold[0]:.0f}/{warm[0]:.0f}s"
                  f"{warm[2]['tokens_per_s'] / eager[2]['tokens_per_s']:>10.2f}x", flush=True)


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
    p.add_argument("--overhead", action="store_true", help="train.py against a bare loop instead")
    p.add_argument("--r", type=int, default=4, help="--overhead only")
    p.add_argument("--scale", type=float, default=0.5, help="--overhead only")
    args = p.parse_args()
    overhead(args) if args.overhead else compile_grid(args)


if __name__ == "__main__":
    main()
