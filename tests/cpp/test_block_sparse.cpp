// Algorithm V17 (block_sparse.hpp): BigBird's layout as a mask part, and the block-sparse kernel against
// Algorithm 4's lines 4–6 with that mask (attention_head: the dense definition), forward and backward, on
// strided views of Q, K, V (as MHAttention passes one head's rows).
#include <cmath>
#include <vector>

#include "formal_transformers/attention.hpp"
#include "formal_transformers/block_sparse.hpp"
#include "formal_transformers/parts.hpp"
#include "formal_transformers/transformers.hpp"
#include "testing.hpp"

using namespace ft;

namespace {
template <class T>
void kernel_equals_dense(index_t n, index_t b, index_t w, index_t g, index_t r, double tol, index_t heads = 1) {
    const index_t d = 5, d_v = 4, l = n * b;
    MaskOptions o;
    o.values = {{"block_size", double(b)}, {"window_blocks", double(w)}, {"n_global_blocks", double(g)},
                {"n_random_blocks", double(r)}, {"layout_seed", 17.0}, {"heads", double(heads)}};
    const Mask mask = make_mask("bigbird", o);
    mask.check(l, l);  // records the layouts of this length (as every forward does)
    for (index_t h = 0; h < heads; ++h) {  // each head its own layout: head h's kernel = head h's dense listing
        const auto L = bigbird_mask_layout(mask, n, h);
        Rng rng(std::uint64_t(n * 31 + b));
        Matrix<T> Qs = fttest::random_matrix<T>(d + 2, l, rng), Ks = fttest::random_matrix<T>(d + 1, l, rng),
                  Vs = fttest::random_matrix<T>(d_v + 3, l, rng), dY = fttest::random_matrix<T>(d_v, l, rng);
        CMatView<T> Q = view(Qs).rows_range(2, d), K = view(Ks).rows_range(1, d), V = view(Vs).rows_range(3, d_v);
        std::vector<T> A(static_cast<std::size_t>(l * l)), dA(A.size()), lse(static_cast<std::size_t>(l));
        auto zeros = [&](index_t rows) {
            Matrix<T> m = Matrix<T>::from_shape({std::size_t(rows), std::size_t(l)});
            m.fill(T(0));
            return m;
        };
        Matrix<T> Y_d = zeros(d_v), Y_s = zeros(d_v), dQ_d = zeros(d), dQ_s = zeros(d), dK_d = zeros(d),
                  dK_s = zeros(d), dV_d = zeros(d_v), dV_s = zeros(d_v);
        HeadBlock<T> blk;
        blk.mask = &mask, blk.h = h;
        attention_head<T>(Q, K, V, blk, MatView<T>(A.data(), l, l), view(Y_d));
        block_sparse_head<T>(*L, Q, K, V, view(Y_s), lse.data());
        EXPECT_LE(fttest::rel_error(Y_s.data(), Y_d.data(), Y_d.size()), tol) << "forward";
        for (index_t tx = 0; tx < l; ++tx)  // the dense weights vanish exactly off the layout
            for (index_t tz = 0; tz < l; ++tz)
                if (!mask.allows_head(tz, tx, 0, h)) EXPECT_EQ(A[std::size_t(tz + tx * l)], T(0));
        attention_head_backward<T>(Q, K, V, CMatView<T>(A.data(), l, l), view(dY), view(dQ_d), view(dK_d), view(dV_d),
                                   MatView<T>(dA.data(), l, l));
        block_sparse_head_backward<T>(*L, Q, K, V, lse.data(), view(dY), view(dQ_s), view(dK_s), view(dV_s));
        EXPECT_LE(fttest::rel_error(dQ_s.data(), dQ_d.data(), dQ_d.size()), tol) << "dQ";
        EXPECT_LE(fttest::rel_error(dK_s.data(), dK_d.data(), dK_d.size()), tol) << "dK";
        EXPECT_LE(fttest::rel_error(dV_s.data(), dV_d.data(), dV_d.size()), tol) << "dV";
    }
    if (heads > 1) {  // the heads' random blocks differ (and head 0 is the draw of one layout for all heads)
        bool differ = false;
        for (index_t h = 1; h < heads; ++h)
            differ |= bigbird_mask_layout(mask, n, h)->keys != bigbird_mask_layout(mask, n, 0)->keys;
        EXPECT_TRUE(differ);
        MaskOptions o1 = o;
        o1.values.erase("heads");
        const Mask one = make_mask("bigbird", o1);
        EXPECT_EQ(bigbird_mask_layout(one, n)->keys, bigbird_mask_layout(mask, n, 0)->keys);
    }
}
}  // namespace

