"""The main job: train a DTransformer (Algorithm 10, GPT) on a text with DTraining (Algorithm 13) and sample
from it with DInference (Algorithm 14).

    python -m formal_transformers demo                     # train on a default text, print samples
    python -m formal_transformers train --text FILE --out runs/x [--steps 2000 ...] [--resume]
    python -m formal_transformers sample --run runs/x --prompt "ROMEO:" --tokens 500 --tau 0.8

The default text needs no download: the source code of the Python standard library that runs this
command (the first ~1 MB of its top-level modules in name order). A run directory holds what resuming
and sampling need: model.safetensors (θ and the hyperparameters), tokenizer.json, optimizer.safetensors
(Adam's step count and moments), run.json (options, data split, loss history, early stopping's counters)
and, with --restore-best, early_stopping.safetensors (the best evaluation's θ, and the last step's θ when
model.safetensors holds the restored best: what --resume continues from). Each file is written through a
unique temporary renamed into place, run.json last.

Bad input is one error line and exit code 2, as argparse reports a bad argument: an option out of range
(each has its own type: --batch ≥ 1, --context ≥ 2, rates in [0, 1), …), an option combination the model
refuses, --resume of a directory without model.safetensors (refused: it never starts over there), and a
damaged run directory (every file --resume and sample read is checked: RunError naming it); a refused
command changes nothing in the run directory.

Under torchrun the same command trains data-parallel (docs/data_parallel.md): every rank reads the text and
--out, rank 0 alone prints and writes the run directory, which resumes with any number of ranks.

    torchrun --standalone --nproc-per-node 2 -m formal_transformers train --text FILE --out runs/x --threads 1
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import sys
import sysconfig
import time

import numpy as np

from . import _core, io
from ._distributed import ReplicaFailure, find_group
from .training import DTraining

DEFAULT_CHARS = 1_000_000


class RunError(Exception):
    """A problem with the command's input (a damaged run directory, an option the model refuses): main prints
    it as argparse prints a bad argument — one line naming the problem, exit code 2, no traceback."""


def default_text(limit: int = DEFAULT_CHARS) -> str:
    """The Python standard library's own source (top-level modules, sorted by name), up to `limit` chars."""
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    parts, total = [], 0
    for path in sorted(stdlib.glob("*.py")):
        try:
            src = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        parts.append(src)
        total += len(src)
        if total >= limit:
            break
    if not parts:
        raise RuntimeError(f"no Python sources found under {stdlib}")
    return "".join(parts)[:limit]


def load_text(spec: str) -> tuple[str, str]:
    if spec == "stdlib":
        return default_text(), f"the Python {sys.version.split()[0]} standard library's source"
    p = pathlib.Path(spec)
    if not p.is_file():
        raise RunError(f"--text {spec}: no such file")
    return p.read_text(encoding="utf-8", errors="replace"), str(p)


def make_tokenizer(kind: str, text: str, vocab: int):
    if kind == "char":
        return _core.CharTokenizer.fit(text, unk=True)
    if kind == "bpe":
        return _core.BPETokenizer.train(text, vocab)
    raise RunError(f"--tokenizer must be char or bpe, got {kind}")


def split_sequences(ids: np.ndarray, l_max: int, val_frac: float):
    """First (1 − val_frac) of the tokens for training, the rest for validation, each cut into disjoint
    sequences of l_max tokens (ft.chunk); a too-short last piece is dropped."""
    n_train = int(len(ids) * (1 - val_frac))
    def pieces(a):
        return [c for c in _core.chunk(a, l_max) if len(c) == l_max]
    return pieces(ids[:n_train]), pieces(ids[n_train:])


def _print(*a):
    print(*a, flush=True)


def _quiet(*a):
    pass


_say = _print


