"""Prefix LM as a model option (docs/variants.md V7): DTransformer(..., mask="prefix") with prefix_len= on the
calls, against a DTransformer whose mask is built by hand (loops) and passed to Algorithm 4 in reference.py
(float64 ≤ 1e-12, float32 ≤ 1e-5), with RoPE, ALiBi, GQA, dropout, bias=False, ragged batches and the tiled
attention; the loss counting only the predictions after the prefix; gradients against finite differences;
cached decoding and DInference continuing after the prefix; training; bad values."""
from __future__ import annotations


import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref
from conftest import TOL, assert_grads_match_fd, randomize_theta, rel_err

BASE = dict(n_vocab=19, l_max=12, L=2, H=4, d_e=24, d_mlp=20)
OPTS = {  # name -> options (all with mask="prefix")
    "plain": dict(),
    "rope": dict(positional="rope"),
    "alibi": dict(positional="alibi"),
    "gqa": dict(H_kv=2),
    "no_bias": dict(bias=False),
    "llama": dict(positional="rope", H_kv=2, mlp="swiglu", bias=False, norm="rms"),
    "tiled": dict(attention_impl="tiled"),
    "tiled_alibi": dict(attention_impl="tiled", positional="alibi", H_kv=1),
}
REF_KEYS = ("norm", "positional", "mlp")
BATCH = [[3, 1, 4, 1, 5, 9, 2, 6, 5], [8, 9, 7, 9, 3], [2, 7, 1, 8, 2, 8]]  # ragged
PREFIX = [4, 0, 6]  # p_b per sequence: a prefix, none (causal), the whole sequence (bidirectional)


def make(opts, dtype="float64", seed=3, **extra):
    kw = {**BASE, **opts, **extra}
    args = [kw.pop(k) for k in ("n_vocab", "l_max", "L", "H", "d_e", "d_mlp")]
    return ft.DTransformer(*args, dtype=dtype, seed=seed, mask="prefix", **kw)


def hp_of(opts):
    return dict(L=BASE["L"], H=BASE["H"], **{k: v for k, v in opts.items() if k in REF_KEYS})


def randomize(model, rng):
    return randomize_theta(model, rng)


def hand_mask(l, p):
    """Mask[t_z, t_x] = 1 iff t_z < p or t_z ≤ t_x, written with loops (not reference.prefix_mask)."""
    M = np.zeros((l, l), dtype=bool)
    for t_z in range(l):
        for t_x in range(l):
            if t_z < p or t_z <= t_x:
                M[t_z, t_x] = True
    return M


def by_hand(x, theta, p, opts, monkeypatch, **kw):
    """reference.py's DTransformer (V6) with line 6's Mask replaced by hand_mask(ℓ, p), passed to Algorithm 4."""
    with monkeypatch.context() as m:
        m.setattr(ref, "decoder_mask", lambda l, **_: hand_mask(l, p))
        return ref.d_transformer_variant(x, theta, **hp_of(opts), **kw)


