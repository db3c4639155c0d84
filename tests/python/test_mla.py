"""V10 multi-head latent attention (DeepSeek-V2/V3's MLA; docs/variants.md V10): the core against the numpy
transcription (reference.py mla_attention), finite differences on every latent parameter, DeepseekV3ForCausalLM
(every weight random, float64: P, every gradient, greedy generation with the latent cache), the cache's size
per token, and the options' checks."""
import math
import os

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as R
from conftest import hf_float64, hf_random_float64, numeric_grad, rel_err

V, LMAX, L, H, D_E, D_MLP = 29, 24, 2, 4, 24, 36


def _mla(dtype="float64", q_lora_rank=9, d_attn=7, d_mid=5, kv_lora_rank=6, rope=4, theta=300.0, seed=0, **kw):
    m = ft.DTransformer(V, LMAX, L, H, D_E, D_MLP, d_attn=d_attn, d_mid=d_mid, positional="rope", rope_theta=theta,
                        kv_lora_rank=kv_lora_rank, q_lora_rank=q_lora_rank, qk_rope_head_dim=rope, mlp="swiglu",
                        bias=False, norm="rms", eps=1e-5, dtype=dtype, **kw)
    rng = np.random.default_rng(seed)
    for k, v in m.params.items():  # every parameter random (γ's near 1, not their init)
        v[...] = 1.0 + 0.3 * rng.normal(size=v.shape) if "gamma" in k else rng.normal(size=v.shape) * 0.4
    return m


def _ref(m, x):
    c = m.config
    P = {k: np.asarray(v, dtype=np.float64) for k, v in m.params.items()}
    return R.d_transformer_variant(x, P, L=c["L"], H=c["H"], norm="rms", eps=c["eps"], positional="rope",
                                   rope_theta=c["rope_theta"], mlp="swiglu", qk_rope_head_dim=c["qk_rope_head_dim"])


X = np.array([3, 14, 15, 9, 26, 5, 3, 5, 8, 9, 7, 9, 3, 2])


@pytest.mark.parametrize("q_lora_rank", [9, None])
@pytest.mark.parametrize("dtype,tol", [("float64", 1e-12), ("float32", 1e-5)])
def test_core_equals_reference(q_lora_rank, dtype, tol):
    m = _mla(dtype, q_lora_rank=q_lora_rank)
    P, P_ref = m(X), _ref(m, X)
    assert P.shape == P_ref.shape == (V, len(X))
    assert np.abs(P - P_ref).max() <= tol * np.abs(P_ref).max()


def test_param_names_and_shapes():
    m = _mla(q_lora_rank=9)
    a = "layers.0.attn."
    shapes = {k[len(a):]: v.shape for k, v in m.params.items() if k.startswith(a)}
    # d_attn = d_N + d_R = 3 + 4, d_v = 5, d_c = 6, d_c′ = 9
    assert shapes == {"W_dq": (9, D_E), "gamma_q": (9,), "W_uq": (H, 7, 9), "W_dkv": (6 + 4, D_E), "gamma_kv": (6,),
                      "W_ukv": (H, 3 + 5, 6), "W_o": (D_E, H * 5)}
    m2 = _mla(q_lora_rank=None)
    assert "layers.0.attn.W_q" in m2.params and "layers.0.attn.W_dq" not in m2.params


@pytest.mark.parametrize("q_lora_rank", [9, None])
def test_every_latent_parameter_against_finite_differences(q_lora_rank):
    m = _mla(q_lora_rank=q_lora_rank, seed=1)
    x = X[:9]
    loss, g = m.loss_and_grad(x)
    assert math.isclose(loss, R.d_variant_loss(x, {k: np.asarray(v) for k, v in m.params.items()}, L=L, H=H,
                                               norm="rms", eps=1e-5, positional="rope", rope_theta=300.0,
                                               mlp="swiglu", qk_rope_head_dim=4), rel_tol=1e-12)
    rng = np.random.default_rng(5)
    names = [k for k in m.params if ".attn." in k]
    assert len(names) == L * (7 if q_lora_rank else 5)
    h = 1e-6
    for name in names:
        p = m.params[name]
        entries = [tuple(int(rng.integers(s)) for s in p.shape) for _ in range(3)]  # three random entries of each
        for i, fd in zip(entries, numeric_grad(lambda: m.loss(x), p, h, entries)):
            assert abs(fd - g[name][i]) <= 1e-6 * max(1.0, abs(fd)), (name, i, fd, g[name][i])


