"""
Download, tokenize and pack FineWeb-Edu (or local text) into rows of seq_len + 1 uint16 tokens: the one
deterministic stream every architecture reads, each document starting with BOS, best-fit packed (paper §4.1).

    python prepare_data.py --shards 205 --out data/fineweb  # paper grid: 7.97B tokens at ~39M a shard (an estimate)
    python prepare_data.py --source data/micro-corpus --vocab-size 2048 --seq-len 128 \
        --val-fraction 0.02 --out data/micro-2k            # local text, the CPU grids

Downloads follow the paper (§4.1): Llama 2's tokenizer + <|assistant_end|> (32,001 ids, as the authors'
nanochat fork), crop packing, validation = the dataset's last shards. Local --source text gets a BPE trained
here (rustbpe, served by tiktoken) and split packing (cropping a book to one row would discard most of it).
Output: train.bin, val.bin, the tokenizer and meta.json, written last (a complete dataset).

"The authors' fork" is https://github.com/kschwethelm/looped-lm-scaling: its nanochat/tokenizer.py (Llama 2's
tokenizer from an ungated copy, plus <|assistant_end|>) and scripts/prepack.py (best-fit packing from a buffer of
1,000 documents), which this file follows. Downloads are FineWeb-Edu's pre-shuffled shards, 8 at a time, each one
retried, resumed, checked and renamed into place by download.py; a shard already in --download-dir is not fetched
again. Validation is the dataset's last --val-shards whatever --shards is, so every dataset built this way is
validated on the same documents. The rows are a pure function of the inputs and flags, whatever --workers. Bad
input (a corrupt parquet, a `text` column without strings, an empty source, flags that do not apply to the source)
is one line, exit 2, before the expensive work; an --out holding a dataset of other settings is not replaced.
The meta.json format and the measurements behind these choices: dev/README.md, "prepare_data.py and dataloader.py".
"""
import argparse
import base64
import bisect
import io
import itertools
import json
import lzma
import math
import os
import shlex
import sys
import time
from array import array
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from nanoloop.common import DataError, atomic_write, fail, in_range, json_lines, one_line_errors
from nanoloop.download import download_file
from nanoloop.dataloader import BOS_TOKEN, EXTRA_TOKEN, FORMAT, MAX_VOCAB, SPLIT_PATTERN, Tokenizer, sha256_file

BASE_URL = "https://huggingface.co/datasets/karpathy/fineweb-edu-100b-shuffle/resolve/main"
N_SHARDS = 1823  # shard_00000.parquet .. shard_01822.parquet, documents pre-shuffled
# The paper evaluates 34,560 rows of 2,049 tokens (70.8M). A shard holds ~250M characters, ~60M Llama-2
# tokens, ~39M after cropping (nanochat: ~35% cropped at T = 2048): 2 shards suffice, 3 allow a short last one.
VAL_SHARDS = 3
LOCAL_VAL_FILES = 2  # --source without --val-shards/--val-fraction: the last two files are validation
# Llama 2's tokenizer.model from an ungated copy of meta-llama/Llama-2-7b-hf; the sha256 of Meta's file.
LLAMA2_URL = "https://huggingface.co/NousResearch/Llama-2-7b-hf/resolve/main/tokenizer.model"
LLAMA2_SHA256 = "9e556afd44213b6bd1be2b850ebbbd98f5481437a8021afaf58ee7fb1818d347"
# Source formats; .jsonl and .txt may be xz-compressed (the in-repo micro-corpus), read by the standard library.
SUFFIXES = (".parquet", ".jsonl", ".txt", ".jsonl.xz", ".txt.xz")
BUFFER_DOCS = 1000               # best-fit buffer in documents (or pieces), as the authors' scripts/prepack.py
BATCH_CHARS = 1 << 21            # characters per tokenizer call: all threads busy, token lists stay small
BPE_BATCHES = 1000               # BPE training reads the first ~2B characters (nanochat's budget)


def check_parquet(path):
    """Row count of a parquet file whose footer opens and whose 'text' column holds strings (cheap)."""
    try:
        with pq.ParquetFile(path) as pf:
            schema, rows = pf.schema_arrow, pf.metadata.num_rows
    except Exception as e:  # pyarrow raises several types (ArrowInvalid, OSError) for bad files
        raise DataError(f"{path}: not a readable parquet file ({e})") from None
    kind = schema.field("text").type if "text" in schema.names else None
    if kind not in (pa.string(), pa.large_string()):
        raise DataError(f"{path}: the 'text' column holds {kind}, not strings (columns: {schema.names})")
    return rows


