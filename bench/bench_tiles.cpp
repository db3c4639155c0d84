// Benchmark (not a test): one head's attention forward + backward at long ℓ, Algorithm 4 as printed
// (attention_head: the ℓ×ℓ weights) against the tiled listing (tiled_attention_head, docs/tiled_attention.md)
// with its tile products as one-thread BLAS calls or as our own loops, over a few tile sizes; one thread
// (MHAttention runs one head per thread), float32, causal, d_attn = d_v = 32 (the baby GPT's heads) or --d.
//
//   g++ -O3 -march=native -fopenmp -std=c++17 -DXTENSOR_USE_XSIMD -I cpp/include bench/bench_tiles.cpp build/dev/libft_core.a \
//       $(python -c "import scipy_openblas32 as s; print(s.get_lib_dir() + '/' + s.get_library(True))") -o build/dev/bench_tiles
//   OMP_NUM_THREADS=1 ./build/dev/bench_tiles [l=2048] [d=32] [reps=5]
// Prints the median ms of forward+backward for each, and the speed-up over the literal path.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "formal_transformers/attention.hpp"
#include "formal_transformers/blas.hpp"
#include "formal_transformers/tiled_attention.hpp"

using namespace ft;

namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

template <class F>
double median_ms(int reps, F&& f) {
    std::vector<double> t;
    f();  // warm-up
    for (int r = 0; r < reps; ++r) {
        const double t0 = now();
        f();
        t.push_back((now() - t0) * 1e3);
    }
    std::sort(t.begin(), t.end());
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
    const double lit = median_ms(reps, [&] {
        attention_head<float>(q, k, v, blk, MatView<float>(A.data(), l, l), MatView<float>(Y.data(), d, l));
        attention_head_backward<float>(q, k, v, CMatView<float>(A.data(), l, l), dy, MatView<float>(dQ.data(), d, l),
                                       MatView<float>(dK.data(), d, l), MatView<float>(dV.data(), d, l),
                                       MatView<float>(dA.data(), l, l));
    });
    std::printf("  literal (attention_head)            %8.2f ms\n", lit);
    for (TileKernel kern : {TileKernel::Blas, TileKernel::Loops})
        for (TileSizes ts : {TileSizes{32, 64}, TileSizes{64, 64}, TileSizes{64, 128}, TileSizes{128, 128},
                             TileSizes{64, 256}, TileSizes{128, 256}, TileSizes{256, 256}}) {
            ts.kernel = kern;
            const double t = median_ms(reps, [&] {
                tiled_attention_head<float>(q, k, v, blk, MatView<float>(Y.data(), d, l), lse.data(), ts);
                tiled_attention_head_backward<float>(q, k, v, CMatView<float>(Y.data(), d, l), lse.data(), dy, blk,
                                                     MatView<float>(dQ.data(), d, l), MatView<float>(dK.data(), d, l),
                                                     MatView<float>(dV.data(), d, l), ts);
            });
            std::printf("  tiled %-5s B_q %3ld B_k %3ld          %8.2f ms  (%.2fx literal)\n",
                        kern == TileKernel::Blas ? "BLAS" : "loops", long(ts.B_q), long(ts.B_k), t, lit / t);
        }
    return 0;
}
