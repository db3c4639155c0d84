"""Listings V28 (Whisper's audio front-end) and V29 (Whisper: an EDTransformer whose encoder's embedding is the part
"audio"): the log-mel spectrogram against transformers' WhisperFeatureExtractor, the core against reference.py, finite
differences and PyTorch autograd, and equality with WhisperForConditionalGeneration (P, every gradient, greedy decoding
with the KV caches, ft → HF → ft, save_hf / load_hf, ft.save / ft.load); EDTraining's core loop on spectrograms."""
import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as R
from formal_transformers import speech

from conftest import assert_grads_match_fd, hf_random_float64, randomize_theta, rel_err

TINY = dict(n_mels=6, n_audio_ctx=5, n_vocab=11, l_max=7, L_enc=2, L_dec=2, H=2, d_e=8, d_mlp=12, block="pre_ln",
            mlp="gelu", tied=True, bos_id=9, eos_id=10)


def tiny(dtype="float64", **kw):
    return ft.EDTransformer(**{**TINY, **kw}, dtype=dtype)


def exact_sinusoids(hf):
    """HF's encoder table set to Whisper's sinusoids in float64 (hf_random_float64 randomised it; HF computes them in
    float32 — the audio encoder's W_sin is the exact table, fixed)."""
    import torch

    c = hf.config
    with torch.no_grad():
        hf.model.encoder.embed_positions.weight.copy_(
            torch.tensor(R.whisper_sinusoids(c.max_source_positions, c.d_model).T))
    return hf


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
    """Every parameter's gradient through the ED model, the convolutions' included, against finite differences."""
    m = ft.EDTransformer(n_mels=3, n_audio_ctx=3, n_vocab=7, l_max=4, L_enc=1, L_dec=1, H=2, d_e=4, d_mlp=6,
                         block="pre_ln", mlp="gelu", tied=True, dtype="float64")
    randomize_theta(m, np.random.default_rng(5), unit=("W_e", "W_p"))
    F = np.random.default_rng(6).standard_normal((2, 3, 5))
    xs = [[5, 1, 2], [5, 3]]
    loss, g = m.loss_and_grad(F, xs)
    assert {"conv.W_c1", "conv.b_c1", "conv.W_c2", "conv.b_c2"} <= set(g)  # the front-end's, checked below
    assert abs(loss - sum(R.whisper_loss(F[b], xs[b], theta(m), H=2) for b in range(2))) <= 1e-12 * loss
    assert abs(m.loss(F, xs) - loss) <= 1e-13 * loss
    assert_grads_match_fd(m, g, lambda: m.loss(F, xs))


def test_features_grad_matches_finite_differences():
    """loss_and_grad(features, x, features_grad=True) -> (loss, grads, dF): ∂loss/∂features in the features' shape
    ((B, n_mels, T), or (n_mels, T) for one), against central differences in float64; the loss and θ's gradients are
    those of the call without it."""
    m = ft.EDTransformer(n_mels=3, n_audio_ctx=3, n_vocab=7, l_max=4, L_enc=1, L_dec=1, H=2, d_e=4, d_mlp=6,
                         block="pre_ln", mlp="gelu", tied=True, dtype="float64")
    randomize_theta(m, np.random.default_rng(5), unit=("W_e", "W_p"))
    F = np.random.default_rng(6).standard_normal((2, 3, 5))
    xs = [[5, 1, 2], [5, 3]]
    loss0, g0 = m.loss_and_grad(F, xs)
    loss, g, dF = m.loss_and_grad(F, xs, features_grad=True)
    assert loss == loss0 and all(np.array_equal(g[k], g0[k]) for k in g0)
    assert dF.shape == F.shape and dF.dtype == np.float64
    from conftest import numeric_grad

    fd = numeric_grad(lambda: m.loss(F, xs), F)
    assert rel_err(dF, fd) <= 1e-7
    l1, _, d1 = m.loss_and_grad(F[1], xs[1], features_grad=True)  # one spectrogram: (n_mels, T); the batch's sum
    assert d1.shape == F[1].shape and rel_err(d1, dF[1]) <= 1e-12
    assert abs(l1 - m.loss(F[1], xs[1])) <= 1e-13 * l1
    with pytest.raises(TypeError, match="features_grad"):  # a token encoder: its input has no gradient
        ft.EDTransformer(n_vocab=7, l_max=4, L_enc=1, L_dec=1, H=2, d_e=4, d_mlp=6).loss_and_grad([1, 2], [3, 4],
                                                                                                 features_grad=True)


