// V22 (BART): an encoder-decoder stack's embedding, Algorithm 8's lines 2–3 / 11–12 with √d_e scaling, the
// decoder's own W_p and a layer_norm (stack_embedding.hpp quotes the lines). Forward and backward side by side.
#include "formal_transformers/stack_embedding.hpp"

#include <algorithm>
#include <cmath>

namespace ft {

template <class T>
StackEmbedding<T>::StackEmbedding(const ModelConfig& c, const std::string& stack, ParamStore<T>& store) {
    if (c.scale_embedding) scale_ = T(std::sqrt(double(c.d_e)));
    if (c.separate_positions && stack == "dec")
        own_ = std::make_unique<PositionalEmbedding<T>>(c.l_max, c.d_e, c.positional, c.pos_base, store, stack + ".W_p");
    if (c.embed_norm) norm_ = std::make_unique<Norm<T>>("layer", c.d_e, c.eps, store, stack + ".gamma_e", stack + ".beta_e");
}

template <class T>
void StackEmbedding<T>::init(ParamStore<T>& store, Rng& rng, double stddev) const {
    if (own_) own_->init(store, rng, stddev);
    if (norm_) norm_->init(store);
}

template <class T>
void StackEmbedding<T>::forward(const ParamStore<T>& store, const TokenEmbedding<T>& tok, const PositionalEmbedding<T>& pos,
                                const index_t* ids, const Seqs& s, index_t offset, Matrix<T>& X, Cache& c) const {
    const index_t n = s.total(), d_e = tok.d_e;
    MatView<T> E = ensure(norm_ ? c.E : X, d_e, n);
    tok.forward(store, ids, n, E);  // line 2′: e_t ← W_e[:, x[t]] …
    if (scale_ != T(1))
        for (index_t i = 0; i < E.size(); ++i) E.data[i] *= scale_;  //   … · s
    table(pos).forward_seqs(store, s, E, offset);  //   … + W_p^stack[:, t]
    if (norm_) norm_->forward(store, E, ensure(X, d_e, n), c.norm);  // line 3′: layer_norm(· | γ_e, β_e)
}

template <class T>
void StackEmbedding<T>::backward(ParamStore<T>& store, const TokenEmbedding<T>& tok, const PositionalEmbedding<T>& pos,
                                 const index_t* ids, const Seqs& s, MatView<T> dX, Cache& c) const {
    MatView<T> dE = dX;
    Matrix<T> dEn;
    if (norm_) {  // line 3′ back: dE = layer_norm'(dX), dγ_e, dβ_e
        dE = ensure(dEn, dX.rows, dX.cols);
        std::fill(dE.data, dE.data + dE.size(), T(0));
        norm_->backward(store, dX, c.norm, dE);
    }
    table(pos).backward_seqs(store, s, dE);  // line 2′ back: dW_p^stack[:, t] += dE[:, t]
    if (scale_ != T(1))
        for (index_t i = 0; i < dE.size(); ++i) dE.data[i] *= scale_;  // ∂/∂(W_e[:, x[t]]) = s · dE[:, t]
    tok.backward(store, ids, s.total(), dE);
}

template class StackEmbedding<float>;
template class StackEmbedding<double>;

}  // namespace ft
