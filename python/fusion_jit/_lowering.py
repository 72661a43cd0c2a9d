"""FX graph (ATen ops, after AOT autograd) -> fusion_jit's textual IR.

The graph is run once on the call's real inputs (eager ATen, node by node), which gives every value's
concrete type (dtype, sizes, strides, device) and the value of every non-tensor (sizes computed with
SymInts become numbers: plans are specialized). Each node is then written as an IR node named by its ATen
schema ("aten::add.Tensor"), with every schema argument in order (defaults filled in), tensors as values
and everything else as literals. The C++ side links each node to the op table by that name, as the
TorchScript importer does.

Written as:
  tensor arguments            %N, a value of the graph
  lists of tensors            a prim::ListConstruct node (Tensor[], or Tensor?[] with None entries)
  ops returning Tensor[]      the op's list value, then prim::ListUnpack into its tensors
  dtype, layout, memory format their c10 codes (ints), as TorchScript passes them
  device                      a string ("cpu", "cuda:0"); the executor converts it by the schema
  get_attr tensors            fj::constant(i), the i-th of the constants passed with the text
  frozen inputs               also fj::constant(i): with the freezing option, the parameters and buffers
                              the graph takes as inputs (`frozen`: their positions) are constants of the plan
Anything else (mutating ops, higher-order ops, non-ATen functions computing tensors, tensors of other
dtypes or layouts) raises Unsupported with the node's name: that graph then runs eagerly.
"""

import math
import operator

import torch
from torch.fx.node import map_aggregate

from . import _native, _symbolic

_DTYPE_NAMES = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
    torch.bool: "b8",
}
# c10::ScalarType, Layout and MemoryFormat codes.
_SCALAR_TYPE_CODES = {
    torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4, torch.float16: 5,
    torch.float32: 6, torch.float64: 7, torch.complex32: 8, torch.complex64: 9, torch.complex128: 10,
    torch.bool: 11, torch.bfloat16: 15,
}
_LAYOUT_CODES = {torch.strided: 0, torch.sparse_coo: 1}
_MEMORY_FORMAT_CODES = {
    torch.contiguous_format: 0, torch.preserve_format: 1, torch.channels_last: 2, torch.channels_last_3d: 3,
}
# Ops returning sizes (not data): their results become literals.
_SIZE_OPS = {"aten::sym_size.int", "aten::sym_stride.int", "aten::sym_numel", "aten::sym_storage_offset"}


class Unsupported(Exception):
    """The graph cannot be lowered; the message names the node and why."""


def tensor_type(t, what, numbers=None):
    """The IR type of tensor `t`; `numbers`: its sizes and strides as text (expressions, _symbolic.Marks)."""
    name = _DTYPE_NAMES.get(t.dtype)
    if name is None:
        raise Unsupported(f"{what}: dtype {t.dtype} is not supported")
    if t.layout != torch.strided:
        raise Unsupported(f"{what}: layout {t.layout} is not supported")
    if t.device.type == "cpu":
        device = ""
    elif t.device.type == "cuda":
        device = f"@cuda:{t.device.index or 0}"
    else:
        raise Unsupported(f"{what}: device {t.device} is not supported")
    if numbers is not None:
        sizes, strides = numbers
    else:
        sizes = ",".join(str(s) for s in t.shape)
        strides = ",".join(str(s) for s in t.stride())
    return f"{name}[{sizes}]{{{strides}}}{device}"


def _literal(v, what):
    """A Python value as an IR literal."""
    if v is None:
        return "None"
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, (int, torch.SymInt)):
        return str(int(v))
    if isinstance(v, (float, torch.SymFloat)):
        f = float(v)
        if math.isnan(f):
            return "nan"
        if math.isinf(f):
            return "inf" if f > 0 else "-inf"
        r = repr(f)
        return r if any(c in r for c in ".e") else r + ".0"
    if isinstance(v, str):
        if '"' in v or "\n" in v:
            raise Unsupported(f"{what}: string argument {v!r} cannot be written")
        return f'"{v}"'
    if isinstance(v, torch.dtype):
        return str(_SCALAR_TYPE_CODES[v])
    if isinstance(v, torch.layout):
        return str(_LAYOUT_CODES[v])
    if isinstance(v, torch.memory_format):
        return str(_MEMORY_FORMAT_CODES[v])
    if isinstance(v, torch.device):
        return f'"{v}"'
    if isinstance(v, (list, tuple)):
        # A list of bools (backward ops' output masks) as 0/1: the executor converts it by the schema.
        items = [str(int(x)) if isinstance(x, bool) else _literal(x, what) for x in v]
        if any(isinstance(x, (list, tuple, str)) or x is None for x in v):
            raise Unsupported(f"{what}: list argument {v!r} cannot be written")
        return "[" + ", ".join(items) + "]"
    raise Unsupported(f"{what}: argument of type {type(v).__name__} cannot be written")


