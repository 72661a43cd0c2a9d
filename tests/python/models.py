"""The model families of the Python tests and of bench/models.py: built from code and configs (no weights
are downloaded), each with example inputs and how to pick its main output."""

import torch

IMAGE = 64  # test image size: small enough for 2 CPU cores, large enough for every network's downsampling


def _tv(name, **kw):
    import torchvision.models as m
    return getattr(m, name)(weights=None, **kw)


def _timm(name, **kw):
    import timm
    return timm.create_model(name, pretrained=False, **kw)


def _bert():
    import transformers as T
    return T.BertModel(T.BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                    intermediate_size=128, max_position_embeddings=128,
                                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))


def _gpt2():
    import transformers as T
    return T.GPT2LMHeadModel(T.GPT2Config(vocab_size=1000, n_embd=64, n_layer=2, n_head=2, n_positions=128,
                                          resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                          bos_token_id=0, eos_token_id=0))


def _llama():
    import transformers as T
    return T.LlamaForCausalLM(T.LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                            max_position_embeddings=128, bos_token_id=0, eos_token_id=0))


def image(batch=1, size=IMAGE):
    return (torch.randn(batch, 3, size, size),)


def tokens(batch=2, length=32):
    return (torch.randint(0, 1000, (batch, length)),)


# name -> (make the model, make the inputs (batch, size), family)
MODELS = {
    "resnet18": (lambda s: _tv("resnet18"), image),
    "mobilenet_v3_small": (lambda s: _tv("mobilenet_v3_small"), image),
    "efficientnet_b0": (lambda s: _tv("efficientnet_b0"), image),
    "convnext_tiny": (lambda s: _tv("convnext_tiny"), image),
    "vit_b_16": (lambda s: _tv("vit_b_16", image_size=s), image),
    "timm_regnetx_002": (lambda s: _timm("regnetx_002"), image),
    "timm_deit_tiny": (lambda s: _timm("deit_tiny_patch16_224", img_size=s), image),
    "bert_tiny": (lambda s: _bert(), tokens),
    "gpt2_tiny": (lambda s: _gpt2(), tokens),
    "llama_tiny": (lambda s: _llama(), tokens),
}

# Benchmarked (bench/models.py --models) but not part of the test suite's parametrization.
BENCH_MODELS = {
    "timm_ghostnet_100": (lambda s: _timm("ghostnet_100"), image),
}


def make(name, size=IMAGE, batch=None):
    """(model, inputs) with a fixed seed."""
    build, inputs = MODELS[name] if name in MODELS else BENCH_MODELS[name]
    torch.manual_seed(0)
    model = build(size)
    torch.manual_seed(1)
    if inputs is image:
        args = image(batch or 1, size)
    else:
        args = tokens(batch or 2)
    return model, args


def main_output(out):
    """The tensor a model's output is judged by (logits, last hidden state, or the tensor itself)."""
    if isinstance(out, torch.Tensor):
        return out
    for field in ("logits", "last_hidden_state"):
        if getattr(out, field, None) is not None:
            return getattr(out, field)
    return out[0]
