// Paper §4 (tokenization): the pre-tokenizer, UTF-8 handling, byte-level BPE (hand-worked training and
// encoding, heap encoder vs GPT-2's naive loop, no quadratic behaviour), char/word tokenizers, chunking,
// the JSON format and its corruption checks. Expected values are worked out by hand in the comments.
#include <chrono>
#include <string>
#include <vector>

#include "formal_transformers/tokenizer.hpp"
#include "testing.hpp"

using namespace ft;
using V = std::vector<token_t>;

namespace {
std::vector<std::string> pieces(std::string_view s) {
    std::vector<std::string> out;
    for (auto [b, e] : pretokenize(s)) out.emplace_back(s.substr(b, e - b));
    return out;
}
using S = std::vector<std::string>;
}  // namespace

// ---------------------------------------------------------------------------------------------------
TEST(TokenizerPretokenize, Gpt2Rule) {
    // ' ?\p{L}+' keeps one leading space; "'s" is a contraction; '\s+(?!\S)' leaves the last space of a run
    // to the next word; a trailing run stays whole.
    EXPECT_EQ(pieces("Hello, world! It's  3.14 done\n\n  x  "),
              (S{"Hello", ",", " world", "!", " It", "'s", " ", " 3", ".", "14", " done", "\n\n ", " x", "  "}));
    EXPECT_EQ(pieces("don't we'll they're I've 'S"), (S{"don", "'t", " we", "'ll", " they", "'re", " I", "'ve", " '", "S"}));
    EXPECT_EQ(pieces("a\nb"), (S{"a", "\n", "b"}));          // a single non-space whitespace is its own piece
    EXPECT_EQ(pieces("a\n\nb"), (S{"a", "\n", "\n", "b"}));  // run of 2: all but the last, then the last
    EXPECT_EQ(pieces("a \tb"), (S{"a", " ", "\t", "b"}));
    EXPECT_EQ(pieces("x!!'s"), (S{"x", "!!'", "s"}));        // a punctuation run swallows the apostrophe
    EXPECT_EQ(pieces("abc123def"), (S{"abc", "123", "def"}));
    EXPECT_EQ(pieces(""), S{});
    EXPECT_EQ(pieces(" "), S{" "});
    // Unicode: é is a letter, ² a number (No), U+3000 a space, 😀 other
    EXPECT_EQ(pieces("caf\xC3\xA9 x\xC2\xB2 \xE3\x80\x80y \xF0\x9F\x98\x80!"),
              (S{"caf\xC3\xA9", " x", "\xC2\xB2", " ", "\xE3\x80\x80", "y", " \xF0\x9F\x98\x80!"}));
    // a lone surrogate (surrogatepass bytes) and bytes that are not UTF-8 are "other"
    EXPECT_EQ(pieces("a\xED\xA0\x80\xFF b"), (S{"a", "\xED\xA0\x80\xFF", " b"}));
}

TEST(TokenizerPretokenize, CharClasses) {
    EXPECT_EQ(char_class('a'), CharClass::Letter);
    EXPECT_EQ(char_class('7'), CharClass::Number);
    EXPECT_EQ(char_class(' '), CharClass::Space);
    EXPECT_EQ(char_class(0x1C), CharClass::Other);     // not White_Space (str.isspace says yes)
    EXPECT_EQ(char_class(0x85), CharClass::Space);     // NEL
    EXPECT_EQ(char_class(0xA0), CharClass::Space);     // NBSP
    EXPECT_EQ(char_class(0xAA), CharClass::Letter);    // ª Lo
    EXPECT_EQ(char_class(0xD7), CharClass::Other);     // × Sm
    EXPECT_EQ(char_class(0x4E2D), CharClass::Letter);  // 中
    EXPECT_EQ(char_class(0x0663), CharClass::Number);  // Arabic-Indic three
    EXPECT_EQ(char_class(0x2164), CharClass::Number);  // Roman numeral five (Nl)
    EXPECT_EQ(char_class(0xD800), CharClass::Other);   // surrogate
    EXPECT_EQ(char_class(0x1F600), CharClass::Other);  // emoji (So)
    EXPECT_EQ(char_class(0x10FFFF), CharClass::Other);
    EXPECT_EQ(char_class(-1), CharClass::Other);
}

