"""A causal GPT tower (token and position embeddings, two blocks of layer norm, a fused qkv projection, the
mask from torch.triu, masked_fill(-inf), softmax @ v, a GELU MLP) through torch.compile(backend="fusion_jit")
over 6 lengths x 3 batch sizes, in a fresh process and kernel cache per setting: the default (dynamic graphs
lowered once, later sizes instances of their shape class's plan) and FUSION_JIT_DISABLE=symbolic (each
signature lowered and planned on its own). Prints the backend's counters and the fused time per call
against eager's, summed over the signatures (medians of 30 calls each, eager in the same process).

    ./run python bench/gpt_tower.py
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

SIZES = [(b, t) for b in (1, 2, 3) for t in (8, 16, 24, 32, 40, 46)]


class Block(torch.nn.Module):
    def __init__(self, d=64, h=4):
        super().__init__()
        self.h, self.ln1, self.ln2 = h, torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (y.view(b, t, self.h, c // self.h).transpose(1, 2) for y in self.qkv(self.ln1(x)).split(c, dim=2))
        att = (q @ k.transpose(-2, -1)) * (c // self.h) ** -0.5
        att = att.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1), float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).contiguous().view(b, t, c))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x))))


class Gpt(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(100, 64), torch.nn.Embedding(64, 64)
        self.blocks, self.ln, self.head = torch.nn.Sequential(Block(), Block()), torch.nn.LayerNorm(64), torch.nn.Linear(64, 100)

    def forward(self, idx):
        return self.head(self.ln(self.blocks(self.wte(idx) + self.wpe(torch.arange(idx.shape[1])))))


def median_call(f, x, n=30):
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        f(x)
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[n // 2]


def child():
    import fusion_jit
    torch.manual_seed(0)
    m = Gpt().eval()
    c = fusion_jit.compile(m)
    with torch.no_grad():
        t0 = time.perf_counter()
        for b, t in SIZES:
            x = torch.randint(0, 100, (b, t))
            torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-4)
        first = time.perf_counter() - t0
        fused = sum(median_call(c, torch.randint(0, 100, (b, t))) for b, t in SIZES)
        eager = sum(median_call(m, torch.randint(0, 100, (b, t))) for b, t in SIZES)
    s = fusion_jit.stats()
    keys = ("plans", "lowerings", "class_plans", "class_instances", "compiles", "compile_ms")
    print(json.dumps({"first_calls_s": first, "fused_ms": fused * 1e3, "eager_ms": eager * 1e3,
                      **{k: s[k] for k in keys}}))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child()
    print(f"{len(SIZES)} signatures, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| setting | plans | lowerings | class plans | instances | compiles | compile ms | first calls s | fused/eager per call |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, disable in (("default", ""), ("FUSION_JIT_DISABLE=symbolic", "symbolic")):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, FUSION_JIT_CACHE_DIR=cache, FUSION_JIT_DISABLE=disable)
            out = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"| {name} | {r['plans']} | {r['lowerings']} | {r['class_plans']} | {r['class_instances']} | {r['compiles']} "
              f"| {r['compile_ms']:.0f} | {r['first_calls_s']:.1f} | {r['fused_ms'] / r['eager_ms']:.3f} |")


if __name__ == "__main__":
    main()
