"""
What sampled loop counts (train.py --loops) cost a compiled CPU step against a fixed r, side by side in one run:
the graphs torch.compile builds (each block is compiled on its own, runs.compile_or_eager, so a new T should
reuse them: no graph per T) and the time per step, over steps whose loop counts the sampler drew (mean T = r);
then the whole model compiled, as a fixed r is on GPU: Dynamo's graphs over the same draws, and where it fails
(which is why a sampled T compiles per block on GPU too: nanoloop/runs.compiles_per_block).

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


def fresh_model(cfg):
    """A CPU model at seed 0, with Dynamo's caches and counters emptied, so that each arm counts its own graphs."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    model = GPT(cfg)
    model.set_device_backend(torch.device("cpu"))
    return model


def step_times(loops, cfg, steps, batch):
    """(graphs compiled, seconds per step after the first) of `steps` forward+backward passes at the drawn T."""
    compiled, _ = compile_or_eager(fresh_model(cfg), batch, cfg.seq_len)
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len))
    times = []
    for step in range(steps):
        t = draw(loops, 0, step, cfg.r)
        start = time.perf_counter()
        compiled(x, x, r=t, r_bwd=backward_loops(loops, cfg, t)).backward()
        times.append(time.perf_counter() - start)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    return graphs, sum(times[1:]) / (steps - 1)


def whole_model_graphs(loops, cfg, steps, batch):
    """(graphs Dynamo traced, how it stopped or "") over the drawn T of the whole model under torch.compile, as
    compile_or_eager compiles a fixed r on GPU. Backend "eager": Dynamo's tracing and guards are the same for
    every backend, so inductor's code generation is not needed to count graphs or to meet a trace that fails."""
    compiled = torch.compile(fresh_model(cfg), backend="eager")
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len))
    stopped = ""
    for step in range(steps):
        t = draw(loops, 0, step, cfg.r)
        try:
            compiled(x, x, r=t, r_bwd=backward_loops(loops, cfg, t)).backward()
        except Exception as e:  # Dynamo raises many kinds; the first one ends the arm
            stopped = f"failed at step {step} (T = {t}): {type(e).__name__}"
            break
    return torch._dynamo.utils.counters["stats"]["unique_graphs"], stopped


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
    print("each block compiled (compile_or_eager on CPU, and on GPU for a sampled T):")
    for name, (graphs, seconds) in results.items():
        print(f"  {name:<24} graphs {graphs:>3}   {1000 * seconds:7.1f} ms/step   {seconds / fixed_time:.2f}x fixed")
    print("the whole model compiled (compile_or_eager on GPU for a fixed r; Dynamo's traces, eager backend):")
    for name, loops in arms.items():
        graphs, stopped = whole_model_graphs(loops, cfg, min(args.steps, 12), args.batch)
        print(f"  {name:<24} graphs {graphs:>3}   {stopped or 'every step ran'}")


if __name__ == "__main__":
    main()
