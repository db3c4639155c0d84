// Algorithms 8, 9, 10: forward passes line by line, and their backward passes beside them.
#include "formal_transformers/transformers.hpp"

#include <cmath>

#include "formal_transformers/blas.hpp"

namespace ft {

// ===================================== hyperparameters, input checks ==================================
ModelConfig resolve(ModelConfig c, Arch arch) {
    auto positive = [](index_t v, const char* name) {
        if (v <= 0) throw ValueError(std::string(name) + " must be a positive integer, got " + std::to_string(v));
    };
    positive(c.n_vocab, "n_vocab");
    positive(c.l_max, "l_max");
    if (arch == Arch::ED) {
        positive(c.L_enc, "L_enc");
        positive(c.L_dec, "L_dec");
    } else {
        positive(c.L, "L");
    }
    positive(c.H, "H");
    positive(c.d_e, "d_e");
    positive(c.d_mlp, "d_mlp");
    if (arch == Arch::E) positive(c.d_f, "d_f");
    if (arch == Arch::E && c.n_vocab < 4)
        throw ValueError("n_vocab must be >= 4: the vocabulary ends with mask_token, bos_token, eos_token (paper §4)");
    if (arch == Arch::ED && c.n_vocab < 3)
        throw ValueError("n_vocab must be >= 3: decoding needs bos_token = n_vocab-2 and eos_token = n_vocab-1");
    if ((c.d_attn <= 0 || c.d_mid <= 0) && c.d_e % c.H != 0)
        throw ValueError("d_e = " + std::to_string(c.d_e) + " is not divisible by H = " + std::to_string(c.H) +
                         ": pass d_attn and d_mid explicitly, or choose H dividing d_e");
    if (c.d_attn <= 0) c.d_attn = c.d_e / c.H;
    if (c.d_mid <= 0) c.d_mid = c.d_e / c.H;
    if (!(c.eps >= 0)) throw ValueError("eps must be >= 0");
    if (!(c.init_std > 0)) throw ValueError("init_std must be > 0");
    if (arch == Arch::E && c.tied && c.d_f != c.d_e)
        throw ValueError("tied=True needs d_f == d_e: W_u = W_eᵀ is N_V × d_e, but ETransformer's W_u is N_V × d_f");
    if (arch != Arch::D && c.norm != NormKind::Layer) throw ValueError("norm='rms' is a DTransformer option (Gopher)");
    return c;
}

void validate(const Tokens& x, index_t n_vocab, index_t l_max, const char* what) {
    if (x.s.count() <= 0) throw ValueError(std::string(what) + " is an empty batch");
    for (index_t b = 0; b < x.s.count(); ++b) {
        const std::string name = x.s.count() == 1 ? std::string(what) : std::string(what) + "[" + std::to_string(b) + "]";
        const index_t l = x.s.len(b);
        if (l <= 0) throw ValueError(name + " is an empty sequence");
        if (l > l_max)
            throw ValueError(name + " has length " + std::to_string(l) + " > l_max = " + std::to_string(l_max));
        for (index_t t = 0; t < l; ++t) {
            const index_t v = x.ids[x.s.begin(b) + t];
            if (v < 0 || v >= n_vocab)
                throw IndexError(name + ": token id " + std::to_string(v) + " at position " + std::to_string(t) +
                                 " is out of range [0, " + std::to_string(n_vocab) + ")");
        }
    }
}

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
void MLP<T>::init(ParamStore<T>& store, Rng& rng, double stddev, double out_stddev) const {
    store.normal(W_1.offset, d_mlp * d_e, stddev, rng);
    store.fill(b_1.offset, d_mlp, T(0));
    store.normal(W_2.offset, d_e * d_mlp, out_stddev, rng);
    store.fill(b_2.offset, d_e, T(0));
}
// Out += W_2 φ(W_1 X̃ + b_1 1ᵀ) + b_2 1ᵀ
template <class T>
void MLP<T>::forward(const ParamStore<T>& store, CMatView<T> Xt, MatView<T> Out, MLPCache<T>& c) const {
    MatView<T> Hp = ensure(c.Hpre, d_mlp, Xt.cols), A = ensure(c.Act, d_mlp, Xt.cols);
    affine<T>(store.W(W_1), Xt, store.v(b_1), Hp);     // W_mlp1 X̃ + b_mlp1 1ᵀ
    activation_forward<T>(act, Hp, A);                 // GELU or ReLU
    affine_add<T>(store.W(W_2), A, store.v(b_2), Out);  // X + W_mlp2 (…) + b_mlp2 1ᵀ
}
template <class T>
void MLP<T>::backward(ParamStore<T>& store, CMatView<T> Xt, const MLPCache<T>& c, CMatView<T> dOut, MatView<T> dXt,
                      Matrix<T>& dH) const {
    MatView<T> dh = zeros(dH, d_mlp, Xt.cols);
    affine_backward<T>(store.W(W_2), view(c.Act), dOut, store.dW(W_2).data, store.dv(b_2), dh.data);  // dAct = W_2ᵀ dOut
    activation_backward<T>(act, view(c.Hpre), dh, dh);                                               // dHpre = φ'(Hpre) ⊙ dAct
    affine_backward<T>(store.W(W_1), Xt, dh, store.dW(W_1).data, store.dv(b_1), dXt.data, dXt.ld);   // dX̃ += W_1ᵀ dHpre
}

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

// -------------------------------------------------------------------------------------------------------
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
    FT_CHECK(index_t(c.A_off.size()) >= B * cfg.H, "attention cache smaller than the recorded batch");
    // rows: the keys' sequence (x for the decoder's self-attention, z otherwise); columns: the queries'
    const index_t rows = kind == AttentionKind::Decoder ? last_.x.len(b) : last_.z.len(b);
    const index_t cols = kind == AttentionKind::Encoder ? last_.z.len(b) : last_.x.len(b);
    return {c.A.data() + c.A_off[std::size_t(b * cfg.H + h)], rows, cols};
}

