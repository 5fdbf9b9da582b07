"""export_hf.py as a spec: a finished run exported as a Hugging Face folder is model.py's model (the same fp32
logits, the same greedy tokens through generate()'s KV cache, at the trained loop count and at num_loops), built
from model.py's own file; its tokenizer is the run's (BPE and SentencePiece); lm-evaluation-harness scores a
language-modelling item as evaluate.py does; bad input is one line and exit 2. Offline throughout."""
import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from nanoloop import cpu_attention
from nanoloop import dataloader
from nanoloop import engine
import evaluate
import export_hf
import prepare_data
from nanoloop import runs
import train

REPO = Path(__file__).resolve().parents[1]
# A 6-layer looped model (prelude 1, two shared layers looped r = 2 times, coda 1), trained long enough (~5 s on
# one core) that its greedy samples are not one token repeated.
TINY = ["--scale", "0.25", "--head-dim", "8", "--depth", "6", "--prelude", "1", "--coda", "1", "--r", "2",
        "--batch-tokens", "512", "--ref-batch", "512", "--ref-tokens", "2e4", "--eval-rows", "16", "--flops", "1e10"]
TEXTS = ["The history of the world is", "Hello,  world!\n\n  it's 12345 ok", " a leading space",
         "naïve café 日本 ☃", "a literal <|bos|> and <s> stay text", "", "\n"]


@pytest.fixture(scope="module", autouse=True)
def offline(tmp_path_factory):
    """transformers, datasets and lm_eval offline, with their caches (the remote code's copy too) in a temporary
    folder; the variables reach the lm_eval subprocess as well."""
    home = tmp_path_factory.mktemp("hf_home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HOME", str(home))
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("HF_DATASETS_OFFLINE", "1")
        yield


