"""torch.compile(backend="fusion_jit") on real model families, forward and backward, on the CPU.

Results are judged by the accuracy rule of DESIGN.md (torch/tolerance.h, through
torch.ops.fusion_jit.check_close): torch.testing's tolerances against eager, or, where the fused result
differs more, an error against a float64 run of the same model of at most 2x eager's own.
"""

import copy
import os
import subprocess
import sys
import warnings

import pytest
import torch

import fusion_jit
from models import MODELS, main_output, make

HERE = os.path.dirname(os.path.abspath(__file__))


def to64(args):
    return tuple(a.double() if a.is_floating_point() else a for a in args)


def assert_close(actual, expected, reference64, what):
    ok, err, why = torch.ops.fusion_jit.check_close(actual, expected, reference64)
    assert ok, f"{what}: {why} (max error {err:.3g})"


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    fusion_jit.reset()
    yield


@pytest.mark.parametrize("freezing", [False, True], ids=["default", "freezing"])
@pytest.mark.parametrize("name", list(MODELS))
def test_inference(name, freezing):
    model, args = make(name)
    model.eval()
    model64 = copy.deepcopy(model).double()
    with torch.no_grad():
        expected = main_output(model(*args))
        reference = main_output(model64(*to64(args)))
        compiled = fusion_jit.compile(model, freezing=freezing)
        first = main_output(compiled(*args))    # compiles: the lowering run's result
        second = main_output(compiled(*args))   # the plan's result
    s = fusion_jit.stats()
    assert s["eager_graphs"] == 0 and s["eager_calls"] == 0, s
    assert s["graphs"] >= 1 and s["plans"] == s["graphs"], s
    # With freezing, conv nets' activations are oneDNN post-ops: what is left for our kernels may be single ops.
    assert s["kernels"] > 0 and (s["fused_ops"] >= s["kernels"] if freezing else s["fused_ops"] > s["kernels"]), s
    assert (s["frozen_inputs"] > 0) == freezing, s
    assert_close(first, expected, reference, f"{name}, first call")
    assert_close(second, expected, reference, f"{name}, second call")


def sgd_step(model, args):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    out = main_output(model(*args))
    loss = out.pow(2).mean()
    loss.backward()
    opt.step()
    return loss.detach()


@pytest.mark.parametrize("name", ["resnet18", "gpt2_tiny"])
def test_training_step(name):
    model, args = make(name, batch=2)
    model.train()
    model64 = copy.deepcopy(model).double()
    eager = copy.deepcopy(model)
    loss_e = sgd_step(eager, args)
    loss_64 = sgd_step(model64, to64(args))
    loss_c = sgd_step(torch.compile(model, backend="fusion_jit"), args)
    s = fusion_jit.stats()
    assert s["eager_graphs"] == 0, s
    assert s["graphs"] >= 2 and s["plans"] == s["graphs"], s  # a forward and a backward graph, both compiled
    assert_close(loss_c, loss_e, loss_64, f"{name}: loss")
    state_c, state_e, state_64 = model.state_dict(), eager.state_dict(), model64.state_dict()
    for key in state_e:
        if state_e[key].is_floating_point():
            assert_close(state_c[key], state_e[key], state_64[key], f"{name}: {key} after one SGD step")
        else:
            assert torch.equal(state_c[key], state_e[key]), key


def test_graph_break():
    def f(x):
        y = torch.relu(x * 2.0 + 1.0)
        torch._dynamo.graph_break()
        return torch.softmax(y, -1) * 3.0

    x = torch.randn(8, 32)
    compiled = torch.compile(f, backend="fusion_jit")
    compiled(x)
    got = compiled(x)
    torch.testing.assert_close(got, f(x))
    s = fusion_jit.stats()
    assert s["graphs"] == 2 and s["plans"] == 2 and s["eager_graphs"] == 0, s


def test_three_shapes():
    model, _ = make("bert_tiny")
    model.eval()
    compiled = torch.compile(model, backend="fusion_jit")
    with torch.no_grad():
        for length in (8, 16, 24):
            x = torch.randint(0, 1000, (2, length))
            for _ in range(2):
                torch.testing.assert_close(main_output(compiled(x)), main_output(model(x)), rtol=1e-5, atol=1e-5)
    s = fusion_jit.stats()
    assert s["plans"] == 3 and s["eager_calls"] == 0, s


