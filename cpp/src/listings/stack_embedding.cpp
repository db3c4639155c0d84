// The embedding of one stack as the listings print it (stack_embedding.hpp): lines 1–3 of Algorithms 9 and 10 and
// Algorithm 8's lines 1–3 and 10–12,
//   2  for t ∈ [ℓ]: e_t ← W_e[:, x[t]] + W_p[:, t]
//   3  X ← [e_1, e_2, …, e_ℓ]
// registered as the embedding part "tokens". With no step chosen it is these lines exactly; the steps a config
// chooses act at their places (Token on W_e[:, x[t]], Table for W_p, Sum at line 2, Output after line 3).
// Forward and backward side by side.
#include "formal_transformers/stack_embedding.hpp"

namespace ft {

namespace {
template <class T>
class TokenStackEmbedding final : public StackEmbedding<T> {
public:
    using Step = EmbeddingStep<T>;
    using At = typename Step::At;
    using Cache = typename StackEmbedding<T>::Cache;

    TokenStackEmbedding(const EmbeddingSpec& spec, ParamStore<T>& store) {
        for (const PartRow* r : chosen_embedding_steps(spec.c->part_options))
            if (auto step = make_embedding_step<T>(r->name, spec, store)) {  // (null: nothing to do in this stack)
                if (step->at() == At::Table) table_ = step->table();
                segments_ |= step->takes_segments();
                steps_.push_back(std::move(step));
            }
    }
    void init(ParamStore<T>& store, Rng& rng, double stddev) const override {
        for (const auto& step : steps_) step->init(store, rng, stddev);
    }
    void check(const EmbedInput<T>& in) const override {
        if (in.segments && !segments_)
            throw ValueError("segment ids given, but the model has no segment embeddings (n_segments = 0)");
        for (const auto& step : steps_) step->check(in);
    }

    void forward(const ParamStore<T>& store, const EmbedInput<T>& in, const PositionalEmbedding<T>& pos, const Seqs& s,
                 index_t offset, MatView<T> X, Cache* c) const override {
        if (c) c->steps.resize(steps_.size());
        in.tok.forward(store, in.ids, in.n, X);          // line 2: e_t ← W_e[:, x[t]] …
        run(At::Token, store, in, X, c);
        table(pos).forward_seqs(store, s, X, offset);  //          … + W_p[:, t]
        run(At::Sum, store, in, X, c);
        run(At::Output, store, in, X, c);              // line 3: X ← [e_1, e_2, …, e_ℓ]
    }
    void forward_at(const ParamStore<T>& store, const EmbedInput<T>& in, const PositionalEmbedding<T>& pos,
                    const index_t* positions, MatView<T> X) const override {
        in.tok.forward(store, in.ids, in.n, X);
        run(At::Token, store, in, X, nullptr);
        table(pos).forward(store, positions, in.n, X, true);
        run(At::Sum, store, in, X, nullptr);
        run(At::Output, store, in, X, nullptr);
    }
    void backward(ParamStore<T>& store, const EmbedInput<T>& in, const PositionalEmbedding<T>& pos, const Seqs& s,
                  MatView<T> dX, const Cache& c) const override {
        run_backward(At::Output, store, in, dX, &c);
        run_backward(At::Sum, store, in, dX, &c);
        table(pos).backward_seqs(store, s, dX);  // d(line 2): dW_p[:, t] += dX[:, t]
        run_backward(At::Token, store, in, dX, &c);
        in.tok.backward(store, in.ids, in.n, dX);   //            dW_e[:, x[t]] += …
    }
    void tokens(const ParamStore<T>& store, const EmbedInput<T>& in, MatView<T> E) const override {
        in.tok.forward(store, in.ids, in.n, E);
        run(At::Token, store, in, E, nullptr);
    }
    void tokens_backward(ParamStore<T>& store, const EmbedInput<T>& in, MatView<T> dE) const override {
        run_backward(At::Token, store, in, dE, nullptr);
        in.tok.backward(store, in.ids, in.n, dE);
    }

private:
    const PositionalEmbedding<T>& table(const PositionalEmbedding<T>& pos) const { return table_ ? *table_ : pos; }
    void run(At at, const ParamStore<T>& store, const EmbedInput<T>& in, MatView<T> X, Cache* c) const {
        for (std::size_t k = 0; k < steps_.size(); ++k)
            if (steps_[k]->at() == at) steps_[k]->forward(store, in, X, c ? &c->steps[k] : nullptr);
    }
    void run_backward(At at, ParamStore<T>& store, const EmbedInput<T>& in, MatView<T> dX, const Cache* c) const {
        static const PartSlot none;  // (Token steps keep no state: each acts on one column at a time)
        for (std::size_t k = steps_.size(); k-- > 0;)
            if (steps_[k]->at() == at) steps_[k]->backward(store, in, dX, c && k < c->steps.size() ? c->steps[k] : none);
    }
    std::vector<std::shared_ptr<const Step>> steps_;
    const PositionalEmbedding<T>* table_ = nullptr;
    bool segments_ = false;
};
}  // namespace

template <class T>
std::unique_ptr<const StackEmbedding<T>> make_token_stack_embedding(const EmbeddingSpec& spec, ParamStore<T>& store) {
    return std::make_unique<const TokenStackEmbedding<T>>(spec, store);
}
template std::unique_ptr<const StackEmbedding<float>> make_token_stack_embedding<float>(const EmbeddingSpec&, ParamStore<float>&);
template std::unique_ptr<const StackEmbedding<double>> make_token_stack_embedding<double>(const EmbeddingSpec&, ParamStore<double>&);

}  // namespace ft
