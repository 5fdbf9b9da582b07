"""
Sampled recurrence depth: the loop count T of each training step drawn from a distribution, gradients through
the last B of them (train.py --loops). A model trained at one fixed r does not use more loops at test time
(dev/results/loop-curves); Huginn (Geiping et al. 2025, arXiv 2502.05171, §3.3) draws T per step from a Poisson
log-normal and backpropagates through the last k loops, which in Truncate or Not?'s terms is a sampled T with a
fixed B; the iso-depth authors' nanochat fork samples r the same way.

  fixed              T = r every step: every run before this module, and the default (its run_id unchanged)
  poisson-lognormal  T = 1 + K, K ~ Poisson(lam), ln lam ~ N(ln(mean - 1) - SIGMA^2 / 2, SIGMA): E[T] = mean,
                     capped at --loops-max (the mass above piles on it). Huginn writes the same law as
                     r ~ P(e^tau) + 1 with E[e^tau] its r-bar, i.e. our mean - 1.
  uniform            T uniform on --loops-min .. --loops-max

B = min(--r-bwd, T) when --r-bwd is given, else T (full BPTT of the drawn loops). One draw per optimiser step
from (seed, step) alone, so every rank and micro-batch of a step runs the same T and --resume redraws the same.
Compute (Truncate or Not? App. D.1): a step of T loops, B trained, costs F(T, B) per token (flops.flops_per_token
of the layout at r = T, r_bwd = B); a FLOP budget buys steps at the expectation E[F(T, min(B, T))] of the capped
distribution, computed exactly from its probabilities (pmf), and the row records what the drawn loops spent.

    loops = LoopCounts("poisson-lognormal", mean=4, high=16)
    T = draw(loops, seed=0, step=17, r=4)             # the same on every rank
    F = expected_flops_per_token(cfg, loops)          # what --flops divides by
"""
import functools
import math
import random
from dataclasses import dataclass, replace

import flops

DISTRIBUTIONS = ("fixed", "poisson-lognormal", "uniform")
SIGMA = 0.5       # Huginn's spread of ln lam
QUADRATURE = 2001  # points of the normal integral in pmf (Simpson's rule over +-10 sd: error < 1e-12)


@dataclass(frozen=True)
class LoopCounts:
    """A loop-count distribution, as train.py's --loops flags describe it."""
    kind: str = "fixed"
    mean: float = 0.0   # poisson-lognormal: E[T] before the cap (> 1)
    low: int = 0        # uniform: the smallest T
    high: int = 0       # the largest T (uniform's top, poisson-lognormal's cap)
    r_bwd: int = 0      # B: the loops with gradient, min(B, T); 0: all T

    def identity(self):
        """The run identity's "loops" entry (a fixed r has none: every earlier run_id stays)."""
        return {"kind": self.kind, "mean": self.mean, "low": self.low, "high": self.high, "r_bwd": self.r_bwd}


def add_loop_args(parser):
    """train.py's loop-count flags (a fixed r unless --loops says otherwise)."""
    group = parser.add_argument_group("sampled recurrence depth (a loop count T drawn per step; nanoloop/loops.py)")
    group.add_argument("--loops", default="fixed", choices=DISTRIBUTIONS,
                       help="fixed: T = --r every step; poisson-lognormal: Huginn's, mean --loops-mean, capped at "
                            "--loops-max; uniform: --loops-min .. --loops-max. B = min(--r-bwd, T), else T")
    group.add_argument("--loops-mean", type=float, default=None, help="E[T] of poisson-lognormal (> 1)")
    group.add_argument("--loops-min", type=int, default=1, help="uniform's smallest T")
    group.add_argument("--loops-max", type=int, default=32, help="the largest T (uniform's top, the cap)")


def loop_counts_from_args(args):
    """The LoopCounts of train.py's flags; ValueError (one line) for a distribution that cannot be drawn."""
    if args.loops == "fixed":
        return LoopCounts()
    r_bwd = args.r_bwd or 0
    if args.loops == "uniform":
        if not 1 <= args.loops_min <= args.loops_max:
            raise ValueError(f"--loops uniform needs 1 <= --loops-min <= --loops-max, got {args.loops_min} and "
                             f"{args.loops_max}")
        return LoopCounts("uniform", low=args.loops_min, high=args.loops_max, r_bwd=r_bwd)
    if not (args.loops_mean is not None and 1 < args.loops_mean < args.loops_max):
        raise ValueError(f"--loops poisson-lognormal needs 1 < --loops-mean < --loops-max, got {args.loops_mean} "
                         f"and {args.loops_max}")
    return LoopCounts("poisson-lognormal", mean=args.loops_mean, low=1, high=args.loops_max, r_bwd=r_bwd)


