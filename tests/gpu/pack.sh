#!/usr/bin/env bash
# Builds the programs tests/gpu/run.sh runs (gpu_tests, bench_cuda, fusion-jit, the Python package's native
# library) in ./build and
# copies them into .gpu-prebuilt/ (ignored by git) with the shared libraries of this machine they need
# that a GPU machine may lack (libfusion_jit, fmt, Google Benchmark, hiredis, OpenSSL's libcrypto) and the torch
# version they were built against. Carry .gpu-prebuilt and run FJ_GPU_PREBUILT=.gpu-prebuilt tests/gpu/run.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${FJ_PYTHON:-$HOME/.cache/fusion_jit/venv-torch-2.11.0/bin/python}"
cmake --build "$ROOT/build" -j2 --target gpu_tests bench_cuda fusion-jit fusion_jit fusion_jit_python
PACK="$ROOT/.gpu-prebuilt"
rm -rf "$PACK" && mkdir -p "$PACK/lib" "$PACK/lib-fallback"
cp "$ROOT"/build/{gpu_tests,bench_cuda,fusion-jit} "$PACK/"
cp "$ROOT/build/libfusion_jit.so" "$ROOT/build/libfusion_jit_python.so" "$PACK/lib/"
libpath() { ldd "$ROOT/build/bench_cuda" "$ROOT/build/gpu_tests" | awk -v l="$1" '$1 == l {print $3; exit}'; }
for lib in libfmt.so.9 libbenchmark.so.1debian libhiredis.so.0.14; do cp -L "$(libpath $lib)" "$PACK/lib/"; done
cp -L "$(libpath libcrypto.so.3)" "$PACK/lib-fallback/"   # used only where the GPU machine has none
"$PY" -c 'import torch; print(torch.__version__)' > "$PACK/torch_version"
du -sh "$PACK"
