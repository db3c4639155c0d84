// ft::save / ft::load (io.hpp): round trips of the three models (θ bit for bit, the config, dropout's counter
// and seed, the outputs), conversion between dtypes, and files that are not a saved model of that kind.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>

#include "formal_transformers/block_sparse.hpp"
#include "formal_transformers/io.hpp"
#include "testing.hpp"

using namespace ft;

namespace {
std::string tmp_path(const char* name) { return testing::TempDir() + std::string("ft_io_") + name + ".safetensors"; }

ModelConfig sized(Arch arch) {
    ModelConfig c;
    c.n_vocab = 9;
    c.l_max = 5;
    c.L = 2;
    c.L_enc = 1;
    c.L_dec = 2;
    c.H = 2;
    c.d_e = 4;
    c.d_mlp = 6;
    c.d_f = arch == Arch::E ? 3 : 0;
    c.d_attn = 3;  // stacked heads: row-major copies of (H, d_attn, d_e) must keep each head's block
    c.seed = 11;
    if (arch == Arch::E) c.part_options.set("n_segments", std::int64_t(2));
    if (arch == Arch::D) c.positional = "sinusoidal";  // a fixed (frozen) entry in θ
    c.resid_dropout = 0.1;
    return c;
}

template <class M, class In>
void expect_round_trip(const ModelConfig& c, In&& run, const char* name) {
    M m(c);
    m.dropout_step = 42;
    m.dropout_seed = 1234567;
    for (index_t i = 0; i < m.store.size(); ++i) m.store.theta()[i] += 0.001 * double(i % 17);  // not the init
    const std::string path = tmp_path(name);
    save(m, path);
    M back = load<M>(path);
    EXPECT_TRUE(back.cfg == m.cfg);
    EXPECT_EQ(back.dropout_step, 42u);
    EXPECT_EQ(back.dropout_seed, 1234567u);
    ASSERT_EQ(back.store.size(), m.store.size());
    for (index_t i = 0; i < m.store.size(); ++i) ASSERT_EQ(back.store.theta()[i], m.store.theta()[i]) << i;
    EXPECT_EQ(run(back), run(m));
    std::remove(path.c_str());
}
}  // namespace

TEST(SaveLoad, RoundTripOfEachModel) {
    const std::vector<index_t> x = {1, 4, 2, 6, 3};
    expect_round_trip<DTransformer<double>>(sized(Arch::D), [&](DTransformer<double>& m) {
        return m.loss(Tokens{x.data(), Seqs::single(index_t(x.size()))});
    }, "d");
    expect_round_trip<ETransformer<float>>(sized(Arch::E), [&](ETransformer<float>& m) {
        std::vector<index_t> xt = x;
        xt[1] = m.cfg.mask_token();
        return m.loss(Tokens{xt.data(), Seqs::single(index_t(x.size()))}, x.data());
    }, "e");
    expect_round_trip<EDTransformer<double>>(sized(Arch::ED), [&](EDTransformer<double>& m) {
        return m.loss(Tokens{x.data(), Seqs::single(3)}, Tokens{x.data(), Seqs::single(index_t(x.size()))});
    }, "ed");
}

TEST(SaveLoad, ConvertsBetweenDtypesAndChecksTheArchitecture) {
    const ModelConfig c = sized(Arch::D);
    DTransformer<double> m(c);
    const std::string path = tmp_path("conv");
    save(m, path);
    const auto f = load<DTransformer<float>>(path);
    for (index_t i = 0; i < m.store.size(); ++i) ASSERT_EQ(f.store.theta()[i], float(m.store.theta()[i]));
    try {
        load<ETransformer<double>>(path);
        ADD_FAILURE() << "an ETransformer from a DTransformer's file";
    } catch (const ValueError& e) {
        EXPECT_NE(std::string(e.what()).find("holds a DTransformer"), std::string::npos) << e.what();
    }
    // a damaged file: cut short, then garbage
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    for (std::size_t keep : {std::size_t(4), bytes.size() / 2, bytes.size() - 1}) {
        std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(keep));
        EXPECT_THROW(load<DTransformer<double>>(path), ValueError) << keep;
    }
    std::ofstream(path, std::ios::binary | std::ios::trunc) << "\x10\0\0\0\0\0\0\0{\"a\": 1}        ";
    EXPECT_THROW(load<DTransformer<double>>(path), ValueError);
    std::remove(path.c_str());
    EXPECT_THROW(load<DTransformer<double>>(path), ValueError);  // no file
}

