"""Dynamic sizes (Note [Sizes as kernel arguments]): a language model served at many sequence lengths and
batch sizes. Dynamo turns the length into a symbol after its second value; each length is then a new input
signature of the same FX graph, whose plan is built (milliseconds, from the template of the graph's one
lowering: Note [Symbolic graphs]) but whose CPU kernels are those of the graph's second signature, so the
compiler runs at most twice per graph. Every result is eager's."""

import copy

import pytest
import torch

import fusion_jit
from models import main_output, make
from test_backend import assert_close

LENGTHS = [5, 7, 8, 9, 11, 13, 16, 17, 19, 23, 24, 25, 29, 31, 32, 33, 37, 41, 47, 64]


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    fusion_jit.reset()
    yield


def run_shapes(name, options, shapes):
    """Model `name` compiled with `options`, called at each (batch, length) in inference, each result
    against eager by the accuracy rule; the backend's stats after."""
    model, _ = make(name)
    model.eval()
    model64 = copy.deepcopy(model).double()
    compiled = torch.compile(model, backend="fusion_jit", options=options)
    with torch.no_grad():
        for batch, length in shapes:
            ids = torch.randint(0, 1000, (batch, length), generator=torch.Generator().manual_seed(length))
            expected, reference = main_output(model(ids)), main_output(model64(ids))
            assert_close(main_output(compiled(ids)), expected, reference, f"{name} {options} [{batch},{length}]")
    return fusion_jit.stats()


@pytest.mark.parametrize("name", ["bert_tiny", "gpt2_tiny", "llama_tiny"])
def test_twenty_lengths_and_three_batch_sizes_compile_at_most_twice_per_graph(name, tmp_path):
    # An empty kernel cache: every compile is counted.
    shapes = [(2, n) for n in LENGTHS] + [(1, 19), (3, 19), (4, 33)]
    s = run_shapes(name, {"cache_dir": str(tmp_path)}, shapes)
    assert s["eager_calls"] == 0 and s["eager_graphs"] == 0, s
    assert s["plans"] >= len(shapes), s  # every signature ran a plan
    assert 0 < s["compiles"] <= 2 * s["graphs"], s
    # Note [Symbolic graphs]: each graph is lowered once; every other signature is its template's.
    assert s["lowerings"] == s["graphs"] and s["symbolic_plans"] == s["plans"] - s["graphs"], s
    # Note [Plans of a shape class]: and each of those is an instance of its graph's one class plan.
    assert 1 <= s["class_plans"] < s["graphs"] and s["class_instances"] == s["symbolic_plans"], s


@pytest.mark.parametrize("name", ["llama_tiny"])
def test_lengths_and_batch_sizes_with_freezing_are_instances_of_the_class(name, tmp_path):
    """With freezing the weights are the plan's constants (folded, prepacked for oneDNN at their hint):
    eight shapes, each eager's result, each later signature of a symbolic graph an instance of its class's
    plan, at most two compiles per graph."""
    shapes = [(2, 5), (2, 7), (2, 9), (2, 13), (2, 17), (1, 19), (3, 19), (2, 31)]
    s = run_shapes(name, {"freezing": True, "cache_dir": str(tmp_path)}, shapes)
    assert s["eager_calls"] == 0 and s["eager_graphs"] == 0, s
    assert s["plans"] >= len(shapes) and 0 < s["compiles"] <= 2 * s["graphs"], s
    assert s["class_plans"] >= 1 and s["class_instances"] == s["symbolic_plans"] >= 3, s


def test_dynamic_kernels_option_is_checked_and_on_serves_the_first_signature_with_sizes_as_arguments():
    with pytest.raises(ValueError, match="'dynamic_kernels' must be 'auto', 'on' or 'off', not 'sometimes'"):
        fusion_jit.compile(torch.nn.ReLU(), dynamic_kernels="sometimes")
    records = []
    f = torch.compile(lambda x: torch.tanh(x) * x + 1.0,
                      backend=fusion_jit._backend._Backend(fusion_jit.Options({"dynamic_kernels": "on"}), records))
    x = torch.randn(7, 13)
    torch.testing.assert_close(f(x), torch.tanh(x) * x + 1.0)
    text = "".join(t for _, t in records)
    assert "sizes as arguments (1 of 1 kernels" in text and "fj_kernel_0 [91]" in text, text


@pytest.mark.parametrize("name", ["bert_tiny", "llama_tiny"])
def test_five_lengths_in_training_compile_at_most_twice_per_graph(name, tmp_path):
    """Training steps at five lengths: the forward and backward graphs of each length's signature, output
    and every parameter's gradient against eager by the accuracy rule."""
    model, _ = make(name)
    model.train()
    ref, ref64 = copy.deepcopy(model), copy.deepcopy(model).double()
    compiled = torch.compile(model, backend="fusion_jit", options={"cache_dir": str(tmp_path)})
    for length in (8, 11, 16, 23, 32):
        ids = torch.randint(0, 1000, (2, length), generator=torch.Generator().manual_seed(length))
        outs = []
        for m in (compiled, ref, ref64):
            m.zero_grad(set_to_none=True)
            out = main_output(m(ids))
            (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
            outs.append(out)
        assert_close(outs[0], outs[1], outs[2], f"{name} [2,{length}] forward")
        for (pname, p), p0, p64 in zip(model.named_parameters(), ref.parameters(), ref64.parameters()):
            if p0.grad is not None:
                assert_close(p.grad, p0.grad, p64.grad, f"{name} [2,{length}] gradient of {pname}")
    s = fusion_jit.stats()
    assert s["eager_calls"] == 0 and s["eager_graphs"] == 0, s
    assert 0 < s["compiles"] <= 2 * s["graphs"], s
    assert s["lowerings"] == s["graphs"] and s["symbolic_plans"] == s["plans"] - s["graphs"], s


# A 512-1024-512 MLP whose linears take oneDNN's GEMM, the gelu as the first one's post-op: the plans hold no
# kernel of ours. Each new length built a plan that counted against the specialization limit (8), so from
# the ninth length on the graph ran eagerly, with the limit's warning. FUSION_JIT_GEMM=onednn fixes the
# library (a separate process: options are read once per process).
MLP_LENGTHS = """
import sys
import warnings
import torch
import fusion_jit
from test_backend import assert_close
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512)).eval()
m64 = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512)).double().eval()
m64.load_state_dict(m.state_dict())
f = torch.compile(m, backend="fusion_jit")
with warnings.catch_warnings():
    warnings.simplefilter("error", RuntimeWarning)
    with torch.no_grad():
        for length in range(20, 68, 4):
            x = torch.randn(2, length, 512)
            assert_close(f(x), m(x), m64(x.double()), f"[2,{length},512]")
s = fusion_jit.stats()
assert s["eager_calls"] == 0 and s["eager_graphs"] == 0, s
assert s["compiles"] == 0 and s["kernels"] == 0, s
print("served", s["plans"], "plans")
"""


def test_a_graph_of_library_calls_only_serves_every_length(tmp_path):
    import os
    import subprocess
    import sys
    env = dict(os.environ, FUSION_JIT_GEMM="onednn", FUSION_JIT_CACHE_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run([sys.executable, "-c", MLP_LENGTHS], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "served 12 plans" in p.stdout, p.stdout + p.stderr[-3000:]
