"""Speech for Whisper — an EDTransformer whose encoder reads log-mel features (the embedding "audio", listings V28,
V29, docs/variants.md): Whisper's log-mel spectrogram in numpy, greedy
transcription, the character error rate, and a small synthesized-speech data set made on the machine with espeak-ng
(docs/data.md "Synthesized speech") with the baselines of notebooks/18_whisper_speech.ipynb (trained there by
ft.EDTraining, which takes spectrograms as such a model's z_data)."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import wave

import numpy as np

from . import _core

SAMPLING_RATE = 16000
N_FFT = 400  # 25 ms windows
HOP_LENGTH = 160  # 10 ms hops


# --------------------------------------------------------------------------------------------------------
# The log-mel spectrogram (Radford et al. 2022 §2.2; openai/whisper audio.py log_mel_spectrogram)

def hertz_to_mel(f):
    """Slaney's mel scale (Auditory Toolbox): linear below 1 kHz (3 mels per 200 Hz), logarithmic above
    (27 mels per factor 6.4)."""
    f = np.asarray(f, dtype=np.float64)
    lin = 3.0 * f / 200.0
    return np.where(f >= 1000.0, 15.0 + np.log(np.maximum(f, 1e-300) / 1000.0) * (27.0 / np.log(6.4)), lin)


def mel_to_hertz(m):
    """The inverse of hertz_to_mel."""
    m = np.asarray(m, dtype=np.float64)
    return np.where(m >= 15.0, 1000.0 * np.exp(np.log(6.4) / 27.0 * (m - 15.0)), 200.0 * m / 3.0)


def mel_filters(n_mels: int, *, n_fft: int = N_FFT, sampling_rate: int = SAMPLING_RATE, f_min: float = 0.0,
                f_max: float = 8000.0) -> np.ndarray:
    """(1 + n_fft/2, n_mels): triangular filters with centres equally spaced on Slaney's mel scale between f_min
    and f_max, each of area-normalised height 2 / (f_{m+1} − f_{m−1}) ("slaney" normalisation)."""
    if n_mels < 1:
        raise ValueError(f"n_mels must be >= 1, got {n_mels}")
    f = mel_to_hertz(np.linspace(hertz_to_mel(f_min), hertz_to_mel(f_max), n_mels + 2))  # the n_mels + 2 edges
    bins = np.linspace(0.0, sampling_rate // 2, 1 + n_fft // 2)
    up = (bins[:, None] - f[None, :-2]) / (f[1:-1] - f[:-2])[None, :]
    down = (f[None, 2:] - bins[:, None]) / (f[2:] - f[1:-1])[None, :]
    W = np.maximum(0.0, np.minimum(up, down))
    return W * (2.0 / (f[2:] - f[:-2]))[None, :]


def log_mel_spectrogram(audio, n_mels: int = 80, *, n_samples: int | None = None, n_fft: int = N_FFT,
                        hop_length: int = HOP_LENGTH, sampling_rate: int = SAMPLING_RATE) -> np.ndarray:
    """Whisper's input features (n_mels, n_samples // hop_length) of a 16 kHz mono signal, float64:
      1  the signal cut or zero-padded to n_samples (None: its own length)
      2  frames of n_fft samples every hop_length, centred (the signal reflected by n_fft/2 at both ends)
      3  |rfft(frame · hann)|² (the periodic Hann window), the last frame dropped
      4  M ← mel_filtersᵀ · power spectrum;  S ← log10(max(M, 1e−10))
      5  S ← max(S, max(S) − 8);  return (S + 4) / 4
    transformers' WhisperFeatureExtractor(feature_size=n_mels, chunk_length=n_samples / 16000) computes the same in
    float32 (tests/python/test_whisper.py: equal within its rounding)."""
    a = np.asarray(audio, dtype=np.float64)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"audio must be a non-empty 1-D signal, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError("audio contains NaN or infinite values")
    if n_samples is not None:  # line 1
        if n_samples < n_fft // 2 + 1:
            raise ValueError(f"n_samples must be > n_fft / 2 = {n_fft // 2}, got {n_samples}")
        a = np.pad(a[:n_samples], (0, max(0, n_samples - a.size)))
    if a.size <= n_fft // 2:
        raise ValueError(f"audio must be longer than n_fft / 2 = {n_fft // 2} samples, got {a.size}")
    p = np.pad(a, n_fft // 2, mode="reflect")  # line 2
    n_frames = 1 + (p.size - n_fft) // hop_length
    idx = np.arange(n_fft)[None, :] + hop_length * np.arange(n_frames)[:, None]
    window = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n_fft) / n_fft)  # periodic Hann
    power = np.abs(np.fft.rfft(p[idx] * window, axis=1)) ** 2  # line 3
    power = power[:-1].T  # (1 + n_fft/2, frames − 1)
    S = np.log10(np.maximum(mel_filters(n_mels, n_fft=n_fft, sampling_rate=sampling_rate).T @ power, 1e-10))  # line 4
    S = np.maximum(S, S.max() - 8.0)  # line 5
    return (S + 4.0) / 4.0


# --------------------------------------------------------------------------------------------------------
# Greedy transcription (Algorithm 15 with τ → 0) and the character error rate

def transcribe(model, features, *, max_len: int | None = None) -> list:
    """Greedy decoding (Algorithm 15 with τ = 0, ft.EDInference with its KV caches) of an EDTransformer with the audio
    encoder (n_mels; Whisper) for each spectrogram of features (B, n_mels, T) (or one (n_mels, T)): x̂ ← [bos_token];
    x̂ ← [x̂, argmax P[:, last]] until eos_token or max_len tokens (default l_max). bos_token, eos_token: the model's
    bos_id, eos_id (ft.from_hf: decoder_start_token_id, eos_token_id). This is what
    WhisperForConditionalGeneration.generate does with a plain config (decoder_start_token_id alone, greedy, to
    eos_token_id). Returns the token lists, the start token included (the eos too, when reached)."""
    if not isinstance(model, _core.EDTransformer) or model.config.get("n_mels") is None:
        raise TypeError(f"transcribe takes an EDTransformer with the audio encoder (n_mels), got {type(model).__name__}")
    F = np.asarray(features)
    if F.ndim not in (2, 3):
        raise ValueError(f"features must be (n_mels, T) or (B, n_mels, T), got shape {F.shape}")
    dec = _core.EDInference(0.0, max_len=max_len)
    out = [dec(f, model).tolist() for f in (F[None] if F.ndim == 2 else F)]
    return out[0] if F.ndim == 2 else out


def edit_distance(a, b) -> int:
    """Levenshtein distance (insertions, deletions, substitutions of one symbol, each 1)."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def cer(hypotheses, references) -> float:
    """Character error rate: Σ edit_distance(hyp, ref) / Σ len(ref) over the pairs."""
    hypotheses, references = list(hypotheses), list(references)
    if len(hypotheses) != len(references) or not references:
        raise ValueError("cer needs as many hypotheses as references (>= 1)")
    total = sum(len(r) for r in references)
    if total == 0:
        raise ValueError("the references are empty")
    return sum(edit_distance(h, r) for h, r in zip(hypotheses, references)) / total


