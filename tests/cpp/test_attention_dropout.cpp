// Dropout on the attention weights as a part around the head kernel (variants/attention_dropout.cpp): its row owns
// attn_dropout, one rule refuses the kernels that form no weights (config and factory alike), the listing runs
// unwrapped and keeps no dropped copy when the rate is 0, and the part's masks are the keyed stream's.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "formal_transformers/attention.hpp"
#include "formal_transformers/attention_dropout.hpp"
#include "formal_transformers/config.hpp"
#include "formal_transformers/parts.hpp"
#include "testing.hpp"

using namespace ft;

namespace {
Options sizes(Arch arch) {
    Options o = {{"n_vocab", std::int64_t(19)}, {"l_max", std::int64_t(96)}, {"H", std::int64_t(2)},
                 {"d_e", std::int64_t(8)},      {"d_mlp", std::int64_t(12)}};
    if (arch == Arch::ED) o.emplace_back("L_enc", std::int64_t(1)), o.emplace_back("L_dec", std::int64_t(1));
    else o.emplace_back("L", std::int64_t(1));
    if (arch == Arch::E) o.emplace_back("d_f", std::int64_t(8));
    return o;
}
ModelConfig config(Arch arch, Options more) {
    Options o = sizes(arch);
    o.insert(o.end(), more.begin(), more.end());
    return ModelConfig::from_options(arch, o);
}
// the ValueError of f's call, "" if none
template <class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const ValueError& e) {
        return e.what();
    }
    return "";
}
}  // namespace

TEST(AttentionDropout, ThePartOwnsItsOption) {
    const PartRow* row = find_part_row(PartKind::KernelWrapper, "dropout");
    ASSERT_NE(row, nullptr);
    EXPECT_STREQ(kind_name(row->kind), "kernel wrapper");
    ASSERT_EQ(row->options.size(), 1u);
    const PartOption& o = row->options[0];
    EXPECT_STREQ(o.name, "attn_dropout");
    EXPECT_EQ(o.archs, unsigned(archs::ALL));
    EXPECT_EQ(o.kind, OptionKind::Real);
    EXPECT_EQ(o.check, OptionCheck::Rate);
    EXPECT_EQ(o.default_value, OptionValue(0.0));
    EXPECT_NE(std::string(o.doc).find("Dropout(softmax"), std::string::npos) << o.doc;
    ASSERT_NE(row->check, nullptr);
    EXPECT_EQ(part_row_of_option("attn_dropout"), row);
    EXPECT_EQ(part_names(PartKind::KernelWrapper), std::vector<std::string>{"dropout"});
    for (Arch a : {Arch::D, Arch::E, Arch::ED}) {  // where it stood: the keyword, its JSON key, the order
        EXPECT_NE(ModelConfig::signature(a).find("dropout=0.0, embed_dropout=None, attn_dropout=None, resid_dropout=None"),
                  std::string::npos);
        const ModelConfig c = config(a, {{"dropout", 0.25}, {"attn_dropout", 0.1}});
        EXPECT_EQ(chosen_part(c, PartKind::KernelWrapper), row);
        EXPECT_EQ(attention_dropout_rate(c.part_options), 0.1);
        EXPECT_EQ(c.embed_dropout, 0.25);
        EXPECT_TRUE(c.has_dropout());
        EXPECT_NE(c.to_json().find("\"embed_dropout\":0.25,\"attn_dropout\":0.1,\"resid_dropout\":0.25"), std::string::npos)
            << c.to_json();
        EXPECT_EQ(ModelConfig::from_json(c.to_json()), c);
        const ModelConfig all = config(a, {{"dropout", 0.3}});  // dropout sets the part's rate too
        EXPECT_EQ(attention_dropout_rate(all.part_options), 0.3);
        const ModelConfig none = config(a, {});
        EXPECT_EQ(chosen_part(none, PartKind::KernelWrapper), nullptr);
        EXPECT_FALSE(none.has_dropout());
    }
    // the row's one check: a rate in [0, 1)
    const std::string e = error_of([] { config(Arch::D, {{"attn_dropout", 1.0}}); });
    EXPECT_NE(e.find("attn_dropout must be in [0, 1)"), std::string::npos) << e;
}

