"""
The two training recipes (recipe.py): the iso-depth paper's fixed batch and linear decay (App. E), and Truncate or
Not?'s batch rule, token exponent, warmup and cosine (their §3 "Optimization", App. F, Table 13); train.py trains
with either, and every iso-depth run keeps its identity.
"""
import json
import math

import pytest

import flops
from nanoloop import recipe
import train
from nanoloop.recipe import RECIPES, ladder_batch, ladder_steps, lr_multiplier

TRUNCATE = RECIPES["truncate-or-not"]
D0 = 2 ** 30
# Table 13: the target budget D/D0, the batch (sequences of 2,048 tokens), the steps.
TABLE_13 = [(0.5, 48, 5464), (1, 64, 8192), (2, 88, 11920), (4, 128, 16384), (8, 176, 23832), (16, 256, 32768),
            (32, 352, 47664)]


@pytest.mark.parametrize("level, batch, steps", TABLE_13)
def test_table_13_batch_and_steps_follow_from_the_budget(level, batch, steps):
    """64 sqrt(D/D0) sequences on the ladder (45.3 -> 48, 90.5 -> 88, 181 -> 176, 362 -> 352), and the tokens over
    the batch rounded up to a multiple of 8 (5,461.3 -> 5,464), so a run reads within 0.2% of its target."""
    assert ladder_batch(level * D0, TRUNCATE) == batch
    assert ladder_steps(level * D0, batch * 2048) == steps
    assert 0 <= steps * batch * 2048 / (level * D0) - 1 < 0.002


# Table 13's peak LRs (x 1e-3) and this rule's residual per cell (%): the paper's formula F.1 is not printed in full.
TABLE_13_LRS = [10.7, 9.25, 8.11, 8.01, 7.03, 6.36, 6.09]
RULE_RESIDUALS = [-2.32, +0.56, +3.81, -1.81, +1.28, +4.57, -1.14]


def test_table_13_peak_lrs_are_the_iso_depth_rule_with_token_exponent_0_40():
    """Assumed: the iso-depth transfer rule as written (0.014 (B/B0)^0.558 (D/D_ref)^-gamma, B the ladder batch,
    D the run's tokens, D_ref = 1,016,083,200) with their gamma = 0.40. It lands within 4.6% of every cell; no rule
    K b^e D^-gamma does better than 2.2% everywhere (2 -> 4 D0 and 8 -> 16 D0 have the same batch and token ratios,
    their LRs do not), well inside the flat optimum the paper reports (1/sqrt(2) ... sqrt(2) of the rule)."""
    import muonh
    for (level, batch, steps), lr, residual in zip(TABLE_13, TABLE_13_LRS, RULE_RESIDUALS):
        tokens = steps * batch * 2048
        ours = muonh.learning_rates(640, batch * 2048, tokens, flops.reference_horizon(), data_exp=TRUNCATE.data_exp)
        assert 100 * (ours["matrix"] / (lr * 1e-3) - 1) == pytest.approx(residual, abs=0.01), level
    assert TRUNCATE.data_exp == 0.40 and RECIPES["iso-depth"].data_exp == 0.32


def test_the_ladder_goes_on_in_steps_of_about_root_two():
    """Table 13 prints 32 ... 352; below and above, the ladder keeps its ~sqrt(2) steps (a CPU grid's batches are a
    few sequences)."""
    ratios = [b / a for a, b in zip(recipe.BATCH_LADDER, recipe.BATCH_LADDER[1:])]
    assert all(1.33 <= ratio <= 1.5 for ratio in ratios[3:]) and set(TABLE_13_BATCHES) <= set(recipe.BATCH_LADDER)
    small = recipe.replace(TRUNCATE, d0=2 ** 19, batch_at_d0=16)
    assert [ladder_batch(level * 2 ** 19, small) for level in (0.5, 1, 2, 4, 8, 16)] == [12, 16, 24, 32, 48, 64]


TABLE_13_BATCHES = [batch for _, batch, _ in TABLE_13]


def test_the_iso_depth_schedule_is_linear_from_one_to_a_tenth():
    """App. E: no warmup, lr(step) = peak (1 - 0.9 step / (steps - 1)), clamped at the end."""
    total = 11
    values = [lr_multiplier(step, total) for step in range(total)]
    assert values[0] == 1.0 and values[-1] == pytest.approx(0.1)
    assert [b - a for a, b in zip(values, values[1:])] == pytest.approx([-0.09] * (total - 1))  # constant slope
    assert lr_multiplier(50, 101) == pytest.approx(0.55)
    assert lr_multiplier(200, 101) == pytest.approx(0.1)                     # clamped after the end
    assert lr_multiplier(0, 1) == 1.0
    assert lr_multiplier(9, 10, final_frac=0.0) == 0.0


