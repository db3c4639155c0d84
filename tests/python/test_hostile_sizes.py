"""Sizes and real options from anyone, checked before anything is allocated (the findings of a hostile campaign
whose cause lies in the core's size checks):

  * C2: random features with n_features = 2**61 or 2**62 wrapped D·d_attn and wrote past a small buffer
    (random_feature_matrix, DTransformer/ETransformer attention="performer"|"rfa"): a ValueError now;
  * M2: n_features beyond memory was std::bad_alloc (MemoryError): the size ValueError, by one rule that the
    config and the random-feature part share (random_features.cpp check_n_features);
  * M3: a sliding window wider than any sequence was allocated in full when decoding (3·10^7: seconds and GB,
    10^9: MemoryError), in one-sequence, batched, prefill and speculative decoding: the cache follows the sequence;
  * M4, W1: ViT checked each parameter, not the whole model (L = 2**31 ran a minute into MemoryError), and its
    patch count wrapped (2^64 patches built a model with one position): both ValueErrors before any layer;
  * S5: base = inf was accepted and written as null, so build_model(config_json()) built another model: every
    real option of the schema refuses NaN and ±inf, and the config JSON round trip is exact.

Crash reproducers run in a child process (test_hostile_core.run_child).
"""
from __future__ import annotations

import json
import math
import os
import time

import numpy as np
import pytest

import formal_transformers as ft
from test_hostile_core import run_child


