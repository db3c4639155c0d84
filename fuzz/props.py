"""Property-based fuzzing of the public API (hypothesis): every constructor, call, call sequence,
tokenizer and file loader must either work or raise a clear ValueError / TypeError / IndexError — never
crash, hang, raise anything else (MemoryError, RuntimeError, SystemError...), or leave a half-updated model.

Run by tests/python/test_fuzz.py in a child process (a segfault then fails the test, and the input being
run is the last line of the log file, written and flushed before each example). By hand:

    FT_CORE_PATH=build/dev PYTHONPATH=python python fuzz/props.py --examples 200 --log /tmp/fuzz.log
    (--seed N for another stream; --examples sets the budget per property)

Sizes are drawn from small values (that build tiny objects) and huge ones (≥ 2**40, that must be
refused at once); middle sizes, which would legitimately allocate gigabytes, are not drawn.

The file formats of the core's one reader: model files (model_files -> ft.load) and prompt caches
(prompt_caches -> ft.PromptCache.load), damaged by cuts, changed bytes and replaced metadata.

Beyond the core: Hugging Face directories (hf_dirs: mutated config.json of save_hf directories -> ft.load_hf),
the command line (cli_args: train with options of any value; cli_run_dirs: --resume / sample of a damaged run
directory) and ft.datasets (dataset_files: cache files of any content, archives, score arguments).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback

import numpy as np
from hypothesis import HealthCheck, given, settings, seed as hseed, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

import formal_transformers as ft

ALLOWED = (ValueError, TypeError, IndexError)
COUNTS: dict[str, int] = {}
LOG = None


def log(name: str, what) -> None:
    """Count the example and write it (flushed) before running it: a crash's input is the last line."""
    COUNTS[name] = COUNTS.get(name, 0) + 1
    if LOG is not None:
        LOG.write(f"{name}: {what!r}\n"[:20000])
        LOG.flush()


def call(f, *a, **kw):
    """f(*a, **kw), or None when it raised one of the allowed exceptions (anything else propagates)."""
    try:
        return f(*a, **kw)
    except ALLOWED:
        return None


# ------------------------------------------------------------------------------------------------------
# strategies
small = st.integers(-2, 6)
huge = st.sampled_from([2**40, 2**41 + 1, 2**62, 2**63 - 1, -(2**63), 2**64, 10**30])
size = st.one_of(small, small, small, huge)
odd = st.sampled_from([None, 1.5, "3", True, float("nan"), [2], np.int64(3), np.float32(2.0)])
size_or_odd = st.one_of(size, size, size, odd)
dtypes = st.sampled_from(["float32", "float64", None, "float16", "int64", np.float32, "complex128", 3, "x"])
finite = st.floats(-1e3, 1e3, allow_nan=False, width=64)
weird = st.sampled_from([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e308, -1e308, 5e-324, 1e-40])


@st.composite
def arrays(draw, max_dims=3, max_side=5):
    """A numpy array (or list / scalar) of a random kind, shape and content."""
    kind = draw(st.sampled_from(["f64", "f32", "int", "bool", "object", "complex", "list", "scalar", "empty", "weird"]))
    ndim = draw(st.integers(0, max_dims))
    shape = tuple(draw(st.lists(st.integers(0, max_side), min_size=ndim, max_size=ndim)))
    n = int(np.prod(shape)) if shape else 1
    if kind == "scalar":
        return draw(st.one_of(st.integers(-5, 2**70), finite, st.none(), st.text(max_size=3)))
    if kind == "empty":
        return np.zeros((0,) * max(ndim, 1))
    if kind == "int":
        vals = draw(st.lists(st.one_of(st.integers(-3, 12), st.sampled_from([2**31, 2**40, -(2**63), 2**63 - 1])),
                             min_size=n, max_size=n))
        return np.array(vals, dtype=np.int64).reshape(shape)
    if kind == "bool":
        return np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool).reshape(shape)
    if kind == "object":
        return np.array([None] * n, dtype=object).reshape(shape)
    if kind == "list":
        return draw(st.lists(st.one_of(st.integers(-2, 12), st.lists(st.integers(-2, 12), max_size=4)), max_size=4))
    vals = draw(st.lists(st.one_of(finite, finite, finite, weird), min_size=n, max_size=n))
    a = np.array(vals, dtype=np.float64).reshape(shape)
    if kind == "f32":
        return a.astype(np.float32)
    if kind == "complex":
        return a.astype(np.complex128)
    if kind == "weird":
        return np.asfortranarray(a)[..., ::-1] if a.ndim else a
    return a


@st.composite
def ids(draw, n_vocab=12, l_max=8, batch=True):
    """Token ids: mostly valid sequences, sometimes out of range, empty, too long, ragged or mistyped."""
    kind = draw(st.sampled_from(["seq", "seq", "batch", "ragged", "bad"] if batch else ["seq", "seq", "bad"]))
    tok = st.integers(0, n_vocab - 1)
    if kind == "seq":
        return np.array(draw(st.lists(tok, min_size=1, max_size=l_max)), dtype=np.int64)
    if kind == "batch":
        n, l = draw(st.integers(1, 3)), draw(st.integers(1, l_max))
        return np.array(draw(st.lists(tok, min_size=n * l, max_size=n * l)), dtype=np.int64).reshape(n, l)
    if kind == "ragged":
        return [np.array(s, dtype=np.int64) for s in draw(st.lists(st.lists(tok, min_size=1, max_size=l_max), min_size=1, max_size=3))]
    return draw(st.one_of(arrays(), st.lists(st.integers(-3, n_vocab + 2), max_size=l_max + 3)))


# ------------------------------------------------------------------------------------------------------
# 1. constructors
CONSTRUCTORS = {
    "TokenEmbedding": (lambda a, kw: ft.TokenEmbedding(a[0], a[1], **kw), 2),
    "PositionalEmbedding": (lambda a, kw: ft.PositionalEmbedding(a[0], a[1], **kw), 2),
    "PositionalEmbedding_sin": (lambda a, kw: ft.PositionalEmbedding(a[0], a[1], "sinusoidal", **kw), 2),
    "BasicAttention": (lambda a, kw: ft.BasicAttention(a[0], a[1], a[2], **kw), 3),
    "Attention": (lambda a, kw: ft.Attention(a[0], a[1], a[2], a[3], **kw), 4),
    "Attention_uni": (lambda a, kw: ft.Attention(a[0], a[1], a[2], a[3], "unidirectional", **kw), 4),
    "MHAttention": (lambda a, kw: ft.MHAttention(*a[:6], **kw), 6),
    "LayerNorm": (lambda a, kw: ft.LayerNorm(a[0], **kw), 1),
    "RMSNorm": (lambda a, kw: ft.RMSNorm(a[0], **kw), 1),
    "Unembedding": (lambda a, kw: ft.Unembedding(a[0], a[1], **kw), 2),
    "DTransformer": (lambda a, kw: ft.DTransformer(*a[:6], **kw), 6),
    "DTransformer_llama": (lambda a, kw: ft.DTransformer(*a[:6], positional="rope", H_kv=a[6], mlp="swiglu", bias=False,
                                                         norm="rms", **kw), 7),
    "DTransformer_alibi": (lambda a, kw: ft.DTransformer(*a[:6], positional="alibi", H_kv=a[6], **kw), 7),
    "DTransformer_mistral": (lambda a, kw: ft.DTransformer(*a[:6], positional="rope", sliding_window=a[6], **kw), 7),
    "ETransformer": (lambda a, kw: ft.ETransformer(*a[:7], **kw), 7),
    "ETransformer_bert": (lambda a, kw: ft.ETransformer(*a[:7], n_segments=a[0], embed_norm=True, unembed_bias=True, **kw), 7),
    "EDTransformer": (lambda a, kw: ft.EDTransformer(*a[:7], **kw), 7),
    "masks": (lambda a, kw: (ft.unidirectional_mask(a[0], a[1]), ft.bidirectional_mask(a[0], a[1])), 2),
    "DInference": (lambda a, kw: ft.DInference(a[0], *a[1:2]), 2),
    "EDInference": (lambda a, kw: ft.EDInference(max_len=a[0]), 1),
    "Adam": (lambda a, kw: ft.Adam(*a[:5]), 5),
    "SGD": (lambda a, kw: ft.SGD(a[0]), 1),
    "chunk": (lambda a, kw: ft.chunk(np.arange(10), a[0], a[1]), 2),
    # any count: above max_num_threads() a ValueError (libgomp crashed the process before); restored to 2
    "set_num_threads": (lambda a, kw: (ft.set_num_threads(a[0]), ft.set_num_threads(2)), 1),
}
rate_or_odd = st.one_of(st.floats(0, 1, exclude_max=True), st.floats(0, 1, exclude_max=True), weird, odd,
                        st.just(1.0), st.just(-0.5))