// ---------------------------------------------------------------------------------------------------
TEST(TokenizerUtf8, PythonReplaceRule) {
    // U+FFFD per maximal invalid subpart, as bytes.decode("utf-8", "replace"); surrogates pass
    const std::string R = "\xEF\xBF\xBD";
    EXPECT_EQ(utf8::sanitize("a\xE2\x82\xAC", utf8::Errors::Replace), "a\xE2\x82\xAC");   // €
    EXPECT_EQ(utf8::sanitize("\xE2\x82", utf8::Errors::Replace), R);                       // truncated: one
    EXPECT_EQ(utf8::sanitize("\xE2\x82x", utf8::Errors::Replace), R + "x");
    EXPECT_EQ(utf8::sanitize("\xF0\x9F\x98", utf8::Errors::Replace), R);
    EXPECT_EQ(utf8::sanitize("\xC0\xAF", utf8::Errors::Replace), R + R);                   // overlong: two
    EXPECT_EQ(utf8::sanitize("\xE0\x80\x80", utf8::Errors::Replace), R + R + R);
    EXPECT_EQ(utf8::sanitize("\xF4\x90\x80\x80", utf8::Errors::Replace), R + R + R + R);   // > U+10FFFF
    EXPECT_EQ(utf8::sanitize("\xFF", utf8::Errors::Replace), R);
    EXPECT_EQ(utf8::sanitize("\xED\xA0\x80", utf8::Errors::Replace), "\xED\xA0\x80");     // surrogate passes
    EXPECT_EQ(utf8::sanitize("\xED\xA0" "A", utf8::Errors::Replace), R + R + "A");         // not a whole one
    EXPECT_EQ(utf8::sanitize("a\xFF" "b", utf8::Errors::Ignore), "ab");
    EXPECT_THROW(utf8::sanitize("a\xFF", utf8::Errors::Strict), ValueError);
    std::int32_t cp;
    EXPECT_EQ(utf8::next("\xF0\x9F\x98\x80", 0, cp), 4);
    EXPECT_EQ(cp, 0x1F600);
    EXPECT_EQ(utf8::next("\xED\xBF\xBF", 0, cp), 3);
    EXPECT_EQ(cp, 0xDFFF);
}

// ---------------------------------------------------------------------------------------------------
// The classic example "aaabdaaabac" (one piece: all letters). Bytes a=97 b=98 c=99 d=100.
//   pairs: (a,a)×4 (overlaps count), (a,b)×2, (b,d), (d,a), (b,a), (a,c)
//   merge 0: (97,97) -> 256:           256 a b d 256 a b a c
//   pairs: (256,a)×2, (a,b)×2, ... tie at 2: the smaller pair (97,98) < (256,97)
//   merge 1: (97,98) -> 257:           256 257 d 256 257 a c
//   merge 2: (256,257) -> 258 (×2):    258 d 258 a c
//   every pair now occurs once < min_frequency = 2: stop with 3 merges, N_V = 256 + 3 + 3 = 262.
TEST(TokenizerBPE, HandWorkedTraining) {
    BPETokenizer t = BPETokenizer::train("aaabdaaabac", 1000);
    ASSERT_EQ(t.merges(), (std::vector<BPETokenizer::Merge>{{97, 97}, {97, 98}, {256, 257}}));
    EXPECT_EQ(t.n_vocab(), 262);
    EXPECT_EQ(t.specials().mask(), 259);
    EXPECT_EQ(t.specials().bos(), 260);
    EXPECT_EQ(t.specials().eos(), 261);
    EXPECT_EQ(t.token_bytes(258), "aaab");
    EXPECT_EQ(t.encode("aaabdaaabac", false, false), (V{258, 100, 258, 97, 99}));
    EXPECT_EQ(t.encode("aaabdaaabac"), (V{260, 258, 100, 258, 97, 99, 261}));
    // "aaaa": rank 0 left to right -> 256 256
    EXPECT_EQ(t.encode("aaaa", false, false), (V{256, 256}));
    // "aaa": 256 a (the second (a,a) overlaps the first)
    EXPECT_EQ(t.encode("aaa", false, false), (V{256, 97}));
    // pieces "ab" and " aab": 257 | 32 (a a)->256 b; (256, b) is not a merge
    EXPECT_EQ(t.encode("ab aab", false, true), (V{257, 32, 256, 98, 261}));
    // merges never cross pieces: "a a" is "a", " a"
    EXPECT_EQ(t.encode("a a", false, false), (V{97, 32, 97}));
    // n_vocab caps the merges: 260 = 256 + 1 merge + 3
    BPETokenizer t1 = BPETokenizer::train("aaabdaaabac", 260);
    EXPECT_EQ(t1.merges(), (std::vector<BPETokenizer::Merge>{{97, 97}}));
    // min_frequency = 1 goes on: pairs of 258 d 258 a c all once; the smallest is (97, 99)
    BPETokenizer t2 = BPETokenizer::train("aaabdaaabac", 263, 1);
    EXPECT_EQ(t2.merges().back(), (BPETokenizer::Merge{97, 99}));
}

