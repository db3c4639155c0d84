// V27 (Gemma 2, 3; docs/variants.md): the sandwich layer, the block "sandwich" of a DTransformer — Algorithm 10's
// lines 5–8 with each sublayer's output normalised again before its residual add, forward, backward and cached
// decoding side by side:
//    5  for t ∈ [ℓ]: X̃[:, t] ← norm(X[:, t] | γ_l¹)
//    6  X ← X + norm(MHAttention(X̃ | W_l, Mask) | γ_l¹′)
//    7  for t ∈ [ℓ]: X̃[:, t] ← norm(X[:, t] | γ_l²)
//    8  X ← X + norm(MLP(X̃) | γ_l²′)
// Backward: line 8's ∂loss/∂X_out goes to X_attn whole (the residual) and through the second norm's backward to the
// MLP's output (Y₂ = MLP(X̃): dY₂ = norm′(dX_out | γ²′), dγ²′ +=), then as Algorithm 10's; the same for line 6.
// Its parameters are the pre-LN layer's (γ¹, β¹, W_l, γ², β², the MLP's; same names, same order) followed by the
// second norms' γ_l¹′ = gamma1_post, γ_l²′ = gamma2_post (and β′ with layer_norm). sandwich_norm=True (keywords and
// saved files of earlier versions) reads as this block.
#include "formal_transformers/transformers.hpp"

#include "../models/shared.hpp"

namespace ft {
using namespace models;
namespace {

// out += norm(Y | γ′), Y = the sublayer's output (normalised in place; its norm's cache in nc)
template <class T>
void add_normed(const ParamStore<T>& store, const Norm<T>& post, MatView<T> Y, NormCache<T>& nc, MatView<T> out) {
    post.forward(store, Y, Y, nc);
    for (index_t i = 0; i < out.size(); ++i) out.data[i] += Y.data[i];
}
// ∂loss/∂Y from ∂loss/∂norm(Y | γ′) = dOut (and dγ′, dβ′ +=), into dY
template <class T>
CMatView<T> normed_grad(ParamStore<T>& store, const Norm<T>& post, const NormCache<T>& nc, CMatView<T> dOut, Matrix<T>& dY) {
    MatView<T> d = zeros(dY, dOut.rows, dOut.cols);
    post.backward(store, dOut, nc, d);
    return d;
}

template <class T>
class SandwichBlock final : public SelfBlock<T> {
public:
    struct Acts : BlockActs<T> {
        NormCache<T> norm_gamma1, norm_gamma2;  // lines 5, 7
        Matrix<T> Xt_attn, Xt_mlp;              // [d_e, n] lines 5, 7: X̃, the sublayers' inputs
        Matrix<T> X_attn;                       // [d_e, n] the stream after line 6
        MLPCache<T> mlp;                        // line 8
        Matrix<T> Y_attn, Y_mlp;                // [d_e, n] lines 6, 8: norm(sublayer's output | γ′)
        NormCache<T> norm_post1, norm_post2;    // lines 6, 8: the second norms
    };
    SandwichBlock(const BlockSpec& b, ParamStore<T>& store, const std::string& p)
        : SelfBlock<T>(attn_l),
          norm1(block_norm(b, store, p, "1")),
          attn_l(self_attention(b, store, p)),
          norm2(block_norm(b, store, p, "2")),
          mlp(block_mlp(b, store, p, "W_mlp1", "b_mlp1", "W_mlp2", "b_mlp2")),
          post1(block_norm(b, store, p, "1_post")),
          post2(block_norm(b, store, p, "2_post")) {}
    std::unique_ptr<BlockActs<T>> make_acts() const override { return std::make_unique<Acts>(); }

    void init(ParamStore<T>& store, Rng& rng, double s, double s_out) const override {
        init_parts(store, rng, s, s_out, norm1, attn_l, norm2, mlp, post1, post2);
    }

