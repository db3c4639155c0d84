"""Paper §4 (tokenization): CharTokenizer, WordTokenizer, BPETokenizer, chunk.

Oracles that do not come from the code under test: hand-worked examples, a naive pure-Python BPE
trainer (recounts every pair after every merge), Python's own UTF-8 decoder, and Hugging Face
`tokenizers` (its GPT-2 pre-tokenizer, and its BPE model loaded with our merges).
"""
from __future__ import annotations

import codecs
import pickle
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import formal_transformers as ft

from conftest import shared_data

# every code point, lone surrogates included (a Python str may hold them)
ANY_CHAR = st.characters(codec=None, exclude_categories=())
ANY_TEXT = st.text(ANY_CHAR, max_size=60)
# text that looks like text: words, spaces, punctuation, digits, some Unicode
WORDISH = st.lists(
    st.sampled_from(["the", " the", "cat", " ", "  ", "\n", "\n\n", "'s", "'ll", ",", ".", "!!", "é", "über", "中文",
                     "😀", "42", " 7", "\t", "\u00a0", "\u3000", "a", "aa", "aaa", "b", "ab", "\ud800", "<mask>"]),
    max_size=30).map("".join)
MIXED = st.one_of(ANY_TEXT, WORDISH)

CORPUS = ("The quick brown fox jumps over the lazy dog. It's 2024; don't panic!\n"
          "Überraschung: café, naïve, 中文字符, емоджи 😀😀 and tabs\tand  double  spaces.\n") * 40


@pytest.fixture(scope="module")
def bpe():
    return ft.BPETokenizer.train(CORPUS, 400)


def _specials_ok(ids, tok, bos, eos):
    ids = np.asarray(ids)
    assert ids.dtype == np.int64 and ids.ndim == 1  # ft.index_t: what the models take
    assert np.all(ids >= 0) and np.all(ids < tok.n_vocab)
    inner = ids[1 if bos else 0: len(ids) - (1 if eos else 0)]
    assert not np.any(inner >= tok.mask_token), "a special id arose from text"
    if bos:
        assert ids[0] == tok.bos_token == tok.n_vocab - 2
    if eos:
        assert ids[-1] == tok.eos_token == tok.n_vocab - 1
    return inner


