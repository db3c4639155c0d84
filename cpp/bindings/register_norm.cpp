// Algorithm 6: LayerNorm and RMSNorm as stand-alone Python objects.
#include "bind.hpp"
#include "formal_transformers/norm.hpp"

namespace ftpy {

namespace {
// A stand-alone norm: its own θ (γ, β), and the activations of the last call for backward().
template <class T, class Norm>
struct NormUnit {
    ft::ParamStore<T> store;
    Norm norm;
    ft::NormCache<T> cache;
    index_t last_n = -1;  // columns of the last forward call (-1: none yet)
    bool last_vector = false;

    template <class... A>
    explicit NormUnit(A&&... args) : norm(std::forward<A>(args)..., store) {
        store.allocate();
        norm.init(store);
    }

    py::array call(const py::handle& e) {
        InMatrix<T> in = in_matrix<T>(e, "e", norm.d_e, true, "d_e");
        auto out = out_matrix<T>(norm.d_e, in.m.cols);
        {
            CoreCall nogil;
            norm.forward(store, in.m, ft::MatView<T>(out.mutable_data(), norm.d_e, in.m.cols), cache);
        }
        last_n = in.m.cols;
        last_vector = in.was_vector;
        return maybe_vector(out, in.was_vector);
    }

    py::array backward(const py::handle& dy) {
        if (last_n < 0) throw ft::ValueError("backward() called before any forward call");
        InMatrix<T> d = in_matrix<T>(dy, "dY", norm.d_e, true, "d_e");
        if (d.m.cols != last_n)
            throw ft::ValueError("dY has " + std::to_string(d.m.cols) + " columns but the last forward call had " +
                                 std::to_string(last_n));
        auto dx = out_matrix<T>(norm.d_e, last_n);
        ft::MatView<T> dX(dx.mutable_data(), norm.d_e, last_n);
        std::fill(dX.data, dX.data + dX.size(), T(0));
        {
            CoreCall nogil;
            norm.backward(store, d.m, cache, dX);
        }
        return maybe_vector(dx, last_vector);
    }
};
template <class T>
using LayerNormUnit = NormUnit<T, ft::LayerNorm<T>>;
template <class T>
using RMSNormUnit = NormUnit<T, ft::RMSNorm<T>>;
}  // namespace

void register_norm(py::module_& m) {
    using DL = Dual<LayerNormUnit>;
    py::class_<DL, StoreHolder> ln(m, "LayerNorm",
                      "Algorithm 6: ê ← layer_norm(e | γ, β) = (e − m)/√(v + eps) ⊙ γ + β, per column.\n\n"
                      "Hyperparameters: d_e, eps (inside the square root; eps=0 is the listing exactly).\n"
                      "Parameters: gamma (d_e,) = 1, beta (d_e,) = 0.\n"
                      "Call: e (d_e,) or (d_e, ℓ) -> ê of the same shape. backward(dÊ) -> dE.");
    ln.def(py::init([](long long d_e, double eps, const py::object& dtype) {
               return std::make_unique<DL>(parse_dtype(dtype), positive(d_e, "d_e"), eps);
           }),
           py::arg("d_e"), py::arg("eps") = 1e-5, py::arg("dtype") = "float32")
        .def("__call__", [](DL& d, const py::handle& e) { CallLock l(d.mutex); return d.visit([&](auto& u) { return u.call(e); }); },
             py::arg("e"))
        .def("backward", [](DL& d, const py::handle& dy) { CallLock l(d.mutex); return d.visit([&](auto& u) { return u.backward(dy); }); },
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

    using DR = Dual<RMSNormUnit>;
    py::class_<DR, StoreHolder> rn(m, "RMSNorm",
                      "Gopher's RMSnorm variant of Algorithm 6: ê = e / √(Σ e²/d_e + eps) ⊙ γ, per column.\n\n"
                      "Parameters: gamma (d_e,) = 1. Call: e (d_e,) or (d_e, ℓ) -> ê. backward(dÊ) -> dE.");
    rn.def(py::init([](long long d_e, double eps, const py::object& dtype) {
               return std::make_unique<DR>(parse_dtype(dtype), positive(d_e, "d_e"), eps);
           }),
           py::arg("d_e"), py::arg("eps") = 1e-5, py::arg("dtype") = "float32")
        .def("__call__", [](DR& d, const py::handle& e) { CallLock l(d.mutex); return d.visit([&](auto& u) { return u.call(e); }); },
             py::arg("e"))
        .def("backward", [](DR& d, const py::handle& dy) { CallLock l(d.mutex); return d.visit([&](auto& u) { return u.backward(dy); }); },
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
