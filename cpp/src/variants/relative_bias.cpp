// Algorithm V11: T5's relative position bias (Raffel et al. 2020, "Exploring the Limits of Transfer Learning with
// a Unified Text-to-Text Transformer", §2.1 "Model"; the relative attention of Shaw et al. 2018, "Self-Attention
// with Relative Position Representations", as one learned scalar per head and bucket of offsets). A Toeplitz bias
// B^h[t_z, t_x] = b[bucket(t_z − t_x), h] on head h's scores (Algorithm 4 line 6: softmax(S/√d_attn + B^h)),
// with a learned table b ∈ R^{N_b × H} over log-spaced buckets of the offset:
//
// Algorithm V11: k ← bucket(r | N_b, d_max, bidirectional)      r = t_z − t_x (key minus query position)
//   1  if bidirectional: N ← N_b / 2;  β ← N · [[r > 0]];  n ← |r|      [[the keys after the query: other buckets]]
//   2  else:             N ← N_b;      β ← 0;              n ← max(−r, 0)   [[causal: a key after the query is 0]]
//   3  m ← N / 2                                                       [[offsets below m: a bucket each]]
//   4  if n < m: return k = β + n
//   5  return k = β + min(N − 1, m + ⌊ln(n/m) / ln(d_max/m) · (N − m)⌋)  [[log-spaced up to d_max, then one]]
//
//   Replaces Algorithm 4 line 6 for head h: Ṽ = V · softmax(S/√d_attn + B^h), B^h[t_z, t_x] = b[bucket(t_z − t_x), h].
//   Backward: Algorithm 4's, and db[k, h] = Σ_{(t_z, t_x): bucket(t_z − t_x) = k} dS^h[t_z, t_x]  (dS of line 6's
//   input; masked entries have dS = 0).
//
// Line 5 is computed in float32 as Hugging Face's T5 does (torch.log of a float tensor, truncated towards 0), so
// the buckets are the same integers. The table is one parameter shared by every layer of a stack (T5: the first
// layer's relative_attention_bias serves all): the first attention made with the name declares it (and
// initialises it, b ~ N(0, σ²)), the later ones find it in θ and read and accumulate into the same entries.
// Registered as position "relative" (registry.cpp); AttnVariant::rel_* name its table and shape.
#include <algorithm>
#include <cmath>
#include <string>

#include "formal_transformers/parts.hpp"

namespace ft {

// ===================================== Algorithm V11 ===================================================
index_t relative_bucket(index_t r, bool bidirectional, index_t num_buckets, index_t max_distance) {
    index_t N = num_buckets, beta = 0, n = 0;
    if (bidirectional) {  // line 1
        N = num_buckets / 2;
        beta = r > 0 ? N : 0;
        n = r < 0 ? -r : r;
    } else {  // line 2
        n = r < 0 ? -r : 0;
    }
    const index_t m = N / 2;  // line 3
    if (n < m) return beta + n;  // line 4
    // line 5, in float32 as torch computes it: log(float(n) / m) / log(d_max / m) · (N − m), truncated
    const float v = std::log(float(n) / float(m)) / float(std::log(double(max_distance) / double(m))) * float(N - m);
    return beta + std::min<index_t>(N - 1, m + index_t(v));
}

void check_relative_buckets(index_t num_buckets, index_t max_distance, bool bidirectional) {
    const index_t N = bidirectional ? num_buckets / 2 : num_buckets, m = N / 2;  // lines 1–3
    if (m < 1)
        throw ValueError(std::string("relative_buckets must be >= ") + (bidirectional ? "4 (a bidirectional stack halves them for the two directions)" : "2") +
                         ", got " + std::to_string(num_buckets));
    if (max_distance <= m)
        throw ValueError("relative_max_distance must be > " + std::to_string(m) + " (line 5's log-spaced buckets run from m = " +
                         (bidirectional ? std::string("relative_buckets/4") : std::string("relative_buckets/2")) + " = " +
                         std::to_string(m) + " to it" + (bidirectional ? "" : " in a causal stack") + "), got " +
                         std::to_string(max_distance));
}

// ===================================== the part ========================================================
namespace {
template <class T>
class RelativeBias final : public ScoreBias<T> {
public:
    RelativeBias(MatParam b, bool owner, bool bidirectional, index_t num_buckets, index_t max_distance, double init_std)
        : b_(b), owner_(owner), bi_(bidirectional), N_b_(num_buckets), d_max_(max_distance), std_(init_std) {}

