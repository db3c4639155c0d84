"""Algorithms 11–13 (EDTraining, ETraining, DTraining) and the trainers' options.

Each listing drives its loss down on a small learnable task; SGD with batch_size 1 is the listing's update
θ ← θ − η∇loss by hand; every option (batch_size, reduction, shuffle, seed, schedule, clip, max_steps,
eval_every + val_data, callback, progress, weight_decay, optimizer objects) is checked against a hand
computation that would fail if the option were ignored; bad input raises; Ctrl-C leaves a usable model.
"""
from __future__ import annotations

import math
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref

from conftest import child_env, rel_err
from test_inference import MT19937_64

# ------------------------------------------------------------------------------------------------------
# helpers

N_V = 8  # tokens 0..4 are data, 5 = mask, 6 = bos, 7 = eos


def dmodel(seed=0, dtype="float64", **kw):
    return ft.DTransformer(N_V, 12, 1, 2, 8, 16, dtype=dtype, seed=seed, **kw)


def emodel(seed=0, dtype="float64", **kw):
    return ft.ETransformer(N_V, 12, 1, 2, 8, 16, 6, dtype=dtype, seed=seed, **kw)


def edmodel(seed=0, dtype="float64", **kw):
    return ft.EDTransformer(N_V, 12, 1, 1, 2, 8, 16, dtype=dtype, seed=seed, **kw)


def ragged(seed, n, lo=2, hi=9):
    """n sequences of data tokens 0..4 with lengths in [lo, hi]."""
    r = np.random.default_rng(seed)
    return [r.integers(0, 5, int(r.integers(lo, hi + 1))) for _ in range(n)]


def snapshot(model):
    return {k: np.array(v, dtype=np.float64) for k, v in model.params.items()}


def assert_identical(a, b):
    """Bit-for-bit equal parameter dicts (models or snapshots)."""
    a = a.params if hasattr(a, "params") else a
    b = b.params if hasattr(b, "params") else b
    assert list(a.keys()) == list(b.keys())
    for k in a.keys():
        assert np.array_equal(np.asarray(a[k]), np.asarray(b[k])), k


def assert_close(a, b, tol=1e-12):
    """Every parameter within tol of b, relative to θ's largest entry (b_k's gradient is exactly zero in
    exact arithmetic — softmax is shift invariant — so b_k only carries rounding noise of order 1e-20)."""
    a = a.params if hasattr(a, "params") else a
    b = b.params if hasattr(b, "params") else b
    assert list(a.keys()) == list(b.keys())
    scale = max(float(np.max(np.abs(b[k]))) for k in b.keys())
    for k in a.keys():
        err = float(np.max(np.abs(np.asarray(a[k], dtype=np.float64) - np.asarray(b[k], dtype=np.float64))))
        assert err <= tol * scale, (k, err, scale)


def max_param_diff(a, b):
    a = a.params if hasattr(a, "params") else a
    b = b.params if hasattr(b, "params") else b
    f64 = lambda v: np.asarray(v, dtype=np.float64)  # noqa: E731
    return max(float(np.max(np.abs(f64(a[k]) - f64(b[k])))) for k in a.keys())


def sgd_by_hand(model, grads, lr, scale):
    """θ ← θ − lr · scale · ∇ (the listing's line 6 on the step's objective), on every parameter."""
    for k, g in grads.items():
        model.params[k][...] = model.params[k] - lr * (scale * g)


def d_scored(batch):
    return sum(len(x) - 1 for x in batch)


def quiet(**kw):
    kw.setdefault("progress", False)
    return kw


# a single-threaded core (conftest.one_thread): float32 sums then do not depend on the machine's thread count;
# tests that exercise threads set their own count
pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------------------------------
# each listing learns a small task


def test_dtraining_learns_a_repeating_sequence_to_near_zero_loss():
    m = ft.DTransformer(N_V, 16, 1, 2, 16, 32, seed=1)  # float32, the default
    data = [(np.arange(16) + p) % 5 for p in range(5)]  # 0 1 2 3 4 0 1 … at every phase
    before = m.loss(data, reduction="mean")
    assert before > 1.5  # ≈ log 8 at initialisation
    tr = ft.DTraining(60, 1e-2, **quiet(seed=0))
    assert tr(data, m) is m  # trains in place and returns the model
    after = m.loss(data, reduction="mean")
    assert after < 0.01, (before, after)
    assert tr.history["loss"][-1] < 0.01 and len(tr.history["loss"]) == 60 * 5
    P = m(np.stack(data))  # (N, N_V, ℓ): every next token is the argmax
    assert np.array_equal(P.argmax(axis=1)[:, :-1], np.stack(data)[:, 1:])


def test_etraining_recovers_masked_tokens_of_a_structured_corpus():
    K, l = 8, 10  # counting sequences mod K: a masked token is its neighbour ± 1
    m = ft.ETransformer(K + 3, l, 2, 2, 32, 64, 32, seed=0)
    data = [(a + np.arange(l)) % K for a in range(K)]
    tr = ft.ETraining(1500, 1e-3, p_mask=0.2, **quiet(batch_size=4, seed=0))
    tr(data, m)
    first, last = np.mean(tr.history["loss"][:20]), np.mean(tr.history["loss"][-20:])
    assert first > 1.5 and last < 0.1, (first, last)
    correct = total = 0
    for s in range(20):  # fresh masks, not those of training
        for x in data:
            xt = ft._core._mask_tokens(x, m.mask_token, 0.2, 1000 + s)
            pos = xt == m.mask_token
            if pos.any():
                correct += int((m(xt).argmax(axis=0)[pos] == x[pos]).sum())
                total += int(pos.sum())
    assert total > 200 and correct / total >= 0.95, (correct, total)


def reversal_pair(z, n_vocab):
    return np.concatenate([[n_vocab - 2], z[::-1], [n_vocab - 1]])  # [bos, reversed z, eos]


def test_edtraining_learns_reversal_and_edinference_outputs_it():
    import itertools

    V = 9  # data 0..5, mask 6, bos 7, eos 8
    allz = np.array(list(itertools.product(range(6), repeat=4)))
    np.random.default_rng(0).shuffle(allz)
    train, test = allz[:900], allz[900:]
    m = ft.EDTransformer(V, 8, 1, 1, 2, 32, 64, seed=0)
    tr = ft.EDTraining(10, 3e-3, **quiet(batch_size=16, seed=0, schedule="cosine", warmup=20))
    tr(list(train), [reversal_pair(z, V) for z in train], m)
    assert np.mean(tr.history["loss"][:5]) > 1.5 and tr.history["loss"][-1] < 0.05
    infer = ft.EDInference(tau=0)
    wrong = [z for z in test if not np.array_equal(infer(z, m), reversal_pair(z, V))]
    assert not wrong, f"{len(wrong)} of {len(test)} held-out sequences not reversed, e.g. {wrong[:3]}"


# ------------------------------------------------------------------------------------------------------
# the listing's update, and the minibatch / reduction options


