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
"""
import argparse
import base64
import bisect
import fcntl
import hashlib
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
import requests
import tiktoken
import tiktoken.load
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

BASE_URL = "https://huggingface.co/datasets/karpathy/fineweb-edu-100b-shuffle/resolve/main"
N_SHARDS = 1823  # shard_00000.parquet .. shard_01822.parquet, documents pre-shuffled
# The paper evaluates 34,560 rows of 2,049 tokens (70.8M). A shard holds ~250M characters, ~60M Llama-2
# tokens, ~39M after cropping (nanochat: ~35% cropped at T = 2048): 2 shards suffice, 3 allow a short last one.
VAL_SHARDS = 3
LOCAL_VAL_FILES = 2  # --source without --val-shards/--val-fraction: the last two files are validation
# Llama 2's tokenizer.model from an ungated copy of meta-llama/Llama-2-7b-hf; the sha256 of Meta's file.
LLAMA2_URL = "https://huggingface.co/NousResearch/Llama-2-7b-hf/resolve/main/tokenizer.model"
LLAMA2_SHA256 = "9e556afd44213b6bd1be2b850ebbbd98f5481437a8021afaf58ee7fb1818d347"
EXTRA_TOKEN = "<|assistant_end|>"  # the id after the SentencePiece pieces; never in pretraining text
BOS_TOKEN = "<|bos|>"               # the BPE's one special token, the id after the last merge
# GPT-4's split pattern (cl100k): merges never cross word, 3-digit number, punctuation or space boundaries.
SPLIT_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}|"""
                 r""" ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+""")
MAX_VOCAB = 65536                # token ids are stored as uint16
# Source formats; .jsonl and .txt may be xz-compressed (the in-repo micro-corpus), read by the standard library.
SUFFIXES = (".parquet", ".jsonl", ".txt", ".jsonl.xz", ".txt.xz")
FORMAT = "nanoloop-rows-v2"
BUFFER_DOCS = 1000               # best-fit buffer in documents (or pieces), as the authors' prepack
BATCH_CHARS = 1 << 21            # characters per tokenizer call: all threads busy, token lists stay small
BPE_BATCHES = 1000               # BPE training reads the first ~2B characters (nanochat's budget)
RETRIES = 5                      # per download, after urllib3's own retries of a failed request
RETRY_BASE_S = 1.0               # backoff before retry k: RETRY_BASE_S * 2**(k-1); tests shrink it


class DataError(ValueError):
    """Bad input the user must fix: main() prints it as one line and exits 2; train.py gets it."""


