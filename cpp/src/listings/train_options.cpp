// The trainers' options (training.hpp's TrainOptions): their schema, every option once, and what reads it —
// parsing the Python trainers' keyword arguments, the checks, the options' values and the docstrings' lines.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <type_traits>
#include <variant>

#include "formal_transformers/training.hpp"

namespace ft {

namespace {
enum Listings : unsigned { LD = 1, LE = 2, LED = 4, ALL = LD | LE | LED };
unsigned bit(Listing l) { return l == Listing::D ? LD : l == Listing::E ? LE : LED; }

// An option's type: what a value must be (TypeError otherwise) and how it is stored and written.
enum class Kind {
    Int,      // an integer, in the row's Range
    OffInt,   // an integer >= 1, or None: 0, off (patience; 0 itself is refused: None says "off")
    Real,     // a real number (an int is one too), in the row's Range
    Eta,      // a real number, or None: the optimizer object's lr (else the default)
    Bool,     // True or False
    Seed,     // an integer in [0, 2^64)
    Enum,     // a string from the row's names
    Patterns, // None (all), or names / glob patterns (the bindings pass a list as one string, one per line)
};
enum class Range { Any, AtLeast0, AtLeast1, FiniteAtLeast0, AtLeast0OrInf, Open01, FinitePositive };
const char* range_text(Range r) {
    switch (r) {
        case Range::AtLeast0: return ">= 0";
        case Range::AtLeast1: return ">= 1";
        case Range::FiniteAtLeast0: return "a finite number >= 0";
        case Range::AtLeast0OrInf: return ">= 0";
        case Range::Open01: return "in (0, 1)";
        case Range::FinitePositive: return "a finite number > 0";
        default: return "";
    }
}
bool in_range(Range r, double v) {
    switch (r) {
        case Range::AtLeast0: case Range::AtLeast0OrInf: return v >= 0;
        case Range::AtLeast1: return v >= 1;
        case Range::FiniteAtLeast0: return v >= 0 && std::isfinite(v);
        case Range::Open01: return v > 0 && v < 1;
        case Range::FinitePositive: return v > 0 && std::isfinite(v);
        default: return true;
    }
}

using O = TrainOptions;
using Field = std::variant<index_t O::*, double O::*, bool O::*, std::uint64_t O::*, O::Reduction O::*,
                           O::Schedule O::*, O::NonFinite O::*, O::Optimizer O::*, std::vector<std::string> O::*>;
struct OptionSpec {
    const char* name;
    unsigned listings;
    Kind kind;
    Field field;  // the member (its initialiser in training.hpp is the default)
    Range range;
    std::vector<const char*> names;  // Enum: the names of the values 0, 1, …
    const char* doc;
};

// Every option of the trainers, in the order the docstrings list them. Adding one: a member of TrainOptions
// (with its default) and one row here; a rule between options goes in TrainOptions::check.
const std::vector<OptionSpec> kSchema = {
    {"n_epochs", ALL, Kind::Int, &O::n_epochs, Range::AtLeast0, {}, "N_epochs: passes over the data (0 with max_steps: as many as max_steps needs)"},
    {"eta", ALL, Kind::Eta, &O::eta, Range::FiniteAtLeast0, {}, "η, the peak learning rate (None: an optimizer object's lr, else 0.001)"},
    {"optimizer", ALL, Kind::Enum, &O::optimizer, Range::Any, {"adam", "sgd"}, "'adam' (AdamW with weight_decay, betas), 'sgd' (the listing's θ ← θ − η∇loss), or an ft.Adam / ft.SGD object (its moments kept; its lr must equal eta)"},
    {"weight_decay", ALL, Kind::Real, &O::weight_decay, Range::FiniteAtLeast0, {}, "λ of optimizer='adam' (AdamW's θ ← θ(1 − ηλ))"},
    {"beta1", ALL, Kind::Real, &O::beta1, Range::Any, {}, "β₁ of optimizer='adam' (Python: betas=(β₁, β₂)); Adam checks it"},
    {"beta2", ALL, Kind::Real, &O::beta2, Range::Any, {}, "β₂ of optimizer='adam'"},
    {"batch_size", ALL, Kind::Int, &O::batch_size, Range::AtLeast1, {}, "sequences per update (the listing: 1)"},
    {"reduction", ALL, Kind::Enum, &O::reduction, Range::Any, {"sum", "mean"}, "the update's loss: the mean over the minibatch of the listing's per-sequence loss ('sum') or the mean per scored token ('mean')"},
    {"shuffle", ALL, Kind::Bool, &O::shuffle, Range::Any, {}, "a fresh seeded order each epoch"},
    {"seed", ALL, Kind::Seed, &O::seed, Range::Any, {}, "the generator of the order (and ETraining's masks): same seed, same run"},
    {"schedule", ALL, Kind::Enum, &O::schedule, Range::Any, {"constant", "cosine", "linear"}, "η's decay to min_lr at the last step, after `warmup` linear steps"},
    {"warmup", ALL, Kind::Int, &O::warmup, Range::AtLeast0, {}, "steps of linear warm-up to η"},
    {"min_lr", ALL, Kind::Real, &O::min_lr, Range::FiniteAtLeast0, {}, "η at the end of the decay"},
    {"clip", ALL, Kind::Real, &O::clip, Range::AtLeast0OrInf, {}, "rescale the gradient to norm <= clip (0: off)"},
    {"max_steps", ALL, Kind::Int, &O::max_steps, Range::AtLeast0, {}, "stop after this many updates (0: no limit; with n_epochs=0 the run's length)"},
    {"start_step", ALL, Kind::Int, &O::start_step, Range::AtLeast0, {}, "resuming a run: the updates already done; warm-up and decay continue from there over start_step + this run's steps (history and callback steps count from 1)"},
    {"p_mask", LE, Kind::Real, &O::p_mask, Range::Open01, {}, "Algorithm 12: the probability of masking a token"},
    {"nonfinite", ALL, Kind::Enum, &O::nonfinite, Range::Any, {"raise", "warn", "skip"}, "a step whose loss or gradient norm is NaN/inf (or whose update would make θ so) is never applied: 'raise' stops with FloatingPointError naming it, the model holding its parameters after the step before; 'warn' (RuntimeWarning) and 'skip' skip it (history's \"skipped\") and go on"},
    {"eval_every", ALL, Kind::Int, &O::eval_every, Range::AtLeast0, {}, "validation loss and accuracy every this many steps and at the end (needs val_data)"},
    {"patience", ALL, Kind::OffInt, &O::patience, Range::AtLeast1, {}, "early stopping: stop after this many evaluations without improving the best by more than min_delta (None: never)"},
    {"min_delta", ALL, Kind::Real, &O::min_delta, Range::FiniteAtLeast0, {}, "early stopping: the improvement that counts"},
    {"restore_best", ALL, Kind::Bool, &O::restore_best, Range::Any, {}, "at the end, give the model the parameters of the best evaluation (copied at each new best; an end by Ctrl-C or an exception restores nothing; needs val_data, as patience)"},
    {"trainable", ALL, Kind::Patterns, &O::trainable, Range::Any, {}, "the parameters that train: a list of names or glob patterns of θ's names (e.g. ['*gamma*', 'W_e']); the others are frozen (no update, no Adam moments, no weight-gradient product); None: all. A pattern matching no parameter is a ValueError"},
    {"dist_timeout", ALL, Kind::Real, &O::dist_timeout, Range::FinitePositive, {}, "data parallel: seconds a rank waits for the others (a group the trainer initialises)"},
    {"sync_check_every", ALL, Kind::Int, &O::sync_check_every, Range::AtLeast0, {}, "data parallel: compare fingerprints of θ across the ranks every this many steps (0: at the start and the end only); a difference raises RuntimeError"},
};

const char* type_name(const OptionValue& v) {
    static const char* names[] = {"None", "bool", "int", "int", "float", "str"};
    return names[v.index()];
}
std::string str_of(double v) {  // Python's repr of a float
    if (!std::isfinite(v)) return v != v ? "nan" : v > 0 ? "inf" : "-inf";
    char buf[64];
    std::string r(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
    if (r.find_first_of(".e") == std::string::npos) r += ".0";
    return r;
}
std::string repr(const OptionValue& v) {
    return std::visit([](const auto& x) -> std::string {
        using V = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<V, std::monostate>) return "None";
        else if constexpr (std::is_same_v<V, bool>) return x ? "True" : "False";
        else if constexpr (std::is_same_v<V, double>) return str_of(x);
        else if constexpr (std::is_same_v<V, std::string>) return "'" + x + "'";
        else return std::to_string(x);
    }, v);
}
std::string choices(const OptionSpec& s) {
    std::string r;
    for (std::size_t k = 0; k < s.names.size(); ++k)
        r += std::string(k == 0 ? "" : k + 1 == s.names.size() ? " or " : ", ") + "'" + s.names[k] + "'";
    return r;
}

// One option's value, checked against its row: TypeError for a wrong type, ValueError out of range.
void set_option(O& o, const OptionSpec& s, const OptionValue& v) {
    const std::string name = s.name;
    auto wrong = [&](const std::string& expected) { throw TypeError(name + " must be " + expected + ", got " + type_name(v)); };
    auto out_of_range = [&]() { throw ValueError(name + " must be " + range_text(s.range) + ", got " + repr(v)); };
    const bool none = std::holds_alternative<std::monostate>(v);
    switch (s.kind) {
        case Kind::Int: case Kind::OffInt: {
            index_t& x = o.*std::get<index_t O::*>(s.field);
            if (s.kind == Kind::OffInt && none) { x = 0; return; }
            if (const auto* i = std::get_if<std::int64_t>(&v)) x = index_t(*i);
            else if (std::holds_alternative<std::uint64_t>(v)) throw ValueError(name + " must be " + range_text(s.range) + " and below 2^63, got " + repr(v));
            else wrong(s.kind == Kind::OffInt ? "an int or None" : "an int");
            if (s.kind == Kind::OffInt && x == 0)
                throw ValueError(name + " = 0: write " + name + "=None for no early stopping");
            if (!in_range(s.range, double(x))) out_of_range();
            return;
        }
        case Kind::Real: case Kind::Eta: {
            double& x = o.*std::get<double O::*>(s.field);
            if (const auto* d = std::get_if<double>(&v)) x = *d;
            else if (const auto* i = std::get_if<std::int64_t>(&v)) x = double(*i);
            else if (const auto* u = std::get_if<std::uint64_t>(&v)) x = double(*u);
            else wrong(s.kind == Kind::Eta ? "a real number or None" : "a real number");
            if (!in_range(s.range, x)) out_of_range();
            return;
        }
        case Kind::Bool:
            if (!std::holds_alternative<bool>(v)) wrong("True or False");
            o.*std::get<bool O::*>(s.field) = std::get<bool>(v);
            return;
        case Kind::Seed:
            if (const auto* i = std::get_if<std::int64_t>(&v)) {
                if (*i < 0) throw ValueError(name + " = " + std::to_string(*i) + " is outside [0, 2^64)");
                o.seed = std::uint64_t(*i);
            } else if (const auto* u = std::get_if<std::uint64_t>(&v)) {
                o.seed = *u;
            } else {
                wrong("an int");
            }
            return;
        case Kind::Patterns: {
            std::vector<std::string>& x = o.*std::get<std::vector<std::string> O::*>(s.field);
            x.clear();
            if (none) return;
            if (!std::holds_alternative<std::string>(v)) wrong("a list of parameter names or glob patterns, or None");
            const std::string& text = std::get<std::string>(v);
            std::size_t at = 0;
            while (true) {  // one pattern per line
                const std::size_t end = text.find('\n', at);
                x.push_back(text.substr(at, end == std::string::npos ? std::string::npos : end - at));
                if (x.back().empty()) throw ValueError(name + ": an empty pattern matches no parameter");
                if (end == std::string::npos) break;
                at = end + 1;
            }
            return;
        }
        case Kind::Enum: {
            if (!std::holds_alternative<std::string>(v)) wrong("a string");
            const std::string& text = std::get<std::string>(v);
            for (std::size_t k = 0; k < s.names.size(); ++k)
                if (text == s.names[k]) {
                    std::visit([&](auto member) {
                        using M = std::decay_t<decltype(o.*member)>;
                        if constexpr (std::is_enum_v<M>) o.*member = M(k);
                    }, s.field);
                    return;
                }
            throw ValueError(name + " must be " + choices(s) + ", got '" + text + "'");
        }
    }
}

// One option's value in Python's notation (the inverse of set_option).
OptionValue value_of(const O& o, const OptionSpec& s) {
    return std::visit([&](auto member) -> OptionValue {
        const auto x = o.*member;
        using M = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<M, std::vector<std::string>>) {
            if (x.empty()) return std::monostate{};
            std::string r;
            for (std::size_t k = 0; k < x.size(); ++k) r += (k ? "\n" : "") + x[k];
            return r;
        } else if constexpr (std::is_enum_v<M>) return std::string(s.names[std::size_t(x)]);
        else if constexpr (std::is_same_v<M, index_t>) {
            if (s.kind == Kind::OffInt && x == 0) return std::monostate{};
            return std::int64_t(x);
        } else return x;
    }, s.field);
}
}  // namespace

