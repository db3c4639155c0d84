// Sliding-window attention (docs/variants.md V8) and its rolling KV cache (V9): the mask against its
// definition, the model against the same θ with the window written as an explicit mask, and cached decoding
// to many windows past w (and past ℓ_max) against the full forward, with the cache's columns staying O(w).
#include <cmath>
#include <vector>

#include "formal_transformers/parts.hpp"
#include "formal_transformers/transformers.hpp"
#include "testing.hpp"

using namespace ft;

namespace {
Mask window_mask(OptionValue w) {
    MaskOptions o;
    o.options.set("sliding_window", w);
    return make_mask("sliding_window", o);
}
using fttest::perturb;
ModelConfig mistral_like(const std::string& pos, index_t l_max, index_t w) {
    ModelConfig c = fttest::llama_like(pos, l_max);
    c.part_options.set("sliding_window", std::int64_t(w));
    return c;
}
}  // namespace

// V26: with sliding_window_pattern p, layer l is global (Algorithm 10's causal mask) when l + 1 is a multiple of p,
// local (the window, with rope_local_base_freq as θ) otherwise; the model's window() is 0 when a layer reads every key
TEST(SlidingWindow, LocalAndGlobalLayers) {
    ModelConfig c = mistral_like("rope", 8, 3);
    c.L = 3;
    c.part_options.set("sliding_window_pattern", std::int64_t(2));
    c.part_options.set("rope_local_base_freq", 50.0);
    const DTransformer<double> m(c);
    EXPECT_EQ(m.layer[0]->attn.mask.window(), 3);
    EXPECT_EQ(m.layer[1]->attn.mask.window(), 0);
    EXPECT_EQ(m.layer[2]->attn.mask.window(), 3);
    EXPECT_EQ(m.layer[0]->attn.var.options.real("rope_theta"), 50.0);
    EXPECT_EQ(m.layer[1]->attn.var.options.real("rope_theta"), c.part_options.real("rope_theta"));
    EXPECT_EQ(m.window(), 0);
    ModelConfig no_window = fttest::llama_like("rope", 8);
    no_window.part_options.set("sliding_window_pattern", std::int64_t(2));
    EXPECT_THROW(resolve(no_window, Arch::D), ValueError);  // the pattern needs the window
}

TEST(SlidingWindow, MaskIsTheLastWKeys) {
    for (index_t w : {1, 2, 5}) {
        const Mask m = window_mask(std::int64_t(w));
        EXPECT_EQ(m.window(), w);
        EXPECT_EQ(m.name(), "sliding_window");
        for (index_t t_x = 0; t_x < 9; ++t_x) {
            for (index_t t_z = 0; t_z < 9; ++t_z) EXPECT_EQ(m.allows(t_z, t_x), t_x - w < t_z && t_z <= t_x);
            // the key range is exactly the allowed keys
            const KeyRange r = m.keys(0, t_x, 9);
            EXPECT_TRUE(r.dense);
            for (index_t t_z = 0; t_z < 9; ++t_z) EXPECT_EQ(t_z >= r.begin && t_z < r.end, m.allows(t_z, t_x));
        }
    }
    EXPECT_THROW(window_mask(std::int64_t(0)), ValueError);
    EXPECT_THROW(window_mask(std::int64_t(-3)), ValueError);
    EXPECT_THROW(window_mask(2.5), TypeError);  // the option is an integer
    EXPECT_EQ(Mask::unidirectional().window(), 0);
}

