"""
The verdict of an ablation: does a change help, hurt, or can't this design tell? From the runs of the variant
and the base at the cells and seeds of the harness, the mean difference in validation loss (variant - base) with
a 95% confidence interval, and the word that follows from it. dev/ablation_report.py prints it first.

    verdicts, differences = compare(base_replicates, variant_replicates)  # a replicate: one seed's rows
    verdicts["r = 4"]  # mean, ci, half_width, df, word, n_cells, n_seeds, n_base_seeds, design, inflation
    verdict_line("r = 4", verdicts["r = 4"])  # 'r = 4: better by 0.031 nats: -0.031 nats [-0.040, -0.022], ...'

Its estimand is the mean effect over the ablation's own cells, each weighted equally (the cells are the design,
fixed), so its noise is what new seeds would change. Two designs, chosen by the replicates there are, never by
the result:
  - paired (the variant's replicate i against the base's replicate i, which shares its cell, data order and,
    unless the variant changes the seed, initialisation): where the base has no more replicates than the variant.
    The noise the two runs share cancels in the difference;
  - against every base replicate (the variant's mean over its k seeds against the base's over all its K > k, the
    committed quiet base's 11): where the base has more replicates and the variant two or more. Each arm's noise
    is its own pooled within-cell variance (a change can alter it: hyperconnections halve it), the df Welch's.
    Pairing pays only where the arms share their noise, and a change of the model's wiring shares almost none of
    it (paired correlation 0.02 for gated injection, 0.46 for hyperconnections, 0.55 for a lower LR); the base's
    extra seeds pay always. Measured on the committed quick quiet arms at 4 seeds (dev/verdict_designs.py):
    ±0.011 against ±0.013 paired (gated), ±0.009 against ±0.010 (hyperconnections), ±0.012 against ±0.010 (the
    LR arm, whose pairing pays); over 2,000 nulls drawn from the quiet recipe's 22 committed seeds, a median
    ±0.014 against ±0.017, each covering 0 in 95% (dev/README.md, "The verdict and the power").
A seed's runs at different cells are not independent (its initialisation and data order are shared, and the same
width at two budgets shares the first steps too: correlation 0.64 there), so its mean over the cells varies more
than the within-cell spread says (x1.23 in variance over the 22 seeds); left alone, the nulls above covered 0 in
92%, not 95%. design_effect measures it on the base's replicates and both designs scale the seeds' variance by it.
The interval is a t-interval, not a bootstrap: with 7 cells and a few seeds a bootstrap's resamples are too few
to give a 95% tail, while the t-interval is exact for normal noise, and the seed noise of the CPU grids is. With
two or more seeds at a cell the noise is the seeds' spread within cells (the pooled within-cell variance; df: the
seeds beyond the first, summed over cells); with one seed per cell the spread of the differences across cells,
which also holds how the effect varies from cell to cell: wider than the seeds alone, so conservative.
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


def mean_and_error(pairs, inflation=1.0):
    """(mean over cells of each cell's mean difference, its standard error, degrees of freedom), as the module
    docstring says: within-cell seed spread (its variance times inflation: design_effect) where cells have two or
    more seeds, else the spread across cells."""
    cell_means = [statistics.fmean(by_seed.values()) for by_seed in pairs.values()]
    mean = statistics.fmean(cell_means)
    n_cells = len(cell_means)
    pooled, df = pooled_variance([list(by_seed.values()) for by_seed in pairs.values()])
    if df > 0:
        variance_of_mean = sum(pooled / len(by_seed) for by_seed in pairs.values()) / n_cells ** 2
        return mean, math.sqrt(variance_of_mean * inflation), df
    if n_cells < 2:
        return mean, math.inf, 0
    return mean, statistics.stdev(cell_means) / math.sqrt(n_cells), n_cells - 1


def verdict(pairs, inflation=1.0):
    """The dict of one paired verdict (judged) from {cell: {replicate: variant - base}}, the seeds' variance
    times inflation (design_effect). None without pairs."""
    if not pairs:
        return None
    mean, error, df = mean_and_error(pairs, inflation)
    seeds = max(len(by_seed) for by_seed in pairs.values())
    return judged(mean, error, df, len(pairs), seeds, seeds, "paired", inflation)


def losses_by_cell(base_replicates, variant_replicates, looped_only=True):
    """{(budget, r, d): ({replicate: the base's val loss}, {replicate: the variant's})} at the cells both arms
    trained, leaving out what paired_differences does: r = 1 by default, and a cell whose variant run
    is one of the base's (the same run_id, reused)."""
    arms = []
    for replicates in (base_replicates, variant_replicates):
        losses, run_ids = {}, {}
        for replicate, rows in enumerate(replicates):
            for row in rows:
                losses.setdefault(cell_of(row), {})[replicate] = float(row["val_loss"])
                run_ids.setdefault(cell_of(row), set()).add(row.get("run_id"))
        arms.append((losses, run_ids))
    (base, base_ids), (variant, variant_ids) = arms
    cells = {}
    for cell, losses in variant.items():
        if looped_only and cell[1] == 1:
            continue
        if cell not in base or (variant_ids[cell] & base_ids[cell]) - {None}:
            continue
        cells[cell] = (base[cell], losses)
    return cells


def design_effect(base_by_cell):
    """How much more a seed's mean over the cells varies than independent cells would make it, from the base's
    replicates that hold every cell ({cell: {replicate: loss}}): a seed's runs share its initialisation and data
    order, and the same width at two budgets shares both (the quiet recipe's 22 seeds: variance x1.23, correlation
    up to 0.64; dev/verdict_designs.py), which the within-cell spread does not see. At least 1; 1 with fewer than
    3 such replicates."""
    common = set.intersection(*(set(by_replicate) for by_replicate in base_by_cell.values()))
    if len(common) < 3 or len(base_by_cell) < 2:
        return 1.0
    columns = [[by_replicate[i] for i in sorted(common)] for by_replicate in base_by_cell.values()]
    seed_means = [statistics.fmean(losses) for losses in zip(*columns)]
    independent = sum(statistics.variance(column) for column in columns) / len(columns) ** 2
    if independent == 0:
        return 1.0
    return max(1.0, statistics.variance(seed_means) / independent)


def pooled_variance(samples):
    """(the within-sample variance pooled over samples, weighted by their df; the df), (0, 0) with no df."""
    df = sum(len(values) - 1 for values in samples)
    if df == 0:
        return 0.0, 0
    squares = sum((x - statistics.fmean(values)) ** 2 for values in samples for x in values)
    return squares / df, df


def verdict_against_base_seeds(cells, inflation=1.0):
    """The dict of one verdict (judged) from {cell: ([base losses], [variant losses])}: the mean over cells of the
    variant's mean minus the base's, its error from each arm's own pooled within-cell variance (times inflation:
    design_effect), Welch's df."""
    if not cells:
        return None
    n_cells = len(cells)
    mean = statistics.fmean(statistics.fmean(variant) - statistics.fmean(base) for base, variant in cells.values())
    base_variance, base_df = pooled_variance([base for base, _ in cells.values()])
    variant_variance, variant_df = pooled_variance([variant for _, variant in cells.values()])
    base_part = sum(base_variance / len(base) for base, _ in cells.values()) / n_cells ** 2
    variant_part = sum(variant_variance / len(variant) for _, variant in cells.values()) / n_cells ** 2
    error, df = math.inf, 0
    if base_df > 0 and variant_df > 0:
        error = math.sqrt((base_part + variant_part) * inflation)
        df = (base_part + variant_part) ** 2 / (base_part ** 2 / base_df + variant_part ** 2 / variant_df)
    seeds = max(len(variant) for _, variant in cells.values())
    base_seeds = max(len(base) for base, _ in cells.values())
    return judged(mean, error, df, n_cells, seeds, base_seeds, "against every base seed", inflation)


def judged(mean, error, df, n_cells, n_seeds, n_base_seeds, design, inflation):
    """The dict of one verdict: mean, ci (lo, hi), half_width (the smallest effect this design can see), df,
    n_cells, n_seeds (the variant's, the most at a cell), n_base_seeds, design, inflation (of the seeds' variance:
    design_effect), and word: "better" (the CI lies below 0: a lower loss), "worse" (above 0) or "no difference"
    (the CI covers 0)."""
    half_width = math.inf
    if df > 0:
        half_width = student_t.ppf(0.5 + LEVEL / 2, df) * error
    lo, hi = mean - half_width, mean + half_width
    word = "no difference"
    if hi < 0:
        word = "better"
    elif lo > 0:
        word = "worse"
    return {"mean": mean, "ci": [lo, hi], "half_width": half_width, "df": df, "word": word, "n_cells": n_cells,
            "n_seeds": n_seeds, "n_base_seeds": n_base_seeds, "design": design, "inflation": inflation}


def compare(base_replicates, variant_replicates, looped_only=True):
    """({label: verdict} per looped r and pooled, {cell: [the variant's seeds' differences]} for a figure), each
    verdict in the design its cells allow (judge): against every base seed, each seed's difference is from the
    base's mean; paired, each replicate's from the base's replicate."""
    losses = losses_by_cell(base_replicates, variant_replicates, looped_only)
    pairs = paired_differences(base_replicates, variant_replicates, looped_only)
    cells = {cell: (losses[cell], by_seed) for cell, by_seed in pairs.items() if cell in losses}
    verdicts = verdicts_by_r(cells, judge)
    differences = {}
    for cell, ((base, variant), by_seed) in cells.items():
        differences[cell] = list(by_seed.values())
        if verdicts[f"r = {cell[1]}"]["design"] == "against every base seed":
            differences[cell] = [x - statistics.fmean(base.values()) for x in variant.values()]
    return verdicts, differences


def judge(cells):
    """One verdict over {cell: (({replicate: base loss}, {replicate: variant loss}), {replicate: difference})}:
    against every base seed where at every cell the variant has two or more seeds and the base more than the
    variant (the module docstring), else paired; the seeds' variance times the base's design_effect. None
    without cells."""
    if not cells:
        return None
    inflation = design_effect({cell: base for cell, ((base, _), _) in cells.items()})
    if all(len(variant) >= 2 and len(base) > len(variant) for (base, variant), _ in cells.values()):
        arms = {cell: (list(base.values()), list(variant.values())) for cell, ((base, variant), _) in cells.items()}
        return verdict_against_base_seeds(arms, inflation)
    return verdict({cell: by_seed for cell, (_, by_seed) in cells.items()}, inflation)


def verdict_line(label, v):
    """One line: the word, the mean difference with its 95% CI, the design, and the power (the half-width)."""
    if v is None:
        return f"{label}: no paired runs"
    design = f"{v['n_cells']} cells x {v['n_seeds']} seed(s), t-interval with {v['df']} df"
    if v["design"] == "against every base seed":
        design = (f"{v['n_cells']} cells x {v['n_seeds']} seed(s) against the base's {v['n_base_seeds']}, Welch "
                  f"t-interval with {v['df']:.0f} df")
    if v["inflation"] > 1:
        design += f", the seeds' variance x{v['inflation']:.2f} as a seed's cells covary"
    if not math.isfinite(v["half_width"]):
        return f"{label}: cannot tell: {v['mean']:+.3f} nats from one pair, no noise estimate ({design})"
    lo, hi = v["ci"]
    numbers = f"{v['mean']:+.3f} nats [{lo:+.3f}, {hi:+.3f}], 95% CI ({design})"
    if v["word"] == "no difference":
        return f"{label}: no difference larger than ±{v['half_width']:.3f} nats: {numbers}"
    return f"{label}: {v['word']} by {abs(v['mean']):.3f} nats: {numbers}; power ±{v['half_width']:.3f}"


def verdicts_by_r(cells, judge=verdict):
    """{label: judge(cells of that r)} per looped r, then pooled over every looped r ("all r") where there is
    more than one; cells: {(budget, r, d): what judge takes of a cell}."""
    out = {}
    loop_counts = sorted({cell[1] for cell in cells})
    for r in loop_counts:
        out[f"r = {r}"] = judge({cell: of_cell for cell, of_cell in cells.items() if cell[1] == r})
    if len(loop_counts) > 1:
        out["all r"] = judge(cells)
    return out


def expected_half_width(seed_sd, n_cells, n_seeds, n_base_seeds=1):
    """The 95% half-width a design of n_cells x n_seeds of the variant against n_base_seeds of the base should
    give (compare's design for those counts) when each run's loss carries seed noise seed_sd, independent
    between the arms: paired, a difference has sd sqrt(2) seed_sd, an upper bound, since a variant paired with
    its base on the same seed and data order shares some of it (dev/README.md, "The verdict and the power"); one
    seed per cell takes its df from the cells, and the spread of the effect across cells adds to it. Against
    every base seed, seed_sd sqrt(1/n_seeds + 1/n_base_seeds), with Welch's df for equal noise in the arms."""
    if n_seeds >= 2 and n_base_seeds > n_seeds:
        variant_part, base_part = 1 / n_seeds, 1 / n_base_seeds
        df = (variant_part + base_part) ** 2 / (variant_part ** 2 / (n_cells * (n_seeds - 1)) +
                                                base_part ** 2 / (n_cells * (n_base_seeds - 1)))
        return student_t.ppf(0.5 + LEVEL / 2, df) * seed_sd * math.sqrt((variant_part + base_part) / n_cells)
    difference_sd = math.sqrt(2) * seed_sd
    df = n_cells * (n_seeds - 1)
    if n_seeds == 1:
        df = n_cells - 1
    return student_t.ppf(0.5 + LEVEL / 2, df) * difference_sd / math.sqrt(n_cells * n_seeds)
