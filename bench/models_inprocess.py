"""Where fusion_jit's time goes, model by model: eager and fusion_jit (default settings and freezing)
compiled side by side in one process per model and timed interleaved, then fusion_jit's time per call
with freezing split by fusion_jit.profile(): our kernels, ATen compute (convolution, GEMM, attention), ATen
other, between steps, and the rest of the call outside the plans (Dynamo's guards, the backend's wrapper:
host overhead).

    ./run python bench/models_inprocess.py [--models a,b] [--rounds R] [--iters N] [--size S] [--json FILE]

Each round times every variant for N calls (median per round), in a rotating order; a variant's figure
is the median over the rounds. Inductor is not in this table: a second Inductor compile of a model in one
process does not get what a first one gets (measured with resnet18 at 224: Inductor with freezing 18.6 ms
alone in its process, 37-39 ms compiled after or before Inductor with default settings, whose own time was
36-39 ms), so Inductor is compared in bench/models.py, one process per compiler, by ratios to the eager
time measured in the same process. Compile times are measured there too.
"""

import argparse
import copy
import json
import math
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

VARIANTS = ["eager", "fusion_jit", "fusion_jit-freezing"]


def one(name, rounds, iters, size):
    """Runs in a child process: prints one JSON line."""
    import torch

    import fusion_jit
    from models import make

    model, args = make(name, size=size)
    model.eval()
    fns = {"eager": model}
    with torch.no_grad():
        for v in VARIANTS[1:]:
            fns[v] = torch.compile(copy.deepcopy(model), backend="fusion_jit",
                                   options={"freezing": v.endswith("-freezing")})
            fns[v](*args)  # compiles
            fns[v](*args)
        times = {v: [] for v in VARIANTS}
        for r in range(rounds):
            order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
            for v in order:
                f = fns[v]
                f(*args)
                ts = []
                for _ in range(iters):
                    t0 = time.perf_counter()
                    f(*args)
                    ts.append(time.perf_counter() - t0)
                times[v].append(statistics.median(ts) * 1000.0)
        out = {v: statistics.median(t) for v, t in times.items()}
        # Where fusion_jit's time goes (freezing).
        f = fns["fusion_jit-freezing"]
        t0 = time.perf_counter()
        with fusion_jit.profile() as p:
            for _ in range(iters):
                f(*args)
        call_ms = (time.perf_counter() - t0) * 1000.0 / iters
    s = p.summary()
    runs = max(1, s["plan_runs"]) / iters  # plans per call (graph breaks give several)
    per = lambda ms: ms / iters
    out["profile"] = {
        "call_ms": call_ms, "plans_per_call": runs,
        "kernels_ms": per(s["kernels_ms"]), "aten_compute_ms": per(s["aten_compute_ms"]),
        "aten_other_ms": per(s["aten_other_ms"]),
        "between_ms": per(s["plan_ms"] - s["kernels_ms"] - s["aten_compute_ms"] - s["aten_other_ms"]),
        "outside_ms": call_ms - per(s["plan_ms"]),
        "steps": {k: c / iters for k, c in s["steps"].items()},
        "top_ops": sorted(((k, c / iters, ms / iters) for k, (c, ms) in s["ops"].items()), key=lambda x: -x[2])[:4],
    }
    print(json.dumps(out), flush=True)


def main():
    from models import MODELS
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--size", type=int, default=224, help="image size (default 224)")
    p.add_argument("--json", help="also write the rows to this file (put it outside the source tree)")
    p.add_argument("--one", nargs=4, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        name, rounds, iters, size = a.one
        one(name, int(rounds), int(iters), int(size))
        return
    rows = []
    for name in a.models.split(","):
        if name not in MODELS:
            sys.exit(f"unknown model {name!r} (known: {', '.join(MODELS)})")
        t0 = time.time()
        cmd = [sys.executable, __file__, "--one", name, str(a.rounds), str(a.iters), str(a.size)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"{name} failed:\n{r.stderr[-3000:]}")
        row = json.loads(r.stdout.strip().splitlines()[-1])
        row["model"] = name
        rows.append(row)
        print(f"[bench] {name}: " + ", ".join(f"{v} {row[v]:.2f} ms" for v in VARIANTS) + f" ({time.time() - t0:.0f} s)",
              file=sys.stderr, flush=True)
    print_tables(rows)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def print_tables(rows):
    print("| model | eager ms | fusion_jit ms | vs eager | fusion_jit freezing ms | vs eager |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    sp = {v: [] for v in VARIANTS[1:]}
    for r in rows:
        e = r["eager"]
        for v in VARIANTS[1:]:
            sp[v].append(e / r[v])
        print(f"| {r['model']} | {e:.2f} | {r['fusion_jit']:.2f} | {e / r['fusion_jit']:.2f}x | "
              f"{r['fusion_jit-freezing']:.2f} | {e / r['fusion_jit-freezing']:.2f}x |")
    print(f"\ngeomean speedup over eager: default {geomean(sp['fusion_jit']):.2f}x, freezing "
          f"{geomean(sp['fusion_jit-freezing']):.2f}x")
    for v in VARIANTS[1:]:
        slower = [r["model"] for r in rows if r[v] > r["eager"]]
        print(f"{v}: slower than eager: {', '.join(slower) or 'none'}")
    print("\nWhere fusion_jit's time goes (freezing), ms per call:\n")
    print("| model | call | our kernels | ATen compute | ATen other | between steps | outside the plans | steps: kernels / compute / other | costliest ops |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        q = r["profile"]
        st = q["steps"]
        ops = ", ".join(f"{k} {ms:.2f}" for k, _, ms in q["top_ops"][:3])
        print(f"| {r['model']} | {q['call_ms']:.2f} | {q['kernels_ms']:.2f} | {q['aten_compute_ms']:.2f} | "
              f"{q['aten_other_ms']:.2f} | {q['between_ms']:.2f} | {q['outside_ms']:.2f} | "
              f"{st['kernels']:.0f} / {st['aten_compute']:.0f} / {st['aten_other']:.0f} | {ops} |")


if __name__ == "__main__":
    main()
