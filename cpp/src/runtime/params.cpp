#include "formal_transformers/params.hpp"

#include <algorithm>

#include "huge_pages.hpp"

namespace ft {

template <class T>
index_t ParamStore<T>::add(ParamInfo info) {
    FT_CHECK(!allocated_, "parameter declared after allocation: " + info.name);
    FT_CHECK(!find(info.name), "duplicate parameter name: " + info.name);
    for (index_t s : info.shape)
        if (s <= 0) throw ValueError("parameter " + info.name + " would have a non-positive dimension");
    info.offset = total_;
    info.size = 1;
    const std::string what = "parameter " + info.name;
    for (index_t s : info.shape) info.size = checked_mul(info.size, s, what.c_str());
    // θ and its gradient: checked against the bound as they are declared, so a huge one fails at once
    const index_t total = checked_add(total_, info.size, what.c_str());
    check_bytes(checked_mul(total, 2, what.c_str()), sizeof(T), (what + " (θ and its gradient)").c_str());
    total_ = total;
    index_.emplace(info.name, entries_.size());
    entries_.push_back(std::move(info));
    return entries_.back().offset;
}

template <class T>
MatParam ParamStore<T>::matrix(const std::string& name, index_t rows, index_t cols) {
    const index_t off = add({name, {rows, cols}, {1, rows}, 0, 0});
    return {off, rows, cols};
}

template <class T>
VecParam ParamStore<T>::vector(const std::string& name, index_t n) {
    const index_t off = add({name, {n}, {1}, 0, 0});
    return {off, n};
}

template <class T>
MatParam ParamStore<T>::stacked(const std::string& name, index_t H, index_t rows, index_t cols) {
    const index_t off = add({name, {H, rows, cols}, {rows, 1, checked_mul(H, rows, name.c_str())}, 0, 0});
    return {off, H * rows, cols};
}

template <class T>
VecParam ParamStore<T>::stacked_vector(const std::string& name, index_t H, index_t n) {
    const index_t off = add({name, {H, n}, {n, 1}, 0, 0});
    return {off, H * n};
}

template <class T>
void ParamStore<T>::freeze(index_t offset) {
    for (auto& e : entries_)
        if (e.offset == offset) {
            e.trainable = false;
            return;
        }
    FT_CHECK(false, "freeze: no parameter at that offset");
}

template <class T>
void ParamStore<T>::train_only(const std::vector<bool>& train) {
    FT_CHECK(train.size() == entries_.size(), "train_only: one flag per parameter");
    left_out_.assign(train.size(), false);
    for (std::size_t k = 0; k < train.size(); ++k) left_out_[k] = !train[k];
}

template <class T>
void ParamStore<T>::clear_train_only() {
    left_out_.clear();
}

template <class T>
bool ParamStore<T>::trains(const ParamInfo& e) const {
    if (!e.trainable) return false;
    if (left_out_.empty()) return true;
    return !left_out_[std::size_t(&e - entries_.data())];
}

template <class T>
T* ParamStore<T>::grad_if_trained(index_t offset) {
    if (left_out_.empty()) return grad_.data() + offset;
    // entries_ are in offset order: the one starting at `offset`
    const auto it = std::lower_bound(entries_.begin(), entries_.end(), offset,
                                     [](const ParamInfo& e, index_t o) { return e.offset < o; });
    FT_CHECK(it != entries_.end() && it->offset == offset, "grad_if_trained: no parameter at that offset");
    // an adapted W's gradient is ∂loss/∂W', which its adapter's backward needs
    return left_out_[std::size_t(it - entries_.begin())] && !adapted_at_.count(offset) ? nullptr : grad_.data() + offset;
}

template <class T>
std::vector<std::pair<index_t, index_t>> ParamStore<T>::trainable_ranges() const {
    std::vector<std::pair<index_t, index_t>> r;
    for (const auto& e : entries_) {
        if (!trains(e)) continue;
        if (!r.empty() && r.back().second == e.offset)
            r.back().second = e.offset + e.size;
        else
            r.emplace_back(e.offset, e.offset + e.size);
    }
    return r;
}

template <class T>
void ParamStore<T>::allocate() {
    FT_CHECK(!allocated_, "ParamStore allocated twice");
    theta_ = huge_zeros<T>(std::size_t(total_));  // streamed whole by every step: 2 MB pages (huge_pages.hpp)
    grad_ = huge_zeros<T>(std::size_t(total_));
    allocated_ = true;
    if (!adapters_.empty()) {
        index_t n = 0;
        for (Adapter& ad : adapters_) ad.at = n, n += ad.rows * ad.cols;
        eff_.assign(std::size_t(n), T(0));
        seen_.clear();  // made at the first refresh
    }
}

template <class T>
const ParamInfo* ParamStore<T>::find(const std::string& name) const {
    const auto it = index_.find(name);
    return it == index_.end() ? nullptr : &entries_[it->second];
}

template <class T>
const ParamInfo& ParamStore<T>::entry(const std::string& name) const {
    const ParamInfo* e = find(name);
    if (!e) throw ValueError("no parameter named '" + name + "'");
    return *e;
}

// Parallel over the pool: at GPT-2-small size the buffer is 500 MB, and one thread does not reach the
// memory bandwidth (docs/benchmarks.md "Threads"). Chunks of 64 KB; small stores (the
// baby GPT's 3 MB) stay on the calling thread.
template <class T>
void ParamStore<T>::zero_grad() {
    T* g = grad_.data();
    const index_t n = index_t(grad_.size()), chunk = index_t(65536 / sizeof(T));
    const index_t n_chunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (n > (index_t(1) << 21))
    for (index_t c = 0; c < n_chunks; ++c) std::fill(g + c * chunk, g + std::min(n, (c + 1) * chunk), T(0));
}

template <class T>
void ParamStore<T>::fill(index_t offset, index_t n, T value) {
    std::fill(theta_.data() + offset, theta_.data() + offset + n, value);
}

template <class T>
void ParamStore<T>::normal(index_t offset, index_t n, double stddev, Rng& rng) {
    T* p = theta_.data() + offset;
    for (index_t i = 0; i < n; ++i) p[i] = T(stddev * rng.normal());
}

template class ParamStore<float>;
template class ParamStore<double>;

}  // namespace ft
