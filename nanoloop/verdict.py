"""
The verdict of an ablation: does a change help, hurt, or can't this design tell? From the runs of the variant
and the base at the cells and seeds of the harness, the mean difference in validation loss (variant - base) with
a 95% confidence interval, and the word that follows from it. dev/ablation_report.py prints it first.

    verdicts, differences = compare(base_replicates, variant_replicates)  # a replicate: one seed's rows
    verdicts["r = 4"]  # mean, ci, half_width, df, word, n_cells, n_seeds, n_base_seeds, design, inflation (, beta)
    verdict_line("r = 4", verdicts["r = 4"])  # 'r = 4: better by 0.031 nats: -0.031 nats [-0.040, -0.022], ...'

Its estimand is the mean effect over the ablation's own cells, each weighted equally (the cells are the design,
fixed), so its noise is what new seeds would change. The variant's replicate i is paired with the base's i (same
cell, data order and, unless the variant changes the seed, initialisation), so the noise the two runs share
cancels in the difference; where the base has more replicates than the variant (the committed quiet base: 11),
its other seeds are a regression control (double sampling, verdict_with_base_control): a paired base seed that
fell above the base's mean is corrected for as far as the differences follow it. That takes the better of two
designs with no choice made from the result: a change that leaves the trajectory alike keeps what pairing gives
(random state init, 3 seeds: ±0.0025, pairing alone ±0.0023, the variant unpaired against all 11 base seeds
±0.017), and a change that shares no noise with the base gains its extra seeds (the null: ±0.011 against pairing
alone's ±0.016, unpaired ±0.010); hyperconnections and LR 0.007, whose pairing pays partly, come out narrower than
either (dev/verdict_designs.py, dev/README.md "The verdict and the power").
A seed's runs at different cells are not independent (its initialisation and data order are shared, and the same
width at two budgets shares the first steps too: correlation 0.64 there), so its mean over the cells varies more
than the within-cell spread says (x1.23 in variance over the quiet recipe's 22 committed seeds); left alone, nulls
drawn from those seeds covered 0 in 92%, not 95%. design_effect measures it on the base's replicates and scales
the seeds' variance by it: 93-94%.
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
    docstring says: within-cell seed spread where cells have two or more seeds, else the spread across cells;
    either variance times inflation (design_effect): the spread across one seed's cells misses what they share,
    and the mean over them carries it."""
    cell_means = [statistics.fmean(by_seed.values()) for by_seed in pairs.values()]
    mean = statistics.fmean(cell_means)
    n_cells = len(cell_means)
    pooled, df = pooled_variance([list(by_seed.values()) for by_seed in pairs.values()])
    if df > 0:
        variance_of_mean = sum(pooled / len(by_seed) for by_seed in pairs.values()) / n_cells ** 2
        return mean, math.sqrt(variance_of_mean * inflation), df
    if n_cells < 2:
        return mean, math.inf, 0
    return mean, statistics.stdev(cell_means) / math.sqrt(n_cells) * math.sqrt(inflation), n_cells - 1


def verdict(pairs, inflation=1.0):
    """The dict of one paired verdict (judged) from {cell: {replicate: variant - base}}, the seeds' variance
    times inflation (design_effect). None without pairs."""
    if not pairs:
        return None
    mean, error, df = mean_and_error(pairs, inflation)
    seeds = max(len(by_seed) for by_seed in pairs.values())
    return judged(mean, error, df, {"n_cells": len(pairs), "n_seeds": seeds, "n_base_seeds": seeds,
                                    "design": "paired", "inflation": inflation})


def losses_by_replicate(replicates):
    """{(budget, r, d): {replicate: val loss}} over every replicate's rows (replicate i: the i-th list of rows)."""
    losses = {}
    for replicate, rows in enumerate(replicates):
        for row in rows:
            losses.setdefault(cell_of(row), {})[replicate] = float(row["val_loss"])
    return losses


