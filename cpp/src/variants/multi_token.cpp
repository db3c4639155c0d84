// V16: multi-token prediction, Algorithm V16 of docs/variants.md (listing quoted in multi_token.hpp): D sequential
// modules on Algorithm 10, forward line by line and the hand-written backward beside it; the modules' cached
// decoding for self-speculative decoding (speculative.cpp). Registered as the prediction heads "mtp" (parts.hpp
// PartKind::PredictionHeads, registry.cpp), chosen by its option mtp_depth = D > 0; its row declares mtp_depth and
// mtp_weight (λ), its check and the layers it adds to the model's size.
#include "formal_transformers/multi_token.hpp"

#include <cmath>
#include <string>

#include "formal_transformers/blas.hpp"
#include "formal_transformers/sizes.hpp"
#include "../models/shared.hpp"

namespace ft {
using namespace models;

// ===================================== the part ========================================================
namespace {
// What V16 needs of the rest of a model (resolve's check and the factory's): room in l_max for module D's target,
// a mask made once (not per call), a kernel keeping every key (its self-speculation takes drafts back), and none of
// Gemma's scalings, which the modules' line 3 and line 5 do not apply. mtp_weight alone (D = 0) weighs no module.
void check_mtp(const PartOptionValues& own, const ModelConfig* c) {
    const index_t D = own.integer("mtp_depth");
    if (D == 0 || !c) return;
    if (c->l_max < D + 2)
        throw ValueError("mtp_depth = " + std::to_string(D) + " has no room in l_max = " + std::to_string(c->l_max) +
                         ": module D predicts x[t+D+1], so a training sequence needs at least D + 2 tokens (l_max >= " +
                         std::to_string(D + 2) + ")");
    if (per_call_mask(c->mask))
        throw ValueError("mtp_depth (multi-token prediction) does not combine with mask='" + c->mask + "'");
    if (!head_kernel_has(c->attention, HeadKernelProperty::KeepsKeys))
        throw ValueError("mtp_depth (multi-token prediction) needs attention='softmax' (its self-speculation takes back drafts)");
    if (c->part_options.real("embed_scale") > 0 || c->final_logit_softcapping > 0 || c->block == "sandwich")
        throw ValueError("mtp_depth (multi-token prediction) does not combine with Gemma's embed_scale, "
                         "final_logit_softcapping or block='sandwich' (sandwich_norm)");
}
// each module is a layer of Algorithm 10 and more (config.hpp model_size)
void mtp_size(const PartOptionValues& own, const ModelConfig&, ModelSize& size) {
    const index_t D = own.integer("mtp_depth");
    if (D == 0) return;
    size.layers = checked_add(size.layers, D, "model size");
    size.extra_layers = "MTP modules";
}
}  // namespace

const PartRow& mtp_heads_row() {
    static const PartRow row{PartKind::PredictionHeads,
                             "mtp",
                             {{"mtp_depth", archs::D, OptionKind::Count, std::int64_t(0), OptionCheck::None,
                               "V16: D sequential multi-token-prediction modules (DeepSeek-V3 §2.2); module k predicts "
                               "x[t+k+1]. 0: Algorithm 10"},
                              {"mtp_weight", archs::D, OptionKind::Real, 0.3, OptionCheck::NonNegative,
                               "V16: λ, the loss L_main + (λ/D) Σ_k L_k"}},
                             check_mtp,
                             nullptr,
                             true,
                             mtp_size};
    return row;
}

// The registry's factory (registry.cpp, after the row's check): modules k = 1..D, parameters mtp.{k−1}.*
template <class T>
std::vector<std::shared_ptr<MTPModule<T>>> make_mtp_modules(const ModelConfig& c, Activation act, ParamStore<T>& store) {
    std::vector<std::shared_ptr<MTPModule<T>>> modules;
    for (index_t k = 0; k < c.part_options.integer("mtp_depth"); ++k)
        modules.push_back(std::make_shared<MTPModule<T>>(c, act, store, layer_prefix("mtp", k)));
    return modules;
}

template <class T>
MTPModule<T>::MTPModule(const ModelConfig& c, Activation act, ParamStore<T>& store, const std::string& p)
    : norm_h(c.norm, c.d_e, c.eps, store, p + "gamma_h", p + "beta_h"),
      norm_e(c.norm, c.d_e, c.eps, store, p + "gamma_e", p + "beta_e"),
      W_m(store.matrix(p + "W_m", c.d_e, 2 * c.d_e)),
      block(c, act, store, p) {}

template <class T>
void MTPModule<T>::init(ParamStore<T>& store, Rng& rng, double s, double s_out) const {
    norm_h.init(store);
    norm_e.init(store);
    store.normal(W_m.offset, W_m.rows * W_m.cols, s, rng);
    block.init(store, rng, s, s_out);
}

// M_k = [M_h M_e]: the two d_e × d_e halves of the column-major [d_e, 2 d_e] matrix
template <class T>
void MTPModule<T>::combine(const ParamStore<T>& store, CMatView<T> H_in, CMatView<T> E, MatView<T> Nh, MatView<T> Ne,
                           NormCache<T>& ch, NormCache<T>& ce, MatView<T> Hp) const {
    const index_t d = H_in.rows;
    CMatView<T> M = store.W(W_m), M_h{M.data, d, d}, M_e{M.data + d * d, d, d};
    norm_h.forward(store, H_in, Nh, ch);  // line 3: layer_norm(H^{k−1}[:, t] | γ^h, β^h)
    norm_e.forward(store, E, Ne, ce);     //         layer_norm(W_e[:, x[t+k]] | γ^e, β^e)
    affine<T>(M_h, Nh, nullptr, Hp);      //         h′_t ← M_k [· ; ·] = M_h (·) + M_e (·)
    affine_add<T>(M_e, Ne, nullptr, Hp);
}

template <class T>
void MTPModule<T>::combine_backward(ParamStore<T>& store, CMatView<T> dHp, CMatView<T> Nh, CMatView<T> Ne,
                                    const NormCache<T>& ch, const NormCache<T>& ce, MatView<T> dNh, MatView<T> dNe,
                                    MatView<T> dH_in, MatView<T> dE) const {
    const index_t d = dHp.rows;
    CMatView<T> M = store.W(W_m), M_h{M.data, d, d}, M_e{M.data + d * d, d, d};
    T* dM = store.dW(W_m).data;
    affine_backward<T>(M_h, Nh, dHp, dM, nullptr, dNh.data);          // line 3: dM_h += dH′ Nhᵀ, dNh = M_hᵀ dH′
    affine_backward<T>(M_e, Ne, dHp, dM + d * d, nullptr, dNe.data);  //         dM_e += dH′ Neᵀ, dNe = M_eᵀ dH′
    norm_h.backward(store, dNh, ch, dH_in);
    norm_e.backward(store, dNe, ce, dE);
}

// A training batch: every sequence long enough for the deepest module's target (line 6 with k = D)
template <class T>
void DTransformer<T>::run_forward(const typename Model<T>::Batch& in) {
    if (!mtp.empty()) {
        validate(*in.x, cfg, "x");
        const index_t D = index_t(mtp.size());
        for (index_t b = 0; b < in.x->s.count(); ++b)
            if (in.x->s.len(b) < D + 2)
                throw ValueError("mtp_depth = " + std::to_string(D) + ": the loss needs sequences of at least D + 2 = " +
                                 std::to_string(D + 2) + " tokens (module D predicts x[t+D+1]); " +
                                 (in.x->s.count() == 1 ? std::string("x") : "x[" + std::to_string(b) + "]") + " has " +
                                 std::to_string(in.x->s.len(b)));
    }
    forward(*in.x);  // Algorithm 10 lines 1–10 (line 1 of V16: H⁰ = stream_[L])
    if (!mtp.empty()) mtp_forward(*in.x);
}

// V16 lines 2–5 (the losses of line 6 in aux_loss)
template <class T>
void DTransformer<T>::mtp_forward(const Tokens& x) {
    const index_t d_e = cfg.d_e, B = x.s.count();
    for (index_t k = 1; k <= index_t(mtp.size()); ++k) {  // line 2
        poll();
        MTPModule<T>& m = *mtp[std::size_t(k - 1)];
        typename MTPModule<T>::Acts& a = m.acts;
        std::vector<index_t> lens;
        for (index_t b = 0; b < B; ++b) lens.push_back(x.s.len(b) - k);  // t ∈ [ℓ − k]
        a.s = Seqs::from_lengths(lens);
        const index_t n = a.s.total();
        // H^{k−1}: the trunk's stream after line 9 (k = 1) or module k−1's H (ℓ − k + 1 columns per sequence)
        const Seqs& s_prev = k == 1 ? x.s : mtp[std::size_t(k - 2)]->acts.s;
        CMatView<T> H_prev = k == 1 ? view(stream_[std::size_t(cfg.L)]) : view(mtp[std::size_t(k - 2)]->acts.H);
        MatView<T> H_in = ensure(a.H_in, d_e, n);
        a.ids.resize(std::size_t(n));
        for (index_t b = 0; b < B; ++b)
            for (index_t t = 0; t < a.s.len(b); ++t) {
                std::copy(H_prev.col(s_prev.begin(b) + t), H_prev.col(s_prev.begin(b) + t) + d_e, H_in.col(a.s.begin(b) + t));
                a.ids[std::size_t(a.s.begin(b) + t)] = x.ids[x.s.begin(b) + t + k];  // x[t+k]
            }
        MatView<T> E = ensure(a.E, d_e, n);
        this->emb->tokens(store, EmbedInput<T>{this->tok, a.ids.data(), n}, E);  // W_e[:, x[t+k]] (Algorithm 1 and its Token steps)
        MatView<T> Hp = ensure(a.Hp, d_e, n);
        m.combine(store, H_in, E, ensure(a.Nh, d_e, n), ensure(a.Ne, d_e, n), a.norm_h, a.norm_e, Hp);  // line 3
        m.block.forward(store, Hp, a.s, ensure(a.H, d_e, n), a.block, this->train_,
                        DropPlace{DropGroup::Layers, std::uint64_t(cfg.L + k - 1)});                     // line 4
        norm_f->forward(store, view(a.H), ensure(a.Hf, d_e, n), a.norm_f);                               // line 5 (W_u: aux_loss)
    }
}

// V16 lines 6 and 9: the modules' losses (sums over the batch), weighted; with grad, their backward: parameter
// gradients added to store.grad(), ∂/∂H⁰ left in dH0_ for run_backward
template <class T>
double DTransformer<T>::aux_loss(const typename Model<T>::Batch& in, bool grad, double head, BackwardWork<T>& w) {
    loss_terms_.assign(1, head);  // L_main (line 8)
    if (mtp.empty()) return 0.0;
    const Tokens& x = *in.x;
    const index_t D = index_t(mtp.size()), d_e = cfg.d_e, B = x.s.count();
    const double weight = cfg.part_options.real("mtp_weight") / double(D);  // line 9: λ/D
    std::vector<index_t> cols, targets;
    double total = 0;
    for (index_t k = 1; k <= D; ++k) {
        typename MTPModule<T>::Acts& a = mtp[std::size_t(k - 1)]->acts;
        cols.clear();
        targets.clear();
        for (index_t b = 0; b < B; ++b)
            for (index_t t = 0; t + 1 < a.s.len(b); ++t) {  // line 6: t ∈ [ℓ − k − 1], target x[t+k+1]
                cols.push_back(a.s.begin(b) + t);
                targets.push_back(x.ids[x.s.begin(b) + t + k + 1]);
            }
        MatView<T> dHf = zeros(a.dHf, d_e, a.s.total());
        const double L_k = this->head_loss(view(a.Hf), cols, targets, grad ? &dHf : nullptr, w, nullptr, T(weight));
        loss_terms_.push_back(L_k);
        total += L_k;
        if (grad) zeros(a.dH, d_e, a.s.total());
    }
    if (!grad) return weight * total;
    MatView<T> dH0 = zeros(dH0_, d_e, x.s.total());
    for (index_t k = D; k >= 1; --k) {  // backward: module k's ∂/∂H^k is complete once module k+1 is done
        poll();
        MTPModule<T>& m = *mtp[std::size_t(k - 1)];
        typename MTPModule<T>::Acts& a = m.acts;
        const index_t n = a.s.total();
        norm_f->backward(store, view(a.dHf), a.norm_f, view(a.dH));  // line 5 (W_u's part: head_loss)
        copy_into(w.dX, CMatView<T>(view(a.dH)));
        m.block.backward(store, a.s, a.block, w);                     // line 4: w.dX ← ∂L/∂H′
        MatView<T> dH_in = zeros(a.dH_in, d_e, n), dE = zeros(a.dE, d_e, n);
        m.combine_backward(store, view(w.dX), view(a.Nh), view(a.Ne), a.norm_h, a.norm_e, zeros(a.dNh, d_e, n),
                           zeros(a.dNe, d_e, n), dH_in, dE);  // line 3
        this->emb->tokens_backward(store, EmbedInput<T>{this->tok, a.ids.data(), n}, dE);  //   dW_e[:, x[t+k]] += …
        const Seqs& s_prev = k == 1 ? x.s : mtp[std::size_t(k - 2)]->acts.s;
        MatView<T> dPrev = k == 1 ? dH0 : view(mtp[std::size_t(k - 2)]->acts.dH);
        for (index_t b = 0; b < B; ++b)
            for (index_t t = 0; t < a.s.len(b); ++t) {
                const T* src = dH_in.col(a.s.begin(b) + t);
                T* dst = dPrev.col(s_prev.begin(b) + t);
                for (index_t i = 0; i < d_e; ++i) dst[i] += src[i];
            }
    }
    return weight * total;
}

// Self-speculation's draft: module k over positions t0..t1−1 with its KV cache (lines 3–5 for new columns only)
template <class T>
void mtp_decode(const DTransformer<T>& model, MTPDecoder<T>& d, index_t k, const index_t* x, index_t t0, index_t t1, T* z) {
    const ModelConfig& c = model.cfg;
    const index_t n = t1 - t0, d_e = c.d_e;
    FT_CHECK(k >= 1 && k <= index_t(model.mtp.size()) && n >= 1, "mtp_decode: module or positions out of range");
    FT_CHECK(d.len[std::size_t(k - 1)] == t0, "mtp_decode: positions must follow the module's cache");
    const MTPModule<T>& m = *model.mtp[std::size_t(k - 1)];
    d.ids.assign(x + t0 + k, x + t1 + k);  // x[t+k]
    MatView<T> E = ensure(d.E, d_e, n);
    model.emb->tokens(model.store, EmbedInput<T>{model.tok, d.ids.data(), n}, E);
    CMatView<T> Hprev = view(d.H[std::size_t(k - 1)]);
    FT_CHECK(Hprev.cols >= t1, "mtp_decode: H^{k−1} not computed up to t1");
    CMatView<T> H_in{Hprev.data + t0 * d_e, d_e, n};
    MatView<T> X = ensure(d.X, d_e, n);
    m.combine(model.store, H_in, E, ensure(d.Nh, d_e, n), ensure(d.Ne, d_e, n), d.w.norm, d.w.norm, X);  // line 3
    m.block.forward_cached(model.store, X, t0, d.kv[std::size_t(k - 1)], d.w);                          // line 4
    d.len[std::size_t(k - 1)] = t1;
    Matrix<T>& Hk = d.H[std::size_t(k)];
    FT_CHECK(index_t(Hk.shape(1)) >= t1, "mtp_decode: H^k too small");
    std::copy(X.data, X.data + X.size(), Hk.data() + t0 * d_e);
    MatView<T> last = ensure(d.Xf, d_e, 1);
    model.norm_f->forward(model.store, X.cols_range(n - 1, 1), last, d.w.norm);  // line 5 (last column)
    model.unemb->logits(model.store, last, MatView<T>(z, c.n_vocab, 1));
}

template class MTPModule<float>;
template class MTPModule<double>;
template std::vector<std::shared_ptr<MTPModule<float>>> make_mtp_modules<float>(const ModelConfig&, Activation, ParamStore<float>&);
template std::vector<std::shared_ptr<MTPModule<double>>> make_mtp_modules<double>(const ModelConfig&, Activation,
                                                                                  ParamStore<double>&);
template void DTransformer<float>::run_forward(const Model<float>::Batch&);
template void DTransformer<double>::run_forward(const Model<double>::Batch&);
template void DTransformer<float>::mtp_forward(const Tokens&);
template void DTransformer<double>::mtp_forward(const Tokens&);
template double DTransformer<float>::aux_loss(const Model<float>::Batch&, bool, double, BackwardWork<float>&);
template double DTransformer<double>::aux_loss(const Model<double>::Batch&, bool, double, BackwardWork<double>&);
template void mtp_decode<float>(const DTransformer<float>&, MTPDecoder<float>&, index_t, const index_t*, index_t, index_t, float*);
template void mtp_decode<double>(const DTransformer<double>&, MTPDecoder<double>&, index_t, const index_t*, index_t, index_t,
                                 double*);

}  // namespace ft
