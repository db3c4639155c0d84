// Algorithms 11–15 through the C++ API: DTraining drives a repeating sequence to ~0 loss with the listing's
// SGD; the masking of Algorithm 12 line 5 hits the expected fraction; the η schedule's values typed in by
// hand; sample_token at τ = 0 / top_k = 1 is the argmax; DInference's KV-cached path equals the literal one;
// data-parallel replicas (in threads, summing through shared memory) train exactly as one process.
#include "formal_transformers/inference.hpp"
#include "formal_transformers/training.hpp"
#include "testing.hpp"

#include <cmath>
#include <limits>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <tuple>

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

TEST(Training, MaxStepsWithZeroEpochsCountsTheRunInSteps) {
    // 5 sequences, B = 2: 3 steps an epoch. n_epochs = 0, max_steps = 7: 7 steps over 3 epochs, the schedule's
    // total 7; n_epochs = 1, max_steps = 7: the epoch ends it at 3; n_epochs = 0 alone: nothing to do.
    const Dataset data = cycle_data(5, 6);
    for (auto [epochs, max_steps, expected] : {std::tuple<index_t, index_t, index_t>{0, 7, 7}, {1, 7, 3}, {0, 0, 0}, {4, 7, 7}}) {
        DTransformer<double> m(small_d());
        TrainOptions o;
        o.n_epochs = epochs;
        o.max_steps = max_steps;
        o.batch_size = 2;
        index_t steps = 0, total = -1;
        DTraining<double>(m, data, o, sgd<double>(), [&](const StepInfo& s) {
            ++steps;
            total = s.total_steps;
            EXPECT_EQ(s.step, steps);
            return true;
        });
        EXPECT_EQ(steps, expected) << epochs << " epochs, max_steps " << max_steps;
        if (expected > 0) EXPECT_EQ(total, expected);
    }
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
        if (sinusoidal) c.positional = "sinusoidal";
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

// ======================================== early stopping ==============================================
namespace {
// Validation data whose loss first falls, then rises while training on cycle_data(5, ·) goes on: half the
// sequences run the cycle forwards (what is learnt), half backwards (which the learnt model gets ever more
// confidently wrong).
Dataset mixed_val(index_t l) {
    Dataset d;
    std::vector<index_t> lens;
    for (index_t phase = 0; phase < 5; ++phase) {
        for (index_t t = 0; t < l; ++t) d.ids.push_back((phase + t) % 5);
        for (index_t t = 0; t < l; ++t) d.ids.push_back((phase + 5 * l - t) % 5);
        lens.push_back(l);
        lens.push_back(l);
    }
    d.s = Seqs::from_lengths(lens);
    return d;
}

struct Recorded {
    std::vector<index_t> steps, val_steps;
    std::vector<double> val_loss;
    std::vector<std::vector<double>> theta_at_eval;  // θ at each evaluation
};

Recorded run_early(DTransformer<double>& m, const TrainOptions& o, EarlyStopState<double>* state = nullptr) {
    const Dataset data = cycle_data(5, 12), val = mixed_val(12);
    Recorded r;
    DTraining<double>(m, data, o, sgd<double>(), [&](const StepInfo& s) {
        r.steps.push_back(s.step);
        if (s.val_loss >= 0) {
            r.val_steps.push_back(s.step);
            r.val_loss.push_back(s.val_loss);
            r.theta_at_eval.emplace_back(m.store.theta(), m.store.theta() + m.store.size());
        }
        return true;
    }, &val, state);
    return r;
}

TrainOptions early_options() {
    TrainOptions o;
    o.n_epochs = 60;
    o.eta = 0.005;
    o.shuffle = false;
    o.eval_every = 5;  // once per epoch (5 sequences, batch 1)
    o.patience = 3;
    return o;
}

bool same_bits(const double* a, const std::vector<double>& b) {
    return std::equal(b.begin(), b.end(), a);
}
}  // namespace

TEST(EarlyStopping, StopsAfterPatienceEvaluationsWithoutImprovementAndRestoresTheBest) {
    for (bool restore : {false, true}) {
        DTransformer<double> m(small_d());
        TrainOptions o = early_options();
        o.restore_best = restore;
        EarlyStopState<double> st;
        const Recorded r = run_early(m, o, &st);
        // the best evaluation: the first minimum; it is neither the first nor the last evaluation
        const auto best = std::size_t(std::min_element(r.val_loss.begin(), r.val_loss.end()) - r.val_loss.begin());
        ASSERT_GT(best, 0u) << "the validation loss should first fall";
        // training stopped at exactly the `patience`-th evaluation after the best, long before its epochs end
        EXPECT_EQ(r.val_loss.size(), best + 1 + 3);
        EXPECT_EQ(r.steps.back(), r.val_steps.back());
        EXPECT_LT(r.steps.back(), o.n_epochs * 5);
        EXPECT_TRUE(st.stopped);
        EXPECT_EQ(st.best_step, r.val_steps[best]);
        EXPECT_EQ(st.best_val_loss, r.val_loss[best]);
        EXPECT_EQ(st.bad_evals, 3);
        if (restore) {  // θ is the best evaluation's, bit for bit; the last one is kept for resuming
            EXPECT_TRUE(st.restored);
            EXPECT_TRUE(same_bits(m.store.theta(), r.theta_at_eval[best]));
            EXPECT_TRUE(same_bits(st.last_theta.data(), r.theta_at_eval.back()));
        } else {
            EXPECT_FALSE(st.restored);
            EXPECT_TRUE(st.best_theta.empty() && st.last_theta.empty());
            EXPECT_TRUE(same_bits(m.store.theta(), r.theta_at_eval.back()));
        }
    }
}

TEST(EarlyStopping, ARunThatKeepsImprovingIsUnaffected) {
    // validation data = the training data: its loss falls at every evaluation
    const Dataset data = cycle_data(5, 12);
    DTransformer<double> a(small_d()), b(small_d());
    TrainOptions o = early_options();
    o.n_epochs = 8;
    o.eta = 0.05;
    std::vector<double> vl;
    EarlyStopState<double> st;
    DTraining<double>(a, data, o, sgd<double>(), [&](const StepInfo& s) {
        if (s.val_loss >= 0) vl.push_back(s.val_loss);
        return true;
    }, &data, &st);
    ASSERT_EQ(vl.size(), 8u);
    for (std::size_t i = 1; i < vl.size(); ++i) ASSERT_LT(vl[i], vl[i - 1]);
    EXPECT_FALSE(st.stopped);
    EXPECT_EQ(st.best_step, 40);
    o.patience = 0;
    DTraining<double>(b, data, o, sgd<double>(), {}, &data);
    EXPECT_TRUE(std::equal(a.store.theta(), a.store.theta() + a.store.size(), b.store.theta()));
}

TEST(EarlyStopping, AResumedRunStopsWhereOneRunStops) {
    TrainOptions o = early_options();
    o.restore_best = true;
    DTransformer<double> one(small_d()), split(small_d());
    EarlyStopState<double> s1;
    const Recorded r = run_early(one, o, &s1);
    ASSERT_TRUE(s1.stopped);
    // first part: up to an epoch's end before the stop, past the best; then the rest with the state
    const index_t cut = r.steps.back() - 5;
    TrainOptions o1 = o;
    o1.max_steps = cut;
    EarlyStopState<double> s2;
    run_early(split, o1, &s2);
    ASSERT_FALSE(s2.stopped);
    ASSERT_TRUE(s2.restored);  // the first part ended normally: restored; resuming continues from its last θ
    std::copy(s2.last_theta.begin(), s2.last_theta.end(), split.store.theta());
    TrainOptions o2 = o;
    o2.start_step = cut;
    const Recorded r2 = run_early(split, o2, &s2);
    EXPECT_TRUE(s2.stopped);
    EXPECT_EQ(cut + r2.steps.back(), r.steps.back());
    EXPECT_EQ(s2.best_step, s1.best_step);
    EXPECT_EQ(s2.best_val_loss, s1.best_val_loss);
    EXPECT_TRUE(std::equal(one.store.theta(), one.store.theta() + one.store.size(), split.store.theta()));
}

TEST(EarlyStopping, RejectsBadOptionsAndMissingValidationData) {
    TrainOptions o;
    o.patience = -1;
    EXPECT_THROW(o.check(), ValueError);
    o = TrainOptions();
    o.min_delta = -0.1;
    EXPECT_THROW(o.check(), ValueError);
    const Dataset data = cycle_data(5, 12);
    for (int which = 0; which < 2; ++which) {
        o = TrainOptions();
        if (which) o.restore_best = true;
        else o.patience = 1;
        DTransformer<double> m(small_d()), fresh(small_d());
        EXPECT_THROW(DTraining<double>(m, data, o, sgd<double>(), {}), ValueError);
        EXPECT_TRUE(std::equal(m.store.theta(), m.store.theta() + m.store.size(), fresh.store.theta()));
    }
    // a state whose best parameters do not fit the model
    o = TrainOptions();
    o.restore_best = true;
    EarlyStopState<double> st;
    st.best_theta.assign(3, 0.0);
    st.best_step = 1;
    DTransformer<double> m(small_d());
    EXPECT_THROW(DTraining<double>(m, data, o, sgd<double>(), {}, &data, &st), ValueError);
}

// ---------------------------------------------------------------------------------------------------
// Data parallelism (training.hpp, Replicas; docs/data_parallel.md) without a network: W replicas of one model
// trained in W threads, their `sum` through shared memory (every rank adds the ranks' buffers in rank order,
// so all end with the same bits, as an all-reduce leaves them). Each replica's run must equal one process's.
namespace {
class ThreadSum {
public:
    explicit ThreadSum(index_t world) : world_(world), g_(std::size_t(world)), v_(std::size_t(world)) {}
    template <class T>
    void sum(index_t rank, T* g, index_t n, double* v, index_t k) {
        g_[std::size_t(rank)] = g;  // publish this rank's buffers
        v_[std::size_t(rank)] = v;
        wait();
        std::vector<T> gs(std::size_t(n), T(0));
        std::vector<double> vs(std::size_t(k), 0.0);
        for (index_t r = 0; r < world_; ++r) {
            const T* gr = static_cast<const T*>(g_[std::size_t(r)]);
            for (index_t i = 0; i < n; ++i) gs[std::size_t(i)] += gr[i];
            for (index_t i = 0; i < k; ++i) vs[std::size_t(i)] += v_[std::size_t(r)][i];
        }
        wait();  // everyone has read every buffer
        std::copy(gs.begin(), gs.end(), g);
        std::copy(vs.begin(), vs.end(), v);
    }

private:
    void wait() {  // a barrier of the W threads
        std::unique_lock<std::mutex> l(mu_);
        const index_t gen = generation_;
        if (++arrived_ == world_) {
            arrived_ = 0;
            ++generation_;
            cv_.notify_all();
        } else {
            cv_.wait(l, [&] { return generation_ != gen; });
        }
    }
    index_t world_, arrived_ = 0, generation_ = 0;
    std::mutex mu_;
    std::condition_variable cv_;
    std::vector<const void*> g_;
    std::vector<double*> v_;
};

// 7 sequences of uneven lengths over 5 ids; validation: 9 more
Dataset uneven_data(index_t n, std::uint64_t seed) {
    Rng rng(seed);
    Dataset d;
    std::vector<index_t> lens;
    for (index_t k = 0; k < n; ++k) {
        const index_t l = 3 + index_t(rng.below(8));
        for (index_t t = 0; t < l; ++t) d.ids.push_back(index_t(rng.below(5)));
        lens.push_back(l);
    }
    d.s = Seqs::from_lengths(lens);
    return d;
}

struct RunFigures {
    std::vector<double> theta, loss, val_loss;
    std::vector<index_t> tokens;
};

// One run of `Model` by `train` (DTraining or ETraining): alone (world 0) or as rank r of `world` threads.
template <class Model, class Train>
std::vector<RunFigures> run_replicas(index_t world, const TrainOptions& o, Train train) {
    const Dataset data = uneven_data(7, 1), val = uneven_data(9, 2);
    const index_t W = std::max<index_t>(world, 1);
    std::vector<RunFigures> out(static_cast<std::size_t>(W));
    ThreadSum ts(W);
    auto one = [&](index_t rank) {
        ModelConfig c = small_d(11, 12);
        if constexpr (std::is_same_v<Model, ETransformer<double>>) c.d_f = 6;
        Model m(c);
        RunFigures& f = out[std::size_t(rank)];
        Replicas<double> dp;
        dp.rank = rank;
        dp.world = W;
        dp.sum = [&ts, rank](double* g, index_t n, double* v, index_t k) { ts.sum(rank, g, n, v, k); };
        train(m, data, o, sgd<double>(), [&](const StepInfo& s) {
            f.loss.push_back(s.loss);
            f.tokens.push_back(s.tokens);
            if (s.val_loss >= 0) f.val_loss.push_back(s.val_loss);
            return true;
        }, &val, nullptr, world > 0 ? &dp : nullptr);
        f.theta.assign(m.store.theta(), m.store.theta() + m.store.size());
    };
    std::vector<std::thread> threads;
    for (index_t r = 1; r < W; ++r) threads.emplace_back(one, r);
    one(0);
    for (auto& t : threads) t.join();
    return out;
}

template <class Model, class Train>
void expect_replicas_equal_one_process(Train train) {
    for (auto red : {TrainOptions::Reduction::Sum, TrainOptions::Reduction::Mean}) {
        for (index_t B : {5, 2}) {  // 7 = 5 + 2: uneven slices, and with B = 2 over 3 ranks an empty one
            TrainOptions o;
            o.n_epochs = 2;
            o.eta = 0.05;
            o.batch_size = B;
            o.reduction = red;
            o.eval_every = 2;
            o.seed = 4;
            o.p_mask = 0.3;
            const RunFigures one = run_replicas<Model>(0, o, train)[0];
            for (index_t world : {2, 3}) {
                const std::vector<RunFigures> ranks = run_replicas<Model>(world, o, train);
                for (const RunFigures& f : ranks) {
                    EXPECT_EQ(f.theta, ranks[0].theta);  // bit for bit on every rank
                    EXPECT_EQ(f.tokens, one.tokens);
                    ASSERT_EQ(f.loss.size(), one.loss.size());
                    ASSERT_EQ(f.val_loss.size(), one.val_loss.size());
                    for (std::size_t i = 0; i < f.loss.size(); ++i) EXPECT_NEAR(f.loss[i], one.loss[i], 1e-12 * one.loss[i]);
                    for (std::size_t i = 0; i < f.val_loss.size(); ++i)
                        EXPECT_NEAR(f.val_loss[i], one.val_loss[i], 1e-12 * one.val_loss[i]);
                }
                EXPECT_LT(fttest::rel_error(ranks[0].theta.data(), one.theta.data(), one.theta.size()), 1e-12)
                    << "world " << world << ", B " << B;
            }
        }
    }
}
}  // namespace

TEST(DataParallel, ShardBeginGivesContiguousSlicesTheFirstRanksOneMore) {
    EXPECT_EQ(shard_begin(7, 0, 3), 0);
    EXPECT_EQ(shard_begin(7, 1, 3), 3);  // 3, 2, 2
    EXPECT_EQ(shard_begin(7, 2, 3), 5);
    EXPECT_EQ(shard_begin(7, 3, 3), 7);
    EXPECT_EQ(shard_begin(2, 2, 3), 2);  // 1, 1, 0: the last rank's slice is empty
    EXPECT_EQ(shard_begin(2, 3, 3), 2);
    EXPECT_EQ(shard_begin(5, 1, 1), 5);
}

TEST(DataParallel, DTrainingReplicasEqualOneProcess) {
    expect_replicas_equal_one_process<DTransformer<double>>([](auto&&... a) { DTraining<double>(a...); });
}

TEST(DataParallel, ETrainingReplicasEqualOneProcess) {
    expect_replicas_equal_one_process<ETransformer<double>>([](auto&&... a) { ETraining<double>(a...); });
}

TEST(DataParallel, RejectsABadWorld) {
    DTransformer<double> m(small_d());
    const Dataset data = cycle_data(5, 7);
    TrainOptions o;
    Replicas<double> dp;
    dp.world = 0;
    EXPECT_THROW(DTraining<double>(m, data, o, sgd<double>(), {}, nullptr, nullptr, &dp), ValueError);
    dp.world = 2;
    dp.rank = 2;
    EXPECT_THROW(DTraining<double>(m, data, o, sgd<double>(), {}, nullptr, nullptr, &dp), ValueError);
    dp.rank = 1;  // no sum
    EXPECT_THROW(DTraining<double>(m, data, o, sgd<double>(), {}, nullptr, nullptr, &dp), ValueError);
}

// The dropout counter ends at the steps done however training ends: a step refused as non-finite (its
// loss_and_grad ran and drew masks) does not count, so a run resumed from there draws the masks of one
// unbroken run; a whole run advances it by its steps.
TEST(Training, DropoutCounterEndsAtTheStepsDone) {
    ModelConfig c = small_d();
    c.resid_dropout = 0.1;
    DTransformer<double> m(c);
    const Dataset data = cycle_data(5, 12);
    TrainOptions o;
    o.eta = 0.01;
    o.shuffle = false;
    m.dropout_step = 7;
    DTraining<double>(m, data, o, sgd<double>(), {});
    EXPECT_EQ(m.dropout_step, 7u + 5u);
    // θ made NaN after step 2: step 3's loss is not finite and training stops before its update
    EXPECT_THROW(DTraining<double>(m, data, o, sgd<double>(), [&](const StepInfo& s) {
                     if (s.step == 2) m.store.theta()[0] = std::numeric_limits<double>::quiet_NaN();
                     return true;
                 }),
                 NonFiniteError);
    EXPECT_EQ(m.dropout_step, 12u + 2u);
}
