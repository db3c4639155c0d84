"""BART (BartForConditionalGeneration / BartModel, Lewis et al. 2020) <-> EDTransformer: Algorithm 8 (post-LN
encoder-decoder) with docs/variants.md's V22 options — embed_norm (each stack's layernorm_embedding after its
embedding sum), separate_positions (the decoder's own learned W_p), scale_embedding (√d_e, where the config says so),
mlp="gelu" (BART's MLP; "relu" with activation_function="relu", Algorithm 8 as printed), unembed_bias (the
final_logits_bias), bos_id / eos_id / forced_bos_id / forced_eos (the generation config Algorithm 15 follows):

    shared = W_eᵀ; encoder.embed_positions = [two unused rows; W_pᵀ] (BART reads row t + 2 for position t);
    encoder.layernorm_embedding = enc.γ_e, enc.β_e; encoder.layers.l.self_attn.{q,k,v}_proj = W_q, W_k, W_v
    (H blocks of d_e/H rows) and biases, out_proj = W_o, b_o; self_attn_layer_norm = γ_l¹, β_l¹ (line 6); fc1, fc2 =
    W_mlp1, b_mlp1, W_mlp2, b_mlp2 (line 7); final_layer_norm = γ_l², β_l² (line 8); decoder.embed_positions =
    [two rows; dec.W_pᵀ]; decoder.layernorm_embedding = dec.γ_e, dec.β_e; decoder.layers.l.self_attn = attn
    (line 14), self_attn_layer_norm = γ³, β³; encoder_attn = cross_attn (line 16), encoder_attn_layer_norm = γ⁴, β⁴;
    fc1, fc2 = W_mlp3, b_mlp3, W_mlp4, b_mlp4 (line 18); final_layer_norm = γ⁵, β⁵; lm_head = W_u (tied: W_eᵀ);
    final_logits_bias = b_uᵀ.
BartModel has no head: tied, and b_u absent (unembed_bias=False). With tie_word_embeddings = false transformers 5
unties the stacks' embed_tokens from shared as well: a file's copies equal to shared are read as its aliases (one
that differs has no place in ft, whose stacks share W_e, and is refused by name), and to_hf writes them. The two rows of each position table that no
position reads are dropped by from_hf and written as zeros by to_hf (the same function). BART drops after each
stack's embedding norm and after each sublayer (dropout: embed_dropout = resid_dropout), on the attention weights
(attention_dropout = attn_dropout), inside its MLP (activation_dropout) and whole layers (layerdrop): the last two
have no site in ft (training only, the function is the same) and are not read; to_hf writes them 0. Its layer norms
have eps 1e-5 (nn.LayerNorm's default): eps must be 1e-5 to export. HF's embedding has padding_idx = pad_token_id,
which keeps that row of W_e out of HF's gradient; ft has no padding token (to_hf writes pad_token_id = None).
Old configs' fairseq keys (normalize_before, add_final_layer_norm, add_bias_logits, static_position_embeddings,
normalize_embedding) are read and refused by name at any value other than BART's."""
from __future__ import annotations

import os

import numpy as np

from ._common import (_cfg_bool, _cfg_float, _cfg_get, _cfg_int, _cfg_rate, _drop_stack_embeddings,
                      _export_all_kv_heads, _export_heads_split_d_e, _export_requires, _read_config_json, _split_rates,
                      _unsupported, _width_and_heads)
from ._registry import Converter, build, check_layer_count, encoder_takes_tokens, export, hf_model, register, state_arrays

OFFSET = 2  # BartLearnedPositionalEmbedding's rows before position 0
_ATTN = (("q_proj", "W_q", "b_q"), ("k_proj", "W_k", "b_k"), ("v_proj", "W_v", "b_v"))
# fairseq's keys of old BART configs: the value that is BART (transformers ignores them; a different value is
# another model). mBART's: pre-norm layers and a final layer_norm per stack.
_FAIRSEQ = {"normalize_before": (False, "pre-norm layers (mBART's; BART's are post-LN)"),
            "add_final_layer_norm": (False, "a final layer_norm after each stack (mBART's; BART has none)"),
            "add_bias_logits": (False, "a bias in the LM head's linear layer"),
            "static_position_embeddings": (False, "sinusoidal positions"),
            "normalize_embedding": (True, "BART normalises its embeddings (layernorm_embedding)")}
