"""
A run folder and its record. What makes two runs the same run (the identity and its sha256, the run_id),
the files a run leaves in its folder (run.json at the start, ckpt.pt, final.json: its results row) and
reading them back: every damaged or foreign file, or one without the structure its reader needs, is one
DataError naming it. train.py decides with these whether a run is done, reused, restored or resumed, builds
its row with results_row and compiles its model with compile_or_eager; evaluate.py finds finished runs and
loads their final weights; both sample texts from them.

    model = load_run_model("runs/quickstart", "cpu")     # the final weights, checked against final.json
"""
import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import sys
import time
import zipfile
from pathlib import Path

import torch

import flops
from nanoloop.common import (DataError, append_row, atomic_write, check_fields, count, load_json, positive_int,
                             positive_int_list)
from nanoloop.dataloader import ROW_ORDER_SEED, RowLoader, data_identity, read_meta
from nanoloop.loops import (LoopCounts, add_loop_args, check_loops_fit, expected_flops_per_token,
                            expected_measured_flops, loop_counts_from_args, realised_flops_per_token)
from nanoloop import tracking
from model import GPT
from muonh import GROUP_NAMES, RECIPE_GROUPS, add_lr_args, learning_rates, lr_settings
from nanoloop.recipe import (Horizon, Recipe, add_horizon_args, add_recipe_args, is_default_schedule, plan_horizon,
                             recipe_from_args)

# What a checkpoint records about the training loop besides weights, optimiser states and RNG.
PROGRESS_KEYS = ("step", "train_row", "wall_s", "train_loss", "tokens_per_s", "high_loss_steps")
# The structure each reader of a run's files needs ({key: type}, common.check_fields): a file that loads but
# lacks one is refused in one line naming it and the key, never a KeyError inside the reader.
NUMBER, MAYBE_NUMBER = (int, float), (int, float, type(None))
WEIGHTS_FIELDS = {"model": dict, "run_id": str, "step": int}  # ckpt.pt, for the final weights
RESUME_FIELDS = WEIGHTS_FIELDS | {"optimizers": list, "rng_cpu": torch.Tensor, "train_row": int, "wall_s": NUMBER,
                                  "train_loss": MAYBE_NUMBER, "tokens_per_s": MAYBE_NUMBER, "high_loss_steps": int}
FINAL_FIELDS = {"run_id": str, "val_loss": NUMBER, "steps": int, "tokens": int, "out": str, "data_meta": dict}
RUN_FIELDS = {"run_id": str, "identity": dict}  # run.json
IDENTITY_FIELDS = {"model": dict, "data": dict, "dtype": str}  # what check_run reads of run.json's identity


# ----------------------------------------------------------------------------------------------
# What run train.py's flags describe: its config, its steps, its identity

