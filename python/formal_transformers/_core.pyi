"""
formal-transformers native core (C++17, xtensor, OpenBLAS)
"""
from __future__ import annotations
import collections.abc
import numpy
import numpy.typing
import typing
__all__: list[str] = ['Adam', 'Attention', 'BPETokenizer', 'BasicAttention', 'CharTokenizer', 'DInference', 'DTransformer', 'EDInference', 'EDTransformer', 'ETransformer', 'LayerNorm', 'MHAttention', 'ParamDict', 'PositionalEmbedding', 'PromptCache', 'RMSNorm', 'SGD', 'SpeculativeInference', 'TokenEmbedding', 'Unembedding', 'ViT', 'WordTokenizer', 'bf16_info', 'bidirectional_mask', 'bigbird_layout', 'blas_info', 'blas_kernel', 'block_sparse_attention', 'block_sparse_attention_backward', 'chunk', 'gelu', 'get_num_threads', 'max_num_threads', 'random_feature_matrix', 'relu', 'set_num_threads', 'softmax', 'unidirectional_mask']
class _HasParams:
    """
    Base of every object with parameters (params, grads).
    """
class ParamDict:
    """
    name -> numpy view of a parameter (or gradient) stored in C++ (zero-copy, writable).
    """
    def __contains__(self, arg0: typing.Any) -> bool:
        ...
    def __getitem__(self, arg0: str) -> numpy.ndarray[typing.Any, numpy.dtype[typing.Any]]:
        ...
    def __iter__(self) -> collections.abc.Iterator:
        ...
    def __len__(self) -> int:
        ...
    def __repr__(self) -> str:
        ...
    def __setitem__(self, arg0: str, arg1: typing.Any) -> None:
        ...
    def copy(self) -> dict:
        """
        A plain dict of copies (a snapshot that later steps do not change).
        """
    def get(self, key: typing.Any, default: typing.Any = None) -> typing.Any:
        ...
    def items(self) -> list:
        ...
    def keys(self) -> list[str]:
        ...
    def update(self, arg0: dict) -> None:
        """
        Copy arrays into the named parameters, all or nothing: every name, dtype and shape is checked before anything is written.
        """
    def values(self) -> list[numpy.ndarray[typing.Any, numpy.dtype[typing.Any]]]:
        ...
class LayerNorm(_HasParams):
    """
    Algorithm 6: ê ← layer_norm(e | γ, β) = (e − m)/√(v + eps) ⊙ γ + β, per column.
    
    Hyperparameters: d_e, eps (inside the square root; eps=0 is the listing exactly).
    Parameters: gamma (d_e,) = 1, beta (d_e,) = 0.
    Call: e (d_e,) or (d_e, ℓ) -> ê of the same shape. backward(dÊ) -> dE.
    """
    def __call__(self, e: typing.Any) -> numpy.ndarray[typing.Any, numpy.dtype[typing.Any]]:
        ...
    def __init__(self, d_e: typing.SupportsIndex, eps: typing.SupportsFloat | typing.SupportsIndex = 1e-05, dtype: typing.Any = 'float32') -> None:
        ...
    def __repr__(self) -> str:
        ...
    def backward(self, dY: typing.Any) -> numpy.ndarray[typing.Any, numpy.dtype[typing.Any]]:
        """
        Gradient of the last call: accumulates d gamma, d beta into grads; returns dE.
        """
    def zero_grad(self) -> None:
        ...
    @property
    def d_e(self) -> int:
        ...
    @property
    def dtype(self) -> str:
        ...
    @property
    def eps(self) -> float:
        ...
    @property
    def grads(self) -> ParamDict:
        """
        Gradients, same keys as params, accumulated by backward(), cleared by zero_grad().
        """
    @property
    def params(self) -> ParamDict:
        """
        Parameters θ: name -> writable numpy view of the C++ storage (zero-copy). Assigning params[name] = array copies into the storage (shape must match).
        """
class RMSNorm(_HasParams):
    """
    Gopher's RMSnorm variant of Algorithm 6: ê = e / √(Σ e²/d_e + eps) ⊙ γ, per column.
    
    Parameters: gamma (d_e,) = 1. Call: e (d_e,) or (d_e, ℓ) -> ê. backward(dÊ) -> dE.
    """
    def __call__(self, e: typing.Any) -> numpy.ndarray[typing.Any, numpy.dtype[typing.Any]]:
        ...
    def __init__(self, d_e: typing.SupportsIndex, eps: typing.SupportsFloat | typing.SupportsIndex = 1e-05, dtype: typing.Any = 'float32') -> None:
        ...
    def __repr__(self) -> str:
        ...
    def backward(self, dY: typing.Any) -> numpy.ndarray[typing.Any, numpy.dtype[typing.Any]]:
        ...
    def zero_grad(self) -> None:
        ...
    @property
    def d_e(self) -> int:
        ...
    @property
    def dtype(self) -> str:
        ...
    @property
    def eps(self) -> float:
        ...
    @property
    def grads(self) -> ParamDict:
        """
        Gradients, same keys as params, accumulated by backward(), cleared by zero_grad().
        """
    @property
    def params(self) -> ParamDict:
        """
        Parameters θ: name -> writable numpy view of the C++ storage (zero-copy). Assigning params[name] = array copies into the storage (shape must match).
        """
class TokenEmbedding(_HasParams):
    """
    Algorithm 1 (token embedding): e = W_e[:, v].
    
    TokenEmbedding(n_vocab, d_e, *, dtype='float32', seed=0)
    Hyperparameters: n_vocab (N_V), d_e.
    Parameters: W_e (d_e, N_V), initialised W_e ~ N(0, 1) from ft's Rng(seed).
    Call: v, an int token id in [0, N_V) -> e (d_e,); or a 1-D sequence of ids (any integer
      dtype, or a list) -> E (d_e, ℓ), column t = W_e[:, v[t]].
    backward(dE): dE (d_e,) or (d_e, ℓ) of the last call; scatter-adds into grads['W_e']
      (a token used twice receives both columns) and returns None (ids have no gradient).
    Errors: id out of range -> IndexError naming the id and its position; float/bool ids ->
      TypeError; an empty sequence -> ValueError. dE: a float array of either precision, any layout;
      NaN in dE is not checked and lands in the gradient columns it is added to.
    """
    def __call__(self, v: typing.Any) -> numpy.ndarray[typing.Any, numpy.dtype[typing.Any]]:
        """
        v: int id -> (d_e,); 1-D ids -> (d_e, ℓ).
        """
    def __init__(self, n_vocab: typing.SupportsIndex, d_e: typing.SupportsIndex, *, dtype: typing.Any = 'float32', seed: typing.Any = 0) -> None:
        ...
    def __repr__(self) -> str:
        ...
    def backward(self, dE: typing.Any) -> None:
        """
        Gradient of the last call: grads['W_e'][:, v[t]] += dE[:, t] for every t. Returns None.
        """
    def zero_grad(self) -> None:
        ...
    @property
    def d_e(self) -> int:
        ...
    @property
    def dtype(self) -> str:
        ...
    @property
    def grads(self) -> ParamDict:
        """
        Gradients, same keys as params, accumulated by backward(), cleared by zero_grad().
        """
    @property
    def n_vocab(self) -> int:
        ...
    @property
    def params(self) -> ParamDict:
        """
        Parameters θ: name -> writable numpy view of the C++ storage (zero-copy). Assigning params[name] = array copies into the storage (shape must match).
        """
class PositionalEmbedding(_HasParams):
    """
    Algorithm 2 (positional embedding): e_p = W_p[:, t].
    
    PositionalEmbedding(l_max, d_e, kind='learned', *, base=None, dtype='float32', seed=0)
    Hyperparameters: l_max (ℓ_max), d_e, kind, base.
    Parameters: W_p (d_e, ℓ_max).
      kind='learned': W_p ~ N(0, 1) from ft's Rng(seed), trained by backward().
      kind='sinusoidal': W_p is the paper's fixed matrix, exactly as printed (1-based i, t):
        W_p[2i-1, t] = sin(t / ℓ_max^(2i/d_e)), W_p[2i, t] = cos(t / ℓ_max^(2i/d_e)),
        stored 0-based (column j holds t = j+1; for odd d_e the last row is a sine);
        base (default ℓ_max) replaces ℓ_max in the formula (Vaswani et al. use 10000).
        This W_p is FROZEN: it stays visible in params, but backward() adds nothing to its
        gradient and optimizers skip it.
    Call: t, an int position in [0, ℓ_max) -> e_p (d_e,); or a 1-D integer array of n
      positions -> (d_e, n). Positions out of [0, ℓ_max) -> IndexError.
    backward(dE): dE of the last call's shape; grads['W_p'][:, t] += dE[:, j] for each
      position t = t_j (learned only). Returns None.
    Positions: any integer dtype or a list; float/bool -> TypeError; empty -> ValueError.
    """
    def __call__(self, t: typing.Any) -> numpy.ndarray[typing.Any, numpy.dtype[typing.Any]]:
        """
        t: int position -> (d_e,); 1-D positions -> (d_e, n).
        """
    def __init__(self, l_max: typing.SupportsIndex, d_e: typing.SupportsIndex, kind: str = 'learned', *, base: typing.Any = None, dtype: typing.Any = 'float32', seed: typing.Any = 0) -> None:
        ...
    def __repr__(self) -> str:
        ...
    def backward(self, dE: typing.Any) -> None:
        """
        Gradient of the last call: grads['W_p'][:, t_j] += dE[:, j] (learned; nothing for sinusoidal). Returns None.
        """
    def zero_grad(self) -> None:
        ...
    @property
    def base(self) -> typing.Any:
        """
        The base of the sinusoidal formula (ℓ_max unless given); None for a learned W_p.
        """
    @property
    def d_e(self) -> int:
        ...
    @property
    def dtype(self) -> str:
        ...
    @property
    def grads(self) -> ParamDict:
        """
        Gradients, same keys as params, accumulated by backward(), cleared by zero_grad().
        """
    @property
    def kind(self) -> str:
        ...
    @property
    def l_max(self) -> int:
        ...
    @property
    def params(self) -> ParamDict:
        """
        Parameters θ: name -> writable numpy view of the C++ storage (zero-copy). Assigning params[name] = array copies into the storage (shape must match).
        """
