"""ATen's GEMM against oneDNN's on the linear shapes of the suite's models, on this machine (the choice the
gemm rules measure at plan build, Note [GEMM backend measured on this machine]):

    ./run python bench/gemm_shapes.py [--models convnext_tiny,vit_b_16,timm_deit_tiny] [--calls 60]

For each [rows, K] x [K, N] float32 shape (with bias) of a model at batch 1 and 224 pixels: the median
time of torch.addmm (eager's linear: MKL's sgemm in torch's builds), of mkldnn::_linear_pointwise on the
plain weight (what gemm.linear makes), and of both with a following exact gelu (addmm then gelu, against
oneDNN's gelu post-op), the calls alternating one by one with the order reversed at every call; and the
per-call total of each column over the model's linears (count x median).
"""

import argparse
import statistics
import time

import torch

# (rows, K, N, linears of the shape per call, gelu after it)
SHAPES = {
    "convnext_tiny": [(3136, 96, 384, 3, True), (3136, 384, 96, 3, False), (784, 192, 768, 3, True),
                      (784, 768, 192, 3, False), (196, 384, 1536, 9, True), (196, 1536, 384, 9, False),
                      (49, 768, 3072, 3, True), (49, 3072, 768, 3, False)],
    "vit_b_16": [(197, 768, 2304, 12, False), (197, 768, 768, 12, False), (197, 768, 3072, 12, True),
                 (197, 3072, 768, 12, False)],
    "timm_deit_tiny": [(197, 192, 576, 12, False), (197, 192, 192, 12, False), (197, 192, 768, 12, True),
                       (197, 768, 192, 12, False)],
}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(SHAPES))
    p.add_argument("--calls", type=int, default=60)
    a = p.parse_args()
    torch.set_num_threads(2)
    gelu = torch.nn.functional.gelu
    print(f"threads {torch.get_num_threads()}, torch {torch.__version__}")
    print("| model | rows x K x N | count | ATen us | oneDNN us | oneDNN / ATen | ATen + gelu us | oneDNN gelu post-op us |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    with torch.no_grad():
        for model in a.models.split(","):
            totals = [0.0] * 4
            for rows, k, n, count, act in SHAPES[model]:
                x, w, b = torch.randn(rows, k), torch.randn(n, k) * 0.05, torch.randn(n)
                fns = [lambda: torch.addmm(b, x, w.t()),
                       lambda: torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], None),
                       lambda: gelu(torch.addmm(b, x, w.t())),
                       lambda: torch.ops.mkldnn._linear_pointwise(x, w, b, "gelu", [], "none")]
                ts = [[] for _ in fns]
                for f in fns:
                    f()
                order = list(range(len(fns)))
                for i in range(a.calls):
                    for j in (order if i % 2 == 0 else order[::-1]):
                        t0 = time.perf_counter()
                        fns[j]()
                        ts[j].append((time.perf_counter() - t0) * 1e6)
                med = [statistics.median(t) for t in ts]
                for j in range(4):
                    totals[j] += count * (med[j] if act or j < 2 else med[j - 2])
                print(f"| {model} | {rows} x {k} x {n} | {count} | {med[0]:.0f} | {med[1]:.0f} | {med[1] / med[0]:.2f} "
                      f"| {med[2]:.0f} | {med[3]:.0f} |", flush=True)
            print(f"| {model} | per call, ms | | {totals[0] / 1e3:.2f} | {totals[1] / 1e3:.2f} | "
                  f"{totals[1] / totals[0]:.2f} | {totals[2] / 1e3:.2f} | {totals[3] / 1e3:.2f} |", flush=True)


if __name__ == "__main__":
    main()
