// Algorithm 7: Unembedding as a stand-alone Python object; and the private _gemm used by bench/bench_gemm.py.
#include <cmath>

#include "bind.hpp"
#include "formal_transformers/bf16_products.hpp"
#include "formal_transformers/precision.hpp"
#include "formal_transformers/blas.hpp"
#include "formal_transformers/units.hpp"

namespace ftpy {

namespace {
// Algorithm 7 as the core's stand-alone component (units.hpp): e (d_e,) or (d_e, ℓ) -> p.
template <class T>
using UnembeddingUnit = ft::unit::Unembedding<T>;

template <class T>
py::array call_unembedding(ft::unit::Unembedding<T>& u, const py::handle& e, bool logits) {
    InMatrix<T> in = in_matrix<T>(e, "e", u.un.d_e, true, "d_e");
    auto out = out_matrix<T>(u.un.n_vocab, in.m.cols);
    {
        CoreCall nogil;
        ft::MatView<T> O(out.mutable_data(), u.un.n_vocab, in.m.cols);
        if (logits)
            u.logits(in.m, O);
        else
            u.forward(in.m, O, in.was_vector);
    }
    return maybe_vector(out, in.was_vector);
}
// ----------------------------------------------------------------------------------------------------
// _gemm: C = op(A) op(B) through ft::gemm (one BLAS call), for the GFLOP/s benchmark.
template <class T>
struct GemmOperand {
    py::array keep;
    ft::CMatView<T> M;      // the stored column-major matrix
    bool stored_transposed;  // M is the user's matrix transposed (a C-contiguous input, no copy)
    index_t rows, cols;      // the user's shape
};

template <class T>
GemmOperand<T> gemm_operand(const py::handle& obj, const char* what) {
    py::array a = py::isinstance<py::array>(obj) ? py::reinterpret_borrow<py::array>(obj)
                                                 : py::array(py::module_::import("numpy").attr("asarray")(obj));
    if (a.dtype().kind() != 'f')
        throw ft::TypeError(std::string(what) + " must be a float array, got dtype " + py::str(a.dtype()).cast<std::string>());
    if (a.ndim() != 2) throw ft::ValueError(std::string(what) + " must be 2-D, got shape " + shape_str(a));
    GemmOperand<T> r;
    r.rows = index_t(a.shape(0));
    r.cols = index_t(a.shape(1));
    if (r.rows == 0 || r.cols == 0) throw ft::ValueError(std::string(what) + " is empty (shape " + shape_str(a) + ")");
    const bool c_contig = (a.flags() & py::array::c_style) != 0, f_contig = (a.flags() & py::array::f_style) != 0;
    if (a.dtype().equal(py::dtype::of<T>()) && c_contig && !f_contig) {
        r.keep = a;
        r.M = ft::CMatView<T>(static_cast<const T*>(a.data()), r.cols, r.rows);
        r.stored_transposed = true;
        return r;
    }
    InMatrix<T> in = in_matrix<T>(a, what, -1, false);
    r.keep = in.arr;
    r.M = in.m;
    r.stored_transposed = false;
    return r;
}

template <class T>
py::array gemm_py(const py::handle& Ao, const py::handle& Bo, bool transA, bool transB, bool bf16) {
    GemmOperand<T> A = gemm_operand<T>(Ao, "A"), B = gemm_operand<T>(Bo, "B");
    const index_t m = transA ? A.cols : A.rows, k = transA ? A.rows : A.cols;
    const index_t kb = transB ? B.cols : B.rows, n = transB ? B.rows : B.cols;
    if (k != kb)
        throw ft::ValueError("op(A) is (" + std::to_string(m) + ", " + std::to_string(k) + ") but op(B) is (" +
                             std::to_string(kb) + ", " + std::to_string(n) + "): inner dimensions differ");
    const ft::Op opA = (transA != A.stored_transposed) ? ft::Op::T : ft::Op::N;
    const ft::Op opB = (transB != B.stored_transposed) ? ft::Op::T : ft::Op::N;
    auto C = out_matrix<T>(m, n);
    {
        CoreCall nogil;
        ft::ProductScope products(ft::ProductContext{bf16});
        ft::gemm<T>(opA, opB, T(1), A.M, B.M, T(0), ft::MatView<T>(C.mutable_data(), m, n));
    }
    return std::move(C);
}
}  // namespace

void register_unembedding(py::module_& m) {
    using DU = AnyDtype<UnembeddingUnit>;
    py::class_<DU, HasParams> un(m, "Unembedding",
                      "Algorithm 7 (unembedding): p = softmax(W_u e), the column softmax (max-subtracted).\n\n"
                      "Unembedding(n_vocab, d_e, *, dtype='float32', seed=0)\n"
                      "Hyperparameters: n_vocab (N_V), d_e.\n"
                      "Parameters: W_u (N_V, d_e), initialised W_u ~ N(0, 1/fan_in) (fan_in = d_e) from ft's\n"
                      "  Rng(seed).\n"
                      "Call: e (d_e,) -> p (N_V,), or E (d_e, ℓ) -> P (N_V, ℓ) (every column). The input is copied.\n"
                      "logits(e): W_u e, same shapes (does not change what backward() differentiates).\n"
                      "backward(dP): dP, the gradient of a loss with respect to the last call's p -> dE of e's\n"
                      "  shape; accumulates grads['W_u'].\n"
                      "Inputs: float arrays of either precision, any layout (zero-copy when already this dtype and F-contiguous,\n"
                      "  otherwise converted once); non-float arrays -> TypeError. NaN is not checked: it propagates as\n"
                      "  numpy's arithmetic of the listing (reference.py) would.");
    un.def(py::init([](const PyInt& n_vocab, const PyInt& d_e, const py::object& dtype, const py::object& seed) {
               return std::make_unique<DU>(parse_dtype(dtype), positive(n_vocab, "n_vocab"), positive(d_e, "d_e"),
                                           seed_arg(seed));
           }),
           py::arg("n_vocab"), py::arg("d_e"), py::kw_only(), py::arg("dtype") = "float32", py::arg("seed") = 0)
        .def("__call__",
             [](DU& d, const py::handle& e) { CallLock l(d.mutex); return d.visit([&](auto& u) { return call_unembedding(u, e, false); }); },
             py::arg("e"), "e (d_e,) or (d_e, ℓ) -> p (N_V,) or (N_V, ℓ).")
        .def("logits",
             [](DU& d, const py::handle& e) { CallLock l(d.mutex); return d.visit([&](auto& u) { return call_unembedding(u, e, true); }); },
             py::arg("e"), "W_u e: (d_e,) or (d_e, ℓ) -> (N_V,) or (N_V, ℓ).")
        .def("backward",
             [](DU& d, const py::handle& dP) { CallLock l(d.mutex); return d.visit([&](auto& u) { using T = typename std::decay_t<decltype(u.store)>::value_type; return unit_backward<T>(u, dP, "dP", u.un.n_vocab, "n_vocab", u.un.d_e); }); },
             py::arg("dP"), "Gradient of the last call: dP (N_V, ℓ) -> dE (d_e, ℓ); accumulates grads['W_u'].")
        .def_property_readonly("n_vocab", [](DU& d) { return d.visit([](auto& u) { return u.un.n_vocab; }); })
        .def_property_readonly("d_e", [](DU& d) { return d.visit([](auto& u) { return u.un.d_e; }); })
        .def("__repr__", [](DU& d) {
            return d.visit([&](auto& u) {
                return "Unembedding(n_vocab=" + std::to_string(u.un.n_vocab) + ", d_e=" + std::to_string(u.un.d_e) +
                       ", dtype='" + d.dtype() + "')";
            });
        });
    def_params_api<UnembeddingUnit>(un);

    m.def(
        "_gemm",
        [](const py::handle& A, const py::handle& B, bool transA, bool transB, const std::string& precision) -> py::array {
            const bool bf16 = ft::parse_precision(precision) == ft::Precision::BF16Mixed;
            py::array a = py::isinstance<py::array>(A) ? py::reinterpret_borrow<py::array>(A)
                                                       : py::array(py::module_::import("numpy").attr("asarray")(A));
            if (a.dtype().kind() == 'f' && a.dtype().itemsize() == 4) return gemm_py<float>(A, B, transA, transB, bf16);
            if (bf16) throw ft::ValueError("precision 'bf16-mixed' takes float32 operands (float64 products stay float64)");
            return gemm_py<double>(A, B, transA, transB, false);
        },
        py::arg("A"), py::arg("B"), py::arg("transA") = false, py::arg("transB") = false, py::kw_only(),
        py::arg("precision") = "float32",
        "Private (benchmarks): C = op(A) op(B) by one call of the core's gemm (OpenBLAS), in A's precision "
        "(float32 stays float32, any other float is float64). C-contiguous inputs of that dtype are used "
        "without a copy (as a transposed column-major matrix); other layouts are copied once. precision='bf16-mixed' "
        "(float32 only): the operands rounded to bfloat16, float32 accumulation (the bf16-mixed models' products).");
    m.def("_bf16_allow_native", &ft::bf16_allow_native, py::arg("on"),
          "Private (tests): False runs bf16-mixed products emulated (bf16-rounded operands, float32 products) even "
          "where the CPU has bf16 instructions; True restores the default.");
    m.def("_bf16_allow_theta_copy", &ft::bf16_allow_theta_copy, py::arg("on"),
          "Private (tests): False makes bf16-mixed training calls round θ's operands at every product instead of "
          "reading θ's bf16 copy (the same results); True restores the default.");
    m.def("_bf16_allow_kept_inputs", &ft::bf16_allow_kept_inputs, py::arg("on"),
          "Private (tests): False makes bf16-mixed training calls round an affine map's input again for the "
          "backward's dW instead of reading the rounding its forward product kept (the same results); True restores "
          "the default.");
    m.def("_bf16_kept_inputs_read", &ft::bf16_kept_inputs_read,
          "Private (tests): how many bf16-mixed products in this process have read an affine input's rounding kept "
          "from its forward product.");
    m.def("_bf16_theta_copies", &ft::bf16_theta_copies,
          "Private (tests): how many bf16 copies of θ decoding calls in bf16-mixed have made in this process (a call "
          "on an unchanged θ makes none).");
    m.def("bf16_info", &ft::bf16_info,
          "The CPU's bfloat16 instructions (AVX512_BF16, AMX-BF16) and what runs precision='bf16-mixed' products: "
          "oneDNN on those instructions, or emulated (bf16-rounded operands, float32 products through the BLAS).");
}


}  // namespace ftpy
