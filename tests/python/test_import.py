"""`import fusion_jit` imports neither torch._dynamo nor torch._inductor (Note [Registering the backend
lazily], python/fusion_jit/__init__.py), and neither does loading and running a package; the backend is
still found by name by torch.compile, with the package installed (its torch_dynamo_backends entry point,
here a dist-info folder written for the test) or from this checkout, whichever is imported first. Each
case runs in a fresh process. The time import takes is measured by bench (bench/RESULTS.md), not here."""

import os
import shutil
import subprocess
import sys

import pytest
import torch

import fusion_jit


# The first few modules of torch's compile machinery a process holds: torch._dynamo, torch._inductor (its FX
# passes, torch._inductor.fx_passes, included) and their submodules; [] where none.
COMPILE_MODULES = """
def compile_modules():
    return sorted(m for m in sys.modules if m.split(".")[:2] in (["torch", "_dynamo"], ["torch", "_inductor"]))[:8]
"""

# The process sees the torch_dynamo_backends entry point of fusion_jit where the test gives one, else none.
CHECK_ENTRY_POINT = """
from importlib.metadata import entry_points
assert [ep.value for ep in entry_points(group="torch_dynamo_backends") if ep.name == "fusion_jit"] == (
    ["fusion_jit:backend"] if {} else []), entry_points(group="torch_dynamo_backends")
"""


def run(code, tmp_path, entry_point=False, *args):
    """Runs `code` in a fresh Python with its own kernel cache, importing a copy of this checkout's fusion_jit
    (no `pip install` of the checkout has left an egg-info beside it) with the native library of the build;
    entry_point: with a dist-info folder on the path whose entry point registers the backend, as
    `pip install` writes it (pyproject.toml)."""
    checkout = tmp_path / "checkout"
    if not checkout.exists():
        shutil.copytree(os.path.dirname(fusion_jit.__file__), checkout / "fusion_jit",
                        ignore=shutil.ignore_patterns("__pycache__", "lib"))
    path = [str(checkout)]
    if entry_point:
        site = tmp_path / "site"
        dist = site / "fusion_jit-0.7.0.dist-info"
        dist.mkdir(parents=True, exist_ok=True)
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fusion_jit\nVersion: 0.7.0\n")
        (dist / "entry_points.txt").write_text("[torch_dynamo_backends]\nfusion_jit = fusion_jit:backend\n")
        path.append(str(site))
    env = dict(os.environ, FUSION_JIT_CACHE_DIR=str(tmp_path / "cache"), FUSION_JIT_LIBRARY=fusion_jit._native.path,
               PYTHONPATH=os.pathsep.join(path))
    code = f"import sys\n{COMPILE_MODULES}\n{CHECK_ENTRY_POINT.format(entry_point)}\n{code}"
    p = subprocess.run([sys.executable, "-c", code, *map(str, args)], env=env,
                       capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_importing_fusion_jit_leaves_dynamo_and_inductor_out(tmp_path):
    out = run("""
import torch
import fusion_jit
print(compile_modules())
# the public functions that compile nothing work without them too
assert fusion_jit.stats()["graphs"] == 0, fusion_jit.stats()
fusion_jit.reset()
fusion_jit.Options({"specialization_limit": 2})
print(compile_modules())
""", tmp_path)
    assert out.splitlines() == ["[]", "[]"], out


def test_loading_and_running_a_package_leaves_dynamo_out(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16)).eval()
    x = torch.randn(8, 32)
    fusion_jit.package(model, (x,), tmp_path / "tiny.fjpkg")
    torch.save((x,), tmp_path / "inputs.pt")
    run("""
import torch, fusion_jit
served = fusion_jit.load_package(sys.argv[1])
with torch.no_grad():
    out = served(*torch.load(sys.argv[2]))
torch.save(out, sys.argv[3])
assert compile_modules() == [], compile_modules()
""", tmp_path, False, tmp_path / "tiny.fjpkg", tmp_path / "inputs.pt", tmp_path / "out.pt")
    with torch.no_grad():
        torch.testing.assert_close(torch.load(tmp_path / "out.pt"), model(x))


# torch.compile by name in a fresh process: the backend ran (a plan with a kernel) and matches eager.
COMPILE = """
import torch
f = lambda x: torch.relu(x * 2.0) + torch.sigmoid(x)
x = torch.randn(64, 64)
compiled = torch.compile(f, backend="fusion_jit")
compiled(x)
torch.testing.assert_close(compiled(x), f(x))
import fusion_jit
s = fusion_jit.stats()
assert s["plans"] == 1 and s["kernels"] >= 1 and s["fallback_ops"] == 0, s
print("ok")
"""


@pytest.mark.parametrize("entry_point,first", [
    (True, ""),                                    # installed, never imported: Dynamo loads the entry point
    (True, "import fusion_jit"),                   # installed and imported first: registered once
    (False, "import fusion_jit"),                  # this checkout: registered when torch.compile imports Dynamo
    (False, "import torch._dynamo, fusion_jit"),   # this checkout, Dynamo imported before: registered at import
    (True, "import torch._dynamo, fusion_jit"),
], ids=["entry-point", "entry-point-imported-first", "checkout-imported-first", "checkout-dynamo-first",
        "entry-point-dynamo-first"])
def test_torch_compile_finds_the_backend_by_name(tmp_path, entry_point, first):
    assert run(first + "\n" + COMPILE, tmp_path, entry_point).split() == ["ok"]
