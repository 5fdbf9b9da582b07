"""
What should I train? The allocation answers of Truncate or Not?'s law (their §5-7, App. D) and of an iso-depth fit
(paper §4.2, App. G.5), as short tables (--json for a program). allocation.py holds the mathematics.

    python allocate.py                                  # the overview from their published coefficients
    python allocate.py --prescribed-t 8 --compute 1e21  # T fixed: the best B, what truncation saves (Table 5)
    python allocate.py --loop-compute 12                # T + 2B fixed: the best split, q vs 2p (Lemma D.2)
    python allocate.py --fixed-size 240M --compute 1e20 # memory fixes N: the best (T, B) and tokens (§7.1)
    python allocate.py --switch-points                  # their Table 10 for the five sizes of Table 2
    python allocate.py --free-size --compute 1e21       # N free: the ranking by chi, the (2, 2) numbers (§6.2)
    python allocate.py --iso-depth dev/results/cpu-micro/fit/fit.json --compute 5e12 --layout-of cpu-micro
    python allocate.py --coefficients fit.json ...      # a fit_laws.py --law truncate-or-not --json of yours

Sizes are Table 2's names (60M ... 1B) or d:prelude/recur/coda (e.g. 1024:2/5/2, head dim 128, V = 32,064,
T = 2,048). Bad input is one line and exit 2.
"""
import argparse
import json
import sys
from pathlib import Path

from nanoloop import allocation
import flops
from nanoloop import laws
from nanoloop.common import fail, one_line_errors, positive_float, positive_int

