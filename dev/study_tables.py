"""
The CPU study's tables (README "CPU-scale results", dev/README.md) from the committed rows and fits of
dev/results/cpu-micro{,-layout,-lr,-trunc,-hyper,-gated}: nothing here is typed in by hand, and a test checks that
the README's phi table is this script's.

    python dev/study_tables.py            # phi table, best width per (budget, r), the full loss grid
    python dev/study_tables.py --layout-anchored cpu-micro-trunc   # that grid's looped rows + the layout r = 1

Each grid's fit is `fit_laws.py <grid>/results.jsonl --json <grid>/fit/fit.json` (what sweep.sh runs);
delta-phi is `fit_laws.py cpu-micro/results.jsonl --compare <grid>/results.jsonl --json <grid>/fit/compare.json`.
The plain r = 1 does not identify phi here (dev/README.md, "The CPU study"), so each case study is also
fitted against the layout-matched r = 1: its rows with cpu-micro-layout's r = 1 runs in place of the
plain ones (<grid>/fit/layout_anchored.jsonl, written by --layout-anchored), and
`fit_laws.py cpu-micro-layout/results.jsonl --compare <grid>/fit/layout_anchored.jsonl --json <grid>/fit/compare_layout.json`.
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

import ablation_report
from diagnose_report import load  # dev/'s one JSONL reader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nanoloop.eval_tasks import category_losses, read_categories  # noqa: E402
from nanoloop.laws import ci_bounds_reached, estimate_text  # noqa: E402
from nanoloop.verdict import compare, paired_differences, verdicts_by_r  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
# grid folder, label, the paper's phi for it (iso-depth §4.2 and §5)
GRIDS = [("cpu-micro", "base (linear injection)", "0.46 [0.41, 0.53]"),
         ("cpu-micro-layout", "base, r = 1 in the looped layout", "-"),
         ("cpu-micro-lr", "base, r = 2 and 4 at their own MuonH LR", "-"),
         ("cpu-micro-trunc", "truncated BPTT, r_bwd = ceil(r/2)", "0.38"),
         ("cpu-micro-hyper", "hyperconnections, K = 2", "0.65"),
         ("cpu-micro-gated", "gated injection (dev/ablate.sh)", "-"),
         ("cpu-micro-untied", "base's looped runs against the untied model (dev/ablate.sh)", "-"),
         ("cpu-micro-quiet", "base on the quiet recipe (--quiet)", "-"),
         ("cpu-micro-gated-quiet", "gated injection, quiet recipe (dev/ablate.sh --quiet)", "-"),
         ("cpu-micro-trunc-quiet", "truncated BPTT, quiet recipe (dev/ablate.sh --quiet --grid)", "0.38")]
# each case study's base: its layout-matched anchor is <base>-layout's r = 1 runs
CASE_STUDIES = {"cpu-micro-trunc": "cpu-micro", "cpu-micro-hyper": "cpu-micro", "cpu-micro-gated": "cpu-micro",
                "cpu-micro-gated-quiet": "cpu-micro-quiet", "cpu-micro-trunc-quiet": "cpu-micro-quiet"}


def load_rows(grid):
    path = RESULTS / grid / "results.jsonl"
    return load(path) if path.exists() else []


def column(row):
    """Table column of a run: its r, marked for the case studies' variants and a run's own MuonH LR
    (sweep.sh names those runs _lr<value>)."""
    tag = {"hyper": " hc", "none": "", "linear": "", None: ""}.get(row.get("injection"), f" {row.get('injection')}")
    if "_lr" in Path(row["out"]).name:
        tag = f" lr{row['base_lrs']['matrix']:g}"
    if row["r"] == 1 and row.get("injection") not in (None, "none"):
        tag = " layout"
    if row.get("r_bwd") and row["r_bwd"] < row["r"]:
        tag = f" bwd{row['r_bwd']}"
    return f"r={row['r']}{tag}"


def layout_anchored_rows(grid):
    """A case study's looped rows with the layout-matched r = 1 runs as the anchor (the plain r = 1 is dropped):
    what dev/ablate.sh fits an ablation's delta-phi on, built by the same function."""
    return ablation_report.layout_anchored_rows(load_rows(grid), RESULTS / CASE_STUDIES[grid])


