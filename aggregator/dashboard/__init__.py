"""`fedldp dashboard`: a read-only analyst web page over the collector's statistics.

`source` opens the ledger read-only, `model` computes the views with the
report functions of `fedldp.aggregator.reports`, `svg` draws the charts on the
server, `pages` renders HTML, `app` is the Starlette application and its
uvicorn server (see docs/dashboard.md).
"""
