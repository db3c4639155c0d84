"""attention="bigbird" with one layout per head (docs/variants.md V17), and ft.from_hf(BigBirdModel /
BigBirdForMaskedLM) proven equal to Hugging Face's whole model in float64 with random weights: the last hidden
state and the MLM logits (≤ 1e-12 relative) and the gradient of the MLM loss with respect to every parameter
against torch autograd on HF's model. HF runs in training mode with every dropout rate 0 (deterministic: its
random blocks are drawn from numpy seeded with the layer index); from_hf installs those layouts (layouts that
repeat a block, HF's eval mode and its plans at ℓ = 1024: test_bigbird_multiset.py)."""
from __future__ import annotations

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref
from formal_transformers.hf.bert import tensor_table as _bert_pairs
from conftest import TOL, hf_random_float64, numeric_grad, randomize_theta, rel_err, torch_or_skip


def e_model(dtype="float64", L=2, H=3, d_e=12, b=3, r=2, impl="auto", **kw):
    return ft.ETransformer(19, 96, L, H, d_e, 12, 8, dtype=dtype, seed=3, attention="bigbird", block_size=b,
                           n_random_blocks=r, n_global_blocks=1, window_blocks=3, layout_seed=5,
                           attention_impl=impl, **kw)


def copy_theta(src, dst):
    for k, v in src.params.items():
        dst.params[k][...] = v


def head_layouts(rng, L, H, n, density=0.35):
    """Layouts (L, H, n, n) of random blocks, each head its own (every query block keeps its own block)."""
    lay = rng.random((L, H, n, n)) < density
    lay[:, :, np.arange(n), np.arange(n)] = True
    return lay


# ---------------------------------------------------------------------------------------------------
# One layout per head: drawn from layout_seed, or given


def test_each_head_draws_its_own_layout_from_the_named_seed():
    model = e_model()
    n = 10
    lay = model.bigbird_layouts(n)
    assert lay.shape == (2, 3, n, n) and lay.dtype == bool
    for l in range(2):
        for h in range(3):
            want = ft.bigbird_layout(n, 3, 1, 2, 5, f"layers.{l}.attn.", head=h)
            assert np.array_equal(lay[l, h], want)
        assert not np.array_equal(lay[l, 0], lay[l, 1]) or not np.array_equal(lay[l, 1], lay[l, 2])
    # head 0 is the layer's draw of the per-layer form (no head named)
    assert np.array_equal(lay[1, 0], ft.bigbird_layout(n, 3, 1, 2, 5, "layers.1.attn."))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("impl", ["auto", "literal", "tiled"])
def test_drawn_per_head_layouts_equal_the_reference(dtype, impl):
    model = e_model(dtype, impl=impl)
    theta = randomize_theta(model, np.random.default_rng(1), unit=(), spread=0.2, scale=0.5)
    x = np.random.default_rng(2).integers(0, 16, size=33)  # 11 blocks of 3
    want = ref.e_transformer(x, theta, L=2, H=3, attention="bigbird", layouts=model.bigbird_layouts(11), block_size=3)
    assert rel_err(model(x), want) <= TOL[dtype]


