// Mixed precision's products (precision.hpp): bf16 × bf16 → float32 through oneDNN, or, without bf16
// instructions, float32 products of the rounded operands through the BLAS.
#include "formal_transformers/precision.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "formal_transformers/bf16_products.hpp"
#include "formal_transformers/blas.hpp"
#include "formal_transformers/paged.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
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
// (below) a training context's root of Bf16Regions on this thread: it carries the affine inputs this thread keeps
// (Bf16AffineInput) and, through the parallel regions that carry the context, hears of every product's result
const Bf16Regions* training_root(const ProductContext& c);
bool owns_root(const Bf16Regions* r);
void end_training_call();
}  // namespace

ProductContext product_context() { return tl_context; }
ProductScope::ProductScope(ProductContext c) : saved_(tl_context) {
    if (c.bf16 && c.training && !c.regions) c.regions = training_root(c);
    tl_context = c;
}
ProductScope::~ProductScope() {
    if (owns_root(tl_context.regions) && !owns_root(saved_.regions)) end_training_call();  // the call's kept inputs end
    tl_context = saved_;
}

namespace {
std::atomic<std::uint64_t> copies{0};

// θ's digest: bytes_digest (paged.hpp) of fixed chunks in parallel, then of the chunks' digests
std::uint64_t theta_bytes_digest(const float* x, index_t n) {
    constexpr index_t kChunk = index_t(1) << 18;
    const index_t chunks = (n + kChunk - 1) / kChunk;
    std::vector<std::uint64_t> h(std::size_t(chunks) + 1, std::uint64_t(n));
#pragma omp parallel for schedule(static) if (chunks > 1 && !omp_in_parallel())
    for (index_t c = 0; c < chunks; ++c)
        h[std::size_t(c)] = bytes_digest(x + c * kChunk, std::size_t(std::min(kChunk, n - c * kChunk)) * sizeof(float));
    return bytes_digest(h.data(), h.size() * sizeof(std::uint64_t));
}
}  // namespace

std::uint64_t bf16_theta_copies() { return copies.load(); }

bool Bf16Weights::update(const float* theta, index_t size) {
    const std::uint64_t d = theta_bytes_digest(theta, size);
    if (theta == begin && size == n && d == digest && index_t(bits.size()) == size) return false;
    refresh(theta, size);
    digest = d;
    return true;
}

void Bf16Weights::refresh(const float* theta, index_t size) {
    ++copies;
    digest = 0;
    begin = theta;
    n = size;
    bits.resize(std::size_t(size));
    std::uint16_t* out = bits.data();
#pragma omp parallel for schedule(static) if (size > (index_t(1) << 18) && !omp_in_parallel())
    for (index_t i = 0; i < size; ++i) out[i] = to_bf16(theta[i]);
}

