"""ft.from_hf / to_hf / save_hf / load_hf and ft.to_torch / from_torch.

Every supported transformers class is made from a small random config with every weight, bias and norm
parameter randomised (so a wrong mapping cannot hide); ft's P and the gradient of every parameter must equal
the HF model's on a padded batch with attention_mask (float64, ≤1e-10, against a float64 cross-entropy of
HF's logits). Round trips are exact; bad input raises ValueError naming the problem. No network: models
come from configs (HF_HUB_OFFLINE=1)."""
import copy
import json
import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import formal_transformers as ft  # noqa: E402

from conftest import rel_err  # noqa: E402

TOL64 = 1e-10
V, LMAX = 23, 12


def _randomise(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype) * 0.3
            is_gain = name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")) or "LayerNorm.weight" in name
            p.copy_(r + 1 if is_gain else r)
    return module


def _gpt2(cls_name="GPT2LMHeadModel", dtype=torch.float64, **kw):
    cfg = dict(vocab_size=V, n_embd=8, n_layer=2, n_head=2, n_positions=LMAX, n_inner=12, layer_norm_epsilon=1e-4,
               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=V - 2, eos_token_id=V - 1)
    cfg.update(kw)
    m = getattr(transformers, cls_name)(transformers.GPT2Config(**cfg))
    return _randomise(m.to(dtype)).eval()


def _bert(cls_name="BertForMaskedLM", dtype=torch.float64, **kw):
    cfg = dict(vocab_size=V, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=12,
               max_position_embeddings=LMAX, type_vocab_size=3, layer_norm_eps=1e-7, hidden_dropout_prob=0.0,
               attention_probs_dropout_prob=0.0)
    cfg.update(kw)
    m = getattr(transformers, cls_name)(transformers.BertConfig(**cfg))
    return _randomise(m.to(dtype)).eval()


LENGTHS = [7, 4, 6]


def _padded(seqs, pad=0):
    B, l = len(seqs), max(len(s) for s in seqs)
    ids = np.full((B, l), pad, dtype=np.int64)
    mask = np.zeros((B, l), dtype=np.int64)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = s
        mask[b, : len(s)] = 1
    return torch.tensor(ids), torch.tensor(mask)


def _grads_as_ft(hf_model):
    """HF's .grad of every parameter, laid out as ft params: a copy of the model holding the gradients as its
    weights, read by ft.from_hf (the mapping the forward comparison has already checked)."""
    c = copy.deepcopy(hf_model)
    with torch.no_grad():
        for p, q in zip(hf_model.parameters(), c.parameters()):
            q.copy_(p.grad if p.grad is not None else torch.zeros_like(p))
    return {k: np.array(v) for k, v in ft.from_hf(c).params.items()}


def _assert_grads(ft_grads, hf_grads, names=None):
    for k in names or hf_grads:
        if k.endswith("b_k"):  # softmax ignores b_k: both are rounding noise around 0
            assert np.abs(ft_grads[k]).max() < 1e-12 and np.abs(hf_grads[k]).max() < 1e-12, k
        else:
            assert rel_err(ft_grads[k], hf_grads[k]) <= TOL64, k


def _assert_loss_and_grads(model, inputs, loss_hf, hf, skip=(), **kw):
    """HF's loss backpropagated; the model's loss_and_grad(*inputs, **kw) equal to it and to HF's gradients
    (all but the names in `skip`); returns the model's gradients."""
    loss_hf.backward()
    loss, grads = model.loss_and_grad(*inputs, **kw)
    assert abs(loss - loss_hf.item()) <= TOL64 * abs(loss)
    body = _grads_as_ft(hf)
    _assert_grads(grads, body, [k for k in body if k not in skip])
    return grads


# ---------------------------------------------------------------------------------------------------
# GPT-2

@pytest.mark.parametrize("kw", [dict(), dict(activation_function="gelu", tie_word_embeddings=False),
                                dict(activation_function="gelu_pytorch_tanh")])
def test_gpt2_lm_head_P_and_every_gradient(kw):
    hf = _gpt2(**kw)
    model = ft.from_hf(hf)
    assert model.config["dtype"] == "float64" and model.config["tied"] == kw.get("tie_word_embeddings", True)
    assert model.config["gelu"] == ("exact" if kw.get("activation_function") == "gelu" else "tanh")
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, V, n) for n in LENGTHS]
    ids, mask = _padded(seqs)
    logits = hf(input_ids=ids, attention_mask=mask).logits  # (B, ℓ, V)
    P = model(seqs)
    loss_hf = 0
    for b, s in enumerate(seqs):
        n = len(s)
        assert rel_err(P[b], torch.softmax(logits[b, :n], -1).detach().numpy().T) <= TOL64
        loss_hf = loss_hf + torch.nn.functional.cross_entropy(logits[b, : n - 1], torch.tensor(s[1:]), reduction="sum")
    _assert_loss_and_grads(model, (seqs,), loss_hf, hf)


def test_gpt2_model_hidden_state_and_gradients():
    hf = _gpt2("GPT2Model")
    model = ft.from_hf(hf)
    assert model.config["tied"]
    rng = np.random.default_rng(1)
    seqs = [rng.integers(0, V, n) for n in LENGTHS]
    ids, mask = _padded(seqs)
    h = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    logits = h @ hf.wte.weight.T  # GPT-2's tied head over GPT2Model's output: W_u X with W_u = W_eᵀ
    loss_hf = 0
    for b, s in enumerate(seqs):
        n = len(s)
        assert rel_err(model.logits(s), logits[b, :n].detach().numpy().T) <= TOL64
        loss_hf = loss_hf + torch.nn.functional.cross_entropy(logits[b, : n - 1], torch.tensor(s[1:]), reduction="sum")
    _assert_loss_and_grads(model, (seqs,), loss_hf, hf)


