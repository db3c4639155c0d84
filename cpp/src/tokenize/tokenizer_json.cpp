// The tokenizers' JSON save format (docs/tokenization.md): reading with nlohmann-json, writing in our
// layout; and the rendering of text for messages and the files' human-readable fields.
#include <cstdio>
#include <unordered_set>
#include <vector>

#include "tokenizer_internal.hpp"

namespace ft::tok {

// Text for messages and the human-readable fields of the JSON file: printable characters as they are,
// control characters, surrogates and bytes that are not UTF-8 as \xNN / \uXXXX escapes, and the
// backslash doubled (so the rendering is unambiguous).
std::string render(std::string_view s) {
    std::string out;
    char buf[16];
    std::size_t i = 0;
    while (i < s.size()) {
        std::int32_t cp;
        const int len = utf8::next(s, i, cp);
        if (cp < 0) {
            std::snprintf(buf, sizeof buf, "\\x%02X", static_cast<unsigned char>(s[i]));
            out += buf;
            i += 1;  // byte by byte, so that every byte is shown
            continue;
        }
        if (cp == '\\') {
            out += "\\\\";
        } else if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp < 0xA0) || (cp >= 0xD800 && cp <= 0xDFFF)) {
            if (cp == '\n') out += "\\n";
            else if (cp == '\t') out += "\\t";
            else if (cp == '\r') out += "\\r";
            else {
                std::snprintf(buf, sizeof buf, cp < 0x100 ? "\\x%02X" : "\\u%04X", unsigned(cp));
                out += buf;
            }
        } else {
            out.append(s.data() + i, std::size_t(len));
        }
        i += std::size_t(len);
    }
    return out;
}

std::string quote(std::string_view s) { return "'" + render(s) + "'"; }

std::string code_point_name(std::uint32_t cp) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "U+%04X", cp);
    return buf;
}

void check_n_vocab_fits(std::size_t n_regular, const char* who) {
    if (n_regular + 3 > std::size_t(INT32_MAX)) throw ValueError(std::string(who) + ": vocabulary too large");
}

// =====================================================================================================
// Reading
void corrupt(const std::string& what) { throw ValueError("corrupt or truncated tokenizer file: " + what); }

