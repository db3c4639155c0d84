"""T5's relative position bias (docs/variants.md V11; Raffel et al. 2020 §2.1) as EDTransformer(...,
positional="relative"): the buckets and the bias of reference.py against Hugging Face's T5Attention, the core
against reference.py (float64 ≤ 1e-12, float32 ≤ 1e-5), the shared tables' gradients against finite differences,
cached decoding against the listing, bad values. (ft.from_hf(T5ForConditionalGeneration) is not built: T5's other
choices — pre-LN blocks with RMS norm, no 1/√d_attn, gated-GELU MLP, the tied output's rescale — are not yet
options of EDTransformer.)"""
from __future__ import annotations


import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref
from conftest import TOL, assert_grads_match_fd, numeric_grad, randomize_theta, rel_err

SIZES = dict(n_vocab=17, l_max=12, L_enc=2, L_dec=2, H=3, d_e=12, d_mlp=16)


def make(dtype="float64", seed=3, **opts):
    return ft.EDTransformer(**SIZES, positional="relative", dtype=dtype, seed=seed, **opts)


def randomize(model, rng):
    """Every parameter random (conftest.randomize_theta), the bias tables O(1) like W_e."""
    return randomize_theta(model, rng, unit=("W_e", "rel_bias"))


def hp(model, **kw):
    c = model.config
    return dict(L_enc=c["L_enc"], L_dec=c["L_dec"], H=c["H"], positional="relative",
                relative_max_distance=c["relative_max_distance"], **kw)


# ---------------------------------------------------------------------------------------------------
# The listing against Hugging Face's T5 (the buckets and the bias of every head)

@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 20), (6, 7), (16, 9)])
def test_buckets_equal_hugging_face_t5(num_buckets, max_distance):
    torch = pytest.importorskip("torch")
    from transformers.models.t5.modeling_t5 import T5Attention
    r = np.arange(-300, 301)
    for bidirectional in (True, False):
        hf = T5Attention._relative_position_bucket(torch.tensor(r), bidirectional=bidirectional,
                                                   num_buckets=num_buckets, max_distance=max_distance).numpy()
        ours = [ref.relative_bucket(int(v), bidirectional, num_buckets, max_distance) for v in r]
        assert list(hf) == ours, (num_buckets, max_distance, bidirectional)
    # the listing's shape: exact buckets for small offsets, the causal ones 0 for keys after the query
    assert [ref.relative_bucket(-n, False, 32, 128) for n in range(16)] == list(range(16))
    assert all(ref.relative_bucket(n, False, 32, 128) == 0 for n in range(1, 50))
    assert ref.relative_bucket(3, True, 32, 128) == 16 + 3 and ref.relative_bucket(-3, True, 32, 128) == 3


def _buckets_hit(l, N_b, d_max):
    """The buckets V11 gives the offsets of an ℓ-token encoder (bidirectional, r in ±(ℓ−1)) and decoder (causal)."""
    r = range(-(l - 1), l)
    return ({ref.relative_bucket(v, True, N_b, d_max) for v in r},
            {ref.relative_bucket(v, False, N_b, d_max) for v in r})


