"""Time to first result of each demo model: cold (empty kernel cache), warm from disk in a fresh process,
warm from Redis (a new machine: empty local cache, the remote tier on localhost), and eager's first call,
measured in the same processes.

    ./run python bench/warm_start.py build/fusion-jit [--rounds 3] [--no-redis] [--demo-models a,b]
                                                      [--python-models a,b] [--packages [--import-runs N]]

Each round: `fusion-jit run MODEL --json` with an emptied cache (cold; with the remote tier, which it writes
through to), then again in a fresh process (warm, with FUSION_JIT_ASSERT_NO_COMPILE=1: no compiler may
run), then in a fresh process with another, empty, local cache and the same Redis (warm from Redis, no
compiler either; tests/redis_server.py starts redis-server). "in Redis" is the time the new machine's process
spent in the remote tier's operations (connect included). --python-models (default gpt2_tiny,resnet18): the same
for models of tests/python/models.py through torch.compile(backend="fusion_jit") in inference, each
process timing eager's first call, then the compiled model's first call. eager_first_ms is the model's first
eager call in each process; first_call_ms is the fused first call (capture, passes, plan, kernels
compiled or loaded, run). Medians over the rounds.

--packages: instead, per demo model, an ahead-of-time package (`fusion-jit package`) loaded and run in a
fresh process (`fusion-jit load`, FUSION_JIT_ASSERT_NO_COMPILE=1, no cache directory): its load time, of
which reading the weights, and its first call, against eager's first call and the plan cache's warm start
measured in the same round; and per --python-models model, a package from Python (fusion_jit.package: the
FX path, torch.export and the backend's lowering) built in a fresh process that first times eager's first
call, then loaded and called in another fresh process (fusion_jit.load_package, no compiler, no cache);
then, per Python model, the serving process's figures from `import torch` on: `import fusion_jit`, and it
plus the package's load (weights included) and first call, against torch.jit.load of a traced TorchScript of
the model and its first call in another fresh process (eager's serving process). It starts with `import
torch` against `import torch; import fusion_jit` in fresh processes (--import-runs of each, 0: none).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from models import MODELS, make_models  # noqa: E402
import redis_server  # noqa: E402


def run(cli, model, specs, env):
    p = subprocess.run([cli, "run", model, "--input", *specs, "--json"], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{model}: {p.stderr.strip()}")
    return json.loads(p.stdout)


def load_package(cli, pkg, specs, env):
    """`fusion-jit load` of a package in a fresh process: (load ms, of which constants ms, of which prepacking ms,
    first call ms)."""
    import re
    p = subprocess.run([cli, "load", pkg, "--input", *specs], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{pkg}: {p.stderr.strip()}")
    load = re.search(r"in ([0-9.]+) ms \(constants ([0-9.]+) ms, of which prepacking ([0-9.]+) ms\)", p.stdout)
    first = re.search(r"first call ([0-9.]+) ms", p.stdout)
    return float(load.group(1)), float(load.group(2)), float(load.group(3)), float(first.group(1))


def package_rows(cli, paths, tmp, rounds, names):
    """Ahead-of-time packages (issue 19): each demo model packaged, then loaded and run in a fresh process
    with no compiler and no cache; eager's first call and the plan-cache warm start in the same round."""
    print("\nweights: reading the constants and prepacking them (Note [Prepacked weights]), of which prepack")
    print(f"{'model':<18} {'eager first':>12} {'warm first':>11} {'pkg load':>9} {'weights':>8} {'prepack':>8} "
          f"{'pkg first':>10} {'load-weights+first - eager':>27}")
    for name, (_, specs) in MODELS.items():
        if name not in names:
            continue
        rows = []
        for r in range(rounds):
            cache = os.path.join(tmp, f"pkg-cache-{name}-{r}")
            env = dict(os.environ, FUSION_JIT_CACHE_DIR=cache)
            run(cli, paths[name], specs, env)  # fills the cache: the next run is a warm start
            warm = run(cli, paths[name], specs, dict(env, FUSION_JIT_ASSERT_NO_COMPILE="1"))
            pkg = os.path.join(tmp, f"{name}-{r}.fjpkg")
            p = subprocess.run([cli, "package", paths[name], "--input", *specs, "--out", pkg], capture_output=True,
                               text=True, env=env)
            if p.returncode != 0:
                sys.exit(f"{name}: {p.stderr.strip()}")
            load, weights, prepack, first = load_package(cli, pkg, specs, dict(
                os.environ, FUSION_JIT_ASSERT_NO_COMPILE="1", FUSION_JIT_CACHE_DIR=os.path.join(tmp, "no-cache")))
            rows.append((warm["eager_first_ms"], warm["first_call_ms"], load, weights, prepack, first,
                         load - weights + first - warm["eager_first_ms"]))
        med = [statistics.median(r[i] for r in rows) for i in range(7)]
        print(f"{name:<18} {med[0]:>10.1f}ms {med[1]:>9.1f}ms {med[2]:>7.1f}ms {med[3]:>6.1f}ms {med[4]:>6.1f}ms "
              f"{med[5]:>8.1f}ms {med[6]:>25.1f}ms", flush=True)


