"""BPETokenizer and other projects' files (docs/tokenization.md "Hugging Face and GPT-2 files"): Hugging Face
`tokenizers`' tokenizer.json and GPT-2's vocab.json + merges.txt, in both directions. The oracle is HF
`tokenizers` itself, run on the same files: its ids must equal ours.
"""
from __future__ import annotations

import json
import pickle
import unicodedata

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import formal_transformers as ft

tokenizers = pytest.importorskip("tokenizers", reason="Hugging Face tokenizers is not installed (pip install '.[test]')")
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

SPECIALS = ("<mask>", "<bos>", "<eos>", "<|endoftext|>", "<pad>")
# Unicode text HF can take (no lone surrogates) and that the pre-tokenizers' Unicode versions agree on: code
# points assigned in our tables' Unicode version (HF's regex engine may know newer ones).
ASSIGNED = st.characters(codec="utf-8").filter(lambda c: unicodedata.category(c) not in ("Cn", "Cs"))
WORDS = st.sampled_from(["the", " the", " cat", "'s", "'ll", " \n", "\n\n", "  ", " 42", "é", " über", "中文", "😀",
                         "\u00a0", "\u3000", "\t", "KING", " HENRY", ":", "--"])
UNICODE_TEXT = st.lists(st.one_of(ASSIGNED, WORDS), max_size=40).map("".join).filter(
    lambda s: not any(x in s for x in SPECIALS))

EXTRA = "Überraschung: café, naïve, 中文字符, емоджи 😀😀 and tabs\tand  double  spaces. ¿Qué? «Ça» 42 ٣ ²\n" * 30


@pytest.fixture(scope="module")
def shakespeare():
    try:
        return ft.datasets.tiny_shakespeare(download=False)
    except FileNotFoundError as e:
        pytest.skip(f"real data: tiny Shakespeare is not available ({e})")


@pytest.fixture(scope="module")
def ours(shakespeare):
    """Our tokenizer, trained here; and its tokenizer.json loaded by HF."""
    return ft.BPETokenizer.train(shakespeare[:300_000] + EXTRA, 1200)


def _hf_from(tok, tmp_path_factory):
    path = tmp_path_factory.mktemp("hf") / "tokenizer.json"
    tok.to_hf_json(path)
    return Tokenizer.from_file(str(path))


@pytest.fixture(scope="module")
def ours_in_hf(ours, tmp_path_factory):
    return _hf_from(ours, tmp_path_factory)


def _hf_trained(text, n_vocab, special_tokens, alphabet=True):
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=n_vocab, min_frequency=2, show_progress=False, special_tokens=special_tokens,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet() if alphabet else [])
    tk.train_from_iterator([text], tr)
    return tk


