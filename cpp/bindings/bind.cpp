#include "bind.hpp"

#include <optional>

#include <sstream>

namespace ftpy {

// ------------------------------------------------------------------------------------------------------
ft::Precision parse_precision_arg(const py::handle& v) {
    if (!py::isinstance<py::str>(v))
        throw ft::TypeError("precision must be a str, 'float32' or 'bf16-mixed', got " +
                            py::str(py::type::handle_of(v).attr("__name__")).cast<std::string>());
    return ft::parse_precision(v.cast<std::string>());
}

DType parse_dtype(const py::object& dtype) {
    py::dtype dt;
    try {
        dt = py::dtype::from_args(dtype);
    } catch (py::error_already_set&) {
        throw ft::TypeError("dtype must be 'float32' or 'float64', got " + py::repr(dtype).cast<std::string>());
    }
    if (dt.equal(py::dtype::of<float>())) return DType::F32;
    if (dt.equal(py::dtype::of<double>())) return DType::F64;
    throw ft::ValueError("dtype must be 'float32' or 'float64', got " + py::str(dt).cast<std::string>());
}

template <>
const char* dtype_name<float>() { return "float32"; }
template <>
const char* dtype_name<double>() { return "float64"; }

std::string shape_str(const py::array& a) {
    std::ostringstream s;
    s << "(";
    for (py::ssize_t i = 0; i < a.ndim(); ++i) s << (i ? ", " : "") << a.shape(i);
    if (a.ndim() == 1) s << ",";
    s << ")";
    return s.str();
}

namespace {
py::array as_array(const py::handle& obj, const char* what) {
    if (py::isinstance<py::array>(obj)) return py::reinterpret_borrow<py::array>(obj);
    if (obj.is_none()) throw ft::TypeError(std::string(what) + " must be an array, got None");
    if (py::isinstance<py::str>(obj) || py::isinstance<py::bytes>(obj))
        throw ft::TypeError(std::string(what) + " must be an array, got " +
                            py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>());
    try {
        return py::module_::import("numpy").attr("asarray")(obj);
    } catch (py::error_already_set& e) {
        throw ft::TypeError(std::string(what) + " could not be read as an array: " + e.what());
    }
}
std::string kind_name(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }
}  // namespace

template <class T>
InMatrix<T> in_matrix(const py::handle& obj, const char* what, index_t rows, bool allow_vector, const char* rows_name) {
    py::array a = as_array(obj, what);
    const char kind = a.dtype().kind();
    if (kind != 'f')
        throw ft::TypeError(std::string(what) + " must be a float array (float32 or float64), got dtype " + kind_name(a));
    InMatrix<T> r;
    if (a.ndim() == 1 && allow_vector) {
        r.was_vector = true;
    } else if (a.ndim() != 2) {
        throw ft::ValueError(std::string(what) + " must be " + (allow_vector ? "1-D or 2-D" : "2-D") +
                             " (column convention: (d, ℓ)), got shape " + shape_str(a));
    }
    const index_t n_rows = index_t(a.shape(0));
    const index_t n_cols = r.was_vector ? 1 : index_t(a.shape(1));
    if (rows >= 0 && n_rows != rows)
        throw ft::ValueError(std::string(what) + " has " + std::to_string(n_rows) + " rows but " + rows_name + " = " +
                             std::to_string(rows) + " was expected (shape " + shape_str(a) + ")");
    if (n_rows == 0) throw ft::ValueError(std::string(what) + " is empty (shape " + shape_str(a) + ")");
    if (n_cols == 0)
        throw ft::ValueError(std::string(what) + " is an empty sequence (ℓ = 0, shape " + shape_str(a) + ")");
    r.arr = py::array_t<T, py::array::f_style | py::array::forcecast>::ensure(a);
    if (!r.arr) throw py::error_already_set();
    r.m = ft::CMatView<T>(r.arr.data(), n_rows, n_cols);
    return r;
}

namespace {
void check_int_array(const py::array& a, const char* what) {
    const char kind = a.dtype().kind();
    if (kind != 'i' && kind != 'u')
        throw ft::TypeError(std::string(what) + " must hold integer token ids, got dtype " + kind_name(a));
}
// n = the largest index_t: the caller only converts (in_batch), the core's validate checks [0, N_V) and names it
constexpr index_t kNoRange = std::numeric_limits<index_t>::max();
std::string out_of(index_t n) {
    return n == kNoRange ? " does not fit a 64-bit integer (token ids are in [0, n_vocab))"
                         : " is out of range [0, " + std::to_string(n) + ")";
}
void check_range(index_t v, index_t pos, index_t n, const char* what, const char* range_name) {
    if (n == kNoRange) return;  // every index_t fits; a negative id is the core's IndexError, naming n_vocab
    if (v < 0 || v >= n)
        throw ft::IndexError(std::string(what) + ": token id " + std::to_string(v) + " at position " +
                             std::to_string(pos) + " is out of range [0, " + std::to_string(n) + ") (" +
                             range_name + " = " + std::to_string(n) + ")");
}
bool is_int_scalar(const py::handle& obj) {
    if (py::isinstance<py::bool_>(obj)) return false;
    if (py::isinstance<py::int_>(obj)) return true;
    if (py::isinstance<py::array>(obj)) return false;
    return py::hasattr(obj, "dtype") && py::hasattr(obj, "__index__") &&
           !py::isinstance<py::bool_>(obj) &&
           (py::str(obj.attr("dtype").attr("kind")).cast<std::string>() == "i" ||
            py::str(obj.attr("dtype").attr("kind")).cast<std::string>() == "u");
}
}  // namespace

InIds in_ids(const py::handle& obj, const char* what, index_t n_vocab, bool allow_scalar, const char* range_name) {
    InIds r;
    if (is_int_scalar(obj)) {
        if (!allow_scalar) throw ft::TypeError(std::string(what) + " must be a 1-D sequence of token ids, got an int");
        r.was_scalar = true;
        const IntValue v = int_value(obj, what, "integer token ids");
        if (!v.is_signed)
            throw ft::IndexError(std::string(what) + ": token id " + v.text() + out_of(n_vocab));
        check_range(v.i, 0, n_vocab, what, range_name);
        r.ids.push_back(v.i);
        return r;
    }
    if (py::isinstance<py::float_>(obj) || py::isinstance<py::bool_>(obj))
        throw ft::TypeError(std::string(what) + " must be integer token ids, got " +
                            py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>());
    py::array a = as_array(obj, what);
    if (a.ndim() == 0 && a.size() == 1 && allow_scalar && (a.dtype().kind() == 'i' || a.dtype().kind() == 'u')) {
        return in_ids(a.attr("item")(), what, n_vocab, allow_scalar, range_name);
    }
    if (a.ndim() != 1) throw ft::ValueError(std::string(what) + " must be a 1-D sequence of token ids, got shape " + shape_str(a));
    if (a.size() == 0) throw ft::ValueError(std::string(what) + " is an empty sequence (ℓ = 0)");
    check_int_array(a, what);
    if (a.dtype().kind() == 'u' && a.dtype().itemsize() == 8) {  // ids above 2^63 − 1 would wrap in the cast
        py::object mx = a.attr("max")();
        if (PyObject_RichCompareBool(mx.ptr(), py::int_(n_vocab).ptr(), Py_GE) == 1) {
            const py::object pos = a.attr("argmax")();
            throw ft::IndexError(std::string(what) + ": token id " + py::str(mx).cast<std::string>() + " at position " +
                                 py::str(pos).cast<std::string>() + out_of(n_vocab));
        }
    }
    auto ids = py::array_t<long long, py::array::c_style | py::array::forcecast>::ensure(a);
    r.ids.resize(std::size_t(ids.size()));
    const long long* p = ids.data();
    for (index_t i = 0; i < index_t(r.ids.size()); ++i) {
        check_range(p[i], i, n_vocab, what, range_name);
        r.ids[std::size_t(i)] = index_t(p[i]);
    }
    return r;
}

std::vector<index_t> prefix_lens(const py::handle& obj, index_t n) {
    if (obj.is_none()) return {};
    auto one = [](const py::handle& v) -> index_t {
        return index_t(checked_int(v, "prefix_len", LLONG_MIN, LLONG_MAX, "an int or one int per sequence").i);
    };
    const bool array = py::isinstance<py::array>(obj) && py::reinterpret_borrow<py::array>(obj).ndim() > 0;
    if (!array && (PyIndex_Check(obj.ptr()) || py::isinstance<py::bool_>(obj)))
        return std::vector<index_t>(std::size_t(n), one(obj));
    if (py::isinstance<py::str>(obj) || !py::isinstance<py::iterable>(obj)) one(obj);  // the TypeError
    std::vector<index_t> p;
    for (py::handle v : obj) p.push_back(one(v));
    if (index_t(p.size()) != n)
        throw ft::ValueError("prefix_len: " + std::to_string(p.size()) + " lengths for a batch of " + std::to_string(n) +
                             " sequences (give an int, or one per sequence)");
    return p;
}

bool is_float_array(const py::handle& obj) {
    return py::isinstance<py::array>(obj) && py::reinterpret_borrow<py::array>(obj).dtype().kind() == 'f';
}

InBatch in_batch(const py::handle& obj, const char* what) {
    InBatch r;
    auto add = [&](const py::handle& seq, index_t b) {
        std::string name = std::string(what) + (r.was_single ? "" : "[" + std::to_string(b) + "]");
        // ids as index_t (an id that does not fit is out of any range); the ranges — [0, N_V), ℓ ≤ ℓ_max —
        // are the core's (ft::validate), checked once, by the call the ids are for
        InIds s = in_ids(seq, name.c_str(), std::numeric_limits<index_t>::max(), false);
        r.lengths.push_back(index_t(s.ids.size()));
        r.ids.insert(r.ids.end(), s.ids.begin(), s.ids.end());
    };
    if (py::isinstance<py::array>(obj)) {
        py::array a = py::reinterpret_borrow<py::array>(obj);
        if (a.ndim() == 1) {
            r.was_single = true;
            add(a, 0);
        } else if (a.ndim() == 2) {
            check_int_array(a, what);
            if (a.shape(0) == 0) throw ft::ValueError(std::string(what) + " is an empty batch");
            for (py::ssize_t b = 0; b < a.shape(0); ++b) add(a[py::int_(b)], b);
        } else {
            throw ft::ValueError(std::string(what) + " must be a 1-D sequence, a 2-D (N, ℓ) array or a list of sequences, got shape " + shape_str(a));
        }
        return r;
    }
    if (py::isinstance<py::list>(obj) || py::isinstance<py::tuple>(obj)) {
        py::sequence s = py::reinterpret_borrow<py::sequence>(obj);
        if (s.size() == 0) throw ft::ValueError(std::string(what) + " is empty");
        bool nested = !is_int_scalar(s[0]);
        if (!nested) {
            r.was_single = true;
            add(obj, 0);
        } else {
            for (std::size_t b = 0; b < s.size(); ++b) add(s[b], index_t(b));
        }
        return r;
    }
    r.was_single = true;
    add(obj, 0);
    return r;
}

template <class T>
py::array_t<T, py::array::f_style> out_matrix(index_t rows, index_t cols) {
    return py::array_t<T, py::array::f_style>({py::ssize_t(rows), py::ssize_t(cols)});
}

py::array maybe_vector(py::array a, bool vector) {
    if (!vector) return a;
    return a.attr("reshape")(py::make_tuple(a.shape(0)));
}

namespace {
std::string bound(long long b) { return b == LLONG_MAX ? "2^63 - 1" : b == LLONG_MIN ? "-2^63" : std::to_string(b); }
std::string range_text(long long lo, unsigned long long hi) {  // in the words of positive() and the core's checks
    if (hi == ULLONG_MAX) return "an integer in [" + bound(lo) + ", 2^64)";
    if (hi == LLONG_MAX && lo == 1) return "a positive integer (below 2^63)";
    if (hi == LLONG_MAX && lo != LLONG_MIN) return ">= " + bound(lo) + " (an integer below 2^63)";
    return "an integer in [" + bound(lo) + ", " + (hi > LLONG_MAX ? std::to_string(hi) : bound((long long)hi)) + "]";
}
std::string type_name(const py::handle& v) { return py::str(py::type::handle_of(v).attr("__name__")).cast<std::string>(); }
}  // namespace

std::string IntValue::text() const { return py::str(exact).cast<std::string>(); }

IntValue int_value(const py::handle& v, const std::string& name, const char* expected) {
    if (py::isinstance<py::bool_>(v) || !PyIndex_Check(v.ptr()))
        throw ft::TypeError(name + " must be " + expected + ", got " + type_name(v));
    IntValue r;
    r.exact = py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr()));
    if (!r.exact) throw py::error_already_set();
    int overflow = 0;
    const long long s = PyLong_AsLongLongAndOverflow(r.exact.ptr(), &overflow);
    if (s == -1 && PyErr_Occurred()) throw py::error_already_set();
    if (overflow == 0) {
        r.is_signed = true, r.i = s;
    } else if (overflow > 0) {
        const unsigned long long u = PyLong_AsUnsignedLongLong(r.exact.ptr());
        if (u == ULLONG_MAX && PyErr_Occurred()) PyErr_Clear();  // 2^64 or more: neither
        else r.is_unsigned = true, r.u = u;
    }
    return r;
}

