#!/usr/bin/env bash
# sweep.sh — plan, run, resume and fit an iso-depth grid (paper §4.1, Table 7; RECIPE §6-7).
#
#   ./sweep.sh --grid paper --plan                     # every run, its FLOPs, tokens, and the total
#   ./sweep.sh --grid paper                            # run it on this node's GPUs, then fit
#   ./sweep.sh --grid paper --print > jobs.txt         # one command per line, for a scheduler
#   ./sweep.sh --grid cpu-micro                        # the CPU-scale reproduction (~1 h, 2 cores)
#   ./sweep.sh --grid smoke -- --eval-rows 32          # anything after -- goes to every train.py
#
# A run whose row is already in the results file is skipped; a finished run folder from another grid
# (the r = 1 baselines that trunc/hyper/depth share with paper) is reused by copying its row; an
# interrupted run resumes from its checkpoint. A failing run is logged and the others go on.
#
# Environment: GPUS (default: all visible, 0 on CPU), GPUS_PER_RUN (default: GPUS, at least 1),
# CPU_JOBS (runs at once without GPUs, default 1; each gets cores/CPU_JOBS threads),
# OUT (default runs/<grid>), DATA (default per grid), PYTHON (default python3).
set -uo pipefail
cd "$(dirname "$0")"

# ---------------------------------------------------------------------------------------------
# The grids, as data. A cell is "budget:widths". Widths s give d = 64 s.
PAPER_CELLS=(            # Table 7: 29 (budget, width) cells, the same widths for every r
  "4.64e17:6 8 10 12"
  "1e18:6 8 10 12 14"
  "2.15e18:8 10 12 14 16"
  "4.64e18:10 12 14 16 18 20"
  "1e19:12 16 18 20 24"
  "2.15e19:18 24 28 34"
)
CASE_STUDY_CELLS=("${PAPER_CELLS[@]:0:4}")   # trunc, hyper, depth18/24: the four lowest budgets
# CPU scale: vocab 2048, rows of 128 tokens, 2,048-token steps, head dim 8 so d = 8..64 works
# (s = 0.125 is d = 8). Every r's best width has a narrower and a wider one beside it at every
# budget (d = 16, 16, 24; a test checks the committed results); at 1e12 the looped models were best
# at d = 8, the narrowest possible, so the lowest budget is 1.5e12. About 75 min on 2 cores with
# CPU_JOBS=2 (tiny models are dispatch-bound, ~0.15 s a step).
CPU_MICRO_CELLS=(
  "1.5e12:0.125 0.25 0.375 0.5"
  "2e12:0.125 0.25 0.375 0.5"
  "5e12:0.25 0.375 0.5 0.75"
)
SMOKE_CELLS=("3e9:0.25 0.5" "1e10:0.25 0.5")
PAPER_R="1 2 4 8"

# Train flags per grid (model shape, data, LR re-anchoring for the CPU scale).
# The LR rule is re-anchored at the micro reference (d = 32, B = 2048, D = 5e5; RECIPE §6) with the
# MuonH base LR 0.056 from dev/calibrate_micro_lr.sh (best for r = 1, 2nd-best of six for r = 4, see
# dev/results/lr_calibration.txt); the exponents and AdamW bases stay the paper's.
CPU_MICRO_FLAGS="--head-dim 8 --batch-tokens 2048 --ref-width 32 --ref-batch 2048 --ref-tokens 5e5 --lr-matrix 0.056 --eval-rows 1024 --log-every 50"
SMOKE_FLAGS="--head-dim 8 --depth 6 --prelude 1 --coda 1 --batch-tokens 512 --ref-width 32 --ref-batch 512 --ref-tokens 2e4 --eval-rows 64 --log-every 10"

# ---------------------------------------------------------------------------------------------
GRID="${GRID:-paper}"
MODE=run
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --grid) GRID="$2"; shift 2 ;;
    --plan) MODE=plan; shift ;;
    --print) MODE=print; shift ;;
    --flops-per-s) FLOPS_PER_S="$2"; shift 2 ;;
    --no-fit) NO_FIT=1; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "sweep.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
