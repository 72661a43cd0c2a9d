"""Symbolic graphs (Note [Symbolic graphs], python/fusion_jit/_symbolic.py): a dynamic FX graph is lowered
once; its later signatures are built from that lowering's template, each plan checked on its first run."""

import pytest
import sympy
import torch

import fusion_jit
from fusion_jit import _native, _symbolic
from torch.utils._sympy.functions import FloorDiv, ModularIndexing, PythonMod


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    fusion_jit.reset()
    yield


def _evaluate(e, symbols, values):
    index = {s: k for k, s in enumerate(symbols)}
    return eval("lambda v: " + _symbolic._source(e, index))(values)  # noqa: S307


def test_expressions_evaluate_as_python_integers_do():
    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    cases = [
        (2 * s0 * s1 + 3, lambda a, b: 2 * a * b + 3),
        (FloorDiv(s0 * s1, 4), lambda a, b: a * b // 4),
        (PythonMod(s0, 3), lambda a, b: a % 3),
        (ModularIndexing(s1, 2, 5), lambda a, b: (b // 2) % 5),
        (sympy.Max(1, s0 - s1), lambda a, b: max(1, a - b)),
        (sympy.Min(s0, 64) * s1, lambda a, b: min(a, 64) * b),
        (s0 ** 2, lambda a, b: a * a),
    ]
    for e, want in cases:
        for a, b in [(2, 3), (7, 13), (64, 5), (97, 100)]:
            assert _evaluate(e, [s0, s1], (a, b)) == want(a, b), (e, a, b)


def test_expressions_the_evaluator_does_not_know_give_no_template():
    s0, s2 = sympy.symbols("s0 s2", integer=True, positive=True)
    for e, why in [(sympy.Rational(1, 2) * s0, "1/2 is not an integer"), (sympy.sin(s0), "is not evaluated"),
                   (s0 + s2, "symbol s2 is given by no input")]:
        with pytest.raises(_symbolic.NoTemplate, match=why):
            _symbolic._source(e, {s0: 0})


def _f(x):
    # Sizes computed from the symbols: the reshape's size, a size added to a tensor, a size returned.
    y = x.reshape(x.shape[0] * x.shape[1] // 2, -1) * 2
    return torch.tanh(y).sum(-1) + x.shape[1], x.shape[0] + 1


def test_sizes_computed_from_symbols_are_filled_in_at_each_call():
    compiled = torch.compile(_f, backend="fusion_jit", dynamic=True)
    for shape in [(4, 6), (6, 10), (2, 14), (8, 3), (3, 22)]:
        x = torch.randn(shape)
        got, expected = compiled(x), _f(x)
        torch.testing.assert_close(got[0], expected[0])
        assert got[1] == expected[1]
    s = fusion_jit.stats()
    assert s["graphs"] == 1 and s["lowerings"] == 1 and s["symbolic_plans"] == 4 and s["eager_calls"] == 0, s


def test_later_sizes_are_instances_of_one_plan_of_the_class():
    """Note [Plans of a shape class]: the second size builds the class's plan (one compile at most), every
    later size of the class is that plan evaluated at its sizes: no lowering, no compile."""
    compiled = torch.compile(_f, backend="fusion_jit", dynamic=True)
    compiled(torch.randn(4, 6))
    base, after_class = fusion_jit.stats()["compiles"], None
    for shape in [(6, 10), (2, 14), (8, 3), (3, 22), (10, 6), (12, 9)]:
        x = torch.randn(shape)
        got, expected = compiled(x), _f(x)
        torch.testing.assert_close(got[0], expected[0])
        assert got[1] == expected[1]
        if after_class is None:
            after_class = fusion_jit.stats()["compiles"]
            assert after_class - base <= 1, after_class - base
    s = fusion_jit.stats()
    assert s["lowerings"] == 1 and s["class_plans"] == 1, s
    assert s["class_instances"] == s["symbolic_plans"] == 6 and s["eager_calls"] == 0, s
    assert s["compiles"] == after_class, "an instance compiled"


def test_the_class_graph_is_the_template_with_expressions():
    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    cases = [(2 * s0 * s1 + 3, {"s0": 5, "s1": 7}, 73), (FloorDiv(s0 * s1, 4), {"s0": 6, "s1": 6}, 9),
             (PythonMod(s0, 3), {"s0": 11}, 2), (ModularIndexing(s1, 2, 5), {"s1": 13}, 1),
             (sympy.Max(1, s0 - s1), {"s0": 3, "s1": 9}, 1), (s0 ** 2 - s1, {"s0": 4, "s1": 3}, 13)]
    for e, at, want in cases:
        text = _symbolic._ir_expr(e)
        assert eval(text, {"max": max, "min": min}, at) == want, (e, text)  # noqa: S307
    with pytest.raises(_symbolic.NoTemplate, match="is not evaluated"):
        _symbolic._ir_expr(sympy.sin(s0))


def test_off_lowers_every_signature():
    compiled = torch.compile(_f, backend="fusion_jit", dynamic=True, options={"dynamic_kernels": "off"})
    for shape in [(4, 6), (6, 10), (2, 14)]:
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x)[0], _f(x)[0])
    s = fusion_jit.stats()
    assert s["lowerings"] == 3 and s["symbolic_plans"] == 0, s


_MM_RELU = """graph(%0 : f32[3,3]{{3,1}}):
  %1 : f32[3,3]{{{strides}}} = aten::mm(%0, %0)
  %2 : f32[3,3]{{3,1}} = aten::relu(%1)
  return (%2)
"""


def test_a_derived_type_that_aten_does_not_give_is_refused_before_the_plan_is_added():
    """add_run checks each ATen step's results against the graph's types: a kernel reading mm's result as
    column-major would read its transpose."""
    fn = _native.GraphFunction("derived", True, False, -1, [], "")
    x = torch.randn(3, 3)
    with pytest.raises(ValueError, match=r"aten::mm: its result %1 is Float sizes \[3, 3\] strides \[3, 1\] "
                                         r"at run time; the graph's type is f32\[3,3\]\{1,3\}"):
        fn.add_run([x], "", _MM_RELU.format(strides="1,3"), [])
    assert fn.run([x], "")[0] == 1 and fn.num_plans() == 0  # nothing was added
    info, outs = fn.add_run([x], "", _MM_RELU.format(strides="3,1"), [])
    assert info[0] == 1 and info[6] == 1
    torch.testing.assert_close(outs[0], torch.relu(x @ x))
    status, again = fn.run([x], "")
    assert status == 0
    torch.testing.assert_close(again[0], torch.relu(x @ x))


_SDPA_RELU = """graph(%0 : f32[2,4,8,16], %1 : f32[2,4,8,16], %2 : f32[2,4,8,16]):
  %3 : f32[2,4,8,16]{{{strides}}} = aten::scaled_dot_product_attention(%0, %1, %2, None, 0.0, False, 0.25, False)
  %4 : f32[2,4,8,16] = aten::relu(%3)
  return (%4)
"""


def test_a_library_step_whose_layout_the_library_chooses_gives_its_type():
    """Note [The layout of SDPA's result]: where ATen lays SDPA's result out otherwise than its type says
    (here a contiguous result typed as [B, T, H, D] transposed), the step copies it into the typed layout,
    so the kernel reading it reads the right elements and the plan is added."""
    fn = _native.GraphFunction("sdpa", True, False, -1, [], "")
    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    want = torch.relu(torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.25))
    for strides in ("512,128,16,1", "512,16,64,1"):
        info, outs = fn.add_run([q, k, v], strides, _SDPA_RELU.format(strides=strides), [])
        assert info[0] == 1, info
        torch.testing.assert_close(outs[0], want)
        status, again = fn.run([q, k, v], strides)
        assert status == 0
        torch.testing.assert_close(again[0], want)


class _Block(torch.nn.Module):
    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads, self.ln1, self.ln2 = heads, torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for y in self.qkv(self.ln1(x)).split(c, dim=2))
        att = (q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5
        att = att.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1), float("-inf"))
        x = x + self.proj((att.softmax(-1) @ v).transpose(1, 2).contiguous().view(b, t, c))
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))


