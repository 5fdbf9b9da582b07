"""sweep.sh: the paper's grid is exactly Table 7 priced by flops.py, and a sweep is idempotent and
resumable end to end (smoke grid: data -> train -> results -> fit report)."""
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import flops
from conftest import meta_only_dataset, sweep

REPO = Path(__file__).resolve().parents[1]
TABLE7 = {4.64e17: [6, 8, 10, 12], 1e18: [6, 8, 10, 12, 14], 2.15e18: [8, 10, 12, 14, 16],
          4.64e18: [10, 12, 14, 16, 18, 20], 1e19: [12, 16, 18, 20, 24], 2.15e19: [18, 24, 28, 34]}


def plan_rows(grid):
    """The runs of sweep.sh --plan's table: name, r, r_bwd, s, C (a FLOP budget, else None), D/D0 (a token
    horizon's level, else None), N, tokens D, batch (sequences), steps, F*D and the measured compute."""
    out = sweep("--grid", grid, "--plan", env={"OUT": "/nonexistent", "DATA": "/nonexistent"}).stdout
    lines = out.splitlines()
    rows = [line.split() for line in lines[1:lines.index(next(x for x in lines if " runs, total compute " in x))]]
    number = lambda text: None if text == "-" else float(text)  # noqa: E731
    return [dict(name=c[0], r=int(c[1]), r_bwd=int(c[2]), s=float(c[3]), C=number(c[4]), level=number(c[5]),
                 N=int(c[6].replace(",", "")), D=int(c[7].replace(",", "")), batch=int(c[8].replace(",", "")),
                 steps=int(c[9].replace(",", "")), F=float(c[10]), measured=float(c[11])) for c in rows], out


def test_paper_plan_is_table7_times_four_architectures_priced_by_flops_py():
    rows, out = plan_rows("paper")
    assert len(rows) == 116 and "116 runs" in out
    cells = {(row["C"], row["s"]) for row in rows}
    assert cells == {(C, s) for C, widths in TABLE7.items() for s in widths}
    for row in rows:
        cfg = flops.ModelConfig(r=row["r"], scale=row["s"])
        plan = flops.tokens_for_budget(cfg, row["C"], 2 ** 18)
        assert row["N"] == flops.param_counts(cfg)["n_params"]
        assert (row["D"], row["steps"]) == (plan["tokens"], plan["steps"])
        assert math.isclose(row["F"], plan["flops_actual"], rel_tol=1e-3)
    total = sum(flops.tokens_for_budget(flops.ModelConfig(r=x["r"], scale=x["s"]), x["C"], 2 ** 18)["flops_actual"]
                for x in rows)
    assert f"total compute {total:.3e}" in out


# Truncate or Not? Table 2: the five sizes' d, layout, N and N_rec/N; Table 13: batch and steps per D/D0.
TABLE2 = {"60M": (768, (2, 4, 2), 57.8e6, 0.510), "120M": (1024, (2, 5, 2), 115.4e6, 0.564),
          "240M": (1280, (3, 6, 3), 239.2e6, 0.507), "480M": (1664, (3, 7, 4), 470.8e6, 0.506),
          "1B": (2176, (4, 8, 4), 918.7e6, 0.505)}
TABLE13 = {0.5: (48, 5464), 1: (64, 8192), 2: (88, 11920), 4: (128, 16384), 8: (176, 23832), 16: (256, 32768),
           32: (352, 47664)}
CORE = {(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 3), (4, 4), (8, 2), (8, 4), (8, 8)}


def test_the_truncate_or_not_suite_is_table_2s_sizes_at_fixed_n_with_table_13s_batches():
    """Each size's N and N_rec/N are Table 2's and the same for all of its (T, B); the ten core settings at every
    size and level, (8, 1) at the fitting levels (~9/18/37/74 tokens per parameter), T = 16 with B in {1, 4, 8, 16}
    only at 120M/240M/480M and 2-8 D0; every run's batch and steps are Table 13's for its D/D0."""
    rows, out = plan_rows("truncate-or-not")
    by_size = {}
    for row in rows:
        by_size.setdefault(row["name"].split("_")[0], []).append(row)
    assert set(by_size) == set(TABLE2)
    for size, (d, layout, n, share) in TABLE2.items():
        cfg = flops.ModelConfig(r=1, scale=d / 64, prelude=layout[0], recur=layout[1], coda=layout[2])
        counts = flops.param_counts(cfg)
        assert round(counts["n_params"] / 1e5) == round(n / 1e5) and round(counts["n_rec"] / counts["n_params"], 3) == share
        assert {row["N"] for row in by_size[size]} == {counts["n_params"]}
        levels = {row["level"] for row in by_size[size]}
        assert all({(row["r"], row["r_bwd"]) for row in by_size[size] if row["level"] == level} >= CORE
                   for level in levels)
        fitting = {row["level"] for row in by_size[size] if (row["r"], row["r_bwd"]) == (8, 1)}
        assert len(fitting) >= 3 and all(6.5 < level * 2 ** 30 / counts["n_params"] < 105 for level in fitting)
        assert levels - fitting and all(not 6.5 < level * 2 ** 30 / counts["n_params"] < 105 for level in levels - fitting)
    sixteen = {(row["name"].split("_")[0], row["level"], row["r_bwd"]) for row in rows if row["r"] == 16}
    assert sixteen == {(size, level, b) for size in ("120M", "240M", "480M") for level in (2, 4, 8) for b in (1, 4, 8, 16)}
    for row in rows:
        if row["level"] in TABLE13:
            assert (row["batch"], row["steps"]) == TABLE13[row["level"]], row["name"]
    assert len(rows) == 355 and "355 runs" in out


