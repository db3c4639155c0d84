// Algorithms 8–10 as Python classes: EDTransformer, ETransformer, DTransformer.
#include <map>
#include <optional>
#include <tuple>
#include <type_traits>

#include "bind.hpp"
#include "formal_transformers/lora.hpp"
#include "formal_transformers/io.hpp"
#include "../src/runtime/bounded_json.hpp"
#include "formal_transformers/training.hpp"
#include "formal_transformers/transformers.hpp"

namespace ftpy {

namespace {
using ft::ModelConfig;
using ft::Tokens;

ft::Seqs seqs_of(const InBatch& b) { return ft::Seqs::from_lengths(b.lengths); }

// The constructors: the sizes positionally or by name, every other option by name, dtype beside them. The
// core's schema (ModelConfig::from_options) checks every name, type and value; the model is built without the GIL.
template <template <class> class Unit>
std::unique_ptr<AnyDtype<Unit>> make_model(ft::Arch arch, const py::args& args, const py::kwargs& kwargs) {
    const std::vector<std::string> sizes = ModelConfig::positional_names(arch);
    std::vector<ft::OptionValue> positional;
    for (std::size_t i = 0; i < args.size(); ++i)
        positional.push_back(option_value(args[i], i < sizes.size() ? sizes[i] : "argument " + std::to_string(i + 1)));
    ft::Options keywords;
    DType dt = DType::F32;
    ft::Precision precision = ft::Precision::Float32;
    for (auto kv : kwargs) {
        const std::string name = kv.first.cast<std::string>();
        if (name == "dtype") dt = parse_dtype(py::reinterpret_borrow<py::object>(kv.second));
        else if (name == "precision") precision = parse_precision_arg(kv.second);
        else keywords.emplace_back(name, option_value(kv.second, name));
    }
    if (precision == ft::Precision::BF16Mixed && dt != DType::F32)
        throw ft::ValueError("precision 'bf16-mixed' is for float32 models: dtype float64 computes in float64");
    const ModelConfig c = ModelConfig::from_options(arch, keywords, positional);
    CoreCall nogil;
    auto made = std::make_unique<AnyDtype<Unit>>(dt, c);
    made->visit([&](auto& m) { m.set_precision(precision); });
    return made;
}

// "__init__(n_vocab, …, *, d_attn=None, …, dtype='float32')": the schema's options with their defaults.
const char* constructor_doc(ft::Arch arch) {
    static std::string docs[3];
    std::string& d = docs[int(arch)];
    d = "__init__(" + ModelConfig::signature(arch) +
        ", dtype='float32', precision='float32')\n\nThe sizes positionally or by name, every other option by name (the class docstring "
        "says what each means). TypeError for an unknown option or a value of the wrong type, ValueError for a "
        "value out of range.";
    return d.c_str();
}

template <class D>
std::string config_text(const D& d) {
    return std::visit([&](const auto& p) { return p->cfg.to_json(d.dtype().c_str()); }, d.u);
}

// model.config: the core's JSON of the config (ModelConfig::to_json, with the dtype) as a dict.
template <class D>
py::object config_of(D& d) {
    return py::module_::import("json").attr("loads")(config_text(d));
}
template <class D>
std::string repr_of(D& d) {
    return d.visit([&](auto& m) { return m.cfg.to_string(d.dtype().c_str()); });
}

// One call of a model from Python, in the order the core checks it: `run` (the listing's every line but the
// last, GIL released) validates the input — the core's check, once (ft::validate in the models' forward) —
// before the output (N_V or d_e rows, one column per token) is allocated; then `last` writes the listing's last
// line into it (GIL released). Shaped for the input: (rows, ℓ) for one sequence, (N, rows, ℓ) for a 2-D batch,
// a list of (rows, ℓ_b) for a ragged list. The bindings only convert, release the GIL and shape.
template <class T, class Run, class Last>
py::object shaped_output(index_t n_vocab, const InBatch& in, bool two_d, Run run, Last last) {
    auto out = run_then_output<T>(n_vocab, index_t(in.ids.size()), run, last);
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

// The gradients after loss_and_grad: a copy (grads_copy, bind.cpp) or views of the model's buffer.
template <class T>
py::object grads_out(const py::object& self, ft::ParamStore<T>& store, bool copy) {
    if (copy) return grads_copy(store);
    return py::cast(make_param_dict(self, store, true));
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
    // LoRA's adapter inputs (lora.hpp line 2′): <W's name>.lora_dropout, (d_in, n) over the batch's columns
    const auto& adapters = m.store.adapters();
    for (std::size_t k = 0; k < adapters.size(); ++k) {
        const ft::DropoutMask& mask = m.store.adapter_run(index_t(k)).mask;
        if (!mask.active()) continue;
        const py::ssize_t d = adapters[k].cols, n = py::ssize_t(mask.keep.size()) / d;
        py::array_t<bool, py::array::f_style> a({d, n});
        std::copy(mask.keep.begin(), mask.keep.end(), a.mutable_data());
        out[py::str(adapters[k].name + ".lora_dropout")] = a;
    }
    return out;
}

}  // namespace


namespace {
// LoRA (lora.hpp): the model rebuilt in place with the adapters `lora` (none: merged, W ← W + s·B·A). Everything
// is checked (the new model is made) before the object changes; θ is copied by name, new A's drawn as peft
// draws them (U(±1/√d_in), from the model's seed), new B's zero.
template <template <class> class Unit>
void relora(AnyDtype<Unit>& d, const ft::ModelConfig::Lora& lora) {
    CallLock lock(d.mutex);
    std::visit([&](auto& old) {
        using T = typename std::decay_t<decltype(old->store)>::value_type;
        Unit<T>& m = *old;
        const bool merge = lora.targets.empty();
        if (!merge && !m.cfg.lora.targets.empty())
            throw ft::ValueError("lora: the model already has LoRA adapters (on " + std::to_string(m.store.adapters().size()) +
                                 " matrices); merge_lora() first");
        ft::ModelConfig c = m.cfg;
        c.lora = lora;
        std::unique_ptr<Unit<T>> made;
        {
            CoreCall nogil;
            made = std::make_unique<Unit<T>>(c);
            made->set_precision(m.precision);  // a bf16-mixed model stays bf16-mixed with its adapters (and merged)
            m.store.refresh_adapters();  // W' as θ holds it now (merge: W ← W')
            ft::ParamStore<T>& to = made->store;
            ft::Rng rng(c.seed ^ 0x4c6f5241ULL);
            for (const ft::ParamInfo& e : to.entries()) {
                T* dst = to.theta() + e.offset;
                if (const ft::ParamInfo* src = m.store.find(e.name)) {
                    const T* from = m.store.W(ft::MatParam{src->offset, 1, src->size}).data;  // W' when adapted
                    std::copy(from, from + e.size, dst);
                } else if (e.name.size() > 7 && e.name.compare(e.name.size() - 7, 7, ".lora_A") == 0) {
                    const double bound = 1.0 / std::sqrt(double(e.shape.back()));  // kaiming_uniform_(a=√5)
                    for (index_t i = 0; i < e.size; ++i) dst[i] = T(bound * (2.0 * rng.uniform() - 1.0));
                } else {
                    std::fill(dst, dst + e.size, T(0));  // B = 0
                }
            }
            made->dropout_step = m.dropout_step;
            made->dropout_seed = m.dropout_seed;
        }
        d.replace(std::move(made));
    }, d.u);
}

template <template <class> class Unit, class PyClass>
void def_model_common(PyClass& cls) {
    using D = AnyDtype<Unit>;
    def_params_api<Unit>(cls);
    def_precision(cls);
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
    cls.def(
           "_lora",
           [](D& d, const std::vector<std::string>& targets, const PyInt& r, double alpha, double dropout) {
               ft::ModelConfig::Lora l{targets, index_t(int_arg(r, "r")), alpha, dropout};
               if (l.r < 1) throw ft::ValueError("lora: r must be >= 1, got " + std::to_string(l.r));
               ft::check_lora(l);
               relora(d, l);
           },
           py::arg("targets"), py::arg("r"), py::arg("alpha"), py::arg("dropout"), "ft.lora's core (lora.hpp).")
        .def(
            "merge_lora",
            [](D& d) {
                if (d.visit([](auto& m) { return m.cfg.lora.targets.empty(); }))
                    throw ft::ValueError("merge_lora: the model has no LoRA adapters (ft.lora adds them)");
                relora(d, ft::ModelConfig::Lora{});
            },
            "LoRA (docs/variants.md): W ← W + (α/r)·B·A on every adapted matrix, and the adapters leave θ (their "
            "<name>.lora_A, .lora_B entries). The outputs stay those of the adapted model, bit for bit. Views of "
            "params taken before are of the old θ.")
        .def_property_readonly(
            "lora",
            [](D& d) -> py::object {
                return d.visit([](auto& m) -> py::object {
                    const auto& l = m.cfg.lora;
                    if (l.targets.empty()) return py::none();
                    py::dict r;
                    r["targets"] = py::tuple(py::cast(l.targets));
                    r["r"] = l.r;
                    r["alpha"] = l.alpha;
                    r["dropout"] = l.dropout;
                    py::list adapted;
                    for (const auto& a : m.store.adapters()) adapted.append(a.name);
                    r["adapted"] = adapted;
                    return r;
                });
            },
            "The LoRA adapters (ft.lora): targets, r, alpha, dropout and the adapted matrices' names; None without.");
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
// Algorithm 9 or 10 on x, every line but the last, then `last(m, out)` (P = softmax(W_u X), or W_u X), shaped
// like x: model(x) and model.logits(x).
template <class D, class Last>
py::object single_input_output(D& d, const py::handle& x, const py::handle& prefix_len, Last last) {
    CallLock lock(d.mutex);
    return d.visit([&](auto& m) -> py::object {
        using T = typename std::decay_t<decltype(m.store)>::value_type;
        InBatch in = in_batch(x, "x");
        const std::vector<index_t> p = prefix_lens(prefix_len, index_t(in.lengths.size()));
        const Tokens xt{in.ids.data(), seqs_of(in), p.empty() ? nullptr : p.data()};
        return shaped_output<T>(
            m.cfg.n_vocab, in, is_2d(x), [&] { m.forward(xt); }, [&](ft::MatView<T> out) { last(m, out); });
    });
}

// Algorithm 11 on (z, x), lines 1–20, then `last(m, out)` (line 21: P, or the logits W_u X), shaped like x:
// model(z, x) and model.logits(z, x). z and x converted here; their ids, lengths and counts are the core's check.
template <class D, class Last>
py::object ed_output(D& d, const py::handle& z, const py::handle& x, Last last) {
    CallLock lock(d.mutex);
    return d.visit([&](auto& m) -> py::object {
        using T = typename std::decay_t<decltype(m.store)>::value_type;
        if (m.audio()) {  // the features the encoder's part takes (the audio encoder's spectrograms, V28)
            InAudio<T> f = in_audio<T>(z, m.encoder_input().what);
            InBatch xb = in_batch(x, "x");
            return shaped_output<T>(
                m.cfg.n_vocab, xb, is_2d(x), [&] { m.forward(f.features(), Tokens{xb.ids.data(), seqs_of(xb)}); },
                [&](ft::MatView<T> out) { last(m, out); });
        }
        InBatch zb = in_batch(z, "z");
        InBatch xb = in_batch(x, "x");
        return shaped_output<T>(
            m.cfg.n_vocab, xb, is_2d(x),
            [&] { m.forward(Tokens{zb.ids.data(), seqs_of(zb)}, Tokens{xb.ids.data(), seqs_of(xb)}); },  // lines 1–20
            [&](ft::MatView<T> out) { last(m, out); });                                              // line 21
    });
}

// The single-input surface of Algorithms 9 and 10: P = model(x), model.logits(x), attention_weights, L.
template <template <class> class Unit, class PyClass>
void def_single_input(PyClass& cls) {
    using D = AnyDtype<Unit>;
    if constexpr (!std::is_same_v<Unit<double>, ft::ETransformer<double>>)  // E: def_segment_inputs
    cls.def(
           "__call__",
           [](D& d, const py::handle& x, const py::handle& prefix_len) {
               return single_input_output(d, x, prefix_len, [](auto& m, auto P) { m.probabilities(P); });  // P = softmax(W_u X)
           },
           py::arg("x"), py::arg("prefix_len") = py::none())
        .def(
            "logits",
            [](D& d, const py::handle& x, const py::handle& prefix_len) {
                return single_input_output(d, x, prefix_len, [](auto& m, auto Z) { m.logits(Z); });  // W_u X
            },
            py::arg("x"), py::arg("prefix_len") = py::none(),
            "W_u X (before the final softmax), shaped like the call's output. prefix_len: as the call (V7).");
    cls.def(
            "attention_weights",
            [](D& d, const PyInt& layer, const PyInt& seq) {
                CallLock lock(d.mutex);
                const long long l = int_arg(layer, "layer"), s = int_arg(seq, "seq");
                return d.visit([&](auto& m) { return attention_array(m, m.self_attention, l, s); });
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
    using D = AnyDtype<Unit>;
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
                       TrainProducts products(d, m);  // bf16-mixed: θ's bf16 copy, brought up to date
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
                    const auto red = ft::parse_reduction(reduction);
                    index_t scored = 0;
                    double loss;
                    {
                        CoreCall nogil;
                        loss = std::apply([&](auto&&... args) { return m.loss(args..., &scored); }, core_args(p, q));
                    }
                    return ft::reduce_loss(loss, scored, red);
                });
            },
            py::arg(a), py::arg(b), py::arg("reduction") = "sum");
}

// BERT's segment (token-type) ids of ETransformer: None (every token in segment 0) or ids shaped like x (their
// values and whether the model has segment embeddings: the core's check, ETransformer::forward).
std::vector<index_t> segment_ids(const py::object& segments, const InBatch& x) {
    if (segments.is_none()) return {};
    InBatch s = in_batch(segments, "segments");
    if (s.lengths != x.lengths)
        throw ft::ValueError("segments must have the shape of x (one segment id per token)");
    return std::move(s.ids);
}
const index_t* ptr_or_null(const std::vector<index_t>& v) { return v.empty() ? nullptr : v.data(); }

// ETransformer's inputs with segment ids: P = model(x, segments=…), logits, hidden, and the losses.
template <class PyClass>
void def_segment_inputs(PyClass& cls) {
    using D = AnyDtype<ft::ETransformer>;
    // what the call returns: P (line 12), W_u X, or X after line 9
    enum class Output { Probabilities, Logits, Hidden };
    auto run = [](D& d, const py::handle& x, const py::object& segments, Output what) {
        CallLock lock(d.mutex);
        return d.visit([&](auto& m) -> py::object {
            using T = typename std::decay_t<decltype(m.store)>::value_type;
            InBatch in = in_batch(x, "x");
            const std::vector<index_t> seg = segment_ids(segments, in);
            const index_t rows = what == Output::Hidden ? m.cfg.d_e : m.cfg.n_vocab;
            return shaped_output<T>(
                rows, in, is_2d(x), [&] { m.forward(Tokens{in.ids.data(), seqs_of(in)}, ptr_or_null(seg)); },  // lines 1–11
                [&](ft::MatView<T> out) {
                    if (what == Output::Probabilities) m.probabilities(out);  // line 12
                    else if (what == Output::Logits) m.logits(out);
                    else {
                        ft::CMatView<T> h = m.hidden();
                        std::copy(h.data, h.data + h.size(), out.data);
                    }
                });
        });
    };
    cls.def("__call__", [run](D& d, const py::handle& x, const py::object& segments) { return run(d, x, segments, Output::Probabilities); },
            py::arg("x"), py::kw_only(), py::arg("segments") = py::none())
        .def("logits", [run](D& d, const py::handle& x, const py::object& segments) { return run(d, x, segments, Output::Logits); },
             py::arg("x"), py::kw_only(), py::arg("segments") = py::none(),
             "W_u X (+ b_u 1ᵀ with unembed_bias; before the final softmax), shaped like the call's output.")
        .def("hidden", [run](D& d, const py::handle& x, const py::object& segments) { return run(d, x, segments, Output::Hidden); },
             py::arg("x"), py::kw_only(), py::arg("segments") = py::none(),
             "X after line 9 (the last layer's output; BERT's last hidden state): (d_e, ℓ) for one sequence, "
             "(N, d_e, ℓ) for a 2-D batch, a list for a ragged list. Beyond the listing, which returns only P.");
    auto pair = [](auto& m, const py::handle& x_tilde, const py::handle& x, const py::object& segments) {
        InBatch xt = in_batch(x_tilde, "x_tilde");
        InBatch xo = in_batch(x, "x");
        if (xt.lengths != xo.lengths)
            throw ft::ValueError("x_tilde and x must have the same shape (the same sequences, the same lengths)");
        std::vector<index_t> seg = segment_ids(segments, xt);
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
                       TrainProducts products(d, m);  // bf16-mixed: θ's bf16 copy, brought up to date
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
                    const auto red = ft::parse_reduction(reduction);
                    index_t scored = 0;
                    double loss;
                    {
                        CoreCall nogil;
                        loss = m.loss(Tokens{xt.ids.data(), seqs_of(xt)}, xo.ids.data(), &scored, nullptr, ptr_or_null(seg));
                    }
                    return ft::reduce_loss(loss, scored, red);
                });
            },
            py::arg("x_tilde"), py::arg("x"), py::arg("reduction") = "sum", py::kw_only(), py::arg("segments") = py::none());
}