def phi_with_ci(joint):
    """A joint fit's phi with its bootstrap CI, '1.12 [0.92, 1.29]', or '0.82 (CI reaches the bound -3: not
    identified)' where the CI runs to the fitter's search box (laws.estimate_text)."""
    return estimate_text(joint["phi"], joint["phi_ci"], ci_bounds_reached("phi", joint["phi_ci"]))


def phi_row(label, paper, fit, cmp=None, runs_so_far=0):
    """One line of the phi table: the joint fit's phi with its CI, and delta-phi if a comparison (a fit_laws.py
    --compare JSON: the base's fit, the grid's under "compare", delta_phi) exists. Where an arm's phi CI runs to
    the search box, so does delta-phi's, and it is printed as not identified."""
    if fit is None:
        return f"| {label} | {runs_so_far} so far | not fitted yet | {paper} | - |"
    delta = "-"
    if cmp is not None:
        reached = ci_bounds_reached("phi", cmp["joint"]["phi_ci"], cmp["compare"]["joint"]["phi_ci"])
        delta_of = cmp["delta_phi"]
        delta = estimate_text(delta_of["delta_phi"], delta_of["delta_phi_ci"], reached, "+.2f", "an arm's φ CI")
    return f"| {label} | {fit['n_runs']} | {phi_with_ci(fit['joint'])} | {paper} | {delta} |"


def read_json(path):
    return json.loads(path.read_text()) if path.exists() else None


def phi_table():
    lines = ["| grid | runs | φ (95% CI) | paper | Δφ vs its base (95% CI) |", "|---|---|---|---|---|"]
    for grid, label, paper in GRIDS:
        fit, cmp = read_json(RESULTS / grid / "fit" / "fit.json"), read_json(RESULTS / grid / "fit" / "compare.json")
        if fit is None and cmp is not None:  # an ablation (dev/ablate.sh) fits its arm only within the comparison
            fit = cmp["compare"]
        lines.append(phi_row(label, paper, fit, cmp, len(load_rows(grid))))
    for grid, label, paper in GRIDS:  # the case studies against the layout-matched anchor
        if grid in CASE_STUDIES and (cmp := read_json(RESULTS / grid / "fit" / "compare_layout.json")):
            lines.append(phi_row(f"{label}, layout-matched r = 1", paper, cmp["compare"], cmp))
    return lines


# the arms the verdict table pairs with their base, run for run (the lr arm retrains r = 2 and 4 only): the grid's
# recipe, then the quiet recipe against it and the quiet arm against the quiet base
VERDICT_GRIDS = [("cpu-micro-lr", "cpu-micro"), ("cpu-micro-trunc", "cpu-micro"), ("cpu-micro-hyper", "cpu-micro"),
                 ("cpu-micro-gated", "cpu-micro"), ("cpu-micro-untied", "cpu-micro"), ("cpu-micro-quiet", "cpu-micro"),
                 ("cpu-micro-gated-quiet", "cpu-micro-quiet"), ("cpu-micro-trunc-quiet", "cpu-micro-quiet")]


def verdict_cell(v, power=False):
    """A verdict in a table cell: its word, mean and 95% CI, and (power) the CI's half-width."""
    if v is None:
        return "-"
    text = f"{v['word']}: {v['mean']:+.3f} [{v['ci'][0]:+.3f}, {v['ci'][1]:+.3f}]"
    if power:
        text += f" (±{v['half_width']:.3f})"
    return text


