// What the tokenizers' sources share (private to the core): text rendering for messages and files, the
// hash-map keys, and the JSON save format (docs/tokenization.md) read with nlohmann-json.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "formal_transformers/tokenizer.hpp"

namespace ft::tok {

// Text for messages and the human-readable fields of the JSON file: printable characters as they are,
// control characters, surrogates and bytes that are not UTF-8 as \xNN / \uXXXX escapes, and the backslash
// doubled (so the rendering is unambiguous).
std::string render(std::string_view s);
std::string quote(std::string_view s);  // 'render(s)'
std::string code_point_name(std::uint32_t cp);  // U+XXXX

// A fast 64-bit mix (the hash of the integer-keyed maps).
inline std::uint64_t mix64(std::uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}
inline std::uint64_t pair_key(token_t a, token_t b) { return (std::uint64_t(std::uint32_t(a)) << 32) | std::uint32_t(b); }
inline token_t key_left(std::uint64_t k) { return token_t(k >> 32); }
inline token_t key_right(std::uint64_t k) { return token_t(k & 0xffffffffu); }
struct Mix64Hash {
    std::size_t operator()(std::uint64_t k) const noexcept { return std::size_t(mix64(k)); }
};

void check_n_vocab_fits(std::size_t n_regular, const char* who);

// ---------------------------------------------------------------------------------------------------
// JSON. Reading: nlohmann-json, strict (RFC 8259; no comments, no byte order mark, nothing after the
// document), plus what our files need beyond it: duplicate keys are an error, nesting deeper than 32 is an
// error, and strings may hold lone surrogates (as \uD800 escapes or surrogatepass bytes; nlohmann rejects
// both, so they are carried through its parser as a private marker and restored by `text`).
using Json = nlohmann::json;
[[noreturn]] void corrupt(const std::string& what);  // ValueError "corrupt or truncated tokenizer file: ..."
Json parse_json(std::string_view text);                // corrupt(...) on any error
std::string text(const Json& string_value);            // a string's UTF-8 + surrogates
const Json& field(const Json& d, const char* key);     // corrupt if missing
const Json& field_of(const Json& d, const char* key, Json::value_t type);  // ... or of another type
std::string field_text(const Json& d, const char* key);
long long field_int(const Json& d, const char* key);
bool is_int(const Json& v);                            // an integer that fits a long long
long long int_of(const Json& v);                       // its value (is_int(v) checked by the caller)

// Writing (by hand: our layout, and surrogates, which nlohmann's writer cannot carry). A JSON string literal
// of text (UTF-8 + surrogates): see tokenizer_json.cpp.
void json_string(std::string& out, std::string_view s);
std::string json_header(const char* type, const Specials& sp);  // ... with n_vocab and special_tokens
std::string json_header(const char* type, token_t n_vocab);       // ... with n_vocab only

// GPT-2's byte-level alphabet (HF's ByteLevel): each byte as one printable code point (bytes 33..126,
// 161..172, 174..255 as themselves, the others as U+0100 + k in order).
std::string byte_level(std::string_view bytes);
bool from_byte_level(std::string_view s, std::string& bytes);  // false if a character is not in the alphabet
// The common header of our files (format, version, type); returns the document.
Json read_document(std::string_view text, const char* type);
// n_vocab and special_tokens must agree with the layout the content implies.
void check_layout(const Json& d, const Specials& sp);

}  // namespace ft::tok
