# One interpreter for everything: .venv/ at the repository root.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
SYMBOL  ?= ES.FUT
DATA    ?= data/demo
export ALPHA_DATA_DIR ?= $(CURDIR)/$(DATA)
export ALPHA_STORAGE_ROOT ?= $(CURDIR)/storage
export DAGSTER_HOME ?= $(CURDIR)/dagster_home

.PHONY: install demo ui test lint bench clean

$(BIN)/.installed: pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, pinned: pip takes the CPU build from the local disk here (a plain `torch` pulls CUDA).
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	$(BIN)/pip check
	touch $@

install: $(BIN)/.installed

RUN := $(ALPHA_STORAGE_ROOT)/demo-run
demo: install
	$(BIN)/alpha demo-data --scale small --out $(DATA) --symbols $(SYMBOL)
	$(BIN)/dagster asset materialize -m alpha_assets.definitions --select book_sidecars,bar_sidecars,fold_plans --partition $(SYMBOL)
	$(BIN)/alpha train --mbp10-data-dir $(DATA)/$(SYMBOL)/mbp-10 --predecoded-dir $(ALPHA_STORAGE_ROOT)/predecoded/$(SYMBOL) \
		--out $(RUN)/models/perception/$(SYMBOL)/fold-0 --cv-n-folds 3 --cv-fold 0 --epochs 2 --batch-size 64 \
		--seq-len 32 --n-train-seqs 4000 --n-val-seqs 2000 --lr-warmup-steps 20 --device cpu
	$(BIN)/alpha train-supervised --model tft --data-dir $(DATA)/$(SYMBOL) --output-dir $(RUN)/models/tft/$(SYMBOL) \
		--predecoded-dir $(ALPHA_STORAGE_ROOT)/predecoded/$(SYMBOL) --cv-n-folds 3 --epochs 2 --seq-len 32 \
		--batch-size 64 --n-train-seqs 3000 --n-val-seqs 2000 --device cpu
	$(BIN)/alpha evaluate --models-dir $(RUN)/models --data-dir $(DATA) --output $(RUN)/eval/ensemble_report.json \
		--predecoded-dir $(ALPHA_STORAGE_ROOT)/predecoded --device cpu
	@echo
	@echo "Results for $(SYMBOL):"
	@echo "  sidecars:   $(ALPHA_STORAGE_ROOT)/predecoded/$(SYMBOL)/"
	@echo "  fold plans: $$(ls -t $(ALPHA_STORAGE_ROOT)/*/folds/$(SYMBOL)/fold_plans.json | head -1)"
	@echo "  models:     $(RUN)/models/{perception,tft}/$(SYMBOL)/fold-<k>/"
	@echo "  report:     $(RUN)/eval/ensemble_report.{json,md} and PNG plots"
	@echo "Open the UI with: make ui"

ui: install
	$(BIN)/dg dev

test: install
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check .

bench: install
	$(BIN)/python bench/bench_sidecar.py

clean:
	rm -rf $(VENV) data storage bench/out
