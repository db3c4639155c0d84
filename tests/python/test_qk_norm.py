"""QK-norm (docs/variants.md V24; Qwen3, Gemma 3) as one part, the 'qk_norm' Q/K/V source
(cpp/src/variants/qk_norm.cpp and its registry row), and the (1 + γ) RMS norm (norm="rms1p",
cpp/src/variants/rms1p_norm.cpp): the core against reference.py (float64 ≤ 1e-12, float32 ≤ 1e-5), gradients
against finite differences, cached and batched decoding against the literal listing, bad options; and Hugging Face's
Qwen3ForCausalLM (LLaMA + QK-norm) in float64: P and every gradient, round trips, greedy generation."""
from __future__ import annotations

import os

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref
from conftest import TOL, assert_grads_match_fd, hf_float64, hf_random_float64, randomize_theta, rel_err, torch_or_skip
from decoder_checks import assert_decoding_equals_literal
from hf_family_checks import greedy_and_batched_equal_hf, hf_float64_errors_within, round_trips_exactly

V = 17
BASE = dict(positional="rope", rope_theta=300.0, H_kv=2, mlp="swiglu", bias=False, norm="rms", eps=1e-6, qk_norm=True)


def make(dtype="float64", **kw):
    return ft.DTransformer(V, 16, 2, 4, 16, 20, dtype=dtype, seed=2, **{**BASE, **kw})


def test_qk_norm_reference_normalises_each_head_column():
    rng = np.random.default_rng(0)
    M, g = rng.standard_normal((3, 4, 5)), 1 + 0.3 * rng.standard_normal(4)
    out = ref.qk_norm(M, g, 1e-6)
    for h in range(3):
        for t in range(5):
            e = M[h, :, t]
            assert np.allclose(out[h, :, t], e / np.sqrt((e ** 2).mean() + 1e-6) * g, rtol=1e-14)
    assert np.allclose(ref.qk_norm(M, g - 1, 1e-6, "rms1p"), out, rtol=1e-14)  # (1 + γ): γ stored as the offset
    with pytest.raises(ValueError, match="norm must be"):
        ref.qk_norm(M, g, 0.0, "layer")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("norm", ["rms", "rms1p"])
def test_forward_and_loss_match_the_reference(norm, dtype):
    model = make(dtype, norm=norm)
    assert {"layers.0.attn.gamma_q", "layers.0.attn.gamma_k"} <= set(model.params)
    assert model.params["layers.1.attn.gamma_q"].shape == (4,)
    theta = randomize_theta(model, np.random.default_rng(1))
    x = np.array([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8])
    hp = dict(L=2, H=4, positional="rope", rope_theta=300.0, mlp="swiglu", norm=norm, eps=1e-6)
    want = ref.d_transformer_variant(x, theta, qk_norm=True, **hp)
    assert rel_err(model(x), want) <= TOL[dtype]
    assert rel_err(want, ref.d_transformer_variant(x, theta, **hp)) > 1e-3  # the norms matter
    if dtype == "float64":
        assert abs(model.loss(x) - ref.d_variant_loss(x, theta, qk_norm=True, **hp)) <= 1e-12 * abs(model.loss(x))


def test_a_fresh_model_has_unit_gains():
    for norm, one in (("rms", 1.0), ("rms1p", 0.0)):
        m = make(norm=norm)
        assert (m.params["layers.0.attn.gamma_k"] == one).all() and (m.params["gamma"] == one).all(), norm


@pytest.mark.parametrize("norm", ["rms", "rms1p"])
def test_gradients_match_finite_differences(norm):
    model = ft.DTransformer(V, 16, 1, 2, 8, 10, dtype="float64", seed=2, **{**BASE, "norm": norm, "H_kv": 1})
    randomize_theta(model, np.random.default_rng(2))
    x = np.array([3, 1, 4, 1, 5, 9, 2])
    loss, grads = model.loss_and_grad(x)
    assert abs(loss - model.loss(x)) <= 1e-12 * abs(loss)
    assert_grads_match_fd(model, grads, lambda: model.loss(x), b_k_zero=False)


def test_with_biases_the_keys_bias_has_a_gradient():
    model = ft.DTransformer(V, 16, 1, 2, 8, 10, dtype="float64", seed=2, **{**BASE, "bias": True, "mlp": "gelu", "H_kv": 1})
    randomize_theta(model, np.random.default_rng(5))
    x = np.array([3, 1, 4, 1, 5, 9])
    loss, grads = model.loss_and_grad(x)
    assert np.abs(grads["layers.0.attn.b_k"]).max() > 1e-6  # the norm of K makes b_k matter
    assert_grads_match_fd(model, grads, lambda: model.loss(x), b_k_zero=False)


