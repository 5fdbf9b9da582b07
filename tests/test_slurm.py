"""sweep.sh on a real SLURM (tests/slurm_cluster.py: munged, slurmctld and two one-CPU slurmd on this
machine): the smoke grid as one array job gives the rows of the same grid run locally, then the fit; a task
requeued by SLURM or by itself at its time-limit signal resumes to the uninterrupted run's loss, a task whose
train.py refuses its input is not requeued; --status follows the array; a 2-node run (two torchrun agents, a
c10d rendezvous over 127.0.0.1, gloo) gives the one-process row. --status also reads a sweep without SLURM.
Waits have timeouts that only catch a hang: nothing here asserts how long anything took. Every test here is
slow (a cluster, runs that train): `-m "not slow"` leaves the file out."""
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nanoloop import sweep_state
from conftest import REPO, sweep
from slurm_cluster import Cluster, job_steps
from test_sweep import plan_rows

# one pytest-xdist worker holds the cluster and the session's smoke sweep, which test_sweep also reads
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("smoke_sweep")]

PLAN = plan_rows("smoke")[0]
LONGEST = sorted(PLAN, key=lambda run: -run["steps"])  # the runs with the most steps: time to interrupt them
SHORTEST = min(PLAN, key=lambda run: run["steps"])["name"]


@pytest.fixture(scope="module")
def cluster():
    if not shutil.which("slurmctld") or not shutil.which("munged"):
        pytest.fail("SLURM is not installed: run bash dev/install_test_deps.sh (Debian's slurm-wlm and munge)")
    started = Cluster().start()
    yield started
    started.stop()
    alive = [proc.pid for proc in started.daemons if proc.poll() is None]
    assert not alive and not job_steps() and not started.root.exists(), (alive, job_steps())


@pytest.fixture(scope="module")
def local_sweep(smoke_sweep):
    """The smoke grid run locally, two runs at a time (conftest's session sweep, shared with test_sweep's
    end-to-end test): the rows every SLURM sweep here must reproduce. Read only: seeded_out copies it."""
    out, _ = smoke_sweep
    return out


def rows_by_name(out):
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return {Path(row["out"]).name: row for row in rows}


def logged_losses(run_dir):
    return {rec["step"]: rec["loss"] for rec in map(json.loads, (run_dir / "log.jsonl").read_text().splitlines())}


def resumed_log_is_the_uninterrupted_one(resumed, uninterrupted, step, tol=0.0):
    """The log of a run resumed after `step` holds every step the uninterrupted run logged, at its loss (within
    tol), and besides them only the first step after the resume (train.py logs each process's first step)."""
    got, want = logged_losses(resumed), logged_losses(uninterrupted)
    assert set(got) - set(want) <= {step + 1} and set(want) <= set(got), (sorted(got), sorted(want))
    assert all(abs(got[k] - want[k]) <= tol for k in want), (got, want)


def seeded_out(local, tmp_path, drop=(), damaged=()):
    """A copy of the local sweep with the runs in `drop` taken out (row, folder, log), and those in `damaged`
    left with a damaged checkpoint instead of a final.json (train.py refuses it: exit 2, bad input)."""
    out = tmp_path / "sweep"  # alone in tmp_path: no sibling grid offers its runs for --reuse-from
    # Not the local sweep's fit/: what the fit job writes there is this sweep's own.
    shutil.copytree(local, out, ignore=lambda folder, names: ["fit"] if Path(folder) == local else [])
    rows = (out / "results.jsonl").read_text().splitlines()
    kept = [line for line in rows if Path(json.loads(line)["out"]).name not in (*drop, *damaged)]
    (out / "results.jsonl").write_text("".join(line + "\n" for line in kept))
    for name in drop:
        shutil.rmtree(out / "runs" / name)
    for name in damaged:
        (out / "runs" / name / "final.json").unlink()
        (out / "runs" / name / "ckpt.pt").write_bytes(b"not a checkpoint")
    for name in (*drop, *damaged):
        (out / "logs" / f"{name}.log").unlink()
    return out


def submit(cluster, sample_data, out, *args, **env):
    """sweep.sh --slurm ARGS: (the array job, the fit job, the array's run names in task order). With --no-fit
    the fit job only writes fit/missing.txt (the runs without a row): what all but the first test read of it."""
    proc = sweep("--grid", "smoke", "--slurm", *args,
                 env={**cluster.env, "OUT": str(out), "DATA": str(sample_data), **env})
    array, fit = re.search(r"as array job (\d+).*the fit as job (\d+)", proc.stdout).groups()
    record = (out / "slurm" / "jobs.txt").read_text().splitlines()[-1].split()
    names = [line.split("|")[0] for line in Path(REPO / record[2]).read_text().splitlines()]
    return array, fit, names