def python_child(name):
    """One process of the --python-models rows: eager's first call, then the compiled first call (ms)."""
    import time
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
    sys.modules.pop("models", None)  # examples/models.py, imported at the top
    import torch
    import fusion_jit
    from models import main_output, make
    model, args = make(name)
    model.eval()
    with torch.no_grad():
        t0 = time.perf_counter()
        main_output(model(*args))
        eager = (time.perf_counter() - t0) * 1e3
        compiled = torch.compile(model, backend="fusion_jit")
        t0 = time.perf_counter()
        main_output(compiled(*args))
        first = (time.perf_counter() - t0) * 1e3
    s = fusion_jit.stats()
    print(json.dumps({"eager_first_ms": eager, "first_call_ms": first, "compiler_invocations": s["compiles"],
                      "remote_hits": s["remote_hits"], "remote_ms": s["remote_ms"]}))


def python_package_child(name, pkg, inputs):
    """Builds the --packages row of a Python model: eager's first call in this fresh process, then the
    package (FX path), the inputs and a TorchScript of the model (torch.jit.trace, for eager's serving process;
    none where tracing fails) saved for the loading processes."""
    import time
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
    sys.modules.pop("models", None)
    import torch
    import fusion_jit
    from models import main_output, make
    model, args = make(name)
    model.eval()
    if hasattr(model, "config"):
        model.config.use_cache = False
    args = args if isinstance(args, tuple) else (args,)
    with torch.no_grad():
        t0 = time.perf_counter()
        main_output(model(*args))
        eager = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    fusion_jit.package(model, args, pkg)
    build = (time.perf_counter() - t0) * 1e3
    torch.save(args, inputs)
    traced = True
    try:
        with torch.no_grad():
            torch.jit.save(torch.jit.trace(model, args, strict=False, check_trace=False), pkg + ".pt")
    except Exception:  # noqa: BLE001 - a model tracing cannot take has no TorchScript column
        traced = False
    print(json.dumps({"eager_first_ms": eager, "build_ms": build, "traced": traced}))


def python_load_child(pkg, inputs):
    """The loading process of a Python model's package: `import fusion_jit` after `import torch`, load, then
    the first call (ms)."""
    import time
    import torch
    t0 = time.perf_counter()
    import fusion_jit
    imported = (time.perf_counter() - t0) * 1e3
    args = torch.load(inputs)
    with torch.no_grad():
        t0 = time.perf_counter()
        served = fusion_jit.load_package(pkg)
        t1 = time.perf_counter()
        served(*args)
        first = (time.perf_counter() - t1) * 1e3
    print(json.dumps({"import_ms": imported, "load_ms": (t1 - t0) * 1e3, "constants_ms": served.constants_ms,
                      "prepack_ms": served.prepack_ms, "first_call_ms": first}))


def python_jit_load_child(scripted, inputs):
    """Eager's serving process: torch.jit.load of the traced model, then its first call (ms)."""
    import time
    import torch
    args = torch.load(inputs)
    with torch.no_grad():
        t0 = time.perf_counter()
        model = torch.jit.load(scripted)
        model(*args)
        t1 = time.perf_counter()
    print(json.dumps({"jit_load_first_ms": (t1 - t0) * 1e3}))


