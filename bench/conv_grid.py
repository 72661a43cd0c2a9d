"""A convolution grid (issue 70 item 2): conv + batch norm + ReLU / SiLU / residual add, over batch,
channels, spatial size, kernel, stride, groups (1 and depthwise), input layout (NCHW, channels-last) and
dtype (float32, bfloat16), through eager, Inductor (default settings and freezing) and fusion_jit (default
settings and freezing), calls interleaved in one process, 2 threads.

    ./run python bench/conv_grid.py [--cells N] [--seed S] [--rounds R] [--max-macs M] [--json FILE]

The whole grid has about 40,000 cells; a run times a sample of N cells drawn with seed S (Inductor
compiles each cell twice, several seconds each on 2 cores), skipping cells of more than M multiply-adds
(too slow to time here). Prints a row per cell: each setting's speedup over eager, and fusion_jit against
Inductor in the same setting; then the geomeans and the cells below 1.0x eager or below 0.95x Inductor."""
import argparse
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import fusion_jit  # noqa: E402,F401  (registers the backend)
import torch._inductor.config as inductor_config  # noqa: E402

BATCH = [1, 8, 32]
CHANNELS = [3, 16, 32, 64, 128, 256, 512]
SPATIAL = [7, 14, 28, 56, 112]
KERNEL = [1, 3, 5, 7]
STRIDE = [1, 2]
GROUPS = ["1", "depthwise"]
LAYOUT = ["nchw", "channels_last"]
AFTER = ["relu", "silu", "add"]
DTYPE = ["float32", "bfloat16"]


class Block(nn.Module):
    def __init__(self, cin, cout, k, stride, groups, after):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.after = after
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.2, 0.2)

    def forward(self, x, r):
        y = self.bn(self.conv(x))
        if self.after == "relu":
            return F.relu(y)
        if self.after == "silu":
            return F.silu(y)
        return F.relu(y + r)


def sample(n, seed, max_macs):
    rng = random.Random(seed)
    cells, tries = [], 0
    while len(cells) < n and tries < 100000:
        tries += 1
        b, hw, k, s = rng.choice(BATCH), rng.choice(SPATIAL), rng.choice(KERNEL), rng.choice(STRIDE)
        groups = rng.choice(GROUPS)
        cin = rng.choice(CHANNELS)
        cout = cin if groups == "depthwise" else rng.choice(CHANNELS)
        if groups == "depthwise" and cin == 3:
            continue
        ho = (hw + 2 * (k // 2) - k) // s + 1
        macs = b * cout * ho * ho * k * k * (1 if groups == "depthwise" else cin)
        if macs > max_macs or k > hw:
            continue
        cell = dict(batch=b, cin=cin, cout=cout, hw=hw, k=k, stride=s, groups=groups, layout=rng.choice(LAYOUT),
                    after=rng.choice(AFTER), dtype=rng.choice(DTYPE), macs=macs)
        if cell not in cells:
            cells.append(cell)
    return cells


def name(c):
    g = "dw" if c["groups"] == "depthwise" else "g1"
    return (f"b{c['batch']} {c['cin']}->{c['cout']} {c['hw']}x{c['hw']} k{c['k']} s{c['stride']} {g} "
            f"{'cl' if c['layout'] == 'channels_last' else 'nchw'} {c['after']} {'bf16' if c['dtype'] == 'bfloat16' else 'f32'}")


def run_cell(c, rounds):
    torch.manual_seed(0)
    dtype = getattr(torch, c["dtype"])
    groups = c["cin"] if c["groups"] == "depthwise" else 1
    m = Block(c["cin"], c["cout"], c["k"], c["stride"], groups, c["after"]).eval().to(dtype)
    x = torch.randn(c["batch"], c["cin"], c["hw"], c["hw"], dtype=dtype)
    fmt = torch.channels_last if c["layout"] == "channels_last" else torch.contiguous_format
    x = x.contiguous(memory_format=fmt)
    with torch.no_grad():
        r = torch.randn_like(m.conv(x)).contiguous(memory_format=fmt)  # the residual (read by "add" only)
        ref = m(x, r)
        torch._dynamo.reset()
        variants = {"eager": m}
        compile_s = {}
        for key, backend, freezing in (("inductor", "inductor", False), ("inductor_freezing", "inductor", True),
                                       ("fj", "fusion_jit", False), ("fj_freezing", "fusion_jit", True)):
            opts = {"freezing": True} if backend == "fusion_jit" and freezing else None
            f = torch.compile(m, backend=backend, options=opts, dynamic=False)
            t0 = time.perf_counter()
            with inductor_config.patch(freezing=freezing):
                out = f(x, r)
            compile_s[key] = time.perf_counter() - t0
            tol = 2e-2 if dtype == torch.bfloat16 else 1e-3
            err = (out.float() - ref.float()).abs().max().item()
            assert err <= tol * max(1.0, ref.float().abs().max().item()), (key, name(c), err)
            variants[key] = f
        for f in variants.values():
            f(x, r)
        times = {k: [] for k in variants}
        for i in range(rounds):
            order = list(variants.items())
            if i % 2:
                order.reverse()
            for k, f in order:
                t = time.perf_counter()
                f(x, r)
                times[k].append(time.perf_counter() - t)
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    return med, compile_s


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--max-macs", type=float, default=4e8)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(2)
    cells = sample(args.cells, args.seed, args.max_macs)
    print(f"{len(cells)} cells (seed {args.seed}, at most {args.max_macs:.0e} multiply-adds), {args.rounds} rounds, "
          f"{torch.get_num_threads()} threads")
    head = ("cell", "eager ms", "ind", "ind frz", "fj", "fj frz", "fj/ind", "fj/ind frz")
    print("%-46s %9s %6s %7s %6s %7s %7s %10s" % head)
    rows = []
    for c in cells:
        med, comp = run_cell(c, args.rounds)
        e = med["eager"]
        row = dict(cell=name(c), **c, eager_ms=e * 1e3, **{f"{k}_x": e / med[k] for k in med if k != "eager"},
                   compile_s=comp)
        row["fj_vs_inductor"] = med["inductor"] / med["fj"]
        row["fj_freezing_vs_inductor_freezing"] = med["inductor_freezing"] / med["fj_freezing"]
        rows.append(row)
        print("%-46s %9.3f %5.2fx %6.2fx %5.2fx %6.2fx %7.2f %10.2f" % (
            row["cell"], row["eager_ms"], row["inductor_x"], row["inductor_freezing_x"], row["fj_x"],
            row["fj_freezing_x"], row["fj_vs_inductor"], row["fj_freezing_vs_inductor_freezing"]), flush=True)
    print("geomean over eager: inductor %.2fx, inductor freezing %.2fx, fusion_jit %.2fx, fusion_jit freezing %.2fx" % tuple(
        geomean([r[k] for r in rows]) for k in ("inductor_x", "inductor_freezing_x", "fj_x", "fj_freezing_x")))
    for setting, fj, ind in (("default", "fj_x", "fj_vs_inductor"), ("freezing", "fj_freezing_x",
                                                                         "fj_freezing_vs_inductor_freezing")):
        below_eager = [r["cell"] for r in rows if r[fj] < 1.0]
        below_ind = [r["cell"] for r in rows if r[ind] < 0.95]
        print(f"{setting}: {len(below_eager)} cells below 1.0x eager, {len(below_ind)} below 0.95x Inductor; "
              f"fusion_jit / Inductor geomean {geomean([r[ind] for r in rows]):.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
