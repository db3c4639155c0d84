// Listings V28 and V29: Whisper as a Python object (whisper.hpp; docs/variants.md V28, V29, docs/api.md).
#include <cmath>

#include "bind.hpp"
#include "formal_transformers/functions.hpp"
#include "formal_transformers/whisper.hpp"

namespace ftpy {

namespace {
template <class T>
using WhisperModel = ft::Whisper<T>;
using DW = AnyDtype<WhisperModel>;

// features -> a C-contiguous (B, n_mels, T) array of the model's dtype, checked before anything runs: floats
// (TypeError), 2-D (n_mels, T) (one spectrogram, B = 1) or 3-D (B, n_mels, T), n_mels the model's, 1 <= T and
// ⌈T/2⌉ <= n_audio_ctx (ValueError naming it), finite.
template <class T>
struct InFeatures {
    py::array_t<T, py::array::c_style | py::array::forcecast> a;
    index_t B = 0, T_frames = 0;
    bool single = false;
};
template <class T>
InFeatures<T> in_features(const ft::WhisperConfig& c, const py::handle& features) {
    py::array a = py::array::ensure(features);
    if (!a) throw ft::TypeError("features must be a numpy array (n_mels, T) or (B, n_mels, T) of floats");
    if (a.dtype().kind() != 'f')
        throw ft::TypeError("features must be a floating-point array, got dtype " + std::string(py::str(a.dtype())));
    if (a.ndim() != 2 && a.ndim() != 3)
        throw ft::ValueError("features must be 2-D (n_mels, T) or 3-D (B, n_mels, T), got " + std::to_string(a.ndim()) + "-D");
    InFeatures<T> r;
    r.single = a.ndim() == 2;
    const py::ssize_t o = r.single ? 0 : 1;
    r.B = r.single ? 1 : index_t(a.shape(0));
    if (r.B < 1) throw ft::ValueError("features is an empty batch (B = 0)");
    if (a.shape(o) != c.n_mels)
        throw ft::ValueError("features must have n_mels = " + std::to_string(c.n_mels) + " rows (the model's), got " +
                             std::to_string(a.shape(o)));
    r.T_frames = index_t(a.shape(o + 1));
    if (r.T_frames < 1) throw ft::ValueError("features has no frames (T = 0)");
    if ((r.T_frames + 1) / 2 > c.n_audio_ctx)
        throw ft::ValueError("features has T = " + std::to_string(r.T_frames) + " frames: the encoder's ⌈T/2⌉ = " +
                             std::to_string((r.T_frames + 1) / 2) + " positions exceed n_audio_ctx = " +
                             std::to_string(c.n_audio_ctx) + " (max_source_positions)");
    r.a = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(a);
    const T* p = r.a.data();
    for (py::ssize_t i = 0; i < r.a.size(); ++i)
        if (!std::isfinite(p[i])) throw ft::ValueError("features contain NaN or infinite values");
    return r;
}

// x: one sequence (with single features) or B sequences; each of length 1..n_text_ctx with ids in [0, n_vocab)
struct InTokens {
    std::vector<index_t> ids;
    ft::Seqs s;
};
InTokens in_tokens(const ft::WhisperConfig& c, const py::handle& x, index_t B, bool single) {
    InBatch b = in_batch(x, "x");
    if (single && !b.was_single) throw ft::ValueError("x must be one token sequence for one spectrogram (n_mels, T)");
    if (index_t(b.lengths.size()) != B)
        throw ft::ValueError("x must hold one token sequence per spectrogram: " + std::to_string(B) + " spectrograms, " +
                             std::to_string(b.lengths.size()) + " sequences");
    for (std::size_t i = 0; i < b.lengths.size(); ++i)
        if (b.lengths[i] < 1 || b.lengths[i] > c.n_text_ctx)
            throw ft::ValueError("x[" + std::to_string(i) + "] has length " + std::to_string(b.lengths[i]) +
                                 ": the decoder takes 1 to n_text_ctx = " + std::to_string(c.n_text_ctx) +
                                 " tokens (max_target_positions)");
    for (std::size_t i = 0; i < b.ids.size(); ++i)
        if (b.ids[i] < 0 || b.ids[i] >= c.n_vocab)
            throw ft::IndexError("token id " + std::to_string(b.ids[i]) + " in x is out of range [0, " +
                                 std::to_string(c.n_vocab) + ")");
    return {std::move(b.ids), ft::Seqs::from_lengths(b.lengths)};
}

// model(features, x) and model.logits: lines 1–7 on the checked input; P (or W_eᵀ X) per sequence (N_V, ℓ_x)
template <class T>
py::object output(ft::Whisper<T>& w, const py::handle& features, const py::handle& x, bool probabilities) {
    auto f = in_features<T>(w.wc, features);
    InTokens t = in_tokens(w.wc, x, f.B, f.single);
    const index_t V = w.wc.n_vocab, n = t.s.total();
    auto all = run_then_output<T>(
        V, n, [&] { w.forward(f.a.data(), f.B, f.T_frames, t.ids.data(), t.s); },
        [&](ft::MatView<T> out) {
            const ft::CMatView<T> Z = w.logits();
            std::copy(Z.data, Z.data + Z.rows * Z.cols, out.data);
            if (probabilities) ft::softmax_columns<T>(out);
        });
    if (f.single) return all;
    py::list r;
    for (index_t b = 0; b < t.s.count(); ++b)
        r.append(all[py::make_tuple(py::slice(py::none(), py::none(), py::none()),
                                    py::slice(t.s.begin(b), t.s.begin(b) + t.s.len(b), 1))].attr("copy")());
    return r;
}

ft::AttentionKind attention_kind(const std::string& k) {
    if (k == "enc") return ft::AttentionKind::Encoder;
    if (k == "dec") return ft::AttentionKind::Decoder;
    if (k == "cross") return ft::AttentionKind::Cross;
    throw ft::ValueError("kind must be 'enc', 'dec' or 'cross', got '" + k + "'");
}
}  // namespace

void register_whisper(py::module_& m) {
    py::class_<DW, HasParams> cls(m, "Whisper", R"doc(Listings V28 and V29: P ← Whisper(F, x | θ) — the encoder-decoder on a
log-mel spectrogram (Radford et al. 2022).

V28, the audio front-end: two 1-D convolutions with GELU over the spectrogram F (n_mels, T) — kernel 3, padding 1,
the second with stride 2 — and Whisper's fixed sinusoids added: ⌈T/2⌉ columns of width d_e. V29: L_enc pre-LN
encoder layers (Algorithm 10's layer, Mask ≡ 1, GELU), a final layer_norm; the decoder's learned positions W_p,
L_dec pre-LN layers with cross-attention (V18a, GELU), a final layer_norm, and the tied unembedding
P = softmax(W_eᵀ X). Every attention has biases; Whisper's key projection has none (b_k = 0, whose gradient is
exactly 0). Hugging Face's WhisperForConditionalGeneration is this model (ft.from_hf).
Sizes: n_mels, n_audio_ctx (max_source_positions: ⌈T/2⌉ ≤ it), n_vocab, n_text_ctx (max_target_positions), L_enc,
L_dec, H, d_e, d_mlp; options eps=1e-5, seed, init_std=0.02, start_id and eos_id (the tokens greedy decoding,
ft.speech.transcribe, starts with and stops at: HF's decoder_start_token_id and eos_token_id), dtype.
Call: P = model(features, x): features (n_mels, T) and one token sequence -> (n_vocab, ℓ_x); features
(B, n_mels, T) and B sequences -> a list of B such arrays. model.logits(...): W_eᵀ X.
loss_and_grad(features, x): Algorithm 11's −Σ_t log P[x[t+1], t] summed over the batch, and every gradient.)doc");
    cls.def(py::init([](const PyInt& n_mels, const PyInt& n_audio_ctx, const PyInt& n_vocab, const PyInt& n_text_ctx,
                        const PyInt& L_enc, const PyInt& L_dec, const PyInt& H, const PyInt& d_e, const PyInt& d_mlp,
                        double eps, const py::object& seed, double init_std, const py::object& start_id,
                        const py::object& eos_id, const py::object& dtype) {
                ft::WhisperConfig c;
                c.n_mels = index_t(int_arg(n_mels, "n_mels")), c.n_audio_ctx = index_t(int_arg(n_audio_ctx, "n_audio_ctx"));
                c.n_vocab = index_t(int_arg(n_vocab, "n_vocab")), c.n_text_ctx = index_t(int_arg(n_text_ctx, "n_text_ctx"));
                c.L_enc = index_t(int_arg(L_enc, "L_enc")), c.L_dec = index_t(int_arg(L_dec, "L_dec"));
                c.H = index_t(int_arg(H, "H")), c.d_e = index_t(int_arg(d_e, "d_e")), c.d_mlp = index_t(int_arg(d_mlp, "d_mlp"));
                c.eps = eps, c.seed = seed_arg(seed), c.init_std = init_std;
                c.start_id = start_id.is_none() ? -1 : index_t(int_arg(start_id, "start_id", 0));
                c.eos_id = eos_id.is_none() ? -1 : index_t(int_arg(eos_id, "eos_id", 0));
                ft::check(c);
                return std::make_unique<DW>(parse_dtype(dtype), c);
            }),
            py::arg("n_mels"), py::arg("n_audio_ctx"), py::arg("n_vocab"), py::arg("n_text_ctx"), py::arg("L_enc"),
            py::arg("L_dec"), py::arg("H"), py::arg("d_e"), py::arg("d_mlp"), py::kw_only(), py::arg("eps") = 1e-5,
            py::arg("seed") = 0, py::arg("init_std") = 0.02, py::arg("start_id") = py::none(), py::arg("eos_id") = py::none(),
            py::arg("dtype") = "float32")
        .def("__call__",
             [](DW& d, const py::handle& features, const py::handle& x) {
                 CallLock lock(d.mutex);
                 return d.visit([&](auto& w) { return output(w, features, x, true); });
             },
             py::arg("features"), py::arg("x"), "P = softmax(W_eᵀ X) (n_vocab, ℓ_x) per sequence.")
        .def("logits",
             [](DW& d, const py::handle& features, const py::handle& x) {
                 CallLock lock(d.mutex);
                 return d.visit([&](auto& w) { return output(w, features, x, false); });
             },
             py::arg("features"), py::arg("x"), "W_eᵀ X (n_vocab, ℓ_x) per sequence, before the softmax.")
        .def("loss_and_grad",
             [](DW& d, const py::handle& features, const py::handle& x, bool features_grad) {
                 CallLock lock(d.mutex);
                 return d.visit([&](auto& w) -> py::object {
                     using T = typename std::decay_t<decltype(w.store)>::value_type;
                     auto f = in_features<T>(w.wc, features);
                     InTokens t = in_tokens(w.wc, x, f.B, f.single);
                     double loss;
                     ft::Matrix<T> dF;
                     {
                         CoreCall nogil;
                         loss = w.loss(f.a.data(), f.B, f.T_frames, t.ids.data(), t.s, true, nullptr, nullptr,
                                       features_grad ? &dF : nullptr);
                     }
                     if (!features_grad) return py::make_tuple(loss, grads_copy(w.store));
                     // dF in the features' layout: (B, n_mels, T) (or (n_mels, T))
                     const index_t n_mels = w.wc.n_mels, Tf = f.T_frames;
                     py::array_t<T> g({py::ssize_t(f.B), py::ssize_t(n_mels), py::ssize_t(Tf)});
                     T* p = g.mutable_data();
                     const ft::CMatView<T> v = ft::view(dF);
                     for (index_t b = 0; b < f.B; ++b)
                         for (index_t c = 0; c < n_mels; ++c)
                             for (index_t s = 0; s < Tf; ++s) p[(b * n_mels + c) * Tf + s] = v(c, b * Tf + s);
                     py::object gf = f.single ? py::object(g[py::int_(0)]) : py::object(g);
                     return py::make_tuple(loss, grads_copy(w.store), gf);
                 });
             },
             py::arg("features"), py::arg("x"), py::kw_only(), py::arg("features_grad") = false,
             "(loss, grads): Algorithm 11's loss summed over the batch and every parameter's gradient; with "
             "features_grad=True also ∂loss/∂features in the features' shape.")
        .def("loss",
             [](DW& d, const py::handle& features, const py::handle& x, const std::string& reduction) {
                 CallLock lock(d.mutex);
                 if (reduction != "sum" && reduction != "mean")
                     throw ft::ValueError("reduction must be 'sum' or 'mean', got '" + reduction + "'");
                 return d.visit([&](auto& w) {
                     using T = typename std::decay_t<decltype(w.store)>::value_type;
                     auto f = in_features<T>(w.wc, features);
                     InTokens t = in_tokens(w.wc, x, f.B, f.single);
                     double loss;
                     index_t ns = 0;
                     {
                         CoreCall nogil;
                         loss = w.loss(f.a.data(), f.B, f.T_frames, t.ids.data(), t.s, false, &ns);
                     }
                     return reduction == "mean" ? (ns ? loss / double(ns) : 0.0) : loss;
                 });
             },
             py::arg("features"), py::arg("x"), py::arg("reduction") = "sum",
             "The loss of loss_and_grad without gradients (reduction='mean': per predicted token).")
        .def("attention_weights",
             [](DW& d, const std::string& kind, const PyInt& layer, const PyInt& seq, const PyInt& head) {
                 CallLock lock(d.mutex);
                 const ft::AttentionKind k = attention_kind(kind);
                 return d.visit([&](auto& w) -> py::object {
                     using T = typename std::decay_t<decltype(w.store)>::value_type;
                     if (!w.has_forward())
                         throw ft::ValueError("attention_weights() called before any forward call");
                     const index_t L = k == ft::AttentionKind::Encoder ? w.wc.L_enc : w.wc.L_dec;
                     const long long l = int_arg(layer, "layer"), b = int_arg(seq, "seq"), h = int_arg(head, "head");
                     if (l < 0 || l >= L) throw ft::IndexError("layer " + std::to_string(l) + " is out of range [0, " + std::to_string(L) + ")");
                     if (b < 0 || b >= w.last_x().count())
                         throw ft::IndexError("seq " + std::to_string(b) + " is out of range [0, " + std::to_string(w.last_x().count()) + ")");
                     if (h < 0 || h >= w.wc.H) throw ft::IndexError("head " + std::to_string(h) + " is out of range [0, " + std::to_string(w.wc.H) + ")");
                     ft::CMatView<T> A = w.attention_weights(k, index_t(l), index_t(b), index_t(h));
                     auto out = out_matrix<T>(A.rows, A.cols);
                     for (index_t j = 0; j < A.cols; ++j)
                         for (index_t i = 0; i < A.rows; ++i) out.mutable_data()[i + j * A.rows] = A(i, j);
                     return out;
                 });
             },
             py::arg("kind"), py::arg("layer"), py::arg("seq") = 0, py::arg("head") = 0,
             "softmax(S/√d_attn) of the last forward: kind 'enc' (ℓ_z, ℓ_z), 'dec' (ℓ_x, ℓ_x) or 'cross' (ℓ_z keys, "
             "ℓ_x queries), for one layer, sequence and head.")
        .def_property(
            "encoder_positions",
            [](DW& d) {
                return d.visit([&](auto& w) -> py::object {
                    using T = typename std::decay_t<decltype(w.store)>::value_type;
                    const ft::CMatView<T> v = ft::view(w.W_sin);
                    auto out = out_matrix<T>(v.rows, v.cols);
                    std::copy(v.data, v.data + v.size(), out.mutable_data());
                    return out;
                });
            },
            [](DW& d, const py::handle& value) {
                CallLock lock(d.mutex);
                d.visit([&](auto& w) {
                    using T = typename std::decay_t<decltype(w.store)>::value_type;
                    InMatrix<T> m = in_matrix<T>(value, "encoder_positions", w.wc.d_e, false, "d_e");
                    if (m.m.cols != w.wc.n_audio_ctx)
                        throw ft::ValueError("encoder_positions must be (d_e, n_audio_ctx) = (" + std::to_string(w.wc.d_e) +
                                             ", " + std::to_string(w.wc.n_audio_ctx) + ")");
                    ft::MatView<T> v = ft::view(w.W_sin);
                    for (index_t j = 0; j < v.cols; ++j)
                        for (index_t i = 0; i < v.rows; ++i) {
                            const T e = m.m(i, j);
                            if (!std::isfinite(e)) throw ft::ValueError("encoder_positions contain NaN or infinite values");
                            v(i, j) = e;
                        }
                });
            },
            "W_sin (d_e, n_audio_ctx): V28 line 5's fixed table (Whisper's sinusoids; not a parameter, no gradient). "
            "Settable: a checkpoint's stored table (ft.from_hf copies it).")
        .def_property_readonly("config", [](DW& d) {
            return d.visit([&](auto& w) {
                const ft::WhisperConfig& c = w.wc;
                py::dict r;
                r["n_mels"] = c.n_mels, r["n_audio_ctx"] = c.n_audio_ctx, r["n_vocab"] = c.n_vocab;
                r["n_text_ctx"] = c.n_text_ctx, r["L_enc"] = c.L_enc, r["L_dec"] = c.L_dec, r["H"] = c.H;
                r["d_e"] = c.d_e, r["d_mlp"] = c.d_mlp, r["eps"] = c.eps, r["seed"] = c.seed, r["init_std"] = c.init_std;
                r["start_id"] = c.start_id < 0 ? py::object(py::none()) : py::object(py::int_(c.start_id));
                r["eos_id"] = c.eos_id < 0 ? py::object(py::none()) : py::object(py::int_(c.eos_id));
                r["dtype"] = d.dtype();
                return r;
            });
        })
        .def("__repr__", [](DW& d) {
            return d.visit([&](auto& w) {
                const ft::WhisperConfig& c = w.wc;
                return "Whisper(n_mels=" + std::to_string(c.n_mels) + ", n_audio_ctx=" + std::to_string(c.n_audio_ctx) +
                       ", n_vocab=" + std::to_string(c.n_vocab) + ", n_text_ctx=" + std::to_string(c.n_text_ctx) +
                       ", L_enc=" + std::to_string(c.L_enc) + ", L_dec=" + std::to_string(c.L_dec) + ", H=" +
                       std::to_string(c.H) + ", d_e=" + std::to_string(c.d_e) + ", d_mlp=" + std::to_string(c.d_mlp) +
                       ", dtype='" + d.dtype() + "')";
            });
        });
    def_params_api<WhisperModel>(cls);
}

}  // namespace ftpy
