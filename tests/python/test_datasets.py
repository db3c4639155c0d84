"""ft.datasets: the lookup order (path, FT_DATA_DIR, ../shared/data, cache, download), the download with its
SHA-256 check against a local HTTP server on 127.0.0.1 (no network is used), the Tatoeba subset derivation,
the error naming the URL and FT_DATA_DIR, and the real files where the developers' copy is present."""
from __future__ import annotations

import functools
import hashlib
import http.server
import io
import threading
import urllib.error
import zipfile

import pytest

import formal_transformers as ft
from formal_transformers import datasets

from conftest import shared_data

SMALL = "First Citizen:\nBefore we proceed any further, hear me speak.\n"
SHA_SMALL = hashlib.sha256(SMALL.encode()).hexdigest()


@pytest.fixture
def server(tmp_path):
    """An HTTP server on 127.0.0.1 (a free port) serving tmp_path/www; yields (base URL, folder, hits)."""
    www = tmp_path / "www"
    www.mkdir()
    hits = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            hits.append(self.path)
            super().do_GET()

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(www)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", www, hits
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """No local copy (FT_DATA_DIR names an empty folder, so ../shared/data is not consulted), an empty cache,
    downloads allowed, and SOURCES restored afterwards. Returns (data folder, cache folder)."""
    data = tmp_path / "data"
    cache = tmp_path / "cache"
    data.mkdir()
    monkeypatch.setenv("FT_DATA_DIR", str(data))
    monkeypatch.setenv("FT_CACHE_DIR", str(cache))
    monkeypatch.delenv("FT_DOWNLOAD", raising=False)
    monkeypatch.setattr(datasets, "SOURCES", dict(datasets.SOURCES))
    return data, cache


def test_public():
    assert ft.datasets is datasets
    assert "datasets" in ft.__all__
    for name in ("tiny_shakespeare", "tatoeba_eng_fra", "locate", "download", "cache_dir", "DataNotFoundError"):
        assert name in datasets.__all__ and hasattr(datasets, name), name
    assert issubclass(datasets.DataNotFoundError, FileNotFoundError)


def test_download_good_checksum(server, tmp_path):
    base, www, hits = server
    (www / "small.txt").write_text(SMALL)
    dest = tmp_path / "out" / "small.txt"
    assert datasets.download(f"{base}/small.txt", dest, SHA_SMALL) == dest
    assert dest.read_text() == SMALL
    assert hits == ["/small.txt"]
    assert [p.name for p in dest.parent.iterdir()] == ["small.txt"]  # no temporary file left


def test_download_bad_checksum_writes_nothing(server, tmp_path):
    base, www, _ = server
    (www / "small.txt").write_text(SMALL)
    dest = tmp_path / "out" / "small.txt"
    with pytest.raises(ValueError, match=r"checksum mismatch.*127\.0\.0\.1.*small\.txt"):
        datasets.download(f"{base}/small.txt", dest, "0" * 64)
    assert not dest.exists()
    assert not dest.parent.exists() or not list(dest.parent.iterdir())


def test_download_missing_url(server, tmp_path):
    base, _, _ = server
    with pytest.raises(urllib.error.HTTPError):
        datasets.download(f"{base}/absent.txt", tmp_path / "x.txt")
    assert not (tmp_path / "x.txt").exists()


def test_tiny_shakespeare_downloads_into_cache_once(server, isolated):
    base, www, hits = server
    _, cache = isolated
    (www / "input.txt").write_text(SMALL)
    datasets.SOURCES["tinyshakespeare.txt"] = datasets.Source(f"{base}/input.txt", SHA_SMALL)
    assert ft.datasets.tiny_shakespeare() == SMALL
    assert (cache / "tinyshakespeare.txt").read_text() == SMALL
    assert ft.datasets.tiny_shakespeare() == SMALL  # from the cache now
    assert hits == ["/input.txt"]


def test_bad_checksum_is_a_clear_error(server, isolated):
    base, www, _ = server
    _, cache = isolated
    (www / "input.txt").write_text(SMALL + "tampered")
    datasets.SOURCES["tinyshakespeare.txt"] = datasets.Source(f"{base}/input.txt", SHA_SMALL)
    with pytest.raises(datasets.DataNotFoundError) as e:
        ft.datasets.tiny_shakespeare()
    msg = str(e.value)
    assert "checksum mismatch" in msg and f"{base}/input.txt" in msg and "FT_DATA_DIR" in msg
    assert not (cache / "tinyshakespeare.txt").exists()


