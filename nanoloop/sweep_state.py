"""
Where a sweep stands. For each run sweep.sh plans (its "name|train.py flags" lines on stdin, the lines
flops.py --plan prices), the run identity train.py will give it (runs.train_parser, plan_run, run_identity)
and its state: done (its row is in the results file), running, queued, stopped (interrupted; its checkpoint
resumes), failed (the last error line of its last attempt) or not started. It reads OUT/results.jsonl, the
run folders OUT/runs/<name> (log.jsonl; the .lock a live train.py holds), the logs OUT/logs/<name>.log (each
attempt between sweep.sh's start and exit lines) and, for a sweep submitted with --slurm, OUT/slurm/jobs.txt
and squeue. It also prices the plan (price_plan: flops.py --plan). A library module with the CLI that sweep.sh calls:

    ./sweep.sh --grid smoke --status       # --status: every run, its state, FLOPs done/total and an ETA
    ./sweep.sh --grid smoke --slurm        # --todo: the runs to submit (not done, queued or running)
                                           # --missing (its fit job): the planned runs without a row, and why
"""
import argparse
import dataclasses
import getpass
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import flops
from nanoloop.common import DataError, fail, one_line_errors, positive_int, read_rows
from nanoloop.dataloader import read_meta
from nanoloop.loops import add_loop_args, expected_flops_per_token, expected_measured_flops, loop_counts_from_args
from nanoloop.recipe import add_horizon_args, add_recipe_args, plan_horizon, recipe_from_args

# train.py's dtype "auto" is bf16 on GPU and fp32 on CPU, and the dtype is part of a run's identity: a row
# is this run's if it has the run_id of either device (--todo asks for the one its tasks will run on).
DEVICES = ("cpu", "cuda")
STATES = ("done", "running", "queued", "stopped", "failed", "not started")
# sweep.sh's lines around each attempt in OUT/logs/<name>.log: "[2026-01-01T00:00:00Z] <command>" when it
# starts and "[...Z] exit <status>" when it ends (a missing exit line: still running, or killed outright).
MARKER = re.compile(r"^\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\] (.*)$")
EXIT = re.compile(r"^exit (-?\d+)$")
INTERRUPTED = re.compile(r"interrupted at step (\d+)/(\d+)")  # train.py's line when it exits 143
SQUEUE_RUNNING = ("RUNNING", "COMPLETING", "CONFIGURING")


@dataclasses.dataclass
class PlannedRun:
    """One line of the plan as train.py will see it."""
    name: str
    run_ids: dict         # device -> the run_id train.py gives these flags on that device
    batch_tokens: int
    flops_per_token: int  # flops.py's count
    flops: float          # what the whole run spends: flops_per_token x steps x batch_tokens


@dataclasses.dataclass
class SlurmTask:
    """A live task of the sweep's SLURM array (or its fit job), as squeue reports it."""
    job: str              # "array job_task", as squeue and scancel name it
    state: str            # squeue's state: PENDING, RUNNING, ...
    reason: str


# ----------------------------------------------------------------------------------------------
# The plan: each line's run identity, parsed with train.py's own flags

def plan_runs(lines, data_dir, devices=DEVICES, world=1):
    """PlannedRun of each "name|flags" line on the data in data_dir, for `world` ranks; a bad line is a
    DataError naming it (what train.py would refuse, said before anything is submitted)."""
    # runs.py brings torch and model.py (seconds to import): only the identities need them, not --plan's pricing
    from nanoloop.runs import plan_run, run_identity, train_parser
    meta = read_meta(data_dir, verify=False)
    parser = train_parser()
    planned = []
    for line in lines:
        if not line.strip():
            continue
        name, _, flags = line.rstrip("\n").partition("|")
        run_ids = {}
        for device in devices:  # --data first and --device last, as sweep.sh's train.py commands have them
            args = parse_flags(parser, name, ["--data", data_dir, *flags.split(), "--device", device])
            try:
                plan = plan_run(args, meta, world)
                _, run_ids[device] = run_identity(args, meta, plan)
            except ValueError as e:
                raise DataError(f"plan line {name}: {e}") from None
        per_token = expected_flops_per_token(plan.cfg, plan.loops)
        horizon = plan.horizon
        planned.append(PlannedRun(name, run_ids, horizon.batch_tokens, per_token,
                                  per_token * horizon.steps * horizon.batch_tokens))
    if not planned:
        raise DataError("no plan lines on stdin (expected 'name|train.py flags')")
    return planned


