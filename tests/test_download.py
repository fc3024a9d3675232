"""companion.data.download: checksums and one atomic, verified download.

The downloads read ``file://`` URLs of files in a temporary folder: nothing touches the
network. The HTTP cases (server errors, a connection cut short, timeouts, Ctrl-C) are in
test_multi30k.py, through :func:`companion.data.multi30k_files`.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from companion.data.download import (
    ChecksumError,
    DownloadError,
    download_file,
    sha256_of_file,
    verify_checksum,
)

BODY = b"Zwei Hunde spielen im Schnee.\n" * 5000  # > one 64 KiB chunk
DIGEST = hashlib.sha256(BODY).hexdigest()


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "server" / "file.gz"
    path.parent.mkdir()
    path.write_bytes(BODY)
    return path


def test_sha256_and_verify(source: Path) -> None:
    assert sha256_of_file(source) == DIGEST
    assert verify_checksum(str(source), DIGEST) == source
    with pytest.raises(ChecksumError, match=f"expected SHA-256 {'0' * 64}, got {DIGEST}") as e:
        verify_checksum(source, "0" * 64, hint="Delete it.")
    assert str(e.value).endswith("was not read. Delete it.")
    assert f"({len(BODY)} bytes)" in str(e.value)


def test_download_file_writes_the_verified_file(source: Path, tmp_path: Path) -> None:
    destination = tmp_path / "cache" / "sub" / "file.gz"  # folders are created
    path = download_file(source.as_uri(), destination, DIGEST, progress=False)
    assert path == destination
    assert destination.read_bytes() == BODY
    assert os.listdir(destination.parent) == ["file.gz"]  # no temporary .part file left


def test_download_file_with_wrong_checksum_writes_nothing(source: Path, tmp_path: Path) -> None:
    destination = tmp_path / "cache" / "file.gz"
    destination.parent.mkdir()
    destination.write_bytes(b"old")
    with pytest.raises(ChecksumError) as error:
        download_file(source.as_uri(), destination, "0" * 64, progress=False, what_to_do="Help.")
    message = str(error.value)
    assert f"expected SHA-256 {'0' * 64}, got {DIGEST} ({len(BODY)} bytes)" in message
    assert f"nothing was written to {destination}" in message
    assert message.endswith("Try again, or see below.\nHelp.")
    assert destination.read_bytes() == b"old"  # the old file is left as it was
    assert os.listdir(destination.parent) == ["file.gz"]


def test_download_file_failure_is_a_download_error(tmp_path: Path) -> None:
    missing = (tmp_path / "nowhere.gz").as_uri()
    with pytest.raises(DownloadError, match="could not download .*nowhere.gz") as error:
        download_file(missing, tmp_path / "cache" / "x.gz", DIGEST, progress=False)
    assert "\n" not in str(error.value)  # no what_to_do given: nothing appended
    assert os.listdir(tmp_path / "cache") == []


def test_download_file_bad_timeout(source: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="timeout must be a positive finite number, got 0"):
        download_file(source.as_uri(), tmp_path / "x.gz", DIGEST, timeout=0)
    with pytest.raises(TypeError, match="timeout must be a positive finite number, got str"):
        download_file(source.as_uri(), tmp_path / "x.gz", DIGEST, timeout="30")  # type: ignore[arg-type]
    assert not (tmp_path / "x.gz").exists()
