"""
One-shot GPU check: does the training step run on a GPU, how fast, in how much memory, and is bf16 sane?

    bash dev/gpu_check.sh                  # one H200, < 8 min, no network; files in $OUT or dev/results/gpu_check
    bash dev/gpu_check.sh --tiny           # the same 12 configurations at toy size on CPU (~30 s; the tests run it)

For s = 10 and s = 24, each at r = 1, r = 4 and r = 4 with r_bwd = 2, eagerly and under torch.compile
(12 configurations), it runs real training steps the way train.py does them: bf16 autocast, seq len
2048, forward + backward + MuonH/AdamW step (muonh.build_optimizers over model.param_groups(), the
paper's learning rates at the reference batch). Micro-batch: 16 rows of 2048 tokens, train.py's
default (halved and retried on out-of-memory; the rows used are reported). Per configuration:

  tokens_per_s, mfu       one micro-batch + one optimiser step per step, warm-up steps excluded;
                          MFU = flops.flops_per_token x tokens/s / peak (H200: 989 TFLOP/s dense bf16)
  at_2p18_tokens_per_s    projected for the paper's batch of 2^18 tokens: gradient accumulation runs
                          the optimiser once per 2^18 tokens, so fwd_bwd_s x accum + optimizer_s
  fwd_bwd_s, optimizer_s  seconds per step in each part (synchronised), so MuonH's cost is visible
  first_step_s, compile_s the first step's wall time; compile_s = first step - a steady step (compiled)
  compiled_graphs,        Dynamo's graph count and graph breaks (compiled): 1 and 0 mean the whole
  graph_breaks            model, no_grad loops of truncated BPTT included, is one compiled program
  peak_mem_gib            torch.cuda.max_memory_allocated over the training steps
  loss_first, loss_last   training loss of the first and last step (same fixed batch every step)
  loss_bf16, loss_fp32    the eager model's loss on that batch after training, with and without bf16
                          autocast (fp32 matmuls without TF32); their difference is the numerics check
  warnings                Python warnings raised inside the configuration (e.g. an unfused kernel)

How to read it: the compiled rows' MFU is what train.py --compile gets at that micro-batch; r4 should
match r1 in MFU (same FLOPs per token up to W_inj, iso-depth); r4_bwd2 runs 0.76x (s = 10) / 0.75x
(s = 24) of r4's FLOPs per token, so at equal MFU it has ~1.3x the tokens/s; bf16 - fp32 should be a
few 1e-3 nats at most.

Data: random tokens (uniform over the vocabulary, one fixed batch per configuration), because the GPU
box has no dataset: losses sit near ln(vocab) = 10.4 and only drop by memorising the batch. The speed
does not depend on the token values. Every configuration is appended to the JSON as soon as it ends,
a failing one (compile error, OOM at 1 row) is recorded with its error and the rest go on, and
--max-seconds skips configurations that would not finish in time.

Planned cost (flops.py): one step of 16 x 2048 tokens is 34 TFLOP at s = 10 and 146 TFLOP at s = 24
(r = 1), ~0.1 s and ~0.4 s on an H200 at 30-35% MFU, so 13 steps take seconds; the compiles (~30-90 s
each) dominate the budget, which is why the eager runs come first. Eager peak memory at s = 24,
estimated: ~62 GB of activations (1.9 MB/token, measured on CPU under bf16 autocast) + ~10 GB of
weights and optimiser state + backward transients: 80-100 GB of the H200's 141.

--tiny (CPU smoke test): every configuration at scale 0.25, head dim 8, seq len 64, vocab 512,
effective depth 8 (r = 4: prelude 2 + 4 x 1 shared layer + coda 2), 2 rows, one thread, fp32 training
(the bf16 check uses CPU autocast), and torch.compile with the "eager" backend: Dynamo traces the
whole model (graph breaks and guards show up) without inductor's code generation, which would take
minutes on 2 CPU cores.
"""
import argparse
import contextlib
import gc
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from torch._dynamo.utils import counters
from torch.nn.attention import SDPBackend

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import flops  # noqa: E402
from nanoloop.common import atomic_write  # noqa: E402 (pure Python: the GPU box needs torch alone)
from model import GPT, attention_backend  # noqa: E402
from muonh import REF_BATCH_TOKENS, build_optimizers, learning_rates  # noqa: E402

