"""The decoder variants of docs/variants.md (RoPE, ALiBi, grouped-query attention, SwiGLU, bias-free maps):
forward vs reference.py, every gradient vs PyTorch autograd of an independent transcription
(torch_variants.py), cached decoding vs the full forward, the options' equivalences, Hugging Face's
LlamaForCausalLM with its weights copied in, bad input."""
from __future__ import annotations

import os

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref
from conftest import TOL, hf_float64, hf_random_float64, make_decoder, randomize_theta, reference_hp, rel_err, torch_or_skip

BASE = dict(n_vocab=19, l_max=12, L=2, H=4, d_e=24, d_mlp=20)
OPTIONS = {
    "rope": dict(positional="rope"),
    "rope_theta500": dict(positional="rope", rope_theta=500.0),
    "alibi": dict(positional="alibi"),
    "alibi_H6": dict(positional="alibi", H=6),  # slopes of a non-power-of-2 H (listing V2 line 3)
    "gqa": dict(H_kv=2),
    "mqa": dict(H_kv=1),
    "swiglu": dict(mlp="swiglu"),
    "no_bias": dict(bias=False),
    "llama": dict(positional="rope", H_kv=2, mlp="swiglu", bias=False, norm="rms"),
    "alibi_all": dict(positional="alibi", H=6, H_kv=3, mlp="swiglu", bias=False, norm="rms", tied=True),
    "scalenorm": dict(norm="scale"),                                     # V12
    "fixnorm": dict(fixnorm=True),                                       # V13
    "scale_fix_tied": dict(norm="scale", fixnorm=True, tied=True, eps=0.0),  # V12 + V13, the paper's eps = 0
    "parallel": dict(block="parallel"),                                  # V30 (GPT-NeoX's parallel residual)
    "neox": dict(block="parallel", positional="rope", H_kv=2, gelu="tanh", rotary_pct=0.67),  # V1 on 4 of 6 rows
    "rope_partial": dict(positional="rope", rotary_pct=0.34),            # ⌊6 · 0.34⌋ = 2 of d_attn = 6 rows
    "sandwich": dict(block="sandwich"),                                  # V27 (Gemma's sandwich layers, layer_norm's β′)
}
REF_KEYS = ("norm", "positional", "rope_theta", "mlp", "fixnorm", "eps", "block", "gelu", "rotary_pct")
BATCH = [[3, 1, 4, 1, 5, 9, 2, 6, 5], [8, 9, 7, 9, 3]]  # ragged: RoPE/ALiBi positions restart per sequence


def make(opts, dtype="float64", seed=3, **extra):
    return make_decoder(BASE, opts, dtype, seed, **extra)


def hp_of(opts):
    return reference_hp(BASE, opts, REF_KEYS)


def randomize(model, rng, tied=False):
    """Every parameter random (conftest.randomize_theta); W_u left alone when tied (it is W_eᵀ)."""
    return randomize_theta(model, rng, skip=("W_u",) if tied else ())


@pytest.fixture(scope="module")
def tv():
    torch_or_skip()
    import torch_variants

    return torch_variants


# ---------------------------------------------------------------------------------------------------
# Forward vs reference.py, gradients vs autograd


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", list(OPTIONS))
def test_forward_matches_reference(name, dtype):
    opts = OPTIONS[name]
    model = make(opts, dtype)
    theta = randomize(model, np.random.default_rng(1), opts.get("tied", False))
    P = model(BATCH)
    for x, Pb in zip(BATCH, P):
        want = ref.d_transformer_variant(x, theta, **hp_of(opts))
        assert rel_err(Pb, want) <= TOL[dtype], name


@pytest.mark.parametrize("name", list(OPTIONS))
def test_every_gradient_matches_torch_autograd(tv, name):
    opts = OPTIONS[name]
    tied = opts.get("tied", False)
    model = make(opts)
    theta = randomize(model, np.random.default_rng(2), tied)
    loss, grads = model.loss_and_grad(BATCH)
    t_loss, t_grads = tv.loss_and_grad(theta, BATCH, **hp_of(opts))
    assert abs(loss - t_loss) <= 1e-10 * abs(t_loss)
    assert set(t_grads) == set(grads) - ({"W_u"} if tied else set())
    scale = max(np.abs(g).max() for g in t_grads.values())
    for k, g in t_grads.items():
        if k.endswith(".b_k") and opts.get("positional") != "rope":
            # exactly 0 in exact arithmetic (b_kᵀq_t is added to a whole column of S; the softmax ignores it):
            # only rounding noise on both sides. With RoPE, b_k is rotated per position and matters.
            assert np.abs(grads[k]).max() <= 1e-12 * scale
            continue
        assert rel_err(grads[k], g) <= 1e-8, (name, k, rel_err(grads[k], g))