def loss_by_hand(xs, theta, ps, opts, monkeypatch):
    """line 5′: −Σ log P[x[t+1], t] over the 0-based t with t + 1 ≥ p (the predictions of non-prefix tokens)."""
    total = 0.0
    for x, p in zip(xs, ps):
        logP = ref.log_softmax(by_hand(x, theta, p, opts, monkeypatch, logits=True))
        total -= sum(logP[x[t + 1], t] for t in range(len(x) - 1) if t + 1 >= p)
    return total


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", list(OPTS))
def test_prefix_lm_equals_algorithm_4_with_the_mask_built_by_hand(name, dtype, monkeypatch):
    opts = OPTS[name]
    model = make(opts, dtype)
    theta = randomize(model, np.random.default_rng(1))
    P = model(BATCH, prefix_len=PREFIX)
    for x, p, Pb in zip(BATCH, PREFIX, P):
        want = by_hand(x, theta, p, opts, monkeypatch)
        assert rel_err(Pb, want) <= TOL[dtype], (name, p)
        # and reference.py's own V7 agrees with the hand-built mask
        assert rel_err(ref.d_transformer_variant(x, theta, mask="prefix", prefix_len=p, **hp_of(opts)), want) <= 1e-13
    # the prefix changes the function where 0 < p: the causal model differs
    causal = by_hand(BATCH[0], theta, 0, opts, monkeypatch)
    assert rel_err(causal, by_hand(BATCH[0], theta, 4, opts, monkeypatch)) > 1e-6
    assert rel_err(model(BATCH[0]), causal) <= TOL[dtype]  # prefix_len None: p = 0, the causal mask
    want = loss_by_hand(BATCH, theta, PREFIX, opts, monkeypatch)
    assert abs(model.loss(BATCH, prefix_len=PREFIX) - want) <= TOL[dtype] * abs(want)
    assert abs(model.loss_and_grad(BATCH, prefix_len=PREFIX)[0] - want) <= TOL[dtype] * abs(want)
    # mean: per predicted token, (9 − 4) + (5 − 1) + 0 of them
    assert model.loss(BATCH, prefix_len=PREFIX, reduction="mean") == pytest.approx(
        model.loss(BATCH, prefix_len=PREFIX) / 9, rel=1e-12)
    want = ref.d_variant_loss(BATCH, theta, mask="prefix", prefix_len=PREFIX, **hp_of(opts))
    assert abs(model.loss(BATCH, prefix_len=PREFIX) - want) <= TOL[dtype] * abs(want)
    # logits, and the attention weights zero exactly where the hand-built mask is 0 (layer 1, sequence 0)
    Z = model.logits(BATCH[0], prefix_len=4)
    assert rel_err(Z, by_hand(BATCH[0], theta, 4, opts, monkeypatch, logits=True)) <= TOL[dtype]
    A = model.attention_weights(1, 0)
    assert (A[:, ~hand_mask(len(BATCH[0]), 4)] == 0).all() and (A[:, hand_mask(len(BATCH[0]), 4)] > 0).all()


def test_one_int_prefix_for_a_batch_and_a_2d_batch(monkeypatch):
    model = make({})
    theta = randomize(model, np.random.default_rng(2))
    X = np.array([[3, 1, 4, 1, 5, 9], [2, 6, 5, 3, 5, 8]])
    P = model(X, prefix_len=3)
    assert P.shape == (2, 19, 6)
    for x, Pb in zip(X, P):
        assert rel_err(Pb, by_hand(x, theta, 3, {}, monkeypatch)) <= 1e-12
    assert rel_err(model(X, prefix_len=np.array([3, 3])), P) == 0.0
    one = model(X[0], prefix_len=3)
    assert rel_err(model(X[0], prefix_len=np.int64(3)), one) == 0.0  # a numpy integer is the int
    # alone and in the batch: the same up to rounding (bit for bit in a -march=native build; the portable wheel's
    # core rounds a sequence alone and in a batch differently, 9e-17)
    assert rel_err(one, P[0]) <= 1e-15


def test_prefix_lm_with_dropout_matches_the_reference():
    model = ft.DTransformer(13, 10, 2, 2, 8, 12, dtype="float64", seed=2, dropout=0.2, mask="prefix")
    theta = randomize(model, np.random.default_rng(5))
    x = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    loss, _ = model.loss_and_grad(x, prefix_len=4)
    masks, rates = model.dropout_masks(), model.config
    assert "layers.1.attn.weights" in masks
    want = ref.d_loss(x, theta, L=2, H=2, masks=masks, rates=rates, mask="prefix", prefix_len=4)
    assert abs(loss - want) <= 1e-12 * abs(want)
    assert abs(ref.d_loss(x, theta, L=2, H=2, masks=masks, rates=rates) - want) > 1e-8  # the prefix matters


@pytest.mark.parametrize("opts", [dict(), dict(positional="rope"), dict(attention_impl="tiled"),
                                  dict(positional="alibi", H_kv=1, mlp="swiglu", bias=False, norm="rms")])
