"""
Train one looped transformer of the iso-depth grid; one invocation = one row of the scaling study.

    python train.py --r 4 --scale 2 --data data/micro-2k --flops 1e13 ...   # one process, CPU or GPU
    torchrun --nproc_per_node=8 -- train.py --r 4 --scale 10 --flops 1e18  # DDP; without --, torchrun takes --r

Horizon: --flops C (steps = round(C / (F B)), the sweep's mode), --tokens or --tokens-per-param. Recipe
(paper §4.1, App. E): MuonH for block matrices, AdamW for the rest, LRs transferred across width, batch and
horizon. A run's identity (model, horizon, LRs, seed, eval rows, dtype, data) and run_id (its sha256) go into
--out's run.json, ckpt.pt and final.json, and into the row appended to --results (before final.json).

The file reads top to bottom in the order a run goes:
  1. main         flags -> identity -> already done? -> outputs writable -> the folder's lock
  2. settle       a finished folder: report it (and sample it), reuse a sibling's, or restore its row
  3. setup        devices, model, optimisers, resume from ckpt.pt, data loaders
  4. train_loop   steps, the progress line, divergence, periodic and SIGTERM checkpoints
  5. finish       the final checkpoint, validation, the row (durable), final.json, samples
Exit: 0 trained / "already done:" / "reused:" / "restored:"; 2 bad input or another run's files; 1 diverged (no
row) or a write failed (the last checkpoint is kept); 75 "busy:" (--out locked by a live process); 143
interrupted (--resume continues it).
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
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import flops
from evaluate import load_run_model, sample_texts
from model import GPT, compile_or_eager
from muonh import add_lr_args, build_optimizers, learning_rates, lr_multiplier, lr_settings
from prepare_data import RowLoader, append_row, atomic_write, data_identity, load_json, load_tokenizer, read_meta

# SIGTERM/SIGINT (preemption, Ctrl-C) only set this flag: the step in flight finishes, then every
# rank agrees to stop, a checkpoint is written and the run exits; --resume continues it exactly.
stop_requested = []
RANK = int(os.environ.get("RANK", 0))  # set by torchrun
WORLD = int(os.environ.get("WORLD_SIZE", 1))
# Divergence without NaN: a run starts at the uniform loss ln(V) (lm_head ~ 0 at init) and goes down;
# a spike recovers within a few steps. 2 nats above uniform (confidently wrong) for 50 steps, or 10%
# of a shorter run, is a blown-up run whose row would only distort the fit.
DIVERGED_NATS = 2.0
DIVERGED_STEPS = 50
# A horizon the batch cannot honour: fewer steps than this, or FLOPs (tokens) spent more than this far
# from the budget asked for, would give a row whose flops_budget is not what the run spent.
MIN_STEPS = 2
HORIZON_RTOL = 0.10
# What a checkpoint records about the loop besides weights, optimiser states and RNG.
PROGRESS_KEYS = ("step", "train_row", "wall_s", "train_loss", "tokens_per_s", "high_loss_steps")


def print0(*args, **kwargs):
    """print on rank 0 only (torchrun sets RANK), so a DDP run logs once."""
    if RANK == 0:
        print(*args, **kwargs, flush=True)


def fail(msg, code=2):
    """Bad input (or a failed write, code 1): one clear line on stderr, non-zero exit."""
    print(f"train.py: {msg}", file=sys.stderr)
    sys.exit(code)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.error = lambda message: fail(message)  # one line, not the usage block
    flops.add_model_args(p)
    p.set_defaults(vocab=None, seq_len=None)  # taken from the data's meta.json unless given
    g = p.add_argument_group("horizon (pick one) and batch")
    flops.budget_args(g)  # --flops C (tokens from flops.py) and --batch-tokens B
    g.add_argument("--tokens", type=flops.positive_float, help="training tokens D")
    g.add_argument("--tokens-per-param", type=flops.positive_float, help="D = this x N (non-embedding); default 20")
    g.add_argument("--device-batch", type=flops.count, default=0, help="rows per micro-batch per rank (0: auto, <= 16)")
    add_lr_args(p)
    g = p.add_argument_group("io and system")
    g.add_argument("--data", default="data/fineweb", help="directory written by prepare_data.py")
    g.add_argument("--out", default="", help="run directory (default runs/<run name>)")
    g.add_argument("--results", default="", help="JSONL file the final row is appended to")
    g.add_argument("--resume", action="store_true", help="continue from --out/ckpt.pt if it exists")
    g.add_argument("--reuse-from", default="", help="finished run folder to reuse if its identity is this one")
    g.add_argument("--save-every", type=flops.count, default=500, help="checkpoint every N steps (0: only end/signal)")
    g.add_argument("--log-every", type=flops.positive_int, default=10)
    g.add_argument("--eval-rows", type=flops.positive_int, default=512, help="fixed validation rows (held-out split)")
    g.add_argument("--eval-r", type=flops.positive_int_list, default=[],
                   help="also evaluate at these loop counts, e.g. 2,8 (App. A)")
    g.add_argument("--sample", type=flops.count, default=0,
                   help="print N sampled continuations of --prompt at the end (or of a finished run)")
    g.add_argument("--prompt", default="The capital of France is", help="what --sample continues")
    g.add_argument("--sample-tokens", type=flops.positive_int, default=48, help="tokens per sample")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="auto: bf16 on GPU")
    g.add_argument("--compile", action="store_true", help="torch.compile the model (inductor, GPU or CPU)")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------------------------
# 1. Flags -> the run's identity, before any device or output is touched

def check_horizon(flag, asked, spent, steps, batch_tokens, unit):
    """Refuse a horizon the batch cannot honour (MIN_STEPS, HORIZON_RTOL): one line with the numbers."""
    off = spent / asked - 1
    if steps >= MIN_STEPS and abs(off) <= HORIZON_RTOL:
        return
    fail(f"{flag} {asked:.4g} is {steps} step(s) of {batch_tokens:,} tokens, which would spend {spent:.4g} {unit} "
         f"({100 * off:+.0f}%); a run needs >= {MIN_STEPS} steps within {100 * HORIZON_RTOL:.0f}% of its budget: "
         f"raise {flag} or lower --batch-tokens")


def plan_run(args, meta):
    """Validate every flag against the data and resolve (config, steps). Reads only meta.json; a bad
    layout raises ValueError (main turns it into one line)."""
    for flag, given, have in (("--seq-len", args.seq_len, meta["seq_len"]), ("--vocab", args.vocab, meta["vocab_size"])):
        if given not in (None, have):
            fail(f"{flag} {given} does not match the data ({have}, {args.data}/meta.json)")
    args.seq_len = meta["seq_len"]
    cfg = flops.config_from_args(args, vocab_size=meta["vocab_size"])
    if sum(x is not None for x in (args.flops, args.tokens, args.tokens_per_param)) > 1:
        fail("give only one of --flops, --tokens, --tokens-per-param")
    if args.batch_tokens % cfg.seq_len:
        fail(f"--batch-tokens {args.batch_tokens} is not a multiple of the sequence length {cfg.seq_len}")
    rows_per_step = args.batch_tokens // cfg.seq_len
    if rows_per_step % WORLD:
        fail(f"{rows_per_step} rows per step do not split over {WORLD} ranks")
    rows_per_rank = rows_per_step // WORLD
    if not args.device_batch:
        args.device_batch = max(b for b in range(1, 17) if rows_per_rank % b == 0)
    if rows_per_rank % args.device_batch:
        fail(f"--device-batch {args.device_batch} does not divide the {rows_per_rank} rows per rank per step")
    if args.flops is not None:
        plan = flops.tokens_for_budget(cfg, args.flops, args.batch_tokens)
        check_horizon("--flops", args.flops, plan["flops_actual"], plan["steps"], args.batch_tokens, "FLOPs")
        return cfg, plan["steps"]
    if args.tokens:
        tokens, flag = args.tokens, "--tokens"
    else:
        tokens, flag = (args.tokens_per_param or 20) * flops.param_counts(cfg)["n_params"], "--tokens-per-param"
    steps = max(1, round(tokens / args.batch_tokens))
    check_horizon(flag, tokens, steps * args.batch_tokens, steps, args.batch_tokens, "tokens")
    return cfg, steps


def run_identity(args, meta, cfg, steps):
    """(identity, run_id): everything that makes two runs the same run, and its sha256. Resume, reuse and
    "already done" all compare it. ValueError for bad LR settings."""
    base_lrs, lr_rule = lr_settings(args)
    tokens_ref = args.ref_tokens or flops.reference_horizon(looped=cfg.r > 1)
    lrs = learning_rates(cfg.d_model, args.batch_tokens, steps * args.batch_tokens, tokens_ref, base_lrs, **lr_rule)
    dtype = args.dtype
    if dtype == "auto":
        dtype = "bfloat16" if args.device == "cuda" else "float32"
    eval_rows = min(args.eval_rows, meta["val_rows"])
    if eval_rows < args.eval_rows:
        print0(f"train.py: --eval-rows {args.eval_rows} is more than the {meta['val_rows']} validation rows of "
               f"{args.data}: evaluating all {eval_rows}", file=sys.stderr)
    identity = {
        "model": dataclasses.asdict(cfg),
        "horizon": {"steps": steps, "batch_tokens": args.batch_tokens, "flops_budget": args.flops},
        "lrs": lrs,
        "base_lrs": base_lrs,
        "lr_rule": lr_rule | {"ref_tokens": tokens_ref, "final_lr_frac": args.final_lr_frac},
        "seed": args.seed,
        "eval_rows": eval_rows,
        "data": data_identity(meta),
        "dtype": dtype,
    }
    identity = json.loads(json.dumps(identity))  # through JSON, so it compares equal to what files hold
    run_id = hashlib.sha256(json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return identity, run_id


def refuse_other_run(path, record, ours):
    """Exit 2 naming every identity field ("section.key (theirs -> ours)") where path's run differs."""
    theirs = record.get("identity") or {}
    diff = []
    for key, b in ours.items():
        a = theirs.get(key)
        if isinstance(a, dict):
            pairs = [(f"{key}.{k}", a.get(k), v) for k, v in b.items()]
        else:
            pairs = [(key, a, b)]
        diff += [f"{name} ({str(x)[:16]} -> {str(y)[:16]})" for name, x, y in pairs if x != y]
    listed = ", ".join(diff[:8])
    if len(diff) > 8:
        listed += " ..."
    fail(f"{path} belongs to another run; it differs in {listed}. Use another --out")


