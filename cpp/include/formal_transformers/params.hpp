// θ in one place. Parameters, their gradients (and the optimizer's moments, optim.hpp) live in one flat
// buffer each, with named views into it (docs/design.md): an optimizer step is one loop, and numpy sees each
// parameter as a zero-copy view. The buffers are allocated once and never move, so views stay valid.
#pragma once

#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <xtensor/xadapt.hpp>

#include "formal_transformers/common.hpp"
#include "formal_transformers/dropout.hpp"

namespace ft {

// One named parameter: where it sits in the flat buffers, and how numpy should see it.
struct ParamInfo {
    std::string name;
    std::vector<index_t> shape;    // as the API shows it, e.g. W_q (H, d_attn, d_x)
    std::vector<index_t> strides;  // in elements, e.g. (d_attn, 1, H*d_attn): each head a row block
    index_t offset = 0, size = 0;  // of the flat buffer
    bool trainable = true;         // false: fixed (e.g. sinusoidal W_p); optimizers skip it
};

// Handles into the store, resolved to pointers on use (so a component may be declared before the store
// is allocated). A matrix parameter is column-major [rows, cols] and contiguous.
struct MatParam {
    index_t offset = -1, rows = 0, cols = 0;
};
struct VecParam {
    index_t offset = -1, size = 0;
};

template <class T>
class ParamStore {
public:
    using value_type = T;
    ParamStore() = default;
    ParamStore(const ParamStore&) = delete;
    ParamStore& operator=(const ParamStore&) = delete;

    // Declaration phase (before allocate()).
    MatParam matrix(const std::string& name, index_t rows, index_t cols);
    VecParam vector(const std::string& name, index_t n);
    // H stacked blocks [H, rows, cols], stored as one column-major [H*rows, cols] matrix: block h is
    // rows [h*rows, (h+1)*rows). One gemm then serves all heads (attention.hpp).
    MatParam stacked(const std::string& name, index_t H, index_t rows, index_t cols);
    // H stacked vectors [H, n], stored as one contiguous vector of H*n.
    VecParam stacked_vector(const std::string& name, index_t H, index_t n);
    // Mark a declared parameter as fixed: it stays in θ (and in `params`) but optimizers skip it and no
    // backward writes its gradient (sinusoidal W_p).
    void freeze(index_t offset);
    // The trainable part of the flat buffer as [begin, end) ranges (merged), for optimizers: the parameters
    // neither fixed (freeze) nor left out of the current training run (train_only).
    std::vector<std::pair<index_t, index_t>> trainable_ranges() const;
    // A training run on a subset of θ (the trainers' `trainable=`): train[k] says whether entries()[k] trains.
    // Until clear_train_only(), the others are frozen as fixed ones are: the optimizers skip them and the
    // backward passes that can leave a frozen weight's gradient out do (grad_if_trained: its gradient stays
    // as zero_grad left it). θ, its names and the gradient buffer keep their layout.
    void train_only(const std::vector<bool>& train);
    void clear_train_only();
    bool trains(const ParamInfo& e) const;  // e trains in the current run: not fixed and not left out
    // The gradient of the parameter at `offset` when it trains in the current run, else null (a backward
    // that receives null skips that gradient's product: affine_backward's dW, db).
    T* grad_if_trained(index_t offset);
    template <class P>
    T* grad_if_trained(const P& p) { return grad_if_trained(p.offset); }
    // Tied weights (W_u = W_eᵀ) are not a second entry: the model uses W_e transposed (transformers.hpp).

    void allocate();  // zero-filled; once
    bool allocated() const { return allocated_; }

    index_t size() const { return total_; }
    const std::vector<ParamInfo>& entries() const { return entries_; }
    const ParamInfo& entry(const std::string& name) const;
    const ParamInfo* find(const std::string& name) const;

    T* theta() { return theta_.data(); }
    const T* theta() const { return theta_.data(); }
    T* grad() { return grad_.data(); }
    const T* grad() const { return grad_.data(); }

    // The weight the listings compute with: θ's W, or W' = W + s·B·A when W carries a LoRA adapter (lora.cpp)
    MatView<T> W(const MatParam& p) {
        if (const T* e = adapted(p.offset)) return {const_cast<T*>(e), p.rows, p.cols};
        return {theta_.data() + p.offset, p.rows, p.cols};
    }
    CMatView<T> W(const MatParam& p) const {
        if (const T* e = adapted(p.offset)) return {e, p.rows, p.cols};
        return {theta_.data() + p.offset, p.rows, p.cols};
    }
    MatView<T> dW(const MatParam& p) { return {grad_.data() + p.offset, p.rows, p.cols}; }
    T* v(const VecParam& p) { return theta_.data() + p.offset; }
    const T* v(const VecParam& p) const { return theta_.data() + p.offset; }
    T* dv(const VecParam& p) { return grad_.data() + p.offset; }

