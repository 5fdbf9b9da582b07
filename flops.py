"""
Parameter counts and training FLOPs for the iso-depth looped transformer: the one source of truth.

Every number the scaling-law fit sees (N, N_once, N_rec, tokens D for a compute budget C) comes
from here, and model.py builds its layout from the same `ModelConfig`, so the accounting and the
instantiated network cannot drift apart (tests check both against each other and against
torch's FlopCounterMode). Pure Python, no torch: fit_laws.py, laws.py and the sweep import it too.

    python flops.py --r 4 --scale 10                      # readable table
    python flops.py --r 4 --scale 10 --flops 1e18 --json  # one JSON object for scripts
    ./sweep.sh --grid paper --plan                        # pipes "name|train.py flags" lines into
    python flops.py --plan --data DIR [--results F]       #   this (sweep_state.price_plan): table, total, time, data

Conventions (paper §3.1; truncate-or-not App. D.1 for truncated loops):
  n_b  = 12 d^2 + 2d per block (4 attention + 2 MLP matrices, two block norms; the paper's n_b drops the 2d)
  N    = N_once + N_rec, embeddings excluded, the three model-level norms (3d) included
  F    = 6 (P_prelude + P_coda + P_lm_head) + (2f + 6k)(P_recur + P_inj)
         + 12 (l_p + l_c) d T + (4f + 12k) l_recur d T          per token, f = r - k
F is the 6N convention (2 FLOPs per parameter and token forward, 4 backward) over every loop that runs, plus
what §3.1 adds to it: the unembedding matmul (6 d V) and attention's parameter-free QK^T and AV matmuls (12 d T
per layer trained, not halved for causality). The same F prices a budget (tokens_for_budget) and an MFU.
"""
import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from nanoloop.common import count, fail, finite_float, one_line_errors, positive_float, positive_int

# The injection modes (paper §3.1, §5.2): what model.py builds, what flops.py counts, what the tests cover.
INJECTIONS = ("linear", "additive", "passthrough", "hyper", "gated")
UNTIED_INJECTIONS = ("linear", "additive", "passthrough")  # --untied copies W_inj, if any; hyper and gated: not built

BATCH_TOKENS = 2 ** 18  # the iso-depth batch (§4.1): 128 sequences of 2,048 tokens, B_0 of the LR rule

# Dense bf16 tensor-core peak FLOP/s per GPU (datasheet numbers, no sparsity), for MFU.
PEAK_BF16_FLOPS = {
    "A100": 312e12,
    "H100": 989e12,  # SXM; the PCIe card is 756e12
    "H100 PCIE": 756e12,
    "H200": 989e12,
}


