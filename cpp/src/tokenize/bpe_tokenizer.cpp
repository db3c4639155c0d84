// Paper §4: byte-level Byte Pair Encoding (Gage 1994, Sennrich et al. 2016, as in GPT-2): training,
// encoding, decoding and the save format. The rules and design decisions are in tokenizer.hpp and
// docs/tokenization.md.
#include <algorithm>
#include <cstring>
#include <functional>
#include <queue>

#include <tsl/robin_map.h>

#include "formal_transformers/tokenizer.hpp"
#include "tokenizer_internal.hpp"

namespace ft {
using namespace tok;


// =====================================================================================================
// Byte-level BPE
struct BPETokenizer::Index {
    tsl::robin_map<std::uint64_t, token_t, Mix64Hash> rank;  // pair_key(left, right) -> rank
};

void BPETokenizer::build() {
    const std::size_t m = merges_.size();
    check_n_vocab_fits(256 + m, "BPETokenizer");
    vocab_.clear();
    vocab_.reserve(256 + m);
    for (int b = 0; b < 256; ++b) vocab_.emplace_back(1, char(b));
    auto index = std::make_shared<Index>();
    index->rank.reserve(m);
    for (std::size_t k = 0; k < m; ++k) {
        const auto [a, b] = merges_[k];
        const token_t id = token_t(256 + k);
        if (a < 0 || a >= id || b < 0 || b >= id)
            throw ValueError("BPE merge " + std::to_string(k) + " = (" + std::to_string(a) + ", " + std::to_string(b) +
                             ") uses an id that does not exist before it (ids must be < " + std::to_string(id) + ")");
        const auto [it, inserted] = index->rank.try_emplace(pair_key(a, b), token_t(k));
        if (!inserted)
            throw ValueError("BPE merge " + std::to_string(k) + " = (" + std::to_string(a) + ", " + std::to_string(b) +
                             ") repeats merge " + std::to_string(it->second));
        vocab_.push_back(vocab_[std::size_t(a)] + vocab_[std::size_t(b)]);
    }
    index_ = std::move(index);
    sp_ = Specials::layout(token_t(256 + m + 3));
}

token_t BPETokenizer::rank_of(token_t a, token_t b) const {
    const auto it = index_->rank.find(pair_key(a, b));
    return it == index_->rank.end() ? token_t(-1) : it->second;
}

BPETokenizer BPETokenizer::from_merges(std::vector<Merge> merges) {
    BPETokenizer t;
    t.merges_ = std::move(merges);
    t.build();
    return t;
}

std::vector<BPETokenizer::Merge> BPETokenizer::merge_ids() const {
    if (ext_.empty()) return merges_;
    std::vector<Merge> out;
    out.reserve(merges_.size());
    for (auto [a, b] : merges_) out.emplace_back(ext_[std::size_t(a)], ext_[std::size_t(b)]);
    return out;
}

const std::string* BPETokenizer::special_text(token_t file_id) const {
    const auto it = std::lower_bound(specials_.begin(), specials_.end(), file_id,
                                     [](const auto& s, token_t v) { return s.first < v; });
    return it != specials_.end() && it->first == file_id ? &it->second : nullptr;
}

const std::string& BPETokenizer::token_bytes(token_t file_id) const {
    const token_t id = file_id >= 0 && file_id < sp_.n_vocab ? internal_of(file_id) : token_t(-1);
    if (!ext_.empty() && (id < 0 || id >= token_t(vocab_.size()) || ext_[std::size_t(id)] < 0))
        throw IndexError("token_bytes: id " + std::to_string(file_id) + " is not a regular token of this tokenizer "
                         "(a special token, or out of range [0, " + std::to_string(sp_.n_vocab) + "))");
    if (id < 0 || id >= token_t(vocab_.size()))
        throw IndexError("token_bytes: id " + std::to_string(id) + " is not a regular token (regular ids are [0, " +
                         std::to_string(vocab_.size()) + "); specials are " + std::to_string(sp_.mask()) + ", " +
                         std::to_string(sp_.bos()) + ", " + std::to_string(sp_.eos()) + ")");
    return vocab_[std::size_t(id)];
}

// ---------------------------------------------------------------------------------------------------
// Encoding one piece: the merges by rank, lowest first; equal ranks left to right. The symbols form a
// linked list over their first byte's position; a min-heap holds (rank, position) of candidate pairs and
// is invalidated lazily (an entry is used only if merge `rank` still matches the pair at `position`).
// A merge of rank r only creates pairs containing the new id 256 + r, whose merges (if any) have ranks
// > r, so this applies exactly the same merges as GPT-2's loop (encode_piece_naive), in O(n log n).
void BPETokenizer::encode_piece(std::string_view piece, std::vector<token_t>& out) const {
    const std::size_t n = piece.size();
    if (n == 0) return;
    if (n == 1 || merges_.empty()) {
        for (char c : piece) out.push_back(token_t(static_cast<unsigned char>(c)));
        return;
    }
    thread_local std::vector<token_t> id;
    thread_local std::vector<std::int32_t> nxt, prv;
    thread_local std::vector<std::uint64_t> heap;  // rank << 32 | position, min-heap via std::greater
    id.resize(n);
    nxt.resize(n);
    prv.resize(n);
    heap.clear();
    for (std::size_t i = 0; i < n; ++i) {
        id[i] = token_t(static_cast<unsigned char>(piece[i]));
        nxt[i] = std::int32_t(i + 1);  // n = end
        prv[i] = std::int32_t(i) - 1;
    }
    for (std::size_t i = 0; i + 1 < n; ++i) {
        const token_t r = rank_of(id[i], id[i + 1]);
        if (r >= 0) heap.push_back((std::uint64_t(r) << 32) | i);
    }
    std::make_heap(heap.begin(), heap.end(), std::greater<>());
    const std::int32_t end = std::int32_t(n);
    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end(), std::greater<>());
        const std::uint64_t e = heap.back();
        heap.pop_back();
        const token_t r = token_t(e >> 32);
        const std::int32_t i = std::int32_t(e & 0xffffffffu);
        if (id[std::size_t(i)] < 0) continue;  // merged into its left neighbour
        const std::int32_t j = nxt[std::size_t(i)];
        if (j == end) continue;
        const Merge& mg = merges_[std::size_t(r)];
        if (id[std::size_t(i)] != mg.first || id[std::size_t(j)] != mg.second) continue;  // stale
        // merge symbols i and j into 256 + r
        id[std::size_t(i)] = token_t(256 + r);
        id[std::size_t(j)] = -1;
        const std::int32_t k = nxt[std::size_t(j)];
        nxt[std::size_t(i)] = k;
        if (k != end) prv[std::size_t(k)] = i;
        const std::int32_t p = prv[std::size_t(i)];
        if (p >= 0) {
            const token_t r2 = rank_of(id[std::size_t(p)], id[std::size_t(i)]);
            if (r2 >= 0) {
                heap.push_back((std::uint64_t(r2) << 32) | std::uint64_t(p));
                std::push_heap(heap.begin(), heap.end(), std::greater<>());
            }
        }
        if (k != end) {
            const token_t r2 = rank_of(id[std::size_t(i)], id[std::size_t(k)]);
            if (r2 >= 0) {
                heap.push_back((std::uint64_t(r2) << 32) | std::uint64_t(i));
                std::push_heap(heap.begin(), heap.end(), std::greater<>());
            }
        }
    }
    for (std::int32_t i = 0; i != end; i = nxt[std::size_t(i)]) out.push_back(id[std::size_t(i)]);
}

