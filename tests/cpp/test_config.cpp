// ModelConfig's schema (config.hpp): keyword options, JSON both ways, equality, the repr, and the errors
// naming the option.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <string>
#include <tuple>

#include "formal_transformers/config.hpp"
#include "formal_transformers/parts.hpp"
#include "formal_transformers/transformers.hpp"

namespace {

using ft::Arch;
using ft::ModelConfig;
using ft::Options;
using ft::OptionValue;

Options sizes_d() {
    return {{"n_vocab", std::int64_t(11)}, {"l_max", std::int64_t(8)}, {"L", std::int64_t(2)},
            {"H", std::int64_t(2)},        {"d_e", std::int64_t(6)},   {"d_mlp", std::int64_t(10)}};
}

TEST(ModelConfig, FromOptionsFillsMembersAndDefaults) {
    Options o = sizes_d();
    o.emplace_back("positional", std::string("rope"));
    o.emplace_back("H_kv", std::int64_t(1));
    o.emplace_back("d_attn", std::int64_t(2));  // rope: an even head size
    o.emplace_back("norm", std::string("rms"));
    o.emplace_back("seed", std::uint64_t(18446744073709551615ull));
    o.emplace_back("dropout", 0.25);
    o.emplace_back("attn_dropout", std::int64_t(0));  // an int for a real option
    o.emplace_back("embed_dropout", std::monostate{});  // None: dropout's rate
    const ModelConfig c = ModelConfig::from_options(Arch::D, o);
    EXPECT_EQ(c.arch, Arch::D);
    EXPECT_EQ(c.n_vocab, 11);
    EXPECT_EQ(c.d_mlp, 10);
    EXPECT_EQ(c.d_attn, 2);
    EXPECT_EQ(c.d_mid, 3);  // resolved: d_e / H
    EXPECT_EQ(c.H_kv, 1);
    EXPECT_EQ(c.positional, "rope");
    EXPECT_EQ(c.norm, "rms");
    EXPECT_EQ(c.seed, 18446744073709551615ull);
    EXPECT_EQ(c.embed_dropout, 0.25);  // dropout: the rates not given
    EXPECT_EQ(c.resid_dropout, 0.25);
    EXPECT_EQ(c.part_options.real("attn_dropout"), 0.0);
    EXPECT_EQ(c.eps, 1e-5);  // a default
    EXPECT_FALSE(c.tied);
}

TEST(ModelConfig, SizesPositionally) {
    EXPECT_EQ(ModelConfig::positional_names(Arch::D), (std::vector<std::string>{"n_vocab", "l_max", "L", "H", "d_e", "d_mlp"}));
    EXPECT_EQ(ModelConfig::positional_names(Arch::E),
              (std::vector<std::string>{"n_vocab", "l_max", "L", "H", "d_e", "d_mlp", "d_f"}));
    EXPECT_EQ(ModelConfig::positional_names(Arch::ED),
              (std::vector<std::string>{"n_vocab", "l_max", "L_enc", "L_dec", "H", "d_e", "d_mlp"}));
    const std::vector<OptionValue> pos = {std::int64_t(9), std::int64_t(5), std::int64_t(1), std::int64_t(2),
                                          std::int64_t(2), std::int64_t(4), std::int64_t(8)};
    const ModelConfig c = ModelConfig::from_options(Arch::ED, {{"tied", true}}, pos);
    EXPECT_EQ(c.L_enc, 1);
    EXPECT_EQ(c.L_dec, 2);
    EXPECT_EQ(c.d_mlp, 8);
    EXPECT_TRUE(c.tied);
}

TEST(ModelConfig, ErrorsNameTheOption) {
    auto expect_error = [](Options o, const std::string& needle, bool type_error) {
        try {
            ModelConfig::from_options(Arch::D, o);
            ADD_FAILURE() << "no error for " << needle;
        } catch (const ft::TypeError& e) {
            EXPECT_TRUE(type_error) << e.what();
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        } catch (const ft::ValueError& e) {
            EXPECT_FALSE(type_error) << e.what();
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    auto with = [](const char* k, OptionValue v) {
        Options o = sizes_d();
        o.emplace_back(k, v);
        return o;
    };
    expect_error(with("n_segments", std::int64_t(2)), "unexpected keyword argument 'n_segments'", true);  // E only
    expect_error(with("colour", std::string("red")), "'colour'", true);
    expect_error(with("eps", std::string("small")), "eps must be a real number, got str", true);
    expect_error(with("tied", std::int64_t(1)), "tied must be True or False, got int", true);
    expect_error(with("d_attn", 1.5), "d_attn must be an int, got float", true);
    expect_error(with("L", std::int64_t(3)), "multiple values for argument 'L'", true);
    expect_error(with("positional", std::string("spiral")), "positional must be one of 'learned', 'sinusoidal', 'rope', 'alibi'", false);
    expect_error(with("gelu", std::string("relu")), "gelu must be one of 'exact', 'tanh', got 'relu'", false);
    expect_error(with("d_attn", std::int64_t(0)), "d_attn must be a positive integer", false);
    expect_error(with("eps", -1.0), "eps must be >= 0", false);
    expect_error(with("init_std", 0.0), "init_std must be > 0", false);
    expect_error(with("base", -2.0), "base must be > 0", false);
    expect_error(with("seed", std::int64_t(-1)), "seed = -1 is outside", false);
    expect_error(with("dropout", 1.0), "dropout", false);
    expect_error(with("resid_dropout", -0.5), "resid_dropout", false);
    Options missing = sizes_d();
    missing.pop_back();
    expect_error(missing, "missing required argument 'd_mlp'", true);
    Options zero = sizes_d();
    zero[1].second = std::int64_t(0);
    expect_error(zero, "l_max must be a positive integer, got 0", false);
    EXPECT_THROW(ModelConfig::from_options(Arch::D, {}, std::vector<OptionValue>(7, std::int64_t(2))), ft::TypeError);
}

TEST(ModelConfig, JsonRoundTripAndEquality) {
    Options o = sizes_d();
    o.emplace_back("positional", std::string("sinusoidal"));
    o.emplace_back("base", 500.0);
    o.emplace_back("gelu", std::string("tanh"));
    o.emplace_back("seed", std::int64_t(7));
    const ModelConfig c = ModelConfig::from_options(Arch::D, o);
    const std::string text = c.to_json("float64");
    EXPECT_EQ(text.rfind("{\"arch\":\"DTransformer\",\"n_vocab\":11,\"l_max\":8,\"L\":2,", 0), 0u) << text;
    EXPECT_NE(text.find("\"dtype\":\"float64\"}"), std::string::npos) << text;
    EXPECT_EQ(text.find("n_segments"), std::string::npos);  // E's options are not D's
    const ModelConfig back = ModelConfig::from_json(text);
    EXPECT_TRUE(back == c);
    EXPECT_EQ(back.part_options.real("base"), 500.0);
    EXPECT_EQ(ModelConfig::json_dtype(text), "float64");
    EXPECT_EQ(ModelConfig::json_dtype(c.to_json()), "");
    ModelConfig other = c;
    other.eps = 1e-6;
    EXPECT_TRUE(other != c);
    other = c;
    other.seed = 8;
    EXPECT_FALSE(other == c);
    other = c;
    other.L_enc = 3;  // not an option of DTransformer: not part of its config
    EXPECT_TRUE(other == c);

    // ETransformer and EDTransformer carry their own options
    for (Arch a : {Arch::E, Arch::ED}) {
        Options oe = {{"n_vocab", std::int64_t(12)}, {"l_max", std::int64_t(6)}, {"H", std::int64_t(2)},
                      {"d_e", std::int64_t(4)},      {"d_mlp", std::int64_t(8)}, {"H_kv", std::int64_t(1)}};
        if (a == Arch::E) {
            oe.insert(oe.end(), {{"L", std::int64_t(1)}, {"d_f", std::int64_t(5)}, {"n_segments", std::int64_t(2)}, {"unembed_bias", true}});
        } else {
            oe.insert(oe.end(), {{"L_enc", std::int64_t(1)}, {"L_dec", std::int64_t(2)}});
        }
        const ModelConfig ce = ModelConfig::from_options(a, oe);
        const ModelConfig be = ModelConfig::from_json(ce.to_json());
        EXPECT_TRUE(be == ce) << ce.to_json();
        EXPECT_EQ(be.arch, a);
    }
}

TEST(ModelConfig, FromJsonOldAndDamaged) {
    // a file written before the variants and dropout existed: the options it lacks take their defaults
    const ModelConfig old = ModelConfig::from_json(
        R"({"arch": "DTransformer", "n_vocab": 10, "l_max": 4, "L": 1, "H": 2, "d_e": 4, "d_mlp": 8, "d_attn": 2,
            "d_mid": 2, "norm": "layer", "positional": "learned", "base": null, "tied": false, "gelu": "none",
            "eps": 1e-05, "seed": 3, "init_std": 0.02, "dtype": "float32"})");
    EXPECT_EQ(old.H_kv, 2);
    EXPECT_TRUE(old.bias);
    EXPECT_EQ(old.embed_dropout, 0.0);
    EXPECT_EQ(old.gelu, ft::Gelu::Exact);
    EXPECT_EQ(old.seed, 3u);
    EXPECT_THROW(ModelConfig::from_json("[1, 2]"), ft::ValueError);
    EXPECT_THROW(ModelConfig::from_json("{\"arch\": \"DTransformer\", "), ft::ValueError);
    EXPECT_THROW(ModelConfig::from_json(R"({"n_vocab": 10})"), ft::ValueError);
    EXPECT_THROW(ModelConfig::from_json(R"({"arch": "GPT", "n_vocab": 10})"), ft::ValueError);
    // wrong types in a file are damaged data: ValueError, naming the option
    try {
        ModelConfig::from_json(R"({"arch": "DTransformer", "n_vocab": "ten", "l_max": 4, "L": 1, "H": 2, "d_e": 4, "d_mlp": 8})");
        ADD_FAILURE();
    } catch (const ft::ValueError& e) {
        EXPECT_NE(std::string(e.what()).find("n_vocab must be an int"), std::string::npos) << e.what();
    }
    EXPECT_THROW(ModelConfig::from_json(R"({"arch": "DTransformer", "n_vocab": 10, "l_max": 4, "L": 1, "H": 2, "d_e": 4,
                                            "d_mlp": 8, "dtype": "float16"})"),
                 ft::ValueError);
    EXPECT_THROW(ModelConfig::json_dtype(R"({"arch": "DTransformer", "dtype": 32})"), ft::ValueError);
}

TEST(ModelConfig, ReprAndSignature) {
    Options o = sizes_d();
    o.emplace_back("rope_theta", 10000.0);  // (the RoPE position's option: at its default with positional='learned')
    const ModelConfig c = ModelConfig::from_options(Arch::D, o);
    const std::string r = c.to_string("float32");
    EXPECT_EQ(r.rfind("DTransformer(n_vocab=11, l_max=8, L=2, H=2, d_e=6, d_mlp=10, d_attn=3, d_mid=3, norm='layer', "
                      "positional='learned', base=None, tied=False, gelu='exact', eps=1e-05, seed=0, init_std=0.02, ",
                      0),
              0u)
        << r;
    EXPECT_NE(r.find("attention='softmax', n_features=None, feature_seed=0, attn_logit_softcapping=None, "
                     "query_pre_attn_scalar=None, mlp='gelu', rope_theta=10000.0, sliding_window=None, "
                     "sliding_window_pattern=None, rope_local_base_freq=None, attention_chunk_size=None, "
                     "kv_lora_rank=None, q_lora_rank=None, qk_rope_head_dim=None, qkv_bias=False, qk_norm=False, "
                     "mask='causal', "),
              std::string::npos)
        << r;
    EXPECT_NE(r.find(", fixnorm=False, embed_scale=None, final_logit_softcapping=None, "
                     "dtype='float32')"),
              std::string::npos)
        << r;
    EXPECT_NE(ModelConfig::signature(Arch::D).find("rope_theta=10000.0, sliding_window=None"), std::string::npos);
    const std::string sig = ModelConfig::signature(Arch::E);
    EXPECT_EQ(sig.rfind("n_vocab, l_max, L, H, d_e, d_mlp, d_f, *, d_attn=None, d_mid=None, positional='learned', ", 0), 0u)
        << sig;
    EXPECT_NE(sig.find("dropout=0.0, embed_dropout=None, attn_dropout=None"), std::string::npos) << sig;
    EXPECT_NE(sig.find("n_segments=0, embed_norm=False, unembed_bias=False"), std::string::npos) << sig;
}

// The standard MLP's names are the architecture's (the schema's per-architecture name table): "gelu" in D
// (Algorithms 9-10), "relu" in ED (Algorithm 8); each refused in the other, the allowed names listed per
// architecture, written back as the architecture's name; a file without "mlp" (older versions) loads.
TEST(ModelConfig, MlpNamesArePerArchitecture) {
    Options ed = {{"n_vocab", std::int64_t(12)}, {"l_max", std::int64_t(6)}, {"L_enc", std::int64_t(1)},
                  {"L_dec", std::int64_t(1)},    {"H", std::int64_t(2)},     {"d_e", std::int64_t(4)},
                  {"d_mlp", std::int64_t(8)}};
    auto message = [](Arch a, Options o, const std::string& mlp) -> std::string {
        o.emplace_back("mlp", mlp);
        try {
            ModelConfig::from_options(a, o);
        } catch (const ft::ValueError& e) {
            return e.what();
        }
        return "";
    };
    EXPECT_EQ(message(Arch::ED, ed, "gelu"), "");  // ED's "gelu" is V22's GELU MLP (BART)
    EXPECT_EQ(message(Arch::D, sizes_d(), "relu"), "");  // D's "relu" is V21's ReLU MLP (OPT), not its standard one
    EXPECT_EQ(message(Arch::ED, ed, "bogus"), "mlp must be one of 'relu', 'gelu', 'swiglu', 'geglu', got 'bogus'");
    EXPECT_EQ(message(Arch::D, sizes_d(), "bogus"), "mlp must be one of 'gelu', 'swiglu', 'geglu', 'relu', got 'bogus'");
    for (const auto& [a, sizes, standard] : {std::tuple{Arch::D, sizes_d(), "gelu"}, std::tuple{Arch::ED, ed, "relu"}}) {
        for (const std::string name : {std::string(standard), std::string("swiglu"), std::string("geglu"), std::string("gated-gelu")}) {
            Options o = sizes;
            o.emplace_back("mlp", name);
            const ModelConfig c = ModelConfig::from_options(a, o);
            const std::string text = c.to_json();
            const std::string written = name == "gated-gelu" ? "geglu" : name;  // an alias is written as the first name
            EXPECT_NE(text.find("\"mlp\":\"" + written + "\""), std::string::npos) << text;
            EXPECT_TRUE(ModelConfig::from_json(text) == c) << text;
        }
        EXPECT_NE(ModelConfig::signature(a).find(std::string("mlp='") + standard + "'"), std::string::npos);
    }
    // older files: ED before it had an mlp option, D before the variants
    const ModelConfig old_ed = ModelConfig::from_json(
        R"({"arch": "EDTransformer", "n_vocab": 12, "l_max": 6, "L_enc": 1, "L_dec": 1, "H": 2, "d_e": 4, "d_mlp": 8,
            "d_attn": 2, "d_mid": 2, "norm": "layer", "positional": "learned", "base": null, "tied": false,
            "eps": 1e-05, "seed": 3, "init_std": 0.02})");
    EXPECT_EQ(old_ed.mlp, "relu");  // Algorithm 8's
    EXPECT_NE(old_ed.to_json().find("\"mlp\":\"relu\""), std::string::npos);
}

