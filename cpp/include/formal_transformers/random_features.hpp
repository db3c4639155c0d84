// Algorithm V15 (random-feature attention, docs/variants.md): Algorithm 4's lines 4–6 replaced by a kernel
// estimate with D random features, linear in ℓ (Peng et al. 2021, "Random Feature Attention" (RFA);
// Choromanski et al. 2021, "Rethinking Attention with Performers" (FAVOR+)). cpp/src/variants/random_features.cpp
// holds the forward and backward side by side.
//
// Algorithm V15a: Ω ← DrawFeatures(D, d | seed, kind)
//   1  for each block of d rows (the last one: D mod d rows):  G ~ N(0, 1)^{d×d};  B ← the Gram–Schmidt
//      orthonormal rows of G  (kind "performer": orthogonal features; kind "rfa": B ← G, independent draws)
//   2  performer: each row ω_i ← B[i, :] · ‖g_i‖, g_i ~ N(0, I_d)  (norms chi-distributed with d degrees of
//      freedom, so each ω_i ~ N(0, I_d) marginally)
//   3  return Ω = [ω_1, …, ω_D]ᵀ ∈ R^{D×d}                       [[fixed, not trained; redrawn from the seed]]
//
// Algorithm V15b: Φ ← φ(X | Ω, kind)   X ∈ R^{d×ℓ} (one head's queries or keys), s = d^{−1/4}
//   performer (positive features, FAVOR+):  U ← s Ω X − ½ s² 1 ‖X‖²ᵀ;  Φ ← exp(U)/√D            ∈ R^{D×ℓ}
//   rfa (trigonometric features):           U ← s Ω X;  Φ ← [sin U; cos U] diag(exp(½ s² ‖X‖²))/√D  ∈ R^{2D×ℓ}
//   So E[φ(q)ᵀφ(k)] = exp(qᵀk/√d): φ(Q)ᵀφ(K) estimates the numerators of softmax(S/√d_attn).
//   For queries a positive factor c_t per column cancels in line 5 below; the core uses it to keep exp()
//   in range: performer, Φ[:, t] ← exp(U[:, t] − max_i U[i, t])/√D; rfa, the factor exp(½ s² ‖x_t‖²) dropped.
//
// Algorithm V15c: Ṽ ← RFAttention(Q, K, V | Ω, Mask)     replaces Algorithm 4's lines 4–6
//   1  Φ_q ← φ(Q), Φ_k ← φ(K)                             [[∈ R^{M×ℓ_x}, R^{M×ℓ_z}; M = D or 2D]]
//   bidirectional (Mask ≡ 1):
//   2  S ← V Φ_kᵀ,  z ← Φ_k 1                             [[∈ R^{d_v×M}, R^M: O(ℓ D d) work]]
//   3  N ← S Φ_q,  n ← Φ_qᵀ z
//   causal (Mask[t_z, t_x] = [[t_z ≤ t_x]]): prefix sums over the keys,
//   2′ S_t ← Σ_{t_z ≤ t} v_{t_z} φ(k_{t_z})ᵀ,  z_t ← Σ_{t_z ≤ t} φ(k_{t_z})
//   3′ N[:, t] ← S_t φ(q_t),  n_t ← z_tᵀ φ(q_t)
//   4  return Ṽ = N diag(n)^{−1}
//   (The core computes 2′–3′ in chunks of C queries: S, z before the chunk, plus the chunk's own keys through
//   the masked C×C block (Φ_k,cᵀ Φ_q,c) ⊙ Mask; the same numbers up to rounding. Decoding keeps S, z per head:
//   O(D·d) state instead of a cache of ℓ keys.)
//
// Backward (given dṼ; G ← dṼ diag(n)^{−1}, e_t ← −dṼ[:, t]ᵀ Ṽ[:, t] / n_t):
//   bidirectional:  dΦ_q = Sᵀ G + z eᵀ;  R ← G Φ_qᵀ, r ← Φ_q e;  dΦ_k = Rᵀ V + r 1ᵀ;  dV = R Φ_k
//   causal: the same with S_t, z_t (forward prefix sums) for dΦ_q and R, r summed over the later queries
//   (suffix sums) for dΦ_k, dV.
//   φ backward (Ω fixed): performer dU = dΦ ⊙ Φ, dX = s Ωᵀ dU − s² X diag(1ᵀ dU);
//   rfa dU = dΦ_sin ⊙ Φ_cos − dΦ_cos ⊙ Φ_sin, dX = s Ωᵀ dU + s² X diag(1ᵀ(dΦ ⊙ Φ)) (keys; queries without the
//   factor: no second term). The stabiliser of the queries is a constant of the backward (its gradient
//   cancels exactly, as the factor does in line 4).
#pragma once

#include <cstdint>
#include <string>

#include <vector>

