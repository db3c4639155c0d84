// BERT's segment (token-type) embeddings (Devlin et al. 2019, §3.2), an embedding step added at line 2 of
// Algorithm 9 (stack_embedding.hpp, At::Sum):
//
//   2′  e_t ← W_e[:, x[t]] + W_p[:, t] + W_s[:, s_t]        (W_s ∈ ℝ^{d_e×N_s}; s_t: token t's segment id, none: 0)
//   backward: dW_s[:, s_t] += de_t
//
// Its option: n_segments = N_s > 0 (ETransformer); the calls' segments= ids.
#include "formal_transformers/stack_embedding.hpp"

namespace ft {

namespace {
template <class T>
class SegmentEmbedding final : public EmbeddingStep<T> {
public:
    SegmentEmbedding(index_t d_e, index_t n, const std::string& prefix, ParamStore<T>& store)
        : n_(n), W_s_(store.matrix(prefix + "W_s", d_e, n)) {}
    typename EmbeddingStep<T>::At at() const override { return EmbeddingStep<T>::At::Sum; }
    bool takes_segments() const override { return true; }
    void init(ParamStore<T>& store, Rng& rng, double stddev) const override {
        store.normal(W_s_.offset, W_s_.rows * W_s_.cols, stddev, rng);  // as W_e, W_p
    }
    void check(const EmbedInput<T>& in) const override {
        if (!in.segments) return;
        for (index_t t = 0; t < in.n; ++t)
            if (in.segments[t] < 0 || in.segments[t] >= n_)
                throw IndexError("segment id " + std::to_string(in.segments[t]) + " at column " + std::to_string(t) +
                                 " is out of range [0, " + std::to_string(n_) + ")");
    }
    void forward(const ParamStore<T>& store, const EmbedInput<T>& in, MatView<T> X, PartSlot*) const override {
        CMatView<T> W = store.W(W_s_);
        for (index_t t = 0; t < in.n; ++t) {
            const T* w = W.col(in.segments ? in.segments[t] : 0);  // e_t += W_s[:, s_t]
            T* e = X.col(t);
            for (index_t i = 0; i < X.rows; ++i) e[i] += w[i];
        }
    }
    void backward(ParamStore<T>& store, const EmbedInput<T>& in, MatView<T> dX, const PartSlot&) const override {
        MatView<T> dW = store.dW(W_s_);
        for (index_t t = 0; t < in.n; ++t) {  // serial: two columns may scatter into the same segment
            T* g = dW.col(in.segments ? in.segments[t] : 0);  // dW_s[:, s_t] += de_t
            const T* d = dX.col(t);
            for (index_t i = 0; i < dX.rows; ++i) g[i] += d[i];
        }
    }

private:
    index_t n_;
    MatParam W_s_;
};
}  // namespace

const PartRow& segment_embedding_row() {
    static const PartRow row{PartKind::EmbeddingStep,
                             "segments",
                             {{"n_segments", archs::E, OptionKind::Count, std::int64_t(0), OptionCheck::None,
                               "BERT: segment (token-type) embeddings W_s (d_e, n_segments) added at line 2 for the "
                               "segments= ids of a call (0 when None); 0: none"}}};
    return row;
}

template <class T>
std::shared_ptr<const EmbeddingStep<T>> make_segment_embedding(const EmbeddingSpec& spec, ParamStore<T>& store) {
    return std::make_shared<const SegmentEmbedding<T>>(spec.c->d_e, spec.c->part_options.integer("n_segments"),
                                                       spec.prefix, store);
}
template std::shared_ptr<const EmbeddingStep<float>> make_segment_embedding<float>(const EmbeddingSpec&, ParamStore<float>&);
template std::shared_ptr<const EmbeddingStep<double>> make_segment_embedding<double>(const EmbeddingSpec&, ParamStore<double>&);

}  // namespace ft
