#include "formal_transformers/common.hpp"

#include "formal_transformers/blas.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <thread>

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
#ifdef _OPENMP
    // OMP_NUM_THREADS beyond what can be created would crash the first parallel region: held to the cap
    const int cap = max_num_threads();
    if (omp_get_max_threads() > cap) omp_set_num_threads(cap);
#endif
}

int max_num_threads() {
#ifdef _OPENMP
    const int procs = std::max(1, omp_get_num_procs());
    const int runtime = std::max(1, omp_get_thread_limit());  // OMP_THREAD_LIMIT (INT_MAX unless set)
#else
    const int procs = std::max(1, int(std::thread::hardware_concurrency()));
    const int runtime = std::numeric_limits<int>::max();
#endif
    long long cap = std::max<long long>(kMinThreadCap, 4LL * procs);
    // each thread reserves its stack in the address space: under a limit (ulimit -v), at most half of it
    rlimit as{}, st{};
    if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
        const unsigned long long stack = getrlimit(RLIMIT_STACK, &st) == 0 && st.rlim_cur != RLIM_INFINITY
                                             ? std::max<unsigned long long>(st.rlim_cur, 1ULL << 20)
                                             : 2ULL << 20;
        cap = std::min<long long>(cap, std::max<long long>(1, (long long)(as.rlim_cur / 2 / stack)));
    }
    return int(std::min<long long>(cap, runtime));
}

void set_num_threads(int n) {
    if (n < 1) throw ValueError("set_num_threads: n must be >= 1, got " + std::to_string(n));
    const int cap = max_num_threads();
    if (n > cap)  // libgomp crashes (SIGSEGV, or aborts the process) when it cannot create the threads
        throw ValueError("set_num_threads: n = " + std::to_string(n) + " exceeds max_num_threads() = " +
                         std::to_string(cap) + " (4 per CPU, at least " + std::to_string(kMinThreadCap) +
                         ", within OMP_THREAD_LIMIT and half the address-space limit at one stack per thread)");
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
    blas_set_num_threads(n);
    init_threads();
}

std::uint64_t splitmix64(std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

std::uint64_t named_seed(std::uint64_t seed, const std::string& name) {
    std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a, 64 bits
    for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ULL;
    return splitmix64(seed ^ splitmix64(h));
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
