"""ViTForImageClassification <-> ft.ViT (listing V14, docs/variants.md): transformers 5's tensor names
(vit.layers.l.…) or 4's (vit.encoder.layer.l.…)."""
from __future__ import annotations

import numpy as np

from .. import _core
from ._common import _torch_dtype
from ._registry import Converter, load_state, register

def _vit_key(sd: dict, l: int, new: str, old: str) -> str:
    """A layer tensor's name: transformers 5's (vit.layers.l.…) or 4's (vit.encoder.layer.l.…)."""
    k = f"vit.layers.{l}.{new}"
    return k if k in sd else f"vit.encoder.layer.{l}.{old}"


_VIT_LAYER = [  # ft name, transformers 5 name, transformers 4 name
    ("gamma1", "layernorm_before.weight", "layernorm_before.weight"),
    ("beta1", "layernorm_before.bias", "layernorm_before.bias"),
    ("attn.W_o", "attention.o_proj.weight", "attention.output.dense.weight"),
    ("attn.b_o", "attention.o_proj.bias", "attention.output.dense.bias"),
    ("gamma2", "layernorm_after.weight", "layernorm_after.weight"),
    ("beta2", "layernorm_after.bias", "layernorm_after.bias"),
    ("W_mlp1", "mlp.fc1.weight", "intermediate.dense.weight"),
    ("b_mlp1", "mlp.fc1.bias", "intermediate.dense.bias"),
    ("W_mlp2", "mlp.fc2.weight", "output.dense.weight"),
    ("b_mlp2", "mlp.fc2.bias", "output.dense.bias"),
]
_VIT_QKV = [("q", "q_proj", "attention.query"), ("k", "k_proj", "attention.key"), ("v", "v_proj", "attention.value")]


def _vit_check_config(c) -> None:
    if not getattr(c, "qkv_bias", True):
        raise ValueError("ft.ViT has no equivalent of qkv_bias=False")
    if getattr(c, "hidden_act", "gelu") != "gelu":
        raise ValueError(f"ft.ViT has no equivalent of hidden_act={c.hidden_act!r} (exact GELU only)")
    if c.hidden_size % c.num_attention_heads:
        raise ValueError("hidden_size must be divisible by num_attention_heads")


def vit_theta(hf_model) -> dict:
    """The listing's θ (float64 numpy arrays, the names of ft.ViT.params and reference.vit) of a
    ViTForImageClassification."""
    c = hf_model.config
    _vit_check_config(c)
    H, d_e = c.num_attention_heads, c.hidden_size
    d = d_e // H
    sd = {k: v.detach().cpu().double().numpy() for k, v in hf_model.state_dict().items()}
    e = "vit.embeddings."
    th = {"W_patch": sd[e + "patch_embeddings.projection.weight"].reshape(d_e, -1),
          "b_patch": sd[e + "patch_embeddings.projection.bias"],
          "x_class": sd[e + "cls_token"][0, 0], "W_p": sd[e + "position_embeddings"][0].T}
    for l in range(c.num_hidden_layers):
        p = f"layers.{l}."
        for ours, new, old in _VIT_QKV:
            th[p + f"attn.W_{ours}"] = sd[_vit_key(sd, l, f"attention.{new}.weight", f"attention.{old}.weight")].reshape(H, d, d_e)
            th[p + f"attn.b_{ours}"] = sd[_vit_key(sd, l, f"attention.{new}.bias", f"attention.{old}.bias")].reshape(H, d)
        for ours, new, old in _VIT_LAYER:
            th[p + ours] = sd[_vit_key(sd, l, new, old)]
    th["gamma"], th["beta"] = sd["vit.layernorm.weight"], sd["vit.layernorm.bias"]
    th["W_c"], th["b_c"] = sd["classifier.weight"], sd["classifier.bias"]
    return th


