// Algorithm V1: RoPE (Su et al. 2021, "RoFormer"), variants.hpp quotes the listing; here its kernel and the
// query/key transform part that puts it into Algorithm 4 after line 2 (registered as position "rope"). Its options:
// rope_theta, line 1's θ (also V10's latent source's, which requires positional='rope'); rotary_pct (GPT-NeoX's partial rotary): the listing on the first r = ⌊d_attn · rotary_pct⌋ rows of each head
// (d = r in its lines 1–5), the other d_attn − r rows unchanged; 1.0: every row, the listing.
#include <algorithm>
#include <cmath>

#include "formal_transformers/config.hpp"
#include "formal_transformers/parts.hpp"
#include "formal_transformers/variants.hpp"

namespace ft {

// ===================================== Algorithm V1: RoPE =============================================
namespace {
// factor f (linear position scaling, rope_scaling_factor): line 1's ω_i divided by f, i.e. positions p/f; f = 1: V1
template <class T>
void rope_scaled(MatView<T> X, index_t n_heads, index_t d, const index_t* pos, double theta, double factor, bool inverse);
}  // namespace

template <class T>
void rope(MatView<T> X, index_t n_heads, index_t d, const index_t* pos, double theta, bool inverse) {
    rope_scaled(X, n_heads, d, pos, theta, 1.0, inverse);
}

namespace {
template <class T>
void rope_scaled(MatView<T> X, index_t n_heads, index_t d, const index_t* pos, double theta, double factor, bool inverse) {
    const index_t half = d / 2;
    std::vector<double> omega(static_cast<std::size_t>(half));
    for (index_t i = 0; i < half; ++i) {
        omega[std::size_t(i)] = std::pow(theta, -2.0 * double(i) / double(d));  // line 1
        if (factor != 1.0) omega[std::size_t(i)] /= factor;
    }
    // line 3's cos and sin, once per distinct position (a batch repeats positions 0, 1, … per sequence)
    index_t pmin = 0, pmax = -1;
    if (X.cols > 0) {
        pmin = *std::min_element(pos, pos + X.cols);
        pmax = *std::max_element(pos, pos + X.cols);
    }
    const index_t span = std::min<index_t>(pmax - pmin + 1, X.cols);  // distinct positions ≤ columns
    const bool table = pmax - pmin + 1 <= X.cols;
    std::vector<T> cs(static_cast<std::size_t>(table ? 2 * span * half : 0));
    for (index_t r = 0; table && r < span; ++r)
        for (index_t i = 0; i < half; ++i) {
            const double a = double(pmin + r) * omega[std::size_t(i)];
            cs[std::size_t(2 * (r * half + i))] = T(std::cos(a));
            cs[std::size_t(2 * (r * half + i) + 1)] = T(std::sin(a));
        }
#pragma omp parallel for schedule(static) if (X.size() > 16384)
    for (index_t j = 0; j < X.cols; ++j) {  // line 2: every column t …
        T* x = X.col(j);
        for (index_t i = 0; i < half; ++i) {  // … and every pair i
            T c, s;  // line 3 (R(p)ᵀ = R(−p): the backward negates s)
            if (table) {
                const std::size_t k = std::size_t(2 * ((pos[j] - pmin) * half + i));
                c = cs[k], s = cs[k + 1];
            } else {
                const double a = double(pos[j]) * omega[std::size_t(i)];
                c = T(std::cos(a)), s = T(std::sin(a));
            }
            if (inverse) s = -s;
            for (index_t h = 0; h < n_heads; ++h) {
                T* u = x + h * d + i;
                T* v = u + half;
                const T x1 = *u, x2 = *v;
                *u = c * x1 - s * x2;  // line 4: X′[i, t] ← c X[i, t] − s X[i + d/2, t]
                *v = s * x1 + c * x2;  // line 5: X′[i + d/2, t] ← s X[i, t] + c X[i + d/2, t]
            }
        }
    }
}
}  // namespace

// ===================================== the part ========================================================
namespace {
// 2a Q ← RoPE(Q, (q₀, …, q₀+ℓ_x−1)), 2b K ← RoPE(K, (0, …, ℓ_z−1)) per sequence (q0 = 0 for the keys of a
// whole sequence, or the cache's length when appending); backward: R(p)ᵀ at the same positions.
template <class T>
class Rope final : public QKTransform<T> {
public:
    Rope(index_t d_attn, index_t r, double theta, double factor) : d_(d_attn), r_(r), theta_(theta), factor_(factor) {}
    void forward(MatView<T> M, typename QKTransform<T>::Role, index_t n_heads, const Seqs& s, index_t q0) const override {
        rotate(M, n_heads, s, q0, false);
    }
    void backward(MatView<T> dM, typename QKTransform<T>::Role, index_t n_heads, const Seqs& s, index_t q0) const override {
        rotate(dM, n_heads, s, q0, true);
    }

private:
    void rotate(MatView<T> M, index_t n_heads, const Seqs& s, index_t q0, bool inverse) const {
        std::vector<index_t> pos(std::size_t(M.cols));
        for (index_t b = 0; b < s.count(); ++b)
            for (index_t j = 0; j < s.len(b); ++j) pos[std::size_t(s.begin(b) + j)] = q0 + j;
        if (r_ == d_) return rope_scaled<T>(M, n_heads, d_, pos.data(), theta_, factor_, inverse);
        for (index_t h = 0; h < n_heads; ++h)
            rope_scaled<T>(M.rows_range(h * d_, r_), 1, r_, pos.data(), theta_, factor_, inverse);
    }
    index_t d_, r_;
    double theta_, factor_;
};

// the rows of a head RoPE rotates: ⌊d_attn · rotary_pct⌋ (Hugging Face's int(head_size * rotary_pct))
index_t rotary_dims(index_t d_attn, double pct) { return index_t(double(d_attn) * pct); }
// rope_theta finite and > 0; rotary_pct in (0, 1]; given the model, r even and >= 2, and not with V10's latent source
// (its own d_R rows)
void check_rope(const PartOptionValues& own, const ModelConfig* model) {
    const double theta = own.real("rope_theta");
    if (!(theta > 0) || !std::isfinite(theta)) throw ValueError("rope_theta must be a finite number > 0");
    const double p = own.real("rotary_pct");
    if (!(p > 0 && p <= 1)) throw ValueError("rotary_pct must be in (0, 1] (the share of each head's rows RoPE rotates)");
    if (!model) return;
    if (model->part_options.integer("kv_lora_rank") > 0) {  // V10 rotates its own qk_rope_head_dim rows
        if (p != 1.0)
            throw ValueError("rotary_pct is not an option of the latent Q/K/V source (kv_lora_rank): it rotates its "
                             "qk_rope_head_dim rows");
        return;
    }
    if (model->d_attn % 2 != 0)
        throw ValueError("positional='rope' rotates pairs of rows: d_attn (the head size) must be even, got " +
                         std::to_string(model->d_attn));
    const index_t r = rotary_dims(model->d_attn, p);
    if (r < 2 || r % 2 != 0)
        throw ValueError("rotary_pct rotates the first ⌊d_attn · rotary_pct⌋ = " + std::to_string(r) +
                         " rows of each head (d_attn = " + std::to_string(model->d_attn) + "): RoPE needs an even number >= 2");
}
}  // namespace

template <class T>
PositionPart<T> make_rope(const AttnSpec& spec, ParamStore<T>&, const std::string&) {
    if (spec.d_attn % 2 != 0)
        throw ValueError("RoPE rotates pairs of rows: d_attn (the head size) must be even, got " + std::to_string(spec.d_attn));
    check_rope(spec.v.options, nullptr);
    const index_t r = rotary_dims(spec.d_attn, spec.v.options.real("rotary_pct"));
    if (r < 2 || r % 2 != 0)
        throw ValueError("rotary_pct rotates the first ⌊d_attn · rotary_pct⌋ = " + std::to_string(r) +
                         " rows of each head: RoPE needs an even number >= 2");
    const double f = spec.v.options.real("rope_scaling_factor");
    if (!(f >= 0) || !std::isfinite(f)) throw ValueError("rope_scaling_factor must be a finite number > 0 (or None)");
    PositionPart<T> p;
    p.qk = std::make_shared<Rope<T>>(spec.d_attn, r, spec.v.options.real("rope_theta"), f > 0 ? f : 1.0);
    return p;
}
// θ (rope_theta): line 1's ω_i ← θ^(−2(i−1)/d). Linear position scaling (Gemma 3's global layers; Hugging Face's
// rope_type "linear"): every position p taken as p / f, so ω_i ← θ^(−2(i−1)/d) / f. All given with positional='rope'
// only (the selector chooses the part; with another positional they must be at their defaults).
// rotary_pct (GPT-NeoX): the listing on the first ⌊d_attn · rotary_pct⌋ rows of each head.
const PartRow& rope_position_row() {
    static const PartRow row{PartKind::Position,
                             "rope",
                             {{"rope_theta", archs::D, OptionKind::Real, 10000.0, OptionCheck::Positive,
                               "V1's θ (line 1: ω_i = θ^(−2(i−1)/d)); V10's latent source rotates with it too"},
                              {"rope_scaling_factor", archs::D, OptionKind::AutoReal, 0.0, OptionCheck::None,
                               "V1 with linear position scaling: positions p/f (Gemma 3's global layers; with V26's "
                               "rope_local_base_freq, the local layers unscaled). None: f = 1"},
                              {"rotary_pct", archs::D, OptionKind::Real, 1.0, OptionCheck::Positive,
                               "V1 with GPT-NeoX's partial rotary: RoPE rotates the first ⌊d_attn · rotary_pct⌋ rows of "
                               "each head (1.0: all)"}},
                             check_rope,
                             nullptr,
                             false};
    return row;
}


template void rope<float>(MatView<float>, index_t, index_t, const index_t*, double, bool);
template void rope<double>(MatView<double>, index_t, index_t, const index_t*, double, bool);
template PositionPart<float> make_rope<float>(const AttnSpec&, ParamStore<float>&, const std::string&);
template PositionPart<double> make_rope<double>(const AttnSpec&, ParamStore<double>&, const std::string&);

}  // namespace ft
