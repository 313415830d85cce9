# Two entry points for a fresh machine with Python 3.11 (what the tests run on; the package declares >= 3.10) and pip:
#   make demo   creates .venv, installs, runs the embedded smoke study, prints the report
#   make test   creates .venv, installs, runs ruff (make lint), the test suite and builds the docs site (make docs)
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: demo test docs lint install test-xla clean gpu-check gpu-check-smoke gpu-wheels

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,dali]'
	touch $@

demo: install
	$(BIN)/lsbench run studies/smoke.yaml

# two pytest processes, each test file in one of them (--dist loadfile: a file's fixtures stay in one process);
# CI has 2 cores and much of the suite waits on Ray and MLflow process starts
test: install
	$(MAKE) lint
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=25
	$(MAKE) docs

# ruff (pyproject.toml [tool.ruff]): the rules, then the formatting, over everything that is Python
LINTED = lossscale_bench tests benchmarks tools
lint: install
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)

# the documentation site, offline (no web fonts or CDN), every link and anchor checked
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir build/site

# torch_xla 2.9.0 links against torch 2.9.0 exactly, so it gets a venv of its own (not part of CI).
XLA_VENV ?= .venv-xla
test-xla:
	test -x $(XLA_VENV)/bin/python || $(PYTHON) -m venv $(XLA_VENV)
	$(XLA_VENV)/bin/python -m pip install -q --upgrade pip
	PIP_CONSTRAINT= $(XLA_VENV)/bin/python -m pip install -q 'torch==2.9.0' 'torchvision==0.24.0' 'torch-xla==2.9.0'
	PIP_CONSTRAINT= $(XLA_VENV)/bin/python -m pip install -q -e '.[dev]'
	# the launcher test spawns XLA processes, which needs a process whose XLA runtime is still unused
	PJRT_DEVICE=CPU $(XLA_VENV)/bin/python -m pytest -q tests/backends/test_xla.py -k "not launcher"
	PJRT_DEVICE=CPU $(XLA_VENV)/bin/python -m pytest -q tests/backends/test_xla.py -k launcher

# GPU check (docs/development/gpu-check.md). The GPU machine has no venv: run with its system
# python and the repository on the path, i.e. `PYTHONPATH=. python3 benchmarks/gpu_check.py`, <= 8 min on one
# H100; writes $(GPU_CHECK_OUT)/gpu_check.{json,md} and prints the markdown. Needs torch, torchvision, numpy,
# Pillow (pycocotools optional: mAP); no Ray, MLflow or pydantic.
GPU_CHECK_OUT ?= runs/gpu_check
gpu-check:
	PYTHONPATH=. $(PYTHON) benchmarks/gpu_check.py --out $(GPU_CHECK_OUT)

# the same script on CPU with tiny sizes (what tests/test_gpu_check.py runs)
gpu-check-smoke: install
	PYTHONPATH=. $(BIN)/python benchmarks/gpu_check.py --cpu-smoke --out $(GPU_CHECK_OUT)_smoke

# Wheels for a GPU machine without a package registry: what `lsbench run --executor local` and
# `lsbench report` need beyond what the GPU machine has (Python 3.12 with torch, torchvision, numpy, scipy,
# pandas, matplotlib, pyyaml, tabulate), at the versions of this venv, for Python 3.12, with their
# dependencies, less the wheels the GPU machine has anyway. Ray is left out (about 70 MiB; the local executor
# never imports it) and so is MLflow's server half (mlflow-skinny is the client and the SQLite store).
# <= 64 MiB with the working tree (the limit on what the GPU machine is sent), and with the kangaroo photos (20 MB) for
# benchmarks/gpu_census.sh and gpu_pace.sh: pandas (12 MB) stays behind, since gpu_deps.sh keeps the machine's
# own pandas anyway. benchmarks/gpu_session.sh installs them there.
GPU_WHEELS     ?= pydantic mlflow-skinny sqlalchemy alembic pycocotools statsmodels
GPU_HAS        ?= numpy scipy pyyaml pandas
GPU_WHEELS_DIR ?= shared/wheels
gpu-wheels: install
	mkdir -p $(GPU_WHEELS_DIR)
	$(BIN)/python -c "import importlib.metadata as m, sys; print('\n'.join(f'{n}=={m.version(n)}' for n in sys.argv[1:]))" \
	  $(GPU_WHEELS) > $(GPU_WHEELS_DIR)/pins.txt
	$(BIN)/python -m pip download -q --dest $(GPU_WHEELS_DIR) --python-version 3.12 --only-binary=:all: \
	  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
	  -r $(GPU_WHEELS_DIR)/pins.txt setuptools
	for n in $(GPU_HAS); do rm -f $(GPU_WHEELS_DIR)/$$n-*.whl $(GPU_WHEELS_DIR)/$$(echo $$n | tr a-z A-Z)-*.whl; done
	du -sh $(GPU_WHEELS_DIR)
	test $$(du -sm $(GPU_WHEELS_DIR) | cut -f1) -le 60 || { echo "gpu-wheels: $(GPU_WHEELS_DIR) is over 60 MiB; with the working tree it would pass the GPU machine's 64 MiB limit"; exit 1; }

clean:
	rm -rf runs reports/*.md reports/*.html reports/*.csv reports/*.tex
