"""The freezing option of the torch.compile backend (issue 15, Note [Freezing] in _backend.py): parameters
and buffers of inference graphs as constants of the plans, rules that need constants firing, and every
change to a frozen tensor after compilation seen at the next call."""

import copy
import re
import warnings

import pytest

import torch
import torch.nn as nn

import fusion_jit


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    fusion_jit.reset()
    yield


def assert_close(actual, expected, reference64, what):
    ok, err, why = torch.ops.fusion_jit.check_close(actual, expected, reference64)
    assert ok, f"{what}: {why} (max error {err:.3g})"


class ConvBnRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(y.mean((2, 3)))


def conv_bn_relu():
    torch.manual_seed(0)
    m = ConvBnRelu().eval()
    with torch.no_grad():  # statistics unlike a fresh BatchNorm's, so that folding them matters
        m.bn.running_mean.uniform_(-1, 1)
        m.bn.running_var.uniform_(0.5, 2)
        m.bn.weight.uniform_(0.5, 1.5)
        m.bn.bias.uniform_(-0.5, 0.5)
    return m, torch.randn(2, 3, 16, 16)


def check(model, compiled, x, what):
    with torch.no_grad():
        expected = model(x)
        reference = copy.deepcopy(model).double()(x.double())
        got = compiled(x)
    assert_close(got, expected, reference, what)


def test_freezing_folds_batch_norm_into_the_conv():
    m, x = conv_bn_relu()
    with torch.no_grad():
        text = fusion_jit.explain(m, x, freezing=True, file=open("/dev/null", "w"))
    assert "freezing: 8 parameter(s) and buffer(s) are constants of the plan" in text, text
    assert "fold.conv_bn x1" in text, text
    assert "aten::batch_norm" not in text, text
    torch._dynamo.reset()
    fusion_jit.reset()
    compiled = fusion_jit.compile(m, freezing=True)
    check(m, compiled, x, "first call")
    check(m, compiled, x, "second call")
    s = fusion_jit.stats()
    assert s["frozen_inputs"] == 8 and s["eager_graphs"] == 0 and s["plans"] == 1, s


def test_freezing_is_off_by_default():
    m, x = conv_bn_relu()
    with torch.no_grad():
        text = fusion_jit.explain(m, x, file=open("/dev/null", "w"))
    assert "freezing" not in text and "fold.conv_bn" not in text, text
    assert fusion_jit.stats()["frozen_inputs"] == 0


def test_freezing_through_torch_compile_options_and_the_environment(monkeypatch):
    m, x = conv_bn_relu()
    compiled = torch.compile(m, backend="fusion_jit", options={"freezing": True})
    check(m, compiled, x, "options={'freezing': True}")
    assert fusion_jit.stats()["frozen_inputs"] == 8
    torch._dynamo.reset()
    fusion_jit.reset()
    monkeypatch.setenv("FUSION_JIT_FREEZING", "1")
    check(m, torch.compile(m, backend="fusion_jit"), x, "FUSION_JIT_FREEZING=1")
    assert fusion_jit.stats()["frozen_inputs"] == 8
    with pytest.raises(TypeError, match="'freezing' must be a bool"):
        fusion_jit.compile(m, freezing=1)
    monkeypatch.setenv("FUSION_JIT_FREEZING", "maybe")
    with pytest.raises(ValueError, match="FUSION_JIT_FREEZING=maybe"):
        fusion_jit.Options()


