"""
The CPU training step, before and after the speed-up, at the shapes the CPU grids train: one step of
train.py's loop (forward, backward, MuonH + AdamW, zero_grad) on 2,048 tokens (16 rows of 128, vocab
2,048, head dim 8, fp32, one thread, as `sweep.sh --grid cpu-micro` runs it), for every width d and loop
count r asked for.

"old" is model.py as it was at --old-rev (read from git) under glibc's default allocator, with PyTorch's
attention; "new" is this checkout's model.py with common.keep_freed_memory() and the attention train.py picks
on CPU (cpu_attention.py's kernel, where it builds); "compiled" is "new" after runs.compile_or_eager, what
train.py --compile does on CPU (each block compiled; dev/ablate.sh's runs). --attention times only the
attention, one layer, both kernels in one process.
The allocator is a process-wide setting, so each arm runs in worker processes of its own; the arms take
turns per shape and round (old, new, compiled, then compiled, new, old, ...), so that drift on a shared
machine hits all alike. Each worker times --steps steps after one warm-up step; a shape's time is the
median over all its workers' steps. The compile column is the compiled arm's compile_or_eager seconds,
first worker (a cold inductor cache, at each width's first r) / last (warm). All arms start from the same
weights and batch, so their first losses must agree to fp32 rounding.

    python dev/bench_train.py                                   # d = 8, 16, 24, 32, 48 x r = 1, 2, 4, 8
    python dev/bench_train.py --widths 8 24 --r 4 --rounds 2    # a few shapes
    python dev/bench_train.py --tiny                            # one small shape, one round (a smoke test)
    python dev/bench_train.py --attention                       # one layer's attention: SDPA against ours
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OLD_REV = "5aed072"  # the last commit before the CPU step was sped up
ARMS = ("old", "new", "compiled")


def worker(args):
    """Time args.steps training steps of one arm at one shape in this process; print them as JSON."""
    sys.path.insert(0, str(REPO))
    if args.worker != "old":
        from nanoloop import common
        common.keep_freed_memory()
    import importlib.util

    import torch

    import flops
    from muonh import build_optimizers, learning_rates
    spec = importlib.util.spec_from_file_location(f"model_{args.worker}", args.model_file)
    model_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model_module)
    torch.set_num_threads(1)
    cfg = flops.ModelConfig(r=args.r, scale=args.width / 64, head_dim=8, vocab_size=2048, seq_len=128)
    torch.manual_seed(0)
    model = model_module.GPT(cfg)
    model.set_device_backend("cpu")  # as train.py does: old gets SDPA, new and compiled cpu_attention's kernel
    lrs = learning_rates(cfg.d_model, 2048, 500 * 2048, 5e5, ref_width=32, ref_batch=2048)
    optimizers = [opt for opt in build_optimizers(model.param_groups(), lrs, compute_dtype=torch.float32) if opt]
    step_model, compile_s = model, None
    if args.worker == "compiled":
        from nanoloop.runs import compile_or_eager
        step_model, compile_s = compile_or_eager(model, 16, 128)
    batch = torch.randint(0, 2048, (2, 16, 128), generator=torch.Generator().manual_seed(1))
    step_seconds, losses = [], []
    for step in range(args.steps + 1):
        t0 = time.perf_counter()
        loss = step_model(batch[0], batch[1])
        loss.backward()
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)
        if step > 0:  # the first step pays for allocation and lazy initialisation
            step_seconds.append(time.perf_counter() - t0)
        losses.append(loss.item())
    print(json.dumps({"step_s": step_seconds, "losses": losses, "compile_s": compile_s}))


def run_worker(arm, width, r, steps, model_file):
    cmd = [sys.executable, __file__, "--worker", arm, "--width", str(width), "--r", str(r), "--steps", str(steps),
           "--model-file", str(model_file)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        sys.exit(f"bench_train.py: the {arm} worker failed at d={width}, r={r}: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def old_model_file(rev, folder):
    """model.py as it was at rev, written into folder (it imports flops.ModelConfig, which this checkout has)."""
    proc = subprocess.run(["git", "show", f"{rev}:model.py"], capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        sys.exit(f"bench_train.py: cannot read model.py at {rev} (a git checkout with that commit is needed): "
                 f"{proc.stderr.strip()}")
    path = Path(folder) / "model_old.py"
    path.write_text(proc.stdout)
    return path


def compare(args):
    print(f"one training step of 2,048 tokens, fp32, 1 thread; median of {args.rounds} x {args.steps} steps per arm; "
          f"old = model.py at {args.old_rev} + glibc's default malloc, new = this checkout (train.py on CPU), "
          f"compiled = new + compile_or_eager (train.py --compile on CPU)")
    print(f"{'d':>4}{'r':>3}{'old ms':>9}{'new ms':>9}{'compiled ms':>13}{'new/old':>9}{'compiled/old':>14}"
          f"{'compile s':>13}{'|loss old - new|, - compiled|':>31}")
    ratios = {"new": [], "compiled": []}
    with tempfile.TemporaryDirectory() as tmp:
        files = {"old": old_model_file(args.old_rev, tmp), "new": REPO / "model.py", "compiled": REPO / "model.py"}
        for width in args.widths:
            for r in args.r:
                results = {arm: [] for arm in ARMS}
                for round_index in range(args.rounds):
                    order = ARMS if round_index % 2 == 0 else ARMS[::-1]
                    for arm in order:
                        results[arm].append(run_worker(arm, width, r, args.steps, files[arm]))
                print_shape(width, r, results, ratios)
    for arm in ratios:
        print(f"{arm}/old over {len(ratios[arm])} shapes: min {min(ratios[arm]):.2f}x, "
              f"median {statistics.median(ratios[arm]):.2f}x, max {max(ratios[arm]):.2f}x")


def print_shape(width, r, results, ratios):
    """One table row: each arm's median step, the speed-ups over old, compile seconds and first-loss gaps."""
    ms = {arm: 1000 * statistics.median([t for result in results[arm] for t in result["step_s"]]) for arm in ARMS}
    first_loss = {arm: results[arm][0]["losses"][0] for arm in ARMS}
    compile_s = [result["compile_s"] for result in results["compiled"]]
    for arm in ratios:
        ratios[arm].append(ms["old"] / ms[arm])
    gaps = f"{abs(first_loss['old'] - first_loss['new']):.1e}, {abs(first_loss['old'] - first_loss['compiled']):.1e}"
    print(f"{width:>4}{r:>3}{ms['old']:>9.0f}{ms['new']:>9.0f}{ms['compiled']:>13.0f}{ms['old'] / ms['new']:>8.2f}x"
          f"{ms['old'] / ms['compiled']:>13.2f}x{compile_s[0]:>7.1f}/{compile_s[-1]:<5.1f}{gaps:>31}", flush=True)


