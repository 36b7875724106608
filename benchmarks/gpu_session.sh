#!/usr/bin/env bash
# The GPU measurements of benchmarks/ in two stages that each fit one 10-minute device call on a
# 2 x H200 machine (vLLM and Ray installed into /tmp/site):
#   bash benchmarks/gpu_session.sh A   # GPU tests, weight-sync and rollout benchmarks
#   bash benchmarks/gpu_session.sh B   # GRPO runs: colocate on 1 GPU, split sync vs one-step-off, LoRA
#   bash benchmarks/gpu_session.sh C   # sync tests and bandwidth again (pipelined buckets), rollout
#                                   # memory in split placement, LoRA adapter mode with vLLM
# and, on one H100 (D1, D2), after the batched checksums:
#   bash benchmarks/gpu_session.sh D1  # sync tests, colocate GRPO, IPC sync, merged vs adapter (3B, r16)
#   bash benchmarks/gpu_session.sh D2  # merged vs adapter: 3B r64, 0.5B r64
# and after the cached sync plans (F: 2 x H200 with torch only, no vLLM; G: one H100 with vLLM):
#   bash benchmarks/gpu_session.sh F   # checksum (Triton kernel vs CPU) and IPC tests, sync bandwidth (256 and 64 MB buckets),
#                                   # checksum micro-timings
#   bash benchmarks/gpu_session.sh G   # merged vs adapter rollout, 3B: rank 64 (10 rounds), rank 16 (6)
# and after the one-verdict protocol and the Triton checksum kernel (one H100 with vLLM):
#   bash benchmarks/gpu_session.sh H   # colocate GRPO: IPC syncs verified by reading back vLLM's tensors
# and after the sender keeps one transfer in flight (2 x H200, torch only):
#   bash benchmarks/gpu_session.sh I   # GPU sync tests, sync bandwidth (256 and 64 MB buckets)
# and the GPU path learning (one H100 with vLLM; a warm machine keeps the built model for K):
#   bash benchmarks/gpu_session.sh J   # +recipe=gpu_quickstart: a 76M model built and warmed up on the GPU, GRPO via vLLM
#   bash benchmarks/gpu_session.sh K   # the same with LoRA (rank 32, merged into every sync)
# and after the old log-probs come from the update's own forward (one H100 with vLLM):
#   bash benchmarks/gpu_session.sh L   # GPU tests; colocate GRPO (0.5B) with the separate log-prob pass, then without
#   bash benchmarks/gpu_session.sh M   # +recipe=gpu_quickstart still learns (stopped after LIMIT seconds)
# and the algorithms' roles on a GPU (one H100 with vLLM; a warm machine keeps the built models):
#   bash benchmarks/gpu_session.sh N   # PPO: the critic's worker group colocated with actor and vLLM
#   bash benchmarks/gpu_session.sh O   # GRPO with the tiny reward model (built on the GPU) next to the rule
#   bash benchmarks/gpu_session.sh P   # the same on the CPU quickstart's model (+recipe=grpo_rm) on the GPU, hf rollout
# and several GPUs (2 x H200 with vLLM), each run with its memory plan against the measured peak:
#   bash benchmarks/gpu_session.sh Q   # 3B: FSDP2 world 2 + 2 vLLM replicas colocated
#   bash benchmarks/gpu_session.sh R   # 7B: world 2 + 2 replicas, trainer.param_offload + trainer.optim.offload=layerwise
#   bash benchmarks/gpu_session.sh S   # 3B: split 1 + 1, synchronous vs one-step-off
# and multi-turn episodes on vLLM (one H100 with vLLM):
#   bash benchmarks/gpu_session.sh T   # +recipe=multiturn_tools on the GPU (vLLM batches the turns continuously),
#                                   # then episodes vs single-turn generation of the same lengths (bench_episodes.py)
# and after vLLM's generate steps the engine (a sync can land between two steps: async rollouts; one H100):
#   bash benchmarks/gpu_session.sh U   # rollout throughput: stepped generate and the pausable engine vs raw vLLM,
#                                   # a partial rollout (a load part-way); GPU tests; gpu_quickstart learns
# and async rollouts on two GPUs (2 x H100 or H200 with vLLM):
#   bash benchmarks/gpu_session.sh V   # 0.5B split 1 + 1: synchronous vs async rollouts (max_staleness 2)
# and vLLM tensor parallel (2+ GPUs with vLLM; not yet run):
#   bash benchmarks/gpu_session.sh W   # GPU tests (the TP shards synced by IPC); 0.5B world 2 colocated with one
#                                   # engine of 2 shards against 2 replicas of 1; on 3+ GPUs split 1 + TP 2;
#                                   # LoRA update cost (bench_lora_update.py); a checkpoint of world 2 resumed
#                                   # on world 1 (W1 and W2 are its two halves, one device call each)
# Results go to $OUT (default /tmp/out). Each step runs even if an earlier one failed.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 NCCL_NVLS_ENABLE=0
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
M=/tmp/qwen2-0.5b
case "${1:-A}" in Q|R|S|T) ;; *) [ -f $M/config.json ] || python3 benchmarks/random_model.py --shape 0.5b --out $M > /dev/null ;; esac
step() { local name=$1; shift; local t=$SECONDS; echo "=== $name"; "$@" > "$OUT/$name.log" 2>&1;
         echo "=== $name rc=$? $((SECONDS - t))s"; tail -3 "$OUT/$name.log"; }