// A file whose config claims more layers than it has tensors is refused before the model is built (issue 27:
// building L = 10^5 layers first took seconds, then failed on the missing tensors anyway).
TEST(SaveLoad, RefusesMoreLayersThanTensorsBeforeBuilding) {
    const std::string config =
        R"({\"arch\":\"DTransformer\",\"n_vocab\":9,\"l_max\":5,\"L\":100000,\"H\":2,\"d_e\":4,\"d_mlp\":6})";
    const std::string header = R"({"__metadata__":{"formal_transformers.format":"1","formal_transformers.config":")" +
                               config + "\"}}";
    std::string bytes(8, '\0');
    for (int k = 0; k < 8; ++k) bytes[std::size_t(k)] = char((header.size() >> (8 * k)) & 0xff);
    bytes += header;
    const std::string path = tmp_path("layers");
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
    try {
        load<DTransformer<double>>(path);
        ADD_FAILURE() << "a model from a file without tensors";
    } catch (const ValueError& e) {
        EXPECT_NE(std::string(e.what()).find("the config has 100000 layers, the file only 0 tensors"), std::string::npos)
            << e.what();
    }
    std::remove(path.c_str());
}

// BigBird (V17): given layouts are kept by the file (every given length, layer and head, multiplicities included) and
// installed by load; a model without given layouts writes no layouts; a file whose config has no bigbird_draw (written
// before it existed) loads with the per-layer draw it was made with (every head head 0's layout).
namespace {
ModelConfig bigbird_config() {
    ModelConfig c;
    c.n_vocab = 9, c.l_max = 16, c.L = 2, c.H = 3, c.d_e = 6, c.d_mlp = 4, c.d_f = 4, c.seed = 5;
    c.attention = "bigbird";
    c.part_options.set("block_size", std::int64_t(2)), c.part_options.set("n_random_blocks", std::int64_t(2));
    c.part_options.set("layout_seed", std::uint64_t(3));
    return resolve(c, Arch::E);
}
double bigbird_loss(ETransformer<double>& m, index_t l) {
    std::vector<index_t> x(static_cast<std::size_t>(l)), xt;
    for (index_t t = 0; t < l; ++t) x[std::size_t(t)] = (t * 5 + 1) % 6;
    xt = x;
    xt[1] = xt[6] = m.cfg.mask_token();
    return m.loss(Tokens{xt.data(), Seqs::single(l)}, x.data());
}
std::vector<std::vector<index_t>> all_keys(const ETransformer<double>& m, index_t n) {
    std::vector<std::vector<index_t>> r;
    for (index_t l = 0; l < m.cfg.L; ++l)
        for (index_t h = 0; h < m.cfg.H; ++h) r.push_back(bigbird_mask_layout(m.layer[std::size_t(l)]->attn.mask, n, h)->keys);
    return r;
}
}  // namespace

TEST(SaveLoad, BigBirdGivenLayoutsAreKept) {
    ETransformer<double> m(bigbird_config());
    for (index_t i = 0; i < m.store.size(); ++i) m.store.theta()[i] += 0.01 * double(i % 13);
    const std::string path = tmp_path("bigbird");
    save(m, path);
    EXPECT_EQ(SavedModel::read(path).metadata.count(kBigBirdLayoutsKey), 0u);  // none given: the file as before
    // 8 blocks: one per head, with repeated blocks; 7 blocks: one per layer for every head
    auto shifted = [](index_t n, index_t shift, index_t rep) {
        std::vector<std::vector<index_t>> k(static_cast<std::size_t>(n));
        for (index_t i = 0; i < n; ++i) k[std::size_t(i)] = {i, (i + shift) % n};
        k[std::size_t(shift)].insert(k[std::size_t(shift)].end(), std::size_t(rep), 0);
        return explicit_layout(2, k);
    };
    set_bigbird_layouts(m, {{shifted(8, 1, 1), shifted(8, 2, 2), shifted(8, 3, 0)}, {shifted(8, 4, 1), shifted(8, 5, 0), shifted(8, 6, 3)}});
    set_bigbird_layouts(m, {{shifted(7, 1, 0)}, {shifted(7, 2, 0)}});
    const double at16 = bigbird_loss(m, 16), at14 = bigbird_loss(m, 14);
    save(m, path);
    EXPECT_EQ(SavedModel::read(path).metadata.at(kBigBirdLayoutsKey), bigbird_layouts_json(m));
    auto back = load<ETransformer<double>>(path);
    for (index_t n : {7, 8}) EXPECT_EQ(all_keys(back, n), all_keys(m, n)) << n;
    EXPECT_EQ(bigbird_layouts_json(back), bigbird_layouts_json(m));
    EXPECT_EQ(given_bigbird_layouts(back).at(7)[0].size(), 1u);  // as given: one for every head
    EXPECT_EQ(bigbird_loss(back, 16), at16);  // bit for bit
    EXPECT_EQ(bigbird_loss(back, 14), at14);
    ETransformer<double> fresh(m.cfg);  // the config alone draws other layouts
    EXPECT_NE(all_keys(fresh, 8), all_keys(m, 8));
    std::remove(path.c_str());
}

