"""Hostile inputs to the names of V16 (multi-token prediction, self-speculation), V17 (BigBird) and V18 (T5 in full).

Each refused call must raise ValueError / TypeError / IndexError naming the problem, before anything changes
(θ is compared before and after). The cases that used to crash, hang or wrap (a BigBird layout whose block
count overflowed 64 bits: a segfault; ft.bigbird_layout(2**31): a hang; n_global_blocks=2**62 accepted and run)
run in a child process, so a regression fails its test instead of killing the run.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import formal_transformers as ft
from conftest import assert_grads_match_fd, child_env, randomize_theta, rel_err


def ed(**kw):
    return ft.EDTransformer(16, 12, 1, 1, 2, 8, 16, dtype="float64", **kw)


def dm(**kw):
    return ft.DTransformer(16, 12, 1, 2, 8, 16, dtype="float64", **kw)


def eb(**kw):
    return ft.ETransformer(16, 32, 1, 2, 8, 16, 8, dtype="float64", attention="bigbird", **kw)


def snapshot(m):
    return {k: v.copy() for k, v in m.params.items()}


def assert_unchanged(before, m):
    after = snapshot(m)
    assert before.keys() == after.keys()
    for k in before:
        assert np.array_equal(before[k], after[k]), k


def run_child(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env=child_env())


# ------------------------------------------------------------------------------------------------------
# V18: EDTransformer's T5 options and EDInference
T5_OPTIONS = [
    (dict(norm="bogus"), ValueError, "norm"),
    (dict(mlp="bogus"), ValueError, "mlp"),
    # the allowed names are ED's own: its standard MLP is Algorithm 8's ReLU one, "gelu" BART's (V22)
    (dict(mlp="bogus"), ValueError, "mlp must be one of 'relu', 'gelu', 'swiglu', 'geglu', got 'bogus'"),
    (dict(bos_id=16), ValueError, "bos_id = 16 is out of range"),
    (dict(eos_id=-1), ValueError, "eos_id"),
    (dict(eos_id=2**63), ValueError, "eos_id"),
    (dict(eos_id=1.5), TypeError, "eos_id must be an int"),
    (dict(bos_id=True), TypeError, "bos_id must be an int"),
    (dict(pre_norm="yes"), TypeError, "pre_norm"),
    (dict(scale_scores=None), TypeError, "scale_scores"),
    (dict(unembed_rescale=2), TypeError, "unembed_rescale"),
]


@pytest.mark.parametrize("opts,exc,match", T5_OPTIONS, ids=[str(o) for o, _, _ in T5_OPTIONS])
def test_t5_options_refused(opts, exc, match):
    with pytest.raises(exc, match=match):
        ed(**opts)


T5_MODEL = dict(pre_norm=True, norm="rms", mlp="geglu", scale_scores=False, unembed_rescale=True, bos_id=0, eos_id=1)
Z = np.array([3, 4, 5])
ED_INFERENCE = [
    (dict(max_len=0), Z, ValueError, "max_len"),
    (dict(max_len=-1), Z, ValueError, "max_len"),
    (dict(max_len=2**62), Z, ValueError, "max_len must be in"),
    (dict(max_len=13), Z, ValueError, "l_max = 12"),
    (dict(max_len=1.5), Z, TypeError, "max_len must be an int"),
    (dict(cache=False, max_len=0), Z, ValueError, "max_len"),
    (dict(tau=float("nan")), Z, ValueError, "tau"),
    (dict(tau=-1.0), Z, ValueError, "tau"),
    (dict(top_p=2.0), Z, ValueError, "top_p"),
    ({}, np.array([], dtype=np.int64), ValueError, "empty"),
    ({}, np.array([1, 16]), IndexError, "token id 16 at position 1"),
    ({}, np.array([1, -2]), IndexError, "token id -2 at position 1 is out of range \\[0, 16\\)"),
    ({}, np.array([[1, 2]]), ValueError, "1-D"),
    ({}, None, TypeError, "z"),
    ({}, np.array([1.0, 2.0]), TypeError, "integer token ids"),
    ({}, np.array([True, False]), TypeError, "integer token ids"),
    ({}, np.arange(13) % 16, ValueError, "l_max = 12"),
]


@pytest.mark.parametrize("opts,z,exc,match", ED_INFERENCE, ids=[f"{o}-{i}" for i, (o, *_ ) in enumerate(ED_INFERENCE)])
def test_ed_inference_refused(opts, z, exc, match):
    m = ed(**T5_MODEL)
    before = snapshot(m)
    with pytest.raises(exc, match=match):
        ft.EDInference(**opts)(z, m)
    assert_unchanged(before, m)


def test_ed_inference_stops_at_max_len_when_eos_never_comes():
    # greedy decoding's ids do not depend on eos_id until eos is produced: with an eos_id the 7 greedy ids do
    # not hold, decoding ends at max_len with bos first and no eos
    ends = []
    for eos in range(1, 16):
        y = ft.EDInference(0.0, max_len=7)(Z, ed(**{**T5_MODEL, "eos_id": eos}))
        assert y[0] == 0 and 1 <= len(y) <= 7
        assert eos not in y[1:-1]  # decoding stops at the first eos
        if len(y) < 7:
            assert y[-1] == eos  # stopped early: at its eos
        elif y[-1] != eos:
            ends.append(eos)  # never produced: stopped at max_len
    assert ends  # some eos_id never came


def greedy_by_logits(m, z, bos, eos, max_len):
    """Greedy Algorithm 15 written out over the model's own whole-sequence P: stop on a generated eos only."""
    x = [bos]
    while len(x) < max_len:
        x.append(int(np.argmax(m(z, np.array(x))[:, -1])))
        if x[-1] == eos:
            break
    return x


