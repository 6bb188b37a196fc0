"""Warm starts: a server process imports the project once, then forks each command from that
state, so that a sweep's trial, a cross-validation fold or the sweep's read of fit's config starts
in a fraction of a second instead of importing torch and Lightning again (about 6 s on 2 cores).

A command started warm is what ``python -m <package> <args>`` would be: its own process, in a
session and process group of its own, with the caller's environment, working directory, stdout
and stderr (stdin: /dev/null); it gets SIGTERM when its server ends, and the server when its
caller ends, however they end. The server imports the template's code (``framework/``) and the
libraries, not the user's models and data modules, which each command imports: an edit to them
reaches the next trial, an edit to the template's code the next sweep. What the imports print
(a library's warning) is printed once, by the server, not by each command.

Why the fork is safe (docs/performance.md, "Warm trials"): the server only imports; it starts no
thread, initialises no CUDA and opens nothing a command uses (no database, no log file), and it
checks the first two before it serves, declining to otherwise. The only threads its imports leave
are OpenBLAS's idle workers, which OpenBLAS itself stops before a fork, as for a DataLoader's
forked workers. Linux only (other systems start every command cold: macOS does not fork safely
after its frameworks are loaded).
"""

import contextlib
import functools
import importlib
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from typing import Any

from ..runs.interrupts import end_with_parent

PACKAGE = __package__.partition(".")[0]  # __name__ is __main__ in the server
MESSAGE_BYTES = 4096  # a message of the server's; a request goes as a file, of any size
GONE_WAIT_S = 0.1  # how often a command whose server died is looked for, until it has ended
# The environment variables read as Python starts or as libraries load (hash seed, warnings,
# preloads, thread pools, torch's settings, the temporary folder, the rank Lightning reads at
# import): a command run with other values than its server's starts anew. Its module path is a
# new process's: the folder it runs in, then its PYTHONPATH's and the libraries' folders; where
# that path would find a module the server imported elsewhere, it starts anew too.
IMPORT_TIME = ("PYTHON", "LD_", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "GOMP_", "TORCH", "PYTORCH_")
IMPORT_TIME += ("TMPDIR", "RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK", "LANG", "LC_")


class WarmProcess:
    """A command forked by the warm server, waited on and signalled as a ``subprocess.Popen``."""

    def __init__(self, server: "WarmServer", pid: int, args: list[str]) -> None:
        self.server, self.pid, self.args, self.returncode = server, pid, args, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.exit_status(self.pid, timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.server.exit_status(self.pid, timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        """Signal the command's whole process group (a DDP fit's other processes too)."""
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signum)


class WarmServer:
    """The caller's side of a warm server: started at once, its import going on in the background."""

    def __init__(self) -> None:
        self.socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # A session of its own: a Ctrl-C is its caller's, which passes it on to the command.
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=functools.partial(end_with_parent, os.getpid()),
        )
        theirs.close()
        self.ready: bool | None = None
        self.why = ""  # why it does not serve, when it does not
        self.told = False  # whether this process has said so
        self.closed = False  # the server has ended
        self.exited: dict[int, int] = {}
        self.poller = select.poll()
        self.poller.register(self.socket, select.POLLIN)

    def serves(self) -> bool:
        """Whether the server imported the project and serves: waits for its import."""
        while self.ready is None:
            message = self._receive(None)
            if message is None:  # it ended, its error above
                self.ready, self.why = False, f"its import failed (status {self.process.returncode})"
            elif "ready" in message:
                self.ready, self.why = message["ready"], message.get("why", "")
        return self.ready

    def start(
        self, args: list[str], env: dict[str, str], files: tuple[int, int, int], cwd: str
    ) -> WarmProcess | None:
        """Fork ``python -m <package> *args`` with ``env``, ``files`` (its stdin, stdout, stderr)
        and ``cwd``; None if the server has ended (killed), and serves no more."""
        with tempfile.TemporaryFile("w+") as request:
            json.dump({"args": args, "env": env, "cwd": cwd}, request)
            request.flush()
            try:
                socket.send_fds(self.socket, [b"start"], [*files, request.fileno()])
            except OSError:  # the server has ended
                self._end()
                return None
        while True:
            message = self._receive(None)
            if message is None:
                return None
            if "pid" in message:
                self.exited.pop(message["pid"], None)  # an earlier command's, of the same number
                return WarmProcess(self, message["pid"], args)

    def exit_status(self, pid: int, timeout: float | None) -> int | None:
        """The exit status of the command ``pid`` (a negative signal number if a signal ended it),
        as ``Popen.returncode``; None if it has not ended within ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while pid not in self.exited and not self.closed:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if self._receive(left) is None and not self.closed:
                return None  # no message within the time, and the server is still there
        if pid in self.exited:
            return self.exited.pop(pid)
        # The server is gone (killed), and its commands got SIGTERM: wait for this one to end.
        while alive(pid) and (deadline is None or time.monotonic() < deadline):
            time.sleep(GONE_WAIT_S)
        return None if alive(pid) else -signal.SIGTERM

    def _receive(self, timeout: float | None) -> dict[str, Any] | None:
        """The server's next message, keeping the commands' exits; None at ``timeout`` or its end."""
        if not self.poller.poll(None if timeout is None else timeout * 1000):
            return None
        try:
            data = self.socket.recv(MESSAGE_BYTES)
        except OSError:
            data = b""
        if not data:
            self._end()
            return None
        message = json.loads(data)
        if "exited" in message:
            self.exited[message["exited"]] = message["status"]
        return message

    def _end(self) -> None:
        """The server has ended (killed): it serves no more, and this process starts commands cold."""
        self.closed, self.ready = True, False
        self.why = f"its server ended (status {self.process.wait()})"


_server: WarmServer | None = None


def warm_up() -> None:
    """Start this process's warm server, if it has none, so that its import goes on meanwhile."""
    global _server
    if _server is None and sys.platform.startswith("linux"):
        _server = WarmServer()


