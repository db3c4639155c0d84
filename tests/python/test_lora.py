"""LoRA (docs/variants.md "LoRA"): the adapted model against the reference (reference.lora_params), finite
differences of A and B, peft's LoRA on the same Hugging Face GPT-2 and BERT (float64: outputs and the gradients of
A and B, and to_hf of the merged model against merge_and_unload), merge_lora, saving, bad input, training the
adapters alone."""
from __future__ import annotations

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as R
from formal_transformers.lora import LORA_PATTERNS
from conftest import TOL, assert_directional_fd, kind_inputs, numeric_grad, rel_err, replayed_loss

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")


def _adapted(dtype="float64", targets=("W_q", "W_v", "W_o", "W_mlp1", "W_mlp2"), r=2, alpha=3.0, seed=0, dropout=0.0):
    m = ft.DTransformer(23, 16, 2, 2, 8, 12, dtype=dtype, seed=seed)
    ft.lora(m, targets=targets, r=r, alpha=alpha, dropout=dropout)
    rng = np.random.default_rng(seed + 1)
    for k in m.params:
        if k.endswith(".lora_B"):
            m.params[k] = 0.3 * rng.standard_normal(m.params[k].shape)
    return m


def _seqs(n=2, seed=2):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 20, size=l) for l in (7, 5, 6)[:n]]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_adapted_model_equals_the_reference(dtype):
    m = _adapted(dtype)
    theta = R.lora_params(m.params, alpha=3.0, r=2)
    for x in _seqs(2):
        ref = R.d_transformer(x, {k: v.astype(np.float64) for k, v in theta.items()}, L=2, H=2)
        assert rel_err(m(x), ref) <= TOL[dtype]


def test_a_and_b_gradients_match_finite_differences():
    m = _adapted()
    x = _seqs(2)
    _, grads = m.loss_and_grad(x)
    for k in [k for k in m.params if "lora" in k]:
        fd = numeric_grad(lambda: m.loss(x), m.params[k], h=1e-5)
        assert rel_err(grads[k], fd) <= 1e-6, k
    # the base weights' gradients are ∂loss/∂W' (W' = W + s·B·A), also by finite differences
    fd = numeric_grad(lambda: m.loss(x), m.params["layers.1.attn.W_v"], h=1e-5)
    assert rel_err(grads["layers.1.attn.W_v"], fd) <= 1e-6


def test_lora_starts_at_the_model_and_merge_is_exact():
    m = ft.DTransformer(23, 16, 2, 2, 8, 12, dtype="float64", seed=0)
    x = _seqs(1)[0]
    P0 = m(x)
    ft.lora(m, r=2, alpha=16)
    assert m.lora["adapted"] == ["layers.0.attn.W_q", "layers.0.attn.W_v", "layers.1.attn.W_q", "layers.1.attn.W_v"]
    assert np.array_equal(m(x), P0)  # B = 0
    a = m.params["layers.0.attn.W_q.lora_A"]
    assert a.shape == (2, 8) and np.all(np.abs(a) <= 1 / np.sqrt(8)) and np.any(a != 0)
    m.params["layers.0.attn.W_q.lora_B"] = np.ones((8, 2))
    P1 = m(x)
    theta = R.lora_params(m.params, alpha=16, r=2)
    m.merge_lora()
    assert m.lora is None and not [k for k in m.params if "lora" in k]
    assert rel_err(m(x), P1) <= 1e-12
    assert rel_err(m.params["layers.0.attn.W_q"], theta["layers.0.attn.W_q"]) <= 1e-15


def test_save_and_load_keep_the_adapters(tmp_path):
    m = _adapted()
    x = _seqs(1)[0]
    ft.save(m, tmp_path / "m.safetensors")
    back = ft.load(tmp_path / "m.safetensors")
    assert back.lora == m.lora
    assert np.array_equal(back(x), m(x))
    assert list(back.params) == list(m.params)