bool glob_match(const std::string& p, const std::string& s) {
    // iterative matching with one backtrack point for the last '*'
    std::size_t i = 0, j = 0, star = std::string::npos, mark = 0;
    auto one = [&](std::size_t& pi, char c) -> bool {  // p[pi] matches c; advances pi past the item
        if (p[pi] == '?') { ++pi; return true; }
        if (p[pi] == '[') {
            std::size_t k = pi + 1;
            const bool negate = k < p.size() && p[k] == '!';
            if (negate) ++k;
            bool hit = false;
            const std::size_t first = k;
            for (; k < p.size() && (p[k] != ']' || k == first); ++k) {
                if (k + 2 < p.size() && p[k + 1] == '-' && p[k + 2] != ']') {
                    hit |= p[k] <= c && c <= p[k + 2];
                    k += 2;
                } else {
                    hit |= p[k] == c;
                }
            }
            if (k < p.size()) {  // a closed set
                pi = k + 1;
                return hit != negate;
            }
        }
        return p[pi++] == c;  // a plain character (an unclosed '[' is itself)
    };
    while (j < s.size()) {
        if (i < p.size() && p[i] == '*') {
            star = i++;
            mark = j;
            continue;
        }
        std::size_t pi = i;
        if (i < p.size() && one(pi, s[j])) {
            i = pi;
            ++j;
            continue;
        }
        if (star == std::string::npos) return false;
        i = star + 1;
        j = ++mark;
    }
    while (i < p.size() && p[i] == '*') ++i;
    return i == p.size();
}

