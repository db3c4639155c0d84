// The model configuration (config.hpp): its schema (every model-wide option once, and the options the parts'
// registry rows declare), building it from keyword options and JSON, writing it, resolve (defaults, checks, the
// parts chosen), the size bound, input validation.
#include "formal_transformers/config.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <nlohmann/json.hpp>
#include <optional>
#include <type_traits>

#include "formal_transformers/dropout.hpp"
#include "formal_transformers/parts.hpp"
#include "formal_transformers/stack_embedding.hpp"
#include "formal_transformers/sizes.hpp"
#include "../runtime/bounded_json.hpp"
#include "shared.hpp"

namespace ft {

// ======================================== the schema ==================================================
namespace {

using namespace archs;  // D, E, ED, DE, ALL; bit(arch)
using Kind = OptionKind;  // an option's type, and with it the check of one value (in resolve) and its JSON form
using Check = OptionCheck;

// The name tables of the enums: a name, its value, and the architectures it is a name for. The first name of a
// value in an architecture is the one written; later ones are aliases. (The options that choose a part — norm,
// mlp, block — take the registry's names: kind Part.)
template <class En>
struct EnumName {
    const char* name;
    En value;
    unsigned archs = ALL;
    const char* what = nullptr;  // for a name of some architectures only: what it names, for the messages
};
template <class En>
using NameTable = std::vector<EnumName<En>>;
const NameTable<Gelu> kGelus = {{"exact", Gelu::Exact}, {"tanh", Gelu::Tanh}, {"none", Gelu::Exact}};
const NameTable<AttnImpl> kAttnImpls = {{"auto", AttnImpl::Auto}, {"literal", AttnImpl::Literal}, {"tiled", AttnImpl::Tiled}};

template <class En>
const NameTable<En>& names_of(En ModelConfig::*);
template <> const NameTable<Gelu>& names_of(Gelu ModelConfig::*) { return kGelus; }
template <> const NameTable<AttnImpl>& names_of(AttnImpl ModelConfig::*) { return kAttnImpls; }

template <class P>
constexpr bool is_enum_member = false;
template <class En>
constexpr bool is_enum_member<En ModelConfig::*> = std::is_enum_v<En>;

using Field = std::variant<std::nullptr_t, index_t ModelConfig::*, double ModelConfig::*, bool ModelConfig::*,
                           std::uint64_t ModelConfig::*, Gelu ModelConfig::*, AttnImpl ModelConfig::*,
                           std::string ModelConfig::*>;

struct OptionSpec {
    const char* name;
    unsigned archs;
    Kind kind;
    Field field;  // the member (its initialiser in config.hpp is the default); nullptr: not stored, or a part's
    Check check = Check::None;
    const PartOption* part = nullptr;  // a part's option (its value in ModelConfig::part_options)
    PartKind selects = PartKind::Block;  // kind Part: the kind of part it names
};
// Where the options of the parts' rows go, by kind of part (in the registry's order within a kind): the places
// the options had before they moved into their parts, so that to_json writes the same text for the same model
// (a prompt cache's config hash is the hash of that text: caches saved earlier still load).
struct PartsHere {
    const char* name;
    PartKind kind;
};
constexpr PartsHere kPartsHere[] = {{"(head kernels' options)", PartKind::HeadKernel},
                                    {"(kernel wrappers' options)", PartKind::KernelWrapper},
                                    {"(masks' options)", PartKind::Mask},
                                    {"(Q/K/V sources' options)", PartKind::QKVSource},
                                    {"(positions' options)", PartKind::Position},
                                    {"(MLPs' options)", PartKind::MLP},
                                    {"(norms' options)", PartKind::Norm},
                                    {"(embedding steps' options)", PartKind::EmbeddingStep},
                                    {"(embeddings' options)", PartKind::Embedding},
                                    {"(prediction heads' options)", PartKind::PredictionHeads}};
const PartsHere* parts_here(const char* name) {
    for (const PartsHere& h : kPartsHere)
        if (std::string(name) == h.name) return &h;
    return nullptr;
}

// Every model-wide option, in the order the constructors take the sizes and to_json writes them, and where the
// options of the parts' rows go (kPartsHere, one place per kind of part). Adding a model-wide option: a member of
// ModelConfig (with its default) and one line here; a check between options goes in resolve. A part's option: its
// row (parts.hpp).
const std::vector<OptionSpec> kSchema = {
    {"n_vocab", ALL, Kind::Size, &ModelConfig::n_vocab},
    {"l_max", ALL, Kind::Size, &ModelConfig::l_max},
    {"L", DE, Kind::Size, &ModelConfig::L},
    {"L_enc", ED, Kind::Size, &ModelConfig::L_enc},
    {"L_dec", ED, Kind::Size, &ModelConfig::L_dec},
    {"H", ALL, Kind::Size, &ModelConfig::H},
    {"d_e", ALL, Kind::Size, &ModelConfig::d_e},
    {"d_mlp", ALL, Kind::Size, &ModelConfig::d_mlp},
    {"d_f", E, Kind::Size, &ModelConfig::d_f},
    {"d_attn", ALL, Kind::AutoSize, &ModelConfig::d_attn},
    {"d_mid", ALL, Kind::AutoSize, &ModelConfig::d_mid},
    {"norm", D | ED, Kind::Part, &ModelConfig::norm, Check::None, nullptr, PartKind::Norm},
    {"positional", ALL, Kind::Part, &ModelConfig::positional, Check::None, nullptr, PartKind::Position},
    {"base", 0, Kind::AllRates, nullptr},  // (the sinusoidal position's option, where it stood: pinned)
    {"tied", ALL, Kind::Bool, &ModelConfig::tied},
    {"gelu", DE, Kind::Enum, &ModelConfig::gelu},
    {"eps", ALL, Kind::Real, &ModelConfig::eps, Check::NonNegative},
    {"seed", ALL, Kind::Seed, &ModelConfig::seed},
    {"init_std", ALL, Kind::Real, &ModelConfig::init_std, Check::Positive},
    {"H_kv", ALL, Kind::AutoSize, &ModelConfig::H_kv},
    {"bias", ALL, Kind::Bool, &ModelConfig::bias},
    {"dropout", ALL, Kind::AllRates, nullptr, Check::Rate},
    {"embed_dropout", ALL, Kind::Real, &ModelConfig::embed_dropout, Check::Rate},
    {"attn_dropout", 0, Kind::AllRates, nullptr},  // (the attention-dropout part's option, where it stood: pinned)
    {"resid_dropout", ALL, Kind::Real, &ModelConfig::resid_dropout, Check::Rate},
    {"attention_impl", ALL, Kind::Enum, &ModelConfig::attention_impl},
    {"attention", DE, Kind::Part, &ModelConfig::attention, Check::None, nullptr, PartKind::HeadKernel},
    {kPartsHere[0].name, 0, Kind::AllRates, nullptr},
    {kPartsHere[1].name, 0, Kind::AllRates, nullptr},
    {"block_size", 0, Kind::AllRates, nullptr},  // (V17's, the 'bigbird' head kernel's options, where they stood: pinned)
    {"window_blocks", 0, Kind::AllRates, nullptr},
    {"n_global_blocks", 0, Kind::AllRates, nullptr},
    {"n_random_blocks", 0, Kind::AllRates, nullptr},
    {"layout_seed", 0, Kind::AllRates, nullptr},
    {"bigbird_draw", 0, Kind::AllRates, nullptr},
    {"mlp", D | ED, Kind::Part, &ModelConfig::mlp, Check::None, nullptr, PartKind::MLP},
    {"rope_theta", 0, Kind::AllRates, nullptr},  // (the RoPE position's option, where it stood: pinned)
    {kPartsHere[2].name, 0, Kind::AllRates, nullptr},
    {kPartsHere[3].name, 0, Kind::AllRates, nullptr},
    {"mask", D, Kind::Part, &ModelConfig::mask, Check::None, nullptr, PartKind::Mask},
    {"mtp_depth", 0, Kind::AllRates, nullptr},  // (the multi-token prediction heads' options, where they stood: pinned)
    {"mtp_weight", 0, Kind::AllRates, nullptr},
    {kPartsHere[4].name, 0, Kind::AllRates, nullptr},
    {kPartsHere[5].name, 0, Kind::AllRates, nullptr},
    {kPartsHere[6].name, 0, Kind::AllRates, nullptr},
    {"block", ALL, Kind::Part, &ModelConfig::block},
    {"scale_scores", ED, Kind::Bool, &ModelConfig::scale_scores},
    {"unembed_rescale", ED, Kind::Bool, &ModelConfig::unembed_rescale},
    {"bos_id", ED, Kind::AutoId, &ModelConfig::bos_id},
    {"eos_id", ED, Kind::AutoId, &ModelConfig::eos_id},
    {"forced_bos_id", ED, Kind::AutoId, &ModelConfig::forced_bos_id},
    {"forced_eos", ED, Kind::Bool, &ModelConfig::forced_eos},
    {"n_segments", 0, Kind::AllRates, nullptr},  // (the embedding steps' options, each where it stood: pinned)
    {"embed_norm", 0, Kind::AllRates, nullptr},
    {"unembed_bias", E | ED, Kind::Bool, &ModelConfig::unembed_bias},
    {"scale_embedding", 0, Kind::AllRates, nullptr},
    {"separate_positions", 0, Kind::AllRates, nullptr},
    {"fixnorm", 0, Kind::AllRates, nullptr},
    {"embed_scale", 0, Kind::AllRates, nullptr},
    {kPartsHere[7].name, 0, Kind::AllRates, nullptr},
    {"final_logit_softcapping", D, Kind::AutoReal, &ModelConfig::final_logit_softcapping},
    {kPartsHere[8].name, 0, Kind::AllRates, nullptr},  // (an encoder's embedding part's options: V28's audio encoder)
    {kPartsHere[9].name, 0, Kind::AllRates, nullptr},
};

// A line of kSchema naming a part's option (archs 0, no member): the option stands there, where it stood before it
// moved into its part, so that to_json writes the same text as before
bool pinned(const OptionSpec& o) { return o.archs == 0 && !o.field.index() && !parts_here(o.name); }
bool is_pinned(const char* name) {
    return std::any_of(std::begin(kSchema), std::end(kSchema), [&](const OptionSpec& o) { return pinned(o) && name == std::string(o.name); });
}

// kSchema with the parts' options in place of kPartsHere (each kind's, in the registry's order, each once) and of
// the pinned lines
const std::vector<OptionSpec>& schema() {
    static const std::vector<OptionSpec> all = [] {
        std::vector<OptionSpec> r;
        auto add = [&](const PartOption& p) {
            const bool seen = std::any_of(r.begin(), r.end(), [&](const OptionSpec& q) { return q.name == std::string(p.name); });
            if (!seen) r.push_back({p.name, p.archs, p.kind, nullptr, p.check, &p});
        };
        for (const OptionSpec& o : kSchema) {
            const PartsHere* here = parts_here(o.name);
            if (pinned(o)) {
                const PartRow* row = part_row_of_option(o.name);
                if (!row) throw std::logic_error(std::string("the schema pins '") + o.name + "', which no part declares");
                for (const PartOption& p : row->options)
                    if (o.name == std::string(p.name)) add(p);
                continue;
            }
            if (!here) {
                r.push_back(o);
                continue;
            }
            for (const PartRow* row : part_rows())
                if (row->kind == here->kind)
                    for (const PartOption& p : row->options)
                        if (!is_pinned(p.name)) add(p);
        }
        return r;
    }();
    return all;
}

const OptionSpec* find_option(const std::string& name) {
    for (const OptionSpec& o : schema())
        if (name == o.name) return &o;
    return nullptr;
}

// Python's names of a value's type, for the messages.
const char* type_name(const OptionValue& v) {
    static const char* names[] = {"None", "bool", "int", "int", "float", "str"};
    return names[v.index()];
}
[[noreturn]] void wrong_type(const OptionSpec& o, const OptionValue& v, const char* expected) {
    throw TypeError(std::string(o.name) + " must be " + expected + ", got " + type_name(v));
}
// Python's repr of a float: the shortest digits that read back, positional for exponents in [-4, 16)
// (10000.0, 0.0001), else scientific (1e-05, 1e+16).
std::string str_of(double v) {
    if (!std::isfinite(v)) return v != v ? "nan" : v > 0 ? "inf" : "-inf";
    char buf[400];
    auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
    std::string s(buf, r.ptr);
    const int exp = std::stoi(s.substr(s.find('e') + 1));
    if (exp < -4 || exp >= 16) return s;
    r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed);
    s.assign(buf, r.ptr);
    if (s.find('.') == std::string::npos) s += ".0";
    return s;
}

index_t int_of(const OptionSpec& o, const OptionValue& v) {
    if (const auto* i = std::get_if<std::int64_t>(&v)) return index_t(*i);
    if (const auto* u = std::get_if<std::uint64_t>(&v)) {
        if (*u > std::uint64_t(std::numeric_limits<index_t>::max()))
            throw ValueError(std::string(o.name) + " = " + std::to_string(*u) + " is out of range (64-bit integers)");
        return index_t(*u);
    }
    wrong_type(o, v, "an int");
}
double real_of(const OptionSpec& o, const OptionValue& v) {
    if (const auto* d = std::get_if<double>(&v)) return *d;
    if (const auto* i = std::get_if<std::int64_t>(&v)) return double(*i);
    if (const auto* u = std::get_if<std::uint64_t>(&v)) return double(*u);
    wrong_type(o, v, "a real number");
}
void check_real(const OptionSpec& o, double v) {
    const std::string name = o.name;
    switch (o.check) {
        case Check::Positive:
            if (!(v > 0)) throw ValueError(name + " must be > 0, got " + str_of(v));
            if (!std::isfinite(v)) throw ValueError(name + " must be a finite number > 0, got " + str_of(v));
            break;
        case Check::NonNegative:
            if (!(v >= 0)) throw ValueError(name + " must be >= 0, got " + str_of(v));
            if (!std::isfinite(v)) throw ValueError(name + " must be a finite number >= 0, got " + str_of(v));
            break;
        case Check::Rate: check_dropout_rate(v, o.name); break;
        case Check::None: break;
    }
}

// An option's stored value (an int64 for the integer kinds, a double, a bool, a uint64 seed; None for an enum,
// whose names json_of writes), from its member or from part_options.
template <class V>
using Stored = std::conditional_t<std::is_same_v<V, index_t>, std::int64_t, V>;
OptionValue get(const ModelConfig& c, const OptionSpec& o) {
    if (o.part) return c.part_options.get(o.name);
    return std::visit(
        [&](auto member) -> OptionValue {
            if constexpr (std::is_same_v<decltype(member), std::nullptr_t>) {
                return std::monostate{};
            } else {
                using V = std::remove_cv_t<std::remove_reference_t<decltype(c.*member)>>;
                if constexpr (std::is_enum_v<V>) return std::monostate{};
                else return Stored<V>(c.*member);
            }
        },
        o.field);
}
void put(ModelConfig& c, const OptionSpec& o, const OptionValue& s) {
    if (o.part) return c.part_options.set(o.name, s);
    std::visit(
        [&](auto member) {
            if constexpr (!std::is_same_v<decltype(member), std::nullptr_t>) {
                using V = std::remove_cv_t<std::remove_reference_t<decltype(c.*member)>>;
                if constexpr (!std::is_enum_v<V>) c.*member = V(std::get<Stored<V>>(s));
            }
        },
        o.field);
}

// A part's Enum option: ValueError "<name> must be one of 'a', 'b', got '<s>'" unless s is a name of its row's table
void check_choice(const PartOption& p, const std::string& s) {
    std::string allowed;
    for (const char* n : p.names) {
        if (s == n) return;
        allowed += std::string(allowed.empty() ? "'" : ", '") + n + "'";
    }
    throw ValueError(std::string(p.name) + " must be one of " + allowed + ", got '" + s + "'");
}

// One value into its member or part_options (type checks here; range checks in resolve, which sees stored
// values only: a given 0 for an AutoSize, which stores "None" as 0, is refused here).
void set_option(ModelConfig& c, const OptionSpec& o, const OptionValue& v) {
    const bool none = std::holds_alternative<std::monostate>(v);
    switch (o.kind) {
        case Kind::Size:
        case Kind::Count: put(c, o, std::int64_t(int_of(o, v))); return;
        case Kind::AutoSize: {
            index_t n = 0;
            if (!none && (n = int_of(o, v)) <= 0)
                throw ValueError(std::string(o.name) + " must be a positive integer, got " + std::to_string(n));
            put(c, o, std::int64_t(n));
            return;
        }
        case Kind::AutoId: {
            index_t n = -1;
            if (!none && (n = int_of(o, v)) < 0)
                throw ValueError(std::string(o.name) + " must be a token id >= 0 (or None), got " + std::to_string(n));
            put(c, o, std::int64_t(n));
            return;
        }
        case Kind::Real: put(c, o, real_of(o, v)); return;
        case Kind::AutoReal: {
            double x = 0;
            if (!none && !((x = real_of(o, v)) > 0)) throw ValueError(std::string(o.name) + " must be > 0, got " + str_of(x));
            if (!std::isfinite(x))  // (inf was written null, and read back as None: another model)
                throw ValueError(std::string(o.name) + " must be a finite number > 0, got " + str_of(x));
            put(c, o, x);
            return;
        }
        case Kind::Bool:
            if (!std::holds_alternative<bool>(v)) wrong_type(o, v, "True or False");
            put(c, o, std::get<bool>(v));
            return;
        case Kind::Seed:
            if (const auto* i = std::get_if<std::int64_t>(&v)) {
                if (*i < 0) throw ValueError(std::string(o.name) + " = " + std::to_string(*i) + " is outside [0, 2^64)");
                put(c, o, std::uint64_t(*i));
            } else if (const auto* u = std::get_if<std::uint64_t>(&v)) {
                put(c, o, *u);
            } else {
                wrong_type(o, v, "an int");
            }
            return;
        case Kind::Enum: {  // a name of c.arch's (set by from_options before the options)
            const auto* s = std::get_if<std::string>(&v);
            if (!s) wrong_type(o, v, "a str");
            if (o.part) {  // a part's option: a name of its row's table
                check_choice(*o.part, *s);
                return put(c, o, *s);
            }
            std::visit(
                [&](auto member) {
                    if constexpr (is_enum_member<decltype(member)>) {
                        const unsigned arch = bit(c.arch);
                        const auto& table = names_of(member);
                        const EnumName<std::decay_t<decltype(c.*member)>>* other = nullptr;  // another arch's name
                        for (const auto& n : table) {
                            if (*s != n.name) continue;
                            if (n.archs & arch) {
                                c.*member = n.value;
                                return;
                            }
                            other = &n;
                        }
                        std::string allowed;
                        for (std::size_t i = 0; i < table.size(); ++i) {
                            if (!(table[i].archs & arch)) continue;
                            bool alias = false;  // list each value once
                            for (std::size_t j = 0; j < i; ++j)
                                alias |= (table[j].archs & arch) && table[j].value == table[i].value;
                            if (!alias) allowed += std::string(allowed.empty() ? "'" : ", '") + table[i].name + "'";
                        }
                        if (other)
                            throw ValueError(std::string(o.name) + "='" + *s + "' is " + (other->what ? other->what : "another model's") +
                                             ", not " + arch_name(c.arch) + "'s: " + o.name + " must be one of " + allowed);
                        throw ValueError(std::string(o.name) + " must be one of " + allowed + ", got '" + *s + "'");
                    }
                },
                o.field);
            return;
        }
        case Kind::Part: {  // a registered part's name or alias (a block's: resolve checks that c.arch takes it)
            const auto* s = std::get_if<std::string>(&v);
            if (!s) wrong_type(o, v, "a str");
            if (o.selects == PartKind::Block) {
                check_part_name(PartKind::Block, *s, o.name);
                put(c, o, *s);
            } else {
                put(c, o, selected_part(o.selects, *s, c.arch, o.name));
            }
            return;
        }
        case Kind::AllRates: return;  // from_options applies it
    }
}

// One stored option as JSON (nlohmann's ordered object keeps the schema's order).
using Json = nlohmann::ordered_json;
Json json_of(const ModelConfig& c, const OptionSpec& o) {
    if (o.part) {  // a part's option (an Enum's stored form is its name)
        const OptionValue v = get(c, o);
        if (const auto* i = std::get_if<std::int64_t>(&v)) {
            if ((o.kind == Kind::AutoSize && *i == 0) || (o.kind == Kind::AutoId && *i < 0)) return nullptr;
            return *i;
        }
        if (const auto* d = std::get_if<double>(&v)) {
            if (o.kind == Kind::AutoReal && *d == 0) return nullptr;
            return *d;
        }
        if (const auto* b = std::get_if<bool>(&v)) return *b;
        if (const auto* u = std::get_if<std::uint64_t>(&v)) return *u;
        if (const auto* t = std::get_if<std::string>(&v)) return *t;
        return nullptr;
    }
    return std::visit(
        [&](auto member) -> Json {
            if constexpr (std::is_same_v<decltype(member), std::nullptr_t>) {
                return nullptr;
            } else {
                using V = std::remove_cv_t<std::remove_reference_t<decltype(c.*member)>>;
                const V& v = c.*member;
                if constexpr (std::is_enum_v<V>) {
                    for (const auto& n : names_of(member))
                        if (n.value == v && (n.archs & bit(c.arch))) return n.name;
                    return nullptr;
                } else if constexpr (std::is_same_v<V, double>) {
                    if (o.kind == Kind::AutoReal && v == 0) return nullptr;
                    return v;
                } else if constexpr (std::is_same_v<V, std::string>) {
                    return v.empty() ? std::string(default_part(o.selects, c.arch)) : v;  // (unresolved: the listing's)
                } else if constexpr (std::is_same_v<V, index_t>) {
                    if (o.kind == Kind::AutoSize && v == 0) return nullptr;  // None
                    if (o.kind == Kind::AutoId && v < 0) return nullptr;
                    return v;
                } else {
                    return v;
                }
            }
        },
        o.field);
}

OptionValue value_of_json(const Json& j) {
    switch (j.type()) {
        case Json::value_t::null: return std::monostate{};
        case Json::value_t::boolean: return j.get<bool>();
        case Json::value_t::number_integer: return j.get<std::int64_t>();
        case Json::value_t::number_unsigned: return j.get<std::uint64_t>();
        case Json::value_t::number_float: return j.get<double>();
        case Json::value_t::string: return j.get<std::string>();
        default: throw TypeError("an option must be null, a bool, a number or a string, got " + std::string(j.type_name()));
    }
}

// Python's notation of a JSON scalar (the repr): True/False, None, 'text', 1e-05, 10000.0.
std::string python_repr(const Json& j) {
    switch (j.type()) {
        case Json::value_t::null: return "None";
        case Json::value_t::boolean: return j.get<bool>() ? "True" : "False";
        case Json::value_t::number_float: return str_of(j.get<double>());
        case Json::value_t::string: return "'" + j.get<std::string>() + "'";
        default: return j.dump();
    }
}

Json config_object(const ModelConfig& c, const char* dtype) {
    Json j = Json::object();
    j["arch"] = arch_name(c.arch);
    for (const OptionSpec& o : schema())
        if ((o.archs & bit(c.arch)) && o.kind != Kind::AllRates) j[o.name] = json_of(c, o);
    if (dtype) j["dtype"] = dtype;
    return j;
}

// "a DTransformer option", "a DTransformer and EDTransformer option": the architectures of an option's bits
std::string archs_text(unsigned a) {
    std::string r;
    for (Arch x : {Arch::D, Arch::E, Arch::ED})
        if (a & bit(x)) r += std::string(r.empty() ? "" : " and ") + arch_name(x);
    return "the " + r;
}

// ----------------------------------------- the parts a config chooses -------------------------------------------
// The kinds of part a config chooses one of each, in the order resolve checks them
constexpr PartKind kChosenKinds[] = {PartKind::Mask,          PartKind::Position, PartKind::QKVSource,
                                     PartKind::HeadKernel,    PartKind::KernelWrapper, PartKind::MLP,
                                     PartKind::Norm,          PartKind::Block,    PartKind::PredictionHeads};
// The selector option of a kind of part as the config sets it ("attention='softmax'"; "": the kind has none in this
// architecture) and the registered part its value names ("": the listing's own part). V7's mask='prefix' names the
// prefix mask, made per call with the batch's p_b; attention='bigbird' the block layout (mask and kernel).
std::pair<std::string, std::string> selector(const ModelConfig& c, PartKind kind) {
    if (kind == PartKind::Mask && c.arch == Arch::D)  // (the listing's "causal": a mask its options choose may replace it)
        return {"mask='" + c.mask + "'", c.mask == default_part(kind, c.arch) ? "" : c.mask};
    if (kind == PartKind::Position)  // (a table of Algorithm 2's, "learned" or "sinusoidal": the listing's position)
        return {"positional='" + c.positional + "'", position_table(c.positional) == Positional::None ? c.positional : ""};
    if (kind == PartKind::Block) return {"block='" + c.block + "'", c.block};
    if (kind == PartKind::Norm) return {"norm='" + c.norm + "'", c.norm};
    if (kind == PartKind::MLP) return {"mlp='" + c.mlp + "'", c.mlp};
    if (kind == PartKind::HeadKernel && c.arch != Arch::ED)  // (the listing's "softmax": a kernel its options choose may replace it)
        return {"attention='" + c.attention + "'", c.attention == default_part(kind, c.arch) ? "" : c.attention};
    return {"", ""};
}
// The part of `kind` c chooses (its row; null: none with a row), by the selector or by one of the part's own options
// given. An option of a part not chosen must be at its default: ValueError naming it, or (reset: a file's config,
// where it had no effect) set to its default in *reset.
const PartRow* choose(const ModelConfig& c, PartKind kind, ModelConfig* reset = nullptr) {
    const auto [by_selector, name] = selector(c, kind);
    std::string by = by_selector, chosen = name;
    const PartRow* row = name.empty() ? nullptr : find_part_row(kind, name);
    // (a table of Algorithm 2's is the listing's position, yet its row may own options: the sinusoidal table's base)
    if (kind == PartKind::Position && name.empty()) row = find_part_row(kind, c.positional);
    for (const PartRow* r : part_rows()) {
        if (r->kind != kind) continue;
        for (const PartOption& o : r->options) {
            if (c.part_options.at_default(o.name)) continue;
            if (chosen.empty() && r->chosen_by_options) {
                row = r, chosen = r->name, by = o.name;
                continue;
            }
            if (chosen == r->name) continue;
            const bool shared = row && std::any_of(row->options.begin(), row->options.end(),
                                                   [&](const PartOption& q) { return q.name == std::string(o.name); });
            if (shared) continue;
            if (reset) {
                reset->part_options.set(o.name, o.default_value);
                continue;
            }
            throw ValueError(std::string(o.name) + " is an option of the '" + r->name + "' " + kind_name(kind) + ", but " +
                             by + " chooses " + (chosen.empty() ? "the listing's" : "the '" + chosen + "'") + " " +
                             kind_name(kind) + ": " + o.name + " must be at its default");
        }
    }
    return row;
}

Json parse_object(const std::string& text) {
    const Json j = parse_bounded_json(text, "model config");  // bounded nesting and size (bounded_json.hpp)
    if (!j.is_object()) throw ValueError("model config: not a JSON object");
    return j;
}

}  // namespace

