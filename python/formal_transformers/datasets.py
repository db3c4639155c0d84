"""The real data of the notebooks — tiny Shakespeare and Tatoeba English–French pairs — and translation scores.

    import formal_transformers as ft
    text = ft.datasets.tiny_shakespeare()        # str, 1,115,394 characters
    pairs = ft.datasets.tatoeba_eng_fra()        # [TatoebaPair(english, french, attribution), ...] (5,000)

Neither data set is part of the repository (docs/data.md: where they come from, their licences). Each
function finds its file in this order and stops at the first hit:
  1. the `path` argument (the file itself, or a folder holding it);
  2. $FT_DATA_DIR (a folder holding the file); when it is set, step 3 is skipped;
  3. `shared/data` found walking up from the current directory and from this package (the developers'
     copy, ../shared/data beside the repository; never copied into it);
  4. the cache folder, cache_dir(): $FT_CACHE_DIR, else $XDG_CACHE_HOME/formal-transformers, else
     ~/.cache/formal-transformers — a cached file only while its SHA-256 checks out (the pinned one, else the
     stamp <name>.sha256 written when it was derived, else expected_sha256; hashed once per process): a
     damaged one is downloaded again;
  5. a download from the public source into the cache folder (unless FT_DOWNLOAD=0 or download=False),
     written under its final name only after its SHA-256 checked out (see SOURCES).
When none works, DataNotFoundError (a FileNotFoundError) says what was tried, the URL and FT_DATA_DIR.

The translation scores (exact_match, bleu, normalize, bleu_tokens) live in formal_transformers.metrics
and are re-exported here, where notebook 08 finds them beside the pairs they score.
"""
from __future__ import annotations

import hashlib
import io
import numbers
import os
import pathlib
import tempfile
import urllib.error
import urllib.request
import warnings
import zipfile
from typing import Callable, Iterable, NamedTuple, Optional, Sequence, Union

from .metrics import bleu, bleu_tokens, exact_match, normalize

__all__ = [
    "tiny_shakespeare", "tatoeba_eng_fra", "locate", "download", "cache_dir", "DataNotFoundError", "Source",
    "SOURCES", "data_dir", "data_file", "skip_message", "quick", "TatoebaPair", "read_tatoeba",
    "split_by_source", "group_references", "normalize", "bleu_tokens", "bleu", "exact_match",
]

TINY_SHAKESPEARE = "tinyshakespeare.txt"
TATOEBA = "tatoeba-eng-fra-5k.tsv"
_MARKER = TINY_SHAKESPEARE  # a file every copy of ../shared/data holds


class DataNotFoundError(FileNotFoundError):
    """A data file is in none of the places looked in and could not be downloaded."""


