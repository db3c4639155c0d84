"""Dropout (docs/regularisation.md, issue 15): after the embedding sum, on the attention weights, on each
sublayer's output before the residual add, in DTransformer, ETransformer and EDTransformer.

What is held: rate 0 is the listings bit for bit; evaluation never drops; with the masks replayed
(model.dropout_step set back) every gradient matches central finite differences and PyTorch autograd on the
same masks (torch_listings.Drop), and the loss matches reference.py's transcription with the masks as inputs;
the masks drop a fraction p (binomial bound) and the kept entries are scaled by 1/(1−p); the same seed gives
the same run; torch.nn.TransformerEncoderLayer / DecoderLayer with our masks fed to their dropouts agree;
bad rates are refused by name.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref

from conftest import assert_directional_fd, child_env, kind_inputs, rel_err, replayed_loss, torch_or_skip

V, LMAX = 11, 12


def build(kind, dtype="float64", seed=3, **kw):
    """Small models of the three architectures (kw: dropout options and variants)."""
    if kind == "d":
        return ft.DTransformer(V, LMAX, 2, 2, 8, 12, dtype=dtype, seed=seed, **kw)
    if kind == "e":
        return ft.ETransformer(V, LMAX, 2, 2, 8, 12, 8, dtype=dtype, seed=seed, **kw)
    return ft.EDTransformer(V, LMAX, 1, 2, 2, 8, 12, dtype=dtype, seed=seed, **kw)


def inputs(kind, rng, l=7, l_z=5):
    return kind_inputs(kind, rng, V, l, l_z, masked=(1, 4))


def randomise(model, rng, scale=0.3):
    """θ away from the initialisation (biases and norms non-trivial), the same for every model it is copied to."""
    for k, v in model.params.items():
        if k == "W_p" and model.config["positional"] == "sinusoidal":
            continue
        v[...] = rng.normal(0, scale, v.shape) + (1.0 if k.split(".")[-1].startswith("gamma") else 0.0)


def copy_params(src, dst):
    dst.params.update({k: np.array(v) for k, v in src.params.items()})


def forward(model, kind, inp):
    return model(inp[0]) if kind in ("d", "e") else model(*inp)


KINDS = ["d", "e", "ed"]


# ---------------------------------------------------------------------------------------------------
# Rate 0 is the listings, bit for bit


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_rate_zero_is_bit_for_bit_the_model_without_the_option(kind, dtype):
    rng = np.random.default_rng(0)
    plain = build(kind, dtype)
    zero = build(kind, dtype, dropout=0.0, embed_dropout=0.0, attn_dropout=0.0, resid_dropout=0.0)
    randomise(plain, rng)
    copy_params(plain, zero)
    for _ in range(2):  # the counter advancing changes nothing at rate 0
        inp = inputs(kind, rng)
        np.testing.assert_array_equal(forward(plain, kind, inp), forward(zero, kind, inp))
        l0, g0 = plain.loss_and_grad(*inp)
        l1, g1 = zero.loss_and_grad(*inp)
        assert l0 == l1
        for k in g0:
            np.testing.assert_array_equal(g0[k], g1[k], err_msg=k)
        assert zero.dropout_masks() == {}  # no mask drawn
    # and the model without the option is still the listing (reference.py, float64)
    if dtype == "float64":
        P = forward(plain, kind, inp)
        hp = dict(H=2, L=2) if kind != "ed" else dict(H=2, L_enc=1, L_dec=2)
        if kind == "d":
            Pr = ref.d_transformer(inp[0], plain.params, **hp)
        elif kind == "e":
            Pr = ref.e_transformer(inp[0], plain.params, **hp)
        else:
            Pr = ref.ed_transformer(*inp, plain.params, **hp)
        assert rel_err(P, Pr) <= 1e-12


# ---------------------------------------------------------------------------------------------------
# Evaluation never drops


@pytest.mark.parametrize("kind", KINDS)
def test_evaluation_paths_are_deterministic_and_equal_the_rate_zero_model(kind):
    rng = np.random.default_rng(1)
    drop = build(kind, dropout=0.4)
    plain = build(kind)
    randomise(drop, rng)
    copy_params(drop, plain)
    inp = inputs(kind, rng)
    drop.loss_and_grad(*inp)  # a training call in between must leave no trace on the evaluating ones
    P1, P2 = forward(drop, kind, inp), forward(drop, kind, inp)
    np.testing.assert_array_equal(P1, P2)
    np.testing.assert_array_equal(P1, forward(plain, kind, inp))
    assert drop.dropout_masks() == {}
    assert drop.loss(*inp) == plain.loss(*inp)
    if kind == "e":
        np.testing.assert_array_equal(drop.hidden(inp[0]), plain.hidden(inp[0]))
        np.testing.assert_array_equal(drop.attention_weights(1), plain.attention_weights(1))
    if kind == "d":
        y1 = ft.DInference(l_gen=6, tau=1.0, seed=5)(inp[0][:3], drop)
        y2 = ft.DInference(l_gen=6, tau=1.0, seed=5)(inp[0][:3], plain)
        np.testing.assert_array_equal(y1, y2)
    if kind == "ed":
        y1 = ft.EDInference(tau=1.0, seed=5)(inp[0], drop)
        y2 = ft.EDInference(tau=1.0, seed=5)(inp[0], plain)
        np.testing.assert_array_equal(y1, y2)
    # the training call did drop: its loss differs from the evaluating one
    assert drop.loss_and_grad(*inp)[0] != plain.loss(*inp)


def test_attention_weights_after_training_call_are_the_softmax_itself():
    """attention_weights returns softmax(S/√d_attn), not the dropped weights (documented in docs/api.md)."""
    rng = np.random.default_rng(2)
    drop = ft.DTransformer(V, LMAX, 1, 2, 8, 12, dtype="float64", attn_dropout=0.5)
    plain = ft.DTransformer(V, LMAX, 1, 2, 8, 12, dtype="float64")
    randomise(drop, rng)
    copy_params(drop, plain)
    x = rng.integers(0, V, size=9)
    drop.loss_and_grad(x)
    plain.loss_and_grad(x)
    A = drop.attention_weights(0)
    np.testing.assert_array_equal(A, plain.attention_weights(0))
    np.testing.assert_allclose(A.sum(axis=1), 1.0, rtol=1e-12)
    assert not drop.dropout_masks()["layers.0.attn.weights"][0].all()


def test_trainer_validation_does_not_drop():
    """The trainers' training steps drop (loss_and_grad), their validation (loss) does not."""
    rng = np.random.default_rng(3)
    m = build("d", dropout=0.3)
    randomise(m, rng)
    x = [rng.integers(0, V, size=8) for _ in range(4)]
    t = ft.DTraining(1, 0.0, optimizer="sgd", val_data=x[:2], eval_every=1, batch_size=2, progress=False)
    t(x, m)  # η = 0: θ unchanged
    h = t.history.arrays()
    np.testing.assert_array_equal(h["val_loss"], m.loss(x[:2], reduction="mean"))
    assert m.dropout_step == 2  # two training steps drew masks


