"""MuonH, the optimiser split and the learning-rate rule behave as the paper's App. E specifies (CPU)."""
import io
import math
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from muonh import (ADAMW_BETAS, ADAMW_EPS, BASE_LRS, POLAR_EXPRESS_COEFFICIENTS, QUINTIC_COEFFICIENTS,
                   REF_BATCH_TOKENS, REF_WIDTH, MuonH, build_optimizers, learning_rates, orthogonalise,
                   polar_express_coefficients)
from nanoloop.recipe import lr_multiplier

D_REF_LOOPED = 1_016_083_200   # flops.reference_horizon(looped=True)
D_REF_PLAIN = 983_315_200      # flops.reference_horizon(looped=False)

# The Polar Express paper's published coefficients for 5 steps from l = 1e-3 (no safety factor).
PAPER_POLAR_EXPRESS = (
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
)


def compose(coefficients, s):
    """What the Newton-Schulz chain does to one singular value s (float64 scalar maths)."""
    for a, b, c in coefficients:
        s = a * s + b * s ** 3 + c * s ** 5
    return s


def promised_band(coefficients, lower=1e-3):
    """[min, max] of the composed polynomial over singular values in [lower, 1]."""
    out = compose(coefficients, torch.logspace(math.log10(lower), 0, 200_001, dtype=torch.float64))
    return out.min().item(), out.max().item()


def random_matrices(shapes, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator) * 0.02 for shape in shapes]


# ------------------------------------------------------------------------------------------------
# Orthogonalisation


def test_polar_express_derivation_reproduces_the_papers_coefficients():
    derived = polar_express_coefficients(num_steps=5, lower=1e-3, safety=0.0)
    for ours, published in zip(derived, PAPER_POLAR_EXPRESS, strict=True):
        assert ours == pytest.approx(published, rel=1e-9)
    # The default adds the 1% bf16 safety factor: each step is p(s / 1.01).
    assert POLAR_EXPRESS_COEFFICIENTS == polar_express_coefficients(safety=0.01)
    assert len(POLAR_EXPRESS_COEFFICIENTS) == 5 and len(QUINTIC_COEFFICIENTS) == 5


def test_coefficient_bands():
    # Polar Express maps every singular value in [1e-3, 1] to within ~14% of 1 in five steps;
    # the fixed quintic only reaches [0.47, 1.21] on the same interval.
    lo, hi = promised_band(POLAR_EXPRESS_COEFFICIENTS)
    assert 0.85 < lo < 1 < hi < 1.14
    lo, hi = promised_band(QUINTIC_COEFFICIENTS)
    assert 0.45 < lo < 0.5 and 1.15 < hi < 1.21
    # One more Polar Express step is nearly exact: the interval shrinks quadratically-or-better.
    lo, hi = promised_band(polar_express_coefficients(num_steps=6))
    assert 0.99 < lo < 1 < hi < 1.01


@pytest.mark.parametrize("name, coefficients", [("polar_express", POLAR_EXPRESS_COEFFICIENTS),
                                                ("quintic", QUINTIC_COEFFICIENTS)])
@pytest.mark.parametrize("compute_dtype", [torch.bfloat16, torch.float32])
def test_singular_values_land_in_the_promised_band(name, coefficients, compute_dtype):
    # The model's MuonH shapes at s = 10 (q/k/v/o, c_proj, c_fc, W_inj) and a small one.
    shapes = [(640, 640), (640, 2560), (2560, 640), (640, 1280), (48, 16)]
    band_lo, band_hi = promised_band(coefficients)
    slack = 0.01 if compute_dtype == torch.bfloat16 else 1e-3  # rounding inside the chain
    for matrix in random_matrices(shapes):
        out = orthogonalise(matrix, coefficients, compute_dtype)
        assert out.dtype == compute_dtype and out.shape == matrix.shape
        u, s, vh = torch.linalg.svd(matrix.double(), full_matrices=False)
        s_in = s / torch.linalg.vector_norm(matrix.double())
        s_out = torch.linalg.svdvals(out.double())
        in_range = s_in >= 1e-3   # square Gaussian matrices have a few singular values below 1e-3
        # Singular values follow the scalar polynomial composition (sorted: it is not monotone).
        predicted = compose(coefficients, s_in).sort(descending=True).values
        assert (s_out - predicted).abs().max() < 3 * slack
        # Every output singular value whose input was in [1e-3, 1] lands in the band.
        assert s_out[in_range].min() > band_lo - slack and s_out.max() < band_hi + slack
        # Distance to the exact polar factor U V^T: at most the band's half-width on the converged
        # part, plus up to 1 per singular value left below 1e-3.
        polar = u @ vh
        rel_error = torch.linalg.vector_norm(out.double() - polar) / torch.linalg.vector_norm(polar)
        half_width = max(1 - band_lo, band_hi - 1) + slack
        frac_below = 1 - in_range.double().mean()
        assert rel_error < math.sqrt(half_width ** 2 + frac_below)
        if name == "polar_express":
            assert rel_error < 0.13


