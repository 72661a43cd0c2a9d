#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU and its own torch 2.11 (the H200 machine: python3 is
# /opt/torch/.venv/bin/python3). Builds there, runs the gpu tests, CUDA fuzz batches (sizes as literals and
# as kernel arguments), the demo models on
# cuda, the demo models' CUDA packages, the torch.compile backend on five Python-test models (the language
# models also at eight sequence lengths, through one plan of their shape class) and the GPU
# benchmarks, and prints a short table last. Every step runs whatever failed before it; the script then
# names each step that failed (a failing or skipped-for-want-of-a-GPU test, a fuzz failure, a model that
# differs from eager, a step stopped at its limit) and exits 1, else prints "every step passed" and exits
# 0. With every gpu test it took 290 s on the H200 (the op and
# reduction corpora, about 150 cases each compiled by NVRTC, run in 4 shards beside the other steps).
#
#   tests/gpu/run.sh            (full logs and JSON under $OUT when set, else build-gpu/out)
#   FJ_GPU_TEST_FILTER=...      a gtest filter for the gpu tests (default: all of them, the corpora sharded)
#
# Debian packages the build needs (fmt, GoogleTest, Google Benchmark, nlohmann-json, OpenSSL headers)
# are used from the system when present, else from .debs/ in the checkout (tests/gpu/fetch_debs.sh
# downloads them on a build machine; carry .debs with the call), unpacked under /tmp/fj-deps.
#
# Device time is short: tests/gpu/pack.sh builds the four programs here, against this machine's torch
# (the same 2.11.0+cu130 wheel), into .gpu-prebuilt/ with the shared libraries they need beside them. Carry
# that folder and run `FJ_GPU_PREBUILT=.gpu-prebuilt tests/gpu/run.sh`: the build step is skipped, the
# programs find the GPU machine's torch through LD_LIBRARY_PATH. A pack made for another torch is refused.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$ROOT/build-gpu"
OUT="${OUT:-$BUILD/out}"
mkdir -p "$BUILD" "$OUT"
PY="${FJ_GPU_PYTHON:-python3}"
step() { printf '\n== %s (%s)\n' "$*" "$(date +%T)"; }

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
TORCH_DIR="$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())'

