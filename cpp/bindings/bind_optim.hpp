// The Python optimizer objects (ft.Adam, ft.SGD), shared by register_optim.cpp and the trainers.
#pragma once

#include "bind.hpp"
#include "formal_transformers/training.hpp"

namespace ftpy {

// Optimizer state is created at the first step, in the dtype of the stepped object, and stays bound to it.
struct AdamPy {
    double lr, beta1, beta2, eps, weight_decay;
    bool decoupled;
    std::variant<std::monostate, std::unique_ptr<ft::Adam<float>>, std::unique_ptr<ft::Adam<double>>> state;
    py::object bound;  // the object whose moments these are (held, so its identity cannot be reused)

    // The Adam state of `owner` (whose parameters are `store`): created at the first step, in its dtype.
    template <class T>
    ft::Adam<T>& get(const py::object& owner, ft::ParamStore<T>& store) {
        using P = std::unique_ptr<ft::Adam<T>>;
        if (std::holds_alternative<std::monostate>(state)) {
            state = std::make_unique<ft::Adam<T>>(lr, beta1, beta2, eps, weight_decay, decoupled);
            bound = owner;
        }
        if (!std::holds_alternative<P>(state) || !bound.is(owner))
            throw ft::ValueError("this Adam holds the moments of another model; use one optimizer per model");
        return *std::get<P>(state);
    }
};

struct SGDPy {
    double lr;
};

// train(rule) with the update rule of an optimizer object (ft.Adam / ft.SGD) for a store of dtype T: what
// line 6 of Algorithms 11–13 does in the trainers (ft::AdamRule, ft::SGDRule: called directly, no
// std::function). The object's lr must be the trainer's η (ValueError naming both); TypeError for anything else.
template <class T, class F>
void with_update_rule(const py::object& optimizer, const py::object& owner, ft::ParamStore<T>& store,
                      const ft::TrainOptions& o, F&& train) {
    if (py::isinstance<AdamPy>(optimizer)) {
        AdamPy& a = optimizer.cast<AdamPy&>();
        ft::check_optimizer_lr(a.lr, o);
        train(ft::update_rule(a.get(owner, store)));
    } else if (py::isinstance<SGDPy>(optimizer)) {
        ft::check_optimizer_lr(optimizer.cast<SGDPy&>().lr, o);
        train(ft::SGDRule<T>{});
    } else {
        throw ft::TypeError("optimizer must be 'adam', 'sgd', an ft.Adam or an ft.SGD");
    }
}

}  // namespace ftpy
