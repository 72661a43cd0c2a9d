"""./run demo: builds the example models, runs each through fusion-jit on the CPU with --check and
--bench, and prints a table."""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import MODELS, make_models  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True, help="path of the fusion-jit binary")
    ap.add_argument("--bench", type=int, default=20, help="timed iterations per model")
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    paths = make_models(os.path.join(here, "models"))
    rows, failed, no_kernels = [], False, set()
    for name, (_, specs) in MODELS.items():
        cmd = [args.cli, "run", paths[name], "--input", *specs, "--check", "--bench", str(args.bench), "--json"]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode not in (0, 1):
            print(f"{name}: fusion-jit failed (exit {p.returncode}): {p.stderr.strip()}", file=sys.stderr)
            failed = True
            continue
        r = json.loads(p.stdout)
        failed |= r["check"] != "pass"
        aten_steps = sum(r["fallback_ops"].values())
        if r["kernels"] == 0:
            no_kernels.add(name)
        rows.append((name, r["ops"], r["ops"], r["kernels"] + aten_steps, r["check"], r["eager_ms"], r["fused_ms"],
                     r["eager_ms"] / r["fused_ms"], r["compile_ms"]))
    head = ("model", "ops", "kernels eager", "kernels fused", "check", "eager ms", "fused ms", "speedup", "compile ms")
    print("%-18s %5s %14s %14s %6s %10s %10s %8s %11s" % head)
    for r in rows:
        print("%-18s %5d %14d %14d %6s %10.3f %10.3f %7.2fx %11.1f" % r)
    # A row not faster than eager says why in one line: a plan of library calls alone runs what eager runs
    # (nothing to fuse), otherwise it is a finding to report.
    for name, _, _, fused_steps, _, _, _, speedup, _ in rows:
        if speedup < 1.0:
            why = (f"{name}: {fused_steps} library call(s) and no kernel of ours: nothing to fuse, the plan runs "
                   "what eager runs" if name in no_kernels else
                   f"{name}: slower than eager in this run; `fusion-jit explain` and `run --profile` show where "
                   "the time goes")
            print(why)
    import torch_compile  # the Python package: torch.compile(backend="fusion_jit")
    failed |= torch_compile.main() != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
