// Mixed precision (precision.hpp): an operand read by several bf16 products rounded once.
#pragma once

namespace ft {

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

}  // namespace ft
