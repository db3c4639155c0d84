// Shared binding machinery (pybind11 only; no math here):
//  * the checked input adapters: dtype -> TypeError, ndim/shape/empty -> ValueError, ids out of range ->
//    IndexError; all checks happen before any computation, never inside an OpenMP region;
//  * ParamDict: name -> writable numpy view of a ParamStore (zero-copy, base = the owner);
//  * AnyDtype<Unit>: one Python object holding the float32 or the float64 instantiation of a unit.
#pragma once

#include <optional>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <climits>
#include <cmath>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "formal_transformers/precision.hpp"
#include "formal_transformers/common.hpp"
#include "formal_transformers/config.hpp"
#include "formal_transformers/stack_embedding.hpp"
#include "formal_transformers/fpenv.hpp"
#include "formal_transformers/params.hpp"
#include "formal_transformers/variants.hpp"

namespace ftpy {

namespace py = pybind11;
using ft::index_t;

// ------------------------------------------------------------------------------------------------------
// dtype
enum class DType { F32, F64 };
DType parse_dtype(const py::object& dtype);  // "float32"/"float64"/np.float32/np.dtype(...) or TypeError/ValueError
template <class T>
const char* dtype_name();

// ------------------------------------------------------------------------------------------------------
// Inputs.
std::string shape_str(const py::array& a);

// A float input adapted to a column-major [rows, cols] view. Zero-copy when the array already has the
// model's dtype and is F-contiguous (e.g. a C-ordered (ℓ, d) array's .T); otherwise one converted copy
// (documented in API docs). Lists are accepted. 1-D inputs become one column when allow_vector.
template <class T>
struct InMatrix {
    py::array_t<T, py::array::f_style> arr;  // keeps the buffer alive
    ft::CMatView<T> m;
    bool was_vector = false;
};
// rows < 0: any number of rows. `what` names the argument in messages ("X", "dY", ...).
template <class T>
InMatrix<T> in_matrix(const py::handle& obj, const char* what, index_t rows, bool allow_vector,
                      const char* rows_name = "rows");

// Token ids (paper: x ∈ V*, 0-based here): int or 1-D integer array/list, every id in [0, n_vocab).
struct InIds {
    std::vector<index_t> ids;
    bool was_scalar = false;
};
InIds in_ids(const py::handle& obj, const char* what, index_t n_vocab, bool allow_scalar,
             const char* range_name = "n_vocab");
// A batch of token sequences: a 1-D sequence, a 2-D integer array (N, ℓ) or a list of 1-D sequences of
// any lengths. Returns the concatenation and the lengths: a conversion only (TypeError/ValueError for what is
// not a batch of integer sequences); the ids' range and the lengths are checked by the core call they go to.
struct InBatch {
    std::vector<index_t> ids;  // concatenated
    std::vector<index_t> lengths;
    bool was_single = false;
};
InBatch in_batch(const py::handle& obj, const char* what);
// V7's prefix_len for a batch of n sequences: None -> empty (no prefix); an int -> the same p for every sequence;
// a sequence of n ints -> one each (TypeError otherwise; ValueError for a count that is not n). The values are
// checked by the core (ft::validate: ValueError naming prefix_len).
std::vector<index_t> prefix_lens(const py::handle& obj, index_t n);

// Outputs: a fresh F-ordered array owned by the caller.
template <class T>
py::array_t<T, py::array::f_style> out_matrix(index_t rows, index_t cols);
// Drop the column axis of a [rows, 1] result when the input was a vector.
py::array maybe_vector(py::array a, bool vector);

// The one conversion of a Python integer argument (an int, a numpy integer: anything with __index__) to 64 bits.
// A bool or a non-integer is a TypeError "<name> must be <expected>, got <type>" (a caller that takes a bool,
// option_value, takes it before asking). The value: in `i` when it fits int64, in `u` when it is in
// [2^63, 2^64), neither flag when it fits neither (its exact text for messages).
struct IntValue {
    py::object exact;  // operator.index(v)
    bool is_signed = false, is_unsigned = false;
    long long i = 0;
    unsigned long long u = 0;
    std::string text() const;
};
IntValue int_value(const py::handle& v, const std::string& name, const char* expected = "an int");
// int_value checked against [lo, hi] (lo >= -2^63, hi <= 2^64 - 1): ValueError "<name> must be <the range>, got
// <v>" outside it (2**64 included), in the words of positive() and the core's checks. Never pybind's
// RuntimeError cast failure. Every integer argument of the bindings goes through it or int_value.
IntValue checked_int(const py::handle& v, const std::string& name, long long lo, unsigned long long hi,
                     const char* expected = "an int");
// A Python int (or numpy integer) in [lo, hi] as long long: checked_int's TypeError / ValueError.
long long int_arg(const py::handle& v, const char* name, long long lo = LLONG_MIN, long long hi = LLONG_MAX);
// An integer argument as the bindings take it (never a plain C++ integer parameter): its caster accepts any
// Python object, so that a wrong one reaches int_arg, which names the argument and its range; pybind11's own
// integer caster answers 2**64, True or 3.0 with its generic "incompatible function arguments". The stub
// calls it typing.SupportsIndex (an int, a numpy integer; not a float, as pybind11's typing.SupportsInt says).
struct PyInt {
    py::object value;
};
inline long long int_arg(const PyInt& v, const char* name, long long lo = LLONG_MIN, long long hi = LLONG_MAX) {
    return int_arg(py::handle(v.value), name, lo, hi);
}
// Positive integer hyperparameter, or ValueError naming it.
index_t positive(long long v, const char* name);
inline index_t positive(const PyInt& v, const char* name) { return index_t(int_arg(v, name, 1)); }
// A seed: an integer in [0, 2^64) (checked_int's TypeError if not an integer, ValueError outside the range).
std::uint64_t seed_arg(const py::handle& v, const char* name = "seed");
// A real number as double: TypeError naming `name` otherwise.
double float_arg(const py::handle& v, const char* name);
// A Python argument as the core's option value (the core's schemas, ModelConfig's and TrainOptions', check it
// against the option's type and range): None, a bool, an int, a real number or a str; TypeError naming `name`
// for anything else, ValueError for an int outside 64 bits.
ft::OptionValue option_value(const py::handle& v, const std::string& name);
// attention_impl= "auto" | "literal" | "tiled" (docs/api.md): ValueError naming the option otherwise
inline ft::AttnImpl parse_attention_impl(const std::string& s) {
    if (s == "auto") return ft::AttnImpl::Auto;
    if (s == "literal") return ft::AttnImpl::Literal;
    if (s == "tiled") return ft::AttnImpl::Tiled;
    throw ft::ValueError("attention_impl must be 'auto', 'literal' or 'tiled', got '" + s + "'");
}
inline const char* attention_impl_name(ft::AttnImpl i) {
    return i == ft::AttnImpl::Auto ? "auto" : i == ft::AttnImpl::Literal ? "literal" : "tiled";
}

// ------------------------------------------------------------------------------------------------------
// Parameters as numpy views.
class ParamDict {
public:
    ParamDict(py::object owner, std::vector<std::string> names, std::vector<py::array> arrays, bool writable)
        : owner_(std::move(owner)), names_(std::move(names)), arrays_(std::move(arrays)), writable_(writable) {
        index_.reserve(names_.size());
        for (std::size_t i = 0; i < names_.size(); ++i) index_.emplace(names_[i], i);
    }
    py::array get(const std::string& name) const;
    void set(const std::string& name, const py::object& value);
    // Every check of set() (name, writable, dtype kind, shape) without writing: the array to copy from.
    py::array checked_source(const std::string& name, const py::object& value) const;
    // Copy several arrays in, all or nothing: every one is checked before the first is written.
    void update(const py::dict& values);
    bool contains(const py::object& name) const;
    const std::vector<std::string>& names() const { return names_; }
    const std::vector<py::array>& arrays() const { return arrays_; }
    std::string repr() const;

private:
    // The owner's call lock (a model or component), held while writing so that no call of another thread
    // sees half of an update; none when the views are over a buffer of the caller's.
    std::recursive_mutex* owner_mutex() const;
    py::object owner_;
    std::unordered_map<std::string, std::size_t> index_;  // name -> position (lookups were a scan)
    std::vector<std::string> names_;
    std::vector<py::array> arrays_;
    bool writable_;
};

template <class T>
ParamDict make_param_dict(const py::object& owner, ft::ParamStore<T>& store, bool grads);
// The same names and shapes over another flat buffer laid out as θ (a copy of θ, e.g. early stopping's best
// parameters); `owner` keeps the buffer alive (None: the caller does, for the views' lifetime).
template <class T>
ParamDict param_views(const py::object& owner, const ft::ParamStore<T>& store, T* base);
// The gradients as a dict of arrays that later calls do not change: ONE copy of the flat gradient buffer (a
// memcpy), with each name a view into that copy laid out like the parameter.
template <class T>
py::dict grads_copy(const ft::ParamStore<T>& store);

// ------------------------------------------------------------------------------------------------------
// Every Python object with parameters derives from HasParams (registered in module.cpp), so generic
// code such as the optimizers can reach its θ whatever its class: `obj.cast<HasParams&>()`.
using StoreRef = std::variant<ft::ParamStore<float>*, ft::ParamStore<double>*>;
struct HasParams {
    virtual ~HasParams() = default;
    virtual StoreRef store_ref() = 0;
    // One call at a time per object (calls release the GIL, so two Python threads could otherwise enter
    // together). Recursive: a training hook runs between steps on the training thread and may use the
    // model being trained (evaluate it, sample from it); its activations are free at that point.
    std::recursive_mutex mutex;
    // bf16-mixed decoding's bf16 copy of θ, kept between calls (DecodeProducts checks it against θ at each)
    std::unique_ptr<ft::Bf16Weights> bf16_theta;
};

// How a unit's products run (precision.hpp): a model with `precision` bf16-mixed opens a bf16 ProductScope
// around every call made through AnyDtype::visit; any other unit leaves the caller's scope as it is.
template <class U, class = void>
struct has_precision : std::false_type {};
template <class U>
struct has_precision<U, std::void_t<decltype(std::declval<const U&>().precision)>> : std::true_type {};
template <class U>
ft::ProductContext products_of(const U& u) {
    if constexpr (has_precision<U>::value && std::is_same_v<typename std::decay_t<decltype(u.store)>::value_type, float>)
        return ft::ProductContext{u.precision == ft::Precision::BF16Mixed, nullptr};
    else
        return ft::product_context();
}

// A decoding call does not change θ: under bf16-mixed its products read a bf16 copy of θ (the weights' bytes per
// token halved) instead of rounding the weights at every token. The copy lives on the model between calls; each
// call first brings it up to date with θ (Bf16Weights::sync: exact, one read of θ and of the copy), so whatever
// changed θ since — an optimizer step, a trainer, a write through a numpy view of params, a load — is seen. A
// float32 model drops it.
struct DecodeProducts {
    std::optional<ft::ProductScope> scope;
    template <class M>
    DecodeProducts(HasParams& owner, const M& m) {
        if constexpr (std::is_same_v<typename std::decay_t<decltype(m.store)>::value_type, float>) {
            if (m.precision != ft::Precision::BF16Mixed) {
                owner.bf16_theta.reset();
                return;
            }
            if (!owner.bf16_theta) owner.bf16_theta = std::make_unique<ft::Bf16Weights>();
            owner.bf16_theta->sync(m.store.theta(), m.store.size());
            scope.emplace(ft::ProductContext{true, owner.bf16_theta.get()});
        }
    }
};

// A training call (loss_and_grad, the trainers) under bf16-mixed: θ's operands read from θ's bf16 copy, brought up
// to date once at the start of the call (Bf16Weights::sync: exact, so whatever changed θ since is seen; after an
// Adam step, which writes the copy with θ, it only reads), instead of being rounded at every product. The
// products take the routes they take without the copy (ProductContext::training): the same results.
struct TrainProducts {
    std::optional<ft::ProductScope> scope;
    ft::Bf16Weights* copy = nullptr;  // the copy in use (null: none)
    template <class M>
    TrainProducts(HasParams& owner, const M& m) {
        if constexpr (std::is_same_v<typename std::decay_t<decltype(m.store)>::value_type, float>) {
            if (m.precision != ft::Precision::BF16Mixed) {
                owner.bf16_theta.reset();
                return;
            }
            if (!ft::bf16_theta_copy_allowed()) {
                scope.emplace(ft::ProductContext{true, nullptr, true});
                return;
            }
            if (!owner.bf16_theta) owner.bf16_theta = std::make_unique<ft::Bf16Weights>();
            copy = owner.bf16_theta.get();
            copy->sync(m.store.theta(), m.store.size());
            scope.emplace(ft::ProductContext{true, copy, true});
        }
    }
};

// precision=: a str, "float32" or "bf16-mixed" (TypeError for another type, ValueError for another name)
ft::Precision parse_precision_arg(const py::handle& v);

// One Python object, two instantiations. `Unit<T>` owns its ParamStore as member `store`.
// Register as py::class_<AnyDtype<Unit>, HasParams>.
template <template <class> class Unit>
struct AnyDtype : HasParams {
    std::variant<std::unique_ptr<Unit<float>>, std::unique_ptr<Unit<double>>> u;

