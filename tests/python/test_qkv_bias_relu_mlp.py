"""The two parts the Qwen2 and OPT converters need (docs/variants.md): V20 qkv_bias (biases on Algorithm 4's lines 1–3
only, with bias=False: cpp/src/variants/qkv_bias.cpp and its registry row) and V21 mlp="relu" (Algorithm 10's MLP
with φ = ReLU: cpp/src/variants/relu_mlp.cpp and its registry row). The core against reference.py (float64 ≤ 1e-12,
float32 ≤ 1e-5), every gradient against PyTorch autograd of torch_variants.py and against finite differences,
cached, batched and tiled decoding against the full forward, saving, bad options."""
from __future__ import annotations

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref
from conftest import TOL, assert_grads_match_fd, randomize_theta, rel_err, torch_or_skip

BASE = (19, 12, 2, 4, 16, 20)  # n_vocab, l_max, L, H, d_e, d_mlp
OPTIONS = {
    "qkv_bias": dict(bias=False, qkv_bias=True),
    "qwen2": dict(positional="rope", H_kv=2, mlp="swiglu", bias=False, qkv_bias=True, norm="rms"),
    "relu": dict(mlp="relu"),
    "relu_no_bias": dict(mlp="relu", bias=False, tied=True),
}
REF_KEYS = ("norm", "positional", "mlp")
BATCH = [[3, 1, 4, 1, 5, 9, 2, 6, 5], [8, 9, 7, 9, 3]]


def make(opts, dtype="float64", L=BASE[2], **extra):
    return ft.DTransformer(*BASE[:2], L, *BASE[3:], dtype=dtype, seed=3, **opts, **extra)


def hp(opts):
    return dict(L=BASE[2], H=BASE[3], **{k: v for k, v in opts.items() if k in REF_KEYS})


def randomize(model, seed):
    return randomize_theta(model, np.random.default_rng(seed), skip=("W_u",) if model.config["tied"] else ())


def test_the_parameters_are_the_parts():
    q = make(OPTIONS["qkv_bias"])
    names = set(q.params)
    assert {"layers.0.attn.b_q", "layers.0.attn.b_k", "layers.0.attn.b_v"} <= names
    assert not any(k.endswith(("attn.b_o", "b_mlp1", "b_mlp2")) for k in names)
    assert q.params["layers.1.attn.b_k"].shape == (4, 4)
    r = make(OPTIONS["relu"])
    assert "layers.0.W_gate" not in r.params and "layers.0.b_mlp1" in r.params


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", list(OPTIONS))
def test_forward_matches_reference(name, dtype):
    opts = OPTIONS[name]
    model = make(opts, dtype)
    theta = randomize(model, 1)
    for x, P in zip(BATCH, model(BATCH)):
        assert rel_err(P, ref.d_transformer_variant(x, theta, **hp(opts))) <= TOL[dtype], name


def test_each_part_changes_the_function():
    """The biases and the ReLU matter: without them (the same θ otherwise) the reference differs."""
    model = make(OPTIONS["qkv_bias"])
    theta = randomize(model, 2)
    x = BATCH[0]
    no_b = {k: v for k, v in theta.items() if not k.endswith(("b_q", "b_v"))}
    assert rel_err(ref.d_transformer_variant(x, no_b, L=2, H=4), ref.d_transformer_variant(x, theta, L=2, H=4)) > 1e-6
    relu = make(OPTIONS["relu"])
    theta = randomize(relu, 2)
    assert rel_err(relu(x), ref.d_transformer_variant(x, theta, L=2, H=4)) > 1e-3  # GELU's listing differs
    assert rel_err(relu(x), ref.d_transformer_variant(x, theta, L=2, H=4, mlp="relu")) <= 1e-12


@pytest.mark.parametrize("name", list(OPTIONS))
def test_every_gradient_matches_torch_autograd(name):
    torch_or_skip()
    import torch_variants as tv

    opts = OPTIONS[name]
    model = make(opts)
    theta = randomize(model, 2)
    loss, grads = model.loss_and_grad(BATCH)
    t_loss, t_grads = tv.loss_and_grad(theta, BATCH, **hp(opts))
    assert abs(loss - t_loss) <= 1e-10 * abs(t_loss)
    assert set(t_grads) == set(grads) - ({"W_u"} if opts.get("tied") else set())
    scale = max(np.abs(g).max() for g in t_grads.values())
    for k, g in t_grads.items():
        if k.endswith(".b_k") and opts.get("positional") != "rope":  # the softmax ignores b_k (not under RoPE)
            assert np.abs(grads[k]).max() <= 1e-12 * scale
            continue
        assert rel_err(grads[k], g) <= 1e-8, (name, k)


@pytest.mark.parametrize("name", ["qwen2", "relu"])
def test_gradients_match_finite_differences(name):
    model = make(OPTIONS[name], L=1)
    randomize(model, 4)
    x = np.array([3, 1, 4, 1, 5, 9, 2])
    loss, grads = model.loss_and_grad(x)
    assert_grads_match_fd(model, grads, lambda: model.loss(x), b_k_zero=OPTIONS[name].get("positional") != "rope")


@pytest.mark.parametrize("name", ["qwen2", "relu"])
def test_cached_batched_and_tiled_decoding_equal_the_full_forward(name):
    model = make(OPTIONS[name])
    randomize(model, 5)
    prompts = [np.array([1, 2, 3, 4]), np.array([5]), np.array([7, 8, 9, 10, 11, 0, 1])]
    alone = [ft.DInference(5, 0.0, cache=False)(p, model) for p in prompts]
    for p, want in zip(prompts, alone):
        assert np.array_equal(ft.DInference(5, 0.0)(p, model), want)
    assert all(np.array_equal(b, w) for b, w in zip(ft.DInference(5, 0.0)(prompts, model), alone))  # batched (paged)
    tiled = make(OPTIONS[name], attention_impl="tiled")
    for k, v in model.params.items():
        tiled.params[k] = v
    x = np.arange(12) % 19
    assert rel_err(tiled(x), model(x)) <= 1e-12


def test_options_round_trip_and_save(tmp_path):
    for opts in OPTIONS.values():
        model = make(opts)
        assert ft.build_model(model.config_json()).config == model.config
        ft.save(model, tmp_path / "m.safetensors")
        back = ft.load(tmp_path / "m.safetensors")
        assert back.config == model.config and np.array_equal(back(BATCH[0]), model(BATCH[0]))
    assert make({}).config["qkv_bias"] is False and make({}).config["mlp"] == "gelu"
    assert "qkv_bias" in ft.model_options("DTransformer")


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(qkv_bias=True), ValueError, "qkv_bias=True .* give bias=False"),
    (dict(qkv_bias=True, bias=False, kv_lora_rank=4), ValueError, "qkv_bias|kv_lora_rank"),
    (dict(qkv_bias=1), TypeError, "qkv_bias"),
    (dict(mlp="Relu"), ValueError, "mlp must be one of"),
])
def test_bad_options_name_themselves(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        ft.DTransformer(*BASE, **kwargs)


def test_relu_is_a_decoder_mlp():
    with pytest.raises(TypeError, match="mlp"):
        ft.ETransformer(19, 12, 2, 4, 16, 20, 16, mlp="relu")
    ed = ft.EDTransformer(19, 12, 1, 1, 4, 16, 20, mlp="relu")  # Algorithm 8's own (standard) MLP
    assert ed.config["mlp"] == "relu"
