"""
Scaling-law fits for the iso-depth looped-transformer sweep (paper §4.2–4.3, App. E, G): a Chinchilla law per
architecture, the joint law with the recurrence-equivalence exponent phi and its block-bootstrap CI,
the compute-optimal frontier per r, delta-phi between two sweeps, the looped/non-looped equivalence
calculator; with --law truncate-or-not, Truncate or Not?'s law over (T, B) instead (truncate_law.py).

    python fit_laws.py runs/results.jsonl --json fit.json --plots out/fit   # report on stdout
    python fit_laws.py base.jsonl --compare truncated.jsonl          # delta-phi with a bootstrap CI
    python fit_laws.py --equiv 4 32 --phi 0.46                       # what is a looped model worth?

Input: train.py's results file, one JSON object per run. Unfinished, diverged and duplicate rows are
dropped with one line each on stderr. Runs are grouped into architectures by (r, r_bwd, injection); an
--untied run (Truncate or Not? App. E.2) shares nothing, so the law reads it at r^phi = 1 (laws.arch_key), an
anchor beside the looped runs of its cells. Counts and FLOPs come from flops.py. Without a sweep:
python dev/synthetic_sweep.py synth.jsonl writes the paper's grid with losses from a known law;
dev/epoch_chinchilla.py refits Epoch's Chinchilla runs.

Refused with one line, exit 2, before any fit: runs (of one fit, or of two compared sweeps) that differ in
vocabulary, sequence length, effective depth, dataset or evaluation rows, whose losses are not comparable
(--allow-mixed fits them anyway); two architectures at one r (say r = 4 with full and truncated BPTT: the joint
law has one per r, so fit each grid alone and --compare them); an output that cannot be written. A fit whose
best restart did not converge says NOT CONVERGED in place of its numbers. The laws and the fitter are laws.py's;
dev/README.md's "Example fit report" reads one report line by line.
"""
import argparse
import ast
import hashlib
import json
import math
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

# laws first: it sets OpenBLAS's thread count before numpy loads (the fits run one thread per process).
from nanoloop.laws import (BOX_HI, BOX_LO, CONFIG_FIELDS, HUBER_DELTA, column, arch_key, arch_label, bootstrap_joint,
                           budget_halves, budget_levels, by_arch, compare_phi, compute_frontier, equivalence,
                           fit_chinchilla, fit_joint, frontier_points, residuals_by_r)

from nanoloop import laws  # noqa: E402 (its file is part of a stored analysis' fingerprint)
from nanoloop import truncate_law  # noqa: E402 (so is this one's)

from nanoloop import common  # noqa: E402
from nanoloop.common import DataError, atomic_write, check_writable, fail, finite_float, one_line_errors, positive_int
from nanoloop.eval_tasks import CATEGORIES, category_losses, read_categories
from nanoloop.common import positive_int_list, read_rows
from nanoloop.plots import make_plots, make_truncate_plots

PROG = "fit_laws.py"
LAWS = ("iso-depth", "truncate-or-not")  # --law: the iso-depth joint law (laws.py), Truncate or Not?'s (truncate_law.py)
SAME_RUN = CONFIG_FIELDS + ("flops_budget", "tokens", "seed", "lrs")  # one run, for rows without run_id
FINISHED_FIELDS = ("val_loss", "train_loss", "tokens_per_s")  # null or non-finite in a run that did not finish
POSITIVE_FIELDS = ("val_loss", "n_params", "n_once", "n_rec", "tokens", "flops_budget")  # N_once, N_rec may be 0
# Runs shorter than this are a chain check, not a measurement (smoke's take 1-4 optimiser steps; the CPU grid's
# shortest, 127): the report says that its phi means nothing.
MEANINGFUL_STEPS = 100


# ----------------------------------------------------------------------------------------------
# Loading runs

def load_results(path):
    """The rows of a train.py results file, one JSON object per line (common.read_rows). A line that is not
    one (a torn last line, garbage) becomes {"unreadable": why} after the rows, which drop_unusable drops
    with a note, as every other row a fit must not see. DataError: no such file, or no lines at all."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    rows, notes = read_rows(path)
    for note in notes:
        rows.append({"unreadable": note})
    if not rows:
        raise DataError(f"{path}: no runs")
    return rows


def _finite(value):
    """Whether value is a finite number or a string of one (None, text and NaN are not)."""
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _run_identity(row):
    """What makes two rows one run: the same run_id, else (rows of before run identities) the same
    configuration, budget, tokens, seed and LRs. None for a row without a configuration."""
    if row.get("run_id"):
        return row["run_id"]
    if "scale" in row:
        return json.dumps([row.get(k) for k in SAME_RUN])
    return None


def _why_unusable(row, seen):
    """Why a fit must not see `row`, or None if it may; `seen` maps each kept run's identity to its number."""
    if "unreadable" in row:
        return row["unreadable"]
    unfinished = [k for k in FINISHED_FIELDS if k in row and not _finite(row[k])]
    if unfinished:
        return f"not a finished run ({unfinished[0]} is {row[unfinished[0]]})"
    if row.get("finished") is False:
        return "not a finished run (finished is false)"
    if _finite(row.get("vocab_size")):
        ceiling = math.log(float(row["vocab_size"])) + 1  # worse than a uniform guess
        if float(row.get("val_loss", 0)) > ceiling:
            return f"diverged (val_loss {float(row['val_loss']):.3f} > ln(vocab_size) + 1 = {ceiling:.3f})"
    key = _run_identity(row)
    if key is None or key not in seen:
        return None
    same = "same run_id" if row.get("run_id") else "same configuration, budget, seed and LRs"
    return f"a duplicate of run {seen[key]} ({same})"


def drop_unusable(rows):
    """Drop rows a fit must not see (each one moves phi): unreadable lines, unfinished runs (`finished`
    false; null or non-finite val_loss, train_loss or tokens_per_s), diverged runs (val_loss > ln(vocab) + 1,
    worse than uniform), repeats of a kept run (same run_id; else same config, budget, tokens, seed and LRs).
    Returns (kept rows, one note per dropped row)."""
    kept, seen, notes = [], {}, []
    for i, row in enumerate(rows, 1):
        why = _why_unusable(row, seen)
        if why is None:
            seen.setdefault(_run_identity(row), i)
            kept.append(row)
        elif "unreadable" in row:
            notes.append(f"{why}: dropped")
        else:
            notes.append(f"run {i}: dropped, {why}")
    return kept, notes


