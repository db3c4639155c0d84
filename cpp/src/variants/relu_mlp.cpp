// The ReLU MLP in Algorithm 10 (docs/variants.md V21; OPT's activation_function = "relu"): line 8 with
// Algorithm 8's φ,
//   8  X ← X + W_mlp2 ReLU(W_mlp1 X̃ + b_mlp1 1ᵀ) + b_mlp2 1ᵀ,     ReLU(x) = max(0, x)
// Forward and backward are the listing's MLP (listings/mlp.cpp: dH = [[H > 0]] ⊙ W_mlp2ᵀ dOut beside
// the forward) with φ = ReLU. Chosen by mlp='relu' in a DTransformer; an EDTransformer's default MLP (Algorithm
// 8's, default_part). Made by make_mlp("relu", …) (registry.cpp).
#include "formal_transformers/parts.hpp"

namespace ft {

template <class T>
std::shared_ptr<const MLPPart<T>> make_standard_mlp(const MLPSpec&, ParamStore<T>&, const std::string&);  // listings/mlp.cpp

template <class T>
std::shared_ptr<const MLPPart<T>> make_relu_mlp(const MLPSpec& spec, ParamStore<T>& store, const std::string& prefix) {
    MLPSpec s = spec;
    s.act = Activation::Relu;
    return make_standard_mlp<T>(s, store, prefix);
}
template std::shared_ptr<const MLPPart<float>> make_relu_mlp<float>(const MLPSpec&, ParamStore<float>&, const std::string&);
template std::shared_ptr<const MLPPart<double>> make_relu_mlp<double>(const MLPSpec&, ParamStore<double>&, const std::string&);

}  // namespace ft