template <class T>
void Model<T>::embed(const Tokens& x, Matrix<T>& X) const {
    MatView<T> E = ensure(X, cfg.d_e, x.s.total());
    tok.forward(store, x.ids, x.s.total(), E);  // line 2: e_t ← W_e[:, x[t]] …
    pos.forward_seqs(store, x.s, E);            //          … + W_p[:, t]   (line 3: X ← [e_1, …, e_ℓ])
}

template <class T>
void Model<T>::embed_backward(const Tokens& x, CMatView<T> dX) {
    tok.backward(store, x.ids, x.s.total(), dX);
    pos.backward_seqs(store, x.s, dX);
}

template <class T>
double Model<T>::head_loss(const Unembedding<T>& u, CMatView<T> X, const std::vector<index_t>& cols,
                           const std::vector<index_t>& targets, MatView<T>* dX, BackwardWork<T>& w,
                           index_t* n_correct) {
    const index_t nt = index_t(cols.size());
    if (n_correct) *n_correct = 0;
    if (nt == 0) return 0.0;
    MatView<T> Xs = ensure(w.Xsel, X.rows, nt);
    for (index_t k = 0; k < nt; ++k) std::copy(X.col(cols[std::size_t(k)]), X.col(cols[std::size_t(k)]) + X.rows, Xs.col(k));
    MatView<T> Z = ensure(w.logits, cfg.n_vocab, nt);
    u.logits(store, Xs, Z);                                  // W_u X at the scored columns
    const double loss = nll_and_grad<T>(Z, targets.data(), T(1), n_correct);  // −Σ log softmax(·)[target]; Z ← ∂loss/∂Z
    if (dX) {
        MatView<T> dXs = zeros(w.dXsel, X.rows, nt);
        u.backward_logits(store, Xs, Z, dXs);  // dW_u += dZ Xᵀ, dXs = W_uᵀ dZ
        for (index_t k = 0; k < nt; ++k) {
            T* d = dX->col(cols[std::size_t(k)]);
            const T* s = dXs.col(k);
            for (index_t i = 0; i < X.rows; ++i) d[i] += s[i];
        }
    }
    return loss;
}

// ======================================== Algorithm 10 ================================================
template <class T>
DTransformer<T>::DTransformer(const ModelConfig& c) : Model<T>(resolve(c, Arch::D)) {
    const ModelConfig& g = cfg;
    const Activation act = g.gelu == Gelu::Tanh ? Activation::GeluTanh : Activation::Gelu;
    for (index_t l = 0; l < g.L; ++l) {
        const std::string p = layer_prefix("layers", l);
        norm1.push_back(std::make_unique<Norm<T>>(g.norm, g.d_e, g.eps, store, p + "gamma1", p + "beta1"));
        attn.push_back(std::make_unique<MHAttention<T>>(g.H, g.d_e, g.d_e, g.d_attn, g.d_mid, g.d_e,
                                                        Mask::unidirectional(), store, p + "attn."));
        norm2.push_back(std::make_unique<Norm<T>>(g.norm, g.d_e, g.eps, store, p + "gamma2", p + "beta2"));
        mlp.push_back(std::make_unique<MLP<T>>(g.d_e, g.d_mlp, act, store, p, "W_mlp1", "b_mlp1", "W_mlp2", "b_mlp2"));
    }
    norm_f = std::make_unique<Norm<T>>(g.norm, g.d_e, g.eps, store, "gamma", "beta");
    unemb = g.tied ? std::make_unique<Unembedding<T>>(g.n_vocab, g.d_e, this->tok.W_e)
                   : std::make_unique<Unembedding<T>>(g.n_vocab, g.d_e, store, "W_u");
    store.allocate();
    Rng rng(g.seed);
    const double s = g.init_std, s_out = g.init_std / std::sqrt(2.0 * double(g.L));
    this->tok.init(store, rng, s);
    this->pos.init(store, rng, s);
    for (index_t l = 0; l < g.L; ++l) {
        norm1[std::size_t(l)]->init(store);
        attn[std::size_t(l)]->init(store, rng, s, s_out);
        norm2[std::size_t(l)]->init(store);
        mlp[std::size_t(l)]->init(store, rng, s, s_out);
    }
    norm_f->init(store);
    unemb->init(store, rng, s);
    acts_.resize(std::size_t(g.L));
    stream_.resize(std::size_t(g.L + 1));
}

