// Mixed precision's products (precision.hpp): bf16 × bf16 → float32 through oneDNN, or, without bf16
// instructions, float32 products of the rounded operands through the BLAS.
#include "formal_transformers/precision.hpp"

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <string>

#include "formal_transformers/blas.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#ifdef FT_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#include <oneapi/dnnl/dnnl_version.h>
#endif

namespace ft {

const char* precision_name(Precision p) { return p == Precision::BF16Mixed ? "bf16-mixed" : "float32"; }

Precision parse_precision(const std::string& name) {
    if (name == "float32") return Precision::Float32;
    if (name == "bf16-mixed") return Precision::BF16Mixed;
    throw ValueError("precision must be 'float32' or 'bf16-mixed', got '" + name + "'");
}

namespace {
thread_local ProductContext tl_context;
}  // namespace

ProductContext product_context() { return tl_context; }
ProductScope::ProductScope(ProductContext c) : saved_(tl_context) { tl_context = c; }
ProductScope::~ProductScope() { tl_context = saved_; }

void Bf16Weights::refresh(const float* theta, index_t size) {
    begin = theta;
    n = size;
    bits.resize(std::size_t(size));
    std::uint16_t* out = bits.data();
#pragma omp parallel for schedule(static) if (size > (index_t(1) << 18))
    for (index_t i = 0; i < size; ++i) out[i] = to_bf16(theta[i]);
}

// ------------------------------------------------------------------------------------------------ the CPU
bool cpu_has_avx512_bf16() {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
    return (a >> 5) & 1u;  // CPUID.(EAX=7, ECX=1):EAX[5]
#else
    return false;
#endif
}

bool cpu_has_amx_bf16() {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    return (d >> 22) & 1u;  // CPUID.(EAX=7, ECX=0):EDX[22]
#else
    return false;
#endif
}

namespace {
bool& native_allowed() {  // tests turn the native path off to check the emulated one on the same machine
    static bool on = true;
    return on;
}
}  // namespace

#ifdef FT_HAVE_ONEDNN
namespace {
dnnl::engine& engine() {
    static dnnl::engine e(dnnl::engine::kind::cpu, 0);
    return e;
}

// One matmul per shape, layout, α and β, made on first use (thread-local: no lock on the hot path).
using Key = std::array<std::int64_t, 10>;
struct Prim {
    dnnl::matmul mm;
    dnnl::memory::desc src, wei, dst;
    std::string impl;
};

// C (column-major m × n, ldc) = α op(A) op(B) + β C computed as its transpose, row-major n × m:
//   dst = C^T [n, m],  src = op(B)^T [n, k],  weights = op(A)^T [k, m]
Prim make_prim(const Key& key) {
    using dt = dnnl::memory::data_type;
    const auto n = key[0], m = key[1], k = key[2];
    dnnl::memory::desc src({n, k}, dt::bf16, {key[3], key[4]});
    dnnl::memory::desc wei({k, m}, dt::bf16, {key[5], key[6]});
    dnnl::memory::desc dst({n, m}, dt::f32, {key[7], 1});
    float alpha, beta;
    std::memcpy(&alpha, &key[8], 4);
    std::memcpy(&beta, &key[9], 4);
    dnnl::primitive_attr attr;
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (beta != 0.0f) {
        dnnl::post_ops po;
        po.append_sum(beta);
        attr.set_post_ops(po);
    }
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, wei, dst), attr, engine());
    return Prim{dnnl::matmul(pd), src, wei, dst, pd.impl_info_str()};
}

std::string& last_impl() {
    static std::string s;
    return s;
}

void run_onednn(int ta, int tb, index_t m, index_t n, index_t k, float alpha, const std::uint16_t* a, index_t lda,
                const std::uint16_t* b, index_t ldb, float beta, float* C, index_t ldc) {
    thread_local std::map<Key, Prim> cache;
    thread_local dnnl::stream stream(engine());
    Key key{};
    key[0] = n, key[1] = m, key[2] = k;
    // src = op(B)^T: element (j, p) = op(B)(p, j)
    if (tb == 0) key[3] = ldb, key[4] = 1;  // B(p, j) at p + j ldb
    else key[3] = 1, key[4] = ldb;          // B(j, p) at j + p ldb
    // weights = op(A)^T: element (p, i) = op(A)(i, p)
    if (ta == 0) key[5] = lda, key[6] = 1;  // A(i, p) at i + p lda
    else key[5] = 1, key[6] = lda;          // A(p, i) at p + i lda
    key[7] = ldc;
    std::int64_t ab = 0, bb = 0;
    std::memcpy(&ab, &alpha, 4);
    std::memcpy(&bb, &beta, 4);
    key[8] = ab, key[9] = bb;
    auto it = cache.find(key);
    if (it == cache.end()) {
        if (cache.size() > 4096) cache.clear();  // shapes of a long session of different models
        it = cache.emplace(key, make_prim(key)).first;
        static std::mutex mu;
        std::lock_guard<std::mutex> lock(mu);
        last_impl() = it->second.impl;
    }
    Prim& p = it->second;
    dnnl::memory ms(p.src, engine(), const_cast<std::uint16_t*>(b));
    dnnl::memory mw(p.wei, engine(), const_cast<std::uint16_t*>(a));
    dnnl::memory md(p.dst, engine(), C);
    p.mm.execute(stream, {{DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, md}});
    stream.wait();
}
}  // namespace
#endif