const PartRow* chosen_part(const ModelConfig& c, PartKind kind) { return choose(c, kind); }
std::vector<const PartRow*> chosen_parts(const ModelConfig& c) {
    std::vector<const PartRow*> rows;
    for (PartKind kind : kChosenKinds)
        if (const PartRow* row = choose(c, kind)) rows.push_back(row);
    return rows;
}

const char* arch_name(Arch a) { return a == Arch::D ? "DTransformer" : a == Arch::E ? "ETransformer" : "EDTransformer"; }
Arch arch_from_name(const std::string& name) {
    for (Arch a : {Arch::D, Arch::E, Arch::ED})
        if (name == arch_name(a)) return a;
    throw ValueError("arch must be 'DTransformer', 'ETransformer' or 'EDTransformer', got '" + name + "'");
}

std::vector<std::string> ModelConfig::positional_names(Arch arch) {
    std::vector<std::string> names;
    for (const OptionSpec& o : schema())
        if (o.kind == Kind::Size && (o.archs & bit(arch))) names.push_back(o.name);
    return names;
}

bool ModelConfig::has_dropout() const {
    return embed_dropout > 0 || attention_dropout_rate(part_options) > 0 || resid_dropout > 0;
}

std::string ModelConfig::signature(Arch arch) {
    ModelConfig defaults;
    defaults.arch = arch;  // (json_of writes the architecture's names: ED's standard MLP is "relu")
    std::string r;
    bool star = false;
    for (const OptionSpec& o : schema()) {
        if (!(o.archs & bit(arch))) continue;
        if (o.kind != Kind::Size && !star) {
            r += ", *";
            star = true;
        }
        r += (r.empty() ? "" : ", ") + std::string(o.name);
        if (o.kind == Kind::AllRates) r += "=0.0";
        else if (o.kind == Kind::AutoSize || o.kind == Kind::AutoId || (o.kind == Kind::Real && o.check == Check::Rate)) r += "=None";
        else if (o.kind != Kind::Size) r += "=" + python_repr(json_of(defaults, o));
    }
    return r;
}

