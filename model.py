"""
The looped (depth-recurrent) transformer of the iso-depth study, in one readable file.

    tokens -> wte -> norm -> prelude blocks -> e
    s_0 = e;  for t = 1..r:  u_t = inject(e, s_{t-1});  s_t = norm_recur(shared_blocks(u_t))
    s_r -> coda blocks -> norm -> lm_head -> 15 tanh(logits / 15)

A block of `recur` layers is run r times so that the effective depth prelude + r*recur + coda
stays 20 (paper §3.1): r = 4 costs the FLOPs of a plain 20-layer GPT with 2/5 of its parameters.
The layout, parameter counts and FLOPs come from flops.ModelConfig (the single source of truth);
this file only builds and runs it. Blocks follow nanochat's (pre-norm, RoPE then parameter-free
QK-norm, squared-ReLU MLP, no biases, untied embeddings) except the norms: nanochat's RMSNorm has no
parameters, the paper's (Table 4, App. C.1: scales initialised to one) has a learnable scale, as here.

Options, all fixed by ModelConfig:
  injection  linear (W_inj [e; s], init [I|0]) | additive (s + e) | passthrough (s) |
             hyper (loop-level hyperconnections with K lanes, §5.2) |
             gated (g e + (1 - g) s, g = sigmoid(w) per channel, w = 0 at init: the ablation example)
  r_bwd      truncated BPTT: only the last r_bwd loops carry gradient (§5.1)
  forward(..., r=...) evaluates with a different loop count than trained (App. A).
Sampling (the KV cache, generate()) is engine.py's.

"The authors' code" below: nanochat/gpt.py of https://github.com/kschwethelm/looped-lm-scaling (their fork).
"""
import math
import zlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from nanoloop import cpu_attention
from flops import ModelConfig
from nanoloop.fused_loss import LinearSoftcapCrossEntropy
from muonh import GROUP_NAMES

LOGIT_SOFTCAP = 15.0  # nanochat's: logits stay in (-15, 15), computed in fp32
EXIT_CRITERIA = ("kl", "latent")  # ExitRule.criterion
# cpu_attention.py's kernel keeps 16 queries in one vector whatever the head dim, so it beats SDPA only at small
# heads: one layer's fwd + bwd at d = 128 (dev/bench_train.py --attention) ran at 1.88x SDPA's speed at head dim 8
# and 0.81 / 0.74 / 0.71x at 16 / 32 / 64 on one thread (2.01x; 0.98 / 0.70 / 0.52x on two).
KERNEL_MAX_HEAD_DIM = 8
NORM_EPS = 1e-6  # every RMSNorm's, the blocks', the model-level ones and QK-norm
ROPE_BASE = 10000.0  # nanochat's


# ----------------------------------------------------------------------------------------------
# Attention backend: one small function decides, once per device.

def attention_backend(device, head_dim=None):
    """('fa3', fn) on Hopper with FlashAttention-3, ('fa2', fn) with FlashAttention-2 installed, ('cpu', fn) on
    CPU with cpu_attention.py's kernel built where it is the faster one (head_dim, None: any), else ('sdpa', None):
    PyTorch's scaled_dot_product_attention."""
    device = torch.device(device)
    small_heads = head_dim is None or head_dim <= KERNEL_MAX_HEAD_DIM
    if device.type == "cpu" and small_heads and cpu_attention.available():
        return "cpu", cpu_attention.causal_attention
    if device.type != "cuda" or not torch.cuda.is_available():
        return "sdpa", None
    if torch.cuda.get_device_capability(device)[0] == 9:
        try:
            from flash_attn_interface import flash_attn_func  # FA3 builds only for sm90
            return "fa3", flash_attn_func
        except ImportError:
            pass
    try:
        from flash_attn import flash_attn_func
        return "fa2", flash_attn_func
    except ImportError:
        return "sdpa", None


def causal_attention(q, k, v, backend):
    """q, k, v: (B, T, H, D). Standard 1/sqrt(D) scale, causal mask."""
    name, kernel = backend
    if name == "cpu" and v.dtype == torch.float32:
        return kernel(q, k, v)  # ~2x PyTorch's CPU kernel at head dim 8 (cpu_attention.py; bf16 takes SDPA)
    if name in ("sdpa", "cpu"):
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True)
        return y.transpose(1, 2)
    # FlashAttention wants half precision; QK-norm may have produced fp32 under autocast.
    dtype = v.dtype if v.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
    y = kernel(q.to(dtype), k.to(dtype), v.to(dtype), causal=True)
    y = y[0] if isinstance(y, tuple) else y  # some FA3 versions also return the softmax LSE
    return y.to(v.dtype)


