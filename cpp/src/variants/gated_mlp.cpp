// The gated MLPs (Shazeer 2020, "GLU Variants Improve Transformer"): one part, the gate's nonlinearity φ its
// parameter, registered as MLP "swiglu" (Algorithm V4, φ = SiLU) and "geglu" (Algorithm V18b, φ = GELU_tanh,
// T5 v1.1's "gated-gelu", Hugging Face's gelu_new); docs/variants.md V4 and V18b, variants.hpp quotes V4:
//   1  G ← W_gate X̃ + b_gate 1ᵀ
//   2  U ← W_mlp1 X̃ + b_mlp1 1ᵀ
//   3  A ← φ(G) ⊙ U
//   4  return Y = W_mlp2 A + b_mlp2 1ᵀ
// It replaces Algorithm 10's line 8 (and Algorithm 8's lines 7, 18); V5 (bias false): no b's.
// Backward: dA = W_mlp2ᵀ dY; dU = dA ⊙ φ(G); dG = dA ⊙ U ⊙ φ′(G); dX̃ = W_gateᵀ dG + W_mlp1ᵀ dU.
//   SiLU(x) = x σ(x) = x / (1 + e^{−x});  SiLU′(x) = σ(x) (1 + x (1 − σ(x))).
//   GELU_tanh(x) = ½ x (1 + tanh(√(2/π)(x + 0.044715 x³))): functions.cpp's gelu with Gelu::Tanh.
#include <algorithm>
#include <cmath>

#include <xsimd/xsimd.hpp>

#include "formal_transformers/blas.hpp"
#include "formal_transformers/functions.hpp"
#include "formal_transformers/lora.hpp"
#include "formal_transformers/parts.hpp"
#include "formal_transformers/variants.hpp"

