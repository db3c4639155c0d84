// The position "sinusoidal": Algorithm 2's W_p hard-coded as the paper prints it (§5; listings/embedding.cpp makes
// the table), with 1-based i and t
//
//   W_p[2i−1, t] = sin(t / ℓ_max^(2i/d_e)),   W_p[2i, t] = cos(t / ℓ_max^(2i/d_e))
//
// Its option: base, the number in place of ℓ_max (Vaswani et al. use 10000); None: ℓ_max, the listing. Given with
// positional='sinusoidal' only (the selector chooses the part; with another positional it must be at its default).
#include "formal_transformers/config.hpp"
#include "formal_transformers/parts.hpp"

namespace ft {

const PartRow& sinusoidal_position_row() {
    static const PartRow row{PartKind::Position,
                             "sinusoidal",
                             {{"base", archs::ALL, OptionKind::AutoReal, 0.0, OptionCheck::None,
                               "Algorithm 2's sinusoidal W_p with this base in place of ℓ_max (Vaswani et al.: 10000). "
                               "None: ℓ_max, as the paper prints it"}},
                             nullptr,
                             nullptr,
                             false};
    return row;
}

}  // namespace ft
