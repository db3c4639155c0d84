"""The registry of converters (HF class name -> the family's converter) and the generic from_hf, to_hf, save_hf
and load_hf over it: nothing here knows a family. A family is a Converter subclass in its own module of this
package, registered by the @register decorator under the HF class names it takes."""
from __future__ import annotations

import json
import os
from typing import Union

import numpy as np

from .. import _core
from .._options import check_unmapped_at_defaults
from ..io import build_model, check_precision
from ._common import _config_class_names, _read_config_json, _shown, _torch_dtype

_DTYPES = ("float32", "float64")
_CONVERTERS: list = []  # one instance per family, in registration order
_CLASSES: dict = {}  # HF class name -> converter
# buffers and BertModel's pooler: tensors of the HF classes that are not part of the paper's model
_IGNORED = (".attn.bias", ".attn.masked_bias", "embeddings.position_ids", "pooler.dense.weight",
            "pooler.dense.bias", "rotary_emb.inv_freq")


class Converter:
    """One family of HF models <-> ft models. A subclass sets the class attributes and the methods it needs;
    the defaults are those of a decoder with an LM head and a word embedding that the head may tie."""
    name = ""  # the family's name in messages ("GPT-2")
    arch = "DTransformer"  # the ft class of its models
    classes: dict = {}  # HF class name -> (with the LM head, prefix of the body in the class's state dict)
    model_type = ""  # config.json's model_type (load_hf of a directory without "architectures")
    layers = ("layers.", "num_hidden_layers")  # the layers' tensor prefix in the body, the config key counting them
    embedding = ""  # the body's word-embedding tensor and the head's: tie_word_embeddings ties them
    head = "lm_head.weight"
    maps: frozenset = frozenset()  # the ft options export reads (all others must be at the core's defaults)

    # --- HF -> ft
    def hyper(self, c: dict) -> dict:
        """The ft options of an HF config (ValueError naming any option the family cannot express)."""
        raise NotImplementedError

    def prepare(self, hp: dict, T: dict, head: bool) -> dict:
        """The body's tensors as to_ft reads them (aliases dropped or refused). The default follows transformers 5
        for the LM head: a head tensor equal to the embedding is its tied alias; one that differs is used (the
        model is untied even when the config ties it, as transformers does)."""
        if head and hp.get("tied") and self.head in T:
            if self.embedding in T and np.array_equal(T[self.head], T[self.embedding]):
                T.pop(self.head)
            else:
                hp["tied"] = False
        return T

    def expected(self, hp: dict, head: bool) -> dict:
        """HF name -> shape of every tensor the body (with the head) must hold."""
        raise NotImplementedError

    def to_ft(self, hp: dict, T: dict, head: bool) -> dict:
        raise NotImplementedError

    def check_layers(self, hp: dict, T: dict, where: str, cls_name: str) -> None:
        check_layer_count(hp["L"], self.layers, T, where, cls_name)

    def class_of(self, config: dict, T: dict, class_names: list):
        """The class of a directory whose config.json names none of ours (or None: not this family's)."""
        return next(iter(self.classes)) if config.get("model_type") == self.model_type and not class_names else None

    def refuse_file(self, config: dict, cls_name: str, where: str) -> None:
        """ValueError for a directory load_hf cannot read alone (a family needing its HF code)."""

    def file_config(self, config: dict, path: str) -> dict:
        """The config load_hf maps: config.json's (a family may add what other files of the directory hold)."""
        return config

    def from_model(self, hf_model, cls_name: str, dtype, **kw):
        """from_hf of an HF model object of one of self.classes."""
        if kw.get("bigbird_lengths"):
            raise ValueError(f"bigbird_lengths: {cls_name} is not a BigBird with attention_type='block_sparse'")
        return build(cls_name, hf_model.config.to_dict(), state_arrays(hf_model), dtype, cls_name)

    # --- ft -> HF
    def takes(self, model, cfg: dict) -> bool:
        """Whether this family exports the ft model (the converters' takes are exclusive)."""
        return False

    def export(self, cfg: dict, P: dict):
        """(HF class name, config.json dict, state dict of numpy arrays under the class's names)."""
        raise NotImplementedError

    def to_hf(self, model, hf_class=None):
        return hf_model(*export(model, hf_class))

    def prepare_hf(self, hf, state: dict) -> None:
        """Changes to a freshly made HF model before the state is copied in."""


