// Algorithm 4, lines 1–3, for all H heads at once: the listing's Q/K/V source ("projections", attention.hpp
// Projections; parts.hpp QKVSource). Forward and backward side by side.
//   1  Q ← W_q X + b_q 1ᵀ        [[Query ∈ R^{H·d_attn×ℓ_x}: head h the rows h·d_attn …]]
//   2  K ← W_k Z + b_k 1ᵀ        [[Key ∈ R^{H_kv·d_attn×ℓ_z}: V3's H_kv key/value heads]]
//   3  V ← W_v Z + b_v 1ᵀ        [[Value ∈ R^{H_kv·d_mid×ℓ_z}]]
// W_q = [W_q¹; …; W_q^H] stacked (docs/api.md: W_q is (H, d_attn, d_x), head h a block of rows), so each line is
// ONE gemm for every head; with bias = false (V5) the b's are not in θ.
#include <algorithm>

#include "formal_transformers/attention.hpp"
#include "formal_transformers/bf16_products.hpp"
#include "formal_transformers/blas.hpp"
#include "formal_transformers/functions.hpp"
#include "formal_transformers/lora.hpp"

namespace ft {

template <class T>
Projections<T>::Projections(const AttnPartSpec<T>& s, ParamStore<T>& store, const std::string& p)
    : d_x(s.d_x), Dq(s.H * s.d_attn), Dk(s.H_kv * s.d_attn), Dv(s.H_kv * s.d_mid), has_bias(s.v.bias) {
    W_q = store.stacked(p + "W_q", s.H, s.d_attn, s.d_x);
    if (has_bias) b_q = store.stacked_vector(p + "b_q", s.H, s.d_attn);
    W_k = store.stacked(p + "W_k", s.H_kv, s.d_attn, s.d_z);
    if (has_bias) b_k = store.stacked_vector(p + "b_k", s.H_kv, s.d_attn);
    W_v = store.stacked(p + "W_v", s.H_kv, s.d_mid, s.d_z);
    if (has_bias) b_v = store.stacked_vector(p + "b_v", s.H_kv, s.d_mid);
}

template <class T>
void Projections<T>::init(ParamStore<T>& store, Rng& rng, double stddev) const {
    for (const MatParam* W : {&W_q, &W_k, &W_v}) store.normal(W->offset, W->rows * W->cols, stddev, rng);
    if (has_bias)
        for (const VecParam* b : {&b_q, &b_k, &b_v}) store.fill(b->offset, b->size, T(0));
}

// Self-attention (Z is X, same sequences): the three lines as ONE product, Q, K, V row blocks of QKV.
template <class T>
void Projections<T>::forward(const ParamStore<T>& store, CMatView<T> X, const Seqs& sx, CMatView<T> Z, const Seqs& sz,
                             MHAttentionCache<T>& c, MatView<T>& Q, MatView<T>& K, MatView<T>& V) const {
    ProjectionState<T>& st = c.source.template get<ProjectionState<T>>();
    // (not when a LoRA adapter of W_q, W_k or W_v drops its input: lora.hpp lines 2′–3′ are per matrix)
    st.fused = X.data == Z.data && X.rows == Z.rows && X.cols == Z.cols && X.ld == Z.ld && sx.off == sz.off &&
               store.lora_drops(W_q) < 0 && store.lora_drops(W_k) < 0 && store.lora_drops(W_v) < 0;
    if (!st.fused) {
        Q = ensure(c.Q, Dq, X.cols), K = ensure(c.K, Dk, Z.cols), V = ensure(c.V, Dv, Z.cols);
        affine<T>(store, W_q, X, bias(store, b_q), Q);  // line 1: Q^h ← W_q^h X + b_q^h 1ᵀ
        affine<T>(store, W_k, Z, bias(store, b_k), K);  // line 2: K^g ← W_k^g Z + b_k^g 1ᵀ  (g ∈ [H_kv])
        affine<T>(store, W_v, Z, bias(store, b_v), V);  // line 3: V^g ← W_v^g Z + b_v^g 1ᵀ
        return;
    }
    MatView<T> W = ensure(st.W_qkv, Dq + Dk + Dv, d_x);
    CMatView<T> Wq = store.W(W_q), Wk = store.W(W_k), Wv = store.W(W_v);
    for (index_t j = 0; j < d_x; ++j) {
        std::copy(Wq.col(j), Wq.col(j) + Dq, W.col(j));
        std::copy(Wk.col(j), Wk.col(j) + Dk, W.col(j) + Dq);
        std::copy(Wv.col(j), Wv.col(j) + Dv, W.col(j) + Dq + Dk);
    }
    T* b = nullptr;
    if (has_bias) {
        b = ensure(st.b_qkv, Dq + Dk + Dv);
        std::copy(store.v(b_q), store.v(b_q) + Dq, b);
        std::copy(store.v(b_k), store.v(b_k) + Dk, b + Dq);
        std::copy(store.v(b_v), store.v(b_v) + Dv, b + Dq + Dk);
    }
    MatView<T> QKV = ensure(st.QKV, Dq + Dk + Dv, X.cols);
    affine<T>(W, X, b, QKV);  // lines 1–3 at once
    Q = QKV.rows_range(0, Dq), K = QKV.rows_range(Dq, Dk), V = QKV.rows_range(Dq + Dk, Dv);
}

// The fused product of the forward is differentiated as one product when dZ is dX too: dQ, dK, dV row blocks of
// one [dQ; dK; dV].
template <class T>
void Projections<T>::gradients(const MHAttentionCache<T>& c, bool dx_is_dz, index_t n_x, index_t n_z,
                               MHAttentionWork<T>& w, MatView<T>& dQ, MatView<T>& dK, MatView<T>& dV) const {
    const ProjectionState<T>* st = c.source.template find<ProjectionState<T>>();
    if (st && st->fused && dx_is_dz) {
        MatView<T> dQKV = ensure(w.source.template get<ProjectionWork<T>>().dQKV, Dq + Dk + Dv, n_x);
        std::fill(dQKV.data, dQKV.data + dQKV.size(), T(0));
        dQ = dQKV.rows_range(0, Dq), dK = dQKV.rows_range(Dq, Dk), dV = dQKV.rows_range(Dq + Dk, Dv);
        return;
    }
    dQ = ensure(w.dQ, Dq, n_x), dK = ensure(w.dK, Dk, n_z), dV = ensure(w.dV, Dv, n_z);
    std::fill(dQ.data, dQ.data + dQ.size(), T(0));
    std::fill(dK.data, dK.data + dK.size(), T(0));
    std::fill(dV.data, dV.data + dV.size(), T(0));
}

template <class T>
void Projections<T>::backward(ParamStore<T>& store, CMatView<T> X, const Seqs& sx, CMatView<T> Z, const Seqs& sz,
                              const MHAttentionCache<T>& c, MatView<T> dQ, MatView<T> dK, MatView<T> dV, MatView<T> dX,
                              MatView<T> dZ, MHAttentionWork<T>& w) const {
    (void)sx, (void)sz;
    const ProjectionState<T>* st = c.source.template find<ProjectionState<T>>();
    if (st && st->fused && dX.data == dZ.data && dX.ld == dZ.ld) {
        // lines 1–3 at once: [dW_q; dW_k; dW_v] = [dQ; dK; dV] Xᵀ, d[b_q; b_k; b_v] = [dQ; dK; dV] 1,
        // dX += [W_q; W_k; W_v]ᵀ [dQ; dK; dV]
        ProjectionWork<T>& pw = w.source.template get<ProjectionWork<T>>();
        CMatView<T> dQKV = view(pw.dQKV);
        Bf16OperandReuse once;  // bf16-mixed: dQKV rounded once for dW and dX
        // a weight frozen for the run (ParamStore::train_only) has no gradient; none trains: no product at all
        T *gq = store.grad_if_trained(W_q), *gk = store.grad_if_trained(W_k), *gv = store.grad_if_trained(W_v);
        if (gq || gk || gv) {
            MatView<T> dW = ensure(pw.dW_qkv, Dq + Dk + Dv, d_x);
            Bf16AffineInput input(view(st->W_qkv).data, Bf16Input::Read);  // bf16-mixed: X rounded by the forward's product
            gemm<T>(Op::N, Op::T, T(1), dQKV, X, T(0), dW);
            for (index_t j = 0; j < d_x; ++j) {
                const T* g = dW.col(j);
                T *q = gq ? gq + j * Dq : nullptr, *k = gk ? gk + j * Dk : nullptr, *v = gv ? gv + j * Dv : nullptr;
                if (q) {
#pragma omp simd
                    for (index_t i = 0; i < Dq; ++i) q[i] += g[i];
                }
                if (k) {
#pragma omp simd
                    for (index_t i = 0; i < Dk; ++i) k[i] += g[Dq + i];
                }
                if (v) {
#pragma omp simd
                    for (index_t i = 0; i < Dv; ++i) v[i] += g[Dq + Dk + i];
                }
            }
        }
        if (has_bias) {
            if (T* db = store.grad_if_trained(b_q)) add_column_sum<T>(dQKV.rows_range(0, Dq), db);
            if (T* db = store.grad_if_trained(b_k)) add_column_sum<T>(dQKV.rows_range(Dq, Dk), db);
            if (T* db = store.grad_if_trained(b_v)) add_column_sum<T>(dQKV.rows_range(Dq + Dk, Dv), db);
        }
        gemm<T>(Op::T, Op::N, T(1), view(st->W_qkv), dQKV, T(1), dX);
        return;
    }
    // lines 3, 2, 1 for all heads at once (stacked): parameter gradients, dZ, dX
    affine_backward<T>(store, W_v, Z, dV, store.grad_if_trained(W_v), dbias(store, b_v), dZ.data, dZ.ld);
    affine_backward<T>(store, W_k, Z, dK, store.grad_if_trained(W_k), dbias(store, b_k), dZ.data, dZ.ld);
    affine_backward<T>(store, W_q, X, dQ, store.grad_if_trained(W_q), dbias(store, b_q), dX.data, dX.ld);
}

// Decoding: a token keeps its key and value (lines 2, 3); queries are line 1; the cached columns are K, V.
template <class T>
void Projections<T>::append(const ParamStore<T>& store, CMatView<T> Z, index_t p0, MatView<T> Kc, MatView<T> Vc) const {
    (void)p0;
    affine<T>(store.W(W_k), Z, bias(store, b_k), Kc);  // line 2 (H_kv heads)
    affine<T>(store.W(W_v), Z, bias(store, b_v), Vc);  // line 3
}

template <class T>
void Projections<T>::queries(const ParamStore<T>& store, CMatView<T> X, index_t q0, MatView<T> Q,
                             MHAttentionCache<T>& s) const {
    (void)q0, (void)s;
    affine<T>(store.W(W_q), X, bias(store, b_q), Q);  // line 1, all heads
}

template <class T>
void Projections<T>::keys_values(const ParamStore<T>& store, CMatView<T> Kc, CMatView<T> Vc, MHAttentionCache<T>& s,
                                 CMatView<T>& K, CMatView<T>& V) const {
    (void)store, (void)s;
    K = Kc, V = Vc;
}

// The registry's factory (registry.cpp)
template <class T>
std::shared_ptr<const QKVSource<T>> make_projections(const AttnPartSpec<T>& spec, ParamStore<T>& store,
                                                     const std::string& prefix) {
    return std::make_shared<const Projections<T>>(spec, store, prefix);
}

template class Projections<float>;
template class Projections<double>;
template std::shared_ptr<const QKVSource<float>> make_projections<float>(const AttnPartSpec<float>&, ParamStore<float>&,
                                                                         const std::string&);
template std::shared_ptr<const QKVSource<double>> make_projections<double>(const AttnPartSpec<double>&,
                                                                           ParamStore<double>&, const std::string&);

}  // namespace ft