# ------------------------------------------------------------------------------------------------------
# Round trips (thousands of generated strings)
@settings(max_examples=2500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(s=MIXED, bos=st.booleans(), eos=st.booleans())
def test_bpe_round_trip_any_string(bpe, s, bos, eos):
    ids = bpe.encode(s, bos=bos, eos=eos)
    inner = _specials_ok(ids, bpe, bos, eos)
    assert len(inner) <= len(s.encode("utf-8", "surrogatepass"))
    assert bpe.decode(ids) == s


@settings(max_examples=600, deadline=None)
@given(s=MIXED.filter(len))
def test_char_and_word_round_trip(s):
    for tok in (ft.CharTokenizer.fit(s), ft.WordTokenizer.fit(s)):
        ids = tok.encode(s)
        _specials_ok(ids, tok, True, True)
        assert tok.decode(ids) == s
        assert tok.decode(tok.encode(s, bos=False, eos=False)) == s
    c = ft.CharTokenizer.fit(s)
    assert len(c.encode(s, bos=False, eos=False)) == len(s)  # one token per code point
    assert c.n_vocab == len(set(s)) + 3


def test_round_trip_tinyshakespeare():
    text = shared_data("tinyshakespeare.txt").read_text(encoding="utf-8")
    tok = ft.BPETokenizer.train(text, 512)
    assert tok.n_vocab == 512
    ids = tok.encode(text)
    _specials_ok(ids, tok, True, True)
    assert tok.decode(ids) == text
    # a real compression: fewer tokens than bytes (byte-level BPE at 512 roughly halves them)
    assert len(ids) < 0.6 * len(text)
    for cls in (ft.CharTokenizer, ft.WordTokenizer):
        t = cls.fit(text)
        assert t.decode(t.encode(text)) == text
    c = ft.CharTokenizer.fit(text)
    assert c.n_vocab == len(set(text)) + 3 == 68  # nanoGPT's 65 characters + mask, bos, eos


# ------------------------------------------------------------------------------------------------------
# Hand-worked BPE. Bytes: a=97 b=98 c=99 d=100, space=32.
#   "aaabdaaabac" is one piece. Pair counts: (a,a) 4 (overlaps count), (a,b) 2, the rest 1.
#   merge 0: (97, 97) -> 256                 256 a b d 256 a b a c
#   (256, a) and (a, b) both occur twice: the tie goes to the smaller pair (97, 98)
#   merge 1: (97, 98) -> 257                 256 257 d 256 257 a c
#   merge 2: (256, 257) -> 258  (twice)      258 d 258 a c
#   every pair occurs once now < min_frequency = 2: stop. N_V = 256 + 3 merges + 3 specials = 262.
def test_bpe_hand_worked_example():
    tok = ft.BPETokenizer.train("aaabdaaabac", 1000)
    assert tok.merges == [(97, 97), (97, 98), (256, 257)]
    assert (tok.n_vocab, tok.mask_token, tok.bos_token, tok.eos_token) == (262, 259, 260, 261)
    assert tok.token_bytes(256) == b"aa" and tok.token_bytes(257) == b"ab" and tok.token_bytes(258) == b"aaab"
    for bad in (-1, 259, 262, 2**32 + 104, 2**63 - 1):  # specials, out of range, and ids that wrap in 32 bits
        with pytest.raises(IndexError):
            tok.token_bytes(bad)
    assert ft.BPETokenizer.train("aaabdaaabac", 2**31 - 1).n_vocab == 262  # a huge n_vocab allocates nothing for it
    assert tok.encode("aaabdaaabac").tolist() == [260, 258, 100, 258, 97, 99, 261]
    assert tok.encode("aaaa", bos=False, eos=False).tolist() == [256, 256]
    assert tok.encode("aaa", bos=False, eos=False).tolist() == [256, 97]
    # pieces "ab" | " aab": 257 | 32 (a a -> 256) b
    assert tok.encode("ab aab", bos=False, eos=False).tolist() == [257, 32, 256, 98]
    assert tok.encode("aaab aaab", bos=False, eos=False).tolist() == [258, 32, 258]
    assert tok.decode([260, 258, 32, 257, 261]) == "aaab ab"
    # min_frequency=1 goes on; all pairs of "258 d 258 a c" occur once: the smallest is (97, 99)
    tok1 = ft.BPETokenizer.train("aaabdaaabac", 263, min_frequency=1)
    assert tok1.merges == [(97, 97), (97, 98), (256, 257), (97, 99)]
    assert tok1.encode("aaabdaaabac", bos=False, eos=False).tolist() == [258, 100, 258, 259]


def test_bpe_special_ids_never_arise_from_text(bpe):
    text = "<mask> <bos><eos> mask bos eos \x00\xff" + "".join(map(chr, range(256)))
    ids = bpe.encode(text, bos=False, eos=False)
    assert ids.max() < bpe.mask_token
    assert bpe.decode(ids) == text
    # specials are skipped by default, rendered on request
    ids = [bpe.bos_token, *bpe.encode("hi", bos=False, eos=False), bpe.mask_token, bpe.eos_token]
    assert bpe.decode(ids) == "hi"
    assert bpe.decode(ids, skip_special=False) == "<bos>hi<mask><eos>"
    e = bpe.encode("", bos=True, eos=True)
    assert e.tolist() == [bpe.bos_token, bpe.eos_token]
    assert bpe.encode("", bos=False, eos=False).size == 0
    assert bpe.decode([]) == "" and bpe.decode(np.zeros(0, np.int64)) == ""


# ------------------------------------------------------------------------------------------------------
# Training against a naive trainer that recounts every pair after every merge (same rules: pairs over the
# pre-tokenizer's pieces, overlaps counted, highest count, ties to the smallest (left, right)).
def naive_train(text: str, n_vocab: int, min_frequency: int = 2):
    words = {}
    for p in ft.BPETokenizer.pretokenize(text):
        key = tuple(p.encode("utf-8", "surrogatepass"))
        words[key] = words.get(key, 0) + 1
    words = [(list(w), c) for w, c in words.items()]
    merges = []
    while 256 + len(merges) + 3 < n_vocab:
        counts = {}
        for w, c in words:
            for pair in zip(w, w[1:]):
                counts[pair] = counts.get(pair, 0) + c
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], p))
        if counts[best] < min_frequency:
            break
        new = 256 + len(merges)
        merges.append(best)
        for k, (w, c) in enumerate(words):
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(new)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            words[k] = (out, c)
    return merges


