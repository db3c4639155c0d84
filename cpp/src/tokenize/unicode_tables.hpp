// The generated character tables of the pre-tokenizer (unicode_tables.cpp, tools/gen_unicode_tables.py).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ft::unicode {

constexpr std::uint8_t L = 1, N = 2;  // the values of CharClass::Letter, CharClass::Number
struct Range {
    std::int32_t lo, hi;  // inclusive
    std::uint8_t k;       // L or N
};
extern const char* const kUnicodeVersion;
extern const Range kLetterNumberRanges[];  // sorted, disjoint
extern const std::size_t kNumLetterNumberRanges;
extern const std::int32_t kWhiteSpace[];   // White_Space above ASCII, sorted
extern const std::size_t kNumWhiteSpace;

}  // namespace ft::unicode
