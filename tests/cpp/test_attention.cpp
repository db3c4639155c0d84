// Algorithms 3, 4, 5: hand-checked forward cases, masks, batching, and backward vs finite differences.
#include <limits>

#include "formal_transformers/attention.hpp"
#include "formal_transformers/blas.hpp"
#include "testing.hpp"

using namespace ft;

namespace {
// Naive Algorithm 4 for one sequence, written from the listing with loops: the test's own reference.
std::vector<double> naive_attention(const std::vector<double>& X, index_t d_x, index_t l_x, const std::vector<double>& Z,
                                    index_t d_z, index_t l_z, const double* Wq, const double* bq, const double* Wk,
                                    const double* bk, const double* Wv, const double* bv, index_t d_attn, index_t d_out,
                                    const std::function<bool(index_t, index_t)>& allows) {
    auto mat = [](const double* W, index_t r, index_t c, const double* x, const double* b, index_t i) {
        double s = b[i];
        for (index_t k = 0; k < c; ++k) s += W[i + k * r] * x[k];
        return s;
    };
    std::vector<double> out(static_cast<std::size_t>(d_out * l_x));
    for (index_t tx = 0; tx < l_x; ++tx) {
        std::vector<double> q(static_cast<std::size_t>(d_attn)), s(static_cast<std::size_t>(l_z));
        for (index_t i = 0; i < d_attn; ++i) q[std::size_t(i)] = mat(Wq, d_attn, d_x, &X[std::size_t(tx * d_x)], bq, i);
        double mx = -std::numeric_limits<double>::infinity();
        for (index_t tz = 0; tz < l_z; ++tz) {
            double dot = 0;
            for (index_t i = 0; i < d_attn; ++i) dot += q[std::size_t(i)] * mat(Wk, d_attn, d_z, &Z[std::size_t(tz * d_z)], bk, i);
            s[std::size_t(tz)] = allows(tz, tx) ? dot / std::sqrt(double(d_attn)) : -std::numeric_limits<double>::infinity();
            mx = std::max(mx, s[std::size_t(tz)]);
        }
        double sum = 0;
        for (auto& v : s) sum += (v = std::exp(v - mx));
        for (index_t o = 0; o < d_out; ++o) {
            double acc = 0;
            for (index_t tz = 0; tz < l_z; ++tz) acc += s[std::size_t(tz)] / sum * mat(Wv, d_out, d_z, &Z[std::size_t(tz * d_z)], bv, o);
            out[std::size_t(o + tx * d_out)] = acc;
        }
    }
    return out;
}
}  // namespace

TEST(Attention, HandCheckedTwoTokens) {
    // d = 1, W_q = W_k = W_v = 1, biases 0: S = [[x1 x1, x1 x2], [x2 x1, x2 x2]] (K = Z = X = [0, ln 3])
    // column 0 (query 0): scores (0, 0) -> α = (1/2, 1/2), ṽ = (0 + ln 3)/2
    // column 1 (query ln 3): scores (0, ln²3) -> α ∝ (1, e^{ln² 3})
    ParamStore<double> store;
    Attention<double> att(1, 1, 1, 1, Mask::bidirectional(), store);
    store.allocate();
    *store.W(att.W_q).data = 1;
    *store.W(att.W_k).data = 1;
    *store.W(att.W_v).data = 1;
    const double l3 = std::log(3.0);
    Matrix<double> X = {{0.0, l3}}, Y = Matrix<double>::from_shape({1, 2});
    AttentionCache<double> c;
    att.forward(store, view(X), Seqs::single(2), view(X), Seqs::single(2), view(Y), c);
    EXPECT_NEAR(Y(0, 0), l3 / 2, 1e-15);
    const double w = std::exp(l3 * l3);
    EXPECT_NEAR(Y(0, 1), l3 * w / (1 + w), 1e-15);
    // unidirectional: query 0 sees only token 0
    ParamStore<double> s2;
    Attention<double> causal(1, 1, 1, 1, Mask::unidirectional(), s2);
    s2.allocate();
    std::copy(store.theta(), store.theta() + store.size(), s2.theta());
    causal.forward(s2, view(X), Seqs::single(2), view(X), Seqs::single(2), view(Y), c);
    EXPECT_NEAR(Y(0, 0), 0.0, 1e-15);
    EXPECT_NEAR(Y(0, 1), l3 * w / (1 + w), 1e-15);
}