namespace {
// to_bf16 without a branch (the loops below vectorise)
inline std::uint16_t bf16_bits(float x) {
    std::uint32_t u;
    std::memcpy(&u, &x, 4);
    const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, nan = (u >> 16) | 0x40u;
    return std::uint16_t((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}
bool& theta_copy_allowed() {
    static bool on = true;
    return on;
}
}  // namespace

void bf16_allow_theta_copy(bool on) { theta_copy_allowed() = on; }
bool bf16_theta_copy_allowed() { return theta_copy_allowed(); }

bool Bf16Weights::write(const float* theta, index_t size, index_t i0, index_t i1) {
    if (theta != begin || size != n || index_t(bits.size()) != size) return false;
    std::uint16_t* out = bits.data();
#pragma omp simd
    for (index_t i = i0; i < i1; ++i) out[i] = bf16_bits(theta[i]);
    return true;
}

bool Bf16Weights::sync(const float* theta, index_t size) {
    if (theta != begin || size != n || index_t(bits.size()) != size) {
        refresh(theta, size);
        return true;
    }
    // chunks of 16 K entries: compared (read only), rewritten only where one differs
    constexpr index_t kChunk = index_t(1) << 14;
    const index_t chunks = (size + kChunk - 1) / kChunk;
    std::uint16_t* out = bits.data();
    int changed = 0;
#pragma omp parallel for schedule(static) reduction(| : changed) if (chunks > 4 && !omp_in_parallel())
    for (index_t c = 0; c < chunks; ++c) {
        const index_t i0 = c * kChunk, i1 = std::min(size, i0 + kChunk);
        int diff = 0;
#pragma omp simd reduction(| : diff)
        for (index_t i = i0; i < i1; ++i) diff |= int(bf16_bits(theta[i]) != out[i]);
        if (!diff) continue;
        changed = 1;
#pragma omp simd
        for (index_t i = i0; i < i1; ++i) out[i] = bf16_bits(theta[i]);
    }
    digest = 0;
    if (changed) ++copies;
    return changed != 0;
}

// ------------------------------------------------------------------------------------------------ the CPU
// CPUID once per process: in a virtual machine each CPUID traps to the hypervisor (microseconds), and gemm asks
// on every product (it was 18% of the baby GPT's bf16 step before these were cached)
bool cpu_has_avx512_bf16() {
#if defined(__x86_64__) || defined(__i386__)
    static const bool has = [] {
        unsigned a, b, c, d;
        if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
        return bool((a >> 5) & 1u);  // CPUID.(EAX=7, ECX=1):EAX[5]
    }();
    return has;
#else
    return false;
#endif
}

bool cpu_has_amx_bf16() {
#if defined(__x86_64__) || defined(__i386__)
    static const bool has = [] {
        unsigned a, b, c, d;
        if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
        return bool((d >> 22) & 1u);  // CPUID.(EAX=7, ECX=0):EDX[22]
    }();
    return has;
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
using Key = std::array<std::int64_t, 11>;  // … key[10]: 1 with a bias (b 1ᵀ added)
struct Prim {
    dnnl::matmul mm;
    dnnl::memory::desc src, wei, dst;
    std::string impl;
    // made once, their data handles set at each call (small products: less overhead)
    dnnl::memory src_mem, wei_mem, dst_mem, bias_mem;
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
    // the bias of C's rows, b 1ᵀ: in the transposed problem one row [1, m] broadcast over dst's n rows
    dnnl::memory::desc bias({1, m}, dt::f32, {m, 1});
    const dnnl::matmul::desc d = key[10] ? dnnl::matmul::desc(src, wei, bias, dst) : dnnl::matmul::desc(src, wei, dst);
    dnnl::matmul::primitive_desc pd(d, attr, engine());
    return Prim{dnnl::matmul(pd), src, wei, dst, pd.impl_info_str(), dnnl::memory(src, engine(), nullptr),
                dnnl::memory(wei, engine(), nullptr), dnnl::memory(dst, engine(), nullptr),
                dnnl::memory(bias, engine(), nullptr)};
}

std::string& last_impl() {
    static std::string s;
    return s;
}

void run_onednn(int ta, int tb, index_t m, index_t n, index_t k, float alpha, const std::uint16_t* a, index_t lda,
                const std::uint16_t* b, index_t ldb, float beta, float* C, index_t ldc, const float* bias = nullptr) {
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
    key[10] = bias != nullptr;
    auto it = cache.find(key);
    if (it == cache.end()) {
        if (cache.size() > 4096) cache.clear();  // shapes of a long session of different models
        it = cache.emplace(key, make_prim(key)).first;
        static std::mutex mu;
        std::lock_guard<std::mutex> lock(mu);
        last_impl() = it->second.impl;
    }
    Prim& p = it->second;
    p.src_mem.set_data_handle(const_cast<std::uint16_t*>(b));
    p.wei_mem.set_data_handle(const_cast<std::uint16_t*>(a));
    p.dst_mem.set_data_handle(C);
    // the C API's execute: an array of arguments (the C++ one builds a hash map of them at every call)
    if (bias) p.bias_mem.set_data_handle(const_cast<float*>(bias));
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, p.src_mem.get()}, {DNNL_ARG_WEIGHTS, p.wei_mem.get()},
                               {DNNL_ARG_DST, p.dst_mem.get()}, {DNNL_ARG_BIAS, p.bias_mem.get()}};
    dnnl::error::wrap_c_api(dnnl_primitive_execute(p.mm.get(), stream.get(), bias ? 4 : 3, args), "oneDNN matmul");
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
// A buffer that grows without writing its new entries (each use writes what it then reads): a resize of a
// std::vector zero-filled the growth at every product whose operand was larger than the previous one
struct Bf16Buffer {
    std::unique_ptr<std::uint16_t[]> p;
    std::size_t cap = 0;
    std::uint16_t* get(std::size_t n) {
        if (n > cap) p.reset(new std::uint16_t[n]), cap = n;
        return p.get();
    }
};

// X (rows × cols, column-major, ld) rounded into out (column-major, ld = rows). Small operands (the per-head
// products of attention, ~2 K entries) on the calling thread without entering a parallel region, and one flat
// loop where X is contiguous.
constexpr index_t kParallelRound = index_t(1) << 16;
std::atomic<std::uint64_t> operands_rounded{0};
void round_into(const float* X, index_t rows, index_t cols, index_t ld, std::uint16_t* out) {
    operands_rounded.fetch_add(1, std::memory_order_relaxed);
    const bool flat = ld == rows || cols == 1;
    if (rows * cols > kParallelRound) {
        if (flat) {
            const index_t n = rows * cols, chunk = index_t(1) << 14, chunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (!omp_in_parallel())
            for (index_t c = 0; c < chunks; ++c) {
                const index_t i1 = std::min(n, (c + 1) * chunk);
#pragma omp simd
                for (index_t i = c * chunk; i < i1; ++i) out[i] = bf16_bits(X[i]);
            }
            return;
        }
#pragma omp parallel for schedule(static) if (!omp_in_parallel())
        for (index_t j = 0; j < cols; ++j) {
            const float* x = X + j * ld;
            std::uint16_t* o = out + j * rows;
#pragma omp simd
            for (index_t i = 0; i < rows; ++i) o[i] = bf16_bits(x[i]);
        }
        return;
    }
    if (flat) {
        const index_t n = rows * cols;
#pragma omp simd
        for (index_t i = 0; i < n; ++i) out[i] = bf16_bits(X[i]);
        return;
    }
    for (index_t j = 0; j < cols; ++j) {
        const float* x = X + j * ld;
        std::uint16_t* o = out + j * rows;
#pragma omp simd
        for (index_t i = 0; i < rows; ++i) o[i] = bf16_bits(x[i]);
    }
}

// Operands rounded once for several products (Bf16OperandReuse): a few entries, each the rounding of one operand
// (its address and shape) in a buffer of its own, valid until a product's result overlaps it or the outermost
// scope ends.
struct ReuseEntry {
    const float* x = nullptr;
    index_t rows = 0, cols = 0, ld = 0;
    Bf16Buffer buf;
    std::uint64_t used = 0;
};
struct ReuseCache {
    int depth = 0;
    std::uint64_t clock = 0;
    std::array<ReuseEntry, 4> e;
    void clear() {
        for (ReuseEntry& r : e) r.x = nullptr;
    }
    // the entry of X, rounded now unless it already was
    const std::uint16_t* get(const float* X, index_t rows, index_t cols, index_t ld) {
        ReuseEntry* slot = &e[0];
        for (ReuseEntry& r : e) {
            if (r.x == X && r.rows == rows && r.cols == cols && r.ld == ld) {
                r.used = ++clock;
                return r.buf.p.get();
            }
            if (!r.x) slot = &r;
            else if (slot->x && r.used < slot->used) slot = &r;
        }
        std::uint16_t* out = slot->buf.get(std::size_t(rows * cols));
        round_into(X, rows, cols, ld, out);
        slot->x = X, slot->rows = rows, slot->cols = cols, slot->ld = ld, slot->used = ++clock;
        return out;
    }
    // a product has written C (m × n, ldc): the entries it overlaps are stale
    void written(const float* C, index_t m, index_t n, index_t ldc) {
        const float* c1 = C + (n - 1) * ldc + m;
        for (ReuseEntry& r : e)
            if (r.x && r.x < c1 && C < r.x + (r.cols - 1) * r.ld + r.rows) r.x = nullptr;
    }
};
ReuseCache& reuse_cache() {
    thread_local ReuseCache c;
    return c;
}

}  // namespace

// The affine inputs kept from their forward product for their backward's dW (Bf16AffineInput): one entry per (W, X,
// shape) of the training call, valid until a product writes over X, its backward reads it or the call ends. Only its
// thread changes the entries (outside parallel regions); products on other threads mark them stale (atomics).
struct KeptInputs {
    struct Entry {
        const float* W = nullptr;
        const float* x = nullptr;
        index_t rows = 0, cols = 0, ld = 0;
        Bf16Buffer bits;
        std::atomic<bool> valid{false};
    };
    std::vector<std::unique_ptr<Entry>> e;
    std::atomic<int> live{0};  // how many are valid (no scan while none)
    void invalidate(Entry& x) {
        if (x.valid.exchange(false)) live.fetch_sub(1);
    }
    void written(const float* C, const float* c1) {
        if (live.load(std::memory_order_relaxed) == 0) return;
        for (const auto& g : e)
            if (g->valid.load(std::memory_order_relaxed) && g->x < c1 && C < g->x + (g->cols - 1) * g->ld + g->rows)
                invalidate(*g);
    }
    Entry* find(const float* W, const float* X, index_t rows, index_t cols, index_t ld) {
        if (live.load(std::memory_order_relaxed) == 0) return nullptr;
        for (const auto& g : e)
            if (g->valid.load() && g->W == W && g->x == X && g->rows == rows && g->cols == cols && g->ld == ld)
                return g.get();
        return nullptr;
    }
    // the entry that keeps X's rounding now: its own if valid, else the free buffer that fits best, else a new one
    Entry& take(const float* W, const float* X, index_t rows, index_t cols, index_t ld) {
        Entry* best = find(W, X, rows, cols, ld);
        if (!best) {
            const std::size_t n = std::size_t(rows * cols);
            for (const auto& g : e) {
                if (g->valid.load()) continue;
                const std::size_t c = g->bits.cap, b = best ? best->bits.cap : 0;
                if (!best || (c >= n ? (b < n || c < b) : (b < n && c > b))) best = g.get();
            }
            if (!best) best = e.emplace_back(std::make_unique<Entry>()).get();
            best->W = W, best->x = X, best->rows = rows, best->cols = cols, best->ld = ld;
        }
        return *best;
    }
    void drop() {
        for (const auto& g : e) invalidate(*g);
    }
};

// Matrices rounded once for a scope's products (Bf16RoundOnce). A region of rows × cols (ld) in row blocks of
// `block` rows: block r's rounding is a column-major block × cols matrix (ld = block) at bits + r·block·cols. A
// product whose result overlaps a region makes it stale (the scope's promise broken: rounding per product again
// rather than a wrong operand).
struct Bf16Regions {
    struct Region {
        const float* x = nullptr;
        index_t rows = 0, cols = 0, ld = 0, block = 0;
        Bf16Buffer bits;
        std::atomic<bool> stale{false};
    };
    std::vector<std::unique_ptr<Region>> r;
    const Bf16Regions* outer = nullptr;  // an enclosing scope's
    KeptInputs* kept = nullptr;          // (a training call's root) the affine inputs kept by its thread
    // the rounding of X (rows × cols, ld) when it lies inside one row block of a region: its first entry, the
    // block's height in ld
    const std::uint16_t* find(const float* X, index_t rows, index_t cols, index_t& ld) const {
        for (const Bf16Regions* s = this; s; s = s->outer)
            for (const auto& g : s->r) {
                if (X < g->x || (g->ld != ld && cols > 1) || g->stale.load(std::memory_order_relaxed)) continue;
                const index_t o = index_t(X - g->x), i = o % g->ld, j = o / g->ld, b = i / g->block, i_b = i % g->block;
                if (i < g->rows && i_b + rows <= g->block && j + cols <= g->cols) {
                    ld = g->block;
                    return g->bits.p.get() + b * g->block * g->cols + i_b + j * g->block;
                }
            }
        return nullptr;
    }
    void written(const float* C, index_t m, index_t n, index_t ldc) const {
        const float* c1 = C + (n - 1) * ldc + m;
        for (const Bf16Regions* s = this; s; s = s->outer) {
            for (const auto& g : s->r)
                if (g->x < c1 && C < g->x + (g->cols - 1) * g->ld + g->rows) g->stale.store(true);
            if (s->kept) s->kept->written(C, c1);
        }
    }
};

namespace {
// op's operand X (rows × cols, column-major, ld) as bf16: θ's copy when the context has one and X lies in
// θ, the rounding of a Bf16RoundOnce scope's matrix when X lies in one, else its rounding (column-major, ld = rows): kept for the next products inside a Bf16OperandReuse scope,
// else in `scratch`
[[maybe_unused]] const std::uint16_t* bf16_operand(const ProductContext& c, const float* X, index_t rows,
                                                   index_t cols, index_t& ld, Bf16Buffer& scratch) {
    if (c.weights) {
        const std::uint16_t* first = c.weights->find(X);
        if (first && c.weights->find(X + (cols - 1) * ld + rows - 1)) return first;
    }
    if (c.regions)
        if (const std::uint16_t* kept = c.regions->find(X, rows, cols, ld)) return kept;
    ReuseCache& rc = reuse_cache();
    const index_t ldx = ld;
    ld = rows;
    if (rc.depth > 0) return rc.get(X, rows, cols, ldx);
    std::uint16_t* out = scratch.get(std::size_t(rows * cols));
    round_into(X, rows, cols, ldx, out);
    return out;
}
}  // namespace

std::uint64_t bf16_operands_rounded() { return operands_rounded.load(); }

namespace {
bool& kept_inputs_allowed() {
    static bool on = true;
    return on;
}
std::atomic<std::uint64_t> kept_reads{0};
thread_local KeptInputs tl_kept;
Bf16Regions& own_root() {
    thread_local Bf16Regions root = [] {
        Bf16Regions r;
        r.kept = &tl_kept;
        return r;
    }();
    return root;
}
const Bf16Regions* training_root(const ProductContext& c) {
    (void)c;
    return kept_inputs_allowed() && bf16_native() ? &own_root() : nullptr;
}
bool owns_root(const Bf16Regions* r) { return r && r == &own_root(); }
// the affine inputs this thread keeps when r is (or lies inside a Bf16RoundOnce scope of) its training call's root
KeptInputs* own_kept(const Bf16Regions* r) {
    for (; r; r = r->outer)
        if (r->kept) return owns_root(r) ? r->kept : nullptr;
    return nullptr;
}
void end_training_call() { tl_kept.drop(); }
bool in_parallel() {
#ifdef _OPENMP
    return omp_in_parallel();
#else
    return false;
#endif
}
// this thread's Bf16AffineInput: 0 none, 1 Keep, 2 Read; the affine map's W
thread_local int tl_input_role = 0;
thread_local const float* tl_input_W = nullptr;

// op(B) (X: rows × cols, ld; tb: op(B) = Xᵀ) as bf16 under this thread's Bf16AffineInput: Keep (op(B) = X) rounds it
// into the entry of (W, X) and keeps it; Read (op(B) = Xᵀ) reads that entry once if it is still valid. Else, and
// outside the calling thread's training call or inside a parallel region, bf16_operand.
[[maybe_unused]] const std::uint16_t* affine_input(const ProductContext& c, const float* X, index_t rows, index_t cols,
                                                   index_t& ld, Bf16Buffer& scratch, int tb) {
    const int role = tl_input_role;
    KeptInputs* kept = role == 0 || (role == 1) != (tb == 0) || in_parallel() ? nullptr : own_kept(c.regions);
    if (!kept) return bf16_operand(c, X, rows, cols, ld, scratch);
    if (c.weights && c.weights->find(X)) return bf16_operand(c, X, rows, cols, ld, scratch);  // inside θ: its copy
    index_t l = ld;
    if (c.regions->find(X, rows, cols, l)) return bf16_operand(c, X, rows, cols, ld, scratch);  // a Bf16RoundOnce's
    KeptInputs& k = *kept;
    if (role == 1) {
        KeptInputs::Entry& e = k.take(tl_input_W, X, rows, cols, ld);
        std::uint16_t* out = e.bits.get(std::size_t(rows * cols));
        round_into(X, rows, cols, ld, out);
        if (!e.valid.exchange(true)) k.live.fetch_add(1);
        ld = rows;
        return out;
    }
    if (KeptInputs::Entry* e = k.find(tl_input_W, X, rows, cols, ld)) {
        k.invalidate(*e);  // read once
        kept_reads.fetch_add(1, std::memory_order_relaxed);
        ld = rows;
        return e->bits.p.get();
    }
    return bf16_operand(c, X, rows, cols, ld, scratch);
}
}  // namespace

Bf16AffineInput::Bf16AffineInput(const float* W, Bf16Input role)
    : saved_W_(tl_input_W), saved_role_(tl_input_role), on_(true) {
    tl_input_W = W;
    tl_input_role = role == Bf16Input::Keep ? 1 : 2;
}
Bf16AffineInput::~Bf16AffineInput() {
    if (on_) tl_input_W = saved_W_, tl_input_role = saved_role_;
}
std::uint64_t bf16_kept_inputs_read() { return kept_reads.load(); }
std::size_t bf16_kept_input_bytes() {
    std::size_t n = 0;
    for (const auto& g : tl_kept.e) n += g->bits.cap * sizeof(std::uint16_t);
    return n;
}
void bf16_allow_kept_inputs(bool on) { kept_inputs_allowed() = on; }

namespace {
// The roundings of the scopes that have ended on this thread, kept for the next scopes (each training step
// opens the same scopes): a buffer per step would be new pages at every step where the allocation is mapped
std::vector<Bf16Buffer>& round_once_pool() {
    thread_local std::vector<Bf16Buffer> pool;
    return pool;
}
// the kept buffer that fits n entries with the least to spare, else the largest (to grow), else a new one
Bf16Buffer take_buffer(std::size_t n) {
    std::vector<Bf16Buffer>& pool = round_once_pool();
    if (pool.empty()) return {};
    std::size_t best = 0;
    for (std::size_t i = 1; i < pool.size(); ++i) {
        const std::size_t c = pool[i].cap, b = pool[best].cap;
        if (c >= n ? (b < n || c < b) : (b < n && c > b)) best = i;
    }
    Bf16Buffer out;
    out.p = std::move(pool[best].p), out.cap = std::exchange(pool[best].cap, 0);
    pool.erase(pool.begin() + std::ptrdiff_t(best));
    return out;
}
}  // namespace

Bf16RoundOnce::Bf16RoundOnce(std::initializer_list<CMatView<float>> matrices, std::initializer_list<index_t> row_blocks)
    : saved_(tl_context) {
    if (!saved_.bf16 || !saved_.training || !bf16_native()) return;
    regions_ = std::make_unique<Bf16Regions>();
    regions_->outer = saved_.regions;
    Bf16Regions::Region* last = nullptr;
    const index_t* block = row_blocks.begin();
    for (const CMatView<float>& M : matrices) {
        const index_t B = block != row_blocks.end() ? *block++ : M.rows;
        if (!M.data || M.rows <= 0 || M.cols <= 0 || B <= 0 || M.rows % B != 0) continue;
        const index_t ld = M.cols > 1 ? M.ld : M.rows;
        // row blocks of one matrix that follow each other (the fused [Q; K; V]) make one region
        if (last && M.data == last->x + last->rows && ld == last->ld && M.cols == last->cols && B == last->block &&
            last->rows + M.rows <= ld) {
            last->rows += M.rows;
            continue;
        }
        regions_->r.push_back(std::make_unique<Bf16Regions::Region>());
        last = regions_->r.back().get();
        last->x = M.data, last->rows = M.rows, last->cols = M.cols, last->ld = ld, last->block = B;
    }
    for (const auto& g : regions_->r) {  // column by column (reading X in order), each block's rows to its matrix
        const index_t rows = g->rows, cols = g->cols, ld = g->ld, B = g->block, blocks = rows / B;
        const float* x = g->x;
        g->bits = take_buffer(std::size_t(rows * cols));
        std::uint16_t* out = g->bits.get(std::size_t(rows * cols));
        operands_rounded.fetch_add(1, std::memory_order_relaxed);
#pragma omp parallel for schedule(static) if (rows * cols > kParallelRound && !omp_in_parallel())
        for (index_t j = 0; j < cols; ++j)
            for (index_t b = 0; b < blocks; ++b) {
                const float* in = x + j * ld + b * B;
                std::uint16_t* o = out + b * B * cols + j * B;
#pragma omp simd
                for (index_t i = 0; i < B; ++i) o[i] = bf16_bits(in[i]);
            }
    }
    ProductContext c = saved_;
    c.regions = regions_.get();
    tl_context = c;
}
Bf16RoundOnce::Bf16RoundOnce(std::initializer_list<CMatView<double>>, std::initializer_list<index_t>) : saved_(tl_context) {}
Bf16RoundOnce::~Bf16RoundOnce() {
    if (!regions_) return;
    tl_context = saved_;
    for (const auto& g : regions_->r) {
        if (!g->bits.p) continue;
        Bf16Buffer kept;
        kept.p = std::move(g->bits.p), kept.cap = std::exchange(g->bits.cap, 0);
        round_once_pool().push_back(std::move(kept));
    }
}

Bf16OperandReuse::Bf16OperandReuse() { ++reuse_cache().depth; }
Bf16OperandReuse::~Bf16OperandReuse() {
    ReuseCache& rc = reuse_cache();
    if (--rc.depth == 0) rc.clear();
}

namespace {
// A weight from θ's bf16 copy times a few columns (decoding: one token per sequence, n ≤ kBf16FewColumns). oneDNN's
// matmul is tuned for many columns: with one it is no faster than float32 gemv, and it makes a new primitive for
// every new shape. Decoding is bound by reading the weights, so these loops read their bf16 copy once (half the
// bytes of float32); float32 accumulation, the columns of op(B) rounded to bf16. Two bodies: the AVX512_BF16 one
// for op(A) = A (VDPBF16PS: two bf16 products added into each float32 lane, the next columns prefetched into L2),
// chosen at run time where the CPU has it, and a portable one (bf16 widened to float32 in registers). Both read A
// in row tiles of up to kTileWork / n rows whose accumulators stay in L1.
//   op(A) = A (A: m × k, column p contiguous): C[:, j] = α Σ_p A[:, p] b_pj + β C[:, j]
//   op(A) = Aᵀ (A: k × m, column i contiguous): C[i, j] = α dot(A[:, i], B[:, j]) + β C[i, j]
constexpr index_t kBf16FewColumns = 8, kTileWork = 4096;

// C[i0 + i, j] = α acc + β C (β = 0: C is not read)
inline void store_column(float* c, const float* acc, index_t w, float alpha, float beta) {
    for (index_t i = 0; i < w; ++i) c[i] = alpha * acc[i] + (beta == 0.0f ? 0.0f : beta * c[i]);
}

// How the rows of op(A) are cut into tiles: as few as the tile size allows, but one per thread when the product
// is large enough to run in parallel (kFewParallel multiply-adds)
constexpr double kFewParallel = double(1 << 18);
index_t row_tile(index_t m, index_t n, index_t k) {
    index_t w = std::max<index_t>(32, kTileWork / n / 32 * 32);
#ifdef _OPENMP
    if (double(m) * double(k) > kFewParallel && !omp_in_parallel()) {
        const index_t t = omp_get_max_threads();
        w = std::min(w, std::max<index_t>(32, (m + t - 1) / t + 31) / 32 * 32);
    }
#endif
    return w;
}

void few_columns_portable(int ta, index_t m, index_t n, index_t k, float alpha, const std::uint16_t* A, index_t lda,
                          const float* Bq, float beta, float* C, index_t ldc) {  // Bq: op(B) rounded, k × n, ld = k
    if (ta == 0) {
        const index_t W = row_tile(m, n, k), tiles = (m + W - 1) / W;
#pragma omp parallel for schedule(static) if (double(m) * double(k) > kFewParallel && !omp_in_parallel())
        for (index_t it = 0; it < tiles; ++it) {
            const index_t i0 = it * W, w = std::min(W, m - i0);
            std::vector<float> tile(std::size_t(W * n), 0.0f);  // n accumulator columns of W rows
            index_t p = 0;
            for (; p + 4 <= k; p += 4) {  // four columns of A at a time: four contiguous streams
                const std::uint16_t* a0 = A + i0 + p * lda;
                const std::uint16_t *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
                for (index_t j = 0; j < n; ++j) {
                    const float* b = Bq + p + j * k;
                    float* s = tile.data() + j * W;
#pragma omp simd
                    for (index_t i = 0; i < w; ++i)
                        s[i] += from_bf16(a0[i]) * b[0] + from_bf16(a1[i]) * b[1] + from_bf16(a2[i]) * b[2] +
                                from_bf16(a3[i]) * b[3];
                }
            }
            for (; p < k; ++p) {
                const std::uint16_t* a = A + i0 + p * lda;
                for (index_t j = 0; j < n; ++j) {
                    const float b = Bq[p + j * k];
                    float* s = tile.data() + j * W;
#pragma omp simd
                    for (index_t i = 0; i < w; ++i) s[i] += from_bf16(a[i]) * b;
                }
            }
            for (index_t j = 0; j < n; ++j) store_column(C + i0 + j * ldc, tile.data() + j * W, w, alpha, beta);
        }
        return;
    }
#pragma omp parallel for schedule(static) if (double(m) * double(k) > kFewParallel && !omp_in_parallel())
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
            float acc = s;
            store_column(C + i + j * ldc, &acc, 1, alpha, beta);
        }
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FT_BF16_KERNEL 1
#define FT_TARGET_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

// The AVX512_BF16 body (op(A) = A). Bb: op(B)'s columns as bf16 bits, k padded with zeros to a multiple of 4 (kp).
// op(A) = A: per 32 rows, columns p and p+1 of A interleaved (unpacklo/hi of 16-bit words: the pairs of rows
// {0-3, 8-11, 16-19, 24-27} and {4-7, 12-15, 20-23, 28-31}) meet the pair (b_p, b_{p+1}) broadcast: one
// VDPBF16PS adds both products into each row's float32 sum. The tile keeps the sums in that order; the store
// puts them back in row order.
// (one tile: rows i0 … i0 + w − 1; the parallel loops stay outside the functions compiled for AVX-512)
template <int N>
FT_TARGET_BF16 void few_n_tile(index_t i0, index_t w, index_t k, index_t kp, float alpha, const std::uint16_t* A,
                               index_t lda, const std::uint16_t* Bb, float beta, float* C, index_t ldc) {
    const index_t chunks = (w + 31) / 32;
    alignas(64) float tile[kTileWork];  // N columns × chunks × 32 sums (W·N ≤ kTileWork, W a multiple of 32)
    for (index_t q = 0; q < N * chunks * 32; ++q) tile[q] = 0.0f;
    const __m512i zero = _mm512_setzero_si512();
    index_t p = 0;
    for (; p < k; p += 4) {  // columns p … p+3 (zeros past k: Bb is zero there, A's column is not read)
        __m512i bp[N][2];
        for (int j = 0; j < N; ++j) {
            std::uint32_t w0, w1;
            std::memcpy(&w0, Bb + j * kp + p, 4);
            std::memcpy(&w1, Bb + j * kp + p + 2, 4);
            bp[j][0] = _mm512_set1_epi32(int(w0));
            bp[j][1] = _mm512_set1_epi32(int(w1));
        }
        const std::uint16_t* a0 = A + i0 + p * lda;
        const std::uint16_t* a1 = p + 1 < k ? a0 + lda : nullptr;
        const std::uint16_t* a2 = p + 2 < k ? a0 + 2 * lda : nullptr;
        const std::uint16_t* a3 = p + 3 < k ? a0 + 3 * lda : nullptr;
        for (index_t c = 0; c < chunks; ++c) {
            const index_t left = w - c * 32;
            const __mmask32 mask = left >= 32 ? ~__mmask32(0) : (__mmask32(1) << left) - 1;
            // the next four columns' lines of this chunk into L2 (one core's bandwidth is bound by the lines in flight:
            // the hardware prefetchers alone keep too few, and L1's miss buffers are fewer than L2's)
            if (p + 4 < k) {
                const std::uint16_t* next = a0 + 4 * lda + c * 32;
                _mm_prefetch(reinterpret_cast<const char*>(next), _MM_HINT_T1);
                if (p + 5 < k) _mm_prefetch(reinterpret_cast<const char*>(next + lda), _MM_HINT_T1);
                if (p + 6 < k) _mm_prefetch(reinterpret_cast<const char*>(next + 2 * lda), _MM_HINT_T1);
                if (p + 7 < k) _mm_prefetch(reinterpret_cast<const char*>(next + 3 * lda), _MM_HINT_T1);
            }
            const __m512i x0 = _mm512_maskz_loadu_epi16(mask, a0 + c * 32);
            const __m512i x1 = a1 ? _mm512_maskz_loadu_epi16(mask, a1 + c * 32) : zero;
            const __m512i x2 = a2 ? _mm512_maskz_loadu_epi16(mask, a2 + c * 32) : zero;
            const __m512i x3 = a3 ? _mm512_maskz_loadu_epi16(mask, a3 + c * 32) : zero;
            const __m512bh lo01 = (__m512bh)_mm512_unpacklo_epi16(x0, x1), hi01 = (__m512bh)_mm512_unpackhi_epi16(x0, x1);
            const __m512bh lo23 = (__m512bh)_mm512_unpacklo_epi16(x2, x3), hi23 = (__m512bh)_mm512_unpackhi_epi16(x2, x3);
            for (int j = 0; j < N; ++j) {
                float* t = tile + (j * chunks + c) * 32;
                __m512 lo = _mm512_load_ps(t), hi = _mm512_load_ps(t + 16);
                lo = _mm512_dpbf16_ps(lo, lo01, (__m512bh)bp[j][0]);
                hi = _mm512_dpbf16_ps(hi, hi01, (__m512bh)bp[j][0]);
                lo = _mm512_dpbf16_ps(lo, lo23, (__m512bh)bp[j][1]);
                hi = _mm512_dpbf16_ps(hi, hi23, (__m512bh)bp[j][1]);
                _mm512_store_ps(t, lo);
                _mm512_store_ps(t + 16, hi);
            }
        }
    }
    // row order back: row r of a chunk sits in group g = r / 4 — even groups in lo (lane g / 2), odd in hi
    alignas(64) float col[kTileWork];
    for (int j = 0; j < N; ++j) {
        for (index_t c = 0; c < chunks; ++c) {
            const float* t = tile + (j * chunks + c) * 32;
            for (index_t r = 0; r < 32; ++r) {
                const index_t g = r / 4;
                col[c * 32 + r] = t[(g & 1) * 16 + (g >> 1) * 4 + r % 4];
            }
        }
        store_column(C + i0 + j * ldc, col, w, alpha, beta);
    }
}

template <int N>
void few_avx512(index_t m, index_t k, index_t kp, float alpha, const std::uint16_t* A, index_t lda,
                const std::uint16_t* Bb, float beta, float* C, index_t ldc) {
    const index_t W = row_tile(m, N, k), tiles = (m + W - 1) / W;
#pragma omp parallel for schedule(static) if (double(m) * double(k) > kFewParallel && !omp_in_parallel())
    for (index_t it = 0; it < tiles; ++it) {
        const index_t i0 = it * W, w = std::min(W, m - i0);
        few_n_tile<N>(i0, w, k, kp, alpha, A, lda, Bb, beta, C, ldc);
    }
}

// AVX512_BF16 and the AVX-512 state enabled by the OS (XCR0: opmask, ZMM halves, upper ZMM registers)
bool cpu_runs_avx512_bf16() {
    static const bool ok = [] {
        unsigned a, b, c, d;
        if (!__get_cpuid_count(1, 0, &a, &b, &c, &d) || !((c >> 27) & 1u)) return false;  // OSXSAVE
        unsigned lo, hi;
        __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        if ((lo & 0xe6u) != 0xe6u) return false;
        if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
        const bool f = (b >> 16) & 1u, bw = (b >> 30) & 1u, vl = (b >> 31) & 1u, dq = (b >> 17) & 1u;
        return f && bw && vl && dq && cpu_has_avx512_bf16();
    }();
    return ok;
}

// A training call's small products (attention's per-head products: 64 × 64 × 32 at the baby GPT's shape, 1,152 a
// step) on AVX512_BF16 without oneDNN: a oneDNN matmul call costs about twice these products' arithmetic in its
// dispatch, scratchpad and packing (docs/benchmarks.md). The same arithmetic as oneDNN's kernels on these shapes,
// bit for bit: each entry of C one float32 sum, zero, then VDPBF16PS over the pairs (p, p+1) of k in order; α
// applied to the sum, then β = 1's C added. Operands as bf16 bits, packed per call: op(A) as pairs of its columns
// (row i of the pair block q: op(A)[i, 2q], op(A)[i, 2q + 1]), rows padded with zeros to a multiple of 16; op(B)'s
// column j as its k/2 pairs, columns padded with zeros to the column block.
template <int MR>
FT_TARGET_BF16 void small_block(const std::uint32_t* Ap, index_t mp, index_t kq, const std::uint32_t* Bp, index_t bj,
                                index_t bq, index_t i0, index_t j0, index_t m, index_t nr, float alpha, bool add,
                                float* C, index_t ldc) {
    constexpr int NR = MR == 4 ? 6 : MR == 3 ? 8 : MR == 2 ? 8 : 16;
    __m512 acc[MR][NR];  // (every index a constant once the loops unroll: the sums stay in registers)
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 24
        for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_setzero_ps();
    const std::uint32_t* b = Bp + j0 * bj;
    for (index_t q = 0; q < kq; ++q) {
        __m512bh a[MR];
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) a[r] = (__m512bh)_mm512_loadu_si512(Ap + q * mp + i0 + 16 * r);
#pragma GCC unroll 24
        for (int c = 0; c < NR; ++c) {
            const __m512bh bc = (__m512bh)_mm512_set1_epi32(int(b[c * bj + q * bq]));
#pragma GCC unroll 4
            for (int r = 0; r < MR; ++r) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], a[r], bc);
        }
    }
    const __m512 al = _mm512_set1_ps(alpha);
