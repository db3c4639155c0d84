"""OPTForCausalLM <-> DTransformer (hf/opt.py; the part V21 mlp="relu"; the position table's offset of 2 sliced in
the converter). OPT has no float32 step in a float64 model: nothing is patched. Its positions come from the
attention mask, so a left-padded HF batch equals ft's unpadded sequences (checked on the loss and every gradient)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import formal_transformers as ft  # noqa: E402
from conftest import rel_err  # noqa: E402
from hf_family_checks import (TOL64, assert_same_params, batched_equals_one_by_one, decoder_errors,  # noqa: E402
                              grad_errors, grads_as_ft, greedy_equals_hf, randomise, round_trips)

V, LMAX = 23, 16
X = [3, 14, 15, 9, 2, 6, 5, 3, 5, 8]


def opt(**kw):
    cfg = dict(vocab_size=V, hidden_size=16, ffn_dim=20, num_hidden_layers=2, num_attention_heads=4,
               max_position_embeddings=LMAX, dropout=0.0, attention_dropout=0.0, pad_token_id=1, bos_token_id=V - 2,
               eos_token_id=V - 1)
    cfg.update(kw)
    return randomise(transformers.OPTForCausalLM(transformers.OPTConfig(**cfg)).to(torch.float64), seed=3)


@pytest.mark.parametrize("kw", [dict(), dict(enable_bias=False, tie_word_embeddings=False)])
def test_P_and_every_gradient_equal_hugging_face(kw):
    hf = opt(**kw)
    m = ft.from_hf(hf)
    c = m.config
    assert (c["positional"], c["mlp"], c["norm"], c["bias"], c["tied"]) == ("learned", "relu", "layer",
                                                                             kw.get("enable_bias", True),
                                                                             kw.get("tie_word_embeddings", True))
    table = hf.model.decoder.embed_positions.weight.detach().numpy()
    assert np.array_equal(m.params["W_p"], table[2:].T)  # token t reads row t + 2
    e_P, e_loss, e_grad = decoder_errors(hf, m, X)
    assert max(e_P, e_loss, e_grad) <= TOL64, (e_P, e_loss, e_grad)


def test_a_left_padded_batch_equals_the_unpadded_sequences():
    """OPT numbers positions from the attention mask: left padding does not shift them."""
    hf = opt()
    m = ft.from_hf(hf)
    seqs = [[3, 14, 15, 9, 2, 6, 5], [4, 8, 2, 9], [7, 7, 0, 12, 5, 3]]
    l = max(map(len, seqs))
    ids = torch.full((3, l), 1, dtype=torch.long)  # pad_token_id
    mask = torch.zeros((3, l), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, l - len(s):], mask[b, l - len(s):] = torch.tensor(s), 1
    logits = hf(ids, attention_mask=mask).logits
    loss_hf = sum(torch.nn.functional.cross_entropy(logits[b, l - len(s):-1], ids[b, l - len(s) + 1:], reduction="sum")
                  for b, s in enumerate(seqs))
    hf.zero_grad()
    loss_hf.backward()
    for b, s in enumerate(seqs):
        want = torch.softmax(logits[b, l - len(s):], -1).detach().numpy().T
        assert rel_err(m(np.array(s)), want) <= TOL64
    loss, grads = m.loss_and_grad([np.array(s) for s in seqs])
    assert abs(loss - loss_hf.item()) <= TOL64 * abs(loss)
    assert grad_errors(grads, grads_as_ft(hf)) <= TOL64


def test_round_trips_are_exact(tmp_path):
    hf = opt(dropout=0.1, attention_dropout=0.05)
    m = ft.from_hf(hf)
    assert (m.config["resid_dropout"], m.config["attn_dropout"], m.config["embed_dropout"]) == (0.1, 0.05, 0.0)
    hf2 = round_trips(m, tmp_path)
    assert type(hf2).__name__ == "OPTForCausalLM"
    s1, s2 = hf.state_dict(), hf2.state_dict()
    assert set(s1) == set(s2)
    for k in s1:  # HF → ft → HF exact, but the two position rows no token reads (written as zeros)
        if k.endswith("embed_positions.weight"):
            assert torch.equal(s1[k][2:], s2[k][2:]) and not s2[k][:2].any()
        else:
            assert torch.equal(s1[k], s2[k]), k
    untied = ft.from_hf(opt(enable_bias=False, tie_word_embeddings=False))
    round_trips(untied, tmp_path / "untied")
    hf3 = ft.to_hf(ft.from_hf(opt()))
    assert decoder_errors(hf3, ft.from_hf(opt()), X)[0] <= TOL64


def test_greedy_generation_and_batched_decoding():
    hf = opt()
    m = ft.from_hf(hf)
    greedy_equals_hf(hf, m, [5, 17, 2, 9], 12)
    batched_equals_one_by_one(m, [[5, 17, 2, 9], [2], [4, 4, 8, 0, 3, 7, 1]], 6)


@pytest.mark.parametrize("kw,option", [
    (dict(word_embed_proj_dim=8), "word_embed_proj_dim"),
    (dict(do_layer_norm_before=False), "do_layer_norm_before"),
    (dict(activation_function="gelu"), "activation_function"),
    (dict(layer_norm_elementwise_affine=False), "layer_norm_elementwise_affine"),
    (dict(layerdrop=0.1), "layerdrop"),
])
def test_unsupported_options_are_named(kw, option):
    with pytest.raises(ValueError, match=option):
        ft.from_hf(opt(**kw))


def test_exports_refuse_what_opt_cannot_express():
    with pytest.raises(ValueError, match="positional"):
        ft.to_hf(ft.DTransformer(V, LMAX, 1, 2, 8, 12, mlp="relu", positional="sinusoidal"))
    with pytest.raises(ValueError, match="embed_dropout"):
        ft.to_hf(ft.DTransformer(V, LMAX, 1, 2, 8, 12, mlp="relu", embed_dropout=0.1))
    gpt = ft.DTransformer(V, LMAX, 1, 2, 8, 12)
    assert type(ft.to_hf(gpt)).__name__ == "GPT2LMHeadModel"  # the GELU MLP stays GPT-2's
    with pytest.raises(ValueError, match="mlp"):
        ft.to_hf(gpt, hf_class="OPTForCausalLM")


def test_load_hf_reads_save_pretrained(tmp_path):
    hf = opt()
    hf.save_pretrained(tmp_path)
    assert_same_params(ft.from_hf(hf), ft.load_hf(tmp_path))
