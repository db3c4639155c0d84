// Algorithms 8, 9, 10: forward passes line by line, and their backward passes beside them.
#include "formal_transformers/transformers.hpp"

#include <cmath>
#include <limits>

#include "formal_transformers/blas.hpp"

namespace ft {

namespace {
template <class T>
void zero(MatView<T> m) {
    std::fill(m.data, m.data + m.size(), T(0));
}
template <class T>
MatView<T> zeros(Matrix<T>& m, index_t rows, index_t cols) {
    MatView<T> v = ensure(m, rows, cols);
    zero(v);
    return v;
}
template <class T>
MatView<T> copy_into(Matrix<T>& dst, CMatView<T> src) {
    MatView<T> v = ensure(dst, src.rows, src.cols);
    std::copy(src.data, src.data + src.size(), v.data);
    return v;
}
std::string layer_prefix(const char* group, index_t l) { return std::string(group) + "." + std::to_string(l) + "."; }
// The attention options of a model (docs/variants.md); `positional`: RoPE/ALiBi apply (D's self-attention)
AttnVariant attn_variant(const ModelConfig& g, bool positional) {
    AttnVariant v;
    v.H_kv = g.H_kv;
    v.bias = g.bias;
    if (positional && g.positional == Positional::Rope) v.pos = AttnPos::Rope;
    if (positional && g.positional == Positional::Alibi) v.pos = AttnPos::Alibi;
    v.rope_theta = g.rope_theta;
    v.impl = g.attention_impl;
    return v;
}
}  // namespace

// ======================================== shared pieces ===============================================
template <class T>
Norm<T>::Norm(NormKind kind, index_t d, double eps, ParamStore<T>& store, const std::string& gamma, const std::string& beta) {
    if (kind == NormKind::Layer)
        ln_.emplace(d, eps, store, gamma, beta);
    else
        rms_.emplace(d, eps, store, gamma);
}
template <class T>
void Norm<T>::init(ParamStore<T>& store) const {
    if (ln_) ln_->init(store); else rms_->init(store);
}
template <class T>
void Norm<T>::forward(const ParamStore<T>& store, CMatView<T> E, MatView<T> E_hat, NormCache<T>& c) const {
    if (ln_) ln_->forward(store, E, E_hat, c); else rms_->forward(store, E, E_hat, c);
}
template <class T>
void Norm<T>::backward(ParamStore<T>& store, CMatView<T> dE_hat, const NormCache<T>& c, MatView<T> dE) const {
    if (ln_) ln_->backward(store, dE_hat, c, dE); else rms_->backward(store, dE_hat, c, dE);
}

template <class T>
MLP<T>::MLP(index_t d_e_, index_t d_mlp_, Activation act_, ParamStore<T>& store, const std::string& p,
            const std::string& W1, const std::string& b1, const std::string& W2, const std::string& b2)
    : d_e(d_e_), d_mlp(d_mlp_), act(act_) {
    W_1 = store.matrix(p + W1, d_mlp, d_e);
    b_1 = store.vector(p + b1, d_mlp);
    W_2 = store.matrix(p + W2, d_e, d_mlp);
    b_2 = store.vector(p + b2, d_e);
}
template <class T>
MLP<T>::MLP(index_t d_e_, index_t d_mlp_, Activation act_, ParamStore<T>& store, const std::string& p,
            const std::string& W1, const std::string& b1, const std::string& W2, const std::string& b2, bool gated_,
            bool bias_)
    : d_e(d_e_), d_mlp(d_mlp_), act(act_), gated(gated_), bias(bias_) {
    if (gated) W_g = store.matrix(p + "W_gate", d_mlp, d_e);
    if (gated && bias) b_g = store.vector(p + "b_gate", d_mlp);
    W_1 = store.matrix(p + W1, d_mlp, d_e);
    if (bias) b_1 = store.vector(p + b1, d_mlp);
    W_2 = store.matrix(p + W2, d_e, d_mlp);
    if (bias) b_2 = store.vector(p + b2, d_e);
}
template <class T>
void MLP<T>::init(ParamStore<T>& store, Rng& rng, double stddev, double out_stddev) const {
    if (gated) store.normal(W_g.offset, d_mlp * d_e, stddev, rng);
    if (gated && bias) store.fill(b_g.offset, d_mlp, T(0));
    store.normal(W_1.offset, d_mlp * d_e, stddev, rng);
    if (bias) store.fill(b_1.offset, d_mlp, T(0));
    store.normal(W_2.offset, d_e * d_mlp, out_stddev, rng);
    if (bias) store.fill(b_2.offset, d_e, T(0));
}
// Out += W_2 φ(W_1 X̃ + b_1 1ᵀ) + b_2 1ᵀ   (gated: Out += SwiGLU(X̃), V4)
template <class T>
void MLP<T>::forward(const ParamStore<T>& store, CMatView<T> Xt, MatView<T> Out, MLPCache<T>& c) const {
    MatView<T> Hp = ensure(c.Hpre, d_mlp, Xt.cols), A = ensure(c.Act, d_mlp, Xt.cols);
    if (gated || !bias) {  // the variants (docs/variants.md V4, V5)
        const T* nb = nullptr;
        if (gated) {
            MatView<T> G = ensure(c.G, d_mlp, Xt.cols);
            affine<T>(store.W(W_g), Xt, bias ? store.v(b_g) : nb, G);   // V4 line 1: G ← W_gate X̃ + b_gate 1ᵀ
            affine<T>(store.W(W_1), Xt, bias ? store.v(b_1) : nb, Hp);  // V4 line 2: U ← W_mlp1 X̃ + b_mlp1 1ᵀ
            swiglu_gate<T>(G, Hp, A);                                    // V4 line 3: A ← SiLU(G) ⊙ U
        } else {
            affine<T>(store.W(W_1), Xt, nb, Hp);  // V5: W_mlp1 X̃
            activation_forward<T>(act, Hp, A);
        }
        affine_add<T>(store.W(W_2), A, bias ? store.v(b_2) : nb, Out);  // V4 line 4 into X: X + W_mlp2 A (+ b_mlp2 1ᵀ)
        return;
    }
    affine<T>(store.W(W_1), Xt, store.v(b_1), Hp);     // W_mlp1 X̃ + b_mlp1 1ᵀ
    activation_forward<T>(act, Hp, A);                 // GELU or ReLU
    affine_add<T>(store.W(W_2), A, store.v(b_2), Out);  // X + W_mlp2 (…) + b_mlp2 1ᵀ
}
template <class T>
void MLP<T>::backward(ParamStore<T>& store, CMatView<T> Xt, const MLPCache<T>& c, CMatView<T> dOut, MatView<T> dXt,
                      Matrix<T>& dH) const {
    if (gated || !bias) {  // the variants (docs/variants.md V4, V5)
        T* nb = nullptr;
        // dH holds [dA; dG] (2·d_mlp rows when gated)
        MatView<T> dd = zeros(dH, gated ? 2 * d_mlp : d_mlp, Xt.cols);
        MatView<T> dA = dd.rows_range(0, d_mlp);
        affine_backward<T>(store.W(W_2), view(c.Act), dOut, store.dW(W_2).data, bias ? store.dv(b_2) : nb, dA.data,
                           dA.ld);  // d(line 4): dA = W_mlp2ᵀ dY
        if (gated) {
            MatView<T> dG = dd.rows_range(d_mlp, d_mlp);
            swiglu_gate_backward<T>(view(c.G), view(c.Hpre), dA, dG, dA);  // d(line 3): dU (in dA's place), dG
            affine_backward<T>(store.W(W_1), Xt, dA, store.dW(W_1).data, bias ? store.dv(b_1) : nb, dXt.data, dXt.ld);  // d(line 2)
            affine_backward<T>(store.W(W_g), Xt, dG, store.dW(W_g).data, bias ? store.dv(b_g) : nb, dXt.data, dXt.ld);  // d(line 1)
        } else {
            activation_backward<T>(act, view(c.Hpre), dA, dA);
            affine_backward<T>(store.W(W_1), Xt, dA, store.dW(W_1).data, nb, dXt.data, dXt.ld);
        }
        return;
    }
    MatView<T> dh = zeros(dH, d_mlp, Xt.cols);
    affine_backward<T>(store.W(W_2), view(c.Act), dOut, store.dW(W_2).data, store.dv(b_2), dh.data);  // dAct = W_2ᵀ dOut
    activation_backward<T>(act, view(c.Hpre), dh, dh);                                               // dHpre = φ'(Hpre) ⊙ dAct
    affine_backward<T>(store.W(W_1), Xt, dh, store.dW(W_1).data, store.dv(b_1), dXt.data, dXt.ld);   // dX̃ += W_1ᵀ dHpre
}

// Dropout on a sublayer's output before the residual add (docs/regularisation.md): X ← X + Dropout(f(X̃) | p, M)
// with p = drop->resid, where f accumulates into its argument (f(X) is the listing's X ← X + f(X̃), in place).
// Without dropout (evaluation, or p = 0) exactly that; with it, f runs into the scratch R, which is dropped
// (D1) and added.
template <class T, class F>
void add_dropped(const Dropout* drop, std::uint64_t place, MatView<T> X, Matrix<T>& R, DropoutMask& m, F&& f) {
    m.p = drop ? drop->resid : 0.0;
    if (!m.active()) {
        m.keep.clear();
        f(X);
        return;
    }
    MatView<T> r = zeros(R, X.rows, X.cols);
    f(r);
    drop->apply(m.p, place, r, m);
    for (index_t j = 0; j < X.cols; ++j) {
        T* x = X.col(j);
        const T* y = r.col(j);
        for (index_t i = 0; i < X.rows; ++i) x[i] += y[i];
    }
}
// ∂loss/∂f's output from ∂loss/∂X of add_dropped: dX itself, or dX ⊙ M / (1 − p) (D2) in the scratch dR.
template <class T>
CMatView<T> dropped_grad(const DropoutMask& m, CMatView<T> dX, Matrix<T>& dR) {
    if (!m.active()) return dX;
    MatView<T> d = copy_into(dR, dX);
    dropout_backward<T>(m.p, m.keep.data(), d.data, d.size());
    return d;
}
std::uint64_t site(std::uint64_t place0, DropSite s) { return place0 | std::uint64_t(s); }

// A post-LN sublayer of Algorithms 8 and 9: X_r = X + f(X, …); out = norm(X_r).
// Given P = ∂loss/∂out, leaves P = ∂loss/∂X: Q ← norm'(P) (= ∂/∂X_r); P ← Q (the residual path);
// f_back(Q, P) adds f's input gradient into P.
template <class T, class FBack>
void post_ln_backward(const Norm<T>& norm, ParamStore<T>& store, const NormCache<T>& nc, Matrix<T>& P, Matrix<T>& Q,
                      FBack&& f_back) {
    MatView<T> q = zeros(Q, index_t(P.shape(0)), index_t(P.shape(1)));
    norm.backward(store, view(P), nc, q);
    std::copy(q.data, q.data + q.size(), P.data());
    f_back(CMatView<T>(q), view(P));
}

// ========================================== the blocks ================================================
// ------------------------------ Algorithm 10 lines 5–8: pre-LN decoder block ---------------------------
template <class T>
PreLNDecoderBlock<T>::PreLNDecoderBlock(const ModelConfig& g, Activation act, ParamStore<T>& store, const std::string& p)
    : norm1(g.norm, g.d_e, g.eps, store, p + "gamma1", p + "beta1"),
      attn(g.H, g.d_e, g.d_e, g.d_attn, g.d_mid, g.d_e, Mask::unidirectional(), store, p + "attn.", attn_variant(g, true)),
      norm2(g.norm, g.d_e, g.eps, store, p + "gamma2", p + "beta2"),
      mlp(g.d_e, g.d_mlp, act, store, p, "W_mlp1", "b_mlp1", "W_mlp2", "b_mlp2", g.mlp == ModelConfig::Mlp::SwiGLU,
          g.bias) {}

template <class T>
void PreLNDecoderBlock<T>::init(ParamStore<T>& store, Rng& rng, double s, double s_out) const {
    norm1.init(store);
    attn.init(store, rng, s, s_out);
    norm2.init(store);
    mlp.init(store, rng, s, s_out);
}

template <class T>
void PreLNDecoderBlock<T>::forward(const ParamStore<T>& store, CMatView<T> X, const Seqs& s, MatView<T> X_out, Acts& a,
                                   const Dropout* drop, std::uint64_t place0) const {
    const index_t d_e = X.rows, n = X.cols;
    MatView<T> Xt1 = ensure(a.Xt_attn, d_e, n);
    norm1.forward(store, X, Xt1, a.norm_gamma1);  // line 5: X̃ ← layer_norm(X | γ¹, β¹)
    MatView<T> Xa = copy_into(a.X_attn, X);
    add_dropped(drop, site(place0, DropSite::SelfOut), Xa, a.R, a.drop_attn, [&](MatView<T> out) {
        attn.forward(store, Xt1, s, Xt1, s, out, a.attn, /*accumulate=*/true, drop, site(place0, DropSite::SelfWeights));
    });  // line 6: X ← X + MHAttention(X̃ | W_l, Mask[t, t'] = [[t ≤ t']])
    MatView<T> Xt2 = ensure(a.Xt_mlp, d_e, n);
    norm2.forward(store, Xa, Xt2, a.norm_gamma2);  // line 7: X̃ ← layer_norm(X | γ², β²)
    std::copy(Xa.data, Xa.data + Xa.size(), X_out.data);
    add_dropped(drop, site(place0, DropSite::MlpOut), X_out, a.R, a.drop_mlp, [&](MatView<T> out) {
        mlp.forward(store, Xt2, out, a.mlp);
    });  // line 8: X ← X + W_mlp2 GELU(W_mlp1 X̃ + b_mlp1 1ᵀ) + b_mlp2 1ᵀ
}

template <class T>
void PreLNDecoderBlock<T>::backward(ParamStore<T>& store, const Seqs& s, const Acts& a, BackwardWork<T>& w) const {
    MatView<T> P = view(w.P);
    // line 8: X_out = X_attn + MLP(X̃_mlp)  ->  ∂/∂X̃_mlp into Q; ∂/∂X_attn = P (+ line 7's part below)
    MatView<T> Q = zeros(w.Q, P.rows, P.cols);
    mlp.backward(store, view(a.Xt_mlp), a.mlp, dropped_grad(a.drop_mlp, CMatView<T>(P), w.dR), Q, w.dH);
    norm2.backward(store, Q, a.norm_gamma2, P);  // line 7
    // line 6: X_attn = X + MHAttention(X̃_attn)  ->  ∂/∂X̃_attn (queries, keys and values alike) into Q
    zero(Q);
    attn.backward(store, view(a.Xt_attn), s, view(a.Xt_attn), s, a.attn, dropped_grad(a.drop_attn, CMatView<T>(P), w.dR),
                  Q, Q, w.attn);
    norm1.backward(store, Q, a.norm_gamma1, P);  // line 5
}

template <class T>
void PreLNDecoderBlock<T>::forward_cached(const ParamStore<T>& store, MatView<T> X, index_t q0, KVCache<T>& kv,
                                          DecodeScratch<T>& d) const {
    MatView<T> Xt = ensure(d.Xt, X.rows, X.cols);
    norm1.forward(store, X, Xt, d.norm);                      // line 5
    attn.append_kv(store, Xt, kv);                            // keys/values of the new tokens
    attn.attend_cached(store, Xt, q0, kv, X, d.attn, true);   // line 6
    norm2.forward(store, X, Xt, d.norm);                      // line 7
    mlp.forward(store, Xt, X, d.mlp);                         // line 8
}

// ------------------- Algorithm 9 lines 5–8 = Algorithm 8 lines 5–8: post-LN encoder block ---------------
template <class T>
PostLNEncoderBlock<T>::PostLNEncoderBlock(const ModelConfig& g, Activation act, ParamStore<T>& store, const std::string& p)
    : attn(g.H, g.d_e, g.d_e, g.d_attn, g.d_mid, g.d_e, Mask::bidirectional(), store, p + "attn.", attn_variant(g, false)),
      norm1(NormKind::Layer, g.d_e, g.eps, store, p + "gamma1", p + "beta1"),
      mlp(g.d_e, g.d_mlp, act, store, p, "W_mlp1", "b_mlp1", "W_mlp2", "b_mlp2", false, g.bias),
      norm2(NormKind::Layer, g.d_e, g.eps, store, p + "gamma2", p + "beta2") {}

template <class T>
void PostLNEncoderBlock<T>::init(ParamStore<T>& store, Rng& rng, double s, double s_out) const {
    attn.init(store, rng, s, s_out);
    norm1.init(store);
    mlp.init(store, rng, s, s_out);
    norm2.init(store);
}

template <class T>
void PostLNEncoderBlock<T>::forward(const ParamStore<T>& store, CMatView<T> X, const Seqs& s, MatView<T> X_out, Acts& a,
                                    const Dropout* drop, std::uint64_t place0) const {
    const index_t d_e = X.rows, n = X.cols;
    MatView<T> Xa = copy_into(a.X_attn, X);
    add_dropped(drop, site(place0, DropSite::SelfOut), Xa, a.R, a.drop_attn, [&](MatView<T> out) {
        attn.forward(store, X, s, X, s, out, a.attn, true, drop, site(place0, DropSite::SelfWeights));
    });  // line 5: X ← X + MHAttention(X | W_l, Mask ≡ 1)
    MatView<T> X1 = ensure(a.X_1, d_e, n);
    norm1.forward(store, Xa, X1, a.norm_gamma1);  // line 6: X ← layer_norm(X | γ_l¹, β_l¹)  (Alg 8 erratum: γ_t)
    MatView<T> Xm = copy_into(a.X_mlp, CMatView<T>(X1));
    add_dropped(drop, site(place0, DropSite::MlpOut), Xm, a.R, a.drop_mlp, [&](MatView<T> out) {
        mlp.forward(store, X1, out, a.mlp);
    });  // line 7: X ← X + W_mlp2 φ(W_mlp1 X + b_mlp1 1ᵀ) + b_mlp2 1ᵀ
    norm2.forward(store, Xm, X_out, a.norm_gamma2);  // line 8: X ← layer_norm(X | γ_l², β_l²)
}

template <class T>
void PostLNEncoderBlock<T>::backward(ParamStore<T>& store, CMatView<T> X, const Seqs& s, const Acts& a,
                                     BackwardWork<T>& w) const {
    // lines 8 and 7: X_out = layer_norm₂(X_mlp), X_mlp = X_1 + MLP(X_1)
    post_ln_backward(norm2, store, a.norm_gamma2, w.P, w.Q, [&](CMatView<T> dXm, MatView<T> dX1) {
        mlp.backward(store, view(a.X_1), a.mlp, dropped_grad(a.drop_mlp, dXm, w.dR), dX1, w.dH);
    });
    // lines 6 and 5: X_1 = layer_norm₁(X_attn), X_attn = X + MHAttention(X)
    post_ln_backward(norm1, store, a.norm_gamma1, w.P, w.Q, [&](CMatView<T> dXa, MatView<T> dX) {
        attn.backward(store, X, s, X, s, a.attn, dropped_grad(a.drop_attn, dXa, w.dR), dX, dX, w.attn);
    });
}

// ---------------- Algorithm 8 lines 14–19: post-LN decoder block with cross-attention -------------------
template <class T>
PostLNDecoderBlock<T>::PostLNDecoderBlock(const ModelConfig& g, ParamStore<T>& store, const std::string& p)
    : self_attn(g.H, g.d_e, g.d_e, g.d_attn, g.d_mid, g.d_e, Mask::unidirectional(), store, p + "attn.",
                attn_variant(g, false)),
      norm3(NormKind::Layer, g.d_e, g.eps, store, p + "gamma3", p + "beta3"),
      cross_attn(g.H, g.d_e, g.d_e, g.d_attn, g.d_mid, g.d_e, Mask::bidirectional(), store, p + "cross_attn.",
                 attn_variant(g, false)),
      norm4(NormKind::Layer, g.d_e, g.eps, store, p + "gamma4", p + "beta4"),
      mlp(g.d_e, g.d_mlp, Activation::Relu, store, p, "W_mlp3", "b_mlp3", "W_mlp4", "b_mlp4", false, g.bias),
      norm5(NormKind::Layer, g.d_e, g.eps, store, p + "gamma5", p + "beta5") {}

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
                                    std::uint64_t place0) const {
    const index_t d_e = X.rows, n = X.cols;
    MatView<T> Xs = copy_into(a.X_self, X);
    add_dropped(drop, site(place0, DropSite::SelfOut), Xs, a.R, a.drop_self, [&](MatView<T> out) {
        self_attn.forward(store, X, sx, X, sx, out, a.self_attn, true, drop, site(place0, DropSite::SelfWeights));
    });  // line 14: X ← X + MHAttention(X | W_l^dec, Mask[t, t'] = [[t ≤ t']])
    MatView<T> X3 = ensure(a.X_3, d_e, n);
    norm3.forward(store, Xs, X3, a.norm_gamma3);  // line 15: X ← layer_norm(X | γ_l³, β_l³)
    MatView<T> Xc = copy_into(a.X_cross, CMatView<T>(X3));
    add_dropped(drop, site(place0, DropSite::CrossOut), Xc, a.R, a.drop_cross, [&](MatView<T> out) {
        cross_attn.forward(store, X3, sx, Z, sz, out, a.cross_attn, true, drop, site(place0, DropSite::CrossWeights));
    });  // line 16: X ← X + MHAttention(X, Z | W_l^e/d, Mask ≡ 1)
    MatView<T> X4 = ensure(a.X_4, d_e, n);
    norm4.forward(store, Xc, X4, a.norm_gamma4);  // line 17: X ← layer_norm(X | γ_l⁴, β_l⁴)
    MatView<T> Xm = copy_into(a.X_mlp, CMatView<T>(X4));
    add_dropped(drop, site(place0, DropSite::MlpOut), Xm, a.R, a.drop_mlp, [&](MatView<T> out) {
        mlp.forward(store, X4, out, a.mlp);
    });  // line 18: X ← X + W_mlp4 ReLU(W_mlp3 X + b_mlp3 1ᵀ) + b_mlp4 1ᵀ
    norm5.forward(store, Xm, X_out, a.norm_gamma5);  // line 19: X ← layer_norm(X | γ_l⁵, β_l⁵)
}

