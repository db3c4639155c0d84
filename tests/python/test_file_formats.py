"""The model file and prompt cache formats from outside (docs/design.md "Saving and loading"): one reader and one
writer in the core (io.hpp) behind ft.save / ft.load / PromptCache.save / PromptCache.load, checked against
hostile files, each finding of the campaign as a regression test named after it:

  C1  a prompt cache whose header nests 300,000 deep (a stack overflow before) is a ValueError;
  C3  a model file whose config asks for random features of 2**62 rows is a ValueError, not a crash;
  C4  a model file whose config nests 100,000 deep is a ValueError (and in C++: tests/cpp/test_io.cpp);
  E1  build_model of JSON text nested 10,000 deep is a ValueError (RecursionError before);
  M1  a small file whose config asks for a huge model (n_vocab 3·10⁷, mtp_depth 40,000) fails before the model
      is built, fast and within a memory limit;
  S1  a prompt cache's ids, keys, values and logits are covered by a digest: edits, swapped tensors and
      non-finite values are refused; a cache with non-finite values is never written;
  S2  non-finite parameters are refused by ft.load naming the tensor, and never written by ft.save;
  S3  a tensor's dtype must be the file's: F32 relabelled I32 / U32 is refused;
  S7  two processes saving one path never leave a damaged file there (models and prompt caches);
  L1  the one reader refuses what either of the two readers refused: dropout counters that are not ASCII
      decimal ("١٢", "5 ", "5_000"), overlapping, shifted or uncovered tensor offsets, a byte order mark,
      trailing bytes.

Files written by the earlier writers (Python's through the safetensors package, C++'s ft::save, PromptCache.save
without a digest) still load: tests/python/fixtures/format1, made at commit db314f5.
Crash reproducers run in a child process.
"""
from __future__ import annotations

import json
import os
import pathlib
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import formal_transformers as ft
from conftest import child_env, rel_err

V = 11
FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "format1"
GiB = 1 << 30


def small(dtype="float32", seed=3, **kw):
    m = ft.DTransformer(V, 12, 1, 2, 8, 12, dtype=dtype, seed=seed, **kw)
    rng = np.random.default_rng(seed)
    for v in m.params.values():
        v[...] = rng.normal(0, 0.3, v.shape)
    return m


def split(blob):
    n = struct.unpack("<Q", blob[:8])[0]
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def join(header, body, *, raw=None):
    s = raw if raw is not None else json.dumps(header).encode()
    s += b" " * ((8 - len(s) % 8) % 8)
    return struct.pack("<Q", len(s)) + s + body


def run_child(code: str, timeout: float = 120, limit_as: int | None = None) -> subprocess.CompletedProcess:
    if limit_as is not None:
        code = f"import resource\nresource.setrlimit(resource.RLIMIT_AS, ({limit_as}, {limit_as}))\n" + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env=child_env())


def expect_value_error_in_child(code: str, match: str, **kw) -> str:
    """`code` (which defines `call()`) run in a child: call() must raise a ValueError whose message contains match."""
    r = run_child(textwrap.dedent(code) + textwrap.dedent("""
        try:
            call()
            print("NO ERROR")
        except ValueError as e:
            print("VALUEERROR", e)
    """), **kw)
    assert r.returncode == 0, f"the child died ({r.returncode}): {r.stderr[-2000:]}"
    assert "VALUEERROR" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    assert match in r.stdout, r.stdout[-2000:]
    return r.stdout


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "m.safetensors"
    ft.save(small(), path)
    return path


def with_config(path: pathlib.Path, fn, out: pathlib.Path) -> pathlib.Path:
    header, body = split(path.read_bytes())
    text = header["__metadata__"]["formal_transformers.config"]
    header["__metadata__"]["formal_transformers.config"] = fn(text)
    out.write_bytes(join(header, body))
    return out


# ------------------------------------------------------------------------------------------------------
# files of earlier versions