MODEL_KW = st.fixed_dictionaries({}, optional={
    "dtype": dtypes, "seed": st.one_of(st.integers(-5, 2**70), odd), "d_attn": size_or_odd, "d_mid": size_or_odd,
    "eps": st.one_of(finite, weird), "init_std": st.one_of(finite, weird), "base": st.one_of(finite, weird, st.none()),
    # dropout (docs/regularisation.md): rates in [0, 1), or anything else (ValueError / TypeError naming it)
    "dropout": rate_or_odd, "embed_dropout": rate_or_odd, "attn_dropout": rate_or_odd, "resid_dropout": rate_or_odd})


@given(name=st.sampled_from(sorted(CONSTRUCTORS)), args=st.lists(size_or_odd, min_size=7, max_size=7), kw=MODEL_KW)
def constructors(name, args, kw):
    make, _ = CONSTRUCTORS[name]
    if name in ("DTransformer", "ETransformer", "ETransformer_bert", "EDTransformer"):
        pass
    elif name in ("PositionalEmbedding", "PositionalEmbedding_sin"):
        kw = {k: v for k, v in kw.items() if k in ("dtype", "seed", "base")}
    elif name in ("masks", "DInference", "EDInference", "Adam", "SGD", "chunk", "set_num_threads"):
        kw = {}
    else:
        kw = {k: v for k, v in kw.items() if k in ("dtype", "seed")}
    if name in ("DTransformer", "ETransformer", "ETransformer_bert", "EDTransformer"):
        kw.pop("base", None)
    log("constructors", (name, args, kw))
    t = time.perf_counter()
    obj = call(make, args, kw)
    assert time.perf_counter() - t < 5, f"{name}{tuple(args)} took {time.perf_counter() - t:.1f} s"
    if obj is not None and hasattr(obj, "params"):
        n = sum(v.size for v in obj.params.values())
        assert n < 10**8, f"{name}{tuple(args)} built {n} parameters"
        for v in obj.params.values():
            assert v.flags.writeable
    if name == "set_num_threads":
        ft.set_num_threads(2)


# ------------------------------------------------------------------------------------------------------
# 2. component calls (forward, backward) with arbitrary arguments
def components():
    return {
        "TokenEmbedding": ft.TokenEmbedding(12, 4, dtype="float64"),
        "PositionalEmbedding": ft.PositionalEmbedding(8, 4),
        "BasicAttention": ft.BasicAttention(4, 3, 2, dtype="float64"),
        "Attention": ft.Attention(4, 3, 2, 5, "unidirectional"),
        "Attention_mask": ft.Attention(4, 4, 2, 3, np.tril(np.ones((3, 3), dtype=bool)).T.copy()),
        "MHAttention": ft.MHAttention(2, 4, 4, 2, 2, 4, "unidirectional", dtype="float64"),
        "LayerNorm": ft.LayerNorm(4),
        "RMSNorm": ft.RMSNorm(4, dtype="float64"),
        "Unembedding": ft.Unembedding(12, 4),
    }


COMPONENTS = None


@given(name=st.sampled_from(["TokenEmbedding", "PositionalEmbedding", "BasicAttention", "Attention", "Attention_mask",
                             "MHAttention", "LayerNorm", "RMSNorm", "Unembedding", "softmax", "gelu", "relu"]),
       a=st.lists(arrays(), min_size=2, max_size=2), back=arrays(), order=st.booleans())
def component_calls(name, a, back, order):
    global COMPONENTS
    if COMPONENTS is None:
        COMPONENTS = components()
    log("component_calls", (name, a, back, order))
    if name in ("softmax", "gelu", "relu"):
        call(getattr(ft, name), a[0])
        return
    c = COMPONENTS[name]
    before = {k: v.copy() for k, v in c.params.items()}
    if order:
        call(c.backward, back)  # before or after a forward: either works or raises
    r = call(c, a[0], a[1]) if name in ("BasicAttention", "Attention", "Attention_mask", "MHAttention") and a[1] is not None \
        else call(c, a[0])
    if r is None and name in ("BasicAttention", "Attention", "Attention_mask", "MHAttention"):
        r = call(c, a[0])
    call(c.backward, back)
    for k, v in c.params.items():  # calls never write θ
        assert np.array_equal(v, before[k], equal_nan=True), f"{name}: a call changed parameter {k}"
    call(c.zero_grad)


class pytest_raises:
    """with pytest_raises(E, "words"): the block raises E whose message holds the words (no pytest here)."""

    def __init__(self, kind, words):
        self.kind, self.words = kind, words

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        assert et is not None and issubclass(et, self.kind), f"expected {self.kind.__name__}, got {et}"
        assert self.words in str(ev), f"{self.kind.__name__} without '{self.words}': {ev}"
        return True


