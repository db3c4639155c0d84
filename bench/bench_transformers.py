"""Benchmark (not a test): one training step of Algorithm 10 (DTransformer, GPT-2's pre-LN decoder) —
forward + backward + Adam(W) step — formal-transformers vs an equivalent PyTorch model, same run, float32.

Shapes:
  * baby GPT (nanoGPT's CPU shakespeare_char config): N_V 65, ℓ 64, L 4, H 4, d_e 128, d_mlp 512, batch 12;
  * --large adds a GPT-2-small shape: N_V 50257, ℓ_max 1024, ℓ 64, L 12, H 12, d_e 768, d_mlp 3072, batch 4
    (fewer repetitions).
Ours:   model.loss_and_grad(batch, copy=False); opt.step(model, model.grads)   with ft.Adam(lr, weight_decay=0.1)
        (copy=False: the gradient stays in model.grads, as PyTorch's .grad; no 650 MB copy per step at GPT-2 size)
PyTorch: an nn.Module written here with the same parameters (pre-LN blocks: LayerNorm, fused qkv Linear with
  bias, causal scaled-dot-product attention, output Linear, LayerNorm, Linear-GELU(exact)-Linear; final
  LayerNorm; untied Linear unembedding unless --tied), loss = summed next-token cross-entropy (the listing's
  sum, Alg 13 line 5), loss.backward(), torch.optim.AdamW(lr, weight_decay=0.1), zero_grad(set_to_none=True).
Both use the same number of threads (ft.get_num_threads(), or --threads n for both). Before timing, our
parameters are copied into the PyTorch model and the two losses are compared (they must agree to float32
accuracy, else the comparison would be meaningless). Reported: median ms/step over --reps timed steps after
--warmup steps (steps of the two alternate, so machine noise hits both alike), tokens/s, and the ratio.

    FT_CORE_PATH=build/archtest PYTHONPATH=python python bench/bench_transformers.py [--reps 10] [--large]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import formal_transformers as ft

BABY = dict(name="baby GPT", n_vocab=65, l_max=64, l=64, L=4, H=4, d_e=128, d_mlp=512, batch=12)
GPT2 = dict(name="GPT-2 small", n_vocab=50257, l_max=1024, l=64, L=12, H=12, d_e=768, d_mlp=3072, batch=4)


def torch_gpt(torch, cfg, tied):
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            d = cfg["d_e"]
            self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-5), nn.LayerNorm(d, eps=1e-5)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, cfg["d_mlp"]), nn.Linear(cfg["d_mlp"], d)

        def forward(self, x):  # x: (B, ℓ, d_e), a row per token
            B, T, d = x.shape
            H = cfg["H"]
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            q, k, v = (a.view(B, T, H, d // H).transpose(1, 2) for a in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # scale 1/√d_attn
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(cfg["n_vocab"], cfg["d_e"])
            self.wpe = nn.Embedding(cfg["l_max"], cfg["d_e"])
            self.blocks = nn.ModuleList(Block() for _ in range(cfg["L"]))
            self.ln_f = nn.LayerNorm(cfg["d_e"], eps=1e-5)
            self.lm_head = nn.Linear(cfg["d_e"], cfg["n_vocab"], bias=False)
            if tied:
                self.lm_head.weight = self.wte.weight

        def loss(self, idx):
            T = idx.shape[1]
            x = self.wte(idx) + self.wpe(torch.arange(T))
            for b in self.blocks:
                x = b(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1),
                                   reduction="sum")

    return GPT()


def copy_ours_into_torch(torch, model, tm, cfg, tied):
    """Our θ (column convention, stacked heads) into the row-per-token torch modules."""
    P = {k: np.asarray(v) for k, v in model.params.items()}
    d = cfg["d_e"]
    with torch.no_grad():
        tm.wte.weight.copy_(torch.from_numpy(P["W_e"].T.copy()))
        tm.wpe.weight.copy_(torch.from_numpy(P["W_p"].T.copy()))
        if not tied:
            tm.lm_head.weight.copy_(torch.from_numpy(P["W_u"].copy()))
        for l, b in enumerate(tm.blocks):
            p = f"layers.{l}."
            a = p + "attn."
            b.qkv.weight.copy_(torch.from_numpy(np.concatenate(
                [P[a + w].reshape(-1, d) for w in ("W_q", "W_k", "W_v")], axis=0)))
            b.qkv.bias.copy_(torch.from_numpy(np.concatenate([P[a + w].reshape(-1) for w in ("b_q", "b_k", "b_v")])))
            b.proj.weight.copy_(torch.from_numpy(P[a + "W_o"].copy()))
            b.proj.bias.copy_(torch.from_numpy(P[a + "b_o"].copy()))
            b.ln1.weight.copy_(torch.from_numpy(P[p + "gamma1"].copy()))
            b.ln1.bias.copy_(torch.from_numpy(P[p + "beta1"].copy()))
            b.ln2.weight.copy_(torch.from_numpy(P[p + "gamma2"].copy()))
            b.ln2.bias.copy_(torch.from_numpy(P[p + "beta2"].copy()))
            b.fc1.weight.copy_(torch.from_numpy(P[p + "W_mlp1"].copy()))
            b.fc1.bias.copy_(torch.from_numpy(P[p + "b_mlp1"].copy()))
            b.fc2.weight.copy_(torch.from_numpy(P[p + "W_mlp2"].copy()))
            b.fc2.bias.copy_(torch.from_numpy(P[p + "b_mlp2"].copy()))
        tm.ln_f.weight.copy_(torch.from_numpy(P["gamma"].copy()))
        tm.ln_f.bias.copy_(torch.from_numpy(P["beta"].copy()))


def bench(cfg, reps, warmup, tied, lr=3e-4):
    import torch

    n_threads = ft.get_num_threads()
    torch.set_num_threads(n_threads)
    rng = np.random.default_rng(0)
    batch = rng.integers(0, cfg["n_vocab"], (cfg["batch"], cfg["l"]))

    model = ft.DTransformer(cfg["n_vocab"], cfg["l_max"], cfg["L"], cfg["H"], cfg["d_e"], cfg["d_mlp"],
                            tied=tied, dtype="float32", seed=0)
    opt = ft.Adam(lr, weight_decay=0.1)
    torch.manual_seed(0)
    tm = torch_gpt(torch, cfg, tied)
    copy_ours_into_torch(torch, model, tm, cfg, tied)
    topt = torch.optim.AdamW(tm.parameters(), lr=lr, weight_decay=0.1)
    idx = torch.from_numpy(batch.astype(np.int64))

    ours_loss = model.loss(batch)
    with torch.no_grad():
        torch_loss = float(tm.loss(idx))
    agree = abs(ours_loss - torch_loss) / abs(torch_loss)
    n_params = sum(int(np.asarray(v).size) for k, v in model.params.items() if not (tied and k == "W_u"))

    def ours_step():
        model.loss_and_grad(batch, copy=False)
        opt.step(model, model.grads)

    def torch_step():
        loss = tm.loss(idx)
        loss.backward()
        topt.step()
        topt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        ours_step()
        torch_step()
    t_ours, t_torch = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        ours_step()
        t_ours.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        torch_step()
        t_torch.append(time.perf_counter() - t0)
    mo, mt = statistics.median(t_ours), statistics.median(t_torch)
    tokens = cfg["batch"] * cfg["l"]
    print(f"\n{cfg['name']}: N_V {cfg['n_vocab']}, ℓ {cfg['l']}, L {cfg['L']}, H {cfg['H']}, d_e {cfg['d_e']}, "
          f"d_mlp {cfg['d_mlp']}, batch {cfg['batch']}, {'tied' if tied else 'untied'}, {n_params / 1e6:.2f}M params, "
          f"float32, {n_threads} threads, median of {reps} steps after {warmup} warm-up")
    print(f"  initial loss (sum over {cfg['batch'] * (cfg['l'] - 1)} tokens): ours {ours_loss:.6f}, "
          f"torch {torch_loss:.6f}, rel diff {agree:.2e}" + ("" if agree < 1e-4 else "   <-- MODELS DISAGREE"))
    print(f"  {'':20s}{'ms/step':>10s}{'min ms':>10s}{'tokens/s':>12s}")
    print(f"  {'formal-transformers':20s}{1e3 * mo:10.1f}{1e3 * min(t_ours):10.1f}{tokens / mo:12.0f}")
    print(f"  {'PyTorch':20s}{1e3 * mt:10.1f}{1e3 * min(t_torch):10.1f}{tokens / mt:12.0f}")
    print(f"  speed ratio PyTorch/ours: {mt / mo:.2f}x  ({'ours faster' if mo < mt else 'PyTorch faster'})")
    return mo, mt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=10, help="timed steps per implementation (≥5)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--large", action="store_true", help="also the GPT-2-small shape (slow, ~4 GB of memory)")
    ap.add_argument("--large-reps", type=int, default=5)
    ap.add_argument("--tied", action="store_true", help="W_u = W_eᵀ in both models (as nanoGPT/GPT-2 do)")
    ap.add_argument("--threads", type=int, default=None, help="threads for both (default: ft.get_num_threads())")
    args = ap.parse_args()
    if args.reps < 5 or args.large_reps < 5:
        ap.error("use at least 5 timed repetitions")
    if args.threads:
        ft.set_num_threads(args.threads)
    print(f"formal-transformers {ft.__version__}; " + (ft.blas_info() if callable(getattr(ft, "blas_info", None))
                                                       else ""))
    bench(BABY, args.reps, args.warmup, args.tied)
    if args.large:
        bench(GPT2, args.large_reps, 1, args.tied)


if __name__ == "__main__":
    main()