def finished_row(results, run_id):
    """The row of run_id in the results file, or None (a torn or foreign line is not this run's row)."""
    if results is None or not results.is_file():
        return None
    needle = f'"run_id": "{run_id}"'  # json.dumps' spelling: only candidate lines are parsed
    for line in results.read_text().splitlines():
        if needle in line:
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def main(argv=None):
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda but no CUDA device is visible")
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    try:  # bad data, layout, LR settings or tokenizer: one line (prepare_data's DataError is a ValueError)
        meta = read_meta(args.data, verify=False)  # keys and sizes; checksums below, for a run not done
        cfg, steps = plan_run(args, meta)
        identity, run_id = run_identity(args, meta, cfg, steps)
        tokenizer = load_tokenizer(args.data) if args.sample else None  # --sample's file, checked before the compute
    except ValueError as e:
        fail(str(e))
    budget = f"C{args.flops:.3g}" if args.flops else f"steps{steps}"
    run_name = f"r{cfg.r}_s{cfg.scale:g}_rb{cfg.r_bwd}_{cfg.injection}_{budget}_seed{args.seed}"
    out = Path(args.out or f"runs/{run_name}")
    results = Path(args.results) if args.results else None
    row = finished_row(results, run_id)
    if row is not None:
        return report_finished(args, row, f"{run_id[:12]} has its row in {results}", tokenizer)
    try:  # the full read for the checksums: only for a run not done yet
        read_meta(args.data)
    except ValueError as e:
        fail(str(e))
    lock = open_outputs(out, results)
    with lock:  # flock: released when the process ends, however it ends
        try:
            if RANK == 0:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"busy: {out} is being trained by another process")
            return 75
        run = SimpleNamespace(args=args, meta=meta, cfg=cfg, steps=steps, identity=identity, run_id=run_id,
                              name=run_name, out=out, results=results, tokenizer=tokenizer)
        return train(run)