def test_files_of_earlier_versions_still_load():
    want = json.loads((FIXTURES / "expected.json").read_text())
    d = ft.load(FIXTURES / "d_py.safetensors")
    assert d.config["dtype"] == "float64" and d.dropout_step == 7
    assert ft.io.read_metadata(FIXTURES / "d_py.safetensors")["note"] == "hello"
    assert rel_err(d(np.array([1, 5, 2, 0, 9])), np.array(want["d_py"])) <= 1e-12
    ed = ft.load(FIXTURES / "ed_cpp.safetensors")
    assert type(ed).__name__ == "EDTransformer" and ed.config["dtype"] == "float32"
    assert rel_err(ed(np.array([1, 5, 2, 0]), np.array([9, 3, 4])), np.array(want["ed_cpp"])) <= 1e-6
    e = ft.load(FIXTURES / "e_bigbird_py.safetensors")
    assert e.config["bigbird_draw"] == "per_layer" and e.bigbird_layouts_json()  # the rule for files without it
    assert rel_err(e(np.arange(24) % V), np.array(want["e_bigbird_py"])) <= 1e-12
    cache = ft.PromptCache.load(FIXTURES / "d_prompt.safetensors", d)  # version 1: no digest
    assert np.array_equal(cache.ids, [3, 1, 4, 1, 5])
    assert ft.DInference(6, 0.0)(cache, d).tolist() == want["d_prompt_tokens"]


# ------------------------------------------------------------------------------------------------------
# nesting (C1, C4, E1)


def test_c1_prompt_cache_header_nested_300000_deep_is_a_value_error(tmp_path):
    m = small()
    ft.DInference.prefill(np.array([1, 2, 3]), m).save(tmp_path / "c.safetensors")
    header, body = split((tmp_path / "c.safetensors").read_bytes())
    raw = json.dumps(header).encode()[:-1] + b', "x": ' + b"[" * 300_000 + b"]" * 300_000 + b"}"
    (tmp_path / "deep.safetensors").write_bytes(join(None, body, raw=raw))
    ft.save(m, tmp_path / "m.safetensors")
    expect_value_error_in_child(f"""
        import formal_transformers as ft
        m = ft.load({str(tmp_path / "m.safetensors")!r})
        def call():
            ft.PromptCache.load({str(tmp_path / "deep.safetensors")!r}, m)
    """, "nested deeper than")


@pytest.mark.parametrize("depth", [100_000, 1_000_000])
def test_c4_model_file_config_nested_deep_is_a_value_error(tmp_path, model_file, depth):
    deep = with_config(model_file, lambda t: t[:-1] + ', "x": ' + "[" * depth + "]" * depth + "}", tmp_path / "deep.safetensors")
    expect_value_error_in_child(f"""
        import formal_transformers as ft
        def call():
            ft.load({str(deep)!r})
    """, "nested deeper than")


def test_e1_build_model_of_deeply_nested_json_is_a_value_error():
    text = '{"arch":"DTransformer","x":' + "[" * 10000 + "]" * 10000 + "}"
    with pytest.raises(ValueError, match="model config: not JSON \\(nested deeper than 64 levels\\)"):
        ft.build_model(text)
    with pytest.raises(ValueError, match="byte order mark"):
        ft.build_model("\ufeff" + small().config_json())
    with pytest.raises(ValueError, match="not JSON"):
        ft.build_model(small().config_json() + " x")
    m = small()
    assert ft.build_model(m.config_json()).config == m.config  # what the writer writes reads back


def test_the_nesting_bound_is_exact_and_ignores_brackets_in_strings():
    head = small().config_json()[:-1]
    at_bound = head + ', "x": ' + "[" * 63 + "]" * 63 + "}"  # the object and 63 arrays: 64 levels
    with pytest.raises(TypeError, match="x must be"):  # parsed; the option is refused by the schema
        ft.build_model(at_bound)
    with pytest.raises(ValueError, match="nested deeper than 64 levels"):
        ft.build_model(head + ', "x": ' + "[" * 64 + "]" * 64 + "}")
    text = head + ', "x": "' + "[" * 100 + '\\"{' + '\\\\' + '"}'  # brackets, an escaped quote and backslash
    with pytest.raises(TypeError, match="unexpected keyword argument 'x'"):  # a string: any brackets in it
        ft.build_model(text)


