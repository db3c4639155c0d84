"""T5 in full (docs/variants.md V18, issue 23.2): EDTransformer's T5 options (block="pre_ln", norm="rms", bias=False,
scale_scores=False, mlp="relu" | "geglu", tied, unembed_rescale, bos_id / eos_id) against reference.t5_transformer
(float64 ≤ 1e-12, float32 ≤ 1e-5) and finite differences; ft.from_hf(T5ForConditionalGeneration) against Hugging
Face's model with every weight random (P ≤ 1e-12, every gradient ≤ 1e-10, float64), the round trips ft → HF → ft
and through save_hf / load_hf exact, and greedy EDInference equal to HF's generate token for token.

Where HF computes in float32 inside a float64 model: T5LayerNorm takes the mean square of a float32 copy of its
input (`hidden_states.to(torch.float32).pow(2).mean(-1)`), which costs ~1e-7 relative in P (measured and bounded
below, unpatched); the exactness checks run the same formula in float64 (`_float64_t5`), as test_prefix_window.py
does for Mistral. The relative buckets' log is float32 in HF and in the core alike (V11)."""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref
from conftest import TOL, numeric_grad, randomize_theta, rel_err, torch_or_skip

T5_SIZES = dict(vocab_size=37, d_model=16, d_kv=6, d_ff=20, num_layers=2, num_decoder_layers=3, num_heads=3,
                relative_attention_num_buckets=8, relative_attention_max_distance=20, dropout_rate=0.0)
# (feed_forward_proj, tied, config's tie_word_embeddings = HF's scale_decoder_outputs)
KINDS = [("relu", True, True), ("gated-gelu", False, False), ("gated-gelu", True, False), ("relu", False, True)]


def _float64_t5(monkeypatch):
    """T5LayerNorm's mean square in the input's dtype (float64) instead of float32."""
    import torch
    from transformers.models.t5 import modeling_t5 as mt

    def forward(self, h):
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    monkeypatch.setattr(mt.T5LayerNorm, "forward", forward)


def _t5(ff="gated-gelu", tied=False, scale=False, seed=0, **sizes):
    torch = torch_or_skip()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.T5Config(**{**T5_SIZES, **sizes}, feed_forward_proj=ff, tie_word_embeddings=scale, decoder_start_token_id=0,
                                eos_token_id=1, pad_token_id=0)
    torch.manual_seed(seed)
    hf = transformers.T5ForConditionalGeneration(cfg).to(torch.float64)
    if not tied:  # transformers 5 ties lm_head to shared always: an untied T5 gets its own tensor by hand
        hf.lm_head.weight = torch.nn.Parameter(hf.lm_head.weight.detach().clone())
    with torch.no_grad():  # every weight random (the norms' weights too, not their init 1)
        for name, p in hf.named_parameters():
            if "layer_norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif "relative_attention_bias" in name or name in ("shared.weight", "lm_head.weight"):
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / math.sqrt(p.shape[-1]))
    assert (hf.lm_head.weight is hf.shared.weight) == tied
    return torch, hf.eval()


Z = np.array([3, 14, 15, 9, 26, 5, 3, 5, 8, 9, 7, 9, 3, 2, 33, 8, 4, 6, 2, 6, 4, 3])  # 22: past max_exact
X = np.array([0, 36, 2, 7, 1, 8, 2, 8, 18, 28, 1, 8, 28, 4, 5, 9, 0, 4, 5, 2, 3, 5, 3, 6])  # 24 (from the start id 0)


