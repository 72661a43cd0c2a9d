"""Dynamic sizes (Note [Sizes as kernel arguments]): what a kernel that reads its sizes costs per call, and
what a served model's run over many sequence lengths costs in all, compiles included.

    ./run python bench/dynamic_sizes.py percall [S]  per-call time of the same graph at the same size with
                                                     kernels that read their sizes (dynamic_kernels="on")
                                                     and with literal sizes ("off"), both compiled in this
                                                     process, 600 pairs of calls back to back in alternating
                                                     order (median of the pairs' ratios); eager alongside;
                                                     S: only the cases whose name contains S
    ./run python bench/dynamic_sizes.py lengths      20 sequence lengths (batch 2) of each tiny language model,
                                                     each backend in a fresh process with an empty cache:
                                                     total time to run them all, compiles included, and the
                                                     compiler runs; eager, fusion_jit (auto, the default),
                                                     fusion_jit with dynamic_kernels="off", Inductor (dynamic=None)
    ./run python bench/dynamic_sizes.py newsize [N]  the first call of each new length once the graph is
                                                     symbolic (lengths 3-20 of LENGTHS, batch 2; with N: N
                                                     lengths from 11 on, after 8 and 9): its plan an instance
                                                     of the shape class's (Note [Plans of a shape class], the
                                                     default), built from the graph's template
                                                     (disable="symbolic.class", Note [Symbolic graphs]), and
                                                     the graph lowered again for each length
                                                     (disable="symbolic"), and the call once planned (class);
                                                     median ms; and the bytes the plan cache grew by per
                                                     length (class)
    ./run python bench/dynamic_sizes.py warmclass    a restarted process (here: the backend and Dynamo reset, the
                                                     on-disk cache kept) whose first length of the symbolic graph
                                                     is a new one: add_from_class's time where it builds the
                                                     shape class, its plan read from the plan cache (Note
                                                     [Symbolic sizes in the plan cache]) or, in alternate rounds
                                                     with the classes' plan entries removed, built again from the
                                                     kernel cache; the cold build of the first round; the warm
                                                     round's whole first call (Dynamo's tracing included) and its
                                                     next 10 new lengths; batch 2; median of 3 rounds each
    ./run python bench/dynamic_sizes.py manylengths  every sequence length 2-128 at batch sizes 1-4 (508 signatures)
                                                     of gpt2_tiny and bert_tiny, once each, in a fresh process per
                                                     setting: the process's resident memory after the first
                                                     signature and after all, the plans dropped, the total time;
                                                     FUSION_JIT_SHARED_PLANS at 16, its default (64) and unbounded
    ./run python bench/dynamic_sizes.py frozen       frozen models (the freezing option) served at many sizes, a
                                                     fresh process each with an empty cache: a 1024-4096-1024 MLP
                                                     at 30 sequence lengths (batch 2) and resnet18 at batch sizes
                                                     2-13 (64 px); resident memory from the third signature on
                                                     (Dynamo's second graph is built by then) and per later
                                                     signature, the median first call of a later signature, the
                                                     largest difference from eager
"""

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

LENGTHS = [5, 7, 8, 9, 11, 13, 16, 17, 19, 23, 24, 25, 29, 31, 32, 33, 37, 41, 47, 64]
MODELS = ["bert_tiny", "gpt2_tiny", "llama_tiny"]


