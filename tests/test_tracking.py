"""
Optional Weights & Biases logging (tracking.py), tested offline: WANDB_MODE=offline needs no network and no
account. wandb 0.31.0 writes no summary JSON offline, only wandb/offline-run-*/run-<id>.wandb, so the tests
read that file back themselves (read_wandb): what a training run and its evaluation logged must be exactly
the run's identity (config), log.jsonl (history) and the results and evaluation rows (summary).
"""
import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from nanoloop import eval_tasks
from nanoloop import tracking

REPO = Path(__file__).resolve().parents[1]
TINY = ["--scale", "1", "--head-dim", "16", "--depth", "6", "--prelude", "1", "--coda", "1", "--batch-tokens", "512",
        "--ref-batch", "512", "--eval-rows", "64", "--log-every", "1", "--r", "2", "--tokens", "24576"]  # 48 steps
STOP_AFTER_ONE_STEP = ("import signal, sys, train; train.STOP.set(); "
                       "sys.exit(train.main(sys.argv[1:]))")
# A Python where wandb is absent: a meta-path finder ahead of the others answers every import of it as a
# missing module would, and records the attempt. argv[1] names the script's module.
WITHOUT_WANDB = """
import importlib, sys
asked = []
class NoWandb:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "wandb":
            asked.append(name)
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, NoWandb())
code = importlib.import_module(sys.argv[1]).main(sys.argv[2:])
print("wandb imports asked for:", asked)
sys.exit(code)
"""


def python(*args, cwd=REPO):
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="offline", WANDB_SILENT="true", PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=600)


# ----------------------------------------------------------------------------------------------
# Reading an offline run back (wandb 0.31.0, measured): a 7-byte header, then LevelDB-log framing

HEADER = struct.Struct("<4sHB")  # ":W&B", magic 0xBEE1, version 0
CHUNK = struct.Struct("<IHB")    # CRC-32 of (type byte + payload), payload length, type
BLOCK = 32768                    # chunks never cross a block; a tail shorter than a chunk header is padding
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_wandb(path):
    """The wandb_internal_pb2.Record messages of a .wandb file, every chunk's CRC checked (AssertionError)."""
    from wandb.proto import wandb_internal_pb2
    data = Path(path).read_bytes()
    assert HEADER.unpack_from(data) == (b":W&B", 0xBEE1, 0), data[:HEADER.size]
    records, pending, pos = [], None, HEADER.size
    while pos < len(data):
        room = BLOCK - pos % BLOCK
        if room < CHUNK.size:
            assert data[pos:pos + room] == bytes(len(data[pos:pos + room])), f"padding at {pos} is not zeros"
            pos += room
            continue
        crc, length, kind = CHUNK.unpack_from(data, pos)
        payload = data[pos + CHUNK.size:pos + CHUNK.size + length]
        assert CHUNK.size + length <= room and len(payload) == length, f"a chunk at {pos} overruns its block"
        assert zlib.crc32(bytes([kind]) + payload) == crc, f"CRC mismatch in the chunk at byte {pos}"
        pos += CHUNK.size + length
        if kind in (FULL, FIRST):
            assert pending is None, f"a record starts at {pos} inside another"
            pending = b""
        assert kind in (FULL, FIRST, MIDDLE, LAST) and pending is not None, f"chunk type {kind} at {pos}"
        pending += payload
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = None
    assert pending is None, "the file ends inside a record"
    return records


def item_key(item):
    """A history or summary item's key: `key`, or its nested_key path joined by dots (wandb-core writes that)."""
    return item.key or ".".join(item.nested_key)


def offline_run(records):
    """{id, project, name, group, config, history, summary} of one offline run's records: the config
    without wandb's own _wandb, each history step {key: value} without _step/_runtime/_timestamp, the
    summary as the summary records leave it (later updates win)."""
    runs = [rec.run for rec in records if rec.WhichOneof("record_type") == "run"]
    assert len(runs) == 1, len(runs)
    config = {item.key: json.loads(item.value_json) for item in runs[0].config.update if item.key != "_wandb"}
    history, summary = [], {}
    for rec in records:
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            step = {item_key(i): json.loads(i.value_json) for i in rec.history.item if not item_key(i).startswith("_")}
            history.append({"step": rec.history.step.num, **step})
        if kind == "summary":
            summary.update({item_key(i): json.loads(i.value_json) for i in rec.summary.update})
    return {"id": runs[0].run_id, "project": runs[0].project, "name": runs[0].display_name,
            "group": runs[0].run_group, "config": config, "history": history, "summary": summary}


