"""
Offline tests of prepare_data.py: downloads from a local HTTP server (a dropped connection resumes
with Range, garbage is refused, the paper's Llama-2 path end to end with a tiny SentencePiece model),
best-fit packing in both modes, the micro-corpus rows pinned byte for byte, both tokenizers, damaged
datasets and bad input as one-line errors, and the RowLoader's rank/resume semantics.

The FineWeb-Edu sample and the micro-corpus ship with the repository (data/); no test skips for
missing data. Small vocabularies and short rows keep this fast.
"""
import contextlib
import hashlib
import http.server
import io
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "fineweb-edu-sample"
sys.path.insert(0, str(REPO))
from nanoloop import common  # noqa: E402
from nanoloop import dataloader  # noqa: E402
from nanoloop import download  # noqa: E402
import prepare_data as pdata  # noqa: E402

def sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def sample_texts():
    return [json.loads(line)["text"] for line in (SAMPLE / "docs.jsonl").open()]


def build(out, *args, workers=1):
    pdata.main([*map(str, args), "--out", str(out), "--workers", str(workers)])
    return json.loads((out / "meta.json").read_text())


def error_of(*args):
    """Run main expecting a bad-input failure (exit 2, one line on stderr); return that line."""
    err = io.StringIO()
    with pytest.raises(SystemExit) as e, contextlib.redirect_stderr(err):
        pdata.main(list(map(str, args)))
    last = err.getvalue().strip().splitlines()[-1]
    assert e.value.code == 2 and last.startswith("prepare_data.py: ")
    assert "Traceback" not in err.getvalue()
    return last


def contains(haystack, needle):
    """Whether the uint16 sequence needle occurs in haystack (token-aligned)."""
    hay, pat = haystack.tobytes(), needle.astype(np.uint16).tobytes()
    at = hay.find(pat)
    while at != -1 and at % 2:
        at = hay.find(pat, at + 1)
    return at != -1


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch):
    monkeypatch.setattr(download, "RETRY_BASE_S", 0.01)


# ---------------------------------------------------------------------------------------------
# Local HTTP server: /<mode>/<file> serves server.files[<file>] or data/fineweb-edu-sample/<file>
#; the dataset's last shard (the fixed validation split) is the sample's shard_00001
#   ok        plain server with Range support
#   drop      first request promises the whole file, sends half, hangs up; later ones honour Range
#   dropnorange  like drop, but later requests ignore Range and send the whole file (200)
#   truncate  every response stops halfway through what it promised
#   garbage   200 with an HTML page instead of parquet
# ---------------------------------------------------------------------------------------------

