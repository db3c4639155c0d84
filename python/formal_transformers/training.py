"""Algorithms 11–13 — EDTraining, ETraining, DTraining — with the options users of trainers expect.

The listings' loops run in C++ (cpp/src/listings/training.cpp, line by line) with the GIL released; this module
adds what belongs to Python: the optimizer choice, a tqdm progress bar showing the loss, a callback, and
the loss history a notebook can plot. Ctrl-C stops training between steps (or inside a step, before its
update): the model keeps the parameters of the last completed step, the history is kept on the trainer,
and KeyboardInterrupt is re-raised. A step whose loss or gradient norm is NaN or infinite is never applied:
by default training stops with FloatingPointError naming the step, the model holding the parameters of
the step before it (nonfinite="warn" or "skip" skips such steps instead). Launched by torchrun (or given
process_group=), the trainers run data-parallel: docs/data_parallel.md and _distributed.py.

    model = ft.DTransformer(n_vocab, l_max, L, H, d_e, d_mlp)
    trainer = ft.DTraining(n_epochs=2, eta=1e-3, batch_size=12, schedule="cosine", warmup=100)
    trainer(x_data, model)              # updates model in place and returns it
    trainer.history["loss"]            # per step: mean loss per predicted token (nats)
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Optional

import numpy as np

from . import _core
from ._distributed import Replicas, find_group, rank_dropout_seed, start_figures

__all__ = ["DTraining", "ETraining", "EDTraining", "History"]


class History(dict):
    """Per-step figures of a training run: lists keyed by "step", "epoch", "loss" (mean per scored
    token, nats), "lr", "grad_norm", "tokens", "time" (seconds since the start), "skipped" (True: a
    non-finite step whose update was not applied, nonfinite="warn"/"skip"), and the evaluations
    "val_step", "val_loss", "val_accuracy". With validation data, early stopping's outcome (single
    values, of the last call): "best_step" and "best_val_loss" (the best evaluation so far, None before
    the first; its step counts from the start of the whole run: start_step + the step here), "stopped_early" (True: `patience` evaluations without improvement ended training) and
    "restored_best" (True: the model's parameters were replaced by those of best_step at the end).
    `arrays()` gives numpy arrays of the per-step lists; `plot()` draws the curves."""

    KEYS = ("step", "epoch", "loss", "lr", "grad_norm", "tokens", "time", "skipped", "val_step", "val_loss",
            "val_accuracy")
    SUMMARY = ("best_step", "best_val_loss", "stopped_early", "restored_best")

    def __init__(self):
        super().__init__({k: [] for k in self.KEYS})
        self.update(best_step=None, best_val_loss=None, stopped_early=False, restored_best=False)

    def arrays(self) -> dict:
        return {k: np.asarray(self[k]) for k in self.KEYS}

    def plot(self, ax=None, smooth: int = 1):
        """Loss (and validation loss) against the step, with matplotlib."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(6, 3.5))
        loss = np.asarray(self["loss"], dtype=float)
        if smooth > 1 and loss.size >= smooth:
            loss = np.convolve(loss, np.ones(smooth) / smooth, mode="valid")
            steps = np.asarray(self["step"])[smooth - 1 :]
        else:
            steps = np.asarray(self["step"])
        ax.plot(steps, loss, label="training loss")
        if self["val_step"]:
            ax.plot(self["val_step"], self["val_loss"], "o-", label="validation loss")
        ax.set_xlabel("step")
        ax.set_ylabel("loss per token (nats)")
        ax.legend()
        return ax


class _Trainer:
    """Options shared by the three listings (see DTraining for the list)."""

    _listing = ""

    def __init__(self, n_epochs: int, eta: Optional[float] = None, *, optimizer: Any = "adam",
                 betas: tuple = (0.9, 0.999), callback: Optional[Callable[[dict], Any]] = None, progress: bool = True,
                 process_group: Any = None, **options):
        if callback is not None and not callable(callback):
            raise TypeError("callback must be callable")
        beta1, beta2 = betas
        # parsed once, by the core's schema (TypeError / ValueError naming a bad option)
        self._options = _core._TrainOptions(self._listing, dict(options, n_epochs=n_epochs, eta=eta, beta1=beta1,
                                                                beta2=beta2), optimizer)
        self.options = self._options.as_dict()
        self.n_epochs, self.eta = self.options["n_epochs"], self.options["eta"]
        self.weight_decay, self.betas = self.options["weight_decay"], (self.options["beta1"], self.options["beta2"])
        self.callback = callback
        self.progress = progress
        if process_group is not None and process_group is not False:
            find_group(process_group, 1.0)  # TypeError unless a torch.distributed ProcessGroup
        self.process_group = process_group
        self.dist_timeout = self.options["dist_timeout"]
        self.sync_check_every = self.options["sync_check_every"]
        self.data_parallel: Optional[Replicas] = None  # the last call's ranks and all-reduce figures
        self._on_step: Optional[Callable[[dict], None]] = None  # the CLI's checkpoints: every rank, no vote
        self.optimizer = None if isinstance(optimizer, str) else optimizer  # an object given: used and kept
        self._given_optimizer = self.optimizer is not None
        if self._given_optimizer:
            self.options["optimizer"] = optimizer
        self._model = None
        self.history = History()
        self._early = None        # early stopping's state (see early_stopping)
        self._early_model = None  # the model it belongs to

    def _check_early_stopping(self):
        """patience / restore_best watch the validation loss: without val_data they are a ValueError now."""
        if self.val_data is None and (self.options["patience"] is not None or self.options["restore_best"]):
            name = "patience" if self.options["patience"] is not None else "restore_best"
            raise ValueError(f"{name} needs val_data (early stopping watches the validation loss)")

    @property
    def early_stopping(self) -> Optional[dict]:
        """Early stopping's state after the last call (None before): best_val_loss, best_step (start_step +
        the history's step: history's numbering unless start_step is set), bad_evals (evaluations since best_step without improvement), best_params
        (name -> array: θ at best_step, with restore_best; else None), stopped, restored, last_params
        (θ after the last step, when the best was restored). Calling the trainer again on the same model
        continues from it; assign a saved one (the first four entries are enough; best_params too with
        restore_best) to resume a run in a new trainer — with start_step, a resumed run stops where one
        uninterrupted run would."""
        return self._early

    @early_stopping.setter
    def early_stopping(self, state: Optional[dict]):
        if state is not None and not isinstance(state, dict):
            raise TypeError(f"early_stopping must be a dict (or None), got {type(state).__name__}")
        if state is not None:
            _check_early_state_keys(state)
        self._early = None if state is None else dict(state)
        self._early_model = None  # for whichever model the next call trains

    def plan(self, x_data, model=None) -> list:
        """The steps a call on x_data takes, from the core's plan of the run (the loop itself walks it): per step
        a dict with "step" (from 1), "epoch" (from 0), "sequences" (indices into x_data, in the minibatch's
        order: the seeded shuffle when shuffle=True), "lr" (η of the step: warmup, schedule, start_step), and
        for ETraining given the model, "masked": the x̃ of each of those sequences (lines 4–6). EDTraining:
        x_data of the pairs. n_epochs=0 with max_steps: the run is max_steps long."""
        mask_token = model.mask_token if model is not None and self._listing == "ETraining" else None
        return self._options.plan(x_data, mask_token)

    def _optimizer_for(self, model):
        """The optimizer object: the one given, or one created for this model and kept (with a reference to
        the model, so another model can never inherit its moments), so that calling the trainer again on
        the same model continues with the same Adam moments."""
        if self._given_optimizer:
            return self.optimizer
        if self.optimizer is None or self._model is not model:
            self.optimizer = self._options.make_optimizer()
            self._model = model
        return self.optimizer

    def _run(self, train: Callable, args: tuple, model, data: tuple = (), val: tuple = (), **kwargs) -> Any:
        """train(*args, options, optimizer, hook, record, early, replicas, **kwargs) is the C++ loop (_core._dtraining,
        _etraining, _edtraining); `record` (a list) receives one dict
        per step, written by C++ right after each update — so the history always ends at the step the model
        holds, also when Ctrl-C or a callback's exception ends training. Data parallel (a process group of
        more than one rank): `data` and `val` are checked to be every rank's, with θ, the options and the
        optimizer's state, before the first step."""
        opt = self._optimizer_for(model)
        dist, group = find_group(self.process_group, self.dist_timeout)
        dp = None
        if dist is not None and dist.get_world_size(group) > 1:
            dp = Replicas(dist, group, self.dist_timeout)
            dp.step = int(self.options["start_step"])
            dp.check_start(start_figures(model, opt, self._listing, self.options, data, val,
                                         self.callback is not None))
            theta = _core._flat_params(model)
        self.data_parallel = dp
        rank0 = dp is None or dp.rank == 0
        bar = None
        if self.progress and rank0:
            try:
                from tqdm.auto import tqdm
            except ImportError:  # tqdm is a dependency; tolerate its absence
                tqdm = None
            if tqdm is not None:
                bar = tqdm(desc=self._listing, unit="step", mininterval=0.5, dynamic_ncols=True)
        h = self.history
        step0 = h["step"][-1] if h["step"] else 0
        time0 = h["time"][-1] if h["time"] else 0.0
        record: list = []
        # early stopping's state: best_step counts start_step + the history's step (so that a state carries
        # over to a trainer resuming with start_step as is); the core counts start_step + this call's step
        shift = -step0
        if self._early is not None and self._early_model is not None and self._early_model is not model:
            self._early = None  # another model: a fresh state, as the optimizer's
        # the core reads the counters and θ* and writes every entry back (stopped, restored, …) however the
        # call ends: only what it wrote is read below, never a resumed state's own stopped / restored
        early = {} if self._early is None else {k: v for k, v in self._early.items() if k in _EARLY_IN}
        if early.get("best_val_loss") is not None:
            early["best_step"] = int(early["best_step"]) + shift
        last_val = [None]
        start = int(self.options["start_step"])

        def hook(info: dict) -> bool:
            if info["val_loss"] is not None:
                last_val[0] = info["val_loss"]
            if bar is not None:
                if bar.total is None:
                    bar.total = info["total_steps"]
                post = {"loss": f"{info['loss']:.4f}"}
                if last_val[0] is not None:
                    post["val"] = f"{last_val[0]:.4f}"
                bar.set_postfix(post, refresh=False)
                bar.update(1)
            if dp is not None:
                dp.step = start + info["step"]
                if self.sync_check_every and info["step"] % self.sync_check_every == 0:
                    dp.check_theta(theta)
            go = True
            if self.callback is not None:
                go = self.callback(dict(info, step=step0 + info["step"])) is not False
                if dp is not None:
                    go = dp.agree(go)  # one rank's False stops every rank after this step
            if self._on_step is not None:
                self._on_step(dict(info, step=step0 + info["step"]))
            return go

        # dropout: rank r draws its own masks (rank 0 those of one process); the core leaves the counter at the
        # completed steps however training ends (a resumed run replays the masks of an unbroken one)
        seed0 = model.dropout_seed
        if dp is not None:
            model.dropout_seed = rank_dropout_seed(seed0, dp.rank)
        try:
            train(*args, self._options, opt, hook=hook, history=record, early_stopping=early, replicas=dp, **kwargs)
            if dp is not None:
                dp.check_theta(theta)
        except KeyboardInterrupt:
            if bar is not None:
                bar.close()
                bar = None
            done = step0 + (record[-1]["step"] if record else 0)
            if rank0:
                print(f"{self._listing}: interrupted; the model holds the parameters after step {done}", file=sys.stderr)
            raise
        finally:
            model.dropout_seed = seed0
            if bar is not None:
                bar.close()
            for r in record:
                h["step"].append(step0 + r["step"])
                h["epoch"].append(r["epoch"])
                h["loss"].append(r["loss"])
                h["lr"].append(r["lr"])
                h["grad_norm"].append(r["grad_norm"])
                h["tokens"].append(r["tokens"])
                h["skipped"].append(r["skipped"])
                h["time"].append(time0 + r["time"])
                if r["val_loss"] is not None:
                    h["val_step"].append(step0 + r["step"])
                    h["val_loss"].append(r["val_loss"])
                    h["val_accuracy"].append(r["val_accuracy"])
            if "stopped" in early:  # written by the core however training ended
                found = early["best_val_loss"] is not None
                early["best_step"] = early["best_step"] - shift if found else None
                self._early, self._early_model = early, model
                h.update(best_step=early["best_step"], best_val_loss=early["best_val_loss"],
                         stopped_early=early["stopped"], restored_best=early["restored"])
        return model

    def __repr__(self):
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items() if k not in ("n_epochs", "eta"))
        return f"{type(self).__name__}(n_epochs={self.n_epochs}, eta={self.eta}, {opts})"