def train_parser(description=""):
    """train.py's flags. They live here, beside plan_run and run_identity, because what they say is the run's
    identity: sweep_state.py parses a sweep's planned train.py flags with this same parser to find which runs
    are done."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    flops.add_model_args(p)
    p.set_defaults(vocab_size=None, seq_len=None)  # taken from the data's meta.json unless given
    g = p.add_argument_group("horizon (pick one) and batch")
    add_horizon_args(g)  # --flops C, --tokens D, --tokens-per-param, --batch-tokens B
    g.add_argument("--device-batch", type=count, default=0, help="rows per micro-batch per rank (0: auto, <= 16)")
    add_recipe_args(p)
    add_loop_args(p)
    add_lr_args(p)
    g = p.add_argument_group("io and system")
    g.add_argument("--data", default="data/fineweb", help="directory written by prepare_data.py")
    g.add_argument("--out", default="", help="run directory (default runs/<run name>)")
    g.add_argument("--results", default="", help="JSONL file the final row is appended to")
    g.add_argument("--resume", action="store_true", help="continue from --out/ckpt.pt if it exists")
    g.add_argument("--reuse-from", action="append", default=[],
                   help="finished run folder to reuse if its identity is this one (repeatable: the first match)")
    g.add_argument("--save-every", type=count, default=500, help="checkpoint every N steps (0: only end/signal)")
    g.add_argument("--log-every", type=positive_int, default=10)
    g.add_argument("--eval-rows", type=positive_int, default=512, help="fixed validation rows (held-out split)")
    g.add_argument("--eval-r", type=positive_int_list, default=[],
                   help="also evaluate at these loop counts, e.g. 2,8 (App. A)")
    g.add_argument("--sample", type=count, default=0,
                   help="print N sampled continuations of --prompt at the end (or of a finished run)")
    g.add_argument("--prompt", default="The capital of France is", help="what --sample continues")
    g.add_argument("--sample-tokens", type=positive_int, default=48, help="tokens per sample")
    g.add_argument("--seed", type=int, default=0, help="the initialisation's seed")
    g.add_argument("--init-draws", default="global", choices=["global", "by-name"],
                   help="by-name: each weight's initial draw from its own generator, seeded by --seed and its name, "
                        "so a variant that adds or drops a module starts the modules it shares as the base does "
                        "(dev/ablate.sh --paired-init); global: the one RNG, as every committed run")
    g.add_argument("--data-order", type=int, default=ROW_ORDER_SEED, metavar="SEED",
                   help=f"the seed of the training rows' order (default {ROW_ORDER_SEED}: every run reads the same "
                        f"order; another one measures what the order alone moves, dev/noise.sh)")
    g.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    g.add_argument("--threads", type=count, default=0,
                   help="CPU threads (0: OMP_NUM_THREADS if set, else 1: with one core of 2 busy, two threads ran "
                        "the quick start 2.5x slower than one; idle, 1.5x faster; dev/bench_threads.py)")
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="auto: bf16 on GPU")
    g.add_argument("--compile", action="store_true", help="torch.compile the model (inductor, GPU or CPU)")
    tracking.add_args(g)  # --wandb PROJECT, --wandb-group GROUP
    return p


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What train.py's flags make of one run on its data: the model, the recipe, the horizon and the micro-batch."""
    cfg: flops.ModelConfig
    recipe: Recipe
    horizon: Horizon                # steps, batch_tokens, tokens_target
    device_batch: int               # rows per micro-batch per rank
    loops: LoopCounts               # the loop count per step (loops.py; fixed: cfg.r)


def plan_run(args, meta, world):
    """The RunPlan of train.py's flags on the data described by meta.json, for `world` ranks; every flag checked
    against the data and the batch (DataError). The sequence length is the data's; the horizon and batch are the
    recipe's (recipe.plan_horizon); the micro-batch is --device-batch, or the largest of at most 16 rows that
    divides each rank's share."""
    for flag, given, have in (("--seq-len", args.seq_len, meta["seq_len"]),
                              ("--vocab-size", args.vocab_size, meta["vocab_size"])):
        if given not in (None, have):
            raise DataError(f"{flag} {given} does not match the data ({have}, {args.data}/meta.json)")
    cfg = flops.config_from_args(args, vocab_size=meta["vocab_size"], seq_len=meta["seq_len"])
    recipe = recipe_from_args(args)
    if args.batch_tokens is not None and args.batch_tokens % cfg.seq_len:
        raise DataError(f"--batch-tokens {args.batch_tokens} is not a multiple of the sequence length {cfg.seq_len}")
    horizon = plan_horizon(args, cfg, recipe)
    rows_per_step = horizon.batch_tokens // cfg.seq_len
    if rows_per_step % world:
        raise DataError(f"{rows_per_step} rows per step do not split over {world} ranks")
    rows_per_rank = rows_per_step // world
    device_batch = args.device_batch
    if not device_batch:
        device_batch = max(b for b in range(1, 17) if rows_per_rank % b == 0)
    if rows_per_rank % device_batch:
        raise DataError(f"--device-batch {device_batch} does not divide the {rows_per_rank} rows per rank per step")
    loops = loop_counts_from_args(args)
    check_loops_fit(loops, cfg)
    return RunPlan(cfg, recipe, horizon, device_batch, loops)


