.DEFAULT_GOAL := help
GO ?= go

help: ## list the targets
	@grep -hE '^[a-z/]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

build: ## build ./wharf
	$(GO) build -o wharf ./cmd/wharf

test: ## the README's test command: go test ./... and a line naming what was skipped
	GO=$(GO) scripts/test.sh

test/race: ## every test with the race detector, long tests included (CI runs it)
	WHARF_LONG_TESTS=1 $(GO) test -race -timeout 30m ./...

test/long: ## the long tests too (soaks, sweeps), without the race detector
	WHARF_LONG_TESTS=1 GO=$(GO) scripts/test.sh -timeout 30m

.PHONY: docs # docs/ is a directory
docs: ## regenerate docs/cli.md from the command tree (a test fails when it is stale)
	$(GO) run ./internal/cli/gendocs docs/cli.md

screenshots: ## regenerate docs/img/console-*.png in chromium (the only test that writes docs)
	WHARF_UPDATE_SCREENSHOTS=1 $(GO) test -count=1 -run 'TestConsoleInBrowser$$' ./wharfconsole

GOLANGCI_LINT_VERSION ?= v2.6.2

lint: ## go vet, gofmt and golangci-lint (pinned; installed on first use)
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	@command -v golangci-lint >/dev/null 2>&1 || GOFLAGS= $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	golangci-lint run ./...

bench: ## testing.B benchmarks of the hot-path pieces
	$(GO) test -run '^$$' -bench . -benchmem ./...

demo: ## the end-to-end demo on a throwaway PostgreSQL
	$(GO) run ./cmd/wharf demo

ci: ## what CI runs
	bash .ci/run