TEST(Attention, MatchesNaiveListingWithEveryMaskKind) {
    Rng rng(7);
    const index_t d_x = 5, d_z = 4, d_attn = 3, d_out = 6, l_x = 4, l_z = 6;
    std::vector<std::uint8_t> m(std::size_t(l_z * l_x));
    for (auto& v : m) v = rng.uniform() < 0.5;
    for (index_t tx = 0; tx < l_x; ++tx) m[std::size_t(tx * l_z + tx)] = 1;  // every column keeps an entry
    for (int kind = 0; kind < 3; ++kind) {
        Mask mask = kind == 0 ? Mask::bidirectional() : kind == 1 ? Mask::unidirectional() : Mask::explicit_matrix(l_z, l_x, m.data());
        ParamStore<double> store;
        Attention<double> att(d_x, d_z, d_attn, d_out, mask, store);
        store.allocate();
        fttest::randomize(store, rng);
        std::vector<double> X = fttest::randn(d_x * l_x, rng), Z = fttest::randn(d_z * l_z, rng), Y(static_cast<std::size_t>(d_out * l_x));
        AttentionCache<double> c;
        att.forward(store, CMatView<double>(X.data(), d_x, l_x), Seqs::single(l_x), CMatView<double>(Z.data(), d_z, l_z),
                    Seqs::single(l_z), MatView<double>(Y.data(), d_out, l_x), c);
        auto want = naive_attention(X, d_x, l_x, Z, d_z, l_z, store.W(att.W_q).data, store.v(att.b_q), store.W(att.W_k).data,
                                    store.v(att.b_k), store.W(att.W_v).data, store.v(att.b_v), d_attn, d_out,
                                    [&](index_t tz, index_t tx) { return mask.allows(tz, tx); });
        EXPECT_LT(fttest::rel_error(Y, want, Y.size()), 1e-13) << "mask kind " << kind;
    }
}

TEST(Attention, FullyMaskedColumnIsAClearError) {
    std::vector<std::uint8_t> m = {1, 1, 0, 0};  // [2, 2]: column 1 all False
    EXPECT_THROW(Mask::explicit_matrix(2, 2, m.data()), ValueError);
    std::vector<std::uint8_t> ok = {1, 0, 0, 1};
    Mask mask = Mask::explicit_matrix(2, 2, ok.data());
    EXPECT_THROW(mask.check(3, 2), ValueError);  // shape mismatch
    EXPECT_NO_THROW(mask.check(2, 2));
}

// Backward of Attention and MHAttention vs central differences, over a batch of two sequences of
// different lengths, in self-attention (dX aliases dZ) and cross-attention.
template <class Att, class Cache, class... Work>
void check_gradients(Att& att, ParamStore<double>& store, index_t d_x, index_t d_z, index_t d_out, bool self,
                     Rng& rng, Work&... work) {
    const Seqs sx = Seqs::from_lengths({3, 5});
    const Seqs sz = self ? sx : Seqs::from_lengths({4, 2});
    const index_t nx = sx.total(), nz = sz.total();
    fttest::randomize(store, rng);
    std::vector<double> X = fttest::randn(d_x * nx, rng), Zs = fttest::randn(d_z * nz, rng), W = fttest::randn(d_out * nx, rng);
    std::vector<double>& Z = self ? X : Zs;
    auto loss = [&] {
        std::vector<double> Y(static_cast<std::size_t>(d_out * nx));
        Cache c;
        att.forward(store, CMatView<double>(X.data(), d_x, nx), sx, CMatView<double>(Z.data(), d_z, nz), sz,
                    MatView<double>(Y.data(), d_out, nx), c);
        return fttest::dot(Y.data(), W.data(), d_out * nx);
    };
    std::vector<double> Y(static_cast<std::size_t>(d_out * nx)), dX(std::size_t(d_x * nx), 0.0), dZs(std::size_t(d_z * nz), 0.0);
    std::vector<double>& dZ = self ? dX : dZs;
    Cache c;
    att.forward(store, CMatView<double>(X.data(), d_x, nx), sx, CMatView<double>(Z.data(), d_z, nz), sz,
                MatView<double>(Y.data(), d_out, nx), c);
    store.zero_grad();
    att.backward(store, CMatView<double>(X.data(), d_x, nx), sx, CMatView<double>(Z.data(), d_z, nz), sz, c,
                 CMatView<double>(W.data(), d_out, nx), MatView<double>(dX.data(), d_x, nx),
                 MatView<double>(dZ.data(), d_z, nz), work...);
    auto numX = fttest::numeric_grad(X.data(), d_x * nx, loss);
    EXPECT_LT(fttest::rel_error(dX, numX, dX.size()), 1e-6);
    if (!self) {
        auto numZ = fttest::numeric_grad(Z.data(), d_z * nz, loss);
        EXPECT_LT(fttest::rel_error(dZ, numZ, dZ.size()), 1e-6);
    }
    auto numT = fttest::numeric_grad(store.theta(), store.size(), loss);
    EXPECT_LT(fttest::rel_error(store.grad(), numT, numT.size()), 1e-6);
}