TEST(BlockSparse, EqualsDenseWithTheMaskFloat64) {
    kernel_equals_dense<double>(10, 3, 3, 1, 2, 1e-12, 3);  // one layout per head
    kernel_equals_dense<double>(8, 4, 3, 1, 2, 1e-12);
    kernel_equals_dense<double>(11, 3, 5, 2, 1, 1e-12);
    kernel_equals_dense<double>(6, 7, 1, 0, 3, 1e-12);
}

TEST(BlockSparse, EqualsDenseWithTheMaskFloat32) {
    kernel_equals_dense<float>(8, 4, 3, 1, 2, 1e-5);
    kernel_equals_dense<float>(11, 3, 5, 2, 1, 1e-5);
}

TEST(BlockSparse, LayoutHasWindowGlobalAndRandomBlocks) {
    BigBirdSpec s;
    s.block = 2, s.window = 3, s.global = 1, s.random = 2, s.seed = 5, s.name = "layers.0.attn.";
    const BlockLayout L = bigbird_layout(s, 10);
    ASSERT_EQ(L.n, 10);
    EXPECT_EQ(L.count(0), 10);
    EXPECT_EQ(L.count(9), 10);
    for (index_t i = 2; i < 8; ++i) EXPECT_EQ(L.count(i), 3 + 2 + 2) << i;  // w + 2g + r, disjoint in the middle
    EXPECT_EQ(L.count(1), 4 + 2);                                           // {0, 1, 2} ∪ {9} ∪ 2 random
}

TEST(BlockSparse, BadLengthsAndOptionsAreValueErrors) {
    MaskOptions o;
    o.values = {{"block_size", 4.0}, {"n_random_blocks", 1.0}};
    const Mask mask = make_mask("bigbird", o);
    EXPECT_THROW(mask.check(30, 30), ValueError);  // 4 does not divide 30
    EXPECT_THROW(mask.check(20, 20), ValueError);  // 5 blocks < 2 + 3 + 1
    EXPECT_THROW(mask.check(24, 16), ValueError);  // not self-attention
    EXPECT_NO_THROW(mask.check(24, 24));
    MaskOptions bad = o;
    bad.values["window_blocks"] = 2;
    EXPECT_THROW(make_mask("bigbird", bad), ValueError);
    EXPECT_THROW(make_mask("bigbird", MaskOptions()), ValueError);  // no block_size
}

TEST(BlockSparse, GivenLayoutsPerHeadOrForAllHeads) {
    MaskOptions o;
    o.values = {{"block_size", 2.0}, {"n_random_blocks", 1.0}, {"heads", 3.0}};
    const Mask mask = make_mask("bigbird", o);
    const index_t n = 6;
    auto diag = [&](index_t shift) {  // query block i reads key block (i + shift) mod n
        std::vector<std::vector<index_t>> k(static_cast<std::size_t>(n));
        for (index_t i = 0; i < n; ++i) k[std::size_t(i)] = {(i + shift) % n};
        return explicit_layout(2, k);
    };
    EXPECT_THROW(set_bigbird_layouts(mask, {diag(0), diag(1)}), ValueError);                // 2 layouts, 3 heads
    EXPECT_THROW(set_bigbird_layouts(mask, {explicit_layout(3, {{0}, {1}})}), ValueError);  // another block size
    EXPECT_THROW(set_bigbird_layouts(mask, {diag(0), diag(1), explicit_layout(2, {{0}, {1}})}),
                 ValueError);  // head 2 of 2 blocks, the others of 6
    EXPECT_THROW(set_bigbird_layouts(Mask::bidirectional(), {diag(0)}), ValueError);  // not BigBird's mask
    const auto drawn = bigbird_mask_layout(mask, n, 1)->keys;
    set_bigbird_layouts(mask, {diag(0), diag(1), diag(2)});
    for (index_t h = 0; h < 3; ++h) EXPECT_EQ(bigbird_mask_layout(mask, n, h)->keys, diag(h).keys) << h;
    mask.check(n * 2, n * 2);
    EXPECT_TRUE(mask.allows_head(3 * 2, 1 * 2, 0, 2) && !mask.allows_head(3 * 2, 1 * 2, 0, 1));  // head 2: 1 → 3
    set_bigbird_layouts(mask, {diag(4)});  // one for every head
    for (index_t h = 0; h < 3; ++h) EXPECT_EQ(bigbird_mask_layout(mask, n, h)->keys, diag(4).keys) << h;
    EXPECT_NE(drawn, diag(4).keys);
}

