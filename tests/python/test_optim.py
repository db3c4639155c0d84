"""Optimizers: ft.Adam (Kingma & Ba with bias correction; AdamW's decoupled weight decay or torch.optim.Adam's
L2) and ft.SGD (the listings' θ ← θ − η∇loss), against torch.optim over 10 steps on the same random, fixed
gradients (float64 ≤1e-10 relative after every step), fixed parameters, per-model state and bad input.
"""
from __future__ import annotations

import numpy as np
import pytest

import formal_transformers as ft

from conftest import rel_err, torch_or_skip

N_STEPS = 10
TOL64 = 1e-10

MODELS = {
    "d": lambda **kw: ft.DTransformer(11, 6, 2, 2, 8, 12, **kw),
    "e": lambda **kw: ft.ETransformer(11, 6, 1, 2, 8, 12, 6, **kw),
    "ed": lambda **kw: ft.EDTransformer(11, 6, 1, 2, 2, 8, 12, **kw),
}


@pytest.fixture(scope="module")
def torch():
    t = torch_or_skip()
    t.set_num_threads(1)
    return t


def make(kind="d", dtype="float64", seed=0, **kw):
    model = MODELS[kind](dtype=dtype, seed=seed, **kw)
    rng = np.random.default_rng(seed + 100)
    for k in model.params.keys():  # non-trivial values everywhere (biases and β are often initialised to 0)
        if is_fixed(model, kw, k) or (kw.get("tied") and k == "W_u"):
            continue
        model.params[k][...] = 0.5 * rng.standard_normal(model.params[k].shape)
    return model


def is_fixed(model, kw, k):
    return k == "W_p" and kw.get("positional") == "sinusoidal"


def snapshot(model):
    return {k: np.array(v, dtype=np.float64) for k, v in model.params.items()}


def random_grads(model, rng, n=N_STEPS, scale=1.0):
    """n gradient dicts (name → array of the parameter's shape and dtype), entries of mixed magnitudes so
    that Adam's m and v differ per entry; a few exact zeros."""
    out = []
    for _ in range(n):
        G = {}
        for k, v in model.params.items():
            g = scale * rng.standard_normal(v.shape) * np.exp(rng.uniform(-3, 1, v.shape))
            g[rng.random(v.shape) < 0.05] = 0.0
            G[k] = g.astype(v.dtype)
        out.append(G)
    return out


def torch_run(torch, make_opt, theta0, grads_seq, skip=()):
    """The same updates with torch.optim: yields the parameters (numpy) after every step."""
    ps = {k: torch.tensor(v.copy(), requires_grad=True) for k, v in theta0.items() if k not in skip}
    opt = make_opt(list(ps.values()))
    for G in grads_seq:
        for k, p in ps.items():
            p.grad = torch.from_numpy(np.array(G[k], dtype=theta0[k].dtype))
        opt.step()
        yield {k: p.detach().numpy().copy() for k, p in ps.items()}


def assert_follows_torch(model, opt, torch_opt, grads_seq, torch, skip=(), tol=TOL64, dtype=np.float64):
    theta0 = {k: v.astype(dtype) for k, v in snapshot(model).items()}
    for step, (G, want) in enumerate(zip(grads_seq, torch_run(torch, torch_opt, theta0, grads_seq, skip)), 1):
        opt.step(model, G)
        for k, w in want.items():
            err = rel_err(model.params[k], w)
            assert err <= tol, f"step {step}, {k}: rel err {err:.3g} vs torch"


# ---------------------------------------------------------------------------------------------------
# Adam vs torch.optim


ADAM_VS_TORCH = {  # case: (model kind, gradients' seed, our optimizer, torch's on the parameters ps)
    **{f"adamw_decoupled_weight_decay_{kind}": (
        kind, 1, lambda: ft.Adam(1e-2, beta1=0.8, beta2=0.99, eps=1e-8, weight_decay=0.1, decoupled=True),
        lambda torch, ps: torch.optim.AdamW(ps, lr=1e-2, betas=(0.8, 0.99), eps=1e-8, weight_decay=0.1))
       for kind in ("d", "e", "ed")},
    "adam_l2_weight_decay": (
        "d", 2, lambda: ft.Adam(3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.05, decoupled=False),
        lambda torch, ps: torch.optim.Adam(ps, lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.05)),
    "adam_defaults_without_weight_decay": (  # beta1 0.9, beta2 0.999, eps 1e-8, no weight decay
        "d", 3, lambda: ft.Adam(1e-3), lambda torch, ps: torch.optim.Adam(ps, lr=1e-3)),
}