@pytest.mark.parametrize("N_b,d_max", [(8, 6), (10, 9), (12, 7)])
def test_log_spaced_buckets_in_both_directions(N_b, d_max):
    """Sequences long enough that every stack's offsets reach line 5's log-spaced buckets and the last one (past
    d_max) on both sides of the encoder and in the causal decoder: the buckets equal Hugging Face's T5 function,
    and the core's forward, loss gradient of the tables and cached decoding equal reference.py (float64 1e-12)."""
    torch = pytest.importorskip("torch")
    from transformers.models.t5.modeling_t5 import T5Attention
    l = 12
    enc, dec = _buckets_hit(l, N_b, d_max)
    N = N_b // 2
    m_enc, m_dec = N // 2, N_b // 2
    # the encoder: the log-spaced buckets and the last bucket for keys before (0 … N−1) and after (N … 2N−1) the
    # query; the decoder: those of keys before it (keys after are bucket 0)
    for lo, last in ((m_enc, N - 1), (N + m_enc, 2 * N - 1)):
        assert last in enc and any(lo <= k < last for k in enc), (lo, last, enc)
    assert N_b - 1 in dec and any(m_dec <= k < N_b - 1 for k in dec), dec
    r = np.arange(-(l - 1), l)
    for bidirectional in (True, False):
        hf = T5Attention._relative_position_bucket(torch.tensor(r), bidirectional=bidirectional, num_buckets=N_b,
                                                   max_distance=d_max).numpy()
        assert list(hf) == [ref.relative_bucket(int(v), bidirectional, N_b, d_max) for v in r]
    model = ft.EDTransformer(17, l, 2, 2, 2, 8, 8, positional="relative", relative_buckets=N_b,
                             relative_max_distance=d_max, dtype="float64", seed=1)
    theta = randomize(model, np.random.default_rng(N_b))
    rng = np.random.default_rng(d_max)
    z, x = rng.integers(0, 15, l), rng.integers(0, 15, l)
    want = ref.ed_transformer(z, x, theta, **hp(model))
    assert rel_err(model(z, x), want) <= 1e-12
    # the tables' gradients (V11's backward: dS summed into each bucket) against central differences
    _, grads = model.loss_and_grad(z, x)
    for name, hit in (("enc.rel_bias", enc), ("dec.rel_bias", dec)):
        fd = numeric_grad(lambda: model.loss(z, x), model.params[name])
        assert rel_err(grads[name], fd) <= 1e-6, name
        assert set(np.flatnonzero(np.abs(grads[name]).sum(axis=1) > 1e-12)) == hit, name  # the buckets used
    # cached decoding: the decoder's query at q0 > 0 against the cached keys, to l_max tokens
    bos, eos = 15, 16
    want = ref.ed_inference(z, lambda zz, xx: ref.ed_transformer(zz, xx, theta, **hp(model)), tau=0.0,
                            bos_token=bos, eos_token=eos, max_len=l)
    assert len(want) == l  # (no eos before l_max: every offset reached)
    assert list(ft.EDInference(0.0, cache=True)(z, model)) == list(want)


def test_bias_equals_hugging_face_compute_bias():
    torch = pytest.importorskip("torch")
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention
    for is_decoder in (False, True):
        cfg = T5Config(d_model=8, d_kv=4, num_heads=3, relative_attention_num_buckets=10,
                       relative_attention_max_distance=12, is_decoder=is_decoder)
        att = T5Attention(cfg, has_relative_attention_bias=True).double()
        table = np.random.default_rng(0).standard_normal((10, 3))
        with torch.no_grad():
            att.relative_attention_bias.weight.copy_(torch.from_numpy(table))
            for q_len, k_len, past in ((7, 7, 0), (1, 9, 8), (5, 4, 0)):
                hf = att.compute_bias(q_len, k_len, past_seen_tokens=past)[0].numpy()  # (H, ℓ_q, ℓ_k)
                ours = ref.relative_bias(k_len, q_len, table, bidirectional=not is_decoder, max_distance=12, q0=past)
                assert np.array_equal(np.swapaxes(ours, 1, 2), hf), (is_decoder, q_len, k_len, past)


# ---------------------------------------------------------------------------------------------------
# EDTransformer(positional="relative") against reference.ed_transformer

Z_BATCH = [[3, 1, 4, 1, 5, 9, 2], [6, 5, 3]]
X_BATCH = [[15, 2, 7, 1, 8], [15, 8, 2, 8, 1, 8]]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("opts", [dict(), dict(relative_buckets=6, relative_max_distance=5), dict(relative_buckets=4, relative_max_distance=3)])
def test_relative_ed_transformer_matches_the_reference(dtype, opts):
    model = make(dtype, **opts)
    names = set(model.params)
    assert "W_p" not in names and {"enc.rel_bias", "dec.rel_bias"} <= names
    assert not any(".attn.rel_bias" in n for n in names)  # one table per stack, shared by its layers
    N_b = opts.get("relative_buckets", 32)
    assert model.params["enc.rel_bias"].shape == (N_b, 3) and model.params["dec.rel_bias"].shape == (N_b, 3)
    theta = randomize(model, np.random.default_rng(1))
    P = model(Z_BATCH, X_BATCH)
    for z, x, Pb in zip(Z_BATCH, X_BATCH, P):
        want = ref.ed_transformer(z, x, theta, **hp(model))
        assert rel_err(Pb, want) <= TOL[dtype]
    # the tables matter: zeroing them changes P
    th0 = {**theta, "enc.rel_bias": 0 * theta["enc.rel_bias"], "dec.rel_bias": 0 * theta["dec.rel_bias"]}
    assert rel_err(ref.ed_transformer(Z_BATCH[0], X_BATCH[0], th0, **hp(model)), P[0]) > 1e-4
    want = ref.ed_loss(Z_BATCH, X_BATCH, theta, **hp(model))
    assert abs(model.loss(Z_BATCH, X_BATCH) - want) <= TOL[dtype] * abs(want)