// f(self, d_z, mask, store) for self-attention (d_z = d_x = 4) and cross-attention (d_z = d_z_cross), each with
// the bidirectional and the unidirectional mask, on a fresh store.
template <class F>
void for_sources_and_masks(index_t d_z_cross, F f) {
    for (bool self : {true, false})
        for (int kind = 0; kind < 2; ++kind) {
            ParamStore<double> store;
            f(self, self ? index_t(4) : d_z_cross, kind ? Mask::unidirectional() : Mask::bidirectional(), store);
        }
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
    Rng rng(8);
    for_sources_and_masks(3, [&](bool self, index_t d_z, Mask mask, ParamStore<double>& store) {
        Attention<double> att(4, d_z, 3, 5, mask, store);
        store.allocate();
        check_gradients<Attention<double>, AttentionCache<double>>(att, store, 4, d_z, 5, self, rng);
    });
}

TEST(MHAttention, BackwardMatchesFiniteDifferences) {
    Rng rng(9);
    for_sources_and_masks(5, [&](bool self, index_t d_z, Mask mask, ParamStore<double>& store) {
        // H = 3, d_attn = 2, d_mid = 3, d_out = 6: all different
        MHAttention<double> att(3, 4, d_z, 2, 3, 6, mask, store);
        store.allocate();
        MHAttentionWork<double> w;
        check_gradients<MHAttention<double>, MHAttentionCache<double>>(att, store, 4, d_z, 6, self, rng, w);
    });
}

TEST(MHAttention, IsTheListingOverHeads) {
    // Algorithm 5 = W_o [Y¹; …; Y^H] + b_o with Y^h = Algorithm 4 with head h's parameters
    Rng rng(10);
    const index_t H = 2, d_x = 3, d_attn = 2, d_mid = 4, d_out = 3, l = 5;
    ParamStore<double> store;
    MHAttention<double> mha(H, d_x, d_x, d_attn, d_mid, d_out, Mask::unidirectional(), store);
    store.allocate();
    fttest::randomize(store, rng);
    std::vector<double> X = fttest::randn(d_x * l, rng), Y(static_cast<std::size_t>(d_out * l));
    MHAttentionCache<double> c;
    mha.forward(store, CMatView<double>(X.data(), d_x, l), Seqs::single(l), CMatView<double>(X.data(), d_x, l),
                Seqs::single(l), MatView<double>(Y.data(), d_out, l), c);
    std::vector<double> want(static_cast<std::size_t>(d_out * l));
    for (index_t t = 0; t < l; ++t)
        for (index_t o = 0; o < d_out; ++o) want[std::size_t(o + t * d_out)] = store.v(mha.b_o)[o];
    for (index_t h = 0; h < H; ++h) {
        // head h's blocks, copied out of the stacked matrices
        std::vector<double> Wq(static_cast<std::size_t>(d_attn * d_x)), Wk(static_cast<std::size_t>(d_attn * d_x)), Wv(static_cast<std::size_t>(d_mid * d_x));
        for (index_t i = 0; i < d_attn; ++i)
            for (index_t k = 0; k < d_x; ++k) {
                Wq[std::size_t(i + k * d_attn)] = store.W(mha.W_q)(h * d_attn + i, k);
                Wk[std::size_t(i + k * d_attn)] = store.W(mha.W_k)(h * d_attn + i, k);
            }
        for (index_t i = 0; i < d_mid; ++i)
            for (index_t k = 0; k < d_x; ++k) Wv[std::size_t(i + k * d_mid)] = store.W(mha.W_v)(h * d_mid + i, k);
        auto Yh = naive_attention(X, d_x, l, X, d_x, l, Wq.data(), store.v(mha.b_q) + h * d_attn, Wk.data(),
                                  store.v(mha.b_k) + h * d_attn, Wv.data(), store.v(mha.b_v) + h * d_mid, d_attn, d_mid,
                                  [](index_t tz, index_t tx) { return tz <= tx; });
        for (index_t t = 0; t < l; ++t)
            for (index_t o = 0; o < d_out; ++o)
                for (index_t i = 0; i < d_mid; ++i)
                    want[std::size_t(o + t * d_out)] += store.W(mha.W_o)(o, h * d_mid + i) * Yh[std::size_t(i + t * d_mid)];
    }
    EXPECT_LT(fttest::rel_error(Y, want, Y.size()), 1e-13);
}

