"""Benchmark (not a test): one training step of Algorithm 10 (DTransformer, GPT-2's pre-LN decoder) —
forward + backward + Adam(W) step — formal-transformers vs an equivalent PyTorch model, float32, as a user
sees them: each implementation in its own process.

Why processes: PyTorch bundles its own OpenMP runtime (libgomp) and our core links the system's; two OpenMP
pools in one process spin against each other and distort both. So this script (the parent, which imports
neither the core's pool nor torch's) starts persistent workers, each a subprocess of this same file:
  * ours           formal-transformers (its own default thread policy, the parent's environment);
  * torch passive  PyTorch with OMP_WAIT_POLICY=passive (its best setting on a shared machine);
  * torch default  PyTorch with the default environment (OMP_WAIT_POLICY / GOMP_SPINCOUNT removed);
  * gemm           our _core._gemm of two 2048×2048 float32 matrices: the machine's gemm peak in this run.
Every worker uses the same number of threads (--threads, default ft.get_num_threads()). After each worker's
set-up and warm-up, rounds are interleaved (ours, torch passive, torch default, gemm, ours, ...), each round
--steps timed steps, with a --pause between rounds so that one worker's idle threads have stopped spinning
before the next runs; machine noise thus hits every side alike. Reported: the median over all timed steps
per side, ms/step, tokens/s, and the ratios PyTorch/ours (> 1: ours faster).

Shapes:
  * baby GPT (nanoGPT's CPU shakespeare_char config): N_V 65, ℓ 64, L 4, H 4, d_e 128, d_mlp 512, batch 12;
  * --large adds GPT-2 small: N_V 50257, ℓ_max 1024, ℓ 64, L 12, H 12, d_e 768, d_mlp 3072, batch 4.
Ours:   model.loss_and_grad(batch, copy=False); opt.step(model, model.grads)   with ft.Adam(lr, weight_decay=0.1)
        (copy=False: the gradient stays in model.grads, as PyTorch's .grad; no 650 MB copy per step at GPT-2 size)
PyTorch: an nn.Module written here with the same parameters (pre-LN blocks: LayerNorm, fused qkv Linear with
  bias, causal scaled-dot-product attention, output Linear, LayerNorm, Linear-GELU(exact)-Linear; final
  LayerNorm; untied Linear unembedding unless --tied), loss = summed next-token cross-entropy (the listing's
  sum, Alg 13 line 5), loss.backward(), torch.optim.AdamW(lr, weight_decay=0.1), zero_grad(set_to_none=True).
Same weights: our worker initialises the model, writes θ and the batch to an .npz in a temporary directory,
and the torch workers (which never import formal_transformers) load it; before any step, each worker
computes the initial loss and the parent checks that they agree to float32 accuracy (else the comparison
would be meaningless).

Flops of one step, counted for our GFLOP/s (a multiply-add = 2 flops; embeddings, biases, norms, softmax,
GELU and Adam are not counted; attention is counted for full ℓ×ℓ blocks, the causal mask's zeros included):
    forward  = 2 · P_mm · B·ℓ  +  L · B · 2·2·ℓ²·d_e
               P_mm = L·(4·d_e² + 2·d_e·d_mlp) + N_V·d_e  (the weights used in products: W_q, W_k, W_v, W_o,
               W_mlp1, W_mlp2 per layer, and the unembedding W_u — also when tied);  2·2·ℓ²·d_e per layer and
               sequence is attention's two products QᵀK and V·softmax over all H heads (H·d_attn = d_e);
    backward = 2 · forward   (a gradient for each product's two operands);   step = 3 · forward.
The share of peak is that GFLOP/s over the gemm worker's median GFLOP/s (2·2048³ flops per product).

    python bench/bench_transformers.py [--threads N] [--rounds 7] [--steps 3] [--large] [--tied]
    python bench/bench_transformers.py --variant llama [--tied]   # the LLaMA-style baby (docs/variants.md)

--variant llama: the LLaMA-style baby model of notebooks/09_variants (RoPE, H_kv 2 of H 4, RMSnorm, SwiGLU with
d_mlp 392, no biases; 0.2% fewer parameters than the baby GPT) against an equivalent PyTorch module (RMSnorm,
bias-free q/k/v/o Linear with H_kv key/value heads, half-split RoPE on q and k, causal scaled-dot-product attention
with enable_gqa, SiLU-gated MLP), with a fifth worker running OUR GPT-2-style baby GPT in the same rounds, so the
two architectures are compared in one run. Flops: P_mm = L·(2·d_e² + 2·d_e²·H_kv/H + 3·d_e·d_mlp) + N_V·d_e.
    python bench/bench_transformers.py --inprocess ours --iters 200     # one side, flat out, in this process
                                                                          (for perf/py-spy; also torch, gemm)
(with the package importable: installed, or PYTHONPATH=python FT_CORE_PATH=build/<dir> in a checkout).

    python bench/bench_transformers.py --dropout 0.1     # the cost of dropout per training step
    python bench/bench_transformers.py --bf16 [--large]  # mixed precision: ours bf16-mixed vs PyTorch autocast

--bf16 (docs/design.md "Mixed precision"): ours with precision="bf16-mixed" (bf16 products, float32 accumulation
and master weights) against PyTorch under torch.autocast("cpu", dtype=torch.bfloat16) — eager and torch.compile
(inductor), both OMP_WAIT_POLICY=passive — with ours in float32 and the gemm rates (float32 and bf16, through our
_gemm: the limit of the products) in the same rounds. The CPU's bf16 features (AVX512_BF16, AMX) are printed.

--dropout p (docs/regularisation.md): ours and both PyTorch workers drop at rate p at GPT-2's places (after the
embedding sum, on the attention weights — PyTorch: scaled_dot_product_attention's dropout_p —, on each
sublayer's output before the residual add); two more workers run ours and PyTorch (passive) WITHOUT dropout in
the same rounds, and the cost of dropout per step is reported for each (ms and %). The initial losses are
compared in evaluation (no dropout).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from _common import PEAK_N, GemmSide, WorkerProcess, cpu_model, import_ft, serve_steps

BABY = dict(name="baby GPT", n_vocab=65, l_max=64, l=64, L=4, H=4, d_e=128, d_mlp=512, batch=12)
GPT2 = dict(name="GPT-2 small", n_vocab=50257, l_max=1024, l=64, L=12, H=12, d_e=768, d_mlp=3072, batch=4)
LLAMA = dict(name="LLaMA-style baby", n_vocab=65, l_max=64, l=64, L=4, H=4, d_e=128, d_mlp=392, batch=12,
             variant=dict(positional="rope", H_kv=2, mlp="swiglu", bias=False, norm="rms"))
SHAPES = {"baby": BABY, "gpt2": GPT2, "llama": LLAMA}


def cpu_bf16() -> str:
    """The CPU's bf16 features as the kernel reports them (/proc/cpuinfo flags)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    except OSError:
        return "unknown"
    have = [n for n, flag in (("AVX512_BF16", "avx512_bf16"), ("AMX-BF16", "amx_bf16")) if flag in flags]
    return ", ".join(have) if have else "none (bf16-mixed runs emulated: float32 products of rounded operands)"