grpo() {  # grpo NAME overrides...: a short GRPO run on the 0.5B model, summarised to $OUT/NAME.json
  local name=$1; shift
  step "$name" python3 -m rlpost.cli train model.path=$M model.dtype=bfloat16 \
    model.attn_implementation=rlpost_varlen trainer.device=cuda trainer.world_size=1 rollout.backend=vllm \
    data.task=arithmetic data.max_prompt_length=32 data.train_batch_size=32 rollout.n=8 \
    rollout.max_response_length=256 trainer.micro_batch_size=256 trainer.max_tokens_per_microbatch=8192 \
    trainer.total_steps=6 trainer.val_every=0 trainer.optim.lr=1e-6 logger.progress_bar=false \
    run.dir=/tmp/runs/$name "$@"
  python3 scripts/summarize_run.py /tmp/runs/$name --skip 1 > "$OUT/$name.json"
}
learn() {  # learn NAME overrides...: the gpu_quickstart recipe (stopped at LIMIT seconds), summarised
  local name=$1; shift
  step "$name" timeout "${LIMIT:-420}" python3 -m rlpost.cli train +recipe=gpu_quickstart logger.progress_bar=false \
    run.dir=/tmp/runs/$name "$@"
  cp /tmp/runs/$name/metrics.jsonl "$OUT/$name.metrics.jsonl"
  python3 scripts/summarize_run.py /tmp/runs/$name --skip 1 > "$OUT/$name.json"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('val', d['val_accuracy'], 'start', d['start_model'])" "$OUT/$name.json"
}
multi() {  # multi NAME MODEL overrides...: a short GRPO run over both GPUs, with its memory plan
  local name=$1 model=$2; shift 2
  local args=(model.path=$model model.dtype=bfloat16 model.attn_implementation=rlpost_varlen trainer.device=cuda
    rollout.backend=vllm data.task=arithmetic data.max_prompt_length=32 data.train_batch_size=32 rollout.n=8
    rollout.max_response_length=256 trainer.micro_batch_size=256 trainer.max_tokens_per_microbatch=8192
    trainer.total_steps=${STEPS:-4} trainer.val_every=0 trainer.optim.lr=1e-6 algo.kl_coef=0.001
    reward.fn=/tmp/digit_share.py:score "$@")
  step "$name" timeout 300 python3 -m rlpost.cli train "${args[@]}" logger.progress_bar=false run.dir=/tmp/runs/$name
  python3 scripts/summarize_run.py /tmp/runs/$name --skip 1 > "$OUT/$name.json"
  cp /tmp/runs/$name/metrics.jsonl "$OUT/$name.metrics.jsonl"
  python3 scripts/plan_vs_measured.py /tmp/runs/$name "${args[@]}" > "$OUT/$name.plan.json" 2> "$OUT/$name.plan.err"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('plan', round(d['plan_gib']['peak'],2), 'measured', d['measured_update_peak_gib'], 'ratio', d['plan_over_measured'])" "$OUT/$name.plan.json"
}
# a reward that random weights can move (the share of digits in the response): rewards vary, so the
# gradients are not zero and each sync sends new weights
printf 'def score(sample):\n    text = sample.response\n    return sum(c.isdigit() for c in text) / max(len(text), 1)\n' > /tmp/digit_share.py
case "${1:-A}" in
T)  # one H100: the tiny tool-using model warmed up on the GPU, GRPO with calculator episodes on vLLM
  step mt_train python3 -m rlpost.cli train +recipe=multiturn_tools trainer.device=cuda rollout.backend=vllm \
    rollout.gpu_memory_utilization=0.3 trainer.total_steps=${STEPS:-20} data.train_batch_size=64 \
    model.cache_dir=/tmp/cache logger.progress_bar=false run.dir=/tmp/runs/mt_train
  cp /tmp/runs/mt_train/metrics.jsonl "$OUT/mt_train.metrics.jsonl"
  python3 scripts/summarize_run.py /tmp/runs/mt_train --skip 1 > "$OUT/mt_train.json"
  step mt_bench python3 benchmarks/multiturn/bench_episodes.py --model "$(ls -d /tmp/cache/tiny-qwen2-* | head -1)" \
    --device cuda --prompts 512 --n 4 --out "$OUT/episodes_h100.json"
  ;;