# ------------------------------------------------------------------------------------------------------
# 3. call sequences on a model: a state machine
class ModelMachine(RuleBasedStateMachine):
    """forward / logits / loss / loss_and_grad / inference / attention_weights / zero_grad / params assignment /
    save-load in
    random order, on a small D, E or ED transformer. Invariants: the parameter names and shapes never
    change; a call that raises changes neither θ nor the gradients (never a half-updated model); θ
    changes only by an assignment or a load."""

    def __init__(self):
        super().__init__()
        self.model = None
        self.tmp = tempfile.mkdtemp(prefix="ft-fuzz-")

    @initialize(arch=st.sampled_from(["D", "E", "ED"]), dtype=st.sampled_from(["float32", "float64"]),
                tied=st.booleans(), seed=st.integers(0, 5), dropout=st.sampled_from([0.0, 0.0, 0.1, 0.5, 0.9]),
                positional=st.sampled_from(["learned", "learned", "sinusoidal", "rope", "alibi"]),
                H_kv=st.sampled_from([2, 1]), mlp=st.sampled_from(["gelu", "swiglu"]))
    def build(self, arch, dtype, tied, seed, dropout, positional, H_kv, mlp):
        log("machine", ("build", arch, dtype, tied, seed, dropout, positional, H_kv, mlp))
        self.positional = positional if arch == "D" else "learned"
        if arch == "D":  # the variants (docs/variants.md) are decoder options
            self.model = ft.DTransformer(12, 8, 2, 2, 4, 6, dtype=dtype, tied=tied, seed=seed, dropout=dropout,
                                         positional=positional, H_kv=H_kv, mlp=mlp)
        elif arch == "E":
            bert = dict(n_segments=2, embed_norm=True, unembed_bias=True) if seed % 2 else {}  # BERT's options
            self.model = ft.ETransformer(12, 8, 1, 2, 4, 6, 4, dtype=dtype, tied=tied, seed=seed, dropout=dropout, **bert)
        else:
            self.model = ft.EDTransformer(12, 8, 1, 2, 2, 4, 6, dtype=dtype, tied=tied, seed=seed, dropout=dropout)
        self.arch = arch
        self.names = {k: v.shape for k, v in self.model.params.items()}
        self.theta = self.snapshot()

    def snapshot(self):
        return {k: v.copy() for k, v in self.model.params.items()}

    def guarded(self, what, f, *a, **kw):
        """Run a call; if it raises, neither θ nor the gradients may have changed."""
        log("machine", (what, a, kw))
        th, gr = self.snapshot(), {k: v.copy() for k, v in self.model.grads.items()}
        try:
            return f(*a, **kw)
        except ALLOWED:
            for k, v in self.model.params.items():
                assert np.array_equal(v, th[k], equal_nan=True), f"{what} raised after changing θ[{k}]"
            for k, v in self.model.grads.items():
                assert np.array_equal(v, gr[k], equal_nan=True), f"{what} raised after changing grads[{k}]"
            return None

    def args(self, x, z):
        return (z, x) if self.arch == "ED" else (x,)

    @rule(x=ids(), z=ids())
    def forward(self, x, z):
        self.guarded("forward", self.model, *self.args(x, z))

    @rule(x=ids(), z=ids())
    def logits(self, x, z):
        self.guarded("logits", self.model.logits, *self.args(x, z))

    @rule(x=ids(), z=ids(), red=st.sampled_from(["sum", "mean", "max", 3]))
    def loss(self, x, z, red):
        self.guarded("loss", self.model.loss, *self.args(x, z), reduction=red)

    @rule(x=ids(), z=ids(), copy=st.booleans())
    def loss_and_grad(self, x, z, copy):
        self.guarded("loss_and_grad", self.model.loss_and_grad, *self.args(x, z), copy=copy)

    @rule(data=st.data(), how=st.sampled_from(["call", "logits", "loss", "loss_and_grad"]))
    def past_l_max(self, data, how):
        """Sequences longer than ℓ_max = 8 (and one too long for memory): RoPE and ALiBi score them (P's
        columns are distributions, attention_weights is (H, ℓ, ℓ)); a table of positions (learned,
        sinusoidal; every E and ED) refuses them with a ValueError naming l_max."""
        lens = data.draw(st.lists(st.one_of(st.integers(9, 40), st.integers(1, 8), st.just(300_000)), min_size=1, max_size=3))
        x = [np.array(data.draw(st.lists(st.integers(0, 11), min_size=n, max_size=n)), dtype=np.int64) if n <= 40
             else np.zeros(n, dtype=np.int64) for n in lens]
        batch = x if len(x) > 1 else x[0]
        f = {"call": self.model, "logits": self.model.logits, "loss": self.model.loss,
             "loss_and_grad": self.model.loss_and_grad}[how]
        if self.arch == "E" and how in ("loss", "loss_and_grad"):
            args, x, lens = (x[0], x[0]), x[:1], lens[:1]  # (x̃, x): one sequence
        else:
            args = self.args(batch, batch)
        log("machine", ("past_l_max", how, lens))
        r = self.guarded(how, f, *args)
        if max(lens) > 8 and self.positional in ("learned", "sinusoidal"):
            assert r is None, f"{self.positional} positions scored a sequence of length {max(lens)} > l_max"
            with pytest_raises(ValueError, "l_max"):
                f(*args)
            return
        if max(lens) >= 300_000:
            assert r is None, "a length too large for memory was scored"
            return
        assert r is not None, f"{self.positional}: a batch of lengths {lens} (≤ 40) was refused"
        if how == "call" and self.arch == "D":
            for P, n in zip(r if len(x) > 1 else [r], lens):
                assert P.shape == (12, n), P.shape
                if np.isfinite(P).all():
                    assert np.allclose(P.sum(axis=0), 1.0, atol=1e-4)
            A = self.guarded("attention_weights", self.model.attention_weights, 0, len(x) - 1)
            assert A is not None and A.shape == (2, lens[-1], lens[-1]), None if A is None else A.shape

    @rule(x=ids(), seg=ids(n_vocab=3), none=st.booleans())
    def hidden_segments(self, x, seg, none):  # ETransformer: X after line 9, with BERT's segment ids (or None)
        if self.arch == "E":
            self.guarded("hidden", self.model.hidden, x, segments=None if none else seg)
            self.guarded("loss_and_grad segments", self.model.loss_and_grad, x, x, segments=seg)

    @rule()
    def zero_grad(self):
        log("machine", ("zero_grad",))
        self.model.zero_grad()
        assert all(not np.any(g) for g in self.model.grads.values())

    @rule(data=st.data())
    def assign(self, data):
        name = data.draw(st.sampled_from(sorted(self.names) + ["nope", 3]))
        shape = self.names.get(name, (2,))
        value = data.draw(st.one_of(arrays(), st.just("shape")))
        if isinstance(value, str):
            value = np.asarray(data.draw(st.lists(finite, min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))).reshape(shape)
        log("machine", ("assign", name, value))
        try:
            self.model.params[name] = value
        except (*ALLOWED, KeyError):
            pass
        self.theta = self.snapshot()

    @rule(data=st.data())
    def update_many(self, data):
        names = data.draw(st.lists(st.sampled_from(sorted(self.names)), max_size=3, unique=True))
        upd = {n: np.zeros(self.names[n]) for n in names}
        if names and data.draw(st.booleans()):
            upd[names[-1]] = np.zeros((1,) + tuple(self.names[names[-1]]))  # one bad: all or nothing
        self.guarded("params.update", self.model.params.update, upd)
        self.theta = self.snapshot()

    @rule(l_gen=st.integers(-1, 12), tau=st.sampled_from([0.0, 0.5, 1.0, -1.0, float("nan")]), cache=st.booleans(),
          top_k=st.sampled_from([None, 0, 1, 3, 100]), x=ids(batch=False),
          context=st.sampled_from(["auto", "window", "full", "all"]))
    def inference(self, l_gen, tau, cache, top_k, x, context):
        if self.arch == "D":
            inf = call(ft.DInference, l_gen, tau, top_k=top_k, seed=1, cache=cache, context=context)
            if inf is not None:
                self.guarded("DInference", inf, x, self.model)
        elif self.arch == "ED":
            inf = call(ft.EDInference, tau, max_len=l_gen if l_gen > 0 else None, top_k=top_k, seed=1, cache=cache)
            if inf is not None:
                self.guarded("EDInference", inf, x, self.model)
        assert all(np.array_equal(v, self.theta[k], equal_nan=True) for k, v in self.model.params.items()), \
            "inference changed θ"

    @rule(kind=st.sampled_from(["enc", "dec", "cross", "x", 0]), layer=st.sampled_from([-1, 0, 1, 2, 2**31, 2**63]),
          seq=st.sampled_from([-1, 0, 1, 5, 2**31]))
    def attention_weights(self, kind, layer, seq):
        """Any state (before a forward, after a batch, after cached inference, after a failed call): a clear
        exception or matrices whose columns are probability distributions (or NaN where θ holds NaN)."""
        args = (kind, layer, seq) if self.arch == "ED" else (layer, seq)
        A = self.guarded("attention_weights", self.model.attention_weights, *args)
        if A is not None:
            assert A.ndim == 3 and A.shape[0] == 2, A.shape
            if np.isfinite(A).all():
                assert np.allclose(A.sum(axis=1), 1.0, atol=1e-4), "attention columns do not sum to 1"
                assert (A >= 0).all()

    @rule(dtype=st.sampled_from([None, "float32", "float64", "int8"]))
    def save_load(self, dtype):
        log("machine", ("save_load", dtype))
        p = os.path.join(self.tmp, "m.safetensors")
        ft.save(self.model, p)
        m2 = call(ft.load, p, dtype=dtype)
        if m2 is None:
            assert dtype == "int8"
            return
        assert m2.config == dict(self.model.config, **({"dtype": dtype} if dtype else {}))
        for k, v in self.model.params.items():
            if m2.dtype == self.model.dtype:
                assert np.array_equal(m2.params[k], v, equal_nan=True), k
        if m2.dtype == self.model.dtype:
            self.model = m2

    @invariant()
    def shapes_and_theta(self):
        if self.model is None:
            return
        assert {k: v.shape for k, v in self.model.params.items()} == self.names
        for k, v in self.model.params.items():  # θ changes only by assign/update/load
            assert np.array_equal(v, self.theta[k], equal_nan=True), f"θ[{k}] changed outside an assignment"


