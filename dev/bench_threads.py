"""
The quick start's training speed at 1 and 2 CPU threads, with the machine idle and with one core busy (a bounded
busy loop this script starts and stops itself, like a browser on a laptop), side by side in one run: the arms
take turns, each a fresh `train.py` process (the quick start's model and data: dev/quickstart.sh), and the table
gives each arm's tokens/s (train.py's own, after the first step) and its ratio to 1 thread on an idle machine.
train.py's --threads default (runs.cpu_threads: 1) rests on this.

    python dev/bench_threads.py                 # 2 rounds of each arm
    python dev/bench_threads.py --tiny          # one short round (a smoke test)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# dev/quickstart.sh's model and recipe, a short horizon.
QUICKSTART = ["--r", "4", "--scale", "1", "--head-dim", "16", "--batch-tokens", "2048", "--ref-width", "32",
              "--ref-batch", "2048", "--ref-tokens", "5e5", "--lr-matrix", "0.056", "--eval-rows", "16",
              "--log-every", "1000", "--save-every", "0"]
BUSY_S = 600  # the busy loop ends by itself after this long, whatever happens to this script


def ensure_data(folder):
    """The quick start's data (dev/quickstart.sh's prepare_data.py call), built once."""
    if not (folder / "meta.json").exists():
        sample = REPO / "data" / "fineweb-edu-sample"
        subprocess.run([sys.executable, "prepare_data.py", "--out", str(folder), "--vocab-size", "1024", "--seq-len",
                        "128", "--val-shards", "1", "--source", str(sample / "shard_00000.parquet"),
                        str(sample / "shard_00001.parquet")], cwd=REPO, check=True, capture_output=True)


def start_busy_loop():
    """One process spinning on one core for at most BUSY_S seconds."""
    code = f"import time\nend = time.time() + {BUSY_S}\nwhile time.time() < end:\n    pass\n"
    return subprocess.Popen([sys.executable, "-c", code])


def tokens_per_s(data, threads, horizon, scratch):
    """train.py's measured tokens/s of one fresh run at `threads` threads; `horizon`: flags after QUICKSTART's."""
    out = Path(tempfile.mkdtemp(dir=scratch))
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    subprocess.run([sys.executable, "train.py", "--data", str(data), "--out", str(out), "--threads", str(threads),
                    *QUICKSTART, *horizon], cwd=REPO, check=True, capture_output=True, env=env)
    return json.loads((out / "final.json").read_text())["tokens_per_s"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="runs of each arm, taking turns")
    parser.add_argument("--tokens", type=int, default=40960, help="tokens per run (20 steps of 2,048)")
    parser.add_argument("--tiny", action="store_true", help="one round of 2 steps of 512 tokens, 2 validation rows")
    args = parser.parse_args()
    horizon = ["--tokens", str(args.tokens)]
    if args.tiny:  # the 2-thread arm beside the busy loop runs at ~1/10 speed: a smoke test keeps it to seconds
        args.rounds = 1
        horizon = ["--tokens", "1024", "--batch-tokens", "512", "--eval-rows", "2"]
    speeds = {}
    with tempfile.TemporaryDirectory() as scratch:
        data = Path(scratch) / "sample"
        ensure_data(data)
        for _ in range(args.rounds):
            for load in ("idle", "one core busy"):
                busy = start_busy_loop() if load != "idle" else None
                try:
                    time.sleep(0.5 if busy else 0)
                    for threads in (1, 2):
                        speeds.setdefault((load, threads), []).append(tokens_per_s(data, threads, horizon, scratch))
                finally:
                    if busy:
                        busy.kill()
                        busy.wait()
    base = statistics.median(speeds[("idle", 1)])
    print(f"the quick start's model (r = 4, d = 64), {os.cpu_count()} cores, median of {args.rounds} run(s) per arm")
    print(f"{'machine':<16}{'threads':>8}{'tokens/s':>10}{'/ 1 thread idle':>17}")
    for (load, threads), values in speeds.items():
        value = statistics.median(values)
        print(f"{load:<16}{threads:>8}{value:>10,.0f}{value / base:>16.2f}x")


if __name__ == "__main__":
    main()
