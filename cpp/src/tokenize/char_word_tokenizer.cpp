// Paper §4: the character-level and word-level tokenizers. The rules and design decisions are in
// tokenizer.hpp and docs/tokenization.md.
#include <algorithm>
#include <functional>

#include <tsl/robin_map.h>

#include "formal_transformers/tokenizer.hpp"
#include "tokenizer_internal.hpp"

namespace ft {
using namespace tok;


// =====================================================================================================
// Character-level tokenizer
namespace {
// The code points of text (must be UTF-8 + surrogates, as a Python str gives).
template <class F>
void for_each_code_point(std::string_view text, const char* who, F&& f) {
    std::size_t i = 0, k = 0;
    while (i < text.size()) {
        std::int32_t cp;
        const int len = utf8::next(text, i, cp);
        if (cp < 0)
            throw ValueError(std::string(who) + ": the text is not valid UTF-8 at byte " + std::to_string(i));
        f(std::uint32_t(cp), i, std::size_t(len), k);
        i += std::size_t(len);
        ++k;
    }
}

std::string describe_char(std::uint32_t cp) {
    std::string c;
    utf8::append(c, cp);
    return quote(c) + " (" + code_point_name(cp) + ")";
}
}  // namespace

CharTokenizer CharTokenizer::from_chars(std::vector<std::uint32_t> chars, bool unk) {
    for (std::size_t k = 0; k < chars.size(); ++k) {
        if (chars[k] > 0x10FFFF) throw ValueError("CharTokenizer: " + code_point_name(chars[k]) + " is not a code point");
        if (k && chars[k] <= chars[k - 1])
            throw ValueError("CharTokenizer: the characters must be distinct and in code point order (" +
                             describe_char(chars[k]) + " at index " + std::to_string(k) + ")");
    }
    check_n_vocab_fits(chars.size() + 1, "CharTokenizer");
    CharTokenizer t;
    t.chars_ = std::move(chars);
    t.unk_ = unk;
    std::fill(std::begin(t.ascii_), std::end(t.ascii_), token_t(-1));
    for (std::size_t k = 0; k < t.chars_.size() && t.chars_[k] < 256; ++k) t.ascii_[t.chars_[k]] = token_t(k);
    t.sp_ = Specials::layout(token_t(t.chars_.size() + (unk ? 1 : 0) + 3));
    return t;
}

CharTokenizer CharTokenizer::fit(std::string_view text, bool unk) {
    if (text.empty()) throw ValueError("CharTokenizer.fit: the text is empty (no characters to build a vocabulary)");
    std::vector<bool> seen(0x110000, false);
    for_each_code_point(text, "CharTokenizer.fit", [&](std::uint32_t cp, std::size_t, std::size_t, std::size_t) { seen[cp] = true; });
    std::vector<std::uint32_t> chars;
    for (std::uint32_t c = 0; c < 0x110000; ++c)
        if (seen[c]) chars.push_back(c);
    return from_chars(std::move(chars), unk);
}

token_t CharTokenizer::lookup(std::uint32_t cp) const {
    if (cp < 256) return ascii_[cp];
    auto it = std::lower_bound(chars_.begin(), chars_.end(), cp);
    return it != chars_.end() && *it == cp ? token_t(it - chars_.begin()) : token_t(-1);
}

std::vector<token_t> CharTokenizer::encode(std::string_view text, bool bos, bool eos) const {
    std::vector<token_t> out;
    out.reserve(text.size() + 2);
    if (bos) out.push_back(sp_.bos());
    for_each_code_point(text, "CharTokenizer.encode", [&](std::uint32_t cp, std::size_t, std::size_t, std::size_t k) {
        token_t v = lookup(cp);
        if (v < 0) {
            if (!unk_)
                throw ValueError("CharTokenizer.encode: character " + describe_char(cp) + " at position " +
                                 std::to_string(k) +
                                 " is not in the vocabulary (fit with unk=True to map unknown characters to unk_token)");
            v = unk_token();
        }
        out.push_back(v);
    });
    if (eos) out.push_back(sp_.eos());
    return out;
}

std::string CharTokenizer::decode(const token_t* ids, std::size_t n, bool skip_special) const {
    check_ids(ids, n, sp_.n_vocab, "decode");
    std::string out;
    out.reserve(n);
    for (std::size_t t = 0; t < n; ++t) {
        const token_t v = ids[t];
        if (v < token_t(chars_.size())) utf8::append(out, chars_[std::size_t(v)]);
        else if (v == unk_token()) out += "\xEF\xBF\xBD";  // U+FFFD
        else if (!skip_special) out += sp_.name(v);
    }
    return out;
}

std::string CharTokenizer::to_json() const {
    std::string out = json_header("char", sp_);
    out += std::string("  \"unk\": ") + (unk_ ? "true" : "false") + ",\n  \"chars\": [";
    for (std::size_t k = 0; k < chars_.size(); ++k) {
        out += k == 0 ? "" : (k % 16 == 0 ? ",\n    " : ", ");
        std::string c;
        utf8::append(c, chars_[k]);
        json_string(out, c);
    }
    out += "]\n}\n";
    return out;
}

CharTokenizer CharTokenizer::from_json(std::string_view doc) {
    const Json d = read_document(doc, "char");
    const bool unk = field_of(d, "unk", Json::value_t::boolean).get<bool>();
    const Json& a = field_of(d, "chars", Json::value_t::array);
    std::vector<std::uint32_t> chars;
    for (std::size_t k = 0; k < a.size(); ++k) {
        std::int32_t cp = -1;
        const std::string s = a[k].is_string() ? text(a[k]) : std::string();
        if (s.empty() || std::size_t(utf8::next(s, 0, cp)) != s.size() || cp < 0)
            corrupt("chars[" + std::to_string(k) + "] is not a string of exactly one character");
        chars.push_back(std::uint32_t(cp));
    }
    CharTokenizer t;
    try {
        t = from_chars(std::move(chars), unk);
    } catch (const ValueError& e) {
        corrupt(e.what());
    }
    check_layout(d, t.sp_);
    return t;
}

// =====================================================================================================
// Word-level tokenizer: the words are the pre-tokenizer's pieces.
namespace {
struct ViewHash {  // looks std::string keys up by string_view
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>()(s); }
};
struct ViewEqual {
    using is_transparent = void;
    bool operator()(std::string_view a, std::string_view b) const noexcept { return a == b; }
};
}  // namespace