# ---------------------------------------------------------------------------------------------------
# Gradients with the masks replayed


OPTIONS = {  # dropout composes with the variants and BERT's options
    "d": [dict(dropout=0.3), dict(dropout=0.25, positional="rope", H_kv=1, mlp="swiglu", bias=False, norm="rms"),
          dict(embed_dropout=0.2, attn_dropout=0.4, resid_dropout=0.1, positional="alibi", tied=True)],
    "e": [dict(dropout=0.3), dict(dropout=0.2, n_segments=2, embed_norm=True, unembed_bias=True, bias=False)],
    "ed": [dict(dropout=0.3), dict(attn_dropout=0.3, resid_dropout=0.2, H_kv=1)],
}
CASES = [(k, i) for k in KINDS for i in range(len(OPTIONS[k]))]


@pytest.mark.parametrize("kind,i", CASES)
def test_every_gradient_matches_finite_differences_with_replayed_masks(kind, i):
    rng = np.random.default_rng(10 + i)
    m = build(kind, **OPTIONS[kind][i])
    randomise(m, rng)
    inp = inputs(kind, rng)
    step = 7
    m.dropout_step = step
    loss, g = m.loss_and_grad(*inp)
    assert m.dropout_step == step + 1
    assert m.dropout_masks()  # something was dropped
    assert replayed_loss(m, inp, step) == loss  # replayed: the same masks, the same loss
    assert_directional_fd(m, inp, step, g, rng, skip=("W_p",) if m.config["positional"] == "sinusoidal" else ())


