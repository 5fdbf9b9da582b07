"""
Framework overhead of train.py on CPU: its tokens/s against a bare loop that does only the work a
training step must do (read the rows, forward+backward, MuonH + AdamW step) on the same model, data
and batch. Both are measured in this one process, bare / train.py / bare, so drift shows up.

    python dev/bench_train.py [--data data/micro-2k --scale 0.5 --head-dim 8 --r 4 --steps 150]

Needs a dataset from prepare_data.py (the default is the cpu-micro one, see README).
"""
import argparse
import json
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import flops  # noqa: E402
import train  # noqa: E402
from model import GPT  # noqa: E402
from muonh import build_optimizers, learning_rates  # noqa: E402
from prepare_data import RowLoader, read_meta  # noqa: E402


def bare_loop(args, meta, steps):
    """tokens/s of the essential work only, timed like train.py (first step excluded)."""
    torch.manual_seed(0)
    cfg = flops.ModelConfig(r=args.r, scale=args.scale, head_dim=args.head_dim,
                            vocab_size=meta["vocab_size"], seq_len=meta["seq_len"])
    model = GPT(cfg)
    lrs = learning_rates(cfg.d_model, args.batch_tokens, steps * args.batch_tokens, 5e5, ref_width=32,
                         ref_batch=args.batch_tokens)
    opts = [o for o in build_optimizers(model.param_groups(), lrs, compute_dtype=torch.float32) if o]
    loader = RowLoader(args.data, "train", args.batch_tokens // meta["seq_len"])
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
    return steps * args.batch_tokens / elapsed


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data/micro-2k")
    p.add_argument("--r", type=int, default=4)
    p.add_argument("--scale", type=float, default=0.5)
    p.add_argument("--head-dim", type=int, default=8)
    p.add_argument("--batch-tokens", type=int, default=2048)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    meta = read_meta(args.data)
    before = bare_loop(args, meta, args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        code = train.main(["--data", args.data, "--out", f"{tmp}/run", "--r", str(args.r), "--scale", str(args.scale),
                           "--head-dim", str(args.head_dim), "--batch-tokens", str(args.batch_tokens),
                           "--tokens", str((args.steps + 1) * args.batch_tokens), "--ref-width", "32",
                           "--ref-batch", str(args.batch_tokens), "--ref-tokens", "5e5", "--eval-rows", "64",
                           "--log-every", "1000"])
        assert code == 0
        row = json.load(open(f"{tmp}/run/final.json"))
    after = bare_loop(args, meta, args.steps)
    bare = (before + after) / 2
    print(f"\nr={args.r}, d={row['d_model']}, batch {args.batch_tokens} tokens, {args.steps} timed steps, "
          f"{args.threads} thread(s)")
    print(f"bare loop (before)  {before:>10,.0f} tokens/s")
    print(f"train.py            {row['tokens_per_s']:>10,.0f} tokens/s  (logging, NaN check, stop-flag check, LR schedule)")
    print(f"bare loop (after)   {after:>10,.0f} tokens/s")
    print(f"train.py / bare = {row['tokens_per_s'] / bare:.3f}  -> framework overhead {100 * (1 - row['tokens_per_s'] / bare):.1f}%")


if __name__ == "__main__":
    main()
