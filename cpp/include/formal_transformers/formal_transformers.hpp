// formal-transformers from C++: the one header to include (docs/api.md "C++ API").
//
//   #include <formal_transformers/formal_transformers.hpp>
//   ft::ModelConfig cfg;  cfg.n_vocab = 70; cfg.l_max = 64; cfg.L = 4; cfg.H = 4; cfg.d_e = 128; cfg.d_mlp = 512;
//   ft::DTransformer<double> m(ft::resolve(cfg, ft::Arch::D));     // Algorithm 10, θ initialised (seeded)
//   ft::TokenIds x{1, 2, 3};                                       // xt::xtensor<ft::index_t, 1>
//   xt::xtensor<double, 2> P = m(x);                               // (N_V, ℓ): column t = P(x[t+1] | x[:t+1])
//   double loss = m.loss_and_grad(x);                              // gradient in m.grads()
//   ft::Adam<double> adam(1e-3);  adam.step(m);                    // θ ← Adam(θ, ∇)
//   m.params()["W_e"](0, 0) = 0.5;                                 // a writable view of θ, no copy
//
// Everything a Python user calls is here with xtensor inputs and outputs: the models (transformers.hpp:
// P = m(x), m(batch), logits, loss, loss_and_grad), the stand-alone components (units.hpp: ft::unit::
// TokenEmbedding … Unembedding), the optimizers (optim.hpp), the trainers of Algorithms 11–13 and the
// inference of Algorithms 14–15 (training.hpp, inference.hpp), the tokenizers (tokenizer.hpp) and
// chunking. Matrices follow the column convention: (d, ℓ), column t is token t, stored column-major
// (ft::Matrix<T>); any xtensor expression of that shape converts to it (one copy when its layout differs).
// Bad input throws ft::ValueError / ft::IndexError / ft::TypeError (common.hpp) naming the problem before
// anything changes.
#pragma once

#include <string_view>
#include <vector>

#include "formal_transformers/common.hpp"
#include "formal_transformers/inference.hpp"
#include "formal_transformers/io.hpp"
#include "formal_transformers/optim.hpp"
#include "formal_transformers/paged.hpp"
#include "formal_transformers/params.hpp"
#include "formal_transformers/tokenizer.hpp"
#include "formal_transformers/training.hpp"
#include "formal_transformers/transformers.hpp"
#include "formal_transformers/tiled_attention.hpp"
#include "formal_transformers/units.hpp"

namespace ft {

// Token ids of a tokenizer's encode (std::vector) as an xtensor sequence, and back for decode.
inline TokenIds as_ids(const std::vector<index_t>& v) {
    TokenIds r = TokenIds::from_shape({v.size()});
    std::copy(v.begin(), v.end(), r.begin());
    return r;
}
// §4 chunking: the windows of chunk_bounds (stride 0: l_max, disjoint pieces) as sequences.
inline std::vector<TokenIds> chunk(const TokenIds& ids, index_t l_max, index_t stride = 0) {
    std::vector<TokenIds> r;
    for (auto [b, e] : chunk_bounds(index_t(ids.size()), l_max, stride > 0 ? stride : l_max)) {
        TokenIds c = TokenIds::from_shape({std::size_t(e - b)});
        std::copy(ids.begin() + b, ids.begin() + e, c.begin());
        r.push_back(std::move(c));
    }
    return r;
}

}  // namespace ft
