"""
The Truncate or Not? scaling law (their §4, Eq. 2-3, App. C): one law over model size, tokens, T forward loops and
B trained (backpropagated) loops,

    L = E + [A (N_eff / N0)^-alpha + H (D / D0)^-beta]^kappa,    N_eff = N_once + g(T, B) N_rec,
    g(T, B) = exp[c (1 - T^-p B^-q)]           g(1, 1) = 1; g grows in T and B towards its ceiling e^c

fitted as their App. C.3 fits it (nine coefficients, least squares in nats, 64 uniform random starts of a
trust-region solver, one point per configuration = the mean of its runs), with its held-out checks (one
configuration, size, target token level, (T, B) setting or forward-loop row left out and refitted), the power-law
gain T^phi_T B^phi_B it is compared with (their Table 8), the empirical looping coefficient g-hat read off the
non-looped runs by PCHIP (§C.1-C.2), separately fitted laws per setting with their compute-optimal frontiers
(Figs. 10-11), and cell-bootstrap CIs of c, p, q and q - 2p. fit_laws.py --law truncate-or-not reports it;
allocation.py derives the paper's allocation answers from it.

Rows are train.py's: T = r, B = r_bwd; a run's budget level is its target tokens over D0 (the truncate-or-not
recipe records both), or its FLOP budget for an iso-depth row. N0 and D0 are the paper's (2.4e8, 2^30) scaled
together to the rows' D0: a CPU grid's D0 = 2^18 gives N0 = 58,594, so the random starts' ranges stay sensible.
"""
import math

from nanoloop import laws  # noqa: F401 (first: it sets the BLAS threads before numpy loads, one per fitting process)
import numpy as np
from scipy.interpolate import PchipInterpolator
from scipy.optimize import least_squares


# The published fit (their Table 4) at N0 = 2.4e8, D0 = 2^30.
PUBLISHED = {"E": 0.29865, "A": 6.48695, "H": 7.63343, "alpha": 0.30568, "beta": 0.39281, "kappa": 0.32510,
             "c": 1.11198, "p": 0.23677, "q": 1.02181}
PAPER_N0, PAPER_D0 = 2.4e8, 2.0 ** 30
# Coordinates (E, log A, log H, alpha, beta, kappa, log c, p, q) and their bounds; the random starts are drawn from
# the narrower ranges (App. C.3 "Solver"). The power-law gain replaces (log c, p, q) by (phi_T, phi_B) (§C.4).
# "none" is the coupled size-data law alone (N_eff = N), what a separately fitted per-setting law is (§D.4).
COUPLED = ("E", "log A", "log H", "alpha", "beta", "kappa")
NAMES = {"bounded": COUPLED + ("log c", "p", "q"), "power": COUPLED + ("phi_T", "phi_B"), "none": COUPLED}
COUPLED_LO, COUPLED_HI = [0.0, -10, -10, 0.01, 0.01, 0.01], [3.0, 15, 15, 3, 3, 3]
COUPLED_INIT_LO, COUPLED_INIT_HI = [0.3, 0.5, 0.5, 0.25, 0.25, 0.15], [1.2, 2.5, 2.5, 0.65, 0.65, 0.45]
LO = {"bounded": np.array(COUPLED_LO + [math.log(1e-3), 1e-3, 1e-3]), "power": np.array(COUPLED_LO + [-5, -5]),
      "none": np.array(COUPLED_LO)}
HI = {"bounded": np.array(COUPLED_HI + [math.log(10.0), 10, 10]), "power": np.array(COUPLED_HI + [5, 5]),
      "none": np.array(COUPLED_HI)}
INIT_LO = {"bounded": np.array(COUPLED_INIT_LO + [math.log(0.2), 0.1, 0.1]),
           "power": np.array(COUPLED_INIT_LO + [0.05, 0.05]), "none": np.array(COUPLED_INIT_LO)}
INIT_HI = {"bounded": np.array(COUPLED_INIT_HI + [math.log(2.0), 2.0, 2.0]),
           "power": np.array(COUPLED_INIT_HI + [0.8, 0.8]), "none": np.array(COUPLED_INIT_HI)}
