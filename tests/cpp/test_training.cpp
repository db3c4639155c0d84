// Algorithms 11–15 through the C++ API: DTraining drives a repeating sequence to ~0 loss with the listing's
// SGD; the masking of Algorithm 12 line 5 hits the expected fraction; the η schedule's values typed in by
// hand; sample_token at τ = 0 / top_k = 1 is the argmax; DInference's KV-cached path equals the literal one.
#include "formal_transformers/inference.hpp"
#include "formal_transformers/training.hpp"
#include "testing.hpp"

#include <cmath>

using namespace ft;

namespace {
ModelConfig small_d(index_t n_vocab = 8, index_t l_max = 12) {
    ModelConfig c;
    c.n_vocab = n_vocab;
    c.l_max = l_max;
    c.L = 1;
    c.H = 2;
    c.d_e = 16;
    c.d_mlp = 32;
    c.seed = 3;
    return c;
}

// The listing's update: θ ← θ − η·g over the trainable ranges.
template <class T>
UpdateFn<T> sgd() {
    return [](ParamStore<T>& s, const T* g, double lr) { SGD<T>(lr).step(s, g); };
}

// Sequences of the cycle 0 1 2 3 4 0 1 … (length ℓ), one starting at every phase.
Dataset cycle_data(index_t period, index_t l) {
    Dataset d;
    std::vector<index_t> lens;
    for (index_t phase = 0; phase < period; ++phase) {
        for (index_t t = 0; t < l; ++t) d.ids.push_back((phase + t) % period);
        lens.push_back(l);
    }
    d.s = Seqs::from_lengths(lens);
    return d;
}
}  // namespace

TEST(Training, DTrainingWithSgdLearnsARepeatingSequenceToNearZeroLoss) {
    DTransformer<double> m(small_d());
    const Dataset data = cycle_data(5, 12);
    const Tokens all{data.ids.data(), data.s};
    index_t scored = 0;
    const double before = m.loss(all, &scored) / double(scored);
    EXPECT_GT(before, 1.5);  // ≈ log 8 at initialisation
    TrainOptions o;
    o.n_epochs = 150;
    o.eta = 0.1;
    o.shuffle = true;
    o.seed = 1;
    std::vector<double> losses;
    DTraining<double>(m, data, o, sgd<double>(), [&](const StepInfo& s) {
        losses.push_back(s.loss);
        return true;
    });
    EXPECT_EQ(index_t(losses.size()), 150 * 5);  // batch_size 1: one update per sequence per epoch
    index_t correct = 0;
    const double after = m.loss(all, &scored, &correct) / double(scored);
    EXPECT_LT(after, 0.02) << "loss per token after training (before: " << before << ")";
    EXPECT_EQ(correct, scored);  // every next token predicted
}

TEST(Training, DTrainingOneSgdStepIsTheListingsUpdate) {
    // N_epochs = 1, one sequence, SGD, B = 1: θ ← θ − η ∇loss(θ) exactly (line 6)
    DTransformer<double> m(small_d()), hand(small_d());
    const Dataset data = cycle_data(5, 7);
    Dataset one;
    one.ids.assign(data.ids.begin(), data.ids.begin() + 7);
    one.s = Seqs::single(7);
    TrainOptions o;
    o.eta = 0.3;
    DTraining<double>(m, one, o, sgd<double>(), {});
    hand.loss_and_grad(Tokens{one.ids.data(), one.s});
    for (index_t i = 0; i < hand.store.size(); ++i) hand.store.theta()[i] -= 0.3 * hand.store.grad()[i];
    EXPECT_LT(fttest::rel_error(m.store.theta(), hand.store.theta(), std::size_t(m.store.size())), 1e-14);
}

TEST(Training, MaskTokensMasksTheExpectedFraction) {
    const index_t n = 200000, mask = 97;
    const std::size_t un = static_cast<std::size_t>(n);
    std::vector<index_t> x(un), xt(un);
    for (index_t t = 0; t < n; ++t) x[std::size_t(t)] = t % 50;
    for (double p : {0.05, 0.15, 0.5, 0.9}) {
        Rng rng(11);
        mask_tokens(x.data(), n, mask, p, rng, xt.data());
        index_t masked = 0;
        for (index_t t = 0; t < n; ++t) {
            if (xt[std::size_t(t)] == mask) ++masked;
            else EXPECT_EQ(xt[std::size_t(t)], x[std::size_t(t)]);  // the others untouched
        }
        const double frac = double(masked) / double(n), sd = std::sqrt(p * (1 - p) / double(n));
        EXPECT_NEAR(frac, p, 5 * sd) << "p_mask = " << p;
    }
    // the same seed, the same masks; another seed, other masks
    std::vector<index_t> a(un), b(un), c(un);
    Rng r1(4), r2(4), r3(5);
    mask_tokens(x.data(), n, mask, 0.3, r1, a.data());
    mask_tokens(x.data(), n, mask, 0.3, r2, b.data());
    mask_tokens(x.data(), n, mask, 0.3, r3, c.data());
    EXPECT_EQ(a, b);
    EXPECT_NE(a, c);
}