def source_kind(path):
    """Which of SUFFIXES a source file's name ends with (".jsonl.xz" before ".jsonl"), or None."""
    for suffix in sorted(SUFFIXES, key=len, reverse=True):
        if path.name.endswith(suffix):
            return suffix
    return None


def open_source(path):
    """A .jsonl or .txt source opened for reading bytes, decompressed on the fly if it ends in .xz."""
    if path.name.endswith(".xz"):
        return lzma.open(path, "rb")
    return path.open("rb")


def iter_texts(path):
    """A source file's documents: its parquet 'text' column, .jsonl lines' 'text' fields, or a whole .txt.
    Any failure to read the file (corrupt or truncated parquet pages or xz stream) is one DataError naming it."""
    try:
        yield from read_documents(path)
    except (OSError, EOFError, lzma.LZMAError, pa.ArrowException) as e:
        raise DataError(f"{path}: cannot be read ({type(e).__name__}: {e})") from None


def read_documents(path):
    """The documents of one source file, by its format (iter_texts turns read errors into DataError)."""
    kind = source_kind(path)
    if kind == ".parquet":
        with pq.ParquetFile(path) as pf:
            for row_group in range(pf.num_row_groups):
                yield from pf.read_row_group(row_group, columns=["text"]).column("text").to_pylist()
    elif kind.startswith(".jsonl"):
        with open_source(path) as f:
            for lineno, obj in json_lines(f, path):
                if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                    raise DataError(f"{path}:{lineno}: no string 'text' field")
                yield obj["text"]
    else:
        # Text mode with universal newlines (\r\n read as \n), as Path.read_text.
        with open_source(path) as f, io.TextIOWrapper(f, encoding="utf-8") as text:
            try:
                document = text.read()
            except UnicodeDecodeError as e:
                raise DataError(f"{path}: not UTF-8 text ({e})") from None
        yield document


def batches(plan):
    """Every non-empty document as (split, text), in plan order, in lists of about BATCH_CHARS characters."""
    batch, chars = [], 0
    for entry in plan:
        for i, text in enumerate(iter_texts(entry["path"])):
            if text:
                batch.append(("val" if i >= entry["val_from"] else "train", text))
                chars += len(text)
            if chars >= BATCH_CHARS:
                yield batch
                batch, chars = [], 0
    if batch:
        yield batch


def train_bpe(texts, vocab_size, out_path):
    """rustbpe's byte-level BPE of vocab_size tokens (BOS included) in tiktoken's format (no blobfile needed)."""
    import rustbpe  # imported here: the llama2 path and the data loader never need it
    seen = {"chars": 0}

    def counted(texts):
        for text in texts:
            seen["chars"] += len(text)
            yield text
    bpe = rustbpe.Tokenizer()
    bpe.train_from_iterator(counted(texts), vocab_size - 1, pattern=SPLIT_PATTERN)  # BOS is the last id
    if seen["chars"] == 0:
        raise DataError("the training documents are all empty: there is no text to train the tokenizer on")
    ranks = sorted(bpe.get_mergeable_ranks(), key=lambda pair: pair[1])
    if len(ranks) < vocab_size - 1:
        raise DataError(f"the training text only supports {len(ranks) + 1} tokens, fewer than "
                        f"--vocab-size {vocab_size}: lower it or add text")
    Path(out_path).write_bytes(b"".join(base64.b64encode(token) + b" %d\n" % rank for token, rank in ranks))


