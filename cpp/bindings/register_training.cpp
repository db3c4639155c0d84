// Algorithms 11–13: the C++ loops behind ft.DTraining / ft.ETraining / ft.EDTraining (training.py adds
// the Python conveniences: progress bar, callbacks, history). The loop runs with the GIL released; the
// per-step hook takes it back briefly.
#include <chrono>

#include "bind_optim.hpp"
#include "formal_transformers/training.hpp"

namespace ftpy {

namespace {
std::string option_str(py::handle v, const std::string& name) {
    if (!py::isinstance<py::str>(v))
        throw ft::TypeError(name + " must be a string, got " + std::string(py::str(py::type::handle_of(v).attr("__name__"))));
    return v.cast<std::string>();
}
// option `name`, a string naming one of `choices`: its value (ValueError listing the choices otherwise)
template <class E>
E option_choice(py::handle v, const std::string& name, std::initializer_list<std::pair<const char*, E>> choices) {
    const std::string r = option_str(v, name);
    std::string list;
    std::size_t k = 0;
    for (const auto& [text, value] : choices) {
        if (r == text) return value;
        list += std::string(k == 0 ? "" : k + 1 == choices.size() ? " or " : ", ") + "'" + text + "'";
        ++k;
    }
    throw ft::ValueError(name + " must be " + list + ", got '" + r + "'");
}

ft::TrainOptions parse_options(const py::dict& d) {
    ft::TrainOptions o;
    for (auto kv : d) {
        const std::string k = kv.first.cast<std::string>();
        py::handle v = kv.second;
        if (k == "n_epochs") o.n_epochs = int_arg(v, "n_epochs");
        else if (k == "eta") o.eta = float_arg(v, "eta");
        else if (k == "batch_size") o.batch_size = int_arg(v, "batch_size");
        else if (k == "shuffle") {
            if (!py::isinstance<py::bool_>(v)) throw ft::TypeError("shuffle must be True or False");
            o.shuffle = v.cast<bool>();
        }
        else if (k == "seed") o.seed = seed_arg(v);
        else if (k == "warmup") o.warmup = int_arg(v, "warmup");
        else if (k == "min_lr") o.min_lr = float_arg(v, "min_lr");
        else if (k == "clip") o.clip = float_arg(v, "clip");
        else if (k == "max_steps") o.max_steps = int_arg(v, "max_steps");
        else if (k == "eval_every") o.eval_every = int_arg(v, "eval_every");
        else if (k == "start_step") o.start_step = int_arg(v, "start_step");
        else if (k == "p_mask") o.p_mask = float_arg(v, "p_mask");
        else if (k == "patience") {
            if (!v.is_none()) {
                // None spells "off" in Python (C++'s 0); the range is TrainOptions::check's
                o.patience = int_arg(v, "patience");
                if (o.patience == 0) throw ft::ValueError("patience = 0: write patience=None for no early stopping");
            }
        } else if (k == "min_delta") o.min_delta = float_arg(v, "min_delta");
        else if (k == "restore_best") {
            if (!py::isinstance<py::bool_>(v)) throw ft::TypeError("restore_best must be True or False");
            o.restore_best = v.cast<bool>();
        }
        else if (k == "reduction") {
            o.reduction = ft::parse_reduction(option_str(v, "reduction"));
        } else if (k == "schedule") {
            using S = ft::TrainOptions::Schedule;
            o.schedule = option_choice<S>(v, "schedule", {{"constant", S::Constant}, {"cosine", S::Cosine}, {"linear", S::Linear}});
        } else if (k == "nonfinite") {
            using N = ft::TrainOptions::NonFinite;
            o.nonfinite = option_choice<N>(v, "nonfinite", {{"raise", N::Raise}, {"warn", N::Warn}, {"skip", N::Skip}});
        } else {
            throw ft::ValueError("unknown training option '" + k + "'");
        }
    }
    o.check();
    return o;
}

ft::Dataset dataset(const py::handle& obj, const char* what) {
    InBatch b = in_batch(obj, what);
    ft::Dataset d;
    d.ids = std::move(b.ids);
    d.s = ft::Seqs::from_lengths(b.lengths);
    return d;
}

py::dict step_dict(const ft::StepInfo& s) {
    py::dict d;
    d["step"] = s.step;
    d["epoch"] = s.epoch;
    d["total_steps"] = s.total_steps;
    d["loss"] = s.loss;
    d["lr"] = s.lr;
    d["grad_norm"] = s.grad_norm;
    d["tokens"] = s.tokens;
    d["skipped"] = s.skipped;
    d["val_loss"] = s.val_loss >= 0 ? py::object(py::float_(s.val_loss)) : py::object(py::none());
    d["val_accuracy"] = s.val_accuracy >= 0 ? py::object(py::float_(s.val_accuracy)) : py::object(py::none());
    return d;
}

// Every step's figures are recorded here, in C++, right after the step's update and before any Python
// runs (so the record always ends at the step the model holds, whatever interrupts training next), then
// appended to the Python list `sink` when training ends — normally or by an exception (Ctrl-C, a
// callback's error). The Python hook (progress bar, callback) gets each step's dict; False stops.
struct Recorder {
    py::object sink, hook;
    bool warn_nonfinite = false;  // nonfinite='warn': a RuntimeWarning for each skipped step
    std::vector<ft::StepInfo> steps;
    std::vector<double> seconds;
    bool stepped = false;  // a step ran (steps are handed to `sink` when training ends)
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();