def test_gpt2_float32():
    hf = _gpt2(dtype=torch.float32)
    model = ft.from_hf(hf)
    assert model.config["dtype"] == "float32"
    x = np.array([3, 1, 4, 1, 5, 9, 2])
    ref = torch.softmax(hf(torch.tensor(x)[None]).logits[0], -1).detach().numpy().T
    assert rel_err(model(x), ref) <= 1e-5
    assert ft.from_hf(hf, dtype="float64").config["dtype"] == "float64"


# ---------------------------------------------------------------------------------------------------
# BERT

def _mlm_batch(rng, mask_token, pad=0):
    x = [rng.integers(1, V - 3, n) for n in LENGTHS]  # real ids avoid the pad id (HF's padding_idx) and specials
    xt = [s.copy() for s in x]
    for s in xt:
        s[rng.choice(len(s), 2, replace=False)] = mask_token
    seg = [np.sort(rng.integers(0, 3, n)) for n in LENGTHS]
    return x, xt, seg


@pytest.mark.parametrize("kw", [dict(), dict(hidden_act="gelu_new", tie_word_embeddings=False)])
def test_bert_mlm_P_and_every_gradient(kw):
    hf = _bert(**kw)
    model = ft.from_hf(hf)
    cfg = model.config
    assert (cfg["n_segments"], cfg["embed_norm"], cfg["unembed_bias"], cfg["eps"]) == (3, True, True, 1e-7)
    rng = np.random.default_rng(2)
    x, xt, seg = _mlm_batch(rng, model.mask_token)
    ids, mask = _padded(xt)
    tt, _ = _padded(seg)
    out = hf(input_ids=ids, attention_mask=mask, token_type_ids=tt, output_hidden_states=True)
    P = model(xt, segments=seg)
    Hd = model.hidden(xt, segments=seg)
    loss_hf = 0
    for b in range(len(x)):
        n = len(x[b])
        assert rel_err(P[b], torch.softmax(out.logits[b, :n], -1).detach().numpy().T) <= TOL64
        assert rel_err(Hd[b], out.hidden_states[-1][b, :n].detach().numpy().T) <= TOL64
        m = torch.tensor(xt[b] == model.mask_token)
        loss_hf = loss_hf + torch.nn.functional.cross_entropy(out.logits[b, :n][m], torch.tensor(x[b])[m], reduction="sum")
    _assert_loss_and_grads(model, (xt, x), loss_hf, hf, segments=seg)


def test_bert_model_hidden_state_and_gradients():
    hf = _bert("BertModel")
    model = ft.from_hf(hf)
    rng = np.random.default_rng(3)
    x, xt, seg = _mlm_batch(rng, model.mask_token)
    ids, mask = _padded(xt)
    tt, _ = _padded(seg)
    h = hf(input_ids=ids, attention_mask=mask, token_type_ids=tt).last_hidden_state
    # BertModel has no MLM head: lines 10–12 with the ft model's own head parameters, written in torch
    p = {k: torch.tensor(np.array(v), requires_grad=True) for k, v in model.params.items()
         if k in ("W_f", "b_f", "gamma", "beta", "b_u")}
    G = torch.nn.functional.gelu(h @ p["W_f"].T + p["b_f"])
    X = torch.nn.functional.layer_norm(G, (8,), p["gamma"], p["beta"], 1e-7)
    logits = X @ hf.embeddings.word_embeddings.weight.T + p["b_u"]
    Hd = model.hidden(xt, segments=seg)
    loss_hf = 0
    for b in range(len(x)):
        n = len(x[b])
        assert rel_err(Hd[b], h[b, :n].detach().numpy().T) <= TOL64
        m = torch.tensor(xt[b] == model.mask_token)
        loss_hf = loss_hf + torch.nn.functional.cross_entropy(logits[b, :n][m], torch.tensor(x[b])[m], reduction="sum")
    grads = _assert_loss_and_grads(model, (xt, x), loss_hf, hf, skip=p, segments=seg)
    for k, v in p.items():
        assert rel_err(grads[k], v.grad.numpy()) <= TOL64, k


def test_bert_float32_and_default_segments():
    hf = _bert(dtype=torch.float32)
    model = ft.from_hf(hf)
    x = np.array([5, 9, 2, 6, 5, 3])
    h = hf(torch.tensor(x)[None]).logits[0].detach().numpy().T  # token_type_ids default: 0
    assert rel_err(model.logits(x), h) <= 1e-5


# ---------------------------------------------------------------------------------------------------
# round trips

def _same_params(a, b):
    assert list(a.params) == list(b.params)
    for k in a.params:
        assert a.params[k].dtype == b.params[k].dtype
        np.testing.assert_array_equal(a.params[k], b.params[k], err_msg=k)


def _native(kind, dtype="float64", **kw):
    if kind == "d":
        m = ft.DTransformer(V, LMAX, 2, 2, 8, 12, dtype=dtype, seed=4, init_std=0.3, **kw)
    else:
        m = ft.ETransformer(V, LMAX, 2, 2, 8, 12, 8, dtype=dtype, seed=4, init_std=0.3, n_segments=2,
                            embed_norm=True, unembed_bias=True, **kw)
    rng = np.random.default_rng(5)
    for k, p in m.params.items():
        if k.split(".")[-1].startswith(("gamma", "beta", "b_")):
            p[...] = rng.normal(0, 0.3, p.shape) + (1 if "gamma" in k else 0)
    return m


