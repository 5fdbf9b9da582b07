"""
A trained looped model at test time: its validation loss at a list of loop counts (the iso-depth paper's App. A,
Parcae's test-time curve), and under adaptive exit (model.ExitRule: each token loops until its next-token
distribution or its state settles) at several thresholds, against the mean loops each token actually ran. Rows to
OUT/loops.jsonl, the figure to OUT/loops.png: loss against test-time loops (one line per trained r, r_bwd, injection
and loop-count distribution (train.py --loops), each run's loss relative to its own at its trained r, averaged over
the runs given) and loss against the mean loops spent, adaptive beside fixed, for one run of each trained r.

    python dev/loop_curves.py runs/cpu-truncate-or-not --loops 1,2,3,4,6,8,12,16 --out dev/results/loop-curves
    python dev/loop_curves.py RUN --exit kl,latent --thresholds 1e-4,1e-3,1e-2 --out /tmp/one  # adaptive too

A run needs its final checkpoint (ckpt.pt); truncated runs evaluate every loop (r_bwd only matters in training),
hyperconnections beyond their trained r reuse their last step's mixing (model.py), untied ones their last copy.
The validation rows are the run's own (train.py's: the val split in its fixed order), --rows of them.
"""
import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from nanoloop import runs  # noqa: E402
from nanoloop.common import DataError, fail, positive_int, positive_int_list  # noqa: E402
from nanoloop.dataloader import RowLoader  # noqa: E402
from nanoloop.engine import adaptive_forward  # noqa: E402
from model import EXIT_CRITERIA, ExitRule  # noqa: E402

PROG = "loop_curves.py"


def thresholds(text):
    values = [float(v) for v in text.split(",") if v]
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected thresholds >= 0 such as 1e-3,1e-2, got {text!r}")
    return values


def criteria(text):
    names = [v for v in text.split(",") if v]
    if not names or set(names) - set(EXIT_CRITERIA):
        raise argparse.ArgumentTypeError(f"expected criteria of {','.join(EXIT_CRITERIA)}, got {text!r}")
    return names


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="finished run folders, or sweep OUTs (every finished run under runs/)")
    parser.add_argument("--loops", type=positive_int_list, default=[1, 2, 3, 4, 6, 8, 12, 16],
                        help="test-time loop counts")
    parser.add_argument("--exit", type=criteria, default=[], help=f"adaptive-exit criteria ({','.join(EXIT_CRITERIA)})")
    parser.add_argument("--thresholds", type=thresholds, default=[1e-4, 1e-3, 1e-2, 1e-1],
                        help="adaptive exit's thresholds (0 is the fixed model)")
    parser.add_argument("--max-loops", type=positive_int, default=None,
                        help="adaptive exit's cap (default each run's trained r)")
    parser.add_argument("--adaptive-runs", choices=("all", "one-per-r"), default="one-per-r",
                        help="which runs adaptive exit is measured on (it costs a forward per loop and probe)")
    parser.add_argument("--rows", type=positive_int, default=512, help="validation rows per run")
    parser.add_argument("--batch", type=positive_int, default=64, help="rows per forward")
    parser.add_argument("--data", default="", help="the prepared data (default: each run's own)")
    parser.add_argument("--out", required=True, help="folder for loops.jsonl and loops.png")
    parser.add_argument("--add-rows", metavar="LOOPS_JSONL", default=None,
                        help="rows measured before (another run's loops.jsonl, its checkpoints gone) kept beside "
                             "these in loops.jsonl and the figure; a run measured again here replaces its old rows")
    return parser.parse_args(argv)