class Packer:
    """Best-fit packing into rows of row_len tokens (§4.1; the authors' prepack.py, nanochat's BOS-aligned best-fit):
    from a buffer of BUFFER_DOCS documents a row takes the largest that fits the space left (ties: the earliest); when
    none fits, the shortest is cropped to fill the row, its rest discarded and counted. No padding, no EOS: every
    token trains. Without split_long ("crop", the paper's) a document is never split, so every row starts at a BOS
    and a long document loses its tail. split_long (local corpora of whole books): a longer document is first cut
    into row_len pieces, each buffered and kept; the first has BOS."""

    def __init__(self, out_file, row_len, split_long, buffer_docs=BUFFER_DOCS):
        self.out = out_file
        self.row_len = row_len
        self.split_long = split_long
        self.buffer_docs = buffer_docs
        self.keys = []     # the buffered pieces as (true length, seq), sorted
        self.pieces = {}   # seq -> the piece's tokens (at most row_len of them)
        self.seq = 0
        self.row = np.empty(row_len, np.uint16)  # the row being filled, up to self.fill
        self.fill = 0
        self.rows = self.docs = self.tokens_in = self.cropped = 0

    def add_document(self, tokens):
        """Buffer a document (uint16 ids, BOS first), cut into row_len pieces in split_long mode."""
        self.docs += 1
        self.tokens_in += len(tokens)
        step = self.row_len if self.split_long else len(tokens)
        for start in range(0, len(tokens), step):
            piece = tokens[start:start + step]
            # Keyed by its true length (a crop counts what it loses); only row_len tokens can be placed.
            bisect.insort(self.keys, (len(piece), self.seq))
            self.pieces[self.seq] = piece[:self.row_len]
            self.seq += 1
            while len(self.keys) >= self.buffer_docs:
                self._place_one()

    def _place_one(self):
        """Put the longest buffered piece that fits the space left (the earliest of equal ones) into the row;
        if none fits, crop the shortest to the space left."""
        space = self.row_len - self.fill
        fit = bisect.bisect_right(self.keys, (space, math.inf))  # keys[:fit] all fit
        at = 0  # nothing fits: the shortest, cropped
        if fit:
            longest_that_fits = self.keys[fit - 1][0]
            at = bisect.bisect_left(self.keys, (longest_that_fits, -1))  # the earliest piece of that length
        length, seq = self.keys.pop(at)
        piece = self.pieces.pop(seq)[:space]
        self.cropped += length - len(piece)
        self.row[self.fill:self.fill + len(piece)] = piece
        self.fill += len(piece)
        if self.fill == self.row_len:
            self.out.write(self.row.tobytes())
            self.fill = 0
            self.rows += 1

    def finish(self):
        """Place what is buffered; the last partial row is dropped (never padded) and counted."""
        while self.keys:
            self._place_one()
        return {"rows": self.rows, "docs": self.docs, "tokens_in": self.tokens_in, "cropped_tokens": self.cropped,
                "tokens": self.rows * self.row_len, "tail_tokens_dropped": self.fill}


def tokenize_and_pack(plan, tok, row_len, split_long, threads, out_paths):
    """Tokenize on `threads` threads while another packs the last batch (tokenizers release the GIL); return
    per-split stats, seconds, tokens/s and shared_docs (validation documents also in training, by hash)."""
    t0 = last_print = time.time()
    n_docs = sum(entry["docs"] for entry in plan)
    hashes = {"train": array("q"), "val": array("q")}  # of each document's text: 8 bytes, not the text
    with open(out_paths["train"], "wb") as f_train, open(out_paths["val"], "wb") as f_val, \
            ThreadPoolExecutor(1) as packing:  # one packer thread: documents enter the rows in plan order
        packers = {"train": Packer(f_train, row_len, split_long), "val": Packer(f_val, row_len, split_long)}

        def pack(batch, token_ids):
            for (split, text), ids in zip(batch, token_ids):
                hashes[split].append(hash(text))
                packers[split].add_document(np.array([tok.bos_id, *ids], np.uint16))  # BOS opens every document
        done = None
        for batch in batches(plan):
            token_ids = tok.encode_batch([text for _, text in batch], threads)
            if done is not None:
                done.result()  # the previous batch is packed (and its errors raised here)
            done = packing.submit(pack, batch, token_ids)
            if time.time() - last_print > 10:
                last_print = time.time()
                n_tokens = sum(packer.tokens_in for packer in packers.values())
                docs_done = len(hashes["train"]) + len(hashes["val"])
                eta = (last_print - t0) * (n_docs / (docs_done + 1) - 1)
                print(f"tokenize: {n_tokens / 1e6:.1f}M tokens, ETA {eta:.0f} s", file=sys.stderr, flush=True)
        if done is not None:
            done.result()
        stats = {split: packer.finish() for split, packer in packers.items()}
        for f in (f_train, f_val):  # on disk before they are renamed into place (prepare)
            f.flush()
            os.fsync(f.fileno())
    seconds = time.time() - t0
    tokens_in = stats["train"]["tokens_in"] + stats["val"]["tokens_in"]
    shared = np.isin(np.frombuffer(hashes["val"], np.int64), np.frombuffer(hashes["train"], np.int64)).sum()
    return stats | {"seconds": seconds, "tokens_per_s": tokens_in / max(seconds, 1e-9), "shared_docs": int(shared)}


