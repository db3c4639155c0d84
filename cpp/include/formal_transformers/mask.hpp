// The Mask hyperparameter of Algorithm 4 as a part: Mask[t_z, t_x] = 1 when query token t_x may attend to
// context token t_z. The paper's masks (listings/masks.cpp): bidirectional, Mask ≡ 1 (Algorithm 9, and the
// cross-attention of Algorithm 8); unidirectional (causal), Mask[t_z, t_x] = [[t_z ≤ t_x]] (Algorithm 10);
// explicit, a given bool matrix. Further masks are variants, one file each under cpp/src/variants/ and one
// line in the registry (parts.hpp, make_mask): e.g. "prefix" (variants/prefix_mask.cpp).
//
// A mask rule answers two questions for query column t_x of sequence b of a batch (a rule may depend on
// per-sequence data, such as a prefix length p_b):
//   allows(b, t_z, t_x)   Mask[t_z, t_x] (allows_head(b, h, t_z, t_x): of query head h, for a rule with one
//                         mask per head; by default every head's is allows(b, t_z, t_x));
//   keys(b, t_x, ℓ_z)     the candidates: keys outside [begin, end) are masked, so Algorithm 4's line 5 need
//                         not compute them (the causal path skips them); with `dense`, every candidate is
//                         allowed, so no entry is tested one by one.
// Positions are absolute: a query at position q0 + j (decoding with a cache) is column t_x = q0 + j.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "formal_transformers/common.hpp"

namespace ft {

// The candidate keys of one query column: t_z ∈ [begin, end); dense: all of them allowed.
struct KeyRange {
    index_t begin = 0, end = 0;
    bool dense = true;
};

struct CacheKeep;  // below
class MaskRule {
public:
    virtual ~MaskRule() = default;
    virtual std::string name() const = 0;
    // Mask[t_z, t_x] of sequence b
    virtual bool allows(index_t b, index_t t_z, index_t t_x) const = 0;
    // Mask[t_z, t_x] of sequence b for query head h: the same for every head unless a rule has one per head
    // (V17's per-head block layouts). Algorithm 4's lines 4–6 of head h ask this one (attention_head, the tiles).
    virtual bool allows_head(index_t b, index_t h, index_t t_z, index_t t_x) const {
        (void)h;
        return allows(b, t_z, t_x);
    }
    // The candidate keys of column t_x of sequence b among ℓ_z keys. Default: all, each tested by allows().
    virtual KeyRange keys(index_t b, index_t t_x, index_t l_z) const {
        (void)b, (void)t_x;
        return {0, l_z, false};
    }
    // Does this mask fit a batch of n_seqs sequences (per-sequence data)? ValueError naming the problem.
    virtual void check_batch(index_t n_seqs) const { (void)n_seqs; }
    // Does it fit sequence b, with ℓ_z context tokens and queries at positions q0..q0+ℓ_x−1 (exact: the
    // stand-alone calls, no cache)? ValueError naming the problem. Default: any shape.
    virtual void check(index_t b, index_t l_z, index_t l_x, index_t q0, bool exact) const {
        (void)b, (void)l_z, (void)l_x, (void)q0, (void)exact;
    }
    // A fixed shape (l_z, l_x), for explicit matrices; (0, 0): any.
    virtual std::pair<index_t, index_t> shape() const { return {0, 0}; }
    // w > 0: a query at t_x never reads a key before t_x − w + 1, and the rule depends on t_x − t_z only (a KV
    // cache may drop older keys and index the rest from any start: docs/variants.md V9). 0: no such bound.
    virtual index_t window() const { return 0; }
    // What a KV cache keeps of this rule's keys when decoding (CacheKeep); default: by window()
    virtual CacheKeep cache_keep() const;
};

// What a KV cache keeps of a mask's keys (MHAttention::append_kv, paged decoding ask the mask): every key, or with a
// window w > 0 (V9) a rolling cache — before a new query at t_x only the keys from t_x − w + 1 on are read again.
struct CacheKeep {
    index_t window = 0;  // 0: every key
    // before n new columns join a cache of len: how many of its oldest columns to drop (the last w − 1 stay; at
    // most every w tokens, so O(1) copies per token)
    index_t drop(index_t len, index_t n) const;
    // the capacity a cache holding `have` columns takes for `need`: `have` while it fits (no reallocation), else
    // doubling; a window's at most 2w, and shrunk back to it after a long prompt
    index_t capacity(index_t need, index_t have) const;
    // of a sequence of len tokens, the first whose key a next query still reads (paged decoding frees the pages
    // wholly before it)
    index_t oldest_needed(index_t len) const { return window > 0 && len > window ? len - window : 0; }
};

// A mask as a value (cheap to copy: the rule is shared and immutable).
class Mask {
public:
    Mask();  // bidirectional
    explicit Mask(std::shared_ptr<const MaskRule> rule);
    static Mask bidirectional();
    static Mask unidirectional();
    // m: column-major [l_z, l_x] of 0/1. ValueError if some column has no 1 (a query that may attend to
    // nothing: softmax over an empty set is undefined).
    static Mask explicit_matrix(index_t l_z, index_t l_x, const std::uint8_t* m);

    std::string name() const { return rule_->name(); }  // "bidirectional", "unidirectional", "explicit", …
    bool allows(index_t t_z, index_t t_x, index_t b = 0) const { return rule_->allows(b, t_z, t_x); }
    bool allows_head(index_t t_z, index_t t_x, index_t b, index_t h) const { return rule_->allows_head(b, h, t_z, t_x); }
    KeyRange keys(index_t b, index_t t_x, index_t l_z) const { return rule_->keys(b, t_x, l_z); }
    // ValueError unless the mask fits every sequence of the batch (ℓ_z of sz, ℓ_x of sx; see MaskRule::check)
    void check(const Seqs& sz, const Seqs& sx, index_t q0 = 0, bool exact = false) const;
    void check(index_t l_z, index_t l_x, index_t q0 = 0, bool exact = false) const;
    // explicit masks: their shape; others (0, 0)
    index_t l_z() const { return rule_->shape().first; }
    index_t l_x() const { return rule_->shape().second; }
    // Mask as a column-major [l_z, l_x] 0/1 matrix for sequence b (default: the explicit mask's own shape)
    std::vector<std::uint8_t> matrix(index_t l_z = -1, index_t l_x = -1, index_t b = 0) const;
    const MaskRule& rule() const { return *rule_; }
    index_t window() const { return rule_->window(); }
    CacheKeep cache_keep() const { return rule_->cache_keep(); }

private:
    std::shared_ptr<const MaskRule> rule_;
};

// Explicit bool masks as the free functions ft.bidirectional_mask / ft.unidirectional_mask return them.
std::vector<std::uint8_t> bidirectional_mask(index_t l_z, index_t l_x);
std::vector<std::uint8_t> unidirectional_mask(index_t l_z, index_t l_x);

}  // namespace ft
