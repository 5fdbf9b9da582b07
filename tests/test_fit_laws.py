"""
fit_laws.py as a spec of the papers' fitting claims.

Synthetic sweeps (dev/synthetic_sweep.py) are the paper's iso-FLOP grid as sweep.sh plans it
(Table 7: six budgets, 29 (C, s) cells, r in {1, 2, 4, 8}, counts and tokens from flops.py at batch 2^18,
V = 32064, T = 2048) with losses from a known joint law plus 0.01-nat Gaussian noise. Restart and
resample counts are below the paper's 500 / 200 to keep the suite fast; the full protocol is exercised
on the real Chinchilla data.
"""
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "dev")]

import epoch_chinchilla  # noqa: E402
import fit_laws as fl  # noqa: E402
from nanoloop import laws  # noqa: E402
import flops  # noqa: E402
import synthetic_sweep as ss  # noqa: E402

EPOCH_CSV = epoch_chinchilla.EPOCH_CSV
TRUTH = ss.TRUTH
CPU_MICRO = ROOT / "dev" / "results" / "cpu-micro-v2-flat" / "results.jsonl"  # the earlier 48-run CPU grid


@pytest.fixture(scope="module")
def sweep():
    """Seed-0 synthetic paper grid with its joint fit and a block bootstrap."""
    rows = ss.synthetic_rows(seed=0)
    # The protocol's 500 restarts: the bootstrap refits start from this fit's local optima, and with 100
    # restarts one resample's basin was missing from them on one machine (objective 4e-4 above the optimum).
    joint = fl.fit_joint(rows, restarts=500, seed=0, workers=2)
    boot = fl.bootstrap_joint(rows, joint, resamples=80, restarts=2, seed=0, workers=2)
    return rows, joint, boot


# ---------------------------------------------------------------------------------------------
# The synthetic sweep is the paper's grid

def test_synthetic_sweep_is_the_paper_grid_with_sane_losses(sweep):
    rows = sweep[0]
    assert len(rows) == 116  # 29 (C, s) cells x 4 architectures (iso-depth §4.1)
    for r in (1, 2, 4, 8):
        assert sum(row["r"] == r for row in rows) == 29
    budgets = sorted({row["flops_budget"] for row in rows})
    assert budgets == [4.64e17, 1e18, 2.15e18, 4.64e18, 1e19, 2.15e19]
    losses = np.array([row["val_loss"] for row in rows])
    assert 2.5 < losses.min() and losses.max() < 4.0  # a realistic language-model loss range
    # s = 10: the paper's parameter counts 98.3, 59.8, 40.2, 30.3 M for r = 1, 2, 4, 8 (§3.1)
    n10 = {row["r"]: row["n_params"] / 1e6 for row in rows if row["scale"] == 10}
    assert [round(n10[r], 1) for r in (1, 2, 4, 8)] == [98.3, 59.8, 40.2, 30.3]
    # iso-FLOP: D = steps * 2^18 with steps = round(C / (F * B))
    for row in rows:
        assert row["tokens"] % 2 ** 18 == 0
        assert abs(row["tokens"] * row["flops_per_token"] / row["flops_budget"] - 1) < 0.01


def test_objective_gradient_is_analytic_and_exact(sweep):
    rows = sweep[0]
    c = laws._joint_arrays(rows)
    rng = np.random.default_rng(3)
    for phi in (None, 0.5):
        prob = laws._problem(c["n_once"], c["n_rec"], c["r"], c["tokens"], c["val_loss"], phi=phi,
                           weights=rng.integers(0, 3, len(rows)))
        k = len(prob["lo"])
        for _ in range(3):
            theta = np.array([6.0, 7.0, 0.6, 0.34, 0.37, 0.4])[:k] + rng.normal(0, 0.05, k)
            f, g = laws._objective(theta, prob)
            h = 1e-7
            num = np.array([(laws._objective(theta + h * e, prob)[0] - laws._objective(theta - h * e, prob)[0]) / (2 * h)
                            for e in np.eye(k)])
            assert np.allclose(g, num, rtol=1e-5, atol=1e-10)


# ---------------------------------------------------------------------------------------------
# Real data: Epoch's replication of Chinchilla

def test_epoch_chinchilla_optimum_reproduced():
    rows = epoch_chinchilla.epoch_rows()  # D = C / (6N); Epoch drops the five highest losses
    assert len(rows) == 240
    fit = fl.fit_chinchilla([row["n_params"] for row in rows], [row["tokens"] for row in rows],
                            [row["val_loss"] for row in rows], restarts=500, seed=0, workers=2)
    assert fit["converged"]
    # Epoch's Huber / L-BFGS-B optimum: A 477.8, B 2143, E 1.8172, alpha 0.3473, beta 0.3672, obj 0.00101827
    assert fit["objective"] == pytest.approx(0.00101827, abs=5e-9)
    assert fit["A"] == pytest.approx(477.8, rel=2e-3)
    assert fit["B"] == pytest.approx(2143, rel=2e-3)
    assert fit["E"] == pytest.approx(1.8172, abs=2e-4)
    assert fit["alpha"] == pytest.approx(0.3473, abs=2e-4)
    assert fit["beta"] == pytest.approx(0.3672, abs=2e-4)
    # Hoffmann et al.'s published values sit far off this optimum (Epoch could not reproduce them)
    assert abs(fit["B"] - 410.7) > 1000 and abs(fit["beta"] - 0.28) > 0.05
    assert fit["hits"] >= 5  # several independent restarts agree on the optimum


# ---------------------------------------------------------------------------------------------
# The joint law and phi (iso-depth §3.2, §4.3, App. G)

def test_phi_recovered_within_its_bootstrap_ci(sweep):
    rows, joint, boot = sweep
    assert joint["converged"]
    assert joint["phi"] == pytest.approx(TRUTH["phi"], abs=0.03)
    lo, hi = boot["phi_ci"]
    assert lo < joint["phi"] < hi and lo <= TRUTH["phi"] <= hi
    assert hi - lo < 0.15
    assert boot["frac_phi_le_0"] == 0 and boot["frac_phi_ge_1"] == 0  # like the paper: no resample reaches 0 or 1
    assert joint["E"] == pytest.approx(TRUTH["E"], abs=0.15)
    assert joint["alpha"] == pytest.approx(TRUTH["alpha"], abs=0.04)
    assert joint["beta"] == pytest.approx(TRUTH["beta"], abs=0.04)
    assert joint["rmse"] == pytest.approx(0.01, abs=0.003)  # the residual is the injected noise
    for k in ("E", "alpha", "beta", "A", "B"):
        assert boot[k + "_ci"][0] <= joint[k] <= boot[k + "_ci"][1]


