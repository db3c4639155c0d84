"""BART (docs/variants.md V22; hf/bart.py): EDTransformer's BART options (embed_norm and separate_positions per stack,
scale_embedding, mlp="gelu", unembed_bias, forced_bos_id / forced_eos) against reference.bart_transformer (float64
≤ 1e-12, float32 ≤ 1e-5) and finite differences; ft.from_hf(BartForConditionalGeneration / BartModel) against
Hugging Face's model with every weight random, the final_logits_bias too (P ≤ 1e-12, every gradient ≤ 1e-10,
float64), the round trips ft -> HF -> ft and through save_hf / load_hf exact, and greedy EDInference equal to HF's
generate token for token (decoder_start_token_id, forced_bos_token_id, forced_eos_token_id). HF computes BART in
the model's dtype throughout (its LayerNorm, GELU and softmax in float64 for a float64 model): nothing is patched."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import formal_transformers as ft  # noqa: E402
from formal_transformers import reference as ref  # noqa: E402
from conftest import TOL, assert_grads_match_fd, randomize_theta, rel_err  # noqa: E402
from test_hf import _assert_loss_and_grads  # noqa: E402

V = 29
SIZES = dict(vocab_size=V, d_model=8, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
             decoder_attention_heads=2, encoder_ffn_dim=12, decoder_ffn_dim=12, max_position_embeddings=16, dropout=0.0,
             attention_dropout=0.0, activation_dropout=0.0)
# (activation_function, tie_word_embeddings, scale_embedding)
KINDS = [("gelu", True, False), ("relu", False, True), ("gelu", False, True)]
Z = np.array([3, 14, 15, 9, 26, 5, 3, 5, 8, 9, 7, 9, 3])  # no pad id (1): HF's padding_idx row has no gradient
X = np.array([2, 0, 27, 18, 28, 4, 5, 9, 0, 4, 5])        # from decoder_start_token_id 2


def _bart(act="gelu", tied=True, scale=False, cls="BartForConditionalGeneration", seed=0, **kw):
    config = transformers.MBartConfig if cls.startswith("MBart") else transformers.BartConfig
    cfg = config(**{**SIZES, "decoder_start_token_id": 2, **kw}, activation_function=act, tie_word_embeddings=tied,
                 scale_embedding=scale)
    torch.manual_seed(seed)
    hf = getattr(transformers, cls)(cfg).to(torch.float64)
    with torch.no_grad():  # every weight random: the norms' gains around 1, the final_logits_bias (a buffer) too
        for name, p in list(hf.named_parameters()) + [(n, b) for n, b in hf.named_buffers() if "logits_bias" in n]:
            if "norm" in name or "layernorm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name.endswith(("shared.weight", "lm_head.weight", "embed_positions.weight", "final_logits_bias")):
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    head = cls.endswith("ForConditionalGeneration")
    body = hf.model if head else hf
    if not tied:  # transformers 5 unties the stacks' embed_tokens too: BART's stacks share one embedding (fairseq's)
        body.encoder.embed_tokens.weight = body.shared.weight
        body.decoder.embed_tokens.weight = body.shared.weight
    if head:
        assert (hf.lm_head.weight is hf.model.shared.weight) == tied
    return hf.eval()


@pytest.mark.parametrize("act,tied,scale", KINDS)
@pytest.mark.parametrize("family", ["Bart", "MBart"])
def test_from_hf_probabilities_and_every_gradient_equal_hugging_face(family, act, tied, scale):
    hf = _bart(act, tied, scale, cls=family + "ForConditionalGeneration")
    model = ft.from_hf(hf)
    c = model.config
    pre = family == "MBart"  # mBART: the same parts with pre-norm layers and each stack's final norm (V18a)
    assert (c["mlp"], c["tied"], c["scale_embedding"], c["embed_norm"], c["separate_positions"], c["unembed_bias"]) == \
        (act, tied, scale, True, True, True)
    assert (c["block"] == "pre_ln", c["eps"], c["bos_id"], c["eos_id"], c["forced_eos"], c["l_max"]) == \
        (pre, 1e-5, 2, 2, True, 16)
    assert ("enc.gamma" in model.params) == pre
    z, x = torch.as_tensor(Z)[None], torch.as_tensor(X)[None]
    logits = hf(input_ids=z, decoder_input_ids=x).logits[0]
    P_hf = torch.softmax(logits, -1).detach().numpy().T
    assert rel_err(model(Z, X), P_hf) <= 1e-12
    theta = {k: np.array(v) for k, v in model.params.items()}
    P_ref = ref.bart_transformer(Z, X, theta, L_enc=2, L_dec=2, H=2, mlp=act, scale_embedding=scale, pre_norm=pre)
    assert rel_err(P_ref, P_hf) <= 1e-12
    loss_hf = torch.nn.functional.cross_entropy(logits[:-1], x[0, 1:], reduction="sum")
    # every parameter's gradient (HF's final_logits_bias is a buffer: b_u's gradient is Σ_t (P[:, t] − onehot))
    grads = _assert_loss_and_grads(model, (Z, X), loss_hf, hf, skip=("b_u",))
    Y = np.zeros_like(P_hf[:, :-1])
    Y[X[1:], np.arange(len(X) - 1)] = 1
    assert rel_err(grads["b_u"], (P_hf[:, :-1] - Y).sum(axis=1)) <= 1e-10


@pytest.mark.parametrize("cls", ["BartModel", "MBartModel"])
def test_bart_model_is_the_body_with_the_tied_unembedding(cls):
    hf = _bart(cls=cls, scale=True)
    model = ft.from_hf(hf)
    assert model.config["tied"] and not model.config["unembed_bias"] and "b_u" not in model.params
    h = hf(input_ids=torch.as_tensor(Z)[None], decoder_input_ids=torch.as_tensor(X)[None]).last_hidden_state[0]
    logits = h @ hf.shared.weight.T
    assert rel_err(model.logits(Z, X), logits.detach().numpy().T) <= 1e-12
    loss_hf = torch.nn.functional.cross_entropy(logits[:-1], torch.as_tensor(X[1:]), reduction="sum")
    _assert_loss_and_grads(model, (Z, X), loss_hf, hf)  # every gradient, through the tied unembedding


@pytest.mark.parametrize("forced_bos,cls", [(None, "Bart"), (0, "Bart"), (5, "MBart")])
def test_greedy_edinference_equals_hugging_face_generate(forced_bos, cls):
    hf = _bart("gelu", False, True, seed=1, cls=cls + "ForConditionalGeneration")
    hf.generation_config.forced_bos_token_id = forced_bos  # (transformers 5 keeps it in the generation config only)
    with torch.no_grad():  # eos (2) likelier, so that some decodings stop at it and some reach max_length
        hf.final_logits_bias[0, 2] += 2.5 if cls == "Bart" else 10.0  # (mBART's final norm: larger logits)
    model = ft.from_hf(hf)
    assert model.config["forced_bos_id"] == forced_bos and model.config["forced_eos"]
    stopped = capped = 0
    for s in range(6):
        z = np.random.default_rng(s).integers(3, V, size=4 + 2 * s)
        out = hf.generate(torch.as_tensor(z)[None], do_sample=False, num_beams=1, max_length=10)[0].numpy()
        for cache in (True, False):
            got = ft.EDInference(0.0, max_len=10, cache=cache)(z, model)
            assert list(got) == list(out), (s, cache, list(got), list(out))
        assert out[0] == 2 and (forced_bos is None or out[1] == forced_bos)
        if len(out) == 10:
            capped += 1
        else:
            stopped += 1
    assert capped and stopped, (capped, stopped)  # both ends of Algorithm 15's loop, and the forced eos


@pytest.mark.parametrize("act,tied,scale,cls", [(*KINDS[0], "Bart"), (*KINDS[1], "Bart"), (*KINDS[2], "MBart")])
def test_round_trips_are_exact(tmp_path, act, tied, scale, cls):
    hf = _bart(act, tied, scale, cls=cls + "ForConditionalGeneration")
    hf.generation_config.forced_bos_token_id = 0
    model = ft.from_hf(hf)
    back = ft.to_hf(model)
    assert type(back).__name__ == cls + "ForConditionalGeneration"
    assert (back.lm_head.weight is back.model.shared.weight) == tied
    sd, sd2 = hf.state_dict(), back.state_dict()
    assert set(sd) == set(sd2)
    for k in sd:
        if k.endswith("embed_positions.weight"):  # the two rows no position reads: zeros
            assert torch.equal(sd[k][2:], sd2[k][2:]) and not sd2[k][:2].any(), k
        else:
            assert torch.equal(sd[k], sd2[k]), k
    assert back.generation_config.forced_bos_token_id == 0 and back.generation_config.forced_eos_token_id == 2
    again = ft.from_hf(back)
    assert again.config == model.config and again.config["forced_bos_id"] == 0
    for k, v in model.params.items():
        assert np.array_equal(again.params[k], v), k
    ft.save_hf(model, tmp_path / "b")
    loaded = ft.load_hf(tmp_path / "b")
    assert loaded.config == model.config
    for k, v in model.params.items():
        assert np.array_equal(loaded.params[k], v), k
    auto = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "b").eval()
    assert type(auto).__name__ == cls + "ForConditionalGeneration"
    P = torch.softmax(auto(input_ids=torch.as_tensor(Z)[None], decoder_input_ids=torch.as_tensor(X)[None]).logits[0], -1)
    assert rel_err(model(Z, X), P.detach().numpy().T) <= 1e-12


def _bart_dir(tmp_path, name, edit):
    src = tmp_path / "src"
    if not src.exists():
        ft.save_hf(_native(), src)
    d = tmp_path / name
    d.mkdir()
    (d / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes())
    cfg = json.loads((src / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, **edit}))
    return d


REFUSED = [("add_final_layer_norm", True), ("normalize_before", True), ("add_bias_logits", True),
           ("static_position_embeddings", True), ("normalize_embedding", False), ("decoder_attention_heads", 1),
           ("decoder_ffn_dim", 10), ("activation_function", "silu"), ("forced_eos_token_id", 3),
           ("is_encoder_decoder", False), ("eos_token_id", [2, 3])]


@pytest.mark.parametrize("key,value", REFUSED, ids=[k for k, _ in REFUSED])
def test_configs_we_do_not_express_are_refused_by_name(tmp_path, key, value):
    with pytest.raises(ValueError, match=key):
        ft.load_hf(_bart_dir(tmp_path, key, {key: value}))


# ---------------------------------------------------------------------------------------------------
# The options on their own: the core against the listing, finite differences, decoding, bad values

OPTS = dict(n_vocab=19, l_max=12, L_enc=2, L_dec=2, H=2, d_e=8, d_mlp=12, mlp="gelu", embed_norm=True,
            separate_positions=True, scale_embedding=True, unembed_bias=True)


def _native(dtype="float64", **kw):
    m = ft.EDTransformer(**{**OPTS, **kw}, bos_id=2, eos_id=2, forced_eos=True, dtype=dtype, seed=2)
    randomize_theta(m, np.random.default_rng(7), unit=("W_e", "W_p", "dec.W_p"))
    return m


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("kw", [dict(), dict(mlp="relu", scale_embedding=False, tied=True),
                                dict(embed_norm=False, separate_positions=False, unembed_bias=False),
                                dict(pre_norm=True)])
def test_core_equals_the_listing(dtype, kw):
    m = _native(dtype, **kw)
    theta = {k: np.array(v, dtype=np.float64) for k, v in m.params.items()}
    z, x = np.array([4, 5, 6, 7, 1, 2, 3, 8, 9, 11]), np.array([2, 3, 17, 9, 4, 4, 5, 13])
    P = ref.bart_transformer(z, x, theta, L_enc=2, L_dec=2, H=2, mlp=m.config["mlp"],
                             scale_embedding=m.config["scale_embedding"], pre_norm=m.config["block"] == "pre_ln")
    assert rel_err(m(z, x), P) <= TOL[dtype]


@pytest.mark.parametrize("tied,pre_norm", [(False, False), (True, False), (False, True)])
def test_every_gradient_equals_finite_differences(tied, pre_norm):
    m = _native(L_enc=1, L_dec=1, tied=tied, pre_norm=pre_norm)
    z, x = np.array([4, 5, 6, 1, 2, 3]), np.array([2, 3, 9, 4, 7])
    _, grads = m.loss_and_grad(z, x)
    assert {"dec.W_p", "enc.gamma_e", "enc.beta_e", "dec.gamma_e", "dec.beta_e", "b_u"} <= set(grads)
    assert_grads_match_fd(m, grads, lambda: m.loss(z, x), label=(tied, pre_norm))


def test_the_defaults_keep_algorithm_8_and_the_options_round_trip(tmp_path):
    base = dict(n_vocab=15, l_max=10, L_enc=1, L_dec=1, H=2, d_e=8, d_mlp=10, dtype="float64", seed=4)
    plain = ft.EDTransformer(**base)
    same = ft.EDTransformer(**base, mlp="relu", embed_norm=False, separate_positions=False, scale_embedding=False,
                            unembed_bias=False, forced_bos_id=None, forced_eos=False)
    assert list(plain.params) == list(same.params) and plain.config == same.config
    bart = ft.EDTransformer(**base, **{k: v for k, v in OPTS.items() if k not in base})
    for k in plain.params:  # the options add parameters without changing the initialisation of the listing's own
        np.testing.assert_array_equal(plain.params[k], bart.params[k])
    z, x = np.array([3, 4, 5]), np.array([1, 2, 3])
    np.testing.assert_array_equal(plain(z, x), same(z, x))
    m = _native(forced_bos_id=5)
    ft.save(m, tmp_path / "m")
    back = ft.load(tmp_path / "m")
    assert back.config == m.config and back.config["forced_bos_id"] == 5
    np.testing.assert_array_equal(back(z, x), m(z, x))


def test_forced_tokens_and_cached_decoding():
    m = _native(forced_bos_id=7)
    for s in range(4):
        z = np.random.default_rng(s).integers(3, 19, size=3 + s)
        a = ft.EDInference(0.0, max_len=9, cache=True)(z, m)
        b = ft.EDInference(0.0, max_len=9, cache=False)(z, m)
        assert list(a) == list(b) and a[0] == 2 and a[1] == 7 and (a[-1] == 2 or len(a) < 9)
        # the forced tokens are what HF's logits processors do to the plain decoding
        full = ft.EDInference(0.0, max_len=9, cache=True)(z, _native())
        assert full[-1] == 2
    free = ft.EDTransformer(**OPTS, dtype="float64", seed=2)
    assert not free.config["forced_eos"] and free.config["forced_bos_id"] is None


def test_bad_options_raise_naming_them():
    small = dict(n_vocab=9, l_max=4, L_enc=1, L_dec=1, H=1, d_e=4, d_mlp=4)
    with pytest.raises(ValueError, match="separate_positions"):
        ft.EDTransformer(**small, separate_positions=True, positional="sinusoidal")
    with pytest.raises(ValueError, match="forced_bos_id = 9 is out of range"):
        ft.EDTransformer(**small, forced_bos_id=9)
    with pytest.raises(TypeError, match="scale_embedding"):
        ft.DTransformer(9, 4, 1, 1, 4, 4, scale_embedding=True)
    with pytest.raises(TypeError, match="forced_eos"):
        ft.EDTransformer(**small, forced_eos=1)
    with pytest.raises(ValueError, match="mlp must be one of 'relu', 'gelu'"):  # an activation BART does not have
        ft.EDTransformer(**small, mlp="silu")
    # exports: BART's layers are layer_norm'd with eps 1e-5, one dropout for embeddings and sublayers; pre-norm is mBART
    for bad, match in [(dict(norm="rms"), "norm"), (dict(eps=1e-6), "eps"), (dict(embed_norm=False), "embed_norm"),
                       (dict(embed_dropout=0.1), "embed_dropout"), (dict(H_kv=1), "H_kv"),
                       (dict(pre_norm=True, bias=False), "bias")]:
        with pytest.raises(ValueError, match=match):
            ft.to_hf(ft.EDTransformer(**{**OPTS, **bad}))
    assert type(ft.to_hf(ft.EDTransformer(**OPTS, pre_norm=True))).__name__ == "MBartForConditionalGeneration"
    # to_torch has no module with BART's options (embed_norm, unembed_bias are mapped for ETransformer only)
    for opt in ("embed_norm", "unembed_bias", "scale_embedding", "separate_positions", "forced_eos"):
        with pytest.raises(ValueError, match=opt):
            ft.to_torch(ft.EDTransformer(**small, **{opt: True}))
    with pytest.raises(ValueError, match="mlp='gelu'"):
        ft.to_torch(ft.EDTransformer(**small, mlp="gelu"))


def test_a_float32_bart_is_float32_and_within_float32_rounding():
    hf = _bart("gelu", True, True).to(torch.float32)
    model = ft.from_hf(hf)
    assert model.config["dtype"] == "float32"
    P = torch.softmax(hf(input_ids=torch.as_tensor(Z)[None], decoder_input_ids=torch.as_tensor(X)[None]).logits[0], -1)
    assert rel_err(model(Z, X), P.detach().numpy().T) <= 1e-5