// norm, mlp, mask and attention take the registry's names (parts.hpp selected_part): every registered norm and MLP,
// every mask of DTransformer's and every head kernel of ETransformer's not chosen by its own options (nor, the tiled
// kernel, by attention_impl), is accepted by its name with no other edit (a new one is its file and its registry
// line), written back by it, and builds; an unknown name's error lists exactly those names, the architecture's
// listing's first.
TEST(ModelConfig, PartSelectorsTakeTheRegistrysNames) {
    for (const auto& [kind, option, arch] :
         {std::tuple{ft::PartKind::Norm, "norm", Arch::D}, std::tuple{ft::PartKind::MLP, "mlp", Arch::D},
          std::tuple{ft::PartKind::Mask, "mask", Arch::D}, std::tuple{ft::PartKind::HeadKernel, "attention", Arch::E}}) {
        Options sizes = sizes_d();
        if (arch == Arch::E) sizes.emplace_back("d_f", std::int64_t(6));
        std::vector<std::string> names;  // (a mask its own options choose, V8's sliding window, is not named by `mask`)
        for (const ft::SelectorName& n : ft::selector_names(kind, arch)) names.push_back(n.name);
        ASSERT_GE(names.size(), 2u);
        if (kind == ft::PartKind::Norm || kind == ft::PartKind::MLP) EXPECT_EQ(names, ft::part_names(kind));
        if (kind == ft::PartKind::HeadKernel)  // (V25's softcap: its option chooses it; tiled: attention_impl's)
            for (const char* other : {"tiled", "softcap"}) EXPECT_EQ(std::count(names.begin(), names.end(), other), 0) << other;
        std::string list = std::string("'") + ft::default_part(kind, arch) + "'";
        for (const std::string& name : names) {
            if (name != ft::default_part(kind, arch)) list += ", '" + name + "'";
            Options o = sizes;
            o.emplace_back(option, name);
            if (kind == ft::PartKind::HeadKernel && ft::head_kernel_has(name, ft::HeadKernelProperty::BlockLayouts))
                o.emplace_back("block_size", std::int64_t(1));  // (V17's layouts: blocks of one token)
            const ModelConfig c = ModelConfig::from_options(arch, o);
            EXPECT_EQ(kind == ft::PartKind::Norm  ? c.norm
                      : kind == ft::PartKind::MLP ? c.mlp
                      : kind == ft::PartKind::Mask ? c.mask
                                                   : c.attention,
                      name);
            EXPECT_NE(c.to_json().find("\"" + std::string(option) + "\":\"" + name + "\""), std::string::npos);
            EXPECT_TRUE(ModelConfig::from_json(c.to_json()) == c) << option << "=" << name;
            if (arch == Arch::D) EXPECT_NO_THROW(ft::DTransformer<double>{c}) << option << "=" << name;
            else EXPECT_NO_THROW(ft::ETransformer<double>{c}) << option << "=" << name;
        }
        Options o = sizes;
        o.emplace_back(option, std::string("bogus"));
        try {
            ModelConfig::from_options(arch, o);
            ADD_FAILURE() << "no error";
        } catch (const ft::ValueError& e) {
            EXPECT_EQ(std::string(e.what()), std::string(option) + " must be one of " + list + ", got 'bogus'");
        }
    }
    // positional: every registered position's name, each in the architecture its line puts it in (D's layers, ED's
    // stacks; a table of Algorithm 2's, any); "none", an attention's own, is named by no option
    std::vector<std::string> names;
    for (const ft::SelectorName& n : ft::selector_names(ft::PartKind::Position, Arch::D)) names.push_back(n.name);
    EXPECT_EQ(names, (std::vector<std::string>{"learned", "sinusoidal", "rope", "alibi", "relative"}));
    for (const std::string& name : names) {
        const bool ed = ft::position_has(name, ft::PositionProperty::StackTables);
        Options o = sizes_d();
        if (ed) o = {{"n_vocab", std::int64_t(11)}, {"l_max", std::int64_t(8)}, {"L_enc", std::int64_t(1)},
                     {"L_dec", std::int64_t(1)},    {"H", std::int64_t(2)},    {"d_e", std::int64_t(6)},
                     {"d_mlp", std::int64_t(10)}};
        o.emplace_back("positional", name);
        o.emplace_back("d_attn", std::int64_t(2));  // (RoPE rotates pairs of rows)
        const ModelConfig c = ModelConfig::from_options(ed ? Arch::ED : Arch::D, o);
        EXPECT_EQ(c.positional, name);
        EXPECT_NE(c.to_json().find("\"positional\":\"" + name + "\""), std::string::npos);
        EXPECT_TRUE(ModelConfig::from_json(c.to_json()) == c) << name;
        if (ed) EXPECT_NO_THROW(ft::EDTransformer<double>{c}) << name;
        else EXPECT_NO_THROW(ft::DTransformer<double>{c}) << name;
    }
    Options bogus = sizes_d();
    bogus.emplace_back("positional", std::string("none"));
    try {
        ModelConfig::from_options(Arch::D, bogus);
        ADD_FAILURE() << "no error";
    } catch (const ft::ValueError& e) {
        EXPECT_EQ(std::string(e.what()), "positional must be one of 'learned', 'sinusoidal', 'rope', 'alibi', 'relative', got 'none'");
    }
    // a config built in C++ with a name of neither kind: resolve's ValueError; ETransformer's MLP and norm are the listing's
    ModelConfig c = ModelConfig::from_options(Arch::D, sizes_d());
    c.norm = "batch";
    EXPECT_THROW(ft::resolve(c, Arch::D), ft::ValueError);
    c.norm = "rms", c.d_f = 6;
    try {
        ft::resolve(c, Arch::E);
        ADD_FAILURE() << "no error";
    } catch (const ft::ValueError& e) {
        EXPECT_EQ(std::string(e.what()).rfind("norm='rms': norm is an option of the DTransformer and EDTransformer", 0), 0u)
            << e.what();
    }
}

