// The Mask hyperparameter of Algorithm 4 (mask.hpp): the paper's three masks as mask rules, and the Mask value.
#include "formal_transformers/mask.hpp"

#include <algorithm>
#include <limits>

#include "formal_transformers/parts.hpp"
#include "formal_transformers/sizes.hpp"

namespace ft {

namespace {
// Mask ≡ 1 (Algorithm 9; Algorithm 8's cross-attention): every key a candidate, all allowed.
class BidirectionalMask final : public MaskRule {
public:
    std::string name() const override { return "bidirectional"; }
    bool allows(index_t, index_t, index_t) const override { return true; }
    KeyRange keys(index_t, index_t, index_t l_z) const override { return {0, l_z, true}; }
};

// Mask[t_z, t_x] = [[t_z ≤ t_x]] (Algorithm 10 line 6): the first t_x + 1 keys, all allowed.
class UnidirectionalMask final : public MaskRule {
public:
    std::string name() const override { return "unidirectional"; }
    bool allows(index_t, index_t t_z, index_t t_x) const override { return t_z <= t_x; }
    KeyRange keys(index_t, index_t t_x, index_t l_z) const override { return {0, std::min(l_z, t_x + 1), true}; }
};

// A given bool matrix [ℓ_z, ℓ_x] (column-major), the same for every sequence; every entry tested.
class ExplicitMask final : public MaskRule {
public:
    ExplicitMask(index_t l_z, index_t l_x, std::vector<std::uint8_t> m) : l_z_(l_z), l_x_(l_x), m_(std::move(m)) {}
    std::string name() const override { return "explicit"; }
    bool allows(index_t, index_t t_z, index_t t_x) const override { return m_[std::size_t(t_z + t_x * l_z_)] != 0; }
    // an explicit mask needs ℓ_z equal to its rows and q0 + ℓ_x at most its columns (so cached decoding can
    // use its first columns), or with `exact` exactly its shape
    void check(index_t, index_t l_z, index_t l_x, index_t q0, bool exact) const override {
        if (l_z != l_z_ || q0 + l_x > l_x_ || (exact && q0 + l_x != l_x_))
            throw ValueError("mask has shape (" + std::to_string(l_z_) + ", " + std::to_string(l_x_) +
                             ") but this attention has (l_z, l_x) = (" + std::to_string(l_z) + ", " +
                             std::to_string(q0 + l_x) + ")");
    }
    std::pair<index_t, index_t> shape() const override { return {l_z_, l_x_}; }

private:
    index_t l_z_, l_x_;
    std::vector<std::uint8_t> m_;
};
}  // namespace

Mask::Mask() : rule_(std::make_shared<BidirectionalMask>()) {}
Mask::Mask(std::shared_ptr<const MaskRule> rule) : rule_(std::move(rule)) {
    FT_CHECK(rule_ != nullptr, "Mask: null rule");
}
CacheKeep MaskRule::cache_keep() const { return CacheKeep{window()}; }
namespace {
index_t twice(index_t w) {  // 2w, saturating: a window wider than memory is never reached
    const index_t big = std::numeric_limits<index_t>::max();
    return w > big / 2 ? big : 2 * w;
}
}  // namespace
index_t CacheKeep::drop(index_t len, index_t n) const {
    return window > 0 && len > window - 1 && len + n > twice(window) ? len - (window - 1) : 0;
}
index_t CacheKeep::capacity(index_t need, index_t have) const {
    const index_t w2 = twice(window);
    const bool shrink = window > 0 && have / 4 > std::max<index_t>(need, w2);  // after a long prompt
    if (have >= need && !shrink) return have;
    index_t cap = std::max<index_t>(need, twice(have));
    if (window > 0) cap = std::max<index_t>(need, std::min(cap, w2));
    return cap;
}

Mask Mask::bidirectional() { return Mask(std::make_shared<BidirectionalMask>()); }
Mask Mask::unidirectional() { return Mask(std::make_shared<UnidirectionalMask>()); }

Mask Mask::explicit_matrix(index_t l_z, index_t l_x, const std::uint8_t* m) {
    if (l_z <= 0 || l_x <= 0) throw ValueError("mask must have a positive shape (l_z, l_x)");
    std::vector<std::uint8_t> v(m, m + checked_elements({l_z, l_x}, 1, "mask (l_z, l_x)"));
    for (index_t t_x = 0; t_x < l_x; ++t_x) {
        bool any = false;
        for (index_t t_z = 0; t_z < l_z && !any; ++t_z) any = v[std::size_t(t_z + t_x * l_z)] != 0;
        if (!any)
            throw ValueError("mask column " + std::to_string(t_x) + " is all False: query token " + std::to_string(t_x) +
                             " could attend to nothing (softmax over an empty set)");
    }
    return Mask(std::make_shared<ExplicitMask>(l_z, l_x, std::move(v)));
}

void Mask::check(const Seqs& sz, const Seqs& sx, index_t q0, bool exact) const {
    FT_CHECK(sz.count() == sx.count(), "attention: X and Z batches differ in size");
    rule_->check_batch(sx.count());
    for (index_t b = 0; b < sx.count(); ++b) rule_->check(b, sz.len(b), sx.len(b), q0, exact);
}
void Mask::check(index_t l_z, index_t l_x, index_t q0, bool exact) const { rule_->check(0, l_z, l_x, q0, exact); }

std::vector<std::uint8_t> Mask::matrix(index_t l_z, index_t l_x, index_t b) const {
    if (l_z < 0) l_z = this->l_z();
    if (l_x < 0) l_x = this->l_x();
    std::vector<std::uint8_t> m(std::size_t(checked_elements({l_z, l_x}, 1, "mask (l_z, l_x)")));
    for (index_t t_x = 0; t_x < l_x; ++t_x)
        for (index_t t_z = 0; t_z < l_z; ++t_z) m[std::size_t(t_z + t_x * l_z)] = rule_->allows(b, t_z, t_x);
    return m;
}

std::vector<std::uint8_t> bidirectional_mask(index_t l_z, index_t l_x) { return Mask::bidirectional().matrix(l_z, l_x); }
std::vector<std::uint8_t> unidirectional_mask(index_t l_z, index_t l_x) { return Mask::unidirectional().matrix(l_z, l_x); }

// registry factories (variants/registry.cpp)
Mask make_bidirectional_mask(const MaskOptions&) { return Mask::bidirectional(); }
Mask make_unidirectional_mask(const MaskOptions&) { return Mask::unidirectional(); }

}  // namespace ft
