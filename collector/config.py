"""Collector configuration: a TOML file, overridden by environment variables.

Every field of `CollectorConfig` can be set in the ``[collector]`` table of the
TOML file (same name) or by the environment variable
``FEDLDP_COLLECTOR_<NAME IN UPPER CASE>``; the environment wins. `describe()`
lists them all (`fedldp collector serve --help` prints it).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from fedldp.client.textfiles import read_utf8


def _toml_loads(text: str) -> dict[str, Any]:
    name = "tomllib" if sys.version_info >= (3, 11) else "tomli"
    module = importlib.import_module(name)  # tomli: the collector extra on Python 3.10
    data: dict[str, Any] = module.loads(text)
    return data


ENV_PREFIX = "FEDLDP_COLLECTOR_"


class ConfigError(ValueError):
    """A configuration value is missing or invalid; the message names it."""


@dataclass(frozen=True)
class CollectorConfig:
    """Every collector setting (defaults suit a single-machine SQLite deployment)."""

    listen: str = field(
        default="127.0.0.1:0", metadata={"help": "gRPC address host:port (port 0: OS-chosen)"}
    )
    ledger_url: str = field(
        default="",
        metadata={
            "help": "ledger database URL: sqlite:////abs/ledger.db or postgresql+psycopg://..."
        },
    )
    ledger_shards: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "a sharded ledger instead of ledger_url: every shard's database URL, "
            "shard 0 first, in the shard map's order (TOML list; environment: URLs "
            "separated by spaces); docs/operations.md, 'Ledger shards'"
        },
    )
    ledger_isolation: str = field(
        default="",
        metadata={
            "help": "PostgreSQL only: READ COMMITTED (default; row locks + compare-and-set) "
            "or SERIALIZABLE"
        },
    )
    trust_dir: str = field(
        default="", metadata={"help": "trust folder: pinned/*.pem root keys and *.root envelopes"}
    )
    policy_dir: str = field(default="", metadata={"help": "folder of signed *.policy envelopes"})
    audience: str = field(
        default="default",
        metadata={"help": "this deployment's name; policies must list it in their audience"},
    )
    token_secret: str = field(
        default="",
        metadata={
            "help": "hex HMAC secret (>= 32 bytes) for bearer tokens (prefer token_secret_file)"
        },
    )
    token_secret_file: str = field(
        default="", metadata={"help": "file holding the hex token secret"}
    )
    tls_cert: str = field(default="", metadata={"help": "server certificate chain (PEM)"})
    tls_key: str = field(default="", metadata={"help": "server private key (PEM)"})
    tls_client_ca: str = field(
        default="", metadata={"help": "CA bundle for client certificates (enables mutual TLS)"}
    )
    mtls: bool = field(
        default=False,
        metadata={
            "help": "require client certificates; the subject is the certificate's common name"
        },
    )
    max_message_bytes: int = field(
        default=1024 * 1024,
        metadata={
            "help": "largest request accepted, bytes (larger: RESOURCE_EXHAUSTED from the "
            "transport)"
        },
    )
    max_inflight_bytes: int = field(
        default=32 * 1024 * 1024,
        metadata={
            "help": "request bytes in flight at most, over all connections: a request "
            "counts max_message_bytes from before its body is read until it is read, then "
            "its size until answered; beyond, RESOURCE_EXHAUSTED with retry-after-ms "
            "(docs/collector.md, 'Memory and overload')"
        },
    )
    max_connection_inflight_bytes: int = field(
        default=16 * 1024 * 1024,
        metadata={"help": "request bytes in flight at most on one connection (as above)"},
    )
    max_subject_inflight_bytes: int = field(
        default=0,
        metadata={
            "help": "request bytes one subject (device) may hold in flight at most, per "
            "process, counted as above; a request past it is refused at once "
            "(RESOURCE_EXHAUSTED with retry-after-ms), so one device, even one that "
            "withholds its bodies, holds only this share. 0: an eighth of "
            "max_inflight_bytes, at least max_message_bytes (4 MiB at the defaults)"
        },
    )
    body_timeout_ms: float = field(
        default=5000.0,
        metadata={
            "help": "how long an admitted request may take to send its body; then its "
            "reservation is released and it is refused (RESOURCE_EXHAUSTED with "
            "retry-after-ms)"
        },
    )
    admission_wait_ms: float = field(
        default=100.0,
        metadata={
            "help": "how long a request may wait for room under max_inflight_bytes before "
            "it is refused (RESOURCE_EXHAUSTED with retry-after-ms)"
        },
    )
    max_streams_per_connection: int = field(
        default=100,
        metadata={"help": "concurrent HTTP/2 streams (RPCs) per connection (transport setting)"},
    )
    health_listen: str = field(
        default="",
        metadata={
            "help": "host:port of a separate gRPC health endpoint with its own threads, "
            "answering however loaded the main port is (empty: health on the main port only)"
        },
    )
    max_reports_per_request: int = field(
        default=1000, metadata={"help": "most reports in one Submit request"}
    )
    rate_limit_per_second: float = field(
        default=50.0, metadata={"help": "requests per second per subject (token bucket rate)"}
    )
    rate_limit_burst: float = field(
        default=100.0, metadata={"help": "requests per subject allowed in a burst"}
    )
    max_report_age_seconds: int = field(
        default=30 * 86400, metadata={"help": "oldest coarse_time accepted, seconds before now"}
    )
    max_clock_skew_seconds: int = field(
        default=3600, metadata={"help": "how far in the future a coarse_time may be"}
    )
    server: str = field(
        default="asyncio",
        metadata={"help": "grpcio server flavour: sync (thread pool) or asyncio"},
    )
    workers: int = field(default=64, metadata={"help": "gRPC handler threads (per process)"})
    processes: int = field(
        default=1,
        metadata={
            "help": "server processes sharing the listen port (SO_REUSEPORT) and the ledger, "
            "under one supervising process; more than 1 uses more cores "
            "(docs/collector.md, 'Processes'); 1 runs one collector process, no supervisor"
        },
    )
    reuse_port: bool = field(
        default=False,
        metadata={
            "help": "bind the listen port with SO_REUSEPORT, so several collector processes "
            "share it (set for each process when processes > 1)"
        },
    )
    max_concurrent_rpcs: int = field(
        default=256,
        metadata={
            "help": "Collector RPCs in progress at most (health checks not counted); beyond, "
            "RESOURCE_EXHAUSTED with retry-after-ms"
        },
    )
    group_commit_max_reports: int = field(
        default=20000, metadata={"help": "most reports in one ledger transaction"}
    )
    group_commit_delay_ms: float = field(
        default=3.0,
        metadata={
            "help": "longest the committer lingers for more requests to share a ledger "
            "transaction (only while they keep arriving; 0: never)"
        },
    )
    instance_id: str = field(
        default="",
        metadata={"help": "this collector's shard name in the statistics table (default host:pid)"},
    )
    metrics_listen: str = field(
        default="", metadata={"help": "host:port for the Prometheus /metrics endpoint (empty: off)"}
    )
    drain_seconds: float = field(
        default=10.0,
        metadata={"help": "on SIGTERM, how long in-flight requests may take to finish"},
    )
    log_level: str = field(default="INFO", metadata={"help": "DEBUG, INFO, WARNING, ERROR"})
    log_format: str = field(default="json", metadata={"help": "json or text"})

    def subject_inflight_bytes(self) -> int:
        """One subject's share of the request bytes in flight, per process:
        `max_subject_inflight_bytes`, or when 0 an eighth of `max_inflight_bytes`
        (at least `max_message_bytes`, at most `max_inflight_bytes`)."""
        if self.max_subject_inflight_bytes:
            return self.max_subject_inflight_bytes
        eighth = max(self.max_message_bytes, self.max_inflight_bytes // 8)
        return min(self.max_inflight_bytes, eighth)

    def token_secret_bytes(self) -> bytes | None:
        """The token secret, from `token_secret` or `token_secret_file` (None: tokens off)."""
        text = self.token_secret
        source = "token_secret"
        if self.token_secret_file:
            source = f"token_secret_file {self.token_secret_file}"
            try:
                text = Path(self.token_secret_file).read_text(encoding="ascii").strip()
            except OSError as exc:
                raise ConfigError(f"cannot read {source}: {exc}") from None
            except UnicodeDecodeError:
                text = "not hex"  # refused below, with the fix
        if not text:
            return None
        try:
            return bytes.fromhex(text)
        except ValueError:
            raise ConfigError(
                f"{source} must hold hex digits (make one with `fedldp collector gen-secret`)"
            ) from None

    def validate(self) -> None:
        """Raise ConfigError naming every missing or inconsistent setting."""
        problems = []
        if not self.ledger_url and not self.ledger_shards:
            problems.append("ledger_url is required (or ledger_shards for a sharded ledger)")
        if self.ledger_url and self.ledger_shards:
            problems.append("set ledger_url or ledger_shards, not both")
        if len(set(self.ledger_shards)) != len(self.ledger_shards):
            problems.append("ledger_shards lists a URL twice")
        if bool(self.tls_cert) != bool(self.tls_key):
            problems.append("tls_cert and tls_key go together")
        if self.mtls and not (self.tls_client_ca and self.tls_cert):
            problems.append("mtls needs tls_cert, tls_key and tls_client_ca")
        if self.max_reports_per_request < 1 or self.max_message_bytes < 1024:
            problems.append("max_reports_per_request >= 1 and max_message_bytes >= 1024")
        if not (
            self.max_message_bytes <= self.max_connection_inflight_bytes <= self.max_inflight_bytes
        ):
            problems.append(
                "max_message_bytes <= max_connection_inflight_bytes <= max_inflight_bytes"
            )
        if self.max_subject_inflight_bytes and not (
            self.max_message_bytes <= self.max_subject_inflight_bytes <= self.max_inflight_bytes
        ):
            problems.append(
                "max_message_bytes <= max_subject_inflight_bytes <= max_inflight_bytes "
                "(or 0: an eighth of max_inflight_bytes)"
            )
        if not 1 <= self.body_timeout_ms <= 600_000:
            problems.append("body_timeout_ms is between 1 and 600000")
        if not 0 <= self.admission_wait_ms <= 60_000:
            problems.append("admission_wait_ms is between 0 and 60000")
        if self.max_concurrent_rpcs < 1 or self.max_streams_per_connection < 1:
            problems.append("max_concurrent_rpcs and max_streams_per_connection are >= 1")
        if not 0 <= self.group_commit_delay_ms <= 1000:
            problems.append("group_commit_delay_ms is between 0 and 1000")
        if self.ledger_isolation not in ("", "READ COMMITTED", "SERIALIZABLE"):
            problems.append("ledger_isolation is READ COMMITTED or SERIALIZABLE")
        if not 1 <= self.processes <= 64:
            problems.append("processes is between 1 and 64")
        if self.server not in ("sync", "asyncio"):
            problems.append("server is sync or asyncio")
        if self.log_format not in ("json", "text"):
            problems.append("log_format is json or text")
        if self.log_level.upper() not in LOG_LEVELS:
            problems.append(f"log_level is one of {', '.join(LOG_LEVELS)}")
        if not (self.rate_limit_per_second > 0 and math.isfinite(self.rate_limit_per_second)):
            problems.append("rate_limit_per_second is a positive number")
        if not (self.rate_limit_burst >= 1 and math.isfinite(self.rate_limit_burst)):
            problems.append("rate_limit_burst is at least 1")
        problems += [
            problem
            for name in ("listen", "health_listen", "metrics_listen")
            if (problem := address_problem(name, getattr(self, name), required=name == "listen"))
        ]
        if problems:
            raise ConfigError("; ".join(problems))


#: The accepted `log_level` values (any case).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def split_address(text: str) -> tuple[str, int]:
    """HOST:PORT (IPv6 in brackets) as (host, port); ValueError unless the port is a
    decimal number from 0 to 65535 (a larger one would wrap around in the transport)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit():
        raise ValueError(f"{text!r} is not HOST:PORT")
    number = int(port)
    if number > 65535:
        raise ValueError(f"port {number} of {text!r} is above 65535")
    return host.strip("[]"), number