class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        mode, _, name = self.path.lstrip("/").partition("/")
        log = self.server.requests
        log.append((mode, name, self.headers.get("Range")))
        if mode == "garbage":
            return self.reply(200, b"<html>rate limited, try later</html>\n" * 100)
        path = SAMPLE / {"shard_01822.parquet": "shard_00001.parquet"}.get(name, name)
        if name not in self.server.files and not path.is_file():
            return self.reply(404, b"not found")
        data = self.server.files.get(name) or path.read_bytes()
        start = 0
        if self.headers.get("Range") and mode != "dropnorange":
            start = int(self.headers["Range"].split("=")[1].split("-")[0])
        if start >= len(data):
            self.send_response(416)  # what S3 / Hugging Face answer past the end of a file
            self.send_header("Content-Range", f"bytes */{len(data)}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        first = sum(1 for m, n, _ in log if (m, n) == (mode, name)) == 1
        cut = mode == "truncate" or (mode in ("drop", "dropnorange") and first)
        body = data[start:]
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(body)))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        self.wfile.write(body[:len(body) // 2] if cut else body)
        self.close_connection = True

    def reply(self, code, body):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.requests, srv.files = [], {}
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def url(srv, mode):
    return f"http://127.0.0.1:{srv.server_address[1]}/{mode}"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """docs.jsonl packed with 10% of its documents held out: the dataset most tests read."""
    out = tmp_path_factory.mktemp("built")
    build(out, "--source", SAMPLE / "docs.jsonl", "--val-fraction", 0.1, "--vocab-size", 512,
          "--seq-len", 64)
    return out


# ---------------------------------------------------------------------------------------------
# Downloads
# ---------------------------------------------------------------------------------------------

def test_download_build_rerun_is_cached_and_deterministic(server, tmp_path):
    dl = tmp_path / "raw"
    common = ["--base-url", url(server, "ok"), "--shards", 1, "--val-shards", 1, "--download-dir", dl,
              "--tokenizer", "bpe", "--packing", "split", "--vocab-size", 512, "--seq-len", 64]
    meta = build(tmp_path / "a", *common)
    for name, sample in (("shard_00000.parquet", "shard_00000.parquet"),
                         ("shard_01822.parquet", "shard_00001.parquet")):
        assert (dl / name).read_bytes() == (SAMPLE / sample).read_bytes()
    assert not list(dl.glob("*.tmp"))
    assert meta["split"] == {"val_files": ["shard_01822.parquet"]}  # the dataset's last shard
    assert (meta["train_docs"], meta["val_docs"]) == (130, 20)
    assert meta["settings"]["sources"] == [["shard_00000.parquet", 155000], ["shard_01822.parquet", 23395]]
    assert meta["train_rows"] > 0 and meta["val_rows"] > 0
    assert meta["row_len"] == 65 and meta["vocab_size"] == 512 and meta["bos_id"] == 511
    for split in ("train", "val"):
        size = (tmp_path / "a" / f"{split}.bin").stat().st_size
        assert size == meta[f"{split}_rows"] * 65 * 2 == meta[f"{split}_tokens"] * 2

    # Shards on disk are not fetched again; tokenizing on 2 threads changes nothing.
    n_requests = len(server.requests)
    build(tmp_path / "b", *common, workers=2)
    assert len(server.requests) == n_requests
    for name in ("train.bin", "val.bin", "tokenizer.tiktoken"):
        assert sha(tmp_path / "a" / name) == sha(tmp_path / "b" / name)


@pytest.mark.parametrize("mode", ["drop", "dropnorange"])
def test_download_resumes_after_dropped_connection(server, tmp_path, mode):
    dest = tmp_path / "shard_00000.parquet"
    download.download_file(f"{url(server, mode)}/shard_00000.parquet", dest, pdata.check_parquet, retries=3)
    assert dest.read_bytes() == (SAMPLE / "shard_00000.parquet").read_bytes()
    hits = [r for r in server.requests if r[:2] == (mode, "shard_00000.parquet")]
    # Resumed on the second attempt from the whole chunks written before the drop (half the
    # file arrived; a partly received chunk is not written).
    kept = 155000 // 2 // 65536 * 65536  # chunks of 64 KiB
    assert kept > 0 and [r[2] for r in hits] == [None, f"bytes={kept}-"]
    assert not dest.with_name(dest.name + ".tmp").exists()


def test_partial_file_that_is_not_a_prefix_is_fetched_anew(server, tmp_path):
    # A .tmp as long as the remote file or longer (another version of it) gets HTTP 416: start clean.
    dest = tmp_path / "shard_00001.parquet"
    original = (SAMPLE / "shard_00001.parquet").read_bytes()
    dest.with_name(dest.name + ".tmp").write_bytes(original + b"stale")
    download.download_file(f"{url(server, 'ok')}/shard_00001.parquet", dest, pdata.check_parquet, retries=1)
    assert dest.read_bytes() == original
    hits = [r[2] for r in server.requests if r[:2] == ("ok", "shard_00001.parquet")][-2:]
    assert hits == [f"bytes={len(original) + 5}-", None]


def test_garbage_download_is_a_clear_error(server, tmp_path):
    dl = tmp_path / "raw"
    msg = error_of("--base-url", url(server, "garbage"), "--shards", 1, "--val-shards", 1,
                   "--download-dir", dl, "--out", tmp_path / "out", "--tokenizer", "bpe")
    assert "shard_0" in msg and "is not valid, deleted" in msg and "not a readable parquet" in msg
    assert not list(dl.iterdir())  # neither a shard nor a .tmp is left behind
    assert not (tmp_path / "out" / "meta.json").exists()


def test_truncated_download_is_a_clear_error(server, tmp_path):
    dl = tmp_path / "raw"
    msg = error_of("--base-url", url(server, "truncate"), "--shards", 1, "--val-shards", 1,
                   "--download-dir", dl, "--out", tmp_path / "out", "--tokenizer", "bpe")
    name = msg.split("/truncate/")[1].split(":")[0]  # the shard that failed first
    assert name in ("shard_00000.parquet", "shard_01822.parquet")
    assert f"incomplete after {download.RETRIES + 1} attempts" in msg
    assert not (dl / name).exists()
    assert (dl / f"{name}.tmp").exists()  # kept for the next run to resume


def test_missing_remote_shard_is_not_retried(server, tmp_path):
    msg = error_of("--base-url", url(server, "ok"), "--shards", 3, "--val-shards", 1,
                   "--download-dir", tmp_path / "raw", "--out", tmp_path / "out", "--tokenizer", "bpe")
    assert "shard_00002.parquet: HTTP 404" in msg
    assert sum(r[1] == "shard_00002.parquet" for r in server.requests) == 1


def test_paper_download_path_end_to_end(server, sp_model, tmp_path, capsys):
    """The defaults for downloads: a SentencePiece model fetched over HTTP (a tiny one standing in
    for Llama 2's) plus <|assistant_end|>, crop packing, validation = the dataset's last shard."""
    import flops
    server.files["tok.model"] = sp_model
    dl = tmp_path / "raw"
    common = ["--base-url", url(server, "ok"), "--val-shards", 1, "--download-dir", dl, "--seq-len", 64,
              "--tokenizer-model", f"{url(server, 'ok')}/tok.model"]
    meta = build(tmp_path / "one", *common, "--shards", 1)
    assert (dl / "tok.model").read_bytes() == sp_model
    assert meta["tokenizer_kind"] == "llama2" and meta["tokenizer_sha256"] == hashlib.sha256(sp_model).hexdigest()
    assert (meta["vocab_size"], meta["bos_id"]) == (401, 1)  # base + 1, as Llama 2's 32,000 -> 32,001
    assert meta["special_tokens"] == {"<s>": 1, "<|assistant_end|>": 400}
    assert meta["packing"]["method"] == "crop" and dataloader.data_identity(meta)["packing"] == "crop"
    assert meta["split"] == {"val_files": ["shard_01822.parquet"]}
    # Every row starts at a document start. Every document is longer than a 65-token row, so each
    # one became exactly one row, its head, and most tokens were cropped.
    for split in ("train", "val"):
        rows = np.fromfile(tmp_path / "one" / f"{split}.bin", dtype=np.uint16).reshape(-1, 65)
        assert (rows[:, 0] == 1).all() and (rows[:, 1:] != 1).all() and rows.max() < 400
        assert len(rows) == meta[f"{split}_docs"] and meta[f"{split}_docs"] in (130, 20)
    assert 0.9 < meta["cropped_fraction"] < 1
    out = capsys.readouterr().out
    assert f"{100 * meta['cropped_fraction']:.2f}% of tokens cropped" in out
    assert f"training tokens: {meta['train_tokens']:,}" in out
    tok = dataloader.load_tokenizer(tmp_path / "one")
    assert tok.vocab_size == 401 and tok.decode(tok.encode("Hi") + [400, 400]) == "Hi" + 2 * "<|assistant_end|>"
    # flops.py / train.py size the model from meta's vocab, padded to a multiple of 64 (32,001 -> 32,064).
    assert flops.ModelConfig(vocab_size=meta["vocab_size"]).padded_vocab == 448
    assert flops.ModelConfig(vocab_size=32001).padded_vocab == 32064
    # More training shards, the same validation rows: the split does not depend on --shards.
    meta2 = build(tmp_path / "two", *common, "--shards", 2)
    assert meta2["val_sha256"] == meta["val_sha256"] and meta2["train_rows"] > meta["train_rows"]
    assert meta2["shared_docs"] == 20  # the stand-in last shard is the sample's shard_00001 again


def test_llama2_model_from_the_default_url_is_checked_against_llama2s_sha256(server, sp_model, tmp_path,
                                                                           monkeypatch):
    server.files["tokenizer.model"] = sp_model
    monkeypatch.setattr(pdata, "LLAMA2_URL", f"{url(server, 'ok')}/tokenizer.model")
    msg = error_of("--source", SAMPLE / "docs.jsonl", "--val-fraction", 0.1, "--tokenizer", "llama2",
                   "--download-dir", tmp_path, "--out", tmp_path / "o")
    assert "is not Llama 2's tokenizer's" in msg and not (tmp_path / "tokenizer.model").exists()


# ---------------------------------------------------------------------------------------------
# Packing
# ---------------------------------------------------------------------------------------------

def pack(docs, row_len, buffer_docs, split_long=True):
    out = io.BytesIO()
    packer = pdata.Packer(out, row_len, split_long, buffer_docs)
    for d in docs:
        packer.add_document(np.asarray(d, dtype=np.uint16))
    stats = packer.finish()
    return np.frombuffer(out.getvalue(), dtype=np.uint16).reshape(-1, row_len), stats


def doc(k, length):
    """BOS (0) then `length - 1` copies of k: rows show which document each token came from."""
    return [0] + [k] * (length - 1)


def test_best_fit_takes_the_largest_piece_that_fits():
    rows, st = pack([doc(1, 6), doc(2, 5), doc(3, 4), doc(4, 3), doc(5, 2)], 10, 1000)
    assert rows.tolist() == [doc(1, 6) + doc(3, 4), doc(2, 5) + doc(4, 3) + doc(5, 2)]
    assert (st["cropped_tokens"], st["tail_tokens_dropped"]) == (0, 0)


def test_best_fit_ties_go_to_the_earliest_buffered_piece():
    """Of equally long pieces that fit, the one buffered first is placed: the packing the committed CPU rows were
    made with (test_micro_corpus_rows_are_the_ones_behind_the_committed_cpu_results checks it end to end)."""
    rows, _ = pack([doc(1, 5), doc(2, 5), doc(3, 5), doc(4, 5)], 10, 1000)
    assert rows.tolist() == [doc(1, 5) + doc(2, 5), doc(3, 5) + doc(4, 5)]


def test_when_nothing_fits_the_shortest_is_cropped_and_counted():
    rows, st = pack([doc(1, 7), doc(2, 8)], 10, 1000)
    assert rows.tolist() == [doc(2, 8) + doc(1, 2)]
    assert (st["rows"], st["cropped_tokens"], st["tail_tokens_dropped"]) == (1, 5, 0)


def test_buffer_size_limits_the_choice():
    docs = [doc(1, 3), doc(2, 3), doc(3, 8)]
    rows, st = pack(docs, 10, 2)  # the 8-token document arrives after the row is mostly full
    assert rows.tolist() == [doc(1, 3) + doc(2, 3) + doc(3, 4)]
    assert (st["cropped_tokens"], st["tail_tokens_dropped"]) == (4, 0)
    rows, st = pack(docs, 10, 1000)
    assert rows.tolist() == [doc(3, 8) + doc(1, 2)]
    assert (st["cropped_tokens"], st["tail_tokens_dropped"]) == (1, 3)


def test_long_documents_are_cut_into_rows_in_split_mode_and_cropped_in_crop_mode():
    d = list(range(10))  # BOS = 0 first
    rows, st = pack([d], 4, 1000)
    assert rows.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert (st["cropped_tokens"], st["tail_tokens_dropped"]) == (0, 2)
    rows, st = pack([d, doc(1, 3), doc(2, 6)], 4, 1000, split_long=False)
    assert rows.tolist() == [doc(1, 3) + [0], [0, 1, 2, 3]]  # a cropped document keeps its head
    assert (st["rows"], st["cropped_tokens"], st["tail_tokens_dropped"]) == (2, 5 + 6, 0)


def test_crop_packing_rows_start_at_document_starts():
    # The paper's packing: every row starts with a BOS, and a document's tokens in a row are always
    # preceded by all of its earlier tokens (no middle of a document without its start).
    rng = np.random.default_rng(1)
    row_len, n_docs, stride = 65, 150, 400
    lengths = rng.integers(1, stride, size=n_docs)
    docs = [[0] + [1 + k * stride + p for p in range(1, n)] for k, n in enumerate(lengths)]
    rows, st = pack(docs, row_len, 16, split_long=False)
    assert (rows[:, 0] == 0).all() and st["rows"] > 0
    assert st["rows"] * row_len + st["cropped_tokens"] + st["tail_tokens_dropped"] == lengths.sum()
    assert st["cropped_tokens"] > 0  # documents up to 6x a row: cropping really happened
    for row in rows.tolist():
        for col, tok in enumerate(row):
            if tok:
                k, p = divmod(tok - 1, stride)
                assert row[col - p:col] == docs[k][:p], "a document's tokens must follow its start"


def test_packing_invariants_on_random_documents():
    rng = np.random.default_rng(0)
    row_len, n_docs, stride = 65, 200, 300
    lengths = rng.integers(1, stride, size=n_docs)
    # Token value encodes (document k, position p); position 0 is BOS (0).
    docs = [[0] + [1 + k * stride + p for p in range(1, n)] for k, n in enumerate(lengths)]
    rows, st = pack(docs, row_len, 16)
    assert rows.shape == (st["rows"], row_len) and st["rows"] > 0
    assert st["rows"] * row_len + st["cropped_tokens"] + st["tail_tokens_dropped"] \
        == lengths.sum() == st["tokens_in"]
    seen = set()
    for row in rows.tolist():
        for col, tok in enumerate(row):
            if tok == 0:
                continue
            k, p = divmod(tok - 1, stride)
            assert (k, p) not in seen  # nothing duplicated
            seen.add((k, p))
            if p % row_len == 0:
                continue  # the start of a continuation piece of a long document
            prev = row[col - 1] if col else None
            if p == 1:
                assert prev == 0, "a document's first token must be its BOS"
            else:
                assert prev == tok - 1, "a piece must stay contiguous"
    # Every document that kept its first token kept its BOS in front of it, and no BOS is extra.
    n_bos = int((rows == 0).sum())
    assert n_bos <= n_docs and n_bos >= sum((k, 1) in seen for k in range(n_docs))


# ---------------------------------------------------------------------------------------------
# Splits and tokenizers
# ---------------------------------------------------------------------------------------------

def test_validation_documents_never_appear_in_train(built):
    meta = dataloader.read_meta(built)
    assert (meta["train_docs"], meta["val_docs"]) == (135, 15)
    tok = dataloader.load_tokenizer(built)
    train = np.fromfile(built / "train.bin", dtype=np.uint16)
    val = np.fromfile(built / "val.bin", dtype=np.uint16)
    heads = [np.array([tok.bos_id] + tok.encode(t)[:20]) for t in sample_texts()]
    in_val = [contains(val, h) for h in heads]
    in_train = [contains(train, h) for h in heads]
    assert not any(in_train[135:]) and not any(in_val[:135])
    # The search itself works: most documents are found where they belong (a few may sit in
    # the dropped last row).
    assert sum(in_train[:135]) >= 130 and sum(in_val[135:]) >= 13


def test_tokenizer_trains_on_train_documents_only_within_budget(tmp_path, monkeypatch):
    seen = []
    real_train_bpe = pdata.train_bpe

    def recording_train_bpe(texts, vocab_size, out_path):
        seen.extend(texts)
        real_train_bpe(iter(seen), vocab_size, out_path)

    monkeypatch.setattr(pdata, "train_bpe", recording_train_bpe)
    monkeypatch.setattr(pdata, "BATCH_CHARS", 50000)
    monkeypatch.setattr(pdata, "BPE_BATCHES", 1)  # the budget: the first batch of documents
    build(tmp_path, "--source", SAMPLE / "docs.jsonl", "--val-fraction", 0.1, "--vocab-size", 300,
          "--seq-len", 64)
    docs = sample_texts()
    assert sum(map(len, seen[:-1])) < 50000 <= sum(map(len, seen)) and seen == docs[:len(seen)]
    assert len(seen) < 100
    # Without a budget it reads exactly the 135 training documents, never the held-out 15.
    seen.clear()
    monkeypatch.setattr(pdata, "BPE_BATCHES", 10 ** 9)
    build(tmp_path / "all", "--source", SAMPLE / "docs.jsonl", "--val-fraction", 0.1,
          "--vocab-size", 300, "--seq-len", 64)
    assert seen == docs[:135]


MICRO = REPO / "data" / "micro-corpus"


@pytest.mark.slow
def test_micro_corpus_rows_are_the_ones_behind_the_committed_cpu_results(tmp_path):
    # The README's cpu-micro command on the in-repo corpus (two .jsonl.xz files, read through lzma);
    # these checksums are the rows the committed CPU sweeps trained on (made from the uncompressed
    # JSONL, by the code before the tiktoken file format, the thread pool and crop mode).
    assert sorted(p.name for p in MICRO.iterdir() if p.suffix == ".xz") == [
        "fineweb-web.jsonl.xz", "gutenberg-books.jsonl.xz"]
    meta = build(tmp_path, "--source", MICRO, "--vocab-size", 2048, "--seq-len", 128, "--val-fraction", 0.02,
                 workers=2)
    assert sha(tmp_path / "train.bin") == "6c8d61dbfbad4ec9129e90930fc7460b188a859dc39b21659df32dd038800c32"
    assert sha(tmp_path / "val.bin") == "4d2c5a510e7030da8722664b07bbcd4cc9474d2dfe9cac8d171fc6061473017c"
    assert (meta["packing"]["method"], meta["train_rows"], meta["val_rows"]) == ("split", 116511, 3127)


def test_xz_compressed_sources_give_the_same_rows_as_plain_ones(tmp_path):
    """.jsonl.xz and .txt.xz are read through lzma (the in-repo micro-corpus ships that way): the rows
    are byte-identical to those of the uncompressed files; \r\n in a .txt reads as \n either way."""
    import lzma
    plain, packed = tmp_path / "plain", tmp_path / "xz"
    plain.mkdir()
    packed.mkdir()
    lines = (SAMPLE / "docs.jsonl").read_bytes().splitlines(keepends=True)
    book = "\r\n".join(sample_texts()[:40]).encode()
    for folder, compress in ((plain, False), (packed, True)):
        for name, data in (("a.jsonl", b"".join(lines[:120])), ("b.txt", book), ("c.jsonl", b"".join(lines[120:]))):
            path = folder / name
            if compress:
                path = folder / f"{name}.xz"
                data = lzma.compress(data)
            path.write_bytes(data)
    metas = [build(tmp_path / f"out_{f.name}", "--source", f, "--val-shards", 1, "--vocab-size", 300,
                   "--seq-len", 64) for f in (plain, packed)]
    for split in ("train", "val"):
        assert metas[0][f"{split}_sha256"] == metas[1][f"{split}_sha256"]
    assert metas[1]["settings"]["sources"][0][0] == "a.jsonl.xz" and metas[1]["train_docs"] == 121


def test_a_damaged_xz_source_is_one_line_naming_the_file(tmp_path):
    import lzma
    good = lzma.compress((SAMPLE / "docs.jsonl").read_bytes())
    bad = tmp_path / "docs.jsonl.xz"
    bad.write_bytes(good[: len(good) // 2])  # truncated mid-stream
    msg = error_of("--source", bad, "--val-fraction", 0.1, "--vocab-size", 300, "--out", tmp_path / "o")
    assert str(bad) in msg and "Traceback" not in msg
    assert not (tmp_path / "o").exists()


def test_bpe_tokenizer_round_trip_and_bos(built):
    tok = dataloader.load_tokenizer(built)
    meta = dataloader.read_meta(built)
    assert (tok.vocab_size, tok.bos_id) == (meta["vocab_size"], meta["bos_id"]) == (512, 511)
    assert meta["tokenizer_sha256"] == sha(built / "tokenizer.tiktoken")
    for text in sample_texts():
        ids = tok.encode(text)
        assert tok.bos_id not in ids and max(ids) < tok.vocab_size
        assert tok.decode(ids) == text
    assert tok.bos_id not in tok.encode("a literal <|bos|> in the data")
    assert tok.decode([tok.bos_id]) == "<|bos|>"
    # One BOS per document: only documents in the dropped last row (< 65 tokens) may lack one.
    train = np.fromfile(built / "train.bin", dtype=np.uint16)
    assert meta["train_docs"] - 3 <= (train == tok.bos_id).sum() <= meta["train_docs"]
    assert train.max() < tok.vocab_size


@pytest.fixture(scope="module")
def sp_model():
    """A 400-piece SentencePiece BPE shaped like Llama 2's (byte fallback, <unk> <s> </s> = 0 1 2)."""
    import sentencepiece as spm
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sample_texts()[:135]), model_writer=model, vocab_size=400,
        model_type="bpe", byte_fallback=True, normalization_rule_name="identity",
        remove_extra_whitespaces=False, max_sentence_length=20000, unk_id=0, bos_id=1,
        eos_id=2, pad_id=-1, num_threads=1, minloglevel=2)
    return model.getvalue()


def test_sentencepiece_tokenizer_on_local_text(sp_model, tmp_path):
    model_path = tmp_path / "sp.model"
    model_path.write_bytes(sp_model)
    out = tmp_path / "out"
    args = ["--source", SAMPLE / "docs.jsonl", "--val-fraction", 0.1, "--seq-len", 64,
            "--tokenizer", "llama2", "--tokenizer-model", model_path]
    meta = build(out, *args)
    assert meta["tokenizer_kind"] == "llama2" and meta["tokenizer_sha256"] == sha(model_path)
    assert (meta["vocab_size"], meta["bos_id"]) == (401, 1)  # 400 pieces + <|assistant_end|>
    tok = dataloader.load_tokenizer(out)
    for text in sample_texts()[:20]:
        ids = tok.encode(text)
        assert 1 not in ids and 400 not in ids and tok.decode(ids) == text
    train = np.fromfile(out / "train.bin", dtype=np.uint16)
    assert meta["train_docs"] - 3 <= (train == 1).sum() <= meta["train_docs"]
    assert train.max() < 400

    model_path.write_bytes(b"not a model")
    assert "not a SentencePiece model" in error_of(*args, "--out", tmp_path / "o2")


def test_sentencepiece_model_without_bos_is_one_line(tmp_path):
    """Rows start with BOS and hold uint16 ids: a model without a BOS piece is refused before packing."""
    import sentencepiece as spm
    model_path = tmp_path / "nobos.model"
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sample_texts()[:60]), model_prefix=str(model_path)[:-6],
                                   vocab_size=300, bos_id=-1, num_threads=1, minloglevel=2)
    args = ["--source", SAMPLE / "docs.jsonl", "--val-fraction", 0.1, "--seq-len", 64, "--tokenizer", "llama2",
            "--tokenizer-model", model_path, "--out", tmp_path / "out"]
    assert "no BOS piece" in error_of(*args)


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------