template <class T>
void PostLNDecoderBlock<T>::backward(ParamStore<T>& store, CMatView<T> X, const Seqs& sx, CMatView<T> Z, const Seqs& sz,
                                     const Acts& a, MatView<T> dZ, BackwardWork<T>& w) const {
    // lines 19, 18: X_out = layer_norm₅(X_mlp), X_mlp = X_4 + MLP(X_4)
    post_ln_backward(norm5, store, a.norm_gamma5, w.P, w.Q, [&](CMatView<T> dXm, MatView<T> dX4) {
        mlp.backward(store, view(a.X_4), a.mlp, dropped_grad(a.drop_mlp, dXm, w.dR), dX4, w.dH);
    });
    // lines 17, 16: X_4 = layer_norm₄(X_cross), X_cross = X_3 + MHAttention(X_3, Z): the context gets ∂/∂Z too
    post_ln_backward(norm4, store, a.norm_gamma4, w.P, w.Q, [&](CMatView<T> dXc, MatView<T> dX3) {
        cross_attn.backward(store, view(a.X_3), sx, Z, sz, a.cross_attn, dropped_grad(a.drop_cross, dXc, w.dR), dX3, dZ,
                            w.attn);
    });
    // lines 15, 14: X_3 = layer_norm₃(X_self), X_self = X + MHAttention(X)
    post_ln_backward(norm3, store, a.norm_gamma3, w.P, w.Q, [&](CMatView<T> dXs, MatView<T> dX) {
        self_attn.backward(store, X, sx, X, sx, a.self_attn, dropped_grad(a.drop_self, dXs, w.dR), dX, dX, w.attn);
    });
}

