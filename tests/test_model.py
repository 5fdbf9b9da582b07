"""The looped transformer, as the paper describes it (§3.1, §5, App. C): each test is one claim."""
import sys
import types

import pytest
import torch

from flops import ModelConfig
from model import GPT, activation_bytes, attention_backend, causal_attention, embedding_dtype


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


def test_linear_injection_starts_as_identity_on_e():
    model = make(injection="linear")
    e, s = torch.randn(2, 5, model.cfg.d_model), torch.randn(2, 5, model.cfg.d_model)
    assert torch.allclose(model.inject(e, s), e, atol=1e-6)
    assert model.w_inj.weight.shape == (model.cfg.d_model, 2 * model.cfg.d_model)


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


def test_hyper_rejects_truncation():
    with pytest.raises(ValueError, match="full BPTT"):
        tiny(injection="hyper", r_bwd=2)


@pytest.mark.parametrize("injection", ["linear", "additive", "passthrough", "hyper"])
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


def test_eval_with_other_loop_count():
    for injection in ("linear", "hyper"):
        model = make(injection=injection)
        with torch.no_grad():  # move off the init, where W_inj = [I|0] makes the loop ignore s
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        idx = tokens()
        with torch.no_grad():
            trained = model(idx, idx)
            more, fewer = model(idx, idx, r=8), model(idx, idx, r=2)
        assert torch.isfinite(more) and torch.isfinite(fewer)
        assert more != trained and fewer != trained


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


def test_vocab_padded_and_logits_sliced():
    model = make(vocab_size=300)
    assert model.wte.weight.shape[0] == 320 and model.lm_head.weight.shape[0] == 320
    assert model(tokens()).shape == (2, 32, 300)


def test_logits_softcapped():
    model = make()
    with torch.no_grad():
        model.lm_head.weight.mul_(1e4)
        logits = model(tokens())
    assert logits.abs().max() <= 15.0 and logits.abs().max() > 14.0


@pytest.mark.parametrize("injection", ["linear", "additive", "passthrough", "hyper"])
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


def test_random_state_init_ablation():
    model = make(random_state_init=True, injection="additive")
    idx = tokens()
    with torch.no_grad():
        assert not torch.equal(model(idx), model(idx))  # s_0 redrawn every forward
    with pytest.raises(ValueError):
        tiny(random_state_init=True, injection="hyper")


def test_attention_backend_follows_device_and_installed_kernels(monkeypatch):
    """CPU -> SDPA; a Hopper GPU -> FA3 if its module imports, else FA2, else SDPA; other GPUs never
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
        assert attention_backend("cpu") == ("sdpa", None)


def test_sdpa_attention_is_causal_softmax_attention():
    """The SDPA path equals softmax(q k^T / sqrt(D) + causal mask) v written out by hand."""
    q, k, v = torch.randn(3, 2, 7, 4, 8).unbind(0)  # (B, T, H, D)
    scores = torch.einsum("bthd,bshd->bhts", q, k) / 8 ** 0.5
    scores = scores.masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), float("-inf"))
    expected = torch.einsum("bhts,bshd->bthd", scores.softmax(-1), v)
    assert torch.allclose(causal_attention(q, k, v, ("sdpa", None)), expected, atol=1e-6)


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
    out = model.generate([prompt], 20, temperature=0)
    assert out == model.generate([prompt], 20, temperature=0) and len(out[0]) == 20
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
