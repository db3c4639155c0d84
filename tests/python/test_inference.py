"""Algorithms 14 (DInference) and 15 (EDInference): the KV-cached path equals the literal listing token for
token (float32 and float64, several seeds, τ = 0 / 1 / others, top_k, top_p, past ℓ_max with the sliding
window); τ = 0 is the greedy listing written out by hand with model.logits; sampled frequencies follow
q ∝ p^{1/τ} restricted by top_k / top_p; EDInference starts with bos, ends with eos when it is generated and
always terminates; bad input raises.
"""
from __future__ import annotations

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref
from conftest import randomize_normal

V = 11  # data 0..7, mask 8, bos 9, eos 10


# tiny models: a single-threaded core (conftest.one_thread); tests that exercise threads set their own count
pytestmark = pytest.mark.usefixtures("one_thread")


def dmodel(dtype="float64", seed=0, l_max=10, positional="learned", scale=0.4, **kw):
    m = ft.DTransformer(V, l_max, 2, 2, 16, 32, dtype=dtype, seed=seed, positional=positional, **kw)
    return randomize_normal(m, seed + 50, scale)  # spread out: init_std 0.02 gives near-uniform outputs


def edmodel(dtype="float64", seed=0, l_max=10, **kw):
    m = ft.EDTransformer(V, l_max, 1, 2, 2, 16, 32, dtype=dtype, seed=seed, **kw)
    return randomize_normal(m, seed + 70)


SAMPLING = [
    dict(tau=1.0),
    dict(tau=0.0),
    dict(tau=0.6),
    dict(tau=2.0),
    dict(tau=1.0, top_k=3),
    dict(tau=1.0, top_p=0.7),
    dict(tau=0.8, top_k=5, top_p=0.9),
]


def sid(s):
    return ",".join(f"{k}={v}" for k, v in s.items())


# ------------------------------------------------------------------------------------------------------
# the core's random stream in Python: the listings of reference.py can then draw the same numbers


class MT19937_64:
    """std::mt19937_64 (fully specified by the C++ standard), with the core's uniform() = (next() >> 11)·2^-53
    (common.hpp) as random(): the core's random stream in Python."""

    MASK = (1 << 64) - 1

    def __init__(self, seed: int):
        mt = [seed & self.MASK]
        for i in range(1, 312):
            mt.append((6364136223846793005 * (mt[-1] ^ (mt[-1] >> 62)) + i) & self.MASK)
        self.mt, self.i = mt, 312

    def next(self) -> int:
        if self.i >= 312:
            mt = self.mt
            for k in range(312):
                x = (mt[k] & 0xFFFFFFFF80000000) | (mt[(k + 1) % 312] & 0x7FFFFFFF)
                mt[k] = mt[(k + 156) % 312] ^ (x >> 1) ^ (0xB5026F5AA96619E9 if x & 1 else 0)
            self.i = 0
        y = self.mt[self.i]
        self.i += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & self.MASK

    def random(self) -> float:
        return (self.next() >> 11) * 2.0**-53


def test_mt19937_64_is_the_standard_engine():
    g = MT19937_64(5489)  # the C++ standard: the 10000th output of a default-constructed mt19937_64
    for _ in range(9999):
        g.next()
    assert g.next() == 9981545732273789042


# ------------------------------------------------------------------------------------------------------
# cached == literal


@pytest.mark.parametrize("sampling", SAMPLING, ids=sid)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_dinference_cached_equals_literal(dtype, sampling, positional):
    m = dmodel(dtype, seed=1, positional=positional)
    prompts = [np.array([3]), np.array([1, 4, 1, 5]), np.arange(10) % 8]  # the last fills l_max = 10
    for seed in range(4):
        for prompt in prompts:
            for l_gen in (5, 17):  # inside l_max, and past it (prompt + l_gen > l_max: the sliding window)
                a = ft.DInference(l_gen, seed=seed, cache=True, **sampling)(prompt, m)
                b = ft.DInference(l_gen, seed=seed, cache=False, **sampling)(prompt, m)
                assert a.shape == (l_gen,)
                assert np.array_equal(a, b), (seed, prompt, l_gen, a, b)