# ------------------------------------------------------------------------------------------------------
# 4. tokenizers
any_text = st.lists(st.one_of(st.characters(), st.integers(0xD800, 0xDFFF).map(chr)), max_size=60).map("".join)
# (st.characters never yields surrogates: lone ones are drawn separately)


@given(kind=st.sampled_from(["char", "word", "bpe"]), corpus=any_text, text=any_text,
       unk=st.booleans(), n=st.one_of(st.integers(-3, 400), huge), ids_=arrays(max_dims=2, max_side=8))
def tokenizers(kind, corpus, text, unk, n, ids_):
    log("tokenizers", (kind, corpus, text, unk, n, ids_))
    if kind == "char":
        t = call(ft.CharTokenizer.fit, corpus, unk=unk)
    elif kind == "word":
        t = call(ft.WordTokenizer.fit, corpus, unk=unk, min_count=1)
    else:
        t = call(ft.BPETokenizer.train, corpus, n)
    if t is None:
        return
    e = call(t.encode, text)
    u = type(t).from_json(t.to_json())  # the round trip always works
    assert u.to_json() == t.to_json()
    if e is not None:
        assert list(u.encode(text)) == list(e)
        d = t.decode(e)
        if kind in ("char", "bpe") and (kind == "bpe" or unk is False or all(c in corpus for c in text)):
            assert d == text, (text, d)
    call(t.decode, ids_)
    call(t.encode, ids_)


@given(kind=st.sampled_from(["char", "word", "bpe"]), data=st.data())
def tokenizer_files(kind, data):
    """from_json of mutated valid files and of arbitrary text: a tokenizer or ValueError/TypeError."""
    base = {"char": ft.CharTokenizer.fit("hello wörld \ud800", unk=True),
            "word": ft.WordTokenizer.fit("the cat sat on the mat", unk=True, min_count=1),
            "bpe": ft.BPETokenizer.train("the cat sat on the mat " * 4, 270)}[kind]
    s = base.to_json()
    how = data.draw(st.sampled_from(["cut", "splice", "replace", "text", "json"]))
    if how == "cut":
        s = s[: data.draw(st.integers(0, len(s)))]
    elif how == "splice":
        i = data.draw(st.integers(0, len(s)))
        s = s[:i] + data.draw(st.text(max_size=8)) + s[i + data.draw(st.integers(0, 8)):]
    elif how == "replace":
        obj = json.loads(s)
        key = data.draw(st.sampled_from(sorted(obj)))
        obj[key] = data.draw(st.one_of(st.integers(-2**70, 2**70), st.text(max_size=5), st.none(), st.lists(st.integers(-3, 300), max_size=5),
                                       st.floats(), st.booleans(), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)))
        s = json.dumps(obj)
    elif how == "text":
        s = data.draw(any_text)
    else:
        s = json.dumps(data.draw(st.recursive(st.one_of(st.none(), st.integers(), st.text(max_size=4)),
                                              lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=4), c, max_size=3)),
                                              max_leaves=8)))
    log("tokenizer_files", (kind, s))
    for cls in (ft.CharTokenizer, ft.WordTokenizer, ft.BPETokenizer):
        t = call(cls.from_json, s)
        if t is not None:
            call(t.encode, "the cat \ud800 sat")
            t.to_json()


# ------------------------------------------------------------------------------------------------------
# 5. model files
def model_file(tmp):
    p = os.path.join(tmp, "good.safetensors")
    if not os.path.exists(p):
        ft.save(ft.DTransformer(12, 8, 1, 2, 4, 6), p)
    return p


@given(data=st.data())
def model_files(data):
    """ft.load of damaged files and configs: a model or ValueError (or TypeError for a bad argument)."""
    tmp = tempfile.gettempdir()
    good = open(model_file(tmp), "rb").read()
    how = data.draw(st.sampled_from(["cut", "flip", "config", "bytes"]))
    if how == "cut":
        blob = good[: data.draw(st.integers(0, len(good)))]
    elif how == "flip":
        blob = bytearray(good)
        for _ in range(data.draw(st.integers(1, 4))):
            i = data.draw(st.integers(0, min(len(blob) - 1, 600)))
            blob[i] = data.draw(st.integers(0, 255))
        blob = bytes(blob)
    elif how == "bytes":
        blob = data.draw(st.binary(max_size=200))
    else:
        from safetensors.numpy import load_file, save_file

        meta = ft.io.read_metadata(model_file(tmp))
        cfg = json.loads(meta["formal_transformers.config"])
        key = data.draw(st.sampled_from(sorted(cfg) + ["arch", "extra"]))
        cfg[key] = data.draw(st.one_of(size_or_odd, st.text(max_size=6), st.sampled_from(
            ["DTransformer", "ETransformer", "EDTransformer", "layer", "rms", "sinusoidal", "tanh", "rope",
             "alibi", "swiglu", True, False]), st.floats()))
        if data.draw(st.booleans()):
            cfg.pop(data.draw(st.sampled_from(sorted(cfg))), None)
        # (safetensors metadata is UTF-8: no lone surrogates there)
        meta["formal_transformers.config"] = (json.dumps(cfg, default=lambda o: o.item() if hasattr(o, "item") else str(o))
                                              if data.draw(st.integers(0, 5)) else data.draw(st.text(max_size=40)))
        p = os.path.join(tmp, f"cfg-{os.getpid()}.safetensors")
        save_file(load_file(model_file(tmp)), p, metadata=meta)
        blob = open(p, "rb").read()
    p = os.path.join(tmp, f"fuzz-{os.getpid()}.safetensors")
    with open(p, "wb") as f:
        f.write(blob)
    log("model_files", (how, blob[:2000]))
    t = time.perf_counter()
    try:
        m = ft.load(p, dtype=data.draw(st.sampled_from([None, "float64"])))
    except (ValueError, TypeError):
        m = None
    assert time.perf_counter() - t < 10, "ft.load took too long"
    if m is not None:
        m(np.array([1, 2]))


_PROMPT = {}


def prompt_cache_file(tmp):
    """A DTransformer and a prompt cache file of it (made once per process)."""
    if not _PROMPT:
        m = ft.DTransformer(12, 8, 1, 2, 4, 6, positional="rope", seed=5)
        p = os.path.join(tmp, f"cache-{os.getpid()}.safetensors")
        ft.DInference.prefill(np.array([3, 1, 4, 1, 5]), m).save(p)
        _PROMPT.update(model=m, blob=open(p, "rb").read())
    return _PROMPT["model"], _PROMPT["blob"]