def test_specialization_limit_runs_eagerly_with_one_warning():
    def f(x):
        return torch.tanh(x) * 2.0 + x

    compiled = fusion_jit.compile(f, dynamic=True, specialization_limit=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (5, 6, 7, 7):
            x = torch.randn(n, 3)
            torch.testing.assert_close(compiled(x), f(x))
    limit = [w for w in caught if "specialization limit of 1" in str(w.message)]
    assert len(limit) == 1, [str(w.message) for w in caught]
    s = fusion_jit.stats()
    assert s["plans"] == 1 and s["eager_calls"] == 3, s


def complex_model(x):
    c = torch.view_as_complex(x.reshape(-1, 2))
    return torch.view_as_real(c * c).reshape(x.shape) + 1.0


@pytest.mark.fallback
def test_unsupported_graph_runs_eagerly_with_one_warning():
    x = torch.randn(4, 8)
    compiled = torch.compile(complex_model, backend="fusion_jit")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            torch.testing.assert_close(compiled(x), complex_model(x))
    ours = [str(w.message) for w in caught if "fusion_jit" in str(w.message)]
    assert len(ours) == 1 and "runs eagerly" in ours[0] and "complex" in ours[0], ours
    assert fusion_jit.stats()["eager_graphs"] == 1


def test_strict_mode_raises(monkeypatch):
    monkeypatch.setenv("FUSION_JIT_STRICT", "1")
    compiled = torch.compile(complex_model, backend="fusion_jit")
    with pytest.raises(fusion_jit.Unsupported, match="complex"):
        compiled(torch.randn(4, 8))


def test_options_are_checked():
    with pytest.raises(ValueError, match="unknown option 'cuda_graph'"):
        fusion_jit.compile(torch.relu, cuda_graph=True)
    with pytest.raises(TypeError, match="'specialization_limit' must be a int"):
        fusion_jit.compile(torch.relu, specialization_limit="4")
    with pytest.raises(ValueError, match="must be >= 0"):
        fusion_jit.Options({"specialization_limit": -1})
    with pytest.raises(ValueError, match="unknown mode"):
        fusion_jit.Options(mode="fastest")
    # Through torch.compile, dynamo wraps the backend's error; the message is ours.
    compiled = torch.compile(torch.relu, backend="fusion_jit", options={"bogus": 1})
    with pytest.raises(Exception, match="unknown option 'bogus'"):
        compiled(torch.randn(3))


def test_cpp_errors_are_value_and_type_errors():
    fn = torch.classes.fusion_jit.GraphFunction("test graph", True, False, -1, [], "")
    ir = "graph(%0 : f32[4]):\n  %1 : f32[4] = aten::relu(%0)\n  return (%1)\n"
    with pytest.raises(TypeError, match=r"input 0 is f64\[4\], the graph's input is f32\[4\]"):
        fn.add([torch.zeros(4, dtype=torch.float64)], "", ir, [])
    with pytest.raises(ValueError, match="IR text, line 2"):
        fn.add([torch.zeros(4)], "", ir.replace("%0)", "%9)"), [])
    symbolic = ir.replace("graph(", "graph[s0=4](").replace("f32[4]", "f32[s0]")
    with pytest.raises(ValueError, match=r"the graph has symbolic sizes \(graph\[s0=4\]\)"):
        fn.add([torch.zeros(4)], "", symbolic, [])
    with pytest.raises(ValueError, match="must not be empty"):
        torch.ops.fusion_jit.use_cache_dir("")
    assert fn.num_plans() == 0  # nothing was added by the failed calls
    fn.add([torch.zeros(4)], "", ir, [])
    status, outs = fn.run([torch.tensor([-1.0, 2.0, -3.0, 4.0])], "")
    assert status == 0 and outs[0].tolist() == [0.0, 2.0, 0.0, 4.0]


def test_options_reach_the_plan(tmp_path):
    f = lambda x: torch.sigmoid(x) * x + 1.0
    x = torch.randn(16, 16)
    compiled = fusion_jit.compile(f, enable_fusion=False, cache_dir=str(tmp_path / "cache"))
    compiled(x)
    torch.testing.assert_close(compiled(x), f(x))
    assert fusion_jit.stats()["kernels"] == 3  # one kernel per op without fusion
    assert torch.ops.fusion_jit.cache_dir() == str(tmp_path / "cache")
    assert any((tmp_path / "cache").rglob("*.fjk"))


def test_disable_option_leaves_rules_out_for_one_model():
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64)).eval()
    x = torch.randn(8, 64)
    quiet = open(os.devnull, "w")
    with torch.no_grad():
        expected = model(x)
        default = fusion_jit.explain(model, x, freezing=True, file=quiet)
        assert "mkl::_mkl_linear" in default  # the rule this test turns off fires without the option
        for disable in ("prepack.linear_mkl", ["prepack"]):
            text = fusion_jit.explain(model, x, freezing=True, disable=disable, file=quiet)
            assert "mkl::_mkl_linear" not in text and "aten::addmm" in text, text
            compiled = fusion_jit.compile(model, freezing=True, disable=disable)
            torch.testing.assert_close(compiled(x), expected)
        with pytest.raises(TypeError, match="'disable' must be"):
            fusion_jit.compile(model, disable=[1])
        with pytest.raises(Exception, match="'no_such_rule', which is not a pass or rule"):
            fusion_jit.compile(model, disable="no_such_rule")(x)
        with pytest.raises(Exception, match="'cache', a process-wide switch"):
            fusion_jit.compile(model, disable="cache")(x)