def test_given_layouts_per_head_forward_weights_and_gradients():
    rng = np.random.default_rng(3)
    model, literal = e_model(L=2), e_model(L=2, impl="literal")
    theta = randomize_theta(model, rng, unit=(), spread=0.2, scale=0.5)
    copy_theta(model, literal)
    n = 8
    lay = head_layouts(rng, 2, 3, n)
    assert not np.array_equal(lay[0, 0], lay[0, 1])
    for m in (model, literal):
        m.set_bigbird_layouts(lay)
        assert np.array_equal(m.bigbird_layouts(n), lay)
    x = rng.integers(0, 16, size=n * 3)
    want = ref.e_transformer(x, theta, L=2, H=3, attention="bigbird", layouts=lay, block_size=3)
    assert rel_err(model(x), want) <= 1e-12
    assert rel_err(literal(x), want) <= 1e-12
    # attention_weights per head: zeros outside head h's layout, each row the masked softmax of that head
    model(x)
    A = model.attention_weights(0)
    for h in range(3):
        mask = ref.bigbird_mask(lay[0, h], 3)
        assert np.all(A[h][~mask] == 0) and rel_err(A[h].sum(axis=0), np.ones(n * 3)) <= 1e-12
    X = np.stack([theta["W_e"][:, t] + theta["W_p"][:, i] for i, t in enumerate(x)], axis=1)
    a = "layers.0.attn."
    for h in range(3):
        wa = ref.attention_weights(X, X, theta[a + "W_q"][h], theta[a + "b_q"][h], theta[a + "W_k"][h],
                                   theta[a + "b_k"][h], ref.bigbird_mask(lay[0, h], 3))
        assert rel_err(A[h], wa) <= 1e-12
    # gradients: the kernel's = the literal listing's, and finite differences
    xt = list(x)
    xt[4] = xt[13] = xt[20] = model.mask_token
    _, g = model.loss_and_grad(xt, x)
    _, gd = literal.loss_and_grad(xt, x)
    for k, view in model.params.items():
        if k.endswith("b_k"):
            continue  # a constant of each column of S: 0 up to rounding
        assert rel_err(g[k], gd[k]) <= 1e-12, k
        if k.startswith("layers.0.attn.W_") or k == "W_e":
            # h = 1e-4: W_q's gradients are ~1e-4 here, so h = 1e-6 would leave ~1e-5 of rounding noise
            num = numeric_grad(lambda: model.loss(xt, x), view, h=1e-4)
            assert rel_err(g[k], num) <= 1e-6, (k, rel_err(g[k], num))


def test_per_layer_layouts_broadcast_over_heads_and_other_lengths_keep_drawing():
    rng = np.random.default_rng(4)
    model = e_model(L=2)
    theta = randomize_theta(model, rng, unit=(), spread=0.2, scale=0.5)
    lay = head_layouts(rng, 2, 1, 9)[:, 0]  # (L, n, n)
    drawn = model.bigbird_layouts(10)
    model.set_bigbird_layouts(lay)
    assert np.array_equal(model.bigbird_layouts(9), np.repeat(lay[:, None], 3, axis=1))
    assert np.array_equal(model.bigbird_layouts(10), drawn)
    x = rng.integers(0, 16, size=27)
    want = ref.e_transformer(x, theta, L=2, H=3, attention="bigbird", layouts=lay, block_size=3)
    assert rel_err(model(x), want) <= 1e-12


def test_bad_layouts_raise_before_anything_changes():
    model = e_model(L=2)
    before = model.bigbird_layouts(8)
    good = head_layouts(np.random.default_rng(5), 2, 3, 8)
    with pytest.raises(ValueError, match="shape"):
        model.set_bigbird_layouts(good[:1])
    with pytest.raises(ValueError, match="shape"):
        model.set_bigbird_layouts(good[:, :2])
    with pytest.raises(TypeError, match="bool"):
        model.set_bigbird_layouts(good.astype(np.float64))  # bool, or integer multiplicities
    with pytest.raises(ValueError, match="l_max"):
        model.set_bigbird_layouts(np.ones((2, 3, 40, 40), bool))  # 120 tokens > l_max 96
    bad = good.copy()
    bad[1, 2, :, 5] = False  # layer 1, head 2: query block 5 reads nothing
    with pytest.raises(ValueError, match=r"layouts\[1, 2\].*query block 5"):
        model.set_bigbird_layouts(bad)
    assert np.array_equal(model.bigbird_layouts(8), before)  # layer 0 was not installed either
    with pytest.raises(ValueError, match="not 'bigbird'"):
        ft.ETransformer(19, 96, 1, 2, 8, 12, 8).set_bigbird_layouts(good[:1, :2])
    with pytest.raises(ValueError, match="head"):
        ft.bigbird_layout(9, 3, 1, 1, head=-1)


# ---------------------------------------------------------------------------------------------------
# Hugging Face's BigBird, whole model


