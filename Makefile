# The two quickstart commands: `make demo` and `make test`. Each creates .venv and
# installs what it needs (pinned through constraints.txt), so a fresh machine with
# Python 3.10+ needs nothing else prepared.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt
DEPS := pyproject.toml setup.py constraints.txt

.PHONY: demo test test-js lint docs proto bench-quick clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip

# The demo needs the collector and aggregator roles (and the dashboard, for --dashboard).
$(VENV)/.demo-installed: $(BIN)/python $(DEPS)
	$(PIP) -e '.[dashboard]'
	touch $@

# Tests need every role (training included) and the dev tools.
$(VENV)/.test-installed: $(BIN)/python $(DEPS)
	$(PIP) -e '.[all]'
	touch $@ $(VENV)/.demo-installed

demo: $(VENV)/.demo-installed
	$(BIN)/fedldp demo $(ARGS)

# Everything, on every core (pytest-xdist; an idle worker takes queued tests from a busy
# one, so the long tests do not leave a core idle at the end), with the 25 slowest listed
# at the end so a regression shows in CI's output. ARGS='-n 0' runs it in one process.
test: $(VENV)/.test-installed
	$(BIN)/python -m pytest -n auto --dist worksteal --durations=25 $(ARGS)

# The TypeScript SDK (sdk/js): dependencies from the lock file, then tsc, the browser
# bundles and node --test (its collector tests drive this checkout's .venv/bin/fedldp;
# its browser tests /usr/bin/chromium, skipped with a message when it is missing).
test-js: $(VENV)/.test-installed
	cd sdk/js && npm ci --no-audit --no-fund && npm test

lint: $(VENV)/.test-installed
	$(BIN)/ruff check .
	$(BIN)/python scripts/typecheck.py
	$(BIN)/python scripts/docstring_coverage.py
	$(BIN)/python scripts/function_length.py

# The sh examples of README.md and docs/*.md, run as written (scripts/check_docs.py),
# and docs/architecture.md's module table against the tree (scripts/module_table.py).
docs: $(VENV)/.test-installed
	$(BIN)/python scripts/module_table.py --check
	$(BIN)/python scripts/check_docs.py

proto: $(VENV)/.test-installed
	$(BIN)/python scripts/gen_proto.py

# Every bench/ script in its --quick mode (each under a minute), its figures as JSON
# in $(BENCH_OUT)/NAME.json. None is left out: the list is bench/*.py itself (less the
# shared modules whose names start with _), and tests/test_benchmarks.py checks each takes --quick and --json.
# The peer libraries (the `bench` extra) and Spark are optional: a script whose
# reference is not installed says so and measures the rest.
BENCH_OUT ?= bench/results/quick
BENCHES := $(filter-out _%,$(basename $(notdir $(wildcard bench/*.py))))
bench-quick: $(VENV)/.test-installed
	mkdir -p $(BENCH_OUT)
	for b in $(BENCHES); do $(BIN)/python -m bench.$$b --quick --json $(BENCH_OUT)/$$b.json || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info fedldp-demo
