// Paper §4, "Tokenization: How Text is Represented": character-level, word-level and byte-level Byte
// Pair Encoding (BPE; Gage 1994, Sennrich et al. 2016, as used in GPT-2) tokenizers, and chunking of
// sequences longer than ℓ_max.
//
//   §4: "Given a vocabulary V ≅ [N_V], a piece of text is represented as a sequence of indices, called
//   token IDs, corresponding to (sub)words". "Typically, a few special tokens are added to the vocabulary:
//   mask_token = N_V − 2 ... bos_token = N_V − 1 ... eos_token = N_V" (1-based in the paper). "A piece of
//   text is represented as x = [bos_token, x[1], ..., x[ℓ], eos_token]". "If ℓ > ℓ_max, x is split into
//   chunks of length ≤ ℓ_max".
//
// Vocabulary layout (0-based, docs/api.md): the regular tokens 0 .. N_V−4, then mask_token = N_V−3,
// bos_token = N_V−2, eos_token = N_V−1. Special tokens never arise from text: encoding only ever yields
// regular ids; the literal text "<mask>" is encoded like any other text.
//
// Text is UTF-8 bytes. Lone surrogates (possible in a Python str) travel as Python's "surrogatepass"
// encodes them (ED A0..BF 80..BF), so every Python str round-trips. Decoded text comes back in the same
// form: valid UTF-8 plus surrogate code points; byte sequences that are not UTF-8 (possible only in BPE,
// whose tokens are bytes) are replaced by U+FFFD per maximal invalid subpart, exactly as Python's
// bytes.decode("utf-8", "replace") does (errors = Replace, the default), dropped (Ignore) or reported
// (Strict: ValueError naming the byte offset).
//
// Design decisions (also in docs/tokenization.md and the Python docstrings):
//  * Pre-tokenizer (BPE and WordTokenizer): GPT-2's rule
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//    implemented as a hand-written scanner (no regex engine, no ICU). \p{L} / \p{N} are the Unicode 14.0
//    general categories L* / N* (a range table generated from Python 3.11's unicodedata, in
//    tokenizer.cpp); \s is the Unicode White_Space property. Contractions are ASCII, case-sensitive, as
//    in GPT-2. Lone surrogates and bytes that are not UTF-8 count as "other" (neither letter, digit nor
//    space). BPE merges never cross a piece boundary.
//  * BPE training (byte-level): ids 0..255 are the bytes, merge k creates id 256 + k. The score of a pair
//    is its number of adjacent occurrences in the pre-tokenized training text (overlaps counted: "aaa"
//    holds ("a","a") twice). Each step merges the pair with the highest count; ties go to the smallest
//    pair (left id, then right id). Training stops when N_V − 3 regular tokens exist or when the best
//    pair occurs fewer than min_frequency (default 2) times; then N_V = 259 + number of merges is smaller
//    than asked (n_vocab() reports it). Algorithm: counts over unique pieces with their frequencies, a
//    pair → pieces index, incremental count updates, a max-heap with lazy invalidation.
//  * BPE encoding: per piece, the learned merges are applied lowest rank first (leftmost first among
//    equal ranks), with a linked list + min-heap: O(n log n) per piece, never quadratic. Repeated pieces
//    are looked up in a per-call cache.
//  * Char / word tokenizers: `fit` builds the vocabulary from a text. Char: the distinct code points,
//    ordered by code point. Word: the distinct pre-tokenizer pieces (a word keeps its leading space, so
//    decoding is exact), ordered by count (most frequent first), ties by bytes. Unknown items at encode
//    time: a ValueError naming the item and its position, unless the tokenizer was fit with unk = true:
//    then a regular token unk_token = N_V − 4 stands for them (decoded as U+FFFD by the char tokenizer and
//    as "<unk>" by the word tokenizer).
//  * Decoding: special ids are skipped (skip_special = true, the default) or rendered as "<mask>",
//    "<bos>", "<eos>". Ids outside [0, N_V) are an IndexError.
//  * Save format: JSON (docs/tokenization.md), human-readable, checked completely on load (ValueError on
//    anything corrupt or truncated).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "formal_transformers/common.hpp"