@dataclasses.dataclass
class Run:
    """Everything one training run of train.py holds, declared here (results_row reads it) and filled in phases:
    train.main() from the flags and the data (nothing touched yet), setup() the devices, model, optimisers and
    data, train_loop() what it measures."""
    # main(): what the flags and the data make of the run
    args: argparse.Namespace
    meta: dict                      # the prepared data's meta.json
    cfg: flops.ModelConfig
    recipe: Recipe                  # its batch rule and LR schedule (recipe.py)
    horizon: Horizon                # steps, batch_tokens, tokens_target
    loops: LoopCounts               # the loop count of each step (loops.py; fixed: cfg.r)
    device_batch: int               # rows per micro-batch per rank (--device-batch, or plan_run's choice)
    identity: dict                  # what makes two runs the same run (runs.run_identity)
    run_id: str                     # its sha256
    name: str                       # r4_s0.5_rb4_linear_C5e+12_seed0: the row's "run"
    out: Path                       # the run folder
    results: Path | None            # the results file the row is appended to
    tokenizer: object | None        # --sample's tokenizer, loaded before the compute
    # setup()
    device: torch.device = None
    autocast: object = None         # a torch.autocast for bf16 runs, else a no-op context
    model: GPT = None
    backend: str = ""               # the attention kernel: fa3, fa2 or sdpa
    optimizers: list = dataclasses.field(default_factory=list)  # MuonH and AdamW (muonh.build_optimizers)
    average: object = None          # --average-last's WeightAverage (averaging.py), last in optimizers; else None
    progress: dict = dataclasses.field(default_factory=dict)    # the loop's state a checkpoint keeps (runs.PROGRESS_KEYS)
    train_loader: RowLoader = None
    val_loader: RowLoader = None
    val_batches: int = 0
    compile_s: float | None = None                  # what --compile's torch.compile took (runs.compile_or_eager)
    ddp_model: torch.nn.Module = None               # what the loop calls: the (compiled) model, in DDP under torchrun
    # train_loop()
    summary: dict = dataclasses.field(default_factory=dict)     # flops.summary: the config's counts and FLOPs
    device_name: str = ""
    t_start: float = 0.0
    log_file: tracking.RunLog | None = None         # log.jsonl (and the wandb run), rank 0 only


def run_identity(args, meta, plan):
    """(identity, run_id): everything that makes two runs the same run, and its sha256. Resume, reuse and
    "already done" all compare it. ValueError for bad LR settings. A schedule other than the iso-depth one
    (warmup, cosine) is recorded under "schedule"; iso-depth runs have no such entry, as before it existed."""
    cfg, steps, batch_tokens = plan.cfg, plan.horizon.steps, plan.horizon.batch_tokens
    base_lrs, lr_rule = lr_settings(args, plan.recipe.data_exp)
    tokens_ref = args.ref_tokens or flops.reference_horizon(looped=cfg.r > 1)
    lrs = learning_rates(cfg.d_model, batch_tokens, steps * batch_tokens, tokens_ref, base_lrs, **lr_rule)
    recorded = recorded_groups(cfg)
    base_lrs = {name: lr for name, lr in base_lrs.items() if name in recorded}
    lrs = {name: lr for name, lr in lrs.items() if name in recorded}
    dtype = args.dtype
    if dtype == "auto":
        dtype = "bfloat16" if args.device == "cuda" else "float32"
    identity = {
        "model": flops.config_record(cfg),
        "horizon": {"steps": steps, "batch_tokens": batch_tokens, "flops_budget": args.flops},
        "lrs": lrs,
        "base_lrs": base_lrs,
        "lr_rule": lr_rule | {"ref_tokens": tokens_ref, "final_lr_frac": args.final_lr_frac},
        "seed": args.seed,
        "eval_rows": min(args.eval_rows, meta["val_rows"]),
        "data": data_identity(meta),
        "dtype": dtype,
    }
    if not is_default_schedule(plan.recipe):
        identity["schedule"] = {"recipe": plan.recipe.name, "warmup_frac": plan.recipe.warmup_frac,
                                "decay": plan.recipe.decay}
        if plan.recipe.average_frac:  # only then: the schedules of earlier runs keep their run_ids
            identity["schedule"]["average_frac"] = plan.recipe.average_frac
    if plan.loops.kind != "fixed":  # only then: every fixed run keeps its run_id
        identity["loops"] = plan.loops.identity()
    if args.data_order != ROW_ORDER_SEED:  # only then: every earlier run read the default order
        identity["data_order"] = args.data_order
    if args.init_draws != "global":  # only then: every earlier run drew from the global RNG
        identity["init_draws"] = args.init_draws
    identity = json.loads(json.dumps(identity))  # through JSON, so it compares equal to what files hold
    return identity, run_id_of(identity)


def recorded_groups(cfg):
    """The optimiser groups whose LRs cfg's identity records: App. E's five (muonh.RECIPE_GROUPS) and any
    other group that cfg's model has parameters in, found on a model built on the meta device (shapes, no
    memory; built only when such groups exist)."""
    extra = set(GROUP_NAMES) - set(RECIPE_GROUPS)
    if not extra:
        return set(RECIPE_GROUPS)
    with torch.device("meta"):
        groups = GPT(cfg).param_groups()
    return set(RECIPE_GROUPS) | {name for name in extra if groups[name]}


