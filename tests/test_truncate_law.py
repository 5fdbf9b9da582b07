"""
Truncate or Not?'s law (truncate_law.py, fit_laws.py --law truncate-or-not): its looping coefficient and the
published tables it gives, its fit on their suite's design (token horizons under their recipe), the fold structure
of its held-out checks, the comparator, g-hat and the per-setting laws.
"""
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fit_laws
import flops
from nanoloop import truncate_law as tl

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "dev"))
import synthetic_sweep  # noqa: E402

# Their Table 9: g(T, B) and N_eff / N at the 240M model's N_rec / N = 0.507.
TABLE_9 = {(1, 1): (1.00000, 1.00000), (2, 1): (1.18330, 1.09294), (2, 2): (1.91023, 1.46150),
           (4, 1): (1.36498, 1.18505), (4, 2): (2.04945, 1.53209), (4, 4): (2.50361, 1.76236),
           (8, 2): (2.17552, 1.59601), (8, 4): (2.57832, 1.80024), (8, 8): (2.80330, 1.91431),
           (16, 16): (2.93895, 1.98308)}
SHARE = 0.507


def test_the_looping_coefficient_is_table_9_bounded_by_e_to_the_c_and_discounted_by_truncation():
    c = tl.PUBLISHED
    for (T, B), (g, neff_ratio) in TABLE_9.items():
        got = float(tl.g_loop(T, B, c["c"], c["p"], c["q"]))
        assert got == pytest.approx(g, abs=2e-5)  # the table's values come from unrounded coefficients
        assert 1 - SHARE + SHARE * got == pytest.approx(neff_ratio, abs=5e-5)
    assert tl.g_loop(1e6, 1e6, c["c"], c["p"], c["q"]) < math.exp(c["c"])
    assert tl.g_loop(8, 2, c["c"], c["p"], c["q"]) < tl.g_loop(8, 8, c["c"], c["p"], c["q"])


def test_table_5_the_best_backward_count_per_t_and_34_percent_less_compute_at_t_8():
    table = tl.chi_table(tl.PUBLISHED, SHARE)
    got = [(t["T"], t["B_star"], round(t["chi_star"], 3), round(t["chi_full"], 3), round(t["N_star_ratio"], 2),
            round(t["D_star_ratio"], 2)) for t in table]
    assert got == [(1, 1, 1.0, 1.0, 1.0, 1.0), (2, 2, 1.031, 1.031, 1.0, 1.0), (4, 2, 1.204, 1.43, 1.27, 1.08),
                   (8, 2, 1.58, 2.376, 1.51, 1.2), (16, 2, 2.343, 4.339, 1.7, 1.31)]
    assert round(table[3]["saving"], 2) == 0.34
    # chi's compute, 6 N_comp = 6 N_once + (2T + 4B) N_rec, is flops.py's cost: (4, 4) and (8, 2) cost the same
    cost = lambda T, B: flops.flops_per_token(flops.ModelConfig(r=T, r_bwd=B, scale=8, prelude=2, recur=4, coda=2))  # noqa: E731
    assert cost(4, 4) == cost(8, 2) < cost(8, 8)


@pytest.fixture(scope="module")
def suite_rows():
    """Their scaling suite as sweep.sh plans it, rows as train.py writes them (token horizons, tokens from the
    batch rule), losses from the published law plus 3 millinats of noise."""
    return fit_laws.prepare_rows(synthetic_sweep.truncate_or_not_rows(noise=0.003, seed=0), law="truncate-or-not")


def test_the_fit_gives_the_published_coefficients_back_from_their_suites_design(suite_rows):
    d = tl.configurations(suite_rows)
    assert d["fit"].sum() == 241 and (~d["fit"]).sum() == 114  # 9-74 tokens per parameter, and the test set
    fit = tl.fit_set(d, starts=12)
    assert fit["converged"] and fit["in_sample"]["rmse"] < 0.0035 and fit["r2"] > 0.998
    for (T, B), (g, _) in TABLE_9.items():
        assert tl.gain_of(fit, T, B) == pytest.approx(g, rel=0.02), (T, B)
    assert fit["c"] == pytest.approx(tl.PUBLISHED["c"], rel=0.05) and fit["q"] > 2 * fit["p"]
    assert fit["test_set"]["rmse"] < 0.006  # the law extrapolates to the shorter and longer budgets


def test_the_held_out_folds_are_one_per_level_size_setting_and_forward_row(suite_rows):
    """Their App. C.3: budget folds group the target token level (not the FLOPs), size folds the model size,
    setting folds a (T, B), and the forward-loop rows (§C.5) every configuration of one T."""
    d = tl.configurations(suite_rows)
    fitting = tl.subset(d, d["fit"])
    assert sorted(set(fitting["level"].tolist())) == [0.5, 1, 2, 4, 8, 16, 32]  # D/D0, not C
    assert len(set(fitting["size"].tolist())) == 5 and len(set(fitting["setting"].tolist())) == 15
    held = tl.holdout(d, "row", starts=4, workers=2)
    assert held["fits"] == 5 and [f["label"] for f in held["folds"]] == [1, 2, 4, 8, 16]
    assert held["converged_folds"] == 5 and held["rmse"] < 0.02
    sizes = tl.holdout(d, "size", starts=4, workers=2)
    assert sizes["fits"] == 5 and sum(f["n"] for f in sizes["folds"]) == 241