@settings(max_examples=150, deadline=None)
@given(text=st.one_of(WORDISH, st.text(st.sampled_from("ab c\n"), max_size=200)),
       n_vocab=st.integers(259, 300), min_frequency=st.integers(1, 3))
def test_bpe_training_matches_naive_trainer(text, n_vocab, min_frequency):
    tok = ft.BPETokenizer.train(text, n_vocab, min_frequency=min_frequency)
    want = naive_train(text, n_vocab, min_frequency)
    assert tok.merges == want
    assert tok.n_vocab == 259 + len(want)


def test_bpe_training_is_deterministic():
    a = ft.BPETokenizer.train(CORPUS, 600)
    b = ft.BPETokenizer.train(CORPUS, 600)
    assert a.merges == b.merges and a.to_json() == b.to_json()
    assert a == b
    assert naive_train(CORPUS, 330) == a.merges[: 330 - 259]


# GPT-2's encoder loop in Python: merge the lowest-rank pair present (all occurrences, left to right), repeat.
def naive_encode_piece(piece: bytes, merges):
    rank = {m: r for r, m in enumerate(merges)}
    w = list(piece)
    while len(w) > 1:
        pairs = [(rank[p], p) for p in zip(w, w[1:]) if p in rank]
        if not pairs:
            break
        r, best = min(pairs)
        out, i = [], 0
        while i < len(w):
            if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                out.append(256 + r)
                i += 2
            else:
                out.append(w[i])
                i += 1
        w = out
    return w


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(s=MIXED)
def test_bpe_encoding_matches_naive_encoder(bpe, s):
    want = [i for p in ft.BPETokenizer.pretokenize(s)
            for i in naive_encode_piece(p.encode("utf-8", "surrogatepass"), bpe.merges)]
    assert bpe.encode(s, bos=False, eos=False).tolist() == want


# ------------------------------------------------------------------------------------------------------
# Against Hugging Face tokenizers
GPT2_ALPHABET = st.sampled_from(list("abcXYZ019 '\n\t\r\x0b\x0c.,!?-_\"'")
                                + ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "é", "ß", "Ω", "中", "٣", "²",
                                   "Ⅻ", "—", "…", "😀", "\u00a0", "\u3000", "\u2028", "\u0085", "\u1680", "\x1c"])


def _hf():
    return pytest.importorskip("tokenizers", reason="Hugging Face tokenizers is not installed (pip install '.[test]')")


@settings(max_examples=500, deadline=None)
@given(s=st.lists(GPT2_ALPHABET, max_size=25).map("".join))
def test_pretokenizer_matches_hf_gpt2_regex(s):
    tokenizers = _hf()
    pre = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    want = [s[a:b] for _, (a, b) in pre.pre_tokenize_str(s)]
    got = ft.BPETokenizer.pretokenize(s)
    assert "".join(got) == s
    assert got == want


def _bytes_to_unicode():
    # GPT-2's printable stand-ins for bytes (as in its encoder.py)
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _hf_with_our_merges(tok):
    tokenizers = _hf()
    b2u = _bytes_to_unicode()
    show = lambda bs: "".join(b2u[x] for x in bs)  # noqa: E731
    vocab = {}
    for i in range(tok.n_vocab - 3):
        vocab.setdefault(show(tok.token_bytes(i)), i)
    merges = [(show(tok.token_bytes(a)), show(tok.token_bytes(b))) for a, b in tok.merges]
    hf = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=merges))
    hf.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    u2b = {u: b for b, u in b2u.items()}
    return hf, lambda toks: [bytes(u2b[ch] for ch in t) for t in toks]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(s=st.lists(GPT2_ALPHABET | st.sampled_from(["the", " the", " quick", " fox", "lazy", "ü"]), max_size=25).map("".join))