def verdict_table():
    """Each arm against its base, cell by cell (nanoloop/verdict.py): per looped r and pooled, the word, the mean
    validation-loss difference (arm - base, nats/token) and its 95% CI. One seed per cell, so the CI comes from
    the spread across cells. An arm not committed yet is left out."""
    labels = dict((grid, label) for grid, label, _ in GRIDS)
    lines = ["| arm | r = 2 | r = 4 | r = 8 | all r |", "|---|---|---|---|---|"]
    for grid, base in VERDICT_GRIDS:
        verdicts = verdicts_by_r(paired_differences([load_rows(base)], [load_rows(grid)]))
        if not verdicts:
            continue
        cells = []
        for label in ("r = 2", "r = 4", "r = 8", "all r"):
            cells.append(verdict_cell(verdicts.get(label)))
        lines.append(f"| {labels[grid]} | " + " | ".join(cells) + " |")
    return lines


# dev/ablate.sh --quick --quiet's arms, each against its base: the quiet recipe's (cpu-micro-quiet, its replicates
# cpu-micro-quiet-seed<i>) or, for --paired-init, the same recipe's with --init-draws by-name; in the report's design.
QUIET_BASE = "cpu-micro-quiet"
PAIRED_BASE = "cpu-micro-quiet-byname"
QUIET_ARMS = [("cpu-micro-gated-quick-quiet", "gated injection", QUIET_BASE),
              ("cpu-micro-hyper-quick-quiet", "hyperconnections, K = 2", QUIET_BASE),
              ("cpu-micro-null-quick-quiet", "the null: --seed 100", QUIET_BASE),
              ("cpu-micro-lr007-quick-quiet", "the quiet recipe at MuonH LR 0.007", QUIET_BASE),
              ("cpu-micro-rsi-quick-quiet", "random state init (--random-state-init)", QUIET_BASE),
              ("cpu-micro-gated-quick-quiet-byname", "gated injection, paired initial draws (--paired-init)",
               PAIRED_BASE)]


def quiet_verdict_table():
    """The quick arms on the quiet recipe: per arm its seeds and its verdict at r = 4 (the half-width is the
    power). The quiet recipe against the grid's is verdict_table's, over the full grid."""
    if not (RESULTS / QUIET_BASE / "results.jsonl").is_file():
        return []
    lines = ["| arm (quick cells) | seeds | r = 1 | r = 4 |", "|---|---|---|---|"]
    for grid, label, arm_base in QUIET_ARMS:
        if not (RESULTS / grid / "fit" / "ablation.json").is_file():
            continue
        # r = 1 where the arm changes it; the design the report's (nanoloop/verdict.compare)
        verdicts, _ = compare(ablation_report.replicates(RESULTS / arm_base),
                              ablation_report.replicates(RESULTS / grid), looped_only=False)
        seeds = seeds_cell(verdicts["r = 4"])
        lines.append(f"| {label} | {seeds} | {verdict_cell(verdicts.get('r = 1'), power=True)} | "
                     f"{verdict_cell(verdicts.get('r = 4'), power=True)} |")
    return lines


def seeds_cell(v):
    """The arm's seeds, and the base's where the verdict reads more of them than the arm has."""
    if v["design"] == "paired, base control":
        return f"{v['n_seeds']} (the base's {v['n_base_seeds']})"
    return str(v["n_seeds"])

def quick_rows_by_cell(folders):
    """({(budget, d): [r = 4 rows, one per seed]}, seeds) over every seed replicate of the folders, at the cells
    with two or more seeds: the quick cells (the quiet base's full-grid cells beyond them have seed 0 alone)."""
    by_seed = []
    for folder in folders:
        by_seed += ablation_report.replicates(folder)
    by_cell = {}
    for rows in by_seed:
        for row in rows:
            if row["r"] == 4:
                by_cell.setdefault((row["flops_budget"], row["d_model"]), []).append(row)
    return {cell: rows for cell, rows in by_cell.items() if len(rows) > 1}, len(by_seed)


