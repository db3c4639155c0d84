"""Weights in and out: Hugging Face `transformers` models and plain PyTorch modules.

    model = ft.from_hf(hf_model)        # GPT2LMHeadModel / GPT2Model -> DTransformer,
                                        # BertForMaskedLM / BertModel -> ETransformer,
                                        # LlamaForCausalLM -> DTransformer(positional="rope", H_kv, mlp="swiglu", …)
    hf_model = ft.to_hf(model)          # -> GPT2LMHeadModel / BertForMaskedLM / LlamaForCausalLM, equal outputs
    ft.save_hf(model, "dir")            # config.json + model.safetensors, for AutoModel*.from_pretrained("dir")
    model = ft.load_hf("dir")           # such a directory (or a downloaded HF one), with safetensors alone
    module = ft.to_torch(model)         # a plain torch.nn.Module: equal loss and gradients (all three models)
    model = ft.from_torch(module)       # and back

Everything works over the zero-copy `params` views, in float32 and float64; nothing touches the network
(local objects and paths only). How the weights map (HF stores y = x Wᵀ + b in rows, GPT-2's Conv1D stores
W itself; the paper's columns are tokens):

  GPT-2 (Algorithm 10, pre-LN, gelu="tanh" for gelu_new / gelu_pytorch_tanh, "exact" for gelu; tied W_u):
    wte.weight = W_eᵀ, wpe.weight = W_pᵀ; h.l.ln_1 = γ_l¹, β_l¹; h.l.attn.c_attn = [W_q; W_k; W_v]ᵀ (heads
    in blocks of d_e/H rows) with [b_q; b_k; b_v]; h.l.attn.c_proj = W_oᵀ, b_o; h.l.ln_2 = γ_l², β_l²;
    h.l.mlp.c_fc = W_mlp1ᵀ, b_mlp1; h.l.mlp.c_proj = W_mlp2ᵀ, b_mlp2; ln_f = γ, β; lm_head = W_u (tied: W_eᵀ).
  BERT (Algorithm 9 with its BERT options: n_segments, embed_norm, unembed_bias; post-LN):
    embeddings.{word,position,token_type}_embeddings = W_eᵀ, W_pᵀ, W_sᵀ; embeddings.LayerNorm = γ_e, β_e;
    encoder.layer.l.attention.self.{query,key,value} = W_q, W_k, W_v (H blocks of d_e/H rows) and biases;
    attention.output.dense = W_o, b_o; attention.output.LayerNorm = γ_l¹, β_l¹; intermediate.dense =
    W_mlp1, b_mlp1; output.dense = W_mlp2, b_mlp2; output.LayerNorm = γ_l², β_l²; BertForMaskedLM's head
    cls.predictions.transform.dense = W_f, b_f (line 10), transform.LayerNorm = γ, β (line 11), decoder =
    W_u (tied: W_eᵀ) with its bias = b_u (line 12; cls.predictions.decoder.bias, which HF ties to
    cls.predictions.bias unless the head is untied). BERT's last_hidden_state is
    model.hidden(x) (X after line 9). A BertModel has no MLM head: W_f, b_f, γ, β keep the model's
    initialisation and b_u = 0 (its pooler, a tanh layer over the first token, is not part of the paper's
    model and is not read).
  BigBird (BigBirdForMaskedLM / BigBirdModel): BERT's tensors and names, attention_type "block_sparse" as
    attention="bigbird" (docs/variants.md V17: w = 3, g = 1, r = num_random_blocks, b = block_size) with HF's own
    per-head random layouts installed for the lengths of from_hf's bigbird_lengths (the draw of the mode the HF
    model is in; eval mode puts every random block at block 0: a repeated block, weighed once per occurrence as
    HF gathers it, V17b's multiset note); "original_full" as BERT.

Batches: HF pads a batch to one length and passes attention_mask (1 = token, 0 = padding); our batches are
unpadded sequences, so a padded row with mask m maps to the sequence x[m == 1] (right padding; positions
start at 0 either way) and HF's outputs at padded positions have no counterpart. HF's BERT embedding has
padding_idx = pad_token_id, which keeps that row of W_e out of the embedding gradient; ft has no padding
token (its gradient of that row differs when the id occurs in a sequence). to_hf writes pad_token_id = None.

  LLaMA (Algorithm 10 with docs/variants.md's V1 RoPE (half-split pairing, θ = rope_theta), V3 grouped-query
    attention (H_kv = num_key_value_heads), V4 SwiGLU, V5 no biases, and norm="rms"; pre-norm):
    embed_tokens = W_eᵀ; layers.l.self_attn.{q,k,v}_proj = W_q (H blocks), W_k, W_v (H_kv blocks of head_dim
    rows); o_proj = W_o; mlp.gate_proj, up_proj, down_proj = W_gate, W_mlp1, W_mlp2; input_layernorm = γ_l¹;
    post_attention_layernorm = γ_l²; norm = γ; lm_head = W_u (tied: W_eᵀ). HF computes RMSnorm and the RoPE
    angles in float32 even for a float64 model, so a float64 HF LLaMA agrees with ft to float32 accuracy
    unless those two run in float64 (tests/python/test_variants.py shows how).

  T5 (T5ForConditionalGeneration, Raffel et al. 2020 -> EDTransformer with docs/variants.md's V11 relative
    position bias and V18 (pre_norm=True, norm="rms", bias=False, scale_scores=False, mlp="relu" | "geglu",
    unembed_rescale, bos_id = decoder_start_token_id, eos_id = eos_token_id; no W_p)):
    shared = W_eᵀ; encoder.block.l.layer.0.SelfAttention.{q,k,v} = W_q, W_k, W_v (H blocks of d_kv rows), o = W_o,
    layer_norm = γ_l¹; layer.1.DenseReluDense.wi = W_mlp1 (gated: wi_0 = W_gate, wi_1 = W_mlp1), wo = W_mlp2,
    layer_norm = γ_l²; encoder.block.0.…relative_attention_bias = enc.rel_bias; encoder.final_layer_norm = γ_enc;
    decoder.block.l.layer.0 the same (γ¹, dec.rel_bias), layer.1.EncDecAttention = cross_attn (γ²),
    layer.2 = W_mlp3 (W_gate), W_mlp4 (γ³); decoder.final_layer_norm = γ_dec; lm_head = W_u (tied: W_eᵀ).
    transformers 5 always ties lm_head to shared and scales by d_model^−1/2 when the config's
    tie_word_embeddings is not False (scale_decoder_outputs): ft's tied and unembed_rescale are the two
    independent facts (from_hf reads "tied" from whether lm_head is shared's tensor; to_hf unties lm_head
    for an untied model). T5 drops inside its MLP and after the final norms, places ft has no dropout site
    for: from_hf leaves the rates 0 (training-time only; the function is the same) and to_hf writes
    dropout_rate = 0. HF's T5LayerNorm computes its mean square in float32 even for a float64 model
    (tests/python/test_t5_hf.py says what that costs and how the test runs it in float64).

Unsupported configurations raise ValueError naming the option; nothing is half-loaded (every tensor is
checked before a model is made).
"""
from __future__ import annotations

import json
import os
from typing import Union

import numpy as np

from . import _core
from ._options import _check_options
from .io import build_model

__all__ = ["from_hf", "to_hf", "save_hf", "load_hf", "to_torch", "from_torch"]

_GELU_OF_HF = {"gelu": "exact", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}
_HF_OF_GELU = {"exact": "gelu", "tanh": "gelu_new"}
_DTYPES = ("float32", "float64")


# ---------------------------------------------------------------------------------------------------
# Reading config values: every value a mapping uses has its type and range checked first (ValueError naming
# the key; never a ZeroDivisionError, OverflowError or KeyError from a hostile config.json)

_REQUIRED = object()
_MAX_SIZE = 2**31 - 1  # the core's sizes and counts are C++ ints


def _shown(value) -> str:
    r = repr(value)
    return r if len(r) <= 60 else r[:57] + "..."


def _bad_value(model: str, key: str, value, want: str) -> ValueError:
    return ValueError(f"{model} config: {key} = {_shown(value)} is not {want}")


def _cfg_get(c: dict, model: str, key: str, default):
    if key in c and c[key] is not None:
        return c[key]
    if default is _REQUIRED:
        raise ValueError(f"{model} config: {key} is missing (a {model} config.json must give it)")
    return default


def _cfg_int(c: dict, model: str, key: str, default=_REQUIRED, lo: int = 1, hi: int = _MAX_SIZE) -> int:
    """An integer option in [lo, hi] (a JSON integer; an integral float such as 12.0 is taken as 12)."""
    v = _cfg_get(c, model, key, default)
    if isinstance(v, float) and np.isfinite(v) and v == int(v):
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise _bad_value(model, key, v, "an integer")
    if not lo <= v <= hi:
        raise _bad_value(model, key, v, f"an integer in [{lo}, {hi}]")
    return int(v)


