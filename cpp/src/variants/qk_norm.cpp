// QK-norm (docs/variants.md V24; Dehghani et al. 2023, "Scaling Vision Transformers to 22 Billion Parameters",
// §2.1; Qwen3, Gemma 3): Algorithm 4's queries and keys normalised per head, each with its own gain, before the
// position part (V1 RoPE) and the scores of line 4. A Q/K/V source (parts.hpp): the listing's projections, then
//   1  Q ← W_q X + b_q 1ᵀ;  2  K ← W_k Z + b_k 1ᵀ;  3  V ← W_v Z + b_v 1ᵀ       (listings/qkv_projections.cpp)
//   1′ for h ∈ [H], t ∈ [ℓ_x]:   Q^h[:, t] ← norm(Q^h[:, t] | γ_q)      [[γ_q ∈ R^{d_attn}, shared by the heads]]
//   2′ for g ∈ [H_kv], t ∈ [ℓ_z]: K^g[:, t] ← norm(K^g[:, t] | γ_k)      [[γ_k ∈ R^{d_attn}]]
// norm is the model's RMS norm: "rms" (ê = e/rms(e) ⊙ γ; Qwen3) or "rms1p" (ê = e/rms(e) ⊙ (1 + γ); Gemma 3),
// with the model's eps. Backward: lines 2′, 1′ through the norm part's backward (dγ summed over heads and tokens),
// then the projections'. Decoding: a token's cached key is its normalised K column (line 2′ before RoPE), a query
// is normalised as it comes. Its option: qk_norm=True (D only) chooses this source.
#include <algorithm>

#include "formal_transformers/attention.hpp"
#include "formal_transformers/config.hpp"

