// LoRA: the listing of lora.hpp, forward (lines 1, 2′–3′) and backward (d1, d3′) side by side, over the adapters
// of a ParamStore (params.hpp: W(p) hands the listings W' of an adapted matrix; the affine overloads below run
// lines 2′–3′ when the adapter's input drops).
#include "formal_transformers/lora.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "formal_transformers/affine_set.hpp"
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
    if (!(c.dropout >= 0 && c.dropout < 1))  // NaN fails too
        throw ValueError("lora: dropout must be in [0, 1) (the rate of the adapter input's dropout), got " +
                         std::to_string(c.dropout));
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
        adapters.push_back({e->name, e->offset, 0, 0, rows, cols, c.r, scale, 0, c.dropout});
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
    runs_.resize(adapters_.size());
}

template <class T>
void ParamStore<T>::lora_training(bool on, std::uint64_t seed, std::uint64_t step) {
    lora_run_on_ = on, lora_seed_ = seed, lora_step_ = step;
    if (on)
        for (AdapterRun& run : runs_) run.used = false, run.mask.p = 0, run.mask.keep.clear();
}

template <class T>
void ParamStore<T>::refresh_adapters() const {
    if (adapters_.empty()) return;
    std::lock_guard<std::mutex> lock(adapters_mutex_);
    if (!lora_run_on_)  // an evaluating forward: no adapter drops, and the masks of the last training forward go
        for (AdapterRun& run : runs_) run.used = false, run.mask.p = 0, run.mask.keep.clear();
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
    for (std::size_t k = 0; k < adapters_.size(); ++k) {
        const Adapter& a = adapters_[k];
        if (runs_[k].used) continue;    // line 3′ ran: d3′ gave ∂loss/∂A, ∂loss/∂B
        const T* dWp = grad_.data() + a.W;  // ∂loss/∂W' (line 2's backward); it is ∂loss/∂W too
        if (T* dA = grad_if_trained(a.A))   // d1: ∂loss/∂A += s·Bᵀ ∂loss/∂W'
            gemm<T>(Op::T, Op::N, T(a.scale), CMatView<T>(theta_.data() + a.B, a.rows, a.r),
                    CMatView<T>(dWp, a.rows, a.cols), T(1), MatView<T>(dA, a.r, a.cols));
        if (T* dB = grad_if_trained(a.B))   // d1: ∂loss/∂B += s·∂loss/∂W' Aᵀ
            gemm<T>(Op::N, Op::T, T(a.scale), CMatView<T>(dWp, a.rows, a.cols),
                    CMatView<T>(theta_.data() + a.A, a.r, a.cols), T(1), MatView<T>(dB, a.rows, a.r));
    }
}

namespace {
template <class T>
CMatView<T> theta_W(const ParamStore<T>& store, const MatParam& W) { return {store.theta() + W.offset, W.rows, W.cols}; }

// Lines 2′–3′ of adapter k after the line with W wrote Y (W X + b 1ᵀ, or added it): Y += s · B (A X̃), keeping M,
// X̃ and A X̃ for d3′
template <class T>
void adapter_forward(const ParamStore<T>& store, index_t k, CMatView<T> X, MatView<T> Y) {
    using Adapter = typename ParamStore<T>::Adapter;
    const Adapter& a = store.adapters()[std::size_t(k)];
    typename ParamStore<T>::AdapterRun& run = store.adapter_run(k);
    FT_CHECK(X.rows == a.cols && Y.rows == a.rows && Y.cols == X.cols, "LoRA: the adapter's line has other shapes");
    FT_CHECK(!run.used, "LoRA: an adapter's input dropped twice in one forward");
    MatView<T> Xt = ensure(run.Xt, X.rows, X.cols);
    for (index_t j = 0; j < X.cols; ++j) std::copy(X.col(j), X.col(j) + X.rows, Xt.col(j));
    run.mask.p = a.dropout;
    run.mask.keep.resize(std::size_t(Xt.size()));
    dropout_forward<T>(a.dropout, store.lora_key(k), 0, Xt.data, Xt.size(), run.mask.keep.data());  // line 2′: X̃ ← Dropout(X | p, M)
    MatView<T> AXt = ensure(run.AXt, a.r, X.cols);
    gemm<T>(Op::N, Op::N, T(1), CMatView<T>(store.theta() + a.A, a.r, a.cols), Xt, T(0), AXt);
    gemm<T>(Op::N, Op::N, T(a.scale), CMatView<T>(store.theta() + a.B, a.rows, a.r), AXt, T(1), Y);  // line 3′: + s·B (A X̃)
    run.used = true;
}
}  // namespace

template <class T>
void affine(const ParamStore<T>& store, const MatParam& W, CMatView<T> X, const T* b, MatView<T> Y) {
    const index_t k = store.lora_drops(W);
    if (k < 0) return affine<T>(store.W(W), X, b, Y);  // line 2: W' X + b 1ᵀ (W X + b 1ᵀ unadapted)
    affine<T>(theta_W(store, W), X, b, Y);             // line 3′: W X + b 1ᵀ …
    adapter_forward(store, k, X, Y);                   //           … + s · B (A X̃)
}

