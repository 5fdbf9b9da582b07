"""
How narrow a delta-phi can the full CPU ablation resolve, by noise source (#50)? The full mode's delta-phi
(dev/ablate.sh, fit_laws.py --compare) fits the joint law (Eq. 3) on the layout-matched r = 1 anchor plus each
arm's looped runs: the anchor is the same runs in both arms, the looped runs are each arm's own. This script moves
the committed grid's losses by one source of noise at a time, as measured at the quick cells (dev/noise.sh:
seed, data order, a retrain of the same run; the grid recipe and the quiet one), and refits: the anchor by one
draw shared by both arms, each arm's looped runs by their own draw. The spread of phi(B) - phi(A) over the draws
is the delta-phi noise that source alone gives, with nothing changed between the arms.

    python dev/phi_noise.py                 # 40 draws per source (~3 min on 2 cores)
    python dev/phi_noise.py --draws 100 --json dev/results/cpu-micro-noise/phi_noise.json

Per source: the per-run sd used (r = 1 and looped: r = 4's, the looped r measured, for r = 2 and 8), the sd of
delta-phi, its 95% half-width (1.96 sd, normal: the draws are), and the seeds per cell a +-0.10 half-width takes
(averaging K seeds divides a run's noise by sqrt(K)). A source not measured at r = 1 takes the grid recipe's
r = 1 seed sd, the larger of the r = 1 values measured (said in its line).
"""
import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

import ablation_report
from diagnose_report import load as read_rows

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fit_laws  # noqa: E402
from nanoloop.common import positive_int  # noqa: E402
from nanoloop.laws import fit_joint  # noqa: E402

# (label, dev/noise.sh recipe): each source's per-run sd at r = 1 and at the looped r, from its seed replicates
SOURCES = (("seed, grid recipe", "base"), ("data order, grid recipe", "order"),
           ("seed, quiet recipe", "cosine-avg-lr014"))
TARGET = 0.10  # the full-mode half-width


def source_sds(recipe, fallback_r1):
    """(sd at r = 1, sd of the looped runs, note) of a dev/noise.sh recipe; r = 1 falls back where not measured."""
    sds = ablation_report.base_seed_sd(recipe)
    looped = max(sd for r, sd in sds.items() if r > 1)
    if 1 in sds:
        return sds[1], looped, ""
    return fallback_r1, looped, f"r = 1 not measured: the grid recipe's {fallback_r1:.3f}"


def retrain_sds():
    """(sd at r = 1, looped sd) of a retrain of the same run_id, from |retrained - committed| (ablation_report's
    noise floor): two draws of the same noise differ by sqrt(2) sd, E|difference| = 2 sd / sqrt(pi)."""
    retrain, _ = ablation_report.noise_floor()
    def sd_of(values):
        return statistics.fmean(values) * math.sqrt(math.pi) / 2
    looped = [x for r, values in retrain.items() if r > 1 for x in values]
    return sd_of(retrain[1]), sd_of(looped)


def delta_phi_draws(rows, start, sd_r1, sd_looped, draws, seed, restarts=16):
    """phi(B) - phi(A) for `draws` pairs of arms: the anchor moved by one shared draw, each arm's looped runs by
    their own; each refit from `start` (the unmoved fit's local optima) plus `restarts` random starts, as the
    bootstrap refits (nanoloop/laws.bootstrap_joint)."""
    rng = np.random.default_rng(seed)
    anchor = [row for row in rows if row["r"] == 1]
    looped = [row for row in rows if row["r"] > 1]
    out = []
    for i in range(draws):
        moved_anchor = [dict(row, val_loss=row["val_loss"] + rng.normal(0, sd_r1)) for row in anchor]
        phis = []
        for _ in range(2):
            arm = [dict(row, val_loss=row["val_loss"] + rng.normal(0, sd_looped)) for row in looped]
            phis.append(fit_joint(moved_anchor + arm, restarts=restarts, seed=i, x0=start)["phi"])
        out.append(phis[1] - phis[0])
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--draws", type=positive_int, default=40, help="pairs of arms per source")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the table here")
    args = p.parse_args()
    raw = ablation_report.layout_anchored_rows(read_rows(ablation_report.BASE / "results.jsonl"),
                                               ablation_report.BASE)
    rows = fit_laws.prepare_rows(raw)
    grid_r1 = ablation_report.base_seed_sd("base")[1]
    sources = [(label, *source_sds(recipe, grid_r1)) for label, recipe in SOURCES]
    sources.append(("retrain (same run_id)", *retrain_sds(), "from cpu-micro-eval's retrained rows"))
    print(f"delta-phi noise of the full CPU ablation (layout-anchored cpu-micro, {len(rows)} runs, "
          f"{args.draws} pairs of arms per source; nothing changed between the arms)\n")
    print("| source | sd r = 1 | sd looped | sd of Δφ | 95% half-width | seeds for ±0.10 | note |")
    print("|---|---|---|---|---|---|---|")
    full = fit_joint(rows, restarts=100)
    table = []
    for label, sd_r1, sd_looped, note in sources:
        deltas = delta_phi_draws(rows, full["local_optima"], sd_r1, sd_looped, args.draws, args.seed)
        sd = statistics.stdev(deltas)
        half = 1.96 * sd
        seeds = math.ceil((half / TARGET) ** 2)
        table.append({"source": label, "sd_r1": sd_r1, "sd_looped": sd_looped, "phi": full["phi"], "sd_delta_phi": sd,
                      "half_width": half, "seeds_for_target": seeds, "draws": args.draws, "note": note})
        print(f"| {label} | {sd_r1:.3f} | {sd_looped:.3f} | {sd:.3f} | ±{half:.2f} | {seeds} | {note} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
    main()
