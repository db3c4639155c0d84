"""The model config (the core's ModelConfig schema): the constructors' options checked once, by name;
model.config / config_json / repr from the core; ft.build_model, the one way every front-end makes a model;
and the C++ API's ft::save / ft::load files read and written by Python's ft.load / ft.save.
"""
from __future__ import annotations

import json
import struct
import warnings

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import io as ftio

V = 11

MODELS = {
    "d": lambda dt: ft.DTransformer(V, 9, 2, 2, 8, 12, dtype=dt, seed=1, resid_dropout=0.1),
    "d-variants": lambda dt: ft.DTransformer(V, 9, 1, 4, 8, 12, dtype=dt, seed=2, positional="rope", H_kv=2,
                                             mlp="swiglu", bias=False, norm="rms", rope_theta=500.0),
    "d-sinusoidal-tied": lambda dt: ft.DTransformer(V, 9, 1, 2, 8, 12, dtype=dt, positional="sinusoidal",
                                                    base=100.0, tied=True, gelu="tanh", d_attn=3, d_mid=5),
    "e-bert": lambda dt: ft.ETransformer(V, 9, 2, 2, 8, 12, 6, dtype=dt, seed=3, n_segments=2, embed_norm=True,
                                         unembed_bias=True),
    "ed": lambda dt: ft.EDTransformer(V, 9, 1, 2, 2, 8, 12, dtype=dt, seed=4, attn_dropout=0.2),
}


def make(name, dtype):
    m = MODELS[name](dtype)
    r = np.random.default_rng(7)
    for k in m.params.keys():
        if not (k == "W_p" and m.config["positional"] == "sinusoidal"):
            m.params[k][...] = 0.3 * r.standard_normal(m.params[k].shape)
    m.dropout_step = 5
    return m


def outputs(m):
    x = np.array([1, 5, 2, 0])
    return m(np.array([3, 4]), x) if type(m).__name__ == "EDTransformer" else m(x)


def test_sizes_by_name_or_position_and_the_signature():
    a = ft.DTransformer(V, 9, 2, 2, 8, 12, seed=3)
    b = ft.DTransformer(n_vocab=V, l_max=9, L=2, H=2, d_e=8, d_mlp=12, seed=3)
    c = ft.DTransformer(V, 9, 2, H=2, d_e=8, d_mlp=12, seed=3)
    assert a.config == b.config == c.config
    for k in a.params.keys():
        assert np.array_equal(a.params[k], b.params[k])
    doc = ft.DTransformer.__init__.__doc__
    assert "n_vocab, l_max, L, H, d_e, d_mlp, *, d_attn=None, d_mid=None, norm='layer'" in doc
    assert "n_segments" not in doc and "n_segments=0" in ft.ETransformer.__init__.__doc__


