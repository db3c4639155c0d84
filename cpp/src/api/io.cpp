// ft::save / ft::load (io.hpp): the safetensors files of Python's ft.save and ft.load.
#include "formal_transformers/io.hpp"

#include "formal_transformers/block_sparse.hpp"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

namespace ft {

namespace {
using Json = nlohmann::ordered_json;
constexpr const char* kFormat = "1";  // io.py's FORMAT
constexpr std::uint64_t kMaxHeader = 100u << 20;  // bytes: safetensors' own bound on a header

[[noreturn]] void damaged(const std::string& path, const std::string& what) { throw ValueError(path + ": " + what); }

std::uint64_t parse_u64(const std::string& path, const std::string& key, const std::string& text) {
    if (text.empty() || text.size() > 20 || text.find_first_not_of("0123456789") != std::string::npos)
        damaged(path, "damaged " + key + " in the metadata ('" + text + "')");
    const unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
    if (text.size() == 20 && text > "18446744073709551615") damaged(path, "damaged " + key + " in the metadata (out of range)");
    return std::uint64_t(v);
}
}  // namespace

SavedModel SavedModel::read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw ValueError(path + ": cannot open the file");
    in.seekg(0, std::ios::end);
    const std::streamoff size = in.tellg();
    in.seekg(0);
    unsigned char len8[8];
    if (size < 8 || !in.read(reinterpret_cast<char*>(len8), 8)) damaged(path, "not a safetensors file (shorter than its header length)");
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len8[i];
    if (n > kMaxHeader || n > std::uint64_t(size - 8)) damaged(path, "not a safetensors file (header length " + std::to_string(n) + ")");
    std::string header(std::size_t(n), '\0');
    in.read(header.data(), std::streamsize(n));
    SavedModel f;
    f.path = path;
    f.bytes.resize(std::size_t(std::uint64_t(size) - 8 - n));
    in.read(reinterpret_cast<char*>(f.bytes.data()), std::streamsize(f.bytes.size()));
    if (!in) damaged(path, "could not read the file");
    Json h;
    try {
        h = Json::parse(header);
    } catch (const Json::exception& e) {
        damaged(path, std::string("not a safetensors file (header: ") + e.what() + ")");
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
        if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets"))
            damaged(path, "tensor " + name + ": not a safetensors entry");
        Tensor x;
        const Json& dt = t["dtype"];
        if (dt == "F32") x.f64 = false;
        else if (dt == "F64") x.f64 = true;
        else damaged(path, "tensor " + name + " has dtype " + dt.dump() + ", expected F32 or F64");
        std::uint64_t count = 1;
        if (!t["shape"].is_array()) damaged(path, "tensor " + name + ": shape is not a list");
        for (const Json& d : t["shape"]) {
            if (!d.is_number_unsigned() || d.get<std::uint64_t>() > (std::uint64_t(1) << 40))
                damaged(path, "tensor " + name + ": a bad dimension " + d.dump());
            x.shape.push_back(index_t(d.get<std::uint64_t>()));
            count *= d.get<std::uint64_t>();
            if (count > f.bytes.size()) damaged(path, "tensor " + name + " is larger than the file");
        }
        const Json& off = t["data_offsets"];
        if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
            damaged(path, "tensor " + name + ": bad data_offsets");
        const std::uint64_t b = off[0].get<std::uint64_t>(), e = off[1].get<std::uint64_t>();
        if (b > e || e > f.bytes.size() || e - b != count * (x.f64 ? 8 : 4))
            damaged(path, "tensor " + name + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                              ") do not hold its shape in the file's " + std::to_string(f.bytes.size()) + " data bytes");
        x.begin = std::size_t(b);
        f.tensors[name] = std::move(x);
    }
    if (!f.metadata.count("formal_transformers.config")) damaged(path, "no formal_transformers config in its metadata (not written by ft.save)");
    const auto fmt = f.metadata.find("formal_transformers.format");
    if (fmt == f.metadata.end() || fmt->second != kFormat)
        damaged(path, "format '" + (fmt == f.metadata.end() ? std::string("none") : fmt->second) + "', this version reads '" + kFormat + "'");
    return f;
}

