"""Speculative decoding (docs/speculative_decoding.md, Algorithm S): τ = 0 gives exactly the target's greedy
Algorithm 14 output (a draft that agrees, one that disagrees a lot, float32 and float64, the sequence filling
ℓ_max); reference.speculative_inference (the listing in numpy, uncached) gives the same tokens; for τ > 0 the
joint distribution of the first generated tokens (so also the token after an accepted and after a rejected
draft position) passes a χ² goodness-of-fit test against the target's q computed by reference.d_transformer,
with a good, a very bad and a near-uniform draft; the same test rejects a deliberately wrong rule ("always
accept the draft"); the statistics add up; bad input raises.

χ² tests: false-alarm rate ALPHA = 1e-4 each (bins with expected count < 5 merged into one); the seeds are
fixed, so a run is reproducible.
"""
from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chi2

import formal_transformers as ft
from formal_transformers import reference as ref
from conftest import check_gil_released_and_ctrl_c, randomize_normal

ALPHA = 1e-4
V = 6


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: a single-threaded core
randomize = randomize_normal  # (the models here have learned positions: every parameter drawn)


def target_model(dtype="float64", l_max=12, n_vocab=V):
    return randomize(ft.DTransformer(n_vocab, l_max, 2, 2, 16, 32, dtype=dtype, seed=0), 11, 0.5)


def draft_model(kind="good", dtype="float64", l_max=12, n_vocab=V):
    """good: a smaller model with its own random weights (agrees with the target sometimes); bad: large
    random weights (peaked on the wrong tokens); uniform: tiny weights (p ≈ uniform)."""
    scale, seed = {"good": (0.5, 21), "bad": (2.5, 31), "uniform": (1e-3, 41)}[kind]
    return randomize(ft.DTransformer(n_vocab, l_max, 1, 2, 8, 16, dtype=dtype, seed=1), seed, scale)


def forward_of(model):
    """The model as reference.d_transformer over a copy of its parameters (the numpy listing)."""
    c = model.config
    params = {k: np.array(v, dtype=np.float64) for k, v in model.params.items()}
    return lambda x: ref.d_transformer(np.asarray(x), params, L=c["L"], H=c["H"], norm=c["norm"], gelu=c["gelu"], eps=c["eps"])


# ------------------------------------------------------ τ = 0 ------------------------------------------------


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("kind", ["good", "bad", "same"])
@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_tau0_is_the_targets_greedy_output(dtype, kind, k):
    """τ = 0: token for token ft.DInference(l_gen, 0)(x, target), for prompts of several lengths and ℓ_gen
    filling ℓ_max exactly (ℓ + ℓ_gen − 1 = ℓ_max)."""
    l_max = 12
    target = target_model(dtype, l_max, n_vocab=11)
    draft = target if kind == "same" else draft_model(kind, dtype, l_max, n_vocab=11)
    rng = np.random.default_rng(5)
    disagreements = 0
    for l in (1, 2, 4, 7):
        x = rng.integers(0, 11, size=l)
        l_gen = l_max - l + 1
        want = ft.DInference(l_gen, 0.0)(x, target)
        got, st = ft.SpeculativeInference(l_gen, k, 0.0, seed=0)(x, target, draft, stats=True)
        np.testing.assert_array_equal(got, want)
        assert st["target_passes"] == len(st["accepted"]) == len(st["drafted"])
        assert int(np.sum(st["accepted"])) + st["target_passes"] == l_gen  # each pass: accepted + 1 tokens
        assert st["draft_passes"] == int(np.sum(st["drafted"]))
        assert np.all(st["drafted"] <= k) and np.all(st["accepted"] <= st["drafted"])
        if kind == "same":  # the target drafting for itself: every draft accepted
            np.testing.assert_array_equal(st["accepted"], st["drafted"])
        disagreements += int(np.sum(st["drafted"] - st["accepted"]))
    if kind == "bad":
        assert disagreements > 0  # the rejection branch ran


@pytest.mark.parametrize("kind", ["good", "bad"])
def test_tau0_reference_listing_gives_the_same_tokens(kind):
    """The numpy listing (uncached, reference.d_transformer) against the native cached path, and against
    reference.d_inference: the same greedy tokens; the same number of target passes as the native path."""
    target, draft = target_model(), draft_model(kind)
    x = np.array([3, 1, 4])
    for k in (1, 3):
        st_ref = {}
        got_ref = ref.speculative_inference(x, forward_of(target), forward_of(draft), l_gen=9, k=k, tau=0.0, stats=st_ref)
        got, st = ft.SpeculativeInference(9, k, 0.0)(x, target, draft, stats=True)
        np.testing.assert_array_equal(got, got_ref)
        np.testing.assert_array_equal(got_ref, ref.d_inference(x, forward_of(target), l_gen=9, tau=0.0))
        assert st["target_passes"] == st_ref["target_passes"]
        np.testing.assert_array_equal(st["accepted"], st_ref["accepted"])