# --------------------------------------------------------------------------------------------------------
# Synthesized speech (docs/data.md "Synthesized speech"): espeak-ng on this machine, several voices, rates,
# pitches and a little noise; cached as .wav files (FT_CACHE_DIR/speech-espeak), never committed

WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
         "yes", "no", "up", "down", "left", "right", "stop", "go", "on", "off")
# voice = espeak-ng language + variant. The held-out voices differ from every training voice in both.
TRAIN_VOICES = ("en-us+m1", "en-us+f2", "en-gb+m3", "en-gb+f1", "en-gb-scotland+m2", "en-gb-scotland+f3",
                "en-029+m4", "en-029+f4", "en-gb-x-rp+m5", "en-gb-x-rp+f5", "en-us+m7", "en-gb+f3")
TEST_VOICES = ("en-gb-x-gbclan+m6", "en-gb-x-gbcwmd+f2", "en-us+klatt", "en-gb+m4")
RATES = (130, 165, 200)  # words per minute
PITCHES = (35, 50, 65)   # espeak-ng's 0–99 scale
ALPHABET = "abcdefghijklmnopqrstuvwxyz "


class CharCodec:
    """Characters <-> token ids: the ALPHABET's characters, then <start> and <eos>."""

    def __init__(self, alphabet: str = ALPHABET):
        self.alphabet = alphabet
        self.start = len(alphabet)
        self.eos = len(alphabet) + 1
        self.n_vocab = len(alphabet) + 2

    def encode(self, text: str) -> list:
        return [self.start] + [self.alphabet.index(c) for c in text] + [self.eos]

    def decode(self, ids) -> str:
        return "".join(self.alphabet[i] for i in ids if i < len(self.alphabet))


def espeak_available() -> bool:
    return shutil.which("espeak-ng") is not None


def _read_wav(path) -> tuple:
    with wave.open(str(path), "rb") as w:
        rate, n, width = w.getframerate(), w.getnframes(), w.getsampwidth()
        if width != 2 or w.getnchannels() != 1:
            raise ValueError(f"{path}: expected 16-bit mono audio")
        return np.frombuffer(w.readframes(n), dtype="<i2").astype(np.float64) / 32768.0, rate


