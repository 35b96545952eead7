# Mosaic: `make run` starts a server, `make test` runs every test. Both install what they need.

SHELL := /bin/bash
# The cargo target directory lives outside the clone so that CI and later builds reuse it
# (RocksDB alone takes about 15 minutes to build on 2 cores).
CARGO_TARGET_DIR ?= $(shell if [ -w /var/cache ]; then echo /var/cache/mosaic-target; else echo $$HOME/.cache/mosaic/target; fi)
export CARGO_TARGET_DIR
# The Python venv for the client tests (boto3, pytest) lives outside the clone too.
VENV ?= $(shell if [ -w /var/cache ]; then echo /var/cache/mosaic-venv; else echo $$HOME/.cache/mosaic/venv; fi)
CARGO ?= cargo
MOSAIC := $(CARGO_TARGET_DIR)/release/mosaic

.PHONY: run test deps build lint unit clients manifests s3tests s3tests-full fmt prune

run: deps build
	$(MOSAIC) server

build:
	$(CARGO) build --release -p mosaic
	@mkdir -p bin && ln -sf $(MOSAIC) bin/mosaic

deps:
	@scripts/install-deps.sh

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --release --workspace --all-targets -- -D warnings

unit:
	$(CARGO) test --release --workspace

# Real clients against a real server process: boto3 (its defaults), the aws cli, rclone.
clients: build
	@scripts/client-deps.sh $(VENV)
	MOSAIC_BIN=$(MOSAIC) $(VENV)/bin/pytest -q -p no:cacheprovider tests/python

# The Kubernetes manifests against the API schemas (offline: kubernetes-validate bundles them), strictly.
manifests:
	@scripts/client-deps.sh $(VENV)
	$(VENV)/bin/kubernetes-validate --strict --quiet deploy/kubernetes/*.yaml

# ceph/s3-tests: the tests in tests/s3-tests/passing.txt must pass (a regression fails `make test`).
s3tests: build
	scripts/s3-tests.sh gate

# Every test of test_s3.py (about 12 minutes); `make s3tests-full UPDATE=--update` rewrites the passing list.
s3tests-full: build
	scripts/s3-tests.sh full $(UPDATE)

# Superseded test executables (RocksDB linked into each) are removed first, so the target directory
# outside the clone stays bounded across runs.
prune:
	@scripts/prune-target.sh

test: deps prune lint unit clients manifests s3tests
	@echo "make test: all checks passed"

fmt:
	$(CARGO) fmt --all
