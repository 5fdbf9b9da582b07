"""
The designs of an ablation's verdict (nanoloop/verdict.py) measured on the committed quick arms of the quiet
recipe: paired alone (the variant's replicate i against the base's i), unpaired against every base seed (the
variant's k seeds' mean against all the base's 11, Welch), and the verdict's own: paired, with the base's other
seeds as a regression control (double sampling); and how often each covers 0 for nulls drawn from the recipe's
own seeds.

    python dev/verdict_designs.py                 # both tables (a few seconds)
    python dev/verdict_designs.py --draws 400     # fewer resampled nulls

(a) Each committed arm cut to its first k seeds: each design's half-width at r = 4. (b) Nulls: the quiet
recipe's 22 committed seeds at the quick cells (the base's 0-10 and the null arm's 100-110, the same recipe and
flags: exchangeable) split at random into a variant of k seeds and a base of 11, every design on the same split:
the share of intervals that cover 0 (95% nominal) and the median half-width. Why a share can fall short of 95%:
a seed's runs at different cells share its initialisation and data prefix (the same width at the two budgets),
so the cells of one seed are not independent draws; the last line measures it (verdict.design_effect corrects
for it in every design here).
"""
import argparse
import random
import statistics
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "dev"))
from ablation_report import replicates  # noqa: E402
from nanoloop.verdict import compare, design_effect, judged, losses_by_cell, pooled_variance  # noqa: E402

RESULTS = REPO / "dev" / "results"
BASE = RESULTS / "cpu-micro-quiet"
NULL = RESULTS / "cpu-micro-null-quick-quiet"
ARMS = ("gated", "hyper", "lr007", "null", "rsi")
DESIGNS = ("paired", "welch", "control")


def looped(found):
    """Every replicate's r = 4 rows (the quick arms' looped cells; the r = 1 runs are the base's own)."""
    return [[row for row in rows if row["r"] == 4] for rows in found]


def welch(base, variant):
    """The unpaired verdict at r = 4: each cell's variant mean minus its base mean over all the base's seeds, each
    arm's own pooled within-cell variance, Welch's df, the base's design effect (as verdict.py's designs)."""
    cells = losses_by_cell(base, variant)
    n_cells = len(cells)
    mean = statistics.fmean(statistics.fmean(v.values()) - statistics.fmean(b.values()) for b, v in cells.values())
    base_variance, base_df = pooled_variance([list(b.values()) for b, _ in cells.values()])
    variant_variance, variant_df = pooled_variance([list(v.values()) for _, v in cells.values()])
    base_part = sum(base_variance / len(b) for b, _ in cells.values()) / n_cells ** 2
    variant_part = sum(variant_variance / len(v) for _, v in cells.values()) / n_cells ** 2
    df = (base_part + variant_part) ** 2 / (base_part ** 2 / base_df + variant_part ** 2 / variant_df)
    inflation = design_effect({cell: b for cell, (b, _) in cells.items()})
    return judged(mean, ((base_part + variant_part) * inflation) ** 0.5, df, {"design": "welch"})


def verdicts(base, variant):
    """{design: verdict at r = 4} of one arm of k seeds against a base of more."""
    seeds = len(variant)
    return {"paired": compare(base[:seeds], variant)[0]["r = 4"], "welch": welch(base, variant),
            "control": compare(base, variant)[0]["r = 4"]}


def arm_lines(base):
    lines = [f"(a) the committed arms, r = 4: 95% half-width (nats/token) of each design, the base's {len(base)} "
             "seeds", "| arm | seeds | paired alone | unpaired (Welch) | paired, base control (the verdict's) |",
             "|---|---|---|---|---|"]
    for name in ARMS:
        arm = looped(replicates(RESULTS / f"cpu-micro-{name}-quick-quiet"))
        for seeds in range(2, min(4, len(arm)) + 1):
            widths = [verdicts(base, arm[:seeds])[design]["half_width"] for design in DESIGNS]
            lines.append(f"| {name} | {seeds} | " + " | ".join(f"±{w:.4f}" for w in widths) + " |")
    return lines


def quiet_seeds():
    """The quiet recipe's committed replicates at the quick cells, r = 4: the base's seeds, then the null arm's."""
    return looped(replicates(BASE)) + looped(replicates(NULL))


def null_coverage(pool, seeds, base_seeds, draws, rng):
    """({design: share of nulls whose CI covers 0}, {design: median half-width}) over `draws` random splits of
    the pool's replicates into a variant of `seeds` and a base of `base_seeds` (verdicts: every design)."""
    covered = dict.fromkeys(DESIGNS, 0)
    widths = {design: [] for design in DESIGNS}
    for _ in range(draws):
        order = rng.sample(range(len(pool)), seeds + base_seeds)
        variant = [pool[i] for i in order[:seeds]]
        base = [pool[i] for i in order[seeds:]]
        for design, v in verdicts(base, variant).items():
            covered[design] += v["ci"][0] <= 0 <= v["ci"][1]
            widths[design].append(v["half_width"])
    return ({design: count / draws for design, count in covered.items()},
            {design: statistics.median(values) for design, values in widths.items()})


def null_lines(pool, draws, base_seeds, rng):
    lines = [f"(b) {draws} nulls per row from the quiet recipe's {len(pool)} seeds: variant k seeds, base "
             f"{base_seeds}: the share covering 0, the median half-width",
             "| k | paired alone | unpaired (Welch) | paired, base control (the verdict's) |", "|---|---|---|---|"]
    for seeds in (2, 3, 4):
        coverage, widths = null_coverage(pool, seeds, base_seeds, draws, rng)
        lines.append(f"| {seeds} | " + " | ".join(f"{coverage[d]:.3f}, ±{widths[d]:.4f}" for d in DESIGNS) + " |")
    return lines


def dependence_line(pool):
    """The spread of a seed's mean over the cells against what independent cells would give it."""
    cells = sorted({(row["flops_budget"], row["d_model"]) for row in pool[0]})
    losses = np.array([[{(row["flops_budget"], row["d_model"]): row["val_loss"] for row in rows}[cell]
                        for cell in cells] for rows in pool])
    seed_means = losses.mean(axis=1).std(ddof=1)
    independent = np.sqrt(losses.var(axis=0, ddof=1).sum()) / len(cells)
    correlation = np.corrcoef(losses.T)
    off_diagonal = (correlation.sum() - len(cells)) / (len(cells) ** 2 - len(cells))
    return (f"a seed's mean over the {len(cells)} cells: sd {seed_means:.4f} against {independent:.4f} for "
            f"independent cells (variance x{(seed_means / independent) ** 2:.2f}); mean correlation between two "
            f"cells of one seed {off_diagonal:+.2f}, largest {np.max(correlation - np.eye(len(cells))):+.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip())
    parser.add_argument("--draws", type=int, default=2000, help="resampled nulls per row of (b)")
    args = parser.parse_args()
    if args.draws < 1:
        parser.error("--draws must be at least 1")
    base = looped(replicates(BASE))
    pool = quiet_seeds()
    print("\n".join(arm_lines(base)))
    print()
    print("\n".join(null_lines(pool, args.draws, len(base), random.Random(0))))
    print(dependence_line(pool))


if __name__ == "__main__":
    main()