@dataclass
class ModelConfig:
    """Everything that fixes the shape of a looped model. model.py builds exactly this. The paper's layout (§3.1)
    is the default: depth 20 = 2 + r x 16/r + 2, d = 64 s, head dim 128. r = 1 without --recur is the plain stack
    of `depth` layers; --r 1 --recur 16 is the looped layout run once (the CPU study's layout-matched r = 1)."""
    r: int = 4                      # recurrences of the shared block (train time)
    scale: float = 10               # width d = 64 * scale (fractions such as 0.5 for CPU-scale grids)
    r_bwd: int = 0                  # loops that get gradient (truncated BPTT); 0 means r
    injection: str = "linear"       # one of INJECTIONS (model.py's GPT.inject); "none" for the plain r = 1 stack
    hc_lanes: int = 2               # K, hyperconnection lanes
    depth: int = 20                 # effective depth l_p + r * l_recur + l_c
    prelude: int = 2                # l_p unshared layers before the loop (App. G.4 also runs 1 and 4)
    coda: int = 2                   # l_c unshared layers after it
    recur: int = 0                  # layers in the shared block; 0 means (depth - prelude - coda) / r
    head_dim: int = 128             # the paper's; the CPU grids' widths need smaller heads
    vocab_size: int = 32064         # the paper's V padded (32,001 ids, §4.1); train.py takes meta.json's
    seq_len: int = 2048             # T: attention's FLOPs grow with it
    random_state_init: bool = False  # Huginn-style s_0 ~ N(0, 1) ablation (App. C.2)
    untied: bool = False            # Truncate or Not? App. E.2: every loop its own block, W_inj and loop norm

    def __post_init__(self):
        """Resolve defaults and reject impossible layouts with a one-line reason (ValueError)."""
        if self.r < 1:
            raise ValueError(f"--r must be >= 1, got {self.r}")
        if self.head_dim < 1 or self.seq_len < 1:
            raise ValueError(f"--head-dim and --seq-len must be >= 1, got {self.head_dim} and {self.seq_len}")
        if not (self.scale > 0 and float(64 * self.scale).is_integer()):
            raise ValueError(f"--scale must be positive with 64*scale a whole width, got {self.scale}")
        if float(self.scale).is_integer():
            self.scale = int(self.scale)
        if self.r_bwd == 0:
            self.r_bwd = self.r
        if not 1 <= self.r_bwd <= self.r:
            raise ValueError(f"--r-bwd must be in 1..r={self.r}, got {self.r_bwd}")
        # The resolved plain stack (what asdict() of an r = 1 config holds) builds the same config again.
        resolved_plain = self.r == 1 and self.prelude == 0 and self.coda == 0 and self.injection == "none"
        if self.r == 1 and self.recur == 0:
            # r = 1 is a plain stack of `depth` layers: no prelude/coda split, no injection.
            self.prelude, self.coda, self.recur, self.injection = 0, 0, self.depth, "none"
        elif self.injection not in INJECTIONS and not resolved_plain:
            raise ValueError(f"--injection must be one of {'|'.join(INJECTIONS)}, got {self.injection!r}")
        if self.prelude < 0 or self.coda < 0:
            raise ValueError("--prelude and --coda must be >= 0")
        if self.recur == 0:
            n_shared = self.depth - self.prelude - self.coda
            if n_shared <= 0 or n_shared % self.r:
                raise ValueError(f"recurrent depth {self.depth}-{self.prelude}-{self.coda}={n_shared} "
                                 f"is not divisible into r={self.r} loops")
            self.recur = n_shared // self.r
        self.depth = self.prelude + self.r * self.recur + self.coda
        if self.d_model % self.head_dim:
            hint = f"choose --scale so that 64*scale is a multiple of {self.head_dim}, or another --head-dim"
            if self.head_dim == 128:
                hint = "use an even --scale with head dim 128"
            raise ValueError(f"width d=64*{self.scale:g}={self.d_model} is not a multiple of head dim "
                             f"{self.head_dim} ({hint})")
        if self.injection == "hyper" and self.r_bwd < self.r:
            raise ValueError("hyper injection needs full BPTT: the early steps' alpha/M/beta would get no "
                             "gradient with --r-bwd < --r")
        if self.injection == "passthrough" and self.r_bwd < self.r:
            raise ValueError("passthrough injection with --r-bwd < --r cuts the prelude and embedding off "
                             "the gradient (e only enters as s_0)")
        no_state = ("hyper", "none")  # hyperconnections carry K lanes, not one state; the plain stack has no loop
        if self.random_state_init and self.injection in no_state:
            state_modes = "|".join(mode for mode in INJECTIONS if mode not in no_state)
            raise ValueError(f"--random-state-init needs a state injection ({state_modes})")
        if self.untied and (self.r < 2 or self.injection not in UNTIED_INJECTIONS or self.r_bwd < self.r):
            raise ValueError(f"--untied copies the loop's block, W_inj and norm for each of r loops: it needs "
                             f"r >= 2, full BPTT and one of the injections {'|'.join(UNTIED_INJECTIONS)}")
        if self.hc_lanes < 1:
            raise ValueError(f"--hc-lanes must be >= 1, got {self.hc_lanes}")
        if not 1 <= self.vocab_size:
            raise ValueError(f"--vocab-size must be >= 1, got {self.vocab_size}")

    @property
    def d_model(self):
        return int(64 * self.scale)

    @property
    def n_head(self):
        return self.d_model // self.head_dim

    @property
    def padded_vocab(self):
        return -(-self.vocab_size // 64) * 64  # multiple of 64: tensor-core friendly lm_head


# ModelConfig fields added after runs were committed: a run's identity records one only when it is set, so that
# every earlier run keeps its run_id (config_record).
LATER_FIELDS = {"untied": False}


def config_record(cfg):
    """The ModelConfig as a run's identity records it: every field, but a LATER_FIELDS one only when set."""
    record = asdict(cfg)
    for name, default in LATER_FIELDS.items():
        if record[name] == default:
            del record[name]
    return record


def block_params(d):
    """One transformer block: q, k, v, o (4 d^2), MLP d->4d->d (8 d^2), two RMSNorm scales."""
    return 12 * d * d + 2 * d


# Accounting an injection mode (model.py's GPT.inject), the rule for adding one. Its parameters enter N_rec;
# its FLOPs follow the 6N convention of §3.1: 6 FLOPs per parameter per token trained (2 forward, 4 backward),
# 2 in a forward-only loop, charged per loop. A parameter that multiplies in a matrix product belongs to
# `matmul`, which FlopCounterMode measures and tests compare exactly; one applied elementwise (a scale, a
# gate) belongs to `elementwise` with the norm scales, a convention with no matmul to measure.

def injection_accounting(cfg):
    """(parameters in N_rec, matmul parameters one loop applies, elementwise parameters one loop applies)
    of cfg's injection mode, per token."""
    d, K = cfg.d_model, cfg.hc_lanes
    if cfg.injection == "linear":
        return 2 * d * d, 2 * d * d, 0  # W_inj in R^{d x 2d}
    if cfg.injection == "hyper":
        # Per step alpha_t (K), M_t (K x K), beta_t (K), r steps; each acts on K lanes of width d, so one
        # loop's lane matmuls cost as much as (K^2 + 2K) d matmul parameters.
        return cfg.r * (K * K + 2 * K), (K * K + 2 * K) * d, 0
    if cfg.injection == "gated":
        return d, 0, d  # the gate logits w, applied elementwise: u = g e + (1 - g) s
    if cfg.injection in ("additive", "passthrough", "none"):
        return 0, 0, 0
    raise ValueError(f"flops.py has no accounting for injection {cfg.injection!r}: add it to injection_accounting")


def injection_params(cfg):
    """Parameters of the input injection, per model (linear) or summed over all loop steps (hyper)."""
    return injection_accounting(cfg)[0]


def param_counts(cfg):
    """N, N_once, N_rec and the embeddings, exactly as model.py instantiates them (§3.1: N_once = (l_p + l_c) n_b,
    N_rec = l_recur n_b + n_i; at s = 10, N = 98.3M, 59.8M, 40.2M, 30.3M for r = 1, 2, 4, 8). The untied model
    (Truncate or Not? App. E.2) holds r copies of the loop: N_rec is all of them, N = N_once + r N_rec(tied)."""
    d = cfg.d_model
    n_b = block_params(d)
    # The three model-level norms (3d) are booked in N_once: this reproduces the paper's reference
    # horizon D_ref = 10 * (N_once + r * N_rec) = 1,016,083,200 tokens at s = 10, r = 4 (App. E).
    n_once = (cfg.prelude + cfg.coda) * n_b + 3 * d
    n_rec = cfg.recur * n_b + injection_params(cfg)
    if cfg.untied:  # loops 2..r: their own block and W_inj, and their own loop norm (d)
        n_rec += (cfg.r - 1) * (n_rec + d)
    n_embedding = 2 * cfg.padded_vocab * d  # wte and the untied lm_head
    return {"n_params": n_once + n_rec, "n_once": n_once, "n_rec": n_rec,
            "n_embedding": n_embedding, "n_total": n_once + n_rec + n_embedding}


def flops_breakdown(cfg):
    """Training FLOPs per token split into the terms of F below. `matmul` (weight matrices, lm_head, the
    injection's matmul parameters) and `attention` (QK^T and AV) are real matmuls: together they equal what
    torch.utils.flop_counter measures on a forward+backward. `elementwise` is the 6 FLOPs/param convention
    applied to the block norms' 2d scales, which the paper's P_* include, and to an injection's
    elementwise parameters (injection_accounting)."""
    d, T = cfg.d_model, cfg.seq_len
    k = cfg.r_bwd
    f = cfg.r - k  # forward-only loops run under no_grad: 2 FLOPs/param, no backward
    n_once_layers = cfg.prelude + cfg.coda
    _, inj_matmul, inj_elementwise = injection_accounting(cfg)
    matmul = (6 * (n_once_layers * 12 * d * d + cfg.padded_vocab * d)
              + (2 * f + 6 * k) * (cfg.recur * 12 * d * d + inj_matmul))
    elementwise = 6 * n_once_layers * 2 * d + (2 * f + 6 * k) * (cfg.recur * 2 * d + inj_elementwise)
    # Attention scores and values: 4 d T per layer forward (QK^T and AV, not halved for causality),
    # so 12 d T with backward.
    attention = 12 * n_once_layers * d * T + (4 * f + 12 * k) * cfg.recur * d * T
    return {"matmul": matmul, "elementwise": elementwise, "attention": attention}


def flops_per_token(cfg):
    """Training FLOPs per token (forward + backward), §3.1 / truncate-or-not App. D.1:
    F = 6 (P_prelude + P_coda + P_lm_head) + (2f + 6k)(P_recur + P_inj) + attention."""
    return sum(flops_breakdown(cfg).values())


# The optimiser's own FLOPs per step (Truncate or Not? App. D.1, "The optimizer update is negligible"): not in F,
# which prices a token; their "measured compute" adds it. MuonH orthogonalises each matrix by NS_ITERATIONS
# Newton-Schulz steps on X (m x n, m <= n: muonh.orthogonalise transposes tall ones): X X^T (2 m^2 n), A A (2 m^3),
# (b A + c A^2) X (2 m^2 n). Elementwise work per parameter, counted as torch runs it: MuonH's momentum and
# Nesterov lerps (3 + 3), its norms (3 x 2), scale, step and projection (4); AdamW's two moments (3 + 4), its
# denominator (3) and step (3). The elementwise part is < 0.1% of the Newton-Schulz matmuls at these widths.
NS_ITERATIONS = 5  # len(muonh.POLAR_EXPRESS_COEFFICIENTS), checked by tests/test_flops.py
MUONH_FLOPS_PER_PARAM = 16
ADAMW_FLOPS_PER_PARAM = 13


def muonh_matrices(cfg):
    """The (rows, cols) of every matrix MuonH trains (model.GPT.param_groups' "matrix"): q, k, v, o, the MLP's two
    per block, W_inj; each unique once (the loop's block once, or r times untied)."""
    d = cfg.d_model
    copies = cfg.r if cfg.untied else 1
    blocks = cfg.prelude + cfg.coda + copies * cfg.recur
    shapes = blocks * [(d, d)] * 4 + blocks * [(4 * d, d), (d, 4 * d)]
    if cfg.injection == "linear":
        shapes += copies * [(d, 2 * d)]
    return shapes


def optimizer_flops_per_step(cfg):
    """FLOPs of one optimiser step (MuonH's Newton-Schulz matmuls and elementwise update, AdamW's update), the
    same for every (r, r_bwd) of a model and independent of the batch."""
    newton_schulz, muonh_params = 0, 0
    for rows, cols in muonh_matrices(cfg):
        m, n = min(rows, cols), max(rows, cols)
        newton_schulz += NS_ITERATIONS * (4 * m * m * n + 2 * m ** 3)
        muonh_params += rows * cols
    counts = param_counts(cfg)
    adamw_params = counts["n_params"] + counts["n_embedding"] - muonh_params
    return newton_schulz + MUONH_FLOPS_PER_PARAM * muonh_params + ADAMW_FLOPS_PER_PARAM * adamw_params


def measured_flops(cfg, tokens, steps):
    """Truncate or Not?'s "measured compute" of a run: the matmuls a FLOP counter sees in its forward and backward
    passes (flops_breakdown's matmul and attention: F without the norm scales' elementwise convention) plus the
    optimiser's steps. It reproduces their Table 6 column (2.41 ... 28.38e19 at 16 D0, tests/test_flops.py), where
    F D + steps x optimizer lands 240M's 8.2849e19 on 8.29; F D alone gives 2.410 ... 28.213."""
    terms = flops_breakdown(cfg)
    return (terms["matmul"] + terms["attention"]) * tokens + steps * optimizer_flops_per_step(cfg)


def effective_params(n_once, n_rec, r, phi):
    """N_eff = N_once + r^phi * N_rec: the size of the non-looped model with the same loss at the same tokens D
    (§3.2, the joint law's Eq. 3). phi = 1 counts every loop as unique layers, phi = 0 the shared block once."""
    return n_once + r ** phi * n_rec


def reference_horizon(looped=True):
    """D_ref of the LR transfer rule: 10 x effective (phi = 1) params of the s = 10 reference model, r = 4 with
    linear injection for looped runs, r = 1 for the plain baseline (App. E.1: the base-LR sweep ran at s = 10 with
    10 tokens per parameter, ~1B tokens). 1,016,083,200 and 983,315,200 tokens."""
    counts = param_counts(ModelConfig(r=4 if looped else 1, scale=10))
    return 10 * effective_params(counts["n_once"], counts["n_rec"], 4 if looped else 1, 1.0)


def tokens_for_budget(cfg, flops, batch_tokens):
    """Steps and tokens for a compute budget C: steps = round(C / (F * B)), D = steps * B. The paper's D = C /
    (3 F_fwd) (§4.1) in whole steps of B tokens: F is 3 F_fwd under full BPTT, less with forward-only loops, so a
    truncated run reads more tokens for the same C. flops_actual = F * D, the budget actually spent."""
    F = flops_per_token(cfg)
    steps = max(1, round(flops / (F * batch_tokens)))
    tokens = steps * batch_tokens
    return {"steps": steps, "tokens": tokens, "flops_actual": F * tokens}


def peak_flops(device_name):
    """Peak bf16 FLOP/s for a GPU name as torch reports it ('NVIDIA H100 80GB HBM3'), else None."""
    name = device_name.upper()
    for key in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):
        if key in name:
            return PEAK_BF16_FLOPS[key]
    return None