TEST(Training, LearningRateScheduleValues) {
    TrainOptions o;
    o.eta = 1.0;
    EXPECT_EQ(learning_rate(o, 1, 10), 1.0);  // constant
    EXPECT_EQ(learning_rate(o, 10, 10), 1.0);
    o.warmup = 4;  // linear warm-up: η·step/warmup for step ≤ warmup
    EXPECT_DOUBLE_EQ(learning_rate(o, 1, 10), 0.25);
    EXPECT_DOUBLE_EQ(learning_rate(o, 2, 10), 0.5);
    EXPECT_DOUBLE_EQ(learning_rate(o, 4, 10), 1.0);
    EXPECT_DOUBLE_EQ(learning_rate(o, 7, 10), 1.0);
    o.schedule = TrainOptions::Schedule::Cosine;  // then cos decay to min_lr at the last step
    o.min_lr = 0.1;
    // step 7 of 10 after 4 warm-up steps: progress (7−4)/(10−4) = 1/2 → 0.1 + 0.45·(1 + cos(π/2)) = 0.55
    EXPECT_NEAR(learning_rate(o, 7, 10), 0.55, 1e-15);
    // step 5: progress 1/6 → 0.1 + 0.45·(1 + cos(π/6)) = 0.1 + 0.45·(1 + √3/2)
    EXPECT_NEAR(learning_rate(o, 5, 10), 0.1 + 0.45 * (1 + std::sqrt(3.0) / 2), 1e-15);
    EXPECT_NEAR(learning_rate(o, 10, 10), 0.1, 1e-15);
    o.schedule = TrainOptions::Schedule::Linear;
    EXPECT_NEAR(learning_rate(o, 7, 10), 0.55, 1e-15);  // halfway between 1 and 0.1
    EXPECT_NEAR(learning_rate(o, 8, 10), 1.0 - 0.9 * 4.0 / 6.0, 1e-15);
    EXPECT_NEAR(learning_rate(o, 10, 10), 0.1, 1e-15);
    o.warmup = 0;  // no warm-up: step 1 already decays
    EXPECT_NEAR(learning_rate(o, 1, 5), 1.0 - 0.9 * 1.0 / 5.0, 1e-15);
}

TEST(Training, RejectsBadOptionsAndEmptyData) {
    TrainOptions o;
    o.p_mask = 0;
    EXPECT_THROW(o.check(), ValueError);
    o.p_mask = 1;
    EXPECT_THROW(o.check(), ValueError);
    o = TrainOptions();
    o.batch_size = 0;
    EXPECT_THROW(o.check(), ValueError);
    o = TrainOptions();
    DTransformer<float> m(small_d());
    Dataset empty;
    EXPECT_THROW(DTraining<float>(m, empty, o, sgd<float>(), {}), ValueError);
}

TEST(Sampling, TauZeroAndTopKOneAreTheArgmax) {
    Rng rng(7);
    std::vector<double> scratch;
    std::vector<index_t> order;
    for (int trial = 0; trial < 50; ++trial) {
        std::vector<double> z = fttest::randn(23, rng, 3.0);
        const index_t arg = index_t(std::max_element(z.begin(), z.end()) - z.begin());
        SamplingOptions o;
        o.tau = 0;
        EXPECT_EQ(sample_token(z.data(), 23, o, rng, scratch, order), arg);
        o.tau = 1.0;
        o.top_k = 1;
        EXPECT_EQ(sample_token(z.data(), 23, o, rng, scratch, order), arg);
        o.tau = 5.0;  // a flat q, still only one candidate
        EXPECT_EQ(sample_token(z.data(), 23, o, rng, scratch, order), arg);
        std::vector<float> zf(z.begin(), z.end());
        o.tau = 0;
        o.top_k = 0;
        EXPECT_EQ(sample_token(zf.data(), 23, o, rng, scratch, order), arg);
    }
    // ties: the first of them
    std::vector<double> tie = {0.0, 2.0, 1.0, 2.0};
    SamplingOptions o;
    o.tau = 0;
    EXPECT_EQ(sample_token(tie.data(), 4, o, rng, scratch, order), 1);
}

