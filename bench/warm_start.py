"""Time to first result of each demo model: cold (empty kernel cache), warm from disk in a fresh process,
and eager's first call, measured in the same processes.

    ./run python bench/warm_start.py build/fusion-jit [--rounds 3]

Each round: `fusion-jit run MODEL --json` with an emptied cache (cold), then again in a fresh process
(warm, with FUSION_JIT_ASSERT_NO_COMPILE=1: no compiler may run). eager_first_ms is the model's first
eager call in each process; first_call_ms is the fused first call (capture, passes, plan, kernels
compiled or loaded, run). Medians over the rounds.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from models import MODELS, make_models  # noqa: E402


def run(cli, model, specs, env):
    p = subprocess.run([cli, "run", model, "--input", *specs, "--json"], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{model}: {p.stderr.strip()}")
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cli")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="fj-warm-")
    paths = make_models(os.path.join(tmp, "models"))
    print(f"{'model':<18} {'eager first':>12} {'cold first':>11} {'warm first':>11} {'warm - eager':>13} {'compilers (warm)':>17}")
    for name, (_, specs) in MODELS.items():
        rows = []
        for r in range(args.rounds):
            cache = os.path.join(tmp, f"cache-{name}-{r}")
            env = dict(os.environ, FUSION_JIT_CACHE_DIR=cache)
            cold = run(args.cli, paths[name], specs, env)
            warm = run(args.cli, paths[name], specs, dict(env, FUSION_JIT_ASSERT_NO_COMPILE="1"))
            rows.append((warm["eager_first_ms"], cold["first_call_ms"], warm["first_call_ms"],
                         warm["compiler_invocations"]))
        med = [statistics.median(r[i] for r in rows) for i in range(3)]
        print(f"{name:<18} {med[0]:>10.1f}ms {med[1]:>9.1f}ms {med[2]:>9.1f}ms {med[2] - med[0]:>11.1f}ms "
              f"{max(r[3] for r in rows):>17}")


if __name__ == "__main__":
    main()
