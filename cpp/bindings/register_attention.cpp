// Algorithms 3, 4 and 5: BasicAttention, Attention, MHAttention as stand-alone Python objects, and the
// two masks as free functions.
#include <cmath>
#include <optional>
#include <type_traits>
#include <utility>

#include "bind.hpp"
#include "formal_transformers/attention.hpp"

namespace ftpy {

namespace {
std::string type_name(const py::handle& o) { return py::str(py::type::handle_of(o).attr("__name__")).cast<std::string>(); }

// W ~ N(0, 1/fan_in) with fan_in = the matrix's number of columns (stacked heads: the columns of one head's
// block, the same). Draws in declaration order, so with equal fan-ins this is exactly the core's init().
template <class T>
void init_fan_in(ft::ParamStore<T>& store, const ft::MatParam& W, ft::Rng& rng) {
    store.normal(W.offset, W.rows * W.cols, 1.0 / std::sqrt(double(W.cols)), rng);
}

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
    switch (mask.kind()) {
        case ft::Mask::Kind::Bidirectional: return py::str("bidirectional");
        case ft::Mask::Kind::Unidirectional: return py::str("unidirectional");
        default: return bool_matrix(mask.l_z(), mask.l_x(), mask.matrix());
    }
}

std::string mask_repr(const ft::Mask& mask) {
    if (mask.kind() == ft::Mask::Kind::Explicit)
        return "<bool array (" + std::to_string(mask.l_z()) + ", " + std::to_string(mask.l_x()) + ")>";
    return "'" + py::str(mask_object(mask)).cast<std::string>() + "'";
}

// A saved copy of an input (the user may mutate their array between the call and backward()).
template <class T>
void save_copy(ft::Matrix<T>& dst, ft::CMatView<T> src) {
    ft::MatView<T> d = ft::ensure(dst, src.rows, src.cols);
    for (index_t j = 0; j < src.cols; ++j) std::copy(src.col(j), src.col(j) + src.rows, d.col(j));
}

template <class T>
py::array zeros(index_t rows, index_t cols) {
    auto a = out_matrix<T>(rows, cols);
    std::fill(a.mutable_data(), a.mutable_data() + rows * cols, T(0));
    return std::move(a);
}

// ----------------------------------------------------------------------------------------------------
// Algorithm 3 with its own θ; the core's cache keeps copies of e and E.
template <class T>
struct BasicAttentionUnit {
    ft::ParamStore<T> store;
    ft::BasicAttention<T> att;
    ft::BasicAttentionCache<T> cache;
    index_t last_T = -1;

    BasicAttentionUnit(index_t d_in, index_t d_attn, index_t d_out, std::uint64_t seed) : att(d_in, d_attn, d_out, store) {
        store.allocate();
        ft::Rng rng(seed);
        att.init(store, rng, 1.0 / std::sqrt(double(d_in)));  // every weight matrix has fan_in = d_in; biases 0
    }

    py::array call(const py::handle& e, const py::handle& E) {
        InMatrix<T> ei = in_matrix<T>(e, "e", att.d_in, true, "d_in");
        if (ei.m.cols != 1)
            throw ft::ValueError("e must be one token vector (d_in,) = (" + std::to_string(att.d_in) + ",), got " +
                                 std::to_string(ei.m.cols) + " columns");
        InMatrix<T> Ei = in_matrix<T>(E, "E", att.d_in, false, "d_in");
        auto out = out_matrix<T>(att.d_out, 1);
        last_T = -1;
        {
            CoreCall nogil;
            att.forward(store, ei.m.data, Ei.m, out.mutable_data(), cache);
        }
        last_T = Ei.m.cols;
        return maybe_vector(out, true);
    }

    py::tuple backward(const py::handle& dv) {
        if (last_T < 0) throw ft::ValueError("backward() called before any forward call");
        InMatrix<T> d = in_matrix<T>(dv, "dv", att.d_out, true, "d_out");
        if (d.m.cols != 1) throw ft::ValueError("dv must be one vector (d_out,), got " + std::to_string(d.m.cols) + " columns");
        py::array de = zeros<T>(att.d_in, 1), dE = zeros<T>(att.d_in, last_T);
        {
            CoreCall nogil;
            att.backward(store, cache, d.m.data, static_cast<T*>(de.mutable_data()),
                         ft::MatView<T>(static_cast<T*>(dE.mutable_data()), att.d_in, last_T));
        }
        return py::make_tuple(maybe_vector(de, true), dE);
    }

