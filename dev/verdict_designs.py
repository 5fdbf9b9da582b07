"""
The two designs of an ablation's verdict (nanoloop/verdict.py) measured on the committed quick arms of the quiet
recipe: paired by seed (the variant's replicate i against the base's i) against every base seed (the variant's k
seeds against all the base's 11), and how often each covers 0 for nulls drawn from the recipe's own seeds.

    python dev/verdict_designs.py                 # both tables (a few seconds)
    python dev/verdict_designs.py --draws 400     # fewer resampled nulls

(a) Each committed arm cut to its first k seeds: the half-width of each design at r = 4. (b) Nulls: the quiet
recipe's 22 committed seeds at the quick cells (the base's 0-10 and the null arm's 100-110, the same recipe and
flags: exchangeable) split at random into a variant of k seeds and a base of 11, both designs on the same split:
the share of intervals that cover 0 (95% nominal) and the median half-width. Why a share can fall short of 95%:
a seed's runs at different cells share its initialisation and data prefix (the same width at the two budgets),
so the cells of one seed are not independent draws, which both designs assume; the table's last line measures it.
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
from nanoloop.verdict import compare  # noqa: E402

RESULTS = REPO / "dev" / "results"
BASE = RESULTS / "cpu-micro-quiet"
NULL = RESULTS / "cpu-micro-null-quick-quiet"
ARMS = ("gated", "hyper", "lr007", "null")


def looped(found):
    """Every replicate's r = 4 rows (the quick arms' looped cells; the r = 1 runs are the base's own)."""
    return [[row for row in rows if row["r"] == 4] for rows in found]


def half_widths(base, arm, seeds):
    """(paired, against every base seed) half-widths at r = 4 of the arm's first `seeds` replicates."""
    paired, _ = compare(base[:seeds], arm[:seeds])
    against, _ = compare(base, arm[:seeds])
    return paired["r = 4"]["half_width"], against["r = 4"]["half_width"]


def arm_lines(base):
    lines = ["(a) the committed arms, r = 4: 95% half-width (nats/token), paired | against the base's "
             f"{len(base)} seeds", "| arm | seeds | paired | against every base seed |", "|---|---|---|---|"]
    for name in ARMS:
        arm = looped(replicates(RESULTS / f"cpu-micro-{name}-quick-quiet"))
        for seeds in range(2, min(4, len(arm)) + 1):
            paired, against = half_widths(base, arm, seeds)
            lines.append(f"| {name} | {seeds} | ±{paired:.4f} | ±{against:.4f} |")
    return lines


def quiet_seeds():
    """The quiet recipe's committed replicates at the quick cells, r = 4: the base's seeds, then the null arm's."""
    return looped(replicates(BASE)) + looped(replicates(NULL))


def null_coverage(pool, seeds, base_seeds, draws, rng):
    """({design: share of nulls whose CI covers 0}, {design: median half-width}) over `draws` random splits of
    the pool's replicates into a variant of `seeds` and a base of `base_seeds`; "paired" pairs the variant with
    the base's first `seeds`, "against" takes all of the base (nanoloop/verdict.compare)."""
    covered = {"paired": 0, "against": 0}
    widths = {"paired": [], "against": []}
    for _ in range(draws):
        order = rng.sample(range(len(pool)), seeds + base_seeds)
        variant = [pool[i] for i in order[:seeds]]
        base = [pool[i] for i in order[seeds:]]
        for design, base_part in (("paired", base[:seeds]), ("against", base)):
            v = compare(base_part, variant)[0]["r = 4"]
            covered[design] += v["ci"][0] <= 0 <= v["ci"][1]
            widths[design].append(v["half_width"])
    return ({design: count / draws for design, count in covered.items()},
            {design: statistics.median(values) for design, values in widths.items()})


def null_lines(pool, draws, base_seeds, rng):
    lines = [f"(b) {draws} nulls per row from the quiet recipe's {len(pool)} seeds: variant k seeds, base "
             f"{base_seeds}", "| k | paired: covers 0 | median ± | against every base seed: covers 0 | median ± |",
             "|---|---|---|---|---|"]
    for seeds in (2, 3, 4):
        coverage, widths = null_coverage(pool, seeds, base_seeds, draws, rng)
        lines.append(f"| {seeds} | {coverage['paired']:.3f} | ±{widths['paired']:.4f} | {coverage['against']:.3f} | "
                     f"±{widths['against']:.4f} |")
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