namespace ft {

using token_t = std::int32_t;

// ---------------------------------------------------------------------------------------------------
// UTF-8 (with surrogates as Python's "surrogatepass" writes them).
namespace utf8 {
enum class Errors { Replace, Ignore, Strict };
Errors parse_errors(const std::string& name);  // "replace" | "ignore" | "strict", else ValueError
// Decode one code point at s[i]; returns its length in bytes (>= 1). A byte that does not start a valid
// sequence gives cp = -1 and the length of the maximal invalid subpart (Python's rule).
int next(std::string_view s, std::size_t i, std::int32_t& cp);
void append(std::string& out, std::uint32_t cp);  // surrogates as ED A0..BF 80..BF
// Bytes -> valid UTF-8 plus surrogates (see the header comment for `errors`).
std::string sanitize(std::string_view bytes, Errors errors);
std::size_t count_code_points(std::string_view s, std::size_t end_byte);
}  // namespace utf8

// ---------------------------------------------------------------------------------------------------
// Pre-tokenizer (GPT-2's rule, see above).
enum class CharClass : std::uint8_t { Other = 0, Letter = 1, Number = 2, Space = 3 };
CharClass char_class(std::int32_t cp);  // cp = -1 (not UTF-8) is Other
// Pieces of `text` as consecutive byte ranges [b, e) covering it exactly. `f(b, e)` is called in order.
template <class F>
void for_each_piece(std::string_view text, F&& f);
std::vector<std::pair<std::size_t, std::size_t>> pretokenize(std::string_view text);

// ---------------------------------------------------------------------------------------------------
// The layout of §4 for a vocabulary of n_regular regular tokens.
struct Specials {
    token_t n_vocab = 0;
    token_t mask() const { return n_vocab - 3; }
    token_t bos() const { return n_vocab - 2; }
    token_t eos() const { return n_vocab - 1; }
    bool is_special(token_t id) const { return id >= n_vocab - 3 && id < n_vocab; }
    const char* name(token_t id) const;  // "<mask>", "<bos>", "<eos>"
};

// Ids of a decode call: checked against n_vocab (IndexError naming the position).
void check_ids(const token_t* ids, std::size_t n, token_t n_vocab, const char* who);

// ---------------------------------------------------------------------------------------------------
class BPETokenizer {
public:
    using Merge = std::pair<token_t, token_t>;  // (left id, right id) -> id 256 + rank

    // Train on `text` up to n_vocab tokens in all (>= 259 = 256 bytes + 3 specials, else ValueError).
    static BPETokenizer train(std::string_view text, index_t n_vocab, index_t min_frequency = 2);
    // From a merge list (checked: merge k may only use ids < 256 + k, no repeats; else ValueError).
    static BPETokenizer from_merges(std::vector<Merge> merges);

    // text (UTF-8 bytes) -> [bos] ids [eos]
    std::vector<token_t> encode(std::string_view text, bool bos = true, bool eos = true) const;
    // Several texts; each gets its own bos/eos. Shares one piece cache.
    std::vector<std::vector<token_t>> encode_batch(const std::vector<std::string_view>& texts, bool bos = true,
                                                   bool eos = true) const;
    // ids -> the concatenated token bytes (specials skipped or rendered as "<mask>" ...)
    std::string decode_bytes(const token_t* ids, std::size_t n, bool skip_special = true) const;
    // ids -> text (UTF-8 + surrogates; invalid byte sequences handled by `errors`)
    std::string decode(const token_t* ids, std::size_t n, bool skip_special = true,
                       utf8::Errors errors = utf8::Errors::Replace) const;