def test_sgd_option_is_the_listings_update():
    """optimizer='sgd', batch_size=1, shuffle=False: line 6, θ ← θ − η∇loss(θ), sequence after sequence,
    epoch after epoch (compared with a hand loop over model.loss_and_grad)."""
    data = ragged(1, 4)
    m, hand = dmodel(), dmodel()
    tr = ft.DTraining(2, 0.2, **quiet(optimizer="sgd", shuffle=False))
    tr(data, m)
    for _ in range(2):
        for x in data:
            _, g = hand.loss_and_grad(x)
            sgd_by_hand(hand, g, 0.2, 1.0)
    assert_close(m, hand, 1e-12)
    assert max_param_diff(m, dmodel()) > 1e-3  # and it did move
    assert tr.history["step"] == list(range(1, 9))
    assert tr.history["lr"] == [0.2] * 8
    assert tr.history["tokens"] == [len(x) - 1 for x in data] * 2
    # the reported loss is the listing's loss per predicted token, before the update
    fresh = dmodel()
    assert tr.history["loss"][0] == pytest.approx(fresh.loss(data[0]) / (len(data[0]) - 1), rel=1e-12)


def test_sgd_object_equals_the_sgd_string():
    data = ragged(2, 5)
    a, b = dmodel(), dmodel()
    ft.DTraining(1, 0.1, **quiet(optimizer="sgd", shuffle=False))(data, a)
    ft.DTraining(1, 0.1, **quiet(optimizer=ft.SGD(0.1), shuffle=False))(data, b)
    assert_identical(a, b)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_batch_update_is_the_mean_of_per_sequence_gradients(reduction):
    """batch_size B: one SGD step uses the mean over the B sequences of the listing's per-sequence loss
    ('sum') or the mean per predicted token ('mean'); the last, short batch is averaged over its own size.
    The hand update averages gradients computed one sequence at a time."""
    data = ragged(3, 5, lo=2, hi=9)  # lengths differ, so 'sum' and 'mean' differ
    m, hand = dmodel(), dmodel()
    tr = ft.DTraining(1, 0.3, **quiet(optimizer="sgd", batch_size=3, shuffle=False, reduction=reduction))
    tr(data, m)
    assert tr.history["step"] == [1, 2]
    for batch in (data[:3], data[3:]):
        per_seq = [hand.loss_and_grad(x)[1] for x in batch]
        total = {k: sum(g[k] for g in per_seq) for k in per_seq[0]}
        scale = 1.0 / len(batch) if reduction == "sum" else 1.0 / d_scored(batch)
        sgd_by_hand(hand, total, 0.3, scale)
    assert_close(m, hand, 1e-12)
    # the other reduction gives another result (the option is not ignored)
    other = dmodel()
    ft.DTraining(1, 0.3, **quiet(optimizer="sgd", batch_size=3, shuffle=False,
                                 reduction="mean" if reduction == "sum" else "sum"))(data, other)
    assert max_param_diff(m, other) > 1e-4
    # history: tokens per step, loss per predicted token (either reduction)
    assert tr.history["tokens"] == [d_scored(data[:3]), d_scored(data[3:])]
    assert tr.history["loss"][0] == pytest.approx(dmodel().loss(data[:3]) / d_scored(data[:3]), rel=1e-12)


def test_batch_size_one_differs_from_a_batch():
    data = ragged(4, 4)
    a, b = dmodel(), dmodel()
    ft.DTraining(1, 0.3, **quiet(optimizer="sgd", batch_size=1, shuffle=False))(data, a)
    ft.DTraining(1, 0.3, **quiet(optimizer="sgd", batch_size=4, shuffle=False))(data, b)
    assert max_param_diff(a, b) > 1e-4


def test_etraining_step_is_the_listing_with_the_documented_masks():
    """Algorithm 12 with SGD, B = 2, shuffle=False: the masks are those of lines 4–6 drawn from the seeded
    generator (ft._core._mask_tokens over the minibatch), only masked positions are scored (line 9)."""
    data = [np.array([0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1]), np.array([4, 3, 2, 1, 0, 4, 3, 2, 1, 0])]
    m, hand = emodel(), emodel()
    seed, p = 7, 0.4
    tr = ft.ETraining(1, 0.5, p_mask=p, **quiet(optimizer="sgd", batch_size=2, shuffle=False, seed=seed))
    tr(data, m)
    xt = ft._core._mask_tokens(np.concatenate(data), hand.mask_token, p, seed)
    x_tilde = [xt[:12], xt[12:]]
    n_masked = int((xt == hand.mask_token).sum())
    assert 0 < n_masked < 22
    assert tr.history["tokens"] == [n_masked]
    loss, g = hand.loss_and_grad(x_tilde, data)
    assert tr.history["loss"][0] == pytest.approx(loss / n_masked, rel=1e-12)
    sgd_by_hand(hand, g, 0.5, 0.5)
    assert_close(m, hand, 1e-12)


def test_edtraining_step_is_the_listing():
    z = ragged(5, 3)
    x = [np.concatenate([[N_V - 2], s, [N_V - 1]]) for s in ragged(6, 3, hi=7)]
    m, hand = edmodel(), edmodel()
    tr = ft.EDTraining(1, 0.4, **quiet(optimizer="sgd", batch_size=2, shuffle=False, reduction="mean"))
    tr(z, x, m)
    for bz, bx in ((z[:2], x[:2]), (z[2:], x[2:])):
        _, g = hand.loss_and_grad(bz, bx)
        sgd_by_hand(hand, g, 0.4, 1.0 / d_scored(bx))
    assert_close(m, hand, 1e-12)


# ------------------------------------------------------------------------------------------------------
# vs reference.py's listings (line 6 = SGD, batch_size 1, no shuffling): the same θ̂ and the same losses.
# The gradients come from a float64 model's loss_and_grad; each step's loss is also checked against the
# numpy forward of reference.py.


def probe_loss_and_grad(probe, ref_loss):
    def f(*args):
        *data, theta = args
        probe.params.update(theta)
        loss, g = probe.loss_and_grad(*data)
        assert loss == pytest.approx(ref_loss(*data, theta), rel=1e-10)
        return loss, g
    return f


def test_dtraining_equals_reference_d_training():
    data = ragged(40, 4)
    m, probe = dmodel(), dmodel()
    theta0 = snapshot(m)
    tr = ft.DTraining(2, 0.2, **quiet(optimizer="sgd", shuffle=False))
    tr(data, m)
    losses = []
    want = ref.d_training(data, theta0, probe_loss_and_grad(probe, lambda x, th: ref.d_loss(x, th, L=1, H=2)),
                          n_epochs=2, eta=0.2, losses=losses)
    assert_close(m, want, 1e-12)
    got_losses = [l * n for l, n in zip(tr.history["loss"], tr.history["tokens"])]  # per token → the sum
    assert got_losses == pytest.approx(losses, rel=1e-12)


