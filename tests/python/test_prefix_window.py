"""Prefix LM (docs/variants.md V7) and sliding-window attention with its rolling KV cache (V8, V9): the masks
of reference.py against their definitions and Hugging Face's, the core against reference.py (float64 ≤ 1e-12,
float32 ≤ 1e-5), gradients against finite differences, cached decoding against the full forward, Hugging Face's
MistralForCausalLM with its weights copied in, bad options."""
from __future__ import annotations

import os

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref
from conftest import (TOL, assert_grads_match_fd, hf_float64, hf_random_float64, make_decoder, randomize_theta,
                      reference_hp, rel_err, torch_or_skip)
from hf_family_checks import round_trips_exactly

# ---------------------------------------------------------------------------------------------------
# The masks of reference.py


def test_prefix_mask_is_bidirectional_over_the_prefix_and_causal_after():
    l, p = 7, 3
    M = ref.prefix_mask(l, l, p)
    for t_z in range(l):
        for t_x in range(l):
            assert M[t_z, t_x] == (t_z < p or t_z <= t_x)
    assert (ref.prefix_mask(l, l, 0) == ref.unidirectional_mask(l, l)).all()
    assert (ref.prefix_mask(l, l, l) == ref.bidirectional_mask(l, l)).all()
    # the prefix block is all ones, the rest of each column is causal
    assert M[:p, :p].all() and not M[p:, :p].any()
    # queries at q0 (a cache): the columns of the full mask
    assert (ref.prefix_mask(l, 2, p, q0=4) == M[:, 4:6]).all()


def test_sliding_window_mask_sees_the_last_w_keys():
    l = 9
    for w in (1, 2, 3, 9, 20):
        M = ref.sliding_window_mask(l, l, w)
        for t_z in range(l):
            for t_x in range(l):
                assert M[t_z, t_x] == (t_x - w < t_z <= t_x)
        assert (M.sum(axis=0) == np.minimum(np.arange(l) + 1, w)).all()  # w keys once t_x ≥ w − 1
        assert (ref.sliding_window_mask(l, 3, w, q0=5) == M[:, 5:8]).all()
    assert (ref.sliding_window_mask(l, l, l) == ref.unidirectional_mask(l, l)).all()
    assert (ref.sliding_window_mask(l, l, 1) == np.eye(l, dtype=bool)).all()


def test_sliding_window_mask_follows_hugging_face_mistral_convention():
    torch = torch_or_skip()
    pytest.importorskip("transformers")
    from transformers import masking_utils as mu

    l = 11
    q, k = torch.arange(l)[:, None], torch.arange(l)[None, :]
    for w in (1, 3, 4, 11):
        f = mu.sliding_window_causal_mask_function(w)
        hf = f(0, 0, q, k).numpy()  # [q_idx, kv_idx], broadcast
        assert (ref.sliding_window_mask(l, l, w) == hf.T).all(), w  # ours is [t_z, t_x] = [kv, q]


def test_reference_prefix_zero_is_algorithm_10_and_the_loss_skips_the_prefix():
    rng = np.random.default_rng(0)
    model = ft.DTransformer(11, 8, 1, 2, 8, 12, dtype="float64", seed=1)
    theta = {k: np.array(v) for k, v in model.params.items()}
    x = rng.integers(0, 11, 8)
    P = ref.d_transformer(x, theta, L=1, H=2)
    assert rel_err(ref.d_transformer(x, theta, L=1, H=2, mask="prefix", prefix_len=0), P) == 0.0
    assert rel_err(ref.d_transformer(x, theta, L=1, H=2, sliding_window=8), P) == 0.0
    for p in range(len(x) + 1):
        logP = ref.log_softmax(ref.d_transformer(x, theta, L=1, H=2, mask="prefix", prefix_len=p, logits=True))
        want = -sum(logP[x[t + 1], t] for t in range(max(p - 1, 0), len(x) - 1))
        assert ref.d_loss(x, theta, L=1, H=2, mask="prefix", prefix_len=p) == pytest.approx(want, rel=1e-15)
    # the prefix changes the function: column 0 sees the whole prefix
    assert rel_err(ref.d_transformer(x, theta, L=1, H=2, mask="prefix", prefix_len=4), P) > 1e-3
    with pytest.raises(ValueError, match="prefix_len"):
        ref.d_transformer(x, theta, L=1, H=2, mask="prefix", prefix_len=9)
    with pytest.raises(ValueError, match="sliding_window"):
        ref.d_transformer(x, theta, L=1, H=2, sliding_window=0)


