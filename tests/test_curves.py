"""
The training-curves figure (nanoloop/plots.py, written by fit_laws.py --plots): each run's curve is read from its
own log.jsonl, or from its sweep log's progress lines (following "reused:" to the grid that trained it),
never from another run's; the figure has a column per budget, a colour per architecture, a line style per
width, the validation loss at each run's end, and says where its curves came from.
"""
import json
import subprocess
import sys
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from nanoloop import plots  # noqa: E402
import fit_laws  # noqa: E402
import train  # noqa: E402
from nanoloop import tracking  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
COMMITTED = {"cpu-micro": 56, "cpu-micro-trunc": 62, "cpu-micro-hyper": 59, "cpu-micro-layout": 56,
             "cpu-micro-lr": 56, "cpu-micro-v2-flat": 48}  # every committed grid whose sweep logs are committed


def test_the_sweep_log_parser_reads_what_train_py_prints(sample_data, tmp_path, capsys):
    """The progress lines are train.py's own (log_progress): parsed back they are log.jsonl's losses to 4
    decimals, and the final val loss is the row's; another run's lines in the same log are not taken."""
    out = tmp_path / "run"
    tiny = ["--scale", "1", "--head-dim", "16", "--depth", "6", "--prelude", "1", "--coda", "1", "--batch-tokens",
            "512", "--ref-batch", "512", "--eval-rows", "64", "--log-every", "3", "--r", "2", "--tokens", "5120"]
    assert train.main(["--data", str(sample_data), "--out", str(out), *tiny]) == 0
    printed = capsys.readouterr().out
    row = json.loads((out / "final.json").read_text())
    other = printed.replace(row["run_id"][:12], "0" * 12).replace("final val loss ", "final val loss 1")
    log = tmp_path / "sweep.log"
    log.write_text(f"[2026-01-01T00:00:00Z] python3 train.py ...\n{printed}"
                   f"[2026-01-01T00:01:00Z] python3 train.py ...\n{other}")  # a later run of another identity
    steps, final, donor = plots.parse_sweep_log(log, row)
    logged = {rec["step"]: rec["loss"] for rec in map(json.loads, (out / "log.jsonl").read_text().splitlines())}
    assert sorted(steps) == sorted(logged) == [1, 3, 6, 9, 10] and donor is None
    assert all(steps[k] == float(f"{logged[k]:.4f}") for k in logged)
    assert final == f"{row['val_loss']:.4f}"


def write_run(grid, name, row, steps, how):
    """A run of a tiny grid: its folder with log.jsonl and run.json ("folder"), or only its sweep log's lines
    ("log"), or a sweep log saying it was reused from `how[1]` ("reused", donor path)."""
    losses = {step: 7.0 - 0.01 * step - 0.1 * row["r"] for step in range(1, steps + 1)}
    if how == "folder":
        folder = grid / "runs" / name
        folder.mkdir(parents=True)
        (folder / "run.json").write_text(json.dumps({"run_id": row["run_id"]}))
        log = tracking.RunLog(folder)
        for step, loss in losses.items():
            log.write({"step": step, "steps": steps, "loss": loss})
        log.close(row)
    else:
        (grid / "logs").mkdir(parents=True, exist_ok=True)
        lines = [f"[2026-01-01T00:00:00Z] python3 train.py --out {grid}/runs/{name}"]
        if how == "log":
            lines.append(f"{row['run']}: N 0.01M (once 0.00M, rec 0.01M), {steps} steps, run_id {row['run_id'][:12]}")
            lines += [f"step {s:>6}/{steps} | loss {loss:.4f} | lrm 1.000 | 1 tok/s" for s, loss in losses.items()]
            lines.append(f"final val loss {row['val_loss']:.4f} nats/token | wall 0.1m")
        else:
            lines.append(f"reused: {how[1]}")
        (grid / "logs" / f"{name}.log").write_text("\n".join(lines) + "\n")
    return losses


def tiny_grid(tmp_path):
    """Two budgets x r in {1, 4} x two widths, in a sweep OUT "tiny" beside a sibling "base": runs whose
    curves come from log.jsonl, from the sweep log, through "reused:" from base, and one with none."""
    grid, base = tmp_path / "tiny", tmp_path / "base"
    rows, want = [], {}
    for k, (C, r, d) in enumerate([(C, r, d) for C in (1e12, 4e12) for r in (1, 4) for d in (8, 16)]):
        name = f"r{r}_d{d}_C{C:g}"
        row = {"run_id": f"{k:02x}" * 32, "run": name, "out": f"somewhere/else/runs/{name}", "r": r, "r_bwd": r,
               "injection": "none" if r == 1 else "linear", "d_model": d, "flops_budget": C, "steps": 10 + k,
               "batch_tokens": 256, "flops_per_token": 1e4 * d, "val_loss": 6.0 - 0.1 * k}
        rows.append(row)
        if k == 7:
            continue  # its sweep log names another run's training: it has no curve
        if r == 4 and d == 16:  # trained in base, reused here
            want[name] = write_run(base, name, row, row["steps"], "log")
            write_run(grid, name, row, row["steps"], ("reused", f"runs/base/runs/{name}"))
        else:
            want[name] = write_run(grid, name, row, row["steps"], "folder" if k % 2 else "log")
    for how in ("log", "folder"):  # the last run's log and folder hold another identity's training
        write_run(grid, rows[7]["run"], dict(rows[7], run_id="ff" * 32), rows[7]["steps"], how)
    return grid / "results.jsonl", rows, want


