// Free functions: softmax (over columns, as the paper defines it), gelu, relu, the two masks.
#include "bind.hpp"
#include "formal_transformers/functions.hpp"

namespace ftpy {

namespace {
// Apply `f(T* col, n)`-style kernels to a float array of any layout; result has the input's dtype.
template <class T, class F>
py::array apply_columns(const py::handle& A, const char* what, F f) {
    InMatrix<T> in = in_matrix<T>(A, what, -1, true);
    auto out = out_matrix<T>(in.m.rows, in.m.cols);
    ft::MatView<T> O(out.mutable_data(), in.m.rows, in.m.cols);
    std::copy(in.m.data, in.m.data + in.m.size(), O.data);
    {
        CoreCall nogil;
        f(O);
    }
    return maybe_vector(out, in.was_vector);
}

template <class F>
py::array dispatch(const py::handle& A, const char* what, F f) {
    py::array a = py::isinstance<py::array>(A) ? py::reinterpret_borrow<py::array>(A)
                                                : py::array(py::module_::import("numpy").attr("asarray")(A));
    if (a.dtype().kind() == 'f' && a.dtype().itemsize() == 4) return f(float{});
    return f(double{});
}
}  // namespace

void register_functions(py::module_& m) {
    m.def(
        "softmax",
        [](const py::handle& A) {
            return dispatch(A, "A", [&](auto tag) {
                using T = decltype(tag);
                return apply_columns<T>(A, "A", [](ft::MatView<T> O) { ft::softmax_columns<T>(O); });
            });
        },
        py::arg("A"),
        "softmax(A)[t1, t2] = exp(A[t1, t2]) / Σ_t exp(A[t, t2]): over each column (the paper's definition; "
        "a 1-D input is one column). -inf entries get probability 0; the column max is subtracted first.");
    m.def(
        "gelu",
        [](const py::handle& A, const std::string& approximate) {
            if (approximate != "none" && approximate != "tanh")
                throw ft::ValueError("approximate must be 'none' (exact x·Φ(x)) or 'tanh', got '" + approximate + "'");
            const ft::Activation act = approximate == "tanh" ? ft::Activation::GeluTanh : ft::Activation::Gelu;
            return dispatch(A, "A", [&](auto tag) {
                using T = decltype(tag);
                return apply_columns<T>(A, "A", [&](ft::MatView<T> O) { ft::activation_forward<T>(act, O, O); });
            });
        },
        py::arg("A"), py::arg("approximate") = "none",
        "GELU(x) = x·Φ(x) element-wise (exact, with erf); approximate='tanh' gives GPT-2's approximation.");
    m.def(
        "relu",
        [](const py::handle& A) {
            return dispatch(A, "A", [&](auto tag) {
                using T = decltype(tag);
                return apply_columns<T>(A, "A", [](ft::MatView<T> O) { ft::activation_forward<T>(ft::Activation::Relu, O, O); });
            });
        },
        py::arg("A"), "ReLU(x) = max(0, x) element-wise.");
}


}  // namespace ftpy
