// Algorithm 6: LayerNorm and RMSNorm as stand-alone Python objects.
#include "bind.hpp"
#include "formal_transformers/units.hpp"

namespace ftpy {

namespace {
// Algorithm 6 and RMSnorm as the core's stand-alone components (units.hpp): e (d_e,) or (d_e, ℓ) -> ê.
template <class T>
using LayerNormUnit = ft::unit::LayerNorm<T>;
template <class T>
using RMSNormUnit = ft::unit::RMSNorm<T>;

template <class U>
py::array call_norm(U& u, const py::handle& e) {
    using T = typename decltype(u.store)::value_type;
    InMatrix<T> in = in_matrix<T>(e, "e", u.norm.d_e, true, "d_e");
    auto out = out_matrix<T>(u.norm.d_e, in.m.cols);
    {
        CoreCall nogil;
        u.forward(in.m, ft::MatView<T>(out.mutable_data(), u.norm.d_e, in.m.cols), in.was_vector);
    }
    return maybe_vector(out, in.was_vector);
}
}  // namespace

void register_norm(py::module_& m) {
    using DL = AnyDtype<LayerNormUnit>;
    py::class_<DL, HasParams> ln(m, "LayerNorm",
                      "Algorithm 6: ê ← layer_norm(e | γ, β) = (e − m)/√(v + eps) ⊙ γ + β, per column.\n\n"
                      "Hyperparameters: d_e, eps (inside the square root; eps=0 is the listing exactly).\n"
                      "Parameters: gamma (d_e,) = 1, beta (d_e,) = 0.\n"
                      "Call: e (d_e,) or (d_e, ℓ) -> ê of the same shape. backward(dÊ) -> dE.");
    ln.def(py::init([](const PyInt& d_e, double eps, const py::object& dtype) {
               return std::make_unique<DL>(parse_dtype(dtype), positive(d_e, "d_e"), eps);
           }),
           py::arg("d_e"), py::arg("eps") = 1e-5, py::arg("dtype") = "float32")
        .def("__call__", [](DL& d, const py::handle& e) { CallLock l(d.mutex); return d.visit([&](auto& u) { return call_norm(u, e); }); },
             py::arg("e"))
        .def("backward", [](DL& d, const py::handle& dy) { CallLock l(d.mutex); return d.visit([&](auto& u) { using T = typename std::decay_t<decltype(u.store)>::value_type; return unit_backward<T>(u, dy, "dY", u.norm.d_e, "d_e", u.norm.d_e); }); },
             py::arg("dY"), "Gradient of the last call: accumulates d gamma, d beta into grads; returns dE.")
        .def_property_readonly("d_e", [](DL& d) { return d.visit([](auto& u) { return u.norm.d_e; }); })
        .def_property_readonly("eps", [](DL& d) { return d.visit([](auto& u) { return u.norm.eps; }); })
        .def("__repr__", [](DL& d) {
            return d.visit([&](auto& u) {
                return "LayerNorm(d_e=" + std::to_string(u.norm.d_e) + ", eps=" + py::repr(py::float_(u.norm.eps)).cast<std::string>() +
                       ", dtype='" + d.dtype() + "')";
            });
        });
    def_params_api<LayerNormUnit>(ln);

    using DR = AnyDtype<RMSNormUnit>;
    py::class_<DR, HasParams> rn(m, "RMSNorm",
                      "Gopher's RMSnorm variant of Algorithm 6: ê = e / √(Σ e²/d_e + eps) ⊙ γ, per column.\n\n"
                      "Parameters: gamma (d_e,) = 1. Call: e (d_e,) or (d_e, ℓ) -> ê. backward(dÊ) -> dE.");
    rn.def(py::init([](const PyInt& d_e, double eps, const py::object& dtype) {
               return std::make_unique<DR>(parse_dtype(dtype), positive(d_e, "d_e"), eps);
           }),
           py::arg("d_e"), py::arg("eps") = 1e-5, py::arg("dtype") = "float32")
        .def("__call__", [](DR& d, const py::handle& e) { CallLock l(d.mutex); return d.visit([&](auto& u) { return call_norm(u, e); }); },
             py::arg("e"))
        .def("backward", [](DR& d, const py::handle& dy) { CallLock l(d.mutex); return d.visit([&](auto& u) { using T = typename std::decay_t<decltype(u.store)>::value_type; return unit_backward<T>(u, dy, "dY", u.norm.d_e, "d_e", u.norm.d_e); }); },
             py::arg("dY"))
        .def_property_readonly("d_e", [](DR& d) { return d.visit([](auto& u) { return u.norm.d_e; }); })
        .def_property_readonly("eps", [](DR& d) { return d.visit([](auto& u) { return u.norm.eps; }); })
        .def("__repr__", [](DR& d) {
            return d.visit([&](auto& u) {
                return "RMSNorm(d_e=" + std::to_string(u.norm.d_e) + ", eps=" + py::repr(py::float_(u.norm.eps)).cast<std::string>() +
                       ", dtype='" + d.dtype() + "')";
            });
        });
    def_params_api<RMSNormUnit>(rn);
}


}  // namespace ftpy
