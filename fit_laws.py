"""
Scaling-law fits for the iso-depth looped-transformer sweep: per-architecture Chinchilla laws, the
joint law with the recurrence-equivalence exponent phi, its block-bootstrap CI, the compute-optimal
frontier per r, delta-phi between two sweeps, the looped/non-looped equivalence calculator, and the
truncate-or-not law with its chi table.

    python fit_laws.py runs/results.jsonl                          # full report on stdout
    python fit_laws.py runs/results.jsonl --json fit.json --plots out/fit
    python fit_laws.py base.jsonl --compare truncated.jsonl        # delta-phi with a bootstrap CI
    python fit_laws.py --equiv 4 32 --phi 0.46                     # what is a looped model worth?
    python fit_laws.py runs/results.jsonl --truncate-law --tl-holdout setting
    python fit_laws.py --chi-table                                 # truncate-or-not Table 5, published law
    python fit_laws.py data.csv --n-col "Model Size" --budget-col "Training FLOP" --loss-col loss
    python fit_laws.py --write-synthetic synth.jsonl               # a fake 116-run paper grid to try it on

Input: one JSON object per run as train.py writes it (every flops.ModelConfig field plus n_params,
n_once, n_rec, tokens, flops_budget, val_loss, ...), or a CSV whose columns are named by the --*-col
flags. Runs are grouped into architectures by (r, r_bwd, injection).

The fitting protocol is the paper's (iso-depth §4.2, App. E "Optimisation details", RECIPE §7):
Huber (delta = 1e-3) on log L - log L_hat summed over runs, log L_hat = LSE(a - alpha log N,
b - beta log D, e), best of 500 uniform random L-BFGS-B restarts in the box a, b in [-5, 35],
alpha, beta in [0, 2.5], e in [-3, 2] (phi in [-3, 3]), at most 10,000 iterations each. The
objective and its gradient are analytic and vectorised over runs; the restarts are spread over
--workers processes. Parameter counts and FLOPs all come from flops.py.
"""
import argparse
import ctypes
import csv
import json
import math
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import fields as dataclass_fields
from pathlib import Path

import numpy as np
from scipy.interpolate import PchipInterpolator
from scipy.optimize import least_squares, minimize, minimize_scalar

import flops

HUBER_DELTA = 1e-3
# Parameter vector of the Chinchilla/joint fits: (a, b, e, alpha, beta[, phi]); A = e^a, B = e^b,
# E = e^e. Box of App. E; starting points are drawn uniformly inside it.
BOX_LO = np.array([-5.0, -5.0, -3.0, 0.0, 0.0, -3.0])
BOX_HI = np.array([35.0, 35.0, 2.0, 2.5, 2.5, 3.0])
# Tight tolerances on purpose: the objective is ~1e-3 and mostly in Huber's linear regime, so the
# landscape is flat and kinked. scipy's ftol is a relative reduction test against max(|f|, 1), i.e.
# an absolute one here: the default (2.2e-9) stops runs while f still falls by 1e-9 per step and
# leaves the amplitudes visibly off (A 477.5 instead of 477.8 on Epoch's data, dev/bench_fit.py).
LBFGS_OPTIONS = {"maxiter": 10_000, "maxfun": 40_000, "ftol": 1e-12, "gtol": 1e-12, "maxls": 50}
HIT_RTOL = 1e-6  # a restart "hits" the optimum when its objective is within this relative margin
N_LOCAL_OPTIMA = 8  # distinct local optima of a full-data fit kept as bootstrap starting points

# The paper's sweep (iso-depth §4.1, Table 7; RECIPE §6): budget C -> widths s (d = 64 s).
PAPER_GRID = {4.64e17: (6, 8, 10, 12), 1e18: (6, 8, 10, 12, 14), 2.15e18: (8, 10, 12, 14, 16),
              4.64e18: (10, 12, 14, 16, 18, 20), 1e19: (12, 16, 18, 20, 24), 2.15e19: (18, 24, 28, 34)}
# A realistic ground truth for synthetic sweeps: Chinchilla-like amplitudes and exponents (Epoch's
# refit of Hoffmann et al. is E 1.82, A 478, alpha 0.35, B 2143, beta 0.37) and the paper's phi.
SYNTHETIC_TRUTH = {"E": 1.8, "A": 400.0, "alpha": 0.34, "B": 1500.0, "beta": 0.37, "phi": 0.46}

# Truncate-or-not law (their Eq. 2-3, Table 4): L = E + [A (N_eff/N0)^-alpha + H (D/D0)^-beta]^kappa,
# N_eff = N_once + g(T, B) N_rec, g = exp[c (1 - T^-p B^-q)]; T = r, B = r_bwd.
TL_N0, TL_D0 = 2.4e8, 2.0 ** 30
TL_PUBLISHED = {"E": 0.29865, "A": 6.48695, "H": 7.63343, "alpha": 0.30568, "beta": 0.39281,
                "kappa": 0.32510, "c": 1.11198, "p": 0.23677, "q": 1.02181}
TL_RHO = 0.507  # N_rec / N of their 240M model, the share their Table 5 is computed at
# Optimisation coordinates (E, log A, log H, alpha, beta, kappa, log c, p, q): bounds and the
# narrower ranges random starts are drawn from (their App. C.3 "Solver").
TL_LO = np.array([0.0, -10.0, -10.0, 0.01, 0.01, 0.01, math.log(1e-3), 1e-3, 1e-3])
TL_HI = np.array([3.0, 15.0, 15.0, 3.0, 3.0, 3.0, math.log(10.0), 10.0, 10.0])
TL_INIT_LO = np.array([0.3, 0.5, 0.5, 0.25, 0.25, 0.15, math.log(0.2), 0.1, 0.1])
TL_INIT_HI = np.array([1.2, 2.5, 2.5, 0.65, 0.65, 0.45, math.log(2.0), 2.0, 2.0])
TL_SEED = 20261010  # their fold seeds are 20261010 + fold index
TL_FAMILIES = ("config", "size", "budget", "setting")

CONFIG_FIELDS = tuple(f.name for f in dataclass_fields(flops.ModelConfig))
DEFAULT_COLS = {"n_params": "n_params", "tokens": "tokens", "val_loss": "val_loss",
                "flops_budget": "flops_budget"}


_BLAS_LIMITED = False


def _single_thread_scipy_blas():
    """Run scipy's bundled OpenBLAS on one thread. L-BFGS-B and the TRF solver call BLAS on tiny
    (5-20 element) arrays; with OpenBLAS's thread pool every such call wakes and syncs all threads,
    which measured ~100x slower on a busy 2-core machine. Our parallelism is across processes
    anyway. Only the library under scipy.libs is touched (numpy's and torch's BLAS keep their
    threads); where it cannot be found the fits still run, just slower."""
    global _BLAS_LIMITED
    if _BLAS_LIMITED:
        return
    _BLAS_LIMITED = True
    try:
        with open("/proc/self/maps") as fh:
            paths = {line.split()[-1] for line in fh if "openblas" in line and "scipy.libs" in line}
    except OSError:
        return
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in ("scipy_openblas_set_num_threads", "openblas_set_num_threads",
                     "scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_"):
            setter = getattr(lib, name, None)
            if setter is not None:
                setter(1)
                break


# ----------------------------------------------------------------------------------------------
# Loading and checking runs