@pytest.mark.parametrize("kw, words", [
    (dict(r=0), "r must be >= 1"),
    (dict(r=9), "r = 9 is larger than a dimension of layers.0.attn.W_q"),
    (dict(targets=["b_q"]), "layers.0.attn.b_q, which is not a matrix"),
    (dict(targets=["gamma1"]), "not a matrix"),
    (dict(targets=["W_e"]), "W_e, which is not an attention or MLP matrix"),
    (dict(targets=["W_q", "W_nothing"]), "'W_nothing' matches no parameter"),
    (dict(alpha=0.0), "alpha"),
    (dict(dropout=-0.1), "dropout must be in \\[0, 1\\)"),
    (dict(dropout=1.0), "dropout must be in \\[0, 1\\)"),
    (dict(dropout=float("nan")), "dropout must be in \\[0, 1\\)"),
    (dict(dropout=float("inf")), "dropout must be in \\[0, 1\\)"),
    (dict(targets=[]), "targets is empty"),
])
def test_bad_input_is_a_value_error_before_anything_changes(kw, words):
    m = ft.DTransformer(23, 16, 2, 2, 8, 12, dtype="float64", seed=0)
    before = {k: v.copy() for k, v in m.params.items()}
    with pytest.raises(ValueError, match=words):
        ft.lora(m, **kw)
    assert m.lora is None and list(m.params) == list(before)
    assert all(np.array_equal(m.params[k], before[k]) for k in before)


def test_type_errors_and_twice():
    m = ft.DTransformer(23, 16, 1, 2, 8, 12, seed=0)
    with pytest.raises(TypeError):
        ft.lora(m, r=2.5)
    with pytest.raises(TypeError):
        ft.lora("model")
    for bad in ("0.1", None, True):
        with pytest.raises(TypeError, match="dropout"):
            ft.lora(m, r=1, dropout=bad)
    assert m.lora is None
    with pytest.raises(ValueError, match="no LoRA adapters"):
        m.merge_lora()
    ft.lora(m, r=1)
    with pytest.raises(ValueError, match="already has LoRA adapters"):
        ft.lora(m, r=1)


def test_training_the_adapters_alone():
    m = _adapted(targets=("W_q", "W_v"))
    before = {k: v.copy() for k, v in m.params.items()}
    trainer = ft.DTraining(3, 1e-2, trainable=list(LORA_PATTERNS), progress=False)
    trainer(_seqs(3), m)
    for k, v in m.params.items():
        assert np.array_equal(v, before[k]) == ("lora" not in k), k
    n_lora = sum(v.size for k, v in m.params.items() if "lora" in k)
    assert trainer.optimizer.state_dict()["m"].size == n_lora


# ---------------------------------------------------------------------------------------------------
# peft on the same Hugging Face models (float64)

def _random(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.3
            p.copy_(r + 1 if name.endswith("weight") and ("ln_" in name or "LayerNorm" in name) else r)
    return module


def _peft(hf, targets, r, alpha, fan_in_fan_out, dropout=0.0):
    cfg = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=dropout,
                          fan_in_fan_out=fan_in_fan_out, init_lora_weights=True)
    pm = peft.get_peft_model(hf, cfg)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.3)
    return pm


def _copy_adapters(pm, model, names):
    """peft's A, B (lora_A.default.weight (r, d_in), lora_B … (d_out, r)) into the model's <W>.lora_A / .lora_B."""
    sd = {k: v.detach().numpy() for k, v in pm.named_parameters() if "lora_" in k}
    pairs = {}
    for hf_part, ours in names:
        for layer in range(2):
            stem = [k for k in sd if f".{layer}.{hf_part}.lora_A" in k]
            assert len(stem) == 1, (hf_part, stem)
            a = stem[0]
            b = a.replace("lora_A", "lora_B")
            model.params[f"layers.{layer}.{ours}.lora_A"] = sd[a]
            model.params[f"layers.{layer}.{ours}.lora_B"] = sd[b]
            pairs[(a, b)] = f"layers.{layer}.{ours}"
    return pairs