// x -> X after line 10 (kept in Xf_), every layer's activations kept
template <class T>
void DTransformer<T>::forward(const Tokens& x) {
    validate(x, cfg.n_vocab, cfg.l_max, "x");
    this->last_.done = false;
    const index_t n = x.s.total(), d_e = cfg.d_e;
    this->embed(x, stream_[0]);  // lines 1–3
    for (index_t l = 0; l < cfg.L; ++l) {  // line 4
        poll();
        LayerActs<T>& a = acts_[std::size_t(l)];
        const std::size_t i = std::size_t(l);
        CMatView<T> X = view(stream_[i]);
        MatView<T> Xt1 = ensure(a.X_1, d_e, n);
        norm1[i]->forward(store, X, Xt1, a.n1);                                      // line 5: X̃ ← layer_norm(X | γ¹, β¹)
        MatView<T> Xa = copy_into(a.X_a, X);
        attn[i]->forward(store, Xt1, x.s, Xt1, x.s, Xa, a.attn, /*accumulate=*/true);  // line 6: X ← X + MHAttention(X̃)
        MatView<T> Xt2 = ensure(a.X_2, d_e, n);
        norm2[i]->forward(store, Xa, Xt2, a.n2);                                     // line 7: X̃ ← layer_norm(X | γ², β²)
        MatView<T> Xo = copy_into(stream_[i + 1], CMatView<T>(Xa));
        mlp[i]->forward(store, Xt2, Xo, a.mlp);                                       // line 8: X ← X + W_mlp2 GELU(…) + b_mlp2 1ᵀ
    }
    norm_f->forward(store, view(stream_[std::size_t(cfg.L)]), ensure(Xf_, d_e, n), nf_);  // line 10
    this->last_ = LastForward{true, x.s, x.s};
}

// from ∂loss/∂(output of line 10) in w.dHead
template <class T>
void DTransformer<T>::backward(const Tokens& x, BackwardWork<T>& w) {
    const index_t n = x.s.total(), d_e = cfg.d_e;
    MatView<T> P = zeros(w.P, d_e, n);
    norm_f->backward(store, view(w.dHead), nf_, P);  // line 10
    for (index_t l = cfg.L - 1; l >= 0; --l) {
        poll();
        const std::size_t i = std::size_t(l);
        LayerActs<T>& a = acts_[i];
        // line 8: X_out = X_a + MLP(X̃2)  ->  ∂/∂X̃2 into Q; ∂/∂X_a = P (+ line 7's part below)
        MatView<T> Q = zeros(w.Q, d_e, n);
        mlp[i]->backward(store, view(a.X_2), a.mlp, P, Q, w.dH);
        norm2[i]->backward(store, Q, a.n2, P);  // line 7
        // line 6: X_a = X_in + MHAttention(X̃1)  ->  ∂/∂X̃1 (queries, keys and values alike) into Q
        zero(Q);
        attn[i]->backward(store, view(a.X_1), x.s, view(a.X_1), x.s, a.attn, P, Q, Q, w.attn);
        norm1[i]->backward(store, Q, a.n1, P);  // line 5
    }
    this->embed_backward(x, P);  // line 2
}

template <class T>
double DTransformer<T>::loss_and_grad(const Tokens& x) {
    forward(x);
    BackwardWork<T>& w = work_;
    // Algorithm 13 line 5: loss = −Σ_{t=1}^{ℓ−1} log P[x[t+1], t], for every sequence of the batch
    next_token_targets(x, w.cols, w.targets);
    store.zero_grad();
    MatView<T> dHead = zeros(w.dHead, cfg.d_e, x.s.total());
    const double loss = this->head_loss(*unemb, out(), w.cols, w.targets, &dHead, w);
    backward(x, w);
    return loss;
}

template <class T>
double DTransformer<T>::loss(const Tokens& x, index_t* n_scored, index_t* n_correct) {
    forward(x);
    BackwardWork<T>& w = work_;
    next_token_targets(x, w.cols, w.targets);
    if (n_scored) *n_scored = index_t(w.cols.size());
    return this->head_loss(*unemb, out(), w.cols, w.targets, nullptr, w, n_correct);
}

