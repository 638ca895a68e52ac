"""Optuna storage chosen by URL, and recovery of trials whose worker died.

URLs:

- ``memory`` (or ``:memory:``): in-process only; for tests and one-worker throwaway studies.
- ``journal`` / ``None``: the journal file ``study.journal`` in the run folder (default).
- ``journal:PATH`` or a path ending in ``.journal``: that journal file.
- ``sqlite:///PATH``, ``postgresql://...``, ``mysql://...``: :class:`optuna.storages.RDBStorage`
  with a heartbeat, so a trial whose worker died is failed and retried by the next worker.

Every trial records ``worker = "host:pid"`` when it is claimed, and :func:`recover` (called when
a study is prepared or resumed, when a worker opens it, after each trial and while a worker waits
for the last running trials) fails and re-queues RUNNING trials whose worker is gone: a dead
process on this host at once (any storage), and on an RDB storage any trial whose heartbeat
stopped (after ``HEARTBEAT_GRACE_S``). The journal backend of the installed Optuna has no
heartbeat, so a journal trial of a dead worker on *another* host is not recovered. The retry is a
WAITING copy with the trial's parameters and slot. Finished trials are never touched: a killed
worker loses only the trial it was running.

A journal file cut short mid-line (a crash during a write) is repaired before it is read or
appended to: the partial last line is dropped (one-line :class:`StorageWarning`); a complete line
that is not a record is salvaged (a record that was appended to a partial line) or refused in
one line. The journal's lock (:class:`tuning.locks.JournalLock`) names its holder: a worker
killed while it holds it (milliseconds per write) has its lock broken by the next process that
needs it, at once; a lock whose holder cannot be checked (another host, or Optuna's own tools) is
broken after ``LOCK_GRACE_S`` unchanged.

Every slot of a study is queued under the study's lock (:func:`tuning.locks.study_lock`): the
study's creation and its first slots (:func:`tuning.study.prepare_study`), and the retry of a
failed trial (:func:`requeue`), which is skipped when its slot already holds a live trial. So no
slot is ever queued twice, and no duplicate claim has to be failed.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import warnings
from pathlib import Path

import optuna
from optuna.trial import TrialState

from control.errors import ConfigError
from tuning.locks import JournalLock, pid_alive, study_lock

JOURNAL_NAME = "study.journal"
RDB_SCHEMES = ("sqlite", "postgresql", "postgres", "mysql")
HEARTBEAT_INTERVAL_S = 5  # seconds between heartbeats of a running RDB trial
HEARTBEAT_GRACE_S = 20  # a trial silent this long is stale: failed and retried
# a journal lock whose holder cannot be checked (another host) is broken after this long
# unchanged; one held by a dead process of this host is broken at once.
LOCK_GRACE_S = 10
MAX_RETRY = 3  # retries of one trial before it is left failed
# A RUNNING trial never tagged with its worker is dead after this: a worker tags its claim in
# the next storage call (ms; seconds on a loaded machine), so only a worker killed between the
# two leaves one. 30 s: far beyond a live worker's gap, and a resume after such a kill waits
# that long, so it must stay well inside the 120 s that tests/tuning/test_faults.py gives a CLI
# resume after a kill on a loaded machine.
UNTAGGED_STALE_S = 30
RDB_OPEN_ATTEMPTS = 4  # opening a new database races its schema creation: retried


def resolve_url(url: str | None, run_dir: str | Path | None) -> str:
    """Canonical storage URL: ``memory``, ``journal:<abs path>`` or an RDB URL."""
    if url is None or url == "journal":
        if run_dir is None:
            raise ConfigError("storage 'journal' needs a run folder (--out)")
        return "journal:" + str((Path(run_dir) / JOURNAL_NAME).resolve())
    if url in ("memory", ":memory:", "inmemory"):
        return "memory"
    if url.startswith("journal:"):
        path = url[len("journal:") :]
        path = path.removeprefix("//")
        if not path:
            raise ConfigError(f"storage '{url}': journal URL needs a file path")
        return "journal:" + str(Path(path).resolve())
    scheme = url.split(":", 1)[0].split("+", 1)[0].lower()
    if "://" in url:
        if scheme not in RDB_SCHEMES:
            raise ConfigError(
                f"storage '{url}': unknown scheme '{scheme}'; allowed: memory, "
                "journal:PATH, a .journal path, " + ", ".join(RDB_SCHEMES)
            )
        return url
    if url.endswith(".journal"):
        return "journal:" + str(Path(url).resolve())
    raise ConfigError(
        f"storage '{url}' is not understood; allowed: memory, journal, "
        "journal:PATH, PATH.journal, sqlite:///PATH, postgresql://USER@HOST/DB"
    )


def is_journal(url: str) -> bool:
    return url.startswith("journal:")


def shareable(url: str) -> bool:
    """Whether several processes can use the storage (everything but ``memory``)."""
    return url != "memory"


def make_storage(url: str) -> optuna.storages.BaseStorage:
    """The Optuna storage for a URL from :func:`resolve_url`."""
    if url == "memory":
        return optuna.storages.InMemoryStorage()
    if is_journal(url):
        from optuna.storages.journal import JournalStorage

        path = url[len("journal:") :]
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        lock = JournalLock(path, grace_s=LOCK_GRACE_S)
        repair_journal(path, lock)
        return JournalStorage(_journal_backend()(path, lock_obj=lock))
    url = _with_driver(url)
    for attempt in range(RDB_OPEN_ATTEMPTS):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(
                    url,
                    heartbeat_interval=HEARTBEAT_INTERVAL_S,
                    grace_period=HEARTBEAT_GRACE_S,
                    heartbeat_stale_trial_callback=requeue_stale,
                    engine_kwargs={"pool_pre_ping": True} if not url.startswith("sqlite") else None,
                )
        except ImportError as e:
            raise ConfigError(
                f"storage '{_redact(url)}' needs a driver: {e} (pip install 'dspark-lab[postgres]')"
            ) from None
        except Exception as e:  # sqlalchemy errors vary: one line, no password
            # two processes creating the schema of a new database at once: one loses the race
            # (a unique violation) and finds the tables there on the next try
            racing = any(
                w in str(e).lower()
                for w in ("already exists", "duplicate key", "unique constraint")
            )
            if racing and attempt + 1 < RDB_OPEN_ATTEMPTS:
                import time

                time.sleep(0.2 * (attempt + 1))
                continue
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(f"storage '{_redact(url)}' cannot be opened: {first}") from None
    raise AssertionError("unreachable")  # pragma: no cover


def _with_driver(url: str) -> str:
    """``postgresql://`` with the installed driver: SQLAlchemy 2.1 defaults to psycopg 3, the
    ``postgres`` extra installs psycopg2-binary; ``postgres://`` is an alias."""
    import importlib.util

    scheme, _, rest = url.partition("://")
    if scheme in ("postgresql", "postgres"):
        if importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2"):
            return f"postgresql+psycopg2://{rest}"
        return f"postgresql://{rest}"
    return url


