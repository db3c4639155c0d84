// BigBird's block-sparse layout as a mask part (docs/variants.md V17; Zaheer et al. 2020, "Big Bird", §2 and
// Appendix D): Algorithm V17a (block_sparse.hpp) for the sequence's n = ℓ/b blocks, and
//
// Mask[t_z, t_x] = [[⌊t_z/b⌋ ∈ 𝓛[⌊t_x/b⌋]]]
//
// so Algorithm 4 with this mask (attention_impl='literal') is the dense definition of what the block-sparse
// kernel (variants/block_sparse.cpp) computes, for a layout without repeated blocks (a given multiset layout is
// the kernel's only: allows() is its support, the multiplicities are in the kernel's softmax; block_sparse.hpp). Bidirectional, self-attention only (ℓ_z = ℓ_x, no cache). The
// layouts of each n (one per query head, or one for all) are drawn once and kept, or given by
// set_bigbird_layouts (the rule is shared and otherwise immutable; spec.per_head = false: head 0's draw for every
// head, bigbird_draw='per_layer'). A model's layouts are checked and installed layer by layer by
// set_bigbird_layouts(model, …) (check_bigbird_layouts: the one place of those checks). Made by
// make_mask("bigbird", o) from the options below (o.options; o.values["heads"]) (registry.cpp), or by
// make_bigbird_mask(spec) with the attention's name (models: every layer its own draw).
//
// The options (block_size, window_blocks, n_global_blocks, n_random_blocks, layout_seed, bigbird_draw) are the
// row of the head kernel 'bigbird' (bigbird_kernel_row below; the kernel is variants/block_sparse.cpp): BigBird is
// a mask and a kernel chosen together by attention='bigbird', and the kernel is the part a config chooses (an
// encoder's mask has no selector of its own); the layout's options are read into the mask, which the kernel reads
// its layouts from. One check of them, check_bigbird, for resolve (the row) and for the factories
// (make_bigbird_mask, bigbird_layout: check_bigbird_spec, its part that needs no model).
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <set>

#include "formal_transformers/block_sparse.hpp"
#include "formal_transformers/config.hpp"
#include "formal_transformers/parts.hpp"
#include "formal_transformers/sizes.hpp"
#include "formal_transformers/transformers.hpp"

