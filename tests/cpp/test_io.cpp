// ft::save / ft::load (io.hpp): round trips of the three models (θ bit for bit, the config, dropout's counter
// and seed, the outputs), conversion between dtypes, and files that are not a saved model of that kind.
#include <cstdio>
#include <fstream>
#include <string>

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
    if (arch == Arch::E) c.n_segments = 2;
    if (arch == Arch::D) c.positional = Positional::Sinusoidal;  // a fixed (frozen) entry in θ
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
