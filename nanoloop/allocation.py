"""
What should I train? The scaling laws' allocation answers (allocate.py prints them).

From the Truncate or Not? law (truncate_law.py; their §5-7, App. D), with the published coefficients or a fit:
  prescribed T   the best backward count B*, chi(T, B*) against chi(T, T), and what truncation saves (Table 5)
  T and B free   the best split of a loop-dependent compute T + 2B: full BPTT iff q > 2p (Lemma D.2)
  fixed size N   the best (T, B) and tokens for a compute C, T* ~ C^0.238 and D* ~ C^0.762, and the compute at
                 which the best full-BPTT setting doubles (their Table 10, in tokens per parameter of (1, 1))
  free size      the settings ranked by chi, their compute-optimal N and D, and the (2, 2) numbers of §6.2
From an iso-depth fit (fit_laws.py's JSON; paper §4.2, App. G.5): the compute-optimal N and D per r (its frontier)
and the non-looped sizes with the same loss and the same FLOPs (laws.equivalence).

Leading compute (their Eq. 4): 6 N_comp D with 6 N_comp = 6 N_once + (2T + 4B) N_rec. At a fixed size the full
count is used instead, as their Table 10 is: flops.py's matmul and attention FLOPs per token, plus the optimiser's
update at the batch of their rule, 64 sqrt(D/D0) sequences (flops.measured_flops).
"""
import math

from scipy.optimize import brentq

import flops
from nanoloop import laws
from nanoloop import truncate_law
from nanoloop.truncate_law import chi, gain_of

# Truncate or Not? Table 2: the five sizes, "name": (d, prelude, recur, coda) at head dim 128, V = 32,064, T = 2,048.
# sweep.sh's truncate-or-not grid trains these (tests/test_allocate.py checks that the two agree).
TABLE_2 = {"60M": (768, 2, 4, 2), "120M": (1024, 2, 5, 2), "240M": (1280, 3, 6, 3), "480M": (1664, 3, 7, 4),
           "1B": (2176, 4, 8, 4)}
# The fifteen trained settings (their §4.1), and the full-BPTT ladder whose switch points their Table 10 gives.
MENU = ((1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 3), (4, 4), (8, 1), (8, 2), (8, 4), (8, 8), (16, 1), (16, 4),
        (16, 8), (16, 16))
FULL_BPTT = ((1, 1), (2, 2), (4, 4), (8, 8), (16, 16))
BATCH_AT_D0 = 64  # the truncate-or-not batch rule, 64 sqrt(D/D0) sequences (recipe.py), unrounded here


def published():
    """Their coefficients (Table 4) with the scales they are normalised by."""
    return truncate_law.PUBLISHED | {"n0": truncate_law.PAPER_N0, "d0": truncate_law.PAPER_D0}


def size_config(name, T=1, B=1):
    """The flops.ModelConfig of a Table 2 size at (T, B) (ValueError for an unknown name)."""
    if name not in TABLE_2:
        raise ValueError(f"unknown size {name!r}: one of {', '.join(TABLE_2)}")
    d, prelude, recur, coda = TABLE_2[name]
    return flops.ModelConfig(r=T, r_bwd=B, scale=d / 64, prelude=prelude, recur=recur, coda=coda)


# ----------------------------------------------------------------------------------------------
# Leading compute: prescribed T, free split, free size (their Lemma D.1-D.2, Corollary D.6)

def compute_optimal(coef, compute, T, B, share):
    """(N*, D*, L*) of setting (T, B) at compute C = 6 N_comp D (their Lemma D.1): the non-looped optimum at budget
    C / chi, x* = [(alpha A / (beta H)) (C_bar / chi)^beta]^(1 / (alpha + beta)), C_bar = C / (6 N0 D0)."""
    budget = compute / (6 * coef["n0"] * coef["d0"]) / float(chi(T, B, share, coef))
    alpha, beta = coef["alpha"], coef["beta"]
    x = ((alpha * coef["A"]) / (beta * coef["H"]) * budget ** beta) ** (1 / (alpha + beta))
    y = budget / x
    loss = coef["E"] + (coef["A"] * x ** -alpha + coef["H"] * y ** -beta) ** coef["kappa"]
    n_eff_per_n = 1 - share + share * float(gain_of(coef, T, B))
    return coef["n0"] * x / n_eff_per_n, coef["d0"] * y, loss