// Algorithm 10 for n new tokens at positions d.len, …, with the keys and values of the earlier tokens
// cached per layer (line 6 attends over them); only the last token's logits are produced (line 11).
template <class T>
void DTransformer<T>::decode(Decoder& d, const index_t* ids, index_t n, T* z) const {
    if (d.len + n > cfg.l_max)
        throw ValueError("decoding past l_max = " + std::to_string(cfg.l_max) + " (context would be " +
                         std::to_string(d.len + n) + ")");
    for (index_t t = 0; t < n; ++t)
        if (ids[t] < 0 || ids[t] >= cfg.n_vocab) throw IndexError("token id " + std::to_string(ids[t]) + " out of range");
    d.kv.resize(std::size_t(cfg.L));
    const index_t d_e = cfg.d_e;
    MatView<T> X = ensure(d.X, d_e, n);
    this->tok.forward(store, ids, n, X);                          // line 2, new tokens only
    this->pos.forward_seqs(store, Seqs::single(n), X, d.len);     //   at positions d.len, d.len+1, …
    for (index_t l = 0; l < cfg.L; ++l) {
        const std::size_t i = std::size_t(l);
        MatView<T> Xt = ensure(d.Xt, d_e, n);
        norm1[i]->forward(store, X, Xt, d.nc);                                 // line 5
        attn[i]->append_kv(store, Xt, d.kv[i]);                                // keys/values of the new tokens
        attn[i]->attend_cached(store, Xt, d.len, d.kv[i], X, d.scratch, true);  // line 6
        norm2[i]->forward(store, X, Xt, d.nc);                                 // line 7
        mlp[i]->forward(store, Xt, X, d.mlp);                                  // line 8
    }
    MatView<T> last = ensure(d.tmp, d_e, 1);
    norm_f->forward(store, X.cols_range(n - 1, 1), last, d.nc);  // line 10 (last column)
    unemb->logits(store, last, MatView<T>(z, cfg.n_vocab, 1));   // line 11, as logits
    d.len += n;
}

// ======================================== Algorithm 9 =================================================
template <class T>
ETransformer<T>::ETransformer(const ModelConfig& c) : Model<T>(resolve(c, Arch::E)) {
    const ModelConfig& g = cfg;
    const Activation act = g.gelu == Gelu::Tanh ? Activation::GeluTanh : Activation::Gelu;
    for (index_t l = 0; l < g.L; ++l) {
        const std::string p = layer_prefix("layers", l);
        attn.push_back(std::make_unique<MHAttention<T>>(g.H, g.d_e, g.d_e, g.d_attn, g.d_mid, g.d_e,
                                                        Mask::bidirectional(), store, p + "attn."));
        norm1.push_back(std::make_unique<Norm<T>>(NormKind::Layer, g.d_e, g.eps, store, p + "gamma1", p + "beta1"));
        mlp.push_back(std::make_unique<MLP<T>>(g.d_e, g.d_mlp, act, store, p, "W_mlp1", "b_mlp1", "W_mlp2", "b_mlp2"));
        norm2.push_back(std::make_unique<Norm<T>>(NormKind::Layer, g.d_e, g.eps, store, p + "gamma2", p + "beta2"));
    }
    W_f = store.matrix("W_f", g.d_f, g.d_e);
    b_f = store.vector("b_f", g.d_f);
    norm_f = std::make_unique<Norm<T>>(NormKind::Layer, g.d_f, g.eps, store, "gamma", "beta");
    unemb = g.tied ? std::make_unique<Unembedding<T>>(g.n_vocab, g.d_f, this->tok.W_e)
                   : std::make_unique<Unembedding<T>>(g.n_vocab, g.d_f, store, "W_u");
    store.allocate();
    Rng rng(g.seed);
    const double s = g.init_std, s_out = g.init_std / std::sqrt(2.0 * double(g.L));
    this->tok.init(store, rng, s);
    this->pos.init(store, rng, s);
    for (index_t l = 0; l < g.L; ++l) {
        attn[std::size_t(l)]->init(store, rng, s, s_out);
        norm1[std::size_t(l)]->init(store);
        mlp[std::size_t(l)]->init(store, rng, s, s_out);
        norm2[std::size_t(l)]->init(store);
    }
    store.normal(W_f.offset, g.d_f * g.d_e, s, rng);
    store.fill(b_f.offset, g.d_f, T(0));
    norm_f->init(store);
    unemb->init(store, rng, s);
    acts_.resize(std::size_t(g.L));
    stream_.resize(std::size_t(g.L + 1));
}

