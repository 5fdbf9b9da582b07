"""
Parameter counts and training FLOPs for the iso-depth looped transformer: the one source of truth.

Every number the scaling-law fit sees (N, N_once, N_rec, tokens D for a compute budget C) comes
from here, and model.py builds its layout from the same `ModelConfig`, so the accounting and the
instantiated network cannot drift apart (tests check both against each other and against
torch's FlopCounterMode). Pure Python, no torch: fit_laws.py and sweep.sh import it too.

    python flops.py --r 4 --scale 10                      # readable table
    python flops.py --r 4 --scale 10 --flops 1e18 --json  # one JSON object for scripts
    ./sweep.sh --grid paper --plan                        # pipes "name|train.py flags" lines into
    python flops.py --plan --data DIR [--results F]       #   this: table, total, wall time, data check

Conventions (paper §3.1; truncate-or-not App. D.1 for truncated loops):
  n_b  = 12 d^2 + 2d per block (4 attention + 2 MLP matrices, two block norms)
  N    = N_once + N_rec, embeddings excluded, the three model-level norms (3d) included
  F    = 6 (P_prelude + P_coda + P_lm_head) + (2f + 6k)(P_recur + P_inj)
         + 12 (l_p + l_c) d T + (4f + 12k) l_recur d T          per token, f = r - k
"""
import argparse
import json
import math
import os
import sys
from dataclasses import asdict, dataclass

from common import count, fail, finite_float, one_line_errors, positive_float, positive_int, read_rows

# The injection modes (paper §3.1, §5.2): what model.py builds, what flops.py counts, what the tests cover.
INJECTIONS = ("linear", "additive", "passthrough", "hyper", "gated")

# Dense bf16 tensor-core peak FLOP/s per GPU (datasheet numbers, no sparsity), for MFU.
PEAK_BF16_FLOPS = {
    "A100": 312e12,
    "H100": 989e12,  # SXM; the PCIe card is 756e12
    "H100 PCIE": 756e12,
    "H200": 989e12,
}


@dataclass
class ModelConfig:
    """Everything that fixes the shape of a looped model. model.py builds exactly this."""
    r: int = 4                      # recurrences of the shared block (train time)
    scale: float = 10               # width d = 64 * scale (fractions such as 0.5 for CPU-scale grids)
    r_bwd: int = 0                  # loops that get gradient (truncated BPTT); 0 means r
    injection: str = "linear"       # one of INJECTIONS (model.py's GPT.inject); "none" for the plain r = 1 stack
    hc_lanes: int = 2               # K, hyperconnection lanes
    depth: int = 20                 # effective depth l_p + r * l_recur + l_c
    prelude: int = 2
    coda: int = 2
    recur: int = 0                  # layers in the shared block; 0 means (depth - prelude - coda) / r
    head_dim: int = 128
    vocab_size: int = 32064
    seq_len: int = 2048
    random_state_init: bool = False  # Huginn-style s_0 ~ N(0, 1) ablation (App. C.2)

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
        if self.random_state_init and self.injection in ("hyper", "none"):
            raise ValueError("--random-state-init needs a state injection (linear|additive|passthrough)")
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
    """N, N_once, N_rec and the embeddings, exactly as model.py instantiates them."""
    d = cfg.d_model
    n_b = block_params(d)
    # The three model-level norms (3d) are booked in N_once: this reproduces the paper's reference
    # horizon D_ref = 10 * (N_once + r * N_rec) = 1,016,083,200 tokens at s = 10, r = 4 (App. E).
    n_once = (cfg.prelude + cfg.coda) * n_b + 3 * d
    n_rec = cfg.recur * n_b + injection_params(cfg)
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


def effective_params(n_once, n_rec, r, phi):
    """N_eff = N_once + r^phi * N_rec: the non-looped size with the same loss (paper Eq. 2)."""
    return n_once + r ** phi * n_rec


def reference_horizon(looped=True):
    """D_ref of the LR transfer rule: 10 x effective (phi = 1) params of the s = 10 reference model,
    r = 4 with linear injection for looped runs, r = 1 for the plain baseline (App. E)."""
    counts = param_counts(ModelConfig(r=4 if looped else 1, scale=10))
    return 10 * effective_params(counts["n_once"], counts["n_rec"], 4 if looped else 1, 1.0)


def tokens_for_budget(cfg, flops, batch_tokens):
    """Steps and tokens for a compute budget C: steps = round(C / (F * B)), D = steps * B."""
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


def mfu(cfg, tokens_per_s, n_gpus, device_name):
    """Model FLOPs utilisation with the same F as the budget; None when the peak is unknown (CPU)."""
    peak = peak_flops(device_name)
    return None if peak is None else flops_per_token(cfg) * tokens_per_s / (n_gpus * peak)


