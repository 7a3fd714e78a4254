"""A real tracking server for the core tests: a throw-away PostgreSQL cluster (the distribution's
``initdb`` / ``pg_ctl``, run as the ``postgres`` user when the tests run as root) and ``mlflow server``
on it, as a team would run it (``docker/compose.yml``: PostgreSQL backend, proxied artifacts).

``postgres_cluster`` (session) is the cluster; ``tracking_server`` is the session's ``mlflow server`` over
its database ``mlflow``, started again when a test left it killed. :class:`MlflowServer` can be killed and
started again over the same database, at the same URL (the fault tests kill it mid-run). Without the
PostgreSQL binaries (``.ci/install_postgres.sh``) or psycopg2 (the dev extra) the tests that use them skip,
saying which is missing."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def postgres_bin() -> Path | None:
    """The newest /usr/lib/postgresql/<major>/bin holding initdb and pg_ctl (Debian's layout)."""
    dirs = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda d: int(Path(d).parent.name) if Path(d).parent.name.isdigit() else 0,
    )
    for d in reversed(dirs):
        if all(os.access(Path(d) / b, os.X_OK) for b in ("initdb", "pg_ctl", "createdb")):
            return Path(d)
    return None


class PostgresCluster:
    """A cluster in a temporary folder, listening on 127.0.0.1:<free port> (trust auth, no fsync)."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="pg-mlflow-"))  # not under pytest's 0700 root-owned tree
        self.data, self.port, self.user = self.root / "data", free_port(), "postgres"
        self.as_user: list[str] = []
        if os.geteuid() == 0:  # initdb refuses root: run the cluster as `postgres`
            if shutil.which("runuser") is None:
                raise RuntimeError("running as root and runuser is missing")
            shutil.chown(self.root, user="postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]

    def _run(self, *cmd: str) -> None:
        res = subprocess.run([*self.as_user, *cmd], capture_output=True, text=True, timeout=120, check=False)
        if res.returncode != 0:
            raise RuntimeError(
                f"{Path(cmd[0]).name} failed ({res.returncode}): {' '.join((res.stderr or res.stdout).split())[:300]}"
            )

    def start(self) -> None:
        self._run(
            str(self.bindir / "initdb"), "-D", str(self.data), "-U", self.user, "-A", "trust", "-E", "UTF8", "--no-sync"
        )
        opts = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off -c full_page_writes=off"
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.root / "postgres.log"),
            "-w",
            "-t",
            "60",
            "-o",
            opts,
            "start",
        )

    def create_database(self, name: str) -> str:
        """Create database ``name``; returns its SQLAlchemy URI (mlflow's ``--backend-store-uri``; the driver named:
        SQLAlchemy 2.1 defaults ``postgresql://`` to psycopg 3)."""
        self._run(str(self.bindir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, name)
        return f"postgresql+psycopg2://{self.user}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            subprocess.run(
                [*self.as_user, str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"],
                capture_output=True,
                timeout=60,
                check=False,
            )
        shutil.rmtree(self.root, ignore_errors=True)


class MlflowServer:
    """``mlflow server`` over ``backend`` with proxied artifacts in ``artifacts``, on a fixed free port
    (a restart comes back at the same URL)."""

    def __init__(self, backend: str, artifacts: Path, log_dir: Path) -> None:
        self.backend, self.artifacts, self.log_dir = backend, artifacts, log_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self, timeout_s: float = 180) -> None:
        self.starts += 1
        log = (self.log_dir / f"mlflow_server_{self.port}_{self.starts}.log").open("w")
        # one worker: uvicorn's multi-worker supervisor kills slow-starting workers on a busy machine
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--backend-store-uri",
                self.backend,
                "--artifacts-destination",
                self.artifacts.as_uri(),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                "1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"mlflow server exited with {self.proc.returncode}: "
                    f"{' '.join(Path(log.name).read_text().split()[-40:])}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        self.kill()
        raise TimeoutError(f"mlflow server on {self.backend} not healthy after {timeout_s:.0f} s")

    def ensure_running(self) -> None:
        """Start it again if a test killed it (and failed before restarting it)."""
        if self.proc is None or self.proc.poll() is not None:
            self.start()

    def kill(self) -> None:
        """SIGKILL the server and its workers (its process group), as a crashed or lost server."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)
        self.proc = None


def _psycopg2_missing() -> str | None:
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return "psycopg2 is not installed (pip install -e '.[dev]')"
    return None


@pytest.fixture(scope="session")
def postgres_cluster():
    why = _psycopg2_missing()
    bindir = postgres_bin()
    if bindir is None:
        why = why or "no PostgreSQL server binaries in /usr/lib/postgresql/*/bin (run .ci/install_postgres.sh as root)"
    if why:
        pytest.skip(why)
    cluster = PostgresCluster(bindir)
    try:
        cluster.start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        cluster.stop()
        pytest.skip(f"cannot start a PostgreSQL cluster: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


def start_server(cluster: PostgresCluster, db: str, where: Path) -> MlflowServer:
    server = MlflowServer(cluster.create_database(db), where / f"artifacts_{db}", where)
    server.start()
    return server


@pytest.fixture(scope="session")
def _session_server(postgres_cluster, tmp_path_factory):
    server = start_server(postgres_cluster, "mlflow", tmp_path_factory.mktemp("mlflow_server"))
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def tracking_server(_session_server) -> MlflowServer:
    """The session's ``mlflow server`` on PostgreSQL database ``mlflow`` (URL: ``.url``), running when the
    test starts: a test may kill it and start it again (same port, same database)."""
    _session_server.ensure_running()
    return _session_server
