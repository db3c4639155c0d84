// Algorithms 14 and 15, with the literal and the KV-cached paths side by side.
#include "formal_transformers/inference.hpp"

#include "formal_transformers/paged.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace ft {

void SamplingOptions::check() const {
    if (!(tau >= 0) || !std::isfinite(tau)) throw ValueError("tau must be a finite number >= 0 (0 = argmax), got " + std::to_string(tau));
    if (top_k < 0) throw ValueError("top_k must be >= 0 (0 = no limit), got " + std::to_string(top_k));
    if (!(top_p > 0 && top_p <= 1)) throw ValueError("top_p must be in (0, 1], got " + std::to_string(top_p));
}

template <class T>
index_t sample_token(const T* z, index_t n, const SamplingOptions& o, Rng& rng, std::vector<double>& q,
                     std::vector<index_t>& order) {
    if (o.tau == 0) {  // the limit τ → 0 of q ∝ p^{1/τ}: the most probable token (first of ties)
        return index_t(std::max_element(z, z + n) - z);
    }
    // q ∝ p^{1/τ} = exp(z/τ)/Σ exp(z/τ), in double, max-subtracted
    q.resize(std::size_t(n));
    const double m = double(*std::max_element(z, z + n));
    double s = 0;
    for (index_t i = 0; i < n; ++i) s += (q[std::size_t(i)] = std::exp((double(z[i]) - m) / o.tau));
    // candidates by decreasing q (only needed for top-k / top-p)
    index_t keep = n;
    const bool restrict = (o.top_k > 0 && o.top_k < n) || o.top_p < 1;
    if (restrict) {
        order.resize(std::size_t(n));
        std::iota(order.begin(), order.end(), index_t(0));
        std::stable_sort(order.begin(), order.end(), [&](index_t a, index_t b) { return q[std::size_t(a)] > q[std::size_t(b)]; });
        if (o.top_k > 0) keep = std::min(keep, o.top_k);
        if (o.top_p < 1) {  // the nucleus of q restricted to the top_k candidates and renormalised
            double s_k = 0;
            for (index_t k = 0; k < keep; ++k) s_k += q[std::size_t(order[std::size_t(k)])];
            double acc = 0;
            index_t k = 0;
            while (k < keep) {
                acc += q[std::size_t(order[std::size_t(k)])] / s_k;
                ++k;
                if (acc >= o.top_p) break;
            }
            keep = k;
        }
        double s2 = 0;
        for (index_t k = 0; k < keep; ++k) s2 += q[std::size_t(order[std::size_t(k)])];
        double u = rng.uniform() * s2;
        for (index_t k = 0; k < keep; ++k) {
            u -= q[std::size_t(order[std::size_t(k)])];
            if (u < 0) return order[std::size_t(k)];
        }
        return order[std::size_t(keep - 1)];
    }
    double u = rng.uniform() * s;  // inverse CDF
    for (index_t i = 0; i < n; ++i) {
        u -= q[std::size_t(i)];
        if (u < 0) return i;
    }
    for (index_t i = n - 1; i >= 0; --i)  // rounding: the last token with mass
        if (q[std::size_t(i)] > 0) return i;
    return n - 1;
}

void check_l_gen(index_t l_gen, index_t l_prompt) {
    if (l_gen < 0) throw ValueError("l_gen must be >= 0, got " + std::to_string(l_gen));
    // against the allocation bound: a ValueError naming l_gen, not MemoryError or "vector::reserve"
    check_bytes(checked_add(l_prompt, l_gen, "l_gen (the tokens to generate)"), sizeof(index_t),
                "l_gen (the tokens to generate)");
}

