"""
An ablation in one command (dev/ablate.sh): a variant of the CPU grid trained only where it differs, and its
answer (dev/ablation_report.py): the paired table next to the noise of retraining and reseeding, delta-phi on
both anchors, a figure. The hyperconnection case study is such a variant of cpu-micro, and serves as one here.
"""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nanoloop.common import DataError
from conftest import meta_only_dataset

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "dev" / "results"
sys.path.insert(0, str(ROOT / "dev"))
import ablation_report  # noqa: E402 (dev/'s script, for its checks of an ablation's flags)


def read_jsonl(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def report(out, *args):
    proc = subprocess.run([sys.executable, str(ROOT / "dev" / "ablation_report.py"), str(out), *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def hyper_as_an_ablation(tmp_path_factory):
    """cpu-micro-hyper's rows and its two --compare fits in a fresh OUT, as dev/ablate.sh leaves a variant."""
    out = tmp_path_factory.mktemp("ablation") / "cpu-micro-hyper"
    (out / "fit").mkdir(parents=True)
    shutil.copy(RESULTS / "cpu-micro-hyper" / "results.jsonl", out)
    for name in ("compare.json", "compare_layout.json"):
        shutil.copy(RESULTS / "cpu-micro-hyper" / "fit" / name, out / "fit")
    return out, report(out)


def test_the_paired_table_is_variant_minus_base_at_each_width_and_at_each_best_width(hyper_as_an_ablation):
    out, text = hyper_as_an_ablation
    base = {(row["flops_budget"], row["r"], row["d_model"]): row["val_loss"]
            for row in read_jsonl(RESULTS / "cpu-micro" / "results.jsonl")}
    variant = {(row["flops_budget"], row["r"], row["d_model"]): row["val_loss"] for row in read_jsonl(out / "results.jsonl")}
    lines = [line for line in text.splitlines() if line.startswith("| 5e+12 | 2 |")]
    (line,) = lines
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    widths = sorted({d for (_, r, d) in variant if r > 1})
    for d, cell in zip(widths, cells[2:]):
        if (5e12, 2, d) in variant and (5e12, 2, d) in base:
            assert float(cell) == pytest.approx(variant[5e12, 2, d] - base[5e12, 2, d], abs=6e-4), d
    best_base = min(v for (C, r, _), v in base.items() if (C, r) == (5e12, 2))
    best_variant = min(v for (C, r, _), v in variant.items() if (C, r) == (5e12, 2))
    assert float(cells[-1]) == pytest.approx(best_variant - best_base, abs=6e-4)
    assert not any(line.startswith(f"| {C:.2g} | 1 |") for C in (5e11, 5e12) for line in text.splitlines())


def test_the_noise_beside_it_is_the_retrained_and_reseeded_runs(hyper_as_an_ablation):
    """Two references for "nothing changed": a committed run trained again here (same run_id) and a run with
    another seed, both from dev/results/cpu-micro-eval."""
    _, text = hyper_as_an_ablation
    committed = {row["run_id"]: row["val_loss"] for row in read_jsonl(RESULTS / "cpu-micro" / "results.jsonl")}
    retrained = [abs(row["val_loss"] - committed[row["run_id"]]) for row in
                 read_jsonl(RESULTS / "cpu-micro-eval" / "results.jsonl") if row["r"] == 4 and row["run_id"] in committed]
    (line,) = [line for line in text.splitlines() if line.startswith("| retrained here (same run_id) | 4 |")]
    assert line.split("|")[-2].strip() == f"{max(retrained):.3f}"
    assert "| seed 1 vs seed 0 (5e12) | 4 | 1 |" in text


def test_delta_phi_on_both_anchors_is_fit_laws_compare_and_the_figure_is_written(hyper_as_an_ablation):
    """Each arm's phi and delta-phi with their 95% CIs, from fit_laws.py --compare. A CI that runs to the fitter's
    search bound (phi = -3: the plain anchor's) is no interval, and neither is a delta-phi with such an arm: both
    say "not identified" instead of printing the box as a CI."""
    out, text = hyper_as_an_ablation
    layout = json.loads((out / "fit" / "compare_layout.json").read_text())["delta_phi"]
    lo, hi = layout["delta_phi_ci"]
    assert f"| layout-matched r = 1 | 1.12 [0.92, 1.29] | 1.09 [0.78, 1.52] | {layout['delta_phi']:+.2f} " \
           f"[{lo:+.2f}, {hi:+.2f}] |" in text
    plain = json.loads((out / "fit" / "compare.json").read_text())
    assert plain["joint"]["phi_ci"][0] == -3.0 and plain["delta_phi"]["delta_phi_ci"][1] > 3  # the box, not data
    assert f"| plain r = 1 | 0.82 (CI reaches the bound -3: not identified) | 0.90 [0.78, 1.09] | " \
           f"{plain['delta_phi']['delta_phi']:+.2f} (an arm's φ CI reaches the bound -3: not identified) |" in text
    assert "[-3.00" not in text and "+3.95]" not in text
    assert (out / "fit" / "ablation.png").stat().st_size > 10_000


def test_layout_anchored_rows_are_the_case_studies(hyper_as_an_ablation):
    """The layout-matched anchor is cpu-micro-layout's r = 1 runs with the variant's looped runs: the same rows
    dev/study_tables.py built for the committed case study."""
    out, _ = hyper_as_an_ablation
    rows = [json.loads(line) for line in report(out, "--layout-anchored-rows").splitlines()]
    committed = read_jsonl(RESULTS / "cpu-micro-hyper" / "fit" / "layout_anchored.jsonl")
    assert [row["run_id"] for row in rows] == [row["run_id"] for row in committed]


@pytest.mark.parametrize("args, reason", [([], "usage"), (["gated"], "after --"), (["gated", "--"], "after --"),
                                          (["--quick"], "usage"), (["trunc", "--grid", "cpu-micro-trunc", "--"], "itself"),
                                          (["trunc", "--grid", "paper", "--", "--quiet"], "--grid takes")])
def test_ablate_sh_refuses_a_call_without_a_name_or_flags(args, reason):
    proc = subprocess.run(["bash", str(ROOT / "dev" / "ablate.sh"), *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and reason in proc.stderr and len(proc.stderr.splitlines()) == 1


def test_the_quick_preset_reads_as_a_paired_table_and_point_estimates(tmp_path):
    """--quick fits without a bootstrap (one looped r at two budgets does not identify phi): the committed quick
    answer's report gives both arms' phi as point estimates, never an interval of NaNs, and pairs the 7 looped
    runs with the base's runs of the same cells (the r = 1 runs are the base's own)."""
    out = tmp_path / "cpu-micro-gated-quick"
    shutil.copytree(RESULTS / "cpu-micro-gated-quick" / "fit", out / "fit")
    shutil.copy(RESULTS / "cpu-micro-gated-quick" / "results.jsonl", out)
    text = report(out)
    # each arm's phi and delta-phi on both anchors, and the layout-matched delta-phi under the verdict
    assert not re.search(r"\bnan\b", text) and text.count("(no CI)") == 7
    rows = read_jsonl(out / "results.jsonl")
    assert sorted(row["r"] for row in rows) == [1] * 7 + [4] * 7
    base = {row["run_id"] for row in read_jsonl(RESULTS / "cpu-micro" / "results.jsonl")}
    assert {row["run_id"] for row in rows if row["r"] == 1} <= base


def test_the_untied_arm_is_the_anchor_of_the_bases_looped_runs():
    """`bash dev/ablate.sh untied -- --untied`: every looped cell of the base trained untied (Truncate or Not?
    App. E.2: each loop its own block, W_inj and norm; the tied model's FLOPs per token), its r = 1 runs the base's
    own. Untied loops share nothing, so the arm is an anchor: both comparisons fit the base's 42 looped runs
    against its 42 untied runs (the committed fit/untied_anchored.jsonl), and the report says so."""
    out = RESULTS / "cpu-micro-untied"
    rows = read_jsonl(out / "results.jsonl")
    base = read_jsonl(RESULTS / "cpu-micro" / "results.jsonl")
    untied = [row for row in rows if row.get("untied")]
    cells = sorted((row["flops_budget"], row["r"], row["scale"]) for row in untied)
    assert cells == sorted((row["flops_budget"], row["r"], row["scale"]) for row in base if row["r"] > 1)
    assert {row["run_id"] for row in rows if not row.get("untied")} <= {row["run_id"] for row in base}
    tied = {(row["flops_budget"], row["r"], row["scale"]): row for row in base}
    for row in untied:
        twin = tied[row["flops_budget"], row["r"], row["scale"]]
        assert row["flops_per_token"] == twin["flops_per_token"]
        assert row["n_params"] == twin["n_once"] + row["r"] * (twin["n_rec"] + row["d_model"]) - row["d_model"]
    anchored = read_jsonl(out / "fit" / "untied_anchored.jsonl")
    want = ablation_report.untied_anchored_rows(rows, base)
    assert [row["run_id"] for row in anchored] == [row["run_id"] for row in want] and len(anchored) == 84
    for name in ("compare.json", "compare_layout.json"):
        fitted = json.loads((out / "fit" / name).read_text())["compare"]
        assert fitted["groups"] == {"untied": 42, "r=2 bwd=2 linear": 14, "r=4 bwd=4 linear": 14,
                                    "r=8 bwd=8 linear": 14}
    assert "arm trains untied loops, which share nothing: an anchor" in (out / "fit" / "ablation.txt").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("anchor", ["cpu-micro", "cpu-micro-layout"])
def test_an_ablation_reuses_the_committed_fit_of_each_anchor(anchor, tmp_path):
    """dev/ablate.sh compares the variant against both anchors with fit_laws.py's protocol options: the fit
    committed in each anchor's fit/ must still be current (same rows, options and fitting code), so that an
    ablation fits only its own arm. After a change to the fitting code, refit the anchor as sweep.sh does."""
    results = RESULTS / anchor / "results.jsonl"
    proc = subprocess.run([sys.executable, str(ROOT / "fit_laws.py"), str(results), "--json", str(tmp_path / "a.json")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"reused the analysis in {RESULTS / anchor / 'fit' / 'fit.json'}" in proc.stderr


# ----------------------------------------------------------------------------------------------
# Before anything trains: the flags, the r = 1 anchors, the plan, and what a failure leaves

QUICK = ("--budgets", "1.1e12 2.4e12", "--r", "1 4")  # ablate.sh --quick's cells


def grid_lines(*subset):
    """The cpu-micro grid's train.py commands, as sweep.sh prints them on a machine without GPUs."""
    proc = subprocess.run(["bash", str(ROOT / "sweep.sh"), "--grid", "cpu-micro", "--print", *subset],
                          capture_output=True, text=True, timeout=60, env=os.environ | {"GPUS": "0"}, check=True)
    return proc.stdout.splitlines()


def ablate(*args, **env):
    return subprocess.run(["bash", str(ROOT / "dev" / "ablate.sh"), *args], capture_output=True, text=True,
                          timeout=300, env=os.environ | {"OMP_NUM_THREADS": "1"} | env)


@pytest.mark.parametrize("flags, r1_takes", [
    (["--random-state-init"], []),  # flops.ModelConfig refuses it for the plain r = 1 stack: no state to draw
    (["--r-bwd", "2", "--lr-norm", "0.1"], ["--lr-norm", "0.1"]),  # a loop flag beside one that changes r = 1 too
    (["--injection", "gated"], ["--injection", "gated"]),  # the plain stack has no injection: r = 1 stays the same run
    (["--loops", "uniform", "--loops-max", "6"], ["--loops-max", "6"]),  # no loop to sample at r = 1 (nanoloop/loops.py)
], ids=["random-state-init", "r-bwd-with-an-lr", "gated", "sampled-loops"])
def test_a_loop_flag_that_means_nothing_at_r1_is_not_given_to_the_r1_runs(flags, r1_takes):
    kept, left_out = ablation_report.r1_flags(grid_lines(*QUICK), flags)
    assert [token for group in kept for token in group] == r1_takes
    assert [token for group in left_out for token in group] == [f for f in flags if f not in r1_takes]


@pytest.mark.parametrize("flags, reason", [
    (["--injection", "gated", "--help"], "--help among the train.py flags"),
    (["--injection", "gated", "--he"], "--help among the train.py flags"),  # argparse takes an abbreviation too
    (["--r", "2"], "--r is set by the grid"),
    (["--injection", "hyper", "--r-bwd", "2"], "hyper injection needs full BPTT"),
    (["--no-such-flag"], "unrecognized arguments"),
], ids=["help", "help-abbreviated", "grid-flag", "a-model-the-looped-runs-refuse", "unknown-flag"])
def test_flags_an_ablation_cannot_run_are_refused_before_anything_trains(flags, reason):
    with pytest.raises(DataError, match=reason):
        ablation_report.r1_flags(grid_lines(*QUICK), flags)


@pytest.mark.slow
def test_train_py_help_among_the_flags_is_one_line_and_leaves_no_folder(tmp_path):
    """What ran 14 train.py --help, reported "14 trained now" and left its folder behind: one line, exit 2."""
    out = tmp_path / "cpu-micro-scaled-quick"
    proc = ablate("scaled", "--quick", "--", "--injection", "scaled", "--help", OUT=str(out))
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1 and "--help" in proc.stderr, proc.stderr
    assert proc.stdout == "" and not out.exists()


def test_ablate_sh_help_says_what_it_does():
    proc = ablate("--help")
    assert proc.returncode == 0 and proc.stdout.startswith("usage: bash dev/ablate.sh NAME [--quick] [--quiet] [--paired-init] [--plan]")
    assert "--plan lists every run" in proc.stdout and "INCOMPLETE" in proc.stdout and "--init-draws by-name" in proc.stdout


@pytest.fixture(scope="module")
def committed_data(tmp_path_factory):
    """A dataset folder with the meta.json the committed cpu-micro runs were trained on (the checksums in their
    identity, 3,127 validation rows) and no token rows: all that a run's identity reads of its data."""
    row = json.loads((RESULTS / "cpu-micro" / "results.jsonl").read_text().splitlines()[0])
    data, val_rows = row["identity"]["data"], row["data_meta"]["val_rows"]
    folder = meta_only_dataset(tmp_path_factory.mktemp("micro") / "data", val_rows=val_rows,
                               **{k: data[k] for k in ("tokenizer_sha256", "train_sha256", "val_sha256", "vocab_size",
                                                       "seq_len")})
    (folder / "val.bin").write_bytes(bytes(2 * val_rows * (data["seq_len"] + 1)))  # the size meta.json says
    return folder


@pytest.mark.slow
def test_the_plan_lists_each_run_reused_or_to_train_with_its_flags_and_writes_nothing(committed_data, tmp_path):
    """--plan of a loop-flag ablation: every r = 1 run is the base's, reused from a committed folder whose run_id
    is its identity (not given the flag, which means nothing there), every r = 4 run gets the flag and is to
    train, with a time; the steps are flops.py's for the budget, as the committed runs'; nothing is written."""
    out = tmp_path / "cpu-micro-rsi-quick"
    proc = ablate("rsi", "--quick", "--plan", "--", "--random-state-init", OUT=str(out), DATA=str(committed_data))
    assert proc.returncode == 0, proc.stderr
    committed = {Path(row["out"]).name: row for row in read_jsonl(RESULTS / "cpu-micro" / "results.jsonl")}
    runs = [line.split() for line in proc.stdout.splitlines() if "_micro " in line]
    assert len(runs) == 14
    for name, r, d, budget, steps, *rest in runs:
        assert int(steps) == committed[name]["steps"] and float(budget) == committed[name]["flops_budget"], name
        if r == "1":
            flags, state, folder = rest
            assert (flags, state) == ("(none)", "reuse"), rest
            assert json.loads((ROOT / folder / "final.json").read_text())["run_id"] == committed[name]["run_id"]
        else:
            assert rest[0] == "--random-state-init" and rest[-1] == "train" and rest[-2] in ("s", "min"), rest
    assert "14 runs: 7 to train, 7 reused" in proc.stdout
    assert "r = 1 runs: not given --random-state-init" in proc.stdout and "time to train: ~" in proc.stdout
    assert "the whole ablation: 7 run(s) to train over 1 arm(s), ~" in proc.stdout
    assert not out.exists()


@pytest.mark.slow
def test_a_case_study_grid_gives_the_variant_its_per_r_flags(committed_data, tmp_path):
    """--grid cpu-micro-trunc: the variant's runs are that grid's, r_bwd = ceil(r/2) at each looped r (2 at r = 4,
    in the run's name as sweep.sh gives it) and its wider width at each budget, on the recipe --quiet adds (no flag
    of its own is needed), the committed full arm's runs reused; its r = 1 runs are the quiet base's, reused; the
    base arms stay cpu-micro's."""
    out = tmp_path / "cpu-micro-trunc-quick-quiet"
    proc = ablate("trunc", "--quick", "--quiet", "--grid", "cpu-micro-trunc", "--plan", "--", OUT=str(out),
                  DATA=str(committed_data))
    assert proc.returncode == 0, proc.stderr
    arm = proc.stdout.split(f"{out} (sweep.sh --grid cpu-micro-trunc --variant trunc")[1]
    runs = [line.split() for line in arm.splitlines() if "_micro " in line]
    looped = [run for run in runs if run[1] == "4"]
    assert len(looped) == 9 and all(run[0].endswith("_rb2_micro") for run in looped)
    # the full arm's runs (results/cpu-micro-trunc-quiet) are these runs: the quick arm reuses them
    assert all(run[-2:] == ["reuse", f"dev/results/cpu-micro-trunc-quiet/runs/{run[0]}"] for run in looped)
    assert {(run[2], run[3]) for run in looped} >= {("32", "1.1e12"), ("40", "2.4e12")}  # the grid's wider widths
    assert all(run[-2] == "reuse" for run in runs if run[1] == "1") and len(runs) == 16
    assert all("--lr-matrix 0.014" in " ".join(run) for run in runs)
    assert "dev/results/cpu-micro-quiet (sweep.sh --grid cpu-micro --variant quiet" in proc.stdout
    assert not out.exists()


def test_paired_init_gives_both_arms_and_their_own_base_the_same_initial_draws(committed_data):
    """--paired-init: every run of every arm (the base of its recipe, its layout anchor, the variant, each
    replicate) is trained with --init-draws by-name, and the base is its own (cpu-micro-quiet-byname with --quiet),
    not the committed quiet base drawn from the global RNG."""
    proc = ablate("gated", "--quick", "--quiet", "--paired-init", "--seeds", "2", "--plan", "--", "--injection",
                  "gated", DATA=str(committed_data))
    assert proc.returncode == 0, proc.stderr
    assert "the plan into dev/results/cpu-micro-gated-quick-quiet-byname" in proc.stdout
    for arm in ("cpu-micro-quiet-byname (sweep.sh --grid cpu-micro --variant quiet-byname",
                "cpu-micro-quiet-byname-layout (sweep.sh --grid cpu-micro-layout", "cpu-micro-quiet-byname-seed1 (",
                "cpu-micro-gated-quick-quiet-byname-seed1 ("):
        assert f"dev/results/{arm}" in proc.stdout, arm
    runs = [line for line in proc.stdout.splitlines() if "_micro " in line]
    assert len(runs) == 14 + 14 + 14 + 7 + 7 and all("--init-draws by-name" in line for line in runs)


def test_the_plans_total_adds_every_arms_runs_and_time(tmp_path):
    """--seeds K trains its arms one after another (the base's replicates, then the variant's), so the plan's
    total is the sum over the arms --plan tallied: runs to train and estimated wall time, before the power."""
    tally = tmp_path / "tally.jsonl"
    arms = [{"to_train": 7, "seconds": 480.0}, {"to_train": 0, "seconds": 0.0}, {"to_train": 7, "seconds": 420.0}]
    tally.write_text("".join(json.dumps(arm) + "\n" for arm in arms))
    proc = subprocess.run([sys.executable, str(ROOT / "dev" / "ablation_report.py"), str(tmp_path / "out"),
                           "--power", "2", "--quick", "--slots", "2", "--tally", str(tally)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "the whole ablation: 14 run(s) to train over 3 arm(s), ~15 min on 2 slot(s), then the fits " \
                       "and the report"
    assert lines[1].startswith("power at r = 4: ±")


@pytest.mark.parametrize("arm", ["gated", "null", "lr007", "hyper"])
def test_the_plans_power_is_the_half_width_the_committed_quiet_arms_reached(arm):
    """--plan's power for a --quick --quiet arm comes from the quiet base's own replicates at the quick cells (all
    its seeds), and it is what the committed arms then reached: at most the predicted half-width (the prediction takes
    the arms' noise as independent; pairing can only share some of it), and not less than half of it, at their
    seeds; so a plan's "±0.010 takes K seeds" is an honest price."""
    base = RESULTS / "cpu-micro-quiet"
    reached = json.loads((RESULTS / f"cpu-micro-{arm}-quick-quiet" / "fit" / "ablation.json").read_text())
    reached = reached["verdicts"]["r = 4"]
    line, = ablation_report.power_lines(reached["n_seeds"], True, "cosine-avg-lr014", base)
    base_seeds = len(list(base.parent.glob(f"{base.name}-seed*"))) + 1
    assert f"the base's {base_seeds} replicates at these cells" in line
    predicted = float(re.search(r"±([0-9.]+) nats", line).group(1))
    assert 0.5 * predicted <= reached["half_width"] <= predicted + 0.0005  # the line rounds to 0.001


def test_a_rerun_with_other_flags_is_refused_before_it_touches_the_finished_ablation(committed_data, tmp_path):
    """The committed gated quick arm asked again under its NAME with another change (hyper, not gated): every arm is
    checked before anything is written, so it is one line and exit 2, and the finished report stays a result (no
    INCOMPLETE marker, fit/ablation.txt where it was), instead of a refusal at each run after the report is gone."""
    out = tmp_path / "cpu-micro-gated-quick"
    shutil.copytree(RESULTS / "cpu-micro-gated-quick", out)
    report = (out / "fit" / "ablation.txt").read_text()
    proc = ablate("gated", "--quick", "--", "--injection", "hyper", OUT=str(out), DATA=str(committed_data))
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "holds a run of other flags" in proc.stderr and "another NAME" in proc.stderr
    assert (out / "fit" / "ablation.txt").read_text() == report and not (out / "INCOMPLETE").exists()


@pytest.mark.slow
def test_the_plan_in_a_fresh_clone_builds_the_data_and_reuses_the_committed_r1_runs(tmp_path):
    """README's preview in a clone without data/micro-2k: the plan builds it as the base's was (the same bytes,
    so the r = 1 runs' identities are the committed ones and are reused) instead of refusing."""
    data = tmp_path / "fresh" / "micro-2k"
    proc = ablate("rsi", "--quick", "--plan", "--", "--random-state-init", OUT=str(tmp_path / "out"), DATA=str(data))
    assert proc.returncode == 0, proc.stderr
    assert f"{data}/meta.json not found; building it as the base was" in proc.stderr
    assert (data / "meta.json").is_file() and "14 runs: 7 to train, 7 reused" in proc.stdout


@pytest.mark.slow
def test_a_failed_ablation_is_marked_incomplete_and_its_report_refused(tmp_path):
    """Damaged data the check before training can see (val.bin empty) is one line, exit 2, nothing written; a
    failure after ablate.sh has started (no training tokens: every run to train fails) leaves OUT/INCOMPLETE
    saying how it stopped and no fit/ablation.txt; dev/ablation_report.py refuses the folder in one line."""
    data = meta_only_dataset(tmp_path / "data", val_rows=3127)
    out = tmp_path / "cpu-micro-rsi-quick"
    proc = ablate("rsi", "--quick", "--", "--random-state-init", OUT=str(out), DATA=str(data))
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1 and "val.bin: 0 bytes" in proc.stderr
    assert not out.exists()
    seq_len = json.loads((data / "meta.json").read_text())["seq_len"]
    (data / "val.bin").write_bytes(bytes(2 * 3127 * (seq_len + 1)))  # the size meta.json says; train.bin stays empty
    proc = ablate("rsi", "--quick", "--", "--random-state-init", OUT=str(out), DATA=str(data))
    assert proc.returncode == 1, proc.stderr
    assert "failed (exit 1)" in (out / "INCOMPLETE").read_text()
    assert not (out / "fit" / "ablation.txt").exists()
    refused = subprocess.run([sys.executable, str(ROOT / "dev" / "ablation_report.py"), str(out)],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1
    assert "not a finished ablation" in refused.stderr and "INCOMPLETE" in refused.stderr


QUIET_REPORT = ("--base", str(RESULTS / "cpu-micro-quiet"), "--noise-recipe", "cosine-avg-lr014")  # ablate.sh --quiet's


@pytest.mark.parametrize("arm, flags", [("gated", ()), ("trunc", ()), ("hyper", ()), ("gated-quiet", QUIET_REPORT),
                                        ("trunc-quiet", QUIET_REPORT)])
def test_each_committed_full_arms_report_is_what_the_report_prints_now(arm, flags, tmp_path):
    """The full arms' committed fit/ablation.txt (the gated ablation on the grid's recipe and on the quiet one,
    and the truncated-BPTT and hyperconnection case studies that sweep.sh trained) is what this checkout's report
    prints from their committed rows and fits against their base: README's verdicts cannot go stale behind a
    change to the verdict or the tables."""
    out = tmp_path / f"cpu-micro-{arm}"
    (out / "fit").mkdir(parents=True)
    shutil.copy(RESULTS / out.name / "results.jsonl", out)
    for name in ("compare.json", "compare_layout.json"):
        shutil.copy(RESULTS / out.name / "fit" / name, out / "fit")
    proc = subprocess.run([sys.executable, str(ROOT / "dev" / "ablation_report.py"), str(out), *flags],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    committed = (RESULTS / out.name / "fit" / "ablation.txt").read_text().splitlines()
    # the lines that name where it ran: the figure's path, ablate.sh's timing, the note on who wrote it
    where = ("(c) wrote", "ablate.sh ", "(report ")
    assert [line for line in proc.stdout.splitlines() if not line.startswith(where)] == \
        [line for line in committed if not line.startswith(where)]
    assert json.loads((out / "fit" / "ablation.json").read_text())["verdicts"] == \
        json.loads((RESULTS / out.name / "fit" / "ablation.json").read_text())["verdicts"]


@pytest.mark.parametrize("arm", ["gated", "hyper", "null", "null200", "lr007", "rsi", "gated-byname"])
def test_each_committed_quiet_arms_report_is_what_the_report_prints_now(arm, tmp_path):
    """The quick arms on the quiet recipe, every replicate: their committed fit/ablation.txt is what this checkout
    prints against their base (the quiet one, or with --paired-init its own), and "nothing changed" there is the
    base at another seed (each replicate against seed 0 at the 7 cells), since a retrain of the quiet recipe is
    bit-identical."""
    arm, _, draws = arm.partition("-")
    name = f"cpu-micro-{arm}-quick-quiet" + (f"-{draws}" if draws else "")
    base = "cpu-micro-quiet" + (f"-{draws}" if draws else "")
    seeds = json.loads((RESULTS / name / "fit" / "ablation.json").read_text())["verdicts"]["r = 4"]["n_seeds"]
    for i in range(seeds):
        folder = name if i == 0 else f"{name}-seed{i}"
        (tmp_path / folder).mkdir()
        shutil.copy(RESULTS / folder / "results.jsonl", tmp_path / folder)
    (tmp_path / name / "fit").mkdir()
    for fit in ("compare.json", "compare_layout.json"):
        shutil.copy(RESULTS / name / "fit" / fit, tmp_path / name / "fit")
    text = report(tmp_path / name, "--base", str(RESULTS / base), "--noise-recipe", "cosine-avg-lr014")
    committed = (RESULTS / name / "fit" / "ablation.txt").read_text().splitlines()
    where = ("(c) wrote", "ablate.sh ", "(--quick")
    assert [line for line in text.splitlines() if not line.startswith(where)] == \
        [line for line in committed if not line.startswith(where)]
    base_seeds = len(list(RESULTS.glob(f"{base}-seed*"))) + 1
    assert f"| the base at seed i vs seed 0 (its replicates) | 4 | {7 * (base_seeds - 1)} |" in text
    assert (tmp_path / name / "fit" / "ablation.png").stat().st_size > 10_000


def test_the_report_leads_with_a_verdict_per_r_and_writes_it_for_a_program(tmp_path):
    """The committed gated arm, reported again: a verdict line per looped r and pooled (no difference at 42 cells
    of one seed, each with its ±), Δφ against the layout-matched anchor next, then the tables; fit/ablation.json
    holds the same numbers."""
    out = tmp_path / "cpu-micro-gated"
    (out / "fit").mkdir(parents=True)
    shutil.copy(RESULTS / "cpu-micro-gated" / "results.jsonl", out)
    for name in ("compare.json", "compare_layout.json"):
        shutil.copy(RESULTS / "cpu-micro-gated" / "fit" / name, out / "fit")
    proc = subprocess.run([sys.executable, str(ROOT / "dev" / "ablation_report.py"), str(out)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("verdict: gated minus base") and "1 seed(s)" in lines[0]
    assert [line.split(":")[0] for line in lines[2:6]] == ["r = 2", "r = 4", "r = 8", "all r"]
    assert all(": no difference larger than ±0.0" in line for line in lines[2:6])
    assert lines[6].startswith("Δφ against the layout-matched r = 1") and "[-0.34, +0.16]" in lines[6]
    summary = json.loads((out / "fit" / "ablation.json").read_text())
    pooled = summary["verdicts"]["all r"]
    assert pooled["word"] == "no difference" and pooled["n_cells"] == 42 and pooled["ci"][0] < 0 < pooled["ci"][1]
    assert summary["delta_phi"]["layout-matched"]["ci"] == pytest.approx([-0.34, 0.16], abs=0.005)
