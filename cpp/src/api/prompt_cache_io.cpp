// Prompt cache files (paged.hpp): the keys and values of a prompt and its last token's logits, in the
// safetensors layout of ft.save (io.hpp), read back with SavedModel::read.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "formal_transformers/io.hpp"
#include "formal_transformers/paged.hpp"

namespace ft {

namespace {
using Json = nlohmann::ordered_json;
constexpr const char* kPromptCacheKey = "formal_transformers.prompt_cache";
[[noreturn]] void damaged(const std::string& path, const std::string& what) { throw ValueError(path + ": " + what); }
}  // namespace

bool is_prompt_cache(const SavedModel& file) { return file.metadata.count(kPromptCacheKey) > 0; }

template <class T>
void save_prompt_kv(const PromptKV<T>& cache, const ModelConfig& c, const std::vector<std::pair<std::string, std::string>>& meta,
                    const std::string& path) {
    constexpr bool f64 = std::is_same_v<T, double>;
    Json h = Json::object();
    Json m = Json::object();
    m["formal_transformers.format"] = "1";  // io.cpp's kFormat: SavedModel::read reads the file
    m["formal_transformers.config"] = c.to_json(f64 ? "float64" : "float32");
    m[kPromptCacheKey] = "1";
    std::string ids;
    for (std::size_t i = 0; i < cache.ids.size(); ++i) ids += (i ? "," : "") + std::to_string(cache.ids[i]);
    m["formal_transformers.prompt_ids"] = ids;
    for (const auto& [k, v] : meta) m[k] = v;
    h["__metadata__"] = m;
    std::vector<std::pair<const T*, std::size_t>> parts;  // the tensors' data in the file's order
    std::size_t at = 0;
    auto add = [&](const std::string& name, std::vector<std::size_t> shape, const T* data) {
        std::size_t n = 1;
        for (std::size_t d : shape) n *= d;
        h[name] = {{"dtype", f64 ? "F64" : "F32"}, {"shape", shape}, {"data_offsets", {at, at + n * sizeof(T)}}};
        parts.emplace_back(data, n);
        at += n * sizeof(T);
    };
    const std::size_t l = cache.ids.size();
    for (std::size_t i = 0; i < cache.K.size(); ++i) {  // column-major [rows, ℓ] is row-major [ℓ, rows]
        add("K." + std::to_string(i), {l, cache.K[i].shape(0)}, cache.K[i].data());
        add("V." + std::to_string(i), {l, cache.V[i].shape(0)}, cache.V[i].data());
    }
    add("z", {cache.z.size()}, cache.z.data());
    std::string header = h.dump();
    header.append((8 - header.size() % 8) % 8, ' ');
    const std::string tmp = path + ".tmp";
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        if (!out) throw ValueError(path + ": cannot write " + tmp);
        unsigned char len8[8];
        const std::uint64_t n = header.size();
        for (int i = 0; i < 8; ++i) len8[i] = (unsigned char)(n >> (8 * i));
        out.write(reinterpret_cast<const char*>(len8), 8);
        out.write(header.data(), std::streamsize(header.size()));
        for (const auto& [p, n_el] : parts) out.write(reinterpret_cast<const char*>(p), std::streamsize(n_el * sizeof(T)));
        if (!out.flush()) {
            out.close();
            std::remove(tmp.c_str());
            throw ValueError(path + ": could not write " + tmp);
        }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {  // never a half-written file under the final name
        std::remove(tmp.c_str());
        throw ValueError(path + ": could not rename " + tmp + " onto it");
    }
}

template <class T>
PromptKV<T> read_prompt_kv(const SavedModel& f) {
    constexpr bool f64 = std::is_same_v<T, double>;
    if (!is_prompt_cache(f)) damaged(f.path, "not a prompt cache (a file of DInference.prefill(...).save)");
    const ModelConfig c = f.config();
    PromptKV<T> r;
    const auto ids = f.metadata.find("formal_transformers.prompt_ids");
    if (ids == f.metadata.end() || ids->second.empty()) damaged(f.path, "no prompt ids in the metadata");
    std::size_t i = 0;
    const std::string& s = ids->second;
    while (i <= s.size()) {
        const std::size_t j = std::min(s.find(',', i), s.size());
        const std::string tok = s.substr(i, j - i);
        if (tok.empty() || tok.size() > 18 || tok.find_first_not_of("0123456789") != std::string::npos)
            damaged(f.path, "damaged prompt ids in the metadata");
        r.ids.push_back(index_t(std::stoll(tok)));
        i = j + 1;
    }
    const std::size_t l = r.ids.size();
    auto get = [&](const std::string& name, std::size_t rows) {
        const auto it = f.tensors.find(name);
        if (it == f.tensors.end()) damaged(f.path, "no tensor " + name);
        const SavedModel::Tensor& t = it->second;
        if (t.f64 != f64) damaged(f.path, "tensor " + name + " is not " + (f64 ? "float64" : "float32"));
        const bool vec = rows == 0;
        if (vec ? (t.shape.size() != 1) : (t.shape.size() != 2 || std::size_t(t.shape[0]) != l))
            damaged(f.path, "tensor " + name + " has another shape than the prompt's");
        const std::size_t n_rows = vec ? std::size_t(t.shape[0]) : std::size_t(t.shape[1]);
        Matrix<T> m = Matrix<T>::from_shape({n_rows, vec ? std::size_t(1) : l});
        std::memcpy(m.data(), f.bytes.data() + t.begin, m.size() * sizeof(T));
        return m;
    };
    const index_t L = c.arch == Arch::D ? c.L : 0;
    if (f.tensors.size() != std::size_t(2 * L + 1)) damaged(f.path, "a prompt cache has 2·L + 1 tensors");
    for (index_t k = 0; k < L; ++k) {
        r.K.push_back(get("K." + std::to_string(k), 1));
        r.V.push_back(get("V." + std::to_string(k), 1));
    }
    const Matrix<T> z = get("z", 0);
    r.z.assign(z.data(), z.data() + z.size());
    return r;
}

template void save_prompt_kv<float>(const PromptKV<float>&, const ModelConfig&,
                                    const std::vector<std::pair<std::string, std::string>>&, const std::string&);
template void save_prompt_kv<double>(const PromptKV<double>&, const ModelConfig&,
                                     const std::vector<std::pair<std::string, std::string>>&, const std::string&);
template PromptKV<float> read_prompt_kv<float>(const SavedModel&);
template PromptKV<double> read_prompt_kv<double>(const SavedModel&);

}  // namespace ft
