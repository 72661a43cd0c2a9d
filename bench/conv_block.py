"""The demo's conv_bn_relu block through torch.compile: eager, Inductor with freezing and fusion_jit in
several settings, calls interleaved in one process, with the minor page faults per call (getrusage).

    ./run python bench/conv_block.py [N,C,H,W] [ROUNDS]

Each fusion_jit variant names what it leaves out (`disable`): the channels-last plan and
prepack.nchw_result are what the conv probe decides (Note [Convolutions timed on this machine]).
Run under GLIBC_TUNABLES=glibc.malloc.mmap_threshold=268435456:glibc.malloc.trim_threshold=1073741824
for the figures without page faults (bench/RESULTS.md, issue 70)."""
import os
import resource
import sys
import time

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "examples"))
sys.path.insert(0, os.path.join(here, "..", "python"))
import fusion_jit  # noqa: E402,F401  (registers the backend)
import torch._inductor.config as inductor_config  # noqa: E402
from models import ConvBlock  # noqa: E402


def main():
    torch.set_num_threads(2)
    torch.manual_seed(0)
    m = ConvBlock().eval()
    shape = [int(s) for s in (sys.argv[1] if len(sys.argv) > 1 else "8,16,56,56").split(",")]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    x = torch.randn(*shape)
    inductor_config.freezing = True
    variants = {
        "eager": m,
        "inductor_freezing": torch.compile(m, backend="inductor"),
        "fj_freezing": torch.compile(m, backend="fusion_jit", options={"freezing": True}),
        "fj_freezing_nchw": torch.compile(m, backend="fusion_jit",
                                          options={"freezing": True, "disable": "channels_last"}),
        "fj_freezing_no_nchw_result": torch.compile(m, backend="fusion_jit",
                                                    options={"freezing": True, "disable": "prepack.nchw_result"}),
        "fj_default": torch.compile(m, backend="fusion_jit"),
    }
    with torch.no_grad():
        ref = m(x)
        for name, f in variants.items():
            err = (f(x) - ref).abs().max().item()
            assert err < 1e-4, (name, err)
        times = {k: [] for k in variants}
        faults = {k: 0 for k in variants}
        for _ in range(rounds):
            for name, f in variants.items():
                f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                t = time.perf_counter()
                f(x)
                times[name].append(time.perf_counter() - t)
                faults[name] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    eager = sorted(times["eager"])[rounds // 2]
    for name, v in times.items():
        med = sorted(v)[rounds // 2]
        print(f"{name:28s} {med * 1e3:7.3f} ms  {eager / med:5.2f}x eager  {faults[name] / rounds:7.0f} faults/call")


if __name__ == "__main__":
    main()
