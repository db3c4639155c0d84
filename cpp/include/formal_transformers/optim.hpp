// Optimizers (paper §8, "Practical considerations"): the listings' plain gradient step, and Adam.
//
// SGD, as Algorithms 11 and 13 line 6 and Algorithm 12 line 10 write it:   θ ← θ − η · ∇loss(θ)
//
// Adam (Kingma & Ba 2015, with bias correction), for step t = 1, 2, …:
//   g ← ∇loss(θ)                         (+ λθ when weight decay is the coupled L2 kind)
//   m ← β₁ m + (1 − β₁) g,   v ← β₂ v + (1 − β₂) g²
//   θ ← θ − (η / (1 − β₁ᵗ)) · m / (√v / √(1 − β₂ᵗ) + ε)
// Decoupled weight decay (AdamW, Loshchilov & Hutter 2019) first shrinks θ ← θ (1 − ηλ).
// The arithmetic follows PyTorch's reference (single-tensor) implementation term by term, so float64
// runs agree with torch.optim.Adam / AdamW to rounding.
//
// Both are one loop over the flat parameter buffer (params.hpp), parallel over elements, skipping
// frozen parameters (sinusoidal W_p). Gradient-norm clipping helpers live here too.
//
// A step is all or nothing: it first makes sure every updated θ_i is finite without writing anything and, if
// any would be NaN or ±inf, throws NonFiniteUpdate with θ (and Adam's m, v, t) unchanged; a trainer then keeps
// the last good θ (training.hpp "nonfinite"). SGD computes each θ_i − η g_i (a read of θ and g). Adam reads θ and
// g only, against bounds on m and v that its own last writing pass gathered (max |m_i|; every m_i, v_i finite,
// v_i >= 0): where those bounds cannot show every new θ_i finite (a chunk of 16 K entries at a time), or when the
// bounds are not known (after load_state_dict, reset, a write to m or v), it computes the update itself for that
// chunk without writing it (the same arithmetic as the writing pass, reading θ, m, v and g) — optim.cpp. The hyperparameters are
// checked when the optimizer is made: η and λ finite and >= 0, β₁, β₂ in [0, 1), ε finite and > 0 (ε = 0
// divides 0 by 0 wherever a gradient entry and its moments are zero).
#pragma once

#include <stdexcept>

#include "formal_transformers/params.hpp"
#include "formal_transformers/precision.hpp"

namespace ft {

// A step's loss or gradient norm is NaN or infinite and TrainOptions::nonfinite is Raise, or an update
// would make θ non-finite (Python: FloatingPointError). Thrown before anything is written.
struct NonFiniteError : std::runtime_error {
    using std::runtime_error::runtime_error;
};
// An optimizer step whose result would hold a NaN or an inf: nothing was written.
struct NonFiniteUpdate : NonFiniteError {
    using NonFiniteError::NonFiniteError;
};

template <class T>
class SGD {
public:
    explicit SGD(double lr);
    // θ ← θ − lr · g over the trainable ranges (g: a flat gradient buffer of store.size(); lr < 0: use lr)
    void step(ParamStore<T>& store, const T* g, double lr_now = -1) const;
    // θ ← θ − lr · ∇ of anything holding a ParamStore `store` (a model, a unit) with its own gradient
    template <class M>
    void step(M& model) const {
        step(model.store, model.store.grad());
    }
    double lr;
};

// Adam's hyperparameters checked (ValueError naming the bad one): what Adam's constructor checks, for whoever
// makes an Adam later (the Python trainers check their options with it). float32: ε must not round to 0.
void check_adam(double lr, double beta1, double beta2, double eps, double weight_decay, bool float32 = false);

template <class T>
class Adam {
public:
    using value_type = T;
    Adam(double lr, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8, double weight_decay = 0.0,
         bool decoupled = true);
    // One step with the flat gradient g (store.size() entries) over the store's trainable ranges; the first
    // step sizes m and v to those ranges (the parameters that train: a frozen one has no moments) and keeps
    // them in `ranges`. ValueError if later called with other trainable ranges (another model, or another
    // choice of trainable parameters).
    void step(ParamStore<T>& store, const T* g, double lr_now = -1);
    // One step of anything holding a ParamStore `store` (a model, a unit) with its own gradient (grads())
    template <class M>
    void step(M& model) {
        step(model.store, model.store.grad());
    }
    void reset();
    // Whoever writes m or v other than through step() and reset() (a checkpoint's moments) calls this after:
    // the next step's check then reads m and v too (and its writing pass gathers the bounds again).
    void moments_changed() { bounds = MomentBounds{}; }

    double lr, beta1, beta2, eps, weight_decay;
    bool decoupled;
    index_t t = 0;          // steps taken
    Vector<T> m, v;         // first and second moments of the trainable parameters only: the ranges of θ in
                            // `ranges`, one after the other. Written by step() and reset(); anything else that
                            // writes them calls moments_changed().
    std::vector<std::pair<index_t, index_t>> ranges;  // [begin, end) of θ that m and v cover (empty before a step)
    // What the last writing pass (or the first step's zeros) left in m and v, for the all-or-nothing check:
    // valid when every m_i and v_i is finite and v_i >= 0, m_max = max |m_i|; m_at, v_at: m.data(), v.data()
    // then (moments in another buffer are not these). Invalid until the first step, after reset() and
    // moments_changed().
    struct MomentBounds {
        bool valid = false;
        T m_max = T(0);
        const T* m_at = nullptr;
        const T* v_at = nullptr;
    } bounds;
    // Optional (float32, bf16-mixed): θ's bf16 copy (precision.hpp), kept up to date by each step as it writes θ
    // (the rounding of each updated θ_i written in the same pass). Ignored when it is a copy of another θ.
    Bf16Weights* bf16_copy = nullptr;
};

// Adam's update of n entries (the loop of Adam::step), given the step's coefficients: a vectorised kernel
// (xsimd), term by term as the header comment says (tests/cpp/test_optim.cpp holds the scalar loop).
template <class T>
struct AdamCoefficients {
    T b1, b2, eps, wd;   // β₁, β₂, ε, λ
    T shrink;            // 1 − ηλ (decoupled decay; 1 when λ = 0)
    T step_size;         // η / (1 − β₁ᵗ)
    T bc2_sqrt;          // √(1 − β₂ᵗ)
    bool coupled;        // L2 decay: g ← g + λθ (else decoupled: θ ← θ(1 − ηλ))
};
template <class T>
void adam_update(const AdamCoefficients<T>& c, T* theta, T* m, T* v, const T* g, index_t n);
// The same arithmetic without writing: true when every updated θ_i would be finite.
template <class T>
bool adam_update_finite(const AdamCoefficients<T>& c, const T* theta, const T* m, const T* v, const T* g, index_t n);
// The check from θ and g alone: true only when every updated θ_i is finite for any moments with |m_i| <= m_max
// and v_i finite and >= 0 (false may still be a finite update: then adam_update_finite decides).
template <class T>
bool adam_update_bounded(const AdamCoefficients<T>& c, T m_max, const T* theta, const T* g, index_t n);

// √(Σ g²) over the trainable ranges (accumulated in double)
template <class T>
double grad_norm(const ParamStore<T>& store, const T* g);
// g ← c · g over the whole buffer
template <class T>
void scale(T* g, index_t n, T c);

}  // namespace ft