def test_decode_all_logits_equal_the_full_forward():
    """τ = 0 with the target drafting for itself accepts everything only if the cached verify pass (k + 1
    columns, DTransformer.decode_all) reproduces the full forward's argmax at every column; here with near
    ties excluded by a larger vocabulary and float64."""
    target = target_model(n_vocab=11, l_max=30)
    x = np.array([1, 2, 3, 4])
    _, st = ft.SpeculativeInference(26, 6, 0.0)(x, target, target, stats=True)
    assert st["target_passes"] == 4  # 26 tokens: three rounds of 6 drafts + 1, then k' = 4 (capped) + 1
    np.testing.assert_array_equal(st["drafted"], [6, 6, 6, 4])
    np.testing.assert_array_equal(st["accepted"], st["drafted"])


# ------------------------------------------------------ τ > 0 ------------------------------------------------


def exact_joint(target, x, n_tok, tau):
    """Probability of every continuation y ∈ V^{n_tok} under Algorithm 14 with the target (numpy listing):
    Π_i q(y_i | x, y_{<i}), one forward per prefix."""
    f = forward_of(target)
    joint = np.zeros((V,) * n_tok)

    def fill(prefix, pr):
        if len(prefix) == n_tok:
            joint[tuple(prefix)] = pr
            return
        q = ref.sampling_distribution(f(np.concatenate([x, np.array(prefix, dtype=np.int64)]))[:, -1], tau)
        for v in range(V):
            fill(prefix + [v], pr * q[v])

    fill([], 1.0)
    return joint


def chi2_pvalue(counts, probs):
    """χ² goodness of fit of counts (n draws) to probs; bins with expected count < 5 merged into one."""
    counts, probs = np.ravel(counts).astype(float), np.ravel(probs)
    n = counts.sum()
    exp = n * probs
    big = exp >= 5
    obs_b, exp_b = list(counts[big]), list(exp[big])
    if (~big).any():
        obs_b.append(counts[~big].sum())
        exp_b.append(exp[~big].sum())
    obs_b, exp_b = np.array(obs_b), np.array(exp_b)
    stat = float(np.sum((obs_b - exp_b) ** 2 / exp_b))
    return stat, float(chi2.sf(stat, len(obs_b) - 1))


def native_samples(target, draft, x, n_tok, k, tau, n):
    counts = np.zeros((V,) * n_tok)
    accepted = np.zeros(k + 1, dtype=int)
    for s in range(n):
        spec = ft.SpeculativeInference(n_tok, k, tau, seed=1000 + s)
        y, st = spec(x, target, draft, stats=True)
        counts[tuple(y)] += 1
        accepted[st["accepted"][0]] += 1
    return counts, accepted


X = np.array([2, 5, 0])


@pytest.mark.parametrize("kind,tau", [("good", 1.0), ("good", 0.7), ("bad", 1.0), ("uniform", 1.3)])
def test_joint_distribution_of_three_tokens_is_the_targets(kind, tau):
    """k = 2, ℓ_gen = 3: the first round drafts two tokens and may add a bonus one, so the three tokens cover
    a kept draft, a replaced (rejected) draft, the token after either, and the bonus. 12000 runs; the joint
    frequencies of (y_1, y_2, y_3) (216 cells) against Π q(y_i | x, y_{<i}) of the target."""
    target, draft = target_model(), draft_model(kind)
    want = exact_joint(target, X, 3, tau)
    counts, accepted = native_samples(target, draft, X, 3, 2, tau, 12000)
    stat, pv = chi2_pvalue(counts, want)
    assert pv > ALPHA, (stat, pv)
    # every branch of the first round ran: 0, 1 and 2 drafts kept
    assert np.all(accepted > 0), accepted
    # the marginal of the second token too (the one after a kept or replaced draft), a sharper test of it
    stat2, pv2 = chi2_pvalue(counts.sum(axis=(0, 2)), want.sum(axis=(0, 2)))
    assert pv2 > ALPHA, (stat2, pv2)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_first_token_distribution_long_draft(dtype):
    """k = 5 with the bad draft: the first token (a draft position, rejected most of the time) follows q."""
    target, draft = target_model(dtype), draft_model("bad", dtype)
    want = exact_joint(target, X, 1, 1.0)
    counts = np.zeros(V)
    for s in range(6000):
        y = ft.SpeculativeInference(4, 5, 1.0, seed=s)(X, target, draft)
        counts[y[0]] += 1
    stat, pv = chi2_pvalue(counts, want)
    assert pv > ALPHA, (stat, pv)


