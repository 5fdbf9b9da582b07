"""
The scaling laws of the iso-depth study and their fits, as functions of plain rows (one dict per run, as
train.py writes them): the Huber-on-log objective of a Chinchilla law and of the joint law with phi, its
multi-start L-BFGS-B minimisation, the block bootstrap over (budget, r) cells, the compute-optimal
frontier along an architecture's width family, and the looped/non-looped equivalence. fit_laws.py is the
script around them (loading, checking, the analysis of a sweep, its report and plots).

    fit = fit_joint(rows, restarts=500)          # phi, A, alpha, B, beta, E, R2, RMSE, converged, ...
    law_loss(fit, n_once, n_rec, r, tokens)      # the fitted law's loss

The laws (paper §3.2, §4.2-4.3), with N the non-embedding parameters and D the training tokens:
    Chinchilla, per architecture (Eq. 2)   L = E + A N^-alpha + B D^-beta
    joint, one law for every r (Eq. 3)     L = E + A (N_once + r^phi N_rec)^-alpha + B D^-beta
phi is the worth of a recurrence: the shared block counts as r^phi unique copies of itself. phi = 0: looping
adds nothing; phi = 1: a loop is worth a unique block, and at equal FLOPs every r would reach the same loss; the
paper measures 0.46 [0.41, 0.53]. Both laws are fitted as Eq. 4 prescribes (App. E, "Optimisation details"):
Huber loss on log L - log L_hat summed over runs, best of 500 random L-BFGS-B starts in a box. Around the fits:
the block bootstrap's CIs (App. G.2), the budget halves (G.3), the residuals by r (G.1), the frontier (§4.2), the
equivalence of model sizes (§1, App. G.5) and delta-phi between two sweeps (§5).
"""
import math
import os
import signal
from concurrent.futures import ProcessPoolExecutor
from dataclasses import fields

# L-BFGS-B calls BLAS on 5-20 element arrays; with OpenBLAS's thread pool each call wakes and
# syncs every thread (dev/bench_fit.py). We parallelise over processes instead. OpenBLAS reads this
# once, when numpy/scipy first load it; forked workers inherit it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402
from scipy.interpolate import PchipInterpolator  # noqa: E402
from scipy.optimize import minimize, minimize_scalar  # noqa: E402
from scipy.special import logsumexp  # noqa: E402

import flops  # noqa: E402

# The paper's protocol (iso-depth §4.2, App. E "Optimisation details"): Huber (delta = 1e-3) on
# log L - log L_hat summed over runs; best of 500 uniform random L-BFGS-B starts in the box below,
# parameters (a, b, e, alpha, beta[, phi]) with A = e^a, B = e^b, E = e^e.
HUBER_DELTA = 1e-3
BOX_LO = np.array([-5.0, -5.0, -3.0, 0.0, 0.0, -3.0])
BOX_HI = np.array([35.0, 35.0, 2.0, 2.5, 2.5, 3.0])
# Tight tolerances on purpose: the objective is ~1e-3 and mostly in Huber's linear regime, so the
# landscape is flat and kinked. scipy's ftol is a relative reduction test against max(|f|, 1), i.e.
# an absolute one here: the default (2.2e-9) stops runs while f still falls by 1e-9 per step and
# leaves the amplitudes visibly off (A 477.5 instead of 477.8 on Epoch's data, dev/bench_fit.py).
LBFGS_OPTIONS = {"maxiter": 10_000, "maxfun": 40_000, "ftol": 1e-12, "gtol": 1e-12, "maxls": 50}
HIT_RTOL = 1e-6  # a restart "hits" the optimum when its objective is within this relative margin
N_LOCAL_OPTIMA = 8  # distinct local optima of a full-data fit kept as bootstrap starting points
CONFIG_FIELDS = tuple(f.name for f in fields(flops.ModelConfig))
JOINT_FIELDS = ("r", "n_once", "n_rec", "tokens", "val_loss", "flops_budget")


# ----------------------------------------------------------------------------------------------
# Runs grouped into architectures and budgets

def flag_set(row, name):
    """A boolean field of a row, from JSON (true) or CSV text ("True", "1")."""
    return str(row.get(name)).lower() in ("1", "true", "1.0")


def is_untied(row):
    """Whether a row is Truncate or Not?'s untied model (App. E.2)."""
    return flag_set(row, "untied")