def losses_by_cell(base_replicates, variant_replicates, looped_only=True):
    """{(budget, r, d): ({replicate: the base's val loss}, {replicate: the variant's})} at the cells both arms
    trained, leaving out what paired_differences does: r = 1 by default, and a cell whose variant run
    is one of the base's (the same run_id, reused)."""
    base, variant = losses_by_replicate(base_replicates), losses_by_replicate(variant_replicates)
    base_ids = {(cell_of(row), row.get("run_id")) for rows in base_replicates for row in rows}
    shared = {cell_of(row) for rows in variant_replicates for row in rows
              if row.get("run_id") is not None and (cell_of(row), row["run_id"]) in base_ids}
    cells = {}
    for cell, losses in variant.items():
        if looped_only and cell[1] == 1:
            continue
        if cell not in base or cell in shared:
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
    means = [statistics.fmean(values) for values in samples]  # each once, not once per value
    squares = sum((x - mean) ** 2 for values, mean in zip(samples, means) for x in values)
    return squares / df, df


def control_terms(cells):
    """Per cell of {cell: ({replicate: base loss}, {replicate: variant loss})}: (the paired differences d over the
    replicates both arms have, the base's losses b at those replicates, the base's mean over all its K replicates,
    K)."""
    terms = []
    for base, variant in cells.values():
        paired = sorted(set(base) & set(variant))
        terms.append(([variant[i] - base[i] for i in paired], [base[i] for i in paired],
                      statistics.fmean(base.values()), len(base)))
    return terms


def verdict_with_base_control(cells, inflation=1.0):
    """The dict of one verdict (judged) from {cell: ({replicate: base loss}, {replicate: variant loss})} where the
    base has more replicates than the variant: double sampling for regression (Cochran, Sampling Techniques, 1977,
    §12.6). At each cell the paired differences' mean d̄ is corrected by how far its k base seeds fell from all the
    base's K: d̄ - beta (b̄_k - b̄_K), beta the regression of d on b pooled within cells. Its variance per cell is
    S_resid / k + (S_dd - S_resid) / K (S_dd the differences' variance, S_resid what b leaves of it), times
    inflation (design_effect); df: the pairs' within-cell df, less one for beta."""
    terms = control_terms(cells)
    dd = db = bb = 0.0  # within-cell sums of squares and products of d and b, pooled over the cells
    for d, b, _, _ in terms:
        d_mean, b_mean = statistics.fmean(d), statistics.fmean(b)
        dd += sum((x - d_mean) ** 2 for x in d)
        db += sum((x - d_mean) * (y - b_mean) for x, y in zip(d, b))
        bb += sum((y - b_mean) ** 2 for y in b)
    df = sum(len(d) - 1 for d, _, _, _ in terms) - 1
    beta = 0.0
    if bb > 0:
        beta = db / bb
    s_dd = dd / (df + 1)
    s_resid = (dd - db * beta) / (df + 1)
    n_cells = len(terms)
    # how far each cell's paired base seeds fell from the base's mean over all its seeds
    shifts = [statistics.fmean(b) - base_mean for _, b, base_mean, _ in terms]
    mean = statistics.fmean(statistics.fmean(d) - beta * shift for (d, _, _, _), shift in zip(terms, shifts))
    variance = sum(s_resid / len(d) + (s_dd - s_resid) / n_base for d, _, _, n_base in terms) / n_cells ** 2
    # beta is estimated, and one beta corrects every cell: its error moves the mean by the cells' mean shift
    if bb > 0:
        variance += statistics.fmean(shifts) ** 2 * s_resid / bb
    seeds = max(len(d) for d, _, _, _ in terms)
    base_seeds = max(n_base for _, _, _, n_base in terms)
    return judged(mean, math.sqrt(variance * inflation), df,
                  {"n_cells": n_cells, "n_seeds": seeds, "n_base_seeds": base_seeds, "design": "paired, base control",
                   "inflation": inflation, "beta": beta})


