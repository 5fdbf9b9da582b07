"""
Training curves of a grid: curves.png, which fit_laws.py --plots writes beside its figures of final losses.
Every run's training loss against the tokens it has seen (top row) and the FLOPs it has spent (bottom row),
one column per budget, one colour per architecture (its r), one line style per width, and the run's
validation loss marked where the run ends. Nothing here needs wandb.

A run's curve comes from log.jsonl in its folder (train.py writes a record every --log-every steps), else
from the progress lines of its sweep log (sweep.sh keeps OUT/logs/<run>.log; losses to 4 decimals), where a
"reused:" line leads to the sibling grid that trained it. Either is used only if it is the row's training:
log.jsonl beside a run.json of the row's run_id; a sweep log's segment headed by the row's run name (and
run_id), ending in its final val loss. Every curve must reach the row's last step. The figure says which
source each curve has and how many runs have none.

    curves = grid_curves(rows, "runs/cpu-micro/results.jsonl")   # [(row, {step: loss}, source)], notes
"""
import re
from pathlib import Path

from common import DataError, load_json, read_rows
from laws import MARKER_OF_R, arch_key, arch_label, budget_levels

LOG_JSONL = "log.jsonl"
SWEEP_LOG = "sweep log"
# train.py's lines (train.print_header, log_progress, finish; a test parses a real run's output with these)
HEADER_LINE = re.compile(r"^(\S+): N [\d.]+M \(.*?(?:, run_id ([0-9a-f]{12}))?$")
PROGRESS_LINE = re.compile(r"^step +(\d+)/(\d+) \| loss (\S+) \| lrm ")
FINAL_LINE = re.compile(r"^final val loss (\S+) nats/token")
REUSED_LINE = re.compile(r"^reused: (\S+)$")
COMMAND_LINE = re.compile(r"^\[\d{4}-\d\d-\d\dT[\d:]+Z\] ")  # sweep.sh's line before each attempt
MAX_REUSE_HOPS = 3  # hyper reuses from trunc, which reused from the base grid
ZOOM_FROM = 0.1  # the y-axis shows each run's loss from 10% of its steps on (loss_range)
# one line style per width of a budget, narrowest first (the paper grid has at most 6 widths a budget)
WIDTH_STYLES = ["-", "--", "-.", ":", (0, (7, 2, 1, 2, 1, 2)), (0, (1, 3))]


# ----------------------------------------------------------------------------------------------
# A run's curve, from its folder or its sweep log

def curve_from_folder(folder, row):
    """{step: loss} of log.jsonl in a run folder whose run.json is the row's run; None if it is not there.
    A step logged twice (steps repeated after a resume from an earlier checkpoint) keeps its last record."""
    folder = Path(folder)
    if not (folder / LOG_JSONL).is_file() or not (folder / "run.json").is_file():
        return None
    try:
        record = load_json(folder / "run.json", "run.json")
        records = read_rows(folder / LOG_JSONL)[0]
    except DataError:
        return None
    if not isinstance(record, dict) or record.get("run_id") != row.get("run_id"):
        return None
    return {int(rec["step"]): float(rec["loss"]) for rec in records if "step" in rec and "loss" in rec}


def parse_sweep_log(path, row):
    """({step: loss}, final val loss text, reused-from path) of the row's training in a sweep log: the
    progress lines after a header naming the row's run (and run_id, where both have one); later lines win."""
    want_id = str(row.get("run_id") or "")[:12]
    steps, final, donor, ours = {}, None, None, False
    for line in Path(path).read_text(errors="replace").splitlines():
        header, progress = HEADER_LINE.match(line), PROGRESS_LINE.match(line)
        final_line, reused = FINAL_LINE.match(line), REUSED_LINE.match(line)
        if COMMAND_LINE.match(line):
            ours = False
        elif header:
            same_id = not (want_id and header.group(2)) or header.group(2) == want_id
            ours = header.group(1) == row.get("run") and same_id
        elif progress and ours:
            steps[int(progress.group(1))] = float(progress.group(3))
        elif final_line and ours:
            final = final_line.group(1)
        elif reused:
            donor = Path(reused.group(1))
    return steps, final, donor


def run_curve(row, grid_dir, name, written=None, hops=0):
    """({step: loss}, source) of a row's run called `name` in the sweep OUT grid_dir (or at `written`, the
    folder as a log line or the row names it), or (None, None). Follows "reused:" to the sibling grid."""
    for folder in (written, Path(grid_dir) / "runs" / name):
        steps = curve_from_folder(folder, row) if folder else None
        if steps and max(steps) == row.get("steps"):
            return steps, LOG_JSONL
    log = Path(grid_dir) / "logs" / f"{name}.log"
    if not log.is_file():
        return None, None
    steps, final, donor = parse_sweep_log(log, row)
    if steps and max(steps) == row.get("steps") and final == f"{row['val_loss']:.4f}":
        return steps, SWEEP_LOG
    if donor is not None and hops < MAX_REUSE_HOPS:  # donor: <sibling OUT>/runs/<name>, beside grid_dir
        return run_curve(row, Path(grid_dir).parent / donor.parent.parent.name, donor.name, donor, hops + 1)
    return None, None