def arch_key(row):
    """Architecture of a run: (r, r_bwd, injection). The untied model shares no weights between its loops, so the
    iso-depth law reads it as an unshared model, (1, 1, "untied"): r^phi = 1 and N_eff = N, every parameter once.
    At any loop count it is the anchor that differs from a looped model by the sharing alone (layout and compute
    are the same), which is what phi measures."""
    if is_untied(row):
        return (1, 1, "untied")
    return (int(row["r"]), int(row["r_bwd"]), str(row["injection"]))


MARKER_OF_R = {1: "o", 2: "s", 4: "^", 8: "D"}  # every figure's marker of each r; other loop counts: "v"


def arch_label(key):
    """An architecture's name in reports and legends: "r=1", "r=4 bwd=2 linear", or "untied"."""
    if key[2] == "untied":
        return "untied"
    if key[0] == 1:
        return f"r={key[0]}"
    return f"r={key[0]} bwd={key[1]} {key[2]}"


def by_arch(rows):
    """{arch_key: its rows}, architectures in sorted order (r = 1 first): every per-architecture loop's order."""
    groups = {}
    for row in rows:
        groups.setdefault(arch_key(row), []).append(row)
    return dict(sorted(groups.items()))


def column(rows, key):
    """One field of every row, as a float array."""
    return np.array([float(row[key]) for row in rows])


def budget_levels(budgets, rtol=0.02):
    """Each run's budget level, budgets within 2% merged, and each level's median, ascending. The rows' budgets are
    the planned C, but a level must also hold runs that recorded what they spent (F x D rounds to whole steps)."""
    budgets = np.asarray(budgets, dtype=float)
    level, groups = np.empty(len(budgets), dtype=int), []
    for i in np.argsort(budgets):
        if not groups or budgets[i] > budgets[groups[-1][0]] * (1 + rtol):
            groups.append([])
        groups[-1].append(i)
        level[i] = len(groups) - 1
    return level, np.array([float(np.median(budgets[g])) for g in groups])


def _config_from_row(row, scale=None):
    """The flops.ModelConfig of a row (optionally at another width); None if it lacks fields or flops.py objects."""
    if row.get("r") in (None, "") or row.get("scale") in (None, ""):
        return None
    kw = {}
    for f in fields(flops.ModelConfig):
        value = row.get(f.name)
        if value in (None, ""):
            continue
        if f.type in (int, float):  # JSON or CSV values
            value = f.type(value)
        kw[f.name] = value
    if scale is not None:
        kw["scale"] = scale
    kw["scale"] = float(kw["scale"])  # fractional widths on the CPU grid
    for flag in ("random_state_init", "untied"):
        kw[flag] = flag_set(kw, flag)
    if kw["r"] == 1 and kw.get("injection", "none") == "none":
        # train.py's r = 1 rows store the resolved plain stack; let ModelConfig resolve it from depth
        # alone. A looped layout run once (truncate-or-not's (T, B) = (1, 1)) keeps its layout.
        for k in ("prelude", "coda", "recur", "injection", "r_bwd"):
            kw.pop(k, None)
    try:
        return flops.ModelConfig(**kw)
    except (TypeError, ValueError):
        return None


# ----------------------------------------------------------------------------------------------
# The Huber-on-log Chinchilla objective (paper Eq. 4) with its analytic gradient

def _problem(n_once, n_rec, r, D, L, phi=None, weights=None, delta=HUBER_DELTA):
    """The data of one fit as plain arrays (picklable for worker processes). phi=None fits phi; a
    per-architecture law is the joint law with N_rec = 0 and phi fixed. weights: how often each run counts
    (a bootstrap resample's, resample_weights). The fit is on log L, so a residual is a relative error, and
    Huber's delta = 1e-3 counts a run off the law by more than 0.1% linearly, not squared: an outlier pulls less."""
    if weights is None:
        weights = np.ones(len(L))
    n_free = 6 if phi is None else 5
    return {
        "n_once": np.asarray(n_once, float),
        "n_rec": np.asarray(n_rec, float),
        "logr": np.log(np.asarray(r, float)),
        "logD": np.log(np.asarray(D, float)),
        "logL": np.log(np.asarray(L, float)),
        "delta": float(delta),
        "w": np.asarray(weights, float),
        "phi_free": phi is None,
        "phi": 0.0 if phi is None else float(phi),
        "lo": BOX_LO[:n_free],
        "hi": BOX_HI[:n_free],
    }


def _phi(theta, prob):
    """phi of a parameter vector: its sixth entry, or the problem's fixed phi."""
    if prob["phi_free"]:
        return theta[5]
    return prob["phi"]