class BasicAttention(_HasParams):
    """
    Algorithm 3 (basic single-query attention):
      q = W_q e + b_q; k_t = W_k e_t + b_k; v_t = W_v e_t + b_v;
      α_t = softmax_t(qᵀk_t / √d_attn); ṽ = Σ_t α_t v_t.
    
    BasicAttention(d_in, d_attn, d_out, *, dtype='float32', seed=0)
    Hyperparameters: d_in, d_attn, d_out.
    Parameters: W_q (d_attn, d_in), b_q (d_attn,), W_k (d_attn, d_in), b_k (d_attn,),
      W_v (d_out, d_in), b_v (d_out,). Initialised W ~ N(0, 1/fan_in) (fan_in = d_in, the
      matrix's number of columns) from ft's Rng(seed), biases 0.
    Call: (e, E), e (d_in,) the current token, E (d_in, T) the context tokens e_1..e_T as
      columns -> ṽ (d_out,).
    backward(dv): dv (d_out,) -> (de (d_in,), dE (d_in, T)); parameter gradients accumulate
      into grads. weights: α (T,) of the last call (None before any call).
    Inputs: float arrays of either precision, any layout (zero-copy when already this dtype and F-contiguous,
      otherwise converted once); non-float arrays -> TypeError. NaN is not checked: it propagates as
      numpy's arithmetic of the listing (reference.py) would.
    """
    def __call__(self, e: typing.Any, E: typing.Any) -> typing.Any:
        """
        (e (d_in,), E (d_in, T)) -> ṽ (d_out,)
        """
    def __init__(self, d_in: typing.SupportsIndex, d_attn: typing.SupportsIndex, d_out: typing.SupportsIndex, *, dtype: typing.Any = 'float32', seed: typing.Any = 0) -> None:
        ...
    def __repr__(self) -> str:
        ...
    def backward(self, dv: typing.Any) -> typing.Any:
        """
        Gradient of the last call: dv (d_out,) -> (de, dE); accumulates the parameter gradients.
        """
    def zero_grad(self) -> None:
        ...
    @property
    def d_attn(self) -> int:
        ...
    @property
    def d_in(self) -> int:
        ...
    @property
    def d_out(self) -> int:
        ...
    @property
    def dtype(self) -> str:
        ...
    @property
    def grads(self) -> ParamDict:
        """
        Gradients, same keys as params, accumulated by backward(), cleared by zero_grad().
        """
    @property
    def params(self) -> ParamDict:
        """
        Parameters θ: name -> writable numpy view of the C++ storage (zero-copy). Assigning params[name] = array copies into the storage (shape must match).
        """
    @property
    def weights(self) -> typing.Any:
        """
        α (T,) of the last call, a copy (None before any call).
        """
class Attention(_HasParams):
    """
    Algorithm 4 (attention): Q = W_q X + b_q 1ᵀ, K = W_k Z + b_k 1ᵀ, V = W_v Z + b_v 1ᵀ,
      S = KᵀQ, S[t_z, t_x] = −∞ where ¬Mask[t_z, t_x], Ṽ = V · softmax(S / √d_attn)
      (softmax over each column, max-subtracted).
    
    Attention(d_x, d_z, d_attn, d_out, mask='bidirectional', *, dtype='float32', seed=0)
    Hyperparameters: d_x, d_z, d_attn, d_out, and Mask: 'bidirectional' (Mask ≡ 1),
      'unidirectional' (Mask[t_z, t_x] = [[t_z ≤ t_x]]), or a bool array (ℓ_z, ℓ_x) (then every
      call must have exactly that ℓ_z, ℓ_x; a column with no True is a ValueError).
    Parameters: W_q (d_attn, d_x), b_q (d_attn,), W_k (d_attn, d_z), b_k (d_attn,),
      W_v (d_out, d_z), b_v (d_out,). Initialised W ~ N(0, 1/fan_in) (fan_in = the matrix's
      number of columns) from ft's Rng(seed), biases 0.
    Call: (X, Z), X (d_x, ℓ_x) primary tokens, Z (d_z, ℓ_z) context tokens (ℓ_z may differ:
      cross-attention) -> Ṽ (d_out, ℓ_x). Z omitted: self-attention, Z = X. X and Z are copied.
    backward(dY): dY (d_out, ℓ_x) -> (dX (d_x, ℓ_x), dZ (d_z, ℓ_z)); parameter gradients
      accumulate into grads. (Self-attention: the gradient of X is dX + dZ.)
    weights: softmax(S/√d_attn) (ℓ_z, ℓ_x) of the last call, a copy (None before any call).
    Inputs: float arrays of either precision, any layout (zero-copy when already this dtype and F-contiguous,
      otherwise converted once); non-float arrays -> TypeError. NaN is not checked: it propagates as
      numpy's arithmetic of the listing (reference.py) would.
    """
    def __call__(self, X: typing.Any, Z: typing.Any = None) -> typing.Any:
        """
        (X (d_x, ℓ_x), Z (d_z, ℓ_z)) -> Ṽ (d_out, ℓ_x); Z omitted: Z = X.
        """
    def __init__(self, d_x: typing.SupportsIndex, d_z: typing.SupportsIndex, d_attn: typing.SupportsIndex, d_out: typing.SupportsIndex, mask: typing.Any = 'bidirectional', *, dtype: typing.Any = 'float32', seed: typing.Any = 0) -> None:
        ...
    def __repr__(self) -> str:
        ...
    def backward(self, dY: typing.Any) -> typing.Any:
        """
        Gradient of the last call: dY (d_out, ℓ_x) -> (dX, dZ); accumulates the parameter gradients.
        """
    def zero_grad(self) -> None:
        ...
    @property
    def d_attn(self) -> int:
        ...
    @property
    def d_out(self) -> int:
        ...
    @property
    def d_x(self) -> int:
        ...
    @property
    def d_z(self) -> int:
        ...
    @property
    def dtype(self) -> str:
        ...
    @property
    def grads(self) -> ParamDict:
        """
        Gradients, same keys as params, accumulated by backward(), cleared by zero_grad().
        """
    @property
    def mask(self) -> typing.Any:
        """
        'bidirectional', 'unidirectional', or a copy of the explicit bool mask.
        """
    @property
    def params(self) -> ParamDict:
        """
        Parameters θ: name -> writable numpy view of the C++ storage (zero-copy). Assigning params[name] = array copies into the storage (shape must match).
        """
    @property
    def weights(self) -> typing.Any:
        """
        softmax(S/√d_attn) (ℓ_z, ℓ_x) of the last call: column t_x holds how much query t_x attends to each context token. A copy; None before any call.
        """
class MHAttention(_HasParams):
    """
    Algorithm 5 (multi-head attention): for h ∈ [H]: Y^h = Attention(X, Z | W^h_qkv, Mask)
      (Algorithm 4); Y = [Y¹; …; Y^H]; Ṽ = W_o Y + b_o 1ᵀ.
    
    MHAttention(H, d_x, d_z, d_attn, d_mid, d_out, mask='bidirectional', *, dtype='float32', seed=0)
    Hyperparameters: H, d_x, d_z, d_attn, d_mid, d_out, Mask (as in Attention).
    Parameters (heads stacked, head h = index h of the first axis):
      W_q (H, d_attn, d_x), b_q (H, d_attn), W_k (H, d_attn, d_z), b_k (H, d_attn),
      W_v (H, d_mid, d_z), b_v (H, d_mid), W_o (d_out, H·d_mid), b_o (d_out,).
      Initialised W ~ N(0, 1/fan_in) (fan_in = the matrix's number of columns: d_x, d_z, d_z,
      H·d_mid) from ft's Rng(seed), biases 0.
    Call: (X, Z), X (d_x, ℓ_x), Z (d_z, ℓ_z) -> Ṽ (d_out, ℓ_x). Z omitted: Z = X. Inputs are copied.
    backward(dY): dY (d_out, ℓ_x) -> (dX (d_x, ℓ_x), dZ (d_z, ℓ_z)); parameter gradients
      accumulate into grads. (Self-attention: the gradient of X is dX + dZ.)
    weights: softmax(S^h/√d_attn) of every head, (H, ℓ_z, ℓ_x), of the last call (a copy; None
      before any call).
    Inputs: float arrays of either precision, any layout (zero-copy when already this dtype and F-contiguous,
      otherwise converted once); non-float arrays -> TypeError. NaN is not checked: it propagates as
      numpy's arithmetic of the listing (reference.py) would.
    Variants (docs/variants.md): H_kv key/value heads (V3: W_k (H_kv, d_attn, d_z), W_v (H_kv, d_mid,
      d_z); None: H), bias=False (V5: no b's), positional='rope' (V1, rope_theta) | 'alibi' (V2) | 'none'.
    attention_impl='auto' | 'literal' | 'tiled': Algorithm 4's lines 4-6 as printed, or the tiled listing
      (docs/tiled_attention.md: the same numbers up to rounding, memory O(ℓ·d) per head; weights then
      computed when read); 'auto' picks tiled from 256 context tokens on (docs/design.md).
    """
    def __call__(self, X: typing.Any, Z: typing.Any = None) -> typing.Any:
        """
        (X (d_x, ℓ_x), Z (d_z, ℓ_z)) -> Ṽ (d_out, ℓ_x); Z omitted: Z = X.
        """
    def __init__(self, H: typing.SupportsIndex, d_x: typing.SupportsIndex, d_z: typing.SupportsIndex, d_attn: typing.SupportsIndex, d_mid: typing.SupportsIndex, d_out: typing.SupportsIndex, mask: typing.Any = 'bidirectional', *, dtype: typing.Any = 'float32', seed: typing.Any = 0, H_kv: typing.Any = None, bias: typing.Any = True, positional: str = 'none', rope_theta: typing.SupportsFloat | typing.SupportsIndex = 10000.0, attention_impl: str = 'auto') -> None:
        ...
    def __repr__(self) -> str:
        ...
    def backward(self, dY: typing.Any) -> typing.Any:
        """
        Gradient of the last call: dY (d_out, ℓ_x) -> (dX, dZ); accumulates the parameter gradients.
        """
    def zero_grad(self) -> None:
        ...
    @property
    def H(self) -> int:
        ...
    @property
    def H_kv(self) -> int:
        ...
    @property
    def attention_impl(self) -> str:
        """
        'auto', 'literal' or 'tiled' (the constructor's option).
        """
    @property
    def d_attn(self) -> int:
        ...
    @property
    def d_mid(self) -> int:
        ...
    @property
    def d_out(self) -> int:
        ...
    @property
    def d_x(self) -> int:
        ...
    @property
    def d_z(self) -> int:
        ...
    @property
    def dtype(self) -> str:
        ...
    @property
    def grads(self) -> ParamDict:
        """
        Gradients, same keys as params, accumulated by backward(), cleared by zero_grad().
        """
    @property
    def mask(self) -> typing.Any:
        """
        'bidirectional', 'unidirectional', or a copy of the explicit bool mask.
        """
    @property
    def params(self) -> ParamDict:
        """
        Parameters θ: name -> writable numpy view of the C++ storage (zero-copy). Assigning params[name] = array copies into the storage (shape must match).
        """
    @property
    def weights(self) -> typing.Any:
        """
        softmax(S^h/√d_attn) of every head, (H, ℓ_z, ℓ_x), of the last call. A copy; None before any call.
        """
