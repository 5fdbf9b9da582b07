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
(c) fit/ablation.png: per looped r, variant minus base at each budget's best width, over a band of what a retrain
    alone moves (the retrained runs of (a)).
"""
import argparse
import json
import math
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

from diagnose_report import load as read_rows  # dev/'s one JSONL reader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import flops  # noqa: E402
from nanoloop.common import DataError, fail, one_line_errors, positive_int  # noqa: E402
from nanoloop.laws import ci_bounds_reached, estimate_text, is_untied  # noqa: E402 (the one way a CI is printed)
from nanoloop.loops import check_loops_fit, loop_counts_from_args  # noqa: E402
from nanoloop.sweep_state import duration, parse_flags  # noqa: E402
from nanoloop.verdict import (cell_of, compare, design_effect, expected_half_width, losses_by_replicate,  # noqa: E402
                              verdict_line)

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "dev" / "results"
BASE, EVAL = RESULTS / "cpu-micro", RESULTS / "cpu-micro-eval"  # the base's layout anchor: BASE-layout
# dev/ablate.sh's marker: in OUT from its start until its report is written, so a failed or stopped ablation
# never looks like a result (the report refuses it; a rerun of the same command finishes it)
INCOMPLETE = "INCOMPLETE"
# dev/ablate.sh --seeds K: replicate i >= 1 of the variant in OUT-seed<i>, of the base in BASE-seed<i> (trained
# once, committed, reused by every later ablation with as many seeds); BASE-layout is the base's layout anchor
NOISE = RESULTS / "cpu-micro-noise"  # dev/noise.sh: the seed sd of the base recipe at the quick cells
QUICK_CELLS, FULL_CELLS = {4: 7}, {2: 14, 4: 14, 8: 14}  # looped cells per r of --quick and of the full arm


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


def replicate_spread(found):
    """{r: [|delta val loss|]} of the base against itself at another seed, from its replicates (the rows of each):
    each replicate i >= 1 against replicate 0 at every looped cell both have. On a recipe whose retrain is
    bit-identical (the quiet one) this, not a retrain, is what a change that does nothing moves a cell."""
    if len(found) < 2:
        return {}
    first = {cell_of(row): float(row["val_loss"]) for row in found[0]}
    spread = {}
    for rows in found[1:]:
        for row in rows:
            cell = cell_of(row)
            if cell[1] > 1 and cell in first:
                spread.setdefault(cell[1], []).append(abs(float(row["val_loss"]) - first[cell]))
    return spread


def spread_lines(retrain, seeds, reseeded):
    lines = ["| nothing changed | r | runs | median |Δ| | max |Δ| |", "|---|---|---|---|---|"]
    for label, spread in (("retrained here (same run_id)", retrain), ("seed 1 vs seed 0 (5e12)", seeds),
                          ("the base at seed i vs seed 0 (its replicates)", reseeded)):
        for r, values in sorted(spread.items()):
            lines.append(f"| {label} | {r} | {len(values)} | {statistics.median(values):.3f} | {max(values):.3f} |")
    if not retrain and not seeds:
        lines.append("| (dev/results/cpu-micro-eval has no retrained or seed rows) | | | | |")
    return lines


def delta_phi_line(label, path):
    """One line of (b): phi of each arm with its CI and delta-phi with its CI, from a fit_laws.py --json file. A CI
    that runs to the fitter's search box is printed as not identified, and so is a delta-phi of such an arm."""
    if not path.exists():
        return f"| {label} | not fitted ({path} is missing) | | |"
    out = json.loads(path.read_text())
    arms = []
    for fit in (out, out["compare"]):
        ci = fit["joint"].get("phi_ci")  # none with --bootstrap 0 (the --quick preset): a point estimate
        arms.append(estimate_text(fit["joint"]["phi"], ci, ci_bounds_reached("phi", ci)))
    reached = ci_bounds_reached("phi", out["joint"].get("phi_ci"), out["compare"]["joint"].get("phi_ci"))
    delta = out["delta_phi"]
    delta_text = estimate_text(delta["delta_phi"], delta.get("delta_phi_ci"), reached, "+.2f", "an arm's φ CI")
    return f"| {label} | {arms[0]} | {arms[1]} | {delta_text} |"


def budget_text(budget):
    """A budget as the grid writes it: 1.1e12, 5e11."""
    return f"{budget:.2g}".replace("e+", "e")


