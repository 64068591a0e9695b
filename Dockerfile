# syntax=docker/dockerfile:1

# The ledger's services in one image: ingest (the default entrypoint),
# projector and ledgerctl. docker-compose.yml picks the binary per service
# with `entrypoint`; docs/operations.md describes the flags and variables.

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
# The module cache and the build cache live in cache mounts, so a rebuild
# after a source change downloads nothing and recompiles only what changed.
COPY go.mod go.sum ./
# The SDK and the contract codec are modules of their own, replaced by their
# directories in go.mod.
COPY pkg/wire/go.mod pkg/wire/go.sum ./pkg/wire/
COPY pkg/worker/go.mod pkg/worker/go.sum ./pkg/worker/
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/ ./cmd/ingest ./cmd/projector ./cmd/ledgerctl

# A slim Debian rather than distroless: the compose healthchecks run curl
# inside the container. The binaries are static (CGO_ENABLED=0).
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 ledger \
    && useradd --system --uid 10001 --gid ledger --no-create-home --shell /usr/sbin/nologin ledger
COPY --from=build /out/ingest /out/projector /out/ledgerctl /usr/local/bin/
USER 10001:10001
# 9090: ingest admin (/metrics, /healthz, /readyz); 9091: projector admin.
EXPOSE 9090 9091
ENTRYPOINT ["/usr/local/bin/ingest"]