void BPETokenizer::encode_piece_naive(std::string_view piece, std::vector<token_t>& out) const {
    std::vector<token_t> w;
    for (char c : piece) w.push_back(token_t(static_cast<unsigned char>(c)));
    for (;;) {
        token_t best = -1;
        for (std::size_t i = 0; i + 1 < w.size(); ++i) {
            const token_t r = rank_of(w[i], w[i + 1]);
            if (r >= 0 && (best < 0 || r < best)) best = r;
        }
        if (best < 0) break;
        const Merge mg = merges_[std::size_t(best)];
        std::vector<token_t> v;
        for (std::size_t i = 0; i < w.size();) {
            if (i + 1 < w.size() && w[i] == mg.first && w[i + 1] == mg.second) {
                v.push_back(token_t(256 + best));
                i += 2;
            } else {
                v.push_back(w[i++]);
            }
        }
        w.swap(v);
    }
    out.insert(out.end(), w.begin(), w.end());
}

namespace {
// Per-call cache of piece -> ids (the pieces of natural text repeat a lot): open addressing, keys view the
// caller's text (alive for the call), values are ranges of one flat id store. The one table of the
// tokenizers not taken from a library, by measurement: tsl::robin_map here (same hash, stored beside each
// key) cost more instructions and cycles in the hottest loop of encode (docs/benchmarks.md "Tokenizers"); the
// hash is computed once per piece and serves both the lookup and the insertion.
class PieceCache {
public:
    PieceCache() { slots_.assign(1024, Slot{}); }
    // the cached ids of `piece`, or nullptr; `h` is hash(piece)
    const token_t* find(std::string_view piece, std::uint64_t h, std::uint32_t& count) const {
        for (std::size_t i = h & (slots_.size() - 1);; i = (i + 1) & (slots_.size() - 1)) {
            const Slot& s = slots_[i];
            if (!s.p) return nullptr;
            if (s.h == h && s.len == piece.size() && std::memcmp(s.p, piece.data(), piece.size()) == 0) {
                count = s.cnt;
                return store_.data() + s.off;
            }
        }
    }
    void insert(std::string_view piece, std::uint64_t h, const token_t* ids, std::uint32_t count) {
        if (used_ >= kMaxEntries || store_.size() + count > UINT32_MAX) return;
        if (2 * (used_ + 1) > slots_.size()) grow();
        place(Slot{h, piece.data(), std::uint32_t(piece.size()), std::uint32_t(store_.size()), count});
        store_.insert(store_.end(), ids, ids + count);
        ++used_;
    }
    static std::uint64_t hash(std::string_view s) {
        const char* p = s.data();
        std::size_t n = s.size();
        std::uint64_t h = 0x9E3779B97F4A7C15ULL ^ n;
        while (n >= 8) {
            std::uint64_t v;
            std::memcpy(&v, p, 8);
            h = (h ^ v) * 0xff51afd7ed558ccdULL;
            h ^= h >> 32;
            p += 8;
            n -= 8;
        }
        std::uint64_t v = 0;
        std::memcpy(&v, p, n);
        return mix64(h ^ v);
    }

private:
    struct Slot {
        std::uint64_t h = 0;
        const char* p = nullptr;  // nullptr: empty
        std::uint32_t len = 0, off = 0, cnt = 0;
    };
    static constexpr std::size_t kMaxEntries = std::size_t(1) << 22;
    std::vector<Slot> slots_;
    std::vector<token_t> store_;
    std::size_t used_ = 0;