def test_a_changed_parameter_is_seen_at_the_next_call():
    m, x = conv_bn_relu()
    compiled = fusion_jit.compile(m, freezing=True)
    check(m, compiled, x, "before any change")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            m.conv.weight.add_(0.5)                      # in place: the version counter moves
        check(m, compiled, x, "after conv.weight.add_")
        with torch.no_grad():
            m.bn.running_var.mul_(3.0)                   # a buffer, in place
        check(m, compiled, x, "after bn.running_var.mul_")
        m.fc.weight.data = torch.randn(4, 8)             # .data assignment: same object, new storage
        check(m, compiled, x, "after fc.weight.data =")
        m.fc.bias = nn.Parameter(torch.randn(4))         # replaced
        check(m, compiled, x, "after fc.bias replaced")
        with torch.no_grad():
            m.conv.weight.mul_(0.5)                      # conv.weight's second change: an input from now on
        check(m, compiled, x, "after conv.weight's second change")
        plans = fusion_jit.stats()["plans"]
        with torch.no_grad():
            m.conv.weight.add_(1.0)                      # read at each call: no compile
        check(m, compiled, x, "after conv.weight's third change")
        assert fusion_jit.stats()["plans"] == plans
    ours = [str(w.message) for w in caught if "frozen input" in str(w.message)]
    assert ours and all("changed after compilation; compiling again" in w for w in ours), ours
    assert fusion_jit.stats()["eager_graphs"] == 0


@pytest.mark.parametrize("what, write", [
    ("conv.weight.data.mul_", lambda m: m.conv.weight.data.mul_(-3)),
    ("bn.running_var.data.copy_", lambda m: m.bn.running_var.data.copy_(torch.rand(8) + 2)),
    ("fc.weight.data.normal_", lambda m: m.fc.weight.data.normal_()),
    ("a numpy view of conv.weight", lambda m: m.conv.weight.detach().numpy().__imul__(-1.0)),
])
def test_writes_no_counter_shows_are_taken_by_refreeze(what, write):
    """Note [Freezing]: freezing treats parameters as constants. A write through `.data` or a numpy view
    moves no version counter of the parameter, so the plans keep the values they were compiled with
    (as Inductor's freezing does, and as docs/python.md says); refreeze(model) makes the next call compile
    with the values as they are."""
    m, x = conv_bn_relu()
    with torch.no_grad():
        before = m(x)
        compiled = fusion_jit.compile(m, freezing=True)
        check(m, compiled, x, "the compiling call")
        write(m)
        assert not torch.allclose(m(x), before), f"{what} changed the model"
        # Not seen: the frozen values (a limit docs/python.md states), never a mix of old and new.
        torch.testing.assert_close(compiled(x), before, msg=f"after {what}, before refreeze")
        assert fusion_jit.refreeze(compiled) >= 1
        check(m, compiled, x, f"after {what} and refreeze")
        check(m, compiled, x, "the call after")
    assert fusion_jit.refreeze(nn.Linear(2, 2)) == 0, "a model none of whose tensors is frozen"
    with pytest.raises(TypeError, match="refreeze"):
        fusion_jit.refreeze("model")
    assert fusion_jit.stats()["eager_graphs"] == 0


def test_freezing_a_model_of_inference_tensors():
    """Parameters made under torch.inference_mode (common in serving) have no version counter: the check
    at each call read it and every call raised "Inference tensors do not track version counter"."""
    with torch.inference_mode():
        m2, x = conv_bn_relu()  # made under inference mode: its parameters are inference tensors
        assert all(p.is_inference() for p in m2.parameters())
        expected = m2(x)
        compiled = fusion_jit.compile(m2, freezing=True)
        for call in range(3):
            torch.testing.assert_close(compiled(x), expected, msg=f"call {call}")
        m2.conv.weight.mul_(-1.0)  # in place under inference mode: no counter to show it
        fusion_jit.refreeze(m2)
        torch.testing.assert_close(compiled(x), m2(x), msg="after refreeze")
    assert fusion_jit.stats()["frozen_inputs"] > 0
    assert fusion_jit.stats()["eager_graphs"] == 0


