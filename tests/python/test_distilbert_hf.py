"""DistilBERT (hf/distilbert.py): DistilBertForMaskedLM / DistilBertModel -> ETransformer (Algorithm 9 without
segment embeddings, embed_norm, unembed_bias, eps 1e-12) with every weight random, float64: P, the hidden state and
the gradient of every parameter equal to Hugging Face's (≤ 1e-10, on a padded batch with attention_mask); the round
trips ft -> HF -> ft and through save_hf / load_hf exact; ETraining continues training a converted model; what
DistilBERT cannot express is refused by name. HF computes DistilBERT in the model's dtype throughout (nothing in
float32 inside a float64 model), so nothing is patched."""
import json
import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import formal_transformers as ft  # noqa: E402
from conftest import rel_err  # noqa: E402
from test_hf import _assert_loss_and_grads, _padded, _randomise  # noqa: E402

TOL64 = 1e-10
V, LMAX = 23, 12
LENGTHS = [7, 4, 6]


def _distilbert(cls_name="DistilBertForMaskedLM", dtype=torch.float64, **kw):
    cfg = dict(vocab_size=V, dim=8, n_layers=2, n_heads=2, hidden_dim=12, max_position_embeddings=LMAX, dropout=0.0,
               attention_dropout=0.0)
    cfg.update(kw)
    m = getattr(transformers, cls_name)(transformers.DistilBertConfig(**cfg)).to(dtype)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # every weight random, the norms' gains around 1
        for name, p in m.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype) * 0.3
            p.copy_(r + 1 if "norm.weight" in name.lower() else r)
    return m.eval()


def _mlm_batch(rng, mask_token):
    x = [rng.integers(1, V - 3, n) for n in LENGTHS]  # real ids avoid the pad id 0 (HF's padding_idx) and specials
    xt = [s.copy() for s in x]
    for s in xt:
        s[rng.choice(len(s), 2, replace=False)] = mask_token
    return x, xt


@pytest.mark.parametrize("kw", [dict(), dict(activation="gelu_new", tie_word_embeddings=False)])
def test_distilbert_mlm_P_and_every_gradient(kw):
    hf = _distilbert(**kw)
    model = ft.from_hf(hf)
    c = model.config
    assert (c["n_segments"], c["embed_norm"], c["unembed_bias"], c["eps"], c["tied"]) == \
        (0, True, True, 1e-12, kw.get("tie_word_embeddings", True))
    assert c["gelu"] == ("tanh" if kw else "exact")
    assert not any(k.endswith("W_s") for k in model.params)
    rng = np.random.default_rng(2)
    x, xt = _mlm_batch(rng, model.mask_token)
    ids, mask = _padded(xt)
    out = hf(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    P, Hd = model(xt), model.hidden(xt)
    loss_hf = 0
    for b in range(len(x)):
        n = len(x[b])
        assert rel_err(P[b], torch.softmax(out.logits[b, :n], -1).detach().numpy().T) <= TOL64
        assert rel_err(Hd[b], out.hidden_states[-1][b, :n].detach().numpy().T) <= TOL64
        m = torch.tensor(xt[b] == model.mask_token)
        loss_hf = loss_hf + torch.nn.functional.cross_entropy(out.logits[b, :n][m], torch.tensor(x[b])[m], reduction="sum")
    _assert_loss_and_grads(model, (xt, x), loss_hf, hf)


def test_distilbert_model_hidden_state_and_gradients():
    hf = _distilbert("DistilBertModel")
    model = ft.from_hf(hf)
    rng = np.random.default_rng(3)
    x, xt = _mlm_batch(rng, model.mask_token)
    ids, mask = _padded(xt)
    h = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    # DistilBertModel has no MLM head: lines 10–12 with the ft model's own head parameters, written in torch
    p = {k: torch.tensor(np.array(v), requires_grad=True) for k, v in model.params.items()
         if k in ("W_f", "b_f", "gamma", "beta", "b_u")}
    G = torch.nn.functional.gelu(h @ p["W_f"].T + p["b_f"])
    X = torch.nn.functional.layer_norm(G, (8,), p["gamma"], p["beta"], 1e-12)
    logits = X @ hf.embeddings.word_embeddings.weight.T + p["b_u"]
    Hd = model.hidden(xt)
    loss_hf = 0
    for b in range(len(x)):
        n = len(x[b])
        assert rel_err(Hd[b], h[b, :n].detach().numpy().T) <= TOL64
        m = torch.tensor(xt[b] == model.mask_token)
        loss_hf = loss_hf + torch.nn.functional.cross_entropy(logits[b, :n][m], torch.tensor(x[b])[m], reduction="sum")
    grads = _assert_loss_and_grads(model, (xt, x), loss_hf, hf, skip=p)
    for k, v in p.items():
        assert rel_err(grads[k], v.grad.numpy()) <= TOL64, k


def _same(a, b):
    assert list(a.params) == list(b.params) and a.config == b.config
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], b.params[k], err_msg=k)


