"""WhisperForConditionalGeneration <-> an ft.EDTransformer whose encoder reads log-mel features (listings V28, V29,
docs/variants.md): the embedding "audio" (n_mels, n_audio_ctx), block="pre_ln", mlp="gelu", tied, bos_id / eos_id
= decoder_start_token_id / eos_token_id.

Names: model.encoder.conv{1,2} -> conv.W_c{1,2}, b_c{1,2} (the Conv1d weight (d_e, C, 3) as (d_e, 3C));
model.encoder.embed_positions: not a parameter here (V28 line 5's fixed table W_sin, Whisper's sinusoids computed
exactly): from_hf checks the checkpoint's table is those sinusoids (within 1e-3: HF computes them in float32) and
to_hf writes them; encoder layer l: self_attn_layer_norm
-> gamma1/beta1, self_attn -> attn.*, final_layer_norm -> gamma2/beta2, fc1/fc2 -> W_mlp1/W_mlp2; model.encoder.layer_norm
-> enc.gamma/beta; decoder embed_tokens -> W_e (transposed), embed_positions -> W_p (transposed); decoder layer l:
self_attn_layer_norm, self_attn, encoder_attn_layer_norm, encoder_attn, final_layer_norm, fc1, fc2 -> gamma1, attn.*,
gamma2, cross_attn.*, gamma3, W_mlp3, W_mlp4; model.decoder.layer_norm -> dec.gamma/beta; proj_out is W_eᵀ (tied).
Whisper's k_proj has no bias: b_k = 0 here (its gradient is exactly 0), and to_hf refuses a model whose b_k is not 0.

Decoding: with a plain config (no forced language/task tokens), WhisperForConditionalGeneration.generate starts
from decoder_start_token_id alone and decodes greedily to eos_token_id; the EDTransformer keeps both (bos_id, eos_id) and
ft.speech.transcribe does the same (tests/python/test_whisper.py: token for token)."""
from __future__ import annotations

import numpy as np

from .. import _core
from ._common import _torch_dtype
from ._registry import Converter, hf_model, register, state_arrays

_CLS = "WhisperForConditionalGeneration"
_ATTN = [("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj")]


def _enc_layer(l):
    return [(f"enc.{l}.gamma1", f"model.encoder.layers.{l}.self_attn_layer_norm.weight"),
            (f"enc.{l}.beta1", f"model.encoder.layers.{l}.self_attn_layer_norm.bias"),
            (f"enc.{l}.gamma2", f"model.encoder.layers.{l}.final_layer_norm.weight"),
            (f"enc.{l}.beta2", f"model.encoder.layers.{l}.final_layer_norm.bias"),
            (f"enc.{l}.W_mlp1", f"model.encoder.layers.{l}.fc1.weight"), (f"enc.{l}.b_mlp1", f"model.encoder.layers.{l}.fc1.bias"),
            (f"enc.{l}.W_mlp2", f"model.encoder.layers.{l}.fc2.weight"), (f"enc.{l}.b_mlp2", f"model.encoder.layers.{l}.fc2.bias")]


def _dec_layer(l):
    p = f"model.decoder.layers.{l}."
    return [(f"dec.{l}.gamma1", p + "self_attn_layer_norm.weight"), (f"dec.{l}.beta1", p + "self_attn_layer_norm.bias"),
            (f"dec.{l}.gamma2", p + "encoder_attn_layer_norm.weight"), (f"dec.{l}.beta2", p + "encoder_attn_layer_norm.bias"),
            (f"dec.{l}.gamma3", p + "final_layer_norm.weight"), (f"dec.{l}.beta3", p + "final_layer_norm.bias"),
            (f"dec.{l}.W_mlp3", p + "fc1.weight"), (f"dec.{l}.b_mlp3", p + "fc1.bias"),
            (f"dec.{l}.W_mlp4", p + "fc2.weight"), (f"dec.{l}.b_mlp4", p + "fc2.bias")]


def _attentions(c):
    """(ft prefix, HF prefix) of every attention."""
    r = [(f"enc.{l}.attn.", f"model.encoder.layers.{l}.self_attn.") for l in range(c["encoder_layers"])]
    for l in range(c["decoder_layers"]):
        r += [(f"dec.{l}.attn.", f"model.decoder.layers.{l}.self_attn."),
              (f"dec.{l}.cross_attn.", f"model.decoder.layers.{l}.encoder_attn.")]
    return r


