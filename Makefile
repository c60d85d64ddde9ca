# The two entry points named at the top of README.md, and the pieces they are made of.
export CONTAINERS_CONF := $(CURDIR)/tests/sandbox/containers.conf
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
.PHONY: run test setup fresh-setup sandbox-up sandbox-down bpf sanity lint

run:
	scripts/demo

test:
	scripts/test

setup:
	scripts/setup test

# scripts/setup on a Debian 12 without python3-venv, make or git, in a throw-away container
# (downloads packages as setup does; CI runs it before the tests).
fresh-setup:
	.ci/fresh-setup

sandbox-up:
	scripts/sandbox up

sandbox-down:
	scripts/sandbox down

bpf:
	$(MAKE) -C files/bpf

sanity:
	scripts/sanity

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/ansible-lint --offline --profile production