def local_files(sources):
    """Expand --source paths (files, or folders searched recursively) into a sorted file list."""
    files = []
    for src in map(Path, sources):
        if src.is_file():
            found = [src]
        else:
            found = sorted(p for p in src.rglob("*")
                           if p.is_file() and source_kind(p) and not p.name.startswith("."))
        if not found or source_kind(found[0]) is None:
            raise DataError(f"{src}: not a {'/'.join(SUFFIXES)} file, nor a folder holding one")
        files += found
    return files


def make_plan(files, val_files, val_fraction):
    """Validation = the last val_files files or each file's last val_fraction of documents (one stays in training).
    Decided before any tokenizing; counting documents checks every file early."""
    plan = []
    for index, path in enumerate(files):
        if source_kind(path) == ".parquet":
            n_docs = check_parquet(path)
        else:
            n_docs = sum(1 for _ in iter_texts(path))
        if val_fraction:
            val_from = n_docs - min(math.ceil(val_fraction * n_docs), max(n_docs - 1, 0))
        elif index >= len(files) - val_files:
            val_from = 0  # a whole validation file
        else:
            val_from = n_docs
        plan.append({"path": path, "docs": n_docs, "val_from": val_from})
    train_docs = sum(entry["val_from"] for entry in plan)
    val_docs = sum(entry["docs"] - entry["val_from"] for entry in plan)
    if not train_docs or not val_docs:
        raise DataError(f"{train_docs} training and {val_docs} validation documents in {len(files)} file(s): "
                        f"need both (empty files? use or raise --val-fraction)")
    return plan


def parse_args(argv):
    """Flags, then the defaults and combinations that depend on the source, before any work."""
    parser = one_line_errors(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]), "prepare_data.py")
    parser.add_argument("--out", default="data/fineweb", help="output folder (default data/fineweb)")
    parser.add_argument("--source", nargs="+",
                        help="local .parquet/.jsonl/.txt(.xz) files or folders instead of downloading")
    parser.add_argument("--shards", type=in_range(1), help="FineWeb-Edu training shards to download (default 8)")
    held_out = parser.add_mutually_exclusive_group()
    held_out.add_argument("--val-shards", type=in_range(1), help=f"validation: the last N files (default: "
                          f"{VAL_SHARDS} for downloads, {LOCAL_VAL_FILES} for --source)")
    held_out.add_argument("--val-fraction", type=in_range(0, 1, float), default=0.0, help="--source: validation = "
                          "the last fraction of every file's documents (default: the last 2 files)")
    parser.add_argument("--base-url", default=BASE_URL, help="where the shards are (default: Hugging Face)")
    parser.add_argument("--download-dir", default="data/raw", help="where downloads are kept (default data/raw)")
    parser.add_argument("--tokenizer", choices=["bpe", "llama2"],
                        help="default: llama2 for downloads, bpe for --source")
    parser.add_argument("--tokenizer-model", help=f"SentencePiece .model file or URL (default {LLAMA2_URL})")
    parser.add_argument("--vocab-size", type=in_range(257, MAX_VOCAB + 1), help="BPE vocabulary incl. <|bos|> "
                        "(default 32000)")
    parser.add_argument("--seq-len", type=in_range(1), default=2048, help="rows hold seq-len+1 tokens (default 2048)")
    parser.add_argument("--packing", choices=["crop", "split"], help="default: crop for downloads, split for --source")
    parser.add_argument("--workers", type=in_range(1), default=os.cpu_count() or 1,
                        help="tokenizer threads (all cores)")
    args = parser.parse_args(argv)
    resolve_defaults(parser, args)
    command_line = sys.argv[1:] if argv is None else argv
    args.command = shlex.join(["python", "prepare_data.py", *map(str, command_line)])
    return args