def test_bad_sources_name_the_file(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    out = ["--out", tmp_path / "out", "--vocab-size", 300, "--val-fraction", 0.1]
    assert f"{src}: not a .parquet/.jsonl/.txt/.jsonl.xz/.txt.xz file, nor a folder holding one" in error_of(
        "--source", src, *out)

    bad = src / "bad.parquet"
    bad.write_bytes((SAMPLE / "shard_00000.parquet").read_bytes()[:70000])  # truncated
    msg = error_of("--source", bad, *out)
    assert str(bad) in msg and "not a readable parquet file" in msg

    # Footer intact, data pages overwritten: the footer check passes, reading the pages fails.
    shard = bytearray((SAMPLE / "shard_00000.parquet").read_bytes())
    shard[2000:60000] = bytes(58000)
    bad.write_bytes(bytes(shard))
    msg = error_of("--source", bad, *out)
    assert msg.startswith(f"prepare_data.py: {bad}: cannot be read")

    bad = src / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": 3}\n')
    assert f"{bad}:2: no string 'text' field" in error_of("--source", bad, *out)
    bad.write_text('{"text": "fine"}\n{"text": \n')
    assert f"{bad}:2: not valid JSON" in error_of("--source", bad, *out)

    for missing_or_unsupported in (tmp_path / "nope.jsonl", SAMPLE / "README.md"):
        assert f"{missing_or_unsupported}: not a .parquet" in error_of("--source", missing_or_unsupported, *out)
    assert not (tmp_path / "out").exists()  # all caught before anything was written


def test_bad_flags_are_refused_before_any_work(tmp_path):
    for vocab in (256, 65537, 70000):  # 256 bytes + BOS at least; ids are uint16
        assert f"argument --vocab-size: {vocab} is not in [257, 65537)" in error_of(
            "--vocab-size", vocab, "--source", tmp_path / "nope", "--out", tmp_path / "o")
    assert "--tokenizer-model is not for --tokenizer bpe" in error_of(
        "--tokenizer-model", tmp_path, "--source", tmp_path, "--out", tmp_path / "o")
    assert "--vocab-size is not for --tokenizer llama2" in error_of(
        "--vocab-size", 512, "--tokenizer", "llama2", "--source", tmp_path, "--out", tmp_path / "o")
    assert "--vocab-size is not for --tokenizer llama2" in error_of("--vocab-size", 512, "--out", tmp_path / "o")
    # A missing model file is found before any shard is fetched or source file read.
    msg = error_of("--tokenizer", "llama2", "--tokenizer-model", tmp_path / "x.model", "--source", tmp_path,
                   "--out", tmp_path / "o")
    assert f"{tmp_path / 'x.model'}: not a SentencePiece model" in msg
    assert "exceeds the dataset's 1823 shards" in error_of("--shards", 1821, "--val-shards", 3,
                                                           "--out", tmp_path / "o")
    assert "not allowed with argument" in error_of("--val-fraction", 0.1, "--val-shards", 1)
    assert "--shards applies to downloads" in error_of("--shards", 3, "--source", tmp_path)
    assert "--val-fraction is for --source" in error_of("--val-fraction", 0.1)
    for flag, value in (("--seq-len", 0), ("--val-fraction", 1), ("--workers", "x")):
        assert f"argument {flag}" in error_of(flag, value, "--source", tmp_path)
    assert "invalid choice" in error_of("--packing", "pad", "--source", tmp_path)
    assert not (tmp_path / "o").exists()


def test_cli_reports_one_line_and_fails(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "prepare_data.py"), "--vocab-size", "70000",
                        "--source", str(tmp_path), "--out", str(tmp_path / "o")], capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().startswith("prepare_data.py: argument --vocab-size: 70000 is not in")
    assert len(r.stderr.strip().splitlines()) == 1