template <class T>
void PostLNDecoderBlock<T>::forward_cached(const ParamStore<T>& store, index_t q0, KVCache<T>& self_kv,
                                           const KVCache<T>& cross_kv, DecodeScratch<T>& d) const {
    MatView<T> X = view(d.X), R = ensure(d.tmp, X.rows, X.cols);
    std::copy(X.data, X.data + X.size(), R.data);
    self_attn.append_kv(store, X, self_kv);
    self_attn.attend_cached(store, X, q0, self_kv, R, d.attn, true);  // line 14
    norm3.forward(store, R, X, d.norm);                               // line 15
    std::copy(X.data, X.data + X.size(), R.data);
    cross_attn.attend_cached(store, X, q0, cross_kv, R, d.attn, true);  // line 16
    norm4.forward(store, R, X, d.norm);                                 // line 17
    std::copy(X.data, X.data + X.size(), R.data);
    mlp.forward(store, X, R, d.mlp);                                    // line 18
    norm5.forward(store, R, X, d.norm);                                 // line 19
}

namespace {
// The scored columns of the listings' losses and their targets:
// Algorithms 11 and 13 line 5: every position t < ℓ−1 of each sequence, target x[t+1];
void next_token_targets(const Tokens& x, std::vector<index_t>& cols, std::vector<index_t>& targets) {
    cols.clear();
    targets.clear();
    for (index_t b = 0; b < x.s.count(); ++b)
        for (index_t t = 0; t + 1 < x.s.len(b); ++t) {
            cols.push_back(x.s.begin(b) + t);
            targets.push_back(x.ids[x.s.begin(b) + t + 1]);
        }
}
// Algorithm 12 line 9: T̃ = {t : x̃[t] = mask_token}, target x[t].
void masked_targets(const Tokens& x_tilde, const index_t* x, index_t mask_token, std::vector<index_t>& cols,
                    std::vector<index_t>& targets) {
    cols.clear();
    targets.clear();
    for (index_t t = 0; t < x_tilde.s.total(); ++t)
        if (x_tilde.ids[t] == mask_token) {
            cols.push_back(t);
            targets.push_back(x[t]);
        }
}
}  // namespace

