"""Ahead-of-time packages from Python (fusion_jit.package, fusion_jit.load_package): test models (image
models and transformers language models, nn.Modules taking the FX path: torch.export and the backend's
lowering) packaged, then loaded and run in a fresh process with FUSION_JIT_ASSERT_NO_COMPILE=1 and no cache
directory, against eager by the accuracy rule; a TorchScript module through the TorchScript path; refusals
named."""

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
print(f"loaded in {served.load_ms:.2f} ms, prepacking {served.prepack_ms:.2f} ms")
print(*[l for l in served.explain().splitlines() if "prepacked at load" in l], sep=chr(10))
"""


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small", "timm_regnetx_002", "bert_tiny", "gpt2_tiny",
                                  "llama_tiny"])
def test_a_packaged_model_runs_in_a_fresh_process_with_no_compiler(name, tmp_path):
    model, example = make(name)
    model.eval()
    if hasattr(model, "config"):
        model.config.use_cache = False  # a package returns tensors, not a transformers cache
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
    if torch.backends.mkl.is_available():
        # Each model's linears (a classifier at least) are MKL's packed GEMM, as in the JIT: the package holds
        # the plain weights and packs them at load (Note [Prepacked weights]).
        assert "weights prepacked at load" in p.stdout, p.stdout
    got = torch.load(tmp_path / "out.pt")
    with torch.no_grad():
        expected = main_output(model(*example))
        reference = main_output(model.double()(*[t.double() if t.is_floating_point() else t for t in example]))
    assert_close(got[0], expected, reference, name)


def test_a_torchscript_module_takes_the_torchscript_path(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32)).eval()
    x = torch.randn(4, 16)
    scripted = torch.jit.script(model)
    pkg = tmp_path / "scripted.fjpkg"
    assert fusion_jit.package(scripted, (x,), pkg)["signatures"] == 1
    served = fusion_jit.load_package(pkg)
    with torch.no_grad():
        torch.testing.assert_close(served(x), model(x))


class _Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls.add_(1)
        return x * 2


def test_models_a_package_cannot_hold_are_refused_naming_why(tmp_path):
    out = tmp_path / "refused.fjpkg"
    with pytest.raises(ValueError, match=r"signature 0 \(float32\[4\]\): the model changes its state "
                                         r"\(buffer_mutation of calls\)"):
        fusion_jit.package(_Counter(), (torch.randn(4),), out)
    model, example = make("gpt2_tiny")
    model.eval()
    model.config.use_cache = True
    with pytest.raises(ValueError, match="torch.export cannot capture the model: .*DynamicCache"):
        fusion_jit.package(model, example, out)
    assert not out.exists()


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


def test_a_cuda_package_is_built_with_no_gpu_and_needs_one_to_load(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32)).eval()
    x = torch.randn(4, 16)
    pkg = tmp_path / "seq-cuda.fjpkg"
    info = fusion_jit.package(model, (x,), pkg, device="cuda", cuda_archs=["sm_90"])
    assert info["signatures"] == 1 and info["kernels"] > 0, info
    if torch.cuda.is_available():
        served = fusion_jit.load_package(pkg)
        assert served.device() == "cuda" and served.signatures() == ["(f32[4,16]@cuda:0)"]
        with torch.no_grad():
            torch.testing.assert_close(served(x.cuda()), model.cuda()(x.cuda()), rtol=1e-4, atol=1e-4)
    else:
        with pytest.raises(ValueError, match=r"its plans run on a GPU \(cuda:0\), but this machine has none"):
            fusion_jit.load_package(pkg)
    with pytest.raises(ValueError, match="--arch sm_1"):
        fusion_jit.package(model, (x,), tmp_path / "other.fjpkg", device="cuda", cuda_archs=["sm_1"])
    assert not (tmp_path / "other.fjpkg").exists()