def register(cls):
    """Class decorator: one instance of the converter serves its HF class names."""
    conv = cls()
    _CONVERTERS.append(conv)
    for name in cls.classes:
        if name in _CLASSES:
            raise RuntimeError(f"internal: {name} registered twice")
        _CLASSES[name] = conv
    return cls


def encoder_takes_tokens(model) -> bool:
    """Whether the EDTransformer's encoder takes token ids, as its embedding part reports (model.encoder_input): a
    family of token encoders (BART, T5) leaves the others (Whisper's log-mel features) to their own converter."""
    return model.encoder_input["kind"] == "tokens"


def supported() -> list:
    return list(_CLASSES)


def check_layer_count(L: int, layers: tuple, T: dict, where: str, cls_name: str) -> None:
    """The config's layer count against the layers the weights hold, before any per-layer name is listed (a
    config claiming 10⁹ layers is a ValueError at once, not a list of 10¹⁰ names)."""
    prefix, key = layers
    present = set()
    for k in T:
        if k.startswith(prefix):
            i = k[len(prefix):].split(".", 1)[0]
            if i.isdigit():
                present.add(i)
    if L > len(present):
        raise ValueError(f"{where}: missing tensors for {cls_name}: the config's {key} = {L} but the weights "
                         f"hold {len(present)} layer{'s' if len(present) != 1 else ''}")


def _strip(T: dict, prefix: str) -> dict:
    """The body's tensors without the head class's prefix (files and state dicts may hold either form)."""
    if not prefix or not any(k.startswith(prefix) for k in T):
        return dict(T)
    return {(k[len(prefix):] if k.startswith(prefix) else k): v for k, v in T.items()}


def state_arrays(hf_model) -> dict:
    """An HF model's state dict as numpy arrays (half precision as float32)."""
    T = {}
    for k, v in hf_model.state_dict().items():
        v = v.detach().cpu()
        if v.is_floating_point() and v.dtype not in (_torch_dtype("float32"), _torch_dtype("float64")):
            v = v.float()
        T[k] = v.numpy()
    return T


def build(cls_name: str, config: dict, T: dict, dtype, where: str):
    """Check every tensor, then make the ft model and copy them in (nothing is made on a failed check)."""
    conv = _CLASSES[cls_name]
    if hasattr(conv, "build"):  # a family with its own model class (Whisper) checks and builds itself
        return conv.build(config, T, dtype, where)
    head, prefix = conv.classes[cls_name]
    hp = conv.hyper(config)
    T = conv.prepare(hp, _strip(T, prefix), head)
    conv.check_layers(hp, T, where, cls_name)
    exp = conv.expected(hp, head)
    missing = sorted(set(exp) - set(T))
    if missing:
        raise ValueError(f"{where}: missing tensor{'s' if len(missing) > 1 else ''} for {cls_name}: "
                         + ", ".join(missing[:8]) + (" …" if len(missing) > 8 else ""))
    extra = sorted(k for k in set(T) - set(exp) if not k.endswith(_IGNORED) and not k.startswith("pooler."))
    if extra:
        raise ValueError(f"{where}: unexpected tensor{'s' if len(extra) > 1 else ''} for {cls_name} "
                         f"(a different configuration?): " + ", ".join(extra[:8]) + (" …" if len(extra) > 8 else ""))
    for k, shape in exp.items():
        if tuple(T[k].shape) != tuple(shape):
            raise ValueError(f"{where}: tensor {k} has shape {tuple(T[k].shape)}, the config needs {tuple(shape)}")
        if not np.issubdtype(T[k].dtype, np.floating):
            raise ValueError(f"{where}: tensor {k} has dtype {T[k].dtype}, expected floating point")
        if not np.all(np.isfinite(T[k])):
            raise ValueError(f"{where}: tensor {k} holds NaN or infinite values")
    if dtype is None:
        dtype = "float64" if any(T[k].dtype == np.float64 for k in exp) else "float32"
    dtype = np.dtype(dtype).name
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be float32 or float64, got {dtype}")
    params = conv.to_ft(hp, T, head)
    model = build_model({"arch": conv.arch, **{k: v for k, v in hp.items() if not k.startswith("_")}}, dtype=dtype)
    for name, value in params.items():
        model.params[name][...] = value
    return model


