// Benchmark (not a test): one head's attention forward + backward at long ℓ, Algorithm 4 as printed
// (attention_head: the ℓ×ℓ weights) against the tiled listing (tiled_attention_head, docs/tiled_attention.md)
// with its tile products as one-thread BLAS calls, our register-blocked kernels or our own loops, over a few tile
// sizes; one thread
// (MHAttention runs one head per thread), float32, causal, d_attn = d_v = 32 (the baby GPT's heads) or --d.
//
//   g++ -O3 -march=native -fopenmp -std=c++17 -DXTENSOR_USE_XSIMD -I cpp/include bench/bench_tiles.cpp build/dev/libft_core.a \
//       $(python -c "import scipy_openblas32 as s; print(s.get_lib_dir() + '/' + s.get_library(True))") -o build/dev/bench_tiles
//   OMP_NUM_THREADS=1 ./build/dev/bench_tiles [l=2048] [d=32] [reps=5] [B_q B_k [blas|blocked|loops]]
// (with B_q B_k: only the literal path and the BLAS and blocked tiles of that size; with blas|blocked|loops only
// the tiles with that kernel and no literal path, e.g. under perf record)
// Prints for each the median wall ms of forward+backward, the least CPU time of this thread over the same runs
// (a machine shared with other work disturbs it less) and the forward's alone, and the speed-up over the literal
// path in CPU time.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "formal_transformers/attention.hpp"
#include "formal_transformers/blas.hpp"
#include "formal_transformers/tiled_attention.hpp"

using namespace ft;

namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
// this thread's CPU time (s): on a machine shared with other work, the time the kernel itself ran
double cpu_now() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// median wall ms; *cpu: the least CPU ms of the same runs
template <class F>
double median_ms(int reps, F&& f, double* cpu = nullptr) {
    std::vector<double> t, c;
    f();  // warm-up
    for (int r = 0; r < reps; ++r) {
        const double t0 = now(), c0 = cpu_now();
        f();
        c.push_back((cpu_now() - c0) * 1e3);
        t.push_back((now() - t0) * 1e3);
    }
    std::sort(t.begin(), t.end());
    std::sort(c.begin(), c.end());
    if (cpu) *cpu = c[0];  // the least: the run least disturbed by other work
    return t[t.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
    const index_t l = argc > 1 ? std::atol(argv[1]) : 2048, d = argc > 2 ? std::atol(argv[2]) : 32;
    const int reps = argc > 3 ? std::atoi(argv[3]) : 5;
    Rng rng(1);
    auto rnd = [&](index_t n) {
        std::vector<float> v(static_cast<std::size_t>(n));
        for (auto& x : v) x = float(rng.normal());
        return v;
    };
    std::vector<float> Q = rnd(d * l), K = rnd(d * l), V = rnd(d * l), dY = rnd(d * l), Y(std::size_t(d * l)),
                       dQ(Q.size()), dK(Q.size()), dV(Q.size()), lse(static_cast<std::size_t>(l));
    const Mask mask = Mask::unidirectional();
    HeadBlock<float> blk;  // one head of one sequence, the causal mask part, no bias, no dropout
    blk.mask = &mask;
    CMatView<float> q(Q.data(), d, l), k(K.data(), d, l), v(V.data(), d, l), dy(dY.data(), d, l);
    std::printf("one head, causal, l %ld, d %ld, float32, one thread; BLAS: %s\n", long(l), long(d), blas_info().c_str());
    std::vector<float> A(std::size_t(l * l)), dA(A.size());
    double lit_cpu = 1;
    const double lit = argc > 6 ? 1.0 : median_ms(reps, [&] {
        attention_head<float>(q, k, v, blk, MatView<float>(A.data(), l, l), MatView<float>(Y.data(), d, l));
        attention_head_backward<float>(q, k, v, CMatView<float>(A.data(), l, l), dy, MatView<float>(dQ.data(), d, l),
                                       MatView<float>(dK.data(), d, l), MatView<float>(dV.data(), d, l),
                                       MatView<float>(dA.data(), l, l));
    }, &lit_cpu);
    std::printf("  literal (attention_head)            %8.2f ms (CPU %8.2f ms)\n", lit, lit_cpu);
    std::vector<TileSizes> sizes{TileSizes{32, 64},   TileSizes{64, 64},   TileSizes{64, 128}, TileSizes{128, 128},
                                 TileSizes{64, 256},  TileSizes{128, 256}, TileSizes{256, 256}};
    std::vector<TileKernel> kernels{TileKernel::Blas, TileKernel::Blocked, TileKernel::Loops};
    if (argc > 5) sizes = {TileSizes{std::atol(argv[4]), std::atol(argv[5])}}, kernels = {TileKernel::Blas, TileKernel::Blocked};
    if (argc > 6) {
        const std::string k = argv[6];
        kernels = {k == "blas" ? TileKernel::Blas : k == "blocked" ? TileKernel::Blocked : TileKernel::Loops};
    }
    for (TileKernel kern : kernels)
        for (TileSizes ts : sizes) {
            ts.kernel = kern;
            double cpu = 0, fwd_cpu = 0;
            median_ms(reps, [&] { tiled_attention_head<float>(q, k, v, blk, MatView<float>(Y.data(), d, l), lse.data(), ts); },
                      &fwd_cpu);
            const double t = median_ms(reps, [&] {
                tiled_attention_head<float>(q, k, v, blk, MatView<float>(Y.data(), d, l), lse.data(), ts);
                tiled_attention_head_backward<float>(q, k, v, CMatView<float>(Y.data(), d, l), lse.data(), dy, blk,
                                                     MatView<float>(dQ.data(), d, l), MatView<float>(dK.data(), d, l),
                                                     MatView<float>(dV.data(), d, l), ts);
            }, &cpu);
            std::printf("  tiled %-5s B_q %3ld B_k %3ld          %8.2f ms (CPU %8.2f ms: forward %7.2f; %.2fx literal)\n",
                        kern == TileKernel::Blas ? "BLAS" : kern == TileKernel::Blocked ? "block" : "loops", long(ts.B_q),
                        long(ts.B_k), t, cpu, fwd_cpu, lit_cpu / cpu);
        }
    return 0;
}
