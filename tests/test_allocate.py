"""
What should I train? (allocate.py, allocation.py): every number of Truncate or Not? that the planner reproduces from
their published coefficients, pinned: Table 5, the 34% at T = 8, Lemma D.2's split, Table 10, the fixed-size exponents
0.238 / 0.762, the free-size ranking and the (2, 2) numbers of §6.2; the untied model's sizes and compute (Table 12);
and the iso-depth paper's equivalence through the same command.
"""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nanoloop import allocation
import flops

REPO = Path(__file__).resolve().parents[1]
COEF = allocation.published()
# Their Table 10: tokens per parameter of (1, 1) where the best full-BPTT setting changes, per size.
TABLE_10 = {"60M": (16, 400, 9622, 210087), "120M": (17, 413, 9648, 204851), "240M": (16, 374, 8605, 182247),
            "480M": (15, 345, 7833, 164533), "1B": (14, 312, 7025, 146710)}


def allocate(*args):
    return subprocess.run([sys.executable, "allocate.py", *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_prescribed_t_is_table_5_and_truncation_saves_34_percent_at_t_8():
    rows = {T: allocation.prescribed_t(COEF, T, 0.507) for T in (2, 4, 8, 16)}
    assert [(T, r["B_star"], round(r["chi_star"], 3), round(r["chi_full"], 3)) for T, r in rows.items()] == \
        [(2, 2, 1.031, 1.031), (4, 2, 1.204, 1.43), (8, 2, 1.58, 2.376), (16, 2, 2.343, 4.339)]
    assert round(rows[8]["saving"], 2) == 0.34
    at_c = allocation.prescribed_t(COEF, 8, 0.507, 1e21)  # the same loss is cheaper: the optimum at B* is lower
    assert at_c["L_star"] < at_c["L_full"] and at_c["N_star"] / at_c["N_full"] == pytest.approx(1.51, abs=0.01)


def test_with_both_loop_counts_free_full_bptt_wins_because_q_exceeds_2p():
    """Lemma D.2: along T + 2B = S the loss falls as g grows; q = 1.022 > 2p = 0.474, so B = T = S/3."""
    split = allocation.best_split(COEF, 12)
    assert [(r["T"], r["B"]) for r in split["ranked"]] == [(4, 4), (6, 3), (8, 2), (10, 1)]
    assert split["full_bptt"] and split["q_minus_2p"] == pytest.approx(1.02181 - 2 * 0.23677)
    weak = COEF | {"q": 0.4}
    assert not allocation.best_split(weak, 12)["full_bptt"]


def test_switch_points_are_table_10():
    """Measured compute (matmuls and attention per token, the optimiser at the batch rule's 64 sqrt(D/D0)
    sequences), tokens per parameter of (1, 1) at the compute of equal loss. Rows 1-2 are Table 10's integers; rows
    3-4 lie within the rounding of the printed coefficients (< 1e-4 relative: 9,622.6 for 9,622, 204,847 for
    204,851; half a unit in the last printed digit of each coefficient moves them by up to 36)."""
    table = allocation.switch_table(COEF)
    for name, expected in TABLE_10.items():
        got = [cell["tokens_per_param"] for cell in table[name]]
        assert [round(v) for v in got[:2]] == list(expected[:2]), name
        assert got[2:] == pytest.approx(expected[2:], rel=1e-4), name


def test_at_a_fixed_size_loops_grow_as_c_to_0_238_and_tokens_as_c_to_0_762():
    out = allocation.fixed_size(COEF, allocation.size_config("240M"), 1e20)
    assert round(out["T_exponent"], 3) == 0.238 and round(out["D_exponent"], 3) == 0.762
    assert (out["ranked"][0]["T"], out["ranked"][0]["B"]) == (2, 2)  # 140 tokens per parameter: past 16, before 374
    later = allocation.fixed_size(COEF, allocation.size_config("240M"), 1e21)  # past the second switch (374)
    assert (later["ranked"][0]["T"], later["ranked"][0]["B"]) == (4, 4)
    latest = allocation.fixed_size(COEF, allocation.size_config("240M"), 1e23)  # past the fourth (182,247)
    assert (latest["ranked"][0]["T"], latest["ranked"][0]["B"]) == (16, 16)


def test_with_free_size_no_looping_is_best_and_two_loops_come_within_3_percent_compute():
    """§6.2: (1, 1) minimises chi, (2, 2) is the best looped setting: N_eff/N = 1.462, the same loss at +3.1%
    compute with 31.6% fewer parameters, or 29.0% fewer at +10% compute."""
    out = allocation.free_size(COEF, 0.507, 1e21)
    assert [(r["T"], r["B"]) for r in out["ranked"][:2]] == [(1, 1), (2, 2)]
    two = out["two_loops"]
    assert round(two["neff_per_n"], 3) == 1.461 and round(two["extra_compute"], 3) == 0.031
    assert round(two["fewer_params"], 3) == 0.316 and round(two["fewer_params_at_10pct"], 3) == 0.290
    assert round(out["N_exponent"], 3) == 0.562


@pytest.mark.slow
def test_table_2_sizes_are_the_grid_sweep_sh_trains():
    printed = subprocess.run(["bash", "sweep.sh", "--grid", "truncate-or-not", "--print"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout
    planned = set(re.findall(r"runs/(\w+)_T\S+ .*--scale (\S+) --prelude (\d+) --recur (\d+) --coda (\d+)", printed))
    assert planned == {(name, f"{d / 64:g}", str(p), str(r), str(c))
                       for name, (d, p, r, c) in allocation.TABLE_2.items()}


def test_table_12_untied_sizes_and_the_wider_two_loop_models_compute():
    """The untied (2, 2) model holds N_once + 2 N_rec (87/180/360/709M) at the tied model's compute per token; the
    (2, 2) models widened to ~80% of it cost 1.15/1.22/1.18/1.18x per token (their widths 840 = 7 x 120, 1152, 1408,
    1824 = 12 x 152)."""
    wider = {"60M": (840, 120), "120M": (1152, 128), "240M": (1408, 128), "480M": (1824, 152)}
    for (name, (width, head)), size, ratio in zip(wider.items(), (87, 180, 360, 709), (1.15, 1.22, 1.18, 1.18)):
        tied = allocation.size_config(name, 2, 2)
        untied = flops.ModelConfig(**{**flops.config_record(tied), "untied": True})
        assert round(flops.param_counts(untied)["n_params"] / 1e6) == size
        assert flops.flops_per_token(untied) == flops.flops_per_token(tied)
        wide = flops.ModelConfig(**{**flops.config_record(tied), "scale": width / 64, "head_dim": head})
        assert round(flops.flops_per_token(wide) / flops.flops_per_token(untied), 2) == ratio


@pytest.mark.slow
def test_the_command_answers_each_question_and_refuses_bad_input_in_one_line(tmp_path):
    overview = allocate()
    assert overview.returncode == 0
    for text in ("B* = 2", "34% less compute", "(4,4) g 2.504", "9,623", "31.6% fewer parameters", "29.0% fewer"):
        assert text in overview.stdout, text
    as_json = json.loads(allocate("--fixed-size", "60M", "--compute", "1e19", "--json").stdout)
    assert as_json["fixed_size"]["T_exponent"] == pytest.approx(0.2379, abs=1e-4)
    equiv = allocate("--iso-depth", str(REPO / "dev/results/cpu-micro/fit/fit.json"), "--compute", "5e12",
                     "--layout-of", "cpu-micro", "--equiv", "4", "0.5")
    assert equiv.returncode == 0 and "r = 8" in equiv.stdout and "equivalence: r = 4" in equiv.stdout
    for argv, said in [(["--fixed-size", "100:2/4/2", "--compute", "1e19"], "not a multiple of head dim"),
                       (["--fixed-size", "60M", "--compute", "1e9"], "less than one step"),
                       (["--fixed-size", "60M", "--compute", "1e19", "--setting", "2,4"], "1 <= B <= T"),
                       (["--fixed-size", "2B", "--compute", "1e19"], "not a Table 2 size"),
                       (["--free-size"], "need --compute"),
                       (["--coefficients", str(tmp_path / "none.json")], "not a fit_laws.py")]:
        bad = allocate(*argv)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and said in bad.stderr, (argv, bad.stderr)
