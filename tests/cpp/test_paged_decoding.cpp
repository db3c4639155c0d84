// Algorithm P (paged.hpp): DInferenceBatch gives every prompt the tokens of DInference on that prompt alone
// (float64 and float32, greedy and sampled, RoPE with GQA and a sliding window, ragged prompts, batches that
// sequences leave and join, past ℓ_max); prompt caches continue as recomputation, through a file too; bad
// input is refused before anything runs.
#include <cstdio>

#include "formal_transformers/io.hpp"
#include "formal_transformers/paged.hpp"
#include "testing.hpp"

using namespace ft;

namespace {
ModelConfig small(bool variants) {
    ModelConfig c;
    c.n_vocab = 13;
    c.l_max = 16;
    c.L = 2;
    c.H = 4;
    c.d_e = 16;
    c.d_mlp = 32;
    c.d_attn = 4;
    c.d_mid = 4;
    c.seed = 5;
    c.init_std = 0.5;  // spread-out outputs
    if (variants) {
        c.positional = "rope";
        c.H_kv = 2;
        c.part_options.set("sliding_window", std::int64_t(5));
    }
    return c;
}

template <class T>
void batch_equals_alone(bool variants) {
    DTransformer<T> m(small(variants));
    const std::vector<std::vector<index_t>> prompts = {{1}, {2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0, 1, 2, 3, 4}, {5, 6, 7}, {8, 9}, {3, 1, 4, 1, 5, 9, 2}};
    for (double tau : {0.0, 1.0}) {
        SamplingOptions o;
        o.tau = tau;
        std::vector<PromptRef<T>> refs;
        std::vector<Rng> rngs;
        for (const auto& p : prompts) refs.push_back({p.data(), index_t(p.size()), nullptr}), rngs.emplace_back(7);
        const auto got = DInferenceBatch(m, refs, 12, o, rngs, 2);  // 16 + 12 > ℓ_max: past it too
        ASSERT_EQ(got.size(), prompts.size());
        for (std::size_t i = 0; i < prompts.size(); ++i) {
            Rng r(7);
            EXPECT_EQ(got[i], DInference(m, prompts[i].data(), index_t(prompts[i].size()), 12, o, r)) << "prompt " << i << " tau " << tau;
        }
    }
}
}  // namespace

TEST(PagedDecoding, BatchEqualsAloneFloat64) { batch_equals_alone<double>(false); }
TEST(PagedDecoding, BatchEqualsAloneFloat32) { batch_equals_alone<float>(false); }
TEST(PagedDecoding, BatchEqualsAloneRopeGqaWindow) {
    batch_equals_alone<double>(true);
    batch_equals_alone<float>(true);
}

TEST(PagedDecoding, PromptCacheContinuesAsRecomputationThroughAFile) {
    DTransformer<double> m(small(true));
    const std::vector<index_t> x = {4, 8, 12, 1, 6, 2, 3};
    const PromptKV<double> pc = prefill(m, x.data(), index_t(x.size()));
    SamplingOptions o;
    Rng r1(3), r2(3), r3(3);
    const auto want = DInference(m, x.data(), index_t(x.size()), 10, o, r1);
    EXPECT_EQ(DInference(m, pc, 10, o, r2), want);
    const std::string path = testing::TempDir() + "ft_prompt_cache_test.safetensors";
    save_prompt_kv(pc, m.cfg, {{"k", "v"}}, path);
    const SavedModel f = SavedModel::read(path);
    EXPECT_TRUE(is_prompt_cache(f));
    EXPECT_EQ(f.metadata.at("k"), "v");
    const PromptKV<double> back = read_prompt_kv<double>(f);
    EXPECT_EQ(back.ids, x);
    EXPECT_EQ(DInference(m, back, 10, o, r3), want);
    EXPECT_THROW(read_prompt_kv<float>(f), ValueError);  // another dtype
    std::remove(path.c_str());
    // the digest of θ changes with θ
    DTransformer<double> m2(small(true));
    EXPECT_EQ(theta_digest(m.store), theta_digest(m2.store));
    m2.store.theta()[3] += 1e-9;
    EXPECT_NE(theta_digest(m.store), theta_digest(m2.store));
}

TEST(PagedDecoding, BadInputRefusedBeforeAnythingRuns) {
    DTransformer<double> m(small(false));
    const std::vector<index_t> ok = {1, 2}, bad_id = {1, 13}, long_p(17, 1);
    SamplingOptions o;
    auto call = [&](const std::vector<index_t>& p, index_t max_batch) {
        std::vector<PromptRef<double>> refs = {{ok.data(), 2, nullptr}, {p.data(), index_t(p.size()), nullptr}};
        std::vector<Rng> rngs(2);
        return DInferenceBatch(m, refs, 1000000, o, rngs, max_batch);
    };
    EXPECT_THROW(call(bad_id, 4), IndexError);
    EXPECT_THROW(call(long_p, 4), ValueError);
    EXPECT_THROW(call({}, 4), ValueError);
    EXPECT_THROW(call(ok, 0), ValueError);
    DTransformer<double> other(small(true));
    const PromptKV<double> pc = prefill(other, ok.data(), 2);
    std::vector<PromptRef<double>> refs = {{nullptr, 0, &pc}};
    std::vector<Rng> rngs(1);
    EXPECT_THROW(DInferenceBatch(m, refs, 3, o, rngs, 4), ValueError);  // H_kv differs: other shapes
}
