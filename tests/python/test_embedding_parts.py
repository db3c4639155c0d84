"""A stack's embedding as a part (stack_embedding.hpp): the listing's Algorithms 1 + 2 composed with the steps a
config chooses — V13's fixnorm, the embedding scale (Gemma's embed_scale, BART's scale_embedding), BART's separate
positions, BERT's segment embeddings, the embedding layer_norm (BERT, BART). Each step and their combinations
through the models: the core against reference.stack_embedding inside the listings' references (float64 ≤ 1e-12,
float32 ≤ 1e-5), every gradient against central differences and against PyTorch autograd (torch_listings._embed),
refusals naming the option, and the config text of before (each option where it stood)."""
import math

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as R

from conftest import TOL, assert_grads_match_fd, randomize_theta, rel_err, torch_or_skip

N_V, L_MAX, H, D_E, D_MLP = 13, 9, 2, 6, 8
X = np.array([3, 7, 3, 0, 9, 2])
Z = np.array([4, 1, 8, 8, 5])
SEG = np.array([0, 2, 1, 1, 0, 2])
XT = np.where(np.arange(len(X)) % 2 == 0, N_V - 3, X)  # x̃: every other token masked

# name -> (architecture, options)
CASES = {
    "d_fixnorm": ("d", dict(fixnorm=True)),
    "d_embed_scale": ("d", dict(embed_scale=math.sqrt(D_E))),
    "e_segments": ("e", dict(n_segments=3)),
    "e_embed_norm": ("e", dict(embed_norm=True)),
    "e_all": ("e", dict(n_segments=3, embed_norm=True, fixnorm=True)),
    "ed_bart": ("ed", dict(scale_embedding=True, embed_norm=True, separate_positions=True)),
    "ed_fixnorm_scale": ("ed", dict(fixnorm=True, scale_embedding=True)),
}


def _model(kind, opts, dtype="float64"):
    if kind == "d":
        m = ft.DTransformer(N_V, L_MAX, 1, H, D_E, D_MLP, dtype=dtype, seed=2, **opts)
    elif kind == "e":
        m = ft.ETransformer(N_V, L_MAX, 1, H, D_E, D_MLP, D_E, dtype=dtype, seed=2, **opts)
    else:
        m = ft.EDTransformer(N_V, L_MAX, 1, 1, H, D_E, D_MLP, dtype=dtype, seed=2, **opts)
    randomize_theta(m, np.random.default_rng(11))
    return m


def _segments(kind, opts):
    return dict(segments=SEG) if opts.get("n_segments") else {}


def _reference(kind, opts, theta):
    if kind == "d":
        return R.d_transformer_variant(X, theta, L=1, H=H, fixnorm=opts.get("fixnorm", False),
                                       embed_scale=opts.get("embed_scale"))
    if kind == "e":
        return R.e_transformer(XT, theta, L=1, H=H, fixnorm=opts.get("fixnorm", False),
                               segments=SEG if opts.get("n_segments") else None)
    return R.ed_transformer(Z, X, theta, L_enc=1, L_dec=1, H=H, fixnorm=opts.get("fixnorm", False),
                            scale_embedding=opts.get("scale_embedding", False))


def _call(m, kind, opts):
    if kind == "d":
        return m(X)
    if kind == "e":
        return m(XT, **_segments(kind, opts))
    return m(Z, X)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_step_matches_the_reference(case, dtype):
    kind, opts = CASES[case]
    m = _model(kind, opts, dtype)
    theta = {k: np.array(v, dtype=np.float64) for k, v in m.params.items()}
    assert rel_err(_call(m, kind, opts), _reference(kind, opts, theta)) <= TOL[dtype]


def test_with_no_step_the_embedding_is_algorithms_1_and_2():
    theta = {"W_e": np.random.default_rng(1).standard_normal((D_E, N_V)),
             "W_p": np.random.default_rng(2).standard_normal((D_E, L_MAX))}
    want = np.stack([R.token_embedding(v, theta["W_e"]) + R.positional_embedding(t, theta["W_p"]) for t, v in enumerate(X)], 1)
    np.testing.assert_array_equal(R.stack_embedding(X, theta["W_e"], theta["W_p"]), want)
    for kind in ("d", "e", "ed"):  # no step: θ holds W_e, W_p and the layers' parameters only
        names = list(_model(kind, {}).params)
        assert not any(n.endswith(("W_s", "gamma_e", "beta_e")) or n == "dec.W_p" for n in names), kind


