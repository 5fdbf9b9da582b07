"""
Inference for the looped model: a KV cache exact across recurrences, and sampling through it.

    from nanoloop.engine import generate, sample_texts
    new_tokens = generate(model, [[bos, 17, 42]], max_new_tokens=20, temperature=0)     # greedy
    texts = sample_texts(model, tokenizer, ["The capital of France is"], 48, 0.8, 50)

Iso-depth keeps the non-looped model's KV memory (paper §2, App. D): every recurrence sees a different
hidden state, so an exact cache holds one entry per executed layer, prelude + r*recur + coda = the
effective depth. A prompt is prefilled once, then every new token is one forward through the cache
(nanochat's engine does the same for a plain GPT). `generate(..., use_cache=False)` reruns the whole
context every token instead: the reference the cache is tested against.
"""
import torch
import torch.nn.functional as F

from model import rope_tables


class KVCache:
    """Keys and values of every executed layer, preallocated as (layers, B, heads, T_max, head_dim), for rows
    left-padded to the longest prompt. Each recurrence sees a different hidden state, so the exact cache
    (kv_budget = r) holds prelude + r*recur + coda layers, the effective depth: iso-depth keeps the plain model's
    KV memory (§2, App. D). kv_budget < r approximates, as the authors' code does: recurrent layer j at iteration i
    uses slot i mod kv_budget, reading the last such iteration's earlier keys (its cost: dev/bench_generate.py)."""

    def __init__(self, cfg, r, lengths, max_len, kv_budget=None, device=None, probes=False):
        self.r = r
        budget = r if kv_budget is None else kv_budget
        if not 1 <= budget <= r:
            raise ValueError(f"kv_budget must be in 1..r={r}, got {budget}")
        # The cache layer of each executed layer, in execution order: prelude, r loops, coda. With probes (adaptive
        # exit's KL criterion) each loop also runs the coda on its state, into slots of its own.
        per_loop = cfg.recur + (cfg.coda if probes else 0)
        loops = [cfg.prelude + (i % budget) * per_loop + j for i in range(r) for j in range(per_loop)]
        first_coda = cfg.prelude + budget * per_loop
        self.slots = [*range(cfg.prelude), *loops, *range(first_coda, first_coda + cfg.coda)]
        self.shape = (first_coda + cfg.coda, len(lengths), cfg.n_head, max_len, cfg.head_dim)
        # Adaptive exit (model.GPT.adaptive_recurrence): a token that stopped looping hands later tokens its keys of
        # the loop it stopped at, so each loop slot names the same layer's slot one loop earlier, to copy from.
        self.previous = {loops[k]: loops[k - per_loop] for k in range(per_loop, len(loops))} if budget == r else {}
        self.loop_layers = (cfg.prelude, per_loop)
        self.active = None  # (B, T) the new columns still looping, set by the adaptive recurrence; None: all
        self.loops = None  # (B, T) how many loops each new column ran (adaptive exit)
        self.k = self.v = None  # allocated by the first write, in the dtype it brings (bf16 under autocast)
        self.start = torch.tensor([max(lengths) - n for n in lengths], device=device)  # padding columns per row
        # Sized for prompt + new tokens, not seq_len: decoding past seq_len extrapolates RoPE.
        self.cos, self.sin = rope_tables(max_len, cfg.head_dim, device)
        self.pos = self.layer = 0  # columns filled so far; layers run by the current forward

    def begin(self, T):
        """Open T new columns for one forward: the mask its layers share, and per-row RoPE tables."""
        self.first = self.pos  # this forward writes columns first .. pos - 1
        self.pos += T
        assert self.pos <= self.shape[3], f"the cache holds {self.shape[3]} columns, not {self.pos}"
        cols = torch.arange(self.first, self.pos, device=self.start.device)[:, None]
        keys = torch.arange(self.pos, device=self.start.device)[None, :]
        real = (keys >= self.start[:, None])[:, None, :]  # (B, 1, S)
        # A padding query sees only itself: an all-masked softmax row would be NaN, and 0 * NaN in
        # the value product would leak it into the real rows.
        self.mask = ((keys <= cols) & (real | (keys == cols)))[:, None]  # (B, 1, T, S)
        self.layer = 0
        positions = (cols.T - self.start[:, None]).clamp(min=0)  # (B, T): each row counts from its first token
        return self.cos[positions], self.sin[positions]

    def attend(self, q, k, v):
        """Store this layer's new keys and values (q, k, v: (B, T, H, D)) and attend over all columns
        with SDPA and an explicit mask, on CPU and GPU alike (FlashAttention is the training path's)."""
        slot = self.slots[self.layer]  # layers run in execution order, so the count says which one this is
        self.layer += 1
        if self.k is None:
            self.k = torch.zeros(self.shape, dtype=k.dtype, device=k.device)
            self.v = torch.zeros(self.shape, dtype=v.dtype, device=v.device)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        if self.active is not None and slot in self.previous:  # exited columns keep their last loop's keys
            keep = ~self.active[:, None, :, None]
            k = torch.where(keep, self.k[self.previous[slot], :, :, self.first:self.pos], k)
            v = torch.where(keep, self.v[self.previous[slot], :, :, self.first:self.pos], v)
        self.k[slot, :, :, self.first:self.pos] = k
        self.v[slot, :, :, self.first:self.pos] = v
        keys, values = self.k[slot, :, :, :self.pos], self.v[slot, :, :, :self.pos]
        y = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=self.mask)
        return y.transpose(1, 2)

    def skip_loops(self, done):
        """The loops after the first `done` do not run (every new column has exited): their slots take each
        column's last loop's keys, as an exited column's do, and the coda's layers come next."""
        prelude, per_loop = self.loop_layers
        for index in range(prelude + done * per_loop, prelude + self.r * per_loop):
            slot = self.slots[index]
            self.k[slot, :, :, self.first:self.pos] = self.k[self.previous[slot], :, :, self.first:self.pos]
            self.v[slot, :, :, self.first:self.pos] = self.v[self.previous[slot], :, :, self.first:self.pos]
        self.layer = prelude + self.r * per_loop