def _pair(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def _vit_from_hf(hf_model, dtype):
    c = hf_model.config
    _vit_check_config(c)
    ph, pw = _pair(c.patch_size)
    if ph != pw:
        raise ValueError(f"ft.ViT takes square patches, got patch_size={c.patch_size!r}")
    if dtype is None:
        dtype = "float64" if next(hf_model.parameters()).dtype == _torch_dtype("float64") else "float32"
    m = _core.ViT(_pair(c.image_size), ph, c.num_labels, c.num_hidden_layers, c.num_attention_heads, c.hidden_size,
                  c.intermediate_size, n_channels=c.num_channels, eps=c.layer_norm_eps, dtype=dtype)
    th = vit_theta(hf_model)
    if set(th) != set(m.params):
        raise ValueError(f"internal: θ names differ: {sorted(set(th) ^ set(m.params))}")
    for k, v in th.items():
        m.params[k] = v.reshape(m.params[k].shape)
    return m


def vit_to_hf(model):
    """The ViTForImageClassification computing the same function as an ft.ViT (in its dtype, eval mode)."""
    import torch
    import transformers

    if not isinstance(model, _core.ViT):
        raise TypeError(f"vit_to_hf takes an ft.ViT, got {type(model).__name__}")
    c = model.config
    H, d_e = c["H"], c["d_e"]
    d = d_e // H
    cfg = transformers.ViTConfig(image_size=list(c["image_size"]), patch_size=c["patch_size"],
                                 num_channels=c["n_channels"], hidden_size=d_e, num_hidden_layers=c["L"],
                                 num_attention_heads=H, intermediate_size=c["d_mlp"], layer_norm_eps=c["eps"],
                                 num_labels=c["n_classes"], hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                 attn_implementation="sdpa")
    dt = getattr(torch, c["dtype"])
    old = torch.get_default_dtype()
    torch.set_default_dtype(dt)
    try:
        hf = transformers.ViTForImageClassification(cfg)
    finally:
        torch.set_default_dtype(old)
    sd = hf.state_dict()
    P = {k: np.asarray(v) for k, v in model.params.items()}
    e = "vit.embeddings."
    state = {e + "patch_embeddings.projection.weight": P["W_patch"].reshape(sd[e + "patch_embeddings.projection.weight"].shape),
             e + "patch_embeddings.projection.bias": P["b_patch"],
             e + "cls_token": P["x_class"].reshape(1, 1, d_e), e + "position_embeddings": P["W_p"].T[None],
             "vit.layernorm.weight": P["gamma"], "vit.layernorm.bias": P["beta"],
             "classifier.weight": P["W_c"], "classifier.bias": P["b_c"]}
    for l in range(c["L"]):
        p = f"layers.{l}."
        for ours, new, old_ in _VIT_QKV:
            state[_vit_key(sd, l, f"attention.{new}.weight", f"attention.{old_}.weight")] = P[p + f"attn.W_{ours}"].reshape(H * d, d_e)
            state[_vit_key(sd, l, f"attention.{new}.bias", f"attention.{old_}.bias")] = P[p + f"attn.b_{ours}"].reshape(H * d)
        for ours, new, old_ in _VIT_LAYER:
            state[_vit_key(sd, l, new, old_)] = P[p + ours]
    missing = set(sd) - set(state)
    if missing:
        raise ValueError(f"internal: no ft tensor for {sorted(missing)}")
    load_state(hf, state)
    return hf.eval()


@register
class ViT(Converter):
    name = "ViT"
    arch = "ViT"
    classes = {"ViTForImageClassification": (True, "")}

    def class_of(self, config, T, class_names):
        return None  # from_hf of a model object only

    def from_model(self, hf_model, cls_name, dtype, **kw):
        if kw.get("bigbird_lengths"):
            raise ValueError(f"bigbird_lengths: {cls_name} is not a BigBird with attention_type='block_sparse'")
        return _vit_from_hf(hf_model, dtype)

    def takes(self, model, cfg):
        return isinstance(model, _core.ViT)

    def to_hf(self, model, hf_class=None):
        return vit_to_hf(model)

    def refuse_file(self, config, cls_name, where):
        raise ValueError(f"{where}: ft.load_hf does not read {cls_name} directories: load the model with transformers "
                         "and use ft.from_hf(model)")