# BART starts decoding with eos (decoder_start_token_id == eos_token_id), T5 with pad = 0; an eos_id of 0 used to
# end every decoding at [bos] (line 2's y ← 0 was taken for a generated eos)
@pytest.mark.parametrize("bos,eos,seed", [(0, 0, 1), (2, 2, 1), (5, 0, 1), (0, 0, 4), (9, 9, 4), (3, 0, 4)])
@pytest.mark.parametrize("cache", [True, False])
def test_ed_inference_stops_only_on_a_generated_eos(bos, eos, seed, cache):
    m = ed(**{**T5_MODEL, "bos_id": bos, "eos_id": eos, "seed": seed})
    want = greedy_by_logits(m, Z, bos, eos, 12)
    got = ft.EDInference(0.0, cache=cache)(Z, m)
    assert got.tolist() == want and len(want) > 1
    ref = ft.reference.ed_inference(Z, m, tau=0.0, bos_token=bos, eos_token=eos, max_len=12)
    assert ref.tolist() == want


def test_ed_inference_with_bos_eos_ends_on_its_eos():
    # seed 4's greedy decoding produces its eos (0) before max_len: it stops there (seed 1's runs to max_len)
    m = ed(**{**T5_MODEL, "bos_id": 0, "eos_id": 0, "seed": 4})
    y = ft.EDInference(0.0)(Z, m)
    assert y[0] == 0 and y[-1] == 0 and 2 <= len(y) < 12 and 0 not in y[1:-1]


def test_ed_swiglu_is_the_listing_with_v4s_mlp():
    """EDTransformer(mlp="swiglu") (docs/api.md: D and ED take it) in T5's layers: P against reference.t5_transformer
    (float64 ≤ 1e-12), every gradient against finite differences."""
    m = ed(**{**T5_MODEL, "mlp": "swiglu", "positional": "relative", "bias": False, "relative_buckets": 6,
              "relative_max_distance": 9, "seed": 2})
    theta = randomize_theta(m, np.random.default_rng(3), unit=("W_e", "rel_bias"))
    x = np.array([0, 7, 2, 9])
    P = ft.reference.t5_transformer(Z, x, theta, L_enc=1, L_dec=1, H=2, eps=m.config["eps"], mlp="swiglu",
                                    relative_max_distance=9, unembed_rescale=True)
    assert rel_err(m(Z, x), P) <= 1e-12
    _, grads = m.loss_and_grad(Z, x)
    assert_grads_match_fd(m, grads, lambda: m.loss(Z, x), b_k_zero=False)