struct WordTokenizer::Index {
    tsl::robin_map<std::string, token_t, ViewHash, ViewEqual> id;
};

void WordTokenizer::build() {
    check_n_vocab_fits(words_.size() + 1, "WordTokenizer");
    auto index = std::make_shared<Index>();
    index->id.reserve(words_.size());
    for (std::size_t k = 0; k < words_.size(); ++k) {
        const std::string& w = words_[k];
        if (w.empty()) throw ValueError("WordTokenizer: word " + std::to_string(k) + " is empty");
        std::size_t pieces = 0, first_end = 0;
        for_each_piece(w, [&](std::size_t, std::size_t e) {
            if (pieces++ == 0) first_end = e;
        });
        for_each_code_point(w, "WordTokenizer", [](std::uint32_t, std::size_t, std::size_t, std::size_t) {});
        if (pieces != 1 || first_end != w.size())
            throw ValueError("WordTokenizer: word " + std::to_string(k) + " " + quote(w) +
                             " is not a single piece of the pre-tokenizer, so no text would ever produce it");
        const auto [it, inserted] = index->id.try_emplace(w, token_t(k));
        if (!inserted)
            throw ValueError("WordTokenizer: word " + std::to_string(k) + " " + quote(w) + " repeats word " +
                             std::to_string(it->second));
    }
    index_ = std::move(index);
    sp_ = Specials::layout(token_t(words_.size() + (unk_ ? 1 : 0) + 3));
}

token_t WordTokenizer::lookup(std::string_view w) const {
    const auto it = index_->id.find(w);
    return it == index_->id.end() ? token_t(-1) : it->second;
}

WordTokenizer WordTokenizer::from_words(std::vector<std::string> words, bool unk) {
    WordTokenizer t;
    t.words_ = std::move(words);
    t.unk_ = unk;
    t.build();
    return t;
}