def python_package_rows(tmp, rounds, names):
    serving = {}
    for name in names:
        rows = []
        for r in range(rounds):
            pkg, inputs = os.path.join(tmp, f"{name}-py-{r}.fjpkg"), os.path.join(tmp, f"{name}-py-{r}.pt")
            env = dict(os.environ, FUSION_JIT_CACHE_DIR=os.path.join(tmp, f"py-pkg-cache-{name}-{r}"))
            built = run_child(["--package-child", name, pkg, inputs], env)
            loaded = run_child(["--load-child", pkg, inputs], dict(
                os.environ, FUSION_JIT_ASSERT_NO_COMPILE="1", FUSION_JIT_CACHE_DIR=os.path.join(tmp, "no-cache")))
            rows.append((built["eager_first_ms"], built["build_ms"], loaded["load_ms"], loaded["constants_ms"],
                         loaded["prepack_ms"], loaded["first_call_ms"],
                         loaded["load_ms"] - loaded["constants_ms"] + loaded["first_call_ms"] - built["eager_first_ms"]))
            jit = (run_child(["--jit-load-child", pkg + ".pt", inputs], dict(os.environ))["jit_load_first_ms"]
                   if built["traced"] else float("nan"))
            served = loaded["import_ms"] + loaded["load_ms"] + loaded["first_call_ms"]
            serving.setdefault(name, []).append((loaded["import_ms"], served, jit, served - jit))
        med = [statistics.median(r[i] for r in rows) for i in range(7)]
        print(f"{name + ' (py)':<18} {med[0]:>10.1f}ms {'built in':>11} {med[2]:>7.1f}ms {med[3]:>6.1f}ms "
              f"{med[4]:>6.1f}ms {med[5]:>8.1f}ms {med[6]:>25.1f}ms   (package built in {med[1] / 1e3:.1f} s)", flush=True)
    if not serving:
        return
    # A serving process from `import torch` on (issue 63): what it pays to import fusion_jit, load the package
    # (weights included) and make its first call, against eager's serving process, which loads a TorchScript of
    # the model (torch.jit.trace) and makes its first call; nan where the model could not be traced.
    print("\nserving process, after import torch: import fusion_jit + package load + first call, against "
          "torch.jit.load + first call")
    print(f"{'model':<18} {'import fj':>10} {'import+load+first':>18} {'jit.load+first':>15} {'difference':>11}")
    for name, rows in serving.items():
        med = [statistics.median(r[i] for r in rows) for i in range(4)]
        print(f"{name + ' (py)':<18} {med[0]:>8.1f}ms {med[1]:>16.1f}ms {med[2]:>13.1f}ms {med[3]:>9.1f}ms", flush=True)


IMPORT_CHILD = """
import sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
if sys.argv[1] == "fusion_jit":
    import fusion_jit
t2 = time.perf_counter()
print((t1 - t0) * 1e3, (t2 - t0) * 1e3, any(m.startswith(("torch._dynamo", "torch._inductor")) for m in sys.modules))
"""


def import_rows(runs):
    """`import torch` against `import torch; import fusion_jit` (issue 63), each in `runs` fresh processes,
    interleaved, after one uncounted pair (it warms the page cache); times taken inside each process."""
    alone, both, own, compile_machinery = [], [], [], False
    for r in range(runs + 1):
        a, b = (subprocess.run([sys.executable, "-c", IMPORT_CHILD, what], capture_output=True, text=True, check=True)
                .stdout.split() for what in ("torch", "fusion_jit"))
        if r:
            alone.append(float(a[1]))
            both.append(float(b[1]))
            own.append(float(b[1]) - float(b[0]))
            compile_machinery |= b[2] == "True"
    med = statistics.median
    print(f"fresh processes, medians of {runs}: import torch {med(alone):.0f} ms; import torch; import fusion_jit "
          f"{med(both):.0f} ms ({med(both) - med(alone):+.0f} ms), of which import fusion_jit {med(own):.1f} ms; "
          f"torch._dynamo or torch._inductor imported: {'yes' if compile_machinery else 'no'}", flush=True)


