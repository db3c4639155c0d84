// Algorithm V2: ALiBi (Press et al. 2022, "Train Short, Test Long"), variants.hpp quotes the listing; here its
// slopes and the score-bias part that replaces Algorithm 4's line 6 by softmax(S/√d_attn − m_h D)
// (registered as position "alibi").
#include <algorithm>
#include <cmath>

#include "formal_transformers/parts.hpp"
#include "formal_transformers/variants.hpp"

namespace ft {

// ===================================== Algorithm V2: ALiBi ============================================
std::vector<double> alibi_slopes(index_t H) {
    index_t n = 1;
    while (2 * n <= H) n *= 2;  // line 1: n ← 2^{⌊log₂ H⌋}
    std::vector<double> m(static_cast<std::size_t>(H));
    for (index_t h = 1; h <= n; ++h) m[std::size_t(h - 1)] = std::exp2(-8.0 * double(h) / double(n));  // line 2
    for (index_t h = 1; h <= H - n; ++h)
        m[std::size_t(n + h - 1)] = std::exp2(-4.0 * double(2 * h - 1) / double(n));  // line 3
    return m;
}

// ===================================== the part ========================================================
namespace {
// line 6′: S/√d_attn − m_h D on the scaled scores of head h (before the softmax), D[t_z, t_x] = |t_x − t_z|,
// on each column's candidate keys (the rest is masked). A constant bias: its backward adds nothing.
template <class T>
class Alibi final : public ScoreBias<T> {
public:
    explicit Alibi(index_t H) : m_(alibi_slopes(H)) {}
    void add(const ParamStore<T>&, const Mask& mask, index_t b, index_t h, index_t q0, MatView<T> S) const override {
        const T m = T(m_[std::size_t(h)]);
#pragma omp parallel for schedule(static) if (S.size() > 16384)
        for (index_t j = 0; j < S.cols; ++j) {
            const index_t tx = q0 + j;
            const KeyRange r = mask.keys(b, tx, S.rows);
            T* s = S.col(j);
            for (index_t tz = r.begin; tz < r.end; ++tz) s[tz] -= m * T(tx >= tz ? tx - tz : tz - tx);
        }
    }
    // the same on a tile of S (the tiled listing): rows t0 + i, columns q0 + j0 + j, every entry
    bool tiles() const override { return true; }
    void add_tile(const ParamStore<T>&, index_t, index_t h, index_t q0, index_t t0, index_t j0,
                  MatView<T> S) const override {
        const T m = T(m_[std::size_t(h)]);
        for (index_t j = 0; j < S.cols; ++j) {
            const index_t tx = q0 + j0 + j;
            T* s = S.col(j);
            for (index_t i = 0; i < S.rows; ++i) {
                const index_t tz = t0 + i;
                s[i] -= m * T(tx >= tz ? tx - tz : tz - tx);
            }
        }
    }

private:
    std::vector<double> m_;  // m_h of head h (0-based)
};
}  // namespace

template <class T>
PositionPart<T> make_alibi(const AttnSpec& spec, ParamStore<T>&, const std::string&) {
    PositionPart<T> p;
    p.bias = std::make_shared<Alibi<T>>(spec.H);
    return p;
}

template PositionPart<float> make_alibi<float>(const AttnSpec&, ParamStore<float>&, const std::string&);
template PositionPart<double> make_alibi<double>(const AttnSpec&, ParamStore<double>&, const std::string&);

}  // namespace ft