def mfu(cfg, tokens_per_s, n_gpus, device_name, per_token=None):
    """Model FLOPs utilisation with the same F as the budget (per_token: another F, a sampled loop count's);
    None when the peak is unknown (CPU)."""
    peak = peak_flops(device_name)
    if per_token is None:
        per_token = flops_per_token(cfg)
    return None if peak is None else per_token * tokens_per_s / (n_gpus * peak)


def summary(cfg, flops=None, batch_tokens=BATCH_TOKENS, phi=None):
    """Everything a script wants to know about one configuration, as a flat dict."""
    out = config_record(cfg)
    out.update(d_model=cfg.d_model, n_head=cfg.n_head, padded_vocab=cfg.padded_vocab)
    out.update(param_counts(cfg))
    out["flops_per_token"] = flops_per_token(cfg)
    out["optimizer_flops_per_step"] = optimizer_flops_per_step(cfg)
    if phi is not None:
        out["phi"] = phi
        out["n_eff"] = effective_params(out["n_once"], out["n_rec"], cfg.r, phi)
    if flops is not None:
        out.update(flops_budget=flops, batch_tokens=batch_tokens,
                   **tokens_for_budget(cfg, flops, batch_tokens))
        out["flops_measured"] = measured_flops(cfg, out["tokens"], out["steps"])
    return out


