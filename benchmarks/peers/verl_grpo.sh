#!/usr/bin/env bash
# Issue 43: verl 0.9.1 (GRPO, FSDP2 actor, vLLM colocated: its "hybrid engine") on rlpost's smollm2_sums task.
#   TASK=/tmp/peers_task MODEL=<converted SmolLM2 folder> OUTDIR=/tmp/runs/verl STEPS=20 SEED=0 NGPUS=1 [VAL_EVERY=10] \
#     bash benchmarks/peers/verl_grpo.sh [more Hydra overrides]
# NGPUS=2: the same global batch on 2 GPUs (FSDP2 world 2, two vLLM replicas of TP 1).
# DRY=1: print the composed config (Hydra's --cfg job) and exit; DRY=check: compose it and run verl's own
# validate_config and typed configs (what main_ppo checks before any worker starts). Both run on a CPU.
# TRL must not be importable here (verl's monkey patch imports a class TRL 1.16 no longer has: PLAN.md).
#
# The task's values come from export_task.py's task.env (rlpost's composed config of the recipe); the rows are
# rlpost's, in its batch order for SEED (data.shuffle=False); the reward is rlpost's scorer (sums_reward.py).
# Settings that verl's own docs and example scripts recommend (docs/perf/perf_tuning.rst,
# examples/grpo_trainer/run_qwen3_4b_fsdp.sh of release/v0.9.0), each with its reason, are marked [verl].
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
: "${TASK:?export_task.py folder}" "${MODEL:?converted model folder}" "${OUTDIR:?output folder}"
STEPS=${STEPS:-20}; SEED=${SEED:-0}; NGPUS=${NGPUS:-1}
source "$TASK/task.env"   # TASK_* from rlpost's config
VAL_EVERY=${VAL_EVERY:-$TASK_VAL_EVERY}
mkdir -p "$OUTDIR"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false RAY_DEDUP_LOGS=0
export VERL_FILE_LOGGER_PATH=$OUTDIR/verl_metrics.jsonl   # trainer.logger "file": one JSON line a step
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

