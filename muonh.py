"""
MuonH, the AdamW side of the optimiser split, and the learning-rate rule (paper §4.1, App. E).

Every 2-D matrix inside the blocks (and the injection matrix W_inj) is trained by MuonH: an orthogonalised,
Nesterov-momentum update whose size is a fixed fraction `lr` of the matrix's Frobenius norm, followed by a projection
back onto the sphere ||W||_F = R = ||W_0||_F. The embedding, lm_head, RMSNorm scales and hyperconnection parameters
are trained by torch's own AdamW. The learning rates follow the muP/HyperP transfer rule anchored at s = 10 (App. E).

    from muonh import build_optimizers, learning_rates
    lrs = learning_rates(d_model=640, batch_tokens=2**18, tokens=D, tokens_ref=D_ref)
    muon, adamw = build_optimizers(model.param_groups(), lrs)
    for opt in (muon, adamw):                      # every step; the schedule is recipe.lr_multiplier
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * lr_multiplier(step, total_steps)

Depends only on torch. Under torch.distributed (gradients already averaged, e.g. by DDP) MuonH splits the
Newton-Schulz work across ranks and all-gathers the results, so every rank ends each step with bit-identical weights.
"""
import math

import torch
import torch.distributed as dist

from nanoloop.common import finite_float, positive_int

# ---------------------------------------------------------------------------------------------
# Constants of the recipe (paper §4.1, App. E)

REF_WIDTH = 640              # d_0: width of the s = 10 reference model
REF_BATCH_TOKENS = 2 ** 18   # B_0: reference batch in tokens
BASE_LRS = {"matrix": 0.014, "embedding": 0.3, "unembedding": 0.004, "norm": 0.005, "hyper": 0.01}
GROUP_NAMES = tuple(BASE_LRS)  # the parameter-group names model.param_groups() returns
# App. E's five groups. Every run's identity records their LRs (every committed run_id holds them); a
# group added to BASE_LRS beyond them is recorded only by runs whose model has parameters in it
# (runs.run_identity), so that adding one leaves every existing run_id as it was.
RECIPE_GROUPS = ("matrix", "embedding", "unembedding", "norm", "hyper")
ADAMW_BETAS = (0.8, 0.95)
ADAMW_EPS = 1e-10
# The transfer rule's exponents (App. E; the truncate-or-not recipe's data exponent, 0.40, is recipe.py's) and
# the schedule's end: the defaults of learning_rates() and train.py's flags alike.
BATCH_EXP = 0.558
DATA_EXP = 0.32
WIDTH_EXP = 0.5
FINAL_LR_FRAC = 0.1

# ---------------------------------------------------------------------------------------------
# Newton-Schulz coefficients
#
# One iteration maps X -> a X + b (X X^T) X + c (X X^T)^2 X, which applies the odd quintic
# p(s) = a s + b s^3 + c s^5 to every singular value of X and keeps its singular vectors. Starting
# from U/||U||_F (all singular values in (0, 1]), a composition of such maps pushes every singular
# value towards 1, i.e. X towards the polar factor U V^T of U = U S V^T.

# Keller Jordan's Muon quintic, the same polynomial every step. It trades accuracy for a steep
# slope at 0 (a = 3.4445): small singular values grow fast, but they end up anywhere in roughly
# [0.7, 1.2] (down to 0.47 for inputs near 1e-3) rather than converging to 1.
QUINTIC_COEFFICIENTS = ((3.4445, -4.7750, 2.0315),) * 5

# Polar Express (Amsel, Persson, Musco, Gower 2025), Algorithm 1: step t uses the odd quintic that
# is minimax-optimal for mapping the current singular-value interval [lo, hi] onto 1; the image
# interval becomes the next [lo, hi]. The cushion and the 1e-3 lower bound are the paper's values.
POLAR_EXPRESS_LOWER = 1e-3
POLAR_EXPRESS_CUSHION = 0.02407327424182761
# [decision] safety 0.01: each polynomial is evaluated at s / 1.01, so singular values that bf16 rounding pushes
# slightly above the tracked interval are still pulled back towards 1 instead of being amplified by the steep
# high-degree term. Measured (dev/bench_muonh.py): without it the bf16 output overshoots its own promised band
# (max singular value 1.17 against 1.12); with it the output stays in [0.86, 1.135] against the promised [0.860, 1.134].
POLAR_EXPRESS_SAFETY = 0.01