SEED = 20261010  # their fold seeds: 20261010 + the fold index
STARTS = 64
# The fitting set: configurations at ~9, 18, 37 or 74 target tokens per parameter (App. C.3), the window widened
# by sqrt(2) at both ends; the others (shorter and longer budgets) are the separate test set.
FIT_WINDOW = (6.5, 105.0)
FAMILIES = ("config", "size", "level", "setting", "row")  # hold-outs: Table 7 and the forward-loop rows of §C.5
MIN_CONFIGS = 12


# ----------------------------------------------------------------------------------------------
# The law

def g_loop(T, B, c, p, q):
    """The looping coefficient g(T, B) = exp[c (1 - T^-p B^-q)] (their Eq. 3)."""
    return np.exp(c * (1.0 - np.asarray(T, float) ** -p * np.asarray(B, float) ** -q))


def coefficients(theta, gain="bounded"):
    """The fit's coefficients by name from its coordinates."""
    E, log_a, log_h, alpha, beta, kappa = (float(v) for v in theta[:6])
    coef = {"E": E, "A": math.exp(log_a), "H": math.exp(log_h), "alpha": alpha, "beta": beta, "kappa": kappa}
    if gain == "power":
        return coef | {"phi_T": float(theta[6]), "phi_B": float(theta[7])}
    if gain == "none":
        return coef
    return coef | {"c": math.exp(theta[6]), "p": float(theta[7]), "q": float(theta[8])}


def gain_of(coef, T, B):
    """g(T, B) of a fit: the bounded gain, the power-law gain T^phi_T B^phi_B of the comparator, or 1 (a per-setting
    law, which has no loop term)."""
    if "phi_T" in coef:
        return np.asarray(T, float) ** coef["phi_T"] * np.asarray(B, float) ** coef["phi_B"]
    if "c" not in coef:
        return np.ones_like(np.asarray(T, float))
    return g_loop(T, B, coef["c"], coef["p"], coef["q"])


def law_loss(coef, n_once, n_rec, T, B, D, n0=PAPER_N0, d0=PAPER_D0):
    """The law's loss of models (N_once, N_rec) trained on D tokens at (T, B)."""
    n_eff = np.asarray(n_once, float) + gain_of(coef, T, B) * np.asarray(n_rec, float)
    bracket = coef["A"] * (n_eff / n0) ** -coef["alpha"] + coef["H"] * (np.asarray(D, float) / d0) ** -coef["beta"]
    return coef["E"] + bracket ** coef["kappa"]


def _residuals_and_jacobian(theta, d, gain):
    """Prediction - measurement of every configuration in `d`, and its analytic Jacobian in the coordinates (their
    solver uses one; 3-4x fewer law evaluations than finite differences)."""
    coef = coefficients(theta, gain)
    g = gain_of(coef, d["T"], d["B"])
    x = (d["n_once"] + g * d["n_rec"]) / d["n0"]
    y = d["D"] / d["d0"]
    size_term = coef["A"] * x ** -coef["alpha"]
    data_term = coef["H"] * y ** -coef["beta"]
    bracket = size_term + data_term
    outer = coef["kappa"] * bracket ** (coef["kappa"] - 1)  # dL / d(bracket)
    dL_dg = outer * -coef["alpha"] * size_term / x * d["n_rec"] / d["n0"]
    if gain == "power":
        dg = [g * np.log(d["T"]), g * np.log(d["B"])]
    elif gain == "none":
        dg = []
    else:
        inner = d["T"] ** -coef["p"] * d["B"] ** -coef["q"]
        dg = [g * coef["c"] * (1 - inner), g * coef["c"] * inner * np.log(d["T"]),
              g * coef["c"] * inner * np.log(d["B"])]
    columns = [np.ones_like(bracket), outer * size_term, outer * data_term, outer * -size_term * np.log(x),
               outer * -data_term * np.log(y), bracket ** coef["kappa"] * np.log(bracket)] + [dL_dg * v for v in dg]
    predicted = coef["E"] + bracket ** coef["kappa"]
    return predicted - d["L"], np.stack(columns, axis=1)


def _trf(d, x0, gain="bounded"):
    """One trust-region-reflective least-squares run from x0 (App. C.3: analytic Jacobian, Jacobian scaling, <= 4000
    evaluations, tolerances 1e-12). Returns (sum of squares, coordinates, converged, message)."""
    res = least_squares(lambda th: _residuals_and_jacobian(th, d, gain)[0], x0,
                        jac=lambda th: _residuals_and_jacobian(th, d, gain)[1], bounds=(LO[gain], HI[gain]),
                        method="trf", x_scale="jac", max_nfev=4000, ftol=1e-12, xtol=1e-12, gtol=1e-12)
    return float(2 * res.cost), res.x, bool(res.status > 0), res.message