def test_bpe_encoding_matches_hf_bpe_model_with_our_merges(bpe, s):
    hf, to_bytes = _hf_with_our_merges(bpe)
    ours = [bpe.token_bytes(int(i)) for i in bpe.encode(s, bos=False, eos=False)]
    assert ours == to_bytes(hf.encode(s).tokens)


def test_bpe_encoding_matches_hf_on_tinyshakespeare():
    text = shared_data("tinyshakespeare.txt").read_text(encoding="utf-8")[:200_000]
    tok = ft.BPETokenizer.train(text, 1000)
    hf, to_bytes = _hf_with_our_merges(tok)
    ours = [tok.token_bytes(int(i)) for i in tok.encode(text, bos=False, eos=False)]
    assert ours == to_bytes(hf.encode(text).tokens)


# ------------------------------------------------------------------------------------------------------
# Decoding byte sequences that are not UTF-8: Python's own decoder is the oracle. Ours = 'replace', except
# that whole surrogate sequences pass (as 'surrogatepass'), so every str round-trips.
def _surrogatepass_then_replace(e):
    b = e.object[e.start:e.start + 3]
    if len(b) == 3 and b[0] == 0xED and 0xA0 <= b[1] <= 0xBF and 0x80 <= b[2] <= 0xBF:
        return chr(((b[0] & 0x0F) << 12) | ((b[1] & 0x3F) << 6) | (b[2] & 0x3F)), e.start + 3
    return "\ufffd", e.end


codecs.register_error("ft_test_surrogatepass_replace", _surrogatepass_then_replace)

BYTES = st.lists(st.one_of(st.binary(max_size=3), st.sampled_from(
    [b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xed\xa0", b"\xed", b"\xe2\x82\xac", b"\xe2\x82", b"\xf0\x9f\x98\x80",
     b"\xf0\x9f", b"\xf4\x90\x80\x80", b"\xc3", b"\xa9", b"\xc0\xaf", b"\xe0\x80", b"\xff", b"a"])), max_size=12).map(b"".join)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(b=BYTES)
def test_bpe_decode_invalid_utf8_like_python(bpe, b):
    ids = list(b)  # ids 0..255 are the bytes
    assert bpe.decode_bytes(ids) == b
    assert bpe.decode(ids) == b.decode("utf-8", "ft_test_surrogatepass_replace")
    if b"\xed\xa0" not in b and b"\xed\xbf" not in b and not any(b"\xed" + bytes([x]) in b for x in range(0xA0, 0xC0)):
        assert bpe.decode(ids) == b.decode("utf-8", "replace")
        assert bpe.decode(ids, errors="ignore") == b.decode("utf-8", "ignore")
    try:
        want = b.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        with pytest.raises(ValueError, match="not valid UTF-8"):
            bpe.decode(ids, errors="strict")
    else:
        assert bpe.decode(ids, errors="strict") == want


def _replace_keeping_surrogates(e: UnicodeDecodeError):
    """Python's "replace", except that a whole encoded surrogate (ED A0–BF 80–BF) decodes to it, as
    decode(errors="replace") does (every text round-trips, tokenizer_json.cpp)."""
    b = e.object[e.start:e.start + 3]
    if len(b) == 3 and b[0] == 0xED and 0xA0 <= b[1] <= 0xBF and 0x80 <= b[2] <= 0xBF:
        return b.decode("utf-8", "surrogatepass"), e.start + 3
    return "\ufffd", e.end


codecs.register_error("ft-replace", _replace_keeping_surrogates)


