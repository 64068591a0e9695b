# The README's two commands are `make demo` and `make test`.
GO ?= go
export PATH := /usr/local/go/bin:$(PATH)

.PHONY: test test-ts vet bench bench-external bench-compare bench-latency demo build fuzz chaos failover

# demo: the whole ledger in one process (NATS embedded; PostgreSQL from
# DATABASE_URL, or a throwaway cluster), playing the two seed stories.
demo:
	$(GO) run ./cmd/ledgerctl demo

# The Go SDK (pkg/worker), the contract codec (pkg/wire) and the adopters'
# test kit (testkit) are modules of their own; every command runs in each.
MODULES := . pkg/wire pkg/worker testkit

# test: vet, formatting, every package of every module with the race
# detector, then every fuzz target for a few seconds. The chaos runs (real
# processes at over 1,000 events/s) go last and alone: beside them, the
# other packages' timing-bound tests would share two CPUs with them.
CHAOS_PKG := ./internal/lab/chaos
# The flood tests compare one principal's p99 latency with and without
# another's flood in the same test: beside other packages' tests on two
# CPUs they measure the machine, so they run alone, before the chaos runs.
# The in-process bench report runs every phase against a deadline, which the
# other packages' load on two CPUs can exceed: it runs alone too.
ALONE_TESTS := TestFloodOfOnePrincipal|TestBenchCommandPrintsTheReport
# Each stage prints how long it took ("stage: ..."), so a slow CI run says where.
STAGE = start=$$(date +%s); trap 'echo "stage: $(1) took $$(( $$(date +%s) - start )) s"' EXIT;
test: vet
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	@$(call STAGE,packages) for m in $(MODULES); do (cd $$m && bash $(CURDIR)/.ci/gotest -race -count=1 -timeout 9m -skip '$(ALONE_TESTS)' $$($(GO) list ./... | grep -v '/internal/lab/chaos$$')) || exit 1; done
	@$(call STAGE,alone) bash .ci/gotest -race -count=1 -timeout 9m -p 1 -run '$(ALONE_TESTS)' ./internal/ingest ./cmd/ledgerlab/internal/lab
	@$(call STAGE,chaos) bash .ci/gotest -race -count=1 -timeout 9m $(CHAOS_PKG)
	@$(call STAGE,fuzz) FUZZJOBS=$(FUZZJOBS_CI) FUZZTIME=$(FUZZTIME_CI) bash .ci/fuzz
	@$(call STAGE,typescript) $(MAKE) test-ts

# test-ts: the TypeScript SDK (sdk/typescript) and its conformance run, against
# a real ledger it starts with ledgerctl dev. Needs Node 20+ and npm.
test-ts:
	@command -v node >/dev/null && command -v npm >/dev/null || { echo "test-ts: node and npm are needed (Node 20+)"; exit 1; }
	cd sdk/typescript && npm ci --no-audit --no-fund && npm test

# fuzz: every fuzz target for FUZZTIME each (default 1m); `make test` runs
# each for a few seconds.
FUZZTIME ?= 1m
FUZZTIME_CI ?= 2s
# A run of a few seconds is mostly building and replaying, and the fuzzing
# itself is bounded by time, not work: four targets at once on 2 CPUs took
# 1 min 30 s for all 47, against 2 min 40 s two at a time.
FUZZJOBS_CI ?= 4
fuzz:
	FUZZTIME=$(FUZZTIME) bash .ci/fuzz

# chaos: the ledger as processes (PostgreSQL, NATS, two ingests, a projector,
# two writers per partition) under kill -9, SIGSTOP and restarts, checked from
# the writers' logs and the stored state; exits 1 on any violation.
# CHAOS_FLAGS passes flags: make chaos CHAOS_FLAGS='-duration 1h -cluster'.
CHAOS_FLAGS ?=
chaos:
	$(GO) build -o bin/ ./cmd/...
	bin/ledgerlab chaos $(CHAOS_FLAGS)

# failover: for lease TTLs of 500ms, 1s, 3s and 10s, the time from kill -9 of a
# holding worker to its standby's first commit, and how often a live worker paused
# by SIGSTOP loses its lease (docs/operations.md, "Failover time and the TTL").
# About 10 minutes. FAILOVER_FLAGS passes flags: make failover FAILOVER_FLAGS='-json'.
FAILOVER_FLAGS ?=
failover:
	$(GO) build -o bin/ ./cmd/...
	bin/ledgerlab chaos failover $(FAILOVER_FLAGS)

# bench-external: the deployment's shape, every part a process of its own
# (PostgreSQL, nats-server, ingest, projector, SDK workers): events/s and each
# part's CPU time per event (docs/internals/benchmarks.md, "The deployment's shape").
# BENCH_FLAGS passes flags: make bench-external BENCH_FLAGS='-raw -json'.
BENCH_FLAGS ?=
bench-external:
	$(GO) build -o bin/ ./cmd/...
	bin/ledgerlab bench -external $(BENCH_FLAGS)

# bench-compare: the SDK path against raw publishers in the deployment's
# shape, SDK and raw runs alternating on fresh deployments (docs/internals/benchmarks.md,
# "SDK against raw publishers"). COMPARE_FLAGS passes flags.
COMPARE_FLAGS ?= -compare 3 -events 200000
bench-compare:
	$(GO) build -o bin/ ./cmd/...
	bin/ledgerlab bench -external $(COMPARE_FLAGS)

# bench-latency: publish → receipt p50/p99 in the deployment's shape, the
# raw publishers and then the SDK paced at half the raw full-speed rate, each
# beside a bare pipeline process at the same rate (docs/internals/benchmarks.md,
# "Latency in the deployment's shape"). LATENCY_FLAGS passes flags.
LATENCY_FLAGS ?= -events 100000
bench-latency:
	$(GO) build -o bin/ ./cmd/...
	bin/ledgerlab bench -external -latency -raw $(LATENCY_FLAGS)
	bin/ledgerlab bench -external -latency $(LATENCY_FLAGS)

vet:
	@for m in $(MODULES); do (cd $$m && $(GO) vet ./...) || exit 1; done

# bench: the benchmarks of every package (real Postgres and embedded NATS).
bench:
	$(GO) test -run '^$$' -bench . -benchtime 3s ./...

build:
	@for m in $(MODULES); do (cd $$m && $(GO) build ./...) || exit 1; done