_FAIRSEQ_MBART = {**_FAIRSEQ, "normalize_before": (True, "mBART's layers are pre-norm"),
                  "add_final_layer_norm": (True, "mBART ends each stack with a layer_norm")}
_MLP_OF_ACT = {"gelu": "gelu", "relu": "relu"}


def _attn_rows(hf: str, ft: str) -> list:
    r = []
    for proj, W, b in _ATTN:
        r += [(f"{hf}.{proj}.weight", f"{ft}.{W}", "H"), (f"{hf}.{proj}.bias", f"{ft}.{b}", "H")]
    return r + [(f"{hf}.out_proj.weight", f"{ft}.W_o", ""), (f"{hf}.out_proj.bias", f"{ft}.b_o", "")]


def _pair(hf: str, ft_gamma: str, ft_beta: str) -> list:
    return [(f"{hf}.weight", ft_gamma, ""), (f"{hf}.bias", ft_beta, "")]


def tensor_table(hp: dict, head: bool) -> list:
    """(HF name in the body, ft name, how: "T" transposed, "P" a position table (offset rows, transposed), "H" split
    into heads, "" as is; "B" the final_logits_bias row) of every tensor of a BART."""
    r = [("shared.weight", "W_e", "T"), ("encoder.embed_positions.weight", "W_p", "P"),
         ("decoder.embed_positions.weight", "dec.W_p", "P")]
    r += _pair("encoder.layernorm_embedding", "enc.gamma_e", "enc.beta_e")
    r += _pair("decoder.layernorm_embedding", "dec.gamma_e", "dec.beta_e")
    pre = hp.get("block") == "pre_ln"  # mBART: pre-norm layers (V18a's, with β) and each stack's final norm
    if pre:
        r += _pair("encoder.layer_norm", "enc.gamma", "enc.beta") + _pair("decoder.layer_norm", "dec.gamma", "dec.beta")
    g_self, g_cross, g_mlp = (1, 2, 3) if pre else (3, 4, 5)  # the decoder layer's norms: V18a's or lines 15, 17, 19
    for l in range(hp["L_enc"]):
        h, f = f"encoder.layers.{l}", f"enc.{l}"
        r += _attn_rows(h + ".self_attn", f + ".attn") + _pair(h + ".self_attn_layer_norm", f + ".gamma1", f + ".beta1")
        r += [(h + ".fc1.weight", f + ".W_mlp1", ""), (h + ".fc1.bias", f + ".b_mlp1", ""),
              (h + ".fc2.weight", f + ".W_mlp2", ""), (h + ".fc2.bias", f + ".b_mlp2", "")]
        r += _pair(h + ".final_layer_norm", f + ".gamma2", f + ".beta2")
    for l in range(hp["L_dec"]):
        h, f = f"decoder.layers.{l}", f"dec.{l}"
        r += _attn_rows(h + ".self_attn", f + ".attn")
        r += _pair(h + ".self_attn_layer_norm", f"{f}.gamma{g_self}", f"{f}.beta{g_self}")
        r += _attn_rows(h + ".encoder_attn", f + ".cross_attn")
        r += _pair(h + ".encoder_attn_layer_norm", f"{f}.gamma{g_cross}", f"{f}.beta{g_cross}")
        r += [(h + ".fc1.weight", f + ".W_mlp3", ""), (h + ".fc1.bias", f + ".b_mlp3", ""),
              (h + ".fc2.weight", f + ".W_mlp4", ""), (h + ".fc2.bias", f + ".b_mlp4", "")]
        r += _pair(h + ".final_layer_norm", f"{f}.gamma{g_mlp}", f"{f}.beta{g_mlp}")
    if head:
        r.append(("final_logits_bias", "b_u", "B"))
        if not hp["tied"]:
            r.append(("lm_head.weight", "W_u", ""))
    return r


def is_bart(cfg: dict) -> bool:
    """An EDTransformer with one of BART's options on (exports as BART, or as mBART with block="pre_ln")."""
    return (cfg.get("arch") == "EDTransformer"
            and bool(cfg.get("separate_positions") or cfg.get("embed_norm") or cfg.get("scale_embedding")
                     or cfg.get("mlp") == "gelu"))


