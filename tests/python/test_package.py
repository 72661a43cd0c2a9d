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


def test_a_torchscript_module_takes_the_torchscript_path(tmp_path, monkeypatch):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32)).eval()
    x = torch.randn(4, 16)
    scripted = torch.jit.script(model)
    pkg = tmp_path / "scripted.fjpkg"

    def exported(*args):
        raise AssertionError("a TorchScript module was exported (the nn.Module path)")

    # The nn.Module path captures through torch.export; the TorchScript path must not reach it.
    monkeypatch.setattr(fusion_jit._package, "_exported_graph", exported)
    assert fusion_jit.package(scripted, (x,), pkg)["signatures"] == 1
    with pytest.raises(AssertionError, match="was exported"):
        fusion_jit.package(model, (x,), tmp_path / "module.fjpkg")
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


def _key_file(tmp_path, name, text, mode=0o600):
    path = tmp_path / name
    path.write_text(text + "\n")
    path.chmod(mode)
    return path


def test_a_signed_package_loads_under_its_key_and_others_are_refused(tmp_path):
    """Note [Package signatures]: with a key a package is signed when built and verified when loaded; an
    unsigned package, another key's, or a key file others may read is refused, naming the path and why."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32)).eval()
    x = torch.randn(4, 16)
    key = _key_file(tmp_path, "package.key", "0123456789abcdef" * 2)
    other = _key_file(tmp_path, "other.key", "fedcba9876543210" * 2)
    signed = tmp_path / "signed.fjpkg"
    assert fusion_jit.package(model, (x,), signed, key_file=key)["signed"] is True
    served = fusion_jit.load_package(signed, key_file=key)
    assert served.verified_with() == str(key)
    with torch.no_grad():
        torch.testing.assert_close(served(x), model(x))
    assert "signed, but not verified" in fusion_jit.load_package(signed).explain()
    # A TorchScript module takes the TorchScript path, signed the same way.
    scripted = tmp_path / "scripted.fjpkg"
    assert fusion_jit.package(torch.jit.script(model), (x,), scripted, key_file=key)["signed"] is True
    with torch.no_grad():
        torch.testing.assert_close(fusion_jit.load_package(scripted, key_file=key)(x), model(x))

    unsigned = tmp_path / "unsigned.fjpkg"
    assert fusion_jit.package(model, (x,), unsigned)["signed"] is False
    with pytest.raises(ValueError, match=rf"{unsigned}: refused: the package is not signed, and a package key is "
                                         rf"configured \({key}\)"):
        fusion_jit.load_package(unsigned, key_file=key)
    with pytest.raises(ValueError, match=rf"{signed}: refused: its signature does not verify under the key in "
                                         rf"{other}: it was signed with another key, or changed after it was signed"):
        fusion_jit.load_package(signed, key_file=other)
    loose = _key_file(tmp_path, "loose.key", "0123456789abcdef" * 2, mode=0o644)
    with pytest.raises(ValueError, match=rf"the package key file {loose} cannot be used: group or others may read "
                                         r"or write it \(mode 644\); chmod 600 it"):
        fusion_jit.load_package(signed, key_file=loose)
    with pytest.raises(ValueError, match=rf"package {tmp_path / 'loose.fjpkg'}: the package key file {loose} cannot "
                                         r"be used"):
        fusion_jit.package(model, (x,), tmp_path / "loose.fjpkg", key_file=loose)
    assert not (tmp_path / "loose.fjpkg").exists()


def test_fusion_jit_package_key_configures_the_key_of_a_fresh_process(tmp_path):
    """FUSION_JIT_PACKAGE_KEY names the key file where no key_file is given: a process with it set refuses an
    unsigned package."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU()).eval()
    unsigned = tmp_path / "unsigned.fjpkg"
    fusion_jit.package(model, (torch.randn(2, 16),), unsigned)
    key = _key_file(tmp_path, "package.key", "0123456789abcdef" * 2)
    env = dict(os.environ, FUSION_JIT_PACKAGE_KEY=str(key),
               PYTHONPATH=os.pathsep.join([os.path.join(HERE, "..", "..", "python"), os.environ.get("PYTHONPATH", "")]))
    code = "import sys, fusion_jit\ntry:\n    fusion_jit.load_package(sys.argv[1])\nexcept ValueError as e:\n    print(e)\n"
    p = subprocess.run([sys.executable, "-c", code, str(unsigned)], env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert f"{unsigned}: refused: the package is not signed, and a package key is configured ({key})" in p.stdout, p.stdout