def jobs(cluster, job):
    """scontrol's record of a job (or of every task of an array job), as {field: value} dicts."""
    lines = cluster.run("scontrol", "show", "job", "-o", job).stdout.splitlines()
    return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in lines]


def wait_for(condition, what, timeout=600):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.05)


def wait_until_over(cluster, job):
    wait_for(lambda: all(j["JobState"] in ("COMPLETED", "FAILED", "CANCELLED") for j in jobs(cluster, job)),
             f"job {job} to end")


def training(run_dir):
    """True once train.py has logged its first step (its SIGTERM handler is in place: it can checkpoint)."""
    log = run_dir / "log.jsonl"
    return log.is_file() and bool(log.read_text().strip())


def status(out, sample_data, env=None):
    return sweep("--grid", "smoke", "--status", env={**(env or {}), "OUT": str(out), "DATA": str(sample_data)}).stdout


def status_line(table, name):
    return next(line for line in table.splitlines() if line.startswith(name + " "))


def status_while_training(out, sample_data, name, env=None):
    """The --status table while `name` trains. A smoke run trains for seconds, about as long as --status takes
    to start, so its train.py (the pid holding its folder's lock) is paused while --status reads: still a
    live process that SLURM counts as running, still at the step it logged last."""
    run_dir = out / "runs" / name
    wait_for(lambda: training(run_dir), f"{name} to train")
    pid = sweep_state.lock_holder(run_dir / ".lock")
    os.kill(pid, signal.SIGSTOP)
    try:
        return status(out, sample_data, env)
    finally:
        os.kill(pid, signal.SIGCONT)


# ----------------------------------------------------------------------------------------------

def test_the_smoke_grid_as_one_array_job_gives_the_local_rows_then_the_fit(cluster, local_sweep, sample_data, tmp_path):
    out = tmp_path / "sweep"
    array, fit, names = submit(cluster, sample_data, out, MAX_RUNNING="2")
    assert names == [run["name"] for run in PLAN]  # one task per planned run
    wait_until_over(cluster, fit)
    tasks = jobs(cluster, array)
    assert len(tasks) == len(PLAN) and all(t["JobState"] == "COMPLETED" and t["Restarts"] == "0" for t in tasks)
    (fit_job,) = jobs(cluster, fit)
    assert fit_job["JobState"] == "COMPLETED" and fit_job["StartTime"] >= max(t["EndTime"] for t in tasks)
    got, want = rows_by_name(out), rows_by_name(local_sweep)
    assert {n: (r["run_id"], r["val_loss"]) for n, r in got.items()} == \
           {n: (r["run_id"], r["val_loss"]) for n, r in want.items()}
    assert math.isfinite(json.loads((out / "fit" / "fit.json").read_text())["joint"]["phi"])
    assert (out / "fit" / "missing.txt").read_text().startswith(f"0 of {len(PLAN)} planned runs have no row")
    assert all((out / "logs" / f"{name}.log").read_text().rstrip().endswith("exit 0") for name in names)
    # Resubmitting the finished grid submits nothing: train.py's run identities are all in the results.
    again = sweep("--grid", "smoke", "--slurm", env={**cluster.env, "OUT": str(out), "DATA": str(sample_data)})
    assert "nothing to submit" in again.stdout and len((out / "slurm" / "jobs.txt").read_text().splitlines()) == 1