def test_frozen_weights_are_shared_by_the_batch_sizes_of_a_served_model():
    """Note [Folded constants shared across signatures]: each lowering of the model's graphs (the static
    one, the symbolic one, any lowered again) makes the frozen conv weight channels-last; that copy (and
    with it what the plans fold from it) is one tensor for all of them while the weight is unchanged. Before, each lowering made a copy of every weight, and a
    plan per batch size held its own copies (resnet18: +129 MB per batch size)."""
    m, _ = conv_bn_relu()
    compiled = fusion_jit.compile(m, freezing=True)

    def copies():  # the tensors themselves: holding them keeps a new copy from taking a freed one's id
        return [kept[2] for g in list(fusion_jit._backend._graphs) for kept in g.channels_last_copies.values()]

    def same(a, b):
        return len(a) == len(b) and all(any(x is y for y in b) for x in a)

    def serve(batches, what):
        for b in batches:
            check(m, compiled, torch.randn(b, 3, 16, 16, generator=torch.Generator().manual_seed(b)), f"{what}, batch {b}")

    serve((2, 3, 4), "first batch sizes")
    kept = copies()
    assert kept, "the conv weight is made channels-last"
    serve((5, 6, 7), "later batch sizes")
    assert same(copies(), kept), "no new copy for a new batch size"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            m.conv.weight.add_(0.5)
        serve((7, 9), "after conv.weight.add_")
    assert any(all(x is not y for y in kept) for x in copies()), \
        "a changed weight is copied again (by the graph that served batch sizes 7 and 9)"
    assert fusion_jit.stats()["eager_calls"] == 0


class CountingModule(nn.Module):
    """Mutates a buffer in forward: the buffer must stay an input (AOT autograd writes it back)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(1))
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        self.calls.add_(1)
        return self.lin(x) * self.calls


def test_a_buffer_the_graph_mutates_is_not_frozen():
    torch.manual_seed(0)
    m, eager = CountingModule().eval(), CountingModule().eval()
    eager.load_state_dict(m.state_dict())
    compiled = fusion_jit.compile(m, freezing=True)
    x = torch.randn(3, 4)
    with torch.no_grad():
        for call in range(4):
            got, expected = compiled(x), eager(x)
            torch.testing.assert_close(got, expected, msg=f"call {call}")
    assert m.calls.item() == 4 and fusion_jit.stats()["frozen_inputs"] == 2  # lin.weight, lin.bias


def test_training_graphs_are_not_frozen():
    m, x = conv_bn_relu()
    m.train()
    compiled = fusion_jit.compile(m, freezing=True)
    out = compiled(x)
    out.sum().backward()
    assert m.conv.weight.grad is not None
    assert fusion_jit.stats()["frozen_inputs"] == 0


def check_outputs_and_strides(model, compiled, x):
    """Two calls (the first gives the lowering run's result, the second the plan's): every output as
    eager's, strides included, against the fp64 reference."""
    with torch.no_grad():
        expected = model(x)
        reference = copy.deepcopy(model).double()(x.double())
        for call in ("first", "second"):
            got = compiled(x)
            for i, (g, e, r) in enumerate(zip(got, expected, reference)):
                assert g.stride() == e.stride(), f"{call} call, output {i}: strides {g.stride()} vs eager {e.stride()}"
                assert_close(g, e, r, f"{call} call, output {i}")


class FeatureMap(nn.Module):
    """Returns 4-d activations: with freezing the plan is channels-last inside (Note [Channels-last plans]);
    each output must come back with eager's strides, whatever eager gives."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 1)

    def forward(self, x):
        y = torch.relu(self.a(x))
        z = self.b(y) + y
        return z, y.mean(1, keepdim=True), z.flatten(1)


@pytest.mark.parametrize("freezing", [True, False])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_outputs_keep_eagers_strides_in_channels_last_plans(layout, freezing):
    # With freezing the weights are made channels-last; with default settings the first convolution's
    # input is (Note [Channels-last activations]). Returning z and its flattened view, the graph is lowered
    # as traced (flattening a channels-last z takes a copy, which would part the two outputs): explain
    # says so.
    torch.manual_seed(0)
    m = FeatureMap().eval()
    x = torch.randn(2, 3, 12, 12)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    compiled = fusion_jit.compile(m, freezing=freezing)
    if not freezing and layout == "contiguous":
        with torch.no_grad():
            text = fusion_jit.explain(m, x, file=open("/dev/null", "w"))
        assert "layout: NCHW kept (channels-last failed: view size is not compatible" in text, text
    check_outputs_and_strides(m, compiled, x)
    assert fusion_jit.stats()["eager_graphs"] == 0


class ActivationAndItsView(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return y, y[:1]


def test_outputs_sharing_storage_keep_sharing_it():
    # The copies giving each output of a channels-last plan its eager layout would part an activation and
    # a view of it: such a graph is lowered as traced. Returned two unrelated tensors before.
    torch.manual_seed(0)
    m = ActivationAndItsView().eval()
    x = torch.randn(2, 3, 8, 8)
    compiled = fusion_jit.compile(m, freezing=True)
    with torch.no_grad():
        e = m(x)
        for call in ("first", "second"):
            a, b = compiled(x)
            torch.testing.assert_close(a, e[0])
            torch.testing.assert_close(b, e[1])
            assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr(), f"{call} call: parted"


class DepthwiseNet(nn.Module):
    """Depthwise and 1x1 convolutions over a large image: channels-last pays without frozen weights."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.pw = nn.Conv2d(16, 32, 1)
        self.bn = nn.BatchNorm2d(32)

    def forward(self, x):
        y = torch.nn.functional.silu(self.stem(x))
        y = self.pw(torch.nn.functional.silu(self.dw(y)) + y)
        return torch.relu(self.bn(y)).mean((2, 3))


