"""One process of tests/python/test_ddp.py: ft.to_torch(model) trained one SGD step with PyTorch's
DistributedDataParallel (gloo, loopback). Usage: _ddp_worker.py RANK WORLD PORT OUT_DIR.
`case(arch)` is shared with the test, which makes the same model and union batch for ft's own step."""
import sys

import numpy as np

LR = 0.05


def case(arch):
    """(model, the union batch as loss arguments split per rank by `part`) — deterministic."""
    import formal_transformers as ft

    rng = np.random.default_rng(11)
    if arch == "D":
        m = ft.DTransformer(29, 16, 2, 2, 8, 16, dtype="float64", seed=1, init_std=0.2, tied=True, gelu="tanh")
        args = ([rng.integers(0, 29, n) for n in (9, 5, 12, 7)],)
    elif arch == "E":
        m = ft.ETransformer(29, 16, 2, 2, 8, 16, 8, dtype="float64", seed=2, init_std=0.2, n_segments=2,
                            embed_norm=True, unembed_bias=True)
        x = [rng.integers(0, 26, n) for n in (9, 5, 12, 7)]
        xt = [s.copy() for s in x]
        for s in xt:
            s[rng.choice(len(s), 2, replace=False)] = m.mask_token
        args = (xt, x, [np.arange(len(s)) * 2 // len(s) for s in x])
    else:
        m = ft.EDTransformer(29, 16, 2, 2, 2, 8, 16, dtype="float64", seed=3, init_std=0.2)
        args = ([rng.integers(0, 29, n) for n in (6, 10, 4, 8)], [rng.integers(0, 29, n) for n in (9, 5, 12, 7)])
    return m, args


def part(args, rank, world):
    return tuple([a[i] for i in range(rank, len(a), world)] for a in args)


def main():
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import formal_transformers as ft

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        for arch in ("D", "E", "ED"):
            model, args = case(arch)
            module = ft.to_torch(model)
            ddp = DDP(module.as_loss())  # forward = module.loss
            opt = torch.optim.SGD(ddp.parameters(), lr=LR)
            opt.zero_grad()
            # ft's loss is a sum over the batch; DDP averages gradients over the processes: scale by world
            loss = ddp(*part(args, rank, world)) * world
            loss.backward()
            opt.step()
            np.savez(f"{out}/{arch}_{rank}.npz", **module.ft_params())
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