@pytest.mark.parametrize("compute_dtype", [torch.bfloat16, torch.float32])
def test_batched_by_shape_equals_per_matrix(compute_dtype):
    for shape in [(64, 64), (64, 192), (192, 64)]:
        stack = torch.stack(random_matrices([shape] * 3, seed=1))
        batched = orthogonalise(stack, compute_dtype=compute_dtype).float()
        one_by_one = torch.stack([orthogonalise(m, compute_dtype=compute_dtype) for m in stack]).float()
        atol = 2e-3 if compute_dtype == torch.bfloat16 else 1e-6
        torch.testing.assert_close(batched, one_by_one, rtol=0, atol=atol)


def test_optimiser_batches_across_groups_like_separate_optimisers():
    # One MuonH over 4 matrices (two shapes, two param groups with their own lr) equals four MuonH
    # instances with one matrix each.
    shapes = [(32, 32), (32, 32), (96, 32), (32, 32)]
    lrs = [0.02, 0.05, 0.02, 0.05]
    joint = [torch.nn.Parameter(m) for m in random_matrices(shapes, seed=2)]
    alone = [torch.nn.Parameter(m.clone()) for m in joint]
    joint_opt = MuonH([{"params": [joint[0], joint[2]], "lr": 0.02}, {"params": [joint[1], joint[3]], "lr": 0.05}],
                      compute_dtype=torch.float32)
    alone_opts = [MuonH([p], lr=lr, compute_dtype=torch.float32) for p, lr in zip(alone, lrs)]
    generator = torch.Generator().manual_seed(3)
    for _ in range(3):
        for p, q in zip(joint, alone):
            p.grad = torch.randn(p.shape, generator=generator)
            q.grad = p.grad.clone()
        joint_opt.step()
        for opt in alone_opts:
            opt.step()
    for p, q in zip(joint, alone):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)


# ------------------------------------------------------------------------------------------------
# The MuonH update


def test_frobenius_norm_is_preserved_for_100_steps():
    params = [torch.nn.Parameter(m) for m in random_matrices([(64, 64), (64, 256), (256, 64), (64, 128)])]
    initial = [torch.linalg.vector_norm(p).item() for p in params]
    opt = MuonH(params, lr=0.05)
    generator = torch.Generator().manual_seed(4)
    for _ in range(100):
        for p in params:
            p.grad = torch.randn(p.shape, generator=generator)
        opt.step()
    for p, norm in zip(params, initial):
        assert torch.linalg.vector_norm(p).item() == pytest.approx(norm, rel=1e-5)
        assert opt.state[p]["radius"].item() == pytest.approx(norm, rel=1e-7)


@pytest.mark.parametrize("lr", [0.014, 0.1])
def test_relative_step_before_projection_is_lr(lr):
    # With momentum 0 the update is orth(G). Taking G semi-orthogonal (all singular values equal)
    # makes orth(G) exactly proportional to G, so the direction is known independently of the
    # optimiser: W_new = k (W - lr R G/||G||) for some k > 0. Fitting W_new = alpha W + beta G_hat
    # recovers the relative step -beta / (alpha R) = ||dW||/||W||.
    generator = torch.Generator().manual_seed(5)
    weight = torch.nn.Parameter(torch.randn(48, 80, generator=generator))
    opt = MuonH([weight], lr=lr, momentum=0.0, compute_dtype=torch.float32)
    for _ in range(3):
        before = weight.detach().clone()
        q, _ = torch.linalg.qr(torch.randn(80, 48, generator=generator))
        direction = q.T / torch.linalg.vector_norm(q)
        weight.grad = q.T.contiguous()
        opt.step()
        basis = torch.stack([before.flatten(), direction.flatten()], dim=1).double()
        (alpha, beta), *_ = torch.linalg.lstsq(basis, weight.detach().flatten().double().unsqueeze(1))
        residual = weight.detach().double().flatten() - basis @ torch.stack([alpha, beta]).flatten()
        assert residual.abs().max() < 1e-5
        radius = torch.linalg.vector_norm(before).item()
        assert (-beta / (alpha * radius)).item() == pytest.approx(lr, rel=1e-5)