ED_CALLS = [
    ("loss_and_grad", np.array([1, 2]), np.array([1, 17]), IndexError, "token id 17 at position 1"),
    ("loss_and_grad", np.array([1, 2]), np.array([1, -1]), IndexError, "token id -1 at position 1 is out of range \\[0, 16\\)"),
    ("loss_and_grad", np.array([1, 2]), np.array([2**40, 2]), IndexError, "token id 1099511627776"),
    ("loss", np.array([], dtype=np.int64), np.array([1, 2]), ValueError, "z is an empty sequence"),
    ("__call__", np.array([1, 2]), np.array([], dtype=np.int64), ValueError, "x is an empty sequence"),
    ("__call__", np.array([1, 2]), np.array([True, False]), TypeError, "integer token ids"),
    ("__call__", np.zeros((1, 1, 2), dtype=np.int64), np.array([1, 2]), ValueError, "shape \\(1, 1, 2\\)"),
    ("__call__", np.array([1, 2]), np.arange(13) % 16, ValueError, "l_max = 12"),
    ("__call__", np.array([1, 2], dtype=np.float32), np.array([1, 2]), TypeError, "float32"),
    ("loss_and_grad", None, np.array([1, 2]), TypeError, "z"),
]


@pytest.mark.parametrize("call,z,x,exc,match", ED_CALLS, ids=[f"{c[0]}-{i}" for i, c in enumerate(ED_CALLS)])
def test_ed_calls_refused(call, z, x, exc, match):
    m = ed(**T5_MODEL)
    before = snapshot(m)
    with pytest.raises(exc, match=match):
        getattr(m, call)(z, x)
    assert_unchanged(before, m)


def test_ed_accepts_views_and_any_integer_dtype():
    m = ed(**T5_MODEL)
    z, x = np.array([5, 4, 3, 2]), np.array([[1, 2], [3, 4]])
    want = m(z[::-1].copy(), np.ascontiguousarray(x.T[0]))
    assert np.array_equal(m(z[::-1], x.T[0]), want)  # non-contiguous views read as their values
    assert np.array_equal(m(z[::-1].astype(np.uint8), x.T[0].astype(np.int16)), want)
    assert np.array_equal(m(list(z[::-1]), [1, 3]), want)


# ------------------------------------------------------------------------------------------------------
# V16: multi-token prediction and self-speculation
MTP_OPTIONS = [
    (dict(mtp_depth=-1), ValueError, "mtp_depth must be >= 0"),
    (dict(mtp_depth=2**62), ValueError, "mtp_depth = 4611686018427387904 has no room in l_max = 12"),
    (dict(mtp_depth=11), ValueError, "l_max >= 13"),
    (dict(mtp_depth=1.0), TypeError, "mtp_depth must be an int"),
    (dict(mtp_depth=True), TypeError, "mtp_depth must be an int"),
    (dict(mtp_depth=1, mtp_weight=-0.1), ValueError, "mtp_weight"),
    (dict(mtp_depth=1, mtp_weight=float("nan")), ValueError, "mtp_weight"),
    (dict(mtp_depth=1, mtp_weight=float("inf")), ValueError, "mtp_weight"),
    (dict(mtp_depth=1, mtp_weight="a"), TypeError, "mtp_weight"),
    (dict(mtp_depth=1, mask="prefix"), ValueError, "mask='prefix'"),
    (dict(mtp_depth=1, attention="performer"), ValueError, "attention='softmax'"),
]


@pytest.mark.parametrize("opts,exc,match", MTP_OPTIONS, ids=[str(o) for o, _, _ in MTP_OPTIONS])
def test_mtp_options_refused(opts, exc, match):
    with pytest.raises(exc, match=match):
        dm(**opts)


def test_decoder_mlp_relu_is_not_its_gelu():
    # it once was accepted and silently built GPT-2's GELU MLP; now it is V21's ReLU MLP (OPT)
    relu, gelu = dm(mlp="relu"), dm(mlp="gelu")
    for k, v in gelu.params.items():
        relu.params[k] = v
    x = np.array([1, 2, 3, 4])
    assert relu.config["mlp"] == "relu" and not np.allclose(relu(x), gelu(x))
    assert dm(mlp="gelu").config["mlp"] == "gelu" and ed(mlp="relu").config["mlp"] == "relu"


