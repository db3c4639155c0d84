"""ft.save / ft.load (safetensors with the config in the metadata) and Adam's state_dict / load_state_dict.

Round trips for the three architectures in float32 and float64 with the options that change the parameter
set (sinusoidal W_p, tied W_u, RMSnorm, tanh GELU, a positional base); damaged, truncated or foreign files
raise ValueError; resuming training from a saved model and optimizer state gives the parameters of an
uninterrupted run, bit for bit.
"""
from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import io as ftio
from conftest import randomize_normal

V = 11


# tiny models: a single-threaded core (conftest.one_thread); tests that exercise threads set their own count
pytestmark = pytest.mark.usefixtures("one_thread")


MODELS = {
    "d": lambda dt: ft.DTransformer(V, 9, 2, 2, 8, 12, dtype=dt, seed=1),
    "d-sinusoidal-tied-rms-tanh": lambda dt: ft.DTransformer(
        V, 9, 1, 2, 8, 12, dtype=dt, seed=2, positional="sinusoidal", base=10000.0, tied=True, norm="rms", gelu="tanh"),
    "d-dattn": lambda dt: ft.DTransformer(V, 9, 1, 2, 8, 12, dtype=dt, d_attn=3, d_mid=5, eps=1e-6, init_std=0.1),
    "e": lambda dt: ft.ETransformer(V, 9, 2, 2, 8, 12, 6, dtype=dt, seed=3),
    "e-sinusoidal": lambda dt: ft.ETransformer(V, 9, 1, 2, 8, 12, 8, dtype=dt, positional="sinusoidal", tied=True),
    "ed": lambda dt: ft.EDTransformer(V, 9, 1, 2, 2, 8, 12, dtype=dt, seed=4),
    "ed-sinusoidal-tied": lambda dt: ft.EDTransformer(
        V, 9, 2, 1, 2, 8, 12, dtype=dt, positional="sinusoidal", tied=True),
}


def make(name, dtype):
    m = MODELS[name](dtype)
    return randomize_normal(m, 7, scale=0.3)  # a sinusoidal W_p kept (fixed, not learned)


def outputs(m):
    z = np.array([1, 5, 2, 0])
    x = np.array([V - 2, 3, 4])
    if type(m).__name__ == "EDTransformer":
        return m(z, x)
    return m(z)


@pytest.mark.parametrize("name", list(MODELS))
def test_save_load_round_trip(tmp_path, dtype, name):
    m = make(name, dtype)
    path = tmp_path / "model.safetensors"
    ft.save(m, path)
    assert not (tmp_path / "model.safetensors.tmp").exists()
    got = ft.load(path)
    assert type(got) is type(m)
    assert got.config == m.config
    assert list(got.params.keys()) == list(m.params.keys())
    for k in m.params.keys():
        assert got.params[k].dtype == np.dtype(dtype)
        assert np.array_equal(got.params[k], m.params[k]), k
    assert np.array_equal(outputs(got), outputs(m))
    # the saved model trains on independently of the original
    got.params["W_e"][0, 0] += 1
    assert m.params["W_e"][0, 0] != got.params["W_e"][0, 0]


def test_tied_and_sinusoidal_details_survive(tmp_path):
    m = make("d-sinusoidal-tied-rms-tanh", "float64")
    assert "W_u" not in m.params  # tied: W_u = W_eᵀ is not a separate parameter
    ft.save(m, tmp_path / "m.safetensors")
    got = ft.load(tmp_path / "m.safetensors")
    assert got.config["tied"] and got.config["positional"] == "sinusoidal" and got.config["base"] == 10000.0
    assert got.config["norm"] == "rms" and got.config["gelu"] == "tanh"
    # the sinusoidal table is still the fixed one (an optimizer step leaves it alone)
    W_p = np.array(got.params["W_p"])
    ft.SGD(0.1).step(got, {k: np.ones_like(v) for k, v in got.params.items()})
    assert np.array_equal(got.params["W_p"], W_p)