#pragma GCC unroll 24
    for (int c = 0; c < NR; ++c) {
        float* col = C + (j0 + c) * ldc + i0;
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) {
            const index_t left = m - i0 - 16 * r;
            if (c >= nr || left <= 0) continue;
            const __mmask16 mask = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
            // α·sum + C in one rounding (a fused multiply-add), as oneDNN's output scale and sum post-op
            __m512 v = acc[r][c];
            if (add) v = alpha == 1.0f ? _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, col + 16 * r))
                                       : _mm512_fmadd_ps(v, al, _mm512_maskz_loadu_ps(mask, col + 16 * r));
            else if (alpha != 1.0f) v = _mm512_mul_ps(v, al);
            _mm512_mask_storeu_ps(col + 16 * r, mask, v);
        }
    }
}

template <int MR>
void small_blocks(const std::uint32_t* Ap, index_t mp, index_t kq, const std::uint32_t* Bp, index_t bj, index_t bq,
                  index_t i0, index_t m, index_t n, float alpha, bool add, float* C, index_t ldc) {
    constexpr int NR = MR == 4 ? 6 : MR == 3 ? 8 : MR == 2 ? 8 : 16;
    for (index_t j0 = 0; j0 < n; j0 += NR)
        small_block<MR>(Ap, mp, kq, Bp, bj, bq, i0, j0, m, std::min<index_t>(NR, n - j0), alpha, add, C, ldc);
}

