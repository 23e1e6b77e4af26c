"""Checkpoint storage on a local (or mounted) filesystem: ``file:///path``.

Every write goes to a temporary file in the destination directory, is fsynced, then
renamed (plain writes, ``os.replace``) or hard-linked (create-only writes, ``os.link``,
which fails atomically if the target exists) into place, and the directory is fsynced.
A reader therefore sees either the old object or the complete new one, never a partial
file, and what a method wrote survives a crash once the method returns.

Temporary files are named ``.<name>.tmp-<32 hex digits>``; listings skip them and keys
may not look like them. A crash can leave one behind: it is invisible to every method
and can be deleted by hand at any time.
"""

from __future__ import annotations

import builtins
import errno
import fcntl
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO
from urllib.parse import quote

from airflow_ckpt.errors import (
    ObjectAlreadyExistsError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StorageAccessDeniedError,
    StorageError,
)
from airflow_ckpt.runtime.storage.base import CheckpointStorage, ObjectInfo, etag_of
from airflow_ckpt.runtime.storage.hashing import HashingReader
from airflow_ckpt.runtime.storage.naming import check_key, check_prefix, dir_prefix

_TMP_NAME = re.compile(r"^\..+\.tmp-[0-9a-f]{32}$")
_COPY_BUFFER = 1024 * 1024
# Times a write retries when a concurrent delete removed its freshly created directory.
_DIR_RACE_RETRIES = 5
#: walks of one listing at most while files vanish during them (see LocalStorage.list)
LIST_ATTEMPTS = 5


def is_temp_name(name: str) -> bool:
    """Whether a file name is one of this backend's in-flight temporary files."""
    return bool(_TMP_NAME.match(name))


def _temp_name(name: str) -> str:
    return f".{name}.tmp-{uuid.uuid4().hex}"


