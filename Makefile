# sparkops: the two commands a newcomer needs are `make sim` and `make test`.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export PYTHONUNBUFFERED := 1

.PHONY: help venv sim sim-up sim-down sim-destroy test lint unit molecule integration syntax bench-weights

help:
	@echo "make sim       - build the simulated two-Spark cluster and run site.yml against it"
	@echo "                 (SIM_NODES=4 SIM_TOPOLOGY=ring|switch for a bigger one)"
	@echo "make sim-down  - remove the simulated cluster (nodes, networks, volumes)"
	@echo "make test      - lint, unit tests, molecule on the simulated cluster, integration tests"

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
	@echo
	@echo "Simulated cluster serving (a vLLM TEST DOUBLE behind a real Ray cluster):"
	@sed -n 's/^| \(endpoint\|API key\|healthy\) | \(.*\) |$$/  \1: \2/p' reports/spark-sim/health.md
	@echo "  report: $(CURDIR)/reports/spark-sim/health.md"

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
