"""
Train one looped transformer of the iso-depth grid; one invocation = one row of the scaling study.

    python train.py --r 4 --scale 2 --data data/micro --flops 1e13 ...      # one process, CPU or GPU
    torchrun --nproc_per_node=8 -- train.py --r 4 --scale 10 --flops 1e18  # DDP; without --, torchrun takes --r

Horizon: --flops C (steps = round(C / (F B)), the sweep's mode), --tokens or --tokens-per-param. Recipe
(RECIPE §4): MuonH for block matrices, AdamW for the rest, LRs transferred across width, batch and horizon.
A run's identity (model, horizon, LRs, seed, eval rows, dtype, data) and run_id (its sha256) go into --out's
run.json, ckpt.pt (finite weights only) and final.json, and into the row appended to --results (durably,
before final.json). Exit: 0 trained / "already done:" / "reused:"; 2 bad input or another run's files;
1 diverged (no row); 75 "busy:" (--out locked by a live process); 143 interrupted (--resume continues it).
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
from model import GPT, compile_or_eager
from muonh import add_lr_args, build_optimizers, learning_rates, lr_multiplier, lr_settings
from prepare_data import RowLoader, atomic_write, data_identity, load_tokenizer, read_meta

# SIGTERM/SIGINT (preemption, Ctrl-C) only set this flag: the step in flight finishes, then every
# rank agrees to stop, a checkpoint is written and the run exits; --resume continues it exactly.
stop_requested = []
RANK, WORLD = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))  # set by torchrun
# Divergence without NaN: a run starts at the uniform loss ln(V) (lm_head ~ 0 at init) and goes down;
# a spike recovers within a few steps. 2 nats above uniform (confidently wrong) for 50 steps, or 10%
# of a shorter run, is a blown-up run whose row would only distort the fit.
DIVERGED_NATS, DIVERGED_STEPS = 2.0, 50


def print0(*args, **kwargs):
    """print on rank 0 only (torchrun sets RANK), so a DDP run logs once."""
    if RANK == 0:
        print(*args, **kwargs, flush=True)


def fail(msg, code=2):
    """Bad input: one clear line on stderr, non-zero exit, before any expensive work."""
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
    g.add_argument("--sample", type=flops.count, default=0, help="print N sampled continuations at the end")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="auto: bf16 on GPU")
    g.add_argument("--compile", action="store_true", help="torch.compile the model (inductor, GPU or CPU)")
    return p.parse_args(argv)


def plan_run(args, meta):
    """Validate every flag against the data and resolve (config, steps). Reads only meta.json; a bad
    layout raises ValueError (main turns it into one line)."""
    for flag, given, have in (("--seq-len", args.seq_len, meta["seq_len"]),
                              ("--vocab", args.vocab, meta["vocab_size"])):
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
    args.device_batch = args.device_batch or max(b for b in range(1, 17) if rows_per_rank % b == 0)
    if rows_per_rank % args.device_batch:
        fail(f"--device-batch {args.device_batch} does not divide the {rows_per_rank} rows per rank per step")
    if args.flops is not None:
        return cfg, flops.tokens_for_budget(cfg, args.flops, args.batch_tokens)["steps"]
    tokens = args.tokens or (args.tokens_per_param or 20) * flops.param_counts(cfg)["n_params"]
    return cfg, max(1, round(tokens / args.batch_tokens))


def refuse_other_run(path, record, ours):
    """Exit 2 naming every identity field ("section.key (theirs -> ours)") where path's run differs."""
    theirs, diff = record.get("identity") or {}, []
    for key, b in ours.items():
        a = theirs.get(key)
        pairs = [(f"{key}.{k}", a.get(k), v) for k, v in b.items()] if isinstance(a, dict) else [(key, a, b)]
        diff += [f"{name} ({str(x)[:16]} -> {str(y)[:16]})" for name, x, y in pairs if x != y]
    fail(f"{path} belongs to another run; it differs in {', '.join(diff[:8])}{' ...' * (len(diff) > 8)}. "
         f"Use another --out")


