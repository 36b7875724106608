#!/usr/bin/env bash
# The real model's GPU runs (docs/usage.md, "A real model on a GPU"), one run per GPU of a 4-GPU machine,
# in stages that each fit one 10-minute device call (vLLM, Ray and the SmolLM2 wheel installed
# into /tmp/site by ../shared/tools/gpu-install.sh; COMMIT=<sha> names the tree in the results):
#   bash benchmarks/real_model/gpu.sh steps      # as run on 2026-11-26 (benchmarks/real_model/headroom_h100.json):
#                                                # smollm2_steps seeds 0-2 on GPU 0-2, _lora seed 0 on GPU 3
#                                                # beside a headroom survey of candidate tasks
#   bash benchmarks/real_model/gpu.sh sums       # as run on 2026-11-26 (sums_h100.json): smollm2_sums and
#                                                # smollm2_sums_lora seed 0-2, two runs a GPU; steps seed 0 on GPU 3
#   bash benchmarks/real_model/gpu.sh survey     # not yet run: headroom of the steps task under
#                                                # running_total and last_number, 8 settings, 2 a GPU
#   STEPS="..." bash benchmarks/real_model/gpu.sh rest       # not yet run: sums seeds 0, 1 alone; steps seeds 0-2
#   STEPS="..." bash benchmarks/real_model/gpu.sh rest_lora  # not yet run: steps_lora seeds 0-2; LoRA adapter mode
#   STEPS="..." bash benchmarks/real_model/gpu.sh pair       # a 2-GPU machine: sums seeds 0, 1 alone; steps seed 0
#                                                # (as run on 2026-11-26 with STEPS=trainer.total_steps=60: pair_h100x2.json)
#   STEPS="..." bash benchmarks/real_model/gpu.sh pair_steps # a 2-GPU machine: steps seeds 1, 2 (STEPS=trainer.total_steps=30:
#                                                # steps_h100x2.json; rest_lora cut to seeds 0, 1: steps_lora_h100x2.json)
#   bash benchmarks/real_model/gpu.sh scale2                 # not yet run: sums at world 2 (2 replicas), seeds 0-2
#   bash benchmarks/real_model/gpu.sh x4     # a 4-GPU machine, the same command in several calls: the jobs of
#                                            # jobs_x4.txt (steps_lora seeds 0-2; sums on 1, 2 and 4 GPUs, seeds 0-2;
#                                            # world 4's checkpoint resumed at world 2) by benchmarks/gpu_queue.py
#   bash benchmarks/real_model/gpu.sh x4b    # the same for jobs_x4b.txt: steps_lora seeds 0-2 to step 30, the seeds
#                                            # left of x4, split TP 2, and 1-GPU scale shapes (0.5B, 1.5B, 3B)
#   bash benchmarks/real_model/gpu.sh scale  # a 4-GPU machine, several calls: benchmarks/multi_gpu/jobs_scale.txt
#                                            # (0.5B, 1.5B, 3B random weights on 1, 2, 4 GPUs, colocated and split)
#   bash benchmarks/real_model/gpu.sh x4d    # jobs_x4c.txt, then jobs_scale.txt, in one queue over several calls
#   bash benchmarks/real_model/gpu.sh x4e    # jobs_x4e.txt (GPU tests, LoRA adapter mode on the worked steps),
#                                            # then what jobs_scale.txt has left
#   bash benchmarks/real_model/gpu.sh x4f    # jobs_x4f.txt (sync against raw NCCL at 3B and 7B, the SmolLM2 recipe
#                                            # before and after the reshape), then what jobs_scale.txt has left
#   bash benchmarks/real_model/gpu.sh x4g    # jobs_x4g.txt: a 7B shape on 4 GPUs colocated (issue 42), with its plan
#   bash benchmarks/real_model/gpu.sh x4h    # several calls: jobs_x4h.txt, the split runs left of issue 37, then 7B at TP 2
#   bash benchmarks/real_model/gpu.sh x4m    # not yet run: jobs_x4m.txt, split 3B with and without expandable segments, then x4h's split runs left
#   bash benchmarks/real_model/gpu.sh x4l    # several calls: jobs_x4l.txt, issue 42's 7B at TP 2 and split 2 + 2 (run_7b.sh)
#   bash benchmarks/real_model/gpu.sh one_7b # one H200: the 7B shape, full parameters, offloaded (issue 42 item 2)
#   bash benchmarks/real_model/gpu.sh x4i    # one_7b on one GPU of four beside issue 36's gap runs (jobs_x4i.txt)
#   bash benchmarks/real_model/gpu.sh x4j    # the same, 2 steps, beside the GPU tests and one gap run (jobs_x4j.txt)
#   bash benchmarks/real_model/gpu.sh x4k    # one_7b unprofiled beside LoRA rank 64 at 7B, merged and adapter, and gap seed 6 (jobs_x4k.txt)
#   bash benchmarks/real_model/gpu.sh algos  # not yet run: smollm2_sums under each algorithm with its mini-batches (jobs_algos.txt)
#   bash benchmarks/real_model/gpu.sh async  # issue 41's modes x 3 seeds, two 1 + 1 runs at a time, a kill -9 (jobs_async.txt):
#                                            # as run on 2026-11-28 (sync_s0, async2_s0, the kill: async_h100x4.json)
#   bash benchmarks/real_model/gpu.sh async_b  # the same on an easier task, no padding (jobs_async_b.txt): as run on
#                                            # 2026-11-28 on 8fd6f33 (async_h200x4.json) and 4878c4b (async_h200x4b.json)
#   bash benchmarks/real_model/gpu.sh x2a    # a 2-GPU machine, three calls: GPU tests; one_7b across the calls (detached.sh);
#                                            # issue 36's gap seeds 1, 3, 8 beside it (jobs_x2a.txt): as run on 047843f
#   bash benchmarks/real_model/gpu.sh x2b    # the same with jobs_x2b.txt (one_7b at 6144 tokens a micro-batch): as run on e3669c4
#   bash benchmarks/real_model/gpu.sh x2c    # one call (one GPU is enough): seed 3's merged-LoRA run to step 33 on the code that logs the
#                                            # token at the largest gap (jobs_x2c.txt; issue 36 item 4)
#   bash benchmarks/real_model/gpu.sh async_c  # not yet run: issue 41 on a 2-GPU machine, 2-6 numbers, 30 steps (jobs_async_c.txt)
#   bash benchmarks/real_model/gpu.sh x4n    # several calls: the GPU tests, the 0.5B split 1 + 1 run with and without expandable
#                                            # segments, then issue 41's async_c runs two at a time (jobs_x4n.txt)
#   bash benchmarks/real_model/gpu.sh x4o    # not yet run: issue 41's seeds 1 and 2 (sync, one-step-off, async 2), then the 3B
#                                            # split 2 + 2 run on the expandable-segments default (jobs_x4o.txt)
#   bash benchmarks/real_model/gpu.sh scale_sync  # one call: rlpost's sync against raw NCCL, 0.5B-7B shapes
# Every run's folder, log and the machine's description go into one archive, $OUT/STAGE.tar.gz
# (benchmarks/real_model/collect.py turns it into the committed JSON).
set -uo pipefail
STAGE=${1:?stage: steps, sums, survey, rest, rest_lora, pair, pair_steps, scale2, x4, x4b, x4c, x4d, x4e, x4f, x4g, x4h, x4i, x4j, x4k, x4l, x4m, x4n, x4o, x2a, x2b, algos, async, async_b, async_c, one_7b, scale or scale_sync}
OUT=${OUT:-/tmp/out}; LIMIT=${LIMIT:-560}; START=$SECONDS
mkdir -p "$OUT" /tmp/runs
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 NCCL_NVLS_ENABLE=0
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
CACHE=/tmp/rlcache
COMMON="model.cache_dir=$CACHE logger.progress_bar=false logger.plot=false"
export W=/tmp/runs/$STAGE; mkdir -p "$W"  # exported: a queue's job line may name it
nvidia-smi --query-gpu=timestamp,index,memory.used --format=csv,noheader,nounits -lms 500 >> "$W/gpu_memory.csv" 2>/dev/null &  # peaks
SMI=$!
waitruns() { for j in $(jobs -p); do [ "$j" = "$SMI" ] || wait "$j"; done; }  # every job but the sampler
{ echo "commit ${COMMIT:-unknown}"; echo "stage $STAGE"; date -u +%FT%TZ; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader;
  nproc; python3 -c 'import torch, vllm, transformers; print("torch", torch.__version__, "vllm", vllm.__version__, "transformers", transformers.__version__)'; } > "$W/machine.txt" 2>&1
