#include "formal_transformers/common.hpp"

#include "formal_transformers/blas.hpp"

#include <cmath>
#include <mutex>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace ft {

// ---------------------------------------------------------------------------------------------------
namespace {
PollHook& poll_hook() {
    static PollHook hook;
    return hook;
}
}  // namespace

void set_poll_hook(PollHook hook) { poll_hook() = std::move(hook); }
void poll() {
    auto& h = poll_hook();
    if (h) h();
}

// ---------------------------------------------------------------------------------------------------
void init_threads() {
    // FTZ/DAZ are no longer set here (that changed the importing process's arithmetic): each core call
    // sets them for its own duration only, fpenv.hpp.
}

void set_num_threads(int n) {
    if (n < 1) throw ValueError("set_num_threads: n must be >= 1, got " + std::to_string(n));
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
    blas_set_num_threads(n);
    init_threads();
}

int get_num_threads() {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return blas_get_num_threads();
#endif
}

#ifdef _OPENMP
SingleThreadScope::SingleThreadScope() : saved_(omp_get_max_threads()) {
    omp_set_num_threads(1);
    blas_set_num_threads(1);
}
SingleThreadScope::~SingleThreadScope() {
    omp_set_num_threads(saved_);
    blas_set_num_threads(saved_);
}
#else
SingleThreadScope::SingleThreadScope() : saved_(1) {}
SingleThreadScope::~SingleThreadScope() = default;
#endif

// ---------------------------------------------------------------------------------------------------
std::uint64_t Rng::below(std::uint64_t n) {
    if (n <= 1) return 0;
    // rejection sampling: unbiased
    const std::uint64_t limit = std::numeric_limits<std::uint64_t>::max() - std::numeric_limits<std::uint64_t>::max() % n;
    std::uint64_t x;
    do x = g_(); while (x >= limit);
    return x % n;
}

double Rng::normal() {
    if (has_spare_) {
        has_spare_ = false;
        return spare_;
    }
    double u, v, s;
    do {
        u = 2.0 * uniform() - 1.0;
        v = 2.0 * uniform() - 1.0;
        s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    const double f = std::sqrt(-2.0 * std::log(s) / s);
    spare_ = v * f;
    has_spare_ = true;
    return u * f;
}

}  // namespace ft