# ------------------------------------------------------------------------------------------------------
# sizes before allocation (M1, C3)


@pytest.mark.parametrize("key,value,match", [
    ("n_vocab", 30_000_000, "needs more parameters than the file's"),
    ("mtp_depth", 40_000, "layers (MTP modules included), the file only"),
])
def test_m1_a_small_file_asking_for_a_huge_model_fails_before_building(tmp_path, model_file, key, value, match):
    def edit(t):
        c = json.loads(t)
        c[key] = value
        if key == "mtp_depth":  # (room for the modules' targets; no table of positions to size)
            c.update(l_max=value + 2, positional="alibi")
        return json.dumps(c)
    big = with_config(model_file, edit, tmp_path / "big.safetensors")
    assert big.stat().st_size < 10_000
    out = expect_value_error_in_child(f"""
        import time
        import formal_transformers as ft
        def call():
            t0 = time.perf_counter()
            try:
                ft.load({str(big)!r})
            finally:
                print("SECONDS", time.perf_counter() - t0)
    """, match, limit_as=3 * GiB)
    seconds = float(out.split("SECONDS")[1].split()[0])
    assert seconds < 2.0, out  # 4–19 s before, building the model


def test_c3_a_file_asking_for_2_62_random_features_is_a_value_error(tmp_path, model_file):
    def edit(t):
        c = json.loads(t)
        c.update(attention="rfa", n_features=2 ** 62)
        return json.dumps(c)
    rfa = with_config(model_file, edit, tmp_path / "rfa.safetensors")
    expect_value_error_in_child(f"""
        import formal_transformers as ft
        def call():
            ft.load({str(rfa)!r})
    """, str(rfa), limit_as=3 * GiB)


# ------------------------------------------------------------------------------------------------------
# values and dtypes (S2, S3)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_s2_non_finite_parameters_are_refused_naming_the_tensor(tmp_path, model_file, bad):
    header, body = split(model_file.read_bytes())
    begin = header["layers.0.W_mlp1"]["data_offsets"][0] if "layers.0.W_mlp1" in header else None
    name = "layers.0.W_mlp1" if begin is not None else next(k for k in header if k != "__metadata__")
    begin = header[name]["data_offsets"][0]
    body = body[:begin + 4] + struct.pack("<f", bad) + body[begin + 8:]
    (tmp_path / "nan.safetensors").write_bytes(join(header, body))
    with pytest.raises(ValueError, match=f"tensor {name} holds a value that is not finite .* at element 1"):
        ft.load(tmp_path / "nan.safetensors")
    # and ft.save does not write what ft.load refuses; the file at the path stays the old one
    m = small()
    m.params[name][(0,) * m.params[name].ndim] = bad
    with pytest.raises(ValueError, match=f"{name} holds a value that is not finite"):
        ft.save(m, model_file)
    assert ft.load(model_file).config == m.config
    assert sorted(os.listdir(model_file.parent)) == ["m.safetensors", "nan.safetensors"]  # no temporary left


@pytest.mark.parametrize("dtype", ["I32", "U32", "F16", "BF16", "I64", "f32", "F32 "])
def test_s3_a_tensor_with_another_dtype_is_refused(tmp_path, model_file, dtype):
    header, body = split(model_file.read_bytes())
    header["gamma"]["dtype"] = dtype
    (tmp_path / "dt.safetensors").write_bytes(join(header, body))
    with pytest.raises(ValueError, match="tensor gamma has dtype .*, expected F32 or F64"):
        ft.load(tmp_path / "dt.safetensors")


def test_s3_tensors_must_have_the_dtype_of_the_config(tmp_path):
    m = small("float64")
    ft.save(m, tmp_path / "m.safetensors")
    with_config(tmp_path / "m.safetensors", lambda t: t.replace('"float64"', '"float32"'), tmp_path / "x.safetensors")
    with pytest.raises(ValueError, match="is F64 in a file saved in float32"):
        ft.load(tmp_path / "x.safetensors")


