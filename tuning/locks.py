"""Locks of a study's storage: the journal file's lock, and the per-study lock under which slots
are queued, so that creating a study and queueing its slots is atomic on every storage.

:class:`JournalLock` keeps the protocol of Optuna's ``JournalFileOpenLock`` (a ``.lock`` file
beside the journal created with ``O_EXCL``, removed on release; Optuna's own tools, e.g.
optuna-dashboard, exclude it and are excluded by it) and writes its holder ``host:pid:nonce``
into the file. A waiter breaks a lock whose holder is a dead process on this host at once (a
killed worker's lock costs the others milliseconds, not a grace period), and any other lock
(another host, or one written by Optuna's own tools) after ``grace_s`` seconds unchanged. It is
reentrant in the thread that holds it, so :func:`study_lock` can hold it across reads and the
appends of the storage itself.

:func:`study_lock` (``with study_lock(storage, name): ...``) is, per storage:

- journal: the journal's :class:`JournalLock`;
- PostgreSQL: a transaction-level advisory lock (``pg_advisory_xact_lock``) on a connection of
  its own; MySQL: ``GET_LOCK``; both end with their connection, so a killed holder frees them;
- SQLite: ``flock`` on ``<database>.dspark-lock`` (freed by the kernel when its holder dies);
- in-memory: a lock of this process.

Each is reentrant in the thread that holds it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from optuna.storages.journal._file import BaseJournalFileLock

LOCK_SUFFIX = ".lock"  # Optuna's LOCK_FILE_SUFFIX: its tools and this lock exclude each other
POLL_MAX_S = 0.05  # a waiter looks at the lock at least this often


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` (on this host) runs; a zombie (killed, not yet reaped) is dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def dead_holder(text: str) -> bool:
    """Whether a lock's holder ``host:pid:nonce`` is a process of this host that is gone."""
    host, _, rest = text.partition(":")
    pid = rest.partition(":")[0]
    return host == socket.gethostname() and pid.isdigit() and not pid_alive(int(pid))


