// Options as the model config's schema (config.cpp) and the parts (parts.hpp's registry rows) declare them: a
// value as a front-end passes it, an option's type and check, and the values of the options a part owns
// (PartOptionValues, kept in ModelConfig::part_options). docs/design.md "Adding a variant".
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "formal_transformers/common.hpp"

namespace ft {

// The three models of the paper: Algorithm 10 (D), 9 (E), 8 (ED).
enum class Arch { D, E, ED };
// The architectures an option is accepted by (a bit each).
namespace archs {
enum : unsigned { D = 1, E = 2, ED = 4, DE = D | E, ALL = D | E | ED };
inline unsigned bit(Arch a) { return a == Arch::D ? D : a == Arch::E ? E : ED; }
}  // namespace archs

// One option's value as a front-end passes it (a Python keyword argument, a JSON value): None, a bool, an
// integer, a real number or a string. The schema (config.cpp) checks its type against the option's.
using OptionValue = std::variant<std::monostate, bool, std::int64_t, std::uint64_t, double, std::string>;
using Options = std::vector<std::pair<std::string, OptionValue>>;  // name -> value, in the caller's order

// An option's type, and with it the check of one value and its JSON form.
enum class OptionKind {
    Size,      // a positive integer that every config of the architecture needs (the sizes)
    AutoSize,  // a positive integer, or None: 0 (d_attn, d_mid, H_kv: filled by resolve from the others;
               // a part's option: off, written None)
    Count,     // an integer >= 0
    Real,      // a real number (checked by OptionCheck)
    AutoReal,  // a real number > 0, or None: 0 (base)
    Bool,
    Seed,      // an integer in [0, 2^64)
    Enum,      // a string from the option's name table (a part's option: PartOption::names)
    AllRates,  // "dropout": the default of the three rates, not stored
    AutoId,    // a token id >= 0, or None: −1 (bos_id, eos_id; resolve checks it against n_vocab)
    Part,      // a registered part's name (block: the registry's blocks; resolve runs the chosen one's check)
};
enum class OptionCheck { None, Positive, NonNegative, Rate };

// An option a part owns (its registry row, parts.hpp PartRow): declared in the part's own file. Its value is
// kept in ModelConfig::part_options, as the type's stored form: an int64 for the integer kinds (AutoSize's
// None: 0), a double for the real ones, a bool, a uint64 for a seed, a std::string for an Enum (one of `names`).
struct PartOption {
    const char* name;
    unsigned archs;  // archs::D | …: the architectures that take it (TypeError for another's)
    OptionKind kind;
    OptionValue default_value;  // the stored form (an AutoSize's None: std::int64_t(0); an Enum's: its name)
    OptionCheck check = OptionCheck::None;
    const char* doc = "";
    std::vector<const char*> names = {};  // an Enum's name table (ValueError for another name)
};

// The values of the part-owned options of one config: name → stored value; an option not set has its
// declared default (the registry's row). The typed getters read it as its part does.
class PartOptionValues {
public:
    index_t integer(const std::string& name) const;  // Size, Count, AutoSize (None: 0), AutoId (None: −1)
    double real(const std::string& name) const;
    bool flag(const std::string& name) const;
    std::uint64_t seed(const std::string& name) const;
    const std::string& choice(const std::string& name) const;  // an Enum's name
    // the value (the declared default when not set); std::logic_error for a name no part declares
    const OptionValue& get(const std::string& name) const;
    bool at_default(const std::string& name) const;
    void set(const std::string& name, OptionValue v);  // the stored form (unchecked: resolve checks it)

private:
    std::map<std::string, OptionValue> v_;
};

}  // namespace ft
