"""Symbolic graphs: one lowering of a dynamic FX graph serves every size Dynamo routes to it.

Note [Symbolic graphs]
Dynamo makes a dimension symbolic once it has taken a second value (or when asked: dynamic=True,
mark_dynamic); the graph it then hands over is called with every size of that dimension. Lowering
(_lowering.lower) runs the graph node by node on the call's inputs and writes IR text, about 15 ms for a
110-node language model: each new size paid it again, and ran the graph eagerly besides.

Every number of that text is also known symbolically: the FX nodes carry their values as fake tensors
whose sizes and strides, and the SymInts computed from them, are expressions over the graph's symbols
(s0, s1, ...). So a symbolic lowering writes each number that is such an expression as that expression
(`Marks`), and its text is the graph of the shape class, with a header naming the symbols' values at the
lowering's call ("graph[s0=37](...)", Template.class_ir): one typed symbolic capture. A call binds the
symbols from its inputs (a SymInt argument, or a tensor's size whose expression is the bare symbol). C++
builds the class graph's plan once, at the lowering's own call, and gives each later size of the class its
plan by evaluating it (GraphFunction::add_from_class, Note [Plans of a shape class], src/runtime/plan.h): no
text is written, parsed, optimized, fused or printed for it. A size outside the class (a guard its plan
took fails there), or every size where C++ refused the class, gets a plan of its own from the class's graph
concretized at its values in C++ (GraphFunction::add_at); such plans have their sizes as kernel arguments
(Note [Sizes as kernel arguments]), so their kernels are the compiled ones. Sizes the graph returns are
expressions too, evaluated by one Python function compiled from them (Template.instantiate).

Exactness:
- The template is kept only where every number the lowering run observed in a tensor type equals its
  expression evaluated at that call (static ones included), but for the strides of size-1 dims, which
  ATen leaves as it likes and no kernel reads; the literals computed from SymInts likewise. A number with
  an expression the evaluator does not know (anything but integers, symbols, +, *, integer powers, floor
  division, modulo, min, max), a SymFloat, or a symbol no input gives, and there is no template: the graph
  is lowered again with numbers (the random generators' states as after the first run), and each signature
  is lowered so (the reason at debug level).
- The types of an instance are derived, not observed: its plan is run once before it is added, each ATen
  step's results checked against the types (GraphFunction::add_from_class and add_at with outputs,
  run_plan's check_layouts); a mismatch drops the template, and that call and every later new signature of
  the graph are lowered. The inputs' types are checked as for any graph: an input laid out otherwise than
  the class says (a transposed view) is lowered, the template kept.
- A tensor the lowering makes channels-last (Note [Channels-last plans]: frozen conv weights and what
  follows them, or Note [Channels-last activations]) where the graph's fake value is not has the strides of
  that layout over the fake value's sizes; every other number as above, checked the same way.
- Graphs under dynamic_kernels="off" or with "symbolic" among the disable option's or FUSION_JIT_DISABLE's
  names keep no template.
"""

import torch


class NoTemplate(Exception):
    """The graph's lowering cannot be a template; the message says why."""


def _symint_expr(s):
    """The sympy expression of a SymInt, or None when it is a plain number."""
    if isinstance(s, torch.SymInt):
        e = s.node.expr
        return e if e.free_symbols else None
    return None


