// Algorithm V10: multi-head latent attention (MLA; DeepSeek-V2 2024, DeepSeek-V3 2024), the queries, keys and
// values of Algorithm 5 made from low-rank latents. docs/variants.md V10 prints the listing; the code is
// cpp/src/variants/latent_attention.cpp. It replaces Algorithm 4's lines 1–3 (for all heads) in MHAttention:
// the part is the Q/K/V source "latent" (parts.hpp QKVSource; MHAttention::source), so lines 4–6 (the head
// kernel, masks, dropout) and Algorithm 5's line 4 (W_o) stay the listing's.
//
//   Input: X ∈ R^{d_x×ℓ} (self-attention: Z = X), positions p_1 … p_ℓ.
//   Output: Q ∈ R^{H·d_attn×ℓ}, K ∈ R^{H·d_attn×ℓ}, V ∈ R^{H·d_mid×ℓ} (head h a block of rows), with
//           d_attn = d_N + d_R (qk_nope_head_dim + qk_rope_head_dim) and d_mid = d_v (v_head_dim).
//   Hyperparameters: H, d_c (kv_lora_rank), d_c′ (q_lora_rank; 0: no query latent), d_R, θ (V1's base).
//   Parameters: W_DQ ∈ R^{d_c′×d_x}, γ_Q ∈ R^{d_c′}, W_UQ ∈ R^{H·d_attn×d_c′} (with d_c′ = 0: W_Q ∈ R^{H·d_attn×d_x});
//               W_DKV ∈ R^{(d_c+d_R)×d_x}, γ_KV ∈ R^{d_c}, W_UKV ∈ R^{H·(d_N+d_v)×d_c}.
//   1  C_Q ← W_DQ X                                [[query latent]]
//   2  Q ← W_UQ rms_norm(C_Q | γ_Q)                (d_c′ = 0: Q ← W_Q X); Q^h = [Q_N^h; Q_R^h]
//   3  [C_KV; K̃_R] ← W_DKV X                       [[the KV latent and the shared key part]]
//   4  Ĉ_KV ← rms_norm(C_KV | γ_KV)                [[cached: Ĉ_KV and K_R are all a token keeps]]
//   5  [K_N^h; V^h]_{h∈[H]} ← W_UKV Ĉ_KV            [[keys and values up-projected, per head]]
//   6  Q_R^h ← RoPE(Q_R^h, p | θ) ∀h;  K_R ← RoPE(K̃_R, p | θ)   (Algorithm V1, half-split pairs)
//   7  K^h ← [K_N^h; K_R] ∀h                        [[one K_R shared by every head]]
//   8  return Q, K, V (Algorithm 4 lines 4–6 follow: S = K^hᵀ Q^h / √(d_N + d_R))
// The rms_norms of lines 2 and 4 have ε = 1e-6 (kLatentEps; DeepSeek's code, whatever the model's eps).
#pragma once

#include <memory>
#include <string>

#include "formal_transformers/params.hpp"
#include "formal_transformers/parts.hpp"

namespace ft {

constexpr double kLatentEps = 1e-6;  // ε of lines 2 and 4's rms_norm

// The sizes of V10 (AttnVariant's kv_lora_rank, q_lora_rank, qk_rope_head_dim; d_attn, d_mid of MHAttention).
struct LatentSpec {
    index_t H = 0, d_x = 0, d_attn = 0, d_v = 0;
    index_t d_c = 0, d_cq = 0, d_R = 0;  // kv_lora_rank, q_lora_rank (0: none), qk_rope_head_dim
    double theta = 10000.0;
};

// Activations of lines 1–7 kept for the backward pass.
template <class T>
struct LatentCache : PartStateOf<LatentCache<T>> {
    Matrix<T> CQ, CQh;    // [d_c′, n] line 1's C_Q and rms_norm(C_Q)
    NormCache<T> nq, nkv;  // lines 2 and 4
    Matrix<T> CKR;        // [d_c + d_R, n] line 3's [C_KV; K̃_R]
    Matrix<T> Ch;         // [d_c, n] line 4's Ĉ_KV
    Matrix<T> KV;         // [H·(d_N + d_v), n] line 5
};
// Backward scratch.
template <class T>
struct LatentWork : PartStateOf<LatentWork<T>> {
    Matrix<T> dKV, dCh, dCKR, dCQh, dCQ;
};

template <class T>
class LatentQKV {
public:
    // ValueError: d_c < 1, d_R odd or > d_attn, d_cq < 0.
    LatentQKV(const LatentSpec& s, ParamStore<T>& store, const std::string& prefix);
    void init(ParamStore<T>& store, Rng& rng, double stddev) const;  // W's ~ N(0, stddev²), γ's 1

    // Lines 1–7 on X:[d_x, n] (sequences s; positions q0 + t within each) -> Q, K:[H·d_attn, n], V:[H·d_v, n].
    void forward(const ParamStore<T>& store, CMatView<T> X, const Seqs& s, index_t q0, MatView<T> Q, MatView<T> K,
                 MatView<T> V, LatentCache<T>& c) const;
    // Given dQ, dK, dV (overwritten: RoPE's transpose in place on their R rows): parameter gradients += …, dX += ….
    void backward(ParamStore<T>& store, CMatView<T> X, const Seqs& s, index_t q0, const LatentCache<T>& c, MatView<T> dQ,
                  MatView<T> dK, CMatView<T> dV, MatView<T> dX, LatentWork<T>& w) const;

    // Decoding (the cache holds the latent): lines 1, 2, 6 for queries X:[d_x, n] at q0, q0+1, … -> Q;
    // lines 3, 4, 6 for new tokens at p0, p0+1, … -> L:[d_c + d_R, n] = [Ĉ_KV; K_R] (what the cache keeps);
    // lines 5, 7 on cached columns L:[d_c + d_R, m] -> K, V.
    void queries(const ParamStore<T>& store, CMatView<T> X, index_t q0, MatView<T> Q, LatentCache<T>& c) const;
    void latent(const ParamStore<T>& store, CMatView<T> X, index_t p0, MatView<T> L, LatentCache<T>& c) const;
    void expand(const ParamStore<T>& store, CMatView<T> L, MatView<T> K, MatView<T> V, LatentCache<T>& c) const;
    index_t cache_rows() const { return s_.d_c + s_.d_R; }  // numbers a token keeps per layer (K's rows of KVCache)

    const LatentSpec& spec() const { return s_; }
    MatParam W_dq, W_uq, W_q, W_dkv, W_ukv;

private:
    void query_part(const ParamStore<T>& store, CMatView<T> X, MatView<T> Q, LatentCache<T>& c) const;  // lines 1–2
    void split_kv(CMatView<T> KV, CMatView<T> KR, MatView<T> K, MatView<T> V) const;                  // lines 5, 7
    void rope_q(MatView<T> Q, const Seqs& s, index_t q0, bool inverse) const;                           // line 6 (Q)
    LatentSpec s_;
    index_t d_N = 0;
    std::shared_ptr<const Norm<T>> norm_q, norm_kv;
};

}  // namespace ft