def test_step_matches_the_recipe_formula_with_nesterov_momentum():
    generator = torch.Generator().manual_seed(6)
    weight = torch.nn.Parameter(torch.randn(40, 24, generator=generator))
    opt = MuonH([weight], lr=0.03, momentum=0.95, compute_dtype=torch.float32)
    expected = weight.detach().clone()
    radius = torch.linalg.vector_norm(expected)
    momentum = torch.zeros_like(expected)
    for _ in range(4):
        grad = torch.randn(40, 24, generator=generator)
        weight.grad = grad.clone()
        opt.step()
        momentum = 0.95 * momentum + 0.05 * grad
        update = 0.05 * grad + 0.95 * momentum
        o = orthogonalise(update, compute_dtype=torch.float32)
        expected = expected - 0.03 * radius * o / torch.linalg.vector_norm(o)
        expected = radius * expected / torch.linalg.vector_norm(expected)
        torch.testing.assert_close(weight.detach(), expected, rtol=0, atol=1e-5)


def test_zero_gradient_leaves_the_matrix_unchanged():
    weight = torch.nn.Parameter(random_matrices([(16, 8)])[0])
    before = weight.detach().clone()
    opt = MuonH([weight])
    weight.grad = torch.zeros_like(weight)
    opt.step()
    assert torch.equal(weight.detach(), before)


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="2-D"):
        MuonH([torch.nn.Parameter(torch.ones(4))])
    with pytest.raises(ValueError, match="ns_coefficients"):
        MuonH([torch.nn.Parameter(torch.ones(4, 4))], ns_coefficients="cubic")
    opt = MuonH([torch.nn.Parameter(torch.ones(4, 4))], ns_coefficients="quintic")
    assert opt.ns_coefficients == QUINTIC_COEFFICIENTS


# ------------------------------------------------------------------------------------------------
# The optimiser pair on a tiny model


class TinyLM(torch.nn.Module):
    """Embedding, RMSNorm with a scale, one squared-ReLU MLP block, untied unembedding."""

    def __init__(self, vocab=32, width=32):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, width)
        self.norm = torch.nn.RMSNorm(width, eps=1e-6)
        self.fc = torch.nn.Linear(width, 4 * width, bias=False)
        self.proj = torch.nn.Linear(4 * width, width, bias=False)
        self.lm_head = torch.nn.Linear(width, vocab, bias=False)

    def forward(self, tokens):
        x = self.wte(tokens)
        x = x + self.proj(torch.relu(self.fc(self.norm(x))) ** 2)
        return self.lm_head(x)

    def param_groups(self):
        return {"matrix": [self.fc.weight, self.proj.weight], "embedding": [self.wte.weight],
                "unembedding": [self.lm_head.weight], "norm": [self.norm.weight], "hyper": []}


def test_build_optimizers_splits_the_groups():
    model = TinyLM()
    lrs = dict(BASE_LRS)
    muon, adamw = build_optimizers(model.param_groups(), lrs, compute_dtype=torch.float32)
    assert isinstance(muon, MuonH) and isinstance(adamw, torch.optim.AdamW)
    assert [g["name"] for g in muon.param_groups] == ["matrix"]
    assert muon.param_groups[0]["initial_lr"] == muon.param_groups[0]["lr"] == 0.014
    assert muon.param_groups[0]["momentum"] == 0.95  # Nesterov momentum mu = 0.95 (App. E)
    assert muon.compute_dtype == torch.float32
    # The empty "hyper" group is left out; each AdamW group has its own base lr.
    assert {g["name"]: g["initial_lr"] for g in adamw.param_groups} == \
        {"embedding": 0.3, "unembedding": 0.004, "norm": 0.005}
    for group in adamw.param_groups:
        assert group["betas"] == ADAMW_BETAS == (0.8, 0.95)
        assert group["eps"] == ADAMW_EPS == 1e-10
        assert group["weight_decay"] == 0.0
    with pytest.raises(ValueError, match="unknown"):
        build_optimizers({"matrix": [model.fc.weight], "bias": []}, lrs)


