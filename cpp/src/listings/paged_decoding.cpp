// Algorithm P (paged.hpp, docs/paged_decoding.md): Algorithm 14 for many prompts at once, the keys and values in
// pages of P tokens with a block table per sequence (PagedAttention, Kwon et al. 2023), the active sequences
// decoded together (one gemm per projection over the batch), finished sequences leaving and waiting ones
// joining (continuous batching). And the prompt caches: Algorithm 14's first pass kept and continued.
#include "formal_transformers/paged.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>

#include <omp.h>

#include "formal_transformers/blas.hpp"
#include "formal_transformers/functions.hpp"

namespace ft {

// ---------------------------------------------------------------------------------------------------
// Prompt caches

template <class T>
void PromptKV<T>::check(const DTransformer<T>& model) const {
    const ModelConfig& c = model.cfg;
    const MHAttention<T>& a = model.layer[0]->attn;
    const index_t l = index_t(ids.size());
    if (l < 1 || l > c.l_max)
        throw ValueError("the prompt cache holds " + std::to_string(l) + " tokens; a prompt has 1 … l_max = " +
                         std::to_string(c.l_max));
    for (index_t t : ids)
        if (t < 0 || t >= c.n_vocab) throw IndexError("the prompt cache holds token id " + std::to_string(t) + ", out of range");
    if (index_t(K.size()) != c.L || index_t(V.size()) != c.L || index_t(z.size()) != c.n_vocab)
        throw ValueError("the prompt cache was made by another model (its layers or vocabulary differ)");
    for (index_t i = 0; i < c.L; ++i) {
        const Matrix<T>&Ki = K[std::size_t(i)], &Vi = V[std::size_t(i)];
        if (index_t(Ki.shape(0)) != a.H_kv * a.d_attn || index_t(Ki.shape(1)) != l ||
            index_t(Vi.shape(0)) != a.H_kv * a.d_mid || index_t(Vi.shape(1)) != l)
            throw ValueError("the prompt cache was made by another model (layer " + std::to_string(i) +
                             "'s keys or values have other shapes)");
    }
}

// Algorithm P's pages hold each head's keys and values, made by Algorithm 4's W_k, W_v: latent attention (V10,
// whose cache is the latent) and random-feature attention (V15, whose state is a running sum) decode one prompt
// at a time (DInference), not here yet.
// A source that is the listing's projections (V20's qkv_bias: W_k, W_v with their biases) pages as the listing; so
// does V24's QK-norm (it keeps each head's normalised key: its pages are Algorithm 4's, made through the source).
template <class T>
void check_paged_model(const DTransformer<T>& m, const char* what) {
    const ModelConfig& c = m.cfg;
    const PartRow* s = chosen_part(c, PartKind::QKVSource);
    if (s && std::string(s->name) == "qk_norm") s = nullptr;
    if (s && !m.layer.empty() && dynamic_cast<const Projections<T>*>(m.layer[0]->attn.source.get())) s = nullptr;
    if (s)
        throw ValueError(std::string(what) + " of a model with the '" + s->name + "' Q/K/V source (" + s->options[0].name +
                         ") is not supported: decode each prompt with DInference(...)(x, model)");
    if (!head_kernel_has(c.attention, HeadKernelProperty::ScoreSoftmax))  // (it forms the softmax itself, page by page)
        throw ValueError("attention='" + c.attention + "' has no " + what +
                         " (its weights are not a softmax of scores that can be formed page by page): decode each "
                         "prompt with DInference(...)(x, model)");
}

template <class T>
PromptKV<T> prefill(const DTransformer<T>& model, const index_t* x, index_t l) {
    if (per_call_mask(model.cfg.mask))
        throw ValueError("prompt caches of a prefix LM (mask='prefix') are not supported: decode it with prefix_len");
    check_paged_model(model, "prompt caches");
    const ModelConfig& c = model.cfg;
    validate(Tokens{x, Seqs::single(l)}, c.n_vocab, c.l_max, "x");  // 1 ≤ ℓ ≤ ℓ_max, ids in range
    PromptKV<T> r;
    r.ids.assign(x, x + l);
    r.z.resize(std::size_t(c.n_vocab));
    typename DTransformer<T>::Decoder dec;
    if (l > kFewColumns) {  // as Algorithm 14's first pass (inference.cpp): the same threads, the same numbers
        model.decode(dec, x, l, r.z.data());
    } else {
        SingleThreadScope one_thread;
        model.decode(dec, x, l, r.z.data());
    }
    for (const KVCache<T>& kv : dec.kv) {
        FT_CHECK(kv.start == 0 && kv.len == l, "prefill: the first pass keeps every prompt column");
        const index_t rk = index_t(kv.K.shape(0)), rv = index_t(kv.V.shape(0));
        Matrix<T> K = Matrix<T>::from_shape({std::size_t(rk), std::size_t(l)});
        Matrix<T> V = Matrix<T>::from_shape({std::size_t(rv), std::size_t(l)});
        std::copy(kv.K.data(), kv.K.data() + rk * l, K.data());
        std::copy(kv.V.data(), kv.V.data() + rv * l, V.data());
        r.K.push_back(std::move(K));
        r.V.push_back(std::move(V));
    }
    return r;
}

template <class T>
std::uint64_t theta_digest(const ParamStore<T>& store) {
    return bytes_digest(store.theta(), std::size_t(store.size()) * sizeof(T));
}

std::uint64_t bytes_digest(const void* data, std::size_t n) {
    // four interleaved multiply–xorshift lanes over the 64-bit words (memory speed), then mixed together
    const unsigned char* p = static_cast<const unsigned char*>(data);
    const std::size_t words = n / 8;
    constexpr std::uint64_t k = 0x9E3779B97F4A7C15ull;
    std::uint64_t h[4] = {k, k ^ 1, k ^ 2, k ^ 3};
    auto mix = [](std::uint64_t a) {
        a ^= a >> 33, a *= 0xFF51AFD7ED558CCDull, a ^= a >> 33, a *= 0xC4CEB9FE1A85EC53ull, a ^= a >> 33;
        return a;
    };
    for (std::size_t i = 0; i < words; ++i) {
        std::uint64_t w;
        std::memcpy(&w, p + 8 * i, 8);
        std::uint64_t& s = h[i & 3];
        s = (s ^ w) * k;
        s ^= s >> 29;
    }
    std::uint64_t tail = 0;
    std::memcpy(&tail, p + 8 * words, n - 8 * words);
    std::uint64_t r = mix(n ^ tail);
    for (std::uint64_t s : h) r = mix(r ^ mix(s));
    return r;
}

// ---------------------------------------------------------------------------------------------------
// Algorithm P

namespace {

// The pages of every layer: page p of layer l is K[l] columns [p·P, (p+1)·P) (and V likewise).
template <class T>
struct PagePool {
    index_t rows_k = 0, rows_v = 0, n_pages = 0;
    std::vector<Matrix<T>> K, V;
    std::vector<index_t> free;

