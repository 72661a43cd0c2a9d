"""The attention rule (Note [Attention rule]) on torch.compile's graphs: Hugging Face models with their
written-out ("eager") attention: softmax(q k^T scale + masks) v as AOT autograd spells it (bmm on views,
_softmax, dropout's clone), with BERT's padding mask, GPT-2's and Llama's causal masks, Llama's grouped
k and v, and T5's relative position bias plus padding mask. Each attention becomes one
scaled_dot_product_attention call, and the result is eager's by the accuracy rule of DESIGN.md."""

import copy

import pytest
import torch

import fusion_jit
from fusion_jit._backend import _Backend
from test_backend import assert_close


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    fusion_jit.reset()
    yield


def _model(name):
    import transformers as T
    kw = dict(attn_implementation="eager")
    if name == "bert":
        return T.BertModel(T.BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=128, max_position_embeddings=128, hidden_dropout_prob=0.0,
                                        attention_probs_dropout_prob=0.0, **kw))
    if name == "gpt2":
        return T.GPT2Model(T.GPT2Config(vocab_size=1000, n_embd=64, n_layer=1, n_head=2, n_positions=128,
                                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **kw))
    if name == "llama":
        return T.LlamaModel(T.LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                          **kw))
    return T.T5EncoderModel(T.T5Config(vocab_size=1000, d_model=64, d_kv=16, d_ff=128, num_layers=1, num_heads=4,
                                       dropout_rate=0.0, **kw))


@pytest.mark.parametrize("freezing", [False, True], ids=["default", "freezing"])
@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "t5"])
def test_hugging_face_eager_attention_is_one_sdpa_call(name, freezing):
    torch.manual_seed(0)
    model = _model(name).eval()
    model64 = copy.deepcopy(model).double()
    ids = torch.randint(0, 1000, (2, 24))
    mask = torch.ones(2, 24, dtype=torch.long)
    mask[1, 17:] = 0  # padding
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).last_hidden_state
        reference = model64(input_ids=ids, attention_mask=mask).last_hidden_state
        records = []
        compiled = torch.compile(model, backend=_Backend(fusion_jit.Options({"freezing": freezing}), records))
        compiled(input_ids=ids, attention_mask=mask)
        fused = compiled(input_ids=ids, attention_mask=mask).last_hidden_state
    text = "".join(t for _, t in records)
    assert "attention.sdpa x1" in text, text
    assert "aten::scaled_dot_product_attention" in text and "aten::bmm" not in text, text
    s = fusion_jit.stats()
    assert s["eager_graphs"] == 0 and s["eager_calls"] == 0, s
    assert_close(fused, expected, reference, f"{name} with eager attention")


def test_training_graphs_keep_the_written_out_attention_and_say_why():
    """In a training graph the forward keeps the probabilities for the backward (softmax's gradient needs
    them): the rule declines and explain says why; forward and gradients are eager's."""
    torch.manual_seed(0)
    model = _model("bert").train()
    ref = copy.deepcopy(model)
    ids = torch.randint(0, 1000, (2, 16))
    records = []
    compiled = torch.compile(model, backend=_Backend(fusion_jit.Options({}), records))
    out = compiled(input_ids=ids).last_hidden_state
    out.sum().backward()
    expected = ref(input_ids=ids).last_hidden_state
    expected.sum().backward()
    text = "".join(t for _, t in records)
    assert "declined: attention.sdpa at" in text and "the probabilities are also used elsewhere" in text, text
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-5, msg=name)
        else:  # the pooler, which last_hidden_state does not use: None in eager, None or zeros compiled
            assert p.grad is None or not p.grad.any(), name