# ---------------------------------------------------------------------------------------------------
# Sliding-window attention (V8) in the core: forward, loss and gradients against reference.py

BASE = dict(n_vocab=19, l_max=12, L=2, H=4, d_e=24, d_mlp=20)
WINDOW = {  # name -> options (with sliding_window)
    "w3": dict(sliding_window=3),
    "w1": dict(sliding_window=1),
    "w3_rope": dict(sliding_window=3, positional="rope"),
    "w4_alibi": dict(sliding_window=4, positional="alibi"),
    "w2_gqa": dict(sliding_window=2, H_kv=2),
    "w3_no_bias": dict(sliding_window=3, bias=False),
    "mistral": dict(sliding_window=3, positional="rope", H_kv=2, mlp="swiglu", bias=False, norm="rms"),
}
REF_KEYS = ("norm", "positional", "rope_theta", "mlp", "sliding_window")
BATCH = [[3, 1, 4, 1, 5, 9, 2, 6, 5], [8, 9, 7, 9, 3]]  # ragged


def make(opts, dtype="float64", seed=3, **extra):
    return make_decoder(BASE, opts, dtype, seed, **extra)


def hp_of(opts):
    return reference_hp(BASE, opts, REF_KEYS)


def randomize(model, rng):
    return randomize_theta(model, rng)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", list(WINDOW))
def test_sliding_window_forward_and_loss_match_the_reference(name, dtype):
    opts = WINDOW[name]
    model = make(opts, dtype)
    theta = randomize(model, np.random.default_rng(1))
    P = model(BATCH)
    for x, Pb in zip(BATCH, P):
        want = ref.d_transformer_variant(x, theta, **hp_of(opts))
        assert rel_err(Pb, want) <= TOL[dtype], name
        # the window matters: the causal model differs (w < ℓ)
        assert rel_err(want, ref.d_transformer_variant(x, theta, **hp_of({**opts, "sliding_window": None}))) > 1e-6
    want = ref.d_variant_loss(BATCH, theta, **hp_of(opts))
    assert abs(model.loss(BATCH) - want) <= TOL[dtype] * abs(want)
    # the attention weights are zero outside the window (layer 1, sequence 0)
    A = model.attention_weights(1, 0)
    l = len(BATCH[0])
    outside = ~ref.sliding_window_mask(l, l, opts["sliding_window"])
    assert (A[:, outside] == 0).all() and np.allclose(A.sum(axis=1), 1.0, atol=1e-5)


def test_sliding_window_with_dropout_matches_the_reference():
    opts = dict(sliding_window=3)
    model = ft.DTransformer(13, 10, 2, 2, 8, 12, dtype="float64", seed=2, dropout=0.2, **opts)
    theta = randomize(model, np.random.default_rng(5))
    x = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    loss, _ = model.loss_and_grad(x)
    masks, rates = model.dropout_masks(), model.config
    assert "layers.1.attn.weights" in masks
    want = ref.d_loss(x, theta, L=2, H=2, masks=masks, rates=rates, sliding_window=3)
    assert abs(loss - want) <= 1e-12 * abs(want)
    assert abs(ref.d_loss(x, theta, L=2, H=2, masks=masks, rates=rates) - want) > 1e-8  # the window matters


@pytest.mark.parametrize("opts", [dict(sliding_window=2), dict(sliding_window=3, positional="rope"),
                                  dict(sliding_window=2, positional="alibi", H_kv=1, mlp="swiglu", bias=False,
                                       norm="rms")])
def test_sliding_window_gradients_match_finite_differences(opts):
    model = ft.DTransformer(7, 12, 1, 2, 8, 6, dtype="float64", seed=1, **opts)
    randomize(model, np.random.default_rng(10))
    x = [[3, 1, 4, 1, 5, 6, 2, 6], [5, 3, 0]]  # ragged
    _, grads = model.loss_and_grad(x)
    assert_grads_match_fd(model, grads, lambda: model.loss(x), b_k_zero=opts.get("positional") != "rope", label=opts)


# ---------------------------------------------------------------------------------------------------
# Decoding with the rolling cache (V9): equal to the full forward with the window, past w and past ℓ_max


