"""
Benchmark MuonH on CPU: (1) what one optimiser step costs next to the forward+backward of the
s = 10, r = 4 model at a 2^18-token batch, and how sharding splits the Newton-Schulz work across
ranks; (2) accuracy against cost of the Newton-Schulz coefficient sets; (3) the measured speed-up
of sharding the Newton-Schulz work over two CPU processes.

    python dev/bench_muonh.py [--tokens 256] [--repeats 2]

Prints figures only; nothing is asserted. Runs in about 2-3 minutes on 2 cores.
"""
import argparse
import hashlib
import math
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import flops  # noqa: E402
from muonh import (POLAR_EXPRESS_COEFFICIENTS, QUINTIC_COEFFICIENTS, MuonH, build_optimizers,  # noqa: E402
                   learning_rates, orthogonalise, polar_express_coefficients)

BATCH_TOKENS = 2 ** 18


def timed(fn, repeats):
    """Fastest wall time of fn() over `repeats` calls, after one untimed warm-up call. The minimum,
    not the median: on a shared machine the noise only ever adds time."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def ns_flops(shape, steps):
    """Matmul FLOPs of `steps` Newton-Schulz iterations on one m x n matrix (m <= n after the
    transpose): X X^T (2 m^2 n), A A (2 m^3), (bA + cA^2) X (2 m^2 n) per iteration."""
    m, n = sorted(shape)
    return steps * (4 * m * m * n + 2 * m ** 3)


# ------------------------------------------------------------------------------------------------
# (1) optimiser step vs forward + backward


def build_model(cfg):
    """model.GPT when model.py provides it; otherwise a stand-in with the same weight shapes (the
    prelude/shared/coda blocks and W_inj as plain linears, embedding and lm_head) whose forward
    runs the layers in the effective-depth order, without attention."""
    try:
        from model import GPT
        return GPT(cfg), "model.GPT"
    except ImportError:
        pass
    d = cfg.d_model

    def block():
        return torch.nn.ModuleDict({name: torch.nn.Linear(fan_in, fan_out, bias=False) for name, fan_in, fan_out in
                                    [("c_q", d, d), ("c_k", d, d), ("c_v", d, d), ("c_o", d, d),
                                     ("c_fc", d, 4 * d), ("c_proj", 4 * d, d)]})

    class ShapeStandIn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = torch.nn.Embedding(cfg.padded_vocab, d)
            self.prelude = torch.nn.ModuleList(block() for _ in range(cfg.prelude))
            self.recur = torch.nn.ModuleList(block() for _ in range(cfg.recur))
            self.coda = torch.nn.ModuleList(block() for _ in range(cfg.coda))
            self.w_inj = torch.nn.Linear(2 * d, d, bias=False)
            self.lm_head = torch.nn.Linear(d, cfg.padded_vocab, bias=False)

        def run(self, blk, x):
            x = x + blk["c_o"](blk["c_q"](x) + blk["c_k"](x) + blk["c_v"](x))
            return x + blk["c_proj"](torch.relu(blk["c_fc"](x)) ** 2)

        def forward(self, idx, targets):
            e = self.wte(idx)
            for blk in self.prelude:
                e = self.run(blk, e)
            s = e
            for _ in range(cfg.r):
                s = self.w_inj(torch.cat([e, s], dim=-1))
                for blk in self.recur:
                    s = self.run(blk, s)
            for blk in self.coda:
                s = self.run(blk, s)
            return torch.nn.functional.cross_entropy(self.lm_head(s).flatten(0, 1), targets.flatten())

        def param_groups(self):
            return {"matrix": [p for n, p in self.named_parameters() if n not in ("wte.weight", "lm_head.weight")],
                    "embedding": [self.wte.weight], "unembedding": [self.lm_head.weight], "norm": [], "hyper": []}

    return ShapeStandIn(), "shape stand-in (model.py not importable; no attention)"


def bench_step_vs_forward_backward(tokens, repeats):
    seq_len = min(tokens, 128)
    measured_cfg = flops.ModelConfig(r=4, scale=10, seq_len=seq_len)
    full_cfg = flops.ModelConfig(r=4, scale=10)  # seq_len 2048, the training setting
    torch.manual_seed(0)
    model, source = build_model(measured_cfg)
    generator = torch.Generator().manual_seed(0)
    idx = torch.randint(0, measured_cfg.vocab_size, (tokens // seq_len, seq_len), generator=generator)
    targets = torch.randint(0, measured_cfg.vocab_size, idx.shape, generator=generator)

    def forward_backward():
        model.zero_grad(set_to_none=True)
        model(idx, targets).backward()

    fwd_bwd_s = timed(forward_backward, repeats)
    achieved = flops.flops_per_token(measured_cfg) * idx.numel() / fwd_bwd_s
    full_flops = flops.flops_per_token(full_cfg) * BATCH_TOKENS
    fwd_bwd_full_s = full_flops / achieved

    lrs = learning_rates(640, BATCH_TOKENS, flops.reference_horizon(True), flops.reference_horizon(True))
    muon, adamw = build_optimizers(model.param_groups(), lrs)  # bf16 Newton-Schulz, the default
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    muon_s = timed(muon.step, repeats)
    adamw_s = timed(adamw.step, repeats)

    shapes = [tuple(p.shape) for p in muon.param_groups[0]["params"]]
    counts = {shape: shapes.count(shape) for shape in dict.fromkeys(shapes)}
    steps = len(POLAR_EXPRESS_COEFFICIENTS)
    ns_total = sum(n * ns_flops(shape, steps) for shape, n in counts.items())

    print(f"(1) s=10, r=4 ({source}), torch threads {torch.get_num_threads()}")
    print("    MuonH matrices: " + ", ".join(f"{n} x {s[0]}x{s[1]}" for s, n in counts.items()))
    print(f"    fwd+bwd measured: {idx.numel()} tokens (rows of {seq_len}) in {fwd_bwd_s:.2f} s "
          f"= {achieved / 1e9:.1f} GFLOP/s by flops.py's count")
    print(f"    fwd+bwd at 2^18 tokens, seq 2048: extrapolated linearly in FLOPs "
          f"({full_flops:.3e} FLOPs / {achieved / 1e9:.1f} GFLOP/s) = {fwd_bwd_full_s:.0f} s")
    print(f"    MuonH step (bf16 NS x{steps}, batch independent): {muon_s:.2f} s   "
          f"AdamW step: {adamw_s:.3f} s")
    print(f"    optimiser / fwd+bwd time at 2^18 tokens: {(muon_s + adamw_s) / fwd_bwd_full_s:.2%}")
    print(f"    NS FLOPs per step {ns_total:.3e} = {ns_total / full_flops:.3%} of the step's fwd+bwd FLOPs")
    print("    sharded NS work per rank (each shape stack padded to a multiple of the world size):")
    for world in (1, 2, 4, 8):
        per_rank = sum(math.ceil(n / world) * ns_flops(shape, steps) for shape, n in counts.items())
        print(f"      world {world}: {per_rank:.3e} FLOPs/rank ({per_rank / ns_total:.1%} of unsharded)")


# ------------------------------------------------------------------------------------------------
# (2) Newton-Schulz accuracy vs cost


def benchmark_matrices():
    """Gaussian matrices of the model's shapes, and ones with a power-law spectrum s_i ~ 1/i
    (closer to momentum updates, which have a few large directions and a long tail)."""
    generator = torch.Generator().manual_seed(1)
    matrices = []
    for shape in [(640, 640), (640, 2560), (640, 1280)]:
        matrices.append(("gauss", shape, torch.randn(shape, generator=generator)))
        k = min(shape)
        u, _ = torch.linalg.qr(torch.randn(shape[0], k, generator=generator))
        v, _ = torch.linalg.qr(torch.randn(shape[1], k, generator=generator))
        spectrum = 1.0 / torch.arange(1, k + 1, dtype=torch.float32)
        matrices.append(("1/i", shape, (u * spectrum) @ v.T))
    return matrices


def bench_coefficient_sets(repeats):
    coefficient_sets = [
        ("quintic x5", QUINTIC_COEFFICIENTS),
        ("quintic x6", QUINTIC_COEFFICIENTS + QUINTIC_COEFFICIENTS[:1]),
        ("polar express x5 (default)", POLAR_EXPRESS_COEFFICIENTS),
        ("polar express x5, no safety", polar_express_coefficients(safety=0.0)),
        ("polar express x6", polar_express_coefficients(num_steps=6)),
    ]
    references = []
    for kind, shape, matrix in benchmark_matrices():
        u, s, vh = torch.linalg.svd(matrix.double(), full_matrices=False)
        references.append((kind, shape, matrix, u @ vh, s / torch.linalg.vector_norm(s)))
    batch = torch.randn(8, 640, 640)
    print("\n(2) Newton-Schulz in bf16 on 640x640, 640x2560, 640x1280 matrices (Gaussian and s_i ~ 1/i)")
    print("    |s-1| over singular values whose normalised input was >= 1e-3; rel err = ||O - UV^T|| / ||UV^T||;")
    print("    band = the composed polynomial's range over [1e-3, 1]; time = one call on 8 x 640x640 (bf16)")
    header = (f"    {'coefficients':<29}{'band':>15}{'mean|s-1|':>11}{'max|s-1|':>10}"
              f"{'rel err gauss':>15}{'rel err 1/i':>13}{'time':>9}")
    print(header)
    for name, coefficients in coefficient_sets:
        grid = torch.logspace(-3, 0, 100_001, dtype=torch.float64)
        for a, b, c in coefficients:
            grid = a * grid + b * grid ** 3 + c * grid ** 5
        deviations, errors = [], {"gauss": [], "1/i": []}
        for kind, shape, matrix, polar, s_in in references:
            out = orthogonalise(matrix, coefficients).double()
            s_out = torch.linalg.svdvals(out)
            deviations.append((s_out[s_in >= 1e-3] - 1).abs())
            errors[kind].append((torch.linalg.vector_norm(out - polar) / torch.linalg.vector_norm(polar)).item())
        deviations = torch.cat(deviations)
        seconds = timed(lambda: orthogonalise(batch, coefficients), repeats)
        print(f"    {name:<29}{f'[{grid.min():.3f}, {grid.max():.3f}]':>15}{deviations.mean():>11.4f}"
              f"{deviations.max():>10.4f}{max(errors['gauss']):>15.4f}{max(errors['1/i']):>13.4f}"
              f"{seconds * 1e3:>7.0f}ms")


# ------------------------------------------------------------------------------------------------
# (3) sharding measured: two gloo processes against one, one thread each


def layer_shapes(d):
    """MuonH matrices of an r = 4 model at width d: 8 unique blocks (q, k, v, o, c_fc, c_proj)
    and W_inj."""
    return [(d, d)] * 32 + [(4 * d, d)] * 8 + [(d, 4 * d)] * 8 + [(d, 2 * d)]


def _sharding_worker(rank, world_size, port, d, repeats, results):
    torch.set_num_threads(1)
    if world_size > 1:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
    generator = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape, generator=generator) * 0.02) for shape in layer_shapes(d)]
    for p in params:
        p.grad = torch.randn(p.shape, generator=generator)
    opt = MuonH(params)

    opt.step()  # warm-up; also records R
    wall, cpu = [], []
    for _ in range(repeats):
        start_wall, start_cpu = time.perf_counter(), time.process_time()
        opt.step()
        cpu.append(time.process_time() - start_cpu)  # this rank's own work (plus gloo's threads)
        if world_size > 1:
            dist.barrier()  # wall time of the slowest rank
        wall.append(time.perf_counter() - start_wall)
    weights = torch.cat([p.detach().flatten() for p in params]).numpy().tobytes()
    results.put((rank, min(wall), min(cpu), hashlib.sha256(weights).hexdigest()))
    if world_size > 1:
        dist.destroy_process_group()


def bench_sharding(scale, repeats):
    d = 64 * scale
    context = mp.get_context("spawn")
    measured = {}
    for world_size in (1, 2):
        results = context.SimpleQueue()
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        mp.spawn(_sharding_worker, args=(world_size, port, d, repeats, results), nprocs=world_size, join=True)
        measured[world_size] = sorted(results.get() for _ in range(world_size))
    hashes = {digest for world in measured.values() for *_, digest in world}  # sha256 of all weights
    print(f"\n(3) MuonH step with sharded Newton-Schulz, r=4 shapes at d={d} (s={scale}), 1 thread per rank, gloo")
    print("    (CPU time is each rank's own work; wall time waits for the slowest rank and for the gather,")
    print("     and on a loaded 2-core machine it also waits for other processes)")
    for world, ranks in measured.items():
        print(f"    {world} rank{'s' if world > 1 else ' '}: wall {max(r[1] for r in ranks) * 1e3:5.0f} ms/step   "
              f"CPU per rank " + ", ".join(f"{r[2] * 1e3:.0f}" for r in ranks) + " ms")
    print(f"    weights after {repeats + 1} steps: "
          + ("bit-identical on every rank and to the single-process run" if len(hashes) == 1 else "DIFFERENT"))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=256, help="tokens in the measured fwd+bwd")
    parser.add_argument("--repeats", type=int, default=2, help="timed calls per measurement (fastest)")
    args = parser.parse_args()
    bench_step_vs_forward_backward(args.tokens, args.repeats)
    bench_coefficient_sets(args.repeats)
    bench_sharding(scale=4, repeats=3)


if __name__ == "__main__":
    main()