PYTHON="${PYTHON:-python3}"
OUT="${OUT:-runs/$GRID}"
RESULTS="$OUT/results.jsonl"

# One line per run: name | train.py flags (without data/out/results).
plan_lines() {
  local cells=() rs="$PAPER_R" flags="" variant=""
  GRID_TAG=""
  case "$GRID" in
    paper)     cells=("${PAPER_CELLS[@]}") ;;
    trunc)     cells=("${CASE_STUDY_CELLS[@]}"); variant=trunc ;;
    hyper)     cells=("${CASE_STUDY_CELLS[@]}"); variant=hyper ;;
    depth18)   cells=("${CASE_STUDY_CELLS[@]}"); flags="--depth 18 --prelude 1 --coda 1"; GRID_TAG=_L18 ;;
    depth24)   cells=("${CASE_STUDY_CELLS[@]}"); flags="--depth 24 --prelude 4 --coda 4"; GRID_TAG=_L24 ;;
    cpu-micro) cells=("${CPU_MICRO_CELLS[@]}"); flags="$CPU_MICRO_FLAGS"; GRID_TAG=_micro ;;
    smoke)     cells=("${SMOKE_CELLS[@]}"); flags="$SMOKE_FLAGS"; rs="1 2 4"; GRID_TAG=_smoke ;;
    *) echo "sweep.sh: unknown grid '$GRID' (paper|trunc|hyper|depth18|depth24|cpu-micro|smoke)" >&2; exit 2 ;;
  esac
  local cell budget s r arch tag
  for cell in "${cells[@]}"; do
    budget="${cell%%:*}"
    for s in ${cell#*:}; do
      for r in $rs; do
        # The name holds everything that makes a run distinct, so identical runs (the r = 1
        # baselines of trunc/hyper) are shared across grids.
        arch="--r $r"; tag="$GRID_TAG"
        if [ "$r" -gt 1 ] && [ "$variant" = trunc ]; then
          arch="--r $r --r-bwd $(( (r + 1) / 2 ))"; tag="_rb$(( (r + 1) / 2 ))$tag"
        fi
        if [ "$r" -gt 1 ] && [ "$variant" = hyper ]; then
          arch="--r $r --injection hyper --hc-lanes 2"; tag="_hyper$tag"
        fi
        echo "r${r}_s${s}_C${budget}${tag}|$arch --scale $s --flops $budget $flags"
      done
    done
  done
}

default_data() {
  case "$GRID" in
    cpu-micro) echo "data/micro-2k" ;;
    smoke) echo "data/smoke" ;;
    *) echo "data/fineweb" ;;
  esac
}
DATA="${DATA:-$(default_data)}"

mapfile -t LINES < <(plan_lines) || exit 2
[ "${#LINES[@]}" -gt 0 ] || exit 2

if [ "$MODE" = plan ]; then
  # flops.py is the single source of truth: one Python process prices the whole grid.
  read -r -d '' PLAN_PY <<'EOF'
import argparse, json, os, sys
import flops
flops_per_s, results, data = sys.argv[1], sys.argv[2], sys.argv[3]
meta = {}
if os.path.exists(os.path.join(data, "meta.json")):
    meta = json.load(open(os.path.join(data, "meta.json")))
rows, total = [], 0.0
parser = argparse.ArgumentParser()
flops.add_model_args(parser)
for extra in ("--flops", "--batch-tokens"):
    parser.add_argument(extra, type=float)
for line in sys.stdin:
    name, argstr = line.rstrip("\n").split("|", 1)
    args, _ = parser.parse_known_args(argstr.split())
    if meta:
        args.vocab, args.seq_len = meta["vocab_size"], meta["seq_len"]
    cfg = flops.config_from_args(args)
    out = flops.summary(cfg, args.flops, int(args.batch_tokens or 2 ** 18))
    total += out["flops_actual"]
    rows.append((name, cfg, out))