@given(data=st.data())
def prompt_caches(data):
    """ft.PromptCache.load of damaged caches (cut, bytes changed in the header or the data, metadata values
    replaced): a cache that continues as its ids, or ValueError."""
    tmp = tempfile.gettempdir()
    m, good = prompt_cache_file(tmp)
    how = data.draw(st.sampled_from(["cut", "flip", "meta", "bytes"]))
    if how == "cut":
        blob = good[: data.draw(st.integers(0, len(good)))]
    elif how == "flip":
        blob = bytearray(good)
        for _ in range(data.draw(st.integers(1, 4))):
            i = data.draw(st.integers(0, len(blob) - 1))
            blob[i] = data.draw(st.integers(0, 255))
        blob = bytes(blob)
    elif how == "bytes":
        blob = data.draw(st.binary(max_size=200))
    else:
        n = int.from_bytes(good[:8], "little")
        header = json.loads(good[8:8 + n])
        meta = header["__metadata__"]
        meta[data.draw(st.sampled_from(sorted(meta) + ["extra"]))] = data.draw(st.one_of(
            st.text(max_size=12), st.sampled_from(["1", "2", "3,1,4,1,5", "3,1,4,1,6", "0", "", "18446744073709551616"])))
        text = json.dumps(header).encode()
        text += b" " * ((8 - len(text) % 8) % 8)
        blob = len(text).to_bytes(8, "little") + text + good[8 + n:]
    p = os.path.join(tmp, f"fuzz-cache-{os.getpid()}.safetensors")
    with open(p, "wb") as f:
        f.write(blob)
    log("prompt_caches", (how, blob[:2000]))
    t = time.perf_counter()
    try:
        cache = ft.PromptCache.load(p, m)
    except ValueError:
        cache = None
    assert time.perf_counter() - t < 10, "PromptCache.load took too long"
    if cache is not None:  # what loads is the cache of its ids
        inf = ft.DInference(2, 0.0)
        assert np.array_equal(inf(cache, m), inf(cache.ids, m))


# ------------------------------------------------------------------------------------------------------
# 6. Hugging Face directories (ft.load_hf): save_hf's config.json with values of any type, range or
# nesting, keys dropped, RoPE keys added, the text cut — a model or ValueError, quickly
_HF_DIRS: dict = {}


def hf_dir(kind: str) -> str:
    """A save_hf directory of a tiny GPT-2 / BERT / LLaMA-style model (made once per process)."""
    if kind not in _HF_DIRS:
        d = tempfile.mkdtemp(prefix=f"ft-fuzz-hf-{kind}-")
        m = {"gpt2": lambda: ft.DTransformer(11, 6, 2, 2, 4, 6),
             "bert": lambda: ft.ETransformer(11, 6, 2, 2, 4, 6, 4, embed_norm=True, unembed_bias=True, n_segments=2),
             "llama": lambda: ft.DTransformer(11, 6, 2, 2, 4, 6, positional="rope", H_kv=1, mlp="swiglu", bias=False,
                                              norm="rms")}[kind]()
        ft.save_hf(m, d)
        _HF_DIRS[kind] = d
    return _HF_DIRS[kind]


hf_value = st.one_of(
    st.integers(-3, 8), st.sampled_from([0, 1, 2, 4, 10**6, 10**7, 2**31 - 1, 2**31, 2**63, 2**64, -(2**63)]),
    st.floats(), st.sampled_from([5e-324, 1e-300, 1e300, 0.5, 12.0, -0.0]), st.booleans(), st.none(),
    st.text(max_size=6), st.sampled_from(["gelu", "gelu_new", "silu", "relu", "default", "linear", "absolute"]),
    st.lists(st.integers(-2, 5), max_size=3), st.dictionaries(st.sampled_from(["rope_type", "type", "rope_theta", "factor"]),
                                                            st.one_of(st.text(max_size=7), st.floats(), st.integers()),
                                                            max_size=3))


@given(kind=st.sampled_from(["gpt2", "bert", "llama"]), data=st.data())
def hf_dirs(kind, data):
    import shutil

    src = hf_dir(kind)
    cfg = json.load(open(os.path.join(src, "config.json")))
    how = data.draw(st.sampled_from(["value", "value", "value", "drop", "rope", "nest", "cut", "layers"]))
    if how == "value":
        for _ in range(data.draw(st.integers(1, 3))):
            cfg[data.draw(st.sampled_from(sorted(cfg) + ["rope_scaling", "rope_parameters", "n_inner", "head_dim"]))] = \
                data.draw(hf_value)
    elif how == "drop":
        cfg.pop(data.draw(st.sampled_from(sorted(cfg))))
    elif how == "rope":
        cfg[data.draw(st.sampled_from(["rope_scaling", "rope_parameters"]))] = data.draw(st.fixed_dictionaries(
            {}, optional={"rope_type": st.sampled_from(["default", "linear", "dynamic", "yarn", "llama3", None, 3]),
                          "type": st.sampled_from(["default", "linear"]), "rope_theta": hf_value, "factor": hf_value}))
        if data.draw(st.booleans()):
            cfg["rope_theta"] = data.draw(hf_value)
    elif how == "layers":
        cfg[{"gpt2": "n_layer"}.get(kind, "num_hidden_layers")] = data.draw(st.sampled_from(
            [0, 1, 3, 10**6, 10**7, 2**31 - 1, 2**64, 1e300, float("inf")]))
    text = json.dumps(cfg)
    if how == "nest":
        depth = data.draw(st.sampled_from([10, 1000, 100_000]))
        text = text[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}"
    elif how == "cut":
        text = text[: data.draw(st.integers(0, len(text)))]
    d = tempfile.mkdtemp(prefix="ft-fuzz-hfcase-")
    try:
        shutil.copy(os.path.join(src, "model.safetensors"), d)
        with open(os.path.join(d, "config.json"), "w") as f:
            f.write(text)
        log("hf_dirs", (kind, how, text[:3000]))
        t = time.perf_counter()
        try:
            m = ft.load_hf(d)
        except ValueError:
            m = None
        assert time.perf_counter() - t < 10, "ft.load_hf took too long"
        if m is not None:
            m(np.array([0, 1]))
    finally:
        shutil.rmtree(d, ignore_errors=True)


# ------------------------------------------------------------------------------------------------------
# 7. the command line: options of any value (train on a tiny text, --steps ≤ 2) and --resume / sample of a
# damaged run directory — exit code 0, or 2 with one error line; never a traceback; a refused command
# changes nothing in the run directory
_RUN: dict = {}
_CLI_SMALL = ["--context", "6", "--layers", "1", "--heads", "2", "--d-e", "4", "--d-mlp", "6", "--batch", "2",
              "--eval-every", "1", "--warmup", "1", "--quiet", "--val-frac", "0.2"]


def _cli(args) -> tuple:
    """(exit code, stderr) of the CLI in this process; any other exception propagates (a finding)."""
    import contextlib
    import io

    from formal_transformers import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(args)
        except SystemExit as e:
            code = e.code
    return code, err.getvalue()


def cli_text() -> str:
    if "text" not in _RUN:
        d = tempfile.mkdtemp(prefix="ft-fuzz-cli-")
        p = os.path.join(d, "t.txt")
        with open(p, "w") as f:
            f.write("abcdefgh " * 40)
        _RUN["text"], _RUN["dir"] = p, d
    return _RUN["text"]


def cli_run() -> str:
    """A finished 2-step run directory with every file a run holds (made once per process)."""
    if "run" not in _RUN:
        run = os.path.join(os.path.dirname(cli_text()), "run")
        code, err = _cli(["train", "--text", cli_text(), "--out", run, "--steps", "2", "--patience", "3",
                          "--restore-best", *_CLI_SMALL])
        assert code in (0, None), err
        _RUN["run"] = run
    return _RUN["run"]


