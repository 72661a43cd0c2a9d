"""Ahead-of-time packages (C++: fusion_jit/package.h; CLI: `fusion-jit package` and `fusion-jit load`).

    fusion_jit.package(model, (x,), "model.fjpkg")                 # one signature
    fusion_jit.package(model, [(x,), (x_long,)], "model.fjpkg")     # several
    served = fusion_jit.load_package("model.fjpkg")                 # no capture, no compiler, no cache
    y = served(x)                                                   # a tensor, or a tuple of them
    fusion_jit.package(model, (x,), "model.fjpkg", key_file="/etc/fusion_jit/package.key")  # signed
    served = fusion_jit.load_package("model.fjpkg", key_file="/etc/fusion_jit/package.key")  # verified

`model` is an nn.Module or a TorchScript module. An nn.Module takes the torch.compile backend's path for
inference graphs: per signature, torch.export (non-strict, in eval mode, no grad) gives its ATen graph, which
the backend's lowering writes as our IR with the parameters and buffers as constants (frozen); the result is
the model's output flattened to a tuple of tensors (a ModelOutput's tensors in order). A model whose export
fails (data-dependent control flow, a non-tensor output such as a transformers cache: set
config.use_cache=False) or that changes its buffers is refused with a ValueError naming the cause. A
TorchScript module is packaged through the TorchScript path (`fusion-jit package` does the same). Example inputs are tensors on the CPU, also for
a CUDA package (device="cuda"), which is built with no GPU and served with the same inputs on cuda:0. A loaded
package returns its plan's tensors: one tensor, or a tuple of them (a nested result is flattened). A call
whose inputs match no packaged signature is a ValueError naming the signature it got and those the
package serves; so is a package that is refused (another format, build or torch version, a damaged file,
native code for another CPU with no portable variant, a CUDA package where there is no GPU or none of its
binaries runs on it).

A package holds native code that loading runs, so an unsigned package is trusted code, as a shared library
is. With a package key (`key_file`, else the file FUSION_JIT_PACKAGE_KEY names: a regular file of this user
with mode 600, 16 to 4096 bytes, such as `openssl rand -hex 32`), `package` signs the package (HMAC-SHA256)
and `load_package` verifies it before anything of it is read, and refuses, with a ValueError naming the path
and the cause, a package that is not signed or whose signature does not verify (another key, or a change
after signing), as it refuses a key file that fails its check. Nothing of a refused package is loaded.
"""

import os
import tempfile

import torch

from . import _native  # noqa: F401 - loads the native library
from ._lowering import Unsupported, lower


def _signatures(example_inputs):
    if isinstance(example_inputs, torch.Tensor):
        return [(example_inputs,)]
    if isinstance(example_inputs, tuple):
        return [example_inputs]
    if isinstance(example_inputs, list) and example_inputs and all(isinstance(s, (tuple, list)) for s in example_inputs):
        return [tuple(s) for s in example_inputs]
    raise TypeError("package: example_inputs must be a tensor, a tuple of tensors (one signature) or a list of "
                    f"such tuples, not {type(example_inputs).__name__}")


def _first_line(e):
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _exported_graph(model, inputs, where):
    """`model`'s inference graph on `inputs` through torch.export, lowered as the backend lowers its FX
    graphs (Note [Freezing]: parameters, buffers and tensor constants are constants of the plan): the IR
    text and its constants."""
    from torch.export.graph_signature import InputKind, OutputKind

    try:
        with torch.no_grad():
            ep = torch.export.export(model, tuple(inputs), strict=False).run_decompositions({})
    except Exception as e:  # noqa: BLE001 - torch.export's errors are of many kinds
        raise ValueError(f"{where}: torch.export cannot capture the model: {_first_line(e)}") from e
    sig = ep.graph_signature
    for o in sig.output_specs:
        if o.kind != OutputKind.USER_OUTPUT:
            raise ValueError(f"{where}: the model changes its state ({o.kind.name.lower()} of {o.target}); a package "
                             f"holds inference graphs that change nothing but their outputs")
    args, frozen, user = [], set(), []
    given = iter(inputs)
    for i, spec in enumerate(sig.input_specs):
        if spec.kind == InputKind.USER_INPUT:
            args.append(next(given))
            user.append(i)
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            args.append(ep.state_dict[spec.target] if spec.target in ep.state_dict else ep.constants[spec.target])
            frozen.add(i)
        else:
            raise ValueError(f"{where}: graph input {spec.arg.name} is a {spec.kind.name.lower()}, which a package "
                             f"cannot hold")
    try:
        with torch.no_grad():
            low = lower(ep.graph_module, args, frozen)
    except Unsupported as e:
        raise ValueError(f"{where}: {e}") from e
    if low.tensor_positions != user:
        unused = sorted(set(user) - set(low.tensor_positions))
        raise ValueError(f"{where}: the model does not read input(s) {[user.index(i) for i in unused]}; a package's "
                         f"plan takes the inputs it reads")
    for k, (kind, value) in enumerate(low.outputs):
        if kind != "ir":
            raise ValueError(f"{where}: output {k} is {value!r}, not a tensor the graph computes; a package returns "
                             f"tensors")
    return low.ir, list(low.constants)


