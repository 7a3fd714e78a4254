"""Runs that share a project's data/ folder (concurrent `kedro run`s, sweep points) stay apart:

- a run reads back its own version of every dataset it saves (Kedro loads the newest version on disk,
  which another run may have saved in between: "Save version A did not match load version B");
- no two processes of a project get the same session id, i.e. the same save version (session creation
  runs under a per-project file lock held past the millisecond the id is stamped with).

Both are on for every `kedro run` (core.hooks, settings.SESSION_CLASS); `kedro sweep` relies on them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SESSION_LOCK_ENV = "PIPELINES_SWEEP_SESSION_LOCK"


def pin_own_version(catalog: Any, name: str, load_versions: Mapping[str, str]) -> bool:
    """Pin ``name``'s load version to this run's save version (unless the run pinned it itself)."""
    from kedro.io.core import Version

    if catalog is None or name in load_versions:
        return False
    try:
        dataset = catalog.get(name)
    except Exception:  # noqa: BLE001 - an unknown or odd dataset is left as Kedro made it
        return False
    version = getattr(dataset, "_version", None)
    if not isinstance(version, Version) or not version.save or version.load:
        return False
    dataset._version = Version(version.save, version.save)
    clear = getattr(dataset, "_clear_version_cache", None)
    if callable(clear):
        clear()
    return True


def _session_lock_path(root: Path) -> Path:
    import hashlib
    import tempfile

    digest = hashlib.sha1(str(root.resolve()).encode(), usedforsecurity=False).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"pipelines-sessions-{digest}.lock"


def unique_session_class(base: type) -> type:
    """``base`` (a KedroSession class) whose ``create`` runs under a per-project file lock held for more
    than a millisecond, so no two processes of the project get the same session id / save version."""
    if getattr(base, "one_session_per_millisecond", False):
        return base  # already guarded: a second lock on the same file in one process would deadlock

    class OneSessionPerMillisecond(base):  # type: ignore[misc, valid-type]
        """KedroSession whose id (the save version) no other process of this project shares (guard 2)."""

        one_session_per_millisecond = True

        @classmethod
        def create(cls, *args: Any, **kwargs: Any):
            import fcntl

            path = os.environ.get(SESSION_LOCK_ENV) or str(_session_lock_path(Path.cwd()))
            try:
                fh = open(path, "a")  # noqa: SIM115 - closed below
            except OSError:  # no writable temp dir (an odd worker): no lock, as a plain kedro run
                return super().create(*args, **kwargs)
            with fh:
                fcntl.flock(fh, fcntl.LOCK_EX)
                try:
                    session = super().create(*args, **kwargs)
                    time.sleep(0.003)  # the next process to take the lock sees a later millisecond
                finally:
                    fcntl.flock(fh, fcntl.LOCK_UN)
            return session

    return OneSessionPerMillisecond
