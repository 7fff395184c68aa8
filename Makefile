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

.PHONY: help deps venv image sandbox sandbox-down demo test lint unit integration molecule clean

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
	sandbox/fleet.sh down

demo: sandbox
	tools/demo.sh $(PROFILE)

lint: venv
	yamllint -s .
	ansible-lint

unit: venv
	pytest -q tests/unit

integration: image
	pytest -q tests/integration

molecule: image
	tools/molecule-all.sh

test: lint unit integration molecule
