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

Per source: the per-run sd used at each r (dev/noise.sh's cells pooled per r, over the budgets it measured), the
sd of delta-phi, its 95% half-width (1.96 sd, normal: the draws are), and the seeds per cell a +-0.10 half-width
takes (averaging K seeds divides a run's noise by sqrt(K)). An r a source did not measure takes the grid recipe's
sd there (r = 1) or its own largest looped sd (said in its line).
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


def source_sds(recipe, grid_sds, rs):
    """({r: sd} of a dev/noise.sh recipe at each of the grid's rs, note): an r it did not measure takes the grid
    recipe's sd at r = 1, its own largest looped sd at a looped r."""
    sds = ablation_report.base_seed_sd(recipe)
    looped = max(sd for r, sd in sds.items() if r > 1)
    missing = [r for r in rs if r not in sds]
    filled = {r: sds.get(r, grid_sds[1] if r == 1 else looped) for r in rs}
    note = f"r = {', '.join(map(str, missing))} not measured: filled" if missing else ""
    return filled, note


def retrain_sds(rs):
    """{r: sd} of a retrain of the same run_id, from |retrained - committed| (ablation_report's noise floor): two
    draws of the same noise differ by sqrt(2) sd, E|difference| = 2 sd / sqrt(pi)."""
    retrain, _ = ablation_report.noise_floor()
    return {r: statistics.fmean(retrain[r]) * math.sqrt(math.pi) / 2 for r in rs}


def delta_phi_draws(rows, start, sd_by_r, draws, seed, restarts=16):
    """phi(B) - phi(A) for `draws` pairs of arms: the anchor moved by one shared draw, each arm's looped runs by
    their own, a run at r by sd_by_r[r]; each refit from `start` (the unmoved fit's local optima) plus `restarts`
    random starts, as the bootstrap refits (nanoloop/laws.bootstrap_joint)."""
    rng = np.random.default_rng(seed)
    anchor = [row for row in rows if row["r"] == 1]
    looped = [row for row in rows if row["r"] > 1]
    out = []
    for i in range(draws):
        moved_anchor = [dict(row, val_loss=row["val_loss"] + rng.normal(0, sd_by_r[1])) for row in anchor]
        phis = []
        for _ in range(2):
            arm = [dict(row, val_loss=row["val_loss"] + rng.normal(0, sd_by_r[row["r"]])) for row in looped]
            phis.append(fit_joint(moved_anchor + arm, restarts=restarts, seed=i, x0=start)["phi"])
        out.append(phis[1] - phis[0])
    return out


def source_entry(rows, full, sd_by_r, args):
    """One source's Δφ noise: the sd of Δφ over args.draws pairs of arms, its 95% half-width and the seeds per
    cell a half-width of TARGET would take if it fell as 1/sqrt(seeds)."""
    deltas = delta_phi_draws(rows, full["local_optima"], sd_by_r, args.draws, args.seed)
    sd = statistics.stdev(deltas)
    half = 1.96 * sd
    return {"sd_by_r": sd_by_r, "phi": full["phi"], "sd_delta_phi": sd, "half_width": half,
            "seeds_for_target": math.ceil((half / TARGET) ** 2), "draws": args.draws}


def print_entry(label, entry, rs, note):
    sds = " | ".join(f"{entry['sd_by_r'][r]:.3f}" for r in rs)
    print(f"| {label} | {sds} | {entry['sd_delta_phi']:.3f} | ±{entry['half_width']:.2f} | "
          f"{entry['seeds_for_target']} | {note} |", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--draws", type=positive_int, default=40, help="pairs of arms per source")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the table here")
    args = p.parse_args()
    raw = ablation_report.layout_anchored_rows(read_rows(ablation_report.BASE / "results.jsonl"),
                                               ablation_report.BASE)
    rows = fit_laws.prepare_rows(raw)
    rs = sorted({row["r"] for row in rows})
    grid_sds = ablation_report.base_seed_sd("base")
    sources = [(label, *source_sds(recipe, grid_sds, rs)) for label, recipe in SOURCES]
    sources.append(("retrain (same run_id)", retrain_sds(rs), "from cpu-micro-eval's retrained rows"))
    print(f"delta-phi noise of the full CPU ablation (layout-anchored cpu-micro, {len(rows)} runs, "
          f"{args.draws} pairs of arms per source; nothing changed between the arms)\n")
    print("| source | " + " | ".join(f"sd r = {r}" for r in rs) + " | sd of Δφ | 95% half-width | seeds for ±0.10 "
          "| note |")
    print("|---|" + "---|" * len(rs) + "---|---|---|---|")
    full = fit_joint(rows, restarts=100)
    table = []
    for label, sd_by_r, note in sources:
        entry = source_entry(rows, full, sd_by_r, args)
        table.append({"source": label, "note": note, **entry})
        print_entry(label, entry, rs, note)
        if label.startswith("seed") and entry["seeds_for_target"] > 1:
            # the extrapolation checked: each cell's mean over that many seeds, drawn and refitted
            seeds = entry["seeds_for_target"]
            averaged = {r: sd / math.sqrt(seeds) for r, sd in sd_by_r.items()}
            check = source_entry(rows, full, averaged, args)
            table.append({"source": f"{label}, mean of {seeds} seeds", "note": "measured, not extrapolated", **check})
            print_entry(f"{label}, mean of {seeds} seeds", check, rs, "measured, not extrapolated")
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
    main()