namespace {
// nlohmann-json accepts only valid UTF-8 and joined surrogate pairs; our files may hold lone surrogates
// (as \uD800 escapes, or as surrogatepass bytes ED A0..BF 80..BF). Before parsing, inside strings, each
// lone surrogate becomes the marker U+FFFE followed by its four hex digits, and a genuine U+FFFE (escaped or
// not) becomes U+FFFE followed by 'x'; `text` undoes this. Everything else is passed on unchanged, so
// nlohmann judges the syntax; this pass only has to find the strings.
constexpr char kMarker[] = "\xEF\xBF\xBE";  // U+FFFE
constexpr std::int32_t kMarkerCp = 0xFFFE;

int hex_digit(char h) {
    if (h >= '0' && h <= '9') return h - '0';
    if (h >= 'a' && h <= 'f') return h - 'a' + 10;
    if (h >= 'A' && h <= 'F') return h - 'A' + 10;
    return -1;
}
// the value of \uXXXX at t[p] (p at the backslash), or -1
long escape_at(std::string_view t, std::size_t p) {
    if (p + 6 > t.size() || t[p] != '\\' || t[p + 1] != 'u') return -1;
    long v = 0;
    for (std::size_t k = p + 2; k < p + 6; ++k) {
        const int h = hex_digit(t[k]);
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}
void put_marked(std::string& out, std::int32_t cp) {
    out += kMarker;
    if (cp == kMarkerCp) {
        out += 'x';
    } else {
        char buf[8];
        std::snprintf(buf, sizeof buf, "%04X", unsigned(cp));
        out += buf;
    }
}
std::string mark_surrogates(std::string_view t) {
    std::string out;
    out.reserve(t.size());
    bool in_string = false;
    for (std::size_t p = 0; p < t.size();) {
        const char c = t[p];
        if (!in_string) {
            if (c == '"') in_string = true;
            out += c;
            ++p;
            continue;
        }
        if (c == '"') {
            in_string = false;
            out += c;
            ++p;
        } else if (c == '\\') {
            const long v = escape_at(t, p);
            if (v >= 0xD800 && v <= 0xDBFF) {
                const long lo = escape_at(t, p + 6);
                if (lo >= 0xDC00 && lo <= 0xDFFF) {  // a pair: one code point, nlohmann joins it
                    out.append(t.data() + p, 12);
                    p += 12;
                    continue;
                }
            }
            if ((v >= 0xD800 && v <= 0xDFFF) || v == kMarkerCp) {
                put_marked(out, std::int32_t(v));
                p += 6;
            } else {  // any other escape: two characters here, the rest follows as plain text
                out.append(t.data() + p, std::min<std::size_t>(2, t.size() - p));
                p += 2;
            }
        } else {
            std::int32_t cp;
            const int len = utf8::next(t, p, cp);
            if ((cp >= 0xD800 && cp <= 0xDFFF) || cp == kMarkerCp) put_marked(out, cp);
            else out.append(t.data() + p, std::size_t(len));  // invalid bytes too: nlohmann rejects them
            p += std::size_t(len);
        }
    }
    return out;
}
}  // namespace

std::string text(const Json& v) {
    const std::string& s = v.get_ref<const std::string&>();
    if (s.find(kMarker) == std::string::npos) return s;
    std::string out;
    out.reserve(s.size());
    for (std::size_t p = 0; p < s.size();) {
        if (s.compare(p, 3, kMarker) != 0) {
            out += s[p++];
            continue;
        }
        p += 3;
        if (p < s.size() && s[p] == 'x') {
            out += kMarker;
            p += 1;
            continue;
        }
        std::uint32_t cp = 0;
        for (int k = 0; k < 4; ++k) cp = cp * 16 + std::uint32_t(hex_digit(s[p + std::size_t(k)]));
        utf8::append(out, cp);
        p += 4;
    }
    return out;
}

Json parse_json(std::string_view t) {
    if (t.size() >= 3 && t.substr(0, 3) == "\xEF\xBB\xBF") corrupt("a byte order mark before the document");
    const std::string marked = mark_surrogates(t);
    // The keys of the open objects, hashed: a duplicate is found in O(1) per key (a scan of the keys seen
    // made parsing quadratic: docs/benchmarks.md "Tokenizers").
    std::vector<std::unordered_set<std::string>> keys;
    const Json::parser_callback_t check = [&keys](int depth, Json::parse_event_t ev, Json& parsed) {
        if (depth > 32) corrupt("nesting too deep");
        if (ev == Json::parse_event_t::object_start) {
            keys.emplace_back();
        } else if (ev == Json::parse_event_t::object_end) {
            keys.pop_back();
        } else if (ev == Json::parse_event_t::key) {
            const std::string& k = parsed.get_ref<const std::string&>();
            if (!keys.back().insert(k).second) corrupt("duplicate key \"" + render(text(parsed)) + "\"");
        }
        return true;
    };
    try {
        return Json::parse(marked.begin(), marked.end(), check);
    } catch (const Json::exception& e) {
        std::string m = e.what();
        const std::size_t k = m.find("] ");  // drop nlohmann's "[json.exception.parse_error.101] "
        corrupt(k == std::string::npos ? m : m.substr(k + 2));
    }
}

const Json& field(const Json& d, const char* key) {
    const auto v = d.find(key);
    if (v == d.end()) corrupt(std::string("missing field \"") + key + "\"");
    return *v;
}

const Json& field_of(const Json& d, const char* key, Json::value_t type) {
    const Json& v = field(d, key);
    const bool ok = type == Json::value_t::number_integer ? is_int(v) : v.type() == type;
    if (!ok) corrupt(std::string("field \"") + key + "\" has the wrong type");
    return v;
}

std::string field_text(const Json& d, const char* key) { return text(field_of(d, key, Json::value_t::string)); }

long long field_int(const Json& d, const char* key) { return int_of(field_of(d, key, Json::value_t::number_integer)); }

bool is_int(const Json& v) {
    return v.is_number_integer() && (!v.is_number_unsigned() || v.get<std::uint64_t>() <= std::uint64_t(INT64_MAX));
}

long long int_of(const Json& v) { return v.get<long long>(); }

// =====================================================================================================
// Writing
// JSON string literal of text (UTF-8 + surrogates): surrogates and control characters escaped — except a
// high surrogate directly followed by a low one (two lone code points in a Python str): JSON readers
// (ours, Python's json) join two such escapes (backslash-u D800, backslash-u DFFF) into ONE code point
// (U+103FF), so that high surrogate is
// written as its raw surrogatepass bytes (ED A0..AF 80..BF) instead; our reader takes it back as one code
// point, as json.loads of the Python str does. So every text round-trips exactly.
void json_string(std::string& out, std::string_view s) {
    out += '"';
    std::size_t i = 0;
    char buf[16];
    while (i < s.size()) {
        std::int32_t cp;
        const int len = utf8::next(s, i, cp);
        FT_CHECK(cp >= 0, "json_string: text is not UTF-8");
        bool pair_follows = false;
        if (cp >= 0xD800 && cp <= 0xDBFF && i + std::size_t(len) < s.size()) {
            std::int32_t next_cp;
            utf8::next(s, i + std::size_t(len), next_cp);
            pair_follows = next_cp >= 0xDC00 && next_cp <= 0xDFFF;
        }
        if (pair_follows) {
            out.append(s.data() + i, std::size_t(len));
            i += std::size_t(len);
            continue;
        }
        if (cp == '"') out += "\\\"";
        else if (cp == '\\') out += "\\\\";
        else if (cp == '\n') out += "\\n";
        else if (cp == '\t') out += "\\t";
        else if (cp == '\r') out += "\\r";
        else if (cp < 0x20 || cp == 0x7F || (cp >= 0xD800 && cp <= 0xDFFF)) {
            std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(cp));
            out += buf;
        } else {
            out.append(s.data() + i, std::size_t(len));
        }
        i += std::size_t(len);
    }
    out += '"';
}