_IGNORE = ("seed", "init_std")


def _cfg(m):
    return {k: v for k, v in m.config.items() if k not in _IGNORE}


@pytest.mark.parametrize("kind,kw", [("d", dict(tied=True, gelu="tanh")), ("d", dict(tied=False)),
                                     ("e", dict(tied=True)), ("e", dict(tied=False, gelu="tanh"))])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_round_trip_ft_hf_ft_is_exact(kind, kw, dtype):
    m = _native(kind, dtype, **kw)
    hf = ft.to_hf(m)
    assert type(hf).__name__ == ("GPT2LMHeadModel" if kind == "d" else "BertForMaskedLM")
    assert next(hf.parameters()).dtype == getattr(torch, dtype)
    back = ft.from_hf(hf)
    _same_params(m, back)
    assert _cfg(back) == _cfg(m)
    x = np.array([1, 7, 3, 9, 4])
    out = hf(torch.tensor(x)[None]).logits[0].detach().numpy().T
    assert rel_err(m.logits(x), out) <= (TOL64 if dtype == "float64" else 1e-5)


@pytest.mark.parametrize("kind", ["d", "e"])
def test_round_trip_save_hf_from_pretrained_load_hf_is_exact(kind, tmp_path):
    m = _native(kind, tied=kind == "d")
    ft.save_hf(m, tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]
    auto = transformers.AutoModelForCausalLM if kind == "d" else transformers.AutoModelForMaskedLM
    hf, info = auto.from_pretrained(tmp_path, dtype=torch.float64, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    _same_params(m, ft.from_hf(hf))
    back = ft.load_hf(tmp_path)  # safetensors alone
    _same_params(m, back)
    assert _cfg(back) == _cfg(m)
    x = np.array([2, 8, 3, 3, 10, 5])
    assert rel_err(m.logits(x), hf(torch.tensor(x)[None]).logits[0].detach().numpy().T) <= TOL64


def test_load_hf_of_save_pretrained_directories(tmp_path):
    for i, hf in enumerate([_gpt2(), _gpt2("GPT2Model"), _bert(), _bert("BertModel")]):
        d = tmp_path / str(i)
        hf.save_pretrained(d)
        m = ft.load_hf(d)
        ref = ft.from_hf(hf)
        for k in ref.params:
            if not (type(hf).__name__ == "BertModel" and k in ("W_f", "b_f", "gamma", "beta", "b_u")):
                np.testing.assert_array_equal(m.params[k], ref.params[k], err_msg=k)


def test_load_hf_needs_no_transformers(tmp_path):
    import subprocess
    import sys

    ft.save_hf(_native("e"), tmp_path)
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(ft.__file__)))
    env = dict(os.environ, PYTHONPATH=pkg)
    if env.get("FT_CORE_PATH"):
        env["FT_CORE_PATH"] = os.path.abspath(env["FT_CORE_PATH"])
    code = ("import sys; sys.modules['transformers'] = None; sys.modules['torch'] = None\n"
            "import formal_transformers as ft\n"
            f"m = ft.load_hf({str(tmp_path)!r}); print(m.config['arch'])")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ETransformer"


# ---------------------------------------------------------------------------------------------------
# to_torch

def _native_ed(dtype="float64", tied=False):
    m = ft.EDTransformer(V, LMAX, 2, 2, 2, 8, 12, dtype=dtype, seed=6, init_std=0.3, tied=tied)
    rng = np.random.default_rng(7)
    for k, p in m.params.items():
        if k.split(".")[-1].startswith(("gamma", "beta", "b_")):
            p[...] = rng.normal(0, 0.3, p.shape) + (1 if "gamma" in k else 0)
    return m


@pytest.mark.parametrize("case", ["d", "d_untied_rms_sin", "d_dattn", "e", "e_plain", "ed", "ed_tied"])
def test_to_torch_loss_and_gradients(case):
    rng = np.random.default_rng(8)
    seqs = [rng.integers(0, V - 3, n) for n in LENGTHS]
    if case.startswith("d"):
        kw = {"d": dict(tied=True, gelu="tanh"), "d_untied_rms_sin": dict(norm="rms", positional="sinusoidal"),
              "d_dattn": dict(d_attn=3, d_mid=5)}[case]
        m = _native("d", **kw)
        args = (seqs,)
    elif case in ("e", "e_plain"):
        if case == "e":
            m = _native("e", tied=True)
        else:
            m = ft.ETransformer(V, LMAX, 2, 2, 8, 12, 6, dtype="float64", seed=1, init_std=0.3)
        xt = [s.copy() for s in seqs]
        for s in xt:
            s[:2] = m.mask_token
        args = (xt, seqs) if case == "e_plain" else (xt, seqs, [np.arange(len(s)) % 2 for s in seqs])
    else:
        m = _native_ed(tied=case == "ed_tied")
        args = ([rng.integers(0, V, n) for n in (5, 3, 8)], seqs)
    module = ft.to_torch(m)
    assert isinstance(module, torch.nn.Module)
    if case == "ed":
        assert isinstance(module.enc[0], torch.nn.TransformerEncoderLayer)
        assert isinstance(module.dec[0], torch.nn.TransformerDecoderLayer)
    loss_t = module.loss(*args)
    loss_t.backward()
    if case == "e":
        loss, grads = m.loss_and_grad(args[0], args[1], segments=args[2])
    else:
        loss, grads = m.loss_and_grad(*args)
    assert abs(loss - loss_t.item()) <= TOL64 * abs(loss)
    tg = module.ft_grads()
    assert set(tg) | ({"W_p"} if "sin" in case else set()) == set(grads)
    for k, g in tg.items():
        if k.endswith("b_k"):
            assert np.abs(g).max() < 1e-12 and np.abs(grads[k]).max() < 1e-12
        elif g is None:  # the fixed sinusoidal table
            assert k == "W_p" and np.all(grads[k] == 0)
        else:
            assert rel_err(g, grads[k]) <= TOL64, k
    # and back: from_torch gives the same model
    _same_params(m, ft.from_torch(module))