@pytest.mark.slow
def test_bootstrap_ci_covers_the_truth_in_most_seeds():
    covered, errors = 0, []
    for seed in (1, 2, 3, 4):
        rows = ss.synthetic_rows(seed=seed)
        joint = fl.fit_joint(rows, restarts=40, seed=seed, workers=2)
        boot = fl.bootstrap_joint(rows, joint, resamples=50, restarts=0, seed=seed, workers=2)
        lo, hi = boot["phi_ci"]
        covered += lo <= TRUTH["phi"] <= hi
        errors.append(joint["phi"] - TRUTH["phi"])
    assert covered >= 3
    assert max(abs(e) for e in errors) < 0.05


@pytest.mark.parametrize("phi", [0.0, 1.0])
def test_reference_points_phi_0_and_1_recovered(phi):
    rows = ss.synthetic_rows({"phi": phi}, seed=5)
    free = fl.fit_joint(rows, restarts=60, seed=0, workers=2)
    assert free["phi"] == pytest.approx(phi, abs=0.05)
    right = fl.fit_joint(rows, restarts=60, seed=0, phi=phi, workers=2)
    wrong = fl.fit_joint(rows, restarts=60, seed=0, phi=1.0 - phi, workers=2)
    # The restricted fit at the true reference point loses nothing; the other one is clearly worse.
    assert right["r2"] > free["r2"] - 2e-4
    assert wrong["r2"] < free["r2"] - 0.01


def test_the_untied_model_is_the_anchor_at_r_phi_1():
    """Truncate or Not? App. E.2's untied model shares nothing between its loops, so the iso-depth law reads it at
    r^phi = 1 (N_eff = N): beside the looped runs of the same cells (same layout, same FLOPs per token) it
    identifies phi without any r = 1 run. Read as if its loops were shared, the same rows give another phi."""
    rng = np.random.default_rng(0)
    looped = [row for row in ss.synthetic_rows(seed=0) if row["r"] > 1]
    untied = []
    for row in looped:
        cfg = flops.ModelConfig(r=row["r"], scale=row["scale"], untied=True, vocab_size=32064, seq_len=2048)
        twin = flops.summary(cfg, row["flops_budget"], 2 ** 18)
        loss = float(laws.law_loss(TRUTH, twin["n_once"], twin["n_rec"], 1, twin["tokens"]))
        untied.append({**twin, "val_loss": loss + 0.01 * float(rng.standard_normal())})
    rows = fl.prepare_rows(looped + untied)
    assert sorted(fl.by_arch(rows)) == [(1, 1, "untied"), (2, 2, "linear"), (4, 4, "linear"), (8, 8, "linear")]
    assert fl.fit_joint(rows, restarts=40, seed=0, workers=2)["phi"] == pytest.approx(TRUTH["phi"], abs=0.03)
    shared = fl.prepare_rows(looped + [dict(row, untied=False) for row in untied])
    assert fl.fit_joint(shared, restarts=40, seed=0, workers=2)["phi"] < TRUTH["phi"] - 0.3


def test_restricted_fits_lose_fit_quality_at_phi_046(sweep):
    rows, joint, _ = sweep
    r2 = {phi: fl.fit_joint(rows, restarts=60, seed=0, phi=phi, workers=2)["r2"] for phi in (0.0, 1.0)}
    # Paper §4.3: free phi R2 0.997; both reference points fit clearly worse.
    assert joint["r2"] > 0.999
    assert r2[0.0] < joint["r2"] - 0.005 and r2[1.0] < joint["r2"] - 0.005


def test_residuals_by_r_are_balanced(sweep):
    rows, joint, _ = sweep
    table = fl.residuals_by_r(joint, rows)
    assert [t["r"] for t in table] == [1, 2, 4, 8] and all(t["runs"] == 29 for t in table)
    for t in table:  # App. G.1: comparable RMSE per r, means near zero
        assert 0.005 < t["rmse"] < 0.016
        assert abs(t["mean"]) < 0.006
    # The table's law (law_loss) is the fitted law (the objective's LSE): pooled, it gives the fit's RMSE.
    pooled = math.sqrt(sum(t["runs"] * t["rmse"] ** 2 for t in table) / len(rows))
    assert pooled == pytest.approx(joint["rmse"], rel=1e-9)


def test_budget_halves_split_like_the_paper(sweep):
    rows = sweep[0]
    (low, lb), (high, hb) = fl.budget_halves(rows)
    # App. G.3: C <= 2.15e18 with n = 56 runs, C >= 4.64e18 with n = 60 runs
    assert list(lb) == [4.64e17, 1e18, 2.15e18] and len(low) == 56
    assert list(hb) == [4.64e18, 1e19, 2.15e19] and len(high) == 60
    for part in (low, high):
        half = fl.fit_joint(part, restarts=60, seed=0, workers=2)
        assert half["phi"] == pytest.approx(TRUTH["phi"], abs=0.08)


def test_fast_bootstrap_refits_land_on_the_full_restart_optimum(sweep):
    rows, joint, _ = sweep
    cell_of_run, r_of_cell = laws.bootstrap_cells(rows)
    assert len(r_of_cell) == 24  # 6 budgets x 4 architectures
    for i in (0, 1, 2):
        w, _ = laws.resample_weights(0, i, cell_of_run, r_of_cell)
        assert w.sum() == pytest.approx(116, rel=0.6)  # 24 cells drawn, ~4.8 runs each
        full = fl.fit_joint(rows, restarts=200, seed=100 + i, weights=w, workers=2)
        fast = fl.fit_joint(rows, restarts=8, seed=200 + i, weights=w, x0=joint["local_optima"])
        assert fast["objective"] <= full["objective"] * (1 + 1e-7)
        assert fast["phi"] == pytest.approx(full["phi"], abs=1e-4)


def test_bootstrap_is_deterministic_and_worker_independent(sweep):
    rows, joint, _ = sweep
    a = fl.bootstrap_joint(rows, joint, resamples=6, restarts=2, seed=11, workers=1)
    b = fl.bootstrap_joint(rows, joint, resamples=6, restarts=2, seed=11, workers=2)
    assert a["draws"]["phi"] == b["draws"]["phi"]
    # Draw i is the joint refit on resample i's cell weights (seed, i), from the full fit's optima plus
    # that resample's own random starts: nothing else (worker split, other resamples) enters it.
    cell_of_run, r_of_cell = laws.bootstrap_cells(rows)
    for i in (0, 5):
        w, rng = laws.resample_weights(11, i, cell_of_run, r_of_cell)
        starts = np.vstack([joint["local_optima"], rng.uniform(fl.BOX_LO, fl.BOX_HI, size=(2, 6))])
        refit = fl.fit_joint(rows, restarts=0, weights=w, x0=starts)
        assert a["draws"]["phi"][i] == refit["phi"]