template <class T>
std::vector<bool> resolve_trainable(const TrainOptions& o, const ParamStore<T>& store) {
    const auto& entries = store.entries();
    std::vector<bool> train(entries.size(), o.trainable.empty());
    for (const std::string& pattern : o.trainable) {
        bool any = false;
        for (std::size_t k = 0; k < entries.size(); ++k)
            if (glob_match(pattern, entries[k].name)) train[k] = any = true;
        if (!any) {
            std::string some;
            for (std::size_t k = 0; k < entries.size() && k < 4; ++k) some += (k ? ", " : "") + entries[k].name;
            throw ValueError("trainable: the pattern '" + pattern + "' matches no parameter of the model (its names are " +
                             "like " + some + (entries.size() > 4 ? ", …" : "") + "; model.params lists them)");
        }
    }
    return train;
}
template std::vector<bool> resolve_trainable<float>(const TrainOptions&, const ParamStore<float>&);
template std::vector<bool> resolve_trainable<double>(const TrainOptions&, const ParamStore<double>&);

const char* listing_name(Listing l) { return l == Listing::D ? "DTraining" : l == Listing::E ? "ETraining" : "EDTraining"; }

void TrainOptions::check() const {
    for (const OptionSpec& s : kSchema) {  // each option's range (its type is its member's)
        double v = 0;
        if (const auto* i = std::get_if<index_t O::*>(&s.field)) v = double(this->**i);
        else if (const auto* d = std::get_if<double O::*>(&s.field)) v = this->**d;
        else continue;
        if (s.kind == Kind::OffInt && v == 0) continue;
        if (!in_range(s.range, v))
            throw ValueError(std::string(s.name) + " must be " + range_text(s.range) + ", got " + repr(value_of(*this, s)));
    }
    // the rules between options
    if (optimizer == Optimizer::SGD && weight_decay != 0)
        throw ValueError("weight_decay needs optimizer='adam' (AdamW); the listing's SGD has none");
    if (optimizer == Optimizer::Adam) check_adam(eta, beta1, beta2, 1e-8, weight_decay);  // the Adam it makes
}

