"""Reduction patterns on the CPU: eager PyTorch, Inductor and fusion_jit, measured in one run.

    ./run python bench/bench_reductions.py --cli build/fusion-jit [--iters 30] [--only NAME[,NAME]]
                                           [--size 4096,1024] [--json OUT]

Six small modules over float32 [R, C] inputs (default [4096, 1024]), reducing over the last dim:
softmax_scaled_masked, layer_norm_residual, rms_norm_weight, log_softmax, mean_var, gelu_mean.
- eager: model(*inputs) under torch.no_grad(), 3 warm-up calls, then the median of --iters calls.
- inductor: torch.compile(model) (default backend); its first call is reported as compile seconds,
  then timed like eager. A failure prints the error and gives "n/a".
- fusion_jit: the model as TorchScript, run by `fusion-jit run MODEL.pt --input SPEC... --check
  --bench N --json` in a child process. The CLI draws its own random inputs of the same shapes and times
  its own eager baseline (the TorchScript interpreter), shown as "cli eager" for reference only.
Compile times are warm when Inductor's or fusion_jit's on-disk caches already hold the kernels.
Every backend runs with os.cpu_count() threads (torch.set_num_threads here, OMP_NUM_THREADS for the CLI).

Bars, per pattern: speedup = python eager / fusion_jit >= 1.5, and fusion_jit / inductor <= 1.1.
"""
import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class SoftmaxScaledMasked(nn.Module):
    def forward(self, x, mask):
        return F.softmax(x * 0.125 + mask, dim=-1)


class LayerNormResidual(nn.Module):
    __constants__ = ["c"]  # a constant in TorchScript's graph, not an attribute read

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.bias = nn.Parameter(torch.randn(c) * 0.1)
        self.w = nn.Parameter(torch.rand(c) + 0.5)
        self.b = nn.Parameter(torch.randn(c) * 0.1)

    def forward(self, x, r):
        return F.layer_norm(x + self.bias + r, [self.c], self.w, self.b, 1e-5)


class RMSNormWeight(nn.Module):
    __constants__ = ["c"]

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.w = nn.Parameter(torch.rand(c) + 0.5)

    def forward(self, x):
        return F.rms_norm(x, [self.c]) * self.w


class LogSoftmax(nn.Module):
    def forward(self, x):
        return F.log_softmax(x, -1)


class MeanVar(nn.Module):
    def forward(self, x):
        return x.mean(-1), x.var(-1)


class GeluMean(nn.Module):
    def forward(self, x):
        return F.gelu(x).mean(-1)


def one(r, c):
    return [torch.randn(r, c)]


# name -> (constructor taking C, input maker taking (R, C)); the mask stays finite (-1e4, not -inf)
PATTERNS = {
    "softmax_scaled_masked": (lambda c: SoftmaxScaledMasked(),
                              lambda r, c: [torch.randn(r, c), torch.where(torch.rand(r, c) < 0.1, -1e4, 0.0)]),
    "layer_norm_residual": (LayerNormResidual, lambda r, c: one(r, c) + one(r, c)),
    "rms_norm_weight": (RMSNormWeight, one),
    "log_softmax": (lambda c: LogSoftmax(), one),
    "mean_var": (lambda c: MeanVar(), one),
    "gelu_mean": (lambda c: GeluMean(), one),
}


