// A stack's embedding part (stack_embedding.hpp): with no step it is Algorithms 1 + 2 exactly; each step and their
// combinations against the definition written out here (float64 ≤ 1e-12, float32 ≤ 1e-5), the backward against
// central finite differences, the steps' rows (their options, the config text where the options stood), refusals.
#include <cmath>

#include "formal_transformers/stack_embedding.hpp"
#include "testing.hpp"

using namespace ft;

namespace {
struct Case {
    Arch arch;
    Options options;
    std::string prefix;  // the stack
};
ModelConfig config_of(const Case& k) {
    std::vector<OptionValue> sizes = {std::int64_t(11), std::int64_t(8)};
    if (k.arch == Arch::ED) sizes.insert(sizes.end(), {std::int64_t(1), std::int64_t(1)});
    else sizes.push_back(std::int64_t(1));
    sizes.insert(sizes.end(), {std::int64_t(2), std::int64_t(6), std::int64_t(8)});
    if (k.arch == Arch::E) sizes.push_back(std::int64_t(6));
    return ModelConfig::from_options(k.arch, k.options, sizes);
}

// The model's W_e, W_p and the stack's part, with random θ (γ_e, β_e too)
template <class T>
struct Built {
    ModelConfig c;
    ParamStore<T> store;
    TokenEmbedding<T> tok;
    PositionalEmbedding<T> pos;
    std::unique_ptr<const StackEmbedding<T>> emb;
    explicit Built(const Case& k)
        : c(config_of(k)), tok(c.n_vocab, c.d_e, store), pos(c.l_max, c.d_e, position_table(c.positional), c.part_options.real("base"), store),
          emb(make_stack_embedding<T>("tokens", EmbeddingSpec{&c, k.prefix}, store)) {
        store.allocate();
        Rng rng(5);
        for (index_t i = 0; i < store.size(); ++i) store.theta()[i] = T(rng.normal());
    }
    double at(const std::string& name, index_t i, index_t j) const {
        const ParamInfo& e = store.entry(name);
        return double(store.theta()[e.offset + i + j * e.shape[0]]);
    }
};

// The definition: e_t ← fixnorm? W_e[:, x_t]/√(‖·‖² + eps) : W_e[:, x_t]; · s; + W_p^stack[:, p0 + j] + W_s[:, s_t];
// then layer_norm(· | γ_e, β_e)
template <class T>
std::vector<double> definition(const Built<T>& b, const std::string& prefix, const std::vector<index_t>& ids,
                               const Seqs& s, index_t p0, const index_t* seg) {
    const PartOptionValues& o = b.c.part_options;
    const index_t d = b.c.d_e;
    std::vector<double> X;
    for (index_t bi = 0; bi < s.count(); ++bi)
        for (index_t j = 0; j < s.len(bi); ++j) {
            const index_t t = s.begin(bi) + j;
            std::vector<double> e(static_cast<std::size_t>(d));
            double ss = 0;
            for (index_t i = 0; i < d; ++i) ss += b.at("W_e", i, ids[std::size_t(t)]) * b.at("W_e", i, ids[std::size_t(t)]);
            const double r = o.flag("fixnorm") ? 1.0 / std::sqrt(ss + b.c.eps) : 1.0;
            const double scale = o.real("embed_scale") > 0 ? o.real("embed_scale")
                                 : o.flag("scale_embedding") ? std::sqrt(double(d)) : 1.0;
            const std::string table = o.flag("separate_positions") && prefix == "dec." ? "dec.W_p" : "W_p";
            for (index_t i = 0; i < d; ++i) {
                e[std::size_t(i)] = b.at("W_e", i, ids[std::size_t(t)]) * r * double(T(scale)) + b.at(table, i, j + p0);
                if (o.integer("n_segments") > 0) e[std::size_t(i)] += b.at(prefix + "W_s", i, seg ? seg[t] : 0);
            }
            if (o.flag("embed_norm")) {
                double m = 0, v = 0;
                for (double x : e) m += x / double(d);
                for (double x : e) v += (x - m) * (x - m) / double(d);
                for (index_t i = 0; i < d; ++i)
                    e[std::size_t(i)] = (e[std::size_t(i)] - m) / std::sqrt(v + b.c.eps) * b.at(prefix + "gamma_e", i, 0) +
                                        b.at(prefix + "beta_e", i, 0);
            }
            X.insert(X.end(), e.begin(), e.end());
        }
    return X;
}

const std::vector<Case>& cases() {
    static const std::vector<Case> k = {
        {Arch::D, {}, ""},
        {Arch::D, {{"fixnorm", true}}, ""},
        {Arch::D, {{"embed_scale", 1.7}}, ""},
        {Arch::E, {{"n_segments", std::int64_t(3)}}, ""},
        {Arch::E, {{"embed_norm", true}}, ""},
        {Arch::E, {{"n_segments", std::int64_t(3)}, {"embed_norm", true}, {"fixnorm", true}}, ""},
        {Arch::ED, {{"scale_embedding", true}, {"embed_norm", true}, {"separate_positions", true}}, "enc."},
        {Arch::ED, {{"scale_embedding", true}, {"embed_norm", true}, {"separate_positions", true}}, "dec."},
        {Arch::ED, {{"fixnorm", true}, {"scale_embedding", true}, {"separate_positions", true}}, "dec."},
    };
    return k;
}
const std::vector<index_t> kIds = {3, 0, 3, 7, 10, 2, 3};
const std::vector<index_t> kSeg = {0, 2, 1, 1, 0, 2, 2};
}  // namespace