def test_etraining_equals_reference_e_training_with_the_same_random_stream():
    """Algorithm 12: the masks of lines 4–6 are drawn from the core's seeded generator, one uniform number
    per token, token t masked when its number is < p_mask — reference.mask_sequence with the same stream."""
    data = ragged(41, 5, lo=4, hi=10)
    m, probe = emodel(), emodel()
    theta0 = snapshot(m)
    tr = ft.ETraining(2, 0.3, p_mask=0.35, **quiet(optimizer="sgd", shuffle=False, seed=17))
    tr(data, m)
    losses = []
    lg = probe_loss_and_grad(probe, lambda xt, x, th: ref.e_loss(xt, x, th, probe.mask_token, L=1, H=2))
    want = ref.e_training(data, theta0, lg, n_epochs=2, eta=0.3, p_mask=0.35, mask_token=probe.mask_token,
                          rng=MT19937_64(17), losses=losses)
    assert_close(m, want, 1e-12)
    got_losses = [l * n for l, n in zip(tr.history["loss"], tr.history["tokens"])]
    assert got_losses == pytest.approx(losses, rel=1e-12, abs=1e-15)
    assert sum(tr.history["tokens"]) > 0


def test_etraining_drawn_masks_are_the_runs_masks():
    """ETraining.drawn_masks gives the x̃ of every step (lines 4–6): per step, their masked-token counts are
    the run's |T̃| (history["tokens"]), the loss of step 1 at θ0 on them is the run's first loss, they are
    reference.mask_sequence on the standard MT19937-64 stream, and replaying them through
    reference.e_training gives the run's θ (SGD)."""
    data = ragged(44, 7, lo=4, hi=9)
    m, probe = emodel(), emodel()
    theta0 = snapshot(m)
    tr = ft.ETraining(2, 0.3, p_mask=0.3, **quiet(optimizer="sgd", batch_size=1, shuffle=False, seed=5))
    drawn = tr.drawn_masks(data, m)
    assert len(drawn) == 14 and all(len(b) == 1 for b in drawn)
    tr(data, m)
    mt = m.mask_token
    assert [int(sum((xt == mt).sum() for xt in b)) for b in drawn] == tr.history["tokens"]
    probe.params.update(theta0)
    assert probe.loss(drawn[0][0], data[0]) / tr.history["tokens"][0] == pytest.approx(tr.history["loss"][0], rel=1e-12)
    rng = MT19937_64(5)
    for k, b in enumerate(drawn):
        assert np.array_equal(b[0], ref.mask_sequence(data[k % len(data)], p_mask=0.3, mask_token=mt, rng=rng)), k

    class Replay:  # an rng that says "mask" (0.0) exactly where drawn_masks masked
        def __init__(self):
            self.u = [0.0 if v == mt else 1.0 for b in drawn for xt in b for v in xt]

        def random(self):
            return self.u.pop(0)

    lg = probe_loss_and_grad(probe, lambda xt, x, th: ref.e_loss(xt, x, th, mt, L=1, H=2))
    want = ref.e_training(data, theta0, lg, n_epochs=2, eta=0.3, p_mask=0.3, mask_token=mt, rng=Replay())
    assert_close(m, want, 1e-12)
    # minibatches and max_steps: the sequences of each step in order, the run's counts
    m2 = emodel()
    tr2 = ft.ETraining(3, 0.1, p_mask=0.4, **quiet(batch_size=3, shuffle=False, seed=9, max_steps=7))
    drawn2 = tr2.drawn_masks(data, m2)
    assert [len(b) for b in drawn2] == [3, 3, 1, 3, 3, 1, 3]
    tr2(data, m2)
    assert [int(sum((xt == mt).sum() for xt in b)) for b in drawn2] == tr2.history["tokens"]
    # shuffled, and a run counted in steps (n_epochs=0, max_steps): the plan's order and masks are the run's
    m3 = emodel()
    tr3 = ft.ETraining(0, 0.1, p_mask=0.4, **quiet(batch_size=2, shuffle=True, seed=3, max_steps=9))
    plan = tr3.plan(data, m3)
    assert len(plan) == 9 and [p["epoch"] for p in plan] == [0] * 4 + [1] * 4 + [2]
    assert all(sorted(np.concatenate([p["sequences"] for p in plan[4 * e:4 * e + 4]])) == list(range(7)) for e in (0, 1))
    for p in plan:
        assert [len(xt) for xt in p["masked"]] == [len(data[n]) for n in p["sequences"]]
        for xt, n in zip(p["masked"], p["sequences"]):
            assert np.array_equal(xt[xt != mt], np.asarray(data[n])[xt != mt])
    drawn3 = tr3.drawn_masks(data, m3)
    assert len(drawn3) == 9 and all(all(np.array_equal(a, b) for a, b in zip(x, p["masked"])) for x, p in zip(drawn3, plan))
    tr3(data, m3)
    assert [int(sum((xt == mt).sum() for xt in p["masked"])) for p in plan] == tr3.history["tokens"]


def test_edtraining_equals_reference_ed_training():
    z = ragged(42, 4)
    x = [np.concatenate([[N_V - 2], s, [N_V - 1]]) for s in ragged(43, 4, hi=6)]
    m, probe = edmodel(), edmodel()
    theta0 = snapshot(m)
    tr = ft.EDTraining(2, 0.2, **quiet(optimizer="sgd", shuffle=False))
    tr(z, x, m)
    losses = []
    lg = probe_loss_and_grad(probe, lambda zz, xx, th: ref.ed_loss(zz, xx, th, L_enc=1, L_dec=1, H=2))
    want = ref.ed_training(z, x, theta0, lg, n_epochs=2, eta=0.2, losses=losses)
    assert_close(m, want, 1e-12)
    assert [l * n for l, n in zip(tr.history["loss"], tr.history["tokens"])] == pytest.approx(losses, rel=1e-12)


# ------------------------------------------------------------------------------------------------------
# shuffle and seed


def visit_order(history, lengths):
    """Which sequence each step visited, recovered from its scored-token count (distinct lengths)."""
    by_tokens = {l - 1: i for i, l in enumerate(lengths)}
    return [by_tokens[t] for t in history["tokens"]]


def test_shuffle_visits_each_sequence_once_per_epoch_in_a_fresh_order():
    lengths = [2, 3, 4, 5, 6, 7, 8, 9]
    data = [np.arange(l) % 5 for l in lengths]
    n_epochs = 4

    def orders(**kw):
        tr = ft.DTraining(n_epochs, 0.0, **quiet(optimizer="sgd", **kw))
        tr(data, dmodel())
        o = visit_order(tr.history, lengths)
        return [o[e * 8:(e + 1) * 8] for e in range(n_epochs)]

    plain = orders(shuffle=False)
    assert plain == [list(range(8))] * n_epochs  # the listing's order
    a, b, c = orders(shuffle=True, seed=1), orders(shuffle=True, seed=1), orders(shuffle=True, seed=2)
    for epoch in a + c:
        assert sorted(epoch) == list(range(8))  # a permutation: every sequence once per epoch
    assert a == b  # same seed, same order
    assert a != c  # another seed, another order
    assert len({tuple(e) for e in a}) > 1  # a fresh order each epoch
    assert any(e != list(range(8)) for e in a)


