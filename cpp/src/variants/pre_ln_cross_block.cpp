// V18a (T5, docs/variants.md): the pre-norm decoder layer with cross-attention, the EDTransformer's decoder layer
// of the block "pre_ln" (its encoder layer is Algorithm 10's, listings/pre_ln_block.cpp, with Mask ≡ 1), forward,
// backward and cached decoding side by side:
//   1  X̃ ← norm(X | γ_l¹);  X ← X + MHAttention(X̃ | W_l^dec, Mask[t, t'] = [[t ≤ t']])
//   2  X̃ ← norm(X | γ_l²);  X ← X + MHAttention(X̃, Z | W_l^e/d, Mask ≡ 1)
//   3  X̃ ← norm(X | γ_l³);  X ← X + MLP(X̃ | W_mlp3^l, W_mlp4^l)
#include "formal_transformers/transformers.hpp"

#include "../models/shared.hpp"

namespace ft {
using namespace models;
namespace {

template <class T>
class PreLNCrossDecoderBlock final : public CrossBlock<T> {
public:
    struct Acts : CrossBlockActs<T> {
        NormCache<T> norm_gamma1, norm_gamma2, norm_gamma3;
        Matrix<T> Xt_self, Xt_cross, Xt_mlp;  // [d_e, n_x] the sublayers' normed inputs (lines 1, 2, 3)
        Matrix<T> X_self, X_cross;            // [d_e, n_x] the stream after lines 1 and 2
        MLPCache<T> mlp;
    };
    PreLNCrossDecoderBlock(const BlockSpec& b, ParamStore<T>& store, const std::string& p)
        : CrossBlock<T>(self_l, cross_l),
          norm1(block_norm(b, store, p, "1")),
          self_l(self_attention(b, store, p)),
          norm2(block_norm(b, store, p, "2")),
          cross_l(cross_attention(b, store, p)),
          norm3(block_norm(b, store, p, "3")),
          mlp(block_mlp(b, store, p, "W_mlp3", "b_mlp3", "W_mlp4", "b_mlp4")) {}
    std::unique_ptr<CrossBlockActs<T>> make_acts() const override { return std::make_unique<Acts>(); }

    void init(ParamStore<T>& store, Rng& rng, double s, double s_out) const override {
        init_parts(store, rng, s, s_out, norm1, self_l, norm2, cross_l, norm3, mlp);
    }

    void forward(const ParamStore<T>& store, CMatView<T> X, const Seqs& sx, CMatView<T> Z, const Seqs& sz,
                 MatView<T> X_out, CrossBlockActs<T>& acts, const Dropout* drop, DropPlace place) const override {
        Acts& a = static_cast<Acts&>(acts);
        const index_t d_e = X.rows, n = X.cols;
        MatView<T> Xt1 = ensure(a.Xt_self, d_e, n);
        norm1.forward(store, X, Xt1, a.norm_gamma1);  // line 1: X̃ ← norm(X | γ¹)
        MatView<T> Xs = copy_into(a.X_self, X);
        add_dropped(drop, place.at(DropSite::SelfOut), Xs, a.R, a.drop_self, [&](MatView<T> out) {
            self_l.forward(store, Xt1, sx, Xt1, sx, out, a.self_attn, true, drop, place.at(DropSite::SelfWeights));
        });  // line 1: X ← X + MHAttention(X̃ | W_l^dec, Mask[t, t'] = [[t ≤ t']])
        MatView<T> Xt2 = ensure(a.Xt_cross, d_e, n);
        norm2.forward(store, Xs, Xt2, a.norm_gamma2);  // line 2: X̃ ← norm(X | γ²)
        MatView<T> Xc = copy_into(a.X_cross, CMatView<T>(Xs));
        add_dropped(drop, place.at(DropSite::CrossOut), Xc, a.R, a.drop_cross, [&](MatView<T> out) {
            cross_l.forward(store, Xt2, sx, Z, sz, out, a.cross_attn, true, drop, place.at(DropSite::CrossWeights));
        });  // line 2: X ← X + MHAttention(X̃, Z | W_l^e/d, Mask ≡ 1)
        MatView<T> Xt3 = ensure(a.Xt_mlp, d_e, n);
        norm3.forward(store, Xc, Xt3, a.norm_gamma3);  // line 3: X̃ ← norm(X | γ³)
        std::copy(Xc.data, Xc.data + Xc.size(), X_out.data);
        add_dropped(drop, place.at(DropSite::MlpOut), X_out, a.R, a.drop_mlp, [&](MatView<T> out) {
            mlp.forward(store, Xt3, out, a.mlp);
        });  // line 3: X ← X + MLP(X̃)
    }

    void backward(ParamStore<T>& store, CMatView<T>, const Seqs& sx, CMatView<T> Z, const Seqs& sz,
                  const CrossBlockActs<T>& acts, MatView<T> dZ, BackwardWork<T>& w) const override {
        const Acts& a = static_cast<const Acts&>(acts);
        MatView<T> dX = view(w.dX);
        // line 3: X_out = X_cross + MLP(X̃_mlp)
        MatView<T> dXt = zeros(w.dXt, dX.rows, dX.cols);
        mlp.backward(store, view(a.Xt_mlp), a.mlp, dropped_grad(a.drop_mlp, CMatView<T>(dX), w.dR), dXt, w.dH);
        norm3.backward(store, dXt, a.norm_gamma3, dX);
        // line 2: X_cross = X_self + MHAttention(X̃_cross, Z): the context gets ∂/∂Z too
        zero(dXt);
        cross_l.backward(store, view(a.Xt_cross), sx, Z, sz, a.cross_attn,
                         dropped_grad(a.drop_cross, CMatView<T>(dX), w.dR), dXt, dZ, w.attn);
        norm2.backward(store, dXt, a.norm_gamma2, dX);
        // line 1: X_self = X + MHAttention(X̃_self)
        zero(dXt);
        self_l.backward(store, view(a.Xt_self), sx, view(a.Xt_self), sx, a.self_attn,
                        dropped_grad(a.drop_self, CMatView<T>(dX), w.dR), dXt, dXt, w.attn);
        norm1.backward(store, dXt, a.norm_gamma1, dX);
    }

    // lines 1–3 over the cached keys and values
    void forward_cached(const ParamStore<T>& store, index_t q0, KVCache<T>& self_kv, const KVCache<T>& cross_kv,
                        DecodeScratch<T>& d) const override {
        MatView<T> X = view(d.X), Xt = ensure(d.Xt, X.rows, X.cols);
        norm1.forward(store, X, Xt, d.norm);  // line 1
        self_l.append_kv(store, Xt, self_kv);
        self_l.attend_cached(store, Xt, q0, self_kv, X, d.attn, true);
        norm2.forward(store, X, Xt, d.norm);  // line 2
        cross_l.attend_cached(store, Xt, q0, cross_kv, X, d.attn, true);
        norm3.forward(store, X, Xt, d.norm);  // line 3
        mlp.forward(store, Xt, X, d.mlp);
    }

    Norm<T> norm1;           // γ_l¹
    MHAttention<T> self_l;   // W_l^dec, causal
    Norm<T> norm2;           // γ_l²
    MHAttention<T> cross_l;  // W_l^e/d, bidirectional
    Norm<T> norm3;           // γ_l³
    MLP<T> mlp;              // W_mlp3^l, W_mlp4^l (and W_gate with mlp = GeGLU)
};

}  // namespace

FT_BLOCK_FACTORY(make_pre_ln_cross_block, PreLNCrossDecoderBlock, CrossBlock)

}  // namespace ft