TEST(SlidingWindow, RollingCacheDecodingEqualsTheFullForwardAndStaysOfOrderW) {
    const index_t w = 3, n = 40;
    for (const char* pos : {"rope", "alibi"}) {
        // the same θ with ℓ_max 4 (decoding) and ℓ_max n (the full forward): no W_p, so ℓ_max does not change θ
        DTransformer<double> small(mistral_like(pos, 4, w)), big(mistral_like(pos, n, w));
        ASSERT_EQ(small.store.size(), big.store.size());
        perturb(small.store);
        perturb(big.store);
        const std::vector<index_t> ids = fttest::cycling_ids(n);
        const Matrix<double> Z = fttest::full_logits(big, ids);
        DTransformer<double>::Decoder d;
        std::vector<double> z(11);
        small.decode(d, ids.data(), 5, z.data());  // a prompt longer than w, then one token at a time
        for (index_t v = 0; v < 11; ++v) EXPECT_NEAR(z[std::size_t(v)], Z(v, 4), 1e-12);
        for (index_t t = 5; t < n; ++t) {
            small.decode(d, ids.data() + t, 1, z.data());
            for (index_t v = 0; v < 11; ++v) EXPECT_NEAR(z[std::size_t(v)], Z(v, t), 1e-12) << "position " << t;
            for (const auto& c : d.kv) {  // O(w) columns, whatever t
                EXPECT_LE(c.len, 2 * w);
                EXPECT_LE(index_t(c.K.shape(1)), 4 * w);
                EXPECT_EQ(c.start + c.len, t + 1);
            }
        }
        // without the window the same θ gives other logits (the check can fail)
        ModelConfig causal = mistral_like(pos, n, 0);
        DTransformer<double> full(causal);
        perturb(full.store);
        full.forward(Tokens{ids.data(), Seqs::single(n)});
        Matrix<double> Zc = Matrix<double>::from_shape({11, std::size_t(n)});
        full.logits(view(Zc));
        double diff = 0;
        for (index_t v = 0; v < 11; ++v) diff = std::max(diff, std::abs(Zc(v, n - 1) - Z(v, n - 1)));
        EXPECT_GT(diff, 1e-6);
    }
}

TEST(SlidingWindow, RollbackWithinTheCacheKeepsDecodingExact) {
    const index_t w = 4, n = 30;
    DTransformer<double> m(mistral_like("rope", n, w));
    perturb(m.store);
    const std::vector<index_t> ids = fttest::cycling_ids(n, 5, 1);
    const Matrix<double> Z = fttest::full_logits(m, ids);
    DTransformer<double>::Decoder d;
    std::vector<double> z(11);
    std::vector<index_t> junk = {9, 9};
    m.decode(d, ids.data(), 1, z.data());
    for (index_t t = 1; t < n; ++t) {
        m.decode(d, junk.data(), 2, z.data());  // two wrong tokens, then forget them (speculative decoding)
        d.rollback(t);
        m.decode(d, ids.data() + t, 1, z.data());
        for (index_t v = 0; v < 11; ++v) EXPECT_NEAR(z[std::size_t(v)], Z(v, t), 1e-12) << "position " << t;
    }
}

TEST(SlidingWindow, ConfigChecks) {
    ModelConfig c = mistral_like("rope", 8, -1);
    EXPECT_THROW(resolve(c, Arch::D), ValueError);
    c.part_options.set("sliding_window", std::int64_t(2));
    EXPECT_NO_THROW(resolve(c, Arch::D));
    ModelConfig e = c;
    e.positional = "learned";
    e.mlp = "";  // the listing's
    e.norm = "layer";
    EXPECT_THROW(resolve(e, Arch::E), ValueError);
}

