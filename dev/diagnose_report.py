"""
Tables of the CPU-scale diagnostics (dev/diagnose_micro.sh): where the flat looping penalty of the earlier
cpu-micro grid (dev/results/cpu-micro-v2-flat) comes from. Every run is at C = 1.5e12 FLOPs and d = 16 (the grid's best width there) unless named
otherwise. Most runs use the paper's MuonH base LR 0.014 (train.py's default); the "_lr0.056" runs use the
grid's 0.056, and compare with that grid's own seed-0 rows.

    python dev/diagnose_report.py            # prints the tables that dev/README.md quotes
"""
import argparse
import json
import statistics
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
RS = (1, 2, 4, 8)


def load(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def main(diag_path=RESULTS / "diagnostics" / "results.jsonl",
         grid_path=RESULTS / "cpu-micro-v2-flat" / "results.jsonl"):
    loss = {Path(row["out"]).name: row["val_loss"] for row in load(diag_path)}
    for row in load(grid_path):  # the grid's seed-0 runs at d = 16, C = 1.5e12 (MuonH base LR 0.056)
        if row["flops_budget"] == 1.5e12 and row["scale"] == 0.25:
            loss[f"r{row['r']}_seed0_lr0.056"] = row["val_loss"]
    get = lambda name: f"{loss[name]:.3f}" if name in loss else "  -  "  # noqa: E731

    print("MuonH base LR 0.014, norm LR 0.005: seeds 1 and 2 (val loss, nats/token)")
    base = {}
    for r in RS:
        seeds = [loss[f"r{r}_seed{s}"] for s in (1, 2)]
        base[r] = statistics.mean(seeds)
        print(f"  r = {r}: {seeds[0]:.3f} {seeds[1]:.3f}  mean {base[r]:.3f}  gap to r = 1 {base[r] - base[1]:+.3f}")
    print(f"  r = 1 in the looped layout (prelude 2 + 16-layer block once + coda 2): linear injection "
          f"{get('layout_linear')} ({loss['layout_linear'] - base[1]:+.3f}), passthrough {get('layout_pass')} "
          f"({loss['layout_pass'] - base[1]:+.3f})")
    print(f"  r = 4 injection: linear {base[4]:.3f} (mean), additive {get('r4_additive')}, "
          f"passthrough {get('r4_passthrough')}")

    print("\nNorm scales' AdamW base LR (paper 0.005), MuonH 0.014, seed 0 (0.005: mean of seeds 1, 2): gap to r = 1")
    for norm_lr in ("0.005", "0.05", "0.15", "0.5"):
        row = {r: base[r] if norm_lr == "0.005" else loss.get(f"r{r}_lrnorm{norm_lr}") for r in RS}
        layout = loss["layout_pass"] if norm_lr == "0.005" else loss.get(f"layout_pass_lrnorm{norm_lr}")
        cells = [f"r = {r}: " + (f"{row[r]:.3f} ({row[r] - row[1]:+.3f})" if row[r] else "      -        ") for r in RS]
        cells.append("layout: " + (f"{layout:.3f} ({layout - row[1]:+.3f})" if layout else "-"))
        print(f"  {norm_lr:>5}  " + "  ".join(cells))

    print("\nMuonH base LR at norm LR 0.05, seed 0")
    for r in (1, 4):
        print(f"  r = {r}: 0.014 {get(f'r{r}_lrnorm0.05')}  0.028 {get(f'r{r}_lrnorm0.05_lr0.028')}  "
              f"0.112 {get(f'r{r}_lrnorm0.05_lr0.112')}")

    print("\nMuonH base LR at norm LR 0.15 (seed 0; a second seed in brackets)")
    for r in (1, 2, 4, 8):
        lrs = ("0.007", "0.014", "0.028", "0.056", "0.112")  # 0.014 is train.py's default: no suffix
        names = [f"r{r}_lrnorm0.15" + ("" if lr == "0.014" else f"_lr{lr}") for lr in lrs]
        cells = [f"{lr} {get(name)}" + (f" [{get(name + '_seed1')}]" if name + "_seed1" in loss else "")
                 for lr, name in zip(lrs, names)]
        print(f"  r = {r}: " + "  ".join(cells))

    print("\nThe grid's MuonH base LR 0.056 (seed 0 = the grid's row)")
    print(f"  r = 1 seeds 0, 1, 2: {get('r1_seed0_lr0.056')} {get('r1_seed1_lr0.056')} {get('r1_seed2_lr0.056')}   "
          f"r = 4 seeds 0, 1: {get('r4_seed0_lr0.056')} {get('r4_seed1_lr0.056')}")
    print(f"  r = 1 looped layout, passthrough: {get('layout_pass_lr0.056')}   norm LR 0.15: r = 1 "
          f"{get('r1_lrnorm0.15_lr0.056')}, r = 4 {get('r4_lrnorm0.15_lr0.056')}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="?", type=Path, default=RESULTS / "diagnostics" / "results.jsonl",
                        help="the diagnostics' results file (dev/diagnose_micro.sh writes it)")
    main(parser.parse_args().results)