TEST(MHAttention, BatchEqualsSequencesOneByOne) {
    Rng rng(11);
    ParamStore<float> store;
    MHAttention<float> mha(4, 8, 8, 2, 2, 8, Mask::unidirectional(), store);
    store.allocate();
    mha.init(store, rng, 0.5, 0.5);
    const Seqs s = Seqs::from_lengths({7, 1, 12});
    Matrix<float> X = fttest::random_matrix<float>(8, s.total(), rng), Y = Matrix<float>::from_shape({8, std::size_t(s.total())});
    MHAttentionCache<float> c;
    mha.forward(store, view(X), s, view(X), s, view(Y), c);
    for (index_t b = 0; b < s.count(); ++b) {
        Matrix<float> Yb = Matrix<float>::from_shape({8, std::size_t(s.len(b))});
        CMatView<float> Xb = CMatView<float>(view(X)).cols_range(s.begin(b), s.len(b));
        mha.forward(store, Xb, Seqs::single(s.len(b)), Xb, Seqs::single(s.len(b)), view(Yb), c);
        for (index_t j = 0; j < s.len(b); ++j)
            for (index_t i = 0; i < 8; ++i) EXPECT_NEAR(Yb(i, j), Y(i, s.begin(b) + j), 1e-6);
    }
}

TEST(MHAttention, CachedDecodingEqualsFullForward) {
    // Feed a sequence one token at a time through append_kv + attend_cached: the same outputs as the
    // full causal forward (the KV cache of Algorithms 14/15).
    Rng rng(12);
    ParamStore<double> store;
    MHAttention<double> mha(2, 6, 6, 3, 3, 6, Mask::unidirectional(), store);
    store.allocate();
    mha.init(store, rng, 0.5, 0.5);
    const index_t l = 9;
    Matrix<double> X = fttest::random_matrix<double>(6, l, rng), Y = Matrix<double>::from_shape({6, std::size_t(l)});
    MHAttentionCache<double> c;
    mha.forward(store, view(X), Seqs::single(l), view(X), Seqs::single(l), view(Y), c);
    KVCache<double> kv;
    MHAttentionCache<double> scratch;
    // a prefix of 4 at once, then one by one
    Matrix<double> Yp = Matrix<double>::from_shape({6, 4});
    mha.append_kv(store, view(X).cols_range(0, 4), kv);
    mha.attend_cached(store, view(X).cols_range(0, 4), 0, kv, view(Yp), scratch);
    for (index_t j = 0; j < 4; ++j)
        for (index_t i = 0; i < 6; ++i) EXPECT_NEAR(Yp(i, j), Y(i, j), 1e-13);
    for (index_t t = 4; t < l; ++t) {
        Matrix<double> yt = Matrix<double>::from_shape({6, 1});
        mha.append_kv(store, view(X).cols_range(t, 1), kv);
        mha.attend_cached(store, view(X).cols_range(t, 1), t, kv, view(yt), scratch);
        for (index_t i = 0; i < 6; ++i) EXPECT_NEAR(yt(i, 0), Y(i, t), 1e-13);
    }
}