    void place(const Slot& s) {
        std::size_t i = s.h & (slots_.size() - 1);
        while (slots_[i].p) i = (i + 1) & (slots_.size() - 1);
        slots_[i] = s;
    }
    void grow() {
        std::vector<Slot> old(slots_.size() * 2, Slot{});
        old.swap(slots_);
        for (const Slot& s : old)
            if (s.p) place(s);
    }
};

// Text -> ids appended to `out`, in the tokenizer's own ids (a file's, see file_ids()). Bytes a file has no
// token for are dropped before the merges (what HF's BPE model does with characters outside its vocabulary
// when it has no unk token), so the symbols around them may merge.
void encode_text(const BPETokenizer& t, std::string_view text, PieceCache& cache, std::vector<token_t>& out) {
    const std::vector<token_t>& ext = t.file_ids();
    std::string kept;
    for_each_piece(text, [&](std::size_t b, std::size_t e) {
        const std::string_view piece = text.substr(b, e - b);
        if (piece.size() == 1 && ext.empty()) {
            out.push_back(token_t(static_cast<unsigned char>(piece[0])));
            return;
        }
        const std::uint64_t h = PieceCache::hash(piece);
        std::uint32_t count = 0;
        if (const token_t* ids = cache.find(piece, h, count)) {
            out.insert(out.end(), ids, ids + count);
            return;
        }
        const std::size_t start = out.size();
        if (ext.empty()) {
            t.encode_piece(piece, out);
        } else {
            kept.clear();
            for (char c : piece)
                if (ext[static_cast<unsigned char>(c)] >= 0) kept += c;
            t.encode_piece(kept, out);
            for (std::size_t i = start; i < out.size(); ++i) out[i] = ext[std::size_t(out[i])];
        }
        cache.insert(piece, h, out.data() + start, std::uint32_t(out.size() - start));
    });
}

void check_has(token_t id, const char* name) {
    if (id < 0)
        throw ValueError(std::string("encode: this tokenizer has no ") + name + "_token (its file names none; pass " +
                         name + "=False, or name one when loading: " + name + "_token='...')");
}
}  // namespace

