"""Listings V28 (Whisper's audio front-end) and V29 (Whisper): the log-mel spectrogram against transformers'
WhisperFeatureExtractor, the core against reference.py, finite differences and PyTorch autograd, and equality with
WhisperForConditionalGeneration (P, every gradient, greedy decoding, ft → HF → ft, save_hf / load_hf)."""
import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as R
from formal_transformers import speech

from conftest import assert_grads_match_fd, hf_random_float64, randomize_theta, rel_err

TINY = dict(n_mels=6, n_audio_ctx=5, n_vocab=11, n_text_ctx=7, L_enc=2, L_dec=2, H=2, d_e=8, d_mlp=12)


def tiny(dtype="float64", **kw):
    return ft.Whisper(**{**TINY, **kw}, dtype=dtype)


def hf_config(**kw):
    import transformers

    c = dict(vocab_size=11, num_mel_bins=6, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
             decoder_attention_heads=2, d_model=8, encoder_ffn_dim=12, decoder_ffn_dim=12, max_source_positions=5,
             max_target_positions=7, decoder_start_token_id=9, bos_token_id=9, eos_token_id=10, pad_token_id=10,
             begin_suppress_tokens=None, suppress_tokens=None, dropout=0.0, attention_dropout=0.0,
             activation_dropout=0.0)
    c.update(kw)
    return transformers.WhisperConfig(**c)


def theta(model):
    return {k: np.array(v, dtype=np.float64) for k, v in model.params.items()}


# ---------------------------------------------------------------------------------------------------------
# the log-mel spectrogram

@pytest.mark.parametrize("n_mels,chunk,n", [(80, 1, 12000), (40, 1, 16000), (128, 2, 20000)])
def test_log_mel_equals_whisper_feature_extractor(n_mels, chunk, n):
    """Equal to transformers' extractor (which computes in float32) within float32 rounding; the mel filters exactly."""
    from transformers import WhisperFeatureExtractor

    fe = WhisperFeatureExtractor(feature_size=n_mels, chunk_length=chunk)
    a = (np.random.default_rng(n).standard_normal(n) * 0.1).astype(np.float32)
    hf = fe(a, sampling_rate=16000, return_tensors="np").input_features[0]
    ours = speech.log_mel_spectrogram(a, n_mels, n_samples=16000 * chunk)
    assert ours.shape == hf.shape == (n_mels, 100 * chunk)
    assert np.abs(ours - hf).max() <= 1e-5  # values of order 1: float32's rounding of the STFT and the log
    assert np.array_equal(speech.mel_filters(n_mels), fe.mel_filters)


def test_log_mel_bad_input():
    with pytest.raises(ValueError, match="1-D"):
        speech.log_mel_spectrogram(np.zeros((2, 500)))
    with pytest.raises(ValueError, match="NaN"):
        speech.log_mel_spectrogram(np.full(1000, np.nan))
    with pytest.raises(ValueError, match="longer than"):
        speech.log_mel_spectrogram(np.zeros(100))


# ---------------------------------------------------------------------------------------------------------
# V28: the audio front-end

def test_front_end_reference_equals_torch_conv1d():
    import torch

    rng = np.random.default_rng(0)
    F = rng.standard_normal((6, 9))
    W1, b1, W2, b2 = rng.standard_normal((8, 6, 3)), rng.standard_normal(8), rng.standard_normal((8, 8, 3)), rng.standard_normal(8)
    t = lambda a: torch.tensor(a, dtype=torch.float64)
    h = torch.nn.functional.gelu(torch.nn.functional.conv1d(t(F)[None], t(W1), t(b1), padding=1))
    z = torch.nn.functional.gelu(torch.nn.functional.conv1d(h, t(W2), t(b2), stride=2, padding=1))[0].numpy()
    ref = R.audio_front_end(F, W1.reshape(8, -1), b1, W2.reshape(8, -1), b2, W_sin=np.zeros((8, 5)))
    assert ref.shape == (8, 5)
    assert rel_err(ref, z) <= 1e-13
    assert rel_err(R.audio_front_end(F, W1.reshape(8, -1), b1, W2.reshape(8, -1), b2) - ref,
                   R.whisper_sinusoids(5, 8)) <= 1e-13


def test_sinusoids_equal_hf():
    import torch
    from transformers.models.whisper.modeling_whisper import sinusoids

    assert rel_err(R.whisper_sinusoids(12, 16), sinusoids(12, 16).double().numpy().T) <= 1e-6  # HF's are float32
    m = tiny()
    assert rel_err(m.encoder_positions, R.whisper_sinusoids(5, 8)) <= 1e-15


