// V16: multi-token prediction (Gloeckle et al. 2024; DeepSeek-V3 technical report §2.2): D sequential modules on
// Algorithm 10 (docs/variants.md V16), forward and hand-written backward in multi_token.cpp; their use as the
// draft of self-speculative decoding (no second model) in speculative.cpp.
//
// Algorithm V16: L ← DTransformerMTP(x | θ)
//   Hyperparameters: D = mtp_depth ≥ 1, λ = mtp_weight ≥ 0; norm, the block's options: Algorithm 10's
//   Parameters: θ of Algorithm 10; for k ∈ [D]: γ_k^h, β_k^h, γ_k^e, β_k^e ∈ ℝ^{d_e}, M_k ∈ ℝ^{d_e×2d_e}, θ_k of
//               one layer of Algorithm 10 (lines 5–8); W_e, γ, β, W_u are Algorithm 10's, shared
//    1  H⁰ ← X of Algorithm 10 after line 9 (before the final layer_norm of line 10);  ℓ ← length(x)
//    2  for k = 1, 2, …, D do
//    3    for t ∈ [ℓ − k]: h′_t ← M_k [layer_norm(H^{k−1}[:, t] | γ_k^h, β_k^h); layer_norm(W_e[:, x[t+k]] | γ_k^e, β_k^e)]
//    4    H^k ← Algorithm 10 lines 5–8 on H′ = [h′_1, …, h′_{ℓ−k}] with θ_k (Mask[t, t′] = [[t ≤ t′]])
//    5    for t ∈ [ℓ − k]: P^k[:, t] ← softmax(W_u layer_norm(H^k[:, t] | γ, β))
//    6    L_k ← −Σ_{t=1}^{ℓ−k−1} log P^k[x[t+k+1], t]
//    7  end
//    8  L_main ← −Σ_{t=1}^{ℓ−1} log P[x[t+1], t]        (Algorithm 13 line 5; P from Algorithm 10 line 11)
//    9  return L = L_main + (λ/D) Σ_{k=1}^{D} L_k
// (layer_norm: the model's norm, RMSnorm in DeepSeek-V3.) Module k at column t sees x[1 : t+k] and predicts
// x[t+k+1]: P^k[:, t] is the k-th token after the trunk's own prediction P[:, t]. Positions: module k's block
// puts the position t of h′_t into attention (RoPE, ALiBi) like the trunk's layers; line 3 adds no W_p (H^{k−1}
// carries it). Every sequence of a training batch needs ℓ ≥ D + 2 (ValueError), so l_max ≥ D + 2 (resolve).
#pragma once

#include <string>
#include <vector>

#include "formal_transformers/transformers.hpp"

namespace ft {

template <class T>
class MTPModule {
public:
    // activations of one training forward (module k of DTransformer::mtp_forward), for backward
    struct Acts {
        Seqs s;                        // ℓ_b − k columns per sequence
        std::vector<index_t> ids;      // x[t+k] of every column (line 3)
        Matrix<T> H_in;                // [d_e, n] H^{k−1}[:, t]
        Matrix<T> E;                   // [d_e, n] W_e[:, x[t+k]]
        NormCache<T> norm_h, norm_e;   // line 3's two norms
        Matrix<T> Nh, Ne;              // [d_e, n] layer_norm(H^{k−1}[:, t] | γ^h, β^h), layer_norm(e | γ^e, β^e)
        Matrix<T> Hp;                  // [d_e, n] line 3: H′
        typename PreLNDecoderBlock<T>::Acts block;  // line 4
        Matrix<T> H;                   // [d_e, n] line 4: H^k
        NormCache<T> norm_f;           // line 5's shared layer_norm(· | γ, β)
        Matrix<T> Hf;                  // [d_e, n] line 5: layer_norm(H^k | γ, β)
        Matrix<T> dH, dHf, dNh, dNe, dH_in, dE;  // backward scratch: ∂L/∂H^k, ∂L/∂Hf, …
    };
    // prefix: "mtp.{k−1}." (names: gamma_h, beta_h, gamma_e, beta_e, W_m, then the block's as a layer's)
    MTPModule(const ModelConfig& c, Activation act, ParamStore<T>& store, const std::string& prefix);
    void init(ParamStore<T>& store, Rng& rng, double stddev, double out_stddev) const;
    // line 3 for the columns of H_in and E: Nh, Ne and H′ (written)
    void combine(const ParamStore<T>& store, CMatView<T> H_in, CMatView<T> E, MatView<T> Nh, MatView<T> Ne,
                 NormCache<T>& ch, NormCache<T>& ce, MatView<T> Hp) const;
    // line 3 backward from dH′: dM_k +=, dγ, dβ +=; dH_in, dE (+=) (dNh, dNe: zeroed scratch)
    void combine_backward(ParamStore<T>& store, CMatView<T> dHp, CMatView<T> Nh, CMatView<T> Ne, const NormCache<T>& ch,
                          const NormCache<T>& ce, MatView<T> dNh, MatView<T> dNe, MatView<T> dH_in, MatView<T> dE) const;

    Norm<T> norm_h;             // γ_k^h, β_k^h
    Norm<T> norm_e;             // γ_k^e, β_k^e
    MatParam W_m;               // M_k [d_e, 2 d_e]: columns 0..d_e−1 act on the hidden state, d_e..2d_e−1 on the embedding
    PreLNDecoderBlock<T> block; // θ_k (lines 5–8 of Algorithm 10)
    Acts acts;                  // of the last training forward
};

// Self-speculative decoding's draft (speculative.cpp): every module's KV cache and its hidden states H^k of the
// positions fed so far (H[0] = H⁰ of the trunk's cached passes).
template <class T>
struct MTPDecoder {
    std::vector<KVCache<T>> kv;   // [D]: module k's block
    std::vector<index_t> len;     // [D]: positions module k has fed (its cache's columns)
    std::vector<Matrix<T>> H;     // [D + 1]: H^k[:, t], d_e × capacity
    Matrix<T> Nh, Ne, E, X, Xf;
    DecodeScratch<T> w;
    std::vector<index_t> ids;
};

// Module k (1-based) of `model` fed positions t0..t1−1 (0-based, t1 − 1 + k < length of x): H^{k−1} from d.H[k−1],
// the tokens x[t+k]; writes H^k to d.H[k] and the logits of position t1 − 1 (line 5 without the softmax) to z:[N_V].
// d.len[k−1] must be t0 (its cache then holds t1 columns).
template <class T>
void mtp_decode(const DTransformer<T>& model, MTPDecoder<T>& d, index_t k, const index_t* x, index_t t0, index_t t1, T* z);

}  // namespace ft