MTP_CALLS = [
    ("loss_and_grad", np.array([1, 2, 3]), ValueError, "at least D \\+ 2 = 4 tokens.*x has 3"),
    ("loss", [np.array([1, 2, 3, 4]), np.array([1, 2, 3])], ValueError, "x\\[1\\] has 3"),
    ("loss_and_grad", np.arange(20).reshape(4, 5)[:, ::2] % 16, ValueError, "x\\[0\\] has 3"),
    ("loss_and_grad", np.array([1, 2, 3, 4, 17]), IndexError, "token id 17 at position 4"),
    ("loss_and_grad", np.array([1, 2, 3, 4, -1]), IndexError, "token id -1 at position 4 is out of range \\[0, 16\\)"),
    ("loss", np.array([[1, 2, 3, 4], [1, 2, -3, 4]]), IndexError, "x\\[1\\]: token id -3 at position 2 is out of range \\[0, 16\\)"),
    ("loss_and_grad", np.array([1.0, 2, 3, 4]), TypeError, "integer token ids"),
    ("loss_and_grad", np.zeros((1, 1, 4), dtype=int), ValueError, "shape \\(1, 1, 4\\)"),
    ("loss_and_grad", None, TypeError, "x must be an array"),
    ("loss_and_grad", np.array([], dtype=np.int64), ValueError, "empty"),
    ("loss_and_grad", np.zeros((0, 5), dtype=np.int64), ValueError, "empty batch"),
    ("loss_and_grad", np.zeros((2, 0), dtype=np.int64), ValueError, "empty sequence"),
    ("loss_and_grad", [], ValueError, "empty"),
    ("loss_and_grad", np.arange(13) % 16, ValueError, "l_max = 12"),
    ("logits", np.array([1, 2, 2**40]), IndexError, "token id 1099511627776 at position 2"),
]


@pytest.mark.parametrize("call,x,exc,match", MTP_CALLS, ids=[f"{c[0]}-{i}" for i, c in enumerate(MTP_CALLS)])
def test_mtp_calls_refused_and_keep_loss_terms(call, x, exc, match):
    m = dm(mtp_depth=2)
    m.loss(np.array([1, 2, 3, 4]))
    terms = m.loss_terms()
    before = snapshot(m)
    with pytest.raises(exc, match=match):
        getattr(m, call)(x)
    assert_unchanged(before, m)
    assert m.loss_terms() == terms  # a refused call leaves the last loss's terms


def test_loss_terms_before_any_loss_and_after_a_forward():
    m = dm(mtp_depth=2)
    assert m.loss_terms() == []
    m.loss(np.array([1, 2, 3, 4]))
    terms = m.loss_terms()
    assert len(terms) == 3
    m(np.array([1, 2]))
    m.logits(np.array([1, 2]))
    assert m.loss_terms() == terms  # model(x) and logits use the trunk only: no loss, the terms stay


