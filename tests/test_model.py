"""The looped transformer, as the paper describes it (§3.1, §5, App. C): each test is one claim."""
import math
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import flops
from flops import INJECTIONS, ModelConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dev"))
from bench_model import activation_bytes  # noqa: E402 (dev/: the memory truncated BPTT saves, as measured there)
from nanoloop.engine import generate  # noqa: E402
from model import (GPT, apply_rope, attention_backend, causal_attention, embedding_dtype,  # noqa: E402
                   rope_tables)


def tiny(**kw):
    base = dict(r=4, scale=2, head_dim=32, vocab_size=300, seq_len=32)
    base.update(kw)
    return ModelConfig(**base)


def make(seed=0, **kw):
    torch.manual_seed(seed)
    return GPT(tiny(**kw))


def tokens(n=2, T=32, seed=1, vocab=300):
    return torch.randint(0, vocab, (n, T), generator=torch.Generator().manual_seed(seed))


def shared_block_calls(model):
    """Record, for every call of the shared block, whether its input carries autograd history."""
    calls = []
    handle = model.recur[0].register_forward_pre_hook(lambda mod, args: calls.append(args[0].requires_grad))
    return calls, handle


def off_init(model, scale=0.05, seed=3):
    """Move every weight off its init (W_inj = [I|0], alpha one-hot, M = I, beta = 1 make loops degenerate)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator))
    return model


def run_blocks(model, blocks, x):
    rope = (model.rope_cos, model.rope_sin)
    for block in blocks:
        x = block(x, rope, model.backend)
    return x


def one_loop(model, u):
    """One recurrence: the shared block, then the recurrent RMSNorm (§3.1)."""
    return model.norm_recur(run_blocks(model, model.recur, u))


def head(model, x):
    """Coda, final norm, lm_head, the soft-cap at 15, the padding columns cut."""
    logits = model.lm_head(model.norm_final(run_blocks(model, model.coda, x))).float()
    return (15 * torch.tanh(logits / 15))[..., :model.cfg.vocab_size]


def forward_by_hand(model, idx, r):
    """The looped forward of §3.1 / §5.2 written out loop by loop, for any loop count r (App. A):
    e = prelude(norm(wte(idx))); s_0 = e (0 for additive); u_t = inject(e, s_{t-1}); s_t = norm(shared(u_t)).
    Hyperconnections: K lanes start as e; step t (the trained r's last step beyond it) reads
    u = sum_k alpha_t[k] lane_k and writes lane_k <- sum_j M_t[k, j] lane_j + beta_t[k] s; the coda reads the sum."""
    cfg = model.cfg
    e = run_blocks(model, model.prelude, model.norm_embed(model.wte(idx)))
    if cfg.injection == "hyper":
        K = cfg.hc_lanes
        lanes = [e] * K
        for t in range(r):
            p = min(t, cfg.r - 1)
            s = one_loop(model, sum(model.hc_alpha[p, k] * lanes[k] for k in range(K)))
            lanes = [sum(model.hc_mix[p, k, j] * lanes[j] for j in range(K)) + model.hc_beta[p, k] * s
                     for k in range(K)]
        return head(model, sum(lanes))
    s = torch.zeros_like(e) if cfg.injection == "additive" else e
    for _ in range(r):
        if cfg.injection == "linear":
            u = torch.cat([e, s], dim=-1) @ model.w_inj.weight.T
        elif cfg.injection == "additive":
            u = s + e
        elif cfg.injection == "passthrough":
            u = s
        elif cfg.injection == "gated":
            g = 1 / (1 + torch.exp(-model.inj_gate))
            u = g * e + (1 - g) * s
        else:
            raise AssertionError(f"forward_by_hand has no rule for injection {cfg.injection!r}: write its math here")
        s = one_loop(model, u)
    return head(model, s)


def rope_by_hand(x, base=10000.0):
    """RoPE on (B, T, H, D) written from its definition, in float64: at position t the pair (x_i, x_{i+D/2})
    is rotated by the angle t * base^(-2i/D)."""
    D = x.size(-1)
    half = D // 2
    t = torch.arange(x.size(1), dtype=torch.float64)[:, None]
    angle = t * torch.tensor([base ** (-2 * i / D) for i in range(half)], dtype=torch.float64)[None, :]
    cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]
    a, b = x[..., :half].double(), x[..., half:].double()
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def rms_by_hand(x, weight=None):
    y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    return y if weight is None else y * weight


def block_by_hand(block, x, head_dim):
    """nanochat's block from its definition: x + attn(norm(x)), then x + W_2 relu(W_1 norm(x))^2, where attn
    rotates q and k by RoPE, RMS-normalises each head of q and k (QK-norm, no parameters) and takes the
    causal softmax of q.k / sqrt(head_dim)."""
    B, T, d = x.shape
    H = d // head_dim
    attn = block.attn
    h = rms_by_hand(x, block.norm_1.weight)
    q, k, v = ((h @ lin.weight.T).view(B, T, H, head_dim) for lin in (attn.c_q, attn.c_k, attn.c_v))
    q, k = rms_by_hand(rope_by_hand(q)).float(), rms_by_hand(rope_by_hand(k)).float()
    scores = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(head_dim)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = torch.einsum("bhts,bshd->bthd", scores.softmax(-1), v).reshape(B, T, d) @ attn.c_proj.weight.T
    x = x + y
    h = rms_by_hand(x, block.norm_2.weight)
    return x + torch.relu(h @ block.mlp.c_fc.weight.T).square() @ block.mlp.c_proj.weight.T


def test_truncated_bptt_same_forward_and_no_grad_in_early_loops():
    idx = tokens()
    logits = {}
    for r_bwd in (1, 2, 3, 4):
        model = make(r_bwd=r_bwd)
        calls, handle = shared_block_calls(model)
        loss = model(idx, idx)
        handle.remove()
        # The first r - r_bwd loops run without a graph; the last r_bwd are differentiable.
        assert calls == [False] * (4 - r_bwd) + [True] * r_bwd
        loss.backward()
        assert all(p.grad is not None for p in model.parameters())
        with torch.no_grad():
            logits[r_bwd] = model(idx)
    for r_bwd in (1, 2, 3):
        assert torch.equal(logits[r_bwd], logits[4])


def test_truncation_lowers_training_memory():
    idx = tokens(T=32)
    mem = {k: activation_bytes(make(r=8, r_bwd=k), idx) for k in (8, 4, 2, 1)}
    assert mem[8] > mem[4] > mem[2] > mem[1]
    # The four no-grad loops of r_bwd = 4 keep nothing: the saving is 4 loops' worth of activations.
    per_loop = (mem[8] - mem[4]) / 4
    assert (mem[4] - mem[2]) / 2 == pytest.approx(per_loop, rel=0.02)
    assert mem[2] - mem[1] == pytest.approx(per_loop, rel=0.02)


def relative_difference(a, b):
    return ((a - b).norm() / b.norm()).item()


def test_truncated_bptt_gradient_flows_only_through_the_last_r_bwd_loops():
    """§5.1: with r_bwd = k the first r - k loops are a constant input to the last k. The gradient of every
    parameter equals the one computed by hand with the early state detached, and differs from full BPTT's."""
    idx = tokens()
    grads = {}
    for r_bwd in (2, 4):
        model = off_init(make(r_bwd=r_bwd))
        F.cross_entropy(model(idx).reshape(-1, 300), idx.reshape(-1)).backward()
        grads[r_bwd] = {name: p.grad.clone() for name, p in model.named_parameters()}
    model = off_init(make(r_bwd=2))
    e = run_blocks(model, model.prelude, model.norm_embed(model.wte(idx)))
    s = e
    with torch.no_grad():
        for _ in range(2):
            s = one_loop(model, torch.cat([e, s], dim=-1) @ model.w_inj.weight.T)
    for _ in range(2):
        s = one_loop(model, torch.cat([e, s], dim=-1) @ model.w_inj.weight.T)
    F.cross_entropy(head(model, s).reshape(-1, 300), idx.reshape(-1)).backward()
    for name, p in model.named_parameters():
        assert relative_difference(grads[2][name], p.grad) < 1e-4, name
    for name in ("recur.0.attn.c_q.weight", "w_inj.weight", "prelude.0.mlp.c_fc.weight"):
        assert relative_difference(grads[2][name], grads[4][name]) > 1e-2, name  # the truncation cut paths


def test_linear_injection_starts_as_identity_on_e():
    model = make(injection="linear")
    e, s = torch.randn(2, 5, model.cfg.d_model), torch.randn(2, 5, model.cfg.d_model)
    assert torch.allclose(model.inject(e, s), e, atol=1e-6)
    assert model.w_inj.weight.shape == (model.cfg.d_model, 2 * model.cfg.d_model)


def test_gated_injection_mixes_e_and_the_state_per_channel_starting_half_and_half():
    """u = g e + (1 - g) s with g = sigmoid(w), one learnable w per channel, w = 0 at init: g = 1/2, so the
    first loop reads e (s_0 = e) and every later one the mean of e and its state. Its d parameters are N_rec's,
    applied elementwise (no matmul), trained by AdamW in the loop-mixing ('hyper') group."""
    model = make(injection="gated")
    d = model.cfg.d_model
    e, s = torch.randn(2, 5, d), torch.randn(2, 5, d)
    assert torch.equal(model.inj_gate, torch.zeros(d))
    assert torch.allclose(model.inject(e, s), (e + s) / 2, atol=1e-6)
    assert torch.allclose(model.inject(e, model.initial_state(e)), e, atol=1e-6)
    with torch.no_grad():
        model.inj_gate.copy_(torch.linspace(-20, 20, d))  # from all-state to all-e across the channels
    u = model.inject(e, s)
    assert torch.allclose(u[..., 0], s[..., 0], atol=1e-6) and torch.allclose(u[..., -1], e[..., -1], atol=1e-6)
    groups = model.param_groups()
    assert [p is model.inj_gate for p in groups["hyper"]] == [True]
    loss = model(tokens(), tokens(seed=2))
    loss.backward()
    assert model.inj_gate.grad.abs().sum() > 0  # the gate learns


def test_hyperconnections_init_semantics():
    """K lanes start as e; step t reads lane t mod K (alpha one-hot), M = I, beta = 1, so every step
    adds its output to all lanes; the coda reads the lane sum."""
    model = make(injection="hyper", hc_lanes=2, r=4)
    d = model.cfg.d_model
    e = torch.randn(1, 4, d)
    rope = (model.rope_cos, model.rope_sin)
    lanes = [e.clone(), e.clone()]
    for t in range(3):
        s = model.run_shared(lanes[t % 2], rope)
        lanes = [lane + s for lane in lanes]
    expected = lanes[0] + lanes[1]
    assert torch.allclose(model.hyper_recurrence(e, 3, rope), expected, atol=1e-5)
    assert model.hc_alpha.shape == (4, 2) and model.hc_mix.shape == (4, 2, 2)
    # The parameters themselves (lanes stay equal at init, so the forward alone cannot tell lane 0 from lane t mod K).
    for K in (2, 3):
        hyper = make(injection="hyper", hc_lanes=K, r=4)
        assert torch.equal(hyper.hc_alpha, torch.eye(K)[torch.arange(4) % K])
        assert torch.equal(hyper.hc_mix, torch.eye(K).expand(4, K, K)) and torch.equal(hyper.hc_beta, torch.ones(4, K))


def test_hyper_rejects_truncation():
    with pytest.raises(ValueError, match="full BPTT"):
        tiny(injection="hyper", r_bwd=2)


@pytest.mark.parametrize("injection", INJECTIONS)
def test_causal(injection):
    model = make(injection=injection)
    idx = tokens(n=1)
    changed = idx.clone()
    changed[0, 20:] = (changed[0, 20:] + 7) % 300
    with torch.no_grad():
        a, b = model(idx), model(changed)
    assert torch.allclose(a[:, :20], b[:, :20], atol=1e-5)
    assert not torch.allclose(a[:, 20:], b[:, 20:])


def test_r1_is_a_plain_gpt():
    """r = 1 without a custom layout is a plain 20-layer stack: no prelude/coda, no injection
    weights, and the forward is embedding -> norm -> 20 blocks -> norm -> norm -> lm_head."""
    model = make(r=1)
    assert len(model.recur) == 20 and len(model.prelude) == len(model.coda) == 0
    assert not hasattr(model, "w_inj") and model.cfg.injection == "none"
    idx = tokens()
    rope = (model.rope_cos, model.rope_sin)
    with torch.no_grad():
        x = model.norm_embed(model.wte(idx))
        for block in model.recur:
            x = block(x, rope, model.backend)
        logits = model.lm_head(model.norm_final(model.norm_recur(x))).float()
        logits = 15 * torch.tanh(logits / 15)[..., :300]
        assert torch.allclose(model(idx), logits, atol=1e-6)


@pytest.mark.parametrize("injection", INJECTIONS)
@pytest.mark.parametrize("r_eval", [2, 4, 7])
def test_eval_at_another_loop_count_is_the_recurrence_unrolled_r_eval_times(injection, r_eval):
    """App. A: model(idx, r=R) runs the trained block R times with the same injection, fewer or more loops
    than the r = 4 it was trained with; the forward equals the loops written out by hand (off the init,
    where W_inj = [I|0] and the hyperconnections' identity would hide a wrong state or step)."""
    model = off_init(make(injection=injection))
    idx = tokens()
    with torch.no_grad():
        got = model(idx, r=r_eval)
        assert torch.allclose(got, forward_by_hand(model, idx, r_eval), atol=1e-5)
        if r_eval != 4:
            assert not torch.allclose(got, model(idx), atol=1e-3)  # the loop count really changed the output


def test_initialisation():
    model = make(scale=4, head_dim=64)
    d = model.cfg.d_model
    a = (3 / d) ** 0.5
    block = model.recur[0]
    for w in (block.attn.c_q.weight, block.mlp.c_fc.weight):
        assert w.abs().max() <= a and w.abs().max() > 0.9 * a
    assert block.mlp.c_proj.weight.abs().max() <= (3 / (4 * d)) ** 0.5
    assert block.attn.c_proj.weight.abs().max() > 0.5 * a  # not zero: MuonH keeps ||W||_F
    assert abs(model.wte.weight.std().item() - 1) < 0.05
    assert abs(model.lm_head.weight.std().item() - 1e-3) < 1e-4
    assert all(torch.all(m.weight == 1) for m in model.modules() if type(m).__name__ == "RMSNorm")


@pytest.mark.parametrize("variant", ["gated", "hyper", "additive"])
def test_initial_draws_by_name_start_a_variant_where_its_base_starts(variant):
    """train.py --init-draws by-name: every weight a variant shares with the linear base (same name, same shape)
    starts equal to the base's at the same seed, and another seed draws others; from the one global RNG (every
    committed run), building one more module first (linear's W_inj) shifts every later draw, so none is equal."""
    def weights(injection, seed, draws):
        torch.manual_seed(seed)
        return dict(GPT(tiny(injection=injection), seed=seed, draws=draws).named_parameters())
    base, variant_weights = weights("linear", 3, "by-name"), weights(variant, 3, "by-name")
    shared = [name for name in base if name in variant_weights and base[name].shape == variant_weights[name].shape]
    assert len(shared) > 20 and all(torch.equal(base[name], variant_weights[name]) for name in shared)
    assert not torch.equal(weights("linear", 4, "by-name")["wte.weight"], base["wte.weight"])
    assert not torch.equal(base["recur.0.attn.c_q.weight"], base["recur.0.attn.c_k.weight"])  # a draw per weight
    base, variant_weights = weights("linear", 3, "global"), weights(variant, 3, "global")
    assert not any(torch.equal(base[name], variant_weights[name]) for name in shared if base[name].std() > 0)
    assert torch.equal(base["recur.0.mlp.c_fc.weight"], make(seed=3).recur[0].mlp.c_fc.weight)  # the default: as before


def test_vocab_padded_and_logits_sliced():
    model = make(vocab_size=300)
    assert model.wte.weight.shape[0] == 320 and model.lm_head.weight.shape[0] == 320
    assert model(tokens()).shape == (2, 32, 300)


@pytest.mark.parametrize("vocab, padded", [(32001, 32064), (32064, 32064), (300, 320), (320, 320), (321, 384)])
def test_vocab_is_padded_up_to_a_multiple_of_64(vocab, padded):
    """Llama 2's 32,000 pieces + <|assistant_end|> = 32,001 ids become the paper's V = 32,064 (§4.1)."""
    assert ModelConfig(r=4, scale=10, vocab_size=vocab).padded_vocab == padded


def test_logits_softcapped():
    model = make()
    with torch.no_grad():
        model.lm_head.weight.mul_(1e4)
        logits = model(tokens())
    assert logits.abs().max() <= 15.0 and logits.abs().max() > 14.0


def test_training_loss_is_the_cross_entropy_of_the_softcapped_logits():
    """The CPU training path (LinearSoftcapCrossEntropy: lm_head and the loss in blocks of rows, the sigmoid
    form of the cap, no max-shift, the gradients computed in the forward pass) is the loss of the logits a
    reader sees, F.cross_entropy(15 tanh(z / 15)): in value (also without gradients, as validation runs it)
    and in every gradient, scaled by the loss's own gradient (a quarter: gradient accumulation), with the
    vocabulary padded (300 -> 320 columns) and with logits large enough to sit on the cap."""
    model = off_init(make())
    with torch.no_grad():
        model.lm_head.weight.mul_(300.0)  # logits of several hundred: most of them capped near +-15
    idx, targets = tokens(), tokens(seed=2)
    loss = model(idx, targets)
    (loss / 4).backward()
    fused = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    reference = F.cross_entropy(model(idx).flatten(0, 1), targets.flatten())
    (reference / 4).backward()
    with torch.no_grad():
        assert abs(model(idx, targets).item() - loss.item()) < 1e-6
    assert abs(loss.item() - reference.item()) < 1e-5 and reference.item() > 1.0
    for got, p in zip(fused, model.parameters()):  # fp32 rounding apart (2e-6 of the largest entry here)
        assert (got - p.grad).abs().max() <= 1e-5 * p.grad.abs().max()
    assert model.lm_head.weight.grad[model.cfg.vocab_size:].abs().max() == 0  # padding columns learn nothing


@pytest.mark.parametrize("injection", INJECTIONS)
def test_param_groups_cover_everything_once(injection):
    model = make(injection=injection)
    groups = model.param_groups()
    ids = [id(p) for g in groups.values() for p in g]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    assert all(p.ndim == 2 for p in groups["matrix"])
    assert all(p.ndim == 1 for p in groups["norm"])
    if injection == "linear":
        assert any(p is model.w_inj.weight for p in groups["matrix"])
    assert (len(groups["hyper"]) == 3) == (injection == "hyper")


def test_a_parameter_no_optimiser_group_claims_is_an_error():
    """Every parameter is named to its group (nanochat asserts the same): a new one fails loudly instead of
    landing in some group's learning rate."""
    model = make()
    model.new_scale = torch.nn.Parameter(torch.ones(model.cfg.d_model))
    with pytest.raises(ValueError, match="new_scale belongs to no optimiser group"):
        model.param_groups()


def test_random_state_init_ablation():
    model = make(random_state_init=True, injection="additive")
    idx = tokens()
    with torch.no_grad():
        assert not torch.equal(model(idx), model(idx))  # s_0 redrawn every forward
    with pytest.raises(ValueError):
        tiny(random_state_init=True, injection="hyper")


def test_attention_backend_follows_device_and_installed_kernels(monkeypatch):
    """CPU -> cpu_attention's kernel; a Hopper GPU -> FA3 if its module imports, else FA2, else SDPA; other GPUs never
    FA3. The GPU and the flash modules are faked, so every branch runs on CPU."""
    fa3, fa2 = types.ModuleType("flash_attn_interface"), types.ModuleType("flash_attn")
    fa3.flash_attn_func, fa2.flash_attn_func = (lambda *a, **k: "fa3"), (lambda *a, **k: "fa2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for capability, installed, expected in [((9, 0), [fa3, fa2], "fa3"), ((9, 0), [fa2], "fa2"),
                                            ((8, 0), [fa3, fa2], "fa2"), ((9, 0), [], "sdpa")]:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        for module in (fa3, fa2):
            monkeypatch.setitem(sys.modules, module.__name__, module if module in installed else None)
        name, fn = attention_backend("cuda")
        assert name == expected and (fn is None if name == "sdpa" else fn() == name)
        assert attention_backend("cpu")[0] == "cpu"  # cpu_attention.py's kernel (tests below)


def test_the_cpu_kernel_is_chosen_only_where_it_is_the_faster_one():
    """cpu_attention.py's kernel beats SDPA at small heads only (dev/bench_train.py --attention): a model picks it
    at head dim <= KERNEL_MAX_HEAD_DIM, SDPA above (d = 128 in heads of 32: the kernel ran train.py 0.75x)."""
    import model as model_module
    small = GPT(tiny(head_dim=8, scale=0.5))
    large = GPT(tiny(head_dim=32, scale=2))
    assert small.set_device_backend("cpu") == "cpu" and model_module.KERNEL_MAX_HEAD_DIM >= 8
    assert large.set_device_backend("cpu") == "sdpa"


# ----------------------------------------------------------------------------------------------
# The block (nanochat's): RoPE then QK-norm, pre-norm, squared ReLU

def test_rope_rotates_each_pair_by_position_times_frequency():
    """RoPE (base 10000, rotate halves): at position t the pair (x_i, x_{i+D/2}) turns by t * 10000^(-2i/D)."""
    x = torch.randn(2, 12, 3, 8)
    got = apply_rope(x, *rope_tables(12, 8, None))
    assert torch.allclose(got.double(), rope_by_hand(x), atol=1e-5)
    assert torch.equal(got[:, 0], x[:, 0])  # position 0 is not rotated
    assert torch.allclose(got.norm(dim=-1), x.norm(dim=-1), atol=1e-5)  # a rotation keeps each head's norm


def test_rope_scores_depend_on_the_offset_between_positions_only():
    """q_m . k_n after RoPE depends on n - m: shifting every position by 7 leaves all scores unchanged,
    although each rotated vector moved (the positions are really encoded)."""
    T, D, c = 10, 16, 7
    q, k = torch.randn(2, 1, T, 2, D).unbind(0)
    cos, sin = rope_tables(T + c, D, None)

    def rotated(x, shift):
        return apply_rope(x, cos[shift:shift + T], sin[shift:shift + T])
    scores = {shift: torch.einsum("bthd,bshd->bhts", rotated(q, shift), rotated(k, shift)) for shift in (0, c)}
    assert torch.allclose(scores[0], scores[c], atol=1e-4)
    assert not torch.allclose(rotated(q, 0), rotated(q, c), atol=1e-2)
    assert not torch.allclose(scores[0], torch.einsum("bthd,bshd->bhts", q, k), atol=1e-2)


def test_rope_makes_attention_see_the_order_of_the_context():
    """Softmax attention without positions is a function of the set of earlier tokens: reversing the
    context leaves the last token's output as it was. With RoPE (the model's tables) it changes."""
    model = off_init(make())
    attn, T = model.recur[0].attn, 32
    x = torch.randn(1, T, model.cfg.d_model)
    reversed_context = x[:, list(range(T - 2, -1, -1)) + [T - 1]]
    rope = (model.rope_cos, model.rope_sin)
    no_positions = (torch.ones_like(model.rope_cos), torch.zeros_like(model.rope_sin))  # angle 0 everywhere
    with torch.no_grad():
        last = {name: attn(inp, tables, model.backend)[0, -1] for name, inp, tables in [
            ("rope", x, rope), ("rope reversed", reversed_context, rope),
            ("none", x, no_positions), ("none reversed", reversed_context, no_positions)]}
    assert torch.allclose(last["none"], last["none reversed"], atol=1e-5)  # the claim's premise
    assert not torch.allclose(last["rope"], last["rope reversed"], atol=1e-3)


def test_qk_norm_makes_attention_independent_of_the_scale_of_wq_and_wk():
    """Parameter-free QK-norm after RoPE: the scores are q.k / sqrt(D) of unit-RMS heads, so scaling W_q by
    30 and W_k by 1/2 (which would scale every attention logit by 15 without it) changes nothing."""
    model = off_init(make())
    attn, rope = model.recur[0].attn, (model.rope_cos, model.rope_sin)
    x = torch.randn(2, 32, model.cfg.d_model)
    with torch.no_grad():
        before = attn(x, rope, model.backend)
        attn.c_q.weight.mul_(30.0)
        attn.c_k.weight.mul_(0.5)
        assert torch.allclose(attn(x, rope, model.backend), before, atol=2e-5)


def test_block_is_prenorm_attention_then_squared_relu_mlp():
    """A block equals its definition written out by hand (RoPE, QK-norm, causal softmax, squared ReLU)."""
    model = off_init(make())
    x = torch.randn(2, 32, model.cfg.d_model)
    with torch.no_grad():
        for block in (model.prelude[0], model.recur[0], model.coda[1]):
            got = block(x, (model.rope_cos, model.rope_sin), model.backend)
            assert torch.allclose(got, block_by_hand(block, x, model.cfg.head_dim), atol=1e-5)


def test_sdpa_attention_is_causal_softmax_attention():
    """The SDPA path equals softmax(q k^T / sqrt(D) + causal mask) v written out by hand."""
    q, k, v = torch.randn(3, 2, 7, 4, 8).unbind(0)  # (B, T, H, D)
    scores = torch.einsum("bthd,bshd->bhts", q, k) / 8 ** 0.5
    scores = scores.masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), float("-inf"))
    expected = torch.einsum("bhts,bshd->bthd", scores.softmax(-1), v)
    assert torch.allclose(causal_attention(q, k, v, ("sdpa", None)), expected, atol=1e-6)


