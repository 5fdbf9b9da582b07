"""
Truncate or Not?'s Table 12 at CPU scale from a cpu-untied sweep (./sweep.sh --grid cpu-untied): per size, the
untied model (each loop its own block, W_inj and norm; App. E.2), (2, 2) at the same width and (2, 2) widened to
~80% of the untied model's parameters, all on the same tokens (~18 per parameter of (2, 2)), three seeds: their
non-embedding parameters, forward/backward compute per token relative to the untied model, the mean validation loss
and the difference to the untied model with its standard error over the seed pairs.

    python dev/untied_report.py dev/results/cpu-untied            # the table (also written to OUT/fit/table12.txt)
    python dev/untied_report.py dev/results/cpu-untied --check    # the table only (the test compares it with the file)
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import flops  # noqa: E402

MODELS = ("untied", "(2, 2)", "(2, 2), wider")


def model_of(row):
    """Which of the three models a row is: untied (its config says so), wider (its run folder, w<width>_...) or the
    (2, 2) model at the untied model's width."""
    name = Path(row["out"]).name
    if row.get("untied"):
        return "untied"
    if name.startswith("w"):
        return "(2, 2), wider"
    return "(2, 2)"


def table(rows):
    """{size (the level D/D0 its runs share): {model: [rows by seed]}}, sizes in ascending order."""
    by_size = {}
    for row in rows:
        level = float(row["tokens_target"]) / float(row["d0"])
        by_size.setdefault(level, {}).setdefault(model_of(row), []).append(row)
    return dict(sorted(by_size.items()))


def difference(rows, base):
    """Mean and standard error of (loss - untied loss) over the seeds both have."""
    theirs = {row["seed"]: row["val_loss"] for row in base}
    deltas = [row["val_loss"] - theirs[row["seed"]] for row in rows if row["seed"] in theirs]
    if len(deltas) < 2:
        return None, None
    return statistics.mean(deltas), statistics.stdev(deltas) / len(deltas) ** 0.5


def report(rows):
    lines = ["size (tokens)  model            width          parameters  compute      loss  seed sd   - untied (mean +- s.e.)"]
    for level, models in table(rows).items():
        untied = models.get("untied", [])
        reference = flops.flops_per_token(flops.ModelConfig(**untied[0]["identity"]["model"])) if untied else None
        size = f"d{untied[0]['d_model']} ({level:g} D0)" if untied else f"{level:g} D0"
        for model in MODELS:
            runs = sorted(models.get(model, []), key=lambda row: row["seed"])
            if not runs:
                continue
            cfg = flops.ModelConfig(**runs[0]["identity"]["model"])
            compute = flops.flops_per_token(cfg) / reference if reference else float("nan")
            loss = statistics.mean(row["val_loss"] for row in runs)
            spread = statistics.stdev(row["val_loss"] for row in runs) if len(runs) > 1 else float("nan")
            mean, error = difference(runs, untied) if model != "untied" else (None, None)
            delta = f"{mean:+.4f} +- {error:.4f}" if mean is not None else ""
            width = f"{cfg.d_model} ({cfg.n_head} x {cfg.head_dim})"
            lines.append(f"{size:<14} {model:<16} {width:<14} {runs[0]['n_params']:>10,}  {compute:>7.2f}  "
                         f"{loss:>8.4f}  {spread:>7.4f}   {delta}  ({len(runs)} seeds)")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="the cpu-untied sweep's OUT (its results.jsonl)")
    parser.add_argument("--check", action="store_true", help="print the table only, leave OUT/fit/table12.txt as it "
                                                              "is (the test compares the two)")
    args = parser.parse_args()
    path = Path(args.out) / "results.jsonl"
    if not path.is_file():
        sys.exit(f"untied_report.py: {path}: no such file (run ./sweep.sh --grid cpu-untied first)")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    text = report(rows)
    print(text)
    if args.check:
        return
    (Path(args.out) / "fit").mkdir(exist_ok=True)
    (Path(args.out) / "fit" / "table12.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
