# The two set-up commands of the README: `make demo` (the main job) and `make test` (the tests).
# Each creates .venv and installs what it needs on first use.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.padless-installed
# the tests run in two pytest-xdist workers (the 2 cores of the CI machine; each worker one torch thread:
# tests/conftest.py); `make test TEST_WORKERS=0` runs them in this process
TEST_WORKERS ?= 2

.PHONY: demo test setup clean

$(STAMP): pyproject.toml constraints.txt requirements-assets.txt scripts/setup.sh
	bash scripts/setup.sh
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/padless bench --out runs/default

test: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS)

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
