#!/usr/bin/env bash
# One 7B run of jobs_x4l.txt on the GPUs CUDA_VISIBLE_DEVICES names: the Qwen2.5-7B shape (random weights, built
# once into /tmp/qwen2-7b), $B7's batch with more overrides, `rlpost plan`'s prediction first (plan_NAME.txt), the
# overrides in NAME.overrides.
#   W=... B7=... COMMON=... bash benchmarks/real_model/run_7b.sh NAME [more overrides]
set -uo pipefail
name=${1:?NAME [overrides]}; shift
ls /tmp/qwen2-7b/*.safetensors > /dev/null 2>&1 || python3 benchmarks/random_model.py --shape 7b --out /tmp/qwen2-7b \
  > "$W/build_7b.log" 2>&1
GB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | awk '{printf "%.1f", $1 / 1024}')
echo $B7 "$@" > "$W/$name.overrides"  # the run's overrides, for collect.py
python3 -m rlpost.cli plan $B7 "$@" $COMMON --gpu-gb "$GB" > "$W/plan_$name.txt" 2>&1
exec python3 -m rlpost.cli train $B7 "$@" $COMMON run.dir="$W/$name"
