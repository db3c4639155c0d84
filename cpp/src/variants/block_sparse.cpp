// Algorithm V17b (block-sparse attention, block_sparse.hpp quotes the listing): forward and backward side by
// side, for one head of one sequence. Only the live blocks of the layout are computed: query block i gathers
// its key blocks 𝓛[i] (or views them in place when they are consecutive, e.g. a global query block's [n]),
// so S is mb×b per query block instead of ℓ×ℓ per head. Every product is one single-thread BLAS call
// (gemm_unsplit): MHAttention runs the heads in parallel (docs/design.md "Threads").
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "formal_transformers/attention.hpp"
#include "formal_transformers/blas.hpp"
#include "formal_transformers/block_sparse.hpp"

namespace ft {

namespace {
template <class T>
struct Scratch {
    std::vector<T> K, V, S, dK, dV, dA;
};
template <class T>
Scratch<T>& scratch() {
    thread_local Scratch<T> s;
    return s;
}
template <class T>
T* sized(std::vector<T>& v, index_t n) {
    if (index_t(v.size()) < n) v.resize(std::size_t(n));
    return v.data();
}

// The key blocks of query block i are consecutive: j0, j0 + 1, … (each once: a multiset is gathered)
bool consecutive(const BlockLayout& L, index_t i) {
    const index_t* k = L.of(i);
    for (index_t a = 1; a < L.count(i); ++a)
        if (k[a] != k[a - 1] + 1) return false;
    return true;
}

// line 2: [X[:, block j]]_{j ∈ 𝓛[i]} as one matrix (a view when consecutive, else a copy into buf)
template <class T>
CMatView<T> gather(const BlockLayout& L, index_t i, CMatView<T> X, std::vector<T>& buf) {
    const index_t b = L.block, m = L.count(i);
    const index_t* k = L.of(i);
    if (consecutive(L, i)) return X.cols_range(k[0] * b, m * b);
    MatView<T> G(sized(buf, X.rows * m * b), X.rows, m * b);
    for (index_t a = 0; a < m; ++a)
        for (index_t t = 0; t < b; ++t) std::copy(X.col(k[a] * b + t), X.col(k[a] * b + t) + X.rows, G.col(a * b + t));
    return G;
}
// dX[:, block j] += G[:, the columns of block j in the gathered order], for j ∈ 𝓛[i]
template <class T>
void scatter_add(const BlockLayout& L, index_t i, CMatView<T> G, MatView<T> dX) {
    const index_t b = L.block, m = L.count(i);
    const index_t* k = L.of(i);
    for (index_t a = 0; a < m; ++a)
        for (index_t t = 0; t < b; ++t) {
            const T* g = G.col(a * b + t);
            T* d = dX.col(k[a] * b + t);
            for (index_t r = 0; r < G.rows; ++r) d[r] += g[r];
        }
}

// lines 2–4 for query block i: A = softmax(K_Jᵀ Q_i / √d_attn) per column (mb×b, in w.S; a block gathered m times
// is m rows of A: its weight m·exp(s)/Σ), λ of each column into lse[0 … b) (null: not kept)
template <class T>
MatView<T> block_weights(const BlockLayout& L, index_t i, CMatView<T> Q, CMatView<T> K, Scratch<T>& w, T* lse) {
    const index_t b = L.block, mb = L.count(i) * b;
    const T scale = T(1) / std::sqrt(T(Q.rows));
    CMatView<T> KJ = gather(L, i, K, w.K);  // line 2
    MatView<T> S(sized(w.S, mb * b), mb, b);
    gemm_unsplit<T>(Op::T, Op::N, scale, KJ, Q.cols_range(i * b, b), T(0), S);  // line 3: S = K_Jᵀ Q_i / √d_attn
    for (index_t t = 0; t < b; ++t) {  // line 4: A = softmax(S) per column, λ its log-sum-exp
        T* s = S.col(t);
        T mx = -std::numeric_limits<T>::infinity();
        for (index_t r = 0; r < mb; ++r) mx = std::max(mx, s[r]);
        T sum = 0;
        for (index_t r = 0; r < mb; ++r) sum += (s[r] = std::exp(s[r] - mx));
        const T inv = T(1) / sum;
        for (index_t r = 0; r < mb; ++r) s[r] *= inv;
        if (lse) lse[t] = mx + std::log(sum);
    }
    return S;
}
}  // namespace

// ===================================== Algorithm V17b ==================================================
template <class T>
void block_sparse_head(const BlockLayout& L, CMatView<T> Q, CMatView<T> K, CMatView<T> V, MatView<T> Vt, T* lse) {
    const index_t b = L.block;
    FT_CHECK(Q.cols == L.n * b && K.cols == Q.cols && V.cols == Q.cols, "block_sparse_head: ℓ is not n·b");
    Scratch<T>& w = scratch<T>();
    for (index_t i = 0; i < L.n; ++i) {  // line 1
        CMatView<T> VJ = gather(L, i, V, w.V);  // line 2 (K_J: block_weights)
        MatView<T> A = block_weights(L, i, Q, K, w, lse + i * b);  // lines 2–4
        gemm_unsplit<T>(Op::N, Op::N, T(1), VJ, A, T(0), Vt.cols_range(i * b, b));  // line 5: Ṽ_i = V_J A
    }
}

// The dense (ℓ, ℓ) weights of V17b: A[t_z, t_x] the sum of line 4's A over the occurrences of t_z's block in
// 𝓛[⌊t_x/b⌋] (m·exp(s)/Σ for a block listed m times), 0 outside the layout
template <class T>
void block_sparse_weights(const BlockLayout& L, CMatView<T> Q, CMatView<T> K, MatView<T> A) {
    const index_t b = L.block;
    FT_CHECK(Q.cols == L.n * b && K.cols == Q.cols && A.rows == Q.cols && A.cols == Q.cols,
             "block_sparse_weights: ℓ is not n·b");
    Scratch<T>& w = scratch<T>();
    for (index_t t = 0; t < A.cols; ++t) std::fill(A.col(t), A.col(t) + A.rows, T(0));
    for (index_t i = 0; i < L.n; ++i) {
        MatView<T> Ai = block_weights<T>(L, i, Q, K, w, nullptr);
        const index_t* k = L.of(i);
        for (index_t u = 0; u < b; ++u)
            for (index_t a = 0; a < L.count(i); ++a)
                for (index_t t = 0; t < b; ++t) A(k[a] * b + t, i * b + u) += Ai(a * b + t, u);
    }
}

template <class T>
void block_sparse_head_backward(const BlockLayout& L, CMatView<T> Q, CMatView<T> K, CMatView<T> V, const T* lse,
                                CMatView<T> dVt, MatView<T> dQ, MatView<T> dK, MatView<T> dV) {
    const index_t b = L.block;
    FT_CHECK(Q.cols == L.n * b && K.cols == Q.cols && V.cols == Q.cols, "block_sparse_head_backward: ℓ is not n·b");
    const T scale = T(1) / std::sqrt(T(Q.rows));
    Scratch<T>& w = scratch<T>();
    for (index_t i = 0; i < L.n; ++i) {
        const index_t mb = L.count(i) * b;
        const bool view = consecutive(L, i);
        const index_t j0 = L.of(i)[0] * b;
        CMatView<T> Qi = Q.cols_range(i * b, b), dVi = dVt.cols_range(i * b, b);
        CMatView<T> KJ = gather(L, i, K, w.K), VJ = gather(L, i, V, w.V);
        MatView<T> A(sized(w.S, mb * b), mb, b), dA(sized(w.dA, mb * b), mb, b);
        gemm_unsplit<T>(Op::T, Op::N, scale, KJ, Qi, T(0), A);  // line 3 again
        for (index_t t = 0; t < b; ++t) {  // line 4 again: A = exp(S − λ)
            T* a = A.col(t);
            const T l = lse[i * b + t];
            for (index_t r = 0; r < mb; ++r) a[r] = std::exp(a[r] - l);
        }
        // line 5: dV_J += dṼ_i Aᵀ;  dA = V_Jᵀ dṼ_i
        if (view) {
            gemm_unsplit<T>(Op::N, Op::T, T(1), dVi, A, T(1), dV.cols_range(j0, mb));
        } else {
            MatView<T> dVJ(sized(w.dV, V.rows * mb), V.rows, mb);
            gemm_unsplit<T>(Op::N, Op::T, T(1), dVi, A, T(0), dVJ);
            scatter_add<T>(L, i, dVJ, dV);
        }
        gemm_unsplit<T>(Op::T, Op::N, T(1), VJ, dVi, T(0), dA);
        for (index_t t = 0; t < b; ++t) {  // line 4: dS = A ⊙ (dA − 1 (1ᵀ(A ⊙ dA)))
            const T* a = A.col(t);
            T* d = dA.col(t);
            T c = 0;
            for (index_t r = 0; r < mb; ++r) c += a[r] * d[r];
            for (index_t r = 0; r < mb; ++r) d[r] = a[r] * (d[r] - c);
        }
        // line 3: dQ_i += K_J dS/√d_attn;  dK_J += Q_i dSᵀ/√d_attn
        gemm_unsplit<T>(Op::N, Op::N, scale, KJ, dA, T(1), dQ.cols_range(i * b, b));
        if (view) {
            gemm_unsplit<T>(Op::N, Op::T, scale, Qi, dA, T(1), dK.cols_range(j0, mb));
        } else {
            MatView<T> dKJ(sized(w.dK, K.rows * mb), K.rows, mb);
            gemm_unsplit<T>(Op::N, Op::T, scale, Qi, dA, T(0), dKJ);
            scatter_add<T>(L, i, dKJ, dK);
        }
    }
}

// The head kernel "bigbird" (parts.hpp HeadKernel; attention='bigbird' with attention_impl 'auto'): V17b on
// every block, only the live blocks of the layout of the block's sequence and head (the mask part's, V17a); λ in c.lse, no
// A (attention_weights rebuilds it by Algorithm 4's lines 4–6 as printed with the layout's mask; for a layout that
// repeats a block, by V17b's lines 2–4 with the multiplicities, block_sparse_weights). 'literal' and
// 'tiled' run the dense listings with the same mask instead (head_kernel_name).
namespace {
template <class T>
class BlockSparseKernel final : public HeadKernel<T> {
public:
    const char* name() const override { return "bigbird"; }
    bool one_thread_blocks() const override { return true; }  // one-thread BLAS calls on blocks
    void begin(MHAttentionCache<T>& c, index_t H, index_t n_x) const override {
        c.keep_lse_only(H, n_x, "attention log-sum-exp");
    }
    void forward(CMatView<T> Q, CMatView<T> K, CMatView<T> V, const HeadBlock<T>& blk, MHAttentionCache<T>& c,
                 MatView<T> Y) const override {
        block_sparse_head<T>(*layout(c.mask, K.cols, blk.h), Q, K, V, Y, c.lse.data() + blk.h * blk.n_x + blk.j0);
    }
    void backward(CMatView<T> Q, CMatView<T> K, CMatView<T> V, CMatView<T> Y, CMatView<T> dY, const HeadBlock<T>& blk,
                  const MHAttentionCache<T>& c, MHAttentionWork<T>& w, MatView<T> dQ, MatView<T> dK,
                  MatView<T> dV) const override {
        (void)Y, (void)w;  // V17b backward: the weights recomputed block by block from λ
        block_sparse_head_backward<T>(*layout(c.mask, K.cols, blk.h), Q, K, V, c.lse.data() + blk.h * blk.n_x + blk.j0, dY, dQ,
                                      dK, dV);
    }
    void weights(CMatView<T> Q, CMatView<T> K, CMatView<T> V, const HeadBlock<T>& blk, const MHAttentionCache<T>& c,
                 MatView<T> A) const override {
        (void)c;
        const auto L = layout(c.mask, K.cols, blk.h);
        if (L->repeats()) return block_sparse_weights<T>(*L, Q, K, A);  // a multiset: no mask describes it
        std::vector<T> scratch(std::size_t(V.rows * Q.cols));
        attention_head<T>(Q, K, V, blk, A, MatView<T>(scratch.data(), V.rows, Q.cols));
    }

private:
    // query head h's layout for sequences of ℓ tokens
    static std::shared_ptr<const BlockLayout> layout(const Mask& m, index_t l, index_t h) {
        return bigbird_mask_layout(m, l / bigbird_spec(m)->block, h);
    }
};
}  // namespace

// The registry's factory (registry.cpp): the mask must be BigBird's layout, and no score bias (the kernel adds none)
template <class T>
std::shared_ptr<const HeadKernel<T>> make_block_sparse_kernel(const AttnPartSpec<T>& spec, const std::string& prefix) {
    (void)prefix;
    if (!spec.mask || !bigbird_spec(*spec.mask)) throw ValueError("attention='bigbird' needs the bigbird mask (its block layout)");
    if (spec.position && spec.position->bias)
        throw ValueError("attention='bigbird': the position part '" + spec.v.position + "' is a score bias, which the "
                         "block-sparse kernel does not add (use rope, or attention_impl='literal')");
    return std::make_shared<const BlockSparseKernel<T>>();
}
template std::shared_ptr<const HeadKernel<float>> make_block_sparse_kernel<float>(const AttnPartSpec<float>&, const std::string&);
template std::shared_ptr<const HeadKernel<double>> make_block_sparse_kernel<double>(const AttnPartSpec<double>&, const std::string&);

#define FT_INSTANTIATE(T)                                                                                         \
    template void block_sparse_head<T>(const BlockLayout&, CMatView<T>, CMatView<T>, CMatView<T>, MatView<T>, T*); \
    template void block_sparse_weights<T>(const BlockLayout&, CMatView<T>, CMatView<T>, MatView<T>);              \
    template void block_sparse_head_backward<T>(const BlockLayout&, CMatView<T>, CMatView<T>, CMatView<T>,         \
                                                const T*, CMatView<T>, MatView<T>, MatView<T>, MatView<T>);
FT_INSTANTIATE(float)
FT_INSTANTIATE(double)
#undef FT_INSTANTIATE

}  // namespace ft
