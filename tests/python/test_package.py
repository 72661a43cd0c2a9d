"""Ahead-of-time packages from Python (fusion_jit.package, fusion_jit.load_package): three of the test
models packaged, then loaded and run in a fresh process with FUSION_JIT_ASSERT_NO_COMPILE=1 and no cache
directory, against eager by the accuracy rule; refusals named."""

import os
import subprocess
import sys

import pytest
import torch

import fusion_jit
from models import main_output, make
from test_backend import assert_close

HERE = os.path.dirname(os.path.abspath(__file__))

# Runs in a fresh process: loads the package, runs it on the saved inputs, saves the outputs.
LOADER = """
import sys, torch, fusion_jit
served = fusion_jit.load_package(sys.argv[1])
inputs = torch.load(sys.argv[2])
with torch.no_grad():
    out = served(*inputs)
torch.save(out if isinstance(out, tuple) else (out,), sys.argv[3])
print(f"loaded in {served.load_ms:.2f} ms")
"""


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small", "timm_regnetx_002"])
def test_a_packaged_model_runs_in_a_fresh_process_with_no_compiler(name, tmp_path):
    model, example = make(name)
    model.eval()
    example = example if isinstance(example, tuple) else (example,)
    pkg = tmp_path / f"{name}.fjpkg"
    info = fusion_jit.package(model, example, pkg)
    assert info["signatures"] == 1 and info["kernels"] > 0 and pkg.stat().st_size == info["bytes"], info
    assert sorted(os.listdir(tmp_path)) == [f"{name}.fjpkg"]  # the traced module's file is gone
    torch.save(example, tmp_path / "inputs.pt")
    env = dict(os.environ, FUSION_JIT_ASSERT_NO_COMPILE="1", FUSION_JIT_CACHE_DIR=str(tmp_path / "no-cache"),
               PYTHONPATH=os.pathsep.join([os.path.join(HERE, "..", "..", "python"), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-c", LOADER, str(pkg), str(tmp_path / "inputs.pt"), str(tmp_path / "out.pt")],
                       env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert not (tmp_path / "no-cache").exists()
    got = torch.load(tmp_path / "out.pt")
    with torch.no_grad():
        expected = main_output(model(*example))
        reference = main_output(model.double()(*[t.double() if t.is_floating_point() else t for t in example]))
    assert_close(got[0], expected, reference, name)


def test_two_signatures_and_the_refusals(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32)).eval()
    x4, x9 = torch.randn(4, 16), torch.randn(9, 16)
    pkg = tmp_path / "seq.fjpkg"
    info = fusion_jit.package(model, [(x4,), (x9,)], pkg)
    assert info["signatures"] == 2, info
    served = fusion_jit.load_package(pkg)
    assert served.signatures() == ["(f32[4,16])", "(f32[9,16])"]
    with torch.no_grad():
        for x in (x4, x9, torch.randn(9, 16)):
            torch.testing.assert_close(served(x), model(x))
    with pytest.raises(ValueError, match=r"no packaged signature matches the inputs \(f32\[5,16\]\); the package "
                                         r"serves \(f32\[4,16\]\), \(f32\[9,16\]\)"):
        served(torch.randn(5, 16))
    damaged = tmp_path / "damaged.fjpkg"
    damaged.write_bytes(pkg.read_bytes()[:-10])
    with pytest.raises(ValueError, match="checksum does not match"):
        fusion_jit.load_package(damaged)
    with pytest.raises(TypeError, match="example_inputs must be a tensor"):
        fusion_jit.package(model, "x", pkg)
    with pytest.raises(ValueError, match="unknown CPU code variant 'i386'"):
        fusion_jit.package(model, (x4,), tmp_path / "other.fjpkg", cpu_variants=["i386"])
    assert not (tmp_path / "other.fjpkg").exists()
