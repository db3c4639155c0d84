"""KV-cache bytes per token of today's open model families at their published shapes (docs/interop.md "KV cache per
token"): the numbers each decoding step keeps per token and layer, H_kv·(d_attn + d_mid) (Algorithm 4's keys and
values of every key/value head; MHAttention::cache_rows), times the bytes of the cache's dtype, summed over the
layers. Local (sliding-window) layers (Gemma 2, 3: V22) keep at most their window w of keys (V9's rolling cache),
so past w tokens a token costs only the global layers' share; the table gives both, and the cache of a whole
context of `--context` tokens. No weights are read: the shapes are written here from each model's published
config.json (hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, sliding_window,
the layer pattern).

    python bench/kv_cache_bytes_local_global.py [--dtype bfloat16|float32|float64] [--context 8192]"""
from __future__ import annotations

import argparse

# name: (layers, H, H_kv, head_dim, sliding window (None: every layer global), every p-th layer global (None: all
# local when there is a window))
FAMILIES = {
    # Qwen3 (Qwen3ForCausalLM): every layer global (use_sliding_window false)
    "Qwen3-0.6B": (28, 16, 8, 128, None, None),
    "Qwen3-1.7B": (28, 16, 8, 128, None, None),
    "Qwen3-4B": (36, 32, 8, 128, None, None),
    "Qwen3-8B": (36, 32, 8, 128, None, None),
    "Qwen3-14B": (40, 40, 8, 128, None, None),
    "Qwen3-32B": (64, 64, 8, 128, None, None),
    # Gemma 2 (Gemma2ForCausalLM): local and global layers alternate (layer l global when l + 1 is even)
    "gemma-2-2b": (26, 8, 4, 256, 4096, 2),
    "gemma-2-9b": (42, 16, 8, 256, 4096, 2),
    "gemma-2-27b": (46, 32, 16, 128, 4096, 2),
    # Gemma 3 text (Gemma3ForCausalLM / the language model of Gemma3ForConditionalGeneration): every 6th layer global
    "gemma-3-1b": (26, 4, 1, 256, 512, 6),
    "gemma-3-4b": (34, 8, 4, 256, 1024, 6),
    "gemma-3-12b": (48, 16, 8, 256, 1024, 6),
    "gemma-3-27b": (62, 32, 16, 128, 1024, 6),
}
BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}


def kv_bytes(layers, H, H_kv, d_h, w, p, elem, context):
    """(bytes per token over every layer, bytes per token past the window (global layers only), bytes of a cache
    of `context` tokens)."""
    per_layer = 2 * H_kv * d_h * elem  # keys and values: H_kv·(d_attn + d_mid) numbers
    is_global = [w is None or (p is not None and (l + 1) % p == 0) for l in range(layers)]
    n_global = sum(is_global)
    whole = sum(per_layer * (context if g else min(context, w)) for g in is_global)
    return per_layer * layers, per_layer * n_global, whole


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(BYTES))
    ap.add_argument("--context", type=int, default=8192)
    a = ap.parse_args(argv)
    elem = BYTES[a.dtype]
    print(f"| model | layers (global) | H / H_kv × head_dim | window | bytes/token, all layers | bytes/token past the "
          f"window | cache of {a.context} tokens ({a.dtype}) |")
    print("|---|---|---|---|---|---|---|")
    for name, (L, H, H_kv, d_h, w, p) in FAMILIES.items():
        per, past, whole = kv_bytes(L, H, H_kv, d_h, w, p, elem, a.context)
        n_g = L if w is None else sum(1 for l in range(L) if p is not None and (l + 1) % p == 0)
        print(f"| {name} | {L} ({n_g}) | {H} / {H_kv} × {d_h} | {w or '—'} | {per:,} | {past:,} | "
              f"{whole / 2**20:,.1f} MiB |")


if __name__ == "__main__":
    main()
