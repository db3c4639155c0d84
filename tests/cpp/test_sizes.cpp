// sizes.hpp (checked size arithmetic, one bound in bytes) and fpenv.hpp (FTZ/DAZ only inside core calls).
#include <limits>

#include "formal_transformers/fpenv.hpp"
#include "formal_transformers/sizes.hpp"
#include "formal_transformers/transformers.hpp"
#include "testing.hpp"

using ft::index_t;

TEST(Sizes, CheckedArithmeticCatchesOverflowAndNegatives) {
    const index_t big = std::numeric_limits<index_t>::max();
    EXPECT_EQ(ft::checked_mul(6, 7, "x"), 42);
    EXPECT_EQ(ft::checked_add(big - 1, 1, "x"), big);
    EXPECT_THROW(ft::checked_mul(index_t(1) << 32, index_t(1) << 32, "x"), ft::ValueError);
    EXPECT_THROW(ft::checked_mul(index_t(1) << 62, 4, "x"), ft::ValueError);
    EXPECT_THROW(ft::checked_add(big, 1, "x"), ft::ValueError);
    EXPECT_THROW(ft::checked_mul(-1, 3, "x"), ft::ValueError);
    EXPECT_THROW(ft::checked_count({index_t(1) << 40, index_t(1) << 30}, "x"), ft::ValueError);
    EXPECT_EQ(ft::checked_count({2, 3, 4}, "x"), 24);
}

TEST(Sizes, BytesAreHeldAgainstTheMachinesMemory) {
    const auto bound = ft::max_alloc_bytes();
    EXPECT_GT(bound, std::uint64_t(1) << 26);
    EXPECT_NO_THROW(ft::check_bytes(1000, 8, "x"));
    EXPECT_THROW(ft::check_bytes(index_t(bound / 8) + 1, 8, "x"), ft::ValueError);
    try {
        ft::checked_elements({index_t(1) << 40, 4}, 8, "workspace");
        FAIL() << "no error";
    } catch (const ft::ValueError& e) {
        EXPECT_NE(std::string(e.what()).find("workspace"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("exceeds"), std::string::npos) << e.what();
    }
}

TEST(Sizes, ParamStoreRefusesAWrappedOrHugeCountBeforeAllocating) {
    ft::ParamStore<float> s;
    EXPECT_THROW(s.matrix("W", index_t(1) << 62, 4), ft::ValueError);     // wraps: 2^64
    EXPECT_THROW(s.stacked("Q", index_t(1) << 40, 1 << 20, 4), ft::ValueError);
    EXPECT_THROW(s.matrix("W2", index_t(1) << 40, 1), ft::ValueError);    // 8 TiB with its gradient
    EXPECT_EQ(s.size(), 0);                                              // nothing was declared
    s.matrix("ok", 3, 4);
    s.allocate();
    EXPECT_EQ(s.size(), 12);
}

TEST(Sizes, AModelWithAbsurdLayerCountFailsBeforeDeclaringLayers) {
    ft::ModelConfig c;
    c.n_vocab = 12;
    c.l_max = 8;
    c.L = index_t(1) << 40;
    c.H = 2;
    c.d_e = 8;
    c.d_mlp = 16;
    EXPECT_THROW(ft::DTransformer<float>{c}, ft::ValueError);
    c.L = 2;
    c.d_attn = index_t(1) << 40;
    EXPECT_THROW(ft::DTransformer<float>{c}, ft::ValueError);
    c.d_attn = 0;
    ft::DTransformer<float> ok(c);
    EXPECT_GT(ok.store.size(), 0);
}

// Issue 27: the names are hashed (a scan per declaration made a model quadratic in L): 200 k entries are
// declared and found, each at its own offset, and a repeated name is still refused.
TEST(Sizes, ParamStoreFindsEachOfManyNames) {
    ft::ParamStore<float> s;
    const index_t n = 200000;
    for (index_t i = 0; i < n; ++i) s.vector("layer" + std::to_string(i) + ".b", 1);
    EXPECT_THROW(s.vector("layer123.b", 1), std::exception);
    s.allocate();
    for (index_t i = 0; i < n; i += 997) {
        const ft::ParamInfo* e = s.find("layer" + std::to_string(i) + ".b");
        ASSERT_NE(e, nullptr);
        EXPECT_EQ(e->offset, i);
    }
    EXPECT_EQ(s.find("layer200000.b"), nullptr);
}

// Issue 27: more threads than can be created is a ValueError (libgomp crashed the process); the cap is
// reachable and at least 4 per CPU within OMP_THREAD_LIMIT.
TEST(Threads, CountAboveTheCapIsAValueError) {
    const int saved = ft::get_num_threads(), cap = ft::max_num_threads();
    EXPECT_GE(cap, 1);
    EXPECT_THROW(ft::set_num_threads(cap + 1), ft::ValueError);
    EXPECT_THROW(ft::set_num_threads(100000), ft::ValueError);
    EXPECT_EQ(ft::get_num_threads(), saved);
    ft::set_num_threads(cap);
    EXPECT_EQ(ft::get_num_threads(), cap);
    ft::set_num_threads(saved);
}

#if defined(__SSE__) || defined(__x86_64__)
TEST(FpEnv, SetInsideRestoredOnEveryExit) {
    ASSERT_FALSE(ft::ftz_enabled());
    ASSERT_FALSE(ft::daz_enabled());
    {
        ft::FpEnvScope s;
        EXPECT_TRUE(ft::ftz_enabled() && ft::daz_enabled());
        {
            ft::FpEnvScope nested;
            ft::FpCallerEnv caller;  // the caller's environment while the core runs caller code
            EXPECT_FALSE(ft::ftz_enabled());
        }
        EXPECT_TRUE(ft::ftz_enabled());
    }
    EXPECT_FALSE(ft::ftz_enabled() || ft::daz_enabled());
    try {
        ft::FpEnvScope s;
        throw ft::ValueError("x");
    } catch (const ft::ValueError&) {
    }
    EXPECT_FALSE(ft::ftz_enabled() || ft::daz_enabled());
    volatile double tiny = 1e-310;
    EXPECT_NE(tiny * 0.5, 0.0);  // denormal arithmetic is back to IEEE
}
#endif

#if (defined(__SSE__) || defined(__x86_64__)) && defined(_OPENMP)
#include <omp.h>
namespace {
int threads_with_ftz(int n) {
    int count = 0;
#pragma omp parallel num_threads(n) reduction(+ : count)
    count += ft::ftz_enabled() ? 1 : 0;
    return count;
}
}  // namespace

TEST(FpEnv, PoolThreadsHaveItOnlyInsideACoreCall) {
    ft::set_num_threads(2);
    EXPECT_EQ(threads_with_ftz(2), 0);
    {
        ft::FpEnvScope s(true);
        EXPECT_EQ(threads_with_ftz(2), 2);
    }
    EXPECT_EQ(threads_with_ftz(2), 0);
    {
        ft::FpEnvScope s;  // a short call: the calling thread only
        EXPECT_EQ(threads_with_ftz(2), 1);
    }
    EXPECT_EQ(threads_with_ftz(2), 0);
}
#endif