def fsync_dir(path: Path) -> None:
    """Make the directory entries in ``path`` durable (a rename or create in it)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_temp(directory: Path, name: str, fill: Callable[[BinaryIO], None]) -> Path:
    """Create a fresh temp file in ``directory``, fill it, fsync it; return its path."""
    tmp = directory / _temp_name(name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            fill(fh)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``directory`` for a compare-and-replace in it: every
    replacing write of this backend takes it, so a compare-and-swap sees no other
    replacement between its read and its rename (processes of one host, or hosts whose
    shared filesystem implements ``flock``)."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _makedirs(directory: Path) -> None:
    """``mkdir -p`` that fsyncs each parent in which it created an entry."""
    missing: list[Path] = []
    current = directory
    while not current.is_dir():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for path in reversed(missing):
        try:
            path.mkdir()
        except FileExistsError:
            if not path.is_dir():
                raise
            continue
        fsync_dir(path.parent)


class LocalStorage(CheckpointStorage):
    """Checkpoint storage rooted at a local directory.

    The root need not exist: the first write creates it, and until then reads behave
    as on an empty store (empty listings, ``ObjectNotFoundError``). ``create_only``
    writes need a filesystem with hard links (every local Linux/macOS filesystem and
    NFS do; some FUSE/SMB mounts do not, which raises ``StorageError``).
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        path = Path(root)
        if not path.is_absolute():
            raise ValueError(f"LocalStorage root must be an absolute path, got {root!r}")
        self.root = path
        self.uri = "file://" + quote(path.as_posix(), safe="/:@!$&'()*+,;=-._~")

    def __repr__(self) -> str:
        return f"LocalStorage({self.uri!r})"

    # ------------------------------------------------------------------ helpers

    def _path(self, key: str) -> Path:
        check_key(key)
        for part in key.split("/"):
            if is_temp_name(part):
                raise ValueError(
                    f"invalid storage key {key!r}: {part!r} looks like a temporary file"
                )
        return self.root.joinpath(*key.split("/"))

    def _key(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def _where(self, key: str) -> str:
        return f"{self.uri}/{key}" if key else self.uri

    @contextmanager
    def _errors(self, action: str, key: str) -> Iterator[None]:
        """Turn OS errors into ``StorageError`` subclasses naming the object."""
        try:
            yield
        except StorageError:
            raise
        except PermissionError as exc:
            raise StorageAccessDeniedError(
                f"cannot {action} {self._where(key)}: permission denied ({exc}); "
                "check the owner and mode of the storage directory"
            ) from exc
        except OSError as exc:
            raise StorageError(f"cannot {action} {self._where(key)}: {exc}") from exc

    def _publish(
        self, key: str, fill: Callable[[BinaryIO], None], *, create_only: bool,
        if_match: str | None = None, same: bytes | None = None,
    ) -> None:
        """Write a temp file with ``fill`` and move it to ``key`` (the one write path).

        ``same``: the bytes being written, when known; a create-only write that finds
        exactly them in place succeeds (the storage contract's equal-bytes rule)."""
        path = self._path(key)
        for attempt in range(_DIR_RACE_RETRIES + 1):
            try:
                _makedirs(path.parent)
            except (FileExistsError, NotADirectoryError) as exc:
                raise StorageError(
                    f"cannot write {self._where(key)}: a parent of it is an object, not a "
                    "directory (the file backend cannot hold both 'a' and 'a/b')"
                ) from exc
            try:
                tmp = write_temp(path.parent, path.name, fill)
                break
            except FileNotFoundError:
                # A concurrent delete_many removed the directory we just created.
                if attempt == _DIR_RACE_RETRIES:
                    raise
        try:
            if path.is_dir():
                raise StorageError(
                    f"cannot write {self._where(key)}: it is a directory of other objects"
                )
            if create_only:
                try:
                    os.link(tmp, path)
                except FileExistsError as exc:
                    if same is not None and self._stored(path) == same:
                        return
                    raise ObjectAlreadyExistsError(
                        f"{self._where(key)} already exists; a create-only write never "
                        "replaces an object"
                    ) from exc
                except OSError as exc:
                    if exc.errno in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                        raise StorageError(
                            f"cannot create {self._where(key)} exclusively: the filesystem "
                            f"at {self.root} does not support hard links ({exc}); use a "
                            "local filesystem or S3"
                        ) from exc
                    raise
            else:
                with _locked(path.parent):
                    if if_match is not None:
                        current = self._stored(path)
                        if current is not None and current == same:
                            return  # our own bytes: the write is done
                        if current is None or etag_of(current) != if_match:
                            raise PreconditionFailedError(
                                f"{self._where(key)} is not the version {if_match} this "
                                "write was conditioned on (another writer replaced or "
                                "deleted it); nothing was written")
                    os.replace(tmp, path)
            fsync_dir(path.parent)
        finally:
            tmp.unlink(missing_ok=True)

    @staticmethod
    def _stored(path: Path) -> bytes | None:
        try:
            return path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    # ------------------------------------------------------------------ writes

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False,
                  if_match: str | None = None) -> str:
        """Write ``data`` at ``key``; durable (file and directory fsynced) on return.
        Conditions and the returned ETag as in the interface; ``if_match`` compares and
        renames under a ``flock`` of the object's directory."""
        def fill(fh: BinaryIO) -> None:
            fh.write(data)

        with self._errors("write", key):
            self._publish(key, fill, create_only=create_only, if_match=if_match, same=data)
        return etag_of(data)

    def upload_file(self, path: Path, key: str) -> None:
        """Copy the local file ``path`` to ``key``; durable on return.

        A missing or unreadable source raises ``OSError`` (it is not a storage error).
        """
        with open(path, "rb") as src, self._errors("write", key):
            self._publish(
                key, lambda fh: shutil.copyfileobj(src, fh, _COPY_BUFFER), create_only=False
            )

    def upload_file_hashed(self, path: Path, key: str) -> str:
        """:meth:`upload_file`, hashing the bytes as they are copied (one read)."""
        with open(path, "rb") as src, self._errors("write", key):
            body = HashingReader(src)

            def fill(fh: BinaryIO) -> None:
                body.seek(0)  # a retried copy starts (and hashes) afresh
                shutil.copyfileobj(body, fh, _COPY_BUFFER)

            self._publish(key, fill, create_only=False)
            return body.hexdigest()

    def _open_object(self, key: str, action: str) -> BinaryIO:
        """Open a stored object for reading; ``ObjectNotFoundError`` if there is none."""
        try:
            return open(self._path(key), "rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise ObjectNotFoundError(
                f"cannot {action} {self._where(key)}: no such object"
            ) from exc

    @contextmanager
    def open_stream(self, key: str, start: int = 0,
                    length: int | None = None) -> Iterator[BinaryIO]:
        """The stored file, opened for reading at ``start`` (``ObjectNotFoundError`` if
        absent); ``length`` needs no enforcing: the caller reads what it needs."""
        with self._errors("download", key):
            fh = self._open_object(key, "download")
            with fh:
                fh.seek(start)
                yield fh

    def copy(self, src_key: str, dst_key: str) -> None:
        """Copy ``src_key`` to ``dst_key`` (replacing it); durable on return."""
        with self._errors("copy", src_key):
            fh_src = self._open_object(src_key, "copy")
            with fh_src:
                self._publish(
                    dst_key,
                    lambda fh: shutil.copyfileobj(fh_src, fh, _COPY_BUFFER),
                    create_only=False,
                )

    def delete_many(self, keys: Iterable[str]) -> None:
        """Delete ``keys`` (absent ones are ignored) and the directories they leave empty.

        Durable on return: every affected directory is fsynced. One at a time, in the
        order given; an invalid key raises before any is deleted.
        """
        paths = [(key, self._path(key)) for key in keys]
        touched: set[Path] = set()
        for key, path in paths:
            with self._errors("delete", key):
                try:
                    path.unlink()
                except (FileNotFoundError, NotADirectoryError):
                    continue
                except IsADirectoryError:
                    continue  # a "directory" is not an object; S3 would ignore it too
                touched.add(path.parent)
        # Remove emptied directories, deepest first, never the root itself.
        for directory in sorted(touched, key=lambda p: len(p.parts), reverse=True):
            current = directory
            while current != self.root and self.root in current.parents:
                try:
                    current.rmdir()
                except OSError:  # not empty (or already gone / recreated): stop here
                    break
                current = current.parent
            with self._errors("delete", self._key(directory)):
                if current.is_dir():
                    fsync_dir(current)

    # ------------------------------------------------------------------ reads

    def get_bytes(self, key: str) -> bytes:
        """Read the whole object; ``ObjectNotFoundError`` if absent."""
        path = self._path(key)
        with self._errors("read", key):
            try:
                return path.read_bytes()
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
                raise ObjectNotFoundError(
                    f"cannot read {self._where(key)}: no such object"
                ) from exc

    def exists(self, key: str) -> bool:
        """Whether an object (a regular file) is stored at exactly ``key``."""
        path = self._path(key)
        with self._errors("check", key):
            return path.is_file()

    def download_file(self, key: str, path: Path) -> None:
        """Copy ``key`` to the local ``path`` atomically (temp file, fsync, rename).

        Parents of ``path`` are created. Errors on the local side raise ``OSError``.
        """
        target = Path(path)
        with self._errors("read", key):
            fh_src = self._open_object(key, "download")
        with fh_src:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = write_temp(
                target.parent, target.name, lambda fh: shutil.copyfileobj(fh_src, fh, _COPY_BUFFER)
            )
            try:
                os.replace(tmp, target)
                fsync_dir(target.parent)
            finally:
                tmp.unlink(missing_ok=True)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix``, recursively, sorted by key.

        Temporary files of in-flight writes are never listed. A missing root lists as
        empty. A walk is not one snapshot: a file may vanish between its directory's
        read and its ``stat`` while a directory created meanwhile is never entered (a
        history compaction writing the first segment, then deleting the raw event it
        holds: a walk that skipped the vanished file saw neither). So a walk during
        which a file vanished is walked again (up to :data:`LIST_ATTEMPTS` times),
        as an S3 LIST would have shown the file as it was.
        """
        check_prefix(prefix)
        base_key = prefix.rpartition("/")[0]
        start = self.root.joinpath(*base_key.split("/")) if base_key else self.root
        with self._errors("list", prefix):
            for attempt in range(LIST_ATTEMPTS):
                if not start.is_dir():
                    return []
                out, vanished = self._walk(start, prefix)
                if not vanished or attempt == LIST_ATTEMPTS - 1:
                    break
        out.sort(key=lambda info: info.key)
        return out

    def _walk(self, start: Path, prefix: str) -> tuple[builtins.list[ObjectInfo], bool]:
        """One walk below ``start``: the objects under ``prefix``, and whether a file
        vanished while it was walked."""
        out: builtins.list[ObjectInfo] = []
        vanished = False
        for dirpath, dirnames, filenames in os.walk(start):
            here = Path(dirpath)
            rel = self._key(here) if here != self.root else ""
            base = rel + "/" if rel else ""
            # prune directories that cannot contain a matching key
            dirnames[:] = [
                d for d in dirnames
                if (base + d + "/").startswith(prefix) or prefix.startswith(base + d + "/")
            ]
            for name in filenames:
                key = base + name
                if is_temp_name(name) or not key.startswith(prefix):
                    continue
                try:
                    st = os.stat(here / name)
                except FileNotFoundError:  # deleted while we listed
                    vanished = True
                    continue
                out.append(ObjectInfo(key, st.st_size, st.st_mtime))
        return out, vanished

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        """Immediate sub-directories of ``prefix`` that hold at least one object.

        ``prefix`` is treated as a directory (``"a"`` means ``"a/"``). Directories that
        hold only temporary files are skipped, as S3 has no empty "directories".
        """
        directory_key = dir_prefix(prefix).rstrip("/")
        start = self.root.joinpath(*directory_key.split("/")) if directory_key else self.root
        with self._errors("list", prefix):
            if not start.is_dir():
                return []
            names = [
                entry.name
                for entry in os.scandir(start)
                if entry.is_dir() and self._holds_objects(Path(entry.path))
            ]
        return sorted(names)

    @staticmethod
    def _holds_objects(directory: Path) -> bool:
        for _dirpath, _dirnames, filenames in os.walk(directory):
            if any(not is_temp_name(name) for name in filenames):
                return True
        return False
