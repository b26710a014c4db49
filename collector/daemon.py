"""The collector daemon: structured logging, signals, and the serve loop.

SIGHUP reloads the trust and policy folders (a bad new set is refused and
the loaded one kept). SIGTERM (or SIGINT) drains: health turns NOT_SERVING,
the server stops taking new RPCs, in-flight requests finish and commit (up to
`drain_seconds`), the group committer flushes, the ledger closes, and the
process exits 0. With `processes` > 1 the daemon supervises that many
collector processes on one port instead (collector/supervisor.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from fedldp.client.policy import PolicyError
from fedldp.collector.config import CollectorConfig
from fedldp.collector.server import preflight, start_collector
from fedldp.collector.supervisor import watch_supervisor


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg and the record's `fields`.

    Callers pass structured data as ``extra={"fields": {...}}``; nothing logs a
    payload, a token or a subject (a subject appears only as a hashed tag).
    """

    def format(self, record: logging.LogRecord) -> str:
        """One JSON object per record (the fields above); never a payload or raw subject."""
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update({k: v for k, v in fields.items() if v is not None})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(level: str = "INFO", fmt: str = "json") -> None:
    """Log to stderr, as JSON lines (default) or plain text."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter()
        if fmt == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


#: The young generation's collection threshold in a serving process (CPython's
#: default is 700). A request allocates a few tuples and lists per report that
#: live until its group commits; at 700 young collections traverse them again
#: and again. bench.collector's load (100 reports per call, 2 processes; time in
#: collections from gc.callbacks): 0.27–0.41 s of young collections per process in
#: 13 s at 700, 0.04 s at 10,000.
GC_YOUNG_THRESHOLD = 10_000


def settle_heap() -> None:
    """Call once a serving process has started: collect, then move every object
    alive now (modules, policies, the server) to the permanent generation
    (`gc.freeze`), so that full collections no longer traverse them — each took
    25–60 ms with the GIL held, stalling every request of the process and, when
    it held the SQLite writer lock, every other collector process on the file —
    and raise the young threshold to `GC_YOUNG_THRESHOLD`. Cyclic garbage is
    still collected; the frozen objects are the ones a server keeps anyway."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


#: How often a serving process hands the heap memory it freed back to the OS.
HEAP_TRIM_SECONDS = 1.0
#: Allocations from this size up get pages of their own (glibc `M_MMAP_THRESHOLD`),
#: returned to the OS when freed: request bodies and the transport's buffers for
#: them, not the small objects of ordinary requests.
MMAP_THRESHOLD_BYTES = 64 * 1024
_M_MMAP_THRESHOLD = -3  # <malloc.h>


def bound_heap(stop: threading.Event) -> None:
    """Keep a serving process's heap near what it uses (glibc only; elsewhere a no-op).

    Request bodies and the transport's buffers are freed when a request ends, but
    glibc keeps freed heap memory for reuse, and its mmap threshold rises to the
    largest block freed, so ~1 MB bodies come from the heap: after a burst of 300
    concurrent ~1 MB requests a collector stayed at 270 MiB resident with nothing
    in flight, and one `malloc_trim(0)` brought it to 89 MiB (its idle size). So:
    a fixed mmap threshold of `MMAP_THRESHOLD_BYTES` (1,000 concurrent 1 MB
    requests of garbage with a valid token: peak 268 MiB rather than 405 MiB),
    and every `HEAP_TRIM_SECONDS` until `stop` is set a collection of the two
    younger generations, then `malloc_trim(0)`. The collection matters once load
    stops: grpcio leaves a reference cycle per aborted call (its AbortError's
    traceback, the call's state and context), which holds the call's buffers;
    with the young threshold at `GC_YOUNG_THRESHOLD` an idle process would
    allocate too little to ever collect them (a process stayed 70 MiB above its
    idle size after a flood of refused calls). A collection of the young
    generations costs about a millisecond.
    """
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        trim = libc.malloc_trim if libc is not None else None
        mallopt = libc.mallopt if libc is not None else None
    except (OSError, AttributeError):
        return
    if trim is None or mallopt is None:
        return
    mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)

    def _run() -> None:
        while not stop.wait(HEAP_TRIM_SECONDS):
            gc.collect(1)
            trim(0)

    threading.Thread(target=_run, name="heap-trim", daemon=True).start()


#: The one ERROR line of a collector whose policy folders do not load.
POLICY_FOLDER_FAILED = "collector not started: the policy folder does not load"


class _SupervisorGoneError(Exception):
    """A supervised process found its supervisor gone before binding its port."""


def serve(
    config: CollectorConfig,
    *,
    port_file: str | Path | None = None,
    config_path: str | Path | None = None,
) -> int:
    """Run a collector until SIGTERM/SIGINT, then drain; returns the exit status.

    With `config.processes` > 1 this process supervises that many collector
    processes instead (collector/supervisor.py), started with `config_path` and
    this process's environment, after checking here everything they would read
    (`server.preflight`): a bad input is one error line, not one per process.
    A supervised process whose supervisor is gone before it binds its port
    (it died while this one started) exits 0 without serving.
    """
    configure_logging(config.log_level, config.log_format)
    log = logging.getLogger("fedldp.collector")
    if config.processes > 1:
        from fedldp.collector.supervisor import supervise

        try:
            preflight(config, now=int(time.time()))
        except PolicyError as exc:
            log.error(POLICY_FOLDER_FAILED, extra={"fields": {"error": str(exc)}})
            return 1
        return supervise(config, config_path=config_path, port_file=port_file)
    stop = threading.Event()
    watch_supervisor(stop.set)  # a supervised process drains when its supervisor dies

    def _supervisor_alive() -> None:
        if stop.is_set():
            raise _SupervisorGoneError

    try:
        _supervisor_alive()
        running = start_collector(config, before_bind=_supervisor_alive)
    except PolicyError as exc:  # the operator's folders: one line saying which file and why
        log.error(POLICY_FOLDER_FAILED, extra={"fields": {"error": str(exc)}})
        return 1
    except _SupervisorGoneError:
        log.warning("the supervisor is gone; not serving")
        return 0
    settle_heap()
    bound_heap(stop)
    if port_file is not None:
        path = Path(port_file)
        if running.web_port is not None:  # PATH.web first: PATH says both are there
            from fedldp.collector.supervisor import write_port_file

            write_port_file(Path(f"{path}.web"), running.web_port)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(str(running.port), encoding="ascii")
        os.replace(tmp, path)

    def _on_signal(signum: int, _frame: FrameType | None) -> None:
        logging.getLogger("fedldp.collector").info(
            "draining", extra={"fields": {"signal": signal.Signals(signum).name}}
        )
        stop.set()

    reload = threading.Event()

    def _on_hup(_signum: int, _frame: FrameType | None) -> None:
        reload.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGHUP, _on_hup)
    while not stop.wait(0.2):
        if reload.is_set():
            reload.clear()
            # A set that fails to load is not served: reload_policies logged and
            # counted it, and the set served before stays.
            with contextlib.suppress(PolicyError, OSError, ValueError):
                running.reload_policies()
    started = time.monotonic()
    running.stop(config.drain_seconds)
    logging.getLogger("fedldp.collector").info(
        "drained", extra={"fields": {"seconds": round(time.monotonic() - started, 3)}}
    )
    return 0
