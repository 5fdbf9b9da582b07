"""
Train one looped transformer; one invocation = one row of a scaling study (iso-depth, or Truncate or Not?).

    python train.py --r 4 --scale 2 --data data/micro-2k --flops 1e13 ...   # one process, CPU or GPU
    torchrun --nproc_per_node=8 -- train.py --r 4 --scale 10 --flops 1e18  # DDP; without --, torchrun takes --r

Horizon: --flops C (steps = round(C / (F B)), the sweep's mode), --tokens or --tokens-per-param; on CPU one is
required (the GPU default, 20 tokens per parameter in 262,144-token steps, is hours there). Recipe (--recipe,
nanoloop/recipe.py): MuonH for block matrices, AdamW for the rest, LRs transferred across width, batch and horizon.
The run's identity and run_id (nanoloop/runs.py) go into --out's run.json, ckpt.pt and final.json and into the row
appended to --results (before final.json). Top to bottom: main (flags, identity, what the folder holds, the lock),
setup (devices, model, optimisers, resume, data), train_loop, finish (checkpoint, validation, the row). Exit: 0
trained / "already done:" / "reused:" / "restored:"; 2 bad input or another run's files; 1 diverged (no row) or a
write failed (the last checkpoint is kept); 75 "busy:" (--out locked by a live process); 143 stopped by
SIGINT/SIGTERM, the last finished step checkpointed (--resume continues it exactly); 130 a second Ctrl-C while
stopping (at once; ckpt.pt stays the last one written whole).
"""
import contextlib
import fcntl
import json
import math
import os
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import flops
from model import GPT
from muonh import build_optimizers
from nanoloop import common, tracking
from nanoloop.averaging import weight_average
from nanoloop.common import DataError, append_row, atomic_write
from nanoloop.dataloader import load_tokenizer, read_meta
from nanoloop.engine import print_samples
from nanoloop.loops import backward_loops, draw, step_text
from nanoloop.recipe import DEFAULT_TOKENS_PER_PARAM, lr_multiplier
from nanoloop.runs import (Run, compile_or_eager, cpu_threads, eager_blocks, finished_row, load_run_model, open_loaders,
                           open_outputs, plan_run, restore_checkpoint, results_row, run_identity, run_summary,
                           save_checkpoint, settle, train_parser)

# SIGTERM/SIGINT (preemption, timeout, Ctrl-C) set this event (stop_requested). One process stops at its next
# micro-batch, dropping a step that gradient accumulation can make minutes long. Under torchrun the ranks agree
# once a step (an all_reduce), so the step in flight finishes: a check per micro-batch would be a collective and
# a GPU sync each. The last finished step is checkpointed, the run exits 143, and --resume continues it exactly.
STOP = threading.Event()
LOOP = {"step": 0, "steps": 0}  # the last finished step, which the stop message names (train_loop keeps it)
RANK = int(os.environ.get("RANK", 0))  # set by torchrun
WORLD = int(os.environ.get("WORLD_SIZE", 1))
# Divergence without NaN: a run starts at the uniform loss ln(V) (lm_head ~ 0 at init) and goes down;
# a spike recovers within a few steps. 2 nats above uniform (confidently wrong) for 50 steps, or 10%
# of a shorter run, is a blown-up run whose row would only distort the fit.
DIVERGED_NATS = 2.0
DIVERGED_STEPS = 50


def print0(*args, **kwargs):
    """print on rank 0 only (torchrun sets RANK), so a DDP run logs once."""
    if RANK == 0:
        print(*args, **kwargs, flush=True)


def fail(msg, code=2):
    """Bad input (exit 2) or a failed write (1): one line on stderr, the project's convention (common.fail)."""
    common.fail("train.py", msg, code)


def parse_args(argv=None):
    """train.py's flags (runs.train_parser: sweep_state.py parses planned runs with the same parser)."""
    parser = train_parser(__doc__)
    common.one_line_errors(parser, "train.py")
    return parser.parse_args(argv)


# ----------------------------------------------------------------------------------------------
# 1. Flags -> the run's identity -> what its folder holds, before any device or output is touched