class _Gpt(torch.nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(50, d), torch.nn.Embedding(32, d)
        self.blocks, self.ln, self.head = torch.nn.Sequential(_Block(d), _Block(d)), torch.nn.LayerNorm(d), torch.nn.Linear(d, 50)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        return self.head(self.ln(self.blocks(x)))


def test_a_gpt_tower_over_lengths_and_batches_is_one_class_per_graph():
    """A causal GPT tower (the attention rule's SDPA inside) over lengths and batch sizes: each dynamic
    graph is lowered once and its later sizes are instances of its class's plan. SDPA's CPU result is laid
    out as [B, T, H, D]; before its type said so, the class was refused at its first check and each of the
    signatures was lowered and planned on its own."""
    model = _Gpt().eval()
    compiled = fusion_jit.compile(model)
    signatures = [(b, t) for b in (1, 2) for t in (5, 6, 7, 9, 12)]
    with torch.no_grad():
        for b, t in signatures:
            idx = torch.randint(0, 50, (b, t))
            torch.testing.assert_close(compiled(idx), model(idx), rtol=1e-4, atol=1e-4)
    s = fusion_jit.stats()
    assert s["plans"] == len(signatures) and s["eager_calls"] == 0, s
    assert s["lowerings"] <= s["graphs"] and s["class_plans"] >= 1, s
    assert s["class_instances"] >= len(signatures) - 2 * s["graphs"], s


@pytest.mark.fallback
def test_a_template_whose_plan_fails_its_check_is_dropped_and_each_signature_lowered():
    from fusion_jit import _backend
    compiled = torch.compile(_f, backend="fusion_jit", dynamic=True)
    x = torch.randn(4, 6)
    compiled(x)
    (g,) = [g for g in _backend._graphs if g.template is not None]

    class Failing:  # the native GraphFunction, but add_at's check fails
        def __init__(self, fn):
            self.fn = fn

        def __getattr__(self, name):
            return getattr(self.fn, name)

        def add_at(self, *args):
            raise ValueError("aten::mm: its result %1 is ... at run time; the graph's type is ...")

        def add_from_class(self, *args):
            raise ValueError("aten::mm: its result %1 is ... at run time; the graph's type is ...")

    g.fn = Failing(g.fn)
    for shape in [(6, 10), (2, 14)]:
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x)[0], _f(x)[0])
    assert g.template is None and not g.symbolic and "dropped at s" in g.no_template, g.no_template
    s = fusion_jit.stats()
    assert s["lowerings"] == 3 and s["symbolic_plans"] == 0 and s["eager_calls"] == 0, s