def resolve_defaults(parser, args):
    """The defaults that depend on the source: downloads are the paper's (Llama 2, crop, last 3 shards),
    local text gets a BPE, split packing and the last 2 files as validation. Refuses flags of the other kind."""
    local = args.source is not None
    if local and args.shards:
        parser.error("--shards applies to downloads, not to --source")
    if not local and args.val_fraction:
        parser.error("--val-fraction is for --source")
    args.shards = args.shards or 8
    if args.val_fraction:
        args.val_shards = 0
    elif not args.val_shards:
        args.val_shards = LOCAL_VAL_FILES if local else VAL_SHARDS
    if not args.tokenizer:
        args.tokenizer = "bpe" if local else "llama2"
    if not args.packing:
        args.packing = "split" if local else "crop"
    if args.tokenizer == "bpe" and args.tokenizer_model:
        parser.error("--tokenizer-model is not for --tokenizer bpe")
    if args.tokenizer == "llama2" and args.vocab_size:
        parser.error("--vocab-size is not for --tokenizer llama2")
    if args.tokenizer == "bpe" and not args.vocab_size:
        args.vocab_size = 32000
    if not local and args.shards + args.val_shards > N_SHARDS:
        parser.error(f"--shards {args.shards} + --val-shards {args.val_shards} exceeds the dataset's {N_SHARDS} shards")


def llama2_model(args):
    """The SentencePiece model file, checked before any shard: it loads, and the default is Llama 2's file."""
    def check_model(path):
        Tokenizer("llama2", path)  # it loads, or a one-line DataError (a missing file too)
        if not args.tokenizer_model and sha256_file(path) != LLAMA2_SHA256:
            raise DataError(f"{path}: sha256 {sha256_file(path)} is not Llama 2's tokenizer's ({LLAMA2_SHA256})")
    model = args.tokenizer_model or LLAMA2_URL
    if "://" in model:
        model = download_file(model, Path(args.download_dir) / model.rsplit("/", 1)[1], check_model)
    check_model(model)
    return model


def source_files(args):
    """--source's files, or the downloaded shards: the first --shards for training and the dataset's last
    --val-shards for validation, whatever --shards is (the paper's fixed held-out split)."""
    if args.source is not None:
        return local_files(args.source)
    indices = [*range(args.shards), *range(N_SHARDS - args.val_shards, N_SHARDS)]
    names = [f"shard_{i:05d}.parquet" for i in indices]
    base_url = args.base_url.rstrip("/")

    def fetch(name):
        return download_file(f"{base_url}/{name}", Path(args.download_dir) / name, check_parquet)
    with ThreadPoolExecutor(8) as pool:  # 8 at a time; the first error (or Ctrl-C) cancels those not started
        try:
            return list(pool.map(fetch, names))
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)  # running ones finish into their .tmp
            raise


def build_settings(args, plan, model):
    """What the rows depend on: a dataset in --out is only replaced by one built the same way."""
    if args.val_fraction:
        split = {"val_fraction": args.val_fraction}
    else:
        split = {"val_files": [entry["path"].name for entry in plan if entry["val_from"] == 0]}
    return {"tokenizer": args.tokenizer, "vocab_size": args.vocab_size, "seq_len": args.seq_len,
            "packing": args.packing, "tokenizer_model_sha256": sha256_file(model) if model else None, "split": split,
            "sources": [[entry["path"].name, entry["path"].stat().st_size] for entry in plan]}


def refuse_another_dataset(out, settings):
    """--out may hold a dataset only if it was built with these settings (it is rebuilt, bit for bit)."""
    if not (out / "meta.json").exists():
        return
    try:
        old = json.loads((out / "meta.json").read_text())["settings"]
    except (ValueError, KeyError, TypeError):
        raise DataError(f"{out} holds a dataset in an older format; use another --out or delete {out}") from None
    for key in settings:
        if old.get(key) != settings[key]:
            raise DataError(f"{out} holds a dataset built with {key} {json.dumps(old.get(key))}, not "
                            f"{json.dumps(settings[key])}; use another --out or delete {out}")


def write_tokenizer(args, plan, model, path):
    """The BPE trained on the first BPE_BATCHES batches' training documents, or a copy of the model file."""
    if model:
        path.write_bytes(Path(model).read_bytes())
        return
    print(f"tokenizer: training a {args.vocab_size}-token BPE", file=sys.stderr, flush=True)
    first = itertools.islice(batches(plan), BPE_BATCHES)
    train_bpe((text for batch in first for split, text in batch if split == "train"), args.vocab_size, path)