def cpu_kernel_and_sdpa(B, T, H, D, seed=0):
    """(output, grads) of cpu_attention's kernel and of SDPA, through model.causal_attention, on the same
    (B, T, H, D) inputs and output grad; the CPU backend must call the kernel, once."""
    torch.manual_seed(seed)
    q, k, v = [(2 * torch.randn(B, T, H, D)).requires_grad_() for _ in range(3)]  # x2: a peakier softmax
    grad_out = torch.randn(B, T, H, D)
    name, kernel = attention_backend("cpu")
    calls = []

    def counted_kernel(*qkv):
        calls.append(qkv)
        return kernel(*qkv)

    results = []
    for backend in ((name, counted_kernel), ("sdpa", None)):
        out = causal_attention(q, k, v, backend)
        grads = torch.autograd.grad(out, (q, k, v), grad_out)
        results.append((out, grads))
    assert name == "cpu" and len(calls) == 1
    return results


@pytest.mark.parametrize("B, T, H, D", [(1, 1, 2, 8), (2, 5, 3, 4), (2, 16, 1, 8), (2, 128, 6, 8), (3, 67, 2, 16),
                                        (1, 40, 1, 64)])
def test_cpu_kernel_is_sdpa_causal_attention_forward_and_backward(B, T, H, D):
    """cpu_attention.py's C kernel (the CPU training step's attention) computes SDPA's causal attention and its
    gradients to fp32 rounding: head dims 4-64, T from one query to below, at and off its 16-query tiles."""
    (out, grads), (sdpa_out, sdpa_grads) = cpu_kernel_and_sdpa(B, T, H, D)
    torch.testing.assert_close(out, sdpa_out, rtol=1e-5, atol=2e-5)
    for grad, sdpa_grad in zip(grads, sdpa_grads):
        torch.testing.assert_close(grad, sdpa_grad, rtol=1e-5, atol=1e-4)