class Unembedding(_HasParams):
    """
    Algorithm 7 (unembedding): p = softmax(W_u e), the column softmax (max-subtracted).
    
    Unembedding(n_vocab, d_e, *, dtype='float32', seed=0)
    Hyperparameters: n_vocab (N_V), d_e.
    Parameters: W_u (N_V, d_e), initialised W_u ~ N(0, 1/fan_in) (fan_in = d_e) from ft's
      Rng(seed).
    Call: e (d_e,) -> p (N_V,), or E (d_e, ℓ) -> P (N_V, ℓ) (every column). The input is copied.
    logits(e): W_u e, same shapes (does not change what backward() differentiates).
    backward(dP): dP, the gradient of a loss with respect to the last call's p -> dE of e's
      shape; accumulates grads['W_u'].
    Inputs: float arrays of either precision, any layout (zero-copy when already this dtype and F-contiguous,
      otherwise converted once); non-float arrays -> TypeError. NaN is not checked: it propagates as
      numpy's arithmetic of the listing (reference.py) would.
    """
    def __call__(self, e: typing.Any) -> numpy.ndarray[typing.Any, numpy.dtype[typing.Any]]:
        """
        e (d_e,) or (d_e, ℓ) -> p (N_V,) or (N_V, ℓ).
        """
    def __init__(self, n_vocab: typing.SupportsIndex, d_e: typing.SupportsIndex, *, dtype: typing.Any = 'float32', seed: typing.Any = 0) -> None:
        ...
    def __repr__(self) -> str:
        ...
    def backward(self, dP: typing.Any) -> numpy.ndarray[typing.Any, numpy.dtype[typing.Any]]:
        """
        Gradient of the last call: dP (N_V, ℓ) -> dE (d_e, ℓ); accumulates grads['W_u'].
        """
    def logits(self, e: typing.Any) -> numpy.ndarray[typing.Any, numpy.dtype[typing.Any]]:
        """
        W_u e: (d_e,) or (d_e, ℓ) -> (N_V,) or (N_V, ℓ).
        """
    def zero_grad(self) -> None:
        ...
    @property
    def d_e(self) -> int:
        ...
    @property
    def dtype(self) -> str:
        ...
    @property
    def grads(self) -> ParamDict:
        """
        Gradients, same keys as params, accumulated by backward(), cleared by zero_grad().
        """
    @property
    def n_vocab(self) -> int:
        ...
    @property
    def params(self) -> ParamDict:
        """
        Parameters θ: name -> writable numpy view of the C++ storage (zero-copy). Assigning params[name] = array copies into the storage (shape must match).
        """
class DTransformer(_HasParams):
    """
    Algorithm 10: P ← DTransformer(x | θ) — GPT-2, a decoder-only transformer.
    
    Pre-LN layers with causal (unidirectional) multi-head self-attention and a GELU MLP, a final layer_norm,
    and P = softmax(W_u X). Hyperparameters: n_vocab (N_V), l_max, L, H, d_e, d_mlp; keyword options
    d_attn = d_mid = d_e // H by default, norm="layer" | "rms" (Gopher's RMSnorm) | "scale" (ScaleNorm, V12: one
    scalar g per norm), fixnorm=True (V13 FixNorm: unit-length token embeddings; E and ED too), positional="learned" |
    "sinusoidal" (base replaces ℓ_max in the paper's formula), tied=False (W_u = W_eᵀ when True),
    gelu="exact" | "tanh" (GPT-2's approximation), eps (inside layer_norm's square root), dtype, seed,
    init_std (GPT-2's init: N(0, init_std²), residual projections / √(2L), biases 0, γ = 1, β = 0).
    Variants (docs/variants.md): positional="rope" (rope_theta=10000.0) | "alibi" (no W_p), H_kv key/value
    heads (grouped-query attention; None: H), mlp="gelu" | "swiglu", bias=False (no biases in attention and
    MLP), sliding_window=w (V8: each query sees the last w keys, Mistral; decoding keeps a rolling cache of w
    columns), kv_lora_rank=d_c (V10: multi-head latent attention, DeepSeek-V2/V3; with qk_rope_head_dim=d_R,
    q_lora_rank=d_c′ or None, positional="rope", bias=False; d_attn = qk_nope_head_dim + d_R, d_mid = v_head_dim;
    decoding caches the latent, d_c + d_R numbers per token and layer). With norm="rms" these make a LLaMA-style
    (Mistral-, DeepSeek-style) decoder; the defaults are Algorithm 10.
    Dropout (docs/regularisation.md; beyond the listing): dropout=p drops after the embedding sum, on the
    attention weights and on each sublayer's output before the residual add (embed_dropout, attn_dropout,
    resid_dropout: per place, None = dropout). Only loss_and_grad (and the trainers) drop; model(x), loss,
    inference never do. Masks: keyed by (dropout_seed, dropout_step); dropout_masks() shows the last ones.
    
    Call: P = model(x), x a 1-D sequence of token ids (ℓ ≤ l_max; any ℓ with positional="rope"|"alibi",
    which have no table of positions) -> P (N_V, ℓ); column t is the distribution of x[t+1] given x[:t+1].
    A 2-D (N, ℓ) array gives (N, N_V, ℓ); a list of sequences a list.
    loss_and_grad(x) -> (loss, grads): Algorithm 13 line 5, −Σ_{t<ℓ−1} log P[x[t+1], t], summed over the
    batch, with the gradient of every parameter (copies; model.grads holds the same, zero-copy).
    Prefix LM (docs/variants.md V7): mask="prefix" makes line 6's Mask [[t_z < p or t_z ≤ t_x]]; the calls
    (model(x), logits, loss, loss_and_grad) take prefix_len=p (an int, or one per sequence of a batch; None:
    p = 0, the causal mask), and the loss counts only the predictions of x[t+1] with t+1 ≥ p.
    Multi-token prediction (docs/variants.md V16, DeepSeek-V3): mtp_depth=D adds D sequential modules (parameters
    mtp.{k-1}.*) whose module k predicts x[t+k+1]; loss and loss_and_grad then return L_main + (mtp_weight/D) Σ_k L_k
    (every sequence needs ℓ ≥ D + 2; loss_terms() gives [L_main, L_1, …, L_D]); model(x) and decoding use the trunk
    only; SpeculativeInference(…)(x, model) drafts with the modules (self-speculation).
    """
    def __call__(self, x: typing.Any, prefix_len: typing.Any = None) -> typing.Any:
        ...
    def __init__(self, *args, **kwargs) -> None:
        """
        __init__(n_vocab, l_max, L, H, d_e, d_mlp, *, d_attn=None, d_mid=None, norm='layer', positional='learned', base=None, tied=False, gelu='exact', eps=1e-05, seed=0, init_std=0.02, H_kv=None, bias=True, dropout=0.0, embed_dropout=None, attn_dropout=None, resid_dropout=None, attention_impl='auto', attention='softmax', n_features=None, feature_seed=0, attn_logit_softcapping=None, query_pre_attn_scalar=None, mlp='gelu', rope_theta=10000.0, sliding_window=None, sliding_window_pattern=None, rope_local_base_freq=None, attention_chunk_size=None, kv_lora_rank=None, q_lora_rank=None, qk_rope_head_dim=None, qkv_bias=False, qk_norm=False, mask='causal', mtp_depth=0, mtp_weight=0.3, rope_scaling_factor=None, rotary_pct=1.0, block='pre_ln', fixnorm=False, embed_scale=None, final_logit_softcapping=None, dtype='float32', precision='float32')
        
        The sizes positionally or by name, every other option by name (the class docstring says what each means). TypeError for an unknown option or a value of the wrong type, ValueError for a value out of range.
        """
    def __repr__(self) -> str:
        ...
    def _lora(self, targets: collections.abc.Sequence[str], r: typing.SupportsIndex, alpha: typing.SupportsFloat | typing.SupportsIndex, dropout: typing.SupportsFloat | typing.SupportsIndex) -> None:
        """
        ft.lora's core (lora.hpp).
        """
    def attention_weights(self, layer: typing.SupportsIndex, seq: typing.SupportsIndex = 0) -> numpy.ndarray[typing.Any, numpy.dtype[typing.Any]]:
        """
        softmax(S/√d_attn) of every head of `layer` in the last forward call: (H, ℓ, ℓ); column t is how token t attends to the tokens of its sequence.
        """
    def config_json(self) -> str:
        """
        model.config as the core writes it (ModelConfig::to_json, with the dtype): what ft.save stores.
        """
    def dropout_masks(self) -> dict:
        """
        The dropout masks of the last forward, True = kept (empty after an evaluating call: model(x), loss, or rates 0): 'embed' (D, E) / 'embed.z', 'embed.x' (ED) and '<layer>.attn.out', '<layer>.mlp.out' (ED decoder: also '<layer>.cross_attn.out') as (d_e, n) arrays over the batch's columns; '<layer>.attn.weights' ('<layer>.cross_attn.weights') as a list over the sequences of (H, rows, columns) arrays laid out as attention_weights.
        """
    def logits(self, x: typing.Any, prefix_len: typing.Any = None) -> typing.Any:
        """
        W_u X (before the final softmax), shaped like the call's output. prefix_len: as the call (V7).
        """
    def loss(self, x: typing.Any, reduction: str = 'sum', prefix_len: typing.Any = None) -> float:
        """
        The loss without gradients; reduction='mean' divides by the number of predicted tokens. prefix_len: as loss_and_grad (V7).
        """
    def loss_and_grad(self, x: typing.Any, copy: bool = True, prefix_len: typing.Any = None) -> tuple[float, typing.Any]:
        """
        Algorithm 13 line 5 and its gradient: (loss, grads). x: one sequence, a 2-D (N, ℓ) batch or a list of sequences of any lengths (the loss is the sum over sequences). grads: a dict of arrays that later calls do not change (one copy of the flat gradient); copy=False returns model.grads itself (zero-copy views, overwritten by the next call, as PyTorch's .grad). prefix_len (mask='prefix', V7): an int or one per sequence; only the predictions of the tokens x[t+1] with t+1 >= p count (docs/variants.md V7); None: 0, the causal model.
        """
    def loss_terms(self) -> list[float]:
        """
        The terms of the last loss or loss_and_grad call: [L_main, L_1, …, L_D] (V16 lines 6 and 8, sums over the batch; [L_main] without mtp_depth; [] before any call).
        """
    def merge_lora(self) -> None:
        """
        LoRA (docs/variants.md): W ← W + (α/r)·B·A on every adapted matrix, and the adapters leave θ (their <name>.lora_A, .lora_B entries). The outputs stay those of the adapted model, bit for bit. Views of params taken before are of the old θ.
        """
    def zero_grad(self) -> None:
        ...
    @property
    def H(self) -> int:
        ...
    @property
    def L(self) -> int:
        ...
    @property
    def bos_token(self) -> int:
        """
        N_V − 2
        """
    @property
    def config(self) -> typing.Any:
        """
        The hyperparameters as a dict (the core's ModelConfig.to_json with the dtype): ft.build_model(config) makes this model's architecture again.
        """
    @property
    def d_e(self) -> int:
        ...
    @property
    def dropout_seed(self) -> int:
        """
        The seed of dropout's masks (docs/regularisation.md), at first the model's seed. Setting it draws other masks from the same θ (data-parallel workers: a different one each, e.g. seed + rank).
        """
    @dropout_seed.setter
    def dropout_seed(self, arg1: typing.Any) -> None:
        ...
    @property
    def dropout_step(self) -> int:
        """
        Dropout's counter (docs/regularisation.md): the masks of a training forward are keyed by (dropout_seed, dropout_step, place, entry); each loss_and_grad advances it by one. Set it back to replay the same masks.
        """
    @dropout_step.setter
    def dropout_step(self, arg1: typing.Any) -> None:
        ...
    @property
    def dtype(self) -> str:
        ...
    @property
    def eos_token(self) -> int:
        """
        N_V − 1
        """
    @property
    def grads(self) -> ParamDict:
        """
        Gradients, same keys as params, accumulated by backward(), cleared by zero_grad().
        """
    @property
    def l_max(self) -> int:
        ...
    @property
    def lora(self) -> typing.Any:
        """
        The LoRA adapters (ft.lora): targets, r, alpha, dropout and the adapted matrices' names; None without.
        """
    @property
    def mask_token(self) -> int:
        """
        N_V − 3 (paper §4, 0-based)
        """
    @property
    def n_params(self) -> int:
        """
        Number of trainable scalars in θ.
        """
    @property
    def n_vocab(self) -> int:
        ...
    @property
    def params(self) -> ParamDict:
        """
        Parameters θ: name -> writable numpy view of the C++ storage (zero-copy). Assigning params[name] = array copies into the storage (shape must match).
        """
    @property
    def precision(self) -> str:
        """
        How the matrix products run: 'float32', or 'bf16-mixed' (float32 models only: every product of the listings takes bf16-rounded operands and accumulates in float32; θ, Adam's moments, norms, softmax, the loss and the gradient sums stay float32). ft.bf16_info() says what runs the bf16 products.
        """
    @precision.setter
    def precision(self, arg1: typing.Any) -> None:
        ...
