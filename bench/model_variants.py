"""One model of tests/python/models.py through fusion_jit in this process, eager measured beside it:

    FUSION_JIT_DISABLE=channels_last ./run python bench/model_variants.py resnet18 [--size 224] [--iters 20]
        [--no-freezing]

prints one JSON line: eager and fusion_jit medians (ms, over `iters` calls each, timed in alternating rounds
by bench/models.py's interleaved_ms), kernels and ATen steps per call. Variants are chosen by the environment (FUSION_JIT_DISABLE, FUSION_JIT_ENABLE):
run it once per variant, alternating, and compare the ratios eager / fusion_jit.
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
    a = p.parse_args()
    import torch
    import fusion_jit
    from models import MODELS, make
    interleaved_ms = _bench_models().interleaved_ms
    if a.model not in MODELS:
        sys.exit(f"unknown model {a.model!r} (known: {', '.join(MODELS)})")
    model, args = make(a.model, size=a.size)
    model.eval()
    compiled = fusion_jit.compile(model, freezing=not a.no_freezing)
    with torch.no_grad():
        compiled(*args)
        eager_ms, compiled_ms, _ = interleaved_ms(lambda: model(*args), lambda: compiled(*args), a.iters)
    s = fusion_jit.stats()
    print(json.dumps({"model": a.model, "eager_ms": eager_ms, "fusion_jit_ms": compiled_ms,
                      "kernels": s["kernels"], "aten_steps": s["fallback_ops"]}))


if __name__ == "__main__":
    main()