def _trf_power(d, x0):
    return _trf(d, x0, "power")


def _trf_none(d, x0):
    return _trf(d, x0, "none")


SOLVERS = {"bounded": _trf, "power": _trf_power, "none": _trf_none}  # top-level functions: they pickle


def best_fit(d, starts=STARTS, seed=SEED, gain="bounded", workers=1, x0=None):
    """The lowest-cost converged of `starts` TRF runs from uniform random points of the App. C.3 ranges (x0, when
    given, first: a bootstrap refit also starts from the full fit)."""
    points = np.random.default_rng(seed).uniform(INIT_LO[gain], INIT_HI[gain], size=(starts, len(LO[gain])))
    if x0 is not None:
        points = np.vstack([np.asarray(x0, float)[None], points])
    runs = laws.multistart(SOLVERS[gain], d, points, workers)
    converged = [run for run in runs if run[2]]
    sse, theta, ok, message = min(converged or runs, key=lambda run: run[0])
    return {**coefficients(theta, gain), "gain": gain, "sse": sse, "converged": ok, "message": str(message),
            "converged_starts": len(converged), "starts": len(points), "theta": [float(v) for v in theta]}


def chi(T, B, share, coef):
    """Compute paid per effective parameter (their §5.1), chi = N_comp / N_eff with recurrent share N_rec / N:
    6 N_comp = 6 N_once + (2T + 4B) N_rec (2 FLOPs per parameter and token forward, 4 backward)."""
    g = gain_of(coef, T, B)
    comp = (1 - share) + share * (2 * np.asarray(T, float) + 4 * np.asarray(B, float)) / 6
    return comp / ((1 - share) + share * g)


def chi_table(coef, share, Ts=(1, 2, 4, 8, 16)):
    """The best backward-loop count per T (their Table 5): B* = argmin over B in 1..T of chi(T, B); chi at B* and at
    B = T; N* and D* at B* relative to full BPTT at the same T and compute. At fixed compute the looped problem is
    the non-looped one at budget C / chi (their Lemma D.1), so N_eff* scales as (C / chi)^(beta / (alpha + beta))
    and D* as (C / chi)^(alpha / (alpha + beta)). `share`: one N_rec / N, or {T: share}."""
    table = []
    for T in Ts:
        rho = share[T] if isinstance(share, dict) else share
        by_b = chi(T, np.arange(1, T + 1), rho, coef)
        b_star = int(np.argmin(by_b)) + 1
        ratio = by_b.min() / by_b[-1]  # below 1: truncation needs less compute for the same loss
        ab = coef["alpha"] + coef["beta"]
        g_full, g_star = (float(gain_of(coef, T, b)) for b in (T, b_star))
        size_ratio = ((1 - rho) + rho * g_full) / ((1 - rho) + rho * g_star)  # (N / N_eff) at B* over at B = T
        table.append({"T": T, "share": rho, "B_star": b_star, "chi_star": float(by_b.min()), "chi_full": float(by_b[-1]),
                      "N_star_ratio": float(size_ratio * ratio ** (-coef["beta"] / ab)),
                      "D_star_ratio": float(ratio ** (-coef["alpha"] / ab)), "g_star": g_star, "g_full": g_full,
                      "saving": float(1 - ratio)})
    return table


# ----------------------------------------------------------------------------------------------
# The data: one point per configuration, with the labels the checks group by

def level_of(row):
    """A row's budget level: target tokens / D0 (a token horizon), else its FLOP budget; None without either."""
    if row.get("tokens_target") and row.get("d0"):
        return float(row["tokens_target"]) / float(row["d0"])
    return row.get("flops_budget")