@pytest.mark.parametrize("call, exc, match", [
    (lambda: ft.DTransformer(V, 9, 2, 2, 8, 12, n_segments=2), TypeError, "unexpected keyword argument 'n_segments'"),
    (lambda: ft.ETransformer(V, 9, 2, 2, 8, 12, 6, mlp="swiglu"), TypeError, "unexpected keyword argument 'mlp'"),
    (lambda: ft.DTransformer(V, 9, 2, 2, 8, 12, colour="red"), TypeError, "'colour'"),
    (lambda: ft.DTransformer(V, 9, 2, 2, 8), TypeError, "missing required argument 'd_mlp'"),
    (lambda: ft.DTransformer(V, 9, 2, 2, 8, 12, 6), TypeError, "positional arguments"),
    (lambda: ft.DTransformer(V, 9, 2, 2, 8, 12, L=3), TypeError, "multiple values for argument 'L'"),
    (lambda: ft.DTransformer(V, 9.5, 2, 2, 8, 12), TypeError, "l_max must be an int, got float"),
    (lambda: ft.DTransformer(V, 9, 2, 2, 8, 12, eps="small"), TypeError, "eps must be a real number, got str"),
    (lambda: ft.DTransformer(V, 9, 2, 2, 8, 12, tied=1), TypeError, "tied must be True or False"),
    (lambda: ft.DTransformer(V, 9, 2, 2, 8, 12, positional=3), TypeError, "positional must be a str"),
    (lambda: ft.DTransformer(V, 9, 2, 2, 8, 12, seed=[1]), TypeError, "seed must be"),
    (lambda: ft.DTransformer(V, 9, 2, 2, 8, 12, positional="spiral"), ValueError, "positional must be one of"),
    (lambda: ft.DTransformer(V, 9, 2, 2, 8, 12, norm="batch"), ValueError, "norm must be one of 'layer', 'rms'"),
    (lambda: ft.DTransformer(V, 0, 2, 2, 8, 12), ValueError, "l_max must be a positive integer, got 0"),
    (lambda: ft.DTransformer(V, 9, 2, 2, 8, 12, d_attn=0), ValueError, "d_attn must be a positive integer"),
    (lambda: ft.DTransformer(V, 9, 2, 2, 8, 12, base=-1.0), ValueError, "base must be > 0"),
    (lambda: ft.DTransformer(V, 9, 2, 2, 8, 12, seed=-1), ValueError, "seed = -1"),
    (lambda: ft.DTransformer(V, 9, 2, 2, 8, 12, seed=2**64), ValueError, r"seed must be an integer in \[-2\^63, 2\^64\)"),
    (lambda: ft.DTransformer(V, 9, 2, 2, 8, 12, dropout=1.0), ValueError, "dropout"),
    (lambda: ft.DTransformer(V, 9, 2, 2, 8, 12, dtype="float16"), ValueError, "dtype"),
])
def test_bad_options_name_themselves(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("name", list(MODELS))
def test_build_model_remakes_the_architecture(name):
    m = MODELS[name]("float64")
    for config in (m.config, m.config_json()):
        b = ft.build_model(config)
        assert type(b) is type(m) and b.config == m.config and repr(b) == repr(m)
        for k in m.params.keys():  # the same seed: the same θ₀
            assert np.array_equal(b.params[k], m.params[k]), k
    assert json.loads(m.config_json()) == m.config
    assert list(m.config)[0] == "arch" and list(m.config)[-1] == "dtype"
    assert ft.build_model(m.config, dtype="float32").dtype == "float32"
    assert repr(m).startswith(type(m).__name__ + "(n_vocab=11, l_max=9, ")
    assert repr(m).endswith(", dtype='float64')")


def test_build_model_bad_input():
    with pytest.raises(ValueError, match="arch"):
        ft.build_model({"arch": "GPT", "n_vocab": V})
    with pytest.raises(ValueError, match="arch"):
        ft.build_model({"n_vocab": V})
    with pytest.raises(TypeError, match="dict"):
        ft.build_model([1, 2])
    with pytest.raises(TypeError, match="'layers'"):
        ft.build_model({"arch": "DTransformer", "n_vocab": V, "l_max": 9, "L": 1, "H": 2, "d_e": 4, "d_mlp": 8,
                        "layers": 3})


def test_save_stores_the_cores_config_json(tmp_path):
    m = make("e-bert", "float32")
    ft.save(m, tmp_path / "m.safetensors")
    meta = ft.io.read_metadata(tmp_path / "m.safetensors")
    assert meta["formal_transformers.config"] == m.config_json()


def save_with_config(m, config, path):
    """m saved with `config` (a dict: an older version's model.config) as its file's config JSON."""
    ft.save(m, path.with_suffix(".new"))
    blob = path.with_suffix(".new").read_bytes()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    header["__metadata__"] = {"formal_transformers.format": "1", "formal_transformers.config": json.dumps(config)}
    s = json.dumps(header).encode()
    s += b" " * ((8 - len(s) % 8) % 8)
    path.write_bytes(struct.pack("<Q", len(s)) + s + blob[8 + n:])


def test_a_file_written_before_the_schema_still_loads(tmp_path):
    """A file of an older version: its config JSON (Python's json.dumps of the old model.config, keys in another
    order) has no variant, dropout or dropout_seed entries and gelu 'none'; it loads with the defaults."""
    m = ft.DTransformer(V, 9, 1, 2, 8, 12, seed=6, dtype="float64")
    old = {"arch": "DTransformer", "n_vocab": V, "l_max": 9, "L": 1, "H": 2, "d_e": 8, "d_mlp": 12, "d_attn": 4,
           "d_mid": 4, "norm": "layer", "positional": "learned", "base": None, "tied": False, "gelu": "none",
           "eps": 1e-05, "dtype": "float64", "seed": 6, "init_std": 0.02}
    save_with_config(m, old, tmp_path / "old.safetensors")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no option of a part it does not choose: nothing to say)
        loaded = ft.load(tmp_path / "old.safetensors"), ft.load(tmp_path / "old.safetensors", dtype="float64")
    for got in loaded:
        assert got.config == m.config
        assert got.dropout_seed == 6 and got.dropout_step == 0
        assert np.array_equal(outputs(got), outputs(m))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", list(MODELS))