class _Ref:
    """An IR value: its name (%N)."""

    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name


class Lowered:
    """The result of lowering one graph for one call."""

    def __init__(self):
        self.ir = ""
        self.constants = []          # tensors, fj::constant(i)
        self.tensor_positions = []   # which of the call's arguments are the IR's inputs
        self.key_positions = []      # which are numbers (or None): the plan is specialized on their values
        self.key = ""                # those arguments' values (specialization_key)
        self.outputs = []            # per graph output: ("ir", k) the k-th IR output, or ("const", value)
        self.results = []            # the graph's outputs of the lowering run
        self.template = None         # _symbolic.Template: the graph of the shape class (ir is then None)
        self.no_template = None      # why there is none, for a symbolic graph


def specialization_key(args, key_positions):
    return repr([args[i] for i in key_positions]) if key_positions else ""


class LayoutMismatch(Exception):
    """An output's strides under the channels-last weights differ from eager's in a way contiguous() with
    a memory format cannot give back."""


# Ops whose result depends on the memory layout of their input, not only on its values: with them in the
# graph the layout is not changed (a channels-last input would make them read other elements).
_LAYOUT_SENSITIVE = {"as_strided", "as_strided_", "as_strided_scatter", "as_strided_copy"}


def _layout_may_change(gm):
    """False where an op of the graph reads memory by strides (as_strided) or draws random numbers (a
    lowering that fails and runs again would draw twice)."""
    for n in gm.graph.nodes:
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and (
                n.target.overloadpacket.__name__ in _LAYOUT_SENSITIVE
                or torch.Tag.nondeterministic_seeded in n.target.tags):
            return False
    return True


def _cpu_conv2d_nodes(gm):
    """The graph's 2-d, not transposed convolutions on the CPU, with their weights' FX values."""
    for n in gm.graph.find_nodes(op="call_function", target=torch.ops.aten.convolution.default):
        w = n.args[1]
        transposed = n.args[6] if len(n.args) > 6 else False
        val = w.meta.get("val") if isinstance(w, torch.fx.Node) else None
        if isinstance(val, torch.Tensor) and not transposed and val.dim() == 4 and val.device.type == "cpu":
            yield n, w, val


def channels_last_weights(gm, frozen):
    """Positions of frozen inputs that are the weight of a 2-d convolution on the CPU (Note [Channels-last
    plans]: not for cuDNN), and the line explain prints (None where there is nothing to decide). None where
    the layout may not change (_layout_may_change) or where the cost model says it would not pay: the
    elements those convolutions write against those copied at the plan's edges (4-d inputs they read that
    are given at each call, 4-d outputs given eager's layout back); the weights are copied once
    (channels_last_estimate, src/cost/cost_model.h; TorchScript decides the same way, decide_channels_last
    in src/torch/capture.h)."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    position = {n: i for i, n in enumerate(placeholders)}
    convs = [(n, w) for n, w, _ in _cpu_conv2d_nodes(gm) if position.get(w) in frozen]
    if not convs or not _layout_may_change(gm):
        return set(), None
    written = sum(_value_numel(n) for n, _ in convs)
    times = [_conv_times(n) for n, _ in convs]
    timed = [t for t in times if t]
    estimated = sum(_value_numel(n) for (n, _), t in zip(convs, times) if not t)
    edges = 0
    inputs = set()
    for n, _ in convs:
        x = n.args[0]
        if x in position and position[x] not in frozen and x not in inputs and _value_dim(x) == 4:
            inputs.add(x)
            edges += _value_numel(x)
    edges += sum(_value_numel(o) for o in _outputs(gm) if _value_dim(o) == 4)
    gain_us, cost_us = _native.ops.channels_last_estimate(estimated if timed else written, 0, 0, edges)
    gain_us, gain = _layout_gain(gain_us, timed, len(convs), written, estimated)
    why = f"{gain}, cost {cost_us:.1f} us ({edges} copied at the edges; the weights copied once)"
    if gain_us <= cost_us:
        return set(), f"layout: NCHW kept, channels-last activations would not pay: {why}\n"
    return {position[w] for _, w in convs}, f"layout: channels-last activations: {why}\n"


def _layout_gain(estimate_us, timed, convs, written, estimated):
    """The channels-last layout's gain and its words for explain: the estimate over what was not timed plus,
    for the convolutions timed here, ATen's time on NCHW less oneDNN's on channels-last (as
    decide_channels_last in src/torch/capture.cpp)."""
    if not timed:
        return estimate_us, f"est. gain {estimate_us:.1f} us ({written} elements written by {convs} convolution(s))"
    aten, onednn = sum(t[0] for t in timed), sum(t[1] for t in timed)
    gain_us = estimate_us + aten - onednn
    others = f"; {estimated} elements written by the others, estimated" if len(timed) < convs else ""
    return gain_us, (f"gain {gain_us:.1f} us ({len(timed)} of {convs} convolution(s) timed here: ATen's on NCHW "
                     f"{aten:.1f} us, oneDNN's on channels-last {onednn:.1f} us{others})")


def _conv_times(n):
    """The conv probe's times of the convolution node `n` on this machine (Note [Convolutions timed on this
    machine], src/passes/conv_common.h): [ATen's on NCHW, oneDNN's on channels-last, oneDNN's on NCHW, the
    copy to NCHW] in microseconds, or None (FUSION_JIT_DISABLE names conv_timing, sizes or arguments that
    are not numbers, a dtype other than float32 and bfloat16, no oneDNN). Timed once per shape and process;
    the kernel cache keeps the times."""
    if "conv_timing" in _native.ops.option("FUSION_JIT_DISABLE").split(","):
        return None
    if len(n.args) != 9 or n.kwargs or n.args[6]:
        return None
    x, w, b = n.args[0], n.args[1], n.args[2]
    xv = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    wv = w.meta.get("val") if isinstance(w, torch.fx.Node) else None
    if not isinstance(xv, torch.Tensor) or not isinstance(wv, torch.Tensor) or xv.dim() != 4 or wv.dim() != 4:
        return None
    if xv.dtype not in (torch.float32, torch.bfloat16) or wv.dtype != xv.dtype:
        return None
    sizes = [_int_hint(d) for d in xv.shape] + [_int_hint(d) for d in wv.shape]
    numbers = [a for lst in n.args[3:6] for a in lst] + [n.args[8]]
    if not all(type(v) is int for v in numbers) or min(sizes) <= 0:
        return None
    t = _native.ops.conv_timing(sizes[:4], sizes[4:], list(n.args[3]), list(n.args[4]), list(n.args[5]), n.args[8],
                                xv.dtype == torch.bfloat16, b is not None)
    return list(t) or None




def _value_numel(node):
    """A FX node's tensor element count (at the example's sizes), or 0."""
    v = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return _numel_hint(v) if isinstance(v, torch.Tensor) else 0


def _value_dim(node):
    v = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return v.dim() if isinstance(v, torch.Tensor) else -1


def _outputs(gm):
    """The graph's distinct output nodes."""
    results = []
    for out in gm.graph.find_nodes(op="output"):
        map_aggregate(out.args[0], results.append)
    return [o for o in dict.fromkeys(results) if isinstance(o, torch.fx.Node)]