// Layouts given to ONE layer's mask (the low-level set_bigbird_layouts): the file holds that layer's and the other
// layers' drawn ones at that length, and loads into the same model (it used to save empty layers that no load took)
TEST(SaveLoad, BigBirdLayoutsGivenToOneLayerAreSavedWithTheOthersDraws) {
    ETransformer<double> m(bigbird_config());
    for (index_t i = 0; i < m.store.size(); ++i) m.store.theta()[i] += 0.01 * double(i % 11);
    std::vector<std::vector<index_t>> k(8);
    for (index_t i = 0; i < 8; ++i) k[std::size_t(i)] = {i, (i + 3) % 8};
    set_bigbird_layouts(m.layer[1]->attn.mask, {explicit_layout(2, k)});
    const double at16 = bigbird_loss(m, 16);
    const std::string path = tmp_path("bigbird_one_layer");
    save(m, path);
    auto back = load<ETransformer<double>>(path);
    EXPECT_EQ(all_keys(back, 8), all_keys(m, 8));
    EXPECT_EQ(bigbird_loss(back, 16), at16);  // bit for bit
    std::remove(path.c_str());
}

TEST(SaveLoad, BigBirdFileWithoutBigBirdDrawLoadsThePerLayerDraw) {
    ETransformer<double> m(bigbird_config());
    const std::string path = tmp_path("bigbird_old");
    save(m, path);
    ASSERT_EQ(load<ETransformer<double>>(path).cfg.part_options.choice("bigbird_draw"), "per_head");
    // the file as written before bigbird_draw existed: the option taken out of the config in its header
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    std::uint64_t n = 0;
    for (int k = 7; k >= 0; --k) n = (n << 8) | (unsigned char)bytes[std::size_t(k)];
    std::string header = bytes.substr(8, std::size_t(n));
    const std::string field = R"(,\"bigbird_draw\":\"per_head\")";
    const auto at = header.find(field);
    ASSERT_NE(at, std::string::npos) << header;
    header.erase(at, field.size());
    std::string old(8, '\0');
    for (int k = 0; k < 8; ++k) old[std::size_t(k)] = char((header.size() >> (8 * k)) & 0xff);
    old += header + bytes.substr(8 + std::size_t(n));
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(old.data(), std::streamsize(old.size()));
    const auto back = load<ETransformer<double>>(path);
    EXPECT_EQ(back.cfg.part_options.choice("bigbird_draw"), "per_layer");
    const auto keys = all_keys(back, 8), now = all_keys(m, 8);
    for (index_t l = 0; l < 2; ++l)
        for (index_t h = 0; h < 3; ++h) EXPECT_EQ(keys[std::size_t(3 * l + h)], now[std::size_t(3 * l)]) << l << h;  // head 0's
    EXPECT_NE(keys, now);
    std::remove(path.c_str());
}