def offline_runs(folder):
    """Every offline run under folder/wandb, oldest first (wandb names them offline-run-<time>-<id>)."""
    files = sorted(Path(folder).glob("wandb/offline-run-*/run-*.wandb"))
    return [offline_run(read_wandb(path)) for path in files]


# ----------------------------------------------------------------------------------------------
# train.py and evaluate.py with --wandb

@pytest.fixture(scope="module")
def logged_run(sample_data, tmp_path_factory):
    """A tiny run with --wandb, stopped after its first step (exit 143) and resumed to its end: the folder."""
    out = tmp_path_factory.mktemp("wandb") / "run"
    args = ["--data", str(sample_data), "--out", str(out), *TINY, "--results", str(out.parent / "results.jsonl"),
            "--wandb", "nanoloop-test", "--wandb-group", "tiny-grid"]
    stopped = python("-c", STOP_AFTER_ONE_STEP, *args)
    assert stopped.returncode == 143, stopped.stderr[-2000:]
    resumed = python("train.py", *args, "--resume")
    assert resumed.returncode == 0 and "resumed" in resumed.stdout, resumed.stderr[-2000:]
    return out


@pytest.mark.slow
def test_a_run_logs_its_identity_steps_and_row_and_a_resumed_run_continues_its_id(logged_run):
    row = json.loads((logged_run / "final.json").read_text())
    steps = [json.loads(line) for line in (logged_run / "log.jsonl").read_text().splitlines()]
    first, second = offline_runs(logged_run)  # the stopped process's and the resumed one's
    assert max(path.stat().st_size for path in logged_run.glob("wandb/*/*.wandb")) > BLOCK  # records span blocks
    assert first["id"] == second["id"] == row["run_id"][:12] == row["run_id"][:tracking.WANDB_ID_HEX]
    for run in (first, second):
        assert (run["project"], run["name"], run["group"]) == ("nanoloop-test", row["run"], "tiny-grid")
        assert run["config"] == row["identity"]
    # The history is log.jsonl: step 1 before the stop, steps 2..48 after the resume, every number as logged.
    assert [h["step"] for h in first["history"]] == [1]
    assert [h["step"] for h in second["history"]] == list(range(2, 49))
    logged = [{k: v for k, v in rec.items() if k != "steps"} for rec in steps]
    assert first["history"] + second["history"] == logged
    assert {"loss", "lr_mult", "tokens_per_s", "mfu"} <= set(logged[-1])
    # The summary holds the results row, every field as final.json has it.
    assert {k: second["summary"].get(k) for k in row} == row
    assert second["summary"]["val_loss"] == row["val_loss"] and "val_loss" not in first["summary"]


@pytest.mark.slow
def test_evaluate_adds_its_rows_to_the_summary_of_the_run_it_evaluates(logged_run, tmp_path):
    eval_tasks.write_bundle(tmp_path / "tasks" / "custom", [
        {"label": "lm", "type": "language_modeling", "num_fewshot": 0, "delimiter": " ", "baseline": 0,
         "items": [{"context": "The sky is", "continuation": "blue"}, {"context": "Grass is", "continuation": "green"}]},
        {"label": "mc", "type": "multiple_choice", "num_fewshot": 0, "delimiter": " ", "baseline": 50,
         "items": [{"query": "Q1?", "choices": ["a", "b"], "gold": 1}]}])
    results = tmp_path / "eval" / "eval.jsonl"
    done = python("evaluate.py", str(logged_run), "--bundles", "custom", "--tasks-dir", str(tmp_path / "tasks"),
                  "--eval-r", "1", "--results", str(results), "--wandb", "nanoloop-test")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(rows) == 4
    (run,) = offline_runs(results.parent)  # beside the rows: nothing is written into the run folder
    row = json.loads((logged_run / "final.json").read_text())
    assert (run["id"], run["name"]) == (row["run_id"][:12], row["run"])
    assert {key: value for key, value in run["summary"].items() if key.startswith("eval/")} == {
        f"eval/{r['task']}/r{r['r']}": r for r in rows}
    assert len(offline_runs(logged_run)) == 2


