"""max_pool2d on CPU (Note [Max pooling as loads]): eager (ATen), Inductor and fusion_jit's one kernel of
strided loads, on ResNet's stem pool (3x3, stride 2, padding 1 over [1,64,112,112]), channels-last and
NCHW, timed in rotating rounds in one process (median per call, ms), and fusion_jit's plan time alone
(fusion_jit.profile: the kernel and the plan's own overhead, without the torch.compile call's).

    ./run python bench/max_pool.py [--iters N]
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import fusion_jit  # noqa: E402


class Pool(torch.nn.Module):
    def forward(self, x):
        return F.max_pool2d(x, 3, 2, 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=300)
    a = ap.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    for layout in ("channels_last", "nchw"):
        torch.manual_seed(0)
        x = torch.randn(1, 64, 112, 112)
        if layout == "channels_last":
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.no_grad():
            fns = {"eager": Pool(), "inductor": torch.compile(Pool()),
                   "fusion_jit": torch.compile(Pool(), backend="fusion_jit")}
            ref = Pool()(x)
            for name, f in fns.items():
                out = f(x)
                assert torch.equal(out, ref) and out.stride() == ref.stride(), name
            # Five rounds, each running every variant for a fifth of the calls in a row, in an order rotated
            # from round to round (call by call, one variant's allocations would change the next one's).
            times = {k: [] for k in fns}
            names = list(fns)
            for r in range(5):
                for name in names[r % 3:] + names[:r % 3]:
                    for _ in range(a.iters // 5):
                        t0 = time.perf_counter()
                        fns[name](x)
                        times[name].append(time.perf_counter() - t0)
            with fusion_jit.profile() as p:
                for _ in range(a.iters):
                    fns["fusion_jit"](x)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        plan_ms = p.table().splitlines()[0].split(",")[1].split()[0]
        print(f"{layout:14s} " + "  ".join(f"{k} {v:.3f}" for k, v in med.items()) +
              f"  | fusion_jit plan {float(plan_ms) / 1e3:.3f}  eager/fusion_jit {med['eager'] / med['fusion_jit']:.2f}x"
              f"  inductor/fusion_jit {med['inductor'] / med['fusion_jit']:.2f}x")
        torch._dynamo.reset()


if __name__ == "__main__":
    main()