def load_results(path, cols=None):
    """Rows of a train.py JSONL file or of a CSV. For CSV, `cols` maps the canonical names
    (n_params, tokens, val_loss, flops_budget) to the file's column names. ValueError on bad input."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    cols = {**DEFAULT_COLS, **(cols or {})}
    if path.suffix.lower() == ".csv":
        with open(path, newline="") as fh:
            reader = csv.DictReader(fh)
            header = reader.fieldnames or []
            for canon, col in cols.items():
                # A column the user named explicitly must exist; defaults are checked later, once
                # we know whether they can be derived (tokens from the budget, N from the config).
                if col != DEFAULT_COLS[canon] and col not in header:
                    raise ValueError(f"{path}: no column {col!r} (given for {canon}); "
                                     f"columns are {', '.join(header)}")
            rename = {col: canon for canon, col in cols.items() if col in header}
            rows = []
            for raw in reader:
                row = {}
                for key, value in raw.items():
                    key = rename.get(key, key)
                    try:
                        row[key] = float(value)
                    except (TypeError, ValueError):
                        row[key] = value
                rows.append(row)
    else:
        rows = []
        with open(path) as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path} line {lineno}: not JSON ({err.msg})") from None
                if not isinstance(row, dict):
                    raise ValueError(f"{path} line {lineno}: expected a JSON object")
                rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no runs")
    return rows


def _config_from_row(row, scale=None):
    """The flops.ModelConfig a row was trained with (optionally at another width), or None when the
    row lacks the fields or flops.py rejects them."""
    if "r" not in row or "scale" not in row:
        return None
    kw = {k: row[k] for k in CONFIG_FIELDS if k in row and row[k] is not None and row[k] != ""}
    for k in ("r", "r_bwd", "hc_lanes", "depth", "prelude", "coda", "recur", "head_dim",
              "vocab_size", "seq_len"):
        if k in kw:
            kw[k] = int(kw[k])
    if "scale" in kw:
        kw["scale"] = float(kw["scale"])  # fractional widths (d = 8, 16, ...) on the CPU grid
    if int(kw["r"]) == 1 and kw.get("injection", "none") == "none":
        # train.py's r = 1 rows store the resolved plain stack (prelude 0, injection "none"); let
        # ModelConfig resolve it again from depth alone. A looped layout run once (truncate-or-not's
        # (T, B) = (1, 1)) keeps its prelude/recur/coda and injection.
        for k in ("prelude", "coda", "recur", "injection", "r_bwd"):
            kw.pop(k, None)
    if "random_state_init" in kw:
        kw["random_state_init"] = str(kw["random_state_init"]).lower() in ("1", "true", "1.0")
    if scale is not None:
        kw["scale"] = scale
    try:
        return flops.ModelConfig(**kw)
    except (TypeError, ValueError):
        return None


def prepare_rows(rows, source="runs"):
    """Canonical copies of the rows: r, r_bwd, injection, n_params, n_once, n_rec, tokens,
    flops_budget, val_loss all present and finite. Missing counts are derived from the ModelConfig
    fields through flops.py. Returns (rows, notes); ValueError naming what is missing or bad."""
    out, notes = [], []
    bad_loss, missing = [], {}
    for i, raw in enumerate(rows):
        row = dict(raw)
        if "r" not in row or row["r"] in (None, ""):
            row["r"] = 1
            if "no r column: every run treated as non-looped (r = 1)" not in notes:
                notes.append("no r column: every run treated as non-looped (r = 1)")
        row["r"] = int(row["r"])
        row["r_bwd"] = int(row.get("r_bwd") or 0) or row["r"]
        if row["r"] == 1:
            row["injection"] = "none"
        elif not row.get("injection"):
            row["injection"] = "linear"
        cfg = _config_from_row(row)
        counts = flops.param_counts(cfg) if cfg is not None else None
        if "val_loss" not in row:
            missing.setdefault("val_loss (set --loss-col)", i)
            continue
        try:
            loss = float(row["val_loss"])
        except (TypeError, ValueError):
            loss = float("nan")
        if not math.isfinite(loss) or loss <= 0:
            bad_loss.append(i)
            continue
        row["val_loss"] = loss
        if row.get("n_params") in (None, ""):
            if counts is None:
                missing.setdefault("n_params (set --n-col, or give the ModelConfig fields)", i)
                continue
            row["n_params"] = counts["n_params"]
        if row.get("n_once") in (None, "") or row.get("n_rec") in (None, ""):
            if counts is not None:
                row["n_once"], row["n_rec"] = counts["n_once"], counts["n_rec"]
            elif row["r"] == 1:
                # N_eff = N_once + 1^phi N_rec = N for any split, so a plain model needs none.
                row["n_once"], row["n_rec"] = float(row["n_params"]), 0.0
            else:
                missing.setdefault("n_once/n_rec for looped runs (or the ModelConfig fields)", i)
                continue
        budget = row.get("flops_budget")
        if row.get("tokens") in (None, ""):
            if budget in (None, ""):
                missing.setdefault("tokens (set --d-col) or flops_budget (set --budget-col)", i)
                continue
            # Chinchilla convention, as Epoch's replication uses for Hoffmann et al.'s runs.
            row["tokens"] = float(budget) / (6.0 * float(row["n_params"]))
            if "tokens not given: D = C / (6 N)" not in notes:
                notes.append("tokens not given: D = C / (6 N)")
        if budget in (None, ""):
            if row.get("flops_actual") not in (None, ""):
                row["flops_budget"] = float(row["flops_actual"])
            else:
                row["flops_budget"] = 6.0 * float(row["n_params"]) * float(row["tokens"])
                if "no flops_budget: C = 6 N D" not in notes:
                    notes.append("no flops_budget: C = 6 N D")
        for k in ("n_params", "n_once", "n_rec", "tokens", "flops_budget"):
            try:
                row[k] = float(row[k])
            except (TypeError, ValueError):
                row[k] = float("nan")
        if not all(math.isfinite(row[k]) for k in ("n_params", "n_once", "n_rec", "tokens", "flops_budget")) \
                or row["n_params"] <= 0 or row["tokens"] <= 0 or row["flops_budget"] <= 0 \
                or row["n_once"] < 0 or row["n_rec"] < 0 or row["n_once"] + row["n_rec"] <= 0:
            missing.setdefault("positive finite n_params/n_once/n_rec/tokens/flops_budget", i)
            continue
        out.append(row)
    if missing:
        what, first = next(iter(missing.items()))
        raise ValueError(f"{source}: runs lack {what} (first: run {first + 1})")
    if bad_loss:
        raise ValueError(f"{source}: {len(bad_loss)} of {len(rows)} runs have a NaN, infinite or "
                         f"non-positive val_loss (first: run {bad_loss[0] + 1})")
    return out, notes


def arch_key(row):
    """Architecture of a run: (r, r_bwd, injection)."""
    return (int(row["r"]), int(row["r_bwd"]), str(row["injection"]))


def arch_label(key):
    r, r_bwd, inj = key
    return f"r={r}" if r == 1 else f"r={r} bwd={r_bwd} {inj}"


def budget_levels(budgets, rtol=0.02):
    """Index of each run's compute budget after merging budgets within 2% (batch rounding), and the
    representative (median) budget of each level, sorted ascending."""
    budgets = np.asarray(budgets, dtype=float)
    order = np.argsort(budgets)
    level = np.empty(len(budgets), dtype=int)
    reps, current = [], []
    for i in order:
        if current and budgets[i] > budgets[current[0]] * (1 + rtol):
            reps.append(float(np.median(budgets[current])))
            current = []
        current.append(i)
        level[i] = len(reps)
    reps.append(float(np.median(budgets[current])))
    return level, np.array(reps)


# ----------------------------------------------------------------------------------------------
# Huber-on-log Chinchilla objective (paper Eq. 4) and the multi-start L-BFGS-B driver

def _problem(n_once, n_rec, r, D, L, phi=None, joint=True, weights=None, delta=HUBER_DELTA):
    """Everything the objective needs, as plain arrays (picklable for the worker processes).
    A per-architecture fit is the joint law with N_rec = 0, so one code path serves both."""
    n = len(L)
    prob = {"n_once": np.asarray(n_once, float), "n_rec": np.asarray(n_rec, float),
            "logr": np.log(np.asarray(r, float)), "logD": np.log(np.asarray(D, float)),
            "logL": np.log(np.asarray(L, float)), "delta": float(delta),
            "w": np.ones(n) if weights is None else np.asarray(weights, float),
            "phi_free": bool(joint and phi is None), "phi": 0.0 if phi is None else float(phi)}
    k = 6 if prob["phi_free"] else 5
    prob["lo"], prob["hi"] = BOX_LO[:k].copy(), BOX_HI[:k].copy()
    return prob


def _log_neff(theta, prob):
    phi = theta[5] if prob["phi_free"] else prob["phi"]
    rphi = np.exp(phi * prob["logr"])
    neff = prob["n_once"] + rphi * prob["n_rec"]
    return np.log(neff), rphi, neff


def _objective(theta, prob):
    """Summed Huber loss of log-residuals and its analytic gradient.
    log L_hat = LSE(a - alpha x, b - beta y, e), x = log(N_once + r^phi N_rec), y = log D."""
    a, b, e, alpha, beta = theta[:5]
    x, rphi, neff = _log_neff(theta, prob)
    y = prob["logD"]
    t1 = a - alpha * x
    t2 = b - beta * y
    m = np.maximum(np.maximum(t1, t2), e)
    e1, e2, e3 = np.exp(t1 - m), np.exp(t2 - m), np.exp(e - m)
    s = e1 + e2 + e3
    res = m + np.log(s) - prob["logL"]
    delta, w = prob["delta"], prob["w"]
    absr = np.abs(res)
    f = w @ np.where(absr <= delta, 0.5 * res * res, delta * (absr - 0.5 * delta))
    # Huber'(r) = clip(r, -delta, delta); dLSE/dt_k = softmax weight e_k / s.
    g = w * np.clip(res, -delta, delta) / s
    u1, u2 = g * e1, g * e2
    grad = [u1.sum(), u2.sum(), (g * e3).sum(), -(u1 @ x), -(u2 @ y)]
    if prob["phi_free"]:
        # dx/dphi = r^phi log r N_rec / N_eff
        grad.append(-alpha * (u1 @ (rphi * prob["logr"] * prob["n_rec"] / neff)))
    return f, np.array(grad)


def _predict_log(theta, prob):
    a, b, e, alpha, beta = theta[:5]
    x = _log_neff(theta, prob)[0]
    t = np.stack([a - alpha * x, b - beta * prob["logD"], np.full_like(x, e)])
    m = t.max(axis=0)
    return m + np.log(np.exp(t - m).sum(axis=0))


def _projected_grad(theta, grad, lo, hi):
    pg = grad.copy()
    pg[(theta <= lo) & (grad > 0)] = 0.0
    pg[(theta >= hi) & (grad < 0)] = 0.0
    return float(np.abs(pg).max())


def _run_starts(task):
    """Worker: L-BFGS-B from each start; returns (objective, theta, converged, message) per start."""
    prob, starts = task
    _single_thread_scipy_blas()
    bounds = list(zip(prob["lo"], prob["hi"]))
    out = []
    for x0 in starts:
        res = minimize(_objective, x0, args=(prob,), jac=True, method="L-BFGS-B", bounds=bounds,
                       options=LBFGS_OPTIONS)
        msg = res.message if isinstance(res.message, str) else res.message.decode()
        # A line-search stall at machine precision is a converged point, not a failure: accept it
        # when the projected gradient is negligible against the Huber slope (delta per run).
        ok = bool(res.success) or (msg.startswith("ABNORMAL") and _projected_grad(
            res.x, res.jac, prob["lo"], prob["hi"]) < 1e-7 * prob["delta"] * prob["w"].sum())
        ok = ok and res.nit < LBFGS_OPTIONS["maxiter"]
        out.append((float(res.fun), res.x, ok, msg))
    return out


def _pmap(fn, tasks, workers):
    """map() over processes when workers > 1 (fork keeps it cheap), in order."""
    if workers <= 1 or len(tasks) <= 1:
        return [fn(t) for t in tasks]
    with ProcessPoolExecutor(max_workers=min(workers, len(tasks))) as ex:
        return list(ex.map(fn, tasks))


def _random_starts(n, lo, hi, rng):
    return rng.uniform(lo, hi, size=(n, len(lo)))


def _multistart(prob, starts, workers=1):
    """Best of L-BFGS-B runs from every start (ties go to the earlier start, so the result does not
    depend on how the starts were split over workers)."""
    chunks = [c for c in np.array_split(np.asarray(starts), max(1, min(workers, len(starts)))) if len(c)]
    results = [r for part in _pmap(_run_starts, [(prob, c) for c in chunks], workers) for r in part]
    funs = np.array([r[0] for r in results])
    best = int(np.argmin(funs))
    hits = int(np.sum(funs <= funs[best] * (1 + HIT_RTOL) + 1e-15))
    # The distinct local optima, best first: bootstrap refits start from these (a resample's
    # optimum is almost always next to one of the full-data basins).
    optima = []
    for j in np.argsort(funs, kind="stable"):
        if all(abs(funs[j] - f) > HIT_RTOL * f for f, _ in optima):
            optima.append((funs[j], results[j][1]))
        if len(optima) == N_LOCAL_OPTIMA:
            break
    return results[best], hits, len(results), [x for _, x in optima]


def _summarise(prob, multistart, L):
    best, hits, restarts, optima = multistart
    fun, theta, ok, msg = best
    out = {"a": float(theta[0]), "b": float(theta[1]), "e": float(theta[2]),
           "A": math.exp(theta[0]), "B": math.exp(theta[1]), "E": math.exp(theta[2]),
           "alpha": float(theta[3]), "beta": float(theta[4])}
    if prob["phi_free"]:
        out["phi"] = float(theta[5])
    elif prob["n_rec"].any():
        out["phi"] = prob["phi"]
    pred = np.exp(_predict_log(theta, prob))
    resid = np.asarray(L) - pred  # actual - predicted, in nats (paper Table 8 convention)
    ss_tot = float(np.sum((L - np.mean(L)) ** 2))
    out.update(objective=fun, r2=1.0 - float(resid @ resid) / ss_tot if ss_tot > 0 else float("nan"),
               rmse=float(np.sqrt(np.mean(resid ** 2))), max_abs_resid=float(np.abs(resid).max()),
               converged=bool(ok), message=msg, hits=hits, restarts=restarts, n_runs=len(L),
               theta=[float(v) for v in theta], local_optima=[[float(v) for v in x] for x in optima])
    return out


def _check_arrays(N, D, L, C, n_params, what):
    N, D, L = (np.asarray(v, dtype=float).ravel() for v in (N, D, L))
    if not len(N) == len(D) == len(L):
        raise ValueError(f"{what}: N, D and L have different lengths ({len(N)}, {len(D)}, {len(L)})")
    for name, v in (("N", N), ("D", D), ("L", L)):
        bad = ~np.isfinite(v) | (v <= 0)
        if bad.any():
            raise ValueError(f"{what}: {int(bad.sum())} runs have a NaN, infinite or non-positive {name} "
                             f"(first: run {int(np.argmax(bad)) + 1})")
    if len(L) < n_params + 1:
        raise ValueError(f"{what}: {len(L)} runs are too few for a {n_params}-parameter law "
                         f"(need at least {n_params + 1})")
    if C is not None:
        if len(budget_levels(C)[1]) < 2:
            raise ValueError(f"{what}: all runs share one compute budget; the law needs at least two")
    elif len(L) > 2 and abs(np.corrcoef(np.log(N), np.log(D))[0, 1]) > 1 - 1e-9:
        raise ValueError(f"{what}: log N and log D are collinear (one compute budget only?); "
                         "the law needs at least two budgets")
    return N, D, L


def fit_chinchilla(N, D, L, restarts=500, seed=0, workers=1, C=None, delta=HUBER_DELTA,
                   weights=None, x0=None):
    """Per-architecture law L = E + A N^-alpha + B D^-beta by the paper's protocol (best of
    `restarts` uniform L-BFGS-B starts in the box; `x0`, one point or several, adds starts). Returns a dict with
    A, B, E, alpha, beta, a, b, e, objective, r2, rmse, max_abs_resid, converged, hits, restarts."""
    N, D, L = _check_arrays(N, D, L, C, 5, "fit_chinchilla")
    prob = _problem(N, np.zeros_like(N), np.ones_like(N), D, L, joint=False, weights=weights, delta=delta)
    starts = _random_starts(restarts, prob["lo"], prob["hi"], np.random.default_rng(seed))
    if x0 is not None:
        starts = np.vstack([np.atleast_2d(np.asarray(x0, float))[:, :5], starts])
    return _summarise(prob, _multistart(prob, starts, workers), L)


def _joint_arrays(rows):
    need = ("r", "n_once", "n_rec", "tokens", "val_loss", "flops_budget")
    for i, row in enumerate(rows):
        lacking = [k for k in need if k not in row]
        if lacking:
            raise ValueError(f"fit_joint: run {i + 1} lacks {', '.join(lacking)}")
    cols = {k: np.array([float(row[k]) for row in rows]) for k in need}
    return cols


def fit_joint(rows, restarts=500, seed=0, phi=None, workers=1, delta=HUBER_DELTA, weights=None,
              x0=None):
    """Joint law L = E + A (N_once + r^phi N_rec)^-alpha + B D^-beta over all architectures, one
    shared (A, alpha, B, beta, E, phi); `phi` fixed gives the restricted fit. Rows need r, n_once,
    n_rec, tokens, val_loss, flops_budget (train.py's fields). Same return as fit_chinchilla plus phi."""
    if not rows:
        raise ValueError("fit_joint: no runs")
    c = _joint_arrays(rows)
    k = 5 if phi is not None else 6
    N = c["n_once"] + c["n_rec"]
    _check_arrays(N, c["tokens"], c["val_loss"], c["flops_budget"], k, "fit_joint")
    if phi is None and len(set(c["r"])) < 2:
        raise ValueError("fit_joint: phi needs runs at two or more loop counts r "
                         f"(got only r = {int(c['r'][0])})")
    prob = _problem(c["n_once"], c["n_rec"], c["r"], c["tokens"], c["val_loss"], phi=phi,
                    weights=weights, delta=delta)
    starts = _random_starts(restarts, prob["lo"], prob["hi"], np.random.default_rng(seed))
    if x0 is not None:
        starts = np.vstack([np.atleast_2d(np.asarray(x0, float))[:, :k], starts])
    out = _summarise(prob, _multistart(prob, starts, workers), c["val_loss"])
    out["phi"] = out.get("phi", phi)
    return out


def law_loss(fit, n_once, n_rec, r, D):
    """Loss of a fitted joint (or per-architecture: n_rec = 0) law at the given counts."""
    phi = fit.get("phi") or 0.0
    neff = np.asarray(n_once, float) + np.asarray(r, float) ** phi * np.asarray(n_rec, float)
    return fit["E"] + fit["A"] * neff ** -fit["alpha"] + fit["B"] * np.asarray(D, float) ** -fit["beta"]


def residuals_by_r(fit, rows):
    """Joint-fit residuals (actual - predicted, nats) per loop count: runs, RMSE, mean, max |.|."""
    c = _joint_arrays(rows)
    resid = c["val_loss"] - law_loss(fit, c["n_once"], c["n_rec"], c["r"], c["tokens"])
    table = []
    for r in sorted(set(c["r"].astype(int))):
        m = c["r"] == r
        table.append({"r": r, "runs": int(m.sum()), "rmse": float(np.sqrt(np.mean(resid[m] ** 2))),
                      "mean": float(resid[m].mean()), "max_abs": float(np.abs(resid[m]).max())})
    return table


def budget_halves(rows):
    """Rows of the lower and upper half of the sorted distinct budgets (paper G.3: C <= 2.15e18 vs
    C >= 4.64e18 on the six-budget grid), with the budgets of each half."""
    level, reps = budget_levels([row["flops_budget"] for row in rows])
    cut = len(reps) // 2
    low = [row for row, lv in zip(rows, level) if lv < cut]
    high = [row for row, lv in zip(rows, level) if lv >= cut]
    return (low, reps[:cut]), (high, reps[cut:])


# ----------------------------------------------------------------------------------------------
# Block bootstrap over (budget, r) cells (paper App. G.2)

def bootstrap_cells(rows):
    """Block structure of the bootstrap: each run's (budget, r) cell index and each cell's r."""
    c = _joint_arrays(rows)
    level, _ = budget_levels(c["flops_budget"])
    keys = sorted(set(zip(level.tolist(), c["r"].astype(int).tolist())))
    index = {k: j for j, k in enumerate(keys)}
    cell_of_run = np.array([index[(lv, int(r))] for lv, r in zip(level, c["r"])])
    return cell_of_run, np.array([k[1] for k in keys])


def resample_weights(seed, i, cell_of_run, r_of_cell):
    """Run weights of bootstrap resample i: the cells are drawn with replacement from their own RNG
    stream (so draws do not depend on how resamples are split over workers) and a run counts as
    often as its cell was drawn. Returns (weights, rng) - the rng then feeds the refit's starts."""
    rng = np.random.default_rng([seed, 7919, i])
    n_cells = len(r_of_cell)
    while True:
        counts = np.bincount(rng.integers(0, n_cells, n_cells), minlength=n_cells)
        # phi is not identified without two loop counts; redraw such (very rare) resamples.
        if len(set(r_of_cell[counts > 0].tolist())) >= 2:
            return counts[cell_of_run].astype(float), rng


def _boot_chunk(task):
    """Worker: refit the joint law on resamples `indices`, each from the full-data fit's distinct
    local optima plus `restarts` uniform random starts."""
    prob, cell_of_run, r_of_cell, theta0, restarts, seed, indices = task
    _single_thread_scipy_blas()
    out = []
    for i in indices:
        w, rng = resample_weights(seed, i, cell_of_run, r_of_cell)
        p = dict(prob, w=w)
        starts = np.vstack([theta0, _random_starts(restarts, p["lo"], p["hi"], rng)])
        best = _multistart(p, starts, 1)[0]
        out.append((i, best[1], best[2], best[0]))
    return out


def bootstrap_joint(rows, fit, resamples=200, restarts=16, seed=0, workers=1, delta=HUBER_DELTA):
    """95% percentile CIs of the joint-law parameters from a block bootstrap over (budget, r) cells.
    Every refit starts from the full-data fit's best distinct local optima (up to 8, the global one
    first) plus `restarts` uniform random starts in the box, instead of 500 random starts: checked to
    land on the 500-restart optimum in tests/test_fit_laws.py and dev/bench_fit.py."""
    if resamples < 2:
        raise ValueError("bootstrap_joint: need at least 2 resamples")
    c = _joint_arrays(rows)
    cell_of_run, r_of_cell = bootstrap_cells(rows)
    prob = _problem(c["n_once"], c["n_rec"], c["r"], c["tokens"], c["val_loss"], delta=delta)
    theta0 = np.clip(np.array(fit.get("local_optima") or [fit["theta"]]), prob["lo"], prob["hi"])
    chunks = [list(ch) for ch in np.array_split(np.arange(resamples), max(1, min(workers, resamples)))]
    tasks = [(prob, cell_of_run, r_of_cell, theta0, restarts, seed, ch) for ch in chunks if ch]
    draws = sorted((d for part in _pmap(_boot_chunk, tasks, workers) for d in part), key=lambda d: d[0])
    thetas = np.array([d[1] for d in draws])
    ok = np.array([d[2] for d in draws])
    good = thetas[ok]
    params = {"phi": good[:, 5], "alpha": good[:, 3], "beta": good[:, 4], "A": np.exp(good[:, 0]),
              "B": np.exp(good[:, 1]), "E": np.exp(good[:, 2])}
    out = {"resamples": resamples, "restarts": restarts, "cells": len(r_of_cell),
           "not_converged": int((~ok).sum()), "draws": {k: v.tolist() for k, v in params.items()}}
    for k, v in params.items():
        out[k + "_ci"] = [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))] if len(v) else None
    out["frac_phi_le_0"] = float(np.mean(params["phi"] <= 0)) if len(good) else None
    out["frac_phi_ge_1"] = float(np.mean(params["phi"] >= 1)) if len(good) else None
    return out