    // LoRA (docs/variants.md, lora.cpp): the matrix at W_offset [rows, cols] is used as W' = W + s·B·A, with
    // A [r, cols] and B [rows, r] parameters of this store (declared before allocate()).
    struct Adapter {
        std::string name;  // W's
        index_t W, A, B, rows, cols, r;
        double scale;      // s = α / r
        index_t at = 0;    // W' in the adapted buffer
        double dropout = 0;  // p of the dropout on the adapter's input (training forwards only; lora.hpp lines 2′–3′)
    };
    // What a training forward keeps of an adapter whose input drops (lines 2′–3′), for its backward and for
    // dropout_masks(): the mask M, X̃ = Dropout(X | p, M) and A X̃; `used`: line 3′ ran in this forward.
    struct AdapterRun {
        DropoutMask mask;
        Matrix<T> Xt, AXt, G, dXt;  // X̃, A X̃; the backward's Bᵀ ∂Y and s Aᵀ Bᵀ ∂Y
        bool used = false;
    };
    void adapt(const Adapter& a);
    const std::vector<Adapter>& adapters() const { return adapters_; }
    // line 1 of the listing for every adapter whose W, A or B changed since its W' was computed (all of them
    // after allocate()); called by every forward (TokenEmbedding::forward, the first line of each listing).
    // It also forgets the adapters' dropout masks of the last forward.
    void refresh_adapters() const;
    // the backward lines: ∂loss/∂A, ∂loss/∂B from ∂loss/∂W' (which the listings' backward left in W's gradient),
    // for the adapters that were used as W' (line 2); the dropping ones (line 3′) have theirs already
    void adapters_backward();
    // LoRA's dropout (lora.hpp lines 2′–3′): between lora_training(true, seed, step) and lora_training(false) (a
    // training forward and its backward, Model::run_loss) the adapters with p > 0 drop their input, with masks
    // keyed by (seed, step, the adapter). lora_drops(W): W carries such an adapter in such a run (its index, else -1).
    void lora_training(bool on, std::uint64_t seed = 0, std::uint64_t step = 0);
    index_t lora_drops(const MatParam& p) const {
        if (!lora_run_on_ || adapted_at_.empty()) return -1;
        const auto it = adapted_at_.find(p.offset);
        return it == adapted_at_.end() || !(adapters_[it->second].dropout > 0) ? -1 : index_t(it->second);
    }
    DropoutKey lora_key(index_t k) const {
        return {lora_seed_, lora_step_, DropPlace{DropGroup::Lora, std::uint64_t(k)}.at(DropSite::EmbedX)};
    }
    AdapterRun& adapter_run(index_t k) const { return runs_[std::size_t(k)]; }
    void zero_grad();
    // Initialisation helpers (seeded; see the init table in README.md).
    void fill(index_t offset, index_t n, T value);
    void normal(index_t offset, index_t n, double stddev, Rng& rng);

private:
    index_t add(ParamInfo info);
    std::vector<ParamInfo> entries_;
    std::unordered_map<std::string, std::size_t> index_;  // name -> position in entries_ (a scan made
                                                          // declaring L layers quadratic in L)
    std::vector<bool> left_out_;
    std::vector<Adapter> adapters_;
    std::unordered_map<index_t, std::size_t> adapted_at_;  // W offset -> its adapter
    mutable std::vector<T> eff_, seen_;                    // W' of each adapter; the W, A, B it was made from
    mutable std::mutex adapters_mutex_;
    mutable std::vector<AdapterRun> runs_;  // per adapter (lora_training)
    bool lora_run_on_ = false;
    std::uint64_t lora_seed_ = 0, lora_step_ = 0;
    const T* adapted(index_t offset) const {
        if (adapted_at_.empty()) return nullptr;
        const auto it = adapted_at_.find(offset);
        return it == adapted_at_.end() ? nullptr : eff_.data() + adapters_[it->second].at;
    }                          // train_only: per entry, frozen for this run (empty: none)
    index_t total_ = 0;
    bool allocated_ = false;
    Vector<T> theta_, grad_;
};

// θ (or its gradient) by name as writable xtensor adaptors over the flat buffer: no copy, so writing through
// a view changes the parameter (the C++ counterpart of Python's `obj.params` / `obj.grads`). Shapes and
// strides are the API's (ParamInfo: e.g. W_q (H, d_attn, d_x), each head a row block). Valid while the
// store lives (its buffers never move).
template <class T>
using ParamView = decltype(xt::adapt(std::declval<T*>(), std::size_t(0), xt::no_ownership(),
                                     std::declval<std::vector<std::size_t>>(), std::declval<std::vector<std::ptrdiff_t>>()));
template <class T>
class ParamViews {
public:
    ParamViews(ParamStore<T>& store, bool grads) : store_(&store), grads_(grads) {}
    // ValueError naming the parameter when θ has none of that name
    ParamView<T> operator[](const std::string& name) const {
        const ParamInfo* e = store_->find(name);
        if (!e) throw ValueError("no parameter named '" + name + "'");
        std::vector<std::size_t> shape(e->shape.begin(), e->shape.end());
        std::vector<std::ptrdiff_t> strides(e->strides.begin(), e->strides.end());
        T* base = (grads_ ? store_->grad() : store_->theta()) + e->offset;
        return xt::adapt(std::move(base), std::size_t(e->size), xt::no_ownership(), std::move(shape), std::move(strides));
    }
    bool contains(const std::string& name) const { return store_->find(name) != nullptr; }
    std::vector<std::string> names() const {
        std::vector<std::string> r;
        for (const ParamInfo& e : store_->entries()) r.push_back(e.name);
        return r;
    }

private:
    ParamStore<T>* store_;
    bool grads_;
};

}  // namespace ft