# ---------------------------------------------------------------------------------------------------
# The public functions (ft.from_hf, ft.to_hf, ft.save_hf, ft.load_hf)

def from_hf(hf_model, *, dtype=None, bigbird_lengths=(), precision="float32"):
    """The ft model computing the same function as a `transformers` model: GPT2LMHeadModel / GPT2Model ->
    DTransformer (tied unless the config unties it), BertForMaskedLM / BertModel -> ETransformer (with
    n_segments, embed_norm, unembed_bias), LlamaForCausalLM -> DTransformer(positional="rope", H_kv,
    mlp="swiglu", bias=False, norm="rms"), MistralForCausalLM -> the same with sliding_window (V8),
    Qwen3ForCausalLM -> the LLaMA mapping with qk_norm (V24), Gemma2ForCausalLM / Gemma3ForCausalLM -> DTransformer
    with norm="rms1p", block="sandwich", embed_scale and V24–V26 (docs/interop.md),
    DeepseekV3ForCausalLM (dense MLPs) -> DTransformer with latent attention (V10), T5ForConditionalGeneration ->
    EDTransformer (V11, V18), BartForConditionalGeneration / BartModel -> EDTransformer with BART's options (V22),
    DistilBertForMaskedLM / DistilBertModel -> ETransformer (n_segments=0, embed_norm, unembed_bias, eps=1e-12),
    ViTForImageClassification -> ViT (listing V14), Qwen2ForCausalLM -> LLaMA's with
    qkv_bias (V20), Phi3ForCausalLM -> LLaMA's (fused tensors split), OPTForCausalLM -> DTransformer(mlp="relu")
    (V21), RobertaForMaskedLM / RobertaModel -> ETransformer as BERT (positions offset by pad_token_id + 1). dtype: float32 / float64 (default:
    the HF model's, float64 if its weights are float64). ValueError naming an unsupported configuration option.
    BigBirdModel / BigBirdForMaskedLM -> ETransformer as BERT, with attention="bigbird" (V17: w = 3, g = 1,
    r = num_random_blocks) when HF's attention_type is "block_sparse", and HF's own layouts (one per layer and
    head) installed for each length of bigbird_lengths (model.set_bigbird_layouts; other lengths draw from
    layout_seed), in the mode hf_model is in: training mode's random draw, or eval mode's (every random block is
    block 0, so block 0 is gathered 1 + r times). A block HF gathers m times weighs m·exp(s) in the softmax (a
    multiset layout, docs/variants.md V17b), as in HF: the ft model computes what HF computes in that mode with
    every dropout 0. A tied head whose tensor differs from the embedding is used as transformers 5 uses it
    (untied)."""
    name = type(hf_model).__name__
    if name not in _CLASSES:
        raise ValueError(f"ft.from_hf supports {', '.join(_CLASSES)}; got {name}")
    check_precision(precision, dtype)
    return _with_precision(_CLASSES[name].from_model(hf_model, name, dtype, bigbird_lengths=bigbird_lengths),
                           precision)


def _with_precision(model, precision: str):
    """precision= of from_hf / load_hf: how the model's products run (float32 models take 'bf16-mixed')."""
    if precision != "float32":
        model.precision = precision
    return model


def _check_model(model, fn: str, vit: bool = True) -> None:
    """to_hf / save_hf take an ft model (TypeError otherwise, as to_torch)."""
    kinds = (_core.DTransformer, _core.ETransformer, _core.EDTransformer) + ((_core.ViT,) if vit else ())
    if not isinstance(model, kinds):
        raise TypeError(f"ft.{fn} takes a DTransformer or ETransformer (or an EDTransformer with T5's, BART's or "
                        f"Whisper's options{', or a ViT' if vit else ''}), got {type(model).__name__}")


