// Algorithms 8, 9, 10: gradients of every parameter vs central finite differences, batching, the losses'
// scored positions, causality, and decoding with caches equal to the full forward.
#include "formal_transformers/transformers.hpp"
#include "testing.hpp"

using namespace ft;

namespace {
ModelConfig tiny(Arch arch) {
    ModelConfig c;
    c.n_vocab = 7;
    c.l_max = 6;
    c.L = 2;
    c.L_enc = 1;
    c.L_dec = 2;
    c.H = 2;
    c.d_e = 4;
    c.d_mlp = 5;
    c.d_f = arch == Arch::E ? 3 : 0;
    c.d_attn = 3;  // d_attn ≠ d_mid ≠ d_e/H
    c.d_mid = 2;
    c.seed = 5;
    return c;
}

// ∂loss/∂θ by central differences for a sample of entries (every parameter entry when n is small)
template <class F>
void check_all_params(ParamStore<double>& store, F&& loss_fn, const std::vector<double>& analytic, double tol = 1e-6) {
    std::vector<double> num(std::size_t(store.size())), ana(std::size_t(store.size()));
    for (index_t i = 0; i < store.size(); ++i) {
        double* th = store.theta() + i;
        const double old = *th, h = 1e-6;
        *th = old + h;
        const double lp = loss_fn();
        *th = old - h;
        const double lm = loss_fn();
        *th = old;
        num[std::size_t(i)] = (lp - lm) / (2 * h);
        ana[std::size_t(i)] = analytic[std::size_t(i)];
    }
    // per parameter, so a failure names it
    for (const ParamInfo& e : store.entries()) {
        std::vector<double> a(ana.begin() + e.offset, ana.begin() + e.offset + e.size);
        std::vector<double> n(num.begin() + e.offset, num.begin() + e.offset + e.size);
        double scale = 0;
        for (double v : num) scale = std::max(scale, std::abs(v));
        double err = 0;
        for (std::size_t k = 0; k < a.size(); ++k) err = std::max(err, std::abs(a[k] - n[k]));
        EXPECT_LT(err / std::max(scale, 1e-12), tol) << e.name;
    }
}
}  // namespace

TEST(DTransformer, GradientsOfEveryParameterMatchFiniteDifferences) {
    for (const char* norm : {"layer", "rms"})
        for (bool tied : {false, true}) {
            ModelConfig c = tiny(Arch::D);
            c.norm = norm;
            c.tied = tied;
            c.gelu = tied ? Gelu::Tanh : Gelu::Exact;
            DTransformer<double> m(c);
            Rng rng(1);
            fttest::randomize(m.store, rng, 0.4);
            std::vector<index_t> ids = {1, 3, 3, 0, 6, 2, 5, 4};  // two sequences: 5 and 3 tokens
            Tokens x{ids.data(), Seqs::from_lengths({5, 3})};
            const double L0 = m.loss_and_grad(x);
            std::vector<double> g(m.store.grad(), m.store.grad() + m.store.size());
            auto f = [&] { return m.loss(x); };
            EXPECT_NEAR(f(), L0, 1e-12);
            check_all_params(m.store, f, g);
        }
}

TEST(ETransformer, GradientsOfEveryParameterMatchFiniteDifferences) {
    ModelConfig c = tiny(Arch::E);
    ETransformer<double> m(c);
    Rng rng(2);
    fttest::randomize(m.store, rng, 0.4);
    const index_t M = c.mask_token();
    std::vector<index_t> x = {1, 3, 2, 0, 6, 2, 5};
    std::vector<index_t> xt = {1, M, 2, M, 6, M, 5};  // sequences of 4 and 3
    Tokens xtl{xt.data(), Seqs::from_lengths({4, 3})};
    m.loss_and_grad(xtl, x.data());
    std::vector<double> g(m.store.grad(), m.store.grad() + m.store.size());
    check_all_params(m.store, [&] { return m.loss(xtl, x.data()); }, g);
}