def compare_phi(boot_a, boot_b, fit_a, fit_b):
    """delta-phi = phi_b - phi_a with a percentile CI of the differences of the two bootstraps'
    draws, taken in resample order. The sweeps are resampled independently, so where they share
    r = 1 runs (the paper's case studies reuse the baseline) the CI is conservative (wider)."""
    da, db = np.array(boot_a["draws"]["phi"]), np.array(boot_b["draws"]["phi"])
    n = min(len(da), len(db))
    diff = db[:n] - da[:n]
    ci = [float(np.percentile(diff, 2.5)), float(np.percentile(diff, 97.5))]
    return {"phi_a": fit_a["phi"], "phi_b": fit_b["phi"], "delta_phi": fit_b["phi"] - fit_a["phi"],
            "delta_phi_ci": ci, "excludes_zero": bool(ci[0] > 0 or ci[1] < 0), "pairs": n}


# ----------------------------------------------------------------------------------------------
# Width families from flops.py: N(s), F(s), N_once(s), N_rec(s) along d = 64 s

def width_family(row, max_scale=None):
    """The architecture of `row` at every valid width up to `max_scale`: dict of arrays scale, N,
    n_once, n_rec, F (training FLOPs per token), from flops.py. None when flops.py cannot rebuild the
    row's model (missing fields, or counts that disagree with the row's n_params)."""
    cfg = _config_from_row(row)
    if cfg is None or abs(flops.param_counts(cfg)["n_params"] - float(row["n_params"])) > 0.5:
        return None
    max_scale = max_scale or 8 * cfg.scale
    out = {k: [] for k in ("scale", "N", "n_once", "n_rec", "F")}
    # Every width the head dim allows, d = head_dim * k (s = 2, 4, ... for head dim 128; steps of
    # s = 0.125 for the CPU grid's head dim 8).
    for d in range(cfg.head_dim, int(64 * max_scale) + 1, cfg.head_dim):
        s = d / 64
        c = _config_from_row(row, scale=s)
        if c is None:  # e.g. odd scale with head dim 128
            continue
        counts = flops.param_counts(c)
        out["scale"].append(s)
        out["N"].append(counts["n_params"])
        out["n_once"].append(counts["n_once"])
        out["n_rec"].append(counts["n_rec"])
        out["F"].append(flops.flops_per_token(c))
    fam = {k: np.array(v, dtype=float) for k, v in out.items()}
    fam["source"] = "flops.py"
    return fam if len(fam["N"]) >= 4 else None


