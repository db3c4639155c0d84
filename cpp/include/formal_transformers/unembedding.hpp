// Algorithm 7: Unembedding.
//   Input: e ∈ R^{d_e}, a token encoding.   Output: p ∈ Δ(V), a probability distribution over the vocabulary.
//   Parameters: W_u ∈ R^{N_V×d_e}, the unembedding matrix.
//   1  return p = softmax(W_u e)
//
// Applied to every column of X:[d_e, n] (the architectures' "return P = softmax(W_u X)"). With a tied
// unembedding (an option of the models) W_u = W_eᵀ: no parameter of its own, the product uses W_e
// transposed and the gradient lands in dW_e.
//
// The training losses (Algorithms 11–13) need −log P[y, t] only, so `nll` works on the logits W_u X
// with a log-softmax (logsumexp; never the log of a probability, docs/design.md "Numerics") and returns the
// gradient with respect to the logits in the same pass: dZ[:, t] = softmax(Z[:, t]) − e_y.
#pragma once

#include <string>

#include "formal_transformers/params.hpp"

namespace ft {

template <class T>
class Unembedding {
public:
    // Own parameter W_u [N_V, d_e] named `name`.
    Unembedding(index_t n_vocab, index_t d_e, ParamStore<T>& store, const std::string& name = "W_u");
    // Tied: W_u = W_eᵀ where W_e [d_e, N_V] is an existing parameter.
    Unembedding(index_t n_vocab, index_t d_e, const MatParam& W_e_tied);
    void init(ParamStore<T>& store, Rng& rng, double stddev) const;  // untied: W_u ~ N(0, stddev²)

    // X:[d_e,n] -> Z:[N_V,n] = W_u X   (the logits)
    void logits(const ParamStore<T>& store, CMatView<T> X, MatView<T> Z) const;
    // X:[d_e,n] -> P:[N_V,n] = softmax(W_u X)   (line 1)
    void forward(const ParamStore<T>& store, CMatView<T> X, MatView<T> P) const;
    // Given dZ = ∂loss/∂(W_u X): dW_u += dZ Xᵀ (or dW_e += X dZᵀ when tied), dX += W_uᵀ dZ (dX may be null)
    void backward_logits(ParamStore<T>& store, CMatView<T> X, CMatView<T> dZ, MatView<T> dX) const;
    // Given dP = ∂loss/∂P for P = softmax(W_u X): dP is overwritten by dZ (softmax derivative), then as above.
    void backward(ParamStore<T>& store, CMatView<T> X, CMatView<T> P, MatView<T> dP, MatView<T> dX) const;

    index_t n_vocab, d_e;
    bool tied;
    MatParam W;  // W_u [N_V, d_e], or W_e [d_e, N_V] when tied

    // Beyond Algorithm 7 (BERT's output layer): a bias b_u [N_V], Z = W_u X + b_u 1ᵀ; logits, forward and
    // backward_logits then include it (db_u += dZ 1). Registered once, before the store is allocated.
    void add_bias(ParamStore<T>& store, const std::string& name = "b_u");
    bool has_bias = false;
    VecParam b;

    // Gemma 2's final soft-capping (final_logit_softcapping c > 0): logits (and forward) return c·tanh(Z / c) for Z =
    // W_u X; softcap_backward takes ∂loss/∂ the capped logits Zc to ∂loss/∂Z in place: dZ ⊙ (1 − (Zc / c)²). 0: none.
    double softcap = 0;
    void softcap_backward(CMatView<T> Zc, MatView<T> dZ) const;
};

// Negative log-likelihood of targets under softmax of the logits, in one pass per column:
//   loss = −Σ_t log softmax(Z[:, t])[y_t]   over the columns t of Z:[N_V,n] (y_t = targets[t])
// and Z is overwritten by ∂loss/∂Z = softmax(Z) − one_hot(y) (times `scale`). Accumulated in double.
// n_correct (optional): how many columns have their target as the argmax (accuracy for evaluations).
template <class T>
double nll_and_grad(MatView<T> Z, const index_t* targets, T scale = T(1), index_t* n_correct = nullptr);

}  // namespace ft