TrainOptions TrainOptions::from_options(Listing listing, const Options& keywords, const double* optimizer_lr) {
    const std::string who = std::string(listing_name(listing)) + "()";
    TrainOptions o;
    if (optimizer_lr) o.eta = *optimizer_lr;
    std::vector<const OptionSpec*> given;
    for (const auto& [name, v] : keywords) {
        const OptionSpec* s = nullptr;
        for (const OptionSpec& r : kSchema)
            if (name == r.name && (r.listings & bit(listing))) s = &r;
        if (!s) throw TypeError(who + " got an unexpected keyword argument '" + name + "'");
        if (std::find(given.begin(), given.end(), s) != given.end())
            throw TypeError(who + " got multiple values for argument '" + name + "'");
        given.push_back(s);
        if (s->kind == Kind::Eta && std::holds_alternative<std::monostate>(v)) continue;  // None: as not given
        set_option(o, *s, v);
    }
    o.check();
    return o;
}

Options TrainOptions::to_options(Listing listing) const {
    Options r;
    for (const OptionSpec& s : kSchema)
        if (s.listings & bit(listing)) r.emplace_back(s.name, value_of(*this, s));
    return r;
}

std::string TrainOptions::doc(Listing listing) {
    const TrainOptions defaults;
    std::string r;
    for (const OptionSpec& s : kSchema)
        if (s.listings & bit(listing)) r += std::string(s.name) + "=" + repr(value_of(defaults, s)) + "  " + s.doc + "\n";
    return r;
}

TrainOptions::Reduction parse_reduction(const std::string& name) {  // the schema's row, its names and message
    TrainOptions o;
    for (const OptionSpec& s : kSchema)
        if (std::string(s.name) == "reduction") set_option(o, s, name);
    return o.reduction;
}

}  // namespace ft
