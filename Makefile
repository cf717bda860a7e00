# The two commands of the README: `make demo` and `make test`. Both create .venv, install the pinned dependencies
# (requirements.lock) and make Spark's class-data archive (worker/spark_class_cache.py) on first use.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.lock requirements-scylla.lock pyproject.toml | cksum | cut -d' ' -f1)
PROTO_GEN = $(PYTHON) -m grpc_tools.protoc -Iproto --python_out=$(1) --pyi_out=$(1) --grpc_python_out=$(1) proto/vbcpb/vbc.proto

.PHONY: venv test test-fast lint demo proto check-proto bench soak clean

venv: $(STAMP)

$(STAMP): requirements.lock requirements-scylla.lock pyproject.toml
	test -x $(PYTHON) || $(PY) -m venv $(VENV)
	$(PYTHON) -m pip install -q --disable-pip-version-check -r requirements.lock
	$(PYTHON) -m pip install -q --disable-pip-version-check --no-deps --upgrade --target $(VENV)/scylla-driver \
	  -r requirements-scylla.lock
	$(PYTHON) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	@echo "making the Spark class-data archive of this installation (about a minute, once)"
	$(PYTHON) -m vbc spark-archive || echo "no class-data archive yet: the nodes' first driver JVM makes it"
	rm -f $(VENV)/.installed-* && touch $@

# Everything: the layer contract, the generated code check, then every test (real processes included).
test: lint check-proto
	$(PYTHON) -m pytest -q -p no:cacheprovider

# The inner loop: every test that starts no node process (pure core, adapters in-process, fakes), the simulations'
# schedules shortened (`make test` runs them at full length too). Four workers on two cores, each taking the next
# test when it is free (worksteal): many of these tests wait (Raft elections, child processes, gRPC deadlines) as
# much as they compute, and one that waits must not hold back a queue of computing ones. Bytecode is cached even where
# the environment says not to: each worker would otherwise compile every module it collects, on every run.
test-fast: venv
	PYTHONDONTWRITEBYTECODE= $(PYTHON) -m pytest -q -p no:cacheprovider -m "not integration and not deep" -n 4 --dist worksteal

# The layer order (pyproject.toml [tool.importlinter]): a lower layer importing a higher one fails.
lint: venv
	$(VENV)/bin/lint-imports --no-cache

demo: venv
	$(PYTHON) -m vbc.demo

proto: venv
	$(call PROTO_GEN,.)

check-proto: venv
	@tmp=$$(mktemp -d) && $(call PROTO_GEN,$$tmp) && \
	  for f in vbc_pb2.py vbc_pb2.pyi vbc_pb2_grpc.py; do \
	    cmp -s $$tmp/vbcpb/$$f vbcpb/$$f || { echo "vbcpb/$$f is stale: run 'make proto'"; rm -rf $$tmp; exit 1; }; \
	  done; rm -rf $$tmp; echo "generated protobuf code is up to date"

bench: venv
	$(PYTHON) bench/write_path.py

# A soak test, not part of `make test`: MINUTES (default 10) of seeded random writes, DDL and topology changes on a
# real 3-4 node cluster, then exact checks (bench/soak.py). SEED defaults to a random one, printed with the result.
soak: venv
	$(PYTHON) bench/soak.py --minutes $(or $(MINUTES),10) $(if $(SEED),--seed $(SEED))

clean:
	rm -rf $(VENV)
