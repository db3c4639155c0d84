// Speculative decoding, Algorithm S of docs/speculative_decoding.md (listing quoted in speculative.hpp):
// a draft DTransformer proposes k tokens, the target verifies them in one cached pass, the rejection rule
// keeps the target's distribution exactly.
#include "formal_transformers/speculative.hpp"
#include "formal_transformers/inference.hpp"
#include "formal_transformers/multi_token.hpp"

#include <algorithm>
#include <cmath>
#include <string>

namespace ft {

// Algorithm 10 lines 1–11 for n new tokens over the cache, as DTransformer::decode, with lines 10–11 for
// every fed column: decode leaves the residual stream after the last layer (all n columns) in d.w.X.
void check_draft_k(index_t k) {
    if (k < 1) throw ValueError("k (tokens drafted per target pass) must be >= 1, got " + std::to_string(k));
}

template <class T>
void DTransformer<T>::decode_all(Decoder& d, const index_t* ids, index_t n, MatView<T> Z) const {
    FT_CHECK(n >= 1 && Z.rows == cfg.n_vocab && Z.cols == n, "decode_all: Z must be [N_V, n]");
    decode(d, ids, n, Z.col(n - 1));  // lines 1–11 (line 11 for the last column only)
    FT_CHECK(index_t(d.w.X.shape(0)) == cfg.d_e && index_t(d.w.X.shape(1)) == n, "decode_all: stream not in d.w.X");
    MatView<T> Xn = ensure(d.w.tmp, cfg.d_e, n);
    norm_f->forward(store, view(d.w.X), Xn, d.w.norm);  // line 10, every column
    this->unemb->logits(store, Xn, Z);                  // line 11, as logits
}

namespace {

// Lines 6 and 10: w ∝ softmax(z/τ) = p^{1/τ} normalised, in double (τ = 0: one-hot at the argmax, first of
// ties) — the distribution Algorithm 14's sample_token draws from.
template <class T>
void sampling_probs(const T* z, index_t n, double tau, std::vector<double>& w) {
    w.assign(std::size_t(n), 0.0);
    if (tau == 0) {
        w[std::size_t(std::max_element(z, z + n) - z)] = 1.0;
        return;
    }
    const double m = double(*std::max_element(z, z + n));
    double s = 0;
    for (index_t i = 0; i < n; ++i) s += (w[std::size_t(i)] = std::exp((double(z[i]) - m) / tau));
    for (auto& v : w) v /= s;
}

// "sample a token from norm(w)" for w ≥ 0 with Σ w > 0: inverse CDF at one uniform number (never a token of
// mass 0). A one-hot w needs no random number (τ = 0 stays free of the Rng, as in sample_token).
index_t sample_from(const std::vector<double>& w, Rng& rng) {
    double s = 0;
    index_t nz = 0, last = -1;
    for (std::size_t i = 0; i < w.size(); ++i)
        if (w[i] > 0) {
            s += w[i];
            ++nz;
            last = index_t(i);
        }
    FT_CHECK(nz > 0, "speculative decoding: sampling from a distribution with no mass");
    if (nz == 1) return last;
    double u = rng.uniform() * s;
    for (std::size_t i = 0; i < w.size(); ++i) {
        if (w[i] <= 0) continue;
        u -= w[i];
        if (u < 0) return index_t(i);
    }
    return last;  // rounding
}

}  // namespace

namespace {

// Algorithm S lines 2–21 around a draft (shared by the two-model and the self-speculative forms). x: the prompt,
// grown in place. draft(m, kp, p): append up to kp drafted tokens x̂_j to x (lines 4–8; p[j]: their p_j) and return
// how many; verified(dt, first, n): the target just fed n columns from position `first` (its d.w.X holds their
// streams after the last layer); rollback(m, a): the round kept a of the drafts (x has m + a + 1 tokens).
template <class T, class Draft, class Verified, class Rollback>
void algorithm_s(const DTransformer<T>& target, std::vector<index_t>& x, index_t l, index_t l_gen, index_t k, double tau,
                 Rng& rng, SpeculativeStats& st, std::vector<std::vector<double>>& p, Draft&& draft, Verified&& verified,
                 Rollback&& rollback) {
    const index_t N_V = target.cfg.n_vocab;
    typename DTransformer<T>::Decoder dt;  // the target's KV cache
    std::vector<double> q, res;
    Matrix<T> Zt;
    while (index_t(x.size()) < l + l_gen) {                    // line 2
        poll();
        const index_t m = index_t(x.size());                    // line 3
        const index_t kp = draft(m, std::min<index_t>(k, l + l_gen - m - 1), p);  // lines 4–8
        const index_t c0 = m - 1 - dt.len;  // the column of P[:, m − 1] (1-based m) among those fed now
        const index_t first = dt.len;
        {
            // feed the target the tokens x[d.len : end] its cache has not seen: a long prompt's first fill uses the
            // thread pool; a few columns (every later call, and a short prompt) run on one thread, as DInference —
            // per product a few tens of µs, where a team's fork and barriers cost more than they save, and on a
            // loaded machine a barrier waiting for a descheduled thread costs a time slice
            const index_t n = index_t(x.size()) - dt.len;
            FT_CHECK(n >= 1, "speculative decoding: nothing to feed");
            auto call = [&] { target.decode_all(dt, x.data() + dt.len, n, ensure(Zt, N_V, n)); };  // line 9: one pass
            if (n > kFewColumns) {
                call();
            } else {
                SingleThreadScope one_thread;
                call();
            }
            verified(dt, first, n);
        }
        ++st.target_passes;
        MatView<T> Z = view(Zt);
        index_t a = 0;  // drafts kept
        index_t y = -1;
        for (index_t j = 0; j < kp; ++j) {                               // line 11
            sampling_probs(Z.col(c0 + j), N_V, tau, q);                  // line 10: q_j
            const index_t xh = x[std::size_t(m + j)];
            const double r = rng.uniform();                              // line 12
            const double ratio = q[std::size_t(xh)] / p[std::size_t(j)][std::size_t(xh)];
            if (r >= std::min(1.0, ratio)) {                             // line 13: reject x̂_j
                res.resize(std::size_t(N_V));
                double s = 0;
                for (index_t v = 0; v < N_V; ++v)
                    s += (res[std::size_t(v)] = std::max(0.0, q[std::size_t(v)] - p[std::size_t(j)][std::size_t(v)]));
                y = sample_from(s > 0 ? res : q, rng);                    // line 14: y ~ norm(max(0, q_j − p_j))
                break;                                                    // line 15 (below)
            }
            ++a;
        }                                                                 // line 17
        if (y < 0) {                                                      // all k' accepted
            sampling_probs(Z.col(c0 + kp), N_V, tau, q);                  // line 10: q_{k'+1}
            y = sample_from(q, rng);                                      // line 18
        }
        x.resize(std::size_t(m + a));  // lines 15 / 19: x ← [x, x̂_1, …, x̂_a, y]
        x.push_back(y);
        dt.rollback(m + a);  // forget the rejected drafts' keys and values (the target saw m + k' tokens)
        rollback(m, a);
        st.drafted.push_back(kp);
        st.accepted.push_back(a);
    }  // line 20
}

template <class T>
void check_prompt(const DTransformer<T>& target, const index_t* x_in, index_t l, index_t l_gen, double tau) {
    const index_t N_V = target.cfg.n_vocab;
    if (!(tau >= 0) || !std::isfinite(tau)) throw ValueError("tau must be a finite number >= 0 (0 = argmax), got " + std::to_string(tau));
    check_l_gen(l_gen);
    if (l < 1) throw ValueError("the prompt x must have at least one token");
    for (index_t t = 0; t < l; ++t)
        if (x_in[t] < 0 || x_in[t] >= N_V)
            throw IndexError("token id " + std::to_string(x_in[t]) + " at position " + std::to_string(t) + " of x out of range [0, " +
                             std::to_string(N_V) + ")");
}

// at most ℓ_gen − 1 tokens are ever drafted in one pass: the buffers are sized by that, not by k (k = 10^8
// would allocate 10^8 distributions for 3 tokens), and checked against the allocation bound
inline index_t draft_buffers(index_t k, index_t l_gen, index_t N_V) {
    const index_t k_buf = std::max<index_t>(1, std::min(k, l_gen));
    check_bytes(checked_mul(k_buf, N_V, "speculative decoding: the k draft distributions (k * N_V)"), sizeof(double),
                "speculative decoding: the k draft distributions (k * N_V)");
    return k_buf;
}

// The smallest window of any layer (0: none): a rolling cache takes back at most that many − 1 tokens (V26's global
// layers keep every column, their local ones still roll, so DTransformer::window(), 0 there, is not the bound)
template <class T>
index_t smallest_window(const DTransformer<T>& m) {
    index_t w = 0;
    for (const auto& b : m.layer)
        if (const index_t v = b->attn.mask.window(); v > 0) w = w > 0 ? std::min(w, v) : v;
    return w;
}
}  // namespace

template <class T>
std::vector<index_t> SpeculativeInference(const DTransformer<T>& target, const DTransformer<T>& draft, const index_t* x_in,
                                          index_t l, index_t l_gen, index_t k, double tau, Rng& rng,
                                          SpeculativeStats* stats) {
    const ModelConfig& c = target.cfg;
    const index_t N_V = c.n_vocab;
    check_draft_k(k);
    if (const index_t w = smallest_window(draft); w > 0 && k >= w)
        throw ValueError("k = " + std::to_string(k) + " must be < the draft's " + draft.layer[0]->attn.mask.name() +
                         " = " + std::to_string(w) +
                         ": its rolling cache (docs/variants.md V9) cannot take back more than w − 1 drafted tokens");
    const bool draft_keeps = head_kernel_has(draft.cfg.attention, HeadKernelProperty::KeepsKeys);
    if (!draft_keeps || !head_kernel_has(target.cfg.attention, HeadKernelProperty::KeepsKeys))
        throw ValueError(std::string("speculative decoding takes back rejected drafts from the caches; the ") +
                         (!draft_keeps ? "draft" : "target") + "'s attention='" +
                         (!draft_keeps ? draft.cfg.attention : target.cfg.attention) +
                         "' does not keep its past keys apart (its state or its weights depend on all of them: "
                         "docs/variants.md), so it cannot take them back");
    if (!(tau >= 0) || !std::isfinite(tau)) throw ValueError("tau must be a finite number >= 0 (0 = argmax), got " + std::to_string(tau));
    check_l_gen(l_gen);
    if (draft.cfg.n_vocab != N_V)
        throw ValueError("the draft and the target must share the vocabulary: draft N_V = " + std::to_string(draft.cfg.n_vocab) +
                         ", target N_V = " + std::to_string(N_V));
    check_prompt(target, x_in, l, l_gen, tau);
    const index_t need = std::max(l, l + l_gen - 1);  // the longest context either model is fed
    for (const DTransformer<T>* mdl : {&target, &draft})
        if (need > mdl->cfg.l_max)
            throw ValueError(std::string("speculative decoding needs length(x) + l_gen - 1 <= l_max of both models; ") +
                             (mdl == &target ? "target" : "draft") + " l_max = " + std::to_string(mdl->cfg.l_max) + " < " +
                             std::to_string(need) + " (no sliding window: shorten the prompt or l_gen)");
    const index_t k_buf = draft_buffers(k, l_gen, N_V);
    SpeculativeStats local;
    SpeculativeStats& st = stats ? *stats : local;
    st = SpeculativeStats();

    std::vector<index_t> x(x_in, x_in + l);  // line 1: ℓ ← length(x)
    x.reserve(std::size_t(l + l_gen + k_buf));
    typename DTransformer<T>::Decoder dd;  // the draft's KV cache
    std::vector<std::vector<double>> p(static_cast<std::size_t>(k_buf), std::vector<double>(static_cast<std::size_t>(N_V)));
    std::vector<T> zd(static_cast<std::size_t>(N_V));
    auto draft_tokens = [&](index_t m, index_t kp, std::vector<std::vector<double>>& pj) {
        (void)m;
        for (index_t j = 0; j < kp; ++j) {                      // line 4 (j 0-based)
            poll();
            const index_t n = index_t(x.size()) - dd.len;
            FT_CHECK(n >= 1, "speculative decoding: nothing to feed");
            if (n > kFewColumns) {
                draft.decode(dd, x.data() + dd.len, n, zd.data());  // line 5: P̃[:, m + j − 1], cached
            } else {
                SingleThreadScope one_thread;
                draft.decode(dd, x.data() + dd.len, n, zd.data());
            }
            ++st.draft_passes;
            sampling_probs(zd.data(), N_V, tau, pj[std::size_t(j)]);  // line 6: p_j ∝ P̃[:, m+j−1]^{1/τ}
            x.push_back(sample_from(pj[std::size_t(j)], rng));       // line 7: x̂_j ~ p_j (kept after x for now)
        }                                                            // line 8
        return kp;
    };
    algorithm_s(target, x, l, l_gen, k, tau, rng, st, p, draft_tokens, [](auto&, index_t, index_t) {},
                [&](index_t m, index_t a) { dd.rollback(std::min(dd.len, m + a)); });
    return std::vector<index_t>(x.begin() + l, x.end());  // line 21: y = x[ℓ+1 : ℓ+ℓ_gen]
}

// Self-speculation (V16): the model's own MTP modules draft. With x[0 : m] known and the trunk's cache holding
// positions 0..m−2 (H⁰ kept), module j at position m−2 (0-based) sees x[m−2+j] (x[m−1] for j = 1, else the draft
// x̂_{j−1}) and drafts x̂_j = x[m−1+j]: P^j[:, m−2] of V16 line 5. Each module's cache is fed the positions it has not
// seen (with the drafts as tokens) and afterwards keeps only those whose tokens were all kept (t + j ≤ m + a − 1).
// The first pass has no H⁰: it drafts nothing (the target's plain pass over the prompt).
template <class T>
std::vector<index_t> SelfSpeculativeInference(const DTransformer<T>& model, const index_t* x_in, index_t l, index_t l_gen,
                                              index_t k, double tau, Rng& rng, SpeculativeStats* stats) {
    const ModelConfig& c = model.cfg;
    const index_t N_V = c.n_vocab, D = index_t(model.mtp.size());
    check_draft_k(k);
    if (D == 0)
        throw ValueError("self-speculative decoding drafts with the model's multi-token-prediction modules: this model has "
                         "mtp_depth = 0 (pass a draft model, or build the model with mtp_depth >= 1)");
    if (k > D)
        throw ValueError("k = " + std::to_string(k) + " must be <= mtp_depth = " + std::to_string(D) +
                         ": module j drafts the j-th token (self-speculation)");
    if (smallest_window(model) > 0)
        throw ValueError("self-speculative decoding does not take back drafts from a rolling cache: not with the " +
                         model.layer[0]->attn.mask.name() + " mask");
    check_prompt(model, x_in, l, l_gen, tau);
    const index_t need = std::max(l, l + l_gen - 1);
    if (need > c.l_max)
        throw ValueError("speculative decoding needs length(x) + l_gen - 1 <= l_max = " + std::to_string(c.l_max) + " < " +
                         std::to_string(need) + " (shorten the prompt or l_gen)");
    const index_t k_buf = draft_buffers(k, l_gen, N_V);
    const index_t cap = l + l_gen + 1;  // positions of H^j
    check_bytes(checked_mul(checked_mul(D + 1, cap, "self-speculation's hidden states"), c.d_e, "self-speculation's hidden states"),
                sizeof(T), "self-speculation's hidden states");
    SpeculativeStats local;
    SpeculativeStats& st = stats ? *stats : local;
    st = SpeculativeStats();

    std::vector<index_t> x(x_in, x_in + l);
    x.reserve(std::size_t(l + l_gen + k_buf));
    MTPDecoder<T> md;
    md.kv.resize(std::size_t(D));
    md.len.assign(std::size_t(D), 0);
    md.H.resize(std::size_t(D + 1));
    for (auto& H : md.H) ensure(H, c.d_e, cap);
    index_t seen = 0;  // positions of H⁰ held (the trunk's cache)
    std::vector<std::vector<double>> p(static_cast<std::size_t>(k_buf), std::vector<double>(static_cast<std::size_t>(N_V)));
    std::vector<T> z(static_cast<std::size_t>(N_V));
    auto draft_tokens = [&](index_t m, index_t kp, std::vector<std::vector<double>>& pj) -> index_t {
        if (m < 2 || seen != m - 1) return 0;  // no H⁰ at position m − 2 yet (the first pass)
        SingleThreadScope one_thread;           // a few columns per module (as the cached passes)
        for (index_t j = 1; j <= kp; ++j) {
            poll();
            // V16 lines 3–5, cached, one position at a time: a weight times one column is BLAS's gemv, where a
            // product with 2–4 columns packs the whole weight first (docs/speculative_decoding.md "What a round
            // costs"); the logits of the last position are the draft's
            for (index_t t = md.len[std::size_t(j - 1)]; t < m - 1; ++t) mtp_decode(model, md, j, x.data(), t, t + 1, z.data());
            ++st.draft_passes;
            sampling_probs(z.data(), N_V, tau, pj[std::size_t(j - 1)]);  // line 6: p_j
            x.push_back(sample_from(pj[std::size_t(j - 1)], rng));      // line 7: x̂_j
        }
        return kp;
    };
    auto verified = [&](typename DTransformer<T>::Decoder& dt, index_t first, index_t n) {
        CMatView<T> S = view(dt.w.X);  // the trunk's stream after line 9 of the n fed columns: H⁰
        std::copy(S.data, S.data + S.size(), md.H[0].data() + first * c.d_e);
        seen = first + n;
    };
    auto rollback = [&](index_t m, index_t a) {
        seen = std::min(seen, m + a);  // the trunk keeps m + a positions
        for (index_t j = 1; j <= D; ++j) {
            index_t& len = md.len[std::size_t(j - 1)];
            // keep the positions t whose token x[t+j] was kept: t + j ≤ m + a − 1 (0-based; x[m+a] is the new y,
            // where module j had read a rejected draft)
            len = std::max<index_t>(0, std::min(len, m + a - j));
            KVCache<T>& kv = md.kv[std::size_t(j - 1)];
            FT_CHECK(kv.start == 0, "self-speculation: a module's cache has no sliding window");
            kv.len = len;
        }
    };
    algorithm_s(model, x, l, l_gen, k, tau, rng, st, p, draft_tokens, verified, rollback);
    return std::vector<index_t>(x.begin() + l, x.end());
}

template void DTransformer<float>::decode_all(Decoder&, const index_t*, index_t, MatView<float>) const;
template void DTransformer<double>::decode_all(Decoder&, const index_t*, index_t, MatView<double>) const;
template std::vector<index_t> SpeculativeInference<float>(const DTransformer<float>&, const DTransformer<float>&, const index_t*, index_t,
                                                          index_t, index_t, double, Rng&, SpeculativeStats*);
template std::vector<index_t> SpeculativeInference<double>(const DTransformer<double>&, const DTransformer<double>&, const index_t*,
                                                           index_t, index_t, index_t, double, Rng&, SpeculativeStats*);
template std::vector<index_t> SelfSpeculativeInference<float>(const DTransformer<float>&, const index_t*, index_t, index_t, index_t,
                                                              double, Rng&, SpeculativeStats*);
template std::vector<index_t> SelfSpeculativeInference<double>(const DTransformer<double>&, const index_t*, index_t, index_t, index_t,
                                                               double, Rng&, SpeculativeStats*);

}  // namespace ft