std::vector<ModelConfig::OptionInfo> ModelConfig::option_infos(Arch arch) {
    static const char* kinds[] = {"size", "auto_size", "count", "real", "auto_real", "bool", "seed", "enum", "rates", "auto_id",
                                  "enum"};
    ModelConfig defaults;
    defaults.arch = arch;
    std::vector<OptionInfo> out;
    for (const OptionSpec& o : schema()) {
        if (!(o.archs & bit(arch))) continue;
        OptionInfo info{o.name, kinds[int(o.kind)], o.kind == Kind::Size ? "null" : json_of(defaults, o).dump(), {}};
        if (o.kind == Kind::AllRates) info.default_json = "0.0";
        for (Arch a : {Arch::D, Arch::E, Arch::ED})
            if (o.archs & bit(a)) info.archs.push_back(arch_name(a));
        out.push_back(std::move(info));
    }
    return out;
}

namespace {
ModelConfig resolve_config(ModelConfig c, Arch arch, bool from_file);
// from_options; from_file: a saved config's options (one of a part its config does not choose loads at its default)
ModelConfig build_config(Arch arch, const Options& keywords, const std::vector<OptionValue>& positional, bool from_file) {
    const std::string who = std::string(arch_name(arch)) + "()";
    const std::vector<std::string> sizes = ModelConfig::positional_names(arch);
    if (positional.size() > sizes.size())
        throw TypeError(who + " takes " + std::to_string(sizes.size()) + " positional arguments (the sizes) but " +
                        std::to_string(positional.size()) + " were given");
    ModelConfig c;
    c.arch = arch;  // (the names of mlp's parts are the architecture's: default_part)
    std::vector<const OptionSpec*> given;
    const OptionValue* all_rates = nullptr;
    std::optional<bool> sandwich;  // sandwich_norm, if given
    auto take = [&](const std::string& key, const OptionValue& v) {
        std::string name = key;
        OptionValue value = v;
        if (key == "pre_norm" && arch == Arch::ED) {  // the name of earlier versions (files, keywords) for the block
            const auto* b = std::get_if<bool>(&v);
            if (!b) throw TypeError("pre_norm must be True or False, got " + std::string(type_name(v)));
            name = "block", value = std::string(*b ? "pre_ln" : "post_ln");
        }
        if (key == "sandwich_norm" && arch == Arch::D) {  // V27's option of earlier versions: the block "sandwich"
            const auto* b = std::get_if<bool>(&v);
            if (!b) throw TypeError("sandwich_norm must be True or False, got " + std::string(type_name(v)));
            if (sandwich) throw TypeError(who + " got multiple values for argument 'sandwich_norm'");
            sandwich = *b;
            return;
        }
        const OptionSpec* o = find_option(name);
        if (!o || !(o->archs & bit(arch))) throw TypeError(who + " got an unexpected keyword argument '" + name + "'");
        if (o->kind == Kind::Real && o->check == Check::Rate && std::holds_alternative<std::monostate>(v))
            return;  // a place's rate None: dropout's (as not given)
        for (const OptionSpec* g : given)
            if (g == o) throw TypeError(who + " got multiple values for argument '" + name + "'");
        given.push_back(o);
        if (o->kind == Kind::AllRates) {
            check_real(*o, real_of(*o, v));
            all_rates = &v;
        } else {
            set_option(c, *o, value);
        }
    };
    for (std::size_t i = 0; i < positional.size(); ++i) take(sizes[i], positional[i]);
    for (const auto& [name, v] : keywords) take(name, v);
    if (sandwich) {  // sandwich_norm=True: the pre-LN layer with its second norms, the block "sandwich"
        const std::string b = c.block.empty() ? default_block(arch) : c.block;
        if (*sandwich && b == "pre_ln") c.block = "sandwich";
        else if (*sandwich && b != "sandwich")
            throw ValueError("block='" + b + "' has no sandwich_norm (V27: Gemma's second norm on each sublayer is the "
                             "block 'sandwich', the pre-LN layer's)");
        else if (!*sandwich && b == "sandwich")
            throw ValueError("sandwich_norm=False contradicts block='sandwich' (V27: its sublayers' second norms)");
    }
    for (const OptionSpec& o : schema()) {
        const bool is_given = std::find(given.begin(), given.end(), &o) != given.end();
        if (is_given || !(o.archs & bit(arch))) continue;
        if (o.kind == Kind::Size) throw TypeError(who + " missing required argument '" + o.name + "'");
        if (all_rates && o.check == Check::Rate && o.kind == Kind::Real) set_option(c, o, *all_rates);
    }
    return resolve_config(c, arch, from_file);
}
}  // namespace