@pytest.mark.parametrize("name", ["w3", "w1", "w3_rope", "w4_alibi", "mistral"])
def test_cached_decoding_past_the_window_equals_the_reference(name):
    opts = WINDOW[name]
    model = make(opts)
    theta = randomize(model, np.random.default_rng(6))
    prompt = [1, 2, 3, 4, 5]
    in_attn = opts.get("positional") in ("rope", "alibi")
    l_gen = 3 * BASE["l_max"] - 5 if in_attn else BASE["l_max"] - 5  # past ℓ_max only without a table
    forward = lambda c: ref.d_transformer_variant(c, theta, **hp_of(opts))  # noqa: E731
    expected = ref.d_inference(prompt, forward, l_gen=l_gen, tau=0.0, l_max=None if in_attn else BASE["l_max"])
    for cache in (True, False):
        got = ft.DInference(l_gen, 0.0, cache=cache)(prompt, model)  # auto: full context with RoPE/ALiBi + window
        assert list(got) == list(expected), (name, cache)
    # sampled too: cached and literal draw the same tokens
    assert list(ft.DInference(l_gen, 1.0, seed=4, cache=True)(prompt, model)) == \
        list(ft.DInference(l_gen, 1.0, seed=4, cache=False)(prompt, model))


def test_long_prompt_then_decoding_with_the_rolling_cache():
    # a prompt longer than the window fills the cache in one pass; decoding continues
    opts = WINDOW["mistral"]
    model = make(opts)
    theta = randomize(model, np.random.default_rng(7))
    prompt = list(np.random.default_rng(8).integers(0, BASE["n_vocab"], 10))  # ≤ ℓ_max, > w
    forward = lambda c: ref.d_transformer_variant(c, theta, **hp_of(opts))  # noqa: E731
    expected = ref.d_inference(prompt, forward, l_gen=25, tau=0.0)
    assert list(ft.DInference(25, 0.0, cache=True)(prompt, model)) == list(expected)


def test_sliding_window_options_round_trip_and_bad_values(tmp_path):
    model = make(WINDOW["mistral"])
    assert model.config["sliding_window"] == 3 and make({}).config["sliding_window"] is None
    assert "sliding_window=3" in repr(model)
    ft.save(model, tmp_path / "m.safetensors")
    back = ft.load(tmp_path / "m.safetensors")
    assert back.config["sliding_window"] == 3
    x = [1, 2, 3, 4, 5, 6, 7]
    assert rel_err(back(x), model(x)) == 0.0
    for bad in (0, -2):
        with pytest.raises(ValueError, match="sliding_window"):
            make({"sliding_window": bad})
    with pytest.raises(TypeError):
        make({"sliding_window": 2.5})
    with pytest.raises(TypeError, match="sliding_window"):
        ft.ETransformer(19, 12, 1, 2, 8, 8, sliding_window=3)


# ---------------------------------------------------------------------------------------------------
# Hugging Face MistralForCausalLM (LLaMA's layers with sliding-window attention), every weight random, float64


def _float64_mistral(monkeypatch):
    """HF's float32 RMSnorm and RoPE angles in float64 (conftest.hf_float64), as the LLaMA test of test_variants.py."""
    from transformers.models.mistral import modeling_mistral as mm

    hf_float64(monkeypatch, mm.MistralRMSNorm, mm.MistralRotaryEmbedding)


def _mistral(w=3, tied=False):
    torch = torch_or_skip()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.MistralConfig(vocab_size=29, hidden_size=24, intermediate_size=36, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                                     rms_norm_eps=1e-6, rope_theta=500.0, sliding_window=w,
                                     tie_word_embeddings=tied, attn_implementation="sdpa")
    hf = hf_random_float64(transformers.MistralForCausalLM, cfg)  # every weight random (norm weights too)
    return torch, hf.eval()


def test_mistral_for_causal_lm_probabilities_and_every_gradient(monkeypatch):
    torch, hf = _mistral(w=3)
    model = ft.from_hf(hf)
    assert model.config["sliding_window"] == 3 and model.config["positional"] == "rope" and model.config["H_kv"] == 2
    x = np.array([3, 14, 15, 9, 26, 5, 3, 5, 8, 9, 7, 9, 3, 2])
    ids = torch.as_tensor(x)[None]
    # unpatched: HF's float32 RMSnorm and RoPE angles cost ~1e-7
    P_hf32 = torch.softmax(hf(ids).logits[0], dim=-1).detach().numpy().T
    assert rel_err(model(x), P_hf32) <= 1e-6
    _float64_mistral(monkeypatch)
    logits = hf(ids).logits[0]
    P_hf = torch.softmax(logits, dim=-1).detach().numpy().T
    assert rel_err(model(x), P_hf) <= 1e-12
    # the window matters here: the causal LLaMA of the same weights gives another P
    causal = make({**WINDOW["mistral"], "sliding_window": None}, n_vocab=29, l_max=16, H=4, d_e=24, d_mlp=36,
                  rope_theta=500.0, eps=1e-6)
    for k, v in model.params.items():
        causal.params[k][...] = v
    assert rel_err(causal(x), P_hf) > 1e-6
    loss_hf = torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:], reduction="sum")
    hf.zero_grad()
    loss_hf.backward()
    loss, grads = model.loss_and_grad(x)
    assert abs(loss - loss_hf.item()) <= 1e-12 * abs(loss_hf.item())
    hf_grads = {k: p.grad.numpy() for k, p in hf.named_parameters()}
    back = ft.hf.llama.from_ft(grads, model.config)  # our gradients under HF's names and shapes
    assert set(back) == set(hf_grads)
    for k, g in hf_grads.items():
        assert rel_err(back[k], g) <= 1e-10, k