// ========================================== the models ================================================
const char* name(AttentionKind kind) {
    switch (kind) {
        case AttentionKind::Encoder: return "enc";
        case AttentionKind::Decoder: return "dec";
        case AttentionKind::Cross: return "cross";
    }
    return "?";
}

template <class T>
CMatView<T> Model<T>::attention_weights(AttentionKind kind, index_t l, index_t b, index_t h) const {
    const index_t L = layers(kind);
    if (L == 0) throw ValueError(std::string(arch_name()) + " has no '" + name(kind) + "' attention");
    if (!last_.done)
        throw ValueError("attention_weights() called before any forward call: the attention matrices are those of "
                         "the last forward call (decoding with caches keeps none)");
    auto in_range = [](index_t v, index_t n, const char* what, const std::string& why) {
        if (v < 0 || v >= n)
            throw IndexError(std::string(what) + " " + std::to_string(v) + " is out of range [0, " + std::to_string(n) + ")" + why);
    };
    in_range(l, L, "layer", "");
    const index_t B = last_.x.count();
    in_range(b, B, "seq", ": the last forward call had " + std::to_string(B) + (B == 1 ? " sequence" : " sequences"));
    in_range(h, cfg.H, "head", "");
    const MHAttentionCache<T>& c = attention_cache(kind, l);
    c.ensure_weights();  // after a tiled forward: computed now (Algorithm 4 lines 4–6 on the saved Q, K)
    FT_CHECK(index_t(c.A_off.size()) >= B * cfg.H, "attention cache smaller than the recorded batch");
    // rows: the keys' sequence (x for the decoder's self-attention, z otherwise); columns: the queries'
    const index_t rows = kind == AttentionKind::Decoder ? last_.x.len(b) : last_.z.len(b);
    const index_t cols = kind == AttentionKind::Encoder ? last_.z.len(b) : last_.x.len(b);
    return {c.A.data() + c.A_off[std::size_t(b * cfg.H + h)], rows, cols};
}