def test_each_run_gets_its_own_curve_from_its_folder_its_sweep_log_or_the_grid_it_was_reused_from(tmp_path):
    results, rows, want = tiny_grid(tmp_path)
    found, notes = plots.grid_curves(rows, results)
    got = {row["run"]: steps for row, steps, _ in found}
    assert set(got) == set(want) and len(got) == 7
    for name, losses in want.items():
        assert got[name] == pytest.approx(losses, abs=5e-5)  # a sweep log keeps 4 decimals
    sources = {row["run"]: source for row, _, source in found}
    assert list(sources.values()).count(plots.LOG_JSONL) == 2
    assert sources["r1_d16_C1e+12"] == plots.LOG_JSONL and sources["r1_d8_C1e+12"] == plots.SWEEP_LOG
    assert sources["r4_d16_C1e+12"] == plots.SWEEP_LOG  # read from base's log, through "reused:"
    assert notes == [f"no training curve for 1 of 8 runs (no log.jsonl of theirs, no sweep log of theirs in "
                     f"{results.parent / 'logs'}): r4_d16_C4e+12"]


def test_the_figure_has_a_column_per_budget_and_a_legend_for_every_mark(tmp_path):
    results, rows, want = tiny_grid(tmp_path)
    found, _ = plots.grid_curves(rows, results)
    fig = plots.plot_curves(plt, found, "tiny", len(rows))
    axes = fig.axes
    assert len(axes) == 4  # tokens and FLOPs rows, two budgets
    assert [ax.get_title() for ax in axes[:2]] == ["C = 1e+12 FLOPs", "C = 4e+12 FLOPs"]
    assert [ax.get_xlabel() for ax in axes] == ["tokens seen"] * 2 + ["FLOPs spent (F x tokens)"] * 2
    for ax in axes[:2]:  # each budget's widths, narrowest solid
        legend = ax.get_legend()
        assert [t.get_text() for t in legend.get_texts()] == ["d = 8", "d = 16"]
        assert [h.get_linestyle() for h in legend.legend_handles] == ["-", "--"]
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["r=1", "r=4 bwd=4 linear",
                                                          "marker: the run's final validation loss"]
    title = fig._suptitle.get_text()
    assert title.startswith("tiny: ") and "log.jsonl for 2 runs" in title
    assert "progress lines (losses to 4 decimals) for 5 runs" in title and "1 of 8 runs have none" in title
    # A run is a line in its budget's column, x = tokens (top) and FLOPs (below), ending at its val marker.
    row = next(row for row in rows if row["run"] == "r1_d16_C4e+12")  # from log.jsonl: exact losses
    steps = sorted(want[row["run"]])
    for ax, per_token in ((axes[1], 1), (axes[3], row["flops_per_token"])):
        x = [s * 256 * per_token for s in steps]
        (line,) = [line for line in ax.get_lines() if list(line.get_xdata()) == x]
        assert list(line.get_ydata()) == [want[row["run"]][s] for s in steps] and line.get_linestyle() == "--"
        assert line.get_color() == "C0"  # r = 1, the first architecture
        assert [x[-1], row["val_loss"]] in [point for c in ax.collections for point in c.get_offsets().tolist()]
    low, high = axes[0].get_ylim()
    assert low < min(r["val_loss"] for r, _, _ in found) and high < 7.0  # on the data after the first 10%
    plt.close(fig)


@pytest.mark.parametrize("grid, n_runs", COMMITTED.items())
def test_every_committed_grid_with_its_sweep_logs_has_a_curve_for_every_run(grid, n_runs):
    """The committed CPU grids keep their sweep logs (not their run folders): every row's training is found
    there, checked by run name, run_id and final val loss. cpu-micro-eval (no logs) has none."""
    results = REPO / "dev" / "results" / grid / "results.jsonl"
    rows = fit_laws.prepare_rows(fit_laws.drop_unusable(fit_laws.load_results(results))[0])
    found, notes = plots.grid_curves(rows, results)
    assert len(rows) == len(found) == n_runs and notes == []
    assert {source for _, _, source in found} == {plots.SWEEP_LOG}
    eval_results = REPO / "dev" / "results" / "cpu-micro-eval" / "results.jsonl"
    assert plots.grid_curves(fit_laws.load_results(eval_results), eval_results)[0] == []


@pytest.mark.slow
def test_fit_laws_plots_writes_the_curves_beside_the_other_figures(tmp_path):
    results = REPO / "dev" / "results" / "cpu-micro" / "results.jsonl"
    done = subprocess.run([sys.executable, "fit_laws.py", str(results), "--plots", str(tmp_path), "--restarts", "4",
                           "--bootstrap", "0", "--workers", "1"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"wrote isoflop.png, pred_vs_actual.png, frontier.png, curves.png to {tmp_path}" in done.stdout
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
