// formal-transformers: the numeric substrate shared by every listing.
//
// Conventions (docs/design.md "Numerics"):
//  * Column convention: a sequence of token vectors is a [d, l] matrix whose column t is token t,
//    stored column-major so each token's vector is contiguous.
//  * Owned storage is xtensor (`Tensor<T, N>`, column-major, std::vector storage: shrinking keeps the
//    capacity, so a workspace that has once held the largest batch never reallocates).
//  * Hot code works on `MatView`: a pointer, a shape and a leading dimension. A view can name a block
//    of a bigger matrix (one head's rows of Q, one sequence's columns of a batch) without copying,
//    which is what lets every product be one BLAS call on the original buffer (blas.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <xtensor/xtensor.hpp>

#include "formal_transformers/sizes.hpp"

namespace ft {

using index_t = std::ptrdiff_t;
// A token sequence in the xtensor API (formal_transformers.hpp): 0-based ids, int64. Its storage is a
// std::vector, as every array the API takes or returns (Tensor below): xt::xtensor's default storage is
// aligned for the SIMD width the including file was compiled for, so its type would differ between the
// core and a program built with other flags. An xt::xtensor<index_t, 1> converts to it (one copy).
using TokenIds = xt::xtensor_container<std::vector<index_t>, 1, xt::layout_type::row_major>;

// ---------------------------------------------------------------------------------------------------
// Errors. The core throws these; the bindings translate them to the Python exception of the same name.
struct ValueError : std::invalid_argument {
    using std::invalid_argument::invalid_argument;
};
struct IndexError : std::out_of_range {
    using std::out_of_range::out_of_range;
};
struct TypeError : std::invalid_argument {
    using std::invalid_argument::invalid_argument;
};
// Thrown by poll() when the user asked to stop (Ctrl-C); the bindings re-raise KeyboardInterrupt.
struct Interrupted : std::runtime_error {
    Interrupted() : std::runtime_error("interrupted") {}
};

// Internal invariant (a bug in the core, not bad user input): cheap, always on.
#define FT_CHECK(cond, msg)                                                                         \
    do {                                                                                            \
        if (!(cond)) throw std::logic_error(std::string("formal_transformers internal: ") + (msg)); \
    } while (0)

// ---------------------------------------------------------------------------------------------------
// Owned storage.
template <class T, std::size_t N>
using Tensor = xt::xtensor_container<std::vector<T>, N, xt::layout_type::column_major>;
template <class T>
using Matrix = Tensor<T, 2>;
template <class T>
using Vector = Tensor<T, 1>;

// ---------------------------------------------------------------------------------------------------
// A column-major [rows, cols] block with leading dimension ld >= rows: element (i, j) is data[i + j*ld].
template <class T>
struct MatView {
    T* data = nullptr;
    index_t rows = 0, cols = 0, ld = 0;

    MatView() = default;
    MatView(T* d, index_t r, index_t c) : data(d), rows(r), cols(c), ld(r > 0 ? r : 1) {}
    MatView(T* d, index_t r, index_t c, index_t l) : data(d), rows(r), cols(c), ld(l) {}
    template <class U, class = std::enable_if_t<std::is_same_v<const U, T>>>
    MatView(const MatView<U>& o) : data(o.data), rows(o.rows), cols(o.cols), ld(o.ld) {}

    T* col(index_t j) const { return data + j * ld; }
    T& operator()(index_t i, index_t j) const { return data[i + j * ld]; }
    // columns [j0, j0+n): e.g. one sequence of a batch
    MatView cols_range(index_t j0, index_t n) const { return {data + j0 * ld, rows, n, ld}; }
    // rows [i0, i0+n): e.g. one head's block of the stacked Q = [Q^1; ...; Q^H]
    MatView rows_range(index_t i0, index_t n) const { return {data + i0, n, cols, ld}; }
    bool contiguous() const { return ld == rows || cols <= 1; }
    index_t size() const { return rows * cols; }
};
template <class T>
using CMatView = MatView<const T>;

template <class T>
MatView<T> view(Matrix<T>& m) {
    return {m.data(), index_t(m.shape(0)), index_t(m.shape(1))};
}
template <class T>
CMatView<T> view(const Matrix<T>& m) {
    return {m.data(), index_t(m.shape(0)), index_t(m.shape(1))};
}
// Resize a workspace matrix; reuses capacity (no allocation once it has held this many elements). The size
// is checked (sizes.hpp) before anything is allocated: ValueError if it overflows or exceeds the bound.
template <class T>
MatView<T> ensure(Matrix<T>& m, index_t rows, index_t cols) {
    if (index_t(m.shape(0)) != rows || index_t(m.shape(1)) != cols) {
        checked_elements({rows, cols}, sizeof(T), "workspace");
        m.resize({std::size_t(rows), std::size_t(cols)});
    }
    return view(m);
}
template <class T>
T* ensure(Vector<T>& v, index_t n) {
    if (index_t(v.shape(0)) != n) v.resize({std::size_t(check_bytes(n, sizeof(T), "workspace"))});
    return v.data();
}

// ---------------------------------------------------------------------------------------------------
// A batch of sequences laid side by side as columns: sequence b is columns [off[b], off[b+1]).
// Sequences may have different lengths; nothing is padded, so no padding can change a result.
struct Seqs {
    std::vector<index_t> off{0};