def test_reference_and_torch_transcription_agree_on_the_loss(tv):
    opts = OPTIONS["llama"]
    model = make(opts)
    theta = randomize(model, np.random.default_rng(3))
    assert abs(ref.d_variant_loss(BATCH, theta, **hp_of(opts)) - tv.loss_and_grad(theta, BATCH, **hp_of(opts))[0]) \
        <= 1e-11 * abs(ref.d_variant_loss(BATCH, theta, **hp_of(opts)))


# ---------------------------------------------------------------------------------------------------
# Cached decoding (Algorithm 14 with the KV cache) equals the full forward, token for token


@pytest.mark.parametrize("name", list(OPTIONS))
def test_cached_decoding_equals_full_forward(name):
    opts = OPTIONS[name]
    model = make(opts)
    randomize(model, np.random.default_rng(4), opts.get("tied", False))
    prompt = [1, 2, 3, 4, 5]
    # 16 new tokens: the context passes l_max = 12, so the window slides and the caches are refilled
    for tau in (0.0, 1.0):
        cached = ft.DInference(16, tau, seed=7, cache=True)(prompt, model)
        full = ft.DInference(16, tau, seed=7, cache=False)(prompt, model)
        assert list(cached) == list(full), (name, tau)


@pytest.mark.parametrize("name", ["rope", "alibi", "alibi_H6", "llama", "alibi_all"])
@pytest.mark.parametrize("cache", [True, False])
def test_decoding_past_l_max_in_both_contexts_matches_the_reference(name, cache):
    # Algorithm 14 run to 3 × ℓ_max (prompt 5 + 31 new tokens, ℓ_max 12), greedy, against reference.py's
    # listing: context="full" sees the whole sequence (no table of positions), "window" the last ℓ_max
    opts = OPTIONS[name]
    model = make(opts)
    theta = randomize(model, np.random.default_rng(6), opts.get("tied", False))
    prompt, l_gen = [1, 2, 3, 4, 5], 3 * BASE["l_max"] - 5
    forward = lambda c: ref.d_transformer_variant(c, theta, **hp_of(opts))  # noqa: E731
    ys = {}
    for context, l_max in (("full", None), ("window", BASE["l_max"])):
        ys[context] = ft.DInference(l_gen, 0.0, cache=cache, context=context)(prompt, model)
        expected = ref.d_inference(prompt, forward, l_gen=l_gen, tau=0.0, l_max=l_max)
        assert list(ys[context]) == list(expected), (name, context)
    # the check can tell the contexts apart: past ℓ_max they give another next-token distribution
    seq = np.concatenate([prompt, ys["full"]])
    assert np.abs(forward(seq)[:, -1] - forward(seq[-BASE["l_max"]:])[:, -1]).max() > 1e-6
    auto = ft.DInference(l_gen, 0.0, cache=cache)(prompt, model)  # "auto": full for ALiBi, window for RoPE
    assert list(auto) == list(ys["full" if opts["positional"] == "alibi" else "window"])


# ---------------------------------------------------------------------------------------------------
# Scoring past ℓ_max: RoPE and ALiBi have no table of positions, so P, logits, loss and loss_and_grad
# accept any length ("train short, test long"); learned and sinusoidal tables keep ℓ ≤ ℓ_max

LONG = ["rope", "alibi", "alibi_H6", "llama", "alibi_all"]  # llama/alibi_all: GQA + SwiGLU + RMSnorm + no bias


