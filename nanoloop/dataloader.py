"""
What a run reads a prepared dataset with (prepare_data.py writes it): the checks of meta.json and the .bin
files, the dataset's identity for a run's run_id, its tokenizer, and the RowLoader that serves token rows.
Every failure of one of these files is one DataError naming it (train.py and evaluate.py print it as one line).

    meta = read_meta("data/micro-2k")                      # keys, types, sizes, sha256 checksums
    loader = RowLoader("data/micro-2k", "train", batch_rows=16, rank=0, world_size=1)
    x, y = loader.next_batch()                             # int64 (16, seq_len) each, y = x shifted by one
"""
import hashlib
import itertools
from pathlib import Path

import numpy as np
import tiktoken
import tiktoken.load

from nanoloop.common import DataError, load_json

FORMAT = "nanoloop-rows-v2"
EXTRA_TOKEN = "<|assistant_end|>"  # the id after the SentencePiece pieces; never in pretraining text
BOS_TOKEN = "<|bos|>"               # the BPE's one special token, the id after the last merge
# GPT-4's split pattern (cl100k): merges never cross word, 3-digit number, punctuation or space boundaries.
SPLIT_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}|"""
                 r""" ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+""")
MAX_VOCAB = 65536                   # token ids are stored as uint16
ROW_ORDER_SEED = 1234               # the data order of every run (RowLoader); change it to resample the order


def sha256_file(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


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
        import sentencepiece  # here: only the Llama 2 path needs it
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
        """Text of token ids; SentencePiece cannot decode EXTRA_TOKEN's id (it is past its pieces), so runs of it are
        written out as the token's text and the rest decoded in between."""
        if self.kind == "bpe":
            return self._enc.decode(list(ids))
        runs = itertools.groupby(ids, key=lambda i: i == self.extra_id)
        return "".join(EXTRA_TOKEN * len(list(group)) if extra else self._sp.decode(list(group))
                       for extra, group in runs)


# The types meta.json's keys must have: a damaged or hand-edited file is refused here, by name, and not
# with a traceback in whatever arithmetic first touches the value.
META_TYPES = {"row_len": int, "seq_len": int, "vocab_size": int, "bos_id": int, "train_rows": int, "val_rows": int,
              "train_tokens": int, "tokenizer_kind": str, "tokenizer_file": str, "tokenizer_sha256": str,
              "train_sha256": str, "val_sha256": str, "packing": dict}


def read_meta(data_dir, verify=True):
    """meta.json once the dataset checks whole: keys, .bin sizes, (verify: a full read) sha256s; else a DataError
    naming the file. The full read costs about 1 s/GB; train.py pays it once per start of a run not done yet, so a
    dataset changed after a run began cannot resume it."""
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
    if not isinstance(meta["packing"].get("method"), str):  # data_identity names the data by it
        raise DataError(f"{path}: packing has no method (a string); {rebuild}")
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
    rows from self.row (save it to resume), rank k taking row + k + world_size * i: 8 GPUs, 2 CPU processes and one
    process read the same tokens. Row g is file row order(epoch)[g % n_rows], a permutation seeded by order_seed
    (ROW_ORDER_SEED unless train.py's --data-order says) and the epoch, the same for every rank. Why not file order:
    the packer writes a document's rows next to each other and a local corpus source after source, so a 16-row CPU
    batch would be one or two web pages and the micro-corpus would be trained on in phases, web then books (that
    broke the first CPU sweep: dev/README.md, "How the grid was fixed"). train.py's validation loader restarts at
    row 0 for every evaluation, so it reads the same rows every time."""

    def __init__(self, data_dir, split, batch_rows, rank=0, world_size=1, start_row=0, order_seed=ROW_ORDER_SEED):
        meta = read_meta(data_dir, verify=False)  # sizes checked; train.py verified the checksums
        self.row_len, self.seq_len, self.n_rows = meta["row_len"], meta["seq_len"], meta[f"{split}_rows"]
        self.data = np.memmap(Path(data_dir) / f"{split}.bin", np.uint16, "r", shape=(self.n_rows, self.row_len))
        self.batch_rows, self.rank, self.world_size = batch_rows, rank, world_size
        self.row, self.epoch, self._orders = start_row, start_row // self.n_rows, {}
        self.order_seed = order_seed

    def order(self, epoch):
        """The permutation of file rows read in pass `epoch` (cached: one pass at a time)."""
        if epoch not in self._orders:
            self._orders = {epoch: np.random.default_rng([self.order_seed, epoch]).permutation(self.n_rows)}
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
