"""The checks every Hugging Face family converter passes (tests/python/test_hf_<family>.py): HF models from tiny
random configs (no network) with every weight random, ft's P and every gradient against HF's in float64 (the
errors are returned, so a test asserts them and a report can print them), ft → HF → ft and save_hf / load_hf
exact, greedy generation token for token, batched decoding equal to decoding one prompt at a time."""
from __future__ import annotations

import copy
import os

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import formal_transformers as ft  # noqa: E402
from conftest import rel_err  # noqa: E402

TOL64 = 1e-10


def randomise(hf, seed=0):
    """Every parameter random (torch generator `seed`): norm gains 1 + 0.3 z, everything else 0.3 z."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype) * 0.3
            gain = name.endswith("weight") and ("norm" in name.lower()) and p.dim() == 1
            p.copy_(r + 1 if gain else r)
    return hf.eval()


def grads_as_ft(hf) -> dict:
    """HF's .grad of every parameter in ft's layout: a copy holding the gradients as its weights, read by from_hf."""
    import torch

    c = copy.deepcopy(hf)
    with torch.no_grad():
        for p, q in zip(hf.parameters(), c.parameters()):
            q.copy_(p.grad if p.grad is not None else torch.zeros_like(p))
    return {k: np.array(v) for k, v in ft.from_hf(c).params.items()}


def grad_errors(grads: dict, hf_grads: dict) -> float:
    """The largest relative error over every gradient HF has (b_k: both must be rounding noise around 0, the
    softmax ignores it, unless it is rotated by RoPE: then compared as the rest)."""
    worst = 0.0
    scale = max(np.abs(g).max() for g in hf_grads.values())
    for k, g in hf_grads.items():
        if k.endswith("b_k") and np.abs(g).max() <= 1e-12 * scale:
            assert np.abs(grads[k]).max() <= 1e-12 * scale, k
            continue
        worst = max(worst, rel_err(grads[k], g))
    return worst


def decoder_errors(hf, m, x) -> tuple:
    """(P's error, the loss's, the worst gradient's) of ft's model m against the HF causal LM on one sequence x:
    the next-token loss summed (ft's Algorithm 13) against a float64 cross-entropy of HF's logits."""
    import torch

    ids = torch.as_tensor(np.asarray(x))[None]
    hf.zero_grad()
    logits = hf(ids).logits[0]
    e_P = rel_err(m(np.asarray(x)), torch.softmax(logits, -1).detach().numpy().T)
    loss_hf = torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:], reduction="sum")
    loss_hf.backward()
    loss, grads = m.loss_and_grad(np.asarray(x))
    hf_grads = grads_as_ft(hf)
    assert set(hf_grads) == set(grads), set(hf_grads) ^ set(grads)
    return e_P, abs(loss - loss_hf.item()) / abs(loss_hf.item()), grad_errors(grads, hf_grads)


def assert_same_params(a, b):
    assert a.config == b.config
    assert set(a.params) == set(b.params)
    for k, v in a.params.items():
        assert np.array_equal(np.asarray(b.params[k]), np.asarray(v)), k


def round_trips(m, tmp_path, hf_class=None):
    """ft → HF → ft and ft → save_hf → (transformers' from_pretrained, with every tensor found) → load_hf, exact;
    returns the HF model."""
    import transformers

    kw = {} if hf_class is None else {"hf_class": hf_class}
    hf = ft.to_hf(m, **kw)
    assert_same_params(m, ft.from_hf(hf))
    ft.save_hf(m, tmp_path, **kw)
    auto_cls = transformers.AutoModelForMaskedLM if m.config["arch"] == "ETransformer" else transformers.AutoModelForCausalLM
    auto, info = auto_cls.from_pretrained(tmp_path, output_loading_info=True)
    assert type(auto).__name__ == type(hf).__name__
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert_same_params(m, ft.load_hf(tmp_path))
    return hf


def greedy_equals_hf(hf, m, prompt, n):
    import torch

    out = hf.generate(torch.as_tensor(np.asarray(prompt))[None], max_new_tokens=n, min_new_tokens=n, do_sample=False,
                      eos_token_id=None, pad_token_id=0)[0, len(prompt):].numpy()
    for cache in (True, False):
        assert list(ft.DInference(n, 0.0, cache=cache)(np.asarray(prompt), m)) == list(out), cache


def batched_equals_one_by_one(m, prompts, n):
    alone = [ft.DInference(n, 0.0)(np.asarray(p), m) for p in prompts]
    batched = ft.DInference(n, 0.0)([np.asarray(p) for p in prompts], m)
    assert all(np.array_equal(b, a) for b, a in zip(batched, alone))


def hf_float64_errors_within(hf, m, x, to_hf_grads, tol_grad=1e-10):
    """In float64 on one sequence x: ft's P equals the HF causal LM's softmax and its summed next-token loss HF's
    cross-entropy (both ≤ 1e-12), and every HF parameter's gradient ≤ tol_grad from ft's gradients put under HF's
    names by to_hf_grads (the converter's own from_ft; exactly HF's parameter names)."""
    import torch

    ids = torch.as_tensor(np.asarray(x))[None]
    logits = hf(ids).logits[0]
    assert rel_err(m(np.asarray(x)), torch.softmax(logits, dim=-1).detach().numpy().T) <= 1e-12
    loss_hf = torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:], reduction="sum")
    hf.zero_grad()
    loss_hf.backward()
    loss, grads = m.loss_and_grad(np.asarray(x))
    assert abs(loss - loss_hf.item()) <= 1e-12 * abs(loss_hf.item())
    hf_grads = {k: p.grad.numpy() for k, p in hf.named_parameters()}
    back = to_hf_grads(grads)
    assert set(back) == set(hf_grads)
    errs = {k: rel_err(back[k], g) for k, g in hf_grads.items()}
    assert max(errs.values()) <= tol_grad, errs


def greedy_and_batched_equal_hf(hf, m, prompts, n):
    """HF's greedy generation of n tokens after each prompt: ft's with and without the cache, one prompt at a
    time, and batched."""
    import torch

    want = [hf.generate(torch.as_tensor(p)[None], max_new_tokens=n, min_new_tokens=n, do_sample=False,
                        eos_token_id=None, pad_token_id=0)[0, len(p):].numpy() for p in prompts]
    for p, w in zip(prompts, want):
        for cache in (True, False):
            assert list(ft.DInference(n, 0.0, cache=cache)(p, m)) == list(w), cache
    assert [list(b) for b in ft.DInference(n, 0.0)(prompts, m)] == [list(w) for w in want]


def round_trips_exactly(hf, tmp_path, class_name, same_keys=False):
    """from_hf(hf), then to_hf: a class_name whose every tensor hf also has is equal to hf's (with same_keys, the
    two have the same tensors), ft → HF → ft gives the config and θ again, save_hf → load_hf too. Returns (the ft
    model, the exported HF model)."""
    import torch

    model = ft.from_hf(hf)
    hf2 = ft.to_hf(model)
    assert type(hf2).__name__ == class_name
    s1, s2 = hf.state_dict(), hf2.state_dict()
    if same_keys:
        assert set(s1) == set(s2)
    for k, v in s1.items():
        if k in s2:
            assert torch.equal(v, s2[k]), k
    assert_same_params(model, ft.from_hf(hf2))
    ft.save_hf(model, tmp_path / "m")
    assert_same_params(model, ft.load_hf(tmp_path / "m"))
    return model, hf2