# (name, r, r_bwd) x scale, in order of priority: eager first (cheap, so a run cut short by
# --max-seconds still has every architecture), truncated BPTT last among the compiled ones.
ARCHS = (("r1", 1, 1), ("r4", 4, 4), ("r4_bwd2", 4, 2))
ROWS = 16  # train.py's micro-batch: --device-batch 0 picks the largest divisor of the rows per rank <= 16
CONFIGS = [dict(name=f"s{s}_{arch}_{'compiled' if compiled else 'eager'}", scale=s, r=r, r_bwd=r_bwd,
                rows=ROWS, compiled=compiled)
           for compiled in (False, True) for arch, r, r_bwd in ARCHS for s in (10, 24)]
FIRST_COMPILE_GUESS_S = 90  # time budget for the first inductor compile, before one has been measured
TINY_SHAPE = dict(scale=0.25, head_dim=8, seq_len=64, vocab_size=512, depth=8)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def environment(device):
    """Versions, the device and its peak, the attention backend and SDPA kernel."""
    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
           "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "float32_matmul_precision": torch.get_float32_matmul_precision(),  # "highest": no TF32 in the fp32 loss
           "attention_backend": attention_backend(device)[0]}
    with contextlib.suppress(ImportError):
        import triton
        env["triton"] = triton.__version__
    if device.type == "cuda":
        env["capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
        env["peak_bf16_flops"] = flops.peak_flops(env["device"])
    # Which kernel SDPA runs for a causal call at head dim 128 (bf16 on the GPU): FLASH_ATTENTION,
    # CUDNN_ATTENTION, EFFICIENT_ATTENTION or MATH. A private helper; without it the check goes on.
    q = torch.randn(1, 8, 256, 128, device=device, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)
    with contextlib.suppress(Exception):
        env["sdpa_kernel"] = SDPBackend(torch._fused_sdp_choice(q, q, q, is_causal=True)).name
    return env


def measure(spec, rows, args, device):
    """Train `spec` for warmup + steps steps on one fixed random batch; returns the measured fields."""
    shape = {"scale": spec["scale"], **(TINY_SHAPE if args.tiny else {})}
    cfg = flops.ModelConfig(r=spec["r"], r_bwd=spec["r_bwd"], **shape)
    torch.manual_seed(0)
    with torch.device(device):  # initialise on the GPU: a 665M-parameter CPU init takes seconds
        model = GPT(cfg)
    attention = model.set_device_backend(device)
    # The paper's LRs at its reference batch and horizon: realistic step sizes for MuonH and AdamW.
    tokens_ref = flops.reference_horizon(looped=cfg.r > 1)
    lrs = learning_rates(cfg.d_model, REF_BATCH_TOKENS, tokens_ref, tokens_ref)
    ns_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # as train.py
    optimizers = [o for o in build_optimizers(model.param_groups(), lrs, compute_dtype=ns_dtype) if o]
    # Like train.py. The Dynamo reset starts every compile from scratch, as in a fresh train.py process
    # (otherwise the next model's new shapes would be recompiled as dynamic); inductor's on-disk
    # kernel caches stay, as they would on a node.
    if spec["compiled"]:
        torch._dynamo.reset()
        counters.clear()
    step_model = torch.compile(model, backend="eager" if args.tiny else "inductor") if spec["compiled"] else model
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext())
    generator = torch.Generator(device=device).manual_seed(0)
    batch = torch.randint(0, cfg.vocab_size, (rows, cfg.seq_len + 1), device=device, generator=generator)
    x, y = batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    losses, fwd_bwd, opt_time, first_step_s = [], [], [], None
    for step in range(args.warmup + args.steps):
        if step > args.warmup and time.time() > args.deadline:
            break  # out of time: keep the timed steps we have
        t0 = time.perf_counter()
        with autocast:
            loss = step_model(x, y)
        loss.backward()
        sync(device)
        t1 = time.perf_counter()
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)
        sync(device)
        t2 = time.perf_counter()
        losses.append(loss.item())
        if step == 0:
            first_step_s = t2 - t0
        if step >= args.warmup:
            fwd_bwd.append(t1 - t0)
            opt_time.append(t2 - t1)
    # One graph and no breaks means the whole step (no_grad loops included) is one compiled program.
    graphs = counters["stats"]["unique_graphs"] if spec["compiled"] else None
    graph_breaks = sum(counters["graph_break"].values()) if spec["compiled"] else None
    peak = torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else None
    losses_bf16_fp32 = bf16_vs_fp32(model, x, y, device)
    fwd_bwd_s, optimizer_s = statistics.median(fwd_bwd), statistics.median(opt_time)
    step_s, tokens = fwd_bwd_s + optimizer_s, rows * cfg.seq_len
    accum = max(1, REF_BATCH_TOKENS // tokens)
    tokens_per_s, at_2p18 = tokens / step_s, accum * tokens / (accum * fwd_bwd_s + optimizer_s)
    return dict(attention=attention, d_model=cfg.d_model, seq_len=cfg.seq_len, tokens_per_step=tokens,
                flops_per_token=flops.flops_per_token(cfg), n_params=flops.param_counts(cfg)["n_params"],
                timed_steps=len(fwd_bwd), tokens_per_s=tokens_per_s,
                mfu=flops.mfu(cfg, tokens_per_s, 1, args.device_name), fwd_bwd_s=fwd_bwd_s, optimizer_s=optimizer_s,
                at_2p18_tokens_per_s=at_2p18, at_2p18_mfu=flops.mfu(cfg, at_2p18, 1, args.device_name),
                compiled_graphs=graphs, graph_breaks=graph_breaks, first_step_s=first_step_s,
                compile_s=first_step_s - step_s if spec["compiled"] else None,
                peak_mem_gib=peak, loss_first=losses[0], loss_last=losses[-1], **losses_bf16_fp32)


def bf16_vs_fp32(model, x, y, device):
    """The eager model's loss on (x, y) with and without bf16 autocast. A failure here (e.g. a model
    that only runs under autocast on the GPU) is recorded without discarding the speed numbers."""
    try:
        with torch.no_grad():
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss_bf16 = model(x, y).item()
            loss_fp32 = model(x, y).item()
    except Exception as e:
        return dict(loss_bf16=None, loss_fp32=None, loss_bf16_minus_fp32=None, loss_check_error=first_line(e))
    return dict(loss_bf16=loss_bf16, loss_fp32=loss_fp32, loss_bf16_minus_fp32=loss_bf16 - loss_fp32)


def first_line(error):
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:300]}"