@pytest.mark.parametrize("ff,tied,scale", KINDS)
def test_from_hf_probabilities_and_every_gradient_equal_hugging_face(monkeypatch, ff, tied, scale):
    torch, hf = _t5(ff, tied, scale)
    model = ft.from_hf(hf)
    c = model.config
    assert (c["mlp"], c["tied"], c["unembed_rescale"]) == ("geglu" if ff == "gated-gelu" else "relu", tied, scale)
    assert (c["block"], c["norm"], c["bias"], c["scale_scores"], c["positional"]) == ("pre_ln", "rms", False, False,
                                                                                        "relative")
    assert (c["bos_id"], c["eos_id"], c["d_attn"], c["L_dec"]) == (0, 1, 6, 3)
    z, x = torch.as_tensor(Z)[None], torch.as_tensor(X)[None]
    # unpatched: HF's float32 mean square in T5LayerNorm costs ~1e-7 (above 1e-12, below 1e-5)
    P32 = torch.softmax(hf(input_ids=z, decoder_input_ids=x).logits[0], -1).detach().numpy().T
    assert 1e-12 < rel_err(model(Z, X), P32) <= 1e-5
    _float64_t5(monkeypatch)
    logits = hf(input_ids=z, decoder_input_ids=x).logits[0]
    P_hf = torch.softmax(logits, -1).detach().numpy().T
    assert rel_err(model(Z, X), P_hf) <= 1e-12
    # and the listing (reference.t5_transformer) on the same θ
    theta = {k: np.array(v) for k, v in model.params.items()}
    P_ref = ref.t5_transformer(Z, X, theta, L_enc=2, L_dec=3, H=3, eps=c["eps"], mlp=c["mlp"],
                               relative_max_distance=20, unembed_rescale=scale)
    assert rel_err(P_ref, P_hf) <= 1e-12
    # loss −Σ log P[x[t+1], t] and the gradient of every parameter
    loss_hf = torch.nn.functional.cross_entropy(logits[:-1], x[0, 1:], reduction="sum")
    hf.zero_grad()
    loss_hf.backward()
    loss, grads = model.loss_and_grad(Z, X)
    assert abs(loss - loss_hf.item()) <= 1e-12 * abs(loss_hf.item())
    hp = {**ft.hf.t5.T5().hyper(hf.config.to_dict()), "tied": tied}
    hf_grads = {k: p.grad.numpy() for k, p in hf.named_parameters()}
    hf_grads = {k: v for k, v in hf_grads.items() if not k.endswith("embed_tokens.weight")}
    ours = ft.hf.t5.T5().to_ft(hp, hf_grads, True)  # HF's gradients under ft's names and shapes
    assert set(ours) == set(grads)
    for k, g in grads.items():
        assert rel_err(g, ours[k]) <= 1e-10, k


@pytest.mark.parametrize("ff,tied,scale", [KINDS[1], KINDS[3], KINDS[0]])
def test_greedy_edinference_equals_hugging_face_generate(monkeypatch, ff, tied, scale):
    # (L_dec = L_enc here: transformers 5.24's generate sizes T5's self-attention cache by num_layers and fails
    # with an IndexError when num_decoder_layers is larger)
    torch, hf = _t5(ff, tied, scale, seed=1, num_decoder_layers=2)
    if not tied:  # eos (1) a little likelier, so that some of the six decodings stop at it and some run to max_len
        with torch.no_grad():
            hf.lm_head.weight[1] *= 1.5
    _float64_t5(monkeypatch)
    model = ft.from_hf(hf)
    n_eos = 0
    for s in range(6):
        z = np.random.default_rng(s).integers(2, 37, size=5 + 3 * s)
        out = hf.generate(torch.as_tensor(z)[None], do_sample=False, max_length=12)[0].numpy()
        n_eos += int(out[-1] == 1)
        for cache in (True, False):  # HF starts from decoder_start_token_id 0 and stops at eos 1: bos_id, eos_id
            got = ft.EDInference(0.0, max_len=12, cache=cache)(z, model)
            assert list(got) == list(out), (s, cache)
    assert model.config["bos_id"] == 0 and model.config["eos_id"] == 1
    assert tied or 1 <= n_eos < 6, n_eos  # both ends of Algorithm 15's loop were taken