ARGS=(
  # --- algorithm: rlpost's GRPO
  algorithm.adv_estimator=grpo
  algorithm.norm_adv_by_std_in_grpo=$TASK_NORM_ADV_BY_STD          # (r - mean) / (std + 1e-6), as rlpost
  algorithm.use_kl_in_reward=False                                  # rlpost kl_coef 0: no KL anywhere,
  actor_rollout_ref.actor.use_kl_loss=False                         # so no reference model is built
  algorithm.rollout_correction.rollout_is=$TASK_ROLLOUT_IS          # rlpost algo.rollout_is=token: truncated IS
  algorithm.rollout_correction.rollout_is_threshold=$TASK_ROLLOUT_IS_THRESHOLD  # weights min(pi_old/pi_vllm, 2)
  # --- data: rlpost's rows, in its order; one optimizer step per batch of 64 prompts x 8
  data.train_files=$TASK/train_s$SEED.parquet
  data.val_files=$TASK/val.parquet
  data.train_batch_size=$TASK_PROMPTS_PER_STEP                      # prompts a step (verl counts prompts)
  data.max_prompt_length=$TASK_MAX_PROMPT_LENGTH                    # 64 (the longest prompt has 46 tokens)
  data.max_response_length=$TASK_MAX_RESPONSE_LENGTH                # 128, the response cap (and validation's)
  data.shuffle=False                                                # the file is already in rlpost's batch order
  data.filter_overlong_prompts=True data.truncation=error          # [verl] as its examples (none is dropped)
  # --- model
  actor_rollout_ref.model.path=$MODEL
  actor_rollout_ref.model.use_remove_padding=True                   # [verl] padding removal (sequence packing)
  +actor_rollout_ref.model.override_config.attn_implementation=$TASK_ATTN_IMPLEMENTATION  # sdpa: no flash-attn
  # wheel exists for this machine (verl defaults to flash_attention_2); transformers 5.17 masks packed
  # sequences from their position_ids, and rlpost runs sdpa too
  actor_rollout_ref.model.enable_gradient_checkpointing=False       # [verl] examples turn it on to fit big
  # models; at 135M it only costs time, and rlpost and TRL (as set) recompute nothing
  # --- actor: FSDP2, float32 master weights, bf16 compute (verl's defaults: model_dtype fp32, mixed precision
  # param bf16 / reduce fp32), as rlpost's FSDP2 engine
  actor_rollout_ref.actor.strategy=fsdp2                            # [verl] perf_tuning.rst, "Migrating to FSDP2"
  actor_rollout_ref.actor.fsdp_config.param_offload=False
  actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
  actor_rollout_ref.actor.ppo_mini_batch_size=$TASK_PROMPTS_PER_STEP  # the whole batch: one optimizer step
  actor_rollout_ref.actor.ppo_epochs=$TASK_PPO_EPOCHS               # one pass: ratio 1, as rlpost
  actor_rollout_ref.actor.use_dynamic_bsz=True                      # [verl] micro-batches packed to a token budget
  actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384           # [verl] >= 2 x (64 + 128) and as large as
  # fits; 16384 is verl's default, about rlpost's 128-sequence micro-batch (early responses: ~90 tokens a
  # sequence), and keeps SDPA's packed mask (nnz x nnz booleans) at 256 MiB
  actor_rollout_ref.actor.loss_agg_mode=$TASK_LOSS_AGG_MODE        # token-mean over the mini-batch's tokens
  actor_rollout_ref.actor.clip_ratio_low=$TASK_CLIP_RATIO_LOW actor_rollout_ref.actor.clip_ratio_high=$TASK_CLIP_RATIO_HIGH
  actor_rollout_ref.actor.clip_ratio_c=$TASK_CLIP_RATIO_C           # dual clip 3, as rlpost (verl's default)
  actor_rollout_ref.actor.entropy_coeff=$TASK_ENTROPY_COEF
  actor_rollout_ref.actor.grad_clip=$TASK_GRAD_CLIP
  actor_rollout_ref.actor.optim.lr=$TASK_LR
  actor_rollout_ref.actor.optim.weight_decay=$TASK_WEIGHT_DECAY     # 0 (verl's default is 0.01)
  actor_rollout_ref.actor.optim.clip_grad=$TASK_GRAD_CLIP
  # rlpost's warm-up: lr x (k + 1) / 5 at optimizer step k = 0..4, then constant. verl's "constant" schedule
  # starts at 0 (k / 5); its cosine schedule with zero_indexed_step=False counts from 1 and, with
  # min_lr_ratio=1, never decays: exactly rlpost's factor (verl/utils/torch_functional.py)
  actor_rollout_ref.actor.optim.lr_warmup_steps=$TASK_WARMUP_STEPS
  actor_rollout_ref.actor.optim.lr_scheduler_type=cosine
  actor_rollout_ref.actor.optim.min_lr_ratio=1.0
  actor_rollout_ref.actor.optim.zero_indexed_step=False
  # --- rollout: vLLM, colocated (asleep while the actor trains), the recipe's sampling
  actor_rollout_ref.rollout.name=vllm
  actor_rollout_ref.rollout.n=$TASK_GROUP_SIZE
  actor_rollout_ref.rollout.tensor_model_parallel_size=1            # one replica per GPU (verl's default is 2)
  actor_rollout_ref.rollout.gpu_memory_utilization=$TASK_GPU_MEMORY_UTILIZATION  # 0.3, as rlpost and TRL
  actor_rollout_ref.rollout.temperature=$TASK_TEMPERATURE actor_rollout_ref.rollout.top_p=$TASK_TOP_P
  actor_rollout_ref.rollout.top_k=-1                                # vLLM's "off" (rlpost's top_k 0)
  actor_rollout_ref.rollout.free_cache_engine=True                  # [verl] sleep between generations
  actor_rollout_ref.rollout.enforce_eager=False                     # [verl] CUDA graphs (rlpost and TRL too)
  actor_rollout_ref.rollout.seed=$SEED
  actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True           # [verl] its log-prob micro-batching: the
  actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=32768    # old log-probs' forward packed to a token
  # budget, 2 x the update's ("forward-only parameters can be larger", perf_tuning.rst)
  # --- reward: rlpost's scorer
  reward.custom_reward_function.path=$HERE/sums_reward.py
  reward.custom_reward_function.name=compute_score
  # --- trainer: validation (greedy: verl's val_kwargs default) at step 0 and every 10 steps
  trainer.val_before_train=True trainer.test_freq=$VAL_EVERY
  trainer.total_training_steps=$STEPS trainer.total_epochs=1
  trainer.save_freq=-1 trainer.resume_mode=disable trainer.default_local_dir=$OUTDIR/ckpt
  trainer.logger=[console,file] trainer.project_name=peers trainer.experiment_name=verl_s$SEED
  trainer.n_gpus_per_node=$NGPUS trainer.nnodes=1
)
[ "${DRY:-0}" = 1 ] && exec python3 -m verl.trainer.main_ppo "${ARGS[@]}" "$@" --cfg job
if [ "${DRY:-0}" = check ]; then exec python3 - "${ARGS[@]}" "$@" <<'PY'
import os, sys
from hydra import compose, initialize_config_dir
import verl.trainer
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import omega_conf_to_dataclass, validate_config
with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.trainer.__file__), "config"), version_base=None):
    cfg = compose(config_name="ppo_trainer", overrides=sys.argv[1:])
validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
typed = [omega_conf_to_dataclass(c) for c in (cfg.algorithm, cfg.actor_rollout_ref.rollout)]  # (actor: validate_config)
print("verl config OK: reference", need_reference_policy(cfg), "critic", need_critic(cfg), [type(t).__name__ for t in typed])
PY
fi
python3 -c "import trl" 2>/dev/null && { echo "trl is importable: keep it off PYTHONPATH for verl" >&2; exit 2; }
exec python3 -m verl.trainer.main_ppo "${ARGS[@]}" "$@"
