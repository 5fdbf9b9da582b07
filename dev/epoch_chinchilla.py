"""
fit_laws.py's Chinchilla fitter on real runs: the 245 Chinchilla training runs Epoch AI read off
Hoffmann et al.'s figure (data/scaling-runs, see its README). Epoch's protocol: tokens
D = C / (6N), the five highest losses dropped (240 runs left), Huber (delta 1e-3) on log-residuals.
Their L-BFGS-B optimum is A 477.8, B 2143, E 1.8172, alpha 0.3473, beta 0.3672 (objective
0.00101827); the paper's own values (A 406.4, B 410.7, E 1.69, alpha 0.34, beta 0.28) are not it.

    python dev/epoch_chinchilla.py              # the fit (500 restarts) beside Epoch's optimum
"""
import argparse
import csv
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import fit_laws as fl  # noqa: E402

EPOCH_CSV = ROOT / "data" / "scaling-runs" / "chinchilla-epoch-extracted.csv"


def epoch_rows(path=EPOCH_CSV, drop_highest=5):
    """The runs as fit_laws rows (r = 1, N_once = N), D = C / (6N), the `drop_highest` highest losses
    dropped as Epoch does."""
    with open(path, newline="") as fh:
        raw = [(float(r["Model Size"]), float(r["Training FLOP"]), float(r["loss"])) for r in csv.DictReader(fh)]
    cut = sorted(loss for _, _, loss in raw)[-drop_highest] if drop_highest else float("inf")
    return [{"r": 1, "r_bwd": 1, "injection": "none", "n_params": N, "n_once": N, "n_rec": 0.0, "tokens": C / (6 * N),
             "flops_budget": C, "val_loss": loss} for N, C, loss in raw if loss < cut]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--csv", default=str(EPOCH_CSV))
    parser.add_argument("--restarts", type=int, default=500)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    rows = epoch_rows(args.csv)
    fit = fl.fit_chinchilla(*([row[k] for row in rows] for k in ("n_params", "tokens", "val_loss")), args.restarts,
                            0, args.workers)
    print(f"{len(rows)} runs: objective {fit['objective']:.8f}  A {fit['A']:.1f}  B {fit['B']:.0f}  E {fit['E']:.4f}  "
          f"alpha {fit['alpha']:.4f}  beta {fit['beta']:.4f}  hits {fit['hits']}/{fit['restarts']}  "
          f"(Epoch: 0.00101827, A 477.8, B 2143, E 1.8172, alpha 0.3473, beta 0.3672)")


if __name__ == "__main__":
    main()
