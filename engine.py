"""
Inference for the looped model: a KV cache exact across recurrences, and sampling through it.

    from engine import generate, sample_texts
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

    def __init__(self, cfg, r, lengths, max_len, kv_budget=None, device=None):
        self.r = r
        budget = r if kv_budget is None else kv_budget
        if not 1 <= budget <= r:
            raise ValueError(f"kv_budget must be in 1..r={r}, got {budget}")
        # The cache layer of each executed layer, in execution order: prelude, r loops, coda.
        loops = [cfg.prelude + (i % budget) * cfg.recur + j for i in range(r) for j in range(cfg.recur)]
        first_coda = cfg.prelude + budget * cfg.recur
        self.slots = [*range(cfg.prelude), *loops, *range(first_coda, first_coda + cfg.coda)]
        self.shape = (first_coda + cfg.coda, len(lengths), cfg.n_head, max_len, cfg.head_dim)
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
        self.k[slot, :, :, self.first:self.pos] = k.transpose(1, 2)
        self.v[slot, :, :, self.first:self.pos] = v.transpose(1, 2)
        keys, values = self.k[slot, :, :, :self.pos], self.v[slot, :, :, :self.pos]
        y = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=self.mask)
        return y.transpose(1, 2)


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



def cached_forward(model, idx, cache):
    """Logits (B, T, vocab) of T new columns appended to `cache` (prefill, then decode), at the cache's r."""
    rope = cache.begin(idx.size(1))
    return model.softcapped_logits(model.final_hidden(idx, cache.r, cache.r, rope, cache))


@torch.no_grad()
def generate(model, prompts, max_new_tokens, temperature=1.0, top_k=None, generator=None, stop_id=None,
             r=None, use_cache=True, kv_budget=None):
    """Continue each prompt (token-id lists, any lengths, one batch) by up to max_new_tokens; returns the new
    tokens per row (list of lists). A row ends after emitting stop_id, which it keeps. temperature <= 0 is greedy,
    top_k keeps the k likeliest ids, generator (a torch.Generator; None: the global RNG) is one stream for the
    batch, so only a greedy row is independent of the others. r is the loop count (default the trained r, App. A).
    use_cache prefills the left-padded batch once and decodes a token at a time through a KVCache (kv_budget < r:
    approximate); use_cache=False reruns each row's whole context every token (the reference). Neither crops: past
    seq_len, RoPE extrapolates. A longer prompt is refused."""
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
    if use_cache:
        cache = KVCache(model.cfg, r, [len(row) for row in rows], longest + max_new_tokens, kv_budget, device)
        padded = [[0] * (longest - len(row)) + row for row in rows]  # left-pad: all rows end in the last column
        step_ids = torch.tensor(padded, device=device)
    else:
        rope = rope_tables(longest + max_new_tokens, model.cfg.head_dim, device)
    for _ in range(max_new_tokens):
        if use_cache:
            logits = cached_forward(model, step_ids, cache)[:, -1]
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
