"""One writer per output directory: an exclusive lock file held with ``flock``.

Every command that writes into an ``--out`` directory (``trace``, ``simulate``,
the ``theory`` commands, ``steer vector``, ``steer eval``) and the library's
:class:`tokenfield.runs.RunWriter` take the lock before touching anything in
the directory. The lock is the file ``OUT/.tokenfield.lock`` held with
``fcntl.flock(LOCK_EX | LOCK_NB)``; the operating system releases it when the
process ends, however it ends (a crash or ``kill -9`` leaves no stale lock).
A second writer fails at once with :class:`~tokenfield.errors.UserError`
naming the holder's pid. Readers never take it.

The lock file is opened with ``O_NOFOLLOW``, and anything at its name that is not
a regular file with one link (a symlink, a hard link to another file, a FIFO, a
device) is refused with one line and left untouched: the lock truncates its
file and writes a pid into it, which must never reach a file outside the run.

The lock file is not part of a run: it is removed on release, a directory
holding only the lock file counts as empty, and ``--overwrite`` never deletes
it. A lock that created its directory removes the directory again on release
when nothing was written there (a command that fails leaves no empty
directory behind to block the retry).

Within one process the lock is re-entrant (a command that holds it can create
a :class:`~tokenfield.runs.RunWriter` on the same directory).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from tokenfield._io import make_dirs
from tokenfield.errors import UserError

__all__ = ["LOCK_NAME", "WriterLock", "acquire", "release_all", "writer_lock"]

LOCK_NAME = ".tokenfield.lock"

_HELD: dict[Path, WriterLock] = {}


class WriterLock:
    """An acquired lock on one directory (see the module docstring)."""

    def __init__(self, directory: Path, fd: int, created_dir: bool):
        self.directory = directory
        self.fd = fd
        self.created_dir = created_dir
        self.count = 1

    @property
    def path(self) -> Path:
        return self.directory / LOCK_NAME

    def release(self) -> None:
        """Drop one hold; the last one unlocks (and tidies a directory it made)."""
        self.count -= 1
        if self.count > 0:
            return
        _HELD.pop(self.directory, None)
        # Unlink while still locked: a process that opened the file meanwhile finds,
        # once it gets the lock, that the path no longer names its inode, and
        # starts again (see acquire), so no two processes ever hold live locks.
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            if self.created_dir and not any(self.directory.iterdir()):
                os.rmdir(self.directory)
        os.close(self.fd)


def _key(directory: str | Path) -> Path:
    return Path(os.path.realpath(Path(directory).expanduser()))


def _holder(path: Path, wait: float = 1.0) -> str:
    """Who holds the lock: its pid, which the holder writes just after it locks
    (so an empty file is waited on for up to ``wait`` seconds)."""
    deadline = time.monotonic() + wait
    while True:
        with contextlib.suppress(OSError, ValueError):
            text = path.read_text().strip()
            if text:
                return f"process {int(text)}"
        if time.monotonic() >= deadline:
            return "another process"
        time.sleep(0.01)


def _foreign(mode: int, links: int) -> str | None:
    """Why a file at the lock's name is not one tokenfield made (None if it may be)."""
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if not stat.S_ISREG(mode):
        return "not a regular file"
    if links > 1:  # a hard link: truncating it would clobber the other name's file
        return f"a regular file with {links} hard links"
    return None


def _refuse(path: Path, shown: str, why: str) -> None:
    raise UserError(
        f"the lock file '{Path(shown) / LOCK_NAME}' is {why}, not tokenfield's lock "
        "(it was left untouched)",
        f"remove '{Path(shown) / LOCK_NAME}' (tokenfield creates its own), then run again",
    )


def _refuse_foreign(path: Path, shown: str) -> None:
    """Refuse a symlink, a device, a FIFO, a directory or a hard link at the lock's
    name before opening it."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError:
        return  # the open below reports it
    why = _foreign(info.st_mode, info.st_nlink)
    if why:
        _refuse(path, shown, why)


def _refuse_foreign_fd(fd: int, path: Path, shown: str) -> None:
    """The same check on what was opened (the name may have changed in between)."""
    info = os.fstat(fd)
    why = _foreign(info.st_mode, info.st_nlink)
    if why:
        _refuse(path, shown, why)


def acquire(directory: str | Path, *, what: str = "output directory") -> WriterLock:
    """Take the writer lock on ``directory`` (created if missing).

    Raises:
        UserError: another process holds it (the message names its pid), or the
            directory cannot be created or written.
    """
    shown = str(directory)  # as the user wrote it, for messages
    directory = _key(directory)
    held = _HELD.get(directory)
    if held is not None:
        held.count += 1
        return held
    if directory.exists() and not directory.is_dir():
        raise UserError(f"output path '{shown}' is a file", "choose a directory for --out")
    created = not directory.exists()
    _make_dir(directory, shown)
    path = directory / LOCK_NAME
    while True:
        _refuse_foreign(path, shown)
        try:
            # O_NOFOLLOW: a symlink planted at the lock's name is never followed (the
            # lock is truncated and written, which would clobber its target).
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except FileNotFoundError:
            # A holder that had created the directory removed it on release
            # between our mkdir and this open: make it again and retry.
            _make_dir(directory, shown)
            created = True
            continue
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a symlink appeared after the check above
                _refuse_foreign(path, shown)
            if created:
                with contextlib.suppress(OSError):
                    directory.rmdir()
            raise UserError(
                f"cannot write in {what} '{shown}' ({exc.strerror})", "choose another --out"
            ) from None
        try:
            _refuse_foreign_fd(fd, path, shown)
        except UserError:
            os.close(fd)
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise UserError(
                f"{what} '{shown}' is being written by {_holder(path)}",
                "wait for it to finish, or choose another --out",
            ) from None
        # The holder before us may have unlinked the file while we waited to lock
        # it: then our lock is on a dead inode; start again on the live path.
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    lock = WriterLock(directory, fd, created)
    _HELD[directory] = lock
    return lock


@contextlib.contextmanager
def writer_lock(directory: str | Path, *, what: str = "output directory") -> Iterator[WriterLock]:
    """``with writer_lock(out): ...``: hold the lock for the block."""
    lock = acquire(directory, what=what)
    try:
        yield lock
    finally:
        lock.release()


def _make_dir(directory: Path, shown: str) -> None:
    make_dirs(directory, f"output directory '{shown}'", "choose another --out")


def release_all() -> None:
    """Release every lock this process holds (the CLI calls it when a command ends)."""
    for lock in list(_HELD.values()):
        lock.count = 1
        lock.release()


def is_lock_file(path: str | Path) -> bool:
    return Path(path).name == LOCK_NAME


def hold_for_command(directory: str | Path, *, what: str = "output directory") -> WriterLock:
    """Take the lock for the rest of a CLI command; :func:`tokenfield.cli.main`
    releases it (:func:`release_all`) when the command ends, however it ends."""
    return acquire(directory, what=what)