namespace ft {

namespace {

// The layouts of one sequence length: one per query head (or one, shared by every head)
using HeadLayouts = std::vector<std::shared_ptr<const BlockLayout>>;

class BigBirdMask final : public MaskRule {
public:
    explicit BigBirdMask(BigBirdSpec s) : s_(std::move(s)) {}
    std::string name() const override { return "bigbird"; }
    // head 0's mask (a caller that names no head: Mask::matrix); Algorithm 4 of head h asks allows_head
    bool allows(index_t b, index_t t_z, index_t t_x) const override { return allows_head(b, 0, t_z, t_x); }
    bool allows_head(index_t b, index_t h, index_t t_z, index_t t_x) const override {
        // the layouts of sequence b, recorded by check() (which runs before every forward) for its length
        const BlockLayout& L = of_head(*of_seq(b), h);
        const index_t i = t_x / s_.block, j = t_z / s_.block;
        if (i >= L.n || j >= L.n) return false;
        const index_t* k = L.of(i);
        return std::binary_search(k, k + L.count(i), j);
    }
    void check(index_t b, index_t l_z, index_t l_x, index_t q0, bool) const override {
        if (q0 != 0)
            throw ValueError("bigbird mask: no cached decoding (the layout is drawn for the whole sequence; queries "
                             "from position " + std::to_string(q0) + ")");
        if (l_z != l_x)
            throw ValueError("bigbird mask: self-attention only (" + std::to_string(l_z) + " keys for " +
                             std::to_string(l_x) + " queries)");
        check_bigbird_length(s_, l_z);
        const auto L = layouts(l_z / s_.block);
        std::lock_guard<std::mutex> g(m_);
        if (index_t(seq_.size()) <= b) seq_.resize(std::size_t(b + 1));
        seq_[std::size_t(b)] = L;
    }
    const BigBirdSpec& spec() const { return s_; }
    // every head's layout for n blocks: given (install), else drawn once (V17a, head by head; per_head = false:
    // head 0's, one for every head) and kept
    std::shared_ptr<const HeadLayouts> layouts(index_t n) const {
        std::lock_guard<std::mutex> g(m_);
        auto& p = cache_[n];
        if (!p) {
            HeadLayouts hl;
            for (index_t h = 0; h < (s_.per_head ? std::max<index_t>(s_.heads, 1) : 1); ++h)
                hl.push_back(std::make_shared<const BlockLayout>(bigbird_layout(s_, n, h)));
            p = std::make_shared<const HeadLayouts>(std::move(hl));
        }
        return p;
    }
    void install(index_t n, std::shared_ptr<const HeadLayouts> hl) const {
        std::lock_guard<std::mutex> g(m_);
        cache_[n] = std::move(hl);
        given_.insert(n);
    }
    // the given layouts (install), for each n
    std::map<index_t, std::vector<BlockLayout>> given() const {
        std::lock_guard<std::mutex> g(m_);
        std::map<index_t, std::vector<BlockLayout>> r;
        for (const index_t n : given_)
            for (const auto& L : *cache_.at(n)) r[n].push_back(*L);
        return r;
    }
    static const BlockLayout& of_head(const HeadLayouts& hl, index_t h) {
        FT_CHECK(hl.size() == 1 || (h >= 0 && h < index_t(hl.size())),
                 "bigbird mask: no layout of head " + std::to_string(h));
        return *hl[hl.size() == 1 ? 0 : std::size_t(h)];
    }

private:
    // read without the lock: check() writes seq_ before the heads run (one forward at a time per attention)
    std::shared_ptr<const HeadLayouts> of_seq(index_t b) const {
        FT_CHECK(b < index_t(seq_.size()) && seq_[std::size_t(b)], "bigbird mask: sequence not checked before use");
        return seq_[std::size_t(b)];
    }
    BigBirdSpec s_;
    mutable std::mutex m_;
    mutable std::map<index_t, std::shared_ptr<const HeadLayouts>> cache_;
    mutable std::set<index_t> given_;  // the n whose layouts were given, not drawn
    mutable std::vector<std::shared_ptr<const HeadLayouts>> seq_;  // the layouts of each sequence of the last batch
};
}  // namespace

void check_bigbird_spec(const BigBirdSpec& s) {
    if (s.block < 1) throw ValueError("block_size = " + std::to_string(s.block) + " must be >= 1 (tokens per block)");
    if (s.window < 1 || s.window % 2 == 0)
        throw ValueError("window_blocks = " + std::to_string(s.window) +
                         " must be odd and >= 1 (the sliding key blocks centred on the query block; BigBird: 3)");
    if (s.global < 0) throw ValueError("n_global_blocks = " + std::to_string(s.global) + " must be >= 0");
    if (s.random < 0) throw ValueError("n_random_blocks = " + std::to_string(s.random) + " must be >= 0");
    // the shortest sequence, (2g + w + r)·b tokens, must be a 64-bit count (else the sums below wrap)
    using u128 = unsigned __int128;
    if ((2 * u128(s.global) + u128(s.window) + u128(s.random)) * u128(s.block) > u128(std::numeric_limits<index_t>::max()))
        throw ValueError("bigbird: (2·n_global_blocks + window_blocks + n_random_blocks)·block_size = (2·" +
                         std::to_string(s.global) + " + " + std::to_string(s.window) + " + " + std::to_string(s.random) +
                         ")·" + std::to_string(s.block) + " tokens does not fit a 64-bit count");
}

void check_bigbird_length(const BigBirdSpec& s, index_t l) {
    if (l % s.block != 0)
        throw ValueError("bigbird: block_size = " + std::to_string(s.block) + " does not divide the sequence length " +
                         std::to_string(l) + " (pad the sequences to a multiple of block_size)");
    const index_t n = l / s.block, need = 2 * s.global + s.window + s.random;
    if (n < need)
        throw ValueError("bigbird: " + std::to_string(n) + " blocks of " + std::to_string(s.block) +
                         " tokens are too few for the layout: 2·n_global_blocks + window_blocks + n_random_blocks = " +
                         std::to_string(need) + " blocks at least");
}

// ===================================== Algorithm V17a ==================================================
BlockLayout bigbird_layout(const BigBirdSpec& s, index_t n, index_t h) {
    check_bigbird_spec(s);
    if (h < 0) throw ValueError("bigbird layout: head " + std::to_string(h) + " must be >= 0");
    if (n < 2 * s.global + s.window + s.random) check_bigbird_length(s, n * s.block);
    checked_elements({n, n}, 1, "bigbird layout (n_blocks × n_blocks)");  // the O(n²) scan below, and the dense (n, n) view
    BlockLayout L;
    L.block = s.block, L.n = n;
    L.start.push_back(0);
    const index_t half = (s.window - 1) / 2;
    const std::uint64_t base = named_seed(s.seed, s.name);
    std::vector<char> in(static_cast<std::size_t>(n), 0);
    std::vector<index_t> cand;
    for (index_t i = 0; i < n; ++i) {  // line 1
        if (i < s.global || i >= n - s.global) {  // line 2: a global query block
            for (index_t j = 0; j < n; ++j) L.keys.push_back(j);
            L.start.push_back(index_t(L.keys.size()));
            continue;
        }
        std::fill(in.begin(), in.end(), 0);
        for (index_t j = std::max<index_t>(0, i - half); j <= std::min(n - 1, i + half); ++j) in[std::size_t(j)] = 1;  // line 4
        for (index_t j = 0; j < n; ++j)
            if (j < s.global || j >= n - s.global) in[std::size_t(j)] = 1;  // line 5
        cand.clear();
        for (index_t j = 0; j < n; ++j)
            if (!in[std::size_t(j)]) cand.push_back(j);
        // line 6: r distinct draws (a partial Fisher–Yates shuffle), from the seed, the name, n, i and the head h
        Rng rng(splitmix64(base ^ splitmix64(std::uint64_t(n) * 0x100000001ULL + std::uint64_t(i)) ^
                           (std::uint64_t(h) * 0x9E3779B97F4A7C15ULL)));
        for (index_t k = 0; k < s.random; ++k) {
            const index_t pick = k + index_t(rng.below(std::uint64_t(index_t(cand.size()) - k)));
            std::swap(cand[std::size_t(k)], cand[std::size_t(pick)]);
            in[std::size_t(cand[std::size_t(k)])] = 1;
        }
        for (index_t j = 0; j < n; ++j)  // line 7: 𝓦 ∪ 𝓖 ∪ 𝓡, ascending
            if (in[std::size_t(j)]) L.keys.push_back(j);
        L.start.push_back(index_t(L.keys.size()));
    }
    return L;
}

BlockLayout explicit_layout(index_t block, const std::vector<std::vector<index_t>>& keys) {
    BlockLayout L;
    L.block = block, L.n = index_t(keys.size());
    L.start.push_back(0);
    for (const auto& k : keys) {
        L.keys.insert(L.keys.end(), k.begin(), k.end());
        std::sort(L.keys.end() - std::ptrdiff_t(k.size()), L.keys.end());  // a repeated block stays repeated (V17b's note)
        L.start.push_back(index_t(L.keys.size()));
    }
    check_block_layout(L);
    return L;
}

Mask make_bigbird_mask(const BigBirdSpec& s) {
    check_bigbird_spec(s);
    return Mask(std::make_shared<BigBirdMask>(s));
}

const BigBirdSpec* bigbird_spec(const Mask& m) {
    const auto* r = dynamic_cast<const BigBirdMask*>(&m.rule());
    return r ? &r->spec() : nullptr;
}

std::shared_ptr<const BlockLayout> bigbird_mask_layout(const Mask& m, index_t n, index_t h) {
    const auto* r = dynamic_cast<const BigBirdMask*>(&m.rule());
    FT_CHECK(r != nullptr, "bigbird_mask_layout: not a bigbird mask");
    const auto hl = r->layouts(n);
    const BlockLayout& L = BigBirdMask::of_head(*hl, h);
    return std::shared_ptr<const BlockLayout>(hl, &L);  // shares the ownership of the head's list
}

void check_block_layout(const BlockLayout& L) {
    if (L.block < 1) throw ValueError("block layout: block_size = " + std::to_string(L.block) + " must be >= 1");
    if (L.n < 1) throw ValueError("block layout: no query blocks");
    checked_count({L.n, L.block}, "block layout: n·block_size tokens");  // ℓ = n·b, a 64-bit count
    if (index_t(L.start.size()) != L.n + 1 || L.start.front() != 0 || L.start.back() != index_t(L.keys.size()))
        throw ValueError("block layout: start must hold n + 1 = " + std::to_string(L.n + 1) + " offsets from 0 to the " +
                         std::to_string(L.keys.size()) + " keys");
    for (index_t i = 0; i < L.n; ++i)  // every offset within the keys, before any is read
        if (L.start[std::size_t(i + 1)] < L.start[std::size_t(i)])
            throw ValueError("block layout: the offsets of query block " + std::to_string(i) + " decrease");
    for (index_t i = 0; i < L.n; ++i) {
        if (L.count(i) == 0) throw ValueError("block layout: query block " + std::to_string(i) + " has no key blocks");
        const index_t* k = L.of(i);
        for (index_t a = 0; a < L.count(i); ++a) {
            if (k[a] < 0 || k[a] >= L.n)
                throw ValueError("block layout: query block " + std::to_string(i) + " names a key block outside [0, " +
                                 std::to_string(L.n) + ")");
            if (a > 0 && k[a] < k[a - 1])
                throw ValueError("block layout: the key blocks of query block " + std::to_string(i) + " are not ascending");
        }
    }
}

namespace {
// The checks of one layer's (or one mask's) layouts: `heads` the query heads, `multiset` whether a key block may
// repeat (V17b runs: attention_impl 'auto'); `at(h)` names layout h in a message.
template <class At>
void check_head_layouts(const std::vector<BlockLayout>& layouts, index_t heads, index_t block, bool multiset, At at) {
    const index_t count = index_t(layouts.size());
    if (count != 1 && count != heads)
        throw ValueError(at(-1) + std::to_string(count) + " layouts for " + std::to_string(heads) +
                         " heads (give one per head, or one for every head)");
    const index_t n = layouts[0].n;
    for (index_t h = 0; h < count; ++h) {
        const BlockLayout& L = layouts[std::size_t(h)];
        try {
            check_block_layout(L);
        } catch (const ValueError& e) {
            throw ValueError(at(count == 1 ? -1 : h) + e.what());
        }
        if (L.block != block)
            throw ValueError(at(count == 1 ? -1 : h) + "blocks of " + std::to_string(L.block) +
                             " tokens, the attention's block_size is " + std::to_string(block));
        if (L.n != n)
            throw ValueError(at(h) + std::to_string(L.n) + " blocks, head 0 " + std::to_string(n) +
                             " (one sequence length at a time)");
        if (!multiset && L.repeats())
            throw ValueError(at(count == 1 ? -1 : h) + "a key block repeated (multiplicity ≥ 2) is the block-sparse "
                             "kernel's only (attention_impl='auto'): Algorithm 4's 0/1 mask cannot weight it");
    }
}
}  // namespace

void set_bigbird_layouts(const Mask& m, std::vector<BlockLayout> layouts, bool multiset) {
    const auto* r = dynamic_cast<const BigBirdMask*>(&m.rule());
    if (!r)
        throw ValueError("bigbird layouts: the attention's mask is '" + m.name() + "', not BigBird's (attention='bigbird')");
    if (layouts.empty()) throw ValueError("bigbird layouts: no layouts (give one per head, or one for every head)");
    const BigBirdSpec& s = r->spec();
    check_head_layouts(layouts, std::max<index_t>(s.heads, 1), s.block, multiset, [](index_t h) {
        return std::string("bigbird layouts") + (h >= 0 ? "[head " + std::to_string(h) + "]" : std::string()) + ": ";
    });
    const index_t n = layouts[0].n;
    HeadLayouts hl;
    for (auto& L : layouts) hl.push_back(std::make_shared<const BlockLayout>(std::move(L)));
    r->install(n, std::make_shared<const HeadLayouts>(std::move(hl)));
}

std::map<index_t, std::vector<BlockLayout>> given_bigbird_layouts(const Mask& m) {
    const auto* r = dynamic_cast<const BigBirdMask*>(&m.rule());
    if (!r) throw ValueError("bigbird layouts: the attention's mask is '" + m.name() + "', not BigBird's");
    return r->given();
}

void check_bigbird_layouts(const ModelConfig& c, const std::vector<std::vector<BlockLayout>>& layouts) {
    if (!head_kernel_has(c.attention, HeadKernelProperty::BlockLayouts)) throw ValueError("bigbird layouts: the model's attention is not 'bigbird'");
    const std::string shape = "(the shape (L, H, n, n) = (" + std::to_string(c.L) + ", " + std::to_string(c.H) +
                              ", n, n), or (L, n, n): one per layer for all its heads)";
    if (index_t(layouts.size()) != c.L)
        throw ValueError("bigbird layouts: " + std::to_string(layouts.size()) + " layers for L = " + std::to_string(c.L) +
                         " " + shape);
    for (index_t l = 0; l < c.L; ++l) {
        const auto& layer = layouts[std::size_t(l)];
        if (layer.empty() || (index_t(layer.size()) != 1 && index_t(layer.size()) != c.H))
            throw ValueError("bigbird layouts[" + std::to_string(l) + "]: " + std::to_string(layer.size()) + " layouts for H = " +
                             std::to_string(c.H) + " heads " + shape);
        const index_t n = layer[0].n;
        if (n != layouts[0][0].n)
            throw ValueError("bigbird layouts[" + std::to_string(l) + "]: " + std::to_string(n) + " blocks, layer 0 " +
                             std::to_string(layouts[0][0].n) + " (one sequence length at a time)");
        check_head_layouts(layer, c.H, c.part_options.integer("block_size"), c.attention_impl == AttnImpl::Auto, [&](index_t h) {
            return "bigbird layouts[" + std::to_string(l) + (h >= 0 ? ", " + std::to_string(h) : std::string()) + "]: ";
        });
    }
    const index_t n = layouts[0][0].n, b = c.part_options.integer("block_size");
    if (checked_mul(n, b, "bigbird layouts: n·block_size") > c.l_max)
        throw ValueError("bigbird layouts: n·block_size = " + std::to_string(n) + "·" + std::to_string(b) +
                         " tokens exceed l_max = " + std::to_string(c.l_max));
}

template <class T>
void set_bigbird_layouts(ETransformer<T>& model, std::vector<std::vector<BlockLayout>> layouts) {
    const ModelConfig& c = model.cfg;
    check_bigbird_layouts(c, layouts);  // every layer, before any is installed
    for (index_t l = 0; l < c.L; ++l)
        set_bigbird_layouts(model.layer[std::size_t(l)]->attn.mask, std::move(layouts[std::size_t(l)]),
                            c.attention_impl == AttnImpl::Auto);
}

template <class T>
std::map<index_t, std::vector<std::vector<BlockLayout>>> given_bigbird_layouts(const ETransformer<T>& model) {
    std::map<index_t, std::vector<std::vector<BlockLayout>>> r;
    if (!head_kernel_has(model.cfg.attention, HeadKernelProperty::BlockLayouts)) return r;
    for (index_t l = 0; l < model.cfg.L; ++l)
        for (auto& [n, hl] : given_bigbird_layouts(model.layer[std::size_t(l)]->attn.mask)) {
            auto& layers = r[n];
            layers.resize(std::size_t(model.cfg.L));
            layers[std::size_t(l)] = std::move(hl);
        }
    // a layer given none at a length some other layer was given (a mask's own set_bigbird_layouts, above): the
    // layouts it uses there, its draws, so that the model's layouts at that length are complete (ft::save)
    for (auto& [n, layers] : r)
        for (index_t l = 0; l < model.cfg.L; ++l) {
            auto& heads = layers[std::size_t(l)];
            if (!heads.empty()) continue;
            const Mask& mask = model.layer[std::size_t(l)]->attn.mask;
            for (index_t h = 0; h < std::max<index_t>(model.cfg.H, 1); ++h) {
                try {
                    heads.push_back(*bigbird_mask_layout(mask, n, h));
                } catch (const ValueError& e) {
                    throw ValueError("bigbird layouts: layer " + std::to_string(l) + " was given none for " +
                                     std::to_string(n) + " blocks, where other layers were, and has no draw there (" +
                                     e.what() + "): give every layer's");
                }
            }
        }
    return r;
}

template void set_bigbird_layouts(ETransformer<float>&, std::vector<std::vector<BlockLayout>>);
template void set_bigbird_layouts(ETransformer<double>&, std::vector<std::vector<BlockLayout>>);
template std::map<index_t, std::vector<std::vector<BlockLayout>>> given_bigbird_layouts(const ETransformer<float>&);
template std::map<index_t, std::vector<std::vector<BlockLayout>>> given_bigbird_layouts(const ETransformer<double>&);

// ===================================== the options ===================================================
BigBirdSpec bigbird_spec_of(const PartOptionValues& o, const std::string& name, index_t heads) {
    BigBirdSpec s;
    s.block = o.integer("block_size"), s.window = o.integer("window_blocks"), s.global = o.integer("n_global_blocks");
    s.random = o.integer("n_random_blocks"), s.seed = o.seed("layout_seed"), s.name = name, s.heads = heads;
    s.per_head = o.choice("bigbird_draw") == "per_head";  // each query head its own draw, or head 0's for all
    return s;
}

namespace {
// The row's check: its options (block_size given; then check_bigbird_spec) and, given a model's config, what V17
// needs of it: an ETransformer, no score bias, and a sequence of at most l_max tokens with enough blocks.
void check_bigbird(const PartOptionValues& own, const ModelConfig* c) {
    const BigBirdSpec s = bigbird_spec_of(own);
    if (c && c->arch != Arch::E)
        throw ValueError("attention='bigbird' is BigBird's bidirectional block layout: an ETransformer option");
    if (s.block == 0) throw ValueError("attention='bigbird' needs block_size (the tokens per block)");
    if (c) {
        if (s.window % 2 == 0)
            throw ValueError("window_blocks = " + std::to_string(s.window) +
                             " must be odd and >= 1 (the sliding key blocks centred on the query block; BigBird: 3)");
        if (position_has(c->positional, PositionProperty::ScoreBias))
            throw ValueError("attention='bigbird' adds no score bias: use positional='learned', 'sinusoidal' or 'rope'");
        // a sequence needs at least 2g + w + r blocks of block_size tokens: refuse a layout no input can meet
        using u128 = unsigned __int128;
        const u128 shortest = (2 * u128(s.global) + u128(s.window) + u128(s.random)) * u128(s.block);
        const bool table = !position_has(c->positional, PositionProperty::PastLMax);  // (RoPE: no l_max bound)
        if (shortest > u128(std::numeric_limits<index_t>::max()) || (table && shortest > u128(c->l_max)))
            throw ValueError("attention='bigbird': the shortest sequence the layout takes, (2·n_global_blocks + window_blocks + "
                             "n_random_blocks)·block_size = (2·" + std::to_string(s.global) + " + " +
                             std::to_string(s.window) + " + " + std::to_string(s.random) + ")·" +
                             std::to_string(s.block) + " tokens, is longer than l_max = " + std::to_string(c->l_max));
    }
    check_bigbird_spec(s);
}
}  // namespace

// The row of the head kernel 'bigbird' (registry.cpp): attention='bigbird' chooses it (and with it this mask)
const PartRow& bigbird_kernel_row() {
    static const PartRow row{
        PartKind::HeadKernel,
        "bigbird",
        {{"block_size", archs::E, OptionKind::AutoSize, std::int64_t(0), OptionCheck::None,
          "V17: b, the tokens per block (None: required with attention='bigbird')"},
         {"window_blocks", archs::E, OptionKind::Count, std::int64_t(3), OptionCheck::None,
          "V17: w, the sliding key blocks centred on each query block (odd)"},
         {"n_global_blocks", archs::E, OptionKind::Count, std::int64_t(1), OptionCheck::None,
          "V17: g, the global blocks at each end"},
         {"n_random_blocks", archs::E, OptionKind::Count, std::int64_t(3), OptionCheck::None,
          "V17: r, the random key blocks of each query block"},
         {"layout_seed", archs::E, OptionKind::Seed, std::uint64_t(0), OptionCheck::None,
          "V17: the seed the random blocks are drawn from (with the attention's name)"},
         {"bigbird_draw", archs::E, OptionKind::Enum, std::string("per_head"), OptionCheck::None,
          "V17: 'per_head', each query head draws its own random blocks; 'per_layer', every head head 0's (a saved "
          "BigBird config without it: io.hpp)",
          {"per_head", "per_layer"}}},
        check_bigbird,
        nullptr,
        false};
    return row;
}

// The registry's mask factory: the row's options (o.options), each also given as a number in o.values (a direct
// caller's form; layout_seed exact below 2^53), and the query heads o.values["heads"] (default 1); the row's check.
Mask make_bigbird_mask_from_options(const MaskOptions& o) {
    PartOptionValues own = o.options;
    index_t heads = 1;
    for (const auto& [key, x] : o.values) {
        if (x != std::floor(x) || std::abs(x) > 9007199254740992.0)
            throw ValueError("bigbird mask: " + key + " must be an integer");
        if (key == "heads") {
            if (x < 1) throw ValueError("bigbird mask: heads must be >= 1 (one layout per query head)");
            heads = index_t(x);
        } else if (key == "layout_seed") {
            if (x < 0) throw ValueError("bigbird mask: layout_seed must be >= 0");
            own.set(key, std::uint64_t(x));
        } else if (key == "block_size" || key == "window_blocks" || key == "n_global_blocks" || key == "n_random_blocks") {
            own.set(key, std::int64_t(x));
        } else {
            throw ValueError("bigbird mask: '" + key + "' is not an option of the layout");
        }
    }
    check_bigbird(own, nullptr);
    return make_bigbird_mask(bigbird_spec_of(own, "", heads));
}

}  // namespace ft