# ----------------------------------------------------------------------------------------------
# The record: run_id, the rows, final.json, checkpoints

def run_id_of(identity):
    """The sha256 of a run's identity (model, horizon, LRs, seed, eval rows, dtype, data), key order aside."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def refusal(path, record, ours):
    """The DataError for a file of another run, naming every identity field where it differs
    ("section.key (theirs -> ours)", values cut to 16 characters, the first 8 fields)."""
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
    return DataError(f"{path} belongs to another run; it differs in {listed}. Use another --out")


def read_final(path):
    """A run folder's final.json (its results row), or None if there is none; DataError if it is damaged."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        row = load_json(path, "final.json")
    except DataError as e:
        raise DataError(f"{e}: delete it (or the folder) to retrain the run") from None
    try:
        check_fields(path, row, FINAL_FIELDS)
    except DataError as e:
        raise DataError(f"{e}: not a run's final row; delete it (or the folder) to retrain the run") from None
    return row


def open_outputs(out, results):
    """Create the run folder and the results file now, so that a path that cannot be written is refused before
    the compute (ValueError naming it); returns the folder's lock file, which train.py flocks."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        lock = open(out / ".lock", "a")
        if results:
            results.parent.mkdir(parents=True, exist_ok=True)
            open(results, "a").close()
    except OSError as e:
        raise ValueError(f"cannot write the outputs: {e.filename or out}: {e.strerror or e}") from None
    return lock


def settle(out, run_id, identity, results, reuse_from, resume, rank=0):
    """What the folder `out` already holds decides what train.py does, as (outcome, row):
      "train"     nothing yet, or a checkpoint that --resume continues;
      "done"      this run, finished (final.json), and results either holds its row or is not asked for;
      "restored"  this run, finished, its row missing from results: appended again from final.json;
      "reused"    nothing yet, and a folder of reuse_from (a list, tried in order) holds this very run
                  finished: its row copied here (the row returned also names the folder, as reused_from).
    DataError: another run's folder, a damaged final.json, a checkpoint without --resume."""
    final_path = Path(out) / "final.json"
    final = read_final(final_path)
    if final and final.get("run_id") != run_id:
        raise refusal(final_path, final, identity)
    if final and results and finished_row(results, run_id) is None:
        if rank == 0:
            append_row(results, final)
        return "restored", final
    if final:
        return "done", final
    for folder in reuse_from:
        donor = read_final(Path(folder) / "final.json")
        if donor is None or donor.get("run_id") != run_id:
            continue
        row = donor | {"out": str(out)}
        if rank == 0:
            if results:
                append_row(results, row)
            atomic_write(final_path, (json.dumps(row, indent=1) + "\n").encode())
        return "reused", row | {"reused_from": str(folder)}
    if (Path(out) / "ckpt.pt").exists() and not resume:
        raise DataError(f"{Path(out) / 'ckpt.pt'} exists: pass --resume to continue it, or delete the folder to "
                        f"start over")
    return "train", None


def run_summary(run):
    """flops.summary of the run's model; under sampled loop counts F is their expectation (what the budget
    bought steps with) and the distribution is recorded (loops.py)."""
    summary = flops.summary(run.cfg, run.args.flops, run.horizon.batch_tokens)
    if run.loops.kind != "fixed":
        summary["flops_per_token"] = expected_flops_per_token(run.cfg, run.loops)
        summary["loops"] = run.loops.identity()
    return summary