@pytest.mark.parametrize("name", LONG)
def test_scoring_past_l_max_matches_the_reference(name):
    opts = OPTIONS[name]
    model = make(opts)
    theta = randomize(model, np.random.default_rng(8), opts.get("tied", False))
    rng = np.random.default_rng(9)
    x = rng.integers(0, BASE["n_vocab"], 3 * BASE["l_max"])
    short = x[:5]
    assert rel_err(model(x), ref.d_transformer_variant(x, theta, **hp_of(opts))) <= 1e-12
    assert rel_err(model.logits(x), ref.d_transformer_variant(x, theta, logits=True, **hp_of(opts))) <= 1e-12
    # a ragged batch of a long and a short sequence: each sequence's positions start at 0
    P = model([x, short])
    assert rel_err(P[1], ref.d_transformer_variant(short, theta, **hp_of(opts))) <= 1e-12
    want = ref.d_variant_loss([x, short], theta, **hp_of(opts))
    assert abs(model.loss([x, short]) - want) <= 1e-12 * abs(want)
    loss, _ = model.loss_and_grad(x)
    assert abs(loss - ref.d_variant_loss(x, theta, **hp_of(opts))) <= 1e-12 * abs(loss)
    # the attention weights of the last forward (loss_and_grad's) have the long sequence's shape
    H = opts.get("H", BASE["H"])
    assert model.attention_weights(BASE["L"] - 1, 0).shape == (H, len(x), len(x))
    model(short)
    assert model.attention_weights(0, 0).shape == (H, len(short), len(short))


@pytest.mark.parametrize("opts", [dict(positional="rope"), dict(positional="alibi"),
                                  dict(positional="rope", H_kv=1, mlp="swiglu", bias=False, norm="rms")])
def test_loss_and_grad_past_l_max_matches_finite_differences(opts):
    from conftest import assert_grads_match_fd

    model = ft.DTransformer(7, 4, 1, 2, 8, 6, dtype="float64", seed=1, **opts)
    randomize(model, np.random.default_rng(10))
    x = [3, 1, 4, 1, 5, 6, 2, 6, 5, 3, 0]  # ℓ = 11 > ℓ_max = 4
    _, grads = model.loss_and_grad(x)
    assert_grads_match_fd(model, grads, lambda: model.loss(x), b_k_zero=opts["positional"] != "rope", label=opts)


@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_positions_from_a_table_still_refuse_sequences_past_l_max(positional):
    model = make({"positional": positional})
    x = list(range(BASE["l_max"] + 1))
    for call in (model, model.logits, model.loss, model.loss_and_grad):
        with pytest.raises(ValueError, match=f"l_max = {BASE['l_max']}"):
            call(x)
        with pytest.raises(ValueError, match=r"x\[1\] has length"):
            call([x[:3], x])
    model(x[:-1])  # ℓ = ℓ_max is fine


def test_a_length_too_large_for_memory_is_a_value_error():
    model = make(OPTIONS["alibi"], dtype="float32")
    with pytest.raises(ValueError, match="exceeds|too large|overflow"):
        model(np.zeros(300_000, dtype=np.int64))  # ℓ² attention weights per head: hundreds of GiB
    assert model(np.zeros(2 * BASE["l_max"], dtype=np.int64)).shape == (BASE["n_vocab"], 2 * BASE["l_max"])


def test_context_full_needs_positions_without_a_table():
    for opts in ({}, {"positional": "sinusoidal"}):
        with pytest.raises(ValueError, match="context='full'"):
            ft.DInference(20, 0.0, context="full")([1, 2, 3], make(opts))
    assert len(ft.DInference(20, 0.0, context="window")([1, 2, 3], make({}))) == 20
    with pytest.raises(ValueError, match="context must be"):
        ft.DInference(4, context="everything")
    assert ft.DInference(4).context == "auto" and "context='full'" in repr(ft.DInference(4, context="full"))


# ---------------------------------------------------------------------------------------------------
# Equivalences that pin the options down


def test_gqa_with_H_kv_equal_H_is_algorithm_5_exactly():
    x = BATCH
    plain, full = make({}), make({"H_kv": 4})
    assert plain.params.keys() == full.params.keys()
    randomize(plain, np.random.default_rng(5))
    for k in plain.params:
        full.params[k][...] = plain.params[k]
    for a, b in zip(plain(x), full(x)):
        assert np.array_equal(a, b)
    (la, ga), (lb, gb) = plain.loss_and_grad(x), full.loss_and_grad(x)
    assert la == lb and all(np.array_equal(ga[k], gb[k]) for k in ga)