def test_load_in_another_dtype(tmp_path):
    m = make("d", "float32")
    ft.save(m, tmp_path / "m.safetensors")
    g64 = ft.load(tmp_path / "m.safetensors", dtype="float64")
    assert g64.config["dtype"] == "float64"
    for k in m.params.keys():
        assert g64.params[k].dtype == np.float64
        assert np.array_equal(g64.params[k], m.params[k].astype(np.float64))
    m64 = make("d", "float64")
    ft.save(m64, tmp_path / "m64.safetensors")
    g32 = ft.load(tmp_path / "m64.safetensors", dtype="float32")
    for k in m64.params.keys():
        assert np.array_equal(g32.params[k], m64.params[k].astype(np.float32))


def test_save_overwrites_and_keeps_extra_metadata(tmp_path):
    path = tmp_path / "m.safetensors"
    ft.save(make("d", "float32"), path)
    m2 = make("e", "float64")
    ft.save(m2, str(path), metadata={"step": 12, "note": "hello"})
    got = ft.load(path)
    assert type(got).__name__ == "ETransformer"
    meta = ftio.read_metadata(path)
    assert meta["step"] == "12" and meta["note"] == "hello"
    with pytest.raises(TypeError):
        ft.save(ft.LayerNorm(4), tmp_path / "x.safetensors")


# ------------------------------------------------------------------------------------------------------
# damaged files


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "good.safetensors"
    ft.save(make("d", "float32"), path)
    return path.read_bytes()


def header_of(blob):
    n = struct.unpack("<Q", blob[:8])[0]
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def with_header(header, body):
    s = json.dumps(header).encode()
    s += b" " * ((8 - len(s) % 8) % 8)
    return struct.pack("<Q", len(s)) + s + body


def load_bytes(tmp_path, blob):
    p = tmp_path / "damaged.safetensors"
    p.write_bytes(blob)
    return ft.load(p)


@pytest.mark.parametrize("cut", [0, 4, 8, 30, "header-5", "header", "half", "last-1"])
def test_truncated_files_are_value_errors(tmp_path, saved, cut):
    n = struct.unpack("<Q", saved[:8])[0]
    at = {"header-5": 8 + n - 5, "header": 8 + n, "half": len(saved) // 2, "last-1": len(saved) - 1}.get(cut, cut)
    with pytest.raises(ValueError):
        load_bytes(tmp_path, saved[:at])


def test_garbage_and_foreign_files_are_value_errors(tmp_path, saved):
    with pytest.raises(ValueError):
        load_bytes(tmp_path, os.urandom(500))
    with pytest.raises(ValueError):
        load_bytes(tmp_path, b"")
    with pytest.raises(ValueError):
        load_bytes(tmp_path, saved + b"trailing")
    # a valid safetensors file written by someone else: no config
    from safetensors.numpy import save_file

    save_file({"W_e": np.zeros((8, V), np.float32)}, str(tmp_path / "foreign.safetensors"))
    with pytest.raises(ValueError, match="config"):
        ft.load(tmp_path / "foreign.safetensors")
    with pytest.raises(FileNotFoundError):
        ft.load(tmp_path / "absent.safetensors")


def damage_config(saved, fn):
    header, body = header_of(saved)
    cfg = json.loads(header["__metadata__"]["formal_transformers.config"])
    cfg = fn(cfg)
    header["__metadata__"]["formal_transformers.config"] = cfg if isinstance(cfg, str) else json.dumps(cfg)
    return with_header(header, body)


def drop(key):
    def f(cfg):
        del cfg[key]
        return cfg
    return f


def setk(key, value):
    def f(cfg):
        cfg[key] = value
        return cfg
    return f


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda c: "{not json", id="not-json"),
        pytest.param(setk("arch", "GPT"), id="unknown-arch"),
        pytest.param(drop("arch"), id="no-arch"),
        pytest.param(setk("n_vocab", -5), id="negative-n_vocab"),
        pytest.param(setk("n_vocab", 12), id="n_vocab-disagrees-with-tensors"),
        pytest.param(setk("dtype", "float16"), id="bad-dtype"),
        pytest.param(drop("L"), id="missing-L"),
        pytest.param(drop("d_e"), id="missing-d_e"),
        pytest.param(setk("n_vocab", "eleven"), id="n_vocab-a-string"),
        pytest.param(setk("layers", 3), id="unknown-key"),
        pytest.param(lambda c: "[1, 2, 3]", id="config-a-list"),
    ],
)
def test_damaged_config_is_a_value_error(tmp_path, saved, damage):
    with pytest.raises(ValueError):
        load_bytes(tmp_path, damage_config(saved, damage))


