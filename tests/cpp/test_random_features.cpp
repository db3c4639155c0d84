// Random-feature attention (docs/variants.md V15): cached decoding keeps an O(D·d) state per key/value head
// (the cache holds only the columns of the last call) and its logits equal the full forward's; the feature map
// against its formula; the options' checks.
#include <cmath>
#include <vector>

#include "formal_transformers/random_features.hpp"
#include "formal_transformers/transformers.hpp"
#include "testing.hpp"

using namespace ft;

namespace {
using fttest::perturb;
ModelConfig performer_like(const char* kind, const std::string& pos, index_t l_max) {
    ModelConfig c = fttest::small_decoder(l_max);
    c.d_e = 16;
    c.d_mlp = 12;
    c.positional = pos;
    c.attention = kind;
    c.part_options.set("n_features", std::int64_t(9));
    c.part_options.set("feature_seed", std::uint64_t(4));
    return c;
}
}  // namespace

TEST(RandomFeatures, DecodingStateEqualsTheFullForwardAndHoldsNoPastColumns) {
    const index_t n = 150, prompt = 70;  // > 64: the chunks of the causal kernel
    for (const char* kind : {"performer", "rfa"})
        for (const char* pos : {"learned", "rope"}) {
            DTransformer<double> m(performer_like(kind, pos, n));
            perturb(m.store);
            const std::vector<index_t> ids = fttest::cycling_ids(n);
            const Matrix<double> Z = fttest::full_logits(m, ids);
            DTransformer<double>::Decoder d;
            std::vector<double> z(11);
            m.decode(d, ids.data(), prompt, z.data());
            for (index_t v = 0; v < 11; ++v) EXPECT_NEAR(z[std::size_t(v)], Z(v, prompt - 1), 1e-12);
            const index_t M = std::string(kind) == "rfa" ? 18 : 9, d_attn = 4;
            for (index_t t = prompt; t < n; ++t) {
                m.decode(d, ids.data() + t, 1, z.data());
                // two summation orders of the same prefix sums (one column folded at a time here, chunks of 64 in
                // the forward) over up to 150 exp-scaled features: up to 1.5e-12 apart on logits of order 1
                // (release build, AMD EPYC); 1e-11 bounds that order difference, not an error of either path
                for (index_t v = 0; v < 11; ++v) EXPECT_NEAR(z[std::size_t(v)], Z(v, t), 1e-11) << "position " << t;
                for (const auto& c : d.kv) {  // the state S, z per key/value head, and only the newest column
                    EXPECT_EQ(c.len, 1);
                    EXPECT_EQ(c.start + c.len, t + 1);
                    const FeatureDecodeState<double>* st = c.state.find<FeatureDecodeState<double>>();
                    ASSERT_NE(st, nullptr);
                    EXPECT_EQ(index_t(st->S.size()), 2 * d_attn * M);
                    EXPECT_EQ(index_t(st->z.size()), 2 * M);
                }
            }
        }
}

TEST(RandomFeatures, FeatureMapIsItsFormula) {
    const index_t d = 4, D = 6, n = 3;
    for (FeatureKind kind : {FeatureKind::Performer, FeatureKind::RFA}) {
        const RandomFeatures<double> f = draw_random_features<double>(kind, D, d, 7, "x");
        Matrix<double> X = Matrix<double>::from_shape({std::size_t(d), std::size_t(n)});
        for (index_t i = 0; i < d * n; ++i) X.data()[i] = std::cos(1.3 * double(i));
        Matrix<double> P = Matrix<double>::from_shape({std::size_t(f.M()), std::size_t(n)});
        random_feature_map<double>(f, view(X), false, view(P));
        const double s = std::pow(double(d), -0.25);
        for (index_t j = 0; j < n; ++j) {
            double sq = 0;
            for (index_t k = 0; k < d; ++k) sq += X(std::size_t(k), std::size_t(j)) * X(std::size_t(k), std::size_t(j));
            for (index_t i = 0; i < D; ++i) {
                double u = 0;
                for (index_t k = 0; k < d; ++k) u += f.Omega(std::size_t(i), std::size_t(k)) * X(std::size_t(k), std::size_t(j));
                u *= s;
                if (kind == FeatureKind::Performer) {
                    EXPECT_NEAR(P(std::size_t(i), std::size_t(j)), std::exp(u - 0.5 * s * s * sq) / std::sqrt(double(D)), 1e-14);
                } else {
                    const double h = std::exp(0.5 * s * s * sq) / std::sqrt(double(D));
                    EXPECT_NEAR(P(std::size_t(i), std::size_t(j)), h * std::sin(u), 1e-14);
                    EXPECT_NEAR(P(std::size_t(D + i), std::size_t(j)), h * std::cos(u), 1e-14);
                }
            }
        }
    }
    EXPECT_THROW(draw_random_features<double>(FeatureKind::Performer, 0, 4, 0, ""), ValueError);
    EXPECT_EQ(feature_kind("rfa", "attention"), FeatureKind::RFA);
    EXPECT_THROW(feature_kind("softmax", "attention"), ValueError);  // (ft.random_feature_matrix's names)
}

TEST(RandomFeatures, ConfigChecks) {
    ModelConfig c = performer_like("performer", "alibi", 8);
    EXPECT_THROW(resolve(c, Arch::D), ValueError);  // ALiBi: no scores to bias
    c = performer_like("performer", "learned", 8);
    c.part_options.set("sliding_window", std::int64_t(3));
    EXPECT_THROW(resolve(c, Arch::D), ValueError);
    c = performer_like("softmax", "learned", 8);
    EXPECT_THROW(resolve(c, Arch::D), ValueError);  // n_features without random features
    c.part_options.set("n_features", std::int64_t(0));
    EXPECT_THROW(resolve(c, Arch::D), ValueError);  // feature_seed too: an option of a part not chosen
    c.part_options.set("feature_seed", std::uint64_t(0));
    EXPECT_NO_THROW(resolve(c, Arch::D));
    {  // a saved config with such an option (it had no effect: today's files may hold one) loads at its default
        ModelConfig saved = resolve(c, Arch::D);
        std::string j = saved.to_json();
        const std::string at = "\"feature_seed\":0";
        ASSERT_NE(j.find(at), std::string::npos) << j;
        j.replace(j.find(at), at.size(), "\"feature_seed\":5");
        const ModelConfig back = ModelConfig::from_json(j);
        EXPECT_EQ(back.part_options.seed("feature_seed"), 0u);
        EXPECT_EQ(back, saved);
        Options kw = {{"feature_seed", std::int64_t(5)}};  // as a caller's keyword: refused, naming it and its part
        for (const char* size : {"n_vocab", "l_max", "L", "H", "d_e", "d_mlp"}) kw.emplace_back(size, std::int64_t(8));
        try {
            ModelConfig::from_options(Arch::D, kw);
            ADD_FAILURE() << "feature_seed without random features resolved";
        } catch (const ValueError& e) {
            EXPECT_NE(std::string(e.what()).find("feature_seed is an option of the 'performer' head kernel"), std::string::npos)
                << e.what();
        }
    }
    c = performer_like("rfa", "learned", 8);
    c.part_options.set("n_features", std::int64_t(0));  // None: ⌈d_attn ln d_attn⌉ = ⌈4 ln 4⌉ = 6
    EXPECT_EQ(resolve(c, Arch::D).part_options.integer("n_features"), 6);
}