def test_explain_names_the_symbols_and_each_plan_from_the_template():
    from fusion_jit import _backend
    records = []
    f = torch.compile(_f, dynamic=True, backend=_backend._Backend(fusion_jit.Options({}), records))
    for shape in [(4, 6), (6, 10)]:
        f(torch.randn(shape))
    text = "".join(t for _, t in records)
    assert "symbolic graph: s" in text and "= argument 2 dim 0" in text, text
    assert "later signatures are instances of one plan of its shape class" in text, text
    assert "symbolic graph: the plan of s" in text and "=6, s" in text and "=10, the class's plan evaluated there" in text, text
    assert "shape class: the class's plan at s" in text and "instantiated in" in text, text


def _half_size_noise(x):
    # A size used as a float (no expression the template can hold) and a random op.
    return x * (x.shape[0] / 2) + torch.rand_like(x)


def test_a_graph_without_template_is_lowered_with_numbers_and_draws_eagers_random_numbers_once():
    """Note [Symbolic graphs]: the symbolic lowering's text is not used where its expressions do not hold;
    the graph is lowered again with numbers, and the random generator is left as one eager run leaves it."""
    from fusion_jit import _backend
    compiled = torch.compile(_half_size_noise, backend="fusion_jit", dynamic=True)
    for n in (4, 6):
        x = torch.randn(n, 3)
        torch.manual_seed(n)
        got, after = compiled(x), torch.rand(2)
        torch.manual_seed(n)
        expected, eager_after = _half_size_noise(x), torch.rand(2)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(after, eager_after)
    (g,) = [g for g in _backend._graphs if g.no_template is not None]
    assert g.template is None and "float" in g.no_template, g.no_template
    s = fusion_jit.stats()
    assert s["lowerings"] == 2 and s["eager_graphs"] == 0, s


_CLASS = """graph[s0=3](%0 : f32[s0,4]):
  %1 : f32[s0,4] = aten::relu(%0)
  %2 : f32[4*s0] = aten::view(%1, [4*s0])
  return (%2)
"""


def test_a_plan_of_its_own_is_the_class_graph_at_the_values():
    """GraphFunction::add_at: the class's graph concretized in C++, no text filled in; inputs checked
    against it there."""
    fn = _native.GraphFunction("at", True, False, -1, [], "")
    for n in (3, 5):
        x = torch.randn(n, 4)
        info, outs = fn.add_at([x], "", _CLASS, ["s0"], [n], [], True)
        assert info[0] == 1 and info[6] == 1
        torch.testing.assert_close(outs[0], torch.relu(x).view(-1))
        status, again = fn.run([x], "")
        assert status == 0
        torch.testing.assert_close(again[0], torch.relu(x).view(-1))
    assert fn.num_plans() == 2
    with pytest.raises((TypeError, ValueError), match="input 0"):
        fn.add_at([torch.randn(6, 4)], "", _CLASS, ["s0"], [7], [], True)
    with pytest.raises((TypeError, ValueError), match="s0 has no value"):
        fn.add_at([torch.randn(6, 4)], "", _CLASS, ["s1"], [6], [], True)
    assert fn.num_plans() == 2