def runs_family(rows):
    """Fallback family when flops.py cannot describe the runs: the runs' own (N, F) points, to be
    interpolated between (never extrapolated). F defaults to 6N when the rows lack flops_per_token."""
    by_n = {}
    for row in rows:
        F = row.get("flops_per_token")
        F = float(F) if F not in (None, "") else 6.0 * float(row["n_params"])
        by_n[float(row["n_params"])] = (float(row["n_once"]), float(row["n_rec"]), F,
                                       float(row.get("scale") or float("nan")))
    Ns = sorted(by_n)
    if len(Ns) < 2:
        return None
    vals = np.array([by_n[n] for n in Ns])
    return {"scale": vals[:, 3], "N": np.array(Ns), "n_once": vals[:, 0], "n_rec": vals[:, 1],
            "F": vals[:, 2], "source": "interpolated between runs"}


def _family_for_group(rows):
    """Width family of a group of runs: flops.py for the most common layout, else the runs."""
    scales = [float(row["scale"]) for row in rows if row.get("scale") not in (None, "")]
    layouts = {}
    for row in rows:
        key = tuple(str(row.get(k)) for k in CONFIG_FIELDS if k != "scale")
        layouts.setdefault(key, []).append(row)
    common = max(layouts.values(), key=len)
    fam = width_family(common[0], max_scale=8 * max(scales) if scales else None)
    return fam if fam is not None else runs_family(rows)


def _interp_family(fam, r=1, phi=0.0):
    """Monotone (PCHIP) interpolants in log N of log F, log N_eff and the width s."""
    logN = np.log(fam["N"])
    logF = PchipInterpolator(logN, np.log(fam["F"]))
    neff = fam["n_once"] + float(r) ** phi * fam["n_rec"]
    logNeff = PchipInterpolator(logN, np.log(neff))
    scale = PchipInterpolator(logN, fam["scale"]) if np.all(np.isfinite(fam["scale"])) else None
    return logN, logF, logNeff, scale


def frontier_point(fit, fam, C, r=1, joint=False):
    """Compute-optimal allocation at budget C: minimise L(N, C / F(N)) over the width family
    (iso-depth §4.2). Returns N*, D*, L*, continuous width s*, and whether N* hit the family's edge."""
    phi = fit["phi"] if joint else 0.0
    logN, logF, logNeff, scale = _interp_family(fam, r if joint else 1, phi)

    def loss(lx):
        lneff = logNeff(lx) if joint else lx
        D = C / np.exp(logF(lx))
        return fit["E"] + fit["A"] * np.exp(-fit["alpha"] * lneff) + fit["B"] * D ** -fit["beta"]

    grid = np.linspace(logN[0], logN[-1], 4001)
    vals = loss(grid)
    i = int(np.argmin(vals))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    best = minimize_scalar(loss, bounds=(lo, hi), method="bounded", options={"xatol": 1e-10})
    lx = best.x if best.fun <= vals[i] else grid[i]
    N = float(np.exp(lx))
    return {"N_star": N, "D_star": float(C / np.exp(logF(lx))), "L_star": float(loss(lx)),
            "scale_star": float(scale(lx)) if scale is not None else None,
            "at_edge": bool(i == 0 or i == len(grid) - 1)}


def compute_frontier(rows, per_arch, joint_fit, budgets):
    """Frontier per architecture and budget, from each per-architecture law and from the joint law,
    with the gap L*_r - L*_{r=1} at the same budget."""
    groups = {}
    for row in rows:
        groups.setdefault(arch_key(row), []).append(row)
    out = []
    for key in sorted(groups):
        fam = _family_for_group(groups[key])
        if fam is None:
            continue
        laws = []
        if key in per_arch and per_arch[key].get("converged"):
            laws.append(("per_arch", per_arch[key], False))
        if joint_fit is not None and joint_fit.get("converged"):
            laws.append(("joint", joint_fit, True))
        for law, fit, joint in laws:
            for C in budgets:
                pt = frontier_point(fit, fam, C, key[0], joint)
                out.append({"law": law, "r": key[0], "r_bwd": key[1], "injection": key[2],
                            "budget": float(C), "family": fam["source"], **pt})
    base = {(p["law"], p["budget"]): p["L_star"] for p in out if p["r"] == 1}
    for p in out:
        ref = base.get((p["law"], p["budget"]))
        p["gap_to_r1"] = None if ref is None else p["L_star"] - ref
    return out


# ----------------------------------------------------------------------------------------------
# Equivalence calculator (iso-depth §1, App. G.5)

def _solve_on_family(fam, key, target):
    """Continuous width at which fam[key] equals target (monotone interpolation in log space)."""
    xs = np.log(fam[key])
    if not xs[0] <= math.log(target) <= xs[-1]:
        raise ValueError(f"equivalence: {key} = {target:.4g} lies outside the width family")
    s = float(PchipInterpolator(xs, fam["scale"])(math.log(target)))
    other = {k: float(np.exp(PchipInterpolator(xs, np.log(fam[k]))(math.log(target))))
             for k in ("N", "F")}
    return s, other


def equivalence(r, scale, phi, layout=None):
    """A looped model (r, s) against non-looped models of the same family (same effective depth):
    N, N_eff(phi); the r = 1 model with the same loss (N = N_eff at the same D, paper Eq. 3); the r = 1
    model with the same training FLOPs per token (by iso-depth about the same width s)."""
    kw = {k: v for k, v in (layout or {}).items()
          if k in ("injection", "hc_lanes", "depth", "prelude", "coda", "head_dim", "vocab_size", "seq_len")}
    looped = flops.ModelConfig(r=int(r), scale=int(scale), **kw)
    counts = flops.param_counts(looped)
    n_eff = flops.effective_params(counts["n_once"], counts["n_rec"], looped.r, phi)
    plain_kw = {k: kw[k] for k in ("head_dim", "vocab_size", "seq_len") if k in kw}
    plain_kw["depth"] = looped.depth
    row = {"r": 1, "scale": int(scale), **plain_kw}
    row["n_params"] = flops.param_counts(_config_from_row(row))["n_params"]
    F = flops.flops_per_token(looped)
    fam = width_family(row, max_scale=max(8 * int(scale), 64))
    s_loss, at_loss = _solve_on_family(fam, "N", n_eff)
    s_flops, at_flops = _solve_on_family(fam, "F", F)
    same_width = _config_from_row(row)
    return {"r": looped.r, "scale": looped.scale, "phi": phi, "N": counts["n_params"],
            "n_once": counts["n_once"], "n_rec": counts["n_rec"], "n_eff": n_eff, "flops_per_token": F,
            "same_loss": {"N": n_eff, "scale": s_loss, "flops_per_token": at_loss["F"]},
            "same_flops": {"N": at_flops["N"], "scale": s_flops, "flops_per_token": F},
            "same_width": {"N": flops.param_counts(same_width)["n_params"], "scale": looped.scale,
                           "flops_per_token": flops.flops_per_token(same_width)}}


# ----------------------------------------------------------------------------------------------
# Truncate-or-not law (extension; truncate-or-not §5, App. C-D)

def g_loop(T, B, c, p, q):
    """Looping coefficient g(T, B) = exp[c (1 - T^-p B^-q)]: g(1,1) = 1, bounded by e^c."""
    T, B = np.asarray(T, float), np.asarray(B, float)
    return np.exp(c * (1.0 - T ** -p * B ** -q))


def truncate_law_loss(coef, n_once, n_rec, T, B, D):
    neff = np.asarray(n_once, float) + g_loop(T, B, coef["c"], coef["p"], coef["q"]) * np.asarray(n_rec, float)
    S = coef["A"] * (neff / TL_N0) ** -coef["alpha"] + coef["H"] * (np.asarray(D, float) / TL_D0) ** -coef["beta"]
    return coef["E"] + S ** coef["kappa"]


def _tl_unpack(theta):
    E, logA, logH, alpha, beta, kappa, logc, p, q = theta
    return {"E": E, "A": math.exp(logA), "H": math.exp(logH), "alpha": alpha, "beta": beta,
            "kappa": kappa, "c": math.exp(logc), "p": p, "q": q}