def test_round_trips_are_exact(tmp_path):
    torch, hf = _t5("gated-gelu", tied=False, scale=False)
    model = ft.from_hf(hf)
    back = ft.to_hf(model)  # ft -> HF: the same tensors
    assert back.lm_head.weight is not back.shared.weight
    sd, sd2 = hf.state_dict(), back.state_dict()
    assert set(sd) == set(sd2)
    for k in sd:
        assert torch.equal(sd[k], sd2[k]), k
    again = ft.from_hf(back)  # HF -> ft: the same θ and config
    assert again.config == model.config
    for k, v in model.params.items():
        assert np.array_equal(again.params[k], v), k
    for tied, scale in ((False, False), (True, True), (True, False), (False, True)):
        m = ft.EDTransformer(n_vocab=23, l_max=20, L_enc=1, L_dec=2, H=2, d_e=8, d_mlp=12, d_attn=5, d_mid=5,
                             pre_norm=True, norm="rms", bias=False, positional="relative", relative_buckets=6,
                             relative_max_distance=9, scale_scores=False, mlp="geglu", tied=tied,
                             unembed_rescale=scale, bos_id=0, eos_id=1, eps=1e-6, dtype="float64")
        randomize_theta(m, np.random.default_rng(5), unit=("W_e", "rel_bias", "W_u"))
        h = ft.to_hf(m)
        assert (h.lm_head.weight is h.shared.weight) == tied and h.config.scale_decoder_outputs == scale
        m2 = ft.from_hf(h)
        assert m2.config == m.config
        for k, v in m.params.items():
            assert np.array_equal(m2.params[k], v), (tied, scale, k)
        d = tmp_path / f"t5_{tied}_{scale}"
        ft.save_hf(m, d)
        m3 = ft.load_hf(d)
        assert m3.config == m.config
        for k, v in m.params.items():
            assert np.array_equal(m3.params[k], v), (tied, scale, k)
        zz, xx = np.array([3, 4, 5, 6, 7, 2]), np.array([0, 9, 8, 7])
        assert np.array_equal(m3(zz, xx), m(zz, xx))


# ---------------------------------------------------------------------------------------------------
# The options on their own: the core against the listing, finite differences, decoding, bad values

T5_OPTS = dict(n_vocab=19, l_max=14, L_enc=2, L_dec=2, H=2, d_e=10, d_mlp=12, d_attn=4, d_mid=6, block="pre_ln",
               norm="rms", bias=False, positional="relative", relative_buckets=6, relative_max_distance=9,
               scale_scores=False, eps=1e-6)


