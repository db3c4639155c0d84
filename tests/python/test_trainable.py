"""The trainers' trainable= (a subset of θ trains, the rest frozen): frozen parameters bit-identical, the trained
ones equal the same update applied by hand (float64), Adam's moments only for the trained ones, the backward
leaving frozen weights' gradients out, bad patterns refused before anything changes, the CLI's --trainable."""
from __future__ import annotations

import fnmatch
import json

import numpy as np
import pytest

import formal_transformers as ft
from conftest import rel_err


def _decoder(seed=0, dtype="float64", **kw):
    return ft.DTransformer(23, 16, 2, 2, 8, 16, dtype=dtype, seed=seed, **kw)


def _data(n=4, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 20, size=int(rng.integers(6, 12))) for _ in range(n)]


def _trained(model, patterns):
    return {k for k in model.params if any(fnmatch.fnmatchcase(k, p) for p in patterns)}


PATTERNS = ["*gamma*", "W_e", "layers.1.attn.W_?"]


def _adam_by_hand(model, data, patterns, steps, eta, betas=(0.9, 0.999), eps=1e-8):
    """The trainer's run (batch = the whole data, no shuffle, reduction 'sum': the mean over the batch of the
    listing's loss) with Adam applied in numpy to the trained parameters only (torch's Adam, term by term)."""
    names = _trained(model, patterns)
    m = {k: np.zeros_like(model.params[k]) for k in names}
    v = {k: np.zeros_like(model.params[k]) for k in names}
    for t in range(1, steps + 1):
        _, grads = model.loss_and_grad(data)
        for k in names:
            g = grads[k] / len(data)
            m[k] = betas[0] * m[k] + (1 - betas[0]) * g
            v[k] = betas[1] * v[k] + (1 - betas[1]) * g * g
            denom = np.sqrt(v[k]) / np.sqrt(1 - betas[1] ** t) + eps
            model.params[k] = model.params[k] - (eta / (1 - betas[0] ** t)) * (m[k] / denom)
    return names


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_frozen_bit_identical_and_trained_equal_the_update_by_hand(optimizer):
    data = _data()
    model, by_hand = _decoder(), _decoder()
    theta0 = {k: v.copy() for k, v in model.params.items()}
    trainer = ft.DTraining(3, 1e-2, optimizer=optimizer, trainable=PATTERNS, batch_size=len(data), shuffle=False,
                           progress=False)
    trainer(data, model)
    if optimizer == "adam":
        names = _adam_by_hand(by_hand, data, PATTERNS, 3, 1e-2)
    else:
        names = _trained(by_hand, PATTERNS)
        for _ in range(3):
            _, grads = by_hand.loss_and_grad(data)
            for k in names:
                by_hand.params[k] = by_hand.params[k] - 1e-2 * grads[k] / len(data)
    assert names and len(names) < len(theta0)
    for k, v in model.params.items():
        if k in names:
            assert not np.array_equal(v, theta0[k]), k
            assert rel_err(v, by_hand.params[k]) <= 1e-12, k
        else:
            assert np.array_equal(v, theta0[k]), k  # bit for bit
    assert list(model.params) == list(theta0) and list(model.grads) == list(theta0)  # θ's layout as it was


def test_adam_moments_exist_only_for_trained_parameters():
    model = _decoder()
    trainer = ft.DTraining(1, 1e-2, trainable=PATTERNS, progress=False)
    trainer(_data(), model)
    sd = trainer.optimizer.state_dict()
    names = _trained(model, PATTERNS)
    assert sd["m"].size == sd["v"].size == sum(model.params[k].size for k in names)
    # the ranges they cover are exactly the trained parameters' places in the flat θ
    offsets, at = {}, 0
    for k, p in model.params.items():
        offsets[k] = (at, at + p.size)
        at += p.size
    covered = {k for k, (b, e) in offsets.items() if any(rb <= b and e <= re for rb, re in sd["ranges"])}
    assert covered == names
    full = ft.DTraining(1, 1e-2, progress=False)
    full(_data(), _decoder())
    assert full.optimizer.state_dict()["m"].size == model.n_params