def _token_batch(step, batch=16, length=16, vocab=32):
    # Next token = (3 * token + 1) mod vocab: learnable from the current token alone.
    generator = torch.Generator().manual_seed(1000 + step)
    start = torch.randint(0, vocab, (batch, 1), generator=generator)
    sequence = [start]
    for _ in range(length):
        sequence.append((3 * sequence[-1] + 1) % vocab)
    tokens = torch.cat(sequence, dim=1)
    return tokens[:, :-1], tokens[:, 1:]


def _train_steps(model, optimizers, steps, first_step=0, total_steps=None):
    losses = []
    for step in range(first_step, first_step + steps):
        inputs, targets = _token_batch(step)
        loss = torch.nn.functional.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        loss.backward()
        multiplier = lr_multiplier(step, total_steps or first_step + steps)
        for opt in optimizers:
            for group in opt.param_groups:
                group["lr"] = group["initial_lr"] * multiplier
            opt.step()
            opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def test_tiny_lm_trains():
    torch.manual_seed(7)
    model = TinyLM()
    lrs = {"matrix": 0.05, "embedding": 0.05, "unembedding": 0.01, "norm": 0.005, "hyper": 0.01}
    optimizers = build_optimizers(model.param_groups(), lrs)
    losses = _train_steps(model, optimizers, steps=150)
    assert losses[0] > 3.0                        # ~ln 32 at init
    assert sum(losses[-10:]) / 10 < 0.3 * losses[0]


def test_state_dict_round_trip_resumes_bit_exactly():
    lrs = {"matrix": 0.05, "embedding": 0.05, "unembedding": 0.01, "norm": 0.005, "hyper": 0.01}
    torch.manual_seed(8)
    model = TinyLM()
    optimizers = build_optimizers(model.param_groups(), lrs)
    _train_steps(model, optimizers, steps=3, total_steps=6)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizers": [opt.state_dict() for opt in optimizers]}, buffer)
    _train_steps(model, optimizers, steps=3, first_step=3, total_steps=6)

    buffer.seek(0)
    checkpoint = torch.load(buffer)
    torch.manual_seed(99)  # a different init, fully overwritten by the checkpoint
    resumed = TinyLM()
    resumed.load_state_dict(checkpoint["model"])
    resumed_optimizers = build_optimizers(resumed.param_groups(), {name: 1.0 for name in lrs})
    for opt, state in zip(resumed_optimizers, checkpoint["optimizers"]):
        opt.load_state_dict(state)
    muon_state = resumed_optimizers[0].state[resumed.fc.weight]
    assert set(muon_state) == {"momentum_buffer", "radius"}
    assert resumed_optimizers[0].param_groups[0]["initial_lr"] == 0.05  # not the 1.0 built with
    _train_steps(resumed, resumed_optimizers, steps=3, first_step=3, total_steps=6)
    for (name, p), q in zip(model.named_parameters(), resumed.parameters()):
        assert torch.equal(p, q), name


# ------------------------------------------------------------------------------------------------
# Distributed: two CPU processes over gloo

DIST_SHAPES = [(24, 24), (24, 24), (24, 24), (24, 72), (72, 24), (72, 24), (24, 48)]  # odd counts: padding
DIST_STEPS = 4
GLOBAL_BATCH = 8


def _dist_data(step):
    """Inputs and targets of the global batch: one regression problem per matrix."""
    generator = torch.Generator().manual_seed(500 + step)
    return [(torch.randn(GLOBAL_BATCH, rows, generator=generator), torch.randn(GLOBAL_BATCH, cols, generator=generator))
            for rows, cols in DIST_SHAPES]