def _expand_kv(params_gqa, H, prefixes):
    """θ of an H_kv-head model -> θ of the H-head model whose key/value heads repeat each group's."""
    out = dict(params_gqa)
    for p in prefixes:
        for k in ("W_k", "b_k", "W_v", "b_v"):
            if p + k in out:
                out[p + k] = np.repeat(out[p + k], H // out[p + k].shape[0], axis=0)
    return out


def _group_sum(g_full, H_kv):
    return g_full.reshape(H_kv, -1, *g_full.shape[1:]).sum(axis=1)


@pytest.mark.parametrize("arch", ["E", "ED", "D"])
def test_gqa_equals_mhattention_with_repeated_key_value_heads(arch):
    """Every model with H_kv = 2 < H = 4 equals Algorithm 5 (H_kv = H) whose key/value heads repeat each
    group's; the gradient of a shared head is the sum over its group."""
    def build(H_kv, bias=True):
        kw = dict(dtype="float64", seed=9, H_kv=H_kv, bias=bias)
        if arch == "E":
            return ft.ETransformer(19, 12, 2, 4, 24, 20, 16, **kw)
        if arch == "ED":
            return ft.EDTransformer(19, 12, 1, 2, 4, 24, 20, **kw)
        return ft.DTransformer(19, 12, 2, 4, 24, 20, **kw)

    g, m = build(2), build(4)
    theta = randomize(g, np.random.default_rng(6))
    prefixes = sorted({k[: k.index("attn.") + 5] for k in theta if "attn." in k})
    for k, v in _expand_kv(theta, 4, prefixes).items():
        m.params[k][...] = v
    z, x = [5, 1, 2, 3, 4, 6], [7, 3, 2, 8]
    args = {"E": (x, [7, 3, 2, 8]), "ED": (z, x), "D": (x,)}[arch]
    fwd = args[:1] if arch == "E" else args
    assert rel_err(g(*fwd), m(*fwd)) <= 1e-12
    (la, ga), (lb, gb) = g.loss_and_grad(*args), m.loss_and_grad(*args)
    assert abs(la - lb) <= 1e-12 * abs(lb)
    scale = max(np.abs(v).max() for v in gb.values())
    for k in ga:
        want = _group_sum(gb[k], 2) if any(k == p + n for p in prefixes for n in ("W_k", "b_k", "W_v", "b_v")) else gb[k]
        if k.endswith(".b_k"):  # exactly 0 (the softmax ignores a per-column constant): rounding noise only
            assert np.abs(ga[k]).max() <= 1e-12 * scale and np.abs(want).max() <= 1e-12 * scale
            continue
        assert rel_err(ga[k], want) <= 1e-10, k


@pytest.mark.parametrize("arch", ["E", "ED", "D"])
def test_bias_false_equals_zero_biases(arch):
    def build(bias):
        kw = dict(dtype="float64", seed=9, bias=bias)
        if arch == "E":
            return ft.ETransformer(19, 12, 2, 4, 24, 20, 16, **kw)
        if arch == "ED":
            return ft.EDTransformer(19, 12, 1, 2, 4, 24, 20, **kw)
        return ft.DTransformer(19, 12, 2, 4, 24, 20, **kw)

    nb, wb = build(False), build(True)
    removed = set(wb.params) - set(nb.params)
    assert removed and all(k.rsplit(".", 1)[-1] in ("b_q", "b_k", "b_v", "b_o", "b_mlp1", "b_mlp2", "b_mlp3", "b_mlp4")
                           for k in removed)
    theta = randomize(nb, np.random.default_rng(7))
    for k in wb.params:
        wb.params[k][...] = theta[k] if k in theta else 0.0
    args = {"E": ([7, 3, 2, 8], [7, 3, 2, 8]), "ED": ([5, 1, 2], [7, 3, 2, 8]), "D": ([7, 3, 2, 8],)}[arch]
    fwd = args[:1] if arch == "E" else args
    assert rel_err(nb(*fwd), wb(*fwd)) <= 1e-13
    ga, gb = nb.loss_and_grad(*args)[1], wb.loss_and_grad(*args)[1]
    for k in ga:
        assert rel_err(ga[k], gb[k]) <= 1e-12, k


def test_rope_interleaved_pairing_is_a_row_permutation_of_the_half_split():
    rng = np.random.default_rng(8)
    d, l = 8, 5
    X, p = rng.standard_normal((d, l)), np.array([0, 3, 4, 9, 17])
    perm = np.r_[np.arange(0, d, 2), np.arange(1, d, 2)]  # π: row 2i−1 -> i, row 2i -> i + d/2 (1-based)
    half = ref.rope(X[perm], p)
    inter = np.empty_like(half)
    inter[perm] = half  # πᵀ
    assert rel_err(ref.rope(X, p, interleaved=True), inter) <= 1e-15
    # and scores depend on positions only through their difference: R(p)ᵀR(p') = R(p' − p)
    q, k = rng.standard_normal((d, 1)), rng.standard_normal((d, 1))
    s1 = ref.rope(k, [2]).T @ ref.rope(q, [7])
    s2 = ref.rope(k, [12]).T @ ref.rope(q, [17])
    assert abs(s1 - s2).max() <= 1e-12


def test_alibi_slopes_match_press_et_al(tv):
    assert np.array_equal(ref.alibi_slopes(8), 2.0 ** -np.arange(1, 9))
    for H in range(1, 33):
        assert rel_err(ref.alibi_slopes(H), np.array(tv.alibi_slopes(H))) <= 1e-15, H


def test_save_load_round_trips_the_options(tmp_path):
    model = make(OPTIONS["llama"])
    randomize(model, np.random.default_rng(9))
    cfg = model.config
    assert (cfg["positional"], cfg["H_kv"], cfg["mlp"], cfg["bias"], cfg["norm"], cfg["rope_theta"]) == \
        ("rope", 2, "swiglu", False, "rms", 10000.0)
    ft.save(model, tmp_path / "m.safetensors")
    back = ft.load(tmp_path / "m.safetensors")
    assert back.config == cfg
    for a, b in zip(model(BATCH), back(BATCH)):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("kw, match", [
    (dict(H_kv=3), "must divide H"),
    (dict(H_kv=8), "must divide H"),
    (dict(positional="rope", d_attn=3, d_mid=6), "even"),
    (dict(positional="rope", rope_theta=0.0), "rope_theta"),
    (dict(mlp="reglu"), "mlp must be"),
    (dict(positional="xpos"), "positional must be"),
    (dict(positional="relative"), "is an EDTransformer option"),
])
def test_bad_options_raise_value_error(kw, match):
    with pytest.raises(ValueError, match=match):
        make({}, **kw)


def test_bad_option_types_and_encoder_only_options():
    with pytest.raises(ValueError):
        make({}, H_kv=0)
    with pytest.raises(TypeError):
        make({}, bias="no")
    with pytest.raises(TypeError):
        make({}, H_kv=2.5)
    with pytest.raises(ValueError, match="DTransformer option"):
        ft.ETransformer(19, 12, 2, 4, 24, 20, 16, positional="rope")
    with pytest.raises(ValueError, match="DTransformer option"):
        ft.EDTransformer(19, 12, 1, 1, 4, 24, 20, positional="alibi")


# ---------------------------------------------------------------------------------------------------
# Hugging Face LlamaForCausalLM with its weights copied in


def llama_to_ft(hf, model):
    """Copy a LlamaForCausalLM's weights into a DTransformer(positional="rope", H_kv, mlp="swiglu", bias=False,
    norm="rms") of the same sizes. Returns {ft name: (hf parameter, to_ft)}, to_ft mapping an HF-shaped array
    (a weight or its gradient) to the ft parameter's shape."""
    H, H_kv = model.H, hf.config.num_key_value_heads
    d_e = model.d_e
    d_attn = d_e // H
    m = {"W_e": (hf.model.embed_tokens.weight, lambda a: a.T), "W_u": (hf.lm_head.weight, lambda a: a),
         "gamma": (hf.model.norm.weight, lambda a: a)}
    for l, layer in enumerate(hf.model.layers):
        p, at = f"layers.{l}.", layer.self_attn
        m[p + "attn.W_q"] = (at.q_proj.weight, lambda a: a.reshape(H, d_attn, d_e))
        m[p + "attn.W_k"] = (at.k_proj.weight, lambda a: a.reshape(H_kv, d_attn, d_e))
        m[p + "attn.W_v"] = (at.v_proj.weight, lambda a: a.reshape(H_kv, d_attn, d_e))
        m[p + "attn.W_o"] = (at.o_proj.weight, lambda a: a)
        m[p + "W_gate"] = (layer.mlp.gate_proj.weight, lambda a: a)
        m[p + "W_mlp1"] = (layer.mlp.up_proj.weight, lambda a: a)
        m[p + "W_mlp2"] = (layer.mlp.down_proj.weight, lambda a: a)
        m[p + "gamma1"] = (layer.input_layernorm.weight, lambda a: a)
        m[p + "gamma2"] = (layer.post_attention_layernorm.weight, lambda a: a)
    for k, (w, f) in m.items():
        model.params[k][...] = f(w.detach().numpy())
    return m


def _float64_llama(monkeypatch):
    """HF's float32 RMSnorm and RoPE angles in float64 (conftest.hf_float64) for an exactness check."""
    from transformers.models.llama import modeling_llama as ml

    hf_float64(monkeypatch, ml.LlamaRMSNorm, ml.LlamaRotaryEmbedding)
    return ml


def test_llama_for_causal_lm_probabilities_and_every_gradient(monkeypatch):
    torch = torch_or_skip()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    _float64_llama(monkeypatch)
    V, l_max, L, H, H_kv, d_e, d_mlp, eps, theta = 29, 16, 2, 4, 2, 24, 36, 1e-6, 500.0
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=d_e, intermediate_size=d_mlp, num_hidden_layers=L,
                                   num_attention_heads=H, num_key_value_heads=H_kv, max_position_embeddings=l_max,
                                   rms_norm_eps=eps, rope_theta=theta, attention_bias=False, mlp_bias=False,
                                   tie_word_embeddings=False, attn_implementation="sdpa")
    hf = hf_random_float64(transformers.LlamaForCausalLM, cfg)  # every weight random (norm weights too)
    model = ft.DTransformer(V, l_max, L, H, d_e, d_mlp, positional="rope", rope_theta=theta, H_kv=H_kv, mlp="swiglu",
                            bias=False, norm="rms", eps=eps, dtype="float64")
    mapping = llama_to_ft(hf, model)
    assert set(mapping) == set(model.params)
    x = np.array([3, 14, 15, 9, 26, 5, 3, 5, 8, 9, 7, 9, 3, 2])
    ids = torch.as_tensor(x)[None]
    logits = hf(ids).logits[0]  # (ℓ, V)
    P_hf = torch.softmax(logits, dim=-1).detach().numpy().T
    assert rel_err(model(x), P_hf) <= 1e-10
    loss_hf = torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:], reduction="sum")
    hf.zero_grad()
    loss_hf.backward()
    loss, grads = model.loss_and_grad(x)
    assert abs(loss - loss_hf.item()) <= 1e-10 * abs(loss_hf.item())
    for k, (w, f) in mapping.items():
        assert rel_err(grads[k], f(w.grad.numpy())) <= 1e-10, k