def configurations(rows, fit_window=FIT_WINDOW):
    """One point per configuration (N_once, N_rec, tokens, T, B), its runs' (seeds') losses averaged so that each
    configuration weighs the same; labels: config, size (N), level (budget levels within 2% merged), setting,
    row (T); `fit` marks the fitting set (target tokens per parameter in fit_window); n0, d0: the scales."""
    by_cfg = {}
    for row in rows:
        key = (row["n_once"], row["n_rec"], row["tokens"], int(row["r"]), int(row["r_bwd"]))
        by_cfg.setdefault(key, []).append(row)
    keys = sorted(by_cfg)
    first = [by_cfg[key][0] for key in keys]
    a = np.array(keys, dtype=float)
    n_params = a[:, 0] + a[:, 1]
    target = np.array([float(row.get("tokens_target") or row["tokens"]) for row in first])
    d0s = {float(row["d0"]) for row in rows if row.get("d0")}
    d0 = d0s.pop() if len(d0s) == 1 else PAPER_D0
    per_param = target / n_params
    level_index, level_values = laws.budget_levels([level_of(row) for row in first])
    return {"n_once": a[:, 0], "n_rec": a[:, 1], "D": a[:, 2], "T": a[:, 3], "B": a[:, 4],
            "L": np.array([np.mean([row["val_loss"] for row in by_cfg[key]]) for key in keys]),
            "runs": np.array([len(by_cfg[key]) for key in keys]), "config": np.arange(len(keys)), "size": n_params,
            "level": level_values[level_index],
            "setting": a[:, 3] * 1000 + a[:, 4], "row": a[:, 3], "tokens_per_param": per_param,
            "fit": (per_param > fit_window[0]) & (per_param < fit_window[1]),
            "n0": d0 * PAPER_N0 / PAPER_D0, "d0": d0}


def subset(d, mask):
    """The configurations of `d` where mask holds (the scales n0, d0 stay)."""
    return {k: (v[mask] if isinstance(v, np.ndarray) else v) for k, v in d.items()}


def check_design(d):
    """ValueError unless the fitting set can identify the nine coefficients: enough configurations, non-looped and
    looped ones, and some truncated ones (with B = T everywhere only p + q is identified)."""
    if len(d["L"]) < MIN_CONFIGS:
        raise ValueError(f"{len(d['L'])} configurations in the fitting set (target tokens per parameter in "
                         f"{FIT_WINDOW[0]:g}..{FIT_WINDOW[1]:g}) are too few for nine coefficients; need {MIN_CONFIGS}")
    if not np.any(d["T"] == 1) or not np.any(d["T"] > 1):
        raise ValueError("the law needs non-looped (T = 1) and looped runs")


# ----------------------------------------------------------------------------------------------
# The fit and its held-out checks (App. C.3, Tables 3, 7, 8, §C.5)

def errors(predicted, measured):
    """RMSE, MAE, bias (prediction - measurement) and the largest |error| in nats, as their Table 7 pools them."""
    err = np.asarray(predicted, float) - np.asarray(measured, float)
    if not len(err):
        return {"n": 0}
    return {"n": int(len(err)), "rmse": float(np.sqrt(np.mean(err ** 2))), "mae": float(np.mean(np.abs(err))),
            "bias": float(np.mean(err)), "max_error": float(np.abs(err).max())}


def predict(coef, d):
    return law_loss(coef, d["n_once"], d["n_rec"], d["T"], d["B"], d["D"], d["n0"], d["d0"])


def fit_set(d, starts=STARTS, seed=SEED, gain="bounded", workers=1):
    """The law fitted on d's fitting set, its in-sample errors and R^2, and its errors on the separate test set."""
    fitting = subset(d, d["fit"])
    fit = best_fit(fitting, starts, seed, gain, workers)
    resid = predict(fit, fitting) - fitting["L"]
    fit["r2"] = 1 - float(resid @ resid) / float(np.sum((fitting["L"] - fitting["L"].mean()) ** 2))
    fit["in_sample"] = errors(predict(fit, fitting), fitting["L"])
    test = subset(d, ~d["fit"])
    fit["test_set"] = errors(predict(fit, test), test["L"])
    fit["on_bound"] = [name for name, v, lo, hi in zip(NAMES[gain], fit["theta"], LO[gain], HI[gain])
                       if min(v - lo, hi - v) <= 1e-6]  # the box's answer, not the data's
    return fit


def _fold(task):
    """One held-out fold: refit on the rest from scratch (no full-data coefficients), predict the fold."""
    fitting, held_out, starts, seed, gain = task
    fit = best_fit(subset(fitting, ~held_out), starts, seed, gain)
    return (predict(fit, subset(fitting, held_out)) - fitting["L"][held_out]).tolist(), fit["converged"]