def test_to_torch_float32_batch_forward():
    m = _native("d", "float32", tied=True)
    module = ft.to_torch(m)
    assert next(module.parameters()).dtype == torch.float32
    x = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    Z = module(torch.tensor(x)).detach().numpy()
    ref = m.logits(x)
    assert rel_err(np.transpose(Z, (0, 2, 1)), ref) <= 1e-5


# ---------------------------------------------------------------------------------------------------
# bad input

@pytest.mark.parametrize("make,option", [
    (lambda: _gpt2(activation_function="relu"), "activation_function"),
    (lambda: _gpt2(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx"),
    (lambda: _gpt2(scale_attn_weights=False), "scale_attn_weights"),
    (lambda: _bert(position_embedding_type="relative_key"), "position_embedding_type"),
    (lambda: _bert(hidden_act="relu"), "hidden_act"),
    (lambda: _bert(is_decoder=True), "is_decoder"),
])
def test_unsupported_config_options_are_named(make, option):
    with pytest.raises(ValueError, match=option):
        ft.from_hf(make())


def test_unsupported_classes_and_exports():
    with pytest.raises(ValueError, match="from_hf supports"):
        ft.from_hf(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="norm='rms'"):
        ft.to_hf(ft.DTransformer(V, LMAX, 1, 2, 8, 12, norm="rms"))
    with pytest.raises(ValueError, match="positional='sinusoidal'"):
        ft.save_hf(ft.DTransformer(V, LMAX, 1, 2, 8, 12, positional="sinusoidal"), "/nonexistent/never/made")
    with pytest.raises(ValueError, match="d_attn"):
        ft.to_hf(ft.DTransformer(V, LMAX, 1, 2, 8, 12, d_attn=3))
    with pytest.raises(ValueError, match="embed_norm"):
        ft.to_hf(ft.ETransformer(V, LMAX, 1, 2, 8, 12, 8))
    with pytest.raises(ValueError, match="d_f"):
        ft.to_hf(ft.ETransformer(V, LMAX, 1, 2, 8, 12, 6, embed_norm=True))
    with pytest.raises(ValueError, match="to_torch"):
        ft.to_hf(ft.EDTransformer(V, LMAX, 1, 1, 2, 8, 12))
    with pytest.raises(ValueError, match="d_attn = d_mid"):
        ft.to_torch(ft.EDTransformer(V, LMAX, 1, 1, 2, 8, 12, d_attn=3))
    with pytest.raises(TypeError):
        ft.to_torch(ft.MHAttention(2, 8, 8, 4, 4, 8))
    with pytest.raises(TypeError):
        ft.from_torch(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError):
        ft.load_hf(3)


def _rewrite(path, drop=None, reshape=None, config=None):
    from safetensors.numpy import load_file, save_file

    T = load_file(path / "model.safetensors")
    if drop:
        del T[drop]
    if reshape:
        T[reshape] = np.zeros((3, 3), dtype=np.float64)
    save_file(T, path / "model.safetensors", metadata={"format": "pt"})
    if config:
        c = json.loads((path / "config.json").read_text())
        c.update(config)
        (path / "config.json").write_text(json.dumps(c))


@pytest.mark.parametrize("kind", ["d", "e"])
def test_bad_directories_raise_naming_the_problem(kind, tmp_path):
    m = _native(kind, tied=True)
    name = "transformer.h.1.mlp.c_fc.bias" if kind == "d" else "bert.encoder.layer.1.output.dense.weight"
    short = name.split(".", 1)[1]
    d1 = tmp_path / "missing"
    ft.save_hf(m, d1)
    _rewrite(d1, drop=name)
    with pytest.raises(ValueError, match="missing tensor.*" + short.replace(".", r"\.")):
        ft.load_hf(d1)
    d2 = tmp_path / "shape"
    ft.save_hf(m, d2)
    _rewrite(d2, reshape=name)
    with pytest.raises(ValueError, match=short.replace(".", r"\.") + r" has shape \(3, 3\)"):
        ft.load_hf(d2)
    d3 = tmp_path / "layers"  # the config says fewer layers than the file holds
    ft.save_hf(m, d3)
    _rewrite(d3, config={"n_layer": 1} if kind == "d" else {"num_hidden_layers": 1})
    with pytest.raises(ValueError, match="unexpected tensor"):
        ft.load_hf(d3)
    d4 = tmp_path / "more"
    ft.save_hf(m, d4)
    _rewrite(d4, config={"n_layer": 3} if kind == "d" else {"num_hidden_layers": 3})
    with pytest.raises(ValueError, match="missing tensor"):
        ft.load_hf(d4)
    d5 = tmp_path / "noconfig"
    ft.save_hf(m, d5)
    os.remove(d5 / "config.json")
    with pytest.raises(ValueError, match="no config.json"):
        ft.load_hf(d5)
    d6 = tmp_path / "other"
    ft.save_hf(m, d6)
    _rewrite(d6, config={"model_type": "t5", "architectures": ["T5Model"]})
    with pytest.raises(ValueError, match="not supported"):
        ft.load_hf(d6)
    d7 = tmp_path / "damaged"
    ft.save_hf(m, d7)
    (d7 / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="safetensors"):
        ft.load_hf(d7)
    # the good directory still loads (the failures left nothing behind)
    d8 = tmp_path / "good"
    ft.save_hf(m, d8)
    _same_params(m, ft.load_hf(d8))


@pytest.mark.parametrize("extra,option", [(dict(bias=False), "bias"), (dict(H_kv=1), "H_kv"), (dict(mlp="swiglu"), "mlp"),
                                          (dict(rope_base=1e4), "rope_base")])
def test_options_beyond_the_mapping_are_refused(extra, option):
    # the decoder variants' options (docs/api.md) and any later one: refused by name until they are mapped
    from formal_transformers._options import check_unmapped_at_defaults
    from formal_transformers.hf.gpt2 import GPT2

    def check(cfg):  # the generic rule over the core's defaults, then GPT-2's own checks of what it maps
        check_unmapped_at_defaults(cfg, GPT2.maps, "GPT-2")
        GPT2().export(cfg, {k: np.asarray(v) for k, v in model.params.items()})

    model = ft.DTransformer(V, LMAX, 1, 2, 8, 12)
    cfg = dict(model.config)
    check(cfg)  # the listing's defaults pass
    check({**cfg, "bias": True, "H_kv": 2, "mlp": "gelu"})  # explicit defaults pass
    with pytest.raises(ValueError, match=option):
        check({**cfg, **extra})


# ---------------------------------------------------------------------------------------------------
# LLaMA (LlamaForCausalLM <-> DTransformer with RoPE, grouped-query attention, SwiGLU, no biases, RMSnorm)

def _llama(dtype=torch.float64, **kw):
    cfg = dict(vocab_size=V, hidden_size=16, intermediate_size=20, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=LMAX, rms_norm_eps=1e-6, rope_theta=300.0,
               attention_bias=False, mlp_bias=False, tie_word_embeddings=False, bos_token_id=V - 2,
               eos_token_id=V - 1)
    cfg.update(kw)
    m = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # every weight random, the RMSnorm gains around 1
        for name, p in m.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.3
            p.copy_(r + 1 if "norm" in name else r)
    return m.to(dtype).eval()


@pytest.mark.parametrize("tied", [False, True])
def test_llama_for_causal_lm_P_and_every_gradient(monkeypatch, tied):
    from test_variants import _float64_llama  # HF's float32 RMSnorm / RoPE angles run in float64 for the check

    _float64_llama(monkeypatch)
    hf = _llama(tie_word_embeddings=tied)
    m = ft.from_hf(hf)
    c = m.config
    assert (c["positional"], c["H_kv"], c["mlp"], c["bias"], c["norm"], c["tied"]) == ("rope", 2, "swiglu", False,
                                                                                      "rms", tied)
    assert c["rope_theta"] == 300.0 and m.params["W_e"].dtype == np.float64
    x = np.array([3, 14, 15, 9, 2, 6, 5, 3, 5, 8])
    ids = torch.tensor(x)[None]
    logits = hf(ids).logits[0]
    assert rel_err(m(x), torch.softmax(logits, -1).detach().numpy().T) <= TOL64
    loss_hf = torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:], reduction="sum")
    hf.zero_grad()
    loss_hf.backward()
    loss, grads = m.loss_and_grad(x)
    assert abs(loss - loss_hf.item()) <= TOL64 * abs(loss_hf.item())
    _assert_grads(grads, _grads_as_ft(hf))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_llama_round_trips_are_exact(dtype, tmp_path):
    m = ft.DTransformer(V, LMAX, 2, 4, 16, 20, positional="rope", rope_theta=500.0, H_kv=2, mlp="swiglu", bias=False,
                        norm="rms", eps=1e-6, dtype=dtype, seed=3, init_std=0.3)
    rng = np.random.default_rng(2)
    for k, p in m.params.items():
        if "gamma" in k:
            p[...] = 1 + rng.normal(0, 0.3, p.shape)
    hf = ft.to_hf(m)
    assert type(hf).__name__ == "LlamaForCausalLM" and hf.config.num_key_value_heads == 2
    _same_params(m, ft.from_hf(hf))
    assert _cfg(ft.from_hf(hf)) == _cfg(m)
    x = np.array([1, 7, 3, 9, 4, 4, 11])
    tol = 1e-5 if dtype == "float32" else 1e-6  # HF's float32 RMSnorm and RoPE angles (see hf.py)
    assert rel_err(m.logits(x), hf(torch.tensor(x)[None]).logits[0].detach().numpy().T) <= tol
    ft.save_hf(m, tmp_path)
    auto, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert type(auto).__name__ == "LlamaForCausalLM"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    back = ft.load_hf(tmp_path)
    _same_params(m, back)
    assert _cfg(back) == _cfg(m)


