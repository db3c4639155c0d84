"""KV-cache bytes per token (not a test, no weights): each family's published shape, read by its converter.

The values below are those of the models' config.json files as published on the Hugging Face Hub (written here:
nothing is downloaded). Each config goes through its family's converter (formal_transformers.hf: the same mapping
from_hf and load_hf use, refusing what ft cannot express), and ft.kv_cache_bytes_per_token reads the resulting
DTransformer options: L · H_kv · (d_attn + d_mid) numbers per token (K and V of every layer), times the dtype's size
(ft runs float32 or float64; half precision, as the models ship, is half the float32 figure). An encoder
(RoBERTa) decodes nothing and keeps no cache. A sliding window (V8) bounds the cache at w tokens.

    FT_CORE_PATH=build/dev PYTHONPATH=python python bench/kv_cache_bytes.py

Another family is one row of FAMILIES: (label, HF class name, its published config)."""
from __future__ import annotations

import types

import formal_transformers as ft
from formal_transformers.hf import _registry

FAMILIES = [
    ("Qwen2-0.5B", "Qwen2ForCausalLM",
     dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
          num_key_value_heads=2, max_position_embeddings=131072, rope_theta=1000000.0, rms_norm_eps=1e-6,
          use_sliding_window=False, sliding_window=131072, max_window_layers=24, tie_word_embeddings=True,
          hidden_act="silu")),
    ("Qwen2-7B", "Qwen2ForCausalLM",
     dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
          num_key_value_heads=4, max_position_embeddings=131072, rope_theta=1000000.0, rms_norm_eps=1e-6,
          use_sliding_window=False, sliding_window=131072, max_window_layers=28, tie_word_embeddings=False,
          hidden_act="silu")),
    ("Phi-3-mini-4k-instruct", "Phi3ForCausalLM",
     dict(vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32, num_attention_heads=32,
          num_key_value_heads=32, max_position_embeddings=4096, original_max_position_embeddings=4096,
          rope_theta=10000.0, rope_scaling=None, rms_norm_eps=1e-5, sliding_window=2047, tie_word_embeddings=False,
          hidden_act="silu", resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0)),
    ("OPT-125m", "OPTForCausalLM",
     dict(vocab_size=50272, hidden_size=768, word_embed_proj_dim=768, ffn_dim=3072, num_hidden_layers=12,
          num_attention_heads=12, max_position_embeddings=2048, do_layer_norm_before=True, activation_function="relu",
          dropout=0.1, attention_dropout=0.0, layerdrop=0.0)),
    ("OPT-6.7b", "OPTForCausalLM",
     dict(vocab_size=50272, hidden_size=4096, word_embed_proj_dim=4096, ffn_dim=16384, num_hidden_layers=32,
          num_attention_heads=32, max_position_embeddings=2048, do_layer_norm_before=True, activation_function="relu",
          dropout=0.1, attention_dropout=0.0, layerdrop=0.0)),
    ("Pythia-160m", "GPTNeoXForCausalLM",
     dict(vocab_size=50304, hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
          max_position_embeddings=2048, rotary_pct=0.25, rotary_emb_base=10000, use_parallel_residual=True,
          layer_norm_eps=1e-5, hidden_act="gelu", tie_word_embeddings=False, attention_bias=True)),
    ("Pythia-1b", "GPTNeoXForCausalLM",
     dict(vocab_size=50304, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=8,
          max_position_embeddings=2048, rotary_pct=0.25, rotary_emb_base=10000, use_parallel_residual=True,
          layer_norm_eps=1e-5, hidden_act="gelu", tie_word_embeddings=False, attention_bias=True)),
    ("RoBERTa-base", "RobertaForMaskedLM",
     dict(vocab_size=50265, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
          max_position_embeddings=514, type_vocab_size=1, pad_token_id=1, hidden_act="gelu", layer_norm_eps=1e-5)),
]


def options(cls_name: str, config: dict) -> dict:
    """The ft model options the family's converter makes of an HF config (d_attn, d_mid, H_kv filled as the
    core's resolve fills them)."""
    conv = _registry._CLASSES[cls_name]
    hp = {k: v for k, v in conv.hyper(dict(config)).items() if not k.startswith("_")}
    hp = {"arch": conv.arch, "dtype": "float32", **hp}
    hp.setdefault("d_attn", hp["d_e"] // hp["H"])
    hp.setdefault("d_mid", hp["d_attn"])
    hp.setdefault("H_kv", hp["H"])
    return hp


def main():
    print(f"{'model':<24} {'class':<20} {'L':>3} {'H_kv':>4} {'d_head':>6} {'numbers/token':>13} "
          f"{'float32 KiB':>11} {'half KiB':>8}  note")
    for label, cls_name, config in FAMILIES:
        o = options(cls_name, config)
        if o["arch"] != "DTransformer":
            print(f"{label:<24} {cls_name:<20} {o['L']:>3} {'':>4} {'':>6} {'—':>13} {'—':>11} {'—':>8}  "
                  "an encoder: nothing is decoded, no KV cache")
            continue
        b = ft.kv_cache_bytes_per_token(types.SimpleNamespace(config=o))
        note = f"sliding window: at most {o['sliding_window']} tokens cached" if o.get("sliding_window") else ""
        print(f"{label:<24} {cls_name:<20} {o['L']:>3} {o['H_kv']:>4} {o['d_attn']:>6} {b // 4:>13} "
              f"{b / 1024:>11.1f} {b / 2048:>8.1f}  {note}")


if __name__ == "__main__":
    main()
