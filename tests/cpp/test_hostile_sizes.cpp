// Sizes and options checked at their cause, each by one rule the config and the part share: V15's n_features
// (check_n_features), V11's buckets (check_relative_buckets), and the KV cache of a sliding window wider than any
// sequence (MHAttention::append_kv: the one place a cache's size is decided).
#include <limits>

#include "formal_transformers/attention.hpp"
#include "formal_transformers/parts.hpp"
#include "formal_transformers/random_features.hpp"
#include "testing.hpp"

using namespace ft;

// ------------------------------------------------------------------------------------------- V15: n_features
TEST(HostileSizes, NFeaturesOneRuleForTheConfigThePartAndTheDraw) {
    EXPECT_EQ(check_n_features(FeatureKind::Performer, 6, 4, 2, sizeof(float)), 6);
    EXPECT_EQ(check_n_features(FeatureKind::RFA, 6, 4, 2, sizeof(float)), 12);  // M = 2D: sin and cos
    EXPECT_THROW(check_n_features(FeatureKind::RFA, 0, 4, 1, sizeof(float)), ValueError);
    for (index_t D : {index_t(1) << 40, index_t(1) << 61, index_t(1) << 62, std::numeric_limits<index_t>::max()}) {
        // D·d wrapped (2^61, 2^62: a memset past a small buffer) or exceeds memory (2^40: std::bad_alloc)
        EXPECT_THROW(check_n_features(FeatureKind::RFA, D, 4, 1, sizeof(double)), ValueError) << D;
        EXPECT_THROW(draw_random_features<double>(FeatureKind::Performer, D, 4, 0, ""), ValueError) << D;
        ModelConfig c = fttest::small_decoder(8);
        c.attention = "performer";
        c.part_options.set("n_features", std::int64_t(D));
        EXPECT_THROW(resolve(c, Arch::D), ValueError) << D;  // the config: before any layer
        AttnVariant v;
        v.kernel = "rfa";
        v.options.set("n_features", std::int64_t(D));
        ParamStore<float> s;
        EXPECT_THROW(MHAttention<float>(2, 8, 8, 4, 4, 8, Mask::unidirectional(), s, "", v), ValueError) << D;  // the part
    }
    // the bound is on every layer's Ω: a D one attention could hold is refused for 2^20 of them
    const index_t D = index_t(max_alloc_bytes() / (4 * (sizeof(float) + sizeof(double)))) / 2;
    EXPECT_NO_THROW(check_n_features(FeatureKind::Performer, D, 4, 1, sizeof(float)));
    EXPECT_THROW(check_n_features(FeatureKind::Performer, D, 4, index_t(1) << 20, sizeof(float)), ValueError);
}

// ------------------------------------------------------------------------------------------------ V11: buckets
TEST(HostileSizes, RelativeBucketsOneRuleForTheConfigAndThePart) {
    // line 3's m = N/2 >= 1 and d_max > m: bidirectional N = N_b/2, causal N = N_b
    EXPECT_NO_THROW(check_relative_buckets(4, 2, true));
    EXPECT_THROW(check_relative_buckets(4, 1, true), ValueError);   // m = 1: ln(d_max/m) = 0
    EXPECT_THROW(check_relative_buckets(3, 100, true), ValueError);  // m = 0
    EXPECT_NO_THROW(check_relative_buckets(2, 2, false));
    EXPECT_THROW(check_relative_buckets(1, 100, false), ValueError);
    EXPECT_THROW(check_relative_buckets(8, 4, false), ValueError);  // m = 4 = d_max
    EXPECT_NO_THROW(check_relative_buckets(8, 5, false));
    // the part: a causal table with d_max <= m was accepted (its buckets then fell below 0 for long offsets)
    for (bool bi : {true, false})
        for (index_t d_max : {1, 2, 3, 4}) {
            AttnVariant v;
            v.position = "relative", v.rel_bidirectional = bi;
            v.options.set("relative_buckets", std::int64_t(8));
            v.options.set("relative_max_distance", std::int64_t(d_max));
            ParamStore<double> s;
            const index_t m = bi ? 2 : 4;
            if (d_max > m)
                EXPECT_NO_THROW(MHAttention<double>(2, 6, 6, 3, 3, 6, Mask::unidirectional(), s, "", v));
            else
                EXPECT_THROW(MHAttention<double>(2, 6, 6, 3, 3, 6, Mask::unidirectional(), s, "", v), ValueError) << bi << d_max;
        }
    // the config: the encoder's rule and the decoder's (one N_b and d_max for both stacks)
    ModelConfig c;
    c.n_vocab = 17, c.l_max = 12, c.L_enc = c.L_dec = 1, c.H = 2, c.d_e = 8, c.d_mlp = 8;
    c.positional = "relative";
    c.part_options.set("relative_buckets", std::int64_t(8));
    c.part_options.set("relative_max_distance", std::int64_t(4));  // the encoder's m = 2, the decoder's m = 4
    EXPECT_THROW(resolve(c, Arch::ED), ValueError);
    c.part_options.set("relative_max_distance", std::int64_t(5));
    EXPECT_NO_THROW(resolve(c, Arch::ED));
}

// -------------------------------------------------------------------------- V9: a window wider than any sequence
// The cache follows what the sequence uses (doubling), a window's at most 2w: w = 2^40 or 2^62 (2w wraps) holds a
// few columns for a few tokens (it was 2w columns: std::bad_alloc, or a multi-GB allocation for w = 3·10^7), and a
// small window still rolls within 2w.
TEST(HostileSizes, SlidingWindowCacheIsSizedByTheSequence) {
    const index_t H = 2, d = 8, d_attn = 4;
    for (index_t w : {index_t(30000000), index_t(1000000000000), index_t(1) << 62, index_t(5)}) {
        MaskOptions o;
        o.options.set("sliding_window", std::int64_t(w));
        ParamStore<double> s;
        MHAttention<double> a(H, d, d, d_attn, d_attn, d, make_mask("sliding_window", o), s);
        s.allocate();
        Rng rng(3);
        fttest::randomize(s, rng);
        KVCache<double> cache;
        std::vector<double> X = fttest::randn(d * 40, rng);
        index_t most = 0;
        for (index_t t = 0; t < 40; ++t) {
            a.append_kv(s, CMatView<double>(X.data() + t * d, d, 1), cache);
            most = std::max(most, index_t(cache.K.shape(1)));
        }
        EXPECT_EQ(cache.start + cache.len, 40);
        if (w == 5) {
            EXPECT_LE(most, 10);  // 2w
            EXPECT_GT(cache.start, 0);
        } else {
            EXPECT_LE(most, 64);
            EXPECT_EQ(cache.start, 0);
        }
    }
}