PROG = "allocate.py"
# The layouts an iso-depth fit's width family is drawn in: the paper's, or the CPU grids' (sweep.sh's flags).
ISO_DEPTH_LAYOUTS = {"paper": {}, "cpu-micro": {"head_dim": 8, "vocab_size": 2048, "seq_len": 128}}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    one_line_errors(parser, PROG)
    ask = parser.add_argument_group("the question (none: the overview)")
    ask.add_argument("--prescribed-t", type=positive_int, metavar="T", help="forward loops fixed: the best B")
    ask.add_argument("--loop-compute", type=positive_int, metavar="S", help="T + 2B fixed: the best split")
    ask.add_argument("--fixed-size", metavar="SIZE", help="a Table 2 name or d:prelude/recur/coda")
    ask.add_argument("--switch-points", action="store_true", help="Table 10: where the best full-BPTT T doubles")
    ask.add_argument("--free-size", action="store_true", help="size and tokens free: the settings by chi")
    ask.add_argument("--iso-depth", metavar="FIT", help="an iso-depth fit_laws.py --json: its frontier per r")
    given = parser.add_argument_group("what is given")
    given.add_argument("--compute", type=positive_float, metavar="C", help="training FLOPs")
    given.add_argument("--setting", metavar="T,B", help="--fixed-size: also this setting's loss and tokens")
    given.add_argument("--sizes", default=",".join(allocation.TABLE_2), help="--switch-points: sizes (Table 2 names)")
    given.add_argument("--share", type=float, default=0.507,
                       help="N_rec / N for the leading-compute answers (their 240M model's, as Table 5)")
    given.add_argument("--coefficients", metavar="FIT", help="truncate-or-not coefficients: a fit_laws.py --law "
                                                             "truncate-or-not --json (default: their Table 4)")
    given.add_argument("--layout-of", choices=tuple(ISO_DEPTH_LAYOUTS), default="paper",
                       help="--iso-depth: the layout the fit's runs had")
    given.add_argument("--equiv", nargs=2, type=positive_float, metavar=("R", "S"),
                       help="--iso-depth: also the non-looped sizes a looped (r = R, s = S) model equals (App. G.5)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    args = parser.parse_args(argv)
    if not 0 < args.share < 1:
        parser.error(f"--share is N_rec / N, in (0, 1), got {args.share}")
    needs_compute = args.fixed_size or args.free_size or args.iso_depth
    if needs_compute and args.compute is None:
        parser.error("--fixed-size, --free-size and --iso-depth need --compute C (training FLOPs)")
    return args


# ----------------------------------------------------------------------------------------------
# Inputs: the coefficients, a size, a setting

def truncate_coefficients(path):
    """Their published coefficients, or the bounded fit of a fit_laws.py --law truncate-or-not --json."""
    if not path:
        return allocation.published(), "published (their Table 4)"
    try:
        saved = json.loads(Path(path).read_text())
        fit = saved["fits"]["bounded"]
        coef = {k: float(fit[k]) for k in ("E", "A", "H", "alpha", "beta", "kappa", "c", "p", "q")}
        return coef | {"n0": float(saved["n0"]), "d0": float(saved["d0"])}, f"fitted ({path})"
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--coefficients {path}: not a fit_laws.py --law truncate-or-not --json ({e})") from None


def size_of(text, T=1, B=1):
    """A Table 2 name or "d:prelude/recur/coda" as a ModelConfig at (T, B); ValueError naming what is wrong."""
    if text in allocation.TABLE_2:
        return allocation.size_config(text, T, B)
    try:
        width, layout = text.split(":")
        prelude, recur, coda = (int(v) for v in layout.split("/"))
        return flops.ModelConfig(r=T, r_bwd=B, scale=int(width) / 64, prelude=prelude, recur=recur, coda=coda)
    except ValueError as e:
        raise ValueError(f"--fixed-size {text!r}: not a Table 2 size ({', '.join(allocation.TABLE_2)}) nor a "
                         f"buildable d:prelude/recur/coda ({e})") from None


def setting_of(text):
    try:
        T, B = (int(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"--setting {text!r}: expected T,B such as 8,2") from None
    if not 1 <= B <= T:
        raise ValueError(f"--setting {text}: needs 1 <= B <= T (B trained loops of T)")
    return T, B


# ----------------------------------------------------------------------------------------------
# The answers, each a dict and a few printed lines

def answer_prescribed(coef, T, share, compute, say):
    row = allocation.prescribed_t(coef, T, share, compute)
    say(f"T = {T} prescribed (N_rec/N = {share}): B* = {row['B_star']}, chi(T,B*) = {row['chi_star']:.3f} against "
        f"chi(T,T) = {row['chi_full']:.3f}: truncation to B* needs {row['saving']:.0%} less compute for the same "
        f"loss (N* x{row['N_star_ratio']:.2f}, D* x{row['D_star_ratio']:.2f} of full BPTT's)")
    if compute is not None:
        say(f"  at C = {compute:.3g}: ({T},{row['B_star']}) N* {row['N_star']:.4g}, D* {row['D_star']:.4g}, "
            f"L* {row['L_star']:.4f};  ({T},{T}) N* {row['N_full']:.4g}, D* {row['D_full']:.4g}, L* {row['L_full']:.4f}")
    return row


def answer_split(coef, loop_compute, say):
    split = allocation.best_split(coef, loop_compute)
    ranked = "  ".join(f"({r['T']},{r['B']}) g {r['g']:.3f}" for r in split["ranked"])
    verdict = "full BPTT" if split["full_bptt"] else "truncation"
    say(f"T + 2B = {loop_compute} per token (the loop-dependent compute): {ranked}\n  q - 2p = "
        f"{split['q_minus_2p']:+.3f}: with both counts free and continuous, {verdict} is best (Lemma D.2)")
    return split


def answer_fixed(coef, cfg, compute, setting, say):
    out = allocation.fixed_size(coef, cfg, compute)
    say(f"Fixed size N = {out['n_params']:,} at C = {compute:.3g} FLOPs (measured: matmuls + optimiser), best first:")
    for row in out["ranked"][:5]:
        say(f"  ({row['T']},{row['B']})  L {row['L']:.4f}  D {row['D']:.4g} tokens ({row['D'] / out['n_params']:.1f} "
            f"per parameter)")
    say(f"  asymptotically T* ~ C^{out['T_exponent']:.3f}, D* ~ C^{out['D_exponent']:.3f} (their Eq. 9)")
    if setting:
        looped = allocation.with_loops(cfg, *setting)
        out["setting"] = {"T": setting[0], "B": setting[1], "L": allocation.fixed_size_loss(coef, looped, compute),
                          "D": allocation.tokens_for_compute(looped, compute, coef["d0"])}
        say(f"  ({setting[0]},{setting[1]}): L {out['setting']['L']:.4f}, D {out['setting']['D']:.4g}")
    return out


def answer_switch(coef, sizes, say):
    table = allocation.switch_table(coef, sizes)
    say("Where the best full-BPTT setting changes at a fixed size, in tokens per parameter of (1,1) at that compute "
        "(their Table 10)\n  " + f"{'':<18}" + "".join(f"{name:>11}" for name in table))
    for k, (a, b) in enumerate(zip(allocation.FULL_BPTT, allocation.FULL_BPTT[1:])):
        cells = [table[name][k] for name in table]
        say(f"  {str(a) + ' -> ' + str(b):<18}" + "".join(f"{c['tokens_per_param']:>11,.0f}" if c else f"{'-':>11}"
                                                          for c in cells))
    return table


def answer_free(coef, share, compute, say):
    out = allocation.free_size(coef, share, compute)
    say(f"Size and tokens free at C = {compute:.3g} (N_rec/N = {share}): settings by chi, best first; every one has "
        f"N* ~ C^{out['N_exponent']:.3f}, D* ~ C^{out['D_exponent']:.3f}")
    for row in out["ranked"][:4]:
        say(f"  ({row['T']},{row['B']})  chi {row['chi']:.3f}  N* {row['N']:.4g}  D* {row['D']:.4g}  L* {row['L']:.4f}")
    two = out["two_loops"]
    say(f"  (2,2): N_eff/N {two['neff_per_n']:.3f}, chi {two['chi']:.3f}: (1,1)'s loss at {two['extra_compute']:+.1%} "
        f"compute with {two['fewer_params']:.1%} fewer parameters; at +10% compute {two['fewer_params_at_10pct']:.1%} "
        f"fewer (§6.2)")
    return out


def answer_iso_depth(path, compute, layout_name, equiv, say):
    try:
        saved = json.loads(Path(path).read_text())
        fit = {k: float(saved["joint"][k]) for k in ("phi", "E", "A", "alpha", "B", "beta")}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--iso-depth {path}: not a fit_laws.py --json with a joint fit ({e})") from None
    layout = ISO_DEPTH_LAYOUTS[layout_name]
    max_scale = 64 if layout_name == "paper" else 2
    points = allocation.iso_depth_frontier(fit, compute, layout, max_scale=max_scale)
    say(f"Iso-depth law of {path} (phi {fit['phi']:.3f}) at C = {compute:.3g}: the compute-optimal model per r")
    for pt in points:
        edge = "  (at the edge of the widths)" if pt["at_edge"] else ""
        say(f"  r = {pt['r']}  N* {pt['N_star']:.4g}  s* {pt['scale_star']:.3g}  D* {pt['D_star']:.4g}  L* "
            f"{pt['L_star']:.4f}  gap to r = 1 {pt['gap_to_r1']:+.4f}{edge}")
    out = {"fit": fit, "points": points}
    if equiv:
        eq = laws.equivalence(int(equiv[0]), equiv[1], fit["phi"], layout)
        say(f"  equivalence: r = {eq['r']}, s = {eq['scale']:g}: N {eq['N']:.4g} (N_eff {eq['n_eff']:.4g}) reaches "
            f"the loss of a non-looped N = {eq['same_loss']['N']:.4g} and costs the FLOPs of a non-looped N = "
            f"{eq['same_flops']['N']:.4g}")
        out["equivalence"] = eq
    return out


def main(argv=None):
    args = parse_args(argv)
    lines, out = [], {}
    say = lines.append
    try:
        coef, source = truncate_coefficients(args.coefficients)
        setting = setting_of(args.setting) if args.setting else None
        cfg = size_of(args.fixed_size) if args.fixed_size else None
        sizes = [s for s in args.sizes.split(",") if s]
        for name in sizes:
            allocation.size_config(name)
        overview = not any((args.prescribed_t, args.loop_compute, args.fixed_size, args.switch_points, args.free_size,
                            args.iso_depth))
        if not args.iso_depth or overview:
            say(f"Truncate or Not? law, {source} coefficients: c {coef['c']:.3f}, p {coef['p']:.3f}, q {coef['q']:.3f}")
        if args.prescribed_t or overview:
            out["prescribed"] = [answer_prescribed(coef, T, args.share, args.compute, say)
                                 for T in ([args.prescribed_t] if args.prescribed_t else (2, 4, 8, 16))]
        if args.loop_compute or overview:
            out["split"] = answer_split(coef, args.loop_compute or 12, say)
        if args.fixed_size:
            out["fixed_size"] = answer_fixed(coef, cfg, args.compute, setting, say)
        if args.switch_points or overview:
            out["switch_points"] = answer_switch(coef, sizes, say)
        if args.free_size or overview:
            out["free_size"] = answer_free(coef, args.share, args.compute or 1e21, say)
        if args.iso_depth:
            out["iso_depth"] = answer_iso_depth(args.iso_depth, args.compute, args.layout_of, args.equiv, say)
    except ValueError as e:
        fail(PROG, str(e))
    if args.json:
        print(json.dumps(out, default=float))
        return
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
