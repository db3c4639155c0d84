// Algorithms 11, 12, 13: training the three architectures.
//
// Algorithm 13: θ̂ ← DTraining(x_{1:N_data}, θ)             Hyperparameters: N_epochs ∈ ℕ, η ∈ (0, ∞)
//   1  for i = 1, 2, …, N_epochs do
//   2    for n = 1, 2, …, N_data do
//   3      ℓ ← length(x_n)
//   4      P(θ) ← DTransformer(x_n | θ)
//   5      loss(θ) = −Σ_{t=1}^{ℓ−1} log P(θ)[x_n[t+1], t]
//   6      θ ← θ − η · ∇loss(θ)
//   7    end
//   8  end
//   9  return θ̂ = θ
// Algorithm 11 (EDTraining) is the same loop over pairs (z_n, x_n) with P(θ) ← EDTransformer(z_n, x_n | θ).
// Algorithm 12 (ETraining), hyperparameter p_mask ∈ (0, 1), replaces lines 3–5 by
//   3      ℓ ← length(x_n)
//   4      for t = 1, 2, …, ℓ do
//   5        x̃_n[t] ← mask_token or x_n[t] randomly with probability p_mask or 1 − p_mask
//   6      end
//   7      T̃ ← {t ∈ [ℓ] : x̃_n[t] = mask_token}
//   8      P(θ) ← ETransformer(x̃_n | θ)
//   9      loss(θ) = −Σ_{t∈T̃} log P(θ)[x_n[t], t]
//
// What the options add to the listing (defaults reproduce it, except the optimizer, which is Adam by
// default as docs/api.md says; optimizer = SGD with batch_size = 1, shuffle = false is the listing exactly):
//  * batch_size B: line 2 walks the data B sequences at a time; the update uses the mean over the
//    minibatch of the listing's per-sequence loss (reduction "sum", the default), or the mean per scored
//    token (reduction "mean", nanoGPT's). B = 1 with "sum" is the listing's update.
//  * shuffle: line 2 visits the data in a fresh random order each epoch (seeded).
//  * η schedule: linear warm-up over `warmup` steps, then constant, cosine or linear decay to min_lr
//    at the last step. clip > 0: the gradient is rescaled to norm ≤ clip before the update.
//  * max_steps > 0 ends training early; with n_epochs = 0 it is the run's length (as many epochs as it
//    needs: training counted in steps, as nanoGPT's max_iters); eval_every > 0 measures the validation loss (mean per token, and
//    accuracy of the argmax) every that many steps and at the end.
//  * nonfinite: a step whose loss or gradient norm is not finite (NaN or ±inf, e.g. η too large), or whose
//    update would make θ non-finite (SGD and Adam check their result before writing it: optim.hpp), is never
//    applied. Raise (the default): training stops with NonFiniteError naming the step, before its update,
//    so the model holds θ after the previous step (its grads hold the failed step's gradient). Warn / Skip:
//    the step is skipped (no update, StepInfo.skipped set; the bindings warn for Warn) and training goes on.
//  * early stopping (patience > 0, restore_best; needs validation data): the listing below, written
//    for this project (docs/early_stopping.md), wraps the loop above; its lines are marked `// ES line k`.
// After each update a hook receives the step's figures and may stop training by returning false. Ctrl-C
// (or any exception from the hook) ends training between steps or inside a step before its update, so the
// model always holds the parameters of a completed step.
//
// Early stopping: θ̂, s ← EarlyStopping(θ, s | Training)
//   Input: θ, the parameters; s = (L*, i*, k, θ*), the state carried over from an earlier part of the run
//          (fresh: L* = ∞, i* = 0, k = 0, θ* none): the best validation loss, its step, the evaluations
//          since it, and its parameters.
//   Output: θ̂, the trained parameters (θ* with restore_best); s, the state, to resume from.
//   Hyperparameters: patience ∈ ℕ, min_delta ∈ [0, ∞), restore_best ∈ {true, false}, eval_every; those of
//          the training listing (N_epochs, η, …).
//   1  for each step i of the training listing (lines 1–6 of Algorithm 11, 12 or 13) do
//   2    if i is an evaluation step (every eval_every steps, and the last) then
//   3      L ← the validation loss of θ (mean per scored token)
//   4      if L < L* − min_delta then
//   5        L* ← L, i* ← i, k ← 0
//   6        if restore_best then θ* ← θ
//   7      else
//   8        k ← k + 1
//   9        if k = patience then stop training
//  10      end
//  11    end
//  12  end
//  13  if restore_best and θ ≠ θ* then θ ← θ*
//  14  return θ̂ = θ, s = (L*, i*, k, θ*)
// Line 13 runs when training ends normally (its epochs, max_steps, line 9, or the hook returning false);
// not when an exception ends it (Ctrl-C, NonFiniteError, an error in the hook): the model then keeps the
// parameters of its last completed step, and the state (θ* included) is filled so that a resumed run goes
// on as one uninterrupted run would. Only θ is restored: the optimizer's moments stay those of the last step.
#pragma once