def _dist_train(rank, world_size, shard):
    """MuonH on per-matrix regressions; each rank sees its slice of the global batch and gradients
    are averaged across ranks, as DDP does."""
    params = [torch.nn.Parameter(m) for m in random_matrices(DIST_SHAPES, seed=9)]
    opt = MuonH(params, lr=0.05, shard_across_ranks=shard)
    rows = slice(rank * GLOBAL_BATCH // world_size, (rank + 1) * GLOBAL_BATCH // world_size)
    for step in range(DIST_STEPS):
        loss = sum(((x[rows] @ w - y[rows]) ** 2).mean() for w, (x, y) in zip(params, _dist_data(step)))
        loss.backward()
        if world_size > 1:
            for p in params:
                dist.all_reduce(p.grad)
                p.grad /= world_size
        opt.step()
        opt.zero_grad(set_to_none=True)
    return [p.detach().clone() for p in params]


def _dist_worker(rank, world_size, out_dir):
    """One gloo rank. The rendezvous is a file in the test's own folder, not a TCP port: no port picked
    here can be taken by another process before rank 0 binds it, and no rank's teardown depends on a store
    server that lives in (and exits with) rank 0. The barrier before destroy_process_group makes both ranks
    leave their last collective together: a rank that tears its gloo pairs down while its peer is still
    sending or receiving can abort the peer (SIGABRT, "terminate called without an active exception"), as
    train.py's barrier before destroy_process_group does for its ranks."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(out_dir, 'rendezvous')}", rank=rank,
                            world_size=world_size)
    try:
        sharded = _dist_train(rank, world_size, shard=True)
        unsharded = _dist_train(rank, world_size, shard=False)
        torch.save({"sharded": sharded, "unsharded": unsharded}, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_agree_bitwise_and_match_one_process():
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_dist_worker, args=(2, out_dir), nprocs=2, join=True)
        ranks = [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(2)]
    single = _dist_train(rank=0, world_size=1, shard=True)
    for i, shape in enumerate(DIST_SHAPES):
        # Every rank ends with the same bits, sharded or not.
        assert torch.equal(ranks[0]["sharded"][i], ranks[1]["sharded"][i]), shape
        assert torch.equal(ranks[0]["unsharded"][i], ranks[1]["unsharded"][i]), shape
        # Sharding the Newton-Schulz work changes nothing.
        torch.testing.assert_close(ranks[0]["sharded"][i], ranks[0]["unsharded"][i], rtol=0, atol=1e-6)
        # Two half-batches with averaged gradients = one process with the global batch.
        torch.testing.assert_close(ranks[0]["sharded"][i], single[i], rtol=0, atol=1e-6)
        # And the run really moved the weights.
        assert not torch.allclose(single[i], random_matrices(DIST_SHAPES, seed=9)[i], atol=1e-3)


# ------------------------------------------------------------------------------------------------
# Learning-rate rule and schedule


@pytest.mark.parametrize("tokens_ref", [D_REF_LOOPED, D_REF_PLAIN])
def test_reference_point_gives_the_base_lrs(tokens_ref):
    assert (REF_WIDTH, REF_BATCH_TOKENS) == (640, 2 ** 18)
    lrs = learning_rates(d_model=640, batch_tokens=2 ** 18, tokens=tokens_ref, tokens_ref=tokens_ref)
    assert lrs == pytest.approx({"matrix": 0.014, "embedding": 0.3, "unembedding": 0.004, "norm": 0.005,
                                 "hyper": 0.01}, rel=1e-12)


def test_transfer_factors_move_the_right_way():
    ref = dict(d_model=640, batch_tokens=2 ** 18, tokens=D_REF_LOOPED, tokens_ref=D_REF_LOOPED)
    base = learning_rates(**ref)

    wider = learning_rates(**{**ref, "d_model": 1280})
    assert wider["matrix"] == pytest.approx(base["matrix"])                  # MuonH: no width factor
    for name in ("embedding", "unembedding", "norm", "hyper"):
        assert wider[name] == pytest.approx(base[name] * 2 ** -0.5)          # AdamW: (d/d0)^-0.5

    bigger_batch = learning_rates(**{**ref, "batch_tokens": 2 ** 19})
    for name in ("matrix", "embedding", "unembedding"):
        assert bigger_batch[name] == pytest.approx(base[name] * 2 ** 0.558)  # (B/B0)^0.558
    for name in ("norm", "hyper"):
        assert bigger_batch[name] == pytest.approx(base[name])

    longer = learning_rates(**{**ref, "tokens": 2 * D_REF_LOOPED})
    assert longer["matrix"] == pytest.approx(base["matrix"] * 2 ** -0.32)    # (D/D_ref)^-0.32
    for name in ("embedding", "unembedding", "norm", "hyper"):
        assert longer[name] == pytest.approx(base[name])                     # AdamW: no data factor

    # The exponents are arguments (truncate-or-not re-estimated the data exponent at 0.40).
    assert learning_rates(**{**ref, "tokens": 2 * D_REF_LOOPED}, data_exp=0.40)["matrix"] == \
        pytest.approx(0.014 * 2 ** -0.40)
    with pytest.raises(ValueError):
        learning_rates(**{**ref, "tokens": 0})
