#!/usr/bin/env bash
# Packs what a lent GPU machine lacks into .gpu/ (git-ignored), for bench/gpu/run.sh.
#
# The device machine has CUDA builds of torch and triton but none of our other
# packages, no redis-server and no model (no hub, no PyPI). A device call carries at
# most 64 MiB, and the default model's GGUF alone is 94 MiB (86 MiB through xz), so the
# pack is two folders of at most 60 MiB, one per call, made back to back while the
# machine is warm:
#   .gpu/call1: the first part of the xz'd GGUF     (run.sh stage)
#   .gpu/call2: the rest of it, our wheels for Python 3.12, redis-server and the
#               libraries it needs that the device image lacks   (run.sh)
# Run from the repository root with the project's virtualenv made (make setup).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
out=.gpu
limit_mib=60
rm -rf "$out" && mkdir -p "$out/call1" "$out/call2/wheels" "$out/call2/redis"

# Our runtime and test dependencies at the versions this machine runs. The device
# image has torch, triton, numpy, accelerate, safetensors, pytest, typer, rich and a
# huggingface_hub that our transformers accepts (ours would need httpx2 as well).
packages=(transformers tokenizers redis hiredis pydantic pydantic_core
  pydantic-settings annotated-types typing-inspection python-dotenv orjson rq croniter gguf
  fakeredis pytest-asyncio jsonschema jsonschema-specifications referencing rpds-py
  typing_extensions regex xgrammar apache-tvm-ffi)
pins=()
for name in "${packages[@]}"; do
  pins+=("$name==$("$PY" -c "import importlib.metadata as m; print(m.version('$name'))")")
done
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
  platforms+=(--platform "$p")
done
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" -d "$out/call2/wheels" "${pins[@]}"

# Debian's redis-server and the libraries of it that an Ubuntu CUDA image lacks.
cp "$(command -v redis-server)" "$out/call2/redis/"
for lib in liblzf.so.1 libjemalloc.so.2; do
  cp -L "/lib/x86_64-linux-gnu/$lib" "$out/call2/redis/"
done

gguf=$("$PY" -c "from worker.model_store import find_default_gguf; print(find_default_gguf())")
used_kib=$(du -sk "$out/call2" | cut -f1)
first_kib=$(( limit_mib * 1024 - 256 ))
xz -6 -T2 -c "$gguf" > "$out/model.gguf.xz"
head -c $(( first_kib * 1024 )) "$out/model.gguf.xz" > "$out/call1/model.gguf.xz.part1"
tail -c +$(( first_kib * 1024 + 1 )) "$out/model.gguf.xz" > "$out/call2/model.gguf.xz.part2"
rm "$out/model.gguf.xz"
(cd "$(dirname "$gguf")" && sha256sum "$(basename "$gguf")") | cut -d' ' -f1 > "$out/call2/model.gguf.sha256"
basename "$gguf" > "$out/call2/model.gguf.name"
for dir in "$out/call1" "$out/call2"; do
  mib=$(( $(du -sk "$dir" | cut -f1) / 1024 ))
  echo "$dir: $mib MiB"
  if (( mib > limit_mib )); then echo "$dir is over $limit_mib MiB" >&2; exit 1; fi
done
echo "wheels and redis: $(( used_kib / 1024 )) MiB; now: device run 'bash bench/gpu/run.sh stage' carrying .gpu/call1,"
echo "then at once 'bash bench/gpu/run.sh' carrying .gpu/call2"
