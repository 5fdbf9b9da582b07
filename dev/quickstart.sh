#!/usr/bin/env bash
# The README's first command: a small looped model end to end on the FineWeb-Edu sample that ships with the
# repository, in under 2 minutes on 2 CPU cores (92-101 s in a fresh clone, idle or with one core busy; after
# `pip install -r requirements.txt`). Rerun it in any state:
#
#   bash dev/quickstart.sh              # trains; stopped (Ctrl-C, within seconds), it resumes where it stopped;
#                                       # finished, it prints the run's result and samples and trains nothing
#   bash dev/quickstart.sh --sample 5   # anything after it goes to train.py, where a later flag wins
#
#   1. data/sample      a 1,024-token BPE trained on the sample, best-fit packed into 128-token rows; the
#                       second parquet shard is the held-out validation split (DATA=DIR puts it elsewhere)
#   2. runs/quickstart  an r = 4 looped transformer at d = 64 (prelude 2 + 4 x 4 shared layers + coda 2), 195
#                       MuonH steps of 2,048 tokens, the LR rule re-anchored at this tiny scale (as App. E
#                       anchors the paper at s = 10); the tiny sample is read 2.8 times, which train.py warns about
#   3. its validation loss (128 held-out rows) and three continuations of "The capital of France is"
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
DATA="${DATA:-data/sample}"

if [ ! -f "$DATA/meta.json" ]; then
  "$PYTHON" prepare_data.py --out "$DATA" --vocab-size 1024 --seq-len 128 --val-shards 1 \
    --source data/fineweb-edu-sample/shard_00000.parquet data/fineweb-edu-sample/shard_00001.parquet
fi

# --resume: continue runs/quickstart/ckpt.pt if an earlier run left one (train.py starts afresh without it).
"$PYTHON" train.py --data "$DATA" --out runs/quickstart \
  --r 4 --scale 1 --head-dim 16 \
  --tokens 4e5 --batch-tokens 2048 \
  --ref-width 32 --ref-batch 2048 --ref-tokens 5e5 --lr-matrix 0.056 \
  --eval-rows 128 --log-every 20 --sample 3 --resume "$@"