// What the code asks of a position part is its registry line's (parts.hpp PositionProperty, position_table), asked by
// name: Algorithm 2's two tables, RoPE and ALiBi in D's layers (no l_max bound; ALiBi's bias extrapolates), T5's bias
// tables per ED stack; no table for the parts in attention.
TEST(ModelConfig, PositionsDeclareWhatTheCodeAsks) {
    using P = ft::PositionProperty;
    EXPECT_EQ(ft::position_table("learned"), ft::Positional::Learned);
    EXPECT_EQ(ft::position_table("sinusoidal"), ft::Positional::Sinusoidal);
    for (const char* n : {"none", "rope", "alibi", "relative"}) EXPECT_EQ(ft::position_table(n), ft::Positional::None) << n;
    for (const char* n : {"none", "learned", "sinusoidal"})
        for (P p : {P::Layers, P::StackTables, P::ScoreBias, P::PastLMax, P::Extrapolates})
            EXPECT_FALSE(ft::position_has(n, p)) << n;
    for (P p : {P::Layers, P::PastLMax}) EXPECT_TRUE(ft::position_has("rope", p) && ft::position_has("alibi", p));
    EXPECT_FALSE(ft::position_has("rope", P::ScoreBias) || ft::position_has("rope", P::Extrapolates));
    EXPECT_TRUE(ft::position_has("alibi", P::ScoreBias) && ft::position_has("alibi", P::Extrapolates));
    EXPECT_TRUE(ft::position_has("relative", P::StackTables) && ft::position_has("relative", P::ScoreBias));
    EXPECT_FALSE(ft::position_has("relative", P::Layers) || ft::position_has("relative", P::PastLMax));
    EXPECT_EQ(ft::positions_with(P::Layers), "'rope' and 'alibi'");
    EXPECT_THROW(ft::position_has("bogus", P::Layers), ft::ValueError);
    // the messages of resolve's placement rule, from the lines
    ModelConfig c = ModelConfig::from_options(Arch::D, sizes_d());
    c.positional = "alibi", c.d_f = 6, c.mask.clear();  // (E: its listing's mask)
    try {
        ft::resolve(c, Arch::E);
        ADD_FAILURE() << "no error";
    } catch (const ft::ValueError& e) {
        EXPECT_EQ(std::string(e.what()), "positional='rope' and 'alibi' are DTransformer options");
    }
    c.positional = "relative";
    EXPECT_THROW(ft::resolve(c, Arch::D), ft::ValueError);
    EXPECT_EQ(ft::max_input_length(ft::resolve(c = ModelConfig::from_options(Arch::D, sizes_d()), Arch::D)), 8);
    c.positional = "alibi";
    EXPECT_GT(ft::max_input_length(ft::resolve(c, Arch::D)), 8);
}

