# sparkops: the two commands a newcomer needs are `make sim` and `make test`.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export PYTHONUNBUFFERED := 1

.PHONY: help venv sim sim-up sim-down sim-destroy test lint unit molecule integration syntax bench-weights changelog collection-checks

help:
	@echo "make sim       - build the simulated two-Spark cluster and run site.yml against it"
	@echo "make sim-down  - remove the simulated cluster (nodes, networks, volumes)"
	@echo "make test      - lint, unit tests, molecule on the simulated cluster, integration tests"

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test,sim]'
	touch $@

venv: $(VENV)/.installed

sim-up: venv
	$(PY) sim/simctl.py up

sim: sim-up
	ansible-playbook site.yml -i inventory/sim
	@echo
	@echo "Simulated cluster serving (a vLLM TEST DOUBLE behind a real Ray cluster):"
	@sed -n 's/^| \(endpoint\|API key\|healthy\) | \(.*\) |$$/  \1: \2/p' .sim/reports/health.md
	@echo "  report: $(CURDIR)/.sim/reports/health.md"

sim-down:
	python3 sim/simctl.py down

sim-destroy:
	python3 sim/simctl.py down --all

lint: venv
	tests/run-stages.sh lint

unit: venv
	tests/run-stages.sh unit

test: venv
	tests/run-stages.sh all

# Not part of `make test`: a benchmark prints ratios measured in one run; it never gates CI.
bench-weights: venv
	$(PY) benchmarks/weight_sync.py --gib 2

# CHANGELOG.md is generated (antsibull-changelog) from changelogs/fragments/: this
# previews the coming release (the version in galaxy.yml) in a scratch copy, so the
# fragments stay until `antsibull-changelog release` at release time.
changelog: venv
	antsibull-changelog lint
	@scratch=$$(mktemp -d) && trap 'rm -rf "$$scratch"' EXIT && \
	git ls-files -co --exclude-standard -z | xargs -0 cp -P --parents -t "$$scratch" && \
	version=$$($(PY) -c 'import yaml; print(yaml.safe_load(open("galaxy.yml"))["version"])') && \
	(cd "$$scratch" && antsibull-changelog release --version "$$version") && \
	cp "$$scratch/CHANGELOG.md" CHANGELOG.md && echo "CHANGELOG.md: $$version (unreleased) from changelogs/fragments/"

# The collection as a user installs it (tests/collection-checks.sh): build, install
# next to only the declared dependencies, syntax by FQCN, docs, sanity, units.
collection-checks: venv
	tests/collection-checks.sh install
	tests/collection-checks.sh syntax
	tests/collection-checks.sh docs
	tests/collection-checks.sh sanity
	tests/collection-checks.sh units