ModelConfig ModelConfig::from_options(Arch arch, const Options& keywords, const std::vector<OptionValue>& positional) {
    return build_config(arch, keywords, positional, false);
}

std::string ModelConfig::to_json(const char* dtype) const { return config_object(*this, dtype).dump(); }

ModelConfig ModelConfig::from_json(const std::string& text) {
    const Json j = parse_object(text);
    if (!j.contains("arch") || !j["arch"].is_string()) throw ValueError("model config: no \"arch\" string");
    const Arch arch = arch_from_name(j["arch"].get<std::string>());
    Options options;
    try {
        for (const auto& [key, value] : j.items()) {
            if (key == "arch") continue;
            if (key == "dtype") {
                json_dtype(text);  // checked: "float32" or "float64"
                continue;
            }
            options.emplace_back(key, value_of_json(value));
        }
        return build_config(arch, options, {}, true);
    } catch (const TypeError& e) {  // in a file: damaged data, not a caller's wrong argument
        throw ValueError(std::string("model config: ") + e.what());
    }
}

std::string ModelConfig::json_dtype(const std::string& text) {
    const Json j = parse_object(text);
    if (!j.contains("dtype")) return "";
    if (!j["dtype"].is_string() || (j["dtype"] != "float32" && j["dtype"] != "float64"))
        throw ValueError("model config: dtype must be \"float32\" or \"float64\", got " + j["dtype"].dump());
    return j["dtype"].get<std::string>();
}