@pytest.mark.parametrize("sampling", SAMPLING, ids=sid)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_edinference_cached_equals_literal(dtype, sampling):
    m = edmodel(dtype, seed=2)
    lengths = []
    for seed in range(4):
        for z in (np.array([2]), np.array([0, 7, 3, 3, 1]), np.arange(10) % 8):
            a = ft.EDInference(seed=seed, cache=True, **sampling)(z, m)
            b = ft.EDInference(seed=seed, cache=False, **sampling)(z, m)
            assert np.array_equal(a, b), (seed, z, a, b)
            lengths.append(len(a))
    assert max(lengths) > 3  # the outputs were not all trivially short


@pytest.mark.parametrize("threads", [1, 2])
def test_cached_and_literal_differ_in_nothing_but_speed_over_many_seeds(threads):
    """Many seeds at τ = 1 over the sliding window (float32, where rounding differs most between a
    one-column update and a full recomputation), single- and multi-threaded."""
    ft.set_num_threads(threads)
    m = dmodel("float32", seed=3, l_max=8)
    prompt = np.array([5, 6, 7])
    for seed in range(40 if threads == 1 else 15):
        a = ft.DInference(12, seed=seed)(prompt, m)
        b = ft.DInference(12, seed=seed, cache=False)(prompt, m)
        assert np.array_equal(a, b), seed


# ------------------------------------------------------------------------------------------------------
# τ = 0: the greedy listing by hand


def greedy_by_hand(model, x, l_gen):
    """Algorithm 14 with τ → 0, literally: the whole model on the whole (windowed) sequence each step."""
    x = list(x)
    for _ in range(l_gen):
        window = np.array(x[-model.l_max:])  # past l_max the model sees the last l_max tokens
        z = model.logits(window)[:, -1]
        x.append(int(np.argmax(z)))
    return np.array(x[len(x) - l_gen:])


@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
@pytest.mark.parametrize("cache", [True, False])
def test_dinference_tau0_is_the_greedy_listing(positional, cache):
    m = dmodel("float64", seed=4, positional=positional, scale=1.0)  # context-dependent greedy choices
    chosen = set()
    for prompt in (np.array([0]), np.array([7, 1, 2]), np.arange(10) % 8):
        want = greedy_by_hand(m, prompt, 16)
        got = ft.DInference(16, tau=0, cache=cache)(prompt, m)
        assert np.array_equal(got, want), (prompt, got, want)
        chosen |= set(want.tolist())
        # top_k = 1 at any τ is the argmax too
        assert np.array_equal(ft.DInference(16, tau=3.0, top_k=1, seed=9, cache=cache)(prompt, m), want)
    assert len(chosen) > 1  # the greedy choice depends on the context


def edgreedy_by_hand(model, z, max_len):
    x = [model.bos_token]
    while x[-1] != model.eos_token and len(x) < max_len:
        x.append(int(np.argmax(model.logits(z, np.array(x))[:, -1])))
    return np.array(x)


@pytest.mark.parametrize("cache", [True, False])
def test_edinference_tau0_is_the_greedy_listing(cache):
    m = edmodel("float64", seed=5)
    for z in (np.array([1]), np.array([4, 4, 2, 0]), np.arange(10) % 8):
        for max_len in (None, 4):
            want = edgreedy_by_hand(m, z, max_len or m.l_max)
            got = ft.EDInference(tau=0, max_len=max_len, cache=cache)(z, m)
            assert np.array_equal(got, want), (z, got, want)


# ------------------------------------------------------------------------------------------------------
# vs reference.py's listings, drawing the same uniform numbers (one per token, inverse CDF in token order)


def d_hp(m):
    c = m.config
    return dict(L=c["L"], H=c["H"], norm=c["norm"], gelu=c["gelu"], eps=c["eps"])


@pytest.mark.parametrize("tau", [1.0, 0.7, 1.8, 0.0])
@pytest.mark.parametrize("cache", [True, False])
def test_dinference_equals_the_reference_listing(tau, cache):
    """Algorithm 14 against reference.d_inference with the numpy DTransformer (reference.d_transformer) as
    the model, the same seeded uniform numbers, and the sliding window past l_max."""
    m = dmodel("float64", seed=11)
    params = {k: np.array(v) for k, v in m.params.items()}
    forward = lambda x: ref.d_transformer(x, params, **d_hp(m))
    for seed in range(3):
        for prompt in (np.array([6]), np.array([2, 7, 1, 0, 3])):
            want = ref.d_inference(prompt, forward, l_gen=9, tau=tau, rng=MT19937_64(seed), l_max=m.l_max)
            got = ft.DInference(9, tau=tau, seed=seed, cache=cache)(prompt, m)
            assert np.array_equal(got, want), (seed, prompt, got, want)


