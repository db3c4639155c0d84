// Benchmark (not a test): what Adam's all-or-nothing check costs at GPT-2 small's size (docs/benchmarks.md "The
// float32 GPT-2-small step from f9cbf25 to db314f5"). n float32 values per stream (θ, m, v, g; default 124 M),
// one thread, each pass timed `reps` times:
//   check   the check pass of Adam::step: the update's terms (optim.cpp adam_kernel<false>), nothing written
//   pred    the same streams, a test with no square root or division (|θ(1 − ηλ)| and η̂|m| against bounds)
//   pred2   θ and g only, m bounded by a given max |m| (what a check could read if the optimizer kept that bound)
//   read4   a plain sum over the four streams (the memory traffic alone)
//   apply   the writing pass (adam_kernel<true>)
// Build and run:
//   g++ -O3 -march=native -std=c++17 bench/bench_adam_check.cpp -o build/rel/bench_adam_check
//   ./build/rel/bench_adam_check [n=124000000] [reps=3]
#include <cfloat>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <xsimd/xsimd.hpp>

using T = float;
using B = xsimd::batch<T>;
constexpr long W = long(B::size);

struct Coefficients {  // AdamW at step 10 of lr 3e-4, λ 0.1 (optim.hpp AdamCoefficients)
    T b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.1f, shrink = 1 - 3e-5f, step = 3e-4f / (1 - 0.3487f),
      bc2 = 0.0998f;
} c;

template <bool Apply>
bool kernel(T* theta, T* M, T* V, const T* g, long n) {
    const B b1(c.b1), b2(c.b2), a1(1 - c.b1), a2(1 - c.b2), e(c.eps), shrink(c.shrink), step(c.step), bc2(c.bc2);
    auto finite = xsimd::batch_bool<T>(true);
    for (long i = 0; i + W <= n; i += W) {
        B th = B::load_unaligned(theta + i) * shrink;
        const B gi = B::load_unaligned(g + i);
        const B m = B::load_unaligned(M + i) * b1 + a1 * gi;
        const B v = B::load_unaligned(V + i) * b2 + a2 * gi * gi;
        th = th - step * (m / (xsimd::sqrt(v) / bc2 + e));
        if (Apply) {
            m.store_unaligned(M + i);
            v.store_unaligned(V + i);
            th.store_unaligned(theta + i);
        } else {
            finite = finite && xsimd::isfinite(th);
        }
    }
    return xsimd::all(finite);
}

bool pred(const T* theta, const T* M, const T* V, const T* g, long n) {
    const B b1(c.b1), b2(c.b2), a1(1 - c.b1), a2(1 - c.b2), shrink(c.shrink), step(c.step);
    const B A(FLT_MAX / 4), Bm(T(double(c.eps) * FLT_MAX / 4)), zero(0);
    auto ok = xsimd::batch_bool<T>(true);
    for (long i = 0; i + W <= n; i += W) {
        const B th = B::load_unaligned(theta + i) * shrink, gi = B::load_unaligned(g + i);
        const B m = B::load_unaligned(M + i) * b1 + a1 * gi;
        const B v = B::load_unaligned(V + i) * b2 + a2 * gi * gi;
        ok = ok && (xsimd::abs(th) < A) && (xsimd::abs(step * m) < Bm) && (v >= zero);
    }
    return xsimd::all(ok);
}

bool pred2(const T* theta, const T* g, long n, T m_max) {
    const B a1(1 - c.b1), shrink(c.shrink), step(c.step), mb(c.b1 * m_max);
    const B A(FLT_MAX / 4), Bm(T(double(c.eps) * FLT_MAX / 4));
    auto ok = xsimd::batch_bool<T>(true);
    for (long i = 0; i + W <= n; i += W) {
        const B th = B::load_unaligned(theta + i) * shrink, gi = B::load_unaligned(g + i);
        ok = ok && (xsimd::abs(th) < A) && (step * (mb + a1 * xsimd::abs(gi)) < Bm);
    }
    return xsimd::all(ok);
}

T read4(const T* a, const T* b, const T* d, const T* e, long n) {
    B s(T(0));
    for (long i = 0; i + W <= n; i += W)
        s += B::load_unaligned(a + i) + B::load_unaligned(b + i) + B::load_unaligned(d + i) + B::load_unaligned(e + i);
    return xsimd::hadd(s);
}

int main(int argc, char** argv) {
    const long n = argc > 1 ? std::atol(argv[1]) : 124000000;
    const int reps = argc > 2 ? std::atoi(argv[2]) : 3;
    std::vector<T> th(n, 0.01f), M(n, 0.001f), V(n, 1e-6f), g(n, 0.002f);
    auto time = [&](const char* name, auto f) {
        for (int r = 0; r < reps; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            volatile auto x = f();
            (void)x;
            const auto t1 = std::chrono::steady_clock::now();
            std::printf("%-6s %.1f ms\n", name, std::chrono::duration<double, std::milli>(t1 - t0).count());
        }
    };
    time("check", [&] { return kernel<false>(th.data(), M.data(), V.data(), g.data(), n); });
    time("pred", [&] { return pred(th.data(), M.data(), V.data(), g.data(), n); });
    time("pred2", [&] { return pred2(th.data(), g.data(), n, 0.001f); });
    time("read4", [&] { return read4(th.data(), M.data(), V.data(), g.data(), n); });
    time("apply", [&] { return kernel<true>(th.data(), M.data(), V.data(), g.data(), n); });
}