def test_cached_and_batched_decoding_equal_the_literal_listing():
    model = make()
    randomize_theta(model, np.random.default_rng(3))
    assert_decoding_equals_literal(model)


def test_the_option_is_the_parts_and_round_trips(tmp_path):
    model = make()
    assert model.config["qk_norm"] is True and "qk_norm" in ft.model_options("DTransformer")
    assert ft.build_model(model.config_json()).config == model.config
    randomize_theta(model, np.random.default_rng(4))
    ft.save(model, tmp_path / "m.safetensors")
    back = ft.load(tmp_path / "m.safetensors")
    x = np.array([1, 2, 3, 4, 5, 6, 7])
    assert back.config == model.config and np.array_equal(back(x), model(x))
    assert ft.DTransformer(V, 16, 2, 2, 8, 12).config["qk_norm"] is False


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(norm="layer"), ValueError, "qk_norm normalises .* norm must be 'rms' or 'rms1p'"),
    (dict(qk_norm=1), TypeError, "qk_norm"),
    (dict(kv_lora_rank=4, qk_rope_head_dim=2), ValueError, "an option of the"),
])
def test_bad_options_name_themselves(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        make(**kwargs)
    with pytest.raises(TypeError, match="qk_norm"):
        ft.ETransformer(V, 16, 2, 2, 8, 12, 8, qk_norm=True)


# ---------------------------------------------------------------------------------------------------
# Hugging Face Qwen3ForCausalLM (LLaMA's layers with QK-norm), every weight random, float64


def _qwen3(tied=False, **kw):
    torch = torch_or_skip()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Qwen3Config(vocab_size=29, hidden_size=24, intermediate_size=36, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=16,
                                   rms_norm_eps=1e-6, rope_theta=500.0, tie_word_embeddings=tied,
                                   attn_implementation="sdpa", **kw)
    return torch, hf_random_float64(transformers.Qwen3ForCausalLM, cfg).eval()


def _float64_qwen3(monkeypatch):
    """HF computes RMSnorm (the layers' and QK-norm's) and the RoPE angles in float32 even in a float64 model:
    Qwen3RMSNorm and Qwen3RotaryEmbedding patched to run in float64 (conftest.hf_float64)."""
    from transformers.models.qwen3 import modeling_qwen3 as mq

    hf_float64(monkeypatch, mq.Qwen3RMSNorm, mq.Qwen3RotaryEmbedding)


@pytest.mark.parametrize("tied", [False, True])
def test_qwen3_probabilities_and_every_gradient(monkeypatch, tied):
    torch, hf = _qwen3(tied)
    model = ft.from_hf(hf)
    c = model.config
    assert (c["qk_norm"], c["norm"], c["H_kv"], c["d_attn"], c["tied"]) == (True, "rms", 2, 8, tied)
    x = np.array([3, 14, 15, 9, 26, 5, 3, 5, 8, 9, 7])
    ids = torch.as_tensor(x)[None]
    P_hf32 = torch.softmax(hf(ids).logits[0], dim=-1).detach().numpy().T
    assert rel_err(model(x), P_hf32) <= 1e-5  # unpatched: HF's float32 norms and angles
    _float64_qwen3(monkeypatch)

    def hf_grads(grads):  # (tied: HF's lm_head.weight is its embedding, one parameter)
        back = ft.hf.qwen3.from_ft(grads, model.config)
        if tied:
            back.pop("lm_head.weight", None)
        return back

    hf_float64_errors_within(hf, model, x, hf_grads)


def test_qwen3_greedy_generation_and_batched_decoding_equal_hugging_face(monkeypatch):
    _, hf = _qwen3()
    _float64_qwen3(monkeypatch)
    model = ft.from_hf(hf)
    greedy_and_batched_equal_hf(hf, model, [[5, 17, 2, 9], [3], [8, 8, 1, 20, 4, 6]], 9)


def test_qwen3_round_trips_exactly(tmp_path):
    _, hf = _qwen3()
    round_trips_exactly(hf, tmp_path, "Qwen3ForCausalLM", same_keys=True)


@pytest.mark.parametrize("kw, option", [(dict(use_sliding_window=True, sliding_window=4), "use_sliding_window"),
                                        (dict(attention_bias=True), "attention_bias"),
                                        (dict(hidden_act="gelu"), "hidden_act")])
def test_qwen3_unsupported_options_are_named(kw, option):
    _, hf = _qwen3(**kw)
    with pytest.raises(ValueError, match=option):
        ft.from_hf(hf)


def test_llama_export_leaves_qk_norm_to_qwen3():
    with pytest.raises(ValueError, match="qk_norm|Qwen3|norm"):
        ft.to_hf(make(norm="rms", mlp="gelu"))  # Qwen3 takes it and refuses the GELU MLP by name
    assert type(ft.to_hf(make())).__name__ == "Qwen3ForCausalLM"