def add_model_args(parser):
    """The architecture flags, shared by flops.py, train.py and anything else that builds a model."""
    defaults = ModelConfig
    parser.add_argument("--r", type=positive_int, default=defaults.r, help="recurrences of the shared block")
    parser.add_argument("--scale", type=positive_float, default=defaults.scale, help="width d = 64 * scale")
    parser.add_argument("--r-bwd", type=count, default=0, help="loops with gradient (truncated BPTT); default r")
    parser.add_argument("--injection", default=defaults.injection, choices=INJECTIONS)
    parser.add_argument("--hc-lanes", type=positive_int, default=defaults.hc_lanes, help="hyperconnection lanes K")
    parser.add_argument("--depth", type=positive_int, default=defaults.depth,
                        help="effective depth l_p + r*l_recur + l_c")
    parser.add_argument("--prelude", type=count, default=defaults.prelude)
    parser.add_argument("--coda", type=count, default=defaults.coda)
    parser.add_argument("--recur", type=count, default=0,
                        help="layers in the shared block (fixed-parameter grids); default (depth-prelude-coda)/r")
    parser.add_argument("--head-dim", type=positive_int, default=defaults.head_dim)
    parser.add_argument("--vocab-size", "--vocab", dest="vocab_size", type=positive_int, default=defaults.vocab_size,
                        help="vocabulary size (padded to 64)")
    parser.add_argument("--seq-len", type=positive_int, default=defaults.seq_len)
    parser.add_argument("--random-state-init", action="store_true", help="s_0 ~ N(0,1) ablation (App. C.2)")
    parser.add_argument("--untied", action="store_true",
                        help="every loop its own block, W_inj and norm (Truncate or Not? App. E.2): r x N_rec")


