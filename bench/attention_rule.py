"""The attention rule on Hugging Face models with written-out attention (attn_implementation="eager",
tests/python/test_attention.py's one-layer models): eager against fusion_jit with freezing, with
attention.sdpa on and off (FUSION_JIT_DISABLE=attention.sdpa), each setting in its own process, twice,
alternating; the ratio is to eager measured in the same process (3 rounds of 30 calls, median).
With --train, a training step instead (forward and backward of the summed output, default settings: the
rule then applies before AOT autograd, Note [Attention rule in training graphs]).

    ./run python bench/attention_rule.py MODEL [SEQ] [--train]   MODEL: bert, gpt2, llama, t5; SEQ default 128
"""

import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def child(name, seq, train):
    import torch
    sys.path.insert(0, os.path.join(HERE, "..", "python"))
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
    import fusion_jit  # noqa: F401  (registers the backend)
    from test_attention import _model

    torch.manual_seed(0)
    model = _model(name).train(train)
    ids = torch.randint(0, 1000, (2, seq))
    mask = torch.ones(2, seq, dtype=torch.long)
    mask[1, seq * 3 // 4:] = 0
    compiled = torch.compile(model, backend="fusion_jit", options={"freezing": not train})

    def step(m):
        out = m(input_ids=ids, attention_mask=mask).last_hidden_state
        if train:
            out.sum().backward()

    def median_ms(f):
        f()
        ts = []
        for _ in range(30):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts) * 1e3

    with torch.set_grad_enabled(train):
        step(compiled)
        rounds = {"eager": [], "fusion_jit": []}
        for _ in range(3):
            rounds["eager"].append(median_ms(lambda: step(model)))
            rounds["fusion_jit"].append(median_ms(lambda: step(compiled)))
    print(json.dumps({k: statistics.median(v) for k, v in rounds.items()}))


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("bert", "gpt2", "llama", "t5"):
        sys.exit(__doc__)
    name = sys.argv[1]
    numbers = [a for a in sys.argv[2:] if not a.startswith("--")]
    seq = int(numbers[0]) if numbers else 128
    train = "--train" in sys.argv
    if "--child" in sys.argv:
        child(name, seq, train)
        return
    for setting in ("on", "off", "on", "off"):
        env = dict(os.environ)
        if setting == "off":
            env["FUSION_JIT_DISABLE"] = "attention.sdpa"
        r = subprocess.run([sys.executable, __file__, name, str(seq), "--child"] + ["--train"] * train, env=env,
                           capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(r.stderr[-3000:])
        d = json.loads(r.stdout.strip().splitlines()[-1])
        print(f"{name} seq {seq}{', training' if train else ''}, attention.sdpa {setting}: eager {d['eager']:.3f} ms, fusion_jit "
              f"{d['fusion_jit']:.3f} ms, {d['eager'] / d['fusion_jit']:.2f}x", flush=True)


if __name__ == "__main__":
    main()
