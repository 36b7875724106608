#!/usr/bin/env bash
# One `rlpost train` from another commit's tree (issue 38: the SmolLM2 recipe bit for bit before and after
# the reshape). The tree is `git archive COMMIT rlpost recipes configs pyproject.toml` unpacked in runs/trees/COMMIT
# (carried to the GPU machine); the run converts the GGUF into its own cache, so nothing is shared.
#   bash benchmarks/real_model/in_tree.sh COMMIT RUN_DIR overrides...
set -euo pipefail
TREE=$PWD/runs/trees/${1:?commit}; RUN=${2:?run folder}; shift 2
cd "$TREE"
PYTHONPATH=/tmp/site:$TREE exec python3 -m rlpost.cli train "$@" model.cache_dir=/tmp/cache_$(basename "$TREE") \
  logger.progress_bar=false logger.plot=false run.dir="$RUN"