// ======================================== Algorithm 14 ================================================
// pre: a prompt cache of x_in (paged.hpp), the result of the cached path's first pass, used instead of it
template <class T>
std::vector<index_t> dinference(DTransformer<T>& model, const index_t* x_in, index_t l, index_t l_gen,
                                const SamplingOptions& o, Rng& rng, const PromptKV<T>* pre, index_t prefix_len) {
    o.check();
    const ModelConfig& c = model.cfg;
    check_l_gen(l_gen);
    validate(Tokens{x_in, Seqs::single(l)}, c.n_vocab, c.l_max, "x");  // the prompt fits ℓ_max
    // V7: the prompt's prefix (default: all of it for a prefix LM, none otherwise), checked as a call's prefix_len
    const bool prefix_lm = per_call_mask(c.mask);
    const index_t p = prefix_len == kDefaultPrefix ? (prefix_lm ? l : 0) : prefix_len;
    if (prefix_len != kDefaultPrefix) validate(Tokens{x_in, Seqs::single(l), &p}, c, "x");
    check_l_gen(l_gen, l);  // x grows to ℓ + ℓ_gen ids (reserved below only up to what a few steps need)
    if (o.context == SamplingOptions::Context::Full && position_table(c.positional) != Positional::None)
        throw ValueError("context='full' (past l_max) needs positions without a table (positional='rope' or "
                         "'alibi'); this model's positions are a table of l_max columns");
    const bool full = decodes_full_context(o, model);  // auto: the model's parts say (ALiBi; a window with RoPE)
    std::vector<index_t> x(x_in, x_in + l);                             // line 1: ℓ ← length(x)
    x.reserve(std::size_t(l + std::min<index_t>(l_gen, index_t(1) << 16)));
    std::vector<T> z(std::size_t(c.n_vocab));
    std::vector<double> q;
    std::vector<index_t> order;
    Matrix<T> zcol;
    typename DTransformer<T>::Decoder dec;
    index_t fed = 0;  // cached path: tokens of x already in the caches (a window starting at `start`)
    index_t start = 0;
    for (index_t i = 1; i <= l_gen; ++i) {  // line 2
        poll();
        const index_t len = index_t(x.size());
        const index_t w0 = full ? 0 : std::max<index_t>(0, len - c.l_max);  // the model sees x[w0:len]
        const index_t pw = std::max<index_t>(0, p - w0);                      // V7: the window's prefix
        if (!o.cache) {
            // line 3: P ← DTransformer(x | θ̂) on the window; line 4: p ← P[:, ℓ + i − 1] (its last column)
            model.forward(Tokens{x.data() + w0, Seqs::single(len - w0), pw > 0 ? &pw : nullptr});
            model.unemb->logits(model.store, model.out().cols_range(len - w0 - 1, 1), ensure(zcol, c.n_vocab, 1));
            std::copy(zcol.data(), zcol.data() + c.n_vocab, z.begin());
        } else {
            if (pre && fed == 0) {  // the first pass, from the prompt cache: its keys, values and logits
                dec.reset();
                dec.kv.resize(std::size_t(c.L));
                for (index_t j = 0; j < c.L; ++j) {
                    KVCache<T>& kv = dec.kv[std::size_t(j)];
                    kv.K = pre->K[std::size_t(j)], kv.V = pre->V[std::size_t(j)];
                    kv.len = l, kv.start = 0;
                }
                dec.len = l;
                std::copy(pre->z.begin(), pre->z.end(), z.begin());
            } else if (w0 != start || fed == 0) {  // first call, or the window slid: (re)fill the caches
                dec.reset();
                dec.prefix = pw;
                start = w0;
                if (len - w0 > kFewColumns) {  // a long context: the thread pool
                    model.decode(dec, x.data() + w0, len - w0, z.data());
                } else {  // a short prompt: a few columns, one thread (as every later step)
                    SingleThreadScope one_thread;
                    model.decode(dec, x.data() + w0, len - w0, z.data());
                }
            } else {  // feed only the tokens not yet seen: one column of work per layer, on one thread
                SingleThreadScope one_thread;
                model.decode(dec, x.data() + fed, len - fed, z.data());
            }
            fed = len;
        }
        const index_t y = sample_token(z.data(), c.n_vocab, o, rng, q, order);  // line 5: y ~ q ∝ p^{1/τ}
        x.push_back(y);                                                         // line 6: x ← [x, y]
    }
    return std::vector<index_t>(x.begin() + l, x.end());  // line 8: y = x[ℓ+1 : ℓ+ℓ_gen]
}

template <class T>
std::vector<index_t> DInference(DTransformer<T>& model, const index_t* x_in, index_t l, index_t l_gen,
                                const SamplingOptions& o, Rng& rng, index_t prefix_len) {
    return dinference(model, x_in, l, l_gen, o, rng, static_cast<const PromptKV<T>*>(nullptr), prefix_len);
}

template <class T>
std::vector<index_t> DInference(DTransformer<T>& model, const PromptKV<T>& cache, index_t l_gen,
                                const SamplingOptions& o, Rng& rng) {
    cache.check(model);
    // literal path (cache = false): the listing recomputes everything from the ids anyway
    if (per_call_mask(model.cfg.mask))
        throw ValueError("prompt caches of a prefix LM (mask='prefix') are not supported: decode it with prefix_len");
    return dinference(model, cache.ids.data(), index_t(cache.ids.size()), l_gen, o, rng, o.cache ? &cache : nullptr,
                      kDefaultPrefix);
}

