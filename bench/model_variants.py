"""One model of tests/python/models.py through fusion_jit in this process, eager measured beside it:

    FUSION_JIT_DISABLE=channels_last ./run python bench/model_variants.py resnet18 [--size 224] [--iters 20]
        [--no-freezing] [--inductor] [--disable RULES ...] [--paired N]

prints one JSON line: eager and fusion_jit medians (ms, over `iters` calls each, timed in rotating rounds
by bench/models.py's interleaved_many), kernels and ATen steps per call (summed over the fusion_jit
variants). With --inductor, Inductor in the same setting (torch._inductor.config.freezing as fusion_jit's
freezing) is compiled in this process too and timed in the same rounds, as the suite does. Each --disable
RULES (a comma list of FUSION_JIT_DISABLE's pass and rule names) adds a fusion_jit variant compiled with the
`disable` option, timed in the same rounds: a rule's worth measured within one process. Process-wide
switches (FUSION_JIT_DISABLE=fusion, cat, ..., FUSION_JIT_ENABLE) are chosen by the environment: run it once
per such variant, alternating, and compare the ratios eager / fusion_jit.
With --paired N the calls alternate one by one instead (N calls of each, the order reversed at every call),
and the row adds each variant's median of per-call ratios to the last variant timed (Inductor with
--inductor, else the last fusion_jit variant): this machine's speed drifts within seconds, and a call's neighbour meets the same
machine.
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "python"))


def _bench_models():
    # bench/models.py (its median_ms); tests/python/models.py is the `models` on the path.
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_models", os.path.join(HERE, "models.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--no-freezing", action="store_true")
    p.add_argument("--inductor", action="store_true", help="also time Inductor in the same rounds")
    p.add_argument("--disable", action="append", default=[],
                   help="also time fusion_jit with these rules left out (repeatable)")
    p.add_argument("--paired", type=int, default=0, metavar="N",
                   help="alternate the variants call by call, N calls each, and report per-call ratios")
    a = p.parse_args()
    import torch
    import fusion_jit
    from models import MODELS, make
    bench_models = _bench_models()
    interleaved_many, paired = bench_models.interleaved_many, bench_models.paired
    if a.model not in MODELS:
        sys.exit(f"unknown model {a.model!r} (known: {', '.join(MODELS)})")
    model, args = make(a.model, size=a.size)
    model.eval()
    compiled = fusion_jit.compile(model, freezing=not a.no_freezing)
    fns = [lambda: model(*args), lambda: compiled(*args)]
    variants = [fusion_jit.compile(model, freezing=not a.no_freezing, disable=d) for d in a.disable]
    fns += [lambda v=v: v(*args) for v in variants]
    if a.inductor:
        torch._inductor.config.freezing = not a.no_freezing
        inductor = torch.compile(model)
        fns.append(lambda: inductor(*args))
    with torch.no_grad():
        for fn in fns:
            fn()
        if a.paired:
            medians, ratios = paired(fns, a.paired)
        else:
            medians, _ = interleaved_many(fns, a.iters)
    s = fusion_jit.stats()
    row = {"model": a.model, "eager_ms": medians[0], "fusion_jit_ms": medians[1]}
    for k, d in enumerate(a.disable):
        row[f"disable {d} ms"] = medians[2 + k]
    if a.inductor:
        row["inductor_ms"] = medians[-1]
        row["fusion_jit_over_inductor"] = medians[1] / medians[-1]
    if a.paired:
        # Each variant's ratio to the last one timed (Inductor with --inductor, else the last fusion_jit one).
        names = ["eager", "fusion_jit"] + [f"disable {d}" for d in a.disable] + (["inductor"] if a.inductor else [])
        row[f"median per-call ratio to {names[-1]}"] = {n: r for n, r in zip(names[:-1], ratios)}
    print(json.dumps({**row, "kernels": s["kernels"], "aten_steps": s["fallback_ops"]}))


if __name__ == "__main__":
    main()