TEST(TokenizerBPE, TieBreakSmallestPair) {
    // pieces "ba", " ab": pairs (98,97), (32,97), (97,98) once each; the smallest is (32, 97)
    BPETokenizer t = BPETokenizer::train("ba ab", 260, 1);
    EXPECT_EQ(t.merges(), (std::vector<BPETokenizer::Merge>{{32, 97}}));
}

TEST(TokenizerBPE, SmallVocabularyIsAnError) {
    EXPECT_THROW(BPETokenizer::train("abc", 258), ValueError);
    EXPECT_NO_THROW(BPETokenizer::train("abc", 259));
    EXPECT_THROW(BPETokenizer::train("abc", 300, 0), ValueError);
    EXPECT_EQ(BPETokenizer::train("", 300).n_vocab(), 259);
}

// A run of 128 a's: pair counts 127, 63, 31, 15, 7, 3 -> merges (a,a)->256, (256,256)->257, ...,
// (260,260)->261 (64 a's); then (261,261) occurs once < min_frequency.
// Encoding 100 a's: 64 + 32 + 4 -> 261 260 257. A million a's must be fast (the encoder is O(n log n)).
TEST(TokenizerBPE, LongRunsAreNotQuadratic) {
    BPETokenizer t = BPETokenizer::train(std::string(128, 'a'), 1000);
    ASSERT_EQ(t.merges(), (std::vector<BPETokenizer::Merge>{{97, 97}, {256, 256}, {257, 257}, {258, 258}, {259, 259}, {260, 260}}));
    EXPECT_EQ(t.encode(std::string(100, 'a'), false, false), (V{261, 260, 257}));
    const auto t0 = std::chrono::steady_clock::now();
    const V ids = t.encode(std::string(1 << 20, 'a'), false, false);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(ids, V(1 << 14, 261));
    EXPECT_LT(sec, 10.0);  // ~0.1 s in a release build; a quadratic encoder needs ~10^12 steps here
    // a long piece of varied letters too (training on it included)
    Rng rng(7);
    std::string s;
    for (int i = 0; i < (1 << 18); ++i) s.push_back(char('a' + rng.below(4)));
    const auto t1 = std::chrono::steady_clock::now();
    BPETokenizer t2 = BPETokenizer::train(s, 600);
    const V ids2 = t2.encode(s, false, false);
    const double sec2 = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    EXPECT_EQ(t2.decode_bytes(ids2.data(), ids2.size()), s);
    EXPECT_LT(sec2, 60.0);
}

// The heap encoder against GPT-2's loop (merge the lowest-rank pair everywhere, repeat) on random pieces.
TEST(TokenizerBPE, HeapEncoderMatchesNaiveLoop) {
    Rng rng(11);
    std::string train_text;
    for (int i = 0; i < 20000; ++i) train_text.push_back(char('a' + rng.below(3)));
    BPETokenizer t = BPETokenizer::train(train_text, 400);
    ASSERT_GT(t.merges().size(), 100u);
    for (int trial = 0; trial < 2000; ++trial) {
        std::string piece;
        const int n = 1 + int(rng.below(60));
        for (int i = 0; i < n; ++i) piece.push_back(char('a' + rng.below(trial % 2 ? 3 : 4)));
        V fast, naive;
        t.encode_piece(piece, fast);
        t.encode_piece_naive(piece, naive);
        ASSERT_EQ(fast, naive) << piece;
        ASSERT_EQ(t.decode_bytes(fast.data(), fast.size()), piece);
    }
}

