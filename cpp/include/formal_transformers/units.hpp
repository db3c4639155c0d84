// The components of Algorithms 1–7 as stand-alone objects (`ft::unit::`): each owns its θ (a ParamStore,
// initialised as README.md's table says for stand-alone components), the state its backward pass needs (the
// last call's ids, positions, inputs or activations) and the checks on that state. They are what the
// Python classes ft.TokenEmbedding … ft.Unembedding call (the bindings only convert numpy arrays, release
// the GIL and attach docstrings) and what a C++ user calls, with views or with xtensor arrays
// (formal_transformers/formal_transformers.hpp).
//
// The listings themselves stay in their own files (embedding.hpp, attention.hpp, norm.hpp, unembedding.hpp);
// a unit adds only what a stand-alone object needs around them:
//  * forward records what backward needs only once the call has completed (a call that throws leaves
//    nothing to differentiate), and copies its float inputs (the caller may change them before backward);
//  * backward before any forward, or with a gradient of another number of columns: ValueError;
//  * ids and positions out of range: IndexError naming the entry; wrong row counts or empty inputs:
//    ValueError naming the argument — all before anything is computed or changed.
// Column convention: a sequence of vectors is [d, ℓ], column t token t. `vector` marks a call on one vector
// (the 1-D overloads): backward then returns a vector too.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "formal_transformers/attention.hpp"
#include "formal_transformers/embedding.hpp"
#include "formal_transformers/norm.hpp"
#include "formal_transformers/params.hpp"
#include "formal_transformers/unembedding.hpp"

namespace ft::unit {

// ValueError unless M has `rows` rows (named `rows_name`) and at least one column: "X has 4 rows but d_x = 3
// was expected".
template <class T>
void check_input(CMatView<T> M, index_t rows, const char* what, const char* rows_name);
// ValueError unless a gradient has the last call's number of columns (`last` ≥ 0; -1: no call yet):
// "<what> has 3 columns but <last_what> 2<unit>".
void check_backward(index_t cols, index_t last, const char* what, const std::string& last_what, const char* unit = "");

// Any other xtensor expression (e.g. a row-major xt::xtensor) picks the overload of its rank and is copied
// once into the column-major storage (a Matrix or a Vector would both accept it: ambiguous otherwise).
template <class X, std::size_t N>
using if_rank = std::enable_if_t<xt::get_rank<std::decay_t<X>>::value == N, int>;
#define FT_UNIT_BY_RANK(fn)                                                               \
    template <class X, if_rank<X, 2> = 0>                                                      \
    Matrix<T> fn(const xt::xexpression<X>& x) { return fn(Matrix<T>(x.derived_cast())); }  \
    template <class X, if_rank<X, 1> = 0>                                                      \
    Vector<T> fn(const xt::xexpression<X>& x) { return fn(Vector<T>(x.derived_cast())); }

// What every unit shares: θ and its gradient, by name (params.hpp).
template <class T>
class Base {
public:
    Base() = default;
    Base(const Base&) = delete;
    Base& operator=(const Base&) = delete;
    ParamStore<T> store;
    ParamViews<T> params() { return ParamViews<T>(store, false); }
    ParamViews<T> grads() { return ParamViews<T>(store, true); }
    void zero_grad() { store.zero_grad(); }
};

// Algorithms 1 and 2 stand alone: a table W (W_e or W_p) read at indices (token ids or positions).
template <class T, class Layer>
class EmbeddingUnit : public Base<T> {
public:
    // idx[0:n) -> E:[d_e, n], E[:, t] = W[:, idx[t]]; IndexError for an index outside the table (`what`
    // names the argument; null: "v" for ids, "t" for positions)
    void forward(const index_t* idx, index_t n, MatView<T> E, const char* what = nullptr);
    // grads W[:, idx[t]] += dE[:, t] for the last call's indices (nothing for a frozen W_p)
    void backward(CMatView<T> dE);
    index_t last_n() const { return called_ ? index_t(last_.size()) : -1; }

