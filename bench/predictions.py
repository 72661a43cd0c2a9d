"""The time model's predictions against measurement (issue 65, Note [Kernel times] in src/cost/kernel_time.h):
each step of each model's plan, predicted and measured as `fusion-jit run MODEL --profile N --json` reports
them, over the demo models (examples/models.py) and the model families of tests/python/models.py traced to
TorchScript (a model that does not trace is named and left out).

    ./run python bench/predictions.py [--models a,b] [--calls N] [--json FILE] [--decisions]

Prints, per model, the kernels' and the ATen steps' median and mean absolute error (|predicted - measured|
/ measured), then the same over every model's kernels together, and the largest misses. Run
`fusion-jit calibrate` first to measure with this machine's figures (the table names which were used).

With --decisions: `fusion-jit explain MODEL --measure-decisions --json` instead (each fusion the fuser
accepted built the other way too, both timed; Note [Decisions measured both ways]): per model its summary
line, then the totals: decisions that agree with measurement of those whose two plans differ by more
than 5%, the same for the time model's predictions, and the kernel time error over every timing.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, os.path.join(ROOT, "examples"))


def demo_models(out):
    import torch
    from models import make_models, MODELS as DEMO  # examples/models.py

    paths = make_models(out)
    result = {}
    for name, (_, specs) in DEMO.items():
        result[name] = (paths[name], ["--input", *specs])
    return result


def traced_models(out, names):
    import torch
    import importlib.util

    spec = importlib.util.spec_from_file_location("test_models", os.path.join(ROOT, "tests", "python", "models.py"))
    tm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tm)
    result = {}
    for name in tm.MODELS:
        if names and name not in names:
            continue
        try:
            model, args = tm.make(name)
            model.eval()
            with torch.no_grad():
                traced = torch.jit.trace(model, args, strict=False, check_trace=False)
            path = os.path.join(out, name + ".pt")
            traced.save(path)
            inputs = os.path.join(out, name + ".inputs.pt")
            torch.save(tuple(args), inputs)
            result[name] = (path, ["--inputs", inputs])
        except Exception as e:  # noqa: BLE001 - name it and go on
            print(f"{name}: not traced ({type(e).__name__}: {str(e).splitlines()[0][:100]})", file=sys.stderr)
    return result


def errors(pcts):
    if not pcts:
        return "-"
    return f"median {statistics.median(pcts):.0f}%, mean {statistics.mean(pcts):.0f}% over {len(pcts)}"


def decisions(a, models):
    total = {"counted": 0, "agree": 0, "within_5pct": 0, "time_model_agrees": 0}
    wrong, rows = [], []
    for name, (path, inputs) in models.items():
        r = subprocess.run([a.cli, "explain", path, *inputs, "--measure-decisions", "--calls", str(a.calls), "--json"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{name}: fusion-jit failed: {r.stderr.strip()[:200]}", file=sys.stderr)
            continue
        j = json.loads(r.stdout)
        if not j.get("decisions"):
            print(f"{name}: no fusion decisions (or no plan)")
            continue
        for k in total:
            total[k] += j["summary"][k]
        wrong += [(name, d) for d in j["decisions"] if d["verdict"] == "WRONG"]
        rows.append({"model": name, **j})
        print(f"{name:<22} {j['summary_line']}")
    c = total["counted"]
    print(f"all: decisions: {total['agree']} of {c} agree ({total['within_5pct']} within 5%, not counted); "
          f"time model: {total['time_model_agrees']} of {c} agree")
    for name, d in wrong:
        print(f"  wrong: {name}: {d['decision'][:90]}: fused {d['measured_fused_us']:.1f} us, split "
              f"{d['measured_split_us']:.1f} us (predicted {d['predicted_fused_us']:.1f} / {d['predicted_split_us']:.1f})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"totals": total, "models": rows}, f, indent=1)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="", help="comma-separated names (default: all)")
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--json", default="")
    p.add_argument("--cli", default=os.path.join(ROOT, "build", "fusion-jit"))
    p.add_argument("--decisions", action="store_true", help="measure each fusion decision both ways")
    a = p.parse_args()
    names = set(filter(None, a.models.split(",")))
    out = tempfile.mkdtemp(prefix="fj-predictions-")
    models = {k: v for k, v in demo_models(out).items() if not names or k in names}
    models.update(traced_models(out, names))
    if a.decisions:
        return decisions(a, models)
    rows, all_kernels, all_aten, misses = [], [], [], []
    time_model = ""
    for name, (path, inputs) in models.items():
        r = subprocess.run([a.cli, "run", path, *inputs, "--profile", str(a.calls), "--json"], capture_output=True,
                           text=True)
        if r.returncode != 0:
            print(f"{name}: fusion-jit failed: {r.stderr.strip()[:200]}", file=sys.stderr)
            continue
        prof = json.loads(r.stdout).get("profile")
        if not prof:
            print(f"{name}: no plan (runs eagerly)", file=sys.stderr)
            continue
        time_model = prof["time_model"]
        kp, ap = [], []
        for s in prof["steps"]:
            m = s["measured_us"]
            if m is None or m <= 0:
                continue
            pct = abs(s["predicted_us"] - m) / m * 100
            (kp if s["kind"] == "kernel" else ap).append(pct)
            misses.append((pct, name, s["name"], s["op"], s["predicted_us"], m))
        all_kernels += kp
        all_aten += ap
        rows.append({"model": name, "kernels": kp, "aten": ap, "predicted_us": prof["predicted_us"],
                     "measured_us": prof["measured_us"]})
        print(f"{name:<22} kernels: {errors(kp):<32} ATen steps: {errors(ap):<32} "
              f"per call {prof['predicted_us'] / 1e3:.2f} ms predicted, {prof['measured_us'] / 1e3:.2f} ms measured")
    print(f"all kernels: {errors(all_kernels)}; all ATen steps: {errors(all_aten)}; {time_model}")
    print("largest misses (error, model, step, op, predicted us, measured us):")
    for pct, name, step, op, pred, meas in sorted(misses, reverse=True)[:12]:
        print(f"  {pct:6.0f}%  {name:<20} {step:<14} {op:<36} {pred:10.2f} {meas:10.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"time_model": time_model, "models": rows}, f, indent=1)


if __name__ == "__main__":
    main()
