"""
The training recipes: what a run's horizon makes of its batch, its steps and its learning-rate schedule.
train.py --recipe names one (RECIPES); its flags below override a part of it for an ablation.

  iso-depth        the iso-depth paper's (§4.1, App. E): the batch is --batch-tokens (2^18 tokens), a FLOP budget
                   C gives steps = round(C / (F B)), the MuonH LR falls with the tokens as D^-0.32, no warmup and
                   a linear decay to 10% of the peak. Every iso-depth grid trains with it.
  truncate-or-not  Truncate or Not?'s (their §3 "Optimization", App. F, Table 13): the global batch grows with
                   the horizon, 64 sqrt(D/D0) sequences (D0 = 2^30 tokens) rounded to a ladder whose steps differ
                   by about sqrt(2); steps are the tokens over the batch, rounded up to a multiple of 8; the MuonH
                   LR's token exponent is 0.40 ("0.32 is too small" on their models); 2% linear warmup, then a
                   cosine to 10%. Neither recipe clips gradients.

    python train.py --recipe truncate-or-not --r 4 --r-bwd 2 --prelude 2 --recur 4 --coda 2 --scale 12 \\
        --tokens 1073741824             # Table 13's D = D0 row: 64 sequences of 2,048 tokens, 8,192 steps
"""
import math
from dataclasses import dataclass, replace

import flops
from nanoloop.common import DataError, finite_float, positive_float, positive_int
from nanoloop.loops import expected_flops_per_token, loop_counts_from_args


@dataclass(frozen=True)
class Recipe:
    """One recipe, resolved: everything train.py's horizon, batch and schedule depend on."""
    name: str
    data_exp: float              # the MuonH LR's token exponent: LR ~ (D / D_ref)^-data_exp
    warmup_frac: float           # the first round(warmup_frac x steps) steps ramp the LR up linearly
    decay: str                   # "linear" or "cosine", from the peak to final_lr_frac of it at the last step
    d0: float                    # the token unit D0 the batch rule and the budget levels are counted in
    batch_at_d0: int | None      # sequences per step at D = D0 (the batch rule), None: --batch-tokens
    average_frac: float = 0.0    # evaluate the mean weights of this last fraction of the steps (averaging.py); 0: off


RECIPES = {
    "iso-depth": Recipe("iso-depth", data_exp=0.32, warmup_frac=0.0, decay="linear", d0=2.0 ** 30, batch_at_d0=None),
    "truncate-or-not": Recipe("truncate-or-not", data_exp=0.40, warmup_frac=0.02, decay="cosine", d0=2.0 ** 30,
                              batch_at_d0=64),
}
DEFAULT_RECIPE = "iso-depth"
DECAYS = ("linear", "cosine")
DEFAULT_TOKENS_PER_PARAM = 20  # the horizon when none is given (GPU; on CPU train.py asks for one)
# A horizon the batch cannot honour: fewer steps than this, or FLOPs (tokens) spent more than this far
# from the budget asked for, would give a row whose budget is not what the run spent.
MIN_STEPS = 2
HORIZON_RTOL = 0.10
# The batch ladder, in sequences. Table 13 prints 32 ... 352 ("..., 32, 48, 64, 88, 128, 176, 256, 352");
# [decision] below 32 it goes on by halving the (32, 48) pair, above 352 by doubling the (256, 352) pair, so
# that CPU-scale batches of a few sequences follow the same ~sqrt(2) steps.
BATCH_LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 88, 128, 176, 256, 352, 512, 704, 1024, 1408, 2048)
STEP_MULTIPLE = 8  # Table 13's steps are the tokens over the batch rounded up to a multiple of 8 (5,461.3 -> 5,464)


@dataclass(frozen=True)
class Horizon:
    """How long a run trains, and on what batch."""
    steps: int
    batch_tokens: int
    tokens_target: float         # the horizon asked for, in tokens: --tokens, --tokens-per-param x N, or C / F