    PagePool(index_t L, index_t rk, index_t rv) : rows_k(rk), rows_v(rv), K(std::size_t(L)), V(std::size_t(L)) {}
    void grow(index_t more) {
        const index_t n2 = checked_add(n_pages, more, "KV cache pages");
        check_bytes(checked_mul(checked_mul(n2, kPageTokens, "KV cache pages"), (rows_k + rows_v) * index_t(K.size()),
                                "KV cache pages"),
                    sizeof(T), "KV cache pages");
        for (std::size_t l = 0; l < K.size(); ++l) {
            Matrix<T> K2 = Matrix<T>::from_shape({std::size_t(rows_k), std::size_t(n2 * kPageTokens)});
            Matrix<T> V2 = Matrix<T>::from_shape({std::size_t(rows_v), std::size_t(n2 * kPageTokens)});
            std::copy(K[l].data(), K[l].data() + rows_k * n_pages * kPageTokens, K2.data());
            std::copy(V[l].data(), V[l].data() + rows_v * n_pages * kPageTokens, V2.data());
            K[l] = std::move(K2);
            V[l] = std::move(V2);
        }
        for (index_t p = n2 - 1; p >= n_pages; --p) free.push_back(p);
        n_pages = n2;
    }
    index_t acquire() {
        if (free.empty()) grow(std::max<index_t>(n_pages, 16));
        const index_t p = free.back();
        free.pop_back();
        return p;
    }
    // column t mod P of page p, layer l
    T* key(index_t l, index_t p, index_t j) { return K[std::size_t(l)].data() + (p * kPageTokens + j) * rows_k; }
    T* val(index_t l, index_t p, index_t j) { return V[std::size_t(l)].data() + (p * kPageTokens + j) * rows_v; }
};

template <class T>
struct Sequence {
    index_t id = 0;              // its place in the call's list
    std::vector<index_t> x;      // the prompt, then the sampled tokens
    index_t l = 0;               // the prompt's length
    std::vector<index_t> table;  // β: the page of tokens [k·P, (k+1)·P); −1 once a sliding window left it
    index_t cached = 0;          // tokens whose keys and values are in the pages (positions 0 … cached−1)
    bool windowed = false;       // past ℓ_max with context "window": refilled from the window each step
};

template <class T>
void release(PagePool<T>& pool, Sequence<T>& s) {
    for (index_t& p : s.table)
        if (p >= 0) pool.free.push_back(p), p = -1;
}

// Line 10: the keys and values of column j of Kn, Vn (layer l) become token t of s.
template <class T>
void put(PagePool<T>& pool, Sequence<T>& s, index_t l, index_t t, const T* k, const T* v) {
    const index_t page = t / kPageTokens;
    while (index_t(s.table.size()) <= page) s.table.push_back(pool.acquire());
    std::copy(k, k + pool.rows_k, pool.key(l, s.table[std::size_t(page)], t % kPageTokens));
    std::copy(v, v + pool.rows_v, pool.val(l, s.table[std::size_t(page)], t % kPageTokens));
}

// Line 11 for one head: query q (d_attn) at position t over the keys 0 … t of s in layer l (key/value head g);
// S: scratch of t + 1 entries; y (d_mid) ← Σ_pages V_page softmax(…). The candidates of the mask only (a
// sliding window: the last w), the score bias on them, as attention_head does (attention.cpp).
template <class T>
void paged_head(const MHAttention<T>& a, const ParamStore<T>& store, PagePool<T>& pool, const Sequence<T>& s,
                index_t l, index_t h, index_t t, const T* q, T* S, T* y) {
    const index_t g = a.kv_head(h), lz = t + 1;
    KeyRange r = a.mask.keys(0, t, lz);
    r.begin = std::max<index_t>(r.begin, 0), r.end = std::min(r.end, lz);
    const T scale = a.kernel->score_scale(a.d_attn);  // the listing's 1/√d_attn (V25: 1/√s)
    for (index_t t0 = r.begin; t0 < r.end;) {  // Algorithm 4 line 4 page by page: S[t0:t1] ← K_pageᵀ q/√d_attn
        const index_t page = s.table[std::size_t(t0 / kPageTokens)], j0 = t0 % kPageTokens;
        const index_t t1 = std::min(r.end, t0 - j0 + kPageTokens);
        CMatView<T> Kp(pool.key(l, page, j0) + g * a.d_attn, a.d_attn, t1 - t0, pool.rows_k);
        gemv<T>(Op::T, scale, Kp, q, T(0), S + t0);
        t0 = t1;
    }
    a.kernel->transform_scores(S + r.begin, r.end - r.begin);  // (V25: c·tanh(S/c))
    if (a.position.bias)  // line 6: + B^h (ALiBi), on the candidates
        a.position.bias->add(store, a.mask, 0, h, t, MatView<T>(S, lz, 1));
    if (!r.dense)  // line 5
        for (index_t tz = r.begin; tz < r.end; ++tz)
            if (!a.mask.allows(tz, t, 0)) S[tz] = -std::numeric_limits<T>::infinity();
    softmax_column(S + r.begin, r.end - r.begin);  // line 6: softmax
    bool first = true;
    for (index_t t0 = r.begin; t0 < r.end;) {  // line 6: Ṽ ← V A, page by page
        const index_t page = s.table[std::size_t(t0 / kPageTokens)], j0 = t0 % kPageTokens;
        const index_t t1 = std::min(r.end, t0 - j0 + kPageTokens);
        CMatView<T> Vp(pool.val(l, page, j0) + g * a.d_mid, a.d_mid, t1 - t0, pool.rows_v);
        gemv<T>(Op::N, T(1), Vp, S + t0, first ? T(0) : T(1), y);
        first = false;
        t0 = t1;
    }
}

template <class T>
struct StepScratch {
    Matrix<T> X, Xt, Q, Kn, Vn, Y, Z, R;
    MHAttentionCache<T> src;  // the Q/K/V source's scratch
    std::vector<T> S;  // per thread: t + 1 scores
    std::vector<index_t> ids, pos;
    DecodeScratch<T> d;
};

// Lines 6–13 (without the sampling) for the active sequences `act`, each feeding its last token at position
// t_b = |x| − 1: the logits of each into Z[:, b].
template <class T>
void batched_step(const DTransformer<T>& m, PagePool<T>& pool, std::vector<Sequence<T>*>& act, StepScratch<T>& w) {
    const ModelConfig& c = m.cfg;
    const ParamStore<T>& store = m.store;
    const index_t B = index_t(act.size());
    w.ids.resize(std::size_t(B)), w.pos.resize(std::size_t(B));
    index_t t_max = 0;
    for (index_t b = 0; b < B; ++b) {
        const Sequence<T>& s = *act[std::size_t(b)];
        w.ids[std::size_t(b)] = s.x.back(), w.pos[std::size_t(b)] = index_t(s.x.size()) - 1;
        FT_CHECK(s.cached == w.pos[std::size_t(b)], "paged step: every earlier token is cached");
        t_max = std::max(t_max, w.pos[std::size_t(b)]);
    }
    MatView<T> X = ensure(w.X, c.d_e, B), Xt = ensure(w.Xt, c.d_e, B);
    m.emb->forward_at(store, EmbedInput<T>{m.tok, w.ids.data(), B}, m.pos, w.pos.data(), X);  // line 6: W_e[:, x_b]
                                                                                             //   + W_p[:, t_b] (none for RoPE, ALiBi)
    const int n_threads = blas_is_openmp() ? std::max(get_num_threads(), omp_get_max_threads()) : 1;
    w.S.resize(std::size_t(n_threads) * std::size_t(t_max + 1));
    for (index_t l = 0; l < c.L; ++l) {  // line 7: the layer's block, its attention over the pages (lines 9–12)
        m.layer[std::size_t(l)]->forward_cached(store, X, [&](const MHAttention<T>& a, CMatView<T> Xt, MatView<T> out) {
            const T* bo = a.var.bias ? store.v(a.b_o) : nullptr;
            MatView<T> Q = ensure(w.Q, a.H * a.d_attn, B), Kn = ensure(w.Kn, pool.rows_k, B), Vn = ensure(w.Vn, pool.rows_v, B);
            // line 9 through the attention's Q/K/V source, one gemm each over the batch (the sources taken here place
            // no positions themselves: the columns' positions differ and the position part rotates them below)
            a.source->queries(store, Xt, 0, Q, w.src);
            a.source->append(store, Xt, 0, Kn, Vn);
            for (index_t b = 0; b < B; ++b) {
                const index_t t = w.pos[std::size_t(b)];
                if (a.position.qk) {  // RoPE (V1): keys and queries rotated at their positions
                    a.position.qk->forward(Kn.cols_range(b, 1), QKTransform<T>::Role::Key, a.H_kv, Seqs::single(1), t);
                    a.position.qk->forward(Q.cols_range(b, 1), QKTransform<T>::Role::Query, a.H, Seqs::single(1), t);
                }
                put(pool, *act[std::size_t(b)], l, t, Kn.col(b), Vn.col(b));  // line 10
            }
            MatView<T> Y = ensure(w.Y, a.H * a.d_mid, B);
            const index_t n_blocks = B * a.H;
            auto head = [&](index_t bh, int thread) {
                const index_t b = bh / a.H, h = bh % a.H;
                paged_head(a, store, pool, *act[std::size_t(b)], l, h, w.pos[std::size_t(b)], Q.col(b) + h * a.d_attn,
                           w.S.data() + std::size_t(thread) * std::size_t(t_max + 1), Y.col(b) + h * a.d_mid);
            };
            if (n_threads > 1 && n_blocks > 1 && n_blocks * (t_max + 1) * a.d_attn >= 65536) {
                const ProductContext products = product_context();  // the caller's precision, on every thread
#pragma omp parallel for schedule(dynamic)
                for (index_t bh = 0; bh < n_blocks; ++bh) {
                    ProductScope scope(products);
                    head(bh, omp_get_thread_num());  // line 11 (gemv on the caller's thread)
                }
            } else {
                for (index_t bh = 0; bh < n_blocks; ++bh) head(bh, 0);
            }
            affine_add<T>(store.W(a.W_o), Y, bo, out);  // line 12: X ← X + W_o Ỹ + b_o 1ᵀ
        }, w.d);
        poll();
    }
    m.norm_f->forward(store, X, Xt, w.d.norm);                          // line 13: layer_norm(X | γ, β)
    m.unemb->logits(store, Xt, ensure(w.Z, c.n_vocab, B));              //   W_u X̃, the logits
}

}  // namespace

template <class T>
std::vector<std::vector<index_t>> DInferenceBatch(DTransformer<T>& model, const std::vector<PromptRef<T>>& prompts,
                                                  index_t l_gen, const SamplingOptions& o, std::vector<Rng>& rngs,
                                                  index_t max_batch) {
    o.check();
    const ModelConfig& c = model.cfg;
    const index_t S = index_t(prompts.size());
    // every check before anything runs
    check_l_gen(l_gen);
    if (max_batch < 1) throw ValueError("max_batch must be >= 1, got " + std::to_string(max_batch));
    if (per_call_mask(c.mask))
        throw ValueError("batched decoding of a prefix LM (mask='prefix') is not supported: decode each prompt with "
                         "DInference(...)(x, model, prefix_len=p)");
    check_paged_model(model, "batched decoding");
    if (index_t(rngs.size()) != S) throw ValueError("one random stream per prompt");
    for (index_t i = 0; i < S; ++i) {
        const PromptRef<T>& p = prompts[std::size_t(i)];
        if (p.cache) {
            p.cache->check(model);
        } else {
            if (p.len < 1 || p.len > c.l_max)
                throw ValueError("prompts[" + std::to_string(i) + "] has length " + std::to_string(p.len) +
                                 "; a prompt has 1 … l_max = " + std::to_string(c.l_max) + " tokens");
            const std::string what = "prompts[" + std::to_string(i) + "]";
            validate(Tokens{p.ids, Seqs::single(p.len)}, c.n_vocab, c.l_max, what.c_str());
        }
        check_bytes(checked_add(p.cache ? index_t(p.cache->ids.size()) : p.len, l_gen, "l_gen (the tokens to generate)"),
                    sizeof(index_t), "l_gen (the tokens to generate)");
    }
    if (o.context == SamplingOptions::Context::Full && position_table(c.positional) != Positional::None)
        throw ValueError("context='full' (past l_max) needs positions without a table (positional='rope' or "
                         "'alibi'); this model's positions are a table of l_max columns");
    std::vector<std::vector<index_t>> out(static_cast<std::size_t>(S));
    if (l_gen == 0 || S == 0) return out;
    if (!o.cache) {  // the literal path: each prompt alone (Algorithm 14 as printed)
        for (index_t i = 0; i < S; ++i) {
            const PromptRef<T>& p = prompts[std::size_t(i)];
            out[std::size_t(i)] = p.cache ? DInference(model, p.cache->ids.data(), index_t(p.cache->ids.size()), l_gen, o, rngs[std::size_t(i)])
                                          : DInference(model, p.ids, p.len, l_gen, o, rngs[std::size_t(i)]);
        }
        return out;
    }
    const bool full = decodes_full_context(o, model);
    const MHAttention<T>& a0 = model.layer[0]->attn;
    // what the pages keep is the masks' (V9: a window's): a page goes back only when no layer's mask reads it (V26:
    // the global layers of a model with local ones read every key)
    std::vector<CacheKeep> keeps;
    for (const auto& blk : model.layer) keeps.push_back(blk->attn.mask.cache_keep());
    PagePool<T> pool(c.L, a0.H_kv * a0.d_attn, a0.H_kv * a0.d_mid);
    {  // the pages the first B_max sequences will hold (more are added as needed)
        index_t need = 0;
        for (index_t i = 0; i < std::min(S, max_batch); ++i) {
            const PromptRef<T>& p = prompts[std::size_t(i)];
            index_t len = (p.cache ? index_t(p.cache->ids.size()) : p.len) + l_gen;
            if (!full) len = std::min(len, c.l_max);
            need += (len + kPageTokens - 1) / kPageTokens;
        }
        pool.grow(std::max<index_t>(need, 1));
    }
    std::deque<index_t> waiting;  // line 1
    for (index_t i = 0; i < S; ++i) waiting.push_back(i);
    std::vector<Sequence<T>> seqs(static_cast<std::size_t>(S));
    std::vector<Sequence<T>*> active, batch;
    std::vector<T> z(std::size_t(c.n_vocab));
    std::vector<double> q;
    std::vector<index_t> order;
    typename DTransformer<T>::Decoder dec;  // the one-sequence cache of a first pass or a refill
    StepScratch<T> w;
    // line 5/13's sampling: y from q ∝ p^{1/τ}, x ← [x, y]; true when s has its ℓ_gen tokens (line 14)
    auto sample = [&](Sequence<T>& s, const T* logits) {
        s.x.push_back(sample_token(logits, c.n_vocab, o, rngs[std::size_t(s.id)], q, order));
        return index_t(s.x.size()) - s.l == l_gen;
    };
    auto finish = [&](Sequence<T>& s) {
        release(pool, s);
        out[std::size_t(s.id)].assign(s.x.begin() + s.l, s.x.end());  // line 15
        std::vector<index_t>().swap(s.x);
    };
    // Algorithm 14's cached pass over x[w0:len] alone (its first pass, or a refill past ℓ_max): as inference.cpp
    auto one_pass = [&](const index_t* x, index_t n) {
        dec.reset();
        if (n > kFewColumns) {
            model.decode(dec, x, n, z.data());
        } else {
            SingleThreadScope one_thread;
            model.decode(dec, x, n, z.data());
        }
    };
    while (!waiting.empty() || !active.empty()) {  // line 2
        poll();
        while (index_t(active.size()) < max_batch && !waiting.empty()) {  // line 3: a sequence joins
            Sequence<T>& s = seqs[std::size_t(waiting.front())];
            s.id = waiting.front();
            waiting.pop_front();
            const PromptRef<T>& p = prompts[std::size_t(s.id)];
            const PromptKV<T>* pc = p.cache;
            if (pc) s.x = pc->ids;
            else s.x.assign(p.ids, p.ids + p.len);
            s.l = index_t(s.x.size());
            const T* logits = nullptr;
            if (!pc) {  // line 4: the first pass over the prompt, its keys and values into pages
                one_pass(s.x.data(), s.l);
                logits = z.data();
            } else {
                logits = pc->z.data();
            }
            for (index_t l = 0; l < c.L; ++l) {
                const T* K = pc ? pc->K[std::size_t(l)].data() : dec.kv[std::size_t(l)].K.data();
                const T* V = pc ? pc->V[std::size_t(l)].data() : dec.kv[std::size_t(l)].V.data();
                for (index_t t = 0; t < s.l; ++t) put(pool, s, l, t, K + t * pool.rows_k, V + t * pool.rows_v);
            }
            s.cached = s.l;
            if (sample(s, logits)) finish(s);
            else active.push_back(&s);  // line 5
        }
        if (active.empty()) continue;
        // past ℓ_max with context "window": the sequence is refilled from its last ℓ_max tokens, alone
        batch.clear();
        for (Sequence<T>* s : active) {
            const index_t len = index_t(s->x.size());
            if (!full && len > c.l_max) {
                if (!s->windowed) release(pool, *s), s->windowed = true;
                one_pass(s->x.data() + (len - c.l_max), c.l_max);
                if (sample(*s, z.data())) finish(*s);
            } else {
                batch.push_back(s);
            }
        }
        if (!batch.empty()) {  // lines 6–13: one step of the batch
            if (batch.size() == 1) {
                SingleThreadScope one_thread;  // one column of work per layer, as Algorithm 14's steps
                batched_step(model, pool, batch, w);
            } else {
                batched_step(model, pool, batch, w);
            }
            for (std::size_t b = 0; b < batch.size(); ++b) {
                Sequence<T>& s = *batch[b];
                ++s.cached;
                {  // the pages wholly before the first key a next query reads go back to the pool (V9)
                    index_t first = index_t(s.x.size());
                    for (const CacheKeep& keep : keeps) first = std::min(first, keep.oldest_needed(index_t(s.x.size())));
                    for (index_t k = 0; k < first / kPageTokens; ++k)
                        if (s.table[std::size_t(k)] >= 0) pool.free.push_back(s.table[std::size_t(k)]), s.table[std::size_t(k)] = -1;
                }
                if (sample(s, w.Z.data() + std::size_t(b) * std::size_t(c.n_vocab))) finish(s);
            }
        }
        // line 14: the finished leave
        active.erase(std::remove_if(active.begin(), active.end(), [](const Sequence<T>* s) { return s->x.empty(); }),
                     active.end());
    }
    return out;
}

template PromptKV<float> prefill<float>(const DTransformer<float>&, const index_t*, index_t);
template PromptKV<double> prefill<double>(const DTransformer<double>&, const index_t*, index_t);
template struct PromptKV<float>;
template struct PromptKV<double>;
template std::uint64_t theta_digest<float>(const ParamStore<float>&);
template std::uint64_t theta_digest<double>(const ParamStore<double>&);
template std::vector<std::vector<index_t>> DInferenceBatch<float>(DTransformer<float>&, const std::vector<PromptRef<float>>&,
                                                                  index_t, const SamplingOptions&, std::vector<Rng>&, index_t);
template std::vector<std::vector<index_t>> DInferenceBatch<double>(DTransformer<double>&, const std::vector<PromptRef<double>>&,
                                                                   index_t, const SamplingOptions&, std::vector<Rng>&, index_t);

}  // namespace ft