// The window is the mask part's option: its row (variants/sliding_window_mask.cpp) declares it, the config's
// schema takes it from there (keyword, JSON, repr), giving it chooses the mask, and decoding asks the model's mask.
TEST(SlidingWindow, TheMaskPartOwnsItsOption) {
    const PartRow* row = find_part_row(PartKind::Mask, "sliding_window");
    ASSERT_NE(row, nullptr);
    ASSERT_EQ(row->options.size(), 3u);  // the window, and V26's layer pattern and the local layers' RoPE θ
    EXPECT_STREQ(row->options[0].name, "sliding_window");
    EXPECT_STREQ(row->options[1].name, "sliding_window_pattern");
    EXPECT_STREQ(row->options[2].name, "rope_local_base_freq");
    EXPECT_EQ(part_row_of_option("sliding_window"), row);
    EXPECT_NE(ModelConfig::signature(Arch::D).find("sliding_window=None"), std::string::npos);
    EXPECT_EQ(ModelConfig::signature(Arch::E).find("sliding_window"), std::string::npos);  // a D option only

    ModelConfig c = resolve(mistral_like("rope", 8, 3), Arch::D);
    EXPECT_EQ(chosen_part(c, PartKind::Mask), row);
    EXPECT_NE(c.to_string().find("sliding_window=3"), std::string::npos) << c.to_string();
    EXPECT_EQ(ModelConfig::from_json(c.to_json()), c);
    ModelConfig other = c;
    other.part_options.set("sliding_window", std::int64_t(4));
    EXPECT_NE(resolve(other, Arch::D), c);  // == compares the parts' options too
    const DTransformer<double> m(c);
    EXPECT_EQ(m.window(), 3);
    EXPECT_EQ(m.layer[0]->attn.mask.name(), "sliding_window");
    EXPECT_TRUE(m.decodes_past_l_max());  // RoPE with a window: context='auto' decodes past ℓ_max
    const DTransformer<double> causal(fttest::llama_like("rope", 8));
    EXPECT_EQ(causal.window(), 0);
    EXPECT_FALSE(causal.decodes_past_l_max());

    // an option of a part that is not chosen must be at its default: the error names the option and the parts
    ModelConfig p = c;
    p.mask = "prefix";
    try {
        resolve(p, Arch::D);
        ADD_FAILURE() << "mask='prefix' with sliding_window resolved";
    } catch (const ValueError& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("sliding_window is an option of the 'sliding_window' mask"), std::string::npos) << what;
        EXPECT_NE(what.find("mask='prefix' chooses the 'prefix' mask"), std::string::npos) << what;
    }
}

// What a KV cache keeps is the mask's (CacheKeep): every key for the causal and chunked masks; a rolling cache of the
// last w − 1 keys for the sliding window (rolled when a new token would pass 2w), its capacity at most 2w and shrunk
// back after a long prompt; paged decoding frees the pages before the first key a next query reads.
TEST(SlidingWindow, WhatTheCacheKeepsIsTheMasks) {
    MaskOptions chunks;
    chunks.options.set("attention_chunk_size", std::int64_t(4));
    for (const Mask& all : {Mask::unidirectional(), make_mask("chunked", chunks)}) {
        const CacheKeep k = all.cache_keep();
        EXPECT_EQ(k.window, 0) << all.name();
        EXPECT_EQ(k.drop(1000, 1), 0);
        EXPECT_EQ(k.oldest_needed(1000), 0);
        EXPECT_EQ(k.capacity(5, 8), 8);  // fits: no reallocation
        EXPECT_EQ(k.capacity(9, 8), 16);  // doubles
        EXPECT_EQ(k.capacity(3, 1000), 1000);  // never shrinks
    }
    const CacheKeep k = window_mask(std::int64_t(4)).cache_keep();
    EXPECT_EQ(k.window, 4);
    EXPECT_EQ(k.drop(3, 5), 0);  // only the last w − 1 = 3 are kept, and there are no more
    EXPECT_EQ(k.drop(7, 1), 0);  // 8 columns fit 2w
    EXPECT_EQ(k.drop(8, 1), 5);  // the 9th would not: the last 3 stay
    EXPECT_EQ(k.oldest_needed(3), 0);
    EXPECT_EQ(k.oldest_needed(10), 6);
    EXPECT_EQ(k.capacity(9, 8), 9);  // min(doubling, 2w), at least what is needed
    EXPECT_EQ(k.capacity(5, 4), 8);
    EXPECT_EQ(k.capacity(4, 100), 8);  // after a long prompt: back to 2w
}
