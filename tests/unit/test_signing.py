"""hordelite.contract.signing: blob keys and signed, expiring URLs."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import anyio
import pytest

from hordelite.blobs import DirectoryStore, blob_directory
from hordelite.config import Config
from hordelite.contract import signing
from hordelite.errors import ConfigError

SECRET = bytes(range(32))
KEY = "image-0f3a_1"
NOW = 1_800_000_000.0


def names(directory: Path) -> list[str]:
    """Every file and folder under ``directory``, sorted."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def query(url: str) -> tuple[str, str, str]:
    """The key, expires and sig of a signed URL."""
    parts = urlsplit(url)
    values = parse_qs(parts.query)
    return parts.path.rsplit("/", 1)[1], values["expires"][0], values["sig"][0]


def test_a_signed_url_names_the_route_the_key_the_expiry_and_a_hex_signature() -> None:
    url = signing.signed_url(SECRET, KEY, NOW + 120.9, "http://127.0.0.1:7001/")
    sig = signing.signature(SECRET, KEY, int(NOW) + 120)
    assert url == f"http://127.0.0.1:7001/blobs/{KEY}?expires={int(NOW) + 120}&sig={sig}"
    assert len(sig) == 64


def test_a_url_is_valid_until_it_expires() -> None:
    key, expires, sig = query(signing.signed_url(SECRET, KEY, NOW + 120, "http://h"))
    assert signing.verify(SECRET, key, expires, sig, NOW)
    assert signing.verify(SECRET, key, expires, sig, NOW + 119.9)
    assert signing.refusal(SECRET, key, expires, sig, NOW + 120) == "This blob URL has expired."
    assert not signing.verify(SECRET, key, expires, sig, NOW + 121)


def test_another_key_in_the_path_is_refused() -> None:
    _, expires, sig = query(signing.signed_url(SECRET, KEY, NOW + 120, "http://h"))
    assert signing.refusal(SECRET, "image-0f3a_2", expires, sig, NOW) == (
        "This blob URL's signature does not match."
    )


def test_a_later_expiry_is_refused() -> None:
    key, expires, sig = query(signing.signed_url(SECRET, KEY, NOW + 120, "http://h"))
    later = str(int(expires) + 3600)
    assert not signing.verify(SECRET, key, later, sig, NOW)


@pytest.mark.parametrize("expires", ["+1800000120", "01800000120", " 1800000120", "1_800_000_120"])
def test_another_spelling_of_the_expiry_is_refused(expires: str) -> None:
    key, _, sig = query(signing.signed_url(SECRET, KEY, 1_800_000_120, "http://h"))
    assert not signing.verify(SECRET, key, expires, sig, NOW)


def test_a_changed_signature_is_refused() -> None:
    key, expires, sig = query(signing.signed_url(SECRET, KEY, NOW + 120, "http://h"))
    flipped = ("0" if sig[0] != "0" else "1") + sig[1:]
    assert not signing.verify(SECRET, key, expires, flipped, NOW)
    assert not signing.verify(SECRET, key, expires, sig.upper(), NOW)


def test_another_secret_s_signature_is_refused() -> None:
    key, expires, sig = query(signing.signed_url(bytes(32), KEY, NOW + 120, "http://h"))
    assert not signing.verify(SECRET, key, expires, sig, NOW)


@pytest.mark.parametrize("cut", [0, 1, 63, 65, 128])
def test_a_signature_of_the_wrong_length_is_refused(cut: int) -> None:
    key, expires, sig = query(signing.signed_url(SECRET, KEY, NOW + 120, "http://h"))
    wrong = (sig * 2)[:cut]
    assert signing.refusal(SECRET, key, expires, wrong, NOW) == "This blob URL is malformed."


@pytest.mark.parametrize("sig", ["é" * 64, "\x00" * 64, "g" * 64])
def test_a_signature_outside_hex_is_refused_without_an_exception(sig: str) -> None:
    assert not signing.verify(SECRET, KEY, str(int(NOW) + 60), sig, NOW)


BAD_KEYS = [
    "",
    ".",
    "..",
    "../secret",
    "..%2Fsigning.secret",
    "a/b",
    "a\\b",
    "/etc/passwd",
    "signing.secret",
    ".hidden",
    "a\x00b",
    "é",
    "a b",
    "k" * (signing.MAX_KEY_CHARS + 1),
]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_keys_outside_the_safe_alphabet_are_refused(key: str) -> None:
    with pytest.raises(signing.BlobKeyError):
        signing.check_key(key)
    with pytest.raises(signing.BlobKeyError):
        signing.signed_url(SECRET, key, NOW + 60, "http://h")
    # Whatever the signature, a fetch of such a key is refused.
    assert not signing.verify(SECRET, key, str(int(NOW) + 60), "0" * 64, NOW)


@pytest.mark.parametrize("key", ["a", "Z9", "img_0-1", "k" * signing.MAX_KEY_CHARS])
def test_keys_of_the_safe_alphabet_are_accepted(key: str) -> None:
    assert signing.check_key(key) == key