// Two consecutive vectors of bf16 bits (x at x[0 … count), the next at x[ld …]) as count words, x's in the low half
// (one pair (p, p+1) of k per word, as VDPBF16PS takes it), zeros after them up to padded
inline void interleave_pair(const std::uint16_t* x, index_t ld, index_t count, std::uint32_t* o, index_t padded) {
    const std::uint16_t* y = x + ld;
#pragma omp simd
    for (index_t i = 0; i < count; ++i) o[i] = std::uint32_t(x[i]) | (std::uint32_t(y[i]) << 16);
    for (index_t i = count; i < padded; ++i) o[i] = 0;
}

// C = α op(A) op(B) + β C, β 0 or 1, k even (the caller checks), A and B as bf16 bits
void small_product(int ta, int tb, index_t m, index_t n, index_t k, float alpha, const std::uint16_t* A, index_t lda,
                   const std::uint16_t* B, index_t ldb, float beta, float* C, index_t ldc) {
    const index_t kq = k / 2, mp = (m + 15) / 16 * 16, np = n + 24;
    thread_local std::vector<std::uint32_t> ap, bp;
    if (ap.size() < std::size_t(mp * kq)) ap.resize(std::size_t(mp * kq));
    if (bp.size() < std::size_t(np * kq)) bp.resize(std::size_t(np * kq));
    std::uint32_t* Ap = ap.data();
    std::uint32_t* Bp = bp.data();
    // each loop reads its operand in memory order
    if (ta == 0) {  // A: m × k, column p at A + p lda
        for (index_t q = 0; q < kq; ++q) interleave_pair(A + 2 * q * lda, lda, m, Ap + q * mp, mp);
    } else {  // A: k × m, op(A)[i, p] at A + p + i lda: row i's pairs are words of column i
        for (index_t i = 0; i < m; ++i) {
            const std::uint16_t* a = A + i * lda;
            for (index_t q = 0; q < kq; ++q) {
                std::uint32_t w;
                std::memcpy(&w, a + 2 * q, 4);
                Ap[q * mp + i] = w;
            }
        }
        for (index_t q = 0; q < kq; ++q)
            for (index_t i = m; i < mp; ++i) Ap[q * mp + i] = 0;
    }
    index_t bj, bq;  // op(B)'s pair (q, j) at Bp[j bj + q bq]
    if (tb == 0) {   // B: k × n, column j's pairs are its words
        bj = kq, bq = 1;
        for (index_t j = 0; j < n; ++j) std::memcpy(Bp + j * kq, B + j * ldb, std::size_t(k) * 2);
        std::fill(Bp + n * kq, Bp + np * kq, 0u);
    } else {  // B: n × k, op(B)[p, j] at B + j + p ldb
        bj = 1, bq = np;
        for (index_t q = 0; q < kq; ++q) interleave_pair(B + 2 * q * ldb, ldb, n, Bp + q * np, np);
    }
    const bool add = beta != 0.0f;
    index_t i0 = 0;
    for (; i0 + 64 <= m; i0 += 64) small_blocks<4>(Ap, mp, kq, Bp, bj, bq, i0, m, n, alpha, add, C, ldc);
    const index_t left = (m - i0 + 15) / 16;  // 16-row blocks left (0 to 4)
    if (left == 4) small_blocks<4>(Ap, mp, kq, Bp, bj, bq, i0, m, n, alpha, add, C, ldc);
    if (left == 3) small_blocks<3>(Ap, mp, kq, Bp, bj, bq, i0, m, n, alpha, add, C, ldc);
    if (left == 2) small_blocks<2>(Ap, mp, kq, Bp, bj, bq, i0, m, n, alpha, add, C, ldc);
    if (left == 1) small_blocks<1>(Ap, mp, kq, Bp, bj, bq, i0, m, n, alpha, add, C, ldc);
}
bool& small_kernel_allowed() {
    static bool on = true;
    return on;
}
#endif