    Matrix<T> operator()(const TokenIds& idx);  // (d_e, ℓ)
    Vector<T> operator()(index_t i);            // (d_e,)
    void backward(const Matrix<T>& dE) { backward(view(dE)); }

    Layer layer;  // ft::TokenEmbedding (n_vocab, d_e, W_e) or ft::PositionalEmbedding (l_max, d_e, W_p)

protected:
    template <class Make>
    EmbeddingUnit(Make make, index_t size, bool positions) : layer(make(this->store)), size_(size), positions_(positions) {}

private:
    index_t size_;    // N_V or ℓ_max
    bool positions_;  // the messages' words
    std::vector<index_t> last_;
    bool called_ = false;
};

// Algorithm 1 with θ = {W_e ~ N(0, 1)}.
template <class T>
class TokenEmbedding : public EmbeddingUnit<T, ft::TokenEmbedding<T>> {
public:
    TokenEmbedding(index_t n_vocab, index_t d_e, std::uint64_t seed = 0);
};

// Algorithm 2 (kind Learned: W_p ~ N(0, 1), or Sinusoidal: the paper's fixed W_p; base ≤ 0: ℓ_max).
template <class T>
class PositionalEmbedding : public EmbeddingUnit<T, ft::PositionalEmbedding<T>> {
public:
    PositionalEmbedding(index_t l_max, index_t d_e, Positional kind = Positional::Learned, double base = 0,
                        std::uint64_t seed = 0);
};

// Algorithm 6 (layer_norm, Norm = ft::LayerNorm) or Gopher's RMSnorm (ft::RMSNorm); γ = 1, β = 0.
template <class T, class Norm>
class NormUnit : public Base<T> {
public:
    NormUnit(index_t d_e, double eps = 1e-5);
    // E:[d_e, n] -> Ê:[d_e, n]
    void forward(CMatView<T> E, MatView<T> E_hat, bool vector = false);
    // dÊ:[d_e, n] of the last call -> dE (overwritten); grads γ, β += …
    void backward(CMatView<T> dE_hat, MatView<T> dE);
    index_t last_n() const { return last_n_; }
    bool last_vector() const { return last_vector_; }

    Matrix<T> operator()(const Matrix<T>& E);
    Vector<T> operator()(const Vector<T>& e);
    Matrix<T> backward(const Matrix<T>& dE_hat);
    Vector<T> backward(const Vector<T>& de_hat);
    FT_UNIT_BY_RANK(operator())
    FT_UNIT_BY_RANK(backward)

    Norm norm;

private:
    NormCache<T> cache_;
    index_t last_n_ = -1;
    bool last_vector_ = false;
};
template <class T>
using LayerNorm = NormUnit<T, ft::LayerNorm<T>>;
template <class T>
using RMSNorm = NormUnit<T, ft::RMSNorm<T>>;

// Algorithm 7 with θ = {W_u ~ N(0, 1/d_e)}.
template <class T>
class Unembedding : public Base<T> {
public:
    Unembedding(index_t n_vocab, index_t d_e, std::uint64_t seed = 0);
    // E:[d_e, n] -> P:[N_V, n] = softmax(W_u E) (line 1); E and P are kept (copies) for backward
    void forward(CMatView<T> E, MatView<T> P, bool vector = false);
    // W_u E (does not change what backward differentiates)
    void logits(CMatView<T> E, MatView<T> Z) const;
    // dP:[N_V, n] (∂loss/∂P of the last call; not changed) -> dE (overwritten); grads W_u += …
    void backward(CMatView<T> dP, MatView<T> dE);
    index_t last_n() const { return n_; }
    bool last_vector() const { return last_vector_; }

    Matrix<T> operator()(const Matrix<T>& E);
    Vector<T> operator()(const Vector<T>& e);
    Matrix<T> logits(const Matrix<T>& E) const;
    Matrix<T> backward(const Matrix<T>& dP);
    Vector<T> backward(const Vector<T>& dp);
    FT_UNIT_BY_RANK(operator())
    FT_UNIT_BY_RANK(backward)