TEST(TokenizerBPE, EveryByteRoundTripsAndSpecialsNeverArise) {
    Rng rng(3);
    std::string text;
    for (int i = 0; i < 50000; ++i) text.push_back(char(rng.below(256)));
    text += "<mask><bos><eos> <mask>";
    BPETokenizer t = BPETokenizer::train(text, 512);
    const V ids = t.encode(text, false, false);
    for (token_t v : ids) {
        ASSERT_GE(v, 0);
        ASSERT_LT(v, t.specials().mask());
    }
    EXPECT_EQ(t.decode_bytes(ids.data(), ids.size()), text);
    // skip_special = false renders the specials
    const V with = {t.specials().bos(), 'h', 'i', t.specials().mask(), t.specials().eos()};
    EXPECT_EQ(t.decode_bytes(with.data(), with.size(), false), "<bos>hi<mask><eos>");
    EXPECT_EQ(t.decode_bytes(with.data(), with.size(), true), "hi");
    const V bad = {1, t.n_vocab()};
    EXPECT_THROW(t.decode_bytes(bad.data(), bad.size()), IndexError);
    const V neg = {-1};
    EXPECT_THROW(t.decode_bytes(neg.data(), neg.size()), IndexError);
    EXPECT_THROW(t.token_bytes(t.specials().mask()), IndexError);
}

TEST(TokenizerBPE, FromMergesIsChecked) {
    EXPECT_THROW(BPETokenizer::from_merges({{97, 256}}), ValueError);          // 256 does not exist yet
    EXPECT_THROW(BPETokenizer::from_merges({{97, 97}, {97, 97}}), ValueError);  // repeated
    EXPECT_THROW(BPETokenizer::from_merges({{-1, 97}}), ValueError);
    BPETokenizer t = BPETokenizer::from_merges({{104, 105}, {32, 256}});  // "hi", " hi"
    // pieces "hi", "!", " hi": 256 | 33 | 32 104 105 -> 32 256 -> 257
    EXPECT_EQ(t.encode("hi! hi", false, false), (V{256, 33, 257}));
}

TEST(TokenizerBPE, JsonRoundTripAndCorruption) {
    BPETokenizer t = BPETokenizer::train("the cat sat on the mat, the end\n\xFF\xFE", 290, 1);
    const std::string js = t.to_json();
    BPETokenizer u = BPETokenizer::from_json(js);
    EXPECT_TRUE(u == t);
    EXPECT_EQ(u.to_json(), js);
    // truncations anywhere are corrupt files
    for (std::size_t n = 0; n < js.size() - 2; n += 7) EXPECT_THROW(BPETokenizer::from_json(js.substr(0, n)), ValueError) << n;
    auto replaced = [&](const std::string& a, const std::string& b) {
        std::string s = js;
        const auto p = s.find(a);
        EXPECT_NE(p, std::string::npos) << a;
        return s.replace(p, a.size(), b);
    };
    EXPECT_THROW(BPETokenizer::from_json(replaced("\"type\": \"bpe\"", "\"type\": \"char\"")), ValueError);
    EXPECT_THROW(BPETokenizer::from_json(replaced("\"version\": 1", "\"version\": 2")), ValueError);
    EXPECT_THROW(BPETokenizer::from_json(replaced("\"n_vocab\": ", "\"n_vocab\": 1")), ValueError);
    EXPECT_THROW(BPETokenizer::from_json(replaced("\"merges\": [\n    [", "\"merges\": [\n    [9999, ")), ValueError);
    EXPECT_THROW(BPETokenizer::from_json(replaced("\"<bos>\"", "\"<BOS>\"")), ValueError);
    EXPECT_THROW(BPETokenizer::from_json(js + "x"), ValueError);
    EXPECT_THROW(BPETokenizer::from_json("[]"), ValueError);
    EXPECT_THROW(BPETokenizer::from_json(""), ValueError);
}