class ETransformer(_HasParams):
    """
    Algorithm 9: P ← ETransformer(x | θ) — BERT, an encoder-only transformer.
    
    Post-LN layers with bidirectional multi-head self-attention and a GELU MLP, then X ← GELU(W_f X + b_f 1ᵀ),
    a final layer_norm, and P = softmax(W_u X) with W_u (N_V, d_f) (the listing's N_V × d_e only type-checks
    when d_f = d_e; see the errata). Hyperparameters: n_vocab, l_max, L, H, d_e, d_mlp, d_f; options as
    DTransformer (no norm option; dropout=… as DTransformer, embed_dropout acting after embed_norm's layer_norm).
    BERT's options, beyond Algorithm 9 (the defaults keep the listing): n_segments > 0 adds segment
    (token-type) embeddings W_s (d_e, n_segments) to line 2's e_t for the `segments=` ids of every call (0 when
    None); embed_norm=True applies layer_norm(· | γ_e, β_e) to X after line 3; unembed_bias=True gives
    P = softmax(W_u X + b_u 1ᵀ). model.hidden(x) returns X after line 9 (BERT's last hidden state).
    loss_and_grad(x_tilde, x): Algorithm 12 line 9, −Σ_{t∈T̃} log P[x[t], t] over T̃ = {t : x̃[t] = mask_token}
    (mask_token = N_V − 3); with no masked position the loss is 0 and every gradient 0.
    """
    def __call__(self, x: typing.Any, *, segments: typing.Any = None) -> typing.Any:
        ...
    def __init__(self, *args, **kwargs) -> None:
        """
        __init__(n_vocab, l_max, L, H, d_e, d_mlp, d_f, *, d_attn=None, d_mid=None, positional='learned', base=None, tied=False, gelu='exact', eps=1e-05, seed=0, init_std=0.02, H_kv=None, bias=True, dropout=0.0, embed_dropout=None, attn_dropout=None, resid_dropout=None, attention_impl='auto', attention='softmax', n_features=None, feature_seed=0, block_size=None, window_blocks=3, n_global_blocks=1, n_random_blocks=3, layout_seed=0, bigbird_draw='per_head', qkv_bias=False, block='post_ln', n_segments=0, embed_norm=False, unembed_bias=False, fixnorm=False, dtype='float32', precision='float32')
        
        The sizes positionally or by name, every other option by name (the class docstring says what each means). TypeError for an unknown option or a value of the wrong type, ValueError for a value out of range.
        """
    def __repr__(self) -> str:
        ...
    def _lora(self, targets: collections.abc.Sequence[str], r: typing.SupportsIndex, alpha: typing.SupportsFloat | typing.SupportsIndex, dropout: typing.SupportsFloat | typing.SupportsIndex) -> None:
        """
        ft.lora's core (lora.hpp).
        """
    def attention_weights(self, layer: typing.SupportsIndex, seq: typing.SupportsIndex = 0) -> numpy.ndarray[typing.Any, numpy.dtype[typing.Any]]:
        """
        softmax(S/√d_attn) of every head of `layer` in the last forward call: (H, ℓ, ℓ); column t is how token t attends to the tokens of its sequence.
        """
    def bigbird_layouts(self, n_blocks: typing.SupportsIndex) -> numpy.ndarray[typing.Any, numpy.dtype[typing.Any]]:
        """
        The V17 block layouts the model uses for sequences of n_blocks blocks: a bool array (L, H, n, n),
        [l, h, j, i] = key block j is live for query block i in head h of layer l (uint8 multiplicities if a given
        layout repeats a block; drawn from layout_seed: layer l,
        head h is ft.bigbird_layout(n, …, seed=layout_seed, name=f'layers.{l}.attn.', head=h), head=0 for every
        head with bigbird_draw='per_layer'; or as installed).
        """
    def bigbird_layouts_json(self) -> str:
        """
        The given layouts (set_bigbird_layouts, ft.from_hf) as JSON text, what ft.save stores under
        'formal_transformers.bigbird_layouts' ('' when none is given): {"n": [layer, …]} for each given length
        of n blocks, a layer the list of its layouts (one for every head, or H), a layout the list of each query
        block's key blocks (ascending; a block listed m times has multiplicity m).
        """
    def config_json(self) -> str:
        """
        model.config as the core writes it (ModelConfig::to_json, with the dtype): what ft.save stores.
        """
    def dropout_masks(self) -> dict:
        """
        The dropout masks of the last forward, True = kept (empty after an evaluating call: model(x), loss, or rates 0): 'embed' (D, E) / 'embed.z', 'embed.x' (ED) and '<layer>.attn.out', '<layer>.mlp.out' (ED decoder: also '<layer>.cross_attn.out') as (d_e, n) arrays over the batch's columns; '<layer>.attn.weights' ('<layer>.cross_attn.weights') as a list over the sequences of (H, rows, columns) arrays laid out as attention_weights.
        """
    def hidden(self, x: typing.Any, *, segments: typing.Any = None) -> typing.Any:
        """
        X after line 9 (the last layer's output; BERT's last hidden state): (d_e, ℓ) for one sequence, (N, d_e, ℓ) for a 2-D batch, a list for a ragged list. Beyond the listing, which returns only P.
        """
    def logits(self, x: typing.Any, *, segments: typing.Any = None) -> typing.Any:
        """
        W_u X (+ b_u 1ᵀ with unembed_bias; before the final softmax), shaped like the call's output.
        """
    def loss(self, x_tilde: typing.Any, x: typing.Any, reduction: str = 'sum', *, segments: typing.Any = None) -> float:
        ...
    def loss_and_grad(self, x_tilde: typing.Any, x: typing.Any, copy: bool = True, *, segments: typing.Any = None) -> tuple[float, typing.Any]:
        """
        Algorithm 12 line 9 and its gradient: (loss, grads); copy as DTransformer.loss_and_grad; segments: segment ids shaped like x (n_segments > 0).
        """
    def merge_lora(self) -> None:
        """
        LoRA (docs/variants.md): W ← W + (α/r)·B·A on every adapted matrix, and the adapters leave θ (their <name>.lora_A, .lora_B entries). The outputs stay those of the adapted model, bit for bit. Views of params taken before are of the old θ.
        """
    def set_bigbird_layouts(self, layouts: typing.Any) -> None:
        """
        Give every layer and head its V17 block layout for sequences of n blocks (n·block_size tokens): a bool
        array (L, H, n, n), layouts[l, h, j, i] = key block j is live for query block i in head h of layer l, or
        (L, n, n) (each layer's layout for all its heads). They replace the layouts drawn from layout_seed for that
        length only (the other lengths keep drawing); ft.from_hf installs Hugging Face BigBird's with it. Integer
        layouts give multiplicities: a key block listed m times weighs m·exp(s) in the softmax (HF's repeated
        blocks; attention_impl='auto' only). ft.save keeps them (bigbird_layouts_json). ValueError (the core's
        check_bigbird_layouts, every layer before any is installed): attention is not 'bigbird', a shape other than
        (L, H, n, n) or (L, n, n), n·block_size > l_max, a query block with no key block, a repeated key block
        unless attention_impl='auto'.
        """
    def set_bigbird_layouts_json(self, text: str) -> None:
        """
        Install the layouts of bigbird_layouts_json's text (ft.load does): every length checked as
        set_bigbird_layouts checks, before any is installed. ValueError naming the problem.
        """
    def zero_grad(self) -> None:
        ...
    @property
    def H(self) -> int:
        ...
    @property
    def L(self) -> int:
        ...
    @property
    def bos_token(self) -> int:
        """
        N_V − 2
        """
    @property
    def config(self) -> typing.Any:
        """
        The hyperparameters as a dict (the core's ModelConfig.to_json with the dtype): ft.build_model(config) makes this model's architecture again.
        """
    @property
    def d_e(self) -> int:
        ...
    @property
    def d_f(self) -> int:
        ...
    @property
    def dropout_seed(self) -> int:
        """
        The seed of dropout's masks (docs/regularisation.md), at first the model's seed. Setting it draws other masks from the same θ (data-parallel workers: a different one each, e.g. seed + rank).
        """
    @dropout_seed.setter
    def dropout_seed(self, arg1: typing.Any) -> None:
        ...
    @property
    def dropout_step(self) -> int:
        """
        Dropout's counter (docs/regularisation.md): the masks of a training forward are keyed by (dropout_seed, dropout_step, place, entry); each loss_and_grad advances it by one. Set it back to replay the same masks.
        """
    @dropout_step.setter
    def dropout_step(self, arg1: typing.Any) -> None:
        ...
    @property
    def dtype(self) -> str:
        ...
    @property
    def eos_token(self) -> int:
        """
        N_V − 1
        """
    @property
    def grads(self) -> ParamDict:
        """
        Gradients, same keys as params, accumulated by backward(), cleared by zero_grad().
        """
    @property
    def l_max(self) -> int:
        ...
    @property
    def lora(self) -> typing.Any:
        """
        The LoRA adapters (ft.lora): targets, r, alpha, dropout and the adapted matrices' names; None without.
        """
    @property
    def mask_token(self) -> int:
        """
        N_V − 3 (paper §4, 0-based)
        """
    @property
    def n_params(self) -> int:
        """
        Number of trainable scalars in θ.
        """
    @property
    def n_vocab(self) -> int:
        ...
    @property
    def params(self) -> ParamDict:
        """
        Parameters θ: name -> writable numpy view of the C++ storage (zero-copy). Assigning params[name] = array copies into the storage (shape must match).
        """
    @property
    def precision(self) -> str:
        """
        How the matrix products run: 'float32', or 'bf16-mixed' (float32 models only: every product of the listings takes bf16-rounded operands and accumulates in float32; θ, Adam's moments, norms, softmax, the loss and the gradient sums stay float32). ft.bf16_info() says what runs the bf16 products.
        """
    @precision.setter
    def precision(self, arg1: typing.Any) -> None:
        ...