template <class T>
void ETransformer<T>::forward(const Tokens& x) {
    validate(x, cfg.n_vocab, cfg.l_max, "x");
    this->last_.done = false;
    const index_t n = x.s.total(), d_e = cfg.d_e;
    this->embed(x, stream_[0]);  // lines 1–3
    for (index_t l = 0; l < cfg.L; ++l) {  // line 4
        poll();
        const std::size_t i = std::size_t(l);
        LayerActs<T>& a = acts_[i];
        CMatView<T> X = view(stream_[i]);
        MatView<T> Xa = copy_into(a.X_a, X);
        attn[i]->forward(store, X, x.s, X, x.s, Xa, a.attn, true);      // line 5: X ← X + MHAttention(X | W_l, Mask ≡ 1)
        MatView<T> X1 = ensure(a.X_1, d_e, n);
        norm1[i]->forward(store, Xa, X1, a.n1);                         // line 6: X ← layer_norm(X | γ¹, β¹)
        MatView<T> Xb = copy_into(a.X_b, CMatView<T>(X1));
        mlp[i]->forward(store, X1, Xb, a.mlp);                          // line 7: X ← X + W_mlp2 GELU(…) + b_mlp2 1ᵀ
        norm2[i]->forward(store, Xb, ensure(stream_[i + 1], d_e, n), a.n2);  // line 8: X ← layer_norm(X | γ², β²)
    }
    MatView<T> F = ensure(F_, cfg.d_f, n), G = ensure(G_, cfg.d_f, n);
    affine<T>(store.W(W_f), view(stream_[std::size_t(cfg.L)]), store.v(b_f), F);  // line 10: X ← GELU(W_f X + b_f 1ᵀ)
    activation_forward<T>(cfg.gelu == Gelu::Tanh ? Activation::GeluTanh : Activation::Gelu, F, G);
    norm_f->forward(store, G, ensure(Xf_, cfg.d_f, n), nf_);  // line 11: X ← layer_norm(X | γ, β)
    this->last_ = LastForward{true, x.s, x.s};
}

template <class T>
void ETransformer<T>::backward(const Tokens& x, BackwardWork<T>& w) {
    const index_t n = x.s.total(), d_e = cfg.d_e;
    // line 11, then line 10
    MatView<T> dG = zeros(w.Q, cfg.d_f, n);
    norm_f->backward(store, view(w.dHead), nf_, dG);
    activation_backward<T>(cfg.gelu == Gelu::Tanh ? Activation::GeluTanh : Activation::Gelu, view(F_), dG, dG);
    MatView<T> P = zeros(w.P, d_e, n);
    affine_backward<T>(store.W(W_f), view(stream_[std::size_t(cfg.L)]), dG, store.dW(W_f).data, store.dv(b_f), P.data);
    for (index_t l = cfg.L - 1; l >= 0; --l) {
        poll();
        const std::size_t i = std::size_t(l);
        LayerActs<T>& a = acts_[i];
        // lines 8 and 7: X_out = layer_norm₂(X_b), X_b = X_1 + MLP(X_1)
        post_ln_backward(*norm2[i], store, a.n2, w.P, w.Q, [&](CMatView<T> dXb, MatView<T> dX1) {
            mlp[i]->backward(store, view(a.X_1), a.mlp, dXb, dX1, w.dH);
        });
        // lines 6 and 5: X_1 = layer_norm₁(X_a), X_a = X_in + MHAttention(X_in)
        post_ln_backward(*norm1[i], store, a.n1, w.P, w.Q, [&](CMatView<T> dXa, MatView<T> dXin) {
            attn[i]->backward(store, view(stream_[i]), x.s, view(stream_[i]), x.s, a.attn, dXa, dXin, dXin, w.attn);
        });
    }
    this->embed_backward(x, view(w.P));  // line 2
}

template <class T>
double ETransformer<T>::loss_and_grad(const Tokens& x_tilde, const index_t* x) {
    forward(x_tilde);
    BackwardWork<T>& w = work_;
    // Algorithm 12 line 9: loss = −Σ_{t∈T̃} log P[x[t], t],  T̃ = {t : x̃[t] = mask_token}
    masked_targets(x_tilde, x, cfg.mask_token(), w.cols, w.targets);
    store.zero_grad();
    if (w.cols.empty()) return 0.0;  // no masked position: the listing's empty sum (documented)
    MatView<T> dHead = zeros(w.dHead, cfg.d_f, x_tilde.s.total());
    const double loss = this->head_loss(*unemb, out(), w.cols, w.targets, &dHead, w);
    backward(x_tilde, w);
    return loss;
}

template <class T>
double ETransformer<T>::loss(const Tokens& x_tilde, const index_t* x, index_t* n_scored, index_t* n_correct) {
    forward(x_tilde);
    BackwardWork<T>& w = work_;
    masked_targets(x_tilde, x, cfg.mask_token(), w.cols, w.targets);
    if (n_scored) *n_scored = index_t(w.cols.size());
    return this->head_loss(*unemb, out(), w.cols, w.targets, nullptr, w, n_correct);
}