# Note [Channels-last activations]
# With default settings a convolution's weight is an input of each call, not a constant, so the plan
# cannot keep a channels-last copy of it (Note [Channels-last plans] does with freezing). Its input can
# still be made channels-last: oneDNN's convolution then writes its result channels-last, the ops after it
# keep that layout up to the next convolution, and outputs get eager's layout back (as with channels-last
# weights). Its weight is copied to channels-last by a kernel of the plan (aten::clone with that layout),
# as ATen's convolution would copy it inside each call otherwise (a weight must have its input's layout);
# the input's copy at the plan's edge is such a kernel too. Whether it pays is an estimate over the
# graph's CPU convolutions, gain against cost, each linear in what it counts:
# - gain: per element the convolutions write (oneDNN's channels-last kernels write faster);
# - cost: per weight element read and reordered by oneDNN's channels-last kernels on each call (slower
#   than its NCHW ones for large weights over small images), again per weight element that is not
#   channels-last already (copied on each call: a kh x kw > 1 kernel over more than one input channel per
#   group; 1x1 and depthwise weights are both layouts at once), and per element copied at the plan's
#   edges (4-d graph inputs read by a convolution, 4-d outputs given eager's layout back).
# A weight reordered once per content (_memo_conv; Note [Weights reordered once per content],
# src/torch/executor.h) costs nothing per call and is not copied, so its convolution counts no weight
# cost. The estimate is the cost model's (src/cost/cost_model.h: channels_last_estimate), whose constants
# for each term were measured on this project's machine (bench/RESULTS.md, "Channels-last activations").
# Inference graphs only: in training the forward's saved activations would be copied back to the layout
# the backward graph was traced with. explain prints the decision with both estimates;
# FUSION_JIT_DISABLE=channels_last keeps NCHW.


def _numel_hint(t):
    """A FX value's element count; for a dynamic shape, the one of the example that traced it."""
    return _int_hint(t.numel())