def percall(only=None):
    import torch
    import fusion_jit  # noqa: F401
    from models import make, main_output

    def chain(x):
        return torch.tanh(x * 0.5 + 1.0) * torch.sigmoid(x) - x

    def softmax(x):
        return torch.softmax(x * 0.125, -1)

    def layer_norm(x):
        return torch.nn.functional.layer_norm(x, x.shape[-1:]) * 2.0 + 1.0

    def batch_norm(x, w, b, mean, var):
        return torch.relu(torch.nn.functional.batch_norm(x, mean, var, w, b, False, 0.1, 1e-5))

    channels_last = torch.randn(8, 64, 28, 28).contiguous(memory_format=torch.channels_last)
    cases = [("chain [512,1000]", chain, (torch.randn(512, 1000),)),
             ("softmax [256,1031]", softmax, (torch.randn(256, 1031),)),
             ("layer_norm [2048,257]", layer_norm, (torch.randn(2048, 257),)),
             # Per channel values in a per-call table (Note [Row-invariant values]).
             ("bn_relu NHWC [8,64,28,28]", batch_norm,
              (channels_last, torch.rand(64) + 0.5, torch.randn(64), torch.randn(64), torch.rand(64) + 0.5))]
    for name in MODELS:
        model, _ = make(name)
        model.eval()
        ids = torch.randint(0, 1000, (2, 61))
        cases.append((f"{name} [2,61]", lambda i, m=model: main_output(m(i)), (ids,)))
    if only:
        cases = [c for c in cases if only in c[0]]
    print(f"{'case':26} {'eager ms':>9} {'static ms':>10} {'dynamic ms':>11} {'dynamic/static':>15}")
    with torch.no_grad():
        for label, f, args in cases:
            torch._dynamo.reset()
            fns = {"eager": f}
            for kind, setting in (("static", "off"), ("dynamic", "on")):
                fns[kind] = torch.compile(f, backend="fusion_jit", dynamic=False,
                                          options={"dynamic_kernels": setting})
                fns[kind](*args)
            # Paired: each round times one static and one dynamic call back to back, in alternating order,
            # so the machine's drift hits both alike; the ratio is the median of the rounds' ratios.
            for g in fns.values():
                for _ in range(20):
                    g(*args)
            ratios, ms = [], {k: [] for k in fns}
            for i in range(600):
                order = ("static", "dynamic") if i % 2 == 0 else ("dynamic", "static")
                t = {}
                for k in order + ("eager",):
                    t0 = time.perf_counter()
                    fns[k](*args)
                    t[k] = time.perf_counter() - t0
                    ms[k].append(t[k] * 1e3)
                ratios.append(t["dynamic"] / t["static"])
            m = {k: statistics.median(v) for k, v in ms.items()}
            print(f"{label:26} {m['eager']:9.3f} {m['static']:10.3f} {m['dynamic']:11.3f} "
                  f"{statistics.median(ratios):15.3f}", flush=True)


def lengths_child(name, backend):
    import torch
    import fusion_jit
    from models import make, main_output

    model, _ = make(name)
    model.eval()
    inputs = [torch.randint(0, 1000, (2, n), generator=torch.Generator().manual_seed(n)) for n in LENGTHS]
    if backend == "eager":
        f = model
    elif backend == "inductor":
        f = torch.compile(model)
    else:
        f = torch.compile(model, backend="fusion_jit", options={"dynamic_kernels": backend.split(":")[1]})
    fusion_jit.reset()
    with torch.no_grad():
        t0 = time.perf_counter()
        for ids in inputs:
            main_output(f(ids))
        total = time.perf_counter() - t0
        # The steady state: each length once more, now compiled.
        t0 = time.perf_counter()
        for ids in inputs:
            main_output(f(ids))
        again = time.perf_counter() - t0
    s = fusion_jit.stats()
    print(json.dumps({"total_s": total, "second_pass_s": again, "compiles": s["compiles"], "graphs": s["graphs"],
                      "plans": s["plans"]}))


def newsize(count=None):
    import torch
    import fusion_jit
    from models import make, main_output

    print(f"{'model':12} {'class: first call ms':>21} {'template: first call ms':>24} {'lowered: first call ms':>23} "
          f"{'planned call ms (class / template)':>35} {'lowerings':>10} {'cache KB per length':>20}")
    cache_dir = torch.ops.fusion_jit.cache_dir()

    def cache_bytes():
        total = 0
        for root, _, files in os.walk(cache_dir):
            for name in files:
                try:
                    total += os.lstat(os.path.join(root, name)).st_size
                except OSError:  # an entry replaced meanwhile
                    pass
        return total

    for name in MODELS:
        model, _ = make(name)
        model.eval()
        lengths = LENGTHS if count is None else [8, 9] + list(range(11, 11 + count))
        inputs = [torch.randint(0, 1000, (2, n), generator=torch.Generator().manual_seed(n)) for n in lengths]
        row = {}
        for kind, options in (("class", {}), ("template", {"disable": "symbolic.class"}),
                              ("lowered", {"disable": "symbolic"})):
            torch._dynamo.reset()
            fusion_jit.reset()
            f = torch.compile(model, backend="fusion_jit", options=options)
            first, again = [], []
            with torch.no_grad():
                for k, ids in enumerate(inputs):
                    if k == 2:
                        grown = -cache_bytes()
                    t0 = time.perf_counter()
                    main_output(f(ids))
                    t1 = time.perf_counter()
                    main_output(f(ids))
                    t2 = time.perf_counter()
                    if k >= 2:  # the static graph's length and the symbolic graph's first are lowered by both
                        first.append((t1 - t0) * 1e3)
                        again.append((t2 - t1) * 1e3)
            grown += cache_bytes()
            row[kind] = (statistics.median(first), statistics.median(again), fusion_jit.stats()["lowerings"],
                         grown / len(first) / 1024)
        print(f"{name:12} {row['class'][0]:21.2f} {row['template'][0]:24.2f} {row['lowered'][0]:23.2f} "
              f"{row['class'][1]:24.3f} / {row['template'][1]:<8.3f} {row['class'][2]:>4} / {row['lowered'][2]:<4} "
              f"{row['class'][3]:20.1f}",
              flush=True)


