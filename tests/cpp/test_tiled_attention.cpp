// Algorithm T (tiled exact attention) against Algorithm 4's literal lines 4–6 (attention_head, itself held to
// a naive listing in test_attention.cpp): forward, log-sum-exp and backward, for every mask part (the paper's
// three, the prefix and sliding-window variants), a score bias part (ALiBi's form, added tile by tile),
// dropout with the literal path's masks, GQA's shared K/V, cached decoding (q0 > 0), cross-attention
// (ℓ_x ≠ ℓ_z), lengths that are not multiples of the blocks, strided head views.
#include <limits>

#include "formal_transformers/attention.hpp"
#include "formal_transformers/attention_dropout.hpp"
#include "formal_transformers/parts.hpp"
#include "formal_transformers/tiled_attention.hpp"
#include "testing.hpp"

using namespace ft;

namespace {
enum class MaskCase { Bidirectional, Causal, Explicit, Prefix, Window };

// A score bias of ALiBi's form with a given slope m (every head): B[t_z, t_x] = −m |t_x − t_z|, on the whole
// matrix (literal path, on the candidate keys as the parts do) and on a tile (tiled path)
template <class T>
class SlopeBias final : public ScoreBias<T> {
public:
    explicit SlopeBias(double m) : m_(m) {}
    void add(const ParamStore<T>&, const Mask& mask, index_t b, index_t, index_t q0, MatView<T> S) const override {
        for (index_t j = 0; j < S.cols; ++j) {
            const KeyRange r = mask.keys(b, q0 + j, S.rows);
            for (index_t tz = std::max<index_t>(r.begin, 0); tz < std::min(r.end, S.rows); ++tz)
                S(tz, j) -= T(m_ * double(std::abs(q0 + j - tz)));
        }
    }
    bool tiles() const override { return true; }
    void add_tile(const ParamStore<T>&, index_t, index_t, index_t q0, index_t t0, index_t j0, MatView<T> S) const override {
        for (index_t j = 0; j < S.cols; ++j)
            for (index_t i = 0; i < S.rows; ++i) S(i, j) -= T(m_ * double(std::abs(q0 + j0 + j - (t0 + i))));
    }

private:
    double m_;
};

struct Case {
    index_t l_x, l_z, q0;
    MaskCase mask;
    double slope = 0, p = 0;
    TileSizes tiles = {};
    index_t d = 8, d_v = 6;  // d_attn, d_v
};

Mask make_mask(MaskCase mc, index_t l_z, index_t cols, Rng& rng) {
    if (mc == MaskCase::Bidirectional) return Mask::bidirectional();
    if (mc == MaskCase::Causal) return Mask::unidirectional();
    if (mc == MaskCase::Prefix) {  // the first p keys bidirectional, causal after (variants/prefix_mask.cpp)
        MaskOptions o;
        o.per_sequence = {std::max<index_t>(1, l_z / 3)};
        return ft::make_mask("prefix", o);
    }
    if (mc == MaskCase::Window) {  // a key t_z for t_x − w < t_z ≤ t_x (variants/sliding_window_mask.cpp)
        MaskOptions o;
        o.options.set("sliding_window", std::int64_t(9));
        return ft::make_mask("sliding_window", o);
    }
    std::vector<std::uint8_t> m(std::size_t(l_z * cols));
    for (auto& v : m) v = rng.uniform() < 0.6;
    for (index_t j = 0; j < cols; ++j) m[std::size_t(rng.below(std::uint64_t(l_z)) + std::uint64_t(j * l_z))] = 1;
    // a column whose first key block is entirely masked (exercises the online softmax from m = −∞)
    if (cols > 1 && l_z > 20)
        for (index_t i = 0; i < l_z; ++i) m[std::size_t(i + 1 * l_z)] = i >= l_z - 3;
    return Mask::explicit_matrix(l_z, cols, m.data());
}

// The literal weights' log-sum-exp per query (the test's own reference for λ)
template <class T>
std::vector<double> literal_lse(CMatView<T> Q, CMatView<T> K, const Mask& mask, index_t q0, double slope) {
    std::vector<double> out(std::size_t(Q.cols));
    for (index_t j = 0; j < Q.cols; ++j) {
        std::vector<double> s;
        for (index_t t = 0; t < K.cols; ++t) {
            if (!mask.allows(t, q0 + j)) continue;  // (sequence 0)
            double d = 0;
            for (index_t i = 0; i < Q.rows; ++i) d += double(K(i, t)) * double(Q(i, j));
            s.push_back(d / std::sqrt(double(Q.rows)) - slope * double(std::abs(q0 + j - t)));
        }
        const double mx = *std::max_element(s.begin(), s.end());
        double sum = 0;
        for (double v : s) sum += std::exp(v - mx);
        out[std::size_t(j)] = mx + std::log(sum);
    }
    return out;
}

// Heads stored stacked as MHAttention stores them (row blocks of a taller matrix: ld > rows), `group`
// query heads sharing one K, V (GQA); every head's forward and backward, tiled vs literal.
template <class T>
void check(const Case& c, index_t group, double tol) {
    const index_t d = c.d, d_v = c.d_v, l_x = c.l_x, l_z = c.l_z;
    Rng rng(1234 + std::uint64_t(l_x * 7 + l_z * 13 + c.q0 + int(c.mask) * 101 + group));
    const Mask mask = make_mask(c.mask, l_z, c.q0 + l_x, rng);
    // stacked: Q [group·d + 3, l_x] (3 spare rows so the views are strided), K [d + 2, l_z], V [d_v + 1, l_z]
    Matrix<T> Qs = fttest::random_matrix<T>(group * d + 3, l_x, rng), Ks = fttest::random_matrix<T>(d + 2, l_z, rng),
              Vs = fttest::random_matrix<T>(d_v + 1, l_z, rng), dY = fttest::random_matrix<T>(group * d_v, l_x, rng);
    CMatView<T> K = view(Ks).rows_range(1, d), V = view(Vs).rows_range(1, d_v);
    const std::size_t AA = std::size_t(l_z * l_x);
    std::vector<T> A(AA * std::size_t(group)), Ad(A.size()), dA(AA);
    std::vector<std::uint8_t> keep(A.size());
    Matrix<T> Y_lit = Matrix<T>::from_shape({std::size_t(group * d_v), std::size_t(l_x)}), Y_til = Y_lit;
    Matrix<T> dQ_lit = Matrix<T>::from_shape({std::size_t(group * d), std::size_t(l_x)}), dQ_til = dQ_lit;
    Matrix<T> dK_lit = Matrix<T>::from_shape({std::size_t(d), std::size_t(l_z)}), dK_til = dK_lit;
    Matrix<T> dV_lit = Matrix<T>::from_shape({std::size_t(d_v), std::size_t(l_z)}), dV_til = dV_lit;
    for (auto* m : {&dQ_lit, &dQ_til, &dK_lit, &dK_til, &dV_lit, &dV_til}) m->fill(T(0));
    std::vector<T> lse(std::size_t(group * l_x));
    const DropoutKey key{7, 3, 99};
    const SlopeBias<T> bias(c.slope);
    ParamStore<T> store;
    auto block = [&](index_t h) {
        HeadBlock<T> blk;
        blk.mask = &mask, blk.b = 0, blk.h = h, blk.q0 = c.q0;
        blk.bias = c.slope != 0 ? &bias : nullptr, blk.store = &store;
        return blk;
    };
    // the head's dropout (null: none), at its place in a layer's weights
    auto dropout = [&](index_t h, WeightsDropout& wd) -> const WeightsDropout* {
        wd = {c.p, key, std::uint64_t(h) * AA + 17};
        return c.p > 0 ? &wd : nullptr;
    };
    for (index_t h = 0; h < group; ++h) {
        CMatView<T> Q = view(Qs).rows_range(3 + h * d, d);
        WeightsDropout wd;
        const WeightsDropout* drop = dropout(h, wd);
        MatView<T> Ah(A.data() + h * AA, l_z, l_x), Yh = view(Y_lit).rows_range(h * d_v, d_v);
        if (drop)  // the attention-dropout part on the listing's kernel
            attention_dropout_head<T>(Q, K, V, block(h), *drop, Ah, MatView<T>(Ad.data() + h * AA, l_z, l_x),
                                      keep.data() + h * AA, Yh);
        else
            attention_head<T>(Q, K, V, block(h), Ah, Yh);
        // the tiles draw the mask themselves
        tiled_attention_head<T>(Q, K, V, block(h), view(Y_til).rows_range(h * d_v, d_v), lse.data() + h * l_x,
                                c.tiles, drop);
        const std::vector<double> lref = literal_lse<T>(Q, K, mask, c.q0, c.slope);
        EXPECT_LE(fttest::rel_error(lse.data() + h * l_x, lref.data(), std::size_t(l_x)), tol) << "lse, head " << h;
    }
    EXPECT_LE(fttest::rel_error(Y_til.data(), Y_lit.data(), Y_lit.size()), tol) << "forward";
    for (index_t h = 0; h < group; ++h) {  // the group's heads in turn, dK and dV summed (V3)
        CMatView<T> Q = view(Qs).rows_range(3 + h * d, d);
        CMatView<T> dYh = CMatView<T>(view(dY)).rows_range(h * d_v, d_v);
        CMatView<T> Ah(A.data() + h * AA, l_z, l_x);
        WeightsDropout wd;
        const WeightsDropout* drop = dropout(h, wd);
        if (drop)
            attention_dropout_head_backward<T>(Q, K, V, Ah, CMatView<T>(Ad.data() + h * AA, l_z, l_x), keep.data() + h * AA,
                                               c.p, dYh, view(dQ_lit).rows_range(h * d, d), view(dK_lit), view(dV_lit),
                                               MatView<T>(dA.data(), l_z, l_x));
        else
            attention_head_backward<T>(Q, K, V, Ah, dYh, view(dQ_lit).rows_range(h * d, d), view(dK_lit), view(dV_lit),
                                       MatView<T>(dA.data(), l_z, l_x));
        tiled_attention_head_backward<T>(Q, K, V, CMatView<T>(view(Y_til)).rows_range(h * d_v, d_v),
                                         lse.data() + h * l_x, dYh, block(h), view(dQ_til).rows_range(h * d, d),
                                         view(dK_til), view(dV_til), c.tiles, drop);
    }
    EXPECT_LE(fttest::rel_error(dQ_til.data(), dQ_lit.data(), dQ_lit.size()), tol) << "dQ";
    EXPECT_LE(fttest::rel_error(dK_til.data(), dK_lit.data(), dK_lit.size()), tol) << "dK";
    EXPECT_LE(fttest::rel_error(dV_til.data(), dV_lit.data(), dV_lit.size()), tol) << "dV";
}

std::vector<Case> cases() {
    std::vector<Case> out;
    const TileSizes small{8, 16}, odd{5, 7}, one{1, 1};
    for (MaskCase mc : {MaskCase::Bidirectional, MaskCase::Causal, MaskCase::Explicit, MaskCase::Prefix, MaskCase::Window})
        for (double slope : {0.0, 0.25})
            for (double p : {0.0, 0.3}) {
                out.push_back({37, 37, 0, mc, slope, p, small});        // self-attention, ℓ not a block multiple
                out.push_back({37, 37, 0, mc, slope, p, {}});           // one block (defaults)
                out.push_back({29, 53, 0, mc, slope, p, odd});          // ℓ_x ≠ ℓ_z (cross-attention shapes)
                out.push_back({6, 45, 39, mc, slope, p, small});        // cached decoding: queries at 39 … 44
                out.push_back({1, 30, 29, mc, slope, p, small});        // one new token
                out.push_back({11, 9, 0, mc, slope, p, one});           // blocks of one entry
            }
    out.push_back({300, 300, 0, MaskCase::Causal, 0.0, 0.0, {}});       // several default blocks
    out.push_back({300, 300, 0, MaskCase::Causal, 0.5, 0.1, {}});
    out.push_back({300, 300, 0, MaskCase::Window, 0.0, 0.0, {16, 32}});  // most key blocks skipped by the window
    return out;
}

const char* mask_name(MaskCase m) {
    return m == MaskCase::Bidirectional ? "bidirectional"
           : m == MaskCase::Causal      ? "causal"
           : m == MaskCase::Explicit    ? "explicit"
           : m == MaskCase::Prefix      ? "prefix"
                                        : "sliding_window";
}
}  // namespace