class Marks:
    """The symbolic numbers of one lowering: each a number the run observed, its expression (written in the
    text in its place), and whether the two must agree (`loose`: the stride of a size-1 dim). A number that
    cannot be an expression sets `failed` (the lowering goes on; its text is then not used)."""

    def __init__(self):
        self.values = []   # the run's numbers
        self.exprs = []    # sympy expressions
        self.loose = []
        self.outputs = {}  # index into the lowering's outputs -> expression (a size the graph returns)
        self.failed = None

    def fail(self, why):
        if self.failed is None:
            self.failed = why

    def num(self, concrete, meta, loose=False):
        """The int `concrete` as text: its expression when `meta` (its FX value) is a symbolic SymInt."""
        concrete = int(concrete)
        e = _symint_expr(meta)
        if e is None:
            if meta is not None and not loose and isinstance(meta, (int, torch.SymInt)) and int(meta) != concrete:
                self.fail(f"the run's {concrete} is {int(meta)} in the graph's fake values")
            return str(concrete)
        try:
            text = _ir_expr(e)
        except NoTemplate as why:
            self.fail(str(why))
            return str(concrete)
        self.values.append(concrete)
        self.exprs.append(e)
        self.loose.append(loose)
        return text

    def type_numbers(self, t, meta, what):
        """(sizes, strides) of tensor `t` as text, expressions where `meta` (its fake value) is symbolic."""
        if not isinstance(meta, torch.Tensor) or meta.dim() != t.dim():
            self.fail(f"{what}: no fake value of rank {t.dim()}")
            return None
        sizes = [self.num(s, m) for s, m in zip(t.shape, meta.shape)]
        meta_strides = meta.stride()
        if (t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()
                and not meta.is_contiguous(memory_format=torch.channels_last)):
            # Made channels-last by the lowering (Note [Channels-last plans]) where the graph's value is not:
            # its strides are those of that layout over the fake value's sizes.
            _, c, h, w = meta.shape
            meta_strides = (c * h * w, 1, w * c, c)
        strides = [self.num(s, m, loose=(n == 1 or t.numel() == 0))
                   for s, m, n in zip(t.stride(), meta_strides, t.shape)]
        return ",".join(sizes), ",".join(strides)


def _expr_text(e, symbol):
    """Sympy expression `e` as text that Python and the IR's size syntax (src/ir/sym.h) both read the same:
    integers, symbols (as `symbol` writes them), + * // %, integer powers as products, min and max of two.
    NoTemplate for anything else."""
    if e.is_Integer:
        return str(int(e))
    if e.is_Number:
        raise NoTemplate(f"{e} is not an integer")
    if e.is_Symbol:
        return symbol(e)
    name = type(e).__name__
    args = [_expr_text(a, symbol) for a in e.args]
    if name == "Add":
        return "(" + " + ".join(args) + ")"
    if name == "Mul":
        return "(" + " * ".join(args) + ")"
    if name == "Pow" and e.args[1].is_Integer and int(e.args[1]) >= 0:
        return "(" + " * ".join([args[0]] * int(e.args[1])) + ")" if int(e.args[1]) else "1"
    if name in ("FloorDiv", "CleanDiv") and len(args) == 2:
        return f"({args[0]} // {args[1]})"
    if name in ("Mod", "PythonMod") and len(args) == 2:
        return f"({args[0]} % {args[1]})"
    if name == "ModularIndexing" and len(args) == 3:
        return f"(({args[0]} // {args[1]}) % {args[2]})"
    if name in ("Max", "Min") and args:
        out = args[0]
        for a in args[1:]:
            out = f"{name.lower()}({out}, {a})"
        return out
    raise NoTemplate(f"expression {e} ({name}) is not evaluated")


def _source(e, index):
    """Python source computing sympy expression `e`, symbols read from the tuple `v` by `index`."""
    def symbol(s):
        if s not in index:
            raise NoTemplate(f"symbol {s} is given by no input")
        return f"v[{index[s]}]"
    return _expr_text(e, symbol)


def _ir_expr(e):
    """Sympy expression `e` in the IR's size syntax, symbols by name."""
    return _expr_text(e, str)


class Template:
    """The graph of a symbolic graph's shape class, as its lowering wrote it (Note [Symbolic graphs])."""

    def __init__(self, class_ir, numbers, sources, outputs, constants, positions):
        self.class_ir = class_ir                # the class's graph; "graph[s0=37](...)"
        self.numbers = numbers                  # how many numbers of it are expressions (explain)
        self.sources = sources                  # symbol -> [("arg", i) | ("size", i, d)]
        self.symbols = list(sources)
        self.outputs = outputs                  # the lowering's output spec; ("sym", k): the k-th returned size
        self.constants = constants
        self.positions = positions
        self.evaluate = None                    # symbols' values -> the returned sizes (_compile)
        # Why C++ refused the class's plan: each signature then gets a plan of its own from the class's
        # graph at its values (GraphFunction::add_at).
        self.no_class = None

    def bind(self, args):
        """The symbols' values at this call, or None where two inputs give one symbol two values."""
        values = []
        for s in self.symbols:
            got = None
            for src in self.sources[s]:
                x = int(args[src[1]]) if src[0] == "arg" else int(args[src[1]].shape[src[2]])
                if got is not None and x != got:
                    return None
                got = x
            values.append(got)
        return tuple(values)

    def instantiate(self, args):
        """(output spec, {symbol: value}) at this call's sizes; None where the inputs bind no values."""
        v = self.bind(args)
        if v is None:
            return None
        sizes = self.evaluate(v)
        spec = [("const", sizes[k[1]]) if k[0] == "sym" else k for k in self.outputs]
        return spec, dict(zip(self.symbols, v))

    def drop_class(self, why):
        self.no_class = why

    def describe_sources(self):
        """Where each symbol comes from: "s0 = input 1 dim 1"."""
        def where(src):
            return f"argument {src[1]}" if src[0] == "arg" else f"argument {src[1]} dim {src[2]}"
        return ", ".join(f"{s} = " + " = ".join(where(src) for src in self.sources[s]) for s in self.symbols)

    def describe(self, values):
        return ", ".join(f"{s}={x}" for s, x in values.items())