def summary(cfg, flops=None, batch_tokens=2 ** 18, phi=None):
    """Everything a script wants to know about one configuration, as a flat dict."""
    out = {k: v for k, v in asdict(cfg).items()}
    out.update(d_model=cfg.d_model, n_head=cfg.n_head, padded_vocab=cfg.padded_vocab)
    out.update(param_counts(cfg))
    out["flops_per_token"] = flops_per_token(cfg)
    if phi is not None:
        out["phi"] = phi
        out["n_eff"] = effective_params(out["n_once"], out["n_rec"], cfg.r, phi)
    if flops is not None:
        out.update(flops_budget=flops, batch_tokens=batch_tokens,
                   **tokens_for_budget(cfg, flops, batch_tokens))
    return out


def add_model_args(parser):
    """The architecture flags, shared by flops.py, train.py and anything else that builds a model."""
    d = ModelConfig
    parser.add_argument("--r", type=positive_int, default=d.r, help="recurrences of the shared block")
    parser.add_argument("--scale", type=positive_float, default=d.scale, help="width d = 64 * scale")
    parser.add_argument("--r-bwd", type=count, default=0, help="loops with gradient (truncated BPTT); default r")
    parser.add_argument("--injection", default=d.injection, choices=INJECTIONS)
    parser.add_argument("--hc-lanes", type=positive_int, default=d.hc_lanes, help="hyperconnection lanes K")
    parser.add_argument("--depth", type=positive_int, default=d.depth, help="effective depth l_p + r*l_recur + l_c")
    parser.add_argument("--prelude", type=count, default=d.prelude)
    parser.add_argument("--coda", type=count, default=d.coda)
    parser.add_argument("--recur", type=count, default=0,
                        help="layers in the shared block (fixed-parameter grids); default (depth-prelude-coda)/r")
    parser.add_argument("--head-dim", type=positive_int, default=d.head_dim)
    parser.add_argument("--vocab-size", "--vocab", dest="vocab_size", type=positive_int, default=d.vocab_size,
                        help="vocabulary size (padded to 64)")
    parser.add_argument("--seq-len", type=positive_int, default=d.seq_len)
    parser.add_argument("--random-state-init", action="store_true", help="s_0 ~ N(0,1) ablation (App. C.2)")


def config_from_args(args, vocab_size=None):
    """ModelConfig from parsed add_model_args flags; raises ValueError with a one-line reason."""
    if vocab_size is None:
        vocab_size = args.vocab_size
    return ModelConfig(r=args.r, scale=args.scale, r_bwd=args.r_bwd, injection=args.injection,
                       hc_lanes=args.hc_lanes, depth=args.depth, prelude=args.prelude, coda=args.coda,
                       recur=args.recur, head_dim=args.head_dim, vocab_size=vocab_size, seq_len=args.seq_len,
                       random_state_init=args.random_state_init)


def budget_args(parser):
    """--flops and --batch-tokens: the horizon flags that the table and the plan price."""
    parser.add_argument("--flops", type=positive_float, default=None, help="compute budget C in FLOPs")
    parser.add_argument("--batch-tokens", type=positive_int, default=2 ** 18)


# ----------------------------------------------------------------------------------------------
# The command line: the table or JSON of one configuration, and pricing a sweep's plan (sweep.sh --plan)

def read_data_meta(data_dir):
    """A prepared dataset's meta.json through dataloader.read_meta (the one reader: a damaged file is one
    line naming it; no checksum pass, train.py verifies the data when it starts), or None if there is none.
    dataloader is imported here, not at the top: the rest of flops.py is pure Python."""
    if not data_dir or not os.path.exists(os.path.join(data_dir, "meta.json")):
        return None
    from dataloader import read_meta
    return read_meta(data_dir, verify=False)


def training_files(meta):
    """How many source files hold training data: every source but the whole validation files (with
    --val-fraction every file is partly training data)."""
    sources = meta.get("settings", {}).get("sources", [])
    val_files = meta.get("split", {}).get("val_files", [])
    return len(sources) - len(val_files)


def data_shortfall(max_tokens, meta, data_dir):
    """One line saying how far the prepared data falls short of the largest run, or None if it covers it.
    A run that reads more tokens than the training split repeats data (a second epoch), which the
    scaling law does not model (the paper trains on unique tokens, §4.1). Tokens per shard are this
    dataset's own (after packing)."""
    have = meta["train_tokens"]
    if max_tokens <= have:
        return None
    msg = f"the largest run reads {max_tokens:,} tokens but {data_dir} holds {have:,} training tokens"
    n_files = training_files(meta)
    if n_files > 0:
        per_file = have / n_files
        msg += (f" ({n_files} training shard(s), ~{per_file / 1e6:.1f}M tokens each): prepare "
                f">= {math.ceil(max_tokens / per_file)} training shards (prepare_data.py --shards N)")
    else:
        msg += f": prepare {max_tokens / have:.1f}x more training data"
    return msg + ", or set ALLOW_REPEAT=1 to repeat data knowingly"