def results_row(run, val_loss, extra_eval, world):
    """The results row of a finished run (train.py's Run, trained on `world` ranks): every ModelConfig field and
    count (flops.summary), the horizon, the losses, LRs, throughput, the data, the identity and its run_id; all
    that fit_laws.py needs of a run. train.py appends it to --results and writes it as final.json."""
    args, meta, progress = run.args, run.meta, run.progress
    n_tokens = run.horizon.steps * run.horizon.batch_tokens
    flops_actual = run.summary["flops_per_token"] * n_tokens  # forward + backward, what a budget prices
    # what the drawn loops spent (a fixed run: F D again), and the measured compute at that F
    realised = realised_flops_per_token(run.cfg, run.loops, args.seed, run.horizon.steps)
    measured = expected_measured_flops(run.cfg, run.loops, n_tokens, run.horizon.steps)
    tokens_per_s = progress["tokens_per_s"]
    mfu = None
    if tokens_per_s:
        mfu = flops.mfu(run.cfg, tokens_per_s, world, run.device_name, realised)
    data_keys = ("tokenizer_kind", "tokenizer_sha256", "vocab_size", "seq_len", "train_rows", "val_rows",
                 "train_tokens", "command")
    data_meta = {k: meta.get(k) for k in data_keys}
    data_meta["dir"] = str(Path(args.data).resolve())
    data_meta["epochs"] = run.train_loader.row / max(1, meta["train_rows"])
    return run.summary | dict(
        tokens=n_tokens, steps=run.horizon.steps, flops_actual=flops_actual, flops_realised=realised * n_tokens,
        flops_measured=measured, batch_tokens=run.horizon.batch_tokens,
        recipe=run.recipe.name, tokens_target=run.horizon.tokens_target, d0=run.recipe.d0,
        val_loss=val_loss, train_loss=progress["train_loss"], **extra_eval, eval_rows=run.identity["eval_rows"],
        seed=args.seed, tokens_per_s=tokens_per_s, mfu=mfu, wall_s=progress["wall_s"] + time.time() - run.t_start,
        compile_s=run.compile_s, lrs=run.identity["lrs"], base_lrs=run.identity["base_lrs"],
        lr_rule=run.identity["lr_rule"], world_size=world, device=run.device_name, dtype=run.identity["dtype"],
        attention=run.backend, run=run.name, out=str(run.out), data_meta=data_meta, run_id=run.run_id,
        identity=run.identity, finished=True)


