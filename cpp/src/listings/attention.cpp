// Algorithms 3, 4, 5: forward and backward side by side.
#include "formal_transformers/attention.hpp"

#include <cmath>
#include <limits>

#include "formal_transformers/bf16_products.hpp"
#include "formal_transformers/blas.hpp"
#include "formal_transformers/affine_set.hpp"
#include "formal_transformers/functions.hpp"
#include "formal_transformers/lora.hpp"
#include "formal_transformers/weights_kernel.hpp"

namespace ft {

// ============================ Algorithm 4, lines 4–6 (one head) =======================================
namespace {
// The offsets of the attention weights in one flat buffer (sequence b, head h: ℓ_z(b)·ℓ_x(b) entries), the
// sums and products checked and the total held against the allocation bound (sizes.hpp): ValueError before
// any of the call's work.
void weight_offsets(const Seqs& sx, const Seqs& sz, index_t H, std::size_t elem, std::vector<index_t>& off) {
    const char* what = "attention weights (l_z * l_x per head and sequence)";
    off.assign(1, 0);
    for (index_t b = 0; b < sx.count(); ++b) {
        const index_t n = checked_mul(sz.len(b), sx.len(b), what);
        for (index_t h = 0; h < H; ++h) off.push_back(checked_add(off.back(), n, what));
    }
    check_bytes(off.back(), elem, what);
}
// line 4: S ← Kᵀ Q, scaled by 1/√d_attn (line 6's scaling, folded into the product)
// (V18, T5: unscaled, S ← Kᵀ Q)
template <class T>
void scores(CMatView<T> Q, CMatView<T> K, MatView<T> S, bool unscaled) {
    gemm<T>(Op::T, Op::N, unscaled ? T(1) : T(1) / std::sqrt(T(Q.rows)), K, Q, T(0), S);
}

// line 5 and the softmax of line 6, on column j of S (query t_x = q0 + j of sequence b, head h): keys outside the
// column's candidate range [begin, end) get probability 0 without being computed; inside, masked entries ← −∞
// (unless the range is dense), then softmax over the range (−∞ gives exactly 0).
template <class T>
void mask_softmax_column(const Mask& mask, index_t b, index_t h, index_t t_x, T* s, index_t l_z) {
    const KeyRange r = candidate_keys(mask, b, t_x, l_z);
    mask_candidates(mask, b, h, t_x, r, s);        // line 5: masked S ← −∞
    softmax_column(s + r.begin, r.end - r.begin);  // line 6: softmax
    std::fill(s, s + r.begin, T(0));
    std::fill(s + r.end, s + l_z, T(0));
}

template <class T>
void mask_softmax(const Mask& mask, index_t b, index_t h, index_t q0, MatView<T> S) {
#pragma omp parallel for schedule(static) if (S.size() > 16384)
    for (index_t j = 0; j < S.cols; ++j) mask_softmax_column(mask, b, h, q0 + j, S.col(j), S.rows);
}

// Run f(b, h) for every (sequence b, head h) block of a batch. The blocks run in parallel, one block per
// thread at a time, each block's products on its thread (a gemm called inside one of our parallel regions
// runs on the calling thread, blas.cpp, so the pools never compete) — unless there are fewer blocks than
// threads and they are large (m·n·k ≥ 4·65536): then they run one after another and gemm splits each
// product over the threads. Blocks write disjoint parts of their outputs. (Nested regions inside f run
// serially: OpenMP's default.)
// Tiny batches (total work under 2^16 multiply-adds) stay serial: a parallel region would cost more.
// With another OpenBLAS build (pthreads: its own pool) gemm must not be called from our threads: serial.
// The tiled listing's blocks (`tiled`) always run in parallel above the tiny size: their products are
// one-thread BLAS calls on tiles (gemm_unsplit), never split over the threads.
template <class F>
void for_blocks(index_t n_seqs, index_t H, index_t work_per_block, F&& f, bool tiled = false) {
    const index_t n = n_seqs * H;
    if (blas_is_openmp() && n > 1 && n * work_per_block >= 65536 &&
        (tiled || work_per_block < 4 * 65536 || n >= index_t(get_num_threads()))) {
        const ProductContext products = product_context();  // the caller's precision, on every thread
#pragma omp parallel for schedule(dynamic)
        for (index_t bh = 0; bh < n; ++bh) {
            ProductScope scope(products);
            f(bh / H, bh % H);
        }
    } else {
        for (index_t bh = 0; bh < n; ++bh) f(bh / H, bh % H);
    }
}
}  // namespace

// lines 4, 5 and line 6's softmax: the weights A of one head
template <class T>
void attention_head_weights(CMatView<T> Q, CMatView<T> K, const HeadBlock<T>& blk, MatView<T> A) {
    scores<T>(Q, K, A, blk.unscaled);  // line 4: S ← Kᵀ Q (and line 6's 1/√d_attn)
    if (blk.bias) blk.bias->add(*blk.store, *blk.mask, blk.b, blk.h, blk.q0, A);  // line 6: S/√d_attn + B^h (e.g. V2)
    mask_softmax<T>(*blk.mask, blk.b, blk.h, blk.q0, A);  // line 5: masked S ← −∞; line 6: A = softmax(S/√d_attn)
}
// line 6: Ṽ ← V A
template <class T>
void attention_mix(CMatView<T> V, CMatView<T> A, MatView<T> Vt) {
    gemm<T>(Op::N, Op::N, T(1), V, A, T(0), Vt);
}

template <class T>
void attention_head(CMatView<T> Q, CMatView<T> K, CMatView<T> V, const HeadBlock<T>& blk, MatView<T> A, MatView<T> Vt) {
    attention_head_weights<T>(Q, K, blk, A);  // lines 4, 5, 6: A = softmax(S/√d_attn), S = Kᵀ Q masked
    attention_mix<T>(V, A, Vt);               // line 6: Ṽ = V A
}

// Backward of line 6's product: dV += dṼ Aᵀ, dA = Vᵀ dṼ
template <class T>
void attention_mix_backward(CMatView<T> V, CMatView<T> A, CMatView<T> dVt, MatView<T> dV, MatView<T> dA) {
    gemm<T>(Op::N, Op::T, T(1), dVt, A, T(1), dV);  // line 6: dV += dṼ Aᵀ
    gemm<T>(Op::T, Op::N, T(1), V, dVt, T(0), dA);  // line 6: dA = Vᵀ dṼ
}
// Backward of lines 6 (the softmax), 5, 4: dA ← dS, dQ, dK
template <class T>
void attention_head_weights_backward(CMatView<T> Q, CMatView<T> K, CMatView<T> A, MatView<T> dA, MatView<T> dQ,
                                     MatView<T> dK, bool unscaled) {
    const T scale = unscaled ? T(1) : T(1) / std::sqrt(T(Q.rows));
    softmax_columns_backward<T>(A, dA);             // line 6: dS = A ⊙ (dA − 1(1ᵀ(A ⊙ dA)));  line 5: A = 0 so dS = 0
    Bf16OperandReuse once;                          // bf16-mixed: dS rounded once for dQ and dK
    gemm<T>(Op::N, Op::N, scale, K, dA, T(1), dQ);  // line 4: dQ += K dS / √d_attn
    gemm<T>(Op::N, Op::T, scale, Q, dA, T(1), dK);  // line 4: dK += Q dSᵀ / √d_attn
}

// Backward of lines 4–6: d(line 6) gives dV and dA; the softmax derivative gives dS; d(line 4) gives dQ, dK.
template <class T>
void attention_head_backward(CMatView<T> Q, CMatView<T> K, CMatView<T> V, CMatView<T> A, CMatView<T> dVt,
                             MatView<T> dQ, MatView<T> dK, MatView<T> dV, MatView<T> dA, bool unscaled) {
    attention_mix_backward<T>(V, A, dVt, dV, dA);                         // line 6: dV += dṼ Aᵀ, dA = Vᵀ dṼ
    attention_head_weights_backward<T>(Q, K, A, dA, dQ, dK, unscaled);  // lines 6, 5, 4: dS, dQ, dK
}

// ===================================== Algorithm 3 ====================================================
template <class T>
BasicAttention<T>::BasicAttention(index_t d_in_, index_t d_attn_, index_t d_out_, ParamStore<T>& store,
                                  const std::string& p)
    : d_in(d_in_), d_attn(d_attn_), d_out(d_out_) {
    if (d_in <= 0 || d_attn <= 0 || d_out <= 0) throw ValueError("BasicAttention: d_in, d_attn, d_out must be positive");
    W_q = store.matrix(p + "W_q", d_attn, d_in);
    b_q = store.vector(p + "b_q", d_attn);
    W_k = store.matrix(p + "W_k", d_attn, d_in);
    b_k = store.vector(p + "b_k", d_attn);
    W_v = store.matrix(p + "W_v", d_out, d_in);
    b_v = store.vector(p + "b_v", d_out);
}

template <class T>
void BasicAttention<T>::init(ParamStore<T>& store, Rng& rng, double stddev) const {
    for (const MatParam* W : {&W_q, &W_k, &W_v}) store.normal(W->offset, W->rows * W->cols, stddev, rng);
    for (const VecParam* b : {&b_q, &b_k, &b_v}) store.fill(b->offset, b->size, T(0));
}

// e:[d_in], E:[d_in,T] -> ṽ:[d_out]
template <class T>
void BasicAttention<T>::forward(const ParamStore<T>& store, const T* e, CMatView<T> E, T* v_tilde,
                                BasicAttentionCache<T>& c) const {
    const index_t Tn = E.cols;
    MatView<T> ec = ensure(c.e, d_in, 1), Ec = ensure(c.E, d_in, Tn);
    std::copy(e, e + d_in, ec.data);
    for (index_t t = 0; t < Tn; ++t) std::copy(E.col(t), E.col(t) + d_in, Ec.col(t));
    MatView<T> q(ensure(c.q, d_attn), d_attn, 1);
    affine<T>(store.W(W_q), ec, store.v(b_q), q);                                  // line 1: q ← W_q e + b_q
    affine<T>(store.W(W_k), Ec, store.v(b_k), ensure(c.K, d_attn, Tn));            // line 2: k_t ← W_k e_t + b_k
    affine<T>(store.W(W_v), Ec, store.v(b_v), ensure(c.V, d_out, Tn));             // line 3: v_t ← W_v e_t + b_v
    // lines 4–5 are Algorithm 4's lines 4–6 with one query and no mask:
    //   α = softmax(Kᵀ q / √d_attn) (line 4), ṽ = Σ_t α_t v_t = V α (line 5)
    const Mask all = Mask::bidirectional();
    HeadBlock<T> blk;
    blk.mask = &all;
    attention_head<T>(q, view(c.K), view(c.V), blk, ensure(c.alpha, Tn, 1), MatView<T>(v_tilde, d_out, 1));
}

template <class T>
void BasicAttention<T>::backward(ParamStore<T>& store, const BasicAttentionCache<T>& c, const T* dv_tilde, T* de,
                                 MatView<T> dE) const {
    const index_t Tn = c.K.shape(1);
    Matrix<T> dq = Matrix<T>::from_shape({std::size_t(d_attn), 1}), dK = Matrix<T>::from_shape({std::size_t(d_attn), std::size_t(Tn)}),
              dV = Matrix<T>::from_shape({std::size_t(d_out), std::size_t(Tn)}), dA = Matrix<T>::from_shape({std::size_t(Tn), 1});
    dq.fill(T(0));
    dK.fill(T(0));
    dV.fill(T(0));
    CMatView<T> q(c.q.data(), d_attn, 1);
    attention_head_backward<T>(q, view(c.K), view(c.V), view(c.alpha), CMatView<T>(dv_tilde, d_out, 1), view(dq),
                               view(dK), view(dV), view(dA));  // lines 4–5
    affine_backward<T>(store.W(W_v), view(c.E), view(dV), store.dW(W_v).data, store.dv(b_v), dE.data, dE.ld);  // line 3
    affine_backward<T>(store.W(W_k), view(c.E), view(dK), store.dW(W_k).data, store.dv(b_k), dE.data, dE.ld);  // line 2
    affine_backward<T>(store.W(W_q), view(c.e), view(dq), store.dW(W_q).data, store.dv(b_q), de);              // line 1
}

// ===================================== Algorithm 4 ====================================================
template <class T>
Attention<T>::Attention(index_t d_x_, index_t d_z_, index_t d_attn_, index_t d_out_, Mask mask_, ParamStore<T>& store,
                        const std::string& p)
    : d_x(d_x_), d_z(d_z_), d_attn(d_attn_), d_out(d_out_), mask(std::move(mask_)) {
    if (d_x <= 0 || d_z <= 0 || d_attn <= 0 || d_out <= 0)
        throw ValueError("Attention: d_x, d_z, d_attn, d_out must be positive");
    W_q = store.matrix(p + "W_q", d_attn, d_x);
    b_q = store.vector(p + "b_q", d_attn);
    W_k = store.matrix(p + "W_k", d_attn, d_z);
    b_k = store.vector(p + "b_k", d_attn);
    W_v = store.matrix(p + "W_v", d_out, d_z);
    b_v = store.vector(p + "b_v", d_out);
}

template <class T>
void Attention<T>::init(ParamStore<T>& store, Rng& rng, double stddev) const {
    for (const MatParam* W : {&W_q, &W_k, &W_v}) store.normal(W->offset, W->rows * W->cols, stddev, rng);
    for (const VecParam* b : {&b_q, &b_k, &b_v}) store.fill(b->offset, b->size, T(0));
}

template <class T>
void Attention<T>::forward(const ParamStore<T>& store, CMatView<T> X, const Seqs& sx, CMatView<T> Z, const Seqs& sz,
                           MatView<T> Vt, AttentionCache<T>& c) const {
    FT_CHECK(sx.count() == sz.count(), "Attention: X and Z batches differ in size");
    mask.check(sz, sx);
    weight_offsets(sx, sz, 1, sizeof(T), c.A_off);  // the weights' size checked before anything is allocated
    MatView<T> Q = ensure(c.Q, d_attn, X.cols), K = ensure(c.K, d_attn, Z.cols), V = ensure(c.V, d_out, Z.cols);
    affine<T>(store.W(W_q), X, store.v(b_q), Q);  // line 1: Q ← W_q X + b_q 1ᵀ
    affine<T>(store.W(W_k), Z, store.v(b_k), K);  // line 2: K ← W_k Z + b_k 1ᵀ
    affine<T>(store.W(W_v), Z, store.v(b_v), V);  // line 3: V ← W_v Z + b_v 1ᵀ
    c.A.resize(std::size_t(c.A_off.back()));
    for (index_t b = 0; b < sx.count(); ++b) {  // lines 4–6, per sequence
        HeadBlock<T> blk;
        blk.mask = &mask, blk.b = b;
        attention_head<T>(Q.cols_range(sx.begin(b), sx.len(b)), K.cols_range(sz.begin(b), sz.len(b)),
                          V.cols_range(sz.begin(b), sz.len(b)), blk,
                          MatView<T>(c.A.data() + c.A_off[std::size_t(b)], sz.len(b), sx.len(b)),
                          Vt.cols_range(sx.begin(b), sx.len(b)));
    }
}

template <class T>
void Attention<T>::backward(ParamStore<T>& store, CMatView<T> X, const Seqs& sx, CMatView<T> Z, const Seqs& sz,
                            AttentionCache<T>& c, CMatView<T> dVt, MatView<T> dX, MatView<T> dZ) const {
    MatView<T> dQ = ensure(c.dQ, d_attn, X.cols), dK = ensure(c.dK, d_attn, Z.cols), dV = ensure(c.dV, d_out, Z.cols);
    std::fill(dQ.data, dQ.data + dQ.size(), T(0));
    std::fill(dK.data, dK.data + dK.size(), T(0));
    std::fill(dV.data, dV.data + dV.size(), T(0));
    for (index_t b = 0; b < sx.count(); ++b) {  // lines 6, 5, 4
        c.dA.resize(std::size_t(sz.len(b) * sx.len(b)));
        attention_head_backward<T>(view(c.Q).cols_range(sx.begin(b), sx.len(b)), view(c.K).cols_range(sz.begin(b), sz.len(b)),
                                   view(c.V).cols_range(sz.begin(b), sz.len(b)),
                                   CMatView<T>(c.A.data() + c.A_off[std::size_t(b)], sz.len(b), sx.len(b)),
                                   dVt.cols_range(sx.begin(b), sx.len(b)), dQ.cols_range(sx.begin(b), sx.len(b)),
                                   dK.cols_range(sz.begin(b), sz.len(b)), dV.cols_range(sz.begin(b), sz.len(b)),
                                   MatView<T>(c.dA.data(), sz.len(b), sx.len(b)));
    }
    affine_backward<T>(store.W(W_v), Z, dV, store.dW(W_v).data, store.dv(b_v), dZ.data, dZ.ld);  // line 3
    affine_backward<T>(store.W(W_k), Z, dK, store.dW(W_k).data, store.dv(b_k), dZ.data, dZ.ld);  // line 2
    affine_backward<T>(store.W(W_q), X, dQ, store.dW(W_q).data, store.dv(b_q), dX.data, dX.ld);  // line 1
}

// ============================ the head kernel "softmax": Algorithm 4's lines 4–6 as printed ==================
namespace {
// Algorithm 4's lines 4–6 as printed on every block, in the shape of every kernel that forms the weights A
// (weights_kernel.hpp: line 4's S ← Kᵀ Q/√d_attn + B^h, line 5's mask, line 6's Ṽ = V A and their backward, A kept);
// what is the listing's own is line 6's softmax. A part acting on the weights (attention dropout) can wrap it.
template <class T>
class SoftmaxKernel final : public WeightsKernel<T> {
public:
    const char* name() const override { return "softmax"; }
    const char* tiled_form() const override { return "tiled"; }
    // line 6: A = softmax(S/√d_attn) over a column's candidate keys (masked: −∞, so weight 0)
    void weights_of(T* s, index_t n, index_t l_z) const override {
        (void)l_z;
        softmax_column(s, n);
    }
    // line 6 backward: dS = A ⊙ (dA − 1(1ᵀ(A ⊙ dA)));  line 5: A = 0 so dS = 0
    void scores_gradient(CMatView<T> Q, CMatView<T> K, const HeadBlock<T>& blk, CMatView<T> A,
                         MatView<T> dA) const override {
        (void)Q, (void)K, (void)blk;
        softmax_columns_backward<T>(A, dA);
    }
};
}  // namespace

// The registry's factory (registry.cpp): the listing has no options to check.
template <class T>
std::shared_ptr<const HeadKernel<T>> make_softmax_kernel(const AttnPartSpec<T>& spec, const std::string& prefix) {
    (void)spec, (void)prefix;
    return std::make_shared<const SoftmaxKernel<T>>();
}
template std::shared_ptr<const HeadKernel<float>> make_softmax_kernel<float>(const AttnPartSpec<float>&, const std::string&);
template std::shared_ptr<const HeadKernel<double>> make_softmax_kernel<double>(const AttnPartSpec<double>&, const std::string&);

// ===================================== Algorithm 5 ====================================================
// The parts, in θ's order: the Q/K/V source's parameters (lines 1–3), W_o, b_o (line 4), the position part's;
// then the head kernel of lines 4–6 and its tiled form. Each part's factory checks its own options.
template <class T>
MHAttention<T>::MHAttention(index_t H_, index_t d_x_, index_t d_z_, index_t d_attn_, index_t d_mid_, index_t d_out_,
                            Mask mask_, ParamStore<T>& store, const std::string& p, const AttnVariant& v)
    : H(H_), d_x(d_x_), d_z(d_z_), d_attn(d_attn_), d_mid(d_mid_), d_out(d_out_), mask(std::move(mask_)), var(v) {
    if (H <= 0 || d_x <= 0 || d_z <= 0 || d_attn <= 0 || d_mid <= 0 || d_out <= 0)
        throw ValueError("MHAttention: H, d_x, d_z, d_attn, d_mid, d_out must be positive");
    H_kv = var.H_kv > 0 ? var.H_kv : H;  // V3: 0 means H (Algorithm 5)
    var.H_kv = H_kv;
    if (H_kv > H || H % H_kv != 0)
        throw ValueError("H_kv = " + std::to_string(H_kv) + " must divide H = " + std::to_string(H) +
                         " (grouped-query attention: groups of H/H_kv query heads share a key/value head)");
    if (var.impl != AttnImpl::Auto && var.impl != AttnImpl::Literal && var.impl != AttnImpl::Tiled)
        throw ValueError("attention_impl must be auto, literal or tiled");
    AttnPartSpec<T> spec;
    spec.H = H, spec.H_kv = H_kv, spec.d_x = d_x, spec.d_z = d_z, spec.d_attn = d_attn, spec.d_mid = d_mid;
    spec.v = var, spec.mask = &mask;
    source = make_qkv_source<T>(qkv_source_name(var), spec, store, p);  // lines 1–3
    if (const auto* pr = dynamic_cast<const Projections<T>*>(source.get()))
        W_q = pr->W_q, W_k = pr->W_k, W_v = pr->W_v, b_q = pr->b_q, b_k = pr->b_k, b_v = pr->b_v;
    W_o = store.matrix(p + "W_o", d_out, H * d_mid);
    if (var.bias) b_o = store.vector(p + "b_o", d_out);
    if (!source->places_positions())  // "none": no part (Algorithm 5)
        position = make_position<T>(var.position, AttnSpec{H, d_attn, var}, store, p);
    spec.position = &position;
    kernel = wrap_head_kernel<T>(make_head_kernel<T>(head_kernel_name(var), spec, p), spec);  // lines 4–6 (and parts around)
    if (*kernel->tiled_form()) tiled = make_head_kernel<T>(kernel->tiled_form(), spec, p);
    if (var.impl == AttnImpl::Tiled && !tiled)
        throw ValueError(std::string("attention_impl 'tiled': attention='") + kernel->name() + "' has no tiled form");
}

template <class T>
void MHAttention<T>::init(ParamStore<T>& store, Rng& rng, double stddev, double out_stddev) const {
    source->init(store, rng, stddev);
    store.normal(W_o.offset, W_o.rows * W_o.cols, out_stddev, rng);
    if (var.bias) store.fill(b_o.offset, b_o.size, T(0));
    if (position.bias) position.bias->init(store, rng);
}

// X:[d_x,n_x], Z:[d_z,n_z] -> Ṽ:[d_out,n_x]
template <class T>
void MHAttention<T>::forward(const ParamStore<T>& store, CMatView<T> X, const Seqs& sx, CMatView<T> Z, const Seqs& sz,
                             MatView<T> Vt, MHAttentionCache<T>& c, bool accumulate, const Dropout* drop,
                             std::uint64_t place, const Mask* call_mask) const {
    c.mask = call_mask ? *call_mask : mask;
    c.mask.check(sz, sx);
    // the weights' size (ℓ_z·ℓ_x per head and sequence) checked before anything is allocated or computed: a
    // 10^7-token input (rope/alibi have no table to bound ℓ) would otherwise fail only after 3 GB of Q, K, V
    weight_offsets(sx, sz, H, sizeof(T), c.A_off);
    MatView<T> Q, K, V;
    source->forward(store, X, sx, Z, sz, c, Q, K, V);  // Algorithm 4's lines 1–3 for all heads
    if (position.qk) {  // e.g. V1 lines 2a, 2b: every head's Q and K transformed at their positions
        position.qk->forward(Q, QKTransform<T>::Role::Query, H, sx, 0);
        position.qk->forward(K, QKTransform<T>::Role::Key, H_kv, sz, 0);
    }
    c.Qv = Q, c.Kv = K, c.Vv = V;
    MatView<T> Y = ensure(c.Y, H * d_mid, X.cols);
    heads(store, Q, sx, K, V, sz, 0, c, Y, drop, place);  // lines 1–3: Y = [Y¹; …; Y^H]
    if (accumulate)
        affine_add<T>(store, W_o, Y, bias(store, b_o), Vt);  // line 4, added to the caller's residual stream
    else
        affine<T>(store, W_o, Y, bias(store, b_o), Vt);  // line 4: Ṽ = W_o Y + b_o 1ᵀ
}

template <class T>
HeadBlock<T> MHAttention<T>::block(const MHAttentionCache<T>& c, index_t b, index_t h, const ParamStore<T>* store,
                                   const KVCache<T>* cache) const {
    HeadBlock<T> blk;
    blk.mask = &c.mask, blk.b = b, blk.h = h, blk.q0 = c.q0;
    blk.bias = position.bias.get(), blk.store = store, blk.unscaled = !var.scale_scores;
    blk.g = kv_head(h), blk.off = c.A_off[std::size_t(b * H + h)], blk.j0 = c.sx.begin(b), blk.n_x = c.sx.total();
    blk.cache = cache;
    return blk;
}

// Algorithm 5 lines 1–3: for h ∈ [H]: Y^h ← Attention(X, Z | W^h_qkv, Mask), i.e. Algorithm 4's lines 4–6 (the
// head kernel) on head h's rows of Q and key/value head kv_head(h)'s rows of K, V (V3), for every sequence b,
// writing Y^h into its rows of Y (line 3 is the layout). Block (b, h)'s weights sit at c.A_off[b·H + h].
template <class T>
void MHAttention<T>::heads(const ParamStore<T>& store, CMatView<T> Q, const Seqs& sx, CMatView<T> K, CMatView<T> V,
                           const Seqs& sz, index_t q0, MHAttentionCache<T>& c, MatView<T> Y, const Dropout* drop,
                           std::uint64_t place, const KVCache<T>* cache) const {
    weight_offsets(sx, sz, H, sizeof(T), c.A_off);  // (checked again for the callers that come here directly)
    c.training = drop != nullptr, c.drop_key = drop ? drop->key(place) : DropoutKey{};  // (a dropout part's masks)
    c.sx = sx, c.sz = sz, c.q0 = q0, c.store = &store, c.unit = this;
    const HeadKernel<T>& k = kernel_for(sz.max_len());
    c.kernel = &k;
    k.begin(c, H, Q.cols);
    const index_t work = sx.max_len() * sz.max_len() * std::max(d_attn, d_mid);
    Bf16RoundOnce once({Q, K, V}, {d_attn, d_attn, d_mid});  // bf16-mixed: Q, K, V rounded once, head by head
    for_blocks(
        sx.count(), H, work,
        [&](index_t b, index_t h) {
            const index_t g = kv_head(h);
            k.forward(Q.rows_range(h * d_attn, d_attn).cols_range(sx.begin(b), sx.len(b)),
                      K.rows_range(g * d_attn, d_attn).cols_range(sz.begin(b), sz.len(b)),
                      V.rows_range(g * d_mid, d_mid).cols_range(sz.begin(b), sz.len(b)), block(c, b, h, &store, cache), c,
                      Y.rows_range(h * d_mid, d_mid).cols_range(sx.begin(b), sx.len(b)));
        },
        k.one_thread_blocks());
}

template <class T>
void MHAttention<T>::backward(ParamStore<T>& store, CMatView<T> X, const Seqs& sx, CMatView<T> Z, const Seqs& sz,
                              const MHAttentionCache<T>& c, CMatView<T> dVt, MatView<T> dX, MatView<T> dZ,
                              MHAttentionWork<T>& w) const {
    MatView<T> dY = ensure(w.dY, H * d_mid, X.cols);
    MatView<T> dQ, dK, dV;
    source->gradients(c, dX.data == dZ.data && dX.ld == dZ.ld, X.cols, Z.cols, w, dQ, dK, dV);
    // d(line 4): dW_o += dṼ Yᵀ, db_o += dṼ 1, dY = W_oᵀ dṼ
    affine_backward_set<T>(store, W_o, view(c.Y), dVt, store.grad_if_trained(W_o), dbias(store, b_o), dY.data);
    CMatView<T> Q = c.Qv, K = c.Kv, V = c.Vv, Y = view(c.Y);
    // d(lines 1–3): Algorithm 4's lines 6, 5, 4 backward per (sequence, key/value head g) block; the query
    // heads of a group run in turn, so dK^g and dV^g sum their contributions (V3) without a race
    const HeadKernel<T>& k = *c.kernel;
    k.begin_backward(c, w);
    const index_t work = sx.max_len() * sz.max_len() * std::max(d_attn, d_mid), group = H / H_kv;
    // bf16-mixed: Q, K, V and dY rounded once, head by head, for every block's products
    Bf16RoundOnce once({Q, K, V, CMatView<T>(dY)}, {d_attn, d_attn, d_mid, d_mid});
    for_blocks(
        sx.count(), H_kv, work * group,
        [&](index_t b, index_t g) {
            for (index_t h = g * group; h < (g + 1) * group; ++h)
                k.backward(Q.rows_range(h * d_attn, d_attn).cols_range(sx.begin(b), sx.len(b)),
                           K.rows_range(g * d_attn, d_attn).cols_range(sz.begin(b), sz.len(b)),
                           V.rows_range(g * d_mid, d_mid).cols_range(sz.begin(b), sz.len(b)),
                           Y.rows_range(h * d_mid, d_mid).cols_range(sx.begin(b), sx.len(b)),
                           CMatView<T>(dY).rows_range(h * d_mid, d_mid).cols_range(sx.begin(b), sx.len(b)),
                           block(c, b, h, &store), c, w, dQ.rows_range(h * d_attn, d_attn).cols_range(sx.begin(b), sx.len(b)),
                           dK.rows_range(g * d_attn, d_attn).cols_range(sz.begin(b), sz.len(b)),
                           dV.rows_range(g * d_mid, d_mid).cols_range(sz.begin(b), sz.len(b)));
        },
        k.one_thread_blocks());
    k.end_backward(store, position.bias.get(), H, c, w);
    if (position.qk) {  // back through the query/key transform (V1: dQ ← R(p)ᵀ dQ, dK ← R(p)ᵀ dK)
        position.qk->backward(dQ, QKTransform<T>::Role::Query, H, sx, 0);
        position.qk->backward(dK, QKTransform<T>::Role::Key, H_kv, sz, 0);
    }
    source->backward(store, X, sx, Z, sz, c, dQ, dK, dV, dX, dZ, w);  // Algorithm 4's lines 3, 2, 1
}

template <class T>
void MHAttention<T>::append_kv(const ParamStore<T>& store, CMatView<T> Z, KVCache<T>& cache) const {
    const CacheKeep keep = mask.cache_keep();  // what the cache keeps is the mask's (all; V9: a rolling window)
    const index_t rows_k = source->key_rows(), rows_v = source->value_rows();
    kernel->before_append(cache, H_kv, d_attn, d_mid);  // (V15: the cached columns folded into its state)
    if (const index_t drop = keep.drop(cache.len, Z.cols); drop > 0) {  // the oldest columns moved out of the front
        std::copy(cache.K.data() + rows_k * drop, cache.K.data() + rows_k * cache.len, cache.K.data());
        std::copy(cache.V.data() + rows_v * drop, cache.V.data() + rows_v * cache.len, cache.V.data());
        cache.start += drop;
        cache.len -= drop;
    }
    const index_t need = checked_add(cache.len, Z.cols, "the KV cache"), have = index_t(cache.K.shape(1));
    if (const index_t cap = keep.capacity(need, have); cap != have) {
        // The one place a cache's size is decided (the mask's CacheKeep: doubling; a window's O(min(ℓ, w)));
        // the cached columns kept
        checked_elements({std::max(rows_k, rows_v), cap}, sizeof(T), "the KV cache");
        Matrix<T> K2 = Matrix<T>::from_shape({std::size_t(rows_k), std::size_t(cap)});
        Matrix<T> V2 = Matrix<T>::from_shape({std::size_t(rows_v), std::size_t(cap)});
        std::copy(cache.K.data(), cache.K.data() + rows_k * cache.len, K2.data());
        std::copy(cache.V.data(), cache.V.data() + rows_v * cache.len, V2.data());
        cache.K = std::move(K2);
        cache.V = std::move(V2);
    }
    MatView<T> Knew = view(cache.K).cols_range(cache.len, Z.cols);
    // Alg 4 lines 2, 3 (V10: the latent) of the new tokens at positions start + len, …
    source->append(store, Z, cache.start + cache.len, Knew, view(cache.V).cols_range(cache.len, Z.cols));
    if (position.qk)  // keys at their absolute positions start + len, start + len + 1, … (V1 line 2b)
        position.qk->forward(Knew, QKTransform<T>::Role::Key, H_kv, Seqs::single(Z.cols), cache.start + cache.len);
    cache.len = need;
}

template <class T>
void MHAttention<T>::attend_cached(const ParamStore<T>& store, CMatView<T> X, index_t q0, const KVCache<T>& cache,
                                   MatView<T> Vt, MHAttentionCache<T>& s, bool accumulate, const Mask* call_mask) const {
    const index_t n = X.cols, lz = cache.len;
    // the mask and score biases see the cached columns at positions start, start+1, …: relative to column 0
    // the queries are at q0 − start (start > 0 only for a window, whose rule depends on t_x − t_z only, as
    // ALiBi's bias does); the query/key transform (RoPE) rotates Q at the absolute q0
    const index_t q_rel = q0 - cache.start;
    s.mask = call_mask ? *call_mask : mask;
    s.mask.check(lz, n, q_rel);
    MatView<T> Q = ensure(s.Q, H * d_attn, n), Y = ensure(s.Y, H * d_mid, n);
    source->queries(store, X, q0, Q, s);  // Alg 4 line 1, all heads (V10: lines 1, 2, 6)
    if (position.qk)  // queries at q0, q0 + 1, … (V1 line 2a)
        position.qk->forward(Q, QKTransform<T>::Role::Query, H, Seqs::single(n), q0);
    CMatView<T> K, V;  // the cached keys and values (V10: up-projected from the cached latents, lines 5, 7)
    source->keys_values(store, CMatView<T>(view(cache.K)).cols_range(0, lz), CMatView<T>(view(cache.V)).cols_range(0, lz),
                        s, K, V);
    heads(store, Q, Seqs::single(n), K, V, Seqs::single(lz), q_rel, s, Y, nullptr, 0, &cache);  // Alg 5 lines 1–3
    if (accumulate)
        affine_add<T>(store.W(W_o), Y, bias(store, b_o), Vt);  // Alg 5 line 4 (into the residual stream)
    else
        affine<T>(store.W(W_o), Y, bias(store, b_o), Vt);  // Alg 5 line 4
}

template <class T>
void MHAttention<T>::materialize_weights(const MHAttentionCache<T>& c) const {
    if (c.weights_ready) return;
    FT_CHECK(c.kernel && index_t(c.A_off.size()) == c.sx.count() * H + 1, "attention weights: no forward to rebuild");
    const Seqs &sx = c.sx, &sz = c.sz;
    c.A.resize(std::size_t(check_bytes(c.A_off.back(), sizeof(T), "attention weights")));
    for (index_t b = 0; b < sx.count(); ++b)
        for (index_t h = 0; h < H; ++h) {  // the weights of each block, on the saved Q, K, V
            const index_t g = kv_head(h);
            const HeadBlock<T> blk = block(c, b, h, c.store);
            c.kernel->weights(c.Qv.rows_range(h * d_attn, d_attn).cols_range(sx.begin(b), sx.len(b)),
                              c.Kv.rows_range(g * d_attn, d_attn).cols_range(sz.begin(b), sz.len(b)),
                              c.Vv.rows_range(g * d_mid, d_mid).cols_range(sz.begin(b), sz.len(b)), blk, c,
                              MatView<T>(c.A.data() + blk.off, sz.len(b), sx.len(b)));
        }
    c.weights_ready = true;
}

template <class T>
void MHAttentionCache<T>::keep_lse_only(index_t H, index_t n_x, const char* what) {
    A.clear();
    A.shrink_to_fit();
    Ad.clear();
    Ad.shrink_to_fit();
    drop.keep.clear();
    drop.keep.shrink_to_fit();
    weights_ready = false;
    lse.resize(std::size_t(check_bytes(checked_mul(H, n_x, what), sizeof(T), what)));
}

template void MHAttentionCache<float>::keep_lse_only(index_t, index_t, const char*);
template void MHAttentionCache<double>::keep_lse_only(index_t, index_t, const char*);
template class BasicAttention<float>;
template class BasicAttention<double>;
template class Attention<float>;
template class Attention<double>;
template class MHAttention<float>;
template class MHAttention<double>;
#define FT_INSTANTIATE(T)                                                                                        \
    template void attention_head<T>(CMatView<T>, CMatView<T>, CMatView<T>, const HeadBlock<T>&, MatView<T>, MatView<T>); \
    template void attention_head_backward<T>(CMatView<T>, CMatView<T>, CMatView<T>, CMatView<T>, CMatView<T>,       \
                                             MatView<T>, MatView<T>, MatView<T>, MatView<T>, bool);                  \
    template void attention_head_weights<T>(CMatView<T>, CMatView<T>, const HeadBlock<T>&, MatView<T>);             \
    template void attention_mix<T>(CMatView<T>, CMatView<T>, MatView<T>);                                            \
    template void attention_mix_backward<T>(CMatView<T>, CMatView<T>, CMatView<T>, MatView<T>, MatView<T>);          \
    template void attention_head_weights_backward<T>(CMatView<T>, CMatView<T>, CMatView<T>, MatView<T>, MatView<T>,  \
                                                     MatView<T>, bool);
FT_INSTANTIATE(float)
FT_INSTANTIATE(double)
#undef FT_INSTANTIATE

}  // namespace ft
