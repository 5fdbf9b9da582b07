"""
Download, tokenize and pack FineWeb-Edu (or local text) into fixed-length uint16 token rows.

Every architecture in the sweep reads the identical, deterministic token stream made here:
rows of seq_len + 1 tokens (inputs plus the one-token target shift), each document starting with
a <|bos|> token, best-fit packed with no padding (RECIPE §5).

    python prepare_data.py --shards 8 --out data/fineweb                 # download (internet)
    python prepare_data.py --source ../shared/data/micro-corpus --vocab-size 4096 \
        --seq-len 256 --val-fraction 0.02 --out data/micro               # local, CPU scale

Output directory: train.bin and val.bin (flat uint16, row-major, rows of seq_len + 1 tokens), the
tokenizer (tokenizer.json for the default BPE, tokenizer.model for --tokenizer llama2) and
meta.json, written last: its presence marks a complete dataset.

The same file holds the model-free data loader train.py uses: read_meta, load_tokenizer, RowLoader.
"""
import argparse
import base64
import bisect
import hashlib
import json
import math
import multiprocessing
import os
import shlex
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import requests
import tiktoken

SHUFFLED_BASE_URL = "https://huggingface.co/datasets/karpathy/fineweb-edu-100b-shuffle/resolve/main"
SHUFFLED_SHARDS = 1823  # shard_00000 .. shard_01822
OFFICIAL_BASE_URL = "https://huggingface.co/datasets/HuggingFaceFW/fineweb-edu/resolve/main"
OFFICIAL_SHARDS = 14    # sample/10BT/000_00000 .. 013_00000

BOS_TOKEN = "<|bos|>"
# GPT-4's split pattern (cl100k): words with an optional leading space, numbers in groups of at
# most three digits, punctuation runs, whitespace. Merges never cross these boundaries.
SPLIT_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}|"""
                 r""" ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+""")
MAX_VOCAB = 65536        # token ids must fit in uint16
SOURCE_SUFFIXES = (".parquet", ".jsonl", ".txt")
FORMAT = "nanoloop-rows-v1"

RETRY_BASE_S = 1.0       # backoff before retry k is RETRY_BASE_S * 2**(k-1); tests shrink it
HTTP_TIMEOUT_S = 60
DOWNLOAD_CHUNK = 1 << 16  # bytes per write; a dropped connection loses the unfinished chunk only
BATCH_CHARS = 1 << 21    # characters per tokenizer task: large enough to amortize IPC, small
                         # enough that a few in flight per worker bound memory


class DataError(ValueError):
    """Bad input the user must fix (corrupt file, empty source, wrong flags). main() turns it into
    a one-line error; library callers (train.py) get the exception."""


def sha256_file(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def atomic_write(path, data):
    """Write `data` (bytes, or a callable that writes to a binary file object) to `path` so that a
    crash leaves either the old file or the complete new one: a uniquely named temp file in the
    same folder (two writers never share it), flushed and fsynced, renamed over `path`, then the
    folder fsynced so the rename itself survives a power loss."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data) if isinstance(data, (bytes, bytearray)) else data(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# Reading documents
# ---------------------------------------------------------------------------------------------

def check_parquet(path):
    """Open a parquet file's footer and schema; return its row count. Cheap (no data pages read),
    so every source is checked before any expensive work starts."""
    try:
        with pq.ParquetFile(path) as pf:
            names = pf.schema_arrow.names
            rows = pf.metadata.num_rows
    except Exception as e:  # pyarrow raises several types (ArrowInvalid, OSError) for bad files
        raise DataError(f"{path}: not a readable parquet file ({e})") from None
    if "text" not in names:
        raise DataError(f"{path}: parquet file has no 'text' column (columns: {names})")
    return rows


def scan_source_file(path):
    """Validate one source file completely enough to fail early, and count its documents."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return check_parquet(path)
    if suffix == ".jsonl":
        # Parsing every line here costs well under a second for the micro-corpus but means a
        # malformed line is reported before tokenizer training, not twenty minutes into packing.
        return sum(1 for _ in iter_texts(path))
    if suffix == ".txt":
        next(iter_texts(path))  # decodes the file: reports bad UTF-8 now
        return 1
    raise DataError(f"{path}: unsupported file type (expected {', '.join(SOURCE_SUFFIXES)})")


def iter_texts(path):
    """Yield every document of a source file in order. A .txt file is one document; a .jsonl file
    has one JSON object with a string 'text' field per non-blank line."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            with pq.ParquetFile(path) as pf:
                for g in range(pf.num_row_groups):
                    yield from pf.read_row_group(g, columns=["text"]).column("text").to_pylist()
        except DataError:
            raise
        except Exception as e:
            raise DataError(f"{path}: parquet data could not be read ({e})") from None
    elif suffix == ".jsonl":
        with open(path, "rb") as f:
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
        try:
            yield path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{path}: not UTF-8 text ({e})") from None


def iter_split_texts(plan, split):
    """Yield the non-empty documents of one split across all planned files, in file order.
    A plan entry's 'val_from' is the index of its first validation document."""
    for entry in plan:
        for i, text in enumerate(iter_texts(entry["path"])):
            if text and (i >= entry["val_from"]) == (split == "val"):
                yield text


# ---------------------------------------------------------------------------------------------
# Downloading
# ---------------------------------------------------------------------------------------------

