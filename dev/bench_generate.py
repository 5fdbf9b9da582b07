"""
Benchmark sampling on CPU: generate() with its KV cache against rerunning the whole context every
token (use_cache=False), for r = 1 and r = 4 at equal width. Iso-depth makes both execute 20 layers
per token (paper §2, App. D), so both should decode at the same speed and cache the same bytes; the
script prints the cache's bytes per token next to l_eff * 2 * d * bytes per element. With --ckpt it
also measures what the approximate recurrence KV budget (kv_budget < r) costs: the teacher-forced
decode loss of a trained checkpoint on its validation rows, exact cache against each smaller budget.

    python dev/bench_generate.py                          # ~6 min here (2 cores shared with a sweep)
    python dev/bench_generate.py --contexts 128 1024 --new-tokens 16 --repeats 2 --threads 2
    python dev/bench_generate.py --ckpt runs/cpu-micro/runs/r4_s0.375_C5e11_micro/ckpt.pt --data data/micro-2k

Ratios are measured side by side in one run: the (context, r) cells are interleaved round-robin and
the median over --repeats is reported, because absolute times drift on shared machines. Cached: one
prefill of the context, then --new-tokens greedy decode steps, timed apart (decode tok/s), and
generate() end to end (prefill included). Uncached: generate(use_cache=False) for max(2, 2048 //
context) tokens, each of which reruns the whole context, so its rate is per token at that context.
One thread by default: batch-1 decoding is a chain of small matrix-vector products that a second
thread barely speeds up, and next to a running sweep an oversubscribed second thread stalls every
op (measured here: 3-7 decoded tok/s with 2 threads against 24-34 with 1).
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from flops import ModelConfig  # noqa: E402
from nanoloop.engine import KVCache, cached_forward, generate  # noqa: E402
from model import GPT  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("speed (random-init models, fp32)")
    g.add_argument("--contexts", type=int, nargs="+", default=[128, 512, 1024, 2048], help="prompt lengths")
    g.add_argument("--new-tokens", type=int, default=32, help="cached decode steps per measurement")
    g.add_argument("--repeats", type=int, default=3, help="interleaved rounds; the median is reported")
    g.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    g.add_argument("--scale", type=float, default=4, help="width d = 64 * scale (4: d = 256)")
    g.add_argument("--head-dim", type=int, default=64)
    g.add_argument("--vocab", type=int, default=32064, help="the paper's padded Llama-2 vocabulary")
    g = p.add_argument_group("loss cost of kv_budget < r (trained checkpoints)")
    g.add_argument("--ckpt", nargs="*", default=[], help="train.py ckpt.pt files of looped runs")
    g.add_argument("--data", help="the prepare_data.py folder they were trained on (its val.bin)")
    g.add_argument("--loss-rows", type=int, default=32, help="validation rows, decoded as one batch")
    g.add_argument("--prefill", type=int, default=16, help="tokens of each row prefilled exactly")
    args = p.parse_args(argv)
    if args.ckpt and not args.data:
        p.error("--ckpt needs --data (the folder with val.bin and meta.json)")
    return args


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def cached_phases(model, prompt, n):
    """(prefill s, decode s for n greedy tokens): generate()'s cached loop, phase by phase."""
    cache = KVCache(model.cfg, model.cfg.r, [len(prompt)], len(prompt) + n)
    prefill_s, logits = timed(lambda: cached_forward(model, torch.tensor([prompt]), cache)[:, -1])
    t0 = time.perf_counter()
    for _ in range(n):
        logits = cached_forward(model, logits.argmax(-1, keepdim=True), cache)[:, -1]
    return prefill_s, time.perf_counter() - t0


