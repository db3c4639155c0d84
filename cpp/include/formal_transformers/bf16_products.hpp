// Mixed precision (precision.hpp): what the product layer (blas.cpp) asks of bf16.cpp beyond gemm_bf16.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>

#include "formal_transformers/common.hpp"
#include "formal_transformers/precision.hpp"

namespace ft {

// Y <- W X + b 1ᵀ (all column-major; Y: m × n, W: m × k, X: k × n) in one bf16 product with b added to its float32
// sums as they are stored, when the product runs on bf16 instructions: the value of b broadcast into Y and the
// product added with β = 1, without writing Y first. False when it would not run that way (the caller does it).
bool affine_bf16(index_t m, index_t n, index_t k, const float* W, index_t ldw, const float* X, index_t ldx,
                 const float* b, float* Y, index_t ldy);

// Declares that, until its end, the operands of this thread's bf16 products are written by nothing but those
// products themselves: an operand read by several of them (the same address and shape) is rounded to bf16 once
// and the rounding kept; a product whose result overlaps a kept rounding drops it. The results are those of
// rounding at every product. Scopes nest; the outermost one's end drops what was kept.
class Bf16OperandReuse {
public:
    Bf16OperandReuse();
    ~Bf16OperandReuse();
    Bf16OperandReuse(const Bf16OperandReuse&) = delete;
    Bf16OperandReuse& operator=(const Bf16OperandReuse&) = delete;
};

// Declares that, until its end, the given matrices are written by nothing. In a training call whose products run on
// bf16 instructions, each is rounded to bf16 once, whole, when the scope opens, and every product operand lying
// inside one of them — within one of its row blocks of the height given (a head's rows of Q, K, V; a sequence's
// columns) — reads that rounding instead of rounding its slice, on this thread and on the threads of the parallel
// regions that carry this thread's product context. The rounding is kept block by block (each block's rows
// contiguous), so such a slice reaches the library as a dense matrix. The results are those of rounding at every
// product. Elsewhere (float32, float64, the emulated path, decoding) it does nothing.
class Bf16RoundOnce {
public:
    Bf16RoundOnce(std::initializer_list<CMatView<float>> matrices, std::initializer_list<index_t> row_blocks);
    Bf16RoundOnce(std::initializer_list<CMatView<double>>, std::initializer_list<index_t>);  // float64: nothing
    ~Bf16RoundOnce();
    Bf16RoundOnce(const Bf16RoundOnce&) = delete;
    Bf16RoundOnce& operator=(const Bf16RoundOnce&) = delete;

private:
    std::unique_ptr<Bf16Regions> regions_;
    ProductContext saved_;
};

// How many operands the products on bf16 instructions have rounded to bf16 in this process (tests: an operand
// kept by a Bf16OperandReuse scope is rounded once)
std::uint64_t bf16_operands_rounded();

}  // namespace ft