def test_ragged_batch_equals_each_sequence():
    m = _mla()
    a, b = X[:5], X[3:14]
    Pa, Pb = m([a, b])
    assert np.abs(Pa - m(a)).max() <= 1e-13 and np.abs(Pb - m(b)).max() <= 1e-13
    la, _ = m.loss_and_grad(a)
    lb, _ = m.loss_and_grad(b)
    lab, _ = m.loss_and_grad([a, b])
    assert math.isclose(lab, la + lb, rel_tol=1e-12)


def test_tiled_attention_equals_literal():
    lit, til = _mla(attention_impl="literal"), _mla(attention_impl="tiled")
    assert np.abs(lit(X) - til(X)).max() <= 1e-13
    _, g1 = lit.loss_and_grad(X)
    _, g2 = til.loss_and_grad(X)
    for k in g1:
        assert np.abs(g1[k] - g2[k]).max() <= 1e-12 * max(1.0, np.abs(g1[k]).max()), k


def test_cached_decoding_equals_the_full_forward():
    m = _mla()
    gen = ft.DInference(l_gen=8, tau=0.0)(X[:6], m)  # greedy, with the latent cache
    x = list(X[:6])
    for _ in range(8):  # greedy by full forward passes (no cache)
        x.append(int(np.argmax(m(np.array(x))[:, -1])))
    assert list(gen) == x[6:]


def _kv_bytes_numbers():
    mha = ft.DTransformer(V, LMAX, L, H, D_E, D_MLP, positional="rope", mlp="swiglu", bias=False, norm="rms")
    gqa = ft.DTransformer(V, LMAX, L, H, D_E, D_MLP, positional="rope", mlp="swiglu", bias=False, norm="rms", H_kv=2)
    mla = ft.DTransformer(V, LMAX, L, H, D_E, D_MLP, positional="rope", mlp="swiglu", bias=False, norm="rms",
                          kv_lora_rank=4, qk_rope_head_dim=2)
    return mha, gqa, mla


def test_kv_cache_bytes_per_token():
    mha, gqa, mla = _kv_bytes_numbers()
    d_h = D_E // H
    # per layer and token: MHA keeps K and V of every head, GQA of H_kv heads, MLA the latent [Ĉ_KV; K_R]
    assert ft.kv_cache_bytes_per_token(mha) == L * 2 * H * d_h * 4
    assert ft.kv_cache_bytes_per_token(gqa) == L * 2 * 2 * d_h * 4
    assert ft.kv_cache_bytes_per_token(mla) == L * (4 + 2) * 4
    assert ft.kv_cache_bytes_per_token(_mla()) == L * (6 + 4) * 8


@pytest.mark.parametrize("kw,msg", [
    (dict(kv_lora_rank=0, qk_rope_head_dim=2), "kv_lora_rank"),
    (dict(kv_lora_rank=4, qk_rope_head_dim=2, q_lora_rank=0), "q_lora_rank"),
    (dict(kv_lora_rank=4), "qk_rope_head_dim"),
    (dict(kv_lora_rank=4, qk_rope_head_dim=3), "qk_rope_head_dim"),
    (dict(kv_lora_rank=4, qk_rope_head_dim=8), "qk_rope_head_dim"),
    (dict(q_lora_rank=4), "kv_lora_rank"),
    (dict(kv_lora_rank=4, qk_rope_head_dim=2, H_kv=2), "H_kv"),
    (dict(kv_lora_rank=4, qk_rope_head_dim=2, bias=True), "bias"),
    (dict(kv_lora_rank=4, qk_rope_head_dim=2, positional="learned"),
     r"kv_lora_rank \(latent attention\) rotates its shared key part with RoPE: positional='rope'$"),
    (dict(kv_lora_rank=4, qk_rope_head_dim=2, positional="alibi"),
     r"kv_lora_rank \(latent attention\) rotates its shared key part with RoPE: positional='rope'$"),
    (dict(kv_lora_rank=4, qk_rope_head_dim=2, sliding_window=4), "sliding_window"),
])
def test_bad_options_are_named(kw, msg):
    base = dict(positional="rope", mlp="swiglu", bias=False, norm="rms")
    with pytest.raises(ValueError, match=msg):
        ft.DTransformer(V, LMAX, L, H, D_E, D_MLP, **{**base, **kw})