def hf_bigbird(cls="BigBirdForMaskedLM", L=2, H=2, d=16, b=4, r=2, act="gelu_new", attention_type="block_sparse"):
    """A float64 BigBird with random weights (conftest.hf_random_float64), every dropout 0, in training mode."""
    torch = torch_or_skip()
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BigBirdConfig(vocab_size=40, hidden_size=d, num_hidden_layers=L, num_attention_heads=H,
                                     intermediate_size=24, max_position_embeddings=96, attention_type=attention_type,
                                     block_size=b, num_random_blocks=r, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0, hidden_act=act, sep_token_id=None)
    return hf_random_float64(getattr(transformers, cls), cfg).train(), torch


def test_from_hf_bigbird_mlm_forward_and_every_gradient_equal_torch_autograd():
    hf, torch = hf_bigbird()
    n, b = 12, 4
    l = n * b  # 48 > (5 + 2r)·b = 36: HF runs block_sparse
    model = ft.from_hf(hf, bigbird_lengths=[l])
    assert model.config["attention"] == "bigbird" and model.config["n_random_blocks"] == 2
    assert model.config["gelu"] == "tanh"
    rng = np.random.default_rng(7)
    x = rng.integers(1, 37, size=l)  # no pad id 0 (HF's padding_idx keeps that row's gradient 0)
    xt = x.copy()
    masked = [3, 17, 30, 41]
    xt[masked] = model.mask_token
    ids = torch.tensor(xt[None])
    out = hf(input_ids=ids, output_hidden_states=True)
    assert hf.bert.attention_type == "block_sparse"
    logits = out.logits[0].T  # (N_V, ℓ)
    assert rel_err(model.logits(xt), logits.detach().numpy()) <= 1e-12
    assert rel_err(model.hidden(xt), out.hidden_states[-1][0].detach().numpy().T) <= 1e-12
    # HF's layouts matter: the same weights with the layouts drawn from layout_seed compute another function
    assert rel_err(ft.from_hf(hf).logits(xt), logits.detach().numpy()) > 1e-3
    # the MLM loss of Algorithm 12 line 9 on both sides, and every gradient
    loss_t = -torch.log_softmax(logits, dim=0)[torch.tensor(x[masked]), torch.tensor(masked)].sum()
    loss_t.backward()
    loss, grads = model.loss_and_grad(xt, x)
    assert abs(loss - loss_t.item()) <= 1e-12 * abs(loss)
    hp = dict(L=2, tied=True)
    named = dict(hf.named_parameters())
    seen = set()
    for a, k, kind in _bert_pairs(hp, True):
        t = named.get("bert." + a, named.get(a))
        gt = t.grad.numpy()
        gt = gt.T if kind == "T" else gt.reshape(2, -1, *gt.shape[1:]) if kind == "H" else gt
        seen.add(k)
        if k.endswith("b_k"):  # b_kᵀq_t is a constant of each column of S: 0 up to rounding on both sides
            assert np.abs(grads[k]).max() <= 1e-14 and np.abs(gt).max() <= 1e-14
            continue
        assert rel_err(grads[k], gt) <= 1e-12, (k, rel_err(grads[k], gt))
    assert seen == set(model.params)


