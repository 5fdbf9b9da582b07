"""
Train one looped transformer of the iso-depth grid; one invocation = one row of the scaling study.

    python train.py --r 4 --scale 2 --data data/micro --flops 1e13 ...      # one process, CPU or GPU
    torchrun --nproc_per_node=8 train.py --r 4 --scale 10 --flops 1e18     # DDP (NCCL on GPU, gloo on CPU)

The horizon comes from a compute budget (--flops C: steps = round(C / (F B)), the sweep's mode),
a token count (--tokens) or tokens per parameter (--tokens-per-param). The recipe is RECIPE §4:
MuonH for block matrices, AdamW for the rest, LRs transferred across width, batch and horizon,
no warmup, linear decay to 10%.

A run is named by its identity (model config, horizon, LRs, seed, eval rows, dtype and the data's
identity from prepare_data.py) and its run_id = sha256 of that. --out holds run.json (identity),
log.jsonl, ckpt.pt (only finite weights; every --save-every steps, at the end, on SIGTERM/SIGINT)
and final.json; rank 0 appends the final row to --results (what fit_laws.py reads), durably and
whole, and only then writes final.json. Exit codes: 0 trained, "already done:" or "reused:";
2 bad input or another run's files; 1 diverged (no row); 75 "busy:" (--out is locked by a live
process); 143 interrupted (rerun with --resume continues it bit-identically).
"""
import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
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
from prepare_data import RowLoader, atomic_write, data_identity, load_tokenizer, read_meta

# SIGTERM/SIGINT (preemption, Ctrl-C) only set this flag: the step in flight finishes, then every
# rank agrees to stop, a checkpoint is written and the run exits; --resume continues it exactly.
stop_requested = []
SAMPLE_PROMPTS = ["The capital of France is", "In the beginning of the school year,", "Water boils at"]
# Divergence without NaN: a healthy run starts at the uniform loss ln(V) (lm_head is ~0 at init)
# and only goes down; a brief spike after a bad batch recovers within a few steps. A loss 2 nats
# above uniform means confidently wrong predictions; held for 50 steps (or 10% of a shorter run)
# it is a blown-up run, not a spike, and its row would only distort the fit.
DIVERGED_NATS, DIVERGED_STEPS = 2.0, 50


def print0(*args, **kwargs):
    """print on rank 0 only (torchrun sets RANK), so a DDP run logs once."""
    if int(os.environ.get("RANK", 0)) == 0:
        print(*args, **kwargs, flush=True)


def fail(msg, code=2):
    """Bad input: one clear line on stderr, non-zero exit, before any expensive work."""
    print(f"train.py: {msg}", file=sys.stderr)
    sys.exit(code)


def int_at_least(low):
    def parse(text):
        if not text.strip().lstrip("-").isdigit() or int(text) < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}")
        return int(text)
    return parse