// The one reader against hostile files (the C++ side of tests/python/test_file_formats.py): a config nested deeper
// than the bound, a config asking for more parameters or layers than the file holds (refused before the model is
// built), dropout counters that are not ASCII decimal, tensors that do not tile the data, non-finite values.
namespace {
std::string read_all(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
// path's file with its header replaced by edit(header text) and its data by edit_data(data)
template <class Edit, class EditData>
void rewrite(const std::string& path, Edit&& edit, EditData&& edit_data) {
    const std::string bytes = read_all(path);
    std::uint64_t n = 0;
    for (int k = 7; k >= 0; --k) n = (n << 8) | (unsigned char)bytes[std::size_t(k)];
    std::string header = edit(bytes.substr(8, std::size_t(n)));
    std::string data = edit_data(bytes.substr(8 + std::size_t(n)));
    std::string out(8, '\0');
    for (int k = 0; k < 8; ++k) out[std::size_t(k)] = char((header.size() >> (8 * k)) & 0xff);
    out += header + data;
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(out.data(), std::streamsize(out.size()));
}
std::string replaced(std::string s, const std::string& from, const std::string& to) {
    const auto at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from << " in " << s;
    if (at != std::string::npos) s.replace(at, from.size(), to);
    return s;
}
std::string keep(std::string s) { return s; }
void expect_refused(const std::string& path, const std::string& what) {
    try {
        load<DTransformer<double>>(path);
        ADD_FAILURE() << "loaded; expected: " << what;
    } catch (const ValueError& e) {
        EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
}
}  // namespace

TEST(SaveLoad, HostileFilesAreValueErrors) {
    const std::string path = tmp_path("hostile");
    DTransformer<double> m(sized(Arch::D));
    auto fresh = [&] { save(m, path); };
    // a config nested 100,000 deep (a stack overflow before)
    fresh();
    rewrite(path, [](const std::string& h) { return replaced(h, R"(\"arch\":)", R"(\"x\":)" + std::string(100000, '[') + std::string(100000, ']') + R"(,\"arch\":)"); }, keep);
    expect_refused(path, "nested deeper than 64 levels");
    // more parameters than the file holds, and more layers (MTP modules counted): refused before building
    fresh();
    rewrite(path, [](const std::string& h) { return replaced(h, R"(\"n_vocab\":9)", R"(\"n_vocab\":30000000)"); }, keep);
    expect_refused(path, "needs more parameters than the file's");
    // dropout counters: ASCII decimal only
    for (const char* bad : {"5 ", "5_000", "\xd9\xa1\xd9\xa2", "-1", "+5", "1e3"}) {
        fresh();
        rewrite(path, [&](const std::string& h) {
            return replaced(h, R"("formal_transformers.dropout_step":"0")", std::string(R"("formal_transformers.dropout_step":")") + bad + "\"");
        }, keep);
        expect_refused(path, "damaged dropout_step in the metadata");
    }
    // the tensors tile the data: trailing bytes, a shifted table
    fresh();
    rewrite(path, keep, [](std::string d) { return d + std::string(8, '\0'); });
    expect_refused(path, "bytes after the last tensor");
    fresh();
    rewrite(path, [](const std::string& h) { return replaced(h, R"("data_offsets":[0,)", R"("data_offsets":[8,)"); }, keep);
    expect_refused(path, "data_offsets");
    // a byte order mark before the header; a key twice
    fresh();
    rewrite(path, [](const std::string& h) { return "\xEF\xBB\xBF" + h; }, keep);
    expect_refused(path, "byte order mark");
    fresh();
    rewrite(path, [](const std::string& h) { return replaced(h, R"({"__metadata__":)", R"({"__metadata__":{},"__metadata__":)"); }, keep);
    expect_refused(path, "twice in one object");
    // a NaN parameter, named
    fresh();
    rewrite(path, keep, [](std::string d) {
        const double nan = std::numeric_limits<double>::quiet_NaN();
        std::memcpy(d.data() + 8, &nan, 8);
        return d;
    });
    expect_refused(path, "holds a value that is not finite (NaN or ±inf) at element 1");
    std::remove(path.c_str());
}

TEST(SaveLoad, WritesThroughAUniqueTemporaryAndLeavesTheOldFileOnFailure) {
    const std::string path = tmp_path("atomic");
    DTransformer<double> m(sized(Arch::D));
    save(m, path);
    std::ofstream(path + ".tmp") << "another program's file";  // the fixed name of before: not touched
    m.store.theta()[3] = std::numeric_limits<double>::infinity();
    EXPECT_THROW(save(m, path), ValueError);  // a file no reader accepts is not written
    m.store.theta()[3] = 0.5;
    EXPECT_NE(load<DTransformer<double>>(path).store.theta()[3], 0.5);  // the old file
    save(m, path);
    EXPECT_EQ(load<DTransformer<double>>(path).store.theta()[3], 0.5);
    EXPECT_EQ(read_all(path + ".tmp"), "another program's file");
    std::remove(path.c_str());
    std::remove((path + ".tmp").c_str());
}

// A file whose config holds an option of a part it does not choose (rope_theta with the sinusoidal table, written
// before rope_theta was the rope position's, or edited): it loads at the option's default (it had no effect), and
// the file names it (ft.load warns with the note); a save after writes the default and has nothing to say
TEST(SaveLoad, AnOptionOfAPartNotChosenIsNamedAndLoadsAtItsDefault) {
    DTransformer<double> m(sized(Arch::D));
    const std::string path = tmp_path("unchosen");
    save(m, path);
    EXPECT_TRUE(SavedModel::read(path).unchosen_options().empty());
    rewrite(path, [](std::string h) { return replaced(h, R"(\"rope_theta\":10000.0)", R"(\"rope_theta\":500.0)"); }, keep);
    const SavedModel file = SavedModel::read(path);
    const std::vector<std::string> notes = file.unchosen_options();
    ASSERT_EQ(notes.size(), 1u);
    EXPECT_EQ(notes[0], path + ": rope_theta = 500.0 is an option of the 'rope' position, which the file's config does "
                               "not choose: it had no effect on the outputs and loads at its default (10000.0)");
    const auto back = load<DTransformer<double>>(path);
    EXPECT_EQ(back.cfg.part_options.real("rope_theta"), 10000.0);
    EXPECT_TRUE(back.cfg == m.cfg);
    save(back, path);
    EXPECT_TRUE(SavedModel::read(path).unchosen_options().empty());
    std::remove(path.c_str());
}
