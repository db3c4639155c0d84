"""Algorithms 8–10 (EDTransformer, ETransformer, DTransformer) and their losses (Algorithms 11–13, the
loss lines): native vs reference.py (forward), vs an independent PyTorch transcription (every gradient),
vs central finite differences, masking, batching, the parameter contract of docs/api.md and bad input.

Models are small and their parameters random (non-trivial γ, β, biases), so a term that is dropped or
mixed up shows. Tolerances are DEVELOPING.md's: forward f64 ≤1e-12, f32 ≤1e-5 (relative, norm-wise);
gradients vs PyTorch autograd ≤1e-8, vs finite differences ≤1e-6 (float64).
"""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref

from conftest import TOL, numeric_grad, rel_err, torch_or_skip

# ---------------------------------------------------------------------------------------------------
# Configurations: kind "d" (Alg 10), "e" (Alg 9), "ed" (Alg 8). Covers L = 1 and L > 1, H = 1 and H > 1,
# d_attn ≠ d_mid given explicitly, d_f ≠ d_e, L_enc ≠ L_dec, and D's variants.

CONFIGS = {
    "d_small": dict(kind="d", n_vocab=11, l_max=6, L=1, H=1, d_e=8, d_mlp=16),
    "d_deep": dict(kind="d", n_vocab=13, l_max=9, L=2, H=2, d_e=12, d_mlp=20),
    "d_explicit": dict(kind="d", n_vocab=10, l_max=7, L=3, H=3, d_e=12, d_mlp=8, d_attn=5, d_mid=3),
    "d_rms": dict(kind="d", n_vocab=12, l_max=8, L=2, H=2, d_e=8, d_mlp=12, norm="rms"),
    "d_sinusoidal": dict(kind="d", n_vocab=12, l_max=8, L=2, H=2, d_e=10, d_mlp=12, positional="sinusoidal"),
    "d_tied": dict(kind="d", n_vocab=12, l_max=8, L=2, H=2, d_e=8, d_mlp=12, tied=True),
    "d_tanh": dict(kind="d", n_vocab=12, l_max=8, L=2, H=4, d_e=8, d_mlp=12, gelu="tanh"),
    "d_all_variants": dict(kind="d", n_vocab=9, l_max=6, L=2, H=2, d_e=6, d_mlp=10, d_attn=4, d_mid=2, norm="rms",
                           positional="sinusoidal", tied=True, gelu="tanh", eps=1e-3),
    "e_small": dict(kind="e", n_vocab=12, l_max=6, L=1, H=1, d_e=8, d_mlp=16, d_f=8),
    "e_deep": dict(kind="e", n_vocab=14, l_max=9, L=2, H=2, d_e=12, d_mlp=20, d_f=10),
    "e_explicit": dict(kind="e", n_vocab=10, l_max=7, L=3, H=3, d_e=12, d_mlp=8, d_f=7, d_attn=5, d_mid=3,
                       gelu="tanh"),
    "e_tied_sinusoidal": dict(kind="e", n_vocab=11, l_max=7, L=2, H=2, d_e=8, d_mlp=12, d_f=8, tied=True,
                              positional="sinusoidal", eps=1e-4),
    "ed_small": dict(kind="ed", n_vocab=12, l_max=7, L_enc=1, L_dec=1, H=1, d_e=8, d_mlp=16),
    "ed_deep": dict(kind="ed", n_vocab=13, l_max=8, L_enc=2, L_dec=3, H=2, d_e=12, d_mlp=20),
    "ed_explicit": dict(kind="ed", n_vocab=10, l_max=7, L_enc=3, L_dec=2, H=3, d_e=12, d_mlp=8, d_attn=5, d_mid=3),
    "ed_tied_sinusoidal": dict(kind="ed", n_vocab=11, l_max=7, L_enc=1, L_dec=2, H=2, d_e=8, d_mlp=12, tied=True,
                               positional="sinusoidal", eps=1e-4),
}
ALL = list(CONFIGS)
SMALLEST = {"d": "d_deep", "e": "e_deep", "ed": "ed_deep"}  # one per architecture, for the cheaper checks

_POSITIONAL = {"d": ("n_vocab", "l_max", "L", "H", "d_e", "d_mlp"),
               "e": ("n_vocab", "l_max", "L", "H", "d_e", "d_mlp", "d_f"),
               "ed": ("n_vocab", "l_max", "L_enc", "L_dec", "H", "d_e", "d_mlp")}
_CLASS = {"d": "DTransformer", "e": "ETransformer", "ed": "EDTransformer"}
ATTN = ("W_q", "b_q", "W_k", "b_k", "W_v", "b_v", "W_o", "b_o")


def build(cfg, dtype="float64", seed=0, **override):
    """The native model of a configuration (constructor exactly as docs/api.md writes it)."""
    cfg = {**cfg, **override}
    kind = cfg["kind"]
    args = [cfg[k] for k in _POSITIONAL[kind]]
    kw = {k: v for k, v in cfg.items() if k not in _POSITIONAL[kind] and k != "kind"}
    return getattr(ft, _CLASS[kind])(*args, dtype=dtype, seed=seed, **kw)