// A model's layouts are checked in the core (check_bigbird_layouts, the one place; the Python binding only converts
// arrays): the shape (L layers, 1 or H per layer), the block size, one n, n·b ≤ l_max, a well-formed layout (a
// query block with no key block, keys out of range or not ascending), a repeated block only where V17b runs
// (attention_impl 'auto'; Algorithm 4's 0/1 mask cannot weigh it) — each a ValueError before any layer changes.
TEST(BlockSparse, ModelLayoutsAreCheckedInTheCoreBeforeAnyIsInstalled) {
    auto config = [](AttnImpl impl) {
        ModelConfig c;
        c.n_vocab = 9, c.l_max = 16, c.L = 2, c.H = 3, c.d_e = 6, c.d_mlp = 4, c.d_f = 4;
        c.attention = "bigbird", c.attention_impl = impl;
        c.part_options.set("block_size", std::int64_t(2)), c.part_options.set("n_random_blocks", std::int64_t(1));
        return resolve(c, Arch::E);
    };
    const index_t n = 8;
    auto diag = [&](index_t shift, index_t rep = 1) {  // query block i reads key block (i + shift) mod n, rep times
        std::vector<std::vector<index_t>> k(static_cast<std::size_t>(n));
        for (index_t i = 0; i < n; ++i) k[std::size_t(i)].assign(std::size_t(rep), (i + shift) % n);
        return explicit_layout(2, k);
    };
    using Layers = std::vector<std::vector<BlockLayout>>;
    const Layers repeated = {{diag(1, 2)}, {diag(2), diag(3), diag(4, 3)}};
    auto keys = [&](const ETransformer<double>& m) {  // every layer's and head's keys for n blocks
        std::vector<std::vector<index_t>> r;
        for (index_t l = 0; l < 2; ++l)
            for (index_t h = 0; h < 3; ++h) r.push_back(bigbird_mask_layout(m.layer[std::size_t(l)]->attn.mask, n, h)->keys);
        return r;
    };
    for (AttnImpl impl : {AttnImpl::Literal, AttnImpl::Tiled}) {
        ETransformer<double> m(config(impl));
        const auto drawn = keys(m);
        try {
            set_bigbird_layouts(m, repeated);
            ADD_FAILURE() << "a repeated key block with a 0/1 mask";
        } catch (const ValueError& e) {
            EXPECT_NE(std::string(e.what()).find("layouts[0]: a key block repeated"), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("attention_impl='auto'"), std::string::npos) << e.what();
        }
        EXPECT_EQ(keys(m), drawn);  // nothing installed, layer 0 neither
        EXPECT_TRUE(given_bigbird_layouts(m).empty());
        // and the mask alone refuses a repeat unless its caller runs V17b
        EXPECT_THROW(set_bigbird_layouts(m.layer[0]->attn.mask, {diag(1, 2)}), ValueError);
        set_bigbird_layouts(m, {{diag(1)}, {diag(2), diag(3), diag(4)}});  // 0/1: a mask
        EXPECT_EQ(keys(m)[4], diag(3).keys);
    }
    ETransformer<double> m(config(AttnImpl::Auto));
    const auto drawn = keys(m);
    auto refused = [&](Layers layers, const char* what) {
        try {
            set_bigbird_layouts(m, std::move(layers));
            ADD_FAILURE() << "accepted: " << what;
        } catch (const ValueError& e) {
            EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
        }
        EXPECT_EQ(keys(m), drawn) << what;
    };
    refused({{diag(0)}}, "1 layers for L = 2 (the shape (L, H, n, n)");
    refused({{diag(0)}, {diag(0), diag(1)}}, "layouts[1]: 2 layouts for H = 3 heads");
    refused({{diag(0)}, {}}, "layouts[1]: 0 layouts");
    refused({{diag(0)}, {explicit_layout(3, {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}})}}, "layouts[1]: blocks of 3 tokens");
    refused({{diag(0)}, {explicit_layout(2, {{0}, {1}, {2}, {3}, {4}, {5}, {6}})}}, "layouts[1]: 7 blocks, layer 0 8");
    std::vector<std::vector<index_t>> long_keys(9, std::vector<index_t>{0});
    refused({{explicit_layout(2, long_keys)}, {explicit_layout(2, long_keys)}}, "exceed l_max = 16");
    BlockLayout empty = diag(0), unsorted = explicit_layout(2, {{0, 1}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}), outside = diag(0);
    empty.keys.erase(empty.keys.begin() + 3), empty.start[3] = empty.start[4] = 3;  // query block 3 reads nothing
    for (std::size_t i = 4; i < empty.start.size(); ++i) empty.start[i] = index_t(i) - 1;
    std::swap(unsorted.keys[0], unsorted.keys[1]);
    outside.keys[5] = n;
    refused({{diag(0)}, {diag(0), diag(1), empty}}, "layouts[1, 2]: block layout: query block 3 has no key blocks");
    refused({{unsorted}, {diag(0)}}, "layouts[0]: block layout: the key blocks of query block 0 are not ascending");
    refused({{diag(0)}, {outside}}, "query block 5 names a key block outside [0, 8)");
    BlockLayout offsets = diag(0);
    offsets.start[1] = 100;  // beyond the keys: refused before any key is read
    refused({{offsets}, {diag(0)}}, "the offsets of query block 1 decrease");
    offsets.start.pop_back();
    refused({{offsets}, {diag(0)}}, "start must hold n + 1 = 9 offsets");
    ModelConfig plain = config(AttnImpl::Auto);
    plain.attention = "softmax", plain.part_options = PartOptionValues();  // (the bigbird options at their defaults)
    ETransformer<double> soft(resolve(plain, Arch::E));
    EXPECT_THROW(set_bigbird_layouts(soft, {{diag(0)}, {diag(0)}}), ValueError);
    // accepted: the repeats (V17b weighs them), as given: one layout for every head of layer 0, one per head of layer 1
    set_bigbird_layouts(m, repeated);
    for (index_t h = 0; h < 3; ++h) EXPECT_EQ(keys(m)[std::size_t(h)], diag(1, 2).keys) << h;
    EXPECT_EQ(keys(m)[5], diag(4, 3).keys);
    const auto given = given_bigbird_layouts(m);
    ASSERT_EQ(given.size(), 1u);
    ASSERT_EQ(given.at(n).size(), 2u);
    EXPECT_EQ(given.at(n)[0].size(), 1u);
    EXPECT_EQ(given.at(n)[1].size(), 3u);
    EXPECT_EQ(given.at(n)[1][2].keys, diag(4, 3).keys);
}

