// Dropout (Algorithms D1, D2 of docs/regularisation.md; Srivastava et al. 2014), forward and backward.
//
// Algorithm D1: Ỹ ← Dropout(Y | p, M)
//   1  for i ∈ [d], t ∈ [ℓ]: M[i, t] ← [[u_{i,t} ≥ p]],  u_{i,t} ~ Uniform[0, 1) independently
//   2  return Ỹ = Y ⊙ M / (1 − p)
// Algorithm D2: dY ← DropoutBackward(dỸ | p, M)
//   1  return dY = dỸ ⊙ M / (1 − p)
#include "formal_transformers/dropout.hpp"

#include <cmath>
#include <string>

#include "formal_transformers/sizes.hpp"

namespace ft {

namespace {
using detail::golden;
using detail::mix64;
inline std::uint64_t stream_of(const DropoutKey& k) {
    return mix64(mix64(mix64(k.seed + golden) ^ (k.step + 2 * golden)) ^ (k.place + 3 * golden));
}
// entry i of a stream: splitmix64's i-th output from state s
inline double uniform_at(std::uint64_t s, std::uint64_t i) { return double(mix64(s + (i + 1) * golden) >> 11) * 0x1.0p-53; }
std::uint64_t threshold_of(double p) { return std::uint64_t(std::ceil(p * 0x1.0p53)); }

// entry i of D1: line 1 M = [[u ≥ p]] (as m ≥ ⌈p·2^53⌉ on the top 53 bits m), line 2 Ỹ = Y ⊙ M / (1 − p)
template <class T>
inline void drop_one(std::uint64_t base, std::uint64_t threshold, T scale, index_t i, T* y, std::uint8_t* keep) {
    const bool kept = (mix64(base + std::uint64_t(i) * golden) >> 11) >= threshold;
    keep[i] = kept;
    y[i] = kept ? y[i] * scale : T(0);
}

// Run f(i) for every entry i < n: threads only for over kThreadedEntries entries (fewer are not worth waking
// a thread); below, a plain simd loop (a `parallel for simd if(false)` is much slower than it: docs/benchmarks.md
// "Threads"). The loop body exists once, in f: both sizes run the same code (tests/cpp
// test_transformers.cpp, Dropout.LargeMasksEqualSmallOnes, crosses the threshold).
constexpr index_t kThreadedEntries = index_t(1) << 20;
template <class F>
inline void for_entries(index_t n, F&& f) {
    if (n > kThreadedEntries) {
#pragma omp parallel for simd schedule(static)
        for (index_t i = 0; i < n; ++i) f(i);
    } else {
#pragma omp simd
        for (index_t i = 0; i < n; ++i) f(i);
    }
}
}  // namespace

double dropout_uniform(const DropoutKey& k, std::uint64_t i) { return uniform_at(stream_of(k), i); }

DropoutStream::DropoutStream(double p, const DropoutKey& k) : s_(stream_of(k)), threshold_(threshold_of(p)) {}

template <class T>
void dropout_forward(double p, const DropoutKey& k, std::uint64_t i0, T* y, index_t n, std::uint8_t* keep) {
    const std::uint64_t s = stream_of(k);
    const T scale = T(1.0 / (1.0 - p));
    // u ≥ p with u = m·2^-53 (m: the top 53 bits) ⇔ m ≥ ⌈p·2^53⌉ (p·2^53 is exact): the same test as
    // dropout_uniform's, in integers, so the loop vectorises
    const std::uint64_t threshold = threshold_of(p);
    const std::uint64_t base = s + (i0 + 1) * golden;
    for_entries(n, [&](index_t i) { drop_one(base, threshold, scale, i, y, keep); });
}

template <class T>
void dropout_backward(double p, const std::uint8_t* keep, T* dy, index_t n) {
    const T scale = T(1.0 / (1.0 - p));
    for_entries(n, [&](index_t i) { dy[i] = keep[i] ? dy[i] * scale : T(0); });  // D2 line 1: dY = dỸ ⊙ M / (1 − p)
}

template <class T>
void Dropout::apply(double p, std::uint64_t place, MatView<T> m, DropoutMask& mask) const {
    mask.p = p;
    if (!(p > 0)) {
        mask.keep.clear();
        return;
    }
    FT_CHECK(m.contiguous(), "dropout on a strided matrix");
    mask.keep.resize(std::size_t(check_bytes(m.size(), 1, "dropout mask")));
    dropout_forward<T>(p, key(place), 0, m.data, m.size(), mask.keep.data());
}

void check_dropout_rate(double p, const char* name) {
    if (!(p >= 0 && p < 1))  // NaN fails too
        throw ValueError(std::string(name) + " must be in [0, 1) (a dropout rate), got " + std::to_string(p));
}

template void dropout_forward<float>(double, const DropoutKey&, std::uint64_t, float*, index_t, std::uint8_t*);
template void dropout_forward<double>(double, const DropoutKey&, std::uint64_t, double*, index_t, std::uint8_t*);
template void dropout_backward<float>(double, const std::uint8_t*, float*, index_t);
template void dropout_backward<double>(double, const std::uint8_t*, double*, index_t);
template void Dropout::apply<float>(double, std::uint64_t, MatView<float>, DropoutMask&) const;
template void Dropout::apply<double>(double, std::uint64_t, MatView<double>, DropoutMask&) const;

}  // namespace ft