def train(args) -> pathlib.Path:
    """`train`: a new run in args.out, or --resume of the one there. Stages: the process group, the run's start
    (_start_run: tokenizer, model, state), the data, the trainer (_make_trainer), training, the save and report
    (_finish_run)."""
    out = pathlib.Path(args.out)
    # data parallel under torchrun: the process group (gloo) now, so that only rank 0 prints and writes
    dist, group = find_group(None, getattr(args, "dist_timeout", 300.0))
    rank = dist.get_rank(group) if dist is not None else 0
    world = dist.get_world_size(group) if dist is not None else 1
    say = _print if rank == 0 else _quiet
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    if args.threads:
        _core.set_num_threads(args.threads)
    text, source = load_text(args.text)
    start = _start_run(args, out, text, say)
    if start is None:
        return out
    tok, model, state, done, early = start
    _set_precision(model, args)
    ids = tok.encode(text, bos=False, eos=False)
    train_seqs, val_seqs = split_sequences(ids, model.l_max, args.val_frac)
    if not train_seqs:
        raise RunError("the text is too short for one training sequence")
    say(f"text: {source} ({len(text):,} chars, {len(ids):,} tokens, vocabulary {tok.n_vocab})")
    say(f"model: {model!r}")
    say(f"       {model.n_params:,} parameters; {len(train_seqs):,} training and {len(val_seqs):,} validation "
        f"sequences of {model.l_max} tokens; {_core.get_num_threads()} threads"
        + (f" × {world} data-parallel ranks (each minibatch of {args.batch} split across them)" if world > 1 else ""))
    if (args.patience is not None or args.restore_best) and not val_seqs[: args.val_seqs]:
        raise RunError("--patience and --restore-best need validation data (--val-frac > 0)")
    if early is not None and args.restore_best and early.get("best_step") is not None and early.get("best_params") is None:
        raise RunError("--restore-best: the run so far kept no best parameters (it ran without --restore-best)")
    steps_left = args.steps - done
    if steps_left <= 0:
        say(f"nothing to do: {done} of {args.steps} steps already done")
        return out
    opt = _core.Adam(args.lr, 0.9, 0.99, 1e-8, args.weight_decay, True)
    if args.resume and (out / "optimizer.safetensors").exists():
        _load_optimizer(out / "optimizer.safetensors", opt, model)
    trainer = _make_trainer(args, opt, train_seqs, val_seqs, done, steps_left, early, out)
    t0 = time.perf_counter()
    if getattr(args, "save_every", 0) and rank == 0:  # a checkpoint every save_every steps, for a run that dies
        trainer._on_step = _checkpoint_every(args.save_every, out, model, tok, opt, state, done, source, args, t0)
    interrupted = False
    failure = None
    try:
        trainer(train_seqs, model)
    except KeyboardInterrupt:
        interrupted = True
    except FloatingPointError as e:  # a non-finite step: not applied; save the run up to the step before
        failure = e
    except ReplicaFailure as e:  # another rank died or hung: this one holds θ after its last completed step
        failure = e
    elapsed = time.perf_counter() - t0
    # save what resuming and sampling need (rank 0: the ranks hold the same θ)
    if rank == 0:
        _save_run(out, model, tok, opt, state, trainer.history, done, source, args, elapsed, trainer.early_stopping)
    _report(args, trainer.history, elapsed, out, say)
    if interrupted:
        say("interrupted: resume with --resume")
        raise SystemExit(130)
    if failure is not None:
        raise SystemExit(f"error: {failure}")
    return out


def _start_run(args, out: pathlib.Path, text: str, say):
    """(tokenizer, model, run state, steps done, early stopping's state) of a new run, or of the run in `out`
    with --resume; None when a resumed run has nothing left to do (it stopped early)."""
    if not args.resume:
        tok = make_tokenizer(args.tokenizer, text, args.vocab)
        model = io.build_model({
            "arch": "DTransformer", "n_vocab": tok.n_vocab, "l_max": args.context + 1, "L": args.layers,
            "H": args.heads, "d_e": args.d_e, "d_mlp": args.d_mlp, "seed": args.seed,
            "dropout": getattr(args, "dropout", 0.0)}, dtype=getattr(args, "dtype", "float32"))
        return tok, model, {"history": {}}, 0, None
    if not (out / "model.safetensors").is_file():
        raise RunError(f"--resume: {out} holds no model.safetensors, so there is no run to resume (nothing was "
                       "changed; drop --resume to start a new run there)")
    tok, model = _load_run(out)
    state = _load_run_state(out)
    done = state["steps_done"]
    saved_at = io.read_metadata(out / "model.safetensors").get("formal_transformers.steps_done")
    if saved_at is not None and int(saved_at) != done:
        raise SystemExit(f"error: {out}: model.safetensors holds step {saved_at} but run.json step {done}: "
                         "the checkpoint was cut off while being written; restore both from one save")
    early = _load_early_stopping(out, state, model)  # early stopping's state to resume from (docs/early_stopping.md)
    if early is not None and early.get("stopped"):
        say(f"nothing to do: the run stopped early at step {done} (best validation loss "
            f"{early['best_val_loss']:.4f} at step {early['best_step']})")
        return None
    say(f"resuming {out} after step {done}")
    return tok, model, state, done, early


