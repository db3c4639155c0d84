// The embedding part "audio" (variants/audio_embedding.cpp, docs/variants.md V28): an EDTransformer whose encoder
// reads log-mel features — its row (n_mels, n_audio_ctx), the model's forward on spectrograms (ℓ_z = ⌈T/2⌉ columns),
// the gradient of the convolutions against central finite differences, cached decoding equal to the forward, and
// the refusals (the other kind's input, positions the table does not cover).
#include <cmath>

#include "formal_transformers/inference.hpp"
#include "formal_transformers/whisper.hpp"
#include "testing.hpp"

using namespace ft;

namespace {
ModelConfig audio_config(bool audio = true) {
    Options o = {{"block", std::string("pre_ln")}, {"mlp", std::string("gelu")}, {"tied", true}};
    if (audio) o.insert(o.end(), {{"n_mels", std::int64_t(3)}, {"n_audio_ctx", std::int64_t(4)}});
    return ModelConfig::from_options(Arch::ED, o, {std::int64_t(9), std::int64_t(6), std::int64_t(1), std::int64_t(1),
                                                   std::int64_t(2), std::int64_t(8), std::int64_t(8)});
}
void randomize(ParamStore<double>& store) {
    Rng rng(3);
    for (index_t i = 0; i < store.size(); ++i) store.theta()[i] = 0.5 * rng.normal();
}
Matrix<double> spectrogram(index_t M, index_t T) {
    Matrix<double> F;
    MatView<double> v = ensure(F, M, T);
    Rng rng(4);
    for (index_t i = 0; i < v.size(); ++i) v.data[i] = rng.normal();
    return F;
}
}  // namespace

TEST(AudioEmbedding, RowOwnsItsOptions) {
    for (const char* o : {"n_mels", "n_audio_ctx"}) {
        const PartRow* r = part_row_of_option(o);
        ASSERT_NE(r, nullptr) << o;
        EXPECT_EQ(r->kind, PartKind::Embedding);
        EXPECT_STREQ(r->name, "audio");
    }
    const ModelConfig c = audio_config();
    EXPECT_EQ(ModelConfig::from_json(c.to_json()), c);
    EXPECT_THROW(ModelConfig::from_options(Arch::ED, {{"n_mels", std::int64_t(3)}},
                                           {std::int64_t(9), std::int64_t(6), std::int64_t(1), std::int64_t(1),
                                            std::int64_t(2), std::int64_t(8), std::int64_t(8)}),
                 ValueError);  // n_audio_ctx missing
}

TEST(AudioEmbedding, GradientsMatchFiniteDifferencesAndDecodingTheForward) {
    EDTransformer<double> m(audio_config());
    ASSERT_TRUE(m.audio());
    EXPECT_EQ(m.encoder_input().rows, 3);  // the part reports what it takes: features of n_mels rows
    EXPECT_NE(m.encoder_input().what.find("n_mels = 3"), std::string::npos);
    EXPECT_FALSE(EDTransformer<double>(audio_config(false)).encoder_input().features());  // token ids
    randomize(m.store);
    const Matrix<double> F = spectrogram(3, 7);
    const Features<double> f{view(F), Seqs::single(7)};
    const std::vector<index_t> x = {7, 1, 2, 3};
    const Tokens xt{x.data(), Seqs::single(4)};
    m.forward(f, xt);
    EXPECT_EQ(m.encoded().cols, 4);  // ⌈7/2⌉ columns
    m.loss_and_grad(f, xt);
    const std::vector<double> g(m.store.grad(), m.store.grad() + m.store.size());
    for (const ParamInfo& e : m.store.entries()) {
        if (e.name.rfind("conv.", 0) != 0) continue;  // the front-end's: W_c1, b_c1, W_c2, b_c2
        for (index_t i : {index_t(0), e.size / 2, e.size - 1}) {
            double& w = m.store.theta()[e.offset + i];
            const double w0 = w, h = 1e-5;
            w = w0 + h;
            const double up = m.loss(f, xt);
            w = w0 - h;
            const double down = m.loss(f, xt);
            w = w0;
            const double fd = (up - down) / (2 * h);
            EXPECT_NEAR(g[std::size_t(e.offset + i)], fd, 1e-6 * std::max(1.0, std::abs(fd))) << e.name << "[" << i << "]";
        }
    }
    // decoding with the caches: the logits of each step equal the forward's columns
    m.forward(f, xt);
    Matrix<double> Z;
    m.logits(ensure(Z, 9, 4));
    typename EDTransformer<double>::Decoder d;
    m.encode(d, f);
    std::vector<double> z(9);
    for (index_t t = 0; t < 4; ++t) {
        m.decode(d, x.data() + t, 1, z.data());
        for (index_t v = 0; v < 9; ++v) EXPECT_NEAR(z[std::size_t(v)], view(Z)(v, t), 1e-12);
    }
}

TEST(AudioEmbedding, RefusesTheOtherKindOfInput) {
    EDTransformer<double> a(audio_config()), t(audio_config(false));
    const std::vector<index_t> ids = {1, 2};
    const Tokens z{ids.data(), Seqs::single(2)}, x{ids.data(), Seqs::single(2)};
    EXPECT_THROW(a.forward(z, x), TypeError);
    const Matrix<double> F = spectrogram(3, 7);
    EXPECT_THROW(t.forward(Features<double>{view(F), Seqs::single(7)}, x), TypeError);
    const Matrix<double> long_F = spectrogram(3, 9);  // ⌈9/2⌉ = 5 positions, the table has 4
    EXPECT_THROW(a.forward(Features<double>{view(long_F), Seqs::single(9)}, x), ValueError);
    const Matrix<double> wrong = spectrogram(2, 7);  // n_mels 2, the model's 3
    EXPECT_THROW(a.forward(Features<double>{view(wrong), Seqs::single(7)}, x), ValueError);
    SamplingOptions o;
    Rng rng(1);
    EXPECT_THROW(EDInference(a, ids.data(), 2, o, rng), TypeError);
}