def copy_dataset(built, out):
    """A copy of the built dataset in `out`, and a function telling whether its files are still those bytes."""
    shutil.copytree(built, out)
    before = {p.name: sha(p) for p in out.iterdir()}
    return lambda: {p.name: sha(p) for p in out.iterdir()} == before


def test_existing_output_with_another_tokenizer_is_refused(built, tmp_path):
    out = tmp_path / "copy"
    untouched = copy_dataset(built, out)
    msg = error_of("--source", SAMPLE / "docs.jsonl", "--val-fraction", 0.1, "--vocab-size", 600,
                   "--seq-len", 64, "--out", out)
    assert f"{out} holds a dataset built with vocab_size 512, not 600" in msg
    msg = error_of("--source", SAMPLE / "shard_00000.parquet", "--val-fraction", 0.1,
                   "--vocab-size", 512, "--seq-len", 64, "--out", out, "--workers", 1)
    assert "built with sources" in msg and "shard_00000.parquet" in msg
    assert untouched()  # the dataset is untouched
    # A dataset from before meta.json recorded its settings (format v1) is not replaced either.
    meta = json.loads((out / "meta.json").read_text())
    del meta["settings"]
    (out / "meta.json").write_text(json.dumps(meta))
    msg = error_of("--source", SAMPLE / "docs.jsonl", "--val-fraction", 0.1, "--vocab-size", 512, "--seq-len", 64,
                   "--out", out)
    assert msg.endswith(f"{out} holds a dataset in an older format; use another --out or delete {out}")