def _minimax_quintic(lo, hi):
    """Odd quintic (a, b, c) minimising max |1 - p(s)| over s in [lo, hi], by the Remez exchange.

    The optimum equioscillates at four points lo < s1 < s2 < hi with alternating error +E, -E, +E,
    -E (Chebyshev alternation for 3 free coefficients). Given the points, (a, b, c, E) solve a 4x4
    linear system; given the coefficients, s1 and s2 are the interior extrema of p, the positive
    roots of p'(s) = a + 3 b s^2 + 5 c s^4 = 0. Iterate to a fixed point.
    """
    if lo / hi > 1 - 5e-6:
        # Interval of width ~0: the limit is the Taylor-optimal quintic with p(hi)=1, p'(hi)=p''(hi)=0.
        return 15 / 8 / hi, -10 / 8 / hi ** 3, 3 / 8 / hi ** 5
    s1, s2 = (3 * lo + hi) / 4, (lo + 3 * hi) / 4  # exact in the limit lo -> hi
    error = math.inf
    for _ in range(100):
        points = ((lo, 1.0), (s1, -1.0), (s2, 1.0), (hi, -1.0))
        system = torch.tensor([[s, s ** 3, s ** 5, sign] for s, sign in points], dtype=torch.float64)
        a, b, c, new_error = torch.linalg.solve(system, torch.ones(4, dtype=torch.float64)).tolist()
        root = math.sqrt(9 * b * b - 20 * a * c)
        s1, s2 = math.sqrt((-3 * b - root) / (10 * c)), math.sqrt((-3 * b + root) / (10 * c))
        if abs(new_error - error) < 1e-15:
            break
        error = new_error
    return a, b, c


def polar_express_coefficients(num_steps=5, lower=POLAR_EXPRESS_LOWER, cushion=POLAR_EXPRESS_CUSHION,
                               safety=POLAR_EXPRESS_SAFETY):
    """Per-step (a, b, c) of Polar Express for singular values in [lower, 1] (paper Algorithm 1).

    The cushion keeps each fit interval no wider than [cushion * hi, hi]: the optimal quintic for a
    much smaller lo has huge coefficients that amplify rounding error. The fitted polynomial is then
    rescaled so that p(lo) and p(hi) sit symmetrically around 1, so the next interval is
    [p(lo), 2 - p(lo)] (a slight over-estimate of its top once the safety factor is applied).
    With safety = 0 the numbers are the paper's published ones (first step 8.2872, -23.5959, 17.3004).
    """
    lo, hi = lower, 1.0
    steps = []
    for _ in range(num_steps):
        a, b, c = _minimax_quintic(max(lo, cushion * hi), hi)
        scale = 2 / ((a * lo + b * lo ** 3 + c * lo ** 5) + (a * hi + b * hi ** 3 + c * hi ** 5))
        a, b, c = a * scale / (1 + safety), b * scale / (1 + safety) ** 3, c * scale / (1 + safety) ** 5
        steps.append((a, b, c))
        lo = a * lo + b * lo ** 3 + c * lo ** 5
        hi = 2 - lo
    return tuple(steps)


POLAR_EXPRESS_COEFFICIENTS = polar_express_coefficients()
NS_COEFFICIENTS = {"polar_express": POLAR_EXPRESS_COEFFICIENTS, "quintic": QUINTIC_COEFFICIENTS}


