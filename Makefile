# The two entry points named at the top of README.md, and the pieces they are made of.
export CONTAINERS_CONF := $(CURDIR)/tests/sandbox/containers.conf
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
.PHONY: run test setup sandbox-up sandbox-down bpf sanity lint

run:
	scripts/demo

test:
	scripts/test

setup:
	scripts/setup test

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
	.venv/bin/ansible-lint --offline --profile production
