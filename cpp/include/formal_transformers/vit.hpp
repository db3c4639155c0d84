// Listing V14 (docs/variants.md): the vision transformer (Dosovitskiy et al. 2021), forward and backward.
//
//   Input: x ∈ R^{C×H_img×W_img}, an image.   Output: P ∈ Δ([n_classes]).
//   1  for n ∈ [N]: p_n ← x[:, rows and columns of patch n] flattened     (patches row by row; (c, r, s) order)
//   2  X_p ← [p_1, p_2, …, p_N]
//   3  E ← W_patch X_p + b_patch 1ᵀ
//   4  X ← [x_class, E] + W_p
//   5  for l = 1, 2, …, L do
//   6    for t ∈ [N+1]: X̃[:, t] ← layer_norm(X[:, t] | γ_l¹, β_l¹)
//   7    X ← X + MHAttention(X̃ | W_l, Mask ≡ 1)
//   8    for t ∈ [N+1]: X̃[:, t] ← layer_norm(X[:, t] | γ_l², β_l²)
//   9    X ← X + W_mlp2^l GELU(W_mlp1^l X̃ + b_mlp1^l 1ᵀ) + b_mlp2^l 1ᵀ
//  10  end
//  11  x ← layer_norm(X[:, 1] | γ, β)
//  12  z ← W_c x + b_c
//  13  return P = softmax(z)
//
// Lines 5–10 are the pre-LN layer of Algorithm 10 (PreLNDecoderBlock, transformers.hpp: reused, not copied)
// with its attention's Mask set to Mask ≡ 1 (Algorithm 9's). A batch of B images is B sequences of N+1
// columns side by side. Loss: −Σ_b log P_b[y_b] (Algorithm 12's form, one scored column per image).
#pragma once

#include <memory>
#include <vector>

#include "formal_transformers/transformers.hpp"

namespace ft {

struct ViTConfig {
    index_t n_channels = 3, image_h = 0, image_w = 0, patch = 0, n_classes = 0;
    index_t L = 0, H = 0, d_e = 0, d_mlp = 0;
    double eps = 1e-12;       // HF ViTConfig.layer_norm_eps
    std::uint64_t seed = 0;
    double init_std = 0.02;
    index_t n_patches() const { return (image_h / patch) * (image_w / patch); }
    index_t patch_dim() const { return n_channels * patch * patch; }
};
// ValueError naming the option unless every size is positive, P divides H_img and W_img, H divides d_e,
// eps >= 0 and init_std > 0; ValueError naming the sizes when the patch count N or C·P² overflows, or the whole
// model (a lower bound on θ and its gradient, as check_model_size) exceeds sizes.hpp's bound: before any layer.
// n_patches() and patch_dim() are safe after it.
void check(const ViTConfig& c);

template <class T>
class ViT {
public:
    explicit ViT(const ViTConfig& c);
    ViT(const ViT&) = delete;
    ViT& operator=(const ViT&) = delete;

    const ViTConfig vc;
    const ModelConfig cfg;  // the encoder layers' options (pre-LN, layer_norm, GELU, biases)
    ParamStore<T> store;
    Precision precision = Precision::Float32;  // as Model's (transformers.hpp)
    void set_precision(Precision p) {
        if (p == Precision::BF16Mixed && !std::is_same_v<T, float>)
            throw ValueError("precision 'bf16-mixed' is for float32 models: this one is float64 (its products stay float64)");
        precision = p;
    }
    MatParam W_patch;      // line 3 [d_e, C·P²]
    VecParam b_patch;
    VecParam x_class;      // line 4
    MatParam W_p;          // line 4 [d_e, N+1]
    std::vector<std::unique_ptr<PreLNDecoderBlock<T>>> layer;  // lines 6–9 of layer l
    std::unique_ptr<Norm<T>> norm_f;                           // line 11: γ, β
    MatParam W_c;          // line 12 [n_classes, d_e]
    VecParam b_c;

    // images: B images of C·H_img·W_img values each, (C, H_img, W_img) row-major (numpy's layout), checked
    // by the caller. Lines 1–12: the logits z of every image -> logits() [n_classes, B]
    void forward(const T* images, index_t B);
    CMatView<T> logits() const { return view(Z_); }
    // −Σ_b log softmax(z_b)[labels[b]] (labels checked by the caller); grad: its gradient in store.grad()
    // (zeroed first); n_correct: how many argmax z_b = labels[b]
    double loss(const T* images, index_t B, const index_t* labels, bool grad, index_t* n_correct = nullptr);

private:
    void backward(MatView<T> dZ);
    index_t B_ = 0;
    Seqs s_;
    Matrix<T> Xp_, E_;                 // lines 2, 3
    std::vector<Matrix<T>> stream_;    // [L+1]: X entering layer l (l = L: leaving the last)
    std::vector<typename PreLNDecoderBlock<T>::Acts> acts_;
    Matrix<T> Xc_, Xn_, Z_;            // line 11's input (the class columns) and output; line 12
    NormCache<T> norm_gamma_;
    BackwardWork<T> work_;
    Matrix<T> dZ_, dXn_, dXc_, dE_;
};

}  // namespace ft