Q)  # 2 x H200: FSDP2 over 2 GPUs with 2 vLLM replicas (3B), colocated
  [ -f /tmp/qwen2-3b/config.json ] || python3 benchmarks/random_model.py --shape 3b --out /tmp/qwen2-3b > /dev/null
  multi grpo_3b_colocate_w2r2 /tmp/qwen2-3b cluster.placement=colocate trainer.world_size=2 rollout.num_workers=2 \
    rollout.gpu_memory_utilization=0.4
  ;;
S)  # 2 x H200: 3B split over 1 trainer GPU + 1 vLLM GPU, synchronous vs one-step-off
  [ -f /tmp/qwen2-3b/config.json ] || python3 benchmarks/random_model.py --shape 3b --out /tmp/qwen2-3b > /dev/null
  multi grpo_3b_split_sync /tmp/qwen2-3b cluster.placement=split trainer.world_size=1 rollout.num_workers=1 \
    rollout.gpu_memory_utilization=0.8 algo.max_staleness=0
  multi grpo_3b_split_offpolicy /tmp/qwen2-3b cluster.placement=split trainer.world_size=1 rollout.num_workers=1 \
    rollout.gpu_memory_utilization=0.8 algo.max_staleness=1
  ;;
R)  # 2 x H200: a 7B shape with the parameters and Adam's states offloaded, colocated with 2 vLLM replicas
  [ -f /tmp/qwen2-7b/config.json ] || python3 benchmarks/random_model.py --shape 7b --out /tmp/qwen2-7b > /dev/null
  multi grpo_7b_offload_w2r2 /tmp/qwen2-7b cluster.placement=colocate trainer.world_size=2 rollout.num_workers=2 \
    rollout.gpu_memory_utilization=0.4 trainer.param_offload=true trainer.optim.offload=layerwise
  ;;
V)
  grpo grpo_split_sync cluster.placement=split algo.max_staleness=0 rollout.enforce_eager=true trainer.total_steps=5
  grpo grpo_split_async cluster.placement=split algo.async_rollouts=true algo.max_staleness=2 \
    rollout.enforce_eager=true trainer.total_steps=5
  ;;