def test_the_truncate_or_not_schedule_warms_up_for_2_percent_then_falls_as_a_cosine_to_a_tenth():
    """§3: "warms up over the first 2% of steps and decays with a cosine to 10% of its peak" (8,192 steps: 164)."""
    steps = 8192
    values = [lr_multiplier(s, steps, 0.1, TRUNCATE.warmup_frac, TRUNCATE.decay) for s in range(steps)]
    warmup = round(0.02 * steps)
    assert warmup == 164 and values[:warmup] == pytest.approx([(s + 1) / warmup for s in range(warmup)])
    assert values[warmup] == 1.0 and values[-1] == pytest.approx(0.1)
    middle = warmup + (steps - 1 - warmup) // 2
    assert values[middle] == pytest.approx(0.55, abs=1e-3)  # half way down the cosine: 0.1 + 0.9 / 2
    assert all(b <= a for a, b in zip(values[warmup:], values[warmup + 1:]))
    quarter = warmup + (steps - 1 - warmup) // 4  # a cosine stays high longer than a line: 0.1 + 0.9 cos^2(pi/8)
    assert values[quarter] == pytest.approx(0.1 + 0.9 * math.cos(math.pi / 8) ** 2, abs=1e-3)


def tiny_args(sample_data, *extra):
    return ["--data", str(sample_data), "--scale", "1", "--head-dim", "16", "--prelude", "1", "--recur", "2",
            "--coda", "1", "--ref-batch", "512", "--eval-rows", "64", "--log-every", "1", *extra]


def test_a_truncate_or_not_run_trains_on_its_batch_rule_and_schedule(sample_data, tmp_path):
    """The batch follows the horizon (here D0 = 2,048 tokens and 4 sequences at D0: D = 3.75 D0 -> 7.7 -> 8
    sequences of 64 tokens), the steps are the tokens over the batch rounded up to a multiple of 8 (15 -> 16), the LR follows warmup and cosine, the MuonH LR falls as D^-0.40,
    and the row carries the recipe, the target tokens and D0 (a fit needs them) beside the measured compute."""
    out = tmp_path / "run"
    args = tiny_args(sample_data, "--r", "2", "--r-bwd", "1", "--recipe", "truncate-or-not", "--d0", "2048",
                     "--batch-at-d0", "4", "--tokens", "7680", "--warmup-frac", "0.25", "--out", str(out))
    assert train.main(args) == 0
    row = json.loads((out / "final.json").read_text())
    assert row["batch_tokens"] == 8 * 64 and row["steps"] == 16 and row["tokens"] == 16 * 8 * 64
    assert row["recipe"] == "truncate-or-not" and row["tokens_target"] == 7680 and row["d0"] == 2048
    assert row["identity"]["schedule"] == {"recipe": "truncate-or-not", "warmup_frac": 0.25, "decay": "cosine"}
    assert row["lr_rule"]["data_exp"] == 0.40
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [rec["lr_mult"] for rec in records] == pytest.approx(
        [lr_multiplier(s, 16, 0.1, 0.25, "cosine") for s in range(16)])
    cfg = flops.ModelConfig(**row["identity"]["model"])
    assert row["flops_measured"] == flops.measured_flops(cfg, row["tokens"], 16)


def test_iso_depth_runs_keep_their_identity(sample_data, tmp_path):
    """--recipe iso-depth is what a run without the flag trains: the same run_id, no schedule entry (every committed
    iso-depth run keeps its run_id: tests/test_study.py)."""
    plain = train.parse_args(tiny_args(sample_data, "--tokens", "2048", "--batch-tokens", "512"))
    named = train.parse_args(tiny_args(sample_data, "--tokens", "2048", "--batch-tokens", "512", "--recipe",
                                       "iso-depth"))
    from nanoloop import dataloader
    from nanoloop import runs
    meta = dataloader.read_meta(sample_data)
    ids = [runs.run_identity(args, meta, runs.plan_run(args, meta, 1)) for args in (plain, named)]
    assert ids[0][1] == ids[1][1] and "schedule" not in ids[0][0]
    warm = train.parse_args(tiny_args(sample_data, "--tokens", "2048", "--batch-tokens", "512", "--warmup-frac",
                                      "0.1"))
    assert runs.run_identity(warm, meta, runs.plan_run(warm, meta, 1))[1] != ids[0][1]


@pytest.mark.parametrize("bad, said", [(["--recipe", "truncate-or-not", "--batch-tokens", "512"], "--batch-tokens"),
                                       (["--warmup-frac", "1.5"], "--warmup-frac"),
                                       (["--lr-decay", "step"], "--lr-decay")])
def test_a_recipe_flag_that_cannot_be_honoured_is_one_line(sample_data, tmp_path, capsys, bad, said):
    with pytest.raises(SystemExit) as exit_info:
        train.main(tiny_args(sample_data, "--tokens", "4096", "--out", str(tmp_path / "run"), *bad))
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and said in err[0], err
    assert not (tmp_path / "run").exists()