@pytest.mark.parametrize("case", list(ADAM_VS_TORCH))
def test_adam_matches_torch(torch, case):
    """Adam (decoupled weight decay: torch's AdamW; L2 weight decay or none: torch's Adam) step by step."""
    kind, seed, ours, theirs = ADAM_VS_TORCH[case]
    model = make(kind)
    grads = random_grads(model, np.random.default_rng(seed))
    assert_follows_torch(model, ours(), lambda ps: theirs(torch, ps), grads, torch)


def test_adam_eps_is_added_to_the_root_of_v_hat(torch):
    """θ ← θ − lr·m̂/(√v̂ + eps): with small gradients and a large eps, √(v̂ + eps) or an uncorrected v differ."""
    model = make("d")
    grads = random_grads(model, np.random.default_rng(4), scale=1e-3)
    opt = ft.Adam(1e-2, eps=1e-3, weight_decay=0.0)
    assert_follows_torch(model, opt, lambda ps: torch.optim.Adam(ps, lr=1e-2, eps=1e-3), grads, torch)


def test_adam_float32_model_follows_torch_float32(torch):
    model = make("d", dtype="float32")
    grads = random_grads(model, np.random.default_rng(5))
    opt = ft.Adam(1e-2, weight_decay=0.01)
    assert model.params["W_e"].dtype == np.float32
    assert_follows_torch(model, opt, lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.01), grads, torch,
                         tol=1e-5, dtype=np.float32)


def test_adam_first_step_by_hand():
    """One step by the formulas: t = 1, m̂ = g, v̂ = g², θ ← θ(1 − lr·wd) − lr·g/(|g| + eps)."""
    model = make("d")
    theta = snapshot(model)
    G = random_grads(model, np.random.default_rng(6), n=1)[0]
    lr, wd, eps = 1e-2, 0.1, 1e-8
    ft.Adam(lr, eps=eps, weight_decay=wd).step(model, G)
    for k in theta:
        want = theta[k] - lr * wd * theta[k] - lr * G[k] / (np.abs(G[k]) + eps)
        assert rel_err(model.params[k], want) <= 1e-12, k


# ---------------------------------------------------------------------------------------------------
# SGD


@pytest.mark.parametrize("kind", ["d", "ed"])
def test_sgd_matches_torch_sgd_and_the_listing(torch, kind):
    model = make(kind)
    grads = random_grads(model, np.random.default_rng(7))
    theta = snapshot(model)
    lr = 0.05
    opt = ft.SGD(lr)
    assert_follows_torch(model, opt, lambda ps: torch.optim.SGD(ps, lr=lr), grads, torch)
    for G in grads:  # θ ← θ − η·∇loss, by hand
        theta = {k: theta[k] - lr * G[k] for k in theta}
    for k in theta:
        assert rel_err(model.params[k], theta[k]) <= 1e-12, k


# ---------------------------------------------------------------------------------------------------
# Fixed and tied parameters, gradients straight from the model


@pytest.mark.parametrize("kind", ["d", "e", "ed"])
@pytest.mark.parametrize("which", ["adam", "adam_l2", "sgd"])
def test_sinusoidal_W_p_is_never_changed(torch, kind, which):
    model = make(kind, positional="sinusoidal")
    W_p = model.params["W_p"].copy()
    grads = random_grads(model, np.random.default_rng(8))  # includes a non-zero "gradient" for W_p
    opt, topt = {
        "adam": (ft.Adam(1e-2, weight_decay=0.1), lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1)),
        "adam_l2": (ft.Adam(1e-2, weight_decay=0.1, decoupled=False),
                    lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.1)),
        "sgd": (ft.SGD(0.1), lambda ps: torch.optim.SGD(ps, lr=0.1)),
    }[which]
    assert_follows_torch(model, opt, topt, grads, torch, skip=("W_p",))  # the others move as usual
    np.testing.assert_array_equal(model.params["W_p"], W_p)


