// The C++ API on xtensor (formal_transformers.hpp) agrees with the core path it wraps, bit for bit: P, the
// loss and every gradient of the models, batches, params()/grads() writing through to θ, Adam stepping a
// model, the trainers and inference on TokenIds, and the stand-alone components (units.hpp) against the
// listings' classes; bad input throws the core's errors before anything changes.
#include <algorithm>

#include <xtensor/xview.hpp>

#include "formal_transformers/formal_transformers.hpp"
#include "testing.hpp"

using namespace ft;

namespace {
ModelConfig small(Arch arch) {
    ModelConfig c;
    c.n_vocab = 11;
    c.l_max = 8;
    c.L = 2;
    c.L_enc = 1;
    c.L_dec = 2;
    c.H = 2;
    c.d_e = 8;
    c.d_mlp = 12;
    c.d_f = arch == Arch::E ? 6 : 0;
    c.seed = 3;
    return c;
}
template <class A, class B>
void expect_identical(const A& a, const B& b, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(a[i], b[i]) << "entry " << i;
}
std::vector<double> grad_copy(const ParamStore<double>& s) { return {s.grad(), s.grad() + s.size()}; }
}  // namespace

TEST(CppApi, DTransformerMatchesTheCorePath) {
    DTransformer<double> api(small(Arch::D)), core(small(Arch::D));
    const TokenIds x{1, 4, 2, 9, 0, 3};
    const std::vector<index_t> ids(x.begin(), x.end());
    const Tokens t{ids.data(), Seqs::single(6)};

    xt::xtensor<double, 2> P = api(x);  // row-major copy of the column-major result
    ASSERT_EQ(P.shape(0), 11u);
    ASSERT_EQ(P.shape(1), 6u);
    core.forward(t);
    Matrix<double> Pc = Matrix<double>::from_shape({11, 6});
    core.probabilities(view(Pc));
    for (std::size_t i = 0; i < 11; ++i)
        for (std::size_t j = 0; j < 6; ++j) ASSERT_EQ(P(i, j), Pc(i, j));

    Matrix<double> Z = api.logits(x);
    Matrix<double> Zc = Matrix<double>::from_shape({11, 6});
    core.logits(view(Zc));
    expect_identical(Z.data(), Zc.data(), Z.size());

    EXPECT_EQ(api.loss_and_grad(x), core.loss_and_grad(t));
    expect_identical(api.store.grad(), core.store.grad(), std::size_t(core.store.size()));
    index_t scored = 0;
    const double sum = core.loss(t, &scored);
    EXPECT_EQ(api.loss(x), sum);
    EXPECT_EQ(api.loss(x, /*mean=*/true), sum / double(scored));
}

TEST(CppApi, BatchesAreTheSequencesSideBySide) {
    DTransformer<double> m(small(Arch::D));
    const std::vector<TokenIds> batch{{1, 2, 3}, {4, 5, 6, 7, 8}, {9}};
    std::vector<Matrix<double>> Ps = m(batch);
    ASSERT_EQ(Ps.size(), 3u);
    for (std::size_t b = 0; b < 3; ++b) {
        Matrix<double> P = m(batch[b]);  // attention never crosses sequences
        ASSERT_EQ(Ps[b].shape(1), batch[b].size());
        EXPECT_LE(fttest::rel_error(Ps[b].data(), P.data(), P.size()), 1e-13);
    }
    double sum = 0;
    std::vector<double> g(std::size_t(m.store.size()), 0.0);
    for (const TokenIds& x : batch) {
        sum += m.loss_and_grad(x);
        for (index_t i = 0; i < m.store.size(); ++i) g[std::size_t(i)] += m.store.grad()[i];
    }
    EXPECT_NEAR(m.loss_and_grad(batch), sum, 1e-12 * std::abs(sum));
    EXPECT_LE(fttest::rel_error(m.store.grad(), g.data(), g.size()), 1e-12);
}

