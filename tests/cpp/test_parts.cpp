// The parts of attention (parts.hpp, mask.hpp) and their registry; the worked example of docs/design.md
// "Adding a variant": the prefix mask (variants/prefix_mask.cpp), against explicit masks built by hand.
#include <algorithm>

#include "formal_transformers/attention.hpp"
#include "formal_transformers/config.hpp"
#include "formal_transformers/parts.hpp"
#include "testing.hpp"

using namespace ft;

namespace {
// Mask[t_z, t_x] = [[t_z < p or t_z ≤ t_x]], column-major [l, l], written out here with loops.
std::vector<std::uint8_t> prefix_by_hand(index_t l, index_t p) {
    std::vector<std::uint8_t> m(std::size_t(l * l), 0);
    for (index_t t_x = 0; t_x < l; ++t_x) {
        for (index_t t_z = 0; t_z < p; ++t_z) m[std::size_t(t_z + t_x * l)] = 1;       // the prefix: both ways
        for (index_t t_z = 0; t_z <= t_x; ++t_z) m[std::size_t(t_z + t_x * l)] = 1;    // the rest: causal
    }
    return m;
}

template <class T>
void copy_params(const ParamStore<double>& from, ParamStore<T>& to) {
    for (index_t i = 0; i < from.size(); ++i) to.theta()[i] = T(from.theta()[i]);
}

// Self-attention with the prefix mask over a batch of sequences of lengths ls and prefix lengths ps, against the
// same MHAttention (same θ) run on each sequence alone with its explicit mask built by hand: outputs, and (float64)
// the input and parameter gradients.
template <class T>
void prefix_matches_explicit(const std::string& position, double tol) {
    Rng rng(31);
    const std::vector<index_t> ls = {6, 4, 5}, ps = {2, 4, 0};  // p = ℓ: bidirectional; p = 0: causal
    const index_t H = 2, d = 6, d_attn = 4, d_mid = 3, d_out = 5;
    AttnVariant v;
    v.position = position;
    MaskOptions o;
    o.per_sequence = ps;
    const Mask prefix = make_mask("prefix", o);

    ParamStore<double> s0;  // the reference θ
    MHAttention<double> ref(H, d, d, d_attn, d_mid, d_out, prefix, s0, "", v);
    s0.allocate();
    fttest::randomize(s0, rng);

    const Seqs s = Seqs::from_lengths(ls);
    const index_t n = s.total();
    std::vector<double> X64 = fttest::randn(d * n, rng), dY64 = fttest::randn(d_out * n, rng);
    std::vector<T> X(X64.begin(), X64.end()), dY(dY64.begin(), dY64.end());

    ParamStore<T> sb;
    MHAttention<T> batched(H, d, d, d_attn, d_mid, d_out, prefix, sb, "", v);
    sb.allocate();
    copy_params(s0, sb);
    std::vector<T> Y(std::size_t(d_out * n)), dX(std::size_t(d * n), T(0));
    MHAttentionCache<T> c;
    MHAttentionWork<T> w;
    batched.forward(sb, CMatView<T>(X.data(), d, n), s, CMatView<T>(X.data(), d, n), s, MatView<T>(Y.data(), d_out, n), c);
    sb.zero_grad();
    batched.backward(sb, CMatView<T>(X.data(), d, n), s, CMatView<T>(X.data(), d, n), s, c,
                     CMatView<T>(dY.data(), d_out, n), MatView<T>(dX.data(), d, n), MatView<T>(dX.data(), d, n), w);

    std::vector<double> grad_sum(std::size_t(sb.size()), 0.0);
    for (index_t b = 0; b < s.count(); ++b) {
        const index_t l = s.len(b), at = s.begin(b);
        const std::vector<std::uint8_t> m = prefix_by_hand(l, ps[std::size_t(b)]);
        ParamStore<T> se;
        MHAttention<T> one(H, d, d, d_attn, d_mid, d_out, Mask::explicit_matrix(l, l, m.data()), se, "", v);
        se.allocate();
        copy_params(s0, se);
        std::vector<T> Ye(std::size_t(d_out * l)), dXe(std::size_t(d * l), T(0));
        MHAttentionCache<T> ce;
        MHAttentionWork<T> we;
        CMatView<T> Xb(X.data() + at * d, d, l);
        one.forward(se, Xb, Seqs::single(l), Xb, Seqs::single(l), MatView<T>(Ye.data(), d_out, l), ce);
        EXPECT_LT(fttest::rel_error(Y.data() + at * d_out, Ye, Ye.size()), tol) << position << " sequence " << b;
        se.zero_grad();
        one.backward(se, Xb, Seqs::single(l), Xb, Seqs::single(l), ce, CMatView<T>(dY.data() + at * d_out, d_out, l),
                     MatView<T>(dXe.data(), d, l), MatView<T>(dXe.data(), d, l), we);
        EXPECT_LT(fttest::rel_error(dX.data() + at * d, dXe, dXe.size()), tol) << position << " dX of sequence " << b;
        for (index_t i = 0; i < se.size(); ++i) grad_sum[std::size_t(i)] += double(se.grad()[i]);
    }
    EXPECT_LT(fttest::rel_error(sb.grad(), grad_sum, grad_sum.size()), tol) << position << " parameter gradients";
}
}  // namespace