namespace ft {

// ===================================== SiLU, V4's φ (xsimd: exp in SIMD, as functions.cpp's GELU) ========
template <class T>
void silu(const T* x, T* y, index_t n) {
    using B = xsimd::batch<T>;
    index_t i = 0;
    for (; i + index_t(B::size) <= n; i += index_t(B::size)) {
        const B v = B::load_unaligned(x + i);
        (v / (T(1) + xsimd::exp(-v))).store_unaligned(y + i);  // x σ(x)
    }
    for (; i < n; ++i) y[i] = x[i] / (T(1) + std::exp(-x[i]));
}
template <class T>
void silu_backward(const T* x, const T* dy, T* dx, index_t n) {
    using B = xsimd::batch<T>;
    index_t i = 0;
    for (; i + index_t(B::size) <= n; i += index_t(B::size)) {
        const B v = B::load_unaligned(x + i);
        const B sg = T(1) / (T(1) + xsimd::exp(-v));
        (B::load_unaligned(dy + i) * (sg * (T(1) + v * (T(1) - sg)))).store_unaligned(dx + i);
    }
    for (; i < n; ++i) {
        const T sg = T(1) / (T(1) + std::exp(-x[i]));
        dx[i] = dy[i] * (sg * (T(1) + x[i] * (T(1) - sg)));  // SiLU′(x) = σ(x)(1 + x(1 − σ(x)))
    }
}

// ===================================== the part ========================================================
namespace {
// φ and φ′ on one column: y = φ(x); dx = φ′(x) ⊙ dy (y may alias x, dx may alias dy).
template <class T>
struct Gate {
    void (*f)(const T* x, T* y, index_t n);
    void (*f_backward)(const T* x, const T* dy, T* dx, index_t n);
};
template <class T>
Gate<T> silu_gate() {
    return {silu<T>, silu_backward<T>};
}
template <class T>
Gate<T> gelu_tanh_gate() {
    return {[](const T* x, T* y, index_t n) { gelu<T>(x, y, n, Gelu::Tanh); },
            [](const T* x, const T* dy, T* dx, index_t n) { gelu_backward<T>(x, dy, dx, n, Gelu::Tanh); }};
}

// Y ← GatedMLP_φ(X̃ | W_gate, b_gate, W_mlp1, b_mlp1, W_mlp2, b_mlp2), added into the residual stream. Parameters
// registered W_gate, b_gate, W_mlp1, b_mlp1, W_mlp2, b_mlp2 (V4's order).
template <class T>
class GatedMLP final : public MLPPart<T> {
    enum Slot { U_, A_, G_ };  // saved activations: U (line 2), A (line 3), G (line 1)

public:
    GatedMLP(const MLPSpec& s, ParamStore<T>& store, const std::string& p, Gate<T> phi)
        : d_e(s.d_e), d_mlp(s.d_mlp), bias(s.bias), phi(phi) {
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
        affine<T>(store, W_g, Xt, b(store, b_g), G);  // line 1: G ← W_gate X̃ + b_gate 1ᵀ
        affine<T>(store, W_1, Xt, b(store, b_1), U);  // line 2: U ← W_mlp1 X̃ + b_mlp1 1ᵀ
#pragma omp parallel for schedule(static) if (A.size() > 16384)
        for (index_t j = 0; j < n; ++j) {  // line 3: A ← φ(G) ⊙ U
            const T* u = U.col(j);
            T* a = A.col(j);
            phi.f(G.col(j), a, d_mlp);
            for (index_t i = 0; i < d_mlp; ++i) a[i] *= u[i];
        }
        affine_add<T>(store, W_2, A, b(store, b_2), Out);  // line 4, into the stream: X + W_mlp2 A + b_mlp2 1ᵀ
    }
    void backward(ParamStore<T>& store, CMatView<T> Xt, const MLPCache<T>& c, CMatView<T> dOut, MatView<T> dXt,
                  Matrix<T>& dH) const override {
        const index_t n = Xt.cols;
        MatView<T> dd = ensure(dH, 2 * d_mlp, n);  // [dA (then dU); dG]
        std::fill(dd.data, dd.data + dd.size(), T(0));
        MatView<T> dA = dd.rows_range(0, d_mlp), dG = dd.rows_range(d_mlp, d_mlp);
        affine_backward<T>(store, W_2, view(c.at(A_)), dOut, store.grad_if_trained(W_2), db(store, b_2), dA.data, dA.ld);  // d(line 4)
        CMatView<T> G = view(c.at(G_)), U = view(c.at(U_));
#pragma omp parallel for schedule(static) if (dA.size() > 16384)
        for (index_t j = 0; j < n; ++j) {  // d(line 3): dU = dA ⊙ φ(G) (in dA's place), dG = φ′(G) ⊙ (dA ⊙ U)
            const T *g = G.col(j), *u = U.col(j);
            T *da = dA.col(j), *dg = dG.col(j);
            phi.f(g, dg, d_mlp);  // φ(G), held in dG's column until dA ⊙ U replaces it
            for (index_t i = 0; i < d_mlp; ++i) {
                const T a = da[i];
                da[i] = a * dg[i];
                dg[i] = a * u[i];
            }
            phi.f_backward(g, dg, dg, d_mlp);
        }
        affine_backward<T>(store, W_1, Xt, dA, store.grad_if_trained(W_1), db(store, b_1), dXt.data, dXt.ld);  // d(line 2)
        affine_backward<T>(store, W_g, Xt, dG, store.grad_if_trained(W_g), db(store, b_g), dXt.data, dXt.ld);  // d(line 1)
    }

private:
    const T* b(const ParamStore<T>& s, const VecParam& v) const { return bias ? s.v(v) : nullptr; }
    T* db(ParamStore<T>& s, const VecParam& v) const { return bias ? s.grad_if_trained(v) : nullptr; }
    index_t d_e, d_mlp;
    bool bias;
    Gate<T> phi;
    MatParam W_g, W_1, W_2;
    VecParam b_g, b_1, b_2;
};
}  // namespace

// Algorithm V4 (SwiGLU): φ = SiLU.
template <class T>
std::shared_ptr<const MLPPart<T>> make_swiglu_mlp(const MLPSpec& spec, ParamStore<T>& store, const std::string& prefix) {
    return std::make_shared<GatedMLP<T>>(spec, store, prefix, silu_gate<T>());
}
// Algorithm V18b (GEGLU): φ = GELU_tanh.
template <class T>
std::shared_ptr<const MLPPart<T>> make_geglu_mlp(const MLPSpec& spec, ParamStore<T>& store, const std::string& prefix) {
    return std::make_shared<GatedMLP<T>>(spec, store, prefix, gelu_tanh_gate<T>());
}

#define FT_INSTANTIATE(T)                                                                                          \
    template void silu<T>(const T*, T*, index_t);                                                                  \
    template void silu_backward<T>(const T*, const T*, T*, index_t);                                               \
    template std::shared_ptr<const MLPPart<T>> make_swiglu_mlp<T>(const MLPSpec&, ParamStore<T>&, const std::string&); \
    template std::shared_ptr<const MLPPart<T>> make_geglu_mlp<T>(const MLPSpec&, ParamStore<T>&, const std::string&);
FT_INSTANTIATE(float)
FT_INSTANTIATE(double)
#undef FT_INSTANTIATE

}  // namespace ft