def test_no_network_error_names_url_and_variable(isolated, monkeypatch):
    # a port nothing listens on: the download fails as it does on a machine without network
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/input.txt"
    datasets.SOURCES["tinyshakespeare.txt"] = datasets.Source(url, SHA_SMALL)
    with pytest.raises(datasets.DataNotFoundError, match="FT_DATA_DIR") as e:
        ft.datasets.tiny_shakespeare()
    assert url in str(e.value) and "tinyshakespeare.txt" in str(e.value)


def test_download_off(isolated, monkeypatch):
    monkeypatch.setenv("FT_DOWNLOAD", "0")
    with pytest.raises(datasets.DataNotFoundError, match="downloading is off") as e:
        ft.datasets.tatoeba_eng_fra()
    assert datasets.SOURCES["tatoeba-eng-fra-5k.tsv"].url in str(e.value)
    with pytest.raises(datasets.DataNotFoundError, match="downloading is off"):
        ft.datasets.tiny_shakespeare(download=False)


def test_lookup_order(isolated, tmp_path, monkeypatch):
    data, cache = isolated
    monkeypatch.setenv("FT_DOWNLOAD", "0")
    cache.mkdir()
    datasets.SOURCES["tinyshakespeare.txt"] = datasets.Source("http://127.0.0.1:9/input.txt", SHA_SMALL)
    (cache / "tinyshakespeare.txt").write_text(SMALL)  # a cached file is used while its checksum holds
    assert ft.datasets.tiny_shakespeare() == SMALL
    (data / "tinyshakespeare.txt").write_text("from FT_DATA_DIR")
    assert ft.datasets.tiny_shakespeare() == "from FT_DATA_DIR"
    explicit = tmp_path / "mine.txt"
    explicit.write_text("from the path argument")
    assert ft.datasets.tiny_shakespeare(explicit) == "from the path argument"
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "tinyshakespeare.txt").write_text("from a folder argument")
    assert ft.datasets.tiny_shakespeare(folder) == "from a folder argument"
    with pytest.raises(datasets.DataNotFoundError, match="path argument"):
        ft.datasets.tiny_shakespeare(tmp_path / "absent.txt")  # an explicit path does not fall back
    with pytest.raises(TypeError, match="path"):
        ft.datasets.tiny_shakespeare(3)
    with pytest.raises(ValueError, match="unknown data file"):
        ft.datasets.locate("nope.txt")