template <class T>
Rng Model<T>::make_head_and_allocate(index_t d) {
    unemb = cfg.tied ? std::make_unique<Unembedding<T>>(cfg.n_vocab, d, tok.W_e)
                     : std::make_unique<Unembedding<T>>(cfg.n_vocab, d, store, "W_u");
    if (cfg.unembed_bias) unemb->add_bias(store, "b_u");  // BERT's option (0 at initialisation)
    store.allocate();
    Rng rng(cfg.seed);
    tok.init(store, rng, cfg.init_std);
    pos.init(store, rng, cfg.init_std);
    return rng;
}

template <class T>
void Model<T>::embed(const Tokens& x, Matrix<T>& X) const {
    MatView<T> E = ensure(X, cfg.d_e, x.s.total());
    tok.forward(store, x.ids, x.s.total(), E);  // line 2: e_t ← W_e[:, x[t]] …
    pos.forward_seqs(store, x.s, E);            //          … + W_p[:, t]   (line 3: X ← [e_1, …, e_ℓ])
}

// Dropout after the embedding sum (line 3): X ← Dropout(X | p_embed, M) in training; the mask is cleared otherwise
template <class T>
void Model<T>::embed_dropout(Matrix<T>& X, DropSite site, DropoutMask& m) const {
    if (train_) {
        train_->apply(train_->embed, drop_place(0, 0, site), view(X), m);
    } else {
        m.p = 0;
        m.keep.clear();
    }
}
template <class T>
void Model<T>::embed_dropout_backward(const DropoutMask& m, MatView<T> dX) const {
    if (m.active()) dropout_backward<T>(m.p, m.keep.data(), dX.data, dX.size());  // D2
}

template <class T>
void Model<T>::embed_backward(const Tokens& x, CMatView<T> dX) {
    tok.backward(store, x.ids, x.s.total(), dX);
    pos.backward_seqs(store, x.s, dX);
}

template <class T>
double Model<T>::head_loss(CMatView<T> X, const std::vector<index_t>& cols, const std::vector<index_t>& targets,
                           MatView<T>* dX, BackwardWork<T>& w, index_t* n_correct) {
    const index_t nt = index_t(cols.size());
    if (n_correct) *n_correct = 0;
    if (nt == 0) return 0.0;
    MatView<T> Xs = ensure(w.Xsel, X.rows, nt);
    for (index_t k = 0; k < nt; ++k) std::copy(X.col(cols[std::size_t(k)]), X.col(cols[std::size_t(k)]) + X.rows, Xs.col(k));
    MatView<T> Z = ensure(w.logits, cfg.n_vocab, nt);
    unemb->logits(store, Xs, Z);                                              // W_u X at the scored columns
    const double loss = nll_and_grad<T>(Z, targets.data(), T(1), n_correct);  // −Σ log softmax(·)[target]; Z ← ∂loss/∂Z
    if (dX) {
        MatView<T> dXs = zeros(w.dXsel, X.rows, nt);
        unemb->backward_logits(store, Xs, Z, dXs);  // dW_u += dZ Xᵀ, dXs = W_uᵀ dZ
        for (index_t k = 0; k < nt; ++k) {
            T* d = dX->col(cols[std::size_t(k)]);
            const T* s = dXs.col(k);
            for (index_t i = 0; i < X.rows; ++i) d[i] += s[i];
        }
    }
    return loss;
}

template <class T>
double Model<T>::run_loss(const Batch& in, bool grad, index_t* n_scored, index_t* n_correct) {
    // training (grad) with a dropout rate: the forward drops, keyed by (dropout_seed, dropout_step); evaluation never
    Dropout d{cfg.embed_dropout, cfg.attn_dropout, cfg.resid_dropout, dropout_seed, dropout_step};
    struct Reset {
        const Dropout*& p;
        ~Reset() { p = nullptr; }
    } reset{train_};
    train_ = grad && cfg.has_dropout() ? &d : nullptr;
    run_forward(in);
    train_ = nullptr;
    if (grad) ++dropout_step;
    BackwardWork<T>& w = work_;
    score(in, w.cols, w.targets);
    if (n_scored) *n_scored = index_t(w.cols.size());
    if (!grad) return head_loss(out(), w.cols, w.targets, nullptr, w, n_correct);
    store.zero_grad();
    if (w.cols.empty()) {  // nothing scored: the listing's empty sum, every gradient 0
        if (n_correct) *n_correct = 0;
        return 0.0;
    }
    MatView<T> dHead = zeros(w.dHead, out().rows, out().cols);
    const double loss = head_loss(out(), w.cols, w.targets, &dHead, w, n_correct);
    run_backward(in, w);
    return loss;
}

// ======================================== Algorithm 10 ================================================
template <class T>
DTransformer<T>::DTransformer(const ModelConfig& c) : Model<T>(resolve(c, Arch::D)) {
    const ModelConfig& g = cfg;
    const Activation act = g.gelu == Gelu::Tanh ? Activation::GeluTanh : Activation::Gelu;
    for (index_t l = 0; l < g.L; ++l) layer.push_back(std::make_unique<PreLNDecoderBlock<T>>(g, act, store, layer_prefix("layers", l)));
    norm_f = std::make_unique<Norm<T>>(g.norm, g.d_e, g.eps, store, "gamma", "beta");
    Rng rng = this->make_head_and_allocate(g.d_e);
    const double s = g.init_std, s_out = g.init_std / std::sqrt(2.0 * double(g.L));
    for (auto& b : layer) b->init(store, rng, s, s_out);
    norm_f->init(store);
    this->unemb->init(store, rng, s);
    acts_.resize(std::size_t(g.L));
    stream_.resize(std::size_t(g.L + 1));
}

// x -> X after line 10 (kept in Xf_), every layer's activations kept
template <class T>
void DTransformer<T>::forward(const Tokens& x) {
    // RoPE and ALiBi have no table of positions: the model runs on any length (ℓ_max is the training
    // length there; Algorithm 14 with context = Full uses this, inference.hpp)
    validate(x, cfg, "x");
    this->last_.done = false;
    const index_t n = x.s.total(), d_e = cfg.d_e;
    this->embed(x, stream_[0]);                                             // lines 1–3
    this->embed_dropout(stream_[0], DropSite::EmbedX, this->drop_embed_);  // (training) X ← Dropout(X)
    for (index_t l = 0; l < cfg.L; ++l) {  // line 4
        poll();
        const std::size_t i = std::size_t(l);
        layer[i]->forward(store, view(stream_[i]), x.s, ensure(stream_[i + 1], d_e, n), acts_[i], this->train_,
                          drop_place(1, std::uint64_t(l), DropSite::EmbedX));  // lines 5–8
    }
    norm_f->forward(store, view(stream_[std::size_t(cfg.L)]), ensure(Xf_, d_e, n), norm_gamma_);  // line 10: X ← layer_norm(X | γ, β)
    this->last_ = LastForward{true, x.s, x.s};
}

