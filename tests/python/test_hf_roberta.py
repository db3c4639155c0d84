"""RobertaForMaskedLM / RobertaModel <-> ETransformer (hf/roberta.py: BERT's layers with padding-offset positions,
the position table's first pad_token_id + 1 rows sliced in the converter). RoBERTa has no float32 step in a
float64 model: nothing is patched. Its positions count the non-padding tokens, so a padded HF batch (left or right)
equals ft's unpadded sequences."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import formal_transformers as ft  # noqa: E402
from conftest import rel_err  # noqa: E402
from hf_family_checks import TOL64, assert_same_params, grad_errors, grads_as_ft, randomise, round_trips  # noqa: E402

V, LMAX, PAD = 23, 14, 1
LENGTHS = [7, 4, 6]


def roberta(cls_name="RobertaForMaskedLM", **kw):
    cfg = dict(vocab_size=V, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=12,
               max_position_embeddings=LMAX, type_vocab_size=1, layer_norm_eps=1e-7, hidden_dropout_prob=0.0,
               attention_probs_dropout_prob=0.0, pad_token_id=PAD, bos_token_id=0, eos_token_id=2)
    cfg.update(kw)
    return randomise(getattr(transformers, cls_name)(transformers.RobertaConfig(**cfg)).to(torch.float64), seed=4)


def batch(mask_token, seed=2):
    rng = np.random.default_rng(seed)
    x = [rng.integers(2, V - 3, n) for n in LENGTHS]  # real ids avoid the pad id (1)
    xt = [s.copy() for s in x]
    for s in xt:
        s[rng.choice(len(s), 2, replace=False)] = mask_token
    return x, xt


def padded(seqs, left):
    l = max(map(len, seqs))
    ids = torch.full((len(seqs), l), PAD, dtype=torch.long)
    mask = torch.zeros((len(seqs), l), dtype=torch.long)
    spans = []
    for b, s in enumerate(seqs):
        a = l - len(s) if left[b] else 0
        ids[b, a:a + len(s)], mask[b, a:a + len(s)] = torch.tensor(s), 1
        spans.append(slice(a, a + len(s)))
    return ids, mask, spans


def mlm_errors(hf, m, left=(False, True, False)):
    """(P's error, the hidden state's, the loss's, the worst gradient's) on a padded batch, some rows left-padded."""
    x, xt = batch(m.mask_token)
    ids, mask, spans = padded(xt, left)
    hf.zero_grad()
    out = hf(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    P, Hd = m(xt), m.hidden(xt)
    e_P = e_H = 0.0
    loss_hf = 0
    for b, sp in enumerate(spans):
        e_P = max(e_P, rel_err(P[b], torch.softmax(out.logits[b, sp], -1).detach().numpy().T))
        e_H = max(e_H, rel_err(Hd[b], out.hidden_states[-1][b, sp].detach().numpy().T))
        sel = torch.tensor(xt[b] == m.mask_token)
        loss_hf = loss_hf + torch.nn.functional.cross_entropy(out.logits[b, sp][sel], torch.tensor(x[b])[sel],
                                                              reduction="sum")
    loss_hf.backward()
    loss, grads = m.loss_and_grad(xt, x)
    return e_P, e_H, abs(loss - loss_hf.item()) / abs(loss_hf.item()), grad_errors(grads, grads_as_ft(hf))


@pytest.mark.parametrize("kw", [dict(), dict(tie_word_embeddings=False, type_vocab_size=2)])
def test_mlm_P_and_every_gradient_equal_hugging_face(kw):
    hf = roberta(**kw)
    m = ft.from_hf(hf)
    c = m.config
    assert (c["l_max"], c["n_segments"], c["embed_norm"], c["unembed_bias"]) == (LMAX - PAD - 1,
                                                                                 kw.get("type_vocab_size", 1), True, True)
    table = hf.roberta.embeddings.position_embeddings.weight.detach().numpy()
    assert np.array_equal(m.params["W_p"], table[PAD + 1:].T)  # token t reads row pad + 1 + t
    errs = mlm_errors(hf, m)
    assert max(errs) <= TOL64, errs


def test_roberta_model_hidden_state():
    hf = roberta("RobertaModel")
    m = ft.from_hf(hf)
    _, xt = batch(m.mask_token)
    ids, mask, spans = padded(xt, (True, False, True))
    h = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    for b, sp in enumerate(spans):
        assert rel_err(m.hidden(xt[b]), h[b, sp].detach().numpy().T) <= TOL64


def test_round_trips_are_exact(tmp_path):
    hf = roberta()
    m = ft.from_hf(hf)
    hf2 = round_trips(m, tmp_path, hf_class="RobertaForMaskedLM")
    assert type(hf2).__name__ == "RobertaForMaskedLM" and hf2.config.pad_token_id == PAD
    s1, s2 = hf.state_dict(), hf2.state_dict()
    assert set(s1) == set(s2)
    for k in s1:  # HF → ft → HF exact, but the position rows no token reads (written as zeros)
        if k.endswith("position_embeddings.weight"):
            assert torch.equal(s1[k][PAD + 1:], s2[k][PAD + 1:]) and not s2[k][:PAD + 1].any()
        else:
            assert torch.equal(s1[k], s2[k]), k
    assert max(mlm_errors(hf2, m)) <= TOL64  # the exported model computes ft's function
    assert type(ft.to_hf(m)).__name__ == "BertForMaskedLM"  # by default: BERT's class, the same function
    untied = ft.from_hf(roberta(tie_word_embeddings=False))
    round_trips(untied, tmp_path / "untied", hf_class="RobertaForMaskedLM")


def test_load_hf_reads_save_pretrained(tmp_path):
    for cls in ("RobertaForMaskedLM", "RobertaModel"):
        hf = roberta(cls)
        hf.save_pretrained(tmp_path / cls)
        assert_same_params(ft.from_hf(hf), ft.load_hf(tmp_path / cls))


def test_etraining_continues_training_roberta():
    m = ft.from_hf(roberta())
    before = {k: np.array(v) for k, v in m.params.items()}
    x, _ = batch(m.mask_token, seed=5)
    ft.ETraining(0, 1e-3, 0.3, max_steps=1, seed=0)(x, m)
    assert all(np.isfinite(v).all() for v in m.params.values())
    assert any(not np.array_equal(before[k], np.asarray(v)) for k, v in m.params.items())


@pytest.mark.parametrize("kw,option", [
    (dict(hidden_act="gelu_new"), "hidden_act"),
    (dict(max_position_embeddings=2), "max_position_embeddings"),
    (dict(is_decoder=True), "is_decoder"),
])
def test_unsupported_options_are_named(kw, option):
    with pytest.raises(ValueError, match=option):
        ft.from_hf(roberta(**kw))


def test_exports_refuse_what_roberta_cannot_express():
    e = ft.ETransformer(V, LMAX, 1, 2, 8, 12, 8, embed_norm=True, gelu="tanh")
    with pytest.raises(ValueError, match="gelu"):
        ft.to_hf(e, hf_class="RobertaForMaskedLM")
    exact = ft.ETransformer(V, LMAX, 1, 2, 8, 12, 8, embed_norm=True)
    with pytest.raises(ValueError, match="hf_class='RobertaModel'.*RobertaForMaskedLM"):
        ft.to_hf(exact, hf_class="RobertaModel")
    with pytest.raises(ValueError, match="hf_class must be one of"):
        ft.to_hf(exact, hf_class="RobertaForCausalLM")
    with pytest.raises(TypeError, match="hf_class must be a str"):
        ft.save_hf(exact, "unused", hf_class=object)
    with pytest.raises(ValueError, match="holds a DTransformer"):
        ft.save_hf(exact, "unused", hf_class="OPTForCausalLM")