def orthogonalise(updates, coefficients=POLAR_EXPRESS_COEFFICIENTS, compute_dtype=torch.bfloat16):
    """Approximate polar factor of each matrix in `updates` ([m, n] or a stack [k, m, n]).

    Runs len(coefficients) Newton-Schulz iterations in compute_dtype on U/||U||_F (which puts every
    singular value in (0, 1], the domain the coefficients are designed for) and returns the result
    in compute_dtype with the input's shape. Tall matrices are transposed first so that the Gram
    matrix X X^T is the small side (min(m, n)^2) and the matmuls are cheapest.
    """
    x = updates.unsqueeze(0) if updates.ndim == 2 else updates
    tall = x.shape[-2] > x.shape[-1]
    if tall:
        x = x.mT
    # Normalise in fp32 before the cast so the norm itself carries no bf16 rounding.
    x = x.float()
    x = (x / (torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True) + 1e-7)).to(compute_dtype)
    for a, b, c in coefficients:
        gram = x @ x.mT
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)   # b A + c A^2
        x = torch.baddbmm(x, poly, x, beta=a)                      # a X + (b A + c A^2) X
    if tall:
        # Contiguous, so that later reductions over the result (its norm) sum in the same order
        # whichever path produced it: a transposed view and a gathered copy must give equal bits.
        x = x.mT.contiguous()
    return x.squeeze(0) if updates.ndim == 2 else x


# ---------------------------------------------------------------------------------------------
# MuonH