@pytest.mark.parametrize("tau", [1.0, 0.6, 0.0])
@pytest.mark.parametrize("cache", [True, False])
def test_edinference_equals_the_reference_listing(tau, cache):
    m = edmodel("float64", seed=12)
    params = {k: np.array(v) for k, v in m.params.items()}
    c = m.config
    forward = lambda z, x: ref.ed_transformer(z, x, params, L_enc=c["L_enc"], L_dec=c["L_dec"], H=c["H"], eps=c["eps"])
    for seed in range(4):
        for z in (np.array([5]), np.array([1, 1, 4, 0, 7, 2])):
            for max_len in (None, 4):
                want = ref.ed_inference(z, forward, tau=tau, bos_token=m.bos_token, eos_token=m.eos_token,
                                        max_len=max_len or m.l_max, rng=MT19937_64(seed))
                got = ft.EDInference(tau=tau, seed=seed, max_len=max_len, cache=cache)(z, m)
                assert np.array_equal(got, want), (seed, z, max_len, got, want)


# ------------------------------------------------------------------------------------------------------
# sampling: frequencies of q ∝ p^{1/τ}, restricted by top_k / top_p


LOGITS = np.array([1.2, 0.3, -0.5, 2.0, 0.0, -1.5, 0.9, -0.2, -3.0, -3.0, -3.0])


def constant_output_dmodel(dtype="float64", l_max=64):
    """A DTransformer whose logits are LOGITS at every position whatever the context: the final layer_norm
    with γ = 0, β = e_0 makes every column e_0, and W_u's first column is LOGITS."""
    m = ft.DTransformer(V, l_max, 1, 2, 8, 16, dtype=dtype, seed=0)
    m.params["gamma"][...] = 0
    m.params["beta"][...] = np.eye(8)[0]
    m.params["W_u"][...] = 0
    m.params["W_u"][:, 0] = LOGITS
    return m


def expected_q(tau, top_k=None, top_p=None):
    q = np.exp((LOGITS - LOGITS.max()) / tau)
    q /= q.sum()
    order = np.argsort(-q, kind="stable")
    keep = len(q)
    if top_k:
        keep = min(keep, top_k)
    if top_p is not None and top_p < 1:
        # the smallest set of the top_k candidates whose mass, renormalised over them, reaches top_p
        c = np.cumsum(q[order[:keep]]) / q[order[:keep]].sum()
        keep = min(keep, int(np.searchsorted(c, top_p) + 1))
    out = np.zeros_like(q)
    out[order[:keep]] = q[order[:keep]]
    return out / out.sum()


def sample_frequencies(model, n_calls=70, **sampling):
    counts = np.zeros(V)
    for seed in range(n_calls):
        y = ft.DInference(model.l_max - 1, seed=seed, **sampling)(np.array([0]), model)
        counts += np.bincount(y, minlength=V)
    return counts / counts.sum(), counts.sum()


@pytest.mark.parametrize(
    "sampling",
    [dict(tau=1.0), dict(tau=0.5), dict(tau=2.0), dict(tau=1.0, top_k=3), dict(tau=1.0, top_p=0.6),
     dict(tau=2.0, top_p=0.8), dict(tau=0.7, top_k=2), dict(tau=1.0, top_k=3, top_p=0.7)],
    ids=sid,
)
def test_sampled_frequencies_follow_q(sampling):
    m = constant_output_dmodel()
    z = m.logits(np.array([3, 1, 4]))
    assert np.allclose(z, LOGITS[:, None])  # the construction holds
    freq, n = sample_frequencies(m, **sampling)
    want = expected_q(sampling["tau"], sampling.get("top_k"), sampling.get("top_p"))
    sd = np.sqrt(want * (1 - want) / n)
    assert np.all(np.abs(freq - want) <= 5 * sd + 1e-12), (freq, want)
    assert np.all(freq[want == 0] == 0)  # nothing outside the top-k / nucleus, ever
    # the distribution with τ = 1 and no restriction is far from this one unless it is that one
    plain = expected_q(1.0)
    if sampling != dict(tau=1.0):
        assert np.max(np.abs(plain - want)) > 10 * np.max(sd)