def add_horizon_args(group):
    """The horizon flags (pick one) and the batch: train.py's, and what sweep.sh's --plan prices."""
    flops.budget_args(group)  # --flops C and --batch-tokens B
    group.set_defaults(batch_tokens=None)  # None: the recipe's (iso-depth: flops.BATCH_TOKENS)
    group.add_argument("--tokens", type=positive_float, help="training tokens D")
    group.add_argument("--tokens-per-param", type=positive_float,
                       help=f"D = this x N (non-embedding); default {DEFAULT_TOKENS_PER_PARAM}")


def add_recipe_args(parser):
    """train.py's recipe flags: the recipe, and the parts of it an ablation may change (None: the recipe's)."""
    group = parser.add_argument_group("recipe (batch rule and LR schedule)")
    group.add_argument("--recipe", default=DEFAULT_RECIPE, choices=tuple(RECIPES),
                       help="iso-depth: fixed batch, linear decay; truncate-or-not: batch 64 sqrt(D/D0) sequences "
                            "on a ladder, LR token exponent 0.40, 2%% warmup, cosine decay")
    group.add_argument("--warmup-frac", type=finite_float, default=None, help="LR warmup, a fraction of the steps")
    group.add_argument("--lr-decay", default=None, choices=DECAYS, help="the decay after the warmup")
    group.add_argument("--d0", type=positive_float, default=None,
                       help="the token unit D0 of the batch rule and the budget levels (truncate-or-not: 2^30)")
    group.add_argument("--batch-at-d0", type=positive_int, default=None,
                       help="sequences per step at D = D0 under the batch rule (truncate-or-not: 64)")
    group.add_argument("--average-last", type=finite_float, default=None, metavar="FRAC",
                       help="evaluate and keep the mean weights of the last FRAC of the steps instead of the last "
                            "iterate (the CPU grids' quieter recipe; default 0: off)")


def recipe_from_args(args):
    """The Recipe train.py's flags describe: --recipe's, with any of its parts the flags set (--data-exp is
    muonh.lr_settings' to apply). ValueError for a warmup outside [0, 1) or two flags setting the batch."""
    recipe = RECIPES[args.recipe]
    overrides = {"warmup_frac": args.warmup_frac, "decay": args.lr_decay, "d0": args.d0,
                 "batch_at_d0": args.batch_at_d0, "average_frac": args.average_last}
    recipe = replace(recipe, **{key: value for key, value in overrides.items() if value is not None})
    if not 0 <= recipe.warmup_frac < 1:
        raise ValueError(f"--warmup-frac must be in [0, 1), got {recipe.warmup_frac}")
    if not 0 <= recipe.average_frac <= 1:
        raise ValueError(f"--average-last must be in [0, 1], got {recipe.average_frac}")
    if recipe.batch_at_d0 is not None and args.batch_tokens is not None:
        raise ValueError(f"--batch-tokens and --recipe {recipe.name}'s batch rule ({recipe.batch_at_d0} sequences "
                         f"at D0) both set the batch: give one")
    return recipe


