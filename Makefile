# The two set-up commands of the README.  Each creates .venv if missing and installs what it needs.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-test
RUN_STAMP := $(VENV)/.installed
# The C modules are built by the editable install: a changed C source rebuilds them too.
DEPS   := pyproject.toml setup.py $(wildcard proto/*/*/*.proto proto/*/*/*/*.proto) \
          $(wildcard dis/disd/*/*.c dis/disd/*/*.h)

.PHONY: test run install bench clean jar dist lint typecheck

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# `make run` needs only the project itself; `make test` adds the test extra.
$(RUN_STAMP): $(PY) $(DEPS)
	$(PY) -m pip install -q -e .
	touch $(RUN_STAMP)

$(STAMP): $(PY) $(DEPS)
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP) $(RUN_STAMP)

install: $(STAMP)

# The JVM Spark reader (jvm/ -> dis/disd/spark/jars/dis-spark.jar): rebuilt when its sources or
# PySpark's version change, else a no-op.  Needs a JDK 17 (javac): without one this fails here.
jar: $(STAMP)
	$(PY) jvm/build.py --require

# dist/: the source distribution and a wheel built from it (PyPA's `build`, isolated), carrying the
# JVM reader's jar (compiled against this venv's PySpark, whose Spark and Scala versions its
# manifest names) and the C modules.  Both are required here: without javac or gcc this fails.  A
# machine with a Java runtime but neither compiler installs the wheel and gets both (README.md,
# "Deploy").
dist: $(STAMP)
	rm -rf dist
	DIS_REQUIRE_JAR=1 DIS_REQUIRE_C_MODULES=1 \
	DIS_PYSPARK_HOME="$$($(PY) -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')" \
	$(PY) -m build --outdir dist .

# ruff over the whole project ([tool.ruff] in pyproject.toml: the generated gRPC modules are left
# out); `make test` runs it first, so a lint error fails the tests before they start.
lint: $(STAMP)
	$(VENV)/bin/ruff check .

# mypy over `disd` ([tool.mypy] in pyproject.toml; strict for storage, binlog, blocks, server).  The
# tailer's source (tailer/) installs as `disd.tailer`: a link makes it so for mypy too.  stubtest
# holds the C modules' stubs (the .pyi beside their sources) to the modules as built.
C_MODULES := disd.storage.ingestcore disd.storage.newlocation disd.storage.batchwrite \
             disd.storage.lastbyindex disd.binlog.rowencode disd.kafka.rdbatch
typecheck: $(STAMP)
	mkdir -p build/typecheck/disd
	ln -sfn ../../../tailer build/typecheck/disd/tailer
	$(PY) -m mypy
	MYPYPATH=dis $(PY) -m mypy.stubtest --mypy-config-file pyproject.toml $(C_MODULES)

test: $(STAMP) jar lint typecheck
	$(PY) -m pytest -q $(PYTEST_ARGS)

run: $(RUN_STAMP)
	$(VENV)/bin/dis demo

bench: $(STAMP) jar
	for b in bench/*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) var build dist *.egg-info
