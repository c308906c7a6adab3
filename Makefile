# sparkops: the two commands a newcomer needs are `make sim` and `make test`.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export PYTHONUNBUFFERED := 1

.PHONY: help venv sim sim-up sim-down sim-destroy sim-info test lint unit mutation molecule integration syntax bench-weights \
	status verify benchmark upgrade teardown doctor changelog collection-checks

# Day-2 targets run against INVENTORY (the simulated cluster unless told otherwise):
#   make status INVENTORY=inventory/two-sparks    make upgrade ARGS='-e spark_vllm_image_ref=sim-v2'
INVENTORY ?= inventory/sim
ARGS ?=

help:
	@echo "Setup and the simulated cluster (needs make, python3-venv; root on Debian 12 / Ubuntu 24.04):"
	@echo "  make sim          - build the simulated two-Spark cluster and run site.yml (~7 min cold, ~2 min warm)"
	@echo "  make sim-up       - only (re)start the simulated nodes, without site.yml (~1 min warm)"
	@echo "                     SIM_NODES=4 SIM_TOPOLOGY=ring|switch (sim, sim-up): a bigger cluster, its inventory in .sim/inventories/"
	@echo "  make sim-info     - print the endpoint, the served model name, the key file and a curl to try"
	@echo "  make sim-down     - remove the nodes, networks and volumes; keeps dockerd, the images and .sim/"
	@echo "  make sim-destroy  - sim-down, and also remove the cached images (~860 MB) and .sim/"
	@echo "Day 2, against INVENTORY=$(INVENTORY) (extra ansible-playbook arguments in ARGS='...'):"
	@echo "  make status       - one screen: nodes, driver, image, Ray membership, endpoint (~20 s)"
	@echo "  make verify       - network, Ray membership, fast path and endpoint checks; changes nothing (~1 min)"
	@echo "  make benchmark    - capacity sweep 1,2,4,8,... to the SLO, JSON/Markdown/PNG report (~6 min on the sim)"
	@echo "  make upgrade      - new image ref/profile/driver with rollback; e.g. ARGS='-e spark_vllm_image_ref=sim-v2' (~4 min)"
	@echo "  make teardown     - stop vLLM and Ray (images and weights stay); make sim brings them back (~10 s; ~90 s back)"
	@echo "  make doctor       - one verdict per check (PASS/WARN/CRITICAL) with the next action (~1 min)"
	@echo "Checks:"
	@echo "  make lint         - ruff, yamllint, ansible-lint, syntax checks"
	@echo "  make unit         - unit tests"
	@echo "  make mutation     - mutation check of the pure logic: score and surviving mutants per module (not in make test;"
	@echo "                     MODULES='plugins/module_utils/nccl_log.py ...' MUTATION_ARGS='--sample 60')"
	@echo "  make test         - lint, unit tests, collection checks, molecule and integration tests on the simulated cluster, a 4-node ring (~55 min on 2 cores)"
	@echo "  make collection-checks - build, install next to only the declared collections, syntax by FQCN, docs, sanity, units (~5 min)"
	@echo "  make changelog    - lint changelogs/fragments/ and regenerate CHANGELOG.md from them"
	@echo "  make bench-weights - weight-sync benchmark (not part of make test)"

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test,sim]'
	touch $@

venv: $(VENV)/.installed

# The simulated cluster: a 2-node pair by default (inventory/sim); e.g. `make sim SIM_NODES=4
# SIM_TOPOLOGY=ring` (or switch) makes that cluster and its inventory under .sim/inventories/.
SIM_NODES ?= 2
SIM_TOPOLOGY ?= pair
SIM_INVENTORY = $(shell python3 sim/simctl.py inventory --nodes $(SIM_NODES) --topology $(SIM_TOPOLOGY))

sim-up: venv
	$(PY) sim/simctl.py up --nodes $(SIM_NODES) --topology $(SIM_TOPOLOGY)

sim: sim-up
	ansible-playbook site.yml -i $(SIM_INVENTORY)
	@$(MAKE) -s sim-info

# Where the health report is, asked of Ansible (the inventory decides), printed without `..`.
sim-info: venv
	@reports=$$(ansible spark-sim-1 -i inventory/sim -o -m ansible.builtin.debug \
	    -a 'msg={{ sparkops_reports_dir | realpath }}' | sed -n 's/.*"msg": "\(.*\)".*/\1/p'); \
	test -f "$$reports/health.md" || { echo "no health report in $$reports yet: run make sim"; exit 1; }; \
	echo; echo "Simulated cluster serving (a vLLM TEST DOUBLE behind a real Ray cluster):"; \
	sed -n 's/^| \(endpoint\|served model name\|API key\|client key\|healthy\) | \(.*\) |$$/  \1: \2/p' "$$reports/health.md"; \
	echo "  report: $$reports/health.md"; \
	echo "Try it (the key is read from its file, never printed):"; \
	sed -n '/^```sh$$/,/^```$$/{/^```/d;s/^/  /;p}' "$$reports/health.md"; \
	echo "Next: make status | verify | benchmark | doctor | teardown | upgrade (make help says more)"

sim-down:
	python3 sim/simctl.py down

sim-destroy:
	python3 sim/simctl.py down --all

# Day-2 playbooks (README "After make sim"). ansible-playbook comes from .venv.
status: venv
	ansible-playbook playbooks/status.yml -i $(INVENTORY) $(ARGS)

verify: venv
	ansible-playbook playbooks/verify.yml -i $(INVENTORY) $(ARGS)

benchmark: venv
	ansible-playbook playbooks/benchmark.yml -i $(INVENTORY) $(ARGS)

upgrade: venv
	ansible-playbook playbooks/upgrade.yml -i $(INVENTORY) $(ARGS)

teardown: venv
	ansible-playbook playbooks/teardown.yml -i $(INVENTORY) $(ARGS)

# playbooks/doctor.yml comes with issue 15; until then this target says so.
doctor: venv
	@test -f playbooks/doctor.yml || { echo "playbooks/doctor.yml is not in this checkout yet (issue 15)"; exit 2; }
	ansible-playbook playbooks/doctor.yml -i $(INVENTORY) $(ARGS)

lint: venv
	tests/run-stages.sh lint

unit: venv
	tests/run-stages.sh unit

test: venv
	tests/run-stages.sh all

# Not part of `make test` (minutes per module): each mutant is a small bug in a pure module, run
# against the unit tests that exercise it (tests/mutation/README.md). MODULES: the modules (default:
# plugin_utils, the module_utils parsers, the filters); MUTATION_ARGS: e.g. --sample 60 --fail-under 95.
MODULES ?=
MUTATION_ARGS ?=
mutation: venv
	$(PY) tests/mutation/mutate.py $(MUTATION_ARGS) $(MODULES)

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
