"""Write the seed corpus of fuzz/fuzz_parsers.py into fuzz/corpus (small files; the first byte picks the
target: 0 tokenizer file, 1 model file, 2 model config)."""
from __future__ import annotations

import hashlib
import json
import pathlib
import tempfile

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


if __name__ == "__main__":
    main()