_EARLY_IN = ("best_val_loss", "best_step", "bad_evals", "best_params")  # what a resumed state gives the core
_EARLY_OUT = ("stopped", "restored", "last_params")                   # what the core adds after a call


def _check_early_state_keys(state: dict) -> None:
    """A state assigned to trainer.early_stopping (to resume a run): the counters must all be there and every
    key must be one the trainer writes (ValueError naming the key; the values are checked by the core, before
    any update). A saved state lacking a counter would otherwise resume as if no evaluation had happened."""
    for k in state:
        if k not in _EARLY_IN + _EARLY_OUT:
            raise ValueError(f"early_stopping: unknown key {k!r} (a state has {', '.join(_EARLY_IN + _EARLY_OUT)})")
    for k in _EARLY_IN[:3]:
        if k not in state:
            raise ValueError(f"early_stopping: the state lacks {k!r} (best_val_loss, best_step and bad_evals are "
                             "needed to resume; best_params too with restore_best)")
    if ("stopped" in state) != ("restored" in state):
        k = "restored" if "stopped" in state else "stopped"
        raise ValueError(f"early_stopping: the state lacks {k!r} (a trainer writes stopped and restored together)")


class DTraining(_Trainer):
    """Algorithm 13: θ̂ ← DTraining(x_{1:N_data}, θ) — next-token training of a DTransformer.

    DTraining(n_epochs, eta=1e-3, **opts)(x_data, model) -> model (trained in place). x_data: sequences of
    token ids (a 2-D (N, ℓ) array or a list of 1-D sequences of any lengths ≤ l_max; see ft.chunk).
    Options: those of the core's schema, listed at the end (one declaration each, in train_options.cpp: name,
    default, range, meaning; TypeError / ValueError naming a bad one when the trainer is made), and Python's:
      betas       (β₁, β₂) of optimizer="adam" (the schema's beta1, beta2)
      val_data    validation data: loss (mean per token) and accuracy every eval_every steps and at the end;
                  early stopping's outcome is in history ("best_step", "best_val_loss", "stopped_early",
                  "restored_best") and the state to resume from in `trainer.early_stopping`
      callback    called after each step with a dict (step, epoch, loss, lr, grad_norm, tokens,
                  val_loss, val_accuracy); returning False stops training
      progress    a tqdm bar showing the loss (False: none)
      process_group  data parallel (docs/data_parallel.md): None (default) — torch.distributed's default
                  group when there is one or torchrun launched the script (the trainer then initialises it,
                  gloo), else one process; a torch ProcessGroup; False — one process. Each rank must be
                  given the same model and the whole data: every rank draws the same minibatch, takes its
                  contiguous slice, and the gradients are summed over the ranks, so each step equals the
                  single-process step; rank 0 alone shows the progress bar
      val_prefix_len  a prefix LM (mask="prefix", docs/variants.md V7): the prefix lengths of val_data (an int
                  or one per sequence), as the call's prefix_len for x_data: DTraining(...)(x_data, model,
                  prefix_len=p) trains on the predictions after each sequence's prefix only
    The history of every step is in `trainer.history` (see History); `trainer.data_parallel` holds the last
    call's ranks and all-reduce figures (None: one process); `trainer.plan(x_data)` the steps a call takes."""

    _listing = "DTraining"

    def __init__(self, n_epochs: int, eta: Optional[float] = None, *, val_data=None, val_prefix_len=None, **opts):
        super().__init__(n_epochs, eta, **opts)
        self.val_data = val_data
        self.val_prefix_len = val_prefix_len
        self._check_early_stopping()

    def __call__(self, x_data, model, prefix_len=None):
        return self._run(
            _core._dtraining, (model, x_data), model,
            (x_data,) if prefix_len is None else (x_data, [np.atleast_1d(prefix_len)]),
            (self.val_data,) if self.val_prefix_len is None else (self.val_data, [np.atleast_1d(self.val_prefix_len)]),
            val_data=self.val_data, prefix_len=prefix_len, val_prefix_len=self.val_prefix_len,
        )


