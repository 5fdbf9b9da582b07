#!/usr/bin/env bash
# One prepared GPU check (issue 13): tokens/s, MFU, compile time, peak memory and bf16-vs-fp32 loss
# of real training steps for s = 10 and 24 at r = 1, r = 4 and r = 4 with r_bwd = 2, eager and
# compiled. What it measures and how to read it: dev/gpu_check.py's docstring.
#
#   bash dev/gpu_check.sh            # one H200, no network, < 8 min; gpu_check.json/.txt in $OUT or dev/results/gpu_check
#   bash dev/gpu_check.sh --tiny     # the same 12 configurations at toy size on CPU (~30 s)
#
# Extra flags go to dev/gpu_check.py (--max-seconds, --only NAME,..., --steps). The Python side skips
# configurations that would end after --max-seconds (default 400) and writes its JSON after every
# configuration; `timeout` is the backstop for a compile that hangs, 60 s past that budget.
set -euo pipefail
cd "$(dirname "$0")/.."
exec timeout -k 10 "${GPU_CHECK_KILL_AFTER:-460}" python3 dev/gpu_check.py --out "${OUT:-dev/results/gpu_check}" "$@"