def holdout(d, family, starts=STARTS, seed=SEED, gain="bounded", workers=1):
    """Held-out errors with one `family` label of the fitting set left out per fold (config: each configuration;
    size; level: a target token level; setting: a (T, B); row: every configuration with that T), each fold refit
    from `starts` random starts seeded SEED + its index; pooled as their Table 7 pools them, plus each fold's."""
    fitting = subset(d, d["fit"])
    labels = sorted(set(fitting[family].tolist()))
    tasks = [(fitting, fitting[family] == label, starts, seed + j, gain) for j, label in enumerate(labels)]
    results = laws.pmap(_fold, tasks, workers)
    pooled = errors([e for errs, _ in results for e in errs], np.zeros(sum(len(errs) for errs, _ in results)))
    folds = [{"label": float(label), **errors(errs, np.zeros(len(errs)))} for label, (errs, _) in zip(labels, results)]
    return {"family": family, "gain": gain, "fits": len(labels), **pooled, "folds": folds,
            "converged_folds": int(sum(ok for _, ok in results))}


# ----------------------------------------------------------------------------------------------
# What the runs say without the law's gain: g-hat (§C.1-C.2) and the matched-compute pairs (Table 6)

def empirical_g(d, fit):
    """g-hat of every looped configuration (their §C.2): at its target level, the non-looped (T = 1)
    configurations of >= 3 sizes with strictly falling losses give log N as a PCHIP function of the loss; the
    looped loss read off it is the effective size N_eff-hat, and g-hat = (N_eff-hat - N_once) / N_rec. Only inside
    the references' loss range (no extrapolation). Each with the law's g(T, B) beside it."""
    out = []
    for level in sorted(set(d["level"].tolist())):
        ref = (d["level"] == level) & (d["T"] == 1)
        order = np.argsort(d["L"][ref])  # ascending loss: descending size
        losses, sizes = d["L"][ref][order], d["size"][ref][order]
        if len(losses) < 3 or np.any(np.diff(losses) <= 0) or np.any(np.diff(sizes) >= 0):
            continue
        size_of_loss = PchipInterpolator(losses, np.log(sizes))
        for i in np.flatnonzero((d["level"] == level) & (d["T"] > 1)):
            if not losses[0] <= d["L"][i] <= losses[-1]:
                continue
            n_eff = float(np.exp(size_of_loss(d["L"][i])))
            out.append({"T": int(d["T"][i]), "B": int(d["B"][i]), "size": float(d["size"][i]), "level": level,
                        "g_hat": (n_eff - d["n_once"][i]) / d["n_rec"][i],
                        "g_law": float(gain_of(fit, d["T"][i], d["B"][i]))})
    return out


def g_summary(estimates):
    """Per (T, B): the median g-hat and its 25th/75th percentiles (equal weight per configuration), n, and the
    law's g (their Figure 6)."""
    settings = sorted({(e["T"], e["B"]) for e in estimates})
    table = []
    for T, B in settings:
        values = [e["g_hat"] for e in estimates if (e["T"], e["B"]) == (T, B)]
        law = next(e["g_law"] for e in estimates if (e["T"], e["B"]) == (T, B))
        q25, median, q75 = np.percentile(values, [25, 50, 75])
        table.append({"T": T, "B": B, "n": len(values), "median": float(median), "q25": float(q25),
                      "q75": float(q75), "g_law": law})
    return table


PAIRS = (((8, 2), (4, 4)), ((4, 1), (2, 2)))  # equal compute per token (T + 2B): their Table 6 and §C.1


def matched_pairs(d):
    """For each pair of settings that cost the same per token, the loss difference truncated - full at every
    (size, level) where both ran (positive: full BPTT is better at equal compute)."""
    out = []
    for truncated, full in PAIRS:
        diffs = []
        for size in sorted(set(d["size"].tolist())):
            for level in sorted(set(d["level"].tolist())):
                cell = (d["size"] == size) & (d["level"] == level)
                a = d["L"][cell & (d["T"] == truncated[0]) & (d["B"] == truncated[1])]
                b = d["L"][cell & (d["T"] == full[0]) & (d["B"] == full[1])]
                if len(a) and len(b):
                    diffs.append({"size": size, "level": level, "delta": float(a[0] - b[0])})
        out.append({"truncated": truncated, "full": full, "cells": diffs})
    return out


