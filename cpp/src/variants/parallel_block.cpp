// GPT-NeoX's parallel residual (Black et al. 2022; Hugging Face's use_parallel_residual=True), the block "parallel"
// of a DTransformer (docs/variants.md V30): in place of Algorithm 10's lines 5–8, both sublayers read the layer's
// input X, each through its own norm, and both outputs are added to it at once:
//    1  for t ∈ [ℓ]: X̃₁[:, t] ← layer_norm(X[:, t] | γ_l¹, β_l¹)
//    2  for t ∈ [ℓ]: X̃₂[:, t] ← layer_norm(X[:, t] | γ_l², β_l²)
//    3  X ← X + MHAttention(X̃₁ | W_l, Mask[t, t'] = [[t ≤ t']]) + W_mlp2^l GELU(W_mlp1^l X̃₂ + b_mlp1^l 1ᵀ) + b_mlp2^l 1ᵀ
// Backward: line 3's ∂/∂X_out reaches X three ways — the residual, the attention (through line 1's norm) and the
// MLP (through line 2's norm): dX = dX_out + norm₁'(MHAttention'(dX_out)) + norm₂'(MLP'(dX_out)).
// Its parameters are named and ordered as the pre-LN layer's (γ¹, β¹, W_l, γ², β², W_mlp1, …).
#include "formal_transformers/transformers.hpp"

#include "../models/shared.hpp"

namespace ft {
using namespace models;
namespace {

template <class T>
class ParallelBlock final : public SelfBlock<T> {
public:
    struct Acts : BlockActs<T> {
        NormCache<T> norm_gamma1, norm_gamma2;  // lines 1, 2
        Matrix<T> Xt_attn;                      // [d_e, n] line 1: X̃₁, the attention's input
        Matrix<T> Xt_mlp;                       // [d_e, n] line 2: X̃₂, the MLP's input
        MLPCache<T> mlp;                        // line 3's MLP
        mutable Matrix<T> dXt_mlp;              // backward's scratch: ∂loss/∂X̃₂
    };
    ParallelBlock(const BlockSpec& b, ParamStore<T>& store, const std::string& p)
        : SelfBlock<T>(attn_l),
          norm1(block_norm(b, store, p, "1")),
          attn_l(self_attention(b, store, p)),
          norm2(block_norm(b, store, p, "2")),
          mlp(block_mlp(b, store, p, "W_mlp1", "b_mlp1", "W_mlp2", "b_mlp2")) {}
    std::unique_ptr<BlockActs<T>> make_acts() const override { return std::make_unique<Acts>(); }

    void init(ParamStore<T>& store, Rng& rng, double s, double s_out) const override {
        init_parts(store, rng, s, s_out, norm1, attn_l, norm2, mlp);
    }

    void forward(const ParamStore<T>& store, CMatView<T> X, const Seqs& s, MatView<T> X_out, BlockActs<T>& acts,
                 const Dropout* drop, DropPlace place, const Mask* mask) const override {
        Acts& a = static_cast<Acts&>(acts);
        const index_t d_e = X.rows, n = X.cols;
        MatView<T> Xt1 = ensure(a.Xt_attn, d_e, n), Xt2 = ensure(a.Xt_mlp, d_e, n);
        norm1.forward(store, X, Xt1, a.norm_gamma1);  // line 1: X̃₁ ← layer_norm(X | γ¹, β¹)
        norm2.forward(store, X, Xt2, a.norm_gamma2);  // line 2: X̃₂ ← layer_norm(X | γ², β²)
        std::copy(X.data, X.data + X.size(), X_out.data);
        add_dropped(drop, place.at(DropSite::SelfOut), X_out, a.R, a.drop_attn, [&](MatView<T> out) {
            attn_l.forward(store, Xt1, s, Xt1, s, out, a.attn, /*accumulate=*/true, drop, place.at(DropSite::SelfWeights), mask);
        });
        add_dropped(drop, place.at(DropSite::MlpOut), X_out, a.R, a.drop_mlp, [&](MatView<T> out) {
            mlp.forward(store, Xt2, out, a.mlp);
        });  // line 3: X ← X + MHAttention(X̃₁ | W_l, Mask) + MLP(X̃₂)
    }

    void backward(ParamStore<T>& store, CMatView<T>, const Seqs& s, const BlockActs<T>& acts,
                  BackwardWork<T>& w) const override {
        const Acts& a = static_cast<const Acts&>(acts);
        MatView<T> dX = view(w.dX);  // ∂loss/∂X_out: each term of line 3 gets it whole
        // line 3, the MLP's term -> ∂/∂X̃₂
        MatView<T> dXt2 = zeros(a.dXt_mlp, dX.rows, dX.cols);
        mlp.backward(store, view(a.Xt_mlp), a.mlp, dropped_grad(a.drop_mlp, CMatView<T>(dX), w.dR), dXt2, w.dH);
        // line 3, the attention's term -> ∂/∂X̃₁ (queries, keys and values alike)
        MatView<T> dXt1 = zeros(w.dXt, dX.rows, dX.cols);
        attn_l.backward(store, view(a.Xt_attn), s, view(a.Xt_attn), s, a.attn,
                        dropped_grad(a.drop_attn, CMatView<T>(dX), w.dR), dXt1, dXt1, w.attn);
        // lines 2 and 1: dX (the residual) += norm₂'(∂/∂X̃₂) + norm₁'(∂/∂X̃₁)
        norm2.backward(store, dXt2, a.norm_gamma2, dX);
        norm1.backward(store, dXt1, a.norm_gamma1, dX);
    }

    // lines 1–3 for the new columns of X, the attention over the caller's cache (attend)
    void forward_cached(const ParamStore<T>& store, MatView<T> X, const typename SelfBlock<T>::Attend& attend,
                        DecodeScratch<T>& d) const override {
        MatView<T> Xt1 = ensure(d.Xt, X.rows, X.cols), Xt2 = ensure(d.tmp, X.rows, X.cols);
        norm1.forward(store, X, Xt1, d.norm);  // line 1
        norm2.forward(store, X, Xt2, d.norm);  // line 2
        attend(attn_l, Xt1, X);                // line 3: X ← X + MHAttention(X̃₁)
        mlp.forward(store, Xt2, X, d.mlp);     //              + MLP(X̃₂)
    }

    Norm<T> norm1;          // γ_l¹, β_l¹
    MHAttention<T> attn_l;  // W_l, line 3's Mask (the block's attn)
    Norm<T> norm2;          // γ_l², β_l²
    MLP<T> mlp;             // W_mlp1^l, b_mlp1^l, W_mlp2^l, b_mlp2^l
};

}  // namespace

FT_BLOCK_FACTORY(make_parallel_block, ParallelBlock, SelfBlock)
FT_BLOCK_ROW(parallel_block_row, "parallel", archs::D)

}  // namespace ft