def synthesize(text: str, voice: str, rate: int, pitch: int, *, cache=None) -> np.ndarray:
    """espeak-ng's rendering of `text` (voice, words per minute, pitch) as a 16 kHz float signal in [−1, 1],
    leading and trailing silence trimmed. Cached as a .wav in `cache` (default FT_CACHE_DIR/speech-espeak)."""
    from scipy.signal import resample_poly

    if not espeak_available():
        raise FileNotFoundError("espeak-ng is not installed (apt-get install espeak-ng; run.sh's APT_PACKAGES)")
    from .datasets import cache_dir

    folder = os.fspath(cache) if cache is not None else os.path.join(cache_dir(), "speech-espeak")
    os.makedirs(folder, exist_ok=True)
    key = hashlib.sha256(f"{text}|{voice}|{rate}|{pitch}".encode()).hexdigest()[:16]
    path = os.path.join(folder, f"{key}.wav")
    if not os.path.isfile(path):
        tmp = path + f".{os.getpid()}.tmp"
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(rate), "-p", str(pitch), "-w", tmp, text], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.replace(tmp, path)
    a, sr = _read_wav(path)
    if sr != SAMPLING_RATE:
        g = np.gcd(sr, SAMPLING_RATE)
        a = resample_poly(a, SAMPLING_RATE // g, sr // g)
    loud = np.flatnonzero(np.abs(a) > 0.02 * max(np.abs(a).max(), 1e-9))
    return a[max(0, loud[0] - 800):loud[-1] + 800] if loud.size else a


def speech_dataset(voices, *, words=WORDS, rates=RATES, pitches=PITCHES, snr_db=(20.0, 30.0), n_mels: int = 40,
                   seconds: float = 1.0, seed: int = 0, cache=None) -> dict:
    """Every word spoken by every voice at every rate and pitch, white noise added at an SNR drawn uniformly from
    snr_db, cut or padded to `seconds`, as log-mel features. Returns {"features": (N, n_mels, 100·seconds) float32,
    "text": [word…], "voice": [voice…], "rate": […], "pitch": […]}."""
    rng = np.random.default_rng(seed)
    n = int(round(seconds * SAMPLING_RATE))
    feats, text, vs, rs, ps = [], [], [], [], []
    for v in voices:
        for w in words:
            for r in rates:
                for p in pitches:
                    a = synthesize(w, v, r, p, cache=cache)[:n]
                    s = np.sqrt(np.mean(a ** 2)) if a.size else 0.0
                    a = a + rng.standard_normal(a.size) * s * 10 ** (-rng.uniform(*snr_db) / 20)
                    feats.append(log_mel_spectrogram(a, n_mels, n_samples=n).astype(np.float32))
                    text.append(w), vs.append(v), rs.append(r), ps.append(p)
    return {"features": np.stack(feats), "text": text, "voice": vs, "rate": rs, "pitch": ps}


def most_frequent_baseline(train_text, n: int) -> list:
    """The most frequent training transcript, n times (ties: the first in sorted order)."""
    vals, counts = np.unique(np.asarray(train_text), return_counts=True)
    return [str(vals[np.argmax(counts)])] * n


def nearest_neighbour_baseline(train_features, train_text, test_features, *, frames: int = 20) -> list:
    """Template matching: each test spectrogram takes the transcript of the training spectrogram nearest to it
    (Euclidean) after both are averaged into `frames` equal time slices and mean-normalised per band."""
    def embed(F):
        F = np.asarray(F, dtype=np.float64)
        cut = np.array_split(np.arange(F.shape[-1]), frames)
        E = np.stack([F[..., c].mean(axis=-1) for c in cut], axis=-1)
        E = E - E.mean(axis=-1, keepdims=True)
        return E.reshape(len(F), -1)

    A, B = embed(train_features), embed(test_features)
    d = (B ** 2).sum(1)[:, None] - 2 * B @ A.T + (A ** 2).sum(1)[None, :]
    return [train_text[i] for i in np.argmin(d, axis=1)]


# --------------------------------------------------------------------------------------------------------
# The former class (ft.Whisper)

def Whisper(n_mels, n_audio_ctx, n_vocab, n_text_ctx, L_enc, L_dec, H, d_e, d_mlp, *, eps=1e-5, seed=0, init_std=0.02,
            start_id=None, eos_id=None, dtype="float32"):
    """Deprecated: Whisper (listings V28, V29) is an EDTransformer whose encoder reads log-mel features. This builds
    EDTransformer(n_vocab, l_max=n_text_ctx, L_enc, L_dec, H, d_e, d_mlp, n_mels=, n_audio_ctx=, block="pre_ln",
    mlp="gelu", tied=True, eps=, seed=, init_std=, bos_id=start_id, eos_id=eos_id, dtype=) — call that instead."""
    import warnings

    warnings.warn("ft.Whisper is deprecated: Whisper is ft.EDTransformer(..., n_mels=, n_audio_ctx=, block='pre_ln', "
                  "mlp='gelu', tied=True), which this returns", DeprecationWarning, stacklevel=2)
    return _core.EDTransformer(n_vocab=n_vocab, l_max=n_text_ctx, L_enc=L_enc, L_dec=L_dec, H=H, d_e=d_e, d_mlp=d_mlp,
                               n_mels=n_mels, n_audio_ctx=n_audio_ctx, block="pre_ln", mlp="gelu", tied=True, eps=eps,
                               seed=seed, init_std=init_std, bos_id=start_id, eos_id=eos_id, dtype=dtype)