def test_damaged_tensor_table_is_a_value_error(tmp_path, saved):
    header, body = header_of(saved)
    h = json.loads(json.dumps(header))
    h["W_e"]["shape"] = h["W_e"]["shape"][::-1]  # transposed
    with pytest.raises(ValueError):
        load_bytes(tmp_path, with_header(h, body))
    h = json.loads(json.dumps(header))
    h["W_e"]["dtype"] = "F64"  # offsets no longer fit
    with pytest.raises(ValueError):
        load_bytes(tmp_path, with_header(h, body))
    h = json.loads(json.dumps(header))
    h["W_f"] = h.pop("W_u")  # a parameter this model does not have, one it lacks
    with pytest.raises(ValueError, match="W_u"):
        load_bytes(tmp_path, with_header(h, body))
    h = json.loads(json.dumps(header))
    h["__metadata__"]["formal_transformers.format"] = "99"
    with pytest.raises(ValueError, match="format"):
        load_bytes(tmp_path, with_header(h, body))


# ------------------------------------------------------------------------------------------------------
# Adam state: resume == uninterrupted


def data_seqs(seed, n):
    r = np.random.default_rng(seed)
    return [r.integers(0, V - 3, int(r.integers(3, 9))) for _ in range(n)]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_adam_resume_from_saved_state_equals_an_uninterrupted_run(tmp_path, dtype):
    data = data_seqs(1, 8)
    opts = dict(shuffle=False, batch_size=2, progress=False)

    full = make("d", dtype)
    adam_full = ft.Adam(0.01, weight_decay=0.05)
    ft.DTraining(1, 0.01, optimizer=adam_full, **opts)(data, full)

    first = make("d", dtype)
    adam = ft.Adam(0.01, weight_decay=0.05)
    ft.DTraining(1, 0.01, optimizer=adam, **opts)(data[:4], first)
    ft.save(first, tmp_path / "ckpt.safetensors")
    state = adam.state_dict()
    assert state["t"] == 2 and state["m"].shape == state["v"].shape == (sum(v.size for v in first.params.values()),)
    np.savez(tmp_path / "adam.npz", **state)
    del first, adam

    resumed = ft.load(tmp_path / "ckpt.safetensors")
    saved = dict(np.load(tmp_path / "adam.npz"))
    adam2 = ft.Adam(0.01, weight_decay=0.05)
    adam2.load_state_dict(resumed, {"t": int(saved["t"]), "m": saved["m"], "v": saved["v"]})
    assert adam2.t == 2
    ft.DTraining(1, 0.01, optimizer=adam2, **opts)(data[4:], resumed)
    assert adam2.t == adam_full.t == 4
    for k in full.params.keys():
        assert np.array_equal(resumed.params[k], full.params[k]), k

    # without the optimizer state the continuation differs
    again = ft.load(tmp_path / "ckpt.safetensors")
    ft.DTraining(1, 0.01, optimizer=ft.Adam(0.01, weight_decay=0.05), **opts)(data[4:], again)
    assert max(float(np.max(np.abs(again.params[k] - full.params[k]))) for k in full.params.keys()) > 1e-5


