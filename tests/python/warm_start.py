"""Compiles and runs models of models.py in this process and prints the backend's counters (used by
test_backend.py to show that a second process with a warm cache compiles nothing, and by
test_remote_cache.py for a second machine sharing a Redis).

    python warm_start.py MODEL[,MODEL...] [--save FILE] [--remote URL KEY_FILE]

--save: each compiled model's main output, by name, written with torch.save; --remote: the backend's
remote_cache and remote_cache_key_file options."""

import argparse

import torch

import fusion_jit
from models import main_output, make

ap = argparse.ArgumentParser()
ap.add_argument("models")
ap.add_argument("--save")
ap.add_argument("--remote", nargs=2)
a = ap.parse_args()
options = {"remote_cache": a.remote[0], "remote_cache_key_file": a.remote[1]} if a.remote else None
outs = {}
for name in a.models.split(","):
    model, args = make(name)
    model.eval()
    with torch.no_grad():
        compiled = torch.compile(model, backend="fusion_jit", options=options)
        compiled(*args)
        outs[name] = main_output(compiled(*args))
        torch.testing.assert_close(outs[name], main_output(model(*args)), rtol=1e-4, atol=1e-4)
if a.save:
    torch.save(outs, a.save)
s = fusion_jit.stats()
print(f"plans={s['plans']} compiles={s['compiles']} cache_misses={s['cache_misses']} eager_graphs={s['eager_graphs']} "
      f"remote_hits={s['remote_hits']} remote_refused={s['remote_refused']} remote_errors={s['remote_errors']}")