def sample_next(logits, temperature, top_k, generator):
    """One id per row of logits (B, V): the argmax if temperature <= 0, else a draw from the top_k softmax."""
    if temperature <= 0:
        return logits.argmax(-1)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = F.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def cached_forward(model, idx, cache, exit_rule=None):
    """Logits (B, T, vocab) of T new columns appended to `cache` (prefill, then decode), at the cache's r, or with
    each token's own loop count under exit_rule (then in cache.loops)."""
    rope = cache.begin(idx.size(1))
    return model.softcapped_logits(model.final_hidden(idx, cache.r, cache.r, rope, cache, exit_rule))


def adaptive_cache(model, rule, lengths, max_len, device=None):
    """The KVCache an adaptive-exit forward writes: a slot for each layer of each of up to max_loops loops, and
    probe slots for the KL criterion's coda."""
    loops = rule.max_loops or model.cfg.r
    return KVCache(model.cfg, loops, lengths, max_len, device=device, probes=rule.criterion == "kl")


@torch.no_grad()
def adaptive_forward(model, idx, rule):
    """(logits (B, T, vocab), loops (B, T)): idx (B, T) at each token's own loop count (model.ExitRule), through a
    fresh cache: every position in parallel, later tokens reading an exited token's keys of its last loop, which
    is what a token-by-token cached decode computes (tests/test_generate.py)."""
    cache = adaptive_cache(model, rule, [idx.size(1)] * idx.size(0), idx.size(1), idx.device)
    logits = cached_forward(model, idx, cache, rule)
    return logits, cache.loops