W|W1)  # 2+ GPUs: tensor parallel engines, each run with its memory plan against the measured peak
  step gpu_tests timeout 300 python3 -m pytest -q -p no:cacheprovider ${TESTS:-tests/gpu}
  multi tp2_colocate $M trainer.world_size=2 rollout.num_workers=1 rollout.tensor_parallel_size=2 ${TP_EXTRA:-}
  multi r2_colocate $M trainer.world_size=2 rollout.num_workers=2
  if [ "$(nvidia-smi -L | wc -l)" -ge 3 ]; then
    multi tp2_split $M trainer.world_size=1 cluster.placement=split rollout.tensor_parallel_size=2
  fi
  step lora_update timeout 150 python3 benchmarks/real_model/bench_lora_update.py --cache /tmp/rlcache --out "$OUT/lora_update.json"
  [ "$1" = W ] || exit 0
  ;&
W2)  # a checkpoint of world 2 (layerwise optimizer) resumed on world 1
  STEPS=2 multi saved_w2 $M trainer.world_size=2 rollout.num_workers=2 trainer.save_every=2 trainer.optim.offload=layerwise
  multi resumed_w1 $M trainer.world_size=1 trainer.total_steps=4 trainer.optim.offload=layerwise \
    trainer.resume=/tmp/runs/saved_w2/checkpoints/step_2
  ;;
U)
  step rollout_partial timeout 300 python3 benchmarks/bench_rollout.py --model $M --partial --out "$OUT/rollout_partial.json"
  step gpu_tests timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu
  LIMIT=${LIMIT:-150} learn gpu_quickstart trainer.total_steps=20 model.tiny.warmup_steps=600
  ;;
A)
  step gpu_tests python3 -m pytest -q tests/gpu
  step weight_sync python3 benchmarks/bench_weight_sync.py --model $M --out "$OUT/weight_sync.json"
  step rollout python3 benchmarks/bench_rollout.py --model $M --lora-rank 16 --out "$OUT/rollout.json"
  ;;
B)
  grpo grpo_colocate cluster.placement=colocate rollout.gpu_memory_utilization=0.4
  grpo grpo_split_sync cluster.placement=split rollout.gpu_memory_utilization=0.8 algo.max_staleness=0
  grpo grpo_split_offpolicy cluster.placement=split rollout.gpu_memory_utilization=0.8 algo.max_staleness=1
  grpo grpo_lora_merge cluster.placement=colocate rollout.gpu_memory_utilization=0.4 model.lora.rank=16 \
    model.lora.alpha=32 model.lora.mode=merge
  ;;
C)
  step sync_tests python3 -m pytest -q tests/gpu/test_sync_gpu.py
  step weight_sync python3 benchmarks/bench_weight_sync.py --model $M --out "$OUT/weight_sync.json"
  step weight_sync_256 python3 benchmarks/bench_weight_sync.py --model $M --bucket-mb 256 \
    --out "$OUT/weight_sync_256.json"
  grpo grpo_split_memory cluster.placement=split rollout.gpu_memory_utilization=0.3 trainer.total_steps=2
  grpo grpo_lora_adapter cluster.placement=colocate rollout.gpu_memory_utilization=0.4 model.lora.rank=16 \
    model.lora.alpha=32 model.lora.mode=adapter
  ;;
D1)
  step sync_tests python3 -m pytest -q tests/gpu/test_sync_gpu.py
  grpo grpo_colocate cluster.placement=colocate rollout.gpu_memory_utilization=0.4
  step weight_sync python3 benchmarks/bench_weight_sync.py --model $M --profile "$OUT/profile" --out "$OUT/weight_sync.json"
  python3 benchmarks/random_model.py --shape 3b --out /tmp/qwen2-3b > /dev/null
  step lora_3b_r16 python3 benchmarks/bench_rollout.py --model /tmp/qwen2-3b --lora-rank 16 --skip-rlpost \
    --out "$OUT/lora_3b_r16.json"
  ;;
