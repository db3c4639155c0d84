// Algorithms 1 and 2: TokenEmbedding and PositionalEmbedding as stand-alone Python objects.
#include <cmath>
#include <limits>

#include "bind.hpp"
#include "formal_transformers/units.hpp"

namespace ftpy {

namespace {
// Positions (Algorithm 2's ℓ, 0-based): an int or a 1-D integer array/list, every entry in [0, l_max).
// (in_ids of bind.hpp speaks of "token ids"; positions get their own message.)
InIds in_positions(const py::handle& obj, const char* what, index_t l_max) {
    auto check = [&](long long v, index_t at, bool scalar) {
        if (v < 0 || v >= l_max)
            throw ft::IndexError(std::string(what) + ": position " + std::to_string(v) +
                                 (scalar ? std::string() : " (entry " + std::to_string(at) + ")") +
                                 " is out of range [0, " + std::to_string(l_max) + ") (l_max = " +
                                 std::to_string(l_max) + ")");
        return index_t(v);
    };
    auto type_name = [](const py::handle& o) {
        return py::str(py::type::handle_of(o).attr("__name__")).cast<std::string>();
    };
    InIds r;
    if (obj.is_none()) throw ft::TypeError(std::string(what) + " must be an int position or a 1-D integer array, got None");
    if (py::isinstance<py::bool_>(obj) || py::isinstance<py::float_>(obj) || py::isinstance<py::str>(obj) ||
        py::isinstance<py::bytes>(obj))
        throw ft::TypeError(std::string(what) + " must be integer positions, got " + type_name(obj));
    if (py::isinstance<py::int_>(obj)) {
        r.was_scalar = true;
        const IntValue v = int_value(obj, what, "integer positions");
        if (!v.is_signed)  // beyond 64 bits: a position out of range
            throw ft::IndexError(std::string(what) + ": position " + v.text() + " is out of range [0, " +
                                 std::to_string(l_max) + ")");
        r.ids.push_back(check(v.i, 0, true));
        return r;
    }
    py::array a;
    try {
        a = py::module_::import("numpy").attr("asarray")(obj);
    } catch (py::error_already_set& e) {
        throw ft::TypeError(std::string(what) + " could not be read as an array of positions: " + e.what());
    }
    const char kind = a.dtype().kind();
    if (a.ndim() == 1 && a.size() == 0) throw ft::ValueError(std::string(what) + " is an empty sequence of positions");
    if (kind != 'i' && kind != 'u')
        throw ft::TypeError(std::string(what) + " must hold integer positions, got dtype " +
                            py::str(a.dtype()).cast<std::string>());
    if (a.ndim() == 0) return in_positions(a.attr("item")(), what, l_max);  // a numpy integer: a Python int
    if (a.ndim() != 1)
        throw ft::ValueError(std::string(what) + " must be an int or a 1-D array of positions, got shape " + shape_str(a));
    if (kind == 'u' && a.dtype().itemsize() == 8) {  // uint64 beyond int64's range would wrap when converted
        const auto mx = a.attr("max")().cast<unsigned long long>();
        if (mx >= (unsigned long long)l_max)
            throw ft::IndexError(std::string(what) + ": position " + std::to_string(mx) + " is out of range [0, " +
                                 std::to_string(l_max) + ") (l_max = " + std::to_string(l_max) + ")");
    }
    auto p = py::array_t<long long, py::array::c_style | py::array::forcecast>::ensure(a);
    r.ids.resize(std::size_t(p.size()));
    for (py::ssize_t i = 0; i < p.size(); ++i) r.ids[std::size_t(i)] = check(p.data()[i], index_t(i), false);
    return r;
}

// Token ids through bind.hpp's in_ids, with two gaps closed locally (reported for bind.cpp): a Python int
// beyond int64 (e.g. 2**70, np.uint64(2**63)) made pybind11 raise RuntimeError, and uint64 ids >= 2**63
// wrapped to a negative id in the message. Both are ids out of range: IndexError naming the id.
InIds in_token_ids(const py::handle& v, const char* what, index_t n_vocab) {
    const std::string range = " is out of range [0, " + std::to_string(n_vocab) + ") (n_vocab = " + std::to_string(n_vocab) + ")";
    if (py::isinstance<py::array>(v)) {
        py::array a = py::reinterpret_borrow<py::array>(v);
        if (a.dtype().kind() == 'u' && a.dtype().itemsize() == 8 && a.ndim() == 1 && a.size() > 0) {
            const auto pos = a.attr("argmax")().cast<long long>();
            const auto mx = a.attr("__getitem__")(pos).cast<unsigned long long>();
            if (mx >= (unsigned long long)n_vocab)
                throw ft::IndexError(std::string(what) + ": token id " + std::to_string(mx) + " at position " +
                                     std::to_string(pos) + range);
        }
    }
    try {
        return in_ids(v, what, n_vocab, true);
    } catch (py::cast_error&) {
        throw ft::IndexError(std::string(what) + ": token id " + py::str(v).cast<std::string>() + range);
    }
}

// ----------------------------------------------------------------------------------------------------
// Algorithms 1 and 2 as the core's stand-alone components (units.hpp): ids or positions in, (d_e, n) out.
template <class T>
using TokenEmbeddingUnit = ft::unit::TokenEmbedding<T>;
template <class T>
using PositionalEmbeddingUnit = ft::unit::PositionalEmbedding<T>;

template <class U>
py::array embed(U& u, const InIds& in, index_t d_e) {
    using T = typename decltype(u.store)::value_type;
    const index_t n = index_t(in.ids.size());
    auto out = out_matrix<T>(d_e, n);
    {
        CoreCall nogil;
        u.forward(in.ids.data(), n, ft::MatView<T>(out.mutable_data(), d_e, n));
    }
    return maybe_vector(out, in.was_scalar);
}
template <class U>
void embed_backward(U& u, const py::handle& dE, index_t d_e) {
    using T = typename decltype(u.store)::value_type;
    InMatrix<T> d = in_matrix<T>(dE, "dE", d_e, true, "d_e");
    CoreCall nogil;
    u.backward(d.m);
}
}  // namespace

void register_embedding(py::module_& m) {
    using DT = AnyDtype<TokenEmbeddingUnit>;
    py::class_<DT, HasParams> te(m, "TokenEmbedding",
                      "Algorithm 1 (token embedding): e = W_e[:, v].\n\n"
                      "TokenEmbedding(n_vocab, d_e, *, dtype='float32', seed=0)\n"
                      "Hyperparameters: n_vocab (N_V), d_e.\n"
                      "Parameters: W_e (d_e, N_V), initialised W_e ~ N(0, 1) from ft's Rng(seed).\n"
                      "Call: v, an int token id in [0, N_V) -> e (d_e,); or a 1-D sequence of ids (any integer\n"
                      "  dtype, or a list) -> E (d_e, ℓ), column t = W_e[:, v[t]].\n"
                      "backward(dE): dE (d_e,) or (d_e, ℓ) of the last call; scatter-adds into grads['W_e']\n"
                      "  (a token used twice receives both columns) and returns None (ids have no gradient).\n"
                      "Errors: id out of range -> IndexError naming the id and its position; float/bool ids ->\n"
                      "  TypeError; an empty sequence -> ValueError. dE: a float array of either precision, any layout;\n"
                      "  NaN in dE is not checked and lands in the gradient columns it is added to.");
    te.def(py::init([](const PyInt& n_vocab, const PyInt& d_e, const py::object& dtype, const py::object& seed) {
               return std::make_unique<DT>(parse_dtype(dtype), positive(n_vocab, "n_vocab"), positive(d_e, "d_e"),
                                           seed_arg(seed));
           }),
           py::arg("n_vocab"), py::arg("d_e"), py::kw_only(), py::arg("dtype") = "float32", py::arg("seed") = 0)
        .def("__call__", [](DT& d, const py::handle& v) {
                 CallLock l(d.mutex);
                 return d.visit([&](auto& u) { return embed(u, in_token_ids(v, "v", u.layer.n_vocab), u.layer.d_e); });
             },
             py::arg("v"), "v: int id -> (d_e,); 1-D ids -> (d_e, ℓ).")
        .def("backward",
             [](DT& d, const py::handle& dE) { CallLock l(d.mutex); d.visit([&](auto& u) { embed_backward(u, dE, u.layer.d_e); }); },
             py::arg("dE"),
             "Gradient of the last call: grads['W_e'][:, v[t]] += dE[:, t] for every t. Returns None.")
        .def_property_readonly("n_vocab", [](DT& d) { return d.visit([](auto& u) { return u.layer.n_vocab; }); })
        .def_property_readonly("d_e", [](DT& d) { return d.visit([](auto& u) { return u.layer.d_e; }); })
        .def("__repr__", [](DT& d) {
            return d.visit([&](auto& u) {
                return "TokenEmbedding(n_vocab=" + std::to_string(u.layer.n_vocab) + ", d_e=" + std::to_string(u.layer.d_e) +
                       ", dtype='" + d.dtype() + "')";
            });
        });
    def_params_api<TokenEmbeddingUnit>(te);

    using DP = AnyDtype<PositionalEmbeddingUnit>;
    py::class_<DP, HasParams> pe(m, "PositionalEmbedding",
                      "Algorithm 2 (positional embedding): e_p = W_p[:, t].\n\n"
                      "PositionalEmbedding(l_max, d_e, kind='learned', *, base=None, dtype='float32', seed=0)\n"
                      "Hyperparameters: l_max (ℓ_max), d_e, kind, base.\n"
                      "Parameters: W_p (d_e, ℓ_max).\n"
                      "  kind='learned': W_p ~ N(0, 1) from ft's Rng(seed), trained by backward().\n"
                      "  kind='sinusoidal': W_p is the paper's fixed matrix, exactly as printed (1-based i, t):\n"
                      "    W_p[2i-1, t] = sin(t / ℓ_max^(2i/d_e)), W_p[2i, t] = cos(t / ℓ_max^(2i/d_e)),\n"
                      "    stored 0-based (column j holds t = j+1; for odd d_e the last row is a sine);\n"
                      "    base (default ℓ_max) replaces ℓ_max in the formula (Vaswani et al. use 10000).\n"
                      "    This W_p is FROZEN: it stays visible in params, but backward() adds nothing to its\n"
                      "    gradient and optimizers skip it.\n"
                      "Call: t, an int position in [0, ℓ_max) -> e_p (d_e,); or a 1-D integer array of n\n"
                      "  positions -> (d_e, n). Positions out of [0, ℓ_max) -> IndexError.\n"
                      "backward(dE): dE of the last call's shape; grads['W_p'][:, t] += dE[:, j] for each\n"
                      "  position t = t_j (learned only). Returns None.\n"
                      "Positions: any integer dtype or a list; float/bool -> TypeError; empty -> ValueError.");
    pe.def(py::init([](const PyInt& l_max, const PyInt& d_e, const std::string& kind, const py::object& base,
                       const py::object& dtype, const py::object& seed) {
               ft::Positional k;
               if (kind == "learned")
                   k = ft::Positional::Learned;
               else if (kind == "sinusoidal")
                   k = ft::Positional::Sinusoidal;
               else
                   throw ft::ValueError("kind must be 'learned' or 'sinusoidal', got '" + kind + "'");
               double b = 0;  // <= 0: ℓ_max, as the paper prints it
               if (!base.is_none()) {
                   if (k != ft::Positional::Sinusoidal)
                       throw ft::ValueError("base applies only to kind='sinusoidal'");
                   if (!py::isinstance<py::int_>(base) && !py::isinstance<py::float_>(base))
                       throw ft::TypeError("base must be a number, got " +
                                           py::str(py::type::handle_of(base).attr("__name__")).cast<std::string>());
                   b = base.cast<double>();
                   if (!(b > 0) || !std::isfinite(b))
                       throw ft::ValueError("base must be a positive finite number, got " + py::repr(base).cast<std::string>());
               }
               return std::make_unique<DP>(parse_dtype(dtype), positive(l_max, "l_max"), positive(d_e, "d_e"), k, b,
                                           seed_arg(seed));
           }),
           py::arg("l_max"), py::arg("d_e"), py::arg("kind") = "learned", py::kw_only(), py::arg("base") = py::none(),
           py::arg("dtype") = "float32", py::arg("seed") = 0)
        .def("__call__", [](DP& d, const py::handle& t) {
                 CallLock l(d.mutex);
                 return d.visit([&](auto& u) { return embed(u, in_positions(t, "t", u.layer.l_max), u.layer.d_e); });
             },
             py::arg("t"), "t: int position -> (d_e,); 1-D positions -> (d_e, n).")
        .def("backward",
             [](DP& d, const py::handle& dE) { CallLock l(d.mutex); d.visit([&](auto& u) { embed_backward(u, dE, u.layer.d_e); }); },
             py::arg("dE"),
             "Gradient of the last call: grads['W_p'][:, t_j] += dE[:, j] (learned; nothing for sinusoidal). "
             "Returns None.")
        .def_property_readonly("l_max", [](DP& d) { return d.visit([](auto& u) { return u.layer.l_max; }); })
        .def_property_readonly("d_e", [](DP& d) { return d.visit([](auto& u) { return u.layer.d_e; }); })
        .def_property_readonly("kind", [](DP& d) {
            return d.visit([](auto& u) { return std::string(u.layer.kind == ft::Positional::Learned ? "learned" : "sinusoidal"); });
        })
        .def_property_readonly("base", [](DP& d) -> py::object {
            return d.visit([](auto& u) -> py::object {
                if (u.layer.kind == ft::Positional::Learned) return py::none();
                return py::float_(u.layer.base);
            });
        }, "The base of the sinusoidal formula (ℓ_max unless given); None for a learned W_p.")
        .def("__repr__", [](DP& d) {
            return d.visit([&](auto& u) {
                std::string s = "PositionalEmbedding(l_max=" + std::to_string(u.layer.l_max) + ", d_e=" + std::to_string(u.layer.d_e) +
                                ", kind='" + (u.layer.kind == ft::Positional::Learned ? "learned" : "sinusoidal") + "'";
                if (u.layer.kind == ft::Positional::Sinusoidal)
                    s += ", base=" + py::repr(py::float_(u.layer.base)).cast<std::string>();
                return s + ", dtype='" + d.dtype() + "')";
            });
        });
    def_params_api<PositionalEmbeddingUnit>(pe);
}


}  // namespace ftpy
