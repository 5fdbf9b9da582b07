"""
The truncate-or-not law (an extension of the study, truncate-or-not §5, App. C-D):
N_eff = N_once + g(T, B) N_rec with T = r forward and B = r_bwd backward loops. Prints its
best-backward-loop table (their Table 5) from the published coefficients, or fits the law to a sweep
that varies (T, B) - with held-out checks: leave one configuration / model size / compute budget /
(T, B) setting out, refit on the rest, predict what was left out (their App. C.3).

    python dev/truncate_law.py --chi-table                    # Table 5 from the published law
    python dev/truncate_law.py runs/trunc/results.jsonl --holdout all
"""
import argparse
import math
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fit_laws as fl  # noqa: E402
import laws  # noqa: E402

# Coordinates (E, log A, log H, alpha, beta, kappa, log c, p, q): bounds, and the narrower ranges
# random starts are drawn from (their App. C.3 "Solver").
LO = np.array([0.0, -10.0, -10.0, 0.01, 0.01, 0.01, math.log(1e-3), 1e-3, 1e-3])
HI = np.array([3.0, 15.0, 15.0, 3.0, 3.0, 3.0, math.log(10.0), 10.0, 10.0])
INIT_LO = np.array([0.3, 0.5, 0.5, 0.25, 0.25, 0.15, math.log(0.2), 0.1, 0.1])
INIT_HI = np.array([1.2, 2.5, 2.5, 0.65, 0.65, 0.45, math.log(2.0), 2.0, 2.0])
SEED = 20261010  # their fold seeds are 20261010 + fold index
FAMILIES = ("config", "size", "budget", "setting")
# Truncate-or-not law (their Eq. 2-3, Table 4): L = E + [A (N_eff/N0)^-alpha + H (D/D0)^-beta]^kappa,
# N_eff = N_once + g(T, B) N_rec, g = exp[c (1 - T^-p B^-q)]; T = r, B = r_bwd.
N0, D0 = 2.4e8, 2.0 ** 30
PUBLISHED = {"E": 0.29865, "A": 6.48695, "H": 7.63343, "alpha": 0.30568, "beta": 0.39281,
             "kappa": 0.32510, "c": 1.11198, "p": 0.23677, "q": 1.02181}
RHO = 0.507  # N_rec / N of their 240M model, the share their Table 5 is computed at


def g_loop(T, B, c, p, q):
    """Looping coefficient g(T, B) = exp[c (1 - T^-p B^-q)]: g(1,1) = 1, bounded by e^c."""
    return np.exp(c * (1.0 - np.asarray(T, float) ** -p * np.asarray(B, float) ** -q))


def truncate_law_loss(coef, n_once, n_rec, T, B, D):
    neff = np.asarray(n_once, float) + g_loop(T, B, coef["c"], coef["p"], coef["q"]) * np.asarray(n_rec, float)
    S = coef["A"] * (neff / N0) ** -coef["alpha"] + coef["H"] * (np.asarray(D, float) / D0) ** -coef["beta"]
    return coef["E"] + S ** coef["kappa"]


def chi(T, B, rho, coef):
    """Compute paid per effective parameter, chi = N_comp / N_eff, with recurrent share rho = N_rec/N:
    6 N_comp = 6 N_once + (2T + 4B) N_rec (forward 2, backward 4 FLOPs per parameter and token)."""
    g = g_loop(T, B, coef["c"], coef["p"], coef["q"])
    return ((1 - rho) + rho * (2 * np.asarray(T, float) + 4 * np.asarray(B, float)) / 6) / ((1 - rho) + rho * g)


def chi_table(coef, rho=RHO, Ts=(1, 2, 4, 8, 16)):
    """Best backward-loop count per T (truncate-or-not Table 5): B* = argmin over B in 1..T of chi(T, B);
    chi at B* and at B = T; N*, D* at B* relative to full BPTT at the same T and C. At fixed compute the
    looped problem is the non-looped one at budget C / chi (their Lemma D.1), so N_eff* scales as
    chi^(-beta/(alpha+beta)) and D* as chi^(-alpha/(alpha+beta)). `rho`: one share, or one per T."""
    table = []
    for T in Ts:
        rh = rho[T] if isinstance(rho, dict) else rho
        ch = chi(T, np.arange(1, T + 1), rh, coef)
        Bstar, ratio, ab = int(np.argmin(ch)) + 1, ch.min() / ch[-1], coef["alpha"] + coef["beta"]
        g_full, g_star = (float(g_loop(T, B, coef["c"], coef["p"], coef["q"])) for B in (T, Bstar))
        neff_ratio = ((1 - rh) + rh * g_full) / ((1 - rh) + rh * g_star)  # (N/N_eff)_B* / (N/N_eff)_T
        table.append({"T": T, "rho": rh, "B_star": Bstar, "chi_star": float(ch.min()), "chi_full": float(ch[-1]),
                      "N_star_ratio": float(neff_ratio * ratio ** (-coef["beta"] / ab)),
                      "D_star_ratio": float(ratio ** (-coef["alpha"] / ab)), "g_star": g_star, "g_full": g_full})
    return table