# What the runs of one fit (and two compared sweeps) must share: a law pooled over another vocabulary,
# context length, effective depth, dataset or validation set mixes losses that are not comparable.
SWEEP_SETTINGS = ("vocab_size", "seq_len", "depth", "data", "eval_rows")


def sweep_setting(row, key):
    """A row's value of one SWEEP_SETTINGS key as text ("data": the run identity's dataset checksums), None if
    unknown."""
    if key == "data":
        data = (row.get("identity") or {}).get("data")
        return None if data is None else json.dumps(data, sort_keys=True)
    value = row.get(key)
    return None if value is None else str(value)


def mixed_settings(rows, law="iso-depth"):
    """The SWEEP_SETTINGS on which rows disagree, as 'key (a vs b)' strings (empty: all comparable). A row
    that does not record a setting (rows older than run identities, synthetic rows) agrees with any. The
    truncate-or-not law's fixed-N models differ in executed depth by design (T loops of one block)."""
    mixed = []
    for key in SWEEP_SETTINGS:
        if key == "depth" and law == "truncate-or-not":
            continue
        values = {sweep_setting(row, key) for row in rows}
        values.discard(None)
        if len(values) > 1:
            shown = " vs ".join(value[:40] for value in sorted(values)[:3])
            mixed.append(f"{key} ({shown})")
    return mixed


def with_metric(rows, metric, eval_rows, categories):
    """Copies of the training rows whose val_loss is a downstream loss instead (App. I.1): a category's
    mean task loss (category_losses) or one task's loss, at the run's own trained r, joined by run_id.
    Returns (rows, one note per training row that has no such evaluation). The joint law fitted to a category's
    loss gives that category's phi (App. I.2, Table 10: parametric knowledge 0.58, reading comprehension 0.71)."""
    per_run = {}
    if metric in categories:
        for key, losses in category_losses(eval_rows, categories).items():
            if metric in losses:
                per_run[key] = losses[metric]
    else:
        for row in eval_rows:
            if row["task"] == metric:
                per_run[row["run_id"], int(row["r"])] = float(row["loss"])
    if not per_run:
        tasks = ", ".join(categories.get(metric, [])) or "not a category, nor a task in the rows"
        raise ValueError(f"--metric {metric}: no evaluation rows for it (a category needs every one of its tasks: "
                         f"{tasks})")
    kept, notes = [], []
    for i, row in enumerate(rows, 1):
        value = per_run.get((row.get("run_id"), int(row.get("r") or 1)))
        if value is None:
            notes.append(f"run {i}: dropped, no {metric} evaluation at its trained r = {row.get('r')}")
        else:
            kept.append(dict(row, val_loss=value, metric=metric, validation_loss=row.get("val_loss")))
    return kept, notes


def prepare_rows(rows, source="runs", law="iso-depth"):
    """Canonical copies of train.py rows: int r, r_bwd, the injection, and finite positive n_params, n_once,
    n_rec, tokens, flops_budget, val_loss (N_once, N_rec may be 0). The truncate-or-not law takes a token horizon's
    level instead of flops_budget (truncate_law.level_of). ValueError names the first run lacking one."""
    required = POSITIVE_FIELDS
    if law == "truncate-or-not":
        required = tuple(k for k in POSITIVE_FIELDS if k != "flops_budget")
    out = []
    for i, raw in enumerate(rows, 1):
        row = dict(raw, r=int(raw.get("r") or 1))
        row["r_bwd"] = int(row.get("r_bwd") or row["r"])
        if row["r"] == 1:
            row["injection"] = "none"
        else:
            row["injection"] = row.get("injection") or "linear"
        if law == "truncate-or-not" and not _finite(truncate_law.level_of(row)):
            raise ValueError(f"{source}: runs have neither a token horizon (tokens_target, d0) nor a flops_budget "
                             f"(first: run {i})")
        for k in required:
            may_be_zero = k in ("n_once", "n_rec")
            if not _finite(row.get(k)) or float(row[k]) < 0 or (float(row[k]) == 0 and not may_be_zero):
                what = "lack" if row.get(k) is None else "have a NaN, infinite or non-positive"
                raise ValueError(f"{source}: runs {what} {k} (first: run {i})")
            row[k] = float(row[k])
        out.append(row)
    return out


# ----------------------------------------------------------------------------------------------
# The analysis of one sweep, and its report

@dataclass(frozen=True)
class FitOptions:
    """How each fit of one sweep searches (§4.2, App. G.2): the protocol's 500 random L-BFGS-B restarts per
    fit, 200 block-bootstrap resamples, each refit from the full fit's local optima plus 16 random starts
    (checked to land on the 500-restart optimum: tests/test_fit_laws.py, dev/bench_fit.py), Huber's delta.
    `workers` (processes) changes how fast, not what: it is not part of a stored analysis' fingerprint."""
    restarts: int = 500
    bootstrap: int = 200
    boot_restarts: int = 16
    seed: int = 0
    delta: float = HUBER_DELTA
    workers: int = 1


