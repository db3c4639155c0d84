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
// Algorithm V29: P ← Whisper(F, x | θ)
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

struct WhisperConfig {
    index_t n_mels = 0, n_audio_ctx = 0;   // num_mel_bins; max_source_positions (ℓ_z ≤ it: T ≤ 2·n_audio_ctx)
    index_t n_vocab = 0, n_text_ctx = 0;   // vocab_size; max_target_positions (ℓ_x ≤ it)
    index_t L_enc = 0, L_dec = 0, H = 0, d_e = 0, d_mlp = 0;
    double eps = 1e-5;                     // torch.nn.LayerNorm's default, what Whisper uses
    // the token greedy decoding starts with (decoder_start_token_id) and stops at (eos_token_id); −1: none
    index_t start_id = -1, eos_id = -1;
    std::uint64_t seed = 0;
    double init_std = 0.02;
};
// ValueError naming the option unless every size is positive, H divides d_e, d_e is even and ≥ 4 (the sinusoids),
// eps ≥ 0, init_std > 0 and start_id, eos_id in [−1, n_vocab); ValueError when the model exceeds sizes.hpp's bound.
void check(const WhisperConfig& c);

template <class T>
class Whisper {
public:
    explicit Whisper(const WhisperConfig& c);
    Whisper(const Whisper&) = delete;
    Whisper& operator=(const Whisper&) = delete;

    const WhisperConfig wc;
    // the layers' options: ED's block "pre_ln" (Algorithm 10's layer, V18a's cross layer), layer_norm, mlp = GELU
    // (exact), biases, H, d_e, d_mlp
    const ModelConfig cfg;
    ParamStore<T> store;
    AudioFrontEnd<T> front;                                          // line 1 (V28 lines 1–4)
    Matrix<T> W_sin;                                                 // line 1 (V28 line 5), [d_e, n_audio_ctx]: fixed
    std::vector<std::unique_ptr<SelfBlock<T>>> enc;                  // line 2: the block "pre_ln", Mask ≡ 1
    std::unique_ptr<Norm<T>> norm_enc;                               // line 3
    TokenEmbedding<T> tok;                                           // line 4: W_e
    MatParam W_p;                                                    // line 4 [d_e, n_text_ctx]
    std::vector<std::unique_ptr<CrossBlock<T>>> dec;                 // line 5: the block "pre_ln" (V18a's cross layer)
    std::unique_ptr<Norm<T>> norm_dec;                               // line 6

    // features: B spectrograms of n_mels·T values each, (n_mels, T) row-major (numpy's (B, n_mels, T)); x: the
    // decoder's tokens (sequences sx, one per spectrogram); both checked by the caller (T ≤ 2·n_audio_ctx,
    // ℓ_x ≤ n_text_ctx, ids in range). Lines 1–6; the logits W_eᵀ X -> logits() [N_V, Σ ℓ_x].
    void forward(const T* features, index_t B, index_t n_frames, const index_t* x, const Seqs& sx);
    CMatView<T> logits() const { return view(Zl_); }
    CMatView<T> encoded() const { return view(Zf_); }  // line 3's Z of the last forward [d_e, B·ℓ_z]
    // Algorithm 11's loss summed over the batch; grad: its gradient in store.grad() (zeroed first);
    // dF (optional, [n_mels, B·T] in the model's column layout): ∂loss/∂F; n_scored / n_correct (optional)
    double loss(const T* features, index_t B, index_t n_frames, const index_t* x, const Seqs& sx, bool grad,
                index_t* n_scored = nullptr, index_t* n_correct = nullptr, Matrix<T>* dF = nullptr);
    // the attention weights of the last forward: kind Encoder (ℓ_z × ℓ_z), Decoder (ℓ_x × ℓ_x) or Cross
    // (ℓ_z keys × ℓ_x queries), layer l, sequence b, head h (checked by the caller)
    CMatView<T> attention_weights(AttentionKind kind, index_t l, index_t b, index_t h) const;
    bool has_forward() const { return done_; }
    const Seqs& last_z() const { return sz_; }
    const Seqs& last_x() const { return sx_; }

private:
    void backward(MatView<T> dLogits, Matrix<T>* dF);
    bool done_ = false;
    index_t B_ = 0, T_ = 0;
    Seqs sf_, sz_, sx_;
    std::vector<index_t> x_;
    Matrix<T> F_;                              // the features in column layout [n_mels, B·T]
    typename AudioFrontEnd<T>::Acts front_acts_;
    std::vector<Matrix<T>> zstream_, xstream_;  // [L_enc+1], [L_dec+1]
    std::vector<std::unique_ptr<BlockActs<T>>> enc_acts_;
    std::vector<std::unique_ptr<CrossBlockActs<T>>> dec_acts_;
    Matrix<T> Zf_, Xf_, Zl_, dXf_;
    NormCache<T> norm_enc_c_, norm_dec_c_;
    BackwardWork<T> work_;
};

}  // namespace ft