// bigbird_draw='per_layer': every head of a layer uses head 0's draw (the rule before the heads had
// their own); 'per_head': head h draws with h.
TEST(BlockSparse, PerLayerDrawIsHeadZerosForEveryHead) {
    ModelConfig c;
    c.n_vocab = 9, c.l_max = 16, c.L = 2, c.H = 3, c.d_e = 6, c.d_mlp = 4, c.d_f = 4;
    c.attention = "bigbird";
    c.part_options.set("block_size", std::int64_t(2)), c.part_options.set("n_random_blocks", std::int64_t(2));
    ETransformer<double> per_head(resolve(c, Arch::E));
    c.part_options.set("bigbird_draw", std::string("per_layer"));
    ETransformer<double> per_layer(resolve(c, Arch::E));
    const index_t n = 8;
    bool differ = false;
    for (index_t l = 0; l < 2; ++l) {
        BigBirdSpec s;
        s.block = 2, s.random = 2, s.name = "layers." + std::to_string(l) + ".attn.";
        for (index_t h = 0; h < 3; ++h) {
            EXPECT_EQ(bigbird_mask_layout(per_layer.layer[std::size_t(l)]->attn.mask, n, h)->keys, bigbird_layout(s, n, 0).keys);
            EXPECT_EQ(bigbird_mask_layout(per_head.layer[std::size_t(l)]->attn.mask, n, h)->keys, bigbird_layout(s, n, h).keys);
            differ = differ || bigbird_layout(s, n, h).keys != bigbird_layout(s, n, 0).keys;
        }
    }
    EXPECT_TRUE(differ);
}