TEST(CppApi, EncoderAndEncoderDecoderMatchTheCorePath) {
    ETransformer<double> e(small(Arch::E)), ec(small(Arch::E));
    const TokenIds x{1, 2, 3, 4, 5}, xt{1, e.cfg.mask_token(), 3, e.cfg.mask_token(), 5};
    const std::vector<index_t> xi(x.begin(), x.end()), xti(xt.begin(), xt.end());
    const Tokens tt{xti.data(), Seqs::single(5)};
    EXPECT_EQ(e.loss_and_grad(xt, x), ec.loss_and_grad(tt, xi.data()));
    expect_identical(e.store.grad(), ec.store.grad(), std::size_t(ec.store.size()));
    Matrix<double> P = e(xt), Pc = Matrix<double>::from_shape({11, 5});
    ec.forward(tt);
    ec.probabilities(view(Pc));
    expect_identical(P.data(), Pc.data(), P.size());
    EXPECT_THROW(e.loss_and_grad(xt, TokenIds{1, 2}), ValueError);

    EDTransformer<double> ed(small(Arch::ED)), edc(small(Arch::ED));
    const TokenIds z{3, 4, 5, 6}, y{ed.cfg.bos_token(), 1, 2, ed.cfg.eos_token()};
    const std::vector<index_t> zi(z.begin(), z.end()), yi(y.begin(), y.end());
    const Tokens tz{zi.data(), Seqs::single(4)}, ty{yi.data(), Seqs::single(4)};
    EXPECT_EQ(ed.loss_and_grad(z, y), edc.loss_and_grad(tz, ty));
    expect_identical(ed.store.grad(), edc.store.grad(), std::size_t(edc.store.size()));
    Matrix<double> Q = ed(z, y), Qc = Matrix<double>::from_shape({11, 4});
    edc.forward(tz, ty);
    edc.probabilities(view(Qc));
    expect_identical(Q.data(), Qc.data(), Q.size());
    EXPECT_THROW(ed(std::vector<TokenIds>{z}, std::vector<TokenIds>{y, y}), ValueError);
}

TEST(CppApi, BadIdsThrowBeforeAnythingChanges) {
    DTransformer<double> m(small(Arch::D));
    EXPECT_THROW(m(TokenIds{1, 11}), IndexError);
    EXPECT_THROW(m(TokenIds{-1}), IndexError);
    EXPECT_THROW(m(TokenIds{}), ValueError);
    EXPECT_THROW(m(TokenIds{1, 2, 3, 4, 5, 6, 7, 8, 9}), ValueError);  // ℓ > ℓ_max
    EXPECT_THROW(m.params()["no_such"], ValueError);
    // no forward completed: attention_weights has nothing to show
    EXPECT_THROW(m.attention_weights(AttentionKind::Decoder, 0, 0, 0), ValueError);
}

TEST(CppApi, ParamsAndGradsAreWritableViewsOfTheFlatBuffers) {
    DTransformer<double> m(small(Arch::D));
    const ParamInfo& e = m.store.entry("W_e");
    auto W_e = m.params()["W_e"];
    ASSERT_EQ(W_e.shape(0), std::size_t(m.cfg.d_e));
    ASSERT_EQ(W_e.shape(1), std::size_t(m.cfg.n_vocab));
    W_e(2, 5) = 42.0;  // column-major [d_e, N_V]: element (2, 5) at offset 2 + 5·d_e
    EXPECT_EQ(m.store.theta()[e.offset + 2 + 5 * m.cfg.d_e], 42.0);
    // stacked heads: W_q (H, d_attn, d_x), head h a row block of the stored [H·d_attn, d_x]
    for (const ParamInfo& p : m.store.entries())
        if (p.shape.size() == 3) {
            auto W = m.params()[p.name];
            W(1, 0, 2) = -7.0;
            const index_t d_attn = p.shape[1];
            EXPECT_EQ(m.store.theta()[p.offset + (1 * d_attn + 0) + 2 * p.shape[0] * d_attn], -7.0) << p.name;
            break;
        }
    const TokenIds x{1, 2, 3};
    m.loss_and_grad(x);
    auto g = m.grads()["W_e"];
    EXPECT_EQ(g(0, 1), m.store.grad()[e.offset + 0 + 1 * m.cfg.d_e]);
    m.zero_grad();
    EXPECT_EQ(g(0, 1), 0.0);
    EXPECT_FALSE(m.params().names().empty());
}

TEST(CppApi, AdamStepsAModelAsTheFlatCall) {
    DTransformer<double> a(small(Arch::D)), b(small(Arch::D));
    Adam<double> oa(1e-2), ob(1e-2);
    const TokenIds x{1, 2, 3, 4};
    const std::vector<index_t> ids(x.begin(), x.end());
    for (int i = 0; i < 3; ++i) {
        a.loss_and_grad(x);
        oa.step(a);
        b.loss_and_grad(Tokens{ids.data(), Seqs::single(4)});
        ob.step(b.store, b.store.grad());
    }
    expect_identical(a.store.theta(), b.store.theta(), std::size_t(a.store.size()));
    SGD<double>(0.1).step(a);
    SGD<double>(0.1).step(b.store, b.store.grad());
    expect_identical(a.store.theta(), b.store.theta(), std::size_t(a.store.size()));
}