class Progress:
    """One stderr line for all download threads: files done, MB, MB/s, ETA."""

    def __init__(self, n_files):
        self.n_files, self.done, self.streamed = n_files, 0, 0
        self.size, self.have, self.finished = {}, {}, set()  # per url: total, on disk, done
        self.start_time = self.last_print = time.time()
        self.lock = threading.Lock()
        self.tty = sys.stderr.isatty()

    def start(self, url, have, size):
        with self.lock:
            self.have[url] = have
            if size is not None:
                self.size[url] = size

    def add(self, url, n):
        with self.lock:
            self.streamed += n
            self.have[url] += n
            self._maybe_print()

    def finish(self, url):
        with self.lock:
            self.done += 1
            self.finished.add(url)
            self._maybe_print(force=True)

    def _maybe_print(self, force=False):
        now = time.time()
        # A terminal gets a live line; a log file gets a line every 10 s, not thousands.
        if not force and now - self.last_print < (0.5 if self.tty else 10):
            return
        self.last_print = now
        rate = self.streamed / max(now - self.start_time, 1e-9)
        # Files not started yet are assumed to be as large as the average known one.
        open_urls = [u for u in self.size if u not in self.finished]
        left = sum(max(self.size[u] - self.have[u], 0) for u in open_urls)
        if self.size:
            unseen = self.n_files - self.done - len(open_urls)
            left += unseen * sum(self.size.values()) / len(self.size)
        eta = f"{left / rate:.0f} s" if rate > 0 else "?"
        end = "\r" if self.tty and self.done < self.n_files else "\n"
        print(f"download: {self.done}/{self.n_files} files, {self.streamed / 1e6:.1f} MB, "
              f"{rate / 1e6:.1f} MB/s, ETA {eta}   ", end=end, file=sys.stderr, flush=True)


def download_file(url, dest, retries=5, progress=None):
    """Fetch url to dest: stream into dest.tmp, resume a partial .tmp with an HTTP Range request,
    retry with exponential backoff, check the parquet opens, then rename atomically. A dest that
    already exists is only re-checked, never fetched again."""
    dest = Path(dest)
    if dest.exists():
        try:
            check_parquet(dest)
        except DataError as e:
            raise DataError(f"{e}; delete it to download it again") from None
        if progress:
            progress.finish(url)
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    problem = "no attempt made"
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(RETRY_BASE_S * 2 ** (attempt - 1))
        have = tmp.stat().st_size if tmp.exists() else 0
        headers = {"Range": f"bytes={have}-"} if have else {}
        try:
            with requests.get(url, stream=True, timeout=HTTP_TIMEOUT_S, headers=headers) as r:
                status, content_range = r.status_code, r.headers.get("Content-Range", "")
                if status == 416 and have and content_range.endswith(f"/{have}"):
                    # Nothing past our end and the file is exactly our length: the .tmp is
                    # complete (an earlier run stopped before checking and renaming it).
                    mode, total = None, have
                elif status == 416 and have:
                    # Our partial file is longer than the remote one: it belongs to another
                    # version of the file. Start clean rather than guess.
                    tmp.unlink()
                    problem = f"HTTP 416 on resume ({content_range or 'no Content-Range'})"
                    continue
                elif 400 <= status < 500 and status not in (408, 429):
                    raise DataError(f"{url}: HTTP {status} {r.reason} (not retried)")
                elif status >= 400:
                    problem = f"HTTP {status} {r.reason}"
                    continue
                elif status == 206:
                    # Content-Range: bytes START-END/TOTAL. Append only if it continues our file.
                    try:
                        first = int(content_range.split()[1].split("-")[0])
                        total = int(content_range.split("/")[1])
                    except (IndexError, ValueError):
                        first, total = -1, None
                    if first != have:
                        tmp.unlink()
                        problem = f"server answered Range with '{content_range}'"
                        continue
                    mode = "ab"
                else:
                    # 200: the server ignored Range (or there was none) and sends the whole file.
                    mode, have = "wb", 0
                    length = r.headers.get("Content-Length", "")
                    total = int(length) if length.isdigit() else None
                if progress:
                    progress.start(url, have, total)
                if mode:
                    with open(tmp, mode) as f:
                        for chunk in r.iter_content(chunk_size=DOWNLOAD_CHUNK):
                            f.write(chunk)
                            if progress:
                                progress.add(url, len(chunk))
        except (requests.ConnectionError, requests.Timeout,
                requests.exceptions.ChunkedEncodingError) as e:
            problem = f"{type(e).__name__}: {e}"
            continue
        size = tmp.stat().st_size
        if total is not None and size < total:
            problem = f"connection ended at {size} of {total} bytes"
            continue
        if total is not None and size > total:
            tmp.unlink()
            problem = f"received {size} bytes, more than the {total} announced"
            continue
        break
    else:
        kept = f"; partial data kept in {tmp}, rerun to resume" if tmp.exists() else ""
        raise DataError(f"{url}: download incomplete after {retries + 1} attempts "
                        f"({problem}){kept}")
    try:
        check_parquet(tmp)
    except DataError as e:
        tmp.unlink()
        raise DataError(f"{url}: downloaded file is not valid parquet, deleted ({e})") from None
    os.replace(tmp, dest)  # atomic: a dest on disk is always a complete, checked file
    if progress:
        progress.finish(url)
    return dest


