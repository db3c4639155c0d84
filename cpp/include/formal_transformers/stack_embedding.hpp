// V22 (docs/variants.md; BART, Lewis et al. 2020): the embedding of one stack of an encoder-decoder, Algorithm 8's
// lines 2–3 (encoder) and 11–12 (decoder) with BART's three deviations, each an option of ModelConfig:
//
//   2′  e_t ← s · W_e[:, z[t]] + W_p^stack[:, t]        s = √d_e with scale_embedding, else 1;
//                                                      W_p^stack: dec.W_p for the decoder with separate_positions,
//                                                      else the shared W_p
//   3′  Z ← [e_1, …, e_ℓ];  for t: Z[:, t] ← layer_norm(Z[:, t] | γ_e^stack, β_e^stack)      (embed_norm)
//
// With every option off it is lines 2–3 as printed (Model::embed). BART stores its learned positions with an
// offset of two rows (HF's BartLearnedPositionalEmbedding reads row t + 2); the converter drops those two rows,
// which no position reads: the function is the same.
#pragma once

#include <memory>
#include <string>

#include "formal_transformers/config.hpp"
#include "formal_transformers/embedding.hpp"
#include "formal_transformers/norm.hpp"
#include "formal_transformers/parts.hpp"

namespace ft {

template <class T>
class StackEmbedding {
public:
    struct Cache {
        Matrix<T> E;        // lines 2′–3′ before the layer_norm (embed_norm)
        NormCache<T> norm;
    };
    // stack: "enc" or "dec" (the parameters' prefix: dec.W_p, enc.gamma_e, enc.beta_e, …)
    StackEmbedding(const ModelConfig& c, const std::string& stack, ParamStore<T>& store);
    void init(ParamStore<T>& store, Rng& rng, double stddev) const;  // dec.W_p ~ N(0, stddev²); γ_e ← 1, β_e ← 0

    // X:[d_e, n] ← lines 2′–3′ for the ids of the batch s (column j of a sequence at position j + offset)
    void forward(const ParamStore<T>& store, const TokenEmbedding<T>& tok, const PositionalEmbedding<T>& pos,
                 const index_t* ids, const Seqs& s, index_t offset, Matrix<T>& X, Cache& c) const;
    // from dX = ∂loss/∂X: the gradients of W_e, the table and γ_e, β_e (accumulated). dX is used as scratch.
    void backward(ParamStore<T>& store, const TokenEmbedding<T>& tok, const PositionalEmbedding<T>& pos,
                  const index_t* ids, const Seqs& s, MatView<T> dX, Cache& c) const;

private:
    T scale_ = T(1);
    std::unique_ptr<PositionalEmbedding<T>> own_;  // dec.W_p (separate_positions, decoder)
    std::unique_ptr<Norm<T>> norm_;               // γ_e, β_e (embed_norm)
    const PositionalEmbedding<T>& table(const PositionalEmbedding<T>& pos) const { return own_ ? *own_ : pos; }
};

}  // namespace ft