def analyse(rows, options=FitOptions()):
    """Per-architecture fits, joint fit, restricted fits at phi = 0 and 1, residuals by r, budget halves,
    bootstrap and frontier for one sweep (§4.2–4.3). A dict; per_arch is keyed by arch_key. The joint law needs
    two loop counts and one architecture per r; a note says what was skipped and why."""
    groups = by_arch(rows)
    budgets = budget_levels(column(rows, "flops_budget"))[1]
    if len(budgets) < 2:
        raise ValueError("all runs share one compute budget; the laws need at least two")
    analysis = {
        "n_runs": len(rows),
        "groups": {arch_label(k): len(v) for k, v in groups.items()},
        "budgets": budgets.tolist(),
        "per_arch": {},
        "notes": [],
        "joint": None,
        "restricted": {},
        "halves": {},
    }
    for key, group_rows in groups.items():  # §4.2: each architecture's own Chinchilla law, on its unique N
        N, D, L, C = (column(group_rows, k) for k in ("n_params", "tokens", "val_loss", "flops_budget"))
        try:
            analysis["per_arch"][key] = fit_chinchilla(N, D, L, options.restarts, options.seed, options.workers, C,
                                                       options.delta)
        except ValueError as err:
            analysis["notes"].append(f"{arch_label(key)}: no per-architecture fit ({err})")
    # The joint law reads r as the only difference between architectures: two of them at one r (a case study
    # beside its baseline) would share one r^phi, so they are fitted apart and compared by delta-phi.
    loop_counts = [key[0] for key in groups]
    shared = [arch_label(key) for key in groups if loop_counts.count(key[0]) > 1]
    if len(set(loop_counts)) < 2:
        analysis["notes"].append("joint law skipped: it needs runs at two or more loop counts r")
    elif shared:
        raise ValueError(f"joint law needs one architecture per r, not {', '.join(shared)}: fit each grid on its own")
    else:
        analyse_joint(analysis, rows, options)
    if not analysis["per_arch"] and analysis["joint"] is None:
        raise ValueError("nothing to fit: " + "; ".join(analysis["notes"]))
    analysis["frontier"] = compute_frontier(rows, analysis["per_arch"], analysis["joint"], budgets)
    return analysis


def analyse_joint(analysis, rows, options):
    """The joint-law part of analyse, into `analysis`: the free and restricted fits (phi = 0: loops add
    nothing; phi = 1: a loop is worth a unique block), residuals by r, the budget halves (App. G.3), the
    bootstrap (App. G.2)."""
    restarts, seed, workers, delta = options.restarts, options.seed, options.workers, options.delta
    joint = fit_joint(rows, restarts, seed, None, workers, delta)
    analysis["joint"] = joint
    for phi in (0.0, 1.0):
        analysis["restricted"][f"phi={phi:g}"] = fit_joint(rows, restarts, seed, phi, workers, delta)
    analysis["residuals_by_r"] = []
    if joint["converged"]:
        analysis["residuals_by_r"] = residuals_by_r(joint, rows)
    for name, (part, part_budgets) in zip(("low", "high"), budget_halves(rows)):  # does phi drift with scale?
        try:
            half = fit_joint(part, restarts, seed, None, workers, delta)
        except ValueError as err:
            analysis["notes"].append(f"{name}-budget half: no refit ({err})")
            continue
        half["budgets"] = part_budgets.tolist()
        analysis["halves"][name] = half
    if options.bootstrap and joint["converged"]:  # the refits start from the full fit's optima: it must have one
        analysis["bootstrap"] = bootstrap_joint(rows, joint, options.bootstrap, options.boot_restarts, seed, workers,
                                                delta)


def _fmt_fit(fit, phi=True):
    """One fit's numbers on one line, or NOT CONVERGED with the optimiser's message and its best objective."""
    if not fit["converged"]:
        return f"NOT CONVERGED ({fit['message']}); best objective {fit['objective']:.6g}"
    text = (f"E {fit['E']:.4f}  A {fit['A']:.4g}  alpha {fit['alpha']:.4f}  B {fit['B']:.4g}  beta {fit['beta']:.4f}  "
            f"R2 {fit['r2']:.5f}  RMSE {fit['rmse']:.4f}")
    if phi and fit.get("phi") is not None:
        text = f"phi {fit['phi']:.4f}  " + text
    return text


