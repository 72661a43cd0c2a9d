#!/usr/bin/env bash
# `pip install` of the repository into a fresh folder (the package's own CMake build of the native
# libraries), then torch.compile(backend="fusion_jit") in a process that never imports fusion_jit: the
# torch_dynamo_backends entry point must find it. Usage: pip_install_test.sh PYTHON WORKDIR
set -euo pipefail
PY="$1"; WORK="$2"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
rm -rf "$WORK"; mkdir -p "$WORK"
# --no-deps: torch is the environment's own; the native build goes to WORK/build (ccache makes it quick
# after ./run build).
FUSION_JIT_PIP_BUILD_DIR="$WORK/build" "$PY" -m pip install -q --disable-pip-version-check --no-deps \
  --target "$WORK/site" "$ROOT"
ls "$WORK/site/fusion_jit/lib/libfusion_jit_python.so" "$WORK/site/fusion_jit/lib/libfusion_jit.so"
cd "$WORK"
PYTHONPATH="$WORK/site" "$PY" - <<'PYEOF'
import sys
import torch
assert "fusion_jit" not in sys.modules
f = lambda x: torch.relu(x * 2.0) + 1.0
x = torch.randn(64, 64)
compiled = torch.compile(f, backend="fusion_jit")
compiled(x)
torch.testing.assert_close(compiled(x), f(x))
import fusion_jit
assert fusion_jit.__file__.startswith(sys.path[0]) or "/site/" in fusion_jit.__file__, fusion_jit.__file__
s = fusion_jit.stats()
assert s["plans"] == 1 and s["kernels"] == 1, s
print("pip-installed fusion_jit found through its entry point:", fusion_jit.__file__, s)
PYEOF
# Imported first, then looked up by name: registered once (through the entry point). Strict, so that a
# graph that ran eagerly fails here rather than comparing eager with eager.
FUSION_JIT_STRICT=1 PYTHONPATH="$WORK/site" "$PY" -c '
import torch, fusion_jit
f = torch.compile(lambda x: x.sigmoid() * x, backend="fusion_jit")
x = torch.randn(8)
f(x)
torch.testing.assert_close(f(x), x.sigmoid() * x)
assert fusion_jit.stats()["eager_graphs"] == 0 and fusion_jit.stats()["plans"] == 1, fusion_jit.stats()
print("import then torch.compile: ok")'