def test_the_cpu_truncate_or_not_suite_is_three_fixed_n_sizes_in_the_ten_core_settings_at_four_levels():
    rows, _ = plan_rows("cpu-truncate-or-not")
    sizes = {}
    for row in rows:
        sizes.setdefault(row["name"].split("_")[0], []).append(row)
    assert len(sizes) == 3
    for size_rows in sizes.values():
        assert len({row["N"] for row in size_rows}) == 1
        n = size_rows[0]["N"]
        levels = {row["level"] for row in size_rows}
        fitting = {level for level in levels if 6.5 < level * 2 ** 18 / n < 105}
        assert len(fitting) == 4
        for level in levels:
            assert {(row["r"], row["r_bwd"]) for row in size_rows if row["level"] == level} == CORE


# The authors' case-study sweeps add one wider width per budget where the optimum moves wider, for
# the looped runs only (their truncated-BPTT and hyperconnections scripts run r in {2,4,8}; the r = 1
# baseline is the unchanged paper runs): 20 + 3 x 23 = 89 and 20 + 3 x 21 = 83 runs (App. H.2: "83").
EXTRA_WIDTHS = {"trunc": {1e18: [16], 2.15e18: [18], 4.64e18: [22]}, "hyper": {2.15e18: [18]},
                "depth18": {}, "depth24": {}}


@pytest.mark.parametrize("grid, n_runs", [("trunc", 89), ("hyper", 83), ("depth18", 80), ("depth24", 80)])
def test_case_study_plans_use_the_four_lowest_budgets_and_the_authors_extra_widths(grid, n_runs):
    rows, out = plan_rows(grid)
    assert len(rows) == n_runs and f"{n_runs} runs" in out
    low = {C: w for C, w in TABLE7.items() if C <= 4.64e18}
    extra = EXTRA_WIDTHS[grid]
    for r in (1, 2, 4, 8):
        want = {(C, s) for C, ws in low.items() for s in ws + (extra.get(C, []) if r > 1 else [])}
        assert {(x["C"], x["s"]) for x in rows if x["r"] == r} == want, r
    for x in rows:
        if grid == "trunc":
            assert x["r_bwd"] == (x["r"] + 1) // 2  # ceil(r/2); r = 1 is the shared baseline
        else:
            assert x["r_bwd"] == x["r"]
    if grid in ("trunc", "hyper"):  # the r = 1 baselines share their run names with the paper grid
        paper_names = {x["name"] for x in plan_rows("paper")[0]}
        assert {x["name"] for x in rows if x["r"] == 1} <= paper_names
        printed = sweep("--grid", grid, "--print", env={"GPUS": "8", "GPUS_PER_RUN": "8"}).stdout
        looped = [line for line in printed.splitlines() if " --r 1 " not in line]
        flag = "--r-bwd" if grid == "trunc" else "--injection hyper --hc-lanes 2"
        assert len(looped) == n_runs - 20 and all(flag in line for line in looped)


@pytest.mark.parametrize("grid, flag", [("cpu-micro-trunc", "--r-bwd"), ("cpu-micro-hyper", "--injection hyper")])
def test_cpu_case_study_grids_are_the_cpu_micro_cells_with_the_variant(grid, flag):
    """One list of cells (CPU_MICRO_CELLS) drives cpu-micro and both CPU case studies; the r = 1 runs
    are cpu-micro's, by name, so a case-study sweep beside runs/cpu-micro reuses them."""
    base, _ = plan_rows("cpu-micro")
    rows, _ = plan_rows(grid)
    # Beyond cpu-micro's runs, a case study may add a wider width for its looped runs where its optima were
    # the widest width: every extra run is looped, at a budget of the base, wider than its widest width there.
    planned = {(x["C"], x["s"], x["r"]) for x in base}
    wider = {(x["C"], x["s"], x["r"]) for x in rows} - planned
    widest = {C: max(s for c, s, _ in planned if c == C) for C, _, _ in planned}
    assert all(r > 1 and C in widest and s > widest[C] for C, s, r in wider)
    assert {(C, s) for C, s, _ in wider} == {(C, s) for C, s, r in wider if r == 2} and len(wider) % 3 == 0
    assert sorted((x["C"], x["s"], x["r"]) for x in rows) == sorted(planned | wider)
    assert {x["name"] for x in rows if x["r"] == 1} == {x["name"] for x in base if x["r"] == 1}
    assert not {x["name"] for x in rows if x["r"] > 1} & {x["name"] for x in base}
    def flags_by_run(g, drop=""):  # train.py flags after --resume, per (r, s, C), variant flags removed
        lines = sweep("--grid", g, "--print").stdout.splitlines()
        return {re.search(r"--r (\S+) .*--scale (\S+) --flops (\S+)", line).groups():
                re.sub(drop, "", line.split("--resume ")[1]) for line in lines}
    variant = flags_by_run(grid)
    assert all((flag in f) == (r != "1") for (r, _, _), f in variant.items())
    plain = flags_by_run(grid, r" --r-bwd \d+| --injection hyper --hc-lanes 2")
    assert {k: v for k, v in plain.items() if (float(k[2]), float(k[1]), int(k[0])) not in wider} == flags_by_run("cpu-micro")