def _plain(c: dict) -> list:
    """(ft name, HF name) of the tensors copied as they are."""
    r = [("conv.b_c1", "model.encoder.conv1.bias"), ("conv.b_c2", "model.encoder.conv2.bias"),
         ("enc.gamma", "model.encoder.layer_norm.weight"), ("enc.beta", "model.encoder.layer_norm.bias"),
         ("dec.gamma", "model.decoder.layer_norm.weight"), ("dec.beta", "model.decoder.layer_norm.bias")]
    for l in range(c["encoder_layers"]):
        r += _enc_layer(l)
    for l in range(c["decoder_layers"]):
        r += _dec_layer(l)
    return r


def whisper_hyper(c: dict) -> dict:
    """the EDTransformer's options of a WhisperConfig (dict): ValueError naming every option it cannot express, before
    anything is built."""
    def get(k, default=None):
        return c.get(k, default)

    if get("apply_spec_augment", False):
        raise ValueError("apply_spec_augment=True: SpecAugment's masking of the features at training has no equivalent "
                         "in the EDTransformer (set apply_spec_augment=False)")
    if get("activation_function", "gelu") != "gelu":
        raise ValueError(f"activation_function={get('activation_function')!r}: the EDTransformer's layers use the exact GELU "
                         "('gelu') only")
    if get("scale_embedding", False):
        raise ValueError("scale_embedding=True: the EDTransformer does not scale the token embedding by √d_model")
    if get("encoder_attention_heads") != get("decoder_attention_heads"):
        raise ValueError(f"encoder_attention_heads = {get('encoder_attention_heads')} and decoder_attention_heads = "
                         f"{get('decoder_attention_heads')}: the EDTransformer takes one H for both stacks")
    if get("encoder_ffn_dim") != get("decoder_ffn_dim"):
        raise ValueError(f"encoder_ffn_dim = {get('encoder_ffn_dim')} and decoder_ffn_dim = {get('decoder_ffn_dim')}: "
                         "the EDTransformer takes one d_mlp for both stacks")
    if not get("tie_word_embeddings", True):
        raise ValueError("tie_word_embeddings=False: the EDTransformer's unembedding is W_eᵀ (proj_out tied to embed_tokens)")
    if get("use_weighted_layer_sum", False):
        raise ValueError("use_weighted_layer_sum=True (audio classification) has no equivalent in the EDTransformer")
    d = get("d_model")
    if d is None or d % 2 or d < 4:
        raise ValueError(f"d_model must be even and >= 4 (the encoder's sinusoids), got {d}")
    V = get("vocab_size")

    def tok(k):
        v = get(k)
        return v if v is not None and 0 <= v < V else None

    return dict(n_mels=get("num_mel_bins"), n_audio_ctx=get("max_source_positions"), n_vocab=V,
                n_text_ctx=get("max_target_positions"), L_enc=get("encoder_layers"), L_dec=get("decoder_layers"),
                H=get("encoder_attention_heads"), d_e=d, d_mlp=get("encoder_ffn_dim"),
                start_id=tok("decoder_start_token_id"), eos_id=tok("eos_token_id"))


def ed_options(hp: dict) -> dict:
    """The EDTransformer's options of whisper_hyper's sizes: Whisper as Algorithm 8 with the audio encoder (V28),
    V18a's pre-LN layers with GELU and biases, learned decoder positions W_p (l_max = n_text_ctx), tied W_eᵀ."""
    return dict(n_vocab=hp["n_vocab"], l_max=hp["n_text_ctx"], L_enc=hp["L_enc"], L_dec=hp["L_dec"], H=hp["H"],
                d_e=hp["d_e"], d_mlp=hp["d_mlp"], block="pre_ln", mlp="gelu", tied=True, bias=True, eps=1e-5,
                n_mels=hp["n_mels"], n_audio_ctx=hp["n_audio_ctx"], bos_id=hp["start_id"], eos_id=hp["eos_id"])


def _is_whisper(model) -> bool:
    """An EDTransformer with the audio encoder (what this converter writes)."""
    return isinstance(model, _core.EDTransformer) and model.config.get("n_mels") is not None