_GENERATION = ("decoder_start_token_id", "eos_token_id", "forced_bos_token_id", "forced_eos_token_id")


def _with_generation(config: dict, gen) -> dict:
    """config with the generation config's ids (an object or a dict; None: config as it is). Its forced ids replace
    config's (None too: not forced); its start and eos ids where it gives them."""
    if gen is None:
        return config
    get = gen.get if isinstance(gen, dict) else (lambda k, d=None: getattr(gen, k, d))
    c = dict(config)
    for k in _GENERATION:
        v = get(k, None)
        if v is not None or k.startswith("forced"):
            c[k] = v
    return c


def _id(c: dict, m: str, key: str, default, none_ok: bool = True):
    v = c.get(key, default)
    if v is None and none_ok:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise _unsupported(m, key, v, "one token id")
    return int(v)


@register
class BART(Converter):
    name = "BART"
    arch = "EDTransformer"
    classes = {"BartForConditionalGeneration": (True, "model."), "BartModel": (False, "")}
    model_type = "bart"
    cls = "BartForConditionalGeneration"  # the class export writes
    embedding = "shared.weight"
    block = "post_ln"  # mBART: "pre_ln"
    fairseq = _FAIRSEQ
    maps = frozenset({"n_vocab", "l_max", "L_enc", "L_dec", "H", "d_e", "d_mlp", "d_attn", "d_mid", "norm", "block",
                      "bias", "positional", "scale_scores", "mlp", "eps", "bos_id", "eos_id", "forced_bos_id",
                      "forced_eos", "tied", "H_kv", "seed", "init_std", "attention_impl", "fixnorm", "embed_norm",
                      "unembed_bias", "scale_embedding", "separate_positions", "embed_dropout", "attn_dropout",
                      "resid_dropout"})

    def hyper(self, c):
        m = self.name
        _require_value = self._require_value
        _require_value(c, "is_encoder_decoder", True, "BART is an encoder-decoder (Algorithm 8)")
        _require_value(c, "is_decoder", False, "the configuration of a whole BART has is_decoder=False")
        for key, (want, what) in self.fairseq.items():
            _require_value(c, key, want, what)
        d, H = _width_and_heads(c, m, "d_model", "encoder_attention_heads")
        if _cfg_int(c, m, "decoder_attention_heads", H) != H:
            raise _unsupported(m, "decoder_attention_heads", c["decoder_attention_heads"],
                               f"ft's EDTransformer has one H for both stacks (encoder_attention_heads = {H})")
        d_mlp = _cfg_int(c, m, "encoder_ffn_dim")
        if _cfg_int(c, m, "decoder_ffn_dim", d_mlp) != d_mlp:
            raise _unsupported(m, "decoder_ffn_dim", c["decoder_ffn_dim"],
                               f"ft's EDTransformer has one d_mlp for both stacks (encoder_ffn_dim = {d_mlp})")
        act = _cfg_get(c, m, "activation_function", "gelu")
        if not isinstance(act, str) or act not in _MLP_OF_ACT:
            raise _unsupported(m, "activation_function", act, "BART's 'gelu' (mlp='gelu') or 'relu' (Algorithm 8's MLP)")
        eos = _id(c, m, "eos_token_id", 2, none_ok=False)
        start = _id(c, m, "decoder_start_token_id", None)
        if start is None:  # generate starts from bos_token_id then (mBART's config leaves the start to it)
            start = _id(c, m, "bos_token_id", 0, none_ok=False)
        forced_bos = _id(c, m, "forced_bos_token_id", None)
        forced_eos = _id(c, m, "forced_eos_token_id", None)
        if forced_eos is not None and forced_eos != eos:
            raise _unsupported(m, "forced_eos_token_id", forced_eos,
                               f"Algorithm 15 ends a capped decoding with its eos_token (eos_token_id = {eos})")
        rate = _cfg_rate(c, m, "dropout", 0.1)
        return dict(n_vocab=_cfg_int(c, m, "vocab_size"), l_max=_cfg_int(c, m, "max_position_embeddings"),
                    L_enc=_cfg_int(c, m, "encoder_layers"), L_dec=_cfg_int(c, m, "decoder_layers"), H=H, d_e=d,
                    d_mlp=d_mlp, mlp=_MLP_OF_ACT[act], eps=1e-5, embed_norm=True, separate_positions=True,
                    block=self.block,
                    scale_embedding=_cfg_bool(c, m, "scale_embedding", False), unembed_bias=True,
                    bos_id=start, eos_id=eos, forced_bos_id=forced_bos, forced_eos=forced_eos is not None,
                    tied=_cfg_bool(c, m, "tie_word_embeddings", True),
                    init_std=_cfg_float(c, m, "init_std", 0.02, lo_open=True),
                    embed_dropout=rate, resid_dropout=rate, attn_dropout=_cfg_rate(c, m, "attention_dropout", 0.0))

    def from_model(self, hf_model, cls_name, dtype, **kw):
        """from_hf: the config with the generation config's start, stop and forced ids (transformers 5 keeps
        forced_bos_token_id there only; generate follows it)."""
        if kw.get("bigbird_lengths"):
            raise ValueError(f"bigbird_lengths: {cls_name} is not a BigBird with attention_type='block_sparse'")
        return build(cls_name, _with_generation(hf_model.config.to_dict(), getattr(hf_model, "generation_config", None)),
                     state_arrays(hf_model), dtype, cls_name)

    def file_config(self, config, path):
        """load_hf: config.json with generation_config.json's ids when the directory has one (save_pretrained's)."""
        g = os.path.join(path, "generation_config.json")
        return _with_generation(config, _read_config_json(g)) if os.path.isfile(g) else config

    def _require_value(self, c, key, want, why):
        if key in c and c[key] is not None and c[key] != want:
            raise _unsupported(self.name, key, c[key], why)

    def prepare(self, hp, T, head):
        T = super().prepare(hp, T, head)
        if not head:
            hp["unembed_bias"] = False
            hp["tied"] = True  # BartModel has no head: the unembedding is W_eᵀ
        _drop_stack_embeddings(T, "BART", self.embedding)
        return T

    def check_layers(self, hp, T, where, cls_name):
        check_layer_count(hp["L_enc"], ("encoder.layers.", "encoder_layers"), T, where, cls_name)
        check_layer_count(hp["L_dec"], ("decoder.layers.", "decoder_layers"), T, where, cls_name)

    def expected(self, hp, head):
        d, V, m = hp["d_e"], hp["n_vocab"], hp["d_mlp"]
        shape = {"W_e": (V, d), "W_p": (hp["l_max"] + OFFSET, d), "W_u": (V, d), "b_u": (1, V), "W_mlp1": (m, d),
                 "W_mlp3": (m, d), "b_mlp1": (m,), "b_mlp3": (m,), "W_mlp2": (d, m), "W_mlp4": (d, m),
                 "W_q": (d, d), "W_k": (d, d), "W_v": (d, d), "W_o": (d, d)}
        return {hf: shape.get(ft.split(".")[-1], (d,)) for hf, ft, _ in tensor_table(hp, head)}

    def to_ft(self, hp, T, head):
        out = {}
        for hf, ft, how in tensor_table(hp, head):
            v = T[hf]
            if how == "T":
                v = v.T
            elif how == "P":
                v = v[OFFSET:].T
            elif how == "B":
                v = v.reshape(-1)
            elif how == "H":
                v = v.reshape(hp["H"], v.shape[0] // hp["H"], *v.shape[1:])
            out[ft] = v
        return out

    def takes(self, model, cfg):
        return (is_bart(cfg) and (cfg.get("block") == "pre_ln") == (self.block == "pre_ln")
                and encoder_takes_tokens(model))  # (not Whisper's log-mel features)

    def export(self, cfg, P):
        """An EDTransformer with BART's options (V22) -> BartForConditionalGeneration."""
        cfg, rates = _split_rates(cfg)
        _export_requires(self.name, cfg, dict(embed_norm=True, separate_positions=True, block=self.block, norm="layer",
                                              bias=True, positional="learned", scale_scores=True, fixnorm=False), self.cls)
        if cfg.get("mlp") not in _MLP_OF_ACT.values():
            raise ValueError(f"BART has no equivalent of mlp={cfg.get('mlp')!r} ('gelu' or 'relu')")
        _export_all_kv_heads("BART", cfg)
        _export_heads_split_d_e("BART", cfg)
        if cfg["eps"] != 1e-5:
            raise ValueError(f"BART has no equivalent of eps={cfg['eps']!r}: its layer norms use 1e-5")
        if rates["embed_dropout"] != rates["resid_dropout"]:
            raise ValueError("BART has one dropout for its embeddings and its sublayer outputs: "
                             f"embed_dropout={rates['embed_dropout']!r} and resid_dropout={rates['resid_dropout']!r} differ")
        bos = cfg["bos_id"] if cfg.get("bos_id") is not None else cfg["n_vocab"] - 2
        eos = cfg["eos_id"] if cfg.get("eos_id") is not None else cfg["n_vocab"] - 1
        hf = {"model_type": self.model_type, "architectures": [self.cls], "vocab_size": cfg["n_vocab"],
              "max_position_embeddings": cfg["l_max"], "encoder_layers": cfg["L_enc"], "decoder_layers": cfg["L_dec"],
              "encoder_attention_heads": cfg["H"], "decoder_attention_heads": cfg["H"], "d_model": cfg["d_e"],
              "encoder_ffn_dim": cfg["d_mlp"], "decoder_ffn_dim": cfg["d_mlp"], "activation_function": cfg["mlp"],
              "dropout": rates["resid_dropout"], "attention_dropout": rates["attn_dropout"], "activation_dropout": 0.0,
              "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0, "scale_embedding": bool(cfg["scale_embedding"]),
              "init_std": cfg["init_std"], "tie_word_embeddings": bool(cfg["tied"]), "is_encoder_decoder": True,
              "decoder_start_token_id": int(bos), "eos_token_id": int(eos), "pad_token_id": None,
              "bos_token_id": cfg.get("forced_bos_id"), "forced_bos_token_id": cfg.get("forced_bos_id"),
              "forced_eos_token_id": int(eos) if cfg.get("forced_eos") else None, "dtype": cfg["dtype"]}
        P = dict(P)
        dt = P["W_e"].dtype
        if not cfg.get("unembed_bias"):
            P["b_u"] = np.zeros((cfg["n_vocab"],), dtype=dt)  # no b_u: a zero final_logits_bias (the same function)
        hp = dict(cfg, unembed_bias=True)
        state = {}
        for name, ft, how in tensor_table(hp, True):
            v = P[ft]
            if how == "T":
                v = v.T
            elif how == "P":
                v = np.concatenate([np.zeros((OFFSET, v.shape[0]), dtype=dt), v.T])
            elif how == "B":
                v = v.reshape(1, -1)
            elif how == "H":
                v = v.reshape(-1, *v.shape[2:])
            state[name if name in ("final_logits_bias", "lm_head.weight") else "model." + name] = v
        if not cfg["tied"]:  # transformers 5 unties every stack's embed_tokens from shared too: they hold W_eᵀ
            for k in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"):
                state[k] = state["model.shared.weight"]
        return self.cls, hf, state

    def to_hf(self, model, hf_class=None):
        """The exported model with Algorithm 15's ids in its generation config too (transformers 5 reads
        forced_bos_token_id from there only)."""
        cls_name, hf_cfg, state = export(model, hf_class)
        hf = hf_model(cls_name, hf_cfg, state)
        for k in _GENERATION:
            setattr(hf.generation_config, k, hf_cfg[k])
        return hf

    def prepare_hf(self, hf, state):
        if "lm_head.weight" in state:  # untied: its own W_u
            import torch

            hf.lm_head.weight = torch.nn.Parameter(hf.lm_head.weight.detach().clone())


@register
class MBART(BART):
    """mBART (MBartForConditionalGeneration / MBartModel, Liu et al. 2020): BART's parts with pre-norm layers — one
    option, block="pre_ln" (V18a's layers with LayerNorm's β, each stack's final norm = encoder/decoder.layer_norm ->
    enc.γ, enc.β, dec.γ, dec.β; the decoder layer's self_attn_layer_norm, encoder_attn_layer_norm, final_layer_norm ->
    γ¹, γ², γ³). Every other tensor and key as BART's."""
    name = "mBART"
    classes = {"MBartForConditionalGeneration": (True, "model."), "MBartModel": (False, "")}
    model_type = "mbart"
    cls = "MBartForConditionalGeneration"
    block = "pre_ln"
    fairseq = _FAIRSEQ_MBART
