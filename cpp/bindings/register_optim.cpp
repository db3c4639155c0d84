// ft.Adam and ft.SGD: `step(obj, grads)` for any object with parameters (models and components).
#include <cmath>

#include "bind_optim.hpp"

namespace ftpy {

namespace {
// The flat gradient to step with. `grads` may be obj.grads (zero-copy: used in place), a mapping
// name -> array with exactly the keys of obj.params (copied into obj's gradient buffer, after every
// name and shape is checked), or None (obj.grads as it is).
template <class T>
const T* gradient_buffer(ft::ParamStore<T>& store, const py::object& grads) {
    if (grads.is_none()) return store.grad();
    if (py::isinstance<ParamDict>(grads)) {
        const ParamDict& pd = grads.cast<const ParamDict&>();
        if (!pd.arrays().empty() && !store.entries().empty() &&
            pd.arrays()[0].data() == static_cast<const void*>(store.grad() + store.entries()[0].offset))
            return store.grad();  // obj.grads itself
    }
    if (!py::hasattr(grads, "keys") || !py::hasattr(grads, "__getitem__"))
        throw ft::TypeError("grads must be a mapping name -> array (e.g. model.grads or the dict from loss_and_grad)");
    // check everything before writing anything
    std::vector<std::pair<const ft::ParamInfo*, py::array>> items;
    for (auto key : grads.attr("keys")()) {
        if (!py::isinstance<py::str>(key)) throw ft::TypeError("grads keys must be parameter names (str)");
        const std::string name = key.cast<std::string>();
        const ft::ParamInfo* e = store.find(name);
        if (!e) throw ft::ValueError("grads has '" + name + "', which is not a parameter of this object");
        py::array a = py::module_::import("numpy").attr("asarray")(grads[key]);
        if (a.dtype().kind() != 'f') throw ft::TypeError("grads['" + name + "'] must be a float array, got " + py::str(a.dtype()).cast<std::string>());
        bool same = a.ndim() == py::ssize_t(e->shape.size());
        for (py::ssize_t i = 0; same && i < a.ndim(); ++i) same = a.shape(i) == e->shape[std::size_t(i)];
        if (!same) throw ft::ValueError("grads['" + name + "'] has shape " + shape_str(a) + ", the parameter has another");
        items.emplace_back(e, a);
    }
    for (const ft::ParamInfo& e : store.entries()) {
        bool found = false;
        for (auto& it : items) found |= it.first == &e;
        if (!found && e.trainable) throw ft::ValueError("grads lacks '" + e.name + "'");
    }
    for (auto& it : items) {  // copy into the gradient buffer through a view with the parameter's layout
        const ft::ParamInfo* e = it.first;
        std::vector<py::ssize_t> shape(e->shape.begin(), e->shape.end()), strides;
        for (index_t s : e->strides) strides.push_back(py::ssize_t(s * index_t(sizeof(T))));
        py::array dst(py::dtype::of<T>(), shape, strides, store.grad() + e->offset, py::none());
        py::module_::import("numpy").attr("copyto")(dst, it.second, py::arg("casting") = "same_kind");
    }
    return store.grad();
}

}  // namespace

void register_optim(py::module_& m) {
    py::class_<AdamPy>(m, "Adam", R"doc(Adam (Kingma & Ba 2015) with bias correction; one loop over the flat parameter buffer.

Adam(lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, decoupled=True). weight_decay with
decoupled=True is AdamW's θ ← θ(1 − lr·λ); decoupled=False is the L2 form g ← g + λθ (torch.optim.Adam's).
step(obj, grads=None): one update of obj's parameters (any model or component) from grads (obj.grads
when None, zero-copy; or a dict name -> array such as loss_and_grad's). The moments are created at the first
step and belong to that object. Fixed parameters (sinusoidal W_p) are never changed.)doc")
        .def(py::init([](double lr, double beta1, double beta2, double eps, double weight_decay, bool decoupled) {
                 ft::Adam<double> check(lr, beta1, beta2, eps, weight_decay, decoupled);  // validates the values
                 return AdamPy{lr, beta1, beta2, eps, weight_decay, decoupled, {}, py::none()};
             }),
             py::arg("lr") = 1e-3, py::arg("beta1") = 0.9, py::arg("beta2") = 0.999, py::arg("eps") = 1e-8,
             py::arg("weight_decay") = 0.0, py::arg("decoupled") = true)
        .def(
            "step",
            [](AdamPy& a, const py::object& obj, const py::object& grads, const py::object& lr) {
                if (!py::isinstance<HasParams>(obj))
                    throw ft::TypeError("step() needs an object with parameters (a model or component), got " +
                                        py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>());
                HasParams& h = obj.cast<HasParams&>();
                const double lr_now = lr.is_none() ? -1.0 : float_arg(lr, "lr");
                if (!lr.is_none() && (!(lr_now >= 0) || !std::isfinite(lr_now))) throw ft::ValueError("lr must be a finite number >= 0");
                CallLock lock(h.mutex);
                std::visit([&](auto* store) {
                    using T = typename std::decay_t<decltype(*store)>::value_type;
                    ft::Adam<T>& opt = a.get(obj, *store);
                    const T* g = gradient_buffer(*store, grads);
                    CoreCall nogil;
                    // bf16-mixed: θ's bf16 copy (TrainProducts) written with θ, so the next call only reads it
                    if constexpr (std::is_same_v<T, float>) opt.bf16_copy = h.bf16_theta.get();
                    struct Detach {
                        ft::Adam<T>& o;
                        ~Detach() { o.bf16_copy = nullptr; }
                    } detach{opt};
                    opt.step(*store, g, lr_now);
                }, h.store_ref());
            },
            py::arg("obj"), py::arg("grads") = py::none(), py::arg("lr") = py::none(),
            "One Adam step; `lr` overrides the learning rate for this step (schedules).")
        .def_readwrite("lr", &AdamPy::lr)
        .def(
            "state_dict",
            [](const AdamPy& a) {
                py::dict d;
                d["t"] = 0;
                std::visit([&](auto& s) {
                    if constexpr (!std::is_same_v<std::decay_t<decltype(s)>, std::monostate>) {
                        d["t"] = s->t;
                        d["m"] = py::array(py::dtype::of<typename std::decay_t<decltype(*s)>::value_type>(),
                                           {py::ssize_t(s->m.size())}, {}, s->m.data()).attr("copy")();
                        d["v"] = py::array(py::dtype::of<typename std::decay_t<decltype(*s)>::value_type>(),
                                           {py::ssize_t(s->v.size())}, {}, s->v.data()).attr("copy")();
                        py::array_t<std::int64_t> r({py::ssize_t(s->ranges.size()), py::ssize_t(2)});
                        for (std::size_t k = 0; k < s->ranges.size(); ++k)
                            r.mutable_at(py::ssize_t(k), 0) = s->ranges[k].first, r.mutable_at(py::ssize_t(k), 1) = s->ranges[k].second;
                        d["ranges"] = r;
                    }
                }, a.state);
                return d;
            },
            "Steps taken, the moments m, v of the trainable parameters (flat, in parameter order) and `ranges`, the "
            "(k, 2) [begin, end) offsets of the flat θ they cover: enough to resume.")
        .def(
            "load_state_dict",
            [](AdamPy& a, const py::object& obj, const py::dict& d) {
                if (!py::isinstance<HasParams>(obj)) throw ft::TypeError("load_state_dict(obj, state): obj must have parameters");
                HasParams& h = obj.cast<HasParams&>();
                const long long t = int_arg(d["t"], "state['t']");
                if (t < 0) throw ft::ValueError("state['t'] must be >= 0");
                std::visit([&](auto* store) {
                    using T = typename std::decay_t<decltype(*store)>::value_type;
                    const py::object mo = d.contains("m") ? py::object(d["m"]) : py::object(py::none());
                    const py::object vo = d.contains("v") ? py::object(d["v"]) : py::object(py::none());
                    auto m = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(mo);
                    auto v = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(vo);
                    if (PyErr_Occurred()) PyErr_Clear();  // ensure() of None sets an error; handled below
                    // the ranges of θ the moments cover: given (state_dict's), else every trainable parameter
                    // (a state without them holds moments of the whole flat θ, or of the trainable ones)
                    std::vector<std::pair<index_t, index_t>> ranges;
                    if (d.contains("ranges")) {
                        auto r = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(d["ranges"]);
                        if (!r || r.ndim() != 2 || r.shape(1) != 2)
                            throw ft::ValueError("state['ranges'] must be a (k, 2) integer array of [begin, end) offsets");
                        index_t end = 0;
                        for (py::ssize_t k = 0; k < r.shape(0); ++k) {
                            const index_t b = index_t(r.at(k, 0)), e = index_t(r.at(k, 1));
                            if (b < end || e <= b || e > store->size())
                                throw ft::ValueError("state's moments do not fit: state['ranges'] must be increasing, non-empty ranges of this object's " +
                                                     std::to_string(store->size()) + " parameters");
                            ranges.emplace_back(b, e);
                            end = e;
                        }
                    } else {
                        ranges = store->trainable_ranges();
                    }
                    index_t n = 0;
                    for (const auto& r : ranges) n += r.second - r.first;
                    const bool whole = !d.contains("ranges") && m && v && index_t(m.size()) == store->size() &&
                                       index_t(v.size()) == store->size() && n != store->size();
                    if (t > 0 && !whole && (!m || !v || index_t(m.size()) != n || index_t(v.size()) != n))
                        throw ft::ValueError("state's moments do not match this object's " + std::to_string(n) +
                                             " trainable parameters");
                    a.state = std::monostate{};
                    ft::Adam<T>& opt = a.get(obj, *store);
                    opt.t = t;
                    if (t > 0) {
                        opt.ranges = ranges;
                        opt.m = ft::Vector<T>::from_shape({std::size_t(n)});
                        opt.v = ft::Vector<T>::from_shape({std::size_t(n)});
                        index_t at = 0;
                        for (const auto& r : ranges) {  // whole: the trainable ranges' entries of the flat moments
                            const index_t from = whole ? r.first : at, len = r.second - r.first;
                            std::copy(m.data() + from, m.data() + from + len, opt.m.data() + at);
                            std::copy(v.data() + from, v.data() + from + len, opt.v.data() + at);
                            at += len;
                        }
                    }
                }, h.store_ref());
            },
            py::arg("obj"), py::arg("state"), "Bind this optimizer to obj with the given state (from state_dict).")
        .def_readonly("beta1", &AdamPy::beta1)
        .def_readonly("beta2", &AdamPy::beta2)
        .def_readonly("eps", &AdamPy::eps)
        .def_readonly("weight_decay", &AdamPy::weight_decay)
        .def_readonly("decoupled", &AdamPy::decoupled)
        .def_property_readonly("t", [](const AdamPy& a) -> long long {
            return std::visit([](auto& s) -> long long {
                if constexpr (std::is_same_v<std::decay_t<decltype(s)>, std::monostate>) return 0;
                else return s->t;
            }, a.state);
        }, "Steps taken.")
        .def("__repr__", [](const AdamPy& a) {
            return "Adam(lr=" + py::repr(py::float_(a.lr)).cast<std::string>() + ", beta1=" + py::repr(py::float_(a.beta1)).cast<std::string>() +
                   ", beta2=" + py::repr(py::float_(a.beta2)).cast<std::string>() + ", eps=" + py::repr(py::float_(a.eps)).cast<std::string>() +
                   ", weight_decay=" + py::repr(py::float_(a.weight_decay)).cast<std::string>() + ", decoupled=" + (a.decoupled ? "True" : "False") + ")";
        });