class ETraining(_Trainer):
    """Algorithm 12: θ̂ ← ETraining(x_{1:N_data}, θ) — masked-language-model training of an ETransformer.

    ETraining(n_epochs, eta, p_mask, **opts)(x_data, model) -> model. Each visit of a sequence replaces
    each token by mask_token with probability p_mask ∈ (0, 1) (lines 4–6, from the seeded generator) and
    scores only those positions (line 9). Validation uses fixed masks (the same at every evaluation) and
    reports the masked-token accuracy. Options as DTraining."""

    _listing = "ETraining"

    def __init__(self, n_epochs: int, eta: Optional[float] = None, p_mask: float = 0.15, *, val_data=None, **opts):
        super().__init__(n_epochs, eta, p_mask=p_mask, **opts)
        self.p_mask = self.options["p_mask"]
        self.val_data = val_data
        self._check_early_stopping()

    def __call__(self, x_data, model, x_tilde=None):
        """x_tilde (optional): fixed masks — the masked sequence x̃ of each sequence of x_data (same lengths, its
        positions equal to mask_token scored), used at every visit instead of drawing lines 4–6 (a task whose
        masked positions are given, e.g. a label slot)."""
        extra = {} if x_tilde is None else {"x_tilde": x_tilde}
        return self._run(_core._etraining, (model, x_data), model, (x_data,), (self.val_data,), val_data=self.val_data,
                         **extra)

    def drawn_masks(self, x_data, model) -> list:
        """The masked sequences x̃ that lines 4–6 of this trainer draw when it runs on x_data: one list per step
        (the x̃ of each sequence of the step's minibatch, in the minibatch's order: plan(x_data)'s
        "sequences"), for every step the run takes. They come from the core's plan of the run (the trainer's
        own generator, seeded with `seed`, which also draws the order when shuffling), not from the model, so
        they can be had before or after training, e.g. to replay a run through reference.e_training."""
        return [step["masked"] for step in self.plan(x_data, model)]


