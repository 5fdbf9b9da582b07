"""
Weight averaging (train.py --average-last FRAC, nanoloop/averaging.py): the run evaluates and keeps the uniform
mean of its weights over the last FRAC of the steps, MuonH's matrices back on their sphere; the run identity
says so (and stays what it was without the flag); a resume inside the window continues the same mean.
"""

import pytest
import torch

from nanoloop import dataloader, runs
from nanoloop.averaging import WeightAverage, weight_average
import train
from conftest import stop_train_after

TINY = ["--scale", "1", "--head-dim", "16", "--depth", "6", "--prelude", "1", "--coda", "1",
        "--batch-tokens", "512", "--ref-batch", "512", "--eval-rows", "64", "--log-every", "1", "--r", "2",
        "--tokens", "5120"]  # 10 steps


def test_the_mean_is_the_uniform_mean_of_the_window_and_matrices_go_back_on_their_sphere():
    matrix, scale = torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.ones(3))
    average = weight_average({"matrix": [matrix], "norm": [scale]}, steps=10, average_frac=0.3)  # steps 8-10
    assert average.start == 8
    seen = []
    for step in range(1, 11):
        with torch.no_grad():
            matrix.copy_(torch.randn(4, 3))
            matrix.mul_(2.0 / matrix.norm())  # MuonH keeps the norm: R = 2
            scale.add_(0.1)
        if step >= 8:
            seen.append((matrix.detach().clone(), scale.detach().clone()))
        average.step()
    average.copy_to_model()
    mean_matrix = torch.stack([m for m, _ in seen]).mean(0)
    assert torch.allclose(matrix, mean_matrix * (2.0 / mean_matrix.norm()), atol=1e-6)
    assert torch.allclose(matrix.norm(), torch.tensor(2.0))
    assert torch.allclose(scale, torch.stack([s for _, s in seen]).mean(0), atol=1e-6)
    assert weight_average({"matrix": [matrix]}, 10, 0) is None  # off


def test_a_saved_average_continues_where_it_stopped():
    param = torch.nn.Parameter(torch.zeros(2))
    first = WeightAverage({"norm": [param]}, start=1)
    for value in (1.0, 2.0):
        param.data.fill_(value)
        first.step()
    second = WeightAverage({"norm": [param]}, start=1)
    second.load_state_dict(first.state_dict())
    param.data.fill_(6.0)
    second.step()
    second.copy_to_model()
    assert param.tolist() == [3.0, 3.0]


def identity_of(sample_data, *extra):
    args = train.parse_args(["--data", str(sample_data), *TINY, *extra])
    meta = dataloader.read_meta(sample_data)
    return runs.run_identity(args, meta, runs.plan_run(args, meta, 1))


def test_the_identity_names_the_average_and_is_unchanged_without_it(sample_data):
    plain, off, on = (identity_of(sample_data, *extra) for extra in ([], ["--average-last", "0"],
                                                                     ["--average-last", "0.2"]))
    assert plain[1] == off[1] and "schedule" not in plain[0]
    assert on[1] != plain[1] and on[0]["schedule"]["average_frac"] == 0.2
    cosine, cosine_avg = (identity_of(sample_data, "--lr-decay", "cosine", *extra)
                          for extra in ([], ["--average-last", "0.2"]))
    assert "average_frac" not in cosine[0]["schedule"] and cosine_avg[1] != cosine[1]


def final_state(out):
    return torch.load(out / "ckpt.pt", weights_only=True)["model"]


def test_a_resume_inside_the_window_is_bit_identical_and_the_row_is_the_mean(sample_data, tmp_path, monkeypatch,
                                                                            capsys):
    unbroken, resumed, last = tmp_path / "unbroken", tmp_path / "resumed", tmp_path / "last"
    assert train.main(["--data", str(sample_data), "--out", str(unbroken), *TINY, "--average-last", "0.5"]) == 0
    assert train.main(["--data", str(sample_data), "--out", str(last), *TINY]) == 0
    put_back = stop_train_after(monkeypatch, 7)  # a checkpoint at step 7, inside the window (steps 6-10)
    assert train.main(["--data", str(sample_data), "--out", str(resumed), *TINY, "--average-last", "0.5"]) == 143
    put_back()
    assert train.main(["--data", str(sample_data), "--out", str(resumed), *TINY, "--average-last", "0.5",
                       "--resume"]) == 0
    ours, theirs, plain = final_state(unbroken), final_state(resumed), final_state(last)
    assert all(torch.equal(ours[key], theirs[key]) for key in ours)
    assert not all(torch.equal(ours[key], plain[key]) for key in ours)  # the mean is not the last iterate
    rows = [runs.read_final(folder / "final.json")["val_loss"] for folder in (unbroken, resumed)]
    assert rows[0] == rows[1]


@pytest.mark.parametrize("bad", ["1.5", "-0.1"])
def test_an_average_outside_the_steps_is_refused_in_one_line(sample_data, tmp_path, capsys, bad):
    with pytest.raises(SystemExit) as exit_:
        train.main(["--data", str(sample_data), "--out", str(tmp_path / "x"), *TINY, "--average-last", bad])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and "--average-last must be in [0, 1]" in err[0]
