"""
Weight averaging over the last part of training (train.py --average-last FRAC): the uniform mean of the
weights after each of the last round(FRAC x steps) optimiser steps, which the run then evaluates and keeps
instead of its last iterate. The CPU grids' steps are tiny (2,048 tokens), so the last iterate carries the
noise of its last few batches; the mean of many iterates averages it out, as LAWA (Kaddour 2022, arXiv
2209.14981) and the checkpoint averaging of Sanyal et al. 2023 (arXiv 2306.03241) do for language models.

MuonH keeps each matrix on its sphere ||W||_F = R (muonh.py), and a mean of points on a sphere lies inside it,
so the averaged matrices are put back on their sphere (at the norm of the last iterate, which is R). The other
groups (AdamW's) are averaged as they are.

It steps with the optimisers and is checkpointed with them: train.py appends it to run.optimizers, after MuonH
and AdamW, so its step() sees each step's new weights, and its state_dict() goes into ckpt.pt beside theirs
(a resumed run continues the same mean). It has no param_groups, so the LR schedule passes it by.
"""
import torch

SPHERE_GROUP = "matrix"  # the group MuonH trains on the sphere (model.GPT.optimizer_group)


class WeightAverage:
    """The running mean of the model's parameters from optimiser step `start` (1-based) on."""
    param_groups = ()  # not an LR-scheduled optimiser: train.py's schedule loop sets nothing here

    def __init__(self, groups, start):
        self.params = [param for name in sorted(groups) for param in groups[name]]
        self.on_sphere = [name == SPHERE_GROUP for name in sorted(groups) for _ in groups[name]]
        self.start = start
        self.step_count = 0   # optimiser steps seen
        self.averaged = 0     # of them, the ones in the mean
        self.means = [torch.zeros_like(param, dtype=torch.float32) for param in self.params]

    @torch.no_grad()
    def step(self):
        """After the optimisers' step: fold the new weights into the mean once the window has begun."""
        self.step_count += 1
        if self.step_count < self.start:
            return
        self.averaged += 1
        weight = 1.0 / self.averaged
        for mean, param in zip(self.means, self.params):
            mean.lerp_(param.float(), weight)  # mean += (param - mean) / n: the uniform mean, in fp32

    @torch.no_grad()
    def copy_to_model(self):
        """Put the mean into the parameters (MuonH's matrices back onto their sphere); nothing before the window."""
        if self.averaged == 0:
            return
        for mean, param, on_sphere in zip(self.means, self.params, self.on_sphere):
            value = mean
            if on_sphere:
                radius = torch.linalg.vector_norm(param.float())
                value = mean * (radius / torch.linalg.vector_norm(mean).clamp_min(1e-30))
            param.copy_(value.to(param.dtype))

    def state_dict(self):
        return {"step_count": self.step_count, "averaged": self.averaged, "means": self.means}

    def load_state_dict(self, state):
        if len(state["means"]) != len(self.means):
            raise ValueError(f"the weight average holds {len(state['means'])} tensors, this model {len(self.means)}")
        self.step_count, self.averaged = int(state["step_count"]), int(state["averaged"])
        for mean, saved in zip(self.means, state["means"]):
            mean.copy_(saved)


def weight_average(groups, steps, average_frac):
    """The WeightAverage of the last round(average_frac x steps) steps (at least one), or None for 0 (off)."""
    if not average_frac:
        return None
    window = max(1, round(average_frac * steps))
    return WeightAverage(groups, start=steps - window + 1)
