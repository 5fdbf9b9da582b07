"""Inference for looped models (paper §2, App. A, App. D): each test is one claim about the KV cache
and generate(). Tiny fp32 models (d = 16, head dim 8) with every weight moved off its init, so that
W_inj and the hyperconnection parameters really mix e and the state."""
import itertools
import json
import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from flops import INJECTIONS, ModelConfig
from nanoloop.engine import KVCache, cached_forward, generate
from model import GPT

VOCAB, SEQ_LEN = 64, 32
# (injection, trained r, r_eval): r = 1 is the plain 20-layer stack; r = 4 at its own r, at fewer
# loops and at more (the hyper mode reuses its last step's parameters beyond the trained r).
EXACT_CASES = [("none", 1, 1)] + [(inj, 4, r_eval) for inj in INJECTIONS for r_eval in (4, 2, 7)]


def make(r=4, injection="linear", seed=0):
    torch.manual_seed(seed)
    model = GPT(ModelConfig(r=r, injection=injection, scale=0.25, head_dim=8, vocab_size=VOCAB, seq_len=SEQ_LEN))
    with torch.no_grad():  # off the identity inits: W_inj = [I|0], alpha one-hot, M = I, beta = 1
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def prompt(n, seed):
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def teacher_forced(model, idx, n_prompt, r=None, kv_budget=None):
    """Prefill idx[:, :n_prompt] in one call, then feed the rest one token per call: (B, T, V) logits."""
    r = model.cfg.r if r is None else r
    cache = KVCache(model.cfg, r, [n_prompt] * idx.size(0), idx.size(1), kv_budget)
    with torch.no_grad():
        steps = [cached_forward(model, idx[:, :n_prompt], cache)]
        steps += [cached_forward(model, idx[:, t:t + 1], cache) for t in range(n_prompt, idx.size(1))]
    return torch.cat(steps, dim=1)


