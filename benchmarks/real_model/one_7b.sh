#!/usr/bin/env bash
# Issue 42 item 2 on the GPU CUDA_VISIBLE_DEVICES names: the Qwen2.5-7B shape (random weights, built once into
# /tmp/qwen2-7b) with full parameters ($O7 of gpu.sh: FSDP2 parameter offload, Adam streamed layer by layer from
# the host, vLLM sleeping while the trainer runs; 32 x 8 x 1024 tokens a step); `rlpost plan`'s prediction and the
# pinned host<->GPU bandwidth beside it; the host<->GPU copies of the profiled step read from its trace (memcpy.py).
#   W=... O7=... COMMON=... bash benchmarks/real_model/one_7b.sh [more overrides]
#   W=... O7=... COMMON=... bash benchmarks/real_model/one_7b.sh --setup   # the build, plan and bandwidth only
set -uo pipefail
SETUP=0; [ "${1:-}" = --setup ] && { SETUP=1; shift; }
ls /tmp/qwen2-7b/*.safetensors > /dev/null 2>&1 || python3 benchmarks/random_model.py --shape 7b --out /tmp/qwen2-7b \
  > "$W/build_7b.log" 2>&1
GB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | awk '{printf "%.1f", $1 / 1024}')
python3 -m rlpost.cli plan $O7 "$@" $COMMON --gpu-gb "$GB" > "$W/plan_7b_one.txt" 2>&1
python3 benchmarks/real_model/memcpy.py --bandwidth > "$W/pcie.json" 2> "$W/pcie.log"
[ $SETUP = 1 ] && exit 0
python3 -m rlpost.cli train $O7 "$@" $COMMON run.dir="$W/one_7b"
rc=$?
for t in "$W"/one_7b/profile/*.json.gz; do
  [ -f "$t" ] && timeout 120 python3 benchmarks/real_model/memcpy.py "$t" > "${t%.json.gz}.memcpy.json"
done
exit $rc