def test_prefix_lm_gradients_match_finite_differences(opts):
    model = ft.DTransformer(7, 12, 1, 2, 8, 6, dtype="float64", seed=1, mask="prefix", **opts)
    randomize(model, np.random.default_rng(10))
    x, p = [[3, 1, 4, 1, 5, 6, 2, 6], [5, 3, 0]], [3, 1]  # ragged
    _, grads = model.loss_and_grad(x, prefix_len=p)
    assert_grads_match_fd(model, grads, lambda: model.loss(x, prefix_len=p),
                          b_k_zero=opts.get("positional") != "rope", label=opts)


def test_tiled_and_literal_attention_agree_on_the_prefix_mask():
    # the tiled kernel reads the mask through each column's live key range [0, max(p, t_x + 1))
    lit, til = make({}, attention_impl="literal"), make({}, attention_impl="tiled")
    theta = randomize(lit, np.random.default_rng(4))
    for k, v in til.params.items():
        v[...] = theta[k]
    assert rel_err(til(BATCH, prefix_len=PREFIX)[0], lit(BATCH, prefix_len=PREFIX)[0]) <= 1e-13
    _, g1 = lit.loss_and_grad(BATCH, prefix_len=PREFIX)
    _, g2 = til.loss_and_grad(BATCH, prefix_len=PREFIX)
    scale = max(np.abs(g).max() for g in g1.values())
    for k in g1:  # relative to the largest gradient (b_k's is 0 up to rounding: a per-column constant of S)
        assert np.abs(g2[k] - g1[k]).max() <= 1e-12 * scale, k
    assert rel_err(til.attention_weights(0, 0), lit.attention_weights(0, 0)) <= 1e-13


@pytest.mark.parametrize("name", ["plain", "rope", "alibi", "llama"])
def test_decoding_continues_after_the_prefix(name, monkeypatch):
    opts = OPTS[name]
    model = make(opts)
    theta = randomize(model, np.random.default_rng(6))
    prompt = [1, 2, 3, 4, 5]
    l_gen = BASE["l_max"] - len(prompt)
    for p in (len(prompt), 2, 0):
        forward = lambda c, p=p: by_hand(c, theta, p, opts, monkeypatch)  # noqa: E731
        expected = ref.d_inference(prompt, forward, l_gen=l_gen, tau=0.0)
        for cache in (True, False):
            got = ft.DInference(l_gen, 0.0, cache=cache)(prompt, model, prefix_len=p)
            assert list(got) == list(expected), (name, p, cache)
        if p == len(prompt):  # the default for a prefix LM: the prompt is the prefix
            assert list(ft.DInference(l_gen, 0.0)(prompt, model)) == list(expected)
    assert list(ft.DInference(l_gen, 1.0, seed=4, cache=True)(prompt, model, prefix_len=3)) == \
        list(ft.DInference(l_gen, 1.0, seed=4, cache=False)(prompt, model, prefix_len=3))


def test_decoding_past_l_max_keeps_what_remains_of_the_prefix():
    # learned positions, window context: the model sees the last l_max tokens with prefix max(0, p − w0)
    model = make({})
    randomize(model, np.random.default_rng(7))
    prompt = [1, 2, 3, 4, 5, 6]
    a = ft.DInference(14, 0.0, cache=True)(prompt, model, prefix_len=4)
    b = ft.DInference(14, 0.0, cache=False)(prompt, model, prefix_len=4)
    assert list(a) == list(b)
    x = list(prompt) + list(a)
    # the last token, from the literal definition: the window x[w0:] with prefix max(0, 4 − w0)
    w0 = len(x) - 1 - BASE["l_max"]
    P = model(x[w0:-1], prefix_len=max(0, 4 - w0))
    assert int(np.argmax(P[:, -1])) == x[-1]