def _torch_hp(kind, model):
    c = model.config
    if kind == "d":
        return dict(L=c["L"], norm=c["norm"])
    if kind == "e":
        return dict(L=c["L"], mask_token=model.mask_token)
    return dict(L_enc=c["L_enc"], L_dec=c["L_dec"])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_gradients_match_torch_autograd_and_reference_on_the_same_masks(kind, dtype):
    torch_or_skip()
    import torch_listings as tl

    rng = np.random.default_rng(20)
    m = build(kind, dtype, dropout=0.3, attn_dropout=0.45)
    randomise(m, rng)
    inp = inputs(kind, rng)
    loss, g = m.loss_and_grad(*inp)
    masks, cfg = m.dropout_masks(), m.config
    names = {"d": ["embed"], "e": ["embed"], "ed": ["embed.z", "embed.x", "dec.0.cross_attn.weights"]}[kind]
    assert set(names) <= set(masks) and "layers.0.attn.weights" in masks or kind == "ed"
    params = {k: np.asarray(v, dtype=np.float64) for k, v in m.params.items()}
    loss_t, g_t = tl.loss_and_grad(kind, params, *inp, drop=tl.Drop(masks, cfg), **_torch_hp(kind, m))
    tol = 1e-10 if dtype == "float64" else 2e-5
    assert abs(loss - loss_t) <= tol * max(1.0, abs(loss_t))
    for k in g:  # norm-wise, relative to the gradient or 1 (b_k's is 0 in exact arithmetic: softmax's invariance)
        err = np.linalg.norm(np.asarray(g[k], np.float64) - g_t[k]) / max(np.linalg.norm(g_t[k]), 1.0)
        assert err <= (1e-8 if dtype == "float64" else 1e-4), k
    # reference.py, line by line with the masks as inputs
    hp = {"d": dict(L=2, H=2), "e": dict(L=2, H=2, mask_token=m.mask_token), "ed": dict(L_enc=1, L_dec=2, H=2)}[kind]
    fn = {"d": ref.d_loss, "e": ref.e_loss, "ed": ref.ed_loss}[kind]
    loss_r = fn(*inp, params, masks=masks, rates=cfg, **hp)
    assert abs(loss_r - loss_t) <= 1e-12 * max(1.0, abs(loss_t))
    # without the masks the references give the evaluating loss, which differs
    assert abs(fn(*inp, params, **hp) - loss_r) > 1e-6


def test_reference_dropout_listing():
    """reference.dropout is D1 line 2 and dropout_backward D2, given the mask."""
    Y = np.arange(6.0).reshape(2, 3)
    M = np.array([[1, 0, 1], [0, 1, 1]], dtype=bool)
    np.testing.assert_array_equal(ref.dropout(Y, M, 0.5), Y * M * 2)
    np.testing.assert_array_equal(ref.dropout_backward(Y, M, 0.75), Y * M * 4)


# ---------------------------------------------------------------------------------------------------
# The masks: fraction dropped, scaling, reproducibility


def test_fraction_dropped_is_p_within_a_binomial_bound():
    """Each place's kept count k of n entries is Binomial(n, 1−p): |k − n(1−p)| ≤ 5.5σ (two-sided false-alarm
    rate 4e-8 per check, < 1e-6 over this test's checks). Also: places and steps draw different masks."""
    for p in (0.1, 0.5, 0.8):
        m = ft.EDTransformer(V, 64, 1, 1, 4, 32, 48, dropout=p, seed=9)
        x = np.arange(64) % (V - 3)
        seen = []
        for step in range(3):
            m.loss_and_grad(x, x)
            for name, M in m.dropout_masks().items():
                M = np.concatenate([a.ravel() for a in M]) if isinstance(M, list) else M.ravel()
                n, k = M.size, int(M.sum())
                sd = math.sqrt(n * p * (1 - p))
                assert abs(k - n * (1 - p)) <= 5.5 * sd, (p, name, k, n)
                seen.append(M[:512].tobytes())
        assert len(set(seen)) == len(seen)  # no two places or steps share a mask


