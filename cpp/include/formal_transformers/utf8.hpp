// UTF-8 as the tokenizers (paper §4) read and write text: valid UTF-8 plus surrogate code points written
// as Python's "surrogatepass" writes them (ED A0..BF 80..BF), so that every Python str travels exactly.
// Byte sequences that are not UTF-8 are replaced by U+FFFD per maximal invalid subpart, exactly as
// Python's bytes.decode("utf-8", "replace") does (Errors::Replace), dropped (Ignore) or reported (Strict:
// ValueError naming the byte offset).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ft {

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

}  // namespace ft
