"""Qwen2ForCausalLM <-> DTransformer (hf/qwen2.py; the part V20 qkv_bias). HF's float32 steps patched to float64 for
the exactness check: Qwen2RMSNorm and Qwen2RotaryEmbedding (conftest.hf_float64)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import formal_transformers as ft  # noqa: E402
from conftest import hf_float64  # noqa: E402
from hf_family_checks import (TOL64, assert_same_params, batched_equals_one_by_one, decoder_errors,  # noqa: E402
                              greedy_equals_hf, randomise, round_trips)

V, LMAX = 23, 16
X = [3, 14, 15, 9, 2, 6, 5, 3, 5, 8]


def qwen2(**kw):
    cfg = dict(vocab_size=V, hidden_size=16, intermediate_size=20, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=LMAX, rms_norm_eps=1e-6, rope_theta=300.0,
               tie_word_embeddings=False, bos_token_id=V - 2, eos_token_id=V - 1)
    cfg.update(kw)
    return randomise(transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**cfg)).to(torch.float64), seed=1)


def float64_qwen2(monkeypatch):
    from transformers.models.qwen2 import modeling_qwen2 as mq

    hf_float64(monkeypatch, mq.Qwen2RMSNorm, mq.Qwen2RotaryEmbedding)


def errors(monkeypatch, **kw):
    float64_qwen2(monkeypatch)
    hf = qwen2(**kw)
    return hf, ft.from_hf(hf), decoder_errors(hf, ft.from_hf(hf), X)


@pytest.mark.parametrize("kw", [dict(), dict(tie_word_embeddings=True),
                                dict(use_sliding_window=True, sliding_window=3, max_window_layers=0)])
def test_P_and_every_gradient_equal_hugging_face(monkeypatch, kw):
    hf, m, (e_P, e_loss, e_grad) = errors(monkeypatch, **kw)
    c = m.config
    assert (c["positional"], c["H_kv"], c["mlp"], c["bias"], c["qkv_bias"], c["norm"]) == ("rope", 2, "swiglu", False,
                                                                                           True, "rms")
    assert c["sliding_window"] == kw.get("sliding_window") and c["tied"] == kw.get("tie_word_embeddings", False)
    assert np.abs(m.params["layers.0.attn.b_q"]).max() > 0.1  # the biases came across
    assert max(e_P, e_loss, e_grad) <= TOL64, (e_P, e_loss, e_grad)


def test_round_trips_are_exact(monkeypatch, tmp_path):
    hf = qwen2()
    m = ft.from_hf(hf)
    hf2 = round_trips(m, tmp_path)
    assert type(hf2).__name__ == "Qwen2ForCausalLM"
    s1, s2 = hf.state_dict(), hf2.state_dict()
    assert set(s1) == set(s2) and all(torch.equal(s1[k], s2[k]) for k in s1)  # HF → ft → HF exact too
    w = ft.from_hf(qwen2(use_sliding_window=True, sliding_window=5, max_window_layers=0))
    assert round_trips(w, tmp_path / "w").config.sliding_window == 5
    float64_qwen2(monkeypatch)
    assert decoder_errors(hf2, m, X)[0] <= TOL64  # the exported model computes ft's function


def test_greedy_generation_and_batched_decoding(monkeypatch):
    float64_qwen2(monkeypatch)
    hf = qwen2()
    m = ft.from_hf(hf)
    greedy_equals_hf(hf, m, [5, 17, 2, 9], 12)  # to max_position_embeddings (16)
    batched_equals_one_by_one(m, [[5, 17, 2, 9], [1], [4, 4, 8, 0, 3, 7, 1]], 6)


@pytest.mark.parametrize("kw,option", [
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(use_sliding_window=True, sliding_window=4, max_window_layers=1), "layer_types"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 2.0, "rope_theta": 300.0,
                        "original_max_position_embeddings": 8}), "rope_type"),
])
def test_unsupported_options_are_named(kw, option):
    with pytest.raises(ValueError, match=option):
        ft.from_hf(qwen2(**kw))


def test_exports_need_the_qwen2_options():
    m = ft.DTransformer(V, LMAX, 1, 2, 8, 12, positional="rope", mlp="swiglu", bias=False, qkv_bias=True, norm="layer")
    with pytest.raises(ValueError, match="norm"):
        ft.to_hf(m)
    llama = ft.DTransformer(V, LMAX, 1, 2, 8, 12, positional="rope", mlp="swiglu", bias=False, norm="rms")
    assert type(ft.to_hf(llama)).__name__ == "LlamaForCausalLM"  # no qkv_bias: LLaMA's class
    with pytest.raises(ValueError, match="qkv_bias"):
        ft.to_hf(llama, hf_class="Qwen2ForCausalLM")
    with pytest.raises(ValueError, match="qkv_bias"):
        ft.to_hf(ft.from_hf(qwen2()), hf_class="LlamaForCausalLM")


def test_load_hf_reads_save_pretrained(tmp_path):
    hf = qwen2(tie_word_embeddings=True)
    hf.save_pretrained(tmp_path)
    assert_same_params(ft.from_hf(hf), ft.load_hf(tmp_path))