def embedding_dtype(device_type):
    """dtype of the token embedding's output: bf16 under bf16 autocast (the GPU default), as App. C.1's embeddings are
    "cast to bf16" (the authors' code casts wte itself on CUDA); otherwise None (keep the weight's dtype, so CPU/fp32
    is unchanged). nn.Embedding is not autocast, so the stream would otherwise start fp32."""
    if torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) == torch.bfloat16:
        return torch.bfloat16
    return None


# ----------------------------------------------------------------------------------------------
# Building blocks

class RMSNorm(nn.Module):
    """RMSNorm with a learnable scale (init 1). Trained by AdamW in the 'norm' group."""

    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # In the input's dtype (a no-op in fp32): the bf16 embedding stream stays bf16 on GPU.
        return F.rms_norm(x, (x.size(-1),), self.weight.to(x.dtype), NORM_EPS)


def rope_tables(seq_len, head_dim, device):
    """cos/sin of shape (T, 1, D/2) for rotate-halves RoPE with base 10000."""
    inv_freq = 1.0 / ROPE_BASE ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32, device=device), inv_freq)
    return angles.cos()[:, None, :], angles.sin()[:, None, :]


def apply_rope(x, cos, sin):
    """Rotate the two halves of every head: (x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos)."""
    half = x.size(-1) // 2
    x1, x2 = x[..., :half], x[..., half:]
    if cos.dim() == 3:  # a (T_max, 1, D/2) table from position 0; engine.KVCache.begin's (B, T, 1, D/2) are per row
        cos, sin = cos[: x.size(1)], sin[: x.size(1)]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    """Causal multi-head self-attention, no GQA (§4.1, Table 4): RoPE, then parameter-free QK-norm, then the kernel."""

    def __init__(self, cfg):
        super().__init__()
        d = cfg.d_model
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.c_q = nn.Linear(d, d, bias=False)
        self.c_k = nn.Linear(d, d, bias=False)
        self.c_v = nn.Linear(d, d, bias=False)
        self.c_proj = nn.Linear(d, d, bias=False)

    def forward(self, x, rope, backend, cache=None):
        B, T, d = x.shape
        H, D = self.n_head, self.head_dim
        # q, k and v in one matmul over x (one pass instead of three; the same FLOPs). They stay three
        # matrices because MuonH orthogonalises each on its own (§4.1).
        w_qkv = torch.cat([self.c_q.weight, self.c_k.weight, self.c_v.weight])
        qkv = F.linear(x, w_qkv)
        qk = qkv[..., : 2 * d].view(B, T, 2 * H, D)  # q's heads, then k's: RoPE and QK-norm treat them alike
        v = qkv[..., 2 * d:].view(B, T, H, D)
        qk = apply_rope(qk, *rope)
        # Parameter-free QK-norm after RoPE (nanochat): bounds the attention logits, which matters
        # when the same weights see the state r times.
        qk = F.rms_norm(qk, (D,), eps=NORM_EPS)
        q, k = qk[:, :, :H], qk[:, :, H:]
        if cache is None:
            y = causal_attention(q, k, v, backend)  # training and forward(): the causal kernel
        else:
            y = cache.attend(q, k, v)
        return self.c_proj(y.reshape(B, T, d))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg.d_model
        self.c_fc = nn.Linear(d, 4 * d, bias=False)
        self.c_proj = nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        return self.c_proj(F.relu(self.c_fc(x)).square())  # squared ReLU


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg):
        super().__init__()
        self.norm_1, self.attn = RMSNorm(cfg.d_model), Attention(cfg)
        self.norm_2, self.mlp = RMSNorm(cfg.d_model), MLP(cfg)

    def forward(self, x, rope, backend, cache=None):
        x = x + self.attn(self.norm_1(x), rope, backend, cache)
        return x + self.mlp(self.norm_2(x))


