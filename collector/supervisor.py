"""`processes` > 1: one supervising process and N collector processes on one port.

CPython runs one thread of Python at a time per process, and a collector's
per-report work (authentication, parsing, validation, ledger rows) is Python:
one process uses about one core however many threads it has. With `processes`
= N the daemon becomes a supervisor that starts N ordinary collector processes
(`fedldp collector serve` with `processes = 1`), each binding the same listen
port with SO_REUSEPORT, so the kernel spreads incoming connections over them,
and each opening the same ledger: SQLite ingestion queues on the writer lock
file (`collector/ledger/sqlite_ingest.py`), PostgreSQL on its row locks, as
with separate collectors. Every invariant of the ledger holds as it does for
several collectors on one database (the contract tests run both).

The supervisor:
- reserves the port first when `listen` asks for port 0 (a bound, non-listening
  SO_REUSEPORT socket held until exit), so every process binds the same one;
- writes `--port-file` once every process is serving;
- serves the Prometheus endpoint (`metrics_listen`) for all of them, summing
  their metrics (prometheus_client's multiprocess mode, in a private folder);
- forwards SIGHUP (policy reload) and, on SIGTERM or SIGINT, SIGTERM (each
  process drains as `daemon.serve` describes), waits, and exits 0 when all did;
- restarts a process that exits on its own (a crash, kill -9), after
  `restart_delay` (1 s, doubling while it keeps exiting within
  `STABLE_SECONDS` of its start, at most 60 s); the ledger is crash-safe, so
  nothing acknowledged is lost and devices retry what was not.
Per-process state stays per process: the rate limit (a device's channel is one
connection, which one process serves), the statistics shard (host:pid, or
`instance_id`/index) and the caches.

Processes die with their supervisor, and one generation serves at a time:
- every process watches its supervisor (`watch_supervisor`): a liveness pipe
  whose write end only the supervisor holds (its end of file means the
  supervisor is gone, however it died) and, on Linux, the parent-death signal
  (`prctl(PR_SET_PDEATHSIG, SIGTERM)`); either way the process drains as on
  SIGTERM and exits;
- the supervisor holds an exclusive `flock` on a generation lock file per
  thing it serves — `<ledger>-serve.lock` beside a SQLite ledger, and
  `fedldp-collector-<port>.lock` in the temporary folder for a fixed port —
  and its processes inherit the locked file. The lock is free only once every
  process of a generation has exited, so a new supervisor started while an
  earlier generation still serves (its processes draining after a `kill -9` of
  their supervisor) waits for them, up to `drain_seconds` + 5 s, and otherwise
  exits 1 saying so — never four listeners on one port.
"""

from __future__ import annotations

import ctypes
import fcntl
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from wsgiref.simple_server import WSGIServer

from fedldp.collector.config import CollectorConfig, ConfigError, env_name

log = logging.getLogger("fedldp.collector")

#: Wait before restarting a process that exited on its own (`restart_delay`).
RESTART_DELAY_SECONDS = 1.0
MAX_RESTART_DELAY_SECONDS = 60.0
#: A process that ran this long before exiting is restarted after the first delay.
STABLE_SECONDS = 30.0


def restart_delay(quick_exits: int) -> float:
    """Seconds before restarting a process that exited `quick_exits` times in a row
    within `STABLE_SECONDS` of its start (1 s, doubling, at most 60 s)."""
    return float(
        min(MAX_RESTART_DELAY_SECONDS, RESTART_DELAY_SECONDS * 2 ** max(0, quick_exits - 1))
    )


#: How long the processes may take to start serving.
START_TIMEOUT_SECONDS = 120.0
#: A generation lock held by an earlier generation is waited for this long beyond
#: `drain_seconds` (its processes drain, then exit) before giving up.
GENERATION_WAIT_EXTRA_SECONDS = 5.0
#: Environment of a supervised process: its supervisor's pid and the descriptor of
#: the read end of its liveness pipe (not settings: `load_config` ignores them).
SUPERVISOR_PID_ENV = "FEDLDP_SUPERVISOR_PID"
LIVENESS_FD_ENV = "FEDLDP_SUPERVISOR_LIVENESS_FD"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class GenerationLockedError(RuntimeError):
    """An earlier generation of collector processes still serves this port or ledger."""