TEST(ETransformer, LossScoresExactlyTheMaskedPositions) {
    ModelConfig c = tiny(Arch::E);
    ETransformer<double> m(c);
    const index_t M = c.mask_token();
    std::vector<index_t> x = {1, 3, 2, 0}, xt = {1, M, 2, M};
    Tokens xtl{xt.data(), Seqs::single(4)};
    index_t scored = 0;
    const double loss = m.loss(xtl, x.data(), &scored);
    EXPECT_EQ(scored, 2);
    // by hand: −log P[x[1], 1] − log P[x[3], 3] from the probabilities of the same forward
    Matrix<double> P = Matrix<double>::from_shape({std::size_t(c.n_vocab), 4});
    m.probabilities(view(P));
    EXPECT_NEAR(loss, -std::log(P(3, 1)) - std::log(P(0, 3)), 1e-12);
    // no masked position: 0 and zero gradients
    std::vector<index_t> none = {1, 3, 2, 0};
    Tokens nl{none.data(), Seqs::single(4)};
    EXPECT_EQ(m.loss_and_grad(nl, x.data()), 0.0);
    for (index_t i = 0; i < m.store.size(); ++i) ASSERT_EQ(m.store.grad()[i], 0.0);
}

TEST(EDTransformer, GradientsOfEveryParameterMatchFiniteDifferences) {
    ModelConfig c = tiny(Arch::ED);
    EDTransformer<double> m(c);
    Rng rng(3);
    fttest::randomize(m.store, rng, 0.4);
    std::vector<index_t> z = {1, 2, 3, 4, 0, 2, 2}, x = {5, 1, 3, 6, 5, 0};  // z: 3 + 4, x: 4 + 2
    Tokens zt{z.data(), Seqs::from_lengths({3, 4})}, xt{x.data(), Seqs::from_lengths({4, 2})};
    m.loss_and_grad(zt, xt);
    std::vector<double> g(m.store.grad(), m.store.grad() + m.store.size());
    check_all_params(m.store, [&] { return m.loss(zt, xt); }, g);
}

TEST(DTransformer, BatchIsTheSumOfItsSequences) {
    ModelConfig c = tiny(Arch::D);
    DTransformer<double> m(c);
    std::vector<index_t> ids = {1, 3, 3, 0, 6, 2, 5, 4, 4};
    const std::vector<index_t> lens = {5, 1, 3};
    Tokens x{ids.data(), Seqs::from_lengths(lens)};
    const double Lb = m.loss_and_grad(x);
    std::vector<double> gb(m.store.grad(), m.store.grad() + m.store.size()), gs(gb.size(), 0.0);
    double Ls = 0;
    index_t off = 0;
    for (index_t l : lens) {
        Tokens xi{ids.data() + off, Seqs::single(l)};
        Ls += m.loss_and_grad(xi);
        for (std::size_t k = 0; k < gs.size(); ++k) gs[k] += m.store.grad()[k];
        off += l;
    }
    EXPECT_NEAR(Lb, Ls, 1e-12);
    EXPECT_LT(fttest::rel_error(gb, gs, gs.size()), 1e-12);
}

TEST(DTransformer, IsCausal) {
    ModelConfig c = tiny(Arch::D);
    DTransformer<double> m(c);
    std::vector<index_t> a = {1, 2, 3, 4, 5, 6}, b = {1, 2, 3, 0, 0, 0};
    Matrix<double> Pa = Matrix<double>::from_shape({7, 6}), Pb = Matrix<double>::from_shape({7, 6});
    m.forward(Tokens{a.data(), Seqs::single(6)});
    m.probabilities(view(Pa));
    m.forward(Tokens{b.data(), Seqs::single(6)});
    m.probabilities(view(Pb));
    for (index_t t = 0; t < 3; ++t)
        for (index_t v = 0; v < 7; ++v) EXPECT_EQ(Pa(v, t), Pb(v, t));
    EXPECT_NE(Pa(0, 3), Pb(0, 3));
}