    py::object weights() const {
        if (last_T < 0) return py::none();
        return py::array_t<T>({py::ssize_t(last_T)}, cache.alpha.data());  // a copy
    }
};

// Algorithms 4 and 5 as stand-alone objects: their own θ, copies of the last call's X and Z (the user may
// change their arrays before backward()), and the layer's activations. Only the layer type differs.
struct NoWork {};

template <class T, class Layer, class Cache, class Work>
struct XZUnit {
    ft::ParamStore<T> store;
    Layer att;
    Cache cache;
    Work work;
    ft::Matrix<T> X, Z;
    index_t l_x = -1, l_z = -1;

    template <class... A>
    explicit XZUnit(A&&... hyper) : att(std::forward<A>(hyper)..., store) {
        store.allocate();
    }
    // MHAttention with the variants of docs/variants.md
    template <class... A>
    explicit XZUnit(const ft::AttnVariant& v, A&&... hyper) : att(std::forward<A>(hyper)..., store, "", v) {
        store.allocate();
    }

    py::array call(const py::handle& Xo, const py::handle& Zo) {
        InMatrix<T> x = in_matrix<T>(Xo, "X", att.d_x, false, "d_x");
        InMatrix<T> z = Zo.is_none() ? in_matrix<T>(Xo, "Z (= X, self-attention)", att.d_z, false, "d_z")
                                     : in_matrix<T>(Zo, "Z", att.d_z, false, "d_z");
        att.mask.check(z.m.cols, x.m.cols, 0, /*exact=*/true);  // an explicit mask fixes (l_z, l_x)
        const index_t nx = x.m.cols, nz = z.m.cols;
        auto out = out_matrix<T>(att.d_out, nx);
        l_x = l_z = -1;  // nothing valid to differentiate until this call completes
        {
            CoreCall nogil;
            save_copy(X, x.m);
            save_copy(Z, z.m);
            att.forward(store, ft::view(X), ft::Seqs::single(nx), ft::view(Z), ft::Seqs::single(nz),
                        ft::MatView<T>(out.mutable_data(), att.d_out, nx), cache);
        }
        l_x = nx;
        l_z = nz;
        return std::move(out);
    }

    py::tuple backward(const py::handle& dY) {
        if (l_x < 0) throw ft::ValueError("backward() called before any forward call");
        InMatrix<T> d = in_matrix<T>(dY, "dY", att.d_out, false, "d_out");
        if (d.m.cols != l_x)
            throw ft::ValueError("dY has " + std::to_string(d.m.cols) + " columns but the last call had l_x = " +
                                 std::to_string(l_x));
        py::array dX = zeros<T>(att.d_x, l_x), dZ = zeros<T>(att.d_z, l_z);
        {
            CoreCall nogil;
            const auto sx = ft::Seqs::single(l_x), sz = ft::Seqs::single(l_z);
            ft::MatView<T> gX(static_cast<T*>(dX.mutable_data()), att.d_x, l_x);
            ft::MatView<T> gZ(static_cast<T*>(dZ.mutable_data()), att.d_z, l_z);
            if constexpr (std::is_same_v<Work, NoWork>)
                att.backward(store, ft::view(X), sx, ft::view(Z), sz, cache, d.m, gX, gZ);
            else
                att.backward(store, ft::view(X), sx, ft::view(Z), sz, cache, d.m, gX, gZ, work);
        }
        return py::make_tuple(dX, dZ);
    }
};

// Algorithm 4
template <class T>
struct AttentionUnit : XZUnit<T, ft::Attention<T>, ft::AttentionCache<T>, NoWork> {
    AttentionUnit(index_t d_x, index_t d_z, index_t d_attn, index_t d_out, ft::Mask mask, std::uint64_t seed)
        : XZUnit<T, ft::Attention<T>, ft::AttentionCache<T>, NoWork>(d_x, d_z, d_attn, d_out, std::move(mask)) {
        ft::Rng rng(seed);
        for (const ft::MatParam* W : {&this->att.W_q, &this->att.W_k, &this->att.W_v})
            init_fan_in(this->store, *W, rng);  // biases stay 0
    }