def logits_edmodel(dtype="float64", l_max=64):
    """An EDTransformer whose logits are LOGITS at every decoder position whatever z and x: the last decoder
    layer's final layer_norm (γ5 = 0, β5 = e_0) makes every column e_0, and W_u's first column is LOGITS."""
    m = ft.EDTransformer(V, l_max, 1, 1, 2, 8, 16, dtype=dtype, seed=0)
    m.params["dec.0.gamma5"][...] = 0
    m.params["dec.0.beta5"][...] = np.eye(8)[0]
    m.params["W_u"][...] = 0
    m.params["W_u"][:, 0] = LOGITS
    return m


@pytest.mark.parametrize("cache", [True, False], ids=["cache", "literal"])
@pytest.mark.parametrize(
    "sampling", [dict(tau=1.0), dict(tau=0.5), dict(tau=2.0), dict(tau=1.0, top_k=3), dict(tau=1.0, top_p=0.6)], ids=sid)
def test_edinference_sampled_frequencies_follow_q(sampling, cache):
    """Algorithm 15 with τ > 0 (as Algorithm 14 above): every token drawn after bos — eos included, it is drawn
    from q like the others — has the frequencies of q ∝ p^{1/τ} restricted by top_k / top_p."""
    m = logits_edmodel()
    assert np.allclose(m.logits(np.array([3, 1]), np.array([m.bos_token, 2, 5])), LOGITS[:, None])
    counts = np.zeros(V)
    for seed in range(60 if cache else 25):
        y = ft.EDInference(tau=sampling["tau"], top_k=sampling.get("top_k"), top_p=sampling.get("top_p"),
                           seed=seed, cache=cache, max_len=m.l_max)(np.array([4, 0, 6]), m)
        assert y[0] == m.bos_token
        assert m.eos_token not in y[1:-1]  # generation stops at the first eos
        counts += np.bincount(y[1:], minlength=V)
    n = counts.sum()
    freq = counts / n
    want = expected_q(sampling["tau"], sampling.get("top_k"), sampling.get("top_p"))
    sd = np.sqrt(want * (1 - want) / n)
    assert np.all(np.abs(freq - want) <= 5 * sd + 1e-12), (freq, want)
    assert np.all(freq[want == 0] == 0)
    plain = expected_q(1.0)
    if sampling != dict(tau=1.0):
        assert np.max(np.abs(plain - want)) > 10 * np.max(sd)


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    """With q sorted (0.47, 0.18, 0.12, …): top_p = 0.47 keeps one token, 0.48 two, 0.65 two, 0.66 three."""
    m = constant_output_dmodel()
    q = expected_q(1.0)
    qs = np.sort(q)[::-1]
    for top_p, k in ((qs[0] - 1e-3, 1), (qs[0] + 1e-3, 2), (qs[:2].sum() - 1e-3, 2), (qs[:2].sum() + 1e-3, 3)):
        freq, _ = sample_frequencies(m, n_calls=10, tau=1.0, top_p=float(top_p))
        assert np.count_nonzero(freq) == k, (top_p, freq)


def test_tau0_and_top_k1_always_give_the_argmax():
    m = constant_output_dmodel()
    for s in (dict(tau=0.0), dict(tau=1.0, top_k=1), dict(tau=5.0, top_k=1), dict(tau=1.0, top_p=1e-9)):
        y = ft.DInference(40, seed=3, **s)(np.array([1, 2]), m)
        assert np.all(y == int(np.argmax(LOGITS))), s