// What the code asks of a head kernel is its registry line's (parts.hpp HeadKernelProperty), asked by name: the
// listing's forms its weights, keeps its keys and is the softmax paged decoding forms; V15's fold the keys into a
// state; V17's block layouts are BigBird's alone.
TEST(ModelConfig, HeadKernelsDeclareWhatTheCodeAsks) {
    using P = ft::HeadKernelProperty;
    for (P p : {P::FormsWeights, P::KeepsKeys, P::ScoreSoftmax}) EXPECT_TRUE(ft::head_kernel_has("softmax", p));
    EXPECT_FALSE(ft::head_kernel_has("softmax", P::BlockLayouts));
    for (const char* k : {"performer", "rfa"})
        for (P p : {P::FormsWeights, P::KeepsKeys, P::ScoreSoftmax, P::BlockLayouts}) EXPECT_FALSE(ft::head_kernel_has(k, p)) << k;
    EXPECT_TRUE(ft::head_kernel_has("bigbird", P::BlockLayouts));
    EXPECT_FALSE(ft::head_kernel_has("bigbird", P::FormsWeights));
    EXPECT_THROW(ft::head_kernel_has("bogus", P::KeepsKeys), ft::ValueError);
    // attention_impl 'literal' and 'tiled' run BigBird's dense form, the listing with the layout's mask
    ft::AttnVariant v;
    v.kernel = "bigbird";
    EXPECT_EQ(ft::head_kernel_name(v), "bigbird");
    for (ft::AttnImpl impl : {ft::AttnImpl::Literal, ft::AttnImpl::Tiled}) {
        v.impl = impl;
        EXPECT_EQ(ft::head_kernel_name(v), "softmax");
    }
    v.kernel = "performer";
    EXPECT_EQ(ft::head_kernel_name(v), "performer");
}

