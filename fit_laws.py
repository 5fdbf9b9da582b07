"""
Scaling-law fits for the iso-depth looped-transformer sweep (paper §4.2–4.3, App. E, G): a Chinchilla law per
architecture, the joint law with the recurrence-equivalence exponent phi and its block-bootstrap CI,
the compute-optimal frontier per r, delta-phi between two sweeps, the looped/non-looped equivalence
calculator. (The truncate-or-not law, an extension, is dev/truncate_law.py.)

    python fit_laws.py runs/results.jsonl --json fit.json --plots out/fit   # report on stdout
    python fit_laws.py base.jsonl --compare truncated.jsonl          # delta-phi with a bootstrap CI
    python fit_laws.py --equiv 4 32 --phi 0.46                       # what is a looped model worth?

Input: train.py's results file, one JSON object per run. Unfinished, diverged and duplicate rows are
dropped with one line each on stderr. Runs are grouped into architectures by (r, r_bwd, injection);
counts and FLOPs come from flops.py. Without a sweep: python dev/synthetic_sweep.py synth.jsonl writes
the paper's grid with losses from a known law; dev/epoch_chinchilla.py refits Epoch's Chinchilla runs.
"""
import argparse
import json
import math
import os
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import fields
from pathlib import Path

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
SAME_RUN = CONFIG_FIELDS + ("flops_budget", "tokens", "seed", "lrs")  # one run, for rows without run_id
DEFAULT_CATEGORIES = Path(__file__).resolve().parent / "data" / "eval" / "categories.json"


# ----------------------------------------------------------------------------------------------
# Loading runs