def _check_grads(pm, model, pairs, grads):
    grad = {k: p.grad.numpy() for k, p in pm.named_parameters() if "lora_" in k}
    for (a, b), ours in pairs.items():
        assert rel_err(grads[ours + ".lora_A"], grad[a]) <= 1e-10, ours
        assert rel_err(grads[ours + ".lora_B"], grad[b]) <= 1e-10, ours


def test_equal_to_peft_on_gpt2():
    V = 40
    hf = _random(transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=V, n_embd=8, n_layer=2, n_head=2, n_positions=16, n_inner=12, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0)).to(torch.float64)).eval()
    model = ft.from_hf(hf)
    ft.lora(model, targets=("W_o", "W_mlp1", "W_mlp2"), r=2, alpha=3)
    pm = _peft(hf, ["attn.c_proj", "mlp.c_fc", "mlp.c_proj"], 2, 3, True)
    ADAPTED = ("attn.c_proj.weight", "mlp.c_fc.weight")
    pairs = _copy_adapters(pm, model, [("attn.c_proj", "attn.W_o"), ("mlp.c_fc", "W_mlp1"), ("mlp.c_proj", "W_mlp2")])
    x = np.random.default_rng(0).integers(0, V, size=9)
    logits = pm(input_ids=torch.tensor(x[None])).logits[0]
    assert rel_err(model(x), torch.softmax(logits, -1).detach().numpy().T) <= 1e-10
    loss_hf = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(x[1:]), reduction="sum")
    loss_hf.backward()
    loss, grads = model.loss_and_grad(x)
    assert abs(loss - loss_hf.item()) <= 1e-10 * abs(loss)
    _check_grads(pm, model, pairs, grads)
    # merged: to_hf equals peft's merge_and_unload
    model.merge_lora()
    merged = pm.merge_and_unload()
    ours = ft.to_hf(model).state_dict()
    compared = [k for k, v in merged.state_dict().items() if k in ours and v.dtype.is_floating_point]
    assert {k for k in compared if k.endswith(ADAPTED)} and len(compared) >= len(ours) - 2
    for k in compared:
        assert rel_err(ours[k].numpy(), merged.state_dict()[k].numpy()) <= 1e-10, k


def test_equal_to_peft_on_bert():
    V = 40
    hf = _random(transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=V, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=12,
        max_position_embeddings=16, type_vocab_size=2, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0)).to(torch.float64)).eval()
    model = ft.from_hf(hf)
    ft.lora(model, targets=("W_q", "W_v"), r=2, alpha=5)
    pm = _peft(hf, ["query", "value"], 2, 5, False)
    ADAPTED = ("query.weight", "value.weight")
    pairs = _copy_adapters(pm, model, [("attention.self.query", "attn.W_q"), ("attention.self.value", "attn.W_v")])
    rng = np.random.default_rng(1)
    x = rng.integers(0, V - 3, size=9)
    xt = x.copy()
    xt[[1, 4, 6]] = model.mask_token
    logits = pm(input_ids=torch.tensor(xt[None])).logits[0]
    assert rel_err(model(xt), torch.softmax(logits, -1).detach().numpy().T) <= 1e-10
    m = torch.tensor(xt == model.mask_token)
    loss_hf = torch.nn.functional.cross_entropy(logits[m], torch.tensor(x)[m], reduction="sum")
    loss_hf.backward()
    loss, grads = model.loss_and_grad(xt, x)
    assert abs(loss - loss_hf.item()) <= 1e-10 * abs(loss)
    _check_grads(pm, model, pairs, grads)
    P = model(xt)
    model.merge_lora()
    assert rel_err(model(xt), P) <= 1e-12
    merged = pm.merge_and_unload()
    ours = ft.to_hf(model).state_dict()
    compared = [k for k, v in merged.state_dict().items() if k in ours and v.dtype.is_floating_point]
    assert {k for k in compared if k.endswith(ADAPTED)} and len(compared) >= len(ours) - 2
    for k in compared:
        assert rel_err(ours[k].numpy(), merged.state_dict()[k].numpy()) <= 1e-10, k


