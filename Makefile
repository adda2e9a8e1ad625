# gpubox.inference: the two commands a user needs, and the pieces of `make test`.
#
#   make provision LIMIT=gpu-box   bootstrap a venv, then ansible-playbook site.yml -l gpu-box
#   make test                      install what the tests need and run them all
#
# Venvs live outside the checkout, keyed by the hash of the lock files
# (scripts/venv.sh); the Molecule test image is tagged by the hash of its
# recipe (scripts/test-image.sh). A second run reuses both.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

LIMIT ?= gpu-box
ARGS ?=
COLLECTION_LINK := .collections/ansible_collections/gpubox/inference
RUN_VENV = $(shell scripts/venv.sh run)
TEST_VENV = $(shell scripts/venv.sh test)

.PHONY: help setup provision test deps lint sanity unit integration molecule bench bench-proxy bench-vllm-start bench-vllm-spin build clean

help:
	@sed -n 's/^#   //p' Makefile

## Link this checkout as gpubox.inference where ansible.cfg looks for collections.
setup: $(COLLECTION_LINK)
$(COLLECTION_LINK):
	mkdir -p $(dir $@)
	ln -sfn ../../.. $@

provision: setup
	PATH="$(RUN_VENV)/bin:$$PATH" ansible-playbook site.yml -l "$(LIMIT)" $(ARGS)

# Each phase timed (scripts/phases.sh); the table at the end, or where a phase fails. Molecule's `local` scenario
# (one box, one Ansible run at a time: under half of the two CPUs, measured) runs beside lint, sanity and unit, which
# touch no Docker; the phases that start servers of their own (integration, molecule-site) run alone after it.
test: setup
	@scripts/phases.sh reset
	@scripts/phases.sh run deps $(MAKE) --no-print-directory deps
	@scripts/phases.sh start molecule-local $(MAKE) --no-print-directory molecule SCENARIO=local
	@scripts/phases.sh run lint $(MAKE) --no-print-directory lint
	@scripts/phases.sh run sanity $(MAKE) --no-print-directory sanity
	@scripts/phases.sh run unit $(MAKE) --no-print-directory unit
	@scripts/phases.sh wait molecule-local
	@scripts/phases.sh run integration $(MAKE) --no-print-directory integration
	@scripts/phases.sh run molecule-site $(MAKE) --no-print-directory molecule SCENARIO=site
	@scripts/phases.sh table
	@echo "make test: all gates passed"

## Host tools, Docker engine + Compose v2, the Molecule, vLLM and Ray test images, the test venv.
deps: setup
	scripts/host-tools.sh
	scripts/docker-engine.sh
	scripts/test-image.sh >/dev/null
	scripts/vllm-test-image.sh >/dev/null
	scripts/ray-test-image.sh >/dev/null
	@echo "test venv: $(TEST_VENV)"

lint: setup
	PATH="$(TEST_VENV)/bin:$$PATH" yamllint --strict .
	PATH="$(TEST_VENV)/bin:$$PATH" ruff check .
	PATH="$(TEST_VENV)/bin:$$PATH" ruff format --check .
	PATH="$(TEST_VENV)/bin:$$PATH" ansible-lint

sanity: setup
	PATH="$(TEST_VENV)/bin:$$PATH" scripts/sanity.sh

# The pure tests (no Docker, Nginx, vLLM, Ray, systemd or network): a developer's loop, under 3 minutes, Docker or not.
unit: setup
	PATH="$(TEST_VENV)/bin:$$PATH" python -m pytest -n 2 --dist loadfile --durations=15 tests/unit

# The tests that start real parts, a file per worker on two workers, in the order tests/conftest.py collects them (the
# files that deploy vLLM servers of their own first). TESTS=path narrows it to one file or folder.
TESTS ?= tests/integration
integration: setup
	PATH="$(TEST_VENV)/bin:$$PATH" python -m pytest -n 2 --dist loadfile --no-loadscope-reorder --durations=15 $(TESTS)

# The boxes' Docker starts empty each run (their /var/lib/docker are named volumes); the
# vLLM image comes in from the archive, as on a box without a registry.
# Scenarios: site (the fleet, driven from this machine) and local (the README's quick start on the box itself,
# which installs the run venv from the wheels of requirements.txt). SCENARIO=local runs one alone.
SCENARIO ?= --all
molecule: setup
	docker volume rm --force gpubox-molecule-docker gpubox-molecule-docker-b gpubox-molecule-docker-local >/dev/null 2>&1 || true
	PATH="$(TEST_VENV)/bin:$$PATH" PY_COLORS=0 ANSIBLE_FORCE_COLOR=0 NO_COLOR=1 \
	  GPUBOX_TEST_IMAGE="$$(scripts/test-image.sh)" \
	  GPUBOX_VLLM_ARCHIVE="$$(scripts/vllm-test-image.sh --archive)" \
	  GPUBOX_VLLM_TAG="$$(scripts/vllm-test-image.sh --name | cut -d: -f2)" \
	  GPUBOX_RUN_WHEELS="$$(scripts/venv.sh wheels)" \
	  molecule test $(if $(filter --all,$(SCENARIO)),--all,--scenario-name $(SCENARIO))

## Benchmarks print numbers (README: Benchmarks); they are not part of make test.
bench: setup
	PATH="$(TEST_VENV)/bin:$$PATH" python scripts/bench_p2p_facts.py

bench-proxy: setup
	PATH="$(TEST_VENV)/bin:$$PATH" python scripts/bench_proxy.py

bench-vllm-start: setup
	PATH="$(TEST_VENV)/bin:$$PATH" python scripts/bench_vllm_start.py $(ROUNDS)

bench-vllm-spin: setup
	PATH="$(TEST_VENV)/bin:$$PATH" python scripts/bench_vllm_spin.py $(ROUNDS)

build: setup
	PATH="$(TEST_VENV)/bin:$$PATH" ansible-galaxy collection build --force --output-path build/

clean:
	rm -rf .collections build .pytest_cache .ruff_cache
