"""Deployment commands: `fedldp collector health`, `fedldp ledger migrate|backup|restore|
confirm-central`.

`health` is the container and Kubernetes health check: it asks a collector's
standard gRPC health service (grpc.health.v1.Health/Check, the protocol that
`grpc_health_probe` and Kubernetes' native `grpc:` probes speak) and exits 0 only
when the answer is SERVING, 1 on anything else (NOT_SERVING, an unknown service,
a refused connection, a failed TLS handshake, a deadline), with one line saying
why. TLS-aware: `--tls` with `--ca` (and `--cert`/`--key` when the collector
requires client certificates), which a native `grpc:` probe cannot do.

Heavy imports (grpc) happen inside the command so `fedldp --help` stays fast.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

import click

from fedldp.cli_common import ledger_option

#: The collector's own service name in its health service ("" is the whole server).
COLLECTOR_SERVICE = "fedldp.v1.Collector"


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for a TLS health check: the CA that signed the server's certificate,
    and optionally this client's certificate and key (mutual TLS)."""

    ca: Path | None
    cert: Path | None
    key: Path | None
    server_name: str | None


class HealthCheckError(Exception):
    """The health check got no answer (the message is one line, safe to print)."""


def _one_line(text: str) -> str:
    return " ".join(text.split())


def check_health(addr: str, *, service: str, timeout: float, tls: TlsFiles | None) -> str:
    """Ask `addr`'s gRPC health service about `service`; return the status name
    (SERVING, NOT_SERVING, ...). Raises HealthCheckError when no status came back."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    options: list[tuple[str, str | int]] = []
    if tls is None:
        channel = grpc.insecure_channel(addr, options=options)
    else:
        creds = grpc.ssl_channel_credentials(
            root_certificates=tls.ca.read_bytes() if tls.ca else None,
            private_key=tls.key.read_bytes() if tls.key else None,
            certificate_chain=tls.cert.read_bytes() if tls.cert else None,
        )
        if tls.server_name:
            options.append(("grpc.ssl_target_name_override", tls.server_name))
        channel = grpc.secure_channel(addr, creds, options=options)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            name = code.name if code is not None else "ERROR"
            raise HealthCheckError(f"{addr}: {name}: {_one_line(details or '')}") from None
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


def _tls_files(
    tls: bool, ca: str | None, cert: str | None, key: str | None, server_name: str | None
) -> TlsFiles | None:
    if not tls:
        if ca or cert or key or server_name:
            raise click.UsageError("--ca, --cert, --key and --server-name need --tls")
        return None
    if bool(cert) != bool(key):
        raise click.UsageError("--cert and --key go together (mutual TLS)")
    return TlsFiles(
        Path(ca) if ca else None,
        Path(cert) if cert else None,
        Path(key) if key else None,
        server_name,
    )


_pem = click.Path(exists=True, dir_okay=False)


@click.command("health")
@click.option(
    "--addr",
    required=True,
    envvar="FEDLDP_HEALTH_ADDR",
    help="HOST:PORT of the collector's gRPC endpoint",
)
@click.option(
    "--tls",
    is_flag=True,
    envvar="FEDLDP_HEALTH_TLS",
    help="connect with TLS (needed when the collector has tls_cert)",
)
@click.option(
    "--ca",
    type=_pem,
    envvar="FEDLDP_HEALTH_CA",
    help="CA certificate (PEM) that signed the server's certificate",
)
@click.option(
    "--cert",
    type=_pem,
    envvar="FEDLDP_HEALTH_CERT",
    help="client certificate (PEM), when the collector has mtls",
)
@click.option(
    "--key", type=_pem, envvar="FEDLDP_HEALTH_KEY", help="client private key (PEM), with --cert"
)
@click.option(
    "--server-name",
    envvar="FEDLDP_HEALTH_SERVER_NAME",
    help="name to verify in the server's certificate (default: HOST of --addr)",
)
@click.option(
    "--service",
    default=COLLECTOR_SERVICE,
    show_default=True,
    help="service to ask about ('' for the whole server)",
)
@click.option("--timeout", default=5.0, show_default=True, help="seconds to wait for the answer")
def health_cmd(
    addr: str,
    tls: bool,
    ca: str | None,
    cert: str | None,
    key: str | None,
    server_name: str | None,
    service: str,
    timeout: float,
) -> None:
    """Exit 0 if the collector at --addr answers SERVING on the standard gRPC health
    service, 1 otherwise (for container HEALTHCHECKs and Kubernetes exec probes).

    Each option except --service and --timeout can also come from
    FEDLDP_HEALTH_<OPTION> (ADDR, TLS, CA, CERT, KEY, SERVER_NAME), so one image
    HEALTHCHECK serves plaintext and TLS deployments."""
    if timeout <= 0:
        raise click.UsageError("--timeout must be positive")
    _, _, port = addr.rpartition(":")
    if port.isascii() and port.isdigit() and int(port) > 65535:  # it would wrap around
        raise click.BadParameter(
            f"port {int(port)} of {addr!r} is above 65535: use HOST:PORT, PORT from 1 to 65535",
            param_hint="--addr",
        )
    files = _tls_files(tls, ca, cert, key, server_name)
    try:
        status = check_health(addr, service=service, timeout=timeout, tls=files)
    except HealthCheckError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:  # a PEM file vanished or is unreadable between parse and read
        raise click.ClickException(_one_line(str(exc))) from None
    if status != "SERVING":
        raise click.ClickException(f"{addr}: {service or '(server)'} is {status}")
    click.echo("SERVING")


def _ledger_url(url: str | None, config_path: str | None) -> str:
    """--url, else the config's ledger_url (FEDLDP_COLLECTOR_* variables apply)."""
    if url:
        return url
    from fedldp.collector.config import ConfigError, load_config

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(f"pass --ledger or a config with ledger_url ({exc})") from None
    if config.ledger_shards:  # each shard is backed up and restored on its own
        raise click.UsageError("the config lists ledger_shards: pass one shard's --ledger URL")
    return config.ledger_url