def test_delta_phi_detects_a_weaker_recipe():
    # Truncated BPTT (last ceil(r/2) loops trained) with a lower true phi, as in iso-depth §5.1.
    base = ss.synthetic_rows(seed=6)
    trunc = ss.synthetic_rows({"phi": 0.30}, seed=7, truncated=True)
    assert {(row["r"], row["r_bwd"]) for row in trunc} == {(1, 1), (2, 1), (4, 2), (8, 4)}
    fits, boots = [], []
    for k, rows in enumerate((base, trunc)):
        fit = fl.fit_joint(rows, restarts=40, seed=k, workers=2)
        fits.append(fit)
        boots.append(fl.bootstrap_joint(rows, fit, resamples=50, restarts=0, seed=k, workers=2))
    cmp_ = fl.compare_phi(boots[0], boots[1], fits[0], fits[1])
    assert cmp_["delta_phi"] == pytest.approx(-0.16, abs=0.05)
    assert cmp_["excludes_zero"] and cmp_["delta_phi_ci"][1] < 0
    assert cmp_["delta_phi_ci"][0] <= -0.16 <= cmp_["delta_phi_ci"][1]


# ---------------------------------------------------------------------------------------------
# Compute-optimal frontier (iso-depth §4.2) and the equivalence example (§1, App. G.5)

def test_frontier_minimises_loss_over_the_width_family(sweep):
    rows, joint, _ = sweep
    r4 = [row for row in rows if row["r"] == 4]
    fam = laws.width_family(r4[0], max_scale=120)
    assert fam["source"] == "flops.py"
    for C in (1e18, 1e19):
        pt = laws.frontier_point(joint, fam, C, r=4, joint=True)
        # brute force over every even width with flops.py directly
        best = min(float(laws.law_loss(joint, fam["n_once"][i], fam["n_rec"][i], 4, C / fam["F"][i]))
                   for i in range(len(fam["N"])))
        assert pt["L_star"] <= best + 1e-9
        assert pt["L_star"] > best - 1e-3  # continuous width gains only a sliver over the even grid
        nearest = flops.ModelConfig(r=4, scale=round(pt["scale_star"] / 2) * 2)
        assert pt["D_star"] == pytest.approx(C / flops.flops_per_token(nearest), rel=0.15)
        assert not pt["at_edge"]


def test_frontier_gap_grows_with_r_and_vanishes_at_phi_1(sweep):
    rows, joint, _ = sweep
    budgets = sorted({row["flops_budget"] for row in rows})
    pts = fl.compute_frontier(rows, {}, joint, budgets)
    for C in budgets:
        gap = {p["r"]: p["gap_to_r1"] for p in pts if p["budget"] == C and p["law"] == "joint"}
        assert 0 < gap[2] < gap[4] < gap[8]  # the looped frontier trails, more so for larger r
    # Looped optima use fewer unique parameters than the baseline but wider models (Figure 4)
    at = {p["r"]: p for p in pts if p["budget"] == 1e19}
    assert at[8]["N_star"] < at[1]["N_star"] and at[8]["scale_star"] > at[1]["scale_star"]
    # phi = 1: every recurrence is worth a unique block, so all architectures share one frontier
    full = dict(joint, phi=1.0)
    for p in fl.compute_frontier(rows, {}, full, budgets):
        if p["r"] > 1:
            assert abs(p["gap_to_r1"]) < 0.01


def test_equivalence_reproduces_the_papers_r4_example():
    eq = fl.equivalence(4, 32, 0.46)
    assert eq["N"] / 1e6 == pytest.approx(410, rel=0.01)            # "a 410M looped model"
    # "on par with a 580M non-looped model": App. G.5's 580M is the layer ratio (4 + 4*4^0.46)/20 of the same-width
    # 1B model, which leaves W_inj out of N_rec; with it (§3.1, the fit's N_rec) N_eff is 598M, exactly 4^0.46 W_inj more.
    layer_ratio, w_inj = (4 + 4 * 4 ** 0.46) / 20, 2 * 2048 ** 2
    assert round(layer_ratio * eq["same_width"]["N"] / 1e7) == 58
    assert round(eq["same_loss"]["N"] / 1e6) == 598
    assert eq["same_loss"]["N"] - 4 ** 0.46 * w_inj == pytest.approx(layer_ratio * eq["same_width"]["N"], rel=1e-5)
    assert eq["same_flops"]["N"] / 1e9 == pytest.approx(1.0, rel=0.05)  # "the training cost of a 1B non-looped one"
    # iso-depth: the same-width non-looped model costs about the same per token
    assert eq["same_width"]["flops_per_token"] == pytest.approx(eq["flops_per_token"], rel=0.05)
    assert eq["n_eff"] == pytest.approx(eq["n_once"] + 4 ** 0.46 * eq["n_rec"])
    # phi = 1 would make the looped model worth its full compute; phi = 0 only its unique parameters
    assert fl.equivalence(4, 32, 0.0)["same_loss"]["N"] == pytest.approx(eq["N"])
    assert fl.equivalence(4, 32, 1.0)["same_loss"]["N"] > eq["same_flops"]["N"]


# ---------------------------------------------------------------------------------------------
# Bad input and the command line

def test_bad_inputs_raise_clear_errors(sweep, tmp_path):
    rows = sweep[0]
    N = [r["n_params"] for r in rows[:29]]
    D = [r["tokens"] for r in rows[:29]]
    L = [r["val_loss"] for r in rows[:29]]
    with pytest.raises(ValueError, match="too few"):
        fl.fit_chinchilla(N[:5], D[:5], L[:5])
    with pytest.raises(ValueError, match="non-positive L"):
        fl.fit_chinchilla(N, D, L[:-1] + [float("nan")])
    with pytest.raises(ValueError, match="one compute budget"):
        one = [r for r in rows if r["flops_budget"] == 4.64e18]
        fl.fit_joint(one)
    with pytest.raises(ValueError, match="two or more loop counts"):
        fl.fit_joint([r for r in rows if r["r"] == 1])
    with pytest.raises(ValueError, match="lack n_rec"):
        fl.fit_joint([{k: v for k, v in r.items() if k != "n_rec"} for r in rows])
    nan_rows = [dict(r) for r in rows]
    nan_rows[3]["val_loss"] = float("nan")
    with pytest.raises(ValueError, match="val_loss"):
        fl.prepare_rows(nan_rows)
    with pytest.raises(ValueError, match="lack val_loss"):
        fl.prepare_rows([{k: v for k, v in r.items() if k != "val_loss"} for r in rows])
    with pytest.raises(ValueError, match="nothing to fit.*too few"):
        fl.analyse([r for r in rows if r["r"] == 1][:5], fl.FitOptions(restarts=2, bootstrap=0))


