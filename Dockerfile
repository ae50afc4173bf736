# syntax=docker/dockerfile:1
#
# The wharf image: a static binary on a distroless base with no shell,
# running as a non-root user.
#
#   docker build -t wharf .
#   docker run --rm wharf version
#   docker run --rm -e WHARF_DATABASE_URL=postgres://... -p 9090:9090 \
#       wharf relay --sink nats://nats:4222 --admin-addr :9090
#
# scripts/build-release.sh runs the same build command without a container
# engine; keep the two in step. Both take the version from the VERSION file.

FROM golang:1.26 AS build
WORKDIR /src
# Dependencies first: this layer stays cached while only the sources change.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -buildvcs=auto -trimpath -ldflags="-s -X github.com/wharfhq/wharf/internal/cli.Version=$(cat VERSION)" -o /wharf ./cmd/wharf

# distroless/static: CA certificates and tzdata, no shell, no package manager.
# The nonroot tag runs as uid/gid 65532.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /wharf /wharf
USER 65532:65532
# The relay's --admin-addr (metrics and probes) in the examples under deploy/.
EXPOSE 9090
ENTRYPOINT ["/wharf"]
CMD ["--help"]
