"""What the weight memo (Note [Weights reordered once per content], src/torch/executor.h) costs and saves,
per model of tests/python/models.py, with default settings (weights are inputs of each call):

    ./run python bench/weight_memo.py [--models resnet18,timm_regnetx_002] [--calls 40] [--size 224]

prints one JSON line per model:
- hash_ms: the memo's steps per call where every weight is unchanged (the XXH3-128 of each weight: the
  check that takes the kept reorder), from fusion_jit.profile();
- miss_ms: the same steps where every weight changed through `.data` before the call (the hash and the
  reorder);
- eager_ms, fj_ms, no_memo_ms: medians of the model called eagerly, through fusion_jit, and through
  fusion_jit with disable="weight_memo" (oneDNN reorders inside every convolution), called one after
  another (bench/models.py's paired), and fj / no_memo as the median per-call ratio.
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)

from model_variants import _bench_models  # noqa: E402  (bench/models.py, loaded by path)


def memo_ms(fn, calls, before=None):
    """Per call: the time of the plans' weight reorder steps (hits: the hash alone), and how many ran."""
    import fusion_jit
    total, steps = 0.0, 0
    for _ in range(calls):
        if before is not None:
            before()
        with fusion_jit.profile() as p:
            fn()
        calls_ms = p.summary()["ops"].get("mkldnn::_reorder_convolution_weight", (0, 0.0))
        steps += calls_ms[0]
        total += calls_ms[1]
    return total / calls, steps / calls


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet18,timm_regnetx_002,mobilenet_v3_small,efficientnet_b0")
    p.add_argument("--calls", type=int, default=40)
    p.add_argument("--size", type=int, default=224, help="image size (default 224, as bench/models.py)")
    a = p.parse_args()
    import torch
    import fusion_jit
    from models import make
    paired = _bench_models().paired
    for name in a.models.split(","):
        torch._dynamo.reset()
        fusion_jit.reset()
        model, args = make(name, size=a.size)
        model.eval()
        fj = fusion_jit.compile(model)
        no_memo = fusion_jit.compile(model, disable="weight_memo")
        fns = [lambda: model(*args), lambda: fj(*args), lambda: no_memo(*args)]
        convs = [m.weight for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
        with torch.no_grad():
            for fn in fns:
                fn()
                fn()
            hit_ms, hit_steps = memo_ms(fns[1], a.calls)

            def flip():  # every conv weight's bytes change, no version counter of the weight moves
                for w in convs:
                    w.data.neg_()
            miss_ms, miss_steps = memo_ms(fns[1], a.calls, before=flip)
            if a.calls % 2:
                flip()  # the weights as they were
            medians, ratios = paired(fns, a.calls)
        weights = sum(w.numel() for w in convs)
        print(json.dumps({
            "model": name, "size": a.size, "conv_weight_elements": weights, "memo_steps_per_call": hit_steps,
            "hash_ms": round(hit_ms, 3), "miss_ms": round(miss_ms, 3), "miss_steps_per_call": miss_steps,
            "eager_ms": round(medians[0], 3), "fj_ms": round(medians[1], 3), "no_memo_ms": round(medians[2], 3),
            "fj_over_no_memo_per_call": round(ratios[1], 3)}), flush=True)


if __name__ == "__main__":
    main()