def test_seeds_reproduce_and_differ():
    m = dmodel("float32", seed=6)
    a = ft.DInference(20, seed=11)(np.array([1, 2]), m)
    b = ft.DInference(20, seed=11)(np.array([1, 2]), m)
    c = ft.DInference(20, seed=12)(np.array([1, 2]), m)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    # seed=None: fresh randomness per call (20 tokens of a spread distribution: equal by chance ~never)
    outs = {tuple(ft.DInference(20)(np.array([1, 2]), m).tolist()) for _ in range(3)}
    assert len(outs) > 1
    # a call is a pure function of (x, θ, seed): the same inference object gives the same tokens again
    inf = ft.DInference(20, seed=11)
    assert np.array_equal(inf(np.array([1, 2]), m), a)


def test_seed_values_and_types():
    """seed: None or an integer in [0, 2^64) (the generator's seed, as the trainers accept); a float or a
    string is a TypeError and an integer beyond 64 bits a ValueError, each naming the seed."""
    m = dmodel("float32")
    for cls, args in ((ft.DInference, (3,)), (ft.EDInference, ())):
        cls(*args, seed=2**63 - 1)
        cls(*args, seed=2**63)  # a valid unsigned 64-bit seed
        cls(*args, seed=2**64 - 1)
        for bad in (1.5, "7"):
            with pytest.raises(TypeError, match="seed"):
                cls(*args, seed=bad)
        with pytest.raises(ValueError, match="seed"):
            cls(*args, seed=2**64)
    assert ft.DInference(3, seed=2**63)(np.array([1, 2]), m).shape == (3,)


def test_inference_leaves_the_model_as_it_was():
    m = dmodel("float64", seed=7)
    before = {k: np.array(v) for k, v in m.params.items()}
    x = np.array([1, 2, 3])
    P = m(x)
    ft.DInference(25, seed=0)(x, m)
    ft.DInference(25, seed=0, cache=False)(x, m)
    for k in before:
        assert np.array_equal(m.params[k], before[k]), k
    assert np.array_equal(m(x), P)


def test_l_gen_zero_and_output_type():
    m = dmodel("float32")
    y = ft.DInference(0)(np.array([1, 2]), m)
    assert y.shape == (0,) and np.issubdtype(y.dtype, np.integer)
    y = ft.DInference(3, seed=0)([1, 2], m)  # a list prompt
    assert y.shape == (3,) and np.issubdtype(y.dtype, np.integer)
    assert np.all((0 <= y) & (y < V))
    for dt in (np.int8, np.uint16, np.int32, np.int64):
        assert np.array_equal(ft.DInference(3, seed=0)(np.array([1, 2], dtype=dt), m), y)


# ------------------------------------------------------------------------------------------------------
# EDInference: bos first, eos last when generated, always terminates


def constant_output_edmodel(eos_logit, dtype="float64", l_max=10):
    """An EDTransformer whose logits are the same at every position: the last decoder layer's final
    layer_norm (γ5 = 0, β5 = e_0) makes every column e_0; W_u's first column holds the logits."""
    m = ft.EDTransformer(V, l_max, 1, 2, 2, 8, 16, dtype=dtype, seed=0)
    m.params["dec.1.gamma5"][...] = 0
    m.params["dec.1.beta5"][...] = np.eye(8)[0]
    m.params["W_u"][...] = 0
    logits = np.zeros(V)
    logits[m.eos_token] = eos_logit
    m.params["W_u"][:, 0] = logits
    return m


@pytest.mark.parametrize("cache", [True, False])
def test_edinference_stops_at_eos(cache):
    m = constant_output_edmodel(eos_logit=50.0)  # eos all but certain
    for seed in range(5):
        x = ft.EDInference(tau=1.0, seed=seed, cache=cache)(np.array([1, 2, 3]), m)
        assert x.tolist() == [m.bos_token, m.eos_token]


@pytest.mark.parametrize("cache", [True, False])
def test_edinference_terminates_at_max_len_without_eos(cache):
    m = constant_output_edmodel(eos_logit=-50.0)  # eos never
    for max_len in (None, 1, 2, 7, 10):
        x = ft.EDInference(tau=1.0, seed=1, max_len=max_len, cache=cache)(np.array([4]), m)
        assert len(x) == (max_len or m.l_max)  # default: l_max
        assert x[0] == m.bos_token and m.eos_token not in x.tolist()
        assert len(set(x[1:].tolist())) > 1 or len(x) <= 2  # sampled, not constant


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_edinference_output_shape_on_a_random_model(dtype):
    m = edmodel(dtype, seed=8)
    saw_eos = saw_cap = False
    for seed in range(30):
        for max_len in (None, 5):
            cap = max_len or m.l_max
            x = ft.EDInference(tau=1.0, seed=seed, max_len=max_len)(np.array([3, 1]), m).tolist()
            assert x[0] == m.bos_token and 2 <= len(x) <= cap
            if m.eos_token in x[1:]:
                assert x.index(m.eos_token, 1) == len(x) - 1  # eos ends it
                saw_eos = True
            else:
                assert len(x) == cap  # no eos: only the cap stops it
                saw_cap = True
    assert saw_eos and saw_cap  # both endings exercised


