// Algorithms 11, 12, 13: the listings' loops, one shared skeleton (lines 1, 2, 6) and one body (lines 3–5)
// per listing.
#include "formal_transformers/training.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "formal_transformers/sizes.hpp"

namespace ft {

double reduce_loss(double loss_sum, index_t scored, TrainOptions::Reduction r) {
    if (r == TrainOptions::Reduction::Sum) return loss_sum;
    return scored > 0 ? loss_sum / double(scored) : 0.0;
}

void check_optimizer_lr(double optimizer_lr, const TrainOptions& o) {
    if (optimizer_lr != o.eta)
        throw ValueError("the optimizer's lr = " + std::to_string(optimizer_lr) + " but the trainer's eta = " +
                         std::to_string(o.eta) + ": the trainer sets each step's rate from eta (its schedule's peak), "
                         "so give them the same value (Python: leave eta out to use the optimizer's lr)");
}

template <class T>
void Replicas<T>::check() const {
    if (world < 1) throw ValueError("data parallel: world size must be >= 1, got " + std::to_string(world));
    if (rank < 0 || rank >= world)
        throw ValueError("data parallel: rank must be in [0, " + std::to_string(world) + "), got " + std::to_string(rank));
    if (world > 1 && !sum) throw ValueError("data parallel: a world of " + std::to_string(world) + " ranks needs a sum");
}
template struct Replicas<float>;
template struct Replicas<double>;

double learning_rate(const TrainOptions& o, index_t step, index_t total) {
    if (o.warmup > 0 && step <= o.warmup) return o.eta * double(step) / double(o.warmup);  // linear warm-up
    if (o.schedule == TrainOptions::Schedule::Constant) return o.eta;
    const double span = double(std::max<index_t>(1, total - o.warmup));
    const double progress = std::min(1.0, std::max(0.0, double(step - o.warmup) / span));
    if (o.schedule == TrainOptions::Schedule::Cosine)
        return o.min_lr + 0.5 * (o.eta - o.min_lr) * (1.0 + std::cos(M_PI * progress));
    return o.eta + (o.min_lr - o.eta) * progress;  // linear
}

void mask_tokens(const index_t* x, index_t n, index_t mask_token, double p_mask, Rng& rng, index_t* x_tilde) {
    for (index_t t = 0; t < n; ++t)  // line 5: mask_token or x_n[t] with probability p_mask or 1 − p_mask
        x_tilde[t] = rng.uniform() < p_mask ? mask_token : x[t];
}

void draw_masks(const Dataset& data, const std::vector<index_t>& batch, index_t mask_token, double p_mask, Rng& rng,
                std::vector<index_t>& x, std::vector<index_t>& x_tilde) {
    x.clear();
    for (index_t n : batch)  // line 3 for the minibatch
        x.insert(x.end(), data.ids.begin() + data.s.begin(n), data.ids.begin() + data.s.begin(n) + data.s.len(n));
    x_tilde.resize(x.size());
    mask_tokens(x.data(), index_t(x.size()), mask_token, p_mask, rng, x_tilde.data());  // lines 4–6
}

StepPlan::StepPlan(const TrainOptions& o, index_t N_data) : o_(o), N_(N_data), rng_(o.seed) {
    if (N_ <= 0) throw ValueError("x_data is empty: nothing to train on");
    const index_t per_epoch = (N_ + o.batch_size - 1) / o.batch_size;
    // n_epochs = 0 with max_steps > 0: as many epochs as max_steps needs (a run counted in steps)
    epochs_ = o.n_epochs == 0 && o.max_steps > 0 ? (o.max_steps + per_epoch - 1) / per_epoch : o.n_epochs;
    total_ = checked_mul(epochs_, per_epoch, "the number of training steps (n_epochs x steps per epoch)");
    if (o.max_steps > 0) total_ = std::min(total_, o.max_steps);
    order_.resize(std::size_t(N_));
    std::iota(order_.begin(), order_.end(), index_t(0));
    k_ = N_;
}

std::vector<PlannedStep> plan_run(const TrainOptions& o, const Dataset& data, index_t mask_token) {
    o.check();
    StepPlan plan(o, data.size());
    std::vector<PlannedStep> steps;
    std::vector<index_t> x;
    while (plan.next()) {
        poll();
        PlannedStep p;
        p.step = plan.step();
        p.epoch = plan.epoch();
        p.batch = plan.batch();
        p.lr = plan.lr();
        if (mask_token >= 0) draw_masks(data, p.batch, mask_token, o.p_mask, plan.rng(), x, p.x_tilde);
        steps.push_back(std::move(p));
    }
    return steps;
}

bool StepPlan::next() {
    if (step_ >= total_) return false;
    if (k_ >= N_) {  // line 1: the next epoch, in a fresh order
        if (++epoch_ >= epochs_) return false;
        if (o_.shuffle)
            for (index_t k = N_ - 1; k > 0; --k) std::swap(order_[std::size_t(k)], order_[std::size_t(rng_.below(std::uint64_t(k + 1)))]);
        k_ = 0;
    }
    batch_.assign(order_.begin() + k_, order_.begin() + std::min(N_, k_ + o_.batch_size));  // line 2, B at a time
    k_ += o_.batch_size;
    ++step_;
    return true;
}

namespace {
// The gathered minibatch: ids of the chosen sequences, concatenated.
struct Batch {
    std::vector<index_t> ids, lens, prefix;
    void clear() {
        ids.clear();
        lens.clear();
        prefix.clear();
    }
    void add(const Dataset& d, index_t n) {
        ids.insert(ids.end(), d.ids.begin() + d.s.begin(n), d.ids.begin() + d.s.begin(n) + d.s.len(n));
        lens.push_back(d.s.len(n));
        if (!d.prefix.empty()) prefix.push_back(d.prefix[std::size_t(n)]);  // V7
    }
    Tokens tokens(Seqs& s) const {
        s = Seqs::from_lengths(lens);
        return Tokens{ids.data(), s, prefix.empty() ? nullptr : prefix.data()};
    }
};
// the predictions Algorithm 13's line 5 scores in sequence n (V7: those after its prefix)
index_t scored_in(const Dataset& d, index_t n) {
    const index_t p = d.prefix.empty() ? 0 : d.prefix[std::size_t(n)];
    return std::max<index_t>(0, d.s.len(n) - std::max<index_t>(p, 1));
}
// a data set's prefix lengths: one per sequence, each checked as a call's prefix_len
void check_prefix(const Dataset& d, const ModelConfig& c, const char* what) {
    if (d.prefix.empty()) return;
    if (index_t(d.prefix.size()) != d.size())
        throw ValueError(std::string("prefix_len of ") + what + ": " + std::to_string(d.prefix.size()) +
                         " lengths for " + std::to_string(d.size()) + " sequences (one per sequence)");
    validate(Tokens{d.ids.data(), d.s, d.prefix.data()}, c, what);
}

void check_dataset(const Dataset& d, const char* what) {
    if (d.size() == 0) throw ValueError(std::string(what) + " is empty: nothing to train on");
}

// Algorithms 12 and 13 before their first step: the options, the replicas, and x_data and the validation data
// (not empty; ids in [N_V]; lengths ≤ ℓ_max; prefix lengths, one per sequence, that the model allows).
template <class T>
void check_single_input(const TrainOptions& o, const Replicas<T>* dp, const Dataset& data, const Dataset* val,
                        const ModelConfig& c) {
    o.check();
    if (dp) dp->check();
    check_dataset(data, "x_data");
    validate(Tokens{data.ids.data(), data.s}, c.n_vocab, c.l_max, "x_data");
    if (val) validate(Tokens{val->ids.data(), val->s}, c.n_vocab, c.l_max, "validation data");
    check_prefix(data, c, "x_data");
    if (val) check_prefix(*val, c, "validation data");
}

// Early stopping (the listing in training.hpp) around the loop below: checks before any update, lines
// 3–10 after each evaluation, line 13 at a normal end.
template <class T>
class EarlyStopping {
public:
    EarlyStopping(const TrainOptions& o, ParamStore<T>& store, EarlyStopState<T>* state, bool has_val)
        : o_(o), store_(store), s_(state ? *state : local_) {
        if ((o.patience > 0 || o.restore_best) && !has_val)
            throw ValueError(std::string(o.patience > 0 ? "patience" : "restore_best") +
                             " needs validation data (early stopping watches the validation loss)");
        const std::size_t n = std::size_t(store.size());
        if (!s_.best_theta.empty() && s_.best_theta.size() != n)
            throw ValueError("the early-stopping state's best parameters have " + std::to_string(s_.best_theta.size()) +
                             " values, the model has " + std::to_string(n));
        if (s_.bad_evals < 0) throw ValueError("the early-stopping state's bad_evals must be >= 0");
        if (o.restore_best && has_best() && s_.best_theta.empty())
            throw ValueError("restore_best: the early-stopping state has a best evaluation (step " +
                             std::to_string(s_.best_step) + ") but not its parameters (kept only with restore_best)");
        s_.stopped = s_.restored = false;
        s_.last_theta.clear();
        if (o.restore_best)  // θ*: sized once per run
            s_.best_theta.resize(std::size_t(check_bytes(store.size(), sizeof(T), "the best parameters (restore_best)")));
    }
    // After an evaluation of θ at `step` (start_step-based): lines 4–9; true: stop (line 9).
    bool evaluated(double val_loss, index_t step) {
        if (val_loss < s_.best_val_loss - o_.min_delta) {  // ES line 4
            s_.best_val_loss = val_loss;                   // ES line 5
            s_.best_step = step;
            s_.bad_evals = 0;
            if (o_.restore_best) std::copy(store_.theta(), store_.theta() + store_.size(), s_.best_theta.begin());  // ES line 6
            theta_is_best_ = true;
            return false;
        }
        ++s_.bad_evals;                                                       // ES line 8
        s_.stopped = o_.patience > 0 && s_.bad_evals >= o_.patience;          // ES line 9
        return s_.stopped;
    }
    void updated() { theta_is_best_ = false; }
    // ES line 13, at a normal end
    void finish() {
        if (!o_.restore_best || !has_best() || theta_is_best_) return;
        s_.last_theta.resize(std::size_t(check_bytes(store_.size(), sizeof(T), "the last parameters (restore_best)")));
        std::copy(store_.theta(), store_.theta() + store_.size(), s_.last_theta.begin());
        std::copy(s_.best_theta.begin(), s_.best_theta.end(), store_.theta());
        s_.restored = true;
    }

private:
    bool has_best() const { return s_.best_val_loss < std::numeric_limits<double>::infinity(); }
    const TrainOptions& o_;
    ParamStore<T>& store_;
    EarlyStopState<T> local_;
    EarlyStopState<T>& s_;
    bool theta_is_best_ = false;  // no update since θ* was taken
};

// Lines 1, 2 and 6 of Algorithms 11–13. `body(batch indices, lo, hi, rng) -> {loss, scored}` runs lines 3–5
// for the minibatch's items [lo, hi) (all of it in one process; this rank's slice with replicas), leaving
// ∇(Σ_n loss_n) over them in store.grad() and returning their loss and the whole minibatch's scored count;
// `evaluate(info)` fills the validation figures.
// The model's dropout counter (transformers.hpp): step s of the plan draws its masks at d0 + s − 1 (each step's
// loss_and_grad advances it by one), and however training ends the counter is left at d0 + the steps done, a
// step cut short (Ctrl-C, a non-finite step refused) not counted: a run resumed from there draws the masks of
// one unbroken run.
struct DropoutCounter {
    std::uint64_t& counter;
    const std::uint64_t d0 = counter;
    index_t done = 0;
    ~DropoutCounter() { counter = d0 + std::uint64_t(done); }
};

template <class T, class Update, class Body, class Eval>
void train_loop(ParamStore<T>& store, std::uint64_t& dropout_step, index_t N_data, const TrainOptions& o,
                const Update& update, const StepHook& hook, Body&& body, Eval&& evaluate, bool has_val,
                EarlyStopState<T>* state, const Replicas<T>* dp) {
    // trainable= (checked before anything changes): the others frozen for this run, however it ends
    struct TrainOnly {
        ParamStore<T>& s;
        ~TrainOnly() { s.clear_train_only(); }
    };
    const std::vector<bool> train = resolve_trainable(o, store);
    EarlyStopping<T> early(o, store, state, has_val);
    TrainOnly train_only{store};
    if (!o.trainable.empty()) store.train_only(train);
    const index_t rank = dp ? dp->rank : 0, world = dp ? dp->world : 1;
    StepPlan plan(o, N_data);
    DropoutCounter dropout{dropout_step};
    const index_t total = plan.total();
    while (plan.next()) {  // lines 1–2: for i ∈ [N_epochs], for n ∈ [N_data], B at a time (the same on every rank)
        poll();
        const std::vector<index_t>& batch = plan.batch();
        const index_t nb = index_t(batch.size()), step = plan.step();
        std::pair<double, index_t> ls =
            body(batch, shard_begin(nb, rank, world), shard_begin(nb, rank + 1, world), plan.rng());  // lines 3–5 (+ ∇)
        if (world > 1) dp->sum(store.grad(), store.size(), &ls.first, 1);  // Σ over the ranks: the whole minibatch's
        // the step's objective: mean over the batch of the listing's loss, or mean per scored token
        T* g = store.grad();
        const double s = o.reduction == TrainOptions::Reduction::Sum ? 1.0 / double(batch.size())
                                                                     : (ls.second > 0 ? 1.0 / double(ls.second) : 0.0);
        scale<T>(g, store.size(), T(s));
        StepInfo info;
        info.step = step;
        info.epoch = plan.epoch();
        info.total_steps = total;
        info.grad_norm = grad_norm(store, g);
        info.lr = plan.lr();
        info.loss = ls.second > 0 ? ls.first / double(ls.second) : 0.0;
        // never apply a non-finite update: the loss and ‖∇‖ must be finite, and so must the updated θ (the
        // optimizer's own all-or-nothing check, optim.hpp)
        const bool finite = std::isfinite(ls.first) && std::isfinite(info.grad_norm);
        auto refuse = [&](const std::string& why) {
            if (o.nonfinite == TrainOptions::NonFinite::Raise)
                throw NonFiniteError(
                    "training step " + std::to_string(o.start_step + step) + ": the loss is " +
                    std::to_string(info.loss) + " and the gradient norm " + std::to_string(info.grad_norm) + " (" +
                    why + "; η = " + std::to_string(info.lr) + " may be too large: lower eta, or set clip). "
                    "No update was applied: the model holds its parameters after step " +
                    std::to_string(o.start_step + step - 1) + " (its grads hold this step's gradient). "
                    "nonfinite='skip' or 'warn' skips such steps instead.");
            info.skipped = true;
        };
        if (!finite) {
            refuse("not finite");
        } else {
            if (o.clip > 0 && info.grad_norm > o.clip) scale<T>(g, store.size(), T(o.clip / info.grad_norm));
            try {
                update(store, g, info.lr);  // line 6: θ ← θ − η·∇loss(θ)  (or Adam)
                early.updated();
            } catch (const NonFiniteUpdate&) {  // SGD and Adam: all or nothing, θ unchanged (optim.hpp)
                refuse("the optimizer's update would make θ non-finite");
            }
        }
        info.tokens = ls.second;
        bool stop = false;
        if (has_val && ((o.eval_every > 0 && step % o.eval_every == 0) || step == total)) {  // ES line 2
            try {
                evaluate(info);  // ES line 3
            } catch (...) {  // Ctrl-C (however the poll hook signals it): θ already holds this step, record it
                info.val_loss = info.val_accuracy = -1;
                info.interrupted = true;
                dropout.done = step;
                if (hook) hook(info);
                throw;
            }
            stop = early.evaluated(info.val_loss, o.start_step + step);  // ES lines 4–10
        }
        dropout.done = step;  // the step is done (recorded by the hook)
        if ((hook && !hook(info)) || stop) {
            early.finish();
            return;
        }
    }
    early.finish();  // ES line 13
}

// Validation in minibatches: mean loss per scored token and argmax accuracy. `chunk(k0, k1, sc, co, mine)`
// scores items [k0, k1) when `mine` (with replicas: chunk c belongs to rank c mod world, and the ranks'
// sums are added up; a chunk that is not this rank's only advances what it draws, e.g. ETraining's masks).
template <class T, class F>
void evaluate_chunks(index_t N, index_t B, StepInfo& info, const Replicas<T>* dp, F&& chunk) {
    const index_t rank = dp ? dp->rank : 0, world = dp ? dp->world : 1;
    double loss = 0;
    index_t scored = 0, correct = 0;
    for (index_t k = 0, c = 0; k < N; k += B, ++c) {
        poll();
        index_t sc = 0, co = 0;
        loss += chunk(k, std::min(N, k + B), sc, co, c % world == rank);
        scored += sc;
        correct += co;
    }
    if (world > 1) {
        double v[3] = {loss, double(scored), double(correct)};
        dp->sum(nullptr, 0, v, 3);
        loss = v[0];
        scored = index_t(v[1]);
        correct = index_t(v[2]);
    }
    info.val_loss = scored > 0 ? loss / double(scored) : 0.0;
    info.val_accuracy = scored > 0 ? double(correct) / double(scored) : 0.0;
}

// A rank whose slice of the minibatch is empty (fewer sequences than ranks): no loss, a zero gradient, and
// the dropout counter advanced as a loss_and_grad would, so that every rank's model stays the same.
template <class M>
std::pair<double, index_t> empty_slice(M& model, index_t scored) {
    model.store.zero_grad();
    ++model.dropout_step;
    return {0.0, scored};
}
}  // namespace

// ======================================== Algorithm 13 ================================================
template <class T, class Update>
void DTraining(DTransformer<T>& model, const Dataset& data, const TrainOptions& o, const Update& update,
               const StepHook& hook, const Dataset* val, EarlyStopState<T>* early, const Replicas<T>* dp) {
    const ModelConfig& c = model.cfg;
    check_single_input(o, dp, data, val, c);
    Batch b;
    Seqs s;
    auto body = [&](const std::vector<index_t>& batch, index_t lo, index_t hi, Rng&) {
        b.clear();
        index_t scored = 0;
        for (index_t i = 0; i < index_t(batch.size()); ++i) {
            const index_t n = batch[std::size_t(i)];
            if (i >= lo && i < hi) b.add(data, n);  // line 3: ℓ ← length(x_n)
            scored += scored_in(data, n);
        }
        if (lo == hi) return empty_slice(model, scored);
        const double loss = model.loss_and_grad(b.tokens(s));  // lines 4–5 and ∇loss
        return std::make_pair(loss, scored);
    };
    auto evaluate = [&](StepInfo& info) {
        evaluate_chunks(val->size(), std::max<index_t>(o.batch_size, 8), info, dp,
                        [&](index_t k0, index_t k1, index_t& sc, index_t& co, bool mine) {
            if (!mine) return 0.0;
            b.clear();
            for (index_t n = k0; n < k1; ++n) b.add(*val, n);
            return model.loss(b.tokens(s), &sc, &co);
        });
    };
    train_loop(model.store, model.dropout_step, data.size(), o, update, hook, body, evaluate, val != nullptr && val->size() > 0, early, dp);
}

// ======================================== Algorithm 12 ================================================
template <class T, class Update>
void ETraining(ETransformer<T>& model, const Dataset& data, const TrainOptions& o, const Update& update,
               const StepHook& hook, const Dataset* val, EarlyStopState<T>* early, const Replicas<T>* dp) {
    const ModelConfig& c = model.cfg;
    check_single_input(o, dp, data, val, c);  // (no prefix lengths: an ETransformer has no prefix mask)
    Batch b;
    Seqs s;
    std::vector<index_t> x_tilde, lens;
    std::vector<index_t> x;
    if (!data.tilde.empty()) {  // fixed masks: x̃ laid out as x_data, its ids in [0, N_V)
        if (data.tilde.size() != data.ids.size())
            throw ValueError("x_tilde must hold one masked sequence per sequence of x_data, of the same lengths");
        validate(Tokens{data.tilde.data(), data.s}, c.n_vocab, c.l_max, "x_tilde");
    }
    auto body = [&](const std::vector<index_t>& batch, index_t lo, index_t hi, Rng& rng) {
        // lines 3–6 for the whole minibatch on every rank: the generator stays in step, the masks are one process's
        if (data.tilde.empty()) {
            draw_masks(data, batch, c.mask_token(), o.p_mask, rng, x, x_tilde);
        } else {  // the given x̃ (fixed masks)
            x.clear();
            x_tilde.clear();
            for (index_t n : batch) {
                x.insert(x.end(), data.ids.begin() + data.s.begin(n), data.ids.begin() + data.s.begin(n) + data.s.len(n));
                x_tilde.insert(x_tilde.end(), data.tilde.begin() + data.s.begin(n),
                               data.tilde.begin() + data.s.begin(n) + data.s.len(n));
            }
        }
        index_t scored = 0;                      // line 7: |T̃|
        for (index_t v : x_tilde) scored += v == c.mask_token();
        if (lo == hi) return empty_slice(model, scored);
        index_t t0 = 0;  // the slice's first token
        lens.clear();
        for (index_t i = 0; i < hi; ++i) {
            const index_t len = data.s.len(batch[std::size_t(i)]);
            if (i < lo) t0 += len;
            else lens.push_back(len);
        }
        s = Seqs::from_lengths(lens);
        const double loss = model.loss_and_grad(Tokens{x_tilde.data() + t0, s}, x.data() + t0);  // lines 8–9 and ∇loss
        return std::make_pair(loss, scored);
    };
    auto evaluate = [&](StepInfo& info) {
        Rng vrng(o.seed ^ 0x5eedF00dULL);  // the same masks at every evaluation
        evaluate_chunks(val->size(), std::max<index_t>(o.batch_size, 8), info, dp,
                        [&](index_t k0, index_t k1, index_t& sc, index_t& co, bool mine) {
            b.clear();
            for (index_t n = k0; n < k1; ++n) b.add(*val, n);
            x_tilde.resize(b.ids.size());
            mask_tokens(b.ids.data(), index_t(b.ids.size()), c.mask_token(), o.p_mask, vrng, x_tilde.data());
            if (!mine) return 0.0;
            s = Seqs::from_lengths(b.lens);
            return model.loss(Tokens{x_tilde.data(), s}, b.ids.data(), &sc, &co);
        });
    };
    train_loop(model.store, model.dropout_step, data.size(), o, update, hook, body, evaluate, val != nullptr && val->size() > 0, early, dp);
}

// ======================================== Algorithm 11 ================================================
template <class T, class Update>
void EDTraining(EDTransformer<T>& model, const Dataset& z_data, const Dataset& x_data, const TrainOptions& o,
                const Update& update, const StepHook& hook, const Dataset* z_val, const Dataset* x_val,
                EarlyStopState<T>* early, const Replicas<T>* dp) {
    o.check();
    if (dp) dp->check();
    check_dataset(x_data, "x_data");
    if (z_data.size() != x_data.size())
        throw ValueError("z_data and x_data must have the same length (pairs), got " + std::to_string(z_data.size()) +
                         " and " + std::to_string(x_data.size()));
    if ((z_val == nullptr) != (x_val == nullptr) || (z_val && z_val->size() != x_val->size()))
        throw ValueError("validation data must be pairs (z, x) of the same length");
    const ModelConfig& c = model.cfg;
    // the context: token ids, or the features the encoder's part takes (the audio encoder, V28: spectrograms)
    const bool audio = model.audio();
    for (const Dataset* z : {&z_data, z_val})
        if (z && (z->feature_rows > 0) != audio)
            throw TypeError(audio ? "this EDTransformer's encoder takes " + model.encoder_input().what +
                                        ": z_data must be such features, not token ids"
                                  : std::string("this EDTransformer's encoder takes token ids: z_data must be token "
                                                "sequences, not features (its embedding is 'tokens': no audio encoder)"));
    if (!audio) validate(Tokens{z_data.ids.data(), z_data.s}, c.n_vocab, c.l_max, "z_data");
    validate(Tokens{x_data.ids.data(), x_data.s}, c.n_vocab, c.l_max, "x_data");
    if (z_val) {  // checked now, as the training data, not at the first evaluation
        if (!audio) validate(Tokens{z_val->ids.data(), z_val->s}, c.n_vocab, c.l_max, "validation z");
        validate(Tokens{x_val->ids.data(), x_val->s}, c.n_vocab, c.l_max, "validation x");
    }
    Batch bz, bx;
    Seqs sz, sx;
    // the features of the sequences taken (audio): F [rows, Σ T_n] in the model's dtype
    Matrix<T> Fb;
    std::vector<index_t> frames;
    auto spectrograms = [&](const Dataset& d, const std::vector<index_t>& ns) {
        frames.clear();
        index_t total = 0;
        for (index_t n : ns) total += d.s.len(n), frames.push_back(d.s.len(n));
        const index_t rows = d.feature_rows;
        MatView<T> F = ensure(Fb, rows, total);
        index_t j = 0;
        for (index_t n : ns)
            for (index_t t = 0; t < d.s.len(n); ++t, ++j) {
                const double* src = d.features.data() + (d.s.begin(n) + t) * rows;
                T* dst = F.col(j);
                for (index_t m = 0; m < rows; ++m) dst[m] = T(src[m]);
            }
        return Features<T>{view(Fb), Seqs::from_lengths(frames)};
    };
    std::vector<index_t> taken;
    auto body = [&](const std::vector<index_t>& batch, index_t lo, index_t hi, Rng&) {
        bz.clear();
        bx.clear();
        index_t scored = 0;
        for (index_t i = 0; i < index_t(batch.size()); ++i) {
            const index_t n = batch[std::size_t(i)];
            if (i >= lo && i < hi) {
                if (!audio) bz.add(z_data, n);
                bx.add(x_data, n);  // line 3: ℓ ← length(x_n)
            }
            scored += std::max<index_t>(0, x_data.s.len(n) - 1);
        }
        if (lo == hi) return empty_slice(model, scored);
        if (audio) {
            taken.assign(batch.begin() + lo, batch.begin() + hi);
            const double loss = model.loss_and_grad(spectrograms(z_data, taken), bx.tokens(sx));  // lines 4–5 and ∇loss
            return std::make_pair(loss, scored);
        }
        const double loss = model.loss_and_grad(bz.tokens(sz), bx.tokens(sx));  // lines 4–5 and ∇loss
        return std::make_pair(loss, scored);
    };
    auto evaluate = [&](StepInfo& info) {
        evaluate_chunks(x_val->size(), std::max<index_t>(o.batch_size, 8), info, dp,
                        [&](index_t k0, index_t k1, index_t& sc, index_t& co, bool mine) {
            if (!mine) return 0.0;
            bz.clear();
            bx.clear();
            taken.clear();
            for (index_t n = k0; n < k1; ++n) {
                if (!audio) bz.add(*z_val, n);
                bx.add(*x_val, n);
                taken.push_back(n);
            }
            if (audio) return model.loss(spectrograms(*z_val, taken), bx.tokens(sx), &sc, &co);
            return model.loss(bz.tokens(sz), bx.tokens(sx), &sc, &co);
        });
    };
    train_loop(model.store, model.dropout_step, x_data.size(), o, update, hook, body, evaluate, x_val != nullptr && x_val->size() > 0, early, dp);
}

// the update rules the trainers take (training.hpp)
#define FT_TRAINERS(T, U)                                                                                            \
    template void DTraining<T, U>(DTransformer<T>&, const Dataset&, const TrainOptions&, const U&, const StepHook&, \
                                  const Dataset*, EarlyStopState<T>*, const Replicas<T>*);                          \
    template void ETraining<T, U>(ETransformer<T>&, const Dataset&, const TrainOptions&, const U&, const StepHook&, \
                                  const Dataset*, EarlyStopState<T>*, const Replicas<T>*);                          \
    template void EDTraining<T, U>(EDTransformer<T>&, const Dataset&, const Dataset&, const TrainOptions&, const U&,  \
                                   const StepHook&, const Dataset*, const Dataset*, EarlyStopState<T>*,              \
                                   const Replicas<T>*);
FT_TRAINERS(float, UpdateFn<float>)
FT_TRAINERS(double, UpdateFn<double>)
FT_TRAINERS(float, AdamRule<float>)
FT_TRAINERS(double, AdamRule<double>)
FT_TRAINERS(float, SGDRule<float>)
FT_TRAINERS(double, SGDRule<double>)
#undef FT_TRAINERS

}  // namespace ft
