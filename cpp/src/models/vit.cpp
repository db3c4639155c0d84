// Listing V14: the vision transformer (vit.hpp quotes the listing; docs/variants.md V14).
#include "formal_transformers/vit.hpp"

#include <algorithm>
#include <cmath>

#include "formal_transformers/blas.hpp"
#include "formal_transformers/sizes.hpp"
#include "shared.hpp"

namespace ft {
using namespace models;

void check(const ViTConfig& c) {
    const std::pair<const char*, index_t> sizes[] = {{"n_channels", c.n_channels}, {"image_size", c.image_h},
                                                     {"image_size", c.image_w},    {"patch_size", c.patch},
                                                     {"n_classes", c.n_classes},   {"L", c.L},
                                                     {"H", c.H},                   {"d_e", c.d_e},
                                                     {"d_mlp", c.d_mlp}};
    for (const auto& [name, v] : sizes)
        if (v <= 0) throw ValueError(std::string(name) + " must be a positive integer, got " + std::to_string(v));
    if (c.image_h % c.patch || c.image_w % c.patch)
        throw ValueError("patch_size " + std::to_string(c.patch) + " does not divide the image size " +
                         std::to_string(c.image_h) + "×" + std::to_string(c.image_w));
    if (c.d_e % c.H)
        throw ValueError("d_e = " + std::to_string(c.d_e) + " is not divisible by H = " + std::to_string(c.H));
    if (!(c.eps >= 0) || !std::isfinite(c.eps)) throw ValueError("eps must be a finite number >= 0");
    if (!(c.init_std > 0) || !std::isfinite(c.init_std)) throw ValueError("init_std must be a finite number > 0");
    // the whole model before any layer is declared (as check_model_size for the language models): N patches and
    // C·P² values per patch overflow-checked, then a lower bound on θ: W_patch, W_p, x_class, W_c and per layer
    // W_q, W_k, W_v, W_o (d_e × d_e each) and W_mlp1, W_mlp2, in float32, θ and gradient, and each layer's bookkeeping
    const char* what = "ViT size";
    const index_t N = checked_mul(c.image_h / c.patch, c.image_w / c.patch, "ViT: the patches (image_size / patch_size)²");
    const index_t K = checked_count({c.n_channels, c.patch, c.patch}, "ViT: the values of a patch (n_channels·patch_size²)");
    const index_t d = c.d_e;
    const index_t layer = checked_add(checked_count({4, d, d}, what), checked_count({2, c.d_mlp, d}, what), what);
    const index_t outer = checked_add(checked_add(checked_mul(d, K, what), checked_mul(d, checked_add(N, 2, what), what), what),
                                      checked_mul(c.n_classes, d, what), what);
    const index_t params = checked_add(outer, checked_mul(c.L, layer, what), what);
    const index_t bytes = checked_add(checked_count({params, 2, index_t(sizeof(float))}, what),
                                      checked_mul(c.L, kLayerOverhead, what), what);
    if (std::uint64_t(bytes) > max_alloc_bytes())
        throw_size_error(what, "image_size=(" + std::to_string(c.image_h) + ", " + std::to_string(c.image_w) + "), patch_size=" +
                                   std::to_string(c.patch) + ", n_channels=" + std::to_string(c.n_channels) + ", n_classes=" +
                                   std::to_string(c.n_classes) + ", L=" + std::to_string(c.L) + ", d_e=" + std::to_string(d) +
                                   ", d_mlp=" + std::to_string(c.d_mlp) + " need at least " + std::to_string(params) +
                                   " parameters (" + human_bytes((long double)bytes) + " with their gradients), which exceeds " +
                                   "this machine's memory (" + human_bytes((long double)max_alloc_bytes()) + ")");
}

namespace {
ModelConfig encoder_config(const ViTConfig& v) {
    check(v);
    ModelConfig c;  // Algorithm 10's layer options at their defaults: layer_norm, GELU (exact), biases
    c.mlp = "gelu";
    c.arch = Arch::D;
    c.n_vocab = v.n_classes;
    c.l_max = v.n_patches() + 1;
    c.L = v.L, c.H = v.H, c.d_e = v.d_e, c.d_mlp = v.d_mlp;
    c.d_attn = c.d_mid = v.d_e / v.H;
    c.H_kv = v.H;
    c.eps = v.eps;
    c.seed = v.seed;
    c.init_std = v.init_std;
    return c;
}
}  // namespace

template <class T>
ViT<T>::ViT(const ViTConfig& c) : vc(c), cfg(encoder_config(c)) {
    const index_t N = vc.n_patches(), d_e = vc.d_e;
    checked_elements({d_e, vc.patch_dim()}, sizeof(T), "W_patch");
    W_patch = store.matrix("W_patch", d_e, vc.patch_dim());
    b_patch = store.vector("b_patch", d_e);
    x_class = store.vector("x_class", d_e);
    W_p = store.matrix("W_p", d_e, N + 1);
    for (index_t l = 0; l < vc.L; ++l) {
        layer.push_back(std::make_unique<PreLNDecoderBlock<T>>(cfg, Activation::Gelu, store, layer_prefix("layers", l)));
        layer.back()->attn.mask = Mask::bidirectional();  // line 7: Mask ≡ 1
    }
    norm_f = std::make_unique<Norm<T>>("layer", d_e, vc.eps, store, "gamma", "beta");
    W_c = store.matrix("W_c", vc.n_classes, d_e);
    b_c = store.vector("b_c", vc.n_classes);
    store.allocate();
    Rng rng(vc.seed);  // N(0, init_std²) weights and embeddings, residual projections / √(2L), biases 0, γ = 1
    const double s = vc.init_std, s_out = vc.init_std / std::sqrt(2.0 * double(vc.L));
    store.normal(W_patch.offset, d_e * vc.patch_dim(), s, rng);
    store.normal(x_class.offset, d_e, s, rng);
    store.normal(W_p.offset, d_e * (N + 1), s, rng);
    for (auto& b : layer) b->init(store, rng, s, s_out);
    norm_f->init(store);
    store.normal(W_c.offset, vc.n_classes * d_e, s, rng);
    acts_.resize(std::size_t(vc.L));
    stream_.resize(std::size_t(vc.L + 1));
}

template <class T>
void ViT<T>::forward(const T* images, index_t B) {
    const index_t C = vc.n_channels, Hi = vc.image_h, Wi = vc.image_w, P = vc.patch, gw = Wi / P;
    const index_t N = vc.n_patches(), K = vc.patch_dim(), d_e = vc.d_e, n = B * (N + 1);
    B_ = 0;
    checked_elements({K, B * N}, sizeof(T), "the patches");
    checked_elements({d_e, n}, sizeof(T), "the residual stream");
    MatView<T> Xp = ensure(Xp_, K, B * N);
#pragma omp parallel for schedule(static) if (K * B * N > 65536)
    for (index_t bn = 0; bn < B * N; ++bn) {  // lines 1–2: column b·N + n is patch n = (i, j) of image b
        const index_t b = bn / N, i = (bn % N) / gw, j = (bn % N) % gw;
        T* p = Xp.col(bn);
        for (index_t c = 0; c < C; ++c)
            for (index_t r = 0; r < P; ++r) {
                const T* row = images + ((b * C + c) * Hi + i * P + r) * Wi + j * P;
                std::copy(row, row + P, p + (c * P + r) * P);
            }
    }
    MatView<T> E = ensure(E_, d_e, B * N);
    affine<T>(store.W(W_patch), Xp, store.v(b_patch), E);  // line 3: E ← W_patch X_p + b_patch 1ᵀ
    MatView<T> X = ensure(stream_[0], d_e, n);
    CMatView<T> Wp = store.W(W_p);
    const T* xc = store.v(x_class);
    for (index_t b = 0; b < B; ++b)  // line 4: X ← [x_class, E] + W_p, per image
        for (index_t t = 0; t <= N; ++t) {
            const T* src = t == 0 ? xc : E.col(b * N + t - 1);
            const T* w = Wp.col(t);
            T* dst = X.col(b * (N + 1) + t);
            for (index_t k = 0; k < d_e; ++k) dst[k] = src[k] + w[k];
        }
    s_ = Seqs::from_lengths(std::vector<index_t>(std::size_t(B), N + 1));
    for (index_t l = 0; l < vc.L; ++l) {  // line 5
        poll();
        const std::size_t i = std::size_t(l);
        layer[i]->forward(store, view(stream_[i]), s_, ensure(stream_[i + 1], d_e, n), acts_[i]);  // lines 6–9
    }
    MatView<T> Xc = ensure(Xc_, d_e, B);
    CMatView<T> XL = view(stream_[std::size_t(vc.L)]);
    for (index_t b = 0; b < B; ++b) std::copy(XL.col(b * (N + 1)), XL.col(b * (N + 1)) + d_e, Xc.col(b));
    MatView<T> Xn = ensure(Xn_, d_e, B);
    norm_f->forward(store, Xc, Xn, norm_gamma_);                        // line 11: x ← layer_norm(X[:, 1] | γ, β)
    affine<T>(store.W(W_c), Xn, store.v(b_c), ensure(Z_, vc.n_classes, B));  // line 12: z ← W_c x + b_c
    B_ = B;
}

template <class T>
double ViT<T>::loss(const T* images, index_t B, const index_t* labels, bool grad, index_t* n_correct) {
    forward(images, B);
    MatView<T> dZ = ensure(dZ_, vc.n_classes, B);
    std::copy(Z_.data(), Z_.data() + vc.n_classes * B, dZ.data);
    const double loss = nll_and_grad<T>(dZ, labels, T(1), n_correct);  // −Σ_b log softmax(z_b)[y_b]; dZ ← ∂loss/∂z
    if (grad) {
        store.zero_grad();
        backward(dZ);
    }
    return loss;
}

// d(line 12) … d(line 1): from dZ = ∂loss/∂z
template <class T>
void ViT<T>::backward(MatView<T> dZ) {
    const index_t B = B_, N = vc.n_patches(), d_e = vc.d_e, n = B * (N + 1);
    MatView<T> dXn = zeros(dXn_, d_e, B);
    affine_backward<T>(store.W(W_c), view(Xn_), dZ, store.dW(W_c).data, store.dv(b_c), dXn.data);  // line 12
    MatView<T> dXc = zeros(dXc_, d_e, B);
    norm_f->backward(store, dXn, norm_gamma_, dXc);  // line 11
    MatView<T> dX = zeros(work_.dX, d_e, n);
    for (index_t b = 0; b < B; ++b) std::copy(dXc.col(b), dXc.col(b) + d_e, dX.col(b * (N + 1)));
    for (index_t l = vc.L - 1; l >= 0; --l) {
        poll();
        layer[std::size_t(l)]->backward(store, s_, acts_[std::size_t(l)], work_);  // lines 9–6
    }
    CMatView<T> dXv = view(work_.dX);  // line 4: dx_class, dW_p, dE
    MatView<T> dWp = store.dW(W_p);
    T* dxc = store.dv(x_class);
    MatView<T> dE = ensure(dE_, d_e, B * N);
    for (index_t b = 0; b < B; ++b)
        for (index_t t = 0; t <= N; ++t) {
            const T* g = dXv.col(b * (N + 1) + t);
            T* dw = dWp.col(t);
            for (index_t k = 0; k < d_e; ++k) dw[k] += g[k];
            if (t == 0)
                for (index_t k = 0; k < d_e; ++k) dxc[k] += g[k];
            else
                std::copy(g, g + d_e, dE.col(b * N + t - 1));
        }
    affine_backward<T>(store.W(W_patch), view(Xp_), dE, store.dW(W_patch).data, store.dv(b_patch), nullptr);  // line 3
}

template class ViT<float>;
template class ViT<double>;

}  // namespace ft