    py::object weights() const {
        const index_t l_x = this->l_x, l_z = this->l_z;
        if (l_x < 0) return py::none();
        const py::ssize_t s = py::ssize_t(sizeof(T));
        return py::array_t<T>({py::ssize_t(l_z), py::ssize_t(l_x)}, {s, s * l_z}, this->cache.A.data());  // a copy
    }
};

// Algorithm 5 (heads stacked as docs/api.md shows them)
template <class T>
struct MHAttentionUnit : XZUnit<T, ft::MHAttention<T>, ft::MHAttentionCache<T>, ft::MHAttentionWork<T>> {
    MHAttentionUnit(index_t H, index_t d_x, index_t d_z, index_t d_attn, index_t d_mid, index_t d_out, ft::Mask mask,
                    std::uint64_t seed, const ft::AttnVariant& v = ft::AttnVariant())
        : XZUnit<T, ft::MHAttention<T>, ft::MHAttentionCache<T>, ft::MHAttentionWork<T>>(v, H, d_x, d_z, d_attn, d_mid,
                                                                                       d_out, std::move(mask)) {
        ft::Rng rng(seed);
        for (const ft::MatParam* W : {&this->att.W_q, &this->att.W_k, &this->att.W_v, &this->att.W_o})
            init_fan_in(this->store, *W, rng);  // biases 0
    }

    py::object weights() const {
        const index_t l_x = this->l_x, l_z = this->l_z;
        if (l_x < 0) return py::none();
        // head h's block is a column-major [l_z, l_x] matrix at offset h·l_z·l_x (one sequence)
        const py::ssize_t s = py::ssize_t(sizeof(T));
        return py::array_t<T>({py::ssize_t(this->att.H), py::ssize_t(l_z), py::ssize_t(l_x)}, {s * l_z * l_x, s, s * l_z},
                              this->cache.A.data());  // a copy
    }
};

template <class D>
py::object call2(D& d, const py::handle& X, const py::handle& Z) {
    CallLock l(d.mutex);
    return d.visit([&](auto& u) -> py::object { return u.call(X, Z); });
}
template <class D>
py::object backward1(D& d, const py::handle& dY) {
    CallLock l(d.mutex);
    return d.visit([&](auto& u) -> py::object { return u.backward(dY); });
}
template <class D>
py::object weights_of(D& d) {
    CallLock l(d.mutex);
    return d.visit([&](auto& u) { return u.weights(); });
}
}  // namespace