def compare_attention(args):
    """One layer's attention, forward + backward, 16 rows of 128 tokens: PyTorch's SDPA against cpu_attention.py's
    kernel at each head dim (d = 128 split into heads of that dim: the everyday CPU shape) and each thread count, in
    this process (common.keep_freed_memory, as train.py), taking turns every repeat. model.attention_backend uses
    the kernel where this measures it faster."""
    sys.path.insert(0, str(REPO))
    import torch

    from nanoloop import common
    from nanoloop import cpu_attention
    from model import causal_attention
    common.keep_freed_memory()  # as train.py on CPU, for both kernels
    if not cpu_attention.available():
        sys.exit("bench_train.py: cpu_attention's kernel did not build here (no C compiler?), nothing to compare")
    arms = {"sdpa": ("sdpa", None), "kernel": ("cpu", cpu_attention.causal_attention)}
    print(f"one layer's causal attention, forward + backward, 16 x 128 tokens, d = {args.attention_width}, fp32; "
          f"median of {args.steps * args.rounds} repeats per kernel")
    print(f"{'threads':>8}{'head dim':>9}{'heads':>7}{'sdpa ms':>10}{'kernel ms':>11}{'sdpa/kernel':>13}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for head_dim in args.head_dims:
            heads = args.attention_width // head_dim
            q, k, v = [torch.randn(16, 128, heads, head_dim, requires_grad=True) for _ in range(3)]
            grad_out = torch.randn(16, 128, heads, head_dim)
            seconds = {arm: [] for arm in arms}
            for repeat in range(args.steps * args.rounds + 1):
                for arm, backend in arms.items():
                    t0 = time.perf_counter()
                    torch.autograd.grad(causal_attention(q, k, v, backend), (q, k, v), grad_out)
                    if repeat > 0:  # the first repeat builds and warms up
                        seconds[arm].append(time.perf_counter() - t0)
            ms = {arm: 1000 * statistics.median(seconds[arm]) for arm in arms}
            print(f"{threads:>8}{head_dim:>9}{heads:>7}{ms['sdpa']:>10.2f}{ms['kernel']:>11.2f}"
                  f"{ms['sdpa'] / ms['kernel']:>12.2f}x", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--widths", type=int, nargs="+", default=[8, 16, 24, 32, 48], help="model widths d (head dim 8)")
    p.add_argument("--r", type=int, nargs="+", default=[1, 2, 4, 8], help="loop counts")
    p.add_argument("--steps", type=int, default=6, help="timed steps per worker (after one warm-up step)")
    p.add_argument("--rounds", type=int, default=2, help="workers per arm and shape, alternating old/new")
    p.add_argument("--old-rev", default=OLD_REV, help="the git revision whose model.py is 'old'")
    p.add_argument("--tiny", action="store_true",
                   help="d = 8, r = 2, 2 steps, 1 round, then --attention at d = 8: checks that both run")
    p.add_argument("--head-dims", type=int, nargs="+", default=[8, 16, 32, 64], help="--attention: head dims")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="--attention: thread counts")
    p.add_argument("--attention-width", type=int, default=128, help="--attention: the width d the heads split")
    p.add_argument("--attention", action="store_true",
                   help="time only one layer's attention at each head dim and thread count, SDPA against the kernel")
    p.add_argument("--worker", choices=ARMS, help=argparse.SUPPRESS)
    p.add_argument("--width", type=int, help=argparse.SUPPRESS)
    p.add_argument("--model-file", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        args.r = args.r[0]
        worker(args)
        return
    if args.tiny:
        args.widths, args.r, args.steps, args.rounds = [8], [2], 2, 1
        args.head_dims, args.threads, args.attention_width = [8], [1], 8
    if args.attention:
        compare_attention(args)
        return
    compare(args)
    if args.tiny:  # the smoke test runs --attention's path too
        compare_attention(args)


if __name__ == "__main__":
    main()