def _converter_of(model, hf_class=None):
    cfg = dict(model.config)
    if hf_class is not None:  # the family asked for (its export checks the options it maps)
        if not isinstance(hf_class, str):
            raise TypeError(f"hf_class must be a str (a transformers class name) or None, got {type(hf_class).__name__}")
        if hf_class not in _CLASSES:
            raise ValueError(f"hf_class must be one of {', '.join(_CLASSES)}; got {hf_class!r}")
        conv = _CLASSES[hf_class]
        if conv.arch != cfg.get("arch"):
            raise ValueError(f"hf_class={hf_class!r} holds a {conv.arch}, not a {cfg.get('arch')}")
        return conv, cfg
    for conv in _CONVERTERS:
        if conv.takes(model, cfg):
            return conv, cfg
    raise ValueError(f"{cfg.get('arch', type(model).__name__)} with these options has no transformers class"
                     + (": use ft.to_torch (torch.nn.Transformer layers) instead" if cfg.get("arch") == "EDTransformer"
                        else ""))


def export(model, hf_class=None):
    """(HF class name, config.json dict, state dict of numpy arrays with the class's names) of an ft model; hf_class:
    the class to write (None: the one family whose `takes` holds the model)."""
    conv, cfg = _converter_of(model, hf_class)
    if hasattr(conv, "export_model"):  # a family with its own model class (Whisper)
        return conv.export_model(model)
    if cfg.get("mtp_depth"):  # V16: no class here takes the modules (docs/variants.md V16)
        raise ValueError(f"mtp_depth = {cfg['mtp_depth']}: the multi-token-prediction modules have no place in the "
                         "exported Hugging Face model (they would be lost); export a model with mtp_depth=0")
    check_unmapped_at_defaults(cfg, conv.maps, conv.name)
    out = conv.export(cfg, {k: np.asarray(v) for k, v in model.params.items()})
    if hf_class is not None and out[0] != hf_class:
        raise ValueError(f"hf_class={hf_class!r}: the {conv.name} export writes {out[0]} (ask for that class)")
    return out


def to_hf(model, *, hf_class=None):
    """The `transformers` model with the same function, in the model's dtype and eval mode: DTransformer ->
    GPT2LMHeadModel (LlamaForCausalLM when positional="rope", with mlp="swiglu", bias=False, norm="rms";
    MistralForCausalLM with a sliding_window; DeepseekV3ForCausalLM with kv_lora_rank), ETransformer (with
    embed_norm, d_f = d_e) -> BertForMaskedLM (DistilBertForMaskedLM without segments and with eps = 1e-12),
    EDTransformer with T5's options -> T5ForConditionalGeneration, with BART's -> BartForConditionalGeneration,
    ViT -> ViTForImageClassification; the dropout rates mapped (GPT-2: embd_pdrop, attn_pdrop, resid_pdrop; BERT:
    hidden_dropout_prob = embed_dropout = resid_dropout, attention_probs_dropout_prob; LLaMA: attention_dropout)
    — from_hf maps them back. ValueError for options the class cannot express (every option the family does not
    map must be at the core's default, ft.model_options). hf_class: the transformers class to write when several
    compute the model's function (a LLaMA-style model as "Phi3ForCausalLM", an ETransformer as
    "RobertaForMaskedLM"); ValueError if that class cannot express the model."""
    _check_model(model, "to_hf")
    return _converter_of(model, hf_class)[0].to_hf(model, hf_class)


def hf_model(cls_name: str, hf_cfg: dict, state: dict):
    """The transformers model of an export (export's triple), in eval mode."""
    import torch
    import transformers

    kw = {k: v for k, v in hf_cfg.items() if k not in ("model_type", "architectures", "dtype")}
    config = transformers.AutoConfig.for_model(hf_cfg["model_type"], **kw)
    config.architectures = hf_cfg["architectures"]
    dt = getattr(torch, hf_cfg["dtype"])
    old = torch.get_default_dtype()
    torch.set_default_dtype(dt)
    try:
        hf = getattr(transformers, cls_name)(config)
    finally:
        torch.set_default_dtype(old)
    _CLASSES[cls_name].prepare_hf(hf, state)
    load_state(hf, state)
    return hf.eval()


