"""Integer arguments of the bindings: every public one is taken by one caster (bind.hpp's PyInt, converted by
int_arg), so 2**63, 2**64, -1, True, 3.0 or "3" raise ValueError / TypeError naming the argument (and for a
value outside it, its range), never pybind11's generic "incompatible function arguments"; numpy integers are
ints. Before, a plain C++ integer parameter answered 2**63 and 3.0 with that generic TypeError and took True
as 1.
"""
from __future__ import annotations

import numpy as np
import pytest

import formal_transformers as ft

Q = np.zeros((4, 32))


def tok():
    return ft.BPETokenizer.from_merges([(97, 98)])


def bigbird():
    return ft.ETransformer(16, 32, 1, 2, 8, 16, 8, attention="bigbird", block_size=4)


def dm():
    m = ft.DTransformer(16, 12, 1, 2, 8, 16, dtype="float64")
    m(np.array([1, 2, 3]))
    return m


def edm():
    m = ft.EDTransformer(16, 12, 1, 1, 2, 8, 16, dtype="float64")
    m(np.array([1, 2]), np.array([1, 2, 3]))
    return m


# (the call with the argument as v, the argument's name in the message, whether it must be >= 1, >= 0 or any)
CALLS = [
    (lambda v: ft.SpeculativeInference(3, k=v), "k", 1),
    (lambda v: ft.SpeculativeInference(v), "l_gen", 0),
    (lambda v: ft.DInference(v), "l_gen", 0),
    (lambda v: ft.DInference(3, max_batch=v), "max_batch", 1),  # (>= 1: the check after int_arg)
    (lambda v: ft.EDInference(max_len=v), "max_len", 1),
    (lambda v: ft.bidirectional_mask(v), "l_z", 1),
    (lambda v: ft.unidirectional_mask(3, v), "l_x", 1),
    (lambda v: ft.random_feature_matrix("performer", v, 4), "n_features", 1),
    (lambda v: ft.random_feature_matrix("rfa", 4, v), "d_attn", 1),
    (lambda v: ft.bigbird_layout(v), "n_blocks", 1),
    (lambda v: ft.bigbird_layout(8, window_blocks=v), "window_blocks", None),
    (lambda v: ft.bigbird_layout(8, n_global_blocks=v), "n_global_blocks", None),
    (lambda v: ft.bigbird_layout(8, n_random_blocks=v), "n_random_blocks", None),
    (lambda v: ft.bigbird_layout(8, head=v), "head", None),
    (lambda v: bigbird().bigbird_layouts(v), "n_blocks", 1),
    (lambda v: ft.block_sparse_attention(Q, Q, Q, ft.bigbird_layout(8), v), "block_size", 1),
    (lambda v: ft.BasicAttention(v, 2, 2), "d_in", 1),
    (lambda v: ft.Attention(2, 2, v, 2), "d_attn", 1),
    (lambda v: ft.MHAttention(v, 2, 2, 2, 2, 2), "H", 1),
    (lambda v: ft.MHAttention(2, 2, 2, 2, 2, v), "d_out", 1),
    (lambda v: ft.MHAttention(2, 2, 2, 2, 2, 2, H_kv=v), "H_kv", 1),
    (lambda v: ft.TokenEmbedding(v, 2), "n_vocab", 1),
    (lambda v: ft.PositionalEmbedding(4, v), "d_e", 1),
    (lambda v: ft.Unembedding(4, v), "d_e", 1),
    (lambda v: ft.LayerNorm(v), "d_e", 1),
    (lambda v: ft.RMSNorm(v), "d_e", 1),
    (lambda v: ft._core._mask_tokens(np.array([1, 2]), v, 0.5, 0), "mask_token", None),
    (lambda v: ft._core._mask_tokens(np.array([1, 2]), 3, 0.5, v), "seed", 0),
    (lambda v: ft.DTraining(v), "n_epochs", 0),
    (lambda v: ft.ETraining(1, batch_size=v), "batch_size", 1),
    (lambda v: ft.EDTraining(1, warmup=v), "warmup", 0),
    (lambda v: ft.DTraining(1, seed=v), "seed", 0),
    (lambda v: tok().token_bytes(v), "id", None),
    (lambda v: ft.BPETokenizer.from_merges([(97, 98), (v, 98)]), "merges\\[1\\]\\[0\\]", 0),
    (lambda v: dm().attention_weights(v), "layer", None),
    (lambda v: dm().attention_weights(0, v), "seq", None),
    (lambda v: edm().attention_weights("enc", v), "layer", None),
    (lambda v: ft.ViT(v, 2, 3, 1, 1, 4, 8), "image_size", None),
    (lambda v: ft.ViT((4, v), 2, 3, 1, 1, 4, 8), "image_size\\[1\\]", None),
    (lambda v: ft.ViT(4, v, 3, 1, 1, 4, 8), "patch_size", None),
    (lambda v: ft.ViT(4, 2, 3, 1, 1, 4, v), "d_mlp", None),
    (lambda v: ft.ViT(4, 2, 3, 1, 1, 4, 8, n_channels=v), "n_channels", None),
    (lambda v: ft.ViT(4, 2, 3, 1, 1, 4, 8, seed=v), "seed", 0),
]
OPTIONAL = {"max_len", "l_x", "H_kv"}  # None is their default
IDS = [f"{name}-{i}" for i, (_, name, _) in enumerate(CALLS)]