def address_problem(name: str, text: str, *, required: bool) -> str | None:
    """What is wrong with the address setting `name` (None: fine, or empty and optional)."""
    if not text and not required:
        return None
    try:
        split_address(text)
    except ValueError as exc:
        return f"{name}: {exc} (use HOST:PORT, PORT from 0 to 65535)"
    return None


def env_name(name: str) -> str:
    """The environment variable that sets field `name`."""
    return ENV_PREFIX + name.upper()


def _convert(name: str, kind: Any, raw: Any) -> Any:
    try:
        if kind in (bool, "bool"):
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(text)
        if kind in (int, "int"):
            return int(raw)
        if kind in (float, "float"):
            return float(raw)
        if kind == "tuple[str, ...]":
            items = raw.split() if isinstance(raw, str) else raw
            if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
                raise ValueError(raw)
            return tuple(items)
        return str(raw)
    except ValueError:
        raise ConfigError(f"{name}: cannot read {raw!r} as {kind}") from None


def load_config(
    path: str | Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> CollectorConfig:
    """TOML file (optional) < environment < explicit overrides; validated."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    known = {f.name: f for f in fields(CollectorConfig)}
    if path is not None:
        try:
            data = _toml_loads(
                read_utf8(
                    path, "a collector.toml is a UTF-8 TOML file: check --config", ConfigError
                )
            )
        except ConfigError:
            raise
        except ValueError as exc:  # tomllib.TOMLDecodeError
            raise ConfigError(f"{path} is not valid TOML: {exc}") from None
        table = data.get("collector", data)
        for key, raw in table.items():
            if key not in known:
                raise ConfigError(f"unknown setting {key!r} in {path}")
            values[key] = _convert(key, known[key].type, raw)
    for name, f in known.items():
        if env_name(name) in env:
            values[name] = _convert(name, f.type, env[env_name(name)])
    for key, raw in (overrides or {}).items():
        if key not in known:
            raise ConfigError(f"unknown setting {key!r}")
        values[key] = _convert(key, known[key].type, raw)
    if "processes" not in values:
        values["processes"] = default_processes()
    config = CollectorConfig(**values)
    config.validate()
    return config


# --- the default number of processes (issue 17; kept apart from the loader above) ---


def default_processes() -> int:
    """The cores this process may run on (CPU affinity, cgroup cpusets), 1..64.

    One collector process uses about one core (docs/collector.md, "Processes"), so
    a config that does not set `processes` runs one per usable core. Programmatic
    `CollectorConfig(...)` keeps the dataclass default (1).
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no sched_getaffinity (macOS)
        cores = os.cpu_count() or 1
    return max(1, min(64, cores))


def describe() -> str:
    """One line per setting: name, environment variable, default, help."""
    lines = []
    for f in fields(CollectorConfig):
        default = repr(f.default) if f.default is not dataclasses.MISSING else "''"
        if f.name == "processes":  # load_config's default, not the dataclass's
            default = f"the cores this process may run on, at most 64 ({default_processes()} here)"
        lines.append(f"  {f.name} ({env_name(f.name)}, default {default}): {f.metadata['help']}")
    return "\n".join(lines)
