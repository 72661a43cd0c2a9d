"""Ahead-of-time packages (C++: fusion_jit/package.h; CLI: `fusion-jit package` and `fusion-jit load`).

    fusion_jit.package(model, (x,), "model.fjpkg")                 # one signature
    fusion_jit.package(model, [(x,), (x_long,)], "model.fjpkg")     # several
    served = fusion_jit.load_package("model.fjpkg")                 # no capture, no compiler, no cache
    y = served(x)                                                   # a tensor, or a tuple of them

`model` is a TorchScript module, or an nn.Module, which is traced (torch.jit.trace, in eval mode, on the
first signature's inputs) and then packaged as TorchScript. Inputs are tensors on the CPU. A loaded
package returns its plan's tensors: one tensor, or a tuple of them (a nested result is flattened). A call
whose inputs match no packaged signature is a ValueError naming the signature it got and those the
package serves; so is a package that is refused (another format, build or torch version, a damaged file,
native code for another CPU with no portable variant).
"""

import os
import tempfile

import torch

from . import _native  # noqa: F401 - loads the native library


def _signatures(example_inputs):
    if isinstance(example_inputs, torch.Tensor):
        return [(example_inputs,)]
    if isinstance(example_inputs, tuple):
        return [example_inputs]
    if isinstance(example_inputs, list) and example_inputs and all(isinstance(s, (tuple, list)) for s in example_inputs):
        return [tuple(s) for s in example_inputs]
    raise TypeError("package: example_inputs must be a tensor, a tuple of tensors (one signature) or a list of "
                    f"such tuples, not {type(example_inputs).__name__}")


def package(model, example_inputs, path, *, cpu_variants=None):
    """Builds the package of `model` for each signature of `example_inputs` and writes it to `path`.

    cpu_variants: the CPU code's compiled variants, most specific first (default ["native", "x86-64-v2"]).
    Returns a dict: signatures, kernels, sources, bytes, constant_bytes.
    """
    signatures = _signatures(example_inputs)
    for i, sig in enumerate(signatures):
        for j, t in enumerate(sig):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"package: signature {i} input {j} is a {type(t).__name__}, not a tensor")
    if not isinstance(model, torch.jit.ScriptModule):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"package: model must be an nn.Module or a TorchScript module, not {type(model).__name__}")
        model = model.eval()
        with torch.no_grad():
            model = torch.jit.trace(model, signatures[0], check_trace=False, strict=False)
    directory = os.path.dirname(os.path.abspath(path))
    fd, scripted = tempfile.mkstemp(suffix=".pt", dir=directory)
    os.close(fd)
    try:
        torch.jit.save(model, scripted)
        flat = [t for sig in signatures for t in sig]
        info = torch.ops.fusion_jit.package_file(scripted, flat, [len(s) for s in signatures], str(path),
                                                 list(cpu_variants or []))
    finally:
        os.unlink(scripted)
    return dict(zip(["signatures", "kernels", "sources", "bytes", "constant_bytes"], info))


class LoadedPackage:
    """A package loaded: call it with the inputs of one of its signatures."""

    def __init__(self, path):
        self._package = torch.classes.fusion_jit.Package(str(path))

    def __call__(self, *inputs):
        out = self._package.run(list(inputs))
        return out[0] if len(out) == 1 else tuple(out)

    def signatures(self):
        return list(self._package.signatures())

    def explain(self):
        return self._package.explain()

    @property
    def load_ms(self):
        return self._package.load_ms()


def load_package(path):
    """Loads a package (no capture, no compiler, no cache directory); see LoadedPackage."""
    return LoadedPackage(path)