# (value, exception); 2**64 and beyond are outside every range, and so is 2**63 except a seed's
BAD = [(2**63, ValueError), (2**64, ValueError), (-2**64, ValueError), (True, TypeError), (3.0, TypeError),
       ("3", TypeError), (None, TypeError), (np.float64(3), TypeError), (np.bool_(True), TypeError)]


@pytest.mark.parametrize("value,exc", BAD, ids=[repr(v) for v, _ in BAD])
@pytest.mark.parametrize("call,name,lo", CALLS, ids=IDS)
def test_bad_integer_argument_names_itself(call, name, lo, value, exc):
    if name == "seed" and type(value) is int and value == 2**63:
        call(value)  # a seed is any integer in [0, 2^64)
        return
    if value is None and name in OPTIONAL:
        assert call(value) is not None  # None: the default
        return
    with pytest.raises(exc, match=name) as e:
        call(value)
    assert "incompatible" not in str(e.value)
    if exc is ValueError and name != "seed":  # outside 64 bits: the range is named
        assert "2^63" in str(e.value), str(e.value)


@pytest.mark.parametrize("call,name,lo", [c for c in CALLS if c[2] is not None], ids=[i for i, c in zip(IDS, CALLS)
                                                                                      if c[2] is not None])
def test_below_the_range_names_it(call, name, lo):
    with pytest.raises(ValueError, match=name) as e:
        call(lo - 1)
    assert f">= {lo}" in str(e.value) or (lo == 1 and "positive" in str(e.value)) or "[0, 2^64)" in str(e.value)


@pytest.mark.parametrize("call,name,lo", CALLS, ids=IDS)
def test_numpy_integers_are_ints(call, name, lo):
    good = {"k": 2, "l_gen": 3, "max_batch": 2, "max_len": 3, "l_z": 3, "l_x": 2, "n_features": 4, "d_attn": 2,
            "n_blocks": 8, "head": 1, "window_blocks": 3, "n_global_blocks": 1, "n_random_blocks": 1, "block_size": 4,
            "d_in": 2, "H": 2, "d_out": 2, "H_kv": 1, "n_vocab": 4, "d_e": 2, "mask_token": 3, "seed": 5, "n_epochs": 2,
            "batch_size": 2, "warmup": 3, "id": 1, "layer": 0, "seq": 0, "image_size": 4, "image_size\\[1\\]": 4, "patch_size": 2,
            "d_mlp": 8, "n_channels": 3, "merges\\[1\\]\\[0\\]": 32}[name]
    a, b = call(good), call(np.int32(good))
    call(np.uint8(good))
    if isinstance(a, np.ndarray) or isinstance(a, float):
        assert np.array_equal(a, b)
    else:
        assert repr(a) == repr(b)


# Every integer argument goes through one converter (bind.cpp's int_value / checked_int): its callers, each
# driven at the edges of 64 bits. (the call with the argument as v, what a value that fits returns is not
# checked here, the value -> (exception or None, the message's pattern)).
def _prefix_model():
    return ft.DTransformer(16, 12, 1, 2, 8, 16, mask="prefix")