def warmclass():
    import torch
    import fusion_jit
    from fusion_jit import _backend
    from models import make, main_output

    # The time add_from_class takes where it builds the class (capture from the class's text, passes, the
    # plan built or read from the plan cache, the instance and its checked first run).
    builds = []
    from_class = _backend._CompiledGraph._from_class

    def timed_from_class(self, *args, **kwargs):
        t0 = time.perf_counter()
        got = from_class(self, *args, **kwargs)
        if got is not None and got[0][7]:
            builds.append((time.perf_counter() - t0) * 1e3)
        return got

    _backend._CompiledGraph._from_class = timed_from_class
    cache_dir = torch.ops.fusion_jit.cache_dir()

    def drop_class_plans():
        """Removes the plan cache's entries of shape classes (plans whose numbers name a symbol), leaving
        every kernel and every plan of numbers: what a warm start found before classes were cached."""
        for root, _, files in os.walk(cache_dir):
            for fname in files:
                path = os.path.join(root, fname)
                try:
                    with open(path, "rb") as fh:
                        text = fh.read().decode("latin-1")
                except OSError:
                    continue
                if '"format":7' in text and re.search(r'"[-(]?[0-9*]*s[0-9]', text):
                    os.remove(path)

    print(f"{'model':12} {'class built: cold ms':>21} {'warm, from plan cache ms':>25} {'warm, rebuilt ms':>17} "
          f"{'warm first call ms':>19} {'next new length ms':>19} {'compiles when warm':>19}")
    for name in MODELS:
        model, _ = make(name)
        model.eval()
        ids = {n: torch.randint(0, 1000, (2, n), generator=torch.Generator().manual_seed(n)) for n in range(8, 90)}

        def timed(f, n):
            t0 = time.perf_counter()
            main_output(f(ids[n]))
            return (time.perf_counter() - t0) * 1e3

        with torch.no_grad():
            torch._dynamo.reset()
            fusion_jit.reset()
            f = torch.compile(model, backend="fusion_jit")
            timed(f, 8)
            builds.clear()
            timed(f, 9)  # the symbolic graph's first signature: its class built (and stored)
            cold = sum(builds)
            rows = {True: [], False: []}
            for r in range(6):
                cached = r % 2 == 0
                if not cached:
                    drop_class_plans()
                torch._dynamo.reset()
                fusion_jit.reset()
                f = torch.compile(model, backend="fusion_jit")
                timed(f, 8)
                builds.clear()
                first = timed(f, 21 + r)  # a length the first round never saw: the class read or rebuilt
                warm = sum(builds)
                nxt = statistics.median(timed(f, n) for n in range(30 + 10 * r, 40 + 10 * r))
                rows[cached].append((warm, first, nxt, fusion_jit.stats()["compiles"]))
        med = {c: [statistics.median(x[i] for x in rows[c]) for i in range(3)] for c in rows}
        compiles = max(x[3] for c in rows for x in rows[c])
        print(f"{name:12} {cold:21.2f} {med[True][0]:25.2f} {med[False][0]:17.2f} {med[True][1]:19.1f} "
              f"{med[True][2]:19.2f} {compiles:>19}", flush=True)
    _backend._CompiledGraph._from_class = from_class


def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def manylengths_child(name):
    import torch
    import fusion_jit
    from models import make, main_output

    model, _ = make(name)
    model.eval()
    f = torch.compile(model, backend="fusion_jit")
    shapes = [(b, n) for b in range(1, 5) for n in range(2, 129)]
    with torch.no_grad():
        main_output(f(torch.randint(0, 1000, shapes[0])))
        first = rss_mb()
        t0 = time.perf_counter()
        for shape in shapes[1:]:
            main_output(f(torch.randint(0, 1000, shape)))
        total = time.perf_counter() - t0
    s = fusion_jit.stats()
    print(json.dumps({"first_mb": first, "last_mb": rss_mb(), "total_s": total, "signatures": len(shapes),
                      "plans": s["plans"], "dropped": s["plans_dropped"], "compiles": s["compiles"]}))


