// What the three models share (transformers.hpp, Model): embedding, the head's loss, one call of loss or loss_and_grad.
#include "formal_transformers/transformers.hpp"

#include <cmath>
#include <limits>

#include "formal_transformers/blas.hpp"
#include "formal_transformers/lora.hpp"
#include "shared.hpp"

namespace ft {
using namespace models;

// ========================================== the models ================================================
const char* name(AttentionKind kind) {
    switch (kind) {
        case AttentionKind::Encoder: return "enc";
        case AttentionKind::Decoder: return "dec";
        case AttentionKind::Cross: return "cross";
    }
    return "?";
}

template <class T>
CMatView<T> Model<T>::attention_weights(AttentionKind kind, index_t l, index_t b, index_t h) const {
    const index_t L = layers(kind);
    if (L == 0) throw ValueError(std::string(arch_name()) + " has no '" + name(kind) + "' attention");
    if (!last_.done)
        throw ValueError("attention_weights() called before any forward call: the attention matrices are those of "
                         "the last forward call (decoding with caches keeps none)");
    auto in_range = [](index_t v, index_t n, const char* what, const std::string& why) {
        if (v < 0 || v >= n)
            throw IndexError(std::string(what) + " " + std::to_string(v) + " is out of range [0, " + std::to_string(n) + ")" + why);
    };
    in_range(l, L, "layer", "");
    const index_t B = last_.x.count();
    in_range(b, B, "seq", ": the last forward call had " + std::to_string(B) + (B == 1 ? " sequence" : " sequences"));
    in_range(h, cfg.H, "head", "");
    const MHAttentionCache<T>& c = attention_cache(kind, l);
    c.ensure_weights();  // after a tiled forward: computed now (Algorithm 4 lines 4–6 on the saved Q, K)
    FT_CHECK(index_t(c.A_off.size()) >= B * cfg.H, "attention cache smaller than the recorded batch");
    // rows: the keys' sequence (x for the decoder's self-attention, z otherwise); columns: the queries'
    const index_t rows = kind == AttentionKind::Decoder ? last_.x.len(b) : last_.z.len(b);
    const index_t cols = kind == AttentionKind::Encoder ? last_.z.len(b) : last_.x.len(b);
    return {c.A.data() + c.A_off[std::size_t(b * cfg.H + h)], rows, cols};
}

template <class T>
Rng Model<T>::make_head_and_allocate(index_t d) {
    unemb = cfg.tied ? std::make_unique<Unembedding<T>>(cfg.n_vocab, d, tok.W_e)
                     : std::make_unique<Unembedding<T>>(cfg.n_vocab, d, store, "W_u");
    if (cfg.unembed_bias) unemb->add_bias(store, "b_u");  // BERT's option (0 at initialisation)
    unemb->softcap = cfg.final_logit_softcapping;         // Gemma 2's c_f·tanh(W_u X / c_f) (0: none)
    declare_lora(cfg.lora, store);  // LoRA's A and B (lora.hpp), after every other entry of θ
    store.allocate();
    Rng rng(cfg.seed);
    tok.init(store, rng, cfg.init_std);
    pos.init(store, rng, cfg.init_std);
    return rng;
}

template <class T>
void Model<T>::embed(const Tokens& x, Matrix<T>& X, const index_t* segments) {
    const EmbedInput<T> in{tok, x.ids, x.s.total(), segments};
    emb->forward(store, in, pos, x.s, 0, ensure(X, cfg.d_e, x.s.total()), &embed_c_);  // lines 1–3
}

// Dropout after the embedding sum (line 3): X ← Dropout(X | p_embed, M) in training; the mask is cleared otherwise
template <class T>
void Model<T>::embed_dropout(Matrix<T>& X, DropSite site, DropoutMask& m) const {
    if (train_) {
        train_->apply(train_->embed, DropPlace{DropGroup::Embeddings, 0}.at(site), view(X), m);
    } else {
        m.p = 0;
        m.keep.clear();
    }
}
template <class T>
void Model<T>::embed_dropout_backward(const DropoutMask& m, MatView<T> dX) const {
    if (m.active()) dropout_backward<T>(m.p, m.keep.data(), dX.data, dX.size());  // D2
}

template <class T>
void Model<T>::embed_backward(const Tokens& x, MatView<T> dX, const index_t* segments) {
    emb->backward(store, EmbedInput<T>{tok, x.ids, x.s.total(), segments}, pos, x.s, dX, embed_c_);
}

template <class T>
double Model<T>::head_loss(CMatView<T> X, const std::vector<index_t>& cols, const std::vector<index_t>& targets,
                           MatView<T>* dX, BackwardWork<T>& w, index_t* n_correct, T scale) {
    const index_t nt = index_t(cols.size());
    if (n_correct) *n_correct = 0;
    if (nt == 0) return 0.0;
    MatView<T> Xs = ensure(w.Xsel, X.rows, nt);
    for (index_t k = 0; k < nt; ++k) std::copy(X.col(cols[std::size_t(k)]), X.col(cols[std::size_t(k)]) + X.rows, Xs.col(k));
    MatView<T> Z = ensure(w.logits, cfg.n_vocab, nt);
    unemb->logits(store, Xs, Z);                                              // W_u X at the scored columns
    if (dX && unemb->softcap > 0) copy_into(w.capped, CMatView<T>(Z));  // the capped logits, for their backward
    const double loss = nll_and_grad<T>(Z, targets.data(), scale, n_correct);  // −Σ log softmax(·)[target]; Z ← scale ∂loss/∂Z
    if (dX) {
        if (unemb->softcap > 0) unemb->softcap_backward(view(w.capped), Z);  // d(c·tanh(Z/c)) = 1 − (Z_c/c)²
        MatView<T> dXs = zeros(w.dXsel, X.rows, nt);
        unemb->backward_logits(store, Xs, Z, dXs);  // dW_u += dZ Xᵀ, dXs = W_uᵀ dZ
        for (index_t k = 0; k < nt; ++k) {
            T* d = dX->col(cols[std::size_t(k)]);
            const T* s = dXs.col(k);
            for (index_t i = 0; i < X.rows; ++i) d[i] += s[i];
        }
    }
    return loss;
}

template <class T>
double Model<T>::run_loss(const Batch& in, bool grad, index_t* n_scored, index_t* n_correct) {
    // training (grad) with a dropout rate: the forward drops, keyed by (dropout_seed, dropout_step); evaluation never
    // the originals of x̃ (E) are targets: checked like x, before anything runs
    if (in.x_orig) validate(Tokens{in.x_orig, in.x->s}, cfg, "x");
    Dropout d{cfg.embed_dropout, cfg.resid_dropout, dropout_seed, dropout_step};
    struct Reset {
        const Dropout*& p;
        ParamStore<T>& store;
        ~Reset() { p = nullptr, store.lora_training(false); }
    } reset{train_, store};
    train_ = grad && cfg.has_dropout() ? &d : nullptr;
    store.lora_training(grad, dropout_seed, dropout_step);  // LoRA's adapters drop their inputs (lora.hpp line 2′)
    run_forward(in);
    train_ = nullptr;
    if (grad) ++dropout_step;
    BackwardWork<T>& w = work_;
    score(in, w.cols, w.targets);
    if (n_scored) *n_scored = index_t(w.cols.size());
    if (!grad) {
        const double head = head_loss(out(), w.cols, w.targets, nullptr, w, n_correct);
        return head + aux_loss(in, false, head, w);
    }
    store.zero_grad();
    if (w.cols.empty()) {  // nothing scored: the listing's empty sum, every gradient 0
        if (n_correct) *n_correct = 0;
        return 0.0;
    }
    MatView<T> dHead = zeros(w.dHead, out().rows, out().cols);
    const double loss = head_loss(out(), w.cols, w.targets, &dHead, w, n_correct);
    const double aux = aux_loss(in, true, loss, w);  // V16: its parameters' gradients now, the trunk's in run_backward
    run_backward(in, w);
    store.adapters_backward();  // LoRA (lora.hpp line d1): ∂loss/∂A, ∂loss/∂B from ∂loss/∂W'
    store.lora_training(false);
    return loss + aux;
}

template class Model<float>;
template class Model<double>;

}  // namespace ft