std::string ModelConfig::to_string(const char* dtype) const {
    const Json j = config_object(*this, dtype);
    std::string r = std::string(arch_name(arch)) + "(";
    bool first = true;
    for (const auto& [key, value] : j.items()) {
        if (key == "arch") continue;
        r += (first ? "" : ", ") + key + "=" + python_repr(value);
        first = false;
    }
    return r + ")";
}

bool operator==(const ModelConfig& a, const ModelConfig& b) {
    if (a.arch != b.arch || !(a.lora == b.lora)) return false;
    for (const OptionSpec& o : schema()) {
        if (!(o.archs & bit(a.arch))) continue;  // another architecture's option is not part of this config
        const bool same = o.part ? a.part_options.get(o.name) == b.part_options.get(o.name)
                                 : std::visit(
                                       [&](auto member) {
                                           if constexpr (std::is_same_v<decltype(member), std::nullptr_t>) return true;
                                           else return a.*member == b.*member;
                                       },
                                       o.field);
        if (!same) return false;
    }
    return true;
}

// ===================================== hyperparameters, input checks ==================================
ModelConfig resolve(ModelConfig c, Arch arch) { return resolve_config(c, arch, false); }

namespace {
ModelConfig resolve_config(ModelConfig c, Arch arch, bool from_file) {
    c.arch = arch;
    // each option of the architecture by its own rule (the schema), then the rules between options
    for (const OptionSpec& o : schema()) {
        if (!(o.archs & bit(arch))) {  // (from_options refuses it as a keyword; a config built in C++ here)
            if (o.part && !c.part_options.at_default(o.name))
                throw ValueError(std::string(o.name) + " is an option of " + archs_text(o.archs) + ", not of " +
                                 arch_name(arch));
            continue;
        }
        if (o.kind == Kind::Size || o.kind == Kind::Count || o.kind == Kind::AutoSize) {
            const index_t v = index_t(std::get<std::int64_t>(get(c, o)));
            if (o.kind == Kind::Size && v <= 0)
                throw ValueError(std::string(o.name) + " must be a positive integer, got " + std::to_string(v));
            if (o.kind != Kind::Size && v < 0)
                throw ValueError(std::string(o.name) + " must be >= 0, got " + std::to_string(v));
        } else if (o.kind == Kind::Real) {
            check_real(o, std::get<double>(get(c, o)));
        } else if (o.kind == Kind::AutoReal) {
            const double v = std::get<double>(get(c, o));
            if (!(v >= 0)) throw ValueError(std::string(o.name) + " must be > 0 (or 0: the default), got " + str_of(v));
            if (!std::isfinite(v)) throw ValueError(std::string(o.name) + " must be a finite number > 0, got " + str_of(v));
        } else if (o.kind == Kind::Enum && o.part) {  // (a config built in C++: from_options has checked a keyword's)
            const auto* name = std::get_if<std::string>(&c.part_options.get(o.name));
            if (!name) throw TypeError(std::string(o.name) + " must be a str");
            check_choice(*o.part, *name);
        }
    }
    if (arch == Arch::E && c.n_vocab < 4)
        throw ValueError("n_vocab must be >= 4: the vocabulary ends with mask_token, bos_token, eos_token (paper §4)");
    if (arch == Arch::ED && c.n_vocab < 3)
        throw ValueError("n_vocab must be >= 3: decoding needs bos_token = n_vocab-2 and eos_token = n_vocab-1");
    if ((c.d_attn <= 0 || c.d_mid <= 0) && c.d_e % c.H != 0)
        throw ValueError("d_e = " + std::to_string(c.d_e) + " is not divisible by H = " + std::to_string(c.H) +
                         ": pass d_attn and d_mid explicitly, or choose H dividing d_e");
    if (c.d_attn <= 0) c.d_attn = c.d_e / c.H;
    if (c.d_mid <= 0) c.d_mid = c.d_e / c.H;
    if (arch == Arch::E && c.tied && c.d_f != c.d_e)
        throw ValueError("tied=True needs d_f == d_e: W_u = W_eᵀ is N_V × d_e, but ETransformer's W_u is N_V × d_f");
    // the options that name a part (norm, mlp): empty, the listing's; a name or alias, the registered part's
    for (const OptionSpec& o : schema())
        if (o.kind == Kind::Part && o.selects != PartKind::Block) {
            std::string& name = c.*std::get<std::string ModelConfig::*>(o.field);
            const char* listing = default_part(o.selects, arch);
            if (name.empty()) name = listing;
            else if (o.archs & bit(arch)) name = selected_part(o.selects, name, arch, o.name);
            else if (name != listing)  // (a config built in C++; from_options refuses the keyword)
                throw ValueError(std::string(o.name) + "='" + name + "': " + o.name + " is an option of " + archs_text(o.archs) +
                                 "; " + arch_name(arch) + "'s is the listing's, '" + listing + "'");
        }
    for (const auto& [name, id] : {std::pair<const char*, index_t>{"bos_id", c.bos_id}, {"eos_id", c.eos_id},
                                   {"forced_bos_id", c.forced_bos_id}})
        if (id >= c.n_vocab)
            throw ValueError(std::string(name) + " = " + std::to_string(id) + " is out of range [0, n_vocab = " +
                             std::to_string(c.n_vocab) + ")");
    if (arch == Arch::D && c.unembed_bias) throw ValueError("unembed_bias is an ETransformer and EDTransformer option");
    // the variants (docs/variants.md)
    if (c.H_kv == 0) c.H_kv = c.H;
    if (c.H_kv > c.H || c.H % c.H_kv != 0)
        throw ValueError("H_kv = " + std::to_string(c.H_kv) + " must divide H = " + std::to_string(c.H) +
                         " (grouped-query attention: groups of H/H_kv query heads share a key/value head)");
    // where a position part in attention goes, its line says: D's layers, or ED's stacks (one table each)
    if (arch != Arch::D && position_has(c.positional, PositionProperty::Layers))
        throw ValueError("positional=" + positions_with(PositionProperty::Layers) + " are DTransformer options");
    if (arch != Arch::ED && position_has(c.positional, PositionProperty::StackTables))
        throw ValueError("positional='" + c.positional + "' (one table per stack, shared by its layers) is an EDTransformer option");
    // the parts: the one of each kind c chooses, and its check (its options, what it needs of the rest)
    if (c.block.empty()) c.block = default_block(arch);
    for (PartKind kind : kChosenKinds) {
        const PartRow* row = choose(c, kind, from_file ? &c : nullptr);
        if (row && row->complete) row->complete(c.part_options, c);
        if (row && row->check) row->check(c.part_options, &c);
    }
    for (const PartRow* row : chosen_embedding_steps(c.part_options))  // the embedding's steps: each its options chose
        if (row->check) row->check(c.part_options, &c);
    if (const PartRow* row = row_chosen_by(PartKind::Embedding, c.part_options))  // an encoder's embedding (V28's audio)
        if (row->check) row->check(c.part_options, &c);
    check_model_size(c, arch);  // sizes.hpp: overflow-safe, before any layer is declared
    return c;
}
}  // namespace