@pytest.mark.parametrize("key", BAD_KEYS)
@pytest.mark.anyio
async def test_the_directory_store_refuses_a_bad_key_before_touching_a_file(
    tmp_path: Path, key: str
) -> None:
    store = await DirectoryStore.open(tmp_path / "blobs")
    before = names(tmp_path)
    with pytest.raises(signing.BlobKeyError):
        await store.put(key, b"x", "text/plain")
    with pytest.raises(signing.BlobKeyError):
        await store.get(key)
    with pytest.raises(signing.BlobKeyError):
        await store.delete([key])
    assert names(tmp_path) == before


@pytest.mark.parametrize("content_type", ["", "text/plain\nX: y", "text/é", "a" * 256])
@pytest.mark.anyio
async def test_the_directory_store_refuses_a_content_type_it_cannot_store_on_one_line(
    tmp_path: Path, content_type: str
) -> None:
    store = await DirectoryStore.open(tmp_path)
    with pytest.raises(ValueError, match="not a printable ASCII media type"):
        await store.put("k", b"x", content_type)


@pytest.mark.anyio
async def test_the_directory_store_keeps_bytes_and_content_type_and_deletes(
    tmp_path: Path,
) -> None:
    store = await DirectoryStore.open(tmp_path / "blobs")
    await store.put("a", b"\x00first\nline", "image/jpeg")
    await store.put("a", b"\xff\xd8second", "application/json; charset=utf-8")
    found = await store.get("a")
    assert found is not None
    assert (found.data, found.content_type) == (
        b"\xff\xd8second",
        "application/json; charset=utf-8",
    )
    await store.delete(["a", "never-stored"])
    assert await store.get("a") is None
    # No temporary file left behind: the secret (and the .gitignore) alone remain.
    assert sorted(p.name for p in (tmp_path / "blobs").iterdir()) == [
        ".gitignore",
        "signing.secret",
    ]


@pytest.mark.anyio
async def test_the_secret_is_made_once_with_mode_0600_and_kept_across_opens(
    tmp_path: Path,
) -> None:
    first = await DirectoryStore.open(tmp_path / "blobs")
    secret = tmp_path / "blobs" / "signing.secret"
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600
    assert len(secret.read_bytes()) == signing.SECRET_BYTES
    second = await DirectoryStore.open(tmp_path / "blobs")
    url = first.signed_url("k", NOW + 60, "http://h")
    key, expires, sig = query(url)
    assert second.refusal(key, expires, sig, NOW) is None
    other = await DirectoryStore.open(tmp_path / "other")
    assert other.refusal(key, expires, sig, NOW) is not None


@pytest.mark.anyio
@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
async def test_the_blob_directory_and_its_secret_stay_out_of_the_git_tree_it_is_made_in(
    tmp_path: Path,
) -> None:
    # The default folder is made in the current directory (with PostgreSQL),
    # which may be the operator's own git working tree.
    await anyio.run_process(["git", "init", "-q", str(tmp_path)])
    await DirectoryStore.open(tmp_path / "hordelite-blobs")
    await (await DirectoryStore.open(tmp_path / "hordelite-blobs")).put("a", b"x", "image/jpeg")
    assert (tmp_path / "hordelite-blobs" / "signing.secret").is_file()
    status = await anyio.run_process(
        ["git", "-C", str(tmp_path), "status", "--porcelain", "--untracked-files=all"]
    )
    assert status.stdout == b""


@pytest.mark.anyio
async def test_a_blob_directory_that_cannot_be_made_is_a_config_error_naming_it(
    tmp_path: Path,
) -> None:
    (tmp_path / "a-file").write_text("not a folder", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^blobs\.directory: ") as info:
        await DirectoryStore.open(tmp_path / "a-file" / "blobs")
    assert str(tmp_path / "a-file" / "blobs") in str(info.value)


def test_the_repository_ignores_databases_and_blob_folders() -> None:
    ignored = (Path(__file__).resolve().parents[2] / ".gitignore").read_text(encoding="utf-8")
    assert {"*.db", "hordelite-blobs/"} <= set(ignored.splitlines())


@pytest.mark.parametrize(
    ("database", "directory", "expected"),
    [
        ("/srv/horde/h.db", "", Path("/srv/horde/hordelite-blobs")),
        ("h.db", "", Path("hordelite-blobs")),
        ("sqlite:////srv/horde/h.db", "", Path("/srv/horde/hordelite-blobs")),
        ("postgresql://u@h/db", "", Path("hordelite-blobs")),
        ("/srv/horde/h.db", "/data/blobs", Path("/data/blobs")),
    ],
)
def test_the_blob_directory_defaults_to_beside_the_sqlite_file(
    database: str, directory: str, expected: Path
) -> None:
    config = Config().replace(storage={"database": database}, blobs={"directory": directory})
    assert blob_directory(config) == expected