void few_columns(int ta, int tb, index_t m, index_t n, index_t k, float alpha, const std::uint16_t* A, index_t lda,
                 const float* B, index_t ldb, float beta, float* C, index_t ldc) {
    auto b_at = [&](index_t p, index_t j) { return tb == 0 ? B[p + j * ldb] : B[j + p * ldb]; };
#ifdef FT_BF16_KERNEL
    // op(A) = A on AVX512_BF16; op(A) = Aᵀ (each row of C one contiguous dot product) runs faster in the
    // portable loop, whose single stream the hardware prefetchers follow (docs/benchmarks.md)
    if (ta == 0 && native_allowed() && cpu_runs_avx512_bf16()) {
        const index_t kp = (k + 3) / 4 * 4;
        thread_local std::vector<std::uint16_t> bb;  // op(B) as bf16, k × n, ld = kp, zeros past k (to a multiple of 4)
        bb.assign(std::size_t(kp * n), 0);
        for (index_t j = 0; j < n; ++j)
            for (index_t p = 0; p < k; ++p) bb[std::size_t(p + j * kp)] = to_bf16(b_at(p, j));
        using F = void (*)(index_t, index_t, index_t, float, const std::uint16_t*, index_t, const std::uint16_t*, float,
                           float*, index_t);
        static constexpr F kernels[kBf16FewColumns] = {few_avx512<1>, few_avx512<2>, few_avx512<3>, few_avx512<4>,
                                                       few_avx512<5>, few_avx512<6>, few_avx512<7>, few_avx512<8>};
        kernels[n - 1](m, k, kp, alpha, A, lda, bb.data(), beta, C, ldc);
        return;
    }
#endif
    thread_local std::vector<float> bq;  // op(B) rounded, k × n
    bq.resize(std::size_t(k * n));
    for (index_t j = 0; j < n; ++j)
        for (index_t p = 0; p < k; ++p) bq[std::size_t(p + j * k)] = round_bf16(b_at(p, j));
    few_columns_portable(ta, m, n, k, alpha, A, lda, bq.data(), beta, C, ldc);
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
    // inside a Bf16OperandReuse scope, whichever path runs: the kept roundings that C overlaps are dropped after
    struct Written {
        const float* C;
        index_t m, n, ldc;
        const Bf16Regions* regions;
        ~Written() {
            if (reuse_cache().depth > 0) reuse_cache().written(C, m, n, ldc);
            if (regions) regions->written(C, m, n, ldc);
        }
    } written{C, m, n, ldc, ctx.regions};
    if (ctx.weights && !ctx.training && n <= kBf16FewColumns && ctx.weights->find(A) && ctx.weights->find(A + (ac - 1) * lda + ar - 1)) {
        few_columns(ta, tb, m, n, k, alpha, ctx.weights->find(A), lda, B, ldb, beta, C, ldc);
        return;
    }
#ifdef FT_HAVE_ONEDNN
    // oneDNN for products worth a primitive; the small ones (decoding's per-head products over a growing cache,
    // a new shape at every token) emulated, without making a primitive for each, except in training
    // (training: the shapes repeat at every step, so the small products' primitives are made once; there they run
    // faster through oneDNN than emulated — docs/benchmarks.md)
    if (bf16_native() && (double(m) * double(n) * double(k) >= double(1 << 18) || ctx.training)) {
        thread_local Bf16Buffer sa, sb;
        const std::uint16_t* a = bf16_operand(ctx, A, ar, ac, lda, sa);
        const std::uint16_t* b = affine_input(ctx, B, br, bc, ldb, sb, tb);
#ifdef FT_BF16_KERNEL
        if (ctx.training && double(m) * double(n) * double(k) < double(1 << 18) && k % 2 == 0 &&
            (beta == 0.0f || beta == 1.0f) && small_kernel_allowed() && cpu_runs_avx512_bf16()) {
            small_product(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, C, ldc);
            return;
        }
#endif
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

void bf16_allow_small_kernel(bool on) {
#ifdef FT_BF16_KERNEL
    small_kernel_allowed() = on;
#else
    (void)on;
#endif
}
bool bf16_small_kernel_runs() {
#ifdef FT_BF16_KERNEL
    return small_kernel_allowed() && native_allowed() && cpu_runs_avx512_bf16();
#else
    return false;
#endif
}

bool affine_bf16(index_t m, index_t n, index_t k, const float* W, index_t ldw, const float* X, index_t ldx,
                 const float* b, float* Y, index_t ldy) {
#ifdef FT_HAVE_ONEDNN
    const ProductContext ctx = product_context();
    if (!ctx.bf16 || !bf16_native() || (double(m) * double(n) * double(k) < double(1 << 18) && !ctx.training) ||
        (ctx.weights && !ctx.training && n <= kBf16FewColumns))
        return false;
    thread_local Bf16Buffer sa, sb;
    const std::uint16_t* a = bf16_operand(ctx, W, m, k, ldw, sa);
    const std::uint16_t* x = affine_input(ctx, X, k, n, ldx, sb, 0);
    run_onednn(0, 0, m, n, k, 1.0f, a, ldw, x, ldx, 0.0f, Y, ldy, b);
    if (reuse_cache().depth > 0) reuse_cache().written(Y, m, n, ldy);
    if (ctx.regions) ctx.regions->written(Y, m, n, ldy);
    return true;
#else
    (void)m, (void)n, (void)k, (void)W, (void)ldw, (void)X, (void)ldx, (void)b, (void)Y, (void)ldy;
    return false;
#endif
}

}  // namespace ft
