// Algorithm 8 lines 14–19: the post-LN decoder layer with cross-attention of the original transformer, the
// EDTransformer's decoder layer of the block "post_ln", forward, backward and cached decoding side by side:
//   14  X ← X + MHAttention(X | W_l^dec, Mask[t, t'] = [[t ≤ t']])
//   15  for t ∈ [ℓ_x]: X[:, t] ← layer_norm(X[:, t] | γ_l³, β_l³)
//   16  X ← X + MHAttention(X, Z | W_l^e/d, Mask ≡ 1)
//   17  for t ∈ [ℓ_x]: X[:, t] ← layer_norm(X[:, t] | γ_l⁴, β_l⁴)
//   18  X ← X + W_mlp4^l ReLU(W_mlp3^l X + b_mlp3^l 1ᵀ) + b_mlp4^l 1ᵀ
//   19  for t ∈ [ℓ_x]: X[:, t] ← layer_norm(X[:, t] | γ_l⁵, β_l⁵)
#include "formal_transformers/transformers.hpp"

#include "../models/shared.hpp"

namespace ft {
using namespace models;
namespace {

template <class T>
class PostLNDecoderBlock final : public CrossBlock<T> {
public:
    struct Acts : CrossBlockActs<T> {
        Matrix<T> X_self;          // [d_e, n_x] line 14: X ← X + MHAttention(X | W_l^dec, Mask[t, t'] = [[t ≤ t']])
        NormCache<T> norm_gamma3;  // line 15's layer_norm(· | γ_l³, β_l³)
        Matrix<T> X_3;             // [d_e, n_x] line 15: X ← layer_norm(X | γ_l³, β_l³)
        Matrix<T> X_cross;         // [d_e, n_x] line 16: X ← X + MHAttention(X, Z | W_l^e/d, Mask ≡ 1)
        NormCache<T> norm_gamma4;  // line 17's layer_norm(· | γ_l⁴, β_l⁴)
        Matrix<T> X_4;             // [d_e, n_x] line 17: X ← layer_norm(X | γ_l⁴, β_l⁴), the MLP's input
        MLPCache<T> mlp;           // line 18
        Matrix<T> X_mlp;           // [d_e, n_x] line 18: X ← X + W_mlp4 ReLU(W_mlp3 X + b_mlp3 1ᵀ) + b_mlp4 1ᵀ
        NormCache<T> norm_gamma5;  // line 19's layer_norm(· | γ_l⁵, β_l⁵)
    };
    PostLNDecoderBlock(const BlockSpec& b, ParamStore<T>& store, const std::string& p)
        : CrossBlock<T>(self_l, cross_l),
          self_l(self_attention(b, store, p)),
          norm3(block_norm(b, store, p, "3")),
          cross_l(cross_attention(b, store, p)),
          norm4(block_norm(b, store, p, "4")),
          mlp(block_mlp(b, store, p, "W_mlp3", "b_mlp3", "W_mlp4", "b_mlp4")),
          norm5(block_norm(b, store, p, "5")) {}
    std::unique_ptr<CrossBlockActs<T>> make_acts() const override { return std::make_unique<Acts>(); }

    void init(ParamStore<T>& store, Rng& rng, double s, double s_out) const override {
        init_parts(store, rng, s, s_out, self_l, norm3, cross_l, norm4, mlp, norm5);
    }

    void forward(const ParamStore<T>& store, CMatView<T> X, const Seqs& sx, CMatView<T> Z, const Seqs& sz,
                 MatView<T> X_out, CrossBlockActs<T>& acts, const Dropout* drop, DropPlace place) const override {
        Acts& a = static_cast<Acts&>(acts);
        const index_t d_e = X.rows, n = X.cols;
        MatView<T> Xs = copy_into(a.X_self, X);
        add_dropped(drop, place.at(DropSite::SelfOut), Xs, a.R, a.drop_self, [&](MatView<T> out) {
            self_l.forward(store, X, sx, X, sx, out, a.self_attn, true, drop, place.at(DropSite::SelfWeights));
        });  // line 14: X ← X + MHAttention(X | W_l^dec, Mask[t, t'] = [[t ≤ t']])
        MatView<T> X3 = ensure(a.X_3, d_e, n);
        norm3.forward(store, Xs, X3, a.norm_gamma3);  // line 15: X ← layer_norm(X | γ_l³, β_l³)
        MatView<T> Xc = copy_into(a.X_cross, CMatView<T>(X3));
        add_dropped(drop, place.at(DropSite::CrossOut), Xc, a.R, a.drop_cross, [&](MatView<T> out) {
            cross_l.forward(store, X3, sx, Z, sz, out, a.cross_attn, true, drop, place.at(DropSite::CrossWeights));
        });  // line 16: X ← X + MHAttention(X, Z | W_l^e/d, Mask ≡ 1)
        MatView<T> X4 = ensure(a.X_4, d_e, n);
        norm4.forward(store, Xc, X4, a.norm_gamma4);  // line 17: X ← layer_norm(X | γ_l⁴, β_l⁴)
        MatView<T> Xm = copy_into(a.X_mlp, CMatView<T>(X4));
        add_dropped(drop, place.at(DropSite::MlpOut), Xm, a.R, a.drop_mlp, [&](MatView<T> out) {
            mlp.forward(store, X4, out, a.mlp);
        });  // line 18: X ← X + W_mlp4 ReLU(W_mlp3 X + b_mlp3 1ᵀ) + b_mlp4 1ᵀ
        norm5.forward(store, Xm, X_out, a.norm_gamma5);  // line 19: X ← layer_norm(X | γ_l⁵, β_l⁵)
    }

