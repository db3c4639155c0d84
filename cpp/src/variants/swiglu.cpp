// Algorithm V4: SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer"), variants.hpp quotes the listing;
// here SiLU, the gate of line 3, and the MLP part that replaces Algorithm 10's line 8 (registered as MLP "swiglu").
#include <algorithm>
#include <cmath>

#include <xsimd/xsimd.hpp>

#include "formal_transformers/blas.hpp"
#include "formal_transformers/parts.hpp"
#include "formal_transformers/variants.hpp"

namespace ft {
namespace {
template <class T>
using Batch = xsimd::batch<T>;
template <class T>
constexpr index_t Lanes = index_t(Batch<T>::size);
}  // namespace

// ===================================== SiLU and Algorithm V4 line 3 ===================================
template <class T>
void silu(const T* x, T* y, index_t n) {
    for (index_t i = 0; i < n; ++i) y[i] = x[i] / (T(1) + std::exp(-x[i]));  // x σ(x)
}
template <class T>
void silu_backward(const T* x, const T* dy, T* dx, index_t n) {
    for (index_t i = 0; i < n; ++i) {
        const T sg = T(1) / (T(1) + std::exp(-x[i]));
        dx[i] = dy[i] * sg * (T(1) + x[i] * (T(1) - sg));  // SiLU′(x) = σ(x)(1 + x(1 − σ(x)))
    }
}

// (xsimd: exp in SIMD, as functions.cpp's GELU; scalar tails)
template <class T>
void swiglu_gate(CMatView<T> G, CMatView<T> U, MatView<T> A) {
#pragma omp parallel for schedule(static) if (A.size() > 16384)
    for (index_t j = 0; j < A.cols; ++j) {
        const T *g = G.col(j), *u = U.col(j);
        T* a = A.col(j);
        index_t i = 0;
        for (; i + Lanes<T> <= A.rows; i += Lanes<T>) {  // A ← SiLU(G) ⊙ U, SiLU(g) = g σ(g)
            const Batch<T> gv = Batch<T>::load_unaligned(g + i);
            (gv / (T(1) + xsimd::exp(-gv)) * Batch<T>::load_unaligned(u + i)).store_unaligned(a + i);
        }
        for (; i < A.rows; ++i) a[i] = g[i] / (T(1) + std::exp(-g[i])) * u[i];
    }
}

template <class T>
void swiglu_gate_backward(CMatView<T> G, CMatView<T> U, CMatView<T> dA, MatView<T> dG, MatView<T> dU) {
#pragma omp parallel for schedule(static) if (dA.size() > 16384)
    for (index_t j = 0; j < dA.cols; ++j) {
        const T *g = G.col(j), *u = U.col(j), *da = dA.col(j);
        T *dg = dG.col(j), *du = dU.col(j);
        index_t i = 0;
        for (; i + Lanes<T> <= dA.rows; i += Lanes<T>) {
            const Batch<T> gv = Batch<T>::load_unaligned(g + i), a = Batch<T>::load_unaligned(da + i);
            const Batch<T> sg = T(1) / (T(1) + xsimd::exp(-gv));
            const Batch<T> uv = Batch<T>::load_unaligned(u + i);
            (a * (gv * sg)).store_unaligned(du + i);                         // dU = dA ⊙ SiLU(G)
            (a * uv * (sg * (T(1) + gv * (T(1) - sg)))).store_unaligned(dg + i);  // dG = dA ⊙ U ⊙ SiLU′(G)
        }
        for (; i < dA.rows; ++i) {
            const T sg = T(1) / (T(1) + std::exp(-g[i]));
            const T a = da[i];
            du[i] = a * (g[i] * sg);                                 // dU = dA ⊙ SiLU(G)
            dg[i] = a * u[i] * (sg * (T(1) + g[i] * (T(1) - sg)));  // dG = dA ⊙ U ⊙ SiLU′(G)
        }
    }
}

// ===================================== the part ========================================================
namespace {
// Y ← SwiGLU(X̃ | W_gate, b_gate, W_mlp1, b_mlp1, W_mlp2, b_mlp2), added into the residual stream; V5 (bias
// false): no b's. Parameters registered W_gate, b_gate, W_mlp1, b_mlp1, W_mlp2, b_mlp2 (V4's order).
template <class T>
class SwiGLU final : public MLPPart<T> {
    enum Slot { U_, A_, G_ };  // saved activations: U (line 2), A (line 3), G (line 1)

public:
    SwiGLU(const MLPSpec& s, ParamStore<T>& store, const std::string& p) : d_e(s.d_e), d_mlp(s.d_mlp), bias(s.bias) {
        W_g = store.matrix(p + "W_gate", d_mlp, d_e);
        if (bias) b_g = store.vector(p + "b_gate", d_mlp);
        W_1 = store.matrix(p + s.W1, d_mlp, d_e);
        if (bias) b_1 = store.vector(p + s.b1, d_mlp);
        W_2 = store.matrix(p + s.W2, d_e, d_mlp);
        if (bias) b_2 = store.vector(p + s.b2, d_e);
    }
    void init(ParamStore<T>& store, Rng& rng, double stddev, double out_stddev) const override {
        store.normal(W_g.offset, d_mlp * d_e, stddev, rng);
        if (bias) store.fill(b_g.offset, d_mlp, T(0));
        store.normal(W_1.offset, d_mlp * d_e, stddev, rng);
        if (bias) store.fill(b_1.offset, d_mlp, T(0));
        store.normal(W_2.offset, d_e * d_mlp, out_stddev, rng);
        if (bias) store.fill(b_2.offset, d_e, T(0));
    }
    void forward(const ParamStore<T>& store, CMatView<T> Xt, MatView<T> Out, MLPCache<T>& c) const override {
        const index_t n = Xt.cols;
        MatView<T> G = ensure(c.at(G_), d_mlp, n), U = ensure(c.at(U_), d_mlp, n), A = ensure(c.at(A_), d_mlp, n);
        affine<T>(store.W(W_g), Xt, b(store, b_g), G);    // line 1: G ← W_gate X̃ + b_gate 1ᵀ
        affine<T>(store.W(W_1), Xt, b(store, b_1), U);    // line 2: U ← W_mlp1 X̃ + b_mlp1 1ᵀ
        swiglu_gate<T>(G, U, A);                           // line 3: A ← SiLU(G) ⊙ U
        affine_add<T>(store.W(W_2), A, b(store, b_2), Out);  // line 4, into the stream: X + W_mlp2 A + b_mlp2 1ᵀ
    }
    void backward(ParamStore<T>& store, CMatView<T> Xt, const MLPCache<T>& c, CMatView<T> dOut, MatView<T> dXt,
                  Matrix<T>& dH) const override {
        MatView<T> dd = ensure(dH, 2 * d_mlp, Xt.cols);  // [dA (then dU); dG]
        std::fill(dd.data, dd.data + dd.size(), T(0));
        MatView<T> dA = dd.rows_range(0, d_mlp), dG = dd.rows_range(d_mlp, d_mlp);
        affine_backward<T>(store.W(W_2), view(c.at(A_)), dOut, store.dW(W_2).data, db(store, b_2), dA.data, dA.ld);  // d(line 4)
        swiglu_gate_backward<T>(view(c.at(G_)), view(c.at(U_)), dA, dG, dA);  // d(line 3): dU (in dA's place), dG
        affine_backward<T>(store.W(W_1), Xt, dA, store.dW(W_1).data, db(store, b_1), dXt.data, dXt.ld);  // d(line 2)
        affine_backward<T>(store.W(W_g), Xt, dG, store.dW(W_g).data, db(store, b_g), dXt.data, dXt.ld);  // d(line 1)
    }

private:
    const T* b(const ParamStore<T>& s, const VecParam& v) const { return bias ? s.v(v) : nullptr; }
    T* db(ParamStore<T>& s, const VecParam& v) const { return bias ? s.dv(v) : nullptr; }
    index_t d_e, d_mlp;
    bool bias;
    MatParam W_g, W_1, W_2;
    VecParam b_g, b_1, b_2;
};
}  // namespace

template <class T>
std::shared_ptr<const MLPPart<T>> make_swiglu_mlp(const MLPSpec& spec, ParamStore<T>& store, const std::string& prefix) {
    return std::make_shared<SwiGLU<T>>(spec, store, prefix);
}

#define FT_INSTANTIATE(T)                                                                           \
    template void silu<T>(const T*, T*, index_t);                                                   \
    template void silu_backward<T>(const T*, const T*, T*, index_t);                                \
    template void swiglu_gate<T>(CMatView<T>, CMatView<T>, MatView<T>);                             \
    template void swiglu_gate_backward<T>(CMatView<T>, CMatView<T>, CMatView<T>, MatView<T>, MatView<T>); \
    template std::shared_ptr<const MLPPart<T>> make_swiglu_mlp<T>(const MLPSpec&, ParamStore<T>&, const std::string&);
FT_INSTANTIATE(float)
FT_INSTANTIATE(double)
#undef FT_INSTANTIATE

}  // namespace ft
