"""
Benchmark of prepare_data.py on the micro-corpus: prints figures, asserts nothing about time.

    python dev/bench_data.py                      # ~1-3 min on 2 cores
    python dev/bench_data.py --vocab-size 4096    # a smaller BPE, faster

1. Trains the BPE (default 32000 tokens) on the training documents (98%, as in the README's
   micro-corpus command) and reports how long that took.
2. Tokenize + pack throughput, tokens/s, with --workers tokenizer threads vs one thread, measured
   side by side in this run (alternating, best of --repeats each), and checks that both produce
   byte-identical rows. CPU-seconds per run too: tokens per CPU-second does not depend on how much
   of the machine other processes took.
3. Bytes per token of the trained BPE on the whole corpus and on the held-out documents, next to
   tiktoken's gpt2 encoding when tiktoken can load it offline (it downloads it on first use).

Machine load is printed too: other processes on shared cores change every time figure.
"""
import argparse
import hashlib
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import prepare_data as pdata  # noqa: E402


def file_hash(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def cpu_seconds():
    """User + system CPU time of this process (all its threads) and its finished children."""
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


def bytes_per_token(encode, texts):
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    n_tokens = sum(len(encode(t)) for t in texts)
    return n_bytes / n_tokens


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", default=str(REPO / "data" / "micro-corpus"))
    p.add_argument("--vocab-size", type=int, default=32000)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--val-fraction", type=float, default=0.02)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="tokenizer threads compared against 1")
    p.add_argument("--repeats", type=int, default=2, help="timed runs per setting")
    a = p.parse_args()
    if not Path(a.source).exists():
        raise SystemExit(f"bench_data.py: error: {a.source} not found (the micro-corpus)")

    print(f"cpu cores {os.cpu_count()}, load average at start {os.getloadavg()[0]:.2f}")
    plan = pdata.make_plan(pdata.local_files([a.source]), 0, a.val_fraction)
    docs = [doc for batch in pdata.batches(plan) for doc in batch]
    train_texts = [text for split, text in docs if split == "train"]
    val_texts = [text for split, text in docs if split == "val"]
    n_chars = sum(map(len, train_texts)) + sum(map(len, val_texts))
    print(f"corpus: {len(train_texts)} train + {len(val_texts)} held-out documents, "
          f"{n_chars / 1e6:.1f}M characters")

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tok_path = tmp / "tokenizer.tiktoken"
        t0 = time.time()
        pdata.train_bpe(iter(train_texts), a.vocab_size, tok_path)
        print(f"BPE training ({a.vocab_size} tokens, rustbpe): {time.time() - t0:.1f} s")
        tok = pdata.Tokenizer("bpe", tok_path)

        # Alternate the settings so a burst of load from other processes hits both alike.
        best, hashes = {}, {}
        for rep in range(a.repeats):
            for workers in (1, a.workers):
                out = {"train": tmp / f"train{workers}.bin", "val": tmp / f"val{workers}.bin"}
                cpu0 = cpu_seconds()
                stats = pdata.tokenize_and_pack(plan, tok, a.seq_len + 1, True, workers, out)
                cpu = cpu_seconds() - cpu0
                rate = stats["tokens_per_s"]
                # CPU-seconds / wall-seconds: how many cores this run actually got (the rest of
                # the time it waited for the CPU behind other processes).
                tokens = stats["train"]["tokens_in"] + stats["val"]["tokens_in"]
                print(f"  run {rep + 1}, {workers} thread(s): {rate / 1e6:.2f}M tokens/s "
                      f"({stats['seconds']:.1f} s wall, {cpu:.1f} CPU-s, {tokens / cpu / 1e6:.2f}M "
                      f"tokens per CPU-s, {cpu / stats['seconds']:.2f} cores busy)")
                best[workers] = max(best.get(workers, 0), rate)
                hashes[workers] = (file_hash(out["train"]), file_hash(out["val"]))
        print(f"tokenize + pack, {tokens / 1e6:.2f}M tokens (seq_len {a.seq_len}), best of "
              f"{a.repeats}: 1 thread {best[1] / 1e6:.2f}M tokens/s, {a.workers} threads "
              f"{best[a.workers] / 1e6:.2f}M tokens/s, speed-up {best[a.workers] / best[1]:.2f}x")
        print(f"identical output for 1 and {a.workers} threads: "
              f"{'yes' if hashes[1] == hashes[a.workers] else 'NO'}")
        crop = (stats["train"]["cropped_tokens"] + stats["val"]["cropped_tokens"]) / tokens
        print(f"cropped by packing: {100 * crop:.2f}% of tokens")

        print(f"bytes/token, BPE {a.vocab_size}: whole corpus "
              f"{bytes_per_token(tok.encode, train_texts + val_texts):.3f}, held-out documents "
              f"{bytes_per_token(tok.encode, val_texts):.3f}")
    try:
        import tiktoken
        gpt2 = tiktoken.get_encoding("gpt2")
    except Exception as e:  # no network and no cached copy: say so instead of failing
        print(f"bytes/token, tiktoken gpt2: not available offline ({type(e).__name__})")
    else:
        print(f"bytes/token, tiktoken gpt2 (50257): whole corpus "
              f"{bytes_per_token(gpt2.encode_ordinary, train_texts + val_texts):.3f}, "
              f"held-out documents {bytes_per_token(gpt2.encode_ordinary, val_texts):.3f}")
    print(f"load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