TEST(DTransformer, CachedDecodingEqualsTheFullForward) {
    ModelConfig c = tiny(Arch::D);
    c.positional = "sinusoidal";
    DTransformer<double> m(c);
    std::vector<index_t> ids = {1, 2, 3, 4, 5, 6};
    m.forward(Tokens{ids.data(), Seqs::single(6)});
    Matrix<double> Z = Matrix<double>::from_shape({7, 6});
    m.logits(view(Z));
    DTransformer<double>::Decoder d;
    std::vector<double> z(7);
    m.decode(d, ids.data(), 2, z.data());  // a prompt of 2, then one token at a time
    for (index_t v = 0; v < 7; ++v) EXPECT_NEAR(z[std::size_t(v)], Z(v, 1), 1e-13);
    for (index_t t = 2; t < 6; ++t) {
        m.decode(d, ids.data() + t, 1, z.data());
        for (index_t v = 0; v < 7; ++v) EXPECT_NEAR(z[std::size_t(v)], Z(v, t), 1e-13);
    }
    EXPECT_THROW(m.decode(d, ids.data(), 1, z.data()), ValueError);  // past l_max
}

TEST(EDTransformer, CachedDecodingEqualsTheFullForward) {
    ModelConfig c = tiny(Arch::ED);
    EDTransformer<double> m(c);
    std::vector<index_t> z = {1, 2, 3}, x = {5, 1, 3, 6, 0};
    m.forward(Tokens{z.data(), Seqs::single(3)}, Tokens{x.data(), Seqs::single(5)});
    Matrix<double> Z = Matrix<double>::from_shape({7, 5});
    m.logits(view(Z));
    EDTransformer<double>::Decoder d;
    m.encode(d, z.data(), 3);
    std::vector<double> lz(7);
    for (index_t t = 0; t < 5; ++t) {
        m.decode(d, x.data() + t, 1, lz.data());
        for (index_t v = 0; v < 7; ++v) EXPECT_NEAR(lz[std::size_t(v)], Z(v, t), 1e-13);
    }
}

TEST(Transformers, RejectBadHyperparametersAndInput) {
    ModelConfig c = tiny(Arch::D);
    c.d_attn = 0;
    c.d_e = 5;  // not divisible by H = 2
    EXPECT_THROW(DTransformer<float>{c}, ValueError);
    c = tiny(Arch::D);
    c.L = 0;
    EXPECT_THROW(DTransformer<float>{c}, ValueError);
    c = tiny(Arch::E);
    c.tied = true;  // d_f = 3 ≠ d_e = 4
    EXPECT_THROW(ETransformer<float>{c}, ValueError);
    DTransformer<float> m(tiny(Arch::D));
    std::vector<index_t> bad = {1, 7}, longer = {1, 1, 1, 1, 1, 1, 1};
    EXPECT_THROW(m.forward(Tokens{bad.data(), Seqs::single(2)}), IndexError);
    EXPECT_THROW(m.forward(Tokens{longer.data(), Seqs::single(7)}), ValueError);
    EXPECT_THROW(m.forward(Tokens{bad.data(), Seqs::from_lengths({1, 0})}), ValueError);
}

// The state of the last forward is owned and checked by the core: no forward yet, an attention the model
// has not, a layer / sequence / head out of range, a later smaller batch, and cached decoding in between.
TEST(Transformers, AttentionWeightsAreCheckedAgainstTheLastForward) {
    DTransformer<double> d(tiny(Arch::D));
    EXPECT_THROW(d.attention_weights(AttentionKind::Decoder, 0, 0, 0), ValueError);  // before any forward
    std::vector<index_t> ids = {1, 2, 3, 4, 5, 6, 0};
    Seqs two = Seqs::from_lengths({4, 3});
    d.forward(Tokens{ids.data(), two});
    EXPECT_EQ(d.attention_weights(AttentionKind::Decoder, 1, 1, 1).rows, 3);
    EXPECT_THROW(d.attention_weights(AttentionKind::Encoder, 0, 0, 0), ValueError);  // D has no encoder
    EXPECT_THROW(d.attention_weights(AttentionKind::Decoder, 2, 0, 0), IndexError);  // layer
    EXPECT_THROW(d.attention_weights(AttentionKind::Decoder, -1, 0, 0), IndexError);
    EXPECT_THROW(d.attention_weights(AttentionKind::Decoder, 0, 2, 0), IndexError);  // sequence
    EXPECT_THROW(d.attention_weights(AttentionKind::Decoder, 0, 0, 2), IndexError);  // head
    d.forward(Tokens{ids.data(), Seqs::single(2)});
    EXPECT_THROW(d.attention_weights(AttentionKind::Decoder, 0, 1, 0), IndexError);  // the batch of 2 is gone
    CMatView<double> A = d.attention_weights(AttentionKind::Decoder, 0, 0, 1);
    ASSERT_EQ(A.rows, 2);
    ASSERT_EQ(A.cols, 2);
    for (index_t j = 0; j < 2; ++j) EXPECT_NEAR(A(0, j) + A(1, j), 1.0, 1e-15);

    EDTransformer<double> ed(tiny(Arch::ED));
    EDTransformer<double>::Decoder dec;
    ed.encode(dec, ids.data(), 3);  // cached decoding is not a forward
    EXPECT_THROW(ed.attention_weights(AttentionKind::Decoder, 0, 0, 0), ValueError);
    ed.forward(Tokens{ids.data(), Seqs::single(5)}, Tokens{ids.data(), Seqs::single(2)});
    ed.encode(dec, ids.data(), 3);  // …nor does it change the last forward's matrices
    CMatView<double> E = ed.attention_weights(AttentionKind::Encoder, 0, 0, 0);
    EXPECT_EQ(E.rows, 5);
    EXPECT_EQ(E.cols, 5);
    CMatView<double> C = ed.attention_weights(AttentionKind::Cross, 1, 0, 0);
    EXPECT_EQ(C.rows, 5);
    EXPECT_EQ(C.cols, 2);
    EXPECT_THROW(ed.attention_weights(AttentionKind::Cross, 2, 0, 0), IndexError);
}