@pytest.mark.parametrize("tied", [True, False])
def test_round_trips_are_exact(tmp_path, tied):
    hf = _distilbert(tie_word_embeddings=tied)
    model = ft.from_hf(hf)
    back = ft.to_hf(model)
    assert type(back).__name__ == "DistilBertForMaskedLM"
    assert (back.vocab_projector.weight is back.distilbert.embeddings.word_embeddings.weight) == tied
    sd, sd2 = hf.state_dict(), back.state_dict()
    assert set(sd) == set(sd2)
    for k in sd:
        assert torch.equal(sd[k], sd2[k]), k
    _same(model, ft.from_hf(back))
    ft.save_hf(model, tmp_path / "d")
    _same(model, ft.load_hf(tmp_path / "d"))
    auto = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "d").eval()
    assert type(auto).__name__ == "DistilBertForMaskedLM"
    x = np.array([3, 5, 7, 2, 9])
    P = torch.softmax(auto(torch.tensor(x)[None]).logits[0], -1).detach().numpy().T
    assert rel_err(model(x), P) <= TOL64
    # a native ETransformer with DistilBERT's choices exports as DistilBERT, one with segments as BERT
    native = ft.ETransformer(V, LMAX, 1, 2, 8, 12, 8, embed_norm=True, unembed_bias=True, eps=1e-12, dtype="float64")
    assert type(ft.to_hf(native)).__name__ == "DistilBertForMaskedLM"
    _same(native, ft.from_hf(ft.to_hf(native)))
    bert = ft.ETransformer(V, LMAX, 1, 2, 8, 12, 8, embed_norm=True, n_segments=2, eps=1e-12, dtype="float64")
    assert type(ft.to_hf(bert)).__name__ == "BertForMaskedLM"


def test_etraining_continues_training_a_converted_model():
    hf = _distilbert()
    model = ft.from_hf(hf)
    data = [np.array([3, 5, 7, 9, 11, 13]), np.array([4, 6, 8, 10, 12]), np.array([2, 4, 6, 8, 10, 12, 14])]
    tr = ft.ETraining(1, 0.05, p_mask=0.4, optimizer="sgd", batch_size=len(data), seed=3, progress=False)
    (masked,) = tr.drawn_masks(data, model)  # one step: the x̃ of each sequence, in plan order
    order = tr.plan(data)[0]["sequences"]
    xs = [data[i] for i in order]
    before = model.loss(masked, xs)
    tr(data, model)
    after = model.loss(masked, xs)
    assert np.isfinite(before) and after < before - 1e-3, (before, after)
    # the trained model is still DistilBERT: its export computes what it computes
    h = ft.to_hf(model)
    x = np.array([3, 5, 20, 9])
    assert rel_err(model(x), torch.softmax(h(torch.tensor(x)[None]).logits[0], -1).detach().numpy().T) <= TOL64


def test_what_distilbert_cannot_express_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="sinusoidal_pos_embds"):
        ft.from_hf(_distilbert(sinusoidal_pos_embds=True))
    with pytest.raises(ValueError, match="activation"):
        ft.from_hf(_distilbert(activation="relu"))
    native = dict(embed_norm=True, unembed_bias=True, eps=1e-12, dtype="float64")
    with pytest.raises(ValueError, match="resid_dropout"):
        ft.to_hf(ft.ETransformer(V, LMAX, 1, 2, 8, 12, 8, resid_dropout=0.1, **native))
    with pytest.raises(ValueError, match="d_f"):
        ft.to_hf(ft.ETransformer(V, LMAX, 1, 2, 8, 12, 6, **native))
    # a file: its config's sinusoidal_pos_embds refused by name before anything is built
    ft.save_hf(ft.ETransformer(V, LMAX, 1, 2, 8, 12, 8, **native), tmp_path / "ok")
    cfg = json.loads((tmp_path / "ok" / "config.json").read_text())
    (tmp_path / "ok" / "config.json").write_text(json.dumps({**cfg, "sinusoidal_pos_embds": True}))
    with pytest.raises(ValueError, match="sinusoidal_pos_embds"):
        ft.load_hf(tmp_path / "ok")


def test_a_float32_distilbert_is_float32_and_within_float32_rounding():
    hf = _distilbert(dtype=torch.float32)
    model = ft.from_hf(hf)
    assert model.config["dtype"] == "float32"
    x = np.array([5, 9, 2, 6, 5, 3])
    assert rel_err(model.logits(x), hf(torch.tensor(x)[None]).logits[0].detach().numpy().T) <= 1e-5