def _tl_residuals(theta, d):
    """Residuals (prediction - measurement, nats) of the truncate-or-not law and their analytic Jacobian
    in the optimisation coordinates (E, log A, log H, alpha, beta, kappa, log c, p, q)."""
    E, logA, logH, alpha, beta, kappa, logc, p, q = theta
    c = math.exp(logc)
    tb = np.exp(-p * d["logT"] - q * d["logB"])  # T^-p B^-q
    g = np.exp(c * (1.0 - tb))
    neff = d["n_once"] + g * d["n_rec"]
    lu = np.log(neff / TL_N0)
    X = np.exp(logA - alpha * lu)          # A u^-alpha
    Y = np.exp(logH - beta * d["logv"])    # H v^-beta
    S = X + Y
    Sk = S ** kappa
    res = E + Sk - d["L"]
    k1 = kappa * Sk / S                    # dL/dS
    dneff = k1 * X * (-alpha) / neff       # dL/dN_eff
    dg = dneff * d["n_rec"] * g * c        # dL/d(c (1 - tb)) chain piece
    J = np.column_stack([np.ones_like(S), k1 * X, k1 * Y, -k1 * X * lu, -k1 * Y * d["logv"],
                         Sk * np.log(S), dg * (1.0 - tb), dg * tb * d["logT"], dg * tb * d["logB"]])
    return res, J


def _tl_data(rows):
    # One point per configuration (N, D, T, B): seeds are averaged, each configuration weighs the same.
    by_cfg = {}
    for row in rows:
        key = (float(row["n_once"]), float(row["n_rec"]), float(row["tokens"]), int(row["r"]), int(row["r_bwd"]))
        by_cfg.setdefault(key, []).append(row)
    keys = sorted(by_cfg)
    arr = np.array(keys, dtype=float)
    reps = [by_cfg[k][0] for k in keys]
    return {"n_once": arr[:, 0], "n_rec": arr[:, 1], "D": arr[:, 2], "T": arr[:, 3], "Bk": arr[:, 4],
            "logT": np.log(arr[:, 3]), "logB": np.log(arr[:, 4]), "logv": np.log(arr[:, 2] / TL_D0),
            "L": np.array([np.mean([float(x["val_loss"]) for x in by_cfg[k]]) for k in keys]),
            "size": np.array([float(x.get("d_model") or x["n_params"]) for x in reps]),
            "budget": budget_levels([float(x["flops_budget"]) for x in reps])[0]}


def _tl_subset(d, mask):
    return {k: (v[mask] if isinstance(v, np.ndarray) else v) for k, v in d.items()}


def _tl_starts(task):
    d, starts = task
    _single_thread_scipy_blas()
    out = []
    for x0 in starts:
        res = least_squares(_tl_residuals_only, x0, jac=_tl_jac_only, bounds=(TL_LO, TL_HI), method="trf",
                            x_scale="jac", max_nfev=4000, ftol=1e-12, xtol=1e-12, gtol=1e-12, args=(d,))
        out.append((float(2 * res.cost), res.x, bool(res.status > 0), res.message))
    return out


def _tl_residuals_only(theta, d):
    return _tl_residuals(theta, d)[0]


def _tl_jac_only(theta, d):
    return _tl_residuals(theta, d)[1]


def _tl_fit_data(d, starts, seed, workers):
    rng = np.random.default_rng(seed)
    x0 = rng.uniform(TL_INIT_LO, TL_INIT_HI, size=(starts, len(TL_LO)))
    chunks = [c for c in np.array_split(x0, max(1, min(workers, starts))) if len(c)]
    results = [r for part in _pmap(_tl_starts, [(d, c) for c in chunks], workers) for r in part]
    conv = [r for r in results if r[2]]
    best = min(conv or results, key=lambda r: r[0])
    return best, len(conv)


def fit_truncate_law(rows, starts=64, seed=TL_SEED, workers=1):
    """Nine-coefficient truncate-or-not law by least squares (trust-region reflective, analytic
    Jacobian, Jacobian scaling, <= 4000 evaluations, tolerances 1e-12), best converged of `starts`
    uniform random starts. Configurations are per (N_once, N_rec, D, T = r, B = r_bwd)."""
    d = _tl_data(rows)
    if len(d["L"]) < 10:
        raise ValueError(f"fit_truncate_law: {len(d['L'])} configurations are too few for 9 coefficients")
    if not np.any(d["T"] == 1) or not np.any(d["T"] > 1):
        raise ValueError("fit_truncate_law: needs non-looped (r = 1) and looped runs")
    best, n_conv = _tl_fit_data(d, starts, seed, workers)
    coef = _tl_unpack(best[1])
    resid = truncate_law_loss(coef, d["n_once"], d["n_rec"], d["T"], d["Bk"], d["D"]) - d["L"]
    ss = float(np.sum((d["L"] - d["L"].mean()) ** 2))
    notes = []
    if np.all(d["T"] == d["Bk"]):
        notes.append("every run has r_bwd = r: only p + q is identified, not p and q separately")
    names = ("E", "log A", "log H", "alpha", "beta", "kappa", "log c", "p", "q")
    for j, name in enumerate(names):
        # A coefficient on its box edge is a finding, e.g. c -> its cap means the loop gain looks
        # unbounded over these r (the power-law limit of g, their §C.4), E -> 0 the E-kappa trade-off.
        if np.isclose(best[1][j], TL_LO[j], rtol=0, atol=1e-6) or np.isclose(best[1][j], TL_HI[j], rtol=0, atol=1e-6):
            notes.append(f"{name} = {best[1][j]:.4g} sits on its bound")
    return {**coef, "sse": best[0], "rmse": float(np.sqrt(np.mean(resid ** 2))),
            "r2": 1 - float(resid @ resid) / ss if ss > 0 else float("nan"), "configs": len(d["L"]),
            "converged": best[2], "converged_starts": n_conv, "starts": starts,
            "theta": [float(v) for v in best[1]], "notes": notes}


def _tl_fold(task):
    d, train, test, starts, seed = task
    best, _ = _tl_fit_data(_tl_subset(d, train), starts, seed, 1)
    coef = _tl_unpack(best[1])
    t = _tl_subset(d, test)
    pred = truncate_law_loss(coef, t["n_once"], t["n_rec"], t["T"], t["Bk"], t["D"])
    return (pred - t["L"]).tolist(), best[2]


def truncate_holdout(rows, family, starts=64, seed=TL_SEED, workers=1):
    """Held-out prediction errors of the truncate-or-not law: leave one configuration / model size
    (width) / compute budget / (T, B) setting out, refit on the rest (seed 20261010 + fold index,
    never initialised from the full-data fit), predict the held-out runs. Pooled RMSE, MAE, bias
    (prediction - measurement), max error."""
    if family not in TL_FAMILIES:
        raise ValueError(f"truncate_holdout: family must be one of {', '.join(TL_FAMILIES)}")
    d = _tl_data(rows)
    labels = {"config": np.arange(len(d["L"])), "size": d["size"], "budget": d["budget"],
              "setting": d["T"] * 1000 + d["Bk"]}[family]
    folds = sorted(set(labels.tolist()))
    tasks = [(d, labels != lab, labels == lab, starts, seed + j) for j, lab in enumerate(folds)]
    results = _pmap(_tl_fold, tasks, workers)
    err = np.array([e for errs, _ in results for e in errs])
    return {"family": family, "fits": len(folds), "rmse": float(np.sqrt(np.mean(err ** 2))),
            "mae": float(np.mean(np.abs(err))), "bias": float(np.mean(err)),
            "max_error": float(np.abs(err).max()), "converged_folds": int(sum(ok for _, ok in results))}


def chi(T, B, rho, coef):
    """Compute paid per effective parameter, chi = N_comp / N_eff, with recurrent share rho = N_rec/N:
    6 N_comp = 6 N_once + (2T + 4B) N_rec (forward 2, backward 4 FLOPs per parameter and token)."""
    g = g_loop(T, B, coef["c"], coef["p"], coef["q"])
    return ((1 - rho) + rho * (2 * np.asarray(T, float) + 4 * np.asarray(B, float)) / 6) / ((1 - rho) + rho * g)


def chi_table(coef, rho=TL_RHO, Ts=(1, 2, 4, 8, 16)):
    """Best backward-loop count per T (truncate-or-not Table 5): B* = argmin over integer B in 1..T of
    chi(T, B); chi at B* and at B = T; and N*, D* at B* relative to full BPTT at the same T and C.
    At fixed compute the looped problem is the non-looped one with budget C / chi (their Lemma D.1),
    so N_eff* scales as chi^(-beta/(alpha+beta)) and D* as chi^(-alpha/(alpha+beta))."""
    table = []
    for T in Ts:
        rh = rho[T] if isinstance(rho, dict) else rho
        Bs = np.arange(1, T + 1)
        ch = chi(T, Bs, rh, coef)
        j = int(np.argmin(ch))
        Bstar = int(Bs[j])
        ab = coef["alpha"] + coef["beta"]
        ratio = ch[j] / ch[-1]
        g_full = g_loop(T, T, coef["c"], coef["p"], coef["q"])
        g_star = g_loop(T, Bstar, coef["c"], coef["p"], coef["q"])
        neff_ratio = ((1 - rh) + rh * g_full) / ((1 - rh) + rh * g_star)  # (N/N_eff)_B* / (N/N_eff)_T
        table.append({"T": T, "rho": rh, "B_star": Bstar, "chi_star": float(ch[j]), "chi_full": float(ch[-1]),
                      "N_star_ratio": float(neff_ratio * ratio ** (-coef["beta"] / ab)),
                      "D_star_ratio": float(ratio ** (-coef["alpha"] / ab)),
                      "g_star": float(g_star), "g_full": float(g_full)})
    return table


# ----------------------------------------------------------------------------------------------
# Synthetic sweeps (tests, benchmark, README example)