def test_relative_with_dropout_matches_the_reference():
    model = make(dropout=0.2)
    theta = randomize(model, np.random.default_rng(5))
    z, x = Z_BATCH[0], X_BATCH[0]
    loss, _ = model.loss_and_grad(z, x)
    masks, rates = model.dropout_masks(), model.config
    want = ref.ed_loss(z, x, theta, masks=masks, rates=rates, **hp(model))
    assert abs(loss - want) <= 1e-12 * abs(want)


@pytest.mark.parametrize("opts", [dict(), dict(relative_buckets=4, relative_max_distance=3, H_kv=1)])
def test_relative_gradients_match_finite_differences(opts):
    model = ft.EDTransformer(9, 10, 2, 2, 2, 6, 8, positional="relative", dtype="float64", seed=1, **opts)
    randomize(model, np.random.default_rng(10))
    z, x = [[3, 1, 4, 1, 5, 6], [5, 3]], [[7, 2, 6, 2, 1], [7, 0, 4]]
    _, grads = model.loss_and_grad(z, x)
    assert_grads_match_fd(model, grads, lambda: model.loss(z, x))
    assert np.abs(grads["enc.rel_bias"]).max() > 1e-3 and np.abs(grads["dec.rel_bias"]).max() > 1e-3


def test_cached_decoding_equals_the_listing():
    model = make()
    theta = randomize(model, np.random.default_rng(6))
    c = model.config
    bos, eos = c["n_vocab"] - 2, c["n_vocab"] - 1
    for z in ([3, 1, 4, 1, 5, 9, 2], [6]):
        want = ref.ed_inference(z, lambda zz, xx: ref.ed_transformer(zz, xx, theta, **hp(model)), tau=0.0,
                                bos_token=bos, eos_token=eos, max_len=c["l_max"])
        for cache in (True, False):
            got = ft.EDInference(0.0, cache=cache)(z, model)
            assert list(got) == list(want), (z, cache)
    assert list(ft.EDInference(1.0, seed=3, cache=True)(Z_BATCH[0], model)) == \
        list(ft.EDInference(1.0, seed=3, cache=False)(Z_BATCH[0], model))


def test_relative_options_round_trip_and_bad_values(tmp_path):
    model = make("float32", relative_buckets=8, relative_max_distance=20)
    c = model.config
    assert c["positional"] == "relative" and c["relative_buckets"] == 8 and c["relative_max_distance"] == 20
    ft.save(model, tmp_path / "m.safetensors")
    back = ft.load(tmp_path / "m.safetensors")
    assert back.config == c
    assert rel_err(back(Z_BATCH[0], X_BATCH[0]), model(Z_BATCH[0], X_BATCH[0])) == 0.0
    with pytest.raises(ValueError, match="relative_buckets"):
        make(relative_buckets=3)
    with pytest.raises(ValueError, match="relative_max_distance"):
        make(relative_buckets=32, relative_max_distance=16)
    with pytest.raises(ValueError, match="positional='relative'.*EDTransformer"):
        ft.DTransformer(17, 12, 1, 2, 8, 8, positional="relative")
    with pytest.raises(TypeError, match="relative_buckets"):
        ft.DTransformer(17, 12, 1, 2, 8, 8, relative_buckets=8)
    with pytest.raises(ValueError, match="tiled"):
        make(attention_impl="tiled")  # a score bias with parameters has no tiled form
    with pytest.raises(ValueError, match="positional"):
        ft.to_torch(model)
