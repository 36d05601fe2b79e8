#!/usr/bin/env bash
# Every GPU check and figure in one device call, written to $OUT/gpu-figures.txt.
#
# On this machine first: bash bench/gpu/prepare.sh (packs .gpu/call1 and .gpu/call2).
# Then two device calls back to back (the machine keeps files only while it is warm):
#   bash bench/gpu/run.sh stage      carrying .gpu/call1: stores the model's first part
#   bash bench/gpu/run.sh [STEP...]  carrying .gpu/call2: installs, converts the model,
#                                    runs the CUDA tests and every GPU benchmark
# STEP names a subset of the steps below (default: all of them).
set -uo pipefail
cd "$(dirname "$0")/../.."
stage=/root/tokenq-gpu
out=${OUT:-/tmp/tokenq-gpu-out}
mkdir -p "$stage" "$out"

if [[ "${1:-}" == stage ]]; then
  cp .gpu/call1/model.gguf.part1 "$stage/" && ls -la "$stage" && exit 0
  exit 1
fi

setup() {
  rm -rf /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .gpu/call2/wheels/*.whl || return 1
  mkdir -p /tmp/redis-bin && cp .gpu/call2/redis/* /tmp/redis-bin/ && chmod +x /tmp/redis-bin/redis-server
  local name; name=$(cat .gpu/call2/model.gguf.name)
  mkdir -p "$stage/gguf"
  cat "$stage/model.gguf.part1" .gpu/call2/model.gguf.part2 > "$stage/gguf/$name"
  echo "$(cat .gpu/call2/model.gguf.sha256)  $stage/gguf/$name" | sha256sum -c - || return 1
  python3 -c "
from pathlib import Path
from shared.settings import DEFAULT_MODEL
from worker.model_store import cache_dir, convert_gguf
target = cache_dir() / DEFAULT_MODEL
if not (target / 'model.safetensors').exists():
    convert_gguf(Path('$stage/gguf/$name'), target)
print('model at', target)"
}

export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export PATH=/tmp/redis-bin:$PATH LD_LIBRARY_PATH=/tmp/redis-bin:${LD_LIBRARY_PATH:-}
export TOKENQ_MODEL_CACHE_DIR=$stage/models HF_HUB_OFFLINE=1

# name, time limit in seconds, command
steps=(
  "cuda-tests|240|python3 -m pytest -m cuda -q -p no:cacheprovider --continue-on-collection-errors tests/worker/engine"
  "engine|300|python3 bench/engine.py --device cuda --repeat 10 --skip-static"
  "through-redis|300|python3 bench/through_redis.py --device cuda --repeat 10"
  "greedy|180|python3 bench/greedy_agreement.py --device cuda"
)

figures=$out/gpu-figures.txt
setup > "$out/setup.log" 2>&1 || { tail -n 20 "$out/setup.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
} 2>&1 | tee "$figures"
started=$SECONDS
for step in "${steps[@]}"; do
  IFS='|' read -r name limit_s cmd <<< "$step"
  if (( $# > 0 )) && [[ " $* " != *" $name "* ]]; then continue; fi
  echo "== $name: $cmd" | tee -a "$figures"
  timeout "$limit_s" bash -c "$cmd" > "$out/$name.log" 2>&1
  rc=$?
  tail -n 25 "$out/$name.log" >> "$figures"
  echo "== $name: exit $rc after $(( SECONDS - started )) s" | tee -a "$figures"
done
cat "$figures"
