"""
The verdict of an ablation (nanoloop/verdict.py, printed first by dev/ablation_report.py): the mean difference with
a 95% t-interval and the word that follows from it, paired by seed and, where the base has more seeds than the
variant, with the base's other seeds as a control. Calibrated: a null ablation (the same distribution, other seeds)
covers 0 in 95% of repeats, on synthetic rows and on nulls drawn from the quiet recipe's 22 committed seeds, also
where a seed's cells covary; a change of known large effect (hyperconnections at r = 4, the committed grids) comes
out better; the interval narrows with seeds as sqrt(seeds) when the noise is seeds'.
"""
import json
import math
import random
from pathlib import Path

from scipy.stats import t as student_t

from nanoloop.verdict import (compare, paired_differences, verdict, verdict_line, verdict_with_base_control,
                              verdicts_by_r)

RESULTS = Path(__file__).resolve().parents[1] / "dev" / "results"
CELLS = [(1.1e12, 4, 8), (1.1e12, 4, 16), (1.1e12, 4, 24), (2.4e12, 4, 8), (2.4e12, 4, 16), (2.4e12, 4, 24),
         (2.4e12, 4, 32)]  # dev/ablate.sh --quick's looped cells


def row(cell, loss):
    budget, r, d = cell
    return {"flops_budget": budget, "r": r, "d_model": d, "val_loss": loss}


def synthetic_arms(rng, seeds, effect, seed_sd, shared_sd=0.0):
    """(base replicates, variant replicates): per cell a true loss, per (cell, seed) a noise both arms share
    (shared_sd: what pairing cancels) and each arm's own seed noise (seed_sd)."""
    base, variant = [], []
    truth = {cell: 5.0 + 0.1 * rng.random() for cell in CELLS}
    for _ in range(seeds):
        shared = {cell: rng.gauss(0, shared_sd) for cell in CELLS}
        base.append([row(c, truth[c] + shared[c] + rng.gauss(0, seed_sd)) for c in CELLS])
        variant.append([row(c, truth[c] + effect + shared[c] + rng.gauss(0, seed_sd)) for c in CELLS])
    return base, variant


def arms_with_seed_offsets(rng, seeds, base_seeds, cell_sd, offset_sd):
    """(base replicates, variant replicates) of a null: per replicate one offset shared by all its cells (offset_sd:
    a seed's initialisation and data order, which every cell of that seed carries) and each cell's own noise."""
    truth = {cell: 5.0 + 0.1 * rng.random() for cell in CELLS}

    def replicate():
        offset = rng.gauss(0, offset_sd)
        return [row(c, truth[c] + offset + rng.gauss(0, cell_sd)) for c in CELLS]
    return [replicate() for _ in range(base_seeds)], [replicate() for _ in range(seeds)]


def covered_share(rng, repeats, seeds, base_seeds, cell_sd, offset_sd):
    covered = 0
    for _ in range(repeats):
        v = compare(*arms_with_seed_offsets(rng, seeds, base_seeds, cell_sd, offset_sd))[0]["r = 4"]
        covered += v["ci"][0] <= 0 <= v["ci"][1]
    return covered / repeats


def test_a_null_ablation_covers_zero_in_95_percent_of_repeats():
    rng = random.Random(0)
    for seeds in (1, 3):
        covered = 0
        for _ in range(600):
            v = verdict(paired_differences(*synthetic_arms(rng, seeds, 0.0, 0.02)))
            covered += v["ci"][0] <= 0 <= v["ci"][1]
        assert 0.93 <= covered / 600 <= 0.97, (seeds, covered)


def test_with_the_bases_other_seeds_a_control_a_null_covers_zero_in_95_percent_of_repeats():
    """3 seeds of the variant against the base's 11 (the quiet base's count): the design the verdict takes then."""
    share = covered_share(random.Random(3), 600, 3, 11, 0.02, 0.0)
    assert 0.93 <= share <= 0.98, share  # at least 95%: the design effect is floored at 1