def open_outputs(out, results):
    """Create the run folder and the results file now (a path that cannot be written fails before the
    compute, naming it); returns the folder's lock file."""
    try:
        if out.exists() and not out.is_dir():
            raise NotADirectoryError(20, "exists and is not a folder", str(out))
        out.mkdir(parents=True, exist_ok=True)
        lock = open(out / ".lock", "a")
        if results:
            if results.is_dir():
                raise IsADirectoryError(21, "is a folder", str(results))
            results.parent.mkdir(parents=True, exist_ok=True)
            open(results, "a").close()
    except OSError as e:
        fail(f"cannot write the outputs: {e.filename or out}: {e.strerror or e}")
    return lock


# ----------------------------------------------------------------------------------------------
# 2. A folder that already holds this run

def report_finished(args, row, where, tokenizer):
    """A finished run asked for again: what it reached and where it lives; --sample samples its final weights."""
    print(f"already done: {where}: val loss {row['val_loss']:.4f} nats/token after {row['steps']:,} steps "
          f"({row['tokens']:,} tokens); run folder {row['out']}")
    if tokenizer is not None:
        try:
            model = load_run_model(row["out"], args.device)
        except ValueError as e:
            fail(str(e))
        print_samples(model, tokenizer, args, torch.device(args.device), contextlib.nullcontext())
    return 0


