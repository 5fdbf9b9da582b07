"""
Downloading a file the way every download of this project must happen: resumable, retried with backoff,
checked before it is kept, renamed into place atomically, one line naming the URL for every failure. Used for
FineWeb-Edu's shards and the Llama 2 tokenizer (prepare_data.py) and DCLM's CORE bundle (eval_tasks.py).

    path = download_file(url, "data/fineweb/shard_00000.parquet", check=check_parquet)
"""
import sys
import time
from pathlib import Path

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from nanoloop.common import DataError

RETRIES = 5         # per download, after urllib3's own retries of a failed request
RETRY_BASE_S = 1.0  # backoff before retry k: RETRY_BASE_S * 2**(k-1); tests shrink it


def download_file(url, dest, check, retries=RETRIES):
    """Fetch url into dest.tmp, check it (check(path) raises DataError for a file that is not what it should be),
    rename it to dest; a dropped transfer resumes with an HTTP Range request. An existing dest is kept as it is."""
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
            response = session.get(url, stream=True, timeout=60, headers={"Range": f"bytes={have}-"} if have else {})
        except requests.RequestException as e:
            raise DataError(f"{url}: {type(e).__name__} after {retries} retries ({e})") from None
        problem = f"HTTP {response.status_code} on resume from byte {have}"
        if response.status_code == 416:  # the .tmp is not a strict prefix of the remote file: start clean
            tmp.unlink()
        elif response.status_code >= 400:
            raise DataError(f"{url}: HTTP {response.status_code} {response.reason}")
        else:
            try:  # 206 continues our file, 200 sends all of it again; a drop loses one chunk at most
                with response, open(tmp, "ab" if response.status_code == 206 else "wb") as f:
                    for chunk in response.iter_content(chunk_size=1 << 16):
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
