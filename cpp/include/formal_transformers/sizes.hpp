// Size arithmetic in one place.
//
// Every element count and byte size the core allocates goes through these helpers: products and sums of
// sizes are checked for overflow (a wrapped count would build an object smaller than it believes it is),
// and every allocation is held against one bound in bytes, BEFORE anything is allocated:
//
//   max_alloc_bytes() = the machine's physical memory (sysconf), or 2^40 bytes where it cannot be read.
//
// A request that overflows or exceeds the bound throws ValueError naming what was being sized and its
// factors (Python: ValueError), never std::bad_alloc, a wrapped count, a segfault or a minutes-long loop.
// A model's parameters count twice (θ and its gradient); the bound is on that total.
//
// This header is self-contained (no other formal_transformers header) so that common.hpp can use it for
// its workspace helper `ensure`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace ft {

using index_t = std::ptrdiff_t;

// The bound in bytes for one object (a parameter store with its gradient, a workspace, a mask).
std::uint64_t max_alloc_bytes();

// Throws ValueError: "<what>: <detail> exceeds ..." (out of line: keeps the checks below small).
// A byte count for messages: "1.5 GiB".
std::string human_bytes(long double bytes);
[[noreturn]] void throw_size_error(const std::string& what, const std::string& detail);

// a*b, or ValueError when either is negative or the product overflows index_t.
index_t checked_mul(index_t a, index_t b, const char* what);
// a+b, or ValueError when either is negative or the sum overflows index_t.
index_t checked_add(index_t a, index_t b, const char* what);
// The product of the factors (each >= 0), checked as above.
index_t checked_count(std::initializer_list<index_t> factors, const char* what);
// n elements of elem_size bytes each: ValueError unless n*elem_size <= max_alloc_bytes(). Returns n.
index_t check_bytes(index_t n, std::size_t elem_size, const char* what);
// checked_count + check_bytes: the element count of an allocation of that shape, safe to allocate.
index_t checked_elements(std::initializer_list<index_t> factors, std::size_t elem_size, const char* what);


}  // namespace ft