// The tile products as one-thread BLAS calls (TileKernel::Blas)
TEST(TiledAttention, EqualsLiteralFloat64) {
    for (Case c : cases()) {
        c.tiles.kernel = TileKernel::Blas;
        SCOPED_TRACE(::testing::Message() << "l_x " << c.l_x << " l_z " << c.l_z << " q0 " << c.q0 << " mask "
                                          << mask_name(c.mask) << " slope " << c.slope << " p " << c.p << " tiles "
                                          << c.tiles.B_q << "x" << c.tiles.B_k);
        check<double>(c, 1, 1e-12);
    }
}

TEST(TiledAttention, EqualsLiteralFloat32) {
    for (Case c : cases()) {
        c.tiles.kernel = TileKernel::Blas;
        SCOPED_TRACE(::testing::Message() << "l_x " << c.l_x << " l_z " << c.l_z << " q0 " << c.q0 << " mask "
                                          << mask_name(c.mask) << " slope " << c.slope << " p " << c.p);
        check<float>(c, 1, 1e-5);
    }
}

// Our own tile loops (TileKernel::Loops, the naive side) give the same numbers as the BLAS tiles.
TEST(TiledAttention, OwnLoopKernelEqualsLiteral) {
    for (Case c : cases()) {
        c.tiles.kernel = TileKernel::Loops;
        SCOPED_TRACE(::testing::Message() << "l_x " << c.l_x << " l_z " << c.l_z << " q0 " << c.q0 << " mask "
                                          << mask_name(c.mask) << " slope " << c.slope << " p " << c.p);
        check<double>(c, 1, 1e-12);
        check<float>(c, 2, 1e-5);
    }
}