// ======================================== Algorithm 8 =================================================
template <class T>
EDTransformer<T>::EDTransformer(const ModelConfig& c) : Model<T>(resolve(c, Arch::ED)) {
    const ModelConfig& g = cfg;
    for (index_t l = 0; l < g.L_enc; ++l) {
        const std::string p = layer_prefix("enc", l);
        enc_attn.push_back(std::make_unique<MHAttention<T>>(g.H, g.d_e, g.d_e, g.d_attn, g.d_mid, g.d_e,
                                                            Mask::bidirectional(), store, p + "attn."));
        enc_norm1.push_back(std::make_unique<Norm<T>>(NormKind::Layer, g.d_e, g.eps, store, p + "gamma1", p + "beta1"));
        enc_mlp.push_back(std::make_unique<MLP<T>>(g.d_e, g.d_mlp, Activation::Relu, store, p, "W_mlp1", "b_mlp1", "W_mlp2", "b_mlp2"));
        enc_norm2.push_back(std::make_unique<Norm<T>>(NormKind::Layer, g.d_e, g.eps, store, p + "gamma2", p + "beta2"));
    }
    for (index_t l = 0; l < g.L_dec; ++l) {
        const std::string p = layer_prefix("dec", l);
        dec_attn.push_back(std::make_unique<MHAttention<T>>(g.H, g.d_e, g.d_e, g.d_attn, g.d_mid, g.d_e,
                                                            Mask::unidirectional(), store, p + "attn."));
        dec_norm3.push_back(std::make_unique<Norm<T>>(NormKind::Layer, g.d_e, g.eps, store, p + "gamma3", p + "beta3"));
        dec_cross.push_back(std::make_unique<MHAttention<T>>(g.H, g.d_e, g.d_e, g.d_attn, g.d_mid, g.d_e,
                                                             Mask::bidirectional(), store, p + "cross_attn."));
        dec_norm4.push_back(std::make_unique<Norm<T>>(NormKind::Layer, g.d_e, g.eps, store, p + "gamma4", p + "beta4"));
        dec_mlp.push_back(std::make_unique<MLP<T>>(g.d_e, g.d_mlp, Activation::Relu, store, p, "W_mlp3", "b_mlp3", "W_mlp4", "b_mlp4"));
        dec_norm5.push_back(std::make_unique<Norm<T>>(NormKind::Layer, g.d_e, g.eps, store, p + "gamma5", p + "beta5"));
    }
    unemb = g.tied ? std::make_unique<Unembedding<T>>(g.n_vocab, g.d_e, this->tok.W_e)
                   : std::make_unique<Unembedding<T>>(g.n_vocab, g.d_e, store, "W_u");
    store.allocate();
    Rng rng(g.seed);
    const double s = g.init_std, s_out = g.init_std / std::sqrt(2.0 * double(g.L_enc + g.L_dec));
    this->tok.init(store, rng, s);
    this->pos.init(store, rng, s);
    for (index_t l = 0; l < g.L_enc; ++l) {
        enc_attn[std::size_t(l)]->init(store, rng, s, s_out);
        enc_norm1[std::size_t(l)]->init(store);
        enc_mlp[std::size_t(l)]->init(store, rng, s, s_out);
        enc_norm2[std::size_t(l)]->init(store);
    }
    for (index_t l = 0; l < g.L_dec; ++l) {
        dec_attn[std::size_t(l)]->init(store, rng, s, s_out);
        dec_norm3[std::size_t(l)]->init(store);
        dec_cross[std::size_t(l)]->init(store, rng, s, s_out);
        dec_norm4[std::size_t(l)]->init(store);
        dec_mlp[std::size_t(l)]->init(store, rng, s, s_out);
        dec_norm5[std::size_t(l)]->init(store);
    }
    unemb->init(store, rng, s);
    enc_acts_.resize(std::size_t(g.L_enc));
    dec_acts_.resize(std::size_t(g.L_dec));
    zstream_.resize(std::size_t(g.L_enc + 1));
    xstream_.resize(std::size_t(g.L_dec + 1));
}

// lines 1–9: z -> Z (zstream_[L_enc])
template <class T>
void EDTransformer<T>::encoder_forward(const Tokens& z, std::vector<LayerActs<T>>& acts,
                                       std::vector<Matrix<T>>& stream) const {
    const index_t n = z.s.total(), d_e = cfg.d_e;
    acts.resize(std::size_t(cfg.L_enc));
    stream.resize(std::size_t(cfg.L_enc + 1));
    this->embed(z, stream[0]);  // lines 1–3
    for (index_t l = 0; l < cfg.L_enc; ++l) {  // line 4
        poll();
        const std::size_t i = std::size_t(l);
        LayerActs<T>& a = acts[i];
        CMatView<T> Z = view(stream[i]);
        MatView<T> Za = copy_into(a.X_a, Z);
        enc_attn[i]->forward(store, Z, z.s, Z, z.s, Za, a.attn, true);       // line 5: Z ← Z + MHAttention(Z | W_l^enc, Mask ≡ 1)
        MatView<T> Z1 = ensure(a.X_1, d_e, n);
        enc_norm1[i]->forward(store, Za, Z1, a.n1);                           // line 6: Z ← layer_norm(Z | γ_l¹, β_l¹)  (erratum: γ_t)
        MatView<T> Zb = copy_into(a.X_b, CMatView<T>(Z1));
        enc_mlp[i]->forward(store, Z1, Zb, a.mlp);                            // line 7: Z ← Z + W_mlp2 ReLU(…) + b_mlp2 1ᵀ
        enc_norm2[i]->forward(store, Zb, ensure(stream[i + 1], d_e, n), a.n2);  // line 8: Z ← layer_norm(Z | γ_l², β_l²)
    }
}