EDGES = {"2**63": 2**63, "2**64": 2**64, "-2**63-1": -2**63 - 1, "np.int64(1)": np.int64(1), "True": True, "1.0": 1.0}
S63 = r"\[-2\^63, 2\^63 - 1\]"
CONVERTED = [
    # int_arg: a size in [1, 2^63)
    ("int_arg", lambda v: ft.LayerNorm(v), {
        "2**63": (ValueError, r"d_e must be a positive integer \(below 2\^63\), got 9223372036854775808"),
        "2**64": (ValueError, r"d_e must be a positive integer \(below 2\^63\), got 18446744073709551616"),
        "-2**63-1": (ValueError, r"d_e must be a positive integer \(below 2\^63\), got -9223372036854775809"),
        "True": (TypeError, "d_e must be an int, got bool"), "1.0": (TypeError, "d_e must be an int, got float")}),
    # seed_arg: [0, 2^64)
    ("seed_arg", lambda v: ft.ViT(4, 2, 3, 1, 1, 4, 8, seed=v), {
        "2**63": None,
        "2**64": (ValueError, r"seed must be an integer in \[0, 2\^64\), got 18446744073709551616"),
        "-2**63-1": (ValueError, r"seed must be an integer in \[0, 2\^64\), got -9223372036854775809"),
        "True": (TypeError, r"seed must be an int \(or None\), got bool"),
        "1.0": (TypeError, r"seed must be an int \(or None\), got float")}),
    # option_value: [-2^63, 2^64) for the core's schema, which then checks the option's type and range (a bool and
    # a float reach it as such: its TypeError)
    ("option_value", lambda v: ft.DTransformer(16, 12, 1, 2, 8, 16, seed=v), {
        "2**63": None,
        "2**64": (ValueError, r"seed must be an integer in \[-2\^63, 2\^64\), got 18446744073709551616"),
        "-2**63-1": (ValueError, r"seed must be an integer in \[-2\^63, 2\^64\), got -9223372036854775809"),
        "True": (TypeError, "seed must be an int, got bool"), "1.0": (TypeError, "seed must be an int, got float")}),
    # prefix_lens: one int64 each (the core checks the range against the sequence)
    *[(f"prefix_lens{'[0]' if wrap else ''}", (lambda w: lambda v: _prefix_model()(np.array([[1, 2, 3]]),
                                                                                 prefix_len=[v] if w else v))(wrap), {
        "2**63": (ValueError, r"prefix_len must be an integer in " + S63 + ", got 9223372036854775808"),
        "2**64": (ValueError, r"prefix_len must be an integer in " + S63 + ", got 18446744073709551616"),
        "-2**63-1": (ValueError, r"prefix_len must be an integer in " + S63 + ", got -9223372036854775809"),
        "True": (TypeError, "prefix_len must be an int or one int per sequence, got bool"),
        "1.0": (TypeError, "prefix_len must be an int or one int per sequence, got float")}) for wrap in (False, True)],
    # DInference's prefix_len: one prompt's
    ("DInference prefix_len", lambda v: ft.DInference(2)(np.array([1, 2]), _prefix_model(), prefix_len=v), {
        "2**63": (ValueError, r"prefix_len must be an integer in " + S63 + ", got 9223372036854775808"),
        "2**64": (ValueError, r"prefix_len must be an integer in " + S63 + ", got 18446744073709551616"),
        "-2**63-1": (ValueError, r"prefix_len must be an integer in " + S63 + ", got -9223372036854775809"),
        "True": (TypeError, r"prefix_len must be an int \(the prompt's prefix\) or None, got bool"),
        "1.0": (TypeError, r"prefix_len must be an int \(the prompt's prefix\) or None, got float")}),
    # in_ids: one token id; beyond 64 bits it is an id out of range
    ("in_ids", lambda v: ft.TokenEmbedding(8, 4)(v), {
        "2**63": (IndexError, r"v: token id 9223372036854775808 is out of range \[0, 8\)"),
        "2**64": (IndexError, r"v: token id 18446744073709551616 is out of range \[0, 8\)"),
        "-2**63-1": (IndexError, r"v: token id -9223372036854775809 is out of range \[0, 8\)"),
        "True": (TypeError, "v must be integer token ids, got bool"),
        "1.0": (TypeError, "v must be integer token ids, got float")}),
    # in_positions: one position, likewise
    ("in_positions", lambda v: ft.PositionalEmbedding(8, 4)(v), {
        "2**63": (IndexError, r"t: position 9223372036854775808 is out of range \[0, 8\)"),
        "2**64": (IndexError, r"t: position 18446744073709551616 is out of range \[0, 8\)"),
        "-2**63-1": (IndexError, r"t: position -9223372036854775809 is out of range \[0, 8\)"),
        "True": (TypeError, "t must be integer positions, got bool"),
        "1.0": (TypeError, "t must be integer positions, got float")}),
]


@pytest.mark.parametrize("edge", list(EDGES))
@pytest.mark.parametrize("name,call,want", CONVERTED, ids=[c[0] for c in CONVERTED])
def test_each_converted_argument_at_the_edges_of_64_bits(name, call, want, edge):
    expected = want.get(edge)  # None: the value fits (a numpy int64 is an int)
    if expected is None:
        assert call(EDGES[edge]) is not None
        return
    exc, pattern = expected
    with pytest.raises(exc, match=pattern) as e:
        call(EDGES[edge])
    assert type(e.value) is exc  # not a subclass standing in for it
