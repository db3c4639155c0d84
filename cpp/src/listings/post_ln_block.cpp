// Algorithm 9 lines 5–8 = Algorithm 8 lines 5–8: the post-LN encoder layer of BERT and of the original
// transformer's encoder, the block "post_ln" (the listings write X and Z for its stream; here X), forward and
// backward side by side:
//    5  X ← X + MHAttention(X | W_l, Mask ≡ 1)
//    6  for t ∈ [ℓ]: X[:, t] ← layer_norm(X[:, t] | γ_l¹, β_l¹)
//    7  X ← X + W_mlp2^l φ(W_mlp1^l X + b_mlp1^l 1ᵀ) + b_mlp2^l 1ᵀ      (φ: GELU in Alg 9, ReLU in Alg 8)
//    8  for t ∈ [ℓ]: X[:, t] ← layer_norm(X[:, t] | γ_l², β_l²)
// In an EDTransformer (block='post_ln') its decoder's layer is listings/post_ln_cross_block.cpp.
#include "formal_transformers/transformers.hpp"

#include "../models/shared.hpp"

namespace ft {
using namespace models;
namespace {

template <class T>
class PostLNEncoderBlock final : public SelfBlock<T> {
public:
    struct Acts : BlockActs<T> {
        Matrix<T> X_attn;          // [d_e, n] line 5: X ← X + MHAttention(X | W_l, Mask ≡ 1)
        NormCache<T> norm_gamma1;  // line 6's layer_norm(· | γ_l¹, β_l¹)
        Matrix<T> X_1;             // [d_e, n] line 6: X ← layer_norm(X | γ_l¹, β_l¹), the MLP's input
        MLPCache<T> mlp;           // line 7
        Matrix<T> X_mlp;           // [d_e, n] line 7: X ← X + W_mlp2 φ(W_mlp1 X + b_mlp1 1ᵀ) + b_mlp2 1ᵀ
        NormCache<T> norm_gamma2;  // line 8's layer_norm(· | γ_l², β_l²)
    };
    PostLNEncoderBlock(const BlockSpec& b, ParamStore<T>& store, const std::string& p)
        : SelfBlock<T>(attn_l),
          attn_l(self_attention(b, store, p)),
          norm1(block_norm(b, store, p, "1")),
          mlp(block_mlp(b, store, p, "W_mlp1", "b_mlp1", "W_mlp2", "b_mlp2")),
          norm2(block_norm(b, store, p, "2")) {}
    std::unique_ptr<BlockActs<T>> make_acts() const override { return std::make_unique<Acts>(); }

    void init(ParamStore<T>& store, Rng& rng, double s, double s_out) const override {
        init_parts(store, rng, s, s_out, attn_l, norm1, mlp, norm2);
    }

    void forward(const ParamStore<T>& store, CMatView<T> X, const Seqs& s, MatView<T> X_out, BlockActs<T>& acts,
                 const Dropout* drop, DropPlace place, const Mask* mask) const override {
        Acts& a = static_cast<Acts&>(acts);
        const index_t d_e = X.rows, n = X.cols;
        MatView<T> Xa = copy_into(a.X_attn, X);
        add_dropped(drop, place.at(DropSite::SelfOut), Xa, a.R, a.drop_attn, [&](MatView<T> out) {
            attn_l.forward(store, X, s, X, s, out, a.attn, true, drop, place.at(DropSite::SelfWeights), mask);
        });  // line 5: X ← X + MHAttention(X | W_l, Mask ≡ 1)
        MatView<T> X1 = ensure(a.X_1, d_e, n);
        norm1.forward(store, Xa, X1, a.norm_gamma1);  // line 6: X ← layer_norm(X | γ_l¹, β_l¹)  (Alg 8 erratum: γ_t)
        MatView<T> Xm = copy_into(a.X_mlp, CMatView<T>(X1));
        add_dropped(drop, place.at(DropSite::MlpOut), Xm, a.R, a.drop_mlp, [&](MatView<T> out) {
            mlp.forward(store, X1, out, a.mlp);
        });  // line 7: X ← X + W_mlp2 φ(W_mlp1 X + b_mlp1 1ᵀ) + b_mlp2 1ᵀ
        norm2.forward(store, Xm, X_out, a.norm_gamma2);  // line 8: X ← layer_norm(X | γ_l², β_l²)
    }

    void backward(ParamStore<T>& store, CMatView<T> X, const Seqs& s, const BlockActs<T>& acts,
                  BackwardWork<T>& w) const override {
        const Acts& a = static_cast<const Acts&>(acts);
        // lines 8 and 7: X_out = layer_norm₂(X_mlp), X_mlp = X_1 + MLP(X_1)
        post_ln_backward(norm2, store, a.norm_gamma2, w.dX, w.dXt, [&](CMatView<T> dXm, MatView<T> dX1) {
            mlp.backward(store, view(a.X_1), a.mlp, dropped_grad(a.drop_mlp, dXm, w.dR), dX1, w.dH);
        });
        // lines 6 and 5: X_1 = layer_norm₁(X_attn), X_attn = X + MHAttention(X)
        post_ln_backward(norm1, store, a.norm_gamma1, w.dX, w.dXt, [&](CMatView<T> dXa, MatView<T> dX) {
            attn_l.backward(store, X, s, X, s, a.attn, dropped_grad(a.drop_attn, dXa, w.dR), dX, dX, w.attn);
        });
    }

    MHAttention<T> attn_l;  // W_l (W_l^enc), the stack's Mask (≡ 1; V17's layouts)
    Norm<T> norm1;          // γ_l¹, β_l¹
    MLP<T> mlp;             // W_mlp1^l, b_mlp1^l, W_mlp2^l, b_mlp2^l
    Norm<T> norm2;          // γ_l², β_l²
};

}  // namespace

FT_BLOCK_FACTORY(make_post_ln_block, PostLNEncoderBlock, SelfBlock)
FT_BLOCK_ROW(post_ln_block_row, "post_ln", archs::E | archs::ED)

}  // namespace ft