def test_cpu_kernel_result_does_not_depend_on_the_thread_count():
    """The (batch, head) pairs are split over torch's threads; each pair is computed alone, so 1 and 3
    threads give the same bits (a run's losses do not depend on how many cores it had)."""
    threads = torch.get_num_threads()
    results = []
    for count in (1, 3):
        torch.set_num_threads(count)
        results.append(cpu_kernel_and_sdpa(2, 33, 3, 8)[0])
    torch.set_num_threads(threads)
    (out_1, grads_1), (out_3, grads_3) = results
    assert torch.equal(out_1, out_3) and all(torch.equal(a, b) for a, b in zip(grads_1, grads_3))


def test_cpu_kernel_refuses_what_it_cannot_read():
    """The kernel reads raw fp32 memory, so any other dtype is refused, never reinterpreted; model.py sends
    bf16 (CPU autocast) to SDPA instead."""
    from nanoloop import cpu_attention
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(ValueError, match="fp32 CPU tensors"):
        cpu_attention.causal_attention(q.bfloat16(), q.bfloat16(), q.bfloat16())
    with pytest.raises(ValueError, match="one \\(B, T, H, D\\) shape"):
        cpu_attention.causal_attention(q, q[:, :2], q)
    expected = causal_attention(q.bfloat16(), q.bfloat16(), q.bfloat16(), ("sdpa", None))
    assert torch.equal(causal_attention(q.bfloat16(), q.bfloat16(), q.bfloat16(), attention_backend("cpu")), expected)