# ----------------------------------------------------------------------------------------------
# Separately fitted laws per setting and their compute-optimal frontiers (§D.4, Figs. 10-11)

def compute_per_token_factor(T, B, share):
    """C / (6 N D) of a setting with recurrent share N_rec/N (their Eq. 4): 1 - share + share (T + 2B) / 3."""
    return 1 - share + share * (T + 2 * B) / 3


def setting_frontier(fit, T, B, share, compute, n0, d0):
    """(N*, D*, L*) of a per-setting law at each compute C = 6 N (1 - share + share (T + 2B)/3) D: the loss
    minimised over N on a fine log grid (10^3 .. 10^13 parameters)."""
    n_grid = np.geomspace(1e3, 1e13, 4001)
    factor = compute_per_token_factor(T, B, share)
    out = []
    for C in np.atleast_1d(compute):
        D = C / (6 * n_grid * factor)
        losses = law_loss(fit, n_grid, 0, 1, 1, D, n0, d0)
        j = int(np.argmin(losses))
        out.append((float(n_grid[j]), float(D[j]), float(losses[j])))
    return out


def per_setting_laws(d, starts=STARTS, seed=SEED, workers=1):
    """The coupled law fitted to each setting's configurations on its own (six coefficients, all budgets of the
    setting: as their Figure 10 fits each), with the compute range of its runs."""
    out = {}
    for T, B in sorted({(int(t), int(b)) for t, b in zip(d["T"], d["B"])}):
        mine = (d["T"] == T) & (d["B"] == B)
        if mine.sum() < 8:
            continue
        part = subset(d, mine)
        share = float(np.median(part["n_rec"] / part["size"]))
        fit = best_fit(part, starts, seed, "none", workers)
        spent = 6 * part["size"] * compute_per_token_factor(T, B, share) * part["D"]
        out[(T, B)] = {**fit, "share": share, "compute_range": (float(spent.min()), float(spent.max())),
                       "rmse": errors(predict(fit, part), part["L"])["rmse"]}
    return out


def compute_saving(laws_by_setting, cheaper, dearer, n0, d0, points=25):
    """1 - C_cheaper / C_dearer at equal loss along the two frontiers, for losses both reach inside the compute
    range both settings' runs span: the compute the cheaper setting saves (their Figure 10, "33-35% at T = 8")."""
    if cheaper not in laws_by_setting or dearer not in laws_by_setting:
        return None
    a, b = laws_by_setting[cheaper], laws_by_setting[dearer]
    lo = max(a["compute_range"][0], b["compute_range"][0])
    hi = min(a["compute_range"][1], b["compute_range"][1])
    if lo >= hi:
        return None
    grid = np.geomspace(lo / 10, hi * 10, 400)
    loss_a = np.array([pt[2] for pt in setting_frontier(a, *cheaper, a["share"], grid, n0, d0)])
    loss_b = np.array([pt[2] for pt in setting_frontier(b, *dearer, b["share"], grid, n0, d0)])
    savings = []
    for C in np.geomspace(lo, hi, points):  # the dearer setting's loss at C, reached by the cheaper at C'
        target = np.interp(np.log(C), np.log(grid), loss_b)
        if not loss_a.min() <= target <= loss_a.max():
            continue
        order = np.argsort(loss_a)
        C_cheaper = float(np.exp(np.interp(target, loss_a[order], np.log(grid)[order])))
        savings.append(1 - C_cheaper / C)
    if not savings:
        return None
    return {"cheaper": cheaper, "dearer": dearer, "min": min(savings), "max": max(savings),
            "median": float(np.median(savings)), "range": (lo, hi)}


# ----------------------------------------------------------------------------------------------
# Bootstrap CIs for the loop coefficients

def cells_of(d):
    """Each fitting configuration's (size, level) cell index: the bootstrap resamples whole cells, keeping every
    setting of a size and level together (the comparisons that identify p and q)."""
    keys = sorted({(s, lv) for s, lv in zip(d["size"], d["level"])})
    return np.array([keys.index((s, lv)) for s, lv in zip(d["size"], d["level"])]), len(keys)


def _resample(task):
    fitting, weights, x0, starts, seed = task
    picked = subset(fitting, np.repeat(np.arange(len(weights)), weights))
    fit = best_fit(picked, starts, seed, "bounded", x0=x0)
    return fit["c"], fit["p"], fit["q"], fit["converged"]