def _memo_conv(n, placeholders):
    """Whether the convolution node `n` of a channels-last plan takes its weight through a reorder kept
    across calls (Note [Weights reordered once per content], src/torch/executor.h): a float32 CPU weight
    that is a graph input (given at each call, not frozen), an input image of more than one pixel (over a
    1x1 image ATen's convolution on the plain weight was faster: efficientnet_b0's 32 squeeze-excite
    convolutions 0.79 against 1.49 ms; for symbolic sizes, at the sizes traced), a static weight, literal
    stride, padding, dilation and groups, and oneDNN in this build of torch."""
    if not torch.backends.mkldnn.is_available() or not torch.backends.mkldnn.enabled:
        return False
    if len(n.args) != 9 or n.kwargs or n.args[6]:
        return False
    x, w, b = n.args[0], n.args[1], n.args[2]
    if not isinstance(w, torch.fx.Node) or w not in placeholders:
        return False
    if b is not None and not isinstance(b, torch.fx.Node):
        return False
    xv, wv = x.meta.get("val") if isinstance(x, torch.fx.Node) else None, w.meta.get("val")
    bv = b.meta.get("val") if b is not None else None
    for t in (xv, wv) + ((bv,) if b is not None else ()):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.device.type != "cpu":
            return False
    if xv.dim() != 4 or wv.dim() != 4:
        return False
    numbers = list(wv.shape) + [a for lst in n.args[3:6] for a in lst] + [n.args[8]]
    if not all(type(v) is int for v in numbers):
        return False
    h, w_ = (_int_hint(d) for d in xv.shape[2:])
    return h * w_ > 1


def _int_hint(d):
    """A size as an int; a symbolic one's value in the example that traced it (0 where it has none)."""
    if isinstance(d, torch.SymInt):
        return int(d.node.hint) if d.node.has_hint() else 0
    return int(d)


def channels_last_activations(gm, memo_weights=False, frozen=()):
    """Default settings: the convolutions whose input the plan makes channels-last (Note [Channels-last
    activations]) and a line for explain saying what was decided and why; (set(), None) where the graph
    has no CPU 2-d convolution. `memo_weights`: the convolutions that _memo_conv takes cost nothing per
    weight element (Note [Weights reordered once per content], src/torch/executor.h); `frozen`: positions
    of inputs that are constants of the plan (not reordered through a memo)."""
    convs = list(_cpu_conv2d_nodes(gm))
    if not convs:
        return set(), None
    if not _layout_may_change(gm):
        return set(), "layout: NCHW kept (an op reads memory by strides or draws random numbers)\n"
    placeholders = set(gm.graph.find_nodes(op="placeholder"))
    graph_inputs = {p for i, p in enumerate(gm.graph.find_nodes(op="placeholder")) if i not in frozen}

    weights = copied = written = edges = memo = estimated = 0
    timed = []  # the probe's times of the convolutions timed (Note [Convolutions timed on this machine])
    inputs = set()
    for n, w, val in convs:
        written += _value_numel(n)
        t = _conv_times(n)
        if t:
            timed.append(t)
        else:
            estimated += _value_numel(n)
        # The input's copy at the plan's edge is paid whatever becomes of the weight (a weight reordered once
        # per content skipped it here, and a 256-channel image's copy went uncounted).
        x = n.args[0]
        if x in placeholders and x not in inputs:
            inputs.add(x)
            edges += _value_numel(x)
        if memo_weights and _memo_conv(n, graph_inputs):
            memo += 1
            continue
        weights += _numel_hint(val)
        if not val.is_contiguous(memory_format=torch.channels_last):
            copied += _numel_hint(val)
    edges += sum(_value_numel(o) for o in _outputs(gm) if _value_dim(o) == 4)
    gain_us, cost_us = _native.ops.channels_last_estimate(estimated if timed else written, weights, copied, edges)
    gain_us, gain = _layout_gain(gain_us, timed, len(convs), written, estimated)
    why = (f"{gain}, cost {cost_us:.1f} us ({weights} weight elements, {copied} of them copied per call, {edges} "
           f"copied at the edges{f'; {memo} weight(s) reordered once per content' if memo else ''})")
    if gain_us <= cost_us:
        return set(), f"layout: NCHW kept, channels-last activations would not pay: {why}\n"
    return {n for n, _, _ in convs}, f"layout: channels-last activations: {why}\n"


def _memory_format_of(t):
    if t.is_contiguous():
        return torch.contiguous_format
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return None


def _channels_last_copy(v, position, copies):
    """A frozen weight made channels-last, the same tensor for every lowering of the graph while the weight
    is unchanged (the same object, the same version counter): the C++ side then folds it once for all the
    signatures (Note [Folded constants shared across signatures], src/torch/executor.h), where a copy per
    lowering held a copy of every weight, and of what was folded from it, per input signature."""
    try:
        version = v._version
    except RuntimeError:  # an inference tensor has no version counter: not kept
        return v.contiguous(memory_format=torch.channels_last)
    kept = copies.get(position)
    if kept is not None and kept[0] is v and kept[1] == version:
        return kept[2]
    cl = v.contiguous(memory_format=torch.channels_last)
    copies[position] = (v, version, cl)
    return cl