_url_option = ledger_option(envvar="FEDLDP_COLLECTOR_LEDGER_URL", dest="url")
_config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False),
    help="collector.toml to read ledger_url from",
)


@click.command("migrate")
@_url_option
@_config_option
def migrate_cmd(url: str | None, config_path: str | None) -> None:
    """Bring the ledger's schema to the newest migration (a no-op when it is there).

    Run it once before collectors of a new version serve (the compose file's and the
    Kubernetes manifests' migration job). Collectors also migrate on start; several
    migrations and collectors at once, on a new ledger too, are serialized (an
    advisory lock on PostgreSQL; on SQLite the file's writer lock file
    `<ledger>-ingest.lock`, taken before the first schema statement).
    """
    import sqlalchemy as sa

    from fedldp.collector.ledger import create_private_sqlite_file, parse_ledger_url, restore
    from fedldp.collector.ledger.engine import refuse_if_not_sqlite
    from fedldp.collector.ledger.migrate import (
        current_revision,
        head_revision,
        schema_lock,
        upgrade,
    )

    ledger_url = _ledger_url(url, config_path)
    sqlite = parse_ledger_url(ledger_url).get_backend_name() == "sqlite"
    if sqlite:
        refuse_if_not_sqlite(_sqlite_path(ledger_url))  # before making a lock file beside it
        create_private_sqlite_file(_sqlite_path(ledger_url))  # 0600, as `ledger init`
    # SQLite: wait up to 30 s for another process's lock, as a collector does.
    engine = sa.create_engine(ledger_url, connect_args={"timeout": 30} if sqlite else {})
    try:
        with schema_lock(engine):
            with engine.connect() as connection:
                before = current_revision(connection)
                restore.check_complete(connection)  # a half-done restore stays as it is
            upgrade(engine, locked=True)
            with engine.connect() as connection:
                after = current_revision(connection)
    except sa.exc.SQLAlchemyError as exc:
        cause = exc.orig if isinstance(exc, sa.exc.DBAPIError) else exc
        from fedldp.cli_errors import mask_password

        detail = _one_line(str(cause))
        hint = (
            "; is it a fedldp ledger (a SQLite database)?"
            if "not a database" in detail
            else "; check the URL and that the server is reachable"
        )
        raise click.ClickException(
            f"cannot migrate the ledger {mask_password(ledger_url)}: {detail}{hint}"
        ) from None
    finally:
        engine.dispose()
    if after != head_revision():
        raise click.ClickException(f"ledger at {after}, expected head {head_revision()}")
    click.echo(f"ledger schema at {after} (head); was {before or 'empty'}")


# --- backup and restore (collector/ledger/restore.py states the rule) ---

_pg_bin_option = click.option(
    "--pg-bin",
    type=click.Path(exists=True, file_okay=False),
    help="folder holding pg_dump/pg_restore (PostgreSQL; default: from PATH)",
)


def _pg_tool(name: str, pg_bin: str | None) -> str:
    import shutil

    found = shutil.which(name, path=pg_bin) if pg_bin else shutil.which(name)
    if found is None:
        raise click.ClickException(
            f"{name} not found: install the PostgreSQL client tools of the server's major "
            "version, or pass --pg-bin"
        )
    return found