    token_t n_vocab() const { return sp_.n_vocab; }
    const Specials& specials() const { return sp_; }
    const std::vector<Merge>& merges() const { return merges_; }
    const std::string& token_bytes(token_t id) const;  // regular ids only (IndexError otherwise)
    std::string to_json() const;
    static BPETokenizer from_json(std::string_view json);
    bool operator==(const BPETokenizer& o) const { return merges_ == o.merges_; }

    // Encode one pre-tokenized piece (bytes), appending ids to `out` (exposed for tests).
    void encode_piece(std::string_view piece, std::vector<token_t>& out) const;
    // The naive reference: repeatedly merge the lowest-rank pair present, all its occurrences left to
    // right (GPT-2's encoder.py loop). O(n²) per piece; tests compare it with encode_piece.
    void encode_piece_naive(std::string_view piece, std::vector<token_t>& out) const;

private:
    BPETokenizer() = default;
    void build();  // vocab bytes, merge lookup, specials from merges_

    std::vector<Merge> merges_;
    std::vector<std::string> vocab_;  // bytes of every regular id
    // (left << 32 | right) -> rank, open addressing
    std::vector<std::uint64_t> mkeys_;
    std::vector<token_t> mranks_;
    std::uint64_t mmask_ = 0;
    Specials sp_;
    token_t rank_of(token_t a, token_t b) const;  // -1 if no merge
};

// ---------------------------------------------------------------------------------------------------
class CharTokenizer {
public:
    // Vocabulary: the distinct code points of `text` by code point (+ unk when asked). Empty text is a
    // ValueError.
    static CharTokenizer fit(std::string_view text, bool unk = false);
    static CharTokenizer from_chars(std::vector<std::uint32_t> chars, bool unk);  // sorted, unique (checked)

    std::vector<token_t> encode(std::string_view text, bool bos = true, bool eos = true) const;
    std::string decode(const token_t* ids, std::size_t n, bool skip_special = true) const;

    token_t n_vocab() const { return sp_.n_vocab; }
    const Specials& specials() const { return sp_; }
    bool has_unk() const { return unk_; }
    token_t unk_token() const { return unk_ ? token_t(chars_.size()) : -1; }
    const std::vector<std::uint32_t>& chars() const { return chars_; }
    std::string to_json() const;
    static CharTokenizer from_json(std::string_view json);
    bool operator==(const CharTokenizer& o) const { return chars_ == o.chars_ && unk_ == o.unk_; }

private:
    CharTokenizer() = default;
    token_t lookup(std::uint32_t cp) const;  // -1 if unknown
    std::vector<std::uint32_t> chars_;
    token_t ascii_[256];
    bool unk_ = false;
    Specials sp_;
};

// ---------------------------------------------------------------------------------------------------
class WordTokenizer {
public:
    // Vocabulary: the distinct pre-tokenizer pieces of `text` seen at least min_count times, most frequent
    // first (ties by bytes), at most max_words of them (0: no limit) (+ unk when asked).
    static WordTokenizer fit(std::string_view text, bool unk = false, index_t min_count = 1, index_t max_words = 0);
    static WordTokenizer from_words(std::vector<std::string> words, bool unk);  // unique, non-empty (checked)

    std::vector<token_t> encode(std::string_view text, bool bos = true, bool eos = true) const;
    std::string decode(const token_t* ids, std::size_t n, bool skip_special = true) const;