def _objective(theta, prob):
    """Summed Huber loss of log L - log L_hat and its gradient, log L_hat = LSE(a - alpha x,
    b - beta y, e) with x = log(N_once + r^phi N_rec), y = log D. The LSE is written out: the gradient needs
    its softmax weights, and a scipy.special.logsumexp call costs 13x as much (322 vs 24 us on 116 runs)."""
    a, b, e, alpha, beta = theta[:5]
    rphi = np.exp(_phi(theta, prob) * prob["logr"])
    neff = prob["n_once"] + rphi * prob["n_rec"]
    x, y = np.log(neff), prob["logD"]
    t1, t2 = a - alpha * x, b - beta * y
    m = np.maximum(np.maximum(t1, t2), e)
    e1, e2, e3 = np.exp(t1 - m), np.exp(t2 - m), np.exp(e - m)
    s = e1 + e2 + e3
    res = m + np.log(s) - prob["logL"]
    delta, w = prob["delta"], prob["w"]
    absr = np.abs(res)
    f = w @ np.where(absr <= delta, 0.5 * res * res, delta * (absr - 0.5 * delta))
    g = w * np.clip(res, -delta, delta) / s  # Huber'(res) times 1/s; dLSE/dt_k = e_k / s
    u1, u2 = g * e1, g * e2
    grad = [u1.sum(), u2.sum(), (g * e3).sum(), -(u1 @ x), -(u2 @ y)]
    if prob["phi_free"]:  # dx/dphi = r^phi log r N_rec / N_eff
        grad.append(-alpha * (u1 @ (rphi * prob["logr"] * prob["n_rec"] / neff)))
    return f, np.array(grad)


def predict_log(theta, prob):
    """log L_hat of every run of `prob` at parameters theta (a, b, e, alpha, beta[, phi]): the law in log space."""
    a, b, e, alpha, beta = theta[:5]
    rphi = np.exp(_phi(theta, prob) * prob["logr"])
    x = np.log(prob["n_once"] + rphi * prob["n_rec"])
    return logsumexp([a - alpha * x, b - beta * prob["logD"], np.full_like(x, e)], axis=0)


# ----------------------------------------------------------------------------------------------
# Multi-start L-BFGS-B, spread over processes

def _lbfgs(prob, x0):
    """One L-BFGS-B run from x0: (objective, theta, converged, message)."""
    bounds = list(zip(prob["lo"], prob["hi"]))
    res = minimize(_objective, x0, args=(prob,), jac=True, method="L-BFGS-B", bounds=bounds, options=LBFGS_OPTIONS)
    msg = res.message if isinstance(res.message, str) else res.message.decode()
    # A line-search stall at machine precision is a converged point, not a failure, when the
    # projected gradient is negligible against the Huber slope (delta per run).
    held = ((res.x <= prob["lo"]) & (res.jac > 0)) | ((res.x >= prob["hi"]) & (res.jac < 0))
    projected = np.where(held, 0.0, res.jac)
    stalled = msg.startswith("ABNORMAL") and np.abs(projected).max() < 1e-7 * prob["delta"] * prob["w"].sum()
    ok = bool(res.success or stalled) and res.nit < LBFGS_OPTIONS["maxiter"]
    return float(res.fun), res.x, ok, msg


def _solve_each(task):
    """One worker's share of a multistart: solve(data, x0) from each of its starts (top level, so it pickles)."""
    solve, data, starts = task
    return [solve(data, x0) for x0 in starts]