def download_shards(names, base_url, download_dir, workers, retries):
    """Fetch the named shard files in parallel; return their local paths in the given order."""
    download_dir.mkdir(parents=True, exist_ok=True)
    progress = Progress(len(names))
    paths = [download_dir / Path(name).name for name in names]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [pool.submit(download_file, f"{base_url.rstrip('/')}/{name}", path, retries,
                               progress) for name, path in zip(names, paths)]
        try:
            for fut in futures:
                fut.result()
        except BaseException:
            # Stop the downloads not started yet; running ones finish into their .tmp files.
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return paths


# ---------------------------------------------------------------------------------------------
# Tokenizers
# ---------------------------------------------------------------------------------------------

class Tokenizer:
    """encode (no BOS) / decode for either backend, plus bos_id and vocab_size (all tokens,
    specials included). The same object is built in the tokenizer worker processes."""

    def __init__(self, kind, path):
        self.kind, self.path = kind, Path(path)
        if kind == "bpe":
            spec = json.loads(self.path.read_text())
            ranks = {base64.b64decode(tok): rank for rank, tok in enumerate(spec["ranks"])}
            self.bos_id = spec["bos_id"]
            self._enc = tiktoken.Encoding(name=f"nanoloop-bpe-{len(ranks) + 1}",
                                          pat_str=spec["pattern"], mergeable_ranks=ranks,
                                          special_tokens={spec["bos_token"]: self.bos_id})
            self.vocab_size = self._enc.n_vocab
        elif kind == "llama2":
            spm = import_sentencepiece()
            try:
                self._sp = spm.SentencePieceProcessor(model_file=str(self.path))
            except Exception as e:  # sentencepiece raises OSError or RuntimeError
                raise DataError(f"{self.path}: not a SentencePiece model ({e})") from None
            self.bos_id = self._sp.bos_id()
            self.vocab_size = self._sp.get_piece_size()
            if self.bos_id < 0:
                raise DataError(f"{self.path}: SentencePiece model defines no BOS piece")
        else:
            raise DataError(f"unknown tokenizer kind {kind!r} (expected bpe or llama2)")

    def encode(self, text):
        # encode_ordinary: a literal "<|bos|>" in the data stays text, never the special token.
        if self.kind == "bpe":
            return self._enc.encode_ordinary(text)
        return self._sp.encode(text)

    def encode_batch(self, texts):
        if self.kind == "bpe":
            return [self._enc.encode_ordinary(t) for t in texts]
        return self._sp.encode(list(texts))

    def decode(self, ids):
        if self.kind == "bpe":
            return self._enc.decode(list(ids))
        return self._sp.decode(list(ids))


def import_sentencepiece():
    try:
        import sentencepiece
    except ImportError:
        raise DataError("--tokenizer llama2 needs the sentencepiece package: "
                        "pip install sentencepiece") from None
    return sentencepiece


def train_bpe(texts, vocab_size, out_path):
    """Train a byte-level BPE with rustbpe on the text iterator and write it as JSON: the split
    pattern, the BOS token, and the token bytes in rank order (base64). vocab_size counts BOS."""
    import rustbpe  # imported here: the llama2 path and the data loader never need it
    tok = rustbpe.Tokenizer()
    tok.train_from_iterator(texts, vocab_size - 1, pattern=SPLIT_PATTERN)
    ranks = sorted(tok.get_mergeable_ranks(), key=lambda pair: pair[1])
    if [rank for _, rank in ranks] != list(range(len(ranks))):
        raise RuntimeError("rustbpe returned non-contiguous ranks")
    if len(ranks) < vocab_size - 1:
        raise DataError(f"the training text only supports {len(ranks) + 1} tokens, fewer than "
                        f"--vocab-size {vocab_size}: lower it or add text")
    spec = {"bos_id": len(ranks), "bos_token": BOS_TOKEN, "format": "nanoloop-bpe-v1",
            "pattern": SPLIT_PATTERN,
            "ranks": [base64.b64encode(token).decode("ascii") for token, _ in ranks]}
    # Sorted keys, fixed separators: the same merges always serialize to the same bytes, so the
    # sha256 in meta.json identifies the tokenizer.
    Path(out_path).write_text(json.dumps(spec, sort_keys=True, separators=(",", ":")) + "\n")


# ---------------------------------------------------------------------------------------------
# Packing
# ---------------------------------------------------------------------------------------------

