// JSON from outside the program (a file's header and metadata, a config text, BigBird layouts): one parse
// with bounds checked before the recursive parser and the recursive value it builds see the text.
//
//   const Json j = parse_bounded_json(text, "model config");   // ValueError "model config: <the problem>"
//
// Refused, each by name: more than max_bytes bytes; a UTF-8 byte order mark; arrays and objects nested deeper
// than max_depth (measured by an iterative pre-scan, so a text nested a million deep costs one pass, not a stack
// overflow); a key twice in one object; anything that is not exactly one JSON value (trailing bytes other than
// whitespace included); invalid UTF-8 in a string.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace ft {

struct JsonBounds {
    std::size_t max_depth = 64;                     // nested arrays and objects
    std::size_t max_bytes = std::size_t(100) << 20;  // the text
};

nlohmann::ordered_json parse_bounded_json(std::string_view text, const std::string& what, JsonBounds bounds = {});

}  // namespace ft
