#!/usr/bin/env bash
# Every GPU check and figure in one device call, written to $OUT/gpu-figures.txt.
#
# On this machine first: bash bench/gpu/run.sh prepare (bench/gpu/prepare.sh: packs
# .gpu/call1 and .gpu/call2, each at most 60 MiB; the default model's GGUF alone is
# 94 MiB, 86 through xz, so it takes two folders). Then two device calls back to back
# (the machine keeps files only while it is warm):
#   bash bench/gpu/run.sh stage      carrying .gpu/call1: stores the model's first part
#   bash bench/gpu/run.sh [STEP...]  carrying .gpu/call2: installs, converts the model,
#                                    runs the CUDA tests and every GPU benchmark
# STEP names a subset of the steps below (default: all of them, most wanted first, so
# that a budget cut short drops the least); together they fit
# BUDGET_S seconds (default 540: a device call's 10 minutes with set-up).
# Here, on the CPU, LOCAL=1 DEVICE=cpu REPEAT=1 bash bench/gpu/run.sh STEP... runs the
# steps' Python with this checkout's virtualenv (no set-up), for a check of the script.
set -uo pipefail
cd "$(dirname "$0")/../.."
stage=/root/tokenq-gpu
out=${OUT:-/tmp/tokenq-gpu-out}
mkdir -p "$stage" "$out"

if [[ "${1:-}" == prepare ]]; then
  exec bash bench/gpu/prepare.sh
fi
if [[ "${1:-}" == stage ]]; then
  cp .gpu/call1/model.gguf.xz.part1 "$stage/" && ls -la "$stage" && exit 0
  exit 1
fi

setup() {
  rm -rf /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .gpu/call2/wheels/*.whl || return 1
  mkdir -p /tmp/redis-bin && cp .gpu/call2/redis/* /tmp/redis-bin/ && chmod +x /tmp/redis-bin/redis-server
  local name; name=$(cat .gpu/call2/model.gguf.name)
  mkdir -p "$stage/gguf"
  cat "$stage/model.gguf.xz.part1" .gpu/call2/model.gguf.xz.part2 | python3 -c \
    "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)" \
    > "$stage/gguf/$name"
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

dev=${DEVICE:-cuda}
repeat=${REPEAT:-10}
budget_s=${BUDGET_S:-540}
if [[ -n "${LOCAL:-}" ]]; then
  py=${PY:-.venv/bin/python}
else
  py=python3
  export PYTHONPATH=/tmp/site:$PWD
  export PATH=/tmp/redis-bin:$PATH LD_LIBRARY_PATH=/tmp/redis-bin:${LD_LIBRARY_PATH:-}
  export TOKENQ_MODEL_CACHE_DIR=$stage/models HF_HUB_OFFLINE=1
fi
export PYTHONUNBUFFERED=1

# name, time limit in seconds, command (the issue's GPU figures: the engine against its
# graph-replay ceiling at 256 sequences, asynchronous (the default) and not;
# generate_batch; critical TTFT saturated against idle; through Redis against the engine,
# the worker in one process and with its engine in a child process;
# greedy agreement on mixed32 with top-2 gaps; a Qwen3-shaped model against its own
# graph ceiling)
steps=(
  "engine|150|$py bench/engine.py --device $dev --repeat $repeat --skip-static"
  "engine-sync|60|$py bench/engine.py --device $dev --repeat $repeat --skip-priority --skip-static --skip-generate-batch --no-async-scheduling"
  "cuda-tests|150|$py -m pytest -m cuda -q -p no:cacheprovider --continue-on-collection-errors tests/worker/engine"
  "through-redis|150|$py bench/through_redis.py --device $dev --repeat $repeat --max-num-seqs 256 --engine-process both"
  "families|150|$py bench/families.py --device $dev --families llama,qwen3 --repeat $repeat"
  "greedy|90|$py bench/greedy_agreement.py --device $dev"
)

figures=$out/gpu-figures.txt
if [[ -z "${LOCAL:-}" ]]; then
  setup > "$out/setup.log" 2>&1 || { tail -n 20 "$out/setup.log"; exit 1; }
fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no GPU"
  $py -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} 2>&1 | tee "$figures"
started=$SECONDS
for step in "${steps[@]}"; do
  IFS='|' read -r name limit_s cmd <<< "$step"
  if (( $# > 0 )) && [[ " $* " != *" $name "* ]]; then continue; fi
  left_s=$(( budget_s - (SECONDS - started) ))
  if (( left_s < 20 )); then echo "== $name: skipped, the budget is spent" | tee -a "$figures"; continue; fi
  (( limit_s > left_s )) && limit_s=$left_s
  echo "== $name: $cmd" | tee -a "$figures"
  timeout "$limit_s" bash -c "$cmd" > "$out/$name.log" 2>&1
  rc=$?
  grep -v "Loading weights" "$out/$name.log" | tail -n 25 >> "$figures"
  echo "== $name: exit $rc after $(( SECONDS - started )) s" | tee -a "$figures"
done
cat "$figures"