def test_explain_prints_plans_with_reasons(capsys):
    model, args = make("gpt2_tiny")
    model.eval()
    with torch.no_grad():
        text = fusion_jit.explain(model, *args)
    assert capsys.readouterr().out.strip() == text.strip()
    assert "inference graph" in text and "fused: saves" in text and "ATen steps" in text


def test_reset_clears_counters_and_plans():
    f = lambda x: torch.relu(x) + 1.0
    compiled = torch.compile(f, backend="fusion_jit")
    x = torch.randn(10)
    compiled(x)
    assert fusion_jit.stats()["plans"] == 1
    fusion_jit.reset()
    assert fusion_jit.stats()["plans"] == 0 and fusion_jit.stats()["kernels"] == 0
    torch.testing.assert_close(compiled(x), f(x))  # compiles again (the plan comes from the disk cache)
    s = fusion_jit.stats()
    assert s["plans"] == 1 and s["compiles"] == 0 and s["cache_hits"] >= 1, s


def test_warm_cache_second_process_compiles_nothing(tmp_path):
    env = dict(os.environ, FUSION_JIT_CACHE_DIR=str(tmp_path / "cache"))
    script = os.path.join(HERE, "warm_start.py")
    cold = subprocess.run([sys.executable, script, "gpt2_tiny"], env=env, capture_output=True, text=True)
    assert cold.returncode == 0, cold.stderr
    assert "compiles=0" not in cold.stdout, cold.stdout
    # The second process may not run a compiler (FUSION_JIT_ASSERT_NO_COMPILE), nor fall back (STRICT).
    env.update(FUSION_JIT_ASSERT_NO_COMPILE="1", FUSION_JIT_STRICT="1")
    warm = subprocess.run([sys.executable, script, "gpt2_tiny"], env=env, capture_output=True, text=True)
    assert warm.returncode == 0, warm.stderr
    assert "compiles=0 cache_misses=0 eager_graphs=0" in warm.stdout, warm.stdout


def test_profile_times_each_step_by_kind():
    lin = torch.nn.Linear(16, 8).eval()

    def f(x):
        return torch.relu(lin(x).view(4, 2, 4)) * 2.0 + 1.0

    compiled = torch.compile(f, backend="fusion_jit")
    x = torch.randn(4, 16)
    with torch.no_grad():
        compiled(x)
        with fusion_jit.profile() as p:
            for _ in range(3):
                compiled(x)
        compiled(x)  # after the block: not counted
    s = p.summary()
    assert s["plan_runs"] == 3, s
    assert s["steps"]["kernels"] == 3 * fusion_jit.stats()["kernels"] and s["steps"]["kernels"] > 0, s
    assert s["ops"]["aten::addmm"][0] == 3, s  # the linear: ATen compute
    assert s["steps"]["aten_compute"] == 3, s
    assert s["steps"]["aten_other"] >= 3, s  # the views around the addmm
    assert s["ops"]["fj::kernel"][0] == s["steps"]["kernels"], s
    parts = s["kernels_ms"] + s["aten_compute_ms"] + s["aten_other_ms"]
    assert 0 < parts <= s["plan_ms"], s
    text = p.table()
    assert text.startswith("3 plan runs") and "aten::addmm" in text and "between steps" in text, text