TEST(StackEmbedding, WithNoStepItIsAlgorithms1And2Exactly) {
    Built<double> b(cases()[0]);
    EXPECT_EQ(b.store.entries().size(), 2u);  // W_e, W_p: the steps declare nothing
    const Seqs s = Seqs::from_lengths({3, 4});
    Matrix<double> X = Matrix<double>::from_shape({6, 7});
    b.emb->forward(b.store, EmbedInput<double>{b.tok, kIds.data(), 7}, b.pos, s, 1, view(X), nullptr);
    for (index_t bi = 0; bi < 2; ++bi)
        for (index_t j = 0; j < s.len(bi); ++j)
            for (index_t i = 0; i < 6; ++i) {
                const index_t t = s.begin(bi) + j;
                EXPECT_EQ(X(i, t), b.at("W_e", i, kIds[std::size_t(t)]) + b.at("W_p", i, j + 1));  // line 2, bit for bit
            }
}

TEST(StackEmbedding, EveryStepMatchesItsDefinition) {
    const Seqs s = Seqs::from_lengths({3, 4});
    for (const Case& k : cases()) {
        SCOPED_TRACE(std::string(arch_name(k.arch)) + " " + k.prefix + " " + std::to_string(k.options.size()));
        const index_t* seg = k.arch == Arch::E ? kSeg.data() : nullptr;
        Built<double> b(k);
        Matrix<double> X = Matrix<double>::from_shape({6, 7});
        b.emb->forward(b.store, EmbedInput<double>{b.tok, kIds.data(), 7, seg}, b.pos, s, 1, view(X), nullptr);
        const std::vector<double> want = definition(b, k.prefix, kIds, s, 1, seg);
        EXPECT_LT(fttest::rel_error(X.data(), want.data(), want.size()), 1e-12);
        // forward_at (one position per column) is the same numbers
        std::vector<index_t> positions;
        for (index_t bi = 0; bi < 2; ++bi)
            for (index_t j = 0; j < s.len(bi); ++j) positions.push_back(j + 1);
        if (!seg) {
            Matrix<double> Y = Matrix<double>::from_shape({6, 7});
            b.emb->forward_at(b.store, EmbedInput<double>{b.tok, kIds.data(), 7}, b.pos, positions.data(), view(Y));
            EXPECT_LT(fttest::rel_error(Y.data(), want.data(), want.size()), 1e-12);
        }
        Built<float> f(k);  // float32: its own θ (the same draws, rounded) against the definition in float64
        Matrix<float> Xf = Matrix<float>::from_shape({6, 7});
        f.emb->forward(f.store, EmbedInput<float>{f.tok, kIds.data(), 7, seg}, f.pos, s, 1, view(Xf), nullptr);
        const std::vector<double> wantf = definition(f, k.prefix, kIds, s, 1, seg);
        EXPECT_LT(fttest::rel_error(Xf.data(), wantf.data(), wantf.size()), 1e-5);
    }
}

TEST(StackEmbedding, BackwardMatchesFiniteDifferences) {
    const Seqs s = Seqs::from_lengths({3, 4});
    for (const Case& k : cases()) {
        SCOPED_TRACE(std::string(arch_name(k.arch)) + " " + k.prefix + " " + std::to_string(k.options.size()));
        const index_t* seg = k.arch == Arch::E ? kSeg.data() : nullptr;
        Built<double> b(k);
        Rng rng(9);
        const std::vector<double> G = fttest::randn(6 * 7, rng);
        typename StackEmbedding<double>::Cache c;
        const EmbedInput<double> in{b.tok, kIds.data(), 7, seg};
        auto loss = [&] {
            Matrix<double> X = Matrix<double>::from_shape({6, 7});
            b.emb->forward(b.store, in, b.pos, s, 0, view(X), &c);  // (training: every sequence from position 0)
            return fttest::dot(X.data(), G.data(), 6 * 7);
        };
        loss();
        b.store.zero_grad();
        std::vector<double> dX = G;
        b.emb->backward(b.store, in, b.pos, s, MatView<double>(dX.data(), 6, 7), c);
        const auto num = fttest::numeric_grad(b.store.theta(), b.store.size(), loss);
        EXPECT_LT(fttest::rel_error(b.store.grad(), num, num.size()), 1e-6);
        // Algorithm 1 with the Token steps (V16's embedding of x[t+k]) and its backward
        auto tokens_loss = [&] {
            Matrix<double> E = Matrix<double>::from_shape({6, 7});
            b.emb->tokens(b.store, in, view(E));
            return fttest::dot(E.data(), G.data(), 6 * 7);
        };
        b.store.zero_grad();
        dX = G;
        b.emb->tokens_backward(b.store, in, MatView<double>(dX.data(), 6, 7));
        const auto num_t = fttest::numeric_grad(b.store.theta(), b.store.size(), tokens_loss);
        EXPECT_LT(fttest::rel_error(b.store.grad(), num_t, num_t.size()), 1e-6);
    }
}