def test_training_counts_only_the_predictions_after_the_prefix():
    data = [[3, 1, 4, 1, 5, 9, 2], [8, 9, 7, 9, 3, 2]]
    p = [3, 2]
    a = make({}, seed=5)
    b = make({}, seed=5)
    ft.DTraining(1, 0.1, optimizer="sgd", batch_size=2, progress=False)(data, a, prefix_len=p)
    # one SGD step on the mean over the batch of the prefix loss, by hand
    _, g = b.loss_and_grad(data, prefix_len=p)
    for k, v in b.params.items():
        v -= 0.1 * g[k] / 2
    for k in a.params:
        assert np.abs(a.params[k] - b.params[k]).max() <= 1e-12 * max(1.0, np.abs(b.params[k]).max()), k
    tr = ft.DTraining(1, 0.1, optimizer="sgd", batch_size=2, progress=False, val_data=data, val_prefix_len=p)
    tr(data, a, prefix_len=p)
    assert tr.history["val_loss"][-1] == pytest.approx(a.loss(data, prefix_len=p, reduction="mean"), rel=1e-12)
    assert tr.history["tokens"][-1] == (7 - 3) + (6 - 2)


def test_bad_prefix_lengths_and_options_are_value_errors():
    model = make({})
    x = [3, 1, 4, 1, 5]
    for bad in (6, -1):
        with pytest.raises(ValueError, match="prefix_len"):
            model(x, prefix_len=bad)
        with pytest.raises(ValueError, match="prefix_len"):
            model.loss_and_grad(x, prefix_len=bad)
        with pytest.raises(ValueError, match="prefix_len"):
            ft.DInference(3, 0.0)(x, model, prefix_len=bad)
    with pytest.raises(ValueError, match="prefix_len"):
        model([x, x], prefix_len=[1, 2, 3])  # one per sequence
    with pytest.raises(ValueError, match="prefix_len of sequence 1"):
        model([x, x[:2]], prefix_len=[1, 3])
    with pytest.raises(TypeError, match="prefix_len"):
        model(x, prefix_len="3")
    with pytest.raises(TypeError, match="prefix_len"):
        model(x, prefix_len=2.0)
    causal = ft.DTransformer(19, 12, 1, 2, 8, 8)
    for call in (lambda: causal(x, prefix_len=2), lambda: causal.loss(x, prefix_len=0),
                 lambda: ft.DInference(2, 0.0)(x, causal, prefix_len=2),
                 lambda: ft.DTraining(1, 0.1, progress=False)([x], causal, prefix_len=1)):
        with pytest.raises(ValueError, match="prefix_len is given to a model without mask='prefix'"):
            call()
    with pytest.raises(ValueError, match="prefix_len"):
        ft.DTraining(1, 0.1, progress=False)([x], model, prefix_len=9)
    with pytest.raises(ValueError, match="mask must be one of 'causal', 'prefix'"):
        ft.DTransformer(19, 12, 1, 2, 8, 8, mask="bidirectional")
    with pytest.raises(ValueError, match="sliding_window"):
        ft.DTransformer(19, 12, 1, 2, 8, 8, mask="prefix", sliding_window=3)
    with pytest.raises(TypeError, match="mask"):
        ft.ETransformer(19, 12, 1, 2, 8, 8, 8, mask="prefix")
    with pytest.raises(ValueError, match="mask='prefix'"):  # GPT-2 has no prefix mask
        ft.to_hf(model)
    before = {k: np.array(v) for k, v in model.params.items()}
    with pytest.raises(ValueError):
        model.loss_and_grad(x, prefix_len=7)
    assert all((model.params[k] == v).all() for k, v in before.items())  # nothing changed


def test_mask_option_round_trips(tmp_path):
    model = make({}, dtype="float32")
    assert model.config["mask"] == "prefix" and "mask='prefix'" in repr(model)
    ft.save(model, tmp_path / "m.safetensors")
    back = ft.load(tmp_path / "m.safetensors")
    assert back.config == model.config
    x = [3, 1, 4, 1, 5]
    assert rel_err(back(x, prefix_len=3), model(x, prefix_len=3)) == 0.0
    assert ft.DTransformer(19, 12, 1, 2, 8, 8).config["mask"] == "causal"
    assert ft.DTransformer(19, 12, 1, 2, 8, 8, mask="unidirectional").config["mask"] == "causal"