class WideWeights(nn.Module):
    """3x3 convolutions with large weights over a small image: copying the weights to channels-last on
    each call would cost more than the layout gains (resnet18's late stages)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(64, 256, 3, padding=1)
        self.b = nn.Conv2d(256, 256, 3, padding=1)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))).mean((2, 3))


class FlattenedFeatures(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1, groups=1)
        self.b = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc = nn.Linear(8 * 16 * 16, 4)

    def forward(self, x):
        z = self.b(torch.relu(self.a(x))) + 1
        return self.fc(z.flatten(1)), z


def test_a_view_the_layout_makes_impossible_becomes_a_copy_where_only_read():
    # z.flatten(1) (aten::view) of a channels-last z cannot be a view; nothing else sees it, so the plan
    # copies (aten::reshape) and stays channels-last. z itself is returned with eager's layout.
    torch.manual_seed(0)
    m = FlattenedFeatures().eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        text = fusion_jit.explain(m, x, file=open("/dev/null", "w"))
        assert "layout: channels-last activations" in text and "aten::reshape" in text, text
        fusion_jit.reset()
        torch._dynamo.reset()
        compiled = fusion_jit.compile(m)
    check_outputs_and_strides(m, compiled, x)


class Squeeze1x1(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(16, 4, 1)

    def forward(self, x):
        return self.conv(x)


@pytest.mark.parametrize("net, x, disable, layout, clones", [
    (DepthwiseNet, (2, 3, 32, 32), "weight_memo", "channels-last activations", 2),
    (WideWeights, (1, 64, 7, 7), "weight_memo", "NCHW kept", 0),
    # Weights reordered once per content cost nothing per call: WideWeights pays too, and the stem's weight
    # is read as it is (only the input is copied).
    (DepthwiseNet, (2, 3, 32, 32), "", "channels-last activations", 1),
    (WideWeights, (1, 64, 7, 7), "", "channels-last activations", 1),
    # The input's copy at the edge is paid even where the weight is reordered once per content: 16
    # channels copied in and 4 back out do not pay for writing 4 (it went uncounted, and the plan was
    # channels-last).
    (Squeeze1x1, (2, 16, 16, 16), "", "NCHW kept", 0),
])
def test_default_settings_choose_the_layout_by_cost(net, x, disable, layout, clones):
    m, x, text = explained(net, x, disable=disable)
    assert f"layout: {layout}" in text, text
    # The copies to channels-last are kernels of the plan: DepthwiseNet's input and its stem's weight (the
    # depthwise and 1x1 weights are channels-last already), the input alone where the weights are reordered
    # once per version.
    assert text.count("aten::clone") == clones, text
    fusion_jit.reset()
    torch._dynamo.reset()
    check(m, fusion_jit.compile(m, disable=disable), x, net.__name__)
    assert fusion_jit.stats()["eager_graphs"] == 0


@pytest.mark.parametrize("net, shape, written, edges, layout", [
    # 2x8x16x16 written by the conv; only the 2x3x16x16 image is copied at the edges (the output is 2-d).
    (ConvBnRelu, (2, 3, 16, 16), 4096, 1536, "channels-last activations"),
    # Writing 4 channels does not pay for copying 16 in and 4 back out.
    (Squeeze1x1, (2, 16, 16, 16), 2048, 8192 + 2048, "NCHW kept, channels-last activations would not pay"),
])
def test_freezing_chooses_the_layout_by_cost(net, shape, written, edges, layout):
    # Note [Channels-last plans]: frozen weights are copied channels-last once; whether the plan's
    # activations take that layout is the cost model's estimate, printed by explain.
    m, x, text = explained(net, shape, freezing=True)
    gain, cost = torch.ops.fusion_jit.channels_last_estimate(written, 0, 0, edges)
    assert (gain > cost) == layout.startswith("channels-last"), (gain, cost)
    assert (f"layout: {layout}: est. gain {gain:.1f} us ({written} elements written by 1 convolution(s)), "
            f"cost {cost:.1f} us ({edges} copied at the edges; the weights copied once)") in text, text
    assert ("mkldnn::_convolution_pointwise" in text) == (gain > cost), text
    fusion_jit.reset()
    torch._dynamo.reset()
    check(m, fusion_jit.compile(m, freezing=True), x, net.__name__)
    assert fusion_jit.stats()["eager_graphs"] == 0


@pytest.mark.parametrize("freezing", [True, False])
def test_the_layout_is_decided_by_the_convolutions_times(monkeypatch, freezing):
    # Note [Convolutions timed on this machine]: by default (the suite runs with conv_timing off) the layout
    # is decided by the convolution's times here, with freezing and with default settings, and explain
    # gives them; eager's results either way.
    monkeypatch.setenv("FUSION_JIT_DISABLE", "")
    m, x, text = explained(ConvBnRelu, (2, 3, 16, 16), freezing=freezing)
    assert re.search(r"layout: .*gain -?[0-9.]+ us \(1 of 1 convolution\(s\) timed here: ATen's on NCHW [0-9.]+ us, "
                     r"oneDNN's on channels-last [0-9.]+ us\)", text), text
    fusion_jit.reset()
    torch._dynamo.reset()
    check(m, fusion_jit.compile(m, freezing=freezing), x, f"ConvBnRelu timed, freezing={freezing}")


def explained(net, shape, **options):
    """A seeded `net` in eval mode, an input of `shape`, and explain's text for it (no_grad)."""
    torch.manual_seed(0)
    m = net().eval()
    x = torch.randn(*shape)
    with torch.no_grad():
        text = fusion_jit.explain(m, x, file=open("/dev/null", "w"), **options)
    return m, x, text