def test_print_gives_one_torchrun_command_per_run():
    out = sweep("--grid", "paper", "--print", env={"GPUS": "8", "GPUS_PER_RUN": "8"}).stdout.splitlines()
    assert len(out) == 116
    assert all(line.startswith("torchrun --standalone --nproc_per_node=8 -- train.py") for line in out)
    assert "--r 4 --scale 10 --flops 1e18" in "\n".join(out)
    # every paper run is evaluated on the paper's 34,560 validation rows (~70.8M tokens, §4.1)
    assert all(line.endswith("--eval-rows 34560") for line in out)


def printed_runs(grid):
    """sweep.sh --print as {run name: train.py flags after --resume}."""
    return {re.search(r"--out \S+/runs/(\S+)", line).group(1): line.split("--resume ")[1]
            for line in sweep("--grid", grid, "--print").stdout.splitlines()}


def best_width_is_inside(rows, n_widths, narrowest=0):
    """At every budget each r's best width has a narrower and a wider one beside it (the issue's
    condition for fitting phi at all: fix the grid, not the numbers), or is `narrowest`, the
    narrowest model the head dim allows (d = head dim: one head)."""
    for budget in {row["flops_budget"] for row in rows}:
        for r in sorted({row["r"] for row in rows}):
            cell = sorted((row["d_model"], row["val_loss"]) for row in rows
                          if row["flops_budget"] == budget and row["r"] == r)
            best = min(range(len(cell)), key=lambda i: cell[i][1])
            assert len(cell) >= n_widths and best < len(cell) - 1, (budget, r, cell)
            assert best > 0 or cell[0][0] == narrowest, (budget, r, cell)


def test_cpu_micro_lr_gives_r2_and_r4_their_own_muonh_lr_and_reuses_r1_and_r8():
    """The per-r LR grid: cpu-micro's cells, r = 2 and r = 4 at MuonH 0.014 (their optimum in the
    diagnostics' LR check), r = 1 and r = 8 at 0.056 under cpu-micro's names, so they are reused."""
    base, _ = plan_rows("cpu-micro")
    rows, _ = plan_rows("cpu-micro-lr")
    assert sorted((x["C"], x["s"], x["r"]) for x in rows) == sorted((x["C"], x["s"], x["r"]) for x in base)
    base_names = {x["name"] for x in base}
    assert all((x["name"] in base_names) == (x["r"] in (1, 8)) for x in rows)
    for line in sweep("--grid", "cpu-micro-lr", "--print").stdout.splitlines():
        r, last_lr = re.search(r"--r (\d+) ", line).group(1), re.findall(r"--lr-matrix (\S+)", line)[-1]
        assert last_lr == ("0.014" if r in ("2", "4") else "0.056"), line


def test_cpu_micro_seeds_repeats_each_r_best_committed_run_at_the_largest_budget_with_seed_1():
    """App. I judges run-to-run spread with more seeds at the largest budget: cpu-micro-seeds is, for each r,
    the width whose committed seed-0 cpu-micro row is best at 5e12, with the same flags and --seed 1."""
    base = printed_runs("cpu-micro")
    committed = [json.loads(line) for line in (REPO / "dev/results/cpu-micro/results.jsonl").read_text().splitlines()]
    largest = [row for row in committed if row["flops_budget"] == 5e12]
    seeds = printed_runs("cpu-micro-seeds")
    assert len(seeds) == 4
    for r in (1, 2, 4, 8):
        best = min((row for row in largest if row["r"] == r), key=lambda row: row["val_loss"])
        name = f"r{r}_s{best['scale']:g}_C5e12_micro"
        assert seeds[name.replace("_micro", "_seed1_micro")] == base[name] + " --seed 1", r


