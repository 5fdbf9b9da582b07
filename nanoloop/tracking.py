"""
Where a run's numbers go as it trains: log.jsonl in its folder (one JSON record per logged step), and, with
--wandb PROJECT, a Weights & Biases run too. wandb is optional (requirements-dev.txt) and imported only when
--wandb is given, as nanochat's --run names a wandb run and is a no-op otherwise. train.py and evaluate.py
both log through here, so a training run and its evaluation land in one wandb run.

    WANDB_MODE=offline python train.py ... --wandb nanoloop    # no account: `wandb sync RUN/wandb/offline-run-*`

One wandb run per training run: its id is the run_id's first 12 hex digits (the ones train.py prints), so
--resume continues the same wandb run instead of starting another; its name is the run's name, its group
--wandb-group (sweep.sh passes the grid), its config the run's identity, its history the progress line's
numbers at every logged step, its summary the results row. evaluate.py adds one summary entry per task and
loop count, eval/<task>/r<r>, to the run it evaluates. Only rank 0 logs. Without wandb installed --wandb is one
line and exit 2 (wandb_project), and so is a run wandb cannot start (start_wandb), before the first step; nothing
of this enters the run identity. How tests/test_tracking.py reads wandb's offline files back, and what it
measured about them: dev/README.md, "tracking.py and the training curves".
"""
import argparse
import json
import re
from pathlib import Path

from nanoloop.common import DataError

# 12 hex digits are 48 bits: 10^4 runs in one project collide with probability ~2e-7. The same identity
# trained again in another folder (another OUT) continues the same wandb run: give it another project.
WANDB_ID_HEX = 12
# wandb refuses / \ # ? % : in a project name; sweep.sh also pastes it into a shell command.
PROJECT_NAME = re.compile(r"[A-Za-z0-9._-]+")


def wandb_project(text):
    """--wandb's type: a project name, with wandb importable; else argparse's one-line error, before any work."""
    if not PROJECT_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a wandb project name (letters, digits, '.', '_', '-')")
    try:
        import wandb  # noqa: F401 (only checked here; start_wandb uses it)
    except ImportError as e:
        raise argparse.ArgumentTypeError(f"wandb is not installed ({e}): pip install -r requirements-dev.txt, "
                                         f"or leave out --wandb") from None
    return text


def add_args(group):
    """--wandb and --wandb-group, in train.py's and evaluate.py's argparse group `group`."""
    group.add_argument("--wandb", type=wandb_project, default=None, metavar="PROJECT",
                       help="also log to this Weights & Biases project (wandb; WANDB_MODE=offline: no account)")
    group.add_argument("--wandb-group", default=None, metavar="GROUP",
                       help="the wandb run's group (sweep.sh passes the grid)")


def start_wandb(project, group, run_id, name, config, folder):
    """The wandb run of run_id, created or continued (resume="allow"), its files under folder/wandb; None
    without a project. A run wandb cannot start (no API key, no network) is a DataError, before any step."""
    if not project:
        return None
    import wandb
    try:
        return wandb.init(project=project, group=group, id=run_id[:WANDB_ID_HEX], name=name, config=config,
                          resume="allow", dir=str(folder))
    except Exception as e:  # wandb raises many kinds; all mean "it cannot log there"
        reason = " ".join(str(e).split())[:200]
        raise DataError(f"--wandb {project}: wandb could not start run {run_id[:WANDB_ID_HEX]} ({type(e).__name__}: "
                        f"{reason}); WANDB_MODE=offline logs without an account") from None


class RunLog:
    """A training run's log: log.jsonl in `folder`, appended to (a resumed run continues it) with every record
    one whole line, and the run's wandb run when `project` is given. The file is opened first, so a full disk
    fails before a wandb run is started."""

    def __init__(self, folder, project=None, group=None, run_id="", name=None, identity=None):
        self.file = open(Path(folder) / "log.jsonl", "a", buffering=1)  # line-buffered: whole lines
        self.wandb_run = start_wandb(project, group, run_id, name, identity, folder)

    def write(self, record):
        """One logged step, {"step": ..., "loss": ..., ...}: a line, and the wandb history at that step."""
        self.file.write(json.dumps(record) + "\n")
        if self.wandb_run is not None:
            metrics = {k: v for k, v in record.items() if k not in ("step", "steps")}  # steps: in the config
            self.wandb_run.log(metrics, step=record["step"], commit=True)  # now: the last step before the summary

    def close(self, row):
        """The finished run: its results row becomes the wandb summary, then both are closed."""
        self.file.close()
        if self.wandb_run is not None:
            self.wandb_run.summary.update(row)
            self.wandb_run.finish()


class EvalLog:
    """evaluate.py's rows of one finished run, added to that run's wandb summary (a no-op without --wandb):
    eval/<task>/r<r> holds the row. The wandb files go under `folder` (the --results file's), so evaluate.py
    writes nothing into the run folders it reads."""

    def __init__(self, project, group, run, folder):
        self.wandb_run = start_wandb(project, group, run["run_id"], run["run_name"], None, folder)

    def write(self, row):
        if self.wandb_run is not None:
            self.wandb_run.summary.update({f"eval/{row['task']}/r{row['r']}": row})

    def close(self):
        if self.wandb_run is not None:
            self.wandb_run.finish()