def reorders_in(fn):
    """fn()'s result and how many conv weight reorders it ran (torch.profiler sees the plan's ATen steps)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = fn()
    return out, sum(1 for e in prof.events() if e.name == "mkldnn::_reorder_convolution_weight")


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this build of torch has no oneDNN")
def test_default_settings_reorder_each_conv_weight_once_per_content():
    """Note [Weights reordered once per content] (src/torch/executor.h): a channels-last plan's conv
    weights, inputs of each call, are reordered for oneDNN at the plan's first run and again only for a
    weight whose bytes changed, however they were written; every result is eager's for the weights of that
    call. Writes through `.data` move no version counter of the parameter, and numpy and DLPack views none
    at all: before, the plan kept using the stale reorder (max error 1.16 on a conv net)."""
    m, x, text = explained(DepthwiseNet, (2, 3, 32, 32))
    assert "3 weight(s) reordered once per content" in text, text
    assert text.count("mkldnn::_reorder_convolution_weight") == 3, text
    torch._dynamo.reset()
    fusion_jit.reset()
    compiled = fusion_jit.compile(m)
    check(m, compiled, x, "the compiling call")
    _, n = reorders_in(lambda: check(m, compiled, x, "the plan's first run"))
    assert n == 3
    _, n = reorders_in(lambda: check(m, compiled, x, "a later call"))
    assert n == 0, "the three weights have the same bytes"
    writes = [
        ("pw.weight.mul_ under no_grad (its version moves)", lambda: m.pw.weight.mul_(-0.5)),
        ("pw.weight.data.mul_", lambda: m.pw.weight.data.mul_(-3)),
        ("dw.weight.data.copy_", lambda: m.dw.weight.data.copy_(torch.randn_like(m.dw.weight))),
        ("stem.weight.data.normal_", lambda: m.stem.weight.data.normal_()),
        ("a numpy view of pw.weight", lambda: m.pw.weight.detach().numpy().__imul__(-1.0)),
        ("a DLPack view of dw.weight",
         lambda: torch.utils.dlpack.from_dlpack(m.dw.weight.detach().__dlpack__()).mul_(2.0)),
        ("dw.weight.data = (new storage)", lambda: setattr(m.dw.weight, "data", torch.randn_like(m.dw.weight))),
    ]
    for what, write in writes:
        with torch.no_grad():
            write()
        _, n = reorders_in(lambda: check(m, compiled, x, f"after {what}"))
        assert n == 1, f"after {what}: {n} reorders"
    # A write that leaves the bytes as they were (a copy of themselves) reorders nothing.
    with torch.no_grad():
        m.pw.weight.data.copy_(m.pw.weight.detach().clone())
    _, n = reorders_in(lambda: check(m, compiled, x, "after an equal copy"))
    assert n == 0
    m.stem.weight = nn.Parameter(torch.randn_like(m.stem.weight))  # replaced
    check(m, compiled, x, "after stem.weight replaced")
    check(m, compiled, x, "the call after")
    s = fusion_jit.stats()
    assert s["eager_graphs"] == 0 and s["eager_calls"] == 0, s


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this build of torch has no oneDNN")
def test_weights_made_and_changed_under_inference_mode_are_read_at_each_call():
    """Inference tensors have no version counter, and torch.inference_mode lets them change in place: the
    content decides, so a changed weight is reordered at the call and the others are not."""
    torch.manual_seed(0)
    with torch.inference_mode():
        m = DepthwiseNet().eval()
        x = torch.randn(2, 3, 32, 32)
        compiled = fusion_jit.compile(m)
        for step in range(3):
            torch.testing.assert_close(compiled(x), m(x), atol=1e-4, rtol=1e-4, msg=f"call {step}")
            m.pw.weight.mul_(-1.5)                     # no version counter moves
        _, n = reorders_in(lambda: compiled(x))
        torch.testing.assert_close(compiled(x), m(x), atol=1e-4, rtol=1e-4, msg="the last call")
    assert n == 1, "the changed weight alone reordered at the call"


class SqueezeExcite(nn.Module):
    """A squeeze-excite block's convolutions over a 1x1 image: ATen's on the plain weight (faster there)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(16, 32, 3, padding=1)
        self.reduce = nn.Conv2d(32, 8, 1)
        self.expand = nn.Conv2d(8, 32, 1)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        s = torch.sigmoid(self.expand(torch.relu(self.reduce(y.mean((2, 3), keepdim=True)))))
        return (y * s).mean((2, 3))


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this build of torch has no oneDNN")
def test_weights_over_a_one_pixel_image_and_disabled_memos_stay_atens():
    m, x, text = explained(SqueezeExcite, (2, 16, 32, 32))
    assert "layout: channels-last activations" in text, text
    assert text.count("mkldnn::_reorder_convolution_weight") == 1, text  # the 3x3 conv over 32x32 only
    check(m, fusion_jit.compile(m), x, "SqueezeExcite")
    torch._dynamo.reset()
    fusion_jit.reset()
    with torch.no_grad():
        text = fusion_jit.explain(m, x, disable="weight_memo", file=open("/dev/null", "w"))
    assert "mkldnn::_reorder_convolution_weight" not in text and "reordered once" not in text, text


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this build of torch has no oneDNN")
def test_threads_serving_a_plan_after_each_weight_change_get_eagers_results():
    """Threads calling one plan right after a weight changed all find the reorder missing at once; each
    call's result is eager's for the new weight."""
    import threading
    torch.manual_seed(0)
    m = DepthwiseNet().eval()
    x = torch.randn(2, 3, 32, 32)
    compiled = fusion_jit.compile(m)
    with torch.no_grad():
        compiled(x)
        for change in range(4):
            m.pw.weight.mul_(-1.5)
            m.stem.weight.add_(0.25)
            expected = m(x)
            results = []
            barrier = threading.Barrier(3)

            def serve():
                try:
                    with torch.no_grad():  # (grad mode is per thread)
                        barrier.wait()
                        for _ in range(5):
                            results.append(compiled(x))
                except Exception as e:  # reported below, with the thread's results missing
                    results.append(e)

            threads = [threading.Thread(target=serve) for _ in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len(results) == 15
            errors = [r for r in results if isinstance(r, Exception)]
            assert not errors, errors
            for got in results:
                torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4, msg=f"change {change}")



