// Prompt cache files (paged.hpp): the keys and values of a prompt and its last token's logits, written by the
// model files' writer (io.hpp write_safetensors: atomic, finite values) and read back by their reader
// (SavedModel::read), with a digest of the cache's own content.
#include <cstdio>
#include <cstring>

#include "formal_transformers/io.hpp"
#include "formal_transformers/paged.hpp"

namespace ft {

namespace {
constexpr const char* kPromptCacheKey = "formal_transformers.prompt_cache";
constexpr const char* kDigestKey = "formal_transformers.prompt_digest";
[[noreturn]] void damaged(const std::string& path, const std::string& what) { throw ValueError(path + ": " + what); }

// The digest of a cache's content: its ids (as 64-bit integers), then each tensor's bytes in the file's order
// (K.0, V.0, K.1, …, z), each part's digest mixed into the next; 16 hex digits.
struct ContentDigest {
    std::uint64_t r = 0x6A09E667F3BCC908ull;
    void add(const void* p, std::size_t n) {
        std::uint64_t a = r ^ bytes_digest(p, n);
        a ^= a >> 33, a *= 0xFF51AFD7ED558CCDull, a ^= a >> 33, a *= 0xC4CEB9FE1A85EC53ull, a ^= a >> 33;
        r = a;
    }
    std::string hex() const {
        char s[17];
        std::snprintf(s, sizeof s, "%016llx", (unsigned long long)r);
        return s;
    }
};
void add_ids(ContentDigest& d, const std::vector<index_t>& ids) {
    std::vector<std::int64_t> v(ids.begin(), ids.end());
    d.add(v.data(), v.size() * sizeof(std::int64_t));
}
}  // namespace

bool is_prompt_cache(const SavedModel& file) { return file.metadata.count(kPromptCacheKey) > 0; }

template <class T>
void save_prompt_kv(const PromptKV<T>& cache, const ModelConfig& c, const std::vector<std::pair<std::string, std::string>>& meta,
                    const std::string& path) {
    constexpr bool f64 = std::is_same_v<T, double>;
    const index_t l = index_t(cache.ids.size());
    std::vector<TensorBytes> tensors;  // column-major [rows, ℓ] is row-major [ℓ, rows]
    ContentDigest digest;
    add_ids(digest, cache.ids);
    for (std::size_t i = 0; i < cache.K.size(); ++i) {
        tensors.push_back({"K." + std::to_string(i), f64, {l, index_t(cache.K[i].shape(0))}, cache.K[i].data()});
        tensors.push_back({"V." + std::to_string(i), f64, {l, index_t(cache.V[i].shape(0))}, cache.V[i].data()});
        digest.add(cache.K[i].data(), cache.K[i].size() * sizeof(T));
        digest.add(cache.V[i].data(), cache.V[i].size() * sizeof(T));
    }
    tensors.push_back({"z", f64, {index_t(cache.z.size())}, cache.z.data()});
    digest.add(cache.z.data(), cache.z.size() * sizeof(T));
    std::string ids;
    for (std::size_t i = 0; i < cache.ids.size(); ++i) ids += (i ? "," : "") + std::to_string(cache.ids[i]);
    std::vector<std::pair<std::string, std::string>> m = {
        {"formal_transformers.format", "1"},  // a model file's version: the layout and reader are the same
        {"formal_transformers.config", c.to_json(f64 ? "float64" : "float32")},
        {kPromptCacheKey, "2"},
        {"formal_transformers.prompt_ids", ids},
        {kDigestKey, digest.hex()}};
    m.insert(m.end(), meta.begin(), meta.end());
    write_safetensors(path, m, tensors);
}

template <class T>
PromptKV<T> read_prompt_kv(const SavedModel& f) {
    constexpr bool f64 = std::is_same_v<T, double>;
    if (!is_prompt_cache(f)) damaged(f.path, "not a prompt cache (a file of DInference.prefill(...).save)");
    const std::string& version = f.metadata.at(kPromptCacheKey);
    if (version != "1" && version != "2") damaged(f.path, "prompt cache version '" + version + "', this version reads '1' and '2'");
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
    ContentDigest digest;
    add_ids(digest, r.ids);
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
        digest.add(m.data(), m.size() * sizeof(T));
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
    const auto saved = f.metadata.find(kDigestKey);
    if (version == "2" && (saved == f.metadata.end() || saved->second != digest.hex()))
        damaged(f.path, "damaged prompt cache: its ids, keys, values and logits do not have the digest saved with them");
    return r;
}

template void save_prompt_kv<float>(const PromptKV<float>&, const ModelConfig&,
                                    const std::vector<std::pair<std::string, std::string>>&, const std::string&);
template void save_prompt_kv<double>(const PromptKV<double>&, const ModelConfig&,
                                     const std::vector<std::pair<std::string, std::string>>&, const std::string&);
template PromptKV<float> read_prompt_kv<float>(const SavedModel&);
template PromptKV<double> read_prompt_kv<double>(const SavedModel&);

}  // namespace ft
