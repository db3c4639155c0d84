// docs/api.md "C++ API": the snippet shown there, built and run against the installed core by ctest's
// cmake_package test (keep the two the same).
#include <formal_transformers/formal_transformers.hpp>
#include <iostream>

int main() {
    ft::ModelConfig cfg;                                   // Algorithm 10's hyperparameters
    cfg.n_vocab = 10; cfg.l_max = 16; cfg.L = 2; cfg.H = 2; cfg.d_e = 16; cfg.d_mlp = 32;
    ft::DTransformer<double> m(cfg);                       // θ initialised (GPT-2's scheme, cfg.seed)
    ft::TokenIds x{1, 4, 2, 7};                            // xt::xtensor of int64 ids (0-based)
    xt::xtensor<double, 2> P = m(x);                       // (N_V, ℓ): column t = P(x[t+1] | x[:t+1])
    std::vector<ft::Matrix<double>> Ps = m(std::vector<ft::TokenIds>{x, {3, 3}});  // a batch
    double loss = m.loss_and_grad(x);                      // Algorithm 13 line 5; ∇ in m.grads()
    auto dW_e = m.grads()["W_e"];                          // (d_e, N_V), a view: no copy
    ft::Adam<double> adam(1e-3);
    adam.step(m);                                          // θ ← Adam(θ, ∇loss)
    m.params()["W_e"](0, 1) = 0.5;                         // writes θ itself
    ft::unit::LayerNorm<double> ln(16);                    // a component with its own θ (Algorithm 6)
    ft::Matrix<double> E = ln(xt::xtensor<double, 2>(xt::ones<double>({16, 3})));
    ft::SamplingOptions so;                                // Algorithm 14
    ft::Rng rng(0);
    ft::TokenIds y = ft::DInference(m, x, 5, so, rng);
    std::cout << "P " << P.shape(0) << "x" << P.shape(1) << ", batch " << Ps.size() << ", loss " << loss
              << ", |dW_e| " << dW_e.size() << ", E " << E.shape(1) << ", y " << y.size() << " tokens\n";
    return 0;
}
