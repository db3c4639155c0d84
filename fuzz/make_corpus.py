"""Write the seed corpus of fuzz/fuzz_parsers.py into fuzz/corpus (small files; the first byte picks the
target: 0 tokenizer file, 1 model file, 2 model config, 3 Hugging Face config.json, 4 run.json, 5 cached data
file, 6 GPT-2 vocab.json NUL merges.txt, 7 prompt cache file)."""
from __future__ import annotations

import hashlib
import json
import pathlib
import struct
import tempfile

import numpy as np

import formal_transformers as ft

OUT = pathlib.Path(__file__).resolve().parent / "corpus"


def put(target: int, payload: bytes) -> None:
    data = bytes([target]) + payload
    (OUT / hashlib.sha1(data).hexdigest()).write_bytes(data)


def main() -> None:
    OUT.mkdir(exist_ok=True)
    text = "the cat sat on the mat; wörld 日本 \ud800 😀 " * 2
    for t in (ft.CharTokenizer.fit(text, unk=True), ft.WordTokenizer.fit(text, unk=True, min_count=1),
              ft.BPETokenizer.train(text * 3, 280)):
        put(0, t.to_json().encode("utf-8", "surrogatepass"))
    with tempfile.TemporaryDirectory() as d:
        for m in (ft.DTransformer(12, 8, 1, 2, 4, 6), ft.ETransformer(10, 4, 1, 1, 2, 3, 2, dtype="float64"),
                  ft.EDTransformer(9, 4, 1, 1, 1, 2, 3, tied=True)):
            p = pathlib.Path(d) / "m.safetensors"
            ft.save(m, p)
            put(1, p.read_bytes())
            put(2, json.dumps(m.config).encode())
        # 7: prompt caches of fuzz_parsers.py's PROMPT_MODEL (the current version, and one as version 1 wrote it:
        # no digest), and a model file given as a cache
        pm = ft.DTransformer(12, 8, 1, 2, 4, 6, positional="rope", seed=5)
        p = pathlib.Path(d) / "c.safetensors"
        ft.DInference.prefill(np.array([3, 1, 4, 1, 5]), pm).save(p)
        put(7, p.read_bytes())
        blob = p.read_bytes()
        n = struct.unpack("<Q", blob[:8])[0]
        header = json.loads(blob[8:8 + n])
        header["__metadata__"]["formal_transformers.prompt_cache"] = "1"
        del header["__metadata__"]["formal_transformers.prompt_digest"]
        s = json.dumps(header).encode()
        s += b" " * ((8 - len(s) % 8) % 8)
        put(7, struct.pack("<Q", len(s)) + s + blob[8 + n:])
        ft.save(pm, p)
        put(7, p.read_bytes())
        # 3: Hugging Face config.json (payload byte 0 picks GPT-2 / BERT / LLaMA-style)
        for i, m in enumerate([ft.DTransformer(11, 6, 2, 2, 4, 6),
                               ft.ETransformer(11, 6, 2, 2, 4, 6, 4, embed_norm=True, unembed_bias=True, n_segments=2),
                               ft.DTransformer(11, 6, 2, 2, 4, 6, positional="rope", H_kv=1, mlp="swiglu", bias=False,
                                               norm="rms")]):
            h = pathlib.Path(d) / f"hf{i}"
            ft.save_hf(m, h)
            put(3, bytes([i]) + (h / "config.json").read_bytes())
        # 6: GPT-2 vocab.json NUL merges.txt
        t = ft.BPETokenizer.train(text * 3, 270)
        v, mg = pathlib.Path(d) / "vocab.json", pathlib.Path(d) / "merges.txt"
        t.to_gpt2_files(v, mg)
        put(6, v.read_bytes() + b"\0" + mg.read_bytes())
        put(6, json.dumps({"\u0100": 2147483646, "\u0101": 0}).encode() + b"\0")  # issue 27: an id far beyond the entries
    # 4: a run directory's run.json; 5: a cached data file (the pinned one, and a zip holding fra.txt)
    put(4, json.dumps({"steps_done": 2, "history": {"loss": [3.0, 2.5], "step": [1, 2]}, "seconds": 0.5,
                       "early_stopping": {"best_val_loss": 2.4, "best_step": 2, "bad_evals": 0, "stopped": False,
                                          "restored": False}}).encode())
    put(5, b"First Citizen:\n")
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("fra.txt", "Go.\tVa !\tCC-BY 2.0 (France) Attribution: tatoeba.org #1 (a) & #2 (b)\n")
    put(5, buf.getvalue())


if __name__ == "__main__":
    main()