def append_row(path, row):
    """Append a row by rewriting the file with atomic_write under a lock on its folder: a reader, a crash or a
    full disk sees the old file or the new one, never half a row; concurrent runs never lose a row."""
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        old = path.read_bytes() if path.exists() else b""
        atomic_write(path, old + b"\n" * (old[-1:] not in (b"", b"\n")) + (json.dumps(row) + "\n").encode())
    finally:
        os.close(fd)


def all_reduce_mean(value, world, device):
    if world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.item() / world


@torch.no_grad()
def evaluate(model, loader, n_batches, world, device, autocast, r=None):
    """Mean validation loss (nats/token) on the same held-out rows every call, averaged over ranks."""
    loader.row, total = 0, 0.0  # (no model.eval(): the model has no dropout or batch norm)
    for _ in range(n_batches):
        x, y = loader.next_batch()
        with autocast:
            total += model(x.to(device), y.to(device), r=r).item()
    return all_reduce_mean(total / n_batches, world, device)


def main(argv=None):
    args = parse_args(argv)
    # --- validate everything and fix the run's identity before touching devices or outputs -------
    if args.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda but no CUDA device is visible")
    args.device = "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    try:  # bad data, layout or LR settings: one line (read_meta's DataError is a ValueError)
        meta = read_meta(args.data, verify=False)  # keys and sizes; checksums below, for a run not done
        cfg, steps = plan_run(args, meta)
        base_lrs, lr_rule = lr_settings(args)
        tokens_ref = args.ref_tokens or flops.reference_horizon(looped=cfg.r > 1)
        lrs = learning_rates(cfg.d_model, args.batch_tokens, steps * args.batch_tokens, tokens_ref, base_lrs, **lr_rule)
    except ValueError as e:
        fail(str(e))
    identity = json.loads(json.dumps({  # through JSON, so it compares equal to what files hold
        "model": dataclasses.asdict(cfg), "horizon": {"steps": steps, "batch_tokens": args.batch_tokens,
                                                      "flops_budget": args.flops},
        "lrs": lrs, "base_lrs": base_lrs,
        "lr_rule": lr_rule | {"ref_tokens": tokens_ref, "final_lr_frac": args.final_lr_frac},
        "seed": args.seed, "eval_rows": min(args.eval_rows, meta["val_rows"]), "data": data_identity(meta),
        "dtype": args.dtype if args.dtype != "auto" else ("bfloat16" if args.device == "cuda" else "float32")}))
    run_id = hashlib.sha256(json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    run_name = (f"r{cfg.r}_s{cfg.scale:g}_rb{cfg.r_bwd}_{cfg.injection}"
                f"_{f'C{args.flops:.3g}' if args.flops else f'steps{steps}'}_seed{args.seed}")
    out, results = Path(args.out or f"runs/{run_name}"), Path(args.results) if args.results else None
    if results and results.exists() and f'"run_id": "{run_id}"' in results.read_text():  # json.dumps' spelling
        print(f"already done: {run_id[:12]} has its row in {results}")
        return 0
    try:  # the full read for the checksums: only for a run not done yet
        read_meta(args.data)
    except ValueError as e:
        fail(str(e))
    try:  # a path that cannot be written fails now, not after the compute
        out.mkdir(parents=True, exist_ok=True)
        lock = open(out / ".lock", "a")
        if results:
            results.parent.mkdir(parents=True, exist_ok=True)
            open(results, "a").close()
    except OSError as e:
        fail(f"cannot write the outputs: {e}")
    with lock:  # flock: released when the process ends, however it ends
        try:
            if RANK == 0:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"busy: {out} is being trained by another process")
            return 75
        return train(args, meta, cfg, steps, lrs, identity, run_id, run_name, out, results)