@pytest.mark.parametrize("grid", ["cpu-micro", "cpu-micro-trunc", "cpu-micro-hyper", "cpu-micro-lr"])
def test_committed_cpu_micro_results_are_this_grid_and_bracket_every_minimum(grid):
    """dev/results/<grid> holds the CPU grid as sweep.sh defines it: one row per planned run, at the
    planned LRs (MuonH 0.056, or 0.014 for cpu-micro-lr's r = 2 and 4; norm scales 0.15), over four budgets
    spanning 10x, every minimum bracketed except where it is the one-head d = 8 (the lowest budget)."""
    planned = set(printed_runs(grid))
    rows = [json.loads(line) for line in open(REPO / "dev" / "results" / grid / "results.jsonl")]
    assert sorted(Path(row["out"]).name for row in rows) == sorted(planned)
    own_lr = {2: 0.014, 4: 0.014} if grid == "cpu-micro-lr" else {}  # the per-r LR grid's r = 2 and 4
    assert all(row["base_lrs"]["matrix"] == own_lr.get(row["r"], 0.056) and row["base_lrs"]["norm"] == 0.15
               for row in rows)
    budgets = sorted({row["flops_budget"] for row in rows})
    assert len(budgets) >= 4 and budgets[-1] >= 10 * budgets[0] and {row["r"] for row in rows} == {1, 2, 4, 8}
    best_width_is_inside([row for row in rows if row["flops_budget"] > budgets[0]], 3)
    best_width_is_inside([row for row in rows if row["flops_budget"] == budgets[0]], 3, narrowest=8)


def test_the_earlier_cpu_grid_also_bracketed_every_minimum():
    """The earlier 48-run grid (dev/results/cpu-micro-v2-flat, 3.3x budget span, paper norm LR) whose
    flat looping penalty the diagnostics explain."""
    rows = [json.loads(line) for line in open(REPO / "dev" / "results" / "cpu-micro-v2-flat" / "results.jsonl")]
    assert len(rows) == 48
    best_width_is_inside(rows, 4)


def test_cpu_micro_layout_is_cpu_micro_with_a_layout_matched_r1():
    """cpu-micro-layout's r = 1 runs are the looped layout run once (prelude 2 + a 16-layer block with
    linear injection + coda 2); its looped runs are cpu-micro's, by name, so they are reused."""
    base, layout = printed_runs("cpu-micro"), printed_runs("cpu-micro-layout")
    looped = {name: flags for name, flags in layout.items() if not name.startswith("r1_")}
    assert looped == {name: flags for name, flags in base.items() if not name.startswith("r1_")}
    anchors = {name: flags for name, flags in layout.items() if name.startswith("r1_")}
    assert len(anchors) == sum(name.startswith("r1_") for name in base) > 0
    for name, flags in anchors.items():
        plain = base[name.replace("_layout", "")]
        assert flags == plain.replace("--r 1 ", "--r 1 --recur 16 --injection linear ")


GRIDS = sweep("--grids").stdout.split()


@pytest.mark.slow
@pytest.mark.parametrize("grid", GRIDS)
def test_every_grid_plans_priced_runs_with_distinct_names_and_flags_train_py_accepts(grid):
    """Any grid sweep.sh lists (a new one included, with no edit here): --plan prices one line per run and
    --print gives each a distinct run folder and flags that train.py's parser takes."""
    import train
    rows, out = plan_rows(grid)
    runs = printed_runs(grid)
    assert len(rows) == len(runs) > 0 and f"{len(rows)} runs" in out
    assert sorted(x["name"] for x in rows) == sorted(runs)
    for flags in runs.values():
        train.parse_args(flags.split())


def test_a_variant_is_its_grid_with_extra_flags_in_its_own_folder_and_a_subset_is_its_lines():
    """--variant NAME -- FLAGS: the grid's runs under the grid's run names, each with FLAGS, in runs/<grid>-NAME;
    --budgets / --r keep the runs at those budgets and loop counts; a value the grid has not is refused."""
    base = printed_runs("cpu-micro")
    lines = sweep("--grid", "cpu-micro", "--variant", "gated", "--print", "--", "--injection", "gated").stdout
    variant = {re.search(r"--out runs/cpu-micro-gated/runs/(\S+)", line).group(1):
               re.sub(r"--reuse-from \S+ ", "", line.split("--resume ")[1]) for line in lines.splitlines()}
    assert variant == {name: flags + " --injection gated" for name, flags in base.items()}
    subset = sweep("--grid", "cpu-micro", "--budgets", "5e11 5e12", "--r", "1 4", "--print").stdout.splitlines()
    assert len(subset) == len([n for n in base if n.split("_")[0] in ("r1", "r4") and ("C5e11" in n or "C5e12" in n)])
    assert all(re.search(r" --r [14] .*--flops 5e1[12] ", line) for line in subset)
    for args, reason in [(["--budgets", "6e11"], "has no run with --flops 6e11"), (["--r", "3"], "has no run with --r 3"),
                         (["--variant", "gated"], "needs the train.py flags"), (["--variant", "a/b", "--", "--seed", "1"],
                                                                                 "use letters")]:
        proc = sweep("--grid", "cpu-micro", *args, "--print", check=False)
        assert proc.returncode == 2 and reason in proc.stderr and len(proc.stderr.splitlines()) == 1


