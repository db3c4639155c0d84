// Benchmark (not a test): the float32 exp under softmax and the tiled attention (functions.hpp exp_values, ours)
// against xsimd's exp on the same inputs, one thread, the two interleaved over --rounds rounds; the arguments as
// in the tiled attention's T1 line 5 (S − m′ ≤ 0, some −∞ from the mask).
//
//   g++ -O3 -march=native -fopenmp -std=c++17 -DXTENSOR_USE_XSIMD -I cpp/include bench/bench_exp.cpp build/rel/libft_core.a \
//       -o build/rel/bench_exp
//   ./build/rel/bench_exp [n=8192] [reps=2000] [rounds=7]
// Prints the least CPU ns per value of each side and their ratio (> 1: ours faster).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <vector>

#include <xsimd/xsimd.hpp>

#include "formal_transformers/functions.hpp"

namespace {
double cpu_now() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}
void xsimd_exp(const float* x, float* y, long n) {
    using B = xsimd::batch<float>;
    long i = 0;
    for (; i + long(B::size) <= n; i += long(B::size)) xsimd::exp(B::load_unaligned(x + i)).store_unaligned(y + i);
    for (; i < n; ++i) y[i] = std::exp(x[i]);
}
}  // namespace

int main(int argc, char** argv) {
    const long n = argc > 1 ? std::atol(argv[1]) : 8192;
    const int reps = argc > 2 ? std::atoi(argv[2]) : 2000, rounds = argc > 3 ? std::atoi(argv[3]) : 7;
    std::vector<float> x(std::size_t(n)), y(x.size()), z(x.size());
    unsigned s = 1;
    for (auto& v : x) {
        s = s * 1664525u + 1013904223u;
        v = -20.0f * float(s >> 8) / float(1 << 24);  // in [−20, 0]
        if ((s & 63) == 0) v = -std::numeric_limits<float>::infinity();
    }
    double best_ours = 1e30, best_xs = 1e30, sink = 0;
    for (int r = 0; r < rounds; ++r) {
        double c0 = cpu_now();
        for (int k = 0; k < reps; ++k) ft::exp_values<float>(x.data(), y.data(), n), sink += y[std::size_t(k % n)];
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