X = np.array([1, 2])
SPECULATIVE = [
    (dict(l_gen=3, k=0), X, {}, ValueError, "k \\(tokens drafted per target pass\\) must be a positive integer \\(below "
                                          "2\\^63\\), got 0"),
    (dict(l_gen=3, k=2**63), X, {}, ValueError, "k .* must be a positive integer \\(below 2\\^63\\), got 9223372036854775808"),
    (dict(l_gen=3, k=True), X, {}, TypeError, "k .* must be an int, got bool"),
    (dict(l_gen=3, k=-1), X, {}, ValueError, "k .* must be a positive integer"),
    (dict(l_gen=3, k=3), X, {}, ValueError, "k = 3 must be <= mtp_depth = 2"),
    (dict(l_gen=3, k=2**62), X, {}, ValueError, "mtp_depth = 2"),
    (dict(l_gen=3, k=2, tau=-0.5), X, {}, ValueError, "tau"),
    (dict(l_gen=3, k=2, tau=float("nan")), X, {}, ValueError, "tau"),
    (dict(l_gen=3, k=2, tau=float("inf")), X, {}, ValueError, "tau"),
    (dict(l_gen=-1, k=2), X, {}, ValueError, "l_gen must be >= 0"),
    (dict(l_gen=2**62, k=2), X, {}, ValueError, "l_gen"),
    (dict(l_gen=12, k=2), X, {}, ValueError, "l_max = 12"),
    (dict(l_gen=1, k=2), np.arange(13) % 16, {}, ValueError, "l_max = 12"),
    (dict(l_gen=3, k=2), np.array([], dtype=np.int64), {}, ValueError, "empty"),
    (dict(l_gen=3, k=2), np.array([1, 16]), {}, IndexError, "token id 16 at position 1"),
    (dict(l_gen=3, k=2), np.array([1, -2]), {}, IndexError, "token id -2 at position 1"),
    (dict(l_gen=3, k=2), np.array([[1, 2]]), {}, ValueError, "1-D"),
    (dict(l_gen=3, k=2), None, {}, TypeError, "x"),
    (dict(l_gen=3, k=2), np.array([1.0, 2.0]), {}, TypeError, "integer token ids"),
    (dict(l_gen=3, k=2, seed=-1), X, {}, ValueError, "seed"),
    (dict(l_gen=3, k=2), X, dict(mtp_depth=0), ValueError, "mtp_depth = 0"),
    (dict(l_gen=3, k=1), X, dict(sliding_window=4), ValueError, "sliding_window"),
]


@pytest.mark.parametrize("opts,x,model,exc,match", SPECULATIVE, ids=[f"{o}-{i}" for i, (o, *_ ) in enumerate(SPECULATIVE)])
def test_self_speculation_refused(opts, x, model, exc, match):
    m = dm(**{"mtp_depth": 2, **model})
    before = snapshot(m)
    with pytest.raises(exc, match=match):
        ft.SpeculativeInference(**opts)(x, m)
    assert_unchanged(before, m)


@pytest.mark.parametrize("target", [None, "ed"])
def test_self_speculation_needs_a_dtransformer(target):
    with pytest.raises(TypeError, match="needs a DTransformer as target"):
        ft.SpeculativeInference(3, k=2)(X, ed() if target else None)


def test_self_speculation_edge_lengths():
    m = dm(mtp_depth=2)
    assert len(ft.SpeculativeInference(0, k=2, seed=1)(X, m)) == 0
    assert len(ft.SpeculativeInference(11, k=2, seed=1)(X, m)) == 11  # len(x) + l_gen − 1 = l_max
    greedy = ft.DInference(3, 0.0)(X, m)
    assert np.array_equal(ft.SpeculativeInference(3, k=2, tau=0.0)(np.array([2, 1])[::-1], m), greedy)


# ------------------------------------------------------------------------------------------------------
# V17: BigBird
BIGBIRD_OPTIONS = [
    ({}, "needs block_size"),
    (dict(block_size=0), "block_size must be a positive integer"),
    (dict(block_size=-4), "block_size must be a positive integer"),
    (dict(block_size=4, window_blocks=0), "window_blocks = 0 must be odd"),
    (dict(block_size=4, window_blocks=2), "window_blocks = 2 must be odd"),
    (dict(block_size=4, window_blocks=-1), "window_blocks must be >= 0"),
    (dict(block_size=4, n_global_blocks=-1), "n_global_blocks must be >= 0"),
    (dict(block_size=4, n_random_blocks=-1), "n_random_blocks must be >= 0"),
    (dict(block_size=4, layout_seed=-1), "layout_seed"),
    # no sequence of at most l_max = 32 tokens has enough blocks: refused at construction
    (dict(block_size=33), "\\(2·1 \\+ 3 \\+ 3\\)·33 tokens, is longer than l_max = 32"),
    (dict(block_size=16), "\\(2·1 \\+ 3 \\+ 3\\)·16 tokens, is longer than l_max = 32"),
    (dict(block_size=4, n_global_blocks=3), "\\(2·3 \\+ 3 \\+ 3\\)·4 tokens, is longer than l_max = 32"),
    # 64-bit wrap of (2g + w + r)·b: used to be accepted (n_global_blocks=2**62 ran as a negative count)
    (dict(block_size=2**62), "longer than l_max"),
    (dict(block_size=4, window_blocks=2**62 + 1), "longer than l_max"),
    (dict(block_size=4, n_global_blocks=2**62), "longer than l_max"),
    (dict(block_size=4, n_random_blocks=2**62), "longer than l_max"),
    (dict(block_size=4, n_global_blocks=2**62 - 1, window_blocks=1, n_random_blocks=1), "longer than l_max"),
]


