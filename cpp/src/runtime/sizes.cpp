// Size arithmetic in one place: see sizes.hpp.
#include "formal_transformers/sizes.hpp"

#include <unistd.h>

#include <cstdio>
#include <limits>

#include "formal_transformers/common.hpp"

namespace ft {

std::string human_bytes(long double bytes) {
    const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"};
    int k = 0;
    while (bytes >= 1024 && k < 8) {
        bytes /= 1024;
        ++k;
    }
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3Lg %s", bytes, unit[k]);
    return buf;
}

std::uint64_t max_alloc_bytes() {
    static const std::uint64_t bound = [] {
        const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        if (pages > 0 && page > 0) return std::uint64_t(pages) * std::uint64_t(page);
        return std::uint64_t(1) << 40;
    }();
    return bound;
}

void throw_size_error(const std::string& what, const std::string& detail) {
    throw ValueError(what + ": " + detail);
}

namespace {
// a op b for sizes (op: '*' or '+'): a ValueError naming `what` when either is negative or the result overflows
index_t checked_op(index_t a, char op, index_t b, const char* what) {
    index_t r;
    if (a < 0 || b < 0) throw_size_error(what, "negative size " + std::to_string(a < 0 ? a : b));
    if (op == '*' ? __builtin_mul_overflow(a, b, &r) : __builtin_add_overflow(a, b, &r))
        throw_size_error(what, std::to_string(a) + " " + op + " " + std::to_string(b) +
                                   " elements overflows a 64-bit count (the sizes are far too large)");
    return r;
}
}  // namespace

index_t checked_mul(index_t a, index_t b, const char* what) { return checked_op(a, '*', b, what); }
index_t checked_add(index_t a, index_t b, const char* what) { return checked_op(a, '+', b, what); }

index_t checked_count(std::initializer_list<index_t> factors, const char* what) {
    index_t n = 1;
    for (index_t f : factors) n = checked_mul(n, f, what);
    return n;
}

index_t check_bytes(index_t n, std::size_t elem_size, const char* what) {
    const std::uint64_t bound = max_alloc_bytes();
    const long double bytes = (long double)(n) * (long double)(elem_size);
    if (n < 0 || bytes > (long double)(bound))
        throw_size_error(what, std::to_string(n) + " elements of " + std::to_string(elem_size) + " bytes = " +
                                   human_bytes(bytes) + " exceeds this machine's memory (" + human_bytes((long double)bound) +
                                   ", the bound for one allocation)");
    return n;
}

index_t checked_elements(std::initializer_list<index_t> factors, std::size_t elem_size, const char* what) {
    return check_bytes(checked_count(factors, what), elem_size, what);
}


}  // namespace ft