PREFIX_ARGS=()
if [ -d "$ROOT/.debs" ] && ! [ -f /usr/include/fmt/format.h ]; then
  step "unpacking carried Debian packages"
  DEPS=/tmp/fj-deps
  for f in "$ROOT"/.debs/*.deb; do dpkg -x "$f" "$DEPS"; done
  export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  PREFIX_ARGS=(-DCMAKE_PREFIX_PATH="$DEPS/usr" -DOPENSSL_ROOT_DIR="$DEPS/usr")
fi

if [ -n "${FJ_GPU_PREBUILT:-}" ]; then
  step "prebuilt programs from $FJ_GPU_PREBUILT"
  BUILD="$(cd "$FJ_GPU_PREBUILT" && pwd)"
  HERE_TORCH="$("$PY" -c 'import torch; print(torch.__version__)')"
  PACK_TORCH="$(cat "$BUILD/torch_version")"
  [ "$HERE_TORCH" = "$PACK_TORCH" ] || { echo "pack built for torch $PACK_TORCH, this machine has $HERE_TORCH"; exit 1; }
  NV="$(dirname "$TORCH_DIR")/nvidia/cu13/lib"
  export LD_LIBRARY_PATH="$TORCH_DIR/lib:$NV:$BUILD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # OpenSSL's libcrypto from the pack only where the machine has none (python's own ssl needs its own).
  ldconfig -p | grep -q 'libcrypto.so.3 ' || export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$BUILD/lib-fallback"
  [ -d /usr/local/cuda/include ] && export FUSION_JIT_CUDA_HOME="${FUSION_JIT_CUDA_HOME:-/usr/local/cuda}"
  ldd "$BUILD/gpu_tests" | grep "not found" || true
else
step "build"
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DFJ_TORCH_DIR="$TORCH_DIR" -DFJ_PYTHON="$(command -v "$PY")" \
  "${PREFIX_ARGS[@]}" > "$OUT/cmake.log"
cmake --build "$BUILD" -j"$(nproc)" --target unit_tests gpu_tests bench_cuda fusion-jit fusion_jit_python > "$OUT/build.log" 2>&1 ||
  { tail -40 "$OUT/build.log"; exit 1; }
fi

# Every step runs, whatever failed before it; the steps that failed are named at the end, and then the script
# exits 1 (issue 72: it used to end with its table and status 0 whatever failed).
FAILED_STEPS=()

step "unit tests"
if [ -n "${FJ_GPU_PREBUILT:-}" ]; then
  echo "skipped: the pack's unit tests ran where it was built (their data paths are that checkout's)"
else
  "$BUILD/unit_tests" --gtest_brief=1 > "$OUT/unit_tests.log" 2>&1 && echo ok || { tail -30 "$OUT/unit_tests.log"; FAILED_STEPS+=("unit tests"); }
fi

step "gpu tests"
set +e
# The op and reduction corpora compile a kernel per case and dtype: they take 4 CPU cores in 4 shards (each
# with its own kernel cache) and run beside the steps up to the benchmarks, which wait for them.
CORPORA='AllOps/*:AllReductions/*'
FILTER="${FJ_GPU_TEST_FILTER:-*}"
CORPUS_PIDS=()
if [ "$FILTER" = "*" ]; then
  FILTER="-$CORPORA"
  for i in 0 1 2 3; do
    FUSION_JIT_CACHE_DIR="$BUILD/corpus-cache$i" GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i timeout 300 \
      "$BUILD/gpu_tests" --gtest_filter="$CORPORA" --gtest_output="json:$OUT/corpus$i.json" > "$OUT/corpus$i.log" 2>&1 &
    CORPUS_PIDS+=($!)
  done
fi
# Every test's line goes to the log, so that a run stopped by the limit still says how far it got (the JSON
# report is written only at the end).
timeout 330 "$BUILD/gpu_tests" --gtest_filter="$FILTER" --gtest_output="json:$OUT/gpu_tests.json" > "$OUT/gpu_tests.log" 2>&1
GPU_RC=$?
grep -E '^\[  FAILED  \]|^\[==========\]|^\[  PASSED  \]' "$OUT/gpu_tests.log" | tail -20
[ "$GPU_RC" = 124 ] && echo "stopped at the limit: $(grep -c '^\[       OK \]' "$OUT/gpu_tests.log") tests passed, last started: $(grep '^\[ RUN      \]' "$OUT/gpu_tests.log" | tail -1)"

step "fuzz on cuda"
timeout 80 "$BUILD/fusion-jit" fuzz --device cuda --minutes 1 --seed 11 --out "$BUILD/fuzz-repros" > "$OUT/fuzz.log" 2>&1
FUZZ_RC=$?
tail -4 "$OUT/fuzz.log"
# One file, not one per repro: what comes back from a GPU machine is counted in files.
[ -d "$BUILD/fuzz-repros" ] && tar -czf "$OUT/fuzz-repros.tgz" -C "$BUILD" fuzz-repros

step "fuzz on cuda with sizes as kernel arguments"
FUSION_JIT_DYNAMIC=on timeout 80 "$BUILD/fusion-jit" fuzz --device cuda --minutes 1 --seed 5 --second-size \
  --out "$BUILD/fuzz-repros-dynamic" > "$OUT/fuzz_dynamic.log" 2>&1
FUZZ_DYN_RC=$?
tail -4 "$OUT/fuzz_dynamic.log"
[ -d "$BUILD/fuzz-repros-dynamic" ] && tar -czf "$OUT/fuzz-repros-dynamic.tgz" -C "$BUILD" fuzz-repros-dynamic

step "demo models on cuda"
"$PY" - "$ROOT" "$BUILD/fusion-jit" > "$OUT/demo.log" 2>&1 <<'PYEOF'
import json, subprocess, sys, tempfile
sys.path.insert(0, sys.argv[1] + "/examples")
from models import make_models, MODELS
paths = make_models(tempfile.mkdtemp())
failed = False
for name, (_, specs) in MODELS.items():
    p = subprocess.run([sys.argv[2], "run", paths[name], "--input", *specs, "--device", "cuda", "--check",
                        "--bench", "50", "--json"], capture_output=True, text=True, timeout=60)
    print(name, p.stdout.strip() or p.stderr.strip()[-2000:])
    failed = failed or p.returncode != 0
sys.exit(1 if failed else 0)
PYEOF
DEMO_RC=$?
cat "$OUT/demo.log"

step "packages on cuda"
# Each demo model packaged for this GPU (its CUBIN and PTX) from CPU inputs, loaded in a fresh process that
# may not compile, and compared with eager on cuda.
"$PY" - "$ROOT" "$BUILD/fusion-jit" > "$OUT/packages.log" 2>&1 <<'PYEOF'
import os, re, subprocess, sys, tempfile, torch
sys.path.insert(0, sys.argv[1] + "/examples")
from models import make_models, MODELS
tmp = tempfile.mkdtemp()
paths = make_models(tmp)
major, minor = torch.cuda.get_device_capability(0)
failed = False
for name, (_, specs) in MODELS.items():
    try:
        torch.manual_seed(0)
        shapes = [[int(d) for d in s[s.index("[") + 1:-1].split(",")] for s in specs]
        inputs = [torch.randn(*sh) for sh in shapes]
        ins, pkg, outs = (os.path.join(tmp, f"{name}.{e}") for e in ("in.pt", "fjpkg", "out.pt"))
        torch.save(inputs, ins)
        p = subprocess.run([sys.argv[2], "package", paths[name], "--inputs", ins, "--device", "cuda", "--arch",
                            f"sm_{major}{minor}", "--out", pkg], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-1500:]
        env = dict(os.environ, FUSION_JIT_ASSERT_NO_COMPILE="1")
        p = subprocess.run([sys.argv[2], "load", pkg, "--inputs", ins, "--bench", "50", "--save-outputs", outs],
                           capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 0, p.stderr[-1500:]
        got = torch.load(outs)
        model = torch.jit.load(paths[name]).cuda().eval()
        with torch.no_grad():
            ref = model(*[t.cuda() for t in inputs])
        ref = [ref] if isinstance(ref, torch.Tensor) else list(ref)
        diff = max((g - r.cpu()).abs().max().item() for g, r in zip(got, ref))
        close = all(torch.allclose(g, r.cpu(), rtol=1e-3, atol=1e-3) for g, r in zip(got, ref))
        nums = {k: float(re.search(rx, p.stdout).group(1)) for k, rx in
                [("load", r"loaded .* in ([0-9.]+) ms"), ("first", r"first call ([0-9.]+) ms"), ("median", r"median call ([0-9.]+) ms")]}
        print(name, f"{'ok' if close else 'MISMATCH'}: max |diff| vs eager {diff:.2e}, load {nums['load']:.1f} ms, "
                    f"first call {nums['first']:.2f} ms, median {nums['median']:.3f} ms")
        failed = failed or not close
    except Exception as e:  # noqa: BLE001
        print(name, "FAILED:", str(e).strip().replace("\n", " ")[-600:])
        failed = True
sys.exit(1 if failed else 0)
PYEOF
PKG_RC=$?
cat "$OUT/packages.log"

step "torch.compile backend on cuda"
# The Python tests' models through torch.compile(backend="fusion_jit") on the GPU, both settings, then the
# language models at eight sequence lengths (CUDA plans of a shape class; about 10 s each on the CPU).
NATIVE="$BUILD/libfusion_jit_python.so"
[ -f "$NATIVE" ] || NATIVE="$BUILD/lib/libfusion_jit_python.so"
FUSION_JIT_LIBRARY="$NATIVE" timeout 170 "$PY" "$ROOT/tests/gpu/backend_cuda.py" cuda \
  resnet18,timm_regnetx_002,bert_tiny,gpt2_tiny,llama_tiny > "$OUT/backend.log" 2> "$OUT/backend.err"
BACKEND_RC=$?
cat "$OUT/backend.log"

step "benchmarks"
CORPUS_RC=0
for pid in "${CORPUS_PIDS[@]}"; do wait "$pid" || CORPUS_RC=$?; done
timeout 150 "$BUILD/bench_cuda" --benchmark_format=json --benchmark_min_time=0.5 > "$OUT/bench_cuda.json" 2> "$OUT/bench_cuda.log"
BENCH_RC=$?
set -e

step "summary"
"$PY" - "$OUT" "$GPU_RC" "$FUZZ_RC" "$BENCH_RC" "$FUZZ_DYN_RC" "${#CORPUS_PIDS[@]}" "$CORPUS_RC" <<'PYEOF'
import json, os, re, sys
out, gpu_rc, fuzz_rc, bench_rc, fuzz_dyn_rc, shards, corpus_rc = sys.argv[1], *sys.argv[2:8]
rows = []
def gtest_row(label, names, rc):
    try:
        tests = [t for n in names for s in json.load(open(os.path.join(out, f"{n}.json")))["testsuites"]
                 for t in s["testsuite"]]
        failed = [t["name"] for t in tests if t.get("failures")]
        skipped = sum(1 for t in tests if t.get("result") == "SKIPPED")
        rows.append((label, f"{len(tests) - len(failed) - skipped} passed, {len(failed)} failed, {skipped} skipped "
                            f"(rc {rc}){': ' + ', '.join(failed[:5]) if failed else ''}"))
    except Exception as e:  # noqa: BLE001
        logs = "".join(open(os.path.join(out, f"{n}.log")).read() for n in names
                       if os.path.exists(os.path.join(out, f"{n}.log")))
        rows.append((label, f"no report ({e}), rc {rc}: {logs.count('[       OK ]')} passed, "
                            f"{logs.count('[  FAILED  ]')} failed before it stopped"))
gtest_row("gpu tests", ["gpu_tests"], gpu_rc)
if int(shards):
    gtest_row("gpu corpora (4 shards)", [f"corpus{i}" for i in range(int(shards))], corpus_rc)
for label, log, rc in [("fuzz on cuda", "fuzz.log", fuzz_rc), ("fuzz on cuda, sizes as arguments", "fuzz_dynamic.log", fuzz_dyn_rc)]:
    fz = open(os.path.join(out, log)).read() if os.path.exists(os.path.join(out, log)) else ""
    m = re.search(r"(\d+) graphs .*?; (\d+) failures", fz)
    rows.append((label, f"{m.group(1)} graphs, {m.group(2)} failures" if m else f"rc {rc}"))
for line in open(os.path.join(out, "demo.log")):
    name, _, rest = line.partition(" ")
    try:
        j = json.loads(rest)
        rows.append((f"demo {name}", f"check {j['check']}, eager {j['eager_ms']:.3f} ms, fused {j['fused_ms']:.3f} ms, "
                                     f"{j['eager_ms'] / j['fused_ms']:.2f}x, compile {j['compile_ms']:.0f} ms"))
    except Exception:  # noqa: BLE001
        rows.append((f"demo {name}", rest.strip()[:100]))
for line in open(os.path.join(out, "packages.log")) if os.path.exists(os.path.join(out, "packages.log")) else []:
    name, _, rest = line.partition(" ")
    rows.append((f"package {name}", rest.strip()[:140]))
for line in open(os.path.join(out, "backend.log")) if os.path.exists(os.path.join(out, "backend.log")) else []:
    head, _, rest = line.partition(": ")
    rows.append((f"backend {head}", rest.strip()[:150]))
try:
    b = {x["name"].split("/")[0]: x for x in json.load(open(os.path.join(out, "bench_cuda.json")))["benchmarks"]}
    gbs = lambda n: b[n]["bytes_per_second"] / 1e9
    rows.append(("copy 256M f32", f"{gbs('BM_CudaCopy'):.0f} GB/s"))
    rows.append(("6-op chain eager", f"{gbs('BM_CudaChainEager'):.0f} GB/s"))
    rows.append(("6-op chain fused", f"{gbs('BM_CudaChainFused'):.0f} GB/s = {100 * gbs('BM_CudaChainFused') / gbs('BM_CudaCopy'):.0f}% of copy (bar 80%)"))
    for pat in ["Softmax", "LayerNorm", "RmsNorm", "LogSoftmax", "MeanVar", "GeluMean"]:
        fe, ff = f"BM_Cuda{pat}Eager", f"BM_Cuda{pat}Fused"
        rows.append((f"{pat} fused", f"{gbs(ff):.0f} GB/s = {100 * gbs(ff) / gbs('BM_CudaCopy'):.0f}% of copy (bar 80%), "
                                     f"{b[fe]['real_time'] / b[ff]['real_time']:.2f}x eager ({b[ff].get('label', '')})"))
    for pat in ["Softmax", "LayerNorm", "TransposedAdd"]:
        fd, ff = f"BM_Cuda{pat}Dynamic", f"BM_Cuda{pat}Fused"
        rows.append((f"{pat} sizes as arguments", f"{b[fd]['real_time'] / b[ff]['real_time']:.3f}x the literal plan's time (bar 1.10)"))
    e, r = b["BM_CudaLaunchesEager"]["host_us"], b["BM_CudaReplay"]["host_us"]
    rows.append(("10-kernel plan, host/call", f"replay {r:.1f} us (bar 15), eager launches {e:.1f} us"))
except Exception as e:  # noqa: BLE001
    rows.append(("benchmarks", f"no report ({e}), rc {bench_rc}"))
w = max(len(k) for k, _ in rows)
for k, v in rows:
    print(f"{k:<{w}}  {v}")
PYEOF

for step_rc in "gpu tests:$GPU_RC" "gpu corpora:$CORPUS_RC" "fuzz on cuda:$FUZZ_RC" \
               "fuzz on cuda, sizes as arguments:$FUZZ_DYN_RC" "demo models:$DEMO_RC" "packages:$PKG_RC" \
               "torch.compile backend:$BACKEND_RC" "benchmarks:$BENCH_RC"; do
  [ "${step_rc##*:}" = 0 ] || FAILED_STEPS+=("${step_rc%:*} (status ${step_rc##*:})")
done
if [ "${#FAILED_STEPS[@]}" -gt 0 ]; then
  printf 'FAILED: %s\n' "${FAILED_STEPS[@]}"
  exit 1
fi
echo "every step passed"
