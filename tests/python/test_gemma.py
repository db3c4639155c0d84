"""Gemma 2 and Gemma 3 (text) as Algorithm 10 with their parts (docs/variants.md V24–V27): the (1 + γ) RMS norm,
the √d_e-scaled embedding, sandwich norms, local/global layers with their own RoPE θ, the 'softcap' head kernel
(query_pre_attn_scalar, attn_logit_softcapping), the final logits' soft-capping, GeGLU and (Gemma 3) QK-norm. The
core against reference.gemma_transformer (float64 ≤ 1e-12, float32 ≤ 1e-5), gradients against finite differences,
cached and batched decoding against the literal listing, bad options; and Hugging Face's Gemma2ForCausalLM and
Gemma3ForCausalLM in float64: P and every gradient, round trips, greedy generation."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref
from conftest import TOL, assert_grads_match_fd, hf_random_float64, randomize_theta, rel_err, torch_or_skip
from decoder_checks import assert_decoding_equals_literal
from hf_family_checks import greedy_and_batched_equal_hf, hf_float64_errors_within, round_trips_exactly

V = 19
GEMMA = dict(positional="rope", rope_theta=500.0, H_kv=2, mlp="geglu", bias=False, norm="rms1p", eps=1e-6,
             block="sandwich", embed_scale=4.0, sliding_window=3, sliding_window_pattern=2,
             query_pre_attn_scalar=6.0, attn_logit_softcapping=2.0, final_logit_softcapping=3.0)
REF_KEYS = ("eps", "rope_theta", "sliding_window", "sliding_window_pattern", "rope_local_base_freq", "rope_scaling_factor", "qk_norm",
            "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping", "embed_scale")


def make(dtype="float64", L=3, l_max=16, **kw):
    return ft.DTransformer(V, l_max, L, 4, 16, 20, dtype=dtype, seed=2, **{**GEMMA, **kw})


def reference(model, x, theta, **kw):
    c = model.config
    return ref.gemma_transformer(x, theta, L=c["L"], H=c["H"], **{k: c[k] for k in REF_KEYS if c.get(k) is not None},
                                 **kw)


def test_layer_kinds_follow_the_pattern():
    assert ref.gemma_layer_kinds(6, 4, 3) == ["local", "local", "global", "local", "local", "global"]
    assert ref.gemma_layer_kinds(3, 4, None) == ["local"] * 3
    assert ref.gemma_layer_kinds(3, None, 2) == ["global"] * 3
    assert np.allclose(ref.soft_cap([-100.0, 0.5, 100.0], 2.0), [-2 * math.tanh(50), 2 * math.tanh(0.25), 2 * math.tanh(50)])


GEMMA3 = dict(qk_norm=True, rope_local_base_freq=30.0, attn_logit_softcapping=None, final_logit_softcapping=None,
              sliding_window_pattern=3, L=4, rope_scaling_factor=4.0)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("opts", [{}, GEMMA3, dict(sliding_window_pattern=None), dict(sliding_window=None,
                                                                                     sliding_window_pattern=None)],
                         ids=["gemma2", "gemma3", "all-local", "all-global"])
def test_forward_and_loss_match_the_reference(opts, dtype):
    model = make(dtype, **opts)
    theta = randomize_theta(model, np.random.default_rng(1))
    x = np.array([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8])
    want = reference(model, x, theta)
    assert rel_err(model(x), want) <= TOL[dtype]
    if dtype == "float64":
        logP = np.log(reference(model, x, theta))
        want_loss = -sum(logP[x[t + 1], t] for t in range(len(x) - 1))
        assert abs(model.loss(x) - want_loss) <= 1e-12 * abs(want_loss)


@pytest.mark.parametrize("change", [dict(block="pre_ln"), dict(embed_scale=None), dict(sliding_window_pattern=None),
                                    dict(query_pre_attn_scalar=None), dict(attn_logit_softcapping=None),
                                    dict(final_logit_softcapping=None), dict(norm="rms"), dict(rope_scaling_factor=2.0)])
def test_each_part_matters(change):
    base, other = make(), make(**change)
    theta = randomize_theta(base, np.random.default_rng(1))
    for k in other.params:
        other.params[k][...] = theta[k]
    x = np.array([3, 1, 4, 1, 5, 9, 2, 6, 5, 3])
    assert rel_err(other(x), base(x)) > 1e-6


def test_fresh_gemma_norms_are_unit_gains_and_local_theta_matters():
    m = make(**GEMMA3)
    assert (m.params["layers.0.gamma1_post"] == 0).all() and (m.params["layers.0.attn.gamma_q"] == 0).all()
    theta = randomize_theta(m, np.random.default_rng(3))
    other = make(**{**GEMMA3, "rope_local_base_freq": None})
    for k in other.params:
        other.params[k][...] = theta[k]
    x = np.array([3, 1, 4, 1, 5, 9, 2, 6])
    assert rel_err(other(x), m(x)) > 1e-6


@pytest.mark.parametrize("opts", [{}, GEMMA3], ids=["gemma2", "gemma3"])
def test_gradients_match_finite_differences(opts):
    model = ft.DTransformer(V, 16, opts.get("L", 3) - 1, 2, 8, 10, dtype="float64", seed=2,
                            **{**GEMMA, **{k: v for k, v in opts.items() if k != "L"}, "H_kv": 1, "embed_scale": 2.8})
    randomize_theta(model, np.random.default_rng(2))
    x = np.array([3, 1, 4, 1, 5, 9, 2])
    loss, grads = model.loss_and_grad(x)
    assert abs(loss - model.loss(x)) <= 1e-12 * abs(loss)
    assert_grads_match_fd(model, grads, lambda: model.loss(x), b_k_zero=False)


@pytest.mark.parametrize("opts", [{}, GEMMA3], ids=["gemma2", "gemma3"])
def test_cached_and_batched_decoding_equal_the_literal_listing(opts):
    model = make(**opts)
    randomize_theta(model, np.random.default_rng(3))
    assert_decoding_equals_literal(model)


def test_batched_decoding_past_the_pages_of_the_window_keeps_the_global_layers_keys():
    # paged decoding frees the pages before a window only when every layer has one: the global layers read every key
    # (several prompts, so freed pages would be reused and overwritten)
    model = make(l_max=64)
    randomize_theta(model, np.random.default_rng(7))
    prompts = [np.array([1, 2, 3, 4]), np.array([5, 6]), np.array([7, 8, 9])]
    one_by_one = [ft.DInference(40, 0.0)(p, model) for p in prompts]
    assert all(np.array_equal(b, w) for b, w in zip(ft.DInference(40, 0.0)(prompts, model), one_by_one))


def test_speculative_decoding_with_local_and_global_layers():
    # a draft whose local layers roll their caches (V9) takes back at most w − 1 drafts, though its global layers
    # keep every column; greedy speculative decoding equals the target's greedy decoding
    target, draft = make(), make(L=2, sliding_window=4)
    randomize_theta(target, np.random.default_rng(5))
    randomize_theta(draft, np.random.default_rng(6))
    prompt, l_gen = [1, 2, 3, 4], 10
    want = ft.DInference(l_gen, 0.0)(prompt, target)
    for k in (1, 3):
        assert list(ft.SpeculativeInference(l_gen, k, 0.0)(prompt, target, draft)) == list(want), k
    with pytest.raises(ValueError, match="sliding_window"):
        ft.SpeculativeInference(l_gen, 4, 0.0)(prompt, target, draft)


def test_the_options_round_trip(tmp_path):
    model = make(**GEMMA3)
    randomize_theta(model, np.random.default_rng(4))
    assert ft.build_model(model.config_json()).config == model.config
    ft.save(model, tmp_path / "m.safetensors")
    back = ft.load(tmp_path / "m.safetensors")
    x = np.array([1, 2, 3, 4, 5, 6, 7])
    assert back.config == model.config and np.array_equal(back(x), model(x))
    plain = ft.DTransformer(V, 16, 2, 2, 8, 12).config
    for k in ("embed_scale", "final_logit_softcapping", "attn_logit_softcapping", "query_pre_attn_scalar",
              "sliding_window_pattern", "rope_local_base_freq"):
        assert plain[k] is None, k
    assert plain["block"] == "pre_ln" and "sandwich_norm" not in plain


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(attn_logit_softcapping=0), ValueError, "attn_logit_softcapping"),
    (dict(final_logit_softcapping=-1.0), ValueError, "final_logit_softcapping"),
    (dict(query_pre_attn_scalar=-2.0), ValueError, "query_pre_attn_scalar"),
    (dict(sliding_window_pattern=0), ValueError, "sliding_window_pattern"),
    (dict(sliding_window=None), ValueError, "sliding_window_pattern and rope_local_base_freq .* need sliding_window"),
    (dict(attention_impl="tiled"), ValueError, "tiled"),
    (dict(positional="alibi"), ValueError, "alibi"),
    (dict(embed_scale=0), ValueError, "embed_scale"),
    (dict(sandwich_norm=1), TypeError, "sandwich_norm"),
    (dict(sandwich_norm=False), ValueError, "sandwich_norm=False contradicts block='sandwich'"),
    (dict(mtp_depth=1), ValueError, "mtp_depth"),
])
def test_bad_options_name_themselves(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        make(**kwargs)
    with pytest.raises(TypeError, match="sandwich_norm"):
        ft.ETransformer(V, 16, 2, 2, 8, 12, 8, sandwich_norm=True)


def test_rope_scaling_factor_is_rope_s_and_scales_positions():
    with pytest.raises(ValueError, match="rope_scaling_factor is an option of the 'rope' position"):
        ft.DTransformer(V, 16, 1, 2, 8, 12, rope_scaling_factor=2.0)
    with pytest.raises(ValueError, match="rope_scaling_factor"):
        ft.DTransformer(V, 16, 1, 2, 8, 12, positional="rope", bias=False, kv_lora_rank=4, qk_rope_head_dim=2,
                        rope_scaling_factor=2.0)


# ---------------------------------------------------------------------------------------------------
# Hugging Face Gemma2ForCausalLM and Gemma3ForCausalLM, every weight random, float64


def _float64_gemma(monkeypatch, hf, gemma3):
    """HF's float32 steps in a float64 Gemma, run in float64 for the exactness checks: Gemma{2,3}RMSNorm (x.float()),
    the RoPE angles (Gemma{2,3}RotaryEmbedding), the attention softmax (eager_attention_forward's dtype=float32), and
    √d_e (a float32 buffer, embed_tokens.embed_scale, made before the model is float64)."""
    import torch

    if gemma3:
        from transformers.models.gemma3 import modeling_gemma3 as mg
        norm_cls, rope_cls = mg.Gemma3RMSNorm, mg.Gemma3RotaryEmbedding
    else:
        from transformers.models.gemma2 import modeling_gemma2 as mg
        norm_cls, rope_cls = mg.Gemma2RMSNorm, mg.Gemma2RotaryEmbedding

    def rms_forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)

    def angles(theta, d, x, position_ids):
        inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        emb = torch.cat((position_ids[..., None].to(torch.float64) * inv,) * 2, dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    def rope2(self, x, position_ids):
        return angles(self.config.rope_parameters["rope_theta"], self.inv_freq.shape[0] * 2, x, position_ids)

    def rope3(self, x, position_ids, layer_type):
        d = getattr(self, f"{layer_type}_inv_freq").shape[0] * 2
        rp = self.config.rope_parameters[layer_type]
        f = rp.get("factor", 1.0) if rp.get("rope_type") == "linear" else 1.0  # linear scaling: positions p / f
        return angles(rp["rope_theta"], d, x, position_ids / f)

    eager = mg.eager_attention_forward

    def eager64(module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None, **kw):
        real = torch.nn.functional.softmax
        monkeypatch.setattr(torch.nn.functional, "softmax", lambda a, dim, dtype=None: real(a, dim=dim))
        try:
            return eager(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, softcap=softcap, **kw)
        finally:
            monkeypatch.setattr(torch.nn.functional, "softmax", real)

    monkeypatch.setattr(norm_cls, "forward", rms_forward)
    monkeypatch.setattr(rope_cls, "forward", rope3 if gemma3 else rope2)
    monkeypatch.setattr(mg, "eager_attention_forward", eager64)
    with torch.no_grad():
        hf.model.embed_tokens.embed_scale.fill_(math.sqrt(hf.config.hidden_size))


def _gemma(gemma3, tied=True, **kw):
    torch = torch_or_skip()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    common = dict(vocab_size=29, hidden_size=24, intermediate_size=36, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=8, max_position_embeddings=24, rms_norm_eps=1e-6, tie_word_embeddings=tied,
                  pad_token_id=None, query_pre_attn_scalar=10, sliding_window=3, attn_implementation="eager")
    if gemma3:
        cfg = dict(common, num_hidden_layers=4, layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                                             "sliding_attention"],
                   rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000.0},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}})
        cfg.update(kw)
        return torch, hf_random_float64(transformers.Gemma3ForCausalLM, transformers.Gemma3TextConfig(**cfg)).eval()
    cfg = dict(common, num_hidden_layers=3, rope_parameters={"rope_type": "default", "rope_theta": 500.0},
               attn_logit_softcapping=2.5, final_logit_softcapping=4.0)
    cfg.update(kw)
    return torch, hf_random_float64(transformers.Gemma2ForCausalLM, transformers.Gemma2Config(**cfg)).eval()




@pytest.mark.parametrize("gemma3", [False, True], ids=["gemma2", "gemma3"])
@pytest.mark.parametrize("tied", [True, False])
def test_gemma_probabilities_and_every_gradient(monkeypatch, gemma3, tied):
    torch, hf = _gemma(gemma3, tied)
    model = ft.from_hf(hf)
    c = model.config
    assert (c["norm"], c["mlp"], c["block"], c["qk_norm"], c["tied"]) == ("rms1p", "geglu", "sandwich", gemma3, tied)
    assert c["sliding_window"] == 3 and c["sliding_window_pattern"] == (3 if gemma3 else 2)
    assert c["query_pre_attn_scalar"] == 10.0 and c["embed_scale"] == math.sqrt(24)
    if gemma3:
        assert (c["rope_theta"], c["rope_local_base_freq"], c["attn_logit_softcapping"]) == (1000.0, 50.0, None)
        assert c["rope_scaling_factor"] == 4.0
    else:
        assert (c["rope_theta"], c["attn_logit_softcapping"], c["final_logit_softcapping"]) == (500.0, 2.5, 4.0)
    x = np.array([3, 14, 15, 9, 26, 5, 3, 5, 8, 9, 7, 9])
    ids = torch.as_tensor(x)[None]
    P_hf32 = torch.softmax(hf(ids).logits[0], dim=-1).detach().numpy().T
    assert rel_err(model(x), P_hf32) <= 1e-5  # unpatched: HF's float32 steps
    _float64_gemma(monkeypatch, hf, gemma3)
    hf_float64_errors_within(hf, model, x, lambda grads: ft.hf.gemma.from_ft(grads, c))


@pytest.mark.parametrize("gemma3", [False, True], ids=["gemma2", "gemma3"])
def test_gemma_greedy_generation_and_batched_decoding_equal_hugging_face(monkeypatch, gemma3):
    _, hf = _gemma(gemma3)
    _float64_gemma(monkeypatch, hf, gemma3)
    model = ft.from_hf(hf)
    greedy_and_batched_equal_hf(hf, model, [[5, 17, 2, 9], [3], [8, 8, 1, 20, 4, 6]], 10)


@pytest.mark.parametrize("gemma3", [False, True], ids=["gemma2", "gemma3"])
@pytest.mark.parametrize("tied", [True, False])
def test_gemma_round_trips_exactly(tmp_path, gemma3, tied):
    _, hf = _gemma(gemma3, tied)
    round_trips_exactly(hf, tmp_path, type(hf).__name__)


@pytest.mark.parametrize("gemma3, kw, option", [
    (False, dict(hidden_activation="gelu"), "hidden_activation"),
    (False, dict(attention_bias=True), "attention_bias"),
    (False, dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10.0}), "rope_type"),
    (False, dict(layer_types=["sliding_attention", "full_attention", "full_attention"]), "layer_types"),
    (True, dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
    (True, dict(rope_parameters={"full_attention": {"rope_type": "dynamic", "factor": 8.0, "rope_theta": 1e6},
                                 "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
     "rope_parameters.full_attention.rope_type"),
    (True, dict(rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                 "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}),
     "rope_parameters.sliding_attention.rope_type"),
])
def test_gemma_unsupported_options_are_named(gemma3, kw, option):
    _, hf = _gemma(gemma3, **kw)
    with pytest.raises(ValueError, match=option.replace(".", r"\.")):
        ft.from_hf(hf)


@pytest.mark.parametrize("gemma3", [False, True], ids=["gemma2", "gemma3"])
def test_gemma_attention_dropout_maps_to_attn_dropout(gemma3):
    """HF drops the softmax of the capped (rescaled) scores; the 'softcap' kernel's attn_dropout does the same."""
    _, hf = _gemma(gemma3, attention_dropout=0.1)
    m = ft.from_hf(hf)
    assert m.config["attn_dropout"] == 0.1 and m.config["query_pre_attn_scalar"] == 10.0
    assert ft.to_hf(m).config.attention_dropout == 0.1


def test_gemma3_vision_tower_is_refused_by_name(tmp_path):
    import json

    transformers = pytest.importorskip("transformers")
    cfg = transformers.Gemma3Config(text_config=dict(vocab_size=29, hidden_size=24, intermediate_size=36,
                                                     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                                     head_dim=12),
                                    vision_config=dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                                                       num_attention_heads=2, image_size=28, patch_size=14))
    hf = transformers.Gemma3ForConditionalGeneration(cfg)
    with pytest.raises(ValueError, match="vision"):
        ft.from_hf(hf)
    hf.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["Gemma3ForConditionalGeneration"]
    with pytest.raises(ValueError, match="vision_config"):
        ft.load_hf(tmp_path)


def test_exports_go_to_their_family():
    assert type(ft.to_hf(make())).__name__ == "Gemma2ForCausalLM"
    assert type(ft.to_hf(make(**GEMMA3))).__name__ == "Gemma3ForCausalLM"
    with pytest.raises(ValueError, match="embed_scale"):
        ft.to_hf(make(embed_scale=2.0))
    with pytest.raises(ValueError, match="block='pre_ln'"):
        ft.to_hf(make(block="pre_ln"))
    with pytest.raises(ValueError, match="query_pre_attn_scalar"):
        ft.to_hf(make(query_pre_attn_scalar=6.5))