def test_bpe_decode_of_arbitrary_token_sequences_is_their_bytes_decoded(bpe, rng):
    """Any id sequence, special tokens included (they decode to nothing), decodes to its tokens' bytes joined
    and read as UTF-8 with U+FFFD for what is not valid (an encoded surrogate kept): ids drawn at random
    make cut and invalid sequences."""
    specials = {bpe.mask_token, bpe.bos_token, bpe.eos_token}
    for _ in range(200):
        ids = rng.integers(0, bpe.n_vocab, size=int(rng.integers(0, 50)))
        raw = b"".join(bpe.token_bytes(int(i)) for i in ids if int(i) not in specials)
        assert bpe.decode(ids) == raw.decode("utf-8", "ft-replace")


# ------------------------------------------------------------------------------------------------------
# Char and word tokenizers
def test_char_tokenizer_hand_example():
    t = ft.CharTokenizer.fit("hello")  # e=0 h=1 l=2 o=3 (code point order), mask 4, bos 5, eos 6
    assert t.chars == ["e", "h", "l", "o"]
    assert (t.n_vocab, t.mask_token, t.bos_token, t.eos_token, t.unk_token) == (7, 4, 5, 6, None)
    assert t.encode("hole").tolist() == [5, 1, 3, 2, 0, 6]
    assert t.decode([5, 1, 0, 2, 2, 3, 4, 6]) == "hello"
    assert t.decode([5, 1, 0, 4, 6], skip_special=False) == "<bos>he<mask><eos>"
    with pytest.raises(ValueError, match=r"'p' \(U\+0070\) at position 2"):
        t.encode("hep")
    u = ft.CharTokenizer.fit("hello", unk=True)  # unk_token = N_V - 4 = 4
    assert (u.n_vocab, u.unk_token, u.mask_token) == (8, 4, 5)
    assert u.encode("help", bos=False, eos=False).tolist() == [1, 0, 2, 4]
    assert u.decode([1, 4]) == "h\ufffd"
    # "<mask>" in text is just characters
    m = ft.CharTokenizer.fit("<mask>")
    assert m.encode("<mask>", bos=False, eos=False).max() < m.mask_token


def test_word_tokenizer_hand_example():
    # pieces: "the" " cat" " the" " hat" " the": " the" twice first, then ties by bytes: " cat" < " hat" < "the"
    t = ft.WordTokenizer.fit("the cat the hat the")
    assert t.words == [" the", " cat", " hat", "the"]
    assert (t.n_vocab, t.mask_token, t.bos_token, t.eos_token) == (7, 4, 5, 6)
    assert t.encode("the hat the cat", bos=False, eos=False).tolist() == [3, 2, 0, 1]
    assert t.decode([5, 3, 2, 6]) == "the hat"
    with pytest.raises(ValueError, match=r"word ' dog' at position 3"):
        t.encode("the dog")
    u = ft.WordTokenizer.fit("the cat the hat the", unk=True, min_count=2)
    assert u.words == [" the"] and u.unk_token == 1 and u.n_vocab == 5
    assert u.encode("the cat the", bos=False, eos=False).tolist() == [1, 1, 0]
    assert u.decode([1, 0]) == "<unk> the"
    # pieces "a" " b" " c" " d" " a" all once: by bytes " a" < " b" < " c" < " d" < "a"; keep 2
    assert ft.WordTokenizer.fit("a b c d a", max_words=2).words == [" a", " b"]
    assert ft.WordTokenizer.pretokenize("It's 42!") == ["It", "'s", " 42", "!"]


# ------------------------------------------------------------------------------------------------------
# save / load
@pytest.mark.parametrize("make", [
    lambda: ft.BPETokenizer.train(CORPUS + "\ud800\udfff", 450),
    lambda: ft.CharTokenizer.fit(CORPUS + "\ud800\x00\x7f\"\\"),
    lambda: ft.CharTokenizer.fit("abc", unk=True),
    lambda: ft.WordTokenizer.fit(CORPUS + " \ud800", min_count=1),
    lambda: ft.WordTokenizer.fit(CORPUS, unk=True, max_words=20),
])
def test_save_load_round_trip(tmp_path, make):
    import json

    tok = make()
    path = tmp_path / "tok.json"
    tok.save(path)
    doc = json.loads(path.read_text(encoding="utf-8"))  # plain JSON that any reader can parse
    assert doc["format"] == "formal-transformers/tokenizer" and doc["n_vocab"] == tok.n_vocab
    back = type(tok).load(str(path))
    assert type(back) is type(tok) and back == tok
    assert back.to_json() == tok.to_json()
    for name in ("n_vocab", "mask_token", "bos_token", "eos_token"):
        assert getattr(back, name) == getattr(tok, name)
    sample = CORPUS[:300]
    if isinstance(tok, ft.BPETokenizer):
        assert back.merges == tok.merges
        sample += "\ud800\udfff 😀"
    elif tok.unk_token is None:
        sample = CORPUS[:300]
    assert back.encode(sample).tolist() == tok.encode(sample).tolist()
    assert pickle.loads(pickle.dumps(tok)) == tok


