"""The model families of tests/python/models.py on CPU: eager, Inductor and fusion_jit, each with default
settings and with freezing (Inductor's torch._inductor.config.freezing, fusion_jit's freezing option),
in one run.

    ./run python bench/models.py [--models a,b] [--iters N] [--json FILE]

For each model and compiler, two fresh processes share a cache directory made for this run: the first
starts cold (empty caches) and measures the first call (cold compile: Dynamo, AOT autograd and the
backend), then the median time per iteration of the compiled model and of eager in the same process,
timed in alternating rounds (so that the machine's drift falls on both; eager's spread across rounds is
in the JSON as eager_spread); the second measures the first call again with the caches warm (warm compile). fusion_jit also reports the
share of the graph's ops that run inside its kernels and the kernels per iteration. Speedups are taken
against eager measured in the same process. Bars (issues 7 and 15): cold compile at most 0.2x
Inductor's; geomean speedup over eager at least 1.1x and at least Inductor's in the same setting; no
model slower than eager.
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


def interleaved_ms(eager, compiled, iters, rounds=5):
    """Eager and the compiled model timed in alternating rounds (iters calls in all each), so that a drift
    of the machine's speed during the run (other tenants, clocks) falls on both: the medians of all calls,
    and eager's spread (slowest round's median over fastest's) to show how much the machine moved."""
    per = max(1, iters // rounds)
    e_all, c_all, e_rounds = [], [], []
    eager()
    compiled()
    for r in range(rounds):
        for fn, out in ((eager, e_all), (compiled, c_all)) if r % 2 == 0 else ((compiled, c_all), (eager, e_all)):
            ts = []
            for _ in range(per):
                t0 = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t0) * 1000.0)
            out.extend(ts)
            if out is e_all:
                e_rounds.append(statistics.median(ts))
    return statistics.median(e_all), statistics.median(c_all), max(e_rounds) / min(e_rounds)


def one(name, compiler, iters, size, measure):
    """Runs in a child process: prints one JSON line."""
    import torch
    from models import make

    model, args = make(name, size=size)
    model.eval()
    freezing = compiler.endswith("-freezing")
    if compiler.startswith("fusion_jit"):
        import fusion_jit
        compiled = torch.compile(model, backend="fusion_jit", options={"freezing": freezing})
    else:
        torch._inductor.config.freezing = freezing
        compiled = torch.compile(model)
    out = {}
    with torch.no_grad():
        t0 = time.perf_counter()
        compiled(*args)
        out["first_call_s"] = time.perf_counter() - t0
        if measure:
            out["eager_ms"], out["compiled_ms"], out["eager_spread"] = interleaved_ms(
                lambda: model(*args), lambda: compiled(*args), iters)
    if compiler.startswith("fusion_jit"):
        s = fusion_jit.stats()
        out.update(kernels=s["kernels"], fused_ops=s["fused_ops"], fallback_ops=s["fallback_ops"],
                   compiles=s["compiles"], eager_graphs=s["eager_graphs"], graphs=s["graphs"])
    print(json.dumps(out), flush=True)


def run_child(name, compiler, iters, size, measure, cache):
    env = dict(os.environ, FUSION_JIT_CACHE_DIR=os.path.join(cache, "fusion_jit"),
               TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"), TRITON_CACHE_DIR=os.path.join(cache, "triton"))
    cmd = [sys.executable, __file__, "--one", name, compiler, str(iters), str(size), "1" if measure else "0"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{name} with {compiler} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    from models import MODELS
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--settings", default="default,freezing", help="default, freezing or both (the default)")
    p.add_argument("--iters", type=int, default=30, help="calls timed per variant (default 30, in 5 rounds)")
    p.add_argument("--size", type=int, default=224, help="image size (default 224)")
    p.add_argument("--json", help="also write the rows to this file (generated output: put it outside the "
                   "source tree, e.g. build/models_results.json)")
    p.add_argument("--one", nargs=5, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        name, compiler, iters, size, measure = a.one
        one(name, compiler, int(iters), int(size), measure == "1")
        return
    rows = []
    for name in a.models.split(","):
        if name not in MODELS:
            sys.exit(f"unknown model {name!r} (known: {', '.join(MODELS)})")
        row = {"model": name}
        compilers = []
        for setting in a.settings.split(","):
            if setting not in ("default", "freezing"):
                sys.exit(f"unknown setting {setting!r} (known: default, freezing)")
            suffix = "" if setting == "default" else "-freezing"
            compilers += ["inductor" + suffix, "fusion_jit" + suffix]
        for compiler in compilers:
            with tempfile.TemporaryDirectory(prefix=f"fj-bench-{compiler}-") as cache:
                t0 = time.time()
                cold = run_child(name, compiler, a.iters, a.size, True, cache)
                warm = run_child(name, compiler, a.iters, a.size, False, cache)
                print(f"[bench] {name} {compiler}: cold {cold['first_call_s']:.2f} s, warm {warm['first_call_s']:.2f} s, "
                      f"{cold['compiled_ms']:.2f} ms vs eager {cold['eager_ms']:.2f} ms (eager's spread across rounds "
                      f"{cold['eager_spread']:.2f}; {time.time() - t0:.0f} s)",
                      file=sys.stderr, flush=True)
            row[compiler] = {"cold_s": cold["first_call_s"], "warm_s": warm["first_call_s"], **cold}
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
    print("| model | eager ms | Inductor ms | fusion_jit ms | fj vs eager | Inductor vs eager | fj / Inductor (each vs its eager) | cold compile s: Inductor / fj (ratio) | warm compile s: Inductor / fj | ops fused | kernels/iter |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
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
              f"{(f['compiled_ms'] / f['eager_ms']) / (i['compiled_ms'] / i['eager_ms']):.2f} | "
              f"{i['cold_s']:.1f} / {f['cold_s']:.2f} ({ratio:.3f}) | {i['warm_s']:.2f} / {f['warm_s']:.2f} | "
              f"{share:.0%} | {f['kernels']} |")
    g = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
    gi = math.exp(sum(math.log(s) for s in ind_speedups) / len(ind_speedups))
    worst = max(cold_ratios)
    slower = [r["model"] for r, sp in zip(rows, speedups) if sp < 1.0]
    behind = [r["model"] for r, sp, isp in zip(rows, speedups, ind_speedups) if sp < isp]
    print(f"\ngeomean speedup over eager: fusion_jit {g:.2f}x, Inductor {gi:.2f}x "
          f"(bars: >= 1.1x {'pass' if g >= 1.1 else 'FAIL'}; >= Inductor's {'pass' if g >= gi else 'FAIL'})")
    print(f"slower than eager: {', '.join(slower) or 'none'}; behind Inductor: {', '.join(behind) or 'none'}")
    print(f"cold compile, fusion_jit / Inductor: worst {worst:.3f} (bar 0.2: {'pass' if worst <= 0.2 else 'FAIL'})")


if __name__ == "__main__":
    main()
