#!/usr/bin/env bash
# The C++ API as a service consumes it: installs the build into a prefix (`cmake --install`), builds
# examples/cpp against the installed package as a separate CMake project (find_package(fusion_jit)), and
# runs it on a TorchScript model saved by the environment's torch: it must print a match with eager.
#   tests/install_test.sh BUILD_DIR PYTHON
# Works in BUILD_DIR/install-test (made anew each run; a fixed path lets ccache serve later runs).
set -euo pipefail
BUILD="$(cd "$1" && pwd)"
PYTHON="$2"
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="$BUILD/install-test"
rm -rf "$WORK"
mkdir -p "$WORK"

cmake --install "$BUILD" --prefix "$WORK/prefix" >"$WORK/install.log"
test -f "$WORK/prefix/include/fusion_jit/fusion_jit.h"
test -f "$WORK/prefix/lib/cmake/fusion_jit/fusion_jitConfig.cmake"

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# Only the prefix is given: the package finds Torch by itself.
cmake -S "$SRC/examples/cpp" -B "$WORK/build" -DCMAKE_PREFIX_PATH="$WORK/prefix" "${launcher[@]}" \
  >"$WORK/configure.log" 2>&1 || { cat "$WORK/configure.log"; exit 1; }
cmake --build "$WORK/build" -j2 >"$WORK/build.log" 2>&1 || { cat "$WORK/build.log"; exit 1; }

# torch.jit.script reads the module's source: the script is a file.
cat >"$WORK/make_model.py" <<'PY'
import sys
import torch

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(256)
        self.bias = torch.nn.Parameter(torch.randn(256))

    def forward(self, x):
        return torch.nn.functional.gelu(self.norm(x) + self.bias) * 0.5

torch.jit.script(Block().eval()).save(sys.argv[1])
PY
"$PYTHON" "$WORK/make_model.py" "$WORK/model.pt"

out="$("$WORK/build/fusion_jit_example" "$WORK/model.pt" 32 256)"
echo "$out"
grep -q "^match: yes" <<<"$out"
# The library the example runs is the installed one. (grep reads all of ldd's output: `grep -q` would stop
# at the match, and ldd, writing on, fail with SIGPIPE, which pipefail reports.)
ldd "$WORK/build/fusion_jit_example" | grep "$WORK/prefix/lib/libfusion_jit.so" >/dev/null
# An ahead-of-time package made by the installed CLI, served by examples/serve_package.cpp with no compiler
# and no cache directory.
"$WORK/prefix/bin/fusion-jit" package "$WORK/model.pt" --input 'f32[32,256]' --out "$WORK/model.fjpkg" >/dev/null
out="$(FUSION_JIT_ASSERT_NO_COMPILE=1 FUSION_JIT_CACHE_DIR="$WORK/no-cache" "$WORK/build/serve_package" "$WORK/model.fjpkg" 32 256 --save "$WORK/served.f32")"
echo "$out"
grep -q "^median of 50 calls" <<<"$out"
test ! -e "$WORK/no-cache"
# The served output against eager's on the same input (torch.testing's float32 tolerances).
"$PYTHON" - "$WORK/model.pt" "$WORK/served.f32" <<'PY'
import sys, torch
io = torch.from_file(sys.argv[2], size=2 * 32 * 256, dtype=torch.float32)
x, served = io[:32 * 256].view(32, 256), io[32 * 256:].view(32, 256)
with torch.no_grad():
    expected = torch.jit.load(sys.argv[1])(x)
torch.testing.assert_close(served, expected)
print("served output: eager's")
PY
echo "install test: passed"