def _diverged(code) -> bool:
    """The CLI's documented end of a run whose loss became NaN/inf (--nonfinite raise): the run saved up to the
    step before, then SystemExit("error: …")."""
    return isinstance(code, str) and code.startswith("error: training step ")


cli_value = st.one_of(st.sampled_from(["0", "1", "2", "-1", "3", "0.5", "1e-3", "nan", "inf", "-inf", "1e400", "x", "",
                                       str(2**31), str(2**70), "1_0", " 2", "0x10"]), st.integers(-3, 4).map(str))
CLI_VALID = {  # option -> values that train a tiny model (drawn as often as the odd ones of cli_value)
    "--context": ["2", "3", "6"], "--layers": ["1", "2"], "--heads": ["1", "2"], "--d-e": ["2", "4"],
    "--d-mlp": ["1", "6"], "--batch": ["1", "3"], "--steps": ["0", "1", "2"], "--lr": ["1e-3", "0.5", "1e4"],
    "--min-lr": ["0", "1e-4"], "--warmup": ["0", "5"], "--weight-decay": ["0", "0.1"], "--dropout": ["0", "0.5"],
    "--eval-every": ["0", "1"], "--patience": ["1", "2"], "--min-delta": ["0", "0.1"], "--val-frac": ["0", "0.5", "0.9"],
    "--val-seqs": ["1", "3"], "--seed": ["0", "7"], "--vocab": ["260", "300"], "--tokenizer": ["char", "bpe"],
    "--nonfinite": ["raise", "skip", "warn"]}
CLI_OPTIONS = sorted(CLI_VALID)


@given(data=st.data())
def cli_args(data):
    """train with up to three options set to any value: exit 0, or exit 2 with one error line."""
    import shutil

    args = ["train", "--text", cli_text(), *_CLI_SMALL, "--steps", "1"]
    for _ in range(data.draw(st.integers(1, 3))):
        opt = data.draw(st.sampled_from(CLI_OPTIONS))
        val = data.draw(st.one_of(st.sampled_from(CLI_VALID[opt]), cli_value))
        if opt in ("--context", "--d-e", "--d-mlp", "--layers", "--heads", "--batch", "--val-seqs", "--vocab") and \
                val.strip().lstrip("-").isdigit() and int(val) > 300:
            val = str(2**31)  # a size that builds a big model legitimately is not what this looks for
        if opt == "--steps" and val.strip().isdigit() and int(val) > 2:
            val = "2"
        if opt == "--tokenizer" and val == "bpe":
            args += ["--vocab", "260"]
        args += [opt, val]
    out = tempfile.mkdtemp(prefix="ft-fuzz-clirun-")
    try:
        log("cli_args", args)
        code, err = _cli(args + ["--out", os.path.join(out, "r")])
        assert code in (0, None, 2) or _diverged(code), (code, err)
        assert "Traceback" not in err, err
        if code == 2:  # argparse's usage (for a bad argument) and one error line naming the problem
            assert err.strip() and ": error: " in err.strip().splitlines()[-1], err
    finally:
        shutil.rmtree(out, ignore_errors=True)


@given(data=st.data())
def cli_run_dirs(data):
    """--resume and sample of a run directory with one file damaged (cut, bytes changed, removed, a JSON
    value replaced): exit 0, or exit 2 naming the problem with the directory unchanged."""
    import shutil

    good = cli_run()
    files = sorted(os.listdir(good))
    d = tempfile.mkdtemp(prefix="ft-fuzz-clidir-")
    run = os.path.join(d, "run")
    try:
        shutil.copytree(good, run)
        name = data.draw(st.sampled_from(files))
        p = os.path.join(run, name)
        blob = open(p, "rb").read()
        how = data.draw(st.sampled_from(["cut", "flip", "remove", "json"] if name.endswith(".json") else ["cut", "flip", "remove"]))
        if how == "cut":
            blob = blob[: data.draw(st.integers(0, len(blob)))]
        elif how == "flip":
            blob = bytearray(blob)
            for _ in range(data.draw(st.integers(1, 4))):
                blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
            blob = bytes(blob)
        elif how == "json":
            obj = json.loads(blob)
            if isinstance(obj, dict) and obj:
                key = data.draw(st.sampled_from(sorted(obj)))
                obj[key] = data.draw(st.one_of(hf_value, st.just({"best_val_loss": 1.0})))
            blob = json.dumps(obj).encode()
        if how == "remove":
            os.remove(p)
        else:
            with open(p, "wb") as f:
                f.write(blob)
        before = {f: open(os.path.join(run, f), "rb").read() for f in sorted(os.listdir(run))}
        cmd = data.draw(st.sampled_from(["resume", "sample"]))
        args = (["train", "--text", cli_text(), "--out", run, "--steps", "3", "--patience", "3", "--restore-best",
                 "--resume", *_CLI_SMALL] if cmd == "resume" else ["sample", "--run", run, "--tokens", "2", "--samples", "1"])
        log("cli_run_dirs", (name, how, blob[:1500], cmd))
        code, err = _cli(args)
        assert code in (0, None, 2) or _diverged(code), (code, err)
        assert "Traceback" not in err, err
        if code == 2:
            assert len(err.strip().splitlines()) == 1 and ": error: " in err, err
            after = {f: open(os.path.join(run, f), "rb").read() for f in sorted(os.listdir(run))}
            assert after == before, "a refused command changed the run directory"
    finally:
        shutil.rmtree(d, ignore_errors=True)


# ------------------------------------------------------------------------------------------------------
# 8. ft.datasets: a cache file of any content (with downloads off) is the pinned file or DataNotFoundError;
# the Tatoeba derivation of any bytes is a file or DataNotFoundError / ValueError; bleu / split_by_source
# arguments of any value
@given(data=st.data())
def dataset_files(data):
    import hashlib

    from formal_transformers import datasets

    good = b"First Citizen:\nBefore we proceed any further, hear me speak.\n"
    how = data.draw(st.sampled_from(["cache", "cache", "archive", "scores"]))
    if how == "cache":
        blob = data.draw(st.one_of(st.binary(max_size=80), st.just(good), st.integers(0, len(good)).map(lambda n: good[:n]),
                                   st.just(b"<!DOCTYPE html><html>404</html>")))
        log("dataset_files", (how, blob))
        d = tempfile.mkdtemp(prefix="ft-fuzz-cache-")
        saved = {k: os.environ.get(k) for k in ("FT_DATA_DIR", "FT_CACHE_DIR", "FT_DOWNLOAD")}
        sources = dict(datasets.SOURCES)
        try:
            os.makedirs(os.path.join(d, "data"))
            os.environ.update(FT_DATA_DIR=os.path.join(d, "data"), FT_CACHE_DIR=os.path.join(d, "cache"), FT_DOWNLOAD="0")
            datasets.SOURCES[datasets.TINY_SHAKESPEARE] = datasets.Source("http://127.0.0.1:9/x",
                                                                          hashlib.sha256(good).hexdigest())
            os.makedirs(os.path.join(d, "cache"))
            with open(os.path.join(d, "cache", datasets.TINY_SHAKESPEARE), "wb") as f:
                f.write(blob)
            try:
                text = datasets.tiny_shakespeare()
            except datasets.DataNotFoundError:
                assert blob != good
            else:
                assert blob == good and text == good.decode()
        finally:
            datasets.SOURCES.clear()
            datasets.SOURCES.update(sources)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            import shutil

            shutil.rmtree(d, ignore_errors=True)
    elif how == "archive":
        import io
        import zipfile

        kind = data.draw(st.sampled_from(["bytes", "zip"]))
        if kind == "bytes":
            raw = data.draw(st.binary(max_size=200))
        else:
            buf = io.BytesIO()
            with zipfile.ZipFile(buf, "w") as z:
                z.writestr(data.draw(st.sampled_from(["fra.txt", "deu.txt"])), data.draw(st.binary(max_size=100)))
            raw = buf.getvalue()
            if data.draw(st.booleans()):
                raw = raw[: data.draw(st.integers(0, len(raw)))]
        log("dataset_files", (how, raw))
        try:
            datasets._tatoeba_subset(raw, 3)
        except (datasets.DataNotFoundError, ValueError):
            pass
    else:
        words = st.lists(st.sampled_from(["le", "chat", "noir", ".", "!"]), max_size=5).map(" ".join)
        hyps = data.draw(st.lists(words, max_size=3))
        refs = data.draw(st.lists(st.one_of(words, st.lists(words, max_size=2)), max_size=3))
        max_n = data.draw(st.one_of(st.integers(-2, 6), st.sampled_from([10**9, 2.5, None, True])))
        frac = data.draw(st.one_of(st.floats(), st.integers(-1, 3), st.sampled_from([None, "0.1", True])))
        log("dataset_files", (how, hyps, refs, max_n, frac))
        score = call(datasets.bleu, hyps, refs, max_n=max_n)
        if score is not None:
            assert 0.0 <= score <= 100.0 + 1e-9 and max_n >= 1
        pairs = [datasets.TatoebaPair(f"e{i % 4}", f"f{i}", "a") for i in range(data.draw(st.integers(0, 8)))]
        split = call(datasets.split_by_source, pairs, test_fraction=frac)
        if split is not None:
            train, test = split
            assert train and test and 0 < frac < 1
            assert {p.english for p in train}.isdisjoint(p.english for p in test)