def test_audio_options_are_an_embedding_part():
    """n_mels, n_audio_ctx: the options of the registered embedding part "audio" (EDTransformer only), kept by the
    config (JSON, build_model) and checked before anything is built."""
    m = tiny()
    assert m.config["n_mels"] == 6 and m.config["n_audio_ctx"] == 5
    assert ft.build_model(m.config).config == m.config
    assert ft.EDTransformer(n_vocab=11, l_max=7, L_enc=1, L_dec=1, H=2, d_e=8, d_mlp=12).config["n_mels"] is None
    with pytest.raises(ValueError, match="n_audio_ctx"):
        ft.EDTransformer(**{**TINY, "n_audio_ctx": None})
    with pytest.raises(ValueError, match="d_e even"):
        ft.EDTransformer(**{**TINY, "d_e": 9, "H": 3})
    with pytest.raises(TypeError, match="n_mels"):
        ft.DTransformer(n_vocab=11, l_max=7, L=1, H=2, d_e=8, d_mlp=12, n_mels=6, n_audio_ctx=5)


def test_encoder_input_is_the_parts():
    """model.encoder_input: what the encoder's embedding part takes, as the part reports it (the model, inference,
    training and binding layers ask it and name none of its options): the audio part's log-mel features of n_mels rows,
    or token ids. The converters of token encoders (BART, T5) leave the audio encoder to Whisper's by it."""
    from formal_transformers.hf._registry import _converter_of

    a = tiny()
    assert a.encoder_input == {"kind": "features", "rows": 6,
                               "what": "log-mel features (n_mels, T) (its embedding 'audio', n_mels = 6)"}
    t = ft.EDTransformer(n_vocab=11, l_max=7, L_enc=1, L_dec=1, H=2, d_e=8, d_mlp=12, block="pre_ln", mlp="gelu",
                         tied=True)  # the audio model's options but its encoder's: BART's (mBART's) export takes it
    assert t.encoder_input == {"kind": "tokens", "rows": None, "what": "token ids"}
    assert type(_converter_of(a)[0]).__name__ == "Whisper"
    assert type(_converter_of(t)[0]).__name__ != "Whisper"
    with pytest.raises(TypeError, match=r"takes log-mel features \(n_mels, T\) \(its embedding 'audio', n_mels = 6\)"):
        a.loss([1, 2], [9, 1])


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
    this is also the check of V28's backward against PyTorch autograd. HF's stored encoder table is patched to the
    float64 sinusoids (HF computes them in float32; ours are exact and fixed)."""
    import torch
    import transformers

    hf = exact_sinusoids(hf_random_float64(transformers.WhisperForConditionalGeneration, hf_config())).eval()
    m = ft.from_hf(hf)
    assert isinstance(m, ft.EDTransformer) and m.config["dtype"] == "float64"
    assert m.config["bos_id"] == 9 and m.config["eos_id"] == 10 and m.config["n_mels"] == 6
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


def test_features_grad_equals_hf_input_features_grad():
    """∂loss/∂features equals PyTorch autograd's input_features.grad through WhisperForConditionalGeneration on the
    same weights (float64, a batch of two spectrograms, each its own decoder input), ≤ 1e-10."""
    import torch
    import transformers

    hf = exact_sinusoids(hf_random_float64(transformers.WhisperForConditionalGeneration, hf_config())).eval()
    m = ft.from_hf(hf)
    F = np.random.default_rng(12).standard_normal((2, 6, 10))
    xs = [[9, 1, 4, 2], [9, 3, 5, 7]]
    f = torch.tensor(F, requires_grad=True)
    out = hf(input_features=f, decoder_input_ids=torch.tensor(xs))
    lp = torch.log_softmax(out.logits, dim=-1)
    t = torch.tensor(xs)[:, 1:]
    loss_hf = -torch.gather(lp[:, :-1], 2, t[..., None]).sum()
    loss_hf.backward()
    loss, _, dF = m.loss_and_grad(F, xs, features_grad=True)
    assert abs(loss - loss_hf.item()) <= 1e-10 * abs(loss)
    assert rel_err(dF, f.grad.numpy()) <= 1e-10


def test_hf_roundtrip_and_save_load(tmp_path):
    import transformers

    hf = exact_sinusoids(hf_random_float64(transformers.WhisperForConditionalGeneration, hf_config())).eval()
    m = ft.from_hf(hf)
    back = ft.from_hf(ft.to_hf(m))
    for k, v in m.params.items():
        assert np.array_equal(back.params[k], v), k
    assert back.config == m.config
    ft.save_hf(m, tmp_path / "w")
    loaded = ft.load_hf(tmp_path / "w")
    for k, v in m.params.items():
        assert np.array_equal(loaded.params[k], v), k
    ft.save(m, tmp_path / "m.safetensors")  # the core's file: the audio part's options in its config
    again_ft = ft.load(tmp_path / "m.safetensors")
    assert isinstance(again_ft, ft.EDTransformer) and again_ft.config == m.config
    F0 = np.random.default_rng(15).standard_normal((6, 9))
    assert np.array_equal(again_ft(F0, [9, 2, 3]), m(F0, [9, 2, 3]))
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

    hf = exact_sinusoids(hf_random_float64(transformers.WhisperForConditionalGeneration,
                                           hf_config(max_target_positions=12), scale=2.0)).eval()
    m = ft.from_hf(hf)
    F = np.random.default_rng(12).standard_normal((4, 6, 10))
    ours = speech.transcribe(m, F)  # EDInference(τ = 0) with its KV caches
    literal = [ft.EDInference(0.0, cache=False)(F[b], m).tolist() for b in range(4)]
    assert ours == literal
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
    hf = hf_random_float64(transformers.WhisperForConditionalGeneration, hf_config())  # a table not the sinusoids
    with pytest.raises(ValueError, match="embed_positions"):
        ft.from_hf(hf)
    m = tiny()
    with pytest.raises(ValueError, match="n_audio_ctx"):  # ⌈11/2⌉ = 6 positions, the table has 5
        m(np.zeros((6, 11)), [9])
    m.params["enc.0.attn.b_k"][0, 0] = 0.5
    with pytest.raises(ValueError, match="b_k"):
        ft.to_hf(m)
    with pytest.raises(ValueError, match="mlp='gelu'"):
        ft.to_hf(tiny(mlp="relu"))


def test_inputs_of_the_other_kind_are_refused():
    """Token ids to the audio encoder, spectrograms to a token encoder: a TypeError naming the problem, in every call."""
    a = tiny()
    ed = ft.EDTransformer(n_vocab=11, l_max=7, L_enc=1, L_dec=1, H=2, d_e=8, d_mlp=12, dtype="float64")
    F = np.zeros((6, 10))
    for call in (lambda: a([1, 2], [9]), lambda: a.loss([1, 2], [9, 1]), lambda: a.loss_and_grad([1, 2], [9, 1]),
                 lambda: ft.EDInference(0.0)([1, 2], a)):
        with pytest.raises(TypeError, match="log-mel features"):
            call()
    for call in (lambda: ed(F, [9]), lambda: ed.loss(F, [9, 1]), lambda: ed.loss_and_grad(F, [9, 1]),
                 lambda: ft.EDInference(0.0)(F, ed)):
        with pytest.raises(TypeError, match="token ids"):
            call()
    with pytest.raises(TypeError, match="log-mel features"):
        ft.EDTraining(1, 1e-2, progress=False)([[1, 2]], [[9, 1]], a)
    with pytest.raises(TypeError, match="token ids"):
        ft.EDTraining(1, 1e-2, progress=False)(np.zeros((1, 6, 10)), [[9, 1]], ed)


def test_bad_input():
    m = tiny()
    with pytest.raises(ValueError, match="n_mels"):
        m(np.zeros((5, 10)), [9])
    with pytest.raises(ValueError, match="NaN"):
        m(np.full((6, 10), np.nan), [9])
    with pytest.raises(TypeError):  # integers: token ids, which this encoder does not take
        m(np.zeros((6, 10), dtype=np.int64), [9])
    with pytest.raises(IndexError):
        m(np.zeros((6, 10)), [11])
    with pytest.raises(ValueError, match="l_max"):
        m(np.zeros((6, 10)), [1] * 8)
    with pytest.raises(ValueError, match="same number of sequences"):
        m(np.zeros((2, 6, 10)), [[1]])
    with pytest.raises(ValueError, match="2-D"):
        m(np.zeros((1, 2, 6, 10)), [1])
    with pytest.raises(ValueError, match="one feature matrix at a time: log-mel features"):
        ft.EDInference(0.0)(np.zeros((2, 6, 10)), m)
    with pytest.raises(ValueError, match="attention_weights|forward"):
        tiny().attention_weights("cross", 0)


def test_attention_weights_columns_sum_to_one():
    m = tiny()
    m(np.random.default_rng(13).standard_normal((6, 10)), [9, 1, 2])
    A = m.attention_weights("cross", 1, 0)  # (H, ℓ_z keys, ℓ_x queries)
    assert A.shape == (2, 5, 3)
    assert np.allclose(A.sum(axis=1), 1.0)
    assert m.attention_weights("enc", 0).shape == (2, 5, 5)
    with pytest.raises(IndexError):
        m.attention_weights("cross", 2)


def test_whisper_alias_builds_the_edtransformer():
    """ft.Whisper (deprecated) builds the same EDTransformer: the same θ, names and shapes, for the same seed."""
    with pytest.warns(DeprecationWarning, match="EDTransformer"):
        w = ft.Whisper(6, 5, 11, 7, 2, 2, 2, 8, 12, start_id=9, eos_id=10, dtype="float64", seed=3)
    e = tiny(seed=3)
    assert isinstance(w, ft.EDTransformer) and w.config == e.config
    assert list(w.params) == list(e.params)
    for k in e.params:
        assert np.array_equal(w.params[k], e.params[k]), k


def test_bf16_mixed_precision():
    """precision='bf16-mixed' (float32 model): the layers' products in bf16; P close to float32's, gradients finite."""
    m32 = tiny("float32", seed=4)
    m16 = tiny("float32", seed=4, precision="bf16-mixed")
    F = np.random.default_rng(16).standard_normal((2, 6, 10)).astype(np.float32)
    xs = [[9, 1, 2], [9, 3]]
    for a, b in zip(m16(F, xs), m32(F, xs)):
        assert np.abs(a - b).max() <= 2e-2
    loss, g = m16.loss_and_grad(F, xs)
    assert np.isfinite(loss) and all(np.all(np.isfinite(v)) for v in g.values())


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


def test_edtraining_trains_on_spectrograms_as_its_plan_says():
    """ft.EDTraining on the audio encoder: the core's loop over the plan's minibatches and learning rates, one SGD
    step each with the gradient averaged per sequence (reduction 'sum') — equal to the same loop written out; a list
    of spectrograms is the same data; validation on spectrograms; and the loss falls."""
    rng = np.random.default_rng(14)
    F = rng.standard_normal((5, 6, 10))
    xs = [[9] + list(rng.integers(0, 9, size=3)) + [10] for _ in range(5)]
    a, b, c = tiny(seed=2), tiny(seed=2), tiny(seed=2)
    opts = dict(optimizer="sgd", batch_size=2, schedule="cosine", warmup=1, seed=1, progress=False)
    tr = ft.EDTraining(3, 0.5, **opts)
    tr(F, xs, a)
    for st in tr.plan(xs):
        idx = st["sequences"]
        _, g = b.loss_and_grad(F[idx], [xs[i] for i in idx])
        for k, v in g.items():
            b.params[k][...] -= st["lr"] * v / len(idx)
    scale = max(np.abs(v).max() for v in b.params.values())  # (b_k: rounding noise of order 1e-24, compared to θ)
    for k in a.params:
        assert np.abs(a.params[k] - b.params[k]).max() <= 1e-12 * scale, k
    h = tr.history
    assert len(h["step"]) == 9 and a.loss(F, xs) < tiny(seed=2).loss(F, xs)
    ft.EDTraining(3, 0.5, **opts)(list(F), xs, c)
    for k in a.params:
        assert np.array_equal(a.params[k], c.params[k]), k
    tv = ft.EDTraining(1, 1e-2, batch_size=2, val_data=(F[:2], xs[:2]), eval_every=1, progress=False)
    tv(F, xs, tiny())
    assert all(v is not None and np.isfinite(v) for v in tv.history["val_loss"])
    with pytest.raises(ValueError, match="z_data"):
        ft.EDTraining(1, 1e-2, progress=False)(F[:2], xs, tiny())