// ETransformer's BERT options (beyond Algorithm 9): segment embeddings, layer_norm after line 3, a bias on W_u
TEST(ETransformer, BertOptionsGradientsMatchFiniteDifferences) {
    for (bool tied : {false, true}) {
        ModelConfig c = tiny(Arch::E);
        c.part_options.set("n_segments", std::int64_t(3));
        c.part_options.set("embed_norm", true);
        c.unembed_bias = true;
        c.tied = tied;
        if (tied) c.d_f = c.d_e;
        ETransformer<double> m(c);
        Rng rng(3);
        fttest::randomize(m.store, rng, 0.4);
        const index_t M = c.mask_token();
        std::vector<index_t> x = {1, 3, 2, 0, 6, 2, 5};
        std::vector<index_t> xt = {1, M, 2, M, 6, M, 5};
        std::vector<index_t> seg = {0, 0, 1, 2, 2, 1, 0};
        Tokens xtl{xt.data(), Seqs::from_lengths({4, 3})};
        m.loss_and_grad(xtl, x.data(), seg.data());
        std::vector<double> g(m.store.grad(), m.store.grad() + m.store.size());
        check_all_params(m.store, [&] { return m.loss(xtl, x.data(), nullptr, nullptr, seg.data()); }, g);
        // the segment ids matter, and null means segment 0 everywhere
        std::vector<index_t> zeros(7, 0);
        EXPECT_NE(m.loss(xtl, x.data(), nullptr, nullptr, seg.data()), m.loss(xtl, x.data()));
        EXPECT_EQ(m.loss(xtl, x.data(), nullptr, nullptr, zeros.data()), m.loss(xtl, x.data()));
        std::vector<index_t> bad = {0, 0, 3, 0, 0, 0, 0};
        EXPECT_THROW(m.loss(xtl, x.data(), nullptr, nullptr, bad.data()), IndexError);
    }
    ModelConfig d = tiny(Arch::D);
    d.part_options.set("n_segments", std::int64_t(2));
    EXPECT_THROW(DTransformer<float>{d}, ValueError);  // ETransformer options only
}

// Dropout (docs/regularisation.md): with the masks replayed (dropout_step set back), every gradient of the three
// architectures matches central finite differences of the dropped loss; evaluation does not drop; rate 0 is the
// listing bit for bit.
namespace {
template <class M, class Call>
void check_dropout_gradients(M& m, Call&& loss_and_grad) {
    const std::uint64_t s = 11;
    m.dropout_step = s;
    const double L0 = loss_and_grad();
    EXPECT_EQ(m.dropout_step, s + 1);
    std::vector<double> g(m.store.grad(), m.store.grad() + m.store.size());
    auto f = [&] {
        m.dropout_step = s;
        return loss_and_grad();
    };
    EXPECT_EQ(f(), L0);  // replayed: the same masks
    check_all_params(m.store, f, g);
}
}  // namespace

