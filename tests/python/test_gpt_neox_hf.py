"""GPT-NeoX (GPTNeoXForCausalLM) <-> DTransformer(block="parallel", positional="rope", rotary_pct=…): the parallel
residual block (docs/variants.md V30) and the RoPE part's partial rotary (V1's rotary_pct) against transformers' own
class — P and every gradient equal in float64 (≤ 1e-10) for randomised weights, ft → HF → ft exact, save_hf/load_hf,
greedy generation token for token, batched decoding = one by one, and the refusals naming the option."""
from __future__ import annotations

import json

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref
from conftest import TOL, hf_float64, hf_random_float64, randomize_theta, rel_err

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers.models.gpt_neox import modeling_gpt_neox  # noqa: E402

from test_hf import _cfg, _grads_as_ft, _same_params  # noqa: E402

V, LMAX = 23, 16
TOL64 = 1e-10


def _neox(**kw):
    cfg = dict(vocab_size=V, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24,
               max_position_embeddings=LMAX, rotary_pct=0.5, rotary_emb_base=500.0, layer_norm_eps=1e-5,
               hidden_act="gelu", tie_word_embeddings=False, bos_token_id=V - 2, eos_token_id=V - 1)
    cfg.update(kw)
    return hf_random_float64(transformers.GPTNeoXForCausalLM, transformers.GPTNeoXConfig(**cfg)).eval()


@pytest.mark.parametrize("kw", [{}, dict(rotary_pct=1.0, hidden_act="gelu_new", tie_word_embeddings=True),
                                dict(rotary_pct=0.25)])
def test_from_hf_P_and_every_gradient_equal_hugging_face(monkeypatch, kw):
    hf_float64(monkeypatch, None, modeling_gpt_neox.GPTNeoXRotaryEmbedding)  # HF's RoPE angles in float64
    hf = _neox(**kw)
    m = ft.from_hf(hf)
    c = m.config
    pct = kw.get("rotary_pct", 0.5)
    assert (c["block"], c["positional"], c["rotary_pct"], c["rope_theta"], c["norm"], c["bias"]) == (
        "parallel", "rope", pct, 500.0, "layer", True)
    assert c["gelu"] == ("tanh" if kw.get("hidden_act") == "gelu_new" else "exact")
    x = np.array([3, 14, 15, 9, 2, 6, 5, 3, 5, 8, 9, 7])
    ids = torch.tensor(x)[None]
    logits = hf(ids).logits[0]
    assert rel_err(m(x), torch.softmax(logits, -1).detach().numpy().T) <= TOL64
    theta = {k: np.array(v) for k, v in m.params.items()}
    want = ref.d_transformer_variant(x, theta, L=2, H=2, positional="rope", rope_theta=500.0, rotary_pct=pct,
                                     block="parallel", gelu=c["gelu"])
    assert rel_err(m(x), want) <= TOL["float64"]
    loss_hf = torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:], reduction="sum")
    hf.zero_grad()
    loss_hf.backward()
    loss, grads = m.loss_and_grad(x)
    assert abs(loss - loss_hf.item()) <= TOL64 * abs(loss_hf.item())
    hf_grads = _grads_as_ft(hf)
    assert set(hf_grads) == set(grads)
    for k, g in hf_grads.items():  # b_k included: RoPE rotates its first rows by each position, so it matters there
        assert rel_err(grads[k], g) <= TOL64, k


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_round_trips_are_exact(dtype, tmp_path):
    m = ft.DTransformer(V, LMAX, 2, 2, 16, 24, positional="rope", rope_theta=300.0, rotary_pct=0.5, block="parallel",
                        gelu="tanh", dtype=dtype, seed=3)
    randomize_theta(m, np.random.default_rng(2))
    hf = ft.to_hf(m)
    assert type(hf).__name__ == "GPTNeoXForCausalLM" and hf.config.rope_parameters["partial_rotary_factor"] == 0.5
    back = ft.from_hf(hf)
    _same_params(m, back)
    assert _cfg(back) == _cfg(m)
    ft.save_hf(m, tmp_path)
    auto, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert type(auto).__name__ == "GPTNeoXForCausalLM"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    loaded = ft.load_hf(tmp_path)
    _same_params(m, loaded)
    assert _cfg(loaded) == _cfg(m)


def test_greedy_generation_token_for_token_and_batched_decoding_one_by_one(monkeypatch):
    hf_float64(monkeypatch, None, modeling_gpt_neox.GPTNeoXRotaryEmbedding)
    hf = _neox()
    m = ft.from_hf(hf)
    prompts = [np.array([1, 2, 3, 4]), np.array([5]), np.array([7, 8, 9, 10, 11, 0, 1])]
    for p in prompts:
        ids = torch.as_tensor(p)[None]
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, min_new_tokens=8,
                          do_sample=False, use_cache=True, pad_token_id=V - 3)[0, len(p):].numpy()
        assert np.array_equal(ft.DInference(8, 0.0)(p, m), out)
        assert np.array_equal(ft.DInference(8, 0.0, cache=False)(p, m), out)
    one_by_one = [ft.DInference(8, 0.0)(p, m) for p in prompts]
    assert all(np.array_equal(b, o) for b, o in zip(ft.DInference(8, 0.0)(prompts, m), one_by_one))


@pytest.mark.parametrize("kw,option", [(dict(use_parallel_residual=False), "use_parallel_residual"),
                                       (dict(attention_bias=False), "attention_bias"),
                                       (dict(hidden_act="relu"), "hidden_act"),
                                       (dict(rope_scaling={"rope_type": "linear", "factor": 2.0}), "rope_type")])
def test_unsupported_hf_options_are_named(kw, option, tmp_path):
    hf = _neox(**kw)
    with pytest.raises(ValueError, match=option):
        ft.from_hf(hf)
    ft.save_hf(ft.from_hf(_neox()), tmp_path)  # a directory whose config.json says the same
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, **kw}))
    with pytest.raises(ValueError, match=option):
        ft.load_hf(tmp_path)


@pytest.mark.parametrize("bad", [[], 0, "", False])
def test_rope_parameters_that_are_no_object_are_named(bad, tmp_path):
    """rope_parameters read as LLaMA reads them (hf/_common.py's one reader): only an object (or null) is taken."""
    ft.save_hf(ft.from_hf(_neox()), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "rope_parameters": bad}))
    with pytest.raises(ValueError, match="rope_parameters = .* is not an object of RoPE parameters"):
        ft.load_hf(tmp_path)


def test_a_rotary_share_ft_cannot_rotate_is_named():
    hf = _neox(rotary_pct=0.1)  # ⌊8 · 0.1⌋ = 0 rows
    with pytest.raises(ValueError, match="rotary_pct"):
        ft.from_hf(hf)


def test_exports_need_every_gpt_neox_option():
    base = dict(positional="rope", block="parallel")
    for kw, match in [(dict(norm="rms"), "norm='rms'"), (dict(bias=False), "bias=False"),
                      (dict(mlp="swiglu"), "mlp='swiglu'"), (dict(H_kv=1), "H_kv"),
                      (dict(embed_dropout=0.1), "hidden_dropout")]:
        m = ft.DTransformer(V, LMAX, 1, 2, 8, 12, **{**base, **kw})
        with pytest.raises(ValueError, match=match):
            ft.to_hf(m)
    with pytest.raises(ValueError, match="block='parallel'"):  # learned positions: GPT-2's, which has no such layer
        ft.to_hf(ft.DTransformer(V, LMAX, 1, 2, 8, 12, block="parallel"))