def test_position_embedding_is_a_slice_of_its_weight():
    """An embedding of positions made by arange (GPT-2's) is a slice of the weight made at plan build
    (decompose.embedding_range), read by the add's kernel: no ATen embedding step for it, eager's results,
    and the weight is neither returned nor changed. Positions outside the weight raise eager's error."""

    class Embed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = torch.nn.Embedding(50, 8), torch.nn.Embedding(16, 8)

        def forward(self, ids, offset: int):
            pos = torch.arange(offset, offset + ids.shape[1]).unsqueeze(0)
            return self.wte(ids) + self.wpe(pos) * 2.0

    model, ids = Embed().eval(), torch.randint(0, 50, (2, 6))
    with torch.no_grad():
        text = fusion_jit.explain(model, ids, 3, file=open(os.devnull, "w"))
        assert "decompose.embedding_range x1" in text, text
        # The token embedding only, read inside the add's kernel (Note [Gathered loads]).
        assert text.count("\n    aten::embedding ") == 1 and "aten: aten::embedding" not in text, text
        compiled = torch.compile(model, backend="fusion_jit")
        weight = model.wpe.weight.clone()
        for offset in (3, 10):
            torch.testing.assert_close(compiled(ids, offset), model(ids, offset))
        assert torch.equal(model.wpe.weight, weight)
        with pytest.raises(IndexError):
            model(ids, 12)
        with pytest.raises(IndexError):
            compiled(ids, 12)


def test_token_embeddings_are_read_inside_the_layer_norms_kernel():
    """Word, position and token-type embeddings summed and layer-normed (BERT's embeddings) are one
    kernel that reads the tables at the rows the indices pick (Note [Gathered loads]): eager's results in
    inference and, through AOT autograd's forward graph, eager's gradients in training; an index outside
    a table raises eager's IndexError; FUSION_JIT_DISABLE=gather is the switch (tested in the CLI)."""

    class Embeddings(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.word, self.pos = torch.nn.Embedding(40, 16), torch.nn.Embedding(12, 16)
            self.kind = torch.nn.Embedding(2, 16)
            self.norm = torch.nn.LayerNorm(16)

        def forward(self, ids, types):
            pos = self.pos.weight[: ids.shape[1]]
            return self.norm(self.word(ids) + pos + self.kind(types))

    torch.manual_seed(0)
    model = Embeddings().eval()
    ids, types = torch.randint(0, 40, (3, 10)), torch.randint(0, 2, (3, 10))
    with torch.no_grad():
        text = fusion_jit.explain(model, ids, types, file=open(os.devnull, "w"))
        assert "aten: aten::embedding" not in text, text
        assert text.count("\n    aten::embedding ") == 2, text
        assert "1 kernel," in text, text
        compiled = torch.compile(model, backend="fusion_jit")
        torch.testing.assert_close(compiled(ids, types), model(ids, types))
        bad = ids.clone()
        bad[1, 4] = 40
        with pytest.raises(IndexError, match="index out of range"):
            model(bad, types)
        with pytest.raises(IndexError, match="index out of range"):
            compiled(bad, types)
        torch.testing.assert_close(compiled(ids, types), model(ids, types))
    # Training: the forward graph's embeddings are fused, the backward graph gives eager's gradients.
    model.train()
    trained = torch.compile(model, backend="fusion_jit")
    grads = []
    for m in (model, trained):
        model.zero_grad()
        (m(ids, types) * torch.arange(16.0)).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_small_factories_fold_with_the_mask_they_make():
    """A causal mask made from arange and scalar_tensor in a torch.compile graph is folded at plan build:
    no ATen arange step is left, results are eager's, and a returned factory is the caller's own tensor."""

    class Masked(torch.nn.Module):
        def forward(self, x):
            i = torch.arange(x.shape[-1])
            mask = torch.where(i[:, None] >= i[None, :], torch.tensor(0.0), torch.tensor(-1e9))
            return torch.softmax(x + mask, -1), torch.zeros(3)

    model, x = Masked(), torch.randn(2, 8, 8)
    text = fusion_jit.explain(model, x, file=open(os.devnull, "w"))
    assert "aten::arange" not in text, text
    compiled = torch.compile(model, backend="fusion_jit")
    expected = model(x)
    for _ in range(2):
        out = compiled(x)
        torch.testing.assert_close(out[0], expected[0])
        assert torch.equal(out[1], torch.zeros(3))
        out[1].fill_(7.0)  # the caller's tensor: the next call still returns zeros