def test_requeued_tasks_resume_to_the_uninterrupted_loss_and_a_bad_input_task_is_not_requeued(
        cluster, local_sweep, sample_data, tmp_path):
    """A (requeued by SLURM: scontrol requeue) and B (the time-limit signal, --signal=B:USR1, which sbatch
    sends the batch shell: the task checkpoints and requeues itself) end where the uninterrupted local runs
    end; C's train.py exits 2 (a damaged checkpoint) and its task fails once, never requeued."""
    a, b = LONGEST[0]["name"], LONGEST[1]["name"]
    c = SHORTEST
    out = seeded_out(local_sweep, tmp_path, drop=(a, b), damaged=(c,))
    array, fit, names = submit(cluster, sample_data, out, "--no-fit", MAX_RUNNING="2")  # fit job: missing.txt only
    assert sorted(names) == sorted((a, b, c))
    wait_for(lambda: training(out / "runs" / a), f"{a} to train")
    cluster.run("scontrol", "requeue", f"{array}_{names.index(a)}")
    wait_for(lambda: training(out / "runs" / b), f"{b} to train")
    cluster.run("scancel", "--batch", "--signal=USR1", f"{array}_{names.index(b)}")
    wait_until_over(cluster, fit)
    task = {name: jobs(cluster, f"{array}_{names.index(name)}")[0] for name in names}
    local, rows = rows_by_name(local_sweep), rows_by_name(out)
    for name, requeued_by in ((a, "scontrol requeue"), (b, "the time-limit signal")):
        log = (out / "logs" / f"{name}.log").read_text()
        stopped = re.search(r"interrupted at step (\d+)/(\d+)", log)
        step, steps = int(stopped[1]), int(stopped[2])
        assert 0 < step < steps and f"ckpt.pt at step {step}/{steps}" in log, log[-3000:]
        assert task[name]["JobState"] == "COMPLETED" and task[name]["Restarts"] == "1"
        assert rows[name]["val_loss"] == local[name]["val_loss"] and rows[name]["run_id"] == local[name]["run_id"]
        resumed_log_is_the_uninterrupted_one(out / "runs" / name, local_sweep / "runs" / name, step)
        print(f"\n{name}, {requeued_by} at step {step}/{steps}: val loss {rows[name]['val_loss']!r} after resuming, "
              f"{local[name]['val_loss']!r} uninterrupted")
    assert "time limit near: requeued" in (out / "logs" / f"{b}.log").read_text()
    assert (task[c]["JobState"], task[c]["Restarts"], task[c]["ExitCode"]) == ("FAILED", "0", "2:0")
    c_log = (out / "logs" / f"{c}.log").read_text()
    assert c_log.count("] slurm job ") == 1 and c_log.rstrip().endswith("exit 2") and c not in rows
    missing = (out / "fit" / "missing.txt").read_text()
    assert missing.startswith(f"1 of {len(PLAN)} planned runs") and "cannot be loaded as a checkpoint" in missing


def test_status_shows_done_running_queued_and_failed_while_the_array_runs(cluster, local_sweep, sample_data, tmp_path):
    """One task at a time: C fails (a damaged checkpoint), A trains, D waits. Then the array is cancelled:
    A checkpoints (stopped), D never started, and the fit job (afterany) lists the three runs it lacks."""
    a, d = LONGEST[0]["name"], LONGEST[1]["name"]
    c = SHORTEST
    out = seeded_out(local_sweep, tmp_path, drop=(a, d), damaged=(c,))
    array, fit, names = submit(cluster, sample_data, out, "--no-fit", MAX_RUNNING="1")  # fit job: missing.txt only
    assert names.index(c) < names.index(a) < names.index(d)  # plan order: C fails before A starts
    table = status_while_training(out, sample_data, a, cluster.env)
    print("\n" + table)
    local = rows_by_name(local_sweep)
    for name in set(local) - {a, c, d}:
        assert re.match(rf"{name} +done +val loss {local[name]['val_loss']:.4f}$", status_line(table, name))
    assert re.match(rf"{a} +running +step \d+/\d+, [\d,]+ tok/s, ETA .+ \(job {array}_{names.index(a)}\)$",
                    status_line(table, a))
    assert re.match(rf"{d} +queued +job {array}_{names.index(d)}: pending \(JobArrayTaskLimit\)$", status_line(table, d))
    assert re.match(rf"{c} +failed +exit 2: train.py: .*ckpt.pt cannot be loaded", status_line(table, c))
    assert "12 runs: 9 done, 1 running, 1 queued, 0 stopped, 1 failed, 0 not started" in table
    assert re.search(r"FLOPs: \S+ of \S+ done \(\d+%\); ETA .+ \(the 1 running run\(s\)\)", table)
    assert f"fit: job {fit} pending (Dependency)" in table
    cluster.run("scancel", array)
    wait_until_over(cluster, fit)
    after = status(out, sample_data, cluster.env)
    assert re.match(rf"{a} +stopped +checkpoint at step \d+/\d+; resubmit to resume$", status_line(after, a))
    assert re.match(rf"{d} +not started$", status_line(after, d))
    assert "12 runs: 9 done, 0 running, 0 queued, 1 stopped, 1 failed, 1 not started" in after
    missing = (out / "fit" / "missing.txt").read_text()
    assert missing.startswith(f"3 of {len(PLAN)} planned runs") and all(name in missing for name in (a, c, d))


