// Mixed precision: bfloat16 products with float32 accumulation and float32 master weights (docs/design.md
// "Mixed precision").
//
// In a float32 model built with precision "bf16-mixed", every matrix product of the listings (every call of
// `gemm`, blas.hpp) takes its two operands rounded to bfloat16 (round to nearest even, as the hardware's
// conversion does) and accumulates in float32 into a float32 result. Everything else — θ and Adam's moments,
// the norms, softmax, the loss, the sums of gradients (β = 1 accumulation into float32) — stays float32. A
// product of two bfloat16 numbers is exact in float32 (8 + 8 significant bits), so the bf16 path equals a
// float32 computation on the rounded operands up to the order of the float32 sums.
//
// Where the products run: oneDNN's matmul (bf16 × bf16 → f32), which dispatches at run time to AVX512_BF16
// or AMX where the CPU has them. Without those instructions, or without oneDNN in the build, the same
// arithmetic runs as float32 products of the rounded operands through the BLAS (`bf16_info()` says which).
//
// The choice is per call, on the calling thread: a model in bf16-mixed opens a `ProductScope` around its
// computation; `gemm<float>` reads it. Parallel regions that call gemm from their threads carry the
// caller's context in (`ProductScope(captured)` inside the region).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "formal_transformers/common.hpp"

namespace ft {

enum class Precision { Float32, BF16Mixed };

const char* precision_name(Precision p);                // "float32" | "bf16-mixed"
Precision parse_precision(const std::string& name);     // ValueError for another name

// bfloat16's bits of a float32: the upper half, rounded to nearest even (a NaN stays a quiet NaN)
inline std::uint16_t to_bf16(float x) {
    std::uint32_t u;
    std::memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return std::uint16_t(u >> 16);
}
inline float from_bf16(std::uint16_t b) {
    const std::uint32_t u = std::uint32_t(b) << 16;
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}
// x rounded to the nearest bfloat16, as a float32
inline float round_bf16(float x) { return from_bf16(to_bf16(x)); }

// A bf16 copy of a parameter store's θ: products whose operand lies inside θ read it from here instead of rounding
// the weights at every product. Its owner keeps it between calls and brings it up to date at the start of each:
//  * sync (training, and decoding): exact — each θ_i's rounding compared with the copy (one read of θ and of the
//    copy, in parallel) and rewritten where it differs, so that whatever changed θ in between (an optimizer, a
//    trainer, a write through a numpy view, a load) is seen; a copy kept up to date is only read.
//  * Adam keeps it up to date as it writes θ (optim.hpp: the rounding written in the same pass).
//  * update: the same decided by θ's digest (kept for callers that hold no copy up to date).
struct Bf16Weights {
    const float* begin = nullptr;
    index_t n = 0;
    std::uint64_t digest = 0;  // θ's digest when the copy was made (by update)
    std::vector<std::uint16_t> bits;
    void refresh(const float* theta, index_t size);
    // the copy made again unless θ (address, size and digest) is what it was made from; true when it was
    bool update(const float* theta, index_t size);
    // the copy brought up to date with θ, exactly (a new θ address or size: made again); true when anything changed
    bool sync(const float* theta, index_t size);
    // the copy of the float at p, or null when p is not inside θ
    const std::uint16_t* find(const float* p) const {
        return begin && p >= begin && p < begin + n ? bits.data() + (p - begin) : nullptr;
    }
    // the copy's entries for θ[i0, i1) written from θ (the caller has just written them); false when the copy is
    // not one of this θ (another address or size: nothing written, the next sync makes it again)
    bool write(const float* theta, index_t size, index_t i0, index_t i1);
};

struct Bf16Regions;  // matrices rounded once for a scope's products (Bf16RoundOnce, bf16_products.hpp)

// The products' precision on this thread.
struct ProductContext {
    bool bf16 = false;
    const Bf16Weights* weights = nullptr;  // optional bf16 copy of θ, up to date (decoding, training)
    // training (loss_and_grad, the trainers): the copy only stands in for the rounding of θ's operands (the same
    // results as rounding at every product), and the products below the size worth a oneDNN primitive run through
    // oneDNN too (a training run's shapes repeat: their primitives are made once). Else (decoding, with the copy)
    // products of a weight with a few columns run the few-columns kernel, and the small products are emulated.
    bool training = false;
    const Bf16Regions* regions = nullptr;  // (Bf16RoundOnce) operands inside these read their rounding from there
};
ProductContext product_context();

// Sets this thread's context for its lifetime; the previous one comes back on exit (scopes nest).
class ProductScope {
public:
    explicit ProductScope(ProductContext c);
    ~ProductScope();
    ProductScope(const ProductScope&) = delete;
    ProductScope& operator=(const ProductScope&) = delete;

private:
    ProductContext saved_;
};

// C <- alpha op(A) op(B) + beta C with A and B rounded to bf16, float32 accumulation (gemm calls it when the
// context says bf16; shapes already checked, m, n, k > 0).
void gemm_bf16(int transA, int transB, index_t m, index_t n, index_t k, float alpha, const float* A, index_t lda,
               const float* B, index_t ldb, float beta, float* C, index_t ldc);

// The CPU's bfloat16 instructions and the library that runs bf16 products: e.g. "bf16: AVX512_BF16 yes, AMX
// no; oneDNN 2.6.3 (brg:avx512_core_bf16)". Part of ft.blas_info().
std::string bf16_info();
bool cpu_has_avx512_bf16();
bool cpu_has_amx_bf16();
// True when bf16 products run on bf16 instructions through oneDNN (else: rounded operands, float32 products).
bool bf16_native();
// How many copies of θ Bf16Weights::refresh has made in this process (tests: a decoding call on an unchanged θ
// makes none)
std::uint64_t bf16_theta_copies();
// Tests: off makes training calls round θ's operands at every product instead of reading θ's bf16 copy (the
// results are the same).
void bf16_allow_theta_copy(bool on);
bool bf16_theta_copy_allowed();
// Tests: off runs the emulated path even where bf16 instructions exist (on again restores the default).
void bf16_allow_native(bool on);

}  // namespace ft