std::vector<token_t> BPETokenizer::encode(std::string_view text, bool bos, bool eos) const {
    if (bos) check_has(sp_.bos(), "bos");
    if (eos) check_has(sp_.eos(), "eos");
    std::vector<token_t> out;
    out.reserve(text.size() / 3 + 2);
    if (bos) out.push_back(sp_.bos());
    PieceCache cache;
    encode_text(*this, text, cache, out);
    if (eos) out.push_back(sp_.eos());
    return out;
}

std::vector<std::vector<token_t>> BPETokenizer::encode_batch(const std::vector<std::string_view>& texts, bool bos,
                                                             bool eos) const {
    if (bos) check_has(sp_.bos(), "bos");
    if (eos) check_has(sp_.eos(), "eos");
    std::vector<std::vector<token_t>> out(texts.size());
    PieceCache cache;
    for (std::size_t k = 0; k < texts.size(); ++k) {
        if (bos) out[k].push_back(sp_.bos());
        encode_text(*this, texts[k], cache, out[k]);
        if (eos) out[k].push_back(sp_.eos());
        if ((k & 1023) == 1023) poll();
    }
    return out;
}

std::string BPETokenizer::decode_bytes(const token_t* ids, std::size_t n, bool skip_special) const {
    check_ids(ids, n, sp_.n_vocab, "decode");
    std::string out;
    for (std::size_t t = 0; t < n; ++t) {
        const token_t v = ids[t];
        if (ext_.empty()) {
            if (v < token_t(vocab_.size())) out += vocab_[std::size_t(v)];
            else if (!skip_special) out += sp_.name(v);
        } else if (int_[std::size_t(v)] >= 0) {
            out += vocab_[std::size_t(int_[std::size_t(v)])];
        } else if (!skip_special) {
            out += *special_text(v);
        }
    }
    return out;
}

std::string BPETokenizer::decode(const token_t* ids, std::size_t n, bool skip_special, utf8::Errors errors) const {
    return utf8::sanitize(decode_bytes(ids, n, skip_special), errors);
}