def test_existing_dataset_is_not_replaced_when_only_seq_len_changes(built, tmp_path):
    # An earlier prepare_data.py silently replaced the dataset (and the runs that used it lost it).
    out = tmp_path / "copy"
    untouched = copy_dataset(built, out)
    msg = error_of("--source", SAMPLE / "docs.jsonl", "--val-fraction", 0.1, "--vocab-size", 512,
                   "--seq-len", 32, "--out", out)
    assert msg.endswith(f"built with seq_len 64, not 32; use another --out or delete {out}")
    assert untouched()
    # The same settings rebuild in place, to the same bytes.
    meta = build(out, "--source", SAMPLE / "docs.jsonl", "--val-fraction", 0.1, "--vocab-size", 512,
                 "--seq-len", 64)
    assert meta["train_sha256"] == dataloader.read_meta(built)["train_sha256"]


def test_shared_train_and_validation_documents_warn_with_counts(tmp_path, capsys):
    # The sample's docs.jsonl holds the documents of shard_00000 and shard_00001; with
    # the jsonl as the held-out file, all 150 validation documents are also trained on.
    meta = build(tmp_path, "--source", SAMPLE / "shard_00000.parquet", SAMPLE / "docs.jsonl",
                 "--val-shards", 1, "--vocab-size", 300, "--seq-len", 64)
    err = capsys.readouterr().err
    assert "WARNING: 130 of 150 validation documents are also training documents" in err
    assert meta["shared_docs"] == 130 and meta["split"] == {"val_files": ["docs.jsonl"]}


