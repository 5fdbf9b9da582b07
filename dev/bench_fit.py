"""
Wall time of fit_laws.py's fitter against a straightforward scipy implementation (numerical
gradients, one process), on (a) Epoch's 240 Chinchilla runs with 500 restarts and (b) the full joint
analysis of a synthetic 116-run paper grid including the 200-resample block bootstrap. Prints
figures; asserts nothing.

    python dev/bench_fit.py                    # everything (a few minutes on 2 cores)
    python dev/bench_fit.py --naive-restarts 50 --check-resamples 3

The naive side is what one writes first: a vectorised objective with scipy.special's huber and
logsumexp, L-BFGS-B with 2-point finite-difference gradients, the same box and tight tolerances, one
process, and every fit (bootstrap refits included) from 500 random starts. Both sides run scipy's
BLAS on one thread. Where that would take too long it is timed on --naive-restarts starts and
extrapolated linearly in the number of L-BFGS-B runs; the output says so.
"""
import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fit_laws as fl  # noqa: E402  (first: it puts scipy's BLAS on one thread, for both sides)
from nanoloop import laws  # noqa: E402
import numpy as np  # noqa: E402
from epoch_chinchilla import EPOCH_CSV, epoch_rows  # noqa: E402
from scipy.optimize import minimize  # noqa: E402
from scipy.special import huber, logsumexp  # noqa: E402
from synthetic_sweep import synthetic_rows  # noqa: E402


def naive_objective(theta, logN_parts, logD, logL, joint):
    """Huber-on-log objective, the plain way (no gradient)."""
    if joint:
        a, b, e, alpha, beta, phi = theta
        n_once, n_rec, r = logN_parts
        x = np.log(n_once + r ** phi * n_rec)
    else:
        a, b, e, alpha, beta = theta
        x = logN_parts
    pred = logsumexp(np.stack([a - alpha * x, b - beta * logD, np.full_like(x, e)]), axis=0)
    return huber(1e-3, pred - logL).sum()