def run_config(spec, args, device):
    """One configuration, halving the rows on out-of-memory; errors are recorded, never raised."""
    row, rows, started = dict(spec), spec["rows"], time.time()
    while True:
        row.update(rows=rows, status="ok", error=None)
        try:
            with warnings.catch_warnings(record=True) as caught:  # e.g. a slow unfused kernel on the GPU
                warnings.simplefilter("always")
                row.update(measure(spec, rows, args, device))
            row["warnings"] = sorted({f"{w.category.__name__}: {str(w.message).strip()[:300]}" for w in caught})
        except Exception as e:  # a compile error or a crash in one configuration must not stop the others
            oom = isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e)
            row.update(status="failed", error=f"out of memory at {rows} rows" if oom else first_line(e))
        torch._dynamo.reset()  # drop compiled graphs (they hold the model) before the next configuration
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if not (row["error"] or "").startswith("out of memory") or rows == 1:
            break
        rows //= 2
    row["wall_s"] = time.time() - started
    return row


def cell(value, width, spec):
    """A right-aligned table cell; '-' where the value does not exist (no MFU on CPU, eager compile time)."""
    return ("-" if value is None else format(value, spec)).rjust(width)


def write_outputs(out, stem, report):
    """JSON plus a readable table; rewritten after every configuration so a cut-short run keeps both."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / f"{stem}.json", (json.dumps(report, indent=1) + "\n").encode())
    env = report["environment"]
    lines = [f"{env['device']} | torch {env['torch']} (CUDA {env['cuda']}) | attention {env['attention_backend']}"
             f" (SDPA kernel {env.get('sdpa_kernel', 'unknown')})",
             report["data"], "",
             f"{'configuration':<22}{'rows':>5}{'tok/s':>10}{'MFU':>7}{'@2^18 MFU':>10}{'fwd+bwd s':>10}"
             f"{'optim s':>9}{'compile s':>10}{'peak GiB':>9}{'loss first>last':>17}{'bf16-fp32':>11}"]
    for row in report["configs"]:
        if row["status"] != "ok":
            lines.append(f"{row['name']:<22}{row['rows']:>5}  {row['status']}: {row['error']}")
            continue
        lines.append(f"{row['name']:<22}{row['rows']:>5}{row['tokens_per_s']:>10,.0f}{cell(row['mfu'], 7, '.1%')}"
                     f"{cell(row['at_2p18_mfu'], 10, '.1%')}{row['fwd_bwd_s']:>10.3f}{row['optimizer_s']:>9.3f}"
                     f"{cell(row['compile_s'], 10, '.1f')}{cell(row['peak_mem_gib'], 9, '.1f')}"
                     f"{row['loss_first']:>9.3f}>{row['loss_last']:<7.3f}"
                     f"{cell(row['loss_bf16_minus_fp32'], 11, '+.4f')}")
    peak = f"{env['peak_bf16_flops']:.3g} FLOP/s" if env.get("peak_bf16_flops") else "peak (none known for this device)"
    lines.append(f"\ntotal {report['wall_s']:.0f} s. MFU = flops.py F x tokens/s / {peak}"
                 "; @2^18 = projected with gradient accumulation to the paper's 2^18-token batch")
    for row in report["configs"]:
        if row.get("loss_check_error"):
            lines.append(f"bf16-vs-fp32 loss check failed ({row['name']}): {row['loss_check_error']}")
    for text in sorted({w for row in report["configs"] for w in row.get("warnings", [])}):
        where = ", ".join(row["name"] for row in report["configs"] if text in row.get("warnings", []))
        lines.append(f"warning ({where}): {text}")
    atomic_write(out / f"{stem}.txt", ("\n".join(lines) + "\n").encode())  # a cut-short run keeps both files whole
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="toy shape on CPU (the test's smoke run)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--out", default="dev/results/gpu_check", help="folder for gpu_check[_tiny].json/.txt")
    p.add_argument("--steps", type=int, default=None, help="timed steps per configuration (default 10; tiny 2)")
    p.add_argument("--max-seconds", type=float, default=400, help="skip configurations that would end later")
    p.add_argument("--only", default="", help="comma-separated configuration names, e.g. s24_r4_compiled")
    args = p.parse_args(argv)
    names = [c["name"] for c in CONFIGS]
    only = [n for n in args.only.split(",") if n]
    unknown = sorted(set(only) - set(names))
    checks = ((args.device not in ("auto", "cpu", "cuda"), f"--device must be auto|cpu|cuda, got {args.device}"),
              (args.device == "cuda" and not torch.cuda.is_available(), "--device cuda but no CUDA is visible"),
              (args.steps is not None and args.steps < 1, "--steps must be >= 1"),
              (not args.max_seconds > 0, "--max-seconds must be positive"),
              (unknown, f"--only: unknown {unknown}; known: {','.join(names)}"))
    for bad, reason in checks:
        if bad:
            print(f"gpu_check.py: {reason}", file=sys.stderr)
            return 2
    args.steps = args.steps or (2 if args.tiny else 10)
    args.warmup = 1 if args.tiny else 3  # untimed: the first step compiles, the next ones may still tune
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if use_cuda else "cpu")
    if args.tiny and device.type == "cpu":
        torch.set_num_threads(1)  # toy-sized ops: extra threads only add contention on a shared machine
    args.device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    start = time.time()
    args.deadline = start + args.max_seconds
    stem = "gpu_check_tiny" if args.tiny else "gpu_check"
    report = {"environment": environment(device), "settings": {k: v for k, v in vars(args).items() if k != "deadline"},
              "data": "data: random tokens, uniform over the vocabulary, one fixed batch per configuration (no dataset "
                      "on the GPU box): losses stay near ln(vocab) and say nothing about learning",
              "configs": [], "wall_s": 0.0}
    # Longest eager / compiled configuration so far: the estimate of the next one's time.
    spent = {False: 0.0, True: 0.0 if args.tiny else FIRST_COMPILE_GUESS_S}
    rows_that_fit = {}
    for spec in CONFIGS:
        if only and spec["name"] not in only:
            continue
        # A compiled run starts at the rows its eager twin fitted in: an OOM after a compile is costly.
        shape_key = (spec["scale"], spec["r"], spec["r_bwd"])
        spec = dict(spec, rows=2 if args.tiny else rows_that_fit.get(shape_key, spec["rows"]))
        if time.time() + spent[spec["compiled"]] > args.deadline:
            row = dict(spec, status="skipped", error=f"--max-seconds {args.max_seconds:g} would be exceeded")
        else:
            row = run_config(spec, args, device)
            spent[spec["compiled"]] = max(spent[spec["compiled"]], row["wall_s"])
            if row["status"] == "ok":
                rows_that_fit[shape_key] = row["rows"]
        report["configs"].append(row)
        report["wall_s"] = time.time() - start
        print(f"{row['name']}: {row['status']}" + (f" ({row['error']})" if row["error"] else
              f", {row['tokens_per_s']:,.0f} tokens/s, {row['wall_s']:.1f} s"), flush=True)
        table = write_outputs(Path(args.out), stem, report)
    print("\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