# ------------------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(l_gen=3, tau=-0.1), "tau"),
        (dict(l_gen=3, tau=float("nan")), "tau"),
        (dict(l_gen=3, tau=float("inf")), "tau"),
        (dict(l_gen=-1), "l_gen"),
        (dict(l_gen=3, top_k=-1), "top_k"),
        (dict(l_gen=3, top_p=0.0), "top_p"),
        (dict(l_gen=3, top_p=1.5), "top_p"),
        (dict(l_gen=3, seed=-1), "seed"),
    ],
)
def test_dinference_bad_hyperparameters_are_value_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ft.DInference(**kwargs)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(tau=-1.0), "tau"),
        (dict(max_len=0), "max_len"),
        (dict(max_len=-3), "max_len"),
        (dict(top_k=-2), "top_k"),
        (dict(top_p=-0.5), "top_p"),
    ],
)
def test_edinference_bad_hyperparameters_are_value_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ft.EDInference(**kwargs)


def test_bad_prompts_and_models():
    m = dmodel("float32", l_max=10)
    inf = ft.DInference(3, seed=0)
    with pytest.raises(ValueError, match="l_max"):
        inf(np.zeros(11, dtype=int), m)  # prompt longer than ℓ_max
    with pytest.raises(ValueError):
        inf(np.array([], dtype=int), m)  # empty prompt: line 4 has no column ℓ
    with pytest.raises(ValueError):
        inf(np.zeros((2, 3), dtype=int), m)
    with pytest.raises(IndexError):
        inf(np.array([1, V]), m)
    with pytest.raises(IndexError):
        inf(np.array([-1, 2]), m)
    with pytest.raises(TypeError):
        inf(np.array([0.5, 1.0]), m)
    with pytest.raises(TypeError, match="DTransformer"):
        inf(np.array([1, 2]), edmodel())
    ed = edmodel("float32", l_max=10)
    with pytest.raises(ValueError, match="l_max"):
        ft.EDInference(seed=0)(np.zeros(11, dtype=int), ed)
    with pytest.raises(ValueError, match="max_len"):
        ft.EDInference(seed=0, max_len=11)(np.array([1]), ed)  # max_len > ℓ_max
    with pytest.raises(ValueError):
        ft.EDInference(seed=0)(np.array([], dtype=int), ed)
    with pytest.raises(IndexError):
        ft.EDInference(seed=0)(np.array([V + 3]), ed)
    with pytest.raises(TypeError, match="EDTransformer"):
        ft.EDInference(seed=0)(np.array([1]), m)
    # and the models still work
    assert np.all(np.isfinite(m(np.array([1, 2])))) and np.all(np.isfinite(ed(np.array([1]), np.array([9]))))


def test_cached_decoding_restores_the_thread_count():
    """The cached per-token step runs on one thread (SingleThreadScope); the caller's thread count is back
    afterwards, also when the call fails midway."""
    n = ft.get_num_threads()
    ft.set_num_threads(2)
    try:
        m = ft.DTransformer(11, 16, 2, 2, 8, 16, seed=0)
        ft.DInference(10, tau=0)(np.array([1, 2, 3]), m)
        assert ft.get_num_threads() == 2
        ed = ft.EDTransformer(11, 16, 1, 1, 2, 8, 16, seed=0)
        ft.EDInference(tau=0, max_len=8)(np.array([1, 2, 3]), ed)
        assert ft.get_num_threads() == 2
        with pytest.raises(ValueError):
            ft.DInference(10, tau=-1)(np.array([1, 2, 3]), m)
        assert ft.get_num_threads() == 2
    finally:
        ft.set_num_threads(n)
