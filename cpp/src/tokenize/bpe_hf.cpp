// Byte-level BPE (paper §4) in other projects' files: Hugging Face `tokenizers`' tokenizer.json (model
// "BPE" with the ByteLevel pre-tokenizer) and GPT-2's vocab.json + merges.txt. The mapping is stated in
// tokenizer.hpp (BPETokenizer::from_hf_json) and docs/tokenization.md "Hugging Face and GPT-2 files".
#include <algorithm>
#include <array>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <tsl/robin_map.h>

#include "formal_transformers/tokenizer.hpp"
#include "tokenizer_internal.hpp"

namespace ft {
using namespace tok;

// =====================================================================================================
// GPT-2's byte-level alphabet
namespace tok {
namespace {
struct Alphabet {
    std::array<std::uint32_t, 256> cp{};  // byte -> code point
    std::array<std::int16_t, 324> byte{};  // code point (< 324) -> byte, or -1
    Alphabet() {
        byte.fill(-1);
        std::uint32_t n = 0;
        for (int b = 0; b < 256; ++b) {
            const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
            cp[std::size_t(b)] = printable ? std::uint32_t(b) : 256 + n++;
            byte[cp[std::size_t(b)]] = std::int16_t(b);
        }
    }
};
const Alphabet& alphabet() {
    static const Alphabet a;
    return a;
}
}  // namespace

std::string byte_level(std::string_view bytes) {
    std::string out;
    out.reserve(bytes.size() * 2);
    for (char c : bytes) utf8::append(out, alphabet().cp[static_cast<unsigned char>(c)]);
    return out;
}

bool from_byte_level(std::string_view s, std::string& bytes) {
    bytes.clear();
    for (std::size_t i = 0; i < s.size();) {
        std::int32_t cp;
        i += std::size_t(utf8::next(s, i, cp));
        if (cp < 0 || cp >= 324 || alphabet().byte[std::size_t(cp)] < 0) return false;
        bytes += char(alphabet().byte[std::size_t(cp)]);
    }
    return true;
}
}  // namespace tok

// =====================================================================================================
// A file's layout, checked
BPETokenizer BPETokenizer::with_file_ids(std::vector<Merge> merges, std::vector<token_t> ext,
                                         std::vector<std::pair<token_t, std::string>> specials, token_t n_vocab,
                                         const Roles& roles, const char* who) {
    const std::string w = std::string(who) + ": ";
    BPETokenizer t = from_merges(std::move(merges));
    const std::size_t n_int = t.vocab_.size();
    if (ext.size() != n_int)
        throw ValueError(w + "the token ids name " + std::to_string(ext.size()) + " tokens, the merges make " +
                         std::to_string(n_int));
    if (n_vocab < 1) throw ValueError(w + "the vocabulary is empty");
    // Each id 0 .. N_V-1 is used once: a file whose ids leave a gap (e.g. one id 2^31 - 2) fails here, by a
    // count, before the table of N_V entries below is allocated (for such a file it would fill 16 GiB).
    std::size_t named = specials.size();
    for (token_t e : ext) named += e >= 0 ? 1 : 0;
    if (std::size_t(n_vocab) > named) {
        std::vector<token_t> ids;  // the smallest unused id, for the message: O(named log named)
        ids.reserve(named);
        for (token_t e : ext)
            if (e >= 0) ids.push_back(e);
        for (auto& s : specials) ids.push_back(s.first);
        std::sort(ids.begin(), ids.end());
        token_t gap = 0;
        for (token_t id : ids) {
            if (id > gap) break;
            if (id == gap) ++gap;
        }
        throw ValueError(w + "no token has id " + std::to_string(gap) + " (the ids must be 0 .. N_V-1, each used once; " +
                         std::to_string(named) + " tokens cannot fill N_V = " + std::to_string(n_vocab) + ")");
    }
    std::vector<token_t> in(std::size_t(n_vocab), -2);  // file id -> internal id, -1 special, -2 unused
    auto claim = [&](token_t id, token_t what, const std::string& name) {
        if (id < 0 || id >= n_vocab)
            throw ValueError(w + name + " has id " + std::to_string(id) + ", outside [0, " + std::to_string(n_vocab) + ")");
        if (in[std::size_t(id)] != -2)
            throw ValueError(w + "id " + std::to_string(id) + " is given to two tokens (" + name + " and another)");
        in[std::size_t(id)] = what;
    };
    bool lacks = false;
    for (std::size_t i = 0; i < n_int; ++i) {
        if (ext[i] == -1 && i < 256) {
            lacks = true;
            continue;
        }
        claim(ext[i], token_t(i), "token " + quote(byte_level(t.vocab_[i])));
    }
    for (std::size_t k = 0; k < t.merges_.size(); ++k) {
        const auto [a, b] = t.merges_[k];
        if (ext[std::size_t(a)] < 0 || ext[std::size_t(b)] < 0)
            throw ValueError(w + "merge " + std::to_string(k) + " uses a byte that has no token");
    }
    std::sort(specials.begin(), specials.end());
    std::unordered_set<std::string_view> special_names;  // hashed: a file may hold 10^5 of them
    for (std::size_t k = 0; k < specials.size(); ++k) {
        claim(specials[k].first, -1, "special token " + quote(specials[k].second));
        if (!special_names.insert(specials[k].second).second)
            throw ValueError(w + "two special tokens are both " + quote(specials[k].second));
    }
    for (std::size_t id = 0; id < in.size(); ++id)
        if (in[id] == -2)
            throw ValueError(w + "no token has id " + std::to_string(id) + " (the ids must be 0 .. N_V-1, each used once)");
    // mask / bos / eos: named, else the default names
    auto find = [&](const std::string& name, const char* dflt, const char* role) -> token_t {
        const std::string& want = name.empty() ? std::string(dflt) : name;
        for (auto& s : specials)
            if (s.second == want) return s.first;
        if (!name.empty())
            throw ValueError(w + role + "_token " + quote(name) + " is not a special token of the file (its special "
                                 "tokens are the added tokens and the vocabulary entries that no merge makes)");
        return -1;
    };
    Specials sp{n_vocab, find(roles.mask, "<mask>", "mask"), find(roles.bos, "<bos>", "bos"),
                find(roles.eos, "<eos>", "eos")};
    // Our own layout after all (e.g. a file we wrote): keep it as ours.
    bool ours = sp == Specials::layout(n_vocab) && n_vocab == token_t(n_int + 3) && specials.size() == 3 &&
                specials[0].second == "<mask>" && specials[1].second == "<bos>" && specials[2].second == "<eos>";
    for (std::size_t i = 0; ours && i < n_int; ++i) ours = ext[i] == token_t(i);
    if (ours) return t;
    t.ext_ = std::move(ext);
    t.int_ = std::move(in);
    t.specials_ = std::move(specials);
    t.lacks_bytes_ = lacks;
    t.sp_ = sp;
    return t;
}

// =====================================================================================================
// Reading: what tokenizer.json and GPT-2's files have in common (a vocabulary of byte-level strings and a
// merge list of pairs of them)
namespace {
[[noreturn]] void bad(const char* who, const std::string& what) { throw ValueError(std::string(who) + ": " + what); }

struct FileVocab {
    std::vector<std::pair<std::string, token_t>> entries;  // (byte-level text, id)
    std::vector<std::pair<std::string, std::string>> merges;
    std::vector<std::pair<token_t, std::string>> added;  // special added tokens (id, content)
};

BPETokenizer build_from_file(const FileVocab& f, const BPETokenizer::Roles& roles, const char* who,
                             bool has_unk) {
    tsl::robin_map<std::string, token_t> id_of;
    token_t n_vocab = 0;
    for (auto& [s, id] : f.entries) {
        if (id < 0 || id >= INT32_MAX) bad(who, "the vocabulary gives " + quote(s) + " the id " + std::to_string(id));
        if (!id_of.emplace(s, id).second) bad(who, "the vocabulary lists " + quote(s) + " twice");
        n_vocab = std::max(n_vocab, id + 1);
    }
    for (auto& [id, s] : f.added) n_vocab = std::max(n_vocab, id + 1);
    tsl::robin_map<token_t, token_t> internal;  // file id -> internal id, for bytes and merge results
    std::vector<token_t> ext(256, -1);
    bool lacks = false;
    for (int b = 0; b < 256; ++b) {
        const auto it = id_of.find(byte_level(std::string(1, char(b))));
        if (it == id_of.end()) {
            lacks = true;
            continue;
        }
        ext[std::size_t(b)] = it->second;
        internal.emplace(it->second, token_t(b));
    }
    if (lacks && has_unk)
        bad(who, "the vocabulary lacks some bytes and the model has an unk_token; unknown characters becoming unk "
                 "is not supported (byte-level BPE without unk drops them, which is supported)");
    std::vector<BPETokenizer::Merge> merges;
    merges.reserve(f.merges.size());
    for (std::size_t k = 0; k < f.merges.size(); ++k) {
        const auto& [l, r] = f.merges[k];
        token_t side[2];
        for (int j = 0; j < 2; ++j) {
            const std::string& s = j ? r : l;
            const auto it = id_of.find(s);
            if (it == id_of.end()) bad(who, "merge " + std::to_string(k) + " uses " + quote(s) + ", which is not in the vocabulary");
            const auto in = internal.find(it->second);
            if (in == internal.end())
                bad(who, "merge " + std::to_string(k) + " uses " + quote(s) +
                             ", which is neither a byte nor made by an earlier merge (not supported)");
            side[j] = in->second;
        }
        const auto res = id_of.find(l + r);
        if (res == id_of.end())
            bad(who, "merge " + std::to_string(k) + " makes " + quote(l + r) + ", which is not in the vocabulary");
        if (!internal.emplace(res->second, token_t(256 + k)).second)
            bad(who, "merge " + std::to_string(k) + " makes " + quote(l + r) +
                         " again (two merges making one token are not supported)");
        merges.emplace_back(side[0], side[1]);
        ext.push_back(res->second);
    }
    // Special: the added tokens, and the vocabulary entries that are neither a byte nor a merge result
    std::vector<std::pair<token_t, std::string>> specials = f.added;
    tsl::robin_map<token_t, bool> added_ids;
    for (auto& [id, s] : specials) {
        if (internal.count(id)) bad(who, "the added token " + quote(s) + " has the id of a byte or merge token");
        added_ids.emplace(id, true);
    }
    for (auto& [s, id] : f.entries) {
        const auto in = internal.find(id);
        if (in != internal.end()) {
            const token_t i = in->second;  // the byte or merge token with this id: is it this entry?
            const bool same = i < 256 ? s == byte_level(std::string(1, char(i)))
                                      : s == f.merges[std::size_t(i - 256)].first + f.merges[std::size_t(i - 256)].second;
            if (!same) bad(who, "id " + std::to_string(id) + " is given to two tokens (" + quote(s) + " and another)");
            continue;
        }
        if (added_ids.count(id)) continue;
        std::string bytes;  // shown as the bytes its byte-level text spells, as HF's ByteLevel decoder does
        specials.emplace_back(id, from_byte_level(s, bytes) ? bytes : s);
    }
    return BPETokenizer::with_file_ids(std::move(merges), std::move(ext), std::move(specials), n_vocab, roles, who);
}

const Json* member(const Json& d, const char* key) {
    const auto it = d.find(key);
    return it == d.end() || it->is_null() ? nullptr : &*it;
}
// `key` of `d` must be absent, null or (when given) equal to `want`
void require(const Json& d, const char* key, const Json& want, const char* who, const std::string& where) {
    const Json* v = member(d, key);
    if (v && *v != want)
        bad(who, where + "\"" + key + "\" = " + v->dump() + " is not supported (only " + want.dump() + ")");
}
}  // namespace

BPETokenizer BPETokenizer::from_hf_json(std::string_view doc, const Roles& roles_in) {
    const char* who = "tokenizer.json";
    const Json d = parse_json(doc);
    if (!d.is_object()) bad(who, "the document is not a JSON object");
    const Json* model = member(d, "model");
    if (!model || !model->is_object()) bad(who, "no \"model\" object");
    const Json* type = member(*model, "type");
    if (!type || !type->is_string()) bad(who, "the model has no \"type\"");
    if (*type != "BPE")
        bad(who, "the model type is " + type->dump() + "; BPETokenizer reads byte-level BPE (\"BPE\") only");
    for (const char* k : {"normalizer", "truncation", "padding"})
        if (member(d, k)) bad(who, std::string("\"") + k + "\" = " + member(d, k)->dump().substr(0, 80) + " is not supported (only null)");
    const Json* pre = member(d, "pre_tokenizer");
    if (!pre || !pre->is_object() || member(*pre, "type") == nullptr || (*pre)["type"] != "ByteLevel")
        bad(who, "the pre-tokenizer must be ByteLevel (GPT-2's regex), got " + (pre ? pre->dump().substr(0, 80) : "null"));
    if (!pre->contains("add_prefix_space") || (*pre)["add_prefix_space"] != false)
        bad(who, "the ByteLevel pre-tokenizer's \"add_prefix_space\" must be false (a space added before the text is "
                 "not supported)");
    require(*pre, "use_regex", true, who, "the ByteLevel pre-tokenizer's ");
    if (const Json* dec = member(d, "decoder"))
        if (!dec->is_object() || !dec->contains("type") || (*dec)["type"] != "ByteLevel")
            bad(who, "the decoder must be ByteLevel or null, got " + dec->dump().substr(0, 80));
    require(*model, "dropout", nullptr, who, "the model's ");
    require(*model, "byte_fallback", false, who, "the model's ");
    require(*model, "ignore_merges", false, who, "the model's ");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
        if (const Json* v = member(*model, k))
            if (*v != "") bad(who, std::string("the model's \"") + k + "\" = " + v->dump() + " is not supported");
    FileVocab f;
    const Json* vocab = member(*model, "vocab");
    if (!vocab || !vocab->is_object()) bad(who, "the model has no \"vocab\" object");
    for (auto it = vocab->begin(); it != vocab->end(); ++it) {
        if (!is_int(it.value())) bad(who, "the id of " + quote(it.key()) + " is not an integer");
        f.entries.emplace_back(it.key(), token_t(std::clamp<long long>(int_of(it.value()), -1, INT32_MAX)));
    }
    const Json* merges = member(*model, "merges");
    if (!merges || !merges->is_array()) bad(who, "the model has no \"merges\" list");
    for (const Json& m : *merges) {
        if (m.is_string()) {  // "left right" (tokenizers < 0.20)
            const std::string s = text(m);
            const std::size_t sp = s.find(' ');
            if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
                bad(who, "merge " + quote(s) + " is not two tokens separated by one space");
            f.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
        } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
            f.merges.emplace_back(text(m[0]), text(m[1]));
        } else {
            bad(who, "a merge is neither \"left right\" nor [left, right]: " + m.dump().substr(0, 80));
        }
    }
    if (const Json* added = member(d, "added_tokens")) {
        if (!added->is_array()) bad(who, "\"added_tokens\" is not a list");
        for (const Json& a : *added) {
            if (!a.is_object() || !a.contains("id") || !is_int(a["id"]) || !a.contains("content") || !a["content"].is_string())
                bad(who, "an added token is not {\"id\": int, \"content\": str, ...}");
            const std::string content = text(a["content"]);
            if (!a.contains("special") || a["special"] != true)
                bad(who, "the added token " + quote(content) + " is not special: HF would find it in the text, "
                             "which BPETokenizer does not do (not supported)");
            const long long id = int_of(a["id"]);
            if (id < 0 || id >= INT32_MAX) bad(who, "the added token " + quote(content) + " has a bad id");
            f.added.emplace_back(token_t(id), content);
        }
    }
    // bos / eos by default: the special tokens around $A in a TemplateProcessing post-processor
    Roles roles = roles_in;
    if (const Json* post = member(d, "post_processor")) {
        const Json* pt = member(*post, "type");
        if (!pt) bad(who, "the post-processor has no type");
        if (*pt == "TemplateProcessing") {
            const Json* single = member(*post, "single");
            if (!single || !single->is_array()) bad(who, "the TemplateProcessing has no \"single\" template");
            std::vector<std::string> before, after;
            bool seen_a = false;
            for (const Json& piece : *single) {
                if (piece.contains("Sequence")) {
                    if (seen_a) bad(who, "the \"single\" template holds $A twice");
                    seen_a = true;
                } else if (piece.contains("SpecialToken") && piece["SpecialToken"].contains("id") &&
                           piece["SpecialToken"]["id"].is_string()) {
                    (seen_a ? after : before).push_back(text(piece["SpecialToken"]["id"]));
                } else {
                    bad(who, "a piece of the \"single\" template is not understood: " + piece.dump().substr(0, 80));
                }
            }
            if (before.size() > 1 || after.size() > 1)
                bad(who, "the \"single\" template adds more than one token before or after $A (not supported: "
                         "encode adds at most bos before and eos after)");
            if (roles.bos.empty() && !before.empty()) roles.bos = before[0];
            if (roles.eos.empty() && !after.empty()) roles.eos = after[0];
        } else if (*pt != "ByteLevel") {
            bad(who, "the post-processor " + pt->dump() + " is not supported (only ByteLevel, TemplateProcessing or null)");
        }
    }
    const Json* unk = member(*model, "unk_token");
    return build_from_file(f, roles, who, unk != nullptr);
}