def start(
    args: list[str],
    env: dict[str, str] | None = None,
    stdout: Any = None,
    stderr: Any = None,
    warm: bool = True,
    cwd: str | os.PathLike[str] | None = None,
) -> "WarmProcess | subprocess.Popen[bytes]":
    """Start ``python -m <package> *args`` in a session of its own (``stdout``/``stderr``: a file,
    ``subprocess.STDOUT`` for stderr, or None for this process's), in ``cwd`` (this process's by
    default): forked from the warm server when ``warm``, it serves, and ``env`` is its environment
    as far as imports read it; else as a new process. It gets SIGTERM when this process ends."""
    env = dict(os.environ if env is None else env)
    if warm:
        warm_up()
    if warm and _server is not None and _server.serves():
        out = (stdout or sys.stdout).fileno()
        err = out if stderr == subprocess.STDOUT else (stderr or sys.stderr).fileno()
        sys.stdout.flush()
        sys.stderr.flush()
        with open(os.devnull) as nothing:
            process = _server.start(
                args, env, (nothing.fileno(), out, err), os.path.abspath(cwd or os.getcwd())
            )
        if process is not None:
            return process
    if warm and _server is not None and not _server.told:
        print(f"note: warm starts are off: {_server.why}; each command starts a new process", flush=True)
        _server.told = True
    return subprocess.Popen(
        [sys.executable, "-m", PACKAGE, *args],
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        env=env,
        cwd=cwd,
        start_new_session=True,
        preexec_fn=functools.partial(end_with_parent, os.getpid()),
    )


def alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine runs: it has not ended, nor ended and waits to be
    reaped (a zombie, as the orphans of a killed server are where nothing reaps them, as under a
    container's first process; told apart on Linux)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        if sys.platform.startswith("linux"):
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        pass
    return True


# The server's side.


def not_forkable() -> str:
    """Why this process must not be forked for a command; empty when it may."""
    threads = [thread.name for thread in threading.enumerate() if thread is not threading.main_thread()]
    if threads:
        return f"importing the project started threads ({', '.join(threads)})"
    if len(os.listdir("/proc/self/task")) > 1 + _openblas_workers():
        return "importing the project started threads outside Python (an OpenMP pool, say)"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "importing the project initialised CUDA"
    return ""


def _openblas_workers() -> int:
    """The idle worker threads each OpenBLAS starts as it loads: one fewer than its threads."""
    from threadpoolctl import threadpool_info

    return sum(pool["num_threads"] - 1 for pool in threadpool_info() if pool["internal_api"] == "openblas")


def serve(channel: socket.socket) -> dict[str, Any] | None:
    """Import the project, then fork a command on each request, telling its caller the command's
    process and, when it ends, its status. Returns in a forked command, with its request; None in
    the server once its caller has gone."""
    started = {"env": dict(os.environ), "path": list(sys.path)}
    importlib.import_module(f"{PACKAGE}.__main__")  # as ``python -m`` imports it, without running it
    why = not_forkable()
    channel.send(json.dumps({"ready": not why, "why": why}).encode())
    if why:
        return None
    wake, woken = os.pipe()
    os.set_blocking(woken, False)
    signal.set_wakeup_fd(woken)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a command ended: the wake-up pipe says so
    while True:
        readable, _, _ = select.select([channel, wake], [], [])
        if wake in readable:
            os.read(wake, 4096)
        try:
            for pid, status in _ended():
                channel.send(json.dumps({"exited": pid, "status": status}).encode())
            if channel not in readable:
                continue
            data, files, _, _ = socket.recv_fds(channel, MESSAGE_BYTES, 4)
        except OSError:  # the caller was killed
            data = b""
        if not data:
            return None  # the caller ended; its commands get SIGTERM as this process ends
        *streams, request_file = files
        with os.fdopen(request_file) as sent:
            sent.seek(0)
            request = json.load(sent)
        sys.stdout.flush()
        sys.stderr.flush()
        server = os.getpid()
        settled, settling = os.pipe()  # closed by the command once it leads its own session
        with warnings.catch_warnings():
            # Python 3.12 warns of any thread at a fork: here only OpenBLAS's, stopped for it.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            channel.close()
            for fd in (wake, woken, settled):
                os.close(fd)
            _become(request, streams, server, settling, started)
            return request
        for fd in (*streams, settling):
            os.close(fd)
        os.read(settled, 1)  # so that its caller can signal its process group at once
        os.close(settled)
        with contextlib.suppress(OSError):  # else the caller was killed: the next read says so
            channel.send(json.dumps({"pid": pid}).encode())


def _ended() -> list[tuple[int, int]]:
    """The commands that have ended, each with its status, reaped."""
    ended = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:  # none is running
            return ended
        if pid == 0:
            return ended
        ended.append((pid, os.waitstatus_to_exitcode(status)))


def _become(
    request: dict[str, Any], files: list[int], server: int, settling: int, started: dict[str, Any]
) -> None:
    """Make this forked process what a new one would be: its own session, the caller's files,
    directory and environment, its module path, the signals' usual handlers, the random
    generators as they start (Python's own draws a new seed in a forked process by itself). Where
    that cannot be (another import-time environment; a module the server imported, found first
    in another place on the command's path), start the command anew in this process instead."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    os.close(settling)
    end_with_parent(server)
    for target, fd in enumerate(files):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdout.reconfigure(line_buffering=sys.stdout.isatty())
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    path = _module_path(request["cwd"], request["env"], started)
    if path is None:
        os.execv(sys.executable, [sys.executable, "-m", PACKAGE, *request["args"]])
    sys.path[:] = path
    if "numpy" in sys.modules:  # seeded from the system's entropy in a new process
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:  # seeded with its fixed default in a new process
        torch = sys.modules["torch"]
        torch.manual_seed(torch.initial_seed())
    sys.argv = ["-m", *request["args"]]
    del sys.modules[f"{PACKAGE}.__main__"]  # run again as __main__ (``runpy``), as ``python -m`` does


def _module_path(cwd: str, env: dict[str, str], started: dict[str, Any]) -> list[str] | None:
    """``sys.path`` as ``python -m`` in ``cwd`` with ``env`` would begin it; None if a new process
    would differ otherwise: its import-time environment (but PYTHONPATH) is not the server's, or
    its path finds a module the server imported in another place (a module of that name in the
    folder it runs in, or in a folder of its PYTHONPATH), or a Python started with ``env`` fails."""
    if _import_time(env) != _import_time(started["env"]):
        return None
    if env.get("PYTHONPATH") == started["env"].get("PYTHONPATH"):
        path = [cwd, *started["path"][1:]]
    else:  # as a new process's site module makes it (a library's .pth files, duplicates left out)
        found = subprocess.run(
            [sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
        )
        if found.returncode:  # a path a new process cannot start with: let it start and say why
            return None
        path = [cwd, *json.loads(found.stdout)]
    imported = [
        name for name, module in sys.modules.items() if "." not in name and getattr(module, "__file__", None)
    ]
    if any(_finder(name, path) != _finder(name, started["path"]) for name in imported):
        return None
    return path


def _finder(name: str, path: list[str]) -> str | None:
    """The first folder of ``path`` that holds the module or package ``name``."""
    return next((folder for folder in path if name in _modules_in(folder)), None)


@functools.cache
def _modules_in(folder: str) -> frozenset[str]:
    """The names of the modules and packages that ``folder`` holds."""
    try:
        names = os.listdir(folder)
    except OSError:
        return frozenset()
    packages = [name for name in names if os.path.isfile(os.path.join(folder, name, "__init__.py"))]
    modules = [name.partition(".")[0] for name in names if name.endswith((".py", ".so"))]
    return frozenset([*packages, *modules])


def _import_time(env: dict[str, str]) -> dict[str, str]:
    """The variables read as Python starts or as libraries load, but PYTHONPATH."""
    return {
        name: value for name, value in env.items() if name.startswith(IMPORT_TIME) and name != "PYTHONPATH"
    }


if __name__ == "__main__":
    if serve(socket.socket(fileno=int(sys.argv[1]))) is not None:
        runpy.run_module(PACKAGE, run_name="__main__", alter_sys=True)