def lower(gm, args, frozen=(), channels_last=(), channels_last_inputs=(), symbolic=False, copies=None,
          memo_weights=False):
    """Runs `gm` (an ATen-level FX GraphModule) on `args` and writes it as IR. The tensor arguments at the
    positions in `frozen` become constants of the plan instead of inputs; those in `channels_last` (frozen
    convolution weights) are made channels-last first, as is the input of each convolution node in
    `channels_last_inputs` (Note [Channels-last activations]); with either, every output is given eager's
    layout back. `symbolic`: also write the template of Note [Symbolic graphs] (low.template). `copies`: the channels-last copies of frozen weights kept between lowerings
    (_channels_last_copy), or None. `memo_weights`: those convolutions of `channels_last_inputs` that
    _memo_conv takes read their weight through a reorder the executor keeps across calls (Note [Weights
    reordered once per content], src/torch/executor.h). In a symbolic lowering the reorder's input size
    hint is this run's: a hint is not a promise (oneDNN's convolution reorders the weight again where its
    layout differs from the one it wants), and the batch sizes measured kept one layout."""
    relayout = bool(channels_last) or bool(channels_last_inputs)
    graph_inputs = set()  # placeholders lowered as tensor inputs of the plan
    marks = _symbolic.Marks() if symbolic else None
    low = Lowered()
    graph = gm.graph
    nodes = list(graph.nodes)
    last_use = {}
    for i, n in enumerate(nodes):
        for inp in n.all_input_nodes:
            last_use[inp] = i
    env = {}    # node -> its Python value in this run
    ref = {}    # node -> _Ref, a literal value, or a tuple/list of those (multi-output ops)
    lines = []
    inputs = []
    counter = [0]
    placeholders = 0
    converted = {}  # node -> (_Ref, tensor): its channels-last copy (channels_last_inputs)

    def new_name():
        counter[0] += 1
        return f"%{counter[0] - 1}"

    def ttype(t, what, meta):
        """tensor_type, with expressions for the symbolic numbers of `meta` (t's FX value)."""
        return tensor_type(t, what, marks.type_numbers(t, meta, what) if marks is not None else None)

    def number(x, r, arg_type, what):
        """The value `r` of FX node `x` (a number computed from sizes) as a literal, its expression if symbolic."""
        meta = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
        if marks is not None and isinstance(meta, (torch.SymInt, torch.SymFloat)) and meta.node.expr.free_symbols:
            kind = arg_type.kind() if arg_type is not None else ""
            if isinstance(meta, torch.SymInt) and isinstance(r, int) and not isinstance(r, bool) and kind != "FloatType":
                return marks.num(r, meta)
            marks.fail(f"{what}: {meta} is written as a {type(r).__name__}")
        return _literal_for(r, arg_type, what)

    def emit(outs, schema, arg_texts):
        lhs = ", ".join(f"{r.name} : {t}" for r, t in outs)
        lines.append(f"  {lhs} = {schema}({', '.join(arg_texts)})")

    def as_text(v, arg_type, what):
        """A FX argument as IR text: a value name, a list node, or a literal."""
        if isinstance(v, torch.fx.Node):
            r = ref[v]
            if isinstance(r, _Ref):
                return r.name
            if isinstance(r, (tuple, list)):
                raise Unsupported(f"{what}: a tuple value used whole")
            return number(v, r, arg_type, what)
        if isinstance(v, (list, tuple)) and any(
                isinstance(x, torch.fx.Node) and isinstance(ref[x], _Ref) for x in v):
            optional = "Optional[Tensor]" in str(arg_type) or any(x is None for x in v)
            items = []
            for x in v:
                if x is None:
                    items.append("None")
                elif isinstance(x, torch.fx.Node) and isinstance(ref[x], _Ref):
                    items.append(ref[x].name)
                else:
                    raise Unsupported(f"{what}: a list mixing tensors and {x!r}")
            r = _Ref(new_name())
            emit([(r, "Tensor?[]" if optional else "Tensor[]")], "prim::ListConstruct", items)
            return r.name
        if isinstance(v, (list, tuple)):
            if marks is not None and any(isinstance(x, torch.fx.Node) for x in v) and all(
                    isinstance(_resolve(x), int) and not isinstance(_resolve(x), bool) for x in v):
                return "[" + ", ".join(number(x, _resolve(x), None, what) for x in v) + "]"
            return _literal([_resolve(x) for x in v], what)
        if isinstance(v, torch.Tensor):
            raise Unsupported(f"{what}: a tensor argument that is not a graph value")
        return _literal_for(v, arg_type, what)

    def _resolve(x):
        if isinstance(x, torch.fx.Node):
            r = ref[x]
            if isinstance(r, _Ref):
                raise Unsupported(f"{x.name}: a tensor inside a list of numbers")
            return r
        return x

    def _literal_for(v, arg_type, what):
        # Python ints passed where the schema wants a float (aten.mul.Scalar(x, 2) takes Scalar, kept).
        kind = arg_type.kind() if arg_type is not None else ""
        if kind == "OptionalType":
            kind = arg_type.getElementType().kind()
        if kind == "FloatType" and isinstance(v, (int, torch.SymInt)) and not isinstance(v, bool):
            v = float(v)
        return _literal(v, what)

    for idx, node in enumerate(nodes):
        what = f"{node.name} ({node.target})" if node.op == "call_function" else node.name
        if node.op == "placeholder":
            position = placeholders
            placeholders += 1
            v = args[position]
            env[node] = v
            if isinstance(v, torch.Tensor) and position in frozen:
                if position in channels_last:
                    v = (v.contiguous(memory_format=torch.channels_last) if copies is None
                         else _channels_last_copy(v, position, copies))
                    env[node] = v
                r = _Ref(new_name())
                emit([(r, ttype(v, 'input ' + node.name, node.meta.get("val")))], "fj::constant",
                     [str(len(low.constants))])
                low.constants.append(v)
                ref[node] = r
            elif isinstance(v, torch.Tensor):
                graph_inputs.add(node)
                r = _Ref(new_name())
                inputs.append(f"{r.name} : {ttype(v, 'input ' + node.name, node.meta.get('val'))}")
                low.tensor_positions.append(position)
                ref[node] = r
            elif v is None or isinstance(v, (bool, int, float, torch.SymInt, torch.SymFloat)):
                low.key_positions.append(position)
                ref[node] = v
            else:
                raise Unsupported(f"input {node.name}: a {type(v).__name__} input is not supported")
        elif node.op == "get_attr":
            v = operator.attrgetter(node.target)(gm)
            env[node] = v
            if isinstance(v, torch.Tensor):
                r = _Ref(new_name())
                emit([(r, tensor_type(v, what))], "fj::constant", [str(len(low.constants))])
                low.constants.append(v)
                ref[node] = r
            else:
                ref[node] = v
        elif node.op == "call_function":
            if isinstance(node.target, torch._ops.OpOverload) and node.target._schema.is_mutable:
                # Checked before running it: a graph given up on is run again eagerly from the start.
                raise Unsupported(f"{what} mutates an argument")
            swapped = []
            memo = memo_weights and node in channels_last_inputs and _memo_conv(node, graph_inputs)
            if node in channels_last_inputs:
                # The input and, with default settings, the weight (Note [Channels-last activations]); a
                # weight reordered once per content is read as it is.
                for x in node.args[:1 if memo else 2]:
                    s = _channels_last_input(x, env, ref, converted, emit, new_name, ttype)
                    if s is not None:
                        swapped.append((x, s))
            fargs = map_aggregate(node.args, lambda a: env[a] if isinstance(a, torch.fx.Node) else a)
            fkwargs = map_aggregate(node.kwargs, lambda a: env[a] if isinstance(a, torch.fx.Node) else a)
            target = node.target
            try:
                v = target(*fargs, **fkwargs)
            except RuntimeError:
                # A view that the changed layout makes impossible: a copy reads the same values, and
                # where nothing else sees the result (no view of it, not returned) nothing else differs.
                if not (relayout and target is torch.ops.aten.view.default and _only_read(node)):
                    raise
                target = torch.ops.aten.reshape.default
                v = target(*fargs, **fkwargs)
            env[node] = v
            if target is operator.getitem:
                base = ref[node.args[0]]
                if isinstance(base, (tuple, list)):
                    ref[node] = base[node.args[1]]
                elif not isinstance(v, torch.Tensor):
                    ref[node] = v
                else:
                    raise Unsupported(f"{what}: indexing a tensor value")
            elif memo:
                ref[node] = _lower_memo_conv(node, v, what, env, ref, emit, new_name, ttype)
            elif isinstance(target, torch._ops.OpOverload):
                ref[node] = _lower_op(node, v, what, as_text, emit, new_name, target, ttype,
                                      lambda x: ref.get(x) if isinstance(x, torch.fx.Node) else x)
                for x, s in swapped:  # the input's other users read it as it was
                    env[x], ref[x] = s
            elif not isinstance(v, torch.Tensor) and not (
                    isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v)):
                ref[node] = v  # arithmetic on sizes (operator.mul on SymInts, math.ceil, ...)
            else:
                raise Unsupported(f"{what}: {getattr(target, '__name__', target)} is not an ATen op")
        elif node.op == "output":
            outs = node.args[0]
            flat = outs if isinstance(outs, (list, tuple)) else [outs]
            if relayout:
                _check_no_shared_outputs([env[o] for o in flat if isinstance(o, torch.fx.Node)])
            ir_outs = []
            results = []
            for o in flat:
                if isinstance(o, torch.fx.Node):
                    r = ref[o]
                    v = env[o]
                    if relayout and isinstance(r, _Ref):
                        r, v = _eager_layout(o, r, v, emit, new_name, ttype)
                    results.append(v)
                    if isinstance(r, _Ref):
                        low.outputs.append(("ir", len(ir_outs)))
                        ir_outs.append(r.name)
                    elif isinstance(r, (tuple, list)):
                        raise Unsupported(f"output {o.name}: a tuple value")
                    else:
                        meta = o.meta.get("val")
                        if marks is not None and isinstance(meta, torch.SymInt) and meta.node.expr.free_symbols:
                            marks.outputs[len(low.outputs)] = meta.node.expr
                        low.outputs.append(("const", r))
                else:
                    low.outputs.append(("const", o))
                    results.append(o)
            low.results = results
            lines.append(f"  return ({', '.join(ir_outs)})")
        else:
            raise Unsupported(f"{what}: FX op {node.op} is not supported")
        for inp in node.all_input_nodes:  # free intermediates of the lowering run
            if last_use.get(inp) == idx and inp.op == "call_function":
                env.pop(inp, None)
    low.ir = "graph(" + ", ".join(inputs) + "):\n" + "\n".join(lines) + "\n"
    low.key = specialization_key(args, low.key_positions)
    if marks is not None:
        try:
            low.template = _symbolic.make_template(gm, args, low, low.ir, marks, frozen)
        except _symbolic.NoTemplate as e:
            # The text has expressions that do not hold: lowered again with numbers, the random generators
            # left as this run left them (the results are this run's).
            with rng_kept():
                again = lower(gm, args, frozen, channels_last, channels_last_inputs, copies=copies,
                              memo_weights=memo_weights)
            again.results, again.no_template = low.results, str(e)
            return again
        low.ir = None  # the class's graph is the template's (add_from_class, add_at)
    return low