def parse_flags(parser, name, argv):
    """train.py's arguments of plan line `name`; a flag train.py would refuse is a DataError naming the line
    (argparse itself would print its usage and exit)."""
    def refuse(message):
        raise DataError(f"plan line {name}: {message}")
    parser.error = refuse
    return parser.parse_args(argv)


def finished_rows(results):
    """{run_id: row} of a results file (none if it is missing; a torn line is skipped, fit_laws.py reports it)."""
    rows, _ = read_rows(results)
    return {row["run_id"]: row for row in rows if "run_id" in row}


def row_of(run, rows):
    """The results row of a planned run under either device's run_id, or None."""
    for run_id in run.run_ids.values():
        if run_id in rows:
            return rows[run_id]
    return None


# ----------------------------------------------------------------------------------------------
# What SLURM and the run folders say

def slurm_tasks(out):
    """({run name: SlurmTask} of this OUT's live array tasks, {fit job id: SlurmTask}, a note or "") from
    OUT/slurm/jobs.txt (one "array_job fit_job tasks_file" line per --slurm submission) and squeue."""
    jobs_file = out / "slurm" / "jobs.txt"
    if not jobs_file.is_file():
        return {}, {}, ""
    if not shutil.which("squeue"):
        note = "this sweep was submitted to SLURM, but squeue is not on PATH here: its states are from the files only"
        return {}, {}, note
    fmt = "%i|%F|%K|%T|%r"  # job, array job, task index, state, reason; -r: one line per array task
    proc = subprocess.run(["squeue", "-h", "-r", "-u", getpass.getuser(), "-o", fmt], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        return {}, {}, f"squeue failed ({proc.stderr.strip()[:120]}): states are from the files only"
    live = {}
    for line in proc.stdout.splitlines():
        job, array_job, index, state, reason = line.split("|", 4)
        live[(array_job, index)] = SlurmTask(job, state, reason)
    tasks, fits = {}, {}
    for record in jobs_file.read_text().splitlines():
        array_job, fit_job, tasks_file = record.split(maxsplit=2)
        for index, line in enumerate(Path(tasks_file).read_text().splitlines()):
            task = live.get((array_job, str(index)))
            if task is not None:
                tasks[line.partition("|")[0]] = task
        if (fit_job, "N/A") in live:
            fits[fit_job] = live[(fit_job, "N/A")]
    return tasks, fits, ""


def lock_holder(path):
    """The pid of the process that holds `path` flocked (train.py, its run folder's .lock, while it trains),
    read from the kernel's lock table, or None. Read, not tried: taking the lock even briefly could make a
    train.py starting at that moment see its folder busy (exit 75)."""
    try:
        st = os.stat(path)
        table = Path("/proc/locks").read_text()
    except OSError:  # no such run folder yet, or not Linux: squeue and the logs still tell
        return None
    for line in table.splitlines():
        fields = line.split()  # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:5678 0 EOF"
        if len(fields) < 6 or fields[1] != "FLOCK":
            continue
        major, minor, inode = fields[5].split(":")
        if int(inode) == st.st_ino and (int(major, 16), int(minor, 16)) == (os.major(st.st_dev), os.minor(st.st_dev)):
            return int(fields[4])
    return None


def log_marker(line):
    """("exit", status) for an attempt's exit line in a sweep log, ("start", None) for its start line, else None."""
    marker = MARKER.match(line)
    if marker is None:
        return None
    end = EXIT.match(marker[1])
    if end is None:
        return "start", None
    return "exit", int(end[1])


def last_attempt(log):
    """(exit status or None, the attempt's lines) of the last attempt in a run's sweep log; (None, []) if
    there is none. None: it has no exit line yet (still running, or killed before sweep.sh could write one)."""
    if not log.is_file():
        return None, []
    lines = log.read_text(errors="replace").splitlines()
    starts = [i for i, line in enumerate(lines) if log_marker(line) == ("start", None)]
    if not starts:
        return None, []
    attempt = lines[starts[-1] + 1:]
    for line in attempt:
        marker = log_marker(line)
        if marker is not None:  # after the last start line, the only marker is its exit line
            return marker[1], attempt
    return None, attempt


def last_match(pattern, lines):
    """The match of `pattern` in the last of `lines` that has one, or None."""
    found = None
    for line in lines:
        found = pattern.search(line) or found
    return found


def error_line(attempt):
    """What went wrong in a failed attempt: its last "train.py: ..." line (the one-line error every failure
    of train.py prints), else the last line naming an Error (torchrun's, Python's), else its last line."""
    said = [line.strip() for line in attempt if line.strip() and not MARKER.match(line)]
    for prefix in (re.compile(r"^train\.py: "), re.compile(r"\w*Error\b")):
        found = [line for line in said if prefix.search(line) and not INTERRUPTED.search(line)]
        if found:
            return found[-1]
    if said:
        return said[-1]
    return "(nothing was logged)"


def last_progress(run_dir):
    """The last record of a run's log.jsonl (step, steps, tokens_per_s, ...), or None."""
    path = run_dir / "log.jsonl"
    if not path.is_file():
        return None
    lines = path.read_text().splitlines()
    for line in reversed(lines):
        try:
            return json.loads(line)
        except ValueError:  # a line being written
            continue
    return None


# ----------------------------------------------------------------------------------------------
# Each run's state, the table and its footer

@dataclasses.dataclass
class RunState:
    """Where one planned run stands: a line of --status's table, and its part of the footer's FLOPs."""
    run: PlannedRun
    state: str            # one of STATES
    detail: str
    step: int = 0         # the last step logged (running, stopped): the part of its FLOPs already spent
    steps: int = 0
    flops_per_s: float = 0.0  # running: what it trains at now


def state_of(run, out, rows, tasks):
    """The RunState of one planned run: its row decides done; then a live SLURM task or a live train.py
    holding the folder's lock (running, queued); then the last attempt in its log (failed, stopped)."""
    row = row_of(run, rows)
    if row is not None:
        return RunState(run, "done", f"val loss {row['val_loss']:.4f}")
    run_dir = out / "runs" / run.name
    task = tasks.get(run.name)
    if (task and task.state in SQUEUE_RUNNING) or lock_holder(run_dir / ".lock"):
        return running_state(run, run_dir, task)
    if task is not None:
        return RunState(run, "queued", f"job {task.job}: {task.state.lower()} ({task.reason})")
    status, attempt = last_attempt(out / "logs" / f"{run.name}.log")
    if status is not None and status not in (0, 143):
        return RunState(run, "failed", f"exit {status}: {error_line(attempt)}")
    if (run_dir / "final.json").is_file():
        return RunState(run, "not started", "finished (final.json) but its row is missing: a rerun restores it")
    interrupted = last_match(INTERRUPTED, attempt)
    if interrupted or (run_dir / "ckpt.pt").is_file():
        progress = last_progress(run_dir) or {}
        step, steps = progress.get("step", 0), progress.get("steps", 0)
        if interrupted:  # the step its checkpoint holds, which is at or after the last one logged
            step, steps = int(interrupted[1]), int(interrupted[2])
        return RunState(run, "stopped", f"checkpoint at step {step}/{steps}; resubmit to resume", step, steps)
    return RunState(run, "not started", "")


def running_state(run, run_dir, task):
    """A running run's RunState: its step, speed and ETA from the last record of its log.jsonl."""
    where = f" (job {task.job})" if task else ""
    progress = last_progress(run_dir)
    if not progress or not progress.get("tokens_per_s"):
        return RunState(run, "running", f"starting{where}")
    step, steps, tokens_per_s = progress["step"], progress["steps"], progress["tokens_per_s"]
    eta = (steps - step) * run.batch_tokens / tokens_per_s
    detail = f"step {step}/{steps}, {tokens_per_s:,.0f} tok/s, ETA {duration(eta)}{where}"
    return RunState(run, "running", detail, step, steps, tokens_per_s * run.flops_per_token)


def duration(seconds):
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def footer(states, results, fits):
    """The footer lines: the runs per state, the grid's FLOPs done of its total (a started run counts the steps
    it logged), the ETA, and the fit job while it waits."""
    counts = ", ".join(f"{len([s for s in states if s.state == name])} {name}" for name in STATES)
    total = sum(s.run.flops for s in states)
    done = 0.0
    for s in states:
        if s.state == "done":
            done += s.run.flops
        elif s.steps:
            done += s.run.flops * s.step / s.steps
    lines = [f"{len(states)} runs: {counts}",
             f"FLOPs: {done:.3e} of {total:.3e} done ({100 * done / total:.0f}%); {eta(total - done, states, results)}"]
    for job, task in fits.items():
        lines.append(f"fit: job {job} {task.state.lower()} ({task.reason}); it writes fit/ when the array is over")
    return lines


def eta(left, states, results):
    """When the FLOPs left will be spent: at the summed speed of the runs training now, else at the done runs'
    mean speed (flops.py's estimate from the results file) one run at a time."""
    if left <= 0:
        return "all done"
    rate = sum(s.flops_per_s for s in states)
    if rate > 0:
        running = len([s for s in states if s.state == "running"])
        return f"ETA {duration(left / rate)} at {rate:.3e} FLOP/s (the {running} running run(s))"
    mean, _ = achieved_rate(str(results))
    if mean:
        return f"ETA {duration(left / mean)} one run at a time at the done runs' mean {mean:.3e} FLOP/s"
    return "ETA: not until a run has reported its speed"


def print_table(states, title):
    """One line per run (name, state, detail) under `title`, the names padded to the longest."""
    print(title)
    if not states:
        return
    width = max(len("run"), *(len(s.run.name) for s in states)) + 2
    print(f"{'run':<{width}}{'state':<13}detail")
    for s in states:
        print(f"{s.run.name:<{width}}{s.state:<13}{s.detail}".rstrip())


# ----------------------------------------------------------------------------------------------
# Pricing the plan (flops.py --plan, which sweep.sh --plan calls): FLOPs and tokens of every run from
# flops.py, the total, a wall-time estimate, and whether the prepared data covers the largest run

def read_data_meta(data_dir):
    """A prepared dataset's meta.json through dataloader.read_meta (the one reader: a damaged file is one
    line naming it; no checksum pass, train.py verifies the data when it starts), or None if there is none."""
    if not data_dir or not os.path.exists(os.path.join(data_dir, "meta.json")):
        return None
    return read_meta(data_dir, verify=False)


def training_files(meta):
    """How many source files hold training data: every source but the whole validation files (with
    --val-fraction every file is partly training data)."""
    sources = meta.get("settings", {}).get("sources", [])
    val_files = meta.get("split", {}).get("val_files", [])
    return len(sources) - len(val_files)


def data_shortfall(max_tokens, meta, data_dir):
    """One line saying how far the prepared data falls short of the largest run, or None if it covers it.
    A run that reads more tokens than the training split repeats data (a second epoch), which the
    scaling law does not model (the paper trains on unique tokens, §4.1). Tokens per shard are this
    dataset's own (after packing)."""
    have = meta["train_tokens"]
    if max_tokens <= have:
        return None
    msg = f"the largest run reads {max_tokens:,} tokens but {data_dir} holds {have:,} training tokens"
    n_files = training_files(meta)
    if n_files > 0:
        per_file = have / n_files
        msg += (f" ({n_files} training shard(s), ~{per_file / 1e6:.1f}M tokens each): prepare "
                f">= {math.ceil(max_tokens / per_file)} training shards (prepare_data.py --shards N)")
    else:
        msg += f": prepare {max_tokens / have:.1f}x more training data"
    return msg + ", or set ALLOW_REPEAT=1 to repeat data knowingly"


def achieved_rate(results):
    """(mean achieved FLOP/s per run of the rows in a results file, where it comes from), or (None, "")."""
    if not results:
        return None, ""
    rows, _ = read_rows(results)  # a torn last line: fit_laws.py reports those, the estimate skips them
    rates = [row["tokens_per_s"] * row["flops_per_token"] for row in rows
             if row.get("tokens_per_s") and row.get("flops_per_token")]
    if not rates:
        return None, ""
    return sum(rates) / len(rates), f"mean achieved rate of the {len(rates)} runs in {results}"


def plan_parser():
    """The flags of a plan line that fix its cost: the model, the horizon, the recipe and the loop counts (train.py's
    own, from flops.py, recipe.py and loops.py; train-only flags such as --eval-rows are passed over)."""
    parser = argparse.ArgumentParser(prog="flops.py --plan", add_help=False)
    flops.add_model_args(parser)
    add_horizon_args(parser)
    add_recipe_args(parser)
    add_loop_args(parser)
    return parser


def priced_line(parser, line, data_shape, strict):
    """(name, cfg, Horizon, its recipe, its FLOP budget, its LoopCounts) of one "name|train.py flags" plan line;
    ValueError naming the line."""
    name, _, flags = line.rstrip("\n").partition("|")
    args, _ = parser.parse_known_args(flags.split())
    if args.flops is None and args.tokens is None:
        raise ValueError(f"plan line {name!r} has no --flops or --tokens horizon")
    try:
        cfg = flops.config_from_args(args, *data_shape)
        recipe = recipe_from_args(args)
        return name, cfg, plan_horizon(args, cfg, recipe, strict), recipe, args.flops, loop_counts_from_args(args)
    except ValueError as e:
        raise ValueError(f"plan line {name!r}: {e}") from None


def price_plan(lines, data_dir, results, flops_per_s):
    """Price a sweep plan: one "name|train.py flags" line per run (sweep.sh writes them). Prints the table (each
    run's budget: C in FLOPs, or D/D0 for a token horizon; its N, tokens, batch and steps; its forward/backward
    compute F D and its measured compute, the optimiser's steps added: flops.measured_flops), the totals and a
    wall-time estimate; returns an exit status (2: the data is short). The vocabulary and sequence length are
    data_dir's meta.json's (without one, the flags', and the total says so). The largest run must read no more
    than the data's train_tokens (data_shortfall names the shards to prepare) unless ALLOW_REPEAT=1. The wall time
    is at flops_per_s, else at the mean achieved FLOP/s of the rows in `results`."""
    meta = read_data_meta(data_dir)
    data_shape = (None, None)  # the flags' vocabulary and sequence length unless the data has its own
    if meta:
        data_shape = (meta["vocab_size"], meta["seq_len"])
    parser = plan_parser()
    rows = [priced_line(parser, line, data_shape, meta is not None) for line in lines if line.strip()]
    if not rows:
        raise ValueError("no plan lines on stdin (expected 'name|train.py flags')")
    print(f"{'run':<30}{'r':>3}{'r_bwd':>6}{'s':>9}{'C':>10}{'D/D0':>7}{'N':>15}{'tokens D':>16}{'batch':>8}"
          f"{'steps':>8}{'F*D':>11}{'measured':>11}")
    totals = [0.0, 0.0]
    for name, cfg, horizon, recipe, budget, loops in rows:
        tokens = horizon.steps * horizon.batch_tokens
        per_token = expected_flops_per_token(cfg, loops)  # a sampled loop count: the expectation of F
        spent = [per_token * tokens, expected_measured_flops(cfg, loops, tokens, horizon.steps)]
        totals = [a + b for a, b in zip(totals, spent)]
        budget_text, level = "-", f"{horizon.tokens_target / recipe.d0:g}"
        if budget is not None:  # a FLOP budget; D/D0 is for a token horizon
            budget_text, level = f"{budget:.3g}", "-"
        print(f"{name:<30}{cfg.r:>3}{cfg.r_bwd:>6}{cfg.scale:>9g}{budget_text:>10}{level:>7}"
              f"{flops.param_counts(cfg)['n_params']:>15,}{tokens:>16,}{horizon.batch_tokens // cfg.seq_len:>8,}"
              f"{horizon.steps:>8,}{spent[0]:>11.3e}{spent[1]:>11.3e}")
    where_shape = ""
    if not meta:
        where_shape = f" (vocab/seq-len from flags: {data_dir or '--data'}/meta.json not found)"
    print(f"{len(rows)} runs, total compute {totals[0]:.3e} FLOPs{where_shape}, {totals[1]:.3e} measured "
          f"(with the optimiser)")
    if flops_per_s:
        rate, source = flops_per_s, "given --flops-per-s"
    else:
        rate, source = achieved_rate(results)
    if rate:
        print(f"estimated wall time {totals[0] / rate / 3600:,.1f} h at {rate:.3e} FLOP/s per run slot ({source})")
    else:
        print("estimated wall time: give --flops-per-s (e.g. 8 x 989e12 x MFU for one 8-GPU node) "
              "or run a few configurations first")
    largest = max(rows, key=lambda row: row[2].steps * row[2].batch_tokens)
    largest_tokens = largest[2].steps * largest[2].batch_tokens
    if meta:
        short = data_shortfall(largest_tokens, meta, data_dir)
        if short is None:
            print(f"data: {data_dir} holds {meta['train_tokens']:,} training tokens, the largest run "
                  f"({largest[0]}) reads {largest_tokens:,}")
        elif os.environ.get("ALLOW_REPEAT") == "1":
            print(f"data (ALLOW_REPEAT=1): {short.split(': prepare')[0]}; runs will repeat data")
        else:
            print(f"flops.py: {short}", file=sys.stderr)
            return 2
    return 0


# ----------------------------------------------------------------------------------------------
# The command line (sweep.sh's --status, --slurm and its fit job)

def main(argv=None):
    """--status, --todo, --missing or --plan for the plan lines on stdin; a bad plan line or missing data: one
    line, exit 2. --plan is flops.py --plan's pricer (flops.py hands its process over to this one)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    one_line_errors(parser, "sweep_state.py")
    parser.add_argument("--data", required=True, help="the sweep's prepared data (run identities depend on it)")
    parser.add_argument("--out", default="", help="the sweep's OUT: results.jsonl, runs/, logs/, slurm/")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--plan", action="store_true", help="price the plan (what flops.py --plan prints)")
    mode.add_argument("--status", action="store_true", help="the table of every planned run")
    mode.add_argument("--todo", action="store_true", help="the names of the runs not done, queued or running")
    mode.add_argument("--missing", action="store_true", help="the planned runs without a row, and why")
    parser.add_argument("--device", choices=DEVICES, default="cpu", help="--todo: the device the runs will train on")
    parser.add_argument("--world", type=positive_int, default=1,
                        help="--todo: the ranks of each run (the batch must split)")
    parser.add_argument("--results", default="", help="--plan: the rows whose achieved FLOP/s estimate the time")
    parser.add_argument("--flops-per-s", type=float, default=None, help="--plan: FLOP/s per run slot")
    args = parser.parse_args(argv)
    if args.plan:
        try:
            return price_plan(sys.stdin, args.data, args.results, args.flops_per_s)
        except ValueError as e:
            fail("flops.py", str(e))
    if not args.out:
        parser.error("--out is required for --status, --todo and --missing")
    out = Path(args.out)
    try:
        devices = (args.device,) if args.todo else DEVICES
        planned = plan_runs(sys.stdin, args.data, devices, args.world)
    except ValueError as e:
        fail("sweep_state.py", str(e))
    rows = finished_rows(out / "results.jsonl")
    tasks, fits, note = slurm_tasks(out)
    states = [state_of(run, out, rows, tasks) for run in planned]
    if args.todo:
        for s in states:
            if s.state not in ("done", "running", "queued"):
                print(s.run.name)
        return 0
    if args.missing:
        states = [s for s in states if s.state != "done"]
        print_table(states, f"{len(states)} of {len(planned)} planned runs have no row in {out / 'results.jsonl'}")
        return 0
    print_table(states, f"sweep {out}")
    for line in footer(states, out / "results.jsonl", fits) + [note]:
        if line:
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
