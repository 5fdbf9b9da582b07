"""
Every figure fit_laws.py --plots draws: the fits' figures from an analysis, and the grid's training curves
from the runs' logs. One module because fit_laws.py's make_plots draws both into one folder and they share
its colours, markers and labels (laws.MARKER_OF_R, arch_label).

The fits' figures: fit_laws.py --plots DIR draws them from an analysis. For an iso-depth sweep (paper §4.2-4.3)
isoflop.png (each architecture's runs and law per budget), pred_vs_actual.png, frontier.png (L*, N*, D* per
budget) and curves.png (the runs' training curves, below); for the truncate-or-not law (Truncate or Not? §4,
App. C-D) tb_fit.png (the law against every configuration, fitted and test), tb_holdouts.png (the held-out errors of
the bounded and the power-law gain, their Tables 7-8), tb_g_hat.png (g-hat against g(T, B), their Figure 6) and
tb_frontiers.png (the separately fitted per-setting laws' compute-optimal frontiers, their Figures 10-11).
matplotlib is imported by make_plots, on its Agg backend (files, no screen).

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
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nanoloop import truncate_law
from nanoloop.common import DataError, load_json, read_rows
from nanoloop.laws import (MARKER_OF_R, arch_key, arch_label, budget_levels, by_arch, column, family_for_group,
                           frontier_points, law_loss)

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


@dataclass
class BudgetColours:
    """Each run's budget (its index into `budgets`) and the colour of each budget, shared by the figures."""
    level: list
    budgets: list
    colours: list

    def of_runs(self, rows, key):
        """The budget colour of each run of architecture `key`, in by_arch's order."""
        return [self.colours[lv] for row, lv in zip(rows, self.level) if arch_key(row) == key]


