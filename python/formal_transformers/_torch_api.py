"""ft.to_torch and ft.from_torch: torch is imported only when one is called (the modules are _torch.py)."""
from __future__ import annotations

import numpy as np

from .io import build_model

__all__ = ["to_torch", "from_torch"]


def to_torch(model):
    """A plain torch.nn.Module computing the same function, in the model's dtype, with ft's losses:
    DTransformer / ETransformer as modules of torch.nn.Linear, LayerNorm (RMSNorm), Embedding;
    EDTransformer on torch.nn.TransformerEncoderLayer / TransformerDecoderLayer (norm_first=False, ReLU,
    dropout 0 — a model with a dropout rate is refused: torch.nn.Transformer layers also drop inside the MLP —,
    no final norms; needs d_attn = d_mid = d_e / H), or with T5's options (V11, V18) on transformers' own
    T5ForConditionalGeneration (module.hf; ValueError naming the option T5 lacks otherwise); bos_id/eos_id are
    kept (they act in EDInference only). module.loss(...) takes the arguments of
    model.loss_and_grad and returns the same (summed) loss; module.ft_params() / module.ft_grads() give the
    parameters / gradients under ft's names and layouts; ft.from_torch(module) makes an ft model again."""
    from . import _torch

    return _torch.from_ft(model)


def from_torch(module):
    """The ft model holding the parameters of a module made by ft.to_torch (after training in PyTorch)."""
    from . import _torch

    if not isinstance(module, _torch.FTModule):
        raise TypeError(f"ft.from_torch takes a module made by ft.to_torch, got {type(module).__name__}")
    model = build_model(module.ft_config)
    model.params.update({k: np.ascontiguousarray(v) for k, v in module.ft_params().items()})
    return model