WordTokenizer WordTokenizer::fit(std::string_view text, bool unk, index_t min_count, index_t max_words) {
    if (text.empty()) throw ValueError("WordTokenizer.fit: the text is empty (no words to build a vocabulary)");
    if (min_count < 1) throw ValueError("WordTokenizer.fit: min_count must be >= 1, got " + std::to_string(min_count));
    if (max_words < 0) throw ValueError("WordTokenizer.fit: max_words must be >= 0 (0: no limit), got " + std::to_string(max_words));
    for_each_code_point(text, "WordTokenizer.fit", [](std::uint32_t, std::size_t, std::size_t, std::size_t) {});
    tsl::robin_map<std::string_view, std::int64_t> counts;
    for_each_piece(text, [&](std::size_t b, std::size_t e) { ++counts[text.substr(b, e - b)]; });
    std::vector<std::pair<std::int64_t, std::string_view>> items;
    for (auto& [w, c] : counts)
        if (c >= min_count) items.emplace_back(c, w);
    std::sort(items.begin(), items.end(), [](const auto& x, const auto& y) {
        return x.first != y.first ? x.first > y.first : x.second < y.second;
    });
    if (max_words > 0 && items.size() > std::size_t(max_words)) items.resize(std::size_t(max_words));
    std::vector<std::string> words;
    words.reserve(items.size());
    for (auto& it : items) words.emplace_back(it.second);
    return from_words(std::move(words), unk);
}

std::vector<token_t> WordTokenizer::encode(std::string_view text, bool bos, bool eos) const {
    for_each_code_point(text, "WordTokenizer.encode", [](std::uint32_t, std::size_t, std::size_t, std::size_t) {});
    std::vector<token_t> out;
    out.reserve(text.size() / 4 + 2);
    if (bos) out.push_back(sp_.bos());
    for_each_piece(text, [&](std::size_t b, std::size_t e) {
        const std::string_view w = text.substr(b, e - b);
        token_t v = lookup(w);
        if (v < 0) {
            if (!unk_)
                throw ValueError("WordTokenizer.encode: word " + quote(w) + " at position " +
                                 std::to_string(utf8::count_code_points(text, b)) +
                                 " is not in the vocabulary (fit with unk=True to map unknown words to unk_token)");
            v = unk_token();
        }
        out.push_back(v);
    });
    if (eos) out.push_back(sp_.eos());
    return out;
}

std::string WordTokenizer::decode(const token_t* ids, std::size_t n, bool skip_special) const {
    check_ids(ids, n, sp_.n_vocab, "decode");
    std::string out;
    for (std::size_t t = 0; t < n; ++t) {
        const token_t v = ids[t];
        if (v < token_t(words_.size())) out += words_[std::size_t(v)];
        else if (v == unk_token()) out += "<unk>";
        else if (!skip_special) out += sp_.name(v);
    }
    return out;
}

std::string WordTokenizer::to_json() const {
    std::string out = json_header("word", sp_);
    out += "  \"pre_tokenizer\": \"gpt2\",\n";
    out += std::string("  \"unk\": ") + (unk_ ? "true" : "false") + ",\n  \"words\": [";
    for (std::size_t k = 0; k < words_.size(); ++k) {
        out += k == 0 ? "" : (k % 8 == 0 ? ",\n    " : ", ");
        json_string(out, words_[k]);
    }
    out += "]\n}\n";
    return out;
}

WordTokenizer WordTokenizer::from_json(std::string_view doc) {
    const Json d = read_document(doc, "word");
    if (field_text(d, "pre_tokenizer") != "gpt2") corrupt("\"pre_tokenizer\" must be \"gpt2\"");
    const bool unk = field_of(d, "unk", Json::value_t::boolean).get<bool>();
    const Json& a = field_of(d, "words", Json::value_t::array);
    std::vector<std::string> words;
    for (std::size_t k = 0; k < a.size(); ++k) {
        if (!a[k].is_string()) corrupt("words[" + std::to_string(k) + "] is not a string");
        words.push_back(text(a[k]));
    }
    WordTokenizer t;
    try {
        t = from_words(std::move(words), unk);
    } catch (const ValueError& e) {
        corrupt(e.what());
    }
    check_layout(d, t.sp_);
    return t;
}

}  // namespace ft
