"""
The CPU study's tables (README "CPU-scale results", dev/README.md) from the committed rows and fits of
dev/results/cpu-micro{,-layout,-trunc,-hyper}: nothing here is typed in by hand, and a test checks that
the README's phi table is this script's.

    python dev/study_tables.py            # phi table, best width per (budget, r), the full loss grid

Each grid's fit is `fit_laws.py <grid>/results.jsonl --json <grid>/fit/fit.json` (what sweep.sh runs);
delta-phi is `fit_laws.py cpu-micro/results.jsonl --compare <grid>/results.jsonl --json <grid>/fit/compare.json`.
"""
import json
from pathlib import Path

from diagnose_report import load  # dev/'s one JSONL reader

RESULTS = Path(__file__).resolve().parent / "results"
# grid folder, label, the paper's phi for it (iso-depth §4.2 and §5)
GRIDS = [("cpu-micro", "base (linear injection)", "0.46 [0.41, 0.53]"),
         ("cpu-micro-layout", "base, r = 1 in the looped layout", "-"),
         ("cpu-micro-trunc", "truncated BPTT, r_bwd = ceil(r/2)", "0.38"),
         ("cpu-micro-hyper", "hyperconnections, K = 2", "0.65")]


def load_rows(grid):
    path = RESULTS / grid / "results.jsonl"
    return load(path) if path.exists() else []


def column(row):
    """Table column of a run: its r, marked for the case studies' variants."""
    tag = {"hyper": " hc"}.get(row.get("injection"), "")
    if row["r"] == 1 and row.get("injection") not in (None, "none"):
        tag = " layout"
    if row.get("r_bwd") and row["r_bwd"] < row["r"]:
        tag = f" bwd{row['r_bwd']}"
    return f"r={row['r']}{tag}"


def phi_table():
    lines = ["| grid | runs | φ (95% CI) | paper | Δφ vs base (95% CI) |", "|---|---|---|---|---|"]
    for grid, label, paper in GRIDS:
        fit_path = RESULTS / grid / "fit" / "fit.json"
        if not fit_path.exists():
            lines.append(f"| {label} | {len(load_rows(grid))} so far | not fitted yet | {paper} | - |")
            continue
        fit = json.loads(fit_path.read_text())
        lo, hi = fit["joint"]["phi_ci"] or (float("nan"), float("nan"))
        delta = "-"
        if (cmp_path := RESULTS / grid / "fit" / "compare.json").exists():
            d = json.loads(cmp_path.read_text())["delta_phi"]
            ci = d.get("delta_phi_ci") or (float("nan"), float("nan"))
            delta = f"{d['delta_phi']:+.2f} [{ci[0]:+.2f}, {ci[1]:+.2f}]"
        lines.append(f"| {label} | {fit['n_runs']} | {fit['joint']['phi']:.2f} [{lo:.2f}, {hi:.2f}] | {paper} | {delta} |")
    return lines


def loss_tables():
    rows = [row for grid, _, _ in GRIDS for row in load_rows(grid)]
    seen, unique = set(), []
    for row in rows:  # reused runs appear in several grids' files
        key = (row["flops_budget"], row["d_model"], column(row))
        if key not in seen:
            seen.add(key)
            unique.append(row)
    cols = sorted({column(row) for row in unique}, key=lambda c: (int(c.split()[0][2:]), c))
    loss = {(row["flops_budget"], row["d_model"], column(row)): row["val_loss"] for row in unique}
    budgets = sorted({row["flops_budget"] for row in unique})
    best = ["| budget C | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    full = ["| budget C | d | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    for C in budgets:
        cells = []
        for c in cols:
            at = {d: v for (b, d, cc), v in loss.items() if b == C and cc == c}
            cells.append(f"{min(at.values()):.3f} (d={min(at, key=at.get)})" if at else "-")
        best.append(f"| {C:.2g} | " + " | ".join(cells) + " |")
        for d in sorted({d for (b, d, _) in loss if b == C}):
            full.append(f"| {C:.2g} | {d} | " + " | ".join(f"{loss[C, d, c]:.3f}" if (C, d, c) in loss else "-"
                                                         for c in cols) + " |")
    return best, full


def main():
    best, full = loss_tables()
    print("phi per grid\n" + "\n".join(phi_table()))
    print("\nbest width per (budget, column): val loss (nats/token) and d\n" + "\n".join(best))
    print("\nevery run: val loss (nats/token)\n" + "\n".join(full))


if __name__ == "__main__":
    main()