def quick_noise_row(label, folders):
    """One line of quick_noise_table, or None below two seeds: the r = 4 runs at each quick cell over every seed
    replicate of the folders, each cell's variance pooled (the root of their mean), and the mean loss."""
    by_cell, seeds = quick_rows_by_cell(folders)
    spread_cells = [[row["val_loss"] for row in rows] for rows in by_cell.values()]
    if not spread_cells:
        return None
    pooled = statistics.fmean(statistics.variance(losses) for losses in spread_cells) ** 0.5
    mean = statistics.fmean(loss for losses in spread_cells for loss in losses)
    return f"| {label} | {seeds} | {len(spread_cells)} | {pooled:.3f} | {mean:.3f} |"


def quick_noise_by_cell_table():
    """Where the quick cells' seed noise lives: per cell, over the quiet base's seeds and the null's (one
    distribution), its seed sd beside its steps and its training tokens per (non-embedding) parameter."""
    by_cell, seeds = quick_rows_by_cell([RESULTS / QUIET_BASE, RESULTS / "cpu-micro-null-quick-quiet"])
    lines = ["| budget C | d | steps | tokens per parameter | seeds | seed sd | mean val loss |",
             "|---|---|---|---|---|---|---|"]
    for (budget, d), rows in sorted(by_cell.items()):
        losses = [row["val_loss"] for row in rows]
        lines.append(f"| {budget:.1e} | {d} | {rows[0]['steps']} | {rows[0]['tokens'] / rows[0]['n_params']:.0f} | "
                     f"{len(losses)} | {statistics.stdev(losses):.3f} | {statistics.fmean(losses):.3f} |")
    return lines


def quick_noise_table():
    """The seed noise at --quick's cells (r = 4 at 1.1e12 and 2.4e12, 7 widths) of the quiet base and of every
    quiet arm with two or more seeds: a candidate recipe (the LR arm) is read against the base like any arm. The
    null trains the base's own distribution at other seeds, so the two together are the recipe's best estimate."""
    lines = ["| r = 4 at the quick cells | seeds | cells | seed sd (pooled) | mean val loss |", "|---|---|---|---|---|"]
    arms = [((QUIET_BASE,), "the quiet base"), ((PAIRED_BASE,), "the quiet base, paired initial draws")]
    arms += [((grid,), label) for grid, label, _ in QUIET_ARMS]
    arms.append(((QUIET_BASE, "cpu-micro-null-quick-quiet"), "the quiet recipe: the base's seeds and the null's"))
    for grids, label in arms:
        folders = [RESULTS / grid for grid in grids]
        if all((folder / "results.jsonl").is_file() for folder in folders):
            if row := quick_noise_row(label, folders):
                lines.append(row)
    return lines


EVAL = RESULTS / "cpu-micro-eval"            # the first retrain, scored under nanoloop-v1 (the rules of then)
EVAL_CORE = RESULTS / "cpu-micro-eval-core"  # a second retrain, scored under core and again under nanoloop-v1
CATEGORIES_CPU = RESULTS.parents[1] / "data" / "eval" / "categories-cpu.json"
# phi refitted on each category's loss (App. I.1) at the paper's scale; its math and primitives are too noisy there
PAPER_DOWNSTREAM = {"val_loss": "0.46", "parametric_knowledge": "0.58", "reading_comp": "0.71",
                    "math_word_problems": "too noisy", "reasoning_primitives": "too noisy"}


def downstream_phi_table():
    """phi of the joint law fitted on each category's loss (dev/eval_micro.sh), and on the validation loss of
    the same runs, before -> after the scoring change: the committed nanoloop-v1 fits of the first retrain,
    the second retrain under the same rules (what retraining alone moves), then under core (the rules
    alone: same checkpoints, same runs)."""
    lines = ["| loss fitted | runs | φ nanoloop-v1, 1st retrain | φ nanoloop-v1, 2nd retrain | φ core, 2nd retrain "
             "| R² core | paper |", "|---|---|---|---|---|---|---|"]
    fits = sorted((EVAL_CORE / "fit").glob("*.json"), key=lambda path: (path.stem != "val_loss", path.stem))
    for path in fits:
        core = read_json(path)
        first = read_json(EVAL / "fit" / path.name)
        second = core  # the validation loss is fitted once (it does not depend on the scoring)
        if path.stem != "val_loss":
            second = read_json(EVAL_CORE / "fit-nanoloop-v1" / path.name)
        paper = PAPER_DOWNSTREAM.get(path.stem, "-")
        lines.append(f"| {path.stem} | {core['n_runs']} | {phi_with_ci(first['joint'])} | "
                     f"{phi_with_ci(second['joint'])} | {phi_with_ci(core['joint'])} | {core['joint']['r2']:.3f} | "
                     f"{paper} |")
    return lines