# ------------------------------------------------------------------------------------- C2, M2: n_features
def test_wrapping_n_features_never_crash_the_process():
    r = run_child("""
        import formal_transformers as ft
        calls = [lambda: ft.random_feature_matrix("rfa", 2**62, 4),
                 lambda: ft.random_feature_matrix("performer", 2**62, 4),
                 lambda: ft.random_feature_matrix("rfa", 2**61, 4)]
        for att in ("performer", "rfa"):
            for D in (2**61, 2**62):
                calls.append(lambda att=att, D=D: ft.DTransformer(10, 8, 1, 2, 8, 16, attention=att, n_features=D))
                calls.append(lambda att=att, D=D: ft.ETransformer(10, 8, 1, 2, 8, 16, 8, attention=att, n_features=D))
        for f in calls:
            try:
                f()
                print("built")
            except ValueError as e:
                assert "n_features" in str(e), e
                print("refused")
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["refused"] * 11, r.stdout


@pytest.mark.parametrize("make", [
    lambda D: ft.DTransformer(10, 8, 1, 1, 2048, 16, attention="performer", n_features=D),
    lambda D: ft.ETransformer(10, 8, 1, 1, 2048, 16, 8, attention="rfa", n_features=D),
    lambda D: ft.build_model(json.dumps({"arch": "DTransformer", "n_vocab": 10, "l_max": 8, "L": 1, "H": 1,
                                         "d_e": 2048, "d_mlp": 16, "attention": "rfa", "n_features": D})),
    lambda D: ft.random_feature_matrix("performer", D, 2048),
])
def test_n_features_beyond_memory_is_the_size_value_error(make):
    """2**28 features of d_attn = 2048 (2^39 entries of Ω) and 2**40: ValueError naming n_features at once."""
    for D in (2**28, 2**40):
        t0 = time.perf_counter()
        with pytest.raises(ValueError, match=r"n_features = %d .*exceeds this machine's memory" % D):
            make(D)
        assert time.perf_counter() - t0 < 5


def test_n_features_counts_every_layers_omega():
    """The config's bound is on all L layers' Ω (the model-size check does not count Ω): a D whose Ω one layer
    could hold is refused for 64 layers, before any layer is declared."""
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")  # sizes.hpp's bound
    D = memory // (4 * (4 + 8))  # d_attn = 4: Ω in float32 and the draw's doubles fill memory once
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"n_features = %d .*64 attentions" % D):
        ft.DTransformer(10, 8, 64, 2, 8, 16, attention="performer", n_features=D)
    assert time.perf_counter() - t0 < 5
    ft.DTransformer(10, 8, 64, 2, 8, 16, attention="performer", n_features=64)


# --------------------------------------------------------------------------- M3: a window wider than any sequence
def _same_theta(a, b):
    for k, v in a.params.items():
        b.params[k][...] = v
    return b


@pytest.mark.parametrize("w", [10**9, 2**62, 2**63 - 1])
@pytest.mark.parametrize("positional", ["learned", "rope"])
def test_a_window_wider_than_any_sequence_decodes_as_the_causal_model(w, positional):
    """sliding_window = 10^9 (a MemoryError before), 2^62 (2w wraps) and 2^63 − 1, l_max = 16: one-sequence,
    batched, prefilled and speculative decoding give the tokens of the same model without a window, in
    milliseconds and without allocating the window."""
    kw = dict(positional=positional, dtype="float64")
    causal = ft.DTransformer(13, 16, 2, 2, 8, 16, seed=4, **kw)
    wide = _same_theta(causal, ft.DTransformer(13, 16, 2, 2, 8, 16, seed=9, sliding_window=w, **kw))
    draft = ft.DTransformer(13, 16, 1, 2, 8, 16, seed=5, **kw)
    draft_wide = _same_theta(draft, ft.DTransformer(13, 16, 1, 2, 8, 16, seed=6, sliding_window=w, **kw))
    x, prompts = [1, 2, 3, 4, 5], [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11]]
    t0 = time.perf_counter()
    inf = ft.DInference(6, tau=1.0, seed=3)
    assert np.array_equal(inf(x, wide), inf(x, causal))
    assert all(np.array_equal(a, b) for a, b in zip(inf(prompts, wide), inf(prompts, causal)))
    cache = ft.DInference.prefill(x, wide)
    assert cache.nbytes < 10_000
    assert np.array_equal(inf(cache, wide), inf(x, causal))
    spec = ft.SpeculativeInference(6, k=2, tau=0.0)
    assert np.array_equal(spec(x, wide, draft_wide), spec(x, causal, draft))
    assert time.perf_counter() - t0 < 10


def test_a_window_of_thirty_million_costs_what_the_sequence_uses():
    """The finding's own case: sliding_window = 3·10^7, l_max = 16, DInference(3): it took seconds and 3.7 GB;
    under a 3 GiB address-space limit (the window's 6·10^7 columns are 3.6 GiB) it now decodes."""
    r = run_child("""
        import formal_transformers as ft
        m = ft.DTransformer(10, 16, 1, 2, 8, 16, sliding_window=3 * 10**7)
        print(len(ft.DInference(3)([1, 2, 3], m)), len(ft.DInference(3)([[1, 2, 3], [4]], m)))
    """, limit_as=3 << 30)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["3", "2"], r.stdout


# ----------------------------------------------------------------------------------------------- M4, W1: ViT
def test_vit_checks_the_whole_model_before_any_layer():
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"ViT size: .*L=2147483648.*exceeds this machine's memory"):
        ft.ViT(8, 4, 3, L=2**31, H=2, d_e=8, d_mlp=16)
    with pytest.raises(ValueError, match=r"ViT size: .*n_classes=1099511627776"):
        ft.ViT(8, 4, 2**40, L=1, H=2, d_e=8, d_mlp=16)
    assert time.perf_counter() - t0 < 5  # (40–90 s before)
    ft.ViT(8, 4, 3, L=2, H=2, d_e=8, d_mlp=16)  # a small one still builds


def test_vit_patch_count_and_patch_size_do_not_wrap():
    """2^32 × 2^32 images of 1×1 patches are 2^64 patches (they wrapped to 0: W_p had one column); n_channels·P²
    wraps as well."""
    with pytest.raises(ValueError, match="patches"):
        ft.ViT(2**32, 1, 1, 1, 4, 8, 16)
    with pytest.raises(ValueError, match="patches"):
        ft.ViT((2**40, 2**30), 1, 1, 1, 4, 8, 16)
    with pytest.raises(ValueError, match="n_channels"):
        ft.ViT(2**31, 2**31, 1, 1, 4, 8, 16, n_channels=4)


# ------------------------------------------------------------------------------------- S5: non-finite reals
SIZES = {"DTransformer": (17, 12, 1, 2, 8, 16), "ETransformer": (17, 12, 1, 2, 8, 16, 8),
         "EDTransformer": (17, 12, 1, 1, 2, 8, 16)}
REALS = {"base": "ALL", "eps": "ALL", "init_std": "ALL", "dropout": "ALL", "embed_dropout": "ALL",
         "attn_dropout": "ALL", "resid_dropout": "ALL", "rope_theta": "DTransformer", "mtp_weight": "DTransformer"}


@pytest.mark.parametrize("arch,option", [(a, o) for a in sorted(SIZES) for o in sorted(REALS) if REALS[o] in ("ALL", a)])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_every_real_option_refuses_non_finite_values(arch, option, value):
    with pytest.raises(ValueError, match=option):
        getattr(ft, arch)(*SIZES[arch], **{option: value})


@pytest.mark.parametrize("arch", sorted(SIZES))
def test_base_round_trips_through_the_config_json(arch):
    """base = inf was accepted and written as null (the default), so build_model(config_json()) built another
    model; a finite base, and the default, round trip exactly."""
    for base in (None, 1.5, 12345.678, 1e300):
        m = getattr(ft, arch)(*SIZES[arch], base=base, positional="sinusoidal", dtype="float64")
        back = ft.build_model(m.config_json())
        assert back.config == m.config and back.config_json() == m.config_json()
        assert json.loads(m.config_json())["base"] == base
    text = json.loads(m.config_json())
    for bad in ("1e999", "-1e999"):  # JSON numbers that overflow to ±inf: the bounded JSON reader refuses them
        with pytest.raises(ValueError, match="base|number overflow parsing '-?1e999'"):
            ft.build_model(json.dumps(text).replace('"base": 1e+300', '"base": ' + bad))