@pytest.mark.parametrize("T", [10, 9, 1])
def test_core_equals_reference(dtype, T):
    m = tiny(dtype)
    randomize_theta(m, np.random.default_rng(1), unit=("W_e", "W_p"))
    th = theta(m)
    for k in th:
        if k.endswith(".b_k"):
            th[k][...] = 0.0
            m.params[k][...] = 0.0
    F = np.random.default_rng(2).standard_normal((6, T))
    x = [9, 3, 4, 1]
    P = m(F.astype(dtype), x)
    ref = R.whisper(F, x, th, H=2)
    assert P.shape == (11, 4)
    assert rel_err(P, ref) <= (1e-12 if dtype == "float64" else 1e-5)


def test_batch_equals_single_sequences():
    m = tiny()
    randomize_theta(m, np.random.default_rng(3), unit=("W_e", "W_p"))
    F = np.random.default_rng(4).standard_normal((3, 6, 10))
    xs = [[9, 1], [9, 2, 3, 4], [9]]
    Ps = m(F, xs)
    for b in range(3):
        assert rel_err(Ps[b], m(F[b], xs[b])) <= 1e-14
    loss, g = m.loss_and_grad(F, xs)
    single = [m.loss_and_grad(F[b], xs[b]) for b in range(3)]
    assert abs(loss - sum(s[0] for s in single)) <= 1e-12 * abs(loss)
    scale = max(np.abs(v).max() for v in g.values())  # b_k's gradient is rounding noise: compare to the largest
    for k in g:
        assert np.abs(g[k] - sum(s[1][k] for s in single)).max() <= 1e-12 * scale, k


def test_gradients_match_finite_differences():
    m = ft.Whisper(n_mels=3, n_audio_ctx=3, n_vocab=7, n_text_ctx=4, L_enc=1, L_dec=1, H=2, d_e=4, d_mlp=6,
                   dtype="float64")
    randomize_theta(m, np.random.default_rng(5), unit=("W_e", "W_p"))
    F = np.random.default_rng(6).standard_normal((2, 3, 5))
    xs = [[5, 1, 2], [5, 3]]
    loss, g, dF = m.loss_and_grad(F, xs, features_grad=True)
    assert abs(loss - sum(R.whisper_loss(F[b], xs[b], theta(m), H=2) for b in range(2))) <= 1e-12 * loss
    assert_grads_match_fd(m, g, lambda: m.loss(F, xs))
    from conftest import numeric_grad

    assert rel_err(dF, numeric_grad(lambda: m.loss(F, xs), F)) <= 1e-6


# ---------------------------------------------------------------------------------------------------------
# WhisperForConditionalGeneration

def _hf_loss(hf, F, x):
    """Algorithm 11's summed loss of HF's logits (decoder_input_ids = x; targets x[1:])."""
    import torch

    out = hf(input_features=torch.tensor(F)[None], decoder_input_ids=torch.tensor([x]))
    lp = torch.log_softmax(out.logits[0], dim=-1)
    return -lp[torch.arange(len(x) - 1), torch.tensor(x[1:])].sum(), out.logits[0]


