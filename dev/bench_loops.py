"""
What sampled loop counts (train.py --loops) cost a compiled CPU step against a fixed r, side by side in one run:
the graphs torch.compile builds (each block is compiled on its own, runs.compile_or_eager, so a new T should
reuse them: no graph per T) and the time per step, over steps whose loop counts the sampler drew (mean T = r).

    python dev/bench_loops.py                 # d = 64, r = 4 against uniform 1..7, 40 steps each
    python dev/bench_loops.py --steps 10      # quicker
"""
import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import flops  # noqa: E402
from model import GPT  # noqa: E402
from nanoloop.loops import LoopCounts, backward_loops, draw  # noqa: E402
from nanoloop.runs import compile_or_eager  # noqa: E402


def step_times(loops, cfg, steps, batch):
    """(graphs compiled, seconds per step after the first) of `steps` forward+backward passes at the drawn T."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    model = GPT(cfg)
    model.set_device_backend(torch.device("cpu"))
    compiled, _ = compile_or_eager(model, batch, cfg.seq_len)
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len))
    times = []
    for step in range(steps):
        t = draw(loops, 0, step, cfg.r)
        start = time.perf_counter()
        compiled(x, x, r=t, r_bwd=backward_loops(loops, cfg, t)).backward()
        times.append(time.perf_counter() - start)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    return graphs, sum(times[1:]) / (steps - 1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args()
    torch.set_num_threads(1)
    cfg = flops.ModelConfig(r=4, scale=1, head_dim=16, vocab_size=2048, seq_len=128)
    arms = {"fixed r = 4": LoopCounts(), "uniform 1..7 (mean 4)": LoopCounts("uniform", low=1, high=7)}
    results = {name: step_times(loops, cfg, args.steps, args.batch) for name, loops in arms.items()}
    fixed_time = results["fixed r = 4"][1]
    for name, (graphs, seconds) in results.items():
        print(f"{name:<24} graphs {graphs:>3}   {1000 * seconds:7.1f} ms/step   {seconds / fixed_time:.2f}x fixed")


if __name__ == "__main__":
    main()