def test_the_test_rejects_a_wrong_acceptance_rule():
    """The same χ² test on the numpy listing: with the correct rule it passes; with "always accept the draft"
    (line 13 replaced by accept = 1) the tokens follow the bad draft, not the target, and the test rejects at
    ALPHA. So the tests above can fail."""
    target, draft = target_model(), draft_model("bad")
    ft_t, ft_d = forward_of(target), forward_of(draft)
    want = exact_joint(target, X, 2, 1.0)

    def counts_with(accept, n=800):
        rng = np.random.default_rng(7)
        c = np.zeros((V, V))
        for _ in range(n):
            y = ref.speculative_inference(X, ft_t, ft_d, l_gen=2, k=2, tau=1.0, rng=rng, accept=accept)
            c[tuple(y)] += 1
        return c

    _, pv_right = chi2_pvalue(counts_with(ref.speculative_acceptance), want)
    assert pv_right > ALPHA, pv_right
    stat_wrong, pv_wrong = chi2_pvalue(counts_with(lambda q_x, p_x: 1.0), want)
    assert pv_wrong < ALPHA, (stat_wrong, pv_wrong)


# ------------------------------------------------------ bad input --------------------------------------------


def test_bad_input_raises():
    target = target_model(l_max=12)
    draft = draft_model(l_max=12)
    x = np.array([1, 2, 3])
    with pytest.raises(ValueError, match="vocabulary"):
        ft.SpeculativeInference(3, 2, 1.0)(x, target, draft_model(n_vocab=V + 1))
    with pytest.raises(ValueError, match="l_max"):
        ft.SpeculativeInference(11, 2, 1.0)(x, target, draft)  # 3 + 11 − 1 = 13 > 12
    with pytest.raises(ValueError, match="draft l_max"):
        ft.SpeculativeInference(8, 2, 1.0)(x, target, draft_model(l_max=8))
    ft.SpeculativeInference(10, 2, 1.0)(x, target, draft)  # 3 + 10 − 1 = 12 fits
    with pytest.raises(ValueError, match="k"):
        ft.SpeculativeInference(3, 0, 1.0)
    with pytest.raises(ValueError, match="tau"):
        ft.SpeculativeInference(3, 2, -0.5)
    with pytest.raises(ValueError, match="l_gen"):
        ft.SpeculativeInference(-1, 2, 1.0)
    with pytest.raises(IndexError):
        ft.SpeculativeInference(3, 2, 1.0)(np.array([1, V]), target, draft)
    with pytest.raises(IndexError):
        ft.SpeculativeInference(3, 2, 1.0)(np.array([-1, 2]), target, draft)
    with pytest.raises(ValueError):
        ft.SpeculativeInference(3, 2, 1.0)(np.array([], dtype=np.int64), target, draft)
    with pytest.raises(ValueError, match="dtype"):
        ft.SpeculativeInference(3, 2, 1.0)(x, target, draft_model(dtype="float32"))
    with pytest.raises(TypeError, match="draft"):
        ft.SpeculativeInference(3, 2, 1.0)(x, target, "not a model")
    with pytest.raises(TypeError, match="target"):
        ft.SpeculativeInference(3, 2, 1.0)(x, ft.ETransformer(V, 12, 1, 2, 8, 16, 8), draft)
    # nothing half-done: the models still decode as before
    np.testing.assert_array_equal(ft.SpeculativeInference(5, 2, 0.0)(x, target, draft), ft.DInference(5, 0.0)(x, target))


def test_l_gen_zero_and_repr():
    target, draft = target_model(), draft_model()
    y, st = ft.SpeculativeInference(0, 3, 1.0, seed=1)(np.array([1]), target, draft, stats=True)
    assert y.shape == (0,) and st["target_passes"] == 0
    s = ft.SpeculativeInference(7, 3, 0.5, seed=1)
    assert (s.l_gen, s.k, s.tau) == (7, 3, 0.5)
    assert repr(s) == "SpeculativeInference(l_gen=7, k=3, tau=0.5)"


def test_gil_released_and_ctrl_c_stops():
    """A long call lets another Python thread run (the GIL is released) and a real SIGINT stops it early with
    KeyboardInterrupt, the models still usable."""
    # big enough that the call lasts well over 0.2 s on a fast, quiet machine (0.14 s was seen with a
    # 32-wide target at 2000 tokens on a loaded one)
    draft = ft.DTransformer(V, 4096, 1, 2, 16, 32, dtype="float32", seed=1)
    x = np.array([1, 2, 3])
    target = [None]

    def calls():  # a longer call on a machine fast enough to finish the first in under 0.2 s
        for d_e, d_mlp in ((64, 256), (128, 1024), (256, 4096)):
            target[0] = ft.DTransformer(V, 4096, 2, 2, d_e, d_mlp, dtype="float32", seed=0)
            spec = ft.SpeculativeInference(4000, 4, 1.0, seed=0)
            yield lambda: spec(x, target[0], draft)

    check_gil_released_and_ctrl_c(calls())
    assert len(ft.SpeculativeInference(5, 2, 0.0)(x, target[0], draft)) == 5
