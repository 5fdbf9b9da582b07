"""dev/gpu_check.sh: the one-shot GPU check runs end to end on CPU at toy size before anyone spends
GPU time on it — every configuration trains, reports finite numbers and lands in the JSON and the
table — and a failing, out-of-memory or out-of-time configuration is recorded while the rest go on."""
import importlib.util
import json
import math
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch

import flops

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gpu_check", REPO / "dev" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)
NAMES = [c["name"] for c in gpu_check.CONFIGS]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """bash dev/gpu_check.sh --tiny with $OUT set, as the device tool runs it."""
    out = tmp_path_factory.mktemp("gpu_check")
    proc = subprocess.run(["bash", "dev/gpu_check.sh", "--tiny", "--device", "cpu"], cwd=REPO, capture_output=True,
                          text=True, env=dict(os.environ, OUT=str(out)))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads((out / "gpu_check_tiny.json").read_text()), (out / "gpu_check_tiny.txt").read_text(), proc.stdout


def test_the_plan_is_the_issue_13_grid():
    """s = 10 and 24 x (r = 1, r = 4, r = 4 with r_bwd = 2) x (eager, compiled), eager first."""
    combos = {(c["scale"], c["r"], c["r_bwd"], c["compiled"]) for c in gpu_check.CONFIGS}
    archs = ((1, 1), (4, 4), (4, 2))
    assert combos == {(s, r, rb, comp) for s in (10, 24) for r, rb in archs for comp in (False, True)}
    assert len(NAMES) == 12 == len(set(NAMES))
    assert [c["compiled"] for c in gpu_check.CONFIGS] == [False] * 6 + [True] * 6


@pytest.mark.slow
def test_tiny_run_measures_every_configuration(tiny_run):
    report, _, _ = tiny_run
    assert [row["name"] for row in report["configs"]] == NAMES
    for row in report["configs"]:
        assert row["status"] == "ok", row
        assert math.isfinite(row["tokens_per_s"]) and row["tokens_per_s"] > 0
        assert row["timed_steps"] == 2 and row["rows"] == 2 and row["seq_len"] == 64
        for key in ("loss_first", "loss_last", "loss_bf16", "loss_fp32", "fwd_bwd_s", "optimizer_s", "first_step_s"):
            assert math.isfinite(row[key]), (row["name"], key)
        # Random tokens over 512 ids: the first loss is near ln(512) = 6.24, and training on the one
        # fixed batch lowers it, so the optimiser step really moved the weights.
        assert abs(row["loss_first"] - math.log(512)) < 0.1
        assert row["loss_last"] < row["loss_first"] - 0.1
        assert abs(row["loss_bf16_minus_fp32"]) < 0.05  # bf16 autocast changes the loss only by rounding
        assert row["mfu"] is None and row["peak_mem_gib"] is None  # CPU: no peak FLOP/s, no CUDA memory
        assert_speed_is_its_timings(row)
    env = report["environment"]
    assert env["torch"] == torch.__version__ and env["device"] == "cpu" and env["attention_backend"] == "cpu"
    assert "random tokens" in report["data"]


def assert_speed_is_its_timings(row):
    """tokens/s of one micro-batch step, and the projection to the paper's 2^18-token batch: gradient
    accumulation runs 2^18 / (rows x seq_len) forward+backward passes and the optimiser once."""
    tokens = row["rows"] * row["seq_len"]
    accum = 2 ** 18 // tokens
    assert row["tokens_per_step"] == tokens
    assert row["tokens_per_s"] == pytest.approx(tokens / (row["fwd_bwd_s"] + row["optimizer_s"]), rel=1e-12)
    assert row["at_2p18_tokens_per_s"] == pytest.approx(
        accum * tokens / (accum * row["fwd_bwd_s"] + row["optimizer_s"]), rel=1e-12)