# ----------------------------------- DeepseekV3ForCausalLM ---------------------------------------------
def _float64_deepseek(monkeypatch):
    """HF's float32 RMSnorm and RoPE angles in float64 (conftest.hf_float64), as for LLaMA in test_variants.py."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as md

    hf_float64(monkeypatch, md.DeepseekV3RMSNorm, md.DeepseekV3RotaryEmbedding)


def _deepseek(q_lora_rank=9, interleave=True, **kw):
    import transformers

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cfg = dict(vocab_size=V, hidden_size=D_E, intermediate_size=D_MLP, num_hidden_layers=L, num_attention_heads=H,
               num_key_value_heads=H, kv_lora_rank=6, q_lora_rank=q_lora_rank, qk_rope_head_dim=4,
               qk_nope_head_dim=3, v_head_dim=5, first_k_dense_replace=L, max_position_embeddings=LMAX,
               rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 300.0},
               rope_interleave=interleave, tie_word_embeddings=False, attn_implementation="sdpa",
               bos_token_id=V - 2, eos_token_id=V - 1, pad_token_id=None)
    cfg.update(kw)
    # every weight random (the norms' too)
    return hf_random_float64(transformers.DeepseekV3ForCausalLM, transformers.DeepseekV3Config(**cfg), 0.5).eval()


@pytest.mark.parametrize("q_lora_rank,interleave", [(9, True), (None, True), (9, False)])
def test_deepseek_v3_P_and_every_gradient(monkeypatch, q_lora_rank, interleave):
    import torch

    _float64_deepseek(monkeypatch)
    hf = _deepseek(q_lora_rank, interleave)
    m = ft.from_hf(hf)
    c = m.config
    assert (c["kv_lora_rank"], c["q_lora_rank"], c["qk_rope_head_dim"], c["d_attn"], c["d_mid"]) == (6, q_lora_rank, 4, 7, 5)
    assert m.params["W_e"].dtype == np.float64
    ids = torch.as_tensor(X)[None]
    logits = hf(ids).logits[0]
    P_hf = torch.softmax(logits, dim=-1).detach().numpy().T
    P = m(X)
    assert np.abs(P - P_hf).max() <= 1e-12 * np.abs(P_hf).max()
    # Algorithm 13's loss (summed next-token log-loss) and its gradient against autograd, every tensor
    loss_hf = torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:], reduction="sum")
    hf.zero_grad()
    loss_hf.backward()
    loss, g = m.loss_and_grad(X)
    assert math.isclose(loss, loss_hf.item(), rel_tol=1e-12)
    G_hf = {k: v.grad for k, v in hf.named_parameters()}
    from formal_transformers.hf import deepseek as hfmod  # ft's gradients in HF's names and layout (the importer's map)

    hp = {**m.config, "_rope_interleave": interleave}
    for l in range(L):
        for a, b, heads in hfmod.layer_table(hp):
            v = hfmod.rope_rows(hp, b, g[f"layers.{l}.{b}"], True) if interleave else g[f"layers.{l}.{b}"]
            v = v.reshape(-1, *v.shape[2:]) if heads else v
            gh = G_hf.pop(f"model.layers.{l}.{a}").numpy()
            assert np.abs(v - gh).max() <= 1e-12 * max(1.0, np.abs(gh).max()), (l, a)
    for k, name, tr in (("model.embed_tokens.weight", "W_e", True), ("model.norm.weight", "gamma", False),
                        ("lm_head.weight", "W_u", False)):
        gh = G_hf.pop(k).numpy()
        v = g[name].T if tr else g[name]
        assert np.abs(v - gh).max() <= 1e-12 * max(1.0, np.abs(gh).max()), k
    assert not G_hf  # every HF tensor compared


@pytest.mark.parametrize("q_lora_rank,tied", [(9, False), (None, True)])
def test_deepseek_v3_round_trip_is_exact(q_lora_rank, tied, tmp_path):
    m = _mla(q_lora_rank=q_lora_rank, tied=tied)
    hf = ft.to_hf(m)
    assert type(hf).__name__ == "DeepseekV3ForCausalLM" and hf.config.first_k_dense_replace == L
    assert hf.config.q_lora_rank == q_lora_rank and hf.config.tie_word_embeddings == tied
    ft.save_hf(m, tmp_path)  # and through files (config.json + safetensors)
    for back in (ft.from_hf(hf), ft.load_hf(tmp_path)):
        assert back.config == m.config
        for k, v in m.params.items():
            assert np.array_equal(back.params[k], v), k


def test_deepseek_v3_greedy_generation_equals_hf(monkeypatch):
    import torch

    _float64_deepseek(monkeypatch)
    hf = _deepseek(9)
    m = ft.from_hf(hf)
    prompt = X[:5]
    out = hf.generate(torch.as_tensor(prompt)[None], max_new_tokens=12, do_sample=False, use_cache=True,
                      eos_token_id=None, pad_token_id=0)[0, len(prompt):].numpy()
    ours = ft.DInference(l_gen=12, tau=0.0)(prompt, m)
    assert list(ours) == list(out)


@pytest.mark.parametrize("edit,option", [
    (dict(first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=8, n_group=1,
          topk_group=1), "first_k_dense_replace"),
    (dict(attention_bias=True), "attention_bias"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 300.0, "factor": 2.0,
                           "original_max_position_embeddings": 12}), "rope_type"),
    (dict(hidden_act="gelu"), "hidden_act"),
])
def test_deepseek_v3_unsupported_options_are_named(edit, option):
    hf = _deepseek(9, **edit)
    with pytest.raises(ValueError, match=option):
        ft.from_hf(hf)


def test_save_load_round_trip(tmp_path):
    m = _mla(q_lora_rank=None)
    ft.save(m, tmp_path / "mla.safetensors")
    back = ft.load(tmp_path / "mla.safetensors")
    assert back.config == m.config and back.config["kv_lora_rank"] == 6 and back.config["q_lora_rank"] is None
    assert np.array_equal(back(X), m(X))


def test_speculative_decoding_with_the_latent_cache():
    target, draft = _mla(seed=0), _mla(seed=7, kv_lora_rank=3, q_lora_rank=None)
    greedy = ft.DInference(l_gen=10, tau=0.0)(X[:4], target)
    # the rejected drafts are rolled back in both latent caches (Decoder::rollback)
    spec = ft.SpeculativeInference(10, 3, 0.0, seed=0)(X[:4], target, draft)
    assert list(spec) == list(greedy)


def test_float32_gradients_follow_float64():
    m64, m32 = _mla("float64"), _mla("float32")
    _, g64 = m64.loss_and_grad(X)
    _, g32 = m32.loss_and_grad(X)
    for k in g64:
        assert np.abs(g32[k] - g64[k]).max() <= 1e-4 * max(1.0, np.abs(g64[k]).max()), k


def test_tied_config_with_a_differing_lm_head_loads_as_transformers_uses_it(monkeypatch, tmp_path):
    """tie_word_embeddings: true beside the file's own lm_head.weight, which differs from embed_tokens: transformers 5
    does not tie them and uses the file's lm_head; load_hf does the same (it used to drop the tensor)."""
    import json

    import torch
    import transformers

    hf = _deepseek()
    hf.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    _float64_deepseek(monkeypatch)
    theirs = transformers.DeepseekV3ForCausalLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
    model = ft.load_hf(tmp_path)
    assert model.config["tied"] is False
    P_hf = torch.softmax(theirs(torch.as_tensor(X)[None]).logits[0], dim=-1).detach().numpy().T
    assert rel_err(model(X), P_hf) <= 1e-12