# ------------------------------------------------------------------------------------------------------
# the layout (L1)


@pytest.mark.parametrize("value", ["١٢", "5 ", " 5", "5_000", "+5", "-1", "0x10", "", "1e3", "18446744073709551616"])
@pytest.mark.parametrize("key", ["dropout_step", "dropout_seed"])
def test_l1_dropout_counters_are_ascii_decimal(tmp_path, model_file, key, value):
    header, body = split(model_file.read_bytes())
    header["__metadata__"][f"formal_transformers.{key}"] = value
    (tmp_path / "d.safetensors").write_bytes(join(header, body))
    with pytest.raises(ValueError, match=f"damaged {key} in the metadata"):
        ft.load(tmp_path / "d.safetensors")


def test_l1_dropout_counters_largest_value_reads(tmp_path, model_file):
    header, body = split(model_file.read_bytes())
    header["__metadata__"]["formal_transformers.dropout_step"] = "18446744073709551615"
    (tmp_path / "d.safetensors").write_bytes(join(header, body))
    assert ft.load(tmp_path / "d.safetensors").dropout_step == 2 ** 64 - 1


def offsets_edit(kind):
    def f(header, body):
        names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
        a, b = header[names[0]], header[names[1]]
        if kind == "overlap":  # the second tensor starts inside the first (the same bytes read twice)
            n = b["data_offsets"][1] - b["data_offsets"][0]
            b["data_offsets"] = [a["data_offsets"][1] - 4, a["data_offsets"][1] - 4 + n]
        elif kind == "shifted":  # every tensor 8 bytes later, 8 bytes of padding in front
            for k in names:
                header[k]["data_offsets"] = [x + 8 for x in header[k]["data_offsets"]]
            body = b"\0" * 8 + body
        elif kind == "gap":  # a tensor moved to the end, its bytes left unread
            last = header[names[-1]]["data_offsets"][1]
            n = a["data_offsets"][1] - a["data_offsets"][0]
            body = body + body[a["data_offsets"][0]:a["data_offsets"][1]]
            a["data_offsets"] = [last, last + n]
        elif kind == "trailing":
            body = body + b"\0" * 8
        elif kind == "same-bytes":  # two tensors of one size on the same bytes (another's bytes unread)
            size = {k: header[k]["data_offsets"][1] - header[k]["data_offsets"][0] for k in names}
            x, y = next((x, y) for x in names for y in names if x < y and size[x] == size[y])
            header[y]["data_offsets"] = list(header[x]["data_offsets"])
        return header, body
    return f


@pytest.mark.parametrize("kind,match", [("overlap", "overlaps another"), ("shifted", "a gap before it"),
                                        ("gap", "a gap before it"), ("trailing", "bytes after the last tensor"),
                                        ("same-bytes", "overlaps another")])
def test_l1_tensor_offsets_tile_the_data_exactly(tmp_path, model_file, kind, match):
    header, body = offsets_edit(kind)(*split(model_file.read_bytes()))
    (tmp_path / "o.safetensors").write_bytes(join(header, body))
    with pytest.raises(ValueError, match=match):
        ft.load(tmp_path / "o.safetensors")


@pytest.mark.parametrize("edit,match", [
    (lambda raw: b"\xef\xbb\xbf" + raw, "byte order mark"),
    (lambda raw: raw + b"xx", "not JSON"),
    (lambda raw: raw + b"{}", "not JSON"),
    (lambda raw: raw[:-1] + b', "gamma": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}}', "twice in one object"),
])
def test_l1_header_bom_trailing_bytes_and_duplicate_keys_are_refused(tmp_path, model_file, edit, match):
    header, body = split(model_file.read_bytes())
    raw = json.dumps(header).encode()
    (tmp_path / "h.safetensors").write_bytes(join(None, body, raw=edit(raw)))
    with pytest.raises(ValueError, match=match):
        ft.load(tmp_path / "h.safetensors")
    with pytest.raises(ValueError, match=match):
        ft.io.read_metadata(tmp_path / "h.safetensors")


