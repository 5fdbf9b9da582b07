"""
The answer of one CPU-scale ablation (dev/ablate.sh): a variant of the cpu-micro grid against the committed
base, run for run. Reads rows and fit_laws.py's JSON only; fits nothing itself.

    python dev/ablation_report.py dev/results/cpu-micro-gated         # the tables; writes fit/ablation.png
    python dev/ablation_report.py OUT --layout-anchored-rows > OUT/fit/layout_anchored.jsonl
    python dev/ablation_report.py OUT --same-cells dev/results/cpu-micro/results.jsonl   # the base at OUT's cells

(a) The paired table: variant minus base validation loss for every (budget, r) at each width, and at the best
    width of each. Beside it, what the same comparison gives with nothing changed: the committed runs trained
    again here with their identities unchanged (dev/results/cpu-micro-eval, |retrained - committed|) and with
    another seed (cpu-micro-seeds at 5e12, |seed 1 - seed 0|). A difference inside those is not a signal.
(b) Delta-phi with its 95% CI from fit_laws.py --compare, anchored on the layout-matched r = 1 (the anchor that
    identifies phi at these widths, cpu-micro-layout) and on the plain r = 1 (cpu-micro; phi is not identified
    there at d <= 48, see dev/README.md, "The CPU study").
(c) fit/ablation.png: both arms' empirical frontiers (the best width's loss per budget and r), overlaid.
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

from diagnose_report import load as read_rows  # dev/'s one JSONL reader

RESULTS = Path(__file__).resolve().parent / "results"
BASE, LAYOUT, EVAL = RESULTS / "cpu-micro", RESULTS / "cpu-micro-layout", RESULTS / "cpu-micro-eval"


def by_cell(rows):
    """{(budget, r): {d: val loss}} of a grid's rows."""
    cells = {}
    for row in rows:
        cells.setdefault((row["flops_budget"], row["r"]), {})[row["d_model"]] = row["val_loss"]
    return cells


def noise_floor():
    """(retrain, seed) spreads, each {r: [|delta val loss|]}: the same runs trained again here (their run_ids
    in cpu-micro-eval's results) and the seed-1 runs against their seed-0 twins (same config, same file set)."""
    committed = {row["run_id"]: row["val_loss"] for row in read_rows(BASE / "results.jsonl")}
    retrain, seeds = {}, {}
    retrained = read_rows(EVAL / "results.jsonl") if (EVAL / "results.jsonl").exists() else []
    for row in retrained:
        if row["run_id"] in committed:
            retrain.setdefault(row["r"], []).append(abs(row["val_loss"] - committed[row["run_id"]]))
    seed0 = {(row["flops_budget"], row["r"], row["d_model"]): row["val_loss"] for row in retrained}
    seed_rows = read_rows(EVAL / "seeds.jsonl") if (EVAL / "seeds.jsonl").exists() else []
    for row in seed_rows:
        twin = seed0.get((row["flops_budget"], row["r"], row["d_model"]))
        if twin is not None:
            seeds.setdefault(row["r"], []).append(abs(row["val_loss"] - twin))
    return retrain, seeds


def paired_table(base, variant):
    """Markdown lines: per (budget, r) of the variant, delta at each width and at each arm's best width."""
    widths = sorted({d for cell in variant.values() for d in cell})
    lines = ["| budget C | r | " + " | ".join(f"Δ d={d}" for d in widths) +
             " | base best | variant best | Δ best |", "|---|---|" + "---|" * (len(widths) + 3)]
    for (budget, r), cell in sorted(variant.items()):
        theirs = base.get((budget, r), {})
        deltas = [f"{cell[d] - theirs[d]:+.3f}" if d in cell and d in theirs else "" for d in widths]
        best_base = min(theirs, key=theirs.get) if theirs else None
        best_variant = min(cell, key=cell.get)
        base_text, delta_best = "-", "-"
        if best_base is not None:
            base_text = f"{theirs[best_base]:.3f} (d={best_base})"
            delta_best = f"{cell[best_variant] - theirs[best_base]:+.3f}"
        lines.append(f"| {budget:.2g} | {r} | " + " | ".join(deltas) +
                     f" | {base_text} | {cell[best_variant]:.3f} (d={best_variant}) | {delta_best} |")
    return lines


def spread_lines(retrain, seeds):
    lines = ["| nothing changed | r | runs | median |Δ| | max |Δ| |", "|---|---|---|---|---|"]
    for label, spread in (("retrained here (same run_id)", retrain), ("seed 1 vs seed 0 (5e12)", seeds)):
        for r, values in sorted(spread.items()):
            lines.append(f"| {label} | {r} | {len(values)} | {statistics.median(values):.3f} | {max(values):.3f} |")
    if not retrain and not seeds:
        lines.append("| (dev/results/cpu-micro-eval has no retrained or seed rows) | | | | |")
    return lines


