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
model.safetensors holds the restored best: what --resume continues from).
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
from .training import DTraining

DEFAULT_CHARS = 1_000_000


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
        raise SystemExit(f"error: --text {spec}: no such file")
    return p.read_text(encoding="utf-8", errors="replace"), str(p)


def make_tokenizer(kind: str, text: str, vocab: int):
    if kind == "char":
        return _core.CharTokenizer.fit(text, unk=True)
    if kind == "bpe":
        return _core.BPETokenizer.train(text, vocab)
    raise SystemExit(f"error: --tokenizer must be char or bpe, got {kind}")


def split_sequences(ids: np.ndarray, l_max: int, val_frac: float):
    """First (1 − val_frac) of the tokens for training, the rest for validation, each cut into disjoint
    sequences of l_max tokens (ft.chunk); a too-short last piece is dropped."""
    n_train = int(len(ids) * (1 - val_frac))
    def pieces(a):
        return [c for c in _core.chunk(a, l_max) if len(c) == l_max]
    return pieces(ids[:n_train]), pieces(ids[n_train:])


def _say(*a):
    print(*a, flush=True)


def train(args) -> pathlib.Path:
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.threads:
        _core.set_num_threads(args.threads)
    resume = args.resume and (out / "model.safetensors").exists()
    text, source = load_text(args.text)
    early = None  # early stopping's state to resume from (docs/early_stopping.md)
    if resume:
        tok = _load_tokenizer(out)
        model = io.load(out / "model.safetensors")
        state = json.loads((out / "run.json").read_text())
        done = state["steps_done"]
        early = _load_early_stopping(out, state, model)
        if early is not None and early.get("stopped"):
            _say(f"nothing to do: the run stopped early at step {done} (best validation loss "
                 f"{early['best_val_loss']:.4f} at step {early['best_step']})")
            return out
        _say(f"resuming {out} after step {done}")
    else:
        tok = make_tokenizer(args.tokenizer, text, args.vocab)
        model = io.build_model({
            "arch": "DTransformer", "n_vocab": tok.n_vocab, "l_max": args.context + 1, "L": args.layers,
            "H": args.heads, "d_e": args.d_e, "d_mlp": args.d_mlp, "seed": args.seed,
            "dropout": getattr(args, "dropout", 0.0)})
        done = 0
        state = {"history": {}}
    ids = tok.encode(text, bos=False, eos=False)
    train_seqs, val_seqs = split_sequences(ids, model.l_max, args.val_frac)
    if not train_seqs:
        raise SystemExit("error: the text is too short for one training sequence")
    _say(f"text: {source} ({len(text):,} chars, {len(ids):,} tokens, vocabulary {tok.n_vocab})")
    _say(f"model: {model!r}")
    _say(f"       {model.n_params:,} parameters; {len(train_seqs):,} training and {len(val_seqs):,} validation "
         f"sequences of {model.l_max} tokens; {_core.get_num_threads()} threads")
    if (args.patience is not None or args.restore_best) and not val_seqs[: args.val_seqs]:
        raise SystemExit("error: --patience and --restore-best need validation data (--val-frac > 0)")
    if early is not None and args.restore_best and early.get("best_step") is not None and early.get("best_params") is None:
        raise SystemExit("error: --restore-best: the run so far kept no best parameters (it ran without "
                         "--restore-best)")
    steps_left = args.steps - done
    if steps_left <= 0:
        _say(f"nothing to do: {done} of {args.steps} steps already done")
        return out
    opt = _core.Adam(args.lr, 0.9, 0.99, 1e-8, args.weight_decay, True)
    if resume and (out / "optimizer.safetensors").exists():
        from safetensors.numpy import load_file

        st = load_file(out / "optimizer.safetensors")
        opt.load_state_dict(model, {"t": int(st["t"][0]), "m": st["m"], "v": st["v"]})
    per_epoch = math.ceil(len(train_seqs) / args.batch)
    trainer = DTraining(
        n_epochs=math.ceil(args.steps / per_epoch) + 1, eta=args.lr, optimizer=opt, batch_size=args.batch,
        seed=args.seed + done, reduction="mean", schedule="cosine", warmup=args.warmup, min_lr=args.min_lr,
        clip=1.0, max_steps=steps_left, eval_every=args.eval_every, val_data=val_seqs[: args.val_seqs] or None,
        start_step=done, progress=not args.quiet, nonfinite=getattr(args, "nonfinite", "raise"),  # the schedule continues where it stopped
        patience=args.patience, min_delta=args.min_delta, restore_best=args.restore_best,
    )
    if early is not None:
        trainer.early_stopping = early  # the counters (and θ*) go on
    t0 = time.perf_counter()
    interrupted = False
    failure = None
    try:
        trainer(train_seqs, model)
    except KeyboardInterrupt:
        interrupted = True
    except FloatingPointError as e:  # a non-finite step: not applied; save the run up to the step before
        failure = e
    elapsed = time.perf_counter() - t0
    h = trainer.history
    steps_now = done + (h["step"][-1] if h["step"] else 0)
    # save what resuming and sampling need
    io.save(model, out / "model.safetensors")
    tok.save(str(out / "tokenizer.json"))
    sd = opt.state_dict()
    if sd["t"]:
        from safetensors.numpy import save_file

        save_file({"t": np.array([sd["t"]], dtype=np.int64), "m": sd["m"], "v": sd["v"]}, str(out / "optimizer.safetensors"))
    hist = state.get("history", {})
    for k in h.KEYS:  # steps numbered over the whole run, across resumptions
        hist.setdefault(k, []).extend(float(x) + (done if k in ("step", "val_step") else 0) for x in h[k])
    state.update(
        steps_done=steps_now, text=source, tokenizer=type(tok).__name__, args=vars(args), history=hist,
        seconds=state.get("seconds", 0.0) + elapsed,
    )
    _save_early_stopping(out, state, trainer.early_stopping, done)
    (out / "run.json").write_text(json.dumps(state))
    ms = 1000 * elapsed / max(1, len(h["step"]))
    last_val = f", validation loss {h['val_loss'][-1]:.4f}" if h["val_loss"] else ""
    _say(f"trained {len(h['step'])} steps in {elapsed:.1f} s ({ms:.1f} ms/step); "
         f"loss {h['loss'][-1]:.4f}{last_val} (nats per token)" if h["step"] else "no step done")
    if h["best_val_loss"] is not None and (args.patience is not None or args.restore_best):
        why = f"stopped early: {args.patience} evaluations without improvement; " if h["stopped_early"] else ""
        kept = "; the saved model has its parameters" if h["restored_best"] else ""
        _say(f"{why}best validation loss {h['best_val_loss']:.4f} at step {h['best_step']}{kept}")
    _say(f"saved to {out}/")
    if interrupted:
        _say("interrupted: resume with --resume")
        raise SystemExit(130)
    if failure is not None:
        raise SystemExit(f"error: {failure}")
    return out


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

        save_file(tensors, str(path) + ".tmp")
        os.replace(str(path) + ".tmp", path)
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
        from safetensors.numpy import load_file

        t = load_file(out / EARLY_FILE)
        best = {k[5:]: v for k, v in t.items() if k.startswith("best.")}
        last = {k[5:]: v for k, v in t.items() if k.startswith("last.")}
        early["best_params"] = best or None
        if last:
            model.params.update(last)  # resume from the last step, not from the restored best
    return early


