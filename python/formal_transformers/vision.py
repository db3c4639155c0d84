"""Images for ft.ViT (listing V14, docs/variants.md): scikit-learn's handwritten digits with the project's fixed
split, a minibatch Adam loop through the core's loss_and_grad, and the logistic-regression baseline."""
from __future__ import annotations

import time

import numpy as np

from . import _core


def digits_split(test_size: float = 0.25, random_state: int = 0):
    """sklearn.datasets.load_digits (1,797 8×8 images, shipped with scikit-learn: offline) as (B, 1, 8, 8)
    float64 images in [0, 1] (pixel / 16) and integer labels, split by
    train_test_split(test_size=0.25, random_state=0, stratify=labels): ((x_train, y_train), (x_test, y_test))
    with 1,347 and 450 images."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = (d.images / 16.0).reshape(-1, 1, 8, 8)
    y = d.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=test_size, random_state=random_state, stratify=y)
    return (x_tr, y_tr), (x_te, y_te)


def train_vit(model, x, y, *, epochs: int, batch_size: int = 32, lr: float = 1e-3, seed: int = 0,
              weight_decay: float = 0.0, log=None) -> list:
    """Minibatch training of an ft.ViT: each epoch a seeded permutation of the images, cut into batches of
    `batch_size`; per batch loss_and_grad (the summed loss) scaled to the batch mean and one ft.Adam step.
    Returns the mean training loss of every epoch (log(epoch, loss) is called after each)."""
    if not isinstance(model, _core.ViT):
        raise TypeError(f"train_vit takes an ft.ViT, got {type(model).__name__}")
    if epochs < 0 or batch_size < 1:
        raise ValueError("epochs must be >= 0 and batch_size >= 1")
    x = np.asarray(x)
    y = np.asarray(y)
    if len(x) != len(y) or len(x) == 0:
        raise ValueError(f"x and y must hold the same number (>= 1) of images and labels, got {len(x)} and {len(y)}")
    opt = _core.Adam(lr=lr, weight_decay=weight_decay)
    rng = np.random.default_rng(seed)
    losses = []
    for epoch in range(epochs):
        order = rng.permutation(len(x))
        total = 0.0
        for i in range(0, len(x), batch_size):
            idx = order[i:i + batch_size]
            loss, grads = model.loss_and_grad(x[idx], y[idx])
            scaled = {k: g / len(idx) for k, g in grads.items()}
            opt.step(model, scaled)
            total += loss
        losses.append(total / len(x))
        if log is not None:
            log(epoch, losses[-1])
    return losses


def accuracy(model, x, y) -> float:
    """The fraction of images whose most probable class is the label."""
    return float(np.mean(np.argmax(model.logits(np.asarray(x)), axis=0) == np.asarray(y)))


def logistic_regression_baseline(x_tr, y_tr, x_te, y_te, *, max_iter: int = 5000) -> tuple[float, float]:
    """scikit-learn's LogisticRegression (lbfgs, default C = 1) on the flattened pixels: (test accuracy, seconds)."""
    from sklearn.linear_model import LogisticRegression

    t0 = time.perf_counter()
    clf = LogisticRegression(max_iter=max_iter).fit(np.asarray(x_tr).reshape(len(x_tr), -1), y_tr)
    dt = time.perf_counter() - t0
    return float(clf.score(np.asarray(x_te).reshape(len(x_te), -1), y_te)), dt
