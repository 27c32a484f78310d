# One interpreter for everything: .venv/ at the repository root.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
SYMBOL  ?= ES.FUT
DATA    ?= data/demo
export ALPHA_DATA_DIR ?= $(CURDIR)/$(DATA)
export ALPHA_STORAGE_ROOT ?= $(CURDIR)/storage
export DAGSTER_HOME ?= $(CURDIR)/dagster_home

.PHONY: install demo ui test check lint bench clean

$(BIN)/.installed: pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, pinned: pip takes the CPU build from the local disk here (a plain `torch` pulls CUDA).
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	$(BIN)/pip check
	touch $@

install: $(BIN)/.installed

DEMO_TRAIN := {"seq_len": 32, "batch_size": 64, "n_train_seqs": 3000, "n_val_seqs": 2000, "timesteps_per_epoch": 4000, "device": "cpu"}
DEMO_HYPEROPT := {"seq_len": 32, "batch_size": 64, "n_train_seqs": 1000, "n_val_seqs": 500, "timesteps_per_epoch": 1000, "device": "cpu"}
demo: install
	$(BIN)/alpha demo-data --scale small --out $(DATA) --symbols $(SYMBOL)
	$(BIN)/alpha run --symbols $(SYMBOL) --models perception,tft,ppo --phase full --epochs 2 --hyperopt-trials 3 \
		--allow-gate-failures --max-parallel 2 --run-id demo --train-config '$(DEMO_TRAIN)' --hyperopt-config '$(DEMO_HYPEROPT)'
	@echo "Everything this run wrote is under $(ALPHA_STORAGE_ROOT)/demo/ (the sidecar cache: $(ALPHA_STORAGE_ROOT)/predecoded/)."
	@echo "See it in Dagster, with its plots and the gates' reasons: make ui, then http://127.0.0.1:3000"

ui: install
	$(BIN)/alpha ui

# lint first (no network: ruff is in the venv), then the tests
test: install lint
	scripts/test-deps.sh   # PostgreSQL and Chromium from Debian: installed as root, else the command to run
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder   # two workers, a file each (most tests wait on processes), the longest files first (conftest.py) rather than the files with most tests

# the inner loop: lint, then every test but the slow ones (under 2 minutes on a 2-core machine)
check: install lint
	$(BIN)/python -m pytest -q -n 2 -m "not slow"

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: install
	$(BIN)/python bench/bench_sidecar.py

clean:
	rm -rf $(VENV) data storage bench/out