def _libpq(url: str) -> tuple[str, dict[str, str]]:
    """A libpq connection URI for a SQLAlchemy PostgreSQL URL, and the environment
    that carries its password (never on a command line, where `ps` shows it)."""
    import sqlalchemy as sa

    parsed = sa.make_url(url)
    env = dict(os.environ)
    if parsed.password is not None:
        env["PGPASSWORD"] = str(parsed.password)
    uri = parsed.set(drivername="postgresql", password=None).render_as_string(hide_password=False)
    return uri, env


def _run_tool(argv: list[str], env: dict[str, str] | None = None) -> str:
    import subprocess

    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise click.ClickException(f"{Path(argv[0]).name} failed: {_one_line(last)}")
    return done.stdout


def _sqlite_path(url: str) -> Path:
    import sqlalchemy as sa

    database = sa.make_url(url).database or ""
    if not database or database == ":memory:":
        raise click.ClickException("the ledger URL names no SQLite file")
    return Path(database)


def _sqlite_copy(source: Path, target: Path) -> None:
    """Copy a live SQLite database with SQLite's online backup API: one step (all
    pages), so the copy is the snapshot of one read transaction; writers go on.
    `target` is created with mode 0600 (it holds a whole ledger) and left in
    rollback-journal mode (one file; a ledger opened for writing goes back to WAL).
    The source is read as every ledger reader reads it (`read_only_uri`): nothing
    is written or created beside it."""
    import sqlite3

    from fedldp.client.device_store import read_only_uri
    from fedldp.collector.ledger import create_private_sqlite_file

    create_private_sqlite_file(target)
    src = sqlite3.connect(read_only_uri(source), uri=True)
    dst = sqlite3.connect(target)
    try:
        try:
            src.backup(dst)
        except sqlite3.DatabaseError as exc:
            raise click.ClickException(f"{source} is not a SQLite ledger ({exc})") from None
        (check,) = dst.execute("PRAGMA integrity_check").fetchone()
        if check != "ok":
            raise click.ClickException(f"the copy of {source} fails integrity_check: {check}")
        # A copy is one self-contained file (rollback journal, not WAL): reading it
        # later (`mode=ro`) then leaves no -wal/-shm files beside it.
        dst.execute("PRAGMA journal_mode=DELETE")
    finally:
        dst.close()
        src.close()


