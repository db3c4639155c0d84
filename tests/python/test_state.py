"""The state a model keeps from its last forward call (for backward and for attention_weights): asked for
before any forward, for a layer or a sequence it does not have, after a batch and then a single sequence,
after cached decoding — always the last forward's matrices or a clear Python exception, never a crash or
stale memory (issue 11, items 1 and 4).

A case that used to crash the interpreter runs in a subprocess, so that a regression fails this test with
its input instead of killing the whole run.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref

from conftest import rel_err


def run_isolated(code: str) -> str:
    """Run `code` in a fresh interpreter that imports formal_transformers as ft; return its stdout.
    Fails (with the code and its output) if the interpreter dies or exits with an error."""
    prog = "import numpy as np\nimport formal_transformers as ft\n" + textwrap.dedent(code)
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert r.returncode == 0, f"exit code {r.returncode} running:\n{prog}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r.stdout


def expect_error(call: str, setup: str) -> tuple[str, str]:
    """(exception type name, message) that `call` raises after `setup`, found in a subprocess."""
    out = run_isolated(setup + textwrap.dedent(f"""
        try:
            {call}
        except Exception as e:
            print(type(e).__name__)
            print(str(e))
        else:
            print("no exception")
            print("")
        """))
    kind, msg = out.split("\n", 1)
    return kind, msg.strip()


MODELS = {
    "D": "m = ft.DTransformer(12, 8, 2, 2, 8, 16, dtype='float64')\n",
    "E": "m = ft.ETransformer(12, 8, 2, 2, 8, 16, 8, dtype='float64')\n",
    "ED": "m = ft.EDTransformer(12, 8, 2, 2, 2, 8, 16, dtype='float64')\n",
}
FIRST_LAYER = {"D": "m.attention_weights(0)", "E": "m.attention_weights(0)", "ED": "m.attention_weights('enc', 0)"}


@pytest.mark.parametrize("arch", ["D", "E", "ED"])
def test_attention_weights_before_any_forward_is_a_clear_error(arch):
    kind, msg = expect_error(FIRST_LAYER[arch], MODELS[arch])
    assert kind == "ValueError", (kind, msg)
    assert "forward" in msg and "attention_weights" in msg, msg


@pytest.mark.parametrize("which", ["dec", "cross", "enc"])
def test_ed_attention_weights_after_only_cached_decoding_is_a_clear_error(which):
    """EDInference with the cache runs the encoder and the cached decoder, not Algorithm 8's forward: there is
    no last forward to show."""
    kind, msg = expect_error(f"m.attention_weights('{which}', 0)",
                             MODELS["ED"] + "ft.EDInference(tau=0, max_len=5)(np.array([1, 2, 3]), m)\n")
    assert kind == "ValueError", (kind, msg)
    assert "forward" in msg, msg


@pytest.mark.parametrize("arch", ["D", "E", "ED"])
@pytest.mark.parametrize("seq", [1, 2, 2**31, -1])
def test_attention_weights_sequence_out_of_range_is_an_index_error(arch, seq):
    call = "m(np.array([1, 2, 3]))\n" if arch != "ED" else "m(np.array([1, 2]), np.array([1, 2, 3]))\n"
    what = FIRST_LAYER[arch][:-1] + f", {seq})"
    kind, msg = expect_error(what, MODELS[arch] + call)
    assert kind == "IndexError", (kind, msg)
    assert "seq" in msg and str(seq) in msg and "[0, 1)" in msg, msg


@pytest.mark.parametrize("arch", ["D", "E", "ED"])
@pytest.mark.parametrize("layer", [2, 2**31, -1])
def test_attention_weights_layer_out_of_range_is_an_index_error(arch, layer):
    call = "m(np.array([1, 2, 3]))\n" if arch != "ED" else "m(np.array([1, 2]), np.array([1, 2, 3]))\n"
    what = FIRST_LAYER[arch].replace("0)", f"{layer})")
    kind, msg = expect_error(what, MODELS[arch] + call)
    assert kind == "IndexError", (kind, msg)
    assert "layer" in msg and str(layer) in msg and "[0, 2)" in msg, msg


def _model(arch):
    return {"D": lambda: ft.DTransformer(12, 8, 2, 2, 8, 16, dtype="float64", seed=1),
            "E": lambda: ft.ETransformer(12, 8, 2, 2, 8, 16, 8, dtype="float64", seed=1),
            "ED": lambda: ft.EDTransformer(12, 8, 2, 2, 2, 8, 16, dtype="float64", seed=1)}[arch]()


@pytest.mark.parametrize("arch", ["D", "E"])
def test_attention_weights_follow_the_last_forward_not_an_earlier_batch(arch):
    """A batch of two sequences, then one sequence: sequence 1 no longer exists, and sequence 0 is the new
    one (its matrices equal those of a fresh model called on it alone)."""
    m, fresh = _model(arch), _model(arch)
    m(np.array([[1, 2, 3, 4], [5, 6, 7, 8]]))
    m(np.array([3, 1, 2]))
    fresh(np.array([3, 1, 2]))
    for layer in range(2):
        got = m.attention_weights(layer, 0)
        assert got.shape == (2, 3, 3)
        np.testing.assert_array_equal(got, fresh.attention_weights(layer, 0))
        with pytest.raises(IndexError, match=r"seq"):
            m.attention_weights(layer, 1)


def test_ed_attention_weights_follow_the_last_forward_not_an_earlier_batch():
    m, fresh = _model("ED"), _model("ED")
    m([np.array([1, 2, 3, 4, 5]), np.array([1, 2])], [np.array([4, 5]), np.array([6, 7, 8, 9])])
    m(np.array([3, 1, 2]), np.array([7, 8]))
    fresh(np.array([3, 1, 2]), np.array([7, 8]))
    for kind, shape in [("enc", (2, 3, 3)), ("dec", (2, 2, 2)), ("cross", (2, 3, 2))]:
        for layer in range(2):
            got = m.attention_weights(kind, layer, 0)
            assert got.shape == shape
            np.testing.assert_array_equal(got, fresh.attention_weights(kind, layer, 0))
            with pytest.raises(IndexError, match=r"seq"):
                m.attention_weights(kind, layer, 1)


@pytest.mark.parametrize("cache", [True, False])
def test_ed_attention_weights_after_inference_are_the_last_forward(cache):
    """After EDInference, attention_weights('enc', 0) is the encoder's softmax of the last forward call
    (Algorithm 4 recomputed from the parameters): its shape is that forward's, its columns sum to 1. Without
    the cache, EDInference's own forwards are the last ones: then the shape is the inference context's."""
    m = _model("ED")
    p = dict(m.params)
    z = np.array([1, 2, 3, 4, 5, 6])
    m(z, np.array([7, 8]))
    z_inf = np.array([1, 2, 3])
    ft.EDInference(tau=0, max_len=4, cache=cache)(z_inf, m)
    last_z = z if cache else z_inf
    got = m.attention_weights("enc", 0)
    l_z = len(last_z)
    assert got.shape == (2, l_z, l_z)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    Z = p["W_e"][:, last_z] + p["W_p"][:, :l_z]
    mask = ref.bidirectional_mask(l_z, l_z)
    want = np.stack([ref.attention_weights(Z, Z, p["enc.0.attn.W_q"][h], p["enc.0.attn.b_q"][h],
                                           p["enc.0.attn.W_k"][h], p["enc.0.attn.b_k"][h], mask) for h in range(2)])
    assert rel_err(got, want) <= 1e-12


def test_attention_weights_after_an_interrupted_or_failed_forward_keep_the_last_complete_one():
    """A forward that fails its input checks changes nothing: the last complete forward stays readable."""
    m = _model("D")
    m(np.array([1, 2, 3]))
    before = m.attention_weights(1, 0)
    with pytest.raises(IndexError):
        m(np.array([1, 2, 99]))
    with pytest.raises(ValueError):
        m(np.arange(9) % 5)  # longer than l_max
    np.testing.assert_array_equal(m.attention_weights(1, 0), before)


def test_ed_attention_weights_kind_is_checked():
    m = _model("ED")
    m(np.array([1, 2]), np.array([3, 4]))
    with pytest.raises(ValueError, match="kind"):
        m.attention_weights("self", 0)
