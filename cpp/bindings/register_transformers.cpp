// Algorithms 8–10 as Python classes: EDTransformer, ETransformer, DTransformer.
#include <tuple>
#include <type_traits>

#include "bind.hpp"
#include "formal_transformers/transformers.hpp"

namespace ftpy {

namespace {
using ft::ModelConfig;
using ft::Tokens;

ft::Seqs seqs_of(const InBatch& b) { return ft::Seqs::from_lengths(b.lengths); }

ft::Positional parse_positional(const std::string& s) {
    if (s == "learned") return ft::Positional::Learned;
    if (s == "sinusoidal") return ft::Positional::Sinusoidal;
    if (s == "rope") return ft::Positional::Rope;
    if (s == "alibi") return ft::Positional::Alibi;
    throw ft::ValueError("positional must be 'learned', 'sinusoidal', 'rope' or 'alibi', got '" + s + "'");
}
ft::Gelu parse_gelu(const std::string& s) {
    if (s == "exact" || s == "none") return ft::Gelu::Exact;
    if (s == "tanh") return ft::Gelu::Tanh;
    throw ft::ValueError("gelu must be 'exact' or 'tanh', got '" + s + "'");
}
ft::NormKind parse_norm(const std::string& s) {
    if (s == "layer") return ft::NormKind::Layer;
    if (s == "rms") return ft::NormKind::RMS;
    throw ft::ValueError("norm must be 'layer' or 'rms', got '" + s + "'");
}
index_t opt_size(const py::object& v, const char* name) {
    if (v.is_none()) return 0;
    return positive(int_arg(v, name), name);
}
// The variants' options (docs/variants.md): H_kv (None: H) and bias for every model; mlp, rope_theta for D.
void variant_options(ModelConfig& c, const py::object& H_kv, const py::object& bias) {
    c.H_kv = opt_size(H_kv, "H_kv");
    if (!py::isinstance<py::bool_>(bias)) throw py::type_error("bias must be True or False");
    c.bias = bias.cast<bool>();
}
ModelConfig::Mlp parse_mlp(const std::string& s) {
    if (s == "gelu") return ModelConfig::Mlp::Standard;
    if (s == "swiglu") return ModelConfig::Mlp::SwiGLU;
    throw ft::ValueError("mlp must be 'gelu' or 'swiglu', got '" + s + "'");
}
const char* positional_name(ft::Positional p) {
    switch (p) {
        case ft::Positional::Learned: return "learned";
        case ft::Positional::Sinusoidal: return "sinusoidal";
        case ft::Positional::Rope: return "rope";
        default: return "alibi";
    }
}

// Shared keyword options of the three constructors.
void common_options(ModelConfig& c, const py::object& d_attn, const py::object& d_mid, const std::string& positional,
                    const py::object& base, bool tied, double eps, const py::object& seed, double init_std) {
    c.d_attn = opt_size(d_attn, "d_attn");
    c.d_mid = opt_size(d_mid, "d_mid");
    c.positional = parse_positional(positional);
    c.pos_base = base.is_none() ? 0.0 : float_arg(base, "base");
    if (!base.is_none() && !(c.pos_base > 0)) throw ft::ValueError("base must be > 0");
    c.tied = tied;
    c.eps = eps;  // checked with the other sizes by the core (ft::resolve)
    c.seed = seed_arg(seed);
    c.init_std = init_std;
}

// Dropout rates (docs/regularisation.md): dropout= for every place, embed_dropout= / attn_dropout= /
// resid_dropout= (None: dropout) per place. TypeError for a non-number, ValueError outside [0, 1) (NaN too).
double rate_arg(const py::handle& v, const char* name) {
    const double p = float_arg(v, name);
    ft::check_dropout_rate(p, name);
    return p;
}
void dropout_options(ModelConfig& c, const py::object& dropout, const py::object& embed, const py::object& attn,
                     const py::object& resid) {
    const double p = rate_arg(dropout, "dropout");
    c.embed_dropout = embed.is_none() ? p : rate_arg(embed, "embed_dropout");
    c.attn_dropout = attn.is_none() ? p : rate_arg(attn, "attn_dropout");
    c.resid_dropout = resid.is_none() ? p : rate_arg(resid, "resid_dropout");
}
#define FT_DROPOUT_ARGS                                                                                        \
    py::arg("dropout") = 0.0, py::arg("embed_dropout") = py::none(), py::arg("attn_dropout") = py::none(),     \
        py::arg("resid_dropout") = py::none(), py::arg("attention_impl") = "auto"

// Probabilities or logits of the last forward, shaped for the input: (N_V, ℓ) for one sequence,
// (N, N_V, ℓ) for a 2-D batch, a list of (N_V, ℓ_b) for a ragged list.
template <class T, class Fill>
py::object shaped_output(index_t n_vocab, const InBatch& in, bool two_d, Fill fill) {
    const index_t n = index_t(in.ids.size());
    auto out = out_matrix<T>(n_vocab, n);
    {
        CoreCall nogil;
        fill(ft::MatView<T>(out.mutable_data(), n_vocab, n));
    }
    if (in.was_single) return std::move(out);
    const index_t B = index_t(in.lengths.size());
    if (two_d) {  // (N, N_V, ℓ): block b is the F-ordered (N_V, ℓ) of sequence b
        const index_t l = in.lengths[0];
        const py::ssize_t s = sizeof(T);
        return py::array(py::dtype::of<T>(), {py::ssize_t(B), py::ssize_t(n_vocab), py::ssize_t(l)},
                         {py::ssize_t(n_vocab * l) * s, s, py::ssize_t(n_vocab) * s}, out.data(), out);
    }
    py::list parts;
    index_t off = 0;
    for (index_t len : in.lengths) {
        parts.append(out[py::make_tuple(py::slice(py::none(), py::none(), py::none()), py::slice(off, off + len, 1))].attr("copy")("F"));
        off += len;
    }
    return std::move(parts);
}

bool is_2d(const py::handle& x) { return py::isinstance<py::array>(x) && py::reinterpret_borrow<py::array>(x).ndim() == 2; }

// The gradients as a dict of arrays that later calls do not change: ONE copy of the flat gradient
// buffer (a memcpy), with each name a view into that copy laid out like the parameter.
template <class T>
py::dict grads_copy(const py::object& self, ft::ParamStore<T>& store) {
    (void)self;
    py::array_t<T> flat(py::ssize_t(store.size()));
    std::copy(store.grad(), store.grad() + store.size(), flat.mutable_data());
    py::dict d;
    for (const ft::ParamInfo& e : store.entries()) {
        std::vector<py::ssize_t> shape(e.shape.begin(), e.shape.end()), strides;
        for (index_t st : e.strides) strides.push_back(py::ssize_t(st * index_t(sizeof(T))));
        d[py::str(e.name)] = py::array(py::dtype::of<T>(), shape, strides, flat.data() + e.offset, flat);
    }
    return d;
}

template <class T>
py::object grads_out(const py::object& self, ft::ParamStore<T>& store, bool copy) {
    if (copy) return grads_copy(self, store);
    return py::cast(make_param_dict(self, store, true));
}

double apply_reduction(double loss, index_t scored, const std::string& reduction) {
    if (reduction == "sum") return loss;
    if (reduction == "mean") return scored > 0 ? loss / double(scored) : 0.0;
    throw ft::ValueError("reduction must be 'sum' or 'mean', got '" + reduction + "'");
}

// Hyperparameters as a dict (enough to rebuild the model: ft.load uses it).
py::dict config_dict(const ModelConfig& c, const char* arch, const std::string& dtype) {
    py::dict d;
    d["arch"] = arch;
    d["n_vocab"] = c.n_vocab;
    d["l_max"] = c.l_max;
    if (std::string(arch) == "EDTransformer") {
        d["L_enc"] = c.L_enc;
        d["L_dec"] = c.L_dec;
    } else {
        d["L"] = c.L;
    }
    d["H"] = c.H;
    d["d_e"] = c.d_e;
    d["d_mlp"] = c.d_mlp;
    if (std::string(arch) == "ETransformer") d["d_f"] = c.d_f;
    d["d_attn"] = c.d_attn;
    d["d_mid"] = c.d_mid;
    if (std::string(arch) == "DTransformer") d["norm"] = c.norm == ft::NormKind::Layer ? "layer" : "rms";
    d["positional"] = positional_name(c.positional);
    d["base"] = c.pos_base > 0 ? py::object(py::float_(c.pos_base)) : py::object(py::none());
    d["tied"] = c.tied;
    if (std::string(arch) != "EDTransformer") d["gelu"] = c.gelu == ft::Gelu::Exact ? "exact" : "tanh";
    d["eps"] = c.eps;
    d["seed"] = c.seed;
    d["init_std"] = c.init_std;
    d["H_kv"] = c.H_kv;
    d["bias"] = c.bias;
    d["embed_dropout"] = c.embed_dropout;
    d["attn_dropout"] = c.attn_dropout;
    d["resid_dropout"] = c.resid_dropout;
    d["attention_impl"] = attention_impl_name(c.attention_impl);
    if (std::string(arch) == "DTransformer") {
        d["mlp"] = c.mlp == ModelConfig::Mlp::SwiGLU ? "swiglu" : "gelu";
        d["rope_theta"] = c.rope_theta;
        d["sliding_window"] = c.sliding_window > 0 ? py::object(py::int_(c.sliding_window)) : py::object(py::none());
    }
    d["dtype"] = dtype;
    if (std::string(arch) == "ETransformer") {  // BERT's options (beyond Algorithm 9)
        d["n_segments"] = c.n_segments;
        d["embed_norm"] = c.embed_norm;
        d["unembed_bias"] = c.unembed_bias;
    }
    return d;
}

std::string model_repr(const py::dict& cfg) {
    std::string r = cfg["arch"].cast<std::string>() + "(";
    bool first = true;
    for (auto kv : cfg) {
        const std::string k = kv.first.cast<std::string>();
        if (k == "arch") continue;
        r += (first ? "" : ", ") + k + "=" + py::repr(kv.second).cast<std::string>();
        first = false;
    }
    return r + ")";
}

// Model::attention_weights for every head, as a C-ordered (H, rows, columns) copy (the core checks the state
// and the indices before anything is read).
template <class Model>
py::array attention_array(const Model& m, ft::AttentionKind kind, long long layer, long long seq) {
    using T = typename std::decay_t<decltype(m.store)>::value_type;
    const index_t H = m.cfg.H;
    ft::CMatView<T> a0 = m.attention_weights(kind, layer, seq, 0);
    py::array_t<T> out({py::ssize_t(H), py::ssize_t(a0.rows), py::ssize_t(a0.cols)});
    T* o = out.mutable_data();
    for (index_t h = 0; h < H; ++h) {
        ft::CMatView<T> a = m.attention_weights(kind, layer, seq, h);
        for (index_t i = 0; i < a.rows; ++i)
            for (index_t j = 0; j < a.cols; ++j) o[(h * a.rows + i) * a.cols + j] = a(i, j);
    }
    return out;
}

// The dropout masks of the last forward (training): name -> bool array, True = kept. Sublayer outputs and
// embeddings: (d_e, n) over the batch's columns; attention weights: a list over the sequences of (H, rows,
// columns) arrays laid out as attention_weights returns them.
template <class Model>
py::dict masks_dict(const Model& m) {
    py::dict out;
    using T = typename std::decay_t<decltype(m.store)>::value_type;
    for (const auto& r : static_cast<const ft::Model<T>&>(m).dropout_masks()) {
        const std::vector<std::uint8_t>& keep = r.mask->keep;
        if (!r.weights) {
            const py::ssize_t d = m.cfg.d_e, n = py::ssize_t(keep.size()) / d;
            py::array_t<bool, py::array::f_style> a({d, n});
            std::copy(keep.begin(), keep.end(), a.mutable_data());
            out[py::str(r.name)] = a;
            continue;
        }
        py::list seqs;
        const index_t B = m.last_forward().x.count(), H = m.cfg.H;
        for (index_t b = 0; b < B; ++b) {
            auto a0 = m.attention_weights(r.kind, r.layer, b, 0);
            py::array_t<bool> a({py::ssize_t(H), py::ssize_t(a0.rows), py::ssize_t(a0.cols)});
            bool* o = a.mutable_data();
            for (index_t h = 0; h < H; ++h) {
                auto w = m.attention_weights(r.kind, r.layer, b, h);
                const std::size_t off = std::size_t(w.data - r.A0);
                for (index_t i = 0; i < w.rows; ++i)
                    for (index_t j = 0; j < w.cols; ++j) o[(h * w.rows + i) * w.cols + j] = keep[off + std::size_t(i + j * w.rows)] != 0;
            }
            seqs.append(a);
        }
        out[py::str(r.name)] = seqs;
    }
    return out;
}

}  // namespace


namespace {
template <template <class> class Unit, class PyClass>
void def_model_common(PyClass& cls) {
    using D = Dual<Unit>;
    def_params_api<Unit>(cls);
    cls.def_property_readonly("n_vocab", [](D& d) { return d.visit([](auto& m) { return m.cfg.n_vocab; }); })
        .def_property_readonly("l_max", [](D& d) { return d.visit([](auto& m) { return m.cfg.l_max; }); })
        .def_property_readonly("H", [](D& d) { return d.visit([](auto& m) { return m.cfg.H; }); })
        .def_property_readonly("d_e", [](D& d) { return d.visit([](auto& m) { return m.cfg.d_e; }); })
        .def_property_readonly("mask_token", [](D& d) { return d.visit([](auto& m) { return m.cfg.mask_token(); }); },
                               "N_V − 3 (paper §4, 0-based)")
        .def_property_readonly("bos_token", [](D& d) { return d.visit([](auto& m) { return m.cfg.bos_token(); }); },
                               "N_V − 2")
        .def_property_readonly("eos_token", [](D& d) { return d.visit([](auto& m) { return m.cfg.eos_token(); }); },
                               "N_V − 1")
        .def_property_readonly("n_params",
                               [](D& d) {
                                   return d.visit([](auto& m) {
                                       index_t n = 0;
                                       for (const auto& e : m.store.entries())
                                           if (e.trainable) n += e.size;
                                       return n;
                                   });
                               },
                               "Number of trainable scalars in θ.");
    // dropout's counter and seed: unsigned 64-bit fields of every model, settable (seed_arg's checks)
    const auto u64_field = [&cls](const char* name, auto field, const char* doc) {
        cls.def_property(
            name, [field](D& d) { return d.visit([&](auto& m) { return std::uint64_t(field(m)); }); },
            [field, name](D& d, const py::handle& v) {
                const std::uint64_t s = seed_arg(v, name);
                CallLock lock(d.mutex);
                d.visit([&](auto& m) { field(m) = s; });
            },
            doc);
    };
    u64_field("dropout_step", [](auto& m) -> std::uint64_t& { return m.dropout_step; },
              "Dropout's counter (docs/regularisation.md): the masks of a training forward are keyed by (dropout_seed, "
              "dropout_step, place, entry); each loss_and_grad advances it by one. Set it back to replay the same masks.");
    u64_field("dropout_seed", [](auto& m) -> std::uint64_t& { return m.dropout_seed; },
              "The seed of dropout's masks (docs/regularisation.md), at first the model's seed. Setting it draws other "
              "masks from the same θ (data-parallel workers: a different one each, e.g. seed + rank).");
    cls.def(
            "dropout_masks",
            [](D& d) {
                CallLock lock(d.mutex);
                return d.visit([&](auto& m) { return masks_dict(m); });
            },
            "The dropout masks of the last forward, True = kept (empty after an evaluating call: model(x), loss, "
            "or rates 0): 'embed' (D, E) / 'embed.z', 'embed.x' (ED) and '<layer>.attn.out', "
            "'<layer>.mlp.out' (ED decoder: also '<layer>.cross_attn.out') as (d_e, n) arrays over the batch's "
            "columns; '<layer>.attn.weights' ('<layer>.cross_attn.weights') as a list over the sequences of "
            "(H, rows, columns) arrays laid out as attention_weights.");
}
// The single-input surface of Algorithms 9 and 10: P = model(x), model.logits(x), attention_weights, L.
template <template <class> class Unit, class PyClass>
void def_single_input(PyClass& cls) {
    using D = Dual<Unit>;
    if constexpr (!std::is_same_v<Unit<double>, ft::ETransformer<double>>)  // E: def_segment_inputs
    cls.def(
           "__call__",
           [](D& d, const py::handle& x) {
               CallLock lock(d.mutex);
               return d.visit([&](auto& m) -> py::object {
                   using T = typename std::decay_t<decltype(m.store)>::value_type;
                   InBatch in = in_batch(x, "x", m.cfg.n_vocab, ft::max_input_length(m.cfg));
                   return shaped_output<T>(m.cfg.n_vocab, in, is_2d(x), [&](ft::MatView<T> P) {
                       m.forward(Tokens{in.ids.data(), seqs_of(in)});  // every line but the last
                       m.probabilities(P);                             // the last: P = softmax(W_u X)
                   });
               });
           },
           py::arg("x"))
        .def(
            "logits",
            [](D& d, const py::handle& x) {
                CallLock lock(d.mutex);
                return d.visit([&](auto& m) -> py::object {
                    using T = typename std::decay_t<decltype(m.store)>::value_type;
                    InBatch in = in_batch(x, "x", m.cfg.n_vocab, ft::max_input_length(m.cfg));
                    return shaped_output<T>(m.cfg.n_vocab, in, is_2d(x), [&](ft::MatView<T> Z) {
                        m.forward(Tokens{in.ids.data(), seqs_of(in)});
                        m.logits(Z);
                    });
                });
            },
            py::arg("x"), "W_u X (before the final softmax), shaped like the call's output.");
    cls.def(
            "attention_weights",
            [](D& d, long long layer, long long seq) {
                CallLock lock(d.mutex);
                return d.visit([&](auto& m) { return attention_array(m, m.self_attention, layer, seq); });
            },
            py::arg("layer"), py::arg("seq") = 0,
            "softmax(S/√d_attn) of every head of `layer` in the last forward call: (H, ℓ, ℓ); column t is how "
            "token t attends to the tokens of its sequence.")
        .def_property_readonly("L", [](D& d) { return d.visit([](auto& m) { return m.cfg.L; }); });
}


// loss_and_grad and loss of the two-input models: ETransformer (x_tilde, x) and EDTransformer (z, x). `pair`
// checks and converts the two inputs; `core_args` turns them into the core call's arguments (a tuple).
template <template <class> class Unit, class PyClass, class Pair, class CoreArgs>
void def_pair_losses(PyClass& cls, const char* a, const char* b, Pair pair, CoreArgs core_args, const char* doc) {
    using D = Dual<Unit>;
    cls.def(
           "loss_and_grad",
           [pair, core_args](py::object self, const py::handle& A, const py::handle& B, bool copy) {
               D& d = self.cast<D&>();
               CallLock lock(d.mutex);
               return d.visit([&](auto& m) {
                   auto [p, q] = pair(m, A, B);
                   double loss;
                   {
                       CoreCall nogil;
                       loss = std::apply([&](auto&&... args) { return m.loss_and_grad(args...); }, core_args(p, q));
                   }
                   return py::make_tuple(loss, grads_out(self, m.store, copy));
               });
           },
           py::arg(a), py::arg(b), py::arg("copy") = true, doc)
        .def(
            "loss",
            [pair, core_args](D& d, const py::handle& A, const py::handle& B, const std::string& reduction) {
                CallLock lock(d.mutex);
                return d.visit([&](auto& m) {
                    auto [p, q] = pair(m, A, B);
                    apply_reduction(0, 1, reduction);
                    index_t scored = 0;
                    double loss;
                    {
                        CoreCall nogil;
                        loss = std::apply([&](auto&&... args) { return m.loss(args..., &scored); }, core_args(p, q));
                    }
                    return apply_reduction(loss, scored, reduction);
                });
            },
            py::arg(a), py::arg(b), py::arg("reduction") = "sum");
}

// BERT's segment (token-type) ids of ETransformer: None (every token in segment 0) or ids shaped like x.
template <class M>
std::vector<index_t> segment_ids(const M& m, const py::object& segments, const InBatch& x) {
    if (segments.is_none()) return {};
    if (m.cfg.n_segments <= 0)
        throw ft::ValueError("segments given, but the model has no segment embeddings (n_segments = 0)");
    InBatch s = in_batch(segments, "segments", m.cfg.n_segments, ft::max_input_length(m.cfg));
    if (s.lengths != x.lengths)
        throw ft::ValueError("segments must have the shape of x (one segment id per token)");
    return std::move(s.ids);
}
const index_t* ptr_or_null(const std::vector<index_t>& v) { return v.empty() ? nullptr : v.data(); }

// ETransformer's inputs with segment ids: P = model(x, segments=…), logits, hidden, and the losses.
template <class PyClass>
void def_segment_inputs(PyClass& cls) {
    using D = Dual<ft::ETransformer>;
    // what: 0 probabilities, 1 logits, 2 X after line 9
    auto run = [](D& d, const py::handle& x, const py::object& segments, int what) {
        CallLock lock(d.mutex);
        return d.visit([&](auto& m) -> py::object {
            using T = typename std::decay_t<decltype(m.store)>::value_type;
            InBatch in = in_batch(x, "x", m.cfg.n_vocab, ft::max_input_length(m.cfg));
            const std::vector<index_t> seg = segment_ids(m, segments, in);
            const index_t rows = what == 2 ? m.cfg.d_e : m.cfg.n_vocab;
            return shaped_output<T>(rows, in, is_2d(x), [&](ft::MatView<T> out) {
                m.forward(Tokens{in.ids.data(), seqs_of(in)}, ptr_or_null(seg));  // lines 1–11
                if (what == 0) m.probabilities(out);                              // line 12
                else if (what == 1) m.logits(out);
                else {
                    ft::CMatView<T> h = m.hidden();
                    std::copy(h.data, h.data + h.size(), out.data);
                }
            });
        });
    };
    cls.def("__call__", [run](D& d, const py::handle& x, const py::object& segments) { return run(d, x, segments, 0); },
            py::arg("x"), py::kw_only(), py::arg("segments") = py::none())
        .def("logits", [run](D& d, const py::handle& x, const py::object& segments) { return run(d, x, segments, 1); },
             py::arg("x"), py::kw_only(), py::arg("segments") = py::none(),
             "W_u X (+ b_u 1ᵀ with unembed_bias; before the final softmax), shaped like the call's output.")
        .def("hidden", [run](D& d, const py::handle& x, const py::object& segments) { return run(d, x, segments, 2); },
             py::arg("x"), py::kw_only(), py::arg("segments") = py::none(),
             "X after line 9 (the last layer's output; BERT's last hidden state): (d_e, ℓ) for one sequence, "
             "(N, d_e, ℓ) for a 2-D batch, a list for a ragged list. Beyond the listing, which returns only P.");
    auto pair = [](auto& m, const py::handle& x_tilde, const py::handle& x, const py::object& segments) {
        InBatch xt = in_batch(x_tilde, "x_tilde", m.cfg.n_vocab, ft::max_input_length(m.cfg));
        InBatch xo = in_batch(x, "x", m.cfg.n_vocab, ft::max_input_length(m.cfg));
        if (xt.lengths != xo.lengths)
            throw ft::ValueError("x_tilde and x must have the same shape (the same sequences, the same lengths)");
        std::vector<index_t> seg = segment_ids(m, segments, xt);
        return std::make_tuple(std::move(xt), std::move(xo), std::move(seg));
    };
    cls.def(
           "loss_and_grad",
           [pair](py::object self, const py::handle& x_tilde, const py::handle& x, bool copy, const py::object& segments) {
               D& d = self.cast<D&>();
               CallLock lock(d.mutex);
               return d.visit([&](auto& m) {
                   auto [xt, xo, seg] = pair(m, x_tilde, x, segments);
                   double loss;
                   {
                       CoreCall nogil;
                       loss = m.loss_and_grad(Tokens{xt.ids.data(), seqs_of(xt)}, xo.ids.data(), ptr_or_null(seg));
                   }
                   return py::make_tuple(loss, grads_out(self, m.store, copy));
               });
           },
           py::arg("x_tilde"), py::arg("x"), py::arg("copy") = true, py::kw_only(), py::arg("segments") = py::none(),
           "Algorithm 12 line 9 and its gradient: (loss, grads); copy as DTransformer.loss_and_grad; segments: "
           "segment ids shaped like x (n_segments > 0).")
        .def(
            "loss",
            [pair](D& d, const py::handle& x_tilde, const py::handle& x, const std::string& reduction, const py::object& segments) {
                CallLock lock(d.mutex);
                return d.visit([&](auto& m) {
                    auto [xt, xo, seg] = pair(m, x_tilde, x, segments);
                    apply_reduction(0, 1, reduction);
                    index_t scored = 0;
                    double loss;
                    {
                        CoreCall nogil;
                        loss = m.loss(Tokens{xt.ids.data(), seqs_of(xt)}, xo.ids.data(), &scored, nullptr, ptr_or_null(seg));
                    }
                    return apply_reduction(loss, scored, reduction);
                });
            },
            py::arg("x_tilde"), py::arg("x"), py::arg("reduction") = "sum", py::kw_only(), py::arg("segments") = py::none());
}

}  // namespace

void register_transformers(py::module_& m) {
    // ------------------------------------------------------------------------------------------------
    using DD = Dual<ft::DTransformer>;
    py::class_<DD, StoreHolder> dcls(m, "DTransformer", R"doc(Algorithm 10: P ← DTransformer(x | θ) — GPT-2, a decoder-only transformer.

Pre-LN layers with causal (unidirectional) multi-head self-attention and a GELU MLP, a final layer_norm,
and P = softmax(W_u X). Hyperparameters: n_vocab (N_V), l_max, L, H, d_e, d_mlp; keyword options
d_attn = d_mid = d_e // H by default, norm="layer" | "rms" (Gopher's RMSnorm), positional="learned" |
"sinusoidal" (base replaces ℓ_max in the paper's formula), tied=False (W_u = W_eᵀ when True),
gelu="exact" | "tanh" (GPT-2's approximation), eps (inside layer_norm's square root), dtype, seed,
init_std (GPT-2's init: N(0, init_std²), residual projections / √(2L), biases 0, γ = 1, β = 0).
Variants (docs/variants.md): positional="rope" (rope_theta=10000.0) | "alibi" (no W_p), H_kv key/value
heads (grouped-query attention; None: H), mlp="gelu" | "swiglu", bias=False (no biases in attention and
MLP), sliding_window=w (V8: each query sees the last w keys, Mistral; decoding keeps a rolling cache of w
columns). With norm="rms" these make a LLaMA-style (Mistral-style) decoder; the defaults are Algorithm 10.
Dropout (docs/regularisation.md; beyond the listing): dropout=p drops after the embedding sum, on the
attention weights and on each sublayer's output before the residual add (embed_dropout, attn_dropout,
resid_dropout: per place, None = dropout). Only loss_and_grad (and the trainers) drop; model(x), loss,
inference never do. Masks: keyed by (dropout_seed, dropout_step); dropout_masks() shows the last ones.

Call: P = model(x), x a 1-D sequence of token ids (ℓ ≤ l_max; any ℓ with positional="rope"|"alibi",
which have no table of positions) -> P (N_V, ℓ); column t is the distribution of x[t+1] given x[:t+1].
A 2-D (N, ℓ) array gives (N, N_V, ℓ); a list of sequences a list.
loss_and_grad(x) -> (loss, grads): Algorithm 13 line 5, −Σ_{t<ℓ−1} log P[x[t+1], t], summed over the
batch, with the gradient of every parameter (copies; model.grads holds the same, zero-copy).)doc");
    dcls.def(py::init([](long long n_vocab, long long l_max, long long L, long long H, long long d_e, long long d_mlp,
                         const py::object& d_attn, const py::object& d_mid, const std::string& norm,
                         const std::string& positional, const py::object& base, bool tied, const std::string& gelu,
                         double eps, const py::object& dtype, const py::object& seed, double init_std,
                         const py::object& H_kv, const py::object& bias, const std::string& mlp, double rope_theta,
                         const py::object& sliding_window, const py::object& dropout, const py::object& embed_dropout, const py::object& attn_dropout,
                         const py::object& resid_dropout, const std::string& attention_impl) {
                 ModelConfig c;
                 c.n_vocab = n_vocab;
                 c.l_max = l_max;
                 c.L = L;
                 c.H = H;
                 c.d_e = d_e;
                 c.d_mlp = d_mlp;
                 c.norm = parse_norm(norm);
                 c.gelu = parse_gelu(gelu);
                 common_options(c, d_attn, d_mid, positional, base, tied, eps, seed, init_std);
                 variant_options(c, H_kv, bias);
                 c.mlp = parse_mlp(mlp);
                 c.rope_theta = rope_theta;
                 c.sliding_window = opt_size(sliding_window, "sliding_window");
                 dropout_options(c, dropout, embed_dropout, attn_dropout, resid_dropout);
                 c.attention_impl = parse_attention_impl(attention_impl);
                 const DType dt = parse_dtype(dtype);
                 CoreCall nogil;
                 return std::make_unique<DD>(dt, c);
             }),
             py::arg("n_vocab"), py::arg("l_max"), py::arg("L"), py::arg("H"), py::arg("d_e"), py::arg("d_mlp"),
             py::kw_only(), py::arg("d_attn") = py::none(), py::arg("d_mid") = py::none(), py::arg("norm") = "layer",
             py::arg("positional") = "learned", py::arg("base") = py::none(), py::arg("tied") = false,
             py::arg("gelu") = "exact", py::arg("eps") = 1e-5, py::arg("dtype") = "float32", py::arg("seed") = 0,
             py::arg("init_std") = 0.02, py::arg("H_kv") = py::none(), py::arg("bias") = true, py::arg("mlp") = "gelu",
             py::arg("rope_theta") = 10000.0, py::arg("sliding_window") = py::none(), FT_DROPOUT_ARGS);
    def_model_common<ft::DTransformer>(dcls);
    def_single_input<ft::DTransformer>(dcls);
    dcls        .def(
            "loss_and_grad",
            [](py::object self, const py::handle& x, bool copy) {
                DD& d = self.cast<DD&>();
                CallLock lock(d.mutex);
                return d.visit([&](auto& m) {
                    InBatch in = in_batch(x, "x", m.cfg.n_vocab, ft::max_input_length(m.cfg));
                    double loss;
                    {
                        CoreCall nogil;
                        loss = m.loss_and_grad(Tokens{in.ids.data(), seqs_of(in)});
                    }
                    return py::make_tuple(loss, grads_out(self, m.store, copy));
                });
            },
            py::arg("x"), py::arg("copy") = true,
            "Algorithm 13 line 5 and its gradient: (loss, grads). x: one sequence, a 2-D (N, ℓ) batch or a list "
            "of sequences of any lengths (the loss is the sum over sequences). grads: a dict of arrays that later "
            "calls do not change (one copy of the flat gradient); copy=False returns model.grads itself "
            "(zero-copy views, overwritten by the next call, as PyTorch's .grad).")
        .def(
            "loss",
            [](DD& d, const py::handle& x, const std::string& reduction) {
                CallLock lock(d.mutex);
                return d.visit([&](auto& m) {
                    InBatch in = in_batch(x, "x", m.cfg.n_vocab, ft::max_input_length(m.cfg));
                    index_t scored = 0;
                    double loss;
                    apply_reduction(0, 1, reduction);
                    {
                        CoreCall nogil;
                        loss = m.loss(Tokens{in.ids.data(), seqs_of(in)}, &scored);
                    }
                    return apply_reduction(loss, scored, reduction);
                });
            },
            py::arg("x"), py::arg("reduction") = "sum",
            "The loss without gradients; reduction='mean' divides by the number of predicted tokens.")
        .def_property_readonly("config", [](DD& d) { return d.visit([&](auto& m) { return config_dict(m.cfg, "DTransformer", d.dtype()); }); })
        .def("__repr__", [](DD& d) { return d.visit([&](auto& m) { return model_repr(config_dict(m.cfg, "DTransformer", d.dtype())); }); });

    // ------------------------------------------------------------------------------------------------
    using DE = Dual<ft::ETransformer>;
    py::class_<DE, StoreHolder> ecls(m, "ETransformer", R"doc(Algorithm 9: P ← ETransformer(x | θ) — BERT, an encoder-only transformer.

Post-LN layers with bidirectional multi-head self-attention and a GELU MLP, then X ← GELU(W_f X + b_f 1ᵀ),
a final layer_norm, and P = softmax(W_u X) with W_u (N_V, d_f) (the listing's N_V × d_e only type-checks
when d_f = d_e; see the errata). Hyperparameters: n_vocab, l_max, L, H, d_e, d_mlp, d_f; options as
DTransformer (no norm option; dropout=… as DTransformer, embed_dropout acting after embed_norm's layer_norm).
BERT's options, beyond Algorithm 9 (the defaults keep the listing): n_segments > 0 adds segment
(token-type) embeddings W_s (d_e, n_segments) to line 2's e_t for the `segments=` ids of every call (0 when
None); embed_norm=True applies layer_norm(· | γ_e, β_e) to X after line 3; unembed_bias=True gives
P = softmax(W_u X + b_u 1ᵀ). model.hidden(x) returns X after line 9 (BERT's last hidden state).
loss_and_grad(x_tilde, x): Algorithm 12 line 9, −Σ_{t∈T̃} log P[x[t], t] over T̃ = {t : x̃[t] = mask_token}
(mask_token = N_V − 3); with no masked position the loss is 0 and every gradient 0.)doc");
    ecls.def(py::init([](long long n_vocab, long long l_max, long long L, long long H, long long d_e, long long d_mlp,
                         long long d_f, const py::object& d_attn, const py::object& d_mid, const std::string& positional,
                         const py::object& base, bool tied, const std::string& gelu, double eps, const py::object& dtype,
                         const py::object& seed, double init_std, long long n_segments, bool embed_norm, bool unembed_bias,
                         const py::object& H_kv, const py::object& bias, const py::object& dropout,
                         const py::object& embed_dropout, const py::object& attn_dropout, const py::object& resid_dropout, const std::string& attention_impl) {
                 ModelConfig c;
                 c.n_vocab = n_vocab;
                 c.l_max = l_max;
                 c.L = L;
                 c.H = H;
                 c.d_e = d_e;
                 c.d_mlp = d_mlp;
                 c.d_f = d_f;
                 c.gelu = parse_gelu(gelu);
                 common_options(c, d_attn, d_mid, positional, base, tied, eps, seed, init_std);
                 c.n_segments = n_segments;
                 c.embed_norm = embed_norm;
                 c.unembed_bias = unembed_bias;
                 variant_options(c, H_kv, bias);
                 dropout_options(c, dropout, embed_dropout, attn_dropout, resid_dropout);
                 c.attention_impl = parse_attention_impl(attention_impl);
                 const DType dt = parse_dtype(dtype);
                 CoreCall nogil;
                 return std::make_unique<DE>(dt, c);
             }),
             py::arg("n_vocab"), py::arg("l_max"), py::arg("L"), py::arg("H"), py::arg("d_e"), py::arg("d_mlp"),
             py::arg("d_f"), py::kw_only(), py::arg("d_attn") = py::none(), py::arg("d_mid") = py::none(),
             py::arg("positional") = "learned", py::arg("base") = py::none(), py::arg("tied") = false,
             py::arg("gelu") = "exact", py::arg("eps") = 1e-5, py::arg("dtype") = "float32", py::arg("seed") = 0,
             py::arg("init_std") = 0.02, py::arg("n_segments") = 0, py::arg("embed_norm") = false,
             py::arg("unembed_bias") = false, py::arg("H_kv") = py::none(), py::arg("bias") = true, FT_DROPOUT_ARGS);
    def_model_common<ft::ETransformer>(ecls);
    def_single_input<ft::ETransformer>(ecls);
    def_segment_inputs(ecls);  // __call__, logits, hidden, loss_and_grad, loss with BERT's segment ids
    ecls.def_property_readonly("d_f", [](DE& d) { return d.visit([](auto& m) { return m.cfg.d_f; }); })
        .def_property_readonly("config", [](DE& d) { return d.visit([&](auto& m) { return config_dict(m.cfg, "ETransformer", d.dtype()); }); })
        .def("__repr__", [](DE& d) { return d.visit([&](auto& m) { return model_repr(config_dict(m.cfg, "ETransformer", d.dtype())); }); });

    // ------------------------------------------------------------------------------------------------
    using DED = Dual<ft::EDTransformer>;
    py::class_<DED, StoreHolder> edcls(m, "EDTransformer", R"doc(Algorithm 8: P ← EDTransformer(z, x | θ) — the original encoder-decoder transformer.

Encoder: post-LN layers of bidirectional self-attention and a ReLU MLP over the context z. Decoder:
post-LN layers of causal self-attention, cross-attention to the encoded Z, and a ReLU MLP; then
P = softmax(W_u X). Hyperparameters: n_vocab, l_max, L_enc, L_dec, H, d_e, d_mlp; options d_attn, d_mid,
positional, base, tied, eps, dtype, seed, init_std, H_kv, bias, dropout (as DTransformer: embeddings of z and x,
attention weights of all three attentions, every sublayer's output).
Call: P = model(z, x) -> (N_V, ℓ_x). loss_and_grad(z, x): Algorithm 11 line 5, −Σ_{t<ℓ_x−1} log P[x[t+1], t].)doc");
    edcls.def(py::init([](long long n_vocab, long long l_max, long long L_enc, long long L_dec, long long H, long long d_e,
                          long long d_mlp, const py::object& d_attn, const py::object& d_mid, const std::string& positional,
                          const py::object& base, bool tied, double eps, const py::object& dtype, const py::object& seed,
                          double init_std, const py::object& H_kv, const py::object& bias, const py::object& dropout,
                          const py::object& embed_dropout, const py::object& attn_dropout, const py::object& resid_dropout, const std::string& attention_impl) {
                  ModelConfig c;
                  c.n_vocab = n_vocab;
                  c.l_max = l_max;
                  c.L_enc = L_enc;
                  c.L_dec = L_dec;
                  c.H = H;
                  c.d_e = d_e;
                  c.d_mlp = d_mlp;
                  common_options(c, d_attn, d_mid, positional, base, tied, eps, seed, init_std);
                  variant_options(c, H_kv, bias);
                  dropout_options(c, dropout, embed_dropout, attn_dropout, resid_dropout);
                 c.attention_impl = parse_attention_impl(attention_impl);
                  const DType dt = parse_dtype(dtype);
                  CoreCall nogil;
                  return std::make_unique<DED>(dt, c);
              }),
              py::arg("n_vocab"), py::arg("l_max"), py::arg("L_enc"), py::arg("L_dec"), py::arg("H"), py::arg("d_e"),
              py::arg("d_mlp"), py::kw_only(), py::arg("d_attn") = py::none(), py::arg("d_mid") = py::none(),
              py::arg("positional") = "learned", py::arg("base") = py::none(), py::arg("tied") = false,
              py::arg("eps") = 1e-5, py::arg("dtype") = "float32", py::arg("seed") = 0, py::arg("init_std") = 0.02,
              py::arg("H_kv") = py::none(), py::arg("bias") = true, FT_DROPOUT_ARGS);
    def_model_common<ft::EDTransformer>(edcls);
    auto ed_pair = [](auto& m, const py::handle& z, const py::handle& x) {
        InBatch zb = in_batch(z, "z", m.cfg.n_vocab, ft::max_input_length(m.cfg));
        InBatch xb = in_batch(x, "x", m.cfg.n_vocab, ft::max_input_length(m.cfg));
        if (zb.lengths.size() != xb.lengths.size())
            throw ft::ValueError("z and x must hold the same number of sequences, got " + std::to_string(zb.lengths.size()) +
                                 " and " + std::to_string(xb.lengths.size()));
        return std::make_pair(std::move(zb), std::move(xb));
    };
    edcls.def(
             "__call__",
             [ed_pair](DED& d, const py::handle& z, const py::handle& x) {
                 CallLock lock(d.mutex);
                 return d.visit([&](auto& m) -> py::object {
                     using T = typename std::decay_t<decltype(m.store)>::value_type;
                     auto [zb, xb] = ed_pair(m, z, x);
                     return shaped_output<T>(m.cfg.n_vocab, xb, is_2d(x), [&](ft::MatView<T> P) {
                         m.forward(Tokens{zb.ids.data(), seqs_of(zb)}, Tokens{xb.ids.data(), seqs_of(xb)});  // lines 1–20
                         m.probabilities(P);                                                              // line 21
                     });
                 });
             },
             py::arg("z"), py::arg("x"))
        .def(
            "logits",
            [ed_pair](DED& d, const py::handle& z, const py::handle& x) {
                CallLock lock(d.mutex);
                return d.visit([&](auto& m) -> py::object {
                    using T = typename std::decay_t<decltype(m.store)>::value_type;
                    auto [zb, xb] = ed_pair(m, z, x);
                    return shaped_output<T>(m.cfg.n_vocab, xb, is_2d(x), [&](ft::MatView<T> Zl) {
                        m.forward(Tokens{zb.ids.data(), seqs_of(zb)}, Tokens{xb.ids.data(), seqs_of(xb)});
                        m.logits(Zl);
                    });
                });
            },
            py::arg("z"), py::arg("x"));
    def_pair_losses<ft::EDTransformer>(
        edcls, "z", "x", ed_pair,
        [](const InBatch& zb, const InBatch& xb) {
            return std::make_tuple(Tokens{zb.ids.data(), seqs_of(zb)}, Tokens{xb.ids.data(), seqs_of(xb)});
        },
        "Algorithm 11 line 5 and its gradient: (loss, grads); copy as DTransformer.loss_and_grad.");
    edcls.def(
            "attention_weights",
            [](DED& d, const std::string& kind, long long layer, long long seq) {
                CallLock lock(d.mutex);
                ft::AttentionKind which;
                if (kind == "enc") which = ft::AttentionKind::Encoder;
                else if (kind == "dec") which = ft::AttentionKind::Decoder;
                else if (kind == "cross") which = ft::AttentionKind::Cross;
                else throw ft::ValueError("kind must be 'enc', 'dec' or 'cross', got '" + kind + "'");
                return d.visit([&](auto& m) { return attention_array(m, which, layer, seq); });
            },
            py::arg("kind"), py::arg("layer"), py::arg("seq") = 0,
            "Attention matrices of the last forward call: kind 'enc' (ℓ_z, ℓ_z), 'dec' (ℓ_x, ℓ_x) or 'cross' "
            "(ℓ_z, ℓ_x), for every head: (H, rows, columns).")
        .def_property_readonly("L_enc", [](DED& d) { return d.visit([](auto& m) { return m.cfg.L_enc; }); })
        .def_property_readonly("L_dec", [](DED& d) { return d.visit([](auto& m) { return m.cfg.L_dec; }); })
        .def_property_readonly("config", [](DED& d) { return d.visit([&](auto& m) { return config_dict(m.cfg, "EDTransformer", d.dtype()); }); })
        .def("__repr__", [](DED& d) { return d.visit([&](auto& m) { return model_repr(config_dict(m.cfg, "EDTransformer", d.dtype())); }); });
}


}  // namespace ftpy