def test_disabling_channels_last_keeps_nchw_with_default_settings(monkeypatch):
    monkeypatch.setenv("FUSION_JIT_DISABLE", "channels_last")
    torch.manual_seed(0)
    m = DepthwiseNet().eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        text = fusion_jit.explain(m, x, file=open("/dev/null", "w"))
    assert "layout:" not in text and "aten::clone" not in text, text


@pytest.mark.parametrize("net, freezing, shapes", [
    (DepthwiseNet, False, [(2, 3, 32, 32), (3, 3, 32, 32), (2, 3, 24, 40), (5, 3, 16, 16)]),
    (FlattenedFeatures, True, [(2, 3, 16, 16), (3, 3, 16, 16), (5, 3, 16, 16), (1, 3, 16, 16)]),
])
def test_channels_last_plans_of_a_symbolic_graph_come_from_its_template(net, freezing, shapes):
    """Note [Symbolic graphs]: a lowering that makes tensors channels-last (activations under default
    settings, frozen conv weights under freezing) writes its template with that layout's strides over the
    graph's symbolic sizes, so later sizes are filled in instead of lowered again. Every output as eager's,
    strides included."""
    torch.manual_seed(0)
    m = net().eval()
    compiled = fusion_jit.compile(m, dynamic=True, freezing=freezing)
    for shape in shapes:
        x = torch.randn(*shape)
        if net is FlattenedFeatures:
            check_outputs_and_strides(m, compiled, x)
        else:
            check(m, compiled, x, f"{net.__name__} {shape}")
    s = fusion_jit.stats()
    assert s["eager_calls"] == 0 and s["eager_graphs"] == 0, s
    assert s["symbolic_plans"] >= 2 and s["lowerings"] < len(shapes), s
    if net is DepthwiseNet and torch.backends.mkldnn.is_available():
        # The template's plans reorder their weights once too (Note [Weights reordered once per content]).
        _, n = reorders_in(lambda: check(m, compiled, x, "again"))
        assert n == 0


