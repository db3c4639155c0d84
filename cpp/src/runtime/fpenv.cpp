// FTZ/DAZ only inside the core's own calls: see fpenv.hpp.
#include "formal_transformers/fpenv.hpp"

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#define FT_HAVE_MXCSR 1
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

namespace ft {

namespace {
constexpr unsigned kFtz = 0x8000, kDaz = 0x0040;  // MXCSR bit 15 (flush to zero), bit 6 (denormals are zero)

thread_local int depth = 0;             // nesting of FpEnvScope on this thread
thread_local unsigned caller_csr = 0;   // the caller's MXCSR, saved by the outermost scope
thread_local bool worker_saved = false; // a pool thread holding a saved MXCSR (set by a scope's entry region)
thread_local unsigned worker_csr = 0;

#ifdef FT_HAVE_MXCSR
unsigned get_csr() { return _mm_getcsr(); }
void set_csr(unsigned v) { _mm_setcsr(v); }
#else
unsigned get_csr() { return 0; }
void set_csr(unsigned) {}
#endif
}  // namespace

FpEnvScope::FpEnvScope(bool with_pool) {
    if (depth++ > 0) return;
    outer_ = true;
#ifndef FT_HAVE_MXCSR
    (void)with_pool;
#else
    saved_ = get_csr();
    caller_csr = saved_;
#ifdef _OPENMP
    // the pool first: a thread the region creates inherits the creating thread's MXCSR, which must still be
    // the caller's (else "its own" value, restored on exit, would already have FTZ/DAZ)
    if (with_pool && !omp_in_parallel() && omp_get_max_threads() > 1) {
        team_ = omp_get_max_threads();
#pragma omp parallel num_threads(team_)
        if (omp_get_thread_num() != 0 && !worker_saved) {
            worker_csr = get_csr();
            worker_saved = true;
            set_csr(worker_csr | kFtz | kDaz);
        }
    }
#endif
    set_csr(saved_ | kFtz | kDaz);
#endif
}

FpEnvScope::~FpEnvScope() {
    --depth;
    if (!outer_) return;
#ifdef FT_HAVE_MXCSR
#ifdef _OPENMP
    if (team_ > 1) {
#pragma omp parallel num_threads(team_)
        if (omp_get_thread_num() != 0 && worker_saved) {
            set_csr(worker_csr);
            worker_saved = false;
        }
    }
#endif
    set_csr(saved_);
#endif
}

FpCallerEnv::FpCallerEnv() {
    if (depth == 0) return;  // not inside a core call: the environment is already the caller's
    active_ = true;
    ours_ = get_csr();
    set_csr(caller_csr);
}

FpCallerEnv::~FpCallerEnv() {
    if (active_) set_csr(ours_);
}

bool ftz_enabled() { return (get_csr() & kFtz) != 0; }
bool daz_enabled() { return (get_csr() & kDaz) != 0; }

}  // namespace ft
