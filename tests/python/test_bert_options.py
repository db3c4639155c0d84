"""ETransformer's BERT options, beyond Algorithm 9: segment (token-type) embeddings W_s with a segment-id
input, a layer_norm(· | γ_e, β_e) after line 3, a bias b_u on the unembedding, and model.hidden(x) (X after
line 9). Forward vs the numpy reference, backward vs finite differences and vs PyTorch autograd; the
defaults keep the listing bit for bit; bad input raises."""
import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as R

from conftest import TOL, numeric_grad, rel_err

N_V, L_MAX, L, H, D_E, D_MLP = 13, 9, 2, 2, 8, 12
OPTS = dict(n_segments=3, embed_norm=True, unembed_bias=True)


def _model(dtype="float64", tied=False, **opts):
    m = ft.ETransformer(N_V, L_MAX, L, H, D_E, D_MLP, D_E, dtype=dtype, tied=tied, seed=3, init_std=0.3, **opts)
    rng = np.random.default_rng(7)
    for name, p in m.params.items():  # every parameter random (γ, β and the biases too)
        p[...] = rng.normal(0, 0.3, p.shape) + (1.0 if name.split(".")[-1].startswith("gamma") else 0.0)
    return m


def _params(m):
    return {k: np.array(v, dtype=np.float64) for k, v in m.params.items()}


def _batch(rng):
    x = [rng.integers(0, N_V - 3, 6), rng.integers(0, N_V - 3, 4)]
    seg = [rng.integers(0, 3, 6), rng.integers(0, 3, 4)]
    return x, seg


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("tied", [False, True])
def test_forward_hidden_logits_match_reference(dtype, tied):
    m = _model(dtype, tied, **OPTS)
    rng = np.random.default_rng(1)
    x, seg = _batch(rng)
    P = m(x, segments=seg)
    Z = m.logits(x, segments=seg)
    Hd = m.hidden(x, segments=seg)
    hp = dict(L=L, H=H, eps=1e-5)
    for b in range(2):
        assert P[b].dtype == np.dtype(dtype)
        assert rel_err(P[b], R.e_transformer(x[b], _params(m), segments=seg[b], **hp)) <= TOL[dtype]
        assert rel_err(Z[b], R.e_transformer(x[b], _params(m), segments=seg[b], logits=True, **hp)) <= TOL[dtype]
        assert Hd[b].shape == (D_E, len(x[b]))
        assert rel_err(Hd[b], R.e_transformer(x[b], _params(m), segments=seg[b], hidden=True, **hp)) <= TOL[dtype]
    # segments=None is segment 0 everywhere (HF's token_type_ids default)
    zeros = [np.zeros_like(s) for s in seg]
    np.testing.assert_array_equal(np.concatenate(m.hidden(x), 1), np.concatenate(m.hidden(x, segments=zeros), 1))
    # the segment ids matter (so a test that ignored them would fail)
    assert rel_err(m.hidden(x[0], segments=seg[0]), m.hidden(x[0])) > 1e-3


@pytest.mark.parametrize("opt", ["n_segments", "embed_norm", "unembed_bias"])
def test_each_option_alone_matches_reference(opt):
    m = _model(**{opt: OPTS[opt]})
    x = np.array([1, 4, 2, 9, 0])
    seg = np.array([0, 1, 2, 2, 1]) if opt == "n_segments" else None
    ref = R.e_transformer(x, _params(m), L=L, H=H, eps=1e-5, segments=seg)
    assert rel_err(m(x, segments=seg), ref) <= 1e-12


def test_defaults_keep_the_listing_bit_for_bit():
    plain = ft.ETransformer(N_V, L_MAX, L, H, D_E, D_MLP, D_E, dtype="float64", seed=11)
    same = ft.ETransformer(N_V, L_MAX, L, H, D_E, D_MLP, D_E, dtype="float64", seed=11, n_segments=0,
                           embed_norm=False, unembed_bias=False)
    assert list(plain.params) == list(same.params)
    assert not {"W_s", "gamma_e", "beta_e", "b_u"} & set(plain.params)
    for k in plain.params:
        np.testing.assert_array_equal(plain.params[k], same.params[k])
    # the options add parameters without changing the initialisation of the listing's own
    bert = ft.ETransformer(N_V, L_MAX, L, H, D_E, D_MLP, D_E, dtype="float64", seed=11, embed_norm=True, unembed_bias=True)
    for k in plain.params:
        np.testing.assert_array_equal(plain.params[k], bert.params[k])
    np.testing.assert_array_equal(bert.params["b_u"], 0)
    x = np.array([3, 1, 4, 1, 5])
    np.testing.assert_array_equal(plain(x), same(x))
    assert rel_err(plain.hidden(x), R.e_transformer(x, _params(plain), L=L, H=H, eps=1e-5, hidden=True)) <= 1e-12


