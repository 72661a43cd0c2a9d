"""Regression tests of the fuzz findings of issue 13 that show through torch.compile(backend="fusion_jit").
The C++ twins are in tests/torch/fuzz_test.cpp (FuzzFindings.*)."""

import pytest
import torch

import fusion_jit


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    fusion_jit.reset()
    yield


@pytest.mark.parametrize("value", [7.0, 3.14, 0.1, -2.0])
def test_float16_addcdiv_is_eagers(value):
    # Dynamo rewrites addcdiv(value=v) into div, mul, add, each rounded to float16; eager computes it in
    # float in one kernel. Seed 8 with value 7 was 1 ulp (0.25 at 256) off before the backend restored it.
    def f(x, y, z):
        return torch.addcdiv(x, y, z, value=value)

    g = torch.compile(f, backend="fusion_jit", dynamic=False)
    for seed in range(12):
        torch.manual_seed(seed)
        x, y, z = (torch.randn(5, 5, dtype=torch.half) * 3 for _ in range(3))
        assert torch.equal(g(x, y, z), f(x, y, z)), f"seed {seed}"
    assert fusion_jit.stats()["eager_graphs"] == 0


def test_written_out_quotient_keeps_its_roundings():
    # The same three ops written by the user are not an addcdiv: eager rounds each to float16.
    def f(x, y, z):
        q = y / z
        return x + q * 7.0

    g = torch.compile(f, backend="fusion_jit", dynamic=False)
    torch.manual_seed(8)
    x, y, z = (torch.randn(5, 5, dtype=torch.half) * 3 for _ in range(3))
    assert torch.equal(g(x, y, z), f(x, y, z))