    ft::StepHook step_hook() {
        return [this](const ft::StepInfo& s) {
            stepped = true;
            steps.push_back(s);
            seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            if (s.skipped && warn_nonfinite && !s.interrupted) {
                ft::FpCallerEnv caller_env;
                py::gil_scoped_acquire gil;
                const std::string msg = "training step " + std::to_string(s.step) + " skipped: loss " +
                                        std::to_string(s.loss) + ", gradient norm " + std::to_string(s.grad_norm) +
                                        " (not finite); no update applied";
                if (PyErr_WarnEx(PyExc_RuntimeWarning, msg.c_str(), 1) != 0) throw py::error_already_set();
            }
            if (s.interrupted || hook.is_none()) return !s.interrupted;
            ft::FpCallerEnv caller_env;  // the callback runs in the caller's FP environment (fpenv.hpp)
            py::gil_scoped_acquire gil;
            if (PyErr_CheckSignals() != 0) throw py::error_already_set();  // Ctrl-C between steps
            py::object r = hook(step_dict(s));
            return r.is_none() || r.cast<bool>();
        };
    }
    void flush() {  // with the GIL
        if (sink.is_none()) return;
        for (std::size_t i = 0; i < steps.size(); ++i) {
            py::dict d = step_dict(steps[i]);
            d["time"] = seconds[i];
            sink.attr("append")(d);
        }
        steps.clear();
        seconds.clear();
    }
    // Run `train` with the GIL released; flush the record however it ends.
    template <class F>
    void run(F&& train) {
        try {
            {
                LongCoreCall nogil;
                train(step_hook());
            }
        } catch (...) {
            flush();
            throw;
        }
        flush();
    }
};

// Early stopping's state (training.hpp) to and from a Python dict: best_val_loss (None: no evaluation yet),
// best_step, bad_evals, best_params (name -> array, as model.params; None unless restore_best) in; the same
// plus stopped, restored and last_params (θ after the last step when the best was restored) out.
template <class T>
ft::EarlyStopState<T> read_early(const py::object& obj, const ft::ParamStore<T>& store) {
    ft::EarlyStopState<T> s;
    if (obj.is_none()) return s;
    if (!py::isinstance<py::dict>(obj)) throw ft::TypeError("the early-stopping state must be a dict (or None)");
    const py::dict d = obj;
    auto get = [&](const char* k) { return d.contains(k) ? py::object(d[k]) : py::object(py::none()); };
    if (!get("best_val_loss").is_none()) s.best_val_loss = float_arg(get("best_val_loss"), "best_val_loss");
    if (!get("best_step").is_none()) s.best_step = int_arg(get("best_step"), "best_step");
    if (!get("bad_evals").is_none()) s.bad_evals = int_arg(get("bad_evals"), "bad_evals");
    const py::object best = get("best_params");
    if (!best.is_none()) {
        if (!py::isinstance<py::dict>(best)) throw ft::TypeError("best_params must be a dict name -> array (or None)");
        s.best_theta.resize(std::size_t(ft::check_bytes(store.size(), sizeof(T), "best_params")));
        ParamDict into = param_views(py::capsule(s.best_theta.data(), [](void*) {}), store, s.best_theta.data());
        const py::dict bd = best;
        if (bd.size() != into.names().size())
            throw ft::ValueError("best_params must name every parameter of the model (" + std::to_string(into.names().size()) +
                                 "), got " + std::to_string(bd.size()));
        into.update(bd);  // names, shapes and dtypes checked
    }
    return s;
}

template <class T>
void write_early(const py::object& obj, const ft::EarlyStopState<T>& s, const ft::ParamStore<T>& store) {
    if (obj.is_none()) return;
    auto copies = [&](const std::vector<T>& flat) -> py::object {
        if (flat.empty()) return py::none();
        ParamDict v = param_views(py::object(), store, const_cast<T*>(flat.data()));  // no owner: copies
        py::dict out;
        for (std::size_t i = 0; i < v.names().size(); ++i) out[py::str(v.names()[i])] = v.arrays()[i];
        return out;
    };
    py::dict d = obj;
    const bool any = s.best_val_loss < std::numeric_limits<double>::infinity();
    d["best_val_loss"] = any ? py::object(py::float_(s.best_val_loss)) : py::object(py::none());
    d["best_step"] = s.best_step;
    d["bad_evals"] = s.bad_evals;
    d["stopped"] = s.stopped;
    d["restored"] = s.restored;
    d["best_params"] = copies(s.best_theta);
    d["last_params"] = copies(s.last_theta);
}

// `train(hook, state)` under rec.run, the early-stopping state read from `early` before and written back
// after, however training ends once a step has run (Ctrl-C, a callback's error: the counters so far, to
// resume from).
template <class T, class F>
void run_training(Recorder& rec, const py::object& early, const ft::ParamStore<T>& store, F&& train) {
    ft::EarlyStopState<T> es = read_early(early, store);
    try {
        rec.run([&](const ft::StepHook& h) { train(h, &es); });
    } catch (...) {
        // the counters so far — unless no step ran (the core refused the call, e.g. bad data): the state is
        // then as it was given, and the caller's dict is left untouched
        if (rec.stepped) write_early(early, es, store);
        throw;
    }
    write_early(early, es, store);
}

// Data parallelism (training.hpp's Replicas) from the Python object training.py makes (distributed.py):
// its `rank` and `world`, and `sum(grad, figures)`, which adds up over the ranks, in place, the flat gradient
// (a zero-copy numpy view of the model's buffer, or None) and the float64 figures. None: one process.
template <class T>
struct ReplicasArg {
    ft::Replicas<T> r;
    bool on = false;
    ReplicasArg(const py::object& obj, const py::object& model, ft::ParamStore<T>& store) {
        if (obj.is_none()) return;
        r.rank = int_arg(obj.attr("rank"), "rank");
        r.world = int_arg(obj.attr("world"), "world");
        py::object sum = obj.attr("sum");
        T* base = store.grad();
        const index_t size = store.size();
        r.sum = [sum, model, base, size](T* g, index_t n, double* v, index_t k) {
            ft::FpCallerEnv caller_env;  // Python (and the transport) in the caller's FP environment
            py::gil_scoped_acquire gil;
            py::object grad = py::none();
            if (g) {
                if (g != base || n != size) throw ft::ValueError("data parallel: the gradient is not the model's flat buffer");
                grad = py::array(py::dtype::of<T>(), {py::ssize_t(n)}, {py::ssize_t(sizeof(T))}, g, model);  // no copy
            }
            py::array_t<double> figures{py::ssize_t(k)};
            std::copy(v, v + k, figures.mutable_data());
            sum(grad, figures);
            std::copy(figures.data(), figures.data() + k, v);
            if (PyErr_CheckSignals() != 0) throw py::error_already_set();  // Ctrl-C: before the update
        };
        r.check();
        on = true;
    }
    const ft::Replicas<T>* get() const { return on ? &r : nullptr; }
};

template <class T>
struct type_tag {
    using type = T;
};
}  // namespace


void register_training(py::module_& m) {
    // A non-finite loss or gradient norm under nonfinite='raise' (training.hpp): FloatingPointError.
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const ft::NonFiniteError& e) {
            PyErr_SetString(PyExc_FloatingPointError, e.what());
        }
    });
    // Algorithms 13 and 12 share the binding: a model, one data set, optional validation data.
    auto single_data = [&m](const char* fname, auto train, auto unit_tag, const char* listing, const char* cls) {
        using Unit = typename decltype(unit_tag)::type;
        m.def(
            fname,
            [train, listing, cls](const py::object& model, const py::handle& x_data, const py::dict& options,
                                  const py::object& optimizer, const py::object& hook, const py::handle& val,
                                  const py::object& sink, const py::object& early, const py::object& replicas,
                                  const py::handle& prefix_len, const py::handle& val_prefix_len) {
                if (!py::isinstance<Unit>(model))
                    throw ft::TypeError(std::string(listing) + " trains a " + cls + ", got " +
                                        py::str(py::type::handle_of(model).attr("__name__")).cast<std::string>());
                Unit& d = model.cast<Unit&>();
                const ft::TrainOptions o = parse_options(options);
                CallLock lock(d.mutex);
                d.visit([&](auto& mdl) {
                    using T = typename std::decay_t<decltype(mdl.store)>::value_type;
                    ft::Dataset data = dataset(x_data, "x_data");
                    ft::Dataset vdata;
                    if (!val.is_none()) vdata = dataset(val, "val_data");
                    data.prefix = prefix_lens(prefix_len, data.size());  // V7 (DTraining; checked by the core)
                    if (!val.is_none()) vdata.prefix = prefix_lens(val_prefix_len, vdata.size());
                    auto update = update_rule<T>(optimizer, model, mdl.store, o);
                    ReplicasArg<T> dp(replicas, model, mdl.store);
                    Recorder rec{sink, hook};
                    rec.warn_nonfinite = o.nonfinite == ft::TrainOptions::NonFinite::Warn;
                    run_training(rec, early, mdl.store, [&](const ft::StepHook& h, ft::EarlyStopState<T>* es) {
                        train(mdl, data, o, update, h, val.is_none() ? nullptr : &vdata, es, dp.get());
                    });
                });
            },
            py::arg("model"), py::arg("x_data"), py::arg("options"), py::arg("optimizer"), py::arg("hook") = py::none(),
            py::arg("val_data") = py::none(), py::arg("history") = py::none(), py::arg("early_stopping") = py::none(),
            py::arg("replicas") = py::none(), py::arg("prefix_len") = py::none(), py::arg("val_prefix_len") = py::none());
    };
    single_data(
        "_dtraining", [](auto& mdl, auto&&... a) { ft::DTraining(mdl, a...); }, type_tag<AnyDtype<ft::DTransformer>>{},
        "DTraining", "DTransformer");
    single_data(
        "_etraining", [](auto& mdl, auto&&... a) { ft::ETraining(mdl, a...); }, type_tag<AnyDtype<ft::ETransformer>>{},
        "ETraining", "ETransformer");
    m.def(
        "_edtraining",
        [](const py::object& model, const py::handle& z_data, const py::handle& x_data, const py::dict& options,
           const py::object& optimizer, const py::object& hook, const py::handle& z_val, const py::handle& x_val,
           const py::object& sink, const py::object& early, const py::object& replicas) {
            if (!py::isinstance<AnyDtype<ft::EDTransformer>>(model))
                throw ft::TypeError("EDTraining trains an EDTransformer, got " +
                                    py::str(py::type::handle_of(model).attr("__name__")).cast<std::string>());
            auto& d = model.cast<AnyDtype<ft::EDTransformer>&>();
            const ft::TrainOptions o = parse_options(options);
            if (z_val.is_none() != x_val.is_none()) throw ft::ValueError("give both z_val and x_val, or neither");
            CallLock lock(d.mutex);
            d.visit([&](auto& mdl) {
                using T = typename std::decay_t<decltype(mdl.store)>::value_type;
                ft::Dataset zd = dataset(z_data, "z_data");
                ft::Dataset xd = dataset(x_data, "x_data");
                ft::Dataset zv, xv;
                if (!z_val.is_none()) {
                    zv = dataset(z_val, "z_val");
                    xv = dataset(x_val, "x_val");
                }
                auto update = update_rule<T>(optimizer, model, mdl.store, o);
                ReplicasArg<T> dp(replicas, model, mdl.store);
                Recorder rec{sink, hook};
                rec.warn_nonfinite = o.nonfinite == ft::TrainOptions::NonFinite::Warn;
                run_training(rec, early, mdl.store, [&](const ft::StepHook& h, ft::EarlyStopState<T>* es) {
                    ft::EDTraining<T>(mdl, zd, xd, o, update, h, z_val.is_none() ? nullptr : &zv,
                                      x_val.is_none() ? nullptr : &xv, es, dp.get());
                });
            });
        },
        py::arg("model"), py::arg("z_data"), py::arg("x_data"), py::arg("options"), py::arg("optimizer"),
        py::arg("hook") = py::none(), py::arg("z_val") = py::none(), py::arg("x_val") = py::none(),
        py::arg("history") = py::none(), py::arg("early_stopping") = py::none(), py::arg("replicas") = py::none());
    m.def(
        "_flat_params",
        [](const py::object& model) {
            auto flat = [&model](auto& store) {
                using T = typename std::decay_t<decltype(store)>::value_type;
                py::array a(py::dtype::of<T>(), {py::ssize_t(store.size())}, {py::ssize_t(sizeof(T))}, store.theta(), model);
                a.attr("setflags")(py::arg("write") = false);
                return a;
            };
            if (py::isinstance<AnyDtype<ft::DTransformer>>(model)) return model.cast<AnyDtype<ft::DTransformer>&>().visit([&](auto& m) { return flat(m.store); });
            if (py::isinstance<AnyDtype<ft::ETransformer>>(model)) return model.cast<AnyDtype<ft::ETransformer>&>().visit([&](auto& m) { return flat(m.store); });
            if (py::isinstance<AnyDtype<ft::EDTransformer>>(model)) return model.cast<AnyDtype<ft::EDTransformer>&>().visit([&](auto& m) { return flat(m.store); });
            throw ft::TypeError("_flat_params takes a DTransformer, ETransformer or EDTransformer");
        },
        py::arg("model"),
        "θ as one read-only 1-D array (no copy: the model's flat buffer, in parameter order), e.g. to fingerprint it.");
    m.def(
        "_mask_tokens",
        [](const py::handle& x, const PyInt& mask_token, double p_mask, const py::object& seed) {
            if (!(p_mask > 0 && p_mask < 1)) throw ft::ValueError("p_mask must be in (0, 1)");
            InIds in = in_ids(x, "x", std::numeric_limits<index_t>::max(), false);
            py::array_t<long long> out(py::ssize_t(in.ids.size()));
            std::vector<index_t> xt(in.ids.size());
            ft::Rng rng(seed_arg(seed));
            ft::mask_tokens(in.ids.data(), index_t(in.ids.size()), index_t(int_arg(mask_token, "mask_token")), p_mask, rng, xt.data());
            std::copy(xt.begin(), xt.end(), out.mutable_data());
            return out;
        },
        py::arg("x"), py::arg("mask_token"), py::arg("p_mask"), py::arg("seed"),
        "Algorithm 12 lines 4–6 on one sequence (the masking ETraining applies), for inspection and tests.");
    m.def(
        "learning_rate",
        [](const py::dict& options, const PyInt& step, const PyInt& total) {
            py::dict o2 = options;
            return ft::learning_rate(parse_options(o2), int_arg(step, "step"), int_arg(total, "total"));
        },
        py::arg("options"), py::arg("step"), py::arg("total"),
        "η at 1-based `step` of `total` under the options' schedule (warmup, schedule, eta, min_lr).");
    m.def(
        "check_training_options", [](const py::dict& options) { parse_options(options); }, py::arg("options"),
        "The trainers' options as the core reads them (ft::TrainOptions::check): TypeError / ValueError naming a "
        "bad one. The trainers call it when they are made, so a bad option fails there, not at the first step.");
}


}  // namespace ftpy
