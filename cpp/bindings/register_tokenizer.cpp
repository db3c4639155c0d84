// Paper §4 (tokenization): CharTokenizer, WordTokenizer, BPETokenizer, chunk. Checks and conversions only;
// the work happens in the core (tokenizer.hpp) with the GIL released.
#include <limits>
#include <memory>
#include <string>
#include <string_view>

#include "bind.hpp"
#include "formal_transformers/tokenizer.hpp"

namespace ftpy {

namespace {
using ft::token_t;

std::string type_name(const py::handle& obj) {
    return py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>();
}

// A Python str as UTF-8 bytes; lone surrogates as "surrogatepass" encodes them. Zero-copy for the usual
// str (CPython caches its UTF-8 form); `keep` holds the encoded copy otherwise.
std::string_view text_arg(const py::handle& obj, const char* what, py::object& keep) {
    if (!PyUnicode_Check(obj.ptr()))
        throw ft::TypeError(std::string(what) + " must be str, got " + type_name(obj));
    Py_ssize_t n = 0;
    const char* p = PyUnicode_AsUTF8AndSize(obj.ptr(), &n);
    if (p) return {p, std::size_t(n)};
    PyErr_Clear();  // lone surrogates
    PyObject* b = PyUnicode_AsEncodedString(obj.ptr(), "utf-8", "surrogatepass");
    if (!b) throw py::error_already_set();
    keep = py::reinterpret_steal<py::object>(b);
    return {PyBytes_AS_STRING(b), std::size_t(PyBytes_GET_SIZE(b))};
}

// UTF-8 + surrogates (what the core's decoders return) -> str
py::str text_out(const std::string& s) {
    PyObject* u = PyUnicode_DecodeUTF8(s.data(), Py_ssize_t(s.size()), "surrogatepass");
    if (!u) throw py::error_already_set();
    return py::reinterpret_steal<py::str>(u);
}

// Token ids out: np.int64 (index_t, what the models take), zero-copy over the core's vector.
py::array_t<index_t> ids_out(std::vector<token_t>&& v) {
    static_assert(std::is_same_v<token_t, index_t>, "one id type from tokenizer to model");
    auto* p = new std::vector<token_t>(std::move(v));
    py::capsule owner(p, [](void* q) { delete static_cast<std::vector<token_t>*>(q); });
    return py::array_t<index_t>({py::ssize_t(p->size())}, {py::ssize_t(sizeof(index_t))}, p->data(), owner);
}

// Token ids to decode: a 1-D integer array (any integer dtype: int64 as encode gives, int32 and others for
// compatibility) or list (may be empty), each in [0, n_vocab).
std::vector<token_t> ids_arg(const py::handle& obj, token_t n_vocab) {
    if (py::isinstance<py::array>(obj)) {
        py::array a = py::reinterpret_borrow<py::array>(obj);
        if (a.ndim() == 1 && a.size() == 0) return {};
    } else if ((py::isinstance<py::list>(obj) || py::isinstance<py::tuple>(obj)) && py::len(obj) == 0) {
        return {};
    } else if (py::isinstance<py::int_>(obj) || py::hasattr(obj, "__index__")) {
        throw ft::TypeError("ids must be a 1-D sequence of token ids, got " + type_name(obj));
    }
    return in_ids(obj, "ids", n_vocab, false).ids;
}

bool bool_arg(const py::handle& obj, const char* what) {
    if (!py::isinstance<py::bool_>(obj) && !(py::hasattr(obj, "dtype") && py::hasattr(obj, "__bool__") &&
                                             py::str(obj.attr("dtype").attr("kind")).cast<std::string>() == "b"))
        throw ft::TypeError(std::string(what) + " must be a bool, got " + type_name(obj));
    return obj.cast<bool>();
}

std::string read_file(const py::object& path) {
    py::object f = py::module_::import("builtins").attr("open")(path, "rb");
    py::bytes data;
    try {
        data = f.attr("read")();
    } catch (...) {
        f.attr("close")();
        throw;
    }
    f.attr("close")();
    return data.cast<std::string>();
}

void write_file(const py::object& path, const std::string& text) {
    py::object f = py::module_::import("builtins").attr("open")(path, "wb");
    try {
        f.attr("write")(py::bytes(text));
    } catch (...) {
        f.attr("close")();
        throw;
    }
    f.attr("close")();
}

// load(path): the core parses; a ValueError gets the file's name.
template <class Tok>
Tok load_from(const char* cls, const py::object& path) {
    const std::string text = read_file(path);
    try {
        py::gil_scoped_release nogil;
        return Tok::from_json(text);
    } catch (const ft::ValueError& e) {
        throw ft::ValueError(std::string(cls) + ".load(" + py::repr(path).cast<std::string>() + "): " + e.what());
    }
}

std::vector<std::string_view> texts_arg(const py::handle& texts, std::vector<py::object>& keep) {
    if (PyUnicode_Check(texts.ptr()))
        throw ft::TypeError("texts must be a list of str (for one text use encode), got str");
    if (!py::isinstance<py::sequence>(texts)) throw ft::TypeError("texts must be a list of str, got " + type_name(texts));
    py::sequence seq = py::reinterpret_borrow<py::sequence>(texts);
    std::vector<std::string_view> views;
    keep.resize(seq.size());
    for (std::size_t k = 0; k < seq.size(); ++k) {
        py::object item = seq[k];
        const std::string name = "texts[" + std::to_string(k) + "]";
        views.push_back(text_arg(item, name.c_str(), keep[k]));
        if (!keep[k]) keep[k] = item;  // keep the str (and its cached UTF-8) alive
    }
    return views;
}

py::object id_or_none(token_t id) { return id < 0 ? py::object(py::none()) : py::object(py::int_(id)); }

// The names of mask/bos/eos for the file readers: None = the default (docs/tokenization.md)
ft::BPETokenizer::Roles roles_arg(const py::handle& mask, const py::handle& bos, const py::handle& eos) {
    ft::BPETokenizer::Roles r;
    const std::pair<const py::handle*, std::string*> all[3] = {{&mask, &r.mask}, {&bos, &r.bos}, {&eos, &r.eos}};
    const char* names[3] = {"mask_token", "bos_token", "eos_token"};
    for (int k = 0; k < 3; ++k) {
        if (all[k].first->is_none()) continue;
        py::object keep;
        *all[k].second = std::string(text_arg(*all[k].first, names[k], keep));
        if (all[k].second->empty()) throw ft::ValueError(std::string(names[k]) + " must not be empty");
    }
    return r;
}

// from_hf_json / from_gpt2_files: ValueError names the file
template <class F>
ft::BPETokenizer read_foreign(const char* what, const py::object& path, F&& f) {
    try {
        return f();
    } catch (const ft::ValueError& e) {
        throw ft::ValueError(std::string("BPETokenizer.") + what + "(" + py::repr(path).cast<std::string>() + "): " + e.what());
    }
}

// The surface common to the three tokenizers.
template <class Tok, class Cls>
void def_common(Cls& cls, const char* name) {
    cls.def_property_readonly("n_vocab", [](const Tok& t) { return t.n_vocab(); },
                              "N_V: regular tokens + the 3 special tokens.")
        .def_property_readonly("mask_token", [](const Tok& t) { return id_or_none(t.specials().mask()); },
                               "N_V − 3 (a BPE tokenizer from another project's file: the file's id of its mask "
                               "token, or None)")
        .def_property_readonly("bos_token", [](const Tok& t) { return id_or_none(t.specials().bos()); },
                               "N_V − 2 (a BPE tokenizer from another project's file: its id, or None)")
        .def_property_readonly("eos_token", [](const Tok& t) { return id_or_none(t.specials().eos()); },
                               "N_V − 1 (a BPE tokenizer from another project's file: its id, or None)")
        .def(
            "encode",
            [](const Tok& t, const py::handle& text, const py::handle& bos, const py::handle& eos) {
                py::object keep;
                const std::string_view s = text_arg(text, "text", keep);
                const bool b = bool_arg(bos, "bos"), e = bool_arg(eos, "eos");
                std::vector<token_t> ids;
                {
                    py::gil_scoped_release nogil;
                    ids = t.encode(s, b, e);
                }
                return ids_out(std::move(ids));
            },
            py::arg("text"), py::arg("bos") = true, py::arg("eos") = true,
            "text (str) -> 1-D np.int64 array [bos_token] x[1..ℓ] [eos_token] (§4). Special ids appear only "
            "where bos/eos ask for them; TypeError unless text is a str.")
        .def(
            "encode_batch",
            [](const Tok& t, const py::handle& texts, const py::handle& bos, const py::handle& eos) {
                std::vector<py::object> keep;
                const auto views = texts_arg(texts, keep);
                const bool b = bool_arg(bos, "bos"), e = bool_arg(eos, "eos");
                std::vector<std::vector<token_t>> out;
                {
                    py::gil_scoped_release nogil;
                    if constexpr (std::is_same_v<Tok, ft::BPETokenizer>) {
                        out = t.encode_batch(views, b, e);
                    } else {
                        out.reserve(views.size());
                        for (auto v : views) out.push_back(t.encode(v, b, e));
                    }
                }
                py::list res;
                for (auto& v : out) res.append(ids_out(std::move(v)));
                return res;
            },
            py::arg("texts"), py::arg("bos") = true, py::arg("eos") = true,
            "A list of str -> a list of 1-D np.int64 arrays, each as encode() gives it.")
        .def(
            "save",
            [](const Tok& t, const py::object& path) { write_file(path, t.to_json()); }, py::arg("path"),
            "Write the tokenizer as JSON (UTF-8; format in docs/tokenization.md).")
        .def("to_json", [](const Tok& t) { return text_out(t.to_json()); }, "The JSON text save() writes.")
        .def_static(
            "from_json",
            [](const py::handle& text) {
                py::object keep;
                const std::string_view s = text_arg(text, "text", keep);
                py::gil_scoped_release nogil;
                return Tok::from_json(s);
            },
            py::arg("text"), "The tokenizer whose to_json() is `text` (ValueError if it is corrupt).")
        .def_static(
            "load", [name](const py::object& path) { return load_from<Tok>(name, path); }, py::arg("path"),
            "Read a file written by save(). ValueError naming the problem if it is corrupt or truncated, or holds "
            "another kind of tokenizer; OSError if it cannot be read.")
        .def("__eq__", [](const Tok& a, const py::object& b) {
            return py::isinstance<Tok>(b) && a == b.cast<const Tok&>();
        })
        .def("__hash__", [](const Tok& t) { return py::hash(py::str(t.to_json())); })
        .def(py::pickle([](const Tok& t) { return py::make_tuple(text_out(t.to_json())); },
                        [](const py::tuple& st) {
                            if (st.size() != 1) throw ft::ValueError("bad pickle state");
                            py::object keep;
                            return Tok::from_json(text_arg(st[0], "state", keep));
                        }));
}

const char* kDecodeDoc =
    "ids (1-D integers of any integer dtype — np.int64 as encode() gives, np.int32 too —, may be empty) -> str. Special ids are skipped (skip_special=True) or rendered as "
    "'<mask>', '<bos>', '<eos>'. IndexError for an id outside [0, n_vocab).";


// GPT-2's pre-tokenizer split, shared by BPETokenizer (its pieces) and WordTokenizer (its words).
py::list pretokenize_py(const py::handle& text) {
    py::object keep;
    const std::string_view s = text_arg(text, "text", keep);
    py::list out;
    for (auto& [b, e] : ft::pretokenize(s)) out.append(text_out(std::string(s.substr(b, e - b))));
    return out;
}

// decode and unk_token: the same for the character and the word tokenizer.
template <class Tok>
void def_decode_and_unk(py::class_<Tok>& cls) {
    cls.def(
           "decode",
           [](const Tok& t, const py::handle& ids, bool skip_special) {
               const auto v = ids_arg(ids, t.n_vocab());
               return text_out(t.decode(v.data(), v.size(), skip_special));
           },
           py::arg("ids"), py::arg("skip_special") = true, kDecodeDoc)
        .def_property_readonly(
            "unk_token",
            [](const Tok& t) -> py::object {
                if (!t.has_unk()) return py::none();
                return py::int_(t.unk_token());
            },
            "N_V − 4 when fit with unk=True, else None.");
}
}  // namespace

void register_tokenizer(py::module_& m) {
    // ----------------------------------------------------------------------------------------------------
    py::class_<ft::BPETokenizer> bpe(
        m, "BPETokenizer",
        "Byte-level Byte Pair Encoding (paper §4; Gage 1994, Sennrich et al. 2016, as in GPT-2).\n\n"
        "Vocabulary: ids 0..255 are the bytes, merge k makes id 256 + k, then mask_token = N_V−3, "
        "bos_token = N_V−2, eos_token = N_V−1. Every str encodes and decodes back exactly (lone surrogates "
        "travel as 'surrogatepass' UTF-8); special ids never arise from text.\n\n"
        "Pre-tokenizer (merges stay inside a piece): GPT-2's rule "
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+ with Unicode 14.0 "
        "letters/numbers (general categories L*, N*) and White_Space, without a regex engine.\n\n"
        "Training: each step merges the adjacent pair with the highest count over the pre-tokenized text "
        "(overlaps counted); ties go to the smallest (left id, right id). It stops at n_vocab or when the best "
        "pair occurs fewer than min_frequency times (then n_vocab is smaller than asked).\n"
        "Encoding applies the merges lowest rank first (leftmost first among equals), O(n log n) per piece.\n\n"
        "Build with BPETokenizer.train(text, n_vocab) or BPETokenizer.load(path).");
    bpe.def_static(
           "train",
           [](const py::handle& text, const py::handle& n_vocab, const py::handle& min_frequency) {
               py::object keep;
               const std::string_view s = text_arg(text, "text", keep);
               const index_t nv = int_arg(n_vocab, "n_vocab"), mf = int_arg(min_frequency, "min_frequency");
               py::gil_scoped_release nogil;
               return ft::BPETokenizer::train(s, nv, mf);
           },
           py::arg("text"), py::arg("n_vocab"), py::arg("min_frequency") = 2,
           "Learn merges on `text` until there are n_vocab tokens in all (n_vocab >= 259 = 256 bytes + 3 "
           "specials, else ValueError). Runs in C++ with the GIL released; Ctrl-C stops it (nothing is built).")
        .def_static(
            "from_merges",
            [](const std::vector<std::pair<PyInt, PyInt>>& pairs) {
                std::vector<std::pair<token_t, token_t>> merges;
                for (std::size_t k = 0; k < pairs.size(); ++k) {
                    const std::string at = "merges[" + std::to_string(k) + "]";
                    merges.emplace_back(token_t(int_arg(pairs[k].first, (at + "[0]").c_str(), 0, std::numeric_limits<token_t>::max())),
                                        token_t(int_arg(pairs[k].second, (at + "[1]").c_str(), 0, std::numeric_limits<token_t>::max())));
                }
                return ft::BPETokenizer::from_merges(merges);
            },
            py::arg("merges"),
            "A tokenizer from a list of (left id, right id) merges; merge k makes id 256 + k and may only use ids "
            "< 256 + k.")
        .def(
            "decode",
            [](const ft::BPETokenizer& t, const py::handle& ids, bool skip_special, const std::string& errors) {
                const auto v = ids_arg(ids, t.n_vocab());
                const ft::utf8::Errors err = ft::utf8::parse_errors(errors);
                std::string s;
                {
                    py::gil_scoped_release nogil;
                    s = t.decode(v.data(), v.size(), skip_special, err);
                }
                return text_out(s);
            },
            py::arg("ids"), py::arg("skip_special") = true, py::arg("errors") = "replace",
            (std::string(kDecodeDoc) +
             "\nThe tokens' bytes are decoded as UTF-8 (surrogates pass, as Python's 'surrogatepass'); other invalid "
             "byte sequences are replaced by U+FFFD exactly as bytes.decode('utf-8', 'replace') does "
             "(errors='replace'), dropped ('ignore') or a ValueError ('strict').")
                .c_str())
        .def(
            "decode_bytes",
            [](const ft::BPETokenizer& t, const py::handle& ids, bool skip_special) {
                const auto v = ids_arg(ids, t.n_vocab());
                return py::bytes(t.decode_bytes(v.data(), v.size(), skip_special));
            },
            py::arg("ids"), py::arg("skip_special") = true, "ids -> the concatenated bytes of the tokens.")
        .def_property_readonly(
            "merges",
            [](const ft::BPETokenizer& t) {
                py::list out;
                for (auto& mg : t.merge_ids()) out.append(py::make_tuple(mg.first, mg.second));
                return out;
            },
            "The merges in rank order: merges[k] = (left id, right id), which made id 256 + k (in a tokenizer "
            "from another project's file: the file's ids, see file_ids).")
        .def_property_readonly(
            "special_tokens",
            [](const ft::BPETokenizer& t) {
                py::list out;
                if (t.file_ids().empty()) {
                    for (token_t id : {t.specials().mask(), t.specials().bos(), t.specials().eos()})
                        out.append(py::make_tuple(id, text_out(t.specials().name(id))));
                } else {
                    for (auto& [id, s] : t.special_tokens()) out.append(py::make_tuple(id, text_out(s)));
                }
                return out;
            },
            "[(id, text)] of the special tokens (never produced from text), by id: ours are (N_V−3, '<mask>'), "
            "(N_V−2, '<bos>'), (N_V−1, '<eos>'); a file's are its added tokens and the vocabulary entries no merge "
            "makes.")
        .def_property_readonly(
            "file_ids",
            [](const ft::BPETokenizer& t) -> py::object {
                if (t.file_ids().empty()) return py::none();
                std::vector<token_t> v = t.file_ids();
                return ids_out(std::move(v));
            },
            "None for our own layout (bytes 0..255, merge k = 256 + k, then mask/bos/eos). For a tokenizer read "
            "from another project's file: the file's id of byte b (file_ids[b], -1 if the file has no token for "
            "it: such bytes are dropped from text, as HF does) and of merge k (file_ids[256 + k]).")
        .def_static(
            "from_hf_json",
            [](const py::object& path, const py::handle& mask, const py::handle& bos, const py::handle& eos) {
                const auto roles = roles_arg(mask, bos, eos);
                const std::string text = read_file(path);
                return read_foreign("from_hf_json", path, [&] {
                    py::gil_scoped_release nogil;
                    return ft::BPETokenizer::from_hf_json(text, roles);
                });
            },
            py::arg("path"), py::kw_only(), py::arg("mask_token") = py::none(), py::arg("bos_token") = py::none(),
            py::arg("eos_token") = py::none(),
            "Read a Hugging Face tokenizer.json of a byte-level BPE (model 'BPE', ByteLevel pre-tokenizer without "
            "add_prefix_space). The file's ids are kept (n_vocab is the file's); mask/bos/eos are the special tokens "
            "named by the arguments, else '<mask>'/'<bos>'/'<eos>' if the file has them, and bos/eos also the "
            "tokens a TemplateProcessing post-processor puts around $A; else None. Other model types (WordPiece, "
            "Unigram, ...) and HF options this tokenizer does not reproduce are a ValueError naming them. "
            "docs/tokenization.md 'Hugging Face and GPT-2 files'.")
        .def(
            "to_hf_json",
            [](const ft::BPETokenizer& t, const py::object& path) {
                std::string s;
                {
                    py::gil_scoped_release nogil;
                    s = t.to_hf_json();
                }
                if (!path.is_none()) write_file(path, s);
                return text_out(s);
            },
            py::arg("path") = py::none(),
            "The tokenizer as a Hugging Face tokenizer.json (written to `path` unless None; the text is returned). "
            "tokenizers.Tokenizer.from_file(path).encode(text).ids equals encode(text) (bos/eos through a "
            "TemplateProcessing post-processor).")
        .def_static(
            "from_gpt2_files",
            [](const py::object& vocab, const py::object& merges, const py::handle& mask, const py::handle& bos,
               const py::handle& eos) {
                const auto roles = roles_arg(mask, bos, eos);
                const std::string v = read_file(vocab), m = read_file(merges);
                return read_foreign("from_gpt2_files", vocab, [&] {
                    py::gil_scoped_release nogil;
                    return ft::BPETokenizer::from_gpt2_files(v, m, roles);
                });
            },
            py::arg("vocab"), py::arg("merges"), py::kw_only(), py::arg("mask_token") = py::none(),
            py::arg("bos_token") = py::none(), py::arg("eos_token") = py::none(),
            "Read GPT-2's vocab.json + merges.txt (ids kept; vocabulary entries no merge makes, e.g. "
            "'<|endoftext|>', are special tokens; name mask/bos/eos among them, e.g. "
            "bos_token='<|endoftext|>', eos_token='<|endoftext|>').")
        .def(
            "to_gpt2_files",
            [](const ft::BPETokenizer& t, const py::object& vocab, const py::object& merges) {
                std::pair<std::string, std::string> f;
                {
                    py::gil_scoped_release nogil;
                    f = t.to_gpt2_files();
                }
                write_file(vocab, f.first);
                write_file(merges, f.second);
            },
            py::arg("vocab"), py::arg("merges"),
            "Write GPT-2's vocab.json (special tokens included under their text) and merges.txt.")
        .def(
            "token_bytes",
            [](const ft::BPETokenizer& t, const PyInt& id_arg) {
                const long long id = int_arg(id_arg, "id");
                if (id < 0 || id >= (long long)t.n_vocab())  // before narrowing to the token type
                    throw ft::IndexError("token id " + std::to_string(id) + " is out of range [0, " +
                                         std::to_string(t.n_vocab()) + ")");
                return py::bytes(t.token_bytes(token_t(id)));
            },
            py::arg("id"), "The bytes of a regular token (IndexError for special or out-of-range ids).")
        .def_static(
            "pretokenize",
            &pretokenize_py,
            py::arg("text"), "The pieces of `text` by the GPT-2 pre-tokenizer rule (their concatenation is text).")
        .def("__repr__", [](const ft::BPETokenizer& t) {
            return "BPETokenizer(n_vocab=" + std::to_string(t.n_vocab()) + ", merges=" + std::to_string(t.merges().size()) + ")";
        });
    def_common<ft::BPETokenizer>(bpe, "BPETokenizer");

    // ----------------------------------------------------------------------------------------------------
    py::class_<ft::CharTokenizer> ch(
        m, "CharTokenizer",
        "Character-level tokenizer (paper §4): one token per Unicode code point.\n\n"
        "Vocabulary: the distinct characters of the fit text in code point order (ids 0..), then unk_token if "
        "fit with unk=True, then mask_token = N_V−3, bos_token = N_V−2, eos_token = N_V−1.\n"
        "Unknown characters at encode time raise ValueError naming the character and its position, unless fit "
        "with unk=True: then they become unk_token (decoded as U+FFFD).\n\n"
        "Build with CharTokenizer.fit(text) or CharTokenizer.load(path).");
    ch.def_static(
          "fit",
          [](const py::handle& text, bool unk) {
              py::object keep;
              const std::string_view s = text_arg(text, "text", keep);
              py::gil_scoped_release nogil;
              return ft::CharTokenizer::fit(s, unk);
          },
          py::arg("text"), py::arg("unk") = false, "The vocabulary of the characters of `text` (ValueError if empty).")
        .def_property_readonly(
            "chars",
            [](const ft::CharTokenizer& t) {
                py::list out;
                for (auto c : t.chars()) {
                    std::string s;
                    ft::utf8::append(s, c);
                    out.append(text_out(s));
                }
                return out;
            },
            "The characters of ids 0, 1, ...")
        .def("__repr__", [](const ft::CharTokenizer& t) {
            return "CharTokenizer(n_vocab=" + std::to_string(t.n_vocab()) + ", chars=" + std::to_string(t.chars().size()) +
                   (t.has_unk() ? ", unk=True)" : ")");
        });
    def_common<ft::CharTokenizer>(ch, "CharTokenizer");
    def_decode_and_unk(ch);

    // ----------------------------------------------------------------------------------------------------
    py::class_<ft::WordTokenizer> wd(
        m, "WordTokenizer",
        "Word-level tokenizer (paper §4): one token per word, a word being a piece of the GPT-2 pre-tokenizer "
        "(a word keeps its leading space, runs of digits, of punctuation and of whitespace are words too), so "
        "decode(encode(s)) == s.\n\n"
        "Vocabulary: the words of the fit text seen at least min_count times, most frequent first (ties by "
        "UTF-8 bytes), at most max_words of them (None: all); then unk_token if fit with unk=True; then "
        "mask_token = N_V−3, bos_token = N_V−2, eos_token = N_V−1.\n"
        "Unknown words at encode time raise ValueError naming the word and its position, unless fit with "
        "unk=True: then they become unk_token (decoded as '<unk>').\n\n"
        "Build with WordTokenizer.fit(text) or WordTokenizer.load(path).");
    wd.def_static(
          "fit",
          [](const py::handle& text, bool unk, const py::handle& min_count, const py::handle& max_words) {
              py::object keep;
              const std::string_view s = text_arg(text, "text", keep);
              const index_t mc = int_arg(min_count, "min_count");
              index_t mw = 0;
              if (!max_words.is_none()) {
                  mw = int_arg(max_words, "max_words");
                  if (mw < 1) throw ft::ValueError("max_words must be a positive int or None, got " + std::to_string(mw));
              }
              py::gil_scoped_release nogil;
              return ft::WordTokenizer::fit(s, unk, mc, mw);
          },
          py::arg("text"), py::arg("unk") = false, py::arg("min_count") = 1, py::arg("max_words") = py::none(),
          "The vocabulary of the words of `text` (ValueError if empty).")
        .def_property_readonly(
            "words",
            [](const ft::WordTokenizer& t) {
                py::list out;
                for (auto& w : t.words()) out.append(text_out(w));
                return out;
            },
            "The words of ids 0, 1, ...")
        .def_static(
            "pretokenize",
            &pretokenize_py,
            py::arg("text"), "The words of `text` (GPT-2's pre-tokenizer rule; their concatenation is text).")
        .def("__repr__", [](const ft::WordTokenizer& t) {
            return "WordTokenizer(n_vocab=" + std::to_string(t.n_vocab()) + ", words=" + std::to_string(t.words().size()) +
                   (t.has_unk() ? ", unk=True)" : ")");
        });
    def_common<ft::WordTokenizer>(wd, "WordTokenizer");
    def_decode_and_unk(wd);

    // ----------------------------------------------------------------------------------------------------
    m.def(
        "chunk",
        [](const py::handle& ids, const py::handle& l_max, const py::handle& stride) {
            if (PyUnicode_Check(ids.ptr()) || PyBytes_Check(ids.ptr()))
                throw ft::TypeError("ids must be a 1-D sequence of token ids, got " + type_name(ids));
            py::array a = py::module_::import("numpy").attr("asarray")(ids);
            if (a.ndim() != 1)
                throw ft::ValueError("ids must be a 1-D sequence of token ids, got shape " + shape_str(a));
            const char kind = a.dtype().kind();
            if (a.size() > 0 && kind != 'i' && kind != 'u')
                throw ft::TypeError("ids must hold integer token ids, got dtype " + py::str(a.dtype()).cast<std::string>());
            const index_t L = int_arg(l_max, "l_max");
            const index_t s = stride.is_none() ? L : int_arg(stride, "stride");
            const auto bounds = ft::chunk_bounds(index_t(a.size()), L, s);
            py::list out;
            for (auto& [b, e] : bounds)
                out.append(a[py::slice(py::ssize_t(b), py::ssize_t(e), 1)].attr("copy")());
            return out;
        },
        py::arg("ids"), py::arg("l_max"), py::arg("stride") = py::none(),
        "§4: split a sequence longer than ℓ_max into pieces of length <= l_max (a list of copies with the dtype of "
        "np.asarray(ids)). Windows start at 0, stride, 2·stride, ... and the last is the first that reaches the "
        "end. stride=None (= l_max) gives disjoint pieces whose concatenation is ids; 1 <= stride < l_max gives "
        "overlapping windows. An empty sequence gives []. ValueError for l_max < 1 or stride outside [1, l_max].");
}


}  // namespace ftpy
