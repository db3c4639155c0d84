// ft::save / ft::load (io.hpp): the one reader and writer of model files (and, through them, prompt caches).
#include "formal_transformers/io.hpp"
#include "formal_transformers/lora.hpp"
#include "formal_transformers/parts.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "formal_transformers/block_sparse.hpp"
#include "../runtime/bounded_json.hpp"

namespace ft {

namespace {
using Json = nlohmann::ordered_json;
constexpr const char* kFormat = "1";
constexpr const char* kConfigKey = "formal_transformers.config";
constexpr std::uint64_t kMaxHeader = 100u << 20;  // bytes: safetensors' own bound on a header

[[noreturn]] void damaged(const std::string& path, const std::string& what) { throw ValueError(path + ": " + what); }

// A decimal counter of the metadata: ASCII digits only, at most 2^64 - 1 (no sign, space, '_' or other digits).
std::uint64_t parse_u64(const std::string& path, const std::string& key, const std::string& text) {
    if (text.empty() || text.size() > 20 || text.find_first_not_of("0123456789") != std::string::npos)
        damaged(path, "damaged " + key + " in the metadata ('" + text + "': not a decimal number)");
    if (text.size() == 20 && text > "18446744073709551615") damaged(path, "damaged " + key + " in the metadata (out of range)");
    return std::uint64_t(std::strtoull(text.c_str(), nullptr, 10));
}

std::uint64_t le64(const unsigned char* p) {
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | p[i];
    return n;
}

// The header's metadata and table of tensors into f, checked against the data section's size.
void read_table(SavedModel& f, const std::string& header, std::uint64_t data_size) {
    const std::string& path = f.path;
    Json h;
    try {
        h = parse_bounded_json(header, "the header", JsonBounds{8, kMaxHeader});
    } catch (const ValueError& e) {
        damaged(path, std::string("not a safetensors file (") + e.what() + ")");
    }
    if (!h.is_object()) damaged(path, "not a safetensors file (the header is not a JSON object)");
    for (const auto& [name, t] : h.items()) {
        if (name == "__metadata__") {
            if (!t.is_object()) damaged(path, "__metadata__ is not an object");
            for (const auto& [k, v] : t.items()) {
                if (!v.is_string()) damaged(path, "metadata " + k + " is not a string");
                f.metadata[k] = v.get<std::string>();
            }
            continue;
        }
        if (!t.is_object() || t.size() != 3 || !t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets"))
            damaged(path, "tensor " + name + ": not a safetensors entry {dtype, shape, data_offsets}");
        SavedModel::Tensor x;
        const Json& dt = t["dtype"];
        if (dt == "F32") x.f64 = false;
        else if (dt == "F64") x.f64 = true;
        else damaged(path, "tensor " + name + " has dtype " + dt.dump() + ", expected F32 or F64");
        if (!t["shape"].is_array()) damaged(path, "tensor " + name + ": shape is not a list");
        std::uint64_t count = 1;
        for (const Json& d : t["shape"]) {
            if (!d.is_number_unsigned() || d.get<std::uint64_t>() > data_size)
                damaged(path, "tensor " + name + ": a bad dimension " + d.dump());
            const std::uint64_t n = d.get<std::uint64_t>();
            x.shape.push_back(index_t(n));
            if (n != 0 && count > data_size / n) damaged(path, "tensor " + name + " is larger than the file");
            count *= n;
        }
        x.count = std::size_t(count);
        const Json& off = t["data_offsets"];
        if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
            damaged(path, "tensor " + name + ": bad data_offsets");
        const std::uint64_t b = off[0].get<std::uint64_t>(), e = off[1].get<std::uint64_t>();
        if (b > e || e > data_size || e - b != count * (x.f64 ? 8 : 4))
            damaged(path, "tensor " + name + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                              ") do not hold its shape in the file's " + std::to_string(data_size) + " data bytes");
        x.begin = std::size_t(b);
        f.tensors[name] = std::move(x);
    }
    // the tensors tile the data section: sorted by offset, each begins where the one before ends, the last ends
    // with the file (no overlap, gap or trailing byte)
    std::vector<std::pair<std::size_t, const std::string*>> order;
    for (const auto& [name, t] : f.tensors) order.emplace_back(t.begin, &name);
    std::sort(order.begin(), order.end(), [&](const auto& a, const auto& b) {
        const auto& ta = f.tensors.at(*a.second);
        const auto& tb = f.tensors.at(*b.second);
        return a.first != b.first ? a.first < b.first : ta.count * (ta.f64 ? 8 : 4) < tb.count * (tb.f64 ? 8 : 4);
    });
    std::uint64_t at = 0;
    for (const auto& [begin, name] : order) {
        const SavedModel::Tensor& t = f.tensors.at(*name);
        if (begin != at)
            damaged(path, "tensor " + *name + " begins at byte " + std::to_string(begin) + " of the data, not at " +
                              std::to_string(at) + (begin < at ? " (it overlaps another)" : " (a gap before it)"));
        at += t.count * (t.f64 ? 8 : 4);
    }
    if (at != data_size)
        damaged(path, "the tensors hold " + std::to_string(at) + " bytes of the data section's " + std::to_string(data_size) +
                          " (bytes after the last tensor)");
}

SavedModel read_file(const std::string& path, bool with_data) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw ValueError(path + ": cannot open the file");
    in.seekg(0, std::ios::end);
    const std::streamoff size = in.tellg();
    in.seekg(0);
    unsigned char len8[8];
    if (size < 8 || !in.read(reinterpret_cast<char*>(len8), 8)) damaged(path, "not a safetensors file (shorter than its header length)");
    const std::uint64_t n = le64(len8);
    if (n > kMaxHeader || n > std::uint64_t(size - 8)) damaged(path, "not a safetensors file (header length " + std::to_string(n) + ")");
    std::string header(std::size_t(n), '\0');
    if (!in.read(header.data(), std::streamsize(n))) damaged(path, "could not read the header");
    SavedModel f;
    f.path = path;
    const std::uint64_t data_size = std::uint64_t(size) - 8 - n;
    read_table(f, header, data_size);
    if (with_data) {
        f.bytes.resize(std::size_t(data_size));
        if (!in.read(reinterpret_cast<char*>(f.bytes.data()), std::streamsize(f.bytes.size()))) damaged(path, "could not read the file");
    }
    return f;
}

// the first non-finite element of a tensor's data, or -1
template <class V>
long long first_nonfinite(const unsigned char* p, std::size_t n) {
    for (std::size_t k = 0; k < n; ++k) {
        V v;
        std::memcpy(&v, p + k * sizeof(V), sizeof(V));
        if (!std::isfinite(v)) return (long long)k;
    }
    return -1;
}
long long first_nonfinite(bool f64, const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    return f64 ? first_nonfinite<double>(b, n) : first_nonfinite<float>(b, n);
}
}  // namespace

SavedModel SavedModel::read_header(const std::string& path) { return read_file(path, false); }

SavedModel SavedModel::read(const std::string& path) {
    SavedModel f = read_file(path, true);
    if (!f.metadata.count(kConfigKey)) damaged(path, "no formal_transformers config in its metadata (not written by ft.save)");
    const auto fmt = f.metadata.find("formal_transformers.format");
    if (fmt == f.metadata.end() || fmt->second != kFormat)
        damaged(path, "format '" + (fmt == f.metadata.end() ? std::string("none") : fmt->second) + "', this version reads '" + kFormat + "'");
    const std::string dt = f.dtype();
    for (const auto& [name, t] : f.tensors) {
        if (t.f64 != (dt == "float64"))
            damaged(path, "tensor " + name + " is " + (t.f64 ? "F64" : "F32") + " in a file saved in " + dt);
        const long long k = first_nonfinite(t.f64, f.bytes.data() + t.begin, t.count);
        if (k >= 0) damaged(path, "tensor " + name + " holds a value that is not finite (NaN or ±inf) at element " + std::to_string(k));
    }
    return f;
}

std::string SavedModel::dtype() const {
    std::string dt;
    try {
        dt = ModelConfig::json_dtype(metadata.at(kConfigKey));
    } catch (const ValueError& e) {
        damaged(path, std::string("damaged or unusable config in the metadata (") + e.what() + ")");
    }
    return dt.empty() ? "float32" : dt;
}

// A saved config as this version reads it: a BigBird config written before bigbird_draw existed was drawn with
// one layout per layer (head 0's), bigbird_draw "per_layer" (the one place of this rule).
static std::string upgraded_config(const std::string& text) {
    Json j = parse_bounded_json(text, "model config");
    if (j.is_object() && j.value("arch", Json()) == "ETransformer" && j.value("attention", Json()) == "bigbird" &&
        !j.contains("bigbird_draw"))
        j["bigbird_draw"] = "per_layer";
    return j.dump();
}

// LoRA's adapters (lora.hpp) beside the config: {"targets": [names], "r": r, "alpha": α, "dropout": p}; absent
// in files without adapters (every file written before LoRA existed)
constexpr const char* kLoraKey = "formal_transformers.lora";
static std::string lora_json(const ModelConfig::Lora& l) {
    Json j = Json::object();
    j["targets"] = l.targets;
    j["r"] = l.r;
    j["alpha"] = l.alpha;
    j["dropout"] = l.dropout;
    return j.dump();
}
static ModelConfig::Lora lora_of_json(const std::string& text) {
    const Json j = parse_bounded_json(text, "LoRA adapters");
    if (!j.is_object() || !j.contains("targets") || !j["targets"].is_array() || !j.contains("r") ||
        !j["r"].is_number_integer() || !j.contains("alpha") || !j["alpha"].is_number() || !j.contains("dropout") ||
        !j["dropout"].is_number())
        throw ValueError("LoRA adapters: an object with targets (a list of names), r, alpha and dropout");
    ModelConfig::Lora l;
    for (const Json& t : j["targets"]) {
        if (!t.is_string()) throw ValueError("LoRA adapters: targets must be names");
        l.targets.push_back(t.get<std::string>());
    }
    l.r = j["r"].get<index_t>();
    l.alpha = j["alpha"].get<double>();
    l.dropout = j["dropout"].get<double>();
    check_lora(l);
    return l;
}

ModelConfig SavedModel::config() const {
    try {
        ModelConfig c = ModelConfig::from_json(upgraded_config(metadata.at(kConfigKey)));
        if (metadata.count(kLoraKey)) c.lora = lora_of_json(metadata.at(kLoraKey));
        return c;
    } catch (const ValueError& e) {
        damaged(path, std::string("damaged or unusable config in the metadata (") + e.what() + ")");
    }
}

std::vector<std::string> SavedModel::unchosen_options() const {
    const ModelConfig c = config();
    const Json file = parse_bounded_json(upgraded_config(metadata.at(kConfigKey)), "model config");
    const Json loaded = parse_bounded_json(c.to_json(), "model config");
    std::vector<std::string> notes;
    for (const auto& [name, value] : file.items()) {
        const PartRow* row = part_row_of_option(name);
        if (!row || value.is_null() || !c.part_options.at_default(name)) continue;
        if (loaded.contains(name) && loaded[name] == value) continue;  // (its default, as the file wrote it)
        notes.push_back(path + ": " + name + " = " + value.dump() + " is an option of the '" + row->name + "' " +
                        kind_name(row->kind) + ", which the file's config does not choose: it had no effect on the " +
                        "outputs and loads at its default (" +
                        (loaded.contains(name) ? loaded[name].dump() : std::string("null")) + ")");
    }
    return notes;
}

ModelConfig SavedModel::model_config() const {
    const ModelConfig c = config();
    // every layer has parameters of its own: more layers than the file has tensors cannot match it
    const ModelSize size = model_size(c, c.arch);  // (the layers of the parts included: V16's modules)
    const long double layers = (long double)size.layers;
    if (layers > (long double)tensors.size())
        damaged(path, "the config has " + std::to_string((unsigned long long)layers) + " layers" +
                          (size.extra_layers.empty() ? "" : " (" + size.extra_layers + " included)") + ", the file only " +
                          std::to_string(tensors.size()) + " tensors");
    // a lower bound on the parameter count, against the numbers the file holds (long double: no wrap)
    const long double d = (long double)c.d_e;
    const long double table = position_table(c.positional) == Positional::None ? 0.0L : (long double)c.l_max * d;  // W_p
    const long double per_layer = (long double)c.H * c.d_mid * d + 2.0L * c.d_mlp * d;     // W_o, the MLP
    const long double need = (long double)c.n_vocab * d + table + layers * per_layer;
    std::size_t have = 0;
    for (const auto& [name, t] : tensors) have += t.count;
    if (need > (long double)have)
        damaged(path, "the config (n_vocab=" + std::to_string(c.n_vocab) + ", l_max=" + std::to_string(c.l_max) +
                          ", d_e=" + std::to_string(c.d_e) + ", d_mlp=" + std::to_string(c.d_mlp) + ", " +
                          std::to_string((unsigned long long)layers) + " layers) needs more parameters than the file's " +
                          std::to_string(have) + " numbers");
    return c;
}

template <class T>
void SavedModel::restore(ParamStore<T>& store, std::uint64_t& dropout_step, std::uint64_t& dropout_seed) const {
    // every check first
    for (const ParamInfo& e : store.entries()) {
        const auto it = tensors.find(e.name);
        if (it == tensors.end()) damaged(path, "parameters do not match the config (missing " + e.name + ")");
        if (it->second.shape != e.shape) damaged(path, "tensor " + e.name + " has another shape than the config gives");
    }
    for (const auto& [name, t] : tensors)
        if (!store.find(name)) damaged(path, "parameters do not match the config (unexpected " + name + ")");
    std::uint64_t step = dropout_step, seed = dropout_seed;
    if (auto it = metadata.find("formal_transformers.dropout_step"); it != metadata.end())
        step = parse_u64(path, "dropout_step", it->second);
    if (auto it = metadata.find("formal_transformers.dropout_seed"); it != metadata.end())
        seed = parse_u64(path, "dropout_seed", it->second);
    // then the copy: row-major data into the entry's strides
    for (const ParamInfo& e : store.entries()) {
        const Tensor& t = tensors.at(e.name);
        const unsigned char* src = bytes.data() + t.begin;
        const std::size_t rank = e.shape.size();
        std::vector<index_t> idx(rank, 0);
        for (index_t k = 0; k < e.size; ++k) {
            index_t at = e.offset;
            for (std::size_t d = 0; d < rank; ++d) at += idx[d] * e.strides[d];
            if (t.f64) {
                double v;
                std::memcpy(&v, src + std::size_t(k) * 8, 8);
                store.theta()[at] = T(v);
            } else {
                float v;
                std::memcpy(&v, src + std::size_t(k) * 4, 4);
                store.theta()[at] = T(v);
            }
            for (std::size_t d = rank; d-- > 0;) {  // the next row-major index
                if (++idx[d] < e.shape[d]) break;
                idx[d] = 0;
            }
        }
    }
    dropout_step = step;
    dropout_seed = seed;
}

template <class T>
void SavedModel::restore_layouts(ETransformer<T>& m) const {
    const auto it = metadata.find(kBigBirdLayoutsKey);
    if (it == metadata.end()) return;
    try {
        set_bigbird_layouts_json(m, it->second);
    } catch (const ValueError& e) {
        damaged(path, std::string("damaged BigBird layouts in the metadata (") + e.what() + ")");
    }
}

template <class T>
std::string bigbird_layouts_json(const ETransformer<T>& m) {
    const auto given = given_bigbird_layouts(m);
    if (given.empty()) return "";
    Json j = Json::object();
    for (const auto& [n, layers] : given) {
        Json js = Json::array();
        for (const auto& heads : layers) {
            Json jh = Json::array();
            for (const BlockLayout& L : heads) {
                Json jl = Json::array();
                for (index_t i = 0; i < L.n; ++i) jl.push_back(std::vector<index_t>(L.of(i), L.of(i) + L.count(i)));
                jh.push_back(std::move(jl));
            }
            js.push_back(std::move(jh));
        }
        j[std::to_string(n)] = std::move(js);
    }
    return j.dump();
}

template <class T>
void set_bigbird_layouts_json(ETransformer<T>& m, const std::string& text) {
    if (!head_kernel_has(m.cfg.attention, HeadKernelProperty::BlockLayouts)) throw ValueError("bigbird layouts: the model's attention is not 'bigbird'");
    const Json j = parse_bounded_json(text, "bigbird layouts", JsonBounds{8});
    if (!j.is_object()) throw ValueError("bigbird layouts: not a JSON object {\"n\": layers, …}");
    std::vector<std::vector<std::vector<BlockLayout>>> all;  // every length read and checked before any is installed
    for (const auto& [key, layers] : j.items()) {
        const std::string at = "bigbird layouts of " + key + " blocks: ";
        if (!layers.is_array()) throw ValueError(at + "not a list of layers");
        std::vector<std::vector<BlockLayout>> ls;
        for (const Json& heads : layers) {
            if (!heads.is_array()) throw ValueError(at + "a layer is not a list of layouts");
            ls.emplace_back();
            for (const Json& lay : heads) {
                if (!lay.is_array()) throw ValueError(at + "a layout is not a list of query blocks");
                std::vector<std::vector<index_t>> keys;
                for (const Json& k : lay) {
                    if (!k.is_array()) throw ValueError(at + "a query block's key blocks are not a list");
                    keys.emplace_back();
                    for (const Json& v : k) {
                        if (!v.is_number_integer()) throw ValueError(at + "a key block is not an integer");
                        keys.back().push_back(v.get<index_t>());
                    }
                }
                ls.back().push_back(explicit_layout(m.cfg.part_options.integer("block_size"), keys));
                if (std::to_string(ls.back().back().n) != key)
                    throw ValueError(at + "a layout of " + std::to_string(ls.back().back().n) + " blocks");
            }
        }
        check_bigbird_layouts(m.cfg, ls);
        all.push_back(std::move(ls));
    }
    for (auto& ls : all) set_bigbird_layouts(m, std::move(ls));
}

// ------------------------------------------------------------------------------------------------------
// the writer

namespace {
// all n bytes to fd (a short write or EINTR continued); false on an error
bool write_all(int fd, const void* data, std::size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
        const ssize_t w = ::write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        p += w, n -= std::size_t(w);
    }
    return true;
}

// write(fd) into a new, uniquely named file in path's folder, flushed to disk, then renamed onto path; the
// temporary is removed on any failure.
template <class Write>
void replace_atomically(const std::string& path, Write&& write) {
    const std::size_t slash = path.rfind('/');
    const std::string folder = slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash);
    const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
    std::string tmp = folder + "/." + name + ".XXXXXX.tmp";  // mkstemps: an unused name, created exclusively
    const int fd = ::mkstemps(tmp.data(), 4);
    if (fd < 0) throw ValueError(path + ": cannot create a temporary file in " + folder + " (" + std::strerror(errno) + ")");
    bool ok = ::fchmod(fd, 0644) == 0 && write(fd) && ::fsync(fd) == 0;  // (mkstemps makes it 0600)
    const int err = errno;
    ok = (::close(fd) == 0) && ok;
    if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
        const int e = ok ? errno : err;
        ::unlink(tmp.c_str());
        throw ValueError(path + ": could not write the file (" + std::strerror(e) + ")");
    }
    const int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY);  // the rename itself to disk (best effort)
    if (dir >= 0) {
        ::fsync(dir);
        ::close(dir);
    }
}
}  // namespace

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, std::string>>& metadata,
                       const std::vector<TensorBytes>& tensors) {
    Json h = Json::object();
    Json meta = Json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    h["__metadata__"] = std::move(meta);
    std::size_t at = 0;
    for (const TensorBytes& t : tensors) {
        std::size_t n = 1;
        for (index_t d : t.shape) n *= std::size_t(d);
        const long long k = first_nonfinite(t.f64, t.data, n);
        if (k >= 0)
            throw ValueError(path + ": not saved: " + t.name + " holds a value that is not finite (NaN or ±inf) at element " +
                             std::to_string(k) + ", which no reader accepts");
        const std::size_t bytes = n * (t.f64 ? 8 : 4);
        h[t.name] = {{"dtype", t.f64 ? "F64" : "F32"}, {"shape", t.shape}, {"data_offsets", {at, at + bytes}}};
        at += bytes;
    }
    std::string header = h.dump();
    header.append((8 - header.size() % 8) % 8, ' ');  // the data aligned to 8 bytes, as safetensors writes it
    unsigned char len8[8];
    for (int i = 0; i < 8; ++i) len8[i] = (unsigned char)(std::uint64_t(header.size()) >> (8 * i));
    replace_atomically(path, [&](int fd) {
        if (!write_all(fd, len8, 8) || !write_all(fd, header.data(), header.size())) return false;
        for (const TensorBytes& t : tensors) {
            std::size_t n = 1;
            for (index_t d : t.shape) n *= std::size_t(d);
            if (!write_all(fd, t.data, n * (t.f64 ? 8 : 4))) return false;
        }
        return true;
    });
}

