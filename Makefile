# kvoffload-lab: the two commands of the README are `make demo` and `make test`; everything else is a step.
# Both work on a fresh Debian 12 machine as root: they install the OS packages and a venv they need.

SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
STAMP := .make

# OS packages: the virtual lab (debootstrap, nspawn), static gates and integration tests (caddy: Debian's
# 2.6.2, the distribution option, whose defects they reproduce; the default Caddy comes from its wheel;
# node-exporter, systemd-analyze), molecule (podman), loop-device NVMe stand-ins, headless report check.
APT_PACKAGES := debootstrap systemd-container iproute2 openssh-client rsync caddy \
	prometheus-node-exporter systemd podman runc fuse-overlayfs slirp4netns uidmap \
	xfsprogs parted util-linux chromium

.PHONY: help deps venv lint unit integration lab molecule calibrate-torch test demo bench clean docs

help:
	@echo "make demo   run the demo campaign end to end on a virtual lab with the simulator"
	@echo "make test   install what is needed, lint, and run every test tier that this machine can run"
	@echo "make lint   ruff + mypy --strict (ansible-lint and yamllint run in the integration tier)"
	@echo "make unit | integration | lab | molecule   one test tier alone (after make deps)"
	@echo "make bench  run the benchmark scripts in bench/ (prints figures)"
	@echo "make docs   regenerate docs/campaign.md and docs/inventory.md from the config models"

$(STAMP)/apt:
	@mkdir -p $(STAMP)
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends $(APT_PACKAGES) >/dev/null; \
	else echo "not root or no apt-get: skipping OS packages ($(APT_PACKAGES))"; fi
	@touch $@

# The controller: this package with its extras, then the collections of requirements.yml. ansible-galaxy
# installs only those missing or too old (into ~/.ansible/collections); the `ansible` package of the dev
# extra ships both, so offline it finds them installed and contacts no Galaxy.
$(STAMP)/venv: pyproject.toml requirements.yml
	@mkdir -p $(STAMP)
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/ansible-galaxy collection install -r requirements.yml
	@touch $@

deps: $(STAMP)/apt $(STAMP)/venv

venv: $(STAMP)/venv

lint: venv
	$(BIN)/ruff check kvoffload tests bench plugins/modules plugins/filter
	$(BIN)/ruff format --check kvoffload tests bench plugins/modules plugins/filter
	$(BIN)/mypy --strict kvoffload

# The test tiers, each runnable alone once `make deps` has installed the OS packages and the venv
# (wall times measured on a fresh 2-core machine: README, "Tests"):
#   make unit          in-process, offline, no root
#   make integration   real processes on loopback (ansible-playbook, caddy, systemd-analyze, servers)
#   make lab           the virtual lab (root, nspawn): sim campaigns, faults, two nodes, real engines
#   make molecule      every role scenario in podman (root)
PYTEST := $(BIN)/pytest -q -ra

unit: venv
	$(PYTEST) tests/unit

integration: venv
	$(PYTEST) --durations=10 tests/integration

lab: deps
	$(PYTEST) --durations=10 tests/lab

molecule: deps
	$(PYTEST) --durations=10 tests/molecule

# CPU torch from the mirror (about 2 min, 0.9 GB): calibrate's torch tests then run (about 7 s) instead of skipping.
calibrate-torch: venv
	$(BIN)/pip install -q 'torch==2.13.0'

# `make test`: every tier at once, as lanes of one pytest process each (tests/support/lanes.py): most
# of the suite waits on engines, replays, ssh and containers, so the lanes overlap well on 2 cores. The
# lab image (and its podman import, for molecule) is built beside the venv, before the lanes need it.
test: $(STAMP)/apt
	@$(IMAGES) & images=$$!; \
	$(MAKE) --no-print-directory venv; venv=$$?; wait $$images; built=$$?; \
	if [ $$venv -ne 0 ] || [ $$built -ne 0 ]; then echo "make test: venv rc $$venv, lab images rc $$built"; exit 1; fi
	$(MAKE) --no-print-directory lint calibrate-torch
	$(PY) -m tests.support.lanes

# The lab's base image (debootstrap, about 75 s when not cached) needs only the OS packages and the
# standard library, so it builds with the system python3 while pip fills the venv, not after it.
IMAGE_BUILD := import logging; logging.basicConfig(level=logging.INFO, format="lab image: %(message)s"); \
	from kvoffload.lab.image import ensure_base_image; ensure_base_image()

# The lab image and its podman import for `make test`, where this machine can build them (root and
# the lab's tools); elsewhere the lab and molecule tests skip, saying why.
IMAGES := if [ "$$(id -u)" = 0 ] && command -v debootstrap >/dev/null; then \
	PYTHONPATH=$(CURDIR) python3 -c '$(IMAGE_BUILD); import shutil; from kvoffload.lab.image import ensure_podman_image; \
	shutil.which("podman") and ensure_podman_image()'; fi

demo: $(STAMP)/apt
	@PYTHONPATH=$(CURDIR) python3 -c '$(IMAGE_BUILD)' & image=$$!; \
	$(MAKE) --no-print-directory venv; venv=$$?; wait $$image; built=$$?; \
	if [ $$venv -ne 0 ] || [ $$built -ne 0 ]; then echo "make demo: venv rc $$venv, lab image rc $$built"; exit 1; fi
	$(BIN)/kvoffload-lab demo

bench: venv
	$(BIN)/python bench/replay_fidelity.py
	$(BIN)/python bench/ingest_speed.py
	$(BIN)/python bench/sim_ttft.py
	$(BIN)/python bench/caddy_body_race.py
	$(BIN)/python bench/interval_coverage.py   # about 19 min: 10 small campaigns on the simulator
	@if [ -d results/demo/cells ]; then $(BIN)/python bench/campaign_overhead.py results/demo; \
	$(BIN)/python bench/watch_poll.py results/demo; \
	else echo "bench/campaign_overhead.py, bench/watch_poll.py: no results/demo yet (run make demo first)"; fi

# docs/campaign.md and docs/inventory.md, written from the config models (kvoffload/cli/keydoc.py);
# tests/unit/cli/test_keydoc.py fails until they are regenerated after a model changes.
docs: venv
	$(PY) -m kvoffload.cli.keydoc --write
	$(PY) -m tests.support.role_readme

clean:
	rm -rf $(STAMP) $(VENV) .mypy_cache .ruff_cache .pytest_cache