class rng_kept:
    """Restores the random generators' states on exit (CPU, and CUDA where it is initialized)."""

    def __enter__(self):
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None

    def __exit__(self, *exc):
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        return False


def _channels_last_input(x, env, ref, converted, emit, new_name, ttype):
    """Gives the FX node `x` (a convolution's input or weight) its channels-last copy for the convolution's
    lowering: emits aten::clone(x, channels_last), a kernel of the plan, once per node where `x` is not
    channels-last already. Returns what to restore after the convolution (None when nothing was swapped)."""
    v = env.get(x)
    r = ref.get(x)
    if not isinstance(v, torch.Tensor) or not isinstance(r, _Ref) or v.dim() != 4:
        return None
    if v.is_contiguous(memory_format=torch.channels_last):
        return None
    if x not in converted:
        cv = v.contiguous(memory_format=torch.channels_last)
        cr = _Ref(new_name())
        emit([(cr, ttype(cv, f"{x.name} made channels-last", x.meta.get("val")))], "aten::clone",
             [r.name, _literal(torch.channels_last, "")])
        converted[x] = (cr, cv)
    saved = (v, r)
    ref[x], env[x] = converted[x]
    return saved


def _lower_memo_conv(node, v, what, env, ref, emit, new_name, ttype):
    """A convolution that _memo_conv takes (its input made channels-last): mkldnn::_reorder_convolution_weight
    of the weight input, with the input size hint's batch by octave as the C++ rules give it (Note [Folded
    constants shared across signatures]), and mkldnn::_convolution_pointwise on its result, which the
    executor keeps across calls (Note [Weights reordered once per content], src/torch/executor.h)."""
    x, w, b = node.args[0], node.args[1], node.args[2]
    stride, padding, dilation, groups = list(node.args[3]), list(node.args[4]), list(node.args[5]), node.args[8]
    hint = list(env[x].shape)
    hint[0] = 1 << max(0, int(hint[0]) - 1).bit_length()  # size_octave (passes/conv_common.cpp)
    conv = [_literal(padding, what), _literal(stride, what), _literal(dilation, what), _literal(groups, what)]
    packed = _Ref(new_name())
    emit([(packed, ttype(env[w], f"{w.name} reordered", w.meta.get("val")))], "mkldnn::_reorder_convolution_weight",
         [ref[w].name] + conv + [_literal(hint, what)])
    out = _Ref(new_name())
    emit([(out, ttype(v, what, node.meta.get("val")))], "mkldnn::_convolution_pointwise",
         [ref[x].name, packed.name, ref[b].name if b is not None else "None"] + conv + ['"none"', "[]", "None"])
    return out