def _make_trainer(args, opt, train_seqs, val_seqs, done: int, steps_left: int, early, out: pathlib.Path) -> DTraining:
    """The run's DTraining: Adam, a cosine schedule with warmup that continues where a resumed run stopped,
    clipping at 1, the mean loss per token, early stopping's options (and its resumed counters)."""
    per_epoch = math.ceil(len(train_seqs) / args.batch)
    trainer = DTraining(
        n_epochs=math.ceil(args.steps / per_epoch) + 1, eta=args.lr, optimizer=opt, batch_size=args.batch,
        seed=args.seed + done, reduction="mean", schedule="cosine", warmup=args.warmup, min_lr=args.min_lr,
        clip=1.0, max_steps=steps_left, eval_every=args.eval_every, val_data=val_seqs[: args.val_seqs] or None,
        start_step=done, progress=not args.quiet, nonfinite=getattr(args, "nonfinite", "raise"),
        patience=args.patience, min_delta=args.min_delta, restore_best=args.restore_best,
        dist_timeout=getattr(args, "dist_timeout", 300.0), trainable=getattr(args, "trainable", None),
    )
    if early is not None:
        try:
            trainer.early_stopping = early  # the counters (and θ*) go on
        except (ValueError, TypeError) as e:
            raise RunError(f"{out / 'run.json'}: damaged early_stopping state ({e})") from None
    return trainer


def _checkpoint_every(save_every: int, out: pathlib.Path, model, tok, opt, state: dict, done: int, source: str,
                      args, t0: float):
    """The trainer's step hook that saves the run every save_every steps (the history so far with it)."""
    rows: list = []

    def on_step(info):
        rows.append(dict(info, time=time.perf_counter() - t0))
        if info["step"] % save_every == 0:
            part = {k: [r[k] for r in rows] for k in ("step", "epoch", "loss", "lr", "grad_norm", "tokens",
                                                       "time", "skipped")}
            vals = [r for r in rows if r["val_loss"] is not None]
            part.update(val_step=[r["step"] for r in vals], val_loss=[r["val_loss"] for r in vals],
                        val_accuracy=[r["val_accuracy"] for r in vals])
            _save_run(out, model, tok, opt, json.loads(json.dumps(state)), part, done, source, args,
                      time.perf_counter() - t0, None)

    return on_step


def _report(args, h: dict, elapsed: float, out: pathlib.Path, say) -> None:
    """The run's last lines: steps, time, the last losses, early stopping's outcome, where it was saved."""
    ms = 1000 * elapsed / max(1, len(h["step"]))
    last_val = f", validation loss {h['val_loss'][-1]:.4f}" if h["val_loss"] else ""
    say(f"trained {len(h['step'])} steps in {elapsed:.1f} s ({ms:.1f} ms/step); "
        f"loss {h['loss'][-1]:.4f}{last_val} (nats per token)" if h["step"] else "no step done")
    if h["best_val_loss"] is not None and (args.patience is not None or args.restore_best):
        why = f"stopped early: {args.patience} evaluations without improvement; " if h["stopped_early"] else ""
        kept = "; the saved model has its parameters" if h["restored_best"] else ""
        say(f"{why}best validation loss {h['best_val_loss']:.4f} at step {h['best_step']}{kept}")
    say(f"saved to {out}/")