# ---------------------------------------------------------------------------------------------------
# The stand-alone MHAttention with the variants (Algorithm 5 with V1/V2/V3/V5)

ATTN_OPTS = {
    "gqa": dict(H_kv=2),
    "mqa_no_bias": dict(H_kv=1, bias=False),
    "rope": dict(positional="rope"),
    "rope_gqa": dict(positional="rope", H_kv=2, rope_theta=100.0),
    "alibi_gqa": dict(positional="alibi", H_kv=2),
}


def _mh(opts, mask, dtype="float64", seed=0):
    m = ft.MHAttention(4, 10, 9, 6, 5, 7, mask, dtype=dtype, seed=seed, **opts)
    rng = np.random.default_rng(seed)
    for v in m.params.values():
        v[...] = rng.standard_normal(v.shape)
    return m, {k: np.array(v, dtype=np.float64) for k, v in m.params.items()}


def _mh_ref(P, X, Z, mask, opts):
    return ref.gqa_mhattention(X, Z, P["W_q"], P.get("b_q"), P["W_k"], P.get("b_k"), P["W_v"], P.get("b_v"), P["W_o"],
                               P.get("b_o"), mask, positional=opts.get("positional", "none"),
                               theta=opts.get("rope_theta", 10000.0))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("mask", ["bidirectional", "unidirectional"])