@pytest.mark.parametrize("kind,threads", [("d", 1), ("e", 1), ("ed", 1), ("d", 2)])
def test_same_seed_same_parameters_other_seed_other_parameters(kind, threads):
    ft.set_num_threads(threads)
    data = ragged(7, 6)
    if kind == "d":
        make, run = dmodel, lambda tr, m: tr(data, m)
        Trainer, extra = ft.DTraining, {}
    elif kind == "e":
        make, run = emodel, lambda tr, m: tr(data, m)
        Trainer, extra = ft.ETraining, {"p_mask": 0.3}
    else:
        x = [np.concatenate([[N_V - 2], s, [N_V - 1]]) for s in ragged(8, 6, hi=7)]
        make, run = edmodel, lambda tr, m: tr(data, x, m)
        Trainer, extra = ft.EDTraining, {}

    def train(seed, shuffle=True):
        m = make(seed=0)  # the same initial θ every time: only the trainer's seed differs
        run(Trainer(2, 1e-2, **extra, **quiet(batch_size=2, seed=seed, shuffle=shuffle)), m)
        return m

    a, b, c = train(3), train(3), train(4)
    assert_identical(a, b)
    assert max_param_diff(a, c) > 1e-6
    if kind == "e":  # without shuffling, the seed still draws the masks
        assert max_param_diff(train(3, False), train(4, False)) > 1e-6


# ------------------------------------------------------------------------------------------------------
# p_mask


def test_mask_tokens_masks_the_expected_fraction():
    x = np.arange(200_000) % 50
    for p in (0.05, 0.15, 0.5, 0.9):
        xt = ft._core._mask_tokens(x, 97, p, 11)
        masked = xt == 97
        assert np.array_equal(xt[~masked], x[~masked])  # the others untouched
        assert abs(masked.mean() - p) <= 5 * math.sqrt(p * (1 - p) / x.size), (p, masked.mean())


@pytest.mark.parametrize("p_mask", [0.1, 0.5])
def test_etraining_masks_the_expected_fraction(p_mask):
    data = [np.arange(12) % 5 for _ in range(200)]
    tr = ft.ETraining(1, 0.0, p_mask=p_mask, **quiet(optimizer="sgd", batch_size=10, seed=5))
    tr(data, emodel())
    frac = sum(tr.history["tokens"]) / (12 * 200)
    assert abs(frac - p_mask) <= 5 * math.sqrt(p_mask * (1 - p_mask) / 2400), frac


# ------------------------------------------------------------------------------------------------------
# learning-rate schedule


def schedule_formula(step, total, eta, warmup, min_lr, kind):
    """Linear warm-up to η over `warmup` steps, then constant / cosine / linear decay reaching min_lr at
    the last step."""
    if warmup > 0 and step <= warmup:
        return eta * step / warmup
    if kind == "constant":
        return eta
    progress = (step - warmup) / max(1, total - warmup)
    if kind == "cosine":
        return min_lr + 0.5 * (eta - min_lr) * (1 + math.cos(math.pi * progress))
    return eta + (min_lr - eta) * progress


@pytest.mark.parametrize("kind,warmup", [("cosine", 5), ("cosine", 0), ("linear", 3), ("constant", 4)])
def test_history_lr_follows_warmup_and_schedule(kind, warmup):
    data = ragged(9, 10)
    tr = ft.DTraining(2, 0.01, **quiet(optimizer="sgd", schedule=kind, warmup=warmup, min_lr=1e-4, batch_size=1))
    tr(data, dmodel())
    total = 20
    want = [schedule_formula(s, total, 0.01, warmup, 1e-4, kind) for s in range(1, total + 1)]
    assert tr.history["lr"] == pytest.approx(want, rel=1e-12, abs=1e-15)
    if warmup:
        assert tr.history["lr"][warmup - 1] == pytest.approx(0.01)  # the peak at the end of the warm-up
        assert tr.history["lr"][0] == pytest.approx(0.01 / warmup)
    if kind != "constant":
        assert tr.history["lr"][-1] == pytest.approx(1e-4)  # min_lr at the last step
        assert all(a >= b for a, b in zip(tr.history["lr"][warmup:], tr.history["lr"][warmup + 1:]))
    # the plan of the run gives the same values, bit for bit
    assert [p["lr"] for p in tr.plan(data)] == tr.history["lr"]


def test_plan_gives_the_runs_minibatches():
    """trainer.plan(x_data) is the core's plan the loop walks: replaying its sequences and η by hand (SGD,
    shuffled minibatches, a cosine schedule, a run counted in steps) gives the run's θ."""
    data = ragged(15, 5)
    m, hand = dmodel(), dmodel()
    tr = ft.DTraining(0, 0.2, **quiet(optimizer="sgd", batch_size=2, seed=4, schedule="cosine", warmup=2,
                                      min_lr=0.01, max_steps=7))
    plan = tr.plan(data)
    tr(data, m)
    assert [p["step"] for p in plan] == tr.history["step"] == list(range(1, 8))
    assert [p["epoch"] for p in plan] == tr.history["epoch"]
    assert [p["lr"] for p in plan] == tr.history["lr"]
    assert [p["sequences"].tolist() for p in plan][:3] != [[0, 1], [2, 3], [4]]  # shuffled
    for p in plan:
        batch = [data[n] for n in p["sequences"]]
        _, g = hand.loss_and_grad(batch)
        sgd_by_hand(hand, g, p["lr"], 1.0 / len(batch))
    assert_close(m, hand, 1e-12)
    with pytest.raises(ValueError, match="empty"):
        tr.plan([])


def test_options_are_the_cores_schema():
    """Every option is parsed once, by the core's schema: the trainer's options are the core's values (defaults
    filled, patience off as None), an unknown or another listing's option is a TypeError naming it, and the
    docstring lists every option with its default."""
    tr = ft.DTraining(2, 0.01, batch_size=3, schedule="cosine")
    assert tr.options["batch_size"] == 3 and tr.options["schedule"] == "cosine" and tr.options["patience"] is None
    assert tr.options["clip"] == 0.0 and tr.options["shuffle"] is True and "p_mask" not in tr.options
    assert ft.ETraining(1, 0.01, p_mask=0.25).options["p_mask"] == 0.25
    for bad, exc in ((dict(bogus=1), TypeError), (dict(p_mask=0.2), TypeError), (dict(shuffle=1), TypeError),
                     (dict(betas=(0.9, 1.0)), ValueError), (dict(weight_decay=-1.0), ValueError),
                     (dict(clip=float("nan")), ValueError), (dict(sync_check_every=1.5), TypeError)):
        name = "beta2" if "betas" in bad else next(iter(bad))
        with pytest.raises(exc, match=name):
            ft.DTraining(1, 0.01, **bad)
    doc = ft._core._TrainOptions.doc("ETraining")
    assert [line.split("=")[0] for line in doc.splitlines()] == [k for k in ft.ETraining(1).options]
    assert "batch_size=1  " in doc and "p_mask=0.15  " in doc


def test_schedule_lr_is_the_one_used_by_the_update():
    data = ragged(10, 3)
    m, hand = dmodel(), dmodel()
    ft.DTraining(1, 0.5, **quiet(optimizer="sgd", shuffle=False, schedule="cosine", warmup=1, min_lr=0.05))(data, m)
    for step, x in enumerate(data, start=1):
        _, g = hand.loss_and_grad(x)
        sgd_by_hand(hand, g, schedule_formula(step, 3, 0.5, 1, 0.05, "cosine"), 1.0)
    assert_close(m, hand, 1e-12)