def plan_horizon(args, cfg, recipe, strict=True):
    """The Horizon of train.py's horizon flags for cfg under recipe: --flops C (steps = round(C / (F B)), the
    iso-depth sweep's mode), --tokens D or --tokens-per-param (default 20); under a batch rule the batch follows
    the horizon in tokens (C / F for a FLOP budget). DataError for two horizons, or (strict) one the batch cannot
    honour; a plan priced without its data's vocabulary and sequence length is not strict."""
    if sum(x is not None for x in (args.flops, args.tokens, args.tokens_per_param)) > 1:
        raise DataError("give only one of --flops, --tokens, --tokens-per-param")
    loops = loop_counts_from_args(args)  # a sampled loop count: the budget buys steps at its expected F
    if args.flops is not None:
        tokens, flag = args.flops / expected_flops_per_token(cfg, loops), "--flops"
    elif args.tokens is not None:
        tokens, flag = args.tokens, "--tokens"
    else:
        tokens_per_param = args.tokens_per_param or DEFAULT_TOKENS_PER_PARAM
        tokens, flag = tokens_per_param * flops.param_counts(cfg)["n_params"], "--tokens-per-param"
    batch_tokens = args.batch_tokens or flops.BATCH_TOKENS
    if recipe.batch_at_d0 is not None:
        batch_tokens = ladder_batch(tokens, recipe) * cfg.seq_len
        steps = ladder_steps(tokens, batch_tokens)
    elif args.flops is not None and loops.kind == "fixed":
        steps = flops.tokens_for_budget(cfg, args.flops, batch_tokens)["steps"]
    else:  # a token horizon, or a budget over sampled loop counts: round(C / (E[F] B))
        steps = max(1, round(tokens / batch_tokens))
    spent = steps * batch_tokens
    off = spent / tokens - 1  # the same for FLOPs: F is per token
    if strict and (steps < MIN_STEPS or abs(off) > HORIZON_RTOL):
        asked, unit = (args.flops, "FLOPs") if args.flops is not None else (tokens, "tokens")
        raise DataError(f"{flag} {asked:.4g} is {steps} step(s) of {batch_tokens:,} tokens, which would spend "
                        f"{asked * (1 + off):.4g} {unit} ({100 * off:+.0f}%); a run needs >= {MIN_STEPS} steps "
                        f"within {100 * HORIZON_RTOL:.0f}% of its budget: raise {flag} or lower --batch-tokens")
    return Horizon(steps, batch_tokens, tokens)


def is_default_schedule(recipe):
    """Whether the recipe's LR schedule is the iso-depth one (no warmup, linear decay, the last iterate): the run
    identities of every iso-depth run were made without a schedule entry, and must stay what they are."""
    return recipe.warmup_frac == 0 and recipe.decay == "linear" and recipe.average_frac == 0


def ladder_batch(tokens, recipe):
    """Sequences per step for a horizon of `tokens` (Truncate or Not? App. F): batch_at_d0 sqrt(D / D0) on
    BATCH_LADDER, the nearest step in ratio. Table 13: D/D0 = 1/2, 1, 2, ..., 32 -> 48, 64, 88, 128, 176, 256, 352."""
    ideal = recipe.batch_at_d0 * math.sqrt(tokens / recipe.d0)
    return min(BATCH_LADDER, key=lambda seqs: abs(math.log(seqs / ideal)))


def ladder_steps(tokens, batch_tokens):
    """Steps of the batch rule: tokens / batch rounded up to a multiple of STEP_MULTIPLE (Table 13: 2^29 tokens
    in batches of 48 x 2,048 -> 5,464 steps; D0 in 64 -> 8,192)."""
    return STEP_MULTIPLE * math.ceil(tokens / (batch_tokens * STEP_MULTIPLE))


def lr_multiplier(step, total_steps, final_frac=0.1, warmup_frac=0.0, decay="linear"):
    """The LR schedule, a multiple of the peak LR at `step` (0-based) of total_steps: a linear warmup over the first
    round(warmup_frac x total_steps) steps (to 1 at the warmup's last step), then a linear or cosine decay to
    final_frac at the last step, clamped at final_frac beyond it. iso-depth (App. E): no warmup, linear, 1.0 -> 0.1;
    truncate-or-not (§3): 2% warmup, cosine to 0.1."""
    if total_steps < 1 or step < 0:
        raise ValueError(f"lr_multiplier needs total_steps >= 1 and step >= 0, got {step}/{total_steps}")
    if decay not in DECAYS:
        raise ValueError(f"lr_multiplier: decay must be one of {DECAYS}, got {decay!r}")
    warmup = round(warmup_frac * total_steps)
    if step < warmup:
        return (step + 1) / warmup
    decay_steps = total_steps - 1 - warmup
    if decay_steps <= 0:
        return 1.0
    progress = min((step - warmup) / decay_steps, 1.0)
    if decay == "cosine":
        return final_frac + (1.0 - final_frac) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0 - (1.0 - final_frac) * progress