def expected_shapes(cfg) -> dict:
    """docs/api.md's parameter names and shapes for a configuration (W_u left out when tied: it may be absent)."""
    kind, V, l_max, H, d_e = cfg["kind"], cfg["n_vocab"], cfg["l_max"], cfg["H"], cfg["d_e"]
    d_mlp = cfg["d_mlp"]
    d_attn, d_mid = cfg.get("d_attn", d_e // H), cfg.get("d_mid", d_e // H)
    s = {"W_e": (d_e, V), "W_p": (d_e, l_max)}
    if not cfg.get("tied"):
        s["W_u"] = (V, cfg["d_f"] if kind == "e" else d_e)

    def attn(prefix):
        s.update({prefix + "W_q": (H, d_attn, d_e), prefix + "b_q": (H, d_attn), prefix + "W_k": (H, d_attn, d_e),
                  prefix + "b_k": (H, d_attn), prefix + "W_v": (H, d_mid, d_e), prefix + "b_v": (H, d_mid),
                  prefix + "W_o": (d_e, H * d_mid), prefix + "b_o": (d_e,)})

    def norms(prefix, ks, rms=False):
        for k in ks:
            s[f"{prefix}gamma{k}"] = (d_e,)
            if not rms:
                s[f"{prefix}beta{k}"] = (d_e,)

    def mlp(prefix, a, b):
        s.update({f"{prefix}W_mlp{a}": (d_mlp, d_e), f"{prefix}b_mlp{a}": (d_mlp,),
                  f"{prefix}W_mlp{b}": (d_e, d_mlp), f"{prefix}b_mlp{b}": (d_e,)})

    if kind in ("d", "e"):
        rms = cfg.get("norm") == "rms"
        for l in range(cfg["L"]):
            attn(f"layers.{l}.attn.")
            norms(f"layers.{l}.", (1, 2), rms)
            mlp(f"layers.{l}.", 1, 2)
        d_final = d_e
        if kind == "e":
            d_final = cfg["d_f"]
            s["W_f"], s["b_f"] = (d_final, d_e), (d_final,)
        s["gamma"] = (d_final,)
        if not rms:
            s["beta"] = (d_final,)
    else:
        for l in range(cfg["L_enc"]):
            attn(f"enc.{l}.attn.")
            norms(f"enc.{l}.", (1, 2))
            mlp(f"enc.{l}.", 1, 2)
        for l in range(cfg["L_dec"]):
            attn(f"dec.{l}.attn.")
            attn(f"dec.{l}.cross_attn.")
            norms(f"dec.{l}.", (3, 4, 5))
            mlp(f"dec.{l}.", 3, 4)
    return s


def random_value(name, shape, rng):
    """A random, well-scaled value for parameter `name`: γ ≈ 1, β and biases ≈ 0.2, matrices ~ 1/√fan_in."""
    last = name.rsplit(".", 1)[-1]
    z = rng.standard_normal(shape)
    if last.startswith("gamma"):
        return 1.0 + 0.3 * z
    if last.startswith("beta") or last.startswith("b_"):
        return 0.3 * z
    if last == "W_e":
        return z
    if last == "W_p":
        return 0.5 * z
    if last == "W_u":
        return 2.0 * z / math.sqrt(shape[1])
    return z / math.sqrt(shape[-1])


def is_fixed(cfg, name):
    return name == "W_p" and cfg.get("positional") == "sinusoidal"


def randomize(model, cfg, rng):
    """Random values written into the model's params (zero-copy views); returns them as float64 copies of
    what the model holds (after rounding to its dtype): the θ that the references use."""
    for name in model.params.keys():
        if is_fixed(cfg, name) or (cfg.get("tied") and name == "W_u"):
            continue  # sinusoidal W_p is fixed; a tied W_u is a view of W_e
        view = model.params[name]
        view[...] = random_value(name, view.shape, rng)
    return params_of(model)


def params_of(model):
    return {k: np.array(v, dtype=np.float64) for k, v in model.params.items()}


def random_model(name, seed):
    """CONFIGS[name] built with random parameters (randomize) from default_rng(seed): (cfg, that generator — the
    test draws its inputs on from it, model)."""
    cfg = CONFIGS[name]
    rng = np.random.default_rng(seed)
    model = build(cfg)
    randomize(model, cfg, rng)
    return cfg, rng, model


def random_params(cfg, rng):
    """θ for the reference-vs-PyTorch cross-checks (no native model needed)."""
    p = {k: random_value(k, shape, rng) for k, shape in expected_shapes(cfg).items()}
    if cfg.get("positional") == "sinusoidal":
        p["W_p"] = ref.sinusoidal_positions(cfg["l_max"], cfg["d_e"])
    return p


def ref_hp(cfg):
    eps = cfg.get("eps", 1e-5)
    if cfg["kind"] == "d":
        return dict(L=cfg["L"], H=cfg["H"], norm=cfg.get("norm", "layer"), gelu=cfg.get("gelu", "exact"), eps=eps)
    if cfg["kind"] == "e":
        return dict(L=cfg["L"], H=cfg["H"], gelu=cfg.get("gelu", "exact"), eps=eps)
    return dict(L_enc=cfg["L_enc"], L_dec=cfg["L_dec"], H=cfg["H"], eps=eps)


def torch_hp(cfg):
    hp = ref_hp(cfg)
    hp.pop("H")
    return hp


def ref_forward(cfg, params, inputs, logits=False):
    fn = {"d": ref.d_transformer, "e": ref.e_transformer, "ed": ref.ed_transformer}[cfg["kind"]]
    return fn(*inputs, params, logits=logits, **ref_hp(cfg))


def ref_loss(cfg, params, inputs):
    kind = cfg["kind"]
    if kind == "d":
        return ref.d_loss(*inputs, params, **ref_hp(cfg))
    if kind == "e":
        return ref.e_loss(*inputs, params, cfg["n_vocab"] - 3, **ref_hp(cfg))
    return ref.ed_loss(*inputs, params, **ref_hp(cfg))


def torch_loss_and_grad(tl, cfg, params, inputs):
    hp = torch_hp(cfg)
    if cfg["kind"] == "e":
        hp["mask_token"] = cfg["n_vocab"] - 3
    return tl.loss_and_grad(cfg["kind"], params, *inputs, tied=bool(cfg.get("tied")), **hp)


def masked(x, cfg, rng, n_mask=None):
    """x̃ for the masked-LM loss: ≥1 position set to mask_token, one further position (if any) replaced by a
    random non-mask token (BERT's corruption), which must not be scored."""
    V = cfg["n_vocab"]
    x_tilde = np.array(x, copy=True)
    l = len(x)
    n_mask = n_mask if n_mask is not None else max(1, l // 3)
    pos = rng.permutation(l)
    x_tilde[pos[:n_mask]] = V - 3
    if l > n_mask:
        t = pos[n_mask]
        x_tilde[t] = (x[t] + 1) % (V - 3)  # a different, non-special token
    return x_tilde


def sample_inputs(cfg, rng, l=None, l_z=None):
    """Model inputs for one sequence (tuple): (x,) for D, (x̃, x) for E, (z, x) for ED; ids avoid the
    mask token in x so that x̃ alone decides T̃."""
    V, l_max = cfg["n_vocab"], cfg["l_max"]
    l = l if l is not None else l_max
    x = rng.integers(0, V - 3, l)
    if cfg["kind"] == "d":
        return (x,)
    if cfg["kind"] == "e":
        return (masked(x, cfg, rng), x)
    return (rng.integers(0, V, l_z if l_z is not None else max(1, l_max - 2)), x)


def forward_inputs(inputs, kind):
    """What the model is called on: D (x), E (x̃), ED (z, x)."""
    return inputs[:1] if kind == "e" else inputs


@pytest.fixture(scope="module")
def tl():
    torch_or_skip()
    import torch_listings

    return torch_listings


# ---------------------------------------------------------------------------------------------------
# The references against each other (need only reference.py and torch_listings.py)


@pytest.mark.parametrize("name", ALL)
def test_reference_matches_independent_torch_transcription(tl, name):
    """reference.py (numpy, line by line) and torch_listings.py (torch kernels) agree on P and the loss."""
    cfg = CONFIGS[name]
    rng = np.random.default_rng(1)
    params = random_params(cfg, rng)
    for l, l_z in [(1, 2), (cfg["l_max"], 1), (3, cfg["l_max"])]:
        inputs = sample_inputs(cfg, rng, l=l, l_z=l_z)
        P = ref_forward(cfg, params, forward_inputs(inputs, cfg["kind"]))
        assert P.shape == (cfg["n_vocab"], l)
        np.testing.assert_allclose(P.sum(axis=0), 1.0, rtol=1e-13)
        P_t = tl.probabilities(cfg["kind"], params, *forward_inputs(inputs, cfg["kind"]), tied=bool(cfg.get("tied")),
                               **torch_hp(cfg))
        assert rel_err(P, P_t) <= 1e-12
        loss_t, _ = torch_loss_and_grad(tl, cfg, params, inputs)
        loss = ref_loss(cfg, params, inputs)
        assert abs(loss - loss_t) <= 1e-12 * max(1.0, abs(loss_t))


@pytest.mark.parametrize("name", ["d_deep", "d_all_variants", "e_explicit", "ed_deep"])
def test_torch_transcription_gradients_match_finite_differences_of_reference(tl, name):
    """The gradient oracle itself: torch autograd vs central differences of reference.py's loss."""
    cfg = CONFIGS[name]
    rng = np.random.default_rng(2)
    params = random_params(cfg, rng)
    inputs = sample_inputs(cfg, rng, l=5)
    _, grads = torch_loss_and_grad(tl, cfg, params, inputs)
    for pname in [n for n in ("W_e", "W_u", "W_f", "beta", "gamma") if n in params] + \
                 [n for n in params if n.endswith((".attn.W_q", ".cross_attn.W_k", "gamma2", "b_mlp1"))][:4]:
        if is_fixed(cfg, pname):
            continue
        entries = _entries(grads[pname], rng, 3)
        fd = numeric_grad(lambda: ref_loss(cfg, params, inputs), params[pname], entries=entries)
        assert rel_err([grads[pname][i] for i in entries], fd) <= 1e-6, pname


# ---------------------------------------------------------------------------------------------------
# The parameter contract


@pytest.mark.parametrize("name", ALL)
def test_param_names_shapes_and_dtype(name, dtype):
    cfg = CONFIGS[name]
    model = build(cfg, dtype)
    want = expected_shapes(cfg)
    names = set(model.params.keys())
    if cfg.get("tied"):
        if "W_u" in names:  # allowed only as a view of W_e
            assert model.params["W_u"].shape == (cfg["n_vocab"], cfg["d_e"])
            assert np.shares_memory(model.params["W_u"], model.params["W_e"])
            np.testing.assert_array_equal(model.params["W_u"], model.params["W_e"].T)
            names.discard("W_u")
    assert names == set(want), f"missing {sorted(set(want) - names)}, unexpected {sorted(names - set(want))}"
    for k, shape in want.items():
        assert model.params[k].shape == shape, k
        assert model.params[k].dtype == np.dtype(dtype), k
    assert set(model.grads.keys()) == set(model.params.keys())
    for k in model.params.keys():
        assert model.grads[k].shape == model.params[k].shape, k


def test_default_dtype_is_float32_and_special_tokens():
    for cfg in (CONFIGS["d_small"], CONFIGS["e_small"], CONFIGS["ed_small"]):
        kind = cfg["kind"]
        args = [cfg[k] for k in _POSITIONAL[kind]]
        model = getattr(ft, _CLASS[kind])(*args)
        assert model.params["W_e"].dtype == np.float32
        V = cfg["n_vocab"]
        assert (model.mask_token, model.bos_token, model.eos_token) == (V - 3, V - 2, V - 1)
        inputs = forward_inputs(sample_inputs(cfg, np.random.default_rng(0), l=3, l_z=2), kind)
        P = model(*inputs)
        assert P.dtype == np.float32 and P.shape == (V, 3)


def test_seed_makes_initialisation_reproducible():
    cfg = CONFIGS["d_deep"]
    a, b, c = build(cfg, seed=7), build(cfg, seed=7), build(cfg, seed=8)
    for k in a.params.keys():
        np.testing.assert_array_equal(a.params[k], b.params[k])
    assert any(not np.array_equal(a.params[k], c.params[k]) for k in a.params.keys())


@pytest.mark.parametrize("name", ["d_sinusoidal", "e_tied_sinusoidal", "ed_tied_sinusoidal"])
def test_sinusoidal_W_p_is_the_papers_and_fixed(name, dtype):
    cfg = CONFIGS[name]
    model = build(cfg, dtype)
    want = ref.sinusoidal_positions(cfg["l_max"], cfg["d_e"])
    assert rel_err(model.params["W_p"], want) <= TOL[dtype]
    rng = np.random.default_rng(3)
    randomize(model, cfg, rng)
    inputs = sample_inputs(cfg, rng, l=4)
    _, grads = model.loss_and_grad(*inputs)
    assert not np.any(grads["W_p"]), "the fixed sinusoidal W_p must get a zero gradient"
    assert rel_err(model.params["W_p"], want) <= TOL[dtype]


# ---------------------------------------------------------------------------------------------------
# Forward vs reference.py


def _lengths(cfg):
    l_max = cfg["l_max"]
    return [(1, 1), (l_max, 3), (2, l_max), (l_max - 2, l_max - 1)]  # (ℓ_x, ℓ_z); ℓ_z used by ED only


@pytest.mark.parametrize("name", ALL)
def test_forward_matches_reference(name, dtype):
    cfg = CONFIGS[name]
    rng = np.random.default_rng(4)
    model = build(cfg, dtype)
    params = randomize(model, cfg, rng)
    for l, l_z in _lengths(cfg):
        inputs = forward_inputs(sample_inputs(cfg, rng, l=l, l_z=l_z), cfg["kind"])
        P = model(*inputs)
        assert P.shape == (cfg["n_vocab"], l) and P.dtype == np.dtype(dtype)
        want = ref_forward(cfg, params, inputs)
        err = rel_err(P, want)
        assert err <= TOL[dtype], f"P: ℓ={l}, ℓ_z={l_z}: rel err {err:.3g} > {TOL[dtype]}"
        logits = model.logits(*inputs)
        want_logits = ref_forward(cfg, params, inputs, logits=True)
        err = rel_err(logits, want_logits)
        assert err <= TOL[dtype], f"logits: ℓ={l}, ℓ_z={l_z}: rel err {err:.3g} > {TOL[dtype]}"


@pytest.mark.parametrize("name", ["d_small", "d_explicit", "d_all_variants", "e_deep", "ed_explicit"])
def test_batched_forward_is_per_sequence(name, dtype):
    cfg = CONFIGS[name]
    rng = np.random.default_rng(5)
    model = build(cfg, dtype)
    params = randomize(model, cfg, rng)
    N, l, l_z = 3, cfg["l_max"] - 1, 2
    batch = [sample_inputs(cfg, rng, l=l, l_z=l_z) for _ in range(N)]
    inputs2 = [np.stack([b[i] for b in batch]) for i in range(len(batch[0]))]
    inputs2 = forward_inputs(tuple(inputs2), cfg["kind"])
    P = model(*inputs2)
    logits = model.logits(*inputs2)
    assert P.shape == (N, cfg["n_vocab"], l) and logits.shape == (N, cfg["n_vocab"], l)
    for n in range(N):
        one = forward_inputs(batch[n], cfg["kind"])
        assert rel_err(P[n], ref_forward(cfg, params, one)) <= TOL[dtype], n
        assert rel_err(logits[n], ref_forward(cfg, params, one, logits=True)) <= TOL[dtype], n


def test_ids_of_any_integer_dtype_and_lists():
    cfg = CONFIGS["d_deep"]
    model = build(cfg)
    randomize(model, cfg, np.random.default_rng(6))
    x = np.array([3, 1, 4, 1, 5])
    want = model(x)
    for variant in (x.astype(np.int32), x.astype(np.uint8), x.astype(np.int16), list(x), [int(v) for v in x]):
        np.testing.assert_array_equal(model(variant), want)


# ---------------------------------------------------------------------------------------------------
# Masking


@pytest.mark.parametrize("name", ["d_deep", "d_explicit", "d_all_variants"])
def test_decoder_only_is_causal(name):
    cfg, rng, model = random_model(name, 7)
    l = cfg["l_max"]
    x = rng.integers(0, cfg["n_vocab"], l)
    P = model(x)
    for t in range(l - 1):
        x2 = x.copy()
        x2[t + 1:] = (x[t + 1:] + 1 + rng.integers(0, cfg["n_vocab"] - 1, l - t - 1)) % cfg["n_vocab"]
        P2 = model(x2)
        assert rel_err(P2[:, : t + 1], P[:, : t + 1]) <= 1e-13, f"P[:, :{t + 1}] depends on x[{t + 1}:]"
        assert rel_err(P2[:, t + 1:], P[:, t + 1:]) > 1e-6  # later columns do see the change
        assert rel_err(model(x[: t + 1]), P[:, : t + 1]) <= 1e-12  # a prefix gives the same columns


@pytest.mark.parametrize("name", ["ed_deep", "ed_explicit"])
def test_encoder_decoder_decoder_side_is_causal_and_sees_all_of_z(name):
    cfg, rng, model = random_model(name, 8)
    V, l = cfg["n_vocab"], cfg["l_max"]
    z, x = rng.integers(0, V, 4), rng.integers(0, V, l)
    P = model(z, x)
    for t in range(l - 1):
        x2 = x.copy()
        x2[t + 1:] = (x[t + 1:] + 1) % V
        assert rel_err(model(z, x2)[:, : t + 1], P[:, : t + 1]) <= 1e-13, f"P[:, :{t + 1}] depends on x[{t + 1}:]"
        assert rel_err(model(z, x[: t + 1]), P[:, : t + 1]) <= 1e-12
    z2 = z.copy()
    z2[-1] = (z[-1] + 1) % V  # the last source token: every target position attends to it (Mask ≡ 1)
    P2 = model(z2, x)
    for t in range(l):
        assert rel_err(P2[:, t], P[:, t]) > 1e-8, f"P[:, {t}] does not see z[-1]"


def test_encoder_only_is_bidirectional():
    cfg, rng, model = random_model("e_deep", 9)
    x = rng.integers(0, cfg["n_vocab"], cfg["l_max"])
    x2 = x.copy()
    x2[-1] = (x[-1] + 1) % cfg["n_vocab"]
    assert rel_err(model(x2)[:, 0], model(x)[:, 0]) > 1e-8, "P[:, 0] does not see x[-1]"


# ---------------------------------------------------------------------------------------------------
# Losses and gradients


@pytest.mark.parametrize("name", ALL)
def test_loss_and_every_gradient_match_torch(tl, name):
    cfg, rng, model = random_model(name, 10)
    params = params_of(model)
    for l, l_z in [(cfg["l_max"] - 1, 3), (cfg["l_max"], cfg["l_max"])]:
        inputs = sample_inputs(cfg, rng, l=l, l_z=l_z)
        loss, grads = model.loss_and_grad(*inputs)
        assert isinstance(loss, float)
        want_loss, want = torch_loss_and_grad(tl, cfg, params, inputs)
        assert abs(loss - want_loss) <= 1e-12 * abs(want_loss), (loss, want_loss)
        assert abs(loss - ref_loss(cfg, params, inputs)) <= 1e-12 * abs(want_loss)
        assert set(grads) == set(model.params.keys())
        for k in want:
            if is_fixed(cfg, k):
                assert not np.any(grads[k]), f"{k} is fixed, its gradient must be zero"
                continue
            assert grads[k].shape == want[k].shape, k
            err = grad_err(k, grads[k], want[k], want)
            assert err <= 1e-8, f"grad {k}: rel err {err:.3g} vs torch (ℓ={l}, ℓ_z={l_z})"
            if k.endswith(".b_k"):  # exactly 0 in exact arithmetic: only rounding noise is allowed
                assert np.max(np.abs(grads[k])) <= 1e-12 * grad_scale(want), f"{k} should be 0: {grads[k]}"
        if cfg.get("tied") and "W_u" in grads:  # a view of W_e's gradient, if listed at all
            np.testing.assert_array_equal(grads["W_u"], grads["W_e"].T)


@pytest.mark.parametrize("name", ["d_deep", "d_all_variants", "e_explicit", "ed_deep"])
def test_float32_gradients_are_close_to_float64_torch(tl, name):
    """float32 training path: gradients within 1e-4 (norm-wise, per parameter) of the float64 truth (PyTorch's
    own float32 autograd is within ~1e-6 on these models)."""
    cfg = CONFIGS[name]
    rng = np.random.default_rng(11)
    model = build(cfg, "float32")
    params = randomize(model, cfg, rng)
    inputs = sample_inputs(cfg, rng, l=cfg["l_max"] - 1)
    loss, grads = model.loss_and_grad(*inputs)
    want_loss, want = torch_loss_and_grad(tl, cfg, params, inputs)
    assert abs(loss - want_loss) <= 1e-5 * abs(want_loss)
    for k in want:
        if not is_fixed(cfg, k):
            assert grads[k].dtype == np.float32
            err = grad_err(k, grads[k], want[k], want)
            assert err <= 1e-4, f"grad {k}: rel err {err:.3g} vs float64 torch"


def grad_scale(grads) -> float:
    return max(float(np.max(np.abs(g))) for g in grads.values())


def grad_err(k, got, want, all_want) -> float:
    """rel_err(got, want), except for b_k: its exact gradient is 0 (adding b_kᵀq_t to a whole column t of S
    leaves the column softmax unchanged), so both sides are rounding noise; that noise is measured against
    the model's largest gradient entry instead."""
    if k.endswith(".b_k"):
        return float(np.max(np.abs(np.asarray(got, np.float64) - want))) / grad_scale(all_want)
    return rel_err(got, want)


def _entries(g, rng, n):
    """n random entries of g plus its largest one (the finite-difference check's denominator)."""
    idx = [np.unravel_index(int(np.argmax(np.abs(g))), g.shape)]
    for _ in range(n):
        idx.append(tuple(int(rng.integers(0, s)) for s in g.shape))
    return idx


FD_PARAMS = {
    "d_deep": ["W_e", "W_p", "W_u", "layers.0.attn.W_q", "layers.1.attn.b_v", "layers.0.gamma1", "layers.1.beta2",
               "layers.0.W_mlp1", "gamma", "beta"],
    "d_all_variants": ["W_e", "layers.0.attn.W_k", "layers.1.gamma1", "layers.0.W_mlp2", "gamma"],
    "e_explicit": ["W_e", "W_p", "W_u", "layers.2.attn.W_o", "layers.0.beta1", "W_f", "b_f", "gamma", "beta"],
    "ed_deep": ["W_e", "W_p", "W_u", "enc.0.attn.W_k", "enc.1.gamma2", "dec.0.attn.W_q", "dec.2.cross_attn.W_v",
                "dec.1.cross_attn.b_q", "dec.0.beta4", "dec.2.W_mlp3", "dec.1.gamma5"],
}


@pytest.mark.parametrize("name", list(FD_PARAMS))
def test_gradients_match_finite_differences(name):
    cfg, rng, model = random_model(name, 12)
    inputs = sample_inputs(cfg, rng, l=cfg["l_max"] - 1, l_z=4)
    _, grads = model.loss_and_grad(*inputs)
    f = lambda: model.loss_and_grad(*inputs)[0]  # noqa: E731
    for k in FD_PARAMS[name]:
        entries = _entries(grads[k], rng, 3)
        fd = numeric_grad(f, model.params[k], entries=entries)  # perturbs the zero-copy view in place
        got = np.array([grads[k][i] for i in entries])
        assert rel_err(got, fd) <= 1e-6, f"{k}: {got} vs finite differences {fd}"


def test_decoder_only_loss_is_next_token_sum():
    """Alg 13 line 5 by hand: −Σ_{t<ℓ−1} log P[x[t+1], t] with the model's own P; ℓ = 1 scores nothing."""
    cfg, rng, model = random_model("d_deep", 13)
    x = rng.integers(0, cfg["n_vocab"], 7)
    P = model(x)
    hand = -sum(math.log(P[x[t + 1], t]) for t in range(len(x) - 1))
    loss, _ = model.loss_and_grad(x)
    assert abs(loss - hand) <= 1e-12 * abs(hand)
    assert abs(model.loss(x) - hand) <= 1e-12 * abs(hand)
    assert abs(model.loss(x, reduction="mean") - hand / (len(x) - 1)) <= 1e-12 * abs(hand)
    loss1, grads1 = model.loss_and_grad(x[:1])
    assert loss1 == 0.0 and all(not np.any(g) for g in grads1.values())


def test_encoder_decoder_loss_is_next_token_sum():
    cfg, rng, model = random_model("ed_deep", 14)
    z, x = rng.integers(0, cfg["n_vocab"], 3), rng.integers(0, cfg["n_vocab"], 6)
    P = model(z, x)
    hand = -sum(math.log(P[x[t + 1], t]) for t in range(len(x) - 1))
    assert abs(model.loss_and_grad(z, x)[0] - hand) <= 1e-12 * abs(hand)
    assert abs(model.loss(z, x) - hand) <= 1e-12 * abs(hand)
    assert abs(model.loss(z, x, reduction="mean") - hand / (len(x) - 1)) <= 1e-12 * abs(hand)


def test_masked_lm_loss_counts_exactly_the_masked_positions():
    cfg, rng, model = random_model("e_deep", 15)
    V, l = cfg["n_vocab"], cfg["l_max"]
    mask = model.mask_token
    x = rng.integers(0, V - 3, l)
    x_tilde = x.copy()
    T_tilde = [1, 4, 5]
    x_tilde[T_tilde] = mask
    x_tilde[2] = (x[2] + 1) % (V - 3)  # corrupted but not masked: not scored
    x_tilde[7] = model.bos_token  # a special token that is not the mask: not scored
    P = model(x_tilde)
    hand = -sum(math.log(P[x[t], t]) for t in T_tilde)
    loss, grads = model.loss_and_grad(x_tilde, x)
    assert abs(loss - hand) <= 1e-12 * abs(hand), (loss, hand)
    assert abs(model.loss(x_tilde, x) - hand) <= 1e-12 * abs(hand)
    assert abs(model.loss(x_tilde, x, reduction="mean") - hand / len(T_tilde)) <= 1e-12 * abs(hand)
    # x matters only where x̃ is masked: changing x elsewhere changes neither loss nor gradients
    x_other = x.copy()
    for t in range(l):
        if t not in T_tilde:
            x_other[t] = (x[t] + 2) % V
    loss2, grads2 = model.loss_and_grad(x_tilde, x_other)
    assert loss2 == pytest.approx(loss, rel=1e-14)
    for k in grads:
        np.testing.assert_allclose(grads2[k], grads[k], rtol=1e-13, atol=1e-15, err_msg=k)
    # and masking one more position adds exactly its term
    x_tilde3 = x_tilde.copy()
    x_tilde3[0] = mask
    P3 = model(x_tilde3)
    hand3 = -sum(math.log(P3[x[t], t]) for t in [0] + T_tilde)
    assert abs(model.loss_and_grad(x_tilde3, x)[0] - hand3) <= 1e-12 * abs(hand3)


def test_masked_lm_without_masked_positions_is_zero_with_zero_grads():
    cfg, rng, model = random_model("e_deep", 16)
    x = rng.integers(0, cfg["n_vocab"] - 3, 6)
    x_tilde = x.copy()
    x_tilde[2] = (x[2] + 1) % (cfg["n_vocab"] - 3)
    loss, grads = model.loss_and_grad(x_tilde, x)
    assert loss == 0.0
    assert set(grads) == set(model.params.keys())
    for k, g in grads.items():
        assert not np.any(g), k
    assert model.loss(x_tilde, x) == 0.0
    # a batch where only some sequences have masks scores those
    x_t2 = x.copy()
    x_t2[3] = model.mask_token
    loss_b, _ = model.loss_and_grad([x_tilde, x_t2], [x, x])
    assert loss_b == pytest.approx(model.loss_and_grad(x_t2, x)[0], rel=1e-13)


# ---------------------------------------------------------------------------------------------------
# Batches: the sum of per-sequence losses and gradients


def _sum_of_singles(model, pairs):
    total, acc = 0.0, None
    for inputs in pairs:
        loss, grads = model.loss_and_grad(*inputs)
        total += loss
        acc = {k: v.copy() for k, v in grads.items()} if acc is None else {k: acc[k] + grads[k] for k in acc}
    return total, acc


@pytest.mark.parametrize("name", ["d_deep", "d_all_variants", "e_explicit", "e_tied_sinusoidal", "ed_deep",
                                  "ed_tied_sinusoidal"])
def test_batched_loss_and_grad_is_the_sum_over_sequences(name):
    cfg, rng, model = random_model(name, 17)
    n_inputs = 1 if cfg["kind"] == "d" else 2
    # a 2-D (N, ℓ) batch (ED: z and x each 2-D, of different lengths)
    pairs = [sample_inputs(cfg, rng, l=cfg["l_max"] - 1, l_z=3) for _ in range(3)]
    stacked = [np.stack([p[i] for p in pairs]) for i in range(n_inputs)]
    want_loss, want = _sum_of_singles(model, pairs)
    loss, grads = model.loss_and_grad(*stacked)
    assert abs(loss - want_loss) <= 1e-12 * abs(want_loss)
    for k in want:
        assert grad_err(k, grads[k], want[k], want) <= 1e-12, k
    # a ragged list of sequences of different lengths
    pairs = [sample_inputs(cfg, rng, l=l, l_z=lz) for l, lz in [(2, 5), (cfg["l_max"], 1), (4, cfg["l_max"]), (1, 2)]]
    lists = [[p[i] for p in pairs] for i in range(n_inputs)]
    want_loss, want = _sum_of_singles(model, pairs)
    loss, grads = model.loss_and_grad(*lists)
    assert abs(loss - want_loss) <= 1e-12 * abs(want_loss)
    for k in want:
        assert grad_err(k, grads[k], want[k], want) <= 1e-12, k
    # loss(...) agrees, and its mean is per scored token
    assert abs(model.loss(*lists) - want_loss) <= 1e-12 * abs(want_loss)
    if cfg["kind"] == "e":
        n_scored = sum(int(np.sum(p[0] == model.mask_token)) for p in pairs)
    else:
        n_scored = sum(len(p[-1]) - 1 for p in pairs)
    assert abs(model.loss(*lists, reduction="mean") - want_loss / n_scored) <= 1e-12 * abs(want_loss)


def test_grads_returned_are_copies_and_model_grads_hold_the_last_gradient():
    cfg, rng, model = random_model("d_deep", 18)
    x = rng.integers(0, cfg["n_vocab"], 6)
    _, g1 = model.loss_and_grad(x)
    for k in g1:
        assert not np.shares_memory(g1[k], model.params[k]) and not np.shares_memory(g1[k], model.grads[k]), k
        np.testing.assert_array_equal(model.grads[k], g1[k], err_msg=k)
    snapshot = {k: v.copy() for k, v in g1.items()}
    _, g2 = model.loss_and_grad(x)  # not accumulated across calls
    for k in g1:
        np.testing.assert_array_equal(g1[k], snapshot[k], err_msg=k)  # the first copy is untouched
        np.testing.assert_array_equal(g2[k], snapshot[k], err_msg=k)


# ---------------------------------------------------------------------------------------------------
# Zero-copy params


def test_params_are_zero_copy_views():
    cfg, rng, model = random_model("d_deep", 19)
    x = rng.integers(0, cfg["n_vocab"], 5)
    W_u = model.params["W_u"]
    assert np.shares_memory(W_u, model.params["W_u"])
    W_u[...] = 0.0  # all logits 0: P uniform
    np.testing.assert_allclose(model(x), 1.0 / cfg["n_vocab"], rtol=1e-14)
    new = rng.standard_normal(W_u.shape)
    model.params["W_u"] = new  # assignment copies into the storage
    np.testing.assert_array_equal(W_u, new)
    assert rel_err(model(x), ref_forward(cfg, params_of(model), (x,))) <= 1e-12
    model.params["layers.1.gamma2"][3] = 5.0
    assert rel_err(model(x), ref_forward(cfg, params_of(model), (x,))) <= 1e-12
    # views stay valid across many calls and trainings steps' worth of loss_and_grad
    gW_e = model.grads["W_e"]
    for _ in range(20):
        model.loss_and_grad(rng.integers(0, cfg["n_vocab"], (2, int(rng.integers(1, cfg["l_max"] + 1)))))
    np.testing.assert_array_equal(W_u, new)
    assert np.shares_memory(W_u, model.params["W_u"])
    assert np.shares_memory(gW_e, model.grads["W_e"])


def test_tied_unembedding_follows_W_e():
    cfg, rng, model = random_model("d_tied", 20)
    x = rng.integers(0, cfg["n_vocab"], 5)
    model.params["W_e"][...] = rng.standard_normal(model.params["W_e"].shape)
    p = params_of(model)
    p.pop("W_u", None)
    assert rel_err(model(x), ref_forward(cfg, p, (x,))) <= 1e-12  # W_u = W_eᵀ, the new one


# ---------------------------------------------------------------------------------------------------
# Bad input


def expect_raise(call, exc, pattern, what):
    """pytest.raises(exc, match=pattern) that says which call and input failed."""
    try:
        call()
    except exc as e:
        assert re.search(pattern, str(e)), f"{what}: {exc.__name__} message {str(e)!r} does not match {pattern!r}"
        return
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"{what}: raised {type(e).__name__}({e}) instead of {exc.__name__}")
    pytest.fail(f"{what}: did not raise {exc.__name__}")


LMAX = r"(?i)(l_max|ℓ_max|ℓmax|longer|too long|max)"
IDS = r"(?i)(token|id|vocab|range)"
EMPTY = r"(?i)empty"
INT = r"(?i)int"
MISMATCH = r"(?i)(shape|length|count|match|same|differ|number)"


@pytest.mark.parametrize("name", ["d_small", "e_small", "ed_small"])
def test_bad_sequences_raise(name):
    cfg = CONFIGS[name]
    kind = cfg["kind"]
    model = build(cfg)
    V, l_max = cfg["n_vocab"], cfg["l_max"]
    good = np.arange(3) % V
    too_long = np.arange(l_max + 1) % V

    def partner(seq):
        """A valid counterpart of the same batch form (ED pairs z with x)."""
        if isinstance(seq, np.ndarray) and seq.ndim == 2:
            return np.zeros((seq.shape[0], 3), dtype=np.int64)
        if isinstance(seq, list) and seq and np.ndim(seq[0]) == 1:
            return [good] * len(seq)
        return good

    def calls(seq):
        """Every entry point with `seq` in the place of x (and, for ED, also of z). A ragged list is a batch
        for the losses only (docs/api.md defines forward batches as 2-D arrays)."""
        ragged = isinstance(seq, list) and bool(seq) and np.ndim(seq[0]) == 1
        other = partner(seq)
        if kind == "d":
            fwd = [("model(x)", lambda: model(seq)), ("logits(x)", lambda: model.logits(seq))]
            losses = [("loss_and_grad(x)", lambda: model.loss_and_grad(seq)), ("loss(x)", lambda: model.loss(seq))]
        elif kind == "e":
            fwd = [("model(x)", lambda: model(seq)), ("logits(x)", lambda: model.logits(seq))]
            losses = [("loss_and_grad(x, x)", lambda: model.loss_and_grad(seq, seq)),
                      ("loss(x, x)", lambda: model.loss(seq, seq))]
        else:
            fwd = [("model(z, x=bad)", lambda: model(other, seq)), ("model(z=bad, x)", lambda: model(seq, other)),
                   ("logits(z=bad, x)", lambda: model.logits(seq, other))]
            losses = [("loss_and_grad(z, x=bad)", lambda: model.loss_and_grad(other, seq)),
                      ("loss_and_grad(z=bad, x)", lambda: model.loss_and_grad(seq, other)),
                      ("loss(z=bad, x)", lambda: model.loss(seq, other))]
        return losses if ragged else fwd + losses

    # parameters and gradients (of a valid call, so not all zero) before the failing calls
    if kind == "e":
        x_tilde = good.copy()
        x_tilde[1] = model.mask_token
        model.loss_and_grad(x_tilde, good)
    else:
        model.loss_and_grad(good) if kind == "d" else model.loss_and_grad(good, good)
    assert any(np.any(g != 0) for g in model.grads.values())
    before = params_of(model)
    grads_before = {k: v.copy() for k, v in model.grads.items()}
    for bad, exc, msg in [
        (too_long, ValueError, LMAX),
        (np.array([0, V]), IndexError, IDS),
        (np.array([0, -1]), IndexError, IDS),
        ([1, V + 5], IndexError, IDS),
        (np.zeros(0, dtype=np.int64), ValueError, EMPTY),
        ([], ValueError, EMPTY),
        (np.array([0.0, 1.0]), TypeError, INT),
        ([0.5, 1.0], TypeError, INT),
        ([good, too_long], ValueError, LMAX),  # one sequence of a batch too long
        ([good, np.array([0, V])], IndexError, IDS),
        ([good, np.zeros(0, dtype=np.int64)], ValueError, EMPTY),
        (np.zeros((2, l_max + 1), dtype=np.int64), ValueError, LMAX),
        (np.full((2, 3), V, dtype=np.int64), IndexError, IDS),
    ]:
        for what, call in calls(bad):
            expect_raise(call, exc, msg, f"{_CLASS[kind]}.{what} with {bad!r}")
    for k, v in before.items():  # nothing written by any failing call
        np.testing.assert_array_equal(model.params[k], v, err_msg=k)
        np.testing.assert_array_equal(model.grads[k], grads_before[k], err_msg=k)
    P = model(good) if kind != "ed" else model(good, good)  # still usable after the errors
    assert np.all(np.isfinite(P)) and np.allclose(P.sum(axis=0), 1.0)


def test_mismatched_batches_raise():
    e = build(CONFIGS["e_small"])
    x4, x5 = np.arange(4), np.arange(5)
    with pytest.raises(ValueError, match=MISMATCH):
        e.loss_and_grad(x4, x5)
    with pytest.raises(ValueError, match=MISMATCH):
        e.loss_and_grad(np.zeros((2, 4), np.int64), np.zeros((3, 4), np.int64))
    with pytest.raises(ValueError, match=MISMATCH):
        e.loss_and_grad(np.zeros((2, 4), np.int64), np.zeros((2, 5), np.int64))
    with pytest.raises(ValueError, match=MISMATCH):
        e.loss_and_grad([x4, x5], [x4])
    with pytest.raises(ValueError, match=MISMATCH):
        e.loss_and_grad([x4, x5], [x4, x4])
    with pytest.raises(ValueError, match=MISMATCH):
        e.loss(x4, x5)
    ed = build(CONFIGS["ed_small"])
    with pytest.raises(ValueError, match=MISMATCH):
        ed.loss_and_grad([x4, x5], [x4])
    with pytest.raises(ValueError, match=MISMATCH):
        ed.loss_and_grad(np.zeros((2, 4), np.int64), np.zeros((3, 4), np.int64))
    with pytest.raises(ValueError, match=MISMATCH):
        ed(np.zeros((2, 4), np.int64), np.zeros((3, 4), np.int64))
    with pytest.raises(ValueError, match=MISMATCH):
        ed.loss(x4, [x4, x5])
    # ℓ_z ≠ ℓ_x within a pair is fine (that is what seq2seq is for)
    ed.loss_and_grad([x4, x5], [x5, x4])


def test_bad_hyperparameters_raise():
    with pytest.raises(ValueError, match=r"(?i)(divisible|d_e|\bH\b)"):
        ft.DTransformer(10, 8, 1, 3, 8, 16)
    with pytest.raises(ValueError, match=r"(?i)(divisible|d_e|\bH\b)"):
        ft.ETransformer(10, 8, 1, 3, 8, 16, 8)
    with pytest.raises(ValueError, match=r"(?i)(divisible|d_e|\bH\b)"):
        ft.EDTransformer(10, 8, 1, 1, 3, 8, 16)
    # explicit d_attn, d_mid make any H fine
    assert ft.DTransformer(10, 8, 1, 3, 8, 16, d_attn=2, d_mid=5).params["layers.0.attn.W_o"].shape == (8, 15)
    for kw in ("n_vocab", "l_max", "L", "H", "d_e", "d_mlp"):
        args = dict(n_vocab=10, l_max=8, L=1, H=2, d_e=8, d_mlp=16)
        for bad in (0, -2):
            args[kw] = bad
            with pytest.raises(ValueError, match=kw):
                ft.DTransformer(*args.values())
    for kw in ("d_attn", "d_mid"):
        with pytest.raises(ValueError, match=kw):
            ft.DTransformer(10, 8, 1, 2, 8, 16, **{kw: 0})
    with pytest.raises(ValueError, match="d_f"):
        ft.ETransformer(10, 8, 1, 2, 8, 16, 0)
    for kw in ("L_enc", "L_dec"):
        args = dict(n_vocab=10, l_max=8, L_enc=1, L_dec=1, H=2, d_e=8, d_mlp=16)
        args[kw] = 0
        with pytest.raises(ValueError, match=kw):
            ft.EDTransformer(*args.values())
    with pytest.raises(ValueError, match="norm"):
        ft.DTransformer(10, 8, 1, 2, 8, 16, norm="batch")
    with pytest.raises(ValueError, match="positional"):
        ft.DTransformer(10, 8, 1, 2, 8, 16, positional="rotary")
    with pytest.raises(ValueError, match="positional"):
        ft.ETransformer(10, 8, 1, 2, 8, 16, 8, positional="rotary")
    with pytest.raises(ValueError, match="positional"):
        ft.EDTransformer(10, 8, 1, 1, 2, 8, 16, positional="rotary")
    with pytest.raises(ValueError, match="gelu"):
        ft.DTransformer(10, 8, 1, 2, 8, 16, gelu="erf")
    with pytest.raises(ValueError, match="gelu"):
        ft.ETransformer(10, 8, 1, 2, 8, 16, 8, gelu="relu")
    with pytest.raises(ValueError, match=r"(?i)(tied|d_f)"):
        ft.ETransformer(10, 8, 1, 2, 8, 16, 6, tied=True)
    ft.ETransformer(10, 8, 1, 2, 8, 16, 8, tied=True)  # d_f = d_e: allowed


@pytest.mark.parametrize("l_z,l_x", [(5, 9), (9, 5), (6, 6)])
def test_ed_attention_weights_are_algorithm_4_of_each_layer(l_z, l_x):
    """EDTransformer.attention_weights('enc' | 'dec' | 'cross', l): softmax(S/√d_attn) of Algorithm 4 inside
    Algorithm 8, recomputed from the listing's own layer inputs (lines 5, 14 and 16), for ℓ_z < ℓ_x, ℓ_z > ℓ_x
    and equal lengths; the encoder's matrices are (H, ℓ_z, ℓ_z), never shaped by ℓ_x."""
    H, L_enc, L_dec = 2, 2, 2
    rng = np.random.default_rng(l_z * 10 + l_x)
    m = ft.EDTransformer(23, 12, L_enc, L_dec, H, 8, 16, dtype="float64", seed=3)
    for v in m.params.values():
        v[...] = v + 0.3 * rng.standard_normal(v.shape)  # away from the initial biases 0, γ 1
    p = dict(m.params)
    z, x = rng.integers(0, 20, size=l_z), rng.integers(0, 20, size=l_x)
    m(z, x)

    def weights(prefix, Xq, Zc, mask):
        return np.stack([ref.attention_weights(Xq, Zc, p[prefix + "W_q"][h], p[prefix + "b_q"][h], p[prefix + "W_k"][h],
                                               p[prefix + "b_k"][h], mask) for h in range(H)])

    def relu_mlp(X, i, a, b):
        return p[i + f"W_mlp{b}"] @ ref.relu(p[i + f"W_mlp{a}"] @ X + p[i + f"b_mlp{a}"][:, None]) + p[i + f"b_mlp{b}"][:, None]

    Z = p["W_e"][:, z] + p["W_p"][:, :l_z]  # lines 1–3
    for l in range(L_enc):
        i = f"enc.{l}."
        want = weights(i + "attn.", Z, Z, ref.bidirectional_mask(l_z, l_z))
        got = m.attention_weights("enc", l)
        assert got.shape == (H, l_z, l_z)
        assert rel_err(got, want) <= 1e-12
        Z = ref.layer_norm_columns(Z + ref.mh_attention(Z, Z, *ref._W(p, i + "attn."), ref.bidirectional_mask(l_z, l_z)),
                                   p[i + "gamma1"], p[i + "beta1"], 1e-5)
        Z = ref.layer_norm_columns(Z + relu_mlp(Z, i, 1, 2), p[i + "gamma2"], p[i + "beta2"], 1e-5)
    X = p["W_e"][:, x] + p["W_p"][:, :l_x]  # lines 10–12
    for l in range(L_dec):
        i = f"dec.{l}."
        causal, full = ref.unidirectional_mask(l_x, l_x), ref.bidirectional_mask(l_z, l_x)
        got = m.attention_weights("dec", l)
        assert got.shape == (H, l_x, l_x)
        assert rel_err(got, weights(i + "attn.", X, X, causal)) <= 1e-12
        X = ref.layer_norm_columns(X + ref.mh_attention(X, X, *ref._W(p, i + "attn."), causal), p[i + "gamma3"], p[i + "beta3"], 1e-5)
        got = m.attention_weights("cross", l)
        assert got.shape == (H, l_z, l_x)
        assert rel_err(got, weights(i + "cross_attn.", X, Z, full)) <= 1e-12
        X = ref.layer_norm_columns(X + ref.mh_attention(X, Z, *ref._W(p, i + "cross_attn."), full), p[i + "gamma4"], p[i + "beta4"], 1e-5)
        X = ref.layer_norm_columns(X + relu_mlp(X, i, 3, 4), p[i + "gamma5"], p[i + "beta5"], 1e-5)
    # X is now the decoder's output: the recomputation followed the model all the way
    assert rel_err(ref.softmax(p["W_u"] @ X), m(z, x)) <= 1e-12


@pytest.mark.parametrize("kind", ["d", "e", "ed"])
def test_initialisation_is_gpt2s_scheme(kind):
    """README "Initialisation": weights N(0, init_std²); residual projections (W_o, W_mlp2, W_mlp4)
    N(0, (init_std/√(2·layers))²) with layers = L (ED: L_enc + L_dec); biases 0; γ 1; β 0. Checked by the
    sample statistics of each matrix (tens of thousands of draws: 5% on the standard deviation)."""
    init_std = 0.05
    if kind == "d":
        m, layers = ft.DTransformer(64, 32, 3, 4, 64, 256, dtype="float64", init_std=init_std, seed=5), 3
    elif kind == "e":
        m, layers = ft.ETransformer(64, 32, 3, 4, 64, 256, 64, dtype="float64", init_std=init_std, seed=5), 3
    else:
        m, layers = ft.EDTransformer(64, 32, 2, 3, 4, 64, 256, dtype="float64", init_std=init_std, seed=5), 5
    residual = re.compile(r"(attn\.W_o|W_mlp2|W_mlp4)$")
    for k, v in m.params.items():
        leaf = k.split(".")[-1]
        if leaf.startswith("gamma"):
            assert np.all(v == 1.0), k
        elif leaf.startswith(("beta", "b_")):
            assert np.all(v == 0.0), k
        else:
            want = init_std / math.sqrt(2 * layers) if residual.search(k) else init_std
            assert abs(float(np.mean(v))) < 4 * want / math.sqrt(v.size), k
            assert float(np.std(v)) == pytest.approx(want, rel=0.05), k
