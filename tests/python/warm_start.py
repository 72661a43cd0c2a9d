"""Compiles and runs one model of models.py in this process and prints the backend's counters (used by
test_backend.py to show that a second process with a warm cache compiles nothing)."""

import sys

import torch

import fusion_jit
from models import main_output, make

model, args = make(sys.argv[1])
model.eval()
with torch.no_grad():
    compiled = torch.compile(model, backend="fusion_jit")
    compiled(*args)
    torch.testing.assert_close(main_output(compiled(*args)), main_output(model(*args)), rtol=1e-4, atol=1e-4)
s = fusion_jit.stats()
print(f"plans={s['plans']} compiles={s['compiles']} cache_misses={s['cache_misses']} eager_graphs={s['eager_graphs']}")