template <class T>
void EDTransformer<T>::forward(const Tokens& z, const Tokens& x) {
    validate(z, cfg.n_vocab, cfg.l_max, "z");
    validate(x, cfg.n_vocab, cfg.l_max, "x");
    if (z.s.count() != x.s.count())
        throw ValueError("z and x must hold the same number of sequences, got " + std::to_string(z.s.count()) + " and " +
                         std::to_string(x.s.count()));
    this->last_.done = false;
    encoder_forward(z, enc_acts_, zstream_);
    CMatView<T> Z = view(zstream_[std::size_t(cfg.L_enc)]);
    const index_t n = x.s.total(), d_e = cfg.d_e;
    this->embed(x, xstream_[0]);  // lines 10–12
    for (index_t l = 0; l < cfg.L_dec; ++l) {  // line 13 (erratum: the listing loops i, its body indexes l)
        poll();
        const std::size_t i = std::size_t(l);
        LayerActs<T>& a = dec_acts_[i];
        CMatView<T> X = view(xstream_[i]);
        MatView<T> Xa = copy_into(a.X_a, X);
        dec_attn[i]->forward(store, X, x.s, X, x.s, Xa, a.attn, true);         // line 14: X ← X + MHAttention(X | W_l^dec, Mask[t,t'] = [[t ≤ t']])
        MatView<T> X1 = ensure(a.X_1, d_e, n);
        dec_norm3[i]->forward(store, Xa, X1, a.n1);                            // line 15: X ← layer_norm(X | γ_l³, β_l³)
        MatView<T> Xb = copy_into(a.X_b, CMatView<T>(X1));
        dec_cross[i]->forward(store, X1, x.s, Z, z.s, Xb, a.cross, true);      // line 16: X ← X + MHAttention(X, Z | W_l^e/d, Mask ≡ 1)
        MatView<T> X2 = ensure(a.X_2, d_e, n);
        dec_norm4[i]->forward(store, Xb, X2, a.n2);                            // line 17: X ← layer_norm(X | γ_l⁴, β_l⁴)
        MatView<T> Xc = copy_into(a.X_c, CMatView<T>(X2));
        dec_mlp[i]->forward(store, X2, Xc, a.mlp);                             // line 18: X ← X + W_mlp4 ReLU(W_mlp3 X + b_mlp3 1ᵀ) + b_mlp4 1ᵀ
        dec_norm5[i]->forward(store, Xc, ensure(xstream_[i + 1], d_e, n), a.n3);  // line 19: X ← layer_norm(X | γ_l⁵, β_l⁵)
    }
    this->last_ = LastForward{true, z.s, x.s};
}

template <class T>
void EDTransformer<T>::backward(const Tokens& z, const Tokens& x, BackwardWork<T>& w) {
    const index_t d_e = cfg.d_e;
    CMatView<T> Z = view(zstream_[std::size_t(cfg.L_enc)]);
    MatView<T> dZ = zeros(w.dZ, d_e, z.s.total());
    copy_into(w.P, CMatView<T>(view(w.dHead)));  // ∂/∂X of line 21's input
    for (index_t l = cfg.L_dec - 1; l >= 0; --l) {
        poll();
        const std::size_t i = std::size_t(l);
        LayerActs<T>& a = dec_acts_[i];
        // lines 19, 18: X_out = layer_norm₅(X_c), X_c = X_2 + MLP(X_2)
        post_ln_backward(*dec_norm5[i], store, a.n3, w.P, w.Q, [&](CMatView<T> dXc, MatView<T> dX2) {
            dec_mlp[i]->backward(store, view(a.X_2), a.mlp, dXc, dX2, w.dH);
        });
        // lines 17, 16: X_2 = layer_norm₄(X_b), X_b = X_1 + MHAttention(X_1, Z): the context gets ∂/∂Z too
        post_ln_backward(*dec_norm4[i], store, a.n2, w.P, w.Q, [&](CMatView<T> dXb, MatView<T> dX1) {
            dec_cross[i]->backward(store, view(a.X_1), x.s, Z, z.s, a.cross, dXb, dX1, dZ, w.attn);
        });
        // lines 15, 14: X_1 = layer_norm₃(X_a), X_a = X_in + MHAttention(X_in)
        post_ln_backward(*dec_norm3[i], store, a.n1, w.P, w.Q, [&](CMatView<T> dXa, MatView<T> dXin) {
            dec_attn[i]->backward(store, view(xstream_[i]), x.s, view(xstream_[i]), x.s, a.attn, dXa, dXin, dXin, w.attn);
        });
    }
    this->embed_backward(x, view(w.P));  // line 11
    // the encoder, from ∂/∂Z accumulated over every decoder layer's cross-attention
    copy_into(w.P, CMatView<T>(dZ));
    for (index_t l = cfg.L_enc - 1; l >= 0; --l) {
        poll();
        const std::size_t i = std::size_t(l);
        LayerActs<T>& a = enc_acts_[i];
        post_ln_backward(*enc_norm2[i], store, a.n2, w.P, w.Q, [&](CMatView<T> dZb, MatView<T> dZ1) {  // lines 8, 7
            enc_mlp[i]->backward(store, view(a.X_1), a.mlp, dZb, dZ1, w.dH);
        });
        post_ln_backward(*enc_norm1[i], store, a.n1, w.P, w.Q, [&](CMatView<T> dZa, MatView<T> dZin) {  // lines 6, 5
            enc_attn[i]->backward(store, view(zstream_[i]), z.s, view(zstream_[i]), z.s, a.attn, dZa, dZin, dZin, w.attn);
        });
    }
    this->embed_backward(z, view(w.P));  // line 2
}

