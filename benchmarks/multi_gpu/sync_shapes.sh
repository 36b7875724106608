#!/usr/bin/env bash
# rlpost's verified sync against a raw NCCL broadcast of the same bytes, GPU 0 -> GPU 1 of the two GPUs it
# is given, per shape (gpu.sh scale_sync runs all four; a queue job runs some):
#   bash benchmarks/multi_gpu/sync_shapes.sh OUT_DIR 3b 7b
set -uo pipefail
DIR=${1:?folder for the results}; shift
for shape in "$@"; do
  python3 benchmarks/random_model.py --shape "$shape" --out "/tmp/cfg-$shape" --config-only > /dev/null
  python3 benchmarks/bench_weight_sync.py --model "/tmp/cfg-$shape" --bucket-mb 256 --reps 5 \
    --out "$DIR/weight_sync_$shape.json" > "$DIR/weight_sync_$shape.log" 2>&1
done