// A layout that repeats a key block (V17b's multiset note): the kernel's weights are m·exp(s)/Σ m'·exp(s') (here
// by loops, the definition), its output V A, its backward Algorithm 4's backward of those weights (log M is a
// constant of the scores: dS = A ⊙ (dA − 1(1ᵀ(A ⊙ dA))) as for any softmax)
TEST(BlockSparse, RepeatedKeyBlocksWeighOncePerOccurrence) {
    using T = double;
    const index_t n = 5, b = 2, d = 3, d_v = 2, l = n * b;
    const BlockLayout L = explicit_layout(b, {{1, 0, 0}, {1, 3, 1, 1}, {4, 2, 4}, {0, 3}, {4, 0, 4}});
    EXPECT_TRUE(L.repeats());
    EXPECT_EQ(L.count(0), 3);
    EXPECT_EQ(L.of(1)[2], 1);  // sorted, kept: 1, 1, 1, 3
    EXPECT_FALSE(explicit_layout(b, {{0, 1}, {1}}).repeats());
    const index_t m[5][5] = {{2, 0, 0, 1, 1}, {1, 3, 0, 0, 0}, {0, 0, 1, 0, 0}, {0, 1, 0, 1, 0}, {0, 0, 2, 0, 2}};  // m[j][i]
    Rng rng(41);
    Matrix<T> Q = fttest::random_matrix<T>(d, l, rng), K = fttest::random_matrix<T>(d, l, rng),
              V = fttest::random_matrix<T>(d_v, l, rng), dY = fttest::random_matrix<T>(d_v, l, rng);
    std::vector<T> A(std::size_t(l * l), 0.0), Ys(std::size_t(d_v * l)), Yd(Ys.size(), 0.0), lse(static_cast<std::size_t>(l));
    for (index_t tx = 0; tx < l; ++tx) {
        T sum = 0;
        for (index_t tz = 0; tz < l; ++tz) {
            T s = 0;
            for (index_t k = 0; k < d; ++k) s += K(k, tz) * Q(k, tx);
            sum += (A[std::size_t(tz + tx * l)] = T(m[tz / b][tx / b]) * std::exp(s / std::sqrt(T(d))));
        }
        for (index_t tz = 0; tz < l; ++tz) {
            A[std::size_t(tz + tx * l)] /= sum;
            for (index_t k = 0; k < d_v; ++k) Yd[std::size_t(k + tx * d_v)] += V(k, tz) * A[std::size_t(tz + tx * l)];
        }
    }
    std::vector<T> As(A.size());
    block_sparse_weights<T>(L, view(Q), view(K), MatView<T>(As.data(), l, l));
    EXPECT_LE(fttest::rel_error(As.data(), A.data(), A.size()), 1e-13) << "weights";
    block_sparse_head<T>(L, view(Q), view(K), view(V), MatView<T>(Ys.data(), d_v, l), lse.data());
    EXPECT_LE(fttest::rel_error(Ys.data(), Yd.data(), Yd.size()), 1e-13) << "forward";
    auto zeros = [&](index_t rows) {
        Matrix<T> z = Matrix<T>::from_shape({std::size_t(rows), std::size_t(l)});
        z.fill(T(0));
        return z;
    };
    Matrix<T> dQ_d = zeros(d), dQ_s = zeros(d), dK_d = zeros(d), dK_s = zeros(d), dV_d = zeros(d_v), dV_s = zeros(d_v);
    std::vector<T> dA(A.size());
    attention_head_backward<T>(view(Q), view(K), view(V), CMatView<T>(A.data(), l, l), view(dY), view(dQ_d), view(dK_d),
                               view(dV_d), MatView<T>(dA.data(), l, l));
    block_sparse_head_backward<T>(L, view(Q), view(K), view(V), lse.data(), view(dY), view(dQ_s), view(dK_s), view(dV_s));
    EXPECT_LE(fttest::rel_error(dQ_s.data(), dQ_d.data(), dQ_d.size()), 1e-13) << "dQ";
    EXPECT_LE(fttest::rel_error(dK_s.data(), dK_d.data(), dK_d.size()), 1e-13) << "dK";
    EXPECT_LE(fttest::rel_error(dV_s.data(), dV_d.data(), dV_d.size()), 1e-13) << "dV";
}