def load_results(path):
    """The rows of a train.py results file, one JSON object per line. A line that is not one (a torn last
    line, garbage) becomes {"unreadable": why}, which drop_unusable drops with a note, as every other row a
    fit must not see. ValueError: no such file, or no lines at all."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: unreadable ({err})") from None
    rows = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            row = {"unreadable": f"line {lineno} is not JSON ({err.msg})"}
        if not isinstance(row, dict):
            row = {"unreadable": f"line {lineno} is not a JSON object"}
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no runs")
    return rows


def _finite(value):
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def drop_unusable(rows):
    """Drop rows a fit must not see (each one moves phi): unfinished runs (`finished` false; null or
    non-finite val_loss, train_loss or tokens_per_s), diverged runs (val_loss > ln(vocab) + 1, worse than
    uniform), repeats of a kept run (same run_id; else same config, budget, tokens, seed and LRs).
    Returns (kept rows, one note per dropped row)."""
    kept, seen, notes = [], {}, []
    for i, row in enumerate(rows, 1):
        unfinished = [k for k in ("val_loss", "train_loss", "tokens_per_s") if k in row and not _finite(row[k])]
        uniform = math.log(float(row["vocab_size"])) if _finite(row.get("vocab_size")) else math.inf
        key = row.get("run_id") or (json.dumps([row.get(k) for k in SAME_RUN]) if "scale" in row else None)
        if "unreadable" in row:
            notes.append(f"run {i}: dropped, {row['unreadable']}")
        elif row.get("finished") is False or unfinished:
            why = f"{unfinished[0]} is {row[unfinished[0]]}" if unfinished else "finished is false"
            notes.append(f"run {i}: dropped, not a finished run ({why})")
        elif float(row.get("val_loss", 0)) > uniform + 1:
            notes.append(f"run {i}: dropped, diverged (val_loss {float(row['val_loss']):.3f} > ln(vocab_size) + 1 "
                         f"= {uniform + 1:.3f})")
        elif key is not None and key in seen:
            notes.append(f"run {i}: dropped, a duplicate of run {seen[key]} "
                         f"({'same run_id' if row.get('run_id') else 'same configuration, budget, seed and LRs'})")
        else:
            seen.setdefault(key, i)
            kept.append(row)
    return kept, notes


# What the runs of one fit (and two compared sweeps) must share: a law pooled over another vocabulary,
# context length, effective depth, dataset or validation set mixes losses that are not comparable.
SWEEP_SETTINGS = ("vocab_size", "seq_len", "depth", "data", "eval_rows")


def sweep_setting(row, key):
    """A row's value of one SWEEP_SETTINGS key ("data": the run identity's dataset checksums), None if unknown."""
    if key == "data":
        data = (row.get("identity") or {}).get("data")
        return None if data is None else json.dumps(data, sort_keys=True)
    return row.get(key)


def mixed_settings(rows):
    """The SWEEP_SETTINGS on which rows disagree, as 'key (a vs b)' strings (empty: all comparable). A row
    that does not record a setting (rows older than run identities, synthetic rows) agrees with any."""
    mixed = []
    for key in SWEEP_SETTINGS:
        values = sorted({str(sweep_setting(row, key)) for row in rows if sweep_setting(row, key) is not None})
        if len(values) > 1:
            shown = " vs ".join(value[:40] for value in values[:3])
            mixed.append(f"{key} ({shown})")
    return mixed


def with_metric(rows, metric, eval_rows, categories):
    """Copies of the training rows whose val_loss is a downstream loss instead (App. I.1): a category's
    mean task loss (category_losses) or one task's loss, at the run's own trained r, joined by run_id.
    Returns (rows, one note per training row that has no such evaluation)."""
    if metric in categories:
        per_run = {key: cats[metric] for key, cats in category_losses(eval_rows, categories).items() if metric in cats}
    else:
        per_run = {(row["run_id"], int(row["r"])): float(row["loss"]) for row in eval_rows if row["task"] == metric}
    if not per_run:
        raise ValueError(f"--metric {metric}: no evaluation rows for it (a category needs every one of its tasks: "
                         f"{', '.join(categories.get(metric, [])) or 'not a category, nor a task in the rows'})")
    kept, notes = [], []
    for i, row in enumerate(rows, 1):
        value = per_run.get((row.get("run_id"), int(row.get("r") or 1)))
        if value is None:
            notes.append(f"run {i}: dropped, no {metric} evaluation at its trained r = {row.get('r')}")
        else:
            kept.append(dict(row, val_loss=value, metric=metric, validation_loss=row.get("val_loss")))
    return kept, notes


def read_categories(path):
    """{category: [task labels]} from a categories file (data/eval/categories.json's shape); ValueError if bad."""
    try:
        categories = json.loads(Path(path).read_text())["categories"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a categories file with a 'categories' map ({err!r})") from None
    if not isinstance(categories, dict) or not all(isinstance(v, list) for v in categories.values()):
        raise ValueError(f"{path}: 'categories' must map each category to a list of task labels")
    return categories


def _config_from_row(row, scale=None):
    """The flops.ModelConfig of a row (optionally at another width); None if it lacks fields or flops.py objects."""
    if row.get("r") in (None, "") or row.get("scale") in (None, ""):
        return None
    kw = {f.name: f.type(row[f.name]) if f.type in (int, float) else row[f.name]  # JSON or CSV values
          for f in fields(flops.ModelConfig) if row.get(f.name) not in (None, "")}
    kw["scale"] = float(kw["scale"] if scale is None else scale)  # fractional widths on the CPU grid
    kw["random_state_init"] = str(kw.get("random_state_init")).lower() in ("1", "true", "1.0")
    if kw["r"] == 1 and kw.get("injection", "none") == "none":
        # train.py's r = 1 rows store the resolved plain stack; let ModelConfig resolve it from depth
        # alone. A looped layout run once (truncate-or-not's (T, B) = (1, 1)) keeps its layout.
        for k in ("prelude", "coda", "recur", "injection", "r_bwd"):
            kw.pop(k, None)
    try:
        return flops.ModelConfig(**kw)
    except (TypeError, ValueError):
        return None


def prepare_rows(rows, source="runs"):
    """Canonical copies of train.py rows: int r, r_bwd, the injection, and finite positive n_params, n_once,
    n_rec, tokens, flops_budget, val_loss (N_once, N_rec may be 0). ValueError names the first run lacking one."""
    out = []
    for i, raw in enumerate(rows, 1):
        row = dict(raw, r=int(raw.get("r") or 1))
        row["r_bwd"] = int(row.get("r_bwd") or row["r"])
        row["injection"] = "none" if row["r"] == 1 else (row.get("injection") or "linear")
        for k in ("val_loss", "n_params", "n_once", "n_rec", "tokens", "flops_budget"):
            if not _finite(row.get(k)) or float(row[k]) < 0 or (float(row[k]) == 0 and k not in ("n_once", "n_rec")):
                what = "lack" if row.get(k) is None else "have a NaN, infinite or non-positive"
                raise ValueError(f"{source}: runs {what} {k} (first: run {i})")
            row[k] = float(row[k])
        out.append(row)
    return out


def arch_key(row):
    """Architecture of a run: (r, r_bwd, injection)."""
    return (int(row["r"]), int(row["r_bwd"]), str(row["injection"]))


def arch_label(key):
    return f"r={key[0]}" if key[0] == 1 else f"r={key[0]} bwd={key[1]} {key[2]}"


def by_arch(rows):
    groups = {}
    for row in rows:
        groups.setdefault(arch_key(row), []).append(row)
    return dict(sorted(groups.items()))


def budget_levels(budgets, rtol=0.02):
    """Each run's budget level, budgets within 2% merged (batch rounding), and each level's median, ascending."""
    budgets = np.asarray(budgets, dtype=float)
    level, groups = np.empty(len(budgets), dtype=int), []
    for i in np.argsort(budgets):
        if not groups or budgets[i] > budgets[groups[-1][0]] * (1 + rtol):
            groups.append([])
        groups[-1].append(i)
        level[i] = len(groups) - 1
    return level, np.array([float(np.median(budgets[g])) for g in groups])


def category_losses(eval_rows, categories):
    """The paper's category loss (App. I.1): the unweighted mean of its tasks' gold-continuation losses,
    per (run_id, r) of evaluate.py's rows. `categories` maps a category to its task labels; a run counts
    for a category only if it has a row for every one of them. Returns {(run_id, r): {category: loss}}."""
    task_loss = {}
    for row in eval_rows:
        task_loss.setdefault((row["run_id"], int(row["r"])), {})[row["task"]] = float(row["loss"])
    out = {}
    for key, losses in task_loss.items():
        for category, tasks in categories.items():
            if tasks and all(task in losses for task in tasks):
                out.setdefault(key, {})[category] = sum(losses[task] for task in tasks) / len(tasks)
    return out


# ----------------------------------------------------------------------------------------------
# The Huber-on-log Chinchilla objective (paper Eq. 4) with its analytic gradient

def _problem(n_once, n_rec, r, D, L, phi=None, weights=None, delta=HUBER_DELTA):
    """The data of one fit as plain arrays (picklable for worker processes). phi=None fits phi; a
    per-architecture law is the joint law with N_rec = 0 and phi fixed."""
    prob = {"n_once": np.asarray(n_once, float), "n_rec": np.asarray(n_rec, float),
            "logr": np.log(np.asarray(r, float)), "logD": np.log(np.asarray(D, float)),
            "logL": np.log(np.asarray(L, float)), "delta": float(delta),
            "w": np.ones(len(L)) if weights is None else np.asarray(weights, float),
            "phi_free": phi is None, "phi": 0.0 if phi is None else float(phi)}
    prob["lo"], prob["hi"] = BOX_LO[:5 + prob["phi_free"]], BOX_HI[:5 + prob["phi_free"]]
    return prob


def _objective(theta, prob):
    """Summed Huber loss of log L - log L_hat and its gradient, log L_hat = LSE(a - alpha x,
    b - beta y, e) with x = log(N_once + r^phi N_rec), y = log D. The LSE is written out: the gradient needs
    its softmax weights, and a scipy.special.logsumexp call costs 13x as much (322 vs 24 us on 116 runs)."""
    a, b, e, alpha, beta = theta[:5]
    rphi = np.exp((theta[5] if prob["phi_free"] else prob["phi"]) * prob["logr"])
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
    a, b, e, alpha, beta = theta[:5]
    x = np.log(prob["n_once"] + np.exp((theta[5] if prob["phi_free"] else prob["phi"]) * prob["logr"]) * prob["n_rec"])
    return logsumexp([a - alpha * x, b - beta * prob["logD"], np.full_like(x, e)], axis=0)


# ----------------------------------------------------------------------------------------------
# Multi-start L-BFGS-B, spread over processes

def _lbfgs(prob, x0):
    """One L-BFGS-B run from x0: (objective, theta, converged, message)."""
    res = minimize(_objective, x0, args=(prob,), jac=True, method="L-BFGS-B", bounds=list(zip(prob["lo"], prob["hi"])),
                   options=LBFGS_OPTIONS)
    msg = res.message if isinstance(res.message, str) else res.message.decode()
    # A line-search stall at machine precision is a converged point, not a failure, when the
    # projected gradient is negligible against the Huber slope (delta per run).
    pg = np.where(((res.x <= prob["lo"]) & (res.jac > 0)) | ((res.x >= prob["hi"]) & (res.jac < 0)), 0.0, res.jac)
    ok = res.success or (msg.startswith("ABNORMAL") and np.abs(pg).max() < 1e-7 * prob["delta"] * prob["w"].sum())
    return float(res.fun), res.x, bool(ok) and res.nit < LBFGS_OPTIONS["maxiter"], msg


def _solve_each(task):
    solve, data, starts = task
    return [solve(data, x0) for x0 in starts]


def pmap(fn, tasks, workers):
    """map() over `workers` processes (fork keeps it cheap), in order, contiguous chunks per process."""
    if workers <= 1 or len(tasks) <= 1:
        return [fn(t) for t in tasks]
    with ProcessPoolExecutor(max_workers=min(workers, len(tasks))) as ex:
        return list(ex.map(fn, tasks, chunksize=-(-len(tasks) // workers)))


def multistart(solve, data, starts, workers=1):
    """solve(data, x0) from every start, returned in start order however they are split over workers."""
    chunks = [c for c in np.array_split(np.asarray(starts), max(1, min(workers, len(starts)))) if len(c)]
    return [run for part in pmap(_solve_each, [(solve, data, c) for c in chunks], workers) for run in part]


def _starts(prob, restarts, rng, x0=None):
    """x0 (none, one point or several) first, then `restarts` uniform random points in the box."""
    starts = rng.uniform(prob["lo"], prob["hi"], size=(restarts, len(prob["lo"])))
    return starts if x0 is None else np.vstack([np.atleast_2d(np.asarray(x0, float))[:, :len(prob["lo"])], starts])


def _fit(prob, starts, workers):
    """Best of the L-BFGS-B runs (ties to the earlier start) and its fit statistics."""
    runs = multistart(_lbfgs, prob, starts, workers)
    funs = np.array([run[0] for run in runs])
    fun, theta, ok, msg = runs[int(np.argmin(funs))]
    # The distinct local optima, best first: bootstrap refits start from these (a resample's
    # optimum is almost always next to one of the full-data basins).
    optima = []
    for j in np.argsort(funs, kind="stable"):
        if len(optima) < N_LOCAL_OPTIMA and all(abs(funs[j] - f) > HIT_RTOL * f for f, _ in optima):
            optima.append((funs[j], [float(v) for v in runs[j][1]]))
    L = np.exp(prob["logL"])
    resid = L - np.exp(predict_log(theta, prob))  # actual - predicted, in nats (paper Table 8)
    out = {"a": theta[0], "b": theta[1], "e": theta[2], "alpha": theta[3], "beta": theta[4],
           "A": math.exp(theta[0]), "B": math.exp(theta[1]), "E": math.exp(theta[2])}
    if prob["phi_free"] or prob["n_rec"].any():
        out["phi"] = theta[5] if prob["phi_free"] else prob["phi"]
    return {**{k: float(v) for k, v in out.items()}, "objective": fun, "rmse": float(np.sqrt(np.mean(resid ** 2))),
            "r2": 1.0 - float(resid @ resid / np.sum((L - L.mean()) ** 2)),
            "max_abs_resid": float(np.abs(resid).max()), "converged": ok, "message": msg,
            "hits": int(np.sum(funs <= fun * (1 + HIT_RTOL) + 1e-15)), "restarts": len(runs), "n_runs": len(L),
            "theta": [float(v) for v in theta], "local_optima": [x for _, x in optima]}


# ----------------------------------------------------------------------------------------------
# The laws: per architecture (Chinchilla) and joint over r with phi (iso-depth §3.2, §4.2-4.3)

def _check_arrays(N, D, L, C, n_params, what):
    N, D, L = (np.asarray(v, dtype=float).ravel() for v in (N, D, L))
    if not len(N) == len(D) == len(L):
        raise ValueError(f"{what}: N, D and L have different lengths ({len(N)}, {len(D)}, {len(L)})")
    for name, v in (("N", N), ("D", D), ("L", L)):
        if (bad := ~np.isfinite(v) | (v <= 0)).any():
            raise ValueError(f"{what}: {int(bad.sum())} runs have a NaN, infinite or non-positive {name} "
                             f"(first: run {int(np.argmax(bad)) + 1})")
    if len(L) < n_params + 1:
        raise ValueError(f"{what}: {len(L)} runs are too few for a {n_params}-parameter law (need {n_params + 1})")
    one_budget = abs(np.corrcoef(np.log(N), np.log(D))[0, 1]) > 1 - 1e-9 if C is None else len(budget_levels(C)[1]) < 2
    if one_budget:
        raise ValueError(f"{what}: all runs share one compute budget; the law needs at least two")
    return N, D, L


def fit_chinchilla(N, D, L, restarts=500, seed=0, workers=1, C=None, delta=HUBER_DELTA, weights=None, x0=None):
    """Per-architecture law L = E + A N^-alpha + B D^-beta, best of `restarts` random L-BFGS-B starts (and `x0`):
    a dict with A, B, E, alpha, beta, a, b, e, objective, r2, rmse, max_abs_resid, converged, hits, restarts."""
    N, D, L = _check_arrays(N, D, L, C, 5, "fit_chinchilla")
    prob = _problem(N, np.zeros_like(N), np.ones_like(N), D, L, phi=0.0, weights=weights, delta=delta)
    return _fit(prob, _starts(prob, restarts, np.random.default_rng(seed), x0), workers)


def _joint_arrays(rows):
    try:
        return {k: np.array([float(row[k]) for row in rows])
                for k in ("r", "n_once", "n_rec", "tokens", "val_loss", "flops_budget")}
    except KeyError as err:
        raise ValueError(f"fit_joint: runs lack {err.args[0]}") from None


def fit_joint(rows, restarts=500, seed=0, phi=None, workers=1, delta=HUBER_DELTA, weights=None, x0=None):
    """Joint law L = E + A (N_once + r^phi N_rec)^-alpha + B D^-beta over all r with one shared (A, alpha, B,
    beta, E, phi); `phi` fixed gives the restricted fit. Same return as fit_chinchilla plus phi."""
    c = _joint_arrays(rows)
    _check_arrays(c["n_once"] + c["n_rec"], c["tokens"], c["val_loss"], c["flops_budget"], 6 - (phi is not None),
                  "fit_joint")
    if phi is None and len(set(c["r"])) < 2:
        raise ValueError(f"fit_joint: phi needs runs at two or more loop counts r (got only r = {int(c['r'][0])})")
    prob = _problem(c["n_once"], c["n_rec"], c["r"], c["tokens"], c["val_loss"], phi, weights, delta)
    return {"phi": phi, **_fit(prob, _starts(prob, restarts, np.random.default_rng(seed), x0), workers)}


def law_loss(fit, n_once, n_rec, r, D):
    """Loss of a fitted joint (or per-architecture: n_rec = 0) law at the given counts."""
    neff = np.asarray(n_once, float) + np.asarray(r, float) ** (fit.get("phi") or 0.0) * np.asarray(n_rec, float)
    return fit["E"] + fit["A"] * neff ** -fit["alpha"] + fit["B"] * np.asarray(D, float) ** -fit["beta"]


def residuals_by_r(fit, rows):
    """Joint-fit residuals (actual - predicted, nats) per loop count: runs, RMSE, mean, max |.|."""
    c = _joint_arrays(rows)
    resid = c["val_loss"] - law_loss(fit, c["n_once"], c["n_rec"], c["r"], c["tokens"])
    return [{"r": r, "runs": int(m.sum()), "rmse": float(np.sqrt(np.mean(resid[m] ** 2))),
             "mean": float(resid[m].mean()), "max_abs": float(np.abs(resid[m]).max())}
            for r in sorted(set(c["r"].astype(int))) for m in [c["r"] == r]]


def budget_halves(rows):
    """Rows and budgets of the lower and upper half of the budgets (paper G.3: C <= 2.15e18, C >= 4.64e18)."""
    level, reps = budget_levels([row["flops_budget"] for row in rows])
    cut = len(reps) // 2
    return (([row for row, lv in zip(rows, level) if lv < cut], reps[:cut]),
            ([row for row, lv in zip(rows, level) if lv >= cut], reps[cut:]))


# ----------------------------------------------------------------------------------------------
# Block bootstrap over (budget, r) cells (paper App. G.2) and delta-phi

def bootstrap_cells(rows):
    """Block structure of the bootstrap: each run's (budget, r) cell index and each cell's r."""
    cells = list(zip(budget_levels([row["flops_budget"] for row in rows])[0].tolist(), [int(row["r"]) for row in rows]))
    keys = sorted(set(cells))
    return np.array([keys.index(cell) for cell in cells]), np.array([r for _, r in keys])


def resample_weights(seed, i, cell_of_run, r_of_cell):
    """Run weights of resample i: cells drawn with replacement from its own RNG stream (independent of the
    worker split), each run counted as often as its cell. Returns (weights, rng for the refit's starts)."""
    rng = np.random.default_rng([seed, 7919, i])
    while True:
        counts = np.bincount(rng.integers(0, len(r_of_cell), len(r_of_cell)), minlength=len(r_of_cell))
        if len(set(r_of_cell[counts > 0].tolist())) >= 2:  # phi needs two loop counts: redraw (rare)
            return counts[cell_of_run].astype(float), rng


def bootstrap_joint(rows, fit, resamples=200, restarts=16, seed=0, workers=1, delta=HUBER_DELTA):
    """95% percentile CIs of the joint-law parameters from a block bootstrap over (budget, r) cells. Each
    refit starts from the full fit's distinct local optima plus `restarts` random starts instead of 500
    random starts: checked to land on the 500-restart optimum in tests/test_fit_laws.py, dev/bench_fit.py."""
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
    refits = [min(runs, key=lambda run: run[0]) for runs in pmap(_solve_each, tasks, workers)]
    ok = np.array([run[2] for run in refits])
    good = np.array([run[1] for run in refits]).reshape(-1, 6)[ok]
    draws = {"phi": good[:, 5], "alpha": good[:, 3], "beta": good[:, 4], "A": np.exp(good[:, 0]),
             "B": np.exp(good[:, 1]), "E": np.exp(good[:, 2])}
    return {"resamples": resamples, "restarts": restarts, "cells": len(r_of_cell), "not_converged": int((~ok).sum()),
            "draws": {k: v.tolist() for k, v in draws.items()},
            **{k + "_ci": [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))] if len(v) else None
               for k, v in draws.items()},
            "frac_phi_le_0": float(np.mean(draws["phi"] <= 0)) if ok.any() else math.nan,
            "frac_phi_ge_1": float(np.mean(draws["phi"] >= 1)) if ok.any() else math.nan}


def compare_phi(boot_a, boot_b, fit_a, fit_b):
    """delta-phi = phi_b - phi_a, CI from the differences of the two bootstraps' draws in resample order:
    conservative (wider) where the sweeps share r = 1 runs, as the paper's case studies do."""
    n = min(len(boot_a["draws"]["phi"]), len(boot_b["draws"]["phi"]))
    diff = np.array(boot_b["draws"]["phi"][:n]) - np.array(boot_a["draws"]["phi"][:n])
    ci = [float(np.percentile(diff, 2.5)), float(np.percentile(diff, 97.5))]
    return {"phi_a": fit_a["phi"], "phi_b": fit_b["phi"], "delta_phi": fit_b["phi"] - fit_a["phi"],
            "delta_phi_ci": ci, "excludes_zero": bool(ci[0] > 0 or ci[1] < 0), "pairs": n}


# ----------------------------------------------------------------------------------------------
# Compute-optimal frontier (iso-depth §4.2) along each architecture's width family

def width_family(row, max_scale=None):
    """`row`'s architecture at every width d = head_dim * k up to `max_scale`: arrays scale, N, n_once, n_rec,
    F (FLOPs per token) from flops.py; None if flops.py cannot rebuild the row's model and its n_params."""
    cfg = _config_from_row(row)
    if cfg is None or abs(flops.param_counts(cfg)["n_params"] - float(row["n_params"])) > 0.5:
        return None
    fam = {k: [] for k in ("scale", "N", "n_once", "n_rec", "F")}
    for d in range(cfg.head_dim, int(64 * (max_scale or 8 * cfg.scale)) + 1, cfg.head_dim):
        if (c := _config_from_row(row, scale=d / 64)) is not None:  # None e.g. for odd s with head dim 128
            n = flops.param_counts(c)
            for k, v in zip(fam, (d / 64, n["n_params"], n["n_once"], n["n_rec"], flops.flops_per_token(c))):
                fam[k].append(v)
    fam = {k: np.array(v, dtype=float) for k, v in fam.items()}
    return {**fam, "source": "flops.py"} if len(fam["N"]) >= 4 else None


def family_for_group(rows):
    """Width family of a group of runs: flops.py's, for their most common layout (None if it cannot)."""
    layouts = {}
    for row in rows:
        layouts.setdefault(tuple(str(row.get(k)) for k in CONFIG_FIELDS if k != "scale"), []).append(row)
    max_scale = 8 * max(float(row.get("scale") or 0) for row in rows)
    return width_family(max(layouts.values(), key=len)[0], max_scale or None)


def frontier_point(fit, fam, C, r=1, joint=False):
    """Compute-optimal allocation at budget C: minimise L(N, C / F(N)) over the width family, interpolated
    monotonically (PCHIP) in log N. Returns N*, D*, L*, the width s* and whether N* is at the family's edge."""
    logN = np.log(fam["N"])
    logF = PchipInterpolator(logN, np.log(fam["F"]))
    logNeff = PchipInterpolator(logN, np.log(fam["n_once"] + r ** fit["phi"] * fam["n_rec"] if joint else fam["N"]))

    def loss(lx):
        D = C / np.exp(logF(lx))
        return fit["E"] + fit["A"] * np.exp(-fit["alpha"] * logNeff(lx)) + fit["B"] * D ** -fit["beta"]

    grid = np.linspace(logN[0], logN[-1], 4001)
    vals = loss(grid)
    i = int(np.argmin(vals))
    best = minimize_scalar(loss, bounds=(grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]), method="bounded",
                           options={"xatol": 1e-10})
    lx = best.x if best.fun <= vals[i] else grid[i]
    return {"N_star": float(np.exp(lx)), "D_star": float(C / np.exp(logF(lx))), "L_star": float(loss(lx)),
            "scale_star": float(PchipInterpolator(logN, fam["scale"])(lx)), "at_edge": i in (0, len(grid) - 1)}


def compute_frontier(rows, per_arch, joint_fit, budgets):
    """Frontier per architecture and budget from its own law and the joint law, with the gap to r = 1."""
    out = []
    for key, grp in by_arch(rows).items():
        fam = family_for_group(grp)
        for law, fit in (("per_arch", per_arch.get(key)), ("joint", joint_fit)):
            if fam is not None and fit is not None and fit["converged"]:
                out += [{"law": law, "r": key[0], "r_bwd": key[1], "injection": key[2], "budget": float(C),
                         **frontier_point(fit, fam, C, key[0], law == "joint")} for C in budgets]
    base = {(p["law"], p["budget"]): p["L_star"] for p in out if p["r"] == 1}
    for p in out:
        p["gap_to_r1"] = p["L_star"] - base[p["law"], p["budget"]] if (p["law"], p["budget"]) in base else None
    return out


# ----------------------------------------------------------------------------------------------
# Equivalence calculator (iso-depth §1, App. G.5)

def equivalence(r, scale, phi, layout=None):
    """A looped model (r, s), its N and N_eff(phi), against the r = 1 models of its effective depth with the same
    loss (N = N_eff at the same D, paper Eq. 3) and with the same training FLOPs per token (about the same s)."""
    kw = {k: v for k, v in (layout or {}).items()
          if k in ("injection", "hc_lanes", "depth", "prelude", "coda", "head_dim", "vocab_size", "seq_len")}
    looped = flops.ModelConfig(r=int(r), scale=int(scale), **kw)
    counts, F = flops.param_counts(looped), flops.flops_per_token(looped)
    n_eff = flops.effective_params(counts["n_once"], counts["n_rec"], looped.r, phi)
    row = {"r": 1, "scale": int(scale), "depth": looped.depth}
    row.update({k: kw[k] for k in ("head_dim", "vocab_size", "seq_len") if k in kw})
    same_width = _config_from_row(row)
    row["n_params"] = flops.param_counts(same_width)["n_params"]
    fam = width_family(row, max_scale=max(8 * int(scale), 64))

    def solve(key, target):  # the r = 1 model at which fam[key] = target, interpolated in log space
        xs, x = np.log(fam[key]), math.log(target)
        if not xs[0] <= x <= xs[-1]:
            raise ValueError(f"equivalence: {key} = {target:.4g} lies outside the width family")
        return {"N": float(np.exp(PchipInterpolator(xs, np.log(fam["N"]))(x))),
                "scale": float(PchipInterpolator(xs, fam["scale"])(x)),
                "flops_per_token": float(np.exp(PchipInterpolator(xs, np.log(fam["F"]))(x)))}

    return {"r": looped.r, "scale": looped.scale, "phi": phi, "N": counts["n_params"], "n_once": counts["n_once"],
            "n_rec": counts["n_rec"], "n_eff": n_eff, "flops_per_token": F, "same_loss": solve("N", n_eff),
            "same_flops": solve("F", F), "same_width": {"N": row["n_params"], "scale": looped.scale,
                                                        "flops_per_token": flops.flops_per_token(same_width)}}


# ----------------------------------------------------------------------------------------------
# The analysis of one sweep, and its report

def analyse(rows, restarts=500, boot=200, boot_restarts=16, seed=0, workers=1, delta=HUBER_DELTA):
    """Per-architecture fits, joint fit, restricted fits at phi = 0 and 1, residuals by r, budget halves,
    bootstrap and frontier for one sweep (§4.2–4.3). A dict; per_arch is keyed by arch_key."""
    groups, budgets = by_arch(rows), budget_levels([row["flops_budget"] for row in rows])[1]
    if len(budgets) < 2:
        raise ValueError("all runs share one compute budget; the laws need at least two")
    res = {"n_runs": len(rows), "groups": {arch_label(k): len(v) for k, v in groups.items()},
           "budgets": budgets.tolist(), "per_arch": {}, "notes": [], "joint": None, "restricted": {}, "halves": {}}
    for key, grp in groups.items():
        try:
            N, D, L, C = ([row[k] for row in grp] for k in ("n_params", "tokens", "val_loss", "flops_budget"))
            res["per_arch"][key] = fit_chinchilla(N, D, L, restarts, seed, workers, C, delta)
        except ValueError as err:
            res["notes"].append(f"{arch_label(key)}: no per-architecture fit ({err})")
    mixed = [arch_label(key) for key in groups if sum(k[0] == key[0] for k in groups) > 1]
    if len({key[0] for key in groups}) < 2:
        res["notes"].append("joint law skipped: it needs runs at two or more loop counts r")
    elif mixed:
        raise ValueError(f"joint law needs one architecture per r, not {', '.join(mixed)}: fit each grid on its own")
    else:
        joint = res["joint"] = fit_joint(rows, restarts, seed, None, workers, delta)
        res["restricted"] = {f"phi={phi:g}": fit_joint(rows, restarts, seed, phi, workers, delta) for phi in (0.0, 1.0)}
        res["residuals_by_r"] = residuals_by_r(joint, rows) if joint["converged"] else []
        for name, (part, part_budgets) in zip(("low", "high"), budget_halves(rows)):
            try:
                res["halves"][name] = {**fit_joint(part, restarts, seed, None, workers, delta),
                                       "budgets": part_budgets.tolist()}
            except ValueError as err:
                res["notes"].append(f"{name}-budget half: no refit ({err})")
        if boot and joint["converged"]:
            res["bootstrap"] = bootstrap_joint(rows, joint, boot, boot_restarts, seed, workers, delta)
    if not res["per_arch"] and res["joint"] is None:
        raise ValueError("nothing to fit: " + "; ".join(res["notes"]))
    res["frontier"] = compute_frontier(rows, res["per_arch"], res["joint"], budgets)
    return res


def _fmt_fit(fit, phi=True):
    if not fit["converged"]:
        return f"NOT CONVERGED ({fit['message']}); best objective {fit['objective']:.6g}"
    return (f"phi {fit['phi']:.4f}  " if phi and fit.get("phi") is not None else "") + (
        f"E {fit['E']:.4f}  A {fit['A']:.4g}  alpha {fit['alpha']:.4f}  B {fit['B']:.4g}  beta {fit['beta']:.4f}  "
        f"R2 {fit['r2']:.5f}  RMSE {fit['rmse']:.4f}")


def _si(x):
    """15.7k, 98.3M, 3.81B: counts from CPU-scale to paper-scale grids."""
    div, unit = next(((d, u) for d, u in ((1e9, "B"), (1e6, "M"), (1e3, "k")) if abs(x) >= d), (1, ""))
    return f"{x / div:.3g}{unit}"


def report(res, title, p=print):
    b, joint, boot = res["budgets"], res["joint"], res.get("bootstrap") or {}
    p(f"== {title}: {res['n_runs']} runs, {len(res['groups'])} architectures, {len(b)} budgets "
      f"({b[0]:.3g} .. {b[-1]:.3g} FLOPs)" + "".join(f"\n   note: {note}" for note in res["notes"]))
    p("\nPer-architecture Chinchilla fits  L = E + A N^-alpha + B D^-beta  (Huber on log L, best of the restarts; "
      "hits = restarts reaching the optimum)")
    for key, fit in res["per_arch"].items():
        p(f"  {arch_label(key):<18} {fit['n_runs']:>4} runs  {_fmt_fit(fit)}  hits {fit['hits']}/{fit['restarts']}")
    if joint is not None:
        p("\nJoint law  L = E + A (N_once + r^phi N_rec)^-alpha + B D^-beta  (one law for every r)")
    if joint is not None and joint["converged"]:
        ci = {k: f" [{boot[k + '_ci'][0]:{f}}, {boot[k + '_ci'][1]:{f}}]" if boot.get(k + "_ci") else ""
              for k, f in (("phi", ".4f"), ("E", ".4f"), ("A", ".4g"), ("alpha", ".4f"), ("B", ".4g"), ("beta", ".4f"))}
        p(f"  phi   = {joint['phi']:.4f}{ci['phi']}   (r^phi: "
          + ", ".join(f"{r}^phi = {r ** joint['phi']:.3f}" for r in (2, 4, 8)) + ")\n"
          f"  E     = {joint['E']:.4f}{ci['E']}\n  A     = {joint['A']:.4g}{ci['A']}   alpha = {joint['alpha']:.4f}"
          f"{ci['alpha']}\n  B     = {joint['B']:.4g}{ci['B']}   beta  = {joint['beta']:.4f}{ci['beta']}\n"
          f"  R2 {joint['r2']:.5f}  RMSE {joint['rmse']:.4f} nats  max |resid| {joint['max_abs_resid']:.4f}  "
          f"objective {joint['objective']:.6g}  hits {joint['hits']}/{joint['restarts']}")
        if min(abs(joint["phi"] - BOX_LO[5]), abs(joint["phi"] - BOX_HI[5])) < 1e-6:  # the box's answer, not the data's
            p(f"  !! phi sits on the edge of its box [{BOX_LO[5]:g}, {BOX_HI[5]:g}]: these runs do not identify phi "
              "(e.g. minima not bracketed, or looping adds nothing measurable)")
        if boot:
            p(f"  95% CIs: block bootstrap, {boot['resamples']} resamples of {boot['cells']} (budget, r) cells, each "
              f"refit from the full fit's local optima + {boot['restarts']} random starts; {boot['frac_phi_le_0']:.0%} "
              f"of resamples reach phi <= 0, {boot['frac_phi_ge_1']:.0%} phi >= 1; {boot['not_converged']} did not "
              "converge")
        p("\nRestricted fits (same data, phi held fixed)")
        for name, fit in [*res["restricted"].items(), ("free", joint)]:
            p(f"  {name:<8}" + _fmt_fit(fit, phi=False))
        p("\nJoint-fit residuals by r (actual - predicted, nats)\n    r  runs     RMSE     mean   max|.|")
        for t in res["residuals_by_r"]:
            p(f"  {t['r']:>3}{t['runs']:>6}{t['rmse']:>9.4f}{t['mean']:>+9.4f}{t['max_abs']:>9.4f}")
    elif joint is not None:
        p(f"  {_fmt_fit(joint)}")
    if res["halves"]:
        p("\nBudget halves (joint law refit on each half of the sorted budgets)")
    for name, fit in res["halves"].items():
        span = f"C in [{fit['budgets'][0]:.3g}, {fit['budgets'][-1]:.3g}]"
        p(f"  {name:<5} {span:<24}{fit['n_runs']:>4} runs  {_fmt_fit(fit)}")
    # One row per (budget, architecture): the per-architecture law's optimum (the paper's Figure 4) and,
    # last column, the gap the joint law predicts; --json keeps both in full.
    joint_gap = {(pt["budget"], arch_key(pt)): pt["gap_to_r1"] for pt in res["frontier"] if pt["law"] == "joint"}
    rows = [pt for pt in res["frontier"] if pt["law"] == "per_arch"] or res["frontier"]
    if rows:
        p(f"\nCompute-optimal frontier: min over width of L(N, C/F(N)) with the {rows[0]['law'].replace('_', '-')} "
          "law(s); F(N) from flops.py; gap = L* - L*(r=1) at the same budget\n"
          "     budget  architecture             N*     s*       D*  D*/N*      L*     gap joint gap")
    for pt in sorted(rows, key=lambda pt: (pt["budget"], arch_key(pt))):
        gaps = [pt["gap_to_r1"], joint_gap.get((pt["budget"], arch_key(pt)))]
        gaps = [f"{g:+.4f}" if g is not None and pt["r"] > 1 else "" for g in gaps]
        p(f"  {pt['budget']:>9.3g}  {arch_label(arch_key(pt)):<18}{_si(pt['N_star']):>9}{pt['scale_star']:>7.3g}"
          f"{_si(pt['D_star']):>9}{pt['D_star'] / pt['N_star']:>7.1f}{pt['L_star']:>8.4f}{gaps[0]:>8}{gaps[1]:>10}"
          f"{'  (at edge of width family)' * pt['at_edge']}".rstrip())


def report_delta_phi(res, other, name_a, name_b, p=print):
    """delta-phi = phi(b) - phi(a), with the bootstrap CI where both sweeps have one (§5: the diagnostic the paper proposes)."""
    if res["joint"] is None or other["joint"] is None:
        raise ValueError("--compare needs a joint-law fit of both sweeps")
    if res.get("bootstrap") and other.get("bootstrap"):
        d = compare_phi(res["bootstrap"], other["bootstrap"], res["joint"], other["joint"])
        lo, hi = d["delta_phi_ci"]
        ci = (f", 95% CI [{lo:+.4f}, {hi:+.4f}] ({'ex' if d['excludes_zero'] else 'in'}cludes 0; independent "
              "resamples, conservative when the sweeps share r = 1 runs)")
    else:
        d = {"delta_phi": other["joint"]["phi"] - res["joint"]["phi"], "delta_phi_ci": None}
        ci = " (no CI: --bootstrap 0, or a joint fit did not converge)"
    p(f"\nDelta-phi = phi({name_b}) - phi({name_a}) = {other['joint']['phi']:.4f} - {res['joint']['phi']:.4f} = "
      f"{d['delta_phi']:+.4f}{ci}")
    return d


def report_equivalence(eq, p=print):
    sl, sf = eq["same_loss"], eq["same_flops"]
    p(f"\nEquivalence at r = {eq['r']}, s = {eq['scale']} (d = {64 * eq['scale']}), phi = {eq['phi']:.4f}\n"
      f"  looped model   N = {_si(eq['N'])} (N_once {_si(eq['n_once'])} + N_rec {_si(eq['n_rec'])}), N_eff = "
      f"N_once + r^phi N_rec = {_si(eq['n_eff'])}, F = {eq['flops_per_token']:.4g} FLOPs/token\n"
      f"  same loss      non-looped N = {_si(sl['N'])} (s = {sl['scale']:.2f}, F = {sl['flops_per_token']:.4g})\n"
      f"  same FLOPs     non-looped N = {_si(sf['N'])} (s = {sf['scale']:.2f}; the same-width r = 1 model has "
      f"N = {_si(eq['same_width']['N'])})\n"
      f"  -> trains at the cost of a {_si(sf['N'])} non-looped model and reaches the loss of a {_si(sl['N'])} one")


MARKER_OF_R = {1: "o", 2: "s", 4: "^", 8: "D"}  # other loop counts: "v"


def plot_isoflop(plt, res, rows, level, budgets, colours, title):
    """One panel per architecture: its runs (colour = budget), its own law along the width family at
    D = C / F(N) for every budget, and the law's compute-optimal N* (stars); y limited to the runs."""
    from matplotlib.lines import Line2D
    groups = by_arch(rows)
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 4.4), sharey=True, squeeze=False)
    for ax, (key, grp) in zip(axes[0], groups.items()):
        marker = MARKER_OF_R.get(key[0], "v")
        levels = [lv for row, lv in zip(rows, level) if arch_key(row) == key]
        ax.scatter([row["n_params"] for row in grp], [row["val_loss"] for row in grp],
                   c=[colours[lv] for lv in levels], marker=marker, edgecolors="black", linewidths=0.4, zorder=3)
        fit, fam = res["per_arch"].get(key), family_for_group(grp)
        if fit is not None and fit["converged"] and fam is not None:
            N = np.geomspace(0.6 * min(row["n_params"] for row in grp), 1.6 * max(row["n_params"] for row in grp), 200)
            N = N[(N >= fam["N"][0]) & (N <= fam["N"][-1])]
            for j, C in enumerate(budgets):
                D = C / np.interp(N, fam["N"], fam["F"])
                ax.plot(N, law_loss(fit, N, 0, 1, D), color=colours[j], lw=1)
        stars = [pt for pt in res["frontier"] if pt["law"] == "per_arch" and arch_key(pt) == key]
        ax.scatter([pt["N_star"] for pt in stars], [pt["L_star"] for pt in stars], marker="*", s=110,
                   color="red", edgecolors="black", linewidths=0.4, zorder=4)
        ax.set(xscale="log", title=arch_label(key), xlabel="non-embedding parameters N")
    losses = [row["val_loss"] for row in rows]
    margin = 0.08 * (max(losses) - min(losses)) + 0.01
    axes[0][0].set_ylim(min(losses) - margin, max(losses) + margin)  # the curves rise far off the data
    axes[0][0].set_ylabel("validation loss (nats)")
    handles = [Line2D([], [], color=colours[j], lw=2, label=f"C = {C:.3g} FLOPs") for j, C in enumerate(budgets)]
    handles.append(Line2D([], [], ls="", marker="o", color="grey", label="runs (marker = r, colour = C)"))
    handles.append(Line2D([], [], ls="", marker="*", ms=11, color="red", label="law's compute-optimal N*"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.suptitle(f"{title}: validation loss at each budget; lines: each architecture's law at D = C / F(N)")
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    return fig


def plot_pred_vs_actual(plt, res, rows, level, budgets, colours, title):
    """Every run's loss against the joint law's prediction (else its architecture's law)."""
    from matplotlib.lines import Line2D
    fig, ax = plt.subplots(figsize=(5.6, 5.0))
    handles = []
    for key, grp in by_arch(rows).items():
        law = res["joint"] or res["per_arch"].get(key)
        if law is None or not law["converged"]:
            continue
        marker = MARKER_OF_R.get(key[0], "v")
        levels = [lv for row, lv in zip(rows, level) if arch_key(row) == key]
        if res["joint"]:
            predicted = [law_loss(law, row["n_once"], row["n_rec"], row["r"], row["tokens"]) for row in grp]
        else:
            predicted = [law_loss(law, row["n_params"], 0, 1, row["tokens"]) for row in grp]
        ax.scatter(predicted, [row["val_loss"] for row in grp], c=[colours[lv] for lv in levels], marker=marker,
                   edgecolors="black", linewidths=0.4)
        handles.append(Line2D([], [], ls="", marker=marker, color="grey", label=arch_label(key)))
    handles += [Line2D([], [], color=colours[j], lw=3, label=f"C = {C:.3g}") for j, C in enumerate(budgets)]
    lims = [min(row["val_loss"] for row in rows), max(row["val_loss"] for row in rows)]
    ax.plot(lims, lims, "k--", lw=0.8)
    law_name = "joint law" if res["joint"] else "per-architecture laws"
    ax.set(xlabel=f"predicted loss, {law_name} (nats)", ylabel="actual validation loss (nats)",
           title=f"{title}: {law_name}, predicted vs actual")
    ax.legend(handles=handles, fontsize=7, title="marker = architecture, colour = budget", title_fontsize=7)
    fig.tight_layout()
    return fig


def plot_frontier(plt, res, budgets, title):
    """L*, N*, D* of each architecture's compute-optimal point against the budget (per-architecture laws)."""
    from matplotlib.ticker import NullFormatter
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    keys = sorted({arch_key(pt) for pt in res["frontier"] if pt["law"] == "per_arch"})
    for key in keys:
        pts = [pt for pt in res["frontier"] if pt["law"] == "per_arch" and arch_key(pt) == key]
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


def make_plots(res, rows, outdir, title):
    """isoflop.png, pred_vs_actual.png and frontier.png in outdir; `title` names the grid."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    level, budgets = budget_levels([row["flops_budget"] for row in rows])
    colours = [plt.get_cmap("viridis")(j / max(1, len(budgets) - 1)) for j in range(len(budgets))]
    figures = {"isoflop.png": plot_isoflop(plt, res, rows, level, budgets, colours, title),
               "pred_vs_actual.png": plot_pred_vs_actual(plt, res, rows, level, budgets, colours, title),
               "frontier.png": plot_frontier(plt, res, budgets, title)}
    for name, fig in figures.items():
        fig.savefig(Path(outdir) / name, dpi=120)
    plt.close("all")
    return list(figures)


# ----------------------------------------------------------------------------------------------
# Command line

def _arg(convert, ok, what):
    """argparse type=: convert, then refuse values that are not `what` (e.g. --phi nan)."""
    def parse(text):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value
    return parse


def parse_args(argv=None):
    # usage=SUPPRESS: a bad flag is one line on stderr (and exit 2); --help shows the examples above.
    p = argparse.ArgumentParser(prog="fit_laws.py", description=__doc__, usage=argparse.SUPPRESS,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    at_least_1 = _arg(int, lambda v: v >= 1, "an integer >= 1")
    p.add_argument("results", nargs="?", help="train.py's results file (JSONL)")
    p.add_argument("--compare", metavar="FILE", help="second sweep: report delta-phi = phi(FILE) - phi(results)")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    p.add_argument("--plots", metavar="DIR", help="write isoflop.png, pred_vs_actual.png, frontier.png")
    p.add_argument("--only-r", metavar="LIST", help="keep only these r, e.g. 1,4,8",
                   type=_arg(lambda t: [int(x) for x in t.split(",") if x.strip()], bool, "loop counts like 1,4,8"))
    p.add_argument("--restarts", type=at_least_1, default=500, help="random L-BFGS-B restarts per fit (paper: 500)")
    p.add_argument("--bootstrap", type=_arg(int, lambda v: v == 0 or v >= 2, "0 (off) or at least 2"), default=200,
                   metavar="N", help="block-bootstrap resamples (paper: 200)")
    p.add_argument("--seed", type=int, default=0, help="seed of restarts and resamples (results are deterministic)")
    p.add_argument("--workers", type=at_least_1, default=os.cpu_count() or 1, help="processes for the fits")
    p.add_argument("--equiv", nargs=2, type=at_least_1, metavar=("R", "S"),
                   help="equivalence calculator for a looped model with r = R at width s = S")
    p.add_argument("--phi", type=_arg(float, math.isfinite, "a finite number"), help="phi for --equiv (else fitted)")
    p.add_argument("--allow-mixed", action="store_true",
                   help="fit or compare runs of another vocab, seq len, depth, dataset or eval rows all the same")
    g = p.add_argument_group("downstream loss instead of validation loss (App. I)")
    g.add_argument("--evals", metavar="FILE", help="evaluate.py's rows (joined to the runs by run_id)")
    g.add_argument("--metric", help="a category of --categories (e.g. reading_comp) or a task label")
    g.add_argument("--categories", metavar="FILE", default=str(DEFAULT_CATEGORIES),
                   help="the task -> category map (default data/eval/categories.json)")
    args = p.parse_args(argv)
    if bool(args.evals) != bool(args.metric):
        p.error("--evals and --metric go together")
    if (args.results is None and not args.equiv) or (args.compare and not args.results):
        p.error("give a results file (or --equiv R S --phi X)")
    if args.results is None and args.equiv and args.phi is None:
        p.error("--equiv without a results file needs --phi")
    return args


def check_writable(path, folder):
    """Refuse an output path before any compute: create the folder, write a scratch file."""
    where = Path(path) if folder else Path(path).parent
    try:
        where.mkdir(parents=True, exist_ok=True)
        if not folder and Path(path).is_dir():
            raise IsADirectoryError(21, "is a folder")
        tempfile.TemporaryFile(dir=where).close()
    except OSError as err:
        raise ValueError(f"cannot write {path}: {err.strerror or err}") from None


def load_sweep(path, only_r=None, allow_mixed=False, metric=None):
    """Fit-ready rows of one results file (unusable ones dropped, one stderr line each) and notes. `metric`:
    (name, evaluation rows, categories) to fit a downstream loss instead of the validation loss."""
    rows, dropped = drop_unusable(load_results(path))
    if metric is not None:
        rows, missing = with_metric(rows, *metric)
        dropped += missing
    for note in dropped:
        print(f"fit_laws.py: {path} {note}", file=sys.stderr)
    rows = [row for row in prepare_rows(rows, str(path)) if not only_r or row["r"] in only_r]
    if not rows:
        raise ValueError(f"{path}: no runs left to fit")
    mixed = mixed_settings(rows)
    if mixed and not allow_mixed:
        raise ValueError(f"{path}: its runs differ in {'; '.join(mixed)}: one law over them mixes losses that are "
                         f"not comparable (fit each sweep on its own, or pass --allow-mixed)")
    notes = []
    if dropped:
        notes.append(f"{len(dropped)} rows dropped, see stderr")
    if metric is not None:
        notes.append(f"the loss fitted is {metric[0]} (downstream, App. I), not the validation loss")
    return rows, notes


def json_ready(res):
    """The analysis for --json: architectures by label, CIs beside the joint fit, internals left out."""
    strip = lambda fit: {k: v for k, v in fit.items() if k != "local_optima"}  # noqa: E731
    boot = {k: v for k, v in (res.get("bootstrap") or {}).items() if k != "draws"}
    return {**res, "per_arch": {arch_label(k): strip(v) for k, v in res["per_arch"].items()}, "bootstrap": boot or None,
            "restricted": {k: strip(v) for k, v in res["restricted"].items()},
            "halves": {k: strip(v) for k, v in res["halves"].items()},
            "joint": res["joint"] and {**strip(res["joint"]), **{k: boot.get(k) for k in boot if k.endswith("_ci")}}}


def plot_title(results):
    """The grid a results file belongs to: sweep.sh writes OUT/results.jsonl, OUT named after the grid."""
    path = Path(results)
    if path.name == "results.jsonl":
        return path.parent.name
    return path.stem


def main(argv=None):
    args = parse_args(argv)
    try:
        for path, folder in ((args.json, False), (args.plots, True)):
            if path:
                check_writable(path, folder)
        metric = None
        if args.metric:
            eval_rows = [row for row in load_results(args.evals) if "unreadable" not in row]
            metric = (args.metric, eval_rows, read_categories(args.categories))
        sweeps = []
        for path in (args.results, args.compare):
            if path:
                sweeps.append((path, *load_sweep(path, args.only_r, args.allow_mixed, metric)))
        if len(sweeps) == 2 and not args.allow_mixed:
            mixed = mixed_settings(sweeps[0][1] + sweeps[1][1])
            if mixed:
                raise ValueError(f"{args.results} and {args.compare} differ in {'; '.join(mixed)}: a delta-phi "
                                 f"between them is not the loop mechanism's (pass --allow-mixed to compare anyway)")
        fits, out = [], {}  # every input was read and checked above; the compute starts here
        for k, (path, rows, notes) in enumerate(sweeps):
            fits.append(analyse(rows, args.restarts, args.bootstrap, 16, args.seed + 1_000_003 * k, args.workers))
            fits[-1]["notes"][:0] = notes
            report(fits[-1], str(path))
        if fits:
            out = json_ready(fits[0])
        if args.compare:
            out["compare"] = {"file": args.compare, **json_ready(fits[1])}
            out["delta_phi"] = report_delta_phi(fits[0], fits[1], args.results, args.compare)
        if args.equiv:
            if args.phi is None and not (fits[0]["joint"] or {}).get("converged"):
                raise ValueError("--equiv needs a converged joint fit or --phi")
            looped = [row for row in sweeps[0][1] if row["r"] == args.equiv[0]] if sweeps else []
            out["equivalence"] = equivalence(*args.equiv, fits[0]["joint"]["phi"] if args.phi is None else args.phi,
                                             looped[0] if looped else None)
            report_equivalence(out["equivalence"])
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1, default=float))
            print(f"\nwrote {args.json}")
        if args.plots and fits:
            names = make_plots(fits[0], sweeps[0][1], args.plots, plot_title(args.results))
            print(f"wrote {', '.join(names)} to {args.plots}")
    except ValueError as err:
        print(f"fit_laws.py: {err}", file=sys.stderr)
        sys.exit(2)
    except OSError as err:  # checked writable above, but a disk can fill up during the fits
        print(f"fit_laws.py: could not write {err.filename} ({err.strerror or err})", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
