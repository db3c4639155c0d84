// Sigmoid attention (Ramapuram et al. 2024, "Theory, Analysis, and Best Practices for Sigmoid Self-Attention",
// arXiv 2409.04431) as a head kernel, attention='sigmoid': Algorithm 4's lines 4–6 for one (sequence, head) block
// with line 6's softmax replaced by an elementwise sigmoid plus the paper's bias b = −log ℓ_z (ℓ_z: the block's keys),
// no normalisation over the keys:
//   4  S ← Kᵀ Q / √d_attn                         [[+ B^h, a score bias (V2's ALiBi), as in the listing's line 6]]
//   5  ∀t_z, t_x, if ¬Mask[t_z, t_x] then A[t_z, t_x] ← 0
//   6  otherwise A[t_z, t_x] ← σ(S[t_z, t_x] + b),  b = −log ℓ_z;   return Ṽ = V · A
// Backward (A kept): dV += dṼ Aᵀ; dA = Vᵀ dṼ; dS = dA ⊙ A ⊙ (1 − A) (masked entries: A = 0, so dS = 0);
// dQ += K dS / √d_attn, dK += Q dSᵀ / √d_attn; the score bias's gradients from dS (end_backward).
// It forms A before line 6's product (its registry line says so), so attention dropout can wrap it; all but line
// 6's map σ(· + b) and its backward is the shape it shares with the listing's kernel (weights_kernel.hpp). It has
// no tiled form (attention_impl 'auto' runs it as printed). b counts the keys of the call, so the weights of a query depend on
// how many keys come with it: decoding one token at a time matches the literal generation (each step's forward over
// the prefix), not a call over several new tokens, and a rolling cache (a mask with a window) would change ℓ_z.
#include <cmath>
#include <string>

#include "formal_transformers/config.hpp"
#include "formal_transformers/weights_kernel.hpp"

namespace ft {

namespace {
// σ(x) = 1/(1 + e^{−x}) without overflow for either sign
template <class T>
T sigmoid(T x) {
    if (x >= 0) return T(1) / (T(1) + std::exp(-x));
    const T e = std::exp(x);
    return e / (T(1) + e);
}

template <class T>
class SigmoidKernel final : public WeightsKernel<T> {
public:
    const char* name() const override { return "sigmoid"; }
    // line 6: A = σ(S + b), b = −log ℓ_z, on a column's candidate keys (masked: −∞, so σ = 0)
    void weights_of(T* s, index_t n, index_t l_z) const override {
        const T b = -std::log(T(l_z));  // the paper's b = −log ℓ_z
        for (index_t i = 0; i < n; ++i) s[i] = sigmoid(s[i] + b);
    }
    // line 6 backward: dS = dA ⊙ A ⊙ (1 − A), σ' = σ(1 − σ) (masked entries: A = 0, so dS = 0)
    void scores_gradient(CMatView<T> Q, CMatView<T> K, const HeadBlock<T>& blk, CMatView<T> A,
                         MatView<T> dA) const override {
        (void)Q, (void)K, (void)blk;
        for (index_t j = 0; j < A.cols; ++j)
            for (index_t i = 0; i < A.rows; ++i) dA(i, j) *= A(i, j) * (T(1) - A(i, j));
    }
};

// What it needs of a model, one rule for the config (check_sigmoid) and the factory: its own kernel under every
// attention_impl but 'tiled' (it has no tiled form), and a KV cache that keeps every key (no mask with a window: a
// rolling cache would change ℓ_z)
void check_sigmoid_fits(AttnImpl impl, index_t window, const std::string& mask_name) {
    if (impl == AttnImpl::Tiled) throw ValueError("attention_impl 'tiled': attention='sigmoid' has no tiled form");
    if (window > 0)
        throw ValueError("attention='sigmoid' counts the keys in its bias b = −log ℓ_z: not with the " + mask_name +
                         " mask (its rolling cache drops keys)");
}

void check_sigmoid(const PartOptionValues& own, const ModelConfig* c) {
    (void)own;
    if (!c) return;
    index_t window = 0;
    std::string mask_name;
    if (const PartRow* m = chosen_part(*c, PartKind::Mask)) {
        MaskOptions o;
        o.options = c->part_options;
        window = make_mask(m->name, o).window(), mask_name = m->name;
    }
    check_sigmoid_fits(c->attention_impl, window, mask_name);
}
}  // namespace

const PartRow& sigmoid_kernel_row() {
    static const PartRow row{PartKind::HeadKernel, "sigmoid", {}, check_sigmoid, nullptr, false};
    return row;
}

// The registry's factory (registry.cpp)
template <class T>
std::shared_ptr<const HeadKernel<T>> make_sigmoid_kernel(const AttnPartSpec<T>& spec, const std::string& prefix) {
    (void)prefix;
    check_sigmoid_fits(spec.v.impl, spec.mask ? spec.mask->window() : 0, spec.mask ? spec.mask->name() : std::string());
    return std::make_shared<const SigmoidKernel<T>>();
}
template std::shared_ptr<const HeadKernel<float>> make_sigmoid_kernel<float>(const AttnPartSpec<float>&, const std::string&);
template std::shared_ptr<const HeadKernel<double>> make_sigmoid_kernel<double>(const AttnPartSpec<double>&,
                                                                               const std::string&);

}  // namespace ft
