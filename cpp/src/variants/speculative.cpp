// Speculative decoding, Algorithm S of docs/speculative_decoding.md (listing quoted in speculative.hpp):
// a draft DTransformer proposes k tokens, the target verifies them in one cached pass, the rejection rule
// keeps the target's distribution exactly.
#include "formal_transformers/speculative.hpp"
#include "formal_transformers/inference.hpp"

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

template <class T>
std::vector<index_t> SpeculativeInference(const DTransformer<T>& target, const DTransformer<T>& draft, const index_t* x_in,
                                          index_t l, index_t l_gen, index_t k, double tau, Rng& rng,
                                          SpeculativeStats* stats) {
    const ModelConfig& c = target.cfg;
    const index_t N_V = c.n_vocab;
    check_draft_k(k);
    if (draft.cfg.sliding_window > 0 && k >= draft.cfg.sliding_window)
        throw ValueError("k = " + std::to_string(k) + " must be < the draft's sliding_window = " +
                         std::to_string(draft.cfg.sliding_window) +
                         ": its rolling cache (docs/variants.md V9) cannot take back more than w − 1 drafted tokens");
    if (draft.cfg.attention != AttnKernel::Softmax || target.cfg.attention != AttnKernel::Softmax)
        throw ValueError(std::string("speculative decoding takes back rejected drafts from the caches; the ") +
                         (draft.cfg.attention != AttnKernel::Softmax ? "draft" : "target") +
                         "'s attention='performer'/'rfa' folds its past tokens into a state (docs/variants.md V15) that "
                         "cannot forget them");
    if (!(tau >= 0) || !std::isfinite(tau)) throw ValueError("tau must be a finite number >= 0 (0 = argmax), got " + std::to_string(tau));
    check_l_gen(l_gen);
    if (draft.cfg.n_vocab != N_V)
        throw ValueError("the draft and the target must share the vocabulary: draft N_V = " + std::to_string(draft.cfg.n_vocab) +
                         ", target N_V = " + std::to_string(N_V));
    if (l < 1) throw ValueError("the prompt x must have at least one token");
    for (index_t t = 0; t < l; ++t)
        if (x_in[t] < 0 || x_in[t] >= N_V)
            throw IndexError("token id " + std::to_string(x_in[t]) + " at position " + std::to_string(t) + " of x out of range [0, " +
                             std::to_string(N_V) + ")");
    const index_t need = std::max(l, l + l_gen - 1);  // the longest context either model is fed
    for (const DTransformer<T>* mdl : {&target, &draft})
        if (need > mdl->cfg.l_max)
            throw ValueError(std::string("speculative decoding needs length(x) + l_gen - 1 <= l_max of both models; ") +
                             (mdl == &target ? "target" : "draft") + " l_max = " + std::to_string(mdl->cfg.l_max) + " < " +
                             std::to_string(need) + " (no sliding window: shorten the prompt or l_gen)");
    // at most ℓ_gen − 1 tokens are ever drafted in one pass: the buffers are sized by that, not by k (k = 10^8
    // allocated 10^8 distributions for 3 tokens: issue 27), and checked against the allocation bound
    const index_t k_buf = std::max<index_t>(1, std::min(k, l_gen));
    check_bytes(checked_mul(k_buf, N_V, "speculative decoding: the k draft distributions (k * N_V)"), sizeof(double),
                "speculative decoding: the k draft distributions (k * N_V)");
    SpeculativeStats local;
    SpeculativeStats& st = stats ? *stats : local;
    st = SpeculativeStats();

    std::vector<index_t> x(x_in, x_in + l);  // line 1: ℓ ← length(x)
    x.reserve(std::size_t(l + l_gen + k_buf));
    typename DTransformer<T>::Decoder dt, dd;  // the target's and the draft's KV caches
    std::vector<std::vector<double>> p(static_cast<std::size_t>(k_buf), std::vector<double>(static_cast<std::size_t>(N_V)));
    std::vector<double> q, res;
    std::vector<T> zd(static_cast<std::size_t>(N_V));
    Matrix<T> Zt;
    // feed a model the tokens x[d.len : end] its cache has not seen: a long prompt's first fill uses the
    // thread pool; a few columns (every later call, and a short prompt) run on one thread, as DInference —
    // per product a few tens of µs, where a team's fork and barriers cost more than they save, and on a
    // loaded machine a barrier waiting for a descheduled thread costs a time slice
    auto feed = [&](const DTransformer<T>& mdl, typename DTransformer<T>::Decoder& d, auto&& call) {
        const index_t n = index_t(x.size()) - d.len;
        FT_CHECK(n >= 1, "speculative decoding: nothing to feed");
        if (n > kFewColumns) {
            call(mdl, d, n);
        } else {
            SingleThreadScope one_thread;
            call(mdl, d, n);
        }
    };

    while (index_t(x.size()) < l + l_gen) {                    // line 2
        poll();
        const index_t m = index_t(x.size());                    // line 3
        const index_t kp = std::min<index_t>(k, l + l_gen - m - 1);
        for (index_t j = 0; j < kp; ++j) {                      // line 4 (j 0-based)
            poll();
            feed(draft, dd, [&](const DTransformer<T>& mdl, auto& d, index_t n) {
                mdl.decode(d, x.data() + d.len, n, zd.data());  // line 5: P̃[:, m + j − 1], cached
            });
            ++st.draft_passes;
            sampling_probs(zd.data(), N_V, tau, p[std::size_t(j)]);  // line 6: p_j ∝ P̃[:, m+j−1]^{1/τ}
            x.push_back(sample_from(p[std::size_t(j)], rng));       // line 7: x̂_j ~ p_j (kept after x for now)
        }                                                           // line 8
        const index_t c0 = m - 1 - dt.len;  // the column of P[:, m − 1] (1-based m) among those fed now
        feed(target, dt, [&](const DTransformer<T>& mdl, auto& d, index_t n) {
            mdl.decode_all(d, x.data() + d.len, n, ensure(Zt, N_V, n));  // line 9: one pass, k' + 1 new columns
        });
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
        dd.rollback(std::min(dd.len, m + a));
        st.drafted.push_back(kp);
        st.accepted.push_back(a);
    }  // line 20
    return std::vector<index_t>(x.begin() + l, x.end());  // line 21: y = x[ℓ+1 : ℓ+ℓ_gen]
}

template void DTransformer<float>::decode_all(Decoder&, const index_t*, index_t, MatView<float>) const;
template void DTransformer<double>::decode_all(Decoder&, const index_t*, index_t, MatView<double>) const;
template std::vector<index_t> SpeculativeInference<float>(const DTransformer<float>&, const DTransformer<float>&, const index_t*, index_t,
                                                          index_t, index_t, double, Rng&, SpeculativeStats*);
template std::vector<index_t> SpeculativeInference<double>(const DTransformer<double>&, const DTransformer<double>&, const index_t*,
                                                           index_t, index_t, index_t, double, Rng&, SpeculativeStats*);

}  // namespace ft