def read_final(path):
    """A run folder's final.json (its row), None if there is none; a damaged one is one line naming it."""
    if not path.exists():
        return None
    try:
        row = load_json(path, "final.json")
    except ValueError as e:
        fail(f"{e}: delete it (or the folder) to retrain the run")
    if not isinstance(row, dict) or "run_id" not in row:
        fail(f"{path}: not a run's final row (no run_id); delete it (or the folder) to retrain the run")
    return row


def settle(run):
    """If `run.out` already holds a run: refuse another run's folder, reuse an identical sibling's
    (--reuse-from), restore a finished run's missing row from its final.json, or report it as done.
    Returns the exit code, or None when there is training to do."""
    final_path = run.out / "final.json"
    final = read_final(final_path)
    if final and final.get("run_id") != run.run_id:
        refuse_other_run(final_path, final, run.identity)
    donor = None
    if run.args.reuse_from:
        donor = read_final(Path(run.args.reuse_from) / "final.json")
    if not final and donor and donor.get("run_id") == run.run_id:
        final = donor | {"out": str(run.out)}
        if RANK == 0:
            if run.results:
                append_row(run.results, final)
            atomic_write(final_path, (json.dumps(final, indent=1) + "\n").encode())
        print(f"reused: {run.args.reuse_from}")
        return 0
    if final and run.results:  # finished, but its row is not in --results (main looked): write it back
        if RANK == 0:
            append_row(run.results, final)
        print(f"restored: {run.results} had no row for the finished run in {run.out}; appended the row "
              f"from its final.json (nothing retrained)")
        return 0
    if final:
        return report_finished(run.args, final, f"{run.out} holds this run (final.json)", run.tokenizer)
    if (run.out / "ckpt.pt").exists() and not run.args.resume:
        fail(f"{run.out / 'ckpt.pt'} exists: pass --resume to continue it, or delete the folder to start over")
    return None


def train(run):
    """Train the run in its locked folder, phase by phase. An OSError (a full disk) is one line naming the
    file; the checkpoint written last is whole (atomic) and --resume continues from it."""
    code = settle(run)
    if code is not None:
        return code
    try:
        setup(run)
        code = train_loop(run)
        if code is None:
            code = finish(run)
    except OSError as e:
        fail(f"I/O error on {e.filename or 'a file'} ({e.strerror or e}); the last checkpoint "
             f"{run.out / 'ckpt.pt'} is whole: fix it (e.g. free space) and rerun with --resume", code=1)
    if WORLD > 1:  # leave together: a rank that exits while a peer is still writing can abort in gloo's teardown
        dist.barrier()
        dist.destroy_process_group()
    return code


