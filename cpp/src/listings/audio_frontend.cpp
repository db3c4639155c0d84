// Algorithm V28: Z ← AudioFrontEnd(F | W_c1, b_c1, W_c2, b_c2, W_sin) — Whisper's two 1-D convolutions with GELU
// (whisper.hpp quotes the listing; docs/variants.md V28). Forward and backward side by side.
//   1  for t ∈ [T]: u_t ← [F[c, t−1], F[c, t], F[c, t+1]] for c = 1..n_mels
//   2  H ← GELU(W_c1 U + b_c1 1ᵀ)
//   3  for t ∈ [ℓ_z]: v_t ← [H[c, 2t−2], H[c, 2t−1], H[c, 2t]] for c = 1..d_e
//   4  Z ← GELU(W_c2 V + b_c2 1ᵀ)
//   5  Z ← Z + W_sin[:, 1:ℓ_z]            (added by the model, Whisper<T>::forward)
#include <algorithm>
#include <cmath>

#include "formal_transformers/blas.hpp"
#include "formal_transformers/functions.hpp"
#include "formal_transformers/sizes.hpp"
#include "formal_transformers/whisper.hpp"

namespace ft {

namespace {
template <class T>
MatView<T> zeros_of(Matrix<T>& m, index_t rows, index_t cols) {
    MatView<T> v = ensure(m, rows, cols);
    std::fill(v.data, v.data + v.size(), T(0));
    return v;
}
}  // namespace

Seqs conv3_lengths(const Seqs& s_in, index_t stride) {
    std::vector<index_t> l;
    for (index_t b = 0; b < s_in.count(); ++b) l.push_back((s_in.len(b) + stride - 1) / stride);  // ⌊(T + 2 − 3)/s⌋ + 1
    return Seqs::from_lengths(l);
}

// lines 1 and 3: column t of sequence b reads the input columns s·t − 1, s·t, s·t + 1 of that sequence (0-based)
template <class T>
void conv3_columns(CMatView<T> X, const Seqs& s_in, index_t stride, MatView<T> U) {
    const Seqs s_out = conv3_lengths(s_in, stride);
    const index_t C = X.rows;
    for (index_t b = 0; b < s_in.count(); ++b) {
        const index_t T_b = s_in.len(b), i0 = s_in.begin(b), o0 = s_out.begin(b);
        for (index_t t = 0; t < s_out.len(b); ++t) {
            T* u = U.col(o0 + t);
            for (index_t k = 0; k < 3; ++k) {
                const index_t src = stride * t + k - 1;
                const bool in = src >= 0 && src < T_b;  // the padding: F[:, 0] = F[:, T+1] = 0
                const T* x = in ? X.col(i0 + src) : nullptr;
                for (index_t c = 0; c < C; ++c) u[c * 3 + k] = in ? x[c] : T(0);
            }
        }
    }
}

// d(lines 1 and 3): each input column gathers the gradients of the entries that copied it
template <class T>
void conv3_columns_backward(CMatView<T> dU, const Seqs& s_in, index_t stride, MatView<T> dX) {
    const Seqs s_out = conv3_lengths(s_in, stride);
    const index_t C = dX.rows;
    for (index_t b = 0; b < s_in.count(); ++b) {
        const index_t T_b = s_in.len(b), i0 = s_in.begin(b), o0 = s_out.begin(b);
        for (index_t t = 0; t < s_out.len(b); ++t) {
            const T* du = dU.col(o0 + t);
            for (index_t k = 0; k < 3; ++k) {
                const index_t src = stride * t + k - 1;
                if (src < 0 || src >= T_b) continue;
                T* dx = dX.col(i0 + src);
                for (index_t c = 0; c < C; ++c) dx[c] += du[c * 3 + k];
            }
        }
    }
}

// line 5's table: openai/whisper model.py sinusoids(length, channels, max_timescale=10000)
template <class T>
Matrix<T> whisper_sinusoids(index_t n, index_t d) {
    FT_CHECK(d % 2 == 0 && d >= 4, "whisper_sinusoids: d must be even and >= 4");
    Matrix<T> W;
    MatView<T> w = ensure(W, d, n);
    const index_t h = d / 2;
    const double inc = std::log(10000.0) / double(h - 1);
    for (index_t t = 0; t < n; ++t)
        for (index_t i = 0; i < h; ++i) {
            const double a = double(t) * std::exp(-inc * double(i));
            w(i, t) = T(std::sin(a));
            w(h + i, t) = T(std::cos(a));
        }
    return W;
}

template <class T>
AudioFrontEnd<T>::AudioFrontEnd(index_t n_mels_, index_t d_e_, ParamStore<T>& store, const std::string& p)
    : n_mels(n_mels_), d_e(d_e_) {
    W_c1 = store.matrix(p + "W_c1", d_e, checked_mul(3, n_mels, "AudioFrontEnd: 3·n_mels"));
    b_c1 = store.vector(p + "b_c1", d_e);
    W_c2 = store.matrix(p + "W_c2", d_e, checked_mul(3, d_e, "AudioFrontEnd: 3·d_e"));
    b_c2 = store.vector(p + "b_c2", d_e);
}

template <class T>
void AudioFrontEnd<T>::init(ParamStore<T>& store, Rng& rng, double s) const {
    store.normal(W_c1.offset, W_c1.rows * W_c1.cols, s, rng);
    store.normal(W_c2.offset, W_c2.rows * W_c2.cols, s, rng);
}

template <class T>
void AudioFrontEnd<T>::forward(const ParamStore<T>& store, CMatView<T> F, const Seqs& s, Matrix<T>& Z, Acts& a) const {
    a.s_in = s;
    a.s_out = conv3_lengths(s, 2);
    const index_t n = s.total(), m = a.s_out.total();
    checked_elements({3 * n_mels, n}, sizeof(T), "the spectrogram's convolution columns");
    checked_elements({3 * d_e, m}, sizeof(T), "the second convolution's columns");
    checked_elements({d_e, n}, sizeof(T), "the first convolution's output");
    MatView<T> U1 = ensure(a.U1, 3 * n_mels, n);
    conv3_columns<T>(F, s, 1, U1);                        // line 1: u_t ← [F[:, t−1]; F[:, t]; F[:, t+1]]
    MatView<T> A1 = ensure(a.A1, d_e, n);
    affine<T>(store.W(W_c1), U1, store.v(b_c1), A1);       // line 2: W_c1 U + b_c1 1ᵀ
    MatView<T> H1 = ensure(a.H1, d_e, n);
    gelu<T>(A1.data, H1.data, A1.size());                   // line 2: H ← GELU(·)
    MatView<T> U2 = ensure(a.U2, 3 * d_e, m);
    conv3_columns<T>(H1, s, 2, U2);                         // line 3: v_t ← [H[:, 2t−2]; H[:, 2t−1]; H[:, 2t]]
    MatView<T> A2 = ensure(a.A2, d_e, m);
    affine<T>(store.W(W_c2), U2, store.v(b_c2), A2);       // line 4: W_c2 V + b_c2 1ᵀ
    MatView<T> Zv = ensure(Z, d_e, m);
    gelu<T>(A2.data, Zv.data, A2.size());                   // line 4: Z ← GELU(·)
}

template <class T>
void AudioFrontEnd<T>::backward(ParamStore<T>& store, CMatView<T> dZ, Acts& a, MatView<T>* dF) const {
    const index_t n = a.s_in.total(), m = a.s_out.total();
    MatView<T> dA = ensure(a.dA, d_e, m);
    gelu_backward<T>(a.A2.data(), dZ.data, dA.data, dA.size());  // d(line 4): GELU'
    MatView<T> dU = zeros_of(a.dU, 3 * d_e, m);
    affine_backward<T>(store.W(W_c2), view(a.U2), dA, store.dW(W_c2).data, store.dv(b_c2), dU.data);  // d(line 4)
    MatView<T> dH = zeros_of(a.dH, d_e, n);
    conv3_columns_backward<T>(dU, a.s_in, 2, dH);                // d(line 3)
    gelu_backward<T>(a.A1.data(), dH.data, dH.data, dH.size());  // d(line 2): GELU'
    MatView<T> dU1 = zeros_of(a.dU, 3 * n_mels, n);
    affine_backward<T>(store.W(W_c1), view(a.U1), dH, store.dW(W_c1).data, store.dv(b_c1), dF ? dU1.data : nullptr);  // d(line 2)
    if (dF) conv3_columns_backward<T>(dU1, a.s_in, 1, *dF);      // d(line 1)
}

template void conv3_columns<float>(CMatView<float>, const Seqs&, index_t, MatView<float>);
template void conv3_columns<double>(CMatView<double>, const Seqs&, index_t, MatView<double>);
template void conv3_columns_backward<float>(CMatView<float>, const Seqs&, index_t, MatView<float>);
template void conv3_columns_backward<double>(CMatView<double>, const Seqs&, index_t, MatView<double>);
template Matrix<float> whisper_sinusoids<float>(index_t, index_t);
template Matrix<double> whisper_sinusoids<double>(index_t, index_t);
template class AudioFrontEnd<float>;
template class AudioFrontEnd<double>;

}  // namespace ft
