// parse_bounded_json (bounded_json.hpp).
#include "bounded_json.hpp"

#include <unordered_set>
#include <vector>

#include "formal_transformers/common.hpp"

namespace ft {

namespace {
// The deepest nesting of arrays and objects in `text`, counted without recursion (brackets inside strings
// skipped); stops early once past `limit`.
std::size_t nesting_depth(std::string_view text, std::size_t limit) {
    std::size_t depth = 0, deepest = 0;
    bool in_string = false;
    for (std::size_t i = 0; i < text.size(); ++i) {
        const char ch = text[i];
        if (in_string) {
            if (ch == '\\') ++i;  // the escaped character is never a quote that ends the string
            else if (ch == '"') in_string = false;
            continue;
        }
        if (ch == '"') {
            in_string = true;
        } else if (ch == '[' || ch == '{') {
            if (++depth > deepest && (deepest = depth) > limit) return deepest;
        } else if ((ch == ']' || ch == '}') && depth > 0) {
            --depth;  // (unbalanced brackets are the parser's to name)
        }
    }
    return deepest;
}
}  // namespace

nlohmann::ordered_json parse_bounded_json(std::string_view text, const std::string& what, JsonBounds bounds) {
    using Json = nlohmann::ordered_json;
    auto refuse = [&](const std::string& problem) { throw ValueError(what + ": " + problem); };
    if (text.size() > bounds.max_bytes)
        refuse("not JSON (" + std::to_string(text.size()) + " bytes, more than the " + std::to_string(bounds.max_bytes) +
               " allowed)");
    if (text.size() >= 3 && text.substr(0, 3) == "\xEF\xBB\xBF") refuse("not JSON (a byte order mark before the document)");
    if (nesting_depth(text, bounds.max_depth) > bounds.max_depth)
        refuse("not JSON (nested deeper than " + std::to_string(bounds.max_depth) + " levels)");
    std::vector<std::unordered_set<std::string>> keys;  // the keys of each open object
    const Json::parser_callback_t check = [&](int, Json::parse_event_t ev, Json& parsed) {
        if (ev == Json::parse_event_t::object_start) {
            keys.emplace_back();
        } else if (ev == Json::parse_event_t::object_end) {
            keys.pop_back();
        } else if (ev == Json::parse_event_t::key && !keys.back().insert(parsed.get<std::string>()).second) {
            refuse("the key \"" + parsed.get<std::string>() + "\" twice in one object");
        }
        return true;
    };
    try {
        return Json::parse(text.begin(), text.end(), check);
    } catch (const Json::exception& e) {
        std::string m = e.what();
        const std::size_t k = m.find("] ");  // drop nlohmann's "[json.exception.parse_error.101] "
        refuse("not JSON (" + (k == std::string::npos ? m : m.substr(k + 2)) + ")");
    }
    return {};  // (not reached)
}

}  // namespace ft
