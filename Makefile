# Every target sets up what it needs on a fresh machine: only python3.11 must exist.
#   make run                         embedded Postgres + Valkey, web, worker, beat (Ctrl-C stops all)
#   make test [PYTEST_ARGS="..."]    the test suite, against embedded servers unless DATABASE_URL/REDIS_URL are set,
#                                    in two pytest-xdist workers; TEST_WORKERS=0: in one process
#   make test-fast                   the suite without end-to-end tests (-m "not slow")
#   make lint                        ruff (lint and format), lint-imports (.importlinter), mypy (mypy.ini)
#   make cli-api-types               regenerates the CLI's API types (cli/trainyard/apitypes.py) from frontend/openapi.yaml

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Installed editable: runner/ and spec/ (what the server imports), cli/ and the
# example provider plugin (what the tests drive).
PYPROJECTS := $(wildcard runner/pyproject.toml spec/pyproject.toml cli/pyproject.toml tests/plugins/trainyard-example-cluster/pyproject.toml)
EDITABLES := $(patsubst %/pyproject.toml,-e %/,$(PYPROJECTS))
PYTEST_ARGS ?=
# The suite runs in this many xdist workers, a test file each at a time (tests/support/parallel.py);
# 0 runs one process (decision 0068). Slow files are handed out first (tests/support/parallel.py).
TEST_WORKERS ?= 2
TEST_WORKERS_ARGS := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

.PHONY: run test test-fast services lint frontend clean-data

run: $(STAMP) frontend
	$(PY) -m backend.embedded run

test: $(STAMP) frontend frontend-test test-packages
	$(PY) -m backend.embedded test -- $(TEST_WORKERS_ARGS) $(PYTEST_ARGS)

# The benchmark (bench/README.md): its own embedded servers and stack in a temp dir. BENCH_ARGS="--json out.json".
# The dashboard is built first: the log-viewer part opens it in Chromium.
.PHONY: bench
bench: $(STAMP) frontend
	$(PY) bench/run.py $(BENCH_ARGS)

test-fast: $(STAMP) frontend
	$(PY) -m backend.embedded test -- $(TEST_WORKERS_ARGS) -m "not slow" $(PYTEST_ARGS)

services: $(STAMP)
	$(PY) -m backend.embedded services

lint: $(STAMP)
	$(PY) -m ruff check backend cli runner spec tests bench
	$(PY) -m ruff format --check backend cli runner spec tests bench
	$(VENV)/bin/lint-imports --no-logo
	DATABASE_URL=$${DATABASE_URL:-postgresql://lint@127.0.0.1/lint} REDIS_URL=$${REDIS_URL:-redis://127.0.0.1:1} $(PY) -m mypy

# The dashboard: node_modules from the lock file (npm ci only when it changed),
# dist/ rebuilt only when a source changed. Needs node >= 20.19 and npm.
NODE_STAMP := frontend/node_modules/.installed
FRONTEND_SOURCES := $(shell find frontend/src -type f 2>/dev/null) frontend/index.html frontend/vite.config.ts frontend/tsconfig.json

frontend: frontend/dist/index.html

frontend/dist/index.html: $(NODE_STAMP) $(FRONTEND_SOURCES)
	cd frontend && npm run build --silent

$(NODE_STAMP): frontend/package.json frontend/package-lock.json
	@command -v npm >/dev/null 2>&1 || { echo "error: npm not found. The dashboard needs Node.js >= 20.19 with npm (Debian: apt-get install nodejs npm)." >&2; exit 1; }
	cd frontend && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

# The Debian packages the end-to-end tests drive: haproxy, the load balancer in
# front of two web processes (tests/e2e/test_scale_out.py), and chromium, the
# browser of the dashboard tests (tests/e2e/test_dashboard.py); and libfaketime,
# the clock of a worker set ahead (tests/clouds/test_clock_skew.py); the stock
# OpenSSH client (openssh-client: ssh, scp, sftp) and rsync, which the tests of
# SSH into a job drive (tests/runner/test_sessions_ssh.py); and a font with
# CJK glyphs, for the browser terminal's screenshots (tests/e2e/test_access_terminal.py).
# Installed when missing and running as root (CI); otherwise a message naming the package.
DEBIAN_TEST_PACKAGES := haproxy chromium
LIBFAKETIME := /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1
CJK_FONT := /usr/share/fonts/truetype/droid/DroidSansFallbackFull.ttf
.PHONY: test-packages
test-packages:
	@missing=""; for p in $(DEBIAN_TEST_PACKAGES); do \
	  command -v $$p >/dev/null 2>&1 || [ -x /usr/sbin/$$p ] || missing="$$missing $$p"; done; \
	[ -e $(LIBFAKETIME) ] || missing="$$missing libfaketime"; \
	for c in ssh scp sftp; do command -v $$c >/dev/null 2>&1 || { missing="$$missing openssh-client"; break; }; done; \
	command -v rsync >/dev/null 2>&1 || missing="$$missing rsync"; \
	[ -e $(CJK_FONT) ] || missing="$$missing fonts-droid-fallback"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian packages the tests need:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	  else \
	    echo "error: the tests need the Debian package(s)$$missing (the end-to-end tests run haproxy and Chromium; libfaketime sets a clock ahead; the SSH tests run ssh, scp, sftp and rsync; the terminal's screenshots show CJK text)." >&2; \
	    echo "       install them as root: apt-get install$$missing" >&2; \
	    exit 1; \
	  fi; \
	fi

# Component tests of the dashboard (Vitest); `make test` runs them before pytest.
.PHONY: frontend-test
frontend-test: $(NODE_STAMP)
	cd frontend && npm test --silent

$(PY):
	@command -v $(PYTHON) >/dev/null 2>&1 || { \
	  echo "error: $(PYTHON) not found. Trainyard needs Python 3.11: install python3.11 (and python3.11-venv)," >&2; \
	  echo "       or point make at it: make PYTHON=/path/to/python3.11 ..." >&2; \
	  exit 1; }
	$(PYTHON) -m venv $(VENV)

# Re-installs only when requirements.txt or a pyproject.toml changed (or the venv is new).
$(STAMP): $(PY) requirements.txt requirements-server.txt $(PYPROJECTS)
	$(PY) -m pip install -r requirements.txt $(EDITABLES)
	@touch $@

# The CLI's API types (cli/trainyard/apitypes.py), generated from the committed
# OpenAPI schema as the dashboard's are (frontend: npm run gen-api);
# tests/cli/test_apitypes.py fails while they disagree.
.PHONY: cli-api-types
cli-api-types: $(STAMP)
	$(PY) cli/scripts/gen_apitypes.py

# Removes the embedded servers' data (database, queue) of `make run` and `make test`.
clean-data:
	rm -rf .trainyard-data
