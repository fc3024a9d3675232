"""companion.data.multi30k: getting Multi30k (download, checksums, atomic writes, local
copies, error messages) and reading its files.

Nothing here touches the internet. Downloads come from a local HTTP server on 127.0.0.1 that
serves the shared copy of the data in ``../shared/data/multi30k`` (relative to the repository
root), intact or damaged on purpose.
"""

from __future__ import annotations

import gzip
import hashlib
import http.server
import os
import shutil
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers import SHARED_MULTI30K as SHARED
from helpers import needs_multi30k

from companion.data import (
    BASE_URL_ENV_VAR,
    MULTI30K_SHA256,
    MULTI30K_URL,
    ROOT_ENV_VAR,
    ChecksumError,
    DownloadError,
    default_cache_dir,
    load_multi30k,
    multi30k_files,
    read_parallel,
    sha256_of_file,
)

pytestmark = needs_multi30k


# ---------------------------------------------------------------------------------------------
# A local server that serves the shared files, or damaged versions of them
# ---------------------------------------------------------------------------------------------


@dataclass
class FileServer:
    """State shared with the request handler: what to serve, which paths were requested."""

    url: str = ""
    mode: str = "ok"  # "ok", "corrupt", "truncate", "stall", "404"
    requests: list[str] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)


def corrupted(body: bytes) -> bytes:
    """The same bytes with one byte in the middle flipped."""
    middle = len(body) // 2
    return body[:middle] + bytes([body[middle] ^ 0xFF]) + body[middle + 1 :]