def report_chi_table(table, coefficients="published", p=print):
    p(f"\nBest backward-loop count per T ({coefficients} coefficients; chi = N_comp/N_eff; N*, D* relative to full "
      f"BPTT at the same T and compute)\n  {'T':>3}{'rho':>7}{'B*':>4}{'g(T,B*)':>9}{'chi(T,B*)':>11}{'chi(T,T)':>10}"
      f"{'N*':>7}{'D*':>7}")
    for t in table:
        p(f"  {t['T']:>3}{t['rho']:>7.3f}{t['B_star']:>4}{t['g_star']:>9.4f}{t['chi_star']:>11.3f}"
          f"{t['chi_full']:>10.3f}{t['N_star_ratio']:>7.2f}{t['D_star_ratio']:>7.2f}")


def coefficients(theta):
    E, logA, logH, alpha, beta, kappa, logc, p, q = (float(v) for v in theta)
    return {"E": E, "A": math.exp(logA), "H": math.exp(logH), "alpha": alpha, "beta": beta, "kappa": kappa,
            "c": math.exp(logc), "p": p, "q": q}


def predict(coef, d):
    return truncate_law_loss(coef, d["n_once"], d["n_rec"], d["T"], d["B"], d["D"])


def _trf(d, x0):
    """One trust-region-reflective least-squares run from x0 (their App. C.3: Jacobian scaling, <= 4000
    evaluations, tolerances 1e-12). A 2-point Jacobian reaches the same optimum as the analytic one
    (1.7x slower) and keeps the law written once, in truncate_law_loss."""
    res = least_squares(lambda theta: predict(coefficients(theta), d) - d["L"], x0, bounds=(LO, HI), method="trf",
                        x_scale="jac", max_nfev=4000, ftol=1e-12, xtol=1e-12, gtol=1e-12)
    return float(2 * res.cost), res.x, bool(res.status > 0), res.message


def configurations(rows):
    """One point per configuration (N_once, N_rec, D, T, B), seeds averaged so each weighs the same, with
    the labels the held-out checks group by."""
    by_cfg = {}
    for row in rows:
        key = (row["n_once"], row["n_rec"], row["tokens"], row["r"], row["r_bwd"])
        by_cfg.setdefault(key, []).append(row)
    keys = sorted(by_cfg)
    a, first = np.array(keys, dtype=float), [by_cfg[k][0] for k in keys]
    return {"n_once": a[:, 0], "n_rec": a[:, 1], "D": a[:, 2], "T": a[:, 3], "B": a[:, 4],
            "L": np.array([np.mean([row["val_loss"] for row in by_cfg[k]]) for k in keys]),
            "config": np.arange(len(keys)), "size": np.array([row.get("d_model") or row["n_params"] for row in first]),
            "budget": fl.budget_levels([row["flops_budget"] for row in first])[0], "setting": a[:, 3] * 1000 + a[:, 4]}


def best_fit(d, starts, seed, workers=1):
    """Best converged of `starts` TRF runs from uniform random points in the App. C.3 ranges."""
    x0 = np.random.default_rng(seed).uniform(INIT_LO, INIT_HI, size=(starts, len(LO)))
    runs = laws.multistart(_trf, d, x0, workers)
    conv = [run for run in runs if run[2]]
    sse, theta, ok, _ = min(conv or runs, key=lambda run: run[0])
    return {**coefficients(theta), "sse": sse, "converged": ok, "converged_starts": len(conv), "starts": starts,
            "theta": [float(v) for v in theta]}


def fit_truncate_law(rows, starts=64, seed=SEED, workers=1):
    """The nine-coefficient law by least squares over the configurations of fit_laws.prepare_rows rows."""
    d = configurations(rows)
    if len(d["L"]) < 10:
        raise ValueError(f"fit_truncate_law: {len(d['L'])} configurations are too few for 9 coefficients")
    if not np.any(d["T"] == 1) or not np.any(d["T"] > 1):
        raise ValueError("fit_truncate_law: needs non-looped (r = 1) and looped runs")
    tl = best_fit(d, starts, seed, workers)
    resid = predict(tl, d) - d["L"]
    notes = []
    if all(d["T"] == d["B"]):
        notes.append("every run has r_bwd = r: only p + q is identified, not p and q separately")
    # A coefficient on its box edge is a finding, e.g. c -> its cap means the loop gain looks
    # unbounded over these r (the power-law limit of g, their §C.4), E -> 0 the E-kappa trade-off.
    names = ("E", "log A", "log H", "alpha", "beta", "kappa", "log c", "p", "q")
    for name, v, lo, hi in zip(names, tl["theta"], LO, HI):
        if min(v - lo, hi - v) <= 1e-6:
            notes.append(f"{name} = {v:.4g} sits on its bound")
    return {**tl, "rmse": float(np.sqrt(np.mean(resid ** 2))), "configs": len(d["L"]), "notes": notes,
            "r2": 1 - float(resid @ resid) / float(np.sum((d["L"] - d["L"].mean()) ** 2))}