def test_the_power_law_gain_fits_worse_and_g_hat_tracks_the_law(suite_rows):
    """Their Table 8: T^phi_T B^phi_B keeps growing where the bounded gain saturates; their Figure 6: the loss-matched
    g-hat of the runs lies around the law's g."""
    d = tl.configurations(suite_rows)
    bounded, power = tl.fit_set(d, starts=8), tl.fit_set(d, starts=8, gain="power")
    assert power["in_sample"]["rmse"] > 1.5 * bounded["in_sample"]["rmse"]
    summary = tl.g_summary(tl.empirical_g(d, bounded))
    for row in summary:
        if row["n"] >= 5:
            assert row["q25"] - 0.15 < row["g_law"] < row["q75"] + 0.15, row


def test_per_setting_laws_see_truncation_save_compute_at_t_8(suite_rows):
    """Their Figure 10: separately fitted laws at T = 8 put (8, 2) at the loss of (8, 8) for ~1/3 less compute."""
    d = tl.configurations(suite_rows)
    per_setting = tl.per_setting_laws(tl.subset(d, (d["T"] == 8) & np.isin(d["B"], (2, 8))), starts=8)
    saving = tl.compute_saving(per_setting, (8, 2), (8, 8), d["n0"], d["d0"])
    assert 0.25 < saving["median"] < 0.40


@pytest.mark.slow
def test_the_cli_reports_every_analysis_and_refuses_what_it_cannot_fit(suite_rows, tmp_path):
    rows = tmp_path / "results.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in suite_rows))
    proc = subprocess.run([sys.executable, "fit_laws.py", str(rows), "--law", "truncate-or-not", "--restarts", "4",
                           "--holdouts", "setting", "--bootstrap", "4", "--json", str(tmp_path / "fit.json"),
                           "--plots", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for text in ("Coefficients", "one setting out", "power-law gain", "g-hat", "Lemma D.2", "Table 5",
                 "matched compute", "per-setting laws"):
        assert text in proc.stdout, text
    saved = json.loads((tmp_path / "fit.json").read_text())
    assert saved["fits"]["bounded"]["converged"] and saved["bootstrap"]["resamples"] == 4
    assert {p.name for p in tmp_path.glob("tb_*.png")} == {"tb_fit.png", "tb_holdouts.png", "tb_g_hat.png",
                                                          "tb_frontiers.png"}
    few = tmp_path / "few.jsonl"
    few.write_text("".join(json.dumps(row) + "\n" for row in suite_rows[:5]))
    for argv, said in [([str(few)], "too few"), ([str(rows), "--holdouts", "nope"], "unknown families"),
                       ([str(rows), "--fit-window", "9"], "LO,HI"), ([str(rows), "--compare", str(rows)], "one sweep")]:
        bad = subprocess.run([sys.executable, "fit_laws.py", *argv, "--law", "truncate-or-not"], cwd=REPO,
                             capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and said in bad.stderr, bad.stderr


CPU_STUDY = REPO / "dev" / "results" / "cpu-truncate-or-not"


def test_the_committed_cpu_study_refits_to_its_answer_no_gain_from_looping_at_fixed_size():
    """The committed CPU-scale answer (dev/results/cpu-truncate-or-not/fit/fit.json, 64 starts): the fitted
    looping coefficient sits on its lower bounds (c, p, q = 1e-3: g = 1 for every (T, B), looping adds nothing at
    fixed N on this corpus). Refitting the committed rows from 8 starts gives the same minimum, the same in-sample
    and test errors, and the same per-run g-hat below 1 (each looped run worse than the law's (1, 1) model)."""
    committed = json.loads((CPU_STUDY / "fit" / "fit.json").read_text())
    rows, _ = fit_laws.load_sweep(str(CPU_STUDY / "results.jsonl"), None, False, None, "truncate-or-not")
    d = tl.configurations(rows, tuple(committed["fit_window"]))
    assert (len(d["L"]), int(d["fit"].sum())) == (committed["configs"], committed["fitting"]) == (160, 120)
    fit = tl.fit_set(d, starts=8)
    stored = committed["fits"]["bounded"]
    assert fit["on_bound"] == stored["on_bound"] == ["log c", "p", "q"]
    assert fit["sse"] == pytest.approx(stored["sse"], rel=1e-4)
    for part in ("in_sample", "test_set"):
        assert fit[part]["rmse"] == pytest.approx(stored[part]["rmse"], rel=1e-3), part
    assert fit["r2"] == pytest.approx(stored["r2"], abs=1e-4) and fit["r2"] > 0.99
    assert all(1e-3 <= tl.gain_of(fit, T, B) < 1.01 for T, B in committed["settings"])
    medians = {(s["T"], s["B"]): s["median"] for s in tl.g_summary(tl.empirical_g(d, fit))}
    assert medians == pytest.approx({(s["T"], s["B"]): s["median"] for s in committed["g_summary"]}, rel=1e-2)
    assert all(median < 1 for median in medians.values())