def fit_cli(*args, timeout=300):
    return subprocess.run([sys.executable, str(ROOT / "fit_laws.py"), *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
def test_cli_errors_are_one_line_before_any_fit(tmp_path):
    one_budget, nothing_left = tmp_path / "one.jsonl", tmp_path / "nan.jsonl"
    ss.write_jsonl([r for r in ss.synthetic_rows(seed=0) if r["flops_budget"] == 1e18], one_budget)
    ss.write_jsonl([dict(r, val_loss=float("nan")) for r in ss.synthetic_rows(seed=0)[:3]], nothing_left)
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    for args, needle in (([one_budget], "one compute budget"), ([nothing_left], "no runs left"),
                         ([tmp_path / "missing.jsonl"], "no such file"), ([], "give a results file"),
                         # output paths were once only checked after all the compute
                         ([CPU_MICRO, "--json", a_file / "fit.json"], "cannot write"),
                         ([CPU_MICRO, "--plots", a_file], "cannot write"),
                         ([CPU_MICRO, "--compare", tmp_path / "missing.jsonl"], "no such file"),
                         # non-finite or meaningless numbers were once accepted
                         (["--equiv", "4", "32", "--phi", "nan"], "invalid finite number value"),
                         ([CPU_MICRO, "--restarts", "0"], "invalid integer >= 1 value"),
                         ([CPU_MICRO, "--bootstrap", "1"], "0 (off) or at least 2"),
                         ([CPU_MICRO, "--equiv", "4", "inf"], "invalid integer >= 1 value")):
        proc = fit_cli(*args, "--workers", "1", timeout=120)
        *dropped, err = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and proc.stdout == "", (args, proc.stdout[-300:])  # nothing fitted first
        assert err.startswith("fit_laws.py:") and needle in err and all("dropped" in d for d in dropped), (args, err)


@pytest.fixture(scope="module")
def micro_phi():
    """phi of the committed CPU-scale sweep with a quick protocol (40 restarts, no bootstrap)."""
    return float(re.search(r"phi   = (-?[\d.]+)", quick_fit_report(CPU_MICRO).stdout).group(1))


# On these 48 runs an earlier fit_laws.py moved phi silently from 0.855 to 0.840 (two writers
# appended 7 runs twice), 0.862 (a run diverged to 18.9 nats) and 0.844 (a kill after the last
# checkpoint left a row without train_loss / tokens_per_s).
@pytest.mark.parametrize("extra, needle", [
    (lambda rows: rows[3:10], "duplicate of run"),
    (lambda rows: [dict(rows[5], seed=1, val_loss=18.9)], "diverged (val_loss 18.900"),
    (lambda rows: [dict(rows[5], seed=1, val_loss=4.0, train_loss=None, tokens_per_s=None)],
     "not a finished run (train_loss is None)"),
], ids=["duplicates", "diverged", "unfinished"])
@pytest.mark.slow
def test_rows_that_are_not_one_finished_run_do_not_reach_the_fit(extra, needle, micro_phi, tmp_path):
    rows = fl.load_results(CPU_MICRO)
    bad = rows + extra(rows)
    path = tmp_path / "results.jsonl"
    ss.write_jsonl(bad, path)
    proc = quick_fit_report(path)
    dropped = [line for line in proc.stderr.splitlines() if "dropped" in line]
    assert len(dropped) == len(bad) - len(rows) and all(needle in line for line in dropped), proc.stderr
    assert "48 runs" in proc.stdout and "rows dropped, see stderr" in proc.stdout
    assert float(re.search(r"phi   = (-?[\d.]+)", proc.stdout).group(1)) == micro_phi


def test_duplicates_are_found_by_run_id_first():
    a = {"run_id": "x", "scale": 1, "r": 1, "val_loss": 3.0, "seed": 0}
    kept, notes = fl.drop_unusable([a, dict(a, seed=5), dict(a, run_id="y"), {"n_params": 1e8, "val_loss": 3.0}] * 2)
    # the same run_id is one run whatever else differs; rows without a configuration (no scale) are kept
    assert len(kept) == 4 and len(notes) == 4 and all("same run_id" in n for n in notes[:2])


def test_unconverged_fit_is_reported_as_such(sweep, monkeypatch):
    rows = sweep[0]
    monkeypatch.setitem(laws.LBFGS_OPTIONS, "maxiter", 2)
    res = fl.analyse(rows, fl.FitOptions(restarts=2, bootstrap=0))
    assert not res["joint"]["converged"]
    lines = []
    fl.report(res, "tiny", say=lines.append)
    text = "\n".join(lines)
    assert "NOT CONVERGED" in text and "phi   =" not in text


def synthetic_sweep_file(path, *extra):
    proc = subprocess.run([sys.executable, str(ROOT / "dev" / "synthetic_sweep.py"), str(path), *extra],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return path


@pytest.mark.slow
def test_a_compare_reuses_the_stored_fit_of_a_sweep_when_rows_options_and_code_are_the_same(tmp_path):
    """sweep.sh fits each sweep into <OUT>/fit/fit.json; `fit_laws.py A --compare B` later reads A's analysis
    back from there (and a rerun of the compare both, from its --json) instead of refitting: the same report,
    word for word. A changed option or a changed row is a new analysis, fitted."""
    quick = ["--restarts", "12", "--bootstrap", "6", "--workers", "2"]
    base = synthetic_sweep_file(tmp_path / "base" / "results.jsonl")
    trunc = synthetic_sweep_file(tmp_path / "trunc.jsonl", "--truth", "phi=0.3", "--bptt", "truncated", "--seed", "1")
    (tmp_path / "base" / "fit").mkdir()
    first = fit_cli(base, *quick, "--json", tmp_path / "base" / "fit" / "fit.json")
    assert first.returncode == 0 and "reused" not in first.stderr
    compare = fit_cli(base, "--compare", trunc, *quick, "--json", tmp_path / "compare.json")
    assert f"{base}: reused the analysis in {tmp_path / 'base' / 'fit' / 'fit.json'}" in compare.stderr
    assert f"{trunc}: reused" not in compare.stderr
    again = fit_cli(base, "--compare", trunc, *quick, "--json", tmp_path / "compare.json")
    assert again.stderr.count("reused the analysis in") == 2 and again.stdout == compare.stdout
    alone, alone_trunc = tmp_path / "alone" / "results.jsonl", tmp_path / "alone" / "trunc.jsonl"
    alone.parent.mkdir()  # the same rows with nothing stored beside them: fitted from scratch
    alone.write_text(base.read_text())
    alone_trunc.write_text(trunc.read_text())
    fresh = fit_cli(alone, "--compare", alone_trunc, *quick)
    same_paths = fresh.stdout.replace(str(alone), str(base)).replace(str(alone_trunc), str(trunc))
    assert "reused" not in fresh.stderr and same_paths.rstrip() == compare.stdout.split("\nwrote ")[0].rstrip()
    assert "reused" not in fit_cli(base, *quick[:1], "13", *quick[2:]).stderr  # another option
    rows = base.read_text().splitlines()
    changed = json.loads(rows[0]) | {"val_loss": json.loads(rows[0])["val_loss"] + 0.01}
    base.write_text("\n".join([json.dumps(changed), *rows[1:]]) + "\n")
    assert "reused" not in fit_cli(base, *quick).stderr  # another row


@pytest.mark.slow
def test_runs_of_a_few_steps_are_reported_as_a_chain_check_not_a_measurement(tmp_path):
    """The smoke grid's runs take 1-4 optimiser steps: its report says that its phi means nothing."""
    rows = [json.loads(line) for line in synthetic_sweep_file(tmp_path / "s.jsonl").read_text().splitlines()]
    short = tmp_path / "short.jsonl"
    short.write_text("".join(json.dumps(row | {"steps": 4}) + "\n" for row in rows))
    report = quick_fit_report(short).stdout
    assert "note: the longest run trains for 4 optimiser steps: a chain check" in report
    assert "chain check" not in quick_fit_report(tmp_path / "s.jsonl").stdout


@pytest.mark.slow
def test_cli_end_to_end(tmp_path):
    base, trunc = tmp_path / "base.jsonl", tmp_path / "trunc.jsonl"
    for path, extra in ((base, []), (trunc, ["--truth", "phi=0.3", "--bptt", "truncated", "--seed", "1"])):
        proc = subprocess.run([sys.executable, str(ROOT / "dev" / "synthetic_sweep.py"), str(path), *extra],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
    out, plots = tmp_path / "fit.json", tmp_path / "plots"
    proc = fit_cli(base, "--compare", trunc, "--restarts", "30", "--bootstrap", "12", "--equiv", "4", "32",
                   "--json", out, "--plots", plots, "--workers", "2")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    for needle in ("Per-architecture Chinchilla fits", "Joint law", "Restricted fits", "residuals by r",
                   "Budget halves", "Compute-optimal frontier", "Delta-phi", "Equivalence at r = 4"):
        assert needle in text
    res = json.loads(out.read_text())
    for key in ("phi", "phi_ci", "A", "alpha", "B", "beta", "E", "r2", "rmse"):
        assert key in res["joint"]
    assert res["joint"]["phi"] == pytest.approx(0.46, abs=0.05)
    assert set(res["per_arch"]) == {"r=1", "r=2 bwd=2 linear", "r=4 bwd=4 linear", "r=8 bwd=8 linear"}
    assert set(res["restricted"]) == {"phi=0", "phi=1"}
    assert len(res["frontier"]) == 2 * 4 * 6  # two laws x four architectures x six budgets
    assert res["delta_phi"]["delta_phi"] < 0
    assert res["equivalence"]["same_flops"]["N"] > res["equivalence"]["same_loss"]["N"]
    for name in ("isoflop.png", "frontier.png", "pred_vs_actual.png"):
        png = plots / name
        assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_plots_are_readable_at_a_glance():
    """The figures name their grid, keep the y-axis on the data (laws rise far off it), put every marker and
    colour in a legend, and label the budgets on the log x-axis without crowded minor labels."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = fl.prepare_rows(fl.drop_unusable(fl.load_results(CPU_MICRO))[0])
    res = fl.analyse(rows, fl.FitOptions(restarts=20, bootstrap=0))
    level, budgets = fl.budget_levels([row["flops_budget"] for row in rows])
    colours = [plt.get_cmap("viridis")(j / (len(budgets) - 1)) for j in range(len(budgets))]
    title = fl.plot_title(CPU_MICRO)
    from nanoloop import plots
    assert title == "cpu-micro-v2-flat"
    losses = [row["val_loss"] for row in rows]
    by_budget = plots.BudgetColours(level, budgets, colours)
    iso = plots.plot_isoflop(plt, res, rows, by_budget, title)
    low, high = iso.axes[0].get_ylim()
    assert min(losses) - 0.2 < low <= min(losses) and max(losses) <= high < max(losses) + 0.2
    labels = [t.get_text() for t in iso.legends[0].get_texts()]
    assert [f"C = {C:.3g} FLOPs" for C in budgets] == labels[:len(budgets)]
    assert any("compute-optimal" in label for label in labels) and title in iso._suptitle.get_text()
    pva = plots.plot_pred_vs_actual(plt, res, rows, by_budget, title)
    labels = [t.get_text() for t in pva.axes[0].get_legend().get_texts()]
    assert set(labels) >= {fl.arch_label(k) for k in fl.by_arch(rows)} | {f"C = {C:.3g}" for C in budgets}
    front = plots.plot_frontier(plt, res, budgets, title)
    for ax in front.axes:
        assert [t.get_text() for t in ax.get_xticklabels()] == [f"{C:.2g}" for C in budgets]
        assert not any(t.get_text() for t in ax.get_xminorticklabels())
    plt.close("all")


# A script that fits with worker processes and exits on a stop signal as the project's scripts do (common's
# exit_on_stop_signals): the joint fit, then a bootstrap long enough (2,000 resamples over 2 workers, each
# worker's share one chunk) to be interrupted in the middle.
FIT_SCRIPT = """
import sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/dev"]
import synthetic_sweep
from nanoloop import common, laws
common.exit_on_stop_signals("fit", "nothing is written")
rows = synthetic_sweep.synthetic_rows(seed=0)
fit = laws.fit_joint(rows, restarts=20, seed=0, workers=2)
print("bootstrapping", flush=True)
laws.bootstrap_joint(rows, fit, resamples=2000, restarts=16, seed=0, workers=2)
print("finished", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("whom", ["the parent", "the whole group"])
def test_a_fit_interrupted_in_its_worker_pool_exits_at_once_with_one_line_and_no_worker_left(whom):
    """Old: leaving the process pool waited for the workers to finish their chunks, up to the whole bootstrap (a
    Ctrl-C to fit_laws.py alone during the bootstrap took 56 s to exit), and a terminal's Ctrl-C, which reaches
    every process of the group, printed a traceback per worker. Now the pool's workers ignore Ctrl-C and are
    terminated by their parent, so either way the script's one line is all that is said and no worker outlives it."""
    proc = subprocess.Popen([sys.executable, "-c", FIT_SCRIPT, str(ROOT)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline() == "bootstrapping\n", proc.stderr.read()[-2000:]
    deadline = time.time() + 60  # liveness bounds, here and below, not timings
    while time.time() < deadline and proc.poll() is None and group_size(proc.pid) < 3:  # the fit and its 2 workers
        time.sleep(0.05)
    if whom == "the parent":
        proc.send_signal(signal.SIGINT)  # what a script or a sweep sends
    else:
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends
    try:
        stdout, stderr = proc.communicate(timeout=60)  # the bootstrap alone takes minutes
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode == 143 and stderr == "fit: interrupted (SIGINT): nothing is written\n", stderr[-2000:]
    assert stdout == ""
    deadline = time.time() + 30  # the terminated workers are reaped
    while time.time() < deadline and group_alive(proc.pid):
        time.sleep(0.1)
    left = group_alive(proc.pid)
    if left:
        os.killpg(proc.pid, signal.SIGKILL)
    assert not left, "a worker outlived the fit"


def group_size(pgid):
    """How many processes the group has now (Linux: the fifth field of /proc/PID/stat is the process group)."""
    size = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        if int(fields[2]) == pgid:
            size += 1
    return size


def group_alive(pgid):
    """Whether any process of the group is left (signal 0 checks without sending anything)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# Downstream loss (App. I): the joint law on a category's loss, joined to the runs by run_id

@pytest.mark.slow
def test_the_joint_law_on_a_category_loss_recovers_its_phi(tmp_path):
    """App. I refits the joint law on each category's loss (parametric knowledge phi 0.58, reading
    comprehension 0.71 against 0.46 for validation loss). Synthetic: the validation loss follows phi = 0.46,
    a category's two tasks scatter around a law with phi = 0.71 whose mean is that law; fit_laws.py --evals
    --metric recovers 0.71, from evaluation rows joined to the training rows by run_id at the trained r."""
    runs = ss.synthetic_rows(seed=0)
    category = ss.synthetic_rows(truth={"phi": 0.71, "E": 2.4}, noise=0.0, seed=0)
    rng = np.random.default_rng(1)
    evals = []
    for i, (row, cat) in enumerate(zip(runs, category)):
        row["run_id"] = f"run{i}"
        offset = 0.01 * float(rng.standard_normal())
        for task, shift in (("task_a", 0.05 + offset), ("task_b", -0.05 + offset)):
            evals.append({"run_id": row["run_id"], "r": row["r"], "task": task, "loss": cat["val_loss"] + shift})
        evals.append({"run_id": row["run_id"], "r": 2 * row["r"], "task": "task_a", "loss": 99.0})  # r_eval != r
    results, eval_file, categories = tmp_path / "runs.jsonl", tmp_path / "evals.jsonl", tmp_path / "cats.json"
    ss.write_jsonl(runs, results)
    ss.write_jsonl(evals, eval_file)
    categories.write_text(json.dumps({"categories": {"reading_comp": ["task_a", "task_b"]}}))
    out = tmp_path / "fit.json"
    proc = fit_cli(results, "--evals", eval_file, "--metric", "reading_comp", "--categories", categories,
                   "--restarts", "60", "--bootstrap", "0", "--json", out, "--workers", "2")
    assert proc.returncode == 0, proc.stderr
    assert "the loss fitted is reading_comp (downstream, App. I)" in proc.stdout
    assert json.loads(out.read_text())["joint"]["phi"] == pytest.approx(0.71, abs=0.03)
    del evals[:3]  # run0 has no evaluation left: it is dropped with a note, not fitted with its val loss
    ss.write_jsonl(evals, eval_file)
    proc = fit_cli(results, "--evals", eval_file, "--metric", "task_b", "--categories", categories,
                   "--restarts", "20", "--bootstrap", "0", "--workers", "2")
    assert proc.returncode == 0 and "run 1: dropped, no task_b evaluation at its trained r = 1" in proc.stderr
    assert f"{len(runs) - 1} runs" in proc.stdout


# ---------------------------------------------------------------------------------------------
# Bad input, by class: unreadable rows are dropped as promised; incomparable sweeps are refused

def test_an_unreadable_line_is_dropped_with_one_line_not_the_whole_file(tmp_path):
    """Old: one garbage line refused the whole file while README promised bad rows are dropped one line each."""
    rows = ss.synthetic_rows(seed=0)
    path = tmp_path / "runs.jsonl"
    text = "".join(json.dumps(row) + "\n" for row in rows)
    path.write_text(text[:2000] + "\n#garbage\n[1, 2]\n" + text[2000:] + '{"torn": ')
    proc = fit_cli(path, "--restarts", "20", "--bootstrap", "0", "--workers", "2")
    assert proc.returncode == 0, proc.stderr
    dropped = [line for line in proc.stderr.splitlines() if "dropped" in line]
    assert len(dropped) == 5  # the two halves of the row cut in two, the garbage, the list, the torn last line
    assert sum("is not JSON" in line for line in dropped) == 4 and "is not a JSON object" in proc.stderr
    assert f"{len(rows) - 1} runs" in proc.stdout  # only the row the garbage line cut is lost


@pytest.mark.slow
@pytest.mark.parametrize("key, value", [("vocab_size", 4096), ("seq_len", 1024), ("depth", 24), ("eval_rows", 512),
                                        ("data", {"train_sha256": "another dataset"})])
def test_incomparable_sweeps_are_refused_unless_asked_for(tmp_path, key, value):
    """Old: --compare of sweeps with another vocabulary, context, depth, dataset or validation set reported a
    delta-phi with no warning, and such rows pooled into one file were fitted silently."""
    base = ss.synthetic_rows(seed=0)
    for row in base:
        row.update(eval_rows=1024, identity={"data": {"train_sha256": "the dataset"}})
    other = [dict(row) for row in ss.synthetic_rows(seed=1)]
    for row in other:
        row.update(eval_rows=1024, identity={"data": {"train_sha256": "the dataset"}})
        if key == "data":
            row["identity"] = {"data": value}
        else:
            row[key] = value
    a, b, pooled = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "pooled.jsonl"
    ss.write_jsonl(base, a)
    ss.write_jsonl(other, b)
    ss.write_jsonl(base + other, pooled)
    quick = ["--restarts", "10", "--bootstrap", "0", "--workers", "2"]
    for args in ([a, "--compare", b], [pooled]):
        proc = fit_cli(*args, *quick)
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and proc.stdout == "" and len(err) == 1 and f"differ in {key} (" in err[0], err
        assert "--allow-mixed" in err[0]
    assert fit_cli(a, "--compare", b, *quick, "--allow-mixed").returncode == 0


def test_a_full_disk_while_writing_the_fit_is_one_line(tmp_path, monkeypatch, capsys):
    import errno
    rows = ss.synthetic_rows(seed=0)
    ss.write_jsonl(rows, tmp_path / "runs.jsonl")

    def full(fd):  # a full disk shows at the latest when the written bytes are flushed to it
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(SystemExit) as e:
        fl.main([str(tmp_path / "runs.jsonl"), "--json", str(tmp_path / "fit.json"), "--restarts", "5",
                 "--bootstrap", "0", "--workers", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 1 and err == [f"fit_laws.py: could not write {tmp_path / 'fit.json'} (No space left on "
                                         f"device)"]


def quick_fit_report(results):
    """fit_laws.py on a results file: 40 restarts, no bootstrap (seconds). The finished process."""
    proc = fit_cli(results, "--restarts", "40", "--bootstrap", "0", "--workers", "1")
    assert proc.returncode == 0, proc.stderr
    return proc


def test_phi_on_the_box_edge_is_reported_as_unidentified():
    """The first CPU-scale sweep (dev/results/cpu-micro-v1-fileorder: file-ordered data, minima not
    bracketed) puts the joint optimum on phi's box edge; the report must say so instead of
    presenting -3 as a measurement."""
    results = ROOT / "dev" / "results" / "cpu-micro-v1-fileorder" / "results.jsonl"
    report = quick_fit_report(results).stdout
    assert "phi   = -3.0000" in report and "do not identify phi" in report


@pytest.mark.slow
def test_bracketed_cpu_sweep_identifies_phi_and_the_committed_fit_reproduces():
    """The earlier bracketed CPU-scale sweep (dev/results/cpu-micro-v2-flat) puts phi inside its box,
    and refitting those rows gives the phi of its committed fit."""
    committed = json.loads((CPU_MICRO.parent / "fit.json").read_text())["joint"]["phi"]
    report = quick_fit_report(CPU_MICRO).stdout
    phi = float(re.search(r"phi   = (-?[\d.]+)", report).group(1))
    assert "do not identify phi" not in report and -3 < phi < 3
    assert phi == pytest.approx(committed, abs=0.01)


STUDY = ROOT / "dev" / "results"
STUDY_FITS = sorted(STUDY.glob("cpu-micro*/fit/fit.json"))
# (fit file, the rows it was fitted from): each grid's own fit, and each case study against the
# layout-matched r = 1 (the "compare" half of compare_layout.json, fitted from layout_anchored.jsonl, or for the
# untied arm from untied_anchored.jsonl: the file it names)
STUDY_FIT_ROWS = ([(p, p.parent.parent / "results.jsonl") for p in STUDY_FITS] +
                  [(p, ROOT / json.loads(p.read_text())["compare"]["file"])
                   for p in sorted(STUDY.glob("cpu-micro*/fit/compare_layout.json"))
                   if not p.parts[-3].endswith("-quick")])  # --quick: one looped r at two budgets, no phi to refit


def test_the_cpu_study_base_grid_has_a_committed_fit():
    assert STUDY / "cpu-micro" / "fit" / "fit.json" in STUDY_FITS


@pytest.mark.slow
@pytest.mark.parametrize("fit_json, rows", STUDY_FIT_ROWS,
                         ids=[f"{p.parent.parent.name}-{p.stem}" for p, _ in STUDY_FIT_ROWS])
def test_each_committed_cpu_study_fit_refits_to_its_phi(fit_json, rows):
    """Every committed CPU study fit (base, layout-matched anchor, trunc, hyper, and the case studies
    against the layout-matched anchor) refits from its own rows to the phi it reports."""
    fit = json.loads(fit_json.read_text())
    committed = fit.get("compare", fit)["joint"]["phi"]
    report = quick_fit_report(rows).stdout
    phi = float(re.search(r"phi   = (-?[\d.]+)", report).group(1))
    assert "do not identify phi" not in report
    assert phi == pytest.approx(committed, abs=0.01)



@pytest.fixture(scope="module")
def small_bootstrap():
    """A quick joint fit and block bootstrap of the seed-0 synthetic paper grid (not the protocol's counts:
    these tests are about how a CI is made from the draws, not about its width)."""
    rows = ss.synthetic_rows(seed=0)
    joint = laws.fit_joint(rows, restarts=20, seed=0, workers=1)
    return rows, laws.bootstrap_joint(rows, joint, resamples=12, restarts=0, seed=0, workers=1)


def test_bootstrap_ci_is_the_2_5_and_97_5_percentiles_of_its_draws(small_bootstrap):
    """App. G.2: each reported 95% CI is the 2.5th and 97.5th percentile of that parameter's bootstrap draws
    (the refits that converged), and the fractions at phi <= 0 and >= 1 are those draws' fractions."""
    _, boot = small_bootstrap
    draws = boot["draws"]
    assert set(draws) == {"phi", "alpha", "beta", "A", "B", "E"}
    assert len(draws["phi"]) == boot["resamples"] - boot["not_converged"] >= 10
    for name, values in draws.items():
        assert boot[name + "_ci"] == [float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))], name
    phi = np.array(draws["phi"])
    assert boot["frac_phi_le_0"] == np.mean(phi <= 0) and boot["frac_phi_ge_1"] == np.mean(phi >= 1)
    # the interval is a 95% one, not an interquartile range: it holds the draws between its bounds
    lo, hi = boot["phi_ci"]
    assert lo <= np.percentile(phi, 25) and np.percentile(phi, 75) <= hi


def test_delta_phi_ci_is_the_percentiles_of_the_paired_differences():
    """delta-phi's CI is the 2.5th / 97.5th percentile of phi_b - phi_a over the resamples in order."""
    rng = np.random.default_rng(0)
    phi_a, phi_b = rng.normal(0.46, 0.03, 200), rng.normal(0.38, 0.04, 180)
    out = laws.compare_phi({"draws": {"phi": phi_a.tolist()}}, {"draws": {"phi": phi_b.tolist()}},
                         {"phi": 0.46}, {"phi": 0.38})
    diff = phi_b - phi_a[:180]
    assert out["pairs"] == 180 and out["delta_phi"] == pytest.approx(-0.08)
    assert out["delta_phi_ci"] == [float(np.percentile(diff, 2.5)), float(np.percentile(diff, 97.5))]
    assert out["excludes_zero"] == (out["delta_phi_ci"][1] < 0)


@pytest.mark.parametrize("name, cis, reached", [
    ("phi", [[-3.0, 1.0153]], [-3.0]),                       # the plain CPU anchor's: its lower end is the box's
    ("phi", [[-3.0, 3.0]], [-3.0, 3.0]),                     # a category that follows no law
    ("phi", [[0.9181, 1.2872]], []),                         # measured
    ("phi", [[0.92, 1.29], [-3.0, 1.02]], [-3.0]),           # a delta-phi: one arm's CI is the box's
    ("E", [[math.exp(-3), 4.4962]], [math.exp(-3)]),         # E is searched as log E in [-3, 2]
    ("alpha", [[0.0, 2.5]], [0.0, 2.5]),
    ("A", [None], []),                                       # no bootstrap
])
def test_a_ci_reaches_the_search_box_where_its_end_is_the_boxs_edge(name, cis, reached):
    assert laws.ci_bounds_reached(name, *cis) == pytest.approx(reached)


def test_a_ci_at_the_search_bound_is_printed_as_not_identified_and_flagged_in_the_json():
    """A 95% CI that runs to the edge of the fitter's box (phi in [-3, 3]) is where the search stops, not an
    interval the data give: the report says "not identified" in its place, --json keeps the numbers and says
    <param>_ci_at_bound. A CI inside the box is printed as the interval it is."""
    for grid, at_bound in (("cpu-micro", True), ("cpu-micro-layout", False)):
        stored = json.loads((STUDY / grid / "fit" / "fit.json").read_text())
        analysis = fl.restored_analysis(stored)
        lines = []
        fl.report(analysis, grid, say=lines.append)
        text = "\n".join(lines)
        joint, (lo, hi) = stored["joint"], stored["joint"]["phi_ci"]
        if at_bound:
            assert lo == laws.BOX_LO[5]  # the premise: the plain anchor does not identify phi (dev/README.md)
            assert f"phi   = {joint['phi']:.4f} (CI reaches the bound -3: not identified)" in text
            assert f"[{lo:.4f}," not in text
        else:
            assert f"phi   = {joint['phi']:.4f} [{lo:.4f}, {hi:.4f}]" in text
        out = fl.json_ready(analysis)["joint"]
        assert out["phi_ci_at_bound"] is at_bound and out["phi_ci"] == [lo, hi]
        assert out["alpha_ci_at_bound"] is False


def test_delta_phi_with_an_arm_at_the_search_bound_is_not_identified():
    """The differences' interval is the box's wherever an arm's is (+0.30 [+0.03, +4.16] was the plain anchor's
    -3 showing through): the report says so and --json flags it; two measured arms give the interval."""
    rng = np.random.default_rng(0)
    measured = rng.normal(1.1, 0.08, 200)
    at_box = np.concatenate([np.full(20, -3.0), rng.normal(0.8, 0.1, 180)])  # 10% of the resamples at phi = -3
    boots = [{"draws": {"phi": draws.tolist()}, "phi_ci": [float(np.percentile(draws, q)) for q in (2.5, 97.5)]}
             for draws in (at_box, measured, rng.normal(1.0, 0.08, 200))]
    lines = []
    plain, layout, variant = ({"joint": {"phi": float(np.median(b["draws"]["phi"]))}, "bootstrap": b} for b in boots)
    d = fl.report_delta_phi(plain, layout, "base", "layout", say=lines.append)
    assert d["delta_phi_ci_at_bound"] is True and d["delta_phi_ci"][1] > 3  # the numbers stay, for --json
    assert f"= {d['delta_phi']:+.4f} (an arm's phi CI reaches the bound -3: not identified)" in lines[0]
    d = fl.report_delta_phi(layout, variant, "layout", "variant", say=lines.append)
    lo, hi = d["delta_phi_ci"]
    assert d["delta_phi_ci_at_bound"] is False and f"= {d['delta_phi']:+.4f} [{lo:+.4f}, {hi:+.4f}] (95% CI" in lines[1]


def test_bootstrap_resamples_whole_cells(small_bootstrap):
    """App. G.2's block bootstrap draws (budget, r) cells with replacement, not runs: in every resample all
    runs of a cell carry that cell's draw count, the counts sum to the number of cells, and each cell is one
    budget level and one r (the paper grid: 6 budgets x 4 loop counts)."""
    rows, _ = small_bootstrap
    cell_of_run, r_of_cell = laws.bootstrap_cells(rows)
    levels = laws.budget_levels([row["flops_budget"] for row in rows])[0]
    assert len(r_of_cell) == 24
    for cell in range(len(r_of_cell)):
        members = np.flatnonzero(cell_of_run == cell)
        assert len({int(levels[i]) for i in members}) == 1 and {rows[i]["r"] for i in members} == {r_of_cell[cell]}
    for i in range(20):
        weights, _ = laws.resample_weights(0, i, cell_of_run, r_of_cell)
        per_cell = [set(weights[cell_of_run == cell].tolist()) for cell in range(len(r_of_cell))]
        assert all(len(w) == 1 for w in per_cell), i
        counts = [w.pop() for w in per_cell]
        assert sum(counts) == len(r_of_cell) and all(float(c).is_integer() for c in counts)
        assert len({r for r, c in zip(r_of_cell, counts) if c}) >= 2  # phi needs two loop counts


# Each committed downstream fit folder and the evaluation rows it was fitted on (dev/eval_micro.sh)
DOWNSTREAM_FIT_DIRS = {"cpu-micro-eval/fit": "eval.jsonl", "cpu-micro-eval-core/fit": "eval.jsonl",
                       "cpu-micro-eval-core/fit-nanoloop-v1": "eval-nanoloop-v1.jsonl"}
DOWNSTREAM_FITS = sorted(path for folder in DOWNSTREAM_FIT_DIRS for path in (STUDY / folder).glob("*.json"))


@pytest.mark.parametrize("folder", DOWNSTREAM_FIT_DIRS)
def test_the_downstream_evaluation_has_a_committed_fit_per_category(folder):
    """One fit per category; the validation loss of the same runs once per retrain (it does not depend on
    the scoring, so fit-nanoloop-v1 beside a core fit has none)."""
    categories = json.loads((ROOT / "data" / "eval" / "categories-cpu.json").read_text())["categories"]
    val_loss = [] if folder.endswith("fit-nanoloop-v1") else ["val_loss"]
    assert sorted(p.stem for p in (STUDY / folder).glob("*.json")) == sorted([*categories, *val_loss])


@pytest.mark.slow
@pytest.mark.parametrize("fit_json", DOWNSTREAM_FITS, ids=[str(p.relative_to(STUDY)) for p in DOWNSTREAM_FITS])
def test_each_committed_downstream_fit_refits_to_its_phi(fit_json):
    """App. I at CPU scale: each category's committed joint fit refits from the committed training rows and
    evaluation rows (joined by run_id, the category's loss in place of the validation loss) to the phi it
    reports; val_loss.json is the same runs' validation loss."""
    eval_dir = fit_json.parent.parent
    args = ["--restarts", "40", "--bootstrap", "0", "--workers", "1"]
    if fit_json.stem != "val_loss":
        evals = DOWNSTREAM_FIT_DIRS[str(fit_json.parent.relative_to(STUDY))]
        args += ["--evals", str(eval_dir / evals), "--metric", fit_json.stem,
                 "--categories", str(ROOT / "data" / "eval" / "categories-cpu.json")]
    proc = fit_cli(eval_dir / "results.jsonl", *args)
    assert proc.returncode == 0, proc.stderr
    phi = float(re.search(r"phi   = (-?[\d.]+)", proc.stdout).group(1))
    assert phi == pytest.approx(json.loads(fit_json.read_text())["joint"]["phi"], abs=0.01)