def manylengths():
    print(f"{'model':12} {'FUSION_JIT_SHARED_PLANS':>24} {'signatures':>10} {'RSS first MB':>13} {'RSS last MB':>12} "
          f"{'plans built':>12} {'dropped':>8} {'compiles':>9} {'total s':>8}")
    for name in ["gpt2_tiny", "bert_tiny"]:
        for kept in ["16", "64", "1000000"]:
            with tempfile.TemporaryDirectory() as d:
                env = dict(os.environ, FUSION_JIT_CACHE_DIR=os.path.join(d, "fj"), FUSION_JIT_SHARED_PLANS=kept,
                           PYTHONUNBUFFERED="1")
                out = subprocess.run([sys.executable, __file__, "manychild", name], env=env, capture_output=True,
                                     text=True, check=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            print(f"{name:12} {kept:>24} {r['signatures']:>10} {r['first_mb']:13.1f} {r['last_mb']:12.1f} "
                  f"{r['plans']:>12} {r['dropped']:>8} {r['compiles']:>9} {r['total_s']:8.2f}", flush=True)


def frozen_child(case):
    import torch
    import fusion_jit
    from models import make

    torch.manual_seed(0)
    if case == "mlp":
        model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024))
        inputs = [torch.randn(2, n, 1024) for n in range(40, 160, 4)]
    else:
        model, _ = make(case, size=64)
        inputs = [torch.randn(b, 3, 64, 64) for b in range(2, 14)]
    model.eval()
    f = torch.compile(model, backend="fusion_jit", options={"freezing": True})
    firsts, err = [], 0.0
    with torch.no_grad():
        for i, x in enumerate(inputs):
            if i == 2:
                base = rss_mb()
            t0 = time.perf_counter()
            y = f(x)
            if i >= 2:
                firsts.append((time.perf_counter() - t0) * 1000.0)
            err = max(err, (y - model(x)).abs().max().item())
    s = fusion_jit.stats()
    print(json.dumps({"signatures": len(inputs), "base_mb": base, "last_mb": rss_mb(), "first_ms": statistics.median(firsts),
                      "plans": s["plans"], "eager_calls": s["eager_calls"], "compiles": s["compiles"], "err": err}))


def frozen():
    print(f"{'case':10} {'signatures':>10} {'RSS at 3rd MB':>14} {'RSS last MB':>12} {'MB per later one':>17} "
          f"{'first call ms':>14} {'plans':>6} {'eager calls':>12} {'compiles':>9} {'max |fj - eager|':>17}")
    for case in ["mlp", "resnet18"]:
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, FUSION_JIT_CACHE_DIR=os.path.join(d, "fj"), PYTHONUNBUFFERED="1")
            out = subprocess.run([sys.executable, __file__, "frozenchild", case], env=env, capture_output=True,
                                 text=True, check=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        per = (r["last_mb"] - r["base_mb"]) / (r["signatures"] - 2)
        print(f"{case:10} {r['signatures']:>10} {r['base_mb']:14.1f} {r['last_mb']:12.1f} {per:17.1f} "
              f"{r['first_ms']:14.1f} {r['plans']:>6} {r['eager_calls']:>12} {r['compiles']:>9} {r['err']:17.2e}",
              flush=True)


def lengths():
    backends = ["eager", "fusion_jit:auto", "fusion_jit:off", "inductor"]
    print(f"{'model':12} {'backend':16} {'20 lengths s':>13} {'again s':>8} {'compiles':>9} {'graphs':>7} {'plans':>6}")
    for name in MODELS:
        for b in backends:
            with tempfile.TemporaryDirectory() as d:
                env = dict(os.environ, FUSION_JIT_CACHE_DIR=os.path.join(d, "fj"),
                           TORCHINDUCTOR_CACHE_DIR=os.path.join(d, "inductor"), PYTHONUNBUFFERED="1")
                out = subprocess.run([sys.executable, __file__, "child", name, b], env=env, capture_output=True,
                                     text=True, check=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            compiles = r["compiles"] if b.startswith("fusion_jit") else "-"
            print(f"{name:12} {b:16} {r['total_s']:13.2f} {r['second_pass_s']:8.3f} {compiles!s:>9} "
                  f"{r['graphs'] if b.startswith('fusion_jit') else '-'!s:>7} "
                  f"{r['plans'] if b.startswith('fusion_jit') else '-'!s:>6}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "percall":
        percall(sys.argv[2] if len(sys.argv) > 2 else None)
    elif len(sys.argv) >= 2 and sys.argv[1] == "lengths":
        lengths()
    elif len(sys.argv) >= 2 and sys.argv[1] == "newsize":
        newsize(int(sys.argv[2]) if len(sys.argv) > 2 else None)
    elif len(sys.argv) >= 2 and sys.argv[1] == "warmclass":
        warmclass()
    elif len(sys.argv) >= 2 and sys.argv[1] == "manylengths":
        manylengths()
    elif len(sys.argv) >= 2 and sys.argv[1] == "frozen":
        frozen()
    elif len(sys.argv) == 3 and sys.argv[1] == "frozenchild":
        frozen_child(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "manychild":
        manylengths_child(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "child":
        lengths_child(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
