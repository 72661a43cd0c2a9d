"""The model families of tests/python/models.py on CPU: eager, Inductor and fusion_jit, each with default
settings and with freezing (Inductor's torch._inductor.config.freezing, fusion_jit's freezing option),
in one run.

    ./run python bench/models.py [--models a,b] [--dtype float32|bfloat16] [--iters N] [--json FILE]
    ./run python bench/models.py --cold-only [--models a,b] [--settings default] [--dtypes float32,bfloat16]

For each model and setting, each compiler gets two fresh processes that share a cache directory made for
this run: the first starts cold (empty caches) and measures the first call (cold compile: Dynamo, AOT
autograd and the backend), the second measures the first call again with the caches warm (warm compile).
A third process compiles both from their warm caches and times eager, Inductor and fusion_jit in rotating
rounds (30 calls each by default, in 5 rounds), so that every speedup is taken against the eager of the
same process under one machine state (eager's spread across rounds, slowest round's median over fastest's,
is in the JSON as eager_spread to show how much the machine moved). fusion_jit also reports the share of
the graph's ops that run inside its kernels and the kernels per iteration. Bars (issues 7 and 15): cold
compile at most 0.2x Inductor's; geomean speedup over eager at least 1.1x and at least Inductor's in the
same setting; no model slower than eager; each model at least as fast as Inductor, judged call by call:
after the rounds the process alternates fusion_jit and Inductor one call at a time (max(iters, 40) calls
each, the order reversed at every call, as bench/model_variants.py --paired) and reports the median of
the per-call ratios ("fj / Inductor per call"), which resolves about 1% where the rounds' medians of
the same two plans move by a few percent with the machine.

--dtype bfloat16 runs the models and their inputs in bfloat16. --cold-only measures the cold first call
only (fresh processes, empty caches), for each dtype of --dtypes: Inductor's, fusion_jit's, their ratio,
and fusion_jit's host compile time (issue 71's bars: every model's cold compile at most
0.15x Inductor's; a bfloat16 plan's host compile at most 1.5x its float32 plan's).
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "python"))


def interleaved_many(fns, iters, rounds=5):
    """Each of fns timed in rounds (iters calls in all each), the order rotated from round to round (so
    that each goes first in turn and the machine's drift falls on all of them): the median of all calls
    per fn, and each fn's per-round medians."""
    per = max(1, iters // rounds)
    all_ms = [[] for _ in fns]
    rounds_ms = [[] for _ in fns]
    for fn in fns:
        fn()
    for r in range(rounds):
        order = [(r + k) % len(fns) for k in range(len(fns))]
        for i in order:
            ts = []
            for _ in range(per):
                t0 = time.perf_counter()
                fns[i]()
                ts.append((time.perf_counter() - t0) * 1000.0)
            all_ms[i].extend(ts)
            rounds_ms[i].append(statistics.median(ts))
    return [statistics.median(ms) for ms in all_ms], rounds_ms


def paired(fns, n):
    """fns called one after another n times, the order reversed at every call: each fn's median (ms) and the
    median over calls of its time / the last fn's time in the same pass."""
    ts = [[] for _ in fns]
    idx = list(range(len(fns)))
    for i in range(n):
        for k in (idx if i % 2 == 0 else idx[::-1]):
            t0 = time.perf_counter()
            fns[k]()
            ts[k].append((time.perf_counter() - t0) * 1000.0)
    medians = [statistics.median(t) for t in ts]
    ratios = [statistics.median([a / b for a, b in zip(t, ts[-1])]) for t in ts[:-1]]
    return medians, ratios


def _compiled(model, compiler):
    import torch
    freezing = compiler.endswith("-freezing")
    if compiler.startswith("fusion_jit"):
        import fusion_jit  # noqa: F401  (registers the backend)
        return torch.compile(model, backend="fusion_jit", options={"freezing": freezing})
    torch._inductor.config.freezing = freezing
    return torch.compile(model)


def _fusion_jit_stats():
    import fusion_jit
    s = fusion_jit.stats()
    return dict(kernels=s["kernels"], fused_ops=s["fused_ops"], fallback_ops=s["fallback_ops"],
                compiles=s["compiles"], eager_graphs=s["eager_graphs"], graphs=s["graphs"])


def _make(name, size, dtype):
    """The model and its inputs in `dtype` (float32 or bfloat16; integer inputs stay as they are)."""
    import torch
    from models import make

    model, args = make(name, size=size)
    model.eval()
    if dtype != "float32":
        t = getattr(torch, dtype)
        model = model.to(t)
        args = tuple(a.to(t) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
    return model, args


def first_call(name, compiler, size, dtype):
    """Runs in a child process: the first call's time (the compile, cold or warm by the caches given)."""
    import torch

    model, args = _make(name, size, dtype)
    compiled = _compiled(model, compiler)
    with torch.no_grad():
        t0 = time.perf_counter()
        compiled(*args)
        out = {"first_call_s": time.perf_counter() - t0}
    if compiler.startswith("fusion_jit"):
        import fusion_jit
        out.update(_fusion_jit_stats())
        out["compile_ms"] = fusion_jit.stats()["compile_ms"]
    print(json.dumps(out), flush=True)


def race(name, setting, iters, size, dtype):
    """Runs in a child process: eager, Inductor and fusion_jit in one setting, compiled in this process (the
    caches warm) and timed in rotating rounds, so that every ratio is taken under one machine state."""
    import torch

    model, args = _make(name, size, dtype)
    suffix = "" if setting == "default" else "-freezing"
    inductor = _compiled(model, "inductor" + suffix)
    fj = _compiled(model, "fusion_jit" + suffix)
    with torch.no_grad():
        (eager_ms, inductor_ms, fj_ms), rounds_ms = interleaved_many(
            [lambda: model(*args), lambda: inductor(*args), lambda: fj(*args)], iters)
        # fusion_jit against Inductor call by call: the bar's ratio, resolved to about 1% where the rounds'
        # medians move by a few percent with the machine.
        _, (paired_ratio,) = paired([lambda: fj(*args), lambda: inductor(*args)], max(iters, 40))
    out = {"eager_ms": eager_ms, "inductor_ms": inductor_ms, "fusion_jit_ms": fj_ms,
           "eager_spread": max(rounds_ms[0]) / min(rounds_ms[0]), "paired_ratio": paired_ratio}
    out.update(_fusion_jit_stats())
    print(json.dumps(out), flush=True)


def run_child(args, caches, **extra_env):
    """caches: (fusion_jit's, Inductor's) cache directories for the child."""
    env = dict(os.environ, FUSION_JIT_CACHE_DIR=os.path.join(caches[0], "fusion_jit"),
               TORCHINDUCTOR_CACHE_DIR=os.path.join(caches[1], "inductor"),
               TRITON_CACHE_DIR=os.path.join(caches[1], "triton"), **extra_env)
    cmd = [sys.executable, __file__] + [str(a) for a in args]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[2:])} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


DTYPES = ("float32", "bfloat16")


def cold_only(names, settings, dtypes, size, json_path):
    """The cold first call of Inductor and fusion_jit per model, setting and dtype, each in a fresh process
    with empty caches; fusion_jit's host compile time and source size beside it."""
    rows = []
    for name in names:
        for setting in settings:
            suffix = "" if setting == "default" else "-freezing"
            for dtype in dtypes:
                row = {"model": name, "setting": setting, "dtype": dtype}
                for compiler in ("inductor" + suffix, "fusion_jit" + suffix):
                    with tempfile.TemporaryDirectory(prefix=f"fj-bench-cold-{name}-") as cache:
                        r = run_child(["--first-call", name, compiler, size, dtype], (cache, cache), CCACHE_DISABLE="1")
                    row[compiler.split("-")[0]] = r
                i, f = row["inductor"], row["fusion_jit"]
                print(f"[bench] {name} {setting} {dtype}: cold first call Inductor {i['first_call_s']:.1f} s, "
                      f"fusion_jit {f['first_call_s']:.2f} s ({f['first_call_s'] / i['first_call_s']:.3f}x), host "
                      f"compile {f['compile_ms']:.0f} ms, {f['kernels']} kernels", file=sys.stderr, flush=True)
                rows.append(row)
    print("| model | setting | dtype | Inductor cold s | fusion_jit cold s | ratio | fj host compile ms | "
          "bf16 / f32 host compile | kernels |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    worst, worst_bf = 0.0, 0.0
    for r in rows:
        i, f = r["inductor"], r["fusion_jit"]
        ratio = f["first_call_s"] / i["first_call_s"]
        worst = max(worst, ratio)
        f32 = [q for q in rows if q["model"] == r["model"] and q["setting"] == r["setting"] and q["dtype"] == "float32"]
        rel = ""
        if r["dtype"] != "float32" and f32 and f32[0]["fusion_jit"]["compile_ms"] > 0:
            x = f["compile_ms"] / f32[0]["fusion_jit"]["compile_ms"]
            worst_bf = max(worst_bf, x)
            rel = f"{x:.2f}"
        print(f"| {r['model']} | {r['setting']} | {r['dtype']} | {i['first_call_s']:.1f} | {f['first_call_s']:.2f} | "
              f"{ratio:.3f} | {f['compile_ms']:.0f} | {rel} | {f['kernels']} |")
    print(f"\ncold first call, fusion_jit / Inductor: worst {worst:.3f} (bar 0.15: {'pass' if worst <= 0.15 else 'FAIL'})")
    if worst_bf:
        print(f"host compile, bfloat16 / float32: worst {worst_bf:.2f} (bar 1.5: {'pass' if worst_bf <= 1.5 else 'FAIL'})")
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(rows, fh, indent=1)


def main():
    from models import BENCH_MODELS, MODELS
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--settings", default="default,freezing", help="default, freezing or both (the default)")
    p.add_argument("--iters", type=int, default=30, help="calls timed per variant (default 30, in 5 rounds)")
    p.add_argument("--size", type=int, default=224, help="image size (default 224)")
    p.add_argument("--json", help="also write the rows to this file (generated output: put it outside the "
                   "source tree, e.g. build/models_results.json)")
    p.add_argument("--dtype", default="float32", choices=DTYPES, help="the models' dtype (default float32)")
    p.add_argument("--cold-only", action="store_true", help="only the cold first call, for each of --dtypes")
    p.add_argument("--dtypes", default="float32,bfloat16", help="with --cold-only (default float32,bfloat16)")
    p.add_argument("--first-call", nargs=4, help=argparse.SUPPRESS)
    p.add_argument("--race", nargs=5, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.first_call:
        name, compiler, size, dtype = a.first_call
        first_call(name, compiler, int(size), dtype)
        return
    if a.race:
        name, setting, iters, size, dtype = a.race
        race(name, setting, int(iters), int(size), dtype)
        return
    settings = a.settings.split(",")
    for setting in settings:
        if setting not in ("default", "freezing"):
            sys.exit(f"unknown setting {setting!r} (known: default, freezing)")
    known = dict(MODELS, **BENCH_MODELS)
    for name in a.models.split(","):
        if name not in known:
            sys.exit(f"unknown model {name!r} (known: {', '.join(known)})")
    if a.cold_only:
        dtypes = a.dtypes.split(",")
        for d in dtypes:
            if d not in DTYPES:
                sys.exit(f"unknown dtype {d!r} (known: {', '.join(DTYPES)})")
        cold_only(a.models.split(","), settings, dtypes, a.size, a.json)
        return
    rows = []
    for name in a.models.split(","):
        row = {"model": name if a.dtype == "float32" else f"{name} ({a.dtype})"}
        for setting in settings:
            suffix = "" if setting == "default" else "-freezing"
            with tempfile.TemporaryDirectory(prefix=f"fj-bench-{name}{suffix}-") as cache:
                t0 = time.time()
                caches = {}
                for compiler in ("inductor" + suffix, "fusion_jit" + suffix):
                    caches[compiler] = os.path.join(cache, compiler)
                    pair = (caches[compiler], caches[compiler])
                    cold = run_child(["--first-call", name, compiler, a.size, a.dtype], pair)
                    warm = run_child(["--first-call", name, compiler, a.size, a.dtype], pair)
                    row[compiler] = {"cold_s": cold["first_call_s"], "warm_s": warm["first_call_s"]}
                times = run_child(["--race", name, setting, a.iters, a.size, a.dtype],
                                  (caches["fusion_jit" + suffix], caches["inductor" + suffix]))
                for compiler in ("inductor" + suffix, "fusion_jit" + suffix):
                    row[compiler].update(eager_ms=times["eager_ms"], eager_spread=times["eager_spread"],
                                         compiled_ms=times[compiler.split("-")[0] + "_ms"],
                                         paired_ratio=times["paired_ratio"])
                    if compiler.startswith("fusion_jit"):
                        row[compiler].update({k: times[k] for k in ("kernels", "fused_ops", "fallback_ops",
                                                                  "compiles", "eager_graphs", "graphs")})
                print(f"[bench] {name} {setting}: cold {row['inductor' + suffix]['cold_s']:.2f} / "
                      f"{row['fusion_jit' + suffix]['cold_s']:.2f} s, warm {row['inductor' + suffix]['warm_s']:.2f} / "
                      f"{row['fusion_jit' + suffix]['warm_s']:.2f} s (Inductor / fusion_jit); eager "
                      f"{times['eager_ms']:.2f} ms, Inductor {times['inductor_ms']:.2f} ms, fusion_jit "
                      f"{times['fusion_jit_ms']:.2f} ms, fusion_jit / Inductor call by call {times['paired_ratio']:.3f} "
                      f"(eager's spread across rounds {times['eager_spread']:.2f}; "
                      f"{time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
        rows.append(row)
    print_table(rows)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


def print_table(rows):
    for suffix, title in (("", "default settings"), ("-freezing", "freezing")):
        if ("fusion_jit" + suffix) in rows[0]:
            print(f"\n### {title}\n")
            print_setting(rows, "inductor" + suffix, "fusion_jit" + suffix)


def print_setting(rows, ind_name, fj_name):
    print("| model | eager ms | Inductor ms | fusion_jit ms | fj vs eager | Inductor vs eager | fj ms / Inductor ms | fj / Inductor per call | cold compile s: Inductor / fj (ratio) | warm compile s: Inductor / fj | ops fused | kernels/iter |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    speedups, ind_speedups, cold_ratios = [], [], []
    for r in rows:
        i, f = r[ind_name], r[fj_name]
        eager = f["eager_ms"]
        sp = eager / f["compiled_ms"]
        isp = i["eager_ms"] / i["compiled_ms"]
        speedups.append(sp)
        ind_speedups.append(isp)
        ratio = f["cold_s"] / i["cold_s"]
        cold_ratios.append(ratio)
        share = f["fused_ops"] / max(1, f["fused_ops"] + f["fallback_ops"])
        print(f"| {r['model']} | {eager:.2f} | {i['compiled_ms']:.2f} | {f['compiled_ms']:.2f} | {sp:.2f}x | {isp:.2f}x | "
              f"{f['compiled_ms'] / i['compiled_ms']:.2f} | {f['paired_ratio']:.3f} | "
              f"{i['cold_s']:.1f} / {f['cold_s']:.2f} ({ratio:.3f}) | {i['warm_s']:.2f} / {f['warm_s']:.2f} | "
              f"{share:.0%} | {f['kernels']} |")
    g = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
    gi = math.exp(sum(math.log(s) for s in ind_speedups) / len(ind_speedups))
    worst = max(cold_ratios)
    slower = [r["model"] for r, sp in zip(rows, speedups) if sp < 1.0]
    behind = [r["model"] for r in rows if r[fj_name]["paired_ratio"] > 1.0]
    print(f"\ngeomean speedup over eager: fusion_jit {g:.2f}x, Inductor {gi:.2f}x "
          f"(bars: >= 1.1x {'pass' if g >= 1.1 else 'FAIL'}; >= Inductor's {'pass' if g >= gi else 'FAIL'})")
    print(f"slower than eager: {', '.join(slower) or 'none'}; behind Inductor (call by call): {', '.join(behind) or 'none'}")
    print(f"cold compile, fusion_jit / Inductor: worst {worst:.3f} (bar 0.2: {'pass' if worst <= 0.2 else 'FAIL'})")


if __name__ == "__main__":
    main()