class Packer:
    """Best-fit packing of BOS-started pieces into rows of exactly row_len tokens, written to a
    file as they fill.

    Documents longer than a row are first cut into row_len pieces (only the first starts with
    BOS): cropping them whole would throw away almost all of a long document (a book at
    seq_len 256 would keep 0.05% of its tokens). The pieces wait in a buffer of buffer_docs; the
    current row is filled by repeatedly taking the largest buffered piece that fits the remaining
    space, and when none fits, the shortest piece is cropped to fill the row exactly (its
    remainder is discarded and counted: taking the shortest discards the least). No padding; the
    final partial row is dropped and counted. Ties go to the earliest piece, so the output is a
    pure function of the input order."""

    def __init__(self, out_file, row_len, buffer_docs, block_rows=None):
        self.out, self.row_len, self.buffer_docs = out_file, row_len, buffer_docs
        block_rows = block_rows or max(1, (1 << 22) // row_len)  # write ~8 MB at a time
        self.keys, self.pieces, self.seq = [], {}, 0  # keys: sorted (length, seq); seq -> piece
        self.block = np.empty((block_rows, row_len), dtype=np.uint16)  # rows awaiting a write
        self.block_fill, self.fill = 0, 0  # complete rows in block; tokens in the current row
        self.rows = self.docs = self.tokens_in = self.cropped = self.tail = 0

    def add_document(self, tokens):
        """tokens: the document's uint16 ids with BOS first."""
        self.docs += 1
        self.tokens_in += len(tokens)
        for start in range(0, len(tokens), self.row_len):
            bisect.insort(self.keys, (min(self.row_len, len(tokens) - start), self.seq))
            # A copy, so a buffered piece does not keep its whole tokenizer batch alive.
            self.pieces[self.seq] = tokens[start:start + self.row_len].copy()
            self.seq += 1
            while len(self.keys) >= self.buffer_docs:
                self._place_one()

    def _place_one(self):
        space = self.row_len - self.fill
        i = bisect.bisect_right(self.keys, (space, math.inf))  # keys[:i] all fit
        if i:
            length = self.keys[i - 1][0]
            j = bisect.bisect_left(self.keys, (length, -1))     # earliest piece of that length
            _, seq = self.keys.pop(j)
            piece = self.pieces.pop(seq)
        else:
            _, seq = self.keys.pop(0)
            piece = self.pieces.pop(seq)
            self.cropped += len(piece) - space
            piece = piece[:space]
        self.block[self.block_fill, self.fill:self.fill + len(piece)] = piece
        self.fill += len(piece)
        if self.fill == self.row_len:
            self.fill, self.block_fill, self.rows = 0, self.block_fill + 1, self.rows + 1
            if self.block_fill == len(self.block):
                self._flush()

    def _flush(self):
        self.out.write(self.block[:self.block_fill].tobytes())
        self.block_fill = 0

    def finish(self):
        while self.keys:
            self._place_one()
        self.tail = self.fill  # an incomplete last row: dropped, never padded
        self.fill = 0
        self._flush()
        return {"rows": self.rows, "docs": self.docs, "tokens_in": self.tokens_in,
                "tokens": self.rows * self.row_len, "cropped_tokens": self.cropped,
                "tail_tokens_dropped": self.tail}


_WORKER_TOKENIZER = None


def _init_worker(kind, path):
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = Tokenizer(kind, path)


def _encode_task(texts, bos_id):
    """Tokenize a batch; return the BOS-prefixed documents as one flat uint16 array plus their
    lengths (numpy crosses the process boundary far cheaper than lists of ints)."""
    docs = _WORKER_TOKENIZER.encode_batch(texts)
    lengths = np.array([len(d) + 1 for d in docs], dtype=np.int64)
    flat = np.empty(int(lengths.sum()), dtype=np.uint16)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    flat[starts] = bos_id
    for start, ids in zip(starts, docs):
        flat[start + 1:start + 1 + len(ids)] = ids
    return flat, lengths


def iter_batches(plan):
    """(split, texts) batches of about BATCH_CHARS characters, in plan order; never mixes splits
    within a batch, so the packed order is the source order."""
    for entry in plan:
        batch, chars, batch_split = [], 0, None
        for i, text in enumerate(iter_texts(entry["path"])):
            if not text:
                continue
            split = "val" if i >= entry["val_from"] else "train"
            if batch and (split != batch_split or chars >= BATCH_CHARS):
                yield batch_split, batch
                batch, chars = [], 0
            batch.append(text)
            chars += len(text)
            batch_split = split
        if batch:
            yield batch_split, batch


def tokenize_and_pack(plan, kind, tokenizer_path, row_len, buffer_docs, workers, out_paths):
    """Tokenize every planned document (in parallel when workers > 1) and best-fit pack each split
    into its file. out_paths: {"train": path, "val": path}. Returns per-split packing stats plus
    the tokenizing throughput."""
    bos_id = Tokenizer(kind, tokenizer_path).bos_id
    t0 = time.time()
    last_print, total_in = t0, 0
    files = {split: open(path, "wb") for split, path in out_paths.items()}
    pool = None
    try:
        packers = {s: Packer(f, row_len, buffer_docs) for s, f in files.items()}
        if workers > 1:
            # spawn, not fork: fork would copy the locks held by this process's other threads
            # (rustbpe's rayon pool, torch) but not the threads, which can hang a child.
            pool = multiprocessing.get_context("spawn").Pool(
                workers, initializer=_init_worker, initargs=(kind, str(tokenizer_path)))

            def results():
                # At most 2 tasks per worker in flight: bounded memory, and the workers
                # tokenize ahead while this process packs.
                pending = deque()
                for split, texts in iter_batches(plan):
                    pending.append((split, pool.apply_async(_encode_task, (texts, bos_id))))
                    if len(pending) >= 2 * workers:
                        split_done, res = pending.popleft()
                        yield split_done, res.get()
                while pending:
                    split_done, res = pending.popleft()
                    yield split_done, res.get()
        else:
            _init_worker(kind, str(tokenizer_path))

            def results():
                for split, texts in iter_batches(plan):
                    yield split, _encode_task(texts, bos_id)

        for split, (flat, lengths) in results():
            packer = packers[split]
            start = 0
            for n in lengths.tolist():
                packer.add_document(flat[start:start + n])
                start += n
            total_in += len(flat)
            now = time.time()
            if now - last_print > 10:
                last_print = now
                print(f"tokenize: {total_in / 1e6:.1f}M tokens, "
                      f"{total_in / (now - t0) / 1e6:.2f}M tokens/s", file=sys.stderr, flush=True)
        stats = {s: p.finish() for s, p in packers.items()}
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
        for f in files.values():
            f.close()
    seconds = time.time() - t0
    stats["seconds"] = seconds
    stats["tokens_per_s"] = total_in / max(seconds, 1e-9)
    return stats


# ---------------------------------------------------------------------------------------------
# Planning sources, the command line
# ---------------------------------------------------------------------------------------------

def local_files(sources):
    """Expand --source paths (files or folders, searched recursively) into a sorted file list."""
    files = []
    for src in sources:
        src = Path(src)
        if src.is_dir():
            found = sorted(p for p in src.rglob("*")
                           if p.is_file() and p.suffix.lower() in SOURCE_SUFFIXES
                           and not p.name.startswith("."))
            if not found:
                raise DataError(f"{src}: no {'/'.join(SOURCE_SUFFIXES)} files in this folder")
            files.extend(found)
        elif src.is_file():
            if src.suffix.lower() not in SOURCE_SUFFIXES:
                raise DataError(f"{src}: unsupported file type "
                                f"(expected {', '.join(SOURCE_SUFFIXES)})")
            files.append(src)
        else:
            raise DataError(f"{src}: no such file or folder")
    return files


def make_plan(files, val_shards, val_fraction):
    """Decide which documents are validation, before anything is tokenized. Either the last
    val_shards files are entirely validation, or the last val_fraction of the documents of every
    file is (whole documents, at least one training document left per file)."""
    plan = []
    for k, path in enumerate(files):
        n_docs = scan_source_file(path)
        if val_fraction > 0:
            val_from = n_docs - min(math.ceil(val_fraction * n_docs), max(n_docs - 1, 0))
        else:
            val_from = 0 if k >= len(files) - val_shards else n_docs
        plan.append({"path": path, "docs": n_docs, "val_from": val_from})
    if sum(e["docs"] for e in plan) == 0:
        raise DataError(f"no documents in the source ({', '.join(str(f) for f in files)})")
    if not any(e["val_from"] < e["docs"] for e in plan):
        raise DataError("the validation split is empty: raise --val-fraction or use --val-shards")
    return plan


def count(text):
    """An integer flag that also accepts scientific notation, e.g. 2e9."""
    return int(float(text))


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="data/fineweb", help="output folder (default data/fineweb)")
    p.add_argument("--dataset", choices=["shuffled", "official"], default="shuffled",
                   help="download source: karpathy/fineweb-edu-100b-shuffle shards or "
                        "HuggingFaceFW/fineweb-edu sample/10BT files (default shuffled)")
    p.add_argument("--shards", type=int, default=None,
                   help="training shards to download (default 8)")
    p.add_argument("--val-shards", type=int, default=None,
                   help="whole shards/files held out for validation, the last ones (default 2)")
    p.add_argument("--val-fraction", type=float, default=0.0,
                   help="instead of whole shards, hold out this last fraction of the documents "
                        "of every file")
    p.add_argument("--base-url", default=None,
                   help="download host prefix (default: the --dataset's Hugging Face URL)")
    p.add_argument("--download-dir", default=None,
                   help="where downloaded shards are kept (default data/raw/<dataset>)")
    p.add_argument("--download-workers", type=int, default=8,
                   help="parallel downloads (default 8)")
    p.add_argument("--retries", type=int, default=5,
                   help="retries per download, resuming with HTTP Range (default 5)")
    p.add_argument("--source", nargs="+", default=None,
                   help="local .parquet/.jsonl/.txt files or folders instead of downloading")
    p.add_argument("--tokenizer", choices=["bpe", "llama2"], default="bpe",
                   help="bpe: train a byte-level BPE here; llama2: a SentencePiece model file")
    p.add_argument("--tokenizer-model", default=None,
                   help="SentencePiece .model file for --tokenizer llama2")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="BPE vocabulary including <|bos|> (default 32000)")
    p.add_argument("--tokenizer-chars", type=count, default=2_000_000_000,
                   help="at most this many characters of training text for BPE training "
                        "(default 2e9)")
    p.add_argument("--seq-len", type=int, default=2048,
                   help="model context; rows hold seq-len+1 tokens (default 2048)")
    p.add_argument("--buffer-docs", type=int, default=1000,
                   help="best-fit packing buffer, in document pieces (default 1000)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="tokenizer processes; 1 = in-process (default: all cores)")
    return p.parse_args(argv)


def check_args(a):
    """Every flag problem, before any download or training."""
    if a.source is not None:
        for flag, value in (("--shards", a.shards), ("--base-url", a.base_url),
                            ("--download-dir", a.download_dir)):
            if value is not None:
                raise DataError(f"{flag} applies to downloads, not to --source")
    if a.val_fraction and a.val_shards is not None:
        raise DataError("use either --val-fraction or --val-shards, not both")
    if not 0 <= a.val_fraction < 1:
        raise DataError(f"--val-fraction must be in [0, 1), got {a.val_fraction}")
    a.val_shards = 0 if a.val_fraction else (2 if a.val_shards is None else a.val_shards)
    if not a.val_fraction and a.val_shards < 1:
        raise DataError("--val-shards must be >= 1 (or use --val-fraction)")
    a.shards = 8 if a.shards is None else a.shards
    for flag, value in (("--shards", a.shards), ("--seq-len", a.seq_len),
                        ("--buffer-docs", a.buffer_docs), ("--workers", a.workers),
                        ("--download-workers", a.download_workers),
                        ("--tokenizer-chars", a.tokenizer_chars)):
        if value < 1:
            raise DataError(f"{flag} must be >= 1, got {value}")
    if a.retries < 0:
        raise DataError(f"--retries must be >= 0, got {a.retries}")
    if a.tokenizer == "bpe":
        if a.tokenizer_model is not None:
            raise DataError("--tokenizer-model is for --tokenizer llama2")
        a.vocab_size = 32000 if a.vocab_size is None else a.vocab_size
        if not 257 <= a.vocab_size <= MAX_VOCAB:
            raise DataError(f"--vocab-size {a.vocab_size} out of range: 257 (256 bytes + BOS) to "
                            f"{MAX_VOCAB} (token ids are stored as uint16)")
    else:
        if a.tokenizer_model is None:
            raise DataError("--tokenizer llama2 needs --tokenizer-model PATH (a SentencePiece "
                            ".model file, e.g. Llama 2's tokenizer.model)")
        if a.vocab_size is not None:
            raise DataError("--vocab-size is fixed by the SentencePiece model; drop the flag")
        if not Path(a.tokenizer_model).is_file():
            raise DataError(f"{a.tokenizer_model}: tokenizer model not found")


def prepare(a):
    """Run the whole pipeline for parsed, checked arguments; return the meta dict written."""
    out = Path(a.out)
    meta_path = out / "meta.json"
    tok_name = "tokenizer.json" if a.tokenizer == "bpe" else "tokenizer.model"
    old = json.loads(meta_path.read_text()) if meta_path.exists() else None

    def refuse_other_tokenizer(what):
        raise DataError(f"{meta_path}: {out} was built with another tokenizer ({what}); "
                        f"use a new --out or delete {out}")

    if old and old.get("tokenizer_kind") != a.tokenizer:
        refuse_other_tokenizer(f"{old.get('tokenizer_kind')}, not {a.tokenizer}")
    if old and a.tokenizer == "bpe" and old.get("vocab_size") != a.vocab_size:
        refuse_other_tokenizer(f"vocab {old.get('vocab_size')}, not {a.vocab_size}")
    if a.tokenizer == "llama2":
        # Cheap checks first: the model loads, ids fit uint16, and it matches an existing dataset.
        sp = Tokenizer("llama2", a.tokenizer_model)
        if sp.vocab_size > MAX_VOCAB:
            raise DataError(f"{a.tokenizer_model}: {sp.vocab_size} pieces do not fit uint16 "
                            f"token ids (at most {MAX_VOCAB})")
        sp_hash = sha256_file(a.tokenizer_model)
        if old and old.get("tokenizer_sha256") != sp_hash:
            refuse_other_tokenizer(f"sha256 {old.get('tokenizer_sha256')}, not {sp_hash}")

    if a.source is not None:
        files = local_files(a.source)
        if not a.val_fraction and len(files) <= a.val_shards:
            raise DataError(f"{', '.join(map(str, files))}: {len(files)} file(s) cannot hold out "
                            f"{a.val_shards} validation file(s) and keep training data; "
                            f"use --val-fraction")
    else:
        n_total = SHUFFLED_SHARDS if a.dataset == "shuffled" else OFFICIAL_SHARDS
        n = a.shards + a.val_shards
        if n > n_total:
            raise DataError(f"--shards {a.shards} + --val-shards {a.val_shards} exceeds the "
                            f"{n_total} files of --dataset {a.dataset}")
        names = [f"shard_{i:05d}.parquet" if a.dataset == "shuffled"
                 else f"sample/10BT/{i:03d}_00000.parquet" for i in range(n)]
        base = a.base_url or (SHUFFLED_BASE_URL if a.dataset == "shuffled" else OFFICIAL_BASE_URL)
        ddir = Path(a.download_dir) if a.download_dir else Path("data") / "raw" / a.dataset
        files = download_shards(names, base, ddir, a.download_workers, a.retries)
    plan = make_plan(files, a.val_shards, a.val_fraction)

    out.mkdir(parents=True, exist_ok=True)
    tmp = {"train": out / "train.bin.tmp", "val": out / "val.bin.tmp",
           "tok": out / (tok_name + ".tmp")}
    try:
        t0 = time.time()
        if a.tokenizer == "bpe":
            budget = [a.tokenizer_chars]

            def training_text():
                for text in iter_split_texts(plan, "train"):
                    yield text[:budget[0]]
                    budget[0] -= min(len(text), budget[0])
                    if budget[0] == 0:
                        return
            print(f"tokenizer: training a {a.vocab_size}-token BPE on up to "
                  f"{a.tokenizer_chars:,} characters", file=sys.stderr, flush=True)
            train_bpe(training_text(), a.vocab_size, tmp["tok"])
        else:
            tmp["tok"].write_bytes(Path(a.tokenizer_model).read_bytes())
        tok_seconds = time.time() - t0
        tok_hash = sha256_file(tmp["tok"])
        if old and old.get("tokenizer_sha256") != tok_hash:
            refuse_other_tokenizer(f"sha256 {old.get('tokenizer_sha256')}, not {tok_hash}")
        tok = Tokenizer(a.tokenizer, tmp["tok"])

        row_len = a.seq_len + 1
        stats = tokenize_and_pack(plan, a.tokenizer, tmp["tok"], row_len, a.buffer_docs,
                                  a.workers, {"train": tmp["train"], "val": tmp["val"]})
        for split in ("train", "val"):
            if stats[split]["rows"] == 0:
                raise DataError(f"{split} split has {stats[split]['tokens_in']} tokens, not one "
                                f"full row of {row_len}: lower --seq-len or add data")
        tokens_in = stats["train"]["tokens_in"] + stats["val"]["tokens_in"]
        cropped = stats["train"]["cropped_tokens"] + stats["val"]["cropped_tokens"]
        meta = {
            "format": FORMAT, "dtype": "uint16",
            "tokenizer_kind": a.tokenizer, "tokenizer_file": tok_name, "tokenizer_sha256": tok_hash,
            "vocab_size": tok.vocab_size, "bos_id": tok.bos_id,
            "seq_len": a.seq_len, "row_len": row_len,
            "train_rows": stats["train"]["rows"], "val_rows": stats["val"]["rows"],
            "train_tokens": stats["train"]["tokens"], "val_tokens": stats["val"]["tokens"],
            "train_docs": stats["train"]["docs"], "val_docs": stats["val"]["docs"],
            "cropped_tokens": cropped, "cropped_fraction": cropped / tokens_in,
            "tail_tokens_dropped": stats["train"]["tail_tokens_dropped"]
            + stats["val"]["tail_tokens_dropped"],
            "split": ({"val_fraction": a.val_fraction} if a.val_fraction
                      else {"val_files": [e["path"].name for e in plan if e["val_from"] == 0]}),
            "sources": [{"file": e["path"].name, "path": str(e["path"].resolve()),
                         "bytes": e["path"].stat().st_size, "docs": e["docs"],
                         "val_docs": e["docs"] - e["val_from"]} for e in plan],
            "packing": {"method": "best-fit", "buffer_docs": a.buffer_docs,
                        "long_documents": "cut into row_len pieces, BOS on the first only"},
            "tokenizer_train_seconds": round(tok_seconds, 3),
            "tokenize_pack_seconds": round(stats["seconds"], 3),
            "tokens_per_s": round(stats["tokens_per_s"]), "workers": a.workers,
            "command": a.command,
            "train_sha256": sha256_file(tmp["train"]), "val_sha256": sha256_file(tmp["val"]),
        }
        # An old meta.json must go before any file is replaced, so a crash in between never
        # leaves new data next to a stale "complete" marker.
        meta_path.unlink(missing_ok=True)
        os.replace(tmp["tok"], out / tok_name)
        os.replace(tmp["train"], out / "train.bin")
        os.replace(tmp["val"], out / "val.bin")
        atomic_write(meta_path, (json.dumps(meta, indent=2) + "\n").encode())
    finally:
        for path in tmp.values():
            path.unlink(missing_ok=True)
    return meta


def main(argv=None):
    a = parse_args(argv)
    args = sys.argv[1:] if argv is None else list(argv)
    a.command = shlex.join(["python", "prepare_data.py"] + args)
    try:
        check_args(a)
        # rustbpe trains on rayon's thread pool: respect --workers there too (others share cores).
        os.environ.setdefault("RAYON_NUM_THREADS", str(a.workers))
        meta = prepare(a)
    except DataError as e:
        raise SystemExit(f"prepare_data.py: error: {e}") from None
    for split in ("train", "val"):
        print(f"{split}: {meta[f'{split}_rows']:,} rows x {meta['row_len']} = "
              f"{meta[f'{split}_tokens']:,} tokens from {meta[f'{split}_docs']:,} documents")
    print(f"vocab {meta['vocab_size']} ({meta['tokenizer_kind']}), cropped "
          f"{100 * meta['cropped_fraction']:.2f}% of tokens, {meta['tokens_per_s']:,} tokens/s "
          f"with {meta['workers']} worker(s) -> {Path(a.out) / 'meta.json'}")


# ---------------------------------------------------------------------------------------------
# Data loader API for train.py (numpy + torch, no model code)
# ---------------------------------------------------------------------------------------------

REQUIRED_KEYS = ("format", "tokenizer_kind", "tokenizer_file", "tokenizer_sha256", "vocab_size",
                 "bos_id", "seq_len", "row_len", "train_rows", "val_rows", "train_tokens",
                 "train_sha256", "val_sha256")


def read_meta(data_dir, verify=True):
    """The dataset's meta.json as a dict, after checking that the dataset is whole: every required
    key present, train.bin/val.bin of the size meta.json gives, and (verify=True) their sha256
    equal to the recorded one. Any problem is a DataError (a ValueError) with one line saying how
    to fix it. verify reads both files in full (seconds per GB); train.py does it once per start,
    RowLoader skips it."""
    path = Path(data_dir) / "meta.json"
    rebuild = f"rebuild it with prepare_data.py (e.g. --shards 8 --out {data_dir}, or --source PATH)"
    if not path.exists():
        raise DataError(f"{path} not found: {rebuild}")
    try:
        meta = json.loads(path.read_text())
    except ValueError as e:
        raise DataError(f"{path}: not valid JSON ({e}); {rebuild}") from None
    if not isinstance(meta, dict):
        raise DataError(f"{path}: not a JSON object; {rebuild}")
    if meta.get("format") != FORMAT:
        raise DataError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}; {rebuild}")
    missing = [k for k in REQUIRED_KEYS if k not in meta]
    if missing:
        raise DataError(f"{path}: missing key {missing[0]!r} (an older or damaged dataset); "
                        f"{rebuild}")
    for split in ("train", "val"):
        bin_path = Path(data_dir) / f"{split}.bin"
        expected = meta[f"{split}_rows"] * meta["row_len"] * 2
        size = bin_path.stat().st_size if bin_path.exists() else None
        if size != expected:
            raise DataError(f"{bin_path}: {size if size is not None else 'no file'} bytes, meta.json "
                            f"says {expected} ({meta[f'{split}_rows']} rows of {meta['row_len']} "
                            f"uint16); {rebuild}")
        if verify and sha256_file(bin_path) != meta[f"{split}_sha256"]:
            raise DataError(f"{bin_path}: sha256 differs from meta.json's {split}_sha256 (the "
                            f"file was changed after it was built); {rebuild}")
    return meta