# 9. issue 27's core surfaces: thread counts, GPT-2 tokenizer files with big or odd ids, optimizer
#    hyperparameters and non-finite updates, l_gen / k sizes. Each must work or raise a clear error at once
#    (no crash, no table sized by a hostile id, no NaN θ).
thread_counts = st.one_of(st.integers(-2, 70), st.sampled_from([100, 1000, 2000, 100_000, 2**31 - 1]), huge, odd)


@given(n=thread_counts, train=st.booleans())
def threads(n, train):
    """set_num_threads(n): n ≤ max_num_threads() runs a forward and a training step on n threads; above it
    (100 000 crashed in libgomp), a ValueError that changes nothing."""
    log("threads", (n, train))
    before = ft.get_num_threads()
    try:
        if call(ft.set_num_threads, n) is None and ft.get_num_threads() == before:
            return
        assert isinstance(n, (int, np.integer)) and 1 <= n <= ft.max_num_threads(), n
        if n > 16:  # accepted; running 64 threads on a CI machine's 2 cores is slow, not a finding
            return
        m = ft.DTransformer(12, 8, 1, 2, 4, 6, seed=0)
        P = m(np.arange(8) % 12)
        assert np.allclose(P.sum(axis=0), 1.0, atol=1e-4)
        if train:
            ft.DTraining(1, 1e-3, max_steps=1, progress=False)([np.arange(8) % 12], m)
    finally:
        ft.set_num_threads(2)


def _gpt2_base() -> dict:
    """GPT-2's byte tokens in its byte-level spelling (from a tokenizer's own vocab.json)."""
    d = os.path.join(tempfile.gettempdir(), f"ft-gpt2-{os.getpid()}")
    os.makedirs(d, exist_ok=True)
    ft.BPETokenizer.from_merges([]).to_gpt2_files(os.path.join(d, "v.json"), os.path.join(d, "m.txt"))
    return {k: i for k, i in json.load(open(os.path.join(d, "v.json"), encoding="utf-8")).items() if i < 256}


GPT2_BYTES = None
big_id = st.sampled_from([2**28, 2**31 - 2, 2**31 - 1, 2**31, 2**32, 2**63 - 1, 2**64, -1, -(2**63)])


@given(data=st.data(), fmt=st.sampled_from(["gpt2", "hf"]))
def gpt2_files(data, fmt):
    """GPT-2 vocab.json + merges.txt (and tokenizer.json with added tokens) with dropped bytes, merges of
    real and unknown tokens, and ids that repeat, leave gaps or are far beyond the entries (2^31 − 2 tried to
    fill a 16 GiB table): a tokenizer or a ValueError within a second, never a table sized by the id."""
    global GPT2_BYTES
    if GPT2_BYTES is None:
        GPT2_BYTES = _gpt2_base()
    vocab = dict(GPT2_BYTES)
    for k in data.draw(st.lists(st.sampled_from(sorted(vocab)), max_size=3)):
        vocab.pop(k, None)
    keys = sorted(vocab)
    merges = []
    for _ in range(data.draw(st.integers(0, 4))):
        a, b = data.draw(st.sampled_from(keys)), data.draw(st.sampled_from(keys + ["Ġzz", "<x>"]))
        merges.append((a, b))
        vocab.setdefault(a + b, len(vocab))
    extra = data.draw(st.lists(st.tuples(st.text(min_size=1, max_size=4), st.one_of(st.integers(0, 300), big_id)), max_size=4))
    for k, i in extra:
        vocab[k] = i
    added = data.draw(st.lists(st.tuples(st.sampled_from(["<|endoftext|>", "<pad>", "Ā"]), st.one_of(st.integers(0, 300), big_id)),
                               max_size=2)) if fmt == "hf" else []
    log("gpt2_files", (fmt, sorted(vocab.items(), key=lambda kv: str(kv[1]))[-8:], merges, added))
    d = os.path.join(tempfile.gettempdir(), f"ft-gpt2-{os.getpid()}")
    os.makedirs(d, exist_ok=True)
    t0 = time.perf_counter()
    if fmt == "gpt2":
        with open(os.path.join(d, "vocab.json"), "w", encoding="utf-8") as f:
            json.dump(vocab, f)
        with open(os.path.join(d, "merges.txt"), "w", encoding="utf-8") as f:
            f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
        t = call(ft.BPETokenizer.from_gpt2_files, os.path.join(d, "vocab.json"), os.path.join(d, "merges.txt"))
    else:
        doc = json.loads(ft.BPETokenizer.from_merges([]).to_hf_json())
        doc["added_tokens"] = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                                "normalized": False, "special": True} for c, i in added]
        doc["post_processor"] = None
        doc["model"]["vocab"] = vocab
        doc["model"]["merges"] = [[a, b] for a, b in merges]
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(doc, f)
        t = call(ft.BPETokenizer.from_hf_json, os.path.join(d, "tokenizer.json"))
    assert time.perf_counter() - t0 < 5, "reading the files took too long"
    if t is None:
        return
    assert t.n_vocab <= len(vocab) + len(added)  # every id names a token: no id beyond the entries
    e = t.encode("the cat ĠĀ sat", bos=False, eos=False)
    assert all(0 <= i < t.n_vocab for i in e)
    t.decode(e)
    call(t.to_gpt2_files, os.path.join(d, "v2.json"), os.path.join(d, "m2.txt"))