@pytest.mark.parametrize("kw,option", [(dict(hidden_act="gelu"), "hidden_act"), (dict(attention_bias=True), "attention_bias"),
                                       (dict(mlp_bias=True), "mlp_bias"),
                                       (dict(rope_scaling={"rope_type": "linear", "factor": 2.0}), "rope_type")])
def test_llama_unsupported_options_are_named(kw, option):
    with pytest.raises(ValueError, match=option):
        ft.from_hf(_llama(**kw))


def test_llama_style_exports_need_every_llama_option():
    m = ft.DTransformer(V, LMAX, 1, 2, 8, 12, positional="rope", H_kv=1, mlp="swiglu", bias=False)  # layer_norm
    with pytest.raises(ValueError, match="norm"):
        ft.to_hf(m)


def test_dropout_rates_map_both_ways():
    """GPT-2's and BERT's dropout sit at ft's places (docs/regularisation.md): from_hf / to_hf map the rates,
    and refuse what the other side cannot express."""
    m = ft.from_hf(_gpt2(resid_pdrop=0.1, embd_pdrop=0.2, attn_pdrop=0.3))
    assert (m.config["embed_dropout"], m.config["attn_dropout"], m.config["resid_dropout"]) == (0.2, 0.3, 0.1)
    c = ft.to_hf(m).config
    assert (c.embd_pdrop, c.attn_pdrop, c.resid_pdrop) == (0.2, 0.3, 0.1)
    b = ft.from_hf(_bert(hidden_dropout_prob=0.15, attention_probs_dropout_prob=0.05))
    assert (b.config["embed_dropout"], b.config["attn_dropout"], b.config["resid_dropout"]) == (0.15, 0.05, 0.15)
    c = ft.to_hf(b).config
    assert (c.hidden_dropout_prob, c.attention_probs_dropout_prob) == (0.15, 0.05)
    cfg = {k: v for k, v in b.config.items() if k not in ("arch", "embed_dropout")}
    pos = [cfg.pop(k) for k in ("n_vocab", "l_max", "L", "H", "d_e", "d_mlp", "d_f")]
    with pytest.raises(ValueError, match="hidden_dropout_prob"):
        ft.to_hf(ft.ETransformer(*pos, **cfg, embed_dropout=0.3))
    with pytest.raises(ValueError, match="dropout"):
        ft.to_torch(m)