def delta_phi_line(label, path):
    """One line of (b): phi of each arm with its CI and delta-phi with its CI, from a fit_laws.py --json file."""
    if not path.exists():
        return f"| {label} | not fitted ({path} is missing) | | |"
    out = json.loads(path.read_text())
    arms = []
    for fit in (out, out["compare"]):
        ci = fit["joint"].get("phi_ci")
        if ci:
            arms.append(f"{fit['joint']['phi']:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]")
        else:  # --bootstrap 0 (the --quick preset): a point estimate
            arms.append(f"{fit['joint']['phi']:.2f} (no CI)")
    delta = out["delta_phi"]
    ci = delta.get("delta_phi_ci")
    delta_text = f"{delta['delta_phi']:+.2f}"
    if ci:
        delta_text += f" [{ci[0]:+.2f}, {ci[1]:+.2f}]"
    return f"| {label} | {arms[0]} | {arms[1]} | {delta_text} |"


def plot_frontiers(base, variant, name, path):
    """Each r's best-width loss against the budget: the base solid, the variant dashed, same colour per r."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    rs = sorted({r for _, r in variant})
    for j, r in enumerate(rs):
        colour = plt.get_cmap("viridis")(j / max(1, len(rs) - 1))
        for cells, style, arm in ((base, "-", "base"), (variant, "--", name)):
            budgets = sorted(b for b, rr in cells if rr == r and (b, rr) in variant)
            best = [min(cells[b, r].values()) for b in budgets]
            ax.plot(budgets, best, style, marker="o", color=colour, label=f"r={r} {arm}")
    ax.set_xscale("log")
    ax.set_xlabel("compute budget C (FLOPs)")
    ax.set_ylabel("best width's validation loss (nats/token)")
    ax.set_title(f"cpu-micro: base (solid) against {name} (dashed), best width per budget")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def rows_in_cells(rows, variant_rows):
    """The rows at the (budget, r) cells the variant has (a subset sweep's base: --quick)."""
    cells = {(row["flops_budget"], row["r"]) for row in variant_rows}
    return [row for row in rows if (row["flops_budget"], row["r"]) in cells]


def layout_anchored_rows(variant_rows):
    """The variant's looped rows with cpu-micro-layout's r = 1 runs (of the variant's budgets) as the anchor."""
    budgets = {row["flops_budget"] for row in variant_rows}
    anchor = [row for row in read_rows(LAYOUT / "results.jsonl") if row["r"] == 1 and row["flops_budget"] in budgets]
    return anchor + [row for row in variant_rows if row["r"] > 1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="the variant's OUT folder (results.jsonl, fit/)")
    p.add_argument("--layout-anchored-rows", action="store_true",
                   help="print the variant's looped rows with the layout-matched r = 1 rows, as JSONL, and stop")
    p.add_argument("--same-cells", metavar="RESULTS", help="print RESULTS' rows at the variant's (budget, r) cells")
    args = p.parse_args()
    out = Path(args.out)
    if not (out / "results.jsonl").is_file():
        sys.exit(f"ablation_report.py: {out / 'results.jsonl'} not found: run dev/ablate.sh first")
    variant_rows = read_rows(out / "results.jsonl")
    if args.layout_anchored_rows or args.same_cells:
        if args.same_cells:
            rows = rows_in_cells(read_rows(args.same_cells), variant_rows)
        else:
            rows = layout_anchored_rows(variant_rows)
        print("".join(json.dumps(row) + "\n" for row in rows), end="")
        return
    name = out.name.removeprefix("cpu-micro-")
    base, variant = by_cell(read_rows(BASE / "results.jsonl")), by_cell(variant_rows)
    looped = {cell: losses for cell, losses in variant.items() if cell[1] > 1}
    print(f"(a) {name} minus base, validation loss (nats/token); r = 1 is the same run in both arms\n")
    print("\n".join(paired_table(base, looped)))
    print("\nwhat the same comparison gives with nothing changed (|Δ val loss|, nats/token):\n")
    print("\n".join(spread_lines(*noise_floor())))
    print(f"\n(b) delta-phi = phi({name}) - phi(base), 95% CI (fit_laws.py --compare)\n")
    print("| anchor | φ base | φ variant | Δφ |\n|---|---|---|---|")
    print(delta_phi_line("layout-matched r = 1", out / "fit" / "compare_layout.json"))
    print(delta_phi_line("plain r = 1", out / "fit" / "compare.json"))
    (out / "fit").mkdir(exist_ok=True)
    plot_frontiers(base, looped, name, out / "fit" / "ablation.png")
    print(f"\n(c) wrote {out / 'fit' / 'ablation.png'}")


if __name__ == "__main__":
    main()
