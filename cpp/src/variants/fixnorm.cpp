// V13 FixNorm (docs/variants.md; Nguyen & Chiang 2018, Nguyen & Salazar 2019): unit-length token embeddings, an
// embedding step on Algorithm 1's e = W_e[:, v] before the position is added (stack_embedding.hpp, At::Token):
//
//   e ← e / √(‖e‖² + eps)                                   (eps: the model's)
//   backward: de ← r (de − ê (ê·de)),  ê = r W_e[:, v],  r = 1/√(‖W_e[:, v]‖² + eps)
//
// W_u (tied or not) uses W_e as stored. Its option: fixnorm=True (every architecture).
#include <cmath>

#include "formal_transformers/stack_embedding.hpp"

namespace ft {

namespace {
template <class T>
class FixNorm final : public EmbeddingStep<T> {
public:
    explicit FixNorm(double eps) : eps_(eps) {}
    typename EmbeddingStep<T>::At at() const override { return EmbeddingStep<T>::At::Token; }
    void forward(const ParamStore<T>&, const EmbedInput<T>& in, MatView<T> X, PartSlot*) const override {
        const index_t d = X.rows;
#pragma omp parallel for schedule(static) if (d * in.n > 65536)
        for (index_t t = 0; t < in.n; ++t) {
            T* e = X.col(t);
            double s = 0;
#pragma omp simd reduction(+ : s)
            for (index_t i = 0; i < d; ++i) s += double(e[i]) * e[i];
            const T r = T(1.0 / std::sqrt(s + eps_));
#pragma omp simd
            for (index_t i = 0; i < d; ++i) e[i] *= r;
        }
    }
    void backward(ParamStore<T>& store, const EmbedInput<T>& in, MatView<T> dX, const PartSlot&) const override {
        CMatView<T> W = store.W(in.tok.W_e);
        const index_t d = dX.rows;
#pragma omp parallel for schedule(static) if (d * in.n > 65536)
        for (index_t t = 0; t < in.n; ++t) {
            const T* w = W.col(in.ids[t]);
            T* g = dX.col(t);
            double s = 0, wg = 0;
#pragma omp simd reduction(+ : s, wg)
            for (index_t i = 0; i < d; ++i) {
                s += double(w[i]) * w[i];
                wg += double(w[i]) * g[i];
            }
            const double r = 1.0 / std::sqrt(s + eps_);
            const T rt = T(r), c = T(r * r * r * wg);  // r·de − r³ (w·de) w
#pragma omp simd
            for (index_t i = 0; i < d; ++i) g[i] = rt * g[i] - c * w[i];
        }
    }

private:
    double eps_;
};
}  // namespace

const PartRow& fixnorm_row() {
    static const PartRow row{PartKind::EmbeddingStep,
                             "fixnorm",
                             {{"fixnorm", archs::ALL, OptionKind::Bool, false, OptionCheck::None,
                               "V13 FixNorm: Algorithm 1 returns the unit-length column W_e[:, v] / √(‖W_e[:, v]‖² + eps)"}}};
    return row;
}

template <class T>
std::shared_ptr<const EmbeddingStep<T>> make_fixnorm(const EmbeddingSpec& spec, ParamStore<T>&) {
    return std::make_shared<const FixNorm<T>>(spec.c->eps);
}
template std::shared_ptr<const EmbeddingStep<float>> make_fixnorm<float>(const EmbeddingSpec&, ParamStore<float>&);
template std::shared_ptr<const EmbeddingStep<double>> make_fixnorm<double>(const EmbeddingSpec&, ParamStore<double>&);

}  // namespace ft