# ---------------------------------------------------------------------------------------------------
# Dropout on the adapter's input (lines 2′–3′): a training forward computes W x + s·B·A·Dropout(x), with the
# model's dropout masks (dropout_masks()[<W>.lora_dropout], keyed by dropout_step: a step replays)

P = 0.3


def test_dropout_training_equals_the_reference_with_the_same_masks():
    m = _adapted(dropout=P)
    x1, x2 = _seqs(2)
    loss, _ = m.loss_and_grad([x1, x2])
    masks = m.dropout_masks()
    assert sorted(masks) == sorted(n + ".lora_dropout" for n in m.lora["adapted"])
    params = {k: np.asarray(v) for k, v in m.params.items()}
    for name in m.lora["adapted"]:  # (d_in, n) over the batch's columns
        assert masks[name + ".lora_dropout"].shape == (params[name].shape[-1], len(x1) + len(x2))
    total = 0.0
    for x, cols in ((x1, slice(0, len(x1))), (x2, slice(len(x1), None))):
        theta = R.lora_params(params, alpha=3.0, r=2, masks={k: M[:, cols] for k, M in masks.items()}, dropout=P)
        assert isinstance(theta["layers.0.attn.W_q"], R.LoraDropped)
        total += R.d_loss(x, theta, L=2, H=2)
    assert abs(loss - total) <= 1e-12 * abs(total)
    kept = np.concatenate([M.ravel() for M in masks.values()])
    assert 0.55 < kept.mean() < 0.85  # a fraction p dropped (3 binomial σ of 728 entries: ±0.05)
    # line 2 (no dropout, W') gives another loss: the evaluating one
    assert abs(m.loss([x1, x2]) - loss) > 1e-6
    assert abs(R.d_loss(x1, R.lora_params(params, alpha=3.0, r=2), L=2, H=2)
               + R.d_loss(x2, R.lora_params(params, alpha=3.0, r=2), L=2, H=2) - loss) > 1e-6


def test_dropout_gradients_match_finite_differences_on_the_same_masks():
    m = _adapted(dropout=P)
    x = _seqs(2)
    step = m.dropout_step
    _, g = m.loss_and_grad(x, copy=True)
    assert m.dropout_step == step + 1
    # A and B entry by entry, every parameter along a random direction (the base W: ∂loss/∂W, no longer ∂loss/∂W';
    # upstream ones: ∂loss/∂X through D2)
    for k in ("layers.0.attn.W_q.lora_A", "layers.0.attn.W_q.lora_B", "layers.1.W_mlp2.lora_A", "layers.1.W_mlp2.lora_B"):
        fd = numeric_grad(lambda: replayed_loss(m, [x], step), m.params[k], h=1e-5)
        assert rel_err(g[k], fd) <= 1e-6, k
    assert_directional_fd(m, [x], step, g, np.random.default_rng(7))
    # d1 (∂loss/∂A = s·Bᵀ ∂loss/∂W') no longer holds: A saw the dropped input
    B, dW = m.params["layers.0.attn.W_v.lora_B"], g["layers.0.attn.W_v"].reshape(-1, 8)
    assert rel_err(g["layers.0.attn.W_v.lora_A"], 1.5 * B.T @ dW) > 1e-3