def _worker_start():
    """A pool worker leaves stopping to its parent: it ignores Ctrl-C (which a terminal sends to every process
    of the group) and dies of SIGTERM, whatever handler it inherited by fork from the script."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def pmap(fn, tasks, workers):
    """map() over `workers` processes (fork keeps it cheap), in order, contiguous chunks per process. Interrupted
    (Ctrl-C, or a stop signal's SystemExit), it terminates its workers before passing the interrupt on: leaving
    the pool would wait for the rest of their chunks, up to a whole bootstrap."""
    if workers <= 1 or len(tasks) <= 1:
        return [fn(t) for t in tasks]
    ex = ProcessPoolExecutor(max_workers=min(workers, len(tasks)), initializer=_worker_start)
    try:
        return list(ex.map(fn, tasks, chunksize=-(-len(tasks) // workers)))
    except BaseException:
        for process in list(ex._processes.values()):  # its workers (Python 3.14 names this terminate_workers())
            process.terminate()
        raise
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


def multistart(solve, data, starts, workers=1):
    """solve(data, x0) from every start, returned in start order however they are split over workers."""
    chunks = np.array_split(np.asarray(starts), max(1, min(workers, len(starts))))
    tasks = [(solve, data, chunk) for chunk in chunks if len(chunk)]
    runs = []
    for part in pmap(_solve_each, tasks, workers):
        runs.extend(part)
    return runs


def _starts(prob, restarts, rng, x0=None):
    """x0 (none, one point or several) first, then `restarts` uniform random points in the box."""
    starts = rng.uniform(prob["lo"], prob["hi"], size=(restarts, len(prob["lo"])))
    if x0 is None:
        return starts
    given = np.atleast_2d(np.asarray(x0, float))[:, :len(prob["lo"])]
    return np.vstack([given, starts])


def _distinct_optima(runs, funs):
    """The distinct local optima of a multistart, best first: bootstrap refits start from these (a
    resample's optimum is almost always next to one of the full-data basins)."""
    kept_funs, optima = [], []
    for j in np.argsort(funs, kind="stable"):
        if len(optima) == N_LOCAL_OPTIMA:
            break
        if all(abs(funs[j] - f) > HIT_RTOL * f for f in kept_funs):
            kept_funs.append(funs[j])
            optima.append(runs[j][1].tolist())
    return optima


def _fit(prob, starts, workers):
    """Best of the L-BFGS-B runs (ties to the earlier start) and its fit statistics. `hits` counts the restarts
    that reached the best objective: a landscape with many local optima shows as few hits of 500."""
    runs = multistart(_lbfgs, prob, starts, workers)
    funs = np.array([run[0] for run in runs])
    fun, theta, ok, msg = runs[int(np.argmin(funs))]
    L = np.exp(prob["logL"])
    resid = L - np.exp(predict_log(theta, prob))  # actual - predicted, in nats (paper Table 8)
    t = theta.tolist()
    fit = {"a": t[0], "b": t[1], "e": t[2], "alpha": t[3], "beta": t[4],
           "A": math.exp(t[0]), "B": math.exp(t[1]), "E": math.exp(t[2])}
    if prob["phi_free"] or prob["n_rec"].any():
        fit["phi"] = float(_phi(theta, prob))
    fit["objective"] = fun
    fit["rmse"] = float(np.sqrt(np.mean(resid ** 2)))
    fit["r2"] = 1.0 - float(resid @ resid / np.sum((L - L.mean()) ** 2))
    fit["max_abs_resid"] = float(np.abs(resid).max())
    fit["converged"] = ok
    fit["message"] = msg
    fit["hits"] = int(np.sum(funs <= fun * (1 + HIT_RTOL) + 1e-15))
    fit["restarts"] = len(runs)
    fit["n_runs"] = len(L)
    fit["theta"] = t
    fit["local_optima"] = _distinct_optima(runs, funs)
    return fit


# ----------------------------------------------------------------------------------------------
# The laws: per architecture (Chinchilla) and joint over r with phi (iso-depth §3.2, §4.2-4.3)

def _check_arrays(N, D, L, C, n_params, what):
    """N, D, L as flat float arrays, refused (ValueError naming `what`) unless they are equally long, finite and
    positive, more than the law's n_params, and from at least two budgets: at one budget N and D are tied by
    C = F D, and the law cannot tell its N term from its D term."""
    N, D, L = (np.asarray(v, dtype=float).ravel() for v in (N, D, L))
    if not len(N) == len(D) == len(L):
        raise ValueError(f"{what}: N, D and L have different lengths ({len(N)}, {len(D)}, {len(L)})")
    for name, v in (("N", N), ("D", D), ("L", L)):
        bad = ~np.isfinite(v) | (v <= 0)
        if bad.any():
            raise ValueError(f"{what}: {int(bad.sum())} runs have a NaN, infinite or non-positive {name} "
                             f"(first: run {int(np.argmax(bad)) + 1})")
    if len(L) < n_params + 1:
        raise ValueError(f"{what}: {len(L)} runs are too few for a {n_params}-parameter law (need {n_params + 1})")
    if C is None:  # no budgets given: one budget puts every run on one line in (log N, log D)
        one_budget = abs(np.corrcoef(np.log(N), np.log(D))[0, 1]) > 1 - 1e-9
    else:
        one_budget = len(budget_levels(C)[1]) < 2
    if one_budget:
        raise ValueError(f"{what}: all runs share one compute budget; the law needs at least two")
    return N, D, L


def fit_chinchilla(N, D, L, restarts=500, seed=0, workers=1, C=None, delta=HUBER_DELTA, weights=None, x0=None):
    """Per-architecture law L = E + A N^-alpha + B D^-beta (Eq. 2, §4.2), best of `restarts` random L-BFGS-B starts
    (and `x0`): a dict with A, B, E, alpha, beta, a, b, e, objective, r2, rmse, max_abs_resid, converged, hits,
    restarts. Its exponents are not comparable across r (N means less under sharing, §4.2); its frontier is."""
    N, D, L = _check_arrays(N, D, L, C, 5, "fit_chinchilla")
    prob = _problem(N, np.zeros_like(N), np.ones_like(N), D, L, phi=0.0, weights=weights, delta=delta)
    return _fit(prob, _starts(prob, restarts, np.random.default_rng(seed), x0), workers)


def _joint_arrays(rows):
    """The JOINT_FIELDS columns of the rows as float arrays; ValueError naming the first one missing."""
    try:
        arrays = {k: column(rows, k) for k in JOINT_FIELDS}
    except KeyError as err:
        raise ValueError(f"fit_joint: runs lack {err.args[0]}") from None
    arrays["r"][[is_untied(row) for row in rows]] = 1.0  # the law's r of the untied model (arch_key)
    return arrays


def fit_joint(rows, restarts=500, seed=0, phi=None, workers=1, delta=HUBER_DELTA, weights=None, x0=None):
    """Joint law L = E + A (N_once + r^phi N_rec)^-alpha + B D^-beta over all r with one shared (A, alpha, B,
    beta, E, phi) (Eq. 3, §4.3); `phi` fixed gives a restricted fit (§4.3 sets phi = 0 and phi = 1 against the
    free fit). Same return as fit_chinchilla plus phi. phi needs two loop counts: at one r it is not identified."""
    c = _joint_arrays(rows)
    n_params = 6 if phi is None else 5
    _check_arrays(c["n_once"] + c["n_rec"], c["tokens"], c["val_loss"], c["flops_budget"], n_params, "fit_joint")
    if phi is None and len(set(c["r"])) < 2:
        raise ValueError(f"fit_joint: phi needs runs at two or more loop counts r (got only r = {int(c['r'][0])})")
    prob = _problem(c["n_once"], c["n_rec"], c["r"], c["tokens"], c["val_loss"], phi, weights, delta)
    return {"phi": phi, **_fit(prob, _starts(prob, restarts, np.random.default_rng(seed), x0), workers)}


def law_loss(fit, n_once, n_rec, r, D):
    """Loss of a fitted joint (or per-architecture: n_rec = 0) law at the given counts."""
    rphi = np.asarray(r, float) ** (fit.get("phi") or 0.0)
    neff = np.asarray(n_once, float) + rphi * np.asarray(n_rec, float)
    return fit["E"] + fit["A"] * neff ** -fit["alpha"] + fit["B"] * np.asarray(D, float) ** -fit["beta"]


def residuals_by_r(fit, rows):
    """Joint-fit residuals (actual - predicted, nats) per loop count: runs, RMSE, mean, max |.| (App. G.1, Table 8:
    one shared phi fits every r alike when no r's residuals stand out)."""
    c = _joint_arrays(rows)
    resid = c["val_loss"] - law_loss(fit, c["n_once"], c["n_rec"], c["r"], c["tokens"])
    table = []
    for r in sorted(set(c["r"].astype(int))):
        mine = resid[c["r"] == r]
        table.append({"r": int(r), "runs": len(mine), "rmse": float(np.sqrt(np.mean(mine ** 2))),
                      "mean": float(mine.mean()), "max_abs": float(np.abs(mine).max())})
    return table


def budget_halves(rows):
    """Rows and budgets of the lower and upper half of the budgets (paper G.3: C <= 2.15e18, C >= 4.64e18)."""
    level, reps = budget_levels(column(rows, "flops_budget"))
    cut = len(reps) // 2
    low, high = [], []
    for row, lv in zip(rows, level):
        if lv < cut:
            low.append(row)
        else:
            high.append(row)
    return (low, reps[:cut]), (high, reps[cut:])


# ----------------------------------------------------------------------------------------------
# Block bootstrap over (budget, r) cells (paper App. G.2) and delta-phi

def bootstrap_cells(rows):
    """Block structure of the bootstrap: each run's (budget, r) cell index and each cell's r. A cell holds every
    width trained at one (budget, r), so a resample keeps or drops an iso-FLOPs curve whole (App. G.2)."""
    levels = budget_levels(column(rows, "flops_budget"))[0].tolist()
    cells = list(zip(levels, column(rows, "r").astype(int).tolist()))
    keys = sorted(set(cells))
    cell_of_run = np.array([keys.index(cell) for cell in cells])
    r_of_cell = np.array([r for _, r in keys])
    return cell_of_run, r_of_cell


def resample_weights(seed, i, cell_of_run, r_of_cell):
    """Run weights of resample i: cells drawn with replacement from its own RNG stream (independent of the
    worker split), each run counted as often as its cell. Returns (weights, rng for the refit's starts)."""
    rng = np.random.default_rng([seed, 7919, i])
    while True:
        counts = np.bincount(rng.integers(0, len(r_of_cell), len(r_of_cell)), minlength=len(r_of_cell))
        if len(set(r_of_cell[counts > 0].tolist())) >= 2:  # phi needs two loop counts: redraw (rare)
            return counts[cell_of_run].astype(float), rng


def _ci95(draws):
    """95% percentile interval of bootstrap draws."""
    return [float(np.percentile(draws, 2.5)), float(np.percentile(draws, 97.5))]


def bootstrap_joint(rows, fit, resamples=200, restarts=16, seed=0, workers=1, delta=HUBER_DELTA):
    """95% percentile CIs of the joint-law parameters from a block bootstrap over (budget, r) cells (App. G.2: 200
    resamples of the cells with replacement, the joint law refitted on each, the 2.5th and 97.5th percentiles).
    Each refit starts from the full fit's distinct local optima plus `restarts` random starts instead of 500
    random starts: checked to land on the 500-restart optimum in tests/test_fit_laws.py, dev/bench_fit.py.
    frac_phi_le_0 and frac_phi_ge_1: the share of resamples at the two reference points (the paper: none)."""
    if resamples < 2:
        raise ValueError("bootstrap_joint: need at least 2 resamples")
    c = _joint_arrays(rows)
    cell_of_run, r_of_cell = bootstrap_cells(rows)
    prob = _problem(c["n_once"], c["n_rec"], c["r"], c["tokens"], c["val_loss"], delta=delta)
    theta0 = np.clip(np.array(fit.get("local_optima") or [fit["theta"]]), prob["lo"], prob["hi"])
    tasks = []
    for i in range(resamples):
        w, rng = resample_weights(seed, i, cell_of_run, r_of_cell)
        tasks.append((_lbfgs, dict(prob, w=w), _starts(prob, restarts, rng, theta0)))
    refits = []  # each resample's best run
    for runs in pmap(_solve_each, tasks, workers):
        refits.append(min(runs, key=lambda run: run[0]))
    ok = np.array([run[2] for run in refits])
    good = np.array([run[1] for run in refits]).reshape(-1, 6)[ok]
    draws = {"phi": good[:, 5], "alpha": good[:, 3], "beta": good[:, 4],
             "A": np.exp(good[:, 0]), "B": np.exp(good[:, 1]), "E": np.exp(good[:, 2])}
    out = {"resamples": resamples, "restarts": restarts, "cells": len(r_of_cell), "not_converged": int((~ok).sum()),
           "draws": {k: v.tolist() for k, v in draws.items()}}
    for k, v in draws.items():
        out[k + "_ci"] = _ci95(v) if len(v) else None
    if ok.any():
        out["frac_phi_le_0"] = float(np.mean(draws["phi"] <= 0))
        out["frac_phi_ge_1"] = float(np.mean(draws["phi"] >= 1))
    else:  # no refit converged
        out["frac_phi_le_0"] = math.nan
        out["frac_phi_ge_1"] = math.nan
    return out


def compare_phi(boot_a, boot_b, fit_a, fit_b):
    """delta-phi = phi_b - phi_a, CI from the differences of the two bootstraps' draws in resample order:
    conservative (wider) where the sweeps share r = 1 runs, as the paper's case studies do."""
    n = min(len(boot_a["draws"]["phi"]), len(boot_b["draws"]["phi"]))
    diff = np.array(boot_b["draws"]["phi"][:n]) - np.array(boot_a["draws"]["phi"][:n])
    ci = _ci95(diff)
    return {"phi_a": fit_a["phi"], "phi_b": fit_b["phi"], "delta_phi": fit_b["phi"] - fit_a["phi"],
            "delta_phi_ci": ci, "excludes_zero": bool(ci[0] > 0 or ci[1] < 0), "pairs": n}


# The joint law's parameters in the order of the fitter's box (BOX_LO, BOX_HI): A, B and E are searched as logs.
BOX_PARAMS = ("A", "B", "E", "alpha", "beta", "phi")


def ci_bounds_reached(name, *cis):
    """The edges of the fitter's box that a 95% CI of joint-law parameter `name` runs to, in the parameter's own
    units, over every CI given: [] for measured intervals, [-3.0] for a phi CI of [-3.00, 1.02]. A resample whose
    fit stops at the edge of the box was not bounded by the data, so a CI made of such fits says where the search
    ends, not where the parameter lies. A delta-phi passes both arms' phi CIs: its own interval, made of their
    differences, is the box's wherever one of theirs is."""
    i = BOX_PARAMS.index(name)
    edges = [float(BOX_LO[i]), float(BOX_HI[i])]
    if i < 3:  # searched as log A, log B, log E
        edges = [math.exp(edge) for edge in edges]
    reached = []
    for ci in cis:
        if not ci:
            continue
        for edge, end in zip(edges, ci):
            if math.isclose(end, edge, rel_tol=1e-6, abs_tol=1e-9) and edge not in reached:
                reached.append(edge)
    return sorted(reached)


def estimate_text(value, ci, reached=(), fmt=".2f", whose="CI"):
    """A fitted value and its 95% CI as a person should read them: "0.97 [0.86, 1.21]" for a measured interval;
    "0.82 (CI reaches the bound -3: not identified)" where the CI runs to the fitter's box (`reached`, from
    ci_bounds_reached; a delta-phi passes its arms' with whose="an arm's phi CI"); "0.82 (no CI)" without a
    bootstrap. Every report and table that shows a CI prints it through this one function."""
    text = f"{value:{fmt}}"
    if reached:
        edges = " and ".join(f"{edge:g}" for edge in reached)
        plural = "s" if len(reached) > 1 else ""
        return f"{text} ({whose} reaches the bound{plural} {edges}: not identified)"
    if not ci:
        return f"{text} (no CI)"
    return f"{text} [{ci[0]:{fmt}}, {ci[1]:{fmt}}]"


# ----------------------------------------------------------------------------------------------
# Compute-optimal frontier (iso-depth §4.2) along each architecture's width family

def width_family(row, max_scale=None):
    """`row`'s architecture at every width d = head_dim * k up to `max_scale`: arrays scale, N, n_once, n_rec,
    F (FLOPs per token) from flops.py; None if flops.py cannot rebuild the row's model and its n_params. This is
    §4.2's F(N), "the architecture's empirical per-token FLOPs at N", along which the frontier moves."""
    cfg = _config_from_row(row)
    if cfg is None or abs(flops.param_counts(cfg)["n_params"] - float(row["n_params"])) > 0.5:
        return None
    widths = []  # (scale, N, n_once, n_rec, F) per width
    for d in range(cfg.head_dim, int(64 * (max_scale or 8 * cfg.scale)) + 1, cfg.head_dim):
        wide = _config_from_row(row, scale=d / 64)
        if wide is None:  # e.g. an odd s with head dim 128
            continue
        n = flops.param_counts(wide)
        widths.append((d / 64, n["n_params"], n["n_once"], n["n_rec"], flops.flops_per_token(wide)))
    if len(widths) < 4:
        return None
    family = {}
    for name, values in zip(("scale", "N", "n_once", "n_rec", "F"), zip(*widths)):
        family[name] = np.array(values, dtype=float)
    family["source"] = "flops.py"
    return family


def family_for_group(rows):
    """Width family of a group of runs: flops.py's, for their most common layout (None if it cannot)."""
    layouts = {}
    for row in rows:
        layout = tuple(str(row.get(k)) for k in CONFIG_FIELDS if k != "scale")
        layouts.setdefault(layout, []).append(row)
    most_common = max(layouts.values(), key=len)
    max_scale = 8 * max(float(row.get("scale") or 0) for row in rows)
    return width_family(most_common[0], max_scale or None)


def frontier_point(fit, family, C, r=1, joint=False):
    """Compute-optimal allocation at budget C (§4.2): minimise L(N, C / F(N)) over the width family, interpolated
    monotonically (PCHIP) in log N. Returns N*, D*, L*, the width s* and whether N* is at the family's edge (then
    the optimum lies outside the widths the family spans and N* is only a bound). A grid of 4,001 points finds
    the basin, a bounded scalar search refines it."""
    logN = np.log(family["N"])
    logF = PchipInterpolator(logN, np.log(family["F"]))
    if joint:
        neff = family["n_once"] + r ** fit["phi"] * family["n_rec"]
    else:
        neff = family["N"]
    logNeff = PchipInterpolator(logN, np.log(neff))

    def loss(lx):
        D = C / np.exp(logF(lx))
        return fit["E"] + fit["A"] * np.exp(-fit["alpha"] * logNeff(lx)) + fit["B"] * D ** -fit["beta"]

    grid = np.linspace(logN[0], logN[-1], 4001)
    vals = loss(grid)
    i = int(np.argmin(vals))
    bracket = (grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)])
    best = minimize_scalar(loss, bounds=bracket, method="bounded", options={"xatol": 1e-10})
    lx = best.x if best.fun <= vals[i] else grid[i]
    return {
        "N_star": float(np.exp(lx)),
        "D_star": float(C / np.exp(logF(lx))),
        "L_star": float(loss(lx)),
        "scale_star": float(PchipInterpolator(logN, family["scale"])(lx)),
        "at_edge": i in (0, len(grid) - 1),
    }


