// Algorithm 6: ê ← layer_norm(e | γ, β), and Gopher's RMSnorm variant (paper §6, "Gopher").
//
//   Input: e ∈ R^{d_e}, neural network activations.   Output: ê ∈ R^{d_e}, normalized activations.
//   Parameters: γ, β ∈ R^{d_e}, element-wise scale and offset.
//   1  m ← Σ_{i=1}^{d_e} e[i] / d_e
//   2  v ← Σ_{i=1}^{d_e} (e[i] − m)² / d_e
//   3  return ê = (e − m) / √v ⊙ γ + β
//
// Applied to every column of a [d_e, n] matrix (the architectures' "for t ∈ [ℓ]: X[:,t] ← layer_norm(...)").
// `eps` is added inside the square root, √(v + eps); eps = 0 is the listing exactly (docs/api.md).
// RMSnorm: ê = e / √(Σ e[i]²/d_e + eps) ⊙ γ   (no centring, no β).
#pragma once

#include <string>

#include "formal_transformers/params.hpp"

namespace ft {

// Activations a norm saves for its backward pass.
template <class T>
struct NormCache {
    Matrix<T> e_hat;  // [d_e, n]  (e − m)/√(v+eps) (layer_norm) or e/√(ms+eps) (RMSnorm), before γ, β
    Vector<T> rstd;   // [n]       1/√(v+eps) per column
};

template <class T>
class LayerNorm {
public:
    // Declares γ (ones) and β (zeros) in `store` under the given names.
    LayerNorm(index_t d_e, double eps, ParamStore<T>& store, const std::string& gamma_name = "gamma",
              const std::string& beta_name = "beta");
    void init(ParamStore<T>& store) const;  // γ ← 1, β ← 0

    // E:[d_e,n] -> Ê:[d_e,n] (lines 1–3 per column). Ê may alias E.
    void forward(const ParamStore<T>& store, CMatView<T> E, MatView<T> E_hat, NormCache<T>& c) const;
    // dÊ:[d_e,n] -> dE (dE += ...; may not alias dÊ), dγ += Σ_t dÊ ⊙ x̂, dβ += Σ_t dÊ.
    // de = (1/√(v+eps)) (dx̂ − mean(dx̂) − x̂ mean(dx̂ ⊙ x̂)) with dx̂ = dÊ ⊙ γ  (derivative of lines 1–3).
    void backward(ParamStore<T>& store, CMatView<T> dE_hat, const NormCache<T>& c, MatView<T> dE) const;

    index_t d_e;
    double eps;
    VecParam gamma, beta;
};

template <class T>
class RMSNorm {
public:
    RMSNorm(index_t d_e, double eps, ParamStore<T>& store, const std::string& gamma_name = "gamma");
    void init(ParamStore<T>& store) const;  // γ ← 1

    // E:[d_e,n] -> Ê:[d_e,n]: ê = e / √(Σ e²/d_e + eps) ⊙ γ. Ê may alias E.
    void forward(const ParamStore<T>& store, CMatView<T> E, MatView<T> E_hat, NormCache<T>& c) const;
    // de = (1/rms) (dx̂ − x̂ mean(dx̂ ⊙ x̂)) with dx̂ = dÊ ⊙ γ; dγ += Σ_t dÊ ⊙ x̂.
    void backward(ParamStore<T>& store, CMatView<T> dE_hat, const NormCache<T>& c, MatView<T> dE) const;

    index_t d_e;
    double eps;
    VecParam gamma;
};

}  // namespace ft