TEST(CppApi, TrainersAndInferenceOnTokenIds) {
    DTransformer<double> a(small(Arch::D)), b(small(Arch::D));
    const std::vector<TokenIds> data{{1, 2, 3, 4, 5}, {6, 7, 8, 9, 1}, {2, 4, 6, 8, 10}};
    TrainOptions o;
    o.n_epochs = 2;
    o.batch_size = 2;
    o.eta = 1e-2;
    Adam<double> oa(1e-2), ob(1e-2);
    std::vector<double> la, lb;
    DTraining(a, data, o, oa, [&](const StepInfo& s) { la.push_back(s.loss); return true; });
    DTraining<double>(b, dataset(data), o, update_rule(ob), [&](const StepInfo& s) { lb.push_back(s.loss); return true; });
    ASSERT_FALSE(la.empty());
    EXPECT_EQ(la, lb);
    expect_identical(a.store.theta(), b.store.theta(), std::size_t(a.store.size()));
    EXPECT_THROW(DTraining(a, std::vector<TokenIds>{{1, 99}}, o, oa), IndexError);

    SamplingOptions so;
    so.tau = 0.8;
    Rng r1(7), r2(7);
    const TokenIds prompt{1, 2};
    TokenIds y = DInference(a, prompt, 5, so, r1);
    std::vector<index_t> y2 = DInference(a, prompt.data(), 2, 5, so, r2);
    ASSERT_EQ(y.size(), 5u);
    EXPECT_TRUE(std::equal(y.begin(), y.end(), y2.begin()));

    EDTransformer<double> ed(small(Arch::ED));
    SGD<double> sgd(0.1);
    EXPECT_THROW(EDTraining(ed, data, data, o, sgd), ValueError);  // lr 0.1 beside eta 0.01: refused, not ignored
    o.eta = 0.1;
    EDTraining(ed, data, data, o, sgd);
    Rng r3(1), r4(1);
    TokenIds xh = EDInference(ed, TokenIds{3, 4, 5}, so, r3);
    const std::vector<index_t> z{3, 4, 5};
    std::vector<index_t> xh2 = EDInference(ed, z.data(), 3, so, r4);
    ASSERT_EQ(xh.size(), xh2.size());
    EXPECT_TRUE(std::equal(xh.begin(), xh.end(), xh2.begin()));
    EXPECT_EQ(xh(0), ed.cfg.bos_token());
}

// Algorithm 15 stops on a generated eos only: eos_id 0 (T5's pad is its start) and bos_id == eos_id (BART's
// decoder_start_token_id == eos_token_id) used to end every decoding at [bos] (line 2's y ← 0 taken for eos).
TEST(CppApi, EDInferenceStopsOnlyOnAGeneratedEos) {
    for (const auto& [bos, eos] : {std::pair<index_t, index_t>{0, 0}, {2, 2}, {5, 0}}) {
        ModelConfig c = small(Arch::ED);
        c.bos_id = bos, c.eos_id = eos;
        EDTransformer<double> ed(c);
        for (const bool cache : {true, false}) {
            SamplingOptions so;
            so.tau = 0.0, so.cache = cache;
            Rng r(1);
            const std::vector<index_t> z{3, 4, 5};
            const std::vector<index_t> x = EDInference(ed, z.data(), 3, so, r);
            ASSERT_GE(x.size(), 2u) << bos << " " << eos;  // decoded past the start token
            EXPECT_EQ(x[0], bos);
            EXPECT_EQ(std::find(x.begin() + 1, x.end() - 1, eos), x.end() - 1);  // no eos before the last token
            EXPECT_TRUE(x.back() == eos || index_t(x.size()) == c.l_max);        // its eos, or the length cap
        }
    }
}

TEST(CppApi, TokenizersAndChunks) {
    const std::string text = "to be or not to be";
    CharTokenizer tok = CharTokenizer::fit(text);
    TokenIds ids = as_ids(tok.encode(text, false, false));
    ASSERT_EQ(ids.size(), text.size());
    EXPECT_EQ(tok.decode(ids.data(), ids.size()), text);
    std::vector<TokenIds> c = chunk(ids, 5);
    ASSERT_EQ(c.size(), 4u);
    EXPECT_EQ(c[3].size(), 3u);
    EXPECT_EQ(c[1](0), ids(5));
}