def finite_float(text):
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def loop_counts(text):
    parts = [x.strip() for x in text.split(",") if x.strip()]
    if not all(x.isdigit() and int(x) >= 1 for x in parts):
        raise argparse.ArgumentTypeError(f"expected positive loop counts such as 2,8, got {text!r}")
    return [int(x) for x in parts]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.error = lambda message: fail(message)  # one line, not the usage block
    flops.add_model_args(p)
    p.set_defaults(vocab=None, seq_len=None)  # taken from the data's meta.json unless given
    pos, nonneg = int_at_least(1), int_at_least(0)
    g = p.add_argument_group("horizon (pick one)")
    g.add_argument("--flops", type=float, help="compute budget C in FLOPs (tokens from flops.py)")
    g.add_argument("--tokens", type=float, help="training tokens D")
    g.add_argument("--tokens-per-param", type=float, help="D = this x N (non-embedding); default 20")
    g = p.add_argument_group("batch")
    g.add_argument("--batch-tokens", type=pos, default=2 ** 18, help="global batch B in tokens")
    g.add_argument("--device-batch", type=nonneg, default=0, help="rows per micro-batch per rank (0: auto, <= 16)")
    g = p.add_argument_group("learning rates (base values at the reference; transfer rule applied)")
    for name, lr in BASE_LRS.items():
        g.add_argument(f"--lr-{name}", type=finite_float, default=lr)
    g.add_argument("--batch-exp", type=finite_float, default=0.558, help="LR ~ (B/B_ref)^batch_exp (MuonH, (un)embedding)")
    g.add_argument("--data-exp", type=finite_float, default=0.32, help="MuonH LR ~ (D/D_ref)^-data_exp")
    g.add_argument("--width-exp", type=finite_float, default=0.5, help="AdamW LR ~ (d/d_ref)^-width_exp")
    g.add_argument("--ref-width", type=pos, default=640, help="d_ref of the transfer rule")
    g.add_argument("--ref-batch", type=pos, default=2 ** 18, help="B_ref of the transfer rule")
    g.add_argument("--ref-tokens", type=finite_float, default=0,
                   help="D_ref of the transfer rule (0: 10x effective params of the s=10 reference, flops.py)")
    g.add_argument("--final-lr-frac", type=finite_float, default=0.1, help="linear decay ends at this fraction")
    g = p.add_argument_group("io")
    g.add_argument("--data", default="data/fineweb", help="directory written by prepare_data.py")
    g.add_argument("--out", default="", help="run directory (default runs/<run name>)")
    g.add_argument("--results", default="", help="JSONL file the final row is appended to")
    g.add_argument("--resume", action="store_true", help="continue from --out/ckpt.pt if it exists")
    g.add_argument("--reuse-from", default="", help="finished run folder of another grid: if its identity is this "
                   "run's, append its row instead of training")
    g.add_argument("--save-every", type=nonneg, default=500, help="checkpoint every N steps (0: only end/signal)")
    g.add_argument("--log-every", type=pos, default=10)
    g.add_argument("--eval-every", type=nonneg, default=0, help="periodic validation every N steps (0: final only)")
    g.add_argument("--eval-rows", type=pos, default=512, help="fixed validation rows (held-out split)")
    g.add_argument("--eval-r", type=loop_counts, default=[], help="also evaluate at these loop counts, e.g. 2,8 (App. A)")
    g.add_argument("--sample", type=nonneg, default=0, help="print N sampled continuations at the end")
    g = p.add_argument_group("system")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="auto: bf16 autocast on GPU, fp32 on CPU")
    g.add_argument("--compile", action="store_true", help="torch.compile the model (inductor, GPU or CPU)")
    return p.parse_args(argv)


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
    world = int(os.environ.get("WORLD_SIZE", 1))
    rows_per_step = args.batch_tokens // cfg.seq_len
    if rows_per_step % world:
        fail(f"{rows_per_step} rows per step do not split over {world} ranks")
    rows_per_rank = rows_per_step // world
    if args.device_batch == 0:
        args.device_batch = max(b for b in range(1, min(16, rows_per_rank) + 1) if rows_per_rank % b == 0)
    if rows_per_rank % args.device_batch:
        fail(f"--device-batch {args.device_batch} does not divide the {rows_per_rank} rows per rank per step")
    if min(args.eval_rows, meta["val_rows"]) < world:
        fail(f"the validation split has {meta['val_rows']} rows; need at least one per rank")
    n_params = flops.param_counts(cfg)["n_params"]
    if args.flops is not None:
        return cfg, flops.tokens_for_budget(cfg, args.flops, args.batch_tokens)["steps"]
    tokens = args.tokens if args.tokens is not None else (args.tokens_per_param or 20) * n_params
    return cfg, max(1, round(tokens / args.batch_tokens))


def differences(theirs, ours, prefix=""):
    """'key (theirs -> ours)' for every leaf of two identity dicts that differs."""
    out = []
    for key in sorted(set(theirs) | set(ours)):
        a, b = theirs.get(key), ours.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key} ({str(a)[:16]} -> {str(b)[:16]})")
    return out