// mtp_depth, mtp_weight (V16, D only): two schema lines; the checks between options name mtp_depth; JSON round trip.
TEST(ModelConfig, MultiTokenPredictionOptions) {
    Options o = sizes_d();
    o.emplace_back("mtp_depth", std::int64_t(6));  // l_max 8 = D + 2: room for one target of module D
    o.emplace_back("mtp_weight", 0.5);
    const ModelConfig c = ModelConfig::from_options(Arch::D, o);
    EXPECT_EQ(c.part_options.integer("mtp_depth"), 6);
    EXPECT_EQ(c.part_options.real("mtp_weight"), 0.5);
    EXPECT_EQ(ModelConfig::from_json(c.to_json()), c);
    auto error_of = [](Options opts, Arch arch = Arch::D) -> std::string {
        try {
            ModelConfig::from_options(arch, opts);
        } catch (const ft::ValueError& e) {
            return std::string("ValueError: ") + e.what();
        } catch (const ft::TypeError& e) {
            return std::string("TypeError: ") + e.what();
        }
        return "";
    };
    Options deep = sizes_d();
    deep.emplace_back("mtp_depth", std::int64_t(7));
    EXPECT_NE(error_of(deep).find("ValueError: mtp_depth = 7 has no room in l_max = 8"), std::string::npos) << error_of(deep);
    Options prefix = sizes_d();
    prefix.emplace_back("mtp_depth", std::int64_t(1));
    prefix.emplace_back("mask", std::string("prefix"));
    EXPECT_NE(error_of(prefix).find("mtp_depth"), std::string::npos);
    Options neg = sizes_d();
    neg.emplace_back("mtp_weight", -0.1);
    EXPECT_NE(error_of(neg).find("mtp_weight"), std::string::npos);
    Options e = {{"n_vocab", std::int64_t(11)}, {"l_max", std::int64_t(8)}, {"L", std::int64_t(2)}, {"H", std::int64_t(2)},
                 {"d_e", std::int64_t(6)},     {"d_mlp", std::int64_t(10)}, {"d_f", std::int64_t(6)}, {"mtp_depth", std::int64_t(1)}};
    EXPECT_NE(error_of(e, Arch::E).find("TypeError"), std::string::npos) << error_of(e, Arch::E);
}

// sliding_window (V8, D only): the sliding-window mask's option (its row); None (0) is off and written null,
// w >= 1 round-trips and chooses the mask.
TEST(ModelConfig, SlidingWindowOption) {
    Options o = sizes_d();
    o.emplace_back("sliding_window", std::int64_t(3));
    const ModelConfig c = ModelConfig::from_options(Arch::D, o);
    EXPECT_EQ(c.part_options.integer("sliding_window"), 3);
    ASSERT_NE(ft::chosen_part(c, ft::PartKind::Mask), nullptr);
    EXPECT_STREQ(ft::chosen_part(c, ft::PartKind::Mask)->name, "sliding_window");
    const std::string j = c.to_json();
    EXPECT_NE(j.find("\"sliding_window\":3"), std::string::npos) << j;
    EXPECT_EQ(ModelConfig::from_json(j), c);
    const ModelConfig off = ModelConfig::from_options(Arch::D, sizes_d());
    EXPECT_EQ(off.part_options.integer("sliding_window"), 0);
    EXPECT_EQ(ft::chosen_part(off, ft::PartKind::Mask), nullptr);
    EXPECT_NE(off.to_json().find("\"sliding_window\":null"), std::string::npos) << off.to_json();
    EXPECT_EQ(ModelConfig::from_json(off.to_json()).part_options.integer("sliding_window"), 0);
    for (std::int64_t bad : {0, -2}) {
        Options b = sizes_d();
        b.emplace_back("sliding_window", bad);
        EXPECT_THROW(ModelConfig::from_options(Arch::D, b), ft::ValueError) << bad;
    }
    Options f = sizes_d();
    f.emplace_back("sliding_window", 2.5);
    EXPECT_THROW(ModelConfig::from_options(Arch::D, f), ft::TypeError);
    // eps, init_std, rope_theta: finite (main's hostile-input checks, now the schema's Check)
    for (const char* name : {"eps", "init_std", "rope_theta"}) {
        Options g = sizes_d();
        g.emplace_back(name, std::numeric_limits<double>::infinity());
        EXPECT_THROW(ModelConfig::from_options(Arch::D, g), ft::ValueError) << name;
    }
}