@pytest.mark.parametrize("name", list(ATTN_OPTS))
def test_mhattention_variants_match_reference(name, mask, dtype):
    opts = ATTN_OPTS[name]
    m, P = _mh(opts, mask, dtype)
    rng = np.random.default_rng(1)
    l = 6
    X, Z = rng.standard_normal((10, l)), rng.standard_normal((9, l))
    M = ref.unidirectional_mask(l, l) if mask == "unidirectional" else ref.bidirectional_mask(l, l)
    assert rel_err(m(X, Z), _mh_ref(P, X, Z, M, opts)) <= TOL[dtype]
    assert m.H_kv == opts.get("H_kv", 4)


@pytest.mark.parametrize("name", list(ATTN_OPTS))
def test_mhattention_variants_backward_matches_finite_differences(name):
    from conftest import numeric_grad

    opts = ATTN_OPTS[name]
    m, P = _mh(opts, "unidirectional")
    rng = np.random.default_rng(2)
    l_x = l_z = 5
    X, Z, dY = rng.standard_normal((10, l_x)), rng.standard_normal((9, l_z)), rng.standard_normal((7, l_x))
    M = ref.unidirectional_mask(l_z, l_x)
    m(X, Z)
    m.zero_grad()
    dX, dZ = m.backward(dY)
    f = lambda **kw: float(np.sum(dY * _mh_ref({**P, **{k: v for k, v in kw.items() if k in P}},  # noqa: E731
                                              kw.get("X", X), kw.get("Z", Z), M, opts)))
    Xc, Zc = X.copy(), Z.copy()  # numeric_grad perturbs its array in place
    assert rel_err(dX, numeric_grad(lambda: f(X=Xc), Xc)) <= 1e-6
    assert rel_err(dZ, numeric_grad(lambda: f(Z=Zc), Zc)) <= 1e-6
    scale = max(np.abs(g).max() for g in m.grads.values())
    for k in P:
        Pk = P[k].copy()
        num = numeric_grad(lambda: f(**{k: Pk}), Pk)
        if k == "b_k" and opts.get("positional") != "rope":
            assert np.abs(m.grads[k]).max() <= 1e-12 * scale  # exactly 0: a per-column constant of S
            continue
        assert rel_err(m.grads[k], num) <= 1e-6, k