#include "formal_transformers/common.hpp"
#include "formal_transformers/parts.hpp"
#include "formal_transformers/variants.hpp"

namespace ft {

// The kind of V15's features, the head kernels "performer" (positive orthogonal features, FAVOR+) and "rfa"
// (trigonometric features): Algorithm V15a's and V15b's `kind`.
enum class FeatureKind { Performer, RFA };
// "performer" or "rfa" -> its kind; ValueError naming `option` for another name
FeatureKind feature_kind(const std::string& name, const char* option);

// The fixed random projection Ω of one attention: D rows of dimension d (Algorithm V15a).
template <class T>
struct RandomFeatures {
    FeatureKind kind = FeatureKind::Performer;
    index_t D = 0, d = 0;
    Matrix<T> Omega;  // [D, d]
    // rows of φ(x): D (performer) or 2D (rfa: sin and cos); check_n_features bounds 2D
    index_t M() const { return kind == FeatureKind::RFA ? 2 * D : D; }
};

// V15's one rule for n_features, called by the config's resolve and by the part's factory (and by the draw)
// before anything is drawn: D >= 1, d_attn >= 1, and Ω of `attentions` attentions (D × d_attn elements of
// elem_size bytes each) with the draw's D × d_attn doubles within sizes.hpp's bound (overflow-checked). ValueError
// naming n_features. Returns M, the rows of φ(x): D (performer) or 2D (rfa).
index_t check_n_features(FeatureKind kind, index_t D, index_t d_attn, index_t attentions, std::size_t elem_size);

// V15a: Ω drawn from `seed` and the attention's name (its parameter prefix, e.g. "layers.0.attn."), so every
// layer draws its own features and the same seed redraws the same ones. ValueError: D < 1, d < 1.
template <class T>
RandomFeatures<T> draw_random_features(FeatureKind kind, index_t D, index_t d, std::uint64_t seed,
                                       const std::string& name);

// V15b on the columns of X:[d, n] -> Phi:[M, n]; query = true applies the queries' stabiliser (see above).
template <class T>
void random_feature_map(const RandomFeatures<T>& f, CMatView<T> X, bool query, MatView<T> Phi);
// dX += (∂Φ/∂X)ᵀ dPhi (Ω fixed), given X and its Phi.
template <class T>
void random_feature_map_backward(const RandomFeatures<T>& f, CMatView<T> X, CMatView<T> Phi, CMatView<T> dPhi,
                                 bool query, MatView<T> dX);

// The state of causal decoding for one head: S = Σ v φ(k)ᵀ ([d_v, M]) and z = Σ φ(k) ([M]) over the keys
// folded so far (null: none).
template <class T>
struct FeatureState {
    T* S = nullptr;
    T* z = nullptr;
};

// The head kernel's state in a KV cache (KVCache::state): S, z of every key/value head g at S[g·d_v·M …],
// z[g·M …] ([H_kv·d_v·M], [H_kv·M]), the keys before the cache's column 0 folded in.
template <class T>
struct FeatureDecodeState : PartStateOf<FeatureDecodeState<T>> {
    std::vector<T> S, z;
};

// V15c for one head of one sequence: Q:[d, l_x], K:[d, l_z], V:[d_v, l_z] -> Vt:[d_v, l_x] and n:[l_x] (the
// normalisers, kept for the backward). causal: key t visible to query column j iff t ≤ q0 + j (keys of the
// state `s0`, when given, are before every key of K). Runs on the calling thread (one-thread BLAS calls).
template <class T>
void rf_attention_head(const RandomFeatures<T>& f, CMatView<T> Q, CMatView<T> K, CMatView<T> V, bool causal,
                       index_t q0, FeatureState<T> s0, MatView<T> Vt, T* n);
// Backward: accumulates dQ += …, dK += …, dV += …, given the forward's Vt, n and dṼ (no state: training).
template <class T>
void rf_attention_head_backward(const RandomFeatures<T>& f, CMatView<T> Q, CMatView<T> K, CMatView<T> V,
                                bool causal, index_t q0, CMatView<T> Vt, const T* n, CMatView<T> dVt,
                                MatView<T> dQ, MatView<T> dK, MatView<T> dV);
// Fold keys K:[d, n], values V:[d_v, n] into a decoding state: S += V φ(K)ᵀ, z += φ(K) 1.
template <class T>
void rf_fold(const RandomFeatures<T>& f, CMatView<T> K, CMatView<T> V, FeatureState<T> s);
// The weights the estimator puts on each key, A[t_z, t_x] = Mask ⊙ φ(k)ᵀφ(q) / n (attention_weights):
// Q:[d, l_x], K:[d, l_z] -> A:[l_z, l_x].
template <class T>
void rf_attention_weights(const RandomFeatures<T>& f, CMatView<T> Q, CMatView<T> K, bool causal, index_t q0,
                          MatView<T> A);

}  // namespace ft
