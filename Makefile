# The two commands of the README: `make run` and `make test`. Each builds .venv from requirements.txt.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-security browser lint bench bench-quality bench-search bench-ingest bench-mcp clean-test-data

$(STAMP): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $(STAMP)

run: $(STAMP)
	$(PY) manage.py kb_run

test: $(STAMP) browser
	$(PY) -m ruff check .
	$(PY) -m pytest

# The attack families of README "Security": real server, hostile headers, bombs.
test-security: $(STAMP)
	$(PY) -m pytest tests/security tests/faults

# Debian's Chromium drives the admin's browser test; install it when missing and we may.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		(DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 || \
		 (apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1)); } || \
		echo "chromium is not installed: the browser test will fail; install Debian's chromium package"

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

bench: bench-ingest bench-quality bench-search bench-mcp

bench-ingest: $(STAMP)
	$(PY) bench/ingest.py

bench-quality: $(STAMP)
	$(PY) bench/quality.py

bench-search: $(STAMP)
	$(PY) bench/search.py

bench-mcp: $(STAMP)
	$(PY) bench/mcp.py

clean-test-data:
	rm -rf var/test
