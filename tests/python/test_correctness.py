"""Regression tests of wrong results through torch.compile(backend="fusion_jit") (issue 13), and many
threads calling one compiled function. Each failed before its fix; the C++ API's twins are in
tests/torch/serving_test.cpp."""

import threading

import pytest
import torch

import fusion_jit


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    fusion_jit.reset()
    yield


def test_random_draws_are_not_merged_and_follow_eager():
    def f(x):
        return torch.rand_like(x) - torch.rand_like(x) + x * 2

    x = torch.zeros(64)
    g = torch.compile(f, backend="fusion_jit")
    with torch.no_grad():
        g(x)  # compiles
        torch.manual_seed(1)
        expected = f(x)
        torch.manual_seed(1)
        got = g(x)
    assert got.abs().max() > 0, "rand_like(x) - rand_like(x) was merged into zeros"
    assert torch.equal(got, expected)
    assert fusion_jit.stats()["eager_graphs"] == 0


def test_random_draw_of_a_constant_is_not_folded():
    w = torch.ones(8)

    def f(x):
        return torch.randn_like(w) * 2 + x

    g = torch.compile(f, backend="fusion_jit")
    x = torch.zeros(8)
    with torch.no_grad():
        g(x)
        a, b = g(x).clone(), g(x)
    assert not torch.equal(a, b), "randn_like(constant) was folded into one value"


def test_folded_constant_output_is_new_at_every_call():
    def f(x):
        return x + 1, torch.tensor([1.0, 2.0]) * 2

    g = torch.compile(f, backend="fusion_jit")
    x = torch.zeros(2)
    with torch.no_grad():
        for call in range(3):
            a, b = g(x)
            assert torch.equal(b, torch.tensor([2.0, 4.0])), f"call {call}: {b}"
            b.mul_(100)
            a.add_(5)
    assert fusion_jit.stats()["eager_graphs"] == 0


def test_threads_share_one_compiled_function():
    def f(x, y):
        a = torch.relu(x) * y + 1
        return a.sum(1), torch.softmax(a, 1)

    g = torch.compile(f, backend="fusion_jit", dynamic=False)
    inputs = [(torch.randn(n, 16), torch.randn(n, 16)) for n in (4, 5, 6)]
    expected = [f(*i) for i in inputs]
    errors = []
    # dynamo's own compile is not thread-safe (a thread that recompiles sets FX's process-wide tracing
    # flag, and a call in another thread then raises): each thread makes its first calls one at a time,
    # then all call together.
    warm = threading.Lock()
    start = threading.Barrier(8)

    def worker(t):
        try:
            with torch.no_grad():
                with warm:
                    for i in inputs:
                        g(*i)
                start.wait()
                for k in range(30):
                    j = (t + k) % len(inputs)
                    for got, want in zip(g(*inputs[j]), expected[j]):
                        ok, err, why = torch.ops.fusion_jit.check_close(got, want, None)
                        if not ok:
                            errors.append(why)
        except Exception as e:  # noqa: BLE001 - a thread's exception fails the test
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    s = fusion_jit.stats()
    assert s["eager_calls"] == 0 and s["eager_graphs"] == 0, s
