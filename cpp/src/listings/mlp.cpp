// The MLP of the architectures' residual updates, as the listings print it (registered as MLP "gelu"; the
// "relu" MLP, variants/relu_mlp.cpp, is it with φ = ReLU):
//   Algorithm 10 line 8:   X ← X + W_mlp2 GELU(W_mlp1 X̃ + b_mlp1 1ᵀ) + b_mlp2 1ᵀ
//   Algorithm 9 line 7 (GELU), Algorithm 8 lines 7 and 18 (ReLU; the decoder's W_mlp3, b_mlp3, W_mlp4, b_mlp4).
// φ is the spec's activation; V5 (bias = false) drops b_mlp1 and b_mlp2 (each W X + b 1ᵀ becomes W X).
#include <algorithm>

#include "formal_transformers/affine_set.hpp"
#include "formal_transformers/blas.hpp"
#include "formal_transformers/lora.hpp"
#include "formal_transformers/parts.hpp"

namespace ft {

namespace {
template <class T>
class StandardMLP final : public MLPPart<T> {
    enum Slot { H_, A_ };  // saved activations: H = W_mlp1 X̃ + b_mlp1 1ᵀ, A = φ(H)

public:
    StandardMLP(const MLPSpec& s, ParamStore<T>& store, const std::string& p)
        : d_e(s.d_e), d_mlp(s.d_mlp), act(s.act), bias(s.bias) {
        W_1 = store.matrix(p + s.W1, d_mlp, d_e);
        if (bias) b_1 = store.vector(p + s.b1, d_mlp);
        W_2 = store.matrix(p + s.W2, d_e, d_mlp);
        if (bias) b_2 = store.vector(p + s.b2, d_e);
    }
    void init(ParamStore<T>& store, Rng& rng, double stddev, double out_stddev) const override {
        store.normal(W_1.offset, d_mlp * d_e, stddev, rng);
        if (bias) store.fill(b_1.offset, d_mlp, T(0));
        store.normal(W_2.offset, d_e * d_mlp, out_stddev, rng);
        if (bias) store.fill(b_2.offset, d_e, T(0));
    }
    // Out += W_mlp2 φ(W_mlp1 X̃ + b_mlp1 1ᵀ) + b_mlp2 1ᵀ
    void forward(const ParamStore<T>& store, CMatView<T> Xt, MatView<T> Out, MLPCache<T>& c) const override {
        MatView<T> H = ensure(c.at(H_), d_mlp, Xt.cols), A = ensure(c.at(A_), d_mlp, Xt.cols);
        affine<T>(store, W_1, Xt, b(store, b_1), H);      // W_mlp1 X̃ + b_mlp1 1ᵀ
        activation_forward<T>(act, H, A);                   // φ: GELU or ReLU
        affine_add<T>(store, W_2, A, b(store, b_2), Out);  // X + W_mlp2 (…) + b_mlp2 1ᵀ
    }
    void backward(ParamStore<T>& store, CMatView<T> Xt, const MLPCache<T>& c, CMatView<T> dOut, MatView<T> dXt,
                  Matrix<T>& dH) const override {
        MatView<T> dh = ensure(dH, d_mlp, Xt.cols);
        affine_backward_set<T>(store, W_2, view(c.at(A_)), dOut, store.grad_if_trained(W_2), db(store, b_2), dh.data);  // dA = W_mlp2ᵀ dOut
        activation_backward<T>(act, view(c.at(H_)), dh, dh);                                                 // dH = φ′(H) ⊙ dA
        affine_backward<T>(store, W_1, Xt, dh, store.grad_if_trained(W_1), db(store, b_1), dXt.data, dXt.ld);       // dX̃ += W_mlp1ᵀ dH
    }

private:
    const T* b(const ParamStore<T>& s, const VecParam& v) const { return bias ? s.v(v) : nullptr; }
    T* db(ParamStore<T>& s, const VecParam& v) const { return bias ? s.grad_if_trained(v) : nullptr; }
    index_t d_e, d_mlp;
    Activation act;
    bool bias;
    MatParam W_1, W_2;
    VecParam b_1, b_2;
};
}  // namespace

template <class T>
std::shared_ptr<const MLPPart<T>> make_standard_mlp(const MLPSpec& spec, ParamStore<T>& store, const std::string& prefix) {
    return std::make_shared<StandardMLP<T>>(spec, store, prefix);
}
template std::shared_ptr<const MLPPart<float>> make_standard_mlp<float>(const MLPSpec&, ParamStore<float>&, const std::string&);
template std::shared_ptr<const MLPPart<double>> make_standard_mlp<double>(const MLPSpec&, ParamStore<double>&, const std::string&);

}  // namespace ft