class EDTransformer(_HasParams):
    """
    Algorithm 8: P ← EDTransformer(z, x | θ) — the original encoder-decoder transformer.
    
    Encoder: post-LN layers of bidirectional self-attention and a ReLU MLP over the context z. Decoder:
    post-LN layers of causal self-attention, cross-attention to the encoded Z, and a ReLU MLP; then
    P = softmax(W_u X). Hyperparameters: n_vocab, l_max, L_enc, L_dec, H, d_e, d_mlp; options d_attn, d_mid,
    positional, base, tied, eps, dtype, seed, init_std, H_kv, bias, fixnorm, dropout (as DTransformer: embeddings of z and x,
    attention weights of all three attentions, every sublayer's output).
    Call: P = model(z, x) -> (N_V, ℓ_x). loss_and_grad(z, x): Algorithm 11 line 5, −Σ_{t<ℓ_x−1} log P[x[t+1], t].
    """
    def __call__(self, z: typing.Any, x: typing.Any) -> typing.Any:
        ...
    def __init__(self, *args, **kwargs) -> None:
        """
        __init__(n_vocab, l_max, L_enc, L_dec, H, d_e, d_mlp, *, d_attn=None, d_mid=None, norm='layer', positional='learned', base=None, tied=False, eps=1e-05, seed=0, init_std=0.02, H_kv=None, bias=True, dropout=0.0, embed_dropout=None, attn_dropout=None, resid_dropout=None, attention_impl='auto', mlp='relu', qkv_bias=False, relative_buckets=32, relative_max_distance=128, block='post_ln', scale_scores=True, unembed_rescale=False, bos_id=None, eos_id=None, forced_bos_id=None, forced_eos=False, embed_norm=False, unembed_bias=False, scale_embedding=False, separate_positions=False, fixnorm=False, n_mels=None, n_audio_ctx=None, dtype='float32', precision='float32')
        
        The sizes positionally or by name, every other option by name (the class docstring says what each means). TypeError for an unknown option or a value of the wrong type, ValueError for a value out of range.
        """
    def __repr__(self) -> str:
        ...
    def _lora(self, targets: collections.abc.Sequence[str], r: typing.SupportsIndex, alpha: typing.SupportsFloat | typing.SupportsIndex, dropout: typing.SupportsFloat | typing.SupportsIndex) -> None:
        """
        ft.lora's core (lora.hpp).
        """
    def attention_weights(self, kind: str, layer: typing.SupportsIndex, seq: typing.SupportsIndex = 0) -> numpy.ndarray[typing.Any, numpy.dtype[typing.Any]]:
        """
        Attention matrices of the last forward call: kind 'enc' (ℓ_z, ℓ_z), 'dec' (ℓ_x, ℓ_x) or 'cross' (ℓ_z, ℓ_x), for every head: (H, rows, columns).
        """
    def config_json(self) -> str:
        """
        model.config as the core writes it (ModelConfig::to_json, with the dtype): what ft.save stores.
        """
    def dropout_masks(self) -> dict:
        """
        The dropout masks of the last forward, True = kept (empty after an evaluating call: model(x), loss, or rates 0): 'embed' (D, E) / 'embed.z', 'embed.x' (ED) and '<layer>.attn.out', '<layer>.mlp.out' (ED decoder: also '<layer>.cross_attn.out') as (d_e, n) arrays over the batch's columns; '<layer>.attn.weights' ('<layer>.cross_attn.weights') as a list over the sequences of (H, rows, columns) arrays laid out as attention_weights.
        """
    def logits(self, z: typing.Any, x: typing.Any) -> typing.Any:
        ...
    def loss(self, z: typing.Any, x: typing.Any, reduction: str = 'sum') -> float:
        ...
    def loss_and_grad(self, z: typing.Any, x: typing.Any, copy: bool = True, *, features_grad: bool = False) -> tuple:
        """
        Algorithm 11 line 5 and its gradient: (loss, grads); copy as DTransformer.loss_and_grad. z: token ids, or the features the encoder takes (the audio encoder: log-mel spectrograms (rows, T) or (B, rows, T)); for such an encoder, features_grad=True returns (loss, grads, dF): also ∂loss/∂features in their shape.
        """
    def merge_lora(self) -> None:
        """
        LoRA (docs/variants.md): W ← W + (α/r)·B·A on every adapted matrix, and the adapters leave θ (their <name>.lora_A, .lora_B entries). The outputs stay those of the adapted model, bit for bit. Views of params taken before are of the old θ.
        """
    def zero_grad(self) -> None:
        ...
    @property
    def H(self) -> int:
        ...
    @property
    def L_dec(self) -> int:
        ...
    @property
    def L_enc(self) -> int:
        ...
    @property
    def bos_token(self) -> int:
        """
        N_V − 2
        """
    @property
    def config(self) -> typing.Any:
        """
        The hyperparameters as a dict (the core's ModelConfig.to_json with the dtype): ft.build_model(config) makes this model's architecture again.
        """
    @property
    def d_e(self) -> int:
        ...
    @property
    def dropout_seed(self) -> int:
        """
        The seed of dropout's masks (docs/regularisation.md), at first the model's seed. Setting it draws other masks from the same θ (data-parallel workers: a different one each, e.g. seed + rank).
        """
    @dropout_seed.setter
    def dropout_seed(self, arg1: typing.Any) -> None:
        ...
    @property
    def dropout_step(self) -> int:
        """
        Dropout's counter (docs/regularisation.md): the masks of a training forward are keyed by (dropout_seed, dropout_step, place, entry); each loss_and_grad advances it by one. Set it back to replay the same masks.
        """
    @dropout_step.setter
    def dropout_step(self, arg1: typing.Any) -> None:
        ...
    @property
    def dtype(self) -> str:
        ...
    @property
    def encoder_input(self) -> dict:
        """
        What the encoder's embedding part takes, as the part reports it: {'kind': 'tokens' (token ids) or 'features' (floating-point matrices, e.g. the audio encoder's log-mel spectrograms), 'rows': their row count (None for tokens), 'what': its description}.
        """
    @property
    def eos_token(self) -> int:
        """
        N_V − 1
        """
    @property
    def grads(self) -> ParamDict:
        """
        Gradients, same keys as params, accumulated by backward(), cleared by zero_grad().
        """
    @property
    def l_max(self) -> int:
        ...
    @property
    def lora(self) -> typing.Any:
        """
        The LoRA adapters (ft.lora): targets, r, alpha, dropout and the adapted matrices' names; None without.
        """
    @property
    def mask_token(self) -> int:
        """
        N_V − 3 (paper §4, 0-based)
        """
    @property
    def n_params(self) -> int:
        """
        Number of trainable scalars in θ.
        """
    @property
    def n_vocab(self) -> int:
        ...
    @property
    def params(self) -> ParamDict:
        """
        Parameters θ: name -> writable numpy view of the C++ storage (zero-copy). Assigning params[name] = array copies into the storage (shape must match).
        """
    @property
    def precision(self) -> str:
        """
        How the matrix products run: 'float32', or 'bf16-mixed' (float32 models only: every product of the listings takes bf16-rounded operands and accumulates in float32; θ, Adam's moments, norms, softmax, the loss and the gradient sums stay float32). ft.bf16_info() says what runs the bf16 products.
        """
    @precision.setter
    def precision(self, arg1: typing.Any) -> None:
        ...