@pytest.mark.parametrize("kind, make, targets", [
    ("d", lambda: ft.DTransformer(23, 16, 1, 2, 8, 12, dtype="float64", seed=0, mlp="swiglu", bias=False, norm="rms"),
     ("W_q", "W_k", "W_v", "W_o", "W_gate", "W_mlp1", "W_mlp2")),
    ("d", lambda: ft.DTransformer(23, 16, 1, 2, 16, 12, dtype="float64", seed=0, positional="rope", bias=False,
                                  kv_lora_rank=8, qk_rope_head_dim=4), ("W_q", "W_o", "W_mlp1")),
    ("e", lambda: ft.ETransformer(23, 16, 1, 2, 8, 12, 8, dtype="float64", seed=0), ("W_k", "W_o", "W_mlp2")),
    ("ed", lambda: ft.EDTransformer(23, 16, 1, 1, 2, 8, 12, dtype="float64", seed=0),
     ("W_q", "W_k", "W_v", "W_o", "W_mlp1", "W_mlp2", "W_mlp3", "W_mlp4")),
])
def test_every_adaptable_matrix_drops_its_input(kind, make, targets):
    """The gated MLP's W_gate, latent attention's W_q, an encoder's, the decoder's cross-attention and W_mlp3/4."""
    m = make()
    ft.lora(m, targets=targets, r=2, alpha=3.0, dropout=0.4)
    rng = np.random.default_rng(3)
    for k in m.params:
        if k.endswith(".lora_B"):
            m.params[k] = 0.3 * rng.standard_normal(m.params[k].shape)
    inp = kind_inputs(kind, rng, 20, 7, 5, masked=(1, 4))
    step = m.dropout_step
    _, g = m.loss_and_grad(*inp, copy=True)
    assert sorted(m.dropout_masks()) == sorted(n + ".lora_dropout" for n in m.lora["adapted"])
    assert_directional_fd(m, inp, step, g, rng)


def test_inference_ignores_the_adapters_dropout_and_p_0_is_line_2():
    a, b = _adapted(dropout=0.4), _adapted(dropout=0.0)  # the same θ
    assert all(np.array_equal(a.params[k], b.params[k]) for k in a.params)
    x = _seqs(2)
    assert np.array_equal(a(x[0]), b(x[0])) and a.loss(x) == b.loss(x)
    # p = 0: no mask, the training forward is line 2 (W'), bit for bit the evaluating loss, and d1 holds
    loss_b, gb = b.loss_and_grad(x, copy=True)
    assert b.dropout_masks() == {} and loss_b == b.loss(x)
    B, dW = b.params["layers.0.attn.W_v.lora_B"], gb["layers.0.attn.W_v"].reshape(-1, 8)
    assert rel_err(gb["layers.0.attn.W_v.lora_A"], 1.5 * B.T @ dW) <= 1e-12
    # p > 0 drops in training only; an evaluating forward afterwards is line 2 again and forgets the masks
    loss_a, _ = a.loss_and_grad(x, copy=True)
    assert a.dropout_masks() and loss_a != loss_b
    assert np.array_equal(a(x[0]), b(x[0])) and a.dropout_masks() == {}


def test_training_with_adapter_dropout_is_reproducible_and_saved(tmp_path):
    def run(p):
        m = _adapted(targets=("W_q", "W_v"), dropout=p)
        ft.DTraining(2, 1e-2, trainable=list(LORA_PATTERNS), progress=False)(_seqs(3), m)
        return m

    a, b, c = run(P), run(P), run(0.0)
    assert all(np.array_equal(a.params[k], b.params[k]) for k in a.params)
    assert not np.array_equal(a.params["layers.0.attn.W_q.lora_B"], c.params["layers.0.attn.W_q.lora_B"])
    ft.save(a, tmp_path / "a.safetensors")
    back = ft.load(tmp_path / "a.safetensors")
    assert back.lora == a.lora and back.lora["dropout"] == P
    x = _seqs(2)
    back.dropout_step, back.dropout_seed = a.dropout_step, a.dropout_seed
    la, lb = a.loss_and_grad(x, copy=True)[0], back.loss_and_grad(x, copy=True)[0]
    assert la == lb and a.dropout_masks().keys() == back.dropout_masks().keys()
    assert all(np.array_equal(a.dropout_masks()[k], back.dropout_masks()[k]) for k in a.dropout_masks())