@pytest.mark.slow
def test_the_reader_refuses_a_damaged_record(logged_run, tmp_path):
    (path,) = sorted(logged_run.glob("wandb/offline-run-*/run-*.wandb"))[-1:]
    data = bytearray(path.read_bytes())
    assert read_wandb(path)
    data[len(data) // 2] ^= 0x01
    (tmp_path / "damaged.wandb").write_bytes(bytes(data))
    with pytest.raises(AssertionError, match="CRC mismatch"):
        read_wandb(tmp_path / "damaged.wandb")


@pytest.mark.slow
def test_without_wandb_nothing_is_imported_or_written_and_asking_for_it_is_one_line(sample_data, tmp_path):
    out = tmp_path / "run"
    args = ["--data", str(sample_data), "--out", str(out), *TINY]
    plain = python("-c", WITHOUT_WANDB, "train", *args, cwd=tmp_path)
    assert plain.returncode == 0 and "wandb imports asked for: []" in plain.stdout, plain.stderr[-2000:]
    assert (out / "final.json").exists() and not list(tmp_path.rglob("wandb"))
    asks = {"train": [*args, "--out", str(tmp_path / "other"), "--wandb", "p"],  # the later --out wins
            "evaluate": [str(out), "--results", str(tmp_path / "e.jsonl"), "--wandb", "p"]}
    for script, script_args in asks.items():
        asked = python("-c", WITHOUT_WANDB, script, *script_args)
        err = asked.stderr.strip().splitlines()
        assert asked.returncode == 2 and len(err) == 1, asked.stderr
        assert err[0].startswith(f"{script}.py: argument --wandb: wandb is not installed"), err
    assert not (tmp_path / "other").exists() and not (tmp_path / "e.jsonl").exists()


def test_a_wandb_run_that_cannot_start_is_one_line_before_any_step(sample_data, tmp_path, monkeypatch, capsys):
    """Online without an API key or a network, wandb.init raises: one line naming the project, exit 2."""
    import wandb
    import train

    def refuse(**kwargs):
        raise wandb.errors.UsageError("api_key not configured (no-tty).\ncall wandb.login(key=...)")
    monkeypatch.setattr(wandb, "init", refuse)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as stop:
        train.main(["--data", str(sample_data), "--out", str(out), *TINY, "--wandb", "nanoloop-test"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("train.py: --wandb nanoloop-test: wandb could not start run ") and "api_key" in err[0]
    assert (out / "log.jsonl").read_text() == "" and not (out / "ckpt.pt").exists()


@pytest.mark.slow
@pytest.mark.parametrize("bad", ["my project", "a/b", "x;y", ""])
def test_a_bad_project_name_is_one_line_before_any_work(sample_data, tmp_path, bad):
    done = python("train.py", "--data", str(sample_data), "--out", str(tmp_path / "run"), *TINY, "--wandb", bad)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "is not a wandb project name" in done.stderr and not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------------------------
# sweep.sh: WANDB_PROJECT passes --wandb to every run, grouped by the grid

def sweep_print(grid, **env):
    full = {k: v for k, v in os.environ.items() if k != "WANDB_PROJECT"}
    return subprocess.run(["bash", "sweep.sh", "--grid", grid, "--print"], cwd=REPO, capture_output=True,
                          text=True, env=dict(full, **env), timeout=120)


def test_sweep_passes_wandb_project_to_every_run_grouped_by_grid():
    plain = sweep_print("cpu-micro")
    logged = sweep_print("cpu-micro", WANDB_PROJECT="nanoloop")
    assert plain.returncode == logged.returncode == 0 and "--wandb" not in plain.stdout
    want = [line + " --wandb nanoloop --wandb-group cpu-micro" for line in plain.stdout.splitlines()]
    assert logged.stdout.splitlines() == want and len(want) == 56
    bad = sweep_print("cpu-micro", WANDB_PROJECT="a b; echo")
    assert bad.returncode == 2 and bad.stdout == "" and bad.stderr.startswith("sweep.sh: WANDB_PROJECT"), bad.stderr