// ======================================== Algorithm 15 ================================================
// z: token ids (l_z of them), or f: one spectrogram (the audio encoder, V28): the context the encoder reads
template <class T>
static std::vector<index_t> edinference(EDTransformer<T>& model, const index_t* z, index_t l_z, const Features<T>* f,
                                        const SamplingOptions& o, Rng& rng, index_t max_len) {
    o.check();
    const ModelConfig& c = model.cfg;
    if (max_len < 0 || max_len > c.l_max)
        throw ValueError("max_len must be in [1, l_max = " + std::to_string(c.l_max) + "], got " + std::to_string(max_len));
    if (max_len == 0) max_len = c.l_max;
    Tokens zt{z, Seqs::single(l_z)};
    if (f) {
        if (f->s.count() != 1)
            throw ValueError("EDInference decodes one feature matrix at a time: " + model.encoder_input().what);
        zt = Tokens{nullptr, Seqs::single(0)};  // (its columns: the model's)
    } else {
        if (model.audio())
            throw TypeError("this EDTransformer's encoder takes " + model.encoder_input().what + ", not token ids z");
        validate(zt, c.n_vocab, c.l_max, "z");
    }
    std::vector<index_t> x_hat = {c.bos_token()};  // line 1: x̂ ← [bos_token]
    index_t y = -1;  // line 2: y ← 0, "no token yet" — never eos_token, whatever its id (eos_id = 0, or = bos_id as BART's)
    std::vector<T> p(std::size_t(c.n_vocab));
    std::vector<double> q;
    std::vector<index_t> order;
    Matrix<T> zcol;
    typename EDTransformer<T>::Decoder dec;
    if (o.cache) {  // the encoder (lines 1–9 of Algorithm 8) runs once per z
        if (f) model.encode(dec, *f);
        else model.encode(dec, z, l_z);
    }
    while (y != c.eos_token() && index_t(x_hat.size()) < max_len) {  // line 3 (and the length cap)
        poll();
        const index_t n = index_t(x_hat.size());
        if (!o.cache) {
            if (f) model.forward(*f, Tokens{x_hat.data(), Seqs::single(n)});  // line 4
            else model.forward(zt, Tokens{x_hat.data(), Seqs::single(n)});
            model.unemb->logits(model.store, model.out().cols_range(n - 1, 1), ensure(zcol, c.n_vocab, 1));  // line 5
            std::copy(zcol.data(), zcol.data() + c.n_vocab, p.begin());
        } else {
            SingleThreadScope one_thread;                          // one column of work per layer
            model.decode(dec, x_hat.data() + n - 1, 1, p.data());  // lines 4–5 for the newest token only
        }
        if (c.forced_eos && n + 1 == max_len) y = c.eos_token();       // V22: the last place is eos_token's
        else if (n == 1 && c.forced_bos_id >= 0) y = c.forced_bos_id;  // V22: the first generated token is forced
        else y = sample_token(p.data(), c.n_vocab, o, rng, q, order);  // line 6
        x_hat.push_back(y);                                             // line 7: x̂ ← [x̂, y]
    }
    return x_hat;  // line 9
}

template <class T>
std::vector<index_t> EDInference(EDTransformer<T>& model, const index_t* z, index_t l_z, const SamplingOptions& o,
                                 Rng& rng, index_t max_len) {
    return edinference<T>(model, z, l_z, nullptr, o, rng, max_len);
}
template <class T>
std::vector<index_t> EDInference(EDTransformer<T>& model, const Features<T>& f, const SamplingOptions& o, Rng& rng,
                                 index_t max_len) {
    return edinference<T>(model, nullptr, 0, &f, o, rng, max_len);
}

template index_t sample_token<float>(const float*, index_t, const SamplingOptions&, Rng&, std::vector<double>&, std::vector<index_t>&);
template index_t sample_token<double>(const double*, index_t, const SamplingOptions&, Rng&, std::vector<double>&, std::vector<index_t>&);
template std::vector<index_t> DInference<float>(DTransformer<float>&, const index_t*, index_t, index_t, const SamplingOptions&, Rng&, index_t);
template std::vector<index_t> DInference<double>(DTransformer<double>&, const index_t*, index_t, index_t, const SamplingOptions&, Rng&, index_t);
template std::vector<index_t> DInference<float>(DTransformer<float>&, const PromptKV<float>&, index_t, const SamplingOptions&, Rng&);
template std::vector<index_t> DInference<double>(DTransformer<double>&, const PromptKV<double>&, index_t, const SamplingOptions&, Rng&);
template std::vector<index_t> EDInference<float>(EDTransformer<float>&, const index_t*, index_t, const SamplingOptions&, Rng&, index_t);
template std::vector<index_t> EDInference<double>(EDTransformer<double>&, const index_t*, index_t, const SamplingOptions&, Rng&, index_t);
template std::vector<index_t> EDInference<float>(EDTransformer<float>&, const Features<float>&, const SamplingOptions&, Rng&, index_t);
template std::vector<index_t> EDInference<double>(EDTransformer<double>&, const Features<double>&, const SamplingOptions&, Rng&, index_t);

}  // namespace ft