def _fold(task):
    d, held_out, starts, seed = task
    fit = best_fit({k: v[~held_out] for k, v in d.items()}, starts, seed)
    return (predict(fit, {k: v[held_out] for k, v in d.items()}) - d["L"][held_out]).tolist(), fit["converged"]


def holdout(rows, family, starts=64, seed=SEED, workers=1):
    """Held-out prediction errors (prediction - measurement, nats) with one `family` label left out per
    fold, each fold refit from scratch (seed + fold index): pooled RMSE, MAE, bias, max error."""
    if family not in FAMILIES:
        raise ValueError(f"holdout: family must be one of {', '.join(FAMILIES)}")
    d = configurations(rows)
    folds = sorted(set(d[family].tolist()))
    results = laws.pmap(_fold, [(d, d[family] == lab, starts, seed + j) for j, lab in enumerate(folds)], workers)
    err = np.array([e for errs, _ in results for e in errs])
    return {"family": family, "fits": len(folds), "rmse": float(np.sqrt(np.mean(err ** 2))),
            "mae": float(np.mean(np.abs(err))), "bias": float(np.mean(err)), "max_error": float(np.abs(err).max()),
            "converged_folds": int(sum(ok for _, ok in results))}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="?", help="train.py results with several (r, r_bwd) settings, r = 1 included")
    parser.add_argument("--chi-table", action="store_true", help="print Table 5 from the published coefficients")
    parser.add_argument("--rho", type=float, default=RHO, help="N_rec/N for the published table")
    parser.add_argument("--starts", type=int, default=64, help="random TRF starts (their App. C.3: 64)")
    parser.add_argument("--holdout", default="", help=f"comma list of {', '.join(FAMILIES)}, or all")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    families = list(FAMILIES) if args.holdout == "all" else [f for f in args.holdout.split(",") if f]
    if set(families) - set(FAMILIES) or args.starts < 1 or args.workers < 1 or not 0 <= args.rho <= 1:
        parser.error(f"--holdout takes {', '.join(FAMILIES)} or all; --starts, --workers >= 1; --rho in [0, 1]")
    if args.chi_table or not args.results:
        return report_chi_table(chi_table(PUBLISHED, args.rho))
    try:
        rows = fl.prepare_rows(fl.drop_unusable(fl.load_results(args.results))[0], args.results)
        tl = fit_truncate_law(rows, args.starts, SEED, args.workers)
    except ValueError as err:
        sys.exit(f"truncate_law.py: {err}")
    print(f"Truncate-or-not law  L = E + [A (N_eff/N0)^-alpha + H (D/D0)^-beta]^kappa,  N_eff = N_once + g(T,B) N_rec"
          f"  ({tl['configs']} configurations, best of {tl['starts']} TRF starts, {tl['converged_starts']} converged)")
    if not tl["converged"]:
        sys.exit("  NOT CONVERGED: no start ended on a convergence test")
    print("  " + "  ".join(f"{k} {tl[k]:.5g}" for k in ("E", "A", "H", "alpha", "beta", "kappa", "c", "p", "q")))
    print(f"  R2 {tl['r2']:.5f}  RMSE {tl['rmse']:.4f} nats" + "".join(f"\n  note: {n}" for n in tl["notes"]))
    rho = {}
    for row in rows:  # each T's recurrent share N_rec / N (the median over widths)
        rho.setdefault(row["r"], []).append(row["n_rec"] / row["n_params"])
    report_chi_table(chi_table(tl, {T: float(np.median(v)) for T, v in rho.items()}, sorted(rho)), "fitted")
    if families:
        print(f"\n  {'held out':<10}{'fits':>6}{'RMSE':>10}{'MAE':>10}{'bias':>11}{'max err':>10}")
    for h in (holdout(rows, f, args.starts, SEED, args.workers) for f in families):
        print(f"  {h['family']:<10}{h['fits']:>6}{h['rmse']:>10.3e}{h['mae']:>10.3e}{h['bias']:>+11.2e}"
              f"{h['max_error']:>10.3e}")


if __name__ == "__main__":
    main()
