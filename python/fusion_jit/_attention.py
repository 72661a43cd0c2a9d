"""attention.sdpa in training graphs: the rule of Note [Attention rule] (src/passes/attention_rules.cpp)
applied to the graph Dynamo hands the backend, before AOT autograd.

Note [Attention rule in training graphs]
The C++ rule rewrites inference graphs. In training, AOT autograd splits the model into a forward graph,
which keeps the probabilities for softmax's backward, and a backward graph of bmm and softmax gradients;
neither graph alone can become SDPA. So for a graph that will be differentiated (grad mode on and an
input that requires grad) the same pattern is matched on Dynamo's torch-level graph, written as
    matmul(q, k.transpose(-2, -1))  [* c | / c]  [+ mask | .masked_fill(m, -inf)]*  softmax(-1)
    [.to/.type(its own dtype)]  [dropout(p=0)]  matmul(., v)
(matmul: torch.matmul, the @ operator or bmm; the scale and adds also in place) and replaced by
torch.nn.functional.scaled_dot_product_attention(q, k, v, mask, 0.0, False, scale); AOT autograd then
traces SDPA's forward and its backward (the fused CPU kernel's _scaled_dot_product_flash_attention_for_cpu
and its _backward where ATen picks it). Conditions as the C++ rule's: q [B, H, T, D], k [B, H, S, D],
v [B, H, S, Dv] with the same batch dims, one floating dtype and device, the scores [B, H, T, S] and the
result of that dtype too (autocast's bfloat16 products around float32 scores decline); every
intermediate used once and not returned, v not computed from them; the scale a number applied before
the masks; each mask on q's device, broadcasting to [B, H, T, S], an added one of the scores' dtype and
not an in-place target of the scores; softmax over the last dim in the scores' dtype. Two more: no
mask that requires grad (T5's learned position bias: ATen's SDPA would then run its math form, the ops
as written, for its fused CPU kernel has no gradient for the mask), and dropout only with p = 0 (SDPA's
dropout draws other random numbers than eager's). Several masks are summed into one; a boolean
masked_fill(-inf) mask adds where(m, -inf, 0); a mask of fewer than 2 dims is made 2-d (SDPA's kernel
choice reads its size(-2)). SDPA's CPU result is a transposed view, so it is made contiguous as the
product's result is. Rows the masks remove entirely are NaN in eager's forward and 0 in SDPA's; the
rewrite fills NaN there as the C++ rule does (their gradients are then 0 where eager's are NaN; such a
row makes eager's loss NaN anyway). Where a candidate (a matmul fed by a softmax over 4-d scores) does
not match, the graph stays and explain says why; so it does where the matcher itself fails on a form it
did not foresee (FUSION_JIT_STRICT=1 raises instead). `FUSION_JIT_DISABLE=attention.sdpa` (or `attention`)
and the `disable` option turn it off, as for the C++ rule.
"""

import operator

import torch

_MATMUL = (torch.matmul, operator.matmul, torch.bmm)
_ADD = (operator.add, torch.add, operator.iadd)
_MUL = (operator.mul, torch.mul, operator.imul)
_DIV = (operator.truediv, torch.div, operator.itruediv)
_SOFTMAX = (torch.nn.functional.softmax, torch.softmax)
_DROPOUT = (torch.nn.functional.dropout,)


