// Listing V14: the vision transformer as a Python object (vit.hpp; docs/variants.md V14, docs/api.md).
#include <cmath>

#include "bind.hpp"
#include "formal_transformers/functions.hpp"
#include "formal_transformers/vit.hpp"

namespace ftpy {

namespace {
template <class T>
using ViTModel = ft::ViT<T>;
using DV = AnyDtype<ViTModel>;

// images -> a C-contiguous array of the model's dtype, checked before anything runs: a real floating-point
// numpy-convertible array (TypeError otherwise), 4-D (B, C, H, W) with B >= 1 and (C, H, W) the model's,
// finite (ValueError naming the problem).
template <class T>
py::array_t<T, py::array::c_style | py::array::forcecast> in_images(const ft::ViTConfig& c, const py::handle& images) {
    py::array a = py::array::ensure(images);
    if (!a) throw ft::TypeError("images must be a numpy array (B, C, H, W) of floats");
    const char kind = a.dtype().kind();
    if (kind != 'f') throw ft::TypeError("images must be a floating-point array, got dtype " + std::string(py::str(a.dtype())));
    if (a.ndim() != 4) throw ft::ValueError("images must be 4-D (B, C, H, W), got " + std::to_string(a.ndim()) + "-D");
    if (a.shape(0) < 1) throw ft::ValueError("images is an empty batch (B = 0)");
    if (a.shape(1) != c.n_channels || a.shape(2) != c.image_h || a.shape(3) != c.image_w)
        throw ft::ValueError("images must be (B, " + std::to_string(c.n_channels) + ", " + std::to_string(c.image_h) + ", " +
                             std::to_string(c.image_w) + ") (C, H, W of the model), got (" + std::to_string(a.shape(0)) + ", " +
                             std::to_string(a.shape(1)) + ", " + std::to_string(a.shape(2)) + ", " + std::to_string(a.shape(3)) + ")");
    auto t = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(a);
    const T* p = t.data();
    for (py::ssize_t i = 0; i < t.size(); ++i)
        if (!std::isfinite(p[i])) throw ft::ValueError("images contain NaN or infinite values");
    return t;
}

std::vector<index_t> in_labels(const ft::ViTConfig& c, const py::handle& labels, index_t B) {
    py::array a = py::array::ensure(labels);
    if (!a || (a.dtype().kind() != 'i' && a.dtype().kind() != 'u'))
        throw ft::TypeError("labels must be an integer array (B,)");
    auto t = py::array_t<long long, py::array::c_style | py::array::forcecast>::ensure(a);
    if (t.ndim() != 1 || t.shape(0) != B)
        throw ft::ValueError("labels must be 1-D with one label per image (B = " + std::to_string(B) + ")");
    std::vector<index_t> y(static_cast<std::size_t>(B));
    for (index_t b = 0; b < B; ++b) {
        const long long v = t.data()[b];
        if (v < 0 || v >= c.n_classes)
            throw ft::IndexError("labels[" + std::to_string(b) + "] = " + std::to_string(v) + " is out of range [0, " +
                                 std::to_string(c.n_classes) + ")");
        y[std::size_t(b)] = index_t(v);
    }
    return y;
}

// model(images) and model.logits(images): V14's lines 1–12 on the checked images, then the logits
// z = W_c x + b_c (n_classes, B), and with `probabilities` P = softmax(z) column by column.
template <class T>
py::array output(ft::ViT<T>& v, const py::handle& images, bool probabilities) {
    auto a = in_images<T>(v.vc, images);
    const index_t B = index_t(a.shape(0));
    return run_then_output<T>(
        v.vc.n_classes, B, [&] { v.forward(a.data(), B); },
        [&](ft::MatView<T> out) {
            const ft::CMatView<T> Z = v.logits();
            std::copy(Z.data, Z.data + Z.rows * Z.cols, out.data);
            if (probabilities) ft::softmax_columns<T>(out);
        });
}
}  // namespace

void register_vit(py::module_& m) {
    py::class_<DV, HasParams> cls(m, "ViT", R"doc(Listing V14: P ← ViT(x | θ) — the vision transformer (Dosovitskiy et al. 2021).

Images (B, C, H, W) cut into P×P patches (row by row), a linear patch embedding W_patch (d_e, C·P·P) + b_patch,
a class token x_class and learned positions W_p (d_e, N+1), L pre-LN encoder layers (Algorithm 10's layer with
Mask ≡ 1), a final layer_norm of the class token's column, and P = softmax(W_c x + b_c). Hugging Face's
ViTForImageClassification is this model (ft.from_hf). Hyperparameters: image_size (an int or (H, W)),
patch_size (dividing both), n_classes, L, H, d_e, d_mlp; options n_channels=3, eps=1e-12 (layer_norm's,
HF's layer_norm_eps), seed, init_std=0.02, dtype.
Call: P = model(images) -> (n_classes, B). model.logits(images): W_c x + b_c. loss_and_grad(images, labels):
−Σ_b log P[labels[b], b] and every parameter's gradient; loss(images, labels, reduction="sum"|"mean").)doc");
    cls.def(py::init([](const py::object& image_size, const PyInt& patch_size, const PyInt& n_classes, const PyInt& L,
                        const PyInt& H, const PyInt& d_e, const PyInt& d_mlp, const PyInt& n_channels, double eps,
                        const py::object& seed,
                        double init_std, const py::object& dtype, const py::object& precision) {
                ft::ViTConfig c;
                if (PyIndex_Check(image_size.ptr()) && !py::isinstance<py::bool_>(image_size)) {
                    c.image_h = c.image_w = index_t(int_arg(image_size, "image_size"));
                } else if (py::isinstance<py::tuple>(image_size) || py::isinstance<py::list>(image_size)) {
                    auto s = image_size.cast<py::sequence>();
                    if (s.size() != 2) throw ft::ValueError("image_size must be an int or (H, W)");
                    c.image_h = index_t(int_arg(s[0], "image_size[0]")), c.image_w = index_t(int_arg(s[1], "image_size[1]"));
                } else {
                    throw ft::TypeError("image_size must be an int or (H, W)");
                }
                c.patch = index_t(int_arg(patch_size, "patch_size")), c.n_classes = index_t(int_arg(n_classes, "n_classes"));
                c.L = index_t(int_arg(L, "L")), c.H = index_t(int_arg(H, "H")), c.d_e = index_t(int_arg(d_e, "d_e"));
                c.d_mlp = index_t(int_arg(d_mlp, "d_mlp")), c.n_channels = index_t(int_arg(n_channels, "n_channels"));
                c.eps = eps, c.seed = seed_arg(seed), c.init_std = init_std;
                ft::check(c);
                const ft::Precision p = parse_precision_arg(precision);
                auto made = std::make_unique<DV>(parse_dtype(dtype), c);
                made->visit([&](auto& v) { v.set_precision(p); });
                return made;
            }),
            py::arg("image_size"), py::arg("patch_size"), py::arg("n_classes"), py::arg("L"), py::arg("H"), py::arg("d_e"),
            py::arg("d_mlp"), py::kw_only(), py::arg("n_channels") = 3, py::arg("eps") = 1e-12, py::arg("seed") = 0,
            py::arg("init_std") = 0.02, py::arg("dtype") = "float32", py::arg("precision") = "float32")
        .def("__call__",
             [](DV& d, const py::handle& images) {
                 CallLock lock(d.mutex);
                 return d.visit([&](auto& v) { return output(v, images, true); });
             },
             py::arg("images"), "P (n_classes, B): softmax(W_c x + b_c) of every image (column b: image b).")
        .def("logits",
             [](DV& d, const py::handle& images) {
                 CallLock lock(d.mutex);
                 return d.visit([&](auto& v) { return output(v, images, false); });
             },
             py::arg("images"), "z = W_c x + b_c (n_classes, B), before the softmax.")
        .def("loss_and_grad",
             [](DV& d, const py::handle& images, const py::handle& labels) {
                 CallLock lock(d.mutex);
                 return d.visit([&](auto& v) {
                     using T = typename std::decay_t<decltype(v.store)>::value_type;
                     auto a = in_images<T>(v.vc, images);
                     std::vector<index_t> y = in_labels(v.vc, labels, index_t(a.shape(0)));
                     double loss;
                     {
                         CoreCall nogil;
                         loss = v.loss(a.data(), index_t(a.shape(0)), y.data(), true);
                     }
                     return py::make_tuple(loss, grads_copy(v.store));
                 });
             },
             py::arg("images"), py::arg("labels"),
             "−Σ_b log P[labels[b], b] (summed over the batch) and its gradient: (loss, grads) with params' keys.")
        .def("loss",
             [](DV& d, const py::handle& images, const py::handle& labels, const std::string& reduction) {
                 CallLock lock(d.mutex);
                 if (reduction != "sum" && reduction != "mean")
                     throw ft::ValueError("reduction must be 'sum' or 'mean', got '" + reduction + "'");
                 return d.visit([&](auto& v) {
                     using T = typename std::decay_t<decltype(v.store)>::value_type;
                     auto a = in_images<T>(v.vc, images);
                     const index_t B = index_t(a.shape(0));
                     std::vector<index_t> y = in_labels(v.vc, labels, B);
                     double loss;
                     {
                         CoreCall nogil;
                         loss = v.loss(a.data(), B, y.data(), false);
                     }
                     return reduction == "mean" ? loss / double(B) : loss;
                 });
             },
             py::arg("images"), py::arg("labels"), py::arg("reduction") = "sum",
             "The loss of loss_and_grad without gradients (reduction='mean': per image).")
        .def_property_readonly("config", [](DV& d) {
            return d.visit([&](auto& v) {
                const ft::ViTConfig& c = v.vc;
                py::dict r;
                r["image_size"] = py::make_tuple(c.image_h, c.image_w);
                r["patch_size"] = c.patch, r["n_classes"] = c.n_classes, r["L"] = c.L, r["H"] = c.H;
                r["d_e"] = c.d_e, r["d_mlp"] = c.d_mlp, r["n_channels"] = c.n_channels, r["eps"] = c.eps;
                r["seed"] = c.seed, r["init_std"] = c.init_std, r["dtype"] = d.dtype();
                return r;
            });
        })
        .def("__repr__", [](DV& d) {
            return d.visit([&](auto& v) {
                const ft::ViTConfig& c = v.vc;
                return "ViT(image_size=(" + std::to_string(c.image_h) + ", " + std::to_string(c.image_w) + "), patch_size=" +
                       std::to_string(c.patch) + ", n_classes=" + std::to_string(c.n_classes) + ", L=" + std::to_string(c.L) +
                       ", H=" + std::to_string(c.H) + ", d_e=" + std::to_string(c.d_e) + ", d_mlp=" + std::to_string(c.d_mlp) +
                       ", n_channels=" + std::to_string(c.n_channels) + ", dtype='" + d.dtype() + "')";
            });
        });
    def_params_api<ViTModel>(cls);
    def_precision(cls);
}

}  // namespace ftpy