constexpr const char* kFormat = "formal-transformers/tokenizer";
constexpr long long kVersion = 1;

std::string json_header(const char* type, token_t n_vocab) {
    std::string out = "{\n  \"format\": \"";
    out += kFormat;
    out += "\",\n  \"version\": " + std::to_string(kVersion) + ",\n  \"type\": \"" + type + "\",\n";
    out += "  \"n_vocab\": " + std::to_string(n_vocab) + ",\n";
    return out;
}

std::string json_header(const char* type, const Specials& sp) {
    std::string out = json_header(type, sp.n_vocab);
    out += "  \"special_tokens\": {\"<mask>\": " + std::to_string(sp.mask()) + ", \"<bos>\": " + std::to_string(sp.bos()) +
           ", \"<eos>\": " + std::to_string(sp.eos()) + "},\n";
    return out;
}

// The common header: format, version, type; returns the document.
Json read_document(std::string_view text, const char* type) {
    if (text.empty()) corrupt("the file is empty");
    Json d = parse_json(text);
    if (!d.is_object()) corrupt("the document is not a JSON object");
    if (field_text(d, "format") != kFormat) corrupt(std::string("\"format\" is not \"") + kFormat + "\"");
    const long long v = field_int(d, "version");
    if (v != kVersion)
        throw ValueError("unsupported tokenizer file version " + std::to_string(v) + " (this build reads version " +
                         std::to_string(kVersion) + ")");
    const std::string t = field_text(d, "type");
    if (t != type)
        throw ValueError("the file holds a '" + render(t) + "' tokenizer, not a '" + type +
                         "' one (load it with the matching class)");
    return d;
}

// n_vocab and special_tokens must agree with the layout the content implies.
void check_layout(const Json& d, const Specials& sp) {
    const long long n = field_int(d, "n_vocab");
    if (n != sp.n_vocab)
        corrupt("\"n_vocab\" is " + std::to_string(n) + " but the content gives " + std::to_string(sp.n_vocab));
    const Json& s = field_of(d, "special_tokens", Json::value_t::object);
    const std::pair<const char*, token_t> want[3] = {{"<mask>", sp.mask()}, {"<bos>", sp.bos()}, {"<eos>", sp.eos()}};
    if (s.size() != 3) corrupt("\"special_tokens\" must have exactly <mask>, <bos>, <eos>");
    for (auto& w : want) {
        const auto v = s.find(w.first);
        if (v == s.end() || !is_int(*v) || int_of(*v) != w.second)
            corrupt(std::string("\"special_tokens\" must map ") + w.first + " to " + std::to_string(w.second));
    }
}

}  // namespace ft::tok
