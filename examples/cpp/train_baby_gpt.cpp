// Train nanoGPT's CPU "baby GPT" on a text file and sample from it — formal-transformers from C++ alone
// (docs/api.md "C++ API"; the Python counterpart is `./run.sh demo`).
//
//   train_baby_gpt <text file> [steps = 1500] [sample length = 200]
//
// A character tokenizer fit on the text (§4), DTransformer with L 4, H 4, d_e 128, ℓ_max 64 (Algorithm 10),
// DTraining with Adam, batch 12, a cosine schedule (Algorithm 13), then DInference (Algorithm 14) from a
// prompt taken from the text. Prints the loss every few steps and the sample.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include <formal_transformers/formal_transformers.hpp>

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s <text file> [steps = 1500] [sample length = 200]\n", argv[0]);
        return 2;
    }
    std::ifstream in(argv[1], std::ios::binary);
    if (!in) {
        std::fprintf(stderr, "cannot read %s\n", argv[1]);
        return 2;
    }
    std::stringstream buf;
    buf << in.rdbuf();
    const std::string text = buf.str();
    const ft::index_t steps = argc > 2 ? std::atol(argv[2]) : 1500;
    const ft::index_t l_gen = argc > 3 ? std::atol(argv[3]) : 200;

    try {
        // §4: characters, then mask/bos/eos; the text as chunks of ℓ_max + 1 = 65 tokens (64 predictions each)
        const ft::CharTokenizer tok = ft::CharTokenizer::fit(text);
        const ft::TokenIds ids = ft::as_ids(tok.encode(text, /*bos=*/false, /*eos=*/false));
        std::vector<ft::TokenIds> data = ft::chunk(ids, 65);
        if (data.size() > 1 && data.back().size() < 2) data.pop_back();  // a last chunk of one token predicts nothing

        ft::ModelConfig cfg;  // the baby GPT
        cfg.n_vocab = tok.n_vocab();
        cfg.l_max = 65;
        cfg.L = 4;
        cfg.H = 4;
        cfg.d_e = 128;
        cfg.d_mlp = 512;
        cfg.seed = 1;
        ft::DTransformer<float> model(cfg);
        std::printf("%s: %zu characters, N_V = %td, %zu chunks; DTransformer L 4, H 4, d_e 128: %td parameters\n",
                    argv[1], text.size(), cfg.n_vocab, data.size(), model.store.size());

        ft::TrainOptions o;  // Algorithm 13 with nanoGPT's options
        o.n_epochs = 0;  // counted in steps: max_steps long
        o.max_steps = steps;
        o.batch_size = 12;
        o.eta = 1e-3;
        o.schedule = ft::TrainOptions::Schedule::Cosine;
        o.warmup = steps / 10;
        o.min_lr = 1e-4;
        o.clip = 1.0;
        o.reduction = ft::TrainOptions::Reduction::Mean;
        ft::Adam<float> adam(1e-3, 0.9, 0.99, 1e-8, 0.1);
        const ft::index_t every = std::max<ft::index_t>(1, steps / 20);
        ft::DTraining(model, data, o, adam, [&](const ft::StepInfo& s) {
            if (s.step % every == 0 || s.step == s.total_steps)
                std::printf("step %5td/%td  loss %.4f  lr %.2e\n", s.step, s.total_steps, s.loss, s.lr);
            return true;
        });
        // the loss of the first chunk after training, through the model's own call
        std::printf("loss per token on the first chunk: %.4f\n", model.loss(data.front(), /*mean=*/true));

        // Algorithm 14 from the first 16 characters of the text
        ft::SamplingOptions so;
        so.tau = 0.8;
        ft::Rng rng(7);
        const ft::TokenIds prompt = ft::chunk(ids, 16).front();
        const ft::TokenIds y = ft::DInference(model, prompt, l_gen, so, rng);
        std::printf("--- sample ---\n%s%s\n", tok.decode(prompt.data(), prompt.size()).c_str(),
                    tok.decode(y.data(), y.size()).c_str());
    } catch (const std::exception& e) {  // ft::ValueError, ft::IndexError, ...: the message names the problem
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