    token_t n_vocab() const { return sp_.n_vocab; }
    const Specials& specials() const { return sp_; }
    bool has_unk() const { return unk_; }
    token_t unk_token() const { return unk_ ? token_t(words_.size()) : -1; }
    const std::vector<std::string>& words() const { return words_; }
    std::string to_json() const;
    static WordTokenizer from_json(std::string_view json);
    bool operator==(const WordTokenizer& o) const { return words_ == o.words_ && unk_ == o.unk_; }

private:
    WordTokenizer() = default;
    void build();
    std::vector<std::string> words_;
    std::vector<token_t> table_;  // open addressing: index into words_ or -1 (no pointers: safe to move)
    std::uint64_t tmask_ = 0;
    bool unk_ = false;
    Specials sp_;
    token_t lookup(std::string_view w) const;
};

// ---------------------------------------------------------------------------------------------------
// §4: "If ℓ > ℓ_max, x is split into chunks of length ≤ ℓ_max". Windows [b, e) over a sequence of length
// n: starts 0, stride, 2·stride, ...; each e = min(b + l_max, n); the last window is the first that
// reaches n. stride = l_max (the default) gives disjoint pieces whose concatenation is the sequence;
// 1 <= stride < l_max gives overlapping windows. n = 0 gives no window. ValueError on l_max < 1 or stride
// outside [1, l_max].
std::vector<std::pair<index_t, index_t>> chunk_bounds(index_t n, index_t l_max, index_t stride);

// ---------------------------------------------------------------------------------------------------
// The pre-tokenizer, inline so that the scanners of the tokenizers can use it without a call per piece.
namespace detail {
extern const std::uint8_t ascii_class[128];
CharClass class_of_non_ascii(std::int32_t cp);
inline int decode_at(std::string_view s, std::size_t i, std::int32_t& cp, CharClass& k) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
        cp = c;
        k = CharClass(ascii_class[c]);
        return 1;
    }
    const int len = utf8::next(s, i, cp);
    k = class_of_non_ascii(cp);
    return len;
}
}  // namespace detail

inline CharClass char_class(std::int32_t cp) {
    if (cp >= 0 && cp < 0x80) return CharClass(detail::ascii_class[cp]);
    return detail::class_of_non_ascii(cp);
}

template <class F>
void for_each_piece(std::string_view s, F&& f) {
    const std::size_t n = s.size();
    std::size_t i = 0;
    std::int32_t cp;
    CharClass k;
    // the run of characters of class `want` starting at j
    auto run = [&](std::size_t j, CharClass want) {
        while (j < n) {
            std::int32_t c2;
            CharClass k2;
            const int l = detail::decode_at(s, j, c2, k2);
            if (k2 != want) break;
            j += std::size_t(l);
        }
        return j;
    };
    while (i < n) {
        const int len = detail::decode_at(s, i, cp, k);
        // 's|'t|'re|'ve|'m|'ll|'d
        if (cp == '\'' && i + 1 < n) {
            const char a = s[i + 1];
            if (a == 's' || a == 't' || a == 'm' || a == 'd') {
                f(i, i + 2);
                i += 2;
                continue;
            }
            if (i + 2 < n) {
                const char b = s[i + 2];
                if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
                    f(i, i + 3);
                    i += 3;
                    continue;
                }
            }
        }
        if (k != CharClass::Space) {  // \p{L}+ | \p{N}+ | [^\s\p{L}\p{N}]+
            const std::size_t e = run(i + std::size_t(len), k);
            f(i, e);
            i = e;
            continue;
        }
        // whitespace at i
        if (cp == ' ' && i + 1 < n) {  // ' ?\p{L}+' etc.: a single space joins the piece after it
            std::int32_t c2;
            CharClass k2;
            detail::decode_at(s, i + 1, c2, k2);
            if (k2 != CharClass::Space) {
                const std::size_t e = run(i + 1, k2);
                f(i, e);
                i = e;
                continue;
            }
        }
        // \s+(?!\S) | \s+ : the whitespace run, leaving its last character to the next piece when a
        // non-space follows (and the run has at least two characters)
        std::size_t j = i, last = i;
        while (j < n) {
            std::int32_t c2;
            CharClass k2;
            const int l = detail::decode_at(s, j, c2, k2);
            if (k2 != CharClass::Space) break;
            last = j;
            j += std::size_t(l);
        }
        if (j < n && last > i) j = last;
        f(i, j);
        i = j;
    }
}

}  // namespace ft