TEST(Dropout, GradientsOfEveryParameterMatchFiniteDifferencesWithReplayedMasks) {
    for (int variant = 0; variant < 2; ++variant) {
        ModelConfig c = tiny(Arch::D);
        c.embed_dropout = 0.2, c.resid_dropout = 0.25;
        c.part_options.set("attn_dropout", 0.3);
        if (variant == 1) {  // RoPE, grouped-query attention, SwiGLU, no biases, RMSnorm
            c.positional = "rope";
            c.d_attn = 2;
            c.H_kv = 1;
            c.mlp = "swiglu";
            c.bias = false;
            c.norm = "rms";
        }
        DTransformer<double> m(c);
        Rng rng(1);
        fttest::randomize(m.store, rng, 0.4);
        std::vector<index_t> ids = {1, 3, 3, 0, 6, 2, 5, 4};
        Tokens x{ids.data(), Seqs::from_lengths({5, 3})};
        check_dropout_gradients(m, [&] { return m.loss_and_grad(x); });
        EXPECT_NE(m.loss(x), m.loss_and_grad(x));  // the evaluating loss does not drop
    }
    {
        ModelConfig c = tiny(Arch::E);
        c.embed_dropout = c.resid_dropout = 0.3;
        c.part_options.set("attn_dropout", 0.3);
        c.part_options.set("n_segments", std::int64_t(2));
        c.part_options.set("embed_norm", true);
        ETransformer<double> m(c);
        Rng rng(2);
        fttest::randomize(m.store, rng, 0.4);
        const index_t Mt = c.mask_token();
        std::vector<index_t> x = {1, 3, 2, 0, 6, 2, 5}, xt = {1, Mt, 2, Mt, 6, Mt, 5}, seg = {0, 1, 1, 0, 1, 0, 0};
        Tokens xtl{xt.data(), Seqs::from_lengths({4, 3})};
        check_dropout_gradients(m, [&] { return m.loss_and_grad(xtl, x.data(), seg.data()); });
    }
    {
        ModelConfig c = tiny(Arch::ED);
        c.embed_dropout = c.resid_dropout = 0.3;
        c.part_options.set("attn_dropout", 0.3);
        EDTransformer<double> m(c);
        Rng rng(3);
        fttest::randomize(m.store, rng, 0.4);
        std::vector<index_t> z = {1, 2, 3, 4, 0, 2, 2}, x = {5, 1, 3, 6, 5, 0};
        Tokens zt{z.data(), Seqs::from_lengths({3, 4})}, xt{x.data(), Seqs::from_lengths({4, 2})};
        check_dropout_gradients(m, [&] { return m.loss_and_grad(zt, xt); });
    }
}

TEST(Dropout, RateZeroIsTheListingBitForBit) {
    ModelConfig c = tiny(Arch::D);
    DTransformer<float> plain(c);
    c.embed_dropout = c.resid_dropout = 0.0;
    c.part_options.set("attn_dropout", 0.0);
    DTransformer<float> zero(c);
    std::vector<index_t> ids = {1, 3, 3, 0, 6};
    Tokens x{ids.data(), Seqs::single(5)};
    EXPECT_EQ(plain.loss_and_grad(x), zero.loss_and_grad(x));
    for (index_t i = 0; i < plain.store.size(); ++i) ASSERT_EQ(plain.store.grad()[i], zero.store.grad()[i]);
    EXPECT_TRUE(static_cast<const Model<float>&>(zero).dropout_masks().empty());
}