def test_without_a_c_compiler_cpu_attention_falls_back_to_sdpa(tmp_path, monkeypatch, capsys):
    """No C compiler (CC fails, an empty kernel cache): one line on stderr, and the CPU backend is SDPA."""
    from nanoloop import cpu_attention
    monkeypatch.setattr(cpu_attention, "_library", None)  # not built yet in this process
    monkeypatch.setenv("NANOLOOP_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "false")
    assert attention_backend("cpu") == ("sdpa", None)
    err = capsys.readouterr().err
    assert err.startswith("cpu_attention: cannot build the C kernel") and err.count("\n") == 1
    assert attention_backend("cpu") == ("sdpa", None) and capsys.readouterr().err == ""  # said once


def test_fp32_forward_is_unchanged_by_the_gpu_dtype_rules():
    """Outside autocast the embedding keeps its dtype and the hyperconnection lanes compute exactly
    the formula they had before the fp32-lane rule (the .float() casts are no-ops): bit for bit."""
    assert embedding_dtype("cpu") is None
    model = make(injection="hyper", hc_lanes=2, r=4)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
        e = torch.randn(2, 32, model.cfg.d_model)
        rope = (model.rope_cos, model.rope_sin)
        lanes = e.reshape(1, -1).expand(2, -1)
        for t in range(4):
            s = model.run_shared((model.hc_alpha[t][None] @ lanes).view(e.shape), rope)
            lanes = model.hc_mix[t] @ lanes + model.hc_beta[t][:, None] @ s.reshape(1, -1)
        assert torch.equal(model.hyper_recurrence(e, 4, rope), lanes.sum(0).view(e.shape))


@pytest.mark.parametrize("injection", ["linear", "hyper"])
def test_bf16_autocast_embeds_in_bf16_and_keeps_hyper_lanes_fp32(injection):
    """As the authors' GPU code: under bf16 autocast the stream leaves the embedding in bf16, and
    the hyperconnection lanes (so the coda's input) stay fp32; other modes pass bf16 to the coda."""
    model = make(injection=injection)
    seen = {}
    model.prelude[0].register_forward_pre_hook(lambda mod, args: seen.update(prelude=args[0].dtype))
    model.coda[0].register_forward_pre_hook(lambda mod, args: seen.update(coda=args[0].dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert embedding_dtype("cpu") == torch.bfloat16
        loss = model(tokens(), tokens())
    loss.backward()
    assert torch.isfinite(loss) and model.wte.weight.grad.dtype == torch.float32
    assert seen == {"prelude": torch.bfloat16, "coda": torch.float32 if injection == "hyper" else torch.bfloat16}


def test_greedy_generation_takes_the_forwards_argmax_at_every_step():
    """Greedy decoding is the argmax of the model's own next-token logits, token after token (the cached
    path is checked against the full forward in test_generate.py)."""
    model = make()
    prompt = tokens(n=1, T=5)[0].tolist()
    out = generate(model, [prompt], 20, temperature=0)
    assert out == generate(model, [prompt], 20, temperature=0) and len(out[0]) == 20
    ids = list(prompt)
    with torch.no_grad():
        for token in out[0]:
            assert token == int(model(torch.tensor([ids]))[0, -1].argmax())
            ids.append(token)


def test_learns_a_pattern():
    """A looped model can fit a repeated sequence: loss falls far below ln(vocab) in 60 Adam steps."""
    model = make(r=2, vocab_size=64)
    seq = torch.arange(33) % 7
    x, y = seq[:-1][None].repeat(4, 1), seq[1:][None].repeat(4, 1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(60):
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()
        opt.step()
    assert loss.item() < 0.5


@pytest.mark.parametrize("injection", ["linear", "additive"])
def test_the_untied_model_with_equal_copies_is_the_tied_model(injection):
    """Truncate or Not? App. E.2: with every loop's copy of the block, W_inj and norm set to the shared ones, the
    untied model gives the tied model's logits and loss exactly; trained, the copies move apart (their own
    gradients), and each is initialised like the tied loop (W_inj = [I | 0])."""
    tied_cfg = tiny(r=3, injection=injection, prelude=1, recur=2, coda=1, depth=0)
    untied_cfg = ModelConfig(**{**flops.config_record(tied_cfg), "untied": True})
    torch.manual_seed(0)
    tied = GPT(tied_cfg)
    untied = GPT(untied_cfg)
    shared = {k: v for k, v in tied.state_dict().items()}
    state = dict(shared)
    for t in range(2):
        for key, value in shared.items():
            for part in ("recur.", "norm_recur.", "w_inj."):
                if key.startswith(part):
                    state[f"untied_loops.{t}.{key}"] = value
    untied.load_state_dict(state)
    idx = tokens(n=2, T=tied_cfg.seq_len)
    with torch.no_grad():
        assert torch.equal(untied(idx), tied(idx))
        assert untied(idx, idx) == tied(idx, idx)
    untied(idx, idx).backward()
    grads = [untied.loop_weights(t).recur[0].mlp.c_fc.weight.grad for t in range(3)]
    assert grads[-1].abs().sum() > 0 and not torch.equal(grads[0], grads[-1])  # at init W_inj = [I|0]: only
    # the last loop reaches the output for the linear injection, every loop for the additive one
    assert set(untied.param_groups()) == set(tied.param_groups())
    if injection == "linear":
        fresh = GPT(untied_cfg)
        assert all(torch.equal(fresh.loop_weights(t).w_inj.weight, fresh.w_inj.weight) for t in range(3))