class JournalLock(BaseJournalFileLock):
    """The lock of journal file ``filepath`` (see the module doc)."""

    def __init__(self, filepath: str, grace_s: float) -> None:
        self._lock_file = filepath + LOCK_SUFFIX
        self.grace_period = grace_s
        self._held: tuple[int, int, str] | None = None  # (pid, thread, token) of the holder
        self._depth = 0

    def _mine(self) -> bool:
        h = self._held
        return h is not None and h[0] == os.getpid() and h[1] == threading.get_ident()

    def acquire(self) -> bool:
        if self._mine():
            self._depth += 1
            return True
        token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"
        seen: tuple | None = None
        since = time.monotonic()
        pause = 0.001
        while True:
            try:
                fd = os.open(self._lock_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                state = self._holder()
                if state is None:  # released while we looked
                    continue
                if state != seen:
                    seen, since = state, time.monotonic()
                if dead_holder(state[2]) or time.monotonic() - since > self.grace_period:
                    self._break(state[0])
                    pause = 0.001
                    continue
                time.sleep(pause)
                pause = min(2 * pause, POLL_MAX_S)
                continue
            try:
                os.write(fd, token.encode())
            finally:
                os.close(fd)
            self._held, self._depth = (os.getpid(), threading.get_ident(), token), 1
            return True

    def release(self) -> None:
        if not self._mine():
            raise RuntimeError("Error: did not possess lock")
        self._depth -= 1
        if self._depth > 0:
            return
        token = self._held[2] if self._held else ""
        self._held = None
        state = self._holder()
        if state is None or state[2] != token:
            raise RuntimeError(f"{self._lock_file}: the lock was broken while held")
        gone = f"{self._lock_file}{uuid.uuid4().hex}.released"
        os.rename(self._lock_file, gone)
        os.unlink(gone)

    def _holder(self) -> tuple[int, int, str] | None:
        """(inode, mtime, holder text) of the lock file; None when there is none. A symlink
        (Optuna's JournalFileSymlinkLock) has no holder text."""
        try:
            st = os.lstat(self._lock_file)
            text = ""
            if not stat.S_ISLNK(st.st_mode):
                with open(self._lock_file, "rb") as fh:
                    text = fh.read(512).decode("utf-8", "replace")
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns, text

    def _break(self, inode: int) -> None:
        """Remove the lock file of inode ``inode``; one taken since (another inode) is put back."""
        moved = f"{self._lock_file}{uuid.uuid4().hex}.broken"
        try:
            os.rename(self._lock_file, moved)
        except FileNotFoundError:
            return
        try:
            if os.lstat(moved).st_ino != inode:
                with contextlib.suppress(OSError):
                    os.link(moved, self._lock_file)
        finally:
            os.unlink(moved)


class _Reentrant:
    """A lock made reentrant in the thread that holds it; ``enter`` gives the context manager
    that takes the underlying lock."""

    def __init__(self, enter: Callable[[], Any]) -> None:
        self._enter = enter
        self._local = threading.local()

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        if getattr(self._local, "depth", 0) and self._local.pid == os.getpid():
            self._local.depth += 1
            try:
                yield
            finally:
                self._local.depth -= 1
            return
        with self._enter():
            self._local.depth, self._local.pid = 1, os.getpid()
            try:
                yield
            finally:
                self._local.depth = 0


def _key(name: str) -> int:
    """A signed 64-bit key for an advisory lock on study ``name``."""
    return int.from_bytes(
        hashlib.sha256(f"dspark-study:{name}".encode()).digest()[:8], "big", signed=True
    )


def _rdb_lock(engine: Any, name: str) -> Callable[[], Any]:
    """The context manager factory of the per-study lock of an SQLAlchemy engine."""
    from sqlalchemy import text

    dialect = engine.dialect.name

    @contextlib.contextmanager
    def postgres() -> Iterator[None]:
        with engine.connect() as conn, conn.begin():
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _key(name)})
            yield

    @contextlib.contextmanager
    def mysql() -> Iterator[None]:
        with engine.connect() as conn:
            lock = f"dspark-study:{hashlib.sha256(name.encode()).hexdigest()[:40]}"
            conn.execute(text("SELECT GET_LOCK(:n, -1)"), {"n": lock})
            try:
                yield
            finally:
                conn.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": lock})

    @contextlib.contextmanager
    def sqlite() -> Iterator[None]:
        import fcntl

        fd = os.open(f"{engine.url.database}.dspark-lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor frees the flock

    if dialect == "postgresql":
        return postgres
    if dialect == "mysql":
        return mysql
    if dialect == "sqlite" and engine.url.database not in (None, "", ":memory:"):
        return sqlite
    return threading.Lock


def study_lock(storage: Any, name: str) -> contextlib.AbstractContextManager:
    """The per-study lock of ``storage`` (an Optuna storage, cached or not; see the module doc)."""
    from optuna.storages import JournalStorage, RDBStorage

    base = getattr(storage, "_backend", storage)
    if isinstance(storage, JournalStorage):
        base = storage
    locks = getattr(base, "_dspark_study_locks", None)
    if locks is None:
        locks = {}
        with contextlib.suppress(AttributeError):
            base._dspark_study_locks = locks
    if name not in locks:
        if isinstance(base, JournalStorage) and isinstance(
            getattr(base._backend, "_lock", None), JournalLock
        ):
            lock = base._backend._lock

            @contextlib.contextmanager
            def journal() -> Iterator[None]:
                lock.acquire()
                try:
                    yield
                finally:
                    lock.release()

            locks[name] = _Reentrant(journal)
        elif isinstance(base, RDBStorage):
            locks[name] = _Reentrant(_rdb_lock(base.engine, name))
        else:  # in-memory (one process), or a storage this lab did not make
            locks[name] = _Reentrant(threading.Lock)
    return locks[name].hold()


def claim_lock(storage: Any, name: str) -> contextlib.AbstractContextManager:
    """What a worker holds while it claims a queued trial: the study's lock on SQLite, whose
    transactions do not lock the row they read (two workers can both see a trial WAITING and
    both set it RUNNING), nothing elsewhere (PostgreSQL and MySQL claim under ``SELECT ... FOR
    UPDATE``, the journal under its own lock)."""
    from optuna.storages import RDBStorage

    base = getattr(storage, "_backend", storage)
    if isinstance(base, RDBStorage) and base.engine.dialect.name == "sqlite":
        return study_lock(storage, name)
    return contextlib.nullcontext()