    py::class_<SGDPy>(m, "SGD", R"doc(The listings' update (Algorithms 11–13, line 6): θ ← θ − lr · ∇loss(θ).

step(obj, grads=None, lr=None) as Adam.step.)doc")
        .def(py::init([](double lr) {
                 ft::SGD<double> check(lr);
                 return SGDPy{lr};
             }),
             py::arg("lr"))
        .def(
            "step",
            [](SGDPy& s, const py::object& obj, const py::object& grads, const py::object& lr) {
                if (!py::isinstance<HasParams>(obj))
                    throw ft::TypeError("step() needs an object with parameters (a model or component)");
                HasParams& h = obj.cast<HasParams&>();
                const double lr_now = lr.is_none() ? s.lr : float_arg(lr, "lr");
                if (!(lr_now >= 0) || !std::isfinite(lr_now)) throw ft::ValueError("lr must be a finite number >= 0");
                CallLock lock(h.mutex);
                std::visit([&](auto* store) {
                    using T = typename std::decay_t<decltype(*store)>::value_type;
                    const T* g = gradient_buffer(*store, grads);
                    CoreCall nogil;
                    ft::SGD<T>(lr_now).step(*store, g);
                }, h.store_ref());
            },
            py::arg("obj"), py::arg("grads") = py::none(), py::arg("lr") = py::none())
        .def_readwrite("lr", &SGDPy::lr)
        .def("__repr__", [](const SGDPy& s) { return "SGD(lr=" + py::repr(py::float_(s.lr)).cast<std::string>() + ")"; });
}


}  // namespace ftpy