// V17's options are the row of the head kernel 'bigbird' (variants/bigbird_mask.cpp): attention='bigbird' chooses it,
// its options given with another kernel are refused by the general rule naming their owner, bigbird_draw is an Enum
// of the row's name table, and the one check (check_bigbird) serves resolve and the mask factory alike.
TEST(ModelConfig, BigBirdOwnsItsOptions) {
    auto e = [](Options extra) {
        Options o = {{"n_vocab", std::int64_t(11)}, {"l_max", std::int64_t(16)}, {"L", std::int64_t(1)},
                     {"H", std::int64_t(2)},        {"d_e", std::int64_t(6)},   {"d_mlp", std::int64_t(10)},
                     {"d_f", std::int64_t(4)}};
        for (auto& kv : extra) o.push_back(kv);
        return o;
    };
    const ft::PartRow* row = ft::find_part_row(ft::PartKind::HeadKernel, "bigbird");
    ASSERT_NE(row, nullptr);
    EXPECT_FALSE(row->chosen_by_options);  // only attention='bigbird' chooses it
    for (const char* o : {"block_size", "window_blocks", "n_global_blocks", "n_random_blocks", "layout_seed", "bigbird_draw"})
        EXPECT_EQ(ft::part_row_of_option(o), row) << o;
    const ModelConfig c = ModelConfig::from_options(
        Arch::E, e({{"attention", std::string("bigbird")}, {"block_size", std::int64_t(2)},
                    {"bigbird_draw", std::string("per_layer")}}));
    EXPECT_EQ(c.part_options.integer("block_size"), 2);
    EXPECT_EQ(c.part_options.integer("window_blocks"), 3);
    EXPECT_EQ(c.part_options.choice("bigbird_draw"), "per_layer");
    ASSERT_NE(ft::chosen_part(c, ft::PartKind::HeadKernel), nullptr);
    EXPECT_STREQ(ft::chosen_part(c, ft::PartKind::HeadKernel)->name, "bigbird");
    EXPECT_NE(c.to_string().find("block_size=2, window_blocks=3, n_global_blocks=1, n_random_blocks=3, layout_seed=0, "
                                 "bigbird_draw='per_layer'"),
              std::string::npos)
        << c.to_string();
    EXPECT_EQ(ModelConfig::from_json(c.to_json()), c);
    const auto kind_of = [](const char* name) {
        for (const auto& i : ModelConfig::option_infos(Arch::E))
            if (i.name == name) return i.kind + " " + i.default_json;
        return std::string("absent");
    };
    EXPECT_EQ(kind_of("bigbird_draw"), "enum \"per_head\"");
    EXPECT_EQ(kind_of("block_size"), "auto_size null");
    EXPECT_EQ(kind_of("layout_seed"), "seed 0");
    // the Enum: a name of the row's table, a str
    auto refused = [&](Options extra, const std::string& match, bool type_error = false) {
        try {
            ModelConfig::from_options(Arch::E, e(extra));
            ADD_FAILURE() << match << ": resolved";
        } catch (const ft::TypeError& x) {
            EXPECT_TRUE(type_error) << x.what();
            EXPECT_NE(std::string(x.what()).find(match), std::string::npos) << x.what();
        } catch (const ft::ValueError& x) {
            EXPECT_FALSE(type_error) << x.what();
            EXPECT_NE(std::string(x.what()).find(match), std::string::npos) << x.what();
        }
    };
    const Options bigbird = {{"attention", std::string("bigbird")}, {"block_size", std::int64_t(2)}};
    Options per_token = bigbird;
    per_token.emplace_back("bigbird_draw", std::string("per_token"));
    refused(per_token, "bigbird_draw must be one of 'per_head', 'per_layer', got 'per_token'");
    Options an_int = bigbird;
    an_int.emplace_back("bigbird_draw", std::int64_t(1));
    refused(an_int, "bigbird_draw must be a str", true);
    // an option of the row given without attention='bigbird': the general rule names its owner
    refused({{"block_size", std::int64_t(4)}},
            "block_size is an option of the 'bigbird' head kernel, but attention='softmax' chooses the listing's head kernel");
    refused({{"bigbird_draw", std::string("per_layer")}}, "bigbird_draw is an option of the 'bigbird' head kernel");
    refused({{"attention", std::string("performer")}, {"layout_seed", std::int64_t(7)}},
            "layout_seed is an option of the 'bigbird' head kernel, but attention='performer' chooses the 'performer'");
    refused({{"attention", std::string("bigbird")}}, "attention='bigbird' needs block_size");
    // the one check, in the mask factory too (no model: the options alone)
    ft::MaskOptions mo;
    EXPECT_THROW(ft::make_mask("bigbird", mo), ft::ValueError);  // no block_size
    mo.options.set("block_size", std::int64_t(2));
    mo.options.set("window_blocks", std::int64_t(2));
    try {
        ft::make_mask("bigbird", mo);
        ADD_FAILURE() << "window_blocks = 2 accepted";
    } catch (const ft::ValueError& x) {
        EXPECT_NE(std::string(x.what()).find("window_blocks = 2 must be odd"), std::string::npos) << x.what();
    }
    mo.options.set("window_blocks", std::int64_t(3));
    mo.values["heads"] = 2;
    EXPECT_EQ(ft::make_mask("bigbird", mo).name(), "bigbird");
    // a C++ config of another architecture holding one: refused by the option's architectures
    ModelConfig d = ModelConfig::from_options(Arch::D, {{"n_vocab", std::int64_t(11)}, {"l_max", std::int64_t(8)},
                                                        {"L", std::int64_t(1)}, {"H", std::int64_t(2)},
                                                        {"d_e", std::int64_t(6)}, {"d_mlp", std::int64_t(10)}});
    d.part_options.set("block_size", std::int64_t(2));
    EXPECT_THROW(ft::resolve(d, Arch::D), ft::ValueError);
}

}  // namespace

TEST(ModelConfig, OptionInfosAreTheSchemaWithItsDefaults) {
    // each option an architecture takes, once, with the default to_json writes for a model not given it
    const auto ed = ModelConfig::option_infos(Arch::ED);
    auto find = [](const std::vector<ModelConfig::OptionInfo>& v, const std::string& name) {
        for (const auto& o : v)
            if (o.name == name) return &o;
        return static_cast<const ModelConfig::OptionInfo*>(nullptr);
    };
    ASSERT_NE(find(ed, "mlp"), nullptr);
    EXPECT_EQ(find(ed, "mlp")->default_json, "\"relu\"");  // Algorithm 8's MLP
    EXPECT_EQ(find(ed, "mlp")->kind, "enum");
    EXPECT_EQ(find(ed, "L"), nullptr);  // D and E only
    const auto d = ModelConfig::option_infos(Arch::D);
    EXPECT_EQ(find(d, "mlp")->default_json, "\"gelu\"");
    EXPECT_EQ(find(d, "n_vocab")->kind, "size");
    EXPECT_EQ(find(d, "H_kv")->default_json, "null");  // filled from H by resolve
    EXPECT_EQ(find(d, "rope_theta")->archs, std::vector<std::string>{"DTransformer"});
    EXPECT_EQ(find(d, "dropout")->kind, "rates");
    EXPECT_EQ(find(d, "tied")->default_json, "false");
}

