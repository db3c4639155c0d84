// Algorithm V15 (random-feature attention; random_features.hpp quotes the listings V15a–V15c): the draw of Ω,
// the feature map φ, and attention as φ(Q)(φ(K)ᵀV) normalised, bidirectional and causal, forward and
// backward side by side. Every product is one single-thread BLAS call (gemm_unsplit): the kernel runs on the
// calling thread and MHAttention runs heads in parallel (as the tiled kernel, docs/design.md "Threads").
#include "formal_transformers/random_features.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "formal_transformers/attention.hpp"
#include "formal_transformers/blas.hpp"
#include "formal_transformers/config.hpp"
#include "formal_transformers/sizes.hpp"

namespace ft {

namespace {
// Queries per chunk of the causal form (2′–3′): the C×C masked block and the state products
constexpr index_t kChunk = 64;

// C ← α op(A) op(B) + β C on the calling thread (one BLAS call); an empty inner dimension leaves β C
template <class T>
void mm(Op a, Op b, T alpha, CMatView<T> A, CMatView<T> B, T beta, MatView<T> C) {
    if (C.rows == 0 || C.cols == 0) return;
    if ((a == Op::N ? A.cols : A.rows) == 0) {
        for (index_t j = 0; j < C.cols; ++j)
            for (index_t i = 0; i < C.rows; ++i) C(i, j) = beta == T(0) ? T(0) : beta * C(i, j);
        return;
    }
    gemm_unsplit<T>(a, b, alpha, A, B, beta, C);
}
template <class T>
T dot(const T* a, const T* b, index_t n) {
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (index_t i = 0; i < n; ++i) s += a[i] * b[i];
    return s;
}
// the causal mask on a chunk's block: key k0 + i visible to query q0 + j0 + j iff i ≤ j (k0 = q0 + j0)
template <class T>
void mask_upper(MatView<T> A) {
    for (index_t j = 0; j < A.cols; ++j)
        for (index_t i = j + 1; i < A.rows; ++i) A(i, j) = T(0);
}

template <class T>
struct Scratch {
    std::vector<T> Pq, Pk, S, z, A, Gm, G, e, dPq, dPk, R, r, dU, coef;
};
template <class T>
Scratch<T>& scratch() {
    thread_local Scratch<T> s;
    return s;
}
template <class T>
MatView<T> sized(std::vector<T>& v, index_t rows, index_t cols) {
    const std::size_t n = std::size_t(std::max<index_t>(checked_elements({rows, cols}, sizeof(T), "random features"), 1));
    if (v.size() < n) v.resize(n);
    return MatView<T>(v.data(), rows, cols);
}
template <class T>
T* zeroed(std::vector<T>& v, index_t n) {
    if (v.size() < std::size_t(std::max<index_t>(n, 1))) v.resize(std::size_t(std::max<index_t>(n, 1)));
    std::fill(v.data(), v.data() + n, T(0));
    return v.data();
}
const char* kernel_name(FeatureKind kind) { return kind == FeatureKind::Performer ? "performer" : "rfa"; }
}  // namespace

FeatureKind feature_kind(const std::string& name, const char* option) {
    if (name == "performer") return FeatureKind::Performer;
    if (name == "rfa") return FeatureKind::RFA;
    throw ValueError(std::string(option) + " must be 'performer' or 'rfa', got '" + name + "'");
}

index_t check_n_features(FeatureKind kind, index_t D, index_t d_attn, index_t attentions, std::size_t elem_size) {
    const std::string k = kernel_name(kind);
    if (D < 1)
        throw ValueError("n_features = " + std::to_string(D) + " must be >= 1 (the number D of random features of attention='" +
                         k + "')");
    if (d_attn < 1) throw ValueError("random features: d_attn must be >= 1");
    const std::string what = "n_features = " + std::to_string(D) + " (attention='" + k + "': Ω is n_features × d_attn = " +
                             std::to_string(D) + " × " + std::to_string(d_attn) + " per attention, " +
                             std::to_string(attentions) + " attentions)";
    const index_t per = checked_mul(D, d_attn, what.c_str());                    // one Ω
    const index_t bytes = checked_mul(per, checked_add(checked_mul(attentions, index_t(elem_size), what.c_str()),
                                                       index_t(sizeof(double)), what.c_str()), what.c_str());  // + the draw
    check_bytes(bytes, 1, what.c_str());
    return kind == FeatureKind::RFA ? checked_mul(2, D, what.c_str()) : D;
}

// ===================================== Algorithm V15a ==================================================
template <class T>
RandomFeatures<T> draw_random_features(FeatureKind kind, index_t D, index_t d, std::uint64_t seed,
                                       const std::string& name) {
    check_n_features(kind, D, d, 1, sizeof(T));  // sizes before the draw: D·d may not wrap
    Rng rng(named_seed(seed, name));
    std::vector<double> W(std::size_t(D * d));  // row-major: ω_i = W[i·d …]
    std::vector<double> G(std::size_t(d * d));
    for (index_t i0 = 0; i0 < D; i0 += d) {  // line 1: blocks of d rows
        const index_t nb = std::min(d, D - i0);
        for (double& g : G) g = rng.normal();  // G ~ N(0, 1)^{d×d}
        if (kind == FeatureKind::Performer)     // Gram–Schmidt (modified) on the rows of G
            for (index_t r = 0; r < d; ++r) {
                double* gr = G.data() + r * d;
                for (index_t p = 0; p < r; ++p) {
                    const double* gp = G.data() + p * d;
                    double c = 0;
                    for (index_t k = 0; k < d; ++k) c += gr[k] * gp[k];
                    for (index_t k = 0; k < d; ++k) gr[k] -= c * gp[k];
                }
                double nrm = 0;
                for (index_t k = 0; k < d; ++k) nrm += gr[k] * gr[k];
                nrm = std::sqrt(nrm);
                for (index_t k = 0; k < d; ++k) gr[k] /= nrm;
            }
        std::copy(G.begin(), G.begin() + nb * d, W.begin() + i0 * d);
    }
    if (kind == FeatureKind::Performer)  // line 2: ω_i ← B[i, :] ‖g_i‖, g_i ~ N(0, I_d)
        for (index_t i = 0; i < D; ++i) {
            double nrm = 0;
            for (index_t k = 0; k < d; ++k) {
                const double g = rng.normal();
                nrm += g * g;
            }
            nrm = std::sqrt(nrm);
            for (index_t k = 0; k < d; ++k) W[std::size_t(i * d + k)] *= nrm;
        }
    RandomFeatures<T> f;  // line 3
    f.kind = kind, f.D = D, f.d = d;
    f.Omega = Matrix<T>::from_shape({std::size_t(D), std::size_t(d)});
    MatView<T> O = view(f.Omega);
    for (index_t i = 0; i < D; ++i)
        for (index_t k = 0; k < d; ++k) O(i, k) = T(W[std::size_t(i * d + k)]);
    return f;
}

// ===================================== Algorithm V15b ==================================================
template <class T>
void random_feature_map(const RandomFeatures<T>& f, CMatView<T> X, bool query, MatView<T> Phi) {
    FT_CHECK(X.rows == f.d && Phi.rows == f.M() && Phi.cols == X.cols, "random_feature_map: shapes do not conform");
    const index_t D = f.D, n = X.cols;
    const T s = T(1) / std::sqrt(std::sqrt(T(f.d))), inv_sqrt_D = T(1) / std::sqrt(T(D));
    mm<T>(Op::N, Op::N, s, view(f.Omega), X, T(0), Phi.rows_range(0, D));  // U ← s Ω X
    for (index_t j = 0; j < n; ++j) {
        const T half_sq = T(0.5) * s * s * dot(X.col(j), X.col(j), X.rows);  // ½ s² ‖x‖²
        T* u = Phi.col(j);
        if (f.kind == FeatureKind::Performer) {  // exp(U − ½ s² ‖x‖²)/√D (queries: minus their max)
            T m = half_sq;
            if (query) {
                m = u[0];
                for (index_t i = 1; i < D; ++i) m = std::max(m, u[i]);
            }
            for (index_t i = 0; i < D; ++i) u[i] = std::exp(u[i] - m) * inv_sqrt_D;
        } else {  // [sin U; cos U] exp(½ s² ‖x‖²)/√D (queries: without the factor)
            const T h = (query ? T(1) : std::exp(half_sq)) * inv_sqrt_D;
            for (index_t i = 0; i < D; ++i) {
                const T a = u[i];
                u[i] = h * std::sin(a);
                u[D + i] = h * std::cos(a);
            }
        }
    }
}

template <class T>
void random_feature_map_backward(const RandomFeatures<T>& f, CMatView<T> X, CMatView<T> Phi, CMatView<T> dPhi,
                                 bool query, MatView<T> dX) {
    const index_t D = f.D, n = X.cols, d = X.rows;
    const T s = T(1) / std::sqrt(std::sqrt(T(f.d)));
    Scratch<T>& w = scratch<T>();
    MatView<T> dU = sized(w.dU, D, n);
    T* coef = zeroed(w.coef, n);
    for (index_t j = 0; j < n; ++j) {
        const T *p = Phi.col(j), *g = dPhi.col(j);
        T* du = dU.col(j);
        if (f.kind == FeatureKind::Performer) {  // dU = dΦ ⊙ Φ;  the −½ s² ‖x‖² term: −s² x (1ᵀ dU)
            T sum = 0;
            for (index_t i = 0; i < D; ++i) {
                du[i] = g[i] * p[i];
                sum += du[i];
            }
            coef[j] = -s * s * sum;
        } else {  // dU = dΦ_sin ⊙ Φ_cos − dΦ_cos ⊙ Φ_sin;  the factor (keys): s² x (1ᵀ (dΦ ⊙ Φ))
            for (index_t i = 0; i < D; ++i) du[i] = g[i] * p[D + i] - g[D + i] * p[i];
            coef[j] = query ? T(0) : s * s * dot(g, p, 2 * D);
        }
    }
    mm<T>(Op::T, Op::N, s, view(f.Omega), dU, T(1), dX);  // dX += s Ωᵀ dU
    for (index_t j = 0; j < n; ++j) {
        const T* x = X.col(j);
        T* o = dX.col(j);
        const T c = coef[j];
#pragma omp simd
        for (index_t i = 0; i < d; ++i) o[i] += c * x[i];
    }
}

// ===================================== Algorithm V15c ==================================================
template <class T>
void rf_attention_head(const RandomFeatures<T>& f, CMatView<T> Q, CMatView<T> K, CMatView<T> V, bool causal,
                       index_t q0, FeatureState<T> s0, MatView<T> Vt, T* n) {
    const index_t M = f.M(), l_x = Q.cols, l_z = K.cols, d_v = V.rows;
    FT_CHECK(Q.rows == f.d && K.rows == f.d && V.cols == l_z && Vt.rows == d_v && Vt.cols == l_x,
             "rf_attention_head: shapes do not conform");
    Scratch<T>& w = scratch<T>();
    MatView<T> Pq = sized(w.Pq, M, l_x), Pk = sized(w.Pk, M, l_z);
    random_feature_map<T>(f, Q, true, Pq);  // line 1: Φ_q ← φ(Q)
    random_feature_map<T>(f, K, false, Pk);  //         Φ_k ← φ(K)
    MatView<T> S = sized(w.S, d_v, M);
    T* z = zeroed(w.z, M);
    std::fill(S.data, S.data + S.size(), T(0));
    if (s0.S) std::copy(s0.S, s0.S + d_v * M, S.data);
    if (s0.z) std::copy(s0.z, s0.z + M, z);
    if (!causal) {
        mm<T>(Op::N, Op::T, T(1), V, Pk, T(1), S);  // line 2: S ← V Φ_kᵀ
        add_column_sum<T>(Pk, z);                      //         z ← Φ_k 1
        mm<T>(Op::N, Op::N, T(1), S, Pq, T(0), Vt);  // line 3: N ← S Φ_q
        for (index_t j = 0; j < l_x; ++j) n[j] = dot(Pq.col(j), z, M);  // n ← Φ_qᵀ z
    } else {
        const index_t lim = std::min(l_z, q0 + l_x), pre = std::min(q0, lim);  // keys ≥ q0 + ℓ_x: seen by none
        mm<T>(Op::N, Op::T, T(1), V.cols_range(0, pre), Pk.cols_range(0, pre), T(1), S);  // keys before the queries
        add_column_sum<T>(Pk.cols_range(0, pre), z);
        for (index_t j0 = 0; j0 < l_x; j0 += kChunk) {  // line 2′–3′, a chunk of queries at a time
            const index_t nq = std::min(kChunk, l_x - j0), k0 = q0 + j0;
            const index_t nk = std::max<index_t>(std::min(k0 + nq, lim) - k0, 0);
            MatView<T> Vc = Vt.cols_range(j0, nq);
            CMatView<T> Pqc = Pq.cols_range(j0, nq);
            mm<T>(Op::N, Op::N, T(1), S, Pqc, T(0), Vc);  // S_{t} φ(q_t) for the keys before the chunk
            for (index_t j = 0; j < nq; ++j) n[j0 + j] = dot(Pqc.col(j), z, M);
            if (nk == 0) continue;
            CMatView<T> Pkc = Pk.cols_range(k0, nk), Vk = V.cols_range(k0, nk);
            MatView<T> A = sized(w.A, nk, nq);
            mm<T>(Op::T, Op::N, T(1), Pkc, Pqc, T(0), A);  // the chunk's keys: (Φ_k,cᵀ Φ_q,c) ⊙ Mask
            mask_upper(A);
            mm<T>(Op::N, Op::N, T(1), Vk, A, T(1), Vc);
            for (index_t j = 0; j < nq; ++j) {
                T c = 0;
                for (index_t i = 0; i < nk; ++i) c += A(i, j);
                n[j0 + j] += c;
            }
            mm<T>(Op::N, Op::T, T(1), Vk, Pkc, T(1), S);  // S, z past the chunk
            add_column_sum<T>(Pkc, z);
        }
    }
    for (index_t j = 0; j < l_x; ++j) {  // line 4: Ṽ = N diag(n)^{−1}
        const T inv = T(1) / n[j];
        T* o = Vt.col(j);
#pragma omp simd
        for (index_t i = 0; i < d_v; ++i) o[i] *= inv;
    }
}

template <class T>
void rf_attention_head_backward(const RandomFeatures<T>& f, CMatView<T> Q, CMatView<T> K, CMatView<T> V,
                                bool causal, index_t q0, CMatView<T> Vt, const T* n, CMatView<T> dVt,
                                MatView<T> dQ, MatView<T> dK, MatView<T> dV) {
    const index_t M = f.M(), l_x = Q.cols, l_z = K.cols, d_v = V.rows;
    FT_CHECK(Q.rows == f.d && K.rows == f.d && V.cols == l_z && Vt.rows == d_v && Vt.cols == l_x &&
                 dVt.rows == d_v && dVt.cols == l_x,
             "rf_attention_head_backward: shapes do not conform");
    Scratch<T>& w = scratch<T>();
    MatView<T> Pq = sized(w.Pq, M, l_x), Pk = sized(w.Pk, M, l_z);
    random_feature_map<T>(f, Q, true, Pq);  // line 1, recomputed
    random_feature_map<T>(f, K, false, Pk);
    MatView<T> G = sized(w.G, d_v, l_x);
    T* e = zeroed(w.e, l_x);
    for (index_t j = 0; j < l_x; ++j) {  // line 4 back: G ← dṼ diag(n)^{−1}, e_t ← −dṼ_tᵀ Ṽ_t / n_t
        const T inv = T(1) / n[j];
        const T* g = dVt.col(j);
        T* o = G.col(j);
        for (index_t i = 0; i < d_v; ++i) o[i] = g[i] * inv;
        e[j] = -dot(g, Vt.col(j), d_v) * inv;
    }
    MatView<T> dPq = sized(w.dPq, M, l_x), dPk = sized(w.dPk, M, l_z);
    std::fill(dPq.data, dPq.data + dPq.size(), T(0));
    std::fill(dPk.data, dPk.data + dPk.size(), T(0));
    MatView<T> S = sized(w.S, d_v, M), R = sized(w.R, d_v, M);
    T* z = zeroed(w.z, M);
    T* r = zeroed(w.r, M);
    std::fill(S.data, S.data + S.size(), T(0));
    std::fill(R.data, R.data + R.size(), T(0));
    // dΦ_k += Rᵀ V + r 1ᵀ, dV += R Φ_k on keys [k0, k0 + nk)
    auto keys_back = [&](index_t k0, index_t nk) {
        if (nk == 0) return;
        MatView<T> dPkc = dPk.cols_range(k0, nk);
        mm<T>(Op::T, Op::N, T(1), R, V.cols_range(k0, nk), T(1), dPkc);
        for (index_t j = 0; j < nk; ++j) {
            T* o = dPkc.col(j);
#pragma omp simd
            for (index_t i = 0; i < M; ++i) o[i] += r[i];
        }
        mm<T>(Op::N, Op::N, T(1), R, Pk.cols_range(k0, nk), T(1), dV.cols_range(k0, nk));
    };
    // R += G Φ_qᵀ, r += Φ_q e on queries [j0, j0 + nq)
    auto queries_into_R = [&](index_t j0, index_t nq) {
        mm<T>(Op::N, Op::T, T(1), G.cols_range(j0, nq), Pq.cols_range(j0, nq), T(1), R);
        for (index_t j = 0; j < nq; ++j) {
            const T* p = Pq.col(j0 + j);
            const T ej = e[j0 + j];
#pragma omp simd
            for (index_t i = 0; i < M; ++i) r[i] += p[i] * ej;
        }
    };
    // dΦ_q += Sᵀ G + z eᵀ on queries [j0, j0 + nq)
    auto queries_back = [&](index_t j0, index_t nq) {
        MatView<T> dPqc = dPq.cols_range(j0, nq);
        mm<T>(Op::T, Op::N, T(1), S, G.cols_range(j0, nq), T(1), dPqc);
        for (index_t j = 0; j < nq; ++j) {
            T* o = dPqc.col(j);
            const T ej = e[j0 + j];
#pragma omp simd
            for (index_t i = 0; i < M; ++i) o[i] += z[i] * ej;
        }
    };
    if (!causal) {
        mm<T>(Op::N, Op::T, T(1), V, Pk, T(0), S);  // S = V Φ_kᵀ, z = Φ_k 1 (line 2)
        add_column_sum<T>(Pk, z);
        queries_back(0, l_x);       // dΦ_q = Sᵀ G + z eᵀ
        queries_into_R(0, l_x);     // R = G Φ_qᵀ, r = Φ_q e
        keys_back(0, l_z);          // dΦ_k = Rᵀ V + r 1ᵀ, dV = R Φ_k
    } else {
        const index_t lim = std::min(l_z, q0 + l_x), pre = std::min(q0, lim);
        mm<T>(Op::N, Op::T, T(1), V.cols_range(0, pre), Pk.cols_range(0, pre), T(1), S);
        add_column_sum<T>(Pk.cols_range(0, pre), z);
        for (index_t j0 = 0; j0 < l_x; j0 += kChunk) {  // forward over the chunks: S_t, z_t (prefix sums)
            const index_t nq = std::min(kChunk, l_x - j0), k0 = q0 + j0;
            const index_t nk = std::max<index_t>(std::min(k0 + nq, lim) - k0, 0);
            queries_back(j0, nq);  // the keys before the chunk
            if (nk == 0) continue;
            CMatView<T> Pqc = Pq.cols_range(j0, nq), Pkc = Pk.cols_range(k0, nk), Vk = V.cols_range(k0, nk);
            CMatView<T> Gc = G.cols_range(j0, nq);
            MatView<T> A = sized(w.A, nk, nq), Gm = sized(w.Gm, nk, nq);
            mm<T>(Op::T, Op::N, T(1), Pkc, Pqc, T(0), A);  // the chunk's masked block, as the forward
            mask_upper(A);
            mm<T>(Op::T, Op::N, T(1), Vk, Gc, T(0), Gm);  // Gm = (V_cᵀ G_c + 1 e_cᵀ) ⊙ Mask
            for (index_t j = 0; j < nq; ++j)
                for (index_t i = 0; i < nk; ++i) Gm(i, j) = i <= j ? Gm(i, j) + e[j0 + j] : T(0);
            mm<T>(Op::N, Op::N, T(1), Pkc, Gm, T(1), dPq.cols_range(j0, nq));  // dΦ_q,c += Φ_k,c Gm
            mm<T>(Op::N, Op::T, T(1), Pqc, Gm, T(1), dPk.cols_range(k0, nk));  // dΦ_k,c += Φ_q,c Gmᵀ
            mm<T>(Op::N, Op::T, T(1), Gc, A, T(1), dV.cols_range(k0, nk));     // dV_c += G_c Aᵀ
            mm<T>(Op::N, Op::T, T(1), Vk, Pkc, T(1), S);
            add_column_sum<T>(Pkc, z);
        }
        const index_t n_chunks = (l_x + kChunk - 1) / kChunk;
        for (index_t c = n_chunks - 1; c >= 0; --c) {  // backward over the chunks: R, r of the later queries
            const index_t j0 = c * kChunk, nq = std::min(kChunk, l_x - j0), k0 = q0 + j0;
            keys_back(k0, std::max<index_t>(std::min(k0 + nq, lim) - k0, 0));
            queries_into_R(j0, nq);
        }
        keys_back(0, pre);  // the keys before the queries: seen by all
    }
    random_feature_map_backward<T>(f, Q, Pq, dPq, true, dQ);  // line 1 back (Ω fixed)
    random_feature_map_backward<T>(f, K, Pk, dPk, false, dK);
}

template <class T>
void rf_fold(const RandomFeatures<T>& f, CMatView<T> K, CMatView<T> V, FeatureState<T> s) {
    const index_t M = f.M();
    if (K.cols == 0) return;
    Scratch<T>& w = scratch<T>();
    MatView<T> Pk = sized(w.Pk, M, K.cols);
    random_feature_map<T>(f, K, false, Pk);
    mm<T>(Op::N, Op::T, T(1), V, Pk, T(1), MatView<T>(s.S, V.rows, M));  // S += V φ(K)ᵀ
    add_column_sum<T>(Pk, s.z);                                            // z += φ(K) 1
}

template <class T>
void rf_attention_weights(const RandomFeatures<T>& f, CMatView<T> Q, CMatView<T> K, bool causal, index_t q0,
                          MatView<T> A) {
    const index_t M = f.M();
    Scratch<T>& w = scratch<T>();
    MatView<T> Pq = sized(w.Pq, M, Q.cols), Pk = sized(w.Pk, M, K.cols);
    random_feature_map<T>(f, Q, true, Pq);
    random_feature_map<T>(f, K, false, Pk);
    mm<T>(Op::T, Op::N, T(1), Pk, Pq, T(0), A);
    for (index_t j = 0; j < A.cols; ++j) {
        T* a = A.col(j);
        if (causal)
            for (index_t i = std::max<index_t>(q0 + j + 1, 0); i < A.rows; ++i) a[i] = T(0);
        T sum = 0;
        for (index_t i = 0; i < A.rows; ++i) sum += a[i];
        for (index_t i = 0; i < A.rows; ++i) a[i] /= sum;
    }
}

// ------------------------------------ the head kernels "performer" and "rfa" ----------------------------------
namespace {
// V15c on every block: Y^h and the normalisers n (in c.lse), no ℓ_z×ℓ_x matrix; Ω fixed, shared by every head.
// Decoding: the keys before the cache's column 0 are folded into its state S, z (FeatureDecodeState).
template <class T>
class RandomFeatureKernel final : public HeadKernel<T> {
public:
    RandomFeatureKernel(RandomFeatures<T> f, bool causal) : f_(std::move(f)), causal_(causal) {}
    const char* name() const override { return kernel_name(f_.kind); }
    bool one_thread_blocks() const override { return true; }  // runs on the calling thread
    void begin(MHAttentionCache<T>& c, index_t H, index_t n_x) const override {
        c.keep_lse_only(H, n_x, "attention normalisers");
    }
    void forward(CMatView<T> Q, CMatView<T> K, CMatView<T> V, const HeadBlock<T>& blk, MHAttentionCache<T>& c,
                 MatView<T> Y) const override {
        FeatureState<T> s0;  // decoding: the state of key/value head g, whose keys come before K's columns
        const FeatureDecodeState<T>* st = blk.cache ? blk.cache->state.template find<FeatureDecodeState<T>>() : nullptr;
        if (st && !st->S.empty()) {
            const index_t M = f_.M();
            s0 = {const_cast<T*>(st->S.data()) + blk.g * V.rows * M, const_cast<T*>(st->z.data()) + blk.g * M};
        }
        rf_attention_head<T>(f_, Q, K, V, causal_, blk.q0, s0, Y, c.lse.data() + blk.h * blk.n_x + blk.j0);
    }
    // V15c backward per head: Φ recomputed from Q, K; Ω fixed
    void backward(CMatView<T> Q, CMatView<T> K, CMatView<T> V, CMatView<T> Y, CMatView<T> dY, const HeadBlock<T>& blk,
                  const MHAttentionCache<T>& c, MHAttentionWork<T>& w, MatView<T> dQ, MatView<T> dK,
                  MatView<T> dV) const override {
        (void)w;
        rf_attention_head_backward<T>(f_, Q, K, V, causal_, blk.q0, Y, c.lse.data() + blk.h * blk.n_x + blk.j0, dY, dQ,
                                      dK, dV);
    }
    // the weights the estimator puts on each key, Mask ⊙ φ(k)ᵀφ(q) / n
    void weights(CMatView<T> Q, CMatView<T> K, CMatView<T> V, const HeadBlock<T>& blk, const MHAttentionCache<T>& c,
                 MatView<T> A) const override {
        (void)V, (void)c;
        rf_attention_weights<T>(f_, Q, K, causal_, blk.q0, A);
    }
    // the cached columns folded into S, z (per key/value head), then dropped: O(D·d) per head however long
    void before_append(KVCache<T>& cache, index_t H_kv, index_t d_attn, index_t d_mid) const override {
        FeatureDecodeState<T>& st = cache.state.template get<FeatureDecodeState<T>>();
        const index_t M = f_.M();
        if (st.S.empty()) {
            st.S.assign(std::size_t(checked_elements({H_kv, d_mid, M}, sizeof(T), "random-feature decoding state")), T(0));
            st.z.assign(std::size_t(H_kv * M), T(0));
        }
        if (cache.len == 0) return;
        CMatView<T> K = CMatView<T>(view(cache.K)).cols_range(0, cache.len);
        CMatView<T> V = CMatView<T>(view(cache.V)).cols_range(0, cache.len);
        for (index_t g = 0; g < H_kv; ++g)
            rf_fold<T>(f_, K.rows_range(g * d_attn, d_attn), V.rows_range(g * d_mid, d_mid),
                       FeatureState<T>{st.S.data() + g * d_mid * M, st.z.data() + g * M});
        cache.start += cache.len;
        cache.len = 0;
    }

private:
    RandomFeatures<T> f_;
    bool causal_;  // the causal mask (else bidirectional: the only masks the prefix-sum form has)
};
}  // namespace

namespace {
// V15's options (the rows of 'performer' and 'rfa'): n_features = D >= 1 (None: resolve's ⌈d_attn ln d_attn⌉, at
// least d_attn: Performer's D = Θ(d log d)), Ω drawn from feature_seed; and what the kernel needs of a model: no
// score bias (ALiBi), the causal or the bidirectional mask, Algorithm 4's Q, K, V, its own kernel
template <FeatureKind kind>
void check_features(const PartOptionValues& own, const ModelConfig* c) {
    const index_t D = own.integer("n_features");
    if (!c) {  // (made directly: the factory names the kernel)
        if (D < 1) throw ValueError("n_features = " + std::to_string(D) + " must be >= 1 (the number D of random features)");
        return;
    }
    const std::string k = std::string("'") + kernel_name(kind) + "'";
    check_n_features(kind, D, c->d_attn, c->L, sizeof(float));  // V15's sizes: every layer's Ω, before a draw
    if (position_has(c->positional, PositionProperty::ScoreBias))
        throw ValueError("attention=" + k + " cannot add ALiBi's score bias (random features have no scores): "
                         "use positional='rope', 'learned' or 'sinusoidal'");
    if (const PartRow* m = chosen_part(*c, PartKind::Mask)) {
        MaskOptions o;
        o.options = c->part_options;
        if (make_mask(m->name, o).window() > 0)
            throw ValueError("attention=" + k + " needs the causal mask (prefix sums over all keys): not with the " + m->name +
                             " mask");
    }
    if (const PartRow* source = chosen_part(*c, PartKind::QKVSource))
        throw ValueError("attention=" + k + " does not combine with the '" + source->name + "' Q/K/V source (" +
                         source->options[0].name + ")");
    if (per_call_mask(c->mask))
        throw ValueError("attention=" + k + " has the causal or the bidirectional mask only: not with mask='" + c->mask + "'");
    if (c->attention_impl == AttnImpl::Tiled)
        throw ValueError("attention_impl='tiled' computes attention='softmax'; attention=" + k + " has its own kernel");
}
void complete_features(PartOptionValues& own, const ModelConfig& c) {
    if (own.integer("n_features") == 0)
        own.set("n_features", std::int64_t(std::max<index_t>(
                                  c.d_attn, index_t(std::ceil(double(c.d_attn) * std::log(double(c.d_attn)))))));
}
const std::vector<PartOption>& feature_options() {
    static const std::vector<PartOption> o = {
        {"n_features", archs::DE, OptionKind::AutoSize, std::int64_t(0), OptionCheck::None,
         "V15: the number D of random features (None: ⌈d_attn ln d_attn⌉, at least d_attn)"},
        {"feature_seed", archs::DE, OptionKind::Seed, std::uint64_t(0), OptionCheck::None,
         "V15: the seed Ω is drawn from, per layer (with the attention's name)"}};
    return o;
}
}  // namespace

// The rows of the two kernels (attention='performer', 'rfa' chooses them; they share their options)
const PartRow& performer_kernel_row() {
    static const PartRow row{PartKind::HeadKernel, "performer", feature_options(), check_features<FeatureKind::Performer>,
                             complete_features, false};
    return row;
}
const PartRow& rfa_kernel_row() {
    static const PartRow row{PartKind::HeadKernel, "rfa", feature_options(), check_features<FeatureKind::RFA>,
                             complete_features, false};
    return row;
}

namespace {
// The kernels' factory: the rows' check, then what the attention's other parts must be; Ω drawn from feature_seed
// and the attention's name.
template <class T>
std::shared_ptr<const HeadKernel<T>> make_random_feature_kernel(FeatureKind kind, const AttnPartSpec<T>& spec,
                                                                const std::string& prefix) {
    const AttnVariant& v = spec.v;
    const std::string kname = kernel_name(kind);
    const index_t D = v.options.integer("n_features");
    check_n_features(kind, D, spec.d_attn, 1, sizeof(T));  // V15's sizes: one rule
    check_features<FeatureKind::Performer>(v.options, nullptr);  // (its own options: the same for both kinds)
    const std::string mn = spec.mask ? spec.mask->name() : "";
    if (mn != "bidirectional" && mn != "unidirectional")
        throw ValueError("attention='" + kname + "' needs the bidirectional or the causal mask (prefix sums), got '" + mn + "'");
    if (spec.position && spec.position->bias)
        throw ValueError("attention='" + kname + "': the position part '" + v.position +
                         "' is a score bias, which random features cannot add (use rope or a table of positions)");
    if (v.impl == AttnImpl::Tiled)
        throw ValueError("attention_impl 'tiled' computes attention='softmax'; attention='" + kname + "' has its own kernel");
    return std::make_shared<const RandomFeatureKernel<T>>(
        draw_random_features<T>(kind, D, spec.d_attn, v.options.seed("feature_seed"), prefix), mn == "unidirectional");
}
}  // namespace

// The registry's factories (registry.cpp) of "performer" and "rfa"
template <class T>
std::shared_ptr<const HeadKernel<T>> make_performer_kernel(const AttnPartSpec<T>& spec, const std::string& prefix) {
    return make_random_feature_kernel<T>(FeatureKind::Performer, spec, prefix);
}
template <class T>
std::shared_ptr<const HeadKernel<T>> make_rfa_kernel(const AttnPartSpec<T>& spec, const std::string& prefix) {
    return make_random_feature_kernel<T>(FeatureKind::RFA, spec, prefix);
}

#define FT_INSTANTIATE(T)                                                                                        \
    template RandomFeatures<T> draw_random_features<T>(FeatureKind, index_t, index_t, std::uint64_t,             \
                                                       const std::string&);                                      \
    template std::shared_ptr<const HeadKernel<T>> make_performer_kernel<T>(const AttnPartSpec<T>&, const std::string&); \
    template std::shared_ptr<const HeadKernel<T>> make_rfa_kernel<T>(const AttnPartSpec<T>&, const std::string&); \
    template void random_feature_map<T>(const RandomFeatures<T>&, CMatView<T>, bool, MatView<T>);                \
    template void random_feature_map_backward<T>(const RandomFeatures<T>&, CMatView<T>, CMatView<T>, CMatView<T>, \
                                                 bool, MatView<T>);                                              \
    template void rf_attention_head<T>(const RandomFeatures<T>&, CMatView<T>, CMatView<T>, CMatView<T>, bool,     \
                                       index_t, FeatureState<T>, MatView<T>, T*);                               \
    template void rf_attention_head_backward<T>(const RandomFeatures<T>&, CMatView<T>, CMatView<T>, CMatView<T>,  \
                                                bool, index_t, CMatView<T>, const T*, CMatView<T>, MatView<T>,   \
                                                MatView<T>, MatView<T>);                                         \
    template void rf_fold<T>(const RandomFeatures<T>&, CMatView<T>, CMatView<T>, FeatureState<T>);               \
    template void rf_attention_weights<T>(const RandomFeatures<T>&, CMatView<T>, CMatView<T>, bool, index_t,      \
                                          MatView<T>);
FT_INSTANTIATE(float)
FT_INSTANTIATE(double)
#undef FT_INSTANTIATE

}  // namespace ft