@torch.no_grad()
def generate(model, prompts, max_new_tokens, temperature=1.0, top_k=None, generator=None, stop_id=None,
             r=None, use_cache=True, kv_budget=None, exit_rule=None):
    """Continue each prompt (token-id lists, any lengths, one batch) by up to max_new_tokens; returns the new
    tokens per row (list of lists). A row ends after emitting stop_id, which it keeps. temperature <= 0 is greedy,
    top_k keeps the k likeliest ids, generator (a torch.Generator; None: the global RNG) is one stream for the
    batch, so only a greedy row is independent of the others. r is the loop count (default the trained r, App. A).
    use_cache prefills the left-padded batch once and decodes a token at a time through a KVCache (kv_budget < r:
    approximate); use_cache=False reruns each row's whole context every token (the reference). exit_rule
    (model.ExitRule): each token loops until it settles, instead of r times (use_cache=False: adaptive_forward over
    the whole context every token). Neither crops: past seq_len, RoPE extrapolates. A longer prompt is refused."""
    rows = [[int(token) for token in prompt] for prompt in prompts]
    longest = max(len(row) for row in rows)
    if longest > model.cfg.seq_len:
        raise ValueError(f"prompt of {longest} tokens is longer than the model's context of "
                         f"{model.cfg.seq_len} tokens: crop it")
    if min(len(row) for row in rows) == 0:
        raise ValueError("every prompt needs at least one token")
    r = model.cfg.r if r is None else r
    device = model.lm_head.weight.device
    new = [[] for _ in rows]
    done = [False] * len(rows)
    if use_cache and exit_rule is not None:
        cache = adaptive_cache(model, exit_rule, [len(row) for row in rows], longest + max_new_tokens, device)
    elif use_cache:
        cache = KVCache(model.cfg, r, [len(row) for row in rows], longest + max_new_tokens, kv_budget, device)
    if use_cache:
        padded = [[0] * (longest - len(row)) + row for row in rows]  # left-pad: all rows end in the last column
        step_ids = torch.tensor(padded, device=device)
    else:
        rope = rope_tables(longest + max_new_tokens, model.cfg.head_dim, device)
    for _ in range(max_new_tokens):
        if use_cache:
            logits = cached_forward(model, step_ids, cache, exit_rule)[:, -1]
        elif exit_rule is not None:
            contexts = [torch.tensor([row + out], device=device) for row, out in zip(rows, new)]
            logits = torch.cat([adaptive_forward(model, ids, exit_rule)[0][:, -1] for ids in contexts])
        else:
            contexts = [torch.tensor([row + out], device=device) for row, out in zip(rows, new)]
            hidden = [model.final_hidden(ids, r, r, rope) for ids in contexts]
            logits = torch.cat([model.softcapped_logits(h)[:, -1] for h in hidden])
        next_ids = sample_next(logits, temperature, top_k, generator)
        for i, token in enumerate(next_ids.tolist()):
            if not done[i]:  # a finished row still rides along in the batch; its tokens are dropped
                new[i].append(token)
                done[i] = token == stop_id
        if all(done):
            break
        step_ids = next_ids[:, None]
    return new


@torch.no_grad()
def sample_texts(model, tokenizer, prompts, max_new_tokens, temperature=1.0, top_k=None, seed=0):
    """The sampled continuation (text) of every prompt (train.py --sample, evaluate.py --prompt): BOS and the
    prompt's tokens go to generate() as one ragged batch, drawing from one generator seeded `seed`, so the
    same call samples the same texts; a sample ends at BOS, where the model would start a new document."""
    ids = [[tokenizer.bos_id] + tokenizer.encode(prompt) for prompt in prompts]
    generator = torch.Generator(device=model.lm_head.weight.device).manual_seed(seed)
    new_tokens = generate(model, ids, max_new_tokens, temperature=temperature, top_k=top_k, generator=generator,
                               stop_id=tokenizer.bos_id)
    texts = []
    for tokens in new_tokens:
        tokens = list(tokens)
        if tokenizer.bos_id in tokens:
            tokens = tokens[:tokens.index(tokenizer.bos_id)]
        texts.append(tokenizer.decode(tokens))
    return texts


def print_samples(model, tokenizer, prompt, count, max_new_tokens, seed):
    """train.py --sample: `count` continuations of `prompt` (temperature 0.8, top-k 50) printed with their prompt,
    seeded by `seed`: a rerun prints the same."""
    texts = sample_texts(model, tokenizer, [prompt] * count, max_new_tokens, 0.8, 50, seed)
    for text in texts:
        print(f"--- {prompt + text!r}")