void register_attention(py::module_& m) {
    // ---------------------------------------------------------------------------------------- masks
    m.def(
        "bidirectional_mask",
        [](long long l_z, std::optional<long long> l_x) {
            const index_t z = positive(l_z, "l_z"), x = l_x ? positive(*l_x, "l_x") : z;
            return bool_matrix(z, x, ft::bidirectional_mask(z, x));
        },
        py::arg("l_z"), py::arg("l_x") = py::none(),
        "Mask ≡ 1 (l_z, l_x) bool array: every token attends to every context token (l_x defaults to l_z).");
    m.def(
        "unidirectional_mask",
        [](long long l_z, std::optional<long long> l_x) {
            const index_t z = positive(l_z, "l_z"), x = l_x ? positive(*l_x, "l_x") : z;
            return bool_matrix(z, x, ft::unidirectional_mask(z, x));
        },
        py::arg("l_z"), py::arg("l_x") = py::none(),
        "Mask[t_z, t_x] = [[t_z ≤ t_x]] (l_z, l_x) bool array: a token attends only to itself and earlier "
        "tokens (l_x defaults to l_z).");

    // ------------------------------------------------------------------------------ Algorithm 3
    using DB = Dual<BasicAttentionUnit>;
    py::class_<DB, StoreHolder> ba(m, "BasicAttention",
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
    ba.def(py::init([](long long d_in, long long d_attn, long long d_out, const py::object& dtype, const py::object& seed) {
               return std::make_unique<DB>(parse_dtype(dtype), positive(d_in, "d_in"), positive(d_attn, "d_attn"),
                                           positive(d_out, "d_out"), seed_arg(seed));
           }),
           py::arg("d_in"), py::arg("d_attn"), py::arg("d_out"), py::kw_only(), py::arg("dtype") = "float32",
           py::arg("seed") = 0)
        .def("__call__", &call2<DB>, py::arg("e"), py::arg("E"), "(e (d_in,), E (d_in, T)) -> ṽ (d_out,)")
        .def("backward", &backward1<DB>, py::arg("dv"),
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
    using DA = Dual<AttentionUnit>;
    py::class_<DA, StoreHolder> at(m, "Attention",
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
    at.def(py::init([](long long d_x, long long d_z, long long d_attn, long long d_out, const py::object& mask,
                       const py::object& dtype, const py::object& seed) {
               const index_t a = positive(d_x, "d_x"), b = positive(d_z, "d_z"), c = positive(d_attn, "d_attn"),
                             o = positive(d_out, "d_out");
               return std::make_unique<DA>(parse_dtype(dtype), a, b, c, o, parse_mask(mask), seed_arg(seed));
           }),
           py::arg("d_x"), py::arg("d_z"), py::arg("d_attn"), py::arg("d_out"), py::arg("mask") = "bidirectional",
           py::kw_only(), py::arg("dtype") = "float32", py::arg("seed") = 0)
        .def("__call__", &call2<DA>, py::arg("X"), py::arg("Z") = py::none(),
             "(X (d_x, ℓ_x), Z (d_z, ℓ_z)) -> Ṽ (d_out, ℓ_x); Z omitted: Z = X.")
        .def("backward", &backward1<DA>, py::arg("dY"),
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
    using DM = Dual<MHAttentionUnit>;
    py::class_<DM, StoreHolder> mh(m, "MHAttention",
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
                      "  d_z); None: H), bias=False (V5: no b's), positional='rope' (V1, rope_theta) | 'alibi' (V2) | 'none'.");
    mh.def(py::init([](long long H, long long d_x, long long d_z, long long d_attn, long long d_mid, long long d_out,
                       const py::object& mask, const py::object& dtype, const py::object& seed, const py::object& H_kv,
                       const py::object& bias, const std::string& positional, double rope_theta) {
               const index_t h = positive(H, "H"), a = positive(d_x, "d_x"), b = positive(d_z, "d_z"),
                             c = positive(d_attn, "d_attn"), mid = positive(d_mid, "d_mid"), o = positive(d_out, "d_out");
               ft::AttnVariant v;
               if (!H_kv.is_none()) v.H_kv = positive(int_arg(H_kv, "H_kv"), "H_kv");
               if (!py::isinstance<py::bool_>(bias)) throw py::type_error("bias must be True or False");
               v.bias = bias.cast<bool>();
               if (positional == "rope") v.pos = ft::AttnPos::Rope;
               else if (positional == "alibi") v.pos = ft::AttnPos::Alibi;
               else if (positional != "none")
                   throw ft::ValueError("positional must be 'none', 'rope' or 'alibi', got '" + positional + "'");
               v.rope_theta = rope_theta;
               return std::make_unique<DM>(parse_dtype(dtype), h, a, b, c, mid, o, parse_mask(mask), seed_arg(seed), v);
           }),
           py::arg("H"), py::arg("d_x"), py::arg("d_z"), py::arg("d_attn"), py::arg("d_mid"), py::arg("d_out"),
           py::arg("mask") = "bidirectional", py::kw_only(), py::arg("dtype") = "float32", py::arg("seed") = 0,
           py::arg("H_kv") = py::none(), py::arg("bias") = true, py::arg("positional") = "none",
           py::arg("rope_theta") = 10000.0)
        .def("__call__", &call2<DM>, py::arg("X"), py::arg("Z") = py::none(),
             "(X (d_x, ℓ_x), Z (d_z, ℓ_z)) -> Ṽ (d_out, ℓ_x); Z omitted: Z = X.")
        .def("backward", &backward1<DM>, py::arg("dY"),
             "Gradient of the last call: dY (d_out, ℓ_x) -> (dX, dZ); accumulates the parameter gradients.")
        .def_property_readonly("weights", &weights_of<DM>,
                               "softmax(S^h/√d_attn) of every head, (H, ℓ_z, ℓ_x), of the last call. A copy; None "
                               "before any call.")
        .def_property_readonly("mask", [](DM& d) { return d.visit([](auto& u) { return mask_object(u.att.mask); }); },
                               "'bidirectional', 'unidirectional', or a copy of the explicit bool mask.")
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