def synthetic_rows(truth=None, noise=0.01, seed=0, grid=None, rs=(1, 2, 4, 8), truncated=False,
                   batch_tokens=2 ** 18, vocab_size=32064, seq_len=2048):
    """The paper's iso-FLOP grid with losses drawn from a known joint law plus Gaussian noise
    (nats). Counts and tokens come from flops.py exactly as train.py books them; `truncated` trains
    the last ceil(r/2) loops (iso-depth §5.1)."""
    truth = {**SYNTHETIC_TRUTH, **(truth or {})}
    rng = np.random.default_rng(seed)
    rows = []
    for C, widths in sorted((grid or PAPER_GRID).items()):
        for r in rs:
            for s in widths:
                r_bwd = -(-r // 2) if truncated and r > 1 else 0
                cfg = flops.ModelConfig(r=r, scale=s, r_bwd=r_bwd, vocab_size=vocab_size, seq_len=seq_len)
                row = flops.summary(cfg, C, batch_tokens)
                clean = float(law_loss(truth, row["n_once"], row["n_rec"], r, row["tokens"]))
                row.update(val_loss=clean + noise * float(rng.standard_normal()), seed=seed)
                rows.append(row)
    return rows


def write_jsonl(rows, path):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


# ----------------------------------------------------------------------------------------------
# The analysis the CLI runs

def select_rows(rows, only_r=None, injection=None, bptt=None):
    """Keep r = 1 baseline runs plus looped runs of one injection / BPTT mode; optionally only some r."""
    out = []
    for row in rows:
        r = int(row["r"])
        if only_r and r not in only_r:
            continue
        if r > 1 and injection and row["injection"] != injection:
            continue
        if r > 1 and bptt == "full" and int(row["r_bwd"]) != r:
            continue
        if r > 1 and bptt == "truncated" and int(row["r_bwd"]) == r:
            continue
        out.append(row)
    return out


def analyse(rows, restarts=500, boot=200, boot_restarts=16, seed=0, workers=1, delta=HUBER_DELTA,
            need_joint=True):
    """Per-architecture fits, joint fit, restricted fits, residuals, budget halves, bootstrap and
    frontier for one sweep. Returns a dict (JSON-friendly apart from the tuple keys of per_arch)."""
    groups = {}
    for row in rows:
        groups.setdefault(arch_key(row), []).append(row)
    res = {"n_runs": len(rows), "groups": {arch_label(k): len(v) for k, v in sorted(groups.items())},
           "per_arch": {}, "notes": [], "joint": None, "restricted": {}, "halves": {}}
    levels = budget_levels([row["flops_budget"] for row in rows])[1]
    res["budgets"] = levels.tolist()
    if len(levels) < 2:
        raise ValueError("all runs share one compute budget; the laws need at least two")
    for key, grp in sorted(groups.items()):
        N = [row["n_params"] for row in grp]
        try:
            res["per_arch"][key] = fit_chinchilla(N, [row["tokens"] for row in grp],
                                                  [row["val_loss"] for row in grp], restarts, seed, workers,
                                                  C=[row["flops_budget"] for row in grp], delta=delta)
        except ValueError as err:
            res["notes"].append(f"{arch_label(key)}: no per-architecture fit ({err})")
    by_r = {}
    for key in groups:
        by_r.setdefault(key[0], []).append(key)
    multi = {r: ks for r, ks in by_r.items() if len(ks) > 1}
    if len(by_r) < 2:
        res["notes"].append("joint law skipped: it needs runs at two or more loop counts r")
    elif multi:
        msg = ("joint law needs one architecture per r, but " +
               "; ".join(f"r={r} has {', '.join(arch_label(k) for k in ks)}" for r, ks in sorted(multi.items())) +
               " (pick one with --only-injection / --only-bptt)")
        if need_joint:
            raise ValueError(msg)
        res["notes"].append(msg)
    else:
        joint = fit_joint(rows, restarts, seed, None, workers, delta)
        res["joint"] = joint
        for phi in (0.0, 1.0):
            res["restricted"][f"phi={phi:g}"] = fit_joint(rows, restarts, seed, phi, workers, delta)
        res["residuals_by_r"] = residuals_by_r(joint, rows) if joint["converged"] else []
        for name, (part, budgets) in zip(("low", "high"), budget_halves(rows)):
            try:
                half = fit_joint(part, restarts, seed, None, workers, delta)
                half["budgets"] = budgets.tolist()
                res["halves"][name] = half
            except ValueError as err:
                res["notes"].append(f"{name}-budget half: no refit ({err})")
        if boot and joint["converged"]:
            res["bootstrap"] = bootstrap_joint(rows, joint, boot, boot_restarts, seed, workers, delta)
    if not res["per_arch"] and res["joint"] is None:
        raise ValueError("nothing to fit: " + "; ".join(res["notes"]))
    if len(levels) > 12:
        # Budgets off a grid (e.g. read off a figure): evaluate the frontier at 8 log-spaced budgets.
        levels = np.geomspace(levels[0], levels[-1], 8)
        res["notes"].append("budgets are not on a grid: frontier at 8 log-spaced budgets")
    res["frontier"] = compute_frontier(rows, res["per_arch"], res["joint"], levels)
    return res


# ----------------------------------------------------------------------------------------------
# Report

def _fmt_fit(fit, phi=True):
    if not fit["converged"]:
        return f"NOT CONVERGED ({fit['message']}); best objective {fit['objective']:.6g}"
    s = (f"E {fit['E']:.4f}  A {fit['A']:.4g}  alpha {fit['alpha']:.4f}  B {fit['B']:.4g}  "
         f"beta {fit['beta']:.4f}")
    if phi and "phi" in fit:
        s = f"phi {fit['phi']:.4f}  " + s
    return s + f"  R2 {fit['r2']:.5f}  RMSE {fit['rmse']:.4f}"


def _ci(boot, key, fmt):
    if not boot or boot.get(key + "_ci") is None:
        return ""
    lo, hi = boot[key + "_ci"]
    return f" [{fmt.format(lo)}, {fmt.format(hi)}]"


def report(res, title, p=print):
    p(f"== {title}: {res['n_runs']} runs, {len(res['groups'])} architectures, "
      f"{len(res['budgets'])} budgets ({res['budgets'][0]:.3g} .. {res['budgets'][-1]:.3g} FLOPs)")
    for note in res["notes"]:
        p(f"   note: {note}")
    p("")
    p("Per-architecture Chinchilla fits  L = E + A N^-alpha + B D^-beta  (Huber on log L, "
      "best of the restarts; hits = restarts reaching the optimum)")
    p(f"  {'architecture':<22}{'runs':>5}{'E':>8}{'A':>10}{'alpha':>8}{'B':>10}{'beta':>8}"
      f"{'R2':>9}{'RMSE':>8}{'hits':>9}")
    for key, fit in sorted(res["per_arch"].items()):
        if not fit["converged"]:
            p(f"  {arch_label(key):<22}{fit['n_runs']:>5}  NOT CONVERGED ({fit['message']})")
            continue
        p(f"  {arch_label(key):<22}{fit['n_runs']:>5}{fit['E']:>8.4f}{fit['A']:>10.4g}{fit['alpha']:>8.4f}"
          f"{fit['B']:>10.4g}{fit['beta']:>8.4f}{fit['r2']:>9.5f}{fit['rmse']:>8.4f}"
          f"{fit['hits']:>5}/{fit['restarts']}")
    joint = res["joint"]
    if joint is not None:
        boot = res.get("bootstrap")
        p("")
        p("Joint law  L = E + A (N_once + r^phi N_rec)^-alpha + B D^-beta  (one law for every r)")
        if not joint["converged"]:
            p(f"  NOT CONVERGED ({joint['message']}); best objective {joint['objective']:.6g}")
        else:
            p(f"  phi   = {joint['phi']:.4f}{_ci(boot, 'phi', '{:.4f}')}   "
              f"(r^phi: " + ", ".join(f"{r}^phi = {r ** joint['phi']:.3f}" for r in (2, 4, 8)) + ")")
            if min(abs(joint["phi"] - BOX_LO[5]), abs(joint["phi"] - BOX_HI[5])) < 1e-6:
                # An optimum on the box edge is the box's answer, not the data's.
                p(f"  !! phi sits on the edge of its box [{BOX_LO[5]:g}, {BOX_HI[5]:g}]: these runs do not "
                  "identify phi (e.g. minima not bracketed, or looping adds nothing measurable)")
            p(f"  E     = {joint['E']:.4f}{_ci(boot, 'E', '{:.4f}')}")
            p(f"  A     = {joint['A']:.4g}{_ci(boot, 'A', '{:.4g}')}   alpha = {joint['alpha']:.4f}"
              f"{_ci(boot, 'alpha', '{:.4f}')}")
            p(f"  B     = {joint['B']:.4g}{_ci(boot, 'B', '{:.4g}')}   beta  = {joint['beta']:.4f}"
              f"{_ci(boot, 'beta', '{:.4f}')}")
            p(f"  R2 {joint['r2']:.5f}  RMSE {joint['rmse']:.4f} nats  max |resid| {joint['max_abs_resid']:.4f}"
              f"  objective {joint['objective']:.6g}  hits {joint['hits']}/{joint['restarts']}")
            if boot:
                p(f"  95% CIs: block bootstrap, {boot['resamples']} resamples of {boot['cells']} (budget, r) "
                  f"cells, each refit from the full fit's local optima + {boot['restarts']} random starts; "
                  f"{boot['frac_phi_le_0'] * 100:.0f}% of resamples reach phi <= 0, "
                  f"{boot['frac_phi_ge_1'] * 100:.0f}% phi >= 1"
                  + (f"; {boot['not_converged']} refits did not converge and are left out"
                     if boot["not_converged"] else ""))
            p("")
            p("Restricted fits (same data, phi held fixed)")
            for name, fit in res["restricted"].items():
                p(f"  {name:<8}" + _fmt_fit(fit, phi=False))
            p(f"  {'free':<8}" + _fmt_fit(joint, phi=False))
            p("")
            p("Joint-fit residuals by r (actual - predicted, nats)")
            p(f"  {'r':>3}{'runs':>6}{'RMSE':>9}{'mean':>9}{'max|.|':>9}")
            for row in res["residuals_by_r"]:
                p(f"  {row['r']:>3}{row['runs']:>6}{row['rmse']:>9.4f}{row['mean']:>+9.4f}{row['max_abs']:>9.4f}")
        if res["halves"]:
            p("")
            p("Budget halves (joint law refit on each half of the sorted budgets)")
            for name, fit in res["halves"].items():
                b = fit["budgets"]
                span = f"C in [{b[0]:.3g}, {b[-1]:.3g}]"
                p(f"  {name:<5} {span:<24} {fit['n_runs']:>4} runs  " + _fmt_fit(fit))
    if res["frontier"]:
        # One row per (budget, architecture): the per-architecture law's optimum (as in the paper's
        # Figure 4) and, last column, the gap the joint law predicts; --json keeps both in full.
        pts = {(pt["law"], pt["budget"], pt["r"], pt["r_bwd"], pt["injection"]): pt for pt in res["frontier"]}
        main_law = "per_arch" if any(k[0] == "per_arch" for k in pts) else "joint"
        sample = next(pt for pt in res["frontier"] if pt["law"] == main_law)
        p("")
        p(f"Compute-optimal frontier: min over width of L(N, C/F(N)) with the "
          f"{'per-architecture laws' if main_law == 'per_arch' else 'joint law'}; F(N) from {sample['family']}; "
          "gap = L* - L*(r=1) at the same budget")
        p(f"  {'budget':>9}  {'architecture':<22}{'N*':>10}{'s*':>7}{'D*':>10}{'D*/N*':>7}{'L*':>8}{'gap':>8}"
          f"{'joint gap':>11}")
        for key in sorted(k for k in pts if k[0] == main_law):
            pt = pts[key]
            jt = pts.get(("joint",) + key[1:])
            gap = "" if pt["gap_to_r1"] is None or pt["r"] == 1 else f"{pt['gap_to_r1']:+8.4f}"
            jgap = "" if jt is None or jt["gap_to_r1"] is None or pt["r"] == 1 else f"{jt['gap_to_r1']:+11.4f}"
            s = f"{pt['scale_star']:.3g}" if pt["scale_star"] is not None else "-"
            edge = "  (at edge of width family)" if pt["at_edge"] else ""
            p(f"  {pt['budget']:>9.3g}  {arch_label(key[2:]):<22}"
              f"{_si(pt['N_star']):>10}{s:>7}{_si(pt['D_star']):>10}{pt['D_star'] / pt['N_star']:>7.1f}"
              f"{pt['L_star']:>8.4f}{gap:>8}{jgap:>11}{edge}".rstrip())


def _si(x):
    """15.7k, 98.3M, 3.81B: parameter and token counts from CPU-scale to paper-scale grids."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"


def report_equivalence(eq, p=print):
    p("")
    p(f"Equivalence at r = {eq['r']}, s = {eq['scale']} (d = {64 * eq['scale']}), phi = {eq['phi']:.4f}")
    p(f"  looped model      N = {eq['N'] / 1e6:8.1f}M  (N_once {eq['n_once'] / 1e6:.1f}M + N_rec "
      f"{eq['n_rec'] / 1e6:.1f}M)  F = {eq['flops_per_token']:.4g} FLOPs/token")
    p(f"  effective size    N_eff = N_once + r^phi N_rec = {eq['n_eff'] / 1e6:.1f}M")
    sl, sf = eq["same_loss"], eq["same_flops"]
    p(f"  same loss         non-looped N = {sl['N'] / 1e6:8.1f}M  (s = {sl['scale']:.2f}, "
      f"F = {sl['flops_per_token']:.4g})")
    p(f"  same FLOPs        non-looped N = {sf['N'] / 1e6:8.1f}M  (s = {sf['scale']:.2f}; the same-width "
      f"r = 1 model has N = {eq['same_width']['N'] / 1e6:.1f}M)")
    p(f"  -> the looped model trains at the cost of a {sf['N'] / 1e6:.0f}M non-looped model and reaches the loss "
      f"of a {sl['N'] / 1e6:.0f}M one")


def report_truncate(tl, holdouts, table, published, p=print):
    p("")
    if tl is not None:
        p(f"Truncate-or-not law  L = E + [A (N_eff/N0)^-alpha + H (D/D0)^-beta]^kappa,  "
          f"N_eff = N_once + g(T,B) N_rec  ({tl['configs']} configurations, best of {tl['starts']} TRF "
          f"starts, {tl['converged_starts']} converged)")
        if not tl["converged"]:
            p("  NOT CONVERGED: no start ended on a convergence test")
        else:
            p("  " + "  ".join(f"{k} {tl[k]:.5g}" for k in ("E", "A", "H", "alpha", "beta", "kappa", "c", "p", "q")))
            p(f"  R2 {tl['r2']:.5f}  RMSE {tl['rmse']:.4f} nats")
            for note in tl["notes"]:
                p(f"  note: {note}")
        if holdouts:
            p(f"  {'held out':<10}{'fits':>6}{'RMSE':>10}{'MAE':>10}{'bias':>11}{'max err':>10}")
            for h in holdouts:
                p(f"  {h['family']:<10}{h['fits']:>6}{h['rmse']:>10.3e}{h['mae']:>10.3e}{h['bias']:>+11.2e}"
                  f"{h['max_error']:>10.3e}")
    if table:
        p(f"Best backward-loop count per T ({'published' if published else 'fitted'} coefficients; "
          "chi = N_comp/N_eff, N*, D* relative to full BPTT at the same T and compute)")
        p(f"  {'T':>3}{'rho':>7}{'B*':>4}{'g(T,B*)':>9}{'chi(T,B*)':>11}{'chi(T,T)':>10}{'N*':>7}{'D*':>7}")
        for t in table:
            p(f"  {t['T']:>3}{t['rho']:>7.3f}{t['B_star']:>4}{t['g_star']:>9.4f}{t['chi_star']:>11.3f}"
              f"{t['chi_full']:>10.3f}{t['N_star_ratio']:>7.2f}{t['D_star_ratio']:>7.2f}")


# ----------------------------------------------------------------------------------------------
# Plots (matplotlib only here)

def make_plots(res, rows, outdir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    markers = {1: "o", 2: "s", 4: "^", 8: "D", 16: "v"}
    budgets = res["budgets"]
    cmap = plt.get_cmap("viridis")
    color = {i: cmap(i / max(1, len(budgets) - 1)) for i in range(len(budgets))}
    level = budget_levels([row["flops_budget"] for row in rows])[0]
    groups = {}
    for row, lv in zip(rows, level):
        groups.setdefault(arch_key(row), []).append((row, lv))
    written = []

    # iso-FLOP curves: loss vs N per budget with each architecture's fitted law along its width family
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 3.8), sharey=True, squeeze=False)
    for ax, (key, grp) in zip(axes[0], sorted(groups.items())):
        fit = res["per_arch"].get(key)
        fam = _family_for_group([g[0] for g in grp])
        for row, lv in grp:
            ax.scatter(row["n_params"], row["val_loss"], color=color[lv], marker=markers.get(key[0], "o"), s=22)
        if fit is not None and fit["converged"] and fam is not None and len(budgets) <= 12:
            logN, logF, _, _ = _interp_family(fam)
            for lv, C in enumerate(budgets):
                ns = [row["n_params"] for row, l2 in grp if l2 == lv]
                if not ns:
                    continue
                x = np.linspace(math.log(min(ns)) - 0.4, math.log(max(ns)) + 0.4, 200)
                x = x[(x >= logN[0]) & (x <= logN[-1])]
                ax.plot(np.exp(x), law_loss(fit, np.exp(x), 0, 1, C / np.exp(logF(x))), color=color[lv], lw=1)
            for pt in res["frontier"]:  # compute-optimal points of this architecture's law
                if pt["law"] == "per_arch" and (pt["r"], pt["r_bwd"], pt["injection"]) == key:
                    ax.scatter(pt["N_star"], pt["L_star"], marker="*", s=90, color="red", zorder=3)
        ax.set_xscale("log")
        ax.set_title(arch_label(key))
        ax.set_xlabel("non-embedding parameters N")
    axes[0][0].set_ylabel("validation loss (nats)")
    if len(budgets) <= 12:
        for lv, C in enumerate(budgets):
            axes[0][-1].plot([], [], color=color[lv], label=f"C = {C:.3g}")
        axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(outdir / "isoflop.png", dpi=120)
    plt.close(fig)
    written.append("isoflop.png")

    # frontier: L*, N*, D* vs budget per r
    pts = [pt for pt in res["frontier"] if pt["law"] == "per_arch"] or res["frontier"]
    if pts:
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
        for key in sorted({(pt["r"], pt["r_bwd"], pt["injection"]) for pt in pts}):
            sel = sorted((pt for pt in pts if (pt["r"], pt["r_bwd"], pt["injection"]) == key), key=lambda x: x["budget"])
            Cs = [pt["budget"] for pt in sel]
            for ax, k in zip(axes, ("L_star", "N_star", "D_star")):
                ax.plot(Cs, [pt[k] for pt in sel], marker=markers.get(key[0], "o"), label=arch_label(key))
        for ax, lab in zip(axes, ("L* (nats)", "N*", "D* (tokens)")):
            ax.set_xscale("log")
            ax.set_xlabel("compute C (FLOPs)")
            ax.set_ylabel(lab)
            if lab != "L* (nats)":
                ax.set_yscale("log")
        axes[0].legend(fontsize=7)
        fig.suptitle(f"compute-optimal frontier ({pts[0]['law'].replace('_', '-')} law)")
        fig.tight_layout()
        fig.savefig(outdir / "frontier.png", dpi=120)
        plt.close(fig)
        written.append("frontier.png")

    # predicted vs actual for the joint law (or the per-architecture laws without one)
    fig, ax = plt.subplots(figsize=(4.6, 4.4))
    lo, hi = min(row["val_loss"] for row in rows), max(row["val_loss"] for row in rows)
    for key, grp in sorted(groups.items()):
        fit = res["joint"] if res["joint"] is not None else res["per_arch"].get(key)
        if fit is None or not fit["converged"]:
            continue
        for row, lv in grp:
            if res["joint"] is not None:
                pred = law_loss(fit, row["n_once"], row["n_rec"], row["r"], row["tokens"])
            else:
                pred = law_loss(fit, row["n_params"], 0, 1, row["tokens"])
            ax.scatter(pred, row["val_loss"], color=color[lv], marker=markers.get(key[0], "o"), s=18)
        ax.scatter([], [], color="gray", marker=markers.get(key[0], "o"), label=arch_label(key))
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    ax.set_xlabel("predicted loss (nats)")
    ax.set_ylabel("actual loss (nats)")
    ax.set_title("joint law" if res["joint"] is not None else "per-architecture laws")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(outdir / "pred_vs_actual.png", dpi=120)
    plt.close(fig)
    written.append("pred_vs_actual.png")
    return written


# ----------------------------------------------------------------------------------------------

def _json_ready(res):
    """Report dict for --json: per_arch keyed by label, bulky internals dropped."""
    out = {k: v for k, v in res.items() if k != "per_arch"}
    out["per_arch"] = {arch_label(k): v for k, v in res["per_arch"].items()}
    if out.get("bootstrap"):
        out["bootstrap"] = {k: v for k, v in out["bootstrap"].items() if k != "draws"}
    strip = lambda fit: {k: v for k, v in fit.items() if k != "local_optima"} if isinstance(fit, dict) else fit
    out["per_arch"] = {k: strip(v) for k, v in out["per_arch"].items()}
    out["restricted"] = {k: strip(v) for k, v in out["restricted"].items()}
    out["halves"] = {k: strip(v) for k, v in out["halves"].items()}
    joint = res.get("joint")
    if joint is not None:
        boot = res.get("bootstrap") or {}
        out["joint"] = {**strip(joint), **{k + "_ci": boot.get(k + "_ci") for k in ("phi", "A", "alpha", "B", "beta", "E")}}
    return out


def _parse_int_list(text):
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _parse_truth(text):
    out = {}
    for part in text.split(","):
        if not part.strip():
            continue
        k, _, v = part.partition("=")
        if k.strip() not in SYNTHETIC_TRUTH:
            raise argparse.ArgumentTypeError(f"unknown truth key {k!r} (use {', '.join(SYNTHETIC_TRUTH)})")
        out[k.strip()] = float(v)
    return out


def _load_sweep(path, args, cols):
    raw = load_results(path, cols)
    if args.drop_highest:
        if args.drop_highest >= len(raw):
            raise ValueError(f"{path}: --drop-highest {args.drop_highest} would drop every run")
        losses = sorted(float(r.get("val_loss", "nan")) for r in raw)
        cut = losses[-args.drop_highest]
        raw = [r for r in raw if float(r.get("val_loss", "nan")) < cut]
    rows, notes = prepare_rows(raw, str(path))
    rows = select_rows(rows, args.only_r, args.only_injection, args.only_bptt)
    if not rows:
        raise ValueError(f"{path}: no runs left after --only-* selection")
    return rows, notes


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="?", help="train.py JSONL results (or a CSV, see the --*-col flags)")
    parser.add_argument("--compare", metavar="FILE", help="second sweep: report delta-phi = phi(FILE) - phi(results)")
    parser.add_argument("--n-col", default="n_params", help="CSV column with non-embedding parameters N")
    parser.add_argument("--d-col", default="tokens", help="CSV column with training tokens D (else D = C/(6N))")
    parser.add_argument("--loss-col", default="val_loss", help="CSV column with the validation loss (nats)")
    parser.add_argument("--budget-col", default="flops_budget", help="CSV column with the compute budget C")
    parser.add_argument("--drop-highest", type=int, default=0, metavar="K",
                        help="drop the K highest-loss runs first (Epoch's Chinchilla filter uses 5)")
    parser.add_argument("--only-r", type=_parse_int_list, metavar="LIST", help="keep only these r, e.g. 1,4,8")
    parser.add_argument("--only-injection", metavar="NAME", help="keep looped runs with this injection (r = 1 stays)")
    parser.add_argument("--only-bptt", choices=("full", "truncated"), help="keep looped runs with r_bwd = r / r_bwd < r")
    parser.add_argument("--restarts", type=int, default=500, help="random L-BFGS-B restarts per fit (paper: 500)")
    parser.add_argument("--bootstrap", type=int, default=200, metavar="N", help="block-bootstrap resamples (0: off)")
    parser.add_argument("--boot-restarts", type=int, default=16,
                        help="random restarts per bootstrap refit, on top of the full-data optimum")
    parser.add_argument("--seed", type=int, default=0, help="seed of restarts and resamples (results are deterministic)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes for restarts and bootstrap")
    parser.add_argument("--delta", type=float, default=HUBER_DELTA, help="Huber delta on log-residuals")
    parser.add_argument("--equiv", nargs=2, type=int, metavar=("R", "S"),
                        help="equivalence calculator for a looped model with r = R at width s = S")
    parser.add_argument("--phi", type=float, help="phi for --equiv (default: the fitted phi)")
    parser.add_argument("--truncate-law", action="store_true", help="also fit the truncate-or-not law")
    parser.add_argument("--tl-starts", type=int, default=64, help="random TRF starts of the truncate-or-not fit")
    parser.add_argument("--tl-holdout", metavar="LIST", default="",
                        help="held-out checks of that law: comma list of config,size,budget,setting or 'all'")
    parser.add_argument("--chi-table", action="store_true",
                        help="print the best-B / chi table (published coefficients unless --truncate-law)")
    parser.add_argument("--rho", type=float, default=TL_RHO, help="N_rec/N for the published chi table")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    parser.add_argument("--plots", metavar="DIR", help="write isoflop.png, frontier.png, pred_vs_actual.png")
    parser.add_argument("--write-synthetic", metavar="FILE", help="write a synthetic paper-grid JSONL and exit")
    parser.add_argument("--synthetic-truth", type=_parse_truth, default={},
                        help="ground truth for --write-synthetic, e.g. 'phi=0.3,E=1.8'")
    parser.add_argument("--synthetic-noise", type=float, default=0.01, help="loss noise (nats) for --write-synthetic")
    parser.add_argument("--synthetic-bptt", choices=("full", "truncated"), default="full",
                        help="--write-synthetic: truncated trains the last ceil(r/2) loops")
    args = parser.parse_args()
    prog = "fit_laws.py"

    if args.write_synthetic:
        rows = synthetic_rows(args.synthetic_truth, args.synthetic_noise, args.seed,
                              truncated=args.synthetic_bptt == "truncated")
        write_jsonl(rows, args.write_synthetic)
        print(f"wrote {len(rows)} synthetic runs to {args.write_synthetic}")
        return
    if args.restarts < 1 or args.workers < 1 or args.boot_restarts < 0 or args.bootstrap < 0:
        sys.exit(f"{prog}: --restarts and --workers must be >= 1, --bootstrap and --boot-restarts >= 0")
    if args.bootstrap == 1:
        sys.exit(f"{prog}: --bootstrap needs at least 2 resamples (or 0 for none)")
    if args.results is None and not (args.equiv or args.chi_table):
        sys.exit(f"{prog}: give a results file (or --equiv R S --phi X, or --chi-table)")
    if args.results is None and args.equiv and args.phi is None:
        sys.exit(f"{prog}: --equiv without a results file needs --phi")
    families = list(TL_FAMILIES) if args.tl_holdout == "all" else [f for f in args.tl_holdout.split(",") if f]
    bad = [f for f in families if f not in TL_FAMILIES]
    if bad:
        sys.exit(f"{prog}: --tl-holdout takes {', '.join(TL_FAMILIES)} or all, got {', '.join(bad)}")
    cols = {"n_params": args.n_col, "tokens": args.d_col, "val_loss": args.loss_col, "flops_budget": args.budget_col}

    out = {}
    res = rows = None
    try:
        if args.results is not None:
            rows, notes = _load_sweep(args.results, args, cols)
            res = analyse(rows, args.restarts, args.bootstrap, args.boot_restarts, args.seed, args.workers,
                          args.delta, need_joint=not args.truncate_law)
            res["notes"] = notes + res["notes"]
            report(res, f"{args.results}")
            out = _json_ready(res)
            if args.compare:
                other_rows, other_notes = _load_sweep(args.compare, args, cols)
                other = analyse(other_rows, args.restarts, args.bootstrap, args.boot_restarts,
                                args.seed + 1_000_003, args.workers, args.delta)
                other["notes"] = other_notes + other["notes"]
                print("")
                report(other, f"{args.compare}")
                out["compare"] = {"file": args.compare, **_json_ready(other)}
                if res["joint"] is None or other["joint"] is None:
                    raise ValueError("--compare needs a joint-law fit of both sweeps")
                if not (res["joint"]["converged"] and other["joint"]["converged"]):
                    print("\nDelta-phi: NOT CONVERGED (a joint fit did not converge)")
                elif not (res.get("bootstrap") and other.get("bootstrap")):
                    d = other["joint"]["phi"] - res["joint"]["phi"]
                    print(f"\nDelta-phi = phi({args.compare}) - phi({args.results}) = {d:+.4f} (no CI: --bootstrap 0)")
                    out["delta_phi"] = {"delta_phi": d, "delta_phi_ci": None}
                else:
                    cmp_ = compare_phi(res["bootstrap"], other["bootstrap"], res["joint"], other["joint"])
                    out["delta_phi"] = cmp_
                    lo, hi = cmp_["delta_phi_ci"]
                    print(f"\nDelta-phi = phi({args.compare}) - phi({args.results}) = {cmp_['phi_b']:.4f} - "
                          f"{cmp_['phi_a']:.4f} = {cmp_['delta_phi']:+.4f}, 95% CI [{lo:+.4f}, {hi:+.4f}] "
                          f"({'excludes' if cmp_['excludes_zero'] else 'includes'} 0; independent resamples, "
                          "conservative when the sweeps share r = 1 runs)")
        if args.equiv:
            phi = args.phi
            if phi is None:
                if res is None or res["joint"] is None or not res["joint"]["converged"]:
                    raise ValueError("--equiv needs a converged joint fit or --phi")
                phi = res["joint"]["phi"]
            layout = None
            if rows is not None:
                looped = [row for row in rows if int(row["r"]) == args.equiv[0]]
                layout = {k: looped[0][k] for k in CONFIG_FIELDS if k in looped[0]} if looped else None
            eq = equivalence(args.equiv[0], args.equiv[1], phi, layout)
            report_equivalence(eq)
            out["equivalence"] = eq
        if args.truncate_law or args.chi_table or families:
            tl, holdouts, table, published = None, [], None, True
            if args.truncate_law or families:
                if rows is None:
                    raise ValueError("--truncate-law / --tl-holdout need a results file")
                tl = fit_truncate_law(rows, args.tl_starts, TL_SEED, args.workers)
                holdouts = [truncate_holdout(rows, f, args.tl_starts, TL_SEED, args.workers) for f in families]
                out["truncate_law"] = {**tl, "holdout": holdouts}
                if tl["converged"]:
                    rho = {}
                    for row in rows:
                        rho.setdefault(int(row["r"]), []).append(row["n_rec"] / row["n_params"])
                    rho = {T: float(np.median(v)) for T, v in rho.items()}
                    table, published = chi_table(tl, rho, sorted(rho)), False
            elif args.chi_table:
                table = chi_table(TL_PUBLISHED, args.rho)
            report_truncate(tl, holdouts, table, published)
            out["chi_table"] = table
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            with open(args.json, "w") as fh:
                json.dump(out, fh, indent=1, default=float)
            print(f"\nwrote {args.json}")
        if args.plots and res is not None:
            names = make_plots(res, rows, args.plots)
            print(f"wrote {', '.join(names)} to {args.plots}")
    except ValueError as err:
        sys.exit(f"{prog}: {err}")


if __name__ == "__main__":
    main()