BPETokenizer BPETokenizer::from_gpt2_files(std::string_view vocab_json, std::string_view merges_txt, const Roles& roles) {
    const char* who = "GPT-2 files";
    const Json v = parse_json(vocab_json);
    if (!v.is_object()) bad(who, "vocab.json is not a JSON object {token: id}");
    FileVocab f;
    for (auto it = v.begin(); it != v.end(); ++it) {
        if (!is_int(it.value())) bad(who, "vocab.json: the id of " + quote(it.key()) + " is not an integer");
        f.entries.emplace_back(it.key(), token_t(std::clamp<long long>(int_of(it.value()), -1, INT32_MAX)));
    }
    std::size_t line_no = 0;
    for (std::size_t p = 0; p < merges_txt.size();) {
        std::size_t e = merges_txt.find('\n', p);
        if (e == std::string_view::npos) e = merges_txt.size();
        std::string_view line = merges_txt.substr(p, e - p);
        p = e + 1;
        ++line_no;
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line.empty() || (line_no == 1 && line.substr(0, 8) == "#version")) continue;
        const std::size_t sp = line.find(' ');
        if (sp == std::string_view::npos || line.find(' ', sp + 1) != std::string_view::npos)
            bad(who, "merges.txt line " + std::to_string(line_no) + " " + quote(line) +
                         " is not two tokens separated by one space");
        f.merges.emplace_back(std::string(line.substr(0, sp)), std::string(line.substr(sp + 1)));
    }
    return build_from_file(f, roles, who, false);
}