    Seqs() = default;
    static Seqs single(index_t l) { Seqs s; s.off.push_back(l); return s; }
    static Seqs from_lengths(const std::vector<index_t>& lengths) {
        Seqs s;
        for (index_t l : lengths) s.off.push_back(s.off.back() + l);
        return s;
    }
    index_t count() const { return index_t(off.size()) - 1; }
    index_t begin(index_t b) const { return off[b]; }
    index_t len(index_t b) const { return off[b + 1] - off[b]; }
    index_t total() const { return off.back(); }
    index_t max_len() const {
        index_t m = 0;
        for (index_t b = 0; b < count(); ++b) m = std::max(m, len(b));
        return m;
    }
};

// ---------------------------------------------------------------------------------------------------
// Cooperative interruption. Long core loops call poll() at safe points (between layers, between
// training steps; never inside an OpenMP region). The Python module installs a hook that re-acquires
// the GIL at most every ~10 ms, runs the signal handlers and throws Interrupted on Ctrl-C.
using PollHook = std::function<void()>;
void set_poll_hook(PollHook hook);
void poll();

// ---------------------------------------------------------------------------------------------------
// Threads. One OpenMP pool serves both the element-wise kernels and the BLAS (its parallel jobs run on
// our threads, blas.hpp), so they never fight (docs/design.md "Threads"). Flush-to-zero /
// denormals-are-zero: only inside core calls, on the caller's thread and the pool's (fpenv.hpp).
// n in [1, max_num_threads()], else ValueError (libgomp crashes the process when it cannot create the
// threads). max_num_threads() = 4 per CPU, at least kMinThreadCap, within OMP_THREAD_LIMIT and,
// under an address-space limit (ulimit -v), half of it at one stack (RLIMIT_STACK, else 2 MiB) per thread.
constexpr int kMinThreadCap = 64;
int max_num_threads();
void set_num_threads(int n);
int get_num_threads();
void init_threads();  // idempotent; called by the bindings at import (sets no FTZ/DAZ: fpenv.hpp)
// For the lifetime of this object, the calling thread runs its OpenMP regions (and the BLAS) alone: for work too small to share between threads, such as decoding one token with the
// KV cache (one column per layer), where waking a second thread for each small product costs more than the
// product (bench/bench_inference.py). The previous thread count is restored on exit.
// Decoding feeds at most this many new tokens on one thread (SingleThreadScope); more (a long prompt's first
// fill) use the pool.
constexpr index_t kFewColumns = 16;
class SingleThreadScope {
public:
    SingleThreadScope();
    ~SingleThreadScope();
    SingleThreadScope(const SingleThreadScope&) = delete;
    SingleThreadScope& operator=(const SingleThreadScope&) = delete;

private:
    int saved_;
};

// ---------------------------------------------------------------------------------------------------
// Deterministic random numbers: the same seed gives the same stream on every platform (std::mt19937_64
// is fully specified; the conversions to uniform and normal below are ours, not the library's).
class Rng {
public:
    explicit Rng(std::uint64_t seed = 0) : g_(seed) {}
    void seed(std::uint64_t s) { g_.seed(s); has_spare_ = false; }
    std::uint64_t next() { return g_(); }
    // uniform in [0, 1) with 53 random bits
    double uniform() { return double(g_() >> 11) * 0x1.0p-53; }
    // uniform integer in [0, n)
    std::uint64_t below(std::uint64_t n);
    // standard normal (Marsaglia polar method)
    double normal();
    const std::mt19937_64& engine() const { return g_; }
    std::mt19937_64& engine() { return g_; }

private:
    std::mt19937_64 g_;
    bool has_spare_ = false;
    double spare_ = 0.0;
};

// One step of splitmix64 (Steele et al. 2014) from state x: a 64-bit mix with full avalanche.
std::uint64_t splitmix64(std::uint64_t x);
// The seed of a part's own random numbers (V15's features, V17's random blocks): the model's seed and the
// part's name mixed, splitmix64(seed ⊕ splitmix64(FNV-1a(name))), so that parts of one seed draw apart.
std::uint64_t named_seed(std::uint64_t seed, const std::string& name);

}  // namespace ft
