"""Notebook 18's training run (not a test) for several seeds of θ: the held-out CER's spread over the draw of θ.

The model, data, trainer and decoding of notebooks/18_whisper_speech.ipynb (full form: 12 training voices × rates ×
pitches, 20 epochs of ft.EDTraining, greedy ft.EDInference on the 4 held-out voices); only `seed=` of the model
changes (the trainer's seed, the batches' order, stays 0 as in the notebook). Each run takes ~40 s of one core.

    FT_CORE_PATH=build/dev PYTHONPATH=python python bench/whisper_notebook_seeds.py 0 1 2 3 4 5 6 7

docs/notebooks.md (notebook 18) gives the figures of both codes: this one, and the former ft.Whisper class's
(commit 7eae650, the same loop in Python; equal losses and gradients for equal θ)."""
from __future__ import annotations

import sys
import time

import numpy as np

import formal_transformers as ft
from formal_transformers import speech


def run(seed: int, train: dict, test: dict, epochs: int = 20) -> tuple:
    codec = speech.CharCodec()
    model = ft.EDTransformer(n_mels=40, n_audio_ctx=50, n_vocab=codec.n_vocab, l_max=8, L_enc=2, L_dec=2, H=4, d_e=64,
                             d_mlp=128, block="pre_ln", mlp="gelu", tied=True, bos_id=codec.start, eos_id=codec.eos,
                             seed=seed)
    t0 = time.perf_counter()
    ft.EDTraining(epochs, 2e-3, batch_size=32, reduction="mean", seed=0, progress=False)(
        train["features"], [codec.encode(w) for w in train["text"]], model)
    hyp = [codec.decode(t) for t in speech.transcribe(model, test["features"])]
    return speech.cer(hyp, test["text"]), time.perf_counter() - t0


def main(seeds) -> None:
    train = speech.speech_dataset(speech.TRAIN_VOICES, rates=speech.RATES, pitches=speech.PITCHES, seed=0)
    test = speech.speech_dataset(speech.TEST_VOICES, rates=speech.RATES, pitches=speech.PITCHES, seed=1)
    cers = []
    for s in seeds:
        cer, t = run(s, train, test)
        cers.append(cer)
        print(f"seed {s}: held-out CER {cer:.4f} ({t:.0f} s)", flush=True)
    c = np.array(cers)
    print(f"{len(c)} seeds: CER mean {c.mean():.3f}, sd {c.std(ddof=1) if len(c) > 1 else 0:.3f}, "
          f"min {c.min():.3f}, max {c.max():.3f}")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [0, 1, 2, 3])
