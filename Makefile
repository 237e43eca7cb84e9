# seqmix: set-up and the common jobs. Every target creates .venv on first use.
#   make main       the main job (see README)
#   make test       the whole test suite, slow tests included (what CI runs; about 22 min on 2 cores, set-up excluded)
#   make test-slow  only the tests marked slow (pytest -m "not slow" skips them while developing)
#   make bench      every benchmark script at full size
#   make docs       the docs site into site/ (mkdocs build --strict; the suite builds it too)
#   make docs-serve the docs site on http://127.0.0.1:8000, rebuilt as pages change
#   make test-latest   the whole suite in .venv-latest, with the newest release of every dependency
#   make lock       test-latest, then (only if it passed) moves requirements/lock.txt to those versions

VENV   ?= .venv
PY     := $(VENV)/bin/python
# the CPU build of torch (on this project's machines pip takes it from a local copy);
# override with e.g. `make test TORCH=torch` to let pip choose
TORCH  ?= torch==2.13.0
# every install of setup/main/test/CI is constrained to the versions the tests passed with
LOCK   ?= requirements/lock.txt
EXTRAS := dev,text,tensorboard,hf,eval,cluster,lra,reference,linearize,docs
LATEST ?= .venv-latest

.PHONY: setup main test test-slow bench clean test-latest lock docs docs-serve

$(VENV)/.installed: pyproject.toml $(LOCK)
	python3 -m venv $(VENV)
	$(PY) -m pip install -q -c $(LOCK) pip
	$(PY) -m pip install -q -c $(LOCK) "$(TORCH)"
	$(PY) -m pip install -q -c $(LOCK) -e ".[$(EXTRAS)]"
	touch $@

setup: $(VENV)/.installed

# the main job: DSF Fig. 2 at CPU size (5 mixers on MQAR, 8-17 min on 2 cores by machine; it prints
# its own estimate of the time left after each run); prints the
# results table and the paper's claims, writes runs/main/dsf-fig2-tiny.png; a second run
# skips the finished runs
main: setup
	$(VENV)/bin/seqmix list
	$(VENV)/bin/seqmix reproduce dsf-fig2 --scale tiny --out runs/main

# chromium lets the HTML report test open the report in a headless browser; it is tried once
# (Debian's package, about 30 s) and never fails the target: without it that test is skipped
test: setup
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1; } || \
	  echo "chromium not installed: the HTML-in-a-browser test will be skipped"
	$(PY) -m pytest -q

test-slow: setup
	$(PY) -m pytest -q -m slow

bench: setup
	for f in bench/[a-z]*.py; do $(PY) $$f || exit 1; done

# the docs site (mkdocs.yml): guide pages, the README as front page, the API reference from the docstrings
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

# the newest release of every dependency (pyproject's ranges ignored, so a release past an upper
# bound shows up here first); torch stays $(TORCH) unless you pass TORCH=torch. Not in CI: its
# result depends on the day. A fresh venv each time.
test-latest:
	rm -rf $(LATEST)
	python3 -m venv $(LATEST)
	$(LATEST)/bin/python -m pip install -q --upgrade pip
	$(LATEST)/bin/python -m pip install -q "$(TORCH)"
	$(LATEST)/bin/python -m pip install -q --upgrade "$(TORCH)" $$($(LATEST)/bin/python tools/lock.py names $(EXTRAS) | tr ' ' '\n' | grep -vx torch)
	$(LATEST)/bin/python -m pip install -q --no-deps -e .
	$(LATEST)/bin/python -m pip list 2>/dev/null | grep -i -E "^(torch|transformers|tokenizers|datasets|pydantic|numpy) "
	$(LATEST)/bin/python -m pytest -q -p no:cacheprovider
	$(LATEST)/bin/python -m pip freeze --all --exclude-editable > $(LATEST)/tested.txt

# moves the lock to the versions test-latest just passed with (review the diff, then commit)
lock: test-latest
	$(LATEST)/bin/python tools/lock.py write $(LATEST)/tested.txt $(LOCK)
	git diff --stat -- $(LOCK)

clean:
	rm -rf $(VENV) $(LATEST) .pytest_cache bench/out site