def _expected(c: dict, hp: dict) -> dict:
    d, m, V = hp["d_e"], hp["d_mlp"], hp["n_vocab"]
    e = {"model.encoder.conv1.weight": (d, hp["n_mels"], 3), "model.encoder.conv2.weight": (d, d, 3),
         "model.encoder.embed_positions.weight": (hp["n_audio_ctx"], d),
         "model.decoder.embed_tokens.weight": (V, d), "model.decoder.embed_positions.weight": (hp["n_text_ctx"], d)}
    for ours, hf in _plain(c):
        k = ours.split(".")[-1]
        e[hf] = (m, d) if k in ("W_mlp1", "W_mlp3") else (d, m) if k in ("W_mlp2", "W_mlp4") else \
            (m,) if k in ("b_mlp1", "b_mlp3") else (d,)
    for _, p in _attentions(c):
        for w in ("q_proj", "k_proj", "v_proj", "out_proj"):
            e[p + w + ".weight"] = (d, d)
        for w in ("q_proj", "v_proj", "out_proj"):
            e[p + w + ".bias"] = (d,)
    return e


def whisper_from_state(config: dict, T: dict, dtype=None, where: str = _CLS):
    """the EDTransformer from a WhisperConfig dict and the state dict (numpy, HF names): every tensor checked first."""
    hp = whisper_hyper(config)
    T = dict(T)
    if "proj_out.weight" in T:  # the tied head: W_eᵀ
        if not np.array_equal(T["proj_out.weight"], T.get("model.decoder.embed_tokens.weight")):
            raise ValueError(f"{where}: proj_out.weight differs from model.decoder.embed_tokens.weight: the EDTransformer's "
                             "unembedding is tied")
        T.pop("proj_out.weight")
    exp = _expected(config, hp)
    missing = sorted(set(exp) - set(T))
    if missing:
        raise ValueError(f"{where}: missing tensors for {_CLS}: " + ", ".join(missing[:8]))
    extra = sorted(set(T) - set(exp))
    if extra:
        raise ValueError(f"{where}: unexpected tensors for {_CLS} (a different configuration?): " + ", ".join(extra[:8]))
    for k, shape in exp.items():
        if tuple(T[k].shape) != tuple(shape):
            raise ValueError(f"{where}: tensor {k} has shape {tuple(T[k].shape)}, the config needs {tuple(shape)}")
        if not np.all(np.isfinite(T[k])):
            raise ValueError(f"{where}: tensor {k} holds NaN or infinite values")
    if dtype is None:
        dtype = "float64" if any(T[k].dtype == np.float64 for k in exp) else "float32"
    H, d = hp["H"], hp["d_e"]
    table = T["model.encoder.embed_positions.weight"]
    exact = _sinusoids(hp["n_audio_ctx"], d)
    if np.abs(np.asarray(table, dtype=np.float64) - exact.T).max() > 1e-3:
        raise ValueError(f"{where}: model.encoder.embed_positions.weight is not Whisper's sinusoids: the audio encoder's "
                         "table W_sin is fixed (V28 line 5), not a parameter")
    m = _core.EDTransformer(**ed_options(hp), dtype=dtype)
    P = m.params
    P["conv.W_c1"][...] = T["model.encoder.conv1.weight"].reshape(d, -1)
    P["conv.W_c2"][...] = T["model.encoder.conv2.weight"].reshape(d, -1)
    P["W_e"][...] = T["model.decoder.embed_tokens.weight"].T
    P["W_p"][...] = T["model.decoder.embed_positions.weight"].T
    for ours, hf in _plain(config):
        P[ours][...] = T[hf]
    for ours, p in _attentions(config):
        for o, h in _ATTN:
            P[ours + f"W_{o}"][...] = T[p + h + ".weight"].reshape(H, d // H, d)
            if o == "k":
                P[ours + "b_k"][...] = 0.0  # Whisper's k_proj has no bias
            else:
                P[ours + f"b_{o}"][...] = T[p + h + ".bias"].reshape(H, d // H)
        P[ours + "W_o"][...] = T[p + "out_proj.weight"]
        P[ours + "b_o"][...] = T[p + "out_proj.bias"]
    return m


def _sinusoids(n, d):
    from ..reference import whisper_sinusoids

    return whisper_sinusoids(n, d)


def whisper_export(model):
    """(class name, config.json dict, state dict) of an the EDTransformer: ValueError when a key bias b_k is not 0."""
    if not _is_whisper(model):
        raise TypeError("WhisperForConditionalGeneration is an EDTransformer with the audio encoder (n_mels)")
    c = model.config
    if not (c.get("block") == "pre_ln" and c.get("mlp") == "gelu" and c.get("tied") and c.get("bias", True)
            and c.get("positional", "learned") == "learned"):
        raise ValueError("to_hf: WhisperForConditionalGeneration is the EDTransformer with block='pre_ln', mlp='gelu', "
                         "tied=True, bias=True and learned positions; this one differs")
    P = {k: np.asarray(v) for k, v in model.params.items()}
    d, H = c["d_e"], c["H"]
    for k, v in P.items():
        if k.endswith(".b_k") and np.any(v != 0):
            raise ValueError(f"{k} is not 0: Whisper's key projections have no bias (b_k = 0, whose gradient is 0, "
                             "stays 0 in training)")
    V = c["n_vocab"]
    # HF's config needs token ids: a model without them exports 0 (from_hf reads them back as ids)
    start = c["bos_id"] if c.get("bos_id") is not None else V - 2  # Algorithm 15's bos_token, eos_token
    eos = c["eos_id"] if c.get("eos_id") is not None else V - 1
    cfg = dict(model_type="whisper", architectures=[_CLS], dtype=c["dtype"], vocab_size=V, num_mel_bins=c["n_mels"],
               encoder_layers=c["L_enc"], decoder_layers=c["L_dec"], encoder_attention_heads=H,
               decoder_attention_heads=H, encoder_ffn_dim=c["d_mlp"], decoder_ffn_dim=c["d_mlp"], d_model=d,
               max_source_positions=c["n_audio_ctx"], max_target_positions=c["l_max"],
               activation_function="gelu", scale_embedding=False, apply_spec_augment=False, dropout=0.0,
               attention_dropout=0.0, activation_dropout=0.0, encoder_layerdrop=0.0, decoder_layerdrop=0.0,
               tie_word_embeddings=True, decoder_start_token_id=start, bos_token_id=start, eos_token_id=eos,
               pad_token_id=eos, begin_suppress_tokens=None, suppress_tokens=None)
    cl = {"n_mels": c["n_mels"], "d": d}
    S = {"model.encoder.conv1.weight": P["conv.W_c1"].reshape(d, cl["n_mels"], 3),
         "model.encoder.conv2.weight": P["conv.W_c2"].reshape(d, d, 3),
         "model.encoder.embed_positions.weight": _sinusoids(c["n_audio_ctx"], d).T.astype(P["W_e"].dtype),
         "model.decoder.embed_tokens.weight": P["W_e"].T, "model.decoder.embed_positions.weight": P["W_p"].T}
    for ours, hf in _plain(cfg):
        S[hf] = P[ours]
    for ours, p in _attentions(cfg):
        for o, h in _ATTN:
            S[p + h + ".weight"] = P[ours + f"W_{o}"].reshape(d, d)
            if o != "k":
                S[p + h + ".bias"] = P[ours + f"b_{o}"].reshape(d)
        S[p + "out_proj.weight"] = P[ours + "W_o"]
        S[p + "out_proj.bias"] = P[ours + "b_o"]
    return _CLS, cfg, {k: np.ascontiguousarray(v) for k, v in S.items()}


@register
class Whisper(Converter):
    name = "Whisper"
    arch = "EDTransformer"
    classes = {_CLS: (True, "")}
    model_type = "whisper"

    def class_of(self, config, T, class_names):
        return _CLS if config.get("model_type") == "whisper" and not class_names else None

    def from_model(self, hf_model_, cls_name, dtype, **kw):
        if kw.get("bigbird_lengths"):
            raise ValueError(f"bigbird_lengths: {cls_name} is not a BigBird with attention_type='block_sparse'")
        if dtype is None:
            dtype = "float64" if next(hf_model_.parameters()).dtype == _torch_dtype("float64") else "float32"
        return whisper_from_state(hf_model_.config.to_dict(), state_arrays(hf_model_), dtype, cls_name)

    def build(self, config, T, dtype, where):
        return whisper_from_state(config, T, dtype, where)

    def takes(self, model, cfg):
        return _is_whisper(model)

    def export_model(self, model):
        return whisper_export(model)

    def to_hf(self, model, hf_class=None):
        return hf_model(*whisper_export(model))
