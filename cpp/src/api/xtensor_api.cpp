// The models' xtensor API (transformers.hpp, docs/api.md "C++ API"): xtensor token sequences in, packed side by
// side, then the same core calls the Python bindings make — which check the input once (ft::validate in the
// models' forward: IndexError for ids outside [0, N_V), ValueError for empty or too long sequences, z and x of
// different counts); results as column-major xtensor matrices (N_V, ℓ) per sequence. This file and the bindings
// only convert.
#include <algorithm>

#include "formal_transformers/training.hpp"

namespace ft {

namespace {
// Sequences side by side: the core's batch layout.
struct Packed {
    std::vector<index_t> ids;
    Seqs s;
    Tokens tokens() const { return Tokens{ids.data(), s}; }
};
Packed pack(const std::vector<TokenIds>& seqs) {
    Dataset d = dataset(seqs);
    return Packed{std::move(d.ids), std::move(d.s)};
}
Packed pack(const TokenIds& x) { return pack(std::vector<TokenIds>{x}); }
// The last line of the listing on the last forward, one (N_V, ℓ_b) matrix per sequence b
template <class T>
std::vector<Matrix<T>> split(const Model<T>& m, const Seqs& s, bool logits) {
    const index_t n_vocab = m.cfg.n_vocab;
    checked_elements({n_vocab, s.total()}, sizeof(T), "P");
    Matrix<T> all = Matrix<T>::from_shape({std::size_t(n_vocab), std::size_t(s.total())});
    if (logits)
        m.logits(view(all));
    else
        m.probabilities(view(all));
    if (s.count() == 1) return {std::move(all)};
    std::vector<Matrix<T>> r;
    for (index_t b = 0; b < s.count(); ++b) {
        Matrix<T> P = Matrix<T>::from_shape({std::size_t(n_vocab), std::size_t(s.len(b))});
        std::copy(all.data() + s.begin(b) * n_vocab, all.data() + (s.begin(b) + s.len(b)) * n_vocab, P.data());
        r.push_back(std::move(P));
    }
    return r;
}
double reduce(double loss, index_t scored, bool mean) {
    return reduce_loss(loss, scored, mean ? TrainOptions::Reduction::Mean : TrainOptions::Reduction::Sum);
}
}  // namespace

// ------------------------------------------------------------------------------------------- Algorithm 10
template <class T>
std::vector<Matrix<T>> DTransformer<T>::operator()(const std::vector<TokenIds>& batch) {
    Packed p = pack(batch);
    forward(p.tokens());               // every line but the last
    return split(*this, p.s, false);   // the last: P = softmax(W_u X)
}
template <class T>
Matrix<T> DTransformer<T>::operator()(const TokenIds& x) {
    return std::move((*this)(std::vector<TokenIds>{x})[0]);
}
template <class T>
Matrix<T> DTransformer<T>::logits(const TokenIds& x) {
    Packed p = pack(x);
    forward(p.tokens());
    return std::move(split(*this, p.s, true)[0]);
}
template <class T>
double DTransformer<T>::loss_and_grad(const std::vector<TokenIds>& batch) {
    Packed p = pack(batch);
    return loss_and_grad(p.tokens());
}
template <class T>
double DTransformer<T>::loss_and_grad(const TokenIds& x) {
    return loss_and_grad(std::vector<TokenIds>{x});
}
template <class T>
double DTransformer<T>::loss(const std::vector<TokenIds>& batch, bool mean) {
    Packed p = pack(batch);
    index_t scored = 0;
    const double l = loss(p.tokens(), &scored);
    return reduce(l, scored, mean);
}
template <class T>
double DTransformer<T>::loss(const TokenIds& x, bool mean) {
    return loss(std::vector<TokenIds>{x}, mean);
}

// ------------------------------------------------------------------------------------------- Algorithm 9
template <class T>
std::vector<Matrix<T>> ETransformer<T>::operator()(const std::vector<TokenIds>& batch) {
    Packed p = pack(batch);
    forward(p.tokens());
    return split(*this, p.s, false);
}
template <class T>
Matrix<T> ETransformer<T>::operator()(const TokenIds& x_tilde) {
    return std::move((*this)(std::vector<TokenIds>{x_tilde})[0]);
}
namespace {
// x̃ and the originals x: the same length (ValueError otherwise)
Packed pack_pair(const TokenIds& x_tilde, const TokenIds& x, Packed& orig) {
    Packed p = pack(x_tilde);
    orig = pack(x);
    if (orig.s.total() != p.s.total())
        throw ValueError("x_tilde and x must have the same length, got " + std::to_string(p.s.total()) + " and " +
                         std::to_string(orig.s.total()));
    return p;
}
}  // namespace
template <class T>
double ETransformer<T>::loss_and_grad(const TokenIds& x_tilde, const TokenIds& x) {
    Packed orig;
    Packed p = pack_pair(x_tilde, x, orig);
    return loss_and_grad(p.tokens(), orig.ids.data());
}
template <class T>
double ETransformer<T>::loss(const TokenIds& x_tilde, const TokenIds& x, bool mean) {
    Packed orig;
    Packed p = pack_pair(x_tilde, x, orig);
    index_t scored = 0;
    const double l = loss(p.tokens(), orig.ids.data(), &scored);
    return reduce(l, scored, mean);
}

// ------------------------------------------------------------------------------------------- Algorithm 8
template <class T>
std::vector<Matrix<T>> EDTransformer<T>::operator()(const std::vector<TokenIds>& z, const std::vector<TokenIds>& x) {
    Packed pz = pack(z), px = pack(x);
    forward(pz.tokens(), px.tokens());
    return split(*this, px.s, false);
}
template <class T>
Matrix<T> EDTransformer<T>::operator()(const TokenIds& z, const TokenIds& x) {
    return std::move((*this)(std::vector<TokenIds>{z}, std::vector<TokenIds>{x})[0]);
}
template <class T>
double EDTransformer<T>::loss_and_grad(const std::vector<TokenIds>& z, const std::vector<TokenIds>& x) {
    Packed pz = pack(z), px = pack(x);
    return loss_and_grad(pz.tokens(), px.tokens());
}
template <class T>
double EDTransformer<T>::loss_and_grad(const TokenIds& z, const TokenIds& x) {
    return loss_and_grad(std::vector<TokenIds>{z}, std::vector<TokenIds>{x});
}
template <class T>
double EDTransformer<T>::loss(const TokenIds& z, const TokenIds& x, bool mean) {
    Packed pz = pack(z), px = pack(x);
    index_t scored = 0;
    const double l = loss(pz.tokens(), px.tokens(), &scored);
    return reduce(l, scored, mean);
}

// ------------------------------------------------------------------------------------------- Algorithms 11–13
Dataset dataset(const std::vector<TokenIds>& seqs) {
    Dataset d;
    for (const TokenIds& x : seqs) {
        d.ids.insert(d.ids.end(), x.begin(), x.end());
        d.s.off.push_back(d.s.off.back() + index_t(x.size()));
    }
    return d;
}

#define FT_XT_API(T)                                                                                            \
    template Matrix<T> DTransformer<T>::operator()(const TokenIds&);                                            \
    template std::vector<Matrix<T>> DTransformer<T>::operator()(const std::vector<TokenIds>&);                  \
    template Matrix<T> DTransformer<T>::logits(const TokenIds&);                                                \
    template double DTransformer<T>::loss_and_grad(const TokenIds&);                                            \
    template double DTransformer<T>::loss_and_grad(const std::vector<TokenIds>&);                               \
    template double DTransformer<T>::loss(const TokenIds&, bool);                                               \
    template double DTransformer<T>::loss(const std::vector<TokenIds>&, bool);                                  \
    template Matrix<T> ETransformer<T>::operator()(const TokenIds&);                                            \
    template std::vector<Matrix<T>> ETransformer<T>::operator()(const std::vector<TokenIds>&);                  \
    template double ETransformer<T>::loss_and_grad(const TokenIds&, const TokenIds&);                           \
    template double ETransformer<T>::loss(const TokenIds&, const TokenIds&, bool);                              \
    template Matrix<T> EDTransformer<T>::operator()(const TokenIds&, const TokenIds&);                          \
    template std::vector<Matrix<T>> EDTransformer<T>::operator()(const std::vector<TokenIds>&,                  \
                                                                 const std::vector<TokenIds>&);                 \
    template double EDTransformer<T>::loss_and_grad(const TokenIds&, const TokenIds&);                          \
    template double EDTransformer<T>::loss_and_grad(const std::vector<TokenIds>&, const std::vector<TokenIds>&); \
    template double EDTransformer<T>::loss(const TokenIds&, const TokenIds&, bool);
FT_XT_API(float)
FT_XT_API(double)
#undef FT_XT_API

}  // namespace ft