IntValue checked_int(const py::handle& v, const std::string& name, long long lo, unsigned long long hi,
                     const char* expected) {
    IntValue r = int_value(v, name, expected);
    const bool in = r.is_signed ? r.i >= lo && (r.i < 0 || static_cast<unsigned long long>(r.i) <= hi)
                                : r.is_unsigned && r.u <= hi;
    if (!in) throw ft::ValueError(name + " must be " + range_text(lo, hi) + ", got " + r.text());
    return r;
}

long long int_arg(const py::handle& v, const char* name, long long lo, long long hi) {
    return checked_int(v, name, lo, static_cast<unsigned long long>(hi)).i;
}

ft::OptionValue option_value(const py::handle& v, const std::string& name) {
    if (v.is_none()) return std::monostate{};
    if (py::isinstance<py::bool_>(v)) return v.cast<bool>();
    if (PyIndex_Check(v.ptr())) {
        const IntValue i = checked_int(v, name, LLONG_MIN, ULLONG_MAX);
        if (i.is_signed) return std::int64_t(i.i);
        return std::uint64_t(i.u);
    }
    if (py::isinstance<py::str>(v)) return v.cast<std::string>();
    if (PyFloat_Check(v.ptr()) || PyNumber_Check(v.ptr())) {
        const double d = PyFloat_AsDouble(v.ptr());
        if (!(d == -1.0 && PyErr_Occurred())) return d;
        PyErr_Clear();
    }
    throw ft::TypeError(name + " must be a bool, an int, a real number, a str or None, got " + type_name(v));
}