TEST(PrefixMask, IsTheFormulaPerSequence) {
    MaskOptions o;
    o.per_sequence = {0, 3, 7};
    const Mask m = make_mask("prefix", o);
    EXPECT_EQ(m.name(), "prefix");
    for (index_t b = 0; b < 3; ++b) {
        const index_t l = 7;
        EXPECT_EQ(m.matrix(l, l, b), prefix_by_hand(l, o.per_sequence[std::size_t(b)])) << "sequence " << b;
    }
    // p = 0 is the unidirectional mask, p = ℓ the bidirectional one
    EXPECT_EQ(m.matrix(7, 7, 0), Mask::unidirectional().matrix(7, 7));
    EXPECT_EQ(m.matrix(7, 7, 2), Mask::bidirectional().matrix(7, 7));
    // the candidate keys of a column are exactly its allowed ones (one dense range)
    for (index_t t_x = 0; t_x < 7; ++t_x) {
        const KeyRange r = m.keys(1, t_x, 7);
        EXPECT_TRUE(r.dense);
        EXPECT_EQ(r.begin, 0);
        EXPECT_EQ(r.end, std::max<index_t>(3, t_x + 1));
    }
}

TEST(PrefixMask, MatchesExplicitMasksBuiltByHandFloat64) { prefix_matches_explicit<double>("none", 1e-12); }
TEST(PrefixMask, MatchesExplicitMasksBuiltByHandFloat32) { prefix_matches_explicit<float>("none", 1e-5); }
TEST(PrefixMask, MatchesExplicitMasksWithAlibiAndRope) {
    prefix_matches_explicit<double>("alibi", 1e-12);  // the score bias on the prefix's candidate keys
    prefix_matches_explicit<double>("rope", 1e-12);
}

TEST(PrefixMask, BackwardMatchesFiniteDifferences) {
    Rng rng(32);
    const index_t H = 2, d = 4, d_attn = 2, d_mid = 3, d_out = 3;
    MaskOptions o;
    o.per_sequence = {2, 1};
    ParamStore<double> store;
    MHAttention<double> att(H, d, d, d_attn, d_mid, d_out, make_mask("prefix", o), store);
    store.allocate();
    fttest::randomize(store, rng);
    fttest::expect_self_attention_backward_matches_finite_differences(att, store, rng, Seqs::from_lengths({4, 3}));
}

TEST(PrefixMask, BadOptionsAndBatchesAreClearErrors) {
    EXPECT_THROW(make_mask("prefix"), ValueError);  // no prefix lengths
    MaskOptions neg;
    neg.per_sequence = {1, -1};
    EXPECT_THROW(make_mask("prefix", neg), ValueError);
    MaskOptions o;
    o.per_sequence = {2, 5};
    const Mask m = make_mask("prefix", o);
    EXPECT_THROW(m.check(Seqs::from_lengths({4, 4, 4}), Seqs::from_lengths({4, 4, 4})), ValueError);  // 3 sequences, 2 p's
    EXPECT_THROW(m.check(Seqs::from_lengths({4, 4}), Seqs::from_lengths({4, 4})), ValueError);        // p = 5 > ℓ = 4
    EXPECT_NO_THROW(m.check(Seqs::from_lengths({4, 5}), Seqs::from_lengths({4, 5})));
    // and through the layer, before anything is computed
    ParamStore<double> store;
    MHAttention<double> att(1, 2, 2, 2, 2, 2, m, store);
    store.allocate();
    std::vector<double> X(2 * 6), Y(2 * 6, 7.0);
    MHAttentionCache<double> c;
    const Seqs s = Seqs::from_lengths({2, 4});  // p_0 = 2 fits, p_1 = 5 does not
    EXPECT_THROW(att.forward(store, CMatView<double>(X.data(), 2, 6), s, CMatView<double>(X.data(), 2, 6), s,
                             MatView<double>(Y.data(), 2, 6), c),
                 ValueError);
    EXPECT_EQ(Y, std::vector<double>(2 * 6, 7.0));
}