@pytest.fixture(scope="module")
def hf_trained(shakespeare, tmp_path_factory):
    """A tokenizer HF trained (GPT-2's convention: one special, <|endoftext|>, first here), its file, and ours of it."""
    tk = _hf_trained(shakespeare[:300_000] + EXTRA, 1200, ["<|endoftext|>", "<pad>"])
    path = tmp_path_factory.mktemp("hf") / "tokenizer.json"
    tk.save(str(path))
    tok = ft.BPETokenizer.from_hf_json(path, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    return tk, path, tok


# ------------------------------------------------------------------------------------------------------
# Ids equal HF's on the same files
def test_ours_to_tokenizer_json_to_hf_on_tiny_shakespeare(shakespeare, ours, ours_in_hf):
    text = shakespeare
    want = ours_in_hf.encode(text).ids  # HF adds bos/eos through the TemplateProcessing we wrote
    got = ours.encode(text)
    assert got.dtype == np.int64
    assert got.tolist() == want
    assert want[0] == ours.bos_token == ours.n_vocab - 2 and want[-1] == ours.eos_token
    assert ours_in_hf.get_vocab_size() == ours.n_vocab
    assert ours_in_hf.decode(want) == ours.decode(got) == text


def test_hf_trained_to_ours_on_tiny_shakespeare(shakespeare, hf_trained):
    tk, _, tok = hf_trained
    assert tok.n_vocab == tk.get_vocab_size() == 1200
    assert tok.encode(shakespeare, bos=False, eos=False).tolist() == tk.encode(shakespeare).ids
    assert tok.decode(tk.encode(shakespeare).ids) == shakespeare


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(s=UNICODE_TEXT)
def test_ids_equal_hf_on_random_unicode_both_directions(ours, ours_in_hf, hf_trained, s):
    assert ours.encode(s).tolist() == ours_in_hf.encode(s).ids
    assert ours.encode(s, bos=False, eos=False).tolist() == ours_in_hf.encode(s, add_special_tokens=False).ids
    tk, _, tok = hf_trained
    assert tok.encode(s, bos=False, eos=False).tolist() == tk.encode(s).ids
    assert tok.decode(tok.encode(s)) == s


def test_gpt2_files_both_directions(tmp_path, shakespeare, ours, hf_trained):
    text = shakespeare[:100_000] + EXTRA
    # ours -> vocab.json + merges.txt -> HF's BPE model from those files
    ours.to_gpt2_files(tmp_path / "vocab.json", tmp_path / "merges.txt")
    hf = Tokenizer(models.BPE.from_file(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt")))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    assert ours.encode(text, bos=False, eos=False).tolist() == hf.encode(text).ids
    assert json.loads((tmp_path / "vocab.json").read_text(encoding="utf-8"))["<bos>"] == ours.bos_token
    back = ft.BPETokenizer.from_gpt2_files(tmp_path / "vocab.json", tmp_path / "merges.txt")
    assert back == ours and back.file_ids is None  # our own layout again (<mask>, <bos>, <eos> found by name)
    # HF's files (what GPT-2 ships: <|endoftext|> in vocab.json, no added tokens) -> ours
    tk, _, _ = hf_trained
    d = tmp_path / "hf_files"
    d.mkdir()
    vocab_file, merges_file = tk.model.save(str(d))
    tok = ft.BPETokenizer.from_gpt2_files(vocab_file, merges_file, eos_token="<|endoftext|>")
    hf2 = Tokenizer(models.BPE.from_file(vocab_file, merges_file))
    hf2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    assert tok.encode(text, bos=False, eos=False).tolist() == hf2.encode(text).ids
    assert tok.bos_token is None and tok.eos_token == 0 and tok.mask_token is None


def test_round_trips_keep_everything(tmp_path, ours, hf_trained):
    # ours -> tokenizer.json -> ours: our own layout, equal
    p = tmp_path / "t.json"
    ours.to_hf_json(p)
    assert ft.BPETokenizer.from_hf_json(p) == ours
    # HF file -> ours -> our save format / pickle / tokenizer.json -> the same tokenizer, the same ids
    tk, _, tok = hf_trained
    assert tok.file_ids is not None and tok.file_ids.dtype == np.int64
    for again in (ft.BPETokenizer.from_json(tok.to_json()), pickle.loads(pickle.dumps(tok))):
        assert again == tok and again.to_json() == tok.to_json()
        assert (again.bos_token, again.eos_token, again.mask_token) == (0, 0, None)
    tok.save(tmp_path / "ours.json")
    assert ft.BPETokenizer.load(tmp_path / "ours.json") == tok
    tok.to_hf_json(tmp_path / "again.json")
    hf = Tokenizer.from_file(str(tmp_path / "again.json"))
    s = "KING HENRY:\nWhat say'st thou? 中文 😀"
    assert hf.encode(s).ids == tok.encode(s).tolist() == [0] + tk.encode(s).ids + [0]
    assert ft.BPETokenizer.from_hf_json(tmp_path / "again.json") == tok  # bos/eos from the template


# ------------------------------------------------------------------------------------------------------
# Special tokens: the file's ids are kept; mask/bos/eos are the tokens named so (documented)
def test_special_tokens_of_a_foreign_file(hf_trained):
    tk, path, named = hf_trained
    tok = ft.BPETokenizer.from_hf_json(path)  # no <mask>/<bos>/<eos> in the file, none named
    assert (tok.mask_token, tok.bos_token, tok.eos_token) == (None, None, None)
    assert tok.special_tokens == [(0, "<|endoftext|>"), (1, "<pad>")]
    with pytest.raises(ValueError, match="no bos_token"):
        tok.encode("hello")
    with pytest.raises(ValueError, match="no eos_token"):
        tok.encode("hello", bos=False)
    ids = tok.encode("hello", bos=False, eos=False)
    assert ids.tolist() == tk.encode("hello").ids
    # the specials are never produced from text (HF would find added tokens in the text: documented difference)
    assert 0 not in tok.encode("<|endoftext|>", bos=False, eos=False).tolist()
    assert tk.encode("<|endoftext|>").ids == [0]
    # decode skips them, or renders their text
    assert tok.decode([0, *ids, 1]) == "hello"
    assert tok.decode([0, *ids, 1], skip_special=False) == "<|endoftext|>hello<pad>"
    # named roles: any special token, the same one twice is fine
    t2 = ft.BPETokenizer.from_hf_json(path, mask_token="<pad>", bos_token="<|endoftext|>", eos_token="<pad>")
    assert (t2.mask_token, t2.bos_token, t2.eos_token) == (1, 0, 1)
    assert t2.encode("hello").tolist() == [0, *ids.tolist(), 1]
    with pytest.raises(ValueError, match="not a special token"):
        ft.BPETokenizer.from_hf_json(path, bos_token="hello")
    assert named.encode("hi").tolist()[0] == 0 == named.encode("hi").tolist()[-1]
    # a model of the file's size takes the ids as they are
    m = ft.DTransformer(tok.n_vocab, 8, 1, 1, 8, 8, seed=0)
    assert m(ids).shape == (tok.n_vocab, len(ids))


def test_a_file_lacking_bytes_drops_them_as_hf_does(tmp_path):
    tk = _hf_trained("the cat sat on the mat. " * 20, 300, [], alphabet=False)
    tk.save(str(tmp_path / "t.json"))
    tok = ft.BPETokenizer.from_hf_json(tmp_path / "t.json")
    assert (tok.file_ids[:256] == -1).sum() > 200
    for s in ["the zebra", "tzh at", "cat hat", "über", ""]:
        assert tok.encode(s, bos=False, eos=False).tolist() == tk.encode(s).ids


# ------------------------------------------------------------------------------------------------------
# Files this tokenizer does not reproduce: a clear ValueError naming the problem, never a different tokenizer
def test_other_model_types_and_options_raise(tmp_path, hf_trained):
    texts = ["the cat sat on the mat"] * 10
    wp = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wp.pre_tokenizer = pre_tokenizers.Whitespace()
    wp.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=50, special_tokens=["[UNK]"], show_progress=False))
    uni = Tokenizer(models.Unigram())
    uni.train_from_iterator(texts, trainers.UnigramTrainer(vocab_size=20, show_progress=False))
    for name, tk, what in [("wp", wp, "WordPiece"), ("uni", uni, "Unigram")]:
        p = tmp_path / f"{name}.json"
        tk.save(str(p))
        with pytest.raises(ValueError, match=f"model type is \"{what}\".*byte-level BPE"):
            ft.BPETokenizer.from_hf_json(p)
    _, path, _ = hf_trained
    base = json.loads(path.read_text(encoding="utf-8"))

    def edited(**kw):
        d = json.loads(json.dumps(base))
        for k, v in kw.items():
            if k.startswith("model_"):
                d["model"][k[6:]] = v
            elif k.startswith("pt_"):
                d["pre_tokenizer"][k[3:]] = v
            else:
                d[k] = v
        p = tmp_path / "edited.json"
        p.write_text(json.dumps(d), encoding="utf-8")
        return p

    cases = [
        (dict(normalizer={"type": "NFC"}), "normalizer"),
        (dict(pt_add_prefix_space=True), "add_prefix_space"),
        (dict(pre_tokenizer={"type": "Whitespace"}), "ByteLevel"),
        (dict(model_dropout=0.1), "dropout"),
        (dict(model_byte_fallback=True), "byte_fallback"),
        (dict(model_ignore_merges=True), "ignore_merges"),
        (dict(model_end_of_word_suffix="</w>"), "end_of_word_suffix"),
        (dict(added_tokens=base["added_tokens"] + [dict(base["added_tokens"][0], id=1200, content="hi", special=False)]),
         "not special"),
        (dict(model_merges=base["model"]["merges"] + [["zz", "q"]]), "not in the vocabulary"),
        (dict(model_vocab=dict(base["model"]["vocab"], extra=5)), "given to two tokens"),
        (dict(truncation={"max_length": 5}), "truncation"),
        (dict(post_processor={"type": "RobertaProcessing"}), "post-processor"),
        (dict(model=None), "model"),
    ]
    for kw, match in cases:
        with pytest.raises(ValueError, match=match):
            ft.BPETokenizer.from_hf_json(edited(**kw))
    with pytest.raises(ValueError, match=r"from_hf_json\("):  # the message names the file
        ft.BPETokenizer.from_hf_json(edited(normalizer={"type": "NFC"}))
    p = tmp_path / "trunc.json"
    p.write_text(path.read_text(encoding="utf-8")[:1000], encoding="utf-8")
    with pytest.raises(ValueError):
        ft.BPETokenizer.from_hf_json(p)
    with pytest.raises(OSError):
        ft.BPETokenizer.from_hf_json(tmp_path / "missing.json")
    (tmp_path / "m.txt").write_text("#version: 0.2\na b c\n", encoding="utf-8")
    (tmp_path / "v.json").write_text(json.dumps({"a": 0}), encoding="utf-8")
    with pytest.raises(ValueError, match="line 2"):
        ft.BPETokenizer.from_gpt2_files(tmp_path / "v.json", tmp_path / "m.txt")