std::uint64_t seed_arg(const py::handle& v, const char* name) {
    const IntValue i = checked_int(v, name, 0, ULLONG_MAX, "an int (or None)");
    return i.is_signed ? std::uint64_t(i.i) : std::uint64_t(i.u);
}

double float_arg(const py::handle& v, const char* name) {
    if (py::isinstance<py::bool_>(v) || !(PyFloat_Check(v.ptr()) || PyIndex_Check(v.ptr()) || PyNumber_Check(v.ptr())) ||
        py::isinstance<py::str>(v))
        throw ft::TypeError(std::string(name) + " must be a real number, got " +
                            py::str(py::type::handle_of(v).attr("__name__")).cast<std::string>());
    const double d = PyFloat_AsDouble(v.ptr());
    if (d == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        throw ft::TypeError(std::string(name) + " must be a real number");
    }
    return d;
}

index_t positive(long long v, const char* name) {
    if (v <= 0) throw ft::ValueError(std::string(name) + " must be a positive integer, got " + std::to_string(v));
    return index_t(v);
}

// ------------------------------------------------------------------------------------------------------
py::array ParamDict::get(const std::string& name) const {
    const auto it = index_.find(name);
    if (it == index_.end()) throw py::key_error("no parameter named '" + name + "'");
    return arrays_[it->second];
}