// Model files (io.hpp): Python's ft.save / ft.load (io.py) are these, the core's one writer and reader.
template <template <class> class Unit>
bool save_model(const py::handle& model, const std::string& path, const std::map<std::string, std::string>& extra) {
    if (!py::isinstance<AnyDtype<Unit>>(model)) return false;
    AnyDtype<Unit>& d = model.cast<AnyDtype<Unit>&>();
    CallLock lock(d.mutex);
    d.visit([&](auto& u) {
        py::gil_scoped_release nogil;  // (no FTZ/DAZ: the bytes as they are, subnormals included)
        ft::save(u, path, extra);
    });
    return true;
}
template <template <class> class Unit>
py::object load_model(const ft::SavedModel& file, const ft::ModelConfig& c, const std::string& dtype) {
    auto load = [&](auto tag) {
        using T = decltype(tag);
        std::unique_ptr<Unit<T>> made;
        {
            py::gil_scoped_release nogil;  // (no FTZ/DAZ: a float32 subnormal converts to float64 exactly)
            made.reset(new Unit<T>(ft::load<Unit<T>>(file, c)));  // the model by value, built in place
        }
        return py::cast(std::make_unique<AnyDtype<Unit>>(std::move(made)));
    };
    return dtype == "float32" ? load(float{}) : load(double{});
}