@pytest.mark.parametrize("tied", [False, True])
def test_backward_matches_finite_differences(tied):
    m = _model("float64", tied, **OPTS)
    x = [np.array([1, 2, 10, 4, 10]), np.array([10, 7, 3])]  # 10 = mask_token (N_V − 3)
    x_orig = [np.array([1, 2, 5, 4, 6]), np.array([8, 7, 3])]
    seg = [np.array([0, 0, 1, 1, 2]), np.array([2, 1, 0])]
    loss, grads = m.loss_and_grad(x, x_orig, segments=seg)
    p = _params(m)
    ref_loss = R.e_loss(x, x_orig, p, m.mask_token, segments=seg, L=L, H=H, eps=1e-5)
    assert abs(loss - ref_loss) <= 1e-12 * abs(ref_loss)
    def f():
        return R.e_loss(x, x_orig, p, m.mask_token, segments=seg, L=L, H=H, eps=1e-5)

    for name in ["W_s", "gamma_e", "beta_e", "b_u", "W_e", "W_p", "layers.0.attn.W_q", "W_f"]:
        g = numeric_grad(f, p[name])  # p[name] is changed in place and restored
        assert rel_err(grads[name], g) <= 1e-6, name
    assert np.abs(grads["W_s"]).max() > 0 and np.abs(grads["b_u"]).max() > 0


def test_backward_matches_torch_autograd():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    m = _model("float64", True, **OPTS)
    x = [np.array([1, 2, 10, 4, 10, 0]), np.array([10, 7, 3])]
    x_orig = [np.array([1, 2, 5, 4, 6, 0]), np.array([8, 7, 3])]
    seg = [np.array([0, 0, 1, 1, 2, 2]), np.array([2, 1, 0])]
    loss, grads = m.loss_and_grad(x, x_orig, segments=seg)
    P = {k: torch.tensor(np.ascontiguousarray(v), requires_grad=True) for k, v in _params(m).items()}

    def ln(X, g, b):  # X: (d, ℓ), columns normalised
        return F.layer_norm(X.T, (D_E,), g, b, 1e-5).T

    total = 0
    for xt, xo, s in zip(x, x_orig, seg):
        l = len(xt)
        X = P["W_e"][:, xt] + P["W_p"][:, :l] + P["W_s"][:, s]
        X = ln(X, P["gamma_e"], P["beta_e"])
        for i in range(L):
            q = f"layers.{i}."
            a = q + "attn."
            Y = []
            for h in range(H):
                Q = P[a + "W_q"][h] @ X + P[a + "b_q"][h][:, None]
                K = P[a + "W_k"][h] @ X + P[a + "b_k"][h][:, None]
                V = P[a + "W_v"][h] @ X + P[a + "b_v"][h][:, None]
                Y.append(V @ torch.softmax(K.T @ Q / np.sqrt(Q.shape[0]), dim=0))
            X = ln(X + P[a + "W_o"] @ torch.cat(Y) + P[a + "b_o"][:, None], P[q + "gamma1"], P[q + "beta1"])
            Hm = F.gelu(P[q + "W_mlp1"] @ X + P[q + "b_mlp1"][:, None])
            X = ln(X + P[q + "W_mlp2"] @ Hm + P[q + "b_mlp2"][:, None], P[q + "gamma2"], P[q + "beta2"])
        X = ln(F.gelu(P["W_f"] @ X + P["b_f"][:, None]), P["gamma"], P["beta"])
        Z = P["W_e"].T @ X + P["b_u"][:, None]
        logp = torch.log_softmax(Z, dim=0)
        for t in range(l):
            if xt[t] == m.mask_token:
                total = total - logp[xo[t], t]
    total.backward()
    assert abs(total.item() - loss) <= 1e-12 * abs(loss)
    for k, v in P.items():
        if k.endswith("b_k"):  # softmax is invariant to b_k: both gradients are rounding noise around 0
            assert np.abs(grads[k]).max() < 1e-12 and np.abs(v.grad.numpy()).max() < 1e-12
        else:
            assert rel_err(grads[k], v.grad.numpy()) <= 1e-8, k


def test_bad_input():
    m = _model(**OPTS)
    x = np.array([1, 2, 3])
    with pytest.raises(IndexError, match="segment"):
        m(x, segments=[0, 3, 1])
    with pytest.raises(IndexError, match="segment"):
        m.hidden(x, segments=[0, -1, 1])
    with pytest.raises(ValueError, match="shape of x"):
        m(x, segments=[0, 1])
    with pytest.raises(ValueError, match="shape of x"):
        m.loss_and_grad(x, x, segments=[[0, 1, 1], [0]])
    plain = _model()
    with pytest.raises(ValueError, match="n_segments = 0"):
        plain(x, segments=[0, 0, 0])
    with pytest.raises(ValueError, match="n_segments must be >= 0"):
        ft.ETransformer(N_V, L_MAX, L, H, D_E, D_MLP, D_E, n_segments=-1)
    with pytest.raises(TypeError):
        m(x, segments=[0.5, 1, 1])
    # the failed calls left no half-finished forward behind: a good call still matches the reference
    assert rel_err(m(x, segments=[0, 1, 2]), R.e_transformer(x, _params(m), segments=[0, 1, 2], L=L, H=H, eps=1e-5)) <= 1e-12


def test_save_load_keeps_the_options(tmp_path):
    m = _model(**OPTS)
    ft.save(m, tmp_path / "m.safetensors")
    back = ft.load(tmp_path / "m.safetensors")
    assert back.config == m.config
    x, seg = np.array([1, 2, 3]), np.array([2, 0, 1])
    np.testing.assert_array_equal(back(x, segments=seg), m(x, segments=seg))