def _check_no_shared_outputs(values):
    """Outputs sharing storage (an activation and a view of it) would be parted by the copies that give
    each its eager layout back: such a graph is lowered as traced (LayoutMismatch)."""
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    for i, a in enumerate(tensors):
        for b in tensors[i + 1:]:
            if a is not b and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr():
                raise LayoutMismatch("outputs share storage")


def _eager_layout(node, r, v, emit, new_name, ttype):
    """An output computed under channels-last weights, with the layout eager gives it (its FX value's)."""
    want = node.meta.get("val")
    if not isinstance(want, torch.Tensor) or not isinstance(v, torch.Tensor):
        raise LayoutMismatch(f"output {node.name}: no eager layout recorded")
    same = all(a == b for a, b, n in zip(v.stride(), want.stride(), v.shape) if n != 1)
    if same:
        return r, v
    fmt = _memory_format_of(want)
    if fmt is None:
        raise LayoutMismatch(f"output {node.name}: eager's strides {tuple(want.stride())}")
    v = v.contiguous(memory_format=fmt)
    out = _Ref(new_name())
    emit([(out, ttype(v, f"output {node.name}", want))], "aten::contiguous", [r.name, _literal(fmt, "")])
    return out, v


def _is_number(x):
    return isinstance(x, (int, float, bool, torch.SymInt, torch.SymFloat))


