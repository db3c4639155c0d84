// Saving and loading models: the safetensors file Python's ft.save writes and ft.load reads
// (python/formal_transformers/io.py), so a model trained in either language opens in the other.
//
//   ft::save(model, "model.safetensors");
//   auto m = ft::load<ft::DTransformer<float>>("model.safetensors");   // the model, by value
//
// The file: an 8-byte little-endian header length, a JSON header naming each parameter of model.params
// ({"dtype": "F32" | "F64", "shape": [...], "data_offsets": [begin, end]}, row-major data) and a
// "__metadata__" object of strings: "formal_transformers.format" ("1"), "formal_transformers.config" (the
// config as ModelConfig::to_json writes it, with the dtype), "formal_transformers.dropout_step" and
// "formal_transformers.dropout_seed" (decimal), and for an ETransformer with given BigBird layouts
// (set_bigbird_layouts, ft.from_hf) "formal_transformers.bigbird_layouts" (bigbird_layouts_json below); then the
// tensors' bytes. A BigBird config without "bigbird_draw" (a file written before it existed) loads with
// bigbird_draw = "per_layer", the rule it was saved under (config.hpp).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "formal_transformers/config.hpp"
#include "formal_transformers/params.hpp"
#include "formal_transformers/transformers.hpp"

namespace ft {

// A file's contents, checked (ValueError naming the file and the problem; the file is read whole).
struct SavedModel {
    std::string path;
    std::map<std::string, std::string> metadata;
    struct Tensor {
        bool f64 = false;
        std::vector<index_t> shape;
        std::size_t begin = 0;  // byte offset of the (row-major) data in `bytes`
    };
    std::map<std::string, Tensor> tensors;
    std::vector<unsigned char> bytes;  // the data section

    static SavedModel read(const std::string& path);
    ModelConfig config() const;  // ModelConfig::from_json of the metadata's config (ValueError when damaged)
    // θ into `store`: every entry present with its shape, no other tensor; converted to T; then the
    // dropout counter and seed (when the file has them). Nothing is written on a failed check.
    template <class T>
    void restore(ParamStore<T>& store, std::uint64_t& dropout_step, std::uint64_t& dropout_seed) const;
    // The file's given BigBird layouts (if it has them) into the model (ValueError naming the file when damaged).
    template <class T>
    void restore_layouts(ETransformer<T>& m) const;
};

// The metadata key of the given BigBird layouts.
inline constexpr const char* kBigBirdLayoutsKey = "formal_transformers.bigbird_layouts";
// The given layouts of an ETransformer as JSON text ("" when none is given: the file stays as before):
// {"n": [layer 0, layer 1, …], …} for each given length of n blocks, a layer the list of its layouts (one for every
// head, or H: one per head, as given), a layout the list of each query block's key blocks (ascending; a block
// listed m times has multiplicity m): {"4": [[[[0, 1], [0, 1, 2], [1, 2, 3], [2, 3]]], …]}.
template <class T>
std::string bigbird_layouts_json(const ETransformer<T>& m);
// Install the layouts of such a text (every length checked, check_bigbird_layouts, before any is installed).
template <class T>
void set_bigbird_layouts_json(ETransformer<T>& m, const std::string& text);

// Write θ (row-major copies of every entry of the store), the config, dropout's counter and seed and the `extra`
// metadata; to a temporary file renamed onto `path` (never a half-written file under the final name).
template <class T>
void save_model(const ModelConfig& c, const ParamStore<T>& store, std::uint64_t dropout_step, std::uint64_t dropout_seed,
                const std::string& path, const std::map<std::string, std::string>& extra = {});

template <class M>
void save(const M& model, const std::string& path) {
    using T = typename decltype(std::declval<const M&>().store)::value_type;
    std::map<std::string, std::string> extra;
    if constexpr (std::is_same_v<M, ETransformer<T>>) {
        std::string layouts = bigbird_layouts_json(model);
        if (!layouts.empty()) extra[kBigBirdLayoutsKey] = std::move(layouts);
    }
    save_model(model.cfg, model.store, model.dropout_step, model.dropout_seed, path, extra);
}

// The model saved at `path` as an M (DTransformer<T>, ETransformer<T> or EDTransformer<T>; θ converted to T
// whatever the file's dtype). ValueError when the file holds another architecture or is damaged.
template <class M>
M load(const std::string& path) {
    using T = typename decltype(std::declval<M&>().store)::value_type;
    constexpr Arch arch = std::is_same_v<M, DTransformer<T>> ? Arch::D : std::is_same_v<M, ETransformer<T>> ? Arch::E : Arch::ED;
    static_assert(std::is_same_v<M, DTransformer<T>> || std::is_same_v<M, ETransformer<T>> || std::is_same_v<M, EDTransformer<T>>,
                  "ft::load<M>: M is DTransformer<T>, ETransformer<T> or EDTransformer<T>");
    const SavedModel file = SavedModel::read(path);
    const ModelConfig c = file.config();
    if (c.arch != arch)
        throw ValueError(path + ": the file holds a " + arch_name(c.arch) + ", not a " + arch_name(arch));
    if (arch != Arch::E && file.metadata.count(kBigBirdLayoutsKey))
        throw ValueError(path + ": BigBird layouts in the metadata of a " + arch_name(arch) + " (a damaged file)");
    return M(c, [&](M& m) {
        file.restore(m.store, m.dropout_step, m.dropout_seed);
        if constexpr (arch == Arch::E) file.restore_layouts(m);
    });
}

}  // namespace ft
