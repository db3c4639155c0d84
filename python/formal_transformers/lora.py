"""LoRA (Hu et al. 2021; docs/variants.md "LoRA"): ft.lora(model, …) adds low-rank adapters in place,
W' = W + (α/r)·B·A on the chosen matrices, with A and B in model.params as <name>.lora_A (r, d_in) and
<name>.lora_B (d_out, r). The core computes W' and the hand-written backward of A and B (cpp/src/variants/lora.cpp);
model.merge_lora() folds them into W. With dropout=p > 0 a training forward (loss_and_grad, the trainers) computes
W x + (α/r)·B·A·Dropout(x) instead, the masks keyed like the model's other dropout masks (dropout_step).

    model = ft.from_hf(hf_model)
    ft.lora(model, targets=("W_q", "W_v"), r=8, alpha=16)
    ft.ETraining(1, 1e-3, trainable=["*.lora_A", "*.lora_B"])(x_data, model)   # only the adapters train
    model.merge_lora()                                                         # W ← W + (α/r)·B·A
"""
from __future__ import annotations

import numbers
from typing import Iterable, Union

from . import _core

__all__ = ["lora", "LORA_PATTERNS"]

LORA_PATTERNS = ("*.lora_A", "*.lora_B")  # trainable= for training the adapters only


def lora(model, targets: Union[str, Iterable[str]] = ("W_q", "W_v"), r: int = 8, alpha: float = 16,
         dropout: float = 0.0):
    """Add LoRA adapters to `model` (a DTransformer, ETransformer or EDTransformer) in place and return it.

    targets: the matrices to adapt, by their last name component in every layer ("W_q", "W_k", "W_v", "W_o",
    "W_mlp1" … "W_mlp4", "W_gate"), by full name ("layers.0.attn.W_q") or glob pattern ("layers.[01].*.W_v").
    r: the rank, 1 ≤ r ≤ min(d_out, d_in) of each adapted matrix. alpha: α, the scale is α/r. dropout: p ∈ [0, 1),
    the dropout on the adapter's input (peft's lora_dropout): a training forward computes W x + (α/r)·B·A·Dropout(x),
    inverted dropout (kept entries scaled by 1/(1 − p)) with masks keyed by (model.dropout_seed, model.dropout_step,
    the adapter), shown by model.dropout_masks() as <name>.lora_dropout (d_in, n); evaluation and inference use
    W' = W + (α/r)·B·A (p = 0: always). A is drawn as peft draws it (U(±1/√d_in), from the model's seed), B = 0:
    the model's outputs are unchanged until B trains. ValueError naming the problem (rank 0, r larger than a
    dimension, dropout outside [0, 1), a target that is not an attention or MLP matrix, a target that matches nothing,
    a model that already has adapters) before the model changes; TypeError for a non-number r, alpha or dropout.
    Views of model.params taken before are of the old θ (the core rebuilds θ with the new entries)."""
    if not isinstance(model, (_core.DTransformer, _core.ETransformer, _core.EDTransformer)):
        raise TypeError(f"lora() takes a DTransformer, ETransformer or EDTransformer, got {type(model).__name__}")
    names = [targets] if isinstance(targets, str) else list(targets)
    if not all(isinstance(t, str) for t in names):
        raise TypeError("lora(): targets must be parameter names (str)")
    if isinstance(r, bool) or not isinstance(r, numbers.Integral):
        raise TypeError(f"lora(): r must be an int, got {type(r).__name__}")
    for name, v in (("alpha", alpha), ("dropout", dropout)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"lora(): {name} must be a real number, got {type(v).__name__}")
    model._lora(names, int(r), float(alpha), float(dropout))
    return model