def bootstrap(d, fit, resamples=200, starts=8, seed=SEED, workers=1):
    """95% percentile CIs of c, p, q and q - 2p (Lemma D.2's test: full BPTT when both loop counts are free iff
    q > 2p) from `resamples` draws of the fitting set's (size, level) cells with replacement, each refitted from the
    full fit and `starts` random starts; the share of draws with q > 2p."""
    fitting = subset(d, d["fit"])
    cell, n_cells = cells_of(fitting)
    rng = np.random.default_rng(seed)
    tasks = []
    for i in range(resamples):
        draws = np.bincount(rng.integers(0, n_cells, n_cells), minlength=n_cells)
        tasks.append((fitting, draws[cell], fit["theta"], starts, seed + 1 + i))
    results = [r for r in laws.pmap(_resample, tasks, workers) if r[3]]
    c, p, q = (np.array([r[k] for r in results]) for k in range(3))
    gap = q - 2 * p
    ci = {name: [float(v) for v in np.percentile(values, [2.5, 97.5])]
          for name, values in (("c", c), ("p", p), ("q", q), ("q_minus_2p", gap))}
    return {"resamples": resamples, "converged": len(results), "cells": n_cells, **{k + "_ci": v for k, v in ci.items()},
            "frac_q_gt_2p": float(np.mean(gap > 0))}


# ----------------------------------------------------------------------------------------------
# The whole analysis of one sweep (what fit_laws.py --law truncate-or-not reports)

SAVINGS = (((8, 2), (8, 8)), ((4, 2), (4, 4)), ((4, 4), (8, 2)), ((2, 2), (4, 1)))  # cheaper-or-not, at equal loss


def analyse(rows, starts=STARTS, families=FAMILIES, resamples=200, workers=1, fit_window=FIT_WINDOW):
    """The law's fit and every check of their App. C on fit_laws.prepare_token_rows rows: the bounded and the
    power-law gain (in-sample, test set, each held-out family), g-hat against g(T, B), the matched-compute pairs,
    the per-setting laws and their compute savings, and the bootstrap of c, p, q, q - 2p. ValueError if the
    design cannot identify the law."""
    d = configurations(rows, fit_window)
    check_design(subset(d, d["fit"]))
    fits = {gain: fit_set(d, starts, SEED, gain, workers) for gain in ("bounded", "power")}
    notes = []
    if np.all(d["T"] == d["B"]):
        notes.append("every configuration has B = T: only p + q is identified, not p and q apart")
    holdouts = [holdout(d, family, starts, SEED, gain, workers) for family in families for gain in fits]
    per_setting = per_setting_laws(d, starts, SEED, workers)
    savings = [compute_saving(per_setting, a, b, d["n0"], d["d0"]) for a, b in SAVINGS]
    boot = None
    if resamples and fits["bounded"]["converged"]:
        boot = bootstrap(d, fits["bounded"], resamples, 8, SEED, workers)
    estimates = empirical_g(d, fits["bounded"])
    points = [{"T": int(d["T"][i]), "B": int(d["B"][i]), "size": float(d["size"][i]), "level": float(d["level"][i]),
               "tokens_per_param": float(d["tokens_per_param"][i]), "L": float(d["L"][i]), "fit": bool(d["fit"][i]),
               **{gain: float(predict(fit, subset(d, d["config"] == i))[0]) for gain, fit in fits.items()}}
              for i in range(len(d["L"]))]
    return {"configs": int(len(d["L"])), "fitting": int(d["fit"].sum()), "runs": int(d["runs"].sum()),
            "sizes": sorted(set(d["size"].tolist())), "levels": sorted(set(d["level"].tolist())),
            "settings": sorted({(int(t), int(b)) for t, b in zip(d["T"], d["B"])}), "fit_window": list(fit_window),
            "n0": d["n0"], "d0": d["d0"], "fits": fits, "holdouts": holdouts, "bootstrap": boot,
            "g_hat": estimates, "g_summary": g_summary(estimates) if estimates else [],
            "pairs": matched_pairs(d), "per_setting": {f"{t},{b}": fit for (t, b), fit in per_setting.items()},
            "savings": [s for s in savings if s is not None], "notes": notes, "starts": starts, "points": points}
