// Algorithm 7, forward and backward, and the log-softmax cross-entropy of the training listings.
#include "formal_transformers/unembedding.hpp"

#include <algorithm>
#include <cmath>
#include <memory>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "formal_transformers/blas.hpp"
#include "formal_transformers/functions.hpp"

namespace ft {

template <class T>
Unembedding<T>::Unembedding(index_t n_vocab_, index_t d_e_, ParamStore<T>& store, const std::string& name)
    : n_vocab(n_vocab_), d_e(d_e_), tied(false) {
    if (n_vocab <= 0 || d_e <= 0) throw ValueError("Unembedding: n_vocab and d_e must be positive");
    W = store.matrix(name, n_vocab, d_e);
}

template <class T>
Unembedding<T>::Unembedding(index_t n_vocab_, index_t d_e_, const MatParam& W_e_tied)
    : n_vocab(n_vocab_), d_e(d_e_), tied(true), W(W_e_tied) {
    FT_CHECK(W.rows == d_e && W.cols == n_vocab, "tied unembedding: W_e must be [d_e, N_V]");
}

template <class T>
void Unembedding<T>::init(ParamStore<T>& store, Rng& rng, double stddev) const {
    if (!tied) store.normal(W.offset, n_vocab * d_e, stddev, rng);
}

// X:[d_e,n] -> Z:[N_V,n]
template <class T>
void Unembedding<T>::logits(const ParamStore<T>& store, CMatView<T> X, MatView<T> Z) const {
    gemm<T>(tied ? Op::T : Op::N, Op::N, T(1), store.W(W), X, T(0), Z);  // W_u X  (W_u = W_eᵀ when tied)
    if (has_bias) {  // + b_u 1ᵀ (BERT's option)
        const T* bu = store.v(b);
        for (index_t t = 0; t < Z.cols; ++t) {
            T* z = Z.col(t);
            for (index_t i = 0; i < n_vocab; ++i) z[i] += bu[i];
        }
    }
    if (softcap > 0) {  // Gemma 2: Z ← c·tanh(Z / c)
        const T c = T(softcap);
        for (index_t t = 0; t < Z.cols; ++t) {
            T* z = Z.col(t);
            for (index_t i = 0; i < n_vocab; ++i) z[i] = c * std::tanh(z[i] / c);
        }
    }
}

template <class T>
void Unembedding<T>::softcap_backward(CMatView<T> Zc, MatView<T> dZ) const {
    const T c = T(softcap);
    for (index_t t = 0; t < dZ.cols; ++t) {
        const T* z = Zc.col(t);
        T* d = dZ.col(t);
        for (index_t i = 0; i < dZ.rows; ++i) d[i] *= T(1) - (z[i] / c) * (z[i] / c);
    }
}

template <class T>
void Unembedding<T>::add_bias(ParamStore<T>& store, const std::string& name) {
    FT_CHECK(!has_bias, "Unembedding: bias registered twice");
    b = store.vector(name, n_vocab);
    has_bias = true;
}

// X:[d_e,n] -> P:[N_V,n]
template <class T>
void Unembedding<T>::forward(const ParamStore<T>& store, CMatView<T> X, MatView<T> P) const {
    logits(store, X, P);
    softmax_columns<T>(P);  // line 1: p = softmax(W_u e)
}

namespace {
// dX += W_uᵀ dZ, a product whose inner dimension is the vocabulary (GPT-2: d_e 768 × n 1024 outputs, each a
// sum of N_V = 50257 terms). gemm splits a product over the threads by columns of dX, and then every thread's
// BLAS call packs the whole of W_u (154 MB in float32) for its columns. Split over the vocabulary instead,
// each row block of W_u and dZ is packed once: the blocks are taken in turn by the threads, each thread adds
// its blocks' W_u[V_b]ᵀ dZ[V_b] into a d_e × n sum of its own (thread 0: dX itself), and the sums are added at
// the end. The blocks go to the threads in a fixed order (static schedule), so for a given thread count the
// result is the same bits on every run. Below kVocabSplit multiply-adds, or without threads, one gemm.
constexpr double kVocabSplit = double(1 << 24);

template <class T>
void add_WuT_dZ(CMatView<T> W, bool tied, CMatView<T> dZ, MatView<T> dX) {
    const Op op = tied ? Op::N : Op::T;  // W_u = W (untied, [N_V, d_e]) or W_eᵀ (tied, W = W_e [d_e, N_V])
    const index_t n_vocab = dZ.rows;
    int team = 1;
#ifdef _OPENMP
    if (!omp_in_parallel()) team = std::min(get_num_threads(), omp_get_max_threads());
#endif
    const index_t blocks = std::min<index_t>(2 * index_t(team), n_vocab / 1024);
    if (team <= 1 || blocks < 2 || double(n_vocab) * double(dX.rows) * double(dX.cols) < kVocabSplit) {
        gemm<T>(op, Op::N, T(1), W, dZ, T(1), dX);
        return;
    }
    const index_t step = (n_vocab + blocks - 1) / blocks;
    const std::size_t part = std::size_t(dX.rows) * std::size_t(dX.cols);
    std::unique_ptr<T[]> sums(new T[part * std::size_t(team - 1)]);  // threads 1 … team−1 (written with β = 0 first)
    std::vector<char> used(std::size_t(team), 0);
    const ProductContext products = product_context();  // the caller's precision, on every thread
#pragma omp parallel num_threads(team)
    {
        ProductScope scope(products);
        int t = 0;
#ifdef _OPENMP
        t = omp_get_thread_num();
#endif
        MatView<T> S = t == 0 ? dX : MatView<T>(sums.get() + part * std::size_t(t - 1), dX.rows, dX.cols);
#pragma omp for schedule(static, 1)
        for (index_t b = 0; b < blocks; ++b) {
            const index_t o = b * step, w = std::min(step, n_vocab - o);
            if (w <= 0) continue;
            CMatView<T> Wb = tied ? CMatView<T>(W.data + o * W.ld, W.rows, w, W.ld) : CMatView<T>(W.data + o, w, W.cols, W.ld);
            const T beta = t == 0 || used[std::size_t(t)] ? T(1) : T(0);
            gemm<T>(op, Op::N, T(1), Wb, CMatView<T>(dZ.data + o, w, dZ.cols, dZ.ld), beta, S);  // S (+)= W_u[V_b]ᵀ dZ[V_b]
            used[std::size_t(t)] = 1;
        }
    }
    for (int t = 1; t < team; ++t) {  // dX += the other threads' sums
        if (!used[std::size_t(t)]) continue;
        const T* s = sums.get() + part * std::size_t(t - 1);
#pragma omp parallel for schedule(static) num_threads(team)
        for (index_t j = 0; j < dX.cols; ++j) {
            T* d = dX.col(j);
            const T* c = s + std::size_t(j) * std::size_t(dX.rows);
#pragma omp simd
            for (index_t i = 0; i < dX.rows; ++i) d[i] += c[i];
        }
    }
}
}  // namespace

template <class T>
void Unembedding<T>::backward_logits(ParamStore<T>& store, CMatView<T> X, CMatView<T> dZ, MatView<T> dX) const {
    if (tied)
        gemm<T>(Op::N, Op::T, T(1), X, dZ, T(1), store.dW(W));  // dW_e += X dZᵀ
    else
        gemm<T>(Op::N, Op::T, T(1), dZ, X, T(1), store.dW(W));  // dW_u += dZ Xᵀ
    if (dX.data) add_WuT_dZ<T>(store.W(W), tied, dZ, dX);        // dX += W_uᵀ dZ
    if (has_bias) {  // db_u += dZ 1
        T* db = store.dv(b);
        for (index_t t = 0; t < dZ.cols; ++t) {
            const T* g = dZ.col(t);
            for (index_t i = 0; i < n_vocab; ++i) db[i] += g[i];
        }
    }
}

template <class T>
void Unembedding<T>::backward(ParamStore<T>& store, CMatView<T> X, CMatView<T> P, MatView<T> dP, MatView<T> dX) const {
    softmax_columns_backward<T>(P, dP);  // d(line 1): dZ = P ⊙ (dP − 1(1ᵀ(P ⊙ dP)))
    backward_logits(store, X, dP, dX);
}

template <class T>
double nll_and_grad(MatView<T> Z, const index_t* targets, T scale, index_t* n_correct) {
    double loss = 0;
    index_t correct = 0;
#pragma omp parallel for schedule(static) reduction(+ : loss, correct) if (Z.size() > 16384)
    for (index_t t = 0; t < Z.cols; ++t) {
        T* z = Z.col(t);
        const double zy = double(z[targets[t]]);
        if (n_correct) {  // argmax (first of ties) == target
            index_t am = 0;
            for (index_t i = 1; i < Z.rows; ++i)
                if (z[i] > z[am]) am = i;
            correct += am == targets[t];
        }
        const double lse = softmax_column_lse(z, Z.rows);  // z ← softmax(z)
        const double nl = lse - zy;                          // −log softmax(z)[y] = logsumexp(z) − z[y]
        loss += nl;
        z[targets[t]] -= T(1);  // dZ = softmax(Z) − one_hot(y)
        if (scale != T(1))
            for (index_t i = 0; i < Z.rows; ++i) z[i] *= scale;
    }
    if (n_correct) *n_correct = correct;
    return loss;
}

template class Unembedding<float>;
template class Unembedding<double>;
template double nll_and_grad<float>(MatView<float>, const index_t*, float, index_t*);
template double nll_and_grad<double>(MatView<double>, const index_t*, double, index_t*);

}  // namespace ft