    void backward(ParamStore<T>& store, CMatView<T> X, const Seqs& sx, CMatView<T> Z, const Seqs& sz,
                  const CrossBlockActs<T>& acts, MatView<T> dZ, BackwardWork<T>& w) const override {
        const Acts& a = static_cast<const Acts&>(acts);
        // lines 19, 18: X_out = layer_norm₅(X_mlp), X_mlp = X_4 + MLP(X_4)
        post_ln_backward(norm5, store, a.norm_gamma5, w.dX, w.dXt, [&](CMatView<T> dXm, MatView<T> dX4) {
            mlp.backward(store, view(a.X_4), a.mlp, dropped_grad(a.drop_mlp, dXm, w.dR), dX4, w.dH);
        });
        // lines 17, 16: X_4 = layer_norm₄(X_cross), X_cross = X_3 + MHAttention(X_3, Z): the context gets ∂/∂Z too
        post_ln_backward(norm4, store, a.norm_gamma4, w.dX, w.dXt, [&](CMatView<T> dXc, MatView<T> dX3) {
            cross_l.backward(store, view(a.X_3), sx, Z, sz, a.cross_attn, dropped_grad(a.drop_cross, dXc, w.dR), dX3, dZ,
                             w.attn);
        });
        // lines 15, 14: X_3 = layer_norm₃(X_self), X_self = X + MHAttention(X)
        post_ln_backward(norm3, store, a.norm_gamma3, w.dX, w.dXt, [&](CMatView<T> dXs, MatView<T> dX) {
            self_l.backward(store, X, sx, X, sx, a.self_attn, dropped_grad(a.drop_self, dXs, w.dR), dX, dX, w.attn);
        });
    }

    // lines 14–19 for the columns of d.X (in place) at positions q0, …, over the cached keys and values
    void forward_cached(const ParamStore<T>& store, index_t q0, KVCache<T>& self_kv, const KVCache<T>& cross_kv,
                        DecodeScratch<T>& d) const override {
        MatView<T> X = view(d.X), R = ensure(d.tmp, X.rows, X.cols);
        std::copy(X.data, X.data + X.size(), R.data);
        self_l.append_kv(store, X, self_kv);
        self_l.attend_cached(store, X, q0, self_kv, R, d.attn, true);  // line 14
        norm3.forward(store, R, X, d.norm);                            // line 15
        std::copy(X.data, X.data + X.size(), R.data);
        cross_l.attend_cached(store, X, q0, cross_kv, R, d.attn, true);  // line 16
        norm4.forward(store, R, X, d.norm);                              // line 17
        std::copy(X.data, X.data + X.size(), R.data);
        mlp.forward(store, X, R, d.mlp);                                 // line 18
        norm5.forward(store, R, X, d.norm);                              // line 19
    }

    MHAttention<T> self_l;   // W_l^dec, causal
    Norm<T> norm3;           // γ_l³, β_l³
    MHAttention<T> cross_l;  // W_l^e/d, bidirectional
    Norm<T> norm4;           // γ_l⁴, β_l⁴
    MLP<T> mlp;              // W_mlp3^l, b_mlp3^l, W_mlp4^l, b_mlp4^l
    Norm<T> norm5;           // γ_l⁵, β_l⁵
};

}  // namespace

FT_BLOCK_FACTORY(make_post_ln_cross_block, PostLNDecoderBlock, CrossBlock)

}  // namespace ft