bool bf16_native() {
#ifdef FT_HAVE_ONEDNN
    return native_allowed() && (cpu_has_avx512_bf16() || cpu_has_amx_bf16());
#else
    return false;
#endif
}

// for the tests: run the emulated path (rounded operands, float32 products) even where bf16 instructions exist
void bf16_allow_native(bool on) { native_allowed() = on; }

std::string bf16_info() {
    std::string s = "bf16: AVX512_BF16 ";
    s += cpu_has_avx512_bf16() ? "yes" : "no";
    s += ", AMX-BF16 ";
    s += cpu_has_amx_bf16() ? "yes" : "no";
#ifdef FT_HAVE_ONEDNN
    const dnnl_version_t* v = dnnl_version();
    s += "; bf16-mixed products: ";
    if (bf16_native()) {
        s += "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
        const std::string impl = last_impl();
        s += impl.empty() ? "" : " (" + impl + ")";
    } else {
        s += "emulated (bf16-rounded operands, float32 products through the BLAS";
        s += native_allowed() ? ": this CPU has no bf16 instructions)" : ": native path off)";
    }
#else
    s += "; bf16-mixed products: emulated (bf16-rounded operands, float32 products through the BLAS: built without oneDNN)";
#endif
    return s;
}

namespace {
// op's operand X (rows × cols, column-major, ld) as bf16: θ's copy when the context has one and X lies in
// θ, else rounded into `scratch` (column-major, ld = rows)
const std::uint16_t* bf16_operand(const float* X, index_t rows, index_t cols, index_t& ld,
                                  std::vector<std::uint16_t>& scratch) {
    const ProductContext c = product_context();
    if (c.weights) {
        const std::uint16_t* first = c.weights->find(X);
        if (first && c.weights->find(X + (cols - 1) * ld + rows - 1)) return first;
    }
    scratch.resize(std::size_t(rows * cols));
    std::uint16_t* out = scratch.data();
    const index_t ldx = ld;
#pragma omp parallel for schedule(static) if (rows * cols > (index_t(1) << 16) && !omp_in_parallel())
    for (index_t j = 0; j < cols; ++j)
        for (index_t i = 0; i < rows; ++i) out[i + j * rows] = to_bf16(X[i + j * ldx]);
    ld = rows;
    return out;
}

// A weight from θ's bf16 copy times a few columns (decoding: one token per sequence, n ≤ kBf16FewColumns). oneDNN's
// matmul is tuned for many columns: with one it is no faster than float32 gemv, and it makes a new primitive for
// every new shape. Decoding is bound by reading the weights, so this loop reads their bf16 copy once (half the
// bytes of float32) and converts in registers; float32 accumulation, the columns of op(B) rounded to bf16.
//   op(A) = A (A: m × k, column p contiguous): C[:, j] = α Σ_p A[:, p] b_pj + β C[:, j], in row blocks kept in L1
//   op(A) = Aᵀ (A: k × m, column i contiguous): C[i, j] = α dot(A[:, i], B[:, j]) + β C[i, j], 16 lanes of partials
constexpr index_t kBf16FewColumns = 8, kRowBlock = 512;

void few_columns(int ta, index_t m, index_t n, index_t k, float alpha, const std::uint16_t* A, index_t lda,
                 const float* Bq, float beta, float* C, index_t ldc) {  // Bq: op(B) rounded, k × n, ld = k
    if (ta == 0) {
        // row tiles of kRowBlock (parallel); in each, 8 columns of A at a time (8 contiguous streams), every
        // column of C accumulated in an L1-resident tile
        const index_t tiles = (m + kRowBlock - 1) / kRowBlock;
#pragma omp parallel for schedule(static) if (m * k > (index_t(1) << 18) && !omp_in_parallel())
        for (index_t it = 0; it < tiles; ++it) {
            const index_t i0 = it * kRowBlock, w = std::min(kRowBlock, m - i0);
            float acc[kBf16FewColumns][kRowBlock];
            for (index_t j = 0; j < n; ++j)
                for (index_t i = 0; i < w; ++i) acc[j][i] = 0.0f;
            index_t p = 0;
            for (; p + 8 <= k; p += 8) {
                const std::uint16_t* a0 = A + i0 + p * lda;
                const std::uint16_t *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda, *a4 = a3 + lda, *a5 = a4 + lda,
                                    *a6 = a5 + lda, *a7 = a6 + lda;
                for (index_t j = 0; j < n; ++j) {
                    const float* b = Bq + p + j * k;
                    float* s = acc[j];
#pragma omp simd
                    for (index_t i = 0; i < w; ++i)
                        s[i] += from_bf16(a0[i]) * b[0] + from_bf16(a1[i]) * b[1] + from_bf16(a2[i]) * b[2] +
                                from_bf16(a3[i]) * b[3] + from_bf16(a4[i]) * b[4] + from_bf16(a5[i]) * b[5] +
                                from_bf16(a6[i]) * b[6] + from_bf16(a7[i]) * b[7];
                }
            }
            for (; p < k; ++p) {
                const std::uint16_t* a = A + i0 + p * lda;
                for (index_t j = 0; j < n; ++j) {
                    const float b = Bq[p + j * k];
                    float* s = acc[j];
#pragma omp simd
                    for (index_t i = 0; i < w; ++i) s[i] += from_bf16(a[i]) * b;
                }
            }
            for (index_t j = 0; j < n; ++j)
                for (index_t i = 0; i < w; ++i) {
                    float& c = C[i0 + i + j * ldc];
                    c = alpha * acc[j][i] + (beta == 0.0f ? 0.0f : beta * c);
                }
        }
        return;
    }
#pragma omp parallel for schedule(static) if (m * k > (index_t(1) << 18) && !omp_in_parallel())
    for (index_t i = 0; i < m; ++i) {
        const std::uint16_t* a = A + i * lda;
        for (index_t j = 0; j < n; ++j) {
            const float* b = Bq + j * k;
            float part[16] = {};
            index_t p = 0;
            for (; p + 16 <= k; p += 16)
#pragma omp simd
                for (index_t l = 0; l < 16; ++l) part[l] += from_bf16(a[p + l]) * b[p + l];
            float s = 0.0f;
            for (index_t l = 0; l < 16; ++l) s += part[l];
            for (; p < k; ++p) s += from_bf16(a[p]) * b[p];
            float& c = C[i + j * ldc];
            c = alpha * s + (beta == 0.0f ? 0.0f : beta * c);
        }
    }
}

// the emulated path: X rounded to bf16, kept as float32 (column-major, ld = rows)
const float* rounded_operand(const float* X, index_t rows, index_t cols, index_t& ld, std::vector<float>& scratch) {
    scratch.resize(std::size_t(rows * cols));
    float* out = scratch.data();
    const index_t ldx = ld;
#pragma omp parallel for schedule(static) if (rows * cols > (index_t(1) << 16) && !omp_in_parallel())
    for (index_t j = 0; j < cols; ++j)
        for (index_t i = 0; i < rows; ++i) out[i + j * rows] = round_bf16(X[i + j * ldx]);
    ld = rows;
    return out;
}
}  // namespace