// One rule, the part's: the head kernel it wraps must form the weights (its registry line) — the same message from the
// config (resolve) and from the factory (an MHAttention made directly), for every kernel that forms none
TEST(AttentionDropout, OneRuleRefusesEveryKernelThatFormsNoWeights) {
    for (const char* k : {"softmax", "softcap", "sigmoid"}) EXPECT_TRUE(head_kernel_forms_weights(k)) << k;
    for (const char* k : {"tiled", "performer", "rfa", "bigbird"}) EXPECT_FALSE(head_kernel_forms_weights(k)) << k;
    EXPECT_EQ(kernels_forming_weights(), "'softmax', 'softcap', 'sigmoid'");
    const std::string rule = "attn_dropout = 0.1 drops attention weights, which the '";
    struct Case {
        Arch arch;
        Options o;
        const char* kernel;
    };
    const Case cases[] = {
        {Arch::D, {{"attention", std::string("performer")}}, "performer"},
        {Arch::D, {{"attention", std::string("rfa")}}, "rfa"},
        {Arch::E, {{"attention", std::string("bigbird")}, {"block_size", std::int64_t(4)}}, "bigbird"},
    };
    for (const Case& c : cases) {
        Options o = c.o;
        o.emplace_back("attn_dropout", 0.1);
        const std::string e = error_of([&] { config(c.arch, o); });
        EXPECT_NE(e.find(rule + c.kernel + "' head kernel does not form (kernels that do: 'softmax', 'softcap', 'sigmoid')"), std::string::npos)
            << c.kernel << ": " << e;
        config(c.arch, c.o);  // (the kernel itself is fine)
    }
    // the kernels that form weights take it (V25's softcap, which its own options choose, and sigmoid); BigBird's
    // layouts run densely ('literal', and 'tiled' whose kernel drops the same entries tile by tile)
    for (const Options& o : std::vector<Options>{{{"attn_logit_softcapping", 50.0}}, {{"query_pre_attn_scalar", 4.0}},
                                                 {{"attention", std::string("sigmoid")}}}) {
        Options with = o;
        with.emplace_back("attn_dropout", 0.1);
        const ModelConfig c = config(Arch::D, with);
        EXPECT_EQ(chosen_part(c, PartKind::KernelWrapper), find_part_row(PartKind::KernelWrapper, "dropout"));
        EXPECT_EQ(attention_dropout_rate(c.part_options), 0.1);
    }
    for (const char* impl : {"literal", "tiled"})
        config(Arch::E, {{"attention", std::string("bigbird")}, {"block_size", std::int64_t(4)},
                         {"attention_impl", std::string(impl)}, {"attn_dropout", 0.1}});
    // the factory: the same rule on the kernel it is given
    ParamStore<double> store;
    AttnVariant v;
    v.kernel = "performer";
    v.options.set("n_features", std::int64_t(4));
    v.options.set("attn_dropout", 0.1);
    const std::string e = error_of([&] { MHAttention<double>(2, 8, 8, 4, 4, 8, Mask::unidirectional(), store, "", v); });
    EXPECT_NE(e.find(rule + "performer' head kernel does not form"), std::string::npos) << e;
}

// Rate 0: the listing's kernel unwrapped (no dropped copy of A, no masks, even in a training forward); rate p: the
// kernel wrapped, A kept as the softmax beside Ã and the masks, which are the keyed stream's at A's entries
TEST(AttentionDropout, WrapsTheKernelOnlyWhenGivenAndDrawsTheKeyedMasks) {
    Rng rng(3);
    const index_t H = 2, d = 4, n = 5;
    const Matrix<double> X = fttest::random_matrix<double>(d * H, n, rng);
    const Seqs s = Seqs::from_lengths({3, 2});
    const Dropout train{0.0, 0.0, 9, 4};
    const DropPlace place{DropGroup::Layers, 1};
    for (double p : {0.0, 0.4}) {
        ParamStore<double> store;
        AttnVariant v;
        if (p > 0) v.options.set("attn_dropout", p);
        MHAttention<double> att(H, d * H, d * H, d, d, d * H, Mask::unidirectional(), store, "", v);
        store.allocate();
        att.init(store, rng, 0.5, 0.5);
        MHAttentionCache<double> c, plain;
        Matrix<double> Y = Matrix<double>::from_shape({std::size_t(d * H), std::size_t(n)}), Y0 = Y;
        att.forward(store, view(X), s, view(X), s, view(Y), c, false, &train, place.at(DropSite::SelfWeights));
        att.forward(store, view(X), s, view(X), s, view(Y0), plain);  // evaluating: the listing
        EXPECT_EQ(plain.A, c.A);  // A is the softmax either way
        EXPECT_TRUE(plain.Ad.empty() && plain.drop.keep.empty() && !plain.drop.active());
        if (p == 0) {
            EXPECT_EQ(Y, Y0);
            EXPECT_TRUE(c.Ad.empty() && c.drop.keep.empty() && !c.drop.active());
            continue;
        }
        ASSERT_EQ(c.Ad.size(), c.A.size());
        ASSERT_EQ(c.drop.keep.size(), c.A.size());
        const DropoutStream ds(p, train.key(place.at(DropSite::SelfWeights)));
        bool dropped = false;
        for (std::size_t i = 0; i < c.A.size(); ++i) {
            ASSERT_EQ(bool(c.drop.keep[i]), ds.keep(i)) << i;
            EXPECT_EQ(c.Ad[i], c.drop.keep[i] ? c.A[i] * (1.0 / (1.0 - p)) : 0.0);
            dropped |= !c.drop.keep[i] && c.A[i] > 0;
        }
        EXPECT_TRUE(dropped);
        EXPECT_NE(Y, Y0);
    }
}