namespace ft {

namespace {
// What a call keeps: the projections' own state (the fused product) and each head's norm cache.
template <class T>
struct QKNormState : ProjectionState<T> {
    std::vector<NormCache<T>> q, k;
    std::unique_ptr<PartState> clone() const override { return std::make_unique<QKNormState>(*this); }
};
template <class T>
struct QKNormWork : ProjectionWork<T> {
    Matrix<T> dM;  // one head's ∂loss/∂(normalised rows), contiguous
    std::unique_ptr<PartState> clone() const override { return std::make_unique<QKNormWork>(*this); }
};

template <class T>
class QKNormSource final : public QKVSource<T> {
public:
    QKNormSource(const AttnPartSpec<T>& s, ParamStore<T>& store, const std::string& p)
        : proj_(s, store, p), H_(s.H), H_kv_(s.H_kv), d_(s.d_attn),
          q_norm_(make_norm<T>(s.v.norm, s.d_attn, s.v.eps, store, p + "gamma_q", p + "beta_q")),
          k_norm_(make_norm<T>(s.v.norm, s.d_attn, s.v.eps, store, p + "gamma_k", p + "beta_k")) {}
    const char* name() const override { return "qk_norm"; }
    void init(ParamStore<T>& store, Rng& rng, double stddev) const override {
        proj_.init(store, rng, stddev);
        q_norm_->init(store);
        k_norm_->init(store);
    }
    void forward(const ParamStore<T>& store, CMatView<T> X, const Seqs& sx, CMatView<T> Z, const Seqs& sz,
                 MHAttentionCache<T>& c, MatView<T>& Q, MatView<T>& K, MatView<T>& V) const override {
        QKNormState<T>& st = c.source.template get<QKNormState<T>>();  // (the projections find theirs in it)
        proj_.forward(store, X, sx, Z, sz, c, Q, K, V);                  // lines 1–3
        normalize(store, Q, H_, *q_norm_, st.q);                         // line 1′
        normalize(store, K, H_kv_, *k_norm_, st.k);                      // line 2′
    }
    void gradients(const MHAttentionCache<T>& c, bool dx_is_dz, index_t n_x, index_t n_z, MHAttentionWork<T>& w,
                   MatView<T>& dQ, MatView<T>& dK, MatView<T>& dV) const override {
        w.source.template get<QKNormWork<T>>();
        proj_.gradients(c, dx_is_dz, n_x, n_z, w, dQ, dK, dV);
    }
    void backward(ParamStore<T>& store, CMatView<T> X, const Seqs& sx, CMatView<T> Z, const Seqs& sz,
                  const MHAttentionCache<T>& c, MatView<T> dQ, MatView<T> dK, MatView<T> dV, MatView<T> dX,
                  MatView<T> dZ, MHAttentionWork<T>& w) const override {
        const QKNormState<T>* st = c.source.template find<QKNormState<T>>();
        FT_CHECK(st, "qk_norm: backward needs its forward");
        QKNormWork<T>& wk = w.source.template get<QKNormWork<T>>();
        normalize_backward(store, dK, H_kv_, *k_norm_, st->k, wk.dM);  // line 2′
        normalize_backward(store, dQ, H_, *q_norm_, st->q, wk.dM);     // line 1′
        proj_.backward(store, X, sx, Z, sz, c, dQ, dK, dV, dX, dZ, w);  // lines 3, 2, 1
    }
    index_t key_rows() const override { return proj_.key_rows(); }
    index_t value_rows() const override { return proj_.value_rows(); }
    void append(const ParamStore<T>& store, CMatView<T> Z, index_t p0, MatView<T> Kc, MatView<T> Vc) const override {
        proj_.append(store, Z, p0, Kc, Vc);  // lines 2, 3
        std::vector<NormCache<T>> scratch;
        normalize(store, Kc, H_kv_, *k_norm_, scratch);  // line 2′
    }
    void queries(const ParamStore<T>& store, CMatView<T> X, index_t q0, MatView<T> Q,
                 MHAttentionCache<T>& s) const override {
        proj_.queries(store, X, q0, Q, s);  // line 1
        std::vector<NormCache<T>> scratch;
        normalize(store, Q, H_, *q_norm_, scratch);  // line 1′
    }
    void keys_values(const ParamStore<T>& store, CMatView<T> Kc, CMatView<T> Vc, MHAttentionCache<T>& s,
                     CMatView<T>& K, CMatView<T>& V) const override {
        proj_.keys_values(store, Kc, Vc, s, K, V);
    }

private:
    // every head's rows of M, column by column, in place
    void normalize(const ParamStore<T>& store, MatView<T> M, index_t heads, const NormPart<T>& norm,
                   std::vector<NormCache<T>>& caches) const {
        caches.resize(std::size_t(heads));
        for (index_t h = 0; h < heads; ++h) {
            MatView<T> Mh = M.rows_range(h * d_, d_);
            norm.forward(store, Mh, Mh, caches[std::size_t(h)]);
        }
    }
    // dM (∂loss/∂ the normalised rows) -> ∂loss/∂ the projected rows, in place; dγ += …
    void normalize_backward(ParamStore<T>& store, MatView<T> dM, index_t heads, const NormPart<T>& norm,
                            const std::vector<NormCache<T>>& caches, Matrix<T>& scratch) const {
        for (index_t h = 0; h < heads; ++h) {
            MatView<T> dMh = dM.rows_range(h * d_, d_);
            MatView<T> g = ensure(scratch, d_, dM.cols);
            for (index_t j = 0; j < dM.cols; ++j) {
                std::copy(dMh.col(j), dMh.col(j) + d_, g.col(j));
                std::fill(dMh.col(j), dMh.col(j) + d_, T(0));
            }
            norm.backward(store, g, caches[std::size_t(h)], dMh);
        }
    }
    Projections<T> proj_;
    index_t H_, H_kv_, d_;
    std::shared_ptr<const NormPart<T>> q_norm_, k_norm_;
};

// qk_norm=True needs a model whose norm is an RMS norm (the gains only, as Qwen3 and Gemma 3 have)
void check_qk_norm_norm(const std::string& norm) {
    if (norm != "rms" && norm != "rms1p")
        throw ValueError("qk_norm normalises queries and keys with the model's RMS norm: norm must be 'rms' or 'rms1p', "
                         "got '" + norm + "'");
}
void check_qk_norm(const PartOptionValues& own, const ModelConfig* c) {
    if (!own.flag("qk_norm")) throw ValueError("qk_norm: the source is chosen by qk_norm=True");
    if (!c) return;
    check_qk_norm_norm(c->norm);
}
}  // namespace

const PartRow& qk_norm_row() {
    static const PartRow row{PartKind::QKVSource,
                             "qk_norm",
                             {{"qk_norm", archs::D, OptionKind::Bool, false, OptionCheck::None,
                               "V24: every head's queries and keys normalised by the model's RMS norm with their own "
                               "gains γ_q, γ_k before RoPE (Qwen3, Gemma 3). False: Algorithm 4's projections"}},
                             check_qk_norm};
    return row;
}

// The registry's factory (registry.cpp)
template <class T>
std::shared_ptr<const QKVSource<T>> make_qk_norm_source(const AttnPartSpec<T>& spec, ParamStore<T>& store,
                                                        const std::string& prefix) {
    check_qk_norm(spec.v.options, nullptr);
    check_qk_norm_norm(spec.v.norm);
    return std::make_shared<const QKNormSource<T>>(spec, store, prefix);
}
template std::shared_ptr<const QKVSource<float>> make_qk_norm_source<float>(const AttnPartSpec<float>&,
                                                                            ParamStore<float>&, const std::string&);
template std::shared_ptr<const QKVSource<double>> make_qk_norm_source<double>(const AttnPartSpec<double>&,
                                                                              ParamStore<double>&, const std::string&);

}  // namespace ft