def test_l1_config_text_with_bom_or_trailing_bytes_is_refused(tmp_path, model_file):
    for edit, match in ((lambda t: "\ufeff" + t, "byte order mark"), (lambda t: t + "x", "not JSON"),
                        (lambda t: t[:-1] + ', "L": 1}', "twice in one object")):
        with pytest.raises(ValueError, match=match):
            ft.load(with_config(model_file, edit, tmp_path / "c.safetensors"))


# ------------------------------------------------------------------------------------------------------
# prompt caches: the digest (S1)


@pytest.fixture
def cache_file(tmp_path):
    m = small("float64", positional="rope")
    prompt = np.array([3, 1, 4, 1, 5, 9])
    ft.DInference.prefill(prompt, m).save(tmp_path / "c.safetensors")
    return m, prompt, tmp_path / "c.safetensors"


def test_s1_a_saved_cache_continues_as_its_ids(cache_file):
    m, prompt, path = cache_file
    meta = ft.io.read_metadata(path)
    assert meta["formal_transformers.prompt_cache"] == "2" and len(meta["formal_transformers.prompt_digest"]) == 16
    inf = ft.DInference(5, 0.0)
    assert np.array_equal(inf(ft.PromptCache.load(path, m), m), inf(prompt, m))


def edited_ids(header, body):
    header["__metadata__"]["formal_transformers.prompt_ids"] = "3,1,4,1,5,8"
    return header, body


def swapped(a, b):
    def f(header, body):
        header[a], header[b] = header[b], header[a]
        return header, body
    return f


def poked(name, value):
    def f(header, body):
        begin = header[name]["data_offsets"][0] + 8
        return header, body[:begin] + struct.pack("<d", value) + body[begin + 8:]
    return f


@pytest.mark.parametrize("edit,match", [
    (edited_ids, "do not have the digest saved with them"),
    (swapped("K.0", "V.0"), "do not have the digest saved with them"),
    (poked("K.0", 0.25), "do not have the digest saved with them"),
    (poked("K.0", np.nan), "tensor K.0 holds a value that is not finite"),
    (poked("V.0", np.inf), "tensor V.0 holds a value that is not finite"),
    (poked("z", -np.inf), "tensor z holds a value that is not finite"),
    (lambda h, b: (h, b) if h["__metadata__"].pop("formal_transformers.prompt_digest") else None,
     "do not have the digest saved with them"),
])
def test_s1_edited_or_non_finite_caches_are_refused(cache_file, edit, match):
    m, prompt, path = cache_file
    header, body = edit(*split(path.read_bytes()))
    path.write_bytes(join(header, body))
    with pytest.raises(ValueError, match=match):
        ft.PromptCache.load(path, m)


def test_s1_a_cache_with_non_finite_values_is_not_written(tmp_path):
    m = small("float64")
    m.params["W_e"][:, 2] = np.inf  # token 2's embedding: K, V and the logits of a prompt holding it are not finite
    cache = ft.DInference.prefill(np.array([1, 2, 3]), m)
    with pytest.raises(ValueError, match="not finite"):
        cache.save(tmp_path / "c.safetensors")
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------------------------------------------
# atomic writes (S7)


WRITER = """
import sys, numpy as np, formal_transformers as ft
path, kind, seed, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
m = ft.DTransformer(11, 12, 1, 2, 8, 12, dtype="float64", seed=seed if kind == "model" else 1, positional="rope")
cache = ft.DInference.prefill(np.array([1, 2, 3, seed]), m)
for _ in range(n):
    ft.save(m, path) if kind == "model" else cache.save(path)
print("DONE")
"""


