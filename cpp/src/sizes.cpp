// Size arithmetic in one place: see sizes.hpp.
#include "formal_transformers/sizes.hpp"

#include <unistd.h>

#include <cstdio>
#include <limits>

#include "formal_transformers/common.hpp"
#include "formal_transformers/transformers.hpp"

namespace ft {

namespace {
std::string human(long double bytes) {
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
}  // namespace

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

index_t checked_mul(index_t a, index_t b, const char* what) {
    index_t r;
    if (a < 0 || b < 0) throw_size_error(what, "negative size " + std::to_string(a < 0 ? a : b));
    if (__builtin_mul_overflow(a, b, &r))
        throw_size_error(what, std::to_string(a) + " * " + std::to_string(b) +
                                   " elements overflows a 64-bit count (the sizes are far too large)");
    return r;
}

index_t checked_add(index_t a, index_t b, const char* what) {
    index_t r;
    if (a < 0 || b < 0) throw_size_error(what, "negative size " + std::to_string(a < 0 ? a : b));
    if (__builtin_add_overflow(a, b, &r))
        throw_size_error(what, std::to_string(a) + " + " + std::to_string(b) +
                                   " elements overflows a 64-bit count (the sizes are far too large)");
    return r;
}

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
                                   human(bytes) + " exceeds this machine's memory (" + human((long double)bound) +
                                   ", the bound for one allocation)");
    return n;
}

index_t checked_elements(std::initializer_list<index_t> factors, std::size_t elem_size, const char* what) {
    return check_bytes(checked_count(factors, what), elem_size, what);
}

void check_model_size(const ModelConfig& c, Arch arch) {
    const char* what = "model size";
    const index_t d = c.d_e, L = arch == Arch::ED ? checked_add(c.L_enc, c.L_dec, what) : c.L;
    // one attention: W_q, W_k, W_v (H × d_attn × d_e each) and W_o (d_e × H·d_mid)
    const index_t attn = checked_add(checked_count({3, c.H, c.d_attn, d}, what), checked_count({c.H, c.d_mid, d}, what), what);
    const index_t mlp = checked_count({2, c.d_mlp, d}, what);  // W_mlp1, W_mlp2
    index_t layer = checked_add(attn, mlp, what);
    if (arch == Arch::ED) layer = checked_add(layer, attn, what);  // (the decoder's cross-attention: at least)
    const index_t emb = checked_add(checked_mul(c.n_vocab, d, what), checked_mul(c.l_max, d, what), what);
    const index_t params = checked_add(emb, checked_mul(L, layer, what), what);
    // θ and gradient in float32, and each layer's bookkeeping
    const index_t bytes = checked_add(checked_count({params, 2, index_t(sizeof(float))}, what),
                                      checked_mul(L, kLayerOverhead, what), what);
    if (std::uint64_t(bytes) > max_alloc_bytes())
        throw_size_error(what, "n_vocab=" + std::to_string(c.n_vocab) + ", l_max=" + std::to_string(c.l_max) +
                                   ", layers=" + std::to_string(L) + ", H=" + std::to_string(c.H) +
                                   ", d_e=" + std::to_string(d) + ", d_attn=" + std::to_string(c.d_attn) +
                                   ", d_mid=" + std::to_string(c.d_mid) + ", d_mlp=" + std::to_string(c.d_mlp) +
                                   " need at least " + std::to_string(params) + " parameters (" + human(bytes) +
                                   " with their gradients), which exceeds this machine's memory (" +
                                   human((long double)max_alloc_bytes()) + ")");
}

}  // namespace ft