// JSON from outside as Python values, through the core's bounded parse (bounded_json.hpp): depth ≤ 64 here.
py::object py_of_json(const nlohmann::ordered_json& j) {
    switch (j.type()) {
        case nlohmann::ordered_json::value_t::null: return py::none();
        case nlohmann::ordered_json::value_t::boolean: return py::bool_(j.get<bool>());
        case nlohmann::ordered_json::value_t::number_integer: return py::int_(j.get<std::int64_t>());
        case nlohmann::ordered_json::value_t::number_unsigned: return py::int_(j.get<std::uint64_t>());
        case nlohmann::ordered_json::value_t::number_float: return py::float_(j.get<double>());
        case nlohmann::ordered_json::value_t::string: return py::str(j.get_ref<const std::string&>());
        case nlohmann::ordered_json::value_t::array: {
            py::list r;
            for (const auto& v : j) r.append(py_of_json(v));
            return std::move(r);
        }
        case nlohmann::ordered_json::value_t::object: {
            py::dict r;
            for (const auto& [k, v] : j.items()) r[py::str(k)] = py_of_json(v);
            return std::move(r);
        }
        default: throw ft::ValueError("JSON: a value of no JSON type");
    }
}

}  // namespace

void def_bigbird_layouts(py::class_<AnyDtype<ft::ETransformer>, HasParams>& c);  // register_attention.cpp

