// Algorithms 14 and 15 as Python classes: ft.DInference(l_gen, tau)(x, model), ft.EDInference(tau)(z, model).
#include <random>

#include "bind.hpp"
#include "formal_transformers/inference.hpp"
#include "formal_transformers/io.hpp"
#include "formal_transformers/paged.hpp"
#include "formal_transformers/speculative.hpp"

namespace ftpy {

namespace {

struct SamplerPy {
    ft::SamplingOptions o;
    py::object seed;  // None: a fresh random seed per call
    std::mt19937_64::result_type next_seed() {
        if (seed.is_none()) return std::random_device{}() ^ (std::uint64_t(std::random_device{}()) << 32);
        return seed_arg(seed);
    }
};

struct DInferencePy : SamplerPy {
    long long l_gen = 0;
    long long max_batch = 32;
};

// A prompt cache (paged.hpp PromptKV) with what it was computed with: the model's config (ModelConfig::to_json
// with the dtype), its SHA-256 (of that text), and θ's digest.
struct PromptCachePy {
    std::variant<ft::PromptKV<float>, ft::PromptKV<double>> kv;
    std::string config_json, config_hash, theta;
    std::string dtype() const { return kv.index() == 0 ? "float32" : "float64"; }
    index_t n_tokens() const {
        return std::visit([](const auto& c) { return index_t(c.ids.size()); }, kv);
    }
};

std::string sha256_hex(const std::string& text) {
    return py::module_::import("hashlib").attr("sha256")(py::bytes(text)).attr("hexdigest")().cast<std::string>();
}
std::string hex64(std::uint64_t v) {
    static const char* d = "0123456789abcdef";
    std::string s(16, '0');
    for (int i = 15; i >= 0; --i, v >>= 4) s[std::size_t(i)] = d[v & 15];
    return s;
}
// What a cache must match: the model's config with its dtype (hashed) and θ
template <class T>
std::string config_json_of(const ft::DTransformer<T>& m) {
    return m.cfg.to_json(std::is_same_v<T, double> ? "float64" : "float32");
}
// ValueError unless `pc` was computed with this model: the same config and dtype (the hash), the same θ
template <class T>
const ft::PromptKV<T>& cache_for(const PromptCachePy& pc, const ft::DTransformer<T>& m) {
    const std::string dt = std::is_same_v<T, double> ? "float64" : "float32";
    if (pc.config_hash != sha256_hex(config_json_of(m)) || pc.dtype() != dt)
        throw ft::ValueError("the prompt cache was computed with another model config or dtype (config hash " +
                             pc.config_hash.substr(0, 12) + "…, " + pc.dtype() + "; this model: " +
                             sha256_hex(config_json_of(m)).substr(0, 12) + "…, " + dt + ")");
    if (pc.theta != hex64(ft::theta_digest(m.store)))
        throw ft::ValueError("the prompt cache was computed with other parameters θ (same config, another model or "
                             "θ changed since): recompute it with DInference.prefill");
    const auto& kv = std::get<ft::PromptKV<T>>(pc.kv);
    kv.check(m);
    return kv;
}
std::string path_str(const py::object& path) {
    if (!py::isinstance<py::str>(path) && !py::hasattr(path, "__fspath__"))
        throw ft::TypeError("path must be a str or os.PathLike, got " +
                            py::str(py::type::handle_of(path).attr("__name__")).cast<std::string>());
    return py::module_::import("os").attr("fspath")(path).cast<std::string>();
}
bool is_integer(const py::handle& v) {
    return py::isinstance<py::int_>(v) || py::isinstance(v, py::module_::import("numpy").attr("integer"));
}
AnyDtype<ft::DTransformer>& dtransformer(const py::object& model, const char* who) {
    if (!py::isinstance<AnyDtype<ft::DTransformer>>(model))
        throw ft::TypeError(std::string(who) + " needs a DTransformer, got " +
                            py::str(py::type::handle_of(model).attr("__name__")).cast<std::string>());
    return model.cast<AnyDtype<ft::DTransformer>&>();
}
struct EDInferencePy : SamplerPy {
    long long max_len = 0;
};
struct SpeculativeInferencePy : SamplerPy {
    long long l_gen = 0, k = 4;
};

ft::SamplingOptions sampling(double tau, const py::object& top_k, const py::object& top_p, bool cache) {
    ft::SamplingOptions o;
    o.tau = tau;
    o.top_k = top_k.is_none() ? 0 : int_arg(top_k, "top_k");
    o.top_p = top_p.is_none() ? 1.0 : float_arg(top_p, "top_p");
    o.cache = cache;
    o.check();
    return o;
}

void check_seed(const py::object& seed) {
    if (!seed.is_none()) seed_arg(seed);
}

py::array_t<long long> to_array(const std::vector<index_t>& v) {
    py::array_t<long long> a(py::ssize_t(v.size()));
    std::copy(v.begin(), v.end(), a.mutable_data());
    return a;
}

std::string sampling_repr(const ft::SamplingOptions& o) {
    return "tau=" + py::repr(py::float_(o.tau)).cast<std::string>() + ", top_k=" + std::to_string(o.top_k) +
           ", top_p=" + py::repr(py::float_(o.top_p)).cast<std::string>() + ", cache=" + (o.cache ? "True" : "False");
}
const char* context_name(ft::SamplingOptions::Context c) {
    return c == ft::SamplingOptions::Context::Full ? "full" : c == ft::SamplingOptions::Context::Window ? "window" : "auto";
}
}  // namespace

void register_inference(py::module_& m) {
    py::class_<PromptCachePy>(m, "PromptCache", R"doc(A prompt cache: the keys and values of every layer for a prompt and its last token's logits —
Algorithm 14's first pass, computed once (DInference.prefill(x, model)), saved and loaded, and continued by
DInference(...)(cache, model) with the tokens DInference(...)(x, model) gives for the same seed.

It names what it was computed with: config_hash, the SHA-256 of the model's config as config_json() writes it
with the dtype, and theta_digest, a 64-bit digest of θ; a model with another config, dtype or θ refuses it
(ValueError). save(path) writes a safetensors file (tensors K.l, V.l of shape (ℓ, H_kv·d_attn), z (N_V,)),
PromptCache.load(path, model) reads one back, checked against the model.)doc")
        .def_property_readonly("ids", [](const PromptCachePy& p) {
            return std::visit([](const auto& c) { return to_array(c.ids); }, p.kv);
        }, "the prompt's token ids")
        .def_property_readonly("n_tokens", &PromptCachePy::n_tokens)
        .def_property_readonly("dtype", &PromptCachePy::dtype)
        .def_readonly("config_hash", &PromptCachePy::config_hash)
        .def_readonly("theta_digest", &PromptCachePy::theta)
        .def_property_readonly("nbytes", [](const PromptCachePy& p) {
            return std::visit([](const auto& c) {
                std::size_t n = c.z.size();
                for (std::size_t i = 0; i < c.K.size(); ++i) n += c.K[i].size() + c.V[i].size();
                return n * sizeof(typename std::decay_t<decltype(c.z)>::value_type);
            }, p.kv);
        }, "bytes of keys, values and logits held")
        .def("save", [](const PromptCachePy& p, const py::object& path) {
            const std::string file = path_str(path);
            const ft::ModelConfig c = ft::ModelConfig::from_json(p.config_json);
            const std::vector<std::pair<std::string, std::string>> meta = {
                {"formal_transformers.config_sha256", p.config_hash}, {"formal_transformers.theta_digest", p.theta}};
            std::visit([&](const auto& kv) {
                LongCoreCall nogil;
                ft::save_prompt_kv(kv, c, meta, file);
            }, p.kv);
        }, py::arg("path"), "write the cache to a safetensors file (atomically: a temporary renamed onto path)")
        .def_static("load", [](const py::object& path, const py::object& model) {
            const std::string file = path_str(path);
            auto& d = dtransformer(model, "PromptCache.load");
            CallLock lock(d.mutex);
            return d.visit([&](auto& mdl) {
                using T = typename std::decay_t<decltype(mdl.store)>::value_type;
                ft::SavedModel f;
                {
                    LongCoreCall nogil;
                    f = ft::SavedModel::read(file);
                }
                if (!ft::is_prompt_cache(f)) throw ft::ValueError(file + ": not a prompt cache (a file of PromptCache.save)");
                PromptCachePy pc;
                pc.config_json = f.metadata.at("formal_transformers.config");
                const auto h = f.metadata.find("formal_transformers.config_sha256");
                const auto t = f.metadata.find("formal_transformers.theta_digest");
                if (h == f.metadata.end() || t == f.metadata.end()) throw ft::ValueError(file + ": a prompt cache without its hashes");
                if (h->second != sha256_hex(pc.config_json))
                    throw ft::ValueError(file + ": damaged (the config does not have the hash saved with it)");
                pc.config_hash = h->second, pc.theta = t->second;
                const std::string dt = std::is_same_v<T, double> ? "float64" : "float32";
                // the saved config read as a config (an option added since takes its default, as in ft.load), so a
                // cache saved before a new option existed still belongs to the same model; then it is this model's
                ft::ModelConfig saved;
                std::string saved_dt;
                try {
                    saved = ft::ModelConfig::from_json(pc.config_json);
                    saved_dt = ft::ModelConfig::json_dtype(pc.config_json);
                } catch (const ft::ValueError& e) {
                    throw ft::ValueError(file + ": damaged or unusable config in the metadata (" + e.what() + ")");
                }
                if (saved != mdl.cfg || saved_dt != dt)
                    throw ft::ValueError(file + ": the prompt cache was computed with another model config or dtype "
                                         "(config hash " + pc.config_hash.substr(0, 12) + "…, " + saved_dt + "; this " + dt +
                                         " model: " + sha256_hex(config_json_of(mdl)).substr(0, 12) + "…)");
                pc.config_json = config_json_of(mdl);
                pc.config_hash = sha256_hex(pc.config_json);
                {
                    LongCoreCall nogil;
                    pc.kv = ft::read_prompt_kv<T>(f);
                }
                cache_for(pc, mdl);  // θ and the shapes
                return pc;
            });
        }, py::arg("path"), py::arg("model"),
           "read a saved cache for `model` (ValueError: another config, dtype or θ, or a damaged file)")
        .def("__len__", &PromptCachePy::n_tokens)
        .def("__repr__", [](const PromptCachePy& p) {
            return "PromptCache(n_tokens=" + std::to_string(p.n_tokens()) + ", dtype='" + p.dtype() + "', config_hash='" +
                   p.config_hash.substr(0, 12) + "…')";
        });

    py::class_<DInferencePy>(m, "DInference", R"doc(Algorithm 14: y ← DInference(x, θ̂) — prompting a trained DTransformer.

DInference(l_gen, tau=1.0, *, top_k=None, top_p=None, seed=None, cache=True)(x, model) -> y, the ℓ_gen
token ids that follow the prompt x (1-D, 1 ≤ ℓ ≤ l_max). Each token is drawn from q ∝ p^{1/τ} where p is
the last column of P = model(x) (τ = 0: argmax); top_k / top_p restrict q to the k most probable tokens,
then to the smallest set of those whose renormalised mass is ≥ top_p. cache=True keeps the keys and values of earlier tokens (one column of
work per new token); cache=False runs the listing literally (the whole model on the whole sequence each
step) — both give the same tokens for the same seed. Past l_max, by `context`: "window", the model sees
the last l_max tokens (a sliding window; the cache is refilled from the window each step then); "full",
the model sees the whole sequence (only for positional="rope" or "alibi", whose positions have no table:
ALiBi extrapolates); "auto" (default): "full" for ALiBi, "window" otherwise. seed=None: a fresh random seed.

Many prompts (docs/paged_decoding.md, Algorithm P): x a list (or tuple) of 1-D id arrays and/or PromptCaches
returns a list, item i the tokens DInference(...)(x[i], model) gives. The keys and values are kept in pages
of 16 tokens with a block table per sequence; up to max_batch sequences are decoded together (one product
per projection over the batch), finished ones leave and waiting ones join (continuous batching). Each
sequence samples from its own stream seeded with `seed` (as a call on that prompt alone; seed=None: a fresh
seed each). A list of ints is one prompt, as before. Every prompt is checked before anything runs.
x a PromptCache (DInference.prefill): continues it, the tokens of DInference(...)(cache.ids, model).

A prefix LM (mask="prefix", docs/variants.md V7): the call's prefix_len=p makes the prompt's first p tokens
the prefix (bidirectional over them, causal after); None (default): the whole prompt, for such a model.)doc")
        .def(py::init([](const PyInt& l_gen_arg, double tau, const py::object& top_k, const py::object& top_p,
                         const py::object& seed, bool cache, const std::string& context, const PyInt& max_batch_arg) {
                 const long long l_gen = int_arg(l_gen_arg, "l_gen", 0), max_batch = int_arg(max_batch_arg, "max_batch");
                 ft::check_l_gen(index_t(l_gen));
                 if (max_batch < 1) throw ft::ValueError("max_batch must be >= 1, got " + std::to_string(max_batch));
                 check_seed(seed);
                 DInferencePy d;
                 d.o = sampling(tau, top_k, top_p, cache);
                 if (context == "auto") d.o.context = ft::SamplingOptions::Context::Auto;
                 else if (context == "window") d.o.context = ft::SamplingOptions::Context::Window;
                 else if (context == "full") d.o.context = ft::SamplingOptions::Context::Full;
                 else throw ft::ValueError("context must be 'auto', 'window' or 'full', got '" + context + "'");
                 d.seed = seed;
                 d.l_gen = l_gen;
                 d.max_batch = max_batch;
                 return d;
             }),
             py::arg("l_gen"), py::arg("tau") = 1.0, py::kw_only(), py::arg("top_k") = py::none(),
             py::arg("top_p") = py::none(), py::arg("seed") = py::none(), py::arg("cache") = true,
             py::arg("context") = "auto", py::arg("max_batch") = 32)
        .def(
            "__call__",
            [](DInferencePy& self, const py::object& x, const py::object& model, const py::handle& prefix_len) -> py::object {
                auto& d = dtransformer(model, "DInference");
                CallLock lock(d.mutex);
                const bool many = (py::isinstance<py::list>(x) || py::isinstance<py::tuple>(x)) && py::len(x) > 0 &&
                                  !is_integer(x.cast<py::sequence>()[0]);
                if (!prefix_len.is_none() && (many || py::isinstance<PromptCachePy>(x)))
                    throw ft::ValueError("prefix_len is an option of one prompt's decoding (a prefix LM, V7), not of a "
                                         "list of prompts or a prompt cache");
                if (py::isinstance<PromptCachePy>(x)) {  // continue a prompt cache (Algorithm 14 after its first pass)
                    const auto& pc = x.cast<const PromptCachePy&>();
                    return d.visit([&](auto& mdl) -> py::object {
                        const auto& kv = cache_for(pc, mdl);
                        ft::Rng rng(self.next_seed());
                        std::vector<index_t> y;
                        {
                            LongCoreCall nogil;
                            DecodeProducts products(d, mdl);  // bf16-mixed: θ's bf16 copy, checked against θ
                            y = ft::DInference(mdl, kv, index_t(self.l_gen), self.o, rng);
                        }
                        return to_array(y);
                    });
                }
                if (many) {  // a list (or tuple) of prompts: its first item not an integer (a list of ids is one prompt)  // Algorithm P: a batch of prompts
                    const py::sequence items = x.cast<py::sequence>();
                    return d.visit([&](auto& mdl) -> py::object {
                        using T = typename std::decay_t<decltype(mdl.store)>::value_type;
                        std::vector<InIds> ids(items.size());
                        std::vector<ft::PromptRef<T>> refs(items.size());
                        for (std::size_t i = 0; i < items.size(); ++i) {  // every prompt checked before anything runs
                            const py::object it = items[i];
                            const std::string what = "prompts[" + std::to_string(i) + "]";
                            if (py::isinstance<PromptCachePy>(it)) {
                                refs[i].cache = &cache_for(it.cast<const PromptCachePy&>(), mdl);
                                continue;
                            }
                            ids[i] = in_ids(it, what.c_str(), mdl.cfg.n_vocab, false);
                            if (ids[i].ids.empty() || index_t(ids[i].ids.size()) > mdl.cfg.l_max)
                                throw ft::ValueError(what + " has length " + std::to_string(ids[i].ids.size()) +
                                                     "; a prompt has 1 … l_max = " + std::to_string(mdl.cfg.l_max) + " tokens");
                            refs[i].ids = ids[i].ids.data(), refs[i].len = index_t(ids[i].ids.size());
                        }
                        // each sequence its own stream, seeded as a call on that prompt alone is (seed=None: a fresh seed each)
                        std::vector<ft::Rng> rngs;
                        for (std::size_t i = 0; i < items.size(); ++i) rngs.emplace_back(self.next_seed());
                        std::vector<std::vector<index_t>> ys;
                        {
                            LongCoreCall nogil;
                            DecodeProducts products(d, mdl);  // bf16-mixed: θ's bf16 copy, checked against θ
                            ys = ft::DInferenceBatch(mdl, refs, index_t(self.l_gen), self.o, rngs, index_t(self.max_batch));
                        }
                        py::list out;
                        for (const auto& y : ys) out.append(to_array(y));
                        return std::move(out);
                    });
                }
                return d.visit([&](auto& mdl) -> py::object {
                    // the prompt's length and prefix_len's range: the listing's checks (dinference, validate)
                    InIds prompt = in_ids(x, "x", mdl.cfg.n_vocab, false);
                    // V7: None -> the whole prompt for a mask='prefix' model (the prompt is the prefix), else none
                    index_t p = ft::kDefaultPrefix;
                    if (!prefix_len.is_none())
                        p = index_t(checked_int(prefix_len, "prefix_len", LLONG_MIN, LLONG_MAX,
                                                "an int (the prompt's prefix) or None").i);
                    ft::Rng rng(self.next_seed());
                    std::vector<index_t> y;
                    {
                        LongCoreCall nogil;
                        DecodeProducts products(d, mdl);  // bf16-mixed: θ's bf16 copy, checked against θ
                        y = ft::DInference(mdl, prompt.ids.data(), index_t(prompt.ids.size()), self.l_gen, self.o, rng, p);
                    }
                    return to_array(y);
                });
            },
            py::arg("x"), py::arg("model"), py::arg("prefix_len") = py::none())
        .def_static(
            "prefill",
            [](const py::handle& x, const py::object& model) {
                auto& d = dtransformer(model, "DInference.prefill");
                CallLock lock(d.mutex);
                return d.visit([&](auto& mdl) {
                    InIds prompt = in_ids(x, "x", mdl.cfg.n_vocab, false);
                    if (prompt.ids.empty() || index_t(prompt.ids.size()) > mdl.cfg.l_max)
                        throw ft::ValueError("the prompt x has length " + std::to_string(prompt.ids.size()) +
                                             "; a prompt has 1 … l_max = " + std::to_string(mdl.cfg.l_max) + " tokens");
                    PromptCachePy pc;
                    pc.config_json = config_json_of(mdl);
                    pc.config_hash = sha256_hex(pc.config_json);
                    {
                        LongCoreCall nogil;
                        DecodeProducts products(d, mdl);  // bf16-mixed: θ's bf16 copy, checked against θ
                        pc.kv = ft::prefill(mdl, prompt.ids.data(), index_t(prompt.ids.size()));
                        pc.theta = hex64(ft::theta_digest(mdl.store));
                    }
                    return pc;
                });
            },
            py::arg("x"), py::arg("model"),
            "The prompt cache of x: Algorithm 14's first pass over the prompt (every layer's keys and values, the "
            "last token's logits), computed once; DInference(...)(cache, model) continues it with the tokens "
            "DInference(...)(x, model) gives.")
        .def_readonly("max_batch", &DInferencePy::max_batch)
        .def_readonly("l_gen", &DInferencePy::l_gen)
        .def_property_readonly("tau", [](const DInferencePy& s) { return s.o.tau; })
        .def_property_readonly("context", [](const DInferencePy& s) { return context_name(s.o.context); })
        .def("__repr__", [](const DInferencePy& s) {
            return "DInference(l_gen=" + std::to_string(s.l_gen) + ", " + sampling_repr(s.o) + ", context='" +
                   context_name(s.o.context) + "', max_batch=" + std::to_string(s.max_batch) + ")";
        });

    py::class_<EDInferencePy>(m, "EDInference", R"doc(Algorithm 15: x̂ ← EDInference(z, θ̂) — sequence-to-sequence decoding with an EDTransformer.

EDInference(tau=1.0, *, max_len=None, top_k=None, top_p=None, seed=None, cache=True)(z, model) -> x̂:
starts with bos_token and samples until eos_token (included), or until x̂ has max_len tokens (default
l_max), so it always terminates. cache=True runs the encoder once per z and keeps the decoder's keys and
values; cache=False runs the listing literally. Sampling as DInference.)doc")
        .def(py::init([](double tau, const py::object& max_len, const py::object& top_k, const py::object& top_p,
                         const py::object& seed, bool cache) {
                 check_seed(seed);
                 EDInferencePy d;
                 d.o = sampling(tau, top_k, top_p, cache);
                 d.seed = seed;
                 d.max_len = max_len.is_none() ? 0 : int_arg(max_len, "max_len", 1);
                 if (!max_len.is_none() && d.max_len < 1) throw ft::ValueError("max_len must be >= 1");
                 return d;
             }),
             py::arg("tau") = 1.0, py::kw_only(), py::arg("max_len") = py::none(), py::arg("top_k") = py::none(),
             py::arg("top_p") = py::none(), py::arg("seed") = py::none(), py::arg("cache") = true)
        .def(
            "__call__",
            [](EDInferencePy& self, const py::handle& z, const py::object& model) {
                if (!py::isinstance<AnyDtype<ft::EDTransformer>>(model))
                    throw ft::TypeError("EDInference needs an EDTransformer, got " +
                                        py::str(py::type::handle_of(model).attr("__name__")).cast<std::string>());
                auto& d = model.cast<AnyDtype<ft::EDTransformer>&>();
                CallLock lock(d.mutex);
                return d.visit([&](auto& mdl) {
                    using T = typename std::decay_t<decltype(mdl.store)>::value_type;
                    if (mdl.audio()) {  // an encoder that takes features (the audio encoder, V28): one matrix
                        InAudio<T> f = in_audio<T>(z, mdl.encoder_input().what);
                        if (!f.single)
                            throw ft::ValueError("EDInference decodes one feature matrix at a time: " +
                                                 mdl.encoder_input().what);
                        ft::Rng rng(self.next_seed());
                        std::vector<index_t> x;
                        {
                            LongCoreCall nogil;
                            DecodeProducts products(d, mdl);  // bf16-mixed: θ's bf16 copy, checked against θ
                            x = ft::EDInference(mdl, f.features(), self.o, rng, self.max_len);
                        }
                        return to_array(x);
                    }
                    if (is_float_array(z))  // a spectrogram given to a token encoder: name it before its shape
                        throw ft::TypeError("z must hold integer token ids, not floats: this EDTransformer's encoder "
                                            "takes token ids (its embedding is 'tokens': no audio encoder)");
                    InIds zi = in_ids(z, "z", mdl.cfg.n_vocab, false);  // z's length and max_len: the listing's checks
                    ft::Rng rng(self.next_seed());
                    std::vector<index_t> x;
                    {
                        LongCoreCall nogil;
                        DecodeProducts products(d, mdl);  // bf16-mixed: θ's bf16 copy, checked against θ
                        x = ft::EDInference(mdl, zi.ids.data(), index_t(zi.ids.size()), self.o, rng, self.max_len);
                    }
                    return to_array(x);
                });
            },
            py::arg("z"), py::arg("model"))
        .def_property_readonly("tau", [](const EDInferencePy& s) { return s.o.tau; })
        .def("__repr__", [](const EDInferencePy& s) {
            return "EDInference(" + sampling_repr(s.o) + ", max_len=" + std::to_string(s.max_len) + ")";
        });

    py::class_<SpeculativeInferencePy>(m, "SpeculativeInference", R"doc(Speculative decoding (Leviathan et al. 2023; Chen et al. 2023) beside Algorithm 14, listing in docs/speculative_decoding.md.

SpeculativeInference(l_gen, k=4, tau=1.0, *, seed=None)(x, target, draft, *, stats=False) -> y, the ℓ_gen
token ids after the prompt x, distributed exactly as DInference(l_gen, tau)(x, target): the draft
DTransformer proposes k tokens, the target scores them in one cached pass, each is kept with probability
min(1, q(x̂)/p(x̂)) (q the target's, p the draft's q ∝ P^{1/τ}); the first rejected one is replaced by a
token from norm(max(0, q − p)); when all k are kept the target adds one more. τ = 0: the target's greedy
output. Both models: same vocabulary and dtype, len(x) + l_gen − 1 ≤ l_max (no sliding window).
stats=True returns (y, dict) with target_passes, draft_passes, drafted and accepted (per target pass) and
tokens_per_pass. seed=None: a fresh random seed.
draft=None: self-speculation (docs/variants.md V16): the target's own multi-token-prediction modules (mtp_depth ≥ k)
draft, module j the j-th token after the trunk's last kept hidden state; no second model. The first pass drafts
nothing.)doc")
        .def(py::init([](const PyInt& l_gen_arg, const PyInt& k_arg, double tau, const py::object& seed) {
                 const long long l_gen = int_arg(l_gen_arg, "l_gen", 0), k = int_arg(k_arg, "k (tokens drafted per target pass)", 1);
                 ft::check_l_gen(index_t(l_gen));
                 check_seed(seed);
                 SpeculativeInferencePy d;
                 d.o = sampling(tau, py::none(), py::none(), true);
                 d.seed = seed;
                 d.l_gen = l_gen;
                 d.k = k;
                 return d;
             }),
             py::arg("l_gen"), py::arg("k") = 4, py::arg("tau") = 1.0, py::kw_only(), py::arg("seed") = py::none())
        .def(
            "__call__",
            [](SpeculativeInferencePy& self, const py::handle& x, const py::object& target, const py::object& draft,
               bool want_stats) -> py::object {
                ft::SpeculativeStats st;
                auto stats_of = [&](py::array_t<long long> y) -> py::object {
                    if (!want_stats) return std::move(y);
                    py::dict s;
                    s["target_passes"] = st.target_passes;
                    s["draft_passes"] = st.draft_passes;
                    s["drafted"] = to_array(st.drafted);
                    s["accepted"] = to_array(st.accepted);
                    s["tokens_per_pass"] = st.target_passes ? double(self.l_gen) / double(st.target_passes) : 0.0;
                    return py::make_tuple(y, s);
                };
                if (draft.is_none()) {  // V16: self-speculation with the target's multi-token-prediction modules
                    if (!py::isinstance<AnyDtype<ft::DTransformer>>(target))
                        throw ft::TypeError("SpeculativeInference needs a DTransformer as target, got " +
                                            py::str(py::type::handle_of(target).attr("__name__")).cast<std::string>());
                    auto& dt = target.cast<AnyDtype<ft::DTransformer>&>();
                    CallLock lock(dt.mutex);
                    py::array_t<long long> y = dt.visit([&](auto& mt) {
                        InIds prompt = in_ids(x, "x", mt.cfg.n_vocab, false);
                        ft::Rng rng(self.next_seed());
                        std::vector<index_t> out;
                        {
                            LongCoreCall nogil;
                            DecodeProducts products(dt, mt);  // bf16-mixed: θ's bf16 copy, checked against θ
                            out = ft::SelfSpeculativeInference(mt, prompt.ids.data(), index_t(prompt.ids.size()), index_t(self.l_gen),
                                                               index_t(self.k), self.o.tau, rng, &st);
                        }
                        return to_array(out);
                    });
                    return stats_of(y);
                }
                for (const py::object* mo : {&target, &draft})
                    if (!py::isinstance<AnyDtype<ft::DTransformer>>(*mo))
                        throw ft::TypeError(std::string("SpeculativeInference needs a DTransformer as ") +
                                            (mo == &target ? "target" : "draft") + ", got " +
                                            py::str(py::type::handle_of(*mo).attr("__name__")).cast<std::string>());
                auto& dt = target.cast<AnyDtype<ft::DTransformer>&>();
                auto& dd = draft.cast<AnyDtype<ft::DTransformer>&>();
                if (dt.u.index() != dd.u.index())
                    throw ft::ValueError("the draft and the target must have the same dtype: target " + dt.dtype() + ", draft " + dd.dtype());
                CallLock2 lock(dt.mutex, dd.mutex);  // both, in an order independent of the arguments
                py::array_t<long long> y = dt.visit([&](auto& mt) {
                    using M = std::decay_t<decltype(mt)>;
                    M& md = *std::get<std::unique_ptr<M>>(dd.u);
                    if (md.cfg.n_vocab != mt.cfg.n_vocab)
                        throw ft::ValueError("the draft and the target must share the vocabulary: draft N_V = " +
                                             std::to_string(md.cfg.n_vocab) + ", target N_V = " + std::to_string(mt.cfg.n_vocab));
                    InIds prompt = in_ids(x, "x", mt.cfg.n_vocab, false);
                    ft::Rng rng(self.next_seed());
                    std::vector<index_t> out;
                    {
                        LongCoreCall nogil;
                        DecodeProducts products(dt, mt);  // bf16-mixed: θ's bf16 copy, checked against θ
                        out = ft::SpeculativeInference(mt, md, prompt.ids.data(), index_t(prompt.ids.size()), index_t(self.l_gen),
                                                       index_t(self.k), self.o.tau, rng, &st);
                    }
                    return to_array(out);
                });
                return stats_of(y);
            },
            py::arg("x"), py::arg("target"), py::arg("draft") = py::none(), py::kw_only(), py::arg("stats") = false)
        .def_readonly("l_gen", &SpeculativeInferencePy::l_gen)
        .def_readonly("k", &SpeculativeInferencePy::k)
        .def_property_readonly("tau", [](const SpeculativeInferencePy& s) { return s.o.tau; })
        .def("__repr__", [](const SpeculativeInferencePy& s) {
            return "SpeculativeInference(l_gen=" + std::to_string(s.l_gen) + ", k=" + std::to_string(s.k) +
                   ", tau=" + py::repr(py::float_(s.o.tau)).cast<std::string>() + ")";
        });
}


}  // namespace ftpy