TEST(TiledAttention, GroupedQueryHeadsShareKV) {
    for (MaskCase mc : {MaskCase::Bidirectional, MaskCase::Causal, MaskCase::Explicit}) {
        SCOPED_TRACE(mask_name(mc));
        check<double>({33, 33, 0, mc, 0.125, 0.2, {8, 16}}, 3, 1e-12);
        check<float>({33, 33, 0, mc, 0.0, 0.0, {8, 16}}, 2, 1e-5);
    }
}

// The tiles draw the same dropout mask as D1 on the whole matrix: a rate near 1 keeps few weights, so a mask
// drawn from other indices would change Ṽ by far more than the tolerance (a test that can fail).
TEST(TiledAttention, DropoutMaskIsTheLiteralOne) {
    Case c{20, 20, 0, MaskCase::Bidirectional, 0.0, 0.9, {4, 4}};
    check<double>(c, 1, 1e-12);
    DropoutStream ds(0.9, DropoutKey{7, 3, 99});
    std::vector<double> y(64, 1.0);
    std::vector<std::uint8_t> keep(64);
    dropout_forward<double>(0.9, DropoutKey{7, 3, 99}, 5, y.data(), 64, keep.data());
    for (std::uint64_t i = 0; i < 64; ++i) EXPECT_EQ(ds.keep(5 + i), keep[i] != 0) << i;
}