def scoring_table():
    """The two rule sets on the same checkpoints (EVAL_CORE's eval-nanoloop-v1.jsonl and eval.jsonl): per
    task, the mean over the runs of its gold tokens, per-token loss and cropped items, nanoloop-v1 -> core."""
    rows = {"nanoloop-v1": load(EVAL_CORE / "eval-nanoloop-v1.jsonl"), "core": load(EVAL_CORE / "eval.jsonl")}
    lines = ["| task | rows | gold tokens a run, nanoloop-v1 → core | mean loss, nanoloop-v1 → core | truncated items, "
             "nanoloop-v1 → core |", "|---|---|---|---|---|"]
    for task in dict.fromkeys(row["task"] for row in rows["core"]):
        per_rule = [[row for row in rule_rows if row["task"] == task] for rule_rows in rows.values()]
        cells = []
        for field, form in (("continuation_tokens", "{:.0f}"), ("loss", "{:.3f}"), ("truncated_items", "{:.1f}")):
            means = [sum(row[field] for row in task_rows) / len(task_rows) for task_rows in per_rule]
            cells.append(" → ".join(form.format(mean) for mean in means))
        lines.append(f"| {task} | {len(per_rule[-1])} | " + " | ".join(cells) + " |")
    return lines


def spread(values):
    """mean and half the range of a few seeds' values, as 'mean ± half-range'."""
    return f"{sum(values) / len(values):.3f} ± {(max(values) - min(values)) / 2:.3f}"


def seed_table():
    """The largest budget's seed runs (cpu-micro-seeds: each r's best width, seeds 0 and 1): validation and
    category losses (eval_tasks.category_losses, at the trained r) as mean ± half the range over the seeds."""
    seed_rows = load(EVAL / "seeds.jsonl")
    rows = load(EVAL / "results.jsonl") + seed_rows
    seed_runs = sorted({(row["r"], row["d_model"], row["flops_budget"]) for row in seed_rows})
    categories = read_categories(CATEGORIES_CPU)
    losses = category_losses(load(EVAL / "eval.jsonl"), categories)
    header = "| r | d | seeds | val loss | " + " | ".join(categories) + " |"
    lines = [header, "|---|---|---|---|" + "---|" * len(categories)]
    for r, d, budget in seed_runs:
        runs = [row for row in rows if (row["r"], row["d_model"], row["flops_budget"]) == (r, d, budget)]
        cells = [spread([row["val_loss"] for row in runs])]
        for category in categories:
            values = [losses[row["run_id"], r][category] for row in runs if (row["run_id"], r) in losses]
            cells.append(spread(values) if values else "-")
        lines.append(f"| {r} | {d} | {len(runs)} | " + " | ".join(cells) + " |")
    return lines


def retrain_table():
    """The retrained grid (dev/eval_micro.sh's results.jsonl: the same run identities, trained again with
    checkpoints kept) against the committed cpu-micro rows: |delta val loss| per r, by run_id."""
    committed = val_losses(load_rows("cpu-micro"))
    deltas = {}
    for row in load(EVAL / "results.jsonl"):
        if row["run_id"] in committed:
            deltas.setdefault(row["r"], []).append(abs(row["val_loss"] - committed[row["run_id"]]))
    lines = ["| r | runs | mean abs. Δ | median | max |", "|---|---|---|---|---|"]
    everything = sorted(v for values in deltas.values() for v in values)
    for r, values in sorted(deltas.items()) + [("all", everything)]:
        values = sorted(values)
        lines.append(f"| {r} | {len(values)} | {sum(values) / len(values):.3f} | {values[len(values) // 2]:.3f} | "
                     f"{values[-1]:.3f} |")
    return lines