@pytest.mark.parametrize("kind", ["model", "cache"])
def test_s7_two_processes_saving_one_path_never_leave_a_damaged_file(tmp_path, kind):
    """Two writers (models of two seeds, or caches of two prompts of one model) save one path 150 times each while
    this process reads it: every read is a whole file of one of them."""
    path = tmp_path / "shared.safetensors"
    models = {seed: ft.DTransformer(11, 12, 1, 2, 8, 12, dtype="float64", seed=seed, positional="rope") for seed in (1, 2)}
    ft.save(models[1], path) if kind == "model" else ft.DInference.prefill(np.array([1, 2, 3, 1]), models[1]).save(path)
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), kind, str(seed), "150"], env=child_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for seed in (1, 2)]
    reads = 0
    while any(w.poll() is None for w in writers) or reads == 0:
        if kind == "model":
            got = ft.load(path)  # never a damaged or partial file
            assert any(got.params["W_e"].tobytes() == mm.params["W_e"].tobytes() for mm in models.values())
        else:
            assert ft.PromptCache.load(path, models[1]).ids.tolist() in ([1, 2, 3, 1], [1, 2, 3, 2])
        reads += 1
    for w in writers:
        out, err = w.communicate()
        assert w.returncode == 0 and "DONE" in out, err[-2000:]
    assert sorted(os.listdir(tmp_path)) == ["shared.safetensors"]  # every temporary renamed or removed


def test_a_fixed_temporary_name_is_not_used(tmp_path):
    """The temporary is unique (mkstemps), not path + ".tmp": a file or folder of that name is left alone."""
    path = tmp_path / "m.safetensors"
    (tmp_path / "m.safetensors.tmp").mkdir()
    ft.save(small(), path)
    ft.DInference.prefill(np.array([1, 2]), small()).save(tmp_path / "c.safetensors")
    (tmp_path / "c.safetensors.tmp").write_text("mine")
    ft.DInference.prefill(np.array([1, 2]), small()).save(tmp_path / "c.safetensors")
    assert (tmp_path / "c.safetensors.tmp").read_text() == "mine" and ft.load(path).config == small().config
    assert sorted(os.listdir(tmp_path)) == ["c.safetensors", "c.safetensors.tmp", "m.safetensors", "m.safetensors.tmp"]


def test_a_failed_save_leaves_the_old_file(tmp_path):
    with pytest.raises(ValueError, match="cannot create a temporary file"):
        ft.save(small(), tmp_path / "absent" / "m.safetensors")
    old = small(seed=1)
    ft.save(old, tmp_path / "m.safetensors")
    with pytest.raises(ValueError, match="the format's own"):
        ft.save(small(), tmp_path / "m.safetensors", metadata={"formal_transformers.format": "2"})
    for meta in ({"note": "\ud800"}, {"\udfff": "x"}):
        with pytest.raises(ValueError, match="not text a file can hold"):
            ft.save(small(), tmp_path / "m.safetensors", metadata=meta)
    nan = small()
    nan.params["gamma"][0] = np.nan
    with pytest.raises(ValueError, match="gamma holds a value that is not finite"):
        ft.save(nan, tmp_path / "m.safetensors")
    assert np.array_equal(ft.load(tmp_path / "m.safetensors").params["W_e"], old.params["W_e"])
    assert os.listdir(tmp_path) == ["m.safetensors"]


def test_subnormal_parameters_survive_save_and_load_in_either_dtype(tmp_path):
    """The reader and writer copy bytes (no flush-to-zero): subnormal values come back exactly, also converted."""
    m32, m64 = small("float32"), small("float64")
    m32.params["W_e"][0, :3] = [1e-40, -3e-45, np.finfo(np.float32).tiny / 2]
    m64.params["W_e"][0, :2] = [1e-310, -5e-324]
    ft.save(m32, tmp_path / "a")
    ft.save(m64, tmp_path / "b")
    assert np.array_equal(ft.load(tmp_path / "a").params["W_e"], m32.params["W_e"])
    assert np.array_equal(ft.load(tmp_path / "a", dtype="float64").params["W_e"], m32.params["W_e"].astype(np.float64))
    assert np.array_equal(ft.load(tmp_path / "b").params["W_e"], m64.params["W_e"])