def train(args, meta, cfg, steps, lrs, identity, run_id, run_name, out, results):
    """Train the run in the locked folder `out`: skip, reuse, rerun or resume it as its files say."""
    master, rank, world, ckpt_path = RANK == 0, RANK, WORLD, out / "ckpt.pt"
    final = json.loads((out / "final.json").read_text()) if (out / "final.json").exists() else None
    if final and final.get("run_id") != run_id:
        refuse_other_run(out / "final.json", final, identity)
    donor_path = Path(args.reuse_from) / "final.json" if args.reuse_from else None
    donor = json.loads(donor_path.read_text()) if donor_path and donor_path.exists() else None
    if donor and donor.get("run_id") == run_id:
        if master and results:
            append_row(results, donor | {"out": str(out)})
        if master:
            atomic_write(out / "final.json", (json.dumps(donor | {"out": str(out)}, indent=1) + "\n").encode())
        print(f"reused: {args.reuse_from}")
        return 0
    if final and not results:
        print(f"already done: {out} holds this run (final.json)")
        return 0
    if final:  # finished, but its row is gone from --results: rerun it, keeping the old files
        old = out / f"superseded-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
        if master:
            old.mkdir()
            for path in [p for p in out.iterdir() if p.is_file() and p.name != ".lock"]:  # final, ckpt, logs
                os.replace(path, old / path.name)
        print0(f"train.py: {results} has no row for the finished run in {out}: retraining it (old files in {old})")
    elif ckpt_path.exists() and not args.resume:
        fail(f"{ckpt_path} exists: pass --resume to continue it, or delete the folder to start over")

    # --- devices, model, optimisers, data --------------------------------------------------------
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if args.device == "cuda" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world > 1:  # torchrun: NCCL on GPU, gloo on CPU
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    dtype, eval_rows, n_tokens = identity["dtype"], identity["eval_rows"], steps * args.batch_tokens
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if dtype == "bfloat16" else contextlib.nullcontext()
    torch.manual_seed(args.seed)
    model = GPT(cfg).to(device)
    backend = model.set_device_backend(device)
    # Newton-Schulz in bf16 on GPU (tensor cores); on CPU fp32 matmuls are the fast ones.
    optimizers = [opt for opt in build_optimizers(model.param_groups(), lrs, compute_dtype=torch.bfloat16
                                                  if device.type == "cuda" else torch.float32) if opt is not None]
    step, train_row, wall_before, train_loss, tokens_per_s, high_loss_steps = 0, 0, 0.0, None, None, 0
    if args.resume and ckpt_path.exists():
        try:  # weights_only: a shared checkpoint cannot run code on load
            ckpt = torch.load(ckpt_path, map_location=device, weights_only=True)
        except Exception as e:
            fail(f"{ckpt_path} cannot be loaded as a checkpoint of this train.py ({type(e).__name__}: "
                 f"{str(e).strip().splitlines()[0][:160]})")
        if ckpt.get("run_id") != run_id:
            refuse_other_run(ckpt_path, ckpt, identity)
        model.load_state_dict(ckpt["model"])
        for opt, state in zip(optimizers, ckpt["optimizers"]):
            opt.load_state_dict(state)
        step, train_row, wall_before, train_loss, tokens_per_s, high_loss_steps = (ckpt[k] for k in (
            "step", "train_row", "wall_s", "train_loss", "tokens_per_s", "high_loss_steps"))
        torch.set_rng_state(ckpt["rng_cpu"])
        if device.type == "cuda" and ckpt.get("rng_cuda") is not None:
            torch.cuda.set_rng_state(ckpt["rng_cuda"])
        print0(f"resumed {ckpt_path} at step {step}/{steps}")
    if master:
        atomic_write(out / "run.json", (json.dumps({"run_id": run_id, "identity": identity}, indent=1) + "\n").encode())
    train_loader = RowLoader(args.data, "train", args.device_batch, rank, world, start_row=train_row)
    val_batch = max(1, min(args.device_batch, eval_rows // world))
    val_loader = RowLoader(args.data, "val", val_batch, rank, world)
    val_batches = max(1, eval_rows // (val_batch * world))
    with autocast:  # compiled for the dtype it trains in
        compiled, compile_s = compile_or_eager(model, args.device_batch, cfg.seq_len) if args.compile else (model, None)
    ddp_model = DDP(compiled, device_ids=[device.index] if device.type == "cuda" else None) if world > 1 else compiled

    def checkpoint():
        """Save the run's state if every weight is finite, else return False: ckpt.pt stays a good one."""
        if not torch.stack([p.isfinite().all() for p in model.parameters()]).all():
            return False
        if master:
            state = {"model": model.state_dict(), "optimizers": [o.state_dict() for o in optimizers],
                     "step": step, "train_row": train_loader.row, "wall_s": wall_before + time.time() - t_start,
                     "train_loss": train_loss, "tokens_per_s": tokens_per_s, "high_loss_steps": high_loss_steps,
                     "rng_cpu": torch.get_rng_state(), "run_id": run_id, "identity": identity,
                     "rng_cuda": torch.cuda.get_rng_state() if device.type == "cuda" else None}
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
    grad_accum = args.batch_tokens // cfg.seq_len // world // args.device_batch
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print0(f"{run_name}: N {summary['n_params'] / 1e6:.2f}M (once {summary['n_once'] / 1e6:.2f}M, rec "
           f"{summary['n_rec'] / 1e6:.2f}M), {steps} steps x {args.batch_tokens:,} tokens = {n_tokens:,} tokens, "
           f"{flops_per_token * n_tokens:.3e} FLOPs, run_id {run_id[:12]}\n  {world} x {device_name}, {dtype}, "
           f"attention {backend}, micro-batch {args.device_batch} rows x {grad_accum} accumulation, LRs "
           + ", ".join(f"{k} {v:.3g}" for k, v in lrs.items()))
    if n_tokens > meta["train_tokens"]:
        print0(f"WARNING: this run reads {n_tokens:,} tokens but {args.data} holds {meta['train_tokens']:,} "
               f"training tokens: it repeats data ({n_tokens / meta['train_tokens']:.2f} epochs)", file=sys.stderr)
    diverged_above, patience = math.log(cfg.vocab_size) + DIVERGED_NATS, max(1, min(DIVERGED_STEPS, steps // 10))

    # --- the training loop -----------------------------------------------------------------------
    t_start, timed_tokens, timed_seconds = time.time(), 0, 0.0
    log_file = open(out / "log.jsonl", "a", buffering=1) if master else None  # line-buffered: whole lines
    while step < steps:
        t0 = time.time()
        lr_mult = lr_multiplier(step, steps, args.final_lr_frac)
        for group in (group for opt in optimizers for group in opt.param_groups):
            group["lr"] = group["initial_lr"] * lr_mult
        loss_sum = 0.0
        for micro in range(grad_accum):
            x, y = train_loader.next_batch()
            # Gradients are all-reduced once per step, on the last micro-batch.
            with contextlib.nullcontext() if world == 1 or micro == grad_accum - 1 else ddp_model.no_sync():
                with autocast:
                    loss = ddp_model(x.to(device, non_blocking=True), y.to(device, non_blocking=True))
                (loss / grad_accum).backward()
            loss_sum += loss.detach()
        train_loss = all_reduce_mean((loss_sum / grad_accum).item(), world, device)
        high_loss_steps = 0 if train_loss <= diverged_above else high_loss_steps + 1
        if not math.isfinite(train_loss) or high_loss_steps >= patience:
            return diverged(f"the loss is {train_loss:.4g} (uniform {diverged_above - DIVERGED_NATS:.2f}; "
                            f"{high_loss_steps} steps above {diverged_above:.2f})")
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)
        step, dt = step + 1, time.time() - t0
        if step > 1 or steps == 1:  # the first step pays for allocator warm-up
            timed_tokens, timed_seconds = timed_tokens + args.batch_tokens, timed_seconds + dt
        tokens_per_s = timed_tokens / timed_seconds if timed_seconds else args.batch_tokens / dt
        if master and (step % args.log_every == 0 or step == steps or step == 1):
            mfu = flops.mfu(cfg, tokens_per_s, world, device_name)
            record = {"step": step, "steps": steps, "loss": train_loss, "lr_mult": lr_mult,
                      "tokens_per_s": tokens_per_s, "mfu": mfu, "train_row": train_loader.row,
                      "elapsed_s": wall_before + time.time() - t_start}
            log_file.write(json.dumps(record) + "\n")
            eta = (steps - step) * timed_seconds / max(1, step - 1) if timed_seconds else 0
            print(f"step {step:>6}/{steps} | loss {train_loss:.4f} | lrm {lr_mult:.3f} | {tokens_per_s:,.0f} tok/s | "
                  f"{flops_per_token * tokens_per_s / 1e9:,.1f} GFLOP/s | mfu {f'{100 * mfu:.1f}%' if mfu else 'n/a'}"
                  f" | eta {eta / 60:.1f}m", flush=True)
        stop = all_reduce_mean(float(bool(stop_requested)), world, device) > 0  # every rank stops together
        if (stop or (args.save_every and step % args.save_every == 0 and step < steps)) and not checkpoint():
            return diverged("the weights are no longer finite")
        if stop:
            print0(f"train.py: interrupted at step {step}/{steps}; checkpoint saved to {ckpt_path}. "
                   f"Rerun with --resume to continue.")
            return 143

    # --- final evaluation, then the row (durable) and only then final.json -----------------------
    if not checkpoint():
        return diverged("the weights are no longer finite")
    val_loss = evaluate(model, val_loader, val_batches, world, device, autocast)
    extra_eval = {f"val_loss_r{r}": evaluate(model, val_loader, val_batches, world, device, autocast, r=r)
                  for r in args.eval_r}
    wall_s = wall_before + time.time() - t_start
    if master:
        row = summary | dict(
            tokens=n_tokens, steps=steps, flops_actual=flops_per_token * n_tokens, val_loss=val_loss,
            train_loss=train_loss, **extra_eval, eval_rows=eval_rows, seed=args.seed, tokens_per_s=tokens_per_s,
            mfu=flops.mfu(cfg, tokens_per_s, world, device_name) if tokens_per_s else None, wall_s=wall_s,
            compile_s=compile_s, lrs=lrs, base_lrs=identity["base_lrs"], lr_rule=identity["lr_rule"], world_size=world,
            device=device_name, dtype=dtype, attention=backend, run=run_name, out=str(out),
            data_meta={k: meta.get(k) for k in ("tokenizer_kind", "tokenizer_sha256", "vocab_size", "seq_len",
                                                 "train_rows", "val_rows", "train_tokens", "command")}
            | {"dir": str(Path(args.data).resolve()), "epochs": train_loader.row / max(1, meta["train_rows"])},
            run_id=run_id, identity=identity, finished=True)
        print(f"final val loss {val_loss:.4f} nats/token" +
              "".join(f", r={k[10:]}: {v:.4f}" for k, v in extra_eval.items()) + f" | wall {wall_s / 60:.1f}m")
        try:  # a full disk leaves the old results file whole and no final.json: a rerun writes the row
            if results:
                append_row(results, row)
        except OSError as e:
            fail(f"could not append the row to {results} ({e}); nothing was written there. {out} and its "
                 f"checkpoint are kept: rerun with --resume to write the row", code=1)
        atomic_write(out / "final.json", (json.dumps(row, indent=1) + "\n").encode())
        if args.sample:  # a look at what the model learned
            tokenizer = load_tokenizer(args.data)
            prompt = [tokenizer.bos_id] + tokenizer.encode("The capital of France is")
            with autocast:
                samples = model.generate(torch.tensor([prompt] * args.sample, device=device), 48, 0.8, top_k=50)
            print("\n".join(f"--- {tokenizer.decode(ids[1:].tolist())!r}" for ids in samples))
        log_file.close()
    if world > 1:  # leave together: a rank that exits while a peer is still writing can abort in gloo's teardown
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop_requested.append(signum))
    sys.exit(main())
