# Two entry points for a fresh machine with Python 3.11 and pip:
#   make demo   creates .venv, installs, runs the embedded smoke study, prints the report
#   make test   creates .venv, installs, runs the test suite
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: demo test install test-xla clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,dali]'
	touch $@

demo: install
	$(BIN)/lsbench run studies/smoke.yaml

test: install
	$(BIN)/python -m pytest -q

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

clean:
	rm -rf runs reports/*.md reports/*.html reports/*.csv reports/*.tex
