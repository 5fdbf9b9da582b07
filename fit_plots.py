"""
The fits' figures: fit_laws.py --plots DIR draws them from an analysis. For an iso-depth sweep (paper §4.2-4.3)
isoflop.png (each architecture's runs and law per budget), pred_vs_actual.png, frontier.png (L*, N*, D* per
budget) and curves.png (the runs' training curves, curves.py); for the truncate-or-not law (Truncate or Not? §4,
App. C-D) tb_fit.png (the law against every configuration, fitted and test), tb_holdouts.png (the held-out errors of
the bounded and the power-law gain, their Tables 7-8), tb_g_hat.png (g-hat against g(T, B), their Figure 6) and
tb_frontiers.png (the separately fitted per-setting laws' compute-optimal frontiers, their Figures 10-11).
matplotlib is imported by make_plots, on its Agg backend (files, no screen).
"""
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from curves import grid_curves, plot_curves
import truncate_law
from laws import (MARKER_OF_R, arch_key, arch_label, budget_levels, by_arch, column, family_for_group,
                  frontier_points, law_loss)

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
    `results` (curves.py), curves.png in outdir; `title` names the grid. Returns the names written."""
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