def generation_lock_paths(config: CollectorConfig, port: int) -> list[Path]:
    """The generation lock files of a supervisor serving `port` and `config`'s ledger:
    one beside a SQLite ledger, one per fixed port (port 0 was chosen fresh)."""
    import sqlalchemy as sa

    paths = []
    for text in config.ledger_shards or (config.ledger_url,):
        url = sa.make_url(text)
        if url.get_backend_name() == "sqlite" and url.database:
            paths.append(Path(url.database + "-serve.lock"))
    host, wanted = _split_listen(config.listen)
    if wanted != 0:
        tag = "".join(c if c.isalnum() else "_" for c in host) or "any"
        paths.append(Path(tempfile.gettempdir()) / f"fedldp-collector-{tag}-{port}.lock")
    return paths


def take_generation_locks(paths: list[Path], *, wait_seconds: float) -> list[int]:
    """Lock every path (exclusive, non-blocking `flock`, retried for up to
    `wait_seconds`); the open descriptors, which the processes inherit.
    GenerationLockedError if a lock stays held (an earlier generation serves)."""
    fds: list[int] = []
    deadline = time.monotonic() + wait_seconds
    waited = False
    try:
        for path in paths:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fds.append(fd)
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise GenerationLockedError(
                            f"{path} is locked: collector processes of an earlier generation "
                            "still serve this port or ledger; stop them first"
                        ) from None
                    if not waited:
                        waited = True
                        log.warning(
                            "an earlier generation of collector processes still serves; "
                            "waiting for it to exit",
                            extra={"fields": {"lock": str(path)}},
                        )
                    time.sleep(0.1)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def watch_supervisor(on_death: Callable[[], None]) -> None:
    """In a process started by `supervise`: call `on_death` (once, from a thread or a
    signal handler) when the supervisor is gone. No-op in a collector started
    otherwise. Linux: the parent-death signal SIGTERM (handled as a drain), then a
    check that the parent is still the supervisor (it may have died before the
    signal was armed); everywhere: a thread waiting for the liveness pipe's end
    of file."""
    expected = os.environ.pop(SUPERVISOR_PID_ENV, "")
    fd_text = os.environ.pop(LIVENESS_FD_ENV, "")
    if not expected:
        return
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG) failed; watching the liveness pipe only")
    if os.getppid() != int(expected):
        on_death()
        return
    if fd_text:
        fd = int(fd_text)

        def _watch() -> None:
            while os.read(fd, 1):  # the supervisor writes nothing: this returns at EOF
                pass
            os.close(fd)
            log.warning("the supervisor is gone; draining")
            on_death()

        threading.Thread(target=_watch, name="supervisor-watch", daemon=True).start()


def _split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


