// Benchmark (not a test): a candidate float32 exp of our own (Cody–Waite reduction, Cephes's degree-7 polynomial,
// 2^n in two factors, 0 below the smallest normal float) against xsimd's exp, which the core uses (functions.hpp
// exp_values), on the same inputs, one thread, the two interleaved over --rounds rounds; the arguments as in the
// tiled attention's T1 line 5 (S − m′ ≤ 0, some −∞ from the mask). Its result, and why the candidate was not
// kept: docs/benchmarks.md "Element-wise kernels and numerics".
//
//   g++ -O3 -march=native -fopenmp -std=c++17 -DXTENSOR_USE_XSIMD -I cpp/include bench/bench_exp.cpp -o build/rel/bench_exp
//   ./build/rel/bench_exp [n=8192] [reps=2000] [rounds=7]
// Prints the least CPU ns per value of each side and their ratio (> 1: ours faster).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <vector>

#include <xsimd/xsimd.hpp>


namespace {
double cpu_now() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}
using B = xsimd::batch<float>;
constexpr float kExpLo = -87.3365402f;  // the float just above ln FLT_MIN
B cand(B x) {
    using I = xsimd::batch<std::int32_t>;
    const B xc = xsimd::min(xsimd::max(x, B(kExpLo)), B(88.8f));
    const B n = xsimd::nearbyint(xc * B(1.44269504088896341f));
    B r = xsimd::fnma(n, B(0.693359375f), xc);
    r = xsimd::fnma(n, B(-2.12194440e-4f), r);
    B p(1.9875691500e-4f);
    p = xsimd::fma(p, r, B(1.3981999507e-3f));
    p = xsimd::fma(p, r, B(8.3334519073e-3f));
    p = xsimd::fma(p, r, B(4.1665795894e-2f));
    p = xsimd::fma(p, r, B(1.6666665459e-1f));
    p = xsimd::fma(p, r, B(5.0000001201e-1f));
    const B e = xsimd::fma(p, r * r, r) + B(1.0f);
    const I ni = xsimd::to_int(n), n1 = ni >> 1, n2 = ni - n1;
    const B s1 = xsimd::bitwise_cast<B>((n1 + I(127)) << 23), s2 = xsimd::bitwise_cast<B>((n2 + I(127)) << 23);
    const B y = xsimd::select(x < B(kExpLo), B(0.0f), e * s1 * s2);
    return xsimd::select(x == x, y, x);
}
void ours_exp(const float* x, float* y, long n) {
    long i = 0;
    for (; i + long(B::size) <= n; i += long(B::size)) cand(B::load_unaligned(x + i)).store_unaligned(y + i);
    for (; i < n; ++i) y[i] = std::exp(x[i]);
}
void xsimd_exp(const float* x, float* y, long n) {
    long i = 0;
    for (; i + long(B::size) <= n; i += long(B::size)) xsimd::exp(B::load_unaligned(x + i)).store_unaligned(y + i);
    for (; i < n; ++i) y[i] = std::exp(x[i]);
}
}  // namespace

int main(int argc, char** argv) {
    const long n = argc > 1 ? std::atol(argv[1]) : 8192;
    const int reps = argc > 2 ? std::atoi(argv[2]) : 2000, rounds = argc > 3 ? std::atoi(argv[3]) : 7;
    std::vector<float> x(static_cast<std::size_t>(n)), y(x.size()), z(x.size());
    unsigned s = 1;
    for (auto& v : x) {
        s = s * 1664525u + 1013904223u;
        v = -20.0f * float(s >> 8) / float(1 << 24);  // in [−20, 0]
        if ((s & 63) == 0) v = -std::numeric_limits<float>::infinity();
    }
    double best_ours = 1e30, best_xs = 1e30, sink = 0;
    for (int r = 0; r < rounds; ++r) {
        double c0 = cpu_now();
        for (int k = 0; k < reps; ++k) ours_exp(x.data(), y.data(), n), sink += y[std::size_t(k % n)];
        best_ours = std::min(best_ours, cpu_now() - c0);
        c0 = cpu_now();
        for (int k = 0; k < reps; ++k) xsimd_exp(x.data(), z.data(), n), sink += z[std::size_t(k % n)];
        best_xs = std::min(best_xs, cpu_now() - c0);
    }
    double worst = 0;
    for (long i = 0; i < n; ++i)
        if (z[std::size_t(i)] > 0) worst = std::max(worst, std::fabs(double(y[std::size_t(i)]) / double(z[std::size_t(i)]) - 1));
    const double per = 1e9 / double(reps) / double(n);
    std::printf("float32 exp, n %ld: ours %.3f ns/value, xsimd %.3f ns/value: %.2fx (largest relative difference %.2g; %g)\n",
                n, best_ours * per, best_xs * per, best_xs / best_ours, worst, sink);
    return 0;
}