std::recursive_mutex* ParamDict::owner_mutex() const {
    if (!py::isinstance<HasParams>(owner_)) return nullptr;
    return &owner_.cast<HasParams&>().mutex;
}

py::array ParamDict::checked_source(const std::string& name, const py::object& value) const {
    py::array dst = get(name);
    if (!writable_) throw ft::ValueError("this ParamDict is read-only");
    py::array src = as_array(value, name.c_str());
    const char kind = src.dtype().kind();
    if (kind != 'f' && kind != 'i' && kind != 'u')
        throw ft::TypeError("params['" + name + "'] must be set from a real-valued array, got dtype " + kind_name(src));
    bool same = src.ndim() == dst.ndim();
    for (py::ssize_t i = 0; same && i < src.ndim(); ++i) same = src.shape(i) == dst.shape(i);
    if (!same)
        throw ft::ValueError("params['" + name + "'] has shape " + shape_str(dst) + ", cannot assign shape " + shape_str(src));
    return src;
}

void ParamDict::set(const std::string& name, const py::object& value) {
    py::array src = checked_source(name, value);
    std::optional<CallLock> lock;
    if (std::recursive_mutex* m = owner_mutex()) lock.emplace(*m);
    py::module_::import("numpy").attr("copyto")(get(name), src, py::arg("casting") = "unsafe");
}

