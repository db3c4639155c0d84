"""Phi3ForCausalLM <-> DTransformer (hf/phi3.py: LLaMA's function, the fused qkv_proj and gate_up_proj split and
joined). HF's float32 steps patched to float64 for the exactness check: Phi3RMSNorm and Phi3RotaryEmbedding
(conftest.hf_float64)."""
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


def phi3(**kw):
    cfg = dict(vocab_size=V, hidden_size=16, intermediate_size=20, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=LMAX, original_max_position_embeddings=LMAX,
               rms_norm_eps=1e-6, rope_theta=300.0, tie_word_embeddings=False, bos_token_id=V - 2, eos_token_id=V - 1,
               pad_token_id=0, resid_pdrop=0.0, attention_dropout=0.0)
    cfg.update(kw)
    return randomise(transformers.Phi3ForCausalLM(transformers.Phi3Config(**cfg)).to(torch.float64), seed=2)


def float64_phi3(monkeypatch):
    from transformers.models.phi3 import modeling_phi3 as mp

    hf_float64(monkeypatch, mp.Phi3RMSNorm, mp.Phi3RotaryEmbedding)


@pytest.mark.parametrize("kw", [dict(), dict(tie_word_embeddings=True, num_key_value_heads=4), dict(sliding_window=3)])
def test_P_and_every_gradient_equal_hugging_face(monkeypatch, kw):
    float64_phi3(monkeypatch)
    hf = phi3(**kw)
    m = ft.from_hf(hf)
    c = m.config
    assert (c["positional"], c["mlp"], c["bias"], c["norm"], c["rope_theta"]) == ("rope", "swiglu", False, "rms", 300.0)
    assert c["H_kv"] == kw.get("num_key_value_heads", 2) and c["sliding_window"] == kw.get("sliding_window")
    e_P, e_loss, e_grad = decoder_errors(hf, m, X)
    assert max(e_P, e_loss, e_grad) <= TOL64, (e_P, e_loss, e_grad)


def test_the_fused_tensors_split_as_hf_slices_them():
    hf = phi3()
    m = ft.from_hf(hf)
    qkv = hf.model.layers[1].self_attn.qkv_proj.weight.detach().numpy()
    gu = hf.model.layers[1].mlp.gate_up_proj.weight.detach().numpy()
    assert np.array_equal(m.params["layers.1.attn.W_q"].reshape(16, 16), qkv[:16])
    assert np.array_equal(m.params["layers.1.attn.W_v"].reshape(8, 16), qkv[24:])
    assert np.array_equal(m.params["layers.1.W_gate"], gu[:20]) and np.array_equal(m.params["layers.1.W_mlp1"], gu[20:])


def test_round_trips_are_exact(monkeypatch, tmp_path):
    hf = phi3(resid_pdrop=0.1, attention_dropout=0.05)
    m = ft.from_hf(hf)
    assert (m.config["resid_dropout"], m.config["attn_dropout"]) == (0.1, 0.05)
    hf2 = round_trips(m, tmp_path)  # resid_dropout: only Phi-3's class expresses it
    assert type(hf2).__name__ == "Phi3ForCausalLM" and hf2.config.resid_pdrop == 0.1
    s1, s2 = hf.state_dict(), hf2.state_dict()
    assert set(s1) == set(s2) and all(torch.equal(s1[k], s2[k]) for k in s1)  # HF → ft → HF exact too
    plain = ft.from_hf(phi3())  # without dropout: LLaMA's class computes it; Phi-3's when asked
    assert type(ft.to_hf(plain)).__name__ == "LlamaForCausalLM"
    hf3 = round_trips(plain, tmp_path / "asked", hf_class="Phi3ForCausalLM")
    w = ft.from_hf(phi3(sliding_window=5))
    assert type(round_trips(w, tmp_path / "w", hf_class="Phi3ForCausalLM")).__name__ == "Phi3ForCausalLM"
    float64_phi3(monkeypatch)
    assert decoder_errors(hf3, plain, X)[0] <= TOL64  # the exported model computes ft's function


def test_greedy_generation_and_batched_decoding(monkeypatch):
    float64_phi3(monkeypatch)
    hf = phi3()
    m = ft.from_hf(hf)
    greedy_equals_hf(hf, m, [5, 17, 2, 9], 12)
    batched_equals_one_by_one(m, [[5, 17, 2, 9], [1], [4, 4, 8, 0, 3, 7, 1]], 6)


@pytest.mark.parametrize("kw,option", [
    (dict(rope_scaling={"type": "longrope", "short_factor": [1.0, 1.0], "long_factor": [2.0, 2.0]}), "rope_type"),
    (dict(partial_rotary_factor=0.5), "partial_rotary_factor"),
    (dict(hidden_act="gelu"), "hidden_act"),
])
def test_unsupported_options_are_named(kw, option):
    with pytest.raises(ValueError, match=option):
        ft.from_hf(phi3(**kw))


def test_exports_refuse_what_phi3_cannot_express():
    m = ft.DTransformer(V, LMAX, 1, 2, 8, 12, positional="rope", mlp="swiglu", bias=False, norm="rms", embed_dropout=0.1,
                        resid_dropout=0.1)
    with pytest.raises(ValueError, match="embed_dropout"):
        ft.to_hf(m)
    gpt = ft.DTransformer(V, LMAX, 1, 2, 8, 12)
    with pytest.raises(ValueError, match="positional"):
        ft.to_hf(gpt, hf_class="Phi3ForCausalLM")


def test_load_hf_reads_save_pretrained(tmp_path):
    hf = phi3()
    hf.save_pretrained(tmp_path)
    assert_same_params(ft.from_hf(hf), ft.load_hf(tmp_path))
