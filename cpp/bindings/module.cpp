// The private extension module formal_transformers._core. Python re-exports it (__init__.py).
#include <algorithm>
#include <chrono>

#include "bind.hpp"
#include "formal_transformers/blas.hpp"

namespace ftpy {

namespace {
// Ctrl-C: long core loops call ft::poll() between steps/layers with the GIL released. At most every
// ~10 ms we take the GIL back and run Python's signal handlers; a pending KeyboardInterrupt is thrown as
// error_already_set, unwinds the core (which updates nothing after a poll point fails) and is re-raised.
void install_poll_hook() {
    ft::set_poll_hook([] {
        using clock = std::chrono::steady_clock;
        static thread_local clock::time_point last = clock::now();
        const auto now = clock::now();
        if (now - last < std::chrono::milliseconds(10)) return;
        last = now;
        ft::FpCallerEnv caller_env;  // Python's signal handlers run in the caller's FP environment
        py::gil_scoped_acquire gil;
        if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    });
}
}  // namespace

void register_common(py::module_& m) {
    // Exceptions: the core's types map to the Python exception of the same name.
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const ft::IndexError& e) {
            PyErr_SetString(PyExc_IndexError, e.what());
        } catch (const ft::TypeError& e) {
            PyErr_SetString(PyExc_TypeError, e.what());
        } catch (const ft::ValueError& e) {
            PyErr_SetString(PyExc_ValueError, e.what());
        } catch (const ft::Interrupted&) {
            PyErr_SetNone(PyExc_KeyboardInterrupt);
        }
    });

    py::class_<HasParams>(m, "_HasParams", "Base of every object with parameters (params, grads).");

    py::class_<ParamDict>(m, "ParamDict",
                          "name -> numpy view of a parameter (or gradient) stored in C++ (zero-copy, writable).")
        .def("__getitem__", &ParamDict::get)
        .def("__setitem__", &ParamDict::set)
        .def("__contains__", &ParamDict::contains)
        .def("__len__", [](const ParamDict& d) { return d.names().size(); })
        .def("__iter__", [](const ParamDict& d) { return py::iter(py::cast(d.names())); })
        .def("keys", [](const ParamDict& d) { return d.names(); })
        .def("values", [](const ParamDict& d) { return d.arrays(); })
        .def("items",
             [](const ParamDict& d) {
                 py::list out;
                 for (std::size_t i = 0; i < d.names().size(); ++i) out.append(py::make_tuple(d.names()[i], d.arrays()[i]));
                 return out;
             })
        .def("get",
             [](const ParamDict& d, const py::object& k, const py::object& dflt) -> py::object {
                 if (d.contains(k)) return d.get(k.cast<std::string>());
                 return dflt;
             },
             py::arg("key"), py::arg("default") = py::none())
        .def("copy",
             [](const ParamDict& d) {
                 py::dict out;
                 for (std::size_t i = 0; i < d.names().size(); ++i)
                     out[py::str(d.names()[i])] = d.arrays()[i].attr("copy")();
                 return out;
             },
             "A plain dict of copies (a snapshot that later steps do not change).")
        .def("update",
             [](ParamDict& d, const py::dict& values) { d.update(values); },
             "Copy arrays into the named parameters, all or nothing: every name, dtype and shape is checked "
             "before anything is written.")
        .def("__repr__", &ParamDict::repr);

    m.def(
        "set_num_threads",
        [](const PyInt& n) {  // the core checks [1, max_num_threads()] of an int
            const long long v = int_arg(n, "n");
            if (v < INT_MIN || v > INT_MAX)
                throw ft::ValueError("set_num_threads: n = " + std::to_string(v) + " is outside [1, max_num_threads() = " +
                                     std::to_string(ft::max_num_threads()) + "]");
            ft::set_num_threads(int(v));
        },
        py::arg("n"),
          "Threads for the element-wise kernels and the BLAS (one shared OpenMP pool): 1 <= n <= max_num_threads(), "
          "else ValueError.");
    m.def("get_num_threads", &ft::get_num_threads);
    m.def("max_num_threads", &ft::max_num_threads,
          "The largest n set_num_threads accepts: 4 per CPU (at least 64), within OMP_THREAD_LIMIT and, under an "
          "address-space limit (ulimit -v), half of it at one thread stack per thread.");
    m.def("blas_info", &ft::blas_info,
          "The BLAS in use: OpenBLAS's build configuration, the kernel set it chose for this CPU, and its threads.");
    m.def("blas_kernel", &ft::blas_kernel,
          "The kernel set OpenBLAS chose for this CPU at load time, e.g. 'Haswell', 'SkylakeX', 'Zen' "
          "('Prescott', 'Core2', 'Nehalem' are generic fallbacks: slow on a CPU with AVX2).");
}

void register_vit(py::module_& m);  // register_vit.cpp
}  // namespace ftpy

PYBIND11_MODULE(_core, m) {
    m.doc() = "formal-transformers native core (C++17, xtensor, OpenBLAS)";
    ft::init_threads();
    ft::blas_set_num_threads(ft::get_num_threads());  // the BLAS's jobs on our pool, as many threads as it has
    ftpy::install_poll_hook();
    // The module's groups, one register_*.cpp each, in this order: later groups use the types of earlier
    // ones (every class with parameters derives from _HasParams; models return ParamDicts).
    ftpy::register_common(m);        // exceptions, _HasParams, ParamDict, threads
    ftpy::register_functions(m);     // GELU, ReLU, softmax (§3)
    ftpy::register_norm(m);          // Algorithm 6 and RMSnorm
    ftpy::register_embedding(m);     // Algorithms 1, 2
    ftpy::register_attention(m);     // Algorithms 3, 4, 5 and the masks
    ftpy::register_unembedding(m);   // Algorithm 7
    ftpy::register_transformers(m);  // Algorithms 8, 9, 10
    ftpy::register_optim(m);         // §8: SGD, Adam
    ftpy::register_tokenizer(m);     // §4
    ftpy::register_training(m);      // Algorithms 11, 12, 13
    ftpy::register_inference(m);     // Algorithms 14, 15
    ftpy::register_vit(m);           // listing V14: the vision transformer
}