def test_kept_entries_are_scaled_by_one_over_keep_probability():
    """A model whose every layer is the identity except the dropout after the embedding: with W_u = I the logits
    are the dropped embeddings, so each kept entry is e/(1−p) and each dropped one 0 (ETransformer's
    hidden state is not available in training, so this reads the gradient: ∂loss/∂W_e through the mask)."""
    p = 0.25
    m = ft.DTransformer(V, LMAX, 1, 1, 4, 4, dtype="float64", embed_dropout=p, seed=1)
    plain = ft.DTransformer(V, LMAX, 1, 1, 4, 4, dtype="float64", seed=1)
    rng = np.random.default_rng(4)
    randomise(m, rng)
    copy_params(m, plain)
    x = rng.integers(0, V, size=10)
    loss, g = m.loss_and_grad(x)
    M = m.dropout_masks()["embed"]
    # ∂loss/∂W_p[:, t] = ∂loss/∂X̃[:, t] ⊙ M[:, t] / (1 − p): zero exactly where dropped
    assert np.all(g["W_p"][:, : len(x)][~M] == 0)
    # and the loss is the reference's with Y ⊙ M / (1 − p)
    np.testing.assert_allclose(loss, ref.d_loss(x, dict(m.params), L=1, H=1, masks={"embed": M},
                                                 rates=m.config), rtol=1e-12)
    # a different scaling (1/(1−p) replaced by 1) would not give that loss
    assert abs(ref.d_loss(x, dict(m.params), L=1, H=1, masks={"embed": M}, rates={"embed_dropout": 0.0}) - loss) > 1e-8


def _train(seed, steps=6, theta_from=None):
    m = build("d", dtype="float32", seed=seed, dropout=0.2)
    if theta_from is not None:
        copy_params(theta_from, m)
    rng = np.random.default_rng(0)
    data = [rng.integers(0, V, size=10) for _ in range(12)]
    ft.DTraining(1, 1e-2, batch_size=2, max_steps=steps, progress=False)(data, m)
    return m


def test_same_seed_same_run_different_seed_different_masks():
    a, b = _train(1), _train(1)
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], b.params[k], err_msg=k)
    assert a.dropout_step == b.dropout_step == 6
    c = _train(2, theta_from=build("d", dtype="float32", seed=1))  # same θ₀, another seed: other masks
    assert any(not np.array_equal(a.params[k], c.params[k]) for k in a.params)
    x = np.arange(9) % V
    for m in (a, c):
        m.dropout_step = 0
        m.loss_and_grad(x)
    Ma, Mc = a.dropout_masks(), c.dropout_masks()
    assert Ma.keys() == Mc.keys() and not np.array_equal(Ma["embed"], Mc["embed"])


def test_save_load_round_trips_rates_and_counter(tmp_path):
    m = build("e", dropout=0.1, attn_dropout=0.35)
    m.loss_and_grad(*inputs("e", np.random.default_rng(0)))
    ft.save(m, tmp_path / "m.safetensors")
    m2 = ft.load(tmp_path / "m.safetensors")
    assert m2.config == m.config
    assert (m2.config["embed_dropout"], m2.config["attn_dropout"], m2.config["resid_dropout"]) == (0.1, 0.35, 0.1)
    assert m2.dropout_step == m.dropout_step == 1
    inp = inputs("e", np.random.default_rng(1))
    assert m.loss_and_grad(*inp)[0] == m2.loss_and_grad(*inp)[0]  # the same next masks


# ---------------------------------------------------------------------------------------------------
# Against PyTorch's own layers


def _feed_masks(torch, queue, rates):
    """A stand-in for torch.nn.functional.dropout applying our masks in call order (None: the call is the
    MLP's inner dropout of torch's layers, which Algorithm 8 does not have: identity)."""

    def dropout(input, p=0.5, training=True, inplace=False):
        assert training
        M, want = queue.pop(0)
        if M is None:
            return input
        assert p == want, (p, want)
        return input * torch.as_tensor(M, dtype=input.dtype) / (1.0 - p)

    return dropout