def measure_speed(args):
    """Median timings per (context, r) cell over interleaved rounds."""
    seq_len = max(args.contexts) + args.new_tokens
    models = {}
    for r in (1, 4):
        torch.manual_seed(0)
        models[r] = GPT(ModelConfig(r=r, scale=args.scale, head_dim=args.head_dim, vocab_size=args.vocab,
                                    seq_len=seq_len)).eval()
    prompts = {c: torch.randint(0, args.vocab, (c,), generator=torch.Generator().manual_seed(c)).tolist()
               for c in args.contexts}
    for model in models.values():  # warm-up: first calls allocate and pick kernels
        generate(model, [prompts[min(args.contexts)]], 4, temperature=0)
        generate(model, [prompts[min(args.contexts)]], 2, temperature=0, use_cache=False)
    cells = [(c, r) for c in args.contexts for r in models]
    samples = {cell: {"prefill": [], "decode": [], "generate": [], "uncached": []} for cell in cells}
    for rep in range(args.repeats):
        for c in args.contexts:
            n_uncached = max(2, 2048 // c)
            for r, model in models.items():
                cell = samples[(c, r)]
                with torch.no_grad():
                    prefill_s, decode_s = cached_phases(model, prompts[c], args.new_tokens)
                cell["prefill"].append(prefill_s)
                cell["decode"].append(args.new_tokens / decode_s)
                seconds, _ = timed(lambda: generate(model, [prompts[c]], args.new_tokens, temperature=0))
                cell["generate"].append(args.new_tokens / seconds)
                seconds, _ = timed(lambda: generate(model, [prompts[c]], n_uncached, temperature=0, use_cache=False))
                cell["uncached"].append(n_uncached / seconds)
        print(f"  round {rep + 1}/{args.repeats} done", flush=True)
    return models, {cell: {k: statistics.median(v) for k, v in d.items()} for cell, d in samples.items()}


def print_speed(args, models, med):
    print(f"\ntokens/s, median of {args.repeats}; uncached: generate(use_cache=False), max(2, 2048 // context) tokens")
    print(f"{'context':>7} {'r':>2} | {'prefill s':>9} | {'cached decode':>13} | {'cached generate':>15} | "
          f"{'uncached':>8} | {'decode / uncached':>17} | {'r=4 / r=1 decode':>16}")
    for c in args.contexts:
        for r in models:
            m = med[(c, r)]
            vs_r1 = m["decode"] / med[(c, 1)]["decode"]
            print(f"{c:>7} {r:>2} | {m['prefill']:>9.3f} | {m['decode']:>13.1f} | {m['generate']:>15.1f} | "
                  f"{m['uncached']:>8.2f} | {m['decode'] / m['uncached']:>16.1f}x | {vs_r1:>16.3f}")


def print_cache_bytes(models):
    """Bytes per token the cache holds against l_eff * 2 (keys, values) * d * bytes per element."""
    print("\nKV cache bytes per token (fp32) against l_eff * 2 * d * 4")
    for r, model in models.items():
        cfg = model.cfg
        for budget in sorted({r, *range(1, r)}, reverse=True):
            cache = KVCache(cfg, r, [8], 8, kv_budget=budget)
            with torch.no_grad():
                cached_forward(model, torch.zeros(1, 8, dtype=torch.long), cache)
            per_token = (cache.k.nbytes + cache.v.nbytes) / 8
            layers = cfg.prelude + budget * cfg.recur + cfg.coda
            expected = layers * 2 * cfg.d_model * cache.k.element_size()
            label = "exact" if budget == r else "approximate"
            print(f"  r = {r}, kv_budget {budget} ({label}): {layers} layers, {per_token:,.0f} B/token, "
                  f"{layers} * 2 * {cfg.d_model} * {cache.k.element_size()} = {expected:,} B")


def decode_loss(model, rows, n_prefill, kv_budget):
    """(mean cross-entropy in nats, logits) of rows (B, T + 1) at the positions n_prefill.. that are
    decoded one token at a time after an exact prefill of the first n_prefill, teacher-forced."""
    x, y = rows[:, :-1], rows[:, 1:]
    cache = KVCache(model.cfg, model.cfg.r, [n_prefill] * x.size(0), x.size(1), kv_budget)
    with torch.no_grad():
        cached_forward(model, x[:, :n_prefill], cache)
        logits = torch.cat([cached_forward(model, x[:, t:t + 1], cache) for t in range(n_prefill, x.size(1))], dim=1)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y[:, n_prefill:].reshape(-1)).item(), logits


def loop_key_drift(model, rows):
    """How far each loop's keys of the first recurrent layer are from the last loop's (relative
    Frobenius distance): a budget of 1 reads the last loop's keys in every loop, so this bounds what
    it perturbs."""
    cfg = model.cfg
    cache = KVCache(cfg, cfg.r, [rows.size(1)] * rows.size(0), rows.size(1))
    with torch.no_grad():
        cached_forward(model, rows, cache)
    keys = [cache.k[cfg.prelude + i * cfg.recur] for i in range(cfg.r)]
    return [((k - keys[-1]).norm() / keys[-1].norm()).item() for k in keys[:-1]]


def measure_budget_loss(args):
    meta = json.loads((Path(args.data) / "meta.json").read_text())
    val = np.memmap(Path(args.data) / "val.bin", np.uint16, "r", shape=(meta["val_rows"], meta["row_len"]))
    rows = torch.from_numpy(val[: args.loss_rows].astype(np.int64))
    print(f"\nloss cost of kv_budget < r: {len(rows)} validation rows of {args.data}, {args.prefill} tokens "
          f"prefilled, the loss of the other {rows.size(1) - 1 - args.prefill} decoded one at a time, teacher-forced")
    for path in args.ckpt:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        model = GPT(ModelConfig(**ckpt["identity"]["model"])).eval()
        model.load_state_dict(ckpt["model"])
        cfg = model.cfg
        with torch.no_grad():
            logits = model(rows[:, :-1])[:, args.prefill:]
        full = F.cross_entropy(logits.reshape(-1, logits.size(-1)), rows[:, args.prefill + 1:].reshape(-1)).item()
        exact, exact_logits = decode_loss(model, rows, args.prefill, None)
        drift = ", ".join(f"{x:.3f}" for x in loop_key_drift(model, rows[:, :-1]))
        print(f"  {path}: r = {cfg.r} ({cfg.prelude}/{cfg.recur}/{cfg.coda}, {cfg.injection}), d = {cfg.d_model}; "
              f"full forward {full:.4f}, exact cache {exact:.4f} nats; loop keys vs the last loop's: {drift}")
        budget = cfg.r // 2
        while budget >= 1:  # halve the budget down to 1: r/2, r/4, .., 1
            loss, logits = decode_loss(model, rows, args.prefill, budget)
            layers = cfg.prelude + budget * cfg.recur + cfg.coda
            print(f"    kv_budget {budget} ({layers} of {cfg.depth} cached layers): {loss:.4f} nats, "
                  f"{loss - exact:+.4f} vs exact, max |logit - exact| {(logits - exact_logits).abs().max():.3f}")
            budget //= 2


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    d = int(64 * args.scale)
    print(f"bench_generate: torch {torch.__version__}, {args.threads} threads, d = {d}, head dim {args.head_dim}, "
          f"depth 20 (r = 1: 20 layers; r = 4: 2 + 4*4 + 2), vocab {args.vocab}, fp32, batch 1")
    models, med = measure_speed(args)
    print_speed(args, models, med)
    print_cache_bytes(models)
    if args.ckpt:
        measure_budget_loss(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