def short_count(x):
    """15.7k, 98.3M, 3.81B: counts from CPU-scale to paper-scale grids."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"


CI_FORMATS = (("phi", ".4f"), ("E", ".4f"), ("A", ".4g"), ("alpha", ".4f"), ("B", ".4g"), ("beta", ".4f"))


def report(analysis, title, say=print):
    """The report of one sweep's analysis, in the paper's order: the per-architecture laws (§4.2, Table 1), the
    joint law with its CIs, the restricted fits and the residuals by r (§4.3, Table 2, App. G.1), the budget halves
    (App. G.3), the frontier (§4.2, Figure 4). `say` prints one block of lines."""
    b, joint = analysis["budgets"], analysis["joint"]
    notes = "".join(f"\n   note: {note}" for note in analysis["notes"])
    say(f"== {title}: {analysis['n_runs']} runs, {len(analysis['groups'])} architectures, {len(b)} budgets "
        f"({b[0]:.3g} .. {b[-1]:.3g} FLOPs){notes}")
    say("\nPer-architecture Chinchilla fits  L = E + A N^-alpha + B D^-beta  (Huber on log L, best of the restarts; "
        "hits = restarts reaching the optimum)")
    for key, fit in analysis["per_arch"].items():
        say(f"  {arch_label(key):<18} {fit['n_runs']:>4} runs  {_fmt_fit(fit)}  hits {fit['hits']}/{fit['restarts']}")
    if joint is not None:
        say("\nJoint law  L = E + A (N_once + r^phi N_rec)^-alpha + B D^-beta  (one law for every r)")
        if joint["converged"]:
            _report_joint(analysis, say)
        else:
            say(f"  {_fmt_fit(joint)}")
    if analysis["halves"]:
        say("\nBudget halves (joint law refit on each half of the sorted budgets)")
    for name, fit in analysis["halves"].items():
        span = f"C in [{fit['budgets'][0]:.3g}, {fit['budgets'][-1]:.3g}]"
        say(f"  {name:<5} {span:<24}{fit['n_runs']:>4} runs  {_fmt_fit(fit)}")
    _report_frontier(analysis, say)


def _report_joint(analysis, say):
    """The converged joint law with its CIs, the restricted fits and the residuals by r."""
    joint, boot = analysis["joint"], analysis.get("bootstrap") or {}
    shown = {}  # each parameter with its CI; one that runs to the search box is named as such (laws.estimate_text)
    for k, f in CI_FORMATS:
        shown[k] = f"{joint[k]:{f}}"
        ci = boot.get(k + "_ci")
        if ci:
            shown[k] = laws.estimate_text(joint[k], ci, laws.ci_bounds_reached(k, ci), f)
    powers = ", ".join(f"{r}^phi = {r ** joint['phi']:.3f}" for r in (2, 4, 8))
    say(f"  phi   = {shown['phi']}   (r^phi: {powers})\n"
        f"  E     = {shown['E']}\n"
        f"  A     = {shown['A']}   alpha = {shown['alpha']}\n"
        f"  B     = {shown['B']}   beta  = {shown['beta']}\n"
        f"  R2 {joint['r2']:.5f}  RMSE {joint['rmse']:.4f} nats  max |resid| {joint['max_abs_resid']:.4f}  "
        f"objective {joint['objective']:.6g}  hits {joint['hits']}/{joint['restarts']}")
    if min(abs(joint["phi"] - BOX_LO[5]), abs(joint["phi"] - BOX_HI[5])) < 1e-6:  # the box's answer, not the data's
        say(f"  !! phi sits on the edge of its box [{BOX_LO[5]:g}, {BOX_HI[5]:g}]: these runs do not identify phi "
            "(e.g. minima not bracketed, or looping adds nothing measurable)")
    if boot:
        say(f"  95% CIs: block bootstrap, {boot['resamples']} resamples of {boot['cells']} (budget, r) cells, each "
            f"refit from the full fit's local optima + {boot['restarts']} random starts; {boot['frac_phi_le_0']:.0%} "
            f"of resamples reach phi <= 0, {boot['frac_phi_ge_1']:.0%} phi >= 1; {boot['not_converged']} did not "
            f"converge; a CI that runs to the edge of the search box (phi in [{BOX_LO[5]:g}, {BOX_HI[5]:g}]) is the "
            "box's, not a measured interval, and is printed as not identified")
    say("\nRestricted fits (same data, phi held fixed)")
    for name, fit in [*analysis["restricted"].items(), ("free", joint)]:
        say(f"  {name:<8}" + _fmt_fit(fit, phi=False))
    say("\nJoint-fit residuals by r (actual - predicted, nats)\n    r  runs     RMSE     mean   max|.|")
    for t in analysis["residuals_by_r"]:
        say(f"  {t['r']:>3}{t['runs']:>6}{t['rmse']:>9.4f}{t['mean']:>+9.4f}{t['max_abs']:>9.4f}")


def _fmt_gap(gap, r):
    """A frontier gap to r = 1 for the table: blank for r = 1 itself or without an r = 1 point."""
    if gap is None or r == 1:
        return ""
    return f"{gap:+.4f}"


def _report_frontier(analysis, say):
    """One row per (budget, architecture): the per-architecture law's optimum (the paper's Figure 4) and,
    last column, the gap the joint law predicts; --json keeps both in full."""
    joint_gap = {}
    for pt in frontier_points(analysis, "joint"):
        joint_gap[pt["budget"], arch_key(pt)] = pt["gap_to_r1"]
    points = frontier_points(analysis, "per_arch") or analysis["frontier"]
    if points:
        say(f"\nCompute-optimal frontier: min over width of L(N, C/F(N)) with the {points[0]['law'].replace('_', '-')} "
            "law(s); F(N) from flops.py; gap = L* - L*(r=1) at the same budget\n"
            "     budget  architecture             N*     s*       D*  D*/N*      L*     gap joint gap")
    for pt in sorted(points, key=lambda pt: (pt["budget"], arch_key(pt))):
        key = arch_key(pt)
        gap = _fmt_gap(pt["gap_to_r1"], pt["r"])
        gap_joint = _fmt_gap(joint_gap.get((pt["budget"], key)), pt["r"])
        line = (f"  {pt['budget']:>9.3g}  {arch_label(key):<18}{short_count(pt['N_star']):>9}{pt['scale_star']:>7.3g}"
                f"{short_count(pt['D_star']):>9}{pt['D_star'] / pt['N_star']:>7.1f}{pt['L_star']:>8.4f}"
                f"{gap:>8}{gap_joint:>10}")
        if pt["at_edge"]:
            line += "  (at edge of width family)"
        say(line.rstrip())


def report_delta_phi(analysis, other, name_a, name_b, say=print):
    """delta-phi = phi(b) - phi(a), with the bootstrap CI where both sweeps have one (§1, §5: the diagnostic the
    paper proposes; truncated BPTT moves phi from 0.46 to 0.38, hyperconnections to 0.65). Where an arm's phi CI
    runs to the search box, so does the interval of the differences: it is printed as not identified."""
    if analysis["joint"] is None or other["joint"] is None:
        raise ValueError("--compare needs a joint-law fit of both sweeps")
    if analysis.get("bootstrap") and other.get("bootstrap"):
        d = compare_phi(analysis["bootstrap"], other["bootstrap"], analysis["joint"], other["joint"])
        reached = laws.ci_bounds_reached("phi", analysis["bootstrap"]["phi_ci"], other["bootstrap"]["phi_ci"])
        d["delta_phi_ci_at_bound"] = bool(reached)
        text = laws.estimate_text(d["delta_phi"], d["delta_phi_ci"], reached, "+.4f", whose="an arm's phi CI")
        lo, hi = d["delta_phi_ci"]
        verdict = "excludes 0" if d["excludes_zero"] else "includes 0"
        note = f" (95% CI, {verdict}; independent resamples, conservative when the sweeps share r = 1 runs)"
        if reached:
            note = f"; the differences' 2.5-97.5% range, [{lo:+.4f}, {hi:+.4f}], is the search box's"
    else:
        d = {"delta_phi": other["joint"]["phi"] - analysis["joint"]["phi"], "delta_phi_ci": None}
        text = f"{d['delta_phi']:+.4f}"
        note = " (no CI: --bootstrap 0, or a joint fit did not converge)"
    say(f"\nDelta-phi = phi({name_b}) - phi({name_a}) = {other['joint']['phi']:.4f} - {analysis['joint']['phi']:.4f} = "
        f"{text}{note}")
    return d


def _errors_text(e):
    """One errors dict (truncate_law.errors) as the columns RMSE, MAE, bias, max (nats)."""
    if not e.get("n"):
        return f"{'-':>10}{'-':>10}{'-':>11}{'-':>10}"
    return f"{e['rmse']:>10.2e}{e['mae']:>10.2e}{e['bias']:>+11.2e}{e['max_error']:>10.2e}"


def _ci_text(boot, key, fmt=".3f"):
    if not boot or not boot.get(key + "_ci"):
        return ""
    lo, hi = boot[key + "_ci"]
    return f" [{lo:{fmt}}, {hi:{fmt}}]"


def report_truncate_law(analysis, title, say=print):
    """The truncate-or-not law's report (Truncate or Not? §4-5, App. C): the coefficients with CIs, the errors
    in-sample, on the test set and held out, beside the power-law gain's; g-hat against g(T, B); and the answer to
    "truncate or not?" from the law (q vs 2p, Table 5) and from the runs (matched compute, per-setting laws)."""
    fit, power, boot = analysis["fits"]["bounded"], analysis["fits"]["power"], analysis["bootstrap"]
    levels = analysis["levels"]
    say(f"== {title}: Truncate or Not? law, {analysis['runs']} runs in {analysis['configs']} configurations "
        f"({analysis['fitting']} fitted: {analysis['fit_window'][0]:g} < D_target/N < {analysis['fit_window'][1]:g}; "
        f"the rest a test set), {len(analysis['sizes'])} sizes, {len(levels)} levels ({levels[0]:g} .. {levels[-1]:g} "
        f"D0), {len(analysis['settings'])} (T, B) settings" + "".join(f"\n   note: {n}" for n in analysis["notes"]))
    say(f"   L = E + [A (N_eff/N0)^-alpha + H (D/D0)^-beta]^kappa, N_eff = N_once + g(T,B) N_rec, "
        f"g = exp[c (1 - T^-p B^-q)]; N0 = {analysis['n0']:,.0f}, D0 = {analysis['d0']:,.0f} tokens")
    if not fit["converged"]:
        say(f"  NOT CONVERGED ({fit['message']})")
        return
    ci = f"; 95% CIs: {boot['converged']} of {boot['resamples']} resamples of {boot['cells']} (size, level) cells" \
        if boot else ""
    say(f"\nCoefficients (best of {fit['starts']} TRF starts, {fit['converged_starts']} converged{ci})\n"
        f"  E {fit['E']:.4f}  A {fit['A']:.4g}  H {fit['H']:.4g}  alpha {fit['alpha']:.4f}  beta {fit['beta']:.4f}  "
        f"kappa {fit['kappa']:.4f}  R2 {fit['r2']:.4f}\n"
        f"  c {fit['c']:.3f}{_ci_text(boot, 'c')}  p {fit['p']:.3f}{_ci_text(boot, 'p')}  q {fit['q']:.3f}"
        f"{_ci_text(boot, 'q')}  (published: c 1.112, p 0.237, q 1.022)\n"
        f"  g(2,2) {truncate_law.gain_of(fit, 2, 2):.3f}  g(4,4) {truncate_law.gain_of(fit, 4, 4):.3f}  g(8,2) "
        f"{truncate_law.gain_of(fit, 8, 2):.3f}  g(8,8) {truncate_law.gain_of(fit, 8, 8):.3f}  ceiling e^c "
        f"{math.exp(fit['c']):.3f}" + "".join(f"\n  !! {name} sits on its bound" for name in fit["on_bound"]))
    say("\nErrors, prediction - measurement (nats)          fits      RMSE       MAE       bias       max"
        "   power-law gain: RMSE")
    say(f"  in-sample                              {1:>12}{_errors_text(fit['in_sample'])}{power['in_sample']['rmse']:>12.2e}")
    test = fit["test_set"]
    say(f"  test set ({test.get('n', 0)} configurations)               -{_errors_text(test)}"
        f"{power['test_set'].get('rmse', float('nan')):>12.2e}")
    held = {(h["family"], h["gain"]): h for h in analysis["holdouts"]}
    for family in dict.fromkeys(h["family"] for h in analysis["holdouts"]):
        h, p = held[family, "bounded"], held.get((family, "power"))
        say(f"  one {family + ' out':<35}{h['fits']:>4}{_errors_text(h)}{p['rmse'] if p else float('nan'):>12.2e}")
    rows = held.get(("row", "bounded"))
    if rows:
        power_rows = {f["label"]: f for f in held[("row", "power")]["folds"]}
        say("  forward-loop rows held out (§C.5): " + "   ".join(
            f"T = {f['label']:g}: {f['rmse']:.2e} (power {power_rows[f['label']]['rmse']:.2e})" for f in rows["folds"]))
    _report_g_hat(analysis, say)
    _report_truncate_or_not(analysis, say)


def _report_g_hat(analysis, say):
    """g(T, B) of the fit beside the runs' g-hat (their Figure 6)."""
    if not analysis["g_summary"]:
        say("\nEmpirical g-hat (§C.2): no level has non-looped runs of >= 3 sizes with falling losses")
        return
    say(f"\nLooping coefficient: the law's g(T, B) against g-hat from the runs (§C.2: the non-looped runs' PCHIP "
        f"loss -> size at the same level; median [25th, 75th] of {len(analysis['g_hat'])} configurations)")
    for t in analysis["g_summary"]:
        say(f"  ({t['T']}, {t['B']})  law {t['g_law']:.3f}   g-hat {t['median']:.3f} [{t['q25']:.3f}, "
            f"{t['q75']:.3f}]  n = {t['n']}")