#include <algorithm>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "formal_transformers/optim.hpp"
#include "formal_transformers/transformers.hpp"

namespace ft {

// The trainers' options. Every option is declared once, in train_options.cpp's schema (name, type, default, range,
// the listings that take it, what it does); from_options (the Python trainers' keyword arguments), check,
// to_options and doc all read it. The last group is what the Python trainers add around the loop (the
// optimizer they make, data parallelism); the C++ trainers take an optimizer object and a Replicas instead.
enum class Listing { D, E, ED };  // Algorithms 13 (DTraining), 12 (ETraining), 11 (EDTraining)
const char* listing_name(Listing l);  // "DTraining", "ETraining", "EDTraining"

struct TrainOptions {
    index_t n_epochs = 1;
    double eta = 1e-3;              // η: the peak learning rate
    index_t batch_size = 1;
    bool shuffle = true;
    std::uint64_t seed = 0;
    enum class Reduction { Sum, Mean } reduction = Reduction::Sum;
    enum class Schedule { Constant, Cosine, Linear } schedule = Schedule::Constant;
    index_t warmup = 0;
    double min_lr = 0.0;            // the decay's end value
    double clip = 0.0;              // max gradient norm; 0: off
    index_t max_steps = 0;          // 0: N_epochs full passes; with n_epochs = 0: the run's length in steps
    index_t eval_every = 0;         // 0: evaluate only at the end (when validation data is given)
    index_t start_step = 0;         // resuming: steps already done; the schedule continues from there (its
                                    // length is start_step + this run's steps)
    double p_mask = 0.15;           // ETraining
    index_t patience = 0;           // early stopping: stop after this many evaluations without improvement (0: off)
    double min_delta = 0.0;         // an improvement lowers the best validation loss by more than this
    bool restore_best = false;      // at the end, θ ← the parameters of the best evaluation
    enum class NonFinite { Raise, Warn, Skip } nonfinite = NonFinite::Raise;  // see above
    // the Python trainers' own: the optimizer they make (Adam: AdamW with weight_decay and betas; SGD: the
    // listing's), and data parallelism (docs/data_parallel.md)
    enum class Optimizer { Adam, SGD } optimizer = Optimizer::Adam;
    double weight_decay = 0.0, beta1 = 0.9, beta2 = 0.999;
    double dist_timeout = 300.0;
    index_t sync_check_every = 100;
    // Which parameters train (names or glob patterns of θ's names, fnmatch's *, ?, [...]; empty: all). The
    // others are frozen for the run: no update, no optimizer moments, no gradient product where a backward can
    // leave it out (ParamStore::train_only); θ and its gradient buffer keep their layout. A pattern that matches
    // no parameter is a ValueError naming it, before anything changes (resolve_trainable).
    std::vector<std::string> trainable;

