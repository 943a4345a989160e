"""Blobs as files of one directory, beside a SQLite database by default.

Each blob is one file named by its key: its content type on the first line,
then its bytes. A put writes a temporary file and renames it over the key,
so a reader sees the old blob or the new one, never a part. The directory
also holds the signing secret (``signing.secret``, mode 0600), created on
first open: the URLs signed by one horde stay valid across its restarts and
across the processes serving the same directory.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterable
from pathlib import Path

import anyio.to_thread

from hordelite.blobs._store import Blob
from hordelite.config import Config
from hordelite.contract import signing
from hordelite.errors import ConfigError

# The default directory's name, beside the SQLite database file.
DEFAULT_DIRECTORY_NAME = "hordelite-blobs"
# Keys never hold a dot, so neither this file nor the temporary files
# (".<key>.<random>.tmp") can be taken for a blob.
_SECRET_FILE = "signing.secret"
# Ignores the whole directory, itself included, in any git working tree it
# lands in (the default is in the current directory): the secret and the
# users' images are never committed by a `git add .`.
_GITIGNORE = ".gitignore"


def blob_directory(config: Config) -> Path:
    """``blobs.directory``, or by default ``hordelite-blobs`` beside the SQLite
    database file (in the current directory for PostgreSQL or an in-memory
    SQLite database)."""
    if config.blobs.directory:
        return Path(config.blobs.directory).expanduser()
    database = config.storage.database
    if "://" not in database:
        return Path(database).expanduser().parent / DEFAULT_DIRECTORY_NAME
    if database.startswith("sqlite:///") and len(database) > len("sqlite:///"):
        return Path(database[len("sqlite:///") :]).expanduser().parent / DEFAULT_DIRECTORY_NAME
    return Path(DEFAULT_DIRECTORY_NAME)


def _secret(directory: Path) -> bytes:
    """The directory's signing secret, created if missing.

    Several processes may open the directory at once: the secret is written
    whole to a file of this process's own, then linked into place; a process
    that loses the race reads the winner's.
    """
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:  # under a file, say: one line, not a traceback
        raise ConfigError(f"blobs.directory: cannot make {directory}: {exc.strerror}") from None
    _ignore_in_git(directory)
    path = directory / _SECRET_FILE
    if not path.exists():
        temporary = directory / f".{_SECRET_FILE}.{secrets.token_hex(8)}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(secrets.token_bytes(signing.SECRET_BYTES))
                file.flush()
                os.fsync(file.fileno())
            with contextlib.suppress(FileExistsError):
                os.link(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)
    secret = path.read_bytes()
    if len(secret) != signing.SECRET_BYTES:
        raise ConfigError(
            f"blobs.directory: {path} holds {len(secret)} bytes, not a "
            f"{signing.SECRET_BYTES}-byte signing secret; remove it to make a new one "
            "(URLs signed before stop working)"
        )
    return secret


def _ignore_in_git(directory: Path) -> None:
    """A ``.gitignore`` of ``*`` in the directory, unless it has one (the
    operator's own is kept)."""
    with contextlib.suppress(FileExistsError):
        fd = os.open(directory / _GITIGNORE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write("# Made by hordelite: blobs and their signing secret stay out of git.\n*\n")


def _write(path: Path, data: bytes, content_type: str) -> None:
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    try:
        with open(temporary, "wb") as file:
            file.write(content_type.encode("ascii") + b"\n")
            file.write(data)
            file.flush()
            # On disk before the rename: a request row committed after the
            # put must not refer to a blob a crash could lose.
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _read(path: Path) -> Blob | None:
    try:
        with open(path, "rb") as file:
            content_type = file.readline().rstrip(b"\n").decode("ascii")
            return Blob(file.read(), content_type)
    except FileNotFoundError:
        return None


def _remove(paths: list[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def _remove_prefixed(directory: Path, prefixes: list[str]) -> None:
    for prefix in prefixes:
        # The prefix passed check_key: no glob character can be in it.
        _remove(list(directory.glob(f"{prefix}-*")))


class DirectoryStore:
    """A BlobStore of files under ``directory`` (see the module)."""

    def __init__(self, directory: Path, secret: bytes) -> None:
        if len(secret) != signing.SECRET_BYTES:
            raise ValueError(f"the signing secret must be {signing.SECRET_BYTES} bytes")
        self.directory = directory
        self._secret = secret

    @classmethod
    async def open(cls, directory: Path) -> DirectoryStore:
        """The store of ``directory``, creating it and its secret if missing."""
        secret = await anyio.to_thread.run_sync(_secret, directory)
        return cls(directory, secret)

    def _path(self, key: str) -> Path:
        return self.directory / signing.check_key(key)

    async def put(self, key: str, data: bytes, content_type: str) -> None:
        path = self._path(key)
        signing.check_content_type(content_type)
        await anyio.to_thread.run_sync(_write, path, data, content_type)

    async def get(self, key: str) -> Blob | None:
        return await anyio.to_thread.run_sync(_read, self._path(key))

    async def exists(self, key: str) -> bool:
        return await anyio.to_thread.run_sync(self._path(key).is_file)

    async def delete(self, keys: Iterable[str]) -> None:
        paths = [self._path(key) for key in keys]
        if paths:
            await anyio.to_thread.run_sync(_remove, paths)

    async def delete_prefixed(self, prefixes: Iterable[str]) -> None:
        checked = [signing.check_key(prefix) for prefix in prefixes]
        if checked:
            await anyio.to_thread.run_sync(_remove_prefixed, self.directory, checked)

    def signed_url(self, key: str, expires_at: float, base_url: str) -> str:
        return signing.signed_url(self._secret, key, expires_at, base_url)

    def refusal(self, key: str, expires: str, sig: str, now: float) -> str | None:
        """Why a fetch with these query values is refused, or None (signing.refusal)."""
        return signing.refusal(self._secret, key, expires, sig, now)