def test_a_seeds_covarying_cells_widen_the_interval_to_keep_it_95_percent():
    """When every cell of a seed shares an offset (here variance 1 + 7 x 0.25 = 2.75 times what independent cells
    give a seed's mean), the within-cell spread cannot see it: the base's replicates measure it (design_effect)
    and the verdict's variance carries it, so a null still covers 0 in ~93%, not the ~80% it would without."""
    share = covered_share(random.Random(4), 600, 3, 11, 0.02, 0.01)
    assert share >= 0.90, share
    v = compare(*arms_with_seed_offsets(random.Random(5), 3, 11, 0.02, 0.01))[0]["r = 4"]
    assert v["design"] == "paired, base control" and v["inflation"] > 1.5


def test_one_seed_against_a_replicated_base_carries_the_seeds_covarying_cells_too():
    """One variant seed (a first quick arm on the quiet base's 11): the noise is the spread across cells, which
    misses the offset a seed's cells share, while their mean carries all of it. The base's replicates measure it
    there as well, and the interval carries it: a null covers 0 in ~95%, not the ~80% the spread alone gives."""
    share = covered_share(random.Random(6), 600, 1, 11, 0.02, 0.01)
    assert share >= 0.92, share
    v = compare(*arms_with_seed_offsets(random.Random(7), 1, 11, 0.02, 0.01))[0]["r = 4"]
    assert v["design"] == "paired" and v["df"] == len(CELLS) - 1 and v["inflation"] > 1.5


def test_the_base_control_corrects_the_paired_seeds_by_how_far_they_fell_from_the_bases_mean():
    """One cell: the base over 5 seeds (mean 5.06), the variant at its first 3, each paired difference -0.1 plus half
    the base seed's deviation from their mean (d = -0.11, -0.10, -0.09 at b = 5.00, 5.02, 5.04). The regression of d
    on b is exactly 0.5 with nothing left over, so the paired mean -0.10 is corrected by 0.5 x (5.02 - 5.06) to
    -0.08, and its only noise is the base's mean over 5 seeds: variance var(d) / 5, on 3 - 1 - 1 = 1 df."""
    base = {0: 5.00, 1: 5.02, 2: 5.04, 3: 5.10, 4: 5.14}
    variant = {i: base[i] - 0.1 + 0.5 * (base[i] - 5.02) for i in range(3)}
    v = verdict_with_base_control({CELLS[0]: (base, variant)})
    assert math.isclose(v["beta"], 0.5) and math.isclose(v["mean"], -0.08) and v["df"] == 1
    assert math.isclose(v["half_width"], student_t.ppf(0.975, 1) * math.sqrt(0.0001 / 5), rel_tol=1e-6)
    assert (v["n_seeds"], v["n_base_seeds"], v["design"]) == (3, 5, "paired, base control")


def test_the_base_control_keeps_what_pairing_gives_and_adds_the_bases_seeds():
    """On the committed quiet arms at 3 seeds (dev/verdict_designs.py): random state init at r = 4 leaves the
    trajectory alike, so pairing cancels nearly all its noise (±0.002) where an unpaired comparison with the base's
    11 seeds sees ±0.017; the null shares nothing, and there the base's extra seeds narrow what pairing alone
    gives (±0.016). The verdict's design is within 20% of the better of the two in both."""
    import sys
    sys.path.insert(0, str(RESULTS.parent))
    import verdict_designs
    base = verdict_designs.looped(verdict_designs.replicates(verdict_designs.BASE))
    for arm in ("rsi", "null"):
        variant = verdict_designs.looped(verdict_designs.replicates(RESULTS / f"cpu-micro-{arm}-quick-quiet"))[:3]
        widths = {design: v["half_width"] for design, v in verdict_designs.verdicts(base, variant).items()}
        assert widths["control"] <= 1.2 * min(widths["paired"], widths["welch"]), (arm, widths)
    assert widths["control"] < 0.8 * widths["paired"]  # the null: the extra seeds pay