    void check() const;             // ValueError naming a bad value (the schema's ranges, then Adam's own check)
    // The options of `listing` from keyword arguments (OptionValue: config.hpp), checked: TypeError for an
    // option the listing does not take or a value of the wrong type, ValueError for one out of range. eta
    // None (or absent) is `optimizer_lr` when given (an optimizer object's lr: Python's eta=None), else 1e-3.
    static TrainOptions from_options(Listing listing, const Options& keywords, const double* optimizer_lr = nullptr);
    // Every option of `listing` with its value, in the schema's order and Python's notation of its type
    // (patience 0: None; the enums by name).
    Options to_options(Listing listing) const;
    // One line per option of `listing`: "name=default  what it does" (the trainers' docstrings).
    static std::string doc(Listing listing);
};

// fnmatch's rule on a whole name: * any run of characters (dots too), ? one character, [abc] / [a-z] / [!abc] one
// of a set; anything else itself.
bool glob_match(const std::string& pattern, const std::string& name);
// o.trainable against θ's names: per entry of store.entries(), whether it trains in the run (all of them when
// o.trainable is empty). ValueError naming the first pattern that matches no parameter.
template <class T>
std::vector<bool> resolve_trainable(const TrainOptions& o, const ParamStore<T>& store);

// NonFiniteError (optim.hpp): a step's loss or gradient norm is NaN or infinite, or its update would make θ
// non-finite, and TrainOptions::nonfinite is Raise (Python: FloatingPointError). Thrown before that step's
// update is written: θ holds the previous step's parameters.

struct StepInfo {
    index_t step = 0, epoch = 0, total_steps = 0;
    double loss = 0;        // this step's loss, mean per scored token (nats)
    double lr = 0;          // η used for this step
    double grad_norm = 0;   // before clipping
    index_t tokens = 0;     // scored tokens in this step
    double val_loss = -1;   // ≥ 0 when evaluated at this step (mean per token)
    double val_accuracy = -1;
    bool skipped = false;      // non-finite loss or gradient norm: no update was applied (nonfinite = Warn/Skip)
    bool interrupted = false;  // evaluation of this step was interrupted (Ctrl-C): the update is done, record it and stop
};

// Early stopping's state (the listing's s): pass one to a trainer to read it afterwards, or to resume — a
// run continued from the state (and start_step) of an earlier part goes on as one uninterrupted run would.
template <class T>
struct EarlyStopState {
    double best_val_loss = std::numeric_limits<double>::infinity();  // L*: ∞ before the first evaluation
    index_t best_step = 0;          // i*, numbered start_step + the run's step (a label: any value when resumed)
    index_t bad_evals = 0;          // k: evaluations since i* that did not improve on L* by more than min_delta
    std::vector<T> best_theta;      // θ* (restore_best; else empty): sized once per run, copied per improvement
    // set by each run:
    bool stopped = false;           // line 9 ended training
    bool restored = false;          // line 13 replaced θ by θ*
    std::vector<T> last_theta;      // when restored: θ after the last step (what a resumed run continues from)
};

// Line 6 of Algorithms 11–13, θ ← θ − η·∇loss(θ) or Adam's step: the trainers call `update(store, g, η)` with
// the flat gradient and the step's η. Update is one of AdamRule<T>, SGDRule<T> (update_rule(optimizer) makes
// them: called directly) or UpdateFn<T> (any other rule, through a std::function).
template <class T>
using UpdateFn = std::function<void(ParamStore<T>&, const T* g, double lr)>;
template <class T>
struct AdamRule {
    Adam<T>* adam;
    void operator()(ParamStore<T>& s, const T* g, double lr) const { adam->step(s, g, lr); }
};
template <class T>
struct SGDRule {
    void operator()(ParamStore<T>& s, const T* g, double lr) const { SGD<T>(lr).step(s, g); }
};
template <class T>
AdamRule<T> update_rule(Adam<T>& adam) {
    return {&adam};
}
template <class T>
SGDRule<T> update_rule(const SGD<T>&) {
    return {};
}
// Called after each step's update (and evaluation); return false to stop. With info.interrupted set it is
// called only to record the step (no Python may run), and the interruption is re-thrown after it.
using StepHook = std::function<bool(const StepInfo&)>;

// Data parallelism (docs/data_parallel.md): this process is rank `rank` of `world` replicas of one model,
// each holding the same θ, optimizer state and data. Every rank draws the same global minibatch (lines 1–2:
// the same seeded order) and runs lines 3–5 on its contiguous slice of it (shard_begin); `sum` then adds up,
// over the ranks and in place, the slices' gradients ∇Σ_n loss_n (the flat buffer: one call) and the step's
// figures, so that the scaling by the global batch (or its scored tokens), clipping and line 6 run on every
// rank on the same numbers as one process on the whole minibatch. Validation is sharded the same way (its
// chunks round-robin over the ranks, their sums added up). world = 1: the loops above, unchanged.
template <class T>
struct Replicas {
    index_t rank = 0, world = 1;
    // In place over the ranks: g (n values; null with n = 0: no gradient) and the k figures v.
    std::function<void(T* g, index_t n, double* v, index_t k)> sum;
    void check() const;  // ValueError: world < 1, rank outside [0, world), no sum for world > 1
};
// The first position of rank r's contiguous slice of n items over `world` ranks: the first n mod world
// ranks take ⌈n/world⌉ items, the others ⌊n/world⌋ (rank r's slice is [shard_begin(r), shard_begin(r + 1))).
inline index_t shard_begin(index_t n, index_t rank, index_t world) {
    return rank * (n / world) + std::min(rank, n % world);
}

// A data set of token sequences: concatenated ids and their extents.
struct Dataset {
    std::vector<index_t> ids;
    Seqs s;
    // V7 (DTraining of a model with mask = Prefix): the prefix length p_n of every sequence (empty: none). Only the
    // predictions after each prefix count (docs/variants.md V7, line 5′).
    std::vector<index_t> prefix;
    // ETraining with fixed masks: x̃ of every sequence, laid out as ids (empty: lines 4–6 draw them each visit). A
    // task whose masked positions are given (predict these tokens from those) instead of Algorithm 12's random ones.
    std::vector<index_t> tilde;
    // EDTraining of an EDTransformer whose encoder takes features (the audio encoder, V28: spectrograms): z_data as
    // feature matrices of feature_rows rows (column j of the data: features[rows·j, rows·(j+1)); s: the columns of
    // each matrix; ids empty)
    std::vector<double> features;
    index_t feature_rows = 0;
    index_t size() const { return s.count(); }
};

// η at step `step` (1-based) of `total`
double learning_rate(const TrainOptions& o, index_t step, index_t total);

// The plan of a run: lines 1–2 of Algorithms 11–13 with the options (epochs, shuffle, batch_size, max_steps,
// n_epochs = 0 with max_steps > 0: as many epochs as max_steps needs), the η of each step, and the generator
// the trainer draws the order from and then, in ETraining, each step's masks (lines 4–6: draw_masks). The
// trainers walk it; Python reads it (trainer.plan, ETraining.drawn_masks), so the two cannot differ.
class StepPlan {
public:
    StepPlan(const TrainOptions& o, index_t N_data);  // ValueError: N_data = 0, too many steps
    // The next step (each epoch starts by drawing its order when shuffling): false at the end.
    bool next();
    index_t step() const { return step_; }          // 1-based
    index_t epoch() const { return epoch_; }        // 0-based
    index_t total() const { return total_; }        // the run's steps
    const std::vector<index_t>& batch() const { return batch_; }  // the step's sequences, in order
    double lr() const { return learning_rate(o_, o_.start_step + step_, o_.start_step + total_); }
    Rng& rng() { return rng_; }

private:
    const TrainOptions& o_;
    index_t N_, epochs_, total_, step_ = 0, epoch_ = -1, k_;
    Rng rng_;
    std::vector<index_t> order_, batch_;
};
// Lines 4–6 of Algorithm 12 for one step: the x̃ of the batch's sequences of `data`, concatenated in the batch's
// order (x: the originals, the same layout), from the plan's generator.
void draw_masks(const Dataset& data, const std::vector<index_t>& batch, index_t mask_token, double p_mask, Rng& rng,
                std::vector<index_t>& x, std::vector<index_t>& x_tilde);

// The whole plan of a run on `data` (Python's trainer.plan): each step's epoch, sequences and η, and with
// mask_token >= 0 (ETraining) the x̃ that draw_masks gives it, concatenated in the batch's order.
struct PlannedStep {
    index_t step = 0, epoch = 0;
    std::vector<index_t> batch;
    double lr = 0;
    std::vector<index_t> x_tilde;
};
std::vector<PlannedStep> plan_run(const TrainOptions& o, const Dataset& data, index_t mask_token = -1);

// Algorithm 13
template <class T, class Update>
void DTraining(DTransformer<T>& model, const Dataset& data, const TrainOptions& o, const Update& update,
               const StepHook& hook, const Dataset* val = nullptr, EarlyStopState<T>* early = nullptr,
               const Replicas<T>* replicas = nullptr);
// Algorithm 12 (the originals x; the masking of lines 4–6 happens here, from the seeded Rng)
template <class T, class Update>
void ETraining(ETransformer<T>& model, const Dataset& data, const TrainOptions& o, const Update& update,
               const StepHook& hook, const Dataset* val = nullptr, EarlyStopState<T>* early = nullptr,
               const Replicas<T>* replicas = nullptr);
// Algorithm 11 (z_data and x_data: the same number of sequences)
template <class T, class Update>
void EDTraining(EDTransformer<T>& model, const Dataset& z_data, const Dataset& x_data, const TrainOptions& o,
                const Update& update, const StepHook& hook, const Dataset* z_val = nullptr,
                const Dataset* x_val = nullptr, EarlyStopState<T>* early = nullptr,
                const Replicas<T>* replicas = nullptr);

// ---------------------------------------------------------------------------------------------------
// From C++ with xtensor sequences and an optimizer object (formal_transformers.hpp): the same loops.
// A Dataset of the given sequences (checked by the trainers: IndexError, ValueError).
Dataset dataset(const std::vector<TokenIds>& seqs);
// An optimizer object's own lr beside the trainer's η: the trainer sets every step's rate from o.eta (its
// schedule's peak), so an lr that disagrees would be silently ignored; refused instead (ValueError naming
// both). Python's trainers take eta=None to mean the optimizer's lr.
void check_optimizer_lr(double optimizer_lr, const TrainOptions& o);

// A loss's reduction by name ("sum": the listing's loss, summed over the sequences; "mean": per scored
// token), ValueError naming `reduction` otherwise; and the reduction applied to a summed loss over `scored`
// predictions (a mean over none is 0). The one place both front-ends (the bindings, the C++ API) reduce.
TrainOptions::Reduction parse_reduction(const std::string& name);
double reduce_loss(double loss_sum, index_t scored, TrainOptions::Reduction r);
template <class T, class Opt>
void DTraining(DTransformer<T>& model, const std::vector<TokenIds>& data, const TrainOptions& o, Opt& opt,
               const StepHook& hook = nullptr) {
    check_optimizer_lr(opt.lr, o);
    DTraining(model, dataset(data), o, update_rule<T>(opt), hook);
}
template <class T, class Opt>
void ETraining(ETransformer<T>& model, const std::vector<TokenIds>& data, const TrainOptions& o, Opt& opt,
               const StepHook& hook = nullptr) {
    check_optimizer_lr(opt.lr, o);
    ETraining(model, dataset(data), o, update_rule<T>(opt), hook);
}
template <class T, class Opt>
void EDTraining(EDTransformer<T>& model, const std::vector<TokenIds>& z_data, const std::vector<TokenIds>& x_data,
                const TrainOptions& o, Opt& opt, const StepHook& hook = nullptr) {
    check_optimizer_lr(opt.lr, o);
    EDTraining(model, dataset(z_data), dataset(x_data), o, update_rule<T>(opt), hook);
}

// Line 5 of Algorithm 12 for a whole sequence: x̃[t] = mask_token with probability p_mask, else x[t].
void mask_tokens(const index_t* x, index_t n, index_t mask_token, double p_mask, Rng& rng, index_t* x_tilde);

}  // namespace ft