@pytest.mark.parametrize("mlp", ["relu", "geglu"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_core_equals_the_listing(mlp, dtype):
    m = ft.EDTransformer(**T5_OPTS, mlp=mlp, tied=True, unembed_rescale=True, dtype=dtype, seed=2)
    theta = randomize_theta(m, np.random.default_rng(7), unit=("W_e", "rel_bias"))
    z, x = np.array([4, 5, 6, 7, 1, 2, 3, 8, 9, 11]), np.array([17, 3, 2, 9, 4, 4, 5, 13])
    P = ref.t5_transformer(z, x, theta, L_enc=2, L_dec=2, H=2, eps=1e-6, mlp=mlp, relative_max_distance=9,
                           unembed_rescale=True)
    assert rel_err(m(z, x), P) <= TOL[dtype]


@pytest.mark.parametrize("scale_scores,unembed_rescale,mlp,tied", [(False, True, "geglu", False),
                                                                  (True, False, "relu", True)])
def test_every_gradient_equals_finite_differences(scale_scores, unembed_rescale, mlp, tied):
    opts = {**T5_OPTS, "L_enc": 1, "L_dec": 1, "scale_scores": scale_scores}
    m = ft.EDTransformer(**opts, mlp=mlp, tied=tied, unembed_rescale=unembed_rescale, dtype="float64", seed=3)
    randomize_theta(m, np.random.default_rng(11), unit=("W_e", "rel_bias", "W_u"))
    z, x = np.array([4, 5, 6, 1, 2, 3]), np.array([17, 3, 2, 9, 4])
    _, grads = m.loss_and_grad(z, x)
    for name, view in m.params.items():
        g = numeric_grad(lambda: m.loss(z, x), view)
        assert rel_err(grads[name], g) <= 1e-6, name


def test_post_norm_ed_takes_the_new_parts_too():
    """norm='rms' and mlp='geglu' also in Algorithm 8's post-LN layers (block="post_ln"): against finite differences."""
    m = ft.EDTransformer(n_vocab=15, l_max=10, L_enc=1, L_dec=1, H=2, d_e=8, d_mlp=10, norm="rms", mlp="geglu",
                         scale_scores=False, dtype="float64", seed=1)
    assert "dec.0.W_gate" in m.params and "enc.0.beta1" not in m.params
    randomize_theta(m, np.random.default_rng(2))
    z, x = np.array([3, 4, 5, 6]), np.array([13, 2, 7])
    _, grads = m.loss_and_grad(z, x)
    for name in ("enc.0.W_gate", "dec.0.gamma5", "dec.0.attn.W_q", "W_e"):
        assert rel_err(grads[name], numeric_grad(lambda: m.loss(z, x), m.params[name])) <= 1e-6, name


def test_cached_decoding_equals_the_full_forward():
    m = ft.EDTransformer(**T5_OPTS, mlp="geglu", tied=False, unembed_rescale=True, bos_id=0, eos_id=1, dtype="float64",
                         seed=5)
    randomize_theta(m, np.random.default_rng(3), unit=("W_e", "rel_bias", "W_u"))
    z = np.array([4, 5, 6, 7, 1, 2, 3, 8, 9, 11, 12])
    a = ft.EDInference(0.0, max_len=14, cache=True)(z, m)
    b = ft.EDInference(0.0, max_len=14, cache=False)(z, m)
    assert list(a) == list(b) and a[0] == 0 and len(a) >= 2


def test_config_round_trips_and_bad_options_raise():
    m = ft.EDTransformer(**T5_OPTS, mlp="geglu", unembed_rescale=True, bos_id=0, eos_id=1, seed=1)
    c = m.config
    assert (c["mlp"], c["bos_id"], c["eos_id"]) == ("geglu", 0, 1)
    assert ft.EDTransformer(n_vocab=9, l_max=4, L_enc=1, L_dec=1, H=1, d_e=4, d_mlp=4).config["mlp"] == "relu"
    assert ft.EDTransformer(n_vocab=9, l_max=4, L_enc=1, L_dec=1, H=1, d_e=4, d_mlp=4).config["bos_id"] is None
    small = dict(n_vocab=9, l_max=4, L_enc=1, L_dec=1, H=1, d_e=4, d_mlp=4)
    with pytest.raises(ValueError, match="bos_id = 9 is out of range"):
        ft.EDTransformer(**small, bos_id=9)
    with pytest.raises(ValueError, match="eos_id must be a token id"):
        ft.EDTransformer(**small, eos_id=-2)
    with pytest.raises(ValueError, match="mlp must be one of"):
        ft.EDTransformer(**small, mlp="gated-silu")
    with pytest.raises(TypeError, match="'norm'"):  # BERT's layers keep layer_norm
        ft.ETransformer(n_vocab=9, l_max=4, L=1, H=1, d_e=4, d_mlp=4, d_f=4, norm="rms")
    with pytest.raises(TypeError, match="pre_norm"):
        ft.DTransformer(n_vocab=9, l_max=4, L=1, H=1, d_e=4, d_mlp=4, pre_norm=True)
    with pytest.raises(TypeError, match="scale_scores must be True or False"):
        ft.EDTransformer(**small, scale_scores=1)


def test_hf_values_we_do_not_express_raise(tmp_path):
    T5_OPTS = {**globals()["T5_OPTS"], "d_mid": 4}  # T5's d_kv: d_attn = d_mid
    m = ft.EDTransformer(**T5_OPTS, mlp="relu", bos_id=0, eos_id=1, seed=1)
    ft.save_hf(m, tmp_path / "ok")
    cfg = json.loads((tmp_path / "ok" / "config.json").read_text())
    from safetensors.numpy import load_file, save_file

    T = load_file(tmp_path / "ok" / "model.safetensors")
    # the relative buckets: the core's rule (resolve) refuses them, named as the core names them
    for key, value, match in [("feed_forward_proj", "gated-silu", "feed_forward_proj"),
                              ("relative_attention_max_distance", 3, "relative_max_distance must be >"),
                              ("relative_attention_num_buckets", 2, "relative_buckets must be >= 4"),
                              ("is_encoder_decoder", False, "is_encoder_decoder"),
                              ("eos_token_id", [1, 2], "eos_token_id")]:
        d = tmp_path / key
        d.mkdir()
        rows = value if key == "relative_attention_num_buckets" else None  # the bias tables the config then needs
        save_file({k: v[:rows] if "relative_attention_bias" in k else v for k, v in T.items()}, d / "model.safetensors")
        (d / "config.json").write_text(json.dumps({**cfg, key: value}))
        with pytest.raises(ValueError, match=match):
            ft.load_hf(d)
    for bad, match in [(dict(block="post_ln"), "block='post_ln'"), (dict(scale_scores=True), "scale_scores"),
                       (dict(resid_dropout=0.1), "resid_dropout"), (dict(d_mid=5), "d_attn = d_mid")]:
        with pytest.raises(ValueError, match=match):
            ft.to_hf(ft.EDTransformer(**{**T5_OPTS, **bad}, seed=1))


def test_unscaled_scores_in_the_tiled_listing_equal_the_literal_one():
    """scale_scores=False reaches the tiled kernel's scale too (HeadBlock::unscaled): literal = tiled, P and gradients."""
    opts = dict(n_vocab=15, l_max=12, L_enc=1, L_dec=1, H=2, d_e=8, d_mlp=10, pre_norm=True, norm="rms", bias=False,
                scale_scores=False, dtype="float64", seed=3)
    lit = ft.EDTransformer(**opts, attention_impl="literal")
    til = ft.EDTransformer(**opts, attention_impl="tiled")
    theta = randomize_theta(lit, np.random.default_rng(4))
    for k, v in theta.items():
        til.params[k][...] = v
    z, x = np.array([3, 4, 5, 6, 7, 8, 9, 2, 1]), np.array([13, 2, 7, 5, 6, 1])
    assert rel_err(til(z, x), lit(z, x)) <= 1e-12
    _, g_lit = lit.loss_and_grad(z, x)
    _, g_til = til.loss_and_grad(z, x)
    for k in g_lit:
        assert rel_err(g_til[k], g_lit[k]) <= 1e-10, k
    scaled = ft.EDTransformer(**{**opts, "scale_scores": True})
    for k, v in theta.items():
        scaled.params[k][...] = v
    assert rel_err(scaled(z, x), lit(z, x)) > 1e-6  # the option acts


def test_geglu_in_a_decoder_only_model():
    """mlp='geglu' is also a DTransformer option (the part is the registry's): every gradient vs finite differences,
    and cached decoding = the full forward."""
    m = ft.DTransformer(n_vocab=13, l_max=10, L=1, H=2, d_e=8, d_mlp=10, mlp="geglu", bias=True, dtype="float64", seed=2)
    assert m.config["mlp"] == "geglu" and "layers.0.W_gate" in m.params and "layers.0.b_gate" in m.params
    randomize_theta(m, np.random.default_rng(6))
    x = np.array([3, 4, 5, 6, 7, 2])
    _, grads = m.loss_and_grad(x)
    for name in ("layers.0.W_gate", "layers.0.b_gate", "layers.0.W_mlp1", "layers.0.W_mlp2", "layers.0.b_mlp2"):
        assert rel_err(grads[name], numeric_grad(lambda: m.loss(x), m.params[name])) <= 1e-6, name
    assert list(ft.DInference(5, 0.0, cache=True)(x, m)) == list(ft.DInference(5, 0.0, cache=False)(x, m))


# ---------------------------------------------------------------------------------------------------
# ft.to_torch / from_torch with T5's options: transformers' own T5ForConditionalGeneration (the module's .hf)

@pytest.mark.parametrize("ff,tied,scale", KINDS)
def test_to_torch_is_t5_with_equal_probabilities_and_gradients(monkeypatch, ff, tied, scale):
    torch, hf = _t5(ff, tied, scale)
    model = ft.from_hf(hf)
    module = ft.to_torch(model)
    transformers = pytest.importorskip("transformers")
    assert isinstance(module.hf, transformers.T5ForConditionalGeneration)
    _float64_t5(monkeypatch)
    z, x = torch.as_tensor(Z)[None], torch.as_tensor(X)[None]
    P = torch.softmax(module(z, x)[0], -1).detach().numpy().T
    assert rel_err(model(Z, X), P) <= 1e-12
    module.zero_grad()
    loss_t = module.loss(Z, X)
    loss_t.backward()
    loss, grads = model.loss_and_grad(Z, X)
    assert abs(loss - loss_t.item()) <= 1e-12 * abs(loss)
    tg = module.ft_grads()
    assert set(tg) == set(grads)
    for k, g in grads.items():
        assert rel_err(tg[k], g) <= 1e-10, k
    back = ft.from_torch(module)  # the config (bos_id, eos_id too) and θ back
    assert back.config == model.config
    for k, v in model.params.items():
        assert np.array_equal(back.params[k], v), k


TO_TORCH_REFUSED = [  # each T5 option alone is not T5: the refusal names the model's options and T5's missing one
    (dict(block="pre_ln"), "with block='pre_ln' \\(beyond Algorithm 8\\).*T5 has no equivalent of norm='layer'"),
    (dict(scale_scores=False), "with scale_scores=False .*T5 has no equivalent of block='post_ln'"),
    (dict(mlp="geglu"), "with mlp='geglu' .*T5 has no equivalent of block='post_ln'"),
    (dict(T5_OPTS, mlp="swiglu"), "T5 has no equivalent of mlp='swiglu'"),
    (dict(T5_OPTS), "T5 needs d_attn = d_mid"),  # T5_OPTS: d_attn 4, d_mid 6
    (dict(T5_OPTS, dropout=0.1), "T5 has no equivalent of embed_dropout=0.1"),
]


@pytest.mark.parametrize("opts,match", TO_TORCH_REFUSED, ids=[str(o) for o, _ in TO_TORCH_REFUSED])
def test_to_torch_refuses_what_t5_cannot_express_naming_it(opts, match):
    torch_or_skip()
    # positional='learned': the relative bias's options back at their defaults (an option of a part not chosen)
    m = ft.EDTransformer(**{**T5_OPTS, "block": "post_ln", "norm": "layer", "bias": True, "positional": "learned",
                            "relative_buckets": 32, "relative_max_distance": 128, "scale_scores": True, **opts},
                         dtype="float64")
    with pytest.raises(ValueError, match=match):
        ft.to_torch(m)


def test_to_torch_of_algorithm_8_takes_bos_eos_and_refuses_unscaled_scores():
    torch_or_skip()
    base = dict(n_vocab=19, l_max=14, L_enc=1, L_dec=1, H=2, d_e=8, d_mlp=12, dtype="float64")
    m = ft.EDTransformer(**base, bos_id=0, eos_id=1)  # where decoding starts and stops: not the forward's
    module = ft.to_torch(m)
    assert ft.from_torch(module).config == m.config
    # used to be accepted silently and run Algorithm 4's 1/√d_attn in torch's layers
    with pytest.raises(ValueError, match="scale_scores=False"):
        ft.to_torch(ft.EDTransformer(**base, scale_scores=False, norm="layer"))


def _t5_dir(tmp_path, name, mlp="relu", edit_config=None, edit_tensors=None):
    """A T5 directory written by save_hf, its config.json and tensors edited."""
    from safetensors.numpy import load_file, save_file

    T5_OPTS = {**globals()["T5_OPTS"], "d_mid": 4}
    ok = tmp_path / (name + "_src")
    ft.save_hf(ft.EDTransformer(**T5_OPTS, mlp=mlp, bos_id=0, eos_id=1, seed=1), ok)
    d = tmp_path / name
    d.mkdir()
    T = load_file(ok / "model.safetensors")
    save_file((edit_tensors or dict)(T) if edit_tensors else T, d / "model.safetensors")
    cfg = json.loads((ok / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, **(edit_config or {})}))
    return d


def test_a_stack_embedding_that_differs_from_shared_is_refused_by_name(tmp_path):
    """transformers 5 uses a file's encoder/decoder.embed_tokens.weight when it differs from shared.weight (it does
    not tie them); ft's stacks share one W_e, so load_hf refuses such a file naming the tensor (it used to drop it).
    A copy equal to shared is the tied alias and loads."""
    rng = np.random.default_rng(0)
    for k in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
        d = _t5_dir(tmp_path, k.split(".")[0], edit_tensors=lambda T: {**T, k: rng.standard_normal(T["shared.weight"].shape)
                                                                       .astype(T["shared.weight"].dtype)})
        with pytest.raises(ValueError, match=k.replace(".", r"\.")):
            ft.load_hf(d)
    d = _t5_dir(tmp_path, "alias", edit_tensors=lambda T: {**T, "encoder.embed_tokens.weight": T["shared.weight"].copy()})
    m, src = ft.load_hf(d), ft.load_hf(tmp_path / "alias_src")
    assert set(m.params) == set(src.params) and all(np.array_equal(m.params[k], src.params[k]) for k in m.params)


def test_dense_act_fn_and_is_gated_act_are_read_as_transformers_reads_them(tmp_path):
    """T5Config takes dense_act_fn and is_gated_act from the config when given (feed_forward_proj only derives
    them): feed_forward_proj "relu" with dense_act_fn "gelu" builds a GELU MLP in transformers, which ft's T5 has
    not: refused by name (it used to load as ReLU without a word). Given values that agree load."""
    with pytest.raises(ValueError, match="dense_act_fn"):
        ft.load_hf(_t5_dir(tmp_path, "gelu", edit_config={"dense_act_fn": "gelu"}))
    with pytest.raises(ValueError, match="dense_act_fn"):
        ft.load_hf(_t5_dir(tmp_path, "gg_relu", mlp="geglu", edit_config={"dense_act_fn": "relu"}))
    m = ft.load_hf(_t5_dir(tmp_path, "agree", edit_config={"dense_act_fn": "relu", "is_gated_act": False}))
    assert m.config["mlp"] == "relu"
    g = ft.load_hf(_t5_dir(tmp_path, "gagree", mlp="geglu", edit_config={"dense_act_fn": "gelu_new", "is_gated_act": True}))
    assert g.config["mlp"] == "geglu"
    # is_gated_act given against feed_forward_proj: transformers builds the gated MLP (wi_0, wi_1), which the
    # file's single wi does not hold
    with pytest.raises(ValueError, match="wi_0"):
        ft.load_hf(_t5_dir(tmp_path, "gated", edit_config={"is_gated_act": True, "dense_act_fn": "gelu_new"}))
    import transformers

    c = transformers.T5Config.from_dict({"feed_forward_proj": "relu", "dense_act_fn": "gelu"})
    assert (c.dense_act_fn, c.is_gated_act) == ("gelu", False)  # what the refusal above is about
