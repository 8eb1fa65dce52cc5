# The README's two commands: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The demo needs clusterctl's runtime dependencies only (docs/decisions/0016-demo-runtime-dependencies.md): a
# fresh machine's `make demo` installs no test, lint or plotting tools. The [dev] install includes the runtime.
RUNTIME_STAMP := $(VENV)/.installed-runtime

.PHONY: demo test check lint pytest ansible-checks machine-tools machine-image clean

# Simulated machines need systemd-nspawn, debootstrap and the ssh client; the stand-in vendor apt repositories
# (sim/aptrepo) need dpkg-deb, apt-ftparchive (apt-utils) and gpg (gnupg). Installed when missing.
MACHINE_TOOLS := systemd-nspawn debootstrap ssh ssh-keygen nsenter apt-ftparchive gpg gpgconf dpkg-deb nft

# pip's and apt's output goes to a log, one status line on screen: `make demo`'s first screen is the demo's step 1.
# A failed install prints the log's tail (and where the whole log is) and stops.
INSTALL_LOG := $(VENV)/install.log
TOOLS_LOG   := $(VENV)/machine-tools.log
LOG_TAIL    := 40

# $(call pip_install,REQUIREMENT,WHAT): the venv (created when missing) with REQUIREMENT installed, editable.
define pip_install
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing $(2) into $(VENV) (log: $(INSTALL_LOG))"
	@{ $(BIN)/python -m pip install --upgrade pip && $(BIN)/python -m pip install -e '$(1)'; } >$(INSTALL_LOG) 2>&1 \
	  || { tail -n $(LOG_TAIL) $(INSTALL_LOG); echo "pip install failed; the whole log: $(INSTALL_LOG)"; exit 1; }
endef

$(RUNTIME_STAMP): pyproject.toml
	$(call pip_install,.,clusterctl)
	@touch $(RUNTIME_STAMP)

$(STAMP): pyproject.toml
	$(call pip_install,.[dev],clusterctl and its development tools)
	@touch $(STAMP) $(RUNTIME_STAMP)

# DEMO_ARGS: extra options for `clusterctl demo` (tests/machines/test_demo.py runs `make demo DEMO_ARGS="--duration 10"`).
demo: $(RUNTIME_STAMP) machine-tools
	@$(BIN)/clusterctl demo $(DEMO_ARGS)

# The contributor's quick loop (under 2 minutes on 2 cores): ruff and the unit tier (tests/README.md).
check: $(STAMP) lint
	$(BIN)/python -m pytest -q -m unit -n 2 -p no:cacheprovider tests/unit tests/guards

# ansible-checks runs inside pytest (tests/integration/test_ansible_checks.py), beside the machine tests.
test: $(STAMP) lint machine-image pytest

machine-tools:
	@missing=""; for t in $(MACHINE_TOOLS); do command -v $$t >/dev/null 2>&1 || missing="$$missing $$t"; done; \
	if [ -n "$$missing" ]; then \
	  mkdir -p $(VENV); \
	  echo "installing systemd-container debootstrap openssh-client util-linux apt-utils gnupg nftables (missing:$$missing; log: $(TOOLS_LOG))"; \
	  { DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd-container debootstrap openssh-client util-linux apt-utils gnupg nftables; \
	  } >$(TOOLS_LOG) 2>&1 || { tail -n $(LOG_TAIL) $(TOOLS_LOG); echo "apt-get failed; the whole log: $(TOOLS_LOG)"; exit 1; }; \
	fi

# The machines' base image (cached by recipe under /var/cache/clusterctl/images; built once, ~1-2 min).
machine-image: $(STAMP) machine-tools
	$(BIN)/python -c "from sim.hosts import image; image.ensure(print)"

lint: $(STAMP)
	$(BIN)/ruff check .

ansible-checks: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH bash tests/ansible_checks.sh

# Two workers on CI's two cores: the machine chain in order on one, the rest beside it (tests/conftest.py). A
# third worker measured no faster (1,447 s against 1,452): every test ran slower beside it.
pytest: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m pytest -q -n 2 --dist loadscope --durations=60

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