def load_state(hf, state: dict) -> None:
    import torch

    own = hf.state_dict()
    with torch.no_grad():
        for k, v in state.items():
            if k not in own:
                raise ValueError(f"internal: {type(hf).__name__} has no tensor {k}")
            own[k].copy_(torch.from_numpy(np.ascontiguousarray(v)))
def save_hf(model, path: Union[str, os.PathLike], *, hf_class=None) -> None:
    """Write `path`/config.json and `path`/model.safetensors (tied tensors once, metadata format "pt") such
    that transformers.AutoModelForCausalLM / AutoModelForMaskedLM.from_pretrained(path) loads the matching
    class with equal outputs. Needs safetensors only (no transformers, no torch).

    Both files are first written completely to unique temporaries in `path` (so concurrent saves never share
    one); then model.safetensors is renamed into place and config.json last (config.json is what makes a
    folder a model: a new folder interrupted between the two renames has no config.json and load_hf says
    so). hf_class: as to_hf's. A failure while writing leaves the old pair untouched; if the config's rename fails after the
    weights', the old weights are put back — the folder holds the old pair or the new pair."""
    _check_model(model, "save_hf", vit=False)
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    cls_name, hf_cfg, state = export(model, hf_class)
    from safetensors.numpy import save_file

    from ..io import _remove_quietly, _temp_beside

    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    tensors = {k: np.ascontiguousarray(v) for k, v in state.items()}
    weights, config = os.path.join(path, "model.safetensors"), os.path.join(path, "config.json")
    tmp_w = tmp_c = backup = None
    try:
        tmp_w = _temp_beside(weights)
        save_file(tensors, tmp_w, metadata={"format": "pt"})
        tmp_c = _temp_beside(config)
        with open(tmp_c, "w", encoding="utf-8") as f:
            json.dump(hf_cfg, f, indent=2, sort_keys=True)
        if os.path.isfile(weights) and os.path.isfile(config):
            backup = _temp_beside(weights)  # the old weights, to put back if the config cannot follow
            os.remove(backup)
            try:
                os.link(weights, backup)
            except OSError:  # no hard links here: the tiny window between the renames stays
                backup = None
        os.replace(tmp_w, weights)
        tmp_w = None
        try:
            os.replace(tmp_c, config)
            tmp_c = None
        except BaseException:
            if backup is not None:
                os.replace(backup, weights)
                backup = None
            raise
    finally:
        for t in (tmp_w, tmp_c, backup):
            if t is not None:
                _remove_quietly(t)


def load_hf(path: Union[str, os.PathLike], *, dtype=None, precision="float32"):
    """Read a Hugging Face model directory (config.json + model.safetensors: written by save_hf or by
    transformers' save_pretrained, e.g. a downloaded GPT-2, BERT or all-MiniLM-L6-v2) with safetensors
    alone. The class comes from config.json's "architectures" (or its model_type and whether the file
    holds an LM head). ValueError naming a missing or mismatched tensor; nothing is half-loaded."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    check_precision(precision, dtype)
    path = os.fspath(path)
    cfg_file, st_file = os.path.join(path, "config.json"), os.path.join(path, "model.safetensors")
    for f in (cfg_file, st_file):
        if not os.path.isfile(f):
            raise ValueError(f"{path}: no {os.path.basename(f)} (ft.load_hf reads a local directory written by "
                             "save_hf or save_pretrained, with one model.safetensors)")
    config = _read_config_json(cfg_file)
    class_names = _config_class_names(config, cfg_file)
    from safetensors.numpy import load_file

    try:
        T = load_file(st_file)
    except Exception as e:  # safetensors raises its own error types for damaged files
        raise ValueError(f"{st_file}: cannot read it as safetensors ({e})") from None
    names = [a for a in class_names if a in _CLASSES]
    cls_name = names[0] if names else next((c for c in (conv.class_of(config, T, class_names) for conv in _CONVERTERS)
                                            if c), None)
    if cls_name is None:
        raise ValueError(f"{cfg_file}: model_type {_shown(config.get('model_type'))} / architectures "
                         f"{_shown(class_names)} is not supported (supported: {', '.join(_CLASSES)})")
    _CLASSES[cls_name].refuse_file(config, cls_name, cfg_file)
    return _with_precision(build(cls_name, _CLASSES[cls_name].file_config(config, path), T, dtype, path), precision)
