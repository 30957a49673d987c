# compbench: the README's commands. `make train` and `make test` set everything up on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.setup-done

.PHONY: setup train test test-fast test-slow lint clean

# Re-run the installs only when the package definition changes (second run: no installs).
$(STAMP): pyproject.toml scripts/build_horovod.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -e '.[dev]'
	PYTHON=$(PY) bash scripts/build_horovod.sh
	touch $(STAMP)

setup: $(STAMP)

train: setup
	$(VENV)/bin/compbench train $(ARGS)

# The fast and distributed tiers (and the GPU tier, skipped without CUDA); `test-slow` runs the
# long end-to-end runs and the wall-clock checks that a loaded machine can fail.
test: setup
	$(PY) -m pytest -q -m "not slow" $(ARGS)

test-fast: setup
	$(PY) -m pytest -q -m "not dist and not slow" $(ARGS)

test-slow: setup
	$(PY) -m pytest -q -m slow $(ARGS)

lint: setup
	$(VENV)/bin/ruff check src tests scripts

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