class _FixedDropout(torch.nn.Module):
    """peft's lora_dropout (nn.Dropout on the adapter's input) with our mask M (d_in, ℓ): x ⊙ Mᵀ / (1 − p)."""

    def __init__(self, M, p):
        super().__init__()
        self.M, self.p = torch.tensor(np.asarray(M).T[None], dtype=torch.float64), p

    def forward(self, x):
        return x * self.M / (1 - self.p)


@pytest.mark.parametrize("arch", ["gpt2", "bert"])
def test_dropout_gradients_equal_torch_autograd_through_peft_on_the_same_masks(arch):
    V = 40
    if arch == "gpt2":
        hf = _random(transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=V, n_embd=8, n_layer=2, n_head=2, n_positions=16, n_inner=12, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0)).to(torch.float64)).eval()
        targets, hf_targets, alpha, fan = ("W_o", "W_mlp1", "W_mlp2"), ["attn.c_proj", "mlp.c_fc", "mlp.c_proj"], 3, True
        names = [("attn.c_proj", "attn.W_o"), ("mlp.c_fc", "W_mlp1"), ("mlp.c_proj", "W_mlp2")]
    else:
        hf = _random(transformers.BertForMaskedLM(transformers.BertConfig(
            vocab_size=V, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=12,
            max_position_embeddings=16, type_vocab_size=2, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0)).to(torch.float64)).eval()
        targets, hf_targets, alpha, fan = ("W_q", "W_v"), ["query", "value"], 5, False
        names = [("attention.self.query", "attn.W_q"), ("attention.self.value", "attn.W_v")]
    model = ft.from_hf(hf)
    ft.lora(model, targets=targets, r=2, alpha=alpha, dropout=P)
    pm = _peft(hf, hf_targets, 2, alpha, fan, dropout=P)
    pairs = _copy_adapters(pm, model, names)
    rng = np.random.default_rng(1)
    x = rng.integers(0, V - 3, size=9)
    if arch == "gpt2":
        loss, grads = model.loss_and_grad(x)
        inp, scored, target = x, slice(0, -1), torch.tensor(x[1:])
    else:
        xt = x.copy()
        xt[[1, 4, 6]] = model.mask_token
        loss, grads = model.loss_and_grad(xt, x)
        inp, scored, target = xt, torch.tensor(xt == model.mask_token), torch.tensor(x)[torch.tensor(xt == model.mask_token)]
    masks = model.dropout_masks()
    assert len(masks) == len(pairs)
    for (a, _), ours in pairs.items():  # peft's dropout module of that adapter, on our mask
        pm.get_submodule(a.split(".lora_A")[0]).lora_dropout["default"] = _FixedDropout(masks[ours + ".lora_dropout"], P)
    logits = pm(input_ids=torch.tensor(inp[None])).logits[0]
    loss_hf = torch.nn.functional.cross_entropy(logits[scored], target, reduction="sum")
    loss_hf.backward()
    assert abs(loss - loss_hf.item()) <= 1e-10 * abs(loss)
    _check_grads(pm, model, pairs, grads)
    # peft without the masks (evaluation) is our evaluating forward: the loss differs from the training one
    assert abs(model.loss(*([x] if arch == "gpt2" else [xt, x])) - loss) > 1e-6


def test_lora_and_merge_keep_the_models_precision():
    # ft.lora and merge_lora rebuild the model's unit: a bf16-mixed model stays bf16-mixed (it used to come back
    # float32), and its adapted outputs are those of a model made bf16-mixed again by hand
    m = ft.DTransformer(23, 16, 2, 2, 8, 12, seed=0, precision="bf16-mixed")
    ft.lora(m, targets=("W_q", "W_v"), r=2)
    assert m.precision == "bf16-mixed"
    x = _seqs(1)[0]
    out = np.array(m(x))
    m.precision = "float32"
    m.precision = "bf16-mixed"
    np.testing.assert_array_equal(np.array(m(x)), out)
    m.merge_lora()
    assert m.precision == "bf16-mixed"
    assert ft.lora(ft.DTransformer(23, 16, 2, 2, 8, 12, seed=0), r=2).precision == "float32"