namespace {
// A score bias with no tiled form (as a part with parameters would be): B[t_z, t_x] = 0.01·t_z
class RowBias final : public ScoreBias<double> {
public:
    void add(const ParamStore<double>&, const Mask&, index_t, index_t, index_t, MatView<double> S) const override {
        for (index_t j = 0; j < S.cols; ++j)
            for (index_t i = 0; i < S.rows; ++i) S(i, j) += 0.01 * double(i);
    }
};
}  // namespace

// MHAttention::heads chooses: auto runs the tiled listing from kTiledFromLength keys on, but the literal one for
// a score bias part the tiles cannot honour (the very same numbers as "literal", bit for bit).
TEST(TiledAttention, AutoFallsBackToLiteralForABiasWithoutATiledForm) {
    Rng rng(5);
    const index_t H = 2, d = 6, n = kTiledFromLength + 20;
    ParamStore<double> store;
    MHAttention<double> att(H, d, d, 4, 3, d, Mask::unidirectional(), store);
    store.allocate();
    fttest::randomize(store, rng);
    const std::vector<double> X = fttest::randn(d * n, rng);
    const Seqs s = Seqs::single(n);
    auto run = [&](AttnImpl impl, MHAttentionCache<double>& c) {
        att.var.impl = impl;
        std::vector<double> Y(std::size_t(d * n));
        att.forward(store, CMatView<double>(X.data(), d, n), s, CMatView<double>(X.data(), d, n), s,
                    MatView<double>(Y.data(), d, n), c);
        return Y;
    };
    MHAttentionCache<double> c0;
    run(AttnImpl::Auto, c0);
    EXPECT_STREQ(c0.kernel->name(), "tiled");  // no bias: auto tiles at this length
    EXPECT_FALSE(att.use_tiled(kTiledFromLength - 1));
    att.position.bias = std::make_shared<RowBias>();
    EXPECT_FALSE(att.tiled_parts());
    MHAttentionCache<double> c1, c2;
    const std::vector<double> Y_auto = run(AttnImpl::Auto, c1), Y_lit = run(AttnImpl::Literal, c2);
    EXPECT_STREQ(c1.kernel->name(), "softmax");
    EXPECT_EQ(Y_auto, Y_lit);
    att.var.impl = AttnImpl::Auto;
    att.position.bias = std::make_shared<SlopeBias<double>>(0.1);  // a bias with a tiled form: tiled again
    EXPECT_TRUE(att.use_tiled(kTiledFromLength));
}