void register_transformers(py::module_& m) {
    m.def(
        "_option_infos",
        [](const std::string& arch) {
            py::list out;
            for (const ModelConfig::OptionInfo& o : ModelConfig::option_infos(ft::arch_from_name(arch)))
                out.append(py::make_tuple(o.name, o.kind, o.default_json, o.archs));
            return out;
        },
        py::arg("arch"),
        "The options the architecture takes, in the schema's order: (name, kind, default as JSON text, the "
        "architectures that take it). ValueError for another architecture name.");
    m.def(
        "_position_table",
        [](const std::string& name) {
            const ft::Positional t = ft::position_table(name);
            return std::string(t == ft::Positional::Learned ? "learned" : t == ft::Positional::Sinusoidal ? "sinusoidal" : "none");
        },
        py::arg("positional"),
        "The table W_p of Algorithm 2 a config's positional names, as its registry line declares it: 'learned', "
        "'sinusoidal', or 'none' (the position is in attention: RoPE, ALiBi, T5's bias). ValueError for another name.");
    m.def("_save_model", [](const py::handle& model, const std::string& path, const std::map<std::string, std::string>& extra) {
        if (!save_model<ft::DTransformer>(model, path, extra) && !save_model<ft::ETransformer>(model, path, extra) &&
            !save_model<ft::EDTransformer>(model, path, extra))
            throw ft::TypeError("ft.save saves a DTransformer, ETransformer or EDTransformer, got " +
                                std::string(py::str(py::type::of(model).attr("__name__"))));
    }, py::arg("model"), py::arg("path"), py::arg("metadata"), "ft.save (io.py): the core's writer of model files.");
    m.def("_load_model", [](const std::string& path, const py::object& dtype) {
        std::optional<ft::SavedModel> file;
        ft::ModelConfig c;
        {
            py::gil_scoped_release nogil;
            file.emplace(ft::SavedModel::read(path));
            c = file->model_config();
        }
        const std::string dt = dtype.is_none() ? file->dtype() : (parse_dtype(dtype) == DType::F32 ? "float32" : "float64");
        py::object model = c.arch == ft::Arch::D   ? load_model<ft::DTransformer>(*file, c, dt)
                           : c.arch == ft::Arch::E ? load_model<ft::ETransformer>(*file, c, dt)
                                                   : load_model<ft::EDTransformer>(*file, c, dt);
        // an option of a part the file's config does not choose loads at its default: said, never silently
        for (const std::string& note : file->unchosen_options())
            if (PyErr_WarnEx(PyExc_UserWarning, note.c_str(), 2) < 0) throw py::error_already_set();
        return model;
    }, py::arg("path"), py::arg("dtype") = py::none(), "ft.load (io.py): the core's reader of model files.");
    m.def("_read_metadata", [](const std::string& path) {
        std::map<std::string, std::string> meta;
        {
            py::gil_scoped_release nogil;
            meta = ft::SavedModel::read_header(path).metadata;
        }
        return meta;
    }, py::arg("path"), "io.read_metadata: the metadata of a safetensors file (its header only).");
    m.def("_parse_json", [](const std::string& text, const std::string& what) {
        return py_of_json(ft::parse_bounded_json(text, what));
    }, py::arg("text"), py::arg("what"), "JSON text from outside as Python values (the core's bounded parse).");

    // ------------------------------------------------------------------------------------------------
    using DD = AnyDtype<ft::DTransformer>;
    py::class_<DD, HasParams> dcls(m, "DTransformer", R"doc(Algorithm 10: P ← DTransformer(x | θ) — GPT-2, a decoder-only transformer.

Pre-LN layers with causal (unidirectional) multi-head self-attention and a GELU MLP, a final layer_norm,
and P = softmax(W_u X). Hyperparameters: n_vocab (N_V), l_max, L, H, d_e, d_mlp; keyword options
d_attn = d_mid = d_e // H by default, norm="layer" | "rms" (Gopher's RMSnorm) | "scale" (ScaleNorm, V12: one
scalar g per norm), fixnorm=True (V13 FixNorm: unit-length token embeddings; E and ED too), positional="learned" |
"sinusoidal" (base replaces ℓ_max in the paper's formula), tied=False (W_u = W_eᵀ when True),
gelu="exact" | "tanh" (GPT-2's approximation), eps (inside layer_norm's square root), dtype, seed,
init_std (GPT-2's init: N(0, init_std²), residual projections / √(2L), biases 0, γ = 1, β = 0).
Variants (docs/variants.md): positional="rope" (rope_theta=10000.0) | "alibi" (no W_p), H_kv key/value
heads (grouped-query attention; None: H), mlp="gelu" | "swiglu", bias=False (no biases in attention and
MLP), sliding_window=w (V8: each query sees the last w keys, Mistral; decoding keeps a rolling cache of w
columns), kv_lora_rank=d_c (V10: multi-head latent attention, DeepSeek-V2/V3; with qk_rope_head_dim=d_R,
q_lora_rank=d_c′ or None, positional="rope", bias=False; d_attn = qk_nope_head_dim + d_R, d_mid = v_head_dim;
decoding caches the latent, d_c + d_R numbers per token and layer). With norm="rms" these make a LLaMA-style
(Mistral-, DeepSeek-style) decoder; the defaults are Algorithm 10.
Dropout (docs/regularisation.md; beyond the listing): dropout=p drops after the embedding sum, on the
attention weights and on each sublayer's output before the residual add (embed_dropout, attn_dropout,
resid_dropout: per place, None = dropout). Only loss_and_grad (and the trainers) drop; model(x), loss,
inference never do. Masks: keyed by (dropout_seed, dropout_step); dropout_masks() shows the last ones.

Call: P = model(x), x a 1-D sequence of token ids (ℓ ≤ l_max; any ℓ with positional="rope"|"alibi",
which have no table of positions) -> P (N_V, ℓ); column t is the distribution of x[t+1] given x[:t+1].
A 2-D (N, ℓ) array gives (N, N_V, ℓ); a list of sequences a list.
loss_and_grad(x) -> (loss, grads): Algorithm 13 line 5, −Σ_{t<ℓ−1} log P[x[t+1], t], summed over the
batch, with the gradient of every parameter (copies; model.grads holds the same, zero-copy).
Prefix LM (docs/variants.md V7): mask="prefix" makes line 6's Mask [[t_z < p or t_z ≤ t_x]]; the calls
(model(x), logits, loss, loss_and_grad) take prefix_len=p (an int, or one per sequence of a batch; None:
p = 0, the causal mask), and the loss counts only the predictions of x[t+1] with t+1 ≥ p.
Multi-token prediction (docs/variants.md V16, DeepSeek-V3): mtp_depth=D adds D sequential modules (parameters
mtp.{k-1}.*) whose module k predicts x[t+k+1]; loss and loss_and_grad then return L_main + (mtp_weight/D) Σ_k L_k
(every sequence needs ℓ ≥ D + 2; loss_terms() gives [L_main, L_1, …, L_D]); model(x) and decoding use the trunk
only; SpeculativeInference(…)(x, model) drafts with the modules (self-speculation).)doc");
    dcls.def(py::init([](const py::args& args, const py::kwargs& kwargs) { return make_model<ft::DTransformer>(ft::Arch::D, args, kwargs); }),
             constructor_doc(ft::Arch::D))
        .def("config_json", [](const DD& d) { return config_text(d); },
             "model.config as the core writes it (ModelConfig::to_json, with the dtype): what ft.save stores.");
    def_model_common<ft::DTransformer>(dcls);
    def_single_input<ft::DTransformer>(dcls);
    dcls.def(
            "loss_terms",
            [](DD& d) {
                CallLock lock(d.mutex);
                return d.visit([&](auto& m) { return m.loss_terms(); });
            },
            "The terms of the last loss or loss_and_grad call: [L_main, L_1, …, L_D] (V16 lines 6 and 8, sums over the "
            "batch; [L_main] without mtp_depth; [] before any call).")
        .def(
            "loss_and_grad",
            [](py::object self, const py::handle& x, bool copy, const py::handle& prefix_len) {
                DD& d = self.cast<DD&>();
                CallLock lock(d.mutex);
                return d.visit([&](auto& m) {
                    InBatch in = in_batch(x, "x");
                    const std::vector<index_t> p = prefix_lens(prefix_len, index_t(in.lengths.size()));
                    double loss;
                    {
                        CoreCall nogil;
                        TrainProducts products(d, m);  // bf16-mixed: θ's bf16 copy, brought up to date
                        loss = m.loss_and_grad(Tokens{in.ids.data(), seqs_of(in), p.empty() ? nullptr : p.data()});
                    }
                    return py::make_tuple(loss, grads_out(self, m.store, copy));
                });
            },
            py::arg("x"), py::arg("copy") = true, py::arg("prefix_len") = py::none(),
            "Algorithm 13 line 5 and its gradient: (loss, grads). x: one sequence, a 2-D (N, ℓ) batch or a list "
            "of sequences of any lengths (the loss is the sum over sequences). grads: a dict of arrays that later "
            "calls do not change (one copy of the flat gradient); copy=False returns model.grads itself "
            "(zero-copy views, overwritten by the next call, as PyTorch's .grad). prefix_len (mask='prefix', V7): "
            "an int or one per sequence; only the predictions of the tokens x[t+1] with t+1 >= p count "
            "(docs/variants.md V7); None: 0, the causal model.")
        .def(
            "loss",
            [](DD& d, const py::handle& x, const std::string& reduction, const py::handle& prefix_len) {
                CallLock lock(d.mutex);
                return d.visit([&](auto& m) {
                    InBatch in = in_batch(x, "x");
                    const std::vector<index_t> p = prefix_lens(prefix_len, index_t(in.lengths.size()));
                    index_t scored = 0;
                    double loss;
                    const auto red = ft::parse_reduction(reduction);
                    {
                        CoreCall nogil;
                        loss = m.loss(Tokens{in.ids.data(), seqs_of(in), p.empty() ? nullptr : p.data()}, &scored);
                    }
                    return ft::reduce_loss(loss, scored, red);
                });
            },
            py::arg("x"), py::arg("reduction") = "sum", py::arg("prefix_len") = py::none(),
            "The loss without gradients; reduction='mean' divides by the number of predicted tokens. prefix_len: as "
            "loss_and_grad (V7).")
        .def_property_readonly("config", &config_of<DD>,
                               "The hyperparameters as a dict (the core's ModelConfig.to_json with the dtype): "
                               "ft.build_model(config) makes this model's architecture again.")
        .def("__repr__", &repr_of<DD>);

    // ------------------------------------------------------------------------------------------------
    using DE = AnyDtype<ft::ETransformer>;
    py::class_<DE, HasParams> ecls(m, "ETransformer", R"doc(Algorithm 9: P ← ETransformer(x | θ) — BERT, an encoder-only transformer.

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
    ecls.def(py::init([](const py::args& args, const py::kwargs& kwargs) { return make_model<ft::ETransformer>(ft::Arch::E, args, kwargs); }),
             constructor_doc(ft::Arch::E))
        .def("config_json", [](const DE& d) { return config_text(d); },
             "model.config as the core writes it (ModelConfig::to_json, with the dtype): what ft.save stores.");
    def_model_common<ft::ETransformer>(ecls);
    def_single_input<ft::ETransformer>(ecls);
    def_segment_inputs(ecls);  // __call__, logits, hidden, loss_and_grad, loss with BERT's segment ids
    def_bigbird_layouts(ecls);  // V17: set_bigbird_layouts, bigbird_layouts (register_attention.cpp)
    ecls.def_property_readonly("d_f", [](DE& d) { return d.visit([](auto& m) { return m.cfg.d_f; }); })
        .def_property_readonly("config", &config_of<DE>,
                               "The hyperparameters as a dict (the core's ModelConfig.to_json with the dtype): "
                               "ft.build_model(config) makes this model's architecture again.")
        .def("__repr__", &repr_of<DE>);

    // ------------------------------------------------------------------------------------------------
    using DED = AnyDtype<ft::EDTransformer>;
    py::class_<DED, HasParams> edcls(m, "EDTransformer", R"doc(Algorithm 8: P ← EDTransformer(z, x | θ) — the original encoder-decoder transformer.

Encoder: post-LN layers of bidirectional self-attention and a ReLU MLP over the context z. Decoder:
post-LN layers of causal self-attention, cross-attention to the encoded Z, and a ReLU MLP; then
P = softmax(W_u X). Hyperparameters: n_vocab, l_max, L_enc, L_dec, H, d_e, d_mlp; options d_attn, d_mid,
positional, base, tied, eps, dtype, seed, init_std, H_kv, bias, fixnorm, dropout (as DTransformer: embeddings of z and x,
attention weights of all three attentions, every sublayer's output).
Call: P = model(z, x) -> (N_V, ℓ_x). loss_and_grad(z, x): Algorithm 11 line 5, −Σ_{t<ℓ_x−1} log P[x[t+1], t].)doc");
    edcls.def(py::init([](const py::args& args, const py::kwargs& kwargs) { return make_model<ft::EDTransformer>(ft::Arch::ED, args, kwargs); }),
             constructor_doc(ft::Arch::ED))
        .def("config_json", [](const DED& d) { return config_text(d); },
             "model.config as the core writes it (ModelConfig::to_json, with the dtype): what ft.save stores.");
    def_model_common<ft::EDTransformer>(edcls);
    // z and x converted; their ids, lengths and counts are the core's check (EDTransformer::forward)
    auto ed_pair = [](auto& m, const py::handle& z, const py::handle& x) {
        (void)m;
        InBatch zb = in_batch(z, "z");
        InBatch xb = in_batch(x, "x");
        return std::make_pair(std::move(zb), std::move(xb));
    };
    edcls.def(
             "__call__",
             [](DED& d, const py::handle& z, const py::handle& x) {
                 return ed_output(d, z, x, [](auto& m, auto P) { m.probabilities(P); });  // P = softmax(W_u X)
             },
             py::arg("z"), py::arg("x"))
        .def(
            "logits",
            [](DED& d, const py::handle& z, const py::handle& x) {
                return ed_output(d, z, x, [](auto& m, auto Z) { m.logits(Z); });  // W_u X
            },
            py::arg("z"), py::arg("x"));
    // z: token ids, or (the audio encoder, V28) a floating-point array of spectrograms — dispatched on its dtype
    edcls.def(
             "loss_and_grad",
             [](py::object self, const py::handle& z, const py::handle& x, bool copy, bool features_grad) {
                 DED& d = self.cast<DED&>();
                 CallLock lock(d.mutex);
                 return d.visit([&](auto& m) -> py::tuple {
                     using T = typename std::decay_t<decltype(m.store)>::value_type;
                     double loss;
                     if (m.audio()) {
                         InAudio<T> f = in_audio<T>(z, m.encoder_input().what);
                         InBatch xb = in_batch(x, "x");
                         ft::Matrix<T> dF;
                         {
                             CoreCall nogil;
                             TrainProducts products(d, m);  // bf16-mixed: θ's bf16 copy, brought up to date
                             loss = m.loss_and_grad(f.features(), Tokens{xb.ids.data(), seqs_of(xb)},
                                                    features_grad ? &dF : nullptr);
                         }
                         if (!features_grad) return py::make_tuple(loss, grads_out(self, m.store, copy));
                         // ∂loss/∂features in the features' layout: (B, rows, T), or (rows, T) for one
                         const index_t rows = index_t(f.F.shape(0)), B = f.s.count(), Tn = f.s.len(0);
                         py::array_t<T> g({py::ssize_t(B), py::ssize_t(rows), py::ssize_t(Tn)});
                         T* p = g.mutable_data();
                         const ft::CMatView<T> v = ft::view(dF);
                         for (index_t b = 0; b < B; ++b)
                             for (index_t r = 0; r < rows; ++r)
                                 for (index_t t = 0; t < Tn; ++t) p[(b * rows + r) * Tn + t] = v(r, b * Tn + t);
                         py::object gf = f.single ? py::object(g[py::int_(0)]) : py::object(g);
                         return py::make_tuple(loss, grads_out(self, m.store, copy), gf);
                     }
                     if (features_grad)
                         throw ft::TypeError("features_grad=True: this EDTransformer's encoder takes token ids, which have "
                                             "no gradient (∂loss/∂features needs an encoder that takes features: the "
                                             "audio encoder)");
                     InBatch zb = in_batch(z, "z");
                     InBatch xb = in_batch(x, "x");
                     {
                         CoreCall nogil;
                         TrainProducts products(d, m);  // bf16-mixed: θ's bf16 copy, brought up to date
                         loss = m.loss_and_grad(Tokens{zb.ids.data(), seqs_of(zb)}, Tokens{xb.ids.data(), seqs_of(xb)});
                     }
                     return py::make_tuple(loss, grads_out(self, m.store, copy));
                 });
             },
             py::arg("z"), py::arg("x"), py::arg("copy") = true, py::kw_only(), py::arg("features_grad") = false,
             "Algorithm 11 line 5 and its gradient: (loss, grads); copy as DTransformer.loss_and_grad. z: token ids, or "
             "the features the encoder takes (the audio encoder: log-mel spectrograms (rows, T) or (B, rows, T)); for "
             "such an encoder, features_grad=True returns (loss, grads, dF): also ∂loss/∂features in their shape.")
        .def(
            "loss",
            [](DED& d, const py::handle& z, const py::handle& x, const std::string& reduction) {
                CallLock lock(d.mutex);
                return d.visit([&](auto& m) {
                    using T = typename std::decay_t<decltype(m.store)>::value_type;
                    const auto red = ft::parse_reduction(reduction);
                    index_t scored = 0;
                    double loss;
                    if (m.audio()) {
                        InAudio<T> f = in_audio<T>(z, m.encoder_input().what);
                        InBatch xb = in_batch(x, "x");
                        CoreCall nogil;
                        loss = m.loss(f.features(), Tokens{xb.ids.data(), seqs_of(xb)}, &scored);
                    } else {
                        InBatch zb = in_batch(z, "z");
                        InBatch xb = in_batch(x, "x");
                        CoreCall nogil;
                        loss = m.loss(Tokens{zb.ids.data(), seqs_of(zb)}, Tokens{xb.ids.data(), seqs_of(xb)}, &scored);
                    }
                    return ft::reduce_loss(loss, scored, red);
                });
            },
            py::arg("z"), py::arg("x"), py::arg("reduction") = "sum");
    edcls.def(
            "attention_weights",
            [](DED& d, const std::string& kind, const PyInt& layer_arg, const PyInt& seq_arg) {
                const long long layer = int_arg(layer_arg, "layer"), seq = int_arg(seq_arg, "seq");
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
        .def_property_readonly(
            "encoder_input",
            [](DED& d) {
                return d.visit([](auto& m) {
                    const ft::StackInput in = m.encoder_input();
                    py::dict r;
                    r["kind"] = in.features() ? "features" : "tokens";
                    r["rows"] = in.features() ? py::object(py::int_(in.rows)) : py::object(py::none());
                    r["what"] = in.what;
                    return r;
                });
            },
            "What the encoder's embedding part takes, as the part reports it: {'kind': 'tokens' (token ids) or "
            "'features' (floating-point matrices, e.g. the audio encoder's log-mel spectrograms), 'rows': their row "
            "count (None for tokens), 'what': its description}.")
        .def_property_readonly("L_enc", [](DED& d) { return d.visit([](auto& m) { return m.cfg.L_enc; }); })
        .def_property_readonly("L_dec", [](DED& d) { return d.visit([](auto& m) { return m.cfg.L_dec; }); })
        .def_property_readonly("config", &config_of<DED>,
                               "The hyperparameters as a dict (the core's ModelConfig.to_json with the dtype): "
                               "ft.build_model(config) makes this model's architecture again.")
        .def("__repr__", &repr_of<DED>);
}


}  // namespace ftpy
