// Listing V28 (docs/variants.md): Whisper's audio front-end (Radford et al. 2022, "Robust Speech Recognition via
// Large-Scale Weak Supervision", §2.2 and Figure 1; openai/whisper model.py AudioEncoder), forward and backward,
// and Listing V29: Whisper, the encoder-decoder on a log-mel spectrogram.
//
// Algorithm V28: Z ← AudioFrontEnd(F | W_c1, b_c1, W_c2, b_c2, W_sin)
//   Input: F ∈ R^{n_mels×T}, a log-mel spectrogram (column t: frame t; F[:, 0] = F[:, T+1] = 0, the padding).
//   Output: Z ∈ R^{d_e×ℓ_z}, ℓ_z = ⌈T/2⌉, the encoder's input.
//   Parameters: W_c1 ∈ R^{d_e×3n_mels}, b_c1 ∈ R^{d_e}, W_c2 ∈ R^{d_e×3d_e}, b_c2 ∈ R^{d_e}; W_sin ∈ R^{d_e×ℓ_max} fixed.
//   1  for t ∈ [T]: u_t ← [F[c, t−1], F[c, t], F[c, t+1]] for c = 1..n_mels     (kernel 3, padding 1; (c, k) order)
//   2  H ← GELU(W_c1 U + b_c1 1ᵀ)                                              H ∈ R^{d_e×T}
//   3  for t ∈ [ℓ_z]: v_t ← [H[c, 2t−2], H[c, 2t−1], H[c, 2t]] for c = 1..d_e  (stride 2; H[:, 0] = H[:, T+1] = 0)
//   4  Z ← GELU(W_c2 V + b_c2 1ᵀ)
//   5  Z ← Z + W_sin[:, 1:ℓ_z],  W_sin[i, t] = sin((t−1) τ_i) (i ≤ d_e/2), cos((t−1) τ_{i−d_e/2}) (i > d_e/2),
//      τ_i = 10000^{−(i−1)/(d_e/2−1)}
//   6  return Z
// Lines 1–4 are the two 1-D convolutions (torch.nn.Conv1d(n_mels, d_e, 3, padding=1) and
// Conv1d(d_e, d_e, 3, stride=2, padding=1), weights flattened in (c, k) order) with exact GELU.
//
// Algorithm V29: P ← Whisper(F, x | θ) — an EDTransformer (Algorithm 8) whose encoder's embedding is V28 (the part
// "audio", variants/audio_embedding.cpp: options n_mels, n_audio_ctx), with block = "pre_ln", mlp = "gelu", tied:
//   1  Z ← AudioFrontEnd(F | θ)                                               (V28)
//   2  for l = 1..L_enc: Z ← pre-LN layer (Algorithm 10 lines 5–8, GELU) with Mask ≡ 1     (the block "pre_ln")
//   3  Z ← layer_norm(Z | γ_enc, β_enc)
//   4  for t ∈ [ℓ_x]: e_t ← W_e[:, x[t]] + W_p[:, t];  X ← [e_1, …, e_ℓx]      (Algorithm 8 lines 10–12)
//   5  for l = 1..L_dec: X ← pre-LN cross layer (V18a, GELU) over Z                  (the block "pre_ln")
//   6  X ← layer_norm(X | γ_dec, β_dec)
//   7  return P = softmax(W_eᵀ X)                                              (tied unembedding)
// Every attention has biases b_q, b_k, b_v, b_o; Whisper's key projection has none, which is b_k = 0: b_k adds a
// per-query constant to the scores, which the softmax ignores, so its gradient is exactly 0 and it stays 0.
// Loss: Algorithm 11's −Σ_{t=1}^{ℓ−1} log P[x[t+1], t] per sequence, summed over the batch.
#pragma once

#include <memory>
#include <vector>

#include "formal_transformers/transformers.hpp"

namespace ft {

// Lines 1 and 3: the columns of a kernel-3, padding-1 convolution with stride s over X:[C, Σ T_b] (sequences s_in)
// -> U:[3C, Σ ⌈T_b/s⌉], U[c·3 + k, t] = X[c, s·t + k − 1] within each sequence (0 outside it).
template <class T>
void conv3_columns(CMatView<T> X, const Seqs& s_in, index_t stride, MatView<T> U);
// its backward: dX[c, s·t + k − 1] += dU[c·3 + k, t] (dX:[C, Σ T_b], accumulated)
template <class T>
void conv3_columns_backward(CMatView<T> dU, const Seqs& s_in, index_t stride, MatView<T> dX);
// ⌈T/s⌉ per sequence
Seqs conv3_lengths(const Seqs& s_in, index_t stride);
// line 5's table W_sin [d, n] (openai/whisper's sinusoids(n, d), d even ≥ 4)
template <class T>
Matrix<T> whisper_sinusoids(index_t n, index_t d);

// Algorithm V28's lines 1–4 and their backward (the positions of line 5 are added by the model).
template <class T>
class AudioFrontEnd {
public:
    struct Acts {
        Seqs s_in, s_out;
        Matrix<T> U1, A1, H1, U2, A2;  // line 1's columns, line 2's pre-activation and H, line 3's columns, line 4's pre-activation
        Matrix<T> dA, dU, dH;          // backward scratch
    };
    AudioFrontEnd(index_t n_mels, index_t d_e, ParamStore<T>& store, const std::string& prefix);
    void init(ParamStore<T>& store, Rng& rng, double stddev) const;
    // F:[n_mels, Σ T_b] (sequences s) -> Z:[d_e, Σ ⌈T_b/2⌉] (lines 1–4)
    void forward(const ParamStore<T>& store, CMatView<T> F, const Seqs& s, Matrix<T>& Z, Acts& a) const;
    // dZ = ∂loss/∂Z -> parameter gradients +=; dF (optional, [n_mels, Σ T_b]) = ∂loss/∂F
    void backward(ParamStore<T>& store, CMatView<T> dZ, Acts& a, MatView<T>* dF = nullptr) const;

    index_t n_mels, d_e;
    MatParam W_c1, W_c2;
    VecParam b_c1, b_c2;
};

}  // namespace ft