def compute_frontier(rows, per_arch, joint_fit, budgets):
    """Frontier per architecture and budget from its own law and the joint law, with the gap to r = 1: L* - L*(r=1)
    at the same budget, the comparison §4.2 makes across r (the paper: r = 2, 4, 8 trail by 0.03-0.12 nats)."""
    out = []
    for key, grp in by_arch(rows).items():
        family = family_for_group(grp)
        for law, fit in (("per_arch", per_arch.get(key)), ("joint", joint_fit)):
            if family is None or fit is None or not fit["converged"]:
                continue
            for C in budgets:
                point = {"law": law, "r": key[0], "r_bwd": key[1], "injection": key[2], "budget": float(C)}
                point.update(frontier_point(fit, family, C, key[0], law == "joint"))
                out.append(point)
    baseline = {}  # (law, budget) -> L* of r = 1
    for p in out:
        if p["r"] == 1:
            baseline[p["law"], p["budget"]] = p["L_star"]
    for p in out:
        base = baseline.get((p["law"], p["budget"]))
        p["gap_to_r1"] = None if base is None else p["L_star"] - base
    return out


# ----------------------------------------------------------------------------------------------
# Equivalence calculator (iso-depth §1, App. G.5)

# The layout fields the equivalence keeps from a fitted sweep's row (the width and r are its arguments).
EQUIV_LAYOUT = ("injection", "hc_lanes", "depth", "prelude", "coda", "head_dim", "vocab_size", "seq_len")