# ---------------------------------------------------------------------------------------------------
# Hostile config.json files and arguments (issue 27): a ValueError naming the key, before anything is made

def _with_config(src, dst, edit):
    """A copy of the save_hf directory `src` whose config.json is edit(config) (a dict, or str: the file's text)."""
    import shutil

    shutil.copytree(src, dst)
    c = edit(json.loads((src / "config.json").read_text()))
    (dst / "config.json").write_text(c if isinstance(c, str) else json.dumps(c))
    return dst


def _set(**kw):
    return lambda c: {**c, **kw}


def _drop(key):
    return lambda c: {k: v for k, v in c.items() if k != key}


_LLAMA_CASES = [  # (edit, key the error must name)
    (_set(num_attention_heads=0), "num_attention_heads"), (_set(num_key_value_heads=5e-324), "num_key_value_heads"),
    (_set(num_key_value_heads=0), "num_key_value_heads"), (_set(head_dim=-2), "head_dim"),
    (_drop("hidden_size"), "hidden_size"), (_set(vocab_size=float("inf")), "vocab_size"),
    (_set(rms_norm_eps=float("nan")), "rms_norm_eps"), (_set(rope_parameters=[1]), "rope_parameters"),
    (_set(rope_parameters={"rope_type": "default", "rope_theta": -1.0}), "rope_theta"),
    (_set(rope_parameters={"rope_type": {"x": 1}}), "rope_type"), (_set(attention_dropout="0.1"), "attention_dropout"),
    (_set(tie_word_embeddings="yes"), "tie_word_embeddings"), (_set(pretraining_tp=[2]), "pretraining_tp"),
    (_set(hidden_act=["silu"]), "hidden_act"),
]
_GPT2_CASES = [
    (_set(n_head=0), "n_head"), (_drop("n_embd"), "n_embd"), (_set(vocab_size=float("inf")), "vocab_size"),
    (_set(n_layer=2**64), "n_layer"), (_set(n_layer=-1), "n_layer"), (_set(n_positions=True), "n_positions"),
    (_set(n_inner="12"), "n_inner"), (_set(activation_function=["gelu"]), "activation_function"),
    (_set(layer_norm_epsilon=float("-inf")), "layer_norm_epsilon"), (_set(attn_pdrop=1.5), "attn_pdrop"),
    (_set(scale_attn_weights="no"), "scale_attn_weights"), (_set(architectures="GPT2LMHeadModel"), "architectures"),
    (_set(architectures=[{"a": 1}]), "architectures"), (_set(n_embd=1e300), "n_embd"),
]
_BERT_CASES = [
    (_set(num_attention_heads=0), "num_attention_heads"), (_drop("intermediate_size"), "intermediate_size"),
    (_set(type_vocab_size=-3), "type_vocab_size"), (_set(hidden_dropout_prob=float("nan")), "hidden_dropout_prob"),
    (_set(position_embedding_type=["absolute"]), "position_embedding_type"), (_set(is_decoder=1), "is_decoder"),
    (_set(hidden_act={"gelu": 1}), "hidden_act"), (_set(max_position_embeddings=0), "max_position_embeddings"),
]


@pytest.mark.parametrize("kind,edit,key", [("d", e, k) for e, k in _GPT2_CASES] + [("e", e, k) for e, k in _BERT_CASES]
                         + [("llama", e, k) for e, k in _LLAMA_CASES])
