// Large buffers that a training step streams whole (θ, its gradient, Adam's moments): asked to be backed by 2 MB
// pages, so that each pass over them (the optimizer's check and writing pass, zero_grad, the products' packing of
// the weights) walks a 512th of the page-table entries. A hint and nothing else: the contents, addresses and
// arithmetic are unchanged, and where the system has no such pages on request (Linux's transparent huge pages off,
// another OS) nothing happens. The advice must come before the first write (a page already touched keeps its size
// until the kernel's background collapsing, if ever): huge_zeros allocates, advises, then zero-fills.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "formal_transformers/common.hpp"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace ft {

inline void advise_huge_pages(void* p, std::size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    constexpr std::uintptr_t huge = std::uintptr_t(1) << 21;
    if (!p || bytes < 2 * huge) return;  // below 4 MB at most one whole 2 MB page inside: not worth a system call
    const std::uintptr_t begin = (std::uintptr_t(p) + huge - 1) & ~(huge - 1),
                         end = (std::uintptr_t(p) + bytes) & ~(huge - 1);  // the whole 2 MB pages inside the buffer
    if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
    (void)p, (void)bytes;
#endif
}

// A Vector of n zeros whose whole 2 MB pages are advised huge before the zeros are written: the storage is reserved
// (allocated, untouched), advised, then sized (value-initialised: the first write); the same Vector as from_shape
// and fill(0) make otherwise.
template <class T>
Vector<T> huge_zeros(std::size_t n) {
    std::vector<T> buf;
    buf.reserve(n);
    advise_huge_pages(buf.data(), n * sizeof(T));
    buf.resize(n);
    Vector<T> v = Vector<T>::from_shape({std::size_t(0)});
    v.storage() = std::move(buf);
    v.resize({n});  // the shape only: the storage already holds n
    return v;
}

}  // namespace ft