def test_start_step_continues_the_schedule():
    """Resuming: 3 steps, then 4 more with start_step=3: the second part's η are those of steps 4–7 of the
    7-step warm-up + cosine schedule (as in one 7-step run), not a schedule (and warm-up) of its own."""
    data = ragged(12, 7)
    opts = dict(optimizer="sgd", shuffle=False, schedule="cosine", warmup=2, min_lr=0.05)
    once, twice = dmodel(), dmodel()
    t_once = ft.DTraining(1, 0.5, **quiet(**opts))
    t_once(data, once)
    ft.DTraining(1, 0.5, **quiet(**opts))(data[:3], twice)
    t_two = ft.DTraining(1, 0.5, **quiet(start_step=3, **opts))
    t_two(data[3:], twice)
    # the first part's schedule spans its own 3 steps; from the 4th on, both runs use the 7-step schedule
    assert t_two.history["lr"] == pytest.approx([schedule_formula(k, 7, 0.5, 2, 0.05, "cosine") for k in range(4, 8)],
                                                rel=1e-12)
    assert t_two.history["lr"] == pytest.approx(t_once.history["lr"][3:], rel=1e-12)
    with pytest.raises(ValueError, match="start_step"):
        ft.DTraining(1, 0.5, start_step=-1)


# ------------------------------------------------------------------------------------------------------
# clipping, max_steps, callback


def test_clip_rescales_the_gradient_to_the_given_norm():
    x = ragged(11, 1, lo=8, hi=8)
    theta0 = snapshot(dmodel())
    _, g = dmodel().loss_and_grad(x[0])
    raw = math.sqrt(sum(float(np.sum(v.astype(np.float64) ** 2)) for v in g.values()))
    eta = 0.1
    for clip, factor in ((raw / 4, 0.25), (raw * 2, 1.0)):
        m = dmodel()
        tr = ft.DTraining(1, eta, **quiet(optimizer="sgd", clip=clip))
        tr(x, m)
        assert tr.history["grad_norm"][0] == pytest.approx(raw, rel=1e-12)  # reported before clipping
        delta = {k: theta0[k] - np.asarray(m.params[k], dtype=np.float64) for k in theta0}
        norm = math.sqrt(sum(float(np.sum(d ** 2)) for d in delta.values()))
        assert norm == pytest.approx(eta * min(clip, raw), rel=1e-10)  # ‖Δθ‖ = η·clip when raw > clip
        for k in delta:  # the direction is the gradient's
            assert rel_err(delta[k], eta * factor * g[k]) <= 1e-10, k


def test_max_steps_stops_after_that_many_updates():
    data = ragged(12, 4)
    seen = []
    m, hand = dmodel(), dmodel()
    tr = ft.DTraining(3, 0.2, **quiet(optimizer="sgd", shuffle=False, max_steps=6, callback=seen.append))
    tr(data, m)
    assert tr.history["step"] == [1, 2, 3, 4, 5, 6]
    assert tr.history["epoch"] == [0, 0, 0, 0, 1, 1]
    assert all(info["total_steps"] == 6 for info in seen)
    for x in (data + data)[:6]:
        _, g = hand.loss_and_grad(x)
        sgd_by_hand(hand, g, 0.2, 1.0)
    assert_close(m, hand, 1e-12)
    # the decay schedules end at min_lr at max_steps, not at the epochs' end
    tr2 = ft.DTraining(3, 0.2, **quiet(optimizer="sgd", max_steps=6, schedule="linear", min_lr=0.02))
    tr2(data, dmodel())
    assert tr2.history["lr"][-1] == pytest.approx(0.02)
    # a limit beyond the epochs changes nothing
    tr3 = ft.DTraining(1, 0.2, **quiet(optimizer="sgd", max_steps=100))
    tr3(data, dmodel())
    assert tr3.history["step"] == [1, 2, 3, 4]


def test_callback_returning_false_stops_and_none_continues():
    data = ragged(13, 5)
    calls = []

    def stop_at_3(info):
        calls.append(info["step"])
        return info["step"] < 3

    m = dmodel()
    tr = ft.DTraining(2, 0.1, **quiet(optimizer="sgd", callback=stop_at_3, seed=1))
    tr(data, m)
    assert calls == [1, 2, 3] and tr.history["step"] == [1, 2, 3]
    ref = dmodel()
    ft.DTraining(2, 0.1, **quiet(optimizer="sgd", max_steps=3, seed=1))(data, ref)
    assert_identical(m, ref)
    # None (no return value) continues
    calls.clear()
    tr = ft.DTraining(2, 0.1, **quiet(optimizer="sgd", callback=lambda info: calls.append(info["step"])))
    tr(data, dmodel())
    assert calls == list(range(1, 11))
    # the callback sees the step's figures
    got = []
    ft.DTraining(1, 0.1, **quiet(callback=got.append, val_data=data[:2], eval_every=2))(data, dmodel())
    assert set(got[0]) >= {"step", "epoch", "loss", "lr", "grad_norm", "tokens", "val_loss", "val_accuracy"}
    assert got[0]["val_loss"] is None and got[1]["val_loss"] is not None


