// Algorithms 11–13: the C++ loops behind ft.DTraining / ft.ETraining / ft.EDTraining (training.py adds
// the Python conveniences: progress bar, callbacks, history). The loop runs with the GIL released; the
// per-step hook takes it back briefly.
#include "bind_optim.hpp"
#include "formal_transformers/training.hpp"

namespace ftpy {

namespace {
ft::TrainOptions parse_options(const py::dict& d) {
    ft::TrainOptions o;
    for (auto kv : d) {
        const std::string k = kv.first.cast<std::string>();
        py::handle v = kv.second;
        if (k == "n_epochs") o.n_epochs = v.cast<long long>();
        else if (k == "eta") o.eta = v.cast<double>();
        else if (k == "batch_size") o.batch_size = v.cast<long long>();
        else if (k == "shuffle") o.shuffle = v.cast<bool>();
        else if (k == "seed") o.seed = v.cast<unsigned long long>();
        else if (k == "warmup") o.warmup = v.cast<long long>();
        else if (k == "min_lr") o.min_lr = v.cast<double>();
        else if (k == "clip") o.clip = v.cast<double>();
        else if (k == "max_steps") o.max_steps = v.cast<long long>();
        else if (k == "eval_every") o.eval_every = v.cast<long long>();
        else if (k == "p_mask") o.p_mask = v.cast<double>();
        else if (k == "reduction") {
            const std::string r = v.cast<std::string>();
            if (r == "sum") o.reduction = ft::TrainOptions::Reduction::Sum;
            else if (r == "mean") o.reduction = ft::TrainOptions::Reduction::Mean;
            else throw ft::ValueError("reduction must be 'sum' (the listing's loss per sequence) or 'mean' (per token), got '" + r + "'");
        } else if (k == "schedule") {
            const std::string r = v.cast<std::string>();
            if (r == "constant") o.schedule = ft::TrainOptions::Schedule::Constant;
            else if (r == "cosine") o.schedule = ft::TrainOptions::Schedule::Cosine;
            else if (r == "linear") o.schedule = ft::TrainOptions::Schedule::Linear;
            else throw ft::ValueError("schedule must be 'constant', 'cosine' or 'linear', got '" + r + "'");
        } else {
            throw ft::ValueError("unknown training option '" + k + "'");
        }
    }
    o.check();
    return o;
}

ft::Dataset dataset(const py::handle& obj, const char* what, index_t n_vocab, index_t l_max) {
    InBatch b = in_batch(obj, what, n_vocab, l_max);
    ft::Dataset d;
    d.ids = std::move(b.ids);
    d.s = ft::Seqs::from_lengths(b.lengths);
    return d;
}

// The step hook: the Python callable gets a dict of the step's figures; False stops training.
ft::StepHook python_hook(const py::object& fn) {
    if (fn.is_none()) return {};
    return [fn](const ft::StepInfo& s) {
        py::gil_scoped_acquire gil;
        if (PyErr_CheckSignals() != 0) throw py::error_already_set();  // Ctrl-C between steps
        py::dict d;
        d["step"] = s.step;
        d["epoch"] = s.epoch;
        d["total_steps"] = s.total_steps;
        d["loss"] = s.loss;
        d["lr"] = s.lr;
        d["grad_norm"] = s.grad_norm;
        d["tokens"] = s.tokens;
        d["val_loss"] = s.val_loss >= 0 ? py::object(py::float_(s.val_loss)) : py::object(py::none());
        d["val_accuracy"] = s.val_accuracy >= 0 ? py::object(py::float_(s.val_accuracy)) : py::object(py::none());
        py::object r = fn(d);
        return r.is_none() || r.cast<bool>();
    };
}

template <template <class> class Unit>
Dual<Unit>& model_of(const py::object& model, const char* listing, const char* cls) {
    if (!py::isinstance<Dual<Unit>>(model))
        throw ft::TypeError(std::string(listing) + " trains a " + cls + ", got " +
                            py::str(py::type::handle_of(model).attr("__name__")).cast<std::string>());
    return model.cast<Dual<Unit>&>();
}
}  // namespace

template <class T>
using DUnitT = ft::DTransformer<T>;
template <class T>
using EUnitT = ft::ETransformer<T>;
template <class T>
using EDUnitT = ft::EDTransformer<T>;

void register_training(py::module_& m) {
    m.def(
        "_dtraining",
        [](const py::object& model, const py::handle& x_data, const py::dict& options, const py::object& optimizer,
           const py::object& hook, const py::handle& val) {
            auto& d = model_of<DUnitT>(model, "DTraining", "DTransformer");
            const ft::TrainOptions o = parse_options(options);
            CallLock lock(d.mutex);
            d.visit([&](auto& mdl) {
                using T = typename std::decay_t<decltype(mdl.store)>::value_type;
                ft::Dataset data = dataset(x_data, "x_data", mdl.cfg.n_vocab, mdl.cfg.l_max);
                ft::Dataset vdata;
                if (!val.is_none()) vdata = dataset(val, "val_data", mdl.cfg.n_vocab, mdl.cfg.l_max);
                auto update = update_rule<T>(optimizer, mdl.store);
                auto h = python_hook(hook);
                py::gil_scoped_release nogil;
                ft::DTraining<T>(mdl, data, o, update, h, val.is_none() ? nullptr : &vdata);
            });
        },
        py::arg("model"), py::arg("x_data"), py::arg("options"), py::arg("optimizer"), py::arg("hook") = py::none(),
        py::arg("val_data") = py::none());
    m.def(
        "_etraining",
        [](const py::object& model, const py::handle& x_data, const py::dict& options, const py::object& optimizer,
           const py::object& hook, const py::handle& val) {
            auto& d = model_of<EUnitT>(model, "ETraining", "ETransformer");
            const ft::TrainOptions o = parse_options(options);
            CallLock lock(d.mutex);
            d.visit([&](auto& mdl) {
                using T = typename std::decay_t<decltype(mdl.store)>::value_type;
                ft::Dataset data = dataset(x_data, "x_data", mdl.cfg.n_vocab, mdl.cfg.l_max);
                ft::Dataset vdata;
                if (!val.is_none()) vdata = dataset(val, "val_data", mdl.cfg.n_vocab, mdl.cfg.l_max);
                auto update = update_rule<T>(optimizer, mdl.store);
                auto h = python_hook(hook);
                py::gil_scoped_release nogil;
                ft::ETraining<T>(mdl, data, o, update, h, val.is_none() ? nullptr : &vdata);
            });
        },
        py::arg("model"), py::arg("x_data"), py::arg("options"), py::arg("optimizer"), py::arg("hook") = py::none(),
        py::arg("val_data") = py::none());
    m.def(
        "_edtraining",
        [](const py::object& model, const py::handle& z_data, const py::handle& x_data, const py::dict& options,
           const py::object& optimizer, const py::object& hook, const py::handle& z_val, const py::handle& x_val) {
            auto& d = model_of<EDUnitT>(model, "EDTraining", "EDTransformer");
            const ft::TrainOptions o = parse_options(options);
            if (z_val.is_none() != x_val.is_none()) throw ft::ValueError("give both z_val and x_val, or neither");
            CallLock lock(d.mutex);
            d.visit([&](auto& mdl) {
                using T = typename std::decay_t<decltype(mdl.store)>::value_type;
                ft::Dataset zd = dataset(z_data, "z_data", mdl.cfg.n_vocab, mdl.cfg.l_max);
                ft::Dataset xd = dataset(x_data, "x_data", mdl.cfg.n_vocab, mdl.cfg.l_max);
                ft::Dataset zv, xv;
                if (!z_val.is_none()) {
                    zv = dataset(z_val, "z_val", mdl.cfg.n_vocab, mdl.cfg.l_max);
                    xv = dataset(x_val, "x_val", mdl.cfg.n_vocab, mdl.cfg.l_max);
                }
                auto update = update_rule<T>(optimizer, mdl.store);
                auto h = python_hook(hook);
                py::gil_scoped_release nogil;
                ft::EDTraining<T>(mdl, zd, xd, o, update, h, z_val.is_none() ? nullptr : &zv, x_val.is_none() ? nullptr : &xv);
            });
        },
        py::arg("model"), py::arg("z_data"), py::arg("x_data"), py::arg("options"), py::arg("optimizer"),
        py::arg("hook") = py::none(), py::arg("z_val") = py::none(), py::arg("x_val") = py::none());
    m.def(
        "_mask_tokens",
        [](const py::handle& x, long long mask_token, double p_mask, unsigned long long seed) {
            if (!(p_mask > 0 && p_mask < 1)) throw ft::ValueError("p_mask must be in (0, 1)");
            InIds in = in_ids(x, "x", std::numeric_limits<index_t>::max(), false);
            py::array_t<long long> out(py::ssize_t(in.ids.size()));
            std::vector<index_t> xt(in.ids.size());
            ft::Rng rng(seed);
            ft::mask_tokens(in.ids.data(), index_t(in.ids.size()), mask_token, p_mask, rng, xt.data());
            std::copy(xt.begin(), xt.end(), out.mutable_data());
            return out;
        },
        py::arg("x"), py::arg("mask_token"), py::arg("p_mask"), py::arg("seed"),
        "Algorithm 12 lines 4–6 on one sequence (the masking ETraining applies), for inspection and tests.");
    m.def(
        "learning_rate",
        [](const py::dict& options, long long step, long long total) {
            py::dict o2 = options;
            return ft::learning_rate(parse_options(o2), step, total);
        },
        py::arg("options"), py::arg("step"), py::arg("total"),
        "η at 1-based `step` of `total` under the options' schedule (warmup, schedule, eta, min_lr).");
}

static Registrar reg_training(90, "training", &register_training);

}  // namespace ftpy