def test_non_string_text_column_is_a_one_line_error(tmp_path):
    # An integer 'text' column once ended in a traceback inside the tokenizer.
    import pyarrow as pa
    import pyarrow.parquet as pq
    bad = tmp_path / "ints.parquet"
    pq.write_table(pa.table({"text": list(range(10))}), bad)
    msg = error_of("--source", bad, "--val-fraction", 0.1, "--vocab-size", 300, "--out", tmp_path / "o")
    assert f"{bad}: the 'text' column holds int64, not strings" in msg


def test_failed_build_leaves_nothing_that_looks_complete(tmp_path):
    out = tmp_path / "out"
    msg = error_of("--source", SAMPLE / "docs.jsonl", "--val-fraction", 0.1, "--vocab-size", 300,
                   "--seq-len", 100000, "--out", out, "--workers", 1)
    assert "not one full row" in msg
    assert not out.exists()  # no temp file, no meta.json, not even the empty folder it created


def test_read_meta_says_how_to_build(tmp_path):
    with pytest.raises(ValueError, match="meta.json: not found; rebuild with prepare_data.py"):
        dataloader.read_meta(tmp_path)


def damaged_copy(built, tmp_path, damage):
    out = tmp_path / "damaged"
    shutil.copytree(built, out)
    damage(out)
    with pytest.raises(ValueError) as e:
        dataloader.read_meta(out)
    assert "\n" not in str(e.value) and "rebuild with prepare_data.py" in str(e.value)
    return str(e.value)


