"""
Benchmark model.py on CPU: training-step throughput of r = 1, 2, 4, 8 at one width (iso-FLOPs should
mean iso-time), model.py's r = 1 against a minimal plain-PyTorch GPT of the same shape, and the
activation memory of truncated BPTT (r = 8, r_bwd = 8, 4, 2, 1) against the ideal ratio.

    python dev/bench_model.py [--scale 4 --head-dim 64 --seq-len 256 --batch 8 --rounds 5]

Ratios are measured side by side in one run (the configurations are interleaved round-robin and the
median per configuration is reported), because absolute times drift on shared machines.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import flops  # noqa: E402
from model import GPT  # noqa: E402


class PlainGPT(nn.Module):
    """The reference: a 20-layer pre-norm GPT written as plainly as possible, same shapes and ops
    (RoPE, QK-norm, squared ReLU, soft-capped fp32 logits), no looping machinery."""

    def __init__(self, d, n_layer, head_dim, vocab, seq_len):
        super().__init__()
        self.h, self.hd = d // head_dim, head_dim
        self.wte = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(nn.ModuleDict(dict(
            qkv=nn.Linear(d, 3 * d, bias=False), o=nn.Linear(d, d, bias=False),
            fc=nn.Linear(d, 4 * d, bias=False), proj=nn.Linear(4 * d, d, bias=False),
            n1=nn.RMSNorm(d, eps=1e-6), n2=nn.RMSNorm(d, eps=1e-6))) for _ in range(n_layer))
        self.n_in, self.n_out = nn.RMSNorm(d, eps=1e-6), nn.RMSNorm(d, eps=1e-6)
        self.head = nn.Linear(d, vocab, bias=False)
        freqs = 1.0 / 10000 ** (torch.arange(0, head_dim, 2).float() / head_dim)
        ang = torch.outer(torch.arange(seq_len).float(), freqs)
        self.register_buffer("cos", ang.cos()[:, None]), self.register_buffer("sin", ang.sin()[:, None])

    def rope(self, x):
        a, b = x.chunk(2, -1)
        return torch.cat([a * self.cos - b * self.sin, a * self.sin + b * self.cos], -1)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.n_in(self.wte(idx))
        for L in self.layers:
            q, k, v = L["qkv"](L["n1"](x)).view(B, T, 3, self.h, self.hd).unbind(2)
            q, k = F.rms_norm(self.rope(q), (self.hd,)), F.rms_norm(self.rope(k), (self.hd,))
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            x = x + L["o"](y.transpose(1, 2).reshape(B, T, -1))
            x = x + L["proj"](F.relu(L["fc"](L["n2"](x))).square())
        logits = self.head(self.n_out(x)).float()
        logits = 15 * torch.tanh(logits / 15)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def activation_bytes(model, idx):
    """Bytes of the tensors autograd keeps for the backward pass of one training step on idx: the
    activation memory that truncated BPTT saves (each storage counted once). Runs the backward."""
    kept = {}

    def pack(t):
        kept[(t.untyped_storage().data_ptr(), t.dtype)] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(idx, idx)
    loss.backward()
    return sum(kept.values())


def step_time(model, opt, idx):
    t0 = time.perf_counter()
    loss = model(idx, idx)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def peak_rss_child(args, r_bwd):
    """Peak RSS growth (MiB) of a fresh process over one training step of r = 8 at this r_bwd:
    the process's high-water mark (VmHWM; not ru_maxrss, which Linux carries over from the parent
    across exec) minus the resident size just before the step (weights already allocated)."""
    code = (f"import sys; sys.path.insert(0, {os.getcwd()!r}); import torch; from flops import ModelConfig;"
            f"from model import GPT; torch.manual_seed(0);"
            f"m = GPT(ModelConfig(r=8, r_bwd={r_bwd}, scale={args.mem_scale}, head_dim={args.head_dim}, "
            f"vocab_size={args.vocab}, seq_len={args.seq_len}));"
            f"import os; base = int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 1024;"
            f"idx = torch.randint(0, {args.vocab}, ({args.mem_batch}, {args.seq_len})); m(idx, idx).backward();"
            f"hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1];"
            f"print((int(hwm) - base) / 1024)")
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=int, default=4)
    p.add_argument("--mem-scale", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--mem-batch", type=int, default=16)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    shape = dict(scale=args.scale, head_dim=args.head_dim, vocab_size=args.vocab, seq_len=args.seq_len)
    idx = torch.randint(0, args.vocab, (args.batch, args.seq_len))
    tokens = idx.numel()

    runs = {}
    for r in (1, 2, 4, 8):
        torch.manual_seed(0)
        cfg = flops.ModelConfig(r=r, **shape)
        m = GPT(cfg)
        runs[f"model.py r={r}"] = (m, torch.optim.SGD(m.parameters(), lr=1e-4), flops.flops_per_token(cfg))
    cfg1 = flops.ModelConfig(r=1, **shape)
    plain = PlainGPT(cfg1.d_model, 20, args.head_dim, cfg1.padded_vocab, args.seq_len)
    runs["plain GPT"] = (plain, torch.optim.SGD(plain.parameters(), lr=1e-4), flops.flops_per_token(cfg1))
    times = {name: [] for name in runs}
    for name, (m, opt, _) in runs.items():  # warm-up
        step_time(m, opt, idx)
    for _ in range(args.rounds):
        for name, (m, opt, _) in runs.items():
            times[name].append(step_time(m, opt, idx))

    print(f"CPU training step (fwd+bwd+SGD), d={cfg1.d_model}, T={args.seq_len}, batch {args.batch}, "
          f"vocab {cfg1.padded_vocab}, {args.threads} threads, median of {args.rounds} interleaved rounds")
    print(f"{'config':<16}{'tokens/s':>10}{'GFLOP/s':>10}{'vs r=1':>9}")
    base = tokens / statistics.median(times["model.py r=1"])
    for name, (_, _, fpt) in runs.items():
        tps = tokens / statistics.median(times[name])
        print(f"{name:<16}{tps:>10,.0f}{fpt * tps / 1e9:>10.1f}{tps / base:>9.3f}")
    ratio_plain = base / (tokens / statistics.median(times["plain GPT"]))
    print(f"model.py r=1 / plain GPT tokens/s = {ratio_plain:.3f}")

    print(f"\nActivation memory of one training step, r=8, d={64 * args.mem_scale}, T={args.seq_len}, "
          f"batch {args.mem_batch}")
    print(f"{'r_bwd':>5}{'saved MiB':>11}{'ratio':>8}{'ideal':>8}{'peak RSS MiB':>14}{'ratio':>8}")
    mem, rss = {}, {}
    for k in (8, 4, 2, 1):
        torch.manual_seed(0)
        cfg = flops.ModelConfig(r=8, r_bwd=k, **{**shape, "scale": args.mem_scale})
        mem_idx = torch.randint(0, args.vocab, (args.mem_batch, args.seq_len))
        mem[k] = activation_bytes(GPT(cfg), mem_idx) / 2 ** 20
        rss[k] = peak_rss_child(args, k)
    for k in (8, 4, 2, 1):
        # Ideal: activations scale with the layers that keep them, prelude + coda + k * recur.
        ideal = (4 + 2 * k) / (4 + 2 * 8)
        print(f"{k:>5}{mem[k]:>11.1f}{mem[k] / mem[8]:>8.3f}{ideal:>8.3f}{rss[k]:>14.1f}{rss[k] / rss[8]:>8.3f}")
    print("ideal = (prelude + coda + r_bwd * recur) / (prelude + coda + r * recur) layers of kept activations;"
          " the measured ratio sits above it by the embedding and logits, which every r_bwd keeps.")


if __name__ == "__main__":
    main()