def test_frozen_weights_get_no_gradient_work_during_training_and_all_afterwards():
    data = _data()
    model = _decoder()
    ft.DTraining(1, 1e-2, trainable=["*gamma*"], batch_size=len(data), progress=False)(data, model)
    g = model.grads  # the last step's gradient: the frozen weights' products were left out (zero)
    assert np.all(g["layers.0.attn.W_q"] == 0) and np.all(g["layers.0.W_mlp1"] == 0)
    assert np.all(g["layers.0.attn.W_o"] == 0) and np.all(g["layers.0.b_mlp2"] == 0)
    assert np.any(g["layers.0.gamma1"] != 0)
    # the subset holds for the run only: a later loss_and_grad computes every gradient
    _, grads = model.loss_and_grad(data)
    ref = _decoder()
    ref.params.update({k: np.array(v) for k, v in model.params.items()})
    _, ref_grads = ref.loss_and_grad(data)
    for k in grads:
        assert rel_err(grads[k], ref_grads[k]) <= 1e-12, k
    assert np.any(grads["layers.0.attn.W_q"] != 0)


def test_trained_subset_gradients_equal_the_full_backward():
    """The gradient of each trained parameter in a frozen run's step is the full backward's (float64)."""
    data = _data()
    model = _decoder(seed=4)
    full = _decoder(seed=4)
    _, ref = full.loss_and_grad(data)
    ft.DTraining(1, 0.0, optimizer="sgd", trainable=["*W_q", "*b_v", "*W_mlp2", "W_u"], batch_size=len(data),
                 shuffle=False, progress=False)(data, model)
    for k in _trained(model, ["*W_q", "*b_v", "*W_mlp2", "W_u"]):
        assert rel_err(model.grads[k] * len(data), ref[k]) <= 1e-12, k


@pytest.mark.parametrize("kind", ["e", "ed"])
def test_encoder_and_encoder_decoder_trainers_take_trainable(kind):
    rng = np.random.default_rng(0)
    if kind == "e":
        model = ft.ETransformer(23, 16, 2, 2, 8, 16, 8, dtype="float64", seed=0)
        trainer = ft.ETraining(2, 1e-2, p_mask=0.5, trainable=["*beta*", "W_f"], progress=False)
        args = ([rng.integers(0, 20, size=10) for _ in range(3)], model)
        names = _trained(model, ["*beta*", "W_f"])
    else:
        model = ft.EDTransformer(23, 16, 1, 1, 2, 8, 16, dtype="float64", seed=0)
        trainer = ft.EDTraining(2, 1e-2, trainable=["dec.*"], progress=False)
        args = ([rng.integers(0, 20, size=8) for _ in range(3)], [rng.integers(0, 20, size=7) for _ in range(3)], model)
        names = _trained(model, ["dec.*"])
    theta0 = {k: v.copy() for k, v in model.params.items()}
    trainer(*args)
    for k, v in model.params.items():
        assert np.array_equal(v, theta0[k]) == (k not in names), k


def test_a_pattern_matching_nothing_is_a_value_error_before_anything_changes():
    model = _decoder()
    theta0 = {k: v.copy() for k, v in model.params.items()}
    opt = ft.Adam(1e-2)
    trainer = ft.DTraining(1, optimizer=opt, trainable=["W_e", "*.attn.W_z"], progress=False)
    with pytest.raises(ValueError, match=r"\*\.attn\.W_z"):
        trainer(_data(), model)
    assert all(np.array_equal(v, theta0[k]) for k, v in model.params.items())
    assert opt.state_dict()["t"] == 0 and trainer.history["step"] == []
    # the model trains as a whole afterwards (nothing left frozen)
    ft.DTraining(1, 1e-2, progress=False)(_data(), model)
    assert not np.array_equal(model.params["layers.0.attn.W_q"], theta0["layers.0.attn.W_q"])


@pytest.mark.parametrize("value, error, words", [
    (3, TypeError, "trainable"), ([1], TypeError, "str"), ([], ValueError, "empty"), ([""], ValueError, "empty"),
    (["a\nb"], ValueError, "newline"),
])
def test_bad_trainable_values(value, error, words):
    with pytest.raises(error, match=words):
        ft.DTraining(1, 1e-2, trainable=value)


def test_trainable_in_the_options_and_the_docstring():
    t = ft.DTraining(1, 1e-2, trainable="W_e")
    assert t.options["trainable"] == ["W_e"]
    assert ft.DTraining(1, 1e-2).options["trainable"] is None
    assert "trainable=None" in ft.DTraining.__doc__


def test_glob_rules_are_fnmatch():
    model = _decoder()
    for pattern in ["layers.[0].*", "layers.[!0].W_mlp?", "*.b_?", "W_[eu]", "layers.?.gamma[12]"]:
        trainer = ft.DTraining(1, 0.0, optimizer="sgd", trainable=[pattern], progress=False)
        trainer(_data(1), model)
        g = model.grads
        for k in model.params:
            trained = fnmatch.fnmatchcase(k, pattern)
            if not trained:
                assert np.all(g[k] == 0) or k in ("W_e", "W_p", "W_u") or "gamma" in k or "beta" in k or "b_" in k, (pattern, k)


