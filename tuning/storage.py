"""Optuna storage chosen by URL, and recovery of trials whose worker died.

URLs:

- ``memory`` (or ``:memory:``): in-process only; for tests and one-worker throwaway studies.
- ``journal`` / ``None``: the journal file ``study.journal`` in the run folder (default).
- ``journal:PATH`` or a path ending in ``.journal``: that journal file.
- ``sqlite:///PATH``, ``postgresql://...``, ``mysql://...``: :class:`optuna.storages.RDBStorage`
  with a heartbeat, so a trial whose worker died is failed and retried by the next worker.

The journal backend of the installed Optuna has no heartbeat, so journal studies record
``worker = "host:pid"`` on each trial and :func:`recover_dead_trials` fails and re-queues the
RUNNING trials of a dead process on this host (called whenever a worker opens the study).
Finished trials are never touched: a killed worker loses only the trial it was running.
"""

from __future__ import annotations

import datetime
import os
import socket
from pathlib import Path

import optuna
from optuna.trial import TrialState

from control.errors import ConfigError

JOURNAL_NAME = "study.journal"
RDB_SCHEMES = ("sqlite", "postgresql", "postgres", "mysql")
HEARTBEAT_INTERVAL_S = 5      # seconds between heartbeats of a running RDB trial
HEARTBEAT_GRACE_S = 20        # a trial silent this long is stale: failed and retried
LOCK_GRACE_S = 10             # a journal lock held this long by a dead process is broken
MAX_RETRY = 3                 # retries of one trial before it is left failed
UNTAGGED_STALE_S = 120        # a RUNNING trial never tagged with its worker is dead after this


def resolve_url(url: str | None, run_dir: str | Path | None) -> str:
    """Canonical storage URL: ``memory``, ``journal:<abs path>`` or an RDB URL."""
    if url is None or url == "journal":
        if run_dir is None:
            raise ConfigError("storage 'journal' needs a run folder (--out)")
        return "journal:" + str((Path(run_dir) / JOURNAL_NAME).resolve())
    if url in ("memory", ":memory:", "inmemory"):
        return "memory"
    if url.startswith("journal:"):
        path = url[len("journal:"):]
        path = path.removeprefix("//")
        if not path:
            raise ConfigError(f"storage '{url}': journal URL needs a file path")
        return "journal:" + str(Path(path).resolve())
    scheme = url.split(":", 1)[0].split("+", 1)[0].lower()
    if "://" in url:
        if scheme not in RDB_SCHEMES:
            raise ConfigError(f"storage '{url}': unknown scheme '{scheme}'; allowed: memory, "
                              "journal:PATH, a .journal path, " + ", ".join(RDB_SCHEMES))
        return url
    if url.endswith(".journal"):
        return "journal:" + str(Path(url).resolve())
    raise ConfigError(f"storage '{url}' is not understood; allowed: memory, journal, "
                      "journal:PATH, PATH.journal, sqlite:///PATH, postgresql://USER@HOST/DB")


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
        from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock, JournalStorage
        path = url[len("journal:"):]
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        lock = JournalFileOpenLock(path, grace_period=LOCK_GRACE_S)
        return JournalStorage(JournalFileBackend(path, lock_obj=lock))
    import warnings
    url = _with_driver(url)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY)
            return optuna.storages.RDBStorage(
                url, heartbeat_interval=HEARTBEAT_INTERVAL_S, grace_period=HEARTBEAT_GRACE_S,
                heartbeat_stale_trial_callback=retry,
                engine_kwargs={"pool_pre_ping": True} if not url.startswith("sqlite") else None)
    except ImportError as e:
        raise ConfigError(f"storage '{_redact(url)}' needs a driver: {e} (pip install "
                          "'dspark-lab[postgres]')") from None
    except Exception as e:  # noqa: BLE001 - sqlalchemy errors vary: one line, no password
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"storage '{_redact(url)}' cannot be opened: {first}") from None


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


# ---- journal: trials of dead workers -----------------------------------------------------

def worker_tag() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (killed, not yet reaped) is dead for our purpose
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


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
        if not tag:   # killed between the claim and the tag (ms): dead once it is old
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
        retry_of = list(t.system_attrs.get("retry_history", [])) + [t.number]
        if len(retry_of) > MAX_RETRY:
            continue
        study.add_trial(optuna.trial.create_trial(
            state=TrialState.WAITING, params=t.params, distributions=t.distributions,
            user_attrs={k: v for k, v in t.user_attrs.items() if k != "worker"},
            system_attrs={"failed_trial": retry_of[0], "retry_history": retry_of}))
        recovered.append(t.number)
    return recovered
