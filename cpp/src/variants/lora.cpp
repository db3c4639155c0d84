// LoRA: the listing of lora.hpp, forward (line 1) and backward (d1) side by side, over the adapters of a
// ParamStore (params.hpp: W(p) hands the listings W' of an adapted matrix).
#include "formal_transformers/lora.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "formal_transformers/blas.hpp"
#include "formal_transformers/training.hpp"

namespace ft {

namespace {
// The matrices an adapter may sit on: the ones the listings read through ParamStore::W
const char* const kAdaptable[] = {"W_q", "W_k", "W_v", "W_o", "W_mlp1", "W_mlp2", "W_mlp3", "W_mlp4", "W_gate"};
std::string last_part(const std::string& name) {
    const std::size_t dot = name.rfind('.');
    return dot == std::string::npos ? name : name.substr(dot + 1);
}
bool names(const std::string& target, const std::string& name) {
    return name == target || last_part(name) == target || glob_match(target, name);
}
}  // namespace

void check_lora(const ModelConfig::Lora& c) {
    if (c.r < 1) throw ValueError("lora: r must be >= 1, got " + std::to_string(c.r));
    if (!(c.alpha > 0) || !std::isfinite(c.alpha)) throw ValueError("lora: alpha must be a finite number > 0, got " + std::to_string(c.alpha));
    if (!(c.dropout >= 0 && c.dropout < 1)) throw ValueError("lora: dropout must be in [0, 1), got " + std::to_string(c.dropout));
    if (c.dropout != 0)
        throw ValueError("lora: dropout > 0 on the adapter's input is not implemented (W' = W + s·B·A serves every "
                         "column at once); use dropout=0.0");
    if (c.targets.empty()) throw ValueError("lora: targets is empty: name at least one matrix (e.g. 'W_q')");
    for (const std::string& t : c.targets)
        if (t.empty()) throw ValueError("lora: an empty target names no matrix");
}

template <class T>
void declare_lora(const ModelConfig::Lora& c, ParamStore<T>& store) {
    if (c.targets.empty()) return;
    check_lora(c);
    std::vector<const ParamInfo*> chosen;
    for (const std::string& t : c.targets) {
        bool any = false;
        for (const ParamInfo& e : store.entries()) {
            if (!names(t, e.name)) continue;
            any = true;
            const bool matrix = (e.shape.size() == 2 && e.strides[0] == 1) || e.shape.size() == 3;
            const std::string part = last_part(e.name);
            if (!matrix || std::none_of(std::begin(kAdaptable), std::end(kAdaptable), [&](const char* k) { return part == k; }))
                throw ValueError("lora: target '" + t + "' names " + e.name + ", which is not " +
                                 (matrix ? "an attention or MLP matrix (LoRA adapts W_q, W_k, W_v, W_o, W_mlp1…W_mlp4, W_gate)"
                                         : "a matrix"));
            if (std::find(chosen.begin(), chosen.end(), &e) == chosen.end()) chosen.push_back(&e);
        }
        if (!any) throw ValueError("lora: target '" + t + "' matches no parameter of the model (model.params lists them)");
    }
    std::sort(chosen.begin(), chosen.end(), [](const ParamInfo* a, const ParamInfo* b) { return a->offset < b->offset; });
    const double scale = c.alpha / double(c.r);
    std::vector<typename ParamStore<T>::Adapter> adapters;
    for (const ParamInfo* e : chosen) {
        const index_t rows = e->shape.size() == 3 ? e->shape[0] * e->shape[1] : e->shape[0];
        const index_t cols = e->shape.back();
        if (c.r > std::min(rows, cols))
            throw ValueError("lora: r = " + std::to_string(c.r) + " is larger than a dimension of " + e->name + " (" +
                             std::to_string(rows) + " x " + std::to_string(cols) + ")");
        adapters.push_back({e->name, e->offset, 0, 0, rows, cols, c.r, scale, 0});
    }
    for (auto& a : adapters) {  // A, B after every other entry of θ, in the matrices' order
        a.A = store.matrix(a.name + ".lora_A", a.r, a.cols).offset;
        a.B = store.matrix(a.name + ".lora_B", a.rows, a.r).offset;
        store.adapt(a);
    }
}

template <class T>
void ParamStore<T>::adapt(const Adapter& a) {
    FT_CHECK(!allocated_, "ParamStore::adapt after allocation");
    adapted_at_.emplace(a.W, adapters_.size());
    adapters_.push_back(a);
}

template <class T>
void ParamStore<T>::refresh_adapters() const {
    if (adapters_.empty()) return;
    std::lock_guard<std::mutex> lock(adapters_mutex_);
    const bool first = seen_.empty();
    if (first) {
        std::size_t n = 0;
        for (const Adapter& a : adapters_) n += std::size_t(a.rows * a.cols + a.r * a.cols + a.rows * a.r);
        seen_.assign(n, T(0));
    }
    T* seen = seen_.data();
    for (const Adapter& a : adapters_) {
        // W' is remade only when W, A or B changed since it was made (decoding calls this once per token)
        const std::size_t nW = std::size_t(a.rows * a.cols), nA = std::size_t(a.r * a.cols), nB = std::size_t(a.rows * a.r);
        const T *W = theta_.data() + a.W, *A = theta_.data() + a.A, *B = theta_.data() + a.B;
        const bool same = !first && std::memcmp(seen, W, nW * sizeof(T)) == 0 &&
                          std::memcmp(seen + nW, A, nA * sizeof(T)) == 0 && std::memcmp(seen + nW + nA, B, nB * sizeof(T)) == 0;
        if (!same) {
            std::copy(W, W + nW, seen);
            std::copy(A, A + nA, seen + nW);
            std::copy(B, B + nB, seen + nW + nA);
            T* Wp = eff_.data() + a.at;
            std::copy(W, W + nW, Wp);
            gemm<T>(Op::N, Op::N, T(a.scale), CMatView<T>(B, a.rows, a.r), CMatView<T>(A, a.r, a.cols), T(1),
                    MatView<T>(Wp, a.rows, a.cols));  // line 1: W' ← W + s·B A
        }
        seen += nW + nA + nB;
    }
}

template <class T>
void ParamStore<T>::adapters_backward() {
    for (const Adapter& a : adapters_) {
        const T* dWp = grad_.data() + a.W;  // ∂loss/∂W' (line 2's backward); it is ∂loss/∂W too
        if (T* dA = grad_if_trained(a.A))   // d1: ∂loss/∂A += s·Bᵀ ∂loss/∂W'
            gemm<T>(Op::T, Op::N, T(a.scale), CMatView<T>(theta_.data() + a.B, a.rows, a.r),
                    CMatView<T>(dWp, a.rows, a.cols), T(1), MatView<T>(dA, a.r, a.cols));
        if (T* dB = grad_if_trained(a.B))   // d1: ∂loss/∂B += s·∂loss/∂W' Aᵀ
            gemm<T>(Op::N, Op::T, T(a.scale), CMatView<T>(dWp, a.rows, a.cols),
                    CMatView<T>(theta_.data() + a.A, a.r, a.cols), T(1), MatView<T>(dB, a.rows, a.r));
    }
}

template void declare_lora<float>(const ModelConfig::Lora&, ParamStore<float>&);
template void declare_lora<double>(const ModelConfig::Lora&, ParamStore<double>&);
template void ParamStore<float>::adapt(const Adapter&);
template void ParamStore<double>::adapt(const Adapter&);
template void ParamStore<float>::refresh_adapters() const;
template void ParamStore<double>::refresh_adapters() const;
template void ParamStore<float>::adapters_backward();
template void ParamStore<double>::adapters_backward();

}  // namespace ft