TEST(StackEmbedding, TheStepsParametersAreTheStacks) {
    Built<double> e(cases()[5]);  // E: W_e, W_p, W_s, gamma_e, beta_e (θ's order of before)
    std::vector<std::string> names;
    for (const ParamInfo& p : e.store.entries()) names.push_back(p.name);
    EXPECT_EQ(names, (std::vector<std::string>{"W_e", "W_p", "W_s", "gamma_e", "beta_e"}));
    Built<double> enc(cases()[6]), dec(cases()[7]);  // the encoder keeps W_p; the decoder its own dec.W_p
    EXPECT_EQ(enc.store.find("enc.W_p"), nullptr);
    EXPECT_NE(enc.store.find("enc.gamma_e"), nullptr);
    EXPECT_NE(dec.store.find("dec.W_p"), nullptr);
    EXPECT_NE(dec.store.find("dec.gamma_e"), nullptr);
}

TEST(StackEmbedding, EachStepsRowOwnsItsOptions) {
    const std::vector<std::pair<const char*, const char*>> owner = {
        {"fixnorm", "fixnorm"}, {"embed_scale", "scale"}, {"scale_embedding", "scale"},
        {"separate_positions", "separate_positions"}, {"n_segments", "segments"}, {"embed_norm", "embed_norm"}};
    for (const auto& [option, step] : owner) {
        const PartRow* r = part_row_of_option(option);
        ASSERT_NE(r, nullptr) << option;
        EXPECT_EQ(r->kind, PartKind::EmbeddingStep);
        EXPECT_STREQ(r->name, step);
    }
    EXPECT_EQ(part_names(PartKind::Embedding), (std::vector<std::string>{"tokens", "audio"}));
    // chosen by their options, several at once, in the registry's order
    const ModelConfig c = config_of(cases()[5]);
    std::vector<std::string> chosen;
    for (const PartRow* r : chosen_embedding_steps(c.part_options)) chosen.push_back(r->name);
    EXPECT_EQ(chosen, (std::vector<std::string>{"fixnorm", "segments", "embed_norm"}));
    // the config text puts each option where it stood before it moved into its step (prompt caches hash that text)
    const std::string ed = config_of(cases()[6]).to_json();
    const auto at = [&](const char* key) { return ed.find(std::string("\"") + key + "\""); };
    EXPECT_LT(at("forced_eos"), at("embed_norm"));
    EXPECT_LT(at("embed_norm"), at("unembed_bias"));
    EXPECT_LT(at("unembed_bias"), at("scale_embedding"));
    EXPECT_LT(at("scale_embedding"), at("separate_positions"));
    EXPECT_LT(at("separate_positions"), at("fixnorm"));
    EXPECT_EQ(ModelConfig::from_json(ed), config_of(cases()[6]));
}

TEST(StackEmbedding, RefusalsNameTheOption) {
    auto expect = [](const Case& k, const char* what) {
        try {
            config_of(k);
            ADD_FAILURE() << "no error for " << what;
        } catch (const ValueError& e) {
            EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
        }
    };
    expect({Arch::D, {{"embed_scale", 2.0}, {"fixnorm", true}}, ""}, "embed_scale");
    expect({Arch::ED, {{"separate_positions", true}, {"positional", std::string("sinusoidal")}}, ""}, "separate_positions");
    // the factory runs the same check (a config built in C++, not resolved with the step)
    ModelConfig c = config_of({Arch::D, {}, ""});
    c.part_options.set("embed_scale", 2.0);
    c.part_options.set("fixnorm", true);
    ParamStore<double> store;
    EXPECT_THROW(make_embedding_step<double>("scale", EmbeddingSpec{&c, ""}, store), ValueError);
    EXPECT_THROW(make_stack_embedding<double>("tokens", EmbeddingSpec{&c, ""}, store), ValueError);
    EXPECT_THROW(make_stack_embedding<double>("speech", EmbeddingSpec{&c, ""}, store), ValueError);  // not registered
    // an option of another architecture's step: TypeError for the keyword, ValueError in a C++ config
    EXPECT_THROW(config_of({Arch::D, {{"n_segments", std::int64_t(2)}}, ""}), TypeError);
    ModelConfig d = config_of({Arch::D, {}, ""});
    d.part_options.set("n_segments", std::int64_t(2));
    EXPECT_THROW(resolve(d, Arch::D), ValueError);
    // the call's segment ids
    Built<double> e(cases()[3]);
    const std::vector<index_t> bad = {0, 0, 3, 0, 0, 0, 0};
    EXPECT_THROW(e.emb->check(EmbedInput<double>{e.tok, kIds.data(), 7, bad.data()}), IndexError);
    Built<double> none(cases()[4]);
    EXPECT_THROW(none.emb->check(EmbedInput<double>{none.tok, kIds.data(), 7, kSeg.data()}), ValueError);
}