// =====================================================================================================
// Writing
namespace {
// An ordered_json object whose keys are checked for duplicates by a hash set: ordered_json's own lookup
// (contains, operator[]) scans its entries, which made writing a 10^5-entry vocabulary quadratic.
struct OrderedObject {
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    std::unordered_set<std::string> keys;
    bool contains(const std::string& k) const { return keys.count(k) != 0; }
    void add(const std::string& k, nlohmann::ordered_json v) {  // k not yet present (checked by the caller)
        keys.insert(k);
        auto& obj = j.get_ref<nlohmann::ordered_json::object_t&>();
        static_cast<nlohmann::ordered_json::object_t::Container&>(obj).emplace_back(k, std::move(v));
    }
};

std::string dump(const nlohmann::ordered_json& j, const char* who) {
    try {
        return j.dump(1) + "\n";
    } catch (const nlohmann::json::exception&) {
        throw ValueError(std::string(who) + ": a special token's text is not valid UTF-8 (lone surrogates cannot be "
                                            "written to this format)");
    }
}

// The regular tokens as a file's vocabulary (to_hf_json, to_gpt2_files): byte-level spelling -> file id, in
// internal id order, a byte the file has no id for left out; two tokens of one spelling are a ValueError
// (`file`: what cannot hold both).
OrderedObject file_vocab(const std::vector<std::string>& vocab_bytes, const std::vector<token_t>& ext, const char* who,
                         const char* file) {
    OrderedObject vocab;
    tsl::robin_map<std::string, token_t> id_of;
    for (std::size_t i = 0; i < vocab_bytes.size(); ++i) {
        const token_t id = ext.empty() ? token_t(i) : ext[i];
        if (id < 0) continue;
        const std::string key = byte_level(vocab_bytes[i]);
        if (vocab.contains(key))
            throw ValueError(std::string(who) + ": two tokens spell the same bytes " + quote(vocab_bytes[i]) + " (ids " +
                             std::to_string(id_of[key]) + " and " + std::to_string(id) + "); a " + file +
                             " cannot hold both");
        vocab.add(key, id);
        id_of.emplace(key, id);
    }
    return vocab;
}

// The special tokens a file lists, (id, text): the tokenizer's (read from a file), or in our own layout (no file
// ids) mask, bos and eos.
std::vector<std::pair<token_t, std::string>> file_specials(const std::vector<std::pair<token_t, std::string>>& specials,
                                                           const std::vector<token_t>& ext, const Specials& sp) {
    std::vector<std::pair<token_t, std::string>> r = specials;
    if (ext.empty())
        for (token_t id : {sp.mask(), sp.bos(), sp.eos()}) r.emplace_back(id, sp.name(id));
    return r;
}
}  // namespace