def step_flops(cfg) -> float:
    """Flops of one training step (the module docstring's formula)."""
    L, d, dm, l, B = cfg["L"], cfg["d_e"], cfg["d_mlp"], cfg["l"], cfg["batch"]
    p_mm = L * (4 * d * d + 2 * d * dm) + cfg["n_vocab"] * d
    if "variant" in cfg:  # GQA: W_k, W_v have H_kv/H of the rows; SwiGLU: three d_e×d_mlp matrices
        kv = cfg["variant"]["H_kv"] / cfg["H"]
        p_mm = L * (2 * d * d + 2 * d * d * kv + 3 * d * dm) + cfg["n_vocab"] * d
    forward = 2.0 * p_mm * B * l + L * B * 2 * 2 * l * l * d
    return 3.0 * forward


def next_token_loss(F, logits, idx):
    """The summed cross-entropy of each token's prediction of the next (the core's reduction="sum" loss)."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1), reduction="sum")


def torch_gpt(torch, cfg, tied):
    nn, F = torch.nn, torch.nn.functional
    p_drop = cfg.get("dropout", 0.0)

    def drop(x, training):  # --dropout: GPT-2's resid_pdrop / embd_pdrop (none at rate 0)
        return F.dropout(x, p_drop, training) if p_drop > 0 else x

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
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True,  # scale 1/√d_attn
                                               dropout_p=p_drop if self.training else 0.0)
            x = x + drop(self.proj(y.transpose(1, 2).reshape(B, T, d)), self.training)
            return x + drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))), self.training)

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
            x = drop(self.wte(idx) + self.wpe(torch.arange(T)), self.training)
            for b in self.blocks:
                x = b(x)
            logits = self.lm_head(self.ln_f(x))
            return next_token_loss(F, logits, idx)

    return GPT()


def torch_llama(torch, cfg, tied):
    """The LLaMA-style decoder of docs/variants.md V6 as a row-per-token torch module."""
    nn, F = torch.nn, torch.nn.functional
    d, H, H_kv, dm = cfg["d_e"], cfg["H"], cfg["variant"]["H_kv"], cfg["d_mlp"]
    dh = d // H

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight

    inv = 1.0 / (10000.0 ** (torch.arange(0, dh, 2, dtype=torch.float64) / dh))
    ang = torch.outer(torch.arange(cfg["l_max"], dtype=torch.float64), inv)
    cos_t, sin_t = torch.cat([ang.cos(), ang.cos()], -1).float(), torch.cat([ang.sin(), ang.sin()], -1).float()

    def rope(x):  # x: (B, heads, T, dh)
        T = x.shape[2]
        rot = torch.cat([-x[..., dh // 2:], x[..., : dh // 2]], dim=-1)
        return x * cos_t[:T] + rot * sin_t[:T]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = RMSNorm(), RMSNorm()
            self.q = nn.Linear(d, H * dh, bias=False)
            self.k, self.v = nn.Linear(d, H_kv * dh, bias=False), nn.Linear(d, H_kv * dh, bias=False)
            self.o = nn.Linear(H * dh, d, bias=False)
            self.gate, self.up = nn.Linear(d, dm, bias=False), nn.Linear(d, dm, bias=False)
            self.down = nn.Linear(dm, d, bias=False)

        def forward(self, x):
            B, T, _ = x.shape
            h = self.n1(x)
            q = rope(self.q(h).view(B, T, H, dh).transpose(1, 2))
            k = rope(self.k(h).view(B, T, H_kv, dh).transpose(1, 2))
            v = self.v(h).view(B, T, H_kv, dh).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + self.o(y.transpose(1, 2).reshape(B, T, d))
            h = self.n2(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(cfg["n_vocab"], d)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg["L"]))
            self.norm = RMSNorm()
            self.lm_head = nn.Linear(d, cfg["n_vocab"], bias=False)
            if tied:
                self.lm_head.weight = self.wte.weight

        def loss(self, idx):
            x = self.wte(idx)
            for b in self.blocks:
                x = b(x)
            logits = self.lm_head(self.norm(x))
            return next_token_loss(F, logits, idx)

    return Llama()


def load_ours_into_torch_llama(torch, P, tm, cfg, tied):
    d = cfg["d_e"]
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    with torch.no_grad():
        tm.wte.weight.copy_(t(P["W_e"].T))
        if not tied:
            tm.lm_head.weight.copy_(t(P["W_u"]))
        for l, b in enumerate(tm.blocks):
            p = f"layers.{l}."
            a = p + "attn."
            b.q.weight.copy_(t(P[a + "W_q"].reshape(-1, d)))
            b.k.weight.copy_(t(P[a + "W_k"].reshape(-1, d)))
            b.v.weight.copy_(t(P[a + "W_v"].reshape(-1, d)))
            b.o.weight.copy_(t(P[a + "W_o"]))
            b.gate.weight.copy_(t(P[p + "W_gate"]))
            b.up.weight.copy_(t(P[p + "W_mlp1"]))
            b.down.weight.copy_(t(P[p + "W_mlp2"]))
            b.n1.weight.copy_(t(P[p + "gamma1"]))
            b.n2.weight.copy_(t(P[p + "gamma2"]))
        tm.norm.weight.copy_(t(P["gamma"]))


def load_ours_into_torch(torch, P, tm, cfg, tied):
    """Our θ (column convention, stacked heads; numpy arrays by our names) into the row-per-token torch modules."""
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


def copy_ours_into_torch(torch, model, tm, cfg, tied):
    """The same from a live ft model (for bench_inference.py, where both run in one process)."""
    load_ours_into_torch(torch, {k: np.asarray(v) for k, v in model.params.items()}, tm, cfg, tied)


# ---------------------------------------------------------------------------------------------------------
# The sides. Each is built in the process that runs it; .step() is one timed unit; .info describes it.

class OursSide:
    def __init__(self, cfg, threads, tied, wdir, lr=3e-4):
        ft = import_ft(threads)
        rng = np.random.default_rng(0)
        self.batch = rng.integers(0, cfg["n_vocab"], (cfg["batch"], cfg["l"]))
        self.model = ft.DTransformer(cfg["n_vocab"], cfg["l_max"], cfg["L"], cfg["H"], cfg["d_e"], cfg["d_mlp"],
                                     tied=tied, dtype="float32", seed=0, **cfg.get("variant", {}),
                                     **({"dropout": cfg["dropout"]} if cfg.get("dropout") else {}),
                                     precision=cfg.get("precision", "float32"))
        self.opt = ft.Adam(lr, weight_decay=0.1)
        P = {k: np.asarray(v) for k, v in self.model.params.items()}
        if wdir:
            # atomically: two of our workers (bf16-mixed and float32) write the same θ while PyTorch's read it
            tmp = os.path.join(wdir, f"theta.{os.getpid()}.tmp")
            with open(tmp, "wb") as f:
                np.savez(f, __batch__=self.batch, **P)
            os.replace(tmp, os.path.join(wdir, "theta.npz"))
        self.loss = float(self.model.loss(self.batch))
        self.info = dict(version=ft.__version__, blas=ft.blas_info(), threads=ft.get_num_threads(),
                         params=sum(int(v.size) for k, v in P.items() if not (tied and k == "W_u")),
                         omp_wait_policy=os.environ.get("OMP_WAIT_POLICY", "unset (ours: spin 1000, then sleep)"))

    def step(self):
        self.model.loss_and_grad(self.batch, copy=False)
        self.opt.step(self.model, self.model.grads)


class TorchSide:
    def __init__(self, cfg, threads, tied, wdir, lr=3e-4):
        assert "formal_transformers" not in sys.modules
        import torch

        if threads:
            torch.set_num_threads(threads)
        torch.manual_seed(0)
        self.tm = (torch_llama if "variant" in cfg else torch_gpt)(torch, cfg, tied)
        if wdir:
            with np.load(os.path.join(wdir, "theta.npz")) as z:
                P = {k: z[k] for k in z.files}
            batch = P.pop("__batch__")
            (load_ours_into_torch_llama if "variant" in cfg else load_ours_into_torch)(torch, P, self.tm, cfg, tied)
        else:  # alone (--inprocess): torch's own initialisation
            batch = np.random.default_rng(0).integers(0, cfg["n_vocab"], (cfg["batch"], cfg["l"]))
        self.idx = torch.from_numpy(batch.astype(np.int64))
        self.opt = torch.optim.AdamW(self.tm.parameters(), lr=lr, weight_decay=0.1)
        # --bf16: the forward under autocast (bf16 products, float32 weights), optionally compiled
        self.autocast = cfg.get("autocast", False)
        self.fn = torch.compile(self.tm.loss) if cfg.get("compile") else self.tm.loss
        self.ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if self.autocast else None
        with torch.no_grad():
            self.tm.eval()  # the initial loss without dropout (ours: model.loss never drops)
            self.loss = float(self.tm.loss(self.idx))
            self.tm.train()
        self.info = dict(version=torch.__version__, threads=torch.get_num_threads(),
                         omp_wait_policy=os.environ.get("OMP_WAIT_POLICY", "unset"))

    def step(self):
        if self.ctx is not None:
            with self.ctx():
                loss = self.fn(self.idx)
        else:
            loss = self.fn(self.idx)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


class GemmBf16Side(GemmSide):
    """The same product with precision="bf16-mixed": the bf16 gemm rate of this CPU (oneDNN where it has bf16)."""

    def __init__(self, threads=0):
        super().__init__(threads)
        import formal_transformers as ft

        self.info["bf16"] = ft.bf16_info()

    def step(self):
        self.gemm(self.A, self.B, precision="bf16-mixed")


SIDES = {"ours": OursSide, "torch": TorchSide,
         "gemm": lambda cfg, threads, tied, wdir: GemmSide(threads),
         "gemm-bf16": lambda cfg, threads, tied, wdir: GemmBf16Side(threads)}


def run_worker(args) -> None:
    """A persistent worker: build the side, warm up, answer `run k` with k step times, until `quit`.
    The protocol uses a private copy of stdout; fd 1 goes to stderr, so nothing else printed can corrupt it."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    cfg = dict(SHAPES[args.shape], dropout=args.dropout, precision=args.precision, autocast=args.autocast,
               compile=args.compile)
    t0 = time.perf_counter()
    side = SIDES[args.worker](cfg, args.threads, args.tied, args.wdir)
    loss = side.loss  # the initial loss, before any step changes θ
    for _ in range(args.warmup):
        side.step()
    proto.write("@@" + json.dumps(dict(loss=loss, info=side.info, setup_s=time.perf_counter() - t0)) + "\n")
    serve_steps(side.step, proto)


