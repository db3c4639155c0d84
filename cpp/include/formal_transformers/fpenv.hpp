// The floating-point environment of the core's own calls (docs/design.md "Numerics"; figures: docs/benchmarks.md).
//
// Denormal operands slow x86 arithmetic by orders of magnitude, so the core runs with flush-to-zero (FTZ: denormal results become 0) and
// denormals-are-zero (DAZ: denormal inputs read as 0). But these are per-thread MXCSR bits, and a library
// must not change the arithmetic of its caller's other code. So they are set only for the duration of a
// core call, by this scope:
//
//  * on the calling thread: the caller's MXCSR is saved on entry, FTZ|DAZ set, and the saved value written
//    back on exit — on every path, an exception (ValueError, Interrupted, ...) included, since it is a
//    destructor;
//  * with_pool (for the long calls: training, inference): also on the OpenMP pool's other threads (which
//    run our parallel regions and the BLAS's jobs, through its threads callback), in one parallel region on entry
//    and one on exit (each thread restores the value it had), when more than one thread is in use and the
//    scope is not itself inside a parallel region. Two fork/joins per call cost more than a short call,
//    so short calls leave the pool threads alone: there a denormal only costs time on the
//    worker's share of the work, never accuracy of the caller's code.
//
// Scopes nest: only the outermost one touches the environment. `FpCallerEnv` is the inverse, for the rare
// moments a core call runs the caller's code (the Ctrl-C poll hook runs Python signal handlers): it puts
// the caller's MXCSR back for its own duration.
//
// Elsewhere than x86 (no MXCSR) both are no-ops.
#pragma once

namespace ft {

class FpEnvScope {
public:
    explicit FpEnvScope(bool with_pool = false);
    ~FpEnvScope();
    FpEnvScope(const FpEnvScope&) = delete;
    FpEnvScope& operator=(const FpEnvScope&) = delete;

private:
    bool outer_ = false;
    unsigned saved_ = 0;
    int team_ = 1;  // threads given FTZ/DAZ on entry (and restored on exit)
};

class FpCallerEnv {
public:
    FpCallerEnv();
    ~FpCallerEnv();
    FpCallerEnv(const FpCallerEnv&) = delete;
    FpCallerEnv& operator=(const FpCallerEnv&) = delete;

private:
    bool active_ = false;
    unsigned ours_ = 0;
};

// The calling thread's FTZ and DAZ bits as (ftz, daz), for tests.
bool ftz_enabled();
bool daz_enabled();

}  // namespace ft