    ft::Unembedding<T> un;

private:
    Matrix<T> X_, P_, dP_;
    index_t n_ = -1;
    bool last_vector_ = false;
};

// Algorithm 3 with W ~ N(0, 1/d_in), biases 0.
template <class T>
class BasicAttention : public Base<T> {
public:
    BasicAttention(index_t d_in, index_t d_attn, index_t d_out, std::uint64_t seed = 0);
    // e:[d_in] (a [d_in, 1] view), E:[d_in, T] -> ṽ:[d_out]
    void forward(CMatView<T> e, CMatView<T> E, T* v_tilde);
    // dṽ:[d_out] (a [d_out, 1] view) -> de:[d_in], dE:[d_in, T] (overwritten); grads += …
    void backward(CMatView<T> dv, T* de, MatView<T> dE);
    index_t last_T() const { return last_T_; }
    // α:[T] of the last call (nullopt before any call)
    std::optional<Vector<T>> weights() const;

    Vector<T> operator()(const Vector<T>& e, const Matrix<T>& E);
    std::pair<Vector<T>, Matrix<T>> backward(const Vector<T>& dv);

    ft::BasicAttention<T> att;

private:
    BasicAttentionCache<T> cache_;
    index_t last_T_ = -1;
};

// Algorithms 4 and 5 (Layer = ft::Attention / ft::MHAttention) with W ~ N(0, 1/fan_in), biases 0.
// Copies of the last call's X and Z and the layer's activations are kept for backward.
template <class T, class Layer>
class AttentionUnit : public Base<T> {
public:
    // X:[d_x, ℓ_x], Z:[d_z, ℓ_z] (self-attention: pass X twice) -> Ṽ:[d_out, ℓ_x]. An explicit mask fixes
    // (ℓ_z, ℓ_x) exactly. `z_what` names Z in messages.
    void forward(CMatView<T> X, CMatView<T> Z, MatView<T> Vt, const char* z_what = "Z");
    // dY:[d_out, ℓ_x] -> dX:[d_x, ℓ_x], dZ:[d_z, ℓ_z] (overwritten); grads += …
    void backward(CMatView<T> dY, MatView<T> dX, MatView<T> dZ);
    index_t last_lx() const { return l_x_; }
    index_t last_lz() const { return l_z_; }

    Matrix<T> operator()(const Matrix<T>& X, const Matrix<T>& Z);
    Matrix<T> operator()(const Matrix<T>& X) { return (*this)(X, X); }
    std::pair<Matrix<T>, Matrix<T>> backward(const Matrix<T>& dY);

    Layer att;

protected:
    // make(store) constructs the layer, declaring its parameters in this unit's store
    template <class Make>
    explicit AttentionUnit(Make make) : att(make(this->store)) {
        this->store.allocate();
    }
    std::conditional_t<std::is_same_v<Layer, ft::Attention<T>>, AttentionCache<T>, MHAttentionCache<T>> cache_;
    MHAttentionWork<T> work_;  // MHAttention's backward scratch
    Matrix<T> X_, Z_;
    index_t l_x_ = -1, l_z_ = -1;
};

template <class T>
class Attention : public AttentionUnit<T, ft::Attention<T>> {
public:
    Attention(index_t d_x, index_t d_z, index_t d_attn, index_t d_out, Mask mask = Mask::bidirectional(),
              std::uint64_t seed = 0);
    // softmax(S/√d_attn):[ℓ_z, ℓ_x] of the last call (nullopt before any call)
    std::optional<Matrix<T>> weights() const;
};

template <class T>
class MHAttention : public AttentionUnit<T, ft::MHAttention<T>> {
public:
    MHAttention(index_t H, index_t d_x, index_t d_z, index_t d_attn, index_t d_mid, index_t d_out,
                Mask mask = Mask::bidirectional(), std::uint64_t seed = 0, const AttnVariant& v = AttnVariant());
    // softmax(S^h/√d_attn) of every head, (H, ℓ_z, ℓ_x) (column-major, as every Tensor), of the last call (nullopt before any call)
    std::optional<Tensor<T, 3>> weights() const;
};

}  // namespace ft::unit