    // line 6′: S[t_z, j] += b[bucket(t_z − t_x), h], t_x = q0 + j, on each column's candidate keys
    void add(const ParamStore<T>& store, const Mask& mask, index_t b, index_t h, index_t q0, MatView<T> S) const override {
        const T* bh = store.W(b_).col(h);
        for (index_t j = 0; j < S.cols; ++j) {
            const index_t tx = q0 + j;
            const KeyRange r = mask.keys(b, tx, S.rows);
            T* s = S.col(j);
            for (index_t tz = r.begin; tz < r.end; ++tz) s[tz] += bh[relative_bucket(tz - tx, bi_, N_b_, d_max_)];
        }
    }
    // db[bucket(t_z − t_x), h] += dS[t_z, j]
    void backward(ParamStore<T>& store, const Mask& mask, index_t b, index_t h, index_t q0, CMatView<T> dS) const override {
        T* db = store.dW(b_).col(h);
        for (index_t j = 0; j < dS.cols; ++j) {
            const index_t tx = q0 + j;
            const KeyRange r = mask.keys(b, tx, dS.rows);
            const T* d = dS.col(j);
            for (index_t tz = r.begin; tz < r.end; ++tz) db[relative_bucket(tz - tx, bi_, N_b_, d_max_)] += d[tz];
        }
    }
    void init(ParamStore<T>& store, Rng& rng) const override {
        if (owner_) store.normal(b_.offset, b_.rows * b_.cols, std_, rng);  // the first layer's: once
    }

private:
    MatParam b_;  // [N_b, H]: column h is head h's bias per bucket
    bool owner_, bi_;
    index_t N_b_, d_max_;
    double std_;
};

// V11's options (positional='relative' chooses the part): N_b = relative_buckets >= 2 (>= 4 for a bidirectional
// stack: half for each side; an EDTransformer's encoder is one), d_max = relative_max_distance >= 1 (with a model:
// > N_b / 2, where its encoder's log-spaced buckets start)
void check_relative(const PartOptionValues& own, const ModelConfig* c) {
    const index_t N_b = own.integer("relative_buckets"), d_max = own.integer("relative_max_distance");
    // V11's one rule: a model's config has both stacks (the encoder's bidirectional buckets, the decoder's causal
    // ones); a table made directly is checked for its own direction by the factory
    if (c)
        for (bool bidirectional : {true, false}) check_relative_buckets(N_b, d_max, bidirectional);
    else
        check_relative_buckets(N_b, d_max, false);
}
}  // namespace

const PartRow& relative_bias_row() {
    static const PartRow row{PartKind::Position,
                             "relative",
                             {{"relative_buckets", archs::ED, OptionKind::Count, std::int64_t(32), OptionCheck::None,
                               "V11: T5's number N_b of buckets (relative_attention_num_buckets)"},
                              {"relative_max_distance", archs::ED, OptionKind::Count, std::int64_t(128), OptionCheck::None,
                               "V11: the offset d_max the log-spaced buckets reach (relative_attention_max_distance)"}},
                             check_relative,
                             nullptr,
                             false};
    return row;
}

template <class T>
PositionPart<T> make_relative_bias(const AttnSpec& spec, ParamStore<T>& store, const std::string& prefix) {
    const AttnVariant& v = spec.v;
    const index_t N_b = v.options.integer("relative_buckets"), d_max = v.options.integer("relative_max_distance");
    check_relative_buckets(N_b, d_max, v.rel_bidirectional);  // V11's one rule (the config checks both stacks)
    const std::string name = v.rel_table.empty() ? prefix + "rel_bias" : v.rel_table;
    MatParam b;
    bool owner = false;
    if (const ParamInfo* e = store.find(name)) {  // a later layer: the first layer's table
        if (e->size != N_b * spec.H) throw ValueError("relative bias table '" + name + "' has another shape");
        b.offset = e->offset, b.rows = N_b, b.cols = spec.H;
    } else {
        b = store.matrix(name, N_b, spec.H);
        owner = true;
    }
    PositionPart<T> p;
    p.bias = std::make_shared<RelativeBias<T>>(b, owner, v.rel_bidirectional, N_b, d_max,
                                                v.rel_init_std);
    return p;
}

template PositionPart<float> make_relative_bias<float>(const AttnSpec&, ParamStore<float>&, const std::string&);
template PositionPart<double> make_relative_bias<double>(const AttnSpec&, ParamStore<double>&, const std::string&);

}  // namespace ft