def test_adam_resume_by_hand_steps(tmp_path):
    """The same through Adam.step on loss_and_grad's gradients (no trainer), for an EDTransformer."""
    z, x = data_seqs(2, 6), [np.concatenate([[V - 2], s, [V - 1]]) for s in data_seqs(3, 6)]
    full = make("ed", "float64")
    a = ft.Adam(3e-3)
    for i in range(6):
        a.step(full, full.loss_and_grad(z[i], x[i])[1])
    part = make("ed", "float64")
    b = ft.Adam(3e-3)
    for i in range(3):
        b.step(part, part.loss_and_grad(z[i], x[i])[1])
    ft.save(part, tmp_path / "p.safetensors")
    st = b.state_dict()
    cont = ft.load(tmp_path / "p.safetensors")
    c = ft.Adam(3e-3)
    c.load_state_dict(cont, st)
    for i in range(3, 6):
        c.step(cont, cont.loss_and_grad(z[i], x[i])[1])
    for k in full.params.keys():
        assert np.array_equal(cont.params[k], full.params[k]), k


def test_adam_state_dict_bad_input():
    m = make("d", "float64")
    a = ft.Adam(0.01)
    assert a.state_dict()["t"] == 0  # nothing yet
    a.step(m, m.loss_and_grad(np.array([1, 2, 3]))[1])
    st = a.state_dict()
    with pytest.raises(ValueError):
        ft.Adam(0.01).load_state_dict(m, {"t": -1})
    with pytest.raises(ValueError):
        ft.Adam(0.01).load_state_dict(m, {"t": 3})  # steps taken but no moments
    fresh = ft.Adam(0.01)
    fresh.load_state_dict(m, {"t": 0})
    assert fresh.t == 0
    other = ft.ETransformer(V, 9, 1, 2, 8, 12, 6, dtype="float64")
    with pytest.raises(ValueError, match="moments"):
        ft.Adam(0.01).load_state_dict(other, st)  # moments of another size
    short = {"t": st["t"], "m": st["m"][:-1], "v": st["v"][:-1]}
    with pytest.raises(ValueError, match="moments"):
        ft.Adam(0.01).load_state_dict(m, short)


def test_params_update_is_all_or_nothing():
    """params.update (what ft.load uses) checks every name, dtype and shape before the first write: a bad
    entry anywhere leaves every parameter as it was."""
    m = ft.DTransformer(11, 8, 1, 2, 8, 16, dtype="float64", seed=0)
    before = {k: v.copy() for k, v in m.params.items()}
    good = np.full(m.params["W_e"].shape, 7.0)
    bad_cases = [
        ({"W_e": good, "W_u": np.zeros((3, 3))}, ValueError, "shape"),
        ({"W_e": good, "W_u": np.zeros(m.params["W_u"].shape, dtype=bool)}, TypeError, "real-valued"),
        ({"W_e": good, "nope": np.zeros(3)}, KeyError, "nope"),
        ({"W_e": good, 3: np.zeros(3)}, TypeError, "strings"),
    ]
    for values, exc, msg in bad_cases:
        with pytest.raises(exc, match=msg):
            m.params.update(values)
        for k, v in m.params.items():
            assert np.array_equal(v, before[k]), f"{k} written although the update failed"
    m.params.update({"W_e": good})
    assert np.all(m.params["W_e"] == 7.0)


def test_load_with_a_bad_dtype_names_the_dtype(tmp_path):
    m = ft.DTransformer(11, 8, 1, 2, 8, 16, seed=0)
    path = tmp_path / "m.safetensors"
    ft.save(m, path)
    for bad in ("float16", "int32", "nonsense"):
        with pytest.raises(ValueError, match="dtype must be float32 or float64"):
            ft.load(path, dtype=bad)
    assert ft.load(path, dtype=np.float64).dtype == "float64"


def test_paths_of_the_wrong_type_are_type_errors(tmp_path):
    m = ft.DTransformer(11, 8, 1, 2, 8, 16, seed=0)
    for bad in (None, 3, b"m.safetensors"[0]):
        with pytest.raises(TypeError, match="path must be"):
            ft.save(m, bad)
        with pytest.raises(TypeError, match="path must be"):
            ft.load(bad)