def _report_truncate_or_not(analysis, say):
    """The answer: the law's (q vs 2p, Table 5 with this fit) and the runs' (matched compute, per-setting laws)."""
    fit, boot = analysis["fits"]["bounded"], analysis["bootstrap"]
    gap = fit["q"] - 2 * fit["p"]
    verdict = "full BPTT (q > 2p)" if gap > 0 else "truncation (q < 2p)"
    if boot and boot["q_minus_2p_ci"][0] < 0 < boot["q_minus_2p_ci"][1]:
        verdict = "not settled: the CI of q - 2p includes 0"
    share_by_setting = [f["share"] for f in analysis["per_setting"].values()] or [0.5]
    share = float(sorted(share_by_setting)[len(share_by_setting) // 2])
    frac = f"; q > 2p in {boot['frac_q_gt_2p']:.0%} of resamples" if boot else ""
    say(f"\nTruncate or not?\n  both loop counts free (Lemma D.2): q - 2p = {gap:+.3f}"
        f"{_ci_text(boot, 'q_minus_2p', '+.3f')}{frac} -> {verdict}")
    say(f"  T prescribed (their Table 5 from this fit, N_rec/N = {share:.3f}):  T  B*  chi(T,B*)  chi(T,T)  saving")
    for t in truncate_law.chi_table(fit, share, (2, 4, 8)):
        say(f"{'':>70}{t['T']:>2}{t['B_star']:>4}{t['chi_star']:>11.3f}{t['chi_full']:>10.3f}{t['saving']:>8.1%}")
    for pair in analysis["pairs"]:
        deltas = [c["delta"] for c in pair["cells"]]
        if deltas:
            say(f"  matched compute, measured: {pair['truncated']} - {pair['full']} = {sum(deltas) / len(deltas):+.4f} "
                f"nats on average; full BPTT lower in {sum(d > 0 for d in deltas)} of {len(deltas)} (size, level) cells")
    for s in analysis["savings"]:
        say(f"  per-setting laws: {s['cheaper']} reaches {s['dearer']}'s loss with {s['min']:+.0%} .. {s['max']:+.0%} "
            f"less compute (median {s['median']:+.0%}) over {s['range'][0]:.2g} .. {s['range'][1]:.2g} FLOPs")


def fit_truncate_law(args, path, rows, notes):
    """--law truncate-or-not: the analysis (truncate_law.analyse), its report, --json and --plots."""
    analysis = truncate_law.analyse(rows, args.restarts, args.holdouts, args.bootstrap, args.workers, args.fit_window)
    analysis["notes"][:0] = notes
    report_truncate_law(analysis, str(path))
    if args.json:
        atomic_write(args.json, json.dumps(analysis, indent=1, default=float).encode())
        print(f"\nwrote {args.json}")
    if args.plots:
        names = make_truncate_plots(analysis, args.plots, plot_title(path))
        print(f"wrote {', '.join(names)} to {args.plots}")


def report_equivalence(eq, say=print):
    """laws.equivalence's answer as four lines: the looped model, the r = 1 models of the same loss and of the same
    FLOPs (§1, App. G.5: at phi = 0.46 a 410M r = 4 model "performs on par with a 580M non-looped model" and costs
    a 1B one's training)."""
    same_loss, same_flops = eq["same_loss"], eq["same_flops"]
    say(f"\nEquivalence at r = {eq['r']}, s = {eq['scale']} (d = {64 * eq['scale']}), phi = {eq['phi']:.4f}\n"
        f"  looped model   N = {short_count(eq['N'])} (N_once {short_count(eq['n_once'])} + "
        f"N_rec {short_count(eq['n_rec'])}), N_eff = "
        f"N_once + r^phi N_rec = {short_count(eq['n_eff'])}, F = {eq['flops_per_token']:.4g} FLOPs/token\n"
        f"  same loss      non-looped N = {short_count(same_loss['N'])} (s = {same_loss['scale']:.2f}, "
        f"F = {same_loss['flops_per_token']:.4g})\n"
        f"  same FLOPs     non-looped N = {short_count(same_flops['N'])} (s = {same_flops['scale']:.2f}; "
        f"the same-width r = 1 model has N = {short_count(eq['same_width']['N'])})\n"
        f"  -> trains at the cost of a {short_count(same_flops['N'])} non-looped model and reaches the loss of "
        f"a {short_count(same_loss['N'])} one")


# ----------------------------------------------------------------------------------------------
# Command line

def window(text):
    """--fit-window LO,HI: two numbers, 0 <= LO < HI."""
    try:
        lo, hi = (float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO,HI such as 6.5,105, got {text!r}") from None
    if not 0 <= lo < hi:
        raise argparse.ArgumentTypeError(f"expected 0 <= LO < HI, got {text!r}")
    return lo, hi


def families(text):
    """--holdouts: a comma list of truncate_law.FAMILIES, or none."""
    chosen = tuple(part for part in text.split(",") if part and part != "none")
    unknown = set(chosen) - set(truncate_law.FAMILIES)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown families {', '.join(sorted(unknown))} (of "
                                         f"{', '.join(truncate_law.FAMILIES)}, or none)")
    return chosen


def resample_count(text):
    """--bootstrap: 0 (off) or at least 2 resamples (a percentile CI needs two draws)."""
    value = int(text)
    if value < 0 or value == 1:
        raise argparse.ArgumentTypeError(f"expected 0 (off) or at least 2, got {text!r}")
    return value


def parse_args(argv=None):
    """fit_laws.py's flags, and the combinations it refuses (one line, exit 2)."""
    # usage=SUPPRESS: --help opens with the examples above; a bad flag is one line (one_line_errors).
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, usage=argparse.SUPPRESS,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    one_line_errors(parser, PROG)
    parser.add_argument("results", nargs="?", help="train.py's results file (JSONL)")
    parser.add_argument("--compare", metavar="FILE", help="second sweep: report delta-phi = phi(FILE) - phi(results)")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    parser.add_argument("--plots", metavar="DIR", help="write isoflop.png, pred_vs_actual.png, frontier.png and "
                        "curves.png (the runs' training curves, where their logs are found)")
    parser.add_argument("--only-r", metavar="LIST", type=positive_int_list, help="keep only these r, e.g. 1,4,8")
    parser.add_argument("--law", choices=LAWS, default="iso-depth",
                        help="iso-depth: the joint law with phi; truncate-or-not: their law over N, D, T and B")
    parser.add_argument("--restarts", type=positive_int, default=None,
                        help="random starts per fit (iso-depth: 500 L-BFGS-B; truncate-or-not: 64 TRF, App. C.3)")
    parser.add_argument("--bootstrap", type=resample_count, default=200, metavar="N",
                        help="block-bootstrap resamples (paper: 200)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of restarts and resamples (results are deterministic)")
    parser.add_argument("--workers", type=positive_int, default=os.cpu_count() or 1, help="processes for the fits")
    parser.add_argument("--equiv", nargs=2, type=positive_int, metavar=("R", "S"),
                        help="equivalence calculator for a looped model with r = R at width s = S")
    parser.add_argument("--phi", type=finite_float, help="phi for --equiv (else fitted)")
    parser.add_argument("--allow-mixed", action="store_true",
                        help="fit or compare runs of another vocab, seq len, depth, dataset or eval rows all the same")
    g = parser.add_argument_group("the truncate-or-not law (--law truncate-or-not)")
    g.add_argument("--fit-window", type=window, default=truncate_law.FIT_WINDOW, metavar="LO,HI",
                   help="the fitting set: target tokens per parameter in (LO, HI); the rest is the test set")
    g.add_argument("--holdouts", type=families, default=truncate_law.FAMILIES, metavar="LIST",
                   help=f"held-out families to refit, of {','.join(truncate_law.FAMILIES)} (or none)")
    g = parser.add_argument_group("downstream loss instead of validation loss (App. I)")
    g.add_argument("--evals", metavar="FILE", help="evaluate.py's rows (joined to the runs by run_id)")
    g.add_argument("--metric", help="a category of --categories (e.g. reading_comp) or a task label")
    g.add_argument("--categories", metavar="FILE", default=str(CATEGORIES),
                   help="the task -> category map (default data/eval/categories.json)")
    args = parser.parse_args(argv)
    if args.only_r == []:
        parser.error("argument --only-r: expected loop counts like 1,4,8")
    if bool(args.evals) != bool(args.metric):
        parser.error("--evals and --metric go together")
    if (args.results is None and not args.equiv) or (args.compare and not args.results):
        parser.error("give a results file (or --equiv R S --phi X)")
    if args.results is None and args.equiv and args.phi is None:
        parser.error("--equiv without a results file needs --phi")
    if args.law == "truncate-or-not" and (args.compare or args.equiv or args.metric or args.only_r):
        parser.error("--law truncate-or-not fits one sweep: --compare, --equiv, --metric and --only-r are the "
                     "iso-depth law's")
    if args.restarts is None:
        args.restarts = 500 if args.law == "iso-depth" else truncate_law.STARTS
    return args


def load_sweep(path, only_r=None, allow_mixed=False, metric=None, law="iso-depth"):
    """Fit-ready rows of one results file (unusable ones dropped, one stderr line each) and notes. `metric`:
    (name, evaluation rows, categories) to fit a downstream loss instead of the validation loss; `law`: the law
    the rows are for (LAWS)."""
    rows, dropped = drop_unusable(load_results(path))
    if metric is not None:
        rows, missing = with_metric(rows, *metric)
        dropped += missing
    for note in dropped:
        print(f"{PROG}: {path} {note}", file=sys.stderr)
    rows = prepare_rows(rows, str(path), law)
    if only_r:
        rows = [row for row in rows if row["r"] in only_r]
    if not rows:
        raise ValueError(f"{path}: no runs left to fit")
    mixed = mixed_settings(rows, law)
    if mixed and not allow_mixed:
        raise ValueError(f"{path}: its runs differ in {'; '.join(mixed)}: one law over them mixes losses that are "
                         f"not comparable (fit each sweep on its own, or pass --allow-mixed)")
    notes = []
    steps = [row.get("steps") for row in rows]
    if None not in steps and max(steps) < MEANINGFUL_STEPS:
        notes.append(f"the longest run trains for {max(steps)} optimiser steps: a chain check (like the smoke grid), "
                     f"not a measurement, so its laws and phi mean nothing")
    if dropped:
        notes.append(f"{len(dropped)} rows dropped, see stderr")
    if metric is not None:
        notes.append(f"the loss fitted is {metric[0]} (downstream, App. I), not the validation loss")
    return rows, notes


def _without(d, key):
    """A copy of dict `d` without `key`."""
    return {k: v for k, v in d.items() if k != key}


def json_ready(analysis):
    """The analysis for --json: architectures by label (each with its key), CIs beside the joint fit, the
    bootstrap's draws (what a delta-phi needs), internals left out. restored_analysis reads it back. Its keys:
    joint (phi, A, alpha, B, beta, E, r2, rmse, ..., phi_ci, phi_ci_at_bound, ...), per_arch, restricted, halves,
    residuals_by_r, bootstrap, frontier, notes, fingerprint; fit_and_report adds compare, delta_phi (with
    delta_phi_ci_at_bound) and equivalence when asked. A CI "at bound" runs to the fitter's search box: not
    identified (laws.ci_bounds_reached); its numbers are kept."""
    boot = analysis.get("bootstrap") or {}
    out = dict(analysis)
    out["per_arch"] = {arch_label(k): _without(v, "local_optima") | {"key": list(k)}
                       for k, v in analysis["per_arch"].items()}
    out["bootstrap"] = boot or None
    out["restricted"] = {k: _without(v, "local_optima") for k, v in analysis["restricted"].items()}
    out["halves"] = {k: _without(v, "local_optima") for k, v in analysis["halves"].items()}
    if analysis["joint"]:
        out["joint"] = _without(analysis["joint"], "local_optima")
        for k in boot:
            if k.endswith("_ci"):
                out["joint"][k] = boot[k]
                # beside the numbers, whether they are the search box's (laws.ci_bounds_reached): phi_ci_at_bound
                out["joint"][k + "_at_bound"] = bool(laws.ci_bounds_reached(k.removesuffix("_ci"), boot[k]))
    return out


# ----------------------------------------------------------------------------------------------
# Reusing an analysis: sweep.sh fits each sweep into <OUT>/fit/fit.json; a later --compare of that sweep
# (or a rerun) reads it back instead of refitting, when the rows, the options and the fitting code are the same.

def code_of(path):
    """A Python file as the interpreter sees it: its syntax tree without docstrings (comments are not in it), so
    that editing a comment or a docstring of the fitting code leaves every stored analysis valid."""
    tree = ast.parse(Path(path).read_text())
    for node in ast.walk(tree):
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and ast.get_docstring(node)):
            node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree)


def analysis_fingerprint(rows, options):
    """sha256 of everything an analysis depends on: the rows fitted, the fit options (restarts, resamples,
    seed, Huber delta) and the fitting code (this file and laws.py, code_of)."""
    digest = hashlib.sha256(json.dumps({"rows": rows, "options": options}, sort_keys=True, default=str).encode())
    for source in (Path(__file__), Path(laws.__file__)):
        digest.update(code_of(source).encode())
    return digest.hexdigest()


def stored_analyses(results, json_out):
    """[(file, analysis as json_ready wrote it)] that fit_laws.py may have written for `results` before: the
    --json target itself, and the JSON files of the sweep's fit folder (sweep.sh's <OUT>/fit/, or the folder
    of a results file kept inside it, like fit/layout_anchored.jsonl). Unreadable files are passed over."""
    results = Path(results)
    folder = results.parent
    if results.name == "results.jsonl":
        folder = results.parent / "fit"
    files = sorted(folder.glob("*.json"))
    if json_out and Path(json_out).is_file():
        files.insert(0, Path(json_out))
    found = []
    for path in files:
        try:
            out = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(out, dict):
            found += [(path, part) for part in (out, out.get("compare")) if isinstance(part, dict)]
    return found


def restored_analysis(stored):
    """The analysis dict analyse() returned, from its json_ready form (per_arch keyed by its key again)."""
    analysis = dict(stored)
    analysis["per_arch"] = {tuple(fit["key"]): _without(fit, "key") for fit in stored["per_arch"].values()}
    return analysis


def reused_or_fitted(path, rows, options, notes, json_out):
    """The analysis of one sweep: one fit_laws.py stored for the same fingerprint, else analyse() now."""
    recipe = asdict(options) | {"notes": notes}
    del recipe["workers"]
    fingerprint = analysis_fingerprint(rows, recipe)
    for file, stored in stored_analyses(path, json_out):
        if stored.get("fingerprint") == fingerprint:
            print(f"{PROG}: {path}: reused the analysis in {file} (same rows, options and fitting code)",
                  file=sys.stderr)
            return restored_analysis(stored)
    analysis = analyse(rows, options)
    analysis["notes"][:0] = notes  # the loading notes first (a stored analysis has them: they are in its fingerprint)
    analysis["fingerprint"] = fingerprint
    return analysis


def plot_title(results):
    """The grid a results file belongs to: sweep.sh writes OUT/results.jsonl, OUT named after the grid."""
    path = Path(results)
    if path.name == "results.jsonl":
        return path.parent.name
    return path.stem


def read_inputs(args):
    """Everything the fits need, read and checked before any compute: [(path, rows, notes)] per sweep."""
    if args.json:
        check_writable(args.json)
    if args.plots:
        check_writable(args.plots, folder=True)
    metric = None
    if args.metric:
        eval_rows = [row for row in load_results(args.evals) if "unreadable" not in row]
        metric = (args.metric, eval_rows, read_categories(args.categories))
    sweeps = []
    for path in (args.results, args.compare):
        if path:
            sweeps.append((path, *load_sweep(path, args.only_r, args.allow_mixed, metric, args.law)))
    if len(sweeps) == 2 and not args.allow_mixed:
        mixed = mixed_settings(sweeps[0][1] + sweeps[1][1])
        if mixed:
            raise ValueError(f"{args.results} and {args.compare} differ in {'; '.join(mixed)}: a delta-phi "
                             f"between them is not the loop mechanism's (pass --allow-mixed to compare anyway)")
    return sweeps


def fit_and_report(args):
    """The fits of each sweep and their report, then delta-phi, the equivalence, --json and --plots."""
    sweeps = read_inputs(args)
    if args.law == "truncate-or-not":
        return fit_truncate_law(args, *sweeps[0])
    fits, out = [], {}
    for k, (path, rows, notes) in enumerate(sweeps):
        seed = args.seed + 1_000_003 * k  # the compared sweep's own restarts and resamples
        options = FitOptions(restarts=args.restarts, bootstrap=args.bootstrap, seed=seed, workers=args.workers)
        analysis = reused_or_fitted(path, rows, options, notes, args.json)
        report(analysis, str(path))
        fits.append(analysis)
    if fits:
        out = json_ready(fits[0])
    if args.compare:
        out["compare"] = {"file": args.compare, **json_ready(fits[1])}
        out["delta_phi"] = report_delta_phi(fits[0], fits[1], args.results, args.compare)
    if args.equiv:
        phi = args.phi
        if phi is None:
            if not (fits[0]["joint"] or {}).get("converged"):
                raise ValueError("--equiv needs a converged joint fit or --phi")
            phi = fits[0]["joint"]["phi"]
        layout = None  # the fitted sweep's layout at r = R, if it has one
        if sweeps:
            looped = [row for row in sweeps[0][1] if row["r"] == args.equiv[0]]
            layout = looped[0] if looped else None
        out["equivalence"] = equivalence(*args.equiv, phi, layout)
        report_equivalence(out["equivalence"])
    if args.json:
        atomic_write(args.json, json.dumps(out, indent=1, default=float).encode())
        print(f"\nwrote {args.json}")
    if args.plots and fits:
        names = make_plots(fits[0], sweeps[0][1], args.plots, plot_title(args.results), args.results)
        print(f"wrote {', '.join(names)} to {args.plots}")


def main(argv=None):
    """The command line: bad input is one line and exit 2 (a ValueError anywhere), a failed write exit 1."""
    args = parse_args(argv)
    try:
        fit_and_report(args)
    except ValueError as err:
        fail(PROG, str(err))
    except OSError as err:  # checked writable up front, but a disk can fill up during the fits
        fail(PROG, f"could not write {err.filename} ({err.strerror or err})", code=1)


if __name__ == "__main__":
    common.exit_on_stop_signals(PROG, "the fits stopped; nothing more is written")
    main()
