"""
Train one looped transformer of the iso-depth grid; one invocation = one row of the scaling study.

    python train.py --r 4 --scale 2 --data data/micro --flops 1e13 ...      # one process, CPU or GPU
    torchrun --nproc_per_node=8 train.py --r 4 --scale 10 --flops 1e18     # DDP (NCCL on GPU, gloo on CPU)

The horizon comes from a compute budget (--flops C: steps = round(C / (F B)), the sweep's mode),
a token count (--tokens) or tokens per parameter (--tokens-per-param). The recipe is RECIPE §4:
MuonH for block matrices, AdamW for the rest, LRs transferred across width, batch and horizon,
no warmup, linear decay to 10%. Every run writes into --out: log.jsonl (one line per logged step),
ckpt.pt (atomic; every --save-every steps, at the end, and on SIGTERM/SIGINT) and final.json; rank 0
appends the same final row to --results, which is what fit_laws.py reads.
"""
import argparse
import contextlib
import fcntl
import json
import math
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import flops
from model import GPT
from muonh import BASE_LRS, build_optimizers, learning_rates, lr_multiplier
from prepare_data import RowLoader, load_tokenizer, read_meta

# SIGTERM/SIGINT (preemption, Ctrl-C) only set this flag: the step in flight finishes, then every
# rank agrees to stop, a checkpoint is written and the run exits; --resume continues it exactly.
stop_requested = []
SAMPLE_PROMPTS = ["The capital of France is", "In the beginning of the school year,", "Water boils at"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    flops.add_model_args(p)
    p.set_defaults(vocab=None, seq_len=None)  # taken from the data's meta.json unless given
    g = p.add_argument_group("horizon (pick one)")
    g.add_argument("--flops", type=float, help="compute budget C in FLOPs (tokens from flops.py)")
    g.add_argument("--tokens", type=float, help="training tokens D")
    g.add_argument("--tokens-per-param", type=float, help="D = this x N (non-embedding); default 20")
    g = p.add_argument_group("batch")
    g.add_argument("--batch-tokens", type=int, default=2 ** 18, help="global batch B in tokens")
    g.add_argument("--device-batch", type=int, default=0, help="rows per micro-batch per rank (0: auto, <= 16)")
    g = p.add_argument_group("learning rates (base values at the reference; transfer rule applied)")
    for name, lr in BASE_LRS.items():
        g.add_argument(f"--lr-{name}", type=float, default=lr)
    g.add_argument("--batch-exp", type=float, default=0.558, help="LR ~ (B/B_ref)^batch_exp (MuonH, (un)embedding)")
    g.add_argument("--data-exp", type=float, default=0.32, help="MuonH LR ~ (D/D_ref)^-data_exp")
    g.add_argument("--width-exp", type=float, default=0.5, help="AdamW LR ~ (d/d_ref)^-width_exp")
    g.add_argument("--ref-width", type=int, default=640, help="d_ref of the transfer rule")
    g.add_argument("--ref-batch", type=int, default=2 ** 18, help="B_ref of the transfer rule")
    g.add_argument("--ref-tokens", type=float, default=0,
                   help="D_ref of the transfer rule (0: 10x effective params of the s=10 reference, flops.py)")
    g.add_argument("--final-lr-frac", type=float, default=0.1, help="linear decay ends at this fraction")
    g = p.add_argument_group("io")
    g.add_argument("--data", default="data/fineweb", help="directory written by prepare_data.py")
    g.add_argument("--out", default="", help="run directory (default runs/<run name>)")
    g.add_argument("--results", default="", help="JSONL file the final row is appended to")
    g.add_argument("--resume", action="store_true", help="continue from --out/ckpt.pt if it exists")
    g.add_argument("--save-every", type=int, default=500, help="checkpoint every N steps (0: only end/signal)")
    g.add_argument("--log-every", type=int, default=10)
    g.add_argument("--eval-every", type=int, default=0, help="periodic validation every N steps (0: final only)")
    g.add_argument("--eval-rows", type=int, default=512, help="fixed validation rows (held-out split)")
    g.add_argument("--eval-r", default="", help="also evaluate at these loop counts, e.g. 2,8 (App. A)")
    g.add_argument("--sample", type=int, default=0, help="print N sampled continuations at the end")
    g = p.add_argument_group("system")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--device", default="auto", help="auto | cpu | cuda")
    g.add_argument("--dtype", default="auto", help="auto (bf16 autocast on GPU, fp32 on CPU) | float32 | bfloat16")
    g.add_argument("--compile", action="store_true", help="torch.compile the model (GPU)")
    return p.parse_args(argv)


def fail(msg):
    """Bad input: one clear line on stderr, non-zero exit, before any expensive work."""
    print(f"train.py: {msg}", file=sys.stderr)
    sys.exit(2)


def plan_run(args, meta):
    """Validate every flag against the data and resolve the run plan. Reads only meta.json."""
    for name in ("seq_len", "vocab"):
        given, have = getattr(args, name), meta["seq_len" if name == "seq_len" else "vocab_size"]
        if given is not None and given != have:
            fail(f"--{name.replace('_', '-')} {given} does not match the data ({have}, {args.data}/meta.json)")
    args.seq_len = meta["seq_len"]
    try:
        cfg = flops.config_from_args(args, vocab_size=meta["vocab_size"])
    except ValueError as e:
        fail(str(e))
    horizons = [x for x in (args.flops, args.tokens, args.tokens_per_param) if x is not None]
    if len(horizons) > 1:
        fail("give only one of --flops, --tokens, --tokens-per-param")
    if any(not (x > 0 and math.isfinite(x)) for x in horizons):
        fail("the horizon (--flops/--tokens/--tokens-per-param) must be a positive number")
    if args.batch_tokens % cfg.seq_len:
        fail(f"--batch-tokens {args.batch_tokens} is not a multiple of the sequence length {cfg.seq_len}")
    n_params = flops.param_counts(cfg)["n_params"]
    if args.flops is not None:
        steps = flops.tokens_for_budget(cfg, args.flops, args.batch_tokens)["steps"]
    else:
        tokens = args.tokens if args.tokens is not None else (args.tokens_per_param or 20) * n_params
        steps = max(1, round(tokens / args.batch_tokens))
    return cfg, steps


def setup_distributed(device_arg):
    """torchrun sets RANK/WORLD_SIZE; NCCL on GPU, gloo on CPU. Single process otherwise."""
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    use_cuda = device_arg == "cuda" or (device_arg == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        fail("--device cuda but no CUDA device is visible")
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl" if use_cuda else "gloo")
    return rank, world, device


def all_reduce_mean(value, world, device):
    if world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.item() / world


@torch.no_grad()
def evaluate(model, args, rank, world, device, autocast, eval_rows, r=None):
    """Mean validation loss (nats/token) over the same fixed rows of the held-out split on every
    call, averaged over ranks (each rank reads a disjoint strided share)."""
    model.eval()
    batch_rows = max(1, min(args.device_batch, eval_rows // world))
    loader = RowLoader(args.data, "val", batch_rows, rank, world, start_row=0)
    n_batches = max(1, eval_rows // (batch_rows * world))
    total = 0.0
    for _ in range(n_batches):
        x, y = loader.next_batch()
        with autocast:
            total += model(x.to(device), y.to(device), r=r).item()
    model.train()
    return all_reduce_mean(total / n_batches, world, device)


def append_row(path, row):
    """One line, appended under an exclusive lock with a single write: concurrent runs of a sweep
    never interleave or truncate each other's rows."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(row) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(path, state):
    """Write to a temp file, then rename: a crash mid-write never replaces the last good one."""
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def write_json_atomic(path, obj):
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


def format_eta(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def main(argv=None):
    args = parse_args(argv)
    # --- validate everything before touching data or devices ---------------------------------
    try:
        meta = read_meta(args.data)
    except (FileNotFoundError, ValueError) as e:
        fail(str(e))
    cfg, steps = plan_run(args, meta)
    eval_r = [int(x) for x in args.eval_r.split(",") if x.strip()] if args.eval_r else []
    if any(x < 1 for x in eval_r):
        fail("--eval-r takes positive loop counts")
    run_name = (f"r{cfg.r}_s{cfg.scale:g}_rb{cfg.r_bwd}_{cfg.injection}"
                f"_{f'C{args.flops:.3g}' if args.flops else f'steps{steps}'}_seed{args.seed}")
    out = Path(args.out or f"runs/{run_name}")
    if (out / "final.json").exists():
        print(f"train.py: {out} already holds a finished run (final.json); nothing to do. "
              f"Delete the folder to retrain.")
        return 0
    if (out / "ckpt.pt").exists() and not args.resume:
        fail(f"{out}/ckpt.pt exists: pass --resume to continue it, or delete the folder to start over")

    rank, world, device = setup_distributed(args.device)
    master = rank == 0
    rows_per_step = args.batch_tokens // cfg.seq_len
    if rows_per_step % world:
        fail(f"{rows_per_step} rows per step do not split over {world} ranks")
    rows_per_rank = rows_per_step // world
    if args.device_batch == 0:
        args.device_batch = max(b for b in range(1, min(16, rows_per_rank) + 1) if rows_per_rank % b == 0)
    if rows_per_rank % args.device_batch:
        fail(f"--device-batch {args.device_batch} does not divide the {rows_per_rank} rows per rank per step")
    grad_accum = rows_per_rank // args.device_batch
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
    if dtype not in ("float32", "bfloat16"):
        fail(f"--dtype must be auto, float32 or bfloat16, got {dtype}")
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if dtype == "bfloat16"
                else contextlib.nullcontext())
    eval_rows = min(args.eval_rows, meta["val_rows"])
    if eval_rows < world:
        fail(f"the validation split has {meta['val_rows']} rows; need at least one per rank")

    # --- model, optimisers, data ---------------------------------------------------------------
    torch.manual_seed(args.seed)
    model = GPT(cfg).to(device)
    backend = model.set_device_backend(device)
    n_tokens = steps * args.batch_tokens
    tokens_ref = args.ref_tokens or flops.reference_horizon(looped=cfg.r > 1)
    lrs = learning_rates(cfg.d_model, args.batch_tokens, n_tokens, tokens_ref,
                         base_lrs={name: getattr(args, f"lr_{name}") for name in BASE_LRS},
                         batch_exp=args.batch_exp, data_exp=args.data_exp, width_exp=args.width_exp,
                         ref_width=args.ref_width, ref_batch=args.ref_batch)
    # Newton-Schulz in bf16 on GPU (tensor cores); on CPU fp32 matmuls are the fast ones.
    ns_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    optimizers = [opt for opt in build_optimizers(model.param_groups(), lrs, compute_dtype=ns_dtype)
                  if opt is not None]
    step, train_row, wall_before = 0, 0, 0.0
    ckpt_path = out / "ckpt.pt"
    if args.resume and ckpt_path.exists():
        ckpt = torch.load(ckpt_path, map_location=device, weights_only=False)
        if ckpt["config"] != flops.summary(cfg) or ckpt["steps"] != steps:
            fail(f"{ckpt_path} was written for another configuration or horizon "
                 f"({ckpt['steps']} steps); use another --out")
        model.load_state_dict(ckpt["model"])
        for opt, state in zip(optimizers, ckpt["optimizers"]):
            opt.load_state_dict(state)
        step, train_row, wall_before = ckpt["step"], ckpt["train_row"], ckpt["wall_s"]
        torch.set_rng_state(ckpt["rng_cpu"])
        if device.type == "cuda" and ckpt.get("rng_cuda") is not None:
            torch.cuda.set_rng_state(ckpt["rng_cuda"])
        if master:
            print(f"resumed {ckpt_path} at step {step}/{steps}")
    train_loader = RowLoader(args.data, "train", args.device_batch, rank, world, start_row=train_row)
    compiled = torch.compile(model) if args.compile and device.type == "cuda" else model
    if args.compile and device.type != "cuda" and master:
        print("train.py: --compile is only used on GPU; running eagerly")
    ddp_model = DDP(compiled, device_ids=[device.index] if device.type == "cuda" else None) if world > 1 else compiled

    def checkpoint():
        if master:
            out.mkdir(parents=True, exist_ok=True)
            save_checkpoint(ckpt_path, {
                "model": model.state_dict(), "optimizers": [o.state_dict() for o in optimizers],
                "step": step, "steps": steps, "train_row": train_loader.row, "wall_s": wall_before + time.time() - t_start,
                "rng_cpu": torch.get_rng_state(),
                "rng_cuda": torch.cuda.get_rng_state() if device.type == "cuda" else None,
                "config": flops.summary(cfg), "args": vars(args)})
        if world > 1:
            dist.barrier()

    summary = flops.summary(cfg, args.flops, args.batch_tokens)
    flops_per_token = summary["flops_per_token"]
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    if master:
        out.mkdir(parents=True, exist_ok=True)
        print(f"{run_name}: N {summary['n_params'] / 1e6:.2f}M (once {summary['n_once'] / 1e6:.2f}M, "
              f"rec {summary['n_rec'] / 1e6:.2f}M), {steps} steps x {args.batch_tokens:,} tokens = "
              f"{n_tokens:,} tokens, {flops_per_token * n_tokens:.3e} FLOPs")
        print(f"  {world} x {device_name}, {dtype}, attention {backend}, micro-batch {args.device_batch} rows "
              f"x {grad_accum} accumulation, LRs " + ", ".join(f"{k} {v:.3g}" for k, v in lrs.items()))

    # --- the training loop ---------------------------------------------------------------------
    t_start = time.time()
    timed_tokens, timed_seconds = 0, 0.0
    train_loss = tokens_per_s = None  # stay None if a checkpoint at the last step is resumed
    log_file = open(out / "log.jsonl", "a") if master else None
    val_loss = None
    while step < steps:
        t0 = time.time()
        lr_mult = lr_multiplier(step, steps, args.final_lr_frac)
        for opt in optimizers:
            for group in opt.param_groups:
                group["lr"] = group["initial_lr"] * lr_mult
        loss_sum = 0.0
        for micro in range(grad_accum):
            x, y = train_loader.next_batch()
            # Gradients are all-reduced once per step, on the last micro-batch.
            sync = contextlib.nullcontext() if world == 1 or micro == grad_accum - 1 else ddp_model.no_sync()
            with sync:
                with autocast:
                    loss = ddp_model(x.to(device, non_blocking=True), y.to(device, non_blocking=True))
                (loss / grad_accum).backward()
            loss_sum += loss.detach()
        train_loss = all_reduce_mean((loss_sum / grad_accum).item(), world, device)
        if not math.isfinite(train_loss):
            if master:
                print(f"train.py: loss is {train_loss} at step {step}; stopping. The last good checkpoint "
                      f"({ckpt_path if ckpt_path.exists() else 'none yet'}) is kept.", file=sys.stderr)
            return 1
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)
        step += 1
        dt = time.time() - t0
        if step > 1 or steps == 1:  # the first step pays for compilation and allocator warm-up
            timed_tokens += args.batch_tokens
            timed_seconds += dt
        tokens_per_s = timed_tokens / timed_seconds if timed_seconds else args.batch_tokens / dt
        if args.eval_every and step % args.eval_every == 0 and step < steps:
            val_loss = evaluate(model, args, rank, world, device, autocast, eval_rows)
        if master and (step % args.log_every == 0 or step == steps or step == 1):
            mfu = flops.mfu(cfg, tokens_per_s, world, device_name)
            record = {"step": step, "steps": steps, "loss": train_loss, "lr_mult": lr_mult,
                      "tokens_per_s": tokens_per_s, "mfu": mfu, "train_row": train_loader.row,
                      "elapsed_s": wall_before + time.time() - t_start}
            if args.eval_every and step % args.eval_every == 0:
                record["val_loss"] = val_loss
            log_file.write(json.dumps(record) + "\n")
            log_file.flush()
            eta = (steps - step) * timed_seconds / max(1, step - 1) if timed_seconds else 0
            print(f"step {step:>6}/{steps} | loss {train_loss:.4f} | lrm {lr_mult:.3f} | "
                  f"{tokens_per_s:,.0f} tok/s | {flops_per_token * tokens_per_s / 1e9:,.1f} GFLOP/s | "
                  f"mfu {f'{100 * mfu:.1f}%' if mfu is not None else 'n/a'} | eta {format_eta(eta)}"
                  + (f" | val {record['val_loss']:.4f}" if "val_loss" in record else ""), flush=True)
        stop = all_reduce_mean(float(bool(stop_requested)), world, device) > 0  # every rank stops together
        if stop or (args.save_every and step % args.save_every == 0 and step < steps):
            checkpoint()
        if stop:
            if master:
                print(f"train.py: interrupted at step {step}/{steps}; checkpoint saved to {ckpt_path}. "
                      f"Rerun with --resume to continue.", flush=True)
            return 143

    # --- final evaluation and the results row --------------------------------------------------
    val_loss = evaluate(model, args, rank, world, device, autocast, eval_rows)
    extra_eval = {f"val_loss_r{r}": evaluate(model, args, rank, world, device, autocast, eval_rows, r=r)
                  for r in eval_r}
    checkpoint()
    wall_s = wall_before + time.time() - t_start
    if master:
        row = dict(summary)
        row.update(tokens=n_tokens, steps=steps, flops_actual=flops_per_token * n_tokens,
                   val_loss=val_loss, train_loss=train_loss, **extra_eval, eval_rows=eval_rows,
                   seed=args.seed, tokens_per_s=tokens_per_s,
                   mfu=flops.mfu(cfg, tokens_per_s, world, device_name) if tokens_per_s else None, wall_s=wall_s,
                   lrs=lrs, base_lrs={name: getattr(args, f"lr_{name}") for name in BASE_LRS},
                   lr_rule={"batch_exp": args.batch_exp, "data_exp": args.data_exp, "width_exp": args.width_exp,
                            "ref_width": args.ref_width, "ref_batch": args.ref_batch, "ref_tokens": tokens_ref},
                   world_size=world, device=device_name, dtype=dtype, attention=backend,
                   run=run_name, out=str(out),
                   data_meta={k: meta.get(k) for k in ("tokenizer_kind", "tokenizer_sha256", "vocab_size", "seq_len",
                                                        "train_rows", "val_rows", "train_tokens", "command")}
                   | {"dir": str(Path(args.data).resolve()), "epochs": train_loader.row / max(1, meta["train_rows"])})
        print(f"final val loss {val_loss:.4f} nats/token" +
              "".join(f", r={k[10:]}: {v:.4f}" for k, v in extra_eval.items()) + f" | wall {format_eta(wall_s)}")
        if args.results:
            append_row(args.results, row)
        write_json_atomic(out / "final.json", row)  # marks the run finished: a rerun skips it
        if args.sample:
            tokenizer = load_tokenizer(args.data)
            for prompt in (SAMPLE_PROMPTS * args.sample)[: args.sample]:
                ids = torch.tensor([[tokenizer.bos_id] + tokenizer.encode(prompt)], device=device)
                with autocast:
                    sample = model.generate(ids, 48, temperature=0.8, top_k=50)
                print(f"--- {tokenizer.decode(sample[0, 1:].tolist())!r}")
        log_file.close()
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop_requested.append(signum))
    sys.exit(main())
