# The two commands of the quick start: `make train` and `make test`.
# Each creates (or reuses) a virtual environment in .venv and installs the
# pinned, tested versions from constraints.txt before it runs.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: install train test learn bench lint format docs proto constraints clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-compile -c constraints.txt -e '.[dev]'
	@# The bytecode, compiled on every core (pip compiles one file at a time: 88 s against
	@# 40 + 30 on 2 cores). A file written for another Python fails, as it does under pip.
	$(PY) -m compileall -q -j 0 $(VENV)/lib > /dev/null || true
	touch $(STAMP)

# Train the default agent: MonoBeast on PongNoFrameskip-v4 with the default flags.
train: $(STAMP)
	$(PY) -m torchbeast.monobeast --env PongNoFrameskip-v4 $(ARGS)

# The whole test suite; .ci/run calls exactly this. The tests run in pytest-xdist workers,
# one per core (most of a test's time is processes starting and waiting on each other;
# the tests of one shared run on one worker, see tests/conftest.py), then those that start Ray one after another (`-m ray`, see tests/conftest.py). ARGS
# narrows both, e.g. ARGS=tests/test_envs.py.
test: $(STAMP)
	$(PY) -m ruff check torchbeast tests
	$(PY) -m ruff format --check torchbeast tests
	$(PY) -m pytest -n auto --dist loadgroup -m "not ray" $(ARGS) || [ $$? -eq 5 ]  # 5: none selected
	$(PY) -m pytest -m ray $(ARGS) || [ $$? -eq 5 ]

# Learning checks: short runs (PixelCue, CartPole, CartPole with LASER, MinAtar Breakout) each
# printed against its band, about 13 minutes on 2 cores; ARGS=pong-early runs Pong's (~21 min).
learn: $(STAMP)
	$(PY) -m torchbeast.learncheck $(ARGS)

bench: $(STAMP)
	$(PY) -m torchbeast.bench $(ARGS)

lint: $(STAMP)
	$(PY) -m ruff check torchbeast tests

format: $(STAMP)
	$(PY) -m ruff format torchbeast tests
	$(PY) -m ruff check --fix torchbeast tests

# Regenerate the manual's tables from the parsers, then build the manual into site/ (strict:
# a broken link or anchor fails).
docs: $(STAMP)
	$(PY) -m torchbeast.docs
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet

# Regenerate the gRPC modules from the .proto (a test fails when they are stale).
proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -I . --python_out=. --grpc_python_out=. \
		torchbeast/runtime/poly/polybeast.proto

constraints: $(STAMP)
	$(PY) -m pip freeze --exclude-editable | sed 's/+cpu//' > constraints.txt

clean:
	rm -rf $(VENV) build site *.egg-info