def test_from_hf_bigbird_model_last_hidden_state_batch_and_exact_gelu():
    hf, torch = hf_bigbird("BigBirdModel", L=2, H=4, d=16, b=3, r=1, act="gelu")
    ls = (30, 36)  # 10 and 12 blocks of 3, both > (5 + 2)·3 = 21
    model = ft.from_hf(hf, bigbird_lengths=ls)
    assert model.config["gelu"] == "exact"
    rng = np.random.default_rng(8)
    for l in ls:
        xs = [rng.integers(1, 37, size=l) for _ in range(2)]  # HF: one batch of two rows (one layout for both)
        with torch.no_grad():
            want = hf(input_ids=torch.tensor(np.stack(xs))).last_hidden_state.numpy()
        for i, x in enumerate(xs):
            assert rel_err(model.hidden(x), want[i].T) <= 1e-12, l
        lay = model.bigbird_layouts(l // 3)
        assert not all(np.array_equal(lay[0, 0], lay[0, h]) for h in range(4))  # HF's heads differ


def test_hf_old_plans_at_1024_tokens_equal():
    """At ℓ ∈ {1024, 3072, 4096} HF draws with its "old plans" (_bigbird_block_rand_mask): in blocks of 16 with
    r = 1 a set (equal to HF); in blocks of 32 with r = 2 it draws a window block again (a multiset, kept as a
    multiplicity: test_bigbird_multiset.py proves that one equal to HF)."""
    transformers = pytest.importorskip("transformers")
    torch = torch_or_skip()
    kw = dict(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24,
              max_position_embeddings=1024, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, sep_token_id=None)
    hf = hf_random_float64(transformers.BigBirdModel, transformers.BigBirdConfig(block_size=16, num_random_blocks=1, **kw))
    model = ft.from_hf(hf.train(), bigbird_lengths=[1024])
    x = np.random.default_rng(11).integers(1, 37, size=1024)
    with torch.no_grad():
        want = hf(input_ids=torch.tensor(x[None])).last_hidden_state[0].numpy().T
    assert rel_err(model.hidden(x), want) <= 1e-12
    assert model.bigbird_layouts(64).dtype == bool  # no block repeated


def test_hf_layouts_are_those_of_the_mode_hf_was_in():
    """from_hf of a model in training mode installs training mode's layouts: it equals HF in training mode and
    differs from HF in eval mode (every random block at block 0; from_hf of an eval model installs that
    multiset, test_bigbird_multiset.py)."""
    hf, torch = hf_bigbird("BigBirdModel")
    l = 48
    model = ft.from_hf(hf, bigbird_lengths=[l])
    x = np.random.default_rng(9).integers(1, 37, size=l)
    with torch.no_grad():
        ev = hf.eval()(input_ids=torch.tensor(x[None])).last_hidden_state[0].numpy().T
        tr = hf.train()(input_ids=torch.tensor(x[None])).last_hidden_state[0].numpy().T
    assert rel_err(model.hidden(x), tr) <= 1e-12
    assert rel_err(model.hidden(x), ev) > 1e-6


def test_from_hf_bigbird_original_full_is_bert_shaped():
    hf, torch = hf_bigbird("BigBirdForMaskedLM", attention_type="original_full")
    model = ft.from_hf(hf)
    assert model.config.get("attention", "softmax") == "softmax"
    x = np.random.default_rng(10).integers(1, 37, size=13)
    with torch.no_grad():
        want = hf(input_ids=torch.tensor(x[None])).logits[0].numpy().T
    assert rel_err(model.logits(x), want) <= 1e-12


def test_from_hf_bigbird_refuses_what_it_cannot_express(tmp_path):
    hf, torch = hf_bigbird("BigBirdModel")
    hf.save_pretrained(tmp_path / "bb")
    with pytest.raises(ValueError, match="ft.from_hf"):
        ft.load_hf(tmp_path / "bb")  # the layouts come from HF's code, not from the files
    with pytest.raises(TypeError, match="integer"):
        ft.from_hf(hf, bigbird_lengths=[48.0])
    with pytest.raises(ValueError, match="original_full"):
        ft.from_hf(hf, bigbird_lengths=[36])  # ≤ (5 + 2r)·b: HF runs full attention there
    with pytest.raises(ValueError, match="divide"):
        ft.from_hf(hf, bigbird_lengths=[50])
    hf.config.hidden_act = "relu"
    with pytest.raises(ValueError, match="hidden_act"):
        ft.from_hf(hf)
    hf.config.hidden_act = "gelu_new"
    hf.config.rescale_embeddings = True
    with pytest.raises(ValueError, match="rescale_embeddings"):
        ft.from_hf(hf)
    transformers = pytest.importorskip("transformers")
    bert = transformers.BertModel(transformers.BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=1,
                                                          num_attention_heads=2, intermediate_size=8))
    with pytest.raises(ValueError, match="bigbird_lengths"):
        ft.from_hf(bert, bigbird_lengths=[48])