def _save_run(out: pathlib.Path, model, tok, opt, state: dict, h, done: int, source: str, args, elapsed: float,
              early) -> None:
    """Write the run directory: the model (with its step count, to catch a cut-off save), the tokenizer,
    Adam's state, early stopping's, and run.json (the history h of this part appended to the saved one) last."""
    steps_now = done + (int(h["step"][-1]) if h["step"] else 0)
    io.save(model, out / "model.safetensors", metadata={"formal_transformers.steps_done": steps_now})
    io._replace_atomically(out / "tokenizer.json", lambda tmp: tok.save(tmp))
    sd = opt.state_dict()
    if sd["t"]:
        from safetensors.numpy import save_file

        opt_state = {"t": np.array([sd["t"]], dtype=np.int64), "m": sd["m"], "v": sd["v"], "ranges": sd["ranges"]}
        io._replace_atomically(out / "optimizer.safetensors", lambda tmp: save_file(opt_state, tmp))
    hist = state.get("history", {})
    for k in h.KEYS if hasattr(h, "KEYS") else h:  # steps numbered over the whole run, across resumptions
        hist.setdefault(k, []).extend(float(x) + (done if k in ("step", "val_step") else 0) for x in h[k])
    state.update(
        steps_done=steps_now, text=source, tokenizer=type(tok).__name__, args=vars(args), history=hist,
        seconds=state.get("seconds", 0.0) + elapsed,
    )
    _save_early_stopping(out, state, early, done)
    io._replace_atomically(out / "run.json", lambda tmp: pathlib.Path(tmp).write_text(json.dumps(state)))


EARLY_FILE = "early_stopping.safetensors"


def _save_early_stopping(out: pathlib.Path, state: dict, early, done: int):
    """Early stopping's counters into run.json's state (best_step over the whole run), θ* and, when the
    model holds the restored best, the last step's θ into early_stopping.safetensors."""
    path = out / EARLY_FILE
    if early is None or "stopped" not in early:
        return  # no training call ran: what was saved before stays
    state["early_stopping"] = {
        "best_val_loss": early["best_val_loss"],
        "best_step": early["best_step"],  # counted from the run's start (the trainer's start_step = done)
        "bad_evals": int(early["bad_evals"]), "stopped": bool(early["stopped"]), "restored": bool(early["restored"]),
    }
    tensors = {}
    for prefix, params in (("best.", early.get("best_params")), ("last.", early.get("last_params"))):
        for k, v in (params or {}).items():
            tensors[prefix + k] = np.ascontiguousarray(v)
    if tensors:
        from safetensors.numpy import save_file

        io._replace_atomically(path, lambda tmp: save_file(tensors, tmp))
    elif path.exists():
        path.unlink()


def _load_early_stopping(out: pathlib.Path, state: dict, model):
    """The state _save_early_stopping wrote, for the trainer (best_step counted from this part's start);
    the model goes back to the last step's θ when it holds a restored best. None: nothing saved."""
    saved = state.get("early_stopping")
    if saved is None:
        return None
    early = dict(saved)
    early["best_params"] = None
    if (out / EARLY_FILE).exists():
        t = _read_tensors(out / EARLY_FILE)
        best = {k[5:]: v for k, v in t.items() if k.startswith("best.")}
        last = {k[5:]: v for k, v in t.items() if k.startswith("last.")}
        for what, params in (("best", best), ("last", last)):
            shapes = {k: tuple(np.shape(v)) for k, v in model.params.items()}
            if params and {k: tuple(v.shape) for k, v in params.items()} != shapes:
                raise RunError(f"{out / EARLY_FILE}: its {what} parameters do not match the model's names and shapes")
        early["best_params"] = best or None
        if last:
            try:
                model.params.update(last)  # resume from the last step, not from the restored best
            except (ValueError, TypeError, KeyError) as e:
                raise RunError(f"{out / EARLY_FILE}: its last step's parameters do not fit the model ({e})") from None
    return early


# Reading a run directory back (--resume, sample): every file checked, a damaged one is a RunError naming it

def _read_tensors(path: pathlib.Path) -> dict:
    from safetensors.numpy import load_file

    try:
        return load_file(str(path))
    except Exception as e:  # safetensors raises its own error types for damaged files
        raise RunError(f"{path}: not a readable safetensors file ({type(e).__name__}: {e})") from None