def test_torch_transformer_layers_with_our_masks_agree():
    """EDTransformer with dropout vs torch.nn.TransformerEncoderLayer / TransformerDecoderLayer (post-LN, ReLU,
    batch_first, dropout = our rate, training mode) with our masks fed to torch's dropout calls: loss and every
    gradient agree (float64)."""
    torch_or_skip()
    import torch
    import torch.nn.functional as F

    p = 0.3
    rng = np.random.default_rng(5)
    m = ft.EDTransformer(V, LMAX, 2, 2, 2, 8, 12, dtype="float64", dropout=p, seed=2)
    randomise(m, rng)
    twin = ft.EDTransformer(V, LMAX, 2, 2, 2, 8, 12, dtype="float64", seed=2)
    copy_params(m, twin)
    z, x = rng.integers(0, V, size=6), rng.integers(0, V, size=7)
    loss, g = m.loss_and_grad(z, x)
    M = m.dropout_masks()
    mod = ft.to_torch(twin)
    mod.train()
    for layer in list(mod.enc) + list(mod.dec):
        for name, sub in layer.named_modules():
            if isinstance(sub, torch.nn.Dropout):
                sub.p = p
            if isinstance(sub, torch.nn.MultiheadAttention):
                sub.dropout = p
                orig = sub.forward
                # the weights' dropout is an F.dropout call only on the need_weights path
                sub.forward = (lambda orig: lambda *a, **k: orig(*a, **{**k, "need_weights": True,
                                                                        "average_attn_weights": False}))(orig)
    w = lambda name: (M[name][0].transpose(0, 2, 1), p)  # ours (H, keys, queries) -> torch's (H, queries, keys)
    o = lambda name: (M[name].T[None], p)  # ours (d_e, ℓ) -> torch's (1, ℓ, d_e)
    queue = [o("embed.z")]
    for l in range(2):
        e = f"enc.{l}."
        queue += [w(e + "attn.weights"), o(e + "attn.out"), (None, p), o(e + "mlp.out")]
    queue += [o("embed.x")]
    for l in range(2):
        d = f"dec.{l}."
        queue += [w(d + "attn.weights"), o(d + "attn.out"), w(d + "cross_attn.weights"), o(d + "cross_attn.out"),
                  (None, p), o(d + "mlp.out")]
    emb_forward = mod.emb.forward
    fake = _feed_masks(torch, queue, p)
    mod.emb.forward = lambda ids: fake(emb_forward(ids), p)  # our dropout after lines 3 and 12
    real = F.dropout
    F.dropout = fake
    try:
        loss_t = mod.loss(z, x)
        loss_t.backward()
    finally:
        F.dropout = real
    assert queue == []  # every mask was used, in the order torch called for them
    assert abs(float(loss_t.detach()) - loss) <= 1e-12 * abs(loss)
    gt = mod.ft_grads()
    for k in g:
        assert np.linalg.norm(g[k] - gt[k]) <= 1e-8 * max(np.linalg.norm(gt[k]), 1.0), k


def test_torch_and_hf_exports_map_or_refuse_the_rates():
    torch_or_skip()
    m = build("ed", dropout=0.1)
    with pytest.raises(ValueError, match="dropout"):
        ft.to_torch(m)
    with pytest.raises(ValueError, match="dropout"):
        ft.to_torch(build("d", attn_dropout=0.2))
    ft.to_torch(build("d", dropout=0.0))  # rate 0: the listing, exportable


# ---------------------------------------------------------------------------------------------------
# Bad input


@pytest.mark.parametrize("option", ["dropout", "embed_dropout", "attn_dropout", "resid_dropout"])
@pytest.mark.parametrize("kind", KINDS)
def test_bad_rates_are_refused_by_name(kind, option):
    for bad in (-0.1, 1.0, 1.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=option):
            build(kind, **{option: bad})
    for bad in ("0.1", True, [0.1], None if option == "dropout" else "x"):
        with pytest.raises(TypeError, match=option):
            build(kind, **{option: bad})
    m = build(kind, **{option: 0.5})
    assert all(0 <= m.config[k] < 1 for k in ("embed_dropout", "attn_dropout", "resid_dropout"))


def test_bad_dropout_step():
    m = build("d")
    with pytest.raises(ValueError, match="dropout_step"):
        m.dropout_step = -1
    with pytest.raises(TypeError, match="dropout_step"):
        m.dropout_step = 1.5
    m.dropout_step = 2**64 - 1
    assert m.dropout_step == 2**64 - 1


