// The pre-tokenizer's character classes (paper §4; rule and decisions in pretokenizer.hpp): ASCII by a
// table, above it the generated tables of unicode_tables.cpp.
#include "formal_transformers/pretokenizer.hpp"

#include <algorithm>

#include "unicode_tables.hpp"

namespace ft {
namespace detail {

namespace {
constexpr std::uint8_t O_ = 0, L_ = 1, N_ = 2, S_ = 3;
static_assert(L_ == unicode::L && N_ == unicode::N, "the generated tables use CharClass's values");
}  // namespace

// clang-format off
const std::uint8_t ascii_class[128] = {
    O_, O_, O_, O_, O_, O_, O_, O_, O_, S_, S_, S_, S_, S_, O_, O_,  // \t \n \v \f \r are White_Space
    O_, O_, O_, O_, O_, O_, O_, O_, O_, O_, O_, O_, O_, O_, O_, O_,  // 0x1C..0x1F are not (unlike str.isspace)
    S_, O_, O_, O_, O_, O_, O_, O_, O_, O_, O_, O_, O_, O_, O_, O_,
    N_, N_, N_, N_, N_, N_, N_, N_, N_, N_, O_, O_, O_, O_, O_, O_,
    O_, L_, L_, L_, L_, L_, L_, L_, L_, L_, L_, L_, L_, L_, L_, L_,
    L_, L_, L_, L_, L_, L_, L_, L_, L_, L_, L_, O_, O_, O_, O_, O_,
    O_, L_, L_, L_, L_, L_, L_, L_, L_, L_, L_, L_, L_, L_, L_, L_,
    L_, L_, L_, L_, L_, L_, L_, L_, L_, L_, L_, O_, O_, O_, O_, O_,
};
// clang-format on

CharClass class_of_non_ascii(std::int32_t cp) {
    using unicode::kLetterNumberRanges;
    using unicode::Range;
    if (cp < 0) return CharClass::Other;
    if (cp < 0x80) return CharClass(ascii_class[cp]);
    if (std::binary_search(unicode::kWhiteSpace, unicode::kWhiteSpace + unicode::kNumWhiteSpace, cp))
        return CharClass::Space;
    // the last range with lo <= cp
    const Range* end = kLetterNumberRanges + unicode::kNumLetterNumberRanges;
    const Range* r = std::upper_bound(kLetterNumberRanges, end, cp,
                                      [](std::int32_t c, const Range& x) { return c < x.lo; });
    if (r == kLetterNumberRanges) return CharClass::Other;
    --r;
    return cp <= r->hi ? CharClass(r->k) : CharClass::Other;
}

}  // namespace detail

const char* unicode_version() { return unicode::kUnicodeVersion; }

std::vector<std::pair<std::size_t, std::size_t>> pretokenize(std::string_view text) {
    std::vector<std::pair<std::size_t, std::size_t>> out;
    for_each_piece(text, [&](std::size_t b, std::size_t e) { out.emplace_back(b, e); });
    return out;
}

}  // namespace ft
