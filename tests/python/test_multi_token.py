"""V16 multi-token prediction (docs/variants.md; DeepSeek-V3 §2.2, Gloeckle et al. 2024): the loss vs reference.py
(float64 ≤ 1e-12, float32 ≤ 1e-5), every gradient vs PyTorch autograd of an independent transcription
(torch_mtp.py) and vs finite differences (the new parameters; with dropout too), ragged batches with RoPE, GQA,
SwiGLU, bias=False, tied; the trunk is Algorithm 10 unchanged; save/load; bad options; self-speculative decoding
(the MTP modules draft, no second model) equal to greedy decoding, and accepting drafts once trained."""
from __future__ import annotations

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref
from conftest import TOL, numeric_grad, randomize_theta, rel_err, torch_or_skip

BASE = dict(n_vocab=13, l_max=12, L=2, H=2, d_e=8, d_mlp=12)
OPTIONS = {
    "gpt2": dict(),
    "llama": dict(positional="rope", H_kv=1, mlp="swiglu", bias=False, norm="rms"),
    "tied_tanh": dict(tied=True, gelu="tanh"),
    "alibi": dict(positional="alibi"),
}
REF_KEYS = ("norm", "positional", "rope_theta", "mlp", "eps", "gelu")
BATCH = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3], [8, 9, 7, 9, 3], [2, 7, 1, 8, 2, 8, 1]]  # ragged; every ℓ ≥ D + 2


def make(opts, dtype="float64", D=2, seed=3, **extra):
    kw = {**BASE, **opts, **extra}
    args = [kw.pop(k) for k in ("n_vocab", "l_max", "L", "H", "d_e", "d_mlp")]
    return ft.DTransformer(*args, dtype=dtype, seed=seed, mtp_depth=D, **kw)


def hp_of(opts):
    return dict(L=BASE["L"], H=BASE["H"], **{k: v for k, v in opts.items() if k in REF_KEYS})


def randomize(model, rng, opts):
    return randomize_theta(model, rng, skip=("W_u",) if opts.get("tied") else ())


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("D", [1, 3])
@pytest.mark.parametrize("name", list(OPTIONS))
def test_loss_and_its_terms_match_the_reference(name, D, dtype):
    opts = OPTIONS[name]
    m = make(opts, dtype, D=D, mtp_weight=0.7)
    theta = randomize(m, np.random.default_rng(1), opts)
    loss = m.loss(BATCH)
    terms = m.loss_terms()
    want = ref.d_mtp_loss(BATCH, theta, mtp_depth=D, terms=True, **hp_of(opts))
    assert len(terms) == D + 1
    assert rel_err(terms, want) <= TOL[dtype], (name, terms, want)
    total = want[0] + 0.7 / D * sum(want[1:])
    assert abs(loss - total) <= TOL[dtype] * abs(total)
    assert abs(ref.d_mtp_loss(BATCH, theta, mtp_depth=D, mtp_weight=0.7, **hp_of(opts)) - total) <= 1e-12 * total
    # loss_and_grad returns the same objective (float64: bit for bit the same forward)
    lg, _ = m.loss_and_grad(BATCH)
    assert abs(lg - loss) <= TOL[dtype] * abs(loss)


@pytest.mark.parametrize("name", list(OPTIONS))
def test_every_gradient_matches_torch_autograd(name):
    torch_or_skip()
    import torch_mtp

    opts = OPTIONS[name]
    m = make(opts, D=2, mtp_weight=0.5)
    theta = randomize(m, np.random.default_rng(2), opts)
    loss, grads = m.loss_and_grad(BATCH)
    t_loss, t_grads = torch_mtp.loss_and_grad(theta, BATCH, D=2, lam=0.5, **hp_of(opts))
    assert abs(loss - t_loss) <= 1e-10 * abs(t_loss)
    assert set(t_grads) == set(grads) - ({"W_u"} if opts.get("tied") else set())
    assert any(k.startswith("mtp.1.") for k in grads)
    scale = max(np.abs(g).max() for g in t_grads.values())
    for k, g in t_grads.items():
        if k.endswith(".b_k") and opts.get("positional") != "rope":  # exactly 0 but for rounding (test_variants.py)
            assert np.abs(grads[k]).max() <= 1e-12 * scale
            continue
        assert rel_err(grads[k], g) <= 1e-8, (name, k, rel_err(grads[k], g))