def main(argv=None):
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda but no CUDA device is visible")
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    try:  # bad data, layout, horizon, LR settings or tokenizer: one line
        meta = read_meta(args.data, verify=False)  # keys and sizes; checksums below, for a run not done
        plan = plan_run(args, meta, WORLD)
        identity, run_id = run_identity(args, meta, plan)
        tokenizer = load_tokenizer(args.data) if args.sample else None  # --sample's file, checked before the compute
    except ValueError as e:
        fail(str(e))
    if args.device == "cpu" and args.flops is None and args.tokens is None and args.tokens_per_param is None:
        steps, batch_tokens = plan.horizon.steps, plan.horizon.batch_tokens  # the default is made for GPUs
        fail(f"no horizon: on CPU give --tokens, --flops or --tokens-per-param (the quick start's: --tokens 4e5 "
             f"--batch-tokens 2048). The default, {DEFAULT_TOKENS_PER_PARAM} tokens per parameter, would be {steps} "
             f"steps of {batch_tokens // plan.cfg.seq_len // WORLD // plan.device_batch} micro-batches, "
             f"{steps * batch_tokens:,} tokens")
    if identity["eval_rows"] < args.eval_rows:
        print0(f"train.py: --eval-rows {args.eval_rows} is more than the {meta['val_rows']} validation rows of "
               f"{args.data}: evaluating all {identity['eval_rows']}", file=sys.stderr)
    cfg = plan.cfg
    budget = f"C{args.flops:.3g}" if args.flops else f"steps{plan.horizon.steps}"
    run_name = f"r{cfg.r}_s{cfg.scale:g}_rb{cfg.r_bwd}_{cfg.injection}_{budget}_seed{args.seed}"
    out = Path(args.out or f"runs/{run_name}")
    results = Path(args.results) if args.results else None
    row = finished_row(results, run_id)
    if row is not None:
        return report_finished(args, row, f"{run_id[:12]} has its row in {results}", tokenizer)
    try:  # the full read for the checksums (only for a run not done yet), then the folder and its lock file
        read_meta(args.data)
        lock = open_outputs(out, results)
    except ValueError as e:
        fail(str(e))
    with lock:  # flock: released when the process ends, however it ends
        try:
            if RANK == 0:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"busy: {out} is being trained by another process")
            return 75
        run = Run(args, meta, cfg, plan.recipe, plan.horizon, plan.loops, plan.device_batch, identity, run_id,
                  run_name, out, results, tokenizer)
        return train(run)


def report_finished(args, row, where, tokenizer):
    """A finished run asked for again: what it reached and where it lives; --sample samples its final weights."""
    print(f"already done: {where}: val loss {row['val_loss']:.4f} nats/token after {row['steps']:,} steps "
          f"({row['tokens']:,} tokens); run folder {row['out']}")
    if tokenizer is not None:
        try:
            model = load_run_model(row["out"], args.device)
        except ValueError as e:
            fail(str(e))
        print_samples(model, tokenizer, args.prompt, args.sample, args.sample_tokens, args.seed)
    return 0


def train(run):
    """Settle what the locked folder holds (runs.settle), then train it phase by phase. An OSError (a full
    disk) is one line naming the file; the checkpoint written last is whole and --resume continues it."""
    args = run.args
    try:
        outcome, row = settle(run.out, run.run_id, run.identity, run.results, args.reuse_from, args.resume, RANK)
    except ValueError as e:
        fail(str(e))
    if outcome == "reused":
        print(f"reused: {row['reused_from']}")
        return 0
    if outcome == "restored":
        print(f"restored: {run.results} had no row for the finished run in {run.out}; appended the row from its "
              f"final.json (nothing retrained)")
        return 0
    if outcome == "done":
        return report_finished(args, row, f"{run.out} holds this run (final.json)", run.tokenizer)
    try:
        setup(run)
        code = train_loop(run)
        if code is None:
            code = finish(run)
    except DataError as e:  # bad input met only here, e.g. a wandb run wandb could not start (before any step)
        fail(str(e))
    except OSError as e:
        fail(f"I/O error on {e.filename or 'a file'} ({e.strerror or e}); the last checkpoint "
             f"{run.out / 'ckpt.pt'} is whole: fix it (e.g. free space) and rerun with --resume", code=1)
    if WORLD > 1:  # leave together: a rank that exits while a peer is still writing can abort in gloo's teardown
        dist.barrier()
        dist.destroy_process_group()
    return code


# ----------------------------------------------------------------------------------------------
# 2. Devices, model, optimisers, resume, data