def test_the_design_follows_the_seeds_each_r_has():
    """The base's 5 replicates against the variant's 3 at r = 4: paired with the base's other seeds a control, each
    seed's difference for the figure carrying its cell's correction; at r = 1 one seed in each arm: paired alone.
    Equal seeds: paired alone."""
    rng = random.Random(6)
    base = [[row(c, 5.0 + rng.gauss(0, 0.02)) for c in CELLS] for _ in range(5)]
    variant = [[row(c, 4.9 + rng.gauss(0, 0.02)) for c in CELLS] for _ in range(3)]
    base[0].append(row((1.1e12, 1, 16), 5.1))
    variant[0].append(row((1.1e12, 1, 16), 5.2))
    verdicts, differences = compare(base, variant, looped_only=False)
    assert verdicts["r = 4"]["design"] == "paired, base control" and verdicts["r = 1"]["design"] == "paired"
    losses = [rows[0]["val_loss"] for rows in base]  # CELLS[0] over the base's replicates
    correction = verdicts["r = 4"]["beta"] * (sum(losses[:3]) / 3 - sum(losses) / 5)
    expected = [v[0]["val_loss"] - b[0]["val_loss"] - correction for v, b in zip(variant, base)]
    assert all(math.isclose(x, y) for x, y in zip(differences[CELLS[0]], expected))
    assert compare(base[:3], variant)[0]["r = 4"]["design"] == "paired"


def test_resampled_nulls_of_the_quiet_recipe_cover_zero_at_95_percent():
    """The quiet recipe's 22 committed seeds at the quick cells (the base's and the null arm's: one recipe), split
    at random into a variant of 4 seeds and a base of 11 (dev/verdict_designs.py): both designs cover 0 in ~95%
    (a seed's covarying cells accounted for; 94% measured over 2,000), and with the base's other seeds a control
    the interval is the narrower."""
    import sys
    sys.path.insert(0, str(RESULTS.parent))
    import verdict_designs
    coverage, widths = verdict_designs.null_coverage(verdict_designs.quiet_seeds(), 4, 11, 400, random.Random(0))
    assert coverage["paired"] >= 0.92 and coverage["control"] >= 0.92, coverage
    assert widths["control"] < 0.9 * widths["paired"], widths


def test_dev_readme_designs_table_is_what_verdict_designs_prints():
    """dev/README.md's per-arm table of the three designs (dev/verdict_designs.py's (a)) is this checkout's, line
    for line: the committed arms and the verdict's code cannot drift apart from the numbers it cites."""
    import sys
    sys.path.insert(0, str(RESULTS.parent))
    import verdict_designs
    lines = verdict_designs.arm_lines(verdict_designs.looped(verdict_designs.replicates(verdict_designs.BASE)))
    readme = (RESULTS.parent / "README.md").read_text().splitlines()
    assert all(line in readme for line in lines[1:]), lines


def test_pairing_cancels_the_noise_both_arms_share():
    """Base and variant of one (cell, seed) share most of their noise (the seed's initialisation and the data
    order): the paired difference sees a 0.02-nat effect that an unpaired comparison of the arms' means cannot."""
    base, variant = synthetic_arms(random.Random(1), 3, -0.02, 0.002, shared_sd=0.05)
    v = verdict(paired_differences(base, variant))
    assert v["word"] == "better" and v["half_width"] < 0.005


def test_the_interval_is_the_t_interval_of_the_seed_spread_within_cells():
    """Every cell's differences are m - a and m + a over two seeds: the pooled within-cell variance is 2a^2 on
    7 df, so the mean of 7 cells has the standard error a / sqrt(7). Cell means that agree exactly give no
    spread across cells: an interval from them (seeds ignored) would be 0 wide."""
    m, a = -0.01, 0.004
    pairs = {cell: {0: m - a, 1: m + a} for cell in CELLS}
    v = verdict(pairs)
    assert v["df"] == 7 and math.isclose(v["mean"], m)
    assert math.isclose(v["half_width"], student_t.ppf(0.975, 7) * a / math.sqrt(7), rel_tol=1e-9)


def test_more_seeds_narrow_the_interval_as_their_square_root():
    rng = random.Random(2)
    widths = {}
    for seeds in (2, 8):
        runs = [verdict(paired_differences(*synthetic_arms(rng, seeds, 0.0, 0.02)))["half_width"] for _ in range(200)]
        widths[seeds] = sum(runs) / len(runs)
    assert 1.7 <= widths[2] / widths[8] <= 2.6  # sqrt(4) = 2 (and t(7) / t(49) ~ 1.2 more)