// ---------------------------------------------------------------------------------------------------
TEST(TokenizerChar, FitEncodeDecode) {
    // "hello": e h l o by code point -> e=0 h=1 l=2 o=3; specials 4, 5, 6
    CharTokenizer t = CharTokenizer::fit("hello");
    EXPECT_EQ(t.n_vocab(), 7);
    EXPECT_EQ(t.encode("hole"), (V{5, 1, 3, 2, 0, 6}));
    EXPECT_EQ(t.encode("", false, false), V{});
    EXPECT_THROW(t.encode("help"), ValueError);  // 'p' is unknown
    const V ids = {5, 1, 0, 2, 2, 3, 4, 6};
    EXPECT_EQ(t.decode(ids.data(), ids.size()), "hello");
    EXPECT_EQ(t.decode(ids.data(), ids.size(), false), "<bos>hello<mask><eos>");
    // unk = true: unk_token = 4 (N_V - 4), decoded as U+FFFD
    CharTokenizer u = CharTokenizer::fit("hello", true);
    EXPECT_EQ(u.n_vocab(), 8);
    EXPECT_EQ(u.unk_token(), 4);
    EXPECT_EQ(u.encode("help", false, false), (V{1, 0, 2, 4}));
    const V uids = {1, 4};
    EXPECT_EQ(u.decode(uids.data(), uids.size()), "h\xEF\xBF\xBD");
    // non-ASCII and surrogates are characters like any other
    CharTokenizer w = CharTokenizer::fit("\xF0\x9F\x98\x80" "a\xED\xA0\x80");  // U+1F600, a, U+D800
    EXPECT_EQ(w.chars(), (std::vector<std::uint32_t>{'a', 0xD800, 0x1F600}));
    EXPECT_EQ(CharTokenizer::from_json(w.to_json()), w);
    EXPECT_THROW(CharTokenizer::fit(""), ValueError);
}

TEST(TokenizerWord, FitEncodeDecode) {
    // pieces of "the cat the hat": "the" " cat" " the" " hat" (each once, ties by bytes:
    // " cat" < " hat" < " the" < "the")
    WordTokenizer t = WordTokenizer::fit("the cat the hat the");
    // counts: "the" 1, " cat" 1, " the" 2, " hat" 1 -> " the"=0, then " cat"=1, " hat"=2, "the"=3
    EXPECT_EQ(t.words(), (std::vector<std::string>{" the", " cat", " hat", "the"}));
    EXPECT_EQ(t.n_vocab(), 7);
    EXPECT_EQ(t.encode("the hat the cat", false, false), (V{3, 2, 0, 1}));
    EXPECT_THROW(t.encode("the dog"), ValueError);
    const V ids = {5, 3, 2, 6};
    EXPECT_EQ(t.decode(ids.data(), ids.size()), "the hat");
    WordTokenizer u = WordTokenizer::fit("the cat the hat the", true, 2);  // min_count 2: only " the"
    EXPECT_EQ(u.words(), (std::vector<std::string>{" the"}));
    EXPECT_EQ(u.unk_token(), 1);
    EXPECT_EQ(u.encode("the cat the", false, false), (V{1, 1, 0}));
    const V uids = {1, 0};
    EXPECT_EQ(u.decode(uids.data(), uids.size()), "<unk> the");
    EXPECT_EQ(WordTokenizer::fit("a b c d", false, 1, 2).words().size(), 2u);
    EXPECT_EQ(WordTokenizer::from_json(t.to_json()), t);
    EXPECT_THROW(WordTokenizer::from_words({"two words"}, false), ValueError);  // not one piece
    EXPECT_THROW(WordTokenizer::from_words({"a", "a"}, false), ValueError);
}

