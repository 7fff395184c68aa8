# b300-rollout — see README.md. The two commands a newcomer needs: `make demo` and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export CONTAINERS_CONF := $(CURDIR)/sandbox/containers.conf
N ?= 2
PROFILE ?= kimi_k3
SANDBOX_INV := inventory/sandbox

.PHONY: help deps venv image wheelhouse sandbox sandbox-down demo test lint sanity unit parser integration integration-fleet integration-controller molecule thermal audit reliability ee acceptance plan host-stack-plan sweep quality-gate

help:
	@echo "make demo      bring up the sandbox (2 emulated B300 hosts) and run site.yml -l b300a,b300b on it (PROFILE=kimi_k3|glm52_pd)"
	@echo "make test      every test: yamllint, ansible-lint, pytest, sandbox integration, molecule"
	@echo "make sandbox   start N sandbox hosts (N=$(N)); make sandbox-down removes them"

deps:  ## system packages (Debian): podman & friends
	sandbox/install-deps.sh

$(VENV)/.done: requirements.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q -r requirements.txt
	touch $@

venv: $(VENV)/.done
	sandbox/collections.sh

image: deps venv
	sandbox/fleet.sh image

sandbox: image
	sandbox/fleet.sh up $(N)

sandbox-down:
	sandbox/fleet.sh down $(if $(KEEP),--keep $(KEEP))

demo: sandbox
	tools/demo.sh $(PROFILE)

lint: venv  ## ruff (every Python file, ruff.toml), yamllint, ansible-lint (production profile)
	ruff check .
	yamllint -s .
	ansible-lint

sanity: venv  ## ansible-test sanity on the collection (first run installs the tools, ~3 min; then ~35-65 s)
	tools/sanity.sh

unit: venv  ## on every core (pytest-xdist -n auto): ~220 s on one core, ~90 s on two idle ones
	pytest -q -n auto tests/unit

parser: venv  ## the REAL sglang 0.5.17/0.5.18 parsers (CPU venvs cached in .cache/sglang-argcheck) on both profiles
	pytest -q -m real_parser tests/parser

wheelhouse: venv  ## wheels the sandbox hosts install from (air-gapped like a GPU cluster): .cache/wheelhouse
	tools/build-wheelhouse.sh

integration: image wheelhouse  ## every integration test (the two parts below, one after the other)
	sandbox/fleet.sh up 2
	pytest -q -p no:cacheprovider --durations=25 tests/integration

integration-fleet: image wheelhouse  ## the integration tests that use the sandbox fleet (make test: beside the other parts)
	sandbox/fleet.sh up 2
	pytest -q -p no:cacheprovider --durations=25 -m "not controller" tests/integration

integration-controller: venv  ## the integration tests that need no fleet (controller-side runs, loopback processes)
	pytest -q -p no:cacheprovider --durations=10 -m controller tests/integration

molecule: image wheelhouse
	tools/molecule-all.sh

thermal: venv  ## before go-live on real hosts: 1 h GPU soak, verdict + plots in artifacts/thermal/
	ansible-playbook playbooks/thermal_soak.yml -l b300a,b300b

acceptance: venv  ## go-live acceptance of PROFILE (seed traffic through the router, verdict, artifacts/acceptance/latest); INV=inventory/production for the real hosts
	$(if $(INV),,tools/acceptance/client_venv.sh && sandbox/fleet.sh up $(N) && tools/build-wheelhouse.sh && \
	  ansible-playbook playbooks/sglang_deploy.yml -i $(SANDBOX_INV) -l b300a,b300b -e sglang_profile=$(PROFILE) &&) \
	ansible-playbook playbooks/acceptance.yml -i $(or $(INV),$(SANDBOX_INV)) -l b300a,b300b -e sglang_profile=$(PROFILE)

sweep: venv  ## after the acceptance run: the concurrency sweep through URL=<router> (knee, plan not applied; artifacts/sweep/); ARGS="--workers 2 ..."
	$(if $(URL),,$(error URL=http://<router>:<port> is required (the sandbox's kimi_k3 router: http://10.89.30.11:30080)))
	$(PY) tools/sweep --url $(URL) --profile $(PROFILE) $(ARGS)

quality-gate: venv  ## the quality gate per task type through URL=<router>: BASELINE=<file> checks against it, without BASELINE records one
	$(if $(URL),,$(error URL=http://<router>:<port> is required (the sandbox's kimi_k3 router: http://10.89.30.11:30080)))
	$(PY) tools/quality-gate $(if $(BASELINE),check --baseline $(BASELINE),record --out artifacts/quality-gate/baseline-$(PROFILE).json \
	  --identity profile=$(PROFILE)) --url $(URL) $(ARGS)

reliability: sandbox wheelhouse  ## rolling restart / version change / faults under load on the sandbox (~30 min)
	$(PY) tools/reliability.py

ee: image  ## the execution environment image localhost/b300-ee:latest (execution-environment.yml; offline; cached)
	tools/build-ee.sh

plan: venv  ## what site.yml would deploy for PROFILE (per instance GPUs, ports, RDMA, unit command line + env), no host touched; INV=inventory/production for the real hosts
	tools/plan -i $(or $(INV),$(SANDBOX_INV)) $(PROFILE)

host-stack-plan: venv  ## what the host-stack stage would install/hold/remove and whether a reboot follows, then its proof (reads the hosts, changes nothing: --check); INV=inventory/production by default, LIMIT=b300a
	ansible-playbook playbooks/host_stack.yml --check -i $(or $(INV),inventory/production) $(if $(LIMIT),-l $(LIMIT))

audit: venv  ## the on-call firmware/GPU audit (read-only); INV=inventory/sandbox for the sandbox
	tools/fw-audit -i $(or $(INV),inventory/production)

# each part's time is printed at the end (and kept in artifacts/test-times.txt); the fleet's tests run beside the
# other parts (tools/test-parts.sh says why)
TEST_PARTS ?= lint sanity unit parser integration-controller molecule
TEST_FLEET_PART ?= integration-fleet
test: venv
	tools/test-parts.sh --beside $(TEST_FLEET_PART) $(TEST_PARTS)