def setup(run):
    """Fill in setup()'s fields of `run`: devices, the model and its optimisers, the checkpoint if resuming, the
    data loaders, and the compiled / DDP-wrapped model the loop calls."""
    args, cfg = run.args, run.cfg
    run.device = torch.device("cpu")
    if args.device == "cpu":
        common.keep_freed_memory()  # a CPU step frees and reallocates its activations every step
        torch.set_num_threads(cpu_threads(args.threads))
    if args.device == "cuda":
        run.device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}")
        torch.cuda.set_device(run.device)
    if WORLD > 1:  # torchrun: NCCL on GPU, gloo on CPU
        dist.init_process_group("nccl" if run.device.type == "cuda" else "gloo")
    run.autocast = contextlib.nullcontext()
    if run.identity["dtype"] == "bfloat16":
        run.autocast = torch.autocast(run.device.type, dtype=torch.bfloat16)
    torch.manual_seed(args.seed)
    run.model = GPT(cfg, seed=args.seed, draws=args.init_draws).to(run.device)
    run.backend = run.model.set_device_backend(run.device)
    # Newton-Schulz in bf16 on GPU (tensor cores); on CPU fp32 matmuls are the fast ones.
    ns_dtype = torch.bfloat16 if run.device.type == "cuda" else torch.float32
    optimizers = build_optimizers(run.model.param_groups(), run.identity["lrs"], compute_dtype=ns_dtype)
    run.average = weight_average(run.model.param_groups(), run.horizon.steps, run.recipe.average_frac)
    run.optimizers = [opt for opt in [*optimizers, run.average] if opt is not None]  # the mean steps last
    run.progress = {"step": 0, "train_row": 0, "wall_s": 0.0, "train_loss": None, "tokens_per_s": None,
                    "high_loss_steps": 0}
    if args.resume and (run.out / "ckpt.pt").exists():
        resume(run)
    if RANK == 0:
        run_json = {"run_id": run.run_id, "identity": run.identity}
        atomic_write(run.out / "run.json", (json.dumps(run_json, indent=1) + "\n").encode())
    open_loaders(run, RANK, WORLD)
    compiled = run.model
    if args.compile:
        with run.autocast:  # compiled for the dtype it trains in
            compiled, run.compile_s = compile_or_eager(run.model, run.device_batch, cfg.seq_len, run.loops)
    run.ddp_model = compiled
    if WORLD > 1:
        run.ddp_model = DDP(compiled, device_ids=[run.device.index] if run.device.type == "cuda" else None)


def resume(run):
    """Continue from ckpt.pt (weights, optimiser states, loop progress, RNG) if it is this run's."""
    ckpt_path = run.out / "ckpt.pt"
    try:
        run.progress = restore_checkpoint(ckpt_path, run.device, run.run_id, run.identity, run.model, run.optimizers)
    except ValueError as e:
        fail(str(e))
    print0(f"resumed {ckpt_path} at step {run.progress['step']}/{run.horizon.steps}")


def checkpoint(run, elapsed):
    """ckpt.pt of the run's whole state (runs.save_checkpoint; atomic). Returns False, writing nothing, if a
    weight is no longer finite. A failed write raises OSError on rank 0 after the barrier every rank meets,
    so the other ranks are not left waiting for it."""
    if not torch.stack([p.isfinite().all() for p in run.model.parameters()]).all():
        return False
    error = None
    if RANK == 0:
        progress = run.progress | {"train_row": run.train_loader.row, "wall_s": run.progress["wall_s"] + elapsed}
        try:
            save_checkpoint(run.out / "ckpt.pt", run.model, run.optimizers, progress, run.run_id, run.identity)
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
# 3. The training loop

def print_header(run):
    """What the run will do, before it does it: steps, micro-batches a step, tokens, FLOPs, the machine, the LRs."""
    args, summary, batch_tokens = run.args, run.summary, run.horizon.batch_tokens
    n_tokens = run.horizon.steps * batch_tokens
    grad_accum = batch_tokens // run.cfg.seq_len // WORLD // run.device_batch
    lrs = ", ".join(f"{k} {v:.3g}" for k, v in run.identity["lrs"].items())
    print0(f"{run.name}: N {summary['n_params'] / 1e6:.2f}M (once {summary['n_once'] / 1e6:.2f}M, rec "
           f"{summary['n_rec'] / 1e6:.2f}M), {run.horizon.steps} steps x {batch_tokens:,} tokens = {n_tokens:,} tokens, "
           f"{summary['flops_per_token'] * n_tokens:.3e} FLOPs, run_id {run.run_id[:12]}\n  {WORLD} x "
           f"{run.device_name} (threads: {torch.get_num_threads()}), {run.identity['dtype']}, attention {run.backend}, "
           f"{grad_accum} x {run.device_batch}-row micro-batches a step, LRs {lrs}; ETA after step "
           f"{run.progress['step'] + 1}")
    if n_tokens > run.meta["train_tokens"]:
        print0(f"WARNING: this run reads {n_tokens:,} tokens but {args.data} holds {run.meta['train_tokens']:,} "
               f"training tokens: it repeats data ({n_tokens / run.meta['train_tokens']:.2f} epochs)", file=sys.stderr)
    return grad_accum


