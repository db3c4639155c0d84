// Algorithm V10: multi-head latent attention (DeepSeek-V2 2024 §2.1, DeepSeek-V3 2024 §2.1.1), the listing in
// latent_attention.hpp and docs/variants.md; forward line by line, backward beside it. Registered as the Q/K/V
// source "latent" (parts.hpp QKVSource, registry.cpp): MHAttention uses it in place of Algorithm 4's lines 1–3
// when its options choose it (kv_lora_rank > 0; its row, latent_source_row, declares them and their check).
#include "formal_transformers/latent_attention.hpp"

#include <algorithm>
#include <vector>

#include "formal_transformers/attention.hpp"
#include "formal_transformers/blas.hpp"
#include "formal_transformers/config.hpp"
#include "formal_transformers/lora.hpp"
#include "formal_transformers/sizes.hpp"
#include "formal_transformers/variants.hpp"

namespace ft {
namespace {
// the position q0 + t of every column (t: its index within its sequence)
std::vector<index_t> positions(const Seqs& s, index_t q0) {
    std::vector<index_t> pos(static_cast<std::size_t>(s.total()));
    for (index_t b = 0; b < s.count(); ++b)
        for (index_t j = 0; j < s.len(b); ++j) pos[static_cast<std::size_t>(s.begin(b) + j)] = q0 + j;
    return pos;
}
}  // namespace

template <class T>
LatentQKV<T>::LatentQKV(const LatentSpec& s, ParamStore<T>& store, const std::string& p) : s_(s) {
    if (s.d_c < 1) throw ValueError("kv_lora_rank must be >= 1 (the rank of the KV latent), got " + std::to_string(s.d_c));
    if (s.d_cq < 0) throw ValueError("q_lora_rank must be >= 1 or None, got " + std::to_string(s.d_cq));
    if (s.d_R < 2 || s.d_R % 2 != 0 || s.d_R > s.d_attn)
        throw ValueError("qk_rope_head_dim must be even, >= 2 and <= d_attn = " + std::to_string(s.d_attn) + ", got " +
                         std::to_string(s.d_R));
    d_N = s.d_attn - s.d_R;
    if (s.d_cq > 0) {
        W_dq = store.matrix(p + "W_dq", s.d_cq, s.d_x);
        norm_q = std::make_shared<const Norm<T>>("rms", s.d_cq, kLatentEps, store, p + "gamma_q", p + "beta_q");
        W_uq = store.stacked(p + "W_uq", s.H, s.d_attn, s.d_cq);
    } else {
        W_q = store.stacked(p + "W_q", s.H, s.d_attn, s.d_x);
    }
    W_dkv = store.matrix(p + "W_dkv", s.d_c + s.d_R, s.d_x);
    norm_kv = std::make_shared<const Norm<T>>("rms", s.d_c, kLatentEps, store, p + "gamma_kv", p + "beta_kv");
    W_ukv = store.stacked(p + "W_ukv", s.H, d_N + s.d_v, s.d_c);
}

template <class T>
void LatentQKV<T>::init(ParamStore<T>& store, Rng& rng, double stddev) const {
    for (const MatParam* W : {&W_dq, &W_uq, &W_q, &W_dkv, &W_ukv})
        if (W->offset >= 0) store.normal(W->offset, W->rows * W->cols, stddev, rng);
    if (norm_q) norm_q->init(store);
    norm_kv->init(store);
}

// lines 1–2: C_Q ← W_DQ X; Q ← W_UQ rms_norm(C_Q | γ_Q)   (no query latent: Q ← W_Q X)
template <class T>
void LatentQKV<T>::query_part(const ParamStore<T>& store, CMatView<T> X, MatView<T> Q, LatentCache<T>& c) const {
    if (s_.d_cq == 0) {
        affine<T>(store, W_q, X, nullptr, Q);  // line 2 (d_c′ = 0)
        return;
    }
    MatView<T> CQ = ensure(c.CQ, s_.d_cq, X.cols), CQh = ensure(c.CQh, s_.d_cq, X.cols);
    affine<T>(store.W(W_dq), X, nullptr, CQ);  // line 1
    norm_q->forward(store, CQ, CQh, c.nq);     // line 2: rms_norm(C_Q | γ_Q)
    affine<T>(store.W(W_uq), CQh, nullptr, Q);  // line 2: Q ← W_UQ …
}

// line 6 on the queries: Q_R^h ← RoPE(Q_R^h, p) for every head (rows h·d_attn + d_N …), or its transpose
template <class T>
void LatentQKV<T>::rope_q(MatView<T> Q, const Seqs& s, index_t q0, bool inverse) const {
    const std::vector<index_t> pos = positions(s, q0);
    for (index_t h = 0; h < s_.H; ++h)
        rope<T>(Q.rows_range(h * s_.d_attn + d_N, s_.d_R), 1, s_.d_R, pos.data(), s_.theta, inverse);
}

// lines 5 and 7 from KV = W_UKV Ĉ_KV (head h: [K_N^h; V^h]) and the rotated K_R: K^h = [K_N^h; K_R], V^h
template <class T>
void LatentQKV<T>::split_kv(CMatView<T> KV, CMatView<T> KR, MatView<T> K, MatView<T> V) const {
    const index_t d_kv = d_N + s_.d_v;
    for (index_t j = 0; j < KV.cols; ++j) {
        const T* kv = KV.col(j);
        const T* kr = KR.col(j);
        T *k = K.col(j), *v = V.col(j);
        for (index_t h = 0; h < s_.H; ++h) {
            std::copy(kv + h * d_kv, kv + h * d_kv + d_N, k + h * s_.d_attn);                 // K_N^h
            std::copy(kr, kr + s_.d_R, k + h * s_.d_attn + d_N);                              // line 7: K_R, shared
            std::copy(kv + h * d_kv + d_N, kv + (h + 1) * d_kv, v + h * s_.d_v);               // V^h
        }
    }
}

template <class T>
void LatentQKV<T>::forward(const ParamStore<T>& store, CMatView<T> X, const Seqs& s, index_t q0, MatView<T> Q,
                           MatView<T> K, MatView<T> V, LatentCache<T>& c) const {
    const index_t n = X.cols;
    query_part(store, X, Q, c);  // lines 1–2
    MatView<T> CKR = ensure(c.CKR, s_.d_c + s_.d_R, n);
    affine<T>(store.W(W_dkv), X, nullptr, CKR);  // line 3: [C_KV; K̃_R] ← W_DKV X
    MatView<T> Ch = ensure(c.Ch, s_.d_c, n);
    norm_kv->forward(store, CMatView<T>(CKR).rows_range(0, s_.d_c), Ch, c.nkv);  // line 4: Ĉ_KV ← rms_norm(C_KV | γ_KV)
    MatView<T> KV = ensure(c.KV, s_.H * (d_N + s_.d_v), n);
    affine<T>(store.W(W_ukv), Ch, nullptr, KV);  // line 5: [K_N^h; V^h]_h ← W_UKV Ĉ_KV
    rope_q(Q, s, q0, false);                     // line 6: Q_R^h ← RoPE(Q_R^h, p)
    const std::vector<index_t> pos = positions(s, q0);
    MatView<T> KR = CKR.rows_range(s_.d_c, s_.d_R);
    rope<T>(KR, 1, s_.d_R, pos.data(), s_.theta, false);  // line 6: K_R ← RoPE(K̃_R, p) (in place: CKR keeps K_R)
    split_kv(KV, KR, K, V);                               // line 7
}

template <class T>
void LatentQKV<T>::backward(ParamStore<T>& store, CMatView<T> X, const Seqs& s, index_t q0, const LatentCache<T>& c,
                            MatView<T> dQ, MatView<T> dK, CMatView<T> dV, MatView<T> dX, LatentWork<T>& w) const {
    const index_t n = X.cols, d_kv = d_N + s_.d_v;
    // d(line 7): dK_N^h into dKV's rows, dK_R = Σ_h dK^h's R rows; dV^h into dKV's rows
    MatView<T> dKV = ensure(w.dKV, s_.H * d_kv, n);
    MatView<T> dCKR = ensure(w.dCKR, s_.d_c + s_.d_R, n);
    std::fill(dCKR.data, dCKR.data + dCKR.size(), T(0));
    for (index_t j = 0; j < n; ++j) {
        const T *k = dK.col(j), *v = dV.col(j);
        T *kv = dKV.col(j), *kr = dCKR.col(j) + s_.d_c;
        for (index_t h = 0; h < s_.H; ++h) {
            std::copy(k + h * s_.d_attn, k + h * s_.d_attn + d_N, kv + h * d_kv);
            std::copy(v + h * s_.d_v, v + (h + 1) * s_.d_v, kv + h * d_kv + d_N);
            const T* kh = k + h * s_.d_attn + d_N;
            for (index_t i = 0; i < s_.d_R; ++i) kr[i] += kh[i];
        }
    }
    // d(line 6): RoPE's transpose R(p)ᵀ on dK_R and every dQ_R^h
    const std::vector<index_t> pos = positions(s, q0);
    rope<T>(dCKR.rows_range(s_.d_c, s_.d_R), 1, s_.d_R, pos.data(), s_.theta, true);
    rope_q(dQ, s, q0, true);
    // d(line 5): dW_UKV += dKV Ĉ_KVᵀ, dĈ_KV = W_UKVᵀ dKV
    MatView<T> dCh = ensure(w.dCh, s_.d_c, n);
    std::fill(dCh.data, dCh.data + dCh.size(), T(0));
    affine_backward<T>(store.W(W_ukv), view(c.Ch), dKV, store.dW(W_ukv).data, nullptr, dCh.data, dCh.ld);
    // d(line 4): dC_KV (rows 0…d_c of dCKR) += rms_norm′ᵀ dĈ_KV, dγ_KV += …
    norm_kv->backward(store, dCh, c.nkv, dCKR.rows_range(0, s_.d_c));
    // d(line 3): dW_DKV += d[C_KV; K̃_R] Xᵀ, dX += W_DKVᵀ d[C_KV; K̃_R]
    affine_backward<T>(store.W(W_dkv), X, dCKR, store.dW(W_dkv).data, nullptr, dX.data, dX.ld);
    if (s_.d_cq == 0) {  // d(line 2, no query latent): dW_Q += dQ Xᵀ, dX += W_Qᵀ dQ
        affine_backward<T>(store, W_q, X, dQ, store.dW(W_q).data, nullptr, dX.data, dX.ld);
        return;
    }
    // d(line 2): dW_UQ += dQ rms_norm(C_Q)ᵀ, d rms_norm(C_Q) = W_UQᵀ dQ, dC_Q = rms_norm′ᵀ …
    MatView<T> dCQh = ensure(w.dCQh, s_.d_cq, n), dCQ = ensure(w.dCQ, s_.d_cq, n);
    std::fill(dCQh.data, dCQh.data + dCQh.size(), T(0));
    std::fill(dCQ.data, dCQ.data + dCQ.size(), T(0));
    affine_backward<T>(store.W(W_uq), view(c.CQh), dQ, store.dW(W_uq).data, nullptr, dCQh.data, dCQh.ld);
    norm_q->backward(store, dCQh, c.nq, dCQ);
    // d(line 1): dW_DQ += dC_Q Xᵀ, dX += W_DQᵀ dC_Q
    affine_backward<T>(store.W(W_dq), X, dCQ, store.dW(W_dq).data, nullptr, dX.data, dX.ld);
}

template <class T>
void LatentQKV<T>::queries(const ParamStore<T>& store, CMatView<T> X, index_t q0, MatView<T> Q, LatentCache<T>& c) const {
    query_part(store, X, Q, c);               // lines 1–2
    rope_q(Q, Seqs::single(X.cols), q0, false);  // line 6 (queries at q0, q0 + 1, …)
}

template <class T>
void LatentQKV<T>::latent(const ParamStore<T>& store, CMatView<T> X, index_t p0, MatView<T> L, LatentCache<T>& c) const {
    const index_t n = X.cols;
    MatView<T> CKR = ensure(c.CKR, s_.d_c + s_.d_R, n);
    affine<T>(store.W(W_dkv), X, nullptr, CKR);  // line 3
    norm_kv->forward(store, CMatView<T>(CKR).rows_range(0, s_.d_c), L.rows_range(0, s_.d_c), c.nkv);  // line 4
    MatView<T> KR = L.rows_range(s_.d_c, s_.d_R);
    for (index_t j = 0; j < n; ++j) std::copy(CKR.col(j) + s_.d_c, CKR.col(j) + s_.d_c + s_.d_R, KR.col(j));
    const std::vector<index_t> pos = positions(Seqs::single(n), p0);
    rope<T>(KR, 1, s_.d_R, pos.data(), s_.theta, false);  // line 6: K_R at p0, p0 + 1, …
}

template <class T>
void LatentQKV<T>::expand(const ParamStore<T>& store, CMatView<T> L, MatView<T> K, MatView<T> V, LatentCache<T>& c) const {
    MatView<T> KV = ensure(c.KV, s_.H * (d_N + s_.d_v), L.cols);
    affine<T>(store.W(W_ukv), L.rows_range(0, s_.d_c), nullptr, KV);  // line 5 on the cached Ĉ_KV
    split_kv(KV, L.rows_range(s_.d_c, s_.d_R), K, V);                 // line 7 with the cached K_R
}

// ------------------------------------ the Q/K/V source "latent" ------------------------------------------------
namespace {
// The part: lines 1–7 for the attention's forward (latents kept in c.source), their backward, and decoding from a
// cache of latents (a token keeps [Ĉ_KV; K_R]: d_c + d_R numbers, no value rows).
template <class T>
class LatentSource final : public QKVSource<T> {
public:
    LatentSource(const LatentSpec& s, ParamStore<T>& store, const std::string& p) : l_(s, store, p) {}
    const char* name() const override { return "latent"; }
    void init(ParamStore<T>& store, Rng& rng, double stddev) const override { l_.init(store, rng, stddev); }
    bool places_positions() const override { return true; }  // line 6: RoPE on Q_R and the shared K_R
    void forward(const ParamStore<T>& store, CMatView<T> X, const Seqs& sx, CMatView<T> Z, const Seqs& sz,
                 MHAttentionCache<T>& c, MatView<T>& Q, MatView<T>& K, MatView<T>& V) const override {
        if (X.data != Z.data || sx.off != sz.off) throw ValueError("latent attention (kv_lora_rank) is self-attention");
        const LatentSpec& s = l_.spec();
        Q = ensure(c.Q, s.H * s.d_attn, X.cols), K = ensure(c.K, s.H * s.d_attn, X.cols), V = ensure(c.V, s.H * s.d_v, X.cols);
        l_.forward(store, X, sx, 0, Q, K, V, c.source.template get<LatentCache<T>>());  // lines 1–7
    }
    void gradients(const MHAttentionCache<T>& c, bool dx_is_dz, index_t n_x, index_t n_z, MHAttentionWork<T>& w,
                   MatView<T>& dQ, MatView<T>& dK, MatView<T>& dV) const override {
        (void)c, (void)dx_is_dz;
        const LatentSpec& s = l_.spec();
        dQ = ensure(w.dQ, s.H * s.d_attn, n_x), dK = ensure(w.dK, s.H * s.d_attn, n_z), dV = ensure(w.dV, s.H * s.d_v, n_z);
        for (MatView<T>* d : {&dQ, &dK, &dV}) std::fill(d->data, d->data + d->size(), T(0));
    }
    void backward(ParamStore<T>& store, CMatView<T> X, const Seqs& sx, CMatView<T> Z, const Seqs& sz,
                  const MHAttentionCache<T>& c, MatView<T> dQ, MatView<T> dK, MatView<T> dV, MatView<T> dX,
                  MatView<T> dZ, MHAttentionWork<T>& w) const override {
        (void)Z, (void)sz, (void)dZ;  // self-attention: dZ is dX
        const LatentCache<T>* lc = c.source.template find<LatentCache<T>>();
        FT_CHECK(lc, "latent attention: backward without its forward");
        l_.backward(store, X, sx, 0, *lc, dQ, dK, dV, dX, w.source.template get<LatentWork<T>>());  // lines 7–1
    }
    index_t key_rows() const override { return l_.cache_rows(); }
    index_t value_rows() const override { return 0; }
    void append(const ParamStore<T>& store, CMatView<T> Z, index_t p0, MatView<T> Kc, MatView<T> Vc) const override {
        (void)Vc;
        LatentCache<T> tmp;
        l_.latent(store, Z, p0, Kc, tmp);  // lines 3, 4, 6: the new tokens' [Ĉ_KV; K_R] at p0, p0 + 1, …
    }
    void queries(const ParamStore<T>& store, CMatView<T> X, index_t q0, MatView<T> Q,
                 MHAttentionCache<T>& s) const override {
        l_.queries(store, X, q0, Q, s.source.template get<LatentCache<T>>());  // lines 1, 2, 6
    }
    void keys_values(const ParamStore<T>& store, CMatView<T> Kc, CMatView<T> Vc, MHAttentionCache<T>& s,
                     CMatView<T>& K, CMatView<T>& V) const override {
        (void)Vc;
        const LatentSpec& sp = l_.spec();
        MatView<T> Ku = ensure(s.K, sp.H * sp.d_attn, Kc.cols), Vu = ensure(s.V, sp.H * sp.d_v, Kc.cols);
        l_.expand(store, Kc, Ku, Vu, s.source.template get<LatentCache<T>>());  // lines 5, 7 on the cached latents
        K = Ku, V = Vu;
    }

private:
    LatentQKV<T> l_;
};
}  // namespace

namespace {
// V10's options (kv_lora_rank = d_c, q_lora_rank = d_c′, qk_rope_head_dim = d_R) and what latent attention needs of
// a model: RoPE (on the shared key part), every head's own keys (H_kv = H), no biases, no window (the latent cache)
void check_latent(const PartOptionValues& own, const ModelConfig* c) {
    const index_t d_c = own.integer("kv_lora_rank"), d_R = own.integer("qk_rope_head_dim");
    if (d_c <= 0) throw ValueError("q_lora_rank and qk_rope_head_dim are options of latent attention: pass kv_lora_rank too");
    if (d_R <= 0) throw ValueError("kv_lora_rank (latent attention) needs qk_rope_head_dim, the rotated part of each head");
    if (!c) return;  // (made directly: make_latent_source checks the attention's sizes and options)
    if (d_R % 2 != 0 || d_R > c->d_attn)
        throw ValueError("qk_rope_head_dim must be even and <= d_attn = " + std::to_string(c->d_attn) +
                         " (d_attn = qk_nope_head_dim + qk_rope_head_dim), got " + std::to_string(d_R));
    if (!position_has(c->positional, PositionProperty::RotatesQK))
        throw ValueError("kv_lora_rank (latent attention) rotates its shared key part with RoPE: positional=" +
                         positions_with(PositionProperty::RotatesQK));
    if (c->H_kv != c->H) throw ValueError("kv_lora_rank (latent attention) makes every head's keys: H_kv must be H");
    if (c->bias) throw ValueError("kv_lora_rank (latent attention) has no biases (DeepSeek): pass bias=False");
    if (c->part_options.real("rope_scaling_factor") > 0)
        throw ValueError("kv_lora_rank (latent attention) rotates with V1's unscaled RoPE: not with rope_scaling_factor");
    if (const PartRow* m = chosen_part(*c, PartKind::Mask)) {
        MaskOptions o;
        o.options = c->part_options;
        if (make_mask(m->name, o).window() > 0)
            throw ValueError(std::string("kv_lora_rank (latent attention) does not combine with the ") + m->name + " mask");
    }
}
// The parameters of one latent attention (a lower bound for config.hpp's model_size): W_dq and W_uq (or W_q),
// W_dkv, W_ukv, W_o
void latent_size(const PartOptionValues& own, const ModelConfig& c, ModelSize& size) {
    const char* what = "model size";
    const index_t d = c.d_e, d_c = own.integer("kv_lora_rank"), d_cq = own.integer("q_lora_rank"),
                  d_R = own.integer("qk_rope_head_dim");
    const index_t q = d_cq > 0 ? checked_add(checked_mul(d_cq, d, what), checked_count({c.H, c.d_attn, d_cq}, what), what)
                               : checked_count({c.H, c.d_attn, d}, what);
    const index_t kv = checked_add(checked_mul(checked_add(d_c, d_R, what), d, what),
                                   checked_count({c.H, checked_add(c.d_attn - d_R, c.d_mid, what), d_c}, what), what);
    size.attention = checked_add(checked_add(q, kv, what), checked_count({c.H, c.d_mid, d}, what), what);
}
}  // namespace

const PartRow& latent_source_row() {
    static const PartRow row{
        PartKind::QKVSource,
        "latent",
        {{"kv_lora_rank", archs::D, OptionKind::AutoSize, std::int64_t(0), OptionCheck::None,
          "V10: the rank d_c of the KV latent (multi-head latent attention, DeepSeek-V2/V3); None: Algorithm 4's W_q, W_k, W_v"},
         {"q_lora_rank", archs::D, OptionKind::AutoSize, std::int64_t(0), OptionCheck::None,
          "V10: the rank d_c′ of the query latent; None: W_q"},
         {"qk_rope_head_dim", archs::D, OptionKind::AutoSize, std::int64_t(0), OptionCheck::None,
          "V10: the rotated part d_R of each query/key head (d_attn = d_N + d_R)"}},
        check_latent,
        nullptr,
        true,
        latent_size};
    return row;
}

// The registry's factory (registry.cpp): its row's check, then what the attention's other options must be.
template <class T>
std::shared_ptr<const QKVSource<T>> make_latent_source(const AttnPartSpec<T>& spec, ParamStore<T>& store,
                                                       const std::string& prefix) {
    const AttnVariant& v = spec.v;
    check_latent(v.options, nullptr);
    if (spec.H_kv != spec.H) throw ValueError("kv_lora_rank (latent attention) makes every head's keys: H_kv must be H");
    if (v.bias) throw ValueError("kv_lora_rank (latent attention) has no biases (DeepSeek): pass bias=False");
    if (!position_has(v.position, PositionProperty::RotatesQK))
        throw ValueError("kv_lora_rank (latent attention) rotates its shared key part with RoPE: positional=" +
                         positions_with(PositionProperty::RotatesQK));
    if (spec.d_x != spec.d_z) throw ValueError("kv_lora_rank (latent attention) is self-attention: d_x must be d_z");
    if (spec.mask && spec.mask->window() > 0)
        throw ValueError("kv_lora_rank (latent attention) does not combine with the " + spec.mask->name() + " mask");
    LatentSpec ls;
    ls.H = spec.H, ls.d_x = spec.d_x, ls.d_attn = spec.d_attn, ls.d_v = spec.d_mid;
    ls.d_c = v.options.integer("kv_lora_rank"), ls.d_cq = v.options.integer("q_lora_rank");
    ls.d_R = v.options.integer("qk_rope_head_dim"), ls.theta = v.options.real("rope_theta");  // the RoPE position's θ
    return std::make_shared<const LatentSource<T>>(ls, store, prefix);
}

template class LatentQKV<float>;
template class LatentQKV<double>;
template std::shared_ptr<const QKVSource<float>> make_latent_source<float>(const AttnPartSpec<float>&,
                                                                           ParamStore<float>&, const std::string&);
template std::shared_ptr<const QKVSource<double>> make_latent_source<double>(const AttnPartSpec<double>&,
                                                                             ParamStore<double>&, const std::string&);

}  // namespace ft