def check_loops_fit(loops, cfg):
    """ValueError (one line) unless the model can run any drawn loop count: one shared block and one state (not
    hyperconnections' per-step lanes, the untied model's per-loop blocks or the plain r = 1 stack)."""
    if loops.kind == "fixed" or (cfg.injection not in ("hyper", "none") and not cfg.untied):
        return
    model = f"--injection {cfg.injection}"
    if cfg.untied:
        model = "the untied model"
    if cfg.injection == "none":
        model = "the plain r = 1 stack"
    raise ValueError(f"--loops {loops.kind} draws a loop count per step, which needs one shared block and state "
                     f"(injection linear, additive, gated or passthrough): not {model}")


def poisson_lognormal(k, mean):
    """P(K = k) for K ~ Poisson(lam), ln lam ~ N(ln(mean) - SIGMA^2 / 2, SIGMA): the normal integral by Simpson's
    rule in the standard normal variable z."""
    mu = math.log(mean) - SIGMA ** 2 / 2
    lo, hi = -10.0, 10.0
    h = (hi - lo) / (QUADRATURE - 1)
    total = 0.0
    for i in range(QUADRATURE):
        z = lo + i * h
        weight = 4 if i % 2 else 2
        if i in (0, QUADRATURE - 1):
            weight = 1
        lam = math.exp(mu + SIGMA * z)
        log_poisson = k * math.log(lam) - lam - math.lgamma(k + 1)
        total += weight * math.exp(log_poisson - z * z / 2)
    return total * h / 3 / math.sqrt(2 * math.pi)


@functools.lru_cache(maxsize=None)  # once per distribution: a draw per step would otherwise redo the quadrature
def pmf(loops, r):
    """{T: P(T)} of the capped distribution (a fixed run: {r: 1}); callers read it, never change it."""
    if loops.kind == "fixed":
        return {r: 1.0}
    if loops.kind == "uniform":
        n = loops.high - loops.low + 1
        return {t: 1.0 / n for t in range(loops.low, loops.high + 1)}
    probs = {t: poisson_lognormal(t - 1, loops.mean - 1) for t in range(1, loops.high)}
    probs[loops.high] = max(0.0, 1.0 - sum(probs.values()))  # the mass above the cap
    return probs


def draw(loops, seed, step, r):
    """The loop count of optimiser step `step` (0-based): inverse CDF of pmf at a uniform drawn from (seed, step)
    alone, the same on every rank and after every resume."""
    if loops.kind == "fixed":
        return r
    u = random.Random(f"nanoloop-loops:{seed}:{step}").random()
    cumulative = 0.0
    probs = pmf(loops, r)
    for t, p in probs.items():
        cumulative += p
        if u < cumulative:
            return t
    return max(probs)


def backward_loops(loops, cfg, t):
    """B of a step of t loops: cfg.r_bwd for a fixed run, min(--r-bwd, t) or t for a sampled one."""
    if loops.kind == "fixed":
        return cfg.r_bwd
    if loops.r_bwd:
        return min(loops.r_bwd, t)
    return t


def step_flops_per_token(cfg, loops, t):
    """F(t, B) per token: the layout of cfg run for t loops, B of them trained (flops.flops_per_token)."""
    return flops.flops_per_token(step_config(cfg, loops, t))


def mean_loops(loops, r):
    """The whole loop count nearest E[T]: a sampled run's default at test time (r for a fixed one)."""
    return round(sum(t * p for t, p in pmf(loops, r).items()))


def step_text(loops, cfg, seed, step):
    """The progress line's end for step `step`: " | T 5 (B 2)", or "" for a fixed loop count."""
    if loops.kind == "fixed":
        return ""
    t = draw(loops, seed, step, cfg.r)
    return f" | T {t} (B {backward_loops(loops, cfg, t)})"


def step_config(cfg, loops, t):
    """The model config of a step of t loops, B of them trained: cfg itself for a fixed run."""
    if loops.kind == "fixed":
        return cfg
    return replace(cfg, r=t, r_bwd=backward_loops(loops, cfg, t))


def expected_measured_flops(cfg, loops, tokens, steps):
    """Truncate or Not?'s measured compute (flops.measured_flops: the matmuls, and the optimiser's steps, the same
    for every T) in expectation over the loop counts."""
    return sum(p * flops.measured_flops(step_config(cfg, loops, t), tokens, steps)
               for t, p in pmf(loops, cfg.r).items())


def expected_flops_per_token(cfg, loops):
    """E[F(T, min(B, T))] over the capped distribution: what a FLOP budget divides by."""
    return sum(p * step_flops_per_token(cfg, loops, t) for t, p in pmf(loops, cfg.r).items())


def realised_flops_per_token(cfg, loops, seed, steps):
    """The mean F of the loops steps 0 .. steps - 1 drew (redrawn: a draw is a function of seed and step)."""
    total = sum(step_flops_per_token(cfg, loops, draw(loops, seed, step, cfg.r)) for step in range(steps))
    return total / max(1, steps)