def median_ms(fn, iters, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def run_inductor(model, inputs, iters, row):
    try:
        compiled = torch.compile(model)
        t = time.perf_counter()
        out = compiled(*inputs)
        row["inductor_compile_s"] = time.perf_counter() - t
        ref = model(*inputs)
        for o, e in zip(out if isinstance(out, tuple) else (out,), ref if isinstance(ref, tuple) else (ref,)):
            if not torch.allclose(o, e, rtol=1e-4, atol=1e-4):
                row["notes"].append("inductor output differs from eager")
        row["inductor_ms"] = median_ms(lambda: compiled(*inputs), iters)
    except Exception as e:  # noqa: BLE001: any Inductor failure is reported, not fatal
        msg = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
        print(f"inductor failed on {row['name']}: {msg}", file=sys.stderr)
        row["notes"].append("inductor: " + msg[:120])


def run_fusion_jit(cli, model, inputs, iters, tmp, threads, row):
    path = os.path.join(tmp, row["name"] + ".pt")
    torch.jit.script(model.eval()).save(path + ".tmp")
    os.replace(path + ".tmp", path)
    specs = ["f32[%s]" % ",".join(map(str, t.shape)) for t in inputs]
    cmd = [cli, "run", path, "--input", *specs, "--check", "--bench", str(iters), "--json"]
    err = ""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
        err = (p.stderr.strip().splitlines() or [""])[-1]
        if p.returncode not in (0, 1):  # 1 is a --check mismatch, reported in the JSON
            raise ValueError(f"exit {p.returncode}")
        r = json.loads(p.stdout) if p.stdout.strip() else None
        if not isinstance(r, dict):
            raise ValueError(f"exit {p.returncode}, no JSON on stdout")
    except (OSError, ValueError) as e:
        row["notes"].append(f"fusion-jit failed ({e}): {err[:160]}")
        return
    row.update(fj_ms=r["fused_ms"], cli_eager_ms=r["eager_ms"], fj_compile_ms=r["compile_ms"], fj_kernels=r["kernels"],
               fj_aten_ops=sum(r["fallback_ops"].values()), fj_check=r["check"], fj_max_abs_err=r["max_abs_err"])
    for key in ("check_message", "eager_fallback"):
        if r.get(key):
            row["notes"].append(f"{key}: {r[key]}")
    if r["fallback_ops"]:
        row["notes"].append("aten ops: " + ", ".join(f"{k} x{v}" for k, v in r["fallback_ops"].items()))


def fmt(v, spec, width, suffix=""):
    return (format(v, spec) + suffix if isinstance(v, (int, float)) else "n/a").rjust(width)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cli", required=True, help="path of the fusion-jit binary")
    ap.add_argument("--iters", type=int, default=30, help="timed iterations (median) per backend")
    ap.add_argument("--only", help="comma-separated pattern names")
    ap.add_argument("--size", default="4096,1024", help="R,C of the inputs")
    ap.add_argument("--json", help="write the results to this file")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # keeps the table in order with stderr's progress lines
    rows_n, cols_n = (int(s) for s in args.size.split(","))
    names = args.only.split(",") if args.only else list(PATTERNS)
    unknown = [n for n in names if n not in PATTERNS]
    if unknown:
        ap.error(f"unknown pattern(s) {unknown}; choose from {list(PATTERNS)}")
    threads = os.cpu_count()
    torch.set_num_threads(threads)
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    launcher = ["./run", "python"] if "fusion_jit" in sys.prefix else [sys.executable]
    command = shlex.join(launcher + sys.argv)
    machine = {"cpu_count": threads, "cpu": cpu, "torch": torch.__version__, "threads": torch.get_num_threads(),
               "command": command, "size": [rows_n, cols_n], "iters": args.iters}
    print(f"command: {command}")
    print(f"machine: {threads} CPUs ({cpu}), torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"float32 [{rows_n},{cols_n}], median of {args.iters}")
    tmp = tempfile.mkdtemp(prefix="fj-bench-red-")
    results = []
    try:
        for name in names:
            ctor, make_inputs = PATTERNS[name]
            torch.manual_seed(0)
            model, inputs = ctor(cols_n).eval(), make_inputs(rows_n, cols_n)
            row = {"name": name, "notes": []}
            with torch.no_grad():
                row["eager_ms"] = median_ms(lambda: model(*inputs), args.iters)
                run_inductor(model, inputs, args.iters, row)
            run_fusion_jit(args.cli, model, inputs, args.iters, tmp, threads, row)
            eager, fj, ind = row["eager_ms"], row.get("fj_ms"), row.get("inductor_ms")
            row["speedup"] = eager / fj if fj else None
            row["fj_over_inductor"] = fj / ind if fj and ind else None
            row["bar_speedup"] = "n/a" if fj is None else "PASS" if row["speedup"] >= 1.5 else "FAIL"
            row["bar_inductor"] = "n/a" if row["fj_over_inductor"] is None else \
                "PASS" if row["fj_over_inductor"] <= 1.1 else "FAIL"
            results.append(row)
            print(f"  {name}: done", file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    head = ("pattern", "eager ms", "ind ms", "ind cmp s", "fj ms", "cli eager", "speedup", "fj/ind", "kern+aten", "check",
            ">=1.5x", "<=1.1 ind")
    print("%-22s %9s %9s %9s %9s %9s %8s %7s %9s %6s %6s %9s" % head)
    for r in results:
        k = f"{r['fj_kernels']}+{r['fj_aten_ops']}" if "fj_kernels" in r else "n/a"
        print(f"{r['name']:<22} {fmt(r['eager_ms'], '.3f', 9)} {fmt(r.get('inductor_ms'), '.3f', 9)} "
              f"{fmt(r.get('inductor_compile_s'), '.1f', 9)} {fmt(r.get('fj_ms'), '.3f', 9)} "
              f"{fmt(r.get('cli_eager_ms'), '.3f', 9)} {fmt(r['speedup'], '.2f', 8, 'x')} {fmt(r['fj_over_inductor'], '.2f', 7)} "
              f"{k:>9} {r.get('fj_check', 'n/a'):>6} {r['bar_speedup']:>6} {r['bar_inductor']:>9}")
    notes = [(r["name"], n) for r in results for n in r["notes"]]
    if notes:
        print("notes:")
        for name, n in notes:
            print(f"  {name}: {n}")
    if args.json:
        with open(args.json + ".tmp", "w") as f:
            json.dump({"machine": machine, "results": results}, f, indent=2)
        os.replace(args.json + ".tmp", args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