def _set_precision(model, args) -> None:
    """--precision: how the model's products run (bf16-mixed: bf16 operands, float32 accumulation and θ)."""
    precision = getattr(args, "precision", "float32")
    if precision != "float32":
        try:
            model.precision = precision
        except ValueError as e:  # a float64 run
            raise RunError(f"--precision {precision}: {e}") from None


def _load_run(run: pathlib.Path):
    """(tokenizer, model) of a run directory: a DTransformer whose vocabulary is the tokenizer's."""
    tok = _load_tokenizer(run)
    path = run / "model.safetensors"
    try:
        model = io.load(path)
    except (ValueError, TypeError, OSError) as e:
        raise RunError(str(e) if str(path) in str(e) else f"{path}: {e}") from None
    if not isinstance(model, _core.DTransformer):
        raise RunError(f"{path}: holds a {type(model).__name__}; a run trains a DTransformer")
    if model.n_vocab != tok.n_vocab:
        raise RunError(f"{run}: the model's vocabulary ({model.n_vocab}) is not the tokenizer's ({tok.n_vocab})")
    return tok, model


def _load_run_state(run: pathlib.Path) -> dict:
    """run.json: a JSON object with steps_done (int ≥ 0), history (lists by name) and early_stopping (an object
    or absent)."""
    path = run / "run.json"
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise RunError(f"{path}: not a readable run state ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict):
        raise RunError(f"{path}: not a run state (a JSON object), got {type(state).__name__}")
    done = state.get("steps_done")
    if isinstance(done, bool) or not isinstance(done, int) or done < 0:
        raise RunError(f"{path}: steps_done = {done!r} is not a step count")
    hist = state.get("history", {})
    if not isinstance(hist, dict) or not all(isinstance(v, list) for v in hist.values()):
        raise RunError(f"{path}: history is not an object of lists")
    if not isinstance(state.get("early_stopping", {}), (dict, type(None))):
        raise RunError(f"{path}: early_stopping is not an object")
    if not isinstance(state.get("seconds", 0.0), (int, float)) or isinstance(state.get("seconds"), bool):
        raise RunError(f"{path}: seconds is not a number")
    return state


def _load_optimizer(path: pathlib.Path, opt, model) -> None:
    st = _read_tensors(path)
    try:
        t = st["t"]
        if t.shape != (1,) or not np.issubdtype(t.dtype, np.integer):
            raise ValueError(f"t must hold one integer step count, got shape {t.shape}, dtype {t.dtype}")
        state = {"t": int(t[0]), "m": st["m"], "v": st["v"]}
        if "ranges" in st:  # the parameters the moments cover (--trainable); older runs: every trainable one
            state["ranges"] = st["ranges"]
        opt.load_state_dict(model, state)
    except KeyError as e:
        raise RunError(f"{path}: no tensor {e} (an optimizer state holds t, m and v)") from None
    except (ValueError, TypeError, IndexError) as e:
        raise RunError(f"{path}: an optimizer state that does not fit the model ({e})") from None


def _load_tokenizer(run: pathlib.Path):
    path = run / "tokenizer.json"
    try:
        kind = json.loads(path.read_text(encoding="utf-8")).get("type", "")
    except (OSError, ValueError, AttributeError, RecursionError) as e:
        raise RunError(f"{path}: not a tokenizer file ({type(e).__name__}: {e})") from None
    cls = {"char": _core.CharTokenizer, "word": _core.WordTokenizer, "bpe": _core.BPETokenizer}.get(kind) \
        if isinstance(kind, str) else None
    if cls is None:
        raise RunError(f"{path}: not a tokenizer file (type {kind!r})")
    try:
        return cls.load(str(path))
    except (ValueError, TypeError, OSError) as e:
        raise RunError(f"{path}: {e}") from None


def sample(args) -> list[str]:
    run = pathlib.Path(args.run)
    if not (run / "model.safetensors").is_file():
        raise RunError(f"{run}: no model.safetensors (train first)")
    if args.threads:
        _core.set_num_threads(args.threads)
    tok, model = _load_run(run)
    _set_precision(model, args)
    prompt = args.prompt if args.prompt is not None else "\n"
    ids = tok.encode(prompt, bos=False, eos=False)[-model.l_max :]
    if len(ids) == 0:
        ids = tok.encode("\n", bos=False, eos=False)
    out = []
    for k in range(args.samples):
        seed = None if args.seed is None else args.seed + k
        t0 = time.perf_counter()
        y = _core.DInference(args.tokens, args.tau, top_k=args.top_k, seed=seed, cache=not args.no_cache)(ids, model)
        dt = time.perf_counter() - t0
        text = prompt + tok.decode(y)
        out.append(text)
        _say(f"--- sample {k + 1} (tau={args.tau}, {args.tokens} tokens in {dt:.2f} s, "
             f"{1000 * dt / max(1, args.tokens):.2f} ms/token) ---")
        _say(text)
    return out


def demo(args):
    """Train on the default text (or --text) and print samples."""
    args.out = args.out or "runs/demo"
    run = train(args)
    if int(os.environ.get("RANK", "0")) != 0:
        return  # data parallel (torchrun): rank 0 alone samples
    ns = argparse.Namespace(run=run, prompt=args.prompt, tokens=args.tokens, tau=args.tau, top_k=args.top_k,
                            seed=args.seed, samples=args.samples, no_cache=False, threads=0)
    sample(ns)


def _int_at_least(lo: int, hi: int = 2**31 - 1):
    """An argparse type: an integer in [lo, hi] (argparse's own error, exit code 2, otherwise; hi: the core's
    sizes and seeds are C++ ints)."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be an integer in [{lo}, {hi}], got {v}")
        return v
    parse.__name__ = "int"
    return parse


def _real_in(lo: float, hi: float = math.inf, *, lo_open: bool = False, hi_open: bool = False):
    """An argparse type: a finite real in the interval from lo to hi (open ends where asked)."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
        if not math.isfinite(v) or v < lo or v > hi or (lo_open and v == lo) or (hi_open and v == hi):
            span = ("(" if lo_open else "[") + f"{lo:g}, {hi:g}" + (")" if hi_open or hi == math.inf else "]")
            raise argparse.ArgumentTypeError(f"must be a finite number in {span}, got {text}")
        return v
    parse.__name__ = "float"
    return parse


def _precision_arg(p: argparse.ArgumentParser) -> None:
    """--precision (train and sample; demo has both): how the model's matrix products run."""
    if "--precision" not in p._option_string_actions:
        p.add_argument("--precision", default="float32", choices=["float32", "bf16-mixed"],
                       help="bf16-mixed: bf16 matrix products with float32 accumulation and float32 weights "
                            "(float32 models; sampling reads a bf16 copy of the weights)")


def _train_args(p: argparse.ArgumentParser, steps: int, lr: float = 1e-3):
    p.add_argument("--text", default="stdlib", help="a UTF-8 text file, or 'stdlib' (default): Python's own source")
    p.add_argument("--out", default=None, help="run directory (default runs/demo for demo)")
    p.add_argument("--tokenizer", default="char", choices=["char", "bpe"])
    p.add_argument("--vocab", type=_int_at_least(1), default=512, help="BPE vocabulary size")
    p.add_argument("--context", type=_int_at_least(2), default=64,
                   help="tokens of context, at least 2 (l_max = context + 1)")
    p.add_argument("--layers", type=_int_at_least(1), default=4)
    p.add_argument("--heads", type=_int_at_least(1), default=4)
    p.add_argument("--d-e", type=_int_at_least(1), default=128)
    p.add_argument("--d-mlp", type=_int_at_least(1), default=512)
    p.add_argument("--batch", type=_int_at_least(1), default=12, help="sequences per step (split across data-parallel ranks)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"], help="the model's number type")
    _precision_arg(p)
    p.add_argument("--steps", type=_int_at_least(0), default=steps, help="total optimizer steps")
    p.add_argument("--lr", type=_real_in(0, lo_open=True), default=lr, help=f"peak learning rate (default {lr:g})")
    p.add_argument("--min-lr", type=_real_in(0), default=1e-4)
    p.add_argument("--warmup", type=_int_at_least(0), default=100)
    p.add_argument("--weight-decay", type=_real_in(0), default=0.0)
    p.add_argument("--dropout", type=_real_in(0, 1, hi_open=True), default=0.0,
                   help="dropout rate (docs/regularisation.md; a resumed run keeps the model's own rates)")
    p.add_argument("--nonfinite", default="raise", choices=["raise", "warn", "skip"],
                   help="a step with a NaN/inf loss or gradient norm: stop (default; the run keeps the step "
                        "before it) or skip it (warn: with a warning)")
    p.add_argument("--eval-every", type=_int_at_least(0), default=250)
    p.add_argument("--patience", type=_int_at_least(1), default=None,
                   help="early stopping: stop after this many evaluations without a lower validation loss")
    p.add_argument("--min-delta", type=_real_in(0), default=0.0, help="an improvement must lower the best by more")
    p.add_argument("--restore-best", action="store_true",
                   help="save the parameters of the best evaluation (the last step's are kept for --resume)")
    p.add_argument("--val-frac", type=_real_in(0, 1, hi_open=True), default=0.1)
    p.add_argument("--val-seqs", type=_int_at_least(1), default=500,
                   help="validation sequences used per evaluation (the first of the held-out split; 500 × 64 "
                        "tokens keep the demo's six evaluations to about 3 s)")
    p.add_argument("--trainable", nargs="+", default=None, metavar="PATTERN",
                   help="train only these parameters (names or glob patterns, e.g. '*gamma*' W_e); the others stay "
                        "frozen (default: all). Recorded in run.json's args")
    p.add_argument("--seed", type=_int_at_least(0), default=0)
    p.add_argument("--threads", type=_int_at_least(0), default=0, help="0: all cores")
    p.add_argument("--resume", action="store_true", help="continue the run in --out (with any number of ranks)")
    p.add_argument("--save-every", type=_int_at_least(0), default=0,
                   help="also save the run every this many steps (0: at the end only), e.g. for a data-parallel run "
                        "that a failing rank may end")
    p.add_argument("--dist-timeout", type=_real_in(0, lo_open=True), default=300.0,
                   help="under torchrun: seconds a rank waits for the others before the run stops with an error")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _sample_args(p: argparse.ArgumentParser):
    p.add_argument("--prompt", default=None)
    _precision_arg(p)
    p.add_argument("--tokens", type=_int_at_least(1), default=400)
    p.add_argument("--tau", type=_real_in(0, lo_open=True), default=0.8)
    p.add_argument("--top-k", type=_int_at_least(1), default=None)
    p.add_argument("--samples", type=_int_at_least(1), default=2)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m formal_transformers", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("demo", help="train a small GPT on a text and print samples (the README's first command)")
    # the demo's baby GPT learns faster at η 4e-3 than nanoGPT's 1e-3 in its 1500 steps (docs/benchmarks.md: the
    # demo's two runs and the tiny-Shakespeare sweep of bench_shakespeare.py)
    _train_args(p, steps=1500, lr=4e-3)
    _sample_args(p)
    p = sub.add_parser("train", help="train (or --resume) a DTransformer on a text")
    _train_args(p, steps=2000)
    p = sub.add_parser("sample", help="sample from a trained run")
    p.add_argument("--run", required=True)
    _sample_args(p)
    p.add_argument("--seed", type=_int_at_least(0), default=None)
    p.add_argument("--no-cache", action="store_true", help="run Algorithm 14 literally (no KV cache)")
    p.add_argument("--threads", type=_int_at_least(0), default=0)
    args = ap.parse_args(argv)
    if args.cmd == "train" and args.out is None:
        ap.error("train needs --out DIR")
    try:
        if args.cmd == "demo":
            demo(args)
        elif args.cmd == "train":
            train(args)
        else:
            sample(args)
    except (RunError, ValueError) as e:  # ValueError: an option combination the model or trainer refuses (e.g.
        # --heads not dividing --d-e), named in its message
        ap.exit(2, f"{ap.prog} {args.cmd}: error: {_one_line(str(e))}\n")
    return 0


def _one_line(msg: str) -> str:
    return " ".join(line.strip() for line in msg.splitlines() if line.strip())