class Stem(nn.Module):
    """A ResNet stem: conv, batch norm, relu, 3x3 max pool of stride 2, then a residual block."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 7, stride=2, padding=3, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.block = nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        y = self.pool(torch.relu(self.bn(self.conv(x))))
        return torch.relu(self.block(y) + y)


@pytest.mark.parametrize("freezing", [True, False])
def test_a_stems_max_pool_is_our_kernel_in_both_settings(freezing):
    # Note [Max pooling as loads]: torch.compile's max_pool2d_with_indices, its indices unused, is read as
    # strided loads of the conv's result in one kernel (an odd input size: pieces at both ends), with eager's
    # results; turned off, ATen's pool runs.
    torch.manual_seed(0)
    m = Stem().eval()
    x = torch.randn(2, 3, 45, 37)
    for disable, fired in (("", True), ("decompose.max_pool2d_indices", False)):
        with torch.no_grad():
            text = fusion_jit.explain(m, x, file=open("/dev/null", "w"), freezing=freezing, disable=disable)
        assert ("decompose.max_pool2d_indices x1" in text) == fired, text
        assert ("aten: aten::max_pool2d_with_indices" in text) != fired, text
        torch._dynamo.reset()
        check(m, torch.compile(copy.deepcopy(m), backend="fusion_jit", options={"freezing": freezing, "disable": disable}),
              x, f"freezing={freezing} disable={disable!r}")
