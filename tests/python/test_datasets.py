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
    (cache / "tinyshakespeare.txt").write_text("from the cache")
    assert ft.datasets.tiny_shakespeare() == "from the cache"
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