// ---------------------------------------------------------------------------------------------------
// Training (the standard incremental algorithm):
//   1. count the pre-tokenizer's pieces ("words") of the text; each unique word is a sequence of byte ids
//      with a frequency c_w;
//   2. count every adjacent pair over the words, weighted by c_w, and index pair -> words holding it;
//   3. repeat: take the pair with the highest count (ties: smallest (left, right)) from a max-heap whose
//      entries may be stale (an entry whose count no longer matches is re-pushed with the current one;
//      counts of old pairs only decrease, so the first matching entry is the true maximum); append the
//      merge; rewrite only the words that hold the pair, collecting the count changes of the pairs
//      around each occurrence; apply them and push the pairs that the merge created.
BPETokenizer BPETokenizer::train(std::string_view text, index_t n_vocab, index_t min_frequency) {
    if (n_vocab < 259)
        throw ValueError("BPETokenizer.train: n_vocab must be at least 259 = 256 byte tokens + 3 special tokens "
                         "(mask, bos, eos), got " + std::to_string(n_vocab));
    if (n_vocab > INT32_MAX) throw ValueError("BPETokenizer.train: n_vocab too large: " + std::to_string(n_vocab));
    if (min_frequency < 1)
        throw ValueError("BPETokenizer.train: min_frequency must be >= 1, got " + std::to_string(min_frequency));
    const std::size_t target = std::size_t(n_vocab - 259);

    // 1. words
    tsl::robin_map<std::string_view, std::int64_t> piece_count;
    for_each_piece(text, [&](std::size_t b, std::size_t e) { ++piece_count[text.substr(b, e - b)]; });
    poll();
    std::vector<std::vector<token_t>> words;
    std::vector<std::int64_t> wcount;
    words.reserve(piece_count.size());
    wcount.reserve(piece_count.size());
    for (auto& [piece, c] : piece_count) {
        if (piece.size() < 2) continue;  // no pair inside
        std::vector<token_t> w(piece.size());
        for (std::size_t i = 0; i < piece.size(); ++i) w[i] = token_t(static_cast<unsigned char>(piece[i]));
        words.push_back(std::move(w));
        wcount.push_back(c);
    }
    piece_count = {};

    // 2. pair counts and the pair -> words index
    tsl::robin_map<std::uint64_t, std::int64_t, Mix64Hash> count;
    tsl::robin_map<std::uint64_t, std::vector<std::int32_t>, Mix64Hash> where;
    for (std::size_t w = 0; w < words.size(); ++w) {
        const auto& s = words[w];
        for (std::size_t i = 0; i + 1 < s.size(); ++i) {
            const std::uint64_t k = pair_key(s[i], s[i + 1]);
            count[k] += wcount[w];
            auto& ws = where[k];
            if (ws.empty() || ws.back() != std::int32_t(w)) ws.push_back(std::int32_t(w));
        }
    }
    struct Entry {
        std::int64_t count;
        std::uint64_t pair;
        bool operator<(const Entry& o) const {  // "lower priority than": fewer, or as many and a larger pair
            return count < o.count || (count == o.count && pair > o.pair);
        }
    };
    std::vector<Entry> init;
    init.reserve(count.size());
    for (auto& [k, c] : count) init.push_back({c, k});
    std::priority_queue<Entry> heap(std::less<Entry>(), std::move(init));
    poll();

    // 3. merges
    std::vector<Merge> merges;
    merges.reserve(std::min<std::size_t>(target, count.size()));  // n_vocab may be far beyond what the text allows
    std::vector<std::pair<std::uint64_t, std::int64_t>> delta;  // (pair, change of count)
    std::vector<std::pair<std::uint64_t, std::int32_t>> created;  // (new pair, word)
    while (merges.size() < target && !heap.empty()) {
        const Entry top = heap.top();
        heap.pop();
        auto cit = count.find(top.pair);
        const std::int64_t cur = cit == count.end() ? 0 : cit->second;
        if (cur != top.count) {  // stale
            if (cur > 0) heap.push({cur, top.pair});
            continue;
        }
        if (cur < min_frequency) break;
        const token_t a = key_left(top.pair), b = key_right(top.pair);
        const token_t X = token_t(256 + merges.size());
        merges.emplace_back(a, b);

        delta.clear();
        created.clear();
        auto wit = where.find(top.pair);
        std::vector<std::int32_t> ws;
        if (wit != where.end()) {
            ws = std::move(wit.value());
            where.erase(wit);
        }
        for (const std::int32_t w : ws) {
            auto& s = words[std::size_t(w)];
            const std::int64_t c = wcount[std::size_t(w)];
            const std::size_t n = s.size();
            std::size_t o = 0;  // rewrite in place: s[0, o) is the output so far, s[i, n) the input left
            for (std::size_t i = 0; i < n;) {
                if (i + 1 < n && s[i] == a && s[i + 1] == b) {
                    if (o > 0) {  // the pair on the left: (p, a) becomes (p, X)
                        const token_t p = s[o - 1];
                        delta.emplace_back(pair_key(p, a), -c);
                        delta.emplace_back(pair_key(p, X), +c);
                        created.emplace_back(pair_key(p, X), w);
                    }
                    if (i + 2 < n) {  // the pair on the right: (b, x) becomes (X, x)
                        const token_t x = s[i + 2];
                        delta.emplace_back(pair_key(b, x), -c);
                        delta.emplace_back(pair_key(X, x), +c);
                        created.emplace_back(pair_key(X, x), w);
                    }
                    s[o++] = X;
                    i += 2;
                } else {
                    s[o++] = s[i++];
                }
            }
            s.resize(o);
        }
        count.erase(top.pair);
        // apply the changes, summed per pair
        std::sort(delta.begin(), delta.end());
        for (std::size_t k = 0; k < delta.size();) {
            const std::uint64_t p = delta[k].first;
            std::int64_t d = 0;
            for (; k < delta.size() && delta[k].first == p; ++k) d += delta[k].second;
            if (p == top.pair || d == 0) continue;
            auto it = count.find(p);
            std::int64_t& c = it == count.end() ? count[p] : it.value();
            c += d;
            FT_CHECK(c >= 0, "BPE training: negative pair count");
            if (c == 0) {
                count.erase(p);
                where.erase(p);
            } else if (d > 0) {
                heap.push({c, p});
            }
        }
        for (auto& [p, w] : created) {
            if (!count.count(p)) continue;
            auto& list = where[p];
            if (list.empty() || list.back() != w) list.push_back(w);
        }
        poll();
    }
    return from_merges(std::move(merges));
}

