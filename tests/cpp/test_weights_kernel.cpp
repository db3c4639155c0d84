// WeightsKernel (weights_kernel.hpp), the shape of the head kernels that form the weights A: a kernel written as
// its map alone (weights_of, scores_gradient) gets lines 4, 5, 6's product and their backward from the base.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "formal_transformers/weights_kernel.hpp"
#include "testing.hpp"

namespace {
using namespace ft;

// line 6 as the listing's softmax: the base around it must give attention_head's numbers to the bit
template <class T>
class SoftmaxMap final : public WeightsKernel<T> {
public:
    const char* name() const override { return "softmax-map"; }
    void weights_of(T* s, index_t n, index_t) const override { softmax_column(s, n); }
    void scores_gradient(CMatView<T>, CMatView<T>, const HeadBlock<T>&, CMatView<T> A, MatView<T> dA) const override {
        softmax_columns_backward<T>(A, dA);
    }
};

// a map no kernel has, A = exp(S) unnormalised (masked: exp(−∞) = 0), dS = A ⊙ dA: checked by central differences
class ExpMap final : public WeightsKernel<double> {
public:
    const char* name() const override { return "exp-map"; }
    void weights_of(double* s, index_t n, index_t) const override {
        for (index_t i = 0; i < n; ++i) s[i] = std::exp(s[i]);
    }
    void scores_gradient(CMatView<double>, CMatView<double>, const HeadBlock<double>&, CMatView<double> A,
                         MatView<double> dA) const override {
        for (index_t j = 0; j < A.cols; ++j)
            for (index_t i = 0; i < A.rows; ++i) dA(i, j) *= A(i, j);
    }
};

struct Block {
    index_t d = 3, d_v = 2, l = 5;
    Mask mask = Mask::unidirectional();
    HeadBlock<double> blk;
    MHAttentionCache<double> c;
    MHAttentionWork<double> w;
    Block() {
        blk.mask = &mask;
        c.A_off = {0, l * l};
    }
    // Y = the kernel's lines 4–6 on Q, K, V
    std::vector<double> forward(const HeadKernel<double>& k, const std::vector<double>& Q, const std::vector<double>& K,
                                const std::vector<double>& V) {
        std::vector<double> Y(std::size_t(d_v * l));
        k.begin(c, 1, l);
        k.forward(CMatView<double>(Q.data(), d, l), CMatView<double>(K.data(), d, l), CMatView<double>(V.data(), d_v, l),
                  blk, c, MatView<double>(Y.data(), d_v, l));
        return Y;
    }
};

TEST(HeadKernelWeightsShape, SoftmaxMapIsTheListingToTheBit) {
    Block t;
    Rng rng(5);
    const auto Q = fttest::randn(t.d * t.l, rng), K = fttest::randn(t.d * t.l, rng), V = fttest::randn(t.d_v * t.l, rng),
               dY = fttest::randn(t.d_v * t.l, rng);
    const SoftmaxMap<double> k;
    const auto Y = t.forward(k, Q, K, V);
    const index_t d = t.d, d_v = t.d_v, l = t.l;
    std::vector<double> A(std::size_t(l * l)), Yl(Y.size()), dA(A.size());
    attention_head<double>(CMatView<double>(Q.data(), d, l), CMatView<double>(K.data(), d, l),
                           CMatView<double>(V.data(), d_v, l), t.blk, MatView<double>(A.data(), l, l),
                           MatView<double>(Yl.data(), d_v, l));
    EXPECT_EQ(Y, Yl);
    EXPECT_EQ(t.c.A, A);
    std::vector<double> dQ(Q.size()), dK(K.size()), dV(V.size()), dQl(Q.size()), dKl(K.size()), dVl(V.size());
    k.begin_backward(t.c, t.w);
    k.backward(CMatView<double>(Q.data(), d, l), CMatView<double>(K.data(), d, l), CMatView<double>(V.data(), d_v, l),
               CMatView<double>(Y.data(), d_v, l), CMatView<double>(dY.data(), d_v, l), t.blk, t.c, t.w,
               MatView<double>(dQ.data(), d, l), MatView<double>(dK.data(), d, l), MatView<double>(dV.data(), d_v, l));
    attention_head_backward<double>(CMatView<double>(Q.data(), d, l), CMatView<double>(K.data(), d, l),
                                    CMatView<double>(V.data(), d_v, l), CMatView<double>(A.data(), l, l),
                                    CMatView<double>(dY.data(), d_v, l), MatView<double>(dQl.data(), d, l),
                                    MatView<double>(dKl.data(), d, l), MatView<double>(dVl.data(), d_v, l),
                                    MatView<double>(dA.data(), l, l));
    EXPECT_EQ(dQ, dQl);
    EXPECT_EQ(dK, dKl);
    EXPECT_EQ(dV, dVl);
    EXPECT_EQ(t.w.dA, dA);  // dS, what a score bias's gradient is taken from
}

TEST(HeadKernelWeightsShape, NewMapGetsItsBackwardFromTheBase) {
    Block t;
    Rng rng(7);
    auto Q = fttest::randn(t.d * t.l, rng, 0.5), K = fttest::randn(t.d * t.l, rng, 0.5),
         V = fttest::randn(t.d_v * t.l, rng), W = fttest::randn(t.d_v * t.l, rng);
    const ExpMap k;
    const index_t d = t.d, d_v = t.d_v, l = t.l;
    const auto Y = t.forward(k, Q, K, V);
    // the forward itself: Y = V exp(Kᵀ Q/√d) with the masked (t_z > t_x) weights 0
    for (index_t tx = 0; tx < l; ++tx)
        for (index_t r = 0; r < d_v; ++r) {
            double y = 0;
            for (index_t tz = 0; tz <= tx; ++tz) {
                double s = 0;
                for (index_t i = 0; i < d; ++i) s += K[std::size_t(i + tz * d)] * Q[std::size_t(i + tx * d)];
                y += V[std::size_t(r + tz * d_v)] * std::exp(s / std::sqrt(double(d)));
            }
            EXPECT_NEAR(Y[std::size_t(r + tx * d_v)], y, 1e-12 * (1 + std::abs(y)));
        }
    std::vector<double> dQ(Q.size()), dK(K.size()), dV(V.size());
    k.begin_backward(t.c, t.w);
    k.backward(CMatView<double>(Q.data(), d, l), CMatView<double>(K.data(), d, l), CMatView<double>(V.data(), d_v, l),
               CMatView<double>(Y.data(), d_v, l), CMatView<double>(W.data(), d_v, l), t.blk, t.c, t.w,
               MatView<double>(dQ.data(), d, l), MatView<double>(dK.data(), d, l), MatView<double>(dV.data(), d_v, l));
    auto loss = [&] { return fttest::dot(t.forward(k, Q, K, V).data(), W.data(), d_v * l); };
    EXPECT_LE(fttest::rel_error(dQ.data(), fttest::numeric_grad(Q.data(), d * l, loss).data(), Q.size()), 1e-7);
    EXPECT_LE(fttest::rel_error(dK.data(), fttest::numeric_grad(K.data(), d * l, loss).data(), K.size()), 1e-7);
    EXPECT_LE(fttest::rel_error(dV.data(), fttest::numeric_grad(V.data(), d_v * l, loss).data(), V.size()), 1e-7);
}
}  // namespace