template <class T>
void affine_add(const ParamStore<T>& store, const MatParam& W, CMatView<T> X, const T* b, MatView<T> Y) {
    const index_t k = store.lora_drops(W);
    if (k < 0) return affine_add<T>(store.W(W), X, b, Y);  // line 2
    affine_add<T>(theta_W(store, W), X, b, Y);             // line 3′
    adapter_forward(store, k, X, Y);
}

namespace {
// set: ∂loss/∂X = (not +=) the first term (affine_backward_set)
template <class T>
void affine_backward_store(ParamStore<T>& store, const MatParam& W, CMatView<T> X, CMatView<T> dY, T* dW, T* db,
                           T* dX, index_t ld_dX, bool set) {
    using Base = void (*)(CMatView<T>, CMatView<T>, CMatView<T>, T*, T*, T*, index_t);
    const Base base = set ? Base(affine_backward_set<T>) : Base(affine_backward<T>);
    const index_t k = store.lora_drops(W);
    if (k < 0 || !store.adapter_run(k).used)  // line 2's backward: ∂loss/∂W' (d1 follows in adapters_backward)
        return base(store.W(W), X, dY, dW, db, dX, ld_dX);
    // d3′: line 3′'s W X + b 1ᵀ backward (∂loss/∂W, ∂loss/∂b, ∂loss/∂X += Wᵀ ∂loss/∂Y), then the adapter's
    base(theta_W(store, W), X, dY, dW, db, dX, ld_dX);
    const typename ParamStore<T>::Adapter& a = store.adapters()[std::size_t(k)];
    typename ParamStore<T>::AdapterRun& run = store.adapter_run(k);
    const index_t n = X.cols;
    const T s = T(a.scale);
    CMatView<T> A(store.theta() + a.A, a.r, a.cols), B(store.theta() + a.B, a.rows, a.r);
    if (T* dB = store.grad_if_trained(a.B))  // ∂loss/∂B += s · ∂loss/∂Y (A X̃)ᵀ
        gemm<T>(Op::N, Op::T, s, dY, view(run.AXt), T(1), MatView<T>(dB, a.rows, a.r));
    T* dA = store.grad_if_trained(a.A);
    if (!dA && !dX) return;
    MatView<T> G = ensure(run.G, a.r, n);
    gemm<T>(Op::T, Op::N, T(1), B, dY, T(0), G);  // Bᵀ ∂loss/∂Y
    if (dA)  // ∂loss/∂A += s · Bᵀ ∂loss/∂Y X̃ᵀ
        gemm<T>(Op::N, Op::T, s, CMatView<T>(G), view(run.Xt), T(1), MatView<T>(dA, a.r, a.cols));
    if (dX) {  // ∂loss/∂X += DropoutBackward(s · Aᵀ Bᵀ ∂loss/∂Y | p, M)
        MatView<T> D = ensure(run.dXt, a.cols, n);
        gemm<T>(Op::T, Op::N, s, A, CMatView<T>(G), T(0), D);
        dropout_backward<T>(run.mask.p, run.mask.keep.data(), D.data, D.size());  // D2
        MatView<T> dXv(dX, a.cols, n, ld_dX < 0 ? std::max<index_t>(a.cols, 1) : ld_dX);
        for (index_t j = 0; j < n; ++j) {
            T* o = dXv.col(j);
            const T* d = D.col(j);
#pragma omp simd
            for (index_t i = 0; i < a.cols; ++i) o[i] += d[i];
        }
    }
}
}  // namespace

template <class T>
void affine_backward(ParamStore<T>& store, const MatParam& W, CMatView<T> X, CMatView<T> dY, T* dW, T* db, T* dX,
                     index_t ld_dX) {
    affine_backward_store<T>(store, W, X, dY, dW, db, dX, ld_dX, false);
}
template <class T>
void affine_backward_set(ParamStore<T>& store, const MatParam& W, CMatView<T> X, CMatView<T> dY, T* dW, T* db,
                         T* dX, index_t ld_dX) {
    affine_backward_store<T>(store, W, X, dY, dW, db, dX, ld_dX, true);
}

template void declare_lora<float>(const ModelConfig::Lora&, ParamStore<float>&);
template void declare_lora<double>(const ModelConfig::Lora&, ParamStore<double>&);
template void ParamStore<float>::adapt(const Adapter&);
template void ParamStore<double>::adapt(const Adapter&);
template void ParamStore<float>::refresh_adapters() const;
template void ParamStore<double>::refresh_adapters() const;
template void ParamStore<float>::adapters_backward();
template void ParamStore<double>::adapters_backward();
template void ParamStore<float>::lora_training(bool, std::uint64_t, std::uint64_t);
template void ParamStore<double>::lora_training(bool, std::uint64_t, std::uint64_t);
#define FT_LORA_AFFINE(T)                                                                                         \
    template void affine<T>(const ParamStore<T>&, const MatParam&, CMatView<T>, const T*, MatView<T>);           \
    template void affine_add<T>(const ParamStore<T>&, const MatParam&, CMatView<T>, const T*, MatView<T>);       \
    template void affine_backward<T>(ParamStore<T>&, const MatParam&, CMatView<T>, CMatView<T>, T*, T*, T*, index_t); \
    template void affine_backward_set<T>(ParamStore<T>&, const MatParam&, CMatView<T>, CMatView<T>, T*, T*, T*, index_t);
FT_LORA_AFFINE(float)
FT_LORA_AFFINE(double)
#undef FT_LORA_AFFINE

}  // namespace ft
