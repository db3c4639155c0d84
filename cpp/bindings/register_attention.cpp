// Algorithms 3, 4 and 5: BasicAttention, Attention, MHAttention as stand-alone Python objects, and the
// two masks as free functions.
#include <cmath>
#include <optional>
#include <type_traits>
#include <utility>

#include "bind.hpp"
#include "formal_transformers/block_sparse.hpp"
#include "formal_transformers/io.hpp"
#include "formal_transformers/random_features.hpp"
#include "formal_transformers/sizes.hpp"
#include "formal_transformers/transformers.hpp"
#include "formal_transformers/units.hpp"

namespace ftpy {

namespace {
std::string type_name(const py::handle& o) { return py::str(py::type::handle_of(o).attr("__name__")).cast<std::string>(); }

// The Mask hyperparameter of Algorithm 4: "bidirectional", "unidirectional", or a bool array (l_z, l_x).
ft::Mask parse_mask(const py::handle& mask) {
    if (py::isinstance<py::str>(mask)) {
        const std::string s = mask.cast<std::string>();
        if (s == "bidirectional") return ft::Mask::bidirectional();
        if (s == "unidirectional") return ft::Mask::unidirectional();
        throw ft::ValueError("mask must be 'bidirectional', 'unidirectional' or a bool array (l_z, l_x), got '" + s + "'");
    }
    if (!py::isinstance<py::array>(mask) && !py::isinstance<py::list>(mask) && !py::isinstance<py::tuple>(mask))
        throw ft::TypeError("mask must be 'bidirectional', 'unidirectional' or a bool array (l_z, l_x), got " +
                            (mask.is_none() ? std::string("None") : type_name(mask)));
    py::array a = py::module_::import("numpy").attr("asarray")(mask);
    if (a.dtype().kind() != 'b')
        throw ft::TypeError("mask must be a bool array (l_z, l_x) (Mask[t_z, t_x] = True: query t_x may attend to "
                            "context token t_z), got dtype " + py::str(a.dtype()).cast<std::string>());
    if (a.ndim() != 2) throw ft::ValueError("mask must be a 2-D bool array (l_z, l_x), got shape " + shape_str(a));
    const index_t l_z = index_t(a.shape(0)), l_x = index_t(a.shape(1));
    if (l_z == 0 || l_x == 0) throw ft::ValueError("mask is empty (shape " + shape_str(a) + ")");
    auto b = py::array_t<bool, py::array::f_style | py::array::forcecast>::ensure(a);
    std::vector<std::uint8_t> m(std::size_t(l_z * l_x));
    for (std::size_t i = 0; i < m.size(); ++i) m[i] = b.data()[i] ? 1 : 0;
    return ft::Mask::explicit_matrix(l_z, l_x, m.data());  // ValueError on an all-False column
}

py::array bool_matrix(index_t l_z, index_t l_x, const std::vector<std::uint8_t>& m) {
    py::array_t<bool, py::array::f_style> a({py::ssize_t(l_z), py::ssize_t(l_x)});
    bool* p = a.mutable_data();
    for (std::size_t i = 0; i < m.size(); ++i) p[i] = m[i] != 0;
    return std::move(a);
}

py::object mask_object(const ft::Mask& mask) {
    if (mask.name() == "explicit") return bool_matrix(mask.l_z(), mask.l_x(), mask.matrix());
    return py::str(mask.name());
}

std::string mask_repr(const ft::Mask& mask) {
    if (mask.name() == "explicit")
        return "<bool array (" + std::to_string(mask.l_z()) + ", " + std::to_string(mask.l_x()) + ")>";
    return "'" + mask.name() + "'";
}

// V17: a block layout as an array (n, n), layout[j, i]: key block j live for query block i (the orientation of
// Mask[t_z, t_x]): bool, or uint8 multiplicities when a query block lists a key block more than once (V17b's note)
py::array layout_array(const ft::BlockLayout& L) {
    const bool counts = L.repeats();
    py::array a = counts ? py::array(py::array_t<std::uint8_t, py::array::f_style>({py::ssize_t(L.n), py::ssize_t(L.n)}))
                         : py::array(py::array_t<bool, py::array::f_style>({py::ssize_t(L.n), py::ssize_t(L.n)}));
    auto* p = static_cast<std::uint8_t*>(a.mutable_data());  // bool and uint8: one byte each
    std::fill(p, p + L.n * L.n, std::uint8_t(0));
    for (index_t i = 0; i < L.n; ++i)
        for (index_t k = 0; k < L.count(i); ++k) p[L.of(i)[k] + i * L.n] += 1;
    return a;
}
// A bool layout (n, n), or non-negative integer multiplicities (a key block listed m ≤ 255 times)
ft::BlockLayout layout_of(const py::handle& layout, long long block_size) {
    const index_t b = positive(block_size, "block_size");
    py::array a = py::module_::import("numpy").attr("asarray")(layout);
    const char kind = a.dtype().kind();
    if (kind != 'b' && kind != 'i' && kind != 'u')
        throw ft::TypeError("layout must be a bool array (n, n) (layout[j, i]: key block j for query block i), or integer "
                            "multiplicities (a key block listed m times)");
    if (a.ndim() != 2 || a.shape(0) != a.shape(1) || a.shape(0) < 1)
        throw ft::ValueError("layout must be a square array (n, n), got shape " + shape_str(a));
    auto m = py::array_t<long long, py::array::f_style | py::array::forcecast>::ensure(a);
    const index_t n = index_t(a.shape(0));
    std::vector<std::vector<index_t>> keys(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i)
        for (index_t j = 0; j < n; ++j) {
            const long long c = m.data()[j + i * n];
            if (c < 0 || c > 255)
                throw ft::ValueError("layout: key block " + std::to_string(j) + " of query block " + std::to_string(i) +
                                     " has multiplicity " + std::to_string(c) + ", not in [0, 255]");
            keys[std::size_t(i)].insert(keys[std::size_t(i)].end(), std::size_t(c), j);
        }
    return ft::explicit_layout(b, keys);
}
template <class T>
py::tuple block_sparse_forward(const py::handle& Qo, const py::handle& Ko, const py::handle& Vo, const ft::BlockLayout& L) {
    auto Q = in_matrix<T>(Qo, "Q", -1, false), K = in_matrix<T>(Ko, "K", Q.m.rows, false, "d_attn");
    auto V = in_matrix<T>(Vo, "V", -1, false);
    const index_t l = L.n * L.block;
    if (Q.m.cols != l || K.m.cols != l || V.m.cols != l)
        throw ft::ValueError("Q, K, V must have n·block_size = " + std::to_string(l) + " columns (the layout's), got " +
                             std::to_string(Q.m.cols) + ", " + std::to_string(K.m.cols) + ", " + std::to_string(V.m.cols));
    auto Y = out_matrix<T>(V.m.rows, l);
    py::array_t<T> lse(py::ssize_t{l});
    {
        py::gil_scoped_release r;
        ft::block_sparse_head<T>(L, Q.m, K.m, V.m, ft::MatView<T>(Y.mutable_data(), V.m.rows, l), lse.mutable_data());
    }
    return py::make_tuple(Y, lse);
}
template <class T>
py::tuple block_sparse_backward(const py::handle& Qo, const py::handle& Ko, const py::handle& Vo, const ft::BlockLayout& L,
                                const py::handle& lse_o, const py::handle& dYo) {
    auto Q = in_matrix<T>(Qo, "Q", -1, false), K = in_matrix<T>(Ko, "K", Q.m.rows, false, "d_attn");
    auto V = in_matrix<T>(Vo, "V", -1, false), dY = in_matrix<T>(dYo, "dY", V.m.rows, false, "d_v");
    const index_t l = L.n * L.block;
    if (Q.m.cols != l || K.m.cols != l || V.m.cols != l || dY.m.cols != l)
        throw ft::ValueError("Q, K, V, dY must have n·block_size = " + std::to_string(l) + " columns (the layout's)");
    auto lse = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(lse_o);
    if (!lse || lse.ndim() != 1 || lse.shape(0) != l) throw ft::ValueError("lse must be a vector of " + std::to_string(l));
    auto dQ = out_matrix<T>(Q.m.rows, l), dK = out_matrix<T>(K.m.rows, l), dV = out_matrix<T>(V.m.rows, l);
    std::fill(dQ.mutable_data(), dQ.mutable_data() + Q.m.rows * l, T(0));
    std::fill(dK.mutable_data(), dK.mutable_data() + K.m.rows * l, T(0));
    std::fill(dV.mutable_data(), dV.mutable_data() + V.m.rows * l, T(0));
    {
        py::gil_scoped_release r;
        ft::block_sparse_head_backward<T>(L, Q.m, K.m, V.m, lse.data(), dY.m, ft::MatView<T>(dQ.mutable_data(), Q.m.rows, l),
                                          ft::MatView<T>(dK.mutable_data(), K.m.rows, l),
                                          ft::MatView<T>(dV.mutable_data(), V.m.rows, l));
    }
    return py::make_tuple(dQ, dK, dV);
}
bool is_f32(const py::handle& Q) {
    py::array a = py::module_::import("numpy").attr("asarray")(Q);
    return a.dtype().is(py::dtype::of<float>());
}

template <class T>
py::array zeros(index_t rows, index_t cols) {
    return out_matrix<T>(rows, cols);  // the core overwrites gradients
}

// ----------------------------------------------------------------------------------------------------
// The stand-alone components are the core's (units.hpp); here only numpy in and out.
template <class T>
using BasicAttentionUnit = ft::unit::BasicAttention<T>;
template <class T>
using AttentionUnit = ft::unit::Attention<T>;
template <class T>
using MHAttentionUnit = ft::unit::MHAttention<T>;

template <class T>
py::object call_unit(ft::unit::BasicAttention<T>& u, const py::handle& e, const py::handle& E) {
    InMatrix<T> ei = in_matrix<T>(e, "e", u.att.d_in, true, "d_in");
    InMatrix<T> Ei = in_matrix<T>(E, "E", u.att.d_in, false, "d_in");
    auto out = out_matrix<T>(u.att.d_out, 1);
    {
        CoreCall nogil;
        u.forward(ei.m, Ei.m, out.mutable_data());
    }
    return maybe_vector(out, true);
}
template <class T>
py::object backward_unit(ft::unit::BasicAttention<T>& u, const py::handle& dv) {
    InMatrix<T> d = in_matrix<T>(dv, "dv", u.att.d_out, true, "d_out");
    const index_t T_ = std::max<index_t>(u.last_T(), 0);
    py::array de = zeros<T>(u.att.d_in, 1), dE = zeros<T>(u.att.d_in, T_);
    {
        CoreCall nogil;
        u.backward(d.m, static_cast<T*>(de.mutable_data()), ft::MatView<T>(static_cast<T*>(dE.mutable_data()), u.att.d_in, T_));
    }
    return py::make_tuple(maybe_vector(de, true), dE);
}
template <class T>
py::object weights_unit(const ft::unit::BasicAttention<T>& u) {
    auto w = u.weights();
    if (!w) return py::none();
    return py::array_t<T>({py::ssize_t(w->size())}, w->data());  // a copy
}

// Algorithms 4 and 5: X (Z omitted: Z = X) -> Ṽ; dY -> (dX, dZ).
template <class U>
py::object call_unit(U& u, const py::handle& Xo, const py::handle& Zo) {
    using T = typename decltype(u.store)::value_type;
    InMatrix<T> x = in_matrix<T>(Xo, "X", u.att.d_x, false, "d_x");
    InMatrix<T> z = Zo.is_none() ? in_matrix<T>(Xo, "Z (= X, self-attention)", u.att.d_z, false, "d_z")
                                 : in_matrix<T>(Zo, "Z", u.att.d_z, false, "d_z");
    auto out = out_matrix<T>(u.att.d_out, x.m.cols);
    {
        CoreCall nogil;
        u.forward(x.m, z.m, ft::MatView<T>(out.mutable_data(), u.att.d_out, x.m.cols));
    }
    return std::move(out);
}
template <class U>
py::object backward_unit(U& u, const py::handle& dY) {
    using T = typename decltype(u.store)::value_type;
    InMatrix<T> d = in_matrix<T>(dY, "dY", u.att.d_out, false, "d_out");
    const index_t l_x = std::max<index_t>(u.last_lx(), 0), l_z = std::max<index_t>(u.last_lz(), 0);
    py::array dX = zeros<T>(u.att.d_x, l_x), dZ = zeros<T>(u.att.d_z, l_z);
    {
        CoreCall nogil;
        u.backward(d.m, ft::MatView<T>(static_cast<T*>(dX.mutable_data()), u.att.d_x, l_x),
                   ft::MatView<T>(static_cast<T*>(dZ.mutable_data()), u.att.d_z, l_z));
    }
    return py::make_tuple(dX, dZ);
}
template <class T>
py::object weights_unit(const ft::unit::Attention<T>& u) {
    auto w = u.weights();
    if (!w) return py::none();
    const py::ssize_t s = py::ssize_t(sizeof(T));
    return py::array_t<T>({py::ssize_t(w->shape(0)), py::ssize_t(w->shape(1))}, {s, s * py::ssize_t(w->shape(0))},
                          w->data());  // a copy
}
template <class T>
py::object weights_unit(const ft::unit::MHAttention<T>& u) {
    auto w = u.weights();
    if (!w) return py::none();
    const py::ssize_t s = py::ssize_t(sizeof(T)), H = py::ssize_t(w->shape(0)), l_z = py::ssize_t(w->shape(1));
    return py::array_t<T>({H, l_z, py::ssize_t(w->shape(2))}, {s, s * H, s * H * l_z}, w->data());  // a copy
}

template <class D>
py::object call_xz(D& d, const py::handle& X, const py::handle& Z) {
    CallLock l(d.mutex);
    return d.visit([&](auto& u) -> py::object { return call_unit(u, X, Z); });
}
template <class D>
py::object backward_dy(D& d, const py::handle& dY) {
    CallLock l(d.mutex);
    return d.visit([&](auto& u) -> py::object { return backward_unit(u, dY); });
}
template <class D>
py::object weights_of(D& d) {
    CallLock l(d.mutex);
    return d.visit([&](auto& u) { return weights_unit(u); });
}
}  // namespace

// V17 per head: ETransformer.set_bigbird_layouts / bigbird_layouts (registered by register_transformers.cpp's
// ETransformer class). Layouts as bool arrays (L, H, n, n) (or (L, n, n): one per layer, every head alike),
// layouts[l, h, j, i] = key block j live for query block i in head h of layer l.
void def_bigbird_layouts(py::class_<AnyDtype<ft::ETransformer>, HasParams>& c) {
    using DE = AnyDtype<ft::ETransformer>;
    c.def(
        "set_bigbird_layouts",
        [](DE& d, const py::handle& layouts) {
            CallLock lock(d.mutex);
            d.visit([&](auto& m) {
                const index_t b = m.cfg.part_options.integer("block_size");
                if (!ft::head_kernel_has(m.cfg.attention, ft::HeadKernelProperty::BlockLayouts))  // (no block_size to convert with)
                    throw ft::ValueError("set_bigbird_layouts: the model's attention is not 'bigbird'");
                // numpy -> C++ only: every check is the core's (check_bigbird_layouts)
                py::array a = py::module_::import("numpy").attr("asarray")(layouts);
                if (a.dtype().kind() != 'b' && a.dtype().kind() != 'i' && a.dtype().kind() != 'u')
                    throw ft::TypeError("bigbird layouts must be a bool array (L, H, n, n) or (L, n, n), or integer "
                                        "multiplicities");
                const bool per_head = a.ndim() == 4;
                if ((a.ndim() != 3 && a.ndim() != 4) || a.shape(a.ndim() - 1) != a.shape(a.ndim() - 2) ||
                    a.shape(a.ndim() - 1) < 1)
                    throw ft::ValueError("bigbird layouts must have the shape (L, H, n, n) = (" + std::to_string(m.cfg.L) +
                                         ", " + std::to_string(m.cfg.H) + ", n, n) or (L, n, n), got " + shape_str(a));
                std::vector<std::vector<ft::BlockLayout>> all;
                for (py::ssize_t l = 0; l < a.shape(0); ++l) {
                    all.emplace_back();
                    for (py::ssize_t h = 0; h < (per_head ? a.shape(1) : 1); ++h) {
                        const py::object one = per_head ? a[py::make_tuple(l, h)] : a[py::int_(l)];  // (n, n)
                        try {
                            all.back().push_back(layout_of(one, b));
                        } catch (const ft::ValueError& e) {
                            const std::string at = std::to_string(l) + (per_head ? ", " + std::to_string(h) : "");
                            throw ft::ValueError("bigbird layouts[" + at + "]: " + e.what());
                        }
                    }
                }
                ft::set_bigbird_layouts(m, std::move(all));
            });
        },
        py::arg("layouts"),
        "Give every layer and head its V17 block layout for sequences of n blocks (n·block_size tokens): a bool\n"
        "array (L, H, n, n), layouts[l, h, j, i] = key block j is live for query block i in head h of layer l, or\n"
        "(L, n, n) (each layer's layout for all its heads). They replace the layouts drawn from layout_seed for that\n"
        "length only (the other lengths keep drawing); ft.from_hf installs Hugging Face BigBird's with it. Integer\n"
        "layouts give multiplicities: a key block listed m times weighs m·exp(s) in the softmax (HF's repeated\n"
        "blocks; attention_impl='auto' only). ft.save keeps them (bigbird_layouts_json). ValueError (the core's\n"
        "check_bigbird_layouts, every layer before any is installed): attention is not 'bigbird', a shape other than\n"
        "(L, H, n, n) or (L, n, n), n·block_size > l_max, a query block with no key block, a repeated key block\n"
        "unless attention_impl='auto'.");
    c.def(
        "bigbird_layouts_json",
        [](DE& d) {
            CallLock lock(d.mutex);
            return d.visit([&](auto& m) { return ft::bigbird_layouts_json(m); });
        },
        "The given layouts (set_bigbird_layouts, ft.from_hf) as JSON text, what ft.save stores under\n"
        "'formal_transformers.bigbird_layouts' ('' when none is given): {\"n\": [layer, …]} for each given length\n"
        "of n blocks, a layer the list of its layouts (one for every head, or H), a layout the list of each query\n"
        "block's key blocks (ascending; a block listed m times has multiplicity m).");
    c.def(
        "set_bigbird_layouts_json",
        [](DE& d, const std::string& text) {
            CallLock lock(d.mutex);
            d.visit([&](auto& m) { ft::set_bigbird_layouts_json(m, text); });
        },
        py::arg("text"),
        "Install the layouts of bigbird_layouts_json's text (ft.load does): every length checked as\n"
        "set_bigbird_layouts checks, before any is installed. ValueError naming the problem.");
    c.def(
        "bigbird_layouts",
        [](DE& d, const PyInt& n_blocks) {
            CallLock lock(d.mutex);
            return d.visit([&](auto& m) {
                const ft::ModelConfig& cfg = m.cfg;
                if (!ft::head_kernel_has(cfg.attention, ft::HeadKernelProperty::BlockLayouts))
                    throw ft::ValueError("bigbird_layouts: the model's attention is not 'bigbird'");
                const index_t n = positive(n_blocks, "n_blocks");
                const ft::Mask& m0 = m.layer[0]->attn.mask;
                ft::check_bigbird_length(*ft::bigbird_spec(m0), ft::checked_mul(n, cfg.part_options.integer("block_size"), "n·block_size"));
                py::list layers;
                bool counts = false;  // some layout repeats a block: uint8 multiplicities
                for (index_t l = 0; l < cfg.L; ++l) {
                    py::list heads;
                    for (index_t h = 0; h < cfg.H; ++h) {
                        const auto L = ft::bigbird_mask_layout(m.layer[std::size_t(l)]->attn.mask, n, h);
                        counts = counts || L->repeats();
                        heads.append(layout_array(*L));
                    }
                    layers.append(heads);
                }
                py::array a = py::module_::import("numpy").attr("array")(
                    layers, counts ? py::dtype::of<std::uint8_t>() : py::dtype::of<bool>());  // (L, H, n, n)
                return a;
            });
        },
        py::arg("n_blocks"),
        "The V17 block layouts the model uses for sequences of n_blocks blocks: a bool array (L, H, n, n),\n"
        "[l, h, j, i] = key block j is live for query block i in head h of layer l (uint8 multiplicities if a given\n"
        "layout repeats a block; drawn from layout_seed: layer l,\n"
        "head h is ft.bigbird_layout(n, …, seed=layout_seed, name=f'layers.{l}.attn.', head=h), head=0 for every\n"
        "head with bigbird_draw='per_layer'; or as installed).");
}

void register_attention(py::module_& m) {
    // ---------------------------------------------------------------------------------------- masks
    m.def(
        "bidirectional_mask",
        [](const PyInt& l_z, std::optional<PyInt> l_x) {
            const index_t z = positive(l_z, "l_z"), x = l_x ? positive(*l_x, "l_x") : z;
            return bool_matrix(z, x, ft::bidirectional_mask(z, x));
        },
        py::arg("l_z"), py::arg("l_x") = py::none(),
        "Mask ≡ 1 (l_z, l_x) bool array: every token attends to every context token (l_x defaults to l_z).");
    m.def(
        "unidirectional_mask",
        [](const PyInt& l_z, std::optional<PyInt> l_x) {
            const index_t z = positive(l_z, "l_z"), x = l_x ? positive(*l_x, "l_x") : z;
            return bool_matrix(z, x, ft::unidirectional_mask(z, x));
        },
        py::arg("l_z"), py::arg("l_x") = py::none(),
        "Mask[t_z, t_x] = [[t_z ≤ t_x]] (l_z, l_x) bool array: a token attends only to itself and earlier "
        "tokens (l_x defaults to l_z).");

    // ---------------------------------------------------------------------- V15: random features
    m.def(
        "random_feature_matrix",
        [](const std::string& attention, const PyInt& n_features, const PyInt& d_attn, const py::object& seed,
           const std::string& name) {
            const ft::FeatureKind k = ft::feature_kind(attention, "attention");
            const index_t D = positive(n_features, "n_features (the number D of random features)");
            const index_t d = positive(d_attn, "d_attn");
            const ft::RandomFeatures<double> f = ft::draw_random_features<double>(k, D, d, seed_arg(seed), name);
            py::array_t<double> out({py::ssize_t(f.D), py::ssize_t(d)});
            double* o = out.mutable_data();
            for (index_t i = 0; i < f.D; ++i)
                for (index_t c = 0; c < d; ++c) o[i * d + c] = f.Omega(std::size_t(i), std::size_t(c));
            return out;
        },
        py::arg("attention"), py::arg("n_features"), py::arg("d_attn"), py::arg("seed") = 0, py::arg("name") = "",
        "Ω (n_features, d_attn), the fixed random projection of attention='performer' (positive orthogonal features,\n"
        "FAVOR+: Gram-Schmidt blocks, rows rescaled by chi-distributed norms) or 'rfa' (independent Gaussian rows),\n"
        "Algorithm V15a of docs/variants.md, drawn from seed and the attention's name: a model's layer l draws it\n"
        "with seed=feature_seed, name=f'layers.{l}.attn.'.");

    // --------------------------------------------------------------------- V17: block-sparse (BigBird)
    m.def(
        "bigbird_layout",
        [](const PyInt& n_blocks, const PyInt& window_blocks, const PyInt& n_global_blocks, const PyInt& n_random_blocks,
           const py::object& seed, const std::string& name, const PyInt& head_arg) {
            const long long head = int_arg(head_arg, "head");
            ft::BigBirdSpec s;
            s.block = 1, s.window = index_t(int_arg(window_blocks, "window_blocks"));
            s.global = index_t(int_arg(n_global_blocks, "n_global_blocks"));
            s.random = index_t(int_arg(n_random_blocks, "n_random_blocks")), s.seed = seed_arg(seed), s.name = name;
            const index_t n = positive(n_blocks, "n_blocks");
            if (head < 0) throw ft::ValueError("head = " + std::to_string(head) + " must be >= 0");
            ft::check_bigbird_spec(s);
            return layout_array(ft::bigbird_layout(s, n, index_t(head)));
        },
        py::arg("n_blocks"), py::arg("window_blocks") = 3, py::arg("n_global_blocks") = 1, py::arg("n_random_blocks") = 3,
        py::arg("seed") = 0, py::arg("name") = "", py::arg("head") = 0,
        "BigBird's block layout (Algorithm V17a of docs/variants.md) of n_blocks blocks: a bool array (n, n),\n"
        "layout[j, i] = key block j is live for query block i. Random blocks drawn from seed and the attention's\n"
        "name and head: an ETransformer(attention='bigbird') layer l, head h draws with seed=layout_seed,\n"
        "name=f'layers.{l}.attn.', head=h (each head its own random blocks; head 0's are the layer's draw of before).\n"
        "ValueError: window_blocks even or < 1, n_global_blocks or n_random_blocks < 0, too few blocks.");
    m.def(
        "block_sparse_attention",
        [](const py::handle& Q, const py::handle& K, const py::handle& V, const py::handle& layout, const PyInt& block_size) {
            const ft::BlockLayout L = layout_of(layout, positive(block_size, "block_size"));
            return is_f32(Q) ? block_sparse_forward<float>(Q, K, V, L) : block_sparse_forward<double>(Q, K, V, L);
        },
        py::arg("Q"), py::arg("K"), py::arg("V"), py::arg("layout"), py::arg("block_size"),
        "Algorithm V17b (block-sparse attention, one head): Q (d, ℓ), K (d, ℓ), V (d_v, ℓ), layout a bool (n, n)\n"
        "block layout (as bigbird_layout returns; ℓ = n·block_size; or integer multiplicities m: the block gathered\n"
        "m times) -> (Ṽ (d_v, ℓ), λ (ℓ,)), Ṽ = V softmax(S/√d) over the live blocks only. float32 when Q is\n"
        "float32, else float64.");
    m.def(
        "block_sparse_attention_backward",
        [](const py::handle& Q, const py::handle& K, const py::handle& V, const py::handle& layout, const PyInt& block_size,
           const py::handle& lse, const py::handle& dY) {
            const ft::BlockLayout L = layout_of(layout, positive(block_size, "block_size"));
            return is_f32(Q) ? block_sparse_backward<float>(Q, K, V, L, lse, dY)
                             : block_sparse_backward<double>(Q, K, V, L, lse, dY);
        },
        py::arg("Q"), py::arg("K"), py::arg("V"), py::arg("layout"), py::arg("block_size"), py::arg("lse"), py::arg("dY"),
        "The backward of block_sparse_attention: given its λ and dṼ (d_v, ℓ) -> (dQ, dK, dV).");

    // ------------------------------------------------------------------------------ Algorithm 3
    using DB = AnyDtype<BasicAttentionUnit>;
    py::class_<DB, HasParams> ba(m, "BasicAttention",
                      "Algorithm 3 (basic single-query attention):\n"
                      "  q = W_q e + b_q; k_t = W_k e_t + b_k; v_t = W_v e_t + b_v;\n"
                      "  α_t = softmax_t(qᵀk_t / √d_attn); ṽ = Σ_t α_t v_t.\n\n"
                      "BasicAttention(d_in, d_attn, d_out, *, dtype='float32', seed=0)\n"
                      "Hyperparameters: d_in, d_attn, d_out.\n"
                      "Parameters: W_q (d_attn, d_in), b_q (d_attn,), W_k (d_attn, d_in), b_k (d_attn,),\n"
                      "  W_v (d_out, d_in), b_v (d_out,). Initialised W ~ N(0, 1/fan_in) (fan_in = d_in, the\n"
                      "  matrix's number of columns) from ft's Rng(seed), biases 0.\n"
                      "Call: (e, E), e (d_in,) the current token, E (d_in, T) the context tokens e_1..e_T as\n"
                      "  columns -> ṽ (d_out,).\n"
                      "backward(dv): dv (d_out,) -> (de (d_in,), dE (d_in, T)); parameter gradients accumulate\n"
                      "  into grads. weights: α (T,) of the last call (None before any call).\n"
                      "Inputs: float arrays of either precision, any layout (zero-copy when already this dtype and F-contiguous,\n"
                      "  otherwise converted once); non-float arrays -> TypeError. NaN is not checked: it propagates as\n"
                      "  numpy's arithmetic of the listing (reference.py) would.");
    ba.def(py::init([](const PyInt& d_in, const PyInt& d_attn, const PyInt& d_out, const py::object& dtype, const py::object& seed) {
               return std::make_unique<DB>(parse_dtype(dtype), positive(d_in, "d_in"), positive(d_attn, "d_attn"),
                                           positive(d_out, "d_out"), seed_arg(seed));
           }),
           py::arg("d_in"), py::arg("d_attn"), py::arg("d_out"), py::kw_only(), py::arg("dtype") = "float32",
           py::arg("seed") = 0)
        .def("__call__", &call_xz<DB>, py::arg("e"), py::arg("E"), "(e (d_in,), E (d_in, T)) -> ṽ (d_out,)")
        .def("backward", &backward_dy<DB>, py::arg("dv"),
             "Gradient of the last call: dv (d_out,) -> (de, dE); accumulates the parameter gradients.")
        .def_property_readonly("weights", &weights_of<DB>, "α (T,) of the last call, a copy (None before any call).")
        .def_property_readonly("d_in", [](DB& d) { return d.visit([](auto& u) { return u.att.d_in; }); })
        .def_property_readonly("d_attn", [](DB& d) { return d.visit([](auto& u) { return u.att.d_attn; }); })
        .def_property_readonly("d_out", [](DB& d) { return d.visit([](auto& u) { return u.att.d_out; }); })
        .def("__repr__", [](DB& d) {
            return d.visit([&](auto& u) {
                return "BasicAttention(d_in=" + std::to_string(u.att.d_in) + ", d_attn=" + std::to_string(u.att.d_attn) +
                       ", d_out=" + std::to_string(u.att.d_out) + ", dtype='" + d.dtype() + "')";
            });
        });
    def_params_api<BasicAttentionUnit>(ba);

    // ------------------------------------------------------------------------------ Algorithm 4
    using DA = AnyDtype<AttentionUnit>;
    py::class_<DA, HasParams> at(m, "Attention",
                      "Algorithm 4 (attention): Q = W_q X + b_q 1ᵀ, K = W_k Z + b_k 1ᵀ, V = W_v Z + b_v 1ᵀ,\n"
                      "  S = KᵀQ, S[t_z, t_x] = −∞ where ¬Mask[t_z, t_x], Ṽ = V · softmax(S / √d_attn)\n"
                      "  (softmax over each column, max-subtracted).\n\n"
                      "Attention(d_x, d_z, d_attn, d_out, mask='bidirectional', *, dtype='float32', seed=0)\n"
                      "Hyperparameters: d_x, d_z, d_attn, d_out, and Mask: 'bidirectional' (Mask ≡ 1),\n"
                      "  'unidirectional' (Mask[t_z, t_x] = [[t_z ≤ t_x]]), or a bool array (ℓ_z, ℓ_x) (then every\n"
                      "  call must have exactly that ℓ_z, ℓ_x; a column with no True is a ValueError).\n"
                      "Parameters: W_q (d_attn, d_x), b_q (d_attn,), W_k (d_attn, d_z), b_k (d_attn,),\n"
                      "  W_v (d_out, d_z), b_v (d_out,). Initialised W ~ N(0, 1/fan_in) (fan_in = the matrix's\n"
                      "  number of columns) from ft's Rng(seed), biases 0.\n"
                      "Call: (X, Z), X (d_x, ℓ_x) primary tokens, Z (d_z, ℓ_z) context tokens (ℓ_z may differ:\n"
                      "  cross-attention) -> Ṽ (d_out, ℓ_x). Z omitted: self-attention, Z = X. X and Z are copied.\n"
                      "backward(dY): dY (d_out, ℓ_x) -> (dX (d_x, ℓ_x), dZ (d_z, ℓ_z)); parameter gradients\n"
                      "  accumulate into grads. (Self-attention: the gradient of X is dX + dZ.)\n"
                      "weights: softmax(S/√d_attn) (ℓ_z, ℓ_x) of the last call, a copy (None before any call).\n"
                      "Inputs: float arrays of either precision, any layout (zero-copy when already this dtype and F-contiguous,\n"
                      "  otherwise converted once); non-float arrays -> TypeError. NaN is not checked: it propagates as\n"
                      "  numpy's arithmetic of the listing (reference.py) would.");
    at.def(py::init([](const PyInt& d_x, const PyInt& d_z, const PyInt& d_attn, const PyInt& d_out, const py::object& mask,
                       const py::object& dtype, const py::object& seed) {
               const index_t a = positive(d_x, "d_x"), b = positive(d_z, "d_z"), c = positive(d_attn, "d_attn"),
                             o = positive(d_out, "d_out");
               return std::make_unique<DA>(parse_dtype(dtype), a, b, c, o, parse_mask(mask), seed_arg(seed));
           }),
           py::arg("d_x"), py::arg("d_z"), py::arg("d_attn"), py::arg("d_out"), py::arg("mask") = "bidirectional",
           py::kw_only(), py::arg("dtype") = "float32", py::arg("seed") = 0)
        .def("__call__", &call_xz<DA>, py::arg("X"), py::arg("Z") = py::none(),
             "(X (d_x, ℓ_x), Z (d_z, ℓ_z)) -> Ṽ (d_out, ℓ_x); Z omitted: Z = X.")
        .def("backward", &backward_dy<DA>, py::arg("dY"),
             "Gradient of the last call: dY (d_out, ℓ_x) -> (dX, dZ); accumulates the parameter gradients.")
        .def_property_readonly("weights", &weights_of<DA>,
                               "softmax(S/√d_attn) (ℓ_z, ℓ_x) of the last call: column t_x holds how much query t_x "
                               "attends to each context token. A copy; None before any call.")
        .def_property_readonly("mask", [](DA& d) { return d.visit([](auto& u) { return mask_object(u.att.mask); }); },
                               "'bidirectional', 'unidirectional', or a copy of the explicit bool mask.")
        .def_property_readonly("d_x", [](DA& d) { return d.visit([](auto& u) { return u.att.d_x; }); })
        .def_property_readonly("d_z", [](DA& d) { return d.visit([](auto& u) { return u.att.d_z; }); })
        .def_property_readonly("d_attn", [](DA& d) { return d.visit([](auto& u) { return u.att.d_attn; }); })
        .def_property_readonly("d_out", [](DA& d) { return d.visit([](auto& u) { return u.att.d_out; }); })
        .def("__repr__", [](DA& d) {
            return d.visit([&](auto& u) {
                return "Attention(d_x=" + std::to_string(u.att.d_x) + ", d_z=" + std::to_string(u.att.d_z) +
                       ", d_attn=" + std::to_string(u.att.d_attn) + ", d_out=" + std::to_string(u.att.d_out) +
                       ", mask=" + mask_repr(u.att.mask) + ", dtype='" + d.dtype() + "')";
            });
        });
    def_params_api<AttentionUnit>(at);

    // ------------------------------------------------------------------------------ Algorithm 5
    using DM = AnyDtype<MHAttentionUnit>;
    py::class_<DM, HasParams> mh(m, "MHAttention",
                      "Algorithm 5 (multi-head attention): for h ∈ [H]: Y^h = Attention(X, Z | W^h_qkv, Mask)\n"
                      "  (Algorithm 4); Y = [Y¹; …; Y^H]; Ṽ = W_o Y + b_o 1ᵀ.\n\n"
                      "MHAttention(H, d_x, d_z, d_attn, d_mid, d_out, mask='bidirectional', *, dtype='float32', seed=0)\n"
                      "Hyperparameters: H, d_x, d_z, d_attn, d_mid, d_out, Mask (as in Attention).\n"
                      "Parameters (heads stacked, head h = index h of the first axis):\n"
                      "  W_q (H, d_attn, d_x), b_q (H, d_attn), W_k (H, d_attn, d_z), b_k (H, d_attn),\n"
                      "  W_v (H, d_mid, d_z), b_v (H, d_mid), W_o (d_out, H·d_mid), b_o (d_out,).\n"
                      "  Initialised W ~ N(0, 1/fan_in) (fan_in = the matrix's number of columns: d_x, d_z, d_z,\n"
                      "  H·d_mid) from ft's Rng(seed), biases 0.\n"
                      "Call: (X, Z), X (d_x, ℓ_x), Z (d_z, ℓ_z) -> Ṽ (d_out, ℓ_x). Z omitted: Z = X. Inputs are copied.\n"
                      "backward(dY): dY (d_out, ℓ_x) -> (dX (d_x, ℓ_x), dZ (d_z, ℓ_z)); parameter gradients\n"
                      "  accumulate into grads. (Self-attention: the gradient of X is dX + dZ.)\n"
                      "weights: softmax(S^h/√d_attn) of every head, (H, ℓ_z, ℓ_x), of the last call (a copy; None\n"
                      "  before any call).\n"
                      "Inputs: float arrays of either precision, any layout (zero-copy when already this dtype and F-contiguous,\n"
                      "  otherwise converted once); non-float arrays -> TypeError. NaN is not checked: it propagates as\n"
                      "  numpy's arithmetic of the listing (reference.py) would.\n"
                      "Variants (docs/variants.md): H_kv key/value heads (V3: W_k (H_kv, d_attn, d_z), W_v (H_kv, d_mid,\n"
                      "  d_z); None: H), bias=False (V5: no b's), positional='rope' (V1, rope_theta) | 'alibi' (V2) | 'none'.\n"
                      "attention_impl='auto' | 'literal' | 'tiled': Algorithm 4's lines 4-6 as printed, or the tiled listing\n"
                      "  (docs/tiled_attention.md: the same numbers up to rounding, memory O(ℓ·d) per head; weights then\n"
                      "  computed when read); 'auto' picks tiled from 256 context tokens on (docs/design.md).");
    mh.def(py::init([](const PyInt& H, const PyInt& d_x, const PyInt& d_z, const PyInt& d_attn, const PyInt& d_mid, const PyInt& d_out,
                       const py::object& mask, const py::object& dtype, const py::object& seed, const py::object& H_kv,
                       const py::object& bias, const std::string& positional, double rope_theta,
                       const std::string& attention_impl) {
               const index_t h = positive(H, "H"), a = positive(d_x, "d_x"), b = positive(d_z, "d_z"),
                             c = positive(d_attn, "d_attn"), mid = positive(d_mid, "d_mid"), o = positive(d_out, "d_out");
               ft::AttnVariant v;
               if (!H_kv.is_none()) v.H_kv = index_t(int_arg(H_kv, "H_kv", 1));
               if (!py::isinstance<py::bool_>(bias)) throw py::type_error("bias must be True or False");
               v.bias = bias.cast<bool>();
               ft::check_part_name(ft::PartKind::Position, positional, "positional");
               v.position = positional;
               v.options.set("rope_theta", rope_theta);  // (the RoPE position's option)
               v.impl = parse_attention_impl(attention_impl);
               return std::make_unique<DM>(parse_dtype(dtype), h, a, b, c, mid, o, parse_mask(mask), seed_arg(seed), v);
           }),
           py::arg("H"), py::arg("d_x"), py::arg("d_z"), py::arg("d_attn"), py::arg("d_mid"), py::arg("d_out"),
           py::arg("mask") = "bidirectional", py::kw_only(), py::arg("dtype") = "float32", py::arg("seed") = 0,
           py::arg("H_kv") = py::none(), py::arg("bias") = true, py::arg("positional") = "none",
           py::arg("rope_theta") = 10000.0, py::arg("attention_impl") = "auto")
        .def("__call__", &call_xz<DM>, py::arg("X"), py::arg("Z") = py::none(),
             "(X (d_x, ℓ_x), Z (d_z, ℓ_z)) -> Ṽ (d_out, ℓ_x); Z omitted: Z = X.")
        .def("backward", &backward_dy<DM>, py::arg("dY"),
             "Gradient of the last call: dY (d_out, ℓ_x) -> (dX, dZ); accumulates the parameter gradients.")
        .def_property_readonly("weights", &weights_of<DM>,
                               "softmax(S^h/√d_attn) of every head, (H, ℓ_z, ℓ_x), of the last call. A copy; None "
                               "before any call.")
        .def_property_readonly("mask", [](DM& d) { return d.visit([](auto& u) { return mask_object(u.att.mask); }); },
                               "'bidirectional', 'unidirectional', or a copy of the explicit bool mask.")
        .def_property_readonly("attention_impl", [](DM& d) { return d.visit([](auto& u) { return std::string(attention_impl_name(u.att.var.impl)); }); },
                               "'auto', 'literal' or 'tiled' (the constructor's option).")
        .def_property_readonly("H", [](DM& d) { return d.visit([](auto& u) { return u.att.H; }); })
        .def_property_readonly("d_x", [](DM& d) { return d.visit([](auto& u) { return u.att.d_x; }); })
        .def_property_readonly("d_z", [](DM& d) { return d.visit([](auto& u) { return u.att.d_z; }); })
        .def_property_readonly("d_attn", [](DM& d) { return d.visit([](auto& u) { return u.att.d_attn; }); })
        .def_property_readonly("d_mid", [](DM& d) { return d.visit([](auto& u) { return u.att.d_mid; }); })
        .def_property_readonly("d_out", [](DM& d) { return d.visit([](auto& u) { return u.att.d_out; }); })
        .def_property_readonly("H_kv", [](DM& d) { return d.visit([](auto& u) { return u.att.H_kv; }); })
        .def("__repr__", [](DM& d) {
            return d.visit([&](auto& u) {
                return "MHAttention(H=" + std::to_string(u.att.H) + ", d_x=" + std::to_string(u.att.d_x) +
                       ", d_z=" + std::to_string(u.att.d_z) + ", d_attn=" + std::to_string(u.att.d_attn) +
                       ", d_mid=" + std::to_string(u.att.d_mid) + ", d_out=" + std::to_string(u.att.d_out) +
                       ", mask=" + mask_repr(u.att.mask) + ", dtype='" + d.dtype() + "')";
            });
        });
    def_params_api<MHAttentionUnit>(mh);
}


}  // namespace ftpy
