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
from conftest import TOL, numeric_grad, rel_err

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")


def _adapted(dtype="float64", targets=("W_q", "W_v", "W_o", "W_mlp1", "W_mlp2"), r=2, alpha=3.0, seed=0):
    m = ft.DTransformer(23, 16, 2, 2, 8, 12, dtype=dtype, seed=seed)
    ft.lora(m, targets=targets, r=r, alpha=alpha)
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
    (dict(dropout=0.1), "dropout"),
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


def _peft(hf, targets, r, alpha, fan_in_fan_out):
    cfg = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0,
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