def finished_row(results, run_id):
    """The row of run_id in a results file, or None (a torn or foreign line is not this run's row)."""
    if results is None or not Path(results).is_file():
        return None
    needle = f'"run_id": "{run_id}"'  # json.dumps' spelling: only candidate lines are parsed
    for line in Path(results).read_text().splitlines():
        if needle in line:
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def open_loaders(run, rank, world):
    """run.train_loader from the run's checkpointed row, in its --data-order, and run.val_loader: the same
    eval_rows held-out rows at every evaluation, split over the ranks (run.val_batches batches each)."""
    args = run.args
    start_row = run.progress["train_row"]
    run.train_loader = RowLoader(args.data, "train", run.device_batch, rank, world, start_row, args.data_order)
    eval_rows = run.identity["eval_rows"]
    val_batch = max(1, min(run.device_batch, eval_rows // world))
    run.val_loader = RowLoader(args.data, "val", val_batch, rank, world)
    run.val_batches = max(1, eval_rows // (val_batch * world))


def save_checkpoint(path, model, optimizers, progress, run_id, identity):
    """ckpt.pt: weights, optimiser states, the loop's progress, the RNG states and the run's identity,
    written atomically (a crash or a full disk keeps the previous checkpoint whole)."""
    state = {"model": model.state_dict(), "optimizers": [opt.state_dict() for opt in optimizers], **progress,
             "rng_cpu": torch.get_rng_state(), "run_id": run_id, "identity": identity, "rng_cuda": None}
    if torch.cuda.is_available() and next(model.parameters()).is_cuda:
        state["rng_cuda"] = torch.cuda.get_rng_state()
    atomic_write(path, lambda f: torch.save(state, f))


def restore_checkpoint(path, device, run_id, identity, model, optimizers):
    """Load ckpt.pt into model and optimizers, restore the RNG states and return the loop's progress
    (PROGRESS_KEYS). DataError: a damaged file, or another run's checkpoint (the fields that differ)."""
    ckpt = load_checkpoint(path, device, RESUME_FIELDS)
    if ckpt["run_id"] != run_id:
        raise refusal(path, ckpt, identity)
    if len(ckpt["optimizers"]) != len(optimizers):
        raise DataError(f"{path}: {len(ckpt['optimizers'])} optimiser states, this run has {len(optimizers)}")
    try:  # the same run_id, so only a file edited by hand lands here
        model.load_state_dict(ckpt["model"])
        for opt, state in zip(optimizers, ckpt["optimizers"]):
            opt.load_state_dict(state)
        torch.set_rng_state(ckpt["rng_cpu"])
        if torch.device(device).type == "cuda" and ckpt.get("rng_cuda") is not None:
            torch.cuda.set_rng_state(ckpt["rng_cuda"])
    except (RuntimeError, ValueError, KeyError, TypeError) as e:
        raise DataError(f"{path}: its states do not fit this run ({' '.join(str(e).split())[:160]})") from None
    return {key: ckpt[key] for key in PROGRESS_KEYS}


def load_checkpoint(path, device, fields):
    """ckpt.pt as a dict holding `fields` (WEIGHTS_FIELDS, RESUME_FIELDS), loaded with weights_only=True (a
    shared checkpoint cannot run code on load); an empty, truncated or foreign file, or one without a key its
    reader needs, is a DataError naming it (and the key)."""
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
        if not isinstance(ckpt, dict) or "model" not in ckpt:
            raise TypeError(f"holds a {type(ckpt).__name__} without model weights")
    except Exception as e:  # torch.load raises many kinds for a damaged file
        reason = " ".join(str(e).split())[:160] or "empty or truncated file"
        raise DataError(f"{path} cannot be loaded as a checkpoint of this train.py ({type(e).__name__}: "
                        f"{reason})") from None
    check_fields(path, ckpt, fields)
    return ckpt


def check_run(path, data_dir=""):
    """A finished run folder, checked before any work: final.json and run.json of one run, its model config,
    and a data folder (data_dir, else the one it trained on) holding the tokenizer it trained with."""
    path = Path(path)
    final = read_final(path / "final.json")
    if final is None:
        raise DataError(f"{path}: not a finished run (final.json is missing)")
    record = load_json(path / "run.json", "run.json")
    check_fields(path / "run.json", record, RUN_FIELDS)
    identity = record["identity"]
    check_fields(f"{path / 'run.json'}: identity", identity, IDENTITY_FIELDS)
    check_fields(f"{path / 'run.json'}: identity.data", identity["data"], {"tokenizer_sha256": str})
    if final["run_id"] != record["run_id"]:
        raise DataError(f"{path}: final.json and run.json name different runs")
    if not zipfile.is_zipfile(path / "ckpt.pt"):  # torch.save's format: a truncated file is not one
        raise DataError(f"{path / 'ckpt.pt'}: missing or not a torch checkpoint")
    try:
        cfg = flops.ModelConfig(**identity["model"])
    except (TypeError, ValueError) as e:
        raise DataError(f"{path / 'run.json'}: no usable identity.model ({e})") from None
    if not data_dir:  # the folder it trained on
        check_fields(f"{path / 'final.json'}: data_meta", final["data_meta"], {"dir": str})
        data_dir = final["data_meta"]["dir"]
    try:
        sha = read_meta(data_dir, verify=False)["tokenizer_sha256"]
    except DataError as e:
        raise DataError(f"the data folder of {path} (its tokenizer) is unusable, pass --data: {e}") from None
    if sha != identity["data"]["tokenizer_sha256"]:
        raise DataError(f"{data_dir}: its tokenizer is not the one {path} was trained with (pass --data)")
    return {"dir": path, "name": path.name, "run_id": record["run_id"], "cfg": cfg, "data_dir": data_dir,
            "tokenizer_sha256": sha, "dtype": identity["dtype"], "steps": final["steps"], "run_name": final.get("run"),
            "loops": LoopCounts(**identity.get("loops", {}))}


def cpu_threads(requested):
    """The thread count of a CPU run: --threads, else OMP_NUM_THREADS (sweep.sh sets one per run slot), else 1.
    One thread is the default that never collapses when another program holds a core (OpenMP's threads then wait
    on each other; --threads' help gives dev/bench_threads.py's numbers); sweep.sh runs one per core anyway."""
    if requested:
        return requested
    return int(os.environ.get("OMP_NUM_THREADS") or 1)


def compiles_per_block(device, loops=None):
    """Whether compile_or_eager compiles each block rather than the whole model: on CPU, and for a sampled
    loop count (train.py --loops) anywhere."""
    return device.type == "cpu" or (loops is not None and loops.kind != "fixed")


def compile_or_eager(model, batch_rows, seq_len, loops=None):
    """(the compiled model, seconds it took), compiled now by one throwaway forward+backward on a dummy
    batch, so that a missing C++ compiler or an inductor error falls back to (model, seconds) with one line
    on stderr instead of failing mid-run. RNG state and gradients are left as they were (a resumed run
    stays exact). Called under the autocast the model trains in. `loops`: train.py's --loops (LoopCounts).

    On GPU the whole model is one graph (30-50 s once, in runs of hours). On CPU only each transformer
    block's forward is compiled ("regional compilation", pytorch.org/tutorials/recipes/regional_compilation):
    every block of one width is the same graph, so a single compile serves all 20 layers and, through
    inductor's on-disk cache, every later run at that width of any r: ~3 s warm (10-24 s cold, once per
    width) against the whole model's 14-50 s, which the CPU grids' 1-9 minute runs would not earn back. The
    rest (the loop, the injection, the fused loss) stays eager; finish's validation and samples run eager
    blocks again (eager_blocks). A sampled loop count compiles per block on GPU too: a whole-model graph
    holds the loop unrolled at one T, and Dynamo, seeing T change, retraces with T symbolic, which the loop's
    gradient switch (model.recurrence) cannot branch on: the run would fail at its second distinct T
    (dev/bench_loops.py measures both ways)."""
    t0 = time.time()
    device = next(model.parameters()).device
    compiled = model
    if compiles_per_block(device, loops):
        for block in model.blocks():
            block.forward = torch.compile(block.forward)  # an instance attribute: state_dict keys unchanged
    else:
        compiled = torch.compile(model)
    x = torch.zeros(batch_rows, seq_len, dtype=torch.long, device=device)
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            compiled(x, x.clone()).backward()  # distinct tensors: Dynamo guards on aliasing
    except Exception as e:  # dynamo/inductor raise many kinds; all of them mean "run eagerly"
        reason = str(e).strip()[:200]
        print(f"torch.compile failed ({type(e).__name__}: {reason!r}); running eagerly", file=sys.stderr)
        eager_blocks(model)
        compiled = model
    model.zero_grad(set_to_none=True)
    return compiled, time.time() - t0


def eager_blocks(model):
    """Undo compile_or_eager's CPU compilation: each block's forward is its class's again."""
    for block in model.blocks():
        block.__dict__.pop("forward", None)


def load_run_model(run, device):
    """The final weights of a checked run (check_run's dict, or a run folder) on `device`, ready for inference.
    ckpt.pt must be the run's and from its last step: a run whose final checkpoint could not be written keeps
    an earlier one, which is refused rather than evaluated as if final."""
    if not isinstance(run, dict):
        run = check_run(run)
    device = torch.device(device)
    path = run["dir"] / "ckpt.pt"
    ckpt = load_checkpoint(path, device, WEIGHTS_FIELDS)
    if ckpt["run_id"] != run["run_id"]:
        raise DataError(f"{path}: holds run {ckpt['run_id'][:12]}, not {run['run_id'][:12]}")
    if ckpt["step"] != run["steps"]:
        raise DataError(f"{path}: holds step {ckpt['step']}, not the run's last ({run['steps']}): its final "
                        f"checkpoint was never written; retrain the run to evaluate it")
    model = GPT(run["cfg"])
    try:
        model.load_state_dict(ckpt["model"])
    except (RuntimeError, TypeError) as e:
        raise DataError(f"{path}: its weights do not fit the run's model ({' '.join(str(e).split())[:160]})") from None
    model.to(device)
    model.set_device_backend(device)
    return model.eval()


def autocast_for(run, device):
    """bf16 autocast on GPU for runs trained in it, as train.py evaluates them; fp32 otherwise."""
    if device.type == "cuda" and run["dtype"] == "bfloat16":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def find_runs(paths, data_dir=""):
    """(runs, notes): check_run's dict of every run folder given and of every finished run under a sweep OUT's
    runs/, and a note for each unfinished one skipped. A sweep OUT without a finished run is a DataError: an
    evaluation that would do nothing is refused, not reported as done."""
    runs, notes = [], []
    for path in map(Path, paths):
        if (path / "runs").is_dir() and not (path / "run.json").exists():
            subs = sorted(p for p in (path / "runs").iterdir() if p.is_dir())
            finished = [sub for sub in subs if (sub / "final.json").exists()]
            if not finished:
                raise DataError(f"{path}: none of the {len(subs)} run folders in its runs/ is finished (no "
                                f"final.json): nothing to evaluate")
            runs += [check_run(sub, data_dir) for sub in finished]
            notes += [f"skipping {sub}: not finished (no final.json)" for sub in subs if sub not in finished]
        elif path.is_dir():
            runs.append(check_run(path, data_dir))
        else:
            raise DataError(f"{path}: no such run folder or sweep OUT")
    return runs, notes