TEST(Sampling, FrequenciesFollowSoftmaxOverTau) {
    const std::vector<double> z = {1.0, 0.0, -1.0, 0.5, 2.0};
    for (double tau : {0.5, 1.0, 2.0}) {
        std::vector<double> q(5);
        double s = 0;
        for (int i = 0; i < 5; ++i) s += (q[std::size_t(i)] = std::exp(z[std::size_t(i)] / tau));
        SamplingOptions o;
        o.tau = tau;
        Rng rng(99);
        std::vector<double> scratch;
        std::vector<index_t> order;
        const int n = 100000;
        std::vector<int> count(5, 0);
        for (int k = 0; k < n; ++k) ++count[std::size_t(sample_token(z.data(), 5, o, rng, scratch, order))];
        for (int i = 0; i < 5; ++i) {
            const double p = q[std::size_t(i)] / s;
            EXPECT_NEAR(count[std::size_t(i)] / double(n), p, 5 * std::sqrt(p * (1 - p) / n)) << "tau " << tau << " token " << i;
        }
    }
}

TEST(Inference, DInferenceCachedEqualsLiteral) {
    for (bool sinusoidal : {false, true}) {
        ModelConfig c = small_d(11, 10);
        c.L = 2;
        c.init_std = 0.5;  // spread-out distributions, so sampling differences would show
        if (sinusoidal) c.positional = Positional::Sinusoidal;
        DTransformer<double> m(c);
        const std::vector<index_t> prompt = {1, 4, 2};
        for (std::uint64_t seed : {0ULL, 1ULL, 2ULL}) {
            for (double tau : {0.0, 1.0}) {
                SamplingOptions o;
                o.tau = tau;
                // 3 + 20 > l_max = 10: the sliding window too
                o.cache = true;
                Rng r1(seed);
                const std::vector<index_t> a = DInference<double>(m, prompt.data(), 3, 20, o, r1);
                o.cache = false;
                Rng r2(seed);
                const std::vector<index_t> b = DInference<double>(m, prompt.data(), 3, 20, o, r2);
                ASSERT_EQ(a.size(), 20u);
                EXPECT_EQ(a, b) << "seed " << seed << " tau " << tau << " sinusoidal " << sinusoidal;
            }
        }
    }
}

TEST(Inference, DInferenceTauZeroIsTheGreedyListing) {
    // line 3–6 by hand: the full forward of the whole (windowed) sequence, argmax of its last column
    ModelConfig c = small_d(9, 6);
    c.init_std = 0.5;
    DTransformer<double> m(c);
    std::vector<index_t> x = {0, 3, 5};
    SamplingOptions o;
    o.tau = 0;
    Rng rng(0);
    const std::vector<index_t> y = DInference<double>(m, x.data(), 3, 8, o, rng);
    Matrix<double> Z;
    for (index_t i = 0; i < 8; ++i) {
        const index_t len = index_t(x.size()), w0 = std::max<index_t>(0, len - c.l_max);
        m.forward(Tokens{x.data() + w0, Seqs::single(len - w0)});
        ensure(Z, c.n_vocab, len - w0);
        m.logits(view(Z));
        index_t best = 0;
        for (index_t v = 1; v < c.n_vocab; ++v)
            if (Z(v, len - w0 - 1) > Z(best, len - w0 - 1)) best = v;
        EXPECT_EQ(y[std::size_t(i)], best) << "token " << i;
        x.push_back(best);
    }
}

TEST(Inference, RejectsBadInput) {
    DTransformer<float> m(small_d());
    std::vector<index_t> x = {1, 2};
    Rng rng(0);
    SamplingOptions o;
    o.tau = -1;
    EXPECT_THROW(DInference<float>(m, x.data(), 2, 3, o, rng), ValueError);
    o = SamplingOptions();
    EXPECT_THROW(DInference<float>(m, x.data(), 2, -1, o, rng), ValueError);
    std::vector<index_t> long_prompt(13, 1);  // l_max = 12
    EXPECT_THROW(DInference<float>(m, long_prompt.data(), 13, 1, o, rng), ValueError);
    o.top_p = 0;
    EXPECT_THROW(DInference<float>(m, x.data(), 2, 3, o, rng), ValueError);
}