@pytest.mark.slow
def test_a_variant_offers_every_committed_run_of_the_same_name_for_reuse(fake_train, tmp_path):
    """The committed CPU grids keep each run's final.json (dev/results/<grid>/runs/<name>/), so a variant sweep
    run anywhere offers train.py every committed run of that name; train.py takes the one whose
    identity is this run's (test_train: reuse needs the exact identity), so only what differs is trained."""
    env, calls = fake_train
    env.update(OUT=str(tmp_path / "runs" / "cpu-micro-gated"))
    sweep("--grid", "cpu-micro", "--variant", "gated", "--no-fit", "--", "--injection", "gated", env=env)
    committed = REPO / "dev" / "results"
    for name, argv in calls_by_name(calls).items():
        offered = [argv[i + 1] for i, a in enumerate(argv) if a == "--reuse-from"]
        assert sorted(offered) == sorted(f"dev/results/{p.parent.parent.name}/runs/{name}"
                                         for p in committed.glob(f"*/runs/{name}")), name
        assert offered and "dev/results/cpu-micro/runs/" + name in offered


@pytest.mark.parametrize("args, reason", [(["--grid", "nope", "--plan"], "unknown grid 'nope'"),
                                          (["--plan", "--grid"], "--grid needs a value"),
                                          (["--grid", "smoke", "--bogus"], "unknown argument --bogus")])
def test_bad_arguments_are_refused(args, reason):
    proc = sweep(*args, check=False)
    assert proc.returncode == 2 and reason in proc.stderr and len(proc.stderr.splitlines()) == 1


def test_sweep_sh_has_no_embedded_python():
    """--plan pricing lives in flops.py and reuse in train.py --reuse-from: sweep.sh only
    calls Python scripts, it holds no Python program of its own."""
    text = (REPO / "sweep.sh").read_text()
    assert not re.search(r"<<\s*'?\w+'?|(PYTHON\W*|python3?)\s+-c\s|\bimport\s+\w", text)


# A stand-in for train.py that keeps its exit/output contract (INTERFACES.md), so the sweep's own logic
# is tested in seconds: exit 0 with "already done:" when the results file has the run, "reused: DIR"
# with --reuse-from, 75 "busy:" for a locked run, 1 for a diverged one; every call is recorded.
FAKE_TRAIN = """
import json, os, sys
argv = sys.argv[1:]
flag = lambda name: argv[argv.index(name) + 1] if name in argv else None
out, results, name = flag("--out"), flag("--results"), os.path.basename(flag("--out"))
with open(os.environ["FAKE_CALLS"], "a") as f:
    f.write(json.dumps(argv) + "\\n")
if name in os.environ.get("FAKE_BUSY", "").split():
    print("busy: " + out); sys.exit(75)
if name in os.environ.get("FAKE_FAIL", "").split():
    print("diverged"); sys.exit(1)
rows = [json.loads(line) for line in open(results)] if os.path.exists(results) else []
if any(row["out"] == out for row in rows):
    print("already done: " + out); sys.exit(0)
os.makedirs(out, exist_ok=True)
open(os.path.join(out, "final.json"), "w").write(json.dumps({"out": out}))
with open(results, "a") as f:
    f.write(json.dumps({"out": out}) + "\\n")
print(("reused: " + flag("--reuse-from")) if flag("--reuse-from") else "trained")
"""