def test_mhattention_with_H_kv_equal_H_is_algorithm_5_exactly():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((10, 6))
    a, b = ft.MHAttention(4, 10, 10, 6, 5, 7, dtype="float64", seed=4), \
        ft.MHAttention(4, 10, 10, 6, 5, 7, dtype="float64", seed=4, H_kv=4)
    assert np.array_equal(a(X), b(X))
    dY = rng.standard_normal((7, 6))
    assert all(np.array_equal(u, v) for u, v in zip(a.backward(dY), b.backward(dY)))
    assert all(np.array_equal(a.grads[k], b.grads[k]) for k in a.grads)


def test_mhattention_variant_bad_input():
    with pytest.raises(ValueError, match="must divide H"):
        ft.MHAttention(4, 8, 8, 6, 5, 7, H_kv=3)
    with pytest.raises(ValueError, match="even"):
        ft.MHAttention(4, 8, 8, 5, 5, 7, positional="rope")
    with pytest.raises(ValueError, match="positional"):
        ft.MHAttention(4, 8, 8, 6, 5, 7, positional="learned")
    with pytest.raises(TypeError):
        ft.MHAttention(4, 8, 8, 6, 5, 7, bias=1)


@pytest.mark.parametrize("opts", [dict(H_kv=2), dict(H_kv=1, bias=False)])
def test_ed_cached_decoding_with_gqa_equals_the_literal_path(opts):
    """Algorithm 15's caches (self- and cross-attention) hold H_kv heads: cached = literal, token for token."""
    m = ft.EDTransformer(19, 12, 1, 2, 4, 24, 20, dtype="float64", seed=2, **opts)
    randomize(m, np.random.default_rng(11))
    z = [4, 8, 15, 16, 2, 3]
    for tau in (0.0, 1.0):
        a = ft.EDInference(tau, max_len=10, seed=5, cache=True)(z, m)
        b = ft.EDInference(tau, max_len=10, seed=5, cache=False)(z, m)
        assert list(a) == list(b), tau