// from w.dHead = ∂loss/∂(output of line 10)
template <class T>
void DTransformer<T>::run_backward(const typename Model<T>::Batch& in, BackwardWork<T>& w) {
    MatView<T> P = zeros(w.P, cfg.d_e, in.x->s.total());
    norm_f->backward(store, view(w.dHead), norm_gamma_, P);  // line 10
    for (index_t l = cfg.L - 1; l >= 0; --l) {
        poll();
        layer[std::size_t(l)]->backward(store, in.x->s, acts_[std::size_t(l)], w);  // lines 8–5
    }
    this->embed_dropout_backward(this->drop_embed_, view(w.P));
    this->embed_backward(*in.x, view(w.P));  // line 2
}

// Algorithm 13 line 5: loss = −Σ_{t=1}^{ℓ−1} log P[x[t+1], t], for every sequence of the batch
template <class T>
void DTransformer<T>::score(const typename Model<T>::Batch& in, std::vector<index_t>& cols, std::vector<index_t>& targets) const {
    next_token_targets(*in.x, cols, targets);
}

// Algorithm 10 for n new tokens at positions d.len, …, with the keys and values of the earlier tokens
// cached per layer (line 6 attends over them); only the last token's logits are produced (line 11).
template <class T>
void DTransformer<T>::decode(Decoder& d, const index_t* ids, index_t n, T* z) const {
    // RoPE and ALiBi have no table of positions: their cached decoding may run past ℓ_max (docs/variants.md)
    if (!in_attention(cfg.positional) && d.len + n > cfg.l_max)
        throw ValueError("decoding past l_max = " + std::to_string(cfg.l_max) + " (context would be " +
                         std::to_string(d.len + n) + ")");
    for (index_t t = 0; t < n; ++t)
        if (ids[t] < 0 || ids[t] >= cfg.n_vocab) throw IndexError("token id " + std::to_string(ids[t]) + " out of range");
    d.kv.resize(std::size_t(cfg.L));
    MatView<T> X = ensure(d.w.X, cfg.d_e, n);
    this->tok.forward(store, ids, n, X);                       // line 2, new tokens only
    this->pos.forward_seqs(store, Seqs::single(n), X, d.len);  //   at positions d.len, d.len+1, …
    for (index_t l = 0; l < cfg.L; ++l)
        layer[std::size_t(l)]->forward_cached(store, X, d.len, d.kv[std::size_t(l)], d.w);  // lines 5–8
    MatView<T> last = ensure(d.w.tmp, cfg.d_e, 1);
    norm_f->forward(store, X.cols_range(n - 1, 1), last, d.w.norm);   // line 10 (last column)
    this->unemb->logits(store, last, MatView<T>(z, cfg.n_vocab, 1));  // line 11, as logits
    d.len += n;
}

// ======================================== Algorithm 9 =================================================
template <class T>
ETransformer<T>::ETransformer(const ModelConfig& c) : Model<T>(resolve(c, Arch::E)) {
    const ModelConfig& g = cfg;
    if (g.n_segments > 0) W_s = store.matrix("W_s", g.d_e, g.n_segments);  // BERT options, after W_e, W_p
    if (g.embed_norm) norm_e = std::make_unique<Norm<T>>(NormKind::Layer, g.d_e, g.eps, store, "gamma_e", "beta_e");
    for (index_t l = 0; l < g.L; ++l) layer.push_back(std::make_unique<PostLNEncoderBlock<T>>(g, gelu(), store, layer_prefix("layers", l)));
    W_f = store.matrix("W_f", g.d_f, g.d_e);
    b_f = store.vector("b_f", g.d_f);
    norm_f = std::make_unique<Norm<T>>(NormKind::Layer, g.d_f, g.eps, store, "gamma", "beta");
    Rng rng = this->make_head_and_allocate(g.d_f);
    const double s = g.init_std, s_out = g.init_std / std::sqrt(2.0 * double(g.L));
    if (g.n_segments > 0) store.normal(W_s.offset, g.d_e * g.n_segments, s, rng);  // as W_e, W_p
    if (norm_e) norm_e->init(store);
    for (auto& b : layer) b->init(store, rng, s, s_out);
    store.normal(W_f.offset, g.d_f * g.d_e, s, rng);
    store.fill(b_f.offset, g.d_f, T(0));
    norm_f->init(store);
    this->unemb->init(store, rng, s);
    acts_.resize(std::size_t(g.L));
    stream_.resize(std::size_t(g.L + 1));
}

template <class T>
void ETransformer<T>::forward(const Tokens& x, const index_t* seg) {
    validate(x, cfg, "x");
    const index_t n = x.s.total(), d_e = cfg.d_e;
    if (seg && cfg.n_segments <= 0) throw ValueError("segment ids given, but the model has no segment embeddings (n_segments = 0)");
    if (seg)
        for (index_t t = 0; t < n; ++t)
            if (seg[t] < 0 || seg[t] >= cfg.n_segments)
                throw IndexError("segment id " + std::to_string(seg[t]) + " at column " + std::to_string(t) +
                                 " is out of range [0, " + std::to_string(cfg.n_segments) + ")");
    this->last_.done = false;
    const bool bert_embed = cfg.n_segments > 0 || cfg.embed_norm;
    Matrix<T>& E = cfg.embed_norm ? E_ : stream_[0];
    this->embed(x, E);  // lines 1–3
    if (bert_embed) {
        MatView<T> Ev = view(E);
        if (cfg.n_segments > 0) {  // BERT: e_t += W_s[:, seg[t]]  (beyond the listing's line 2)
            CMatView<T> Ws = store.W(W_s);
            for (index_t t = 0; t < n; ++t) {
                const T* w = Ws.col(seg ? seg[t] : 0);
                T* e = Ev.col(t);
                for (index_t i = 0; i < d_e; ++i) e[i] += w[i];
            }
        }
        if (cfg.embed_norm)  // BERT: X[:, t] ← layer_norm(X[:, t] | γ_e, β_e)  (after line 3)
            norm_e->forward(store, view(E_), ensure(stream_[0], d_e, n), norm_e_cache_);
    }
    this->embed_dropout(stream_[0], DropSite::EmbedX, this->drop_embed_);  // (training) X ← Dropout(X), after BERT's norm
    for (index_t l = 0; l < cfg.L; ++l) {  // line 4
        poll();
        const std::size_t i = std::size_t(l);
        layer[i]->forward(store, view(stream_[i]), x.s, ensure(stream_[i + 1], d_e, n), acts_[i], this->train_,
                          drop_place(1, std::uint64_t(l), DropSite::EmbedX));  // lines 5–8
    }
    MatView<T> F = ensure(F_, cfg.d_f, n), G = ensure(G_, cfg.d_f, n);
    affine<T>(store.W(W_f), view(stream_[std::size_t(cfg.L)]), store.v(b_f), F);  // line 10: X ← GELU(W_f X + b_f 1ᵀ)
    activation_forward<T>(gelu(), F, G);
    norm_f->forward(store, G, ensure(Xf_, cfg.d_f, n), norm_gamma_);  // line 11: X ← layer_norm(X | γ, β)
    this->last_ = LastForward{true, x.s, x.s};
}