def plot_isoflop(plt, analysis, rows, by_budget, title):
    """One panel per architecture: its runs (colour = budget), its own law along the width family at
    D = C / F(N) for every budget, and the law's compute-optimal N* (stars); y limited to the runs."""
    from matplotlib.lines import Line2D
    groups = by_arch(rows)
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 4.4), sharey=True, squeeze=False)
    for ax, (key, group_rows) in zip(axes[0], groups.items()):
        N_runs = column(group_rows, "n_params")
        ax.scatter(N_runs, column(group_rows, "val_loss"), c=by_budget.of_runs(rows, key),
                   marker=MARKER_OF_R.get(key[0], "v"), edgecolors="black", linewidths=0.4, zorder=3)
        fit, family = analysis["per_arch"].get(key), family_for_group(group_rows)
        if fit is not None and fit["converged"] and family is not None:
            N = np.geomspace(0.6 * N_runs.min(), 1.6 * N_runs.max(), 200)
            N = N[(N >= family["N"][0]) & (N <= family["N"][-1])]
            for j, C in enumerate(by_budget.budgets):
                D = C / np.interp(N, family["N"], family["F"])
                ax.plot(N, law_loss(fit, N, 0, 1, D), color=by_budget.colours[j], lw=1)
        stars = frontier_points(analysis, "per_arch", key)
        ax.scatter([pt["N_star"] for pt in stars], [pt["L_star"] for pt in stars], marker="*", s=110,
                   color="red", edgecolors="black", linewidths=0.4, zorder=4)
        ax.set(xscale="log", title=arch_label(key), xlabel="non-embedding parameters N")
    losses = column(rows, "val_loss")
    margin = 0.08 * (losses.max() - losses.min()) + 0.01
    axes[0][0].set_ylim(losses.min() - margin, losses.max() + margin)  # the curves rise far off the data
    axes[0][0].set_ylabel("validation loss (nats)")
    handles = [Line2D([], [], color=by_budget.colours[j], lw=2, label=f"C = {C:.3g} FLOPs")
               for j, C in enumerate(by_budget.budgets)]
    handles.append(Line2D([], [], ls="", marker="o", color="grey", label="runs (marker = r, colour = C)"))
    handles.append(Line2D([], [], ls="", marker="*", ms=11, color="red", label="law's compute-optimal N*"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.suptitle(f"{title}: validation loss at each budget; lines: each architecture's law at D = C / F(N)")
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    return fig


def plot_pred_vs_actual(plt, analysis, rows, by_budget, title):
    """Every run's loss against the joint law's prediction (else its architecture's law)."""
    from matplotlib.lines import Line2D
    fig, ax = plt.subplots(figsize=(5.6, 5.0))
    handles = []
    for key, group_rows in by_arch(rows).items():
        law = analysis["joint"] or analysis["per_arch"].get(key)
        if law is None or not law["converged"]:
            continue
        c = {k: column(group_rows, k) for k in ("n_params", "n_once", "n_rec", "r", "tokens")}
        if analysis["joint"]:
            predicted = law_loss(law, c["n_once"], c["n_rec"], c["r"], c["tokens"])
        else:
            predicted = law_loss(law, c["n_params"], 0, 1, c["tokens"])
        marker = MARKER_OF_R.get(key[0], "v")
        ax.scatter(predicted, column(group_rows, "val_loss"), c=by_budget.of_runs(rows, key), marker=marker,
                   edgecolors="black", linewidths=0.4)
        handles.append(Line2D([], [], ls="", marker=marker, color="grey", label=arch_label(key)))
    handles += [Line2D([], [], color=by_budget.colours[j], lw=3, label=f"C = {C:.3g}")
                for j, C in enumerate(by_budget.budgets)]
    losses = column(rows, "val_loss")
    ax.plot([losses.min(), losses.max()], [losses.min(), losses.max()], "k--", lw=0.8)
    law_name = "joint law" if analysis["joint"] else "per-architecture laws"
    ax.set(xlabel=f"predicted loss, {law_name} (nats)", ylabel="actual validation loss (nats)",
           title=f"{title}: {law_name}, predicted vs actual")
    ax.legend(handles=handles, fontsize=7, title="marker = architecture, colour = budget", title_fontsize=7)
    fig.tight_layout()
    return fig


def plot_frontier(plt, analysis, budgets, title):
    """L*, N*, D* of each architecture's compute-optimal point against the budget (per-architecture laws)."""
    from matplotlib.ticker import NullFormatter
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    keys = sorted({arch_key(pt) for pt in frontier_points(analysis, "per_arch")})
    for key in keys:
        pts = frontier_points(analysis, "per_arch", key)
        for ax, k in zip(axes, ("L_star", "N_star", "D_star")):
            ax.plot([pt["budget"] for pt in pts], [pt[k] for pt in pts], marker=MARKER_OF_R.get(key[0], "v"),
                    label=arch_label(key))
    for ax, label in zip(axes, ("L* (nats)", "N* (non-embedding parameters)", "D* (tokens)")):
        ax.set(xlabel="compute C (FLOPs)", ylabel=label)
        if keys:  # a grid too small for per-architecture laws has no frontier: keep linear axes
            ax.set_xscale("log")
            if label[0] != "L":
                ax.set_yscale("log")
            ax.set_xticks(budgets, [f"{C:.2g}" for C in budgets])  # the budgets themselves, no crowded minor labels
            ax.xaxis.set_minor_formatter(NullFormatter())
    if keys:
        axes[0].legend(fontsize=7)
    fig.suptitle(f"{title}: compute-optimal frontier per architecture (its own law)")
    fig.tight_layout()
    return fig


def make_plots(analysis, rows, outdir, title, results):
    """isoflop.png, pred_vs_actual.png, frontier.png and, for the runs whose training curve is found beside
    `results` (grid_curves below), curves.png in outdir; `title` names the grid. Returns the names written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    level, budgets = budget_levels(column(rows, "flops_budget"))
    colours = [plt.get_cmap("viridis")(j / max(1, len(budgets) - 1)) for j in range(len(budgets))]
    by_budget = BudgetColours(level, budgets, colours)
    figures = {
        "isoflop.png": plot_isoflop(plt, analysis, rows, by_budget, title),
        "pred_vs_actual.png": plot_pred_vs_actual(plt, analysis, rows, by_budget, title),
        "frontier.png": plot_frontier(plt, analysis, budgets, title),
    }
    found, notes = grid_curves(rows, results)
    for note in notes:
        print(f"fit_laws.py: curves.png: {note}", file=sys.stderr)
    if found:
        figures["curves.png"] = plot_curves(plt, found, title, len(rows))
    for name, fig in figures.items():
        fig.savefig(Path(outdir) / name, dpi=120)
    plt.close("all")
    return list(figures)


# ----------------------------------------------------------------------------------------------
# The truncate-or-not law's figures

def setting_colour(plt, T):
    """One colour per forward-loop count T (1, 2, 4, 8, 16), the same in every figure."""
    return plt.get_cmap("viridis")(min(1.0, math.log2(T) / 4))


def plot_truncate_fit(plt, analysis, title):
    """Every configuration's measured loss against the law's prediction: fitted (filled) and test (open),
    colour = T; beside it the power-law gain's."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6), sharey=True)
    points = analysis["points"]
    losses = [pt["L"] for pt in points]
    for ax, gain in zip(axes, ("bounded", "power")):
        for pt in points:
            colour = setting_colour(plt, pt["T"])
            ax.scatter(pt[gain], pt["L"], s=18, marker="o", edgecolors=colour, linewidths=0.8,
                       facecolors=colour if pt["fit"] else "none")
        ax.plot([min(losses), max(losses)], [min(losses), max(losses)], "k--", lw=0.8)
        rmse = analysis["fits"][gain]["in_sample"]["rmse"]
        name = "bounded gain" if gain == "bounded" else "power-law gain"
        ax.set(xlabel="predicted loss (nats)", title=f"{name}: in-sample RMSE {rmse:.4f}")
    axes[0].set_ylabel("measured validation loss (nats)")
    handles = [plt.Line2D([], [], ls="", marker="o", color=setting_colour(plt, T), label=f"T = {T}")
               for T in sorted({pt["T"] for pt in points})]
    handles.append(plt.Line2D([], [], ls="", marker="o", mfc="none", color="grey", label="test set (open)"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.suptitle(f"{title}: the law against every configuration")
    fig.tight_layout(rect=(0, 0.07, 1, 0.95))
    return fig


def plot_truncate_holdouts(plt, analysis, title):
    """RMSE of the bounded and the power-law gain in-sample, on the test set and for each held-out family (their
    Tables 7-8)."""
    fits = analysis["fits"]
    labels = ["in-sample", "test set"]
    values = {gain: [fits[gain]["in_sample"]["rmse"], fits[gain]["test_set"].get("rmse", np.nan)] for gain in fits}
    for family in dict.fromkeys(h["family"] for h in analysis["holdouts"]):
        labels.append(f"{family} out")
        for h in analysis["holdouts"]:
            if h["family"] == family:
                values[h["gain"]].append(h["rmse"])
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(labels)), 4))
    x = np.arange(len(labels))
    for k, gain in enumerate(("bounded", "power")):
        ax.bar(x + (k - 0.5) * 0.38, values[gain], width=0.38, label=f"{gain} gain")
    ax.set_xticks(x, labels, rotation=20, ha="right", fontsize=8)
    ax.set(ylabel="RMSE (nats)", title=f"{title}: prediction errors, in-sample and held out")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_g_hat(plt, analysis, title):
    """The law's g(T, B) (crosses) against the runs' g-hat: median and 25th-75th percentiles (their Figure 6)."""
    table = analysis["g_summary"]
    fig, ax = plt.subplots(figsize=(max(5, 0.7 * len(table) + 2), 4))
    x = np.arange(len(table))
    medians = np.array([t["median"] for t in table])
    spread = np.array([[t["median"] - t["q25"] for t in table], [t["q75"] - t["median"] for t in table]])
    ax.errorbar(x, medians, yerr=spread.reshape(2, -1), fmt="o", capsize=3, label="g-hat: median, 25th-75th")
    ax.scatter(x, [t["g_law"] for t in table], marker="x", s=50, color="red", zorder=3, label="the law's g(T, B)")
    ax.axhline(1.0, color="grey", lw=0.6)
    ax.set_xticks(x, [f"({t['T']},{t['B']})" for t in table], fontsize=8)
    ax.set(xlabel="(T, B)", ylabel="looping coefficient", title=f"{title}: g(T, B) against g-hat from the runs")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_setting_frontiers(plt, analysis, title):
    """The separately fitted per-setting laws' compute-optimal loss L*(C), one panel per T (their Figs. 10-11)."""
    by_t = {}
    for key, fit in analysis["per_setting"].items():
        T, B = (int(v) for v in key.split(","))
        by_t.setdefault(T, []).append((B, fit))
    Ts = sorted(by_t)
    fig, axes = plt.subplots(1, len(Ts), figsize=(3.6 * len(Ts), 3.8), squeeze=False)
    for ax, T in zip(axes[0], Ts):
        for B, fit in sorted(by_t[T]):
            lo, hi = fit["compute_range"]
            compute = np.geomspace(lo, hi, 60)
            frontier = truncate_law.setting_frontier(fit, T, B, fit["share"], compute, analysis["n0"], analysis["d0"])
            ax.plot(compute, [pt[2] for pt in frontier], label=f"B = {B}")
        ax.set(xscale="log", xlabel="compute C (FLOPs)", title=f"T = {T}")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("compute-optimal loss L* (nats)")
    fig.suptitle(f"{title}: each setting's own law, its compute-optimal frontier over its runs' compute")
    fig.tight_layout()
    return fig


def make_truncate_plots(analysis, outdir, title):
    """tb_fit.png, tb_holdouts.png, tb_g_hat.png (when some level allows g-hat) and tb_frontiers.png in outdir."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figures = {"tb_fit.png": plot_truncate_fit(plt, analysis, title),
               "tb_holdouts.png": plot_truncate_holdouts(plt, analysis, title)}
    if analysis["g_summary"]:
        figures["tb_g_hat.png"] = plot_g_hat(plt, analysis, title)
    if analysis["per_setting"]:
        figures["tb_frontiers.png"] = plot_setting_frontiers(plt, analysis, title)
    for name, fig in figures.items():
        fig.savefig(Path(outdir) / name, dpi=120)
    plt.close("all")
    return list(figures)


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