NOISE = RESULTS / "cpu-micro-noise"  # dev/noise.sh: seeds x candidate recipes at the quick cells and two budgets
# the committed grid a recipe's seed 0 retrains (the same run_ids): what kernel rounding and threads alone move
RETRAINED_GRID = {"base": "cpu-micro", "cosine-avg-lr014": "cpu-micro-quiet"}
# the noise by source (dev/noise.sh recipes): the seed (initialisation) and the data order on the grid's recipe,
# the seed on the quiet one (sweep.sh CPU_QUIET_FLAGS)
NOISE_SOURCES = (("seed, grid", "base"), ("data order, grid", "order"), ("seed, quiet", "cosine-avg-lr014"))


def noise_runs():
    """{(recipe, budget, r, d): {replicate: row}} of dev/noise.sh's rows (the recipe and replicate from the folder
    name it gives each run: r4_s0.25_C1.1e12_cosine_seed2_micro; the "order" recipe's replicate i is the data
    order i + 1 at seed 0)."""
    found = {}
    for row in load(NOISE / "results.jsonl"):
        parts = Path(row["out"]).name.split("_")  # r4, s0.25, C1.1e12, recipe, seed<i>, micro
        recipe, replicate = parts[3], int(parts[4].removeprefix("seed"))  # "order": the data order's index
        cell = (recipe, row["flops_budget"], row["r"], row["d_model"])
        found.setdefault(cell, {})[replicate] = row
    return found


def retrain_delta(recipe, by_seed):
    """|seed 0 - the committed run of its run_id| in the grid the recipe retrains, or None where there is none."""
    committed = val_losses(load_rows(RETRAINED_GRID.get(recipe, "")))
    if 0 not in by_seed or by_seed[0]["run_id"] not in committed:
        return None
    return abs(by_seed[0]["val_loss"] - committed[by_seed[0]["run_id"]])


def noise_table():
    """Per candidate recipe and cell: seeds, mean val loss, seed sd (the noise an ablation's verdict must beat),
    range; and seed 0 retrained against the committed run of its run_id (the same identity: kernel rounding and
    threads alone), for the recipes a committed grid holds."""
    lines = ["| recipe | C | r | d | seeds | mean | seed sd | range | retrain |Δ| (seed 0) |",
             "|---|---|---|---|---|---|---|---|---|"]
    by_r_then_budget = sorted(noise_runs().items(), key=lambda item: (item[0][2], item[0][1], item[0][0]))
    for (recipe, budget, r, d), by_seed in by_r_then_budget:
        losses = [row["val_loss"] for row in by_seed.values()]
        sd = statistics.stdev(losses) if len(losses) > 1 else float("nan")
        retrain = retrain_delta(recipe, by_seed)
        lines.append(f"| {recipe} | {budget:.2g} | {r} | {d} | {len(losses)} | {statistics.fmean(losses):.3f} | "
                     f"{sd:.3f} | {min(losses):.3f}-{max(losses):.3f} | "
                     f"{'-' if retrain is None else f'{retrain:.3f}'} |")
    return lines


