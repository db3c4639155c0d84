"""V16 multi-token prediction together with V10 latent attention (MLA; DeepSeek-V3 has both): every module's
attention is latent too. The loss and its terms against reference.d_mtp_loss (float64 ≤ 1e-12, float32 ≤ 1e-5),
every gradient against central differences (float64), the trunk unchanged by the modules, and self-speculation
drafting from the latent modules equal to greedy decoding."""
from __future__ import annotations

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref
from conftest import TOL, assert_grads_match_fd, randomize_theta, rel_err

BATCH = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3], [8, 9, 7, 9, 3], [2, 7, 1, 8, 2, 8, 1]]  # ragged; every ℓ ≥ D + 2
MLA = dict(positional="rope", rope_theta=300.0, kv_lora_rank=4, qk_rope_head_dim=2, d_attn=5, d_mid=3, norm="rms",
           mlp="swiglu", bias=False)
REF_HP = dict(L=2, H=2, norm="rms", positional="rope", rope_theta=300.0, mlp="swiglu", qk_rope_head_dim=2, eps=1e-5)


def make(dtype="float64", D=2, q_lora_rank=None, seed=3, **kw):
    return ft.DTransformer(13, 12, 2, 2, 8, 12, dtype=dtype, seed=seed, mtp_depth=D, q_lora_rank=q_lora_rank,
                           **MLA, **kw)


@pytest.mark.parametrize("q_lora_rank", [None, 3])
def test_every_module_attends_latently(q_lora_rank):
    m = make(q_lora_rank=q_lora_rank)
    for p in ("layers.1.attn.", "mtp.0.attn.", "mtp.1.attn."):
        assert {p + "W_dkv", p + "gamma_kv", p + "W_ukv"} <= set(m.params), p
        assert (p + "W_dq" in m.params) == (q_lora_rank is not None) and p + "W_k" not in m.params


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("D", [1, 2])
@pytest.mark.parametrize("q_lora_rank", [None, 3])
def test_loss_and_its_terms_match_the_reference(q_lora_rank, D, dtype):
    m = make(dtype, D=D, q_lora_rank=q_lora_rank, mtp_weight=0.6)
    theta = randomize_theta(m, np.random.default_rng(1))
    loss = m.loss(BATCH)
    want = ref.d_mtp_loss(BATCH, theta, mtp_depth=D, terms=True, **REF_HP)
    assert rel_err(m.loss_terms(), want) <= TOL[dtype]
    total = want[0] + 0.6 / D * sum(want[1:])
    assert abs(loss - total) <= TOL[dtype] * abs(total)
    lg, _ = m.loss_and_grad(BATCH)
    assert abs(lg - loss) <= TOL[dtype] * abs(loss)
    # the trunk is the MLA decoder of V10, the modules change nothing of it
    P = ref.softmax(ref.d_transformer_variant(BATCH[0], theta, logits=True, **REF_HP))
    assert rel_err(m(np.array(BATCH[0])), P) <= TOL[dtype]


@pytest.mark.parametrize("q_lora_rank", [None, 3])
def test_every_gradient_against_finite_differences(q_lora_rank):
    m = make(D=2, q_lora_rank=q_lora_rank, mtp_weight=0.8, seed=5)
    randomize_theta(m, np.random.default_rng(2))
    batch = BATCH[1:]
    _, grads = m.loss_and_grad(batch)
    assert_grads_match_fd(m, grads, lambda: m.loss(batch), b_k_zero=False, label=q_lora_rank)


@pytest.mark.parametrize("k", [1, 2])
def test_self_speculation_from_latent_modules_is_greedy_decoding(k):
    m = make(D=2, seed=7)
    randomize_theta(m, np.random.default_rng(3))
    x = np.array([3, 1, 4])
    greedy = ft.DInference(6, 0.0)(x, m)
    y, stats = ft.SpeculativeInference(6, k=k, tau=0.0)(x, m, stats=True)
    assert np.array_equal(y, greedy) and sum(stats["drafted"]) > 0