class EDTraining(_Trainer):
    """Algorithm 11: θ̂ ← EDTraining(z_{1:N_data}, x_{1:N_data}, θ) — seq2seq training of an EDTransformer.

    EDTraining(n_epochs, eta, **opts)(z_data, x_data, model) -> model; z_data and x_data are sequences of
    the same count (pairs). Validation: val_data=(z_val, x_val). Options as DTraining. An EDTransformer whose encoder takes
    features (model.encoder_input; Whisper's log-mel spectrograms, listings V28, V29) takes them as z_data: (N, rows, T),
    or a list of (rows, T_n) arrays; its loop is the same core loop."""

    _listing = "EDTraining"

    def __init__(self, n_epochs: int, eta: Optional[float] = None, *, val_data=None, **opts):
        super().__init__(n_epochs, eta, **opts)
        if val_data is not None and (not isinstance(val_data, (tuple, list)) or len(val_data) != 2):
            raise ValueError("EDTraining's val_data must be a pair (z_val, x_val)")
        self.val_data = val_data
        self._check_early_stopping()

    def __call__(self, z_data, x_data, model):
        zv, xv = self.val_data if self.val_data is not None else (None, None)
        return self._run(_core._edtraining, (model, z_data, x_data), model, (z_data, x_data), (zv, xv), z_val=zv,
                         x_val=xv)


for _trainer in (DTraining, ETraining, EDTraining):  # the schema's options, with their defaults
    if _trainer.__doc__:  # (None under python -OO)
        _trainer.__doc__ = _trainer.__doc__.rstrip() + "\n\n    Options of the schema (name=default):\n" + "".join(
            f"      {line}\n" for line in _core._TrainOptions.doc(_trainer._listing).splitlines())
