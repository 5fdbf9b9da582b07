"""
What every script shares, in one place (nanochat keeps such helpers in its common.py): the one-line error
convention, stopping on a signal, the argparse value types, and crash-safe files (atomic writes, appended rows,
JSON and JSON-lines readers that name the file they could not read, a check of a record's structure). Pure
Python: flops.py and fit_laws.py import it too.

The two contracts every script keeps: an error the user must fix is one line on stderr, `<script>: <message>`,
exit 2 for bad input and 1 for a failed write (argparse's errors too, its value types named for what they accept
so that its message says it); and a file is whole or absent (atomic_write, append_row), never half-written, so a
crash, a full disk or a second writer cannot leave a row or a checkpoint that looks valid and is not.

    from nanoloop.common import DataError, fail, one_line_errors, positive_int, atomic_write, append_row
"""
import argparse
import ctypes
import fcntl
import json
import math
import os
import signal
import sys
from pathlib import Path


class DataError(ValueError):
    """Bad input the user must fix (a flag, a file): the scripts print it as one line and exit 2."""


# ----------------------------------------------------------------------------------------------
# One line per error: "<script>: <what is wrong and what to do>" on stderr

def fail(prog, message, code=2):
    """Stop: `prog: message` as one line on stderr, exit `code` (2 bad input, 1 a failed write)."""
    print(f"{prog}: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def one_line_errors(parser, prog):
    """argparse's errors (a bad flag or value) as fail(prog, ...): one line and exit 2, not the usage block."""
    parser.error = lambda message: fail(prog, message)
    return parser


def on_stop_signals(prog, first):
    """Route SIGINT (Ctrl-C) and SIGTERM (timeout, kill, a scheduler) to first(signal name), once: the script stops
    where it can stop cleanly. A second SIGINT exits at once, 130, raised as SystemExit where the program is: a
    file atomic_write is writing stays as it was (the temp file is removed, the old file is whole). A repeated
    SIGTERM is ignored: a launcher (torchrun, srun) passes on a SIGTERM its processes may have had already."""
    received = []

    def handler(signum, frame):
        if received and signum == signal.SIGINT:
            # os.write, not print: a handler may run in the middle of a print, which print cannot re-enter
            os.write(2, f"{prog}: interrupted again: exiting now; the files written so far are whole\n".encode())
            raise SystemExit(130)
        if not received:
            received.append(signum)
            first(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)


def exit_on_stop_signals(prog, kept):
    """SIGINT and SIGTERM exit at once, 143, with one line saying what is kept: for a script that writes each
    result whole as it goes (append_row), so that stopping anywhere loses only the result in flight."""
    def stop(name):
        os.write(2, f"{prog}: interrupted ({name}): {kept}\n".encode())
        raise SystemExit(143)

    on_stop_signals(prog, stop)


# ----------------------------------------------------------------------------------------------
# argparse value types; argparse names the function in its message, so each name says what it wants

def positive_int(text):
    """An integer >= 1."""
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def count(text):
    """An integer >= 0 (0 means "the default" for --r-bwd and --recur)."""
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def finite_float(text):
    """A finite number (nan and inf are refused)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def positive_float(text):
    """A finite number > 0; takes 1e18-style budgets."""
    value = finite_float(text)
    if value <= 0:
        raise ValueError(text)
    return value


def positive_int_list(text):
    """Comma-separated integers >= 1, e.g. loop counts "2,8"."""
    return [positive_int(x) for x in text.split(",") if x.strip()]


def in_range(lo, hi=math.inf, kind=int):
    """A type for a number in [lo, hi), e.g. in_range(257, 65537) for a vocabulary size."""
    def parse(text):
        value = kind(text)
        if not lo <= value < hi:
            raise argparse.ArgumentTypeError(f"{text} is not in [{lo}, {hi})")
        return value
    parse.__name__ = f"number in [{lo}, {hi})"
    return parse


positive_int.__name__ = "integer >= 1"
count.__name__ = "integer >= 0"
finite_float.__name__ = "finite number"
positive_float.__name__ = "positive number"
positive_int_list.__name__ = "comma-separated list of integers >= 1"


# ----------------------------------------------------------------------------------------------
# Files: whole or absent, never half-written; readers that name the file

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
    except OSError as err:
        if err.filename is None:  # a failed write or fsync names no file: the one being written is the news
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise
    finally:
        tmp.unlink(missing_ok=True)
    fd = os.open(path.parent, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def append_row(path, row, key=()):
    """Append a JSON row by rewriting the file with atomic_write under a lock on its folder: a reader, a crash
    or a full disk sees the old file or the new one, never half a row; concurrent writers never lose a row.
    key: field names; if a row with row's values of them is already there (another writer was first), the
    file is left as it is. Returns whether the row was appended."""
    path = Path(path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if key and any(row_key(old, key) == row_key(row, key) for old in read_rows(path)[0]):
            return False
        old = path.read_bytes() if path.exists() else b""
        if old and not old.endswith(b"\n"):
            old += b"\n"  # a torn last line stays a line of its own (read_rows reports it)
        atomic_write(path, old + (json.dumps(row) + "\n").encode())
    finally:
        os.close(fd)
    return True


def row_key(row, key):
    """The values of the fields `key` in a row, the tuple two rows of one key share."""
    return tuple(row.get(name) for name in key)


def load_json(path, what="file"):
    """A JSON file's content; a missing, unreadable or non-JSON file is one DataError naming it."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"{path}: no such {what}") from None
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8
        raise DataError(f"{path}: not a readable JSON {what} ({e})") from None


def check_fields(where, record, fields):
    """A file's record (JSON, a checkpoint's dict) has the structure its reader needs: a dict holding every
    key of `fields` ({key: type or tuple of types}) with a value of that type, where a bool is not an int.
    The first key that is missing or of another type is one DataError naming `where` and the key."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: a {type(record).__name__}, not a record with {', '.join(fields)}")
    for key, kind in fields.items():
        if key not in record:
            raise DataError(f"{where}: no {key!r}")
        value = record[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise DataError(f"{where}: {key} is {repr(value)[:40]}, not of type {names}")


def json_lines(lines, path):
    """(line number, object) of every non-empty line of a JSON-lines source (text or bytes lines); a line
    that is not JSON is a DataError naming path:line. For inputs that must be whole (sources, task items)."""
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except ValueError as e:
            raise DataError(f"{path}:{lineno}: not valid JSON ({e})") from None


def read_rows(path):
    """The rows of a JSON-lines file (train.py's results, evaluate.py's rows) and one note per line that is
    not a JSON object (a torn last line, garbage), as (rows, notes). A missing file has no rows; an
    unreadable one is a DataError naming it."""
    if not path or not Path(path).exists():
        return [], []
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: unreadable ({e})") from None
    rows, notes = [], []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            notes.append(f"line {lineno} is not JSON ({e.msg})")
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            notes.append(f"line {lineno} is not a JSON object")
    return rows, notes


def check_writable(path, folder=False):
    """Refuse an output path before any compute: create its folder (or `path` itself, a folder) and
    write a scratch file there. DataError naming the path."""
    path = Path(path)
    where = path if folder else path.parent
    try:
        if not folder and path.is_dir():
            raise IsADirectoryError(21, "is a folder")
        where.mkdir(parents=True, exist_ok=True)
        scratch = where / f".writable.{os.getpid()}.tmp"
        scratch.write_bytes(b"")
        scratch.unlink()
    except OSError as e:
        raise DataError(f"cannot write {path}: {e.strerror or e}") from None


# ----------------------------------------------------------------------------------------------
# The process: glibc's malloc, tuned for a CPU training loop

def keep_freed_memory():
    """Make glibc's malloc keep freed memory for reuse instead of handing it back to the kernel. By default
    a block over 128 KiB (up to 32 MiB as it adapts) is a fresh mmap that the kernel zero-fills page by page
    on first touch and unmaps on free, and a training step allocates and frees its activations every step:
    on this project's 2-core VM a cpu-micro step spent a quarter of its time in those page faults (d = 8,
    r = 2: ~24k faults and 60 ms a step; dev/bench_train.py measures the whole CPU step). Peak memory is
    unchanged: what one step freed, the next one reuses. Returns False where libc has no mallopt."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (macOS, musl): keep the platform's allocator as it is
        return False
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3  # glibc's malloc.h parameter numbers
    libc.mallopt(m_mmap_threshold, 1 << 30)  # heap, not mmap, for blocks under 1 GiB
    libc.mallopt(m_trim_threshold, 1 << 36)  # never shrink the heap
    libc.mallopt(m_top_pad, 1 << 28)  # grow it in 256 MiB steps (address space only until touched)
    return True