def run_child(argv, env):
    p = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{argv}: {p.stderr.strip()[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def run_python(name, env):
    return run_child(["--child", name], env)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cli")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-redis", action="store_true")
    ap.add_argument("--python-models", default="gpt2_tiny,resnet18")
    ap.add_argument("--demo-models", default=",".join(MODELS), help="the demo models' rows (\"\": none)")
    ap.add_argument("--packages", action="store_true", help="only the ahead-of-time package rows")
    ap.add_argument("--import-runs", type=int, default=10, help="--packages: fresh processes timing the imports")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="fj-warm-")
    paths = make_models(os.path.join(tmp, "models"))
    if args.packages:
        if args.import_runs:
            import_rows(args.import_runs)
        package_rows(args.cli, paths, tmp, args.rounds, args.demo_models.split(","))
        python_package_rows(tmp, args.rounds, [m for m in args.python_models.split(",") if m])
        return
    redis = None if args.no_redis or not redis_server.available() else redis_server.RedisServer(tmp)
    print(f"{'model':<18} {'eager first':>12} {'cold first':>11} {'warm first':>11} {'warm - eager':>13} "
          f"{'from Redis':>11} {'Redis - disk':>13} {'in Redis':>9} {'compilers (warm)':>17}")
    for name, (_, specs) in MODELS.items():
        if name not in args.demo_models.split(","):
            continue
        rows = []
        for r in range(args.rounds):
            cache = os.path.join(tmp, f"cache-{name}-{r}")
            env = redis.env(cache) if redis else dict(os.environ, FUSION_JIT_CACHE_DIR=cache)
            if redis:
                redis.flush()  # cold: nothing in either tier
            cold = run(args.cli, paths[name], specs, env)
            warm = run(args.cli, paths[name], specs, dict(env, FUSION_JIT_ASSERT_NO_COMPILE="1"))
            remote = (run(args.cli, paths[name], specs,
                          redis.env(os.path.join(tmp, f"new-machine-{name}-{r}"), FUSION_JIT_ASSERT_NO_COMPILE="1"))
                      if redis else None)
            rows.append((warm["eager_first_ms"], cold["first_call_ms"], warm["first_call_ms"],
                         remote["first_call_ms"] if remote else float("nan"),
                         remote["cache"]["remote"]["ms"] if remote else float("nan"),
                         warm["compiler_invocations"] + (remote["compiler_invocations"] if remote else 0)))
        med = [statistics.median(r[i] for r in rows) for i in range(5)]
        print(f"{name:<18} {med[0]:>10.1f}ms {med[1]:>9.1f}ms {med[2]:>9.1f}ms {med[2] - med[0]:>11.1f}ms "
              f"{med[3]:>9.1f}ms {med[3] - med[2]:>11.1f}ms {med[4]:>7.1f}ms {max(r[5] for r in rows):>17}", flush=True)
    for name in [m for m in args.python_models.split(",") if m]:
        rows = []
        for r in range(args.rounds):
            cache = os.path.join(tmp, f"py-cache-{name}-{r}")
            env = redis.env(cache) if redis else dict(os.environ, FUSION_JIT_CACHE_DIR=cache)
            if redis:
                redis.flush()
            cold = run_python(name, env)
            warm = run_python(name, dict(env, FUSION_JIT_ASSERT_NO_COMPILE="1"))
            remote = (run_python(name, redis.env(os.path.join(tmp, f"py-new-{name}-{r}"), FUSION_JIT_ASSERT_NO_COMPILE="1"))
                      if redis else None)
            rows.append((warm["eager_first_ms"], cold["first_call_ms"], warm["first_call_ms"],
                         remote["first_call_ms"] if remote else float("nan"),
                         remote["remote_ms"] if remote else float("nan"),
                         warm["compiler_invocations"] + (remote["compiler_invocations"] if remote else 0)))
        med = [statistics.median(r[i] for r in rows) for i in range(5)]
        print(f"{name + ' (py)':<18} {med[0]:>10.1f}ms {med[1]:>9.1f}ms {med[2]:>9.1f}ms {med[2] - med[0]:>11.1f}ms "
              f"{med[3]:>9.1f}ms {med[3] - med[2]:>11.1f}ms {med[4]:>7.1f}ms {max(r[5] for r in rows):>17}", flush=True)
    if redis:
        redis.stop()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        python_child(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "--package-child":
        python_package_child(*sys.argv[2:])
    elif len(sys.argv) == 4 and sys.argv[1] == "--load-child":
        python_load_child(*sys.argv[2:])
    elif len(sys.argv) == 4 and sys.argv[1] == "--jit-load-child":
        python_jit_load_child(*sys.argv[2:])
    else:
        main()