void validate(const Tokens& x, index_t n_vocab, index_t l_max, const char* what) {
    if (x.s.count() <= 0) throw ValueError(std::string(what) + " is an empty batch");
    for (index_t b = 0; b < x.s.count(); ++b) {
        const std::string name = x.s.count() == 1 ? std::string(what) : std::string(what) + "[" + std::to_string(b) + "]";
        const index_t l = x.s.len(b);
        if (l <= 0) throw ValueError(name + " is an empty sequence");
        if (l > l_max)
            throw ValueError(name + " has length " + std::to_string(l) + " > l_max = " + std::to_string(l_max));
        for (index_t t = 0; t < l; ++t) {
            const index_t v = x.ids[x.s.begin(b) + t];
            if (v < 0 || v >= n_vocab)
                throw IndexError(name + ": token id " + std::to_string(v) + " at position " + std::to_string(t) +
                                 " is out of range [0, " + std::to_string(n_vocab) + ")");
        }
    }
}

index_t max_input_length(const ModelConfig& c) {
    return position_has(c.positional, PositionProperty::PastLMax) ? std::numeric_limits<index_t>::max() : c.l_max;
}

void validate(const Tokens& x, const ModelConfig& c, const char* what) {
    validate(x, c.n_vocab, max_input_length(c), what);
    if (!x.prefix) return;
    if (!per_call_mask(c.mask))
        throw ValueError(std::string("prefix_len is given to a model without mask='prefix' (") + arch_name(c.arch) +
                         (c.arch == Arch::D ? " with mask='" + c.mask + "')" : ")"));
    for (index_t b = 0; b < x.s.count(); ++b) {
        const index_t p = x.prefix[b], l = x.s.len(b);
        const std::string of = x.s.count() == 1 ? "" : " of sequence " + std::to_string(b);
        if (p < 0) throw ValueError("prefix_len" + of + " must be >= 0, got " + std::to_string(p));
        if (p > l)
            throw ValueError("prefix_len" + of + " = " + std::to_string(p) + " exceeds the sequence's " + std::to_string(l) +
                             " tokens");
    }
}

