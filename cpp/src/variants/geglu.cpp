// Algorithm V18b: GEGLU, the gated GELU MLP (Shazeer 2020, "GLU Variants Improve Transformer"; T5 v1.1's
// "gated-gelu", with GELU's tanh form, Hugging Face's gelu_new), the MLP part registered as "geglu":
//   1  G ← W_gate X̃ + b_gate 1ᵀ
//   2  U ← W_mlp1 X̃ + b_mlp1 1ᵀ
//   3  A ← GELU_tanh(G) ⊙ U
//   4  return W_mlp2 A + b_mlp2 1ᵀ
// V4 (SwiGLU) with GELU for SiLU; V5 (bias false): no b's. GELU_tanh(g) = ½ g (1 + tanh(√(2/π)(g + 0.044715 g³))).
#include <algorithm>

#include "formal_transformers/blas.hpp"
#include "formal_transformers/parts.hpp"

namespace ft {
namespace {
template <class T>
class GeGLU final : public MLPPart<T> {
    enum Slot { U_, A_, G_, Gg_ };  // saved: U (line 2), A (line 3), G (line 1), GELU_tanh(G)

public:
    GeGLU(const MLPSpec& s, ParamStore<T>& store, const std::string& p) : d_e(s.d_e), d_mlp(s.d_mlp), bias(s.bias) {
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
        MatView<T> Gg = ensure(c.at(Gg_), d_mlp, n);
        affine<T>(store.W(W_g), Xt, b(store, b_g), G);  // line 1: G ← W_gate X̃ + b_gate 1ᵀ
        affine<T>(store.W(W_1), Xt, b(store, b_1), U);  // line 2: U ← W_mlp1 X̃ + b_mlp1 1ᵀ
        for (index_t j = 0; j < n; ++j) {               // line 3: A ← GELU_tanh(G) ⊙ U
            gelu<T>(G.col(j), Gg.col(j), d_mlp, Gelu::Tanh);
            const T *g = Gg.col(j), *u = U.col(j);
            T* a = A.col(j);
            for (index_t i = 0; i < d_mlp; ++i) a[i] = g[i] * u[i];
        }
        affine_add<T>(store.W(W_2), A, b(store, b_2), Out);  // line 4, into the stream: X + W_mlp2 A + b_mlp2 1ᵀ
    }
    void backward(ParamStore<T>& store, CMatView<T> Xt, const MLPCache<T>& c, CMatView<T> dOut, MatView<T> dXt,
                  Matrix<T>& dH) const override {
        const index_t n = Xt.cols;
        MatView<T> dd = ensure(dH, 2 * d_mlp, n);  // [dA (then dU); dG]
        std::fill(dd.data, dd.data + dd.size(), T(0));
        MatView<T> dA = dd.rows_range(0, d_mlp), dG = dd.rows_range(d_mlp, d_mlp);
        affine_backward<T>(store.W(W_2), view(c.at(A_)), dOut, store.dW(W_2).data, db(store, b_2), dA.data, dA.ld);  // d(line 4)
        CMatView<T> G = view(c.at(G_)), U = view(c.at(U_)), Gg = view(c.at(Gg_));
        for (index_t j = 0; j < n; ++j) {  // d(line 3): dG = GELU_tanh′(G) ⊙ (dA ⊙ U), dU = dA ⊙ GELU_tanh(G)
            T *da = dA.col(j), *dg = dG.col(j);
            const T *u = U.col(j), *g = Gg.col(j);
            for (index_t i = 0; i < d_mlp; ++i) dg[i] = da[i] * u[i];
            gelu_backward<T>(G.col(j), dg, dg, d_mlp, Gelu::Tanh);
            for (index_t i = 0; i < d_mlp; ++i) da[i] *= g[i];  // dU, in dA's place
        }
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
std::shared_ptr<const MLPPart<T>> make_geglu_mlp(const MLPSpec& spec, ParamStore<T>& store, const std::string& prefix) {
    return std::make_shared<GeGLU<T>>(spec, store, prefix);
}
template std::shared_ptr<const MLPPart<float>> make_geglu_mlp<float>(const MLPSpec&, ParamStore<float>&, const std::string&);
template std::shared_ptr<const MLPPart<double>> make_geglu_mlp<double>(const MLPSpec&, ParamStore<double>&, const std::string&);

}  // namespace ft
