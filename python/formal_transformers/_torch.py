"""PyTorch modules computing Algorithms 8–10 with an ft model's parameters (ft.to_torch, ft.from_torch).

Each module keeps the ft model's hyperparameters (`ft_config`) and a table from ft's parameter names and
layouts to its own tensors, so ft_params() / ft_grads() read them back under ft's names. Losses are ft's
(summed over the batch): module.loss takes what model.loss_and_grad takes. Inputs: one sequence (1-D), a
2-D (N, ℓ) batch (run as one batch), or a list of sequences of any lengths (run one by one); numpy arrays,
lists or torch tensors of token ids.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from . import _core
from ._options import check_unmapped_at_defaults
# torch interop imports hf (T5 runs as transformers' own model), never the other way round
from .hf import _registry as _hf_registry
from .hf import t5 as _hf_t5


def _gelu(kind: str):
    return lambda h: F.gelu(h, approximate="tanh" if kind == "tanh" else "none")


def _groups(*xs):
    """Zip the inputs into groups of LongTensors (B, ℓ): a 2-D batch is one group, a list one group per
    sequence, a 1-D sequence one group of one. None stays None."""
    def split(x):
        if x is None:
            return None
        if isinstance(x, (list, tuple)) and len(x) and np.ndim(x[0]) >= 1:
            return [torch.as_tensor(np.asarray(s), dtype=torch.long).reshape(1, -1) for s in x]
        t = torch.as_tensor(np.asarray(x), dtype=torch.long)
        if t.dim() == 1:
            t = t.reshape(1, -1)
        if t.dim() != 2:
            raise ValueError(f"token ids must be 1-D, 2-D or a list of sequences, got {t.dim()} dimensions")
        return [t]
    parts = [split(x) for x in xs]
    n = len(parts[0])
    for p in parts[1:]:
        if p is not None and len(p) != n:
            raise ValueError("the inputs must hold the same number of sequences")
    return [tuple(None if p is None else p[i] for p in parts) for i in range(n)]


class _Attention(nn.Module):
    """Algorithm 5 (with Algorithm 4's biases) for any d_attn, d_mid; batch-first (B, ℓ, d)."""

    def __init__(self, H, d_x, d_z, d_attn, d_mid, d_out):
        super().__init__()
        self.H, self.d_attn, self.d_mid = H, d_attn, d_mid
        self.q, self.k = nn.Linear(d_x, H * d_attn), nn.Linear(d_z, H * d_attn)
        self.v, self.o = nn.Linear(d_z, H * d_mid), nn.Linear(H * d_mid, d_out)

    def forward(self, X, Z, causal: bool):
        B, lx, lz, H = X.shape[0], X.shape[1], Z.shape[1], self.H
        Q = self.q(X).view(B, lx, H, self.d_attn).transpose(1, 2)
        K = self.k(Z).view(B, lz, H, self.d_attn).transpose(1, 2)
        V = self.v(Z).view(B, lz, H, self.d_mid).transpose(1, 2)
        S = Q @ K.transpose(-1, -2) / math.sqrt(self.d_attn)  # (B, H, ℓ_x, ℓ_z)
        if causal:
            S = S.masked_fill(torch.ones(lx, lz, dtype=torch.bool).triu(1), float("-inf"))
        Y = (torch.softmax(S, dim=-1) @ V).transpose(1, 2).reshape(B, lx, H * self.d_mid)
        return self.o(Y)


def _norm(kind, d, eps):
    return nn.RMSNorm(d, eps=eps) if kind == "rms" else nn.LayerNorm(d, eps=eps)


class _Block(nn.Module):
    """One layer of Algorithm 10 (pre-LN) or Algorithm 9 (post-LN)."""

    def __init__(self, c, act, norm="layer", pre_ln=True):
        super().__init__()
        d = c["d_e"]
        self.pre_ln, self.act = pre_ln, act
        self.attn = _Attention(c["H"], d, d, c["d_attn"], c["d_mid"], d)
        self.norm1, self.norm2 = _norm(norm, d, c["eps"]), _norm(norm, d, c["eps"])
        self.mlp1, self.mlp2 = nn.Linear(d, c["d_mlp"]), nn.Linear(c["d_mlp"], d)

    def forward(self, X, causal):
        if self.pre_ln:  # Algorithm 10 lines 5–8
            Xt = self.norm1(X)
            X = X + self.attn(Xt, Xt, causal)
            return X + self.mlp2(self.act(self.mlp1(self.norm2(X))))
        X = self.norm1(X + self.attn(X, X, causal))  # Algorithm 9 lines 5–8
        return self.norm2(X + self.mlp2(self.act(self.mlp1(X))))


class FTModule(nn.Module):
    """Common part: the ft name table and the conversions."""

    def _register(self, table):
        # table: ft name -> (tensor getter, row slice or None, transpose, ft shape)
        self._table = table

    def _ft_of(self, which):
        out = {}
        for name, (get, sl, tr, shape) in self._table.items():
            t = get()
            t = t.grad if which == "grad" else t
            if t is None:
                out[name] = None
                continue
            v = t.detach()
            if sl is not None:
                v = v[sl]
            v = v.cpu().numpy()
            out[name] = np.array((v.T if tr else v).reshape(shape))
        return out

    def ft_params(self) -> dict:
        """The parameters under ft's names, in ft's layouts (numpy copies)."""
        return self._ft_of("data")

    def ft_grads(self) -> dict:
        """The gradients (.grad) under ft's names and layouts; None where a parameter has no gradient yet."""
        return self._ft_of("grad")

    def load_ft_params(self, params) -> None:
        """Copy ft parameters (a dict of arrays with ft's names, e.g. model.params) into this module."""
        missing = set(self._table) - set(params)
        if missing:
            raise ValueError(f"missing parameters: {sorted(missing)}")
        with torch.no_grad():
            for name, (get, sl, tr, shape) in self._table.items():
                v = np.asarray(params[name])
                if v.shape != tuple(shape):
                    raise ValueError(f"parameter {name} has shape {v.shape}, expected {tuple(shape)}")
                t = get()
                dst = t if sl is None else t[sl]
                src = torch.from_numpy(np.ascontiguousarray(v.T if tr else v)).reshape(dst.shape)
                dst.copy_(src)

    def as_loss(self) -> nn.Module:
        """A module whose forward is this module's loss (to wrap in DistributedDataParallel)."""
        return _LossOf(self)


class _LossOf(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.model = m

    def forward(self, *args, **kw):
        return self.model.loss(*args, **kw)


def _attn_table(prefix, attn, H, da, dm, d):
    return {
        prefix + "W_q": (lambda: attn.q.weight, None, False, (H, da, d)), prefix + "b_q": (lambda: attn.q.bias, None, False, (H, da)),
        prefix + "W_k": (lambda: attn.k.weight, None, False, (H, da, d)), prefix + "b_k": (lambda: attn.k.bias, None, False, (H, da)),
        prefix + "W_v": (lambda: attn.v.weight, None, False, (H, dm, d)), prefix + "b_v": (lambda: attn.v.bias, None, False, (H, dm)),
        prefix + "W_o": (lambda: attn.o.weight, None, False, (d, H * dm)), prefix + "b_o": (lambda: attn.o.bias, None, False, (d,)),
    }


def _lin(mod, name_w, name_b, shape_w, shape_b):
    return {name_w: (lambda: mod.weight, None, False, shape_w), name_b: (lambda: mod.bias, None, False, shape_b)}


class _Embeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.tok = nn.Embedding(c["n_vocab"], c["d_e"])
        self.learned = c["positional"] == "learned"
        if self.learned:
            self.pos = nn.Embedding(c["l_max"], c["d_e"])
        else:  # sinusoidal: fixed (ft keeps it out of the trainable parameters)
            self.register_buffer("pos_fixed", torch.zeros(c["l_max"], c["d_e"]))

    def W_p(self):
        return self.pos.weight if self.learned else self.pos_fixed

    def forward(self, x):  # lines 1–3: X[:, t] = W_e[:, x[t]] + W_p[:, t]  (here rows)
        return self.tok(x) + self.W_p()[: x.shape[1]]

    def table(self, c):
        d = c["d_e"]
        return {"W_e": (lambda: self.tok.weight, None, True, (d, c["n_vocab"])),
                "W_p": (self.W_p, None, True, (d, c["l_max"]))}


class TorchDTransformer(FTModule):
    """Algorithm 10 in PyTorch: forward(x) -> logits (B, ℓ, N_V); loss(x) = Algorithm 13 line 5 (summed)."""

    def __init__(self, c):
        super().__init__()
        self.ft_config = dict(c)
        d, V = c["d_e"], c["n_vocab"]
        self.emb = _Embeddings(c)
        self.layers = nn.ModuleList(_Block(c, _gelu(c["gelu"]), c["norm"], True) for _ in range(c["L"]))
        self.norm_f = _norm(c["norm"], d, c["eps"])
        self.tied = c["tied"]
        if not self.tied:
            self.unembed = nn.Linear(d, V, bias=False)
        t = self.emb.table(c)
        for l, b in enumerate(self.layers):
            p = f"layers.{l}."
            t.update(_attn_table(p + "attn.", b.attn, c["H"], c["d_attn"], c["d_mid"], d))
            t[p + "gamma1"] = (lambda b=b: b.norm1.weight, None, False, (d,))
            t[p + "gamma2"] = (lambda b=b: b.norm2.weight, None, False, (d,))
            if c["norm"] == "layer":
                t[p + "beta1"] = (lambda b=b: b.norm1.bias, None, False, (d,))
                t[p + "beta2"] = (lambda b=b: b.norm2.bias, None, False, (d,))
            t.update(_lin(b.mlp1, p + "W_mlp1", p + "b_mlp1", (c["d_mlp"], d), (c["d_mlp"],)))
            t.update(_lin(b.mlp2, p + "W_mlp2", p + "b_mlp2", (d, c["d_mlp"]), (d,)))
        t["gamma"] = (lambda: self.norm_f.weight, None, False, (d,))
        if c["norm"] == "layer":
            t["beta"] = (lambda: self.norm_f.bias, None, False, (d,))
        if not self.tied:
            t["W_u"] = (lambda: self.unembed.weight, None, False, (V, d))
        self._register(t)

    def forward(self, x):
        X = self.emb(x)
        for b in self.layers:
            X = b(X, True)
        X = self.norm_f(X)
        return X @ self.emb.tok.weight.T if self.tied else self.unembed(X)

    def loss(self, x):
        total = 0
        for (g,) in _groups(x):
            Z = self(g)[:, :-1]
            total = total + F.cross_entropy(Z.reshape(-1, Z.shape[-1]), g[:, 1:].reshape(-1), reduction="sum")
        return total


class TorchETransformer(FTModule):
    """Algorithm 9 (with BERT's options) in PyTorch: forward(x, segments=None) -> logits (B, ℓ, N_V);
    hidden(x, segments=None) -> X after line 9 (B, ℓ, d_e); loss(x_tilde, x, segments=None) = Algorithm 12
    line 9 (summed over the masked positions, mask_token = N_V − 3)."""

    def __init__(self, c):
        super().__init__()
        self.ft_config = dict(c)
        d, V, df = c["d_e"], c["n_vocab"], c["d_f"]
        act = _gelu(c["gelu"])
        self.act, self.mask_token, self.tied = act, V - 3, c["tied"]
        self.emb = _Embeddings(c)
        self.n_segments = c.get("n_segments", 0)
        if self.n_segments:
            self.seg = nn.Embedding(self.n_segments, d)
        self.norm_e = nn.LayerNorm(d, eps=c["eps"]) if c.get("embed_norm") else None
        self.layers = nn.ModuleList(_Block(c, act, "layer", False) for _ in range(c["L"]))
        self.W_f = nn.Linear(d, df)
        self.norm_f = nn.LayerNorm(df, eps=c["eps"])
        if not self.tied:
            self.unembed = nn.Linear(df, V, bias=False)
        self.b_u = nn.Parameter(torch.zeros(V)) if c.get("unembed_bias") else None
        t = self.emb.table(c)
        if self.n_segments:
            t["W_s"] = (lambda: self.seg.weight, None, True, (d, self.n_segments))
        if self.norm_e is not None:
            t["gamma_e"] = (lambda: self.norm_e.weight, None, False, (d,))
            t["beta_e"] = (lambda: self.norm_e.bias, None, False, (d,))
        for l, b in enumerate(self.layers):
            p = f"layers.{l}."
            t.update(_attn_table(p + "attn.", b.attn, c["H"], c["d_attn"], c["d_mid"], d))
            t.update(_lin(b.norm1, p + "gamma1", p + "beta1", (d,), (d,)))
            t.update(_lin(b.mlp1, p + "W_mlp1", p + "b_mlp1", (c["d_mlp"], d), (c["d_mlp"],)))
            t.update(_lin(b.mlp2, p + "W_mlp2", p + "b_mlp2", (d, c["d_mlp"]), (d,)))
            t.update(_lin(b.norm2, p + "gamma2", p + "beta2", (d,), (d,)))
        t.update(_lin(self.W_f, "W_f", "b_f", (df, d), (df,)))
        t.update(_lin(self.norm_f, "gamma", "beta", (df,), (df,)))
        if not self.tied:
            t["W_u"] = (lambda: self.unembed.weight, None, False, (V, df))
        if self.b_u is not None:
            t["b_u"] = (lambda: self.b_u, None, False, (V,))
        self._register(t)

    def hidden(self, x, segments=None):
        X = self.emb(x)
        if self.n_segments:
            X = X + self.seg(torch.zeros_like(x) if segments is None else segments)
        elif segments is not None:
            raise ValueError("segments given, but the model has no segment embeddings (n_segments = 0)")
        if self.norm_e is not None:
            X = self.norm_e(X)
        for b in self.layers:
            X = b(X, False)
        return X

    def forward(self, x, segments=None):
        X = self.norm_f(self.act(self.W_f(self.hidden(x, segments))))  # lines 10–11
        Z = X @ self.emb.tok.weight.T if self.tied else self.unembed(X)  # line 12 (logits)
        return Z + self.b_u if self.b_u is not None else Z

    def loss(self, x_tilde, x, segments=None):
        total = 0
        for gt, g, s in _groups(x_tilde, x, segments):
            Z = self(gt, s)
            m = gt == self.mask_token
            if m.any():
                total = total + F.cross_entropy(Z[m], g[m], reduction="sum")
        return total


class _EncoderDecoder(FTModule):
    """forward(z, x) -> logits (B, ℓ_x, N_V); loss(z, x) = Algorithm 11 line 5 (summed)."""

    def loss(self, z, x):
        total = 0
        for gz, gx in _groups(z, x):
            Zl = self(gz, gx)[:, :-1]
            total = total + F.cross_entropy(Zl.reshape(-1, Zl.shape[-1]), gx[:, 1:].reshape(-1), reduction="sum")
        return total


class TorchEDTransformer(_EncoderDecoder):
    """Algorithm 8 on torch.nn.TransformerEncoderLayer / TransformerDecoderLayer (post-LN: norm_first=False,
    ReLU, dropout 0, no final norms)."""

    def __init__(self, c):
        super().__init__()
        self.ft_config = dict(c)
        d, V, H = c["d_e"], c["n_vocab"], c["H"]
        kw = dict(d_model=d, nhead=H, dim_feedforward=c["d_mlp"], dropout=0.0, activation="relu",
                  layer_norm_eps=c["eps"], batch_first=True, norm_first=False)
        self.emb = _Embeddings(c)
        self.enc = nn.ModuleList(nn.TransformerEncoderLayer(**kw) for _ in range(c["L_enc"]))
        self.dec = nn.ModuleList(nn.TransformerDecoderLayer(**kw) for _ in range(c["L_dec"]))
        self.tied = c["tied"]
        if not self.tied:
            self.unembed = nn.Linear(d, V, bias=False)
        t = self.emb.table(c)
        dh = d // H

        def mha(prefix, m):
            out = {}
            for i, n in enumerate("qkv"):
                sl = slice(i * d, (i + 1) * d)
                out[prefix + "W_" + n] = (lambda m=m: m.in_proj_weight, sl, False, (H, dh, d))
                out[prefix + "b_" + n] = (lambda m=m: m.in_proj_bias, sl, False, (H, dh))
            out.update(_lin(m.out_proj, prefix + "W_o", prefix + "b_o", (d, d), (d,)))
            return out

        for l, b in enumerate(self.enc):
            p = f"enc.{l}."
            t.update(mha(p + "attn.", b.self_attn))
            t.update(_lin(b.norm1, p + "gamma1", p + "beta1", (d,), (d,)))
            t.update(_lin(b.linear1, p + "W_mlp1", p + "b_mlp1", (c["d_mlp"], d), (c["d_mlp"],)))
            t.update(_lin(b.linear2, p + "W_mlp2", p + "b_mlp2", (d, c["d_mlp"]), (d,)))
            t.update(_lin(b.norm2, p + "gamma2", p + "beta2", (d,), (d,)))
        for l, b in enumerate(self.dec):
            p = f"dec.{l}."
            t.update(mha(p + "attn.", b.self_attn))
            t.update(_lin(b.norm1, p + "gamma3", p + "beta3", (d,), (d,)))
            t.update(mha(p + "cross_attn.", b.multihead_attn))
            t.update(_lin(b.norm2, p + "gamma4", p + "beta4", (d,), (d,)))
            t.update(_lin(b.linear1, p + "W_mlp3", p + "b_mlp3", (c["d_mlp"], d), (c["d_mlp"],)))
            t.update(_lin(b.linear2, p + "W_mlp4", p + "b_mlp4", (d, c["d_mlp"]), (d,)))
            t.update(_lin(b.norm3, p + "gamma5", p + "beta5", (d,), (d,)))
        if not self.tied:
            t["W_u"] = (lambda: self.unembed.weight, None, False, (V, d))
        self._register(t)

    def forward(self, z, x):
        Z = self.emb(z)
        for b in self.enc:  # lines 4–9
            Z = b(Z)
        X = self.emb(x)
        causal = nn.Transformer.generate_square_subsequent_mask(x.shape[1], dtype=X.dtype)
        for b in self.dec:  # lines 13–20
            X = b(X, Z, tgt_mask=causal, tgt_is_causal=True)
        return X @ self.emb.tok.weight.T if self.tied else self.unembed(X)  # line 21 (logits)


class TorchT5(_EncoderDecoder):
    """An EDTransformer with T5's options (V11 relative position bias, V18: block="pre_ln", norm="rms", bias=False,
    scale_scores=False, mlp="relu"|"geglu", unembed_rescale) as transformers' own T5ForConditionalGeneration,
    the model ft.to_hf makes (dropout 0); its tensors under ft's names through hf/t5.py's name table."""

    def __init__(self, c, hf):
        super().__init__()
        self.ft_config = dict(c)
        self.hf = hf
        t = {}
        for hf_name, ft_name, heads in _hf_t5.tensor_table(c, True):
            s = tuple(hf.get_parameter(hf_name).shape)  # "T": W_e = shared.weightᵀ; "H": heads stacked in the rows
            shape = s[::-1] if heads == "T" else (c["H"], s[0] // c["H"], s[1]) if heads else s
            t[ft_name] = (lambda n=hf_name: self.hf.get_parameter(n), None, heads == "T", shape)
        self._register(t)

    def forward(self, z, x):
        return self.hf(input_ids=z, decoder_input_ids=x).logits  # Algorithm 8 with V11, V18; line 21's logits


_CLASSES = {"DTransformer": TorchDTransformer, "ETransformer": TorchETransformer, "EDTransformer": TorchEDTransformer}


# Algorithm 8's values of the options T5 changes (V18; V11 is positional="relative"): an EDTransformer with any
# other value runs as T5
_T5_OFF = {"block": "post_ln", "norm": "layer", "scale_scores": True, "mlp": "relu", "unembed_rescale": False,
           "bias": True}


# V22's options (BART): an EDTransformer with any of them on has no module here
_BART_ON = ("embed_norm", "unembed_bias", "scale_embedding", "separate_positions", "forced_bos_id", "forced_eos")


def _t5_module(model, cfg, t5) -> TorchT5:
    try:
        hf = _hf_registry.hf_model(*_hf_t5.T5().export(cfg, {k: np.asarray(v) for k, v in model.params.items()}))
    except ValueError as e:
        raise ValueError(f"ft.to_torch: an EDTransformer with {', '.join(t5)} (beyond Algorithm 8) runs as "
                         f"transformers' T5ForConditionalGeneration: {e}") from None
    return TorchT5(cfg, hf)


# the options the modules map (every other option must be at the core's default); bos_id, eos_id: where
# EDInference starts and stops, not part of forward or loss (kept in ft_config)
_MAPS = frozenset({"n_vocab", "l_max", "L", "L_enc", "L_dec", "H", "d_e", "d_mlp", "d_f", "d_attn", "d_mid", "H_kv",
                   "norm", "positional", "base", "tied", "gelu", "eps", "seed", "init_std", "n_segments", "embed_norm",
                   "unembed_bias", "attention_impl", "bos_id", "eos_id"})


def from_ft(model) -> FTModule:
    arch = type(model).__name__
    if arch not in _CLASSES or not hasattr(model, "config"):
        raise TypeError(f"ft.to_torch takes a DTransformer, ETransformer or EDTransformer, got {type(model).__name__}")
    cfg = dict(model.config)
    if arch == "EDTransformer":
        bart = [f"{k}={cfg[k]!r}" for k in _BART_ON if cfg.get(k) not in (None, False)]
        bart += ["mlp='gelu'"] if cfg.get("mlp") == "gelu" else []
        if bart:  # V22: none of torch's layers nor T5 has them (embed_norm, unembed_bias are mapped for ETransformer)
            raise ValueError(f"ft.to_torch (this version) has no equivalent of {bart[0]} in an EDTransformer (BART's "
                             "options, docs/variants.md V22): ft.to_hf gives transformers' BartForConditionalGeneration")
        t5 = [f"{k}={cfg[k]!r}" for k, v in _T5_OFF.items() if cfg.get(k, v) != v]
        t5 += ["positional='relative'"] if cfg.get("positional") == "relative" else []
        if t5:
            return _t5_module(model, cfg, t5)
    check_unmapped_at_defaults(cfg, _MAPS, "ft.to_torch (this version)")
    if cfg.get("H_kv") not in (None, cfg["H"]):
        raise ValueError(f"ft.to_torch (this version) has no equivalent of the option H_kv={cfg['H_kv']!r} "
                         "(grouped-query attention)")
    if _core._position_table(cfg["positional"]) == "none":  # (the position in attention: the registry's line says)
        raise ValueError(f"ft.to_torch (this version) does not support positional={cfg.get('positional')!r}")
    if cfg.get("norm", "layer") not in ("layer", "rms"):
        raise ValueError(f"ft.to_torch (this version) does not support norm={cfg.get('norm')!r}")
    if arch == "EDTransformer" and (cfg["d_attn"] * cfg["H"] != cfg["d_e"] or cfg["d_mid"] * cfg["H"] != cfg["d_e"]):
        raise ValueError("ft.to_torch builds EDTransformer on torch.nn.Transformer layers, which need "
                         f"d_attn = d_mid = d_e / H; got d_attn={cfg['d_attn']}, d_mid={cfg['d_mid']}")
    dt = getattr(torch, cfg["dtype"])
    module = _CLASSES[arch](cfg).to(dt)
    module.load_ft_params(model.params)
    if cfg.get("positional") != "learned":
        module.emb.pos_fixed.requires_grad_(False)
    return module