def test_adam_state_with_a_subset_resumes():
    data = _data()
    one = _decoder()
    t = ft.DTraining(2, 1e-2, trainable=PATTERNS, batch_size=len(data), shuffle=False, progress=False)
    t(data, one)
    two = _decoder()
    t1 = ft.DTraining(1, 1e-2, trainable=PATTERNS, batch_size=len(data), shuffle=False, progress=False)
    t1(data, two)
    sd = t1.optimizer.state_dict()
    opt = ft.Adam(1e-2)
    opt.load_state_dict(two, sd)
    ft.DTraining(1, optimizer=opt, trainable=PATTERNS, batch_size=len(data), shuffle=False, progress=False)(data, two)
    for k in one.params:
        assert rel_err(one.params[k], two.params[k]) <= 1e-12, k
    # an Adam of one subset refuses another
    with pytest.raises(ValueError, match="trainable parameters"):
        ft.DTraining(1, optimizer=opt, trainable=["W_e"], progress=False)(data, two)
    # a state without ranges over the whole θ (older files) still loads
    full = ft.DTraining(1, 1e-2, progress=False)
    m = _decoder()
    full(data, m)
    sd = full.optimizer.state_dict()
    opt2 = ft.Adam(1e-2)
    opt2.load_state_dict(m, {"t": sd["t"], "m": sd["m"], "v": sd["v"]})
    assert np.array_equal(opt2.state_dict()["m"], sd["m"])


def test_cli_trainable_is_recorded_and_freezes(tmp_path, capsys):
    from formal_transformers import cli

    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    out = tmp_path / "run"
    args = ["train", "--text", str(text), "--out", str(out), "--steps", "2", "--layers", "1", "--heads", "1",
            "--d-e", "8", "--d-mlp", "16", "--context", "16", "--batch", "2", "--eval-every", "0", "--quiet",
            "--warmup", "0", "--trainable", "*gamma*", "W_u"]
    cli.main(args)
    run = json.loads((out / "run.json").read_text())
    assert run["args"]["trainable"] == ["*gamma*", "W_u"]
    model = ft.load(out / "model.safetensors")
    fresh = ft.DTransformer(model.n_vocab, model.l_max, 1, 1, 8, 16, seed=0)
    assert np.array_equal(model.params["layers.0.attn.W_q"], fresh.params["layers.0.attn.W_q"])
    assert not np.array_equal(model.params["W_u"], fresh.params["W_u"])
    cli.main(args[:args.index("--steps") + 1] + ["3"] + args[args.index("--steps") + 2:] + ["--resume"])
    assert json.loads((out / "run.json").read_text())["steps_done"] == 3
    with pytest.raises(SystemExit):
        cli.main(args[:-2] + ["W_nothing"] + ["--out", str(tmp_path / "other")])
    assert "the pattern 'W_nothing' matches no parameter" in capsys.readouterr().err
    assert not (tmp_path / "other" / "model.safetensors").exists()


def test_etraining_with_fixed_masks_equals_the_update_by_hand():
    rng = np.random.default_rng(3)
    x = [rng.integers(0, 20, size=8) for _ in range(3)]
    model = ft.ETransformer(23, 16, 2, 2, 8, 16, 8, dtype="float64", seed=0)
    xt = [s.copy() for s in x]
    for s in xt:
        s[-2:] = model.mask_token  # the last two tokens are the task's answer
    by_hand = ft.ETransformer(23, 16, 2, 2, 8, 16, 8, dtype="float64", seed=0)
    ft.ETraining(2, 0.05, optimizer="sgd", batch_size=3, shuffle=False, trainable=["W_u", "*beta*"],
                 progress=False)(x, model, x_tilde=xt)
    for _ in range(2):
        _, g = by_hand.loss_and_grad(xt, x)
        for k in _trained(by_hand, ["W_u", "*beta*"]):
            by_hand.params[k] = by_hand.params[k] - 0.05 * g[k] / 3
    for k in model.params:
        assert rel_err(model.params[k], by_hand.params[k]) <= 1e-12, k
    with pytest.raises(ValueError, match="x_tilde"):
        ft.ETraining(1, 0.05, progress=False)(x, model, x_tilde=xt[:2])
    with pytest.raises(IndexError):
        ft.ETraining(1, 0.05, progress=False)(x, model, x_tilde=[s + 30 for s in xt])
