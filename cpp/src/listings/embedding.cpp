// Algorithms 1 and 2: forward (a gather of columns) and backward (a scatter-add) side by side.
#include "formal_transformers/embedding.hpp"

#include <algorithm>
#include <cmath>

namespace ft {

// ===================================== Algorithm 1 ====================================================
template <class T>
TokenEmbedding<T>::TokenEmbedding(index_t n_vocab_, index_t d_e_, ParamStore<T>& store, const std::string& name)
    : n_vocab(n_vocab_), d_e(d_e_) {
    if (n_vocab <= 0) throw ValueError("TokenEmbedding: n_vocab must be positive");
    if (d_e <= 0) throw ValueError("TokenEmbedding: d_e must be positive");
    W_e = store.matrix(name, d_e, n_vocab);
}

template <class T>
void TokenEmbedding<T>::init(ParamStore<T>& store, Rng& rng, double stddev) const {
    store.normal(W_e.offset, d_e * n_vocab, stddev, rng);
}

// ids:[n] -> E:[d_e,n]
template <class T>
void TokenEmbedding<T>::forward(const ParamStore<T>& store, const index_t* ids, index_t n, MatView<T> E,
                                bool accumulate) const {
    store.refresh_adapters();  // every listing starts here: LoRA's W' = W + s·B·A of θ as it is now (lora.hpp line 1)
    CMatView<T> W = store.W(W_e);
#pragma omp parallel for schedule(static) if (d_e * n > 65536)
    for (index_t t = 0; t < n; ++t) {
        const T* w = W.col(ids[t]);  // line 1: e = W_e[:, v]
        T* e = E.col(t);
        if (accumulate) {
#pragma omp simd
            for (index_t i = 0; i < d_e; ++i) e[i] += w[i];
        } else {
            std::copy(w, w + d_e, e);
        }
    }
}

// d(line 1): dW_e[:, v] += dE[:, t] for every t with x[t] = v
template <class T>
void TokenEmbedding<T>::backward(ParamStore<T>& store, const index_t* ids, index_t n, CMatView<T> dE) const {
    MatView<T> dW = store.dW(W_e);
    for (index_t t = 0; t < n; ++t) {  // serial: two columns may scatter into the same token
        T* g = dW.col(ids[t]);
        const T* d = dE.col(t);
#pragma omp simd
        for (index_t i = 0; i < d_e; ++i) g[i] += d[i];
    }
}

// ===================================== Algorithm 2 ====================================================
template <class T>
PositionalEmbedding<T>::PositionalEmbedding(index_t l_max_, index_t d_e_, Positional kind_, double base_,
                                            ParamStore<T>& store, const std::string& name)
    : l_max(l_max_), d_e(d_e_), kind(kind_), base(base_ > 0 ? base_ : double(l_max_)) {
    if (l_max <= 0) throw ValueError("PositionalEmbedding: l_max must be positive");
    if (d_e <= 0) throw ValueError("PositionalEmbedding: d_e must be positive");
    if (kind == Positional::None) return;  // no W_p (V1, V2)
    W_p = store.matrix(name, d_e, l_max);
    if (kind == Positional::Sinusoidal) store.freeze(W_p.offset);
}

template <class T>
void PositionalEmbedding<T>::init(ParamStore<T>& store, Rng& rng, double stddev) const {
    if (W_p.offset < 0) return;  // no W_p
    if (kind == Positional::Learned) {
        store.normal(W_p.offset, d_e * l_max, stddev, rng);
        return;
    }
    // W_p[2i−1, t] = sin(t / ℓ_max^{2i/d_e}), W_p[2i, t] = cos(t / ℓ_max^{2i/d_e}); 1-based i, t
    MatView<T> W = store.W(W_p);
    for (index_t t = 1; t <= l_max; ++t)
        for (index_t i = 1; 2 * i - 1 <= d_e; ++i) {
            const double angle = double(t) / std::pow(base, 2.0 * double(i) / double(d_e));
            W(2 * i - 2, t - 1) = T(std::sin(angle));
            if (2 * i <= d_e) W(2 * i - 1, t - 1) = T(std::cos(angle));
        }
}

// positions:[n] -> E:[d_e,n]
template <class T>
void PositionalEmbedding<T>::forward(const ParamStore<T>& store, const index_t* positions, index_t n, MatView<T> E,
                                     bool accumulate) const {
    if (W_p.offset < 0) return;  // no W_p
    CMatView<T> W = store.W(W_p);
    for (index_t t = 0; t < n; ++t) {
        const T* w = W.col(positions[t]);  // line 1: e_p = W_p[:, ℓ]
        T* e = E.col(t);
        if (accumulate) {
#pragma omp simd
            for (index_t i = 0; i < d_e; ++i) e[i] += w[i];
        } else {
            std::copy(w, w + d_e, e);
        }
    }
}

template <class T>
void PositionalEmbedding<T>::forward_seqs(const ParamStore<T>& store, const Seqs& s, MatView<T> E, index_t offset) const {
    if (W_p.offset < 0) return;  // no W_p (V1, V2: the position enters attention)
    CMatView<T> W = store.W(W_p);
#pragma omp parallel for schedule(static) if (d_e * s.total() > 65536)
    for (index_t b = 0; b < s.count(); ++b)
        for (index_t j = 0; j < s.len(b); ++j) {
            const T* w = W.col(j + offset);
            T* e = E.col(s.begin(b) + j);
#pragma omp simd
            for (index_t i = 0; i < d_e; ++i) e[i] += w[i];
        }
}

// d(line 1): dW_p[:, ℓ] += dE[:, t]
template <class T>
void PositionalEmbedding<T>::backward(ParamStore<T>& store, const index_t* positions, index_t n, CMatView<T> dE) const {
    if (kind != Positional::Learned) return;
    MatView<T> dW = store.dW(W_p);
    for (index_t t = 0; t < n; ++t) {
        T* g = dW.col(positions[t]);
        const T* d = dE.col(t);
#pragma omp simd
        for (index_t i = 0; i < d_e; ++i) g[i] += d[i];
    }
}

template <class T>
void PositionalEmbedding<T>::backward_seqs(ParamStore<T>& store, const Seqs& s, CMatView<T> dE) const {
    if (kind != Positional::Learned) return;
    MatView<T> dW = store.dW(W_p);
    // parallel over positions j (each writes its own column of dW_p), serial over sequences
    const index_t lmax = s.max_len();
#pragma omp parallel for schedule(static) if (d_e * s.total() > 65536)
    for (index_t j = 0; j < lmax; ++j) {
        T* g = dW.col(j);
        for (index_t b = 0; b < s.count(); ++b) {
            if (j >= s.len(b)) continue;
            const T* d = dE.col(s.begin(b) + j);
#pragma omp simd
            for (index_t i = 0; i < d_e; ++i) g[i] += d[i];
        }
    }
}

template class TokenEmbedding<float>;
template class TokenEmbedding<double>;
template class PositionalEmbedding<float>;
template class PositionalEmbedding<double>;

}  // namespace ft
