"""The command line's error table: every expected failure -> one line and an exit code.

Like the collector's gRPC status table (collector/errors.py), this is the ONE place
where an exception becomes what a person sees. `fedldp` (fedldp/cli.py) runs every
command through `describe`; a command never prints a traceback for an expected
failure. Exit codes (documented in docs/cli.md):

====  =========  ==============================================================
code  name       meaning
====  =========  ==============================================================
0     OK         done
1     REFUSED    an expected failure: a config, file, URL, database, network,
                 policy, budget or ledger problem, or an extra that is not
                 installed (the message says what to do)
2     USAGE      the command line itself is wrong (unknown option, missing or
                 malformed value, e.g. a decimal with an exponent)
70    INTERNAL   a bug (EX_SOFTWARE): rerun with `fedldp --debug ...` for the
                 traceback and report it
====  =========  ==============================================================

Exceptions are matched by the qualified names of their classes (their MRO), so the
table imports neither SQLAlchemy nor grpc nor torch: `fedldp --help` stays light.
A message never contains a ledger password (URLs are shown with it masked).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 70

DEBUG_HINT = "rerun with `fedldp --debug ...` for the traceback, and report it"


@dataclass(frozen=True)
class Failure:
    """What the command line prints (after "Error: ") and its exit code."""

    message: str
    exit_code: int


def _first_line(exc: BaseException) -> str:
    # A KeyError's str() is the repr of its key: "'no reservation \\'9\\''"; say the text.
    if isinstance(exc, KeyError) and len(exc.args) == 1 and isinstance(exc.args[0], str):
        text = exc.args[0].strip()
    else:
        text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def mask_password(text: str) -> str:
    """`text` with the password of any URL in it (scheme://user:PASSWORD@host) masked."""
    return re.sub(r"(\w[\w+.-]*://[^/:@\s]*:)[^@\s]*@", r"\1***@", text)


def _os_error(exc: BaseException) -> str:
    assert isinstance(exc, OSError)
    where = f"{exc.filename}: " if exc.filename is not None else ""
    what = {
        FileNotFoundError: "no such file or folder; check the path",
        IsADirectoryError: "is a folder, a file was expected",
        NotADirectoryError: "a folder was expected (part of the path is a file)",
        PermissionError: "permission denied; check the file's owner and mode",
        FileExistsError: "already exists; choose another path or remove it first",
    }.get(type(exc))
    return where + (what or (exc.strerror or _first_line(exc)))


def _sqlalchemy_error(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)
    detail = _first_line(orig) if orig is not None else _first_line(exc)
    detail = mask_password(detail)
    if "not a database" in detail or "malformed" in detail:
        hint = "the ledger URL names a file that is not a fedldp ledger (SQLite database)"
    elif "unable to open database" in detail:
        hint = "cannot open the SQLite ledger: check that the file and its folder exist"
    elif "readonly" in detail or "read-only" in detail:
        hint = "the ledger is read-only here"
    else:
        hint = "the ledger database failed; check the URL and that the server is reachable"
    return f"{hint} ({detail})"


def _url_error(exc: BaseException) -> str:
    return (
        f"cannot parse the ledger URL ({mask_password(_first_line(exc))}); expected "
        "sqlite:////ABSOLUTE/PATH/ledger.db or postgresql+psycopg://USER@HOST:PORT/DB"
    )


def _rpc_error(exc: BaseException) -> str:
    code = getattr(exc, "code", None)
    details = getattr(exc, "details", None)
    name = getattr(code(), "name", "?") if callable(code) else "?"
    text = details() if callable(details) else _first_line(exc)
    hint = ""
    if name == "UNAVAILABLE":
        hint = (
            "; check the address and that the collector runs. A bearer token is only "
            "sent over TLS: against a plaintext collector use its TLS address (or mTLS)"
        )
    return f"the collector answered {name}: {text}{hint}"


def _prefixed(prefix: str) -> Callable[[BaseException], str]:
    return lambda exc: f"{prefix}{mask_password(_first_line(exc))}"


# Qualified class name (matched anywhere in the exception's MRO) -> (message, exit code).
# First match in this order wins, so specific entries come before general ones.
_TABLE: list[tuple[str, Callable[[BaseException], str], int]] = [
    # configuration files
    ("fedldp.collector.config.ConfigError", _prefixed("config: "), EXIT_REFUSED),
    ("fedldp.aggregator.training.config.TrainingConfigError", _prefixed("train config: "), 1),
    ("fedldp.aggregator.shuffler_config.ShufflerConfigError", _prefixed("shuffler config: "), 1),
    ("tomllib.TOMLDecodeError", _prefixed("a TOML file is not valid TOML: "), EXIT_REFUSED),
    ("tomli.TOMLDecodeError", _prefixed("a TOML file is not valid TOML: "), EXIT_REFUSED),
    # exact decimals (fedldp.client.decimals)
    ("fedldp.client.decimals.DecimalSyntaxError", _prefixed(""), EXIT_USAGE),
    ("decimal.InvalidOperation", _prefixed("not a decimal number: "), EXIT_USAGE),
    # ledger URL, database
    ("fedldp.collector.ledger.model.LedgerOpenError", _prefixed("ledger: "), EXIT_REFUSED),
    ("fedldp.collector.ledger.restore.RestoreIncompleteError", _prefixed("ledger: "), 1),
    ("fedldp.collector.ledger.restore.RestoreClockError", _prefixed("restore refused: "), 1),
    ("fedldp.collector.ledger.model.LedgerError", _prefixed("ledger refused: "), EXIT_REFUSED),
    ("sqlalchemy.exc.ArgumentError", _url_error, EXIT_REFUSED),
    ("sqlalchemy.exc.NoSuchModuleError", _url_error, EXIT_REFUSED),
    ("sqlalchemy.exc.DBAPIError", _sqlalchemy_error, EXIT_REFUSED),
    ("sqlalchemy.exc.SQLAlchemyError", _sqlalchemy_error, EXIT_REFUSED),
    ("sqlite3.Error", _sqlalchemy_error, EXIT_REFUSED),
    ("psycopg.Error", _sqlalchemy_error, EXIT_REFUSED),
    # network
    ("grpc.RpcError", _rpc_error, EXIT_REFUSED),
    ("fedldp.client.transport.TransportError", _prefixed("collector: "), EXIT_REFUSED),
    # policies, device state, budgets, releases, reports, training
    ("fedldp.client.policy.files.KeyFileError", _prefixed("key file: "), EXIT_REFUSED),
    ("fedldp.client.policy.errors.RootRotationError", _prefixed("trust folder: "), 1),
    ("fedldp.client.policy.errors.PolicyError", _prefixed("policy: "), EXIT_REFUSED),
    ("fedldp.client.device_store.StateError", _prefixed("device state: "), EXIT_REFUSED),
    ("fedldp.client.outbox.RecordRefusedError", _prefixed("refused: "), EXIT_REFUSED),
    ("fedldp.aggregator.central.releases.ReleaseError", _prefixed("release refused: "), 1),
    ("fedldp.aggregator.reports.ReportError", _prefixed("report refused: "), EXIT_REFUSED),
    ("fedldp.aggregator.training.errors.BudgetRefusedError", _prefixed("budget refused: "), 1),
    ("fedldp.aggregator.training.errors.TrainingAbortedError", _prefixed("training: "), 1),
    ("fedldp.aggregator.training.data.DataError", _prefixed("data: "), EXIT_REFUSED),
    ("fedldp.aggregator.training.receipt.ReceiptError", _prefixed("receipt: "), EXIT_REFUSED),
    ("fedldp.aggregator.training.models.UnsupportedModelError", _prefixed("model: "), 1),
    ("fedldp.aggregator.training.accounting.AccountantError", _prefixed("accountant: "), 1),
    ("fedldp.aggregator.training.errors.PoissonSamplingError", _prefixed("training: "), 1),
    ("fedldp.aggregator.training.errors.DistributedError", _prefixed("training: "), 1),
    ("fedldp.aggregator.central.accounting.CompositionError", _prefixed("accounting: "), 1),
    ("fedldp.aggregator.central.receipts.ReleaseReceiptError", _prefixed("receipt: "), 1),
    ("fedldp.aggregator.central.datakey.DataKeyError", _prefixed("data key: "), EXIT_REFUSED),
    ("fedldp.aggregator.central.signing.SignatureError", _prefixed("signature: "), 1),
    ("fedldp.aggregator.service.engine.ServiceError", _prefixed("release service: "), 1),
    ("fedldp.aggregator.service.catalog.CatalogError", _prefixed("catalog: "), EXIT_REFUSED),
    ("fedldp.aggregator.service.catalog.RegistrationError", _prefixed("catalog: "), 1),
    (
        "fedldp.aggregator.service.jobs.JobsFolderBusyError",
        _prefixed("training jobs: "),
        EXIT_REFUSED,
    ),
    ("fedldp.aggregator.dashboard.app.DashboardConfigError", _prefixed("dashboard: "), 1),
    ("fedldp.client.mechanisms.registry.UnknownMechanismError", _prefixed("mechanism: "), 1),
    ("fedldp.client.mechanisms.base.OutputDomainError", _prefixed("mechanism: "), 1),
    ("fedldp.aggregator.shuffler.BatchTooSmallError", _prefixed("shuffler: "), EXIT_REFUSED),
    ("fedldp.aggregator.shuffler.BatchReleasedError", _prefixed("shuffler: "), EXIT_REFUSED),
    ("fedldp.client.sealed.SealingUnavailableError", _prefixed("sealing: "), EXIT_REFUSED),
    ("fedldp.client.mechanisms.memo_loss.JointLossTooCostlyError", _prefixed("mechanism: "), 1),
    ("fedldp.client.mechanisms.memo_loss.InfiniteSequenceLossError", _prefixed("mechanism: "), 1),
    ("fedldp.aggregator.engines.sqlparse.SqlRefusedError", _prefixed("SQL: "), EXIT_USAGE),
    ("fedldp.aggregator.engines.plan.PlanError", _prefixed("query refused: "), EXIT_REFUSED),
    ("fedldp.aggregator.engines.plan.EngineError", _prefixed("release engine: "), 1),
    ("fedldp.collector.supervisor.GenerationLockedError", _prefixed("serve: "), EXIT_REFUSED),
    ("fedldp.cli_ops.HealthCheckError", _prefixed("health: "), EXIT_REFUSED),
    # files and folders (after the domain errors: OutputExistsError is a FileExistsError)
    ("builtins.OSError", _os_error, EXIT_REFUSED),
    ("builtins.UnicodeDecodeError", _prefixed("a file is not UTF-8 text: "), EXIT_REFUSED),
]


# Top-level module -> the extra of pyproject.toml that brings it (the smallest one;
# tests/client/test_light_install.py checks each against pyproject.toml).
EXTRA_OF_MODULE: dict[str, str] = {
    "click": "cli",
    "tqdm": "cli",
    "tomli": "cli",
    "numpy": "sim",
    "sqlalchemy": "collector",
    "alembic": "collector",
    "prometheus_client": "collector",
    "psycopg": "collector",
    "grpc_health": "collector",
    "scipy": "aggregator",
    "matplotlib": "aggregator",
    "dp_accounting": "aggregator",
    "duckdb": "aggregator",
    "pyarrow": "aggregator",
    "sqlglot": "aggregator",
    "pyspark": "spark",
    "starlette": "dashboard",
    "uvicorn": "dashboard",
    "torch": "train",
    "opacus": "train",
    "sklearn": "train",
}


def missing_extra(exc: BaseException, who: str = "this command") -> str | None:
    """The one-line message for a ModuleNotFoundError of a module an extra brings (which
    extra to install, and how; `who` needs it), or None for any other exception."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    module = exc.name.split(".")[0]
    extra = EXTRA_OF_MODULE.get(module)
    if extra is None:
        return None
    return (
        f"{who} needs {module!r}, from the {extra!r} extra: pip install "
        f"'fedldp[{extra}]' (from a checkout: pip install '.[{extra}]')"
    )


def _qualnames(exc: BaseException) -> list[str]:
    return [f"{cls.__module__}.{cls.__qualname__}" for cls in type(exc).__mro__]


def describe(exc: BaseException) -> Failure:
    """The one-line message and exit code for `exc` (internal: EXIT_INTERNAL)."""
    extra = missing_extra(exc)
    if extra is not None:
        return Failure(extra, EXIT_REFUSED)
    names = _qualnames(exc)
    for name, message, code in _TABLE:
        if name in names:
            return Failure(message(exc), code)
    return Failure(
        f"internal error ({type(exc).__name__}: {mask_password(_first_line(exc))}); " + DEBUG_HINT,
        EXIT_INTERNAL,
    )