@given(data=st.data(), kind=st.sampled_from(["adam", "sgd", "train"]), dtype=st.sampled_from(["float32", "float64"]))
def optimizers(data, kind, dtype):
    """Optimizer hyperparameters drawn from finite, weird and odd values: a ValueError/TypeError at once,
    or steps that are all or nothing — θ either all finite after a step, or unchanged with FloatingPointError
    (η·λ overflowing, gradients of 1e308, ε that is 0 in float32). A trainer keeps the last good θ."""
    hyper = st.one_of(st.floats(0, 1, exclude_max=True), weird, st.sampled_from([1e300, 1e-60, 0.0, 1.0]), odd)
    lr, b1, b2, eps, wd = (data.draw(hyper) for _ in range(5))
    m = ft.DTransformer(12, 8, 1, 2, 4, 6, seed=0, dtype=dtype)
    before = m.params.copy()
    grads = {k: np.full(v.shape, data.draw(st.one_of(finite, weird))) for k, v in m.params.items()}
    log("optimizers", (kind, dtype, lr, b1, b2, eps, wd, {k: g.flat[0] for k, g in grads.items()}))
    if kind == "train":
        tr = call(lambda: ft.DTraining(2, lr, weight_decay=wd, betas=(b1, b2), max_steps=2, progress=False,
                                       nonfinite=data.draw(st.sampled_from(["raise", "skip"])),
                                       min_lr=data.draw(st.one_of(st.just(0.0), weird))))
        if tr is None:
            return
        try:
            tr([np.arange(6) % 12, np.arange(5)], m)
        except FloatingPointError:
            pass
        assert all(np.isfinite(v).all() for v in m.params.values()), "training kept a non-finite θ"
        return
    opt = call(ft.Adam, lr, b1, b2, eps, wd) if kind == "adam" else call(ft.SGD, lr)
    if opt is None:
        return
    try:
        call(opt.step, m, grads)
    except FloatingPointError:
        for k, v in before.items():
            assert np.array_equal(m.params[k], v), f"a refused step changed θ[{k}]"
        return
    assert all(np.isfinite(v).all() for v in m.params.values()), "a step wrote a non-finite θ"


@given(l_gen=st.one_of(st.integers(-1, 6), huge, st.sampled_from([10**7, 10**8])),
       k=st.one_of(st.integers(-1, 6), huge, st.sampled_from([10**7, 10**8]), odd), spec=st.booleans())
def inference_sizes(l_gen, k, spec):
    """DInference / SpeculativeInference with l_gen and k from small to huge: a ValueError/TypeError at
    construction or call, or l_gen tokens — the buffers sized by what is generated (k = 10^8 allocated 10^8
    distributions for 3 tokens; l_gen = 2^62 was 'vector::reserve')."""
    log("inference_sizes", (l_gen, k, spec))
    t0 = time.perf_counter()
    m1 = ft.DTransformer(12, 8, 1, 2, 4, 6, seed=1)
    if spec:
        m2 = ft.DTransformer(12, 8, 1, 2, 4, 6, seed=2)
        s = call(ft.SpeculativeInference, l_gen, k, seed=0)
        y = None if s is None else call(s, np.array([1, 2]), m1, m2)
    else:
        s = call(ft.DInference, l_gen, seed=0)
        y = None if s is None or l_gen > 64 else call(s, np.array([1, 2]), m1)
    if y is not None:
        assert len(y) == l_gen
    assert time.perf_counter() - t0 < 5, "took too long"


@given(data=st.data(), listing=st.sampled_from(["DTraining", "ETraining", "EDTraining"]),
       n_seqs=st.integers(0, 5))
def train_options(data, listing, n_seqs):
    """The trainers' keyword options drawn from good, weird, huge and odd values (and names that are not
    options): a TypeError / ValueError when the trainer is made, or a trainer whose plan of a run is consistent
    (steps 1, 2, … within the epochs, each a minibatch of at most batch_size distinct sequences) and, for short
    runs, is the run's: its steps and η are the history's."""
    names = ["n_epochs", "eta", "batch_size", "shuffle", "seed", "reduction", "schedule", "warmup", "min_lr", "clip",
             "max_steps", "start_step", "p_mask", "nonfinite", "patience", "optimizer", "weight_decay",
             "sync_check_every", "dist_timeout", "bogus"]
    value = st.one_of(small, small, huge, odd, weird, st.sampled_from(["sum", "mean", "cosine", "skip", "sgd", "x"]),
                      st.floats(0, 1))
    opts = data.draw(st.dictionaries(st.sampled_from(names), value, max_size=4))
    log("train_options", (listing, n_seqs, opts))
    tr = call(lambda: getattr(ft, listing)(1, **opts))
    if tr is None:
        return
    x = [np.arange(3 + k) % 5 for k in range(n_seqs)]
    t0 = time.perf_counter()
    plan = call(tr.plan, x)
    assert time.perf_counter() - t0 < 5, "took too long"
    if plan is None:
        assert n_seqs == 0, "a trainer that was made refused to plan a run on data"
        return
    B = tr.options["batch_size"]
    for k, p in enumerate(plan):
        assert p["step"] == k + 1 and 0 <= p["epoch"] and 1 <= len(p["sequences"]) <= B
        assert len(set(p["sequences"].tolist())) == len(p["sequences"]) and np.isfinite(p["lr"])
    if 0 < len(plan) <= 4 and listing == "DTraining":
        m = ft.DTransformer(8, 8, 1, 1, 4, 4, seed=0)
        tr.progress = False
        try:
            tr(x, m)
        except FloatingPointError:
            return
        assert tr.history["lr"] == [p["lr"] for p in plan][:len(tr.history["lr"])]


# ------------------------------------------------------------------------------------------------------
PROPERTIES = {"constructors": constructors, "component_calls": component_calls, "tokenizers": tokenizers,
              "tokenizer_files": tokenizer_files, "model_files": model_files, "prompt_caches": prompt_caches, "hf_dirs": hf_dirs, "cli_args": cli_args,
              "cli_run_dirs": cli_run_dirs, "dataset_files": dataset_files, "machine": None,
              "threads": threads, "gpt2_files": gpt2_files, "optimizers": optimizers, "inference_sizes": inference_sizes,
              "train_options": train_options}
# relative budgets (examples per property = weight * --examples)
WEIGHT = {"constructors": 2, "component_calls": 2, "tokenizers": 1, "tokenizer_files": 1, "model_files": 1,
          "prompt_caches": 1, "hf_dirs": 1, "cli_args": 1, "cli_run_dirs": 1, "dataset_files": 1, "machine": 1,
          "threads": 0.3, "gpt2_files": 1, "optimizers": 1, "inference_sizes": 0.5,
          "train_options": 0.5}


def main(argv=None) -> int:
    global LOG
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=100, help="budget per property (times its weight)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log", default=None, help="file receiving each input before it runs")
    ap.add_argument("--only", default=None, help="comma-separated property names")
    args = ap.parse_args(argv)
    LOG = open(args.log, "w") if args.log else None
    ft.set_num_threads(2)
    failed = []
    names = args.only.split(",") if args.only else list(PROPERTIES)
    t0 = time.perf_counter()
    for name in names:
        n = max(1, int(args.examples * WEIGHT[name]))
        conf = settings(max_examples=n, deadline=None, database=None, derandomize=False, print_blob=True,
                        suppress_health_check=list(HealthCheck))
        t = time.perf_counter()
        try:
            if name == "machine":
                run_state_machine_as_test(ModelMachine, settings=settings(conf, max_examples=n, stateful_step_count=12))
            else:
                hseed(args.seed)(conf(PROPERTIES[name]))()
        except Exception:
            traceback.print_exc()
            failed.append(name)
        print(f"{name}: {COUNTS.get(name, 0)} inputs in {time.perf_counter() - t:.1f} s", flush=True)
    total = sum(COUNTS.values())
    print(json.dumps({"inputs": total, "per_property": COUNTS, "seconds": round(time.perf_counter() - t0, 1),
                      "failed": failed}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