def _loss_and_grad(m, kind, opts):
    if kind == "d":
        return m.loss_and_grad(X), (lambda: m.loss(X))
    if kind == "e":
        seg = _segments(kind, opts)
        return m.loss_and_grad(XT, X, **seg), (lambda: m.loss(XT, X, **seg))
    return m.loss_and_grad(Z, X), (lambda: m.loss(Z, X))


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_gradient_matches_finite_differences(case):
    kind, opts = CASES[case]
    m = _model(kind, opts)
    (_, grads), loss = _loss_and_grad(m, kind, opts)
    assert_grads_match_fd(m, grads, loss, label=case)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_gradient_matches_torch_autograd(case):
    torch_or_skip()
    import torch_listings as TL
    kind, opts = CASES[case]
    m = _model(kind, opts)
    (loss, grads), _ = _loss_and_grad(m, kind, opts)
    theta = {k: np.array(v, dtype=np.float64) for k, v in m.params.items()}
    emb = dict(fixnorm=opts.get("fixnorm", False))
    if opts.get("embed_scale"):
        emb["scale"] = opts["embed_scale"]
    if opts.get("scale_embedding"):
        emb["scale"] = math.sqrt(D_E)
    if kind == "d":
        t_loss, t_grads = TL.loss_and_grad("d", theta, X, L=1, emb=emb)
    elif kind == "e":
        if opts.get("n_segments"):
            emb["segments"] = SEG
        t_loss, t_grads = TL.loss_and_grad("e", theta, XT, X, L=1, mask_token=N_V - 3, emb=emb)
    else:
        t_loss, t_grads = TL.loss_and_grad("ed", theta, Z, X, L_enc=1, L_dec=1, emb=emb)
    assert abs(loss - t_loss) <= 1e-10 * abs(t_loss)
    for k, g in grads.items():
        if k.endswith(".b_k"):
            continue  # 0 up to rounding in both (a per-column constant of the scores)
        assert rel_err(g, t_grads[k]) <= 1e-8, (case, k)


@pytest.mark.parametrize("opts", [dict(fixnorm=True), dict(embed_scale=1.7)])
def test_cached_and_paged_decoding_go_through_the_steps(opts):
    m = _model("d", opts)
    for tau in (0.0, 1.0):  # the KV cache's one sequence
        full = list(ft.DInference(8, tau, seed=3, cache=False)([1, 2, 3], m))
        assert list(ft.DInference(8, tau, seed=3, cache=True)([1, 2, 3], m)) == full
    greedy = [list(ft.DInference(8, 0.0, cache=False)(p, m)) for p in ([1, 2, 3], [4, 5])]
    assert [list(g) for g in ft.DInference(8, 0.0, max_batch=2)([[1, 2, 3], [4, 5]], m)] == greedy  # paged


def test_ed_cached_decoding_goes_through_each_stacks_steps():
    m = _model("ed", CASES["ed_bart"][1])
    assert list(ft.EDInference(0.0, max_len=7, cache=True)(Z, m)) == list(ft.EDInference(0.0, max_len=7, cache=False)(Z, m))


def test_refusals_name_the_option():
    with pytest.raises(ValueError, match="embed_scale"):
        ft.DTransformer(N_V, L_MAX, 1, H, D_E, D_MLP, embed_scale=2.0, fixnorm=True)
    with pytest.raises(ValueError, match="separate_positions"):
        ft.EDTransformer(N_V, L_MAX, 1, 1, H, D_E, D_MLP, separate_positions=True, positional="sinusoidal")
    for cls, args, opt in ((ft.DTransformer, (N_V, L_MAX, 1, H, D_E, D_MLP), dict(n_segments=2)),
                           (ft.DTransformer, (N_V, L_MAX, 1, H, D_E, D_MLP), dict(scale_embedding=True)),
                           (ft.DTransformer, (N_V, L_MAX, 1, H, D_E, D_MLP), dict(separate_positions=True)),
                           (ft.ETransformer, (N_V, L_MAX, 1, H, D_E, D_MLP, D_E), dict(embed_scale=2.0)),
                           (ft.EDTransformer, (N_V, L_MAX, 1, 1, H, D_E, D_MLP), dict(n_segments=2))):
        with pytest.raises(TypeError, match=next(iter(opt))):
            cls(*args, **opt)
    with pytest.raises(ValueError, match="n_segments must be >= 0"):
        ft.ETransformer(N_V, L_MAX, 1, H, D_E, D_MLP, D_E, n_segments=-1)
    with pytest.raises(ValueError, match="embed_scale"):
        ft.DTransformer(N_V, L_MAX, 1, H, D_E, D_MLP, embed_scale=-1.0)
    m = _model("e", dict(n_segments=3))
    with pytest.raises(IndexError, match="segment id 3"):
        m(XT, segments=np.where(SEG == 2, 3, SEG))
    with pytest.raises(ValueError, match="n_segments = 0"):
        _model("e", {})(XT, segments=SEG)


def test_the_config_text_keeps_each_option_where_it_stood(tmp_path):
    m = _model("ed", CASES["ed_bart"][1])
    keys = list(m.config)
    i = keys.index("embed_norm")
    assert keys[i: i + 5] == ["embed_norm", "unembed_bias", "scale_embedding", "separate_positions", "fixnorm"]
    e = list(_model("e", CASES["e_all"][1]).config)
    j = e.index("n_segments")
    assert e[j: j + 4] == ["n_segments", "embed_norm", "unembed_bias", "fixnorm"]
    d = list(_model("d", {}).config)
    assert d[d.index("fixnorm") + 1] == "embed_scale"
    ft.save(m, tmp_path / "m")
    back = ft.load(tmp_path / "m")
    assert back.config == m.config
    np.testing.assert_array_equal(back(Z, X), m(Z, X))