def refuse_other_run(path, record, identity):
    diff = differences(record.get("identity") or {}, identity)
    fail(f"{path} belongs to another run; it differs in {', '.join(diff[:8])}{' ...' if len(diff) > 8 else ''}. "
         f"Use another --out")


def read_json(path):
    return json.loads(path.read_text()) if path.exists() else None


def read_rows(path):
    """The rows of a results file; a line that is not JSON (a half row from an older train.py)
    is skipped here and reported by fit_laws.py."""
    rows = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            rows.append(json.loads(line))
    return rows


def append_row(path, row):
    """One whole line or nothing, durable, under an exclusive lock: concurrent runs never
    interleave, and a short write (full disk) is truncated away and raised, never left half."""
    line = (json.dumps(row) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        try:
            written = os.write(fd, line)
            if written != len(line):
                raise OSError(f"short write, {written} of {len(line)} bytes (disk full?)")
            os.fsync(fd)
        except BaseException:
            os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


def setup_distributed(use_cuda):
    """torchrun sets RANK/WORLD_SIZE; NCCL on GPU, gloo on CPU. Single process otherwise."""
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if use_cuda else "cpu")
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
def evaluate(model, loader, n_batches, world, device, autocast, r=None):
    """Mean validation loss (nats/token) over the same fixed rows of the held-out split on every
    call (the loader restarts at row 0), averaged over ranks (each reads a disjoint share)."""
    model.eval()
    loader.row, total = 0, 0.0
    for _ in range(n_batches):
        x, y = loader.next_batch()
        with autocast:
            total += model(x.to(device), y.to(device), r=r).item()
    model.train()
    return all_reduce_mean(total / n_batches, world, device)


def compile_model(model, x, autocast):
    """torch.compile (inductor, GPU and CPU), compiled now by one throwaway forward+backward so
    that a missing C++ compiler or an inductor error falls back to eager with one line instead of
    failing mid-run. RNG state and gradients are left as they were (resume stays exact)."""
    compiled = torch.compile(model)
    try:
        with torch.random.fork_rng(devices=[x.device] if x.is_cuda else []), autocast:
            compiled(x, x.clone()).backward()  # distinct tensors: Dynamo guards on aliasing
    except Exception as e:  # dynamo/inductor raise many kinds; all of them mean "run eagerly"
        print0(f"train.py: torch.compile failed ({type(e).__name__}: {str(e).strip()[:200]!r}); running eagerly",
               file=sys.stderr)
        compiled = model
    model.zero_grad(set_to_none=True)
    return compiled