def test_hostile_config_values_are_value_errors_naming_the_key(kind, edit, key, tmp_path):
    """Every config value a mapping uses has its type and range checked first: never ZeroDivisionError (n_head 0,
    num_key_value_heads 5e-324), KeyError (n_embd missing), OverflowError (vocab_size Infinity) or TypeError."""
    src = tmp_path / "src"
    if kind == "llama":
        _llama().save_pretrained(src)
    else:
        ft.save_hf(_native(kind, tied=True), src)
    d = _with_config(src, tmp_path / "bad", edit)
    with pytest.raises(ValueError, match=key):
        ft.load_hf(d)
    if key != "architectures":  # the same check through from_hf (a config object's dict)
        from formal_transformers.hf._registry import build as _build

        T = {k: v.detach().numpy() for k, v in (_llama() if kind == "llama" else ft.to_hf(_native(kind))).state_dict().items()}
        cls = {"d": "GPT2LMHeadModel", "e": "BertForMaskedLM", "llama": "LlamaForCausalLM"}[kind]
        with pytest.raises(ValueError, match=key):
            _build(cls, edit(json.loads((src / "config.json").read_text())), T, None, "from_hf")


def test_hostile_config_files_are_value_errors(tmp_path):
    src = tmp_path / "src"
    ft.save_hf(_native("d", tied=True), src)
    deep = 100_000
    for name, text, match in [("deep", "[" * deep + "]" * deep, "RecursionError"),
                              ("deepobj", '{"a":' * deep + "1" + "}" * deep, "RecursionError"),
                              ("list", "[1, 2]", "JSON object"), ("bytes", b"\xff\xfe{".decode("latin-1"), "JSON"),
                              ("digits", '{"n_layer": ' + "9" * 100_000 + "}", "JSON")]:
        d = _with_config(src, tmp_path / name, lambda c, t=text: t)
        with pytest.raises(ValueError, match=match):
            ft.load_hf(d)
    d = _with_config(src, tmp_path / "huge", lambda c: c)
    with open(d / "config.json", "a") as f:  # beyond any model config's size: refused before parsing
        f.truncate(17 << 20)
    with pytest.raises(ValueError, match="bytes"):
        ft.load_hf(d)


@pytest.mark.parametrize("kind", ["d", "e", "llama"])
def test_a_config_claiming_huge_layer_counts_fails_at_once(kind, tmp_path):
    """n_layer 10⁶ took 37 s and 3 GB before its ValueError, 10⁷ and 2⁶⁴ a MemoryError: the layer count is
    checked against the layers the weights hold before any per-layer name is listed."""
    import time

    src = tmp_path / "src"
    if kind == "llama":
        _llama().save_pretrained(src)
    else:
        ft.save_hf(_native(kind, tied=True), src)
    key = "n_layer" if kind == "d" else "num_hidden_layers"
    for L in (10**6, 10**7, 2**31 - 1):
        d = _with_config(src, tmp_path / str(L), _set(**{key: L}))
        t0 = time.perf_counter()
        with pytest.raises(ValueError, match=f"{key} = {L} but the weights hold 2 layers"):
            ft.load_hf(d)
        assert time.perf_counter() - t0 < 5.0  # was 37 s for 10⁶ (the name list); now no list at all
    d = _with_config(src, tmp_path / "2**64", _set(**{key: 2**64}))
    with pytest.raises(ValueError, match=key):
        ft.load_hf(d)


def test_to_hf_and_save_hf_take_only_models(tmp_path):
    for fn in (ft.to_hf, lambda m: ft.save_hf(m, tmp_path / "x")):
        for bad in (ft.LayerNorm(4), None, "model", _gpt2()):
            with pytest.raises(TypeError, match="DTransformer or ETransformer"):
                fn(bad)
    assert not (tmp_path / "x").exists()  # nothing written for a refused model
    with pytest.raises(TypeError, match="path"):
        ft.save_hf(_native("d"), None)


# LLaMA's RoPE keys, read as transformers reads them (rope_scaling wins over rope_parameters; θ inside them wins
# over a top-level rope_theta): load_hf gives the model transformers gives, or refuses it

@pytest.mark.parametrize("edit,theta", [
    (_set(rope_theta=500.0), 300.0),  # a top-level rope_theta beside rope_parameters' own: theirs wins
    (lambda c: {**_drop("rope_parameters")(c), "rope_theta": 700.0}, 700.0),
    (_set(rope_parameters=None, rope_theta=800.0), 800.0),
    (_set(rope_parameters={"type": "default"}, rope_theta=900.0), 900.0),
    (_set(rope_parameters={"rope_type": "default"}), 10000.0),
    (_set(rope_scaling=None), 300.0), (_set(rope_scaling={}), 300.0),
    (_set(rope_scaling={"rope_type": "default", "rope_theta": 123.0}), 123.0),
])
def test_llama_rope_keys_are_read_as_transformers_reads_them(edit, theta, tmp_path, monkeypatch):
    from test_variants import _float64_llama

    _float64_llama(monkeypatch)
    src = tmp_path / "src"
    _llama().save_pretrained(src)
    d = _with_config(src, tmp_path / "edited", edit)
    hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float64).eval()
    assert hf.config.rope_parameters["rope_theta"] == theta  # the expectation is transformers' own reading
    m = ft.load_hf(d)
    assert m.config["rope_theta"] == theta
    x = np.array([3, 14, 15, 9, 2, 6, 5, 3, 5, 8, 9])
    assert rel_err(m(x), torch.softmax(hf(torch.tensor(x)[None]).logits[0], -1).detach().numpy().T) <= TOL64