def config_from_args(args, vocab_size=None, seq_len=None):
    """ModelConfig from parsed add_model_args flags (vocab_size and seq_len, when given, are the data's instead);
    raises ValueError with a one-line reason."""
    if vocab_size is None:
        vocab_size = args.vocab_size
    if seq_len is None:
        seq_len = args.seq_len
    return ModelConfig(r=args.r, scale=args.scale, r_bwd=args.r_bwd, injection=args.injection,
                       hc_lanes=args.hc_lanes, depth=args.depth, prelude=args.prelude, coda=args.coda,
                       recur=args.recur, head_dim=args.head_dim, vocab_size=vocab_size, seq_len=seq_len,
                       random_state_init=args.random_state_init, untied=args.untied)


def budget_args(parser):
    """--flops and --batch-tokens: the horizon flags that the table and the plan price."""
    parser.add_argument("--flops", type=positive_float, default=None, help="compute budget C in FLOPs")
    parser.add_argument("--batch-tokens", type=positive_int, default=BATCH_TOKENS)


# ----------------------------------------------------------------------------------------------
# The command line: the table or JSON of one configuration; --plan forwards to nanoloop/sweep_state.py's pricer

def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    one_line_errors(parser, "flops.py")
    add_model_args(parser)
    budget_args(parser)
    parser.add_argument("--phi", type=finite_float, default=None, help="also print N_eff for this phi")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    plan = parser.add_argument_group("plan mode: price 'name|train.py flags' lines from stdin (sweep.sh --plan)")
    plan.add_argument("--plan", action="store_true", help="read the plan lines on stdin")
    plan.add_argument("--data", default="", help="prepared data: its meta.json sets vocab/seq-len and the token check "
                                                 "(ALLOW_REPEAT=1 lets a short dataset pass)")
    plan.add_argument("--results", default="", help="results file whose achieved FLOP/s set the wall-time estimate")
    plan.add_argument("--flops-per-s", type=positive_float, default=None, help="FLOP/s per run slot for the estimate")
    args = parser.parse_args()
    try:
        if args.plan:  # the pricer reads the prepared data, so it lives with the sweep (nanoloop/sweep_state.py):
            # this process becomes that one, which keeps flops.py pure and importing nothing but common.py
            plan_args = ["--plan", "--data", args.data, "--results", args.results]
            if args.flops_per_s:
                plan_args += ["--flops-per-s", repr(args.flops_per_s)]
            # -m finds the package from any working folder once the repository is on the path
            paths = [str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")]
            env = os.environ | {"PYTHONPATH": os.pathsep.join(path for path in paths if path)}
            os.execve(sys.executable, [sys.executable, "-m", "nanoloop.sweep_state", *plan_args], env)
        cfg = config_from_args(args)
    except ValueError as e:
        fail("flops.py", str(e))
    out = summary(cfg, args.flops, args.batch_tokens, args.phi)
    if args.json:
        print(json.dumps(out))
        return
    print(f"layout      prelude {cfg.prelude} + {cfg.r} x {cfg.recur} shared + coda {cfg.coda} "
          f"= depth {cfg.depth}   (r_bwd {cfg.r_bwd}, injection {cfg.injection})")
    print(f"width       d = {cfg.d_model}, {cfg.n_head} heads of {cfg.head_dim}, vocab {cfg.padded_vocab}")
    for key in ("n_params", "n_once", "n_rec", "n_embedding", "n_eff"):
        if key in out:
            print(f"{key:<12}{out[key]:>18,.0f}  ({out[key] / 1e6:.2f}M)")
    print(f"{'flops/token':<12}{out['flops_per_token']:>18,}  (seq len {cfg.seq_len}; forward + backward)")
    print(f"{'optimizer':<12}{out['optimizer_flops_per_step']:>18,}  FLOPs per step (MuonH + AdamW)")
    if args.flops is not None:
        print(f"{'budget C':<12}{args.flops:>18.3e}  batch {args.batch_tokens:,} tokens")
        print(f"{'steps':<12}{out['steps']:>18,}")
        print(f"{'tokens D':<12}{out['tokens']:>18,}  ({out['tokens'] / out['n_params']:.1f} tokens/param)")
        print(f"{'F * D':<12}{out['flops_actual']:>18.4e}  forward + backward")
        print(f"{'measured':<12}{out['flops_measured']:>18.4e}  matmuls + steps x optimizer (Truncate or Not?'s "
              f"\"measured compute\")")


if __name__ == "__main__":
    main()