def _join_listen(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _reserve_port(host: str) -> socket.socket:
    """A bound (not listening) SO_REUSEPORT socket on an OS-chosen port of `host`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, 0))
    return sock


def write_port_file(path: Path, port: int) -> None:
    """Write `port` to `path` atomically (a temporary file renamed over it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(str(port), encoding="ascii")
    os.replace(tmp, path)


class _Both:
    """Two reserved sockets closed together (the gRPC port's and the web port's)."""

    def __init__(self, first: socket.socket | None, second: socket.socket) -> None:
        self.sockets = [s for s in (first, second) if s is not None]

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


def _web_listen(config: CollectorConfig) -> tuple[socket.socket | None, str]:
    """The web endpoint's address for every process (its port reserved here when
    `web_listen` asks for port 0, like `listen`'s), and the reserved socket."""
    if not config.web_listen:
        return None, ""
    host, port = _split_listen(config.web_listen)
    if port != 0:
        _check_bindable(host, port, config.web_listen)
        return None, config.web_listen
    sock = _reserve_port(host)
    return sock, _join_listen(host, sock.getsockname()[1])


def _check_bindable(host: str, port: int, listen: str) -> None:
    """ConfigError unless `host`:`port` can be bound with SO_REUSEPORT (as the
    processes will bind it): a port another program holds, or an address that is
    not this machine's, is one error here rather than one per process."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on {listen!r} ({exc.strerror or exc}): set `listen` to HOST:PORT "
            "with an address of this machine and a free port"
        ) from None


class _Worker:
    """One collector process: its index, command and current `Popen`; it inherits
    `keep_fds` (the liveness pipe's read end, the generation locks)."""

    def __init__(
        self, index: int, argv: list[str], env: dict[str, str], keep_fds: tuple[int, ...]
    ) -> None:
        self.index = index
        self.argv = argv
        self.env = env
        self.keep_fds = keep_fds
        self.proc: subprocess.Popen[bytes] | None = None
        self.restart_at: float | None = None
        self.started_at = 0.0
        self.quick_exits = 0  # exits in a row within STABLE_SECONDS of a start

    def start(self) -> None:
        self.proc = subprocess.Popen(self.argv, env=self.env, pass_fds=self.keep_fds)
        self.restart_at = None
        self.started_at = time.monotonic()


def supervise(
    config: CollectorConfig,
    *,
    config_path: str | Path | None,
    port_file: str | Path | None,
) -> int:
    """Run `config.processes` collector processes until SIGTERM/SIGINT; exit status
    (1 when they could not all start, or an earlier generation still serves)."""
    host, port = _split_listen(config.listen)
    grpc_reserved = _reserve_port(host) if port == 0 else None
    if grpc_reserved is not None:
        port = grpc_reserved.getsockname()[1]
    else:
        _check_bindable(host, port, config.listen)
    web_reserved, web_listen = _web_listen(config)
    reserved: socket.socket | _Both | None = grpc_reserved
    if web_reserved is not None:
        reserved = _Both(grpc_reserved, web_reserved)
    try:
        locks = take_generation_locks(
            generation_lock_paths(config, port),
            wait_seconds=config.drain_seconds + GENERATION_WAIT_EXTRA_SECONDS,
        )
    except GenerationLockedError as exc:
        log.error("collector processes not started", extra={"fields": {"error": str(exc)}})
        if reserved is not None:
            reserved.close()
        return 1
    liveness_read, liveness_write = os.pipe()  # both close-on-exec; read end passed on
    keep_fds = (liveness_read, *locks)
    workdir = Path(tempfile.mkdtemp(prefix="fedldp-collector-"))
    metrics_dir = workdir / "metrics" if config.metrics_listen else None
    if metrics_dir is not None:
        metrics_dir.mkdir()
    workers = []
    for i in range(config.processes):
        argv, env = _command(config, i, host, port, config_path, workdir, metrics_dir)
        if web_listen:
            env[env_name("web_listen")] = web_listen
        env[SUPERVISOR_PID_ENV] = str(os.getpid())
        env[LIVENESS_FD_ENV] = str(liveness_read)
        workers.append(_Worker(i, argv, env, keep_fds))
    stop = threading.Event()
    hup = threading.Event()

    def _on_stop(signum: int, _frame: FrameType | None) -> None:
        log.info("draining", extra={"fields": {"signal": signal.Signals(signum).name}})
        stop.set()

    def _on_hup(_signum: int, _frame: FrameType | None) -> None:
        hup.set()

    signal.signal(signal.SIGTERM, _on_stop)
    signal.signal(signal.SIGINT, _on_stop)
    signal.signal(signal.SIGHUP, _on_hup)
    metrics_server = None
    try:
        for w in workers:
            w.start()
        if not _wait_until_serving(workers, workdir, stop):
            return 1
        if metrics_dir is not None:
            metrics_server = _serve_metrics(config.metrics_listen, metrics_dir)
        if port_file is not None:
            path = Path(port_file)
            if web_listen:  # PATH.web first: PATH says both are there
                write_port_file(Path(f"{path}.web"), _split_listen(web_listen)[1])
            write_port_file(path, port)
        log.info(
            "collector processes serving",
            extra={"fields": {"port": port, "processes": len(workers)}},
        )
        while not stop.wait(0.2):
            if hup.is_set():
                hup.clear()
                _signal_all(workers, signal.SIGHUP)
            _restart_exited(workers, metrics_dir)
        return _drain(workers, config.drain_seconds)
    finally:
        for w in workers:  # only on an error path: _drain waited for all of them
            if w.proc is not None and w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()
        if metrics_server is not None:
            metrics_server.shutdown()
        if reserved is not None:
            reserved.close()
        shutil.rmtree(workdir, ignore_errors=True)
        for fd in (liveness_read, liveness_write, *locks):
            os.close(fd)


def _command(
    config: CollectorConfig,
    index: int,
    host: str,
    port: int,
    config_path: str | Path | None,
    workdir: Path,
    metrics_dir: Path | None,
) -> tuple[list[str], dict[str, str]]:
    """argv and environment of process `index`: the same settings (file, then the
    environment, which wins) with its own listen/shard/metrics overrides."""
    argv = [sys.executable, "-m", "fedldp.collector", "serve"]
    if config_path is not None:
        argv += ["--config", str(config_path)]
    argv += ["--port-file", str(workdir / f"{index}.port")]
    env = dict(os.environ)
    env.update(
        {
            env_name("listen"): _join_listen(host, port),
            env_name("processes"): "1",
            env_name("reuse_port"): "true",
            env_name("metrics_listen"): "",
            env_name("instance_id"): f"{config.instance_id}/{index}" if config.instance_id else "",
        }
    )
    if metrics_dir is not None:
        env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    return argv, env


def _wait_until_serving(workers: list[_Worker], workdir: Path, stop: threading.Event) -> bool:
    """True once every process wrote its port file; False (after logging) if one
    exited first, the timeout passed, or a stop signal came."""
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while not all((workdir / f"{w.index}.port").exists() for w in workers):
        failed = [w for w in workers if w.proc is not None and w.proc.poll() is not None]
        if failed or stop.is_set() or time.monotonic() > deadline:
            log.error(
                "collector processes did not all start",
                extra={
                    "fields": {
                        "exited": {w.index: w.proc.returncode for w in failed if w.proc},
                        "stopped": stop.is_set(),
                    }
                },
            )
            _drain(workers, 5.0)
            return False
        time.sleep(0.05)
    return True


def _serve_metrics(listen: str, metrics_dir: Path) -> WSGIServer:
    from prometheus_client import CollectorRegistry, multiprocess, start_http_server

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(metrics_dir))  # type: ignore[no-untyped-call]
    host, port = _split_listen(listen)
    server, _thread = start_http_server(port, addr=host or "127.0.0.1", registry=registry)
    return server


def _signal_all(workers: list[_Worker], signum: int) -> None:
    for w in workers:
        if w.proc is not None and w.proc.poll() is None:
            w.proc.send_signal(signum)


def _restart_exited(workers: list[_Worker], metrics_dir: Path | None) -> None:
    now = time.monotonic()
    for w in workers:
        if w.proc is None or w.proc.poll() is None:
            continue
        if w.restart_at is None:
            w.quick_exits = w.quick_exits + 1 if now - w.started_at < STABLE_SECONDS else 1
            delay = restart_delay(w.quick_exits)
            w.restart_at = now + delay
            log.error(
                "collector process exited; restarting it",
                extra={
                    "fields": {
                        "process": w.index,
                        "status": w.proc.returncode,
                        "restart_in_seconds": delay,
                    }
                },
            )
            if metrics_dir is not None:
                from prometheus_client import multiprocess

                multiprocess.mark_process_dead(w.proc.pid, str(metrics_dir))  # type: ignore[no-untyped-call]
        elif now >= w.restart_at:
            w.start()


def _drain(workers: list[_Worker], drain_seconds: float) -> int:
    """SIGTERM every process, wait for each (killing one that overstays); 0 if all
    drained cleanly."""
    _signal_all(workers, signal.SIGTERM)
    deadline = time.monotonic() + drain_seconds + 10.0
    status = 0
    for w in workers:
        if w.proc is None:
            continue
        try:
            code = w.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            w.proc.kill()
            code = w.proc.wait()
        # -SIGTERM: the signal came before the process installed its handler, i.e.
        # while it was starting (a restart), with nothing in flight.
        if code not in (0, -signal.SIGTERM) and w.restart_at is None:
            status = 1
    return status
