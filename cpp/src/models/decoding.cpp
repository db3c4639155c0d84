// Decoding with caches (Algorithms 14, 15 call these): a block's cached step over a KVCache, and the models'
// decode steps. A block's forward_cached runs its lines for the new columns only; the keys and values of earlier
// tokens come from the KV cache (MHAttention::append_kv, attend_cached).
#include "formal_transformers/transformers.hpp"

#include <cmath>
#include <limits>
#include <optional>

#include "formal_transformers/blas.hpp"
#include "shared.hpp"

namespace ft {
using namespace models;

// A block of an encoder only never decodes; a decoder's block runs its lines with `attend` for its attention.
template <class T>
void SelfBlock<T>::forward_cached(const ParamStore<T>&, MatView<T>, const Attend&, DecodeScratch<T>&) const {
    throw ValueError("this block is an encoder's layer: it has no decoding with a cache");
}
// over a KVCache: the new columns' keys and values appended, then attended at positions q0, q0+1, …
template <class T>
void SelfBlock<T>::forward_cached(const ParamStore<T>& store, MatView<T> X, index_t q0, KVCache<T>& kv,
                                  DecodeScratch<T>& d, const Mask* mask) const {
    forward_cached(store, X, [&](const MHAttention<T>& a, CMatView<T> Xt, MatView<T> out) {
        a.append_kv(store, Xt, kv);
        a.attend_cached(store, Xt, q0, kv, out, d.attn, true, mask);
    }, d);
}

// Algorithm 10 for n new tokens at positions d.len, …, with the keys and values of the earlier tokens
// cached per layer (line 6 attends over them); only the last token's logits are produced (line 11).
template <class T>
void DTransformer<T>::decode(Decoder& d, const index_t* ids, index_t n, T* z) const {
    // RoPE and ALiBi have no table of positions: their cached decoding may run past ℓ_max (docs/variants.md)
    if (position_table(cfg.positional) != Positional::None && d.len + n > cfg.l_max)
        throw ValueError("decoding past l_max = " + std::to_string(cfg.l_max) + " (context would be " +
                         std::to_string(d.len + n) + ")");
    for (index_t t = 0; t < n; ++t)
        if (ids[t] < 0 || ids[t] >= cfg.n_vocab) throw IndexError("token id " + std::to_string(ids[t]) + " out of range");
    // V7: the prefix mask of this sequence (p = d.prefix); the call feeding position 0 must hold the whole prefix
    std::optional<Mask> prefix;
    if (d.prefix != 0) {
        if (!per_call_mask(cfg.mask))
            throw ValueError("prefix_len is given to a model without mask='prefix'");
        if (d.prefix < 0) throw ValueError("prefix_len must be >= 0, got " + std::to_string(d.prefix));
        if (d.len < d.prefix && d.len + n < d.prefix)
            throw ValueError("prefix_len = " + std::to_string(d.prefix) + " exceeds the " + std::to_string(d.len + n) +
                             " tokens fed: feed the whole prefix in the first call");
        prefix = make_mask(cfg.mask, MaskOptions{{d.prefix}, {}, {}});
    }
    d.kv.resize(std::size_t(cfg.L));
    MatView<T> X = ensure(d.w.X, cfg.d_e, n);
    this->emb->forward(store, EmbedInput<T>{this->tok, ids, n}, this->pos, Seqs::single(n), d.len, X, nullptr);  // lines 1–3,
                                                                     // new tokens only, at positions d.len, d.len+1, …
    for (index_t l = 0; l < cfg.L; ++l)
        layer[std::size_t(l)]->forward_cached(store, X, d.len, d.kv[std::size_t(l)], d.w, prefix ? &*prefix : nullptr);  // lines 5–8
    MatView<T> last = ensure(d.w.tmp, cfg.d_e, 1);
    norm_f->forward(store, X.cols_range(n - 1, 1), last, d.w.norm);   // line 10 (last column)
    this->unemb->logits(store, last, MatView<T>(z, cfg.n_vocab, 1));  // line 11, as logits
    d.len += n;
}

template <class T>
void EDTransformer<T>::encode(Decoder& d, const index_t* z, index_t l_z) const {
    check_encoder_input(nullptr);
    Tokens zt{z, Seqs::single(l_z)};
    validate(zt, cfg.n_vocab, cfg.l_max, "z");
    NormCache<T> nc;
    typename StackEmbedding<T>::Cache ec;
    CMatView<T> Z = encoder_forward(zt, nullptr, d.enc_acts, d.zstream, d.Zf, nc, ec);  // lines 1–9, once per context
    start_decoding(d, Z);
}
template <class T>
void EDTransformer<T>::encode(Decoder& d, const Features<T>& f) const {
    FT_CHECK(f.s.count() == 1, "EDTransformer::encode: one spectrogram");
    const Tokens zt = audio_columns(f);
    NormCache<T> nc;
    typename StackEmbedding<T>::Cache ec;
    CMatView<T> Z = encoder_forward(zt, &f, d.enc_acts, d.zstream, d.Zf, nc, ec);  // V28 and lines 4–9, once
    start_decoding(d, Z);
}
template <class T>
void EDTransformer<T>::start_decoding(Decoder& d, CMatView<T> Z) const {
    d.self_kv.assign(std::size_t(cfg.L_dec), KVCache<T>());
    d.cross_kv.assign(std::size_t(cfg.L_dec), KVCache<T>());
    for (index_t l = 0; l < cfg.L_dec; ++l) dec_layer[std::size_t(l)]->cross_attn.append_kv(store, Z, d.cross_kv[std::size_t(l)]);
    d.len = 0;
}

// lines 10–21 for n new tokens of x̂ at positions d.len, …: self-attention over cached keys and values,
// cross-attention over the cached keys and values of Z; logits of the last token.
template <class T>
void EDTransformer<T>::decode(Decoder& d, const index_t* ids, index_t n, T* logits_out) const {
    if (d.len + n > cfg.l_max)
        throw ValueError("decoding past l_max = " + std::to_string(cfg.l_max));
    FT_CHECK(index_t(d.self_kv.size()) == cfg.L_dec, "EDTransformer::decode before encode()");
    for (index_t t = 0; t < n; ++t)
        if (ids[t] < 0 || ids[t] >= cfg.n_vocab) throw IndexError("token id " + std::to_string(ids[t]) + " out of range");
    emb_dec->forward(store, EmbedInput<T>{this->tok, ids, n}, this->pos, Seqs::single(n), d.len, ensure(d.w.X, cfg.d_e, n),
                     &d.emb);  // lines 10–12
    MatView<T> X = view(d.w.X);
    for (index_t l = 0; l < cfg.L_dec; ++l) {
        const std::size_t i = std::size_t(l);
        dec_layer[i]->forward_cached(store, d.len, d.self_kv[i], d.cross_kv[i], d.w);  // lines 14–19
    }
    CMatView<T> last = X.cols_range(n - 1, 1);
    if (head_input()) {  // V18: s · norm(X | γ_dec)
        MatView<T> Xf = ensure(d.w.tmp, cfg.d_e, 1);
        head_forward(last, Xf, d.w.norm);
        last = Xf;
    }
    this->unemb->logits(store, last, MatView<T>(logits_out, cfg.n_vocab, 1));  // line 21, as logits
    d.len += n;
}

template class SelfBlock<float>;
template class SelfBlock<double>;
template void DTransformer<float>::decode(Decoder&, const index_t*, index_t, float*) const;
template void EDTransformer<float>::encode(Decoder&, const index_t*, index_t) const;
template void EDTransformer<float>::encode(Decoder&, const Features<float>&) const;
template void EDTransformer<float>::start_decoding(Decoder&, CMatView<float>) const;
template void EDTransformer<float>::decode(Decoder&, const index_t*, index_t, float*) const;
template void DTransformer<double>::decode(Decoder&, const index_t*, index_t, double*) const;
template void EDTransformer<double>::encode(Decoder&, const index_t*, index_t) const;
template void EDTransformer<double>::encode(Decoder&, const Features<double>&) const;
template void EDTransformer<double>::start_decoding(Decoder&, CMatView<double>) const;
template void EDTransformer<double>::decode(Decoder&, const index_t*, index_t, double*) const;

}  // namespace ft