def _cfg_float(c: dict, model: str, key: str, default=_REQUIRED, lo: float = 0.0, hi: float = np.inf,
               hi_open: bool = False, lo_open: bool = False) -> float:
    """A finite real option in [lo, hi] (open ends where asked)."""
    v = _cfg_get(c, model, key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise _bad_value(model, key, v, "a number")
    v = float(v)
    if not np.isfinite(v) or v < lo or v > hi or (lo_open and v == lo) or (hi_open and v == hi):
        span = ("(" if lo_open else "[") + f"{lo:g}, {hi:g}" + (")" if hi_open or hi == np.inf else "]")
        raise _bad_value(model, key, v, f"a finite number in {span}")
    return v


def _cfg_bool(c: dict, model: str, key: str, default: bool) -> bool:
    v = _cfg_get(c, model, key, default)
    if not isinstance(v, (bool, np.bool_)):
        raise _bad_value(model, key, v, "true or false")
    return bool(v)


def _cfg_str(c: dict, model: str, key: str, default: str) -> str:
    v = _cfg_get(c, model, key, default)
    if not isinstance(v, str):
        raise _bad_value(model, key, v, "a string")
    return v


def _cfg_rate(c: dict, model: str, key: str, default: float) -> float:
    return _cfg_float(c, model, key, default, 0.0, 1.0, hi_open=True)


_CONFIG_BYTES = 16 << 20  # a model's config.json is a few KB; anything this large is not one


def _read_config_json(cfg_file: str) -> dict:
    """config.json as a dict: ValueError (never RecursionError, MemoryError or a decoding error) when the file
    is not a JSON object of sensible size."""
    try:
        size = os.path.getsize(cfg_file)
        if size > _CONFIG_BYTES:
            raise ValueError(f"{size:,} bytes, more than a model config's {_CONFIG_BYTES:,}")
        with open(cfg_file, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError, RecursionError) as e:  # RecursionError: deeply nested JSON
        raise ValueError(f"{cfg_file}: not a readable JSON file ({type(e).__name__}: {_shown(str(e))})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{cfg_file}: expected a JSON object, got {type(config).__name__}")
    return config


def _config_class_names(config: dict, where: str) -> list:
    """config.json's "architectures": a list of class names (or absent)."""
    a = config.get("architectures")
    if a is None:
        return []
    if not isinstance(a, list) or not all(isinstance(x, str) for x in a):
        raise ValueError(f"{where}: architectures = {_shown(a)} is not a list of class names")
    return a


# the layers' tensors: name prefix in the body (after _strip) and the config key that counts them
_LAYERS = {"gpt2": ("h.", "n_layer"), "bert": ("encoder.layer.", "num_hidden_layers"),
           "big_bird": ("encoder.layer.", "num_hidden_layers"),
           "llama": ("layers.", "num_hidden_layers"), "mistral": ("layers.", "num_hidden_layers"),
           "deepseek_v3": ("layers.", "num_hidden_layers")}


def _check_layer_count(family: str, hp: dict, T: dict, cls_name: str, where: str, layers=None) -> None:
    """The config's layer count against the layers the weights hold, before any per-layer name is listed (a
    config claiming 10⁹ layers is a ValueError at once, not a list of 10¹⁰ names)."""
    if family == "t5":  # two stacks
        for prefix, key, L in (("encoder.block.", "num_layers", "L_enc"), ("decoder.block.", "num_decoder_layers", "L_dec")):
            _check_layer_count("", {"L": hp[L]}, T, cls_name, where, (prefix, key))
        return
    prefix, key = layers or _LAYERS[family]
    present = set()
    for k in T:
        if k.startswith(prefix):
            i = k[len(prefix):].split(".", 1)[0]
            if i.isdigit():
                present.add(i)
    if hp["L"] > len(present):
        raise ValueError(f"{where}: missing tensors for {cls_name}: the config's {key} = {hp['L']} but the weights "
                         f"hold {len(present)} layer{'s' if len(present) != 1 else ''}")


# ---------------------------------------------------------------------------------------------------
# HF configurations -> the paper's hyperparameters (ValueError naming any option we cannot express)

def _unsupported(model: str, option: str, value, why: str = "") -> ValueError:
    return ValueError(f"{model} config option {option}={value!r} is not supported{': ' + why if why else ''}")


def _require(c: dict, model: str, option: str, supported: bool, why: str) -> None:
    """A boolean option the layers express at one value only (HF's default): ValueError at the other."""
    if _cfg_bool(c, model, option, supported) != supported:
        raise _unsupported(model, option, not supported, why)


def _width_and_heads(c: dict, model: str, d_option: str, H_option: str) -> tuple:
    """d_e and H, read under the model's names; the heads split d_e evenly (d_attn = d_e / H)."""
    d, H = _cfg_int(c, model, d_option), _cfg_int(c, model, H_option)
    if d % H:
        raise _unsupported(model, H_option, H, f"{d_option} = {d} must be divisible by it")
    return d, H


def _swiglu_unsplit(c: dict, model: str) -> None:
    """LLaMA-family options: SwiGLU (V4) gated with SiLU, the layers unsplit (pretraining_tp = 1)."""
    act = _cfg_get(c, model, "hidden_act", "silu")
    if act != "silu":
        raise _unsupported(model, "hidden_act", act, "SwiGLU (V4) gates with SiLU")
    tp = _cfg_int(c, model, "pretraining_tp", 1)
    if tp != 1:
        raise _unsupported(model, "pretraining_tp", tp, "only the unsplit layers")


def _gelu_of(model: str, option: str, act) -> str:
    if not isinstance(act, str) or act not in _GELU_OF_HF:
        raise _unsupported(model, option, act, "the activation must be one of " + ", ".join(sorted(_GELU_OF_HF)))
    return _GELU_OF_HF[act]


def _gpt2_hyper(c: dict) -> dict:
    m = "GPT-2"
    _require(c, m, "scale_attn_weights", True, "Algorithm 4 divides the scores by √d_attn")
    _require(c, m, "scale_attn_by_inverse_layer_idx", False, "the listing scales every layer alike")
    _require(c, m, "add_cross_attention", False, "DTransformer has no cross-attention")
    d, H = _width_and_heads(c, m, "n_embd", "n_head")
    return dict(n_vocab=_cfg_int(c, m, "vocab_size"), l_max=_cfg_int(c, m, "n_positions"),
                L=_cfg_int(c, m, "n_layer"), H=H, d_e=d,
                d_mlp=_cfg_int(c, m, "n_inner", min(4 * d, _MAX_SIZE)),  # null: 4·n_embd, as GPT2MLP
                gelu=_gelu_of(m, "activation_function", _cfg_get(c, m, "activation_function", "gelu_new")),
                eps=_cfg_float(c, m, "layer_norm_epsilon", 1e-5), tied=_cfg_bool(c, m, "tie_word_embeddings", True),
                # dropout at GPT-2's places, which are ours (docs/regularisation.md); HF's defaults are 0.1
                embed_dropout=_cfg_rate(c, m, "embd_pdrop", 0.1), attn_dropout=_cfg_rate(c, m, "attn_pdrop", 0.1),
                resid_dropout=_cfg_rate(c, m, "resid_pdrop", 0.1))


def _bert_hyper(c: dict) -> dict:
    m = "BERT"
    pos = _cfg_get(c, m, "position_embedding_type", "absolute")
    if pos != "absolute":
        raise _unsupported(m, "position_embedding_type", pos, "only learned absolute positions (Algorithm 2)")
    _require(c, m, "is_decoder", False, "ETransformer is bidirectional (Mask ≡ 1)")
    _require(c, m, "add_cross_attention", False, "ETransformer has no cross-attention")
    d, H = _width_and_heads(c, m, "hidden_size", "num_attention_heads")
    n_seg = _cfg_int(c, m, "type_vocab_size", 2, lo=0)
    if n_seg < 1:
        raise _unsupported(m, "type_vocab_size", n_seg, "BERT adds a token-type embedding to every token")
    hidden_rate = _cfg_rate(c, m, "hidden_dropout_prob", 0.1)
    return dict(n_vocab=_cfg_int(c, m, "vocab_size"), l_max=_cfg_int(c, m, "max_position_embeddings"),
                L=_cfg_int(c, m, "num_hidden_layers"), H=H, d_e=d, d_mlp=_cfg_int(c, m, "intermediate_size"), d_f=d,
                gelu=_gelu_of(m, "hidden_act", _cfg_get(c, m, "hidden_act", "gelu")),
                eps=_cfg_float(c, m, "layer_norm_eps", 1e-12),
                tied=_cfg_bool(c, m, "tie_word_embeddings", True), n_segments=n_seg, embed_norm=True, unembed_bias=True,
                # BERT's hidden dropout acts after its embedding layer_norm and on each sublayer's output
                embed_dropout=hidden_rate, resid_dropout=hidden_rate,
                attn_dropout=_cfg_rate(c, m, "attention_probs_dropout_prob", 0.1))


def _bigbird_hyper(c: dict) -> dict:
    """BigBird (BigBirdModel / BigBirdForMaskedLM): BERT's tensors and post-LN layers; attention_type
    "block_sparse" is V17 with w = 3, g = 1 and r = num_random_blocks in blocks of block_size ("original_full":
    Algorithm 9's full attention). HF's block-sparse attention drops no weights (attention_probs_dropout_prob acts
    in "original_full" only) and HF drops its embeddings before their LayerNorm, a place ft has no dropout site
    for: embed_dropout is left 0 there (training-time only; the function is the same)."""
    m = "BigBird"
    _require(c, m, "is_decoder", False, "ETransformer is bidirectional")
    _require(c, m, "add_cross_attention", False, "ETransformer has no cross-attention")
    _require(c, m, "use_bias", True, "BERT's layers have biases")
    _require(c, m, "rescale_embeddings", False, "Algorithm 9 adds W_e[:, x[t]] unscaled")
    kind = _cfg_get(c, m, "attention_type", "block_sparse")
    if kind not in ("block_sparse", "original_full"):
        raise _unsupported(m, "attention_type", kind, "'block_sparse' (V17) or 'original_full'")
    d, H = _width_and_heads(c, m, "hidden_size", "num_attention_heads")
    n_seg = _cfg_int(c, m, "type_vocab_size", 2, lo=1)
    hidden_rate = _cfg_rate(c, m, "hidden_dropout_prob", 0.1)
    hp = dict(n_vocab=_cfg_int(c, m, "vocab_size"), l_max=_cfg_int(c, m, "max_position_embeddings"),
              L=_cfg_int(c, m, "num_hidden_layers"), H=H, d_e=d, d_mlp=_cfg_int(c, m, "intermediate_size"), d_f=d,
              gelu=_gelu_of(m, "hidden_act", _cfg_get(c, m, "hidden_act", "gelu_new")),
              eps=_cfg_float(c, m, "layer_norm_eps", 1e-12), tied=_cfg_bool(c, m, "tie_word_embeddings", True),
              n_segments=n_seg, embed_norm=True, unembed_bias=True, embed_dropout=0.0, resid_dropout=hidden_rate,
              attn_dropout=0.0)
    if kind == "original_full":
        hp["attn_dropout"] = _cfg_rate(c, m, "attention_probs_dropout_prob", 0.1)
    else:
        hp.update(attention="bigbird", block_size=_cfg_int(c, m, "block_size", 64), window_blocks=3, n_global_blocks=1,
                  n_random_blocks=_cfg_int(c, m, "num_random_blocks", 3, lo=0))
    return hp


def _bigbird_hf_layouts(hf_model, l) -> np.ndarray:
    """The block layouts (L, H, n, n) a BigBird block-sparse model draws for sequences of ℓ tokens in the mode
    each layer is in: in training mode each layer's BigBirdBlockSparseAttention seeds numpy with its seed (the
    layer index) and draws every head's random blocks with its own methods, called here as its
    bigbird_block_sparse_attention calls them (transformers 5.x; numpy's global state is restored after); in
    eval mode those methods return every random block as block 0. Query block i of head h then reads blocks
    i − 1, i, i + 1, 0, n − 1 and the random blocks of row i (rows 0 and n − 1 read everything), as uint8
    multiplicities: HF gathers a random block that repeats another random block or one of the window and global
    blocks (its "old plans" at ℓ ∈ {1024, 3072, 4096} can) once per occurrence, so it weighs m·exp(s) in the
    softmax (docs/variants.md V17b's multiset note). ValueError if HF would not run block-sparse at ℓ."""
    c = hf_model.config
    b, r, H = int(c.block_size), int(c.num_random_blocks), int(c.num_attention_heads)
    if isinstance(l, bool) or not isinstance(l, (int, np.integer)):
        raise TypeError(f"bigbird_lengths: a sequence length must be an integer, got {_shown(l)}")
    l = int(l)
    if l % b:
        raise ValueError(f"BigBird layouts: block_size = {b} does not divide the sequence length {l}")
    if l <= (5 + 2 * r) * b:
        raise ValueError(f"BigBird layouts: at ℓ = {l} ≤ (5 + 2·num_random_blocks)·block_size = {(5 + 2 * r) * b} "
                         "Hugging Face runs full attention (original_full), not block_sparse")
    n = l // b
    base = getattr(hf_model, "bert", hf_model)
    out = np.zeros((len(base.encoder.layer), H, n, n), dtype=np.uint8)
    state = np.random.get_state()
    try:
        for li, layer in enumerate(base.encoder.layer):
            att = layer.attention.self  # its own mode (eval: every random block is block 0, a repeat)
            np.random.seed(att.seed)
            if l in (1024, 3072, 4096):  # HF's "old plans used in paper"
                rand = [att._bigbird_block_rand_mask(att.max_seqlen, att.max_seqlen, b, b, r, last_idx=1024)[: n - 2]
                        for _ in range(H)]
            else:
                plan, plan_r = att._get_rand_attn_plan(l, b, r)
                rand = att._bigbird_block_rand_mask_with_head(
                    from_seq_length=l, to_seq_length=l, from_block_size=b, to_block_size=b, num_heads=H,
                    plan_from_length=plan, plan_num_rand_blocks=plan_r)
            for h in range(H):
                out[li, h, :, 0] = out[li, h, :, n - 1] = 1
                for i in range(1, n - 1):
                    # the window and global blocks once each (distinct for 1 ≤ i ≤ n − 2), then every random draw
                    for j in [*sorted({i - 1, i, i + 1, 0, n - 1}), *(int(j) for j in np.asarray(rand[h])[i - 1])]:
                        out[li, h, j, i] += 1
    finally:
        np.random.set_state(state)
    return out


# ---------------------------------------------------------------------------------------------------
# Tensors: HF names (without the "transformer." / "bert." prefix of the head classes) <-> ft params.
# Each mapping returns {ft name: array in ft's layout} and the HF names it read.

def _split_heads(W, H):  # (H·d_h, d) -> (H, d_h, d);  (H·d_h,) -> (H, d_h)
    return W.reshape(H, W.shape[0] // H, *W.shape[1:])


def _gpt2_expected(hp: dict, head: bool) -> dict:
    d, V, P, m = hp["d_e"], hp["n_vocab"], hp["l_max"], hp["d_mlp"]
    e = {"wte.weight": (V, d), "wpe.weight": (P, d), "ln_f.weight": (d,), "ln_f.bias": (d,)}
    for l in range(hp["L"]):
        h = f"h.{l}."
        e.update({h + "ln_1.weight": (d,), h + "ln_1.bias": (d,), h + "attn.c_attn.weight": (d, 3 * d),
                  h + "attn.c_attn.bias": (3 * d,), h + "attn.c_proj.weight": (d, d), h + "attn.c_proj.bias": (d,),
                  h + "ln_2.weight": (d,), h + "ln_2.bias": (d,), h + "mlp.c_fc.weight": (d, m),
                  h + "mlp.c_fc.bias": (m,), h + "mlp.c_proj.weight": (m, d), h + "mlp.c_proj.bias": (d,)})
    if head and not hp["tied"]:
        e["lm_head.weight"] = (V, d)
    return e


def _gpt2_to_ft(hp: dict, T: dict, head: bool) -> dict:
    d, H = hp["d_e"], hp["H"]
    p = {"W_e": T["wte.weight"].T, "W_p": T["wpe.weight"].T, "gamma": T["ln_f.weight"], "beta": T["ln_f.bias"]}
    for l in range(hp["L"]):
        h, q = f"h.{l}.", f"layers.{l}."
        W, b = T[h + "attn.c_attn.weight"], T[h + "attn.c_attn.bias"]
        for i, n in enumerate("qkv"):
            p[q + f"attn.W_{n}"] = _split_heads(W[:, i * d:(i + 1) * d].T, H)
            p[q + f"attn.b_{n}"] = _split_heads(b[i * d:(i + 1) * d], H)
        p[q + "attn.W_o"], p[q + "attn.b_o"] = T[h + "attn.c_proj.weight"].T, T[h + "attn.c_proj.bias"]
        p[q + "gamma1"], p[q + "beta1"] = T[h + "ln_1.weight"], T[h + "ln_1.bias"]
        p[q + "gamma2"], p[q + "beta2"] = T[h + "ln_2.weight"], T[h + "ln_2.bias"]
        p[q + "W_mlp1"], p[q + "b_mlp1"] = T[h + "mlp.c_fc.weight"].T, T[h + "mlp.c_fc.bias"]
        p[q + "W_mlp2"], p[q + "b_mlp2"] = T[h + "mlp.c_proj.weight"].T, T[h + "mlp.c_proj.bias"]
    if head and not hp["tied"]:
        p["W_u"] = T["lm_head.weight"]
    return p


def _gpt2_from_ft(P: dict, cfg: dict) -> dict:
    """ft params of a DTransformer -> GPT2LMHeadModel's state (full names)."""
    L = cfg["L"]
    t = {"transformer.wte.weight": P["W_e"].T, "transformer.wpe.weight": P["W_p"].T,
         "transformer.ln_f.weight": P["gamma"], "transformer.ln_f.bias": P["beta"]}
    flat = lambda a: a.reshape(-1, *a.shape[2:])  # (H, d_h, …) -> (H·d_h, …)
    for l in range(L):
        h, q = f"transformer.h.{l}.", f"layers.{l}."
        t[h + "attn.c_attn.weight"] = np.concatenate([flat(P[q + f"attn.W_{n}"]).T for n in "qkv"], axis=1)
        t[h + "attn.c_attn.bias"] = np.concatenate([flat(P[q + f"attn.b_{n}"]) for n in "qkv"])
        t[h + "attn.c_proj.weight"], t[h + "attn.c_proj.bias"] = P[q + "attn.W_o"].T, P[q + "attn.b_o"]
        t[h + "ln_1.weight"], t[h + "ln_1.bias"] = P[q + "gamma1"], P[q + "beta1"]
        t[h + "ln_2.weight"], t[h + "ln_2.bias"] = P[q + "gamma2"], P[q + "beta2"]
        t[h + "mlp.c_fc.weight"], t[h + "mlp.c_fc.bias"] = P[q + "W_mlp1"].T, P[q + "b_mlp1"]
        t[h + "mlp.c_proj.weight"], t[h + "mlp.c_proj.bias"] = P[q + "W_mlp2"].T, P[q + "b_mlp2"]
    if not cfg["tied"]:
        t["lm_head.weight"] = P["W_u"]
    return t


_BERT_LAYER = (  # (HF name in encoder.layer.l., ft name in layers.l., kind)
    ("attention.self.query.weight", "attn.W_q", "heads"), ("attention.self.query.bias", "attn.b_q", "heads"),
    ("attention.self.key.weight", "attn.W_k", "heads"), ("attention.self.key.bias", "attn.b_k", "heads"),
    ("attention.self.value.weight", "attn.W_v", "heads"), ("attention.self.value.bias", "attn.b_v", "heads"),
    ("attention.output.dense.weight", "attn.W_o", ""), ("attention.output.dense.bias", "attn.b_o", ""),
    ("attention.output.LayerNorm.weight", "gamma1", ""), ("attention.output.LayerNorm.bias", "beta1", ""),
    ("intermediate.dense.weight", "W_mlp1", ""), ("intermediate.dense.bias", "b_mlp1", ""),
    ("output.dense.weight", "W_mlp2", ""), ("output.dense.bias", "b_mlp2", ""),
    ("output.LayerNorm.weight", "gamma2", ""), ("output.LayerNorm.bias", "beta2", ""),
)
_BERT_EMB = (("embeddings.word_embeddings.weight", "W_e", "T"), ("embeddings.position_embeddings.weight", "W_p", "T"),
             ("embeddings.token_type_embeddings.weight", "W_s", "T"), ("embeddings.LayerNorm.weight", "gamma_e", ""),
             ("embeddings.LayerNorm.bias", "beta_e", ""))
_BERT_HEAD = (("cls.predictions.transform.dense.weight", "W_f", ""), ("cls.predictions.transform.dense.bias", "b_f", ""),
              ("cls.predictions.transform.LayerNorm.weight", "gamma", ""),
              ("cls.predictions.transform.LayerNorm.bias", "beta", ""), ("cls.predictions.bias", "b_u", ""))


def _bert_pairs(hp: dict, head: bool):
    pairs = list(_BERT_EMB)
    for l in range(hp["L"]):
        pairs += [(f"encoder.layer.{l}." + a, f"layers.{l}." + b, k) for a, b, k in _BERT_LAYER]
    if head:
        pairs += list(_BERT_HEAD)
        if not hp["tied"]:
            pairs.append(("cls.predictions.decoder.weight", "W_u", ""))
    return pairs


def _bert_expected(hp: dict, head: bool) -> dict:
    d, V, m = hp["d_e"], hp["n_vocab"], hp["d_mlp"]
    shape = {"W_e": (V, d), "W_p": (hp["l_max"], d), "W_s": (hp["n_segments"], d), "gamma_e": (d,), "beta_e": (d,),
             "W_f": (d, d), "b_f": (d,), "gamma": (d,), "beta": (d,), "b_u": (V,), "W_u": (V, d)}
    layer = {"attn.W_q": (d, d), "attn.W_k": (d, d), "attn.W_v": (d, d), "attn.W_o": (d, d), "W_mlp1": (m, d),
             "b_mlp1": (m,), "W_mlp2": (d, m)}
    out = {}
    for a, b, _ in _bert_pairs(hp, head):
        out[a] = shape.get(b) or layer.get(b.split(".", 2)[-1], (d,))
    return out


def _bert_to_ft(hp: dict, T: dict, head: bool) -> dict:
    p = {}
    for a, b, kind in _bert_pairs(hp, head):
        v = T[a]
        p[b] = v.T if kind == "T" else _split_heads(v, hp["H"]) if kind == "heads" else v
    return p


def _bert_from_ft(P: dict, cfg: dict) -> dict:
    hp = dict(cfg, n_segments=max(cfg.get("n_segments", 0), 1))
    t = {}
    for a, b, kind in _bert_pairs(hp, True):
        if b not in P:  # n_segments = 0: one segment of zeros; no b_u: zeros (the same function)
            v = np.zeros((hp["d_e"], 1) if b == "W_s" else (cfg["n_vocab"],), dtype=P["W_e"].dtype)
        else:
            v = P[b]
        t[("bert." if a.startswith(("embeddings", "encoder")) else "") + a] = (
            v.T if kind == "T" else v.reshape(-1, *v.shape[2:]) if kind == "heads" else v)
    if not cfg["tied"]:  # untied, HF's decoder keeps its own bias (the one it adds)
        t["cls.predictions.decoder.bias"] = t["cls.predictions.bias"]
    return t


# LLaMA (LlamaForCausalLM -> DTransformer with the variants of docs/variants.md: RoPE V1, grouped-query
# attention V3, SwiGLU V4, no biases V5, with norm="rms")

def _llama_rope(c: dict) -> float:
    """θ of V1's rotary embedding, read as transformers 5 reads a LLaMA config (RotaryEmbeddingConfigMixin):
    the RoPE parameters are "rope_scaling" when it is set (the older name wins), else "rope_parameters";
    their rope_type (or "type") must be "default" — scaled variants (linear, dynamic, yarn, llama3, …) change
    the angles in ways V1 does not express and are refused; θ is their "rope_theta", else the top-level
    "rope_theta", else 10,000. (partial_rotary_factor is not read by LLaMA's default rotary embedding.)"""
    m = "LLaMA"
    key = "rope_scaling" if c.get("rope_scaling") else "rope_parameters"
    rp = c.get(key)
    if rp is None:
        rp = {}
    if not isinstance(rp, dict):
        raise _bad_value(m, key, rp, "an object of RoPE parameters")
    kind = rp.get("rope_type", rp.get("type", "default"))
    if kind != "default":
        raise _unsupported(m, f"{key}.rope_type", kind, "only the plain rotary embedding of V1 (no scaling)")
    if rp.get("rope_theta") is not None:
        name = f"{key}.rope_theta"  # named as the file nests it
        return _cfg_float({name: rp["rope_theta"]}, m, name, lo=0.0, lo_open=True)
    return _cfg_float(c, m, "rope_theta", 10000.0, lo=0.0, lo_open=True)


def _llama_hyper(c: dict) -> dict:
    m = "LLaMA"
    _swiglu_unsplit(c, m)
    for opt in ("attention_bias", "mlp_bias"):
        _require(c, m, opt, False, "the LLaMA-style DTransformer has bias=False (V5) throughout")
    d, H = _cfg_int(c, m, "hidden_size"), _cfg_int(c, m, "num_attention_heads")
    H_kv = _cfg_int(c, m, "num_key_value_heads", H)  # null: H, as LlamaConfig
    d_h = _cfg_int(c, m, "head_dim", max(d // H, 1))  # null: hidden_size // num_attention_heads
    if H % H_kv:
        raise _unsupported(m, "num_key_value_heads", H_kv, f"it must divide num_attention_heads = {H}")
    return dict(n_vocab=_cfg_int(c, m, "vocab_size"), l_max=_cfg_int(c, m, "max_position_embeddings"),
                L=_cfg_int(c, m, "num_hidden_layers"), H=H, d_e=d, d_mlp=_cfg_int(c, m, "intermediate_size"),
                d_attn=d_h, d_mid=d_h, H_kv=H_kv, positional="rope", rope_theta=_llama_rope(c), mlp="swiglu",
                bias=False, norm="rms", eps=_cfg_float(c, m, "rms_norm_eps", 1e-6),
                tied=_cfg_bool(c, m, "tie_word_embeddings", False),
                attn_dropout=_cfg_rate(c, m, "attention_dropout", 0.0))  # LLaMA drops only its attention weights


# Mistral (MistralForCausalLM, Jiang et al. 2023): LLaMA's layers, names and tensors, with sliding-window
# attention (docs/variants.md V8: each query sees the last `sliding_window` keys; None: causal as LLaMA).

def _mistral_hyper(c: dict) -> dict:
    for opt in ("attention_bias", "mlp_bias"):  # not MistralConfig options; a config carrying one is not Mistral's
        if c.get(opt, False):
            raise _unsupported("Mistral", opt, True, "Mistral has bias=False (V5) throughout")
    hp = _llama_hyper(c)
    w = c.get("sliding_window")
    if w is not None:
        if isinstance(w, bool) or not isinstance(w, int) or w < 1:
            raise _unsupported("Mistral", "sliding_window", w, "a window of w ≥ 1 keys (V8), or None")
        hp["sliding_window"] = int(w)
    return hp


_LLAMA_LAYER = (  # (HF name in layers.l., ft name in layers.l., heads of the reshape: "H", "H_kv" or "")
    ("self_attn.q_proj.weight", "attn.W_q", "H"), ("self_attn.k_proj.weight", "attn.W_k", "H_kv"),
    ("self_attn.v_proj.weight", "attn.W_v", "H_kv"), ("self_attn.o_proj.weight", "attn.W_o", ""),
    ("mlp.gate_proj.weight", "W_gate", ""), ("mlp.up_proj.weight", "W_mlp1", ""), ("mlp.down_proj.weight", "W_mlp2", ""),
    ("input_layernorm.weight", "gamma1", ""), ("post_attention_layernorm.weight", "gamma2", ""),
)


def _llama_expected(hp: dict, head: bool) -> dict:
    d, V, m, H, H_kv, d_h = hp["d_e"], hp["n_vocab"], hp["d_mlp"], hp["H"], hp["H_kv"], hp["d_attn"]
    layer = {"attn.W_q": (H * d_h, d), "attn.W_k": (H_kv * d_h, d), "attn.W_v": (H_kv * d_h, d),
             "attn.W_o": (d, H * d_h), "W_gate": (m, d), "W_mlp1": (m, d), "W_mlp2": (d, m), "gamma1": (d,),
             "gamma2": (d,)}
    e = {"embed_tokens.weight": (V, d), "norm.weight": (d,)}
    for l in range(hp["L"]):
        e.update({f"layers.{l}.{a}": layer[b] for a, b, _ in _LLAMA_LAYER})
    if head and not hp["tied"]:
        e["lm_head.weight"] = (V, d)
    return e


def _llama_to_ft(hp: dict, T: dict, head: bool) -> dict:
    p = {"W_e": T["embed_tokens.weight"].T, "gamma": T["norm.weight"]}
    for l in range(hp["L"]):
        for a, b, heads in _LLAMA_LAYER:
            v = T[f"layers.{l}.{a}"]
            p[f"layers.{l}.{b}"] = _split_heads(v, hp[heads]) if heads else v
    if head and not hp["tied"]:
        p["W_u"] = T["lm_head.weight"]
    return p


def _llama_from_ft(P: dict, cfg: dict) -> dict:
    """ft params of a LLaMA-style DTransformer -> LlamaForCausalLM's state (full names)."""
    t = {"model.embed_tokens.weight": P["W_e"].T, "model.norm.weight": P["gamma"]}
    for l in range(cfg["L"]):
        for a, b, heads in _LLAMA_LAYER:
            v = P[f"layers.{l}.{b}"]
            t[f"model.layers.{l}.{a}"] = v.reshape(-1, *v.shape[2:]) if heads else v
    if not cfg["tied"]:
        t["lm_head.weight"] = P["W_u"]
    return t


def _mistral_export(cfg: dict, P: dict):
    """A LLaMA-style DTransformer with sliding_window=w -> MistralForCausalLM (LLaMA's tensors and names)."""
    w = cfg.get("sliding_window")
    _, hf, state = _llama_export({k: v for k, v in cfg.items() if k != "sliding_window"}, P)
    hf = {**hf, "model_type": "mistral", "architectures": ["MistralForCausalLM"], "sliding_window": int(w)}
    hf.pop("attention_bias", None)
    hf.pop("mlp_bias", None)
    return "MistralForCausalLM", hf, state


# DeepSeek-V3 (DeepseekV3ForCausalLM, DeepSeek-AI 2024) with dense MLPs only: LLaMA's decoder (RMSnorm, SwiGLU,
# no biases) with multi-head latent attention (docs/variants.md V10). Its RoPE pairs rows (2i, 2i+1) of the
# rotated part (rope_interleave, the default) where V1 pairs (i, i + d_R/2): the rotated rows of q_b_proj (q_proj)
# and kv_a_proj_with_mqa are permuted on the way in (even rows first, then odd) and back on the way out, which
# gives the same scores (HF's own interleaved code computes exactly these products).

def _deepseek_hyper(c: dict) -> dict:
    m = "DeepSeek-V3"
    L = _cfg_int(c, m, "num_hidden_layers")
    k_dense = c.get("first_k_dense_replace")
    if k_dense is None or isinstance(k_dense, bool) or not isinstance(k_dense, int) or k_dense < L:
        raise _unsupported(m, "first_k_dense_replace", k_dense,
                           f"only dense MLP layers (first_k_dense_replace >= num_hidden_layers = {L}); layers from "
                           "first_k_dense_replace on are mixtures of experts (n_routed_experts), which we do not express")
    _swiglu_unsplit(c, m)
    _require(c, m, "attention_bias", False, "latent attention has no biases (V10)")
    d, H = _cfg_int(c, m, "hidden_size"), _cfg_int(c, m, "num_attention_heads")
    H_kv = _cfg_int(c, m, "num_key_value_heads", H)
    if H_kv != H:
        raise _unsupported(m, "num_key_value_heads", H_kv, f"latent attention makes every head's keys (= {H})")
    d_R, d_N = _cfg_int(c, m, "qk_rope_head_dim"), _cfg_int(c, m, "qk_nope_head_dim", lo=0)
    if d_R % 2:
        raise _unsupported(m, "qk_rope_head_dim", d_R, "RoPE rotates pairs: an even size")
    q_rank = c.get("q_lora_rank")
    hp = dict(n_vocab=_cfg_int(c, m, "vocab_size"), l_max=_cfg_int(c, m, "max_position_embeddings"), L=L, H=H,
              d_e=d, d_mlp=_cfg_int(c, m, "intermediate_size"), d_attn=d_N + d_R, d_mid=_cfg_int(c, m, "v_head_dim"),
              positional="rope", rope_theta=_llama_rope(c), mlp="swiglu", bias=False, norm="rms",
              eps=_cfg_float(c, m, "rms_norm_eps", 1e-6), tied=_cfg_bool(c, m, "tie_word_embeddings", False),
              attn_dropout=_cfg_rate(c, m, "attention_dropout", 0.0), kv_lora_rank=_cfg_int(c, m, "kv_lora_rank"),
              qk_rope_head_dim=d_R, _rope_interleave=_cfg_bool(c, m, "rope_interleave", True))
    if q_rank is not None:
        hp["q_lora_rank"] = _cfg_int(c, m, "q_lora_rank")
    return hp


def _deepseek_layer(hp: dict):  # (HF name in layers.l., ft name in layers.l., heads of the reshape or "")
    q = ([("self_attn.q_a_proj.weight", "attn.W_dq", ""), ("self_attn.q_a_layernorm.weight", "attn.gamma_q", ""),
          ("self_attn.q_b_proj.weight", "attn.W_uq", "H")] if hp.get("q_lora_rank")
         else [("self_attn.q_proj.weight", "attn.W_q", "H")])
    return q + [("self_attn.kv_a_proj_with_mqa.weight", "attn.W_dkv", ""),
                ("self_attn.kv_a_layernorm.weight", "attn.gamma_kv", ""),
                ("self_attn.kv_b_proj.weight", "attn.W_ukv", "H"), ("self_attn.o_proj.weight", "attn.W_o", ""),
                ("mlp.gate_proj.weight", "W_gate", ""), ("mlp.up_proj.weight", "W_mlp1", ""),
                ("mlp.down_proj.weight", "W_mlp2", ""), ("input_layernorm.weight", "gamma1", ""),
                ("post_attention_layernorm.weight", "gamma2", "")]


def _deepseek_expected(hp: dict, head: bool) -> dict:
    d, V, m, H = hp["d_e"], hp["n_vocab"], hp["d_mlp"], hp["H"]
    d_attn, d_v, d_c, d_R = hp["d_attn"], hp["d_mid"], hp["kv_lora_rank"], hp["qk_rope_head_dim"]
    d_cq = hp.get("q_lora_rank", 0)
    shapes = {"attn.W_dq": (d_cq, d), "attn.gamma_q": (d_cq,), "attn.W_uq": (H * d_attn, d_cq),
              "attn.W_q": (H * d_attn, d), "attn.W_dkv": (d_c + d_R, d), "attn.gamma_kv": (d_c,),
              "attn.W_ukv": (H * (d_attn - d_R + d_v), d_c), "attn.W_o": (d, H * d_v), "W_gate": (m, d),
              "W_mlp1": (m, d), "W_mlp2": (d, m), "gamma1": (d,), "gamma2": (d,)}
    e = {"embed_tokens.weight": (V, d), "norm.weight": (d,)}
    for l in range(hp["L"]):
        e.update({f"layers.{l}.{a}": shapes[b] for a, b, _ in _deepseek_layer(hp)})
    if head and not hp["tied"]:
        e["lm_head.weight"] = (V, d)
    return e


def _rope_rows(hp: dict, name: str, v, inverse: bool):
    """The rows of W_uq / W_q (per head) and W_dkv that V1 rotates, from DeepSeek's interleaved pairs (2i, 2i+1)
    to V1's (i, i + d_R/2) (inverse: back)."""
    d_R = hp["qk_rope_head_dim"]
    perm = np.concatenate([np.arange(0, d_R, 2), np.arange(1, d_R, 2)])
    order = np.argsort(perm) if inverse else perm
    v = np.array(v, copy=True)
    if name == "attn.W_dkv":
        v[-d_R:] = v[-d_R:][order]
    elif name in ("attn.W_uq", "attn.W_q"):  # (H, d_attn, ·): each head's last d_R rows
        v[:, -d_R:] = v[:, -d_R:][:, order]
    return v


def _deepseek_to_ft(hp: dict, T: dict, head: bool) -> dict:
    p = {"W_e": T["embed_tokens.weight"].T, "gamma": T["norm.weight"]}
    for l in range(hp["L"]):
        for a, b, heads in _deepseek_layer(hp):
            v = T[f"layers.{l}.{a}"]
            v = _split_heads(v, hp[heads]) if heads else v
            p[f"layers.{l}.{b}"] = _rope_rows(hp, b, v, False) if hp["_rope_interleave"] else v
    if head and not hp["tied"]:
        p["W_u"] = T["lm_head.weight"]
    return p


def _deepseek_export(cfg: dict, P: dict):
    """A DTransformer with kv_lora_rank (V10), mlp='swiglu', bias=False, norm='rms' -> DeepseekV3ForCausalLM
    with dense MLPs (first_k_dense_replace = L) and rope_interleave=True (DeepSeek's layout)."""
    cfg, rates = _split_rates(cfg)
    for k in ("embed_dropout", "resid_dropout"):
        if rates[k]:
            raise ValueError(f"DeepSeek-V3 has no equivalent of {k}={rates[k]!r}: it drops only its attention weights")
    for k, want in (("mlp", "swiglu"), ("norm", "rms")):
        if cfg.get(k) != want:
            raise ValueError(f"DeepSeek-V3 has no equivalent of {k}={cfg.get(k)!r} (mlp='swiglu', norm='rms')")
    hp = {**cfg, "_rope_interleave": True}
    hf = {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], "vocab_size": cfg["n_vocab"],
          "hidden_size": cfg["d_e"], "intermediate_size": cfg["d_mlp"], "num_hidden_layers": cfg["L"],
          "first_k_dense_replace": cfg["L"], "num_attention_heads": cfg["H"], "num_key_value_heads": cfg["H"],
          "kv_lora_rank": cfg["kv_lora_rank"], "q_lora_rank": cfg.get("q_lora_rank"),
          "qk_rope_head_dim": cfg["qk_rope_head_dim"], "qk_nope_head_dim": cfg["d_attn"] - cfg["qk_rope_head_dim"],
          "v_head_dim": cfg["d_mid"], "max_position_embeddings": cfg["l_max"], "rms_norm_eps": cfg["eps"],
          "rope_parameters": {"rope_type": "default", "rope_theta": cfg["rope_theta"]}, "rope_interleave": True,
          "hidden_act": "silu", "attention_bias": False, "attention_dropout": rates["attn_dropout"],
          "tie_word_embeddings": cfg["tied"], "initializer_range": cfg["init_std"],
          "bos_token_id": cfg["n_vocab"] - 2, "eos_token_id": cfg["n_vocab"] - 1, "use_cache": True,
          "num_mtp_layers": 0, "dtype": cfg["dtype"]}
    t = {"model.embed_tokens.weight": P["W_e"].T, "model.norm.weight": P["gamma"]}
    for l in range(cfg["L"]):
        for a, b, heads in _deepseek_layer(hp):
            v = _rope_rows(hp, b, P[f"layers.{l}.{b}"], True)
            t[f"model.layers.{l}.{a}"] = v.reshape(-1, *v.shape[2:]) if heads else v
    if not cfg["tied"]:
        t["lm_head.weight"] = P["W_u"]
    return "DeepseekV3ForCausalLM", hf, t


# T5 (T5ForConditionalGeneration): an EDTransformer with V11 and V18 (docs/variants.md)

def _t5_hyper(c: dict) -> dict:
    m = "T5"
    _require(c, m, "is_encoder_decoder", True, "T5ForConditionalGeneration is an encoder-decoder (Algorithm 8)")
    _require(c, m, "is_decoder", False, "the stack configuration of T5ForConditionalGeneration has is_decoder=False")
    ff = _cfg_str(c, m, "feed_forward_proj", "relu")
    if ff not in ("relu", "gated-gelu"):
        raise _unsupported(m, "feed_forward_proj", ff, "'relu' (the standard MLP with ReLU) or 'gated-gelu' (V18b GEGLU)")
    N_b = _cfg_int(c, m, "relative_attention_num_buckets", 32)
    d_max = _cfg_int(c, m, "relative_attention_max_distance", 128)
    if N_b < 4:
        raise _unsupported(m, "relative_attention_num_buckets", N_b, "at least 4 (V11 halves them for the two directions)")
    if d_max <= N_b // 2:
        raise _unsupported(m, "relative_attention_max_distance", d_max,
                           f"more than relative_attention_num_buckets / 2 = {N_b // 2} (V11's log-spaced buckets)")
    eos = c.get("eos_token_id", 1)
    if isinstance(eos, bool) or not isinstance(eos, int) or eos < 0:
        raise _unsupported(m, "eos_token_id", eos, "one token id (EDInference's eos_id)")
    start = c.get("decoder_start_token_id")
    if start is None:
        start = c.get("pad_token_id", 0)
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise _unsupported(m, "decoder_start_token_id", start, "one token id (EDInference's bos_id)")
    scale = c.get("scale_decoder_outputs")
    if scale is None:  # transformers < 5: the config's tie_word_embeddings says both (see the module's notes)
        scale = _cfg_bool(c, m, "tie_word_embeddings", True)
    d_kv, L = _cfg_int(c, m, "d_kv"), _cfg_int(c, m, "num_layers")
    L_dec = c.get("num_decoder_layers")
    return dict(n_vocab=_cfg_int(c, m, "vocab_size"), l_max=_cfg_int(c, m, "n_positions", 512), L_enc=L,
                L_dec=_cfg_int(c, m, "num_decoder_layers") if L_dec is not None else L,
                H=_cfg_int(c, m, "num_heads"), d_e=_cfg_int(c, m, "d_model"), d_mlp=_cfg_int(c, m, "d_ff"),
                d_attn=d_kv, d_mid=d_kv, norm="rms", pre_norm=True, bias=False, positional="relative",
                relative_buckets=N_b, relative_max_distance=d_max, scale_scores=False,
                mlp="geglu" if ff == "gated-gelu" else "relu", unembed_rescale=bool(scale),
                eps=_cfg_float(c, m, "layer_norm_epsilon", 1e-6), bos_id=int(start), eos_id=int(eos),
                tied=bool(c.get("_ft_tied", True)))


def _t5_attn(stack: str, l: int, i: int, kind: str):
    return [(f"{stack}.block.{l}.layer.{i}.{kind}.{w}.weight", f"{stack[:3]}.{l}.{'attn' if i == 0 else 'cross_attn'}.W_{w}",
             "" if w == "o" else "H") for w in "qkvo"]


def _t5_names(hp: dict, head: bool):
    """(HF name, ft name, heads of the reshape or "") of every tensor of a T5ForConditionalGeneration."""
    gated = hp["mlp"] == "geglu"
    r = [("shared.weight", "W_e", "T"), ("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                                         "enc.rel_bias", ""),
         ("decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", "dec.rel_bias", ""),
         ("encoder.final_layer_norm.weight", "enc.gamma", ""), ("decoder.final_layer_norm.weight", "dec.gamma", "")]
    for stack, L, ff in (("encoder", hp["L_enc"], 1), ("decoder", hp["L_dec"], 2)):
        s = stack[:3]
        W1, W2 = ("W_mlp1", "W_mlp2") if stack == "encoder" else ("W_mlp3", "W_mlp4")
        for l in range(L):
            b = f"{stack}.block.{l}.layer"
            r += _t5_attn(stack, l, 0, "SelfAttention") + [(f"{b}.0.layer_norm.weight", f"{s}.{l}.gamma1", "")]
            if stack == "decoder":
                r += _t5_attn(stack, l, 1, "EncDecAttention") + [(f"{b}.1.layer_norm.weight", f"{s}.{l}.gamma2", "")]
            d = f"{b}.{ff}.DenseReluDense"
            r += ([(f"{d}.wi_0.weight", f"{s}.{l}.W_gate", ""), (f"{d}.wi_1.weight", f"{s}.{l}.{W1}", "")] if gated
                  else [(f"{d}.wi.weight", f"{s}.{l}.{W1}", "")])
            r += [(f"{d}.wo.weight", f"{s}.{l}.{W2}", ""), (f"{b}.{ff}.layer_norm.weight", f"{s}.{l}.gamma{ff + 1}", "")]
    if head and not hp["tied"]:
        r.append(("lm_head.weight", "W_u", ""))
    return r


def _t5_expected(hp: dict, head: bool) -> dict:
    d, V, m, H, d_kv, N_b = hp["d_e"], hp["n_vocab"], hp["d_mlp"], hp["H"], hp["d_attn"], hp["relative_buckets"]
    shape = {"W_e": (V, d), "W_u": (V, d), "rel_bias": (N_b, H), "gamma": (d,), "gamma1": (d,), "gamma2": (d,),
             "gamma3": (d,), "W_q": (H * d_kv, d), "W_k": (H * d_kv, d), "W_v": (H * d_kv, d), "W_o": (d, H * d_kv),
             "W_gate": (m, d), "W_mlp1": (m, d), "W_mlp3": (m, d), "W_mlp2": (d, m), "W_mlp4": (d, m)}
    return {hf: shape[ft.split(".")[-1]] for hf, ft, _ in _t5_names(hp, head)}


def _t5_to_ft(hp: dict, T: dict, head: bool) -> dict:
    p = {}
    for hf, ft, heads in _t5_names(hp, head):
        v = T[hf]
        p[ft] = v.T if heads == "T" else _split_heads(v, hp[heads]) if heads else v
    return p


def _t5_export(cfg: dict, P: dict):
    """An EDTransformer with T5's options (V11, V18) -> T5ForConditionalGeneration."""
    cfg, rates = _split_rates(cfg)
    for k, v in rates.items():
        if v:
            raise ValueError(f"T5 has no equivalent of {k}={v!r}: it drops inside its MLP and after the final norms "
                             "(set the rates to 0 to export)")
    want = {"pre_norm": True, "norm": "rms", "bias": False, "positional": "relative", "scale_scores": False,
            "fixnorm": False}
    for k, w in want.items():
        if cfg.get(k) != w:
            raise ValueError(f"T5 has no equivalent of {k}={cfg.get(k)!r} (T5ForConditionalGeneration: "
                             + ", ".join(f"{a}={b!r}" for a, b in want.items()) + ")")
    if cfg.get("mlp") not in ("relu", "geglu"):
        raise ValueError(f"T5 has no equivalent of mlp={cfg.get('mlp')!r} ('relu' or 'geglu')")
    if cfg["d_attn"] != cfg["d_mid"]:
        raise ValueError(f"T5 needs d_attn = d_mid (its d_kv), got d_attn={cfg['d_attn']}, d_mid={cfg['d_mid']}")
    bos = cfg["bos_id"] if cfg.get("bos_id") is not None else cfg["n_vocab"] - 2
    eos = cfg["eos_id"] if cfg.get("eos_id") is not None else cfg["n_vocab"] - 1
    hf = {"model_type": "t5", "architectures": ["T5ForConditionalGeneration"], "vocab_size": cfg["n_vocab"],
          "d_model": cfg["d_e"], "d_kv": cfg["d_attn"], "d_ff": cfg["d_mlp"], "num_layers": cfg["L_enc"],
          "num_decoder_layers": cfg["L_dec"], "num_heads": cfg["H"],
          "relative_attention_num_buckets": cfg["relative_buckets"],
          "relative_attention_max_distance": cfg["relative_max_distance"], "dropout_rate": 0.0,
          "layer_norm_epsilon": cfg["eps"], "feed_forward_proj": "gated-gelu" if cfg["mlp"] == "geglu" else "relu",
          "tie_word_embeddings": bool(cfg["unembed_rescale"]), "is_encoder_decoder": True,
          "decoder_start_token_id": int(bos), "pad_token_id": int(bos), "eos_token_id": int(eos),
          "n_positions": cfg["l_max"], "dtype": cfg["dtype"]}
    state = {}
    for hf_name, ft, heads in _t5_names({**cfg, "relative_buckets": cfg["relative_buckets"]}, True):
        v = P[ft]
        state[hf_name] = v.T if heads == "T" else v.reshape(-1, *v.shape[2:]) if heads else v
    return "T5ForConditionalGeneration", hf, state


def _is_llama_style(cfg: dict) -> bool:
    return cfg.get("arch") == "DTransformer" and cfg.get("positional") == "rope"


_RATES = ("embed_dropout", "attn_dropout", "resid_dropout")


def _split_rates(cfg: dict):
    """(the config without the dropout rates, the rates): the exports map the rates themselves."""
    cfg = dict(cfg)
    return cfg, {k: float(cfg.pop(k, 0.0)) for k in _RATES}


def _llama_export(cfg: dict, P: dict):
    cfg, rates = _split_rates(cfg)
    if cfg.get("mask", "causal") != "causal":
        raise ValueError(f"LLaMA and Mistral have no equivalent of mask={cfg['mask']!r} (causal attention only)")
    for k in ("embed_dropout", "resid_dropout"):
        if rates[k]:
            raise ValueError(f"LLaMA has no equivalent of {k}={rates[k]!r}: it drops only its attention weights "
                             "(attention_dropout = attn_dropout)")
    for k, want in (("mlp", "swiglu"), ("bias", False), ("norm", "rms")):
        if cfg.get(k) != want:
            raise ValueError(f"LLaMA has no equivalent of {k}={cfg.get(k)!r} with positional='rope' "
                             f"(LlamaForCausalLM: mlp='swiglu', bias=False, norm='rms')")
    if cfg["d_attn"] != cfg["d_mid"]:
        raise ValueError(f"LLaMA needs d_attn = d_mid (its head_dim), got d_attn={cfg['d_attn']}, d_mid={cfg['d_mid']}")
    hf = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": cfg["n_vocab"],
          "hidden_size": cfg["d_e"], "intermediate_size": cfg["d_mlp"], "num_hidden_layers": cfg["L"],
          "num_attention_heads": cfg["H"], "num_key_value_heads": cfg["H_kv"], "head_dim": cfg["d_attn"],
          "max_position_embeddings": cfg["l_max"], "rms_norm_eps": cfg["eps"], "rope_theta": cfg["rope_theta"],
          "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "attention_dropout": rates["attn_dropout"],
          "tie_word_embeddings": cfg["tied"], "initializer_range": cfg["init_std"],
          "bos_token_id": cfg["n_vocab"] - 2, "eos_token_id": cfg["n_vocab"] - 1, "use_cache": True,
          "dtype": cfg["dtype"]}
    return "LlamaForCausalLM", hf, _llama_from_ft(P, cfg)


# The supported classes: HF class name -> (family, with the LM head, prefix of the body in its state dict)
_CLASSES = {
    "GPT2LMHeadModel": ("gpt2", True, "transformer."),
    "GPT2Model": ("gpt2", False, ""),
    "BertForMaskedLM": ("bert", True, "bert."),
    "BertModel": ("bert", False, ""),
    "BigBirdForMaskedLM": ("big_bird", True, "bert."),
    "BigBirdModel": ("big_bird", False, ""),
    "LlamaForCausalLM": ("llama", True, "model."),
    "MistralForCausalLM": ("mistral", True, "model."),
    "DeepseekV3ForCausalLM": ("deepseek_v3", True, "model."),
    "T5ForConditionalGeneration": ("t5", True, ""),
}
_FAMILY = {  # family -> (hyperparameters, expected tensors, tensors -> ft, ft class)
    "gpt2": (_gpt2_hyper, _gpt2_expected, _gpt2_to_ft, "DTransformer"),
    "bert": (_bert_hyper, _bert_expected, _bert_to_ft, "ETransformer"),
    "big_bird": (_bigbird_hyper, _bert_expected, _bert_to_ft, "ETransformer"),  # BERT's tensors
    "llama": (_llama_hyper, _llama_expected, _llama_to_ft, "DTransformer"),
    "mistral": (_mistral_hyper, _llama_expected, _llama_to_ft, "DTransformer"),
    "deepseek_v3": (_deepseek_hyper, _deepseek_expected, _deepseek_to_ft, "DTransformer"),
    "t5": (_t5_hyper, _t5_expected, _t5_to_ft, "EDTransformer"),
}
_IGNORED = (".attn.bias", ".attn.masked_bias", "embeddings.position_ids", "pooler.dense.weight",
            "pooler.dense.bias", "rotary_emb.inv_freq")  # buffers and BertModel's pooler


def _strip(T: dict, prefix: str, head: bool) -> dict:
    """The body's tensors without the head class's prefix (files and state dicts may hold either form)."""
    if not prefix or not any(k.startswith(prefix) for k in T):
        return dict(T)
    return {(k[len(prefix):] if k.startswith(prefix) else k): v for k, v in T.items()}


def _build(cls_name: str, config: dict, T: dict, dtype, where: str):
    """Check every tensor, then make the ft model and copy them in (nothing is made on a failed check)."""
    family, head, prefix = _CLASSES[cls_name]
    hyper, expected, to_ft, arch = _FAMILY[family]
    T = _strip(T, prefix, head)
    if family == "t5":  # the stacks' embed_tokens are shared's aliases; an lm_head present is W_u (untied)
        T = {k: v for k, v in T.items() if not k.endswith("embed_tokens.weight")}
        config = {**config, "_ft_tied": "lm_head.weight" not in T}
    hp = hyper(config)
    if head and family in ("bert", "big_bird") and hp["tied"] and "cls.predictions.decoder.weight" in T:
        T.pop("cls.predictions.decoder.weight")  # the tied alias of W_eᵀ
    if head and family in ("bert", "big_bird") and "cls.predictions.decoder.bias" in T:
        # the bias the decoder adds (HF ties it to cls.predictions.bias unless the head is untied)
        T["cls.predictions.bias"] = T.pop("cls.predictions.decoder.bias")
    if head and family in ("gpt2", "llama", "mistral", "deepseek_v3") and hp["tied"]:
        T.pop("lm_head.weight", None)
    _check_layer_count(family, hp, T, cls_name, where)
    exp = expected(hp, head)
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
    params = to_ft(hp, T, head)
    model = build_model({"arch": arch, **{k: v for k, v in hp.items() if not k.startswith("_")}}, dtype=dtype)
    for name, value in params.items():
        model.params[name][...] = value
    return model


def _cls_of(hf_model) -> str:
    name = type(hf_model).__name__
    if name not in _CLASSES:
        raise ValueError(f"ft.from_hf supports {', '.join([*_CLASSES, 'ViTForImageClassification'])}; got {name}")
    return name


def from_hf(hf_model, *, dtype=None, bigbird_lengths=()):
    """The ft model computing the same function as a `transformers` model: GPT2LMHeadModel / GPT2Model ->
    DTransformer (tied unless the config unties it), BertForMaskedLM / BertModel -> ETransformer (with
    n_segments, embed_norm, unembed_bias), LlamaForCausalLM -> DTransformer(positional="rope", H_kv,
    mlp="swiglu", bias=False, norm="rms"), MistralForCausalLM -> the same with sliding_window (V8),
    ViTForImageClassification -> ViT (listing V14). dtype: float32 / float64 (default: the HF model's, float64 if
    its weights are float64). ValueError naming an unsupported configuration option.
    BigBirdModel / BigBirdForMaskedLM -> ETransformer as BERT, with attention="bigbird" (V17: w = 3, g = 1,
    r = num_random_blocks) when HF's attention_type is "block_sparse", and HF's own layouts (one per layer and
    head) installed for each length of bigbird_lengths (model.set_bigbird_layouts; other lengths draw from
    layout_seed), in the mode hf_model is in: training mode's random draw, or eval mode's (every random block is
    block 0, so block 0 is gathered 1 + r times). A block HF gathers m times weighs m·exp(s) in the softmax (a
    multiset layout, docs/variants.md V17b), as in HF: the ft model computes what HF computes in that mode with
    every dropout 0."""
    if type(hf_model).__name__ == "ViTForImageClassification":
        return _vit_from_hf(hf_model, dtype)
    name = _cls_of(hf_model)
    config = hf_model.config.to_dict()
    sd = hf_model.state_dict()
    if name == "T5ForConditionalGeneration" and hf_model.lm_head.weight is hf_model.shared.weight:
        sd.pop("lm_head.weight", None)  # tied (transformers 5 ties them always unless untied by hand)
    T = {}
    for k, v in sd.items():
        v = v.detach().cpu()
        if v.is_floating_point() and v.dtype not in (_torch_dtype("float32"), _torch_dtype("float64")):
            v = v.float()
        T[k] = v.numpy()
    if name.startswith("BigBird"):  # the attention HF runs now (it falls back to original_full for short inputs)
        config["attention_type"] = getattr(getattr(hf_model, "bert", hf_model), "attention_type", config.get("attention_type"))
    lengths = [bigbird_lengths] if isinstance(bigbird_lengths, (int, np.integer)) else list(bigbird_lengths)
    if lengths and not (name.startswith("BigBird") and config.get("attention_type") == "block_sparse"):
        raise ValueError(f"bigbird_lengths: {name} is not a BigBird with attention_type='block_sparse'")
    layouts = [_bigbird_hf_layouts(hf_model, l) for l in lengths]  # every one checked before a model is made
    model = _build(name, config, T, dtype, name)
    for lay in layouts:
        model.set_bigbird_layouts(lay)
    return model


def _torch_dtype(name):
    import torch

    return getattr(torch, name)


# ---------------------------------------------------------------------------------------------------
# ft -> HF: configuration and state of the matching class

def _check_exportable(cfg: dict, target: str) -> None:
    _check_options(cfg, target)
    if cfg.get("positional") != "learned":
        raise ValueError(f"{target} has no equivalent of positional={cfg.get('positional')!r} (learned positions only)")
    if cfg["d_attn"] * cfg["H"] != cfg["d_e"] or cfg["d_mid"] * cfg["H"] != cfg["d_e"]:
        raise ValueError(f"{target} needs d_attn = d_mid = d_e / H, got d_attn={cfg['d_attn']}, d_mid={cfg['d_mid']}")


def _check_model(model, fn: str) -> None:
    """to_hf / save_hf take an ft model (TypeError otherwise, as to_torch); EDTransformer is a model without a
    transformers class (ValueError in _hf_export, pointing to to_torch)."""
    if not isinstance(model, (_core.DTransformer, _core.ETransformer, _core.EDTransformer)):
        raise TypeError(f"ft.{fn} takes a DTransformer or ETransformer, got {type(model).__name__}")


def _hf_export(model):
    """(HF class name, config.json dict, state dict of numpy arrays with the class's names)."""
    cfg = model.config
    arch = cfg["arch"]
    if cfg.get("mtp_depth"):  # V16: no class here takes the modules (docs/variants.md V16)
        raise ValueError(f"mtp_depth = {cfg['mtp_depth']}: the multi-token-prediction modules have no place in the exported "
                         "Hugging Face model (they would be lost); export a model with mtp_depth=0")
    P = {k: np.asarray(v) for k, v in model.params.items()}
    if cfg.get("kv_lora_rank"):
        return _deepseek_export(cfg, P)
    if arch == "EDTransformer" and (cfg.get("pre_norm") or cfg.get("positional") == "relative"):  # T5 or nothing
        return _t5_export(cfg, P)
    if _is_llama_style(cfg):
        return _mistral_export(cfg, P) if cfg.get("sliding_window") else _llama_export(cfg, P)
    cfg, rates = _split_rates(cfg)  # dropout: GPT-2's and BERT's places are ours (docs/regularisation.md)
    if arch == "DTransformer":
        _check_exportable(cfg, "GPT-2")
        if cfg["norm"] != "layer":
            raise ValueError(f"GPT-2 has no equivalent of norm={cfg['norm']!r} (layer_norm only)")
        hf = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": cfg["n_vocab"],
              "n_positions": cfg["l_max"], "n_embd": cfg["d_e"], "n_layer": cfg["L"], "n_head": cfg["H"],
              "n_inner": cfg["d_mlp"], "activation_function": _HF_OF_GELU[cfg["gelu"]],
              "layer_norm_epsilon": cfg["eps"], "resid_pdrop": rates["resid_dropout"],
              "embd_pdrop": rates["embed_dropout"], "attn_pdrop": rates["attn_dropout"],
              "summary_first_dropout": 0.0, "scale_attn_weights": True, "tie_word_embeddings": cfg["tied"],
              "initializer_range": cfg["init_std"], "bos_token_id": cfg["n_vocab"] - 2,
              "eos_token_id": cfg["n_vocab"] - 1, "use_cache": True, "dtype": cfg["dtype"]}
        return "GPT2LMHeadModel", hf, _gpt2_from_ft(P, cfg)
    if arch == "ETransformer":
        _check_exportable(cfg, "BERT")
        if not cfg.get("embed_norm"):
            raise ValueError("BERT has no equivalent of embed_norm=False: it always normalises its embeddings")
        if cfg["d_f"] != cfg["d_e"]:
            raise ValueError(f"BERT needs d_f = d_e (its head's dense layer is d_e × d_e), got d_f={cfg['d_f']}")
        if rates["embed_dropout"] != rates["resid_dropout"]:
            raise ValueError("BERT has one hidden_dropout_prob for its embeddings and its sublayer outputs: "
                             f"embed_dropout={rates['embed_dropout']!r} and resid_dropout={rates['resid_dropout']!r} differ")
        hf = {"model_type": "bert", "architectures": ["BertForMaskedLM"], "vocab_size": cfg["n_vocab"],
              "hidden_size": cfg["d_e"], "num_hidden_layers": cfg["L"], "num_attention_heads": cfg["H"],
              "intermediate_size": cfg["d_mlp"], "hidden_act": _HF_OF_GELU[cfg["gelu"]],
              "hidden_dropout_prob": rates["resid_dropout"], "attention_probs_dropout_prob": rates["attn_dropout"],
              "max_position_embeddings": cfg["l_max"], "type_vocab_size": max(cfg.get("n_segments", 0), 1),
              "layer_norm_eps": cfg["eps"], "pad_token_id": None, "position_embedding_type": "absolute",
              "tie_word_embeddings": cfg["tied"], "initializer_range": cfg["init_std"], "dtype": cfg["dtype"]}
        return "BertForMaskedLM", hf, _bert_from_ft(P, cfg)
    raise ValueError(f"{arch} has no transformers class: use ft.to_torch (torch.nn.Transformer layers) instead")


def to_hf(model):
    """The `transformers` model with the same function: DTransformer -> GPT2LMHeadModel (LlamaForCausalLM when
    positional="rope", with mlp="swiglu", bias=False, norm="rms"), ETransformer (with embed_norm, d_f = d_e)
    -> BertForMaskedLM, ViT -> ViTForImageClassification; in the model's dtype, eval mode, the dropout rates mapped (GPT-2: embd_pdrop,
    attn_pdrop, resid_pdrop; BERT: hidden_dropout_prob = embed_dropout = resid_dropout,
    attention_probs_dropout_prob; LLaMA: attention_dropout) — from_hf maps them back.
    ValueError for options the class cannot express (RMSnorm, sinusoidal positions, d_attn ≠ d_e/H, …)."""
    if isinstance(model, _core.ViT):
        return vit_to_hf(model)
    _check_model(model, "to_hf")
    return _hf_model(*_hf_export(model))


def _hf_model(cls_name: str, hf_cfg: dict, state: dict):
    """The transformers model of an export (_hf_export's triple), in eval mode."""
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
    if cls_name == "T5ForConditionalGeneration" and "lm_head.weight" in state:  # untied: its own W_u
        hf.lm_head.weight = torch.nn.Parameter(hf.lm_head.weight.detach().clone())
    _load_state(hf, state)
    return hf.eval()


def _load_state(hf, state: dict) -> None:
    import torch

    own = hf.state_dict()
    with torch.no_grad():
        for k, v in state.items():
            if k not in own:
                raise ValueError(f"internal: {type(hf).__name__} has no tensor {k}")
            own[k].copy_(torch.from_numpy(np.ascontiguousarray(v)))


def save_hf(model, path: Union[str, os.PathLike]) -> None:
    """Write `path`/config.json and `path`/model.safetensors (tied tensors once, metadata format "pt") such
    that transformers.AutoModelForCausalLM / AutoModelForMaskedLM.from_pretrained(path) loads the matching
    class with equal outputs. Needs safetensors only (no transformers, no torch).

    Both files are first written completely to unique temporaries in `path` (so concurrent saves never share
    one); then model.safetensors is renamed into place and config.json last (config.json is what makes a
    folder a model: a new folder interrupted between the two renames has no config.json and load_hf says
    so). A failure while writing leaves the old pair untouched; if the config's rename fails after the
    weights', the old weights are put back — the folder holds the old pair or the new pair."""
    _check_model(model, "save_hf")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    cls_name, hf_cfg, state = _hf_export(model)
    from safetensors.numpy import save_file

    from .io import _remove_quietly, _temp_beside

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


def load_hf(path: Union[str, os.PathLike], *, dtype=None):
    """Read a Hugging Face model directory (config.json + model.safetensors: written by save_hf or by
    transformers' save_pretrained, e.g. a downloaded GPT-2, BERT or all-MiniLM-L6-v2) with safetensors
    alone. The class comes from config.json's "architectures" (or its model_type and whether the file
    holds an LM head). ValueError naming a missing or mismatched tensor; nothing is half-loaded."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
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
    if names:
        cls_name = names[0]
    else:
        mt = config.get("model_type")
        if mt == "gpt2":
            cls_name = "GPT2LMHeadModel" if "lm_head.weight" in T or any(k.startswith("transformer.") for k in T) \
                else "GPT2Model"
        elif mt == "bert":
            cls_name = "BertForMaskedLM" if any(k.startswith("cls.predictions.") for k in T) else "BertModel"
        elif mt == "llama":
            cls_name = "LlamaForCausalLM"
        elif mt == "mistral":
            cls_name = "MistralForCausalLM"
        elif mt == "t5" and not class_names:  # (T5Model, T5EncoderModel, …: another class, not supported)
            cls_name = "T5ForConditionalGeneration"
        else:
            raise ValueError(f"{cfg_file}: model_type {_shown(mt)} / architectures {_shown(class_names)} "
                             f"is not supported (supported: {', '.join(_CLASSES)})")
    if cls_name.startswith("BigBird") and config.get("attention_type", "block_sparse") == "block_sparse":
        raise ValueError(f"{cfg_file}: a block_sparse BigBird draws its random layouts with its own code: load it with "
                         f"transformers and use ft.from_hf(model, bigbird_lengths=[…]) (docs/variants.md V17)")
    return _build(cls_name, config, T, dtype, path)


# ---------------------------------------------------------------------------------------------------
# Plain PyTorch (formal_transformers/_torch.py holds the modules)

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


# ---------------------------------------------------------------------------------------------------
# ViTForImageClassification <-> ViT (listing V14, docs/variants.md)

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
    _load_state(hf, state)
    return hf.eval()