ModelSize model_size(const ModelConfig& c, Arch arch) {
    const char* what = "model size";
    ModelSize size;
    size.layers = arch == Arch::ED ? checked_add(c.L_enc, c.L_dec, what) : c.L;
    // one attention: W_q, W_k, W_v (H × d_attn × d_e each) and W_o (d_e × H·d_mid)
    size.attention = checked_add(checked_count({3, c.H, c.d_attn, c.d_e}, what), checked_count({c.H, c.d_mid, c.d_e}, what), what);
    for (const PartRow* row : chosen_parts(c))
        if (row->size) row->size(c.part_options, c, size);
    return size;
}

void check_model_size(const ModelConfig& c, Arch arch) {
    const char* what = "model size";
    const ModelSize size = model_size(c, arch);
    const index_t d = c.d_e, L = size.layers, attn = size.attention;
    const index_t mlp = checked_count({2, c.d_mlp, d}, what);  // W_mlp1, W_mlp2
    index_t layer = checked_add(attn, mlp, what);
    if (arch == Arch::ED) layer = checked_add(layer, attn, what);  // (the decoder's cross-attention: at least)
    const index_t emb = checked_add(checked_mul(c.n_vocab, d, what), checked_mul(c.l_max, d, what), what);
    const index_t params = checked_add(emb, checked_mul(L, layer, what), what);
    // θ and gradient in float32, and each layer's bookkeeping
    const index_t bytes = checked_add(checked_count({params, 2, index_t(sizeof(float))}, what),
                                      checked_mul(L, kLayerOverhead, what), what);
    if (std::uint64_t(bytes) > max_alloc_bytes())
        throw_size_error(what, "n_vocab=" + std::to_string(c.n_vocab) + ", l_max=" + std::to_string(c.l_max) +
                                   ", layers=" + std::to_string(L) + ", H=" + std::to_string(c.H) +
                                   ", d_e=" + std::to_string(d) + ", d_attn=" + std::to_string(c.d_attn) +
                                   ", d_mid=" + std::to_string(c.d_mid) + ", d_mlp=" + std::to_string(c.d_mlp) +
                                   " need at least " + std::to_string(params) + " parameters (" + human_bytes(bytes) +
                                   " with their gradients), which exceeds this machine's memory (" +
                                   human_bytes((long double)max_alloc_bytes()) + ")");
}

}  // namespace ft
