// affine_backward with dX written, not added to: a backward line "dX = Wᵀ dY" into a buffer that holds nothing
// yet (the MLP's dA = W_mlp2ᵀ dOut) needs no zero fill first, and its product does not read the buffer.
#pragma once

#include "formal_transformers/common.hpp"

namespace ft {

template <class T>
class ParamStore;
struct MatParam;

// Given dY for Y = W X + b 1^T:
//   dW += dY X^T,   db += dY 1 (row sums),   dX = W^T dY   (any of dW, db, dX may be null)
template <class T>
void affine_backward_set(CMatView<T> W, CMatView<T> X, CMatView<T> dY, T* dW, T* db, T* dX, index_t ld_dX = -1);

// The same on a matrix W of θ (lora.hpp's affine_backward: an adapted W's terms are added after dX = Wᵀ dY)
template <class T>
void affine_backward_set(ParamStore<T>& store, const MatParam& W, CMatView<T> X, CMatView<T> dY, T* dW, T* db,
                         T* dX, index_t ld_dX = -1);

}  // namespace ft