std::string BPETokenizer::to_hf_json() const {
    using OJ = nlohmann::ordered_json;
    const char* who = "to_hf_json";
    OJ merges = OJ::array(), added = OJ::array();
    OrderedObject vocab = file_vocab(vocab_, ext_, who, "tokenizer.json vocabulary");
    for (auto [a, b] : merges_) merges.push_back(OJ::array({byte_level(vocab_[std::size_t(a)]), byte_level(vocab_[std::size_t(b)])}));
    for (auto& [id, s] : file_specials(specials_, ext_, sp_))
        added.push_back({{"id", id}, {"content", s}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                         {"normalized", false}, {"special", true}});
    const OJ byte_level_cfg = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
    OJ post = nullptr;
    if (sp_.bos() >= 0 || sp_.eos() >= 0) {  // encode's default [bos] x [eos], as HF's encode(text) gives it
        OJ single = OJ::array(), pair = OJ::array(), toks = OJ::object();
        auto special = [&](token_t id) {
            const std::string name = ext_.empty() ? sp_.name(id) : *special_text(id);
            toks[name] = {{"id", name}, {"ids", {id}}, {"tokens", {name}}};
            return OJ{{"SpecialToken", {{"id", name}, {"type_id", 0}}}};
        };
        if (sp_.bos() >= 0) single.push_back(special(sp_.bos()));
        single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
        if (sp_.eos() >= 0) single.push_back(special(sp_.eos()));
        pair = single;
        pair.push_back({{"Sequence", {{"id", "B"}, {"type_id", 1}}}});
        post = {{"type", "TemplateProcessing"}, {"single", single}, {"pair", pair}, {"special_tokens", toks}};
    }
    OJ d = {{"version", "1.0"},
            {"truncation", nullptr},
            {"padding", nullptr},
            {"added_tokens", added},
            {"normalizer", nullptr},
            {"pre_tokenizer", byte_level_cfg},
            {"post_processor", post},
            {"decoder", byte_level_cfg},
            {"model",
             {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
              {"vocab", std::move(vocab.j)}, {"merges", merges}}}};
    return dump(d, who);
}

std::pair<std::string, std::string> BPETokenizer::to_gpt2_files() const {
    const char* who = "to_gpt2_files";
    OrderedObject vocab = file_vocab(vocab_, ext_, who, "vocab.json");
    for (auto& [id, s] : file_specials(specials_, ext_, sp_)) {
        if (vocab.contains(s))
            throw ValueError(std::string(who) + ": the special token " + quote(s) +
                             " spells the same as a regular token; a vocab.json cannot hold both");
        vocab.add(s, id);
    }
    std::string merges = "#version: 0.2\n";
    for (auto [a, b] : merges_) merges += byte_level(vocab_[std::size_t(a)]) + " " + byte_level(vocab_[std::size_t(b)]) + "\n";
    return {dump(vocab.j, who), merges};
}

}  // namespace ft