// ---------------------------------------------------------------------------------------------------
TEST(TokenizerChunk, Bounds) {
    using B = std::vector<std::pair<index_t, index_t>>;
    EXPECT_EQ(chunk_bounds(10, 4, 4), (B{{0, 4}, {4, 8}, {8, 10}}));
    EXPECT_EQ(chunk_bounds(8, 4, 4), (B{{0, 4}, {4, 8}}));
    EXPECT_EQ(chunk_bounds(3, 4, 4), (B{{0, 3}}));
    EXPECT_EQ(chunk_bounds(0, 4, 4), B{});
    EXPECT_EQ(chunk_bounds(10, 4, 2), (B{{0, 4}, {2, 6}, {4, 8}, {6, 10}}));
    EXPECT_EQ(chunk_bounds(11, 4, 3), (B{{0, 4}, {3, 7}, {6, 10}, {9, 11}}));
    EXPECT_THROW(chunk_bounds(10, 0, 1), ValueError);
    EXPECT_THROW(chunk_bounds(10, 4, 5), ValueError);
    EXPECT_THROW(chunk_bounds(10, 4, 0), ValueError);
}

// ---------------------------------------------------------------------------------------------------
// Other projects' files (docs/tokenization.md "Hugging Face and GPT-2 files"), worked by hand.
TEST(TokenizerBPEFiles, Gpt2FilesKeepTheirIdsAndDropBytesWithoutToken) {
    // Only 'a', 'b' have tokens; merge "a b" makes "ab" (id 2); <|endoftext|> is made by no merge: special.
    const std::string vocab = R"({"a": 0, "b": 1, "ab": 2, "<|endoftext|>": 3})";
    const std::string merges = "#version: 0.2\na b\n";
    const BPETokenizer t = BPETokenizer::from_gpt2_files(vocab, merges);
    EXPECT_EQ(t.n_vocab(), 4);
    EXPECT_EQ(t.specials().bos(), -1);
    EXPECT_EQ(t.specials().eos(), -1);
    // pieces "abc", " ab": 'c' and ' ' have no token and are dropped (as HF does) -> "ab", "ab"
    EXPECT_EQ(t.encode("abc ab", false, false), (V{2, 2}));
    EXPECT_EQ(t.encode("bab", false, false), (V{1, 2}));  // merges inside the piece only, leftmost first
    EXPECT_THROW(t.encode("ab"), ValueError);            // no bos token named
    const V ids = {2, 3, 0};
    EXPECT_EQ(t.decode(ids.data(), ids.size()), "aba");
    EXPECT_EQ(t.decode(ids.data(), ids.size(), false), "ab<|endoftext|>a");
    BPETokenizer::Roles r;
    r.bos = r.eos = "<|endoftext|>";
    const BPETokenizer u = BPETokenizer::from_gpt2_files(vocab, merges, r);
    EXPECT_EQ(u.encode("ab"), (V{3, 2, 3}));
    EXPECT_EQ(BPETokenizer::from_json(u.to_json()), u);  // our save format keeps the file's ids and roles
    EXPECT_EQ(BPETokenizer::from_gpt2_files(u.to_gpt2_files().first, u.to_gpt2_files().second, r), u);
    // broken layouts
    EXPECT_THROW(BPETokenizer::from_gpt2_files(R"({"a": 0, "b": 2})", ""), ValueError);          // id 1 unused
    EXPECT_THROW(BPETokenizer::from_gpt2_files(R"({"a": 0, "b": 0})", ""), ValueError);          // id 0 twice
    EXPECT_THROW(BPETokenizer::from_gpt2_files(R"({"a": 0, "b": 1})", "a b\n"), ValueError);     // "ab" missing
    EXPECT_THROW(BPETokenizer::from_gpt2_files(R"({"a": 0, "b": 1, "ab": 2})", "a  b\n"), ValueError);
    r.bos = "<s>";
    EXPECT_THROW(BPETokenizer::from_gpt2_files(vocab, merges, r), ValueError);  // not a special token
}

TEST(TokenizerBPEFiles, HfJsonOfOurOwnLayoutIsOurs) {
    const BPETokenizer t = BPETokenizer::from_merges({{'a', 'a'}, {'a', 'b'}, {256, 257}});
    const BPETokenizer u = BPETokenizer::from_hf_json(t.to_hf_json());
    EXPECT_EQ(u, t);
    EXPECT_TRUE(u.file_ids().empty());
    EXPECT_EQ(u.encode("aaab"), (V{260, 258, 261}));
    EXPECT_THROW(BPETokenizer::from_hf_json(R"({"model": {"type": "WordPiece", "vocab": {}}})"), ValueError);
    EXPECT_THROW(BPETokenizer::from_hf_json("{"), ValueError);
}