void ParamDict::update(const py::dict& values) {
    std::vector<std::pair<py::array, py::array>> todo;  // (destination, checked source)
    for (auto kv : values) {
        if (!py::isinstance<py::str>(kv.first))
            throw ft::TypeError("parameter names are strings, got " + std::string(py::str(py::type::handle_of(kv.first).attr("__name__"))));
        const std::string name = kv.first.cast<std::string>();
        todo.emplace_back(get(name), checked_source(name, py::reinterpret_borrow<py::object>(kv.second)));
    }
    py::object copyto = py::module_::import("numpy").attr("copyto");
    // all or nothing for other threads too: no call of the owner runs between the first copy and the last
    std::optional<CallLock> lock;
    if (std::recursive_mutex* m = owner_mutex()) lock.emplace(*m);
    for (auto& [dst, src] : todo) copyto(dst, src, py::arg("casting") = "unsafe");
}

bool ParamDict::contains(const py::object& name) const {
    if (!py::isinstance<py::str>(name)) return false;
    return index_.count(name.cast<std::string>()) != 0;
}

std::string ParamDict::repr() const {
    std::ostringstream s;
    s << "ParamDict({";
    for (std::size_t i = 0; i < names_.size(); ++i)
        s << (i ? ", " : "") << "'" << names_[i] << "': " << shape_str(arrays_[i]);
    s << "})";
    return s.str();
}

template <class T>
ParamDict make_param_dict(const py::object& owner, ft::ParamStore<T>& store, bool grads) {
    return param_views(owner, store, grads ? store.grad() : store.theta());
}

template <class T>
ParamDict param_views(const py::object& owner, const ft::ParamStore<T>& store, T* base) {
    std::vector<std::string> names;
    std::vector<py::array> arrays;
    for (const ft::ParamInfo& e : store.entries()) {
        std::vector<py::ssize_t> shape(e.shape.begin(), e.shape.end()), strides;
        for (index_t s : e.strides) strides.push_back(py::ssize_t(s * index_t(sizeof(T))));
        py::array a(py::dtype::of<T>(), shape, strides, base + e.offset, owner);
        names.push_back(e.name);
        arrays.push_back(std::move(a));
    }
    return ParamDict(owner, std::move(names), std::move(arrays), true);
}

template <class T>
py::dict grads_copy(const ft::ParamStore<T>& store) {
    py::array_t<T> flat(py::ssize_t(store.size()));
    std::copy(store.grad(), store.grad() + store.size(), flat.mutable_data());
    const ParamDict views = param_views(flat, store, flat.mutable_data());
    py::dict d;
    for (std::size_t i = 0; i < views.names().size(); ++i) d[py::str(views.names()[i])] = views.arrays()[i];
    return d;
}

template InMatrix<float> in_matrix<float>(const py::handle&, const char*, index_t, bool, const char*);
template InMatrix<double> in_matrix<double>(const py::handle&, const char*, index_t, bool, const char*);
template py::array_t<float, py::array::f_style> out_matrix<float>(index_t, index_t);
template py::array_t<double, py::array::f_style> out_matrix<double>(index_t, index_t);
template ParamDict make_param_dict<float>(const py::object&, ft::ParamStore<float>&, bool);
template ParamDict make_param_dict<double>(const py::object&, ft::ParamStore<double>&, bool);
template ParamDict param_views<float>(const py::object&, const ft::ParamStore<float>&, float*);
template ParamDict param_views<double>(const py::object&, const ft::ParamStore<double>&, double*);
template py::dict grads_copy<float>(const ft::ParamStore<float>&);
template py::dict grads_copy<double>(const ft::ParamStore<double>&);

}  // namespace ftpy
