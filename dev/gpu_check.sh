#!/usr/bin/env bash
# One prepared GPU check: tokens/s, MFU, compile time, peak memory and bf16-vs-fp32 loss
# of real training steps for s = 10 and 24 at r = 1, r = 4 and r = 4 with r_bwd = 2, eager and
# compiled. Needs torch alone (no network, no dataset). How to read it: dev/gpu_check.py's docstring.
#
#   bash dev/gpu_check.sh            # one H200, < 8 min; gpu_check.json/.txt in $OUT or dev/results/gpu_check
#   bash dev/gpu_check.sh --tiny     # the same 12 configurations at toy size on CPU (~30 s)
#
# Extra flags go to dev/gpu_check.py (--only NAME,..., --steps, --max-seconds). It skips
# configurations that would end after --max-seconds (default 400 s) and rewrites its JSON and table
# after every configuration; `timeout` kills a compile that hangs at 460 s, so the whole check ends
# inside 8 minutes (for longer runs call dev/gpu_check.py directly).
set -euo pipefail
cd "$(dirname "$0")/.."
exec timeout -k 10 460 python3 dev/gpu_check.py --out "${OUT:-dev/results/gpu_check}" "$@"
