"""Weights in and out of Hugging Face `transformers` models (docs/interop.md):

    model = ft.from_hf(hf_model)        # GPT2LMHeadModel -> DTransformer, BertForMaskedLM -> ETransformer, …
    hf_model = ft.to_hf(model)          # the matching transformers class, equal outputs
    ft.save_hf(model, "dir")            # config.json + model.safetensors, for AutoModel*.from_pretrained("dir")
    model = ft.load_hf("dir")           # such a directory (or a downloaded HF one), with safetensors alone

One module per family (gpt2, bert, distilbert, bigbird, llama with mistral, qwen2, qwen3, phi3, gemma (2 and 3), opt, roberta, deepseek, t5, bart, vit), each a Converter registered
under the HF class names it takes, with its name tables (HF tensor names <-> ft parameter names) as data and the
mapping of each config key in its docstring; _registry holds the generic from_hf / to_hf / save_hf / load_hf and
_common what the families share (the config readers, RoPE's parameters, name tables, an export's checks); a family
that is another's with more tensors in its layers builds on that one's table (distilbert and roberta on bert; qwen2,
qwen3 and gemma on llama). Every module of this package not starting with "_" is imported here, so adding a
family is one new module with its @register. Everything works over the zero-copy `params` views, in float32 and
float64; nothing touches the network. Unsupported configurations raise ValueError naming the option; nothing is
half-loaded (every tensor is checked before a model is made).

Batches: HF pads a batch to one length and passes attention_mask (1 = token, 0 = padding); our batches are unpadded
sequences, so a padded row with mask m maps to the sequence x[m == 1] (right padding; positions start at 0 either
way) and HF's outputs at padded positions have no counterpart.

Plain PyTorch (ft.to_torch, ft.from_torch) is formal_transformers._torch, which imports this package (never the
other way round)."""
from __future__ import annotations

import importlib
import pkgutil

from ._registry import from_hf, load_hf, save_hf, to_hf

for _m in sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")):
    importlib.import_module(f"{__name__}.{_m}")

from .vit import vit_theta, vit_to_hf  # noqa: E402

__all__ = ["from_hf", "to_hf", "save_hf", "load_hf", "vit_theta", "vit_to_hf"]