@pytest.fixture(scope="module")
def run_dir(sample_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "tiny_r2"
    assert train.main(["--data", str(sample_data), "--out", str(out), *TINY]) == 0
    return out


@pytest.fixture(scope="module")
def exported(run_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "hf"
    assert export_hf.main([str(run_dir), str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def reference(run_dir):
    """The run as this repository reads it: model.py's GPT with the final weights."""
    return runs.load_run_model(run_dir, "cpu")


@pytest.fixture(scope="module")
def tokenizer(sample_data):
    return dataloader.load_tokenizer(sample_data)


def from_pretrained(folder, **config):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, **config)


def hf_tokenizer(folder, **kwargs):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(folder, trust_remote_code=True, **kwargs)


# ---------------------------------------------------------------------------------------------
# The folder: model.py itself, its library, the wrapper, weights, config, tokenizer

def test_the_remote_code_is_model_py_and_its_imports_with_relative_imports_only(exported):
    copied = sorted(path.stem for path in exported.glob("*.py"))
    assert copied == sorted([*map(export_hf.export_name, export_hf.library_modules()), export_hf.WRAPPER])
    # Every project module model.py imports travels with it (computed, not listed).
    model_imports = {export_hf.export_name(name) for node in export_hf.project_imports((REPO / "model.py").read_text())
                     for name in export_hf.imported_modules(node)}
    assert model_imports <= set(copied) and {"model", "flops", "engine"} <= set(copied)
    for name in export_hf.library_modules():
        ours = export_hf.module_file(name).read_text()
        theirs = (exported / f"{export_hf.export_name(name)}.py").read_text()
        changed = [b for a, b in zip(ours.splitlines(), theirs.splitlines()) if a != b]
        assert len(ours.splitlines()) == len(theirs.splitlines()), name
        # Only the imports differ (package-relative now).
        assert all(line.startswith("from .") for line in changed), name
        assert not export_hf.project_imports(theirs), name
    config = json.loads((exported / "config.json").read_text())
    assert config["num_loops"] == 2 and config["nanoloop"]["r"] == 2 and config["auto_map"]["AutoModelForCausalLM"]
    assert {"model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {p.name for p in exported.iterdir()}


def test_loading_an_export_leaves_this_process_s_kernel_alone(exported):
    """The copied cpu_attention registers its kernel under ops named after its own module: registering this
    repository's names again would replace the ops that its cpu_attention (imported here) goes on calling."""
    from_pretrained(exported)
    q, k, v = (torch.randn(2, 40, 2, 8, requires_grad=True) for _ in range(3))
    if cpu_attention.available():
        out = cpu_attention.causal_attention(q, k, v)
        out.sum().backward()
        expected = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True)
        assert torch.allclose(out, expected.transpose(1, 2), atol=1e-5)


# ---------------------------------------------------------------------------------------------
# The model: model.py's logits, generate() through the cache, num_loops

def test_logits_are_model_py_s_exactly(exported, reference):
    model = from_pretrained(exported)
    idx = torch.randint(0, 512, (3, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(idx).logits
        expected = reference(idx)
    assert logits.dtype == torch.float32 and torch.equal(logits, expected)


@pytest.mark.parametrize("loops", [1, 5])
def test_num_loops_overrides_the_trained_r(exported, reference, loops):
    model = from_pretrained(exported, num_loops=loops)
    idx = torch.randint(0, 512, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model(idx).logits, reference(idx, r=loops))
        assert not torch.equal(model(idx).logits, reference(idx))


def greedy(model, tokenizer, prompts, max_new_tokens):
    """transformers' generate() on a left-padded batch: (new tokens per row, per-step logits (steps, B, V))."""
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False, output_logits=True,
                         return_dict_in_generate=True)
    width = batch["input_ids"].shape[1]
    return [row[width:].tolist() for row in out.sequences], torch.stack(out.logits)


@pytest.mark.parametrize("loops", [None, 3])
def test_greedy_generate_is_engine_generate_through_an_exact_cache(exported, reference, loops):
    """A ragged batch (left-padded by the tokenizer) at the trained r and at num_loops: the tokens are
    engine.generate's, and every step's logits are a full forward's of the row so far (the cache is exact)."""
    config = {} if loops is None else {"num_loops": loops}
    model = from_pretrained(exported, **config)
    tok = hf_tokenizer(exported, padding_side="left")
    prompts = ["The history of", "Water is a very important part of the", "In"]
    new, step_logits = greedy(model, tok, prompts, 16)
    ids = [tok(prompt)["input_ids"] for prompt in prompts]
    assert new == engine.generate(reference, ids, 16, temperature=0, stop_id=tok.bos_token_id, r=loops)
    assert any(len(set(row)) > 2 for row in new)  # the check means something: not one token repeated
    for b, (prompt, row) in enumerate(zip(ids, new)):
        with torch.no_grad():
            full = reference(torch.tensor([prompt + row[:-1]]), r=loops)[0, len(prompt) - 1:]
        assert torch.allclose(step_logits[:len(row), b], full, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------
# The tokenizer: the run's ids, BOS first

def test_tokenizer_gives_the_runs_ids_with_bos_first(exported, tokenizer):
    tok = hf_tokenizer(exported)
    assert tok.bos_token_id == tokenizer.bos_id and len(tok) == tokenizer.vocab_size
    for text in TEXTS:
        ids = tok(text)["input_ids"]
        assert ids == [tokenizer.bos_id] + tokenizer.encode(text), text
        assert tok.decode(ids, skip_special_tokens=True) == text


def test_sentencepiece_tokenizer_gives_the_runs_ids(tmp_path):
    """The paper's tokenizer kind (a tiny SentencePiece BPE shaped like Llama 2's stands in): the same ids, the
    id after the pieces (EXTRA_TOKEN) included, BOS first."""
    import sentencepiece as spm
    docs = [json.loads(line)["text"] for line in (REPO / "data" / "fineweb-edu-sample" / "docs.jsonl").open()]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(docs[:135]), model_prefix=str(tmp_path / "sp"), vocab_size=400, model_type="bpe",
        byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        max_sentence_length=20000, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1, minloglevel=2)
    data = tmp_path / "data"
    prepare_data.main(["--source", str(REPO / "data" / "fineweb-edu-sample" / "docs.jsonl"), "--val-fraction", "0.1",
                       "--seq-len", "64", "--tokenizer", "llama2", "--tokenizer-model", str(tmp_path / "sp.model"),
                       "--out", str(data), "--workers", "1"])
    ours = dataloader.load_tokenizer(data)
    export_hf.hf_tokenizer(data).save_pretrained(tmp_path / "hf")
    tok = hf_tokenizer(tmp_path / "hf")
    assert (tok.bos_token_id, len(tok)) == (ours.bos_id, ours.vocab_size)
    for text in [*TEXTS, *docs[:20], f"x {dataloader.EXTRA_TOKEN} y"]:
        ids = tok(text)["input_ids"]
        assert ids == [ours.bos_id] + ours.encode(text), text
        assert tok.decode(ids[1:]) == ours.decode(ids[1:])


# ---------------------------------------------------------------------------------------------
# lm-evaluation-harness: the exported model's per-item log-likelihoods are evaluate.py's

LM_ITEMS = [{"context": "The sky is", "continuation": "blue"},
            {"context": "The history of the world is", "continuation": "long"},
            {"context": "Water boils at", "continuation": "100 degrees"},
            {"context": "In the beginning", "continuation": "was the word"},
            {"context": " ".join(["word"] * 80), "continuation": "end"}]  # longer than the 64-token window: cropped


def lm_eval_task(folder, items):
    """A local lm_eval task over items.jsonl, rendered as evaluate.py renders a language-modelling item (the
    context, the delimiter " ", the continuation)."""
    (folder / "items.jsonl").write_text("".join(json.dumps(item) + "\n" for item in items))
    (folder / "nanoloop_lm.yaml").write_text(
        "task: nanoloop_lm\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {folder / 'items.jsonl'}\n"
        "test_split: test\n"
        "output_type: loglikelihood\n"
        'doc_to_text: "{{context}}"\n'
        'doc_to_target: " {{continuation}}"\n'
        "metric_list:\n  - metric: acc\n")


def evaluate_py_loglikelihoods(model, tokenizer, items):
    """evaluate.py's log-likelihood of each item's gold continuation (--scoring core): its encode_task, its
    window and its score, negated."""
    task = {"label": "lm", "type": "language_modeling", "items": items, "delimiter": " ", "num_fewshot": 0,
            "shots": 0, "indices": list(range(len(items))), "dataset": "test", "baseline": 0.0}
    encoded, skipped = evaluate.encode_task(task, tokenizer, "core", model.cfg.seq_len)
    assert not skipped
    windows = [evaluate.crop_window(tokenizer.bos_id, context, continuation, model.cfg.seq_len)
               for _, ((context, continuation),) in encoded]
    scores = evaluate.score(model, [w[0] for w in windows], [w[1] for w in windows], model.cfg.r, "cpu", 4096)
    return [-nats for nats, _ in scores]


@pytest.mark.slow
def test_lm_eval_log_likelihoods_are_evaluate_py_s(exported, reference, tokenizer, tmp_path):
    lm_eval_task(tmp_path, LM_ITEMS)
    seq_len = reference.cfg.seq_len
    # max_length = seq_len - 1: lm_eval keeps max_length + 1 tokens of an over-long item, evaluate.py seq_len.
    model_args = (f"pretrained={exported},trust_remote_code=True,add_bos_token=True,dtype=float32,"
                  f"max_length={seq_len - 1}")
    cmd = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", model_args, "--tasks", "nanoloop_lm",
           "--include_path", str(tmp_path), "--device", "cpu", "--batch_size", "4", "--log_samples",
           "--output_path", str(tmp_path / "out")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (samples,) = (tmp_path / "out").rglob("samples_nanoloop_lm_*.jsonl")
    rows = sorted(map(json.loads, samples.read_text().splitlines()), key=lambda row: row["doc_id"])
    theirs = [float(row["resps"][0][0][0]) for row in rows]
    ours = evaluate_py_loglikelihoods(reference, tokenizer, LM_ITEMS)
    assert len(theirs) == len(ours) == len(LM_ITEMS)
    assert max(abs(a - b) for a, b in zip(theirs, ours)) < 1e-5, (theirs, ours)


# ---------------------------------------------------------------------------------------------
# Bad input: one line on stderr, exit 2, nothing written

def refusal(capsys, *args):
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        export_hf.main([str(a) for a in args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
    return err


def test_a_run_without_checkpoint_or_unfinished_is_refused(run_dir, tmp_path, capsys):
    no_ckpt = shutil.copytree(run_dir, tmp_path / "no_ckpt")
    (no_ckpt / "ckpt.pt").unlink()
    assert "missing or not a torch checkpoint" in refusal(capsys, no_ckpt, tmp_path / "a")
    unfinished = shutil.copytree(run_dir, tmp_path / "unfinished")
    (unfinished / "final.json").unlink()
    assert "not a finished run" in refusal(capsys, unfinished, tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_an_existing_folder_is_never_overwritten(run_dir, tmp_path, capsys):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "keep.txt").write_text("mine")
    assert "already exists" in refusal(capsys, run_dir, tmp_path / "hf")
    assert [path.name for path in (tmp_path / "hf").iterdir()] == ["keep.txt"]


@pytest.mark.parametrize("package", export_hf.NEEDED)
def test_a_missing_package_says_what_to_install(run_dir, tmp_path, capsys, monkeypatch, package):
    monkeypatch.setitem(sys.modules, package, None)  # what an environment without it shows importlib
    assert "pip install -r requirements-dev.txt" in refusal(capsys, run_dir, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
