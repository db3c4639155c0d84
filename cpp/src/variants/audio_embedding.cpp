// The audio embedding (docs/variants.md V28, Whisper): an encoder's stack whose input is a log-mel spectrogram
// F ∈ R^{n_mels×T} instead of token ids. Algorithm 8's lines 1–3 become V28 (whisper.hpp quotes it):
//
//   1–4  Z ← GELU(W_c2 · cols₂(GELU(W_c1 · cols₁(F) + b_c1 1ᵀ)) + b_c2 1ᵀ)   (two kernel-3 convolutions, the second stride 2)
//   5    Z ← Z + W_sin[:, 1:ℓ_z],   ℓ_z = ⌈T/2⌉                              (Whisper's fixed sinusoids, not learned)
//
// and its backward (dW_c1, db_c1, dW_c2, db_c2; W_sin is fixed). Registered as the embedding part "audio", chosen by
// its options n_mels (the spectrogram's rows) and n_audio_ctx (W_sin's columns: ℓ_z ≤ it), EDTransformer only; its
// parameters are named conv.W_c1, conv.b_c1, conv.W_c2, conv.b_c2 (ft.Whisper's). The decoder's stack stays "tokens".
#include <algorithm>

#include "formal_transformers/whisper.hpp"

namespace ft {

namespace {
template <class T>
struct AudioState : PartStateOf<AudioState<T>> {
    mutable typename AudioFrontEnd<T>::Acts acts;  // (its backward scratch too)
};

template <class T>
class AudioStackEmbedding final : public StackEmbedding<T> {
public:
    using Cache = typename StackEmbedding<T>::Cache;
    AudioStackEmbedding(const ModelConfig& c, ParamStore<T>& store)
        : front_(index_t(c.part_options.integer("n_mels")), c.d_e, store, "conv."),
          W_sin_(whisper_sinusoids<T>(index_t(c.part_options.integer("n_audio_ctx")), c.d_e)),
          n_ctx_(index_t(c.part_options.integer("n_audio_ctx"))) {}
    StackInput input() const override {
        return {front_.n_mels, "log-mel features (n_mels, T) (its embedding 'audio', n_mels = " + std::to_string(front_.n_mels) + ")"};
    }
    Seqs columns(const Seqs& frames) const override { return conv3_lengths(frames, 2); }
    void init(ParamStore<T>& store, Rng& rng, double stddev) const override { front_.init(store, rng, stddev); }
    void check(const EmbedInput<T>& in) const override {
        if (!in.features)
            throw TypeError("this EDTransformer's encoder takes log-mel features (n_mels, T) (its embedding 'audio', "
                            "n_mels = " + std::to_string(front_.n_mels) + "), not token ids");
        const Features<T>& f = *in.features;
        if (f.F.rows != front_.n_mels)
            throw ValueError("features must have n_mels = " + std::to_string(front_.n_mels) + " rows (the model's), got " +
                             std::to_string(f.F.rows));
        for (index_t b = 0; b < f.s.count(); ++b) {
            if (f.s.len(b) < 1) throw ValueError("features has no frames (T = 0)");
            if ((f.s.len(b) + 1) / 2 > n_ctx_)
                throw ValueError("features has T = " + std::to_string(f.s.len(b)) + " frames: the encoder's ⌈T/2⌉ = " +
                                 std::to_string((f.s.len(b) + 1) / 2) + " positions exceed n_audio_ctx = " +
                                 std::to_string(n_ctx_) + " (max_source_positions)");
        }
    }
    void forward(const ParamStore<T>& store, const EmbedInput<T>& in, const PositionalEmbedding<T>&, const Seqs& s,
                 index_t offset, MatView<T> X, Cache* c) const override {
        FT_CHECK(in.features && offset == 0, "the audio embedding needs its features, at offset 0");
        AudioState<T> local;
        typename AudioFrontEnd<T>::Acts& a = c ? c->own.template get<AudioState<T>>().acts : local.acts;
        Matrix<T> Z;
        front_.forward(store, in.features->F, in.features->s, Z, a);  // lines 1–4
        FT_CHECK(a.s_out.total() == s.total() && index_t(Z.shape(0)) == X.rows, "the audio embedding's columns");
        for (index_t b = 0; b < s.count(); ++b)  // line 5: Z ← Z + W_sin[:, 1:ℓ_z]
            for (index_t t = 0; t < s.len(b); ++t) {
                const T* z = view(Z).col(s.begin(b) + t);
                const T* w = W_sin_.data() + t * X.rows;
                T* x = X.col(s.begin(b) + t);
                for (index_t k = 0; k < X.rows; ++k) x[k] = z[k] + w[k];
            }
    }
    void forward_at(const ParamStore<T>&, const EmbedInput<T>&, const PositionalEmbedding<T>&, const index_t*,
                    MatView<T>) const override {
        throw ValueError("the audio embedding is an encoder's: it embeds whole spectrograms, never decoded tokens");
    }
    void backward(ParamStore<T>& store, const EmbedInput<T>& in, const PositionalEmbedding<T>&, const Seqs&, MatView<T> dX,
                  const Cache& c) const override {
        const AudioState<T>* st = c.own.template find<AudioState<T>>();
        FT_CHECK(st, "the audio embedding's backward without its forward");
        // d(line 5): W_sin is fixed; d(lines 4–1) through the front-end, and ∂loss/∂F when asked (accumulated: zeroed)
        MatView<T>* dF = in.features ? in.features->dF : nullptr;
        if (dF) {
            FT_CHECK(dF->rows == front_.n_mels && dF->cols == st->acts.s_in.total(), "∂loss/∂F has F's shape");
            std::fill(dF->data, dF->data + dF->size(), T(0));
        }
        front_.backward(store, CMatView<T>(dX), st->acts, dF);
    }
    void tokens(const ParamStore<T>&, const EmbedInput<T>&, MatView<T>) const override {
        throw ValueError("the audio embedding has no token embedding");
    }
    void tokens_backward(ParamStore<T>&, const EmbedInput<T>&, MatView<T>) const override {
        throw ValueError("the audio embedding has no token embedding");
    }

private:
    AudioFrontEnd<T> front_;
    Matrix<T> W_sin_;  // [d_e, n_audio_ctx], fixed
    index_t n_ctx_;
};

void check_audio(const PartOptionValues& o, const ModelConfig* c) {
    const index_t n_mels = o.integer("n_mels"), n_ctx = o.integer("n_audio_ctx");
    if (n_mels < 0 || n_ctx < 0) throw ValueError("n_mels and n_audio_ctx must be positive integers");
    if ((n_mels > 0) != (n_ctx > 0))
        throw ValueError("the audio encoder needs both n_mels (the spectrogram's rows) and n_audio_ctx (its positions), got n_mels=" +
                         std::to_string(n_mels) + ", n_audio_ctx=" + std::to_string(n_ctx));
    if (c && (c->d_e % 2 || c->d_e < 4))
        throw ValueError("n_mels: the audio encoder's sinusoids need d_e even and >= 4 (half sines, half cosines), got d_e = " +
                         std::to_string(c->d_e));
    if (c && c->arch != Arch::ED) throw ValueError("n_mels (the audio encoder) is an EDTransformer option");
    if (c) checked_elements({c->d_e, index_t(n_ctx)}, sizeof(double), "the encoder's sinusoids (d_e × n_audio_ctx)");
}
}  // namespace

const PartRow& audio_embedding_row() {
    static const PartRow row{PartKind::Embedding,
                             "audio",
                             {{"n_mels", archs::ED, OptionKind::AutoSize, std::int64_t(0), OptionCheck::None,
                               "V28 (Whisper): the encoder's input is a log-mel spectrogram of n_mels rows (None: token ids)"},
                              {"n_audio_ctx", archs::ED, OptionKind::AutoSize, std::int64_t(0), OptionCheck::None,
                               "V28: the encoder's positions (max_source_positions): spectrograms of T ≤ 2·n_audio_ctx frames"}},
                             check_audio};
    return row;
}

template <class T>
std::unique_ptr<const StackEmbedding<T>> make_audio_stack_embedding(const EmbeddingSpec& spec, ParamStore<T>& store) {
    check_audio(spec.c->part_options, spec.c);
    return std::make_unique<const AudioStackEmbedding<T>>(*spec.c, store);
}
template std::unique_ptr<const StackEmbedding<float>> make_audio_stack_embedding<float>(const EmbeddingSpec&, ParamStore<float>&);
template std::unique_ptr<const StackEmbedding<double>> make_audio_stack_embedding<double>(const EmbeddingSpec&, ParamStore<double>&);

}  // namespace ft