@pytest.fixture
def fake_train(tmp_path):
    """PYTHON for sweep.sh that runs the fake for train.py and the real interpreter for flops.py."""
    (tmp_path / "fake_train.py").write_text(FAKE_TRAIN)
    python = tmp_path / "python"
    python.write_text(f'#!/usr/bin/env bash\nif [ "$1" = train.py ]; then shift; exec {sys.executable} '
                      f'{tmp_path}/fake_train.py "$@"; fi\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    data = meta_only_dataset(tmp_path / "data", vocab_size=2048, seq_len=128, train_tokens=10 ** 8)
    calls = tmp_path / "calls.jsonl"
    return {"PYTHON": str(python), "DATA": str(data), "FAKE_CALLS": str(calls)}, calls


def calls_by_name(calls):
    argvs = [json.loads(line) for line in calls.read_text().splitlines()]
    return {Path(a[a.index("--out") + 1]).name: a for a in argvs}


def test_every_run_goes_through_train_py_and_the_summary_counts_each_outcome(fake_train, tmp_path):
    """No grep-based skipping by name (an earlier sweep skipped by name). train.py is asked about every planned run (it decides
    "already done" by run identity); busy (exit 75) and failed runs are counted apart from done ones."""
    env, calls = fake_train
    names = [x["name"] for x in plan_rows("smoke")[0]]
    env.update(OUT=str(tmp_path / "runs" / "smoke"), FAKE_BUSY=names[0], FAKE_FAIL=names[1])
    first = sweep("--grid", "smoke", "--no-fit", env=env, check=False)
    assert first.returncode != 0
    assert "12 configurations: 10 trained now, 0 already done, 0 reused, 0 restored, 1 busy, 1 failed" in first.stdout
    assert f"busy (locked by another live process; rerun later): {names[0]}" in first.stdout
    assert f"failed: {names[1]} (exit 1" in first.stdout
    assert sorted(calls_by_name(calls)) == sorted(names)
    calls.unlink()
    env.update(FAKE_BUSY="", FAKE_FAIL="")
    again = sweep("--grid", "smoke", "--no-fit", env=env)
    assert "12 configurations: 2 trained now, 10 already done, 0 reused, 0 restored, 0 busy, 0 failed" in again.stdout
    assert sorted(calls_by_name(calls)) == sorted(names)  # asked again, answered "already done"
    assert "12 runs, total compute" in (tmp_path / "runs" / "smoke" / "plan.txt").read_text()


@pytest.mark.slow
def test_case_study_sweep_offers_the_sibling_r1_runs_to_train_py_for_reuse(fake_train, tmp_path):
    """The r = 1 runs of cpu-micro-trunc are cpu-micro's: sweep.sh passes the finished sibling folder as
    --reuse-from and train.py decides (by identity) whether it is the same run. An earlier
    sweep copied the sibling's row by name alone, even for another dataset."""
    env, calls = fake_train
    base = [x["name"] for x in plan_rows("cpu-micro")[0] if x["r"] == 1]
    for name in base:
        (tmp_path / "runs" / "cpu-micro" / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / "cpu-micro" / "runs" / name / "final.json").write_text("{}")
    env.update(OUT=str(tmp_path / "runs" / "cpu-micro-trunc"))
    proc = sweep("--grid", "cpu-micro-trunc", "--no-fit", env=env)
    assert "62 configurations: 48 trained now, 0 already done, 14 reused, 0 restored, 0 busy, 0 failed" in proc.stdout
    by_name = calls_by_name(calls)
    assert len(by_name) == 62
    for name, argv in by_name.items():
        reuse = argv[argv.index("--reuse-from") + 1] if "--reuse-from" in argv else None
        assert reuse == (str(tmp_path / "runs" / "cpu-micro" / "runs" / name) if name in base else None)


def test_gpu_slots_get_their_own_devices_and_rendezvous_ports(fake_train, tmp_path):
    """GPUS=4, GPUS_PER_RUN=2: two runs at a time, each on its own pair of devices and its own torchrun
    port (a fake torchrun on PATH records what it was given and runs the fake train.py)."""
    env, calls = fake_train
    torchrun = tmp_path / "bin" / "torchrun"
    torchrun.parent.mkdir()
    torchrun.write_text(f"""#!/usr/bin/env bash
echo "$CUDA_VISIBLE_DEVICES $1 $2 $3" >> {tmp_path}/torchrun.txt
while [ "$1" != -- ]; do shift; done; shift 2
exec {sys.executable} {tmp_path}/fake_train.py "$@"
""")
    torchrun.chmod(0o755)
    env.update(OUT=str(tmp_path / "out"), GPUS="4", GPUS_PER_RUN="2", PATH=f"{torchrun.parent}:{os.environ['PATH']}")
    proc = sweep("--grid", "smoke", "--no-fit", env=env)
    assert "12 configurations: 12 trained now" in proc.stdout
    launches = [line.split() for line in (tmp_path / "torchrun.txt").read_text().splitlines()]
    assert len(launches) == 12
    for devices, backend, endpoint, nproc in launches:
        slot = {"0,1": 0, "2,3": 1}[devices]
        assert (backend, endpoint, nproc) == ("--rdzv-backend=c10d", f"--rdzv-endpoint=localhost:{29500 + slot}",
                                              "--nproc_per_node=2")


@pytest.mark.parametrize("env, reason", [
    ({"CPU_JOBS": "0", "GPUS": "0"}, "CPU_JOBS must be >= 1"),
    ({"CPU_JOBS": "-2", "GPUS": "0"}, "CPU_JOBS must be a whole number"),
    ({"CPU_JOBS": "two", "GPUS": "0"}, "CPU_JOBS must be a whole number"),
    ({"GPUS": "2", "GPUS_PER_RUN": "0"}, "GPUS_PER_RUN=0 must be in 1..GPUS=2"),
    ({"GPUS": "2", "GPUS_PER_RUN": "3"}, "GPUS_PER_RUN=3 must be in 1..GPUS=2"),
    ({"GPUS": "1.5"}, "GPUS must be a whole number"),
])
def test_bad_parallelism_is_one_line_and_exit_2_never_a_hang(env, reason, fake_train, tmp_path):
    """CPU_JOBS=0 once made the sweep wait for a free slot forever."""
    full_env, calls = fake_train
    full_env.update(env, OUT=str(tmp_path / "out"))
    proc = subprocess.run(["bash", "sweep.sh", "--grid", "smoke", "--no-fit"], cwd=REPO, capture_output=True,
                          text=True, env=dict(os.environ, **full_env), timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith(f"sweep.sh: {reason}")
    assert len(proc.stderr.strip().splitlines()) == 1 and not calls.exists()


@pytest.mark.slow
def test_smoke_grid_builds_its_data_from_the_repository_when_missing(fake_train, tmp_path):
    """A newcomer's ./sweep.sh --grid smoke needs no separate data step: the smoke and CPU grids read
    sources the repository ships, so a missing $DATA is built first (the real prepare_data.py)."""
    env, calls = fake_train
    env.update(OUT=str(tmp_path / "out"), DATA=str(tmp_path / "built"))
    proc = sweep("--grid", "smoke", "--no-fit", env=env)
    assert "building it from the repository's data" in proc.stdout
    meta = json.loads((tmp_path / "built" / "meta.json").read_text())
    assert (meta["vocab_size"], meta["seq_len"], meta["split"]) == (512, 64, {"val_files": ["shard_00001.parquet"]})
    assert len(calls.read_text().splitlines()) == len(plan_rows("smoke")[0])


def test_a_gpu_grid_without_data_names_the_command_that_builds_it(fake_train, tmp_path):
    env, calls = fake_train
    env.update(OUT=str(tmp_path / "out"), DATA=str(tmp_path / "missing"))
    proc = sweep("--grid", "paper", "--no-fit", env=env, check=False)
    assert proc.returncode == 2 and not calls.exists()
    assert f"build it first: " in proc.stderr and f"prepare_data.py --shards 205 --out {tmp_path / 'missing'}" in proc.stderr


def test_data_that_does_not_cover_the_largest_run_is_refused_before_any_run(fake_train, tmp_path):
    """A run that reads more tokens than the prepared training split repeats data; the
    sweep says so before starting anything, with both numbers and how many shards to prepare."""
    env, calls = fake_train
    largest = max(plan_rows("smoke")[0], key=lambda x: x["D"])
    meta_only_dataset(env["DATA"], vocab_size=512, seq_len=64, train_tokens=10_000,
                      settings={"sources": [["a", 1], ["b", 1], ["v", 1]]}, split={"val_files": ["v"]})
    env.update(OUT=str(tmp_path / "out"))
    proc = sweep("--grid", "smoke", "--no-fit", env=env, check=False)
    tokens = flops.tokens_for_budget(flops.ModelConfig(r=largest["r"], scale=largest["s"], head_dim=8, depth=6,
                                                       prelude=1, coda=1, vocab_size=512, seq_len=64),
                                     largest["C"], 512)["tokens"]
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert f"reads {tokens:,} tokens" in proc.stderr and "holds 10,000 training tokens" in proc.stderr
    assert f"prepare >= {math.ceil(tokens / 5000)} training shards" in proc.stderr
    assert not calls.exists()  # nothing started
    allowed = sweep("--grid", "smoke", "--no-fit", env=dict(env, ALLOW_REPEAT="1"))
    assert "12 trained now" in allowed.stdout


@pytest.mark.slow
@pytest.mark.xdist_group("smoke_sweep")  # the worker that trained it for test_slurm
def test_smoke_sweep_end_to_end_then_idempotent_and_resumable(smoke_sweep, sample_data, tmp_path):
    """With the real train.py: data -> train -> results -> fit (the session's smoke sweep); a rerun trains nothing
    (train.py answers "already done" by run identity) and writes a deleted row back from its run's final.json
    (an earlier train.py saw final.json and exited 0, so the row stayed missing)."""
    trained, first_stdout = smoke_sweep
    rows = [json.loads(line) for line in (trained / "results.jsonl").read_text().splitlines()]
    n_runs = len(plan_rows("smoke")[0])
    assert len(rows) == n_runs and f"{n_runs} trained now" in first_stdout
    fit = json.loads((trained / "fit" / "fit.json").read_text())
    assert math.isfinite(fit["joint"]["phi"]) and "phi" in (trained / "fit" / "report.txt").read_text()

    # Rerun with one row dropped: train.py answers "already done" for the others and writes the dropped row back
    # from its folder's final.json, without retraining (an earlier train.py retrained the whole run).
    env = {"OUT": str(tmp_path / "sweep"), "DATA": str(sample_data), "CPU_JOBS": "2"}
    shutil.copytree(trained, tmp_path / "sweep")  # the session's sweep stays as it is for the other tests
    results = tmp_path / "sweep" / "results.jsonl"
    dropped = rows[3]
    results.write_text("".join(json.dumps(r) + "\n" for r in rows if r is not dropped))
    again = sweep("--grid", "smoke", "--no-fit", env=env)
    assert f"0 trained now, {n_runs - 1} already done, 0 reused, 1 restored" in again.stdout
    assert f"restored {Path(dropped['out']).name}" in again.stdout
    new_rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(new_rows) == n_runs
    (restored,) = [r for r in new_rows if r["out"] == dropped["out"]]
    assert restored == dropped  # the very row, from final.json

    # A variant beside it: the r = 1 runs are the same runs (the injection does not apply to a plain stack), so
    # train.py reuses them from the sweep above; the looped ones are new.
    env["OUT"] = str(tmp_path / "smoke-gated")
    variant = sweep("--grid", "smoke", "--variant", "gated", "--budgets", "3e9", "--r", "1 2", "--no-fit", "--",
                    "--injection", "gated", env=env)
    assert "4 configurations: 2 trained now, 0 already done, 2 reused" in variant.stdout
    variant_rows = [json.loads(line) for line in (tmp_path / "smoke-gated" / "results.jsonl").read_text().splitlines()]
    by_id = {row["run_id"]: row for row in rows}
    assert sorted(row["injection"] for row in variant_rows) == ["gated", "gated", "none", "none"]
    assert all((row["run_id"] in by_id) == (row["r"] == 1) for row in variant_rows)


def group_alive(pgid):
    """Whether any process of the group is left (signal 0 checks without sending anything)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


# Two runs of the smoke grid, given 6 times their budget: long enough to be stopped in the middle.
SMOKE_R4 = ["--grid", "smoke", "--budgets", "1e10", "--r", "4", "--no-fit", "--", "--flops", "6e10"]
SMOKE_R4_RUNS = ("r4_s0.25_C1e10_smoke", "r4_s0.5_C1e10_smoke")


def interrupt_sweep(env, whom, signum):
    """Start the sweep in a session of its own, wait until each run's train.py has logged two progress lines in
    this attempt, send signum to sweep.sh alone or to the whole group (a terminal's Ctrl-C), and return the exit
    status, stderr and what each run logged in this attempt, once every process of the group is gone."""
    logs = {name: Path(env["OUT"]) / "logs" / f"{name}.log" for name in SMOKE_R4_RUNS}
    start = {name: path.stat().st_size if path.exists() else 0 for name, path in logs.items()}

    def said(name):
        return logs[name].read_text()[start[name]:] if logs[name].exists() else ""
    # A terminal's shell starts sweep.sh with SIGINT at its default; pytest itself may not have it (a job a
    # non-interactive shell starts in the background ignores SIGINT, and an ignored signal is inherited through
    # exec: bash may not trap a signal ignored on entry), so the child gets the terminal's disposition back.
    proc = subprocess.Popen(["bash", "sweep.sh", *SMOKE_R4], cwd=REPO, env=dict(os.environ, **env), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120  # liveness bounds, here and below, not timings
    while time.time() < deadline and proc.poll() is None and min(said(n).count("\nstep ") for n in logs) < 2:
        time.sleep(0.05)
    if whom == "sweep.sh":
        proc.send_signal(signum)
    else:
        os.killpg(proc.pid, signum)
    stdout, stderr = proc.communicate(timeout=120)
    stderr += stdout[-1000:]  # what sweep.sh said before stopping, for a failure's message
    deadline = time.time() + 30
    while time.time() < deadline and group_alive(proc.pid):
        time.sleep(0.1)
    left = group_alive(proc.pid)
    if left:
        os.killpg(proc.pid, signal.SIGKILL)
    assert not left, "a train.py outlived the sweep"
    return proc.returncode, stderr, {name: said(name) for name in logs}


@pytest.mark.slow
def test_a_stopped_sweep_stops_every_run_at_once_and_a_rerun_resumes_them(sample_data, tmp_path):
    """Ctrl-C in a terminal (SIGINT to every process of the group) or SIGTERM to sweep.sh alone (timeout, kill):
    the sweep passes SIGTERM to its train.py runs (each started with `bash -c`, which execs it), each says it is
    stopping, checkpoints its last finished step and exits 143, and the sweep exits 130 with no process of it
    left. Rerun, it resumes each run where it stopped (--resume) and, the last time, finishes them."""
    env = {"OUT": str(tmp_path / "sweep"), "DATA": str(sample_data), "CPU_JOBS": "2", "OMP_NUM_THREADS": "1",
           "ALLOW_REPEAT": "1"}  # 6 times the budget reads the sample 1.4 times
    stopped_at = {name: 0 for name in SMOKE_R4_RUNS}
    for whom, signum in (("the group", signal.SIGINT), ("sweep.sh", signal.SIGTERM)):
        code, stderr, said = interrupt_sweep(env, whom, signum)
        assert code == 130 and "sweep.sh: interrupted" in stderr, stderr[-2000:]
        for name, text in said.items():
            assert f"train.py: stopping at step " in text, text[-2000:]
            step, steps = map(int, re.search(r"train\.py: interrupted at step (\d+)/(\d+)", text).groups())
            assert stopped_at[name] < step < steps, (whom, name, step)
            if stopped_at[name]:
                assert f"resumed {tmp_path / 'sweep' / 'runs' / name / 'ckpt.pt'} at step {stopped_at[name]}/" in text
            stopped_at[name] = step
    finished = sweep(*SMOKE_R4, env=env)
    assert "2 configurations: 2 trained now" in finished.stdout
    for name in SMOKE_R4_RUNS:
        text = (tmp_path / "sweep" / "logs" / f"{name}.log").read_text().split("resumed ")[-1]
        assert text.startswith(f"{tmp_path / 'sweep' / 'runs' / name / 'ckpt.pt'} at step {stopped_at[name]}/")
        assert "final val loss" in text