template <class T>
void save_model(const ModelConfig& c, const ParamStore<T>& store, std::uint64_t dropout_step, std::uint64_t dropout_seed,
                const std::string& path, const std::map<std::string, std::string>& extra) {
    constexpr bool f64 = std::is_same_v<T, double>;
    std::vector<std::pair<std::string, std::string>> meta = {
        {"formal_transformers.format", kFormat},
        {kConfigKey, c.to_json(f64 ? "float64" : "float32")},
        {"formal_transformers.dropout_step", std::to_string(dropout_step)},
        {"formal_transformers.dropout_seed", std::to_string(dropout_seed)}};
    if (!c.lora.targets.empty()) meta.emplace_back(kLoraKey, lora_json(c.lora));
    for (const auto& [k, v] : extra) {
        for (const auto& own : meta)
            if (own.first == k) throw ValueError(path + ": the metadata key " + k + " is the format's own");
        meta.emplace_back(k, v);
    }
    // θ's entries as row-major copies (an entry's strides need not be row-major: W_q's heads are row blocks)
    std::vector<T> data(std::size_t(store.size()));
    std::vector<TensorBytes> tensors;
    std::size_t at = 0;
    for (const ParamInfo& e : store.entries()) {
        tensors.push_back({e.name, f64, e.shape, data.data() + at});
        const std::size_t rank = e.shape.size();
        std::vector<index_t> idx(rank, 0);
        for (index_t k = 0; k < e.size; ++k) {
            index_t src = e.offset;
            for (std::size_t d = 0; d < rank; ++d) src += idx[d] * e.strides[d];
            data[at++] = store.theta()[src];
            for (std::size_t d = rank; d-- > 0;) {
                if (++idx[d] < e.shape[d]) break;
                idx[d] = 0;
            }
        }
    }
    write_safetensors(path, meta, tensors);
}

template void SavedModel::restore(ParamStore<float>&, std::uint64_t&, std::uint64_t&) const;
template void SavedModel::restore(ParamStore<double>&, std::uint64_t&, std::uint64_t&) const;
template void save_model(const ModelConfig&, const ParamStore<float>&, std::uint64_t, std::uint64_t, const std::string&,
                          const std::map<std::string, std::string>&);
template void save_model(const ModelConfig&, const ParamStore<double>&, std::uint64_t, std::uint64_t, const std::string&,
                          const std::map<std::string, std::string>&);
template void SavedModel::restore_layouts(ETransformer<float>&) const;
template void SavedModel::restore_layouts(ETransformer<double>&) const;
template std::string bigbird_layouts_json(const ETransformer<float>&);
template std::string bigbird_layouts_json(const ETransformer<double>&);
template void set_bigbird_layouts_json(ETransformer<float>&, const std::string&);
template void set_bigbird_layouts_json(ETransformer<double>&, const std::string&);

}  // namespace ft