// Our register-blocked kernels (TileKernel::Blocked) give the same numbers as the literal listing: every case
// above (d_attn 8, d_v 6: no whole vector of rows in a float64 batch … ), then head sizes that take each of
// their row blocks (d = 32, 64: whole groups of four vectors; 36 and 24: three vectors and a remainder of rows)
// over several blocks of queries and keys. Both branches of T2: the fused exp and dS (no bias, no dropout: the
// tiles nothing masks; the causal diagonal and windowed tiles take the masking path) and the unfused ones
// (a score bias or dropout).
std::vector<Case> blocked_cases() {
    std::vector<Case> out = cases();
    for (auto dd : {std::pair<index_t, index_t>{32, 32}, {64, 64}, {36, 24}, {24, 36}})
        for (MaskCase mc : {MaskCase::Bidirectional, MaskCase::Causal, MaskCase::Window})
            for (double slope : {0.0, 0.25})
                for (double p : {0.0, 0.3}) {
                    out.push_back({150, 150, 0, mc, slope, p, {48, 40}, dd.first, dd.second});
                    out.push_back({37, 101, 0, mc, slope, p, {64, 64}, dd.first, dd.second});  // ℓ_x ≠ ℓ_z
                    out.push_back({29, 70, 41, mc, slope, p, {7, 13}, dd.first, dd.second});   // cached decoding
                }
    out.push_back({300, 300, 0, MaskCase::Causal, 0.0, 0.0, {64, 128}, 32, 32});
    for (Case& c : out) c.tiles.kernel = TileKernel::Blocked;
    return out;
}

// every case in turn, named in the failure message
template <class T>
void check_each(const std::vector<Case>& cs, index_t group, double tol) {
    for (const Case& c : cs) {
        SCOPED_TRACE(::testing::Message() << "l_x " << c.l_x << " l_z " << c.l_z << " q0 " << c.q0 << " mask "
                                          << mask_name(c.mask) << " slope " << c.slope << " p " << c.p << " tiles "
                                          << c.tiles.B_q << "x" << c.tiles.B_k << " d " << c.d << " d_v " << c.d_v);
        check<T>(c, group, tol);
    }
}

TEST(TiledAttention, BlockedKernelEqualsLiteralFloat64) { check_each<double>(blocked_cases(), 1, 1e-12); }
TEST(TiledAttention, BlockedKernelEqualsLiteralFloat32) { check_each<float>(blocked_cases(), 2, 1e-5); }
