"""ft.ViT (listing V14) on scikit-learn's handwritten digits against a logistic-regression baseline on the same
fixed split (formal_transformers.vision.digits_split: train_test_split(test_size=0.25, random_state=0,
stratify=labels); 1,347 training and 450 test images, 8×8, one channel), with the training time.

    PYTHONPATH=python FT_CORE_PATH=build/dev python bench/bench_vit_digits.py [--epochs 30]

The ViT: 2×2 patches (N = 16 patches + the class token), L 2, H 4, d_e 64, d_mlp 128, float32, Adam (lr 2e-3,
batch 32), seed 0."""
from __future__ import annotations

import argparse
import os
import time

from _common import cpu_model, import_ft

ft = import_ft()
from formal_transformers.vision import accuracy, digits_split, logistic_regression_baseline, train_vit  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    (x_tr, y_tr), (x_te, y_te) = digits_split()
    lr_acc, lr_time = logistic_regression_baseline(x_tr, y_tr, x_te, y_te)
    m = ft.ViT(image_size=8, patch_size=2, n_classes=10, L=2, H=4, d_e=64, d_mlp=128, n_channels=1, seed=a.seed)
    t0 = time.perf_counter()
    losses = train_vit(m, x_tr, y_tr, epochs=a.epochs, batch_size=32, lr=a.lr, seed=a.seed,
                       log=lambda e, l: print(f"epoch {e + 1:3d}  train loss {l:.4f}", flush=True))
    dt = time.perf_counter() - t0
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"split: train {len(x_tr)}, test {len(x_te)} (train_test_split test_size=0.25, random_state=0, stratified)")
    print(f"logistic regression (lbfgs, C=1): test accuracy {lr_acc:.4f}  ({lr_time:.2f} s)")
    print(f"ViT ({sum(v.size for v in m.params.values())} parameters, {a.epochs} epochs): test accuracy "
          f"{accuracy(m, x_te, y_te):.4f}, train accuracy {accuracy(m, x_tr, y_tr):.4f}, training {dt:.1f} s "
          f"(final train loss {losses[-1]:.4f})")
    print(f"CPU: {cpu_model()}, {ft.get_num_threads()} threads, load average {load:.1f}")


if __name__ == "__main__":
    main()