// V11's options are the relative position bias's (its row, variants/relative_bias.cpp): positional='relative'
// chooses it; given with another positional they are refused naming the option and its part, except in a saved
// config (where they had no effect: they load at their defaults). Its one check runs for the model's config.
TEST(ModelConfig, RelativeBiasOwnsItsOptions) {
    auto ed = [](Options extra) {
        Options o = {{"n_vocab", std::int64_t(11)}, {"l_max", std::int64_t(8)}, {"L_enc", std::int64_t(1)},
                     {"L_dec", std::int64_t(1)},    {"H", std::int64_t(2)},     {"d_e", std::int64_t(6)},
                     {"d_mlp", std::int64_t(10)}};
        for (auto& kv : extra) o.push_back(kv);
        return o;
    };
    const ModelConfig rel = ModelConfig::from_options(
        Arch::ED, ed({{"positional", std::string("relative")}, {"relative_buckets", std::int64_t(8)}}));
    EXPECT_EQ(rel.part_options.integer("relative_buckets"), 8);
    EXPECT_EQ(rel.part_options.integer("relative_max_distance"), 128);
    ASSERT_NE(ft::chosen_part(rel, ft::PartKind::Position), nullptr);
    EXPECT_STREQ(ft::chosen_part(rel, ft::PartKind::Position)->name, "relative");
    EXPECT_EQ(ModelConfig::from_json(rel.to_json()), rel);
    try {
        ModelConfig::from_options(Arch::ED, ed({{"relative_buckets", std::int64_t(8)}}));
        ADD_FAILURE() << "relative_buckets with positional='learned' resolved";
    } catch (const ft::ValueError& e) {
        EXPECT_NE(std::string(e.what()).find("relative_buckets is an option of the 'relative' position, but "
                                             "positional='learned'"),
                  std::string::npos)
            << e.what();
    }
    EXPECT_THROW(ModelConfig::from_options(Arch::ED, ed({{"positional", std::string("relative")},
                                                         {"relative_buckets", std::int64_t(3)}})),
                 ft::ValueError);  // the row's check: >= 4 for the encoder
    const ModelConfig learned = ModelConfig::from_options(Arch::ED, ed({}));
    std::string j = learned.to_json();
    j.replace(j.find("\"relative_buckets\":32"), 21, "\"relative_buckets\":8");
    EXPECT_EQ(ModelConfig::from_json(j), learned);
}

// rope_theta (V1's θ) is the option of the position "rope" (its registry row), not a model-wide one: the config keeps
// it in part_options, the attentions read it there (RoPE, and V10's latent source, which needs positional='rope'),
// the JSON keeps its place; with another positional it must be at its default, and a saved config with it (where it
// had no effect) loads with the default.
TEST(ModelConfig, RopeThetaIsTheRopePositionsOption) {
    const ft::PartRow* row = ft::part_row_of_option("rope_theta");
    ASSERT_NE(row, nullptr);
    EXPECT_EQ(row->kind, ft::PartKind::Position);
    EXPECT_STREQ(row->name, "rope");
    Options o = sizes_d();
    o.emplace_back("positional", std::string("rope"));
    o.emplace_back("rope_theta", 500.0);
    o.emplace_back("d_attn", std::int64_t(4));  // (RoPE rotates pairs of rows)
    const ModelConfig c = ModelConfig::from_options(Arch::D, o);
    EXPECT_EQ(c.part_options.real("rope_theta"), 500.0);
    ASSERT_NE(ft::chosen_part(c, ft::PartKind::Position), nullptr);
    EXPECT_STREQ(ft::chosen_part(c, ft::PartKind::Position)->name, "rope");
    EXPECT_NE(c.to_json().find("\"mlp\":\"gelu\",\"rope_theta\":500.0,\"sliding_window\":null"), std::string::npos) << c.to_json();
    EXPECT_EQ(ModelConfig::from_json(c.to_json()), c);
    const ft::DTransformer<double> m(c);
    EXPECT_EQ(m.layer[0]->attn.var.options.real("rope_theta"), 500.0);
    for (const char* positional : {"learned", "sinusoidal", "alibi"}) {
        Options bad = sizes_d();
        bad.emplace_back("positional", std::string(positional));
        bad.emplace_back("rope_theta", 500.0);
        const std::string chooses = std::string(positional) == "alibi" ? "the 'alibi'" : "the listing's";
        try {
            ModelConfig::from_options(Arch::D, bad);
            ADD_FAILURE() << "rope_theta with positional='" << positional << "' resolved";
        } catch (const ft::ValueError& e) {
            EXPECT_EQ(std::string(e.what()), "rope_theta is an option of the 'rope' position, but positional='" +
                                                 std::string(positional) + "' chooses " + chooses +
                                                 " position: rope_theta must be at its default");
        }
        Options at_default = sizes_d();  // (every DTransformer's config holds it: at its default, any positional)
        at_default.emplace_back("positional", std::string(positional));
        at_default.emplace_back("rope_theta", 10000.0);
        const ModelConfig d = ModelConfig::from_options(Arch::D, at_default);
        std::string j = d.to_json();
        j.replace(j.find("\"rope_theta\":10000.0"), 20, "\"rope_theta\":500.0");
        EXPECT_EQ(ModelConfig::from_json(j), d) << j;  // a file's: the option had no effect, it loads at its default
    }
    // E and ED have no RoPE position: the option is not theirs (a TypeError naming it, as before)
    Options e = {{"n_vocab", std::int64_t(11)}, {"l_max", std::int64_t(8)}, {"L", std::int64_t(2)}, {"H", std::int64_t(2)},
                 {"d_e", std::int64_t(6)},     {"d_mlp", std::int64_t(10)}, {"d_f", std::int64_t(6)}, {"rope_theta", 500.0}};
    EXPECT_THROW(ModelConfig::from_options(Arch::E, e), ft::TypeError);  // (a DTransformer option, as before)
}

// base (Algorithm 2's sinusoidal table with base in place of ℓ_max; None: ℓ_max) is the option of the position
// "sinusoidal": the embedding reads it from the part options; given with another positional it is refused; a file's
// config that gave it where it had no effect loads at the default. The JSON keeps it where it stood.
TEST(ModelConfig, BaseIsTheSinusoidalPositionsOption) {
    const ft::PartRow* row = ft::part_row_of_option("base");
    ASSERT_NE(row, nullptr);
    EXPECT_EQ(row->kind, ft::PartKind::Position);
    EXPECT_STREQ(row->name, "sinusoidal");
    Options o = sizes_d();
    o.emplace_back("positional", std::string("sinusoidal"));
    o.emplace_back("base", 500.0);
    const ModelConfig c = ModelConfig::from_options(Arch::D, o);
    EXPECT_EQ(c.part_options.real("base"), 500.0);
    EXPECT_NE(c.to_json().find("\"positional\":\"sinusoidal\",\"base\":500.0,\"tied\""), std::string::npos) << c.to_json();
    EXPECT_EQ(ModelConfig::from_json(c.to_json()), c);
    const ft::DTransformer<double> m(c);
    EXPECT_EQ(m.pos.base, 500.0);
    for (const char* positional : {"learned", "rope", "alibi"}) {
        Options bad = sizes_d();
        bad.emplace_back("positional", std::string(positional));
        bad.emplace_back("base", 500.0);
        if (std::string(positional) == "rope") bad.emplace_back("d_attn", std::int64_t(4));
        const std::string chooses = std::string(positional) == "learned" ? "the listing's" : "the '" + std::string(positional) + "'";
        try {
            ModelConfig::from_options(Arch::D, bad);
            ADD_FAILURE() << "base with positional='" << positional << "' resolved";
        } catch (const ft::ValueError& e) {
            EXPECT_EQ(std::string(e.what()), "base is an option of the 'sinusoidal' position, but positional='" +
                                                 std::string(positional) + "' chooses " + chooses +
                                                 " position: base must be at its default");
        }
    }
    const ModelConfig d = ModelConfig::from_options(Arch::D, sizes_d());  // positional='learned', base None
    std::string j = d.to_json();
    j.replace(j.find("\"base\":null"), 11, "\"base\":500.0");
    EXPECT_EQ(ModelConfig::from_json(j), d) << j;  // a file's: the option had no effect, it loads at its default
}