template <class T>
void ETransformer<T>::run_backward(const typename Model<T>::Batch& in, BackwardWork<T>& w) {
    const Tokens& x = *in.x;
    const index_t n = x.s.total();
    // line 11, then line 10
    MatView<T> dG = zeros(w.Q, cfg.d_f, n);
    norm_f->backward(store, view(w.dHead), norm_gamma_, dG);
    activation_backward<T>(gelu(), view(F_), dG, dG);
    MatView<T> P = zeros(w.P, cfg.d_e, n);
    affine_backward<T>(store.W(W_f), view(stream_[std::size_t(cfg.L)]), dG, store.dW(W_f).data, store.dv(b_f), P.data);
    for (index_t l = cfg.L - 1; l >= 0; --l) {
        poll();
        const std::size_t i = std::size_t(l);
        layer[i]->backward(store, view(stream_[i]), x.s, acts_[i], w);  // lines 8–5
    }
    this->embed_dropout_backward(this->drop_embed_, view(w.P));
    CMatView<T> dE = view(w.P);
    if (cfg.embed_norm) {  // BERT: layer_norm(· | γ_e, β_e) after line 3
        MatView<T> dEn = zeros(w.Q, cfg.d_e, n);
        norm_e->backward(store, view(w.P), norm_e_cache_, dEn);
        dE = dEn;
    }
    if (cfg.n_segments > 0) {  // BERT: dW_s[:, seg[t]] += dE[:, t]
        MatView<T> dWs = store.dW(W_s);
        for (index_t t = 0; t < n; ++t) {
            T* g = dWs.col(in.segments ? in.segments[t] : 0);
            const T* d = dE.col(t);
            for (index_t i = 0; i < cfg.d_e; ++i) g[i] += d[i];
        }
    }
    this->embed_backward(x, dE);  // line 2
}

// Algorithm 12 line 9: loss = −Σ_{t∈T̃} log P[x[t], t],  T̃ = {t : x̃[t] = mask_token}
template <class T>
void ETransformer<T>::score(const typename Model<T>::Batch& in, std::vector<index_t>& cols, std::vector<index_t>& targets) const {
    masked_targets(*in.x, in.x_orig, cfg.mask_token(), cols, targets);
}

// ======================================== Algorithm 8 =================================================
template <class T>
EDTransformer<T>::EDTransformer(const ModelConfig& c) : Model<T>(resolve(c, Arch::ED)) {
    const ModelConfig& g = cfg;
    for (index_t l = 0; l < g.L_enc; ++l)
        enc_layer.push_back(std::make_unique<PostLNEncoderBlock<T>>(g, Activation::Relu, store, layer_prefix("enc", l)));
    for (index_t l = 0; l < g.L_dec; ++l)
        dec_layer.push_back(std::make_unique<PostLNDecoderBlock<T>>(g, store, layer_prefix("dec", l)));
    Rng rng = this->make_head_and_allocate(g.d_e);
    const double s = g.init_std, s_out = g.init_std / std::sqrt(2.0 * double(g.L_enc + g.L_dec));
    for (auto& b : enc_layer) b->init(store, rng, s, s_out);
    for (auto& b : dec_layer) b->init(store, rng, s, s_out);
    this->unemb->init(store, rng, s);
    enc_acts_.resize(std::size_t(g.L_enc));
    dec_acts_.resize(std::size_t(g.L_dec));
    zstream_.resize(std::size_t(g.L_enc + 1));
    xstream_.resize(std::size_t(g.L_dec + 1));
}

// lines 1–9: z -> Z (stream[L_enc])
template <class T>
void EDTransformer<T>::encoder_forward(const Tokens& z, std::vector<typename PostLNEncoderBlock<T>::Acts>& acts,
                                       std::vector<Matrix<T>>& stream, const Dropout* drop, DropoutMask* embed_mask) const {
    const index_t n = z.s.total(), d_e = cfg.d_e;
    acts.resize(std::size_t(cfg.L_enc));
    stream.resize(std::size_t(cfg.L_enc + 1));
    this->embed(z, stream[0]);  // lines 1–3
    if (embed_mask) this->embed_dropout(stream[0], DropSite::EmbedZ, *embed_mask);  // (training) Z ← Dropout(Z)
    for (index_t l = 0; l < cfg.L_enc; ++l) {  // line 4
        poll();
        const std::size_t i = std::size_t(l);
        enc_layer[i]->forward(store, view(stream[i]), z.s, ensure(stream[i + 1], d_e, n), acts[i], drop,
                              drop_place(1, std::uint64_t(l), DropSite::EmbedX));  // lines 5–8
    }
}

template <class T>
void EDTransformer<T>::forward(const Tokens& z, const Tokens& x) {
    validate(z, cfg.n_vocab, cfg.l_max, "z");
    validate(x, cfg, "x");
    if (z.s.count() != x.s.count())
        throw ValueError("z and x must hold the same number of sequences, got " + std::to_string(z.s.count()) + " and " +
                         std::to_string(x.s.count()));
    this->last_.done = false;
    encoder_forward(z, enc_acts_, zstream_, this->train_, &drop_embed_z_);  // lines 1–9
    CMatView<T> Z = view(zstream_[std::size_t(cfg.L_enc)]);
    const index_t n = x.s.total(), d_e = cfg.d_e;
    this->embed(x, xstream_[0]);                                              // lines 10–12
    this->embed_dropout(xstream_[0], DropSite::EmbedX, this->drop_embed_);  // (training) X ← Dropout(X)
    for (index_t l = 0; l < cfg.L_dec; ++l) {  // line 13 (erratum: the listing loops i, its body indexes l)
        poll();
        const std::size_t i = std::size_t(l);
        dec_layer[i]->forward(store, view(xstream_[i]), x.s, Z, z.s, ensure(xstream_[i + 1], d_e, n), dec_acts_[i],
                              this->train_, drop_place(2, std::uint64_t(l), DropSite::EmbedX));  // lines 14–19
    }
    this->last_ = LastForward{true, z.s, x.s};
}