def test_mistral_greedy_generation_past_the_window_equals_hugging_face(monkeypatch):
    torch, hf = _mistral(w=3)
    _float64_mistral(monkeypatch)
    model = ft.from_hf(hf)
    prompt = [5, 17, 2, 9]
    l_gen = 20  # to position 24, past the window (3) and past max_position_embeddings (16)
    out = hf.generate(torch.as_tensor(prompt)[None], max_new_tokens=l_gen, min_new_tokens=l_gen, do_sample=False,
                      eos_token_id=None, pad_token_id=0)[0, len(prompt):].numpy()
    for cache in (True, False):
        assert list(ft.DInference(l_gen, 0.0, cache=cache)(prompt, model)) == list(out), cache


def test_mistral_round_trips_exactly(tmp_path):
    _, hf = _mistral(w=5)
    model, hf2 = round_trips_exactly(hf, tmp_path, "MistralForCausalLM")
    assert hf2.config.sliding_window == 5 and model.config["sliding_window"] == 5
    # a window our model cannot hold → ValueError naming it, before anything is built
    hf.config.sliding_window = 0
    with pytest.raises(ValueError, match="sliding_window"):
        ft.from_hf(hf)
    # the LLaMA export of a model with a window is refused by GPT-2 (no window there)
    with pytest.raises(ValueError, match="sliding_window"):
        ft.to_hf(make({"sliding_window": 3}))


def test_speculative_decoding_with_sliding_window_models():
    # target and draft with windows: greedy speculative decoding equals the target's greedy decoding (the
    # rollback of rejected drafts stays within the rolling caches); k ≥ the draft's window is refused
    target = make(WINDOW["mistral"], l_max=40)  # speculative decoding keeps ℓ + ℓ_gen ≤ ℓ_max
    randomize(target, np.random.default_rng(11))
    draft = make({**WINDOW["mistral"], "sliding_window": 4}, L=1, l_max=40)
    randomize(draft, np.random.default_rng(12))
    prompt, l_gen = [1, 2, 3, 4, 5], 30
    want = ft.DInference(l_gen, 0.0, cache=True)(prompt, target)
    for k in (1, 3):
        got = ft.SpeculativeInference(l_gen, k, 0.0)(prompt, target, draft)
        assert list(got) == list(want), k
    with pytest.raises(ValueError, match="sliding_window"):
        ft.SpeculativeInference(l_gen, 4, 0.0)(prompt, target, draft)


def test_tied_config_with_a_differing_lm_head_loads_as_transformers_uses_it(monkeypatch, tmp_path):
    """tie_word_embeddings: true beside the file's own lm_head.weight, which differs from embed_tokens: transformers 5
    does not tie them and uses the file's lm_head; load_hf does the same (it used to drop the tensor: logits ~0.3 away).
    An lm_head equal to embed_tokens is the tied alias."""
    import json

    import transformers

    torch, hf = _mistral(w=3, tied=False)
    hf.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    _float64_mistral(monkeypatch)
    theirs = transformers.MistralForCausalLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
    model = ft.load_hf(tmp_path)
    assert model.config["tied"] is False
    x = np.array([3, 14, 15, 9, 26, 5, 3, 5, 8, 9, 7, 9, 3, 2])
    P_hf = torch.softmax(theirs(torch.as_tensor(x)[None]).logits[0], dim=-1).detach().numpy().T
    assert rel_err(model(x), P_hf) <= 1e-12
    with torch.no_grad():
        hf.lm_head.weight.copy_(hf.model.embed_tokens.weight)
    assert ft.from_hf(hf).config["tied"] is False  # the config unties them: its own W_u (equal values)
    hf.config.tie_word_embeddings = True
    assert ft.from_hf(hf).config["tied"] is True  # tied, and equal: the alias
