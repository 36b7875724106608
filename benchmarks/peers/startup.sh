#!/usr/bin/env bash
# Issue 43: where rlpost's start-up goes on one GPU (benchmarks/peers/startup.py's parts, each in a fresh
# process, one after another), then one rlpost_fast job with vLLM's info lines on (its engine's own phases).
# On the GPU machine, from the repository root, after ../shared/tools/gpu-install.sh's parts:
#   COMMIT=<sha> bash benchmarks/peers/startup.sh [VARIANT ...]   # default: every engine variant
# PARTS (default "ray trainer engine job") picks the parts; each engine's main-thread stacks are sampled every
# 0.2 s into $W/engine_VARIANT.stacks.jsonl (in the archive).
# Writes $OUT/startup.json (commit, machine, date, command, one record a part) and $OUT/startup.tar.gz (logs).
set -uo pipefail
SEED=${SEED:-1}; source benchmarks/peers/peers.sh  # install, describe, prepare, run_job
W=/tmp/peers/startup; TASK=$W/task; mkdir -p "$W" "$OUT"
VARIANTS=("$@"); [ ${#VARIANTS[@]} -gt 0 ] || VARIANTS=(rlpost chunked nosleep both trl)
install; describe; prepare
part() {  # part NAME ARGS...: one part in a fresh process, its log kept, its record appended
  local name=$1; shift
  echo "$(date -u +%T) $name"
  VLLM_LOGGING_LEVEL=INFO timeout 240 python3 benchmarks/peers/startup.py "$@" --model "$MODEL" > "$W/$name.log" 2>&1
  grep '^startup ' "$W/$name.log" | sed 's/^startup //' >> "$W/parts.jsonl" || tail -n 5 "$W/$name.log"
}
PARTS=${PARTS:-ray trainer engine job}
[[ " $PARTS " == *" ray "* ]] && part ray ray
[[ " $PARTS " == *" trainer "* ]] && part trainer trainer --set model.attn_implementation=rlpost_varlen
if [[ " $PARTS " == *" engine "* ]]; then
  for v in "${VARIANTS[@]}"; do part "engine_$v" engine "$v" --stacks "$W/engine_$v.stacks.jsonl"; done
fi
[[ " $PARTS " == *" job "* ]] && VLLM_LOGGING_LEVEL=INFO run_job rlpost_fast 0
python3 - "$W" "$OUT/startup.json" "COMMIT=${COMMIT:-unknown} bash benchmarks/peers/startup.sh $*" <<'PY'
import json, sys
from pathlib import Path
w, out, command = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
read = lambda name: (w / name).read_text().strip()
parts = [json.loads(x) for x in read("parts.jsonl").splitlines()]
job = w / "rlpost_fast.log"
line = [x.split("\t", 1)[1] for x in job.read_text().splitlines() if "\tstart-up " in x] if job.exists() else []
record = {"commit": read("commit.txt"), "machine": read("machine.txt"), "date": read("date.txt"), "command": command,
          "parts": parts, "rlpost_fast_start_up": line}
Path(out).write_text(json.dumps(record, indent=1) + "\n")
print(json.dumps(record, indent=1))
PY
tar -czf "$OUT/startup.tar.gz" --exclude=task -C /tmp/peers startup