print(f"{'run':<34}{'r':>3}{'r_bwd':>6}{'s':>6}{'budget C':>11}{'N':>14}{'tokens D':>16}{'steps':>8}{'F*D':>12}")
for name, cfg, out in rows:
    print(f"{name:<34}{cfg.r:>3}{cfg.r_bwd:>6}{cfg.scale:>6g}{out['flops_budget']:>11.3g}{out['n_params']:>14,}"
          f"{out['tokens']:>16,}{out['steps']:>8,}{out['flops_actual']:>12.3e}")
print(f"{len(rows)} runs, total compute {total:.3e} FLOPs"
      + ("" if meta else f" (vocab/seq-len from flags: {data}/meta.json not found)"))
rate, source = None, ""
if flops_per_s:
    rate, source = float(flops_per_s), "given --flops-per-s"
elif os.path.exists(results):
    done = [json.loads(l) for l in open(results) if l.strip()]
    done = [r for r in done if r.get("tokens_per_s")]
    if done:
        rate = sum(r["tokens_per_s"] * r["flops_per_token"] for r in done) / len(done)
        source = f"mean achieved rate of the {len(done)} runs in {results}"
if rate:
    hours = total / rate / 3600
    print(f"estimated wall time {hours:,.1f} h at {rate:.3e} FLOP/s per run slot ({source})")
else:
    print("estimated wall time: give --flops-per-s (e.g. 8 x 989e12 x MFU for one 8-GPU node) "
          "or run a few configurations first")
EOF
  printf '%s\n' "${LINES[@]}" | "$PYTHON" -c "$PLAN_PY" "${FLOPS_PER_S:-}" "$RESULTS" "$DATA"
  exit $?
fi

# ---------------------------------------------------------------------------------------------
# Running. GPU slots: GPUS / GPUS_PER_RUN concurrent runs, each on its own devices and port.
if [ -z "${GPUS:-}" ]; then
  GPUS=$(command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | wc -l || echo 0)
fi
GPUS_PER_RUN="${GPUS_PER_RUN:-$(( GPUS > 0 ? GPUS : 1 ))}"
if [ "$GPUS" -gt 0 ]; then
  SLOTS=$(( GPUS / GPUS_PER_RUN ))
  [ "$SLOTS" -ge 1 ] || { echo "sweep.sh: GPUS_PER_RUN=$GPUS_PER_RUN > GPUS=$GPUS" >&2; exit 2; }
else
  SLOTS="${CPU_JOBS:-1}"
  # Tiny models are dispatch-bound: one thread per run and several runs beat oversubscribed threads.
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( $(nproc) / SLOTS > 0 ? $(nproc) / SLOTS : 1 ))}"
fi

train_command() {  # name, flags, slot
  local name="$1" flags="$2" slot="$3"
  local common="train.py --data $DATA --out $OUT/runs/$name --results $RESULTS --resume $flags ${EXTRA[*]}"
  if [ "$GPUS" -gt 0 ]; then
    local first=$(( slot * GPUS_PER_RUN )) devices
    devices=$(seq -s, "$first" $(( first + GPUS_PER_RUN - 1 )))
    # "--" keeps torchrun's argparse from reading train.py's --r as its own (ambiguous) flag.
    echo "CUDA_VISIBLE_DEVICES=$devices torchrun --standalone --nproc_per_node=$GPUS_PER_RUN -- $common"
  else
    echo "$PYTHON $common"
  fi
}

if [ "$MODE" = print ]; then
  for line in "${LINES[@]}"; do train_command "${line%%|*}" "${line#*|}" 0 | sed 's/^CUDA_VISIBLE_DEVICES=[^ ]* //'; done
  exit 0
fi

[ -f "$DATA/meta.json" ] || { echo "sweep.sh: $DATA/meta.json not found; build it with prepare_data.py (see README)" >&2; exit 2; }
mkdir -p "$OUT/runs" "$OUT/logs"
touch "$RESULTS"
SLOT_PID=()
SLOT_NAME=()
FAILED=()
RAN=0
SKIPPED=0