def _redact(url: str) -> str:
    """The URL without a password."""
    if "://" in url and "@" in url:
        scheme, rest = url.split("://", 1)
        cred, host = rest.rsplit("@", 1)
        user = cred.split(":", 1)[0]
        return f"{scheme}://{user}@{host}"
    return url


def redact(url: str) -> str:
    return _redact(url)


# ---- journal: a file cut short by a crash ------------------------------------------------


class StorageWarning(UserWarning):
    """A storage repaired on open (printed by ``dspark`` as one line)."""


_RECORD_START = b'{"op_code"'


def _salvage(line: bytes) -> bytes | None:
    """The record at the end of a line that a record was appended to after a partial write
    (``<partial>{"op_code":...}``), or None."""
    at = line.rfind(_RECORD_START)
    while at > 0:
        try:
            json.loads(line[at:])
            return line[at:]
        except ValueError:
            at = line.rfind(_RECORD_START, 0, at)
    return None


def _cut_partial_tail(path: str) -> int:
    """Drop bytes after the last newline (a write cut short); returns how many. Call with the
    journal's lock held."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return 0
    if size == 0:
        return 0
    with open(path, "rb+") as fh:
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return 0
        keep, chunk = size, 1 << 16
        while keep > 0:  # find the last newline from the end
            start = max(0, keep - chunk)
            fh.seek(start)
            block = fh.read(keep - start)
            nl = block.rfind(b"\n")
            if nl >= 0:
                keep = start + nl + 1
                break
            keep = start
        fh.truncate(keep)
        fh.flush()
        os.fsync(fh.fileno())
    return size - keep


def repair_journal(path: str, lock: object = None) -> list[str]:
    """Make a journal file readable after a crash (under its lock): drop a partial last line,
    salvage a record appended to an earlier partial line; a line that is no record and cannot be
    salvaged is a one-line ConfigError. Returns the notices (each also a StorageWarning)."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return []
    if lock is None:
        lock = JournalLock(path, grace_s=LOCK_GRACE_S)
    notices = []
    lock.acquire()
    try:
        cut = _cut_partial_tail(path)
        if cut:
            notices.append(
                f"{path}: dropped a partial last line ({cut} bytes, a write cut short "
                "by a crash); every complete record is kept"
            )
        with open(path, "rb") as fh:
            lines = fh.read().split(b"\n")[:-1]
        fixed, changed = [], []
        for i, line in enumerate(lines):
            try:
                json.loads(line)
                fixed.append(line)
                continue
            except ValueError:
                pass
            rec = _salvage(line)
            if rec is None:
                raise ConfigError(
                    f"{path}: line {i + 1} is not a journal record and cannot be "
                    "repaired; restore the file or start a new --out"
                )
            fixed.append(rec)
            changed.append(i + 1)
        if changed:
            tmp = f"{path}.repair"
            with open(tmp, "wb") as fh:
                fh.write(b"".join(x + b"\n" for x in fixed))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
            notices.append(
                f"{path}: line(s) {', '.join(map(str, changed))} held a record "
                "appended to a partial line; the partial part was dropped"
            )
    finally:
        lock.release()
    for n in notices:
        warnings.warn(n, StorageWarning, stacklevel=2)
    return notices