def test_a_two_node_run_gives_the_one_process_row_and_resumes(cluster, local_sweep, sample_data, tmp_path):
    """NODES_PER_RUN=2: srun starts a torchrun agent on n1 and on n2 (both this machine), which meet at a c10d
    rendezvous on the first node's address, 127.0.0.1; requeued while it trains, it resumes on two nodes."""
    a = LONGEST[0]["name"]
    out = seeded_out(local_sweep, tmp_path, drop=(a,))
    array, fit, names = submit(cluster, sample_data, out, "--no-fit", NODES_PER_RUN="2")
    wait_for(lambda: training(out / "runs" / a), f"{a} to train")
    cluster.run("scontrol", "requeue", f"{array}_0")
    wait_until_over(cluster, fit)
    (task,) = jobs(cluster, f"{array}_0")
    assert task["JobState"] == "COMPLETED" and task["NumNodes"] == "2" and task["Restarts"] == "1"
    log = (out / "logs" / f"{a}.log").read_text()
    assert "--nnodes=2 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:" in log and "resumed " in log
    one, two = rows_by_name(local_sweep)[a], rows_by_name(out)[a]
    assert two["run_id"] == one["run_id"] and (two["world_size"], one["world_size"]) == (2, 1)
    assert (two["steps"], two["tokens"]) == (one["steps"], one["tokens"])
    assert abs(two["val_loss"] - one["val_loss"]) < 1e-4  # as train.py's two-rank test: the same sums, reordered
    step = int(re.search(r"interrupted at step (\d+)/", log)[1])
    resumed_log_is_the_uninterrupted_one(out / "runs" / a, local_sweep / "runs" / a, step, tol=1e-4)


def test_status_reads_a_sweep_without_slurm(local_sweep, sample_data, tmp_path):
    """No SLURM: a run that a live train.py trains (it holds its folder's lock) is running, a run never tried
    is not started, the others done; an empty OUT or an unknown grid is one line and exit 2."""
    a, d = LONGEST[0]["name"], LONGEST[1]["name"]
    out = seeded_out(local_sweep, tmp_path, drop=(a, d))
    command = next(line for line in sweep("--grid", "smoke", "--print", env={"OUT": str(out), "DATA": str(sample_data)})
                   .stdout.splitlines() if f"/runs/{a} " in line)
    trainer = subprocess.Popen([sys.executable, *command.split()[1:]], cwd=REPO, stdout=subprocess.DEVNULL,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))  # as the local sweep ran it
    try:
        table = status_while_training(out, sample_data, a)
    finally:
        trainer.wait(timeout=600)
    assert re.match(rf"{a} +running +step \d+/\d+, [\d,]+ tok/s, ETA .+$", status_line(table, a))
    assert re.match(rf"{d} +not started$", status_line(table, d))
    assert "12 runs: 10 done, 1 running, 0 queued, 0 stopped, 0 failed, 1 not started" in table
    done = status(out, sample_data)
    assert re.match(rf"{a} +done +val loss {rows_by_name(local_sweep)[a]['val_loss']:.4f}$", status_line(done, a))
    empty = sweep("--grid", "smoke", "--status", env={"OUT": str(tmp_path / "none")}, check=False)
    unknown = sweep("--grid", "nope", "--status", env={"OUT": str(out)}, check=False)
    for proc, says in ((empty, "holds no sweep yet"), (unknown, "unknown grid 'nope'")):
        assert proc.returncode == 2 and says in proc.stderr and len(proc.stderr.splitlines()) == 1


@pytest.mark.parametrize("env, says", [({"NODES_PER_RUN": "0"}, "NODES_PER_RUN must be >= 1"),
                                       ({"MAX_RUNNING": "two"}, "MAX_RUNNING must be a whole number"),
                                       ({"GPUS_PER_RUN": "-1"}, "GPUS_PER_RUN must be a whole number"),
                                       ({"NODES_PER_RUN": "3"}, "do not split over 3 ranks")])
def test_bad_cluster_settings_are_one_line_before_anything_is_submitted(cluster, sample_data, tmp_path, env, says):
    proc = sweep("--grid", "smoke", "--slurm", check=False,
                 env={**cluster.env, "OUT": str(tmp_path / "sweep"), "DATA": str(sample_data), **env})
    assert proc.returncode == 2 and says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "sweep" / "slurm" / "jobs.txt").exists() and cluster.queue_empty()


def test_install_test_deps_says_one_line_when_slurm_is_there():
    """dev/install_test_deps.sh (run first by .ci/run) installs slurm-wlm, munge and g++ only when missing."""
    proc = subprocess.run(["bash", "dev/install_test_deps.sh"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout == "install_test_deps.sh: slurm-wlm, munge and g++ are installed\n"
