"""Two builds of fusion_jit on the same models, before and after a change, in one run:

    ./run python bench/library_ab.py --before OLD/libfusion_jit_python.so [--after build/libfusion_jit_python.so]
        [--models a,b] [--dtypes float32,bfloat16] [--rounds 3] [--iters 40]

For each model and dtype, child processes alternate between the two libraries (FUSION_JIT_LIBRARY), `rounds`
of each; every child compiles the model with default settings from its library's own warm cache (made by
a first, untimed child) and times eager and fusion_jit in rotating rounds (bench/models.py's
interleaved_many), so each speedup over eager is taken against the eager of its own process. The row is
each library's median speedup over its rounds and after / before: above 1 the change made the plans
faster. Build the `before` library from a worktree of the old commit (cmake --build B --target
fusion_jit_python).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "python"))


def child(name, dtype, iters):
    """Runs in a child process: eager and fusion_jit (default settings) timed in rotating rounds."""
    import torch
    import fusion_jit  # noqa: F401  (registers the backend; FUSION_JIT_LIBRARY picks the build)
    from model_variants import _bench_models  # bench/models.py as a module (this directory is on the path)

    bm = _bench_models()
    model, args = bm._make(name, 224, dtype)
    fj = torch.compile(model, backend="fusion_jit")
    with torch.no_grad():
        (eager_ms, fj_ms), _ = bm.interleaved_many([lambda: model(*args), lambda: fj(*args)], iters)
    print(json.dumps({"eager_ms": eager_ms, "fusion_jit_ms": fj_ms}), flush=True)


def run(lib, cache, name, dtype, iters):
    env = dict(os.environ, FUSION_JIT_LIBRARY=os.path.abspath(lib), FUSION_JIT_CACHE_DIR=cache)
    r = subprocess.run([sys.executable, __file__, "--child", name, dtype, str(iters)], env=env,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{name} {dtype} with {lib} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    from models import BENCH_MODELS, MODELS
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", help="the library before the change")
    p.add_argument("--after", default=os.path.join(HERE, "..", "build", "libfusion_jit_python.so"))
    p.add_argument("--models", default="resnet18,mobilenet_v3_small,timm_ghostnet_100,timm_deit_tiny")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=40)
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        name, dtype, iters = a.child
        child(name, dtype, int(iters))
        return
    if not a.before:
        sys.exit("--before LIBRARY is required")
    known = dict(MODELS, **BENCH_MODELS)
    print("| model | dtype | before: eager / fj | after: eager / fj | after / before |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name in a.models.split(","):
        if name not in known:
            sys.exit(f"unknown model {name!r} (known: {', '.join(known)})")
        for dtype in a.dtypes.split(","):
            with tempfile.TemporaryDirectory(prefix="fj-ab-") as tmp:
                caches = {lib: os.path.join(tmp, str(i)) for i, lib in enumerate((a.before, a.after))}
                for lib in (a.before, a.after):  # compiles each build's plan once, untimed
                    run(lib, caches[lib], name, dtype, 2)
                speed = {a.before: [], a.after: []}
                for k in range(a.rounds):
                    for lib in ((a.before, a.after) if k % 2 == 0 else (a.after, a.before)):
                        r = run(lib, caches[lib], name, dtype, a.iters)
                        speed[lib].append(r["eager_ms"] / r["fusion_jit_ms"])
            b, f = statistics.median(speed[a.before]), statistics.median(speed[a.after])
            print(f"[ab] {name} {dtype}: before {speed[a.before]}, after {speed[a.after]}", file=sys.stderr, flush=True)
            print(f"| {name} | {dtype} | {b:.3f}x | {f:.3f}x | {f / b:.3f} |", flush=True)


if __name__ == "__main__":
    main()
