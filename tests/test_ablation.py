"""
An ablation in one command (dev/ablate.sh): a variant of the CPU grid trained only where it differs, and its
answer (dev/ablation_report.py): the paired table next to the noise of retraining and reseeding, delta-phi on
both anchors, a figure. The hyperconnection case study is such a variant of cpu-micro, and serves as one here.
"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "dev" / "results"


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
    out, text = hyper_as_an_ablation
    for label, name in (("layout-matched r = 1", "compare_layout.json"), ("plain r = 1", "compare.json")):
        fit = json.loads((out / "fit" / name).read_text())
        delta = fit["delta_phi"]
        lo, hi = delta["delta_phi_ci"]
        assert f"| {label} |" in text and f"{delta['delta_phi']:+.2f} [{lo:+.2f}, {hi:+.2f}] |" in text
    assert (out / "fit" / "ablation.png").stat().st_size > 10_000


def test_layout_anchored_rows_are_the_case_studies(hyper_as_an_ablation):
    """The layout-matched anchor is cpu-micro-layout's r = 1 runs with the variant's looped runs: the same rows
    dev/study_tables.py built for the committed case study."""
    out, _ = hyper_as_an_ablation
    rows = [json.loads(line) for line in report(out, "--layout-anchored-rows").splitlines()]
    committed = read_jsonl(RESULTS / "cpu-micro-hyper" / "fit" / "layout_anchored.jsonl")
    assert [row["run_id"] for row in rows] == [row["run_id"] for row in committed]


@pytest.mark.parametrize("args, reason", [([], "usage"), (["gated"], "after --"), (["gated", "--"], "after --"),
                                          (["--quick"], "usage")])
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
    assert "nan" not in text and text.count("(no CI)") == 4
    rows = read_jsonl(out / "results.jsonl")
    assert sorted(row["r"] for row in rows) == [1] * 7 + [4] * 7
    base = {row["run_id"] for row in read_jsonl(RESULTS / "cpu-micro" / "results.jsonl")}
    assert {row["run_id"] for row in rows if row["r"] == 1} <= base


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