def sha256_file(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_through(writer, f):
    """writer(f), with a full disk reported as the OSError it is: torch.save turns the file's OSError
    (ENOSPC) into "RuntimeError: [enforce fail at inline_container.cc] unexpected pos"."""
    try:
        writer(f)
    except RuntimeError as e:
        if isinstance(e.__context__, OSError):
            raise e.__context__ from None
        raise


def atomic_write(path, data):
    """Crash-safe write of bytes or callable(f): a unique temp file beside `path`, fsynced, renamed, folder fsynced."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        with open(tmp, "wb") as f:  # buffered: a short write of the OS is retried or raises (full disk)
            if isinstance(data, (bytes, bytearray)):
                f.write(data)
            else:
                write_through(data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fd = os.open(path.parent, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def append_row(path, row):
    """Append a JSON row by rewriting the file with atomic_write under a lock on its folder: a reader, a crash
    or a full disk sees the old file or the new one, never half a row; concurrent writers never lose a row."""
    path = Path(path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        old = path.read_bytes() if path.exists() else b""
        if old and not old.endswith(b"\n"):
            old += b"\n"  # a torn last line stays a line of its own (fit_laws.py reports it)
        atomic_write(path, old + (json.dumps(row) + "\n").encode())
    finally:
        os.close(fd)


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
            for g in range(pf.num_row_groups):
                yield from pf.read_row_group(g, columns=["text"]).column("text").to_pylist()
    elif kind.startswith(".jsonl"):
        with open_source(path) as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except ValueError as e:
                    raise DataError(f"{path}:{lineno}: not valid JSON ({e})") from None
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
    for e in plan:
        for i, text in enumerate(iter_texts(e["path"])):
            if text:
                batch.append(("val" if i >= e["val_from"] else "train", text))
                chars += len(text)
            if chars >= BATCH_CHARS:
                yield batch
                batch, chars = [], 0
    if batch:
        yield batch


def download_file(url, dest, retries=RETRIES, check=check_parquet):
    """Fetch url into dest.tmp, check it, rename it to dest; a dropped transfer resumes with an HTTP Range request."""
    dest, tmp = Path(dest), Path(f"{dest}.tmp")
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    session = requests.Session()  # urllib3 retries failed connections and 408/429/5xx answers, with backoff
    session.mount("http", HTTPAdapter(max_retries=Retry(retries, backoff_factor=RETRY_BASE_S,
                  status_forcelist=(408, 429, 500, 502, 503, 504), raise_on_status=False)))
    for attempt in range(retries + 1):
        time.sleep(RETRY_BASE_S * 2 ** (attempt - 1) if attempt else 0)
        have = tmp.stat().st_size if tmp.exists() else 0
        try:
            r = session.get(url, stream=True, timeout=60, headers={"Range": f"bytes={have}-"} if have else {})
        except requests.RequestException as e:
            raise DataError(f"{url}: {type(e).__name__} after {retries} retries ({e})") from None
        problem = f"HTTP {r.status_code} on resume from byte {have}"
        if r.status_code == 416:  # the .tmp is not a strict prefix of the remote file: start clean
            tmp.unlink()
        elif r.status_code >= 400:
            raise DataError(f"{url}: HTTP {r.status_code} {r.reason}")
        else:
            try:  # 206 continues our file, 200 sends all of it again; a drop loses one chunk at most
                with r, open(tmp, "ab" if r.status_code == 206 else "wb") as f:
                    for chunk in r.iter_content(chunk_size=1 << 16):
                        f.write(chunk)
                break
            except requests.RequestException as e:  # urllib3 raises when fewer bytes arrive
                problem = f"{type(e).__name__}: {e}"
    else:
        raise DataError(f"{url}: download incomplete after {retries + 1} attempts ({problem}); "
                        f"partial data kept in {tmp}, rerun to resume")
    try:
        check(tmp)
    except DataError as e:
        tmp.unlink()
        raise DataError(f"{url}: downloaded file is not valid, deleted ({e})") from None
    print(f"download: {dest} ({tmp.stat().st_size / 1e6:.0f} MB)", file=sys.stderr, flush=True)
    return tmp.replace(dest)


class Tokenizer:
    """encode (no BOS) and decode. 'bpe': BPE trained here, then BOS; 'llama2': SentencePiece, then EXTRA_TOKEN."""

    def __init__(self, kind, path):
        self.kind = kind
        if kind == "bpe":  # the expected hash stops tiktoken's path-keyed cache serving a stale file
            try:
                ranks = tiktoken.load.load_tiktoken_bpe(str(path), expected_hash=sha256_file(path))
            except Exception as e:  # base64 or format errors of a damaged file, raised by tiktoken
                raise DataError(f"{path}: not a tiktoken BPE file ({type(e).__name__}: {e})") from None
            self.bos_id, self.vocab_size = len(ranks), len(ranks) + 1
            self._enc = tiktoken.Encoding(f"nanoloop-bpe-{self.vocab_size}", pat_str=SPLIT_PATTERN,
                                          mergeable_ranks=ranks, special_tokens={BOS_TOKEN: self.bos_id})
            return
        import sentencepiece  # here: train.py imports this file and never needs it
        try:
            self._sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
        except Exception as e:  # sentencepiece raises OSError or RuntimeError
            raise DataError(f"{path}: not a SentencePiece model ({e})") from None
        self.bos_id, self.extra_id = self._sp.bos_id(), self._sp.get_piece_size()
        self.vocab_size = self.extra_id + 1
        if self.bos_id < 0 or self.vocab_size > MAX_VOCAB:  # rows are uint16 and start with BOS
            raise DataError(f"{path}: {self.vocab_size} ids (max {MAX_VOCAB}) or no BOS piece; not usable here")

    def encode_batch(self, texts, threads=1):
        # encode_ordinary: a literal "<|bos|>" in the data stays text, never the special token.
        if self.kind == "bpe" and threads == 1:  # tiktoken's batch call costs ~25% more on one thread
            return [self._enc.encode_ordinary(text) for text in texts]
        if self.kind == "bpe":
            return self._enc.encode_ordinary_batch(texts, num_threads=threads)
        return self._sp.encode(texts, num_threads=threads)

    def encode(self, text):
        return self.encode_batch([text])[0]

    def decode(self, ids):
        if self.kind == "bpe":
            return self._enc.decode(list(ids))
        runs = itertools.groupby(ids, key=lambda i: i == self.extra_id)
        return "".join(EXTRA_TOKEN * len(list(g)) if extra else self._sp.decode(list(g)) for extra, g in runs)


def train_bpe(texts, vocab_size, out_path):
    """rustbpe's byte-level BPE of vocab_size tokens (BOS included) in tiktoken's format (no blobfile needed)."""
    import rustbpe  # imported here: the llama2 path and the data loader never need it
    seen = {"chars": 0}

    def counted(texts):
        for text in texts:
            seen["chars"] += len(text)
            yield text
    tok = rustbpe.Tokenizer()
    tok.train_from_iterator(counted(texts), vocab_size - 1, pattern=SPLIT_PATTERN)
    if seen["chars"] == 0:
        raise DataError("the training documents are all empty: there is no text to train the tokenizer on")
    ranks = sorted(tok.get_mergeable_ranks(), key=lambda pair: pair[1])
    if len(ranks) < vocab_size - 1:
        raise DataError(f"the training text only supports {len(ranks) + 1} tokens, fewer than "
                        f"--vocab-size {vocab_size}: lower it or add text")
    Path(out_path).write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks))


class Packer:
    """Best-fit packing into rows of row_len tokens (§4.1; the authors' prepack, nanochat's BOS-aligned best-fit):
    from a buffer of BUFFER_DOCS documents a row takes the largest that fits the space left (ties: the earliest); when
    none fits, the shortest is cropped to fill the row, its rest discarded and counted. split_long (local corpora of
    whole books): a longer document is first cut into row_len pieces, each buffered and kept; the first has BOS."""

    def __init__(self, out_file, row_len, split_long, buffer_docs=BUFFER_DOCS):
        self.out, self.row_len, self.split_long, self.buffer_docs = out_file, row_len, split_long, buffer_docs
        self.keys, self.pieces, self.seq = [], {}, 0  # keys: sorted (length, seq); seq -> tokens
        self.row, self.fill = np.empty(row_len, np.uint16), 0  # the row being filled
        self.rows = self.docs = self.tokens_in = self.cropped = 0

    def add_document(self, tokens):  # the document's uint16 ids, BOS first
        self.docs, self.tokens_in = self.docs + 1, self.tokens_in + len(tokens)
        step = self.row_len if self.split_long else len(tokens)
        for start in range(0, len(tokens), step):
            # Keyed by its true length (a crop counts what it loses); only row_len tokens can be placed.
            bisect.insort(self.keys, (len(tokens[start:start + step]), self.seq))
            self.pieces[self.seq], self.seq = tokens[start:start + min(step, self.row_len)], self.seq + 1
            while len(self.keys) >= self.buffer_docs:
                self._place_one()

    def _place_one(self):
        space = self.row_len - self.fill
        fit = bisect.bisect_right(self.keys, (space, math.inf))  # keys[:fit] all fit
        length, seq = self.keys.pop(bisect.bisect_left(self.keys, (self.keys[fit - 1][0], -1)) if fit else 0)
        piece = self.pieces.pop(seq)[:space]
        self.cropped += length - len(piece)
        self.row[self.fill:self.fill + len(piece)] = piece
        self.fill += len(piece)
        if self.fill == self.row_len:
            self.out.write(self.row.tobytes())
            self.fill, self.rows = 0, self.rows + 1

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
    n_docs, hashes = sum(e["docs"] for e in plan), {"train": array("q"), "val": array("q")}
    with open(out_paths["train"], "wb") as f_train, open(out_paths["val"], "wb") as f_val, \
            ThreadPoolExecutor(1) as packing:
        packers = {"train": Packer(f_train, row_len, split_long), "val": Packer(f_val, row_len, split_long)}

        def pack(batch, token_ids):
            for (split, text), ids in zip(batch, token_ids):
                hashes[split].append(hash(text))
                packers[split].add_document(np.array([tok.bos_id, *ids], np.uint16))
        done = packing.submit(int)
        for batch in batches(plan):
            token_ids = tok.encode_batch([text for _, text in batch], threads)
            done.result()  # the previous batch is packed (and its errors raised here)
            done = packing.submit(pack, batch, token_ids)
            if time.time() - last_print > 10:
                last_print, n = time.time(), sum(p.tokens_in for p in packers.values())
                eta = (last_print - t0) * (n_docs / (len(hashes["train"]) + len(hashes["val"]) + 1) - 1)
                print(f"tokenize: {n / 1e6:.1f}M tokens, ETA {eta:.0f} s", file=sys.stderr, flush=True)
        done.result()
        stats = {split: p.finish() for split, p in packers.items()}
        for f in (f_train, f_val):
            f.flush()
            os.fsync(f.fileno())
    seconds, tokens_in = time.time() - t0, stats["train"]["tokens_in"] + stats["val"]["tokens_in"]
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
    for k, path in enumerate(files):
        n = check_parquet(path) if source_kind(path) == ".parquet" else sum(1 for _ in iter_texts(path))
        val_from = (n - min(math.ceil(val_fraction * n), max(n - 1, 0)) if val_fraction
                    else 0 if k >= len(files) - val_files else n)
        plan.append({"path": path, "docs": n, "val_from": val_from})
    train_docs, val_docs = sum(e["val_from"] for e in plan), sum(e["docs"] - e["val_from"] for e in plan)
    if not train_docs or not val_docs:
        raise DataError(f"{train_docs} training and {val_docs} validation documents in {len(files)} file(s): "
                        f"need both (empty files? use or raise --val-fraction)")
    return plan


def number(lo, hi=math.inf, kind=int):
    """argparse type: a number in [lo, hi); argparse turns a ValueError into "invalid number value"."""
    def number(text):
        if not lo <= kind(text) < hi:
            raise argparse.ArgumentTypeError(f"{text} is not in [{lo}, {hi})")
        return kind(text)
    return number


def parse_args(argv):
    """Flags, then the defaults and combinations that depend on the source, before any work."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.error = lambda msg: p.exit(2, f"prepare_data.py: error: {msg}\n")  # one line, as all bad input
    p.add_argument("--out", default="data/fineweb", help="output folder (default data/fineweb)")
    p.add_argument("--source", nargs="+", help="local .parquet/.jsonl/.txt files or folders instead of downloading")
    p.add_argument("--shards", type=number(1), help="FineWeb-Edu training shards to download (default 8)")
    held_out = p.add_mutually_exclusive_group()
    held_out.add_argument("--val-shards", type=number(1), help=f"validation: the last N files (default: "
                          f"{VAL_SHARDS} for downloads, {LOCAL_VAL_FILES} for --source)")
    held_out.add_argument("--val-fraction", type=number(0, 1, float), default=0.0, help="--source: validation = "
                          "the last fraction of every file's documents (default: the last 2 files)")
    p.add_argument("--base-url", default=BASE_URL, help="where the shards are (default: Hugging Face)")
    p.add_argument("--download-dir", default="data/raw", help="where downloads are kept (default data/raw)")
    p.add_argument("--tokenizer", choices=["bpe", "llama2"], help="default: llama2 for downloads, bpe for --source")
    p.add_argument("--tokenizer-model", help=f"SentencePiece .model file or URL (default {LLAMA2_URL})")
    p.add_argument("--vocab-size", type=number(257, MAX_VOCAB + 1), help="BPE vocabulary incl. <|bos|> (default 32000)")
    p.add_argument("--seq-len", type=number(1), default=2048, help="rows hold seq-len+1 tokens (default 2048)")
    p.add_argument("--packing", choices=["crop", "split"], help="default: crop for downloads, split for --source")
    p.add_argument("--workers", type=number(1), default=os.cpu_count() or 1, help="tokenizer threads (all cores)")
    a = p.parse_args(argv)
    local = a.source is not None
    if a.shards if local else a.val_fraction:
        p.error("--shards applies to downloads, not to --source" if local else "--val-fraction is for --source")
    a.shards, a.val_shards = a.shards or 8, 0 if a.val_fraction else a.val_shards or (LOCAL_VAL_FILES if local else VAL_SHARDS)
    a.tokenizer, a.packing = a.tokenizer or ("bpe" if local else "llama2"), a.packing or ("split" if local else "crop")
    if a.tokenizer_model if a.tokenizer == "bpe" else a.vocab_size:
        p.error(f"--{'tokenizer-model' if a.tokenizer == 'bpe' else 'vocab-size'} is not for --tokenizer {a.tokenizer}")
    a.vocab_size = a.vocab_size or (32000 if a.tokenizer == "bpe" else None)
    if not local and a.shards + a.val_shards > N_SHARDS:
        p.error(f"--shards {a.shards} + --val-shards {a.val_shards} exceeds the dataset's {N_SHARDS} shards")
    a.command = shlex.join(["python", "prepare_data.py", *map(str, sys.argv[1:] if argv is None else argv)])
    return a


def prepare(a):
    """Run the whole pipeline for parsed arguments; return the meta dict written."""
    out, bpe, ddir = Path(a.out), a.tokenizer == "bpe", Path(a.download_dir)
    if not bpe:  # before the shards: a SentencePiece model that loads; the default one must be Llama 2's file
        model = a.tokenizer_model or LLAMA2_URL

        def check_model(path):
            Tokenizer("llama2", path)  # it loads, or a one-line DataError (a missing file too)
            if not a.tokenizer_model and sha256_file(path) != LLAMA2_SHA256:
                raise DataError(f"{path}: sha256 {sha256_file(path)} is not Llama 2's tokenizer's ({LLAMA2_SHA256})")
        if "://" in model:
            model = download_file(model, ddir / model.rsplit("/", 1)[1], check=check_model)
        check_model(model)
    if a.source is not None:
        files = local_files(a.source)
    else:
        names = [f"shard_{i:05d}.parquet" for i in [*range(a.shards), *range(N_SHARDS - a.val_shards, N_SHARDS)]]
        with ThreadPoolExecutor(8) as pool:  # 8 at a time; the first error (or Ctrl-C) cancels those not started
            try:
                files = list(pool.map(lambda n: download_file(f"{a.base_url.rstrip('/')}/{n}", ddir / n), names))
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)  # running ones finish into their .tmp
                raise
    plan = make_plan(files, a.val_shards, a.val_fraction)

    # What the rows depend on: a dataset in --out is only replaced by one built the same way (refused: what differs).
    split = ({"val_fraction": a.val_fraction} if a.val_fraction
             else {"val_files": [e["path"].name for e in plan if e["val_from"] == 0]})
    settings = {"tokenizer": a.tokenizer, "vocab_size": a.vocab_size, "seq_len": a.seq_len, "packing": a.packing,
                "tokenizer_model_sha256": None if bpe else sha256_file(model), "split": split,
                "sources": [[e["path"].name, e["path"].stat().st_size] for e in plan]}
    if (out / "meta.json").exists():
        try:
            old = json.loads((out / "meta.json").read_text())["settings"]
        except (ValueError, KeyError, TypeError):
            raise DataError(f"{out} holds a dataset in an older format; use another --out or delete {out}") from None
        for key in (k for k in settings if old.get(k) != settings[k]):
            raise DataError(f"{out} holds a dataset built with {key} {json.dumps(old.get(key))}, not "
                            f"{json.dumps(settings[key])}; use another --out or delete {out}")

    created_out = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    tok_name = "tokenizer.tiktoken" if bpe else "tokenizer.model"
    tmp = {name: out / f".{name}.{os.getpid()}.tmp" for name in ("train.bin", "val.bin", tok_name)}
    finished = False
    try:
        t0 = time.time()
        if bpe:
            print(f"tokenizer: training a {a.vocab_size}-token BPE", file=sys.stderr, flush=True)
            first = itertools.islice(batches(plan), BPE_BATCHES)
            train_bpe((text for batch in first for s, text in batch if s == "train"), a.vocab_size, tmp[tok_name])
        else:
            tmp[tok_name].write_bytes(Path(model).read_bytes())
        tok = Tokenizer(a.tokenizer, tmp[tok_name])
        st = tokenize_and_pack(plan, tok, a.seq_len + 1, a.packing == "split", a.workers,
                               {"train": tmp["train.bin"], "val": tmp["val.bin"]})
        for s in (s for s in ("train", "val") if st[s]["rows"] == 0):
            raise DataError(f"{s} split has {st[s]['tokens_in']} tokens, not one full row of {a.seq_len + 1}: "
                            f"lower --seq-len or add data")
        if st["shared_docs"]:
            print(f"WARNING: {st['shared_docs']:,} of {st['val']['docs']:,} validation documents are also "
                  f"training documents (the same text in two source files?): the validation loss will reward "
                  f"memorisation", file=sys.stderr, flush=True)
        both = lambda key: st["train"][key] + st["val"][key]  # noqa: E731
        meta = {"format": FORMAT, "tokenizer_kind": a.tokenizer, "tokenizer_file": tok_name,
                "tokenizer_sha256": sha256_file(tmp[tok_name]), "vocab_size": tok.vocab_size, "bos_id": tok.bos_id,
                "special_tokens": {BOS_TOKEN: tok.bos_id} if bpe else {"<s>": tok.bos_id, EXTRA_TOKEN: tok.extra_id},
                "seq_len": a.seq_len, "row_len": a.seq_len + 1,
                **{f"{s}_{k}": st[s][k] for s in ("train", "val") for k in ("rows", "tokens", "docs")},
                "train_sha256": sha256_file(tmp["train.bin"]), "val_sha256": sha256_file(tmp["val.bin"]),
                "cropped_tokens": both("cropped_tokens"), "tail_tokens_dropped": both("tail_tokens_dropped"),
                "cropped_fraction": both("cropped_tokens") / both("tokens_in"), "shared_docs": st["shared_docs"],
                "split": split, "packing": {"method": a.packing, "buffer_docs": BUFFER_DOCS}, "settings": settings,
                "seconds": round(time.time() - t0, 1), "tokens_per_s": round(st["tokens_per_s"]), "command": a.command}
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