def test_one_format_read_in_either_dtype_and_by_safetensors(tmp_path, name, dtype):
    """ft.save / ft.load are the core's writer and reader (C++'s ft::save / ft::load: tests/cpp/test_io.cpp): the
    file loads in its dtype and the other, and is a plain safetensors file (the safetensors package reads the same
    tensors)."""
    m = make(name, dtype)
    ft.save(m, tmp_path / "m.safetensors")
    back = ft.load(tmp_path / "m.safetensors")
    assert type(back) is type(m) and back.config == m.config and back.dropout_step == 5
    assert back.dropout_seed == m.dropout_seed
    for k in m.params.keys():
        assert back.params[k].dtype == np.dtype(dtype) and np.array_equal(back.params[k], m.params[k]), k
    assert np.array_equal(outputs(back), outputs(m))
    other = "float64" if dtype == "float32" else "float32"
    conv = ft.load(tmp_path / "m.safetensors", dtype=other)
    for k in m.params.keys():
        assert np.array_equal(conv.params[k], m.params[k].astype(other)), k
    from safetensors import safe_open
    from safetensors.numpy import load_file
    a = load_file(str(tmp_path / "m.safetensors"))
    assert a.keys() == set(m.params.keys()) and all(np.array_equal(a[k], m.params[k]) for k in a)
    with safe_open(str(tmp_path / "m.safetensors"), framework="numpy") as f:
        assert f.metadata() == ft.io.read_metadata(tmp_path / "m.safetensors")


