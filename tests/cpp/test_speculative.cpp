// Speculative decoding's core pieces: DTransformer::decode_all (the logits of every fed column over the
// cache) equals the full forward, Decoder::rollback forgets exactly the later tokens, and
// SpeculativeInference with τ = 0 equals the greedy Algorithm 14 (float64 and float32), with its input checks.
#include "formal_transformers/inference.hpp"
#include "formal_transformers/speculative.hpp"
#include "testing.hpp"

using namespace ft;

namespace {
ModelConfig small(index_t L, index_t d_e, std::uint64_t seed) {
    ModelConfig c;
    c.n_vocab = 9;
    c.l_max = 12;
    c.L = L;
    c.H = 2;
    c.d_e = d_e;
    c.d_mlp = 2 * d_e;
    c.d_attn = d_e / 2;
    c.d_mid = d_e / 2;
    c.seed = seed;
    c.init_std = 0.5;  // spread-out outputs: no near ties in the argmax
    return c;
}
}  // namespace

TEST(Speculative, DecodeAllAndRollbackEqualTheFullForward) {
    DTransformer<double> m(small(2, 8, 3));
    std::vector<index_t> ids = {1, 2, 3, 4, 5, 6, 7, 8, 0, 1};
    const index_t n = index_t(ids.size());
    const Matrix<double> Z = fttest::full_logits(m, ids, 9);
    DTransformer<double>::Decoder d;
    Matrix<double> Zc = Matrix<double>::from_shape({9, 4});
    m.decode_all(d, ids.data(), 4, view(Zc));  // a prompt of 4: every column
    for (index_t t = 0; t < 4; ++t)
        for (index_t v = 0; v < 9; ++v) EXPECT_NEAR(Zc(v, t), Z(v, t), 1e-12);
    // feed 3 wrong tokens, roll back, feed the right ones: the same as never having seen the wrong ones
    std::vector<index_t> wrong = {0, 0, 0};
    Matrix<double> Zw = Matrix<double>::from_shape({9, 3});
    m.decode_all(d, wrong.data(), 3, view(Zw));
    EXPECT_EQ(d.len, 7);
    d.rollback(4);
    EXPECT_EQ(d.len, 4);
    Matrix<double> Zr = Matrix<double>::from_shape({9, std::size_t(n - 4)});
    m.decode_all(d, ids.data() + 4, n - 4, view(Zr));
    for (index_t t = 4; t < n; ++t)
        for (index_t v = 0; v < 9; ++v) EXPECT_NEAR(Zr(v, t - 4), Z(v, t), 1e-12);
    EXPECT_THROW(d.rollback(n + 1), std::exception);  // past the cached length: an internal error
}

template <class T>
void greedy_case() {
    DTransformer<T> target(small(2, 8, 3)), draft(small(1, 4, 9));
    std::vector<index_t> x = {2, 7, 1};
    SamplingOptions o;
    o.tau = 0;
    for (index_t k : {1, 2, 4}) {
        Rng r1(0), r2(0);
        std::vector<index_t> want = DInference(target, x.data(), 3, 10, o, r1);
        SpeculativeStats st;
        std::vector<index_t> got = SpeculativeInference(target, draft, x.data(), 3, 10, k, 0.0, r2, &st);
        EXPECT_EQ(got, want) << "k = " << k;
        index_t kept = 0;
        for (index_t a : st.accepted) kept += a;
        EXPECT_EQ(kept + st.target_passes, 10);
        // the target drafting for itself keeps every draft
        SpeculativeStats self;
        EXPECT_EQ(SpeculativeInference(target, target, x.data(), 3, 10, k, 0.0, r2, &self), want);
        EXPECT_EQ(self.accepted, self.drafted);
    }
}

TEST(Speculative, TauZeroIsGreedyDInferenceFloat64) { greedy_case<double>(); }
TEST(Speculative, TauZeroIsGreedyDInferenceFloat32) { greedy_case<float>(); }

TEST(Speculative, BadInputThrows) {
    DTransformer<double> target(small(1, 4, 3));
    ModelConfig other = small(1, 4, 4);
    other.n_vocab = 10;
    DTransformer<double> draft(other);
    std::vector<index_t> x = {1, 2};
    Rng rng(0);
    EXPECT_THROW(SpeculativeInference(target, draft, x.data(), 2, 3, 2, 1.0, rng), ValueError);  // vocabularies
    EXPECT_THROW(SpeculativeInference(target, target, x.data(), 2, 3, 0, 1.0, rng), ValueError);  // k
    EXPECT_THROW(SpeculativeInference(target, target, x.data(), 2, 3, 2, -1.0, rng), ValueError);  // τ
    EXPECT_THROW(SpeculativeInference(target, target, x.data(), 2, 12, 2, 1.0, rng), ValueError);  // 2 + 12 − 1 > 12
    EXPECT_NO_THROW(SpeculativeInference(target, target, x.data(), 2, 11, 2, 1.0, rng));
    std::vector<index_t> bad = {1, 9};
    EXPECT_THROW(SpeculativeInference(target, target, bad.data(), 2, 3, 2, 1.0, rng), IndexError);
}
