// Algorithms 11–13: the C++ loops behind ft.DTraining / ft.ETraining / ft.EDTraining (training.py adds
// the Python conveniences: progress bar, callbacks, history). The loop runs with the GIL released; the
// per-step hook takes it back briefly.
#include <chrono>

#include "bind_optim.hpp"
#include "formal_transformers/training.hpp"

namespace ftpy {

namespace {
// The trainers' options, parsed once from their keyword arguments by the core's schema (ft::TrainOptions::
// from_options) when a trainer is made, and handed to every call: `_TrainOptions(listing, options, optimizer)`
// with `optimizer` "adam", "sgd" (options too) or an ft.Adam / ft.SGD object (eta None: its lr).
struct TrainOptionsPy {
    ft::Listing listing;
    ft::TrainOptions o;
};

ft::Listing listing_of(const std::string& name) {
    for (ft::Listing l : {ft::Listing::D, ft::Listing::E, ft::Listing::ED})
        if (name == ft::listing_name(l)) return l;
    throw ft::ValueError("listing must be 'DTraining', 'ETraining' or 'EDTraining', got '" + name + "'");
}

// trainable=: a name or pattern (str), or an iterable of them, as the schema's one string (one per line).
ft::OptionValue patterns_value(const py::handle& v) {
    std::vector<py::object> items;
    if (py::isinstance<py::str>(v)) items.push_back(py::reinterpret_borrow<py::object>(v));
    else if (py::hasattr(v, "__iter__") && !py::isinstance<py::bytes>(v) && !py::isinstance<py::dict>(v))
        for (auto x : v) items.push_back(py::reinterpret_borrow<py::object>(x));
    else
        throw ft::TypeError("trainable must be a list of parameter names or glob patterns (or None), got " +
                            py::str(py::type::handle_of(v).attr("__name__")).cast<std::string>());
    if (items.empty()) throw ft::ValueError("trainable is empty: nothing would train (None trains every parameter)");
    std::string text;
    for (std::size_t k = 0; k < items.size(); ++k) {
        if (!py::isinstance<py::str>(items[k]))
            throw ft::TypeError("trainable must hold str names or patterns, got " +
                                py::str(py::type::handle_of(items[k]).attr("__name__")).cast<std::string>());
        const std::string p = items[k].cast<std::string>();
        if (p.find('\n') != std::string::npos) throw ft::ValueError("trainable: a pattern holds a newline: " + py::repr(items[k]).cast<std::string>());
        if (p.empty()) throw ft::ValueError("trainable: an empty pattern matches no parameter");
        text += (k ? "\n" : "") + p;
    }
    return text;
}

TrainOptionsPy parse_options(const std::string& listing, const py::dict& options, const py::object& optimizer) {
    TrainOptionsPy r{listing_of(listing), {}};
    ft::Options keywords;
    double lr = 0;
    const double* optimizer_lr = nullptr;
    if (py::isinstance<AdamPy>(optimizer)) lr = optimizer.cast<AdamPy&>().lr, optimizer_lr = &lr;
    else if (py::isinstance<SGDPy>(optimizer)) lr = optimizer.cast<SGDPy&>().lr, optimizer_lr = &lr;
    else if (py::isinstance<py::str>(optimizer)) keywords.emplace_back("optimizer", optimizer.cast<std::string>());
    else throw ft::TypeError("optimizer must be 'adam', 'sgd', an ft.Adam or an ft.SGD, got " +
                             py::str(py::type::handle_of(optimizer).attr("__name__")).cast<std::string>());
    for (auto kv : options) {
        const std::string name = kv.first.cast<std::string>();
        if (name == "trainable" && !kv.second.is_none()) {
            keywords.emplace_back(name, patterns_value(kv.second));
            continue;
        }
        keywords.emplace_back(name, option_value(kv.second, name));
    }
    r.o = ft::TrainOptions::from_options(r.listing, keywords, optimizer_lr);
    return r;
}

py::object py_value(const ft::OptionValue& v) {
    return std::visit([](const auto& x) -> py::object {
        using V = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<V, std::monostate>) return py::none();
        else return py::cast(x);
    }, v);
}

// z_data of EDTraining whose encoder takes features (the audio encoder, V28: spectrograms): N matrices (N, rows, T) of
// floats, or a list of (rows, T_n) arrays with one row count; columns laid out one after the other (Dataset::features).
// NaN or infinities: ValueError; the rows against the model: the part's check.
ft::Dataset audio_dataset(const py::handle& obj, const char* what) {
    std::vector<py::array_t<double, py::array::c_style | py::array::forcecast>> specs;
    const bool is_array = py::isinstance<py::array>(obj);
    if (is_array && py::reinterpret_borrow<py::array>(obj).ndim() == 3) {
        py::array whole = py::reinterpret_borrow<py::array>(obj);
        for (py::ssize_t n = 0; n < whole.shape(0); ++n)
            specs.push_back(py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(whole[py::int_(n)]));
    } else if (!is_array) {
        for (const py::handle& a : obj) specs.push_back(py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(a));
    } else {
        throw ft::ValueError(std::string(what) + ": features must be (N, rows, T) or a list of (rows, T) arrays");
    }
    ft::Dataset d;
    std::vector<index_t> lens;
    for (const auto& a : specs) {
        if (!a || a.ndim() != 2)
            throw ft::ValueError(std::string(what) + ": each feature matrix must be a 2-D array (rows, T) of floats");
        const index_t M = index_t(a.shape(0)), Tn = index_t(a.shape(1));
        if (d.feature_rows == 0) d.feature_rows = M;
        if (M != d.feature_rows || M < 1 || Tn < 1)
            throw ft::ValueError(std::string(what) + ": the feature matrices must share their rows and have columns, got (" +
                                 std::to_string(M) + ", " + std::to_string(Tn) + ")");
        const double* p = a.data();
        for (index_t t = 0; t < Tn; ++t)
            for (index_t m = 0; m < M; ++m) {
                const double v = p[m * Tn + t];
                if (!std::isfinite(v)) throw ft::ValueError(std::string(what) + " contains NaN or infinite values");
                d.features.push_back(v);
            }
        lens.push_back(Tn);
    }
    d.s = ft::Seqs::from_lengths(lens);
    return d;
}
// the context z of EDTraining: token sequences, or features (floats: an encoder that takes them, the audio encoder)
bool is_spectrograms(const py::handle& obj) {
    if (is_float_array(obj)) return true;
    if (py::isinstance<py::list>(obj) || py::isinstance<py::tuple>(obj)) {
        py::sequence q = py::reinterpret_borrow<py::sequence>(obj);
        return py::len(q) > 0 && is_float_array(q[0]) && py::reinterpret_borrow<py::array>(q[0]).ndim() == 2;
    }
    return false;
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
            if (after_hook) after_hook();
            return r.is_none() || r.cast<bool>();
        };
    }
    std::function<void()> after_hook;  // after each call of the Python hook (which may have changed θ)
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