def achieved_rate(results):
    """(mean achieved FLOP/s per run of the rows in a results file, where it comes from), or (None, "")."""
    if not results:
        return None, ""
    rows, _ = read_rows(results)  # a torn last line: fit_laws.py reports those, the estimate skips them
    rates = [row["tokens_per_s"] * row["flops_per_token"] for row in rows
             if row.get("tokens_per_s") and row.get("flops_per_token")]
    if not rates:
        return None, ""
    return sum(rates) / len(rates), f"mean achieved rate of the {len(rates)} runs in {results}"


def plan(lines, data_dir, results, flops_per_s):
    """Price a sweep plan: one "name|train.py flags" line per run (sweep.sh writes them). Prints the
    table, the total compute and a wall-time estimate; returns an exit status (2: the data is short)."""
    meta = read_data_meta(data_dir)
    parser = argparse.ArgumentParser(prog="flops.py --plan", add_help=False)
    add_model_args(parser)
    budget_args(parser)
    rows = []
    for line in lines:
        if not line.strip():
            continue
        name, _, flags = line.rstrip("\n").partition("|")
        args, _ = parser.parse_known_args(flags.split())  # train-only flags (--eval-rows, ...) are not ours
        if meta:
            args.vocab_size = meta["vocab_size"]
            args.seq_len = meta["seq_len"]
        if args.flops is None:
            raise ValueError(f"plan line {name!r} has no --flops budget")
        cfg = config_from_args(args)
        rows.append((name, cfg, summary(cfg, args.flops, args.batch_tokens)))
    if not rows:
        raise ValueError("no plan lines on stdin (expected 'name|train.py flags')")
    print(f"{'run':<34}{'r':>3}{'r_bwd':>6}{'s':>6}{'budget C':>11}{'N':>14}{'tokens D':>16}{'steps':>8}{'F*D':>12}")
    for name, cfg, out in rows:
        print(f"{name:<34}{cfg.r:>3}{cfg.r_bwd:>6}{cfg.scale:>6g}{out['flops_budget']:>11.3g}{out['n_params']:>14,}"
              f"{out['tokens']:>16,}{out['steps']:>8,}{out['flops_actual']:>12.3e}")
    total = sum(out["flops_actual"] for _, _, out in rows)
    where_shape = ""
    if not meta:
        where_shape = f" (vocab/seq-len from flags: {data_dir or '--data'}/meta.json not found)"
    print(f"{len(rows)} runs, total compute {total:.3e} FLOPs{where_shape}")
    if flops_per_s:
        rate, source = flops_per_s, "given --flops-per-s"
    else:
        rate, source = achieved_rate(results)
    if rate:
        print(f"estimated wall time {total / rate / 3600:,.1f} h at {rate:.3e} FLOP/s per run slot ({source})")
    else:
        print("estimated wall time: give --flops-per-s (e.g. 8 x 989e12 x MFU for one 8-GPU node) "
              "or run a few configurations first")
    largest = max(rows, key=lambda row: row[2]["tokens"])
    if meta:
        short = data_shortfall(largest[2]["tokens"], meta, data_dir)
        if short is None:
            print(f"data: {data_dir} holds {meta['train_tokens']:,} training tokens, the largest run "
                  f"({largest[0]}) reads {largest[2]['tokens']:,}")
        elif os.environ.get("ALLOW_REPEAT") == "1":
            print(f"data (ALLOW_REPEAT=1): {short.split(': prepare')[0]}; runs will repeat data")
        else:
            print(f"flops.py: {short}", file=sys.stderr)
            return 2
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    one_line_errors(parser, "flops.py")
    add_model_args(parser)
    budget_args(parser)
    parser.add_argument("--phi", type=finite_float, default=None, help="also print N_eff for this phi")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    g = parser.add_argument_group("plan mode: price 'name|train.py flags' lines from stdin (sweep.sh --plan)")
    g.add_argument("--plan", action="store_true", help="read the plan lines on stdin")
    g.add_argument("--data", default="", help="prepared data: its meta.json sets vocab/seq-len and the token check "
                                              "(ALLOW_REPEAT=1 lets a short dataset pass)")
    g.add_argument("--results", default="", help="results file whose achieved FLOP/s set the wall-time estimate")
    g.add_argument("--flops-per-s", type=positive_float, default=None, help="FLOP/s per run slot for the estimate")
    args = parser.parse_args()
    try:
        if args.plan:
            sys.exit(plan(sys.stdin, args.data, args.results, args.flops_per_s))
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
    print(f"{'flops/token':<12}{out['flops_per_token']:>18,}  (seq len {cfg.seq_len})")
    if args.flops is not None:
        print(f"{'budget C':<12}{args.flops:>18.3e}  batch {args.batch_tokens:,} tokens")
        print(f"{'steps':<12}{out['steps']:>18,}")
        print(f"{'tokens D':<12}{out['tokens']:>18,}  ({out['tokens'] / out['n_params']:.1f} tokens/param)")
        print(f"{'F * D':<12}{out['flops_actual']:>18.4e}")


if __name__ == "__main__":
    main()
