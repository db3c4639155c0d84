// Algorithms 14 and 15 as Python classes: ft.DInference(l_gen, tau)(x, model), ft.EDInference(tau)(z, model).
#include <random>

#include "bind.hpp"
#include "formal_transformers/inference.hpp"
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
};
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
    py::class_<DInferencePy>(m, "DInference", R"doc(Algorithm 14: y ← DInference(x, θ̂) — prompting a trained DTransformer.

DInference(l_gen, tau=1.0, *, top_k=None, top_p=None, seed=None, cache=True)(x, model) -> y, the ℓ_gen
token ids that follow the prompt x (1-D, 1 ≤ ℓ ≤ l_max). Each token is drawn from q ∝ p^{1/τ} where p is
the last column of P = model(x) (τ = 0: argmax); top_k / top_p restrict q to the k most probable tokens,
then to the smallest set of those whose renormalised mass is ≥ top_p. cache=True keeps the keys and values of earlier tokens (one column of
work per new token); cache=False runs the listing literally (the whole model on the whole sequence each
step) — both give the same tokens for the same seed. Past l_max, by `context`: "window", the model sees
the last l_max tokens (a sliding window; the cache is refilled from the window each step then); "full",
the model sees the whole sequence (only for positional="rope" or "alibi", whose positions have no table:
ALiBi extrapolates); "auto" (default): "full" for ALiBi, "window" otherwise. seed=None: a fresh random seed.)doc")
        .def(py::init([](long long l_gen, double tau, const py::object& top_k, const py::object& top_p,
                         const py::object& seed, bool cache, const std::string& context) {
                 ft::check_l_gen(index_t(l_gen));
                 check_seed(seed);
                 DInferencePy d;
                 d.o = sampling(tau, top_k, top_p, cache);
                 if (context == "auto") d.o.context = ft::SamplingOptions::Context::Auto;
                 else if (context == "window") d.o.context = ft::SamplingOptions::Context::Window;
                 else if (context == "full") d.o.context = ft::SamplingOptions::Context::Full;
                 else throw ft::ValueError("context must be 'auto', 'window' or 'full', got '" + context + "'");
                 d.seed = seed;
                 d.l_gen = l_gen;
                 return d;
             }),
             py::arg("l_gen"), py::arg("tau") = 1.0, py::kw_only(), py::arg("top_k") = py::none(),
             py::arg("top_p") = py::none(), py::arg("seed") = py::none(), py::arg("cache") = true,
             py::arg("context") = "auto")
        .def(
            "__call__",
            [](DInferencePy& self, const py::handle& x, const py::object& model) {
                if (!py::isinstance<Dual<ft::DTransformer>>(model))
                    throw ft::TypeError("DInference needs a DTransformer, got " +
                                        py::str(py::type::handle_of(model).attr("__name__")).cast<std::string>());
                auto& d = model.cast<Dual<ft::DTransformer>&>();
                CallLock lock(d.mutex);
                return d.visit([&](auto& mdl) {
                    InIds prompt = in_ids(x, "x", mdl.cfg.n_vocab, false);
                    if (index_t(prompt.ids.size()) > mdl.cfg.l_max)
                        throw ft::ValueError("the prompt x has length " + std::to_string(prompt.ids.size()) +
                                             " > l_max = " + std::to_string(mdl.cfg.l_max));
                    ft::Rng rng(self.next_seed());
                    std::vector<index_t> y;
                    {
                        LongCoreCall nogil;
                        y = ft::DInference(mdl, prompt.ids.data(), index_t(prompt.ids.size()), self.l_gen, self.o, rng);
                    }
                    return to_array(y);
                });
            },
            py::arg("x"), py::arg("model"))
        .def_readonly("l_gen", &DInferencePy::l_gen)
        .def_property_readonly("tau", [](const DInferencePy& s) { return s.o.tau; })
        .def_property_readonly("context", [](const DInferencePy& s) { return context_name(s.o.context); })
        .def("__repr__", [](const DInferencePy& s) {
            return "DInference(l_gen=" + std::to_string(s.l_gen) + ", " + sampling_repr(s.o) + ", context='" +
                   context_name(s.o.context) + "')";
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
                 d.max_len = max_len.is_none() ? 0 : int_arg(max_len, "max_len");
                 if (!max_len.is_none() && d.max_len < 1) throw ft::ValueError("max_len must be >= 1");
                 return d;
             }),
             py::arg("tau") = 1.0, py::kw_only(), py::arg("max_len") = py::none(), py::arg("top_k") = py::none(),
             py::arg("top_p") = py::none(), py::arg("seed") = py::none(), py::arg("cache") = true)
        .def(
            "__call__",
            [](EDInferencePy& self, const py::handle& z, const py::object& model) {
                if (!py::isinstance<Dual<ft::EDTransformer>>(model))
                    throw ft::TypeError("EDInference needs an EDTransformer, got " +
                                        py::str(py::type::handle_of(model).attr("__name__")).cast<std::string>());
                auto& d = model.cast<Dual<ft::EDTransformer>&>();
                CallLock lock(d.mutex);
                return d.visit([&](auto& mdl) {
                    InIds zi = in_ids(z, "z", mdl.cfg.n_vocab, false);
                    if (index_t(zi.ids.size()) > mdl.cfg.l_max)
                        throw ft::ValueError("z has length " + std::to_string(zi.ids.size()) + " > l_max = " + std::to_string(mdl.cfg.l_max));
                    if (self.max_len > mdl.cfg.l_max)
                        throw ft::ValueError("max_len = " + std::to_string(self.max_len) + " > l_max = " + std::to_string(mdl.cfg.l_max));
                    ft::Rng rng(self.next_seed());
                    std::vector<index_t> x;
                    {
                        LongCoreCall nogil;
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
tokens_per_pass. seed=None: a fresh random seed.)doc")
        .def(py::init([](long long l_gen, long long k, double tau, const py::object& seed) {
                 ft::check_l_gen(index_t(l_gen));
                 ft::check_draft_k(index_t(k));
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
                for (const py::object* mo : {&target, &draft})
                    if (!py::isinstance<Dual<ft::DTransformer>>(*mo))
                        throw ft::TypeError(std::string("SpeculativeInference needs a DTransformer as ") +
                                            (mo == &target ? "target" : "draft") + ", got " +
                                            py::str(py::type::handle_of(*mo).attr("__name__")).cast<std::string>());
                auto& dt = target.cast<Dual<ft::DTransformer>&>();
                auto& dd = draft.cast<Dual<ft::DTransformer>&>();
                if (dt.u.index() != dd.u.index())
                    throw ft::ValueError("the draft and the target must have the same dtype: target " + dt.dtype() + ", draft " + dd.dtype());
                CallLock2 lock(dt.mutex, dd.mutex);  // both, in an order independent of the arguments
                ft::SpeculativeStats st;
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
                        out = ft::SpeculativeInference(mt, md, prompt.ids.data(), index_t(prompt.ids.size()), index_t(self.l_gen),
                                                       index_t(self.k), self.o.tau, rng, &st);
                    }
                    return to_array(out);
                });
                if (!want_stats) return std::move(y);
                py::dict s;
                s["target_passes"] = st.target_passes;
                s["draft_passes"] = st.draft_passes;
                s["drafted"] = to_array(st.drafted);
                s["accepted"] = to_array(st.accepted);
                s["tokens_per_pass"] = st.target_passes ? double(self.l_gen) / double(st.target_passes) : 0.0;
                return py::make_tuple(y, s);
            },
            py::arg("x"), py::arg("target"), py::arg("draft"), py::kw_only(), py::arg("stats") = false)
        .def_readonly("l_gen", &SpeculativeInferencePy::l_gen)
        .def_readonly("k", &SpeculativeInferencePy::k)
        .def_property_readonly("tau", [](const SpeculativeInferencePy& s) { return s.o.tau; })
        .def("__repr__", [](const SpeculativeInferencePy& s) {
            return "SpeculativeInference(l_gen=" + std::to_string(s.l_gen) + ", k=" + std::to_string(s.k) +
                   ", tau=" + py::repr(py::float_(s.o.tau)).cast<std::string>() + ")";
        });
}


}  // namespace ftpy