def main(argv=None):
    a = parse_args(argv)
    os.environ.setdefault("RAYON_NUM_THREADS", str(a.workers))  # rustbpe's thread pool
    try:
        meta = prepare(a)
    except DataError as e:
        print(f"prepare_data.py: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except OSError as e:  # a full disk or an unwritable --out: nothing half-written is left to look complete
        print(f"prepare_data.py: error: could not write {e.filename or a.out} ({e.strerror or e}); no dataset "
              f"was written", file=sys.stderr)
        raise SystemExit(1) from None
    for s in ("train", "val"):
        print(f"{s}: {meta[f'{s}_rows']:,} rows x {meta['row_len']} = {meta[f'{s}_tokens']:,} tokens from "
              f"{meta[f'{s}_docs']:,} documents")
    print(f"vocab {meta['vocab_size']} ({a.tokenizer}), packing {a.packing}: {100 * meta['cropped_fraction']:.2f}% "
          f"of tokens cropped; {meta['tokens_per_s']:,} tokens/s on {a.workers} thread(s) -> {a.out}/meta.json")
    print(f"training tokens: {meta['train_tokens']:,} (a run that reads more repeats data)")


# --- what train.py reads the data with ---------------------------------------------------------
ROW_ORDER_SEED = 1234  # the data order of every run; change it to resample the order


def load_json(path, what="file"):
    """A JSON file's content; a missing, unreadable or non-JSON file is one DataError naming it."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"{path}: no such {what}") from None
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8
        raise DataError(f"{path}: not a readable JSON {what} ({e})") from None


# The types meta.json's keys must have: a damaged or hand-edited file is refused here, by name, and not
# with a traceback in whatever arithmetic first touches the value.
META_TYPES = {"row_len": int, "seq_len": int, "vocab_size": int, "bos_id": int, "train_rows": int, "val_rows": int,
              "train_tokens": int, "tokenizer_kind": str, "tokenizer_file": str, "tokenizer_sha256": str,
              "train_sha256": str, "val_sha256": str, "packing": dict}


def read_meta(data_dir, verify=True):
    """meta.json once the dataset checks whole: keys, .bin sizes, (verify: a full read) sha256s; else a DataError."""
    path = Path(data_dir) / "meta.json"
    rebuild = f"rebuild with prepare_data.py (e.g. --shards 8 --out {data_dir}, or --source PATH)"
    if not path.exists():
        raise DataError(f"{path}: not found; {rebuild}")
    meta = load_json(path, "dataset description")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise DataError(f"{path}: not a {FORMAT} dataset (an older format?); {rebuild}")
    for key, kind in META_TYPES.items():
        if key not in meta:
            raise DataError(f"{path}: missing key {key!r}; {rebuild}")
        if not isinstance(meta[key], kind) or (kind is int and meta[key] < 0):
            raise DataError(f"{path}: {key} is {meta[key]!r}, not a {kind.__name__}; {rebuild}")
    for split in ("train", "val"):
        bin_path = Path(data_dir) / f"{split}.bin"
        want = meta[f"{split}_rows"] * meta["row_len"] * 2
        if not bin_path.exists():
            raise DataError(f"{bin_path}: missing (meta.json lists {meta[f'{split}_rows']} rows); {rebuild}")
        size = bin_path.stat().st_size
        if size != want:
            raise DataError(f"{bin_path}: {size} bytes, meta.json says {want} ({meta[f'{split}_rows']} rows of "
                            f"{meta['row_len']} uint16); {rebuild}")
        if verify and sha256_file(bin_path) != meta[f"{split}_sha256"]:
            raise DataError(f"{bin_path}: sha256 differs from meta.json's {split}_sha256 (changed after it "
                            f"was built); {rebuild}")
    return meta


def data_identity(meta):
    """What names a dataset in a run's identity (train.py): equal values, equal token rows."""
    keys = ("tokenizer_sha256", "vocab_size", "seq_len", "train_sha256", "val_sha256")
    return {k: meta[k] for k in keys} | {"packing": meta["packing"]["method"]}


def load_tokenizer(data_dir):
    """The dataset's Tokenizer; its sha256 must be meta.json's, so a swapped file cannot go unnoticed."""
    meta = read_meta(data_dir, verify=False)
    path = Path(data_dir) / meta["tokenizer_file"]
    if not path.is_file():
        raise DataError(f"{path}: the dataset's tokenizer file is missing (meta.json names it); rebuild the dataset")
    if sha256_file(path) != meta["tokenizer_sha256"]:
        raise DataError(f"{path}: sha256 differs from meta.json's tokenizer_sha256; the dataset and its "
                        f"tokenizer do not belong together")
    return Tokenizer(meta["tokenizer_kind"], path)


class RowLoader:
    """Batches of rows from train.bin / val.bin (memory-mapped). next_batch() consumes world_size * batch_rows global
    rows from self.row (save it to resume), rank k taking row + k + world_size * i. Row g is file row order(epoch)[g %
    n_rows], a permutation seeded by ROW_ORDER_SEED and the epoch (file order: batches of one or two documents)."""

    def __init__(self, data_dir, split, batch_rows, rank=0, world_size=1, start_row=0):
        meta = read_meta(data_dir, verify=False)  # sizes checked; train.py verified the checksums
        self.row_len, self.seq_len, self.n_rows = meta["row_len"], meta["seq_len"], meta[f"{split}_rows"]
        self.data = np.memmap(Path(data_dir) / f"{split}.bin", np.uint16, "r", shape=(self.n_rows, self.row_len))
        self.batch_rows, self.rank, self.world_size = batch_rows, rank, world_size
        self.row, self.epoch, self._orders = start_row, start_row // self.n_rows, {}

    def order(self, epoch):
        """The permutation of file rows read in pass `epoch` (cached: one pass at a time)."""
        if epoch not in self._orders:
            self._orders = {epoch: np.random.default_rng([ROW_ORDER_SEED, epoch]).permutation(self.n_rows)}
        return self._orders[epoch]

    def next_batch(self):
        """(x, y): int64 tensors (batch_rows, seq_len); y is x shifted left by one token."""
        global_rows = self.row + self.rank + self.world_size * np.arange(self.batch_rows)
        idx = [self.order(g // self.n_rows)[g % self.n_rows] for g in global_rows.tolist()]  # 1 or 2 passes
        import torch  # here, not at the top: preparing data never needs torch
        rows = torch.from_numpy(self.data[idx].astype(np.int64))
        self.row += self.world_size * self.batch_rows
        self.epoch = self.row // self.n_rows
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


if __name__ == "__main__":
    main()