@dataclass(frozen=True)
class ExitRule:
    """Adaptive depth (Huginn's per-token exit, Geiping et al. 2025): a token stops looping after loop t once t >=
    max(2, min_loops) and its criterion falls below `threshold`; no token runs more than max_loops (0: the trained
    r). "kl": the KL divergence between the next-token distributions of loops t and t - 1 (the coda reads every
    loop's state: a probe); "latent": the state's relative change ||s_t - s_(t-1)|| / ||s_t||, no probe.
    Threshold 0 never exits: the fixed-r model."""
    criterion: str = "kl"
    threshold: float = 0.0
    min_loops: int = 1
    max_loops: int = 0

    def __post_init__(self):
        if self.criterion not in EXIT_CRITERIA or not self.threshold >= 0 or self.min_loops < 1 or self.max_loops < 0:
            raise ValueError(f"exit rule: criterion one of {'|'.join(EXIT_CRITERIA)}, threshold >= 0, min loops >= 1, "
                             f"max loops >= 0 (0: the trained r); got {self.criterion}, {self.threshold}, "
                             f"{self.min_loops}, {self.max_loops}")


class LoopWeights(nn.Module):
    """One loop's own weights in the untied model (Truncate or Not? App. E.2): a copy of the shared block, of W_inj
    and of the loop norm, under the names GPT gives its shared ones, so that one code path runs either."""

    def __init__(self, cfg):
        super().__init__()
        self.recur = nn.ModuleList(Block(cfg) for _ in range(cfg.recur))
        self.norm_recur = RMSNorm(cfg.d_model)
        if cfg.injection == "linear":
            self.w_inj = nn.Linear(2 * cfg.d_model, cfg.d_model, bias=False)


# ----------------------------------------------------------------------------------------------
# The looped model