def test_read_meta_refuses_a_truncated_bin(built, tmp_path):
    def truncate(out):
        with open(out / "train.bin", "r+b") as f:
            f.truncate(f.seek(0, 2) - 130)
    assert "train.bin" in damaged_copy(built, tmp_path, truncate)


def test_read_meta_names_a_missing_key(built, tmp_path):
    def drop_key(out):
        meta = json.loads((out / "meta.json").read_text())
        del meta["row_len"]
        (out / "meta.json").write_text(json.dumps(meta))
    assert "missing key 'row_len'" in damaged_copy(built, tmp_path, drop_key)


def test_read_meta_detects_rewritten_tokens_by_checksum(built, tmp_path):
    def rewrite(out):  # 10% of the tokens replaced, the file size unchanged
        tokens = np.fromfile(out / "train.bin", dtype=np.uint16)
        at = np.random.default_rng(0).choice(len(tokens), len(tokens) // 10, replace=False)
        tokens[at] = (tokens[at] + 1) % 512
        tokens.tofile(out / "train.bin")
    assert "train.bin: sha256 differs" in damaged_copy(built, tmp_path, rewrite)
    # The loader itself only checks sizes (train.py verifies once at start): it still opens.
    assert dataloader.RowLoader(tmp_path / "damaged", "train", 2).n_rows > 0


def test_data_identity_names_tokenizer_shape_and_content(built):
    meta = dataloader.read_meta(built)
    ident = dataloader.data_identity(meta)
    assert ident == {"tokenizer_sha256": sha(built / meta["tokenizer_file"]), "vocab_size": 512,
                     "seq_len": 64, "train_sha256": sha(built / "train.bin"),
                     "val_sha256": sha(built / "val.bin"), "packing": meta["packing"]["method"]}


def test_atomic_write_replaces_whole_files_only(tmp_path):
    target = tmp_path / "f.json"
    common.atomic_write(target, b"old")
    with pytest.raises(RuntimeError):
        def half_then_crash(f):
            f.write(b"new but incomp")
            raise RuntimeError("disk full")
        common.atomic_write(target, half_then_crash)
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["f.json"]
    common.atomic_write(target, lambda f: f.write(b"new"))
    assert target.read_bytes() == b"new"


def test_a_full_disk_inside_torch_save_is_an_oserror_naming_no_space():
    """torch.save reports a full disk as 'RuntimeError: [enforce fail at inline_container.cc] unexpected pos';
    atomic_write's writer path turns it back into the ENOSPC OSError, which train.py reports in one line."""
    import errno
    import torch

    class FullDisk(io.RawIOBase):
        written = 0

        def writable(self):
            return True

        def write(self, b):
            self.written += len(b)
            if self.written > 1000:
                raise OSError(errno.ENOSPC, "No space left on device")
            return len(b)
    with pytest.raises(OSError) as e:
        common.write_through(lambda f: torch.save({"w": torch.zeros(10_000)}, f), io.BufferedWriter(FullDisk()))
    assert e.value.errno == errno.ENOSPC


def test_a_full_disk_while_packing_is_one_line_and_leaves_no_dataset(tmp_path, monkeypatch, capsys):
    """Old: a traceback from deep inside the packer, with temp files beside the output."""
    import builtins
    import errno
    real_open = builtins.open

    class FullDisk(io.RawIOBase):
        def writable(self):
            return True

        def write(self, b):
            raise OSError(errno.ENOSPC, "No space left on device", "train.bin")

    def open_full(path, mode="r", *args, **kwargs):
        if "w" in mode and ".train.bin." in str(path):
            return io.BufferedWriter(FullDisk(), buffer_size=64)
        return real_open(path, mode, *args, **kwargs)
    monkeypatch.setattr(pdata, "open", open_full, raising=False)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        pdata.main(["--source", str(SAMPLE / "docs.jsonl"), "--val-fraction", "0.1", "--vocab-size", "300",
                    "--seq-len", "64", "--out", str(out), "--workers", "1"])
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # after the progress lines
    assert e.value.code == 1 and "Traceback" not in err
    assert last.startswith("prepare_data.py: could not write") and "No space left on device" in last
    assert not out.exists()


def test_messages_say_what_is_wrong_and_help_shows_the_defaults_the_code_uses(tmp_path, capsys):
    """Old: an empty .txt as the only training file said "the training text only supports 257 tokens";
    --help said the validation default was 3 files where --source uses 2."""
    (tmp_path / "a.txt").write_text("")
    (tmp_path / "b.jsonl").write_text((SAMPLE / "docs.jsonl").read_text())
    msg = error_of("--source", tmp_path / "a.txt", tmp_path / "b.jsonl", "--val-shards", 1, "--vocab-size", 300,
                   "--out", tmp_path / "o")
    assert "the training documents are all empty" in msg
    with pytest.raises(SystemExit):
        pdata.main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"{pdata.VAL_SHARDS} for downloads, {pdata.LOCAL_VAL_FILES} for --source" in help_text
    assert pdata.parse_args(["--source", str(SAMPLE / "docs.jsonl")]).val_shards == pdata.LOCAL_VAL_FILES


# ---------------------------------------------------------------------------------------------
# RowLoader
# ---------------------------------------------------------------------------------------------

def test_row_loader_batches_are_shifted_rows(built):
    meta = dataloader.read_meta(built)
    rows = np.fromfile(built / "train.bin", dtype=np.uint16).reshape(-1, meta["row_len"])
    loader = dataloader.RowLoader(built, "train", 4)
    x, y = loader.next_batch()
    assert x.shape == y.shape == (4, meta["seq_len"]) and str(x.dtype) == "torch.int64"
    want = rows[loader.order(0)[:4]]
    assert (x.numpy() == want[:, :-1]).all() and (y.numpy() == want[:, 1:]).all()
    assert loader.row == 4


def test_row_loader_reads_each_row_once_per_pass_in_a_shuffled_order(built):
    # A batch of consecutive file rows would be one or two documents, and a file-ordered local
    # corpus would be trained on in phases (all web text, then all books): read a permutation.
    meta = dataloader.read_meta(built)
    rows = np.fromfile(built / "train.bin", dtype=np.uint16).reshape(-1, meta["row_len"])
    n = meta["train_rows"]
    loader = dataloader.RowLoader(built, "train", 7)
    seen = np.concatenate([loader.next_batch()[0].numpy() for _ in range(2 * n // 7 + 1)])
    first, second = seen[:n], seen[n:2 * n]
    as_set = lambda a: sorted(map(tuple, a.tolist()))
    assert as_set(first) == as_set(rows[:, :-1]) == as_set(second)  # every row once per pass
    assert not (first == rows[:, :-1]).all()                          # ...not in file order
    assert not (first == second).all()                                # ...a new order each pass
    # Every loader (any run, any rank) sees the same order; the order spreads a document's rows.
    assert (dataloader.RowLoader(built, "train", 1).order(0) == loader.order(0)).all()
    order = loader.order(0)
    assert np.abs(np.diff(order)).mean() > n / 10


def test_row_loader_ranks_partition_the_single_process_batch(built):
    world, per_rank = 3, 5
    n_rows = dataloader.read_meta(built)["val_rows"]
    single = dataloader.RowLoader(built, "val", world * per_rank)
    ranks = [dataloader.RowLoader(built, "val", per_rank, rank=k, world_size=world)
             for k in range(world)]
    steps = n_rows // (world * per_rank) + 2  # long enough to wrap into a second epoch
    for _ in range(steps):
        want = single.next_batch()[0].numpy()
        got = [r.next_batch()[0].numpy() for r in ranks]
        for k in range(world):  # rank k holds global rows row + k + world * i
            assert (got[k] == want[k::world]).all()
        union = np.concatenate(got)
        assert sorted(map(tuple, union.tolist())) == sorted(map(tuple, want.tolist()))
        # Disjoint: packed rows are distinct token sequences, so no row may repeat.
        assert len(set(map(tuple, union.tolist()))) == world * per_rank <= n_rows
    assert single.row == steps * world * per_rank and single.epoch >= 1
    assert all(r.row == single.row and r.epoch == single.epoch for r in ranks)


def test_row_loader_resumes_identically(built):
    a = dataloader.RowLoader(built, "train", 3, rank=1, world_size=2)
    for _ in range(4):
        a.next_batch()
    saved = a.row
    expected = [a.next_batch() for _ in range(3)]
    b = dataloader.RowLoader(built, "train", 3, rank=1, world_size=2, start_row=saved)
    for x, y in expected:
        bx, by = b.next_batch()
        assert (bx == x).all() and (by == y).all()


def test_row_loader_refuses_a_truncated_file(built, tmp_path):
    out = tmp_path / "short"
    shutil.copytree(built, out)
    with open(out / "val.bin", "r+b") as f:
        f.truncate(100)
    with pytest.raises(ValueError, match="val.bin"):
        dataloader.RowLoader(out, "val", 2)