def noise_by_source_table():
    """Per cell (budget, r, d) that dev/noise.sh measured with seeds: the sd of each source (NOISE_SOURCES, with
    its replicate count) and the retrain |delta| of each recipe (RETRAINED_GRID): the noise before (the grid's
    recipe) and after (the quiet one), source by source."""
    runs = noise_runs()
    cells = sorted({cell[1:] for cell in runs}, key=lambda cell: (cell[0], cell[1], cell[2]))
    lines = ["| C | r | d | " + " | ".join(f"sd: {label}" for label, _ in NOISE_SOURCES) + " | " +
             " | ".join(f"retrain |Δ|: {recipe}" for recipe in RETRAINED_GRID) + " |",
             "|---|---|---|" + "---|" * (len(NOISE_SOURCES) + len(RETRAINED_GRID))]
    for cell in cells:
        spreads = []
        for _, recipe in NOISE_SOURCES:
            losses = [row["val_loss"] for row in runs.get((recipe, *cell), {}).values()]
            spreads.append(f"{statistics.stdev(losses):.3f} ({len(losses)})" if len(losses) > 1 else "-")
        retrains = [retrain_delta(recipe, runs.get((recipe, *cell), {})) for recipe in RETRAINED_GRID]
        retrain_cells = ["-" if value is None else f"{value:.3f}" for value in retrains]
        if spreads.count("-") < len(spreads):
            lines.append(f"| {cell[0]:.2g} | {cell[1]} | {cell[2]} | " + " | ".join(spreads + retrain_cells) + " |")
    return lines


def val_losses(rows):
    """{run_id: validation loss} of results rows."""
    return {row["run_id"]: row["val_loss"] for row in rows}


def abs_delta_row(label, losses, reference, run_ids):
    """One markdown row: |losses - reference| over run_ids, as count, mean, median (the upper one, as
    retrain_table's) and max, nats/token."""
    deltas = sorted(abs(losses[run_id] - reference[run_id]) for run_id in run_ids)
    return (f"| {label} | {len(deltas)} | {sum(deltas) / len(deltas):.3f} | {deltas[len(deltas) // 2]:.3f} | "
            f"{deltas[-1]:.3f} |")


def step_table():
    """The faster CPU step's semantics check: runs retrained here with the new step (cpu-micro-newstep) and
    with the old one (cpu-micro-eval's retrain, model.py of before the fused loss), each against the committed
    cpu-micro rows, on the run_ids both retrains hold: |delta val loss|, nats/token."""
    committed = val_losses(load_rows("cpu-micro"))
    new_step = val_losses(load(RESULTS / "cpu-micro-newstep" / "results.jsonl"))
    old_step = val_losses(load(EVAL / "results.jsonl"))
    run_ids = sorted(set(new_step) & set(old_step) & set(committed))
    lines = ["| step | runs | mean abs. Δ vs committed | median | max |", "|---|---|---|---|---|"]
    for label, losses in (("old (before the fused loss)", old_step), ("new (this repository)", new_step)):
        lines.append(abs_delta_row(label, losses, committed, run_ids))
    return lines


def kernel_table():
    """The CPU attention kernel's semantics check: the same committed cpu-micro runs retrained on one machine
    with cpu_attention.py's kernel (cpu-micro-kernel/results.jsonl) and with PyTorch's SDPA (sdpa.jsonl, the
    kernel's build refused), each against the committed rows and against each other, beside the old step's
    retrain (cpu-micro-eval) on the same runs: |delta val loss|."""
    committed = val_losses(load_rows("cpu-micro"))
    kernel = val_losses(load(RESULTS / "cpu-micro-kernel" / "results.jsonl"))
    sdpa = val_losses(load(RESULTS / "cpu-micro-kernel" / "sdpa.jsonl"))
    old_step = val_losses(load(EVAL / "results.jsonl"))
    run_ids = sorted(set(kernel) & set(sdpa) & set(committed) & set(old_step))
    pairs = (("kernel vs committed", kernel, committed), ("SDPA vs committed", sdpa, committed),
             ("kernel vs SDPA", kernel, sdpa), ("old step (before the fused loss) vs committed", old_step, committed))
    lines = ["| retrain | runs | mean abs. Δ | median | max |", "|---|---|---|---|---|"]
    for label, losses, reference in pairs:
        lines.append(abs_delta_row(label, losses, reference, run_ids))
    return lines