NEW = ("gamma_h", "beta_h", "gamma_e", "beta_e", "W_m", "gamma1", "attn.W_q", "attn.b_v", "W_mlp2")


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_finite_differences_on_the_new_parameters(dropout):
    # float64 central differences of loss_and_grad's loss with the dropout masks replayed (dropout_step set back)
    m = make({}, D=2, dropout=dropout, mtp_weight=0.8)
    randomize(m, np.random.default_rng(5), {})
    step = m.dropout_step

    def f():
        m.dropout_step = step
        return m.loss_and_grad(BATCH)[0]

    m.dropout_step = step
    loss, grads = m.loss_and_grad(BATCH)
    if dropout:  # the training forward dropped (evaluation never does)
        assert abs(loss - m.loss(BATCH)) > 1e-3
    names = [f"mtp.{k}.{n}" for k in (0, 1) for n in NEW] + ["W_e", "gamma", "beta", "W_u"]
    for name in names:
        g = numeric_grad(f, m.params[name])
        assert rel_err(grads[name], g) <= 1e-6, (name, dropout, rel_err(grads[name], g))


def test_dropout_changes_the_modules_and_evaluation_does_not_drop():
    m = make({}, D=2, resid_dropout=0.5)
    theta = randomize(m, np.random.default_rng(6), {})
    assert m.loss(BATCH) == pytest.approx(ref.d_mtp_loss(BATCH, theta, mtp_depth=2, mtp_weight=0.3, **hp_of({})), rel=1e-12)
    l0, _ = m.loss_and_grad(BATCH)
    l1, _ = m.loss_and_grad(BATCH)
    assert l0 != l1  # other masks at the next step


def test_the_trunk_is_algorithm_10():
    # the same seed gives the same θ of Algorithm 10 (the modules are initialised after it), so P is the same,
    # and L_main is mtp_depth = 0's loss; mtp_weight = 0: the loss is Algorithm 13's and the modules get no gradient
    plain, m = make({}, D=0), make({}, D=2)
    for name, v in plain.params.items():
        assert np.array_equal(v, m.params[name]), name
    assert np.array_equal(np.concatenate(plain(BATCH), 1), np.concatenate(m(BATCH), 1))
    m.loss(BATCH)
    assert m.loss_terms()[0] == plain.loss(BATCH)
    z = make({}, D=2, mtp_weight=0.0)
    loss, grads = z.loss_and_grad(BATCH)
    assert loss == plain.loss(BATCH)
    assert all(not grads[k].any() for k in grads if k.startswith("mtp."))
    assert set(z.params) - set(plain.params) == {k for k in z.params if k.startswith("mtp.")}
    assert z.params["mtp.1.W_m"].shape == (8, 16)


def test_save_load_round_trip(tmp_path):
    m = make(OPTIONS["llama"], D=2)
    randomize(m, np.random.default_rng(7), {})
    ft.save(m, tmp_path / "mtp.safetensors")
    back = ft.load(tmp_path / "mtp.safetensors")
    assert back.config == m.config and back.config["mtp_depth"] == 2
    for name, v in m.params.items():
        assert np.array_equal(back.params[name], v), name
    assert back.loss(BATCH) == m.loss(BATCH)


def test_bad_options_raise_before_anything_changes():
    with pytest.raises(ValueError, match="mtp_depth"):
        make({}, D=11)  # l_max = 12 < D + 2
    with pytest.raises(ValueError, match="mtp_depth"):
        make({}, D=1, mask="prefix")
    with pytest.raises(ValueError, match="mtp_weight"):
        make({}, D=1, mtp_weight=-1.0)
    with pytest.raises((TypeError, ValueError), match="mtp_depth"):
        ft.ETransformer(13, 12, 1, 2, 8, 12, 8, mtp_depth=1)
    with pytest.raises(ValueError, match="mtp_depth"):  # Hugging Face's classes have no place for the modules
        ft.to_hf(make({}, D=1))
    m = make({}, D=3, dropout=0.1)
    before = {k: v.copy() for k, v in m.params.items()}
    step = m.dropout_step
    with pytest.raises(ValueError, match="mtp_depth = 3.*x\\[1\\] has 4"):
        m.loss_and_grad([[1, 2, 3, 4, 5], [1, 2, 3, 4]])
    with pytest.raises(ValueError, match="mtp_depth"):
        m.loss([1, 2, 3])
    assert m.dropout_step == step
    assert all(np.array_equal(v, before[k]) for k, v in m.params.items())
    assert m(np.array([1, 2])).shape == (13, 2)  # the trunk's P of a short sequence is fine


# ---------------------------------------------------------------------------------------------------
# Self-speculative decoding: the modules draft, the trunk verifies


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_self_speculation_equals_greedy_decoding(name, k):
    m = make(OPTIONS[name], D=3, l_max=40)
    randomize(m, np.random.default_rng(8), OPTIONS[name])
    for prompt in ([4], [1, 2, 3, 4, 5]):
        greedy = ft.DInference(20, 0.0)(prompt, m)
        y, st = ft.SpeculativeInference(20, k, 0.0, seed=0)(prompt, m, stats=True)
        assert list(y) == list(greedy), (name, k, prompt)
        assert st["drafted"][0] == 0 and all(d <= k for d in st["drafted"])
        assert sum(st["accepted"]) + st["target_passes"] == 20


