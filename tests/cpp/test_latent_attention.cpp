// V10 multi-head latent attention (docs/variants.md; latent_attention.hpp): MHAttention with the latent source
// against central differences (X and every parameter, a ragged batch, with and without a query latent), cached
// decoding with the latent cache (d_c + d_R rows per token, no V) against the full forward past ℓ_max and after
// rollbacks, in float64 and float32, and the options' checks.
#include <cmath>
#include <vector>

#include "formal_transformers/parts.hpp"
#include "formal_transformers/transformers.hpp"
#include "testing.hpp"

using namespace ft;

namespace {
using fttest::perturb;
ModelConfig deepseek_like(index_t l_max, index_t q_rank) {
    ModelConfig c = fttest::llama_like("rope", l_max);
    c.H = 3;
    c.H_kv = 0;
    c.d_attn = 5;  // d_N 3 + d_R 2
    c.d_mid = 4;   // d_v
    c.part_options.set("rope_theta", 200.0);
    c.seed = 5;
    c.part_options.set("kv_lora_rank", std::int64_t(3));
    c.part_options.set("q_lora_rank", std::int64_t(q_rank));
    c.part_options.set("qk_rope_head_dim", std::int64_t(2));
    return c;
}
AttnVariant latent_variant(index_t q_rank) {
    AttnVariant v;
    v.bias = false;
    v.position = "rope";
    v.options.set("rope_theta", 50.0);
    v.options.set("kv_lora_rank", std::int64_t(3));
    v.options.set("q_lora_rank", std::int64_t(q_rank));
    v.options.set("qk_rope_head_dim", std::int64_t(2));
    return v;
}
}  // namespace

TEST(LatentAttention, BackwardMatchesFiniteDifferences) {
    for (index_t q_rank : {index_t(0), index_t(4)}) {
        Rng rng(41);
        const index_t H = 2, d = 5, d_attn = 4, d_mid = 3, d_out = 3;
        ParamStore<double> store;
        MHAttention<double> att(H, d, d, d_attn, d_mid, d_out, Mask::unidirectional(), store, "", latent_variant(q_rank));
        ASSERT_STREQ(att.source->name(), "latent");
        EXPECT_EQ(att.cache_rows(), 3 + 2);
        store.allocate();
        fttest::randomize(store, rng);
        SCOPED_TRACE(q_rank);
        fttest::expect_self_attention_backward_matches_finite_differences(att, store, rng, Seqs::from_lengths({4, 3}));
    }
}

template <class T>
void decoding_equals_forward(double tol) {
    const index_t n = 20;
    for (index_t q_rank : {index_t(0), index_t(4)}) {
        // ℓ_max 4 for decoding, n for the full forward: RoPE has no W_p, so θ is the same
        DTransformer<T> small(deepseek_like(4, q_rank)), big(deepseek_like(n, q_rank));
        ASSERT_EQ(small.store.size(), big.store.size());
        perturb(small.store);
        perturb(big.store);
        const std::vector<index_t> ids = fttest::cycling_ids(n);
        const Matrix<T> Z = fttest::full_logits(big, ids);
        typename DTransformer<T>::Decoder d;
        std::vector<T> z(11);
        std::vector<index_t> junk = {9, 9};
        small.decode(d, ids.data(), 3, z.data());
        for (index_t v = 0; v < 11; ++v) EXPECT_NEAR(z[std::size_t(v)], Z(v, 2), tol);
        for (index_t t = 3; t < n; ++t) {
            small.decode(d, junk.data(), 2, z.data());  // two wrong tokens, forgotten (speculative decoding)
            d.rollback(t);
            small.decode(d, ids.data() + t, 1, z.data());
            for (index_t v = 0; v < 11; ++v) EXPECT_NEAR(z[std::size_t(v)], Z(v, t), tol) << "position " << t;
            for (const auto& c : d.kv) {  // the latent [Ĉ_KV; K_R] per token, no values
                EXPECT_EQ(index_t(c.K.shape(0)), 3 + 2);
                EXPECT_EQ(index_t(c.V.shape(0)), 0);
                EXPECT_EQ(c.len, t + 1);
            }
        }
    }
}

TEST(LatentAttention, CachedDecodingEqualsTheFullForwardFloat64) { decoding_equals_forward<double>(1e-12); }
TEST(LatentAttention, CachedDecodingEqualsTheFullForwardFloat32) { decoding_equals_forward<float>(2e-5); }

TEST(LatentAttention, ConfigChecks) {
    EXPECT_NO_THROW(resolve(deepseek_like(8, 4), Arch::D));
    ModelConfig c = deepseek_like(8, 0);
    c.part_options.set("qk_rope_head_dim", std::int64_t(0));  // missing
    EXPECT_THROW(resolve(c, Arch::D), ValueError);
    c = deepseek_like(8, 0);
    c.part_options.set("qk_rope_head_dim", std::int64_t(3));  // odd
    EXPECT_THROW(resolve(c, Arch::D), ValueError);
    c = deepseek_like(8, 0);
    c.part_options.set("kv_lora_rank", std::int64_t(-1));
    EXPECT_THROW(resolve(c, Arch::D), ValueError);
    c = deepseek_like(8, 0);
    c.H_kv = 1;
    EXPECT_THROW(resolve(c, Arch::D), ValueError);
    c = deepseek_like(8, 0);
    c.positional = "alibi";
    EXPECT_THROW(resolve(c, Arch::D), ValueError);
    c = deepseek_like(8, 0);
    c.part_options.set("kv_lora_rank", std::int64_t(0));  // a query latent without the KV latent
    c.part_options.set("q_lora_rank", std::int64_t(2));
    EXPECT_THROW(resolve(c, Arch::D), ValueError);
    // the stand-alone MHAttention checks the same before declaring anything
    ParamStore<double> store;
    AttnVariant v = latent_variant(0);
    v.bias = true;
    EXPECT_THROW(MHAttention<double>(2, 4, 4, 4, 4, 4, Mask::unidirectional(), store, "", v), ValueError);
    v = latent_variant(0);
    v.H_kv = 1;
    EXPECT_THROW(MHAttention<double>(2, 4, 4, 4, 4, 4, Mask::unidirectional(), store, "", v), ValueError);
    v = latent_variant(0);
    v.options.set("qk_rope_head_dim", std::int64_t(0));  // the row's check, run by the factory too
    EXPECT_THROW(MHAttention<double>(2, 4, 4, 4, 4, 4, Mask::unidirectional(), store, "", v), ValueError);
    EXPECT_EQ(store.size(), index_t(0));
    // the latent source's options are its row's: given, they choose it
    const PartRow* row = find_part_row(PartKind::QKVSource, "latent");
    ASSERT_NE(row, nullptr);
    EXPECT_EQ(part_row_of_option("q_lora_rank"), row);
    const ModelConfig r = resolve(deepseek_like(8, 2), Arch::D);
    EXPECT_EQ(chosen_part(r, PartKind::QKVSource), row);
    EXPECT_EQ(chosen_part(resolve(fttest::llama_like("rope", 8), Arch::D), PartKind::QKVSource), nullptr);
    EXPECT_EQ(qkv_source_name(latent_variant(0)), "latent");
    EXPECT_EQ(qkv_source_name(AttnVariant()), "projections");
}