// A saved config as this version reads it: a BigBird config written before bigbird_draw existed was drawn with
// one layout per layer (head 0's), bigbird_draw "per_layer" (io.py's load applies the same rule).
static std::string upgraded_config(const std::string& text) {
    Json j;
    try {
        j = Json::parse(text);
    } catch (const Json::exception&) {
        return text;  // from_json names the problem
    }
    if (j.is_object() && j.value("arch", Json()) == "ETransformer" && j.value("attention", Json()) == "bigbird" &&
        !j.contains("bigbird_draw"))
        j["bigbird_draw"] = "per_layer";
    return j.dump();
}

ModelConfig SavedModel::config() const {
    ModelConfig c;
    try {
        c = ModelConfig::from_json(upgraded_config(metadata.at("formal_transformers.config")));
    } catch (const ValueError& e) {
        damaged(path, std::string("damaged or unusable config in the metadata (") + e.what() + ")");
    }
    // every layer has parameters of its own: more layers than the file has tensors cannot match it, refused
    // before the model is built (as io.py: a config of L = 10**6 layers would take minutes to build)
    const index_t layers = c.arch == Arch::ED ? c.L_enc + c.L_dec : c.L;
    if (std::uint64_t(layers) > tensors.size())
        damaged(path, "the config has " + std::to_string(layers) + " layers, the file only " +
                          std::to_string(tensors.size()) + " tensors");
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
    if (m.cfg.attention != AttnKernel::BigBird) throw ValueError("bigbird layouts: the model's attention is not 'bigbird'");
    Json j;
    try {
        j = Json::parse(text);
    } catch (const Json::exception& e) {
        throw ValueError(std::string("bigbird layouts: not JSON (") + e.what() + ")");
    }
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
                ls.back().push_back(explicit_layout(m.cfg.block_size, keys));
                if (std::to_string(ls.back().back().n) != key)
                    throw ValueError(at + "a layout of " + std::to_string(ls.back().back().n) + " blocks");
            }
        }
        check_bigbird_layouts(m.cfg, ls);
        all.push_back(std::move(ls));
    }
    for (auto& ls : all) set_bigbird_layouts(m, std::move(ls));
}

template <class T>
void save_model(const ModelConfig& c, const ParamStore<T>& store, std::uint64_t dropout_step, std::uint64_t dropout_seed,
                const std::string& path, const std::map<std::string, std::string>& extra) {
    constexpr bool f64 = std::is_same_v<T, double>;
    Json h = Json::object();
    Json meta = Json::object();
    meta["formal_transformers.format"] = kFormat;
    meta["formal_transformers.config"] = c.to_json(f64 ? "float64" : "float32");
    meta["formal_transformers.dropout_step"] = std::to_string(dropout_step);
    meta["formal_transformers.dropout_seed"] = std::to_string(dropout_seed);
    for (const auto& [k, v] : extra) meta[k] = v;
    h["__metadata__"] = meta;
    std::vector<unsigned char> data(std::size_t(store.size()) * sizeof(T));
    std::size_t at = 0;
    for (const ParamInfo& e : store.entries()) {
        h[e.name] = {{"dtype", f64 ? "F64" : "F32"}, {"shape", e.shape}, {"data_offsets", {at, at + std::size_t(e.size) * sizeof(T)}}};
        const std::size_t rank = e.shape.size();
        std::vector<index_t> idx(rank, 0);
        for (index_t k = 0; k < e.size; ++k) {
            index_t src = e.offset;
            for (std::size_t d = 0; d < rank; ++d) src += idx[d] * e.strides[d];
            std::memcpy(data.data() + at, store.theta() + src, sizeof(T));
            at += sizeof(T);
            for (std::size_t d = rank; d-- > 0;) {
                if (++idx[d] < e.shape[d]) break;
                idx[d] = 0;
            }
        }
    }
    std::string header = h.dump();
    header.append((8 - header.size() % 8) % 8, ' ');  // the data aligned to 8 bytes, as safetensors writes it
    const std::string tmp = path + ".tmp";
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        if (!out) throw ValueError(path + ": cannot write " + tmp);
        unsigned char len8[8];
        std::uint64_t n = header.size();
        for (int i = 0; i < 8; ++i) len8[i] = (unsigned char)(n >> (8 * i));
        out.write(reinterpret_cast<const char*>(len8), 8);
        out.write(header.data(), std::streamsize(header.size()));
        out.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));
        if (!out.flush()) throw ValueError(path + ": could not write " + tmp);
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::remove(tmp.c_str());
        throw ValueError(path + ": could not rename " + tmp + " onto it");
    }
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
