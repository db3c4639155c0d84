// Algorithm 10 lines 5–8: the pre-LN decoder layer (GPT-2; Gopher with norm = RMSnorm), the block "pre_ln"
// (transformers.hpp PreLNDecoderBlock), forward and backward side by side:
//    5  for t ∈ [ℓ]: X̃[:, t] ← layer_norm(X[:, t] | γ_l¹, β_l¹)
//    6  X ← X + MHAttention(X̃ | W_l, Mask[t, t'] = [[t ≤ t']])
//    7  for t ∈ [ℓ]: X̃[:, t] ← layer_norm(X[:, t] | γ_l², β_l²)
//    8  X ← X + W_mlp2^l GELU(W_mlp1^l X̃ + b_mlp1^l 1ᵀ) + b_mlp2^l 1ᵀ
// In an EDTransformer (block='pre_ln') it is V18a's encoder layer (T5: Mask ≡ 1, the stack's bias table), the stack
// ending with a norm of its own (γ_enc), and its decoder's layer is variants/pre_ln_cross_block.cpp.
#include "formal_transformers/transformers.hpp"

#include "../models/shared.hpp"

namespace ft {
using namespace models;

template <class T>
PreLNDecoderBlock<T>::PreLNDecoderBlock(const BlockSpec& b, ParamStore<T>& store, const std::string& p)
    : SelfBlock<T>(attn_l),
      norm1(block_norm(b, store, p, "1")),
      attn_l(self_attention(b, store, p)),
      norm2(block_norm(b, store, p, "2")),
      mlp(block_mlp(b, store, p, "W_mlp1", "b_mlp1", "W_mlp2", "b_mlp2")) {}

template <class T>
PreLNDecoderBlock<T>::PreLNDecoderBlock(const ModelConfig& c, Activation act, ParamStore<T>& store, const std::string& p)
    : PreLNDecoderBlock(BlockSpec{&c, act, decoder_mask(c), attn_variant(c, true), AttnVariant()}, store, p) {}

template <class T>
void PreLNDecoderBlock<T>::init(ParamStore<T>& store, Rng& rng, double s, double s_out) const {
    init_parts(store, rng, s, s_out, norm1, attn_l, norm2, mlp);
}

template <class T>
void PreLNDecoderBlock<T>::forward(const ParamStore<T>& store, CMatView<T> X, const Seqs& s, MatView<T> X_out,
                                   BlockActs<T>& acts, const Dropout* drop, DropPlace place, const Mask* mask) const {
    Acts& a = static_cast<Acts&>(acts);
    const index_t d_e = X.rows, n = X.cols;
    MatView<T> Xt1 = ensure(a.Xt_attn, d_e, n);
    norm1.forward(store, X, Xt1, a.norm_gamma1);  // line 5: X̃ ← layer_norm(X | γ¹, β¹)
    MatView<T> Xa = copy_into(a.X_attn, X);
    add_dropped(drop, place.at(DropSite::SelfOut), Xa, a.R, a.drop_attn, [&](MatView<T> out) {
        attn_l.forward(store, Xt1, s, Xt1, s, out, a.attn, /*accumulate=*/true, drop, place.at(DropSite::SelfWeights), mask);
    });  // line 6: X ← X + MHAttention(X̃ | W_l, Mask[t, t'] = [[t ≤ t']])
    MatView<T> Xt2 = ensure(a.Xt_mlp, d_e, n);
    norm2.forward(store, Xa, Xt2, a.norm_gamma2);  // line 7: X̃ ← layer_norm(X | γ², β²)
    std::copy(Xa.data, Xa.data + Xa.size(), X_out.data);
    add_dropped(drop, place.at(DropSite::MlpOut), X_out, a.R, a.drop_mlp, [&](MatView<T> out) {
        mlp.forward(store, Xt2, out, a.mlp);
    });  // line 8: X ← X + W_mlp2 GELU(W_mlp1 X̃ + b_mlp1 1ᵀ) + b_mlp2 1ᵀ
}

template <class T>
void PreLNDecoderBlock<T>::backward(ParamStore<T>& store, CMatView<T>, const Seqs& s, const BlockActs<T>& acts,
                                    BackwardWork<T>& w) const {
    const Acts& a = static_cast<const Acts&>(acts);
    MatView<T> dX = view(w.dX);
    // line 8: X_out = X_attn + MLP(X̃_mlp)  ->  ∂/∂X̃_mlp into dXt; ∂/∂X_attn = dX (+ line 7's part below)
    MatView<T> dXt = zeros(w.dXt, dX.rows, dX.cols);
    mlp.backward(store, view(a.Xt_mlp), a.mlp, dropped_grad(a.drop_mlp, CMatView<T>(dX), w.dR), dXt, w.dH);
    norm2.backward(store, dXt, a.norm_gamma2, dX);  // line 7
    // line 6: X_attn = X + MHAttention(X̃_attn)  ->  ∂/∂X̃_attn (queries, keys and values alike) into dXt
    zero(dXt);
    attn_l.backward(store, view(a.Xt_attn), s, view(a.Xt_attn), s, a.attn, dropped_grad(a.drop_attn, CMatView<T>(dX), w.dR),
                    dXt, dXt, w.attn);
    norm1.backward(store, dXt, a.norm_gamma1, dX);  // line 5
}

// lines 5–8 for the new columns of X, line 6 over the caller's cache (attend)
template <class T>
void PreLNDecoderBlock<T>::forward_cached(const ParamStore<T>& store, MatView<T> X,
                                          const typename SelfBlock<T>::Attend& attend, DecodeScratch<T>& d) const {
    MatView<T> Xt = ensure(d.Xt, X.rows, X.cols);
    norm1.forward(store, X, Xt, d.norm);  // line 5
    attend(attn_l, Xt, X);                // line 6
    norm2.forward(store, X, Xt, d.norm);  // line 7
    mlp.forward(store, Xt, X, d.mlp);     // line 8
}

template class PreLNDecoderBlock<float>;
template class PreLNDecoderBlock<double>;
FT_BLOCK_FACTORY(make_pre_ln_block, PreLNDecoderBlock, SelfBlock)
FT_BLOCK_ROW(pre_ln_block_row, "pre_ln", archs::D | archs::ED)

}  // namespace ft
