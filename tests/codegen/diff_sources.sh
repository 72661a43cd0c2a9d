#!/usr/bin/env bash
# The guard of code generation refactors: dumps the generated CPU and CUDA sources of the op corpus, the
# reduction corpus and the demo models (tests/codegen/dump_sources.cpp) at BASE_REF and at the working
# tree, and diffs them. Exit 0 when every file is byte-identical, 1 with the differences listed.
#
#   tests/codegen/diff_sources.sh [BASE_REF]      (default: main)
#
# The base is built in .guard/base/build (a git worktree and its own build folder, kept between runs; its
# paths relative to the build folder are the working tree's, so ccache makes the rebuild quick); the working tree's dump_sources comes from build/ (./run build).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BASE_REF="${1:-main}"
GUARD="$ROOT/.guard"
OUT="$GUARD/out"
VENV="${FUSION_JIT_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/fusion_jit/venv-torch-2.11.0}"
log() { printf '[diff_sources] %s\n' "$*" >&2; }

mkdir -p "$GUARD"
rm -rf "$OUT" && mkdir -p "$OUT/before" "$OUT/after" "$OUT/models"

log "the demo models"
"$VENV/bin/python" - "$OUT/models" <<'PY'
import sys
sys.path.insert(0, "examples")
from models import MODELS, make_models
paths = make_models(sys.argv[1])
with open(sys.argv[1] + "/args", "w") as f:
    for name, (_, specs) in MODELS.items():
        f.write("%s=%s:%s\n" % (name, paths[name], ",".join(specs)))
PY
mapfile -t MODEL_ARGS < "$OUT/models/args"

base_sha="$(git -C "$ROOT" rev-parse "$BASE_REF")"
if [ ! -d "$GUARD/base" ]; then git -C "$ROOT" worktree add --detach "$GUARD/base" "$base_sha" >/dev/null; fi
git -C "$GUARD/base" checkout -q --detach "$base_sha"
log "building dump_sources at $BASE_REF ($base_sha) in $GUARD/base/build"
if [ ! -f "$GUARD/base/build/CMakeCache.txt" ]; then
  torch_dir="$("$VENV/bin/python" -c 'import os,torch; print(os.path.dirname(torch.__file__))')"
  cmake -S "$GUARD/base" -B "$GUARD/base/build" -DCMAKE_BUILD_TYPE=Release -DFJ_TORCH_DIR="$torch_dir" \
    -DFJ_PYTHON="$VENV/bin/python" -DCMAKE_CXX_COMPILER_LAUNCHER=ccache >/dev/null
fi
cmake --build "$GUARD/base/build" -j"${FUSION_JIT_BUILD_JOBS:-2}" --target dump_sources >/dev/null
log "building dump_sources of the working tree"
cmake --build "$ROOT/build" -j"${FUSION_JIT_BUILD_JOBS:-2}" --target dump_sources >/dev/null

# The plan cache is off: every plan is generated now, by the build that is asked.
export FUSION_JIT_DISABLE=cache FUSION_JIT_LOG_LEVEL=error
log "dumping (base)"
"$GUARD/base/build/dump_sources" "$OUT/before" "${MODEL_ARGS[@]}"
log "dumping (working tree)"
"$ROOT/build/dump_sources" "$OUT/after" "${MODEL_ARGS[@]}"
if diff -rq "$OUT/before" "$OUT/after" >"$OUT/diff-files.txt"; then
  log "all $(ls "$OUT/after" | wc -l) files byte-identical"
  exit 0
fi
diff -ru "$OUT/before" "$OUT/after" >"$OUT/diff.txt" || true
log "$(wc -l <"$OUT/diff-files.txt") files differ (list: $OUT/diff-files.txt, diff: $OUT/diff.txt)"
head -40 "$OUT/diff-files.txt" >&2
exit 1