def test_tied_model_updates_W_e_once_per_step(torch):
    """With W_u = W_eᵀ the model's gradient for W_e already holds both uses; W_e gets one Adam update."""
    model = make("d", tied=True)
    rng = np.random.default_rng(9)
    x = rng.integers(0, 11, (3, 6))
    opt = ft.Adam(1e-2, weight_decay=0.1)
    theta0 = {k: v for k, v in snapshot(model).items() if k != "W_u"}
    recorded = []
    for _ in range(N_STEPS):
        _, G = model.loss_and_grad(x)
        recorded.append({k: v.copy() for k, v in G.items()})
        opt.step(model, G)
    want = list(torch_run(torch, lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1), theta0, recorded))[-1]
    for k, w in want.items():
        assert rel_err(model.params[k], w) <= TOL64, k
    if "W_u" in model.params:
        np.testing.assert_array_equal(model.params["W_u"], model.params["W_e"].T)


def test_step_with_model_grads_equals_step_with_returned_grads():
    a, b = make("d", seed=3), make("d", seed=3)
    x = np.random.default_rng(10).integers(0, 11, (2, 5))
    oa, ob = ft.Adam(1e-2, weight_decay=0.01), ft.Adam(1e-2, weight_decay=0.01)
    for _ in range(3):
        _, Ga = a.loss_and_grad(x)
        oa.step(a, a.grads)  # the zero-copy gradient views (as in a training loop)
        _, Gb = b.loss_and_grad(x)
        ob.step(b, Gb)  # the returned copies
    for k in a.params.keys():
        np.testing.assert_array_equal(a.params[k], b.params[k], err_msg=k)
    sa, sb = make("d", seed=4), make("d", seed=4)
    _, G = sa.loss_and_grad(x)
    ft.SGD(0.1).step(sa, sa.grads)
    ft.SGD(0.1).step(sb, G)
    for k in sa.params.keys():
        np.testing.assert_array_equal(sa.params[k], sb.params[k], err_msg=k)


# ---------------------------------------------------------------------------------------------------
# State belongs to one model; bad input leaves everything unchanged


def test_adam_refuses_a_second_differently_shaped_model():
    m1 = make("d")
    m2 = ft.DTransformer(11, 6, 1, 2, 8, 12, dtype="float64")  # one layer fewer
    opt = ft.Adam(1e-3)
    opt.step(m1, random_grads(m1, np.random.default_rng(11), n=1)[0])
    before = snapshot(m2)
    with pytest.raises(ValueError):
        opt.step(m2, random_grads(m2, np.random.default_rng(12), n=1)[0])
    for k, v in before.items():
        np.testing.assert_array_equal(m2.params[k], v, err_msg=k)
    m3 = make("e")  # another architecture altogether
    with pytest.raises(ValueError):
        opt.step(m3, random_grads(m3, np.random.default_rng(13), n=1)[0])


def test_bad_gradient_shape_raises_and_changes_nothing(torch):
    """A step with one wrong-shaped gradient raises ValueError before touching parameters or moments: the
    run then continues exactly as if that step had never been attempted."""
    model = make("d")
    grads = random_grads(model, np.random.default_rng(14), n=4)
    opt = ft.Adam(1e-2, weight_decay=0.1)
    theta0 = snapshot(model)
    for G in grads[:2]:
        opt.step(model, G)
    before = snapshot(model)
    bad = dict(grads[2])
    last = list(model.params.keys())[-1]
    bad[last] = np.zeros(bad[last].shape[:-1] + (bad[last].shape[-1] + 1,))
    with pytest.raises(ValueError, match=r"(?i)shape"):
        opt.step(model, bad)
    for k, v in before.items():
        np.testing.assert_array_equal(model.params[k], v, err_msg=k)
    sgd_model = make("d")
    sgd_before = snapshot(sgd_model)
    with pytest.raises(ValueError, match=r"(?i)shape"):
        ft.SGD(0.1).step(sgd_model, bad)
    for k, v in sgd_before.items():
        np.testing.assert_array_equal(sgd_model.params[k], v, err_msg=k)
    for G in grads[2:]:
        opt.step(model, G)
    want = list(torch_run(torch, lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1), theta0, grads))[-1]
    for k, w in want.items():
        assert rel_err(model.params[k], w) <= TOL64, k


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: ft.Adam(-1e-3), "learning rate"),
        (lambda: ft.Adam(float("nan")), "learning rate"),
        (lambda: ft.Adam(1e-3, beta1=1.0), "beta1"),
        (lambda: ft.Adam(1e-3, beta1=-0.1), "beta1"),
        (lambda: ft.Adam(1e-3, beta2=1.0), "beta2"),
        (lambda: ft.Adam(1e-3, eps=-1e-8), "eps"),
        (lambda: ft.Adam(1e-3, weight_decay=-0.1), "weight_decay"),
        (lambda: ft.SGD(-0.1), "learning rate"),
        (lambda: ft.SGD(float("inf")), "learning rate"),
    ],
)
def test_bad_optimizer_hyperparameters_are_value_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# ---------------------------------------------------------------------------------------------------
# The all-or-nothing check reads θ and g against bounds on m and v from Adam's own last step; moments it did
# not write itself are checked in full


