"""The package reads its FUSION_JIT_* variables through the C++ option table (issue 64 item 3):
torch.ops.fusion_jit.option parses them there (src/support/options.cpp), so their checks and error
messages are the table's, from Python as from C++. Each test changes the environment after the library
has taken its own snapshot (Options::get, at the first compile of the process), as these tests run in one
process: what they see is the package's own reading."""

import re

import pytest
import torch

import fusion_jit
from fusion_jit import _backend


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    for name in ("FUSION_JIT_DYNAMIC", "FUSION_JIT_DISABLE", "FUSION_JIT_STRICT", "FUSION_JIT_FREEZING",
                 "FUSION_JIT_CUDA_GRAPHS"):
        monkeypatch.delenv(name, raising=False)
    torch._dynamo.reset()
    fusion_jit.reset()
    # The library's snapshot of the environment taken now, before a test changes it.
    torch.compile(lambda x: x + 1, backend="fusion_jit")(torch.randn(3))
    torch._dynamo.reset()
    fusion_jit.reset()
    yield


def _f(x):
    return (x * 2).relu().sum(1)


def test_each_variable_the_package_reads_is_the_tables_parse(monkeypatch):
    option = torch.ops.fusion_jit.option
    assert [option(n) for n in ("FUSION_JIT_DYNAMIC", "FUSION_JIT_DISABLE", "FUSION_JIT_STRICT",
                                "FUSION_JIT_FREEZING", "FUSION_JIT_CUDA_GRAPHS")] == ["auto", "", "0", "0", "0"]
    opts = _backend.Options()
    assert not opts.freezing and not opts.cuda_graphs and not _backend._strict()
    assert _backend._dynamic_setting(opts) == "auto" and _backend._enabled("symbolic", opts)
    # Every spelling of a switch the table takes, and a list in any order with empty items.
    monkeypatch.setenv("FUSION_JIT_STRICT", "yes")
    monkeypatch.setenv("FUSION_JIT_FREEZING", "on")
    monkeypatch.setenv("FUSION_JIT_CUDA_GRAPHS", "true")
    monkeypatch.setenv("FUSION_JIT_DYNAMIC", "off")
    monkeypatch.setenv("FUSION_JIT_DISABLE", "weight_memo,,symbolic")
    assert option("FUSION_JIT_STRICT") == "1" and option("FUSION_JIT_DISABLE") == "symbolic,weight_memo"
    opts = _backend.Options()
    assert opts.freezing and opts.cuda_graphs and _backend._strict()
    assert _backend._dynamic_setting(opts) == "off"
    assert not _backend._enabled("symbolic", opts) and not _backend._enabled("symbolic.class", opts)
    assert _backend._enabled("channels_last", opts)
    # The backend's own options still take precedence over the environment.
    assert _backend._dynamic_setting(_backend.Options({"dynamic_kernels": "on"})) == "on"


def test_dynamic_off_from_the_environment_lowers_every_signature(monkeypatch):
    monkeypatch.setenv("FUSION_JIT_DYNAMIC", "off")
    compiled = torch.compile(_f, backend="fusion_jit", dynamic=True)
    for shape in [(4, 6), (6, 10), (2, 14)]:
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), _f(x))
    s = fusion_jit.stats()
    assert s["lowerings"] == 3 and s["symbolic_plans"] == 0, s


@pytest.mark.parametrize("value", ["sometimes", "OFF", " on"])
def test_an_invalid_dynamic_value_is_the_tables_error(monkeypatch, value):
    # The package read FUSION_JIT_DYNAMIC itself, lowercased and stripped; anything but "off" made symbolic
    # graphs, while the C++ side rejected the same value.
    monkeypatch.setenv("FUSION_JIT_DYNAMIC", value)
    message = re.escape(f"FUSION_JIT_DYNAMIC={value}: expected auto, on or off")
    with pytest.raises(ValueError, match=message):
        _backend._dynamic_setting(_backend.Options())
    compiled = torch.compile(_f, backend="fusion_jit", dynamic=True)
    with pytest.raises(Exception, match=message):
        compiled(torch.randn(4, 6))


def test_an_unknown_disable_name_is_the_tables_error(monkeypatch):
    # A misspelt name was ignored by the package's own reading: the rule it meant to turn off stayed on.
    monkeypatch.setenv("FUSION_JIT_DISABLE", "channels_last,symbolc")
    with pytest.raises(ValueError, match=r"FUSION_JIT_DISABLE: unknown item 'symbolc' \(known: .*symbolic"):
        _backend._enabled("symbolic", _backend.Options())


@pytest.mark.parametrize("name", ["FUSION_JIT_STRICT", "FUSION_JIT_FREEZING", "FUSION_JIT_CUDA_GRAPHS"])
def test_an_invalid_switch_is_the_tables_error(monkeypatch, name):
    monkeypatch.setenv(name, "maybe")
    with pytest.raises(ValueError, match=f"^{name}=maybe: expected 0 or 1$"):
        _backend._strict() if name == "FUSION_JIT_STRICT" else _backend.Options()


def test_names_outside_the_table(monkeypatch):
    with pytest.raises(ValueError, match="unknown environment variable FUSION_JIT_STRCT"):
        torch.ops.fusion_jit.option("FUSION_JIT_STRCT")
    # Read before the library loads (python/fusion_jit/_native.py), so not through the table.
    with pytest.raises(ValueError, match="FUSION_JIT_LIBRARY is read before the library loads"):
        torch.ops.fusion_jit.option("FUSION_JIT_LIBRARY")
