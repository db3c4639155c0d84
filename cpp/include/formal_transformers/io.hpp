// Model files: the one reader and the one writer of the safetensors files ft.save writes and ft.load reads
// (Python's io.py calls these through the bindings), so a model trained in either language opens in the other.
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
// bigbird_draw = "per_layer", the rule it was saved under (the 'bigbird' head kernel's option, variants/bigbird_mask.cpp). Prompt caches (paged.hpp) are files of
// the same layout, read and written by the same functions.
//
// Reading trusts nothing in the file (ValueError naming the file and the problem): the header is bounded JSON
// (size, nesting, no duplicate key: bounded_json.hpp); every tensor is F32 or F64 exactly, its offsets hold its
// shape, and together the tensors cover the data section exactly, contiguous and without overlap; every value is
// finite; the metadata are strings; the config is checked against the tensors before a model is built
// (model_config); the dropout counters are decimal digits. Writing goes through a uniquely named temporary file
// in the destination's folder, flushed to disk (fsync) and renamed onto the path: the path holds the old file or
// the new one, never a partial one, whatever other processes write to it at the same time.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "formal_transformers/config.hpp"
#include "formal_transformers/params.hpp"
#include "formal_transformers/transformers.hpp"

namespace ft {

// A file's contents, checked as above.
struct SavedModel {
    std::string path;
    std::map<std::string, std::string> metadata;
    struct Tensor {
        bool f64 = false;
        std::vector<index_t> shape;
        std::size_t begin = 0;  // byte offset of the (row-major) data in `bytes`
        std::size_t count = 0;  // elements
    };
    std::map<std::string, Tensor> tensors;
    std::vector<unsigned char> bytes;  // the data section

    // The header alone (metadata and the table of tensors, every check above that needs no data): any
    // safetensors file of F32 / F64 tensors.
    static SavedModel read_header(const std::string& path);
    // The whole file, a file of this program (its format version and config present), every value finite.
    static SavedModel read(const std::string& path);
    // ModelConfig::from_json of the metadata's config, the bigbird_draw rule applied (ValueError when damaged).
    ModelConfig config() const;
    // The options of the file's config whose part its config does not choose, at a value other than their default
    // (a file written before the option was its part's, or edited): each had no effect on the outputs, so config()
    // loads it at its default (a save writes the default). One message per option, naming the file, the option and
    // its value, its part and the part chosen; ft.load warns with them (UserWarning), never silently.
    std::vector<std::string> unchosen_options() const;
    // The dtype the file was saved in ("float32" / "float64": its config's, which every tensor has).
    std::string dtype() const;
    // config(), checked against the tensors before anything is allocated: no more layers (MTP modules included)
    // than the file has tensors, and no more parameters than it holds numbers (a lower bound on the count:
    // the embedding, the table of positions, and each layer's W_o and MLP).
    ModelConfig model_config() const;
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

// One tensor to write: row-major data of `shape`, F64 or F32.
struct TensorBytes {
    std::string name;
    bool f64 = false;
    std::vector<index_t> shape;
    const void* data = nullptr;
};
// The one writer: a safetensors file of `tensors` (in this order) and `metadata`, written atomically as above.
// ValueError naming the tensor when one holds a value that is not finite (the reader would refuse the file).
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, std::string>>& metadata,
                       const std::vector<TensorBytes>& tensors);

// Write θ (row-major copies of every entry of the store), the config, dropout's counter and seed and the `extra`
// metadata (ValueError for a key of the format's own).
template <class T>
void save_model(const ModelConfig& c, const ParamStore<T>& store, std::uint64_t dropout_step, std::uint64_t dropout_seed,
                const std::string& path, const std::map<std::string, std::string>& extra = {});

template <class M>
void save(const M& model, const std::string& path, std::map<std::string, std::string> extra = {}) {
    using T = typename decltype(std::declval<const M&>().store)::value_type;
    if constexpr (std::is_same_v<M, ETransformer<T>>) {
        std::string layouts = bigbird_layouts_json(model);
        if (!layouts.empty()) {
            if (extra.count(kBigBirdLayoutsKey)) throw ValueError(path + ": the metadata key " + std::string(kBigBirdLayoutsKey) + " is the format's own");
            extra[kBigBirdLayoutsKey] = std::move(layouts);
        }
    }
    save_model(model.cfg, model.store, model.dropout_step, model.dropout_seed, path, extra);
}

// The model of a read file as an M (DTransformer<T>, ETransformer<T> or EDTransformer<T>; θ converted to T whatever
// the file's dtype), `c` its file.model_config(). ValueError when the file holds another architecture.
template <class M>
M load(const SavedModel& file, const ModelConfig& c) {
    using T = typename decltype(std::declval<M&>().store)::value_type;
    constexpr Arch arch = std::is_same_v<M, DTransformer<T>> ? Arch::D : std::is_same_v<M, ETransformer<T>> ? Arch::E : Arch::ED;
    static_assert(std::is_same_v<M, DTransformer<T>> || std::is_same_v<M, ETransformer<T>> || std::is_same_v<M, EDTransformer<T>>,
                  "ft::load<M>: M is DTransformer<T>, ETransformer<T> or EDTransformer<T>");
    if (c.arch != arch)
        throw ValueError(file.path + ": the file holds a " + arch_name(c.arch) + ", not a " + arch_name(arch));
    if (arch != Arch::E && file.metadata.count(kBigBirdLayoutsKey))
        throw ValueError(file.path + ": BigBird layouts in the metadata of a " + arch_name(arch) + " (a damaged file)");
    try {
        return M(c, [&](M& m) {
            file.restore(m.store, m.dropout_step, m.dropout_seed);
            if constexpr (arch == Arch::E) file.restore_layouts(m);
        });
    } catch (const ValueError& e) {  // building the model refused the file's config: say which file
        const std::string what = e.what();
        if (what.rfind(file.path + ": ", 0) == 0) throw;
        throw ValueError(file.path + ": " + what);
    }
}

// The model saved at `path` as an M (as above). ValueError when the file holds another architecture or is damaged.
template <class M>
M load(const std::string& path) {
    const SavedModel file = SavedModel::read(path);
    return load<M>(file, file.model_config());
}

}  // namespace ft
