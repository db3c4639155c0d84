// The prefix-LM mask (Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a Unified
// Text-to-Text Transformer", §3.2.1, "prefix LM"): a decoder whose first p tokens of each sequence (the
// prefix, e.g. the input of a task) see each other in both directions, the rest causally.
//
// Mask[t_z, t_x] = [[t_z < p_b or t_z ≤ t_x]]   for sequence b of a batch, with its own prefix length p_b.
//
// Keys t_z < max(p_b, t_x + 1) are exactly the allowed ones: one dense range per query column, so the
// softmax skips the masked rest as the causal mask's does. p_b = 0 is the unidirectional mask; p_b = ℓ the
// bidirectional one. Made by make_mask("prefix", {per_sequence = {p_1, …, p_B}}) (registry.cpp).
#include <algorithm>

#include "formal_transformers/parts.hpp"

namespace ft {

namespace {
class PrefixMask final : public MaskRule {
public:
    explicit PrefixMask(std::vector<index_t> p) : p_(std::move(p)) {}
    std::string name() const override { return "prefix"; }
    bool allows(index_t b, index_t t_z, index_t t_x) const override { return t_z < p_[std::size_t(b)] || t_z <= t_x; }
    KeyRange keys(index_t b, index_t t_x, index_t l_z) const override {
        return {0, std::min(l_z, std::max(p_[std::size_t(b)], t_x + 1)), true};
    }
    void check_batch(index_t n_seqs) const override {
        if (n_seqs != index_t(p_.size()))
            throw ValueError("prefix mask: " + std::to_string(p_.size()) + " prefix lengths for a batch of " +
                             std::to_string(n_seqs) + " sequences (one p_b per sequence)");
    }
    void check(index_t b, index_t l_z, index_t, index_t, bool) const override {
        if (b >= index_t(p_.size()))
            throw ValueError("prefix mask: no prefix length for sequence " + std::to_string(b) + " (it has " +
                             std::to_string(p_.size()) + ")");
        if (p_[std::size_t(b)] > l_z)
            throw ValueError("prefix mask: prefix length " + std::to_string(p_[std::size_t(b)]) + " of sequence " +
                             std::to_string(b) + " exceeds its " + std::to_string(l_z) + " tokens");
    }

private:
    std::vector<index_t> p_;
};
}  // namespace

Mask make_prefix_mask(const MaskOptions& o) {
    if (o.per_sequence.empty()) throw ValueError("prefix mask: give one prefix length p_b per sequence");
    for (index_t p : o.per_sequence)
        if (p < 0) throw ValueError("prefix mask: prefix lengths must be >= 0, got " + std::to_string(p));
    return Mask(std::make_shared<PrefixMask>(o.per_sequence));
}

}  // namespace ft
