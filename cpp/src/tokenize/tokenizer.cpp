// Paper §4: what the three tokenizers share — the special tokens of the vocabulary layout, the check of
// the ids a decode call gets, and the chunking of sequences longer than ℓ_max. The tokenizers are in
// bpe_tokenizer.cpp and char_word_tokenizer.cpp, the pre-tokenizer in pretokenizer.cpp (tables in
// unicode_tables.cpp), UTF-8 in utf8.cpp, the JSON files in tokenizer_json.cpp.
#include "formal_transformers/tokenizer.hpp"

#include <algorithm>
#include <string>

namespace ft {

// =====================================================================================================
const char* Specials::name(token_t id) const {
    if (id == mask()) return "<mask>";
    if (id == bos()) return "<bos>";
    if (id == eos()) return "<eos>";
    return "";
}

void check_ids(const token_t* ids, std::size_t n, token_t n_vocab, const char* who) {
    for (std::size_t t = 0; t < n; ++t)
        if (ids[t] < 0 || ids[t] >= n_vocab)
            throw IndexError(std::string(who) + ": token id " + std::to_string(ids[t]) + " at position " +
                             std::to_string(t) + " is out of range [0, " + std::to_string(n_vocab) +
                             ") (n_vocab = " + std::to_string(n_vocab) + ")");
}

std::vector<std::pair<index_t, index_t>> chunk_bounds(index_t n, index_t l_max, index_t stride) {
    if (l_max < 1) throw ValueError("chunk: l_max must be a positive integer, got " + std::to_string(l_max));
    if (stride < 1 || stride > l_max)
        throw ValueError("chunk: stride must be in [1, l_max] = [1, " + std::to_string(l_max) + "], got " +
                         std::to_string(stride));
    if (n < 0) throw ValueError("chunk: negative length");
    std::vector<std::pair<index_t, index_t>> out;
    for (index_t b = 0; b < n; b += stride) {
        const index_t e = std::min(b + l_max, n);
        out.emplace_back(b, e);
        if (e == n) break;
    }
    return out;
}

}  // namespace ft