cat "$W/machine.txt"
# the GGUF file becomes a folder once, before the runs start (else each would convert it)
python3 -c "from rlpost.models.loading import resolve_path; print(resolve_path('smollm2-135m-instruct', '$CACHE'))" > "$W/convert.log" 2>&1 || cat "$W/convert.log"

run() {  # run NAME GPU overrides...: one `rlpost train` in the background on GPU `GPU`
  local name=$1 gpu=$2; shift 2
  echo "$(date -u +%T) start $name on GPU $gpu: $*" | tee -a "$W/commands.txt"
  ( CUDA_VISIBLE_DEVICES=$gpu timeout $((LIMIT - (SECONDS - START))) python3 -m rlpost.cli train "$@" $COMMON \
      run.dir=$W/$name > "$W/$name.log" 2>&1; echo "$(date -u +%T) $name rc=$?" | tee -a "$W/commands.txt" ) &
}

headroom() {  # the start model's greedy accuracy and pass@8 on candidate tasks (GPU $1)
  local gpu=$1
  for spec in "sums_chat||1.0" "sums_steps|data.operands=2 data.arithmetic_digits=2|0.7" \
              "sums_steps|data.operands=4 data.arithmetic_digits=1|0.7" "sums_steps|data.operands=6 data.arithmetic_digits=1|0.7" \
              "sums_steps|data.operands=8 data.arithmetic_digits=1|0.7" "sums_steps|data.operands=3 data.arithmetic_digits=2|0.7"; do
    IFS='|' read -r task set temp <<< "$spec"
    CUDA_VISIBLE_DEVICES=$gpu python3 benchmarks/real_model/headroom.py --task "$task" ${set:+--set $set} --problems 256 \
      --k 8 --max-tokens 384 --temperature "$temp" --reward last_number --cache $CACHE 2>> "$W/headroom.log" | grep '^{' >> "$W/headroom.jsonl"
  done
}