def _durable_rename(tmp: Path, out: Path, *, replace: bool = True) -> None:
    """Move `tmp` to `out` durably; with replace=False, atomically refuse (FileExistsError)
    when `out` exists by then (a collector started on the restore's target)."""
    with tmp.open("rb") as f:
        os.fsync(f.fileno())
    if replace:
        os.replace(tmp, out)
    else:
        os.link(tmp, out)
        tmp.unlink()
    directory = os.open(out.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


@click.command("backup")
@_url_option
@_config_option
@_pg_bin_option
@click.argument("out", type=click.Path(dir_okay=False))
def backup_cmd(url: str | None, config_path: str | None, pg_bin: str | None, out: str) -> None:
    """Back up the ledger to OUT while collectors keep serving.

    SQLite: SQLite's online backup API into a new file, marked with the time just
    before the copy (a copy that is put back without `fedldp ledger restore`
    charges nothing). PostgreSQL: pg_dump's custom format (one snapshot).
    Restore with `fedldp ledger restore`.
    """
    import time

    import sqlalchemy as sa

    from fedldp.collector.ledger import migrate, restore

    ledger_url = _ledger_url(url, config_path)
    target = Path(out)
    if target.exists():
        raise click.ClickException(f"{target} exists: back up to a new file")
    tmp = target.with_name(target.name + ".partial")
    tmp.unlink(missing_ok=True)
    taken_at = int(time.time())  # before the snapshot: the gap starts no later
    backend = sa.make_url(ledger_url).get_backend_name()
    try:
        if backend == "sqlite":
            source = _sqlite_path(ledger_url)
            if not source.is_file():
                raise click.ClickException(f"no ledger file at {source}")
            _sqlite_copy(source, tmp)
            engine = sa.create_engine(f"sqlite:///{tmp}")
            try:
                # The .partial copy is this command's alone: no lock file beside it.
                migrate.upgrade(engine, locked=True)
                with engine.begin() as connection:
                    restore.check_complete(connection)  # no backup of a half-done restore
                    restore.mark_backup(
                        connection, backup_time=taken_at, source=f"sqlite-backup:{source.name}"
                    )
            finally:
                engine.dispose()
        elif backend == "postgresql":
            uri, env = _libpq(ledger_url)
            # pg_dump truncates the file it is given and keeps its mode: 0600.
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
            _run_tool(
                [_pg_tool("pg_dump", pg_bin), "--format=custom", "--no-owner", "-f", str(tmp), uri],
                env,
            )
        else:
            raise click.ClickException(f"cannot back up a {backend!r} ledger")
        _durable_rename(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    click.echo(f"ledger backed up to {target} (taken at {taken_at})")


def _archive_time(pg_restore: str, archive: Path) -> int | None:
    """pg_dump's archive creation time (set before its snapshot), when the listing
    states it in UTC; None otherwise (the restore then relies on the data alone)."""
    import datetime

    listing = _run_tool([pg_restore, "--list", str(archive)], {"PGTZ": "UTC", "TZ": "UTC"})
    for line in listing.splitlines():
        text = line.strip("; ").strip()
        if text.startswith("Archive created at "):
            stamp = text.removeprefix("Archive created at ").strip()
            try:
                when = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S UTC")
            except ValueError:
                return None
            return int(when.replace(tzinfo=datetime.timezone.utc).timestamp())
    return None


def _empty_database(url: str) -> bool:
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return not sa.inspect(connection).get_table_names()
    finally:
        engine.dispose()


def _begin_restore(url: str, *, source: str) -> None:
    """Mark the empty PostgreSQL database as being restored into (restore.py): no
    ledger opens it until the restore records its gap."""
    import time

    import sqlalchemy as sa

    from fedldp.collector.ledger import restore

    engine = sa.create_engine(url)
    try:
        with engine.begin() as connection:
            restore.begin_restore(connection, source=source, started_at=int(time.time()))
    finally:
        engine.dispose()


def _stage_sqlite_restore(ledger_url: str, source: Path) -> Path:
    """Copy the SQLite backup `source` to a `.partial` file beside the target (which must
    not exist: ClickException); the partial file, removed again if the copy fails."""
    target = _sqlite_path(ledger_url)
    if target.exists():
        raise click.ClickException(
            f"{target} exists: restore into a new file (move the old ledger away first)"
        )
    tmp = target.with_name(target.name + ".partial")
    tmp.unlink(missing_ok=True)
    try:
        _sqlite_copy(source, tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _restore_postgresql(ledger_url: str, source: Path, pg_bin: str | None) -> int | None:
    """pg_restore the archive `source` into the empty database at `ledger_url` (marked as
    being restored first, so no ledger opens it meanwhile); the archive's time (None
    when its listing does not state it in UTC).
    ClickException when the database is not empty or a tool fails."""
    if not _empty_database(ledger_url):
        raise click.ClickException("the target database is not empty: restore into a new one")
    pg_restore = _pg_tool("pg_restore", pg_bin)
    archive_time = _archive_time(pg_restore, source)
    uri, env = _libpq(ledger_url)
    _begin_restore(ledger_url, source=f"restore:{source.name}")
    _run_tool(
        [
            pg_restore,
            "--no-owner",
            "--no-privileges",
            "--exit-on-error",
            "--single-transaction",
            "-d",
            uri,
            str(source),
        ],
        env,
    )
    return archive_time


@click.command("restore")
@_url_option
@_config_option
@_pg_bin_option
@click.argument("backup", type=click.Path(exists=True, dir_okay=False))
def restore_cmd(url: str | None, config_path: str | None, pg_bin: str | None, backup: str) -> None:
    """Restore BACKUP (from `fedldp ledger backup`) into a new, empty ledger.

    Records the restore epoch: every charge in a budget window overlapping
    [backup time, restore time] is refused until the window ends, and every
    central reservation is refused until `fedldp ledger confirm-central`
    re-enters the central spend made after the backup (or confirms none), so no
    subject can spend again what was spent after the backup. Refuses a restore
    time before the backup's time or the data's newest timestamp (fix the clock).
    Then reconciles the restored ledger (exit status 1 on any mismatch). Stop
    every collector of the old ledger first; start them on the restored one
    afterwards.
    """
    import time

    import sqlalchemy as sa

    from fedldp.collector.ledger import migrate, open_ledger, restore

    ledger_url = _ledger_url(url, config_path)
    source = Path(backup)
    backend = sa.make_url(ledger_url).get_backend_name()
    archive_time: int | None = None
    tmp: Path | None = None
    if backend == "sqlite":
        tmp = _stage_sqlite_restore(ledger_url, source)
        work_url = f"sqlite:///{tmp}"
    elif backend == "postgresql":
        archive_time = _restore_postgresql(ledger_url, source, pg_bin)
        work_url = ledger_url
    else:
        raise click.ClickException(f"cannot restore into a {backend!r} ledger")
    try:
        engine = sa.create_engine(work_url)
        try:
            # A backup from an older version. A SQLite restore works on its own staged
            # copy (no lock file beside it); PostgreSQL's advisory lock is taken anyway.
            migrate.upgrade(engine, locked=True)
            with engine.begin() as connection:
                gap = restore.record_restore(
                    connection,
                    restore_time=int(time.time()) + 1,  # covers the current second
                    source=f"restore:{source.name}",
                    archive_time=archive_time,
                )
        except (sa.exc.SQLAlchemyError, restore.RestoreClockError) as exc:
            cause = exc.orig if isinstance(exc, sa.exc.DBAPIError) else exc
            left = (
                ""
                if tmp is not None
                else " (drop the database: it holds data without its epoch and will not open)"
            )
            raise click.ClickException(
                f"cannot record the restore epoch{left}: {_one_line(str(cause))}"
            ) from None
        finally:
            engine.dispose()
        if tmp is not None:
            try:
                _durable_rename(tmp, _sqlite_path(ledger_url), replace=False)
            except FileExistsError:
                raise click.ClickException(
                    f"{_sqlite_path(ledger_url)} appeared during the restore (a collector "
                    "started on it?): stop it, move that file away and restore again"
                ) from None
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
    click.echo(
        f"restored {source} with restore epoch [{gap.backup_time}, {gap.restore_time}]: "
        "charges in windows overlapping it are refused until those windows end"
    )
    click.echo(
        f"central spend since {gap.backup_time} is unconfirmed: central reservations are "
        "refused until you re-enter each central release made after the backup with "
        "`fedldp ledger confirm-central --spent SUBJECT PURPOSE EPSILON DELTA` "
        "(training receipts and release outputs record them) or confirm none was made "
        "with `fedldp ledger confirm-central --none`"
    )
    with open_ledger(ledger_url, access="write") as led:
        mismatches = led.reconcile()
    for m in mismatches:
        click.echo(f"MISMATCH {m}")
    if mismatches:
        raise click.ClickException(f"{len(mismatches)} mismatch(es) in the restored ledger")
    click.echo("ledger consistent: every running total matches the raw rows")


def _reentries(
    spent: tuple[tuple[str, str, str, str], ...],
) -> list[tuple[str, str, Decimal, Decimal]]:
    """--spent SUBJECT PURPOSE EPSILON DELTA, parsed (exact decimals)."""
    out: list[tuple[str, str, Decimal, Decimal]] = []
    for subject, purpose, eps_text, delta_text in spent:
        try:
            out.append((subject, purpose, Decimal(eps_text), Decimal(delta_text)))
        except InvalidOperation:
            raise click.ClickException(
                f"--spent {subject} {purpose}: EPSILON and DELTA must be decimal numbers"
            ) from None
    return out


@click.command("confirm-central")
@_url_option
@_config_option
@click.option(
    "--spent",
    nargs=4,
    multiple=True,
    metavar="SUBJECT PURPOSE EPSILON DELTA",
    help="a central release made after the backup (repeat once per release)",
)
@click.option("--none", "none_made", is_flag=True, help="confirm no central release was made")
@click.option("--note", default="", help="where the figures come from (kept with each entry)")
def confirm_central_cmd(
    url: str | None,
    config_path: str | None,
    spent: tuple[tuple[str, str, str, str], ...],
    none_made: bool,
    note: str,
) -> None:
    """After `fedldp ledger restore`: re-enter the central spend made after the backup.

    Central caps have no budget window, so a restored ledger refuses every
    central reservation until this records each central release made after the
    backup (--spent, repeated; added as settled releases, even above the cap:
    never a refund) or confirms none was made (--none). One transaction.
    """
    from fedldp.collector.ledger import LedgerError
    from fedldp.collector.ledger.shards import open_central_ledger

    if spent and none_made:
        raise click.UsageError("pass --spent (once per release) or --none, not both")
    if not spent and not none_made:
        raise click.UsageError(
            "pass --spent SUBJECT PURPOSE EPSILON DELTA (once per central release made after "
            "the backup) or --none (no central release was made since)"
        )
    entries = _reentries(spent)
    with open_central_ledger(_ledger_url(url, config_path), access="write") as led:
        try:
            epochs = led.confirm_central(entries, now=int(time.time()), note=note)
        except (LedgerError, ValueError, TypeError) as exc:
            raise click.ClickException(_one_line(str(exc))) from None
    for subject, purpose, eps, delta in entries:
        click.echo(f"re-entered central spend of {subject} for {purpose}: eps={eps} delta={delta}")
    click.echo(f"central spend confirmed for {epochs} restore(s): central reservations resume")
