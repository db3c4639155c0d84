# frozen vs full training step: a MiniLM-sized ETransformer (L=6, H=12, d_e=384, d_mlp=1536, N_V=1000), ETraining,
# batch 8 sequences of 64 tokens, float32
import time, os, numpy as np, formal_transformers as ft
m = ft.ETransformer(1000, 64, 6, 12, 384, 1536, 384, seed=0)
rng = np.random.default_rng(0)
data = [rng.integers(0, 997, size=64) for _ in range(8 * 10)]
FPT = ["W_e", "W_p", "*gamma*", "*beta*", "W_f", "b_f", "W_u"]
def run(trainable, model):
    ft.ETraining(1, 1e-4, batch_size=8, trainable=trainable, progress=False, shuffle=False)(data[:16], model)
    t = ft.ETraining(1, 1e-4, batch_size=8, trainable=trainable, progress=False, shuffle=False)
    t0 = time.perf_counter(); t(data, model); return (time.perf_counter() - t0) / 10 * 1000
n = sum(v.size for v in m.params.values())
import fnmatch
nf = sum(v.size for k, v in m.params.items() if any(fnmatch.fnmatchcase(k, p) for p in FPT))
print(f"params {n:,}; FPT trainable {nf:,} ({100*nf/n:.2f}%)")
ml = ft.ETransformer(1000, 64, 6, 12, 384, 1536, 384, seed=0); ft.lora(ml, r=8, alpha=16)
for rep in range(3):
    full = run(None, m); frozen = run(FPT, m); lora = run(["*.lora_A", "*.lora_B"], ml); lora_full = run(None, ml)
    print(f"rep {rep}: full {full:.1f}  FPT-frozen {frozen:.1f} ({frozen/full:.2f}x)  LoRA-only {lora:.1f}  LoRA model all {lora_full:.1f} ms/step")
print("threads", ft.get_num_threads(), "load", os.getloadavg())
