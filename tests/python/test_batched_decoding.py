"""Issue 24.2 / 24.3: Algorithm P (docs/paged_decoding.md) — DInference over a list of prompts, the keys and
values in pages, the sequences decoded together with continuous batching — gives each prompt the tokens
of decoding it alone (same seed), token for token, for every variant the one-sequence cache supports
(RoPE, ALiBi, GQA, sliding window, SwiGLU, bias=False, RMSnorm), float32 and float64, ragged prompt lengths,
past ℓ_max, greedy and sampled; bad input is refused before anything runs; the call releases the GIL and
stops on Ctrl-C. Prompt caches (DInference.prefill, PromptCache.save/load) continue with the tokens of
recomputation and are refused by another config, dtype or θ.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

import formal_transformers as ft
from conftest import check_gil_released_and_ctrl_c, randomize_normal

V = 23


# tiny models: a single-threaded core (as test_inference.py); the threaded test sets its own count
pytestmark = pytest.mark.usefixtures("one_thread")
randomize = randomize_normal  # spread-out parameters, so that sampled paths differ when anything differs


VARIANTS = {
    "gpt2": dict(),
    "sinusoidal": dict(positional="sinusoidal"),
    "rope": dict(positional="rope"),
    "alibi": dict(positional="alibi"),
    "gqa": dict(H=4, H_kv=2),
    "mqa_rope": dict(H=4, H_kv=1, positional="rope"),
    "window": dict(sliding_window=4),
    "window_rope": dict(sliding_window=5, positional="rope"),
    "swiglu_nobias_rms": dict(mlp="swiglu", bias=False, norm="rms"),
    "llama": dict(positional="rope", mlp="swiglu", bias=False, norm="rms", H=4, H_kv=2),
}


def model_of(variant, dtype="float64", seed=0, l_max=20):
    kw = dict(H=2)
    kw.update(VARIANTS[variant])
    m = ft.DTransformer(V, l_max, 2, kw.pop("H"), 16, 32, dtype=dtype, seed=seed, **kw)
    return randomize(m, seed + 7)


def ragged_prompts(l_max, seed=0, n=7):
    """Ragged lengths: 1, l_max (so that ℓ_gen goes past ℓ_max), and others."""
    r = np.random.default_rng(seed)
    lengths = [1, l_max, 5, 17 if l_max >= 17 else l_max - 1, 2, 9, 13][:n]
    return [r.integers(0, V, k) for k in lengths]


def one_by_one(inf, prompts, model):
    return [inf(p, model) for p in prompts]


def same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_batched_equals_one_by_one(variant, dtype):
    """Every variant, both dtypes, greedy and sampled (τ = 1, and with top-k/top-p), 7 ragged prompts with a
    batch of at most 3 (sequences leave and join), 14 new tokens (the l_max prompt decodes past ℓ_max)."""
    m = model_of(variant, dtype)
    prompts = ragged_prompts(20)
    for sampling in (dict(tau=0.0), dict(tau=1.0), dict(tau=0.8, top_k=5, top_p=0.9)):
        for seed in (1, 2):
            inf = ft.DInference(14, seed=seed, max_batch=3, **sampling)
            want = one_by_one(inf, prompts, m)
            got = inf(prompts, m)
            assert isinstance(got, list) and len(got) == len(prompts)
            assert all(g.dtype == want[0].dtype and g.shape == (14,) for g in got)
            assert same(got, want), (variant, dtype, sampling, seed)
    # sampled runs differ between seeds (the streams are really used)
    a = ft.DInference(14, 1.0, seed=1)(prompts, m)
    b = ft.DInference(14, 1.0, seed=2)(prompts, m)
    assert not same(a, b)


@pytest.mark.parametrize("max_batch", [1, 2, 5, 32])
def test_any_batch_size_same_tokens(max_batch):
    m = model_of("rope", "float32")
    prompts = ragged_prompts(20, seed=3)
    inf = ft.DInference(9, 1.0, seed=5, max_batch=max_batch)
    assert same(inf(prompts, m), one_by_one(inf, prompts, m))
    assert inf.max_batch == max_batch and "max_batch=" + str(max_batch) in repr(inf)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_reused_pages_out_of_order_and_crossing_a_page_boundary(dtype):
    """Pages of finished sequences reused by later ones, not adjacent in the pool, and generation crossing a page
    boundary, with the causal mask: the tokens of one-by-one decoding. With max_batch = 2 and pages of 16 tokens
    the pool starts with the 4 pages A and B need (36 and 7 tokens; pages acquired in order 0, 1, 2, 3): A holds
    pages [0, 1, 3], B [2]; both finish together and are released, A's then B's (free list [0, 1, 3, 2], taken
    from its end). C (14 + 6 tokens) takes page 2, D (20 + 6) pages 3 and 1, then C's generation crosses token 16
    into page 0: C's table is [2, 0] and D's [3, 1], every page another sequence's, none adjacent to its
    predecessor."""
    m = ft.DTransformer(V, 40, 2, 2, 16, 32, dtype=dtype, seed=2)
    randomize(m, 11)
    r = np.random.default_rng(5)
    prompts = [r.integers(0, V, k) for k in (30, 1, 14, 20)]  # A, B, C, D
    for sampling in (dict(tau=0.0), dict(tau=1.0, seed=1), dict(tau=1.0, seed=2)):
        inf = ft.DInference(6, max_batch=2, **sampling)
        assert same(inf(prompts, m), one_by_one(inf, prompts, m)), sampling


@pytest.mark.parametrize("context", ["window", "full"])
def test_context_past_l_max(context):
    """Past ℓ_max: 'window' refills from the last ℓ_max tokens (alone), 'full' keeps adding pages (RoPE)."""
    m = model_of("rope", "float64", l_max=8)
    prompts = [np.arange(k) % V for k in (8, 3, 6)]
    inf = ft.DInference(20, 1.0, seed=3, max_batch=2, context=context)
    assert same(inf(prompts, m), one_by_one(inf, prompts, m))


def test_literal_path_and_tuple_and_empty_l_gen():
    m = model_of("gpt2")
    prompts = ragged_prompts(20)
    inf = ft.DInference(6, 1.0, seed=4, cache=False)
    assert same(inf(tuple(prompts), m), one_by_one(inf, prompts, m))
    # cached and literal agree through the batch too
    assert same(ft.DInference(6, 1.0, seed=4)(prompts, m), inf(prompts, m))
    out = ft.DInference(0, seed=1)(prompts, m)
    assert len(out) == len(prompts) and all(len(y) == 0 for y in out)


def test_a_list_of_ids_is_still_one_prompt():
    m = model_of("gpt2")
    inf = ft.DInference(5, 1.0, seed=2)
    y = inf([1, 2, 3], m)
    assert isinstance(y, np.ndarray) and np.array_equal(y, inf(np.array([1, 2, 3]), m))
    assert np.array_equal(inf([np.int64(1), np.int64(2), np.int64(3)], m), y)
    assert same(inf([[1, 2, 3]], m), [y])  # a list holding one prompt: a batch of one


def test_seed_none_gives_valid_tokens():
    m = model_of("gpt2", "float32")
    out = ft.DInference(5, 1.0)(ragged_prompts(20), m)
    assert all(len(y) == 5 and ((0 <= y) & (y < V)).all() for y in out)


@pytest.mark.parametrize(
    "prompts, exc, match",
    [
        ([np.array([1, 2]), np.array([], dtype=int)], ValueError, r"prompts\[1\] is an empty sequence"),
        ([np.array([1, 2]), np.arange(21) % V], ValueError, r"prompts\[1\] has length 21; a prompt has 1 … l_max = 20"),
        ([np.array([1, 2]), np.array([3, V])], IndexError, "prompts"),
        ([np.array([1, 2]), np.array([-1])], IndexError, "prompts"),
        ([np.array([1, 2]), "abc"], TypeError, "prompts"),
    ],
)
def test_bad_prompts_refused_before_anything_runs(prompts, exc, match):
    """The bad prompt is the last of the list, after a long one: the error comes at once (checked first)."""
    m = model_of("gpt2", "float32")
    long = ft.DInference(100000, 1.0, seed=0)
    t0 = time.perf_counter()
    with pytest.raises(exc, match=match):
        long(prompts, m)
    assert time.perf_counter() - t0 < 0.5


def test_bad_options_and_model():
    m = model_of("gpt2")
    with pytest.raises(ValueError, match="max_batch must be >= 1"):
        ft.DInference(3, max_batch=0)
    with pytest.raises(TypeError, match="DInference needs a DTransformer"):
        ft.DInference(3)([np.array([1])], object())
    with pytest.raises(ValueError, match="context='full'"):
        ft.DInference(3, context="full")([np.array([1])], m)  # learned positions: a table of l_max columns


def test_gil_released_and_ctrl_c_stops():
    """A long batched call lets another Python thread run and a real SIGINT stops it with KeyboardInterrupt;
    the model stays usable."""
    ft.set_num_threads(min(2, ft.max_num_threads()))
    m = ft.DTransformer(V, 4096, 2, 2, 64, 256, dtype="float32", seed=0, positional="rope")
    prompts = [np.arange(k) % V for k in (3, 50, 7, 20)]
    inf = ft.DInference(1500, 1.0, seed=0)
    check_gil_released_and_ctrl_c([lambda: inf(prompts, m), lambda: ft.DInference(4000, 1.0, seed=0)(prompts, m)])
    assert len(ft.DInference(3, 0.0)(prompts, m)) == 4


# ------------------------------------------ prompt caches (24.3) ------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("variant", ["gpt2", "rope", "alibi", "gqa", "window_rope", "llama"])
def test_prompt_cache_continues_as_recomputation(variant, dtype, tmp_path):
    m = model_of(variant, dtype)
    prompt = np.random.default_rng(1).integers(0, V, 12)
    cache = ft.DInference.prefill(prompt, m)
    assert len(cache) == cache.n_tokens == 12 and np.array_equal(cache.ids, prompt) and cache.dtype == dtype
    path = tmp_path / "prompt.safetensors"
    cache.save(path)
    loaded = ft.PromptCache.load(path, m)
    assert loaded.config_hash == cache.config_hash and loaded.theta_digest == cache.theta_digest
    assert loaded.nbytes == cache.nbytes
    for sampling in (dict(tau=0.0), dict(tau=1.0, top_k=6)):
        inf = ft.DInference(15, seed=3, **sampling)  # 12 + 15 > l_max = 20: past ℓ_max too
        want = inf(prompt, m)
        assert np.array_equal(inf(cache, m), want)
        assert np.array_equal(inf(loaded, m), want)
        # in a batch, beside plain prompts
        others = ragged_prompts(20, n=3)
        assert same(inf([others[0], loaded, others[1]], m), [inf(others[0], m), want, inf(others[1], m)])
    literal = ft.DInference(5, 1.0, seed=2, cache=False)
    assert np.array_equal(literal(loaded, m), literal(prompt, m))


def test_prompt_cache_refused_by_another_model(tmp_path):
    m = model_of("rope", "float64")
    prompt = np.array([3, 1, 4, 1, 5])
    cache = ft.DInference.prefill(prompt, m)
    path = tmp_path / "c.safetensors"
    cache.save(path)
    inf = ft.DInference(4, 0.0)
    another_config = model_of("alibi", "float64")
    other_dtype = model_of("rope", "float32")
    other_theta = randomize(model_of("rope", "float64"), 99)  # the same config (seed included), other parameters
    for other, match in ((another_config, "another model config"), (other_dtype, "another model config or dtype"),
                         (other_theta, "other parameters")):
        with pytest.raises(ValueError, match=match):
            inf(cache, other)
        with pytest.raises(ValueError, match=match):
            ft.PromptCache.load(path, other)
        with pytest.raises(ValueError, match=match):
            inf([prompt, cache], other)
    # θ changed after the cache was made (a training step): refused, then recomputed it works again
    m.params["W_e"][0, 0] += 1.0
    with pytest.raises(ValueError, match="other parameters"):
        inf(cache, m)
    assert np.array_equal(inf(ft.DInference.prefill(prompt, m), m), inf(prompt, m))


def test_prompt_cache_bad_input(tmp_path):
    m = model_of("gpt2")
    with pytest.raises(ValueError, match="empty"):
        ft.DInference.prefill(np.array([], dtype=int), m)
    with pytest.raises(ValueError, match="length 21"):
        ft.DInference.prefill(np.arange(21) % V, m)
    with pytest.raises(IndexError):
        ft.DInference.prefill(np.array([V]), m)
    with pytest.raises(TypeError, match="DTransformer"):
        ft.DInference.prefill(np.array([1]), object())
    # a model file is not a prompt cache; a damaged file is refused
    ft.save(m, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="not a prompt cache"):
        ft.PromptCache.load(tmp_path / "model.safetensors", m)
    cache = ft.DInference.prefill(np.array([1, 2, 3]), m)
    cache.save(tmp_path / "c.safetensors")
    data = (tmp_path / "c.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) - 8])
    with pytest.raises(ValueError):
        ft.PromptCache.load(tmp_path / "cut.safetensors", m)
    with pytest.raises(TypeError, match="path"):
        cache.save(3)
    assert repr(cache).startswith("PromptCache(n_tokens=3, dtype='float64', config_hash='")


# ------------------------------------------------------------------------------------------------------
# models whose decoding state is not Algorithm P's pages: refused with a ValueError naming the option


@pytest.mark.parametrize("opts, match", [
    (dict(mask="prefix"), "prefix LM"),
    (dict(positional="rope", bias=False, kv_lora_rank=8, qk_rope_head_dim=4), "kv_lora_rank"),
    (dict(attention="performer", n_features=8), "attention='performer' has no"),
    (dict(attention="sigmoid"), "attention='sigmoid' has no"),
])
def test_models_without_pages_are_refused(opts, match):
    m = ft.DTransformer(20, 16, 1, 2, 16, 32, dtype="float64", **opts)
    prompts = [np.array([1, 2, 3]), np.array([4, 5])]
    before = {k: np.array(v) for k, v in m.params.items()}
    with pytest.raises(ValueError, match=match):
        ft.DInference(3, 0.0)(prompts, m)
    with pytest.raises(ValueError, match=match):
        ft.DInference.prefill(prompts[0], m)
    for k, v in m.params.items():
        np.testing.assert_array_equal(v, before[k])
    # one prompt at a time decodes as before
    y = ft.DInference(3, 0.0)(prompts[0], m)
    assert len(y) == 3 and all(0 <= int(t) < 20 for t in y)


def test_prefix_len_is_an_option_of_one_prompt():
    m = ft.DTransformer(20, 16, 1, 2, 16, 32, mask="prefix")
    with pytest.raises(ValueError, match="prefix_len"):
        ft.DInference(2, 0.0)([np.array([1, 2]), np.array([3])], m, prefix_len=1)
    assert len(ft.DInference(2, 0.0)(np.array([1, 2, 3]), m, prefix_len=2)) == 2