def naive_fit(args, restarts, seed, joint, options):
    k = 6 if joint else 5
    rng = np.random.default_rng(seed)
    starts = rng.uniform(fl.BOX_LO[:k], fl.BOX_HI[:k], size=(restarts, k))
    best = None
    for x0 in starts:
        res = minimize(naive_objective, x0, args=(*args, joint), method="L-BFGS-B",
                       bounds=list(zip(fl.BOX_LO[:k], fl.BOX_HI[:k])), options=options)
        if best is None or res.fun < best.fun:
            best = res
    return best


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="processes for fit_laws.py's side")
    parser.add_argument("--naive-restarts", type=int, default=100,
                        help="restarts actually run by the naive joint fit before extrapolating")
    parser.add_argument("--check-resamples", type=int, default=5,
                        help="bootstrap resamples refit with 500 restarts to check the fast refits")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # progress shows when piped to a file
    # Both sides run scipy's BLAS on one thread (fit_laws sets OPENBLAS_NUM_THREADS before scipy loads):
    # with the OpenBLAS thread pool the naive side ran another ~6x slower on a busy 2-core box, which
    # would flatter the comparison.
    tight = dict(laws.LBFGS_OPTIONS)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start "
          f"(the box is shared; wall times scale with the load)")

    # (a) Epoch's Chinchilla runs, 500 restarts
    if EPOCH_CSV.is_file():
        rows = epoch_rows()
        N, D, L = (np.array([r[k] for r in rows]) for k in ("n_params", "tokens", "val_loss"))
        fast, t_fast = timed(lambda: fl.fit_chinchilla(N, D, L, 500, 0, args.workers))
        one, t_one = timed(lambda: fl.fit_chinchilla(N, D, L, 500, 0, 1))
        naive, t_naive = timed(lambda: naive_fit((np.log(N), np.log(D), np.log(L)), 500, 0, False, tight))
        sloppy, t_sloppy = timed(lambda: naive_fit((np.log(N), np.log(D), np.log(L)), 500, 0, False, {}))
        print("\n(a) Epoch's 240 Chinchilla runs, best of 500 L-BFGS-B restarts")
        for name, t, obj, th in (
                (f"fit_laws.fit_chinchilla ({args.workers} workers)", t_fast, fast["objective"],
                 (fast["A"], fast["B"], fast["E"], fast["alpha"], fast["beta"])),
                ("fit_laws.fit_chinchilla (1 worker)", t_one, one["objective"],
                 (one["A"], one["B"], one["E"], one["alpha"], one["beta"])),
                ("naive: numerical gradient, same tolerances", t_naive, naive.fun,
                 (np.exp(naive.x[0]), np.exp(naive.x[1]), np.exp(naive.x[2]), naive.x[3], naive.x[4])),
                ("naive: numerical gradient, scipy default tolerances", t_sloppy, sloppy.fun,
                 (np.exp(sloppy.x[0]), np.exp(sloppy.x[1]), np.exp(sloppy.x[2]), sloppy.x[3], sloppy.x[4]))):
            print(f"  {name:<52} {t:7.2f} s   objective {obj:.8f}   A {th[0]:.1f} B {th[1]:.0f} "
                  f"E {th[2]:.4f} alpha {th[3]:.4f} beta {th[4]:.4f}")
        print(f"  speed-up over the naive fit with the same tolerances: {t_naive / t_fast:.1f}x "
              f"({t_naive / t_one:.1f}x on one core each) "
              f"(Epoch: A 477.8, B 2143, E 1.8172, alpha 0.3473, beta 0.3672, objective 0.00101827)")
    else:
        print(f"\n(a) skipped: {EPOCH_CSV} not found")

    # (b) full joint analysis of the synthetic 116-run grid with a 200-resample bootstrap
    rows = synthetic_rows(seed=0)
    res, t_full = timed(lambda: fl.analyse(rows, fl.FitOptions(workers=args.workers)))
    joint = res["joint"]
    c = laws._joint_arrays(rows)
    jargs = ((c["n_once"], c["n_rec"], c["r"]), np.log(c["tokens"]), np.log(c["val_loss"]))
    nr = args.naive_restarts
    naive_joint, t_nj = timed(lambda: naive_fit(jargs, nr, 0, True, tight))
    # The naive protocol: 9 fits of 500 restarts (4 per-architecture, joint, phi = 0, phi = 1, two
    # halves) plus 200 bootstrap refits of 500 restarts each = 104,500 L-BFGS-B runs.
    runs_naive = 9 * 500 + 200 * 500
    t_naive_total = t_nj / nr * runs_naive
    print("\n(b) full joint analysis, 116 synthetic runs: 4 per-architecture fits, joint fit, phi = 0 and 1, "
          "two budget halves (500 restarts each), 200-resample block bootstrap, frontier")
    print(f"  fit_laws.analyse ({args.workers} workers)                     {t_full:8.1f} s   "
          f"phi {joint['phi']:.4f} CI [{res['bootstrap']['phi_ci'][0]:.4f}, {res['bootstrap']['phi_ci'][1]:.4f}]")
    print(f"  naive joint fit, {nr} restarts (timed)                  {t_nj:8.1f} s   phi {naive_joint.x[5]:.4f}, "
          f"objective {naive_joint.fun:.8g} vs {joint['objective']:.8g}")
    print(f"  naive analysis, extrapolated to {runs_naive:,} L-BFGS-B runs  {t_naive_total:8.0f} s "
          f"(= {t_naive_total / 3600:.1f} h; linear in runs from the timed {nr})")
    print(f"  speed-up: {t_naive_total / t_full:.0f}x")

    # Fast bootstrap refits (full-data local optima + 16 random starts) against 500 random starts
    cell_of_run, r_of_cell = laws.bootstrap_cells(rows)
    print(f"\nbootstrap refits: full-data local optima + 16 random starts vs 500 random starts "
          f"({args.check_resamples} resamples)")
    for i in range(args.check_resamples):
        w, rng = laws.resample_weights(0, i, cell_of_run, r_of_cell)
        (slow, t_slow) = timed(lambda: fl.fit_joint(rows, 500, seed=1000 + i, weights=w, workers=args.workers))
        (quick, t_quick) = timed(lambda: fl.fit_joint(rows, 16, seed=2000 + i, weights=w, x0=joint["local_optima"]))
        print(f"  resample {i}: objective {quick['objective']:.10g} vs {slow['objective']:.10g} "
              f"(rel {quick['objective'] / slow['objective'] - 1:+.1e}), phi {quick['phi']:.5f} vs {slow['phi']:.5f}; "
              f"{t_quick:.2f} s vs {t_slow:.2f} s")


if __name__ == "__main__":
    main()