@pytest.mark.slow
def test_compiled_step_is_one_graph_and_matches_eager(tiny_run):
    """Dynamo traces the whole model (the no_grad loops of truncated BPTT included) as one graph,
    and the compiled model computes the eager model's loss."""
    rows = {row["name"]: row for row in tiny_run[0]["configs"]}
    for name in NAMES:
        if name.endswith("_compiled"):
            assert rows[name]["compiled_graphs"] == 1 and rows[name]["graph_breaks"] == 0, name
            assert rows[name]["compile_s"] > 0
            eager = rows[name.replace("_compiled", "_eager")]
            assert rows[name]["loss_first"] == pytest.approx(eager["loss_first"], abs=1e-4)
        else:
            assert rows[name]["compile_s"] is None


@pytest.mark.slow
def test_table_has_a_line_per_configuration(tiny_run):
    _, table, stdout = tiny_run
    assert "random tokens" in table and "configuration" in table
    for name in NAMES:
        line = next(line for line in table.splitlines() if line.startswith(name + " "))
        assert len(line.split()) == 11, line  # name rows tok/s MFU @2^18 fwd+bwd optim compile peak loss diff
    assert table.strip() in stdout


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    for bad in (["--steps", "0"], ["--only", "s12_r1_eager"], ["--max-seconds", "0"], ["--device", "tpu"]):
        assert gpu_check.main(["--tiny", "--out", str(tmp_path), *bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("gpu_check.py: ") and len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.iterdir())  # refused before any work


def test_a_failing_configuration_is_recorded_and_the_rest_go_on(tmp_path, monkeypatch):
    """A crash is recorded with its message; out-of-memory halves the rows and retries."""
    real_measure = gpu_check.measure

    def flaky_measure(spec, rows, args, device):
        if spec["name"] == "s10_r1_eager":
            raise RuntimeError("Triton compilation failed\nlong traceback")
        if rows > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20 GiB")
        return real_measure(spec, rows, args, device)

    monkeypatch.setattr(gpu_check, "measure", flaky_measure)
    only = "s10_r1_eager,s24_r4_bwd2_eager"
    assert gpu_check.main(["--tiny", "--device", "cpu", "--out", str(tmp_path), "--only", only]) == 0
    failed, survived = json.loads((tmp_path / "gpu_check_tiny.json").read_text())["configs"]
    assert failed["status"] == "failed" and failed["error"] == "RuntimeError: Triton compilation failed"
    assert survived["status"] == "ok" and survived["rows"] == 1 and math.isfinite(survived["tokens_per_s"])
    assert "s10_r1_eager" in (tmp_path / "gpu_check_tiny.txt").read_text()


def test_out_of_time_configurations_are_skipped_and_written(tmp_path):
    assert gpu_check.main(["--tiny", "--device", "cpu", "--out", str(tmp_path), "--max-seconds", "1e-9"]) == 0
    report = json.loads((tmp_path / "gpu_check_tiny.json").read_text())
    assert [row["status"] for row in report["configs"]] == ["skipped"] * 12
    assert report["configs"][0]["error"] == "--max-seconds 1e-09 would be exceeded"


def test_a_failing_loss_check_keeps_the_speed_numbers():
    """A model that only runs under autocast (fp32 forward raises) loses the loss comparison, not the row."""
    class AutocastOnly(torch.nn.Module):
        def forward(self, x, y):
            if not torch.is_autocast_enabled("cpu"):
                raise RuntimeError("mat1 and mat2 must have the same dtype")
            return torch.tensor(1.0)

    x = torch.zeros(1, 4, dtype=torch.long)
    result = gpu_check.bf16_vs_fp32(AutocastOnly(), x, x, torch.device("cpu"))
    assert result["loss_bf16_minus_fp32"] is None
    assert result["loss_check_error"] == "RuntimeError: mat1 and mat2 must have the same dtype"


def test_the_committed_h200_run_measured_every_configuration(tmp_path):
    """dev/results/gpu_check is one real H200 run of the plan: every configuration trained, each compiled
    model is one graph, bf16 moves the loss by rounding only, a loop costs what a unique block costs
    (iso-depth: r = 4's MFU within 10% of r = 1's), and truncated BPTT's fewer FLOPs per token show up
    as tokens/s. The committed table is the script's rendering of the committed JSON."""
    committed = REPO / "dev" / "results" / "gpu_check"
    report = json.loads((committed / "gpu_check.json").read_text())
    assert report["environment"]["device"] == "NVIDIA H200" and not report["settings"]["tiny"]
    rows = {row["name"]: row for row in report["configs"]}
    assert list(rows) == NAMES and all(row["status"] == "ok" and row["rows"] == 16 for row in rows.values())
    for name, row in rows.items():
        assert abs(row["loss_bf16_minus_fp32"]) < 0.005, name
        if name.endswith("_compiled"):
            assert row["compiled_graphs"] == 1 and row["graph_breaks"] == 0, name
    for s in (10, 24):
        for mode in ("eager", "compiled"):
            r1, r4, bwd2 = (rows[f"s{s}_{arch}_{mode}"] for arch in ("r1", "r4", "r4_bwd2"))
            assert r4["at_2p18_mfu"] == pytest.approx(r1["at_2p18_mfu"], rel=0.1)
            assert bwd2["tokens_per_s"] > 1.15 * r4["tokens_per_s"]  # 0.75x the FLOPs per token
        assert rows[f"s{s}_r1_compiled"]["tokens_per_s"] > 1.3 * rows[f"s{s}_r1_eager"]["tokens_per_s"]
    assert gpu_check.write_outputs(tmp_path, "gpu_check", report) + "\n" == (committed / "gpu_check.txt").read_text()


def test_the_committed_h200_numbers_are_flops_py_and_their_own_timings():
    """Every number of the committed H200 record follows from flops.py and its measured seconds: F and N of the
    configuration, tokens/s, MFU = F x tokens/s / 989 TFLOP/s (one GPU), the 2^18 projection and its MFU, and
    the compile time (first step minus a steady one)."""
    report = json.loads((REPO / "dev" / "results" / "gpu_check" / "gpu_check.json").read_text())
    assert report["environment"]["peak_bf16_flops"] == flops.peak_flops("NVIDIA H200") == 989e12
    for row in report["configs"]:
        cfg = flops.ModelConfig(r=row["r"], r_bwd=row["r_bwd"], scale=row["scale"])
        F = flops.flops_per_token(cfg)
        assert row["flops_per_token"] == F and row["n_params"] == flops.param_counts(cfg)["n_params"]
        assert row["seq_len"] == 2048
        assert_speed_is_its_timings(row)
        assert 2 ** 18 // row["tokens_per_step"] == 8  # 16 rows x 2048 tokens, 8 of them per 2^18
        assert row["mfu"] == pytest.approx(F * row["tokens_per_s"] / 989e12, rel=1e-12)
        assert row["at_2p18_mfu"] == pytest.approx(F * row["at_2p18_tokens_per_s"] / 989e12, rel=1e-12)
        if row["compiled"]:
            assert row["compile_s"] == pytest.approx(row["first_step_s"] - row["fwd_bwd_s"] - row["optimizer_s"],
                                                     rel=1e-9)


def test_readmes_gpu_numbers_are_the_committed_record():
    """README's GPU-check line: compiled MFU at a 2^18-token batch, per width, is the record's range."""
    readme = (REPO / "README.md").read_text()
    claim = re.search(r"compiled MFU at a 2¹⁸-token batch\s+(\d+)–(\d+)% \(s = 10\) and (\d+)–(\d+)% \(s = 24\)",
                      readme)
    assert claim, "README no longer states the GPU check's MFU"
    lo10, hi10, lo24, hi24 = map(int, claim.groups())
    report = json.loads((REPO / "dev" / "results" / "gpu_check" / "gpu_check.json").read_text())
    for scale, lo, hi in ((10, lo10, hi10), (24, lo24, hi24)):
        measured = [round(100 * row["at_2p18_mfu"]) for row in report["configs"]
                    if row["compiled"] and row["scale"] == scale]
        assert len(measured) == 3 and min(measured) == lo and max(measured) == hi, (scale, measured)