def _meta(n):
    v = n.meta.get("example_value") if isinstance(n, torch.fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _is_fn(n, targets, method=None):
    if not isinstance(n, torch.fx.Node):
        return False
    if n.op == "call_function" and n.target in targets:
        return True
    return method is not None and n.op == "call_method" and n.target == method


def _arg(n, i, name, default=None):
    """Argument `i` of a call node (positional index counting `self` for methods) or keyword `name`."""
    if len(n.args) > i:
        return n.args[i]
    return n.kwargs.get(name, default)


def _input(n):
    """The tensor operand of a call node, given by position or by keyword."""
    x = n.args[0] if n.args else n.kwargs.get("input", n.kwargs.get("self"))
    if not isinstance(x, torch.fx.Node):
        raise _Decline(f"{n.name} has no tensor operand the rule can read")
    return x


def _used_once(n):
    return len(n.users) == 1 and next(iter(n.users)).op != "output"


class _Decline(Exception):
    pass


class _NotAttention(Exception):
    """A softmax-weighted product that is not attention over [B, H, T, S] scores: skipped without a word."""


def _softmax_of(probs, nodes):
    """The softmax node `probs` comes from through same-dtype casts and dropout with p = 0; the nodes
    passed go to `nodes`."""
    n = probs
    while True:
        nodes.append(n)
        if not _used_once(n):
            raise _Decline("the probabilities are also used elsewhere")
        if _is_fn(n, _SOFTMAX, "softmax"):
            return n
        if _is_fn(n, _DROPOUT):
            p, training = _arg(n, 1, "p", 0.5), _arg(n, 2, "training", True)
            if training is not False and (not isinstance(p, (int, float)) or p != 0):
                raise _Decline(f"dropout with p = {p} between the softmax and the product (SDPA's dropout "
                               "draws other random numbers than eager's)")
        elif n.op == "call_method" and n.target in ("to", "type") and len(n.args) == 2 and not n.kwargs:
            src = _meta(n.args[0])
            if not isinstance(n.args[1], torch.dtype) or src is None or src.dtype != n.args[1]:
                raise _Decline("a cast of the probabilities to another dtype")
        else:
            raise _Decline(f"{n.target} between the softmax and the product")
        n = _input(n)


def _leads_to_product(x, depth=8):
    """Whether `x` is computed from a matmul through at most `depth` scale, add and masked_fill nodes."""
    while isinstance(x, torch.fx.Node) and depth > 0:
        depth -= 1
        if _is_fn(x, _MATMUL, "matmul"):
            return True
        if _is_fn(x, _ADD, "add") and len(x.args) == 2:
            return any(_leads_to_product(a, depth) for a in x.args)
        if _is_fn(x, _MUL + _DIV + (torch.masked_fill,)) or (
                x.op == "call_method" and x.target in ("mul", "div", "masked_fill")):
            x = next((a for a in x.args[:2] if isinstance(a, torch.fx.Node)), None)
            continue
        return False
    return False


def _number(c):
    return isinstance(c, (int, float)) and not isinstance(c, bool)


def _check_broadcast(mask, scores):
    try:
        fits = torch.broadcast_shapes(mask.shape, scores.shape) == scores.shape
    except RuntimeError:
        fits = False
    if not fits:
        raise _Decline(f"a mask of shape {list(mask.shape)} that does not broadcast to the scores' "
                       f"{list(scores.shape)}")


def _match(pv):
    """For the second product `pv` = matmul(probs, v): (q, k, v, scale, added masks, boolean masks, the
    pattern's nodes from `pv` up)."""
    probs, v = pv.args
    nodes = [pv]
    sm = _softmax_of(probs, nodes)
    s = _input(sm)
    dim = _arg(sm, 1, "dim")
    dtype = _arg(sm, 3 if sm.target is torch.nn.functional.softmax else 2, "dtype")
    scores = _meta(s)
    if scores is None or scores.dim() != 4:
        raise _NotAttention()
    if dim not in (-1, 3):
        raise _Decline(f"softmax over dim {dim}, not the last")
    if dtype is not None and dtype != scores.dtype:
        raise _Decline(f"softmax computes in {dtype}, the scores are {scores.dtype}")
    masks, bool_masks = [], []
    n = s
    while True:  # the masks, from the softmax up
        nodes.append(n)
        if not _used_once(n):
            raise _Decline("the scores are also used elsewhere")
        if _is_fn(n, _ADD, "add") and len(n.args) == 2 and not n.kwargs:
            a, b = n.args
            la, lb = _leads_to_product(a), _leads_to_product(b)
            if la == lb:
                raise _Decline("an addition whose operands cannot be told apart as scores and mask")
            if n.target is operator.iadd and not la:
                raise _Decline("an in-place addition of the scores into the mask")
            n, mask = (a, b) if la else (b, a)
            m = _meta(mask)
            if m is None or m.dtype != scores.dtype:
                raise _Decline("an added mask that is not a tensor of the scores' dtype")
            _check_broadcast(m, scores)
            if m.requires_grad:
                raise _Decline("an added mask that requires grad (a learned bias): ATen's SDPA would run its "
                               "math form, the same ops as written, since its fused CPU kernel has no gradient "
                               "for the mask")
            masks.append(mask)
        elif _is_fn(n, (torch.masked_fill,), "masked_fill") and len(n.args) == 3 and not n.kwargs:
            m = _meta(n.args[1])
            if m is None or m.dtype != torch.bool or n.args[2] != float("-inf"):
                raise _Decline("a masked_fill that is not a boolean mask filled with -inf")
            _check_broadcast(m, scores)
            bool_masks.append(n.args[1])
            n = n.args[0]
        else:
            nodes.pop()
            break
    scale = 1.0
    if _is_fn(n, _MUL, "mul") and len(n.args) == 2 and not n.kwargs:
        a, b = n.args
        if not (_number(a) or _number(b)):
            raise _Decline("a scale that is not a number")
        if not _used_once(n):
            raise _Decline("the scores are also used elsewhere")
        nodes.append(n)
        scale, n = (float(b), a) if _number(b) else (float(a), b)
    elif _is_fn(n, _DIV, "div") and len(n.args) == 2 and not n.kwargs:
        if not _number(n.args[1]) or n.args[1] == 0:
            raise _Decline("a scale that is not a nonzero number")
        if not _used_once(n):
            raise _Decline("the scores are also used elsewhere")
        nodes.append(n)
        scale, n = 1.0 / float(n.args[1]), n.args[0]
    if _is_fn(n, _ADD + (torch.masked_fill,), "add") or _is_fn(n, (), "masked_fill"):
        raise _Decline("a mask under the scale (SDPA scales the product alone)")
    if not _is_fn(n, _MATMUL, "matmul") or len(n.args) != 2 or not _used_once(n):
        raise _Decline("the scores are not q @ k^T (under a scale, then the masks) used once")
    kt = n.args[1]
    if not (_is_fn(kt, (torch.transpose,), "transpose") and len(kt.args) == 3 and _used_once(kt)
            and all(isinstance(d, int) for d in kt.args[1:]) and {d % 4 for d in kt.args[1:]} == {2, 3}):
        raise _Decline("the product's second operand is not k transposed over its last two dims")
    nodes += [n, kt]
    q, k = n.args[0], kt.args[0]
    tq, tk, tv = _meta(q), _meta(k), _meta(v)
    if any(t is None or t.dim() != 4 for t in (tq, tk, tv)):
        raise _Decline("q, k and v are not all 4-d")
    if not (tq.dtype == tk.dtype == tv.dtype and tq.dtype.is_floating_point):
        raise _Decline("q, k and v differ in dtype or are not floating")
    if not (tq.device == tk.device == tv.device):
        raise _Decline("q, k and v are on different devices")
    if not (tq.shape[:2] == tk.shape[:2] == tv.shape[:2] and tk.shape[2] == tv.shape[2]
            and tq.shape[3] == tk.shape[3]):
        raise _Decline(f"shapes q {list(tq.shape)}, k {list(tk.shape)}, v {list(tv.shape)} are not SDPA's")
    out = _meta(pv)
    if scores.shape != (*tq.shape[:3], tk.shape[2]) or scores.dtype != tq.dtype or out is None or out.dtype != tq.dtype:
        raise _Decline(f"scores {list(scores.shape)} {scores.dtype} or the result are not those of q and k "
                       "(a broadcast, or a cast such as autocast's)")
    if any(_meta(m).device != tq.device for m in masks + bool_masks):
        raise _Decline("a mask on another device than q")
    if v in nodes:
        raise _Decline("v is computed from the probabilities")
    return q, k, v, scale, masks, bool_masks, nodes


def rewrite(gm, record=None, strict=False):
    """Note [Attention rule in training graphs]: returns the number of attentions rewritten; `record`
    (explain's list) gets a line for each rewrite and each declined candidate; `strict` raises where the
    matcher itself fails."""
    g = gm.graph
    fired, lines = 0, []
    for pv in list(g.nodes):
        if not _is_fn(pv, _MATMUL, "matmul") or len(pv.args) != 2 or pv.kwargs:
            continue
        # a candidate: a matmul whose first operand comes from a softmax within a few nodes
        probs = pv.args[0]
        for _ in range(4):
            if not isinstance(probs, torch.fx.Node) or _is_fn(probs, _SOFTMAX, "softmax"):
                break
            probs = probs.args[0] if probs.args else None
        if not _is_fn(probs, _SOFTMAX, "softmax"):
            continue
        try:
            q, k, v, scale, masks, bool_masks, nodes = _match(pv)
        except _NotAttention:
            continue
        except _Decline as e:
            lines.append(f"declined: attention.sdpa at {pv.name}: {e}")
            continue
        except Exception as e:  # a graph form the matcher did not foresee: leave it as written
            if strict:
                raise
            lines.append(f"declined: attention.sdpa at {pv.name}: the matcher failed ({type(e).__name__}: {e})")
            continue
        dtype = _meta(q).dtype
        with g.inserting_before(pv):
            mask = None
            for m in masks + bool_masks:
                if m in bool_masks:
                    m = g.call_method("to", (g.call_function(torch.where, (m, float("-inf"), 0.0)), dtype))
                mask = m if mask is None else g.call_function(operator.add, (mask, m))
            rank = max((_meta(m).dim() for m in masks + bool_masks), default=2)
            if rank < 2:  # SDPA takes a mask of at least 2 dims (its kernel choice reads size(-2))
                mask = g.call_function(torch.atleast_2d, (mask,))
            out = g.call_function(torch.nn.functional.scaled_dot_product_attention, (q, k, v),
                                  {"attn_mask": mask, "dropout_p": 0.0, "is_causal": False, "scale": scale})
            # SDPA's CPU kernel returns a transposed view ([B, T, H, Dv] in memory); the product's result
            # is contiguous, and later views of it may depend on that
            out = g.call_method("contiguous", (out,))
            if mask is not None:
                top = g.call_method("amax", (mask, -1), {"keepdim": True})
                dead = g.call_function(operator.eq, (top, float("-inf")))
                out = g.call_function(torch.where, (dead, float("nan"), out))
        pv.replace_all_uses_with(out)
        for n in nodes:  # the pattern's nodes, each used once by the one before it
            g.erase_node(n)
        fired += 1
        n_masks = len(masks) + len(bool_masks)
        lines.append(f"attention.sdpa at {pv.name}: softmax(q @ k^T * {scale:g}"
                     f"{f' + {n_masks} mask(s)' if n_masks else ''}) @ v as scaled_dot_product_attention, before "
                     "AOT autograd (its backward is SDPA's)")
    if fired:
        g.lint()
        gm.recompile()
    if record is not None and lines:
        record.append(("torch graph (training)", f"rules: attention.sdpa x{fired}\n" + "\n".join(lines) + "\n"))
    return fired