def _journal_backend() -> type:
    """Optuna's journal file backend, dropping a partial last line (a writer that crashed
    mid-write) under the lock before it appends, so a crash never makes the file unreadable."""
    from optuna.storages.journal import JournalFileBackend

    class RepairingJournalFileBackend(JournalFileBackend):
        def append_logs(self, logs: list[dict]) -> None:
            text = "\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\n"
            self._lock.acquire()
            try:
                cut = _cut_partial_tail(self._file_path)
                if cut:
                    warnings.warn(
                        f"{self._file_path}: dropped a partial last line ({cut} bytes, "
                        "a write cut short by a crash)",
                        StorageWarning,
                        stacklevel=2,
                    )
                with open(self._file_path, "ab") as fh:
                    fh.write(text.encode("utf-8"))
                    fh.flush()
                    os.fsync(fh.fileno())
            finally:
                self._lock.release()

    return RepairingJournalFileBackend


# ---- trials of dead workers ----------------------------------------------------------------


def worker_tag() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


_pid_alive = pid_alive

LIVE = (TrialState.WAITING, TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED)


def slot_is_live(study: optuna.Study, slot: object) -> bool:
    """Whether a WAITING, RUNNING or finished trial holds ``slot``."""
    return any(
        t.user_attrs.get("slot") == slot for t in study.get_trials(deepcopy=False, states=LIVE)
    )


def requeue(study: optuna.Study, t: optuna.trial.FrozenTrial) -> bool:
    """Queue a WAITING copy of failed trial ``t`` (its parameters, slot and user attributes but
    not its worker) unless it was retried ``MAX_RETRY`` times already, or its slot already holds
    a live trial (a command that resumed the study queued it meanwhile). Under the study's lock,
    so the check and the queueing are one step."""
    retry_of = list(t.system_attrs.get("retry_history", [])) + [t.number]
    if len(retry_of) > MAX_RETRY:
        return False
    with study_lock(study._storage, study.study_name):
        if "slot" in t.user_attrs and slot_is_live(study, t.user_attrs["slot"]):
            return False
        study.add_trial(
            optuna.trial.create_trial(
                state=TrialState.WAITING,
                params=t.params,
                distributions=t.distributions,
                user_attrs={k: v for k, v in t.user_attrs.items() if k != "worker"},
                system_attrs={"failed_trial": retry_of[0], "retry_history": retry_of},
            )
        )
    return True


def requeue_stale(study: optuna.Study, t: optuna.trial.FrozenTrial) -> None:
    """RDB heartbeat callback: a trial whose heartbeat stopped was failed; queue its retry."""
    requeue(study, t)


def recover(study: optuna.Study) -> list[int]:
    """Fail and re-queue every RUNNING trial whose worker is known dead: on this host by its
    process id (any storage), elsewhere by a stopped heartbeat (RDB storages). Returns the
    numbers of the trials failed here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    return recover_dead_trials(study)


def recover_dead_trials(study: optuna.Study) -> list[int]:
    """Fail and re-queue RUNNING trials whose worker process (on this host) is gone.

    The retry is a WAITING copy with the same parameters and user attributes (so it fills the
    same slot of the study). Returns the numbers of the trials recovered. Two workers racing
    on the same dead trial are safe: only the one whose FAIL is accepted re-queues it.
    """
    host = socket.gethostname()
    recovered = []
    now = datetime.datetime.now()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        tag = t.user_attrs.get("worker", "")
        h, _, pid = tag.rpartition(":")
        if not tag:  # killed between the claim and the tag (ms): dead once it is old
            started = t.datetime_start or now
            if (now - started).total_seconds() < UNTAGGED_STALE_S:
                continue
        elif h != host or not pid.isdigit() or _pid_alive(int(pid)):
            continue
        try:
            ok = study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
        except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError):
            continue
        if ok is False:
            continue
        requeue(study, t)
        recovered.append(t.number)
    return recovered


def alive_elsewhere(study: optuna.Study, heartbeat: bool) -> list[int]:
    """Numbers of RUNNING trials that may still finish or be recovered later: those of a live
    process on this host, those not yet tagged with a worker, and with a heartbeat (RDB) those
    of other hosts (a dead one's trial is failed by its heartbeat and re-queued)."""
    host = socket.gethostname()
    now = datetime.datetime.now()
    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        h, _, pid = t.user_attrs.get("worker", "").rpartition(":")
        if heartbeat and h and h != host:  # its heartbeat fails it if its worker died
            out.append(t.number)
        elif not h:
            if (now - (t.datetime_start or now)).total_seconds() < UNTAGGED_STALE_S:
                out.append(t.number)
        elif h == host and pid.isdigit() and _pid_alive(int(pid)):
            out.append(t.number)
    return out