def test_bpe_save_format_is_readable(tmp_path):
    tok = ft.BPETokenizer.train("aaabdaaabac", 1000)
    tok.save(tmp_path / "t.json")
    import json

    doc = json.loads((tmp_path / "t.json").read_text(encoding="utf-8"))
    assert doc["type"] == "bpe" and doc["version"] == 1 and doc["pre_tokenizer"] == "gpt2"
    assert doc["merges"] == [[97, 97, "aa"], [97, 98, "ab"], [256, 257, "aaab"]]
    assert doc["special_tokens"] == {"<mask>": 259, "<bos>": 260, "<eos>": 261}


@pytest.mark.parametrize("cls,make", [
    (ft.BPETokenizer, lambda: ft.BPETokenizer.train(CORPUS, 300)),
    (ft.CharTokenizer, lambda: ft.CharTokenizer.fit(CORPUS)),
    (ft.WordTokenizer, lambda: ft.WordTokenizer.fit(CORPUS)),
])
def test_corrupt_or_truncated_files_raise(tmp_path, cls, make):
    import json

    good = make().to_json()
    p = tmp_path / "t.json"
    for n in list(range(0, len(good) - 2, max(1, len(good) // 40))):
        p.write_text(good[:n], encoding="utf-8")
        with pytest.raises(ValueError, match="corrupt or truncated"):
            cls.load(p)
    doc = json.loads(good)
    edits = [("n_vocab", doc["n_vocab"] + 1), ("version", 99), ("format", "something else"), ("special_tokens", {})]
    if cls is ft.BPETokenizer:
        m = [list(x) for x in doc["merges"]]
        m[0][0] = 10_000
        edits += [("merges", m), ("merges", [m[1], m[1]] + m[2:]), ("merges", [[97, 97, "not aa"]])]
    elif cls is ft.CharTokenizer:
        edits += [("chars", doc["chars"] + ["ab"]), ("chars", doc["chars"][::-1]), ("unk", 1)]
    else:
        edits += [("words", doc["words"] + ["two words"]), ("words", doc["words"] + doc["words"][:1])]
    for key, value in edits:
        bad = dict(doc, **{key: value})
        p.write_text(json.dumps(bad), encoding="utf-8")
        with pytest.raises(ValueError, match=r"\.load\("):
            cls.load(p)
    p.write_bytes(b"\x00\xff garbage")
    with pytest.raises(ValueError):
        cls.load(p)
    other = ft.CharTokenizer if cls is not ft.CharTokenizer else ft.WordTokenizer
    with pytest.raises(ValueError, match="tokenizer, not a"):
        other.load(_write(tmp_path / "o.json", good))
    with pytest.raises(OSError):
        cls.load(tmp_path / "missing.json")


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------------------
# Bad input
def test_bad_input_raises_clear_exceptions(bpe):
    with pytest.raises(ValueError, match="at least 259 = 256 byte tokens"):
        ft.BPETokenizer.train("abc", 258)
    with pytest.raises(ValueError, match="min_frequency"):
        ft.BPETokenizer.train("abc", 300, min_frequency=0)
    with pytest.raises(TypeError, match="n_vocab must be an int, got float"):
        ft.BPETokenizer.train("abc", 300.0)
    for bad in (b"bytes", None, ["a"], 3):
        name = type(bad).__name__
        with pytest.raises(TypeError, match=f"text must be str, got {name}"):
            ft.BPETokenizer.train(bad, 300)
        for tok in (bpe, ft.CharTokenizer.fit("ab"), ft.WordTokenizer.fit("ab")):
            with pytest.raises(TypeError, match=f"text must be str, got {name}"):
                tok.encode(bad)
        with pytest.raises(TypeError, match=f"text must be str, got {name}"):
            ft.CharTokenizer.fit(bad)
    for tok in (bpe, ft.CharTokenizer.fit("ab"), ft.WordTokenizer.fit("ab")):
        with pytest.raises(IndexError, match=r"token id .* at position 1 is out of range"):
            tok.decode([0, tok.n_vocab])
        with pytest.raises(IndexError):
            tok.decode(np.array([-1]))
        with pytest.raises(TypeError):
            tok.decode([0.5, 1.0])
        with pytest.raises(TypeError):
            tok.decode("abc")
        with pytest.raises(TypeError):
            tok.decode(3)
        with pytest.raises(ValueError):
            tok.decode(np.zeros((2, 2), np.int32))
        with pytest.raises(TypeError, match="bos must be a bool"):
            tok.encode("ab", bos=1)
        with pytest.raises(TypeError, match="texts must be a list of str"):
            tok.encode_batch("ab")
    with pytest.raises(ValueError, match="errors must be"):
        bpe.decode([97], errors="surrogateescape")
    with pytest.raises(ValueError, match="empty"):
        ft.CharTokenizer.fit("")
    with pytest.raises(ValueError, match="empty"):
        ft.WordTokenizer.fit("")
    with pytest.raises(ValueError, match="max_words"):
        ft.WordTokenizer.fit("a", max_words=0)
    with pytest.raises(IndexError):
        bpe.token_bytes(bpe.mask_token)
    with pytest.raises(ValueError, match="does not exist before it"):
        ft.BPETokenizer.from_merges([(97, 300)])


# ------------------------------------------------------------------------------------------------------
# chunk
@settings(max_examples=500, deadline=None)
@given(n=st.integers(0, 200), l_max=st.integers(1, 40), data=st.data())
def test_chunk_covers_exactly(n, l_max, data):
    ids = np.arange(n, dtype=np.int64) * 3
    pieces = ft.chunk(ids, l_max)
    assert all(1 <= len(p) <= l_max for p in pieces)
    assert all(len(p) == l_max for p in pieces[:-1])
    assert np.array_equal(np.concatenate(pieces) if pieces else np.zeros(0, np.int64), ids)
    assert len(pieces) == -(-n // l_max)  # ceil(n / l_max)
    stride = data.draw(st.integers(1, l_max))
    wins = ft.chunk(ids.tolist(), l_max, stride=stride)
    assert all(1 <= len(w) <= l_max for w in wins)
    for k, w in enumerate(wins):  # window k starts at k·stride
        assert np.array_equal(w, ids[k * stride: k * stride + l_max])
    if n:
        assert wins[-1][-1] == ids[-1] and (len(wins) == 1 or (len(wins) - 2) * stride + l_max < n)
    else:
        assert wins == []


def test_chunk_hand_examples_and_bad_input():
    assert [p.tolist() for p in ft.chunk([1, 2, 3, 4, 5], 2)] == [[1, 2], [3, 4], [5]]
    assert [p.tolist() for p in ft.chunk([1, 2, 3, 4, 5], 3, stride=2)] == [[1, 2, 3], [3, 4, 5]]
    assert [p.tolist() for p in ft.chunk([1, 2, 3, 4, 5, 6], 3, stride=2)] == [[1, 2, 3], [3, 4, 5], [5, 6]]
    assert ft.chunk([], 4) == []
    assert ft.chunk(np.array([7], np.int32), 4)[0].dtype == np.int32
    with pytest.raises(ValueError, match="l_max"):
        ft.chunk([1, 2], 0)
    with pytest.raises(ValueError, match="stride"):
        ft.chunk([1, 2], 2, stride=3)
    with pytest.raises(ValueError, match="1-D"):
        ft.chunk([[1, 2]], 2)
    with pytest.raises(TypeError):
        ft.chunk([1.5, 2.0], 2)
    with pytest.raises(TypeError):
        ft.chunk("abc", 2)


# ------------------------------------------------------------------------------------------------------
def test_encode_batch_matches_encode_and_threads(bpe):
    texts = [CORPUS[i: i + 97] for i in range(0, 2000, 97)] + ["", "\ud800"]
    # (the slices cut words, so the word tokenizer needs its unknown token here)
    for tok in (bpe, ft.CharTokenizer.fit(CORPUS + "\ud800"), ft.WordTokenizer.fit(CORPUS, unk=True)):
        got = tok.encode_batch(texts, bos=False)
        assert [g.tolist() for g in got] == [tok.encode(t, bos=False).tolist() for t in texts]
    # the GIL is released: concurrent encodes from threads give the same answers
    want = bpe.encode(CORPUS * 5)
    out = [None] * 4

    def work(k):
        out[k] = bpe.encode(CORPUS * 5)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(np.array_equal(o, want) for o in out)


def test_training_stops_on_ctrl_c():
    import _thread

    # ~2.4 MB of random words: every word distinct, so training to 60000 tokens takes many seconds
    rng = np.random.default_rng(0)
    letters = rng.integers(97, 107, size=2_400_000).astype(np.uint8)
    letters[rng.random(letters.size) < 0.15] = 32
    text = letters.tobytes().decode("ascii")
    timer = threading.Timer(0.3, _thread.interrupt_main)  # what Ctrl-C does
    finished = False
    t0 = time.perf_counter()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            ft.BPETokenizer.train(text, 60_000, min_frequency=1)
            finished = True
            time.sleep(10)  # (only if training was not interrupted: the interrupt lands here)
    finally:
        timer.cancel()
    assert not finished, "training ran to completion before the interrupt arrived"
    assert time.perf_counter() - t0 < 5


def test_reexported_and_documented():
    for name in ("CharTokenizer", "WordTokenizer", "BPETokenizer", "chunk"):
        assert name in ft.__all__
    doc = ft.BPETokenizer.__doc__
    assert "ties go to the smallest" in doc and "surrogatepass" in doc
    assert "unk=True" in ft.CharTokenizer.__doc__ and "unk=True" in ft.WordTokenizer.__doc__


# ------------------------------------------------------------------------------------------------------
# One id type from tokenizer to model to inference (ft.index_t = int64)
def test_ids_are_int64_end_to_end_and_int32_still_accepted(bpe):
    ids = bpe.encode("To be, or not to be")
    assert ids.dtype == np.int64
    assert all(a.dtype == np.int64 for a in bpe.encode_batch(["a b", "c"]))
    # decode takes int64 (what encode gives), int32 and other integer dtypes, and lists, alike
    want = bpe.decode(ids)
    for v in (ids, ids.astype(np.int32), ids.astype(np.uint16), ids.tolist(), tuple(ids.tolist())):
        assert bpe.decode(v) == want
    for tok in (ft.CharTokenizer.fit(CORPUS), ft.WordTokenizer.fit(CORPUS)):
        x = tok.encode(CORPUS[:50])
        assert x.dtype == np.int64 and tok.decode(x.astype(np.int32)) == tok.decode(x) == CORPUS[:50]
    # chunk keeps the dtype it is given: int64 from encode, int32 for compatibility
    assert all(c.dtype == np.int64 for c in ft.chunk(ids, 4))
    assert all(c.dtype == np.int32 for c in ft.chunk(ids.astype(np.int32), 4))
    # the model and the sampler take the ids as they are and give int64 back, which decode takes
    m = ft.DTransformer(bpe.n_vocab, 16, 1, 1, 8, 16, seed=0)
    P = m(ids[:16])
    assert P.shape == (bpe.n_vocab, min(16, len(ids)))
    out = ft.DInference(l_gen=5, seed=0)(ids[:8], m)
    assert out.dtype == np.int64
    assert isinstance(bpe.decode(out), str)