TEST(Registry, NamesAndClearErrors) {
    auto has = [](PartKind k, const char* name) {
        const std::vector<std::string> n = part_names(k);
        return std::find(n.begin(), n.end(), name) != n.end();
    };
    EXPECT_TRUE(has(PartKind::Mask, "prefix"));
    EXPECT_TRUE(has(PartKind::Mask, "causal"));  // (make_mask also takes its alias "unidirectional")
    EXPECT_TRUE(has(PartKind::Position, "rope"));
    EXPECT_TRUE(has(PartKind::Position, "alibi"));
    EXPECT_TRUE(has(PartKind::MLP, "swiglu"));
    EXPECT_TRUE(has(PartKind::MLP, "relu"));              // V21 (variants/relu_mlp.cpp)
    EXPECT_TRUE(has(PartKind::QKVSource, "qkv_bias"));    // V20 (variants/qkv_bias.cpp)
    EXPECT_TRUE(has(PartKind::Norm, "rms"));
    EXPECT_TRUE(has(PartKind::Norm, "scale"));
    EXPECT_TRUE(has(PartKind::Norm, "rms1p"));
    EXPECT_TRUE(has(PartKind::QKVSource, "qk_norm"));
    EXPECT_TRUE(has(PartKind::HeadKernel, "softcap"));
    EXPECT_TRUE(has(PartKind::Block, "parallel"));        // V30 (variants/parallel_block.cpp)
    EXPECT_TRUE(has(PartKind::Block, "sandwich"));        // V27 (variants/sandwich_block.cpp)
    EXPECT_NO_THROW(check_part_name(PartKind::Norm, "layer", "norm"));
    try {
        check_part_name(PartKind::Position, "xpos", "positional");
        FAIL() << "no error";
    } catch (const ValueError& e) {
        EXPECT_EQ(std::string(e.what()), "positional must be 'none', 'rope', 'alibi' or 'relative', got 'xpos'");
    }
    EXPECT_THROW(make_mask("sliding"), ValueError);
    ParamStore<float> s;
    EXPECT_THROW(make_norm<float>("fixnorm", 4, 1e-5, s, "g", "b"), ValueError);  // FixNorm is an embedding option, not a norm part
    MLPSpec spec;
    spec.d_e = 2, spec.d_mlp = 3;
    EXPECT_THROW(make_mlp<float>("reglu", spec, s, ""), ValueError);
    EXPECT_EQ(s.size(), 0);  // nothing registered by a failed lookup
    EXPECT_NO_THROW(make_mlp<float>("geglu", spec, s, ""));  // V18b (variants/gated_mlp.cpp)
    EXPECT_TRUE(has(PartKind::MLP, "geglu"));
}

// The parts that rotate with V1's RoPE (V10's shared key part, V26's θ of the local layers) ask the position's
// registry line whether it rotates the queries and keys (PositionProperty::RotatesQK), never its name; each refusal
// names the option that needs it and the positions that do
TEST(Registry, PartsThatRotateWithRopeAskThePositionsLine) {
    for (const std::string& name : part_names(PartKind::Position))
        EXPECT_EQ(position_has(name, PositionProperty::RotatesQK), name == "rope") << name;
    EXPECT_EQ(positions_with(PositionProperty::RotatesQK), "'rope'");
    auto error_of = [](Options o) -> std::string {
        Options all = {{"n_vocab", std::int64_t(19)}, {"l_max", std::int64_t(16)}, {"L", std::int64_t(2)},
                       {"H", std::int64_t(2)},        {"d_e", std::int64_t(8)},   {"d_mlp", std::int64_t(12)}};
        all.insert(all.end(), o.begin(), o.end());
        try {
            ModelConfig::from_options(Arch::D, all);
        } catch (const ValueError& e) {
            return e.what();
        }
        return "";
    };
    const Options latent = {{"kv_lora_rank", std::int64_t(4)}, {"qk_rope_head_dim", std::int64_t(2)},
                            {"bias", false}};
    const Options local = {{"sliding_window", std::int64_t(3)}, {"rope_local_base_freq", 30.0}};
    for (const char* p : {"learned", "sinusoidal", "alibi"}) {
        Options a = latent, b = local;
        a.emplace_back("positional", std::string(p)), b.emplace_back("positional", std::string(p));
        EXPECT_EQ(error_of(a), "kv_lora_rank (latent attention) rotates its shared key part with RoPE: positional='rope'") << p;
        EXPECT_EQ(error_of(b), "rope_local_base_freq is the RoPE θ of the local layers: it needs positional='rope'") << p;
    }
    Options a = latent, b = local;
    a.emplace_back("positional", std::string("rope")), b.emplace_back("positional", std::string("rope"));
    EXPECT_EQ(error_of(a), "");
    EXPECT_EQ(error_of(b), "");
    // the latent source's factory asks the same of the attention's position
    ParamStore<double> store;
    AttnVariant v;
    v.bias = false, v.position = "alibi";
    v.options.set("kv_lora_rank", std::int64_t(4)), v.options.set("qk_rope_head_dim", std::int64_t(2));
    try {
        MHAttention<double>(2, 8, 8, 4, 4, 8, Mask::unidirectional(), store, "", v);
        ADD_FAILURE() << "no error";
    } catch (const ValueError& e) {
        EXPECT_EQ(std::string(e.what()), "kv_lora_rank (latent attention) rotates its shared key part with RoPE: positional='rope'");
    }
}