def train_step(run, step, grad_accum):
    """One optimiser step over grad_accum micro-batches at the scheduled LR; the loss averaged over ranks. On one
    process a stop between two micro-batches drops the step: (None, lr_mult)."""
    lr_mult = lr_multiplier(step, run.horizon.steps, run.args.final_lr_frac, run.recipe.warmup_frac, run.recipe.decay)
    r = draw(run.loops, run.args.seed, step, run.cfg.r)  # --loops: this step's T, the same on every rank
    for opt in run.optimizers:
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * lr_mult
    loss_sum = 0.0
    start_row, cpu_rng = run.train_loader.row, torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state() if run.device.type == "cuda" else None
    for micro in range(grad_accum):
        if micro > 0 and WORLD == 1 and STOP.is_set():  # drop the step: its rows and RNG draws (--random-state-init's
            run.train_loader.row = start_row  # noise) undone, so that the checkpoint is the last finished step's
            torch.set_rng_state(cpu_rng)  # and --resume redoes this one exactly (gradients are never saved)
            if cuda_rng is not None:
                torch.cuda.set_rng_state(cuda_rng)
            return None, lr_mult
        x, y = run.train_loader.next_batch()
        sync = contextlib.nullcontext()
        if WORLD > 1 and micro < grad_accum - 1:
            sync = run.ddp_model.no_sync()  # gradients are all-reduced once per step, on the last micro-batch
        with sync:
            with run.autocast:
                loss = run.ddp_model(x.to(run.device, non_blocking=True), y.to(run.device, non_blocking=True), r=r,
                                     r_bwd=backward_loops(run.loops, run.cfg, r))
            (loss / grad_accum).backward()
        loss_sum += loss.detach()
    return all_reduce_mean((loss_sum / grad_accum).item(), run.device), lr_mult