@pytest.mark.parametrize("opts,match", BIGBIRD_OPTIONS, ids=[str(o) for o, _ in BIGBIRD_OPTIONS])
def test_bigbird_options_refused(opts, match):
    with pytest.raises(ValueError, match=match):
        eb(**opts)


@pytest.mark.parametrize("opts,exc", [(dict(block_size=4.0), TypeError), (dict(block_size=4, layout_seed=1.5), TypeError),
                                      (dict(block_size=4, layout_seed=2**64), ValueError)])
def test_bigbird_option_types(opts, exc):
    with pytest.raises(exc, match="block_size|layout_seed"):
        eb(**opts)


BIGBIRD_CALLS = [
    (np.arange(30) % 16, "block_size = 4 does not divide the sequence length 30"),
    (np.arange(12) % 16, "3 blocks of 4 tokens are too few"),
    (np.arange(28) % 16, "7 blocks of 4 tokens are too few"),
    (np.arange(64).reshape(2, 32)[:, ::2] % 16, "4 blocks of 4 tokens are too few"),
    ([np.arange(32) % 16, np.arange(30) % 16], "does not divide the sequence length 30"),
    (np.arange(36) % 16, "l_max = 32"),
]


@pytest.mark.parametrize("impl", ["auto", "literal", "tiled"])
@pytest.mark.parametrize("x,match", BIGBIRD_CALLS, ids=[str(i) for i in range(len(BIGBIRD_CALLS))])
def test_bigbird_lengths_refused(impl, x, match):
    m = eb(block_size=4, attention_impl=impl)
    before = snapshot(m)
    with pytest.raises(ValueError, match=match):
        m(x)
    assert_unchanged(before, m)


def test_bigbird_accepts_views():
    m = eb(block_size=4)
    x = np.arange(64).reshape(32, 2).T % 16  # a transposed (2, 32) view
    assert np.array_equal(m(x), m(np.ascontiguousarray(x)))
    y = np.arange(64)[::-2] % 16
    assert np.array_equal(m(y), m(y.copy()))


LAYOUT_CALLS = [
    ("ft.bigbird_layout(0)", "n_blocks must be a positive integer"),
    ("ft.bigbird_layout(3)", "too few"),
    ("ft.bigbird_layout(4, n_random_blocks=100)", "too few"),
    ("ft.bigbird_layout(9, 4, 1, 1)", "window_blocks"),
    # these crashed: a segfault (2g + w + r wrapped), a hang (an O(n²) scan of 2**62 entries), std::bad_alloc
    ("ft.bigbird_layout(8, n_random_blocks=2**63 - 4)", "does not fit a 64-bit count"),
    ("ft.bigbird_layout(8, n_global_blocks=2**62)", "does not fit a 64-bit count"),
    ("ft.bigbird_layout(2**31)", "exceeds this machine's memory"),
    ("ft.bigbird_layout(2**40)", "overflows a 64-bit count"),
    # n·block_size wrapped to 0 in the message
    ("ft.block_sparse_attention(*[__import__('numpy').zeros((4, 32))] * 3, ft.bigbird_layout(8), 2**62)",
     "8 * 4611686018427387904 elements overflows a 64-bit count"),
]


@pytest.mark.parametrize("call,match", LAYOUT_CALLS, ids=[c for c, _ in LAYOUT_CALLS])
def test_bigbird_layout_refused_in_a_child(call, match):
    p = run_child(f"""
        import formal_transformers as ft
        try:
            {call}
        except ValueError as e:
            print("ValueError:", e)
    """, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "ValueError:" in p.stdout and match in p.stdout, p.stdout
