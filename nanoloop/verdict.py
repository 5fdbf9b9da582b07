"""
The verdict of an ablation: does a change help, hurt, or can't this design tell? From paired runs (the
variant and the base at one cell and seed of the harness), the mean difference in validation loss (variant -
base) with a 95% confidence interval, and the word that follows from it. dev/ablation_report.py prints it first.

    pairs = paired_differences([base_rows], [variant_rows])  # {(budget, r, d): {replicate: variant - base}}
    v = verdict(pairs)                                       # mean, ci, half_width, df, word, n_cells, n_seeds
    verdict_line("r = 4", v)   # 'r = 4: better by 0.031 nats: -0.031 nats [-0.040, -0.022], 95% CI (7 cells x 3 ...'

The interval is a t-interval, not a bootstrap: with 7 cells and a few seeds a bootstrap's resamples are too few
to give a 95% tail, while the t-interval is exact for normal noise, and the seed noise of the CPU grids is
(dev/README.md, "Ablations"). Its estimand is the mean effect over the ablation's own cells, each weighted
equally (the cells are the design, fixed), so its noise is what new seeds would change:
  - with two or more seeds at a cell, the spread of that cell's differences over its seeds (the pooled
    within-cell variance; degrees of freedom: the seeds beyond the first, summed over cells);
  - with one seed per cell, the spread of the differences across cells, which also holds how the effect
    varies from cell to cell: wider than the seeds alone would give, so a verdict on one seed is conservative.
Pairing matters: the variant and the base of one replicate share the cell and the data order (and, unless the
variant changes the seed, the initialisation), so the noise they share cancels in the difference.
"""
import math
import statistics

from scipy.stats import t as student_t

LEVEL = 0.95


def cell_of(row):
    return (float(row["flops_budget"]), int(row["r"]), int(row["d_model"]))


def paired_differences(base_replicates, variant_replicates, looped_only=True):
    """{(budget, r, d): {replicate: variant val loss - base val loss}} over the (cell, replicate) pairs both arms
    trained. A replicate is one list of rows per seed of the harness (dev/ablate.sh --seeds: replicate i of the
    base trained with seed i, of the variant with its own seed + i), so a variant that only changes the seed is a
    null ablation. r = 1 is left out by default (an ablation leaves the r = 1 runs as they are), and so is a run
    both arms share (the same run_id, reused): its difference of 0 is not a measurement."""
    pairs = {}
    for replicate, (base_rows, variant_rows) in enumerate(zip(base_replicates, variant_replicates)):
        base = {cell_of(row): row for row in base_rows}
        for row in variant_rows:
            cell = cell_of(row)
            if looped_only and cell[1] == 1:
                continue
            if cell not in base or row.get("run_id", "variant") == base[cell].get("run_id", "base"):
                continue  # not trained by the base, or the same run in both arms (reused): no comparison
            pairs.setdefault(cell, {})[replicate] = float(row["val_loss"]) - float(base[cell]["val_loss"])
    return pairs


def mean_and_error(pairs):
    """(mean over cells of each cell's mean difference, its standard error, degrees of freedom), as the module
    docstring says: within-cell seed spread where cells have two or more seeds, else the spread across cells."""
    cell_means = [statistics.fmean(by_seed.values()) for by_seed in pairs.values()]
    mean = statistics.fmean(cell_means)
    n_cells = len(cell_means)
    df = sum(len(by_seed) - 1 for by_seed in pairs.values())
    if df > 0:
        squares = sum((x - statistics.fmean(by_seed.values())) ** 2
                      for by_seed in pairs.values() for x in by_seed.values())
        pooled = squares / df
        variance_of_mean = sum(pooled / len(by_seed) for by_seed in pairs.values()) / n_cells ** 2
        return mean, math.sqrt(variance_of_mean), df
    if n_cells < 2:
        return mean, math.inf, 0
    return mean, statistics.stdev(cell_means) / math.sqrt(n_cells), n_cells - 1


def verdict(pairs):
    """The dict of one verdict: mean, ci (lo, hi), half_width (the smallest effect this design can see), df,
    n_cells, n_seeds (the most at a cell), n_pairs and word: "better" (the CI lies below 0: a lower loss),
    "worse" (above 0) or "no difference" (the CI covers 0). None without pairs."""
    if not pairs:
        return None
    mean, error, df = mean_and_error(pairs)
    half_width = math.inf
    if df > 0:
        half_width = student_t.ppf(0.5 + LEVEL / 2, df) * error
    lo, hi = mean - half_width, mean + half_width
    word = "no difference"
    if hi < 0:
        word = "better"
    elif lo > 0:
        word = "worse"
    return {"mean": mean, "ci": [lo, hi], "half_width": half_width, "df": df, "word": word,
            "n_cells": len(pairs), "n_seeds": max(len(by_seed) for by_seed in pairs.values()),
            "n_pairs": sum(len(by_seed) for by_seed in pairs.values())}


def verdict_line(label, v):
    """One line: the word, the mean difference with its 95% CI, the design, and the power (the half-width)."""
    if v is None:
        return f"{label}: no paired runs"
    design = f"{v['n_cells']} cells x {v['n_seeds']} seed(s), t-interval with {v['df']} df"
    if not math.isfinite(v["half_width"]):
        return f"{label}: cannot tell: {v['mean']:+.3f} nats from one pair, no noise estimate ({design})"
    lo, hi = v["ci"]
    numbers = f"{v['mean']:+.3f} nats [{lo:+.3f}, {hi:+.3f}], 95% CI ({design})"
    if v["word"] == "no difference":
        return f"{label}: no difference larger than ±{v['half_width']:.3f} nats: {numbers}"
    return f"{label}: {v['word']} by {abs(v['mean']):.3f} nats: {numbers}; power ±{v['half_width']:.3f}"


def verdicts_by_r(pairs):
    """{label: verdict} per looped r, then pooled over every looped r ("all r") where there is more than one."""
    out = {}
    loop_counts = sorted({cell[1] for cell in pairs})
    for r in loop_counts:
        out[f"r = {r}"] = verdict({cell: by_seed for cell, by_seed in pairs.items() if cell[1] == r})
    if len(loop_counts) > 1:
        out["all r"] = verdict(pairs)
    return out


def expected_half_width(seed_sd, n_cells, n_seeds):
    """The 95% half-width a design of n_cells x n_seeds paired runs should give when each run's loss carries
    seed noise seed_sd, independent between the arms, so a difference has sd sqrt(2) seed_sd: an upper bound,
    since a variant paired with its base on the same seed and data order shares some of it (dev/README.md, "The
    verdict and the power"). One seed per cell takes its df from the cells, and the spread of the effect across
    cells adds to it."""
    difference_sd = math.sqrt(2) * seed_sd
    df = n_cells * (n_seeds - 1)
    if n_seeds == 1:
        df = n_cells - 1
    return student_t.ppf(0.5 + LEVEL / 2, df) * difference_sd / math.sqrt(n_cells * n_seeds)
