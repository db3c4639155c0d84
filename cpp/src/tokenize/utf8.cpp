// UTF-8 with surrogates (utf8.hpp): Python's decoder rules, byte for byte.
#include "formal_transformers/utf8.hpp"

#include <algorithm>
#include <cstdio>

#include "formal_transformers/common.hpp"

namespace ft {

namespace utf8 {

Errors parse_errors(const std::string& name) {
    if (name == "replace") return Errors::Replace;
    if (name == "ignore") return Errors::Ignore;
    if (name == "strict") return Errors::Strict;
    throw ValueError("errors must be 'replace', 'ignore' or 'strict', got '" + name + "'");
}

namespace {
inline bool cont(unsigned char x) { return (x & 0xC0) == 0x80; }
}  // namespace

// Python's decoder: the length of an invalid sequence is its maximal valid prefix ("maximal subpart"),
// at least 1. Surrogates ED A0..BF 80..BF decode as code points D800..DFFF ("surrogatepass").
int next(std::string_view s, std::size_t i, std::int32_t& cp) {
    const std::size_t n = s.size();
    const auto at = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char c = at(i);
    cp = -1;
    if (c < 0x80) {
        cp = c;
        return 1;
    }
    if (c < 0xC2) return 1;
    if (c < 0xE0) {
        if (i + 1 < n && cont(at(i + 1))) {
            cp = ((c & 0x1F) << 6) | (at(i + 1) & 0x3F);
            return 2;
        }
        return 1;
    }
    if (c < 0xF0) {
        if (i + 1 >= n) return 1;
        const unsigned char c1 = at(i + 1);
        const unsigned char lo = c == 0xE0 ? 0xA0 : 0x80;
        if (c == 0xED && c1 >= 0xA0 && c1 <= 0xBF) {  // a surrogate: only as a whole 3-byte sequence
            if (i + 2 < n && cont(at(i + 2))) {
                cp = ((c & 0x0F) << 12) | ((c1 & 0x3F) << 6) | (at(i + 2) & 0x3F);
                return 3;
            }
            return 1;  // what strict UTF-8 says of ED A0: ED alone is the invalid subpart
        }
        if (c1 < lo || c1 > 0xBF) return 1;
        if (i + 2 >= n || !cont(at(i + 2))) return 2;
        cp = ((c & 0x0F) << 12) | ((c1 & 0x3F) << 6) | (at(i + 2) & 0x3F);
        return 3;
    }
    if (c < 0xF5) {
        if (i + 1 >= n) return 1;
        const unsigned char c1 = at(i + 1);
        const unsigned char lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        if (c1 < lo || c1 > hi) return 1;
        if (i + 2 >= n || !cont(at(i + 2))) return 2;
        if (i + 3 >= n || !cont(at(i + 3))) return 3;
        cp = ((c & 0x07) << 18) | ((c1 & 0x3F) << 12) | ((at(i + 2) & 0x3F) << 6) | (at(i + 3) & 0x3F);
        return 4;
    }
    return 1;
}

void append(std::string& out, std::uint32_t cp) {
    if (cp < 0x80) {
        out.push_back(char(cp));
    } else if (cp < 0x800) {
        out.push_back(char(0xC0 | (cp >> 6)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(char(0xE0 | (cp >> 12)));
        out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(char(0xF0 | (cp >> 18)));
        out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    }
}

std::string sanitize(std::string_view s, Errors errors) {
    std::string out;
    out.reserve(s.size());
    std::size_t i = 0;
    const std::size_t n = s.size();
    while (i < n) {
        std::size_t j = i;
        while (j < n && static_cast<unsigned char>(s[j]) < 0x80) ++j;  // ASCII run
        out.append(s.data() + i, j - i);
        i = j;
        if (i >= n) break;
        std::int32_t cp;
        const int len = next(s, i, cp);
        if (cp >= 0) {
            out.append(s.data() + i, std::size_t(len));
        } else if (errors == Errors::Replace) {
            out += "\xEF\xBF\xBD";  // U+FFFD
        } else if (errors == Errors::Strict) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "0x%02X", static_cast<unsigned char>(s[i]));
            throw ValueError("decode: the bytes of the tokens are not valid UTF-8 at byte offset " + std::to_string(i) +
                             " (byte " + buf + "); use errors='replace' or 'ignore'");
        }
        i += std::size_t(len);
    }
    return out;
}

std::size_t count_code_points(std::string_view s, std::size_t end_byte) {
    std::size_t i = 0, k = 0;
    end_byte = std::min(end_byte, s.size());
    while (i < end_byte) {
        std::int32_t cp;
        i += std::size_t(next(s, i, cp));
        ++k;
    }
    return k;
}

}  // namespace utf8

}  // namespace ft