def judged(mean, error, df, design):
    """The dict of one verdict: mean, ci (lo, hi), half_width (the smallest effect this design can see), df and
    word: "better" (the CI lies below 0: a lower loss), "worse" (above 0) or "no difference" (the CI covers 0);
    then the design's own entries: n_cells, n_seeds (the variant's, the most at a cell), n_base_seeds, design,
    inflation (of the seeds' variance: design_effect) and, with the base control, beta."""
    half_width = math.inf
    if df > 0:
        half_width = student_t.ppf(0.5 + LEVEL / 2, df) * error
    lo, hi = mean - half_width, mean + half_width
    word = "no difference"
    if hi < 0:
        word = "better"
    elif lo > 0:
        word = "worse"
    return {"mean": mean, "ci": [lo, hi], "half_width": half_width, "df": df, "word": word} | design


def compare(base_replicates, variant_replicates, looped_only=True):
    """({label: verdict} per looped r and pooled, {cell: [the variant's seeds' differences]} for a figure), each
    verdict in the design its cells allow (judge); with the base's other seeds as a control, each paired
    difference carries its cell's correction."""
    cells = {}
    for cell, (base, variant) in losses_by_cell(base_replicates, variant_replicates, looped_only).items():
        by_seed = {i: loss - base[i] for i, loss in variant.items() if i in base}  # paired_differences' pairs
        if by_seed:
            cells[cell] = ((base, variant), by_seed)
    verdicts = verdicts_by_r(cells, judge)
    differences = {}
    for cell, ((base, _), by_seed) in cells.items():
        correction = 0.0
        v = verdicts[f"r = {cell[1]}"]
        if v["design"] == "paired, base control":
            paired_base = statistics.fmean(base[i] for i in by_seed)
            correction = v["beta"] * (paired_base - statistics.fmean(base.values()))
        differences[cell] = [x - correction for x in by_seed.values()]
    return verdicts, differences


def judge(cells):
    """One verdict over {cell: (({replicate: base loss}, {replicate: variant loss}), {replicate: difference})}:
    paired, with the base's other seeds as a control where at every cell the variant has two or more seeds and
    the base more than the variant (the module docstring), else paired alone; the seeds' variance times the
    base's design_effect. None without cells."""
    if not cells:
        return None
    inflation = design_effect({cell: base for cell, ((base, _), _) in cells.items()})
    if all(len(variant) >= 2 and len(base) > len(variant) for (base, variant), _ in cells.values()):
        return verdict_with_base_control({cell: arms for cell, (arms, _) in cells.items()}, inflation)
    return verdict({cell: by_seed for cell, (_, by_seed) in cells.items()}, inflation)


def verdict_line(label, v):
    """One line: the word, the mean difference with its 95% CI, the design, and the power (the half-width)."""
    if v is None:
        return f"{label}: no paired runs"
    design = f"{v['n_cells']} cells x {v['n_seeds']} seed(s), t-interval with {v['df']} df"
    if v["design"] == "paired, base control":
        design = (f"{v['n_cells']} cells x {v['n_seeds']} seed(s) paired, the base's {v['n_base_seeds']} a control "
                  f"(beta {v['beta']:+.2f}), t-interval with {v['df']} df")
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
    between the arms: an upper bound, since a variant paired with its base on the same seed and data order shares
    some of it (dev/README.md, "The verdict and the power"). Paired alone, a difference has sd sqrt(2) seed_sd;
    one seed per cell takes its df from the cells, and the spread of the effect across cells adds to it. With the
    base's other seeds as a control, independent arms leave seed_sd^2 (1/n_seeds + 1/n_base_seeds)."""
    if n_seeds >= 2 and n_base_seeds > n_seeds:
        df = n_cells * (n_seeds - 1) - 1
        variance = seed_sd ** 2 * (1 / n_seeds + 1 / n_base_seeds) / n_cells
        return student_t.ppf(0.5 + LEVEL / 2, df) * math.sqrt(variance)
    difference_sd = math.sqrt(2) * seed_sd
    df = n_cells * (n_seeds - 1)
    if n_seeds == 1:
        df = n_cells - 1
    return student_t.ppf(0.5 + LEVEL / 2, df) * difference_sd / math.sqrt(n_cells * n_seeds)