    void forward(const ParamStore<T>& store, CMatView<T> X, const Seqs& s, MatView<T> X_out, BlockActs<T>& acts,
                 const Dropout* drop, DropPlace place, const Mask* mask) const override {
        Acts& a = static_cast<Acts&>(acts);
        const index_t d_e = X.rows, n = X.cols;
        MatView<T> Xt1 = ensure(a.Xt_attn, d_e, n);
        norm1.forward(store, X, Xt1, a.norm_gamma1);  // line 5: X̃ ← norm(X | γ¹)
        MatView<T> Xa = copy_into(a.X_attn, X);
        add_dropped(drop, place.at(DropSite::SelfOut), Xa, a.R, a.drop_attn, [&](MatView<T> out) {
            MatView<T> Y = ensure(a.Y_attn, d_e, n);
            attn_l.forward(store, Xt1, s, Xt1, s, Y, a.attn, /*accumulate=*/false, drop, place.at(DropSite::SelfWeights), mask);
            add_normed(store, post1, Y, a.norm_post1, out);
        });  // line 6: X ← X + norm(MHAttention(X̃ | W_l, Mask) | γ¹′)
        MatView<T> Xt2 = ensure(a.Xt_mlp, d_e, n);
        norm2.forward(store, Xa, Xt2, a.norm_gamma2);  // line 7: X̃ ← norm(X | γ²)
        std::copy(Xa.data, Xa.data + Xa.size(), X_out.data);
        add_dropped(drop, place.at(DropSite::MlpOut), X_out, a.R, a.drop_mlp, [&](MatView<T> out) {
            MatView<T> Y = zeros(a.Y_mlp, d_e, n);
            mlp.forward(store, Xt2, Y, a.mlp);
            add_normed(store, post2, Y, a.norm_post2, out);
        });  // line 8: X ← X + norm(MLP(X̃) | γ²′)
    }

    void backward(ParamStore<T>& store, CMatView<T>, const Seqs& s, const BlockActs<T>& acts,
                  BackwardWork<T>& w) const override {
        const Acts& a = static_cast<const Acts&>(acts);
        MatView<T> dX = view(w.dX);
        // line 8: X_out = X_attn + norm(MLP(X̃_mlp) | γ²′)  ->  ∂/∂X̃_mlp into dXt; ∂/∂X_attn = dX (+ line 7's part)
        MatView<T> dXt = zeros(w.dXt, dX.rows, dX.cols);
        mlp.backward(store, view(a.Xt_mlp), a.mlp,
                     normed_grad(store, post2, a.norm_post2, dropped_grad(a.drop_mlp, CMatView<T>(dX), w.dR), w.dY), dXt, w.dH);
        norm2.backward(store, dXt, a.norm_gamma2, dX);  // line 7
        // line 6: X_attn = X + norm(MHAttention(X̃_attn) | γ¹′)  ->  ∂/∂X̃_attn (queries, keys and values) into dXt
        zero(dXt);
        attn_l.backward(store, view(a.Xt_attn), s, view(a.Xt_attn), s, a.attn,
                        normed_grad(store, post1, a.norm_post1, dropped_grad(a.drop_attn, CMatView<T>(dX), w.dR), w.dY),
                        dXt, dXt, w.attn);
        norm1.backward(store, dXt, a.norm_gamma1, dX);  // line 5
    }

    // lines 5–8 for the new columns of X, line 6's attention over the caller's cache (attend)
    void forward_cached(const ParamStore<T>& store, MatView<T> X, const typename SelfBlock<T>::Attend& attend,
                        DecodeScratch<T>& d) const override {
        MatView<T> Xt = ensure(d.Xt, X.rows, X.cols);
        norm1.forward(store, X, Xt, d.norm);  // line 5
        MatView<T> Y = zeros(d.tmp, X.rows, X.cols);
        attend(attn_l, Xt, Y);
        add_normed(store, post1, Y, d.norm, X);  // line 6
        norm2.forward(store, X, Xt, d.norm);     // line 7
        Y = zeros(d.tmp, X.rows, X.cols);
        mlp.forward(store, Xt, Y, d.mlp);
        add_normed(store, post2, Y, d.norm, X);  // line 8
    }

    Norm<T> norm1;          // γ_l¹ (β_l¹)
    MHAttention<T> attn_l;  // W_l, line 6's Mask (the block's attn)
    Norm<T> norm2;          // γ_l² (β_l²)
    MLP<T> mlp;             // W_mlp1^l, W_mlp2^l (W_gate with GeGLU; biases if any)
    Norm<T> post1, post2;   // γ_l¹′, γ_l²′ (β′ with layer_norm): the sublayers' second norms
};

}  // namespace

FT_BLOCK_FACTORY(make_sandwich_block, SandwichBlock, SelfBlock)
FT_BLOCK_ROW(sandwich_block_row, "sandwich", archs::D)

}  // namespace ft