def _bound_args(schema, node, what):
    """The node's arguments in schema order, defaults filled in."""
    out = []
    for i, a in enumerate(schema.arguments):
        if i < len(node.args):
            out.append(node.args[i])
        elif a.name in node.kwargs:
            out.append(node.kwargs[a.name])
        elif a.has_default_value():
            out.append(a.default_value)
        else:
            raise Unsupported(f"{what}: argument {a.name} is missing")
    return out


def _scalar_overload(op, args):
    """ATen graphs pass Python numbers for Tensor arguments (aten.mul.Tensor(x, 2): a wrapped number,
    promoted as a scalar). The overload of the same op taking a Scalar there (aten.mul.Scalar) means the
    same and is what the op table knows."""
    packet = op.overloadpacket
    for name in packet.overloads():
        cand = getattr(packet, name)
        sargs = cand._schema.arguments
        if cand is op or len(sargs) != len(op._schema.arguments):
            continue
        ok = True
        for a, b, x in zip(op._schema.arguments, sargs, args):
            if str(a.type) == "Tensor" and _is_number(x):
                ok &= b.type.kind() == "NumberType"
            else:
                ok &= str(a.type) == str(b.type)
        if ok:
            return cand
    return None


def _only_read(node):
    """Whether every user of `node` only reads it: ops that are not views, the graph's output excluded."""
    return all(u.op == "call_function" and isinstance(u.target, torch._ops.OpOverload) and not u.target.is_view
               for u in node.users)


def _lower_op(node, v, what, as_text, emit, new_name, op, ttype, value):
    schema = op._schema
    name0 = schema.name + ("." + schema.overload_name if schema.overload_name else "")
    args = _bound_args(schema, node, f"{node.name} ({name0})")
    # A number there: a literal, or a FX node computing one from sizes (x + x.shape[1]).
    numbers = [x if _is_number(x) else value(x) for x in args]
    if any(str(a.type) == "Tensor" and _is_number(x) for a, x in zip(schema.arguments, numbers)):
        op = _scalar_overload(op, numbers)
        if op is None:
            raise Unsupported(f"{node.name} ({name0}): a number where the schema wants a Tensor")
        schema = op._schema
    name = schema.name + ("." + schema.overload_name if schema.overload_name else "")
    what = f"{node.name} ({name})"
    if not isinstance(v, torch.Tensor) and not (isinstance(v, (list, tuple)) and any(
            isinstance(x, torch.Tensor) for x in v)):
        if name in _SIZE_OPS or v is None or isinstance(v, (list, tuple)):
            return v
        raise Unsupported(f"{what} returns a {type(v).__name__} computed from tensor data")
    texts = [as_text(x, a.type, f"{what}, argument {a.name}") for a, x in zip(schema.arguments, args)]
    returns_list = len(schema.returns) == 1 and str(schema.returns[0].type) in ("List[Tensor]", "Tensor[]")
    meta = node.meta.get("val")
    if isinstance(v, torch.Tensor):
        r = _Ref(new_name())
        emit([(r, ttype(v, what, meta))], name, texts)
        return r
    if returns_list:
        lst = _Ref(new_name())
        emit([(lst, "Tensor[]")], name, texts)
        refs = [_Ref(new_name()) for _ in v]
        metas = meta if isinstance(meta, (list, tuple)) and len(meta) == len(v) else [None] * len(v)
        emit([(r, ttype(t, what, m)) for r, t, m in zip(refs, v, metas)], "prim::ListUnpack", [lst.name])
        return list(refs)
    outs = []
    refs = []
    metas = meta if isinstance(meta, (list, tuple)) and len(meta) == len(v) else [None] * len(v)
    for t, m in zip(v, metas):
        r = _Ref(new_name())
        if isinstance(t, torch.Tensor):
            outs.append((r, ttype(t, what, m)))
            refs.append(r)
        elif t is None:
            outs.append((r, "None"))
            refs.append(None)
        else:
            raise Unsupported(f"{what} returns a {type(t).__name__} among its results")
    emit(outs, name, texts)
    return tuple(refs)