def _zip(lines: list[str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("_about.txt", "about")
        z.writestr("fra.txt", "".join(line + "\n" for line in lines))
    return buf.getvalue()


def test_tatoeba_download_derives_the_subset(server, isolated):
    base, www, _ = server
    _, cache = isolated
    att = "CC-BY 2.0 (France) Attribution: tatoeba.org #{} (CM) & #{} (x)"
    lines = [f"Go {i}.\tVa {i} !\t{att.format(i, i + 1)}" for i in range(7)]
    (www / "fra-eng.zip").write_bytes(_zip(lines))
    expected = "".join(line + "\n" for line in lines[:5]).encode()
    src = datasets.SOURCES["tatoeba-eng-fra-5k.tsv"]
    datasets.SOURCES["tatoeba-eng-fra-5k.tsv"] = src._replace(
        url=f"{base}/fra-eng.zip", derive=lambda raw: datasets._tatoeba_subset(raw, 5),
        expected_sha256=hashlib.sha256(expected).hexdigest())
    pairs = ft.datasets.tatoeba_eng_fra()
    assert pairs == [datasets.TatoebaPair(f"Go {i}.", f"Va {i} !", att.format(i, i + 1)) for i in range(5)]
    assert (cache / "tatoeba-eng-fra-5k.tsv").read_bytes() == expected


def test_tatoeba_changed_upstream_warns(server, isolated):
    base, www, _ = server
    (www / "fra-eng.zip").write_bytes(_zip(["Hi.\tSalut !\tCC-BY 2.0 (France) Attribution: tatoeba.org #1 (a) & #2 (b)"]))
    src = datasets.SOURCES["tatoeba-eng-fra-5k.tsv"]
    datasets.SOURCES["tatoeba-eng-fra-5k.tsv"] = src._replace(url=f"{base}/fra-eng.zip")
    with pytest.warns(UserWarning, match="differs from the file the documented figures were measured on"):
        pairs = ft.datasets.tatoeba_eng_fra()
    assert pairs == [datasets.TatoebaPair("Hi.", "Salut !", "CC-BY 2.0 (France) Attribution: tatoeba.org #1 (a) & #2 (b)")]


def test_tatoeba_subset_rejects_a_bad_archive():
    with pytest.raises(ValueError, match="fra.txt line 1"):
        datasets._tatoeba_subset(_zip(["only one field"]))


def test_real_tiny_shakespeare():
    path = shared_data("tinyshakespeare.txt")
    text = ft.datasets.tiny_shakespeare(path.parent)
    assert len(text) == 1_115_394 and len(set(text)) == 65
    assert text.startswith("First Citizen:\nBefore we proceed any further, hear me speak.")
    # the pinned checksum of the download is the developers' copy's
    assert hashlib.sha256(path.read_bytes()).hexdigest() == datasets.SOURCES["tinyshakespeare.txt"].sha256


def test_real_tatoeba():
    path = shared_data("tatoeba-eng-fra-5k.tsv")
    pairs = ft.datasets.tatoeba_eng_fra(path)
    assert len(pairs) == 5000
    assert pairs[0] == ("Go.", "Va !", "CC-BY 2.0 (France) Attribution: tatoeba.org #2877272 (CM) & #1158250 (Wittydev)")
    assert all(p.attribution.startswith("CC-BY 2.0 (France) Attribution: tatoeba.org #") for p in pairs)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == datasets.SOURCES["tatoeba-eng-fra-5k.tsv"].expected_sha256


# ---------------------------------------------------------------------------------------------------
# Hostile downloads, damaged caches, bad arguments (issue 27)

def test_a_download_that_is_not_the_archive_is_data_not_found(server, isolated):
    """An HTML page (a captive portal) instead of fra-eng.zip, or a zip without fra.txt: DataNotFoundError
    saying so (was zipfile.BadZipFile / KeyError), and nothing cached."""
    base, www, _ = server
    _, cache = isolated
    src = datasets.SOURCES["tatoeba-eng-fra-5k.tsv"]
    datasets.SOURCES["tatoeba-eng-fra-5k.tsv"] = src._replace(url=f"{base}/fra-eng.zip")
    (www / "fra-eng.zip").write_bytes(b"<!DOCTYPE html><html><body>Please log in</body></html>")
    with pytest.raises(datasets.DataNotFoundError, match="not a readable zip archive") as e:
        ft.datasets.tatoeba_eng_fra()
    assert f"{base}/fra-eng.zip" in str(e.value) and "FT_DATA_DIR" in str(e.value)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("deu.txt", "Go.\tGeh.\tCC-BY\n")
    (www / "fra-eng.zip").write_bytes(buf.getvalue())
    with pytest.raises(datasets.DataNotFoundError, match="no fra.txt"):
        ft.datasets.tatoeba_eng_fra()
    assert not (cache / "tatoeba-eng-fra-5k.tsv").exists()
    for raw in (b"", b"<html>", buf.getvalue()):  # and download()/the derivation on their own
        with pytest.raises(datasets.DataNotFoundError):
            datasets._tatoeba_subset(raw)
    # found by fuzz/fuzz_parsers.py: a zip whose fra.txt names an unknown compression method (NotImplementedError)
    import base64

    raw = base64.b64decode(
        "UEsDBBQAAAAAAEGXeV1hnwFsRQAAAEUAAAAHAAAAZnJhLnR4dEdvLglWYSAhCUNDLUJZIDIuMCAoRnJhbmNlKSBBdHRyaWJ1dGlvbjog"
        "dGF0b2ViYS5vcmcgIzEgKGEpICYgIzIgKGIpClBLAQIUAxQAAAAAnwFseV1hnwFsRQAAAEUAAAAHAAAAAAAAAAAAAACAAQAAAABmcmEu"
        "dHh0UEsFBgAAAAABAAEANQAAAGoAAAAAAA==")
    with pytest.raises(datasets.DataNotFoundError, match="NotImplementedError"):
        datasets._tatoeba_subset(raw)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("fra.txt", b"Go.\tVa \xff\tCC-BY\n")
    with pytest.raises(datasets.DataNotFoundError, match="UTF-8"):
        datasets._tatoeba_subset(buf.getvalue())


@pytest.mark.parametrize("damage", [b"", SMALL.encode()[:20], b"<html><body>502 Bad Gateway</body></html>"])
def test_a_damaged_cache_file_is_never_returned(server, isolated, monkeypatch, damage):
    """A truncated, empty or HTML cache file was returned as data: its SHA-256 is checked (against the pinned
    one), a damaged file is downloaded again — or, downloads off, a DataNotFoundError names the damage."""
    base, www, hits = server
    _, cache = isolated
    (www / "input.txt").write_text(SMALL)
    datasets.SOURCES["tinyshakespeare.txt"] = datasets.Source(f"{base}/input.txt", SHA_SMALL)
    cache.mkdir()
    (cache / "tinyshakespeare.txt").write_bytes(damage)
    monkeypatch.setenv("FT_DOWNLOAD", "0")
    with pytest.raises(datasets.DataNotFoundError, match="damaged") as e:
        ft.datasets.tiny_shakespeare()
    assert str(cache / "tinyshakespeare.txt") in str(e.value)
    monkeypatch.setenv("FT_DOWNLOAD", "1")
    assert ft.datasets.tiny_shakespeare() == SMALL
    assert (cache / "tinyshakespeare.txt").read_text() == SMALL and hits == ["/input.txt"]


def test_a_derived_cache_file_is_checked_against_its_stamp(server, isolated):
    """Tatoeba's archive has no fixed checksum: locate writes the SHA-256 of the file it derived beside it
    (<name>.sha256) and later uses the cached file only while it matches."""
    base, www, hits = server
    _, cache = isolated
    lines = [f"Go {i}.\tVa {i} !\tCC-BY 2.0 (France) Attribution: tatoeba.org #{i} (a) & #{i + 1} (b)" for i in range(3)]
    (www / "fra-eng.zip").write_bytes(_zip(lines))
    src = datasets.SOURCES["tatoeba-eng-fra-5k.tsv"]
    datasets.SOURCES["tatoeba-eng-fra-5k.tsv"] = src._replace(url=f"{base}/fra-eng.zip", expected_sha256=None)
    first = ft.datasets.tatoeba_eng_fra()
    cached = cache / "tatoeba-eng-fra-5k.tsv"
    assert (cache / "tatoeba-eng-fra-5k.tsv.sha256").read_text().strip() == hashlib.sha256(cached.read_bytes()).hexdigest()
    assert ft.datasets.tatoeba_eng_fra() == first and len(hits) == 1  # from the cache
    cached.write_bytes(cached.read_bytes()[:25])  # truncated
    assert ft.datasets.tatoeba_eng_fra() == first and len(hits) == 2  # downloaded again, not returned truncated


def test_a_cached_file_is_hashed_once_per_process(server, isolated, monkeypatch):
    base, www, _ = server
    (www / "input.txt").write_text(SMALL)
    datasets.SOURCES["tinyshakespeare.txt"] = datasets.Source(f"{base}/input.txt", SHA_SMALL)
    assert ft.datasets.tiny_shakespeare() == SMALL  # downloaded
    calls = []
    real = datasets._sha256
    monkeypatch.setattr(datasets, "_sha256", lambda data: calls.append(1) or real(data))
    for _ in range(3):
        assert ft.datasets.tiny_shakespeare() == SMALL
    assert len(calls) <= 1


def test_bleu_and_split_refuse_meaningless_arguments():
    pairs = [datasets.TatoebaPair(f"e{i}", f"f{i}", "a") for i in range(10)]
    for bad in (5, 1, 1.0, 0, 0.0, -0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="test_fraction"):
            datasets.split_by_source(pairs, test_fraction=bad)
    with pytest.raises(TypeError, match="test_fraction"):
        datasets.split_by_source(pairs, test_fraction="0.1")
    with pytest.raises(ValueError, match="2 distinct"):
        datasets.split_by_source(pairs[:1])
    train, test = datasets.split_by_source(pairs, test_fraction=0.99)
    assert len(test) == 9 and len(train) == 1  # both splits keep at least one sentence
    train, test = datasets.split_by_source(pairs, test_fraction=0.3)
    assert len(test) == 3 and {p.english for p in train}.isdisjoint(p.english for p in test)
    for bad in (0, -1, 101):
        with pytest.raises(ValueError, match="max_n"):
            datasets.bleu(["a b c"], ["a b c"], max_n=bad)  # max_n=0 scored 100.0
    with pytest.raises(TypeError, match="max_n"):
        datasets.bleu(["a b c"], ["a b c"], max_n=2.5)


def test_bleu_values_by_hand():
    # identical: every precision 1, no brevity penalty
    assert datasets.bleu(["le chat est noir"], ["le chat est noir"]) == pytest.approx(100.0, abs=1e-12)
    # hypothesis "le chat" vs reference "le chat noir", max_n=2, no smoothing: p1 = 2/2, p2 = 1/1,
    # BP = exp(1 − 3/2)
    assert datasets.bleu(["le chat"], ["le chat noir"], max_n=2, smooth=False) == pytest.approx(
        100 * 2.718281828459045 ** (1 - 1.5), rel=1e-12)
    # max_n=1, smoothing does not touch p1: "a b x" vs "a b c" -> p1 = 2/3
    assert datasets.bleu(["a b x"], ["a b c"], max_n=1) == pytest.approx(100 * 2 / 3, rel=1e-12)