def best_width_deltas(base, variant, r):
    """[(budget, variant's best-width loss - base's)] of loop count r, over the budgets both arms have."""
    points = []
    for (budget, rr), cell in sorted(variant.items()):
        if rr == r and base.get((budget, r)):
            points.append((budget, min(cell.values()) - min(base[budget, r].values())))
    return points


def plot_differences(base, variant, name, noise, path, differences, verdicts):
    """fit/ablation.png: a panel per looped r, every paired cell's difference (variant - base, the mean over its
    seeds, a bar of +-1 seed sd where it has two or more; widths side by side at each budget), the best-width
    difference per budget and the verdict (its mean and 95% CI, blue), over a grey band of what nothing changed
    moves a run of that r (noise: (label, {r: [|delta|]}), the median and the largest). A point inside the band is
    not a signal; the verdict's interval says what is."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter
    rs = sorted({r for _, r in variant})
    budgets = sorted({budget for budget, _ in variant})
    fig, axes = plt.subplots(1, len(rs), figsize=(3.3 * len(rs) + 1.2, 4.2), sharey=True, squeeze=False)
    for ax, r in zip(axes[0], rs):
        draw_noise_band(ax, noise, r)
        ax.axhline(0, color="black", lw=0.8)
        v = verdicts.get(f"r = {r}")
        if v and math.isfinite(v["half_width"]):
            ax.axhspan(*v["ci"], color="tab:blue", alpha=0.3, lw=0, label=f"verdict: {v['word']} (95% CI)")
            ax.axhline(v["mean"], color="tab:blue", lw=1, ls="--")
        draw_cells(ax, {cell: values for cell, values in differences.items() if cell[1] == r})
        points = best_width_deltas(base, variant, r)
        ax.plot([budget for budget, _ in points], [delta for _, delta in points], "o-", color="tab:blue",
                label="each budget's best width")
        ax.set_xscale("log")
        # the grid's budgets as the ticks, and no minor labels (log axes label 2e12, 3e12, ... on their own)
        ax.set_xticks(budgets, [budget_text(budget) for budget in budgets])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlim(budgets[0] / 1.4, budgets[-1] * 1.4)
        ax.set_title(f"r = {r}", fontsize=10)
        ax.set_xlabel("budget C (FLOPs)")
        ax.legend(fontsize=6.5, loc="best")
    axes[0][0].set_ylabel(f"Δ val loss, {name} − base (nats/token)", fontsize=9)
    fig.suptitle(f"{name} − base:\nevery cell (its seeds), the best widths, the verdict", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def draw_noise_band(ax, noise, r):
    """The grey band of noise = (label, {r: [|delta|]}) at r: the largest |delta| wide and light, the median over it."""
    label, spread = noise
    values = spread.get(r)
    if not values:
        return
    for level, shade, what in ((max(values), 0.15, "max"), (statistics.median(values), 0.3, "median")):
        ax.axhspan(-level, level, color="grey", alpha=shade, lw=0, label=f"{label}: |Δ| {what} {level:.3f}")


def draw_cells(ax, differences):
    """Every cell of one r: the mean difference over its seeds at its budget (shifted by width, narrowest left)
    with a bar of +-1 seed sd where it has two or more seeds."""
    widths = sorted({d for _, _, d in differences})
    label = "a cell (± seed sd)"  # in the legend once
    for (budget, _, d), values in sorted(differences.items()):
        shift = 1.06 ** (widths.index(d) - (len(widths) - 1) / 2)
        bar = 0.0
        if len(values) > 1:
            bar = statistics.stdev(values)
        ax.errorbar(budget * shift, statistics.fmean(values), yerr=bar, fmt="s", ms=3, color="tab:orange",
                    alpha=0.7, capsize=2, label=label)
        label = None


def rows_in_cells(rows, variant_rows):
    """The rows at the (budget, r) cells the variant has (a subset sweep's base: --quick)."""
    cells = {(row["flops_budget"], row["r"]) for row in variant_rows}
    return [row for row in rows if (row["flops_budget"], row["r"]) in cells]


def layout_anchored_rows(variant_rows, base):
    """The variant's looped rows with the base's layout-matched r = 1 runs (BASE-layout: cpu-micro-layout for the
    committed base) of the variant's budgets as the anchor."""
    budgets = {row["flops_budget"] for row in variant_rows}
    layout = base.parent / f"{base.name}-layout" / "results.jsonl"
    anchor = [row for row in read_rows(layout) if row["r"] == 1 and row["flops_budget"] in budgets]
    return anchor + [row for row in variant_rows if row["r"] > 1]


def untied_anchored_rows(variant_rows, base_rows):
    """An --untied arm is an anchor, not a variant: nothing in its loops is shared, so the iso-depth law reads it
    at r^phi = 1 (laws.arch_key). Its rows with the base's looped runs at the same (budget, r) cells: the one
    difference between anchor and looped model is then the sharing (same layout, same FLOPs per token)."""
    untied = [row for row in variant_rows if is_untied(row)]
    return rows_in_cells([row for row in base_rows if row["r"] > 1], untied) + untied


# ----------------------------------------------------------------------------------------------
# Before any training (dev/ablate.sh): which of the flags the r = 1 runs take (--r1-flags), and the plan (--plan)

# What sweep.sh sets for each run (its cell, its horizon, its folders): an ablation's flags must not override it.
GRID_DESTS = ("r", "scale", "flops", "tokens", "tokens_per_param", "data", "out", "results", "reuse_from")


def is_option(token):
    """Whether a train.py argument is a flag rather than a value: it starts with "-" and is not a number."""
    if not token.startswith("-"):
        return False
    try:
        float(token)
    except ValueError:
        return True
    return False


def flag_groups(flags):
    """The train.py flags after ablate.sh's --, one list per flag with its values:
    ["--injection", "gated", "--compile"] -> [["--injection", "gated"], ["--compile"]]."""
    groups = []
    for token in flags:
        if groups and not is_option(token):
            groups[-1].append(token)
        else:
            groups.append([token])
    return groups


def asks_for_help(token):
    """Whether argparse reads `token` as train.py's --help (which prints and exits instead of training)."""
    name = token.split("=")[0]
    return name == "-h" or (len(name) > 3 and "--help".startswith(name))


def printed_args(line):
    """(run name, train.py's arguments) of one `sweep.sh --print` line."""
    tokens = line.split()
    args = tokens[tokens.index("train.py") + 1:]
    name = Path(args[args.index("--out") + 1]).name
    return name, args


def model_refusal(parser, name, args):
    """flops.ModelConfig's one-line reason for refusing the model these train.py arguments describe, or None.
    The data's vocabulary and sequence length do not decide whether a loop flag applies: the defaults stand in."""
    parsed = parse_flags(parser, name, args)
    try:
        cfg = flops.config_from_args(parsed, parsed.vocab_size or flops.ModelConfig.vocab_size,
                                     parsed.seq_len or flops.ModelConfig.seq_len)
        check_loops_fit(loop_counts_from_args(parsed), cfg)  # --loops: a loop count per step needs a loop
    except ValueError as e:
        return str(e)
    return None


def check_flags(parser, name, args, flags):
    """DataError unless the ablation's `flags` leave what sweep.sh sets for this run (GRID_DESTS) as it is."""
    ours, theirs = parse_flags(parser, name, args), parse_flags(parser, name, args + flags)
    for dest in GRID_DESTS:
        if getattr(ours, dest) != getattr(theirs, dest):
            option = "--" + dest.replace("_", "-")
            raise DataError(f"{option} is set by the grid for each run (its cell, horizon and folders); an "
                            f"ablation changes how the runs train, not which runs: leave {option} out")


def r1_flags(lines, flags):
    """(the flag groups the grid's r = 1 runs take, the groups left out of them). A flag that the plain r = 1 stack
    refuses (--random-state-init, --r-bwd 2, --untied: loop flags) means nothing there, so it is left out and the
    r = 1 anchors stay the base's own runs. `lines`: the grid's `sweep.sh --print` lines, with or without the
    flags. DataError, before anything trains, for --help, a flag train.py refuses, a flag that sets what the grid
    sets, or flags that a run refuses."""
    from nanoloop.runs import train_parser  # torch and model.py: seconds, so only in the modes that need it
    if any(asks_for_help(token) for token in flags):
        raise DataError("--help among the train.py flags would print train.py's help in every run instead of "
                        "training it: see python train.py --help, and pass only the flags that make the variant")
    parser = train_parser()
    groups = flag_groups(flags)
    runs = [printed_args(line) for line in lines if line.strip()]
    left_out = []
    for name, args in runs:
        check_flags(parser, name, args, flags)
        if parse_flags(parser, name, args).r > 1:
            continue
        for group in groups:
            if group not in left_out and model_refusal(parser, name, args + group):
                left_out.append(group)
    kept = [group for group in groups if group not in left_out]
    for name, args in runs:  # every run must take what it will be given
        given = flags
        if parse_flags(parser, name, args).r == 1:
            given = [token for group in kept for token in group]
        refused = model_refusal(parser, name, args + given)
        if refused:
            raise DataError(f"{' '.join(flags)}: {refused} (run {name})")
    return kept, left_out


def settled(args, run_id):
    """(what train.py will do with this run, where), decided as runs.settle decides it, without writing anything:
    ("done", its folder in OUT), ("reuse", the finished folder of the same run_id it copies), ("resume", the
    checkpoint), ("train", ""), or ("refused", why): a folder that holds another run."""
    from nanoloop.runs import read_final
    out = Path(args.out)
    final = read_final(out / "final.json")
    if final and final.get("run_id") != run_id:
        return "refused", f"{out} holds another run (train.py stops there): delete it"
    if final:
        return "done", str(out)
    for folder in args.reuse_from:
        donor = read_final(Path(folder) / "final.json")
        if donor and donor.get("run_id") == run_id:
            return "reuse", folder
    if (out / "ckpt.pt").is_file():
        return "resume", str(out / "ckpt.pt")
    return "train", ""


def committed_rates(compiled):
    """{(r, d): [achieved FLOP/s]} of the committed cpu-micro rows trained the same way (with --compile or
    eagerly), each run once: the speed --plan prices a run at. Only rows with a run identity (today's scheme)."""
    rates, seen = {}, set()
    for path in sorted(RESULTS.glob("cpu-micro*/results.jsonl")):
        for row in read_rows(path):
            trained_so = (row.get("compile_s") is not None) == compiled
            if "identity" not in row or row["run_id"] in seen or not trained_so or not row.get("tokens_per_s"):
                continue
            seen.add(row["run_id"])
            rates.setdefault((row["r"], row["d_model"]), []).append(row["tokens_per_s"] * row["flops_per_token"])
    return rates


def rate_of(rates, r, d):
    """The median committed FLOP/s of loop count r at width d, else of width d at any r (iso-depth: every r runs
    the same number of layers, so a step costs about the same), else of every row; None without rows."""
    for keys in ([(r, d)], [key for key in rates if key[1] == d], list(rates)):
        values = [rate for key in keys for rate in rates.get(key, [])]
        if values:
            return statistics.median(values)
    return None


def wall_time(seconds, slots):
    """Wall time of runs taking `seconds` on `slots` parallel slots, longest first (as sweep.sh starts them)."""
    loads = [0.0] * slots
    for run in sorted(seconds, reverse=True):
        loads[loads.index(min(loads))] += run
    return max(loads)


def build_data(data_dir):
    """The grid's data in `data_dir`, built as the committed base's rows say theirs was (data_meta.command: a
    minute from the repository's own corpus, the same bytes), so that a plan in a fresh clone can name every
    run's identity. DataError if the build fails."""
    command = shlex.split(read_rows(BASE / "results.jsonl")[0]["data_meta"]["command"])
    if command[:2] != ["python", "prepare_data.py"] or command[-2] != "--out":
        raise DataError(f"--plan needs {data_dir}/meta.json; the base's data command is not prepare_data.py's: "
                        f"build it first")
    command[-1] = str(data_dir)
    print(f"ablate.sh: {data_dir}/meta.json not found; building it as the base was: {' '.join(command)}",
          file=sys.stderr)
    built = subprocess.run([sys.executable, *command[1:]], cwd=REPO, stdout=subprocess.DEVNULL)
    if built.returncode != 0:
        raise DataError(f"building {data_dir} failed (exit {built.returncode}): {' '.join(command)}")


# What train.py will do with each run, in the order a plan lists them, and how the footer counts them.
PLAN_STATES = {"train": "to train", "resume": "to resume", "reuse": "reused", "done": "already in OUT",
               "refused": "refused"}


def plan_table(lines, flags, slots):
    """--plan's lines: every run of the arm (its `sweep.sh --print` line) with the flags the ablation gives it, what
    train.py will do with it (reuse which committed run of the same run_id, or train it) and, for a run to train,
    a time at the committed rows' speed; the totals last. Also the arm's tally for --tally: its runs to train and
    their estimated wall seconds. DataError for bad flags or missing data."""
    from nanoloop.runs import train_parser
    from nanoloop.sweep_state import plan_runs
    kept, left_out = r1_flags(lines, flags)
    runs = [printed_args(line) for line in lines if line.strip()]
    parser = train_parser()
    parsed = [parse_flags(parser, name, args) for name, args in runs]
    data_dir = parsed[0].data
    if not (REPO / data_dir / "meta.json").is_file():
        build_data(data_dir)
    planned = plan_runs([f"{name}|{' '.join(args)}" for name, args in runs], data_dir, devices=("cpu",))
    rates = committed_rates(parsed[0].compile)
    r1_given = " ".join(token for group in kept for token in group) or "(none)"
    table = [f"{'run':<26}{'r':>3}{'d':>5}{'C':>9}{'steps':>7}  {'flags':<28}{'est.':>9}  plan"]
    seconds, states = [], []
    for (name, _), run, plan in zip(runs, parsed, planned):
        state, where = settled(run, plan.run_ids["cpu"])
        states.append(state)
        d = int(64 * run.scale)
        rate = rate_of(rates, run.r, d)
        estimate = ""
        if state in ("train", "resume") and rate:
            seconds.append(plan.flops / rate)
            estimate = duration(seconds[-1])
        given = " ".join(flags)
        if run.r == 1:
            given = r1_given
        steps = round(plan.flops / (plan.flops_per_token * plan.batch_tokens))
        table.append(f"{name:<26}{run.r:>3}{d:>5}{budget_text(run.flops):>9}{steps:>7}  {given:<28}"
                     f"{estimate:>9}  {state} {where}".rstrip())
    to_train = sum(state in ("train", "resume") for state in states)
    refused = [str(run.out) for run, state in zip(parsed, states) if state == "refused"]
    tally = {"to_train": to_train, "seconds": wall_time(seconds, slots) if seconds else 0.0, "refused": refused}
    return table + [""] + plan_footer(states, left_out, seconds, slots, rates, parsed[0].compile), tally


def plan_footer(states, left_out, seconds, slots, rates, compiled):
    """The plan's last lines: the runs by what train.py will do, the flags the r = 1 runs are not given, the time."""
    counts = [f"{states.count(state)} {label}" for state, label in PLAN_STATES.items() if state in states]
    lines = [f"{len(states)} runs: " + ", ".join(counts)]
    if left_out:
        dropped = " ".join(token for group in left_out for token in group)
        lines.append(f"r = 1 runs: not given {dropped}, which means nothing for the plain r = 1 stack "
                     f"(flops.ModelConfig refuses it there): the r = 1 anchors stay the base's own runs")
    if seconds:
        how = "with --compile" if compiled else "eagerly"
        n_rows = sum(len(values) for values in rates.values())
        lines.append(f"time to train: ~{duration(wall_time(seconds, slots))} on {slots} slot(s) (CPU_JOBS), longest "
                     f"first, then the fits and the report. Each run is its F*D (flops.py) at the median achieved "
                     f"FLOP/s of the committed cpu-micro rows trained {how} at its r and width ({n_rows} rows in "
                     f"dev/results/cpu-micro*/results.jsonl, trained on other machines: a guide, not a measurement "
                     f"of this one)")
    return lines


def parse_args(argv=None):
    """(the flags, the train.py flags after --): --r1-flags and --plan take the ablation's flags there, split off
    before argparse sees them, as ablate.sh's own command line has them."""
    argv = sys.argv[1:] if argv is None else argv
    flags = []
    if "--" in argv:
        flags = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    one_line_errors(p, "ablation_report.py")
    p.add_argument("out", help="the variant's OUT folder (results.jsonl, fit/)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--layout-anchored-rows", action="store_true",
                      help="print the variant's looped rows with the layout-matched r = 1 rows, as JSONL, and stop")
    mode.add_argument("--untied-anchored-rows", metavar="RESULTS",
                      help="print the variant's untied rows with RESULTS' looped rows at their cells, as JSONL, and stop")
    mode.add_argument("--same-cells", metavar="RESULTS", help="print RESULTS' rows at the variant's (budget, r) cells")
    mode.add_argument("--r1-flags", action="store_true",
                      help="read the grid's `sweep.sh --print` lines on stdin and print the flags after -- that its "
                           "r = 1 runs take (a loop flag the plain r = 1 stack refuses is left out); check them all")
    mode.add_argument("--plan", action="store_true",
                      help="read the arm's `sweep.sh --print` lines on stdin and print each run, the flags it gets, "
                           "whether train.py will reuse a committed run or train it, and a time estimate")
    mode.add_argument("--power", type=positive_int, metavar="SEEDS",
                      help="print the CI half-width an arm of SEEDS seeds should reach, from dev/noise.sh's seed sd")
    p.add_argument("--quick", action="store_true", help="--power: of ablate.sh --quick's cells")
    p.add_argument("--base", type=Path, default=BASE,
                   help="the base's replicate 0 (BASE-seed<i> the others, BASE-layout its layout anchor; default "
                        "the committed cpu-micro; ablate.sh --quiet: dev/results/cpu-micro-quiet)")
    p.add_argument("--noise-recipe", default="base",
                   help="--power: the dev/noise.sh recipe whose seed sd sets the power (ablate.sh --quiet: "
                        "cosine-avg-lr014)")
    p.add_argument("--slots", type=positive_int, default=2, help="--plan: runs trained at once (ablate.sh's CPU_JOBS)")
    p.add_argument("--check", action="store_true",
                   help="--plan: print nothing; one line and exit 2 if a run's folder holds another run (ablate.sh "
                        "asks this of every arm before it writes anything)")
    p.add_argument("--tally", type=Path, metavar="FILE",
                   help="--plan: append the arm's runs to train and their time to FILE (JSONL); --power: print the "
                        "whole ablation's total from FILE first (ablate.sh --plan: every arm, base and replicates)")
    return p.parse_args(argv), flags


def before_training(args, flags):
    """--r1-flags and --plan: what dev/ablate.sh asks before it trains anything; bad flags are one line, exit 2."""
    lines = sys.stdin.read().splitlines()
    try:
        if args.r1_flags:
            kept, _ = r1_flags(lines, flags)
            print(" ".join(token for group in kept for token in group))
        else:
            table, tally = plan_table(lines, flags, args.slots)
            if args.check and tally["refused"]:
                raise DataError(f"{tally['refused'][0]} holds a run of other flags: {args.out} was trained with "
                                f"other ones than these (its logs/*.log say which); give this ablation another "
                                f"NAME (or OUT), nothing was written")
            if not args.check:
                print("\n".join(table))
            if args.tally:
                with open(args.tally, "a") as f:
                    f.write(json.dumps(tally) + "\n")
    except ValueError as e:  # DataError: a flag, a plan line or the data
        fail("ablate.sh", str(e))


def main():
    args, flags = parse_args()
    out = Path(args.out)
    if args.r1_flags or args.plan:
        before_training(args, flags)
        return
    if args.power:
        if args.tally:
            print(tally_line(args.tally, args.slots))
        try:
            print("\n".join(power_lines(args.power, args.quick, args.noise_recipe, args.base.resolve())))
        except DataError as e:
            fail("ablation_report.py", str(e))
        return
    rows_only = args.layout_anchored_rows or args.same_cells or args.untied_anchored_rows  # ablate.sh's steps
    if (out / INCOMPLETE).is_file() and not rows_only:
        fail("ablation_report.py", f"{out} is not a finished ablation ({out / INCOMPLETE} says how it stopped): "
                                   f"rerun its dev/ablate.sh command, which keeps what is done")
    if not (out / "results.jsonl").is_file():
        fail("ablation_report.py", f"{out / 'results.jsonl'} not found: run dev/ablate.sh first")
    variant_rows = read_rows(out / "results.jsonl")
    if not rows_only:
        report(out, variant_rows, args.base.resolve())
        return
    if args.same_cells:
        rows = rows_in_cells(read_rows(args.same_cells), variant_rows)
    elif args.untied_anchored_rows:
        rows = untied_anchored_rows(variant_rows, read_rows(args.untied_anchored_rows))
    else:
        rows = layout_anchored_rows(variant_rows, args.base.resolve())
    print("".join(json.dumps(row) + "\n" for row in rows), end="")


def replicates(first):
    """[rows of replicate 0, 1, ...]: first's results.jsonl, then FIRST-seed<i>'s for i = 1, 2, ... while it exists
    (dev/ablate.sh --seeds' folders, of an arm and of its base alike)."""
    found = [read_rows(first / "results.jsonl")]
    next_one = first.parent / f"{first.name}-seed1" / "results.jsonl"
    while next_one.is_file():
        found.append(read_rows(next_one))
        next_one = first.parent / f"{first.name}-seed{len(found)}" / "results.jsonl"
    return found


def verdict_section(base_replicates, variant_replicates, name):
    """(lines, {label: verdict}, {cell: [differences]}): the verdict per looped r and pooled over every replicate
    of both arms, in the design they allow (nanoloop/verdict.compare), and each cell's seeds for the figure."""
    verdicts, differences = compare(base_replicates, variant_replicates)
    seeds = max((len(values) for values in differences.values()), default=0)
    design = f"paired by cell and seed over {seeds} seed(s)"
    if any(v and v["design"] == "paired, base control" for v in verdicts.values()):
        base_seeds = max(v["n_base_seeds"] for v in verdicts.values() if v)
        design = (f"paired by cell and seed over {seeds} seed(s), the base's other seeds of its {base_seeds} a "
                  f"control")
    head = (f"verdict: {name} minus base, validation loss (nats/token), {design}: mean and 95% CI (t-interval, "
            f"nanoloop/verdict.py)\n")
    return [head] + [verdict_line(label, v) for label, v in verdicts.items()], verdicts, differences


def delta_phi_of(path):
    """{delta_phi, ci, identified} of a fit_laws.py --compare file; None where it is missing."""
    if not path.exists():
        return None
    out = json.loads(path.read_text())
    reached = ci_bounds_reached("phi", out["joint"].get("phi_ci"), out["compare"]["joint"].get("phi_ci"))
    delta = out["delta_phi"]
    return {"delta_phi": delta["delta_phi"], "ci": delta.get("delta_phi_ci"), "identified": not reached}


def base_seed_sd(recipe):
    """{r: seed sd of a recipe}, pooled over dev/noise.sh's cells at r (the root mean of their variances)."""
    by_cell = {}
    for row in read_rows(NOISE / "results.jsonl"):
        if Path(row["out"]).name.split("_")[3] == recipe:
            by_cell.setdefault((row["flops_budget"], row["r"], row["d_model"]), []).append(row["val_loss"])
    variances = {}
    for (_, r, _), losses in by_cell.items():
        if len(losses) > 1:
            variances.setdefault(r, []).append(statistics.variance(losses))
    return {r: statistics.fmean(values) ** 0.5 for r, values in variances.items()}


def tally_line(path, slots):
    """--power --tally: what the whole ablation costs, summed over the arms --plan tallied into `path`; the arms
    train one after another (ablate.sh trains each arm's sweep to the end before the next), so their times add."""
    arms = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    runs = sum(arm["to_train"] for arm in arms)
    seconds = sum(arm["seconds"] for arm in arms)
    return (f"the whole ablation: {runs} run(s) to train over {len(arms)} arm(s), ~{duration(seconds)} on {slots} "
            f"slot(s), then the fits and the report")


def replicate_seed_sd(base):
    """({r: (seed sd pooled over the base's replicates, design effect)}, replicates): each cell with two or more
    seeds gives its variance over the seeds, weighted by its degrees of freedom; the design effect is how much
    more a seed's mean over the cells of r varies (nanoloop/verdict.design_effect). Measured where a quick arm
    runs, at the seeds the base has (the quiet base: 11), where dev/noise.sh measured one cell per r."""
    if not (base / "results.jsonl").is_file():
        return {}, 0
    found = replicates(base)
    losses = losses_by_replicate(found)
    squares, dfs = {}, {}
    for (_, r, _), by_replicate in losses.items():
        if len(by_replicate) > 1:
            squares[r] = squares.get(r, 0.0) + statistics.variance(by_replicate.values()) * (len(by_replicate) - 1)
            dfs[r] = dfs.get(r, 0) + len(by_replicate) - 1
    noise = {}
    for r in squares:
        inflation = design_effect({cell: by_replicate for cell, by_replicate in losses.items() if cell[1] == r})
        noise[r] = ((squares[r] / dfs[r]) ** 0.5, inflation)
    return noise, len(found)


def power_lines(seeds, quick, recipe, base):
    """--power: the 95% half-width the arm's design should give, per looped r, from the seed sd of the base's own
    replicates where --quick has them (at its cells), else the recipe's in dev/noise.sh (the largest measured r's
    where r itself was not measured); and the seeds a +-0.010 verdict takes."""
    if not (NOISE / "results.jsonl").is_file():
        return [f"power: {NOISE / 'results.jsonl'} not found (bash dev/noise.sh measures the seed noise)"]
    sds, n_replicates = replicate_seed_sd(base) if quick else ({}, 0)
    source = f"the base's {n_replicates} replicates at these cells"
    if not sds:
        sds = {r: (sd, 1.0) for r, sd in base_seed_sd(recipe).items()}
        source = f"dev/noise.sh's {recipe}"
    if not sds:
        raise DataError(f"--noise-recipe {recipe}: dev/noise.sh measured no recipe of that name")
    lines = []
    for r, n_cells in (QUICK_CELLS if quick else FULL_CELLS).items():
        within, inflation = sds.get(r, max(sds.values()))
        sd = within * inflation ** 0.5  # a seed's cells covary: the verdict's variance is inflated as much
        measured = "measured" if r in sds else f"r = {max(sds, key=sds.get)}'s, not measured at r = {r}"
        if inflation > 1:
            measured += f": {within:.3f} within a cell, x{inflation:.2f} in variance as a seed's cells covary"
        # the base trains the replicates it lacks up to the arm's seeds; beyond them, the verdict reads all of its
        width = expected_half_width(sd, n_cells, seeds, max(n_replicates, seeds))
        enough = next((k for k in range(1, 101)
                       if expected_half_width(sd, n_cells, k, max(n_replicates, k)) <= 0.010), None)
        design = f"{n_cells} cells x {seeds} seed(s)"
        if 2 <= seeds < n_replicates:
            design += f" paired, the base's {n_replicates} a control"
        lines.append(f"power at r = {r}: ±{width:.3f} nats (95% CI half-width) from {design}, seed sd {sd:.3f} "
                     f"({measured}; {source}); ±0.010 takes {enough or '> 100'} seeds")
    return lines


def report(out, variant_rows, base_dir):
    """(a), (b) and (c) of a finished ablation on stdout, and fit/ablation.png."""
    name = out.name.removeprefix("cpu-micro-")
    base, variant = by_cell(read_rows(base_dir / "results.jsonl")), by_cell(variant_rows)
    looped = {cell: losses for cell, losses in variant.items() if cell[1] > 1}
    base_replicates = replicates(base_dir)  # read once: the verdict's and the "nothing changed" band's
    lines, verdicts, differences = verdict_section(base_replicates, replicates(out), name)
    print("\n".join(lines))
    print("Δφ against the layout-matched r = 1 (fit_laws.py --compare; 95% CI, block bootstrap):",
          delta_phi_line("", out / "fit" / "compare_layout.json").split(" | ")[-1].rstrip(" |") + "\n")
    summary = {"arm": name, "base": str(base_dir.relative_to(REPO)), "verdicts": verdicts,
               "delta_phi": {"layout-matched": delta_phi_of(out / "fit" / "compare_layout.json"),
                             "plain": delta_phi_of(out / "fit" / "compare.json")}}
    (out / "fit").mkdir(exist_ok=True)
    (out / "fit" / "ablation.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"(a) {name} minus base, validation loss (nats/token); r = 1 is the same run in both arms\n")
    print("\n".join(paired_table(base, looped)))
    retrain, seeds = noise_floor()
    reseeded = replicate_spread(base_replicates)
    print("\nwhat the same comparison gives with nothing changed (|Δ val loss|, nats/token):\n")
    print("\n".join(spread_lines(retrain, seeds, reseeded)))
    print(f"\n(b) delta-phi = phi({name}) - phi(base), 95% CI (fit_laws.py --compare)\n")
    if any(is_untied(row) for row in variant_rows):
        print(f"the {name} arm trains untied loops, which share nothing: an anchor. Its φ is the base's looped runs' "
              "φ against the untied model (untied_anchored_rows), its Δφ what that anchor changes\n")
    print("| anchor | φ base | φ variant | Δφ |\n|---|---|---|---|")
    print(delta_phi_line("layout-matched r = 1", out / "fit" / "compare_layout.json"))
    print(delta_phi_line("plain r = 1", out / "fit" / "compare.json"))
    (out / "fit").mkdir(exist_ok=True)
    noise = ("another seed of the base", reseeded) if reseeded else ("a retrain alone", retrain)
    plot_differences(base, looped, name, noise, out / "fit" / "ablation.png", differences, verdicts)
    print(f"\n(c) wrote {out / 'fit' / 'ablation.png'}")


if __name__ == "__main__":
    main()