@pytest.mark.parametrize("kind", ["d", "e", "ed"])
def test_dropout_seed_keys_the_masks_and_defaults_to_the_seed(kind):
    """model.dropout_seed starts as the model's seed (the masks of before it existed); another value gives other
    masks from the same θ (data-parallel workers), and setting it back replays the first ones."""
    rng = np.random.default_rng(5)
    inp = inputs(kind, rng)
    a = build(kind, seed=3, dropout=0.3)
    assert a.dropout_seed == 3
    la, ga = a.loss_and_grad(*inp)
    Ma = a.dropout_masks()
    b = build(kind, seed=3, dropout=0.3)
    b.dropout_seed = 4
    lb, _ = b.loss_and_grad(*inp)
    Mb = b.dropout_masks()
    assert Ma.keys() == Mb.keys()
    assert any(not np.array_equal(Ma[k], Mb[k]) for k in Ma if not k.endswith(".weights")), "the same masks"
    assert lb != la
    b.dropout_seed, b.dropout_step = 3, 0  # back to the model's seed: the masks (and the gradient) of `a`
    lb3, gb3 = b.loss_and_grad(*inp)
    assert lb3 == la
    for k in ga:
        np.testing.assert_array_equal(gb3[k], ga[k], err_msg=k)
    c = build(kind, seed=9, dropout=0.3)  # another θ₀, the same dropout seed and step: the same masks
    c.dropout_seed = 3
    c.loss_and_grad(*inp)
    Mc = c.dropout_masks()
    for k in Ma:
        if not k.endswith(".weights"):
            np.testing.assert_array_equal(Mc[k], Ma[k], err_msg=k)


def test_bad_dropout_seed():
    m = build("d")
    with pytest.raises(ValueError, match="dropout_seed"):
        m.dropout_seed = -1
    with pytest.raises(TypeError, match="dropout_seed"):
        m.dropout_seed = "1"
    m.dropout_seed = 2**64 - 1
    assert m.dropout_seed == 2**64 - 1


def test_save_load_keeps_the_dropout_seed_and_old_files_use_the_seed(tmp_path):
    m = build("d", seed=3, dropout=0.2)
    m.dropout_seed = 11
    m.loss_and_grad(np.arange(7) % V)
    ft.save(m, tmp_path / "m.safetensors")
    m2 = ft.load(tmp_path / "m.safetensors")
    assert (m2.dropout_seed, m2.dropout_step) == (11, 1)
    x = np.arange(1, 8) % V
    assert m.loss_and_grad(x)[0] == m2.loss_and_grad(x)[0]  # the same next masks
    # a file without the key (written before dropout_seed existed): the model's seed, as then
    from safetensors.numpy import load_file, save_file
    from safetensors import safe_open

    with safe_open(str(tmp_path / "m.safetensors"), "np") as f:
        meta = dict(f.metadata())
    del meta["formal_transformers.dropout_seed"]
    save_file(load_file(str(tmp_path / "m.safetensors")), str(tmp_path / "old.safetensors"), metadata=meta)
    assert ft.load(tmp_path / "old.safetensors").dropout_seed == 3
    meta["formal_transformers.dropout_seed"] = "-5"
    save_file(load_file(str(tmp_path / "m.safetensors")), str(tmp_path / "bad.safetensors"), metadata=meta)
    with pytest.raises(ValueError, match="dropout_seed"):
        ft.load(tmp_path / "bad.safetensors")


def test_cli_train_dropout_and_resume_keeps_the_counter(tmp_path):
    """`python -m formal_transformers train --dropout p`: the model drops at p; a resumed run continues the
    mask stream (dropout_step saved with the model) instead of replaying the first steps' masks."""
    import subprocess
    import sys

    (tmp_path / "t.txt").write_text("the quick brown fox jumps over the lazy dog. " * 40)
    small = ["--text", "t.txt", "--out", "run", "--context", "16", "--layers", "1", "--heads", "2", "--d-e", "16",
             "--d-mlp", "32", "--batch", "4", "--eval-every", "0", "--warmup", "1", "--quiet", "--dropout", "0.2"]
    for steps in ("6", "10"):
        r = subprocess.run([sys.executable, "-m", "formal_transformers", "train", *small, "--steps", steps]
                           + (["--resume"] if steps == "10" else []), cwd=tmp_path, env=child_env(),
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        m = ft.load(tmp_path / "run" / "model.safetensors")
        assert m.config["resid_dropout"] == m.config["attn_dropout"] == m.config["embed_dropout"] == 0.2
        assert m.dropout_step == int(steps)