def prepare(args):
    """Run the whole pipeline for parsed arguments; return the meta dict written. The outputs appear only
    when all is done: temp files, renamed, then meta.json last (its presence means a complete dataset)."""
    out = Path(args.out)
    model = llama2_model(args) if args.tokenizer == "llama2" else None
    plan = make_plan(source_files(args), args.val_shards, args.val_fraction)
    settings = build_settings(args, plan, model)
    refuse_another_dataset(out, settings)
    created_out = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    tok_name = "tokenizer.model" if model else "tokenizer.tiktoken"
    tmp = {name: out / f".{name}.{os.getpid()}.tmp" for name in ("train.bin", "val.bin", tok_name)}
    finished = False
    try:
        t0 = time.time()
        write_tokenizer(args, plan, model, tmp[tok_name])
        tok = Tokenizer(args.tokenizer, tmp[tok_name])
        stats = tokenize_and_pack(plan, tok, args.seq_len + 1, args.packing == "split", args.workers,
                                  {"train": tmp["train.bin"], "val": tmp["val.bin"]})
        meta = describe(args, tok, tok_name, tmp, stats, settings, time.time() - t0)
        (out / "meta.json").unlink(missing_ok=True)  # first: new files never sit next to a stale marker
        for name, path in tmp.items():
            os.replace(path, out / name)
        atomic_write(out / "meta.json", (json.dumps(meta, indent=2) + "\n").encode())
        finished = True
    finally:
        for path in tmp.values():
            path.unlink(missing_ok=True)
        if created_out and not finished and not any(out.iterdir()):
            out.rmdir()  # a failed build leaves no empty folder that looks like an output
    return meta


def describe(args, tok, tok_name, tmp, stats, settings, seconds):
    """meta.json: the tokenizer, the rows and their checksums, what packing cropped, and how it was built."""
    for split in ("train", "val"):
        if stats[split]["rows"] == 0:
            raise DataError(f"{split} split has {stats[split]['tokens_in']} tokens, not one full row of "
                            f"{args.seq_len + 1}: lower --seq-len or add data")
    if stats["shared_docs"]:
        print(f"WARNING: {stats['shared_docs']:,} of {stats['val']['docs']:,} validation documents are also "
              f"training documents (the same text in two source files?): the validation loss will reward "
              f"memorisation", file=sys.stderr, flush=True)
    totals = {key: stats["train"][key] + stats["val"][key] for key in ("cropped_tokens", "tail_tokens_dropped",
                                                                      "tokens_in")}
    if tok.kind == "bpe":
        special = {BOS_TOKEN: tok.bos_id}
    else:
        special = {"<s>": tok.bos_id, EXTRA_TOKEN: tok.extra_id}
    meta = {"format": FORMAT, "tokenizer_kind": args.tokenizer, "tokenizer_file": tok_name,
            "tokenizer_sha256": sha256_file(tmp[tok_name]), "vocab_size": tok.vocab_size, "bos_id": tok.bos_id,
            "special_tokens": special, "seq_len": args.seq_len, "row_len": args.seq_len + 1}
    for split in ("train", "val"):
        for key in ("rows", "tokens", "docs"):
            meta[f"{split}_{key}"] = stats[split][key]
    meta |= {"train_sha256": sha256_file(tmp["train.bin"]), "val_sha256": sha256_file(tmp["val.bin"]),
             "cropped_tokens": totals["cropped_tokens"], "tail_tokens_dropped": totals["tail_tokens_dropped"],
             "cropped_fraction": totals["cropped_tokens"] / totals["tokens_in"], "shared_docs": stats["shared_docs"],
             "split": settings["split"], "packing": {"method": args.packing, "buffer_docs": BUFFER_DOCS},
             "settings": settings, "seconds": round(seconds, 1), "tokens_per_s": round(stats["tokens_per_s"]),
             "command": args.command}
    return meta


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("RAYON_NUM_THREADS", str(args.workers))  # rustbpe's thread pool
    try:
        meta = prepare(args)
    except DataError as e:
        fail("prepare_data.py", str(e))
    except OSError as e:  # a full disk or an unwritable --out: nothing half-written is left to look complete
        fail("prepare_data.py", f"could not write {e.filename or args.out} ({e.strerror or e}); no dataset was "
                                f"written", code=1)
    for split in ("train", "val"):
        print(f"{split}: {meta[f'{split}_rows']:,} rows x {meta['row_len']} = {meta[f'{split}_tokens']:,} tokens "
              f"from {meta[f'{split}_docs']:,} documents")
    print(f"vocab {meta['vocab_size']} ({args.tokenizer}), packing {args.packing}: "
          f"{100 * meta['cropped_fraction']:.2f}% of tokens cropped; {meta['tokens_per_s']:,} tokens/s on "
          f"{args.workers} thread(s) -> {args.out}/meta.json")
    print(f"training tokens: {meta['train_tokens']:,} (a run that reads more repeats data)")


if __name__ == "__main__":
    main()
