"""`fedldp demo --web`: the demo collector with its web endpoint, and a page that
records into it from a browser.

It writes the same deployment as `fedldp demo` (signed GRR policy, trust folder,
token secret, SQLite ledger), starts `fedldp collector serve` with `web_listen` on
a loopback port and the page's origin as the one allowed origin, serves the page
(sdk/js/demo/) and the SDK's GRR/OLH browser bundle (sdk/js/dist/browser/, built
by `npm run build:browser`) on 127.0.0.1, prints the page's URL, and serves until
Ctrl-C (or `--web-for` seconds); then it stops the collector and prints how many
reports the ledger holds. config.json, served beside the page, holds the
collector's URL, a bearer token for subject "browser-demo" (valid 24 hours), the
pinned root key and root envelope, and the metric name.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Sequence
from decimal import Decimal
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import click

REPO_ROOT = Path(__file__).resolve().parent.parent
PAGE_DIR = REPO_ROOT / "sdk" / "js" / "demo"
BUNDLE = REPO_ROOT / "sdk" / "js" / "dist" / "browser" / "fedldp.grr-olh.min.js"
SUBJECT = "browser-demo"


class _PageHandler(SimpleHTTPRequestHandler):
    """Static files of the page folder, no directory listings, no request log."""

    def list_directory(self, path: Any) -> None:
        """No listings."""
        self.send_error(404)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


def _page_folder(out: Path) -> Path:
    """out/web: the page, its script, the bundle and its chunks (copied: a self-contained page)."""
    if not BUNDLE.exists():
        raise click.ClickException(
            f"the browser bundle {BUNDLE} is missing: run `cd sdk/js && npm ci && npm run "
            "build:browser` first (node >= 20)"
        )
    folder = out / "web"
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("index.html", "demo.mjs"):
        (folder / name).write_bytes((PAGE_DIR / name).read_bytes())
    (folder / BUNDLE.name).write_bytes(BUNDLE.read_bytes())
    chunks = folder / "chunks"  # the bundle's chunks, static and lazy (build_browser.mjs)
    chunks.mkdir(exist_ok=True)
    for chunk in (BUNDLE.parent / "chunks").glob("*.js"):
        (chunks / chunk.name).write_bytes(chunk.read_bytes())
    return folder


def _serve_page(folder: Path) -> ThreadingHTTPServer:
    """The page's HTTP server on a free loopback port (its own thread)."""
    handler = functools.partial(_PageHandler, directory=str(folder))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, name="demo-page", daemon=True).start()
    return server


def run_web_demo(
    out: Path,
    *,
    labels: Sequence[str],
    epsilon: Decimal,
    epsilon_cap: Decimal,
    now: int,
    seconds: float | None,
) -> None:
    """Serve the web demo until Ctrl-C or `seconds`; print the ledger's count after."""
    from fedldp.collector.auth import TokenAuthority
    from fedldp.demo import METRIC, _collector_process, _write_deployment

    deployment = _write_deployment(
        out, labels=labels, epsilon=epsilon, epsilon_cap=epsilon_cap, now=now
    )
    page = _serve_page(_page_folder(out))
    origin = f"http://127.0.0.1:{page.server_address[1]}"
    with deployment.collector_config.open("a", encoding="utf-8") as handle:
        handle.write(f'web_listen = "127.0.0.1:0"\nweb_allowed_origins = ["{origin}"]\n')
    try:
        with _collector_process(deployment) as address:
            web_port = int((out / "collector.port.web").read_text(encoding="ascii"))
            config = {
                "collectorUrl": f"http://127.0.0.1:{web_port}",
                "token": TokenAuthority(deployment.token_secret).mint(
                    SUBJECT, expires_at=int(time.time()) + 86_400
                ),
                "pinnedRootKeys": [k.public_bytes_raw().hex() for k in deployment.root_public_keys],
                "rootEnvelope": deployment.root_envelope.SerializeToString().hex(),
                "metric": METRIC,
            }
            (out / "web" / "config.json").write_text(json.dumps(config), encoding="utf-8")
            click.echo(f"collector: gRPC {address}, web endpoint {config['collectorUrl']}")
            click.echo(f"demo page: {origin}/index.html  (open it in a browser; Ctrl-C stops)")
            _wait(seconds)
    finally:
        page.shutdown()
    click.echo(f"reports in the ledger: {_ledger_reports(deployment.ledger_url)}")


def _wait(seconds: float | None) -> None:
    """Until Ctrl-C, or `seconds` when given."""
    try:
        if seconds is None:
            threading.Event().wait()
        else:
            time.sleep(seconds)
    except KeyboardInterrupt:
        click.echo("")


def _ledger_reports(ledger_url: str) -> int:
    """How many reports the demo's ledger holds (all subjects)."""
    import sqlalchemy as sa

    engine = sa.create_engine(ledger_url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT COUNT(*) FROM reports")).scalar_one())
    finally:
        engine.dispose()