TEST(BasicAttention, IsAlgorithm4WithOneQueryAndBackwardIsRight) {
    Rng rng(13);
    const index_t d_in = 4, d_attn = 3, d_out = 2, Tn = 5;
    ParamStore<double> store;
    BasicAttention<double> ba(d_in, d_attn, d_out, store);
    store.allocate();
    fttest::randomize(store, rng);
    std::vector<double> e = fttest::randn(d_in, rng), E = fttest::randn(d_in * Tn, rng), w = fttest::randn(d_out, rng);
    std::vector<double> v(static_cast<std::size_t>(d_out));
    BasicAttentionCache<double> c;
    ba.forward(store, e.data(), CMatView<double>(E.data(), d_in, Tn), v.data(), c);
    auto want = naive_attention(e, d_in, 1, E, d_in, Tn, store.W(ba.W_q).data, store.v(ba.b_q), store.W(ba.W_k).data,
                                store.v(ba.b_k), store.W(ba.W_v).data, store.v(ba.b_v), d_attn, d_out,
                                [](index_t, index_t) { return true; });
    EXPECT_LT(fttest::rel_error(v, want, v.size()), 1e-13);
    auto loss = [&] {
        std::vector<double> y(static_cast<std::size_t>(d_out));
        BasicAttentionCache<double> cc;
        ba.forward(store, e.data(), CMatView<double>(E.data(), d_in, Tn), y.data(), cc);
        return fttest::dot(y.data(), w.data(), d_out);
    };
    std::vector<double> de(std::size_t(d_in), 0.0), dE(std::size_t(d_in * Tn), 0.0);
    store.zero_grad();
    ba.backward(store, c, w.data(), de.data(), MatView<double>(dE.data(), d_in, Tn));
    EXPECT_LT(fttest::rel_error(de, fttest::numeric_grad(e.data(), d_in, loss), de.size()), 1e-6);
    EXPECT_LT(fttest::rel_error(dE, fttest::numeric_grad(E.data(), d_in * Tn, loss), dE.size()), 1e-6);
    auto numT = fttest::numeric_grad(store.theta(), store.size(), loss);
    EXPECT_LT(fttest::rel_error(store.grad(), numT, numT.size()), 1e-6);
}

// Self-attention runs lines 1–3 as one product [W_q; W_k; W_v] X (Z is X); the same input in a second
// buffer takes the three separate products. Both must give the same Ṽ, dX and parameter gradients.
TEST(MHAttention, FusedSelfAttentionEqualsThreeProducts) {
    Rng rng(12);
    ParamStore<double> store;
    const index_t H = 3, d_x = 5, d_attn = 2, d_mid = 3, d_out = 4;
    MHAttention<double> mha(H, d_x, d_x, d_attn, d_mid, d_out, Mask::unidirectional(), store);
    store.allocate();
    fttest::randomize(store, rng);
    const Seqs s = Seqs::from_lengths({4, 6});
    const index_t n = s.total();
    std::vector<double> X = fttest::randn(d_x * n, rng), X2 = X, dVt = fttest::randn(d_out * n, rng);
    std::vector<std::vector<double>> Y(2, std::vector<double>(std::size_t(d_out * n))), dX(2), grads(2);
    for (int fused = 1; fused >= 0; --fused) {
        const std::vector<double>& Z = fused ? X : X2;  // another buffer with the same numbers
        MHAttentionCache<double> c;
        MHAttentionWork<double> w;
        mha.forward(store, CMatView<double>(X.data(), d_x, n), s, CMatView<double>(Z.data(), d_x, n), s,
                    MatView<double>(Y[std::size_t(fused)].data(), d_out, n), c);
        EXPECT_EQ(c.source.find<ProjectionState<double>>()->fused, fused == 1);
        store.zero_grad();
        std::vector<double> gX(std::size_t(d_x * n), 0.0), gZ(std::size_t(d_x * n), 0.0);
        mha.backward(store, CMatView<double>(X.data(), d_x, n), s, CMatView<double>(Z.data(), d_x, n), s, c,
                     CMatView<double>(dVt.data(), d_out, n), MatView<double>(gX.data(), d_x, n),
                     MatView<double>(fused ? gX.data() : gZ.data(), d_x, n), w);
        if (!fused)
            for (std::size_t i = 0; i < gX.size(); ++i) gX[i] += gZ[i];
        dX[std::size_t(fused)] = gX;
        grads[std::size_t(fused)].assign(store.grad(), store.grad() + store.size());
    }
    EXPECT_LT(fttest::rel_error(Y[1], Y[0], Y[0].size()), 1e-13);
    EXPECT_LT(fttest::rel_error(dX[1], dX[0], dX[0].size()), 1e-13);
    EXPECT_LT(fttest::rel_error(grads[1], grads[0], grads[0].size()), 1e-13);
}