// V16's mtp_depth and mtp_weight are the options of the prediction heads "mtp" (a registered part of its own kind),
// chosen by mtp_depth > 0; its row's check is resolve's and the factory's, and its size hook counts its layers.
TEST(ModelConfig, MultiTokenPredictionIsAPredictionHeadsPart) {
    for (const char* name : {"mtp_depth", "mtp_weight"}) {
        const ft::PartRow* row = ft::part_row_of_option(name);
        ASSERT_NE(row, nullptr) << name;
        EXPECT_EQ(row->kind, ft::PartKind::PredictionHeads);
        EXPECT_STREQ(row->name, "mtp");
    }
    EXPECT_STREQ(ft::kind_name(ft::PartKind::PredictionHeads), "prediction heads");
    EXPECT_EQ(ft::part_names(ft::PartKind::PredictionHeads), std::vector<std::string>{"mtp"});
    const ModelConfig plain = ModelConfig::from_options(Arch::D, sizes_d());
    EXPECT_EQ(ft::chosen_part(plain, ft::PartKind::PredictionHeads), nullptr);
    EXPECT_EQ(ft::model_size(plain, Arch::D).layers, 2);
    EXPECT_EQ(ft::model_size(plain, Arch::D).extra_layers, "");
    EXPECT_TRUE(ft::DTransformer<double>(plain).mtp.empty());
    Options o = sizes_d();
    o.emplace_back("mtp_depth", std::int64_t(3));
    const ModelConfig c = ModelConfig::from_options(Arch::D, o);
    ASSERT_NE(ft::chosen_part(c, ft::PartKind::PredictionHeads), nullptr);
    EXPECT_STREQ(ft::chosen_part(c, ft::PartKind::PredictionHeads)->name, "mtp");
    EXPECT_EQ(ft::model_size(c, Arch::D).layers, 5);  // L + D: a layer per module
    EXPECT_EQ(ft::model_size(c, Arch::D).extra_layers, "MTP modules");
    EXPECT_EQ(ft::DTransformer<double>(c).mtp.size(), 3u);
    // the factory runs the row's check: a config changed after resolve is refused with resolve's message
    ModelConfig short_l = c;
    short_l.l_max = 4;
    ft::ParamStore<double> store;
    try {
        ft::make_prediction_heads<double>(short_l, ft::Activation::Gelu, store);
        ADD_FAILURE() << "no error";
    } catch (const ft::ValueError& e) {
        EXPECT_NE(std::string(e.what()).find("mtp_depth = 3 has no room in l_max = 4"), std::string::npos) << e.what();
    }
    // mtp_weight alone weighs no module: accepted, no module made
    Options weight = sizes_d();
    weight.emplace_back("mtp_weight", 0.5);
    weight.emplace_back("mask", std::string("prefix"));
    const ModelConfig w = ModelConfig::from_options(Arch::D, weight);
    EXPECT_TRUE(ft::DTransformer<double>(w).mtp.empty());
    EXPECT_EQ(ft::model_size(w, Arch::D).layers, 2);
}

// V10's latent source declares its attention's parameter count (its row's size hook), which the size bound uses
TEST(ModelConfig, LatentSourceDeclaresItsSize) {
    Options o = sizes_d();  // H 2, d_e 6: d_attn = d_mid = 3
    for (const auto& kv : Options{{"positional", std::string("rope")}, {"bias", false}, {"kv_lora_rank", std::int64_t(4)},
                                  {"qk_rope_head_dim", std::int64_t(2)}, {"d_attn", std::int64_t(4)}})
        o.push_back(kv);
    const ModelConfig c = ModelConfig::from_options(Arch::D, o);
    // W_q (H·d_attn × d_e), W_dkv ((d_c + d_R) × d_e), W_ukv (H·(d_attn − d_R + d_mid) × d_c), W_o (d_e × H·d_mid)
    EXPECT_EQ(ft::model_size(c, Arch::D).attention, 2 * 4 * 6 + (4 + 2) * 6 + 2 * (4 - 2 + 3) * 4 + 2 * 3 * 6);
    const ModelConfig plain = ModelConfig::from_options(Arch::D, sizes_d());
    EXPECT_EQ(ft::model_size(plain, Arch::D).attention, 3 * 2 * 3 * 6 + 2 * 3 * 6);
}

// A part's Enum option set in C++ (not through from_options, which checks a keyword's name): resolve checks it against
// the row's name table too, so a model never holds a name that to_json would write and from_json refuse (an ft::save
// no ft::load reads). bigbird_draw = "per_block" used to resolve (drawn as "per_layer").
TEST(ModelConfig, PartEnumOptionSetInCppIsCheckedByResolve) {
    ModelConfig c;
    c.n_vocab = 11, c.l_max = 16, c.L = 1, c.H = 2, c.d_e = 6, c.d_mlp = 10, c.d_f = 4;
    c.attention = "bigbird";
    c.part_options.set("block_size", std::int64_t(2));
    const ModelConfig good = ft::resolve(c, Arch::E);
    EXPECT_EQ(ModelConfig::from_json(good.to_json()), good);
    c.part_options.set("bigbird_draw", std::string("per_block"));
    try {
        ft::resolve(c, Arch::E);
        ADD_FAILURE() << "bigbird_draw='per_block' resolved";
    } catch (const ft::ValueError& e) {
        EXPECT_NE(std::string(e.what()).find("bigbird_draw must be one of 'per_head', 'per_layer', got 'per_block'"),
                  std::string::npos)
            << e.what();
    }
    c.part_options.set("bigbird_draw", std::int64_t(1));
    EXPECT_THROW(ft::resolve(c, Arch::E), ft::TypeError);
}
