"""A real PostgreSQL server for the tests that keep a sweep's study in one: Debian's `postgresql`
package, a cluster made with initdb in a temporary directory, listening on 127.0.0.1 at a free
port with password authentication, and stopped at the end.

initdb and the server refuse to run as root: as root they run as the package's `postgres` user.
`.ci/run` installs the package and sets REQUIRE_POSTGRES=1, which turns a missing server from a
skip into a failure.
"""

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

USER, PASSWORD, DATABASE = "sweeper", "s3cret", "sweeps"
COMMAND_TIMEOUT = 60  # each command answers in seconds; a hang fails instead


def _bin_dir() -> Path | None:
    found = next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))), None) or shutil.which("initdb")
    return Path(found).resolve().parent if found else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Postgres:
    """One cluster: ``url`` reaches its database ``sweeps``; ``stop()`` and ``start()`` take the
    server away and bring it back, with its data."""

    def __init__(self, root: Path, bin_dir: Path) -> None:
        self.root, self.bin_dir, self.port = root, bin_dir, _free_port()
        self.running = False
        self.url = f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{self.port}/{DATABASE}"
        self._as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *command: str) -> None:
        done = subprocess.run(
            [*self._as_owner, *command], capture_output=True, text=True, timeout=COMMAND_TIMEOUT
        )
        log = self.root / "server.log"
        said = done.stdout + done.stderr + (log.read_text()[-2000:] if log.exists() else "")
        assert done.returncode == 0, f"{' '.join(command)}: {said}"

    def create(self) -> None:
        (self.root / "password").write_text(PASSWORD)
        self._run(
            str(self.bin_dir / "initdb"),
            *["-D", str(self.root / "data"), "-U", USER, f"--pwfile={self.root / 'password'}"],
            *["--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync"],
        )
        self.start()
        self._run(
            str(self.bin_dir / "psql"),
            *["-h", str(self.root), "-p", str(self.port), "-U", USER, "-d", "postgres"],
            *["-c", f"CREATE DATABASE {DATABASE}"],
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._pg_ctl("-l", str(self.root / "server.log"), "-o", options, "-w", "start")
        self.running = True

    def stop(self) -> None:
        self._pg_ctl("-m", "immediate", "-w", "stop")
        self.running = False

    def _pg_ctl(self, *words: str) -> None:
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.root / "data"), *words)


@contextlib.contextmanager
def postgres() -> Iterator[Postgres]:
    """A running server, or a skip (a failure under REQUIRE_POSTGRES=1) where there is none to run."""
    bin_dir = _bin_dir()
    if bin_dir is None or (os.geteuid() == 0 and shutil.which("runuser") is None):
        reason = "needs PostgreSQL's initdb and pg_ctl (Debian's postgresql package)"
        if os.environ.get("REQUIRE_POSTGRES") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    # In /tmp itself: pytest's own temporary directories are closed to the postgres user. Short,
    # for the server's Unix socket.
    root = Path(tempfile.mkdtemp(prefix="pg-"))
    root.chmod(0o700)
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    server = Postgres(root, bin_dir)
    try:
        server.create()
        yield server
    finally:
        if server.running:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
