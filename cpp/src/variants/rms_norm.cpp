// RMSnorm (Zhang & Sennrich 2019; Gopher, paper §6) as a norm part (registered as norm "rms"): the listing
// and its backward are RMSNorm's (norm.hpp, listings/norm.cpp); γ only, no β.
#include "formal_transformers/parts.hpp"

namespace ft {

template <class T>
std::shared_ptr<const NormPart<T>> make_rms_norm(index_t d, double eps, ParamStore<T>& store, const std::string& gamma,
                                                 const std::string&) {
    return std::make_shared<NormOf<T, RMSNorm<T>>>(RMSNorm<T>(d, eps, store, gamma));
}
template std::shared_ptr<const NormPart<float>> make_rms_norm<float>(index_t, double, ParamStore<float>&, const std::string&,
                                                                     const std::string&);
template std::shared_ptr<const NormPart<double>> make_rms_norm<double>(index_t, double, ParamStore<double>&,
                                                                       const std::string&, const std::string&);

}  // namespace ft