// ---------------------------------------------------------------------------------------------------
// Save format: see docs/tokenization.md. "merges" is authoritative; the text after each pair (the new
// token's bytes, rendered) is for the reader and is checked on load.
std::string BPETokenizer::to_json() const {
    std::string out;
    if (ext_.empty()) {
        out = json_header("bpe", sp_);
    } else {  // a file's own ids (docs/tokenization.md): its special tokens, their roles, the id of each token
        out = json_header("bpe", sp_.n_vocab);
        out += "  \"special_tokens\": [";
        for (std::size_t k = 0; k < specials_.size(); ++k) {
            out += (k ? ", [" : "[") + std::to_string(specials_[k].first) + ", ";
            json_string(out, specials_[k].second);
            out += "]";
        }
        out += "],\n  \"roles\": {";
        const std::pair<const char*, token_t> roles[3] = {{"mask", sp_.mask()}, {"bos", sp_.bos()}, {"eos", sp_.eos()}};
        for (int r = 0; r < 3; ++r) {
            out += std::string(r ? ", \"" : "\"") + roles[r].first + "\": ";
            if (roles[r].second < 0) out += "null";
            else json_string(out, *special_text(roles[r].second));
        }
        out += "},\n  \"file_ids\": [";
        for (std::size_t k = 0; k < ext_.size(); ++k) out += (k ? (k % 16 ? ", " : ",\n    ") : "") + std::to_string(ext_[k]);
        out += "],\n";
    }
    out += "  \"pre_tokenizer\": \"gpt2\",\n";
    out += "  \"merges\": [";
    for (std::size_t k = 0; k < merges_.size(); ++k) {
        out += k ? ",\n    [" : "\n    [";
        out += std::to_string(merges_[k].first) + ", " + std::to_string(merges_[k].second) + ", ";
        json_string(out, render(vocab_[256 + k]));
        out += "]";
    }
    out += merges_.empty() ? "]\n}\n" : "\n  ]\n}\n";
    return out;
}