@pytest.mark.parametrize("edit", [
    _set(rope_scaling={"rope_type": "linear", "factor": 4.0}),  # beside rope_parameters: transformers uses it
    _set(rope_scaling={"type": "dynamic", "factor": 2.0}),
    _set(rope_parameters={"rope_type": "llama3", "rope_theta": 300.0, "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8}),
])
def test_llama_scaled_rope_is_refused_not_misread(edit, tmp_path):
    src = tmp_path / "src"
    _llama().save_pretrained(src)
    d = _with_config(src, tmp_path / "edited", edit)
    hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float64)
    assert hf.config.rope_parameters["rope_type"] != "default"  # transformers does scale these
    with pytest.raises(ValueError, match="rope_type"):
        ft.load_hf(d)
    with pytest.raises(ValueError, match="rope_type"):
        ft.from_hf(hf)


# save_hf's two files: the old pair or the new pair, whatever fails; unique temporaries

def test_save_hf_failures_leave_the_old_pair(tmp_path, monkeypatch):
    import formal_transformers.hf._registry as hfmod

    old, new = _native("d", tied=True), _native("d", tied=False, eps=1e-3)
    ft.save_hf(old, tmp_path)
    before = {f: (tmp_path / f).read_bytes() for f in ("config.json", "model.safetensors")}

    def fail_dump(*a, **k):
        raise OSError("disk full (simulated) while writing config.json")

    monkeypatch.setattr(hfmod.json, "dump", fail_dump)
    with pytest.raises(OSError, match="simulated"):
        ft.save_hf(new, tmp_path)
    monkeypatch.undo()
    real_replace = os.replace

    def fail_config_rename(src, dst):
        if str(dst).endswith("config.json"):
            raise OSError("rename failed (simulated)")
        return real_replace(src, dst)

    monkeypatch.setattr(hfmod.os, "replace", fail_config_rename)
    with pytest.raises(OSError, match="simulated"):
        ft.save_hf(new, tmp_path)
    monkeypatch.undo()
    assert {f: (tmp_path / f).read_bytes() for f in before} == before  # the old pair, byte for byte
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]  # no temporaries left
    _same_params(old, ft.load_hf(tmp_path))
    ft.save_hf(new, tmp_path)  # and a save that succeeds gives the new pair
    _same_params(new, ft.load_hf(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]


def test_save_hf_and_save_use_their_own_temporaries(tmp_path):
    """The fixed "<name>.tmp" temporaries made concurrent saves of one path collide (8 FileNotFoundError in
    1,758 saves): a directory squatting on the old names no longer matters, and two threads saving one path
    over and over never fail."""
    import threading

    m = _native("d", tied=True)
    for squat in ("model.safetensors.tmp", "config.json.tmp", "m.safetensors.tmp"):
        (tmp_path / squat).mkdir()
    ft.save_hf(m, tmp_path)
    ft.save(m, tmp_path / "m.safetensors")
    _same_params(m, ft.load_hf(tmp_path))
    _same_params(m, ft.load(tmp_path / "m.safetensors"))
    errors = []

    def work(k):
        try:
            for _ in range(40):
                ft.save(m, tmp_path / "m.safetensors")
                ft.save_hf(m, tmp_path / "hf")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    _same_params(m, ft.load(tmp_path / "m.safetensors"))
    _same_params(m, ft.load_hf(tmp_path / "hf"))
    leftovers = [f for f in os.listdir(tmp_path / "hf") if f not in ("config.json", "model.safetensors")]
    assert not leftovers, leftovers


# ---------------------------------------------------------------------------------------------------
# The core's option schema (ft.model_options) and the package's layout

def test_model_options_are_the_cores_schema():
    for arch, make in (("DTransformer", lambda: ft.DTransformer(V, LMAX, 1, 2, 8, 12)),
                       ("ETransformer", lambda: ft.ETransformer(V, LMAX, 1, 2, 8, 12, 8)),
                       ("EDTransformer", lambda: ft.EDTransformer(V, LMAX, 1, 1, 2, 8, 12))):
        opts = ft.model_options(arch)
        cfg = make().config
        # every option model.config holds, and "dropout" (the three rates' default, not stored)
        assert set(opts) == (set(cfg) - {"arch", "dtype"}) | {"dropout"}
        for k, o in opts.items():
            assert arch in o["archs"]
            if o["kind"] in ("size", "auto_size", "auto_real", "auto_id", "rates"):
                continue  # given, or filled from the others
            assert cfg[k] == o["default"] and type(cfg[k]) is type(o["default"]), (arch, k)
    assert ft.model_options("EDTransformer")["mlp"]["default"] == "relu"  # Algorithm 8's MLP
    assert ft.model_options("DTransformer")["mlp"]["default"] == "gelu"
    assert ft.model_options("DTransformer")["rope_theta"]["archs"] == ["DTransformer"]
    with pytest.raises(ValueError, match="arch"):
        ft.model_options("GPT2")


def test_an_option_at_a_non_default_value_that_no_family_maps_is_refused():
    m = ft.DTransformer(V, LMAX, 1, 2, 8, 12, mtp_weight=0.5)  # V16's weight, acting only with mtp_depth > 0
    with pytest.raises(ValueError, match="mtp_weight"):
        ft.save_hf(m, "unused")


def test_hf_does_not_import_torch_interop():
    """formal_transformers._torch imports formal_transformers.hf (T5 runs as transformers' model), never the other
    way round: importing the package and hf loads neither _torch nor torch."""
    import subprocess
    import sys

    code = ("import sys, formal_transformers as ft, formal_transformers.hf; "
            "assert 'formal_transformers._torch' not in sys.modules and 'torch' not in sys.modules, "
            "sorted(m for m in sys.modules if 'torch' in m)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ)
    assert r.returncode == 0, r.stderr[-2000:]