def test_the_word_follows_the_interval_not_the_sign():
    def pairs_at(mean):
        return {cell: {0: mean - 0.01, 1: mean + 0.01} for cell in CELLS}
    assert verdict(pairs_at(-0.004))["word"] == "no difference"
    assert verdict(pairs_at(+0.004))["word"] == "no difference"
    assert verdict(pairs_at(-0.05))["word"] == "better" and verdict(pairs_at(+0.05))["word"] == "worse"
    line = verdict_line("r = 4", verdict(pairs_at(-0.004)))
    assert line.startswith("r = 4: no difference larger than ±0.0")
    assert "cannot tell" in verdict_line("r = 4", verdict({CELLS[0]: {0: -0.1}}))


def read_rows(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_hyperconnections_at_r4_come_out_better_on_the_committed_grids():
    """The known effect: hyperconnections (K = 2 lanes) at r = 4 lower the loss by ~0.14 nats against the base
    (cpu-micro-hyper against cpu-micro, one seed per cell): the verdict says better, its CI below -0.05."""
    base = read_rows(RESULTS / "cpu-micro" / "results.jsonl")
    hyper = read_rows(RESULTS / "cpu-micro-hyper" / "results.jsonl")
    verdicts = verdicts_by_r(paired_differences([base], [hyper]))
    assert verdicts["r = 4"]["word"] == "better" and verdicts["r = 4"]["ci"][1] < -0.05
    assert verdicts["r = 4"]["n_cells"] == 14 and verdicts["all r"]["word"] == "better"


def test_the_r1_runs_an_ablation_leaves_alone_are_not_pairs():
    base = [[row((1.1e12, 1, 16), 5.1), row((1.1e12, 4, 16), 5.2)]]
    variant = [[row((1.1e12, 1, 16), 5.1), row((1.1e12, 4, 16), 5.15)]]
    assert list(paired_differences(base, variant)) == [(1.1e12, 4, 16)]


def test_a_run_both_arms_share_is_not_a_pair():
    """The lr arm retrains r = 2 and 4 and reuses the base's r = 8 runs: a reused run (the same run_id) differs
    by 0 by construction, and counting it would narrow the CI with no measurement behind it."""
    shared = row((1.1e12, 8, 16), 5.3) | {"run_id": "a"}
    retrained = row((1.1e12, 4, 16), 5.2) | {"run_id": "b"}
    variant = [shared, row((1.1e12, 4, 16), 5.1) | {"run_id": "c"}]
    assert list(paired_differences([[shared, retrained]], [variant])) == [(1.1e12, 4, 16)]


def test_the_delta_phi_noise_is_zero_without_noise_and_grows_with_a_runs_noise():
    """dev/phi_noise.py (the full mode's Δφ floor by noise source): two arms with nothing changed and no noise refit
    to the same φ (Δφ exactly 0: the anchor shared, the refits alike); looped runs moved by 5x the noise move Δφ by
    more than twice as much (the same normal draws scaled: Δφ is near linear in a run's noise at these sizes)."""
    import sys
    sys.path.insert(0, str(RESULTS.parent))
    import phi_noise
    import fit_laws
    from diagnose_report import load
    import ablation_report
    rows = fit_laws.prepare_rows(ablation_report.layout_anchored_rows(
        load(ablation_report.BASE / "results.jsonl"), ablation_report.BASE))
    start = phi_noise.fit_joint(rows, restarts=20)["local_optima"]
    none = phi_noise.delta_phi_draws(rows, start, dict.fromkeys((1, 2, 4, 8), 0.0), draws=2, seed=0, restarts=2)
    assert none == [0.0, 0.0]
    small = phi_noise.delta_phi_draws(rows, start, {1: 0.0, 2: 0.01, 4: 0.01, 8: 0.01}, draws=3, seed=0, restarts=2)
    large = phi_noise.delta_phi_draws(rows, start, {1: 0.0, 2: 0.05, 4: 0.05, 8: 0.05}, draws=3, seed=0, restarts=2)
    assert sum(map(abs, large)) > 2 * sum(map(abs, small)) > 0