// Above 2^20 entries D1 and D2 run on the threads (dropout.cpp, for_entries): a mask that large equals the
// masks drawn in small pieces at their offsets (each below the threshold), entry for entry, and its backward
// scales by 1/(1 − p) exactly where the small path does — on 1 and 2 threads.
TEST(Dropout, LargeMasksEqualSmallOnes) {
    const double p = 0.25;
    const index_t n = (index_t(1) << 20) + 4099, piece = 10007;
    std::vector<double> x(static_cast<std::size_t>(n));
    Rng rng(31);
    for (auto& v : x) v = rng.normal();
    std::vector<double> small = x, dsmall(x.size(), 3.0);
    std::vector<std::uint8_t> ksmall(x.size());
    for (index_t o = 0; o < n; o += piece) {
        const index_t w = std::min(piece, n - o);
        dropout_forward<double>(p, DropoutKey{4, 5, 6}, std::uint64_t(o), small.data() + o, w, ksmall.data() + o);
        dropout_backward<double>(p, ksmall.data() + o, dsmall.data() + o, w);
    }
    const int saved = get_num_threads();
    for (int threads : {1, 2}) {
        set_num_threads(threads);
        std::vector<double> large = x, dlarge(x.size(), 3.0);
        std::vector<std::uint8_t> klarge(x.size());
        dropout_forward<double>(p, DropoutKey{4, 5, 6}, 0, large.data(), n, klarge.data());
        dropout_backward<double>(p, klarge.data(), dlarge.data(), n);
        set_num_threads(saved);
        index_t kept = 0;
        for (std::size_t i = 0; i < x.size(); ++i) {
            ASSERT_EQ(klarge[i], ksmall[i]) << "threads " << threads << " entry " << i;
            ASSERT_EQ(large[i], small[i]) << "threads " << threads << " entry " << i;
            ASSERT_EQ(large[i], klarge[i] ? x[i] * (1.0 / (1 - p)) : 0.0) << "D1 line 2, entry " << i;
            ASSERT_EQ(dlarge[i], klarge[i] ? 3.0 * (1.0 / (1 - p)) : 0.0) << "D2, entry " << i;
            ASSERT_EQ(dlarge[i], dsmall[i]) << "threads " << threads << " entry " << i;
            kept += klarge[i];
        }
        EXPECT_LT(std::abs(double(kept) - double(n) * (1 - p)), 5.5 * std::sqrt(double(n) * p * (1 - p)));
        // line 1 as written, at the end of the large mask too
        for (index_t i = n - 100; i < n; ++i)
            ASSERT_EQ(klarge[std::size_t(i)] != 0, dropout_uniform(DropoutKey{4, 5, 6}, std::uint64_t(i)) >= p) << i;
    }
}

TEST(Dropout, MaskFractionScalingAndBackward) {
    const double p = 0.3;
    const index_t n = 100000;
    std::vector<double> y(std::size_t(n), 2.0), dy(std::size_t(n), 1.0);
    std::vector<std::uint8_t> keep(static_cast<std::size_t>(n));
    dropout_forward<double>(p, DropoutKey{1, 2, 3}, 0, y.data(), n, keep.data());
    index_t kept = 0;
    for (index_t i = 0; i < n; ++i) {
        kept += keep[std::size_t(i)];
        ASSERT_EQ(y[std::size_t(i)], keep[std::size_t(i)] ? 2.0 / (1 - p) : 0.0);  // D1 line 2
    }
    // Binomial(n, 1−p): within 5.5σ (false alarm 4e-8)
    EXPECT_LT(std::abs(double(kept) - n * (1 - p)), 5.5 * std::sqrt(n * p * (1 - p)));
    dropout_backward<double>(p, keep.data(), dy.data(), n);
    for (index_t i = 0; i < n; ++i) ASSERT_EQ(dy[std::size_t(i)], keep[std::size_t(i)] ? 1.0 / (1 - p) : 0.0);  // D2
    // the stream is a function of (seed, step, place, entry): the same key gives the same mask, offsets agree
    std::vector<double> y2(10, 1.0);
    std::vector<std::uint8_t> k2(10);
    dropout_forward<double>(p, DropoutKey{1, 2, 3}, 500, y2.data(), 10, k2.data());
    for (index_t i = 0; i < 10; ++i) ASSERT_EQ(k2[std::size_t(i)], keep[std::size_t(500 + i)]);
    // line 1 as written: M[i] = [[u_i ≥ p]] with u_i = dropout_uniform(key, i) (the kernel compares in integers)
    for (index_t i = 0; i < 2000; ++i)
        ASSERT_EQ(keep[std::size_t(i)] != 0, dropout_uniform(DropoutKey{1, 2, 3}, std::uint64_t(i)) >= p) << i;
    EXPECT_THROW(check_dropout_rate(1.0, "dropout"), ValueError);
    EXPECT_THROW(check_dropout_rate(std::nan(""), "dropout"), ValueError);
}