# ----------------------------------------------------------------------------------------------
# 3. Devices, model, optimisers, resume, data

def setup(run):
    args, cfg = run.args, run.cfg
    run.device = torch.device("cpu")
    if args.device == "cuda":
        run.device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}")
        torch.cuda.set_device(run.device)
    if WORLD > 1:  # torchrun: NCCL on GPU, gloo on CPU
        dist.init_process_group("nccl" if run.device.type == "cuda" else "gloo")
    run.autocast = contextlib.nullcontext()
    if run.identity["dtype"] == "bfloat16":
        run.autocast = torch.autocast(run.device.type, dtype=torch.bfloat16)
    torch.manual_seed(args.seed)
    run.model = GPT(cfg).to(run.device)
    run.backend = run.model.set_device_backend(run.device)
    # Newton-Schulz in bf16 on GPU (tensor cores); on CPU fp32 matmuls are the fast ones.
    ns_dtype = torch.bfloat16 if run.device.type == "cuda" else torch.float32
    optimizers = build_optimizers(run.model.param_groups(), run.identity["lrs"], compute_dtype=ns_dtype)
    run.optimizers = [opt for opt in optimizers if opt is not None]
    run.progress = {"step": 0, "train_row": 0, "wall_s": 0.0, "train_loss": None, "tokens_per_s": None,
                    "high_loss_steps": 0}
    if args.resume and (run.out / "ckpt.pt").exists():
        resume(run)
    if RANK == 0:
        run_json = {"run_id": run.run_id, "identity": run.identity}
        atomic_write(run.out / "run.json", (json.dumps(run_json, indent=1) + "\n").encode())
    run.train_loader = RowLoader(args.data, "train", args.device_batch, RANK, WORLD,
                                 start_row=run.progress["train_row"])
    eval_rows = run.identity["eval_rows"]
    val_batch = max(1, min(args.device_batch, eval_rows // WORLD))
    run.val_loader = RowLoader(args.data, "val", val_batch, RANK, WORLD)
    run.val_batches = max(1, eval_rows // (val_batch * WORLD))
    run.compile_s = None
    run.compiled = run.model
    if args.compile:
        with run.autocast:  # compiled for the dtype it trains in
            run.compiled, run.compile_s = compile_or_eager(run.model, args.device_batch, cfg.seq_len)
    run.ddp_model = run.compiled
    if WORLD > 1:
        run.ddp_model = DDP(run.compiled, device_ids=[run.device.index] if run.device.type == "cuda" else None)


def resume(run):
    """Continue from ckpt.pt (weights, optimiser states, loop progress, RNG) if it is this run's."""
    ckpt_path = run.out / "ckpt.pt"
    try:  # weights_only: a shared checkpoint cannot run code on load
        ckpt = torch.load(ckpt_path, map_location=run.device, weights_only=True)
        if not isinstance(ckpt, dict):
            raise TypeError(f"holds a {type(ckpt).__name__}, not a checkpoint dict")
    except Exception as e:  # torch.load raises many kinds for an empty, truncated or foreign file
        reason = str(e).strip().splitlines()[0][:160] if str(e).strip() else "empty or truncated file"
        fail(f"{ckpt_path} cannot be loaded as a checkpoint of this train.py ({type(e).__name__}: {reason})")
    if ckpt.get("run_id") != run.run_id:
        refuse_other_run(ckpt_path, ckpt, run.identity)
    run.model.load_state_dict(ckpt["model"])
    for opt, state in zip(run.optimizers, ckpt["optimizers"]):
        opt.load_state_dict(state)
    run.progress = {key: ckpt[key] for key in PROGRESS_KEYS}
    torch.set_rng_state(ckpt["rng_cpu"])
    if run.device.type == "cuda" and ckpt.get("rng_cuda") is not None:
        torch.cuda.set_rng_state(ckpt["rng_cuda"])
    print0(f"resumed {ckpt_path} at step {run.progress['step']}/{run.steps}")


def weights_finite(run):
    return bool(torch.stack([p.isfinite().all() for p in run.model.parameters()]).all())


def checkpoint(run, elapsed):
    """Save the run's whole state to ckpt.pt (atomically: a crash or a full disk keeps the previous one).
    Returns False, writing nothing, if a weight is no longer finite. A failed write raises OSError on rank 0,
    after the barrier every rank meets, so the other ranks are not left waiting for it."""
    if not weights_finite(run):
        return False
    error = None
    if RANK == 0:
        progress = run.progress | {"train_row": run.train_loader.row, "wall_s": run.progress["wall_s"] + elapsed}
        state = {"model": run.model.state_dict(), "optimizers": [opt.state_dict() for opt in run.optimizers],
                 **progress, "rng_cpu": torch.get_rng_state(), "run_id": run.run_id, "identity": run.identity,
                 "rng_cuda": torch.cuda.get_rng_state() if run.device.type == "cuda" else None}
        try:
            atomic_write(run.out / "ckpt.pt", lambda f: torch.save(state, f))
        except OSError as e:
            error = e
    if WORLD > 1:
        dist.barrier()
    if error is not None:
        raise error
    return True


def diverged(run, why):
    ckpt_path = run.out / "ckpt.pt"
    kept = ckpt_path if ckpt_path.exists() else "none yet"
    print0(f"train.py: {why} at step {run.progress['step']}; stopping without a row. The last finite checkpoint "
           f"({kept}) is kept.", file=sys.stderr)
    return 1


# ----------------------------------------------------------------------------------------------
# 4. The training loop

def print_header(run):
    args, summary, n_tokens = run.args, run.summary, run.steps * run.args.batch_tokens
    grad_accum = args.batch_tokens // run.cfg.seq_len // WORLD // args.device_batch
    lrs = ", ".join(f"{k} {v:.3g}" for k, v in run.identity["lrs"].items())
    print0(f"{run.name}: N {summary['n_params'] / 1e6:.2f}M (once {summary['n_once'] / 1e6:.2f}M, rec "
           f"{summary['n_rec'] / 1e6:.2f}M), {run.steps} steps x {args.batch_tokens:,} tokens = {n_tokens:,} tokens, "
           f"{summary['flops_per_token'] * n_tokens:.3e} FLOPs, run_id {run.run_id[:12]}\n  {WORLD} x "
           f"{run.device_name}, {run.identity['dtype']}, attention {run.backend}, micro-batch {args.device_batch} rows "
           f"x {grad_accum} accumulation, LRs {lrs}")
    if n_tokens > run.meta["train_tokens"]:
        print0(f"WARNING: this run reads {n_tokens:,} tokens but {args.data} holds {run.meta['train_tokens']:,} "
               f"training tokens: it repeats data ({n_tokens / run.meta['train_tokens']:.2f} epochs)", file=sys.stderr)
    return grad_accum


def train_step(run, step, grad_accum):
    """One optimiser step over grad_accum micro-batches at the scheduled LR; the loss averaged over ranks."""
    lr_mult = lr_multiplier(step, run.steps, run.args.final_lr_frac)
    for opt in run.optimizers:
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * lr_mult
    loss_sum = 0.0
    for micro in range(grad_accum):
        x, y = run.train_loader.next_batch()
        sync = contextlib.nullcontext()
        if WORLD > 1 and micro < grad_accum - 1:
            sync = run.ddp_model.no_sync()  # gradients are all-reduced once per step, on the last micro-batch
        with sync:
            with run.autocast:
                loss = run.ddp_model(x.to(run.device, non_blocking=True), y.to(run.device, non_blocking=True))
            (loss / grad_accum).backward()
        loss_sum += loss.detach()
    return all_reduce_mean((loss_sum / grad_accum).item(), run.device), lr_mult


def train_loop(run):
    """Train to run.steps. Returns None when done, else the exit code (1 diverged, 143 interrupted)."""
    args, progress = run.args, run.progress
    run.summary = flops.summary(run.cfg, args.flops, args.batch_tokens)
    run.device_name = torch.cuda.get_device_name(run.device) if run.device.type == "cuda" else "cpu"
    grad_accum = print_header(run)
    diverged_above = math.log(run.cfg.vocab_size) + DIVERGED_NATS
    patience = max(1, min(DIVERGED_STEPS, run.steps // 10))
    run.t_start, timed_tokens, timed_seconds = time.time(), 0, 0.0
    run.log_file = open(run.out / "log.jsonl", "a", buffering=1) if RANK == 0 else None  # whole lines
    while progress["step"] < run.steps:
        t0 = time.time()
        train_loss, lr_mult = train_step(run, progress["step"], grad_accum)
        progress["train_loss"] = train_loss
        progress["high_loss_steps"] = 0 if train_loss <= diverged_above else progress["high_loss_steps"] + 1
        if not math.isfinite(train_loss) or progress["high_loss_steps"] >= patience:
            return diverged(run, f"the loss is {train_loss:.4g} (uniform {diverged_above - DIVERGED_NATS:.2f}; "
                                 f"{progress['high_loss_steps']} steps above {diverged_above:.2f})")
        for opt in run.optimizers:
            opt.step()
        run.model.zero_grad(set_to_none=True)
        progress["step"] += 1
        dt = time.time() - t0
        if progress["step"] > 1 or run.steps == 1:  # the first step pays for allocator warm-up
            timed_tokens += args.batch_tokens
            timed_seconds += dt
        progress["tokens_per_s"] = timed_tokens / timed_seconds if timed_seconds else args.batch_tokens / dt
        step = progress["step"]
        if RANK == 0 and (step % args.log_every == 0 or step == run.steps or step == 1):
            eta = (run.steps - step) * timed_seconds / max(1, step - 1)
            log_progress(run, lr_mult, eta)
        stop = all_reduce_mean(float(bool(stop_requested)), run.device) > 0  # every rank stops together
        periodic = args.save_every and step % args.save_every == 0 and step < run.steps
        if (stop or periodic) and not checkpoint(run, time.time() - run.t_start):
            return diverged(run, "the weights are no longer finite")
        if stop:
            print0(f"train.py: interrupted at step {step}/{run.steps}; checkpoint saved to {run.out / 'ckpt.pt'}. "
                   f"Rerun with --resume to continue.")
            return 143
    return None


def log_progress(run, lr_mult, eta):
    """One log.jsonl record and one progress line (tokens/s, GFLOP/s, MFU, ETA)."""
    progress, tokens_per_s = run.progress, run.progress["tokens_per_s"]
    mfu = flops.mfu(run.cfg, tokens_per_s, WORLD, run.device_name)
    record = {"step": progress["step"], "steps": run.steps, "loss": progress["train_loss"], "lr_mult": lr_mult,
              "tokens_per_s": tokens_per_s, "mfu": mfu, "train_row": run.train_loader.row,
              "elapsed_s": progress["wall_s"] + time.time() - run.t_start}
    run.log_file.write(json.dumps(record) + "\n")
    mfu_text = f"{100 * mfu:.1f}%" if mfu else "n/a"
    gflops = run.summary["flops_per_token"] * tokens_per_s / 1e9
    print(f"step {progress['step']:>6}/{run.steps} | loss {progress['train_loss']:.4f} | lrm {lr_mult:.3f} | "
          f"{tokens_per_s:,.0f} tok/s | {gflops:,.1f} GFLOP/s | mfu {mfu_text} | eta {eta / 60:.1f}m", flush=True)


def all_reduce_mean(value, device):
    if WORLD == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.item() / WORLD


# ----------------------------------------------------------------------------------------------
# 5. The final checkpoint, validation, the row, final.json, samples

@torch.no_grad()
def validation_loss(run, r=None):
    """Mean loss (nats/token) on the same held-out rows (the val split) every call, averaged over ranks."""
    run.val_loader.row = 0  # (no model.eval(): the model has no dropout or batch norm)
    total = 0.0
    for _ in range(run.val_batches):
        x, y = run.val_loader.next_batch()
        with run.autocast:
            total += run.model(x.to(run.device), y.to(run.device), r=r).item()
    return all_reduce_mean(total / run.val_batches, run.device)


def finish(run):
    """The final checkpoint first (a failed write is reported, the row is still written: the compute is not
    lost), then validation, the row (durable, under a lock) and only then final.json."""
    if not weights_finite(run):
        return diverged(run, "the weights are no longer finite")
    ckpt_error = None
    try:
        checkpoint(run, time.time() - run.t_start)
    except OSError as e:
        ckpt_error = e
    val_loss = validation_loss(run)
    extra_eval = {f"val_loss_r{r}": validation_loss(run, r) for r in run.args.eval_r}
    if RANK == 0:
        row = final_row(run, val_loss, extra_eval)
        extra = "".join(f", r={k[10:]}: {v:.4f}" for k, v in extra_eval.items())
        print(f"final val loss {val_loss:.4f} nats/token{extra} | wall {row['wall_s'] / 60:.1f}m")
        try:  # a full disk leaves the old results file whole and no final.json: a rerun writes the row
            if run.results:
                append_row(run.results, row)
        except OSError as e:
            fail(f"could not append the row to {run.results} ({e.strerror or e}); nothing was written there. "
                 f"{run.out} and its checkpoint are kept: rerun with --resume to write the row", code=1)
        atomic_write(run.out / "final.json", (json.dumps(row, indent=1) + "\n").encode())
        if run.tokenizer is not None:  # a look at what the model learned
            print_samples(run.model, run.tokenizer, run.args, run.device, run.autocast)
        run.log_file.close()
    if ckpt_error is not None:
        print0(f"train.py: the row is written, but the final checkpoint could not be ({ckpt_error.filename}: "
               f"{ckpt_error.strerror}); {run.out / 'ckpt.pt'} holds an earlier step, so evaluate.py refuses "
               f"this run until it is retrained", file=sys.stderr)
        return 1
    return 0


def final_row(run, val_loss, extra_eval):
    """The results row: every ModelConfig field and count (flops.summary), the horizon, losses, LRs,
    throughput, the data, and the run's identity; everything fit_laws.py needs."""
    args, meta, progress = run.args, run.meta, run.progress
    n_tokens = run.steps * args.batch_tokens
    tokens_per_s = progress["tokens_per_s"]
    mfu = flops.mfu(run.cfg, tokens_per_s, WORLD, run.device_name) if tokens_per_s else None
    data_keys = ("tokenizer_kind", "tokenizer_sha256", "vocab_size", "seq_len", "train_rows", "val_rows",
                 "train_tokens", "command")
    data_meta = {k: meta.get(k) for k in data_keys}
    data_meta["dir"] = str(Path(args.data).resolve())
    data_meta["epochs"] = run.train_loader.row / max(1, meta["train_rows"])
    return run.summary | dict(
        tokens=n_tokens, steps=run.steps, flops_actual=run.summary["flops_per_token"] * n_tokens,
        val_loss=val_loss, train_loss=progress["train_loss"], **extra_eval, eval_rows=run.identity["eval_rows"],
        seed=args.seed, tokens_per_s=tokens_per_s, mfu=mfu, wall_s=progress["wall_s"] + time.time() - run.t_start,
        compile_s=run.compile_s, lrs=run.identity["lrs"], base_lrs=run.identity["base_lrs"],
        lr_rule=run.identity["lr_rule"], world_size=WORLD, device=run.device_name, dtype=run.identity["dtype"],
        attention=run.backend, run=run.name, out=str(run.out), data_meta=data_meta, run_id=run.run_id,
        identity=run.identity, finished=True)


def print_samples(model, tokenizer, args, device, autocast):
    """--sample continuations of --prompt (temperature 0.8, top-k 50), seeded by --seed: a rerun prints the same."""
    with autocast:
        texts = sample_texts(model, tokenizer, [args.prompt] * args.sample, args.sample_tokens, 0.8, 50, args.seed,
                             device)
    for text in texts:
        print(f"--- {text!r}")


if __name__ == "__main__":
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop_requested.append(signum))
    sys.exit(main())