def _tatoeba_subset(raw: bytes, n_lines: int = 5000) -> bytes:
    """The 5k file from manythings.org's fra-eng.zip: the first `n_lines` lines of its fra.txt (the file
    lists the pairs by increasing length of the English sentence, so these are the shortest ones)."""
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as z:
            data = z.read("fra.txt")
    except KeyError:
        raise DataNotFoundError("the downloaded archive holds no fra.txt (not manythings.org's fra-eng.zip)") from None
    except Exception as e:  # an HTML page (a captive portal, an error page) instead of the archive: BadZipFile;
        # a damaged one: NotImplementedError (compression method), zlib.error, EOFError, RuntimeError, …
        raise DataNotFoundError(f"the download is not a readable zip archive ({type(e).__name__}: {e}; "
                                f"starts with {raw[:40]!r})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataNotFoundError(f"the archive's fra.txt is not UTF-8 text ({e})") from None
    lines = [line for line in text.splitlines() if line.strip()][:n_lines]
    for i, line in enumerate(lines, 1):
        if line.count("\t") != 2:
            raise ValueError(f"fra.txt line {i}: expected English, French, attribution separated by tabs")
    return ("\n".join(lines) + "\n").encode("utf-8")


class Source(NamedTuple):
    """Where a data file comes from. `sha256` checks the downloaded bytes (None: the source is not fixed,
    nothing to pin); `derive` turns them into the file (None: kept as they are); `expected_sha256` is the
    SHA-256 of the derived file the documented figures were measured on: a different result is kept, with a
    warning that the figures may not reproduce exactly."""
    url: str
    sha256: Optional[str]
    derive: Optional[Callable[[bytes], bytes]] = None
    expected_sha256: Optional[str] = None


SOURCES: dict = {
    # char-rnn's data file (Karpathy), unchanged since 2015: the download is pinned.
    TINY_SHAKESPEARE: Source(
        "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
        "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"),
    # manythings.org re-exports Tatoeba's pairs as they grow, so the archive has no fixed checksum; the
    # first 5,000 lines of its fra.txt reproduce the developers' file only while those lines are unchanged.
    TATOEBA: Source(
        "https://www.manythings.org/anki/fra-eng.zip", None, _tatoeba_subset,
        expected_sha256="d952b56a181da5270b7bb4ded3f3bbe61e67a9b1de0e0fbc1d46438c71fb55a7"),
}


def _candidates() -> list[pathlib.Path]:
    """shared/data beside every ancestor of the current directory and of this package."""
    out = []
    for start in (pathlib.Path.cwd(), pathlib.Path(__file__).resolve().parent):
        for d in (start, *start.parents):
            out.append(d / "shared" / "data")
            if d.name == "shared":
                out.append(d / "data")
    return out


def data_dir() -> Optional[pathlib.Path]:
    """The folder of a local copy of the data (steps 2–3 of the lookup): $FT_DATA_DIR when set (None if
    it does not exist), else the first non-empty `shared/data` found walking up from the current directory
    and then from this package (the project's ../shared/data). None when there is none."""
    env = os.environ.get("FT_DATA_DIR")
    if env:
        p = pathlib.Path(env).expanduser()
        return p.resolve() if p.is_dir() else None
    seen = set()
    for c in _candidates():
        if c in seen:
            continue
        seen.add(c)
        if c.is_dir() and any(c.iterdir()):
            return c.resolve()
    return None


def data_file(name: str) -> Optional[pathlib.Path]:
    """The path of `name` in data_dir(), or None when the folder or the file is absent (no cache, no
    download: see locate)."""
    d = data_dir()
    if d is None:
        return None
    p = d / name
    return p if p.is_file() else None


def cache_dir() -> pathlib.Path:
    """$FT_CACHE_DIR, else $XDG_CACHE_HOME/formal-transformers, else ~/.cache/formal-transformers (not
    created here)."""
    if os.environ.get("FT_CACHE_DIR"):
        return pathlib.Path(os.environ["FT_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base).expanduser() / "formal-transformers"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def download(url: str, dest: Union[str, os.PathLike], sha256: Optional[str] = None, *,
             derive: Optional[Callable[[bytes], bytes]] = None, timeout: float = 60.0) -> pathlib.Path:
    """Fetch `url`, check the SHA-256 of the bytes received against `sha256` (when given), apply `derive`
    (when given) and write the result to `dest` — through a temporary file in the same folder renamed at
    the end, so `dest` never holds a partial or unchecked file. Returns `dest`. ValueError naming the URL
    and both digests when the checksum differs (nothing written); OSError (urllib.error.URLError) when the
    URL cannot be read."""
    dest = pathlib.Path(dest)
    request = urllib.request.Request(url, headers={"User-Agent": "formal-transformers (python urllib)"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        data = response.read()
    got = _sha256(data)
    if sha256 is not None and got != sha256.lower():
        raise ValueError(f"checksum mismatch for {url}: SHA-256 {got}, expected {sha256} (nothing was written)")
    if derive is not None:
        data = derive(data)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=dest.name + ".", suffix=".part", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, dest)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    return dest


def _download_enabled(download_arg: Optional[bool]) -> bool:
    if download_arg is not None:
        return bool(download_arg)
    return os.environ.get("FT_DOWNLOAD", "1").strip().lower() not in ("0", "false", "no", "off")


def locate(name: str, path: Union[str, os.PathLike, None] = None, *, download: Optional[bool] = None) -> pathlib.Path:
    """The path of the data file `name` (a key of SOURCES), found or downloaded in the order of this
    module's docstring. `download=None` follows FT_DOWNLOAD (default: allowed). DataNotFoundError when
    none works."""
    if name not in SOURCES:
        raise ValueError(f"unknown data file {name!r}; known: {', '.join(sorted(SOURCES))}")
    if path is not None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike, not {type(path).__name__}")
        p = pathlib.Path(path).expanduser()
        p = p / name if p.is_dir() else p
        if p.is_file():
            return p
        raise DataNotFoundError(f"{name}: {p} does not exist (the path argument)")
    tried = []
    env = os.environ.get("FT_DATA_DIR")
    local = data_dir()
    if local is not None and (local / name).is_file():
        return local / name
    if env:
        tried.append(f"FT_DATA_DIR={env}")
    else:
        tried.append(f"{local}" if local is not None else "../shared/data (none found walking up from here)")
    cached = cache_dir() / name
    source = SOURCES[name]
    damaged = None
    if cached.is_file():
        damaged = _damaged_cache(cached, source)
        if damaged is None:
            return cached
        tried.append(f"the cache {cached}, which is damaged ({damaged})")
    else:
        tried.append(f"the cache {cached}")
    if not _download_enabled(download):
        reason = "downloading is off (FT_DOWNLOAD=0 or download=False)"
    else:
        try:
            download_(source.url, cached, source.sha256, derive=source.derive)
        except (OSError, ValueError) as e:
            reason = f"downloading {source.url} failed: {e}"
        else:
            got = _sha256(cached.read_bytes())
            _write_stamp(cached, got)
            if source.expected_sha256 is not None and got != source.expected_sha256:
                warnings.warn(f"{name} derived from {source.url} (SHA-256 {got}) differs from the file the "
                              f"documented figures were measured on ({source.expected_sha256}): the upstream "
                              "data changed; results may differ slightly from docs/notebooks.md", stacklevel=2)
            return cached
    raise DataNotFoundError(
        f"{name} is not available: not in {'; '.join(tried)}, and {reason}. Download it from {source.url} "
        f"(docs/data.md says how) and set FT_DATA_DIR to the folder holding {name}, or pass path=.")


download_ = download  # locate's parameter `download` shadows the function

# A cached file is used only while its SHA-256 checks out: against the pinned source's (a file kept as
# downloaded), else against the stamp `<name>.sha256` that locate writes beside a file it derived, else
# against the documented expected_sha256. Each file is hashed once per process (per size and mtime).
_VERIFIED: dict = {}


def _stamp(path: pathlib.Path) -> pathlib.Path:
    return path.with_name(path.name + ".sha256")


def _write_stamp(path: pathlib.Path, digest: str) -> None:
    stamp = _stamp(path)
    fd, tmp = tempfile.mkstemp(prefix=stamp.name + ".", suffix=".part", dir=stamp.parent)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(digest + "\n")
        os.replace(tmp, stamp)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise


def _damaged_cache(path: pathlib.Path, source: Source) -> Optional[str]:
    """None when the cached file is the one a download wrote, else what is wrong with it."""
    try:
        st = path.stat()
        key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
        if key in _VERIFIED:
            return _VERIFIED[key]
        got = _sha256(path.read_bytes())
    except OSError as e:
        return f"unreadable: {e}"
    if source.sha256 is not None and source.derive is None:
        want, what = source.sha256.lower(), "the pinned checksum"
    else:
        try:
            want, what = _stamp(path).read_text(encoding="ascii").strip().lower(), f"its stamp {_stamp(path).name}"
        except (OSError, UnicodeDecodeError):
            want, what = source.expected_sha256, "the documented checksum (no stamp)"
    problem = None if got == want else f"{st.st_size:,} bytes with SHA-256 {got}, not {what} {want}"
    _VERIFIED[key] = problem
    return problem


def tiny_shakespeare(path: Union[str, os.PathLike, None] = None, *, download: Optional[bool] = None) -> str:
    """Tiny Shakespeare (char-rnn's input.txt: 1,115,394 characters, 65 distinct), as one str. `path`: the
    file or a folder holding tinyshakespeare.txt; otherwise found or downloaded as the module says."""
    return locate(TINY_SHAKESPEARE, path, download=download).read_text(encoding="utf-8")


def tatoeba_eng_fra(path: Union[str, os.PathLike, None] = None, *, download: Optional[bool] = None) -> list:
    """The 5,000 shortest English → French pairs of Tatoeba (manythings.org's export) as TatoebaPair
    (english, french, attribution), in file order; keep the attribution with anything derived from a pair
    (CC-BY 2.0 FR). `path`: the file or a folder holding tatoeba-eng-fra-5k.tsv."""
    return read_tatoeba(locate(TATOEBA, path, download=download))


def skip_message(name: str) -> str:
    """What a notebook prints when `name` is not available."""
    where = os.environ.get("FT_DATA_DIR") or "../shared/data (beside the repository)"
    return (f"skipped: {name} is not available (looked in {where}; set FT_DATA_DIR to the folder holding it). "
            "The rest of the notebook does not need it.")


def quick() -> bool:
    """True when FT_QUICK is set to a non-empty value other than 0: the notebooks' shortened runs (CI)."""
    return os.environ.get("FT_QUICK", "").strip() not in ("", "0", "false", "False")


# ---------------------------------------------------------------------------------------------------
# Tatoeba English → French pairs


class TatoebaPair(NamedTuple):
    english: str
    french: str
    attribution: str  # the pair's CC-BY 2.0 (France) attribution, to be kept with anything derived from it


def read_tatoeba(path: Union[str, os.PathLike, None] = None) -> list[TatoebaPair]:
    """The pairs of a Tatoeba TSV file (English, French, attribution per line), in file order.
    Default path: locate("tatoeba-eng-fra-5k.tsv"). ValueError for a line without three fields."""
    if path is None:
        path = locate(TATOEBA)
    pairs = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            line = line.rstrip("\n").rstrip("\r")
            if not line:
                continue
            fields = line.split("\t")
            if len(fields) != 3:
                raise ValueError(f"{path}:{i}: expected 3 tab-separated fields, got {len(fields)}")
            pairs.append(TatoebaPair(*fields))
    return pairs


def split_by_source(pairs: Sequence[TatoebaPair], test_fraction: float = 0.1, seed: int = 0):
    """(train, test): the distinct English sentences are shuffled (numpy, seeded) and the last
    `test_fraction` of them go to the test split with ALL their French translations, so no test sentence
    is seen in training. Returns two lists of pairs."""
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, numbers.Real):
        raise TypeError(f"test_fraction must be a number, got {type(test_fraction).__name__}")
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    sources = sorted({p.english for p in pairs})
    if len(sources) < 2:
        raise ValueError(f"split_by_source needs at least 2 distinct English sentences, got {len(sources)}")
    import numpy as np

    order = np.random.default_rng(seed).permutation(len(sources))
    n_test = min(max(1, int(round(test_fraction * len(sources)))), len(sources) - 1)  # both splits non-empty
    test_src = {sources[i] for i in order[len(sources) - n_test:]}
    train = [p for p in pairs if p.english not in test_src]
    test = [p for p in pairs if p.english in test_src]
    return train, test


def group_references(pairs: Iterable[TatoebaPair]) -> dict:
    """English sentence -> (list of its French translations, list of their attributions), in file order."""
    out: dict = {}
    for p in pairs:
        fr, at = out.setdefault(p.english, ([], []))
        fr.append(p.french)
        at.append(p.attribution)
    return out
