# corral's front door: `make run`, `make test`, `make bench`, `make lint`.
# `make test` installs what the tests need on a fresh Debian machine, then runs everything.

CARGO ?= cargo
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test deps lint fmt bench bench-core bench-cni plugin clean

## run: the main job on the embedded default (until the agent lands: an engine walk-through)
run:
	$(CARGO) run --quiet -p corral-core --example demo

## deps: system packages the tests need: a C compiler (bundled SQLite), and for the
## end-to-end test Debian's CNI plugins (bridge, host-local) and iproute2; `make bench-cni`
## also runs host-local, reads peak RSS with GNU time and counts fsyncs with strace
DEBIAN_PACKAGES := build-essential containernetworking-plugins iproute2 time strace
deps:
	@command -v $(CARGO) >/dev/null || { echo "cargo is required (https://rustup.rs)"; exit 1; }
	@missing=""; for p in $(DEBIAN_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		$(SUDO) apt-get update && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y $$missing; \
	fi

## test: set-up, lints, and every test of the workspace
test: deps lint
	$(CARGO) test --workspace --lib --bins --tests --examples
	$(CARGO) test --workspace --doc

## lint: formatting and clippy, warnings are errors
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

## bench: every benchmark (figures go to BENCHMARKS.md by hand, with the command)
bench: bench-core bench-cni

bench-core:
	$(CARGO) bench -p corral-core --bench engine
	$(CARGO) bench -p corral-core --bench memory

## plugin: the corral-ipam binary as installed, in target/<host>/plugin/: the `plugin` profile
## (fat LTO, one codegen unit, abort on panic: less code to page in at start-up), statically
## linked and not position-independent (no dynamic loader and no start-up relocations)
HOST_TRIPLE := $(shell rustc -vV 2>/dev/null | sed -n 's/^host: //p')
PLUGIN := target/$(HOST_TRIPLE)/plugin/corral-ipam
plugin:
	RUSTFLAGS="-C target-feature=+crt-static -C relocation-model=static" $(CARGO) build --profile plugin -p corral-cni --bin corral-ipam --target $(HOST_TRIPLE)
	@echo "built $(PLUGIN)"

## bench-cni: the corral-ipam binary against Debian's host-local, side by side (about 1.5 min)
bench-cni: deps plugin
	CORRAL_IPAM_BIN=$(CURDIR)/$(PLUGIN) $(CARGO) bench -p corral-cni --bench cni

clean:
	$(CARGO) clean