def data_identity(meta):
    """What names a dataset in a run's identity (train.py): the same values mean the same tokens."""
    keys = ("tokenizer_sha256", "vocab_size", "seq_len", "train_sha256", "val_sha256")
    return {k: meta[k] for k in keys} | {"packing": meta.get("packing", {}).get("method")}


def load_tokenizer(data_dir):
    """The dataset's tokenizer: .encode(text) -> ids (no BOS), .decode(ids), .bos_id, .vocab_size.
    Its sha256 is checked against meta.json, so a swapped tokenizer file cannot go unnoticed."""
    meta = read_meta(data_dir, verify=False)
    path = Path(data_dir) / meta["tokenizer_file"]
    if sha256_file(path) != meta["tokenizer_sha256"]:
        raise ValueError(f"{path}: sha256 differs from meta.json's tokenizer_sha256; the "
                         f"dataset and its tokenizer do not belong together")
    return Tokenizer(meta["tokenizer_kind"], path)


ROW_ORDER_SEED = 1234  # the data order of every run; change it to resample the order


class RowLoader:
    """Batches of packed rows from train.bin / val.bin, memory-mapped, in a shuffled order.

    Each next_batch() consumes world_size * batch_rows global rows starting at self.row; rank k
    takes rows row + k + world_size * i (i < batch_rows). The ranks are disjoint and together read
    exactly what one process with batch_rows * world_size reads. self.row only grows (save it to
    resume); self.epoch = self.row // self.n_rows counts passes.

    Global row g is file row order(epoch)[g % n_rows], where order(epoch) is a fixed permutation
    (seeded by ROW_ORDER_SEED and the epoch, so every run and every rank sees the same order).
    Why: the packer writes a document's rows next to each other and the sources one after another,
    so reading the file in order gives batches of one or two documents (a 2k-token web page is 16
    rows of 128) and, for a local corpus, whole phases of one source (all the web text, then all
    the books). The FineWeb-Edu shards are pre-shuffled by document, but rows still cluster.
    Validation: RowLoader(data_dir, "val", ...) from start_row=0 always gives the same rows, a
    uniform sample of the split rather than its first documents."""

    def __init__(self, data_dir, split, batch_rows, rank=0, world_size=1, start_row=0):
        # torch imported here, not at the top: prepare_data's tokenizer worker processes import
        # this module and do not need torch's import time and memory.
        import torch
        self.torch = torch
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        if batch_rows < 1 or world_size < 1 or not 0 <= rank < world_size or start_row < 0:
            raise ValueError(f"bad RowLoader arguments: batch_rows={batch_rows}, rank={rank}, "
                             f"world_size={world_size}, start_row={start_row}")
        meta = read_meta(data_dir, verify=False)  # sizes checked; train.py verified checksums
        self.row_len, self.seq_len = meta["row_len"], meta["seq_len"]
        self.n_rows = meta[f"{split}_rows"]
        path = Path(data_dir) / f"{split}.bin"
        self.data = np.memmap(path, dtype=np.uint16, mode="r", shape=(self.n_rows, self.row_len))
        self.batch_rows, self.rank, self.world_size = batch_rows, rank, world_size
        self.row = start_row
        self.epoch = self.row // self.n_rows
        self._order, self._order_epoch = None, None

    def order(self, epoch):
        """The permutation of file rows read in pass `epoch` (cached: one pass at a time)."""
        if self._order_epoch != epoch:
            rng = np.random.default_rng([ROW_ORDER_SEED, epoch])
            self._order, self._order_epoch = rng.permutation(self.n_rows), epoch
        return self._order

    def next_batch(self):
        """(x, y): int64 tensors (batch_rows, seq_len); y is x shifted left by one token."""
        global_rows = self.row + self.rank + self.world_size * np.arange(self.batch_rows)
        epochs, positions = np.divmod(global_rows, self.n_rows)
        idx = np.empty_like(positions)
        for epoch in np.unique(epochs):  # a batch may straddle the end of a pass
            here = epochs == epoch
            idx[here] = self.order(int(epoch))[positions[here]]
        rows = self.torch.from_numpy(np.asarray(self.data[idx]).astype(np.int64))
        self.row += self.world_size * self.batch_rows
        self.epoch = self.row // self.n_rows
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


if __name__ == "__main__":
    main()