class MuonH(torch.optim.Optimizer):
    """Muon on the Frobenius sphere ("hyperspherical" Muon), §4.1 / App. E, for 2-D parameters only.

    Per matrix W with gradient G, every step:
        m <- mu m + (1 - mu) G;   U = (1 - mu) G + mu m          (Nesterov, mu = momentum)
        O = orthogonalise(U)
        W <- W - lr R O / ||O||_F                                (so ||dW||_F / ||W||_F = lr)
        W <- R W / ||W||_F                                       (back onto the sphere)
    where R = ||W_0||_F is recorded at the first step. There is no weight decay: on the sphere it
    would only shrink W radially and the projection would undo it (App. E).

    Matrices of equal shape (across all param groups) are orthogonalised as one batched matmul chain (at s = 10,
    r = 4: stacks of 32, 8, 8 and 1). ns_coefficients: "polar_express" (default), "quintic" or an explicit sequence
    of (a, b, c). shard_across_ranks: under torch.distributed with world_size > 1, each rank orthogonalises a
    contiguous share of every shape's stack and the results are all-gathered. The state (the momentum buffer and R)
    is in state_dict(), so a resumed run continues bit for bit.
    """

    def __init__(self, params, lr=BASE_LRS["matrix"], momentum=0.95, ns_coefficients="polar_express",
                 compute_dtype=torch.bfloat16, shard_across_ranks=True):
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"MuonH momentum must be in [0, 1), got {momentum}")
        super().__init__(params, {"lr": lr, "momentum": momentum})
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError(f"MuonH trains 2-D matrices only, got a parameter of shape "
                                     f"{tuple(p.shape)} (give it to AdamW)")
        if isinstance(ns_coefficients, str):
            if ns_coefficients not in NS_COEFFICIENTS:
                raise ValueError(f"ns_coefficients must be one of {'|'.join(NS_COEFFICIENTS)} or a "
                                 f"sequence of (a, b, c), got {ns_coefficients!r}")
            ns_coefficients = NS_COEFFICIENTS[ns_coefficients]
        # Global, not per group: matrices of one shape from different groups share one batch.
        self.ns_coefficients = tuple(tuple(float(v) for v in abc) for abc in ns_coefficients)
        self.compute_dtype = compute_dtype
        self.shard_across_ranks = shard_across_ranks

    def _world(self):
        """(rank, world_size) when the NS work is sharded this step, else (0, 1)."""
        if self.shard_across_ranks and dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1

    @torch.no_grad()
    def step(self, closure=None):
        """One update of every matrix with a gradient, in the three phases below (the class docstring's formulas)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        # 1. Momentum and the Nesterov blend, per matrix; bucket the blended updates by shape. Every rank does this
        # for every matrix, so the momentum state stays replicated and any rank's checkpoint can resume the run.
        buckets = {}  # (shape, device) -> list of (param, group, update U)
        for group in self.param_groups:
            mu = group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                    state["radius"] = torch.linalg.vector_norm(p)  # R = ||W_0||_F, a 0-dim tensor
                momentum = state["momentum_buffer"]
                momentum.lerp_(p.grad, 1 - mu)           # m = mu m + (1 - mu) G
                update = p.grad.lerp(momentum, mu)       # U = (1 - mu) G + mu m
                buckets.setdefault((tuple(p.shape), p.device), []).append((p, group, update))

        # 2. Orthogonalise each shape's stack in one batched chain. Distributed: rank k takes the
        # contiguous chunk k of the stack padded to a multiple of world_size, and an all-gather
        # hands every rank all results. The gathers run asynchronously while later shapes compute.
        rank, world_size = self._world()
        orthogonalised = []  # per bucket: (entries, stacked result, pending gather or None)
        for entries in buckets.values():
            updates = [update for _, _, update in entries]
            if world_size == 1:
                orthogonalised.append((entries, orthogonalise(torch.stack(updates), self.ns_coefficients,
                                                              self.compute_dtype), None))
                continue
            chunk = math.ceil(len(updates) / world_size)
            mine = updates[rank * chunk:(rank + 1) * chunk]
            local = torch.zeros(chunk, *updates[0].shape, dtype=self.compute_dtype, device=updates[0].device)
            if mine:
                local[:len(mine)] = orthogonalise(torch.stack(mine), self.ns_coefficients, self.compute_dtype)
            gathered = torch.empty(chunk * world_size, *local.shape[1:], dtype=local.dtype, device=local.device)
            pending = dist.all_gather_single(gathered, local, async_op=True)
            orthogonalised.append((entries, gathered, pending))

        # 3. Scaled step and projection back onto the sphere, in the parameter's dtype. Identical
        # inputs and identical ops on every rank give bit-identical weights.
        for entries, stacked, pending in orthogonalised:
            if pending is not None:
                pending.wait()
            for (p, group, _), direction in zip(entries, stacked):
                radius = self.state[p]["radius"]
                direction = direction.to(p.dtype)
                # The clamp only matters for an all-zero update (e.g. a zero gradient at the first
                # step), which must leave W unchanged rather than turn it into NaN.
                direction_norm = torch.linalg.vector_norm(direction).clamp_min(1e-30)
                p.sub_(direction * (group["lr"] * radius / direction_norm))
                p.mul_(radius / torch.linalg.vector_norm(p))
        return loss


# ---------------------------------------------------------------------------------------------
# The optimiser pair


def build_optimizers(param_groups, lrs, **muonh_kwargs):
    """(MuonH over param_groups["matrix"], AdamW over every other non-empty group).

    param_groups: {name: [params]} as model.param_groups() returns it (names in GROUP_NAMES).
    lrs: {name: lr}, e.g. from learning_rates(). Each torch param group carries its "name" and its
    base lr as "initial_lr", so the schedule sets group["lr"] = group["initial_lr"] * multiplier.
    Either optimiser is None when it would have no parameters.
    """
    unknown = set(param_groups) - set(GROUP_NAMES)
    if unknown:
        raise ValueError(f"unknown parameter groups {sorted(unknown)}; expected names from {GROUP_NAMES}")
    matrices = list(param_groups.get("matrix", []))
    muon = None
    if matrices:
        muon = MuonH([{"params": matrices, "name": "matrix", "lr": lrs["matrix"],
                       "initial_lr": lrs["matrix"]}], **muonh_kwargs)
    adam_groups = [{"params": list(params), "name": name, "lr": lrs[name], "initial_lr": lrs[name]}
                   for name, params in param_groups.items() if name != "matrix" and len(params)]
    adamw = None
    if adam_groups:
        # Betas, eps and zero weight decay are the paper's AdamW settings (App. E).
        adamw = torch.optim.AdamW(adam_groups, betas=ADAMW_BETAS, eps=ADAMW_EPS, weight_decay=0.0)
    return muon, adamw


# ---------------------------------------------------------------------------------------------
# Learning-rate transfer rule and schedule


def learning_rates(d_model, batch_tokens, tokens, tokens_ref, base_lrs=BASE_LRS, batch_exp=BATCH_EXP,
                   data_exp=DATA_EXP, width_exp=WIDTH_EXP, ref_width=REF_WIDTH, ref_batch=REF_BATCH_TOKENS):
    """Peak learning rate of every parameter group (paper App. E: muP + HyperP).

    MuonH:  base * (B/B0)^batch_exp * (D/D_ref)^(-data_exp). No width factor: the update is
            normalised to a fixed fraction of ||W||_F, which is already width-invariant.
    AdamW:  base * (d/d0)^(-width_exp); embedding and unembedding also * (B/B0)^batch_exp; norms
            and hyperconnections get no batch factor; AdamW gets no data factor.
    tokens_ref (D_ref) comes from flops.reference_horizon(): 1,016,083,200 tokens for looped runs, 983,315,200 for
    r = 1. ref_width / ref_batch (tokens) re-anchor the rule (the CPU grids, as App. E anchors the paper at s = 10).
    App. E.2 checks the transfer: the base LR 0.014 stays within 0.005 nats of each optimum for s in {8, 10, 14} and
    10-40 tokens per parameter.
    """
    if min(d_model, batch_tokens, tokens, tokens_ref, ref_width, ref_batch) <= 0:
        raise ValueError("learning_rates: widths, batch and token counts must be positive")
    batch_factor = (batch_tokens / ref_batch) ** batch_exp
    width_factor = (d_model / ref_width) ** (-width_exp)
    data_factor = (tokens / tokens_ref) ** (-data_exp)
    factors = {"matrix": batch_factor * data_factor,
               "embedding": width_factor * batch_factor,
               "unembedding": width_factor * batch_factor,
               "norm": width_factor,
               "hyper": width_factor}
    unknown = set(base_lrs) - set(factors)
    if unknown:
        raise ValueError(f"no transfer rule for parameter groups {sorted(unknown)}")
    return {name: base * factors[name] for name, base in base_lrs.items()}


def add_lr_args(parser):
    """train.py's LR flags: base LRs at the reference and the transfer rule's exponents and anchors.
    lr_settings(args) turns the parsed flags into (base_lrs, rule) for learning_rates(base_lrs, **rule)."""
    group = parser.add_argument_group("learning rates (base values at the reference; transfer rule applied)")
    for name, lr in BASE_LRS.items():
        group.add_argument(f"--lr-{name}", type=finite_float, default=lr)
    group.add_argument("--batch-exp", type=finite_float, default=BATCH_EXP, help="LR ~ (B/B_ref)^batch_exp")
    group.add_argument("--data-exp", type=finite_float, default=None,
                       help="MuonH LR ~ (D/D_ref)^-data_exp (default: the recipe's, 0.32 iso-depth, 0.40 truncate-or-not)")
    group.add_argument("--width-exp", type=finite_float, default=WIDTH_EXP, help="AdamW LR ~ (d/d_ref)^-width_exp")
    group.add_argument("--ref-width", type=positive_int, default=REF_WIDTH, help="d_ref of the transfer rule")
    group.add_argument("--ref-batch", type=positive_int, default=REF_BATCH_TOKENS, help="B_ref of the transfer rule")
    group.add_argument("--ref-tokens", type=finite_float, default=0,
                       help="D_ref of the transfer rule (0: 10x effective params of the s=10 reference, flops.py)")
    group.add_argument("--final-lr-frac", type=finite_float, default=FINAL_LR_FRAC,
                       help="the LR decay ends at this fraction of the peak")


def lr_settings(args, data_exp=DATA_EXP):
    """(base_lrs, rule) from add_lr_args flags; rule holds the keyword arguments of learning_rates. data_exp: the
    recipe's token exponent (recipe.py), which --data-exp overrides."""
    return ({name: getattr(args, f"lr_{name}") for name in BASE_LRS},
            {"batch_exp": args.batch_exp, "data_exp": data_exp if args.data_exp is None else args.data_exp,
             "width_exp": args.width_exp, "ref_width": args.ref_width, "ref_batch": args.ref_batch})