template <class T>
void EDTransformer<T>::run_backward(const typename Model<T>::Batch& in, BackwardWork<T>& w) {
    const Tokens &z = *in.z, &x = *in.x;
    CMatView<T> Z = view(zstream_[std::size_t(cfg.L_enc)]);
    MatView<T> dZ = zeros(w.dZ, cfg.d_e, z.s.total());
    copy_into(w.P, CMatView<T>(view(w.dHead)));  // ∂/∂X of line 21's input
    for (index_t l = cfg.L_dec - 1; l >= 0; --l) {
        poll();
        const std::size_t i = std::size_t(l);
        dec_layer[i]->backward(store, view(xstream_[i]), x.s, Z, z.s, dec_acts_[i], dZ, w);  // lines 19–14
    }
    this->embed_dropout_backward(this->drop_embed_, view(w.P));
    this->embed_backward(x, view(w.P));  // line 11
    // the encoder, from ∂/∂Z accumulated over every decoder layer's cross-attention
    copy_into(w.P, CMatView<T>(dZ));
    for (index_t l = cfg.L_enc - 1; l >= 0; --l) {
        poll();
        const std::size_t i = std::size_t(l);
        enc_layer[i]->backward(store, view(zstream_[i]), z.s, enc_acts_[i], w);  // lines 8–5
    }
    this->embed_dropout_backward(drop_embed_z_, view(w.P));
    this->embed_backward(z, view(w.P));  // line 2
}

// Algorithm 11 line 5: loss = −Σ_{t=1}^{ℓ−1} log P[x[t+1], t]
template <class T>
void EDTransformer<T>::score(const typename Model<T>::Batch& in, std::vector<index_t>& cols, std::vector<index_t>& targets) const {
    next_token_targets(*in.x, cols, targets);
}

template <class T>
void EDTransformer<T>::encode(Decoder& d, const index_t* z, index_t l_z) const {
    Tokens zt{z, Seqs::single(l_z)};
    validate(zt, cfg.n_vocab, cfg.l_max, "z");
    encoder_forward(zt, d.enc_acts, d.zstream);  // lines 1–9, once per context
    CMatView<T> Z = view(d.zstream[std::size_t(cfg.L_enc)]);
    d.self_kv.assign(std::size_t(cfg.L_dec), KVCache<T>());
    d.cross_kv.assign(std::size_t(cfg.L_dec), KVCache<T>());
    for (index_t l = 0; l < cfg.L_dec; ++l) dec_layer[std::size_t(l)]->cross_attn.append_kv(store, Z, d.cross_kv[std::size_t(l)]);
    d.len = 0;
}

// lines 10–21 for n new tokens of x̂ at positions d.len, …: self-attention over cached keys and values,
// cross-attention over the cached keys and values of Z; logits of the last token.
template <class T>
void EDTransformer<T>::decode(Decoder& d, const index_t* ids, index_t n, T* logits_out) const {
    if (d.len + n > cfg.l_max)
        throw ValueError("decoding past l_max = " + std::to_string(cfg.l_max));
    FT_CHECK(index_t(d.self_kv.size()) == cfg.L_dec, "EDTransformer::decode before encode()");
    for (index_t t = 0; t < n; ++t)
        if (ids[t] < 0 || ids[t] >= cfg.n_vocab) throw IndexError("token id " + std::to_string(ids[t]) + " out of range");
    MatView<T> X = ensure(d.w.X, cfg.d_e, n);
    this->tok.forward(store, ids, n, X);                       // line 11
    this->pos.forward_seqs(store, Seqs::single(n), X, d.len);
    for (index_t l = 0; l < cfg.L_dec; ++l)
        dec_layer[std::size_t(l)]->forward_cached(store, d.len, d.self_kv[std::size_t(l)], d.cross_kv[std::size_t(l)], d.w);  // lines 14–19
    this->unemb->logits(store, X.cols_range(n - 1, 1), MatView<T>(logits_out, cfg.n_vocab, 1));  // line 21, as logits
    d.len += n;
}

// ===================================== dropout masks (inspection) =====================================
namespace {
template <class T>
void add_mask(std::vector<typename Model<T>::MaskRef>& out, const std::string& name, const DropoutMask& m,
              bool weights = false, AttentionKind kind = AttentionKind::Decoder, index_t l = 0, const T* A0 = nullptr) {
    if (m.active()) out.push_back({name, &m, weights, kind, l, A0});
}
// an attention's weights' mask (after a tiled forward: redrawn now, with its A, so A0 is where it lies)
template <class T>
void add_weights_mask(std::vector<typename Model<T>::MaskRef>& out, const std::string& name, const MHAttentionCache<T>& c,
                      AttentionKind kind, index_t l) {
    if (!c.drop.active()) return;
    c.ensure_weights();
    add_mask<T>(out, name, c.drop, true, kind, l, c.A.data());
}

// the masks of blocks with one self-attention (D, E, ED's encoder), their layers named prefix.l.
template <class T, class Acts>
void self_block_masks(std::vector<typename Model<T>::MaskRef>& r, const char* prefix, const std::vector<Acts>& acts,
                      AttentionKind kind) {
    for (index_t l = 0; l < index_t(acts.size()); ++l) {
        const auto& a = acts[std::size_t(l)];
        const std::string p = layer_prefix(prefix, l);
        add_weights_mask<T>(r, p + "attn.weights", a.attn, kind, l);
        add_mask<T>(r, p + "attn.out", a.drop_attn);
        add_mask<T>(r, p + "mlp.out", a.drop_mlp);
    }
}
}  // namespace

template <class T>
std::vector<typename Model<T>::MaskRef> DTransformer<T>::dropout_masks() const {
    std::vector<typename Model<T>::MaskRef> r;
    add_mask<T>(r, "embed", this->drop_embed_);
    self_block_masks<T>(r, "layers", acts_, self_attention);
    return r;
}
template <class T>
std::vector<typename Model<T>::MaskRef> ETransformer<T>::dropout_masks() const {
    std::vector<typename Model<T>::MaskRef> r;
    add_mask<T>(r, "embed", this->drop_embed_);
    self_block_masks<T>(r, "layers", acts_, self_attention);
    return r;
}
template <class T>
std::vector<typename Model<T>::MaskRef> EDTransformer<T>::dropout_masks() const {
    std::vector<typename Model<T>::MaskRef> r;
    add_mask<T>(r, "embed.z", drop_embed_z_);
    self_block_masks<T>(r, "enc", enc_acts_, AttentionKind::Encoder);
    add_mask<T>(r, "embed.x", this->drop_embed_);
    for (index_t l = 0; l < index_t(dec_acts_.size()); ++l) {
        const auto& a = dec_acts_[std::size_t(l)];
        const std::string p = layer_prefix("dec", l);
        add_weights_mask<T>(r, p + "attn.weights", a.self_attn, AttentionKind::Decoder, l);
        add_mask<T>(r, p + "attn.out", a.drop_self);
        add_weights_mask<T>(r, p + "cross_attn.weights", a.cross_attn, AttentionKind::Cross, l);
        add_mask<T>(r, p + "cross_attn.out", a.drop_cross);
        add_mask<T>(r, p + "mlp.out", a.drop_mlp);
    }
    return r;
}

template class PreLNDecoderBlock<float>;
template class PreLNDecoderBlock<double>;
template class PostLNEncoderBlock<float>;
template class PostLNEncoderBlock<double>;
template class PostLNDecoderBlock<float>;
template class PostLNDecoderBlock<double>;
template class Model<float>;
template class Model<double>;
template class DTransformer<float>;
template class DTransformer<double>;
template class ETransformer<float>;
template class ETransformer<double>;
template class EDTransformer<float>;
template class EDTransformer<double>;

}  // namespace ft