BPETokenizer BPETokenizer::from_json(std::string_view doc) {
    const Json d = read_document(doc, "bpe");
    if (field_text(d, "pre_tokenizer") != "gpt2") corrupt("\"pre_tokenizer\" must be \"gpt2\"");
    const Json& m = field_of(d, "merges", Json::value_t::array);
    std::vector<Merge> merges;
    merges.reserve(m.size());
    for (std::size_t k = 0; k < m.size(); ++k) {
        const Json& e = m[k];
        if (!e.is_array() || e.size() != 3 || !is_int(e[0]) || !is_int(e[1]) || !e[2].is_string())
            corrupt("merge " + std::to_string(k) + " is not [left id, right id, text]");
        const long long lim = 256 + (long long)k, l = int_of(e[0]), r = int_of(e[1]);
        if (l < 0 || l >= lim || r < 0 || r >= lim)
            corrupt("merge " + std::to_string(k) + " uses an id that does not exist before it");
        merges.emplace_back(token_t(l), token_t(r));
    }
    BPETokenizer t;
    t.merges_ = std::move(merges);
    try {
        t.build();
    } catch (const ValueError& e) {
        corrupt(e.what());
    }
    for (std::size_t k = 0; k < m.size(); ++k)
        if (text(m[k][2]) != render(t.vocab_[256 + k]))
            corrupt("merge " + std::to_string(k) + ": its text \"" + render(text(m[k][2])) +
                    "\" does not match the merged tokens \"" + render(render(t.vocab_[256 + k])) + "\"");
    if (d.contains("file_ids")) {  // a file's own ids
        std::vector<token_t> ext;
        for (const Json& v : field_of(d, "file_ids", Json::value_t::array)) {
            if (!is_int(v) || int_of(v) < -1 || int_of(v) >= INT32_MAX) corrupt("\"file_ids\" holds a bad id");
            ext.push_back(token_t(int_of(v)));
        }
        std::vector<std::pair<token_t, std::string>> specials;
        for (const Json& s : field_of(d, "special_tokens", Json::value_t::array)) {
            if (!s.is_array() || s.size() != 2 || !is_int(s[0]) || int_of(s[0]) < 0 || int_of(s[0]) >= INT32_MAX ||
                !s[1].is_string())
                corrupt("\"special_tokens\" must be a list of [id, text]");
            specials.emplace_back(token_t(int_of(s[0])), text(s[1]));
        }
        const Json& r = field_of(d, "roles", Json::value_t::object);
        Roles roles;
        std::string* dst[3] = {&roles.mask, &roles.bos, &roles.eos};
        const char* names[3] = {"mask", "bos", "eos"};
        for (int k = 0; k < 3; ++k) {
            const Json& v = field(r, names[k]);
            if (v.is_string()) *dst[k] = text(v);
            else if (!v.is_null()) corrupt(std::string("\"roles\": \"") + names[k] + "\" must be a token's text or null");
        }
        const long long n = field_int(d, "n_vocab");
        if (n < 0 || n >= INT32_MAX) corrupt("\"n_vocab\" is out of range");
        try {
            return with_file_ids(t.merges_, std::move(ext), std::move(specials), token_t(n), roles, "tokenizer file");
        } catch (const ValueError& e) {
            corrupt(e.what());
        }
    }
    check_layout(d, t.sp_);
    return t;
}

}  // namespace ft
