"""
Benchmark evaluate.py's scoring on CPU: items/s of a d = 64 looped model (r = 4, seq_len 128, vocab
2048, the CPU grids' shape) with items packed into padded forwards of --batch-tokens tokens against
one item at a time (one forward per item: its options, right-padded), on a generated reasoning
primitive (0-shot, language modelling) and a 4-option multiple-choice task.

    python dev/bench_evaluate.py [--items 128 --rounds 5 --batch-tokens 2048 --threads 1]

Both ways are measured side by side in one run (interleaved round-robin, median per way), because
absolute times drift on a shared machine. The weights are random: speed does not depend on them.
Tokens are UTF-8 bytes (ids < 256), so no tokenizer or prepared dataset is needed.
"""
import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from nanoloop import eval_tasks  # noqa: E402
import evaluate  # noqa: E402
from flops import ModelConfig  # noqa: E402
from model import GPT  # noqa: E402

SCORING = eval_tasks.SCORINGS[0]  # evaluate.py's default


class Bytes:
    """A stand-in tokenizer: one token per UTF-8 byte, BOS = 256."""
    bos_id = 256

    def encode(self, text):
        return list(text.encode())


def bench_tasks(n_items, seq_len):
    """(label, encoded items): var_assign_d1_math (language modelling) and a 4-way multiple-choice task,
    under evaluate.py's default rules (--scoring core)."""
    with tempfile.TemporaryDirectory() as tmp:
        eval_tasks.build_primitives(Path(tmp) / "primitives")
        var = [t for t in eval_tasks.load_bundle(Path(tmp) / "primitives") if t["label"] == "var_assign_d1_math"][0]
    mc_items = [{"query": item["context"], "choices": ["3", "11", "17", "24"], "gold": 1} for item in var["items"]]
    mc = dict(var, label="multiple_choice (4 options)", type="multiple_choice", items=mc_items)
    out = []
    for task in (var, mc):
        task["indices"], task["shots"] = list(range(n_items)), 0
        out.append((task["label"], evaluate.encode_task(task, Bytes(), SCORING, seq_len)[0]))
    return out


def score(model, cfg, encoded, batch_tokens):
    with contextlib.redirect_stderr(io.StringIO()):  # no progress lines inside the timed loops
        return evaluate.evaluate_task(model, encoded, cfg.r, cfg.seq_len, Bytes.bos_id, "cpu", batch_tokens, "",
                                      SCORING)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=int, default=128, help="items per task and round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batch-tokens", type=int, default=2048, help="evaluate.py's CPU default")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = ModelConfig(r=4, scale=1, head_dim=16, vocab_size=2048, seq_len=128)
    model = GPT(cfg).eval()
    print(f"CPU scoring, d={cfg.d_model}, r={cfg.r}, seq_len {cfg.seq_len}, vocab {cfg.padded_vocab}, "
          f"{args.threads} thread(s), {args.items} items per task, median of {args.rounds} interleaved rounds")
    print(f"{'task':<30}{'way':<22}{'items/s':>9}{'speed-up':>10}")
    for label, encoded in bench_tasks(args.items, cfg.seq_len):
        times = {"batched": [], "one item at a time": []}
        score(model, cfg, encoded[:8], args.batch_tokens)  # warm-up
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            score(model, cfg, encoded, args.batch_tokens)
            times["batched"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for item in encoded:
                score(model, cfg, [item], args.batch_tokens)
            times["one item at a time"].append(time.perf_counter() - t0)
        single = args.items / statistics.median(times["one item at a time"])
        for way in times:
            rate = args.items / statistics.median(times[way])
            print(f"{label:<30}{way:<22}{rate:>9.1f}{rate / single:>9.2f}x")


if __name__ == "__main__":
    main()