class GPT(nn.Module):
    """The looped model of the module docstring: prelude, a shared block of `recur` layers run r times behind the
    injection, coda. cfg (flops.ModelConfig) fixes every shape, so flops.py counts exactly its parameters and FLOPs."""

    def __init__(self, cfg: ModelConfig, seed=0, draws="global"):
        super().__init__()
        self.cfg = cfg
        d, K = cfg.d_model, cfg.hc_lanes
        self.wte = nn.Embedding(cfg.padded_vocab, d)  # untied from lm_head: each has its own AdamW LR
        self.norm_embed = RMSNorm(d)  # model-level norm 1 of 3 (App. C.1): the embedding's
        self.prelude = nn.ModuleList(Block(cfg) for _ in range(cfg.prelude))
        self.recur = nn.ModuleList(Block(cfg) for _ in range(cfg.recur))  # shared by all r loops
        self.coda = nn.ModuleList(Block(cfg) for _ in range(cfg.coda))
        self.norm_recur = RMSNorm(d)  # 2 of 3: ends every recurrence, keeps the state's scale fixed
        self.norm_final = RMSNorm(d)  # 3 of 3: before lm_head
        self.lm_head = nn.Linear(d, cfg.padded_vocab, bias=False)
        if cfg.injection == "linear":
            self.w_inj = nn.Linear(2 * d, d, bias=False)  # u = W_inj [e; s]
        if cfg.injection == "gated":
            self.inj_gate = nn.Parameter(torch.zeros(d))  # w: the gate g = sigmoid(w), one per channel
        if cfg.injection == "hyper":
            # Per recurrence step t its own (unshared) lane read-out alpha_t, lane mix M_t and
            # write-in beta_t (§5.2). Tiny, so AdamW trains them ('hyper' group).
            self.hc_alpha = nn.Parameter(torch.zeros(cfg.r, K))
            self.hc_mix = nn.Parameter(torch.zeros(cfg.r, K, K))
            self.hc_beta = nn.Parameter(torch.zeros(cfg.r, K))
        # Untied (App. E.2): loops 2..r get their own block, W_inj and norm; loop 1 keeps the shared names.
        copies = cfg.r - 1 if cfg.untied else 0
        self.untied_loops = nn.ModuleList(LoopWeights(cfg) for _ in range(copies))
        cos, sin = rope_tables(cfg.seq_len, cfg.head_dim, None)
        self.register_buffer("rope_cos", cos, persistent=False)  # rebuilt from cfg, never checkpointed
        self.register_buffer("rope_sin", sin, persistent=False)
        self.backend = ("sdpa", None)  # set_device_backend picks the device's kernel (train.py, runs.load_run_model)
        self.init_weights(seed if draws == "by-name" else None)

    @torch.no_grad()
    def init_weights(self, seed=None):
        """App. C.1. No zero-initialised output projections: MuonH keeps every matrix on the
        sphere of its initial Frobenius norm, so a zero matrix would stay zero forever. Random draws come from
        the global RNG, or with a seed from each weight's own generator (draw_generator)."""
        d = self.cfg.d_model
        nn.init.normal_(self.wte.weight, mean=0.0, std=1.0, generator=self.draw_generator(self.wte.weight, seed))
        nn.init.normal_(self.lm_head.weight, mean=0.0, std=1e-3,  # near-zero logits: the first loss is ~ln V
                        generator=self.draw_generator(self.lm_head.weight, seed))
        a, a_proj = math.sqrt(3 / d), math.sqrt(3 / (4 * d))
        for block in self.blocks():
            for projection in (block.attn.c_q, block.attn.c_k, block.attn.c_v, block.attn.c_proj, block.mlp.c_fc):
                nn.init.uniform_(projection.weight, -a, a, generator=self.draw_generator(projection.weight, seed))
            nn.init.uniform_(block.mlp.c_proj.weight, -a_proj, a_proj,  # fan-in 4d
                             generator=self.draw_generator(block.mlp.c_proj.weight, seed))
        for module in self.modules():
            if isinstance(module, RMSNorm):
                module.weight.fill_(1.0)
        for t in range(self.cfg.r if self.cfg.injection == "linear" else 0):
            # [I | 0]: at init u = e, so the loop starts as a re-read of the prelude output (each untied copy too).
            w_inj = self.loop_weights(t).w_inj.weight
            w_inj.zero_()
            w_inj[:, :d].copy_(torch.eye(d))
        if self.cfg.injection == "gated":
            self.inj_gate.zero_()  # g = 1/2: the loop starts by reading e and the state equally
        if self.cfg.injection == "hyper":
            K = self.cfg.hc_lanes
            steps = torch.arange(self.cfg.r)
            self.hc_alpha.zero_()
            self.hc_alpha[steps, steps % K] = 1.0  # step t reads lane t mod K
            self.hc_mix.copy_(torch.eye(K).expand(self.cfg.r, K, K))
            self.hc_beta.fill_(1.0)

    def draw_generator(self, weight, seed):
        """The generator weight's initial draw comes from: None (the global RNG, whose state depends on every module
        built before: how every committed run was drawn) without a seed, else one of its own seeded by (seed, its
        parameter name) (train.py --init-draws by-name). Then a variant that adds or drops a module starts every
        module it shares with its base exactly as the base does: common random numbers, so an ablation's pairs
        share their start (dev/README.md, "Common initial draws": for gated injection they do not stay together)."""
        if seed is None:
            return None
        name = next(name for name, p in self.named_parameters() if p is weight)
        return torch.Generator(weight.device).manual_seed(zlib.crc32(f"{seed}:{name}".encode()))

    def blocks(self):
        """Every transformer block the model holds, prelude, loop (each untied copy) and coda: what init_weights
        initialises and CPU --compile compiles (runs.compile_or_eager)."""
        copies = [block for loop in self.untied_loops for block in loop.recur]
        return [*self.prelude, *self.recur, *copies, *self.coda]

    def loop_weights(self, t):
        """The module holding loop t's block, W_inj and norm (t from 0): the model itself when tied (every loop
        shares them), else loop t's own copy; beyond the trained r the last copy (as hyper reuses its last step)."""
        if not self.cfg.untied or t == 0:
            return self
        return self.untied_loops[min(t, self.cfg.r - 1) - 1]

    def set_device_backend(self, device):
        """Choose the attention kernel for the device the model lives on (attention_backend); returns its name."""
        self.backend = attention_backend(device, self.cfg.head_dim)
        return self.backend[0]

    def param_groups(self):
        """{group: [parameters]} for the optimisers (§4.1, App. E): MuonH trains 'matrix', AdamW the rest.
        Every parameter is claimed by name in optimizer_group; one that no rule claims is an error."""
        groups = {name: [] for name in GROUP_NAMES}
        modules = dict(self.named_modules())
        for name, param in self.named_parameters():
            owner = modules[name.rpartition(".")[0]]
            groups[self.optimizer_group(name, owner)].append(param)
        return groups

    def optimizer_group(self, name, owner):
        """The group of parameter `name` (its module `owner`). A new parameter needs its line here."""
        if name == "wte.weight":
            return "embedding"
        if name == "lm_head.weight":
            return "unembedding"
        if isinstance(owner, nn.Linear):
            return "matrix"  # MuonH: the blocks' matrices and W_inj
        if isinstance(owner, RMSNorm):
            return "norm"
        if name in ("hc_alpha", "hc_mix", "hc_beta", "inj_gate"):
            # The loop-level mixing weights, tiny: AdamW at the hyperconnections' LR (§5.2). The gate is one:
            # a per-channel mix of e and the state like their lane read-out; the norms' LR (15x this on the
            # CPU grids) suits scales sitting at 1, not gate logits that start at 0 and saturate past +-5.
            return "hyper"
        raise ValueError(f"parameter {name} belongs to no optimiser group: name its group in "
                         f"GPT.optimizer_group (model.py)")

    # -- the recurrence ------------------------------------------------------------------------

    def initial_state(self, e):
        """s_0 (App. C.2): e itself, zeros for additive (so u_1 = e), or N(0, 1) with --random-state-init."""
        if self.cfg.random_state_init:  # Huginn-style ablation (App. C.2): redrawn every forward
            return torch.randn_like(e)
        return torch.zeros_like(e) if self.cfg.injection == "additive" else e

    def inject(self, e, s, weights=None):
        """u_t from the prelude output e and the previous state s (§3.1); `weights`: the loop's own W_inj (untied),
        else the shared one."""
        weights = weights or self
        if self.cfg.injection == "linear":
            return weights.w_inj(torch.cat([e, s], dim=-1))
        if self.cfg.injection == "additive":
            return s + e
        if self.cfg.injection == "gated":
            gate = torch.sigmoid(self.inj_gate)
            return gate * e + (1 - gate) * s
        return s  # passthrough, and the plain r = 1 stack ("none")

    def run_shared(self, u, rope, cache=None, weights=None):
        """One recurrence: the shared layers on u, then norm_recur, so every state has the same scale (App. C.1).
        `weights`: the loop's own copy of both (untied), else the shared ones."""
        weights = weights or self
        for block in weights.recur:
            u = block(u, rope, self.backend, cache)
        return weights.norm_recur(u)

    def recurrence(self, e, r, r_bwd, rope, cache=None):
        """Run r loops; only the last r_bwd build an autograd graph (truncated BPTT, §5.1)."""
        if self.cfg.injection == "hyper":
            return self.hyper_recurrence(e, r, rope, cache)
        grad_on = torch.is_grad_enabled()  # off in evaluation and sampling: then no loop builds a graph
        s = self.initial_state(e)
        for t in range(r):
            # Early loops run under no_grad: no activations kept, no backward FLOPs. Their output
            # enters the first trained loop as a plain tensor, so e and the shared weights get
            # gradient only through the last r_bwd loops.
            weights = self.loop_weights(t)
            with torch.set_grad_enabled(grad_on and t >= r - r_bwd):
                s = self.run_shared(self.inject(e, s, weights), rope, cache, weights)
        return s

    def adaptive_recurrence(self, e, rope, rule, cache):
        """The recurrence with a per-token exit (ExitRule). Every token of the batch runs each loop until all have
        exited, but an exited token keeps its state, and the cache (engine.KVCache, which this needs) hands later
        tokens its keys of the loop it exited at. Each token's loop count goes to cache.loops."""
        if self.cfg.injection == "hyper":
            raise ValueError("adaptive exit needs a state injection, not hyperconnections' lanes")
        s = self.initial_state(e)
        active = torch.ones(e.shape[:2], dtype=torch.bool, device=e.device)
        loops = torch.zeros(e.shape[:2], dtype=torch.long, device=e.device)
        previous = None  # the last loop's state (latent) or next-token log-probabilities (kl)
        for t in range(rule.max_loops or self.cfg.r):
            cache.active = active
            weights = self.loop_weights(t)
            s = torch.where(active[..., None], self.run_shared(self.inject(e, s, weights), rope, cache, weights), s)
            loops += active
            signal = self.probe(s, rope, cache) if rule.criterion == "kl" else s
            if previous is not None and t + 1 >= rule.min_loops:
                active = active & (exit_criterion(rule.criterion, signal, previous) >= rule.threshold)
            previous = signal
            if not active.any():
                cache.skip_loops(t + 1)  # the loops left: every token holds its last keys
                break
        cache.active, cache.loops = None, loops
        return s

    def probe(self, s, rope, cache):
        """Next-token log-probabilities of a loop's state: the coda and head on it, through the cache's probe slots."""
        for block in self.coda:
            s = block(s, rope, self.backend, cache)
        return F.log_softmax(self.softcapped_logits(self.norm_final(s)), dim=-1)

    def hyper_recurrence(self, e, r, rope, cache=None):
        """Loop-level hyperconnections: K lanes start as e; step t reads u = sum_k alpha_t[k] lane_k,
        runs the block, and writes lanes <- M_t lanes + beta_t (x) s. The coda reads the lane sum.
        All three are matmuls on the flattened lanes, so flops.py counts them as (K^2 + 2K) d."""
        K, shape = self.cfg.hc_lanes, e.shape
        # The lanes accumulate r block outputs, so they stay fp32 under autocast (the lane arithmetic runs with
        # autocast off) and the coda reads an fp32 sum; the authors' code keeps fp32 lanes too (its fp32 beta_t
        # promotes them). On CPU/fp32 every .float() is a no-op and the result is unchanged bit for bit.
        lanes = e.float().reshape(1, -1).expand(K, -1)
        for t in range(r):
            step = min(t, self.cfg.r - 1)  # beyond the trained r (r_eval > r) reuse the last step
            with torch.autocast(e.device.type, enabled=False):
                u = (self.hc_alpha[step].float()[None] @ lanes).view(shape)
            s = self.run_shared(u, rope, cache)
            with torch.autocast(e.device.type, enabled=False):
                lanes = (self.hc_mix[step].float() @ lanes
                         + self.hc_beta[step].float()[:, None] @ s.float().reshape(1, -1))
        return lanes.sum(0).view(shape)

    def forward(self, idx, targets=None, r=None, r_bwd=None):
        """idx (B, T) token ids. Returns mean cross-entropy (nats/token) if targets are given, else fp32 logits
        (B, T, vocab). `r` overrides the loop count (only r = the trained r keeps its truncation, r_bwd); `r_bwd`
        sets the loops with gradient for it (a sampled loop count's step, nanoloop/loops.py)."""
        cfg = self.cfg
        r = cfg.r if r is None else r
        if r_bwd is None:
            r_bwd = cfg.r_bwd if r == cfg.r else r
        if idx.size(1) > self.rope_cos.size(0):
            raise ValueError(f"sequence of {idx.size(1)} tokens is longer than seq_len={self.rope_cos.size(0)}")
        h = self.final_hidden(idx, r, r_bwd, (self.rope_cos, self.rope_sin))
        if targets is not None and h.device.type == "cpu" and not torch.is_autocast_enabled("cpu"):
            # fp32 on CPU (the CPU grids): the fused loss. On GPU torch.compile fuses the formula below.
            return LinearSoftcapCrossEntropy.apply(h.flatten(0, 1), self.lm_head.weight, targets.flatten(),
                                                   cfg.vocab_size, LOGIT_SOFTCAP)
        logits = self.softcapped_logits(h)
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))

    def final_hidden(self, idx, r, r_bwd, rope, cache=None, exit_rule=None):
        """The normed last hidden state (B, T, d) of idx at r loops; `cache` (an engine.KVCache) when sampling;
        exit_rule (ExitRule, with a cache): each token's own loop count instead of r."""
        x = self.norm_embed(self.wte(idx).to(embedding_dtype(idx.device.type) or self.wte.weight.dtype))
        for block in self.prelude:
            x = block(x, rope, self.backend, cache)
        if exit_rule is None:
            x = self.recurrence(x, r, r_bwd, rope, cache)
        else:
            x = self.adaptive_recurrence(x, rope, exit_rule, cache)
        for block in self.coda:
            x = block(x, rope, self.backend, cache)
        return self.norm_final(x)

    def softcapped_logits(self, h):
        """fp32 logits (B, T, vocab) of the hidden state h, soft-capped at 15: 15 tanh(z / 15)."""
        logits = self.lm_head(h).float()
        logits = LOGIT_SOFTCAP * torch.tanh(logits / LOGIT_SOFTCAP)  # soft-cap in fp32
        return logits[..., : self.cfg.vocab_size]  # the padding rows never win a softmax


def exit_criterion(criterion, now, before):
    """Per token, how much the last loop changed it: KL(p_t || p_(t-1)) of next-token log-probabilities (clamped
    at 0 against rounding), or the state's relative change ||s_t - s_(t-1)|| / ||s_t||."""
    if criterion == "kl":
        return (now.exp() * (now - before)).sum(-1).clamp_min(0.0)
    return (now - before).norm(dim=-1) / now.norm(dim=-1).clamp_min(1e-12)