def _key_file(key_file, what):
    if key_file is None:
        return ""
    if not isinstance(key_file, (str, os.PathLike)):
        raise TypeError(f"{what}: key_file must be a path, not {type(key_file).__name__}")
    key_file = os.fspath(key_file)
    if not key_file:
        raise ValueError(f"{what}: key_file is empty; give None for FUSION_JIT_PACKAGE_KEY's key")
    return key_file


_INFO = ["signatures", "kernels", "sources", "bytes", "constant_bytes", "signed"]


def package(model, example_inputs, path, *, device="cpu", cuda_archs=None, cpu_variants=None, key_file=None):
    """Builds the package of `model` for each signature of `example_inputs` and writes it to `path`.

    device: where the plans run, "cpu" or "cuda" (cuda:0 of the loading machine). A CUDA package is built
    from the same CPU inputs with no GPU needed; it serves those inputs' signatures on cuda:0.
    cuda_archs: for "cuda", the architectures to compile CUBINs for (default ["sm_80", "sm_90"]); PTX for
    the newest is added unless a "compute_XY" is listed.
    cpu_variants: the CPU code's compiled variants, most specific first (default ["native", "x86-64-v2"]).
    key_file: the key file to sign the package with (default: the file FUSION_JIT_PACKAGE_KEY names; with
    neither, the package is not signed). A key file that fails its check is a ValueError, and nothing is
    written.
    Returns a dict: signatures, kernels, sources, bytes, constant_bytes, signed (bool).
    """
    key = _key_file(key_file, f"package {path}")
    signatures = _signatures(example_inputs)
    for i, sig in enumerate(signatures):
        for j, t in enumerate(sig):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"package: signature {i} input {j} is a {type(t).__name__}, not a tensor")
    if not isinstance(model, torch.jit.ScriptModule):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"package: model must be an nn.Module or a TorchScript module, not {type(model).__name__}")
        model = model.eval()
        irs, constants = [], []
        for i, sig in enumerate(signatures):
            described = ", ".join(f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}" for t in sig)
            ir, consts = _exported_graph(model, sig, f"package {path}: signature {i} ({described})")
            irs.append(ir)
            constants.append(consts)
        info = torch.ops.fusion_jit.package_graphs_file(
            type(model).__name__, [t for sig in signatures for t in sig], [len(s) for s in signatures], irs,
            [c for cs in constants for c in cs], [len(cs) for cs in constants], str(path), list(cpu_variants or []),
            str(device), list(cuda_archs or []), key)
        return _info(info)
    directory = os.path.dirname(os.path.abspath(path))
    fd, scripted = tempfile.mkstemp(suffix=".pt", dir=directory)
    os.close(fd)
    try:
        torch.jit.save(model, scripted)
        flat = [t for sig in signatures for t in sig]
        info = torch.ops.fusion_jit.package_file(scripted, flat, [len(s) for s in signatures], str(path),
                                                 list(cpu_variants or []), str(device), list(cuda_archs or []), key)
    finally:
        os.unlink(scripted)
    return _info(info)


def _info(info):
    out = dict(zip(_INFO, info))
    out["signed"] = bool(out["signed"])
    return out


class LoadedPackage:
    """A package loaded: call it with the inputs of one of its signatures."""

    def __init__(self, path, key_file=None):
        self._package = torch.classes.fusion_jit.Package(str(path), _key_file(key_file, str(path)))

    def __call__(self, *inputs):
        out = self._package.run(list(inputs))
        return out[0] if len(out) == 1 else tuple(out)

    def device(self):
        """Where the plans run and take their inputs: "cpu" or "cuda" (cuda:0)."""
        return self._package.device()

    def verified_with(self):
        """The key file its signature was verified with; "" when no package key was configured."""
        return self._package.verified_with()

    def signatures(self):
        return list(self._package.signatures())

    def explain(self):
        return self._package.explain()

    @property
    def load_ms(self):
        """Reading, checking and loading the package, its constants included (ms)."""
        return self._package.load_ms()

    @property
    def constants_ms(self):
        """Of load_ms, reading the constants (the weights) and prepacking them."""
        return self._package.constants_ms()

    @property
    def prepack_ms(self):
        """Of constants_ms, reordering weights into the layouts of this CPU's oneDNN and MKL kernels."""
        return self._package.prepack_ms()


def load_package(path, *, key_file=None):
    """Loads a package (no capture, no compiler, no cache directory); see LoadedPackage.

    key_file: the key file to verify its signature with (default: the file FUSION_JIT_PACKAGE_KEY names).
    With a key, a package that is not signed with it is refused before anything of it is loaded; with
    none, its signature is not checked (an unsigned package is trusted code, as a shared library is).
    """
    return LoadedPackage(path, key_file)