// ---------------------------------------------------------------------------------------------- units
TEST(CppApiUnits, ComponentsMatchTheListingsClasses) {
    Rng rng(2);
    const Matrix<double> X = fttest::random_matrix<double>(6, 4, rng), Z = fttest::random_matrix<double>(5, 3, rng);

    unit::MHAttention<double> u(2, 6, 5, 3, 2, 7, Mask::bidirectional(), /*seed=*/4);
    ParamStore<double> s;
    MHAttention<double> att(2, 6, 5, 3, 2, 7, Mask::bidirectional(), s);
    s.allocate();
    std::copy(u.store.theta(), u.store.theta() + u.store.size(), s.theta());
    MHAttentionCache<double> c;
    Matrix<double> Vt = Matrix<double>::from_shape({7, 4});
    att.forward(s, view(X), Seqs::single(4), view(Z), Seqs::single(3), view(Vt), c);
    Matrix<double> Vu = u(X, Z);
    expect_identical(Vu.data(), Vt.data(), Vt.size());
    auto W = u.weights();
    ASSERT_TRUE(W.has_value());
    EXPECT_EQ(W->shape(0), 2u);
    const Matrix<double> dY = fttest::random_matrix<double>(7, 4, rng);
    auto [dX, dZ] = u.backward(dY);
    Matrix<double> dXc = Matrix<double>::from_shape({6, 4}), dZc = Matrix<double>::from_shape({5, 3});
    std::fill(dXc.begin(), dXc.end(), 0.0);
    std::fill(dZc.begin(), dZc.end(), 0.0);
    MHAttentionWork<double> w;
    att.backward(s, view(X), Seqs::single(4), view(Z), Seqs::single(3), c, view(dY), view(dXc), view(dZc), w);
    expect_identical(dX.data(), dXc.data(), dX.size());
    expect_identical(dZ.data(), dZc.data(), dZ.size());
    expect_identical(u.store.grad(), s.grad(), std::size_t(s.size()));

    unit::LayerNorm<double> ln(6);
    Matrix<double> E = ln(X);
    ParamStore<double> s2;
    LayerNorm<double> lc(6, 1e-5, s2);
    s2.allocate();
    lc.init(s2);
    NormCache<double> nc;
    Matrix<double> Ec = Matrix<double>::from_shape({6, 4});
    lc.forward(s2, view(X), view(Ec), nc);
    expect_identical(E.data(), Ec.data(), E.size());

    unit::TokenEmbedding<double> te(11, 4, 9);
    Matrix<double> Et = te(TokenIds{3, 3, 10});
    EXPECT_EQ(Et(1, 0), te.params()["W_e"](1, 3));
    te.backward(Matrix<double>(xt::ones<double>({4, 3})));
    EXPECT_EQ(te.grads()["W_e"](0, 3), 2.0);  // a token used twice gets both columns
}

TEST(CppApiUnits, StateAndInputChecks) {
    unit::LayerNorm<double> ln(3);
    EXPECT_THROW(ln.backward(Matrix<double>(xt::zeros<double>({3, 1}))), ValueError);  // before any forward
    ln(Matrix<double>(xt::ones<double>({3, 2})));
    EXPECT_THROW(ln.backward(Matrix<double>(xt::zeros<double>({3, 5}))), ValueError);  // other ℓ
    EXPECT_THROW(ln(Matrix<double>(xt::ones<double>({4, 2}))), ValueError);           // d_e
    unit::TokenEmbedding<float> te(5, 2);
    EXPECT_THROW(te(TokenIds{0, 5}), IndexError);
    EXPECT_THROW(te.backward(Matrix<float>(xt::zeros<float>({2, 1}))), ValueError);
    unit::PositionalEmbedding<double> pe(4, 2, Positional::Sinusoidal);
    EXPECT_THROW(pe(TokenIds{4}), IndexError);
    EXPECT_THROW(unit::PositionalEmbedding<double>(4, 2, Positional::None), ValueError);
    unit::Attention<double> at(2, 2, 2, 2, Mask::unidirectional());
    EXPECT_FALSE(at.weights().has_value());
    EXPECT_THROW(at.backward(Matrix<double>(xt::zeros<double>({2, 2}))), ValueError);
    unit::BasicAttention<double> ba(3, 2, 2);
    EXPECT_THROW(ba(Vector<double>(xt::ones<double>({2})), Matrix<double>(xt::ones<double>({3, 4}))), ValueError);
    Vector<double> v = ba(Vector<double>(xt::ones<double>({3})), Matrix<double>(xt::ones<double>({3, 4})));
    EXPECT_EQ(v.size(), 2u);
    unit::Unembedding<double> un(5, 3);
    Vector<double> p = un(Vector<double>(xt::ones<double>({3})));
    EXPECT_NEAR(xt::sum(p)(), 1.0, 1e-15);
    EXPECT_EQ(un.backward(Vector<double>(xt::ones<double>({5}))).size(), 3u);
}