// `train(hook, state)` with the GIL released, the early-stopping state read from `early` before and written
// back after, and the record flushed to `rec.sink`, however training ends once a step has run (Ctrl-C, a
// callback's error: the counters so far, to resume from).
template <class T, class F>
void run_training(Recorder& rec, const py::object& early, const ft::ParamStore<T>& store, F&& train) {
    ft::EarlyStopState<T> es = read_early(early, store);
    try {
        {
            LongCoreCall nogil;
            train(rec.step_hook(), &es);
        }
    } catch (...) {
        rec.flush();
        // the counters so far — unless no step ran (the core refused the call, e.g. bad data): the state is
        // then as it was given, and the caller's dict is left untouched
        if (rec.stepped) write_early(early, es, store);
        throw;
    }
    rec.flush();
    write_early(early, es, store);
}

// bf16-mixed training with Adam: θ's bf16 copy for the whole run (TrainProducts), which Adam's steps keep up to date
// as they write θ, brought up to date again after each call of the Python hook (it may change θ). Another update
// rule: no copy (each product rounds θ's operands). Either way the products are a training run's
// (ProductContext::training).
template <class M, class Update, class F>
void with_train_products(HasParams& owner, M& mdl, const Update& update, Recorder& rec, F&& run) {
    if constexpr (std::is_same_v<Update, ft::AdamRule<float>>) {
        TrainProducts products(owner, mdl);
        if (products.copy) {
            struct Detach {
                ft::Adam<float>& adam;
                Recorder& rec;
                ~Detach() { adam.bf16_copy = nullptr, rec.after_hook = nullptr; }
            } detach{*update.adam, rec};
            update.adam->bf16_copy = products.copy;
            rec.after_hook = [&] { products.copy->sync(mdl.store.theta(), mdl.store.size()); };
            run();
            return;
        }
        run();
    } else {
        // no copy, but the products of a training run (ProductContext::training: the small ones through oneDNN)
        std::optional<ft::ProductScope> scope;
        if constexpr (std::is_same_v<typename std::decay_t<decltype(mdl.store)>::value_type, float>)
            if (mdl.precision == ft::Precision::BF16Mixed) scope.emplace(ft::ProductContext{true, nullptr, true});
        run();
    }
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
    py::class_<TrainOptionsPy>(m, "_TrainOptions", "The trainers' options as the core reads them (ft::TrainOptions).")
        .def(py::init(&parse_options), py::arg("listing"), py::arg("options"), py::arg("optimizer") = "adam",
             "Parsed once by the core's schema (train_options.cpp): TypeError for an option the listing does not take or "
             "a value of the wrong type, ValueError for one out of range, each naming the option.")
        .def(
            "as_dict",
            [](const TrainOptionsPy& t) {
                py::dict d;
                for (const auto& [name, v] : t.o.to_options(t.listing)) d[py::str(name)] = py_value(v);
                if (!t.o.trainable.empty()) d["trainable"] = py::cast(t.o.trainable);  // a list, as given
                return d;
            },
            "Every option of the listing with its value, in Python's notation (patience off: None).")
        .def(
            "make_optimizer",
            [](const TrainOptionsPy& t) -> py::object {
                const ft::TrainOptions& o = t.o;
                if (o.optimizer == ft::TrainOptions::Optimizer::SGD) return py::cast(SGDPy{o.eta});
                return py::cast(AdamPy{o.eta, o.beta1, o.beta2, 1e-8, o.weight_decay, true, {}, py::none()});
            },
            "A fresh optimizer of the options (optimizer='adam': Adam(eta, betas, eps=1e-8, weight_decay), "
            "checked with them; 'sgd': SGD(eta)).")
        .def(
            "plan",
            [](const TrainOptionsPy& t, const py::handle& x_data, const py::object& mask_token) {
                ft::Dataset data = dataset(x_data, "x_data");
                const index_t mt = mask_token.is_none() ? -1 : index_t(int_arg(mask_token, "mask_token", 0));
                std::vector<ft::PlannedStep> steps;
                {
                    CoreCall nogil;
                    steps = ft::plan_run(t.o, data, mt);
                }
                py::list out;
                for (const ft::PlannedStep& p : steps) {
                    py::dict d;
                    d["step"] = p.step;
                    d["epoch"] = p.epoch;
                    d["sequences"] = py::array_t<index_t>(py::ssize_t(p.batch.size()), p.batch.data());
                    d["lr"] = p.lr;
                    if (mt >= 0) {
                        py::list masked;
                        std::size_t at = 0;
                        for (index_t n : p.batch) {
                            const std::size_t len = std::size_t(data.s.len(n));
                            masked.append(py::array_t<index_t>(py::ssize_t(len), p.x_tilde.data() + at));
                            at += len;
                        }
                        d["masked"] = masked;
                    }
                    out.append(d);
                }
                return out;
            },
            py::arg("x_data"), py::arg("mask_token") = py::none(),
            "The steps a run on x_data takes (ft::plan_run: the trainers' own plan): per step a dict with step, "
            "epoch, sequences (indices into x_data, in the minibatch's order) and lr; with mask_token (ETraining) "
            "masked, the x̃ of each of those sequences (lines 4–6).")
        .def_static(
            "doc", [](const std::string& listing) { return ft::TrainOptions::doc(listing_of(listing)); },
            py::arg("listing"), "One line per option: name=default and what it does.");

    // Algorithms 13 and 12 share the binding: a model, one data set, optional validation data.
    auto single_data = [&m](const char* fname, auto listing_tag, auto unit_tag, const char* cls) {
        using Unit = typename decltype(unit_tag)::type;
        m.def(
            fname,
            [cls](const py::object& model, const py::handle& x_data, const TrainOptionsPy& options,
                  const py::object& optimizer, const py::object& hook, const py::handle& val, const py::object& sink,
                  const py::object& early, const py::object& replicas, const py::handle& prefix_len,
                  const py::handle& val_prefix_len, const py::handle& x_tilde) {
                constexpr ft::Listing listing = decltype(listing_tag)::value;
                if (!py::isinstance<Unit>(model))
                    throw ft::TypeError(std::string(ft::listing_name(listing)) + " trains a " + cls + ", got " +
                                        py::str(py::type::handle_of(model).attr("__name__")).cast<std::string>());
                Unit& d = model.cast<Unit&>();
                const ft::TrainOptions& o = options.o;
                CallLock lock(d.mutex);
                d.visit([&](auto& mdl) {
                    using T = typename std::decay_t<decltype(mdl.store)>::value_type;
                    ft::Dataset data = dataset(x_data, "x_data");
                    ft::Dataset vdata;
                    if (!val.is_none()) vdata = dataset(val, "val_data");
                    data.prefix = prefix_lens(prefix_len, data.size());  // V7 (DTraining; checked by the core)
                    if (!val.is_none()) vdata.prefix = prefix_lens(val_prefix_len, vdata.size());
                    if (!x_tilde.is_none()) {  // ETraining's fixed masks
                        if (listing != ft::Listing::E) throw ft::TypeError("x_tilde is ETraining's (fixed masks)");
                        ft::Dataset t = dataset(x_tilde, "x_tilde");
                        if (t.s.count() != data.s.count() || t.ids.size() != data.ids.size())
                            throw ft::ValueError("x_tilde must hold one masked sequence per sequence of x_data, of the same lengths");
                        for (index_t n = 0; n < t.s.count(); ++n)
                            if (t.s.len(n) != data.s.len(n))
                                throw ft::ValueError("x_tilde[" + std::to_string(n) + "] has length " + std::to_string(t.s.len(n)) +
                                                     ", x_data[" + std::to_string(n) + "] " + std::to_string(data.s.len(n)));
                        data.tilde = std::move(t.ids);
                    }
                    ReplicasArg<T> dp(replicas, model, mdl.store);
                    Recorder rec{sink, hook};
                    rec.warn_nonfinite = o.nonfinite == ft::TrainOptions::NonFinite::Warn;
                    with_update_rule(optimizer, model, mdl.store, o, [&](const auto& update) {
                        with_train_products(d, mdl, update, rec, [&] {
                            run_training(rec, early, mdl.store, [&](const ft::StepHook& h, ft::EarlyStopState<T>* es) {
                                const ft::Dataset* v = val.is_none() ? nullptr : &vdata;
                                if constexpr (listing == ft::Listing::D) ft::DTraining(mdl, data, o, update, h, v, es, dp.get());
                                else ft::ETraining(mdl, data, o, update, h, v, es, dp.get());
                            });
                        });
                    });
                });
            },
            py::arg("model"), py::arg("x_data"), py::arg("options"), py::arg("optimizer"), py::arg("hook") = py::none(),
            py::arg("val_data") = py::none(), py::arg("history") = py::none(), py::arg("early_stopping") = py::none(),
            py::arg("replicas") = py::none(), py::arg("prefix_len") = py::none(), py::arg("val_prefix_len") = py::none(),
            py::arg("x_tilde") = py::none());
    };
    single_data("_dtraining", std::integral_constant<ft::Listing, ft::Listing::D>{},
                type_tag<AnyDtype<ft::DTransformer>>{}, "DTransformer");
    single_data("_etraining", std::integral_constant<ft::Listing, ft::Listing::E>{},
                type_tag<AnyDtype<ft::ETransformer>>{}, "ETransformer");
    m.def(
        "_edtraining",
        [](const py::object& model, const py::handle& z_data, const py::handle& x_data, const TrainOptionsPy& options,
           const py::object& optimizer, const py::object& hook, const py::handle& z_val, const py::handle& x_val,
           const py::object& sink, const py::object& early, const py::object& replicas) {
            if (!py::isinstance<AnyDtype<ft::EDTransformer>>(model))
                throw ft::TypeError("EDTraining trains an EDTransformer, got " +
                                    py::str(py::type::handle_of(model).attr("__name__")).cast<std::string>());
            auto& d = model.cast<AnyDtype<ft::EDTransformer>&>();
            const ft::TrainOptions& o = options.o;
            if (z_val.is_none() != x_val.is_none()) throw ft::ValueError("give both z_val and x_val, or neither");
            CallLock lock(d.mutex);
            d.visit([&](auto& mdl) {
                using T = typename std::decay_t<decltype(mdl.store)>::value_type;
                ft::Dataset zd = is_spectrograms(z_data) ? audio_dataset(z_data, "z_data") : dataset(z_data, "z_data");
                ft::Dataset xd = dataset(x_data, "x_data");
                ft::Dataset zv, xv;
                if (!z_val.is_none()) {
                    zv = is_spectrograms(z_val) ? audio_dataset(z_val, "z_val") : dataset(z_val, "z_val");
                    xv = dataset(x_val, "x_val");
                }
                ReplicasArg<T> dp(replicas, model, mdl.store);
                Recorder rec{sink, hook};
                rec.warn_nonfinite = o.nonfinite == ft::TrainOptions::NonFinite::Warn;
                with_update_rule(optimizer, model, mdl.store, o, [&](const auto& update) {
                    with_train_products(d, mdl, update, rec, [&] {
                        run_training(rec, early, mdl.store, [&](const ft::StepHook& h, ft::EarlyStopState<T>* es) {
                            ft::EDTraining(mdl, zd, xd, o, update, h, z_val.is_none() ? nullptr : &zv,
                                           x_val.is_none() ? nullptr : &xv, es, dp.get());
                        });
                    });
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
}


}  // namespace ftpy