def test_hf_equality_float64():
    """Every weight random, float64: P and every gradient equal to HF's ≤ 1e-10 — the convolutions' included, so
    this is also the check of V28's backward against PyTorch autograd. HF computes nothing of Whisper in float32
    inside a float64 model (the sinusoids are a stored table, copied), so nothing is patched."""
    import torch
    import transformers

    hf = hf_random_float64(transformers.WhisperForConditionalGeneration, hf_config()).eval()
    m = ft.from_hf(hf)
    assert isinstance(m, ft.Whisper) and m.config["dtype"] == "float64"
    assert m.config["start_id"] == 9 and m.config["eos_id"] == 10
    F = np.random.default_rng(10).standard_normal((6, 10))
    x = [9, 1, 4, 2, 8]
    loss_hf, logits = _hf_loss(hf, F, x)
    P = m(F, x)
    assert rel_err(P, torch.softmax(logits, -1).detach().numpy().T) <= 1e-10
    assert rel_err(m.logits(F, x), logits.detach().numpy().T) <= 1e-10
    loss_hf.backward()
    loss, g = m.loss_and_grad(F, x)
    assert abs(loss - loss_hf.item()) <= 1e-10 * abs(loss)
    hg = {k: p.grad.numpy() for k, p in hf.named_parameters() if p.grad is not None}
    d, H = 8, 2
    theirs = {"conv.W_c1": hg["model.encoder.conv1.weight"].reshape(d, -1), "conv.b_c1": hg["model.encoder.conv1.bias"],
              "conv.W_c2": hg["model.encoder.conv2.weight"].reshape(d, -1), "conv.b_c2": hg["model.encoder.conv2.bias"],
              "W_e": hg["model.decoder.embed_tokens.weight"].T, "W_p": hg["model.decoder.embed_positions.weight"].T}
    from formal_transformers.hf.whisper import _ATTN, _attentions, _plain

    c = hf.config.to_dict()
    for ours, hf_name in _plain(c):
        theirs[ours] = hg[hf_name]
    for ours, p in _attentions(c):
        for o, h in _ATTN:
            theirs[ours + f"W_{o}"] = hg[p + h + ".weight"].reshape(H, d // H, d)
            if o != "k":
                theirs[ours + f"b_{o}"] = hg[p + h + ".bias"].reshape(H, d // H)
        theirs[ours + "W_o"], theirs[ours + "b_o"] = hg[p + "out_proj.weight"], hg[p + "out_proj.bias"]
    b_k = {k for k in g if k.endswith(".b_k")}
    assert set(theirs) | b_k == set(g) and not set(theirs) & b_k  # every gradient compared (Whisper has no b_k)
    errs = {k: rel_err(g[k], theirs[k]) for k in theirs}
    assert max(errs.values()) <= 1e-10, max(errs.items(), key=lambda kv: kv[1])
    scale = max(np.abs(v).max() for v in g.values())
    for k in b_k:
        assert np.abs(g[k]).max() <= 1e-12 * scale  # b_k adds a constant to each query's scores: exactly 0


def test_hf_roundtrip_and_save_load(tmp_path):
    import transformers

    hf = hf_random_float64(transformers.WhisperForConditionalGeneration, hf_config()).eval()
    m = ft.from_hf(hf)
    back = ft.from_hf(ft.to_hf(m))
    for k, v in m.params.items():
        assert np.array_equal(back.params[k], v), k
    assert np.array_equal(back.encoder_positions, m.encoder_positions)
    assert back.config == m.config
    ft.save_hf(m, tmp_path / "w")
    loaded = ft.load_hf(tmp_path / "w")
    for k, v in m.params.items():
        assert np.array_equal(loaded.params[k], v), k
    assert np.array_equal(loaded.encoder_positions, m.encoder_positions)
    again = transformers.WhisperForConditionalGeneration.from_pretrained(tmp_path / "w")
    F = np.random.default_rng(11).standard_normal((6, 10))
    import torch

    with torch.no_grad():
        out = again(input_features=torch.tensor(F)[None], decoder_input_ids=torch.tensor([[9, 3]])).logits[0]
    assert rel_err(m.logits(F, [9, 3]), out.numpy().T) <= 1e-10


def test_greedy_decoding_equals_hf_generate():
    """HF's generate with a plain config: decoder_start_token_id alone, greedy to eos_token_id (return_dict's
    sequences keep the start token; the plain return drops it and the eos)."""
    import torch
    import transformers

    hf = hf_random_float64(transformers.WhisperForConditionalGeneration, hf_config(max_target_positions=12),
                           scale=2.0).eval()
    m = ft.from_hf(hf)
    F = np.random.default_rng(12).standard_normal((4, 6, 10))
    ours = speech.transcribe(m, F)
    lengths = set()
    for b in range(4):
        with torch.no_grad():
            out = hf.generate(torch.tensor(F[b])[None], max_length=12, do_sample=False, num_beams=1,
                              return_dict_in_generate=True)
        theirs = out.sequences[0].tolist()
        assert ours[b] == theirs, b
        lengths.add(len(theirs))
    assert max(lengths) > 2  # some sequence decoded more than one token


def test_refusals_name_the_option():
    import transformers

    for kw, name in [(dict(apply_spec_augment=True), "apply_spec_augment"), (dict(scale_embedding=True), "scale_embedding"),
                     (dict(activation_function="relu"), "activation_function"),
                     (dict(decoder_attention_heads=4), "decoder_attention_heads"),
                     (dict(decoder_ffn_dim=16), "decoder_ffn_dim")]:
        hf = transformers.WhisperForConditionalGeneration(hf_config(**kw))
        with pytest.raises(ValueError, match=name):
            ft.from_hf(hf)
    m = tiny()
    with pytest.raises(ValueError, match="n_audio_ctx"):  # ⌈11/2⌉ = 6 positions, the table has 5
        m(np.zeros((6, 11)), [9])
    m.params["enc.0.attn.b_k"][0, 0] = 0.5
    with pytest.raises(ValueError, match="b_k"):
        ft.to_hf(m)


def test_bad_input():
    m = tiny()
    with pytest.raises(ValueError, match="n_mels"):
        m(np.zeros((5, 10)), [9])
    with pytest.raises(ValueError, match="NaN"):
        m(np.full((6, 10), np.nan), [9])
    with pytest.raises(TypeError):
        m(np.zeros((6, 10), dtype=np.int64), [9])
    with pytest.raises(IndexError):
        m(np.zeros((6, 10)), [11])
    with pytest.raises(ValueError, match="n_text_ctx"):
        m(np.zeros((6, 10)), [1] * 8)
    with pytest.raises(ValueError, match="one token sequence per spectrogram"):
        m(np.zeros((2, 6, 10)), [[1]])
    with pytest.raises(ValueError, match="d_e must be even"):
        ft.Whisper(6, 5, 11, 7, 1, 1, 1, 7, 12)
    with pytest.raises(ValueError, match="start_id"):
        ft.Whisper(**TINY, start_id=11)
    with pytest.raises(ValueError, match="attention_weights|forward"):
        tiny().attention_weights("cross", 0)


def test_attention_weights_columns_sum_to_one():
    m = tiny()
    m(np.random.default_rng(13).standard_normal((6, 10)), [9, 1, 2])
    A = m.attention_weights("cross", 1, 0, 1)
    assert A.shape == (5, 3)
    assert np.allclose(A.sum(axis=0), 1.0)
    assert m.attention_weights("enc", 0).shape == (5, 5)
    with pytest.raises(IndexError):
        m.attention_weights("cross", 2)


def test_layers_are_the_pre_ln_block_of_an_edtransformer():
    """Lines 2 and 5 are the registered block "pre_ln" with mlp="gelu": every layer parameter (and the two stack
    norms) of ft.Whisper is the EDTransformer's of that block, same name, same shape, in the same order."""
    w = tiny()
    e = ft.EDTransformer(n_vocab=11, l_max=7, L_enc=2, L_dec=2, H=2, d_e=8, d_mlp=12, block="pre_ln", mlp="gelu",
                         dtype="float64")
    layers = lambda m: [(k, m.params[k].shape) for k in m.params if k.startswith(("enc.", "dec."))]
    assert layers(w) == layers(e)
    assert len(layers(w)) == 2 * 16 + 2 * 26 + 4  # per layer: 4 + 8 + 4 (enc), 6 + 16 + 4 (dec); γ, β of each stack

# ---------------------------------------------------------------------------------------------------------
# speech helpers

def test_cer_and_baselines():
    assert speech.edit_distance("kitten", "sitting") == 3
    assert speech.cer(["abc", "xy"], ["abd", "xy"]) == pytest.approx(1 / 5)
    assert speech.most_frequent_baseline(["a", "b", "b"], 2) == ["b", "b"]
    rng = np.random.default_rng(0)
    A = rng.standard_normal((4, 3, 20))
    assert speech.nearest_neighbour_baseline(A, ["p", "q", "r", "s"], A[[2, 0]] + 0.01) == ["r", "p"]
    codec = speech.CharCodec()
    assert codec.decode(codec.encode("go up")) == "go up"


def test_espeak_synthesis(tmp_path):
    a = speech.synthesize("seven", "en-us+m1", 165, 50, cache=tmp_path)
    assert 0.3 * 16000 < a.size < 1.5 * 16000
    d = speech.speech_dataset(["en-gb+f1"], words=("yes",), rates=(165,), pitches=(50,), cache=tmp_path)
    assert d["features"].shape == (1, 40, 100) and d["text"] == ["yes"]


def test_edtraining_trains_whisper_as_its_plan_says():
    """ft.EDTraining on an ft.Whisper: the plan's minibatches and learning rates, one Adam step each with the
    gradient averaged per sequence (reduction 'sum') — equal to the same loop written out; and the loss falls."""
    rng = np.random.default_rng(14)
    F = rng.standard_normal((5, 6, 10))
    xs = [[9] + list(rng.integers(0, 9, size=3)) + [10] for _ in range(5)]
    a, b = tiny(seed=2), tiny(seed=2)
    tr = ft.EDTraining(3, 1e-2, batch_size=2, schedule="cosine", warmup=1, progress=False)
    tr(F, xs, a)
    opt = ft.Adam(lr=1e-2)
    for st in tr.plan(xs):
        idx = st["sequences"]
        _, g = b.loss_and_grad(F[idx], [xs[i] for i in idx])
        opt.lr = st["lr"]
        opt.step(b, {k: v / len(idx) for k, v in g.items()})
    for k in a.params:
        assert np.array_equal(a.params[k], b.params[k]), k
    h = tr.history
    assert len(h["step"]) == 9 and h["loss"][-1] < h["loss"][0]
    with pytest.raises(ValueError, match="val_data"):
        ft.EDTraining(1, 1e-2, val_data=(F, xs), progress=False)(F, xs, tiny())
    with pytest.raises(ValueError, match="z_data"):
        ft.EDTraining(1, 1e-2, progress=False)(F[0], xs, tiny())