def test_load_refuses_a_damaged_file(tmp_path):
    ft.save(make("d", "float32"), tmp_path / "d.safetensors")
    blob = (tmp_path / "d.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(ValueError, match="cut.safetensors"):
        ft.load(tmp_path / "cut.safetensors")


# (its standard, its other plain MLP, its allowed names): D's mlp="relu" is V21's ReLU MLP (OPT), ED's mlp="gelu"
# V22's GELU MLP (BART): neither is the architecture's standard one
MLP_NAMES = {"DTransformer": ("gelu", "relu", "'gelu', 'swiglu', 'geglu', 'relu'"),
             "EDTransformer": ("relu", "gelu", "'relu', 'gelu', 'swiglu', 'geglu'")}


@pytest.mark.parametrize("arch", list(MLP_NAMES))
def test_mlp_names_are_the_architectures(tmp_path, arch):
    """The schema's per-architecture names of the standard MLP: "gelu" (Algorithms 9-10) in D, "relu" (Algorithm 8)
    in ED (D's "relu" is V21's ReLU MLP, ED's "gelu" V22's GELU MLP); an unknown name lists the architecture's own
    names; every name's config round-trips through JSON, build_model and a saved file."""
    make = getattr(ft, arch)
    sizes = (V, 9, 1, 2, 8, 12) if arch == "DTransformer" else (V, 9, 1, 1, 2, 8, 12)
    standard, other, allowed = MLP_NAMES[arch]
    with pytest.raises(ValueError, match=f"mlp must be one of {allowed}, got 'bogus'"):
        make(*sizes, mlp="bogus")
    names = ((standard, standard), ("swiglu", "swiglu"), ("geglu", "geglu"), ("gated-gelu", "geglu"))
    for name, written in names + ((other, other),):
        m = make(*sizes, mlp=name, dtype="float64", seed=3)
        assert m.config["mlp"] == written
        for config in (m.config, m.config_json()):
            assert ft.build_model(config).config == m.config
        ft.save(m, tmp_path / f"{name}.safetensors")
        got = ft.load(tmp_path / f"{name}.safetensors")
        assert got.config == m.config and np.array_equal(outputs(got), outputs(m))


def test_an_ed_file_older_than_its_mlp_option_loads(tmp_path):
    """An EDTransformer saved before it had mlp (and the T5 options): the config JSON lacks them; it loads with
    Algorithm 8's ReLU MLP, written back as mlp='relu'."""
    m = ft.EDTransformer(V, 9, 1, 1, 2, 8, 12, seed=6, dtype="float64")
    old = {k: v for k, v in m.config.items() if k not in {"mlp", "relative_buckets", "relative_max_distance",
                                                          "block", "scale_scores", "unembed_rescale", "bos_id",
                                                          "eos_id", "fixnorm", "attention_impl"}}
    save_with_config(m, old, tmp_path / "old.safetensors")
    for got in (ft.load(tmp_path / "old.safetensors"), ft.load(tmp_path / "old.safetensors", dtype="float64")):
        assert got.config == m.config and got.config["mlp"] == "relu"
        assert np.array_equal(outputs(got), outputs(m))


@pytest.mark.parametrize("positional, chooses", [("learned", "the listing's"), ("sinusoidal", "the listing's"),
                                                 ("alibi", "the 'alibi'")])
def test_rope_theta_is_the_rope_positions_option(tmp_path, positional, chooses):
    """rope_theta is the option of the position 'rope' (its registry row): given with another positional it is
    refused, as rotary_pct is, naming the part and the choice; at its default (every DTransformer's config holds
    it) it is taken; a file written before, whose config gave it where it had no effect, loads with the default
    and the same outputs, with a UserWarning naming the option, its value and its part (never silently), and a save
    after writes the default."""
    with pytest.raises(ValueError, match=f"rope_theta is an option of the 'rope' position, but "
                                         f"positional='{positional}' chooses {chooses} position: rope_theta must be "
                                         f"at its default"):
        ft.DTransformer(V, 9, 1, 2, 8, 12, positional=positional, rope_theta=500.0)
    m = ft.DTransformer(V, 9, 1, 2, 8, 12, seed=6, dtype="float64", positional=positional, rope_theta=10000.0)
    keys = list(m.config)
    assert m.config["rope_theta"] == 10000.0 and keys[keys.index("mlp") + 1] == "rope_theta"
    assert ft.model_options("DTransformer")["rope_theta"] == {"kind": "real", "default": 10000.0,
                                                              "archs": ["DTransformer"]}
    old = dict(json.loads(m.config_json()), rope_theta=500.0, dtype="float64")
    save_with_config(m, old, tmp_path / "old.safetensors")
    with pytest.warns(UserWarning, match=r"old\.safetensors: rope_theta = 500\.0 is an option of the 'rope' position, "
                                         r"which the file's config does not choose: it had no effect on the outputs "
                                         r"and loads at its default \(10000\.0\)") as w:
        got = ft.load(tmp_path / "old.safetensors")
    assert len(w) == 1 and w[0].filename == __file__  # (the warning points at the caller of ft.load)
    assert got.config == m.config and got.config["rope_theta"] == 10000.0
    assert np.array_equal(outputs(got), outputs(m))
    ft.save(got, tmp_path / "again.safetensors")  # the default written back; the file loads without a word
    assert json.loads(ftio.read_metadata(tmp_path / "again.safetensors")["formal_transformers.config"])["rope_theta"] == 10000.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ft.load(tmp_path / "again.safetensors").config == m.config


def test_mtp_options_are_the_prediction_heads_options():
    """mtp_depth and mtp_weight are the options of the prediction heads 'mtp' (a registered part): the schema
    keeps their place and defaults; mtp_weight alone weighs no module (accepted, nothing added)."""
    opts = ft.model_options("DTransformer")
    assert opts["mtp_depth"] == {"kind": "count", "default": 0, "archs": ["DTransformer"]}
    assert opts["mtp_weight"] == {"kind": "real", "default": 0.3, "archs": ["DTransformer"]}
    names = list(opts)
    assert names.index("mtp_depth") == names.index("mask") + 1 and names.index("mtp_weight") == names.index("mtp_depth") + 1
    alone = ft.DTransformer(V, 9, 1, 2, 8, 12, mtp_weight=0.5, mask="prefix")
    assert not any(k.startswith("mtp.") for k in alone.params.keys()) and alone.config["mtp_weight"] == 0.5
    two = ft.DTransformer(V, 9, 1, 2, 8, 12, mtp_depth=2)
    assert {k.split(".")[1] for k in two.params.keys() if k.startswith("mtp.")} == {"0", "1"}


def test_bigbird_options_are_the_bigbird_kernels_options():
    """V17's block_size, …, bigbird_draw are the options of the head kernel 'bigbird' (its registry row): the schema
    keeps their place, kinds and defaults (bigbird_draw an enum of the row's names); given with another attention the
    general rule names their owner; the keywords, the config and the repr are as before."""
    opts = ft.model_options("ETransformer")
    assert opts["block_size"] == {"kind": "auto_size", "default": None, "archs": ["ETransformer"]}
    assert opts["bigbird_draw"] == {"kind": "enum", "default": "per_head", "archs": ["ETransformer"]}
    names = list(opts)
    six = ["block_size", "window_blocks", "n_global_blocks", "n_random_blocks", "layout_seed", "bigbird_draw"]
    assert names[names.index("block_size"):names.index("block_size") + 6] == six
    for name, value in [("block_size", 4), ("bigbird_draw", "per_layer"), ("layout_seed", 3)]:
        with pytest.raises(ValueError, match=f"{name} is an option of the 'bigbird' head kernel, but attention='softmax' "
                                             f"chooses the listing's head kernel: {name} must be at its default"):
            ft.ETransformer(V, 16, 1, 2, 8, 12, 8, **{name: value})
    with pytest.raises(ValueError, match="bigbird_draw must be one of 'per_head', 'per_layer', got 'per_token'"):
        ft.ETransformer(V, 16, 1, 2, 8, 12, 8, attention="bigbird", block_size=2, bigbird_draw="per_token")
    with pytest.raises(TypeError, match="bigbird_draw must be a str"):
        ft.ETransformer(V, 16, 1, 2, 8, 12, 8, attention="bigbird", block_size=2, bigbird_draw=1)
    m = ft.ETransformer(V, 16, 1, 2, 8, 12, 8, attention="bigbird", block_size=2, bigbird_draw="per_layer")
    assert [m.config[k] for k in six] == [2, 3, 1, 3, 0, "per_layer"]
    assert "block_size=2, window_blocks=3, n_global_blocks=1, n_random_blocks=3, layout_seed=0, " \
           "bigbird_draw='per_layer'" in repr(m)


@pytest.mark.parametrize("arch, sizes, positional, chooses", [
    ("DTransformer", (V, 9, 1, 2, 8, 12), "learned", "the listing's"),
    ("DTransformer", (V, 9, 1, 2, 8, 12), "alibi", "the 'alibi'"),
    ("ETransformer", (V, 9, 1, 2, 8, 12, 8), "learned", "the listing's"),
    ("EDTransformer", (V, 9, 1, 1, 2, 8, 12), "relative", "the 'relative'")])
def test_base_is_the_sinusoidal_positions_option(tmp_path, arch, sizes, positional, chooses):
    """base (the sinusoidal table's, None: ℓ_max) is the option of the position 'sinusoidal' (its registry row):
    with positional='sinusoidal' it makes Algorithm 2's table with that base; given with another positional it is
    refused, naming the part and the choice; a file written before, whose config gave it where it had no effect,
    loads with the default (None) and the same outputs, with a UserWarning naming it and its part. Its place in the
    config and the options is kept."""
    make = getattr(ft, arch)
    m = make(*sizes, seed=6, dtype="float64", positional="sinusoidal", base=100.0)
    keys = list(m.config)
    assert m.config["base"] == 100.0 and keys[keys.index("positional") + 1] == "base"
    names = list(ft.model_options(arch))
    assert names[names.index("positional") + 1] == "base"
    assert np.allclose(m.params["W_p"], ft.reference.sinusoidal_positions(9, 8, 100.0), rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match=f"base is an option of the 'sinusoidal' position, but "
                                         f"positional='{positional}' chooses {chooses} position: base must be "
                                         f"at its default"):
        make(*sizes, positional=positional, base=100.0)
    plain = make(*sizes, seed=6, dtype="float64", positional=positional)
    assert plain.config["base"] is None
    old = dict(json.loads(plain.config_json()), base=100.0, dtype="float64")
    save_with_config(plain, old, tmp_path / "old.safetensors")
    with pytest.warns(UserWarning, match=r"base = 100\.0 is an option of the 'sinusoidal' position, which the file's "
                                         r"config does not choose: it had no effect on the outputs and loads at its "
                                         r"default \(null\)"):
        got = ft.load(tmp_path / "old.safetensors")
    assert got.config == plain.config and got.config["base"] is None
    assert np.array_equal(outputs(got), outputs(plain))
