// One question (docs/design.md "xtensor-blas"): what does xtensor-blas's xt::linalg::dot cost against one
// cblas_sgemm call on the same OpenBLAS, for the products of a training step (C = A·B, and the backward's
// dW += dY·Xᵀ)? Stand-alone: not part of the build (the core does not use xtensor-blas). On Debian/Ubuntu:
//   apt-get install libxtensor-blas-dev libopenblas-dev
//   g++ -O2 -march=native -std=c++17 -DXTENSOR_USE_XSIMD bench/bench_xtensor_blas.cpp -o /tmp/bench_xtensor_blas -lopenblas
//   /tmp/bench_xtensor_blas
// (xtensor-blas declares the CBLAS enums itself, so <cblas.h> cannot be included beside it: the one
// OpenBLAS function needed is declared by hand.) Medians of 41 runs, one BLAS thread.
#include <xtensor/xtensor.hpp>
#include <xtensor/xrandom.hpp>
#include <xtensor/xview.hpp>
#include <xtensor-blas/xlinalg.hpp>
extern "C" void openblas_set_num_threads(int);
#include <chrono>
#include <cstdio>
#include <algorithm>
#include <vector>

template <class F>
double best_us(F f, int reps) {
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
        auto a = std::chrono::steady_clock::now();
        f();
        auto b = std::chrono::steady_clock::now();
        t.push_back(std::chrono::duration<double, std::micro>(b - a).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

int main() {
    openblas_set_num_threads(1);
    struct S { int m, n, k; const char* what; };
    const S shapes[] = {{64, 768, 384, "Q = W_q X (d_attn 64, 768 tokens, d_e 384)"},
                        {384, 1536, 768, "MLP: W_mlp2 H (384 x 1536 tokens x 768)"},
                        {64, 64, 64, "one head's 64x64 scores, d_attn 64"}};
    std::printf("shape | forward C = A B: xt::linalg::dot / cblas_sgemm | backward dW += dY Xt: dot(dY, transpose(X)) + add / cblas_sgemm(beta=1)\n");
    for (const S& s : shapes) {
        xt::xtensor<float, 2, xt::layout_type::row_major> A = xt::random::rand<float>({s.m, s.k});
        xt::xtensor<float, 2, xt::layout_type::row_major> B = xt::random::rand<float>({s.k, s.n});
        xt::xtensor<float, 2, xt::layout_type::row_major> C = xt::zeros<float>({s.m, s.n});
        xt::xtensor<float, 2, xt::layout_type::row_major> dY = xt::random::rand<float>({s.m, s.n});
        xt::xtensor<float, 2, xt::layout_type::row_major> X = xt::random::rand<float>({s.k, s.n});
        xt::xtensor<float, 2, xt::layout_type::row_major> dW = xt::zeros<float>({s.m, s.k});
        const int reps = 41;
        double f_x = best_us([&] { C = xt::linalg::dot(A, B); }, reps);
        double f_b = best_us([&] { cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s.m, s.n, s.k, 1.f, A.data(), s.k, B.data(), s.n, 0.f, C.data(), s.n); }, reps);
        double b_x = best_us([&] { dW += xt::linalg::dot(dY, xt::transpose(X)); }, reps);
        double b_b = best_us([&] { cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s.m, s.k, s.n, 1.f, dY.data(), s.n, X.data(), s.n, 1.f, dW.data(), s.k); }, reps);
        std::printf("%s | %.0f / %.0f us = %.2fx | %.0f / %.0f us = %.2fx\n", s.what, f_x, f_b, f_x / f_b, b_x, b_b, b_x / b_b);
    }
    // One head's scores S = K_hᵀ Q_h with K_h, Q_h rows h·64 … h·64+63 of the fused (3·d_e) × ℓ projection
    // (d_e 384, ℓ 256): a strided view for xt::linalg::dot, leading dimensions for cblas_sgemm.
    {
        const int d = 384, l = 256, dh = 64, h = 2;
        xt::xtensor<float, 2, xt::layout_type::row_major> QKV = xt::random::rand<float>({3 * d, l});  // rows: q, k, v
        xt::xtensor<float, 2, xt::layout_type::row_major> S = xt::zeros<float>({l, l});
        auto Qh = xt::view(QKV, xt::range(h * dh, (h + 1) * dh), xt::all());
        auto Kh = xt::view(QKV, xt::range(d + h * dh, d + (h + 1) * dh), xt::all());
        double x = best_us([&] { S = xt::linalg::dot(xt::transpose(Kh), Qh); }, 41);
        double b = best_us([&] { cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, l, l, dh, 1.f, QKV.data() + (d + h * dh) * l, l,
                                             QKV.data() + h * dh * l, l, 0.f, S.data(), l); }, 41);
        std::printf("one head's scores K_h^T Q_h, rows of the fused QKV (d_e 384, l 256) | %.0f / %.0f us = %.2fx |\n", x, b, x / b);
    }
}