    template <class... A>
    explicit AnyDtype(DType dt, A&&... args) {
        if (dt == DType::F32)
            u = std::make_unique<Unit<float>>(std::forward<A>(args)...);
        else
            u = std::make_unique<Unit<double>>(std::forward<A>(args)...);
    }
    template <class T>
    explicit AnyDtype(std::unique_ptr<Unit<T>> made) : u(std::move(made)) {}
    // A unit replaced in place (ft.lora, merge_lora: θ gains or loses entries): the old one is kept, so that
    // numpy views of its θ taken before stay valid memory (they no longer are this object's parameters).
    std::vector<std::variant<std::unique_ptr<Unit<float>>, std::unique_ptr<Unit<double>>>> retired;
    template <class T>
    void replace(std::unique_ptr<Unit<T>> made) {
        retired.push_back(std::move(u));
        u = std::move(made);
    }
    template <class F>
    decltype(auto) visit(F&& f) {
        return std::visit([&](auto& p) -> decltype(auto) {
            ft::ProductScope products(products_of(*p));  // the model's precision for this call
            return f(*p);
        }, u);
    }
    std::string dtype() const { return u.index() == 0 ? "float32" : "float64"; }
    StoreRef store_ref() override {
        return std::visit([](auto& p) -> StoreRef { return &p->store; }, u);
    }
};

// Around every core call that computes in floating point: release the GIL, and run with FTZ/DAZ set for
// the call's duration only (the caller's MXCSR restored on every exit path: fpenv.hpp).
struct CoreCall {
    py::gil_scoped_release nogil;
    ft::FpEnvScope fp;
};

// The same for long calls (training, inference): FTZ/DAZ also on the OpenMP pool's threads (two
// fork/joins per call, too costly for short calls: fpenv.hpp).
struct LongCoreCall {
    py::gil_scoped_release nogil;
    ft::FpEnvScope fp{true};
};

// A model call's [rows, cols] output: `run()` (the listing's lines up to the output, which check the input),
// then the result allocated, then `last(out)` (the last line written into it), each core step without the GIL.
// So an input the core refuses allocates nothing. Used by every model's call (shaped_output, ViT's output).
template <class T, class Run, class Last>
py::array_t<T, py::array::f_style> run_then_output(index_t rows, index_t cols, Run run, Last last) {
    {
        CoreCall nogil;
        run();
    }
    auto out = out_matrix<T>(rows, cols);
    {
        CoreCall nogil;
        last(ft::MatView<T>(out.mutable_data(), rows, cols));
    }
    return out;
}

// The backward call of a stand-alone unit with one matrix input (LayerNorm, RMSNorm, Unembedding): the
// incoming gradient `what` checked as [rows, n] (a vector when the forward's input was), the input's
// gradient [d_in, n] for the n columns of the unit's last forward; the core call without the GIL.
template <class T, class U>
py::array unit_backward(U& u, const py::handle& dy, const char* what, index_t rows, const char* rows_name,
                        index_t d_in) {
    InMatrix<T> d = in_matrix<T>(dy, what, rows, true, rows_name);
    const index_t n = std::max<index_t>(u.last_n(), 0);
    auto dx = out_matrix<T>(d_in, n);
    {
        CoreCall nogil;
        u.backward(d.m, ft::MatView<T>(dx.mutable_data(), d_in, n));
    }
    return maybe_vector(dx, u.last_vector());
}

// Lock an object for one call, releasing the GIL while waiting (another thread may hold it for long).
struct CallLock {
    explicit CallLock(std::recursive_mutex& m) : lock(m, std::defer_lock) {
        if (!lock.try_lock()) {
            py::gil_scoped_release nogil;
            lock.lock();
        }
    }
    std::unique_lock<std::recursive_mutex> lock;
};

// model.precision (get and set) on a model class whose units have `precision` and `set_precision`.
template <class PyClass>
void def_precision(PyClass& cls) {
    using D = typename PyClass::type;
    cls.def_property(
        "precision", [](D& d) { return d.visit([](auto& m) { return std::string(ft::precision_name(m.precision)); }); },
        [](D& d, const py::handle& v) {
            const ft::Precision p = parse_precision_arg(v);
            CallLock lock(d.mutex);
            d.visit([&](auto& m) { m.set_precision(p); });
            if (p != ft::Precision::BF16Mixed) d.bf16_theta.reset();  // decoding's bf16 copy of θ: no longer used
        },
        "How the matrix products run: 'float32', or 'bf16-mixed' (float32 models only: every product of the "
        "listings takes bf16-rounded operands and accumulates in float32; θ, Adam's moments, norms, softmax, the "
        "loss and the gradient sums stay float32). ft.bf16_info() says what runs the bf16 products.");
}

// Lock two objects for one call (speculative decoding's target and draft), whatever order the caller names
// them in: std::lock's deadlock avoidance, so f(a, b) in one thread and f(b, a) in another never wait for each
// other (locking in argument order would). The same object twice is locked once. The GIL is released
// while waiting, as CallLock does.
struct CallLock2 {
    CallLock2(std::recursive_mutex& a, std::recursive_mutex& b) : first(a, std::defer_lock) {
        if (&a == &b) {
            CallLock one(a);
            first = std::move(one.lock);
            return;
        }
        second = std::unique_lock<std::recursive_mutex>(b, std::defer_lock);
        if (std::try_lock(first, second) != -1) {
            py::gil_scoped_release nogil;
            std::lock(first, second);
        }
    }
    std::unique_lock<std::recursive_mutex> first, second;
};

// Common Python surface of every unit with parameters: params, grads, zero_grad, dtype.
template <template <class> class Unit, class PyClass>
void def_params_api(PyClass& cls) {
    using D = AnyDtype<Unit>;
    cls.def_property_readonly(
           "params",
           [](py::object self) {
               D& d = self.cast<D&>();
               return d.visit([&](auto& unit) { return make_param_dict(self, unit.store, false); });
           },
           "Parameters θ: name -> writable numpy view of the C++ storage (zero-copy). Assigning "
           "params[name] = array copies into the storage (shape must match).")
        .def_property_readonly(
            "grads",
            [](py::object self) {
                D& d = self.cast<D&>();
                return d.visit([&](auto& unit) { return make_param_dict(self, unit.store, true); });
            },
            "Gradients, same keys as params, accumulated by backward(), cleared by zero_grad().")
        .def("zero_grad", [](D& d) { d.visit([](auto& unit) { unit.store.zero_grad(); }); })
        .def_property_readonly("dtype", [](D& d) { return d.dtype(); });
}

// The binding groups, one register_<group>.cpp each; module.cpp calls them in a fixed, visible order.
void register_common(py::module_& m);
void register_functions(py::module_& m);
void register_norm(py::module_& m);
void register_embedding(py::module_& m);
void register_attention(py::module_& m);
void register_unembedding(py::module_& m);
void register_transformers(py::module_& m);
void register_optim(py::module_& m);
void register_tokenizer(py::module_& m);
void register_training(py::module_& m);
void register_inference(py::module_& m);

// The features an encoder's part takes instead of token ids (EDTransformer::encoder_input(); the audio encoder, V28:
// spectrograms): a floating-point array (rows, T) — one matrix — or (B, rows, T), converted to the model's dtype and
// laid out as the core's F:[rows, Σ T_b]. Refused here: not floats (TypeError: token ids to such an encoder), another
// rank, an empty batch, no columns, NaN or infinities (ValueError); the rows and T against the model: the part's check
// (EDTransformer::check_encoder_input). The calls take this path when the model's encoder takes features
// (EDTransformer::audio()), whatever z is, so floats given to a token encoder meet the token ids' own TypeError.
bool is_float_array(const py::handle& obj);
template <class T>
struct InAudio {
    ft::Matrix<T> F;
    ft::Seqs s;
    bool single = false;
    ft::Features<T> features() const { return ft::Features<T>{ft::view(F), s}; }
};
template <class T>
InAudio<T> in_audio(const py::handle& obj, const std::string& what) {
    py::array a = py::array::ensure(obj);
    if (!a || a.dtype().kind() != 'f')
        throw ft::TypeError("this EDTransformer's encoder takes " + what + ": a floating-point numpy array (rows, T) or "
                            "(B, rows, T), not token ids");
    if (a.ndim() != 2 && a.ndim() != 3)
        throw ft::ValueError("features must be 2-D (rows, T) or 3-D (B, rows, T), got " + std::to_string(a.ndim()) + "-D");
    auto c = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(a);
    InAudio<T> r;
    r.single = a.ndim() == 2;
    const py::ssize_t o = r.single ? 0 : 1;
    const index_t B = r.single ? 1 : index_t(a.shape(0)), M = index_t(a.shape(o)), Tn = index_t(a.shape(o + 1));
    if (B < 1) throw ft::ValueError("features is an empty batch (B = 0)");
    if (Tn < 1) throw ft::ValueError("features has no frames (T = 0)");
    if (M < 1) throw ft::ValueError("features has no rows");
    const T* p = c.data();
    for (py::ssize_t i = 0; i < c.size(); ++i)
        if (!std::isfinite(double(p[i]))) throw ft::ValueError("features contain NaN or infinite values");
    ft::MatView<T> F = ft::ensure(r.F, M, B * Tn);  // column j: frame j
    for (index_t b = 0; b < B; ++b)
        for (index_t m = 0; m < M; ++m)
            for (index_t t = 0; t < Tn; ++t) F(m, b * Tn + t) = p[(b * M + m) * Tn + t];
    r.s = ft::Seqs::from_lengths(std::vector<index_t>(std::size_t(B), Tn));
    return r;
}

}  // namespace ftpy

namespace pybind11::detail {
template <>
struct type_caster<ftpy::PyInt> {
    PYBIND11_TYPE_CASTER(ftpy::PyInt, io_name("typing.SupportsIndex", "int"));
    bool load(handle src, bool) {
        value.value = reinterpret_borrow<object>(src);
        return true;
    }
    static handle cast(const ftpy::PyInt& v, return_value_policy, handle) { return v.value.inc_ref(); }
};
}  // namespace pybind11::detail
