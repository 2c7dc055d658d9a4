# The two commands of the README: `make run` and `make test`.
# Both create .venv and install what is missing, system packages included.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SYSTEM_PACKAGES := libfuse3-dev fuse3 pkg-config fio postgresql rsync chromium

.PHONY: run bench test lint system-deps install peers clean

# make run: every door once, beside its baseline and its strongest peer (a few minutes);
# make bench: the whole table the README and docs/benchmarks.md cite, in $(VENV)/bench.json.
SHORT := write cluster-write-rf3 cluster-read cluster-small-files cluster-ec fsspec-cat mount-write \
	ckpt-ranks ckpt-incremental ckpt-memory ckpt-memory-ranks dataset-epoch
run: install peers
	$(BIN)/graben bench --quick --json $(VENV)/bench-short.json $(SHORT)

bench: install peers
	$(BIN)/graben bench --quick --json $(VENV)/bench.json

test: install lint
	$(BIN)/pytest

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy -p graben.store -p graben.fuse -p graben.checkpoint -p graben.dataloader -p graben.bench

# Re-linked every time (a second or two): strict editable installs only see
# modules that existed when they were installed.
install: system-deps $(STAMP)
	@$(BIN)/pip install -q --no-deps --no-build-isolation -e . --config-settings editable_mode=strict \
		>$(VENV)/relink.log 2>&1 || { cat $(VENV)/relink.log; exit 1; }

$(STAMP): pyproject.toml constraints.txt | system-deps
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]' --config-settings editable_mode=strict
	touch $@

# FUSE needs these (fio: its tests), the PostgreSQL engine's tests a server of their own
# (never the system's service), the status page's tests a browser (chromium, headless);
# the store core needs none, so a failure here only warns.
system-deps:
	@if command -v fusermount3 >/dev/null && command -v fio >/dev/null && command -v rsync >/dev/null && command -v chromium >/dev/null && pkg-config --exists fuse3 2>/dev/null \
		&& ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
		(apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(SYSTEM_PACKAGES) >/dev/null) \
		|| echo "warning: could not install $(SYSTEM_PACKAGES)"; \
	else echo "as root, run: apt-get install -y $(SYSTEM_PACKAGES)"; fi

# The bench's Mosaic Streaming and LitData peers need torchvision, which needs
# torch 2.14.1 (not the project's torch), so they get a venv of its own; without
# it the bench leaves their rows out, so a failure here only warns.
PEERS := .venv-peers
PEER_PACKAGES := torch==2.14.1 torchvision==0.29.1 pyarrow==26.0.1 'xxhash<4' zstd \
	python-snappy Brotli catalogue 'transformers<5' pillow litdata==0.2.76
peers: $(PEERS)/.installed
$(PEERS)/.installed: Makefile
	@($(PYTHON) -m venv $(PEERS) && $(PEERS)/bin/pip install -q $(PEER_PACKAGES) \
		&& $(PEERS)/bin/pip install -q --no-deps mosaicml-streaming==0.13.0 && touch $@) \
		>$(VENV)/peers.log 2>&1 || echo "warning: no Mosaic Streaming peer (see $(VENV)/peers.log)"

clean:
	rm -rf $(VENV) $(PEERS) build *.egg-info .mypy_cache .ruff_cache .hypothesis .bench-tmp