def train_loop(run):
    """Train to run.horizon.steps. Returns None when done, else the exit code (1 diverged, 143 interrupted)."""
    args, progress = run.args, run.progress
    run.summary = run_summary(run)  # F: the expectation over sampled loop counts
    run.device_name = torch.cuda.get_device_name(run.device) if run.device.type == "cuda" else "cpu"
    grad_accum = print_header(run)
    diverged_above = math.log(run.cfg.vocab_size) + DIVERGED_NATS
    patience = max(1, min(DIVERGED_STEPS, run.horizon.steps // 10))
    run.t_start, timed_tokens, timed_seconds = time.time(), 0, 0.0
    first_step = progress["step"] + 1  # this process's first step (after a resume too) pays for allocator warm-up
    LOOP.update(step=progress["step"], steps=run.horizon.steps)
    if RANK == 0:  # log.jsonl, and the wandb run with --wandb
        run.log_file = tracking.RunLog(run.out, args.wandb, args.wandb_group, run.run_id, run.name, run.identity)
    while progress["step"] < run.horizon.steps:
        t0 = time.time()
        train_loss, lr_mult = train_step(run, progress["step"], grad_accum)
        if train_loss is None:  # a stop dropped the step
            return interrupted(run)
        progress["train_loss"] = train_loss
        progress["high_loss_steps"] = 0 if train_loss <= diverged_above else progress["high_loss_steps"] + 1
        if not math.isfinite(train_loss) or progress["high_loss_steps"] >= patience:
            return diverged(run, f"the loss is {train_loss:.4g} (uniform {diverged_above - DIVERGED_NATS:.2f}; "
                                 f"{progress['high_loss_steps']} steps above {diverged_above:.2f})")
        for opt in run.optimizers:
            opt.step()
        run.model.zero_grad(set_to_none=True)
        progress["step"] += 1
        LOOP["step"] = progress["step"]
        step, dt = progress["step"], time.time() - t0
        if step > first_step:
            timed_tokens += run.horizon.batch_tokens
            timed_seconds += dt
        progress["tokens_per_s"] = timed_tokens / timed_seconds if timed_seconds else run.horizon.batch_tokens / dt
        if RANK == 0 and (step % args.log_every == 0 or step == run.horizon.steps or step == first_step):
            log_progress(run, lr_mult)
        if all_reduce_mean(float(STOP.is_set()), run.device) > 0:  # every rank stops together
            return interrupted(run)
        periodic = args.save_every and step % args.save_every == 0 and step < run.horizon.steps
        if periodic and not checkpoint(run, time.time() - run.t_start):
            return diverged(run, "the weights are no longer finite")
    return None


def interrupted(run):
    """A stop: checkpoint the last finished step and say how to continue; exit 143 (1 if a weight is not finite)."""
    if not checkpoint(run, time.time() - run.t_start):
        return diverged(run, "the weights are no longer finite")
    print0(f"train.py: interrupted at step {run.progress['step']}/{run.horizon.steps}; checkpoint saved to "
           f"{run.out / 'ckpt.pt'}. Rerun with --resume to continue.")
    return 143


def stop_requested(signal_name):
    """The first SIGINT or SIGTERM (common.on_stop_signals): set STOP, and say at once what happens next."""
    STOP.set()
    at = f"at step {LOOP['step'] + 1}/{LOOP['steps']}" if LOOP["steps"] else "before the first step"
    if RANK == 0:  # os.write, not print: a signal handler may run in the middle of a print
        os.write(1, f"train.py: stopping {at} ({signal_name}): a step not finished is dropped, the last finished "
                    f"one checkpointed; Ctrl-C again exits now, without a checkpoint\n".encode())


def log_progress(run, lr_mult):
    """One log.jsonl record and one progress line (tokens/s, GFLOP/s, MFU, ETA)."""
    progress, tokens_per_s = run.progress, run.progress["tokens_per_s"]
    eta = (run.horizon.steps - progress["step"]) * run.horizon.batch_tokens / tokens_per_s
    mfu = flops.mfu(run.cfg, tokens_per_s, WORLD, run.device_name, run.summary["flops_per_token"])
    loops_text = step_text(run.loops, run.cfg, run.args.seed, progress["step"] - 1)  # --loops: the last step's T
    record = {"step": progress["step"], "steps": run.horizon.steps, "loss": progress["train_loss"], "lr_mult": lr_mult,
              "tokens_per_s": tokens_per_s, "mfu": mfu, "train_row": run.train_loader.row,
              "elapsed_s": progress["wall_s"] + time.time() - run.t_start}
    run.log_file.write(record)
    mfu_text = f"{100 * mfu:.1f}%" if mfu else "n/a"
    eta_text = f"{eta:.0f}s" if eta < 90 else f"{eta / 60:.1f}m"
    gflops = run.summary["flops_per_token"] * tokens_per_s / 1e9
    print0(f"step {progress['step']:>6}/{run.horizon.steps} | loss {progress['train_loss']:.4f} | lrm {lr_mult:.3f} | "
           f"{tokens_per_s:,.0f} tok/s | {gflops:,.1f} GFLOP/s | mfu {mfu_text} | eta {eta_text}" + loops_text)


def all_reduce_mean(value, device):
    if WORLD == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.item() / WORLD


# ----------------------------------------------------------------------------------------------
# 4. The final checkpoint, validation, the row, final.json, samples

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
    ckpt_error = None
    eager_blocks(run.model)  # validation and samples in eager blocks, as evaluate.py scores (CPU --compile)
    if run.average is not None:  # --average-last: the mean weights are the run's, validated and kept
        run.average.copy_to_model()
    try:
        if not checkpoint(run, time.time() - run.t_start):
            return diverged(run, "the weights are no longer finite")
    except OSError as e:
        ckpt_error = e
    val_loss = validation_loss(run)
    extra_eval = {f"val_loss_r{r}": validation_loss(run, r) for r in run.args.eval_r}
    if RANK == 0:
        row = results_row(run, val_loss, extra_eval, WORLD)
        extra = "".join(f", r={r}: {extra_eval[f'val_loss_r{r}']:.4f}" for r in run.args.eval_r)
        print(f"final val loss {val_loss:.4f} nats/token{extra} | wall {row['wall_s'] / 60:.1f}m")
        try:  # a full disk leaves the old results file whole and no final.json: a rerun writes the row
            if run.results:
                append_row(run.results, row)
        except OSError as e:
            fail(f"could not append the row to {run.results} ({e.strerror or e}); nothing was written there. "
                 f"{run.out} and its checkpoint are kept: rerun with --resume to write the row", code=1)
        atomic_write(run.out / "final.json", (json.dumps(row, indent=1) + "\n").encode())
        if run.tokenizer is not None:  # a look at what the model learned
            with run.autocast:
                print_samples(run.model, run.tokenizer, run.args.prompt, run.args.sample, run.args.sample_tokens,
                              run.args.seed)
        run.log_file.close(row)
    if ckpt_error is not None:
        print0(f"train.py: the row is written, but the final checkpoint could not be ({ckpt_error.filename}: "
               f"{ckpt_error.strerror}); {run.out / 'ckpt.pt'} holds an earlier step, so evaluate.py refuses "
               f"this run until it is retrained", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    common.on_stop_signals("train.py", stop_requested)
    sys.exit(main())