class Handler(http.server.BaseHTTPRequestHandler):
    state: FileServer  # set on a subclass per server

    def do_GET(self) -> None:  # noqa: N802 (the http.server API)
        self.state.requests.append(self.path)
        name = self.path.lstrip("/")
        if self.state.mode == "404" or name not in MULTI30K_SHA256:
            self.send_error(404, "Not Found")
            return
        body = (SHARED / name).read_bytes()
        if self.state.mode == "corrupt":
            body = corrupted(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/gzip")
        self.send_header("Content-Length", str(len(body)))  # always the full size
        self.end_headers()
        if self.state.mode == "truncate":  # the server dies half-way through the file
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        if self.state.mode == "stall":  # headers, then silence
            self.state.release.wait(timeout=10)
            return
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # keep the test output quiet
        pass


@pytest.fixture
def server() -> Iterator[FileServer]:
    state = FileServer()
    handler = type("BoundHandler", (Handler,), {"state": state})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield state
    state.release.set()
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


@pytest.fixture
def closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens: connecting is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No MULTI30K_* variables from the outside, and a private cache home."""
    monkeypatch.delenv(ROOT_ENV_VAR, raising=False)
    monkeypatch.delenv(BASE_URL_ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def listing(folder: Path) -> list[str]:
    """Everything in ``folder`` (hidden temporary files included); [] if it does not exist."""
    return sorted(os.listdir(folder)) if folder.exists() else []


# ---------------------------------------------------------------------------------------------
# Downloading
# ---------------------------------------------------------------------------------------------


def test_download_verifies_and_caches(server: FileServer, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    paths = multi30k_files("val", cache_dir=cache, base_url=server.url, progress=False)
    assert server.requests == ["/val.de.gz", "/val.en.gz"]
    assert paths == {"de": cache / "val.de.gz", "en": cache / "val.en.gz"}
    for path in paths.values():
        assert path.read_bytes() == (SHARED / path.name).read_bytes()
    assert listing(cache) == ["val.de.gz", "val.en.gz"]  # no temporary file left behind

    # The second time the files come from the cache: the server sees no new request.
    pairs = load_multi30k("val", cache_dir=cache, base_url=server.url, progress=False)
    assert server.requests == ["/val.de.gz", "/val.en.gz"]
    assert len(pairs) == 1014
    assert pairs[0] == (
        "Eine Gruppe von Männern lädt Baumwolle auf einen Lastwagen",
        "A group of men are loading cotton onto a truck",
    )


def test_download_with_progress_bar_and_env_base_url(
    server: FileServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(BASE_URL_ENV_VAR, server.url + "/")  # a trailing slash is fine
    pairs = load_multi30k("test", progress=True)  # the default cache under XDG_CACHE_HOME
    assert len(pairs) == 1000
    assert server.requests == ["/test_2016_flickr.de.gz", "/test_2016_flickr.en.gz"]
    expected_cache = tmp_path / "xdg-cache" / "transformer-step-by-step" / "multi30k"
    assert default_cache_dir() == expected_cache
    assert listing(expected_cache) == ["test_2016_flickr.de.gz", "test_2016_flickr.en.gz"]


def test_corrupted_download_is_rejected_and_not_kept(server: FileServer, tmp_path: Path) -> None:
    server.mode = "corrupt"
    cache = tmp_path / "cache"
    with pytest.raises(ChecksumError) as error:
        multi30k_files("val", cache_dir=cache, base_url=server.url, progress=False)
    message = str(error.value)
    served = corrupted((SHARED / "val.de.gz").read_bytes())
    assert MULTI30K_SHA256["val.de.gz"] in message  # expected
    assert sha256_of(served) in message  # actual
    assert f"{server.url}/val.de.gz" in message
    assert str(cache / "val.de.gz") in message
    assert listing(cache) == []  # nothing written, temporary file removed


def test_server_dying_mid_file_leaves_nothing(server: FileServer, tmp_path: Path) -> None:
    server.mode = "truncate"
    cache = tmp_path / "cache"
    with pytest.raises(DownloadError) as error:
        multi30k_files("train", cache_dir=cache, base_url=server.url, progress=False)
    size = (SHARED / "train.de.gz").stat().st_size
    message = str(error.value)
    assert f"stopped after {size // 2} of {size} bytes" in message
    assert f"{server.url}/train.de.gz" in message
    assert listing(cache) == []  # no partial file, no temporary file


def test_offline_without_local_copy_says_what_to_do(closed_port_url: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with pytest.raises(DownloadError) as error:
        load_multi30k("train", cache_dir=cache, base_url=closed_port_url, progress=False)
    message = str(error.value)
    assert f"{closed_port_url}/train.de.gz" in message
    assert "Connection refused" in message or "refused" in message.lower()
    assert MULTI30K_URL in message  # where to get the files by hand
    assert ROOT_ENV_VAR in message  # the environment variable
    assert "root=" in message  # the argument
    assert str(cache) in message  # the cache folder
    assert BASE_URL_ENV_VAR in message
    assert listing(cache) == []


def test_timeout_is_reported(server: FileServer, tmp_path: Path) -> None:
    server.mode = "stall"
    cache = tmp_path / "cache"
    with pytest.raises(DownloadError, match="timed out"):
        multi30k_files("val", cache_dir=cache, base_url=server.url, timeout=0.3, progress=False)
    assert listing(cache) == []


def test_http_error_is_reported(server: FileServer, tmp_path: Path) -> None:
    server.mode = "404"
    cache = tmp_path / "cache"
    with pytest.raises(DownloadError, match="404") as error:
        multi30k_files("val", cache_dir=cache, base_url=server.url, progress=False)
    assert ROOT_ENV_VAR in str(error.value)
    assert listing(cache) == []


def test_interrupted_download_removes_the_temporary_file(
    server: FileServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C at the last moment (just before the rename): no file, no temporary file."""

    def interrupt(source: object, destination: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupt)  # what the atomic writer renames with
    cache = tmp_path / "cache"
    with pytest.raises(KeyboardInterrupt):
        multi30k_files("val", cache_dir=cache, base_url=server.url, progress=False)
    assert listing(cache) == []


def test_corrupt_file_in_cache_is_reported_not_parsed(server: FileServer, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    broken = cache / "val.de.gz"
    broken.write_bytes(gzip.compress(b"not the data\n"))
    with pytest.raises(ChecksumError) as error:
        load_multi30k("val", cache_dir=cache, base_url=server.url, progress=False)
    message = str(error.value)
    assert str(broken) in message
    assert MULTI30K_SHA256["val.de.gz"] in message
    assert sha256_of_file(broken) in message
    assert "Delete it" in message
    assert server.requests == []


def test_download_false_with_empty_cache(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="download=False") as error:
        multi30k_files("val", cache_dir=tmp_path / "cache", download=False)
    assert ROOT_ENV_VAR in str(error.value)


# ---------------------------------------------------------------------------------------------
# Local copies: root= and MULTI30K_ROOT
# ---------------------------------------------------------------------------------------------


def test_root_argument_reads_local_copy_without_download(
    closed_port_url: str, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    pairs = load_multi30k("val", root=SHARED, cache_dir=cache, base_url=closed_port_url)
    assert len(pairs) == 1014
    paths = multi30k_files("val", root=str(SHARED), cache_dir=cache)
    assert paths == {"de": SHARED / "val.de.gz", "en": SHARED / "val.en.gz"}
    assert not cache.exists()  # nothing copied or downloaded


def test_env_root_reads_local_copy(
    closed_port_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ROOT_ENV_VAR, str(SHARED))
    train = load_multi30k("train", base_url=closed_port_url)
    assert len(train) == 29_000
    assert train[0] == (
        "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
        "Two young, White males are outside near many bushes.",
    )
    assert len(load_multi30k("test_2016_flickr")) == 1000
    assert not (tmp_path / "xdg-cache").exists()


@pytest.fixture
def local_copy(tmp_path: Path) -> Path:
    """A private copy of the shared files (outside the repository) that tests may damage."""
    folder = tmp_path / "local"
    folder.mkdir()
    for name in MULTI30K_SHA256:
        shutil.copyfile(SHARED / name, folder / name)
    return folder


@pytest.mark.parametrize("via", ["argument", "environment"])
def test_local_copy_with_wrong_file_is_rejected(
    local_copy: Path, via: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    truncated = local_copy / "val.en.gz"
    truncated.write_bytes(truncated.read_bytes()[:1000])
    root = local_copy if via == "argument" else None
    if via == "environment":
        monkeypatch.setenv(ROOT_ENV_VAR, str(local_copy))
    with pytest.raises(ChecksumError) as error:
        load_multi30k("val", root=root)
    message = str(error.value)
    assert str(truncated) in message
    assert MULTI30K_SHA256["val.en.gz"] in message
    assert sha256_of_file(truncated) in message
    assert "1000 bytes" in message
    assert f"{MULTI30K_URL}/val.en.gz" in message  # where a fresh copy comes from
    assert len(load_multi30k("train", root=root)) == 29_000  # the intact split still loads


def test_local_copy_missing_file(local_copy: Path) -> None:
    (local_copy / "test_2016_flickr.de.gz").unlink()
    with pytest.raises(FileNotFoundError, match="test_2016_flickr.de.gz"):
        load_multi30k("test", root=local_copy)
    with pytest.raises(FileNotFoundError, match="not a folder"):
        load_multi30k("val", root=local_copy / "nowhere")


# ---------------------------------------------------------------------------------------------
# Arguments and defaults
# ---------------------------------------------------------------------------------------------


def test_default_cache_dir_honours_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "transformer-step-by-step" / "multi30k"
    for value in (None, "", "relative/path"):  # unset, empty or relative: ~/.cache
        if value is None:
            monkeypatch.delenv("XDG_CACHE_HOME")
        else:
            monkeypatch.setenv("XDG_CACHE_HOME", value)
        expected = Path.home() / ".cache" / "transformer-step-by-step" / "multi30k"
        assert default_cache_dir() == expected


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="split must be one of .*'train'.*got 'training'"):
        load_multi30k("training", root=SHARED)
    with pytest.raises(TypeError, match="split must be a str"):
        load_multi30k(0, root=SHARED)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout must be a positive finite number"):
        multi30k_files("val", cache_dir=tmp_path, timeout=0)
    with pytest.raises(TypeError, match="base_url must be a str"):
        multi30k_files("val", cache_dir=tmp_path, base_url=b"http://x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="download must be a bool"):
        multi30k_files("val", cache_dir=tmp_path, download="no")  # type: ignore[arg-type]


def test_shipped_checksums_match_the_shared_sums_file() -> None:
    listed = {}
    for line in (SHARED / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split()
        listed[name] = digest
    assert listed == MULTI30K_SHA256


# ---------------------------------------------------------------------------------------------
# Reading the files
# ---------------------------------------------------------------------------------------------


def test_read_parallel(tmp_path: Path) -> None:
    src, tgt = tmp_path / "a.de.gz", tmp_path / "a.en.txt"
    src.write_bytes(gzip.compress("eins\nzwei\u2028halb\n".encode()))  # U+2028 stays inside
    tgt.write_text("one\r\ntwo\n", encoding="utf-8")
    assert read_parallel(src, tgt) == [("eins", "one"), ("zwei\u2028halb", "two")]
    tgt.write_text("one\ntwo\nthree\n", encoding="utf-8")
    with pytest.raises(ValueError, match="same number of lines: .* has 2, .* has 3"):
        read_parallel(src, tgt)


def test_load_multi30k_bad_split() -> None:
    with pytest.raises(ValueError, match=r"split must be one of \('train', 'val'"):
        load_multi30k("dev", root=SHARED)