def _load_tokenizer(run: pathlib.Path):
    path = run / "tokenizer.json"
    try:
        kind = json.loads(path.read_text()).get("type", "")
    except (OSError, ValueError, AttributeError) as e:
        raise SystemExit(f"error: {path}: not a tokenizer file ({e})") from None
    cls = {"char": _core.CharTokenizer, "word": _core.WordTokenizer, "bpe": _core.BPETokenizer}.get(kind)
    if cls is None:
        raise SystemExit(f"error: {path}: not a tokenizer file (type {kind!r})")
    try:
        return cls.load(str(path))
    except ValueError as e:
        raise SystemExit(f"error: {path}: {e}") from None


def sample(args) -> list[str]:
    run = pathlib.Path(args.run)
    if not (run / "model.safetensors").exists():
        raise SystemExit(f"error: {run}: no model.safetensors (train first)")
    if args.threads:
        _core.set_num_threads(args.threads)
    model = io.load(run / "model.safetensors")
    tok = _load_tokenizer(run)
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
    ns = argparse.Namespace(run=run, prompt=args.prompt, tokens=args.tokens, tau=args.tau, top_k=args.top_k,
                            seed=args.seed, samples=args.samples, no_cache=False, threads=0)
    sample(ns)


def _train_args(p: argparse.ArgumentParser, steps: int, lr: float = 1e-3):
    p.add_argument("--text", default="stdlib", help="a UTF-8 text file, or 'stdlib' (default): Python's own source")
    p.add_argument("--out", default=None, help="run directory (default runs/demo for demo)")
    p.add_argument("--tokenizer", default="char", choices=["char", "bpe"])
    p.add_argument("--vocab", type=int, default=512, help="BPE vocabulary size")
    p.add_argument("--context", type=int, default=64, help="tokens of context (l_max = context + 1)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-e", type=int, default=128)
    p.add_argument("--d-mlp", type=int, default=512)
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--steps", type=int, default=steps, help="total optimizer steps")
    p.add_argument("--lr", type=float, default=lr, help=f"peak learning rate (default {lr:g})")
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--dropout", type=float, default=0.0,
                   help="dropout rate (docs/regularisation.md; a resumed run keeps the model's own rates)")
    p.add_argument("--nonfinite", default="raise", choices=["raise", "warn", "skip"],
                   help="a step with a NaN/inf loss or gradient norm: stop (default; the run keeps the step "
                        "before it) or skip it (warn: with a warning)")
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--patience", type=int, default=None,
                   help="early stopping: stop after this many evaluations without a lower validation loss")
    p.add_argument("--min-delta", type=float, default=0.0, help="an improvement must lower the best by more")
    p.add_argument("--restore-best", action="store_true",
                   help="save the parameters of the best evaluation (the last step's are kept for --resume)")
    p.add_argument("--val-frac", type=float, default=0.1)
    p.add_argument("--val-seqs", type=int, default=500,
                   help="validation sequences used per evaluation (the first of the held-out split; 500 × 64 "
                        "tokens keep the demo's six evaluations to about 3 s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="0: all cores")
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _sample_args(p: argparse.ArgumentParser):
    p.add_argument("--prompt", default=None)
    p.add_argument("--tokens", type=int, default=400)
    p.add_argument("--tau", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--samples", type=int, default=2)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m formal_transformers", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("demo", help="train a small GPT on a text and print samples (the README's first command)")
    # the demo's baby GPT learns faster at η 4e-3 than nanoGPT's 1e-3 in its 1500 steps (validation 1.5738 against
    # 1.6394 nats per token on the standard library's source; the tiny-Shakespeare sweep in bench_shakespeare.py)
    _train_args(p, steps=1500, lr=4e-3)
    _sample_args(p)
    p = sub.add_parser("train", help="train (or --resume) a DTransformer on a text")
    _train_args(p, steps=2000)
    p = sub.add_parser("sample", help="sample from a trained run")
    p.add_argument("--run", required=True)
    _sample_args(p)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--no-cache", action="store_true", help="run Algorithm 14 literally (no KV cache)")
    p.add_argument("--threads", type=int, default=0)
    args = ap.parse_args(argv)
    if args.cmd == "demo":
        demo(args)
    elif args.cmd == "train":
        if args.out is None:
            ap.error("train needs --out DIR")
        train(args)
    else:
        sample(args)
    return 0