def _compile(exprs, index):
    """One Python function: the symbols' values (a tuple, ordered by `index`) -> each expression's value."""
    code = "lambda v: (" + "".join(_source(e, index) + ", " for e in exprs) + ")"
    return eval(code, {"max": max, "min": min})  # noqa: S307 - built from sympy nodes (_expr_text)


def symbol_sources(gm, frozen):
    """symbol -> where a call gives its value: SymInt inputs and input tensors' sizes whose expression is
    that symbol alone."""
    sources = {}
    for i, node in enumerate(gm.graph.find_nodes(op="placeholder")):
        meta = node.meta.get("val")
        if isinstance(meta, torch.SymInt):
            e = _symint_expr(meta)
            if e is not None and e.is_Symbol:
                sources.setdefault(e, []).append(("arg", i))
        elif isinstance(meta, torch.Tensor) and i not in frozen:
            for d, s in enumerate(meta.shape):
                e = _symint_expr(s)
                if e is not None and e.is_Symbol:
                    sources.setdefault(e, []).append(("size", i, d))
    return sources


def is_symbolic(gm):
    """Whether a placeholder of the graph has a symbolic size or is a symbolic number."""
    for node in gm.graph.find_nodes(op="placeholder"):
        meta = node.meta.get("val")
        if isinstance(meta, torch.SymInt) and _symint_expr(meta) is not None:
            return True
        if isinstance(meta, torch.Tensor) and any(_symint_expr(s) is not None for s in meta.shape):
            return True
    return False


def make_template(gm, args, low, text, marks, frozen):
    """The template of lowering `low` (its text written with `marks`'s expressions), checked against the run:
    every expression, evaluated at the symbols this call binds, is the number the run observed."""
    if marks.failed:
        raise NoTemplate(marks.failed)
    sources = symbol_sources(gm, frozen)
    outputs = []
    for k, o in enumerate(low.outputs):
        outputs.append(("sym", sum(1 for x in outputs if x[0] == "sym")) if k in marks.outputs else o)
    assert text.startswith("graph("), text[:20]
    t = Template(None, len(marks.exprs), sources, outputs, list(low.constants), list(low.tensor_positions))
    got = t.bind(args)
    if got is None:
        raise NoTemplate("the inputs give one symbol two values")
    index = {s: k for k, s in enumerate(t.symbols)}
    output_exprs = [marks.outputs[k] for k in sorted(marks.outputs)]
    nums = _compile(marks.exprs + output_exprs, index)(got)
    for k, (want, loose) in enumerate(zip(marks.values, marks.loose)):
        if not loose and nums[k] != want:
            raise NoTemplate(f"{marks.exprs[k]} is {nums[k]} at {t.describe(dict(zip(t.symbols, got)))}, but the "
                             f"run observed {want}")
    for k, i in enumerate(sorted(marks.outputs)):
        if nums[len(marks.exprs) + k] != low.outputs[i][1]:
            raise NoTemplate(f"output {i}: {marks.outputs[i]} is {nums[len(marks.exprs) + k]}, the run returned "
                             f"{low.outputs[i][1]}")
    t.evaluate = _compile(output_exprs, index)
    hints = ",".join(f"{s}={x}" for s, x in zip(t.symbols, got))
    t.class_ir = f"graph[{hints}](" + text[len("graph("):]
    return t