class Worker(WorkerProcess):
    def __init__(self, label, kind, args, shape, env_changes, wdir, threads, dropout=None, precision="float32",
                 autocast=False, compile_=False):
        warmup = args.large_warmup if shape == "gpt2" else args.warmup
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--shape", shape,
               "--threads", str(threads or 0), "--warmup", str(warmup + (2 if compile_ else 0)), "--wdir", wdir,
               "--dropout", str(args.dropout if dropout is None else dropout), "--precision", precision]
        if autocast:
            cmd.append("--autocast")
        if compile_:
            cmd.append("--compile")
        if args.tied:
            cmd.append("--tied")
        for opt in ("ell", "batch"):
            if getattr(args, opt):
                cmd += ["--" + opt, str(getattr(args, opt))]
        super().__init__(label, cmd, env_changes)
        self.kind, self.times, self.hello = kind, [], None

    def ready(self):
        if self.hello is None:
            self.hello = self.read()
        return self.hello

    def run(self, k):
        self.times += self.ask(f"run {k}")


def bench(cfg, shape, args, threads, rounds, steps):
    with tempfile.TemporaryDirectory(prefix="ft-bench-") as wdir:
        workers = []
        try:
            dl = f" (dropout {args.dropout})" if args.dropout else ""
            ours = Worker("formal-transformers" + dl, "ours", args, shape, {}, wdir, threads)
            workers.append(ours)
            hello = ours.ready()  # θ is on disk now; the torch workers may start
            threads = hello["info"]["threads"]
            workers.append(Worker("PyTorch (passive)" + dl, "torch", args, shape, {"OMP_WAIT_POLICY": "passive"}, wdir,
                                  threads))
            workers.append(Worker("PyTorch (default)" + dl, "torch", args, shape,
                                  {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": None}, wdir, threads))
            workers.append(Worker(f"gemm {PEAK_N}³ (ours)", "gemm", args, shape, {}, wdir, threads))
            if shape == "llama":  # our GPT-2-style baby GPT in the same rounds (its own directory for its θ)
                os.mkdir(os.path.join(wdir, "baby"))
                workers.append(Worker("ft GPT-2-style baby", "ours", args, "baby", {}, os.path.join(wdir, "baby"),
                                      threads))
            if args.dropout:  # ours and PyTorch without dropout, same θ, same rounds: the cost of dropout
                os.mkdir(os.path.join(wdir, "nodrop"))
                workers.append(Worker("formal-transformers (no dropout)", "ours", args, shape, {},
                                      os.path.join(wdir, "nodrop"), threads, dropout=0.0))
                workers[-1].ready()  # its θ (the same: seed 0) on disk before its torch twin reads it
                workers.append(Worker("PyTorch (passive, no dropout)", "torch", args, shape, {"OMP_WAIT_POLICY": "passive"},
                                      os.path.join(wdir, "nodrop"), threads, dropout=0.0))
            for w in workers:
                w.ready()
            for _ in range(rounds):  # A B C D A B C D ...
                for w in workers:
                    time.sleep(args.pause)
                    w.run(steps if w.kind != "gemm" else args.gemm_steps)
        finally:
            for w in workers:
                w.close()

    info = ours.hello["info"]
    tokens = cfg["batch"] * cfg["l"]
    flops = step_flops(cfg)
    tied = "tied" if args.tied else "untied"
    print(f"\n{cfg['name']}: N_V {cfg['n_vocab']}, ℓ {cfg['l']}, L {cfg['L']}, H {cfg['H']}, d_e {cfg['d_e']}, "
          f"d_mlp {cfg['d_mlp']}, batch {cfg['batch']}, {tied}, {info['params'] / 1e6:.2f}M params, float32, "
          f"{threads} threads each")
    print(f"  formal-transformers {info['version']}, BLAS: {info['blas']}; PyTorch {workers[1].hello['info']['version']}")
    print(f"  {rounds} interleaved rounds × {steps} timed steps per side ({args.gemm_steps} products for gemm), "
          f"after {args.large_warmup if shape == 'gpt2' else args.warmup} warm-up steps, {args.pause} s pause before each round; medians")
    l0 = ours.hello["loss"]
    agree = True
    parts = []
    for w in workers[1:3]:
        rel = abs(w.hello["loss"] - l0) / abs(w.hello["loss"])
        agree &= rel < 1e-4
        parts.append(f"{w.label} {w.hello['loss']:.6f} (rel diff {rel:.1e})")
    print(f"  initial loss (sum over {cfg['batch'] * (cfg['l'] - 1)} tokens): ours {l0:.6f}, " + ", ".join(parts)
          + ("" if agree else "   <-- MODELS DISAGREE"))
    print(f"  {'':24s}{'ms/step':>10s}{'min ms':>10s}{'tokens/s':>11s}{'GFLOP/s':>10s}   OMP_WAIT_POLICY")
    med = {}
    for w in workers[:3]:
        m = med[w.label] = statistics.median(w.times)
        print(f"  {w.label:24s}{1e3 * m:10.1f}{1e3 * min(w.times):10.1f}{tokens / m:11.0f}{flops / m / 1e9:10.1f}"
              f"   {w.hello['info']['omp_wait_policy']}")
    g = workers[3]
    peak = 2.0 * PEAK_N**3 / statistics.median(g.times) / 1e9
    print(f"  {g.label:24s}{1e3 * statistics.median(g.times):10.1f}{'':21s}{peak:10.1f}   (the machine's gemm peak)")
    if shape == "llama":
        b = workers[4]
        mb = med[b.label] = statistics.median(b.times)
        print(f"  {b.label:24s}{1e3 * mb:10.1f}{1e3 * min(b.times):10.1f}{tokens / mb:11.0f}{step_flops(BABY) / mb / 1e9:10.1f}"
              f"   ({b.hello['info']['params']:,} params vs {info['params']:,}; same rounds)")
        print(f"  LLaMA-style / GPT-2-style step time (ours): {med[ours.label] / mb:.2f}")
    if args.dropout:
        for w, ref_w in ((workers[-2], ours), (workers[-1], workers[1])):
            m = med[w.label] = statistics.median(w.times)
            print(f"  {w.label:24s}{1e3 * m:10.1f}{1e3 * min(w.times):10.1f}{tokens / m:11.0f}{flops / m / 1e9:10.1f}")
        for name, with_d, without in (("ours", ours, workers[-2]), ("PyTorch (passive)", workers[1], workers[-1])):
            a, b = med[with_d.label], med[without.label]
            print(f"  cost of dropout {args.dropout} per step, {name}: {1e3 * (a - b):+.2f} ms ({100 * (a - b) / b:+.1f}%)")
    mo = med[ours.label]
    ratios = ", ".join(f"{w.label.split()[1].strip('()')} {med[w.label] / mo:.2f}x" for w in workers[1:3])
    print(f"  speed ratio PyTorch/ours: {ratios}   (> 1: ours faster)")
    print(f"  ours: {flops / 1e9:.2f} GFLOP per step (3 × forward, docstring) -> {flops / mo / 1e9:.1f} GFLOP/s = "
          f"{100 * flops / mo / 1e9 / peak:.0f}% of the gemm peak {peak:.1f} GFLOP/s")
    return med


def bench_bf16(cfg, shape, args, threads, rounds, steps):
    """--bf16: ours bf16-mixed vs PyTorch autocast bf16 (eager, compiled), with ours float32 and both gemm rates."""
    passive = {"OMP_WAIT_POLICY": "passive"}
    with tempfile.TemporaryDirectory(prefix="ft-bench-") as wdir:
        workers = []
        try:
            ours = Worker("ours bf16-mixed", "ours", args, shape, {}, wdir, threads, precision="bf16-mixed")
            workers.append(ours)
            hello = ours.ready()
            threads = hello["info"]["threads"]
            workers.append(Worker("ours float32", "ours", args, shape, {}, wdir, threads))
            workers.append(Worker("PyTorch autocast bf16", "torch", args, shape, passive, wdir, threads, autocast=True))
            workers.append(Worker("torch.compile autocast", "torch", args, shape,
                                  dict(passive, TORCHINDUCTOR_COMPILE_THREADS="1"), wdir, threads, autocast=True,
                                  compile_=True))
            workers.append(Worker(f"gemm {PEAK_N}³ float32", "gemm", args, shape, {}, wdir, threads))
            workers.append(Worker(f"gemm {PEAK_N}³ bf16", "gemm-bf16", args, shape, {}, wdir, threads))
            for w in workers:
                w.ready()
            for _ in range(rounds):
                for w in workers:
                    time.sleep(args.pause)
                    w.run(steps if not w.kind.startswith("gemm") else args.gemm_steps)
        finally:
            for w in workers:
                w.close()
    info = ours.hello["info"]
    tokens, flops = cfg["batch"] * cfg["l"], step_flops(cfg)
    print(f"\n{cfg['name']} (--bf16): N_V {cfg['n_vocab']}, ℓ {cfg['l']}, L {cfg['L']}, H {cfg['H']}, d_e {cfg['d_e']}, "
          f"d_mlp {cfg['d_mlp']}, batch {cfg['batch']}, {info['params'] / 1e6:.2f}M params, {threads} threads each")
    print(f"  formal-transformers {info['version']}, BLAS: {info['blas']}; PyTorch {workers[2].hello['info']['version']}")
    print(f"  {rounds} interleaved rounds × {steps} timed steps per side; medians")
    l0 = workers[1].hello["loss"]
    print("  initial loss: " + ", ".join(f"{w.label} {w.hello['loss']:.4f}" for w in workers[:4])
          + f"  (float32 {l0:.4f}; bf16 sides differ by their rounding)")
    print(f"  {'':26s}{'ms/step':>10s}{'min ms':>10s}{'tokens/s':>11s}{'GFLOP/s':>10s}")
    med = {}
    for w in workers[:4]:
        m = med[w.label] = statistics.median(w.times)
        print(f"  {w.label:26s}{1e3 * m:10.1f}{1e3 * min(w.times):10.1f}{tokens / m:11.0f}{flops / m / 1e9:10.1f}")
    peaks = {}
    for w in workers[4:]:
        peaks[w.kind] = 2.0 * PEAK_N**3 / statistics.median(w.times) / 1e9
        print(f"  {w.label:26s}{1e3 * statistics.median(w.times):10.1f}{'':21s}{peaks[w.kind]:10.1f}")
    mo = med[ours.label]
    best = min(med[workers[2].label], med[workers[3].label])
    print(f"  speed ratio best PyTorch autocast / ours bf16-mixed: {best / mo:.2f}x   (eager {med[workers[2].label] / mo:.2f}x, "
          f"compiled {med[workers[3].label] / mo:.2f}x; > 1: ours faster)")
    print(f"  ours bf16-mixed / ours float32 step time: {mo / med[workers[1].label]:.2f}")
    print(f"  ours bf16-mixed: {flops / mo / 1e9:.1f} GFLOP/s = {100 * flops / mo / 1e9 / peaks['gemm-bf16']:.0f}% of the "
          f"bf16 gemm rate {peaks['gemm-bf16']:.1f} GFLOP/s (float32 gemm: {peaks['gemm']:.1f})")
    return med


def run_inprocess(args) -> None:
    """One side, flat out, in this process (for a profiler): --iters steps after the warm-up."""
    cfg = dict(GPT2 if args.large or args.only_large else LLAMA if args.variant == "llama" else BABY,
               dropout=args.dropout, precision=args.precision)  # --precision bf16-mixed: ours in bf16
    side = SIDES[args.inprocess](cfg, args.threads, args.tied, None)
    for _ in range(args.warmup):
        side.step()
    times = []
    t_all = time.perf_counter()
    for _ in range(args.iters):
        t = time.perf_counter()
        side.step()
        times.append(time.perf_counter() - t)
    t_all = time.perf_counter() - t_all
    m = statistics.median(times)
    unit = "product" if args.inprocess == "gemm" else "step"
    flops = 2.0 * PEAK_N**3 if args.inprocess == "gemm" else step_flops(cfg)
    what = f"{PEAK_N}³ float32 gemm" if args.inprocess == "gemm" else cfg["name"]
    print(f"{args.inprocess} in-process, {what}, {side.info['threads']} threads: {args.iters} {unit}s in {t_all:.2f} s, "
          f"median {1e3 * m:.2f} ms/{unit}, {flops / m / 1e9:.1f} GFLOP/s" + ("" if side.loss is None else
                                                                             f"; initial loss {side.loss:.6f}"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=None, help="threads for every side (default: ft.get_num_threads())")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds per side (baby GPT)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per round (baby GPT)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps in each worker before the rounds")
    ap.add_argument("--pause", type=float, default=0.3, help="seconds of pause before each round")
    ap.add_argument("--gemm-steps", type=int, default=3, help="2048³ products per round of the gemm worker")
    ap.add_argument("--large", action="store_true", help="also the GPT-2-small shape (~4 GB of memory per side)")
    ap.add_argument("--large-rounds", type=int, default=5)
    ap.add_argument("--only-large", action="store_true", help="the GPT-2-small shape alone (implies --large)")
    ap.add_argument("--large-steps", type=int, default=1)
    ap.add_argument("--large-warmup", type=int, default=1, help="untimed steps per worker at GPT-2 size")
    ap.add_argument("--tied", action="store_true", help="W_u = W_eᵀ in both models (as nanoGPT/GPT-2 do)")
    ap.add_argument("--inprocess", choices=sorted(SIDES), help="run one side alone in this process, flat out "
                    "(--iters steps; with --large the GPT-2-small shape), for profiling")
    ap.add_argument("--iters", type=int, default=100, help="steps for --inprocess")
    ap.add_argument("--variant", choices=["llama"], help="the LLaMA-style baby (docs/variants.md) vs PyTorch and "
                    "vs our GPT-2-style baby GPT, instead of the baby GPT")
    ap.add_argument("--worker", choices=sorted(SIDES), help=argparse.SUPPRESS)  # internal: a subprocess
    ap.add_argument("--shape", choices=sorted(SHAPES), default="baby", help=argparse.SUPPRESS)
    ap.add_argument("--wdir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--dropout", type=float, default=0.0, help="dropout rate of every side, with no-dropout twins of "
                    "ours and PyTorch (passive) in the same rounds: the cost of dropout per step")
    ap.add_argument("--bf16", action="store_true", help="mixed precision: ours bf16-mixed vs PyTorch autocast bf16 "
                    "(eager and compiled), with ours float32 and the float32 / bf16 gemm rates in the same rounds")
    ap.add_argument("--ell", type=int, default=None, help="ℓ, the sequence length of every shape (l_max raised to it; "
                    "the issue's GPT-2-small targets: 64 with batch 4, 1024 with --batch 1)")
    ap.add_argument("--batch", type=int, default=None, help="sequences per step of every shape")
    ap.add_argument("--precision", default="float32", help=argparse.SUPPRESS)  # internal: a worker's
    ap.add_argument("--autocast", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    for c in SHAPES.values():  # --ell, --batch: the same shapes in the parent and every worker
        if args.ell:
            c["l"], c["l_max"] = args.ell, max(c["l_max"], args.ell)
        if args.batch:
            c["batch"] = args.batch
    if args.worker:
        return run_worker(args)
    if args.inprocess:
        return run_inprocess(args)
    if args.dropout and args.variant:
        ap.error("--dropout times the GPT-2-style models (the LLaMA-style PyTorch module has no dropout)")
    if args.rounds * args.steps < 5 or args.large_rounds * args.large_steps < 5:
        ap.error("use at least 5 timed steps per side (rounds × steps)")

    print(f"CPU: {cpu_model()}; os.cpu_count() = {os.cpu_count()}; bf16 instructions: {cpu_bf16()}")
    print("Each side in its own worker process; the parent imports neither formal_transformers nor torch.")
    if args.variant == "llama":
        return [bench(LLAMA, "llama", args, args.threads, args.rounds, args.steps)]
    if args.bf16:
        meds = [] if args.only_large else [bench_bf16(BABY, "baby", args, args.threads, args.rounds, args.steps)]
        if args.large or args.only_large:
            meds.append(bench_bf16(GPT2, "gpt2", args, args.threads, args.large_rounds, args.large_steps))
        return meds
    meds = [] if args.only_large else [bench(BABY, "baby", args, args.threads, args.rounds, args.steps)]
    if args.large or args.only_large:
        meds.append(bench(GPT2, "gpt2", args, args.threads, args.large_rounds, args.large_steps))
    return meds


if __name__ == "__main__":
    main()
