# bexmatch developer entry points. Everything runs in ./.venv, which is
# (re)built from pyproject.toml whenever that file changes.
#
#   make run   [ARGS=...]          the Spark main job (local Spark, generated workload)
#   make test  [PYTEST_ARGS=...]   the test suite, e.g. PYTEST_ARGS='-m "not slow"'
#              [TEST_WORKERS=N]    over N processes (pytest-xdist; 2 by default, 0 for one process)
#   make bench [ARGS=...]          benchmarks on the CPU backend
#   make bench-gpu [ARGS=...]      W1-W4, every cuda algorithm on cpu and cuda, and the ratios (needs a GPU)
#   make clean                     remove the venv and every build or run output

PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Extras installed into the venv (see [project.optional-dependencies]).
EXTRAS ?= spark,test
PIP_FLAGS ?= --quiet --disable-pip-version-check

ARGS ?=
PYTEST_ARGS ?=
# pytest-xdist worker processes for `make test` (each starts its own local Spark when it runs a Spark test;
# work stealing: an idle worker takes tests queued for the other, so a long test at the end idles no core)
TEST_WORKERS ?= 2

# Spark needs a Java runtime (Spark 4: Java 17). Use JAVA_HOME when set, else
# the JDK behind the `java` on PATH.
ifeq ($(strip $(JAVA_HOME)),)
JAVA_BIN := $(shell command -v java 2>/dev/null)
ifneq ($(JAVA_BIN),)
JAVA_HOME := $(patsubst %/bin/java,%,$(shell readlink -f $(JAVA_BIN)))
endif
endif
ifneq ($(strip $(JAVA_HOME)),)
export JAVA_HOME
endif
# Spark's Python workers must run the venv's interpreter, not the system one.
export PYSPARK_PYTHON := $(CURDIR)/$(VPY)
export PYSPARK_DRIVER_PYTHON := $(CURDIR)/$(VPY)

.PHONY: all venv run test bench bench-gpu clean

all: test

venv: $(STAMP)

$(STAMP): pyproject.toml
	@echo ">> building $(VENV) from pyproject.toml (extras: $(EXTRAS))"
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install $(PIP_FLAGS) --upgrade pip
	$(VPY) -m pip install $(PIP_FLAGS) -e '.[$(EXTRAS)]'
	@touch $@

run: $(STAMP)
	$(VENV)/bin/bexmatch run $(ARGS)

test: $(STAMP)
	$(VPY) -m pytest -q -n $(TEST_WORKERS) $(if $(filter-out 0,$(TEST_WORKERS)),--dist worksteal) $(PYTEST_ARGS)

bench: $(STAMP)
	$(VENV)/bin/bexmatch bench $(ARGS)

bench-gpu: $(STAMP)
	$(VPY) -m engine.bench.gpu $(ARGS)

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis \
		spark-warehouse metastore_db derby.log out bexmatch-data bexmatch-out notebooks/figures
	find . -path ./.git -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