def _same_as_r1(family, key, target):
    """The r = 1 model of a width family at which family[key] = target, interpolated in log space."""
    xs, x = np.log(family[key]), math.log(target)
    if not xs[0] <= x <= xs[-1]:
        raise ValueError(f"equivalence: {key} = {target:.4g} lies outside the width family")
    return {"N": float(np.exp(PchipInterpolator(xs, np.log(family["N"]))(x))),
            "scale": float(PchipInterpolator(xs, family["scale"])(x)),
            "flops_per_token": float(np.exp(PchipInterpolator(xs, np.log(family["F"]))(x)))}


def equivalence(r, scale, phi, layout=None):
    """A looped model (r, s), its N and N_eff(phi), against the r = 1 models of its effective depth with the same
    loss (N = N_eff at the same D, paper Eq. 3) and with the same training FLOPs per token (about the same s). The
    paper's example (§1, App. G.5): at r = 4 and phi = 0.46 a 410M looped model reaches the loss of a 580M
    non-looped one and costs the FLOPs of a 1B one."""
    layout = layout or {}
    kw = {k: layout[k] for k in EQUIV_LAYOUT if k in layout}
    looped = flops.ModelConfig(r=int(r), scale=scale, **kw)
    counts, F = flops.param_counts(looped), flops.flops_per_token(looped)
    n_eff = flops.effective_params(counts["n_once"], counts["n_rec"], looped.r, phi)
    row = {"r": 1, "scale": looped.scale, "depth": looped.depth}
    for k in ("head_dim", "vocab_size", "seq_len"):
        if k in kw:
            row[k] = kw[k]
    same_width = _config_from_row(row)
    row["n_params"] = flops.param_counts(same_width)["n_params"]
    family = width_family(row, max_scale=max(8 * looped.scale, 64))
    return {
        "r": looped.r,
        "scale": looped.scale,
        "phi": phi,
        "N": counts["n_params"],
        "n_once": counts["n_once"],
        "n_rec": counts["n_rec"],
        "n_eff": n_eff,
        "flops_per_token": F,
        "same_loss": _same_as_r1(family, "N", n_eff),
        "same_flops": _same_as_r1(family, "F", F),
        "same_width": {"N": row["n_params"], "scale": looped.scale,
                       "flops_per_token": flops.flops_per_token(same_width)},
    }


def frontier_points(analysis, law, key=None):
    """The frontier points of one law ("per_arch" or "joint") and, given `key`, of one architecture."""
    return [pt for pt in analysis["frontier"] if pt["law"] == law and (key is None or arch_key(pt) == key)]