def test_self_speculation_samples_valid_tokens_and_is_seeded():
    m = make({}, D=2, l_max=40)
    randomize(m, np.random.default_rng(9), {})
    a = ft.SpeculativeInference(25, 2, 1.0, seed=3)([1, 2], m)
    b = ft.SpeculativeInference(25, 2, 1.0, seed=3)([1, 2], m)
    assert list(a) == list(b) and len(a) == 25 and all(0 <= t < 13 for t in a)


def test_self_speculation_bad_input():
    with pytest.raises(ValueError, match="mtp_depth = 0"):
        ft.SpeculativeInference(5, 1, 0.0)([1, 2], make({}, D=0))
    with pytest.raises(ValueError, match="k = 3 must be <= mtp_depth = 2"):
        ft.SpeculativeInference(5, 3, 0.0)([1, 2], make({}, D=2))
    with pytest.raises(ValueError, match="l_max"):
        ft.SpeculativeInference(20, 1, 0.0)([1, 2], make({}, D=2))
    with pytest.raises(IndexError):
        ft.SpeculativeInference(5, 1, 0.0)([1, 99], make({}, D=2))


def test_trained_modules_draft_accepted_tokens():
    # a periodic language (period 5): after a short training with the MTP loss the modules know the tokens
    # 2 and 3 ahead, so self-speculation accepts nearly every draft: ≈ k + 1 tokens per target pass. With the
    # drafts read from the wrong position or module (an off-by-one), nothing would be accepted.
    rng = np.random.default_rng(0)
    m = make({}, D=2, l_max=40, seed=1)
    opt = ft.Adam(1e-2)
    for _ in range(150):
        starts = rng.integers(0, 5, size=4)
        batch = [[(s + t) % 5 for t in range(12)] for s in starts]
        m.loss_and_grad(batch, copy=False)
        opt.step(m)
    prompt = [2, 3, 4]
    y, st = ft.SpeculativeInference(30, 2, 0.0, seed=0)(prompt, m, stats=True)
    assert list(y) == list(ft.DInference(30, 0.0)(prompt, m))
    assert list(y[:5]) == [0, 1, 2, 3, 4]
    assert st["tokens_per_pass"] >= 2.5, st


@pytest.mark.parametrize("k", [2, 3])
def test_self_speculation_drafts_as_the_uncached_reference(k):
    # Algorithm S of reference.py with the modules of reference.d_transformer_variant (no cache: each draft from the
    # whole sequence x + drafts so far) as the draft: at τ = 0 the drafts kept per target pass are the core's, so the
    # modules' cached decoding and its rollback (the positions whose token was kept) draft what the listing says.
    # The core's first pass drafts nothing: the reference starts after it, from the prompt + the first greedy token.
    opts = OPTIONS["llama"]
    m = make(opts, D=3, l_max=40)
    theta = randomize(m, np.random.default_rng(11), opts)
    # a θ whose drafts are right about half the time: the trunk's and the modules' heads share W_u; a large W_u makes
    # both confident, and the modules agree with the trunk more often than by chance
    prompt, l_gen = [1, 2, 3, 4, 5], 24
    y, st = ft.SpeculativeInference(l_gen, k, 0.0, seed=0)(prompt, m, stats=True)
    hp = dict(L=BASE["L"], H=BASE["H"], norm="rms", positional="rope", mlp="swiglu")
    state = {}

    def target(seq):
        state["m"] = None  # the next draft call starts a round
        return ref.softmax(ref.d_transformer_variant(seq, theta, mtp_depth=3, **hp)[0])

    def draft(seq):
        if state.get("m") is None:
            state["m"], state["j"] = len(seq), 0
        state["j"] += 1
        mods = ref.d_transformer_variant(seq, theta, mtp_depth=3, **hp)[1]
        P = np.zeros((13, len(seq)))
        P[:, -1] = ref.softmax(mods[state["j"] - 1][:, state["m"] - 2])  # module j at position m − 2 (0-based)
        return P

    ref_st = {}
    y_ref = ref.speculative_inference(prompt + [int(y[0])], target, draft, l_gen=l_gen - 1, k=k, tau=0.0, stats=ref_st)
    assert list(y_ref) == list(y[1:])
    assert list(ref_st["accepted"]) == list(st["accepted"][1:])
    assert 0 < sum(ref_st["accepted"]) < k * len(ref_st["accepted"])  # some drafts kept, some rejected: the check has teeth