D2)
  [ -f /tmp/qwen2-3b/config.json ] || python3 benchmarks/random_model.py --shape 3b --out /tmp/qwen2-3b > /dev/null
  step lora_3b_r64 python3 benchmarks/bench_rollout.py --model /tmp/qwen2-3b --lora-rank 64 --skip-rlpost \
    --out "$OUT/lora_3b_r64.json"
  step lora_05b_r64 python3 benchmarks/bench_rollout.py --model $M --lora-rank 64 --skip-rlpost \
    --out "$OUT/lora_05b_r64.json"
  ;;
F)
  step checksum_test python3 -m pytest -q -p no:cacheprovider tests/gpu/test_sync_gpu.py -k "checksums or ipc or read_back"
  step weight_sync python3 benchmarks/bench_weight_sync.py --model $M --bucket-mb 256,64 --reps 7 \
    --profile "$OUT/profile" --out "$OUT/weight_sync.json"
  step checksums python3 benchmarks/bench_checksums.py
  ;;
G)
  python3 benchmarks/random_model.py --shape 3b --out /tmp/qwen2-3b > /dev/null
  step lora_3b_r64 python3 benchmarks/bench_rollout.py --model /tmp/qwen2-3b --lora-rank 64 --skip-rlpost \
    --rounds 10 --out "$OUT/lora_3b_r64.json"
  step lora_3b_r16 python3 benchmarks/bench_rollout.py --model /tmp/qwen2-3b --lora-rank 16 --skip-rlpost \
    --rounds 6 --out "$OUT/lora_3b_r16.json"
  ;;
H)
  grpo grpo_colocate cluster.placement=colocate rollout.gpu_memory_utilization=0.4
  ;;
J)
  learn gpu_quickstart
  ;;
K)
  learn gpu_quickstart_lora model.lora.rank=32 trainer.optim.lr=5e-4
  ;;
L)
  step gpu_tests python3 -m pytest -q -p no:cacheprovider tests/gpu
  grpo grpo_colocate_separate cluster.placement=colocate rollout.gpu_memory_utilization=0.4 algo.old_logprobs=separate
  grpo grpo_colocate_fused cluster.placement=colocate rollout.gpu_memory_utilization=0.4
  ;;
M)
  learn gpu_quickstart
  ;;
N)
  learn gpu_ppo algo.name=ppo algo.kl_estimator=k1 algo.gamma=1.0 algo.lam=0.95 critic.warmup_steps=5 \
    critic.optim.lr=1e-4 critic.optim.warmup_steps=5
  ;;
O)
  learn gpu_rm reward.model.path=tiny reward.model.weight=0.5 reward.model.sigmoid=true
  cp "$HOME"/.cache/rlpost/tiny-rm-*/rm_eval.json "$OUT/gpu_rm.rm_eval.json" 2>/dev/null
  ;;
P)
  step gpu_grpo_rm python3 -m rlpost.cli train +recipe=grpo_rm trainer.device=cuda trainer.world_size=1 \
    trainer.micro_batch_size=512 logger.progress_bar=false run.dir=/tmp/runs/gpu_grpo_rm
  cp /tmp/runs/gpu_grpo_rm/metrics.jsonl "$OUT/gpu_grpo_rm.metrics.jsonl"
  python3 scripts/summarize_run.py /tmp/runs/gpu_grpo_rm --skip 1 > "$OUT/gpu_grpo_rm.json"
  cp "$HOME"/.cache/rlpost/tiny-rm-*/rm_eval.json "$OUT/gpu_grpo_rm.rm_eval.json" 2>/dev/null
  ;;
I)
  step sync_test python3 -m pytest -q -p no:cacheprovider tests/gpu/test_sync_gpu.py
  step weight_sync python3 benchmarks/bench_weight_sync.py --model $M --bucket-mb 256,64 --reps 7 \
    --out "$OUT/weight_sync.json"
  ;;
esac
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpus.csv" 2>&1