def _state(model, opt):
    sd = opt.state_dict()
    return {k: np.array(v, copy=True) for k, v in model.params.items()}, sd["t"], sd["m"], sd["v"]


def _assert_same(a, b):
    pa, ta, ma, va = a
    pb, tb, mb, vb = b
    assert ta == tb
    np.testing.assert_array_equal(ma, mb)
    np.testing.assert_array_equal(va, vb)
    for k in pa:
        np.testing.assert_array_equal(pa[k], pb[k], err_msg=k)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_adam_checks_loaded_moments_in_full(dtype):
    """A state whose m would overflow the next update (m_k = max/10 with v_k = 0 and g = 0: η̂ m/ε = inf) is
    refused after load_state_dict, although θ, g and the moments of the optimizer's own last step are small."""
    model = make("d", dtype)
    opt = ft.Adam(1e-2)
    for G in random_grads(model, np.random.default_rng(20), n=2):
        opt.step(model, G)
    sd = opt.state_dict()
    k = sd["m"].size // 2
    sd["m"][k] = np.finfo(dtype).max / 10
    sd["v"][k] = 0.0
    loaded = ft.Adam(1e-2)
    loaded.load_state_dict(model, sd)
    zeros = {name: np.zeros_like(v) for name, v in model.params.items()}
    before = _state(model, loaded)
    with pytest.raises(FloatingPointError, match="nothing was changed"):
        loaded.step(model, zeros)
    _assert_same(_state(model, loaded), before)
    # a copy of the model with the optimizer's own moments steps as the original does
    other = make("d", dtype)
    for name in model.params.keys():
        other.params[name][...] = model.params[name]
    again = ft.Adam(1e-2)
    again.load_state_dict(other, opt.state_dict())
    again.step(other, zeros)
    opt.step(model, zeros)
    _assert_same(_state(other, again), _state(model, opt))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_adam_refuses_a_non_finite_last_gradient_entry(dtype, bad):
    model = make("d", dtype)
    opt = ft.Adam(1e-2, weight_decay=0.1)
    opt.step(model, random_grads(model, np.random.default_rng(21), n=1)[0])
    G = random_grads(model, np.random.default_rng(22), n=1)[0]
    last = list(model.params.keys())[-1]
    G[last][(-1,) * G[last].ndim] = bad
    before = _state(model, opt)
    with pytest.raises(FloatingPointError, match="nothing was changed"):
        opt.step(model, G)
    _assert_same(_state(model, opt), before)


def test_adam_state_dict_arrays_are_copies():
    """Python cannot write Adam's moments in place: state_dict gives copies (only load_state_dict sets them)."""
    a, b = make("d"), make("d")
    oa, ob = ft.Adam(1e-2), ft.Adam(1e-2)
    G = random_grads(a, np.random.default_rng(23), n=2)
    oa.step(a, G[0])
    ob.step(b, G[0])
    sd = oa.state_dict()
    sd["m"][:] = 1e300
    sd["v"][:] = -1.0
    oa.step(a, G[1])
    ob.step(b, G[1])
    _assert_same(_state(a, oa), _state(b, ob))
