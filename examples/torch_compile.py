"""torch.compile(model, backend="fusion_jit"): a torchvision ResNet-18 in inference and a training step of
a tiny GPT-2, each checked against eager and timed. Run by ./run demo; alone: ./run python
examples/torch_compile.py."""

import copy
import statistics
import sys
import time

import torch

import fusion_jit


def median_ms(fn, iters=10):
    fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)


def inference():
    import torchvision
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(1, 3, 224, 224)
    compiled = torch.compile(model, backend="fusion_jit")
    with torch.no_grad():
        t0 = time.perf_counter()
        compiled(x)
        first_s = time.perf_counter() - t0
        ok = torch.allclose(compiled(x), model(x), rtol=1e-4, atol=1e-4)
        eager, fused = median_ms(lambda: model(x)), median_ms(lambda: compiled(x))
    s = fusion_jit.stats()
    print(f"resnet18 inference: check {'pass' if ok else 'FAIL'}, eager {eager:.1f} ms, fusion_jit {fused:.1f} ms "
          f"({eager / fused:.2f}x), first call {first_s:.2f} s, {s['kernels']} kernels, "
          f"{s['fused_ops']} ops fused, {s['fallback_ops']} run by ATen")
    return ok


def training():
    import transformers as T
    torch.manual_seed(0)
    config = T.GPT2Config(vocab_size=1000, n_embd=64, n_layer=2, n_head=2, n_positions=64, resid_pdrop=0.0,
                          embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    model = T.GPT2LMHeadModel(config)
    eager = copy.deepcopy(model)
    tokens = torch.randint(0, 1000, (4, 32))

    def step(m):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        loss = m(tokens, labels=tokens).loss
        loss.backward()
        opt.step()
        return loss.item()

    fusion_jit.reset()
    loss_c = step(torch.compile(model, backend="fusion_jit"))
    loss_e = step(eager)
    worst = max((p - q).abs().max().item() for p, q in zip(model.parameters(), eager.parameters()))
    ok = abs(loss_c - loss_e) < 1e-4 and worst < 1e-4
    s = fusion_jit.stats()
    print(f"gpt2 (tiny) training step: check {'pass' if ok else 'FAIL'}, loss {loss_c:.5f} (eager {loss_e:.5f}), "
          f"largest parameter difference {worst:.1e}, {s['graphs']} graphs (forward and backward, across graph breaks), {s['kernels']} kernels")
    return ok


def main():
    print("\ntorch.compile(model, backend=\"fusion_jit\"):")
    ok = inference() & training()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