def grid_curves(rows, results):
    """[(row, {step: loss}, source)] of the rows of a results file whose training curve is found (see the
    module's docstring), and one note for the runs that have none."""
    grid_dir = Path(results).parent
    curves, missing = [], []
    for row in rows:
        steps, source = None, None
        if row.get("out") and row.get("steps") and row.get("batch_tokens"):
            steps, source = run_curve(row, grid_dir, Path(row["out"]).name, Path(row["out"]))
        if steps:
            curves.append((row, steps, source))
        else:
            missing.append(Path(str(row.get("out") or row.get("run") or "?")).name)
    notes = []
    if missing:
        listed = ", ".join(missing[:4])
        if len(missing) > 4:
            listed += ", ..."
        notes.append(f"no training curve for {len(missing)} of {len(rows)} runs (no log.jsonl of theirs, no "
                     f"sweep log of theirs in {grid_dir / 'logs'}): {listed}")
    return curves, notes


# ----------------------------------------------------------------------------------------------
# The figure

def sources_text(curves, n_rows):
    """What the curves were read from, for the figure's title."""
    counts = {LOG_JSONL: 0, SWEEP_LOG: 0}
    for _, _, source in curves:
        counts[source] += 1
    parts = []
    if counts[LOG_JSONL]:
        parts.append(f"the run folders' log.jsonl for {counts[LOG_JSONL]} runs")
    if counts[SWEEP_LOG]:
        parts.append(f"the sweep logs' progress lines (losses to 4 decimals) for {counts[SWEEP_LOG]} runs")
    text = "curves from " + " and ".join(parts)
    if len(curves) < n_rows:
        text += f"; {n_rows - len(curves)} of {n_rows} runs have none"
    return text


def loss_range(curves):
    """y-limits on the part of training the runs differ in: from the lowest loss (training or validation)
    to the highest after the first ZOOM_FROM of each run (the fall from ln V above it is alike for all)."""
    low, high = [], []
    for row, steps, _ in curves:
        low += [min(steps.values()), row["val_loss"]]
        high.append(max(loss for step, loss in steps.items() if step >= ZOOM_FROM * max(steps)))
    margin = 0.04 * (max(high) - min(low))
    return min(low) - margin, max(high) + margin


def draw_run(axes, row, steps, colour, style):
    """One run in its column: the loss against tokens (axes[0]) and FLOPs (axes[1]), its val loss at the end."""
    order = sorted(steps)
    tokens = [step * row["batch_tokens"] for step in order]
    loss = [steps[step] for step in order]
    marker = MARKER_OF_R.get(int(row["r"]), "v")
    for ax, scale in zip(axes, (1.0, float(row["flops_per_token"]))):
        x = [t * scale for t in tokens]
        ax.plot(x, loss, color=colour, ls=style, lw=1.1, alpha=0.9)
        ax.scatter([x[-1]], [row["val_loss"]], color=colour, marker=marker, s=36, edgecolors="black",
                   linewidths=0.5, zorder=3)


def plot_curves(plt, curves, title, n_rows):
    """The figure of grid_curves' curves: a column per budget, tokens on top and FLOPs below."""
    from matplotlib.lines import Line2D
    rows = [row for row, _, _ in curves]
    level, budgets = budget_levels([row["flops_budget"] for row in rows])
    archs = sorted({arch_key(row) for row in rows})
    colour = {key: f"C{i}" for i, key in enumerate(archs)}
    fig, axes = plt.subplots(2, len(budgets), figsize=(4.4 * len(budgets), 8.2), sharey=True, squeeze=False)
    for j, C in enumerate(budgets):
        widths = sorted({row["d_model"] for row, lv in zip(rows, level) if lv == j})
        for (row, steps, _), lv in zip(curves, level):
            if lv == j:
                style = WIDTH_STYLES[widths.index(row["d_model"]) % len(WIDTH_STYLES)]
                draw_run(axes[:, j], row, steps, colour[arch_key(row)], style)
        handles = [Line2D([], [], color="0.3", ls=WIDTH_STYLES[k % len(WIDTH_STYLES)], label=f"d = {d:g}")
                   for k, d in enumerate(widths)]
        axes[0][j].legend(handles=handles, fontsize=7, title="width", title_fontsize=7, loc="upper right")
        axes[0][j].set(title=f"C = {C:.3g} FLOPs", xlabel="tokens seen", xlim=(0, None))
        axes[1][j].set(xlabel="FLOPs spent (F x tokens)", xlim=(0, None))
        for ax in axes[:, j]:
            ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 0))  # 1e4 tokens or 1e12 FLOPs: no long labels
    axes[0][0].set_ylim(*loss_range(curves))
    for ax in axes[:, 0]:
        ax.set_ylabel("training loss (nats/token)")
    handles = [Line2D([], [], color=colour[key], marker=MARKER_OF_R.get(key[0], "v"), markeredgecolor="black",
                      label=arch_label(key)) for key in archs]
    handles.append(Line2D([], [], ls="", marker="o", color="0.6", markeredgecolor="black",
                          label="marker: the run's final validation loss"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.suptitle(f"{title}: training loss of every run, one column per budget (line style = width; y from "
                 f"{100 * ZOOM_FROM:.0f}% of each run's steps on)\n{sources_text(curves, n_rows)}", fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))
    return fig