def format_eta(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def main(argv=None):
    args = parse_args(argv)
    # --- validate everything and fix the run's identity before touching devices ---------------
    try:
        meta = read_meta(args.data)
        data_id = data_identity(meta)
    except (FileNotFoundError, ValueError, KeyError) as e:
        fail(str(e))
    cfg, steps = plan_run(args, meta)
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        fail("--device cuda but no CUDA device is visible")
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if use_cuda else "float32")
    n_tokens = steps * args.batch_tokens
    tokens_ref = args.ref_tokens or flops.reference_horizon(looped=cfg.r > 1)
    base_lrs = {name: getattr(args, f"lr_{name}") for name in BASE_LRS}
    lr_rule = {"batch_exp": args.batch_exp, "data_exp": args.data_exp, "width_exp": args.width_exp,
               "ref_width": args.ref_width, "ref_batch": args.ref_batch, "ref_tokens": tokens_ref}
    try:
        lrs = learning_rates(cfg.d_model, args.batch_tokens, n_tokens, tokens_ref, base_lrs=base_lrs,
                             **{k: v for k, v in lr_rule.items() if k != "ref_tokens"})
    except ValueError as e:
        fail(str(e))
    eval_rows = min(args.eval_rows, meta["val_rows"])
    identity = json.loads(json.dumps({  # through JSON, so it compares equal to what files hold
        "model": dataclasses.asdict(cfg),
        "horizon": {"steps": steps, "batch_tokens": args.batch_tokens, "flops_budget": args.flops},
        "lrs": lrs, "base_lrs": base_lrs, "lr_rule": lr_rule | {"final_lr_frac": args.final_lr_frac},
        "seed": args.seed, "eval_rows": eval_rows, "dtype": dtype, "data": data_id}))
    run_id = hashlib.sha256(json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    run_name = (f"r{cfg.r}_s{cfg.scale:g}_rb{cfg.r_bwd}_{cfg.injection}"
                f"_{f'C{args.flops:.3g}' if args.flops else f'steps{steps}'}_seed{args.seed}")
    out, results = Path(args.out or f"runs/{run_name}"), Path(args.results) if args.results else None

    # --- the outputs: writable, locked against a second trainer, not already done --------------
    master = int(os.environ.get("RANK", 0)) == 0
    try:  # a path that cannot be written fails now, not after the compute
        out.mkdir(parents=True, exist_ok=True)
        lock = open(out / ".lock", "a")
        if results:
            results.parent.mkdir(parents=True, exist_ok=True)
            open(results, "a").close()
    except OSError as e:
        fail(f"cannot write the outputs: {e}")
    with lock:
        try:  # released when the process ends, however it ends
            if master:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"busy: {out} is being trained by another process")
            return 75
        return train(args, meta, cfg, steps, lrs, dtype, identity, run_id, run_name, out, results)