scale_setup() {  # random-weight Qwen2 shapes (benchmarks/random_model.py), a reward they can move, and $SCALE
  printf 'def score(sample):\n    text = sample.response\n    return sum(c.isdigit() for c in text) / max(len(text), 1)\n' > /tmp/digit_share.py
  local builds=()  # all three before the queue starts (a job of any shape may come first), side by side; `scale_setup -`: none
  for shape in ${1:-0.5b 1.5b 3b}; do
    [ "$shape" = - ] && continue
    [ -f /tmp/qwen2-$shape/config.json ] && continue
    python3 benchmarks/random_model.py --shape $shape --out /tmp/qwen2-$shape > "$W/build_$shape.log" 2>&1 &
    builds+=($!)
  done
  [ ${#builds[@]} -eq 0 ] || wait "${builds[@]}"
  export SCALE="trainer.world_size=1 rollout.num_workers=1 model.dtype=bfloat16 model.attn_implementation=rlpost_varlen trainer.device=cuda rollout.backend=vllm \
data.task=arithmetic data.max_prompt_length=32 data.train_batch_size=32 rollout.n=8 rollout.max_response_length=512 \
trainer.micro_batch_size=256 trainer.max_tokens_per_microbatch=4096 trainer.total_steps=6 trainer.val_every=0 \
trainer.optim.lr=1e-6 algo.kl_coef=0.001 reward.fn=/tmp/digit_share.py:score"
}

seven_b_env() {  # issue 42's 7B runs on one GPU: $O7 full parameters offloaded, $L7 LoRA rank 64 (after scale_setup)
  export O7="model.path=/tmp/qwen2-7b $SCALE rollout.max_response_length=1024 trainer.total_steps=3 trainer.param_offload=true \
trainer.optim.offload=layerwise trainer.max_tokens_per_microbatch=2048 trainer.profile_step=3"
  export L7="model.path=/tmp/qwen2-7b $SCALE rollout.max_response_length=1024 trainer.total_steps=3 model.lora.rank=64 \
model.lora.alpha=128 model.lora.target_modules=[all-linear] trainer.optim.lr=1e-5"  # issue 42 item 3 (x4k)
}

async_c_env() {  # issue 41's task and run length ($ASYNC_C): 2 to 6 one-digit numbers with worked steps, 30 steps
  export ASYNC_C="+recipe=smollm2_steps data.operands=2 data.max_operands=6 data.arithmetic_digits=1 \
data.max_prompt_length=128 rollout.max_response_length=1024 cluster.placement=split trainer.total_steps=30 trainer.val_every=5 \
trainer.save_every=5 trainer.start_pass_k=0 model.attn_implementation=rlpost_varlen trainer.micro_batch_size=512 \
trainer.max_tokens_per_microbatch=16384"
}

case "$STAGE" in
  steps)
    for s in 0 1 2; do run steps_s$s $s +recipe=smollm2_steps run.seed=$s rollout.kv_cache_gb=8; done
    run steps_lora_s0 3 +recipe=smollm2_steps_lora run.seed=0 rollout.kv_cache_gb=8
    headroom 3 &
    ;;
  sums)  # two runs share each GPU: KV caches sized (rollout.kv_cache_gb), not profiled
    for s in 0 1 2; do
      run sums_s$s $s +recipe=smollm2_sums run.seed=$s rollout.kv_cache_gb=4
      run sums_lora_s$s $s +recipe=smollm2_sums_lora run.seed=$s rollout.kv_cache_gb=4
    done
    run steps_s0 3 +recipe=smollm2_steps run.seed=0 rollout.kv_cache_gb=8
    ;;
  survey)  # the start model's headroom on the steps candidates, scored by running_total and last_number
    for g in 0 1 2 3; do
      ( for spec in $(sed -n "$((g + 1))p" <<< $'3 4\n5 6\n2x2 3x2\n7 8'); do
          case $spec in *x2) set="data.operands=${spec%x2} data.arithmetic_digits=2" ;; *) set="data.operands=$spec data.arithmetic_digits=1" ;; esac
          for reward in running_total last_number; do
            CUDA_VISIBLE_DEVICES=$g python3 benchmarks/real_model/headroom.py --task sums_steps --set $set --problems 256 --k 8 \
              --max-tokens 384 --temperature 0.7 --reward $reward --cache $CACHE 2>> "$W/headroom.log" | grep '^{' >> "$W/headroom_$g.jsonl"
          done
        done ) &
    done
    wait; cat "$W"/headroom_*.jsonl > "$W/headroom.jsonl"
    ;;
  rest)  # each run alone on its GPU: sums seeds 0, 1 (GPU 0), smollm2_steps seeds 0-2 ($STEPS: more overrides)
    ( run sums_s0 0 +recipe=smollm2_sums run.seed=0; wait; run sums_s1 0 +recipe=smollm2_sums run.seed=1; wait ) &
    for s in 0 1 2; do run steps_s$s $((s + 1)) +recipe=smollm2_steps run.seed=$s ${STEPS:-}; done
    ;;
  rest_lora)  # smollm2_steps_lora seeds 0-2 ($STEPS as in `rest`), GPU 3: adapter mode on smollm2_sums_lora
    for s in 0 1 2; do run steps_lora_s$s $s +recipe=smollm2_steps_lora run.seed=$s ${STEPS:-}; done
    run sums_adapter_s0 3 +recipe=smollm2_sums_lora model.lora.mode=adapter run.seed=0
    ;;
  pair)  # a 2-GPU machine: sums seeds 0, 1 each alone on GPU 0; smollm2_steps seed 0 on GPU 1 ($STEPS as in `rest`)
    ( run sums_s0 0 +recipe=smollm2_sums run.seed=0; wait; run sums_s1 0 +recipe=smollm2_sums run.seed=1; wait ) &
    run steps_s0 1 +recipe=smollm2_steps run.seed=0 ${STEPS:-}
    ;;
  pair_steps)  # a 2-GPU machine: smollm2_steps seeds 1, 2 ($STEPS as in `rest`)
    for s in 1 2; do run steps_s$s $((s - 1)) +recipe=smollm2_steps run.seed=$s ${STEPS:-}; done
    ;;
  scale2)  # smollm2_sums on both GPUs of a 2-GPU machine (FSDP2 world 2, 2 vLLM replicas colocated, the same
           # global batch as one GPU), seeds 0-2 one after another; `rlpost plan`'s prediction beside them
    python3 -m rlpost.cli plan +recipe=smollm2_sums trainer.world_size=2 rollout.num_workers=2 $COMMON > "$W/plan2.txt" 2>&1
    python3 -m rlpost.cli plan +recipe=smollm2_sums $COMMON > "$W/plan1.txt" 2>&1
    for s in 0 1 2; do run sums_w2_s$s 0,1 +recipe=smollm2_sums run.seed=$s trainer.world_size=2 rollout.num_workers=2; waitruns; done
    ;;
  x4|x4b|x4c)  # over several calls on one warm machine: each call goes on where the last stopped (jobs_$STAGE.txt);
           # x4b's scale jobs use random-weight Qwen2 shapes (benchmarks/random_model.py) and a reward they can move
    scale_setup
    python3 -m rlpost.cli plan +recipe=smollm2_sums trainer.world_size=4 rollout.num_workers=4 $COMMON > "$W/plan4.txt" 2>&1
    python3 -m rlpost.cli plan +recipe=smollm2_sums trainer.world_size=2 rollout.num_workers=2 $COMMON > "$W/plan2.txt" 2>&1
    python3 -m rlpost.cli plan +recipe=smollm2_sums $COMMON > "$W/plan1.txt" 2>&1
    python3 benchmarks/gpu_queue.py benchmarks/real_model/jobs_$STAGE.txt --dir "$W" --grace 50 --common "$COMMON" \
      --deadline $((LIMIT - (SECONDS - START) - 50))
    ;;
  scale|x4d|x4e|x4f)  # issue 37's scale figures over several calls (benchmarks/multi_gpu/jobs_scale.txt), after
                      # jobs_x4c.txt (x4d), jobs_x4e.txt (x4e) or jobs_x4f.txt (x4f)
    scale_setup
    [ "$STAGE" = x4d ] && for w in 4 2; do
      python3 -m rlpost.cli plan +recipe=smollm2_sums trainer.world_size=$w rollout.num_workers=$w $COMMON > "$W/plan$w.txt" 2>&1
    done
    python3 benchmarks/gpu_queue.py $([ "$STAGE" != scale ] && echo benchmarks/real_model/jobs_${STAGE/x4d/x4c}.txt) \
      benchmarks/multi_gpu/jobs_scale.txt --dir "$W" --grace 50 --common "$COMMON" \
      --deadline $((LIMIT - (SECONDS - START) - 50))
    ;;
  x4h|x4m)  # the split runs left of issue 37 (jobs_x4h.txt; x4m: jobs_x4m.txt, expandable segments first), several calls
    scale_setup
    export B7="model.path=/tmp/qwen2-7b $SCALE trainer.world_size=4 rollout.num_workers=4 data.train_batch_size=128 \
rollout.max_response_length=1024 trainer.total_steps=3"
    export COMMON  # a `sh:` job's line names it
    python3 benchmarks/gpu_queue.py benchmarks/real_model/jobs_$STAGE.txt --dir "$W" --grace 50 --common "$COMMON" \
      --deadline $((LIMIT - (SECONDS - START) - 50))
    ;;
  x4l)  # issue 42 item 1's 7B runs left (jobs_x4l.txt: TP 2 colocated, split 2 + 2 one-step-off and synchronous), each
        # in a session of its own across the calls, then issue 37's 3B one-step-off split run
    scale_setup -
    export COMMON B7="$SCALE trainer.world_size=4 rollout.num_workers=4 data.train_batch_size=128 \
rollout.max_response_length=1024 trainer.total_steps=3 model.path=/tmp/qwen2-7b"
    python3 benchmarks/gpu_queue.py benchmarks/real_model/jobs_x4l.txt --dir "$W" --grace 50 --common "$COMMON" \
      --min-start 60 --deadline $((LIMIT - (SECONDS - START) - 50))
    ;;
  x4g)  # a Qwen2.5-7B shape (random weights, built on a GPU by jobs_x4f.txt's build_7b) on 4 GPUs, colocated:
        # 128 prompts x 8 samples x 1024 tokens a step; `rlpost plan`'s prediction beside it
    scale_setup
    export B7="model.path=/tmp/qwen2-7b $SCALE trainer.world_size=4 rollout.num_workers=4 data.train_batch_size=128 \
rollout.max_response_length=1024 trainer.total_steps=3"
    python3 -m rlpost.cli plan $B7 $COMMON --gpu-gb "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 \
      | awk '{printf "%.1f", $1 / 1024}')" > "$W/plan_7b.txt" 2>&1
    python3 benchmarks/gpu_queue.py benchmarks/real_model/jobs_x4g.txt --dir "$W" --grace 50 --common "$COMMON" \
      --deadline $((LIMIT - (SECONDS - START) - 50))
    ;;
  one_7b|x4i|x4j|x4k)  # issue 42 item 2, one H200: the 7B shape with full parameters, FSDP2 parameter offload, Adam streamed
           # layer by layer from the host, vLLM sleeping while the trainer runs; a quarter of x4g's batch (32 x 8 x 1024
           # tokens: x4g's tokens per GPU) at 2048 tokens a micro-batch (the plan fits 3072: a margin), step 3 profiled
           # (one_7b.sh). x4i: the same as a job of jobs_x4i.txt, beside issue 36's gap runs
    scale_setup; seven_b_env
    if [ "$STAGE" = one_7b ]; then
      CUDA_VISIBLE_DEVICES=0 timeout $((LIMIT - (SECONDS - START))) bash benchmarks/real_model/one_7b.sh
    else
      CUDA_VISIBLE_DEVICES=0 bash benchmarks/real_model/one_7b.sh --setup
      python3 benchmarks/gpu_queue.py benchmarks/real_model/jobs_$STAGE.txt --dir "$W" --grace 50 --common "$COMMON" \
        --deadline $((LIMIT - (SECONDS - START) - 120))  # and 60 s for the trace below
      waitruns
      for t in "$W"/one_7b/profile/*.json.gz; do [ -f "$t" ] && timeout 60 python3 benchmarks/real_model/memcpy.py "$t" > "${t%.json.gz}.memcpy.json"; done
    fi
    ;;
  x2a|x2b|x2c)  # a 2-GPU machine, the same command in three calls on one warm machine (jobs_$STAGE.txt): x2a the GPU tests,
            # then the 7B shape on GPU 0 in a session of its own across the calls (detached.sh, one_7b.sh), issue 36's gap
            # runs on GPU 1; x2b the 7B shape at 6144 tokens a micro-batch, step 2 profiled, beside gap runs
    scale_setup -; seven_b_env; export COMMON  # (x2a built the 0.5B-3B shapes too: 90 s of its first call)
    python3 benchmarks/gpu_queue.py benchmarks/real_model/jobs_$STAGE.txt --dir "$W" --grace 50 --common "$COMMON" \
      --min-start 60 --deadline $((LIMIT - (SECONDS - START) - 50))
    ;;
  x4n|x4o)  # a 4-GPU machine over several calls (jobs_x4n.txt): the GPU tests and the 0.5B split pair with and without
        # expandable segments (issue 37 item 4), then issue 41's runs two at a time; x4o (jobs_x4o.txt): issue 41's
        # seeds 1 and 2, then the 3B split run with expandable segments by default
    scale_setup "0.5b 3b"; async_c_env; export COMMON
    python3 benchmarks/gpu_queue.py benchmarks/real_model/jobs_$STAGE.txt --dir "$W" --grace 50 --common "$COMMON" --min-start 240 \
      --deadline $((LIMIT - (SECONDS - START) - 50))
    ;;
  async)  # issue 41: time to accuracy, synchronous / one-step-off / async (jobs_async.txt), over several calls
    export ASYNC="+recipe=smollm2_steps data.operands=2 data.max_operands=24 data.arithmetic_digits=2 \
data.max_prompt_length=192 rollout.max_response_length=1024 cluster.placement=split trainer.total_steps=30 trainer.val_every=10 \
trainer.save_every=5 trainer.start_pass_k=0"
    export COMMON  # kill_async2_s0's command line names it (a `sh:` job gets no common overrides from the queue)
    python3 benchmarks/gpu_queue.py benchmarks/real_model/jobs_async.txt --dir "$W" --grace 50 --common "$COMMON" \
      --deadline $((LIMIT - (SECONDS - START) - 50))
    ;;
  async_b)  # issue 41 again (jobs_async_b.txt): a task the 135M model learns (1-digit sums of 2 to 12 numbers) and an
            # update without padding (async's run had 64-68% padding and an update of 10.4 s: async_h100x4.json)
    export ASYNC="+recipe=smollm2_steps data.operands=2 data.max_operands=12 data.arithmetic_digits=1 \
data.max_prompt_length=128 rollout.max_response_length=1024 cluster.placement=split trainer.total_steps=20 trainer.val_every=5 \
trainer.save_every=5 trainer.start_pass_k=0 model.attn_implementation=rlpost_varlen trainer.micro_batch_size=512 \
trainer.max_tokens_per_microbatch=16384"
    export COMMON
    python3 benchmarks/gpu_queue.py benchmarks/real_model/jobs_async_b.txt --dir "$W" --grace 50 --common "$COMMON" \
      --deadline $((LIMIT - (SECONDS - START) - 50))
    ;;
  async_c)  # issue 41 on a 2-GPU machine (jobs_async_c.txt): 2 to 6 one-digit numbers, 30 steps, one 1 + 1 run at a time
    async_c_env
    python3 benchmarks/gpu_queue.py benchmarks/real_model/jobs_async_c.txt --dir "$W" --grace 50 --common "$COMMON" \
      --deadline $((LIMIT - (SECONDS - START) - 50))
    ;;
  algos)  # issue 40 item 3 on the real model's task: each algorithm with its mini-batches (jobs_algos.txt), several calls
    python3 benchmarks/gpu_queue.py benchmarks/real_model/jobs_algos.txt --dir "$W" --grace 50 --common "$COMMON" \
      --deadline $((LIMIT - (SECONDS - START) - 50))
    ;;
  scale_sync)  # rlpost's verified sync against a raw NCCL broadcast of the same bytes, GPU 0 -> GPU 1, per shape
    bash benchmarks/multi_gpu/sync_shapes.sh "$W" 0.5b 1.5b 3b 7b
    ;;
  *) echo "unknown stage $STAGE"; exit 2 ;;
esac
waitruns; kill $SMI
echo "stage $STAGE done in $((SECONDS - START)) s"
tar -czf "$OUT/$STAGE.tar.gz" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.distcp' --exclude='*.json.gz' -C /tmp/runs "$STAGE"
ls -la "$OUT"; tail -n 30 "$W/commands.txt"
for f in "$W"/*.log; do echo "== $f"; tail -n 4 "$f" | cut -c1-300; done