template <class T>
double EDTransformer<T>::loss_and_grad(const Tokens& z, const Tokens& x) {
    forward(z, x);
    BackwardWork<T>& w = work_;
    next_token_targets(x, w.cols, w.targets);  // Algorithm 11 line 5
    store.zero_grad();
    MatView<T> dHead = zeros(w.dHead, cfg.d_e, x.s.total());
    const double loss = this->head_loss(*unemb, out(), w.cols, w.targets, &dHead, w);
    backward(z, x, w);
    return loss;
}

template <class T>
double EDTransformer<T>::loss(const Tokens& z, const Tokens& x, index_t* n_scored, index_t* n_correct) {
    forward(z, x);
    BackwardWork<T>& w = work_;
    next_token_targets(x, w.cols, w.targets);
    if (n_scored) *n_scored = index_t(w.cols.size());
    return this->head_loss(*unemb, out(), w.cols, w.targets, nullptr, w, n_correct);
}

template <class T>
void EDTransformer<T>::encode(Decoder& d, const index_t* z, index_t l_z) const {
    Tokens zt{z, Seqs::single(l_z)};
    validate(zt, cfg.n_vocab, cfg.l_max, "z");
    encoder_forward(zt, d.enc_acts, d.zstream);  // lines 1–9, once per context
    copy_into(d.Z, CMatView<T>(view(d.zstream[std::size_t(cfg.L_enc)])));
    d.self_kv.assign(std::size_t(cfg.L_dec), KVCache<T>());
    d.cross_kv.assign(std::size_t(cfg.L_dec), KVCache<T>());
    for (index_t l = 0; l < cfg.L_dec; ++l) dec_cross[std::size_t(l)]->append_kv(store, view(d.Z), d.cross_kv[std::size_t(l)]);
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
    const index_t d_e = cfg.d_e;
    MatView<T> X = ensure(d.X, d_e, n);
    this->tok.forward(store, ids, n, X);                       // line 11
    this->pos.forward_seqs(store, Seqs::single(n), X, d.len);
    MatView<T> R = ensure(d.tmp, d_e, n);
    for (index_t l = 0; l < cfg.L_dec; ++l) {
        const std::size_t i = std::size_t(l);
        std::copy(X.data, X.data + X.size(), R.data);
        dec_attn[i]->append_kv(store, X, d.self_kv[i]);
        dec_attn[i]->attend_cached(store, X, d.len, d.self_kv[i], R, d.scratch, true);  // line 14
        dec_norm3[i]->forward(store, R, X, d.nc);                                        // line 15
        std::copy(X.data, X.data + X.size(), R.data);
        dec_cross[i]->attend_cached(store, X, d.len, d.cross_kv[i], R, d.scratch, true);  // line 16
        dec_norm4[i]->forward(store, R, X, d.nc);                                         // line 17
        std::copy(X.data, X.data + X.size(), R.data);
        dec_mlp[i]->forward(store, X, R, d.mlp);                                          // line 18
        dec_norm5[i]->forward(store, R, X, d.nc);                                         // line 19
    }
    unemb->logits(store, X.cols_range(n - 1, 1), MatView<T>(logits_out, cfg.n_vocab, 1));  // line 21, as logits
    d.len += n;
}

template class Model<float>;
template class Model<double>;
template class DTransformer<float>;
template class DTransformer<double>;
template class ETransformer<float>;
template class ETransformer<double>;
template class EDTransformer<float>;
template class EDTransformer<double>;

}  // namespace ft