def prescribed_t(coef, T, share, compute=None):
    """Their Table 5 row for T (truncate_law.chi_table), with N*, D*, L* at B* and at B = T for a compute."""
    row = truncate_law.chi_table(coef, share, (T,))[0]
    if compute is not None:
        for key, B in (("star", row["B_star"]), ("full", T)):
            row[f"N_{key}"], row[f"D_{key}"], row[f"L_{key}"] = compute_optimal(coef, compute, T, B, share)
    return row


def best_split(coef, loop_compute):
    """Every (T, B) with T + 2B = S and 1 <= B <= T, by g(T, B) best first (their §5.2: at a fixed size and
    tokens the loss falls as g grows), and the continuous verdict of Lemma D.2: full BPTT iff q > 2p."""
    splits = [(loop_compute - 2 * B, B) for B in range(1, loop_compute // 3 + 1)]
    ranked = sorted(splits, key=lambda tb: -float(gain_of(coef, *tb)))
    return {"S": loop_compute, "ranked": [{"T": T, "B": B, "g": float(gain_of(coef, T, B))} for T, B in ranked],
            "q_minus_2p": coef["q"] - 2 * coef["p"], "full_bptt": coef["q"] > 2 * coef["p"]}


def free_size(coef, share, compute, menu=MENU, best=4):
    """The settings ranked by chi (their §6.2: every setting shares the non-looped compute exponents, so the best is
    the lowest chi at every compute) with the compute-optimal N*, D*, L* of the first `best`; and the (2, 2)
    numbers: N_eff/N, chi, the compute for (1, 1)'s loss, the parameters saved there and at +10% compute."""
    ranked = sorted(menu, key=lambda tb: float(chi(*tb, share, coef)))
    rows = []
    for T, B in ranked:
        row = {"T": T, "B": B, "chi": float(chi(T, B, share, coef)), "g": float(gain_of(coef, T, B))}
        if len(rows) < best:
            row["N"], row["D"], row["L"] = compute_optimal(coef, compute, T, B, share)
        rows.append(row)
    size_exponent = coef["beta"] / (coef["alpha"] + coef["beta"])  # N* ~ C^(beta / (alpha + beta))
    neff = 1 - share + share * float(gain_of(coef, 2, 2))
    two = float(chi(2, 2, share, coef))
    return {"ranked": rows, "N_exponent": size_exponent, "D_exponent": 1 - size_exponent,
            "two_loops": {"neff_per_n": neff, "chi": two, "extra_compute": two - 1, "fewer_params": 1 - 1 / neff,
                          "fewer_params_at_10pct": 1 - (1.1 / two) ** size_exponent / neff}}


# ----------------------------------------------------------------------------------------------
# A fixed size: the full compute model (their App. D.4.3, Table 10)

def tokens_for_compute(cfg, compute, d0):
    """D such that the measured compute F_m D + F_opt D / (seq 64 sqrt(D/D0)) equals C (flops.measured_flops at
    the batch rule's continuous steps): a quadratic in sqrt(D)."""
    terms = flops.flops_breakdown(cfg)
    per_token = terms["matmul"] + terms["attention"]
    per_root_token = flops.optimizer_flops_per_step(cfg) * math.sqrt(d0) / (cfg.seq_len * BATCH_AT_D0)
    root = (-per_root_token + math.sqrt(per_root_token ** 2 + 4 * per_token * compute)) / (2 * per_token)
    return root * root


def fixed_size_loss(coef, cfg, compute):
    """The law's loss of cfg's size and setting at measured compute C (their §7.1)."""
    D = tokens_for_compute(cfg, compute, coef["d0"])
    counts = flops.param_counts(cfg)
    return float(truncate_law.law_loss(coef, counts["n_once"], counts["n_rec"], cfg.r, cfg.r_bwd, D, coef["n0"],
                                       coef["d0"]))


def with_loops(cfg, T, B):
    """cfg's size at another (T, B): the same layout, so the same N."""
    return flops.ModelConfig(**{**flops.config_record(cfg), "r": T, "r_bwd": B})


def switch_point(coef, cfg, a, b):
    """Where setting b overtakes setting a at cfg's size: the compute of equal loss, as tokens per parameter of the
    (1, 1) model at that compute (their Table 10) and in FLOPs; None if b never catches up below 10^30 FLOPs."""
    def gap(log_c):
        compute = math.exp(log_c)
        return fixed_size_loss(coef, with_loops(cfg, *a), compute) - fixed_size_loss(coef, with_loops(cfg, *b), compute)
    low, high = math.log(1e12), math.log(1e30)
    if gap(low) * gap(high) > 0:
        return None
    compute = math.exp(brentq(gap, low, high, xtol=1e-12))
    plain = with_loops(cfg, 1, 1)
    tokens = tokens_for_compute(plain, compute, coef["d0"])
    return {"from": a, "to": b, "compute": compute, "tokens_per_param": tokens / flops.param_counts(plain)["n_params"]}


def switch_table(coef, sizes=tuple(TABLE_2), ladder=FULL_BPTT):
    """Their Table 10: for each size, the switch points along the full-BPTT ladder (1,1) -> (2,2) -> ... -> (16,16)."""
    return {name: [switch_point(coef, size_config(name), a, b) for a, b in zip(ladder, ladder[1:])] for name in sizes}


def fixed_size(coef, cfg, compute, menu=MENU):
    """At cfg's size and measured compute C: every setting's loss and tokens, best first, and the asymptotic
    exponents of the full-BPTT optimum, T* ~ C^(beta / (beta + p + q)), D* ~ C^(1 - that) (their Eq. 9)."""
    rows = []
    for T, B in menu:
        looped = with_loops(cfg, T, B)
        tokens = tokens_for_compute(looped, compute, coef["d0"])
        if math.sqrt(tokens * coef["d0"]) < cfg.seq_len * BATCH_AT_D0:  # steps = sqrt(D D0) / (seq 64) < 1
            raise ValueError(f"--compute {compute:.3g} buys ({T},{B}) {tokens:.3g} tokens, less than one step of the "
                             f"batch rule at this size: raise it")
        rows.append({"T": T, "B": B, "L": fixed_size_loss(coef, looped, compute), "D": tokens})
    rows.sort(key=lambda row: row["L"])
    loop_exponent = coef["beta"] / (coef["beta"] + coef["p"] + coef["q"])
    return {"ranked": rows, "T_exponent": loop_exponent, "D_exponent": 1 - loop_exponent,
            "n_params": flops.param_counts(cfg)["n_params"]}


# ----------------------------------------------------------------------------------------------
# The iso-depth law: its frontier per r and the equivalence (paper §4.2, App. G.5)

def iso_depth_frontier(fit, compute, layout=None, rs=(1, 2, 4, 8), max_scale=64):
    """N*, D*, L*, the width s* and whether it sits at the width family's edge, for each r at compute C under an
    iso-depth joint fit (its phi, E, A, alpha, B, beta): laws.frontier_point along flops.py's width family (widths up
    to max_scale) of the paper's layout, or of `layout` (ModelConfig fields: head_dim, vocab_size, seq_len, ...)."""
    out = []
    for r in rs:
        cfg = flops.ModelConfig(r=r, scale=max_scale / 8, **(layout or {}))
        family = laws.width_family(flops.summary(cfg), max_scale)
        if family is None:
            raise ValueError(f"no width family for r = {r} in this layout (head dim {cfg.head_dim})")
        out.append({"r": r, **laws.frontier_point(fit, family, compute, r, joint=True)})
    plain = out[0]["L_star"]
    for point in out:
        point["gap_to_r1"] = point["L_star"] - plain
    return out