class Adam:
    """
    Adam (Kingma & Ba 2015) with bias correction; one loop over the flat parameter buffer.
    
    Adam(lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, decoupled=True). weight_decay with
    decoupled=True is AdamW's θ ← θ(1 − lr·λ); decoupled=False is the L2 form g ← g + λθ (torch.optim.Adam's).
    step(obj, grads=None): one update of obj's parameters (any model or component) from grads (obj.grads
    when None, zero-copy; or a dict name -> array such as loss_and_grad's). The moments are created at the first
    step and belong to that object. Fixed parameters (sinusoidal W_p) are never changed.
    """
    def __init__(self, lr: typing.SupportsFloat | typing.SupportsIndex = 0.001, beta1: typing.SupportsFloat | typing.SupportsIndex = 0.9, beta2: typing.SupportsFloat | typing.SupportsIndex = 0.999, eps: typing.SupportsFloat | typing.SupportsIndex = 1e-08, weight_decay: typing.SupportsFloat | typing.SupportsIndex = 0.0, decoupled: bool = True) -> None:
        ...
    def __repr__(self) -> str:
        ...
    def load_state_dict(self, obj: typing.Any, state: dict) -> None:
        """
        Bind this optimizer to obj with the given state (from state_dict).
        """
    def state_dict(self) -> dict:
        """
        Steps taken, the moments m, v of the trainable parameters (flat, in parameter order) and `ranges`, the (k, 2) [begin, end) offsets of the flat θ they cover: enough to resume.
        """
    def step(self, obj: typing.Any, grads: typing.Any = None, lr: typing.Any = None) -> None:
        """
        One Adam step; `lr` overrides the learning rate for this step (schedules).
        """
    @property
    def beta1(self) -> float:
        ...
    @property
    def beta2(self) -> float:
        ...
    @property
    def decoupled(self) -> bool:
        ...
    @property
    def eps(self) -> float:
        ...
    @property
    def lr(self) -> float:
        ...
    @lr.setter
    def lr(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def t(self) -> int:
        """
        Steps taken.
        """
    @property
    def weight_decay(self) -> float:
        ...
class SGD:
    """
    The listings' update (Algorithms 11–13, line 6): θ ← θ − lr · ∇loss(θ).
    
    step(obj, grads=None, lr=None) as Adam.step.
    """
    def __init__(self, lr: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    def __repr__(self) -> str:
        ...
    def step(self, obj: typing.Any, grads: typing.Any = None, lr: typing.Any = None) -> None:
        ...
    @property
    def lr(self) -> float:
        ...
    @lr.setter
    def lr(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class BPETokenizer:
    """
    Byte-level Byte Pair Encoding (paper §4; Gage 1994, Sennrich et al. 2016, as in GPT-2).
    
    Vocabulary: ids 0..255 are the bytes, merge k makes id 256 + k, then mask_token = N_V−3, bos_token = N_V−2, eos_token = N_V−1. Every str encodes and decodes back exactly (lone surrogates travel as 'surrogatepass' UTF-8); special ids never arise from text.
    
    Pre-tokenizer (merges stay inside a piece): GPT-2's rule 's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+ with Unicode 14.0 letters/numbers (general categories L*, N*) and White_Space, without a regex engine.
    
    Training: each step merges the adjacent pair with the highest count over the pre-tokenized text (overlaps counted); ties go to the smallest (left id, right id). It stops at n_vocab or when the best pair occurs fewer than min_frequency times (then n_vocab is smaller than asked).
    Encoding applies the merges lowest rank first (leftmost first among equals), O(n log n) per piece.
    
    Build with BPETokenizer.train(text, n_vocab) or BPETokenizer.load(path).
    """
    @staticmethod
    def from_gpt2_files(vocab: typing.Any, merges: typing.Any, *, mask_token: typing.Any = None, bos_token: typing.Any = None, eos_token: typing.Any = None) -> BPETokenizer:
        """
        Read GPT-2's vocab.json + merges.txt (ids kept; vocabulary entries no merge makes, e.g. '<|endoftext|>', are special tokens; name mask/bos/eos among them, e.g. bos_token='<|endoftext|>', eos_token='<|endoftext|>').
        """
    @staticmethod
    def from_hf_json(path: typing.Any, *, mask_token: typing.Any = None, bos_token: typing.Any = None, eos_token: typing.Any = None) -> BPETokenizer:
        """
        Read a Hugging Face tokenizer.json of a byte-level BPE (model 'BPE', ByteLevel pre-tokenizer without add_prefix_space). The file's ids are kept (n_vocab is the file's); mask/bos/eos are the special tokens named by the arguments, else '<mask>'/'<bos>'/'<eos>' if the file has them, and bos/eos also the tokens a TemplateProcessing post-processor puts around $A; else None. Other model types (WordPiece, Unigram, ...) and HF options this tokenizer does not reproduce are a ValueError naming them. docs/tokenization.md 'Hugging Face and GPT-2 files'.
        """
    @staticmethod
    def from_json(text: typing.Any) -> BPETokenizer:
        """
        The tokenizer whose to_json() is `text` (ValueError if it is corrupt).
        """
    @staticmethod
    def from_merges(merges: collections.abc.Sequence[tuple[typing.SupportsIndex, typing.SupportsIndex]]) -> BPETokenizer:
        """
        A tokenizer from a list of (left id, right id) merges; merge k makes id 256 + k and may only use ids < 256 + k.
        """
    @staticmethod
    def load(path: typing.Any) -> BPETokenizer:
        """
        Read a file written by save(). ValueError naming the problem if it is corrupt or truncated, or holds another kind of tokenizer; OSError if it cannot be read.
        """
    @staticmethod
    def pretokenize(text: typing.Any) -> list:
        """
        The pieces of `text` by the GPT-2 pre-tokenizer rule (their concatenation is text).
        """
    @staticmethod
    def train(text: typing.Any, n_vocab: typing.Any, min_frequency: typing.Any = 2) -> BPETokenizer:
        """
        Learn merges on `text` until there are n_vocab tokens in all (n_vocab >= 259 = 256 bytes + 3 specials, else ValueError). Runs in C++ with the GIL released; Ctrl-C stops it (nothing is built).
        """
    def __eq__(self, arg0: typing.Any) -> bool:
        ...
    def __getstate__(self) -> tuple[str]:
        ...
    def __hash__(self) -> int:
        ...
    def __repr__(self) -> str:
        ...
    def __setstate__(self, arg0: tuple) -> None:
        ...
    def decode(self, ids: typing.Any, skip_special: bool = True, errors: str = 'replace') -> str:
        """
        ids (1-D integers of any integer dtype — np.int64 as encode() gives, np.int32 too —, may be empty) -> str. Special ids are skipped (skip_special=True) or rendered as '<mask>', '<bos>', '<eos>'. IndexError for an id outside [0, n_vocab).
        The tokens' bytes are decoded as UTF-8 (surrogates pass, as Python's 'surrogatepass'); other invalid byte sequences are replaced by U+FFFD exactly as bytes.decode('utf-8', 'replace') does (errors='replace'), dropped ('ignore') or a ValueError ('strict').
        """
    def decode_bytes(self, ids: typing.Any, skip_special: bool = True) -> bytes:
        """
        ids -> the concatenated bytes of the tokens.
        """
    def encode(self, text: typing.Any, bos: typing.Any = True, eos: typing.Any = True) -> numpy.typing.NDArray[numpy.int64]:
        """
        text (str) -> 1-D np.int64 array [bos_token] x[1..ℓ] [eos_token] (§4). Special ids appear only where bos/eos ask for them; TypeError unless text is a str.
        """
    def encode_batch(self, texts: typing.Any, bos: typing.Any = True, eos: typing.Any = True) -> list:
        """
        A list of str -> a list of 1-D np.int64 arrays, each as encode() gives it.
        """
    def save(self, path: typing.Any) -> None:
        """
        Write the tokenizer as JSON (UTF-8; format in docs/tokenization.md).
        """
    def to_gpt2_files(self, vocab: typing.Any, merges: typing.Any) -> None:
        """
        Write GPT-2's vocab.json (special tokens included under their text) and merges.txt.
        """
    def to_hf_json(self, path: typing.Any = None) -> str:
        """
        The tokenizer as a Hugging Face tokenizer.json (written to `path` unless None; the text is returned). tokenizers.Tokenizer.from_file(path).encode(text).ids equals encode(text) (bos/eos through a TemplateProcessing post-processor).
        """
    def to_json(self) -> str:
        """
        The JSON text save() writes.
        """
    def token_bytes(self, id: typing.SupportsIndex) -> bytes:
        """
        The bytes of a regular token (IndexError for special or out-of-range ids).
        """
    @property
    def bos_token(self) -> typing.Any:
        """
        N_V − 2 (a BPE tokenizer from another project's file: its id, or None)
        """
    @property
    def eos_token(self) -> typing.Any:
        """
        N_V − 1 (a BPE tokenizer from another project's file: its id, or None)
        """
    @property
    def file_ids(self) -> typing.Any:
        """
        None for our own layout (bytes 0..255, merge k = 256 + k, then mask/bos/eos). For a tokenizer read from another project's file: the file's id of byte b (file_ids[b], -1 if the file has no token for it: such bytes are dropped from text, as HF does) and of merge k (file_ids[256 + k]).
        """
    @property
    def mask_token(self) -> typing.Any:
        """
        N_V − 3 (a BPE tokenizer from another project's file: the file's id of its mask token, or None)
        """
    @property
    def merges(self) -> list:
        """
        The merges in rank order: merges[k] = (left id, right id), which made id 256 + k (in a tokenizer from another project's file: the file's ids, see file_ids).
        """
    @property
    def n_vocab(self) -> int:
        """
        N_V: regular tokens + the 3 special tokens.
        """
    @property
    def special_tokens(self) -> list:
        """
        [(id, text)] of the special tokens (never produced from text), by id: ours are (N_V−3, '<mask>'), (N_V−2, '<bos>'), (N_V−1, '<eos>'); a file's are its added tokens and the vocabulary entries no merge makes.
        """
class CharTokenizer:
    """
    Character-level tokenizer (paper §4): one token per Unicode code point.
    
    Vocabulary: the distinct characters of the fit text in code point order (ids 0..), then unk_token if fit with unk=True, then mask_token = N_V−3, bos_token = N_V−2, eos_token = N_V−1.
    Unknown characters at encode time raise ValueError naming the character and its position, unless fit with unk=True: then they become unk_token (decoded as U+FFFD).
    
    Build with CharTokenizer.fit(text) or CharTokenizer.load(path).
    """
    @staticmethod
    def fit(text: typing.Any, unk: bool = False) -> CharTokenizer:
        """
        The vocabulary of the characters of `text` (ValueError if empty).
        """
    @staticmethod
    def from_json(text: typing.Any) -> CharTokenizer:
        """
        The tokenizer whose to_json() is `text` (ValueError if it is corrupt).
        """
    @staticmethod
    def load(path: typing.Any) -> CharTokenizer:
        """
        Read a file written by save(). ValueError naming the problem if it is corrupt or truncated, or holds another kind of tokenizer; OSError if it cannot be read.
        """
    def __eq__(self, arg0: typing.Any) -> bool:
        ...
    def __getstate__(self) -> tuple[str]:
        ...
    def __hash__(self) -> int:
        ...
    def __repr__(self) -> str:
        ...
    def __setstate__(self, arg0: tuple) -> None:
        ...
    def decode(self, ids: typing.Any, skip_special: bool = True) -> str:
        """
        ids (1-D integers of any integer dtype — np.int64 as encode() gives, np.int32 too —, may be empty) -> str. Special ids are skipped (skip_special=True) or rendered as '<mask>', '<bos>', '<eos>'. IndexError for an id outside [0, n_vocab).
        """
    def encode(self, text: typing.Any, bos: typing.Any = True, eos: typing.Any = True) -> numpy.typing.NDArray[numpy.int64]:
        """
        text (str) -> 1-D np.int64 array [bos_token] x[1..ℓ] [eos_token] (§4). Special ids appear only where bos/eos ask for them; TypeError unless text is a str.
        """
    def encode_batch(self, texts: typing.Any, bos: typing.Any = True, eos: typing.Any = True) -> list:
        """
        A list of str -> a list of 1-D np.int64 arrays, each as encode() gives it.
        """
    def save(self, path: typing.Any) -> None:
        """
        Write the tokenizer as JSON (UTF-8; format in docs/tokenization.md).
        """
    def to_json(self) -> str:
        """
        The JSON text save() writes.
        """
    @property
    def bos_token(self) -> typing.Any:
        """
        N_V − 2 (a BPE tokenizer from another project's file: its id, or None)
        """
    @property
    def chars(self) -> list:
        """
        The characters of ids 0, 1, ...
        """
    @property
    def eos_token(self) -> typing.Any:
        """
        N_V − 1 (a BPE tokenizer from another project's file: its id, or None)
        """
    @property
    def mask_token(self) -> typing.Any:
        """
        N_V − 3 (a BPE tokenizer from another project's file: the file's id of its mask token, or None)
        """
    @property
    def n_vocab(self) -> int:
        """
        N_V: regular tokens + the 3 special tokens.
        """
    @property
    def unk_token(self) -> typing.Any:
        """
        N_V − 4 when fit with unk=True, else None.
        """
class WordTokenizer:
    """
    Word-level tokenizer (paper §4): one token per word, a word being a piece of the GPT-2 pre-tokenizer (a word keeps its leading space, runs of digits, of punctuation and of whitespace are words too), so decode(encode(s)) == s.
    
    Vocabulary: the words of the fit text seen at least min_count times, most frequent first (ties by UTF-8 bytes), at most max_words of them (None: all); then unk_token if fit with unk=True; then mask_token = N_V−3, bos_token = N_V−2, eos_token = N_V−1.
    Unknown words at encode time raise ValueError naming the word and its position, unless fit with unk=True: then they become unk_token (decoded as '<unk>').
    
    Build with WordTokenizer.fit(text) or WordTokenizer.load(path).
    """
    @staticmethod
    def fit(text: typing.Any, unk: bool = False, min_count: typing.Any = 1, max_words: typing.Any = None) -> WordTokenizer:
        """
        The vocabulary of the words of `text` (ValueError if empty).
        """
    @staticmethod
    def from_json(text: typing.Any) -> WordTokenizer:
        """
        The tokenizer whose to_json() is `text` (ValueError if it is corrupt).
        """
    @staticmethod
    def load(path: typing.Any) -> WordTokenizer:
        """
        Read a file written by save(). ValueError naming the problem if it is corrupt or truncated, or holds another kind of tokenizer; OSError if it cannot be read.
        """
    @staticmethod
    def pretokenize(text: typing.Any) -> list:
        """
        The words of `text` (GPT-2's pre-tokenizer rule; their concatenation is text).
        """
    def __eq__(self, arg0: typing.Any) -> bool:
        ...
    def __getstate__(self) -> tuple[str]:
        ...
    def __hash__(self) -> int:
        ...
    def __repr__(self) -> str:
        ...
    def __setstate__(self, arg0: tuple) -> None:
        ...
    def decode(self, ids: typing.Any, skip_special: bool = True) -> str:
        """
        ids (1-D integers of any integer dtype — np.int64 as encode() gives, np.int32 too —, may be empty) -> str. Special ids are skipped (skip_special=True) or rendered as '<mask>', '<bos>', '<eos>'. IndexError for an id outside [0, n_vocab).
        """
    def encode(self, text: typing.Any, bos: typing.Any = True, eos: typing.Any = True) -> numpy.typing.NDArray[numpy.int64]:
        """
        text (str) -> 1-D np.int64 array [bos_token] x[1..ℓ] [eos_token] (§4). Special ids appear only where bos/eos ask for them; TypeError unless text is a str.
        """
    def encode_batch(self, texts: typing.Any, bos: typing.Any = True, eos: typing.Any = True) -> list:
        """
        A list of str -> a list of 1-D np.int64 arrays, each as encode() gives it.
        """
    def save(self, path: typing.Any) -> None:
        """
        Write the tokenizer as JSON (UTF-8; format in docs/tokenization.md).
        """
    def to_json(self) -> str:
        """
        The JSON text save() writes.
        """
    @property
    def bos_token(self) -> typing.Any:
        """
        N_V − 2 (a BPE tokenizer from another project's file: its id, or None)
        """
    @property
    def eos_token(self) -> typing.Any:
        """
        N_V − 1 (a BPE tokenizer from another project's file: its id, or None)
        """
    @property
    def mask_token(self) -> typing.Any:
        """
        N_V − 3 (a BPE tokenizer from another project's file: the file's id of its mask token, or None)
        """
    @property
    def n_vocab(self) -> int:
        """
        N_V: regular tokens + the 3 special tokens.
        """
    @property
    def unk_token(self) -> typing.Any:
        """
        N_V − 4 when fit with unk=True, else None.
        """
    @property
    def words(self) -> list:
        """
        The words of ids 0, 1, ...
        """
class _TrainOptions:
    """
    The trainers' options as the core reads them (ft::TrainOptions).
    """
    @staticmethod
    def doc(listing: str) -> str:
        """
        One line per option: name=default and what it does.
        """
    def __init__(self, listing: str, options: dict, optimizer: typing.Any = 'adam') -> None:
        """
        Parsed once by the core's schema (train_options.cpp): TypeError for an option the listing does not take or a value of the wrong type, ValueError for one out of range, each naming the option.
        """
    def as_dict(self) -> dict:
        """
        Every option of the listing with its value, in Python's notation (patience off: None).
        """
    def make_optimizer(self) -> typing.Any:
        """
        A fresh optimizer of the options (optimizer='adam': Adam(eta, betas, eps=1e-8, weight_decay), checked with them; 'sgd': SGD(eta)).
        """
    def plan(self, x_data: typing.Any, mask_token: typing.Any = None) -> list:
        """
        The steps a run on x_data takes (ft::plan_run: the trainers' own plan): per step a dict with step, epoch, sequences (indices into x_data, in the minibatch's order) and lr; with mask_token (ETraining) masked, the x̃ of each of those sequences (lines 4–6).
        """
class PromptCache:
    """
    A prompt cache: the keys and values of every layer for a prompt and its last token's logits —
    Algorithm 14's first pass, computed once (DInference.prefill(x, model)), saved and loaded, and continued by
    DInference(...)(cache, model) with the tokens DInference(...)(x, model) gives for the same seed.
    
    It names what it was computed with: config_hash, the SHA-256 of the model's config as config_json() writes it
    with the dtype, and theta_digest, a 64-bit digest of θ; a model with another config, dtype or θ refuses it
    (ValueError). save(path) writes a safetensors file (tensors K.l, V.l of shape (ℓ, H_kv·d_attn), z (N_V,)),
    PromptCache.load(path, model) reads one back, checked against the model.
    """
    @staticmethod
    def load(path: typing.Any, model: typing.Any) -> PromptCache:
        """
        read a saved cache for `model` (ValueError: another config, dtype or θ, or a damaged file)
        """
    def __len__(self) -> int:
        ...
    def __repr__(self) -> str:
        ...
    def save(self, path: typing.Any) -> None:
        """
        write the cache to a safetensors file (atomically: a temporary renamed onto path)
        """
    @property
    def config_hash(self) -> str:
        ...
    @property
    def dtype(self) -> str:
        ...
    @property
    def ids(self) -> numpy.typing.NDArray[numpy.int64]:
        """
        the prompt's token ids
        """
    @property
    def n_tokens(self) -> int:
        ...
    @property
    def nbytes(self) -> int:
        """
        bytes of keys, values and logits held
        """
    @property
    def theta_digest(self) -> str:
        ...
class DInference:
    """
    Algorithm 14: y ← DInference(x, θ̂) — prompting a trained DTransformer.
    
    DInference(l_gen, tau=1.0, *, top_k=None, top_p=None, seed=None, cache=True)(x, model) -> y, the ℓ_gen
    token ids that follow the prompt x (1-D, 1 ≤ ℓ ≤ l_max). Each token is drawn from q ∝ p^{1/τ} where p is
    the last column of P = model(x) (τ = 0: argmax); top_k / top_p restrict q to the k most probable tokens,
    then to the smallest set of those whose renormalised mass is ≥ top_p. cache=True keeps the keys and values of earlier tokens (one column of
    work per new token); cache=False runs the listing literally (the whole model on the whole sequence each
    step) — both give the same tokens for the same seed. Past l_max, by `context`: "window", the model sees
    the last l_max tokens (a sliding window; the cache is refilled from the window each step then); "full",
    the model sees the whole sequence (only for positional="rope" or "alibi", whose positions have no table:
    ALiBi extrapolates); "auto" (default): "full" for ALiBi, "window" otherwise. seed=None: a fresh random seed.
    
    Many prompts (docs/paged_decoding.md, Algorithm P): x a list (or tuple) of 1-D id arrays and/or PromptCaches
    returns a list, item i the tokens DInference(...)(x[i], model) gives. The keys and values are kept in pages
    of 16 tokens with a block table per sequence; up to max_batch sequences are decoded together (one product
    per projection over the batch), finished ones leave and waiting ones join (continuous batching). Each
    sequence samples from its own stream seeded with `seed` (as a call on that prompt alone; seed=None: a fresh
    seed each). A list of ints is one prompt, as before. Every prompt is checked before anything runs.
    x a PromptCache (DInference.prefill): continues it, the tokens of DInference(...)(cache.ids, model).
    
    A prefix LM (mask="prefix", docs/variants.md V7): the call's prefix_len=p makes the prompt's first p tokens
    the prefix (bidirectional over them, causal after); None (default): the whole prompt, for such a model.
    """
    @staticmethod
    def prefill(x: typing.Any, model: typing.Any) -> PromptCache:
        """
        The prompt cache of x: Algorithm 14's first pass over the prompt (every layer's keys and values, the last token's logits), computed once; DInference(...)(cache, model) continues it with the tokens DInference(...)(x, model) gives.
        """
    def __call__(self, x: typing.Any, model: typing.Any, prefix_len: typing.Any = None) -> typing.Any:
        ...
    def __init__(self, l_gen: typing.SupportsIndex, tau: typing.SupportsFloat | typing.SupportsIndex = 1.0, *, top_k: typing.Any = None, top_p: typing.Any = None, seed: typing.Any = None, cache: bool = True, context: str = 'auto', max_batch: typing.SupportsIndex = 32) -> None:
        ...
    def __repr__(self) -> str:
        ...
    @property
    def context(self) -> str:
        ...
    @property
    def l_gen(self) -> int:
        ...
    @property
    def max_batch(self) -> int:
        ...
    @property
    def tau(self) -> float:
        ...
class EDInference:
    """
    Algorithm 15: x̂ ← EDInference(z, θ̂) — sequence-to-sequence decoding with an EDTransformer.
    
    EDInference(tau=1.0, *, max_len=None, top_k=None, top_p=None, seed=None, cache=True)(z, model) -> x̂:
    starts with bos_token and samples until eos_token (included), or until x̂ has max_len tokens (default
    l_max), so it always terminates. cache=True runs the encoder once per z and keeps the decoder's keys and
    values; cache=False runs the listing literally. Sampling as DInference.
    """
    def __call__(self, z: typing.Any, model: typing.Any) -> numpy.typing.NDArray[numpy.int64]:
        ...
    def __init__(self, tau: typing.SupportsFloat | typing.SupportsIndex = 1.0, *, max_len: typing.Any = None, top_k: typing.Any = None, top_p: typing.Any = None, seed: typing.Any = None, cache: bool = True) -> None:
        ...
    def __repr__(self) -> str:
        ...
    @property
    def tau(self) -> float:
        ...
class SpeculativeInference:
    """
    Speculative decoding (Leviathan et al. 2023; Chen et al. 2023) beside Algorithm 14, listing in docs/speculative_decoding.md.
    
    SpeculativeInference(l_gen, k=4, tau=1.0, *, seed=None)(x, target, draft, *, stats=False) -> y, the ℓ_gen
    token ids after the prompt x, distributed exactly as DInference(l_gen, tau)(x, target): the draft
    DTransformer proposes k tokens, the target scores them in one cached pass, each is kept with probability
    min(1, q(x̂)/p(x̂)) (q the target's, p the draft's q ∝ P^{1/τ}); the first rejected one is replaced by a
    token from norm(max(0, q − p)); when all k are kept the target adds one more. τ = 0: the target's greedy
    output. Both models: same vocabulary and dtype, len(x) + l_gen − 1 ≤ l_max (no sliding window).
    stats=True returns (y, dict) with target_passes, draft_passes, drafted and accepted (per target pass) and
    tokens_per_pass. seed=None: a fresh random seed.
    draft=None: self-speculation (docs/variants.md V16): the target's own multi-token-prediction modules (mtp_depth ≥ k)
    draft, module j the j-th token after the trunk's last kept hidden state; no second model. The first pass drafts
    nothing.
    """
    def __call__(self, x: typing.Any, target: typing.Any, draft: typing.Any = None, *, stats: bool = False) -> typing.Any:
        ...
    def __init__(self, l_gen: typing.SupportsIndex, k: typing.SupportsIndex = 4, tau: typing.SupportsFloat | typing.SupportsIndex = 1.0, *, seed: typing.Any = None) -> None:
        ...
    def __repr__(self) -> str:
        ...
    @property
    def k(self) -> int:
        ...
    @property
    def l_gen(self) -> int:
        ...
    @property
    def tau(self) -> float:
        ...
class ViT(_HasParams):
    """
    Listing V14: P ← ViT(x | θ) — the vision transformer (Dosovitskiy et al. 2021).
    
    Images (B, C, H, W) cut into P×P patches (row by row), a linear patch embedding W_patch (d_e, C·P·P) + b_patch,
    a class token x_class and learned positions W_p (d_e, N+1), L pre-LN encoder layers (Algorithm 10's layer with
    Mask ≡ 1), a final layer_norm of the class token's column, and P = softmax(W_c x + b_c). Hugging Face's
    ViTForImageClassification is this model (ft.from_hf). Hyperparameters: image_size (an int or (H, W)),
    patch_size (dividing both), n_classes, L, H, d_e, d_mlp; options n_channels=3, eps=1e-12 (layer_norm's,
    HF's layer_norm_eps), seed, init_std=0.02, dtype.
    Call: P = model(images) -> (n_classes, B). model.logits(images): W_c x + b_c. loss_and_grad(images, labels):
    −Σ_b log P[labels[b], b] and every parameter's gradient; loss(images, labels, reduction="sum"|"mean").
    """
    def __call__(self, images: typing.Any) -> numpy.ndarray[typing.Any, numpy.dtype[typing.Any]]:
        """
        P (n_classes, B): softmax(W_c x + b_c) of every image (column b: image b).
        """
    def __init__(self, image_size: typing.Any, patch_size: typing.SupportsIndex, n_classes: typing.SupportsIndex, L: typing.SupportsIndex, H: typing.SupportsIndex, d_e: typing.SupportsIndex, d_mlp: typing.SupportsIndex, *, n_channels: typing.SupportsIndex = 3, eps: typing.SupportsFloat | typing.SupportsIndex = 1e-12, seed: typing.Any = 0, init_std: typing.SupportsFloat | typing.SupportsIndex = 0.02, dtype: typing.Any = 'float32', precision: typing.Any = 'float32') -> None:
        ...
    def __repr__(self) -> str:
        ...
    def logits(self, images: typing.Any) -> numpy.ndarray[typing.Any, numpy.dtype[typing.Any]]:
        """
        z = W_c x + b_c (n_classes, B), before the softmax.
        """
    def loss(self, images: typing.Any, labels: typing.Any, reduction: str = 'sum') -> float:
        """
        The loss of loss_and_grad without gradients (reduction='mean': per image).
        """
    def loss_and_grad(self, images: typing.Any, labels: typing.Any) -> tuple[float, dict]:
        """
        −Σ_b log P[labels[b], b] (summed over the batch) and its gradient: (loss, grads) with params' keys.
        """
    def zero_grad(self) -> None:
        ...
    @property
    def config(self) -> dict:
        ...
    @property
    def dtype(self) -> str:
        ...
    @property
    def grads(self) -> ParamDict:
        """
        Gradients, same keys as params, accumulated by backward(), cleared by zero_grad().
        """
    @property
    def params(self) -> ParamDict:
        """
        Parameters θ: name -> writable numpy view of the C++ storage (zero-copy). Assigning params[name] = array copies into the storage (shape must match).
        """
    @property
    def precision(self) -> str:
        """
        How the matrix products run: 'float32', or 'bf16-mixed' (float32 models only: every product of the listings takes bf16-rounded operands and accumulates in float32; θ, Adam's moments, norms, softmax, the loss and the gradient sums stay float32). ft.bf16_info() says what runs the bf16 products.
        """
    @precision.setter
    def precision(self, arg1: typing.Any) -> None:
        ...
def _bf16_allow_kept_inputs(on: bool) -> None:
    """
    Private (tests): False makes bf16-mixed training calls round an affine map's input again for the backward's dW instead of reading the rounding its forward product kept (the same results); True restores the default.
    """
def _bf16_allow_native(on: bool) -> None:
    """
    Private (tests): False runs bf16-mixed products emulated (bf16-rounded operands, float32 products) even where the CPU has bf16 instructions; True restores the default.
    """
def _bf16_allow_theta_copy(on: bool) -> None:
    """
    Private (tests): False makes bf16-mixed training calls round θ's operands at every product instead of reading θ's bf16 copy (the same results); True restores the default.
    """
def _bf16_kept_inputs_read() -> int:
    """
    Private (tests): how many bf16-mixed products in this process have read an affine input's rounding kept from its forward product.
    """
def _bf16_theta_copies() -> int:
    """
    Private (tests): how many bf16 copies of θ decoding calls in bf16-mixed have made in this process (a call on an unchanged θ makes none).
    """
def _dtraining(model: typing.Any, x_data: typing.Any, options: _TrainOptions, optimizer: typing.Any, hook: typing.Any = None, val_data: typing.Any = None, history: typing.Any = None, early_stopping: typing.Any = None, replicas: typing.Any = None, prefix_len: typing.Any = None, val_prefix_len: typing.Any = None, x_tilde: typing.Any = None) -> None:
    ...
def _edtraining(model: typing.Any, z_data: typing.Any, x_data: typing.Any, options: _TrainOptions, optimizer: typing.Any, hook: typing.Any = None, z_val: typing.Any = None, x_val: typing.Any = None, history: typing.Any = None, early_stopping: typing.Any = None, replicas: typing.Any = None) -> None:
    ...
def _etraining(model: typing.Any, x_data: typing.Any, options: _TrainOptions, optimizer: typing.Any, hook: typing.Any = None, val_data: typing.Any = None, history: typing.Any = None, early_stopping: typing.Any = None, replicas: typing.Any = None, prefix_len: typing.Any = None, val_prefix_len: typing.Any = None, x_tilde: typing.Any = None) -> None:
    ...
def _flat_params(model: typing.Any) -> numpy.ndarray[typing.Any, numpy.dtype[typing.Any]]:
    """
    θ as one read-only 1-D array (no copy: the model's flat buffer, in parameter order), e.g. to fingerprint it.
    """
def _gemm(A: typing.Any, B: typing.Any, transA: bool = False, transB: bool = False, *, precision: str = 'float32') -> numpy.ndarray[typing.Any, numpy.dtype[typing.Any]]:
    """
    Private (benchmarks): C = op(A) op(B) by one call of the core's gemm (OpenBLAS), in A's precision (float32 stays float32, any other float is float64). C-contiguous inputs of that dtype are used without a copy (as a transposed column-major matrix); other layouts are copied once. precision='bf16-mixed' (float32 only): the operands rounded to bfloat16, float32 accumulation (the bf16-mixed models' products).
    """
def _load_model(path: str, dtype: typing.Any = None) -> typing.Any:
    """
    ft.load (io.py): the core's reader of model files.
    """
def _mask_tokens(x: typing.Any, mask_token: typing.SupportsIndex, p_mask: typing.SupportsFloat | typing.SupportsIndex, seed: typing.Any) -> numpy.typing.NDArray[numpy.int64]:
    """
    Algorithm 12 lines 4–6 on one sequence (the masking ETraining applies), for inspection and tests.
    """
def _option_infos(arch: str) -> list:
    """
    The options the architecture takes, in the schema's order: (name, kind, default as JSON text, the architectures that take it). ValueError for another architecture name.
    """
def _parse_json(text: str, what: str) -> typing.Any:
    """
    JSON text from outside as Python values (the core's bounded parse).
    """
def _position_table(positional: str) -> str:
    """
    The table W_p of Algorithm 2 a config's positional names, as its registry line declares it: 'learned', 'sinusoidal', or 'none' (the position is in attention: RoPE, ALiBi, T5's bias). ValueError for another name.
    """
def _read_metadata(path: str) -> dict[str, str]:
    """
    io.read_metadata: the metadata of a safetensors file (its header only).
    """
def _save_model(model: typing.Any, path: str, metadata: collections.abc.Mapping[str, str]) -> None:
    """
    ft.save (io.py): the core's writer of model files.
    """
def bf16_info() -> str:
    """
    The CPU's bfloat16 instructions (AVX512_BF16, AMX-BF16) and what runs precision='bf16-mixed' products: oneDNN on those instructions, or emulated (bf16-rounded operands, float32 products through the BLAS).
    """
def bidirectional_mask(l_z: typing.SupportsIndex, l_x: typing.SupportsIndex | None = None) -> numpy.ndarray[typing.Any, numpy.dtype[typing.Any]]:
    """
    Mask ≡ 1 (l_z, l_x) bool array: every token attends to every context token (l_x defaults to l_z).
    """
def bigbird_layout(n_blocks: typing.SupportsIndex, window_blocks: typing.SupportsIndex = 3, n_global_blocks: typing.SupportsIndex = 1, n_random_blocks: typing.SupportsIndex = 3, seed: typing.Any = 0, name: str = '', head: typing.SupportsIndex = 0) -> numpy.ndarray[typing.Any, numpy.dtype[typing.Any]]:
    """
    BigBird's block layout (Algorithm V17a of docs/variants.md) of n_blocks blocks: a bool array (n, n),
    layout[j, i] = key block j is live for query block i. Random blocks drawn from seed and the attention's
    name and head: an ETransformer(attention='bigbird') layer l, head h draws with seed=layout_seed,
    name=f'layers.{l}.attn.', head=h (each head its own random blocks; head 0's are the layer's draw of before).
    ValueError: window_blocks even or < 1, n_global_blocks or n_random_blocks < 0, too few blocks.
    """
def blas_info() -> str:
    """
    The BLAS in use: OpenBLAS's build configuration, the kernel set it chose for this CPU, and its threads.
    """
def blas_kernel() -> str:
    """
    The kernel set OpenBLAS chose for this CPU at load time, e.g. 'Haswell', 'SkylakeX', 'Zen' ('Prescott', 'Core2', 'Nehalem' are generic fallbacks: slow on a CPU with AVX2).
    """
def block_sparse_attention(Q: typing.Any, K: typing.Any, V: typing.Any, layout: typing.Any, block_size: typing.SupportsIndex) -> tuple:
    """
    Algorithm V17b (block-sparse attention, one head): Q (d, ℓ), K (d, ℓ), V (d_v, ℓ), layout a bool (n, n)
    block layout (as bigbird_layout returns; ℓ = n·block_size; or integer multiplicities m: the block gathered
    m times) -> (Ṽ (d_v, ℓ), λ (ℓ,)), Ṽ = V softmax(S/√d) over the live blocks only. float32 when Q is
    float32, else float64.
    """
def block_sparse_attention_backward(Q: typing.Any, K: typing.Any, V: typing.Any, layout: typing.Any, block_size: typing.SupportsIndex, lse: typing.Any, dY: typing.Any) -> tuple:
    """
    The backward of block_sparse_attention: given its λ and dṼ (d_v, ℓ) -> (dQ, dK, dV).
    """
def chunk(ids: typing.Any, l_max: typing.Any, stride: typing.Any = None) -> list:
    """
    §4: split a sequence longer than ℓ_max into pieces of length <= l_max (a list of copies with the dtype of np.asarray(ids)). Windows start at 0, stride, 2·stride, ... and the last is the first that reaches the end. stride=None (= l_max) gives disjoint pieces whose concatenation is ids; 1 <= stride < l_max gives overlapping windows. An empty sequence gives []. ValueError for l_max < 1 or stride outside [1, l_max].
    """
def gelu(A: typing.Any, approximate: str = 'none') -> numpy.ndarray[typing.Any, numpy.dtype[typing.Any]]:
    """
    GELU(x) = x·Φ(x) element-wise (exact, with erf); approximate='tanh' gives GPT-2's approximation.
    """
def get_num_threads() -> int:
    ...
def max_num_threads() -> int:
    """
    The largest n set_num_threads accepts: 4 per CPU (at least 64), within OMP_THREAD_LIMIT and, under an address-space limit (ulimit -v), half of it at one thread stack per thread.
    """
def random_feature_matrix(attention: str, n_features: typing.SupportsIndex, d_attn: typing.SupportsIndex, seed: typing.Any = 0, name: str = '') -> numpy.typing.NDArray[numpy.float64]:
    """
    Ω (n_features, d_attn), the fixed random projection of attention='performer' (positive orthogonal features,
    FAVOR+: Gram-Schmidt blocks, rows rescaled by chi-distributed norms) or 'rfa' (independent Gaussian rows),
    Algorithm V15a of docs/variants.md, drawn from seed and the attention's name: a model's layer l draws it
    with seed=feature_seed, name=f'layers.{l}.attn.'.
    """
def relu(A: typing.Any) -> numpy.ndarray[typing.Any, numpy.dtype[typing.Any]]:
    """
    ReLU(x) = max(0, x) element-wise.
    """
def set_num_threads(n: typing.SupportsIndex) -> None:
    """
    Threads for the element-wise kernels and the BLAS (one shared OpenMP pool): 1 <= n <= max_num_threads(), else ValueError.
    """
def softmax(A: typing.Any) -> numpy.ndarray[typing.Any, numpy.dtype[typing.Any]]:
    """
    softmax(A)[t1, t2] = exp(A[t1, t2]) / Σ_t exp(A[t, t2]): over each column (the paper's definition; a 1-D input is one column). -inf entries get probability 0; the column max is subtracted first.
    """
def unidirectional_mask(l_z: typing.SupportsIndex, l_x: typing.SupportsIndex | None = None) -> numpy.ndarray[typing.Any, numpy.dtype[typing.Any]]:
    """
    Mask[t_z, t_x] = [[t_z ≤ t_x]] (l_z, l_x) bool array: a token attends only to itself and earlier tokens (l_x defaults to l_z).
    """