def loss_tables():
    rows = [row for grid, _, _ in GRIDS for row in load_rows(grid)]
    seen, unique = set(), []
    for row in rows:  # reused runs appear in several grids' files
        key = (row["flops_budget"], row["d_model"], column(row))
        if key not in seen:
            seen.add(key)
            unique.append(row)
    cols = sorted({column(row) for row in unique}, key=lambda c: (int(c.split()[0][2:]), c))
    loss = {(row["flops_budget"], row["d_model"], column(row)): row["val_loss"] for row in unique}
    budgets = sorted({row["flops_budget"] for row in unique})
    best = ["| budget C | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    full = ["| budget C | d | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    for C in budgets:
        cells = []
        for c in cols:
            at = {d: v for (b, d, cc), v in loss.items() if b == C and cc == c}
            cells.append(f"{min(at.values()):.3f} (d={min(at, key=at.get)})" if at else "-")
        best.append(f"| {C:.2g} | " + " | ".join(cells) + " |")
        for d in sorted({d for (b, d, _) in loss if b == C}):
            full.append(f"| {C:.2g} | {d} | " + " | ".join(f"{loss[C, d, c]:.3f}" if (C, d, c) in loss else "-"
                                                         for c in cols) + " |")
    return best, full


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layout-anchored", metavar="GRID", choices=CASE_STUDIES,
                   help="print GRID's looped rows with cpu-micro-layout's r = 1 rows, as JSONL, and stop")
    args = p.parse_args()
    if args.layout_anchored:
        print("".join(json.dumps(row) + "\n" for row in layout_anchored_rows(args.layout_anchored)), end="")
        return
    best, full = loss_tables()
    print("phi per grid\n" + "\n".join(phi_table()))
    print("\neach arm against the base, run for run: verdict, mean Δ val loss (nats/token) and 95% CI\n" +
          "\n".join(verdict_table()))
    if quiet := quiet_verdict_table():
        print("\nthe quick arms on the quiet recipe against its base (cpu-micro-quiet; -byname for --paired-init), "
              "paired by cell and seed (its other seeds a control where it has more): verdict, mean Δ val loss and "
              "95% CI (± its half-width)\n" + "\n".join(quiet))
        print("\nthe seed noise at the quick cells, quiet recipe (nats/token)\n" + "\n".join(quick_noise_table()))
        print("\nthe seed noise per quick cell, r = 4, the quiet base's seeds and the null's (nats/token)\n" +
              "\n".join(quick_noise_by_cell_table()))
    print("\nbest width per (budget, column): val loss (nats/token) and d\n" + "\n".join(best))
    print("\nevery run: val loss (nats/token)\n" + "\n".join(full))
    if (EVAL_CORE / "fit").is_dir():
        print("\ndownstream phi per category (dev/eval_micro.sh)\n" + "\n".join(downstream_phi_table()))
        print("\nthe scoring rules on the same checkpoints, per task (means over the runs)\n" +
              "\n".join(scoring_table()))
    if (EVAL / "results.jsonl").exists():
        print("\nretrained grid against the committed rows (val loss, nats/token)\n" + "\n".join(retrain_table()))
    if (RESULTS / "cpu-micro-newstep" / "results.jsonl").exists():
        print("\nthe faster step's semantics: retrained runs against the committed rows (val loss)\n" +
              "\n".join(step_table()))
    if (RESULTS / "cpu-micro-kernel" / "sdpa.jsonl").exists():
        print("\nthe CPU attention kernel's semantics: the same runs retrained with it and with SDPA (val loss)\n" +
              "\n".join(kernel_table()))
    if (EVAL / "seeds.jsonl").exists():
        print("\nseed spread at 5e12 (nats/token, mean ± half-range)\n" + "\n".join(seed_table()))
    if (NOISE / "results.jsonl").exists():
        print("\nthe noise by source, grid recipe -> quiet recipe (dev/noise.sh; sd of val loss over replicates, "
              "nats/token)\n" + "\n".join(noise_by_source_table()))
        print("\nthe noise per candidate recipe: seeds x recipes (dev/noise.sh; val loss, nats/token)\n" +
              "\n".join(noise_table()))


if __name__ == "__main__":
    main()