def test_callback_may_use_the_model():
    """A callback that evaluates or samples from the model being trained (the usual 'print a sample every
    N steps') must work, or at least fail with an exception — never hang. Run in a subprocess with a
    timeout, since a deadlock cannot be interrupted from inside."""
    code = textwrap.dedent(
        """
        import numpy as np, formal_transformers as ft
        m = ft.DTransformer(8, 12, 1, 2, 8, 16)
        x = [np.arange(6) % 5] * 3
        def cb(info):
            m.loss(x[0])
            ft.DInference(2, tau=0)(x[0][:3], m)
        ft.DTraining(1, 1e-3, progress=False, callback=cb)(x, m)
        print("finished")
        """
    )
    env = dict(os.environ)
    # The child must import the very package under test: the installed one in CI, the source tree (with
    # FT_CORE_PATH) in a developer build. Absolute paths, since the child may start elsewhere.
    package_parent = str(pathlib.Path(ft.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([package_parent] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    if env.get("FT_CORE_PATH"):
        env["FT_CORE_PATH"] = str(pathlib.Path(env["FT_CORE_PATH"]).resolve())
    try:
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=12)
    except subprocess.TimeoutExpired:
        pytest.fail("calling the model from a DTraining callback hangs (deadlock on the model's lock)")
    assert r.returncode == 0 and "finished" in r.stdout, r.stderr


# ------------------------------------------------------------------------------------------------------
# validation


def test_eval_every_and_val_data_for_dtraining():
    data, val = ragged(14, 5), ragged(15, 11)  # 11 validation sequences: more than one chunk of 8
    snaps = {}
    m = dmodel()

    def keep(info):
        if info["val_loss"] is not None:
            snaps[info["step"]] = snapshot(m)

    tr = ft.DTraining(1, 0.05, **quiet(val_data=val, eval_every=2, callback=keep, seed=2))
    tr(data, m)
    assert tr.history["val_step"] == [2, 4, 5]  # every 2 steps and at the end
    assert sorted(snaps) == [2, 4, 5]
    probe = dmodel()
    for step, loss, acc in zip(tr.history["val_step"], tr.history["val_loss"], tr.history["val_accuracy"]):
        probe.params.update(snaps[step])
        assert loss == pytest.approx(probe.loss(val, reduction="mean"), rel=1e-12)
        hits = sum(int((probe(x).argmax(axis=0)[:-1] == x[1:]).sum()) for x in val)
        assert acc == pytest.approx(hits / d_scored(val), abs=1e-15)
    # the last one is the trained model's, by hand at the end
    assert tr.history["val_loss"][-1] == pytest.approx(m.loss(val, reduction="mean"), rel=1e-12)
    assert len(set(tr.history["val_loss"])) == 3  # it changed while training
    # eval_every = 0: at the end only; no val_data: never
    tr0 = ft.DTraining(1, 0.05, **quiet(val_data=val))
    tr0(data, dmodel())
    assert tr0.history["val_step"] == [5]
    trn = ft.DTraining(1, 0.05, **quiet(eval_every=2))
    trn(data, dmodel())
    assert trn.history["val_step"] == [] and trn.history["val_loss"] == []


def test_val_data_for_edtraining_and_etraining():
    z, zv = ragged(16, 4), ragged(17, 3)
    x = [np.concatenate([[N_V - 2], s, [N_V - 1]]) for s in ragged(18, 4, hi=6)]
    xv = [np.concatenate([[N_V - 2], s, [N_V - 1]]) for s in ragged(19, 3, hi=6)]
    m = edmodel()
    tr = ft.EDTraining(1, 0.05, **quiet(val_data=(zv, xv), eval_every=3))
    tr(z, x, m)
    assert tr.history["val_step"] == [3, 4]
    assert tr.history["val_loss"][-1] == pytest.approx(m.loss(zv, xv, reduction="mean"), rel=1e-12)
    # ETraining: validation masks are fixed, so with η = 0 every evaluation gives the same figures
    data, val = ragged(20, 6), ragged(21, 5, lo=6, hi=9)
    tr = ft.ETraining(1, 0.0, p_mask=0.3, **quiet(optimizer="sgd", val_data=val, eval_every=2))
    tr(data, emodel())
    assert tr.history["val_step"] == [2, 4, 6]
    assert len(set(tr.history["val_loss"])) == 1 and len(set(tr.history["val_accuracy"])) == 1
    assert 0 < tr.history["val_loss"][0] < 10 and 0 <= tr.history["val_accuracy"][0] <= 1
    # and with training they move
    tr = ft.ETraining(1, 0.05, p_mask=0.3, **quiet(val_data=val, eval_every=2))
    tr(data, emodel())
    assert len(set(tr.history["val_loss"])) == 3


# ------------------------------------------------------------------------------------------------------
# optimizers: weight decay, betas, objects that keep their moments


def test_adam_options_weight_decay_and_betas_are_used():
    data = ragged(22, 4)
    m, hand = dmodel(), dmodel()
    tr = ft.DTraining(1, 0.01, **quiet(shuffle=False, batch_size=2, weight_decay=0.1, betas=(0.8, 0.99)))
    tr(data, m)
    adam = ft.Adam(0.01, 0.8, 0.99, 1e-8, 0.1)  # AdamW
    for batch in (data[:2], data[2:]):
        _, g = hand.loss_and_grad(batch)
        adam.step(hand, {k: v / 2 for k, v in g.items()})
    assert_close(m, hand, 1e-12)
    plain = dmodel()
    ft.DTraining(1, 0.01, **quiet(shuffle=False, batch_size=2, betas=(0.8, 0.99)))(data, plain)
    assert max_param_diff(m, plain) > 1e-6  # weight_decay not ignored
    default_betas = dmodel()
    ft.DTraining(1, 0.01, **quiet(shuffle=False, batch_size=2, weight_decay=0.1))(data, default_betas)
    assert max_param_diff(m, default_betas) > 1e-6  # betas not ignored
    with pytest.raises(ValueError, match="weight_decay"):
        ft.DTraining(1, 0.01, **quiet(optimizer="sgd", weight_decay=0.1))(data, dmodel())


def test_adam_object_keeps_its_moments_across_calls():
    data = ragged(23, 4)
    adam = ft.Adam(0.01)
    m = dmodel()
    ft.DTraining(1, 0.01, **quiet(optimizer=adam, shuffle=False))(data, m)
    assert adam.t == 4
    ft.DTraining(1, 0.01, **quiet(optimizer=adam, shuffle=False))(data, m)
    assert adam.t == 8
    ref = dmodel()
    ft.DTraining(2, 0.01, **quiet(shuffle=False))(data, ref)
    assert_identical(m, ref)
    # a fresh Adam for the second call would not give the same parameters
    fresh = dmodel()
    ft.DTraining(1, 0.01, **quiet(optimizer=ft.Adam(0.01), shuffle=False))(data, fresh)
    ft.DTraining(1, 0.01, **quiet(optimizer=ft.Adam(0.01), shuffle=False))(data, fresh)
    assert max_param_diff(fresh, ref) > 1e-6
    # the same trainer with optimizer="adam" called twice on the same model continues too
    again = dmodel()
    tr = ft.DTraining(1, 0.01, **quiet(shuffle=False))
    tr(data, again)
    tr(data, again)
    assert_identical(again, ref)
    assert tr.history["step"] == list(range(1, 9))


def test_trainer_with_adam_string_gives_each_new_model_a_fresh_adam():
    """optimizer='adam' (the default): the trainer creates an Adam for the model it trains and keeps it for
    further calls on that model. A different model — even one that happens to reuse the memory (and id())
    of a model that no longer exists, as a temporary does — must get a fresh Adam: the same result as a
    new trainer, not an error about another model's moments."""
    data = ragged(33, 4)
    tr = ft.DTraining(1, 1e-2, **quiet(shuffle=False))
    tr(data, dmodel(seed=5))  # a temporary model, freed after the call
    m = dmodel()
    tr(data, m)
    assert tr.optimizer.t == 4, f"the second model was stepped by an Adam with {tr.optimizer.t - 4} earlier steps"
    ref = dmodel()
    ft.DTraining(1, 1e-2, **quiet(shuffle=False))(data, ref)
    assert_identical(m, ref)


def test_adam_object_of_another_model_is_refused():
    adam = ft.Adam(0.01)
    first = dmodel()  # kept alive: the optimizer is bound to its parameter buffer
    ft.DTraining(1, 0.01, **quiet(optimizer=adam))(ragged(24, 2), first)
    other = dmodel()
    before = snapshot(other)
    with pytest.raises(ValueError, match="another model"):
        ft.DTraining(1, 0.01, **quiet(optimizer=adam))(ragged(24, 2), other)
    assert_identical(other, before)


# ------------------------------------------------------------------------------------------------------
# progress bar


def test_progress_bar_on_and_off(capsys):
    data = ragged(25, 3)
    ft.DTraining(1, 0.01, progress=True)(data, dmodel())
    err = capsys.readouterr().err
    assert "DTraining" in err and "3/3" in err
    ft.DTraining(1, 0.01, progress=False)(data, dmodel())
    assert capsys.readouterr().err == ""
    x = [np.concatenate([[N_V - 2], s, [N_V - 1]]) for s in ragged(26, 3)]
    ft.EDTraining(1, 0.01, progress=True)(ragged(27, 3), x, edmodel())
    ft.ETraining(1, 0.01, progress=True)(data, emodel())
    err = capsys.readouterr().err
    assert "EDTraining" in err and "ETraining" in err


# ------------------------------------------------------------------------------------------------------
# bad input: clear exceptions, model untouched


@pytest.mark.parametrize("p_mask", [0.0, 1.0, -0.1, 1.5, float("nan")])
def test_p_mask_outside_open_interval_is_a_value_error(p_mask):
    with pytest.raises(ValueError, match="p_mask"):
        ft.ETraining(1, 0.01, p_mask=p_mask)


@pytest.mark.parametrize(
    "opts,match",
    [
        (dict(eta=-1.0), "eta"),
        (dict(eta=float("nan")), "eta"),
        (dict(batch_size=0), "batch_size"),
        (dict(warmup=-1), "warmup"),
        (dict(clip=-1.0), "clip"),
        (dict(max_steps=-1), "max_steps"),
        (dict(eval_every=-1), "eval_every"),
        (dict(reduction="avg"), "reduction"),
        (dict(schedule="step"), "schedule"),
        (dict(optimizer="rmsprop"), "optimizer"),
        (dict(seed=-1), "seed"),
        (dict(seed=2**64), "seed"),  # beyond the generator's 64-bit seed
        (dict(optimizer="sgd", weight_decay=0.1), "weight_decay"),  # at construction, not at the first call
    ],
)
def test_bad_options_are_value_errors(opts, match):
    opts = dict(opts)
    eta = opts.pop("eta", 0.01)
    with pytest.raises(ValueError, match=match):
        ft.DTraining(1, eta, **opts)


def test_bad_types_are_type_errors():
    with pytest.raises(TypeError, match="reduction must be a string"):
        ft.DTraining(1, 0.01, reduction=None)
    with pytest.raises(TypeError, match="schedule must be a string"):
        ft.DTraining(1, 0.01, schedule=3)
    with pytest.raises(TypeError):
        ft.DTraining(1.5, 0.01)
    with pytest.raises(TypeError):
        ft.DTraining(1, 0.01, optimizer=object())
    with pytest.raises(TypeError):
        ft.DTraining(1, 0.01, callback=3)
    with pytest.raises(TypeError, match="DTransformer"):
        ft.DTraining(1, 0.01, progress=False)(ragged(0, 2), emodel())
    with pytest.raises(TypeError, match="EDTransformer"):
        ft.EDTraining(1, 0.01, progress=False)(ragged(0, 2), ragged(1, 2), dmodel())


@pytest.mark.parametrize("empty", [[], np.zeros((0, 4), dtype=np.int64), [[]], [np.array([1, 2]), []]])
def test_empty_data_sets_are_value_errors(empty):
    for make, call in (
        (dmodel, lambda m: ft.DTraining(1, 0.1, progress=False)(empty, m)),
        (emodel, lambda m: ft.ETraining(1, 0.1, progress=False)(empty, m)),
        (edmodel, lambda m: ft.EDTraining(1, 0.1, progress=False)(empty, empty, m)),
    ):
        m = make()
        before = snapshot(m)
        with pytest.raises(ValueError):
            call(m)
        assert_identical(m, before)


def test_bad_data_is_rejected_before_any_update():
    m = dmodel()
    before = snapshot(m)
    good = ragged(28, 3)
    cases = [
        (IndexError, good + [np.array([1, N_V])]),          # id out of range, in the last sequence
        (IndexError, good + [np.array([1, -1])]),
        (ValueError, good + [np.zeros(13, dtype=int)]),     # longer than l_max = 12
        (TypeError, good + [np.array([0.5, 1.0])]),          # not ids
    ]
    for exc, data in cases:
        with pytest.raises(exc):
            ft.DTraining(1, 0.1, progress=False)(data, m)
        assert_identical(m, before)
    with pytest.raises(IndexError):
        ft.DTraining(1, 0.1, progress=False, val_data=[np.array([0, 99])])(good, m)
    assert_identical(m, before)


@pytest.mark.parametrize("kind", ["e", "ed"])
def test_bad_data_is_rejected_before_any_update_by_every_trainer(kind):
    """As for DTraining: ids out of range, sequences past ℓ_max, non-integer ids, bad validation data —
    each rejected before the first update (ETraining; EDTraining in z and in x)."""
    m = emodel() if kind == "e" else edmodel()
    before = snapshot(m)
    good = ragged(31, 3)
    bads = [
        (IndexError, good + [np.array([1, N_V])]),
        (IndexError, good + [np.array([1, -1])]),
        (ValueError, good + [np.zeros(13, dtype=int)]),
        (TypeError, good + [np.array([0.5, 1.0])]),
    ]
    for exc, bad in bads:
        calls = ([lambda: ft.ETraining(1, 0.1, p_mask=0.5, progress=False)(bad, m)] if kind == "e" else
                 [lambda: ft.EDTraining(1, 0.1, progress=False)(bad, good + [good[0]], m),
                  lambda: ft.EDTraining(1, 0.1, progress=False)(good + [good[0]], bad, m)])
        for call in calls:
            with pytest.raises(exc):
                call()
            assert_identical(m, before)
    with pytest.raises(IndexError):
        if kind == "e":
            ft.ETraining(1, 0.1, p_mask=0.5, progress=False, val_data=[np.array([0, 99])])(good, m)
        else:
            ft.EDTraining(1, 0.1, progress=False, val_data=([np.array([0, 1])], [np.array([0, 99])]))(good, good, m)
    assert_identical(m, before)


def test_a_passed_optimizers_lr_is_eta_or_refused():
    """optimizer=ft.SGD(0.5) without eta: η = 0.5, the update is θ − 0.5·∇; with eta=0.1 the two rates
    disagree and the trainer refuses (ValueError naming both) instead of ignoring one, before any step."""
    x = ragged(32, 1)
    m, hand = dmodel(), dmodel()
    ft.DTraining(1, **quiet(optimizer=ft.SGD(0.5)))(x, m)
    _, g = hand.loss_and_grad(x[0])
    sgd_by_hand(hand, g, 0.5, 1.0)
    assert_close(m, hand, 1e-12)
    before = snapshot(m)
    for opt in (ft.SGD(0.5), ft.Adam(0.5)):
        with pytest.raises(ValueError, match="lr = 0.5.* eta = 0.1"):
            ft.DTraining(1, 0.1, **quiet(optimizer=opt))(x, m)
    assert_identical(m, before)
    assert ft.DTraining(1, **quiet(optimizer=ft.Adam(3e-4))).eta == 3e-4
    assert ft.DTraining(1, **quiet()).eta == 1e-3


def test_mismatched_z_x_data_lengths_are_value_errors():
    m = edmodel()
    before = snapshot(m)
    z, x = ragged(29, 3), ragged(30, 4)
    with pytest.raises(ValueError, match="same"):
        ft.EDTraining(1, 0.1, progress=False)(z, x, m)
    with pytest.raises(ValueError, match="same"):
        ft.EDTraining(1, 0.1, progress=False)(x, z, m)
    with pytest.raises(ValueError):
        ft.EDTraining(1, 0.1, progress=False, val_data=(z[:2], x[:3]))(z, x[:3], m)
    with pytest.raises(ValueError, match="pair"):
        ft.EDTraining(1, 0.1, val_data=z)
    assert_identical(m, before)


# ------------------------------------------------------------------------------------------------------
# Ctrl-C


@pytest.mark.parametrize("kind", ["d", "e", "ed"])
def test_keyboard_interrupt_from_callback_leaves_a_working_model(kind):
    data = ragged(31, 6)
    x = [np.concatenate([[N_V - 2], s, [N_V - 1]]) for s in ragged(32, 6, hi=6)]

    def interrupt(info):
        if info["step"] == 3:
            raise KeyboardInterrupt

    def run(m, **kw):
        if kind == "d":
            return ft.DTraining(2, 0.05, **quiet(seed=4, **kw))(data, m)
        if kind == "e":
            return ft.ETraining(2, 0.05, p_mask=0.3, **quiet(seed=4, **kw))(data, m)
        return ft.EDTraining(2, 0.05, **quiet(seed=4, **kw))(data, x, m)

    make = {"d": dmodel, "e": emodel, "ed": edmodel}[kind]
    m = make()
    with pytest.raises(KeyboardInterrupt):
        run(m, callback=interrupt)
    ref = make()
    run(ref, max_steps=3)
    assert_identical(m, ref)  # the parameters of the last completed step
    # the next forward works
    P = m(data[0]) if kind != "ed" else m(data[0], x[0])
    assert np.all(np.isfinite(P)) and np.allclose(P.sum(axis=0), 1.0)
    # and training can go on
    run(m, max_steps=2)
    assert np.all(np.isfinite(m(data[1]) if kind != "ed" else m(data[1], x[1])))


@pytest.mark.parametrize("validating", [False, True], ids=["training", "validating-every-step"])
def test_ctrl_c_by_signal_leaves_the_model_and_history_of_the_same_step(validating):
    """A real SIGINT during training: KeyboardInterrupt, a model whose next forward works, and a model that
    holds the parameters after the last step recorded in trainer.history (as the trainer's message says)
    — checked against an uninterrupted run of that many steps, at several signal times. With a large
    validation set evaluated after every step, most signals land inside an evaluation (after the update)."""
    data = [(np.arange(16) + p) % 5 for p in range(5)]
    val = dict(val_data=[(np.arange(16) + p) % 5 for p in range(400)], eval_every=1) if validating else {}
    # The signal must come after the first recorded step; on a loaded machine that takes longer than on a quiet
    # one, so the delay is measured here: three times the time of two steps (validation included), at least 0.15 s.
    t0 = time.perf_counter()
    probe = ft.DTransformer(N_V, 16, 2, 2, 32, 64, dtype="float64", seed=1)
    ft.DTraining(100_000, 1e-3, **quiet(seed=0, max_steps=2), **val)(data, probe)
    delay = max(0.15, 3 * (time.perf_counter() - t0))
    mismatches = []
    for trial in range(5):
        m = ft.DTransformer(N_V, 16, 2, 2, 32, 64, dtype="float64", seed=1)
        tr = ft.DTraining(100_000, 1e-3, **quiet(seed=0), **val)
        timer = threading.Timer(delay * (1 + 0.09 * trial), lambda: os.kill(os.getpid(), signal.SIGINT))
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                tr(data, m)
        finally:
            timer.join()
        P = m(data[0])
        assert np.all(np.isfinite(P)) and np.allclose(P.sum(axis=0), 1.0)
        n = len(tr.history["step"])
        assert n > 0
        ref = ft.DTransformer(N_V, 16, 2, 2, 32, 64, dtype="float64", seed=1)
        ft.DTraining(100_000, 1e-3, **quiet(seed=0, max_steps=n))(data, ref)
        if max_param_diff(m, ref) != 0.0:
            ahead = ft.DTransformer(N_V, 16, 2, 2, 32, 64, dtype="float64", seed=1)
            ft.DTraining(100_000, 1e-3, **quiet(seed=0, max_steps=n + 1))(data, ahead)
            mismatches.append((n, "model = step n+1" if max_param_diff(m, ahead) == 0.0 else "model = neither"))
    assert not mismatches, f"history ends at step n but the model does not hold step n's parameters: {mismatches}"



# ------------------------------------------------------------------------------------------------------
# memory: a training step reuses the buffers of the one before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts page faults with getrusage on Linux")
def test_a_steady_training_step_maps_no_fresh_pages():
    """After the warm-up steps, loss_and_grad(copy=False) + Adam.step allocate nothing large: the workspaces,
    activations, logits, rounded bf16 operands and Adam's moments are kept between calls (docs/design.md
    "Memory kept between calls"). In a child with glibc's mmap threshold pinned at 64 KiB, every allocation of
    64 KiB or more is a fresh mapping whose pages fault in when written, so a buffer made per step shows as
    page faults (the process's minor faults). The copy=True step, which returns a fresh flat gradient of
    ~800 pages, is the check that the count sees such a buffer. bf16-mixed's literal attention runs its
    per-head products emulated here: oneDNN's gemm kernel, which it picks for a head's strided output,
    allocates its own packing buffers at every call (glibc's default reuses them: no new pages)."""
    code = textwrap.dedent(
        """
        import resource
        import numpy as np, formal_transformers as ft
        ft.set_num_threads(1)
        def faults():
            return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        x = np.random.default_rng(0).integers(0, 65, (2, 256))
        cases = [("float32", "literal", True), ("float32", "tiled", True), ("bf16-mixed", "tiled", True),
                 ("bf16-mixed", "literal", False), ("bf16-mixed", "tiled", False)]
        for precision, impl, native in cases:
            ft._core._bf16_allow_native(native)
            for copy in (False, True):
                m = ft.DTransformer(65, 256, 2, 4, 128, 512, dtype="float32", seed=0, precision=precision,
                                    attention_impl=impl)
                opt = ft.Adam(3e-4, weight_decay=0.1)
                def step():
                    loss, g = m.loss_and_grad(x, copy=copy)
                    opt.step(m, g)
                step(); step()
                f0 = faults()
                for _ in range(3):
                    step()
                print(precision, impl, native, copy, faults() - f0)
        """
    )
    env = dict(child_env(), GLIBC_TUNABLES="glibc.malloc.mmap_threshold=65536", OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.split("\n") if line]
    assert len(rows) == 10, r.stdout
    n_grad = ft.DTransformer(65, 256, 2, 4, 128, 512, dtype="float32").n_params * 4 // 4096
    for precision, impl, native, copy, n in rows:
        if copy == "True":  # a fresh flat gradient per step: its pages fault in every step
            assert int(n) >= 3 * n_grad * 9 // 10, (precision, impl, native, n, n_grad)
        else:  # nothing fresh: a few pages of Python's own objects at most
            assert int(n) <= 8, (precision, impl, native, n)