@pytest.mark.parametrize("injection,r,r_eval", EXACT_CASES)
def test_cached_decoding_gives_the_full_forward_logits_at_every_step(injection, r, r_eval):
    """The cache is exact across recurrences: prefill plus one-token decode steps reproduce the full
    forward's logits at every position, for every injection mode, also at r_eval != r (App. A)."""
    model = make(r, injection)
    idx = torch.randint(0, VOCAB, (2, SEQ_LEN), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(idx, r=r_eval)
    cached = teacher_forced(model, idx, n_prompt=9, r=r_eval)
    assert (cached - full).abs().max() < 1e-5


def test_cache_holds_one_entry_per_executed_layer_like_the_plain_model():
    """Iso-depth keeps the non-looped baseline's KV memory (§2, App. D): r = 4 with a 2/4/2 layout
    executes 2 + 4*4 + 2 = 20 layers and caches 20 per token, as the plain 20-layer r = 1 model of the
    same width; every executed layer writes its own entry, and r_eval = 8 needs 2 + 8*4 + 2 = 36."""
    looped, plain = make(r=4), make(r=1)
    assert (looped.cfg.prelude, looped.cfg.recur, looped.cfg.coda) == (2, 4, 2)
    caches = {}
    for name, model, r in [("looped", looped, 4), ("plain", plain, 1), ("r_eval 8", looped, 8)]:
        caches[name] = KVCache(model.cfg, r, [10, 10], 12)
        with torch.no_grad():
            cached_forward(model, torch.tensor([prompt(10, 2), prompt(10, 3)]), caches[name])
        assert sorted(caches[name].slots) == list(range(caches[name].k.size(0)))  # one slot per executed layer
        assert (caches[name].k[:, :, :, :10].abs().sum(-1) > 0).all()  # ... and every one was written
    assert caches["looped"].k.shape == caches["plain"].k.shape == (20, 2, 2, 12, 8)
    per_token = caches["looped"].k.nbytes * 2 / (2 * 12)
    assert per_token == caches["plain"].k.nbytes * 2 / (2 * 12) == 20 * 2 * 16 * 4  # layers * (k, v) * d * fp32
    assert caches["r_eval 8"].k.size(0) == 36


@pytest.mark.parametrize("injection,r_eval", zip(INJECTIONS, itertools.cycle([4, 6, 2])))
def test_greedy_samples_are_the_same_with_and_without_the_cache(injection, r_eval):
    """Greedy decoding through the cache equals rerunning the whole context every token, also past
    the model's seq_len (both extrapolate RoPE, neither crops) and at r_eval != r."""
    model = make(4, injection)
    prompts = [prompt(14, 4), prompt(3, 5)]
    cached = generate(model, prompts, 24, temperature=0, r=r_eval)
    uncached = generate(model, prompts, 24, temperature=0, r=r_eval, use_cache=False)
    assert cached == uncached and [len(row) for row in cached] == [24, 24]  # 14 + 24 > seq_len = 32


def test_each_row_of_a_ragged_batch_equals_its_unbatched_run():
    """Left padding with per-row RoPE positions and a key-padding mask: a row's logits and greedy
    tokens do not depend on the other rows or on how much it was padded."""
    model = make(4, "hyper")
    prompts = [prompt(12, 6), prompt(1, 7), prompt(5, 8)]
    batched = generate(model, prompts, 15, temperature=0)
    assert batched == [generate(model, [p], 15, temperature=0)[0] for p in prompts]
    padded = torch.tensor([[0] * (12 - len(p)) + p for p in prompts])
    cache = KVCache(model.cfg, 4, [len(p) for p in prompts], 13)
    with torch.no_grad():
        logits = cached_forward(model, padded, cache)
        step = cached_forward(model, torch.tensor([[3], [4], [5]]), cache)[:, 0]
        for i, p in enumerate(prompts):
            alone = model(torch.tensor([p + [3 + i]]))[0]
            assert (logits[i, 12 - len(p):] - alone[:-1]).abs().max() < 1e-5
            assert (step[i] - alone[-1]).abs().max() < 1e-5


def test_a_generator_seed_reproduces_its_samples_with_and_without_the_cache():
    """Sampling draws from one torch.Generator for the whole batch: the same seed gives the same rows,
    through the cache or not, and another seed gives others. A sampled row shares that stream with
    its batch, so unlike a greedy row it is not compared with its unbatched run."""
    model = make(4, "linear")
    prompts = [prompt(7, 9), prompt(2, 10), prompt(11, 11)]

    def sample(seed, use_cache=True):
        generator = torch.Generator().manual_seed(seed)
        return generate(model, prompts, 20, temperature=1.0, top_k=20, generator=generator, use_cache=use_cache)

    first = sample(100)
    assert first == sample(100) == sample(100, use_cache=False)
    assert first != sample(101) and [len(row) for row in first] == [20, 20, 20]


def test_top_k_1_is_greedy():
    model = make(4, "additive")
    prompts = [prompt(6, 12), prompt(9, 13)]
    top_1 = generate(model, prompts, 20, temperature=0.7, top_k=1, generator=torch.Generator().manual_seed(0))
    assert top_1 == generate(model, prompts, 20, temperature=0)


def test_stop_token_ends_only_its_row():
    """A row ends right after emitting stop_id (kept as its last token); the other rows go on."""
    model = make(4, "passthrough")
    prompts = [prompt(4, 14), prompt(8, 15)]
    free = generate(model, prompts, 25, temperature=0)
    stop_id = next(t for t in free[0][2:] if t not in free[1])  # row 0 emits it, row 1 never does
    stopped = generate(model, prompts, 25, temperature=0, stop_id=stop_id)
    assert stopped[0] == free[0][: free[0].index(stop_id) + 1] and len(stopped[0]) < 25
    assert stopped[1] == free[1]


def test_a_prompt_longer_than_the_context_is_one_clear_error():
    model = make(4)
    message = "prompt of 40 tokens is longer than the model's context of 32 tokens: crop it"
    for use_cache in (True, False):
        with pytest.raises(ValueError, match=message):
            generate(model, [prompt(5, 16), prompt(40, 17)], 3, use_cache=use_cache)


def test_kv_budget_equal_to_r_is_exact_and_a_smaller_one_is_an_approximation():
    """The authors' smaller recurrence KV budget (slot i mod kv_budget): budget = r is the exact cache;
    below r the prompt is still exact (each loop reads the keys it just wrote) and the decoded tokens
    are approximate. Their deviation is reported, not asserted: dev/bench_generate.py measures the
    loss it costs on a trained model."""
    model = make(4, "linear")
    idx = torch.randint(0, VOCAB, (2, SEQ_LEN), generator=torch.Generator().manual_seed(18))
    with torch.no_grad():
        full = model(idx)
    assert (teacher_forced(model, idx, 9, kv_budget=4) - full).abs().max() < 1e-5
    exact_loss = F.cross_entropy(full[:, 9:-1].reshape(-1, VOCAB), idx[:, 10:].reshape(-1)).item()
    for budget in (2, 1):
        approx = teacher_forced(model, idx, 9, kv_budget=budget)
        assert (approx[:, :9] - full[:, :9]).abs().max() < 1e-5 and torch.isfinite(approx).all()
        loss = F.cross_entropy(approx[:, 9:-1].reshape(-1, VOCAB), idx[:, 10:].reshape(-1)).item()
        print(f"kv_budget {budget} of r = 4: max |logit - exact| {(approx - full).abs().max():.2e}, "
              f"decode loss {loss:.4f} vs exact {exact_loss:.4f} nats (random-init model)")
        assert math.isfinite(loss)
    assert len(generate(model, [prompt(5, 19)], 10, temperature=0, kv_budget=2)[0]) == 10
    with pytest.raises(ValueError, match="kv_budget"):
        generate(model, [prompt(5, 19)], 2, kv_budget=5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cache_on_gpu_matches_the_forward_in_fp32_and_runs_under_bf16_autocast():
    model = make(4, "hyper").cuda()
    model.set_device_backend("cuda")
    idx = torch.randint(0, VOCAB, (2, SEQ_LEN), generator=torch.Generator().manual_seed(20)).cuda()
    with torch.no_grad():
        full = model(idx)
    assert (teacher_forced(model, idx, 9) - full).abs().max() < 1e-4  # TF32-free fp32, other kernels
    with torch.autocast("cuda", dtype=torch.bfloat16):
        with torch.no_grad():
            full_bf16 = model(idx)
        cached_bf16 = teacher_forced(model, idx, 9)
        generator = torch.Generator("cuda").manual_seed(0)
        rows = generate(model, [prompt(9, 21), prompt(3, 22)], 12, temperature=0.8, top_k=10, generator=generator)
    assert (cached_bf16 - full_bf16).abs().max() < 0.1 and [len(row) for row in rows] == [12, 12]


# ---------------------------------------------------------------------------------------------
# Adaptive depth (model.ExitRule, engine.adaptive_forward): Huginn's per-token exit through the exact cache

def adaptive_teacher_forced(model, idx, n_prompt, rule):
    """Prefill idx[:, :n_prompt], then one token per call through the adaptive cache: (logits, loops)."""
    from nanoloop.engine import adaptive_cache
    cache = adaptive_cache(model, rule, [n_prompt] * idx.size(0), idx.size(1))
    logits, loops = [], []
    with torch.no_grad():
        for start, end in [(0, n_prompt)] + [(t, t + 1) for t in range(n_prompt, idx.size(1))]:
            logits.append(cached_forward(model, idx[:, start:end], cache, rule))
            loops.append(cache.loops)
    return torch.cat(logits, dim=1), torch.cat(loops, dim=1)


@pytest.mark.parametrize("criterion", ["kl", "latent"])
def test_a_threshold_of_0_is_the_fixed_r_model(criterion):
    """No token settles below 0: every token runs the trained r loops, with the fixed model's logits and loss (the
    probes of the KL criterion read the state and change nothing), and greedy generation is the fixed model's."""
    from nanoloop.engine import adaptive_forward
    from model import ExitRule
    model = make(r=4, injection="linear")
    idx = torch.randint(0, VOCAB, (2, SEQ_LEN), generator=torch.Generator().manual_seed(3))
    rule = ExitRule(criterion, 0.0)
    cache = KVCache(model.cfg, 4, [SEQ_LEN] * 2, SEQ_LEN)
    with torch.no_grad():
        logits, loops = adaptive_forward(model, idx, rule)
        assert torch.equal(logits, cached_forward(model, idx, cache)) and bool((loops == 4).all())
        assert (logits - model(idx)).abs().max() < 1e-5
    prompts = [prompt(6, 4), prompt(3, 5)]
    assert generate(model, prompts, 12, temperature=0, exit_rule=rule) == generate(model, prompts, 12, temperature=0)


def varied_rule(model, idx, criterion):
    """The exit rule (min 2 loops) at the largest threshold of a log grid whose tokens exit at >= 3 loop counts (the
    largest: criteria far above float32's rounding, so that no token sits on the threshold by chance)."""
    from nanoloop.engine import adaptive_forward
    from model import ExitRule
    for threshold in torch.logspace(1, -6, 36).tolist():
        rule = ExitRule(criterion, threshold, min_loops=2)
        if len(set(adaptive_forward(model, idx, rule)[1].flatten().tolist())) >= 3:
            return rule
    raise AssertionError(f"no threshold makes the {criterion} criterion exit tokens at different loops")


@pytest.mark.parametrize("criterion", ["kl", "latent"])
@pytest.mark.parametrize("injection", ["linear", "additive"])
def test_the_adaptive_cache_is_exact_against_recomputing_everything(criterion, injection):
    """Tokens exit at different loops (the threshold is set so that they do). An exited token keeps its state, and a
    later token's layer at loop t reads its keys of the loop it exited at (Huginn's choice: its last computed
    entry for that layer); the cache stores exactly that. So decoding token by token through the cache gives the
    logits and loop counts of the whole sequence recomputed in one forward at every position, and cached greedy
    generation gives the tokens of recomputing the whole context every step."""
    from nanoloop.engine import adaptive_forward
    model = make(r=8, injection=injection)
    idx = torch.randint(0, VOCAB, (2, SEQ_LEN), generator=torch.Generator().manual_seed(6))
    rule = varied_rule(model, idx, criterion)
    with torch.no_grad():
        full, full_loops = adaptive_forward(model, idx, rule)
    cached, cached_loops = adaptive_teacher_forced(model, idx, 7, rule)
    assert 2 <= full_loops.min() and full_loops.max() <= 8 and len(set(full_loops.flatten().tolist())) > 1
    assert torch.equal(cached_loops, full_loops) and (cached - full).abs().max() < 1e-5
    prompts = [prompt(5, 7), prompt(9, 8)]
    assert generate(model, prompts, 10, temperature=0, exit_rule=rule) == \
        generate(model, prompts, 10, temperature=0, exit_rule=rule, use_cache=False)


def test_an_exited_token_keeps_its_state_and_hands_later_tokens_its_last_keys():
    """The first token attends only to itself, so after exiting at loop k its logits are the fixed model's at r = k;
    every later loop's slot of each of its layers holds its loop-k keys and values."""
    from nanoloop.engine import adaptive_cache, adaptive_forward
    model = make(r=8, injection="linear")
    idx = torch.randint(0, VOCAB, (2, SEQ_LEN), generator=torch.Generator().manual_seed(10))
    rule = varied_rule(model, idx, "latent")
    cache = adaptive_cache(model, rule, [SEQ_LEN] * 2, SEQ_LEN)
    with torch.no_grad():
        logits = cached_forward(model, idx, cache, rule)
        assert torch.equal(logits, adaptive_forward(model, idx, rule)[0])
        for row in range(2):
            k = int(cache.loops[row, 0])
            assert (logits[row, 0] - model(idx[row:row + 1, :1], r=k)[0, 0]).abs().max() < 1e-5
    prelude, recur = model.cfg.prelude, model.cfg.recur
    row, col = torch.nonzero(cache.loops < 8)[0].tolist()
    k = int(cache.loops[row, col])
    for t in range(k, 8):
        for j in range(recur):
            exited, later = cache.slots[prelude + (k - 1) * recur + j], cache.slots[prelude + t * recur + j]
            assert torch.equal(cache.k[later, row, :, col], cache.k[exited, row, :, col])
            assert torch.equal(cache.v[later, row, :, col], cache.v[exited, row, :, col])


def test_a_higher_threshold_spends_fewer_loops_within_the_bounds():
    from nanoloop.engine import adaptive_forward
    from model import ExitRule
    model = make(r=8, injection="linear")
    idx = torch.randint(0, VOCAB, (2, SEQ_LEN), generator=torch.Generator().manual_seed(9))
    spent = [adaptive_forward(model, idx, ExitRule("latent", t))[1].float().mean().item() for t in (0.0, 0.1, 0.3, 1.0)]
    assert spent[0] == 8 and all(a >= b for a, b in zip(spent, spent[1:])) and spent[-1] == 2
    capped = adaptive_forward(model, idx, ExitRule("latent", 0.0, max_loops=3))[1]
    assert bool((capped == 3).all())
    floor = adaptive_forward(model, idx, ExitRule("latent", 1.0, min_loops=5))[1]
    assert bool((floor == 5).all())


@pytest.mark.parametrize("bad", [dict(threshold=-0.1), dict(criterion="entropy"), dict(min_loops=0)])
def test_an_exit_rule_that_means_nothing_is_refused(bad):
    from model import ExitRule
    with pytest.raises(ValueError, match="exit rule"):
        ExitRule(**bad)
    from nanoloop.engine import adaptive_forward
    with pytest.raises(ValueError, match="state injection"):
        adaptive_forward(make(r=4, injection="hyper"), torch.zeros(1, 4, dtype=torch.long), ExitRule())


def test_loop_curves_scores_each_run_at_each_loop_count_and_adaptive_exit_where_a_state_exits(sample_data, tmp_path):
    """dev/loop_curves.py (App. A's test-time loops; adaptive exit beside them): a row per run and loop count, and
    per threshold for the runs adaptive exit can exit (a state injection: a hyperconnected run is passed over up
    front, not refused after its fixed curve). Threshold 0 never exits: the fixed model at max_loops, exactly."""
    from test_evaluate import REPO, make_run
    linear = make_run(tmp_path / "runs" / "linear", sample_data, seed=1)
    hyper = make_run(tmp_path / "runs" / "hyper", sample_data, seed=2, injection="hyper")
    out = tmp_path / "loops"
    proc = subprocess.run([sys.executable, "dev/loop_curves.py", str(linear), str(hyper), "--loops", "1,2,4",
                           "--exit", "kl,latent", "--thresholds", "0,0.05", "--max-loops", "4", "--adaptive-runs", "all",
                           "--rows", "8", "--batch", "8", "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "loops.jsonl").read_text().splitlines()]
    fixed = {(row["run"], row["loops"]): row["val_loss"] for row in rows if row["mode"] == "fixed"}
    assert set(fixed) == {(run, loops) for run in ("linear", "hyper") for loops in (1, 2, 4)}
    adaptive = [row for row in rows if row["mode"] != "fixed"]
    assert {(row["run"], row["mode"], row["threshold"]) for row in adaptive} == \
        {("linear", mode, t) for mode in ("kl", "latent") for t in (0, 0.05)}
    for row in adaptive:
        assert 1 <= row["mean_loops"] <= 4
        if row["threshold"] == 0:
            assert row["mean_loops"] == 4 and row["val_loss"] == pytest.approx(fixed[("linear", 4)], abs=1e-5)
    assert (out / "loops.png").stat().st_size > 0


def test_loop_curves_keeps_earlier_rows_beside_new_ones_and_refuses_a_missing_file_first(sample_data, tmp_path):
    """--add-rows: an earlier loops.jsonl (runs whose checkpoints are gone) is kept beside the runs measured now;
    a run measured again replaces its earlier rows; a missing file is one line before any run is scored."""
    from test_evaluate import REPO, make_run
    run = make_run(tmp_path / "runs" / "linear", sample_data, seed=1)
    first, second = tmp_path / "first", tmp_path / "second"
    common = ["--loops", "1,2", "--rows", "8", "--batch", "8"]
    proc = subprocess.run([sys.executable, "dev/loop_curves.py", str(run), *common, "--out", str(first)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    earlier = [json.loads(line) for line in (first / "loops.jsonl").read_text().splitlines()]
    gone = [{**row, "run_id": "gone", "run": "gone"} for row in earlier]  # a run scored before, not here
    (first / "loops.jsonl").write_text("".join(json.dumps(row) + "\n" for row in gone + earlier))
    proc = subprocess.run([sys.executable, "dev/loop_curves.py", str(run), *common, "--add-rows",
                           str(first / "loops.jsonl"), "--out", str(second)], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in (second / "loops.jsonl").read_text().splitlines()]
    assert [row["run"] for row in rows] == ["gone", "gone", "linear", "linear"]  # one row per run and loop count
    missing = subprocess.run([sys.executable, "dev/loop_curves.py", str(run), *common, "--add-rows",
                              str(tmp_path / "nothing.jsonl"), "--out", str(tmp_path / "third")], cwd=REPO,
                             capture_output=True, text=True, timeout=300)
    assert missing.returncode != 0 and "--add-rows" in missing.stderr and "Traceback" not in missing.stderr
    assert not (tmp_path / "third" / "loops.jsonl").exists()


def test_loop_curves_draws_one_line_per_training_distribution_not_per_test_time_count():
    """The figure's lines (loop_curves.arch): a run's trained r, B, injection and the distribution it drew its loop
    counts from in training (trained_loops), never the test-time loop count a row was scored at."""
    from test_evaluate import REPO
    sys.path.insert(0, str(REPO / "dev"))
    from loop_curves import arch
    fixed = {"r": 4, "r_bwd": 4, "injection": "linear", "untied": False, "trained_loops": ""}
    sampled = dict(fixed, trained_loops="T Poisson log-normal, mean 4")
    assert arch(dict(fixed, loops=1)) == arch(dict(fixed, loops=32))
    assert arch(dict(sampled, loops=4)) != arch(dict(fixed, loops=4))
    assert "Poisson" in arch(dict(sampled, loops=2))
