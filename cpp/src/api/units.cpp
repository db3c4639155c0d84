// The stand-alone components of units.hpp: their initialisation, the state their backward needs, and the
// checks on it. The arithmetic is the listings' (embedding.cpp, attention.cpp, norm.cpp, unembedding.cpp).
#include "formal_transformers/units.hpp"

#include <algorithm>
#include <cmath>

namespace ft::unit {

template <class T>
void check_input(CMatView<T> M, index_t rows, const char* what, const char* rows_name) {
    if (rows >= 0 && M.rows != rows)
        throw ValueError(std::string(what) + " has " + std::to_string(M.rows) + " rows but " + rows_name + " = " +
                         std::to_string(rows) + " was expected");
    if (M.rows <= 0) throw ValueError(std::string(what) + " is empty");
    if (M.cols <= 0) throw ValueError(std::string(what) + " is an empty sequence (ℓ = 0)");
}

void check_backward(index_t cols, index_t last, const char* what, const std::string& last_what, const char* unit) {
    if (last < 0) throw ValueError("backward() called before any forward call");
    if (cols != last)
        throw ValueError(std::string(what) + " has " + std::to_string(cols) + " columns but " + last_what + " " +
                         std::to_string(last) + unit);
}

namespace {
// A saved copy of an input (the caller may change theirs between the call and backward()).
template <class T>
void save_copy(Matrix<T>& dst, CMatView<T> src) {
    MatView<T> d = ensure(dst, src.rows, src.cols);
    for (index_t j = 0; j < src.cols; ++j) std::copy(src.col(j), src.col(j) + src.rows, d.col(j));
}
template <class T>
void zero(MatView<T> m) {
    for (index_t j = 0; j < m.cols; ++j) std::fill(m.col(j), m.col(j) + m.rows, T(0));
}
template <class T>
Matrix<T> matrix(index_t rows, index_t cols) {
    checked_elements({rows, cols}, sizeof(T), "output");
    return Matrix<T>::from_shape({std::size_t(rows), std::size_t(cols)});
}
template <class T>
Vector<T> column(const Matrix<T>& m) {  // a [d, 1] result as a vector (d,)
    Vector<T> v = Vector<T>::from_shape({m.shape(0)});
    std::copy(m.data(), m.data() + m.size(), v.data());
    return v;
}
template <class T>
CMatView<T> as_column(const Vector<T>& v) {
    return {v.data(), index_t(v.size()), 1};
}
// ids or positions in [0, n): IndexError naming the entry
void check_indices(const index_t* ids, index_t n, index_t bound, const char* what, bool positions) {
    if (n <= 0)
        throw ValueError(std::string(what) + (positions ? " is an empty sequence of positions" : " is an empty sequence"));
    for (index_t t = 0; t < n; ++t)
        if (ids[t] < 0 || ids[t] >= bound) {
            if (positions)
                throw IndexError(std::string(what) + ": position " + std::to_string(ids[t]) + (n > 1 ? " (entry " + std::to_string(t) + ")" : std::string()) +
                                 " is out of range [0, " + std::to_string(bound) + ") (l_max = " + std::to_string(bound) + ")");
            throw IndexError(std::string(what) + ": token id " + std::to_string(ids[t]) + " at position " + std::to_string(t) +
                             " is out of range [0, " + std::to_string(bound) + ") (n_vocab = " + std::to_string(bound) + ")");
        }
}
// W ~ N(0, 1/fan_in), fan_in = the matrix's columns (stacked heads: one head's block has the same)
template <class T>
void init_fan_in(ParamStore<T>& store, const MatParam& W, Rng& rng) {
    store.normal(W.offset, W.rows * W.cols, 1.0 / std::sqrt(double(W.cols)), rng);
}
}  // namespace

// ---------------------------------------------------------------------------------------------- Algorithms 1, 2
template <class T, class Layer>
void EmbeddingUnit<T, Layer>::forward(const index_t* idx, index_t n, MatView<T> E, const char* what) {
    check_indices(idx, n, size_, what ? what : positions_ ? "t" : "v", positions_);
    FT_CHECK(E.rows == layer.d_e && E.cols == n, "embedding output shape");
    layer.forward(this->store, idx, n, E);
    last_.assign(idx, idx + n);
    called_ = true;
}

template <class T, class Layer>
void EmbeddingUnit<T, Layer>::backward(CMatView<T> dE) {
    if (!called_) throw ValueError("backward() called before any forward call");
    check_input(dE, layer.d_e, "dE", "d_e");
    check_backward(dE.cols, index_t(last_.size()), "dE", "the last call embedded", positions_ ? " position(s)" : " token(s)");
    layer.backward(this->store, last_.data(), dE.cols, dE);  // a no-op for the sinusoidal (frozen) W_p
}

template <class T, class Layer>
Matrix<T> EmbeddingUnit<T, Layer>::operator()(const TokenIds& idx) {
    const index_t n = index_t(idx.size());
    Matrix<T> E = matrix<T>(layer.d_e, n);
    forward(idx.data(), n, view(E));
    return E;
}
template <class T, class Layer>
Vector<T> EmbeddingUnit<T, Layer>::operator()(index_t i) {
    Matrix<T> E = matrix<T>(layer.d_e, 1);
    forward(&i, 1, view(E));
    return column(E);
}

template <class T>
TokenEmbedding<T>::TokenEmbedding(index_t n_vocab, index_t d_e, std::uint64_t seed)
    : EmbeddingUnit<T, ft::TokenEmbedding<T>>([&](ParamStore<T>& s) { return ft::TokenEmbedding<T>(n_vocab, d_e, s); }, n_vocab,
                                       false) {
    this->store.allocate();
    Rng rng(seed);
    this->layer.init(this->store, rng, 1.0);  // W_e ~ N(0, 1)
}

template <class T>
PositionalEmbedding<T>::PositionalEmbedding(index_t l_max, index_t d_e, Positional kind, double base, std::uint64_t seed)
    : EmbeddingUnit<T, ft::PositionalEmbedding<T>>(
          [&](ParamStore<T>& s) { return ft::PositionalEmbedding<T>(l_max, d_e, kind, base, s); }, l_max, true) {
    if (kind != Positional::Learned && kind != Positional::Sinusoidal)
        throw ValueError("a stand-alone PositionalEmbedding is 'learned' or 'sinusoidal' (RoPE and ALiBi live in attention)");
    this->store.allocate();
    Rng rng(seed);
    this->layer.init(this->store, rng, 1.0);  // learned: W_p ~ N(0, 1); sinusoidal: the paper's formula
}

// ---------------------------------------------------------------------------------------------- Algorithm 6
template <class T, class Norm>
NormUnit<T, Norm>::NormUnit(index_t d_e, double eps) : norm(d_e, eps, this->store) {
    this->store.allocate();
    norm.init(this->store);
}

template <class T, class Norm>
void NormUnit<T, Norm>::forward(CMatView<T> E, MatView<T> E_hat, bool vector) {
    check_input(E, norm.d_e, "e", "d_e");
    FT_CHECK(E_hat.rows == norm.d_e && E_hat.cols == E.cols, "norm output shape");
    last_n_ = -1;
    norm.forward(this->store, E, E_hat, cache_);
    last_n_ = E.cols;
    last_vector_ = vector;
}

template <class T, class Norm>
void NormUnit<T, Norm>::backward(CMatView<T> dE_hat, MatView<T> dE) {
    if (last_n_ < 0) throw ValueError("backward() called before any forward call");
    check_input(dE_hat, norm.d_e, "dY", "d_e");
    check_backward(dE_hat.cols, last_n_, "dY", "the last forward call had");
    FT_CHECK(dE.rows == norm.d_e && dE.cols == last_n_, "norm gradient shape");
    zero(dE);
    norm.backward(this->store, dE_hat, cache_, dE);
}

template <class T, class Norm>
Matrix<T> NormUnit<T, Norm>::operator()(const Matrix<T>& E) {
    Matrix<T> out = matrix<T>(index_t(E.shape(0)), index_t(E.shape(1)));
    forward(view(E), view(out));
    return out;
}
template <class T, class Norm>
Vector<T> NormUnit<T, Norm>::operator()(const Vector<T>& e) {
    Matrix<T> out = matrix<T>(index_t(e.size()), 1);
    forward(as_column(e), view(out), true);
    return column(out);
}
template <class T, class Norm>
Matrix<T> NormUnit<T, Norm>::backward(const Matrix<T>& dE_hat) {
    Matrix<T> dE = matrix<T>(norm.d_e, std::max<index_t>(last_n_, 0));
    backward(view(dE_hat), view(dE));
    return dE;
}
template <class T, class Norm>
Vector<T> NormUnit<T, Norm>::backward(const Vector<T>& de_hat) {
    Matrix<T> dE = matrix<T>(norm.d_e, std::max<index_t>(last_n_, 0));
    backward(as_column(de_hat), view(dE));
    return column(dE);
}

// ---------------------------------------------------------------------------------------------- Algorithm 7
template <class T>
Unembedding<T>::Unembedding(index_t n_vocab, index_t d_e, std::uint64_t seed) : un(n_vocab, d_e, this->store) {
    this->store.allocate();
    Rng rng(seed);
    un.init(this->store, rng, 1.0 / std::sqrt(double(d_e)));  // W_u ~ N(0, 1/fan_in), fan_in = d_e
}

template <class T>
void Unembedding<T>::forward(CMatView<T> E, MatView<T> P, bool vector) {
    check_input(E, un.d_e, "e", "d_e");
    FT_CHECK(P.rows == un.n_vocab && P.cols == E.cols, "Unembedding output shape");
    n_ = -1;  // nothing valid to differentiate until this call completes
    save_copy(X_, E);
    un.forward(this->store, view(X_), P);  // line 1: p = softmax(W_u e)
    save_copy(P_, CMatView<T>(P));
    n_ = E.cols;
    last_vector_ = vector;
}

template <class T>
void Unembedding<T>::logits(CMatView<T> E, MatView<T> Z) const {
    check_input(E, un.d_e, "e", "d_e");
    FT_CHECK(Z.rows == un.n_vocab && Z.cols == E.cols, "Unembedding logits shape");
    un.logits(this->store, E, Z);
}

template <class T>
void Unembedding<T>::backward(CMatView<T> dP, MatView<T> dE) {
    if (n_ < 0) throw ValueError("backward() called before any forward call");
    check_input(dP, un.n_vocab, "dP", "n_vocab");
    check_backward(dP.cols, n_, "dP", "the last call had");
    FT_CHECK(dE.rows == un.d_e && dE.cols == n_, "Unembedding gradient shape");
    zero(dE);
    save_copy(dP_, dP);  // the core overwrites dP with dZ: never the caller's array
    un.backward(this->store, view(X_), view(P_), view(dP_), dE);
}

template <class T>
Matrix<T> Unembedding<T>::operator()(const Matrix<T>& E) {
    Matrix<T> P = matrix<T>(un.n_vocab, index_t(E.shape(1)));
    forward(view(E), view(P));
    return P;
}
template <class T>
Vector<T> Unembedding<T>::operator()(const Vector<T>& e) {
    Matrix<T> P = matrix<T>(un.n_vocab, 1);
    forward(as_column(e), view(P), true);
    return column(P);
}
template <class T>
Matrix<T> Unembedding<T>::logits(const Matrix<T>& E) const {
    Matrix<T> Z = matrix<T>(un.n_vocab, index_t(E.shape(1)));
    logits(view(E), view(Z));
    return Z;
}
template <class T>
Matrix<T> Unembedding<T>::backward(const Matrix<T>& dP) {
    Matrix<T> dE = matrix<T>(un.d_e, std::max<index_t>(n_, 0));
    backward(view(dP), view(dE));
    return dE;
}
template <class T>
Vector<T> Unembedding<T>::backward(const Vector<T>& dp) {
    Matrix<T> dE = matrix<T>(un.d_e, std::max<index_t>(n_, 0));
    backward(as_column(dp), view(dE));
    return column(dE);
}

// ---------------------------------------------------------------------------------------------- Algorithm 3
template <class T>
BasicAttention<T>::BasicAttention(index_t d_in, index_t d_attn, index_t d_out, std::uint64_t seed)
    : att(d_in, d_attn, d_out, this->store) {
    this->store.allocate();
    Rng rng(seed);
    att.init(this->store, rng, 1.0 / std::sqrt(double(d_in)));  // every weight matrix has fan_in = d_in; biases 0
}

template <class T>
void BasicAttention<T>::forward(CMatView<T> e, CMatView<T> E, T* v_tilde) {
    check_input(e, att.d_in, "e", "d_in");
    if (e.cols != 1)
        throw ValueError("e must be one token vector (d_in,) = (" + std::to_string(att.d_in) + ",), got " +
                         std::to_string(e.cols) + " columns");
    check_input(E, att.d_in, "E", "d_in");
    last_T_ = -1;
    att.forward(this->store, e.data, E, v_tilde, cache_);  // the cache keeps copies of e and E
    last_T_ = E.cols;
}

template <class T>
void BasicAttention<T>::backward(CMatView<T> dv, T* de, MatView<T> dE) {
    if (last_T_ < 0) throw ValueError("backward() called before any forward call");
    check_input(dv, att.d_out, "dv", "d_out");
    if (dv.cols != 1) throw ValueError("dv must be one vector (d_out,), got " + std::to_string(dv.cols) + " columns");
    FT_CHECK(dE.rows == att.d_in && dE.cols == last_T_, "BasicAttention gradient shape");
    std::fill(de, de + att.d_in, T(0));
    zero(dE);
    att.backward(this->store, cache_, dv.data, de, dE);
}

template <class T>
std::optional<Vector<T>> BasicAttention<T>::weights() const {
    if (last_T_ < 0) return std::nullopt;
    Vector<T> a = Vector<T>::from_shape({std::size_t(last_T_)});
    std::copy(cache_.alpha.data(), cache_.alpha.data() + last_T_, a.data());
    return a;
}

template <class T>
Vector<T> BasicAttention<T>::operator()(const Vector<T>& e, const Matrix<T>& E) {
    Vector<T> v = Vector<T>::from_shape({std::size_t(att.d_out)});
    forward(as_column(e), view(E), v.data());
    return v;
}
template <class T>
std::pair<Vector<T>, Matrix<T>> BasicAttention<T>::backward(const Vector<T>& dv) {
    Vector<T> de = Vector<T>::from_shape({std::size_t(att.d_in)});
    Matrix<T> dE = matrix<T>(att.d_in, std::max<index_t>(last_T_, 0));
    backward(as_column(dv), de.data(), view(dE));
    return {std::move(de), std::move(dE)};
}

// ---------------------------------------------------------------------------------------------- Algorithms 4, 5
template <class T, class Layer>
void AttentionUnit<T, Layer>::forward(CMatView<T> X, CMatView<T> Z, MatView<T> Vt, const char* z_what) {
    check_input(X, att.d_x, "X", "d_x");
    check_input(Z, att.d_z, z_what, "d_z");
    att.mask.check(Z.cols, X.cols, 0, /*exact=*/true);  // an explicit mask fixes (l_z, l_x)
    FT_CHECK(Vt.rows == att.d_out && Vt.cols == X.cols, "attention output shape");
    // the weights (ℓ_z·ℓ_x per head) fit memory, checked before the inputs are copied: rope and alibi have no
    // table bounding ℓ, and a 10^7-token input would otherwise fail only after 3 GB of copies and Q, K, V
    index_t heads = 1;
    if constexpr (!std::is_same_v<Layer, ft::Attention<T>>) heads = att.H;
    const char* what = "attention weights (l_z * l_x per head and sequence)";
    check_bytes(checked_mul(checked_mul(Z.cols, X.cols, what), heads, what), sizeof(T), what);
    l_x_ = l_z_ = -1;  // nothing valid to differentiate until this call completes
    save_copy(X_, X);
    save_copy(Z_, Z);
    att.forward(this->store, view(X_), Seqs::single(X.cols), view(Z_), Seqs::single(Z.cols), Vt, cache_);
    l_x_ = X.cols;
    l_z_ = Z.cols;
}

template <class T, class Layer>
void AttentionUnit<T, Layer>::backward(CMatView<T> dY, MatView<T> dX, MatView<T> dZ) {
    if (l_x_ < 0) throw ValueError("backward() called before any forward call");
    check_input(dY, att.d_out, "dY", "d_out");
    if (dY.cols != l_x_)
        throw ValueError("dY has " + std::to_string(dY.cols) + " columns but the last call had l_x = " + std::to_string(l_x_));
    FT_CHECK(dX.rows == att.d_x && dX.cols == l_x_ && dZ.rows == att.d_z && dZ.cols == l_z_, "attention gradient shapes");
    zero(dX);
    zero(dZ);
    const auto sx = Seqs::single(l_x_), sz = Seqs::single(l_z_);
    if constexpr (std::is_same_v<Layer, ft::Attention<T>>)
        att.backward(this->store, view(X_), sx, view(Z_), sz, cache_, dY, dX, dZ);
    else
        att.backward(this->store, view(X_), sx, view(Z_), sz, cache_, dY, dX, dZ, work_);
}

template <class T, class Layer>
Matrix<T> AttentionUnit<T, Layer>::operator()(const Matrix<T>& X, const Matrix<T>& Z) {
    Matrix<T> Vt = matrix<T>(att.d_out, index_t(X.shape(1)));
    forward(view(X), view(Z), view(Vt));
    return Vt;
}
template <class T, class Layer>
std::pair<Matrix<T>, Matrix<T>> AttentionUnit<T, Layer>::backward(const Matrix<T>& dY) {
    Matrix<T> dX = matrix<T>(att.d_x, std::max<index_t>(l_x_, 0)), dZ = matrix<T>(att.d_z, std::max<index_t>(l_z_, 0));
    backward(view(dY), view(dX), view(dZ));
    return {std::move(dX), std::move(dZ)};
}

template <class T>
Attention<T>::Attention(index_t d_x, index_t d_z, index_t d_attn, index_t d_out, Mask mask, std::uint64_t seed)
    : AttentionUnit<T, ft::Attention<T>>([&](ParamStore<T>& s) { return ft::Attention<T>(d_x, d_z, d_attn, d_out, std::move(mask), s); }) {
    Rng rng(seed);
    for (const MatParam* W : {&this->att.W_q, &this->att.W_k, &this->att.W_v}) init_fan_in(this->store, *W, rng);  // biases 0
}

template <class T>
std::optional<Matrix<T>> Attention<T>::weights() const {
    if (this->l_x_ < 0) return std::nullopt;
    Matrix<T> A = matrix<T>(this->l_z_, this->l_x_);
    std::copy(this->cache_.A.data(), this->cache_.A.data() + A.size(), A.data());  // column-major [l_z, l_x]
    return A;
}

template <class T>
MHAttention<T>::MHAttention(index_t H, index_t d_x, index_t d_z, index_t d_attn, index_t d_mid, index_t d_out, Mask mask,
                            std::uint64_t seed, const AttnVariant& v)
    : AttentionUnit<T, ft::MHAttention<T>>([&](ParamStore<T>& s) {
          return ft::MHAttention<T>(H, d_x, d_z, d_attn, d_mid, d_out, std::move(mask), s, "", v);
      }) {
    Rng rng(seed);
    for (const MatParam* W : {&this->att.W_q, &this->att.W_k, &this->att.W_v, &this->att.W_o})
        init_fan_in(this->store, *W, rng);  // biases 0
}

template <class T>
std::optional<Tensor<T, 3>> MHAttention<T>::weights() const {
    const index_t l_x = this->l_x_, l_z = this->l_z_, H = this->att.H;
    if (l_x < 0) return std::nullopt;
    Tensor<T, 3> W = Tensor<T, 3>::from_shape({std::size_t(H), std::size_t(l_z), std::size_t(l_x)});
    // head h's block is a column-major [l_z, l_x] matrix at offset h·l_z·l_x (one sequence)
    this->cache_.ensure_weights();  // after a tiled forward: computed now
    const T* A = this->cache_.A.data();
    for (index_t h = 0; h < H; ++h)
        for (index_t i = 0; i < l_z; ++i)
            for (index_t j = 0; j < l_x; ++j) W(h, i, j) = A[h * l_z * l_x + i + j * l_z];
    return W;
}

#define FT_INSTANTIATE(T)                                                 \
    template void check_input<T>(CMatView<T>, index_t, const char*, const char*); \
    template class EmbeddingUnit<T, ft::TokenEmbedding<T>>;               \
    template class EmbeddingUnit<T, ft::PositionalEmbedding<T>>;          \
    template class TokenEmbedding<T>;                                     \
    template class PositionalEmbedding<T>;                                \
    template class NormUnit<T, ft::LayerNorm<T>>;                         \
    template class NormUnit<T, ft::RMSNorm<T>>;                           \
    template class Unembedding<T>;                                        \
    template class BasicAttention<T>;                                     \
    template class AttentionUnit<T, ft::Attention<T>>;                    \
    template class AttentionUnit<T, ft::MHAttention<T>>;                  \
    template class Attention<T>;                                          \
    template class MHAttention<T>;
FT_INSTANTIATE(float)
FT_INSTANTIATE(double)
#undef FT_INSTANTIATE

}  // namespace ft::unit