void gemm_bf16(int ta, int tb, index_t m, index_t n, index_t k, float alpha, const float* A, index_t lda,
               const float* B, index_t ldb, float beta, float* C, index_t ldc) {
    // stored shapes of A and B (column-major): op(A) is m × k, op(B) is k × n
    const index_t ar = ta == 0 ? m : k, ac = ta == 0 ? k : m;
    const index_t br = tb == 0 ? k : n, bc = tb == 0 ? n : k;
    const ProductContext ctx = product_context();
    if (ctx.weights && n <= kBf16FewColumns && ctx.weights->find(A) && ctx.weights->find(A + (ac - 1) * lda + ar - 1)) {
        thread_local std::vector<float> bq;  // op(B) rounded, k × n
        bq.resize(std::size_t(k * n));
        for (index_t j = 0; j < n; ++j)
            for (index_t p = 0; p < k; ++p) bq[std::size_t(p + j * k)] = round_bf16(tb == 0 ? B[p + j * ldb] : B[j + p * ldb]);
        few_columns(ta, m, n, k, alpha, ctx.weights->find(A), lda, bq.data(), beta, C, ldc);
        return;
    }
#ifdef FT_HAVE_ONEDNN
    // oneDNN for products worth a primitive; the small ones (decoding's per-head products over a growing cache,
    // a new shape at every token) emulated, without making a primitive for each
    if (bf16_native() && double(m) * double(n) * double(k) >= double(1 << 18)) {
        thread_local std::vector<std::uint16_t> sa, sb;
        const std::uint16_t* a = bf16_operand(A, ar, ac, lda, sa);
        const std::uint16_t* b = bf16_operand(B, br, bc, ldb, sb);
        run_onednn(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, C, ldc);
        return;
    }
#endif
    thread_local std::vector<float> fa, fb;
    const float* a = rounded_operand(A, ar, ac, lda, fa);
    const float* b = rounded_operand(B, br, bc, ldb, fb);
    ProductScope f32(ProductContext{});  // the products themselves in float32
    gemm<float>(ta == 0 ? Op::N : Op::T, tb == 0 ? Op::N : Op::T, alpha, CMatView<float>(a, ar, ac, lda),
                CMatView<float>(b, br, bc, ldb), beta, MatView<float>(C, m, n, ldc));
}

}  // namespace ft