def validation_batches(data_dir, rows, batch):
    """The first `rows` validation rows in train.py's order, as (x, y) batches."""
    loader = RowLoader(data_dir, "val", min(batch, rows))
    return [loader.next_batch() for _ in range(max(1, rows // min(batch, rows)))]


@torch.no_grad()
def fixed_loss(model, batches, loops):
    """Mean next-token loss at `loops` loops (model.forward's r): the mean of the batch means, as train.py's."""
    return sum(model(x, y, r=loops).item() for x, y in batches) / len(batches)


@torch.no_grad()
def adaptive_loss(model, batches, rule):
    """(mean loss, mean loops per token) under an exit rule (engine.adaptive_forward)."""
    losses, loops = [], []
    for x, y in batches:
        logits, spent = adaptive_forward(model, x, rule)
        losses.append(torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()).item())
        loops.append(spent.float().mean().item())
    return sum(losses) / len(losses), sum(loops) / len(loops)


def loops_label(loops):
    """How the run drew its loop counts in training (train.py --loops): "" for a fixed r."""
    if loops.kind == "fixed":
        return ""
    backward = f", B {loops.r_bwd}" if loops.r_bwd else ""
    if loops.kind == "uniform":
        return f"T uniform {loops.low}-{loops.high}{backward}"
    return f"T Poisson log-normal, mean {loops.mean:g}{backward}"


def describe(run, model):
    cfg = model.cfg
    final = json.loads((run["dir"] / "final.json").read_text())
    return {"run_id": run["run_id"], "run": run["name"], "r": cfg.r, "r_bwd": cfg.r_bwd, "injection": cfg.injection,
            "untied": cfg.untied, "trained_loops": loops_label(run["loops"]), "d_model": cfg.d_model,
            "n_params": final.get("n_params"),
            "val_loss_trained": final["val_loss"], "budget": final.get("flops_budget") or final.get("tokens_target")}


def pick_adaptive(entries, which):
    """The runs adaptive exit is measured on: all, or per architecture (trained r, r_bwd, injection, loop-count
    distribution: arch) the one with the lowest trained loss; never a hyperconnected run (model.adaptive_recurrence
    exits a token's state, which its lanes are not), chosen up front so that a mixed sweep is not refused after
    its fixed curves."""
    exitable = [entry for entry in entries if entry["info"]["injection"] != "hyper"]
    if which == "all":
        return {entry["run"]["run_id"] for entry in exitable}
    best = {}
    for entry in exitable:  # per architecture: trained r, r_bwd, injection and loop-count distribution
        key, loss = arch(entry["info"]), entry["info"]["val_loss_trained"]
        if entry["info"]["r"] > 1 and (key not in best or loss < best[key][0]):
            best[key] = (loss, entry["run"]["run_id"])
    return {run_id for _, run_id in best.values()}


def measure(args):
    """Every run's rows: fixed loop counts, then (on the picked runs) each criterion at each threshold."""
    found, notes = runs.find_runs(args.runs, args.data)
    for note in notes:
        print(f"{PROG}: {note}", file=sys.stderr)
    entries = [{"run": run, "model": runs.load_run_model(run, "cpu")} for run in found]
    for entry in entries:
        entry["info"] = describe(entry["run"], entry["model"])
    adaptive = pick_adaptive(entries, args.adaptive_runs) if args.exit else set()
    rows, batches = [], {}
    for entry in entries:
        run, model, info = entry["run"], entry["model"], entry["info"]
        if run["data_dir"] not in batches:
            batches[run["data_dir"]] = validation_batches(run["data_dir"], args.rows, args.batch)
        data = batches[run["data_dir"]]
        for loops in args.loops:
            rows.append({**info, "mode": "fixed", "loops": loops, "mean_loops": loops,
                         "val_loss": fixed_loss(model, data, loops), "rows": args.rows})
        for criterion in args.exit if run["run_id"] in adaptive else []:
            for threshold in args.thresholds:
                rule = ExitRule(criterion, threshold, 1, args.max_loops or model.cfg.r)
                loss, spent = adaptive_loss(model, data, rule)
                rows.append({**info, "mode": criterion, "threshold": threshold, "max_loops": rule.max_loops,
                             "mean_loops": spent, "val_loss": loss, "rows": args.rows})
        print(f"{PROG}: {info['run']} (r = {info['r']}, r_bwd = {info['r_bwd']}): "
              + ", ".join(f"{row['mean_loops']:.2f} loops {row['val_loss']:.4f}"
                          for row in rows if row["run_id"] == info["run_id"]))
    return rows


R_COLORS = {1: "black", 2: "tab:blue", 4: "tab:orange", 8: "tab:green", 16: "tab:red"}


def arch(row):
    untied = ", untied" if row["untied"] else ""
    sampled = f", {row['trained_loops']}" if row.get("trained_loops") else ""  # not "loops": the test-time count
    return f"r={row['r']} bwd={row['r_bwd']} {row['injection']}{untied}{sampled}"


def plot(rows, path):
    """loops.png: the test-time curve per architecture (relative to each run's trained-r loss) and adaptive exit's
    loss against mean loops beside the fixed curve of the same run."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    fixed = [row for row in rows if row["mode"] == "fixed"]
    trained = {row["run_id"]: row["val_loss_trained"] for row in fixed}  # each run's loss at its trained r:
    for row in fixed:  # measured here on the same rows when the loop list has it, else its final row's
        if row["loops"] == row["r"]:
            trained[row["run_id"]] = row["val_loss"]
    trained_r = {arch(row): row["r"] for row in fixed}
    for name in sorted(trained_r, key=lambda name: (trained_r[name], name)):
        mine = [row for row in fixed if arch(row) == name]
        at = {}
        for row in mine:
            at.setdefault(row["loops"], []).append(row["val_loss"] - trained[row["run_id"]])
        xs = sorted(at)
        first = mine[0]
        style = {"hyper": ":", "none": "-."}.get(first["injection"], "--" if first["r_bwd"] < first["r"] else "-")
        marker = "s" if first.get("trained_loops") else "o"  # squares: trained at sampled loop counts
        left.plot(xs, [sum(at[x]) / len(at[x]) for x in xs], marker=marker, ms=3, ls=style,
                  color=R_COLORS.get(first["r"], "grey"), label=f"{name} ({len(mine) // len(xs)})")
    # symlog: the plain r = 1 stack looped is off by nats, a trained loop count's neighbours by millinats
    left.set(xscale="log", xlabel="test-time loops", ylabel="loss - loss at the trained r (nats)",
             title="test-time loops (colour: r; -- truncated, : hyper, -. plain; squares: sampled T)")
    left.set_yscale("symlog", linthresh=0.02)
    left.set_xticks(sorted({row["loops"] for row in fixed}), [str(x) for x in sorted({row["loops"] for row in fixed})])
    left.legend(fontsize=6, loc="lower right")
    for run_id in sorted({row["run_id"] for row in rows if row["mode"] != "fixed"}):
        mine = [row for row in rows if row["run_id"] == run_id]
        base = sorted((row for row in mine if row["mode"] == "fixed" and 2 <= row["loops"] <= row["r"]),
                      key=lambda row: row["loops"])  # from 2: a token exits after its second loop at the earliest
        line = right.plot([row["loops"] for row in base], [row["val_loss"] for row in base], marker="o", ms=3,
                          label=f"{mine[0]['run']} ({arch(mine[0])}): fixed")[0]
        for criterion, marker in zip(EXIT_CRITERIA, ("s", "^")):
            points = sorted((row for row in mine if row["mode"] == criterion), key=lambda row: row["mean_loops"])
            if points:
                right.plot([row["mean_loops"] for row in points], [row["val_loss"] for row in points], ls="--",
                           marker=marker, ms=4, color=line.get_color(), label=f"  adaptive, {criterion}")
    right.set(xlabel="mean loops per token", ylabel="validation loss (nats)", title="adaptive exit against fixed loops")
    right.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def earlier_rows(path):
    """--add-rows: the rows of an earlier loops.jsonl (read before anything is measured: a bad path is one line)."""
    if path is None:
        return []
    if not Path(path).is_file():
        raise DataError(f"--add-rows {path}: no such file")
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def main(argv=None):
    args = parse_args(argv)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        earlier = earlier_rows(args.add_rows)
        rows = measure(args)
    except (DataError, ValueError) as e:
        fail(PROG, str(e))
    measured = {row["run_id"] for row in rows}  # a run measured again here replaces its earlier rows
    rows = [row for row in earlier if row["run_id"] not in measured] + rows
    (out / "loops.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    plot(rows, out / "loops.png")
    print(f"{PROG}: {len(rows)} rows -> {out / 'loops.jsonl'}, {out / 'loops.png'}")


if __name__ == "__main__":
    main()