reap() {  # collect finished runs; one failure is recorded and the sweep goes on
  local i pid rc
  for i in "${!SLOT_PID[@]}"; do
    pid="${SLOT_PID[$i]}"
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid"; rc=$?
      if [ "$rc" -ne 0 ]; then
        FAILED+=("${SLOT_NAME[$i]} (exit $rc, log $OUT/logs/${SLOT_NAME[$i]}.log)")
        echo "[$(date +%H:%M:%S)] FAILED ${SLOT_NAME[$i]} (exit $rc)"
      fi
      SLOT_PID[$i]=""
    fi
  done
}

wait_for_slot() {  # sets SLOT to a free slot index (no subshell: SLOT_PID must stay ours)
  local i
  while true; do
    reap
    for (( i = 0; i < SLOTS; i++ )); do
      if [ -z "${SLOT_PID[$i]:-}" ]; then SLOT=$i; return; fi
    done
    sleep 1
  done
}

trap 'echo "sweep.sh: interrupted; running jobs checkpoint on SIGTERM, rerun to resume" >&2; kill -TERM $(jobs -p) 2>/dev/null; wait; exit 130' INT TERM

for line in "${LINES[@]}"; do
  name="${line%%|*}"; flags="${line#*|}"
  if grep -q "\"out\": \"$OUT/runs/$name\"" "$RESULTS"; then SKIPPED=$((SKIPPED + 1)); continue; fi
  # Reuse a finished identical run from another grid (the r = 1 baselines of trunc/hyper).
  shared=$(ls "$(dirname "$OUT")"/*/runs/"$name"/final.json 2>/dev/null | grep -v "^$OUT/" | head -n 1)
  if [ -n "$shared" ] && [ "${#EXTRA[@]}" -eq 0 ]; then
    "$PYTHON" -c "import json,sys; r=json.load(open(sys.argv[1])); r['out']=sys.argv[2]; print(json.dumps(r))" \
      "$shared" "$OUT/runs/$name" >> "$RESULTS"
    echo "reused $shared"; SKIPPED=$((SKIPPED + 1)); continue
  fi
  wait_for_slot
  cmd=$(train_command "$name" "$flags" "$SLOT")
  if [ "$GPUS" -gt 0 ]; then  # concurrent runs on one node need their own rendezvous ports
    cmd="${cmd/torchrun --standalone/torchrun --rdzv-backend=c10d --rdzv-endpoint=localhost:$((29500 + SLOT))}"
  fi
  echo "[$(date +%H:%M:%S)] slot $SLOT: $name"
  bash -c "$cmd" > "$OUT/logs/$name.log" 2>&1 &
  SLOT_PID[$SLOT]=$!; SLOT_NAME[$SLOT]="$name"
  RAN=$((RAN + 1))
done
while [ -n "$(printf '%s' "${SLOT_PID[@]:-}")" ]; do reap; sleep 1; done

echo "sweep $GRID: ${#LINES[@]} configurations, $RAN run now, $SKIPPED already done, ${#FAILED[@]} failed"
for f in "${FAILED[@]}"; do echo "  failed: $f"; done

if [ -z "${NO_FIT:-}" ]; then
  mkdir -p "$OUT/fit"
  if "$PYTHON" fit_laws.py "$RESULTS" --json "$OUT/fit/fit.json" --plots "$OUT/fit" > "$OUT/fit/report.txt" 2> "$OUT/fit/fit.err"; then
    cat "$OUT/fit/report.txt"
  else
    echo "sweep.sh: fit_laws.py failed (see $OUT/fit/fit.err):" >&2; tail -n 3 "$OUT/fit/fit.err" >&2
    [ "${#FAILED[@]}" -eq 0 ] && exit 1
  fi
fi
[ "${#FAILED[@]}" -eq 0 ]