def train(args, meta, cfg, steps, lrs, dtype, identity, run_id, run_name, out, results):
    if results and any(row.get("run_id") == run_id for row in read_rows(results)):
        print(f"already done: {run_id[:12]} has its row in {results}")
        return 0
    final, ckpt_path = read_json(out / "final.json"), out / "ckpt.pt"
    if final and final.get("run_id") != run_id:
        refuse_other_run(out / "final.json", final, identity)
    donor = read_json(Path(args.reuse_from) / "final.json") if args.reuse_from else None
    if donor and donor.get("run_id") == run_id:
        row = donor | {"out": str(out)}
        if int(os.environ.get("RANK", 0)) == 0:
            if results:
                append_row(results, row)
            atomic_write(out / "final.json", (json.dumps(row, indent=1) + "\n").encode())
        print(f"reused: {args.reuse_from}")
        return 0
    if final and not results:
        print(f"already done: {out} holds this run (final.json)")
        return 0
    if final:  # finished, but its row is gone from --results: rerun it, keeping the old files
        old = out / f"superseded-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
        if int(os.environ.get("RANK", 0)) == 0:
            old.mkdir()
            for name in ("final.json", "ckpt.pt", "log.jsonl", "run.json"):
                if (out / name).exists():
                    os.replace(out / name, old / name)
        print0(f"train.py: {out} finished before but {results} has no row for it: retraining from step 0 "
               f"(old files in {old})")
    elif ckpt_path.exists() and not args.resume:
        fail(f"{ckpt_path} exists: pass --resume to continue it, or delete the folder to start over")

    rank, world, device = setup_distributed(args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()))
    master = rank == 0
    grad_accum = args.batch_tokens // cfg.seq_len // world // args.device_batch
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if dtype == "bfloat16"
                else contextlib.nullcontext())
    eval_rows = identity["eval_rows"]

    # --- model, optimisers, data ---------------------------------------------------------------
    torch.manual_seed(args.seed)
    model = GPT(cfg).to(device)
    backend = model.set_device_backend(device)
    n_tokens = steps * args.batch_tokens
    # Newton-Schulz in bf16 on GPU (tensor cores); on CPU fp32 matmuls are the fast ones.
    ns_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    optimizers = [opt for opt in build_optimizers(model.param_groups(), lrs, compute_dtype=ns_dtype)
                  if opt is not None]
    step, train_row, wall_before, train_loss, tokens_per_s, high_loss_steps = 0, 0, 0.0, None, None, 0
    if args.resume and ckpt_path.exists():
        try:  # weights_only: a shared checkpoint cannot run code on load
            ckpt = torch.load(ckpt_path, map_location=device, weights_only=True)
        except Exception as e:
            fail(f"{ckpt_path} cannot be loaded as a checkpoint of this train.py "
                 f"({type(e).__name__}: {str(e).strip().splitlines()[0][:160]})")
        if ckpt.get("run_id") != run_id:
            refuse_other_run(ckpt_path, ckpt, identity)
        model.load_state_dict(ckpt["model"])
        for opt, state in zip(optimizers, ckpt["optimizers"]):
            opt.load_state_dict(state)
        step, train_row, wall_before = ckpt["step"], ckpt["train_row"], ckpt["wall_s"]
        train_loss, tokens_per_s, high_loss_steps = ckpt["train_loss"], ckpt["tokens_per_s"], ckpt["high_loss_steps"]
        torch.set_rng_state(ckpt["rng_cpu"])
        if device.type == "cuda" and ckpt.get("rng_cuda") is not None:
            torch.cuda.set_rng_state(ckpt["rng_cuda"])
        print0(f"resumed {ckpt_path} at step {step}/{steps}")
    if master:
        atomic_write(out / "run.json", (json.dumps({"run_id": run_id, "identity": identity}, indent=1) + "\n").encode())
    train_loader = RowLoader(args.data, "train", args.device_batch, rank, world, start_row=train_row)
    val_batch = max(1, min(args.device_batch, eval_rows // world))
    val_loader, val_batches = RowLoader(args.data, "val", val_batch, rank, world), max(1, eval_rows // (val_batch * world))
    t_compile = time.time()
    compiled = (compile_model(model, torch.zeros(args.device_batch, cfg.seq_len, dtype=torch.long, device=device),
                              autocast) if args.compile else model)
    compile_s = time.time() - t_compile
    ddp_model = DDP(compiled, device_ids=[device.index] if device.type == "cuda" else None) if world > 1 else compiled

    def checkpoint():
        """Save the run's state, but only finite weights: returns False (and saves nothing) if the
        last optimiser step left a NaN/inf anywhere, so the last checkpoint on disk stays good."""
        if not torch.stack([p.isfinite().all() for p in model.parameters()]).all():
            return False
        if master:
            state = {"model": model.state_dict(), "optimizers": [o.state_dict() for o in optimizers],
                     "step": step, "train_row": train_loader.row, "wall_s": wall_before + time.time() - t_start,
                     "train_loss": train_loss, "tokens_per_s": tokens_per_s, "high_loss_steps": high_loss_steps,
                     "rng_cpu": torch.get_rng_state(),
                     "rng_cuda": torch.cuda.get_rng_state() if device.type == "cuda" else None,
                     "run_id": run_id, "identity": identity}
            atomic_write(ckpt_path, lambda f: torch.save(state, f))
        if world > 1:
            dist.barrier()
        return True

    def diverged(why):
        print0(f"train.py: {why} at step {step}; stopping without a row. The last finite checkpoint "
               f"({ckpt_path if ckpt_path.exists() else 'none yet'}) is kept.", file=sys.stderr)
        return 1

    summary = flops.summary(cfg, args.flops, args.batch_tokens)
    flops_per_token = summary["flops_per_token"]
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print0(f"{run_name}: N {summary['n_params'] / 1e6:.2f}M (once {summary['n_once'] / 1e6:.2f}M, "
           f"rec {summary['n_rec'] / 1e6:.2f}M), {steps} steps x {args.batch_tokens:,} tokens = "
           f"{n_tokens:,} tokens, {flops_per_token * n_tokens:.3e} FLOPs, run_id {run_id[:12]}")
    print0(f"  {world} x {device_name}, {dtype}, attention {backend}, micro-batch {args.device_batch} rows "
           f"x {grad_accum} accumulation, LRs " + ", ".join(f"{k} {v:.3g}" for k, v in lrs.items()))
    if n_tokens > meta["train_tokens"]:
        print0(f"WARNING: this run reads {n_tokens:,} tokens but {args.data} holds {meta['train_tokens']:,} "
               f"training tokens: it repeats data ({n_tokens / meta['train_tokens']:.2f} epochs)", file=sys.stderr)
    diverged_above = math.log(cfg.vocab_size) + DIVERGED_NATS
    patience = max(1, min(DIVERGED_STEPS, steps // 10))

    # --- the training loop ---------------------------------------------------------------------
    t_start = time.time()
    timed_tokens, timed_seconds = 0, 0.0
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
        high_loss_steps = 0 if train_loss <= diverged_above else high_loss_steps + 1
        if not math.isfinite(train_loss) or high_loss_steps >= patience:
            return diverged(f"the loss is {train_loss:.4g} (uniform is {diverged_above - DIVERGED_NATS:.2f}, "
                            f"{high_loss_steps} steps above {diverged_above:.2f})")
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)
        step += 1
        dt = time.time() - t0
        if step > 1 or steps == 1:  # the first step pays for allocator warm-up (and compilation)
            timed_tokens += args.batch_tokens
            timed_seconds += dt
        tokens_per_s = timed_tokens / timed_seconds if timed_seconds else args.batch_tokens / dt
        if args.eval_every and step % args.eval_every == 0 and step < steps:
            val_loss = evaluate(model, val_loader, val_batches, world, device, autocast)
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
        if (stop or (args.save_every and step % args.save_every == 0 and step < steps)) and not checkpoint():
            return diverged("the weights are no longer finite")
        if stop:
            print0(f"train.py: interrupted at step {step}/{steps}; checkpoint saved to {ckpt_path}. "
                   f"Rerun with --resume to continue.")
            return 143

    # --- final evaluation and the results row --------------------------------------------------
    if not checkpoint():
        return diverged("the weights are no longer finite")
    val_loss = evaluate(model, val_loader, val_batches, world, device, autocast)
    extra_eval = {f"val_loss_r{r}": evaluate(model, val_loader, val_batches, world, device, autocast, r=r)
                  for r in args.eval_r}
    wall_s = wall_before + time.time() - t_start
    if master:
        row = dict(summary)
        row.update(tokens=n_tokens, steps=steps, flops_actual=flops_per_token * n_tokens,
                   val_loss=val_loss, train_loss=train_loss, **extra_eval, eval_rows=eval_rows,
                   seed=args.seed, tokens_per_s=tokens_per_s,
                   mfu=flops.mfu(cfg, tokens_per_s, world, device_name) if tokens_per_s else None, wall_s=wall_s,
                   compile_s=compile_s if args.compile else None,
                   lrs=lrs, base_lrs=identity["base_lrs"], lr_rule=identity["lr_rule"],
                   world_size=world, device=device_name, dtype=dtype, attention=backend,
                   run=run_name, out=str(out),
                   data_meta={k: meta.get(k) for k in ("tokenizer_kind", "tokenizer_sha256", "vocab_size", "seq_len",
                                                        "train_rows", "val_rows", "train_tokens", "command")}
                   | {"dir": str(Path(args.data).resolve()), "epochs": train_loader.row / max(1, meta["train_rows"])},
                   run_id=run_id, identity=identity, finished=True)
        print(f"final val loss {val_loss:.4f} nats/token" +
              "".join(f", r={k[10:]}: {v:.4f}" for k, v in extra_eval.items()) + f" | wall {format_eta(wall_s)}")
        try:
            if results:
                append_row(results, row)
        except OSError as e:
            fail(f"could not append the row to {results} ({e}); nothing was written there. {out} and its "
                 f"checkpoint are kept: rerun with --resume to write the row", code=1)
        # final.json only after the row is durable: a run folder with final.json always has its row
        atomic_write(out / "final.json", (json.dumps(row, indent=1) + "\n").encode())
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
