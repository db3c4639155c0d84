// The layers of Algorithms 8, 9, 10 as blocks: forward line by line, backward beside it (transformers.hpp).
#include "formal_transformers/transformers.hpp"

#include <cmath>
#include <limits>

#include "formal_transformers/blas.hpp"
#include "shared.hpp"

namespace ft {
using namespace models;

// ========================================== the blocks ================================================
// ------------------------------ Algorithm 10 lines 5–8: pre-LN decoder block ---------------------------
template <class T>
PreLNDecoderBlock<T>::PreLNDecoderBlock(const ModelConfig& c, Activation act, ParamStore<T>& store, const std::string& p)
    : norm1(norm_name(c.norm), c.d_e, c.eps, store, p + "gamma1", p + "beta1"),
      attn(c.H, c.d_e, c.d_e, c.d_attn, c.d_mid, c.d_e, decoder_mask(c), store, p + "attn.", attn_variant(c, true)),
      norm2(norm_name(c.norm), c.d_e, c.eps, store, p + "gamma2", p + "beta2"),
      mlp(mlp_name(c.mlp), mlp_spec(c, act, "W_mlp1", "b_mlp1", "W_mlp2", "b_mlp2"), store, p) {
    add_sandwich(c, store, p);
}

template <class T>
PreLNDecoderBlock<T>::PreLNDecoderBlock(const ModelConfig& c, Activation act, ParamStore<T>& store, const std::string& p,
                                        const Mask& mask, const AttnVariant& v)
    : norm1(norm_name(c.norm), c.d_e, c.eps, store, p + "gamma1", p + "beta1"),
      attn(c.H, c.d_e, c.d_e, c.d_attn, c.d_mid, c.d_e, mask, store, p + "attn.", v),
      norm2(norm_name(c.norm), c.d_e, c.eps, store, p + "gamma2", p + "beta2"),
      mlp(mlp_name(c.mlp), mlp_spec(c, act, "W_mlp1", "b_mlp1", "W_mlp2", "b_mlp2"), store, p) {
    add_sandwich(c, store, p);
}

// V27 (sandwich_norm; Gemma 2, 3): each sublayer's second norm, γ_l¹′ and γ_l²′, after the listing's parameters
template <class T>
void PreLNDecoderBlock<T>::add_sandwich(const ModelConfig& c, ParamStore<T>& store, const std::string& p) {
    if (!c.sandwich_norm) return;
    post1 = std::make_shared<const Norm<T>>(norm_name(c.norm), c.d_e, c.eps, store, p + "gamma1_post", p + "beta1_post");
    post2 = std::make_shared<const Norm<T>>(norm_name(c.norm), c.d_e, c.eps, store, p + "gamma2_post", p + "beta2_post");
}

// f's output Y:[d_e,n] (computed into Y), with V27 normalised in place (norm(Y | γ′)), added into out
template <class T, class F>
void add_sublayer(const ParamStore<T>& store, const Norm<T>* post, Matrix<T>& Y, NormCache<T>& nc, MatView<T> out, F&& f) {
    if (!post) {
        f(out, true);  // the listing: X ← X + f(X̃), accumulated in place
        return;
    }
    MatView<T> y = ensure(Y, out.rows, out.cols);
    f(y, false);
    post->forward(store, y, y, nc);
    for (index_t j = 0; j < out.cols; ++j) {
        T* o = out.col(j);
        const T* s = y.col(j);
        for (index_t i = 0; i < out.rows; ++i) o[i] += s[i];
    }
}
// ∂loss/∂(f's output) from ∂loss/∂(what add_sublayer added), dOut: itself, or with V27 back through norm(· | γ′) into dY
template <class T>
CMatView<T> sublayer_grad(ParamStore<T>& store, const Norm<T>* post, const NormCache<T>& nc, CMatView<T> dOut, Matrix<T>& dY) {
    if (!post) return dOut;
    MatView<T> d = zeros(dY, dOut.rows, dOut.cols);
    post->backward(store, dOut, nc, d);
    return d;
}

template <class T>
void PreLNDecoderBlock<T>::init(ParamStore<T>& store, Rng& rng, double s, double s_out) const {
    norm1.init(store);
    attn.init(store, rng, s, s_out);
    norm2.init(store);
    mlp.init(store, rng, s, s_out);
    if (post1) post1->init(store), post2->init(store);
}

template <class T>
void PreLNDecoderBlock<T>::forward(const ParamStore<T>& store, CMatView<T> X, const Seqs& s, MatView<T> X_out, Acts& a,
                                   const Dropout* drop, DropPlace place, const Mask* mask) const {
    const index_t d_e = X.rows, n = X.cols;
    MatView<T> Xt1 = ensure(a.Xt_attn, d_e, n);
    norm1.forward(store, X, Xt1, a.norm_gamma1);  // line 5: X̃ ← layer_norm(X | γ¹, β¹)
    MatView<T> Xa = copy_into(a.X_attn, X);
    add_dropped(drop, place.at(DropSite::SelfOut), Xa, a.R, a.drop_attn, [&](MatView<T> out) {
        add_sublayer(store, post1.get(), a.Y_attn, a.norm_post1, out, [&](MatView<T> y, bool acc) {
            attn.forward(store, Xt1, s, Xt1, s, y, a.attn, acc, drop, place.at(DropSite::SelfWeights), mask);
        });
    });  // line 6: X ← X + MHAttention(X̃ | W_l, Mask[t, t'] = [[t ≤ t']])   (V27: + norm(MHAttention(X̃) | γ¹′))
    MatView<T> Xt2 = ensure(a.Xt_mlp, d_e, n);
    norm2.forward(store, Xa, Xt2, a.norm_gamma2);  // line 7: X̃ ← layer_norm(X | γ², β²)
    std::copy(Xa.data, Xa.data + Xa.size(), X_out.data);
    add_dropped(drop, place.at(DropSite::MlpOut), X_out, a.R, a.drop_mlp, [&](MatView<T> out) {
        add_sublayer(store, post2.get(), a.Y_mlp, a.norm_post2, out, [&](MatView<T> y, bool acc) {
            if (!acc) zero(y);
            mlp.forward(store, Xt2, y, a.mlp);
        });
    });  // line 8: X ← X + W_mlp2 GELU(W_mlp1 X̃ + b_mlp1 1ᵀ) + b_mlp2 1ᵀ   (V27: + norm(MLP(X̃) | γ²′))
}

template <class T>
void PreLNDecoderBlock<T>::backward(ParamStore<T>& store, const Seqs& s, const Acts& a, BackwardWork<T>& w) const {
    MatView<T> dX = view(w.dX);
    // line 8: X_out = X_attn + MLP(X̃_mlp)  ->  ∂/∂X̃_mlp into dXt; ∂/∂X_attn = dX (+ line 7's part below)
    MatView<T> dXt = zeros(w.dXt, dX.rows, dX.cols);
    mlp.backward(store, view(a.Xt_mlp), a.mlp,
                 sublayer_grad(store, post2.get(), a.norm_post2, dropped_grad(a.drop_mlp, CMatView<T>(dX), w.dR), w.dY), dXt,
                 w.dH);
    norm2.backward(store, dXt, a.norm_gamma2, dX);  // line 7
    // line 6: X_attn = X + MHAttention(X̃_attn)  ->  ∂/∂X̃_attn (queries, keys and values alike) into dXt
    zero(dXt);
    attn.backward(store, view(a.Xt_attn), s, view(a.Xt_attn), s, a.attn,
                  sublayer_grad(store, post1.get(), a.norm_post1, dropped_grad(a.drop_attn, CMatView<T>(dX), w.dR), w.dY),
                  dXt, dXt, w.attn);
    norm1.backward(store, dXt, a.norm_gamma1, dX);  // line 5
}

// ------------------- Algorithm 9 lines 5–8 = Algorithm 8 lines 5–8: post-LN encoder block ---------------
template <class T>
PostLNEncoderBlock<T>::PostLNEncoderBlock(const ModelConfig& c, Activation act, ParamStore<T>& store, const std::string& p)
    : attn(c.H, c.d_e, c.d_e, c.d_attn, c.d_mid, c.d_e, encoder_mask(c, p + "attn."), store, p + "attn.",
           relative_variant(c, "enc.rel_bias", true)),
      norm1(norm_name(c.norm), c.d_e, c.eps, store, p + "gamma1", p + "beta1"),
      mlp(mlp_name(c.mlp), mlp_spec(c, act, "W_mlp1", "b_mlp1", "W_mlp2", "b_mlp2"), store, p),
      norm2(norm_name(c.norm), c.d_e, c.eps, store, p + "gamma2", p + "beta2") {}

template <class T>
void PostLNEncoderBlock<T>::init(ParamStore<T>& store, Rng& rng, double s, double s_out) const {
    attn.init(store, rng, s, s_out);
    norm1.init(store);
    mlp.init(store, rng, s, s_out);
    norm2.init(store);
}

template <class T>
void PostLNEncoderBlock<T>::forward(const ParamStore<T>& store, CMatView<T> X, const Seqs& s, MatView<T> X_out, Acts& a,
                                    const Dropout* drop, DropPlace place) const {
    const index_t d_e = X.rows, n = X.cols;
    MatView<T> Xa = copy_into(a.X_attn, X);
    add_dropped(drop, place.at(DropSite::SelfOut), Xa, a.R, a.drop_attn, [&](MatView<T> out) {
        attn.forward(store, X, s, X, s, out, a.attn, true, drop, place.at(DropSite::SelfWeights));
    });  // line 5: X ← X + MHAttention(X | W_l, Mask ≡ 1)
    MatView<T> X1 = ensure(a.X_1, d_e, n);
    norm1.forward(store, Xa, X1, a.norm_gamma1);  // line 6: X ← layer_norm(X | γ_l¹, β_l¹)  (Alg 8 erratum: γ_t)
    MatView<T> Xm = copy_into(a.X_mlp, CMatView<T>(X1));
    add_dropped(drop, place.at(DropSite::MlpOut), Xm, a.R, a.drop_mlp, [&](MatView<T> out) {
        mlp.forward(store, X1, out, a.mlp);
    });  // line 7: X ← X + W_mlp2 φ(W_mlp1 X + b_mlp1 1ᵀ) + b_mlp2 1ᵀ
    norm2.forward(store, Xm, X_out, a.norm_gamma2);  // line 8: X ← layer_norm(X | γ_l², β_l²)
}

template <class T>
void PostLNEncoderBlock<T>::backward(ParamStore<T>& store, CMatView<T> X, const Seqs& s, const Acts& a,
                                     BackwardWork<T>& w) const {
    // lines 8 and 7: X_out = layer_norm₂(X_mlp), X_mlp = X_1 + MLP(X_1)
    post_ln_backward(norm2, store, a.norm_gamma2, w.dX, w.dXt, [&](CMatView<T> dXm, MatView<T> dX1) {
        mlp.backward(store, view(a.X_1), a.mlp, dropped_grad(a.drop_mlp, dXm, w.dR), dX1, w.dH);
    });
    // lines 6 and 5: X_1 = layer_norm₁(X_attn), X_attn = X + MHAttention(X)
    post_ln_backward(norm1, store, a.norm_gamma1, w.dX, w.dXt, [&](CMatView<T> dXa, MatView<T> dX) {
        attn.backward(store, X, s, X, s, a.attn, dropped_grad(a.drop_attn, dXa, w.dR), dX, dX, w.attn);
    });
}

// ---------------- Algorithm 8 lines 14–19: post-LN decoder block with cross-attention -------------------
template <class T>
PostLNDecoderBlock<T>::PostLNDecoderBlock(const ModelConfig& c, ParamStore<T>& store, const std::string& p)
    : self_attn(c.H, c.d_e, c.d_e, c.d_attn, c.d_mid, c.d_e, Mask::unidirectional(), store, p + "attn.",
                relative_variant(c, "dec.rel_bias", false)),
      norm3(norm_name(c.norm), c.d_e, c.eps, store, p + "gamma3", p + "beta3"),
      cross_attn(c.H, c.d_e, c.d_e, c.d_attn, c.d_mid, c.d_e, Mask::bidirectional(), store, p + "cross_attn.",
                 attn_variant(c, false)),
      norm4(norm_name(c.norm), c.d_e, c.eps, store, p + "gamma4", p + "beta4"),
      mlp(mlp_name(c.mlp), mlp_spec(c, ed_activation(c), "W_mlp3", "b_mlp3", "W_mlp4", "b_mlp4"), store, p),
      norm5(norm_name(c.norm), c.d_e, c.eps, store, p + "gamma5", p + "beta5") {}

template <class T>
void PostLNDecoderBlock<T>::init(ParamStore<T>& store, Rng& rng, double s, double s_out) const {
    self_attn.init(store, rng, s, s_out);
    norm3.init(store);
    cross_attn.init(store, rng, s, s_out);
    norm4.init(store);
    mlp.init(store, rng, s, s_out);
    norm5.init(store);
}

template <class T>
void PostLNDecoderBlock<T>::forward(const ParamStore<T>& store, CMatView<T> X, const Seqs& sx, CMatView<T> Z,
                                    const Seqs& sz, MatView<T> X_out, Acts& a, const Dropout* drop,
                                    DropPlace place) const {
    const index_t d_e = X.rows, n = X.cols;
    MatView<T> Xs = copy_into(a.X_self, X);
    add_dropped(drop, place.at(DropSite::SelfOut), Xs, a.R, a.drop_self, [&](MatView<T> out) {
        self_attn.forward(store, X, sx, X, sx, out, a.self_attn, true, drop, place.at(DropSite::SelfWeights));
    });  // line 14: X ← X + MHAttention(X | W_l^dec, Mask[t, t'] = [[t ≤ t']])
    MatView<T> X3 = ensure(a.X_3, d_e, n);
    norm3.forward(store, Xs, X3, a.norm_gamma3);  // line 15: X ← layer_norm(X | γ_l³, β_l³)
    MatView<T> Xc = copy_into(a.X_cross, CMatView<T>(X3));
    add_dropped(drop, place.at(DropSite::CrossOut), Xc, a.R, a.drop_cross, [&](MatView<T> out) {
        cross_attn.forward(store, X3, sx, Z, sz, out, a.cross_attn, true, drop, place.at(DropSite::CrossWeights));
    });  // line 16: X ← X + MHAttention(X, Z | W_l^e/d, Mask ≡ 1)
    MatView<T> X4 = ensure(a.X_4, d_e, n);
    norm4.forward(store, Xc, X4, a.norm_gamma4);  // line 17: X ← layer_norm(X | γ_l⁴, β_l⁴)
    MatView<T> Xm = copy_into(a.X_mlp, CMatView<T>(X4));
    add_dropped(drop, place.at(DropSite::MlpOut), Xm, a.R, a.drop_mlp, [&](MatView<T> out) {
        mlp.forward(store, X4, out, a.mlp);
    });  // line 18: X ← X + W_mlp4 ReLU(W_mlp3 X + b_mlp3 1ᵀ) + b_mlp4 1ᵀ
    norm5.forward(store, Xm, X_out, a.norm_gamma5);  // line 19: X ← layer_norm(X | γ_l⁵, β_l⁵)
}

template <class T>
void PostLNDecoderBlock<T>::backward(ParamStore<T>& store, CMatView<T> X, const Seqs& sx, CMatView<T> Z, const Seqs& sz,
                                     const Acts& a, MatView<T> dZ, BackwardWork<T>& w) const {
    // lines 19, 18: X_out = layer_norm₅(X_mlp), X_mlp = X_4 + MLP(X_4)
    post_ln_backward(norm5, store, a.norm_gamma5, w.dX, w.dXt, [&](CMatView<T> dXm, MatView<T> dX4) {
        mlp.backward(store, view(a.X_4), a.mlp, dropped_grad(a.drop_mlp, dXm, w.dR), dX4, w.dH);
    });
    // lines 17, 16: X_4 = layer_norm₄(X_cross), X_cross = X_3 + MHAttention(X_3, Z): the context gets ∂/∂Z too
    post_ln_backward(norm4, store, a.norm_gamma4, w.dX, w.dXt, [&](CMatView<T> dXc, MatView<T> dX3) {
        cross_attn.backward(store, view(a.X_3), sx, Z, sz, a.cross_attn, dropped_grad(a.drop_cross, dXc, w.dR), dX3, dZ,
                            w.attn);
    });
    // lines 15, 14: X_3 = layer_norm₃(X_self), X_self = X + MHAttention(X)
    post_ln_backward(norm3, store, a.norm_gamma3, w.dX, w.dXt, [&](CMatView<T> dXs, MatView<T> dX) {
        self_attn.backward(store, X, sx, X, sx, a.self_attn, dropped_grad(a.drop_self, dXs, w.dR), dX, dX, w.attn);
    });
}

// ---------------- V18 lines 1–3: T5's pre-norm decoder layer with cross-attention ----------------------
template <class T>
PreLNCrossDecoderBlock<T>::PreLNCrossDecoderBlock(const ModelConfig& c, ParamStore<T>& store, const std::string& p)
    : norm1(norm_name(c.norm), c.d_e, c.eps, store, p + "gamma1", p + "beta1"),
      self_attn(c.H, c.d_e, c.d_e, c.d_attn, c.d_mid, c.d_e, Mask::unidirectional(), store, p + "attn.",
                relative_variant(c, "dec.rel_bias", false)),
      norm2(norm_name(c.norm), c.d_e, c.eps, store, p + "gamma2", p + "beta2"),
      cross_attn(c.H, c.d_e, c.d_e, c.d_attn, c.d_mid, c.d_e, Mask::bidirectional(), store, p + "cross_attn.",
                 attn_variant(c, false)),
      norm3(norm_name(c.norm), c.d_e, c.eps, store, p + "gamma3", p + "beta3"),
      mlp(mlp_name(c.mlp), mlp_spec(c, ed_activation(c), "W_mlp3", "b_mlp3", "W_mlp4", "b_mlp4"), store, p) {}

template <class T>
void PreLNCrossDecoderBlock<T>::init(ParamStore<T>& store, Rng& rng, double s, double s_out) const {
    norm1.init(store);
    self_attn.init(store, rng, s, s_out);
    norm2.init(store);
    cross_attn.init(store, rng, s, s_out);
    norm3.init(store);
    mlp.init(store, rng, s, s_out);
}

template <class T>
void PreLNCrossDecoderBlock<T>::forward(const ParamStore<T>& store, CMatView<T> X, const Seqs& sx, CMatView<T> Z,
                                        const Seqs& sz, MatView<T> X_out, Acts& a, const Dropout* drop,
                                        DropPlace place) const {
    const index_t d_e = X.rows, n = X.cols;
    MatView<T> Xt1 = ensure(a.Xt_self, d_e, n);
    norm1.forward(store, X, Xt1, a.norm_gamma1);  // line 1: X̃ ← norm(X | γ¹)
    MatView<T> Xs = copy_into(a.X_self, X);
    add_dropped(drop, place.at(DropSite::SelfOut), Xs, a.R, a.drop_self, [&](MatView<T> out) {
        self_attn.forward(store, Xt1, sx, Xt1, sx, out, a.self_attn, true, drop, place.at(DropSite::SelfWeights));
    });  // line 1: X ← X + MHAttention(X̃ | W_l^dec, Mask[t, t'] = [[t ≤ t']])
    MatView<T> Xt2 = ensure(a.Xt_cross, d_e, n);
    norm2.forward(store, Xs, Xt2, a.norm_gamma2);  // line 2: X̃ ← norm(X | γ²)
    MatView<T> Xc = copy_into(a.X_cross, CMatView<T>(Xs));
    add_dropped(drop, place.at(DropSite::CrossOut), Xc, a.R, a.drop_cross, [&](MatView<T> out) {
        cross_attn.forward(store, Xt2, sx, Z, sz, out, a.cross_attn, true, drop, place.at(DropSite::CrossWeights));
    });  // line 2: X ← X + MHAttention(X̃, Z | W_l^e/d, Mask ≡ 1)
    MatView<T> Xt3 = ensure(a.Xt_mlp, d_e, n);
    norm3.forward(store, Xc, Xt3, a.norm_gamma3);  // line 3: X̃ ← norm(X | γ³)
    std::copy(Xc.data, Xc.data + Xc.size(), X_out.data);
    add_dropped(drop, place.at(DropSite::MlpOut), X_out, a.R, a.drop_mlp, [&](MatView<T> out) {
        mlp.forward(store, Xt3, out, a.mlp);
    });  // line 3: X ← X + MLP(X̃)
}

template <class T>
void PreLNCrossDecoderBlock<T>::backward(ParamStore<T>& store, const Seqs& sx, CMatView<T> Z, const Seqs& sz,
                                         const Acts& a, MatView<T> dZ, BackwardWork<T>& w) const {
    MatView<T> dX = view(w.dX);
    // line 3: X_out = X_cross + MLP(X̃_mlp)
    MatView<T> dXt = zeros(w.dXt, dX.rows, dX.cols);
    mlp.backward(store, view(a.Xt_mlp), a.mlp, dropped_grad(a.drop_mlp, CMatView<T>(dX), w.dR), dXt, w.dH);
    norm3.backward(store, dXt, a.norm_gamma3, dX);
    // line 2: X_cross = X_self + MHAttention(X̃_cross, Z): the context gets ∂/∂Z too
    zero(dXt);
    cross_attn.backward(store, view(a.Xt_cross), sx, Z, sz, a.cross_attn, dropped_grad(a.drop_cross, CMatView<T>(dX), w.dR),
                        dXt, dZ, w.attn);
    norm2.backward(store, dXt, a.norm_gamma2, dX);
    // line 1: X_self = X + MHAttention(X̃_self)
    zero(dXt);
    self_attn.backward(store, view(a.Xt_self), sx, view(a.Xt_self), sx, a.self_attn,
                       dropped_grad(a.drop_self, CMatView<T>(dX), w.dR), dXt, dXt, w.attn);
    norm1.backward(store, dXt, a.norm_gamma1, dX);
}

template class PreLNCrossDecoderBlock<float>;
template class PreLNCrossDecoderBlock<double>;
template class PreLNDecoderBlock<float>;
template class PreLNDecoderBlock<double>;
template class PostLNEncoderBlock<float>;
template class PostLNEncoderBlock<double>;
template class PostLNDecoderBlock<float>;
template class PostLNDecoderBlock<double>;

}  // namespace ft
