"""The torch.compile backend on a GPU (a step of tests/gpu/run.sh): the Python tests' models on the device,
compiled with backend="fusion_jit" with default settings and with freezing, against eager on the same
device: the main output's largest difference relative to its largest magnitude (bar 1e-3; cuDNN's and
cuBLAS's float32 defaults are the same for both), median times of 30 calls, the first call's time (capture
and compile), kernels and ATen steps. One line per model and setting; a model that fails says why.
The language models then run at eight sequence lengths through one compiled model (Note [Plans of a shape
class] on the GPU: Dynamo makes the length symbolic at its second value, and each later length is an
instance of the class's plan, its kernels launched with that length's sizes and dividers): each length
against eager by the same bar, the compiler runs (NVRTC) and the class plans and instances counted.

    python3 tests/gpu/backend_cuda.py [DEVICE [MODEL,MODEL,...]]     (default: cuda, seven models)

It needs the native library (FUSION_JIT_LIBRARY or build/) and torchvision, timm and transformers.
"""
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

import fusion_jit  # noqa: E402
from models import main_output, make  # noqa: E402

DEFAULT = ["resnet18", "mobilenet_v3_small", "timm_regnetx_002", "vit_b_16", "bert_tiny", "gpt2_tiny", "llama_tiny"]


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def median_ms(fn, device, calls=30):
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


# The lines that say a model failed or differs from eager: any makes the exit status 1 (issue 72: a
# failure used to exit 0, leaving only the printed word).
FAILURES = []


def failed(line):
    FAILURES.append(line)
    print(line, flush=True)


def main():
    device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    names = sys.argv[2].split(",") if len(sys.argv) > 2 else DEFAULT
    for name in names:
        for label, options in (("default", {}), ("freezing", {"freezing": True})):
            try:
                model, args = make(name)
                model = model.to(device).eval()
                args = tuple(a.to(device) for a in args)
                with torch.no_grad():
                    ref = main_output(model(*args)).float()
                    eager_ms = median_ms(lambda: model(*args), device)
                    torch._dynamo.reset()
                    fusion_jit.reset()
                    compiled = torch.compile(model, backend="fusion_jit", options=options)
                    t0 = time.perf_counter()
                    got = main_output(compiled(*args)).float()
                    sync(device)
                    first_ms = (time.perf_counter() - t0) * 1e3
                    fused_ms = median_ms(lambda: compiled(*args), device)
                rel = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
                st = fusion_jit.stats()
                verdict = "ok" if rel <= 1e-3 and got.device == ref.device else "MISMATCH"
                (print if verdict == "ok" else failed)(
                    f"{name} {label}: {verdict}: relative diff {rel:.1e}, eager {eager_ms:.3f} ms, fused "
                    f"{fused_ms:.3f} ms ({eager_ms / fused_ms:.2f}x), first call {first_ms:.0f} ms, "
                    f"{st['kernels']} kernels, {st['fallback_ops']} ATen steps, {st['eager_graphs']} graphs eager")
            except Exception as e:  # noqa: BLE001
                failed(f"{name} {label}: FAILED: {type(e).__name__}: {str(e).strip()[-400:]}")

    for name in names:
        if name in LANGUAGE_MODELS:
            lengths(name, device)


LANGUAGE_MODELS = ("bert_tiny", "gpt2_tiny", "llama_tiny")
LENGTHS = (5, 7, 9, 13, 16, 17, 24, 31)


def lengths(name, device):
    try:
        model, _ = make(name)
        model = model.to(device).eval()
        torch._dynamo.reset()
        fusion_jit.reset()
        compiled = torch.compile(model, backend="fusion_jit")
        worst, firsts = 0.0, []
        with torch.no_grad():
            for n in LENGTHS:
                ids = torch.randint(0, 1000, (2, n), generator=torch.Generator().manual_seed(n)).to(device)
                ref = main_output(model(ids)).float()
                t0 = time.perf_counter()
                got = main_output(compiled(ids)).float()
                sync(device)
                firsts.append((time.perf_counter() - t0) * 1e3)
                rel = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
                worst = max(worst, rel)
                if rel > 1e-3 or got.device != ref.device:
                    raise AssertionError(f"length {n}: relative diff {rel:.1e} on {got.device}")
        st = fusion_jit.stats()
        print(f"{name} lengths: ok: {len(LENGTHS)} lengths {LENGTHS[0]}-{LENGTHS[-1]}, relative diff at most "
              f"{worst:.1e}, {st['compiles']} compiles for {st['graphs']} graphs, {st['class_plans']} class plans, "
              f"{st['class_instances']} instances, {st['eager_graphs']} graphs eager; first calls "
              f"{', '.join(f'{t:.0f}' for t in firsts)} ms", flush=True)
    except Exception as e:  # noqa: BLE001
        failed(f"{name} lengths: FAILED: {type(e).__name__}: {str(e).strip()[-400:]}")


if __name__ == "__main__":
    main()
    if FAILURES:
        print(f"backend_cuda.py: {len(FAILURES)} failed:\n" + "\n".join(FAILURES), file=sys.stderr)
        sys.exit(1)
