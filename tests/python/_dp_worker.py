"""One rank of tests/python/test_data_parallel.py: the trainers run data-parallel in the native core, the
process group initialised by the trainer itself from torchrun's environment variables (set here as torchrun
sets them). Usage: _dp_worker.py RANK WORLD PORT OUT_DIR. Each scenario writes OUT_DIR/<name>_<rank>.npz
(θ and figures) or records its error in OUT_DIR/errors_<rank>.json; the test compares them with the same
scenario run in one process (`process_group=False`). The scenarios are shared with the test (`SCENARIOS`)."""
import json
import os
import sys

import numpy as np

LR = 0.05


def model_and_data(arch, dropout=0.0):
    """A small float64 model and 5 training sequences (pairs for ED) of uneven lengths: deterministic."""
    import formal_transformers as ft

    rng = np.random.default_rng(11)
    x = [rng.integers(0, 26, n) for n in (9, 5, 12, 7, 3)]
    if arch == "D":
        return ft.DTransformer(29, 16, 2, 2, 8, 16, dtype="float64", seed=1, init_std=0.2, dropout=dropout), (x,)
    if arch == "E":
        return ft.ETransformer(29, 16, 2, 2, 8, 16, 8, dtype="float64", seed=2, init_std=0.2), (x,)
    z = [rng.integers(0, 29, n) for n in (6, 10, 4, 8, 5)]
    return ft.EDTransformer(29, 16, 2, 2, 2, 8, 16, dtype="float64", seed=3, init_std=0.2), (z, x)


def trainer_for(arch, **opts):
    import formal_transformers as ft

    cls = {"D": ft.DTraining, "E": ft.ETraining, "ED": ft.EDTraining}[arch]
    if arch == "E":
        opts.setdefault("p_mask", 0.3)
    return cls(opts.pop("n_epochs", 1), opts.pop("eta", LR), progress=False, **opts)


def one_step(arch, reduction, batch, pg):
    """One SGD step on the first `batch` sequences: θ after it."""
    model, data = model_and_data(arch)
    tr = trainer_for(arch, optimizer="sgd", batch_size=batch, shuffle=False, reduction=reduction, max_steps=1,
                     process_group=pg)
    tr(*data, model)
    return {k: np.array(v) for k, v in model.params.items()}, tr


def run50(pg):
    """50 Adam steps of a D model (shuffled minibatches of 6, per-token mean, cosine schedule, clipping,
    validation every 10 steps): θ and the history."""
    import formal_transformers as ft

    rng = np.random.default_rng(5)
    x = [rng.integers(0, 29, n) for n in rng.integers(3, 17, 20)]
    val = [rng.integers(0, 29, n) for n in rng.integers(3, 17, 7)]
    model = ft.DTransformer(29, 16, 2, 2, 8, 16, dtype="float64", seed=4, init_std=0.2)
    tr = ft.DTraining(20, 3e-3, batch_size=6, seed=9, reduction="mean", schedule="cosine", warmup=5, clip=0.5,
                      max_steps=50, val_data=val, eval_every=10, progress=False, process_group=pg,
                      sync_check_every=10)
    tr(x, model)
    out = {"p." + k: np.array(v) for k, v in model.params.items()}
    for k in ("step", "loss", "grad_norm", "tokens", "val_loss", "val_accuracy"):
        out["h." + k] = np.asarray(tr.history[k], dtype=float)
    return out


def dropout_steps(pg):
    """Two SGD steps of a D model with dropout 0.2 on 5 sequences: θ and the dropout counter."""
    model, data = model_and_data("D", dropout=0.2)
    tr = trainer_for("D", optimizer="sgd", batch_size=5, shuffle=False, max_steps=2, n_epochs=2, process_group=pg)
    tr(*data, model)
    out = {k: np.array(v) for k, v in model.params.items()}
    out["dropout_step"] = np.array(model.dropout_step)
    out["dropout_seed"] = np.array(model.dropout_seed, dtype=np.uint64)
    return out


STEP_CASES = [(a, r, 5) for a in ("D", "E", "ED") for r in ("sum", "mean")] + [("D", "mean", 2)]


def main():
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=port)
    import formal_transformers as ft

    errors = {}
    for arch, red, b in STEP_CASES:
        theta, tr = one_step(arch, red, b, None)
        assert tr.data_parallel is not None and tr.data_parallel.world == world
        np.savez(f"{out}/step_{arch}_{red}_{b}_{rank}.npz", allreduce_calls=tr.data_parallel.allreduce_calls, **theta)
    np.savez(f"{out}/dropout_{rank}.npz", **dropout_steps(None))
    # a group given as process_group= (a new group of all the ranks)
    import torch.distributed as dist

    group = dist.new_group(list(range(world)))
    theta, tr = one_step("ED", "mean", 5, group)
    assert tr.data_parallel.world == world
    np.savez(f"{out}/group_{rank}.npz", group_rank=tr.data_parallel.rank, **theta)
    np.savez(f"{out}/run50_{rank}.npz", **run50(None))

    # a callback's False on one rank stops every rank after that step
    model, data = model_and_data("D")
    tr = trainer_for("D", batch_size=2, n_epochs=3, callback=lambda info: not (rank == 1 and info["step"] == 3))
    tr(*data, model)
    np.savez(f"{out}/vote_{rank}.npz", steps=np.asarray(tr.history["step"]))

    # every rank must be given the whole data set: one rank's own shard is caught before the first step
    model, data = model_and_data("D")
    mine = data[0][rank::world] + [np.array([1, 2, 3])] * 5
    try:
        trainer_for("D", batch_size=2)(mine[:5], model)
    except RuntimeError as e:
        errors["data"] = str(e)

    # θ changed on one rank only: the fingerprint check every 2 steps raises on every rank
    model, data = model_and_data("D")

    def nudge(info):
        if rank == world - 1 and info["step"] == 3:
            model.params["W_e"][0, 0] += 1e-9

    try:
        trainer_for("D", batch_size=2, n_epochs=4, sync_check_every=2, callback=nudge)(*data, model)
    except RuntimeError as e:
        errors["diverged"] = str(e)
    with open(f"{out}/errors_{rank}.json", "w") as f:
        json.dump(errors, f)
    dist.destroy_process_group()
    assert ft is not None


if __name__ == "__main__":
    main()
