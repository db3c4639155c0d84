// Mixed precision (precision.hpp): what the product layer (blas.cpp) asks of bf16.cpp beyond gemm_bf16.
#pragma once

#include <cstddef>
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

// An affine map's input X (Y = W X + b 1ᵀ) rounded once for its forward product and its backward's dW = dY Xᵀ. In a
// training call whose products run on bf16 instructions, on the calling thread outside parallel regions:
//  * Keep (the forward's products W X): op(B)'s rounding is kept, by W's and X's address and X's shape, in a buffer
//    the thread keeps between calls; a later Keep of the same W and X rounds it again (the latest forward's).
//  * Read (the backward's dW = dY Xᵀ): a product whose op(B) is the transpose of a kept X of the same W reads that
//    rounding instead of rounding X again, once (the first such product after the forward's takes it).
// A kept rounding is dropped when a product's result overlaps X (on any thread carrying this thread's product
// context), when it is read, and when the training call ends. What makes it exact: the backward's dW = dY Xᵀ is the
// gradient of the forward's product only where X holds at the backward the values it held at the forward (every
// listing's gradient tests hold that), so the rounding kept is the rounding the backward would make. The results
// are those of rounding at every product. Elsewhere (float32, float64, the emulated path, decoding) it does nothing.
enum class Bf16Input { Keep, Read };
class Bf16AffineInput {
public:
    Bf16AffineInput(const float* W, Bf16Input role);
    Bf16AffineInput(const double*, Bf16Input) {}  // float64: nothing
    ~Bf16AffineInput();
    Bf16AffineInput(const Bf16AffineInput&) = delete;
    Bf16AffineInput& operator=(const Bf16AffineInput&) = delete;

private:
    const float* saved_W_ = nullptr;
    int saved_role_ = 0;
    bool on_ = false;
};

// How many products have read an affine input's rounding kept from its forward (Bf16AffineInput), and the bytes the
// calling thread keeps for them (tests, measurements)
std::uint64_t bf16_kept_inputs_read();
std::size_t bf16_kept_input_bytes();
// Tests: off rounds the affine inputs at every product instead of keeping the forward's rounding (the same results).
void bf16_allow_kept_inputs(bool on);

// Tests: off runs a training call's small products (below 2^18 multiply-adds) through oneDNN instead of our AVX512_BF16
// kernel (the same results where oneDNN's kernel is its AVX512_BF16 one).
void bf16_allow_small_kernel(bool on);
bool bf16_small_kernel_runs();  // whether the kernel is on and the CPU runs AVX512_BF16

// How many operands the products on bf16 instructions have rounded to bf16 in this process (tests: an operand
// kept by a Bf16OperandReuse scope is rounded once)
std::uint64_t bf16_operands_rounded();

}  // namespace ft
