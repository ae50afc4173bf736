package cli

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/testdb"
	"github.com/wharfhq/wharf/internal/testtool"
)

// repoRoot is the module root, two directories up.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(root, "go.mod"))
	require.NoError(t, err)
	return root
}

var (
	releaseOnce sync.Once
	releaseDir  string // removed by TestMain
	releaseBin  string
	releaseOut  string
	releaseErr  error
)

// cliHelperEnv, set to 1, makes this test binary run as the wharf CLI (see
// TestMain).
const cliHelperEnv = "WHARF_CLI_TEST_HELPER"

// wharfCommand returns a command running the wharf CLI with args: the
// release binary in the long run (CI), and otherwise this test binary as
// the CLI (the release build compiles every dependency again, with other
// flags: minutes on a small machine).
func wharfCommand(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	if testtool.IsLong() {
		return exec.Command(releaseBinary(t), args...)
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), cliHelperEnv+"=1")
	return cmd
}

// versionFile is the VERSION file's version, which release builds print.
func versionFile(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "VERSION"))
	require.NoError(t, err)
	v := strings.TrimSpace(string(b))
	require.Regexp(t, `^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`, v, "VERSION holds a semantic version without a v")
	return v
}

// gitCheckout reports whether the module root is a git checkout whose
// revision go build records: a .git directory (go build finds no repository
// in a git worktree or submodule, whose .git is a file).
func gitCheckout(t *testing.T) bool {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		return false
	}
	fi, err := os.Stat(filepath.Join(repoRoot(t), ".git"))
	return err == nil && fi.IsDir()
}

// hostPlatform is the GOOS/GOARCH release name of this machine.
func hostPlatform() string { return runtime.GOOS + "-" + runtime.GOARCH }

// releaseBinary builds wharf for this machine with scripts/build-release.sh,
// once per test run, and returns its path.
func releaseBinary(t *testing.T) string {
	t.Helper()
	releaseOnce.Do(func() {
		dir, err := os.MkdirTemp("", "wharf-release-")
		if err != nil {
			releaseErr = err
			return
		}
		releaseDir = dir
		// A hang guard: a cold build cache on a busy machine takes minutes.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "bash", filepath.Join(repoRoot(t), "scripts", "build-release.sh"), dir)
		cmd.Env = append(os.Environ(), "WHARF_RELEASE_PLATFORMS="+runtime.GOOS+"/"+runtime.GOARCH)
		out, err := cmd.CombinedOutput()
		releaseOut, releaseErr = string(out), err
		releaseBin = filepath.Join(dir, "wharf-"+versionFile(t)+"-"+hostPlatform())
	})
	require.NoError(t, releaseErr, "scripts/build-release.sh:\n%s", releaseOut)
	return releaseBin
}

// requireSums checks that dir/SHA256SUMS lists exactly names, with their
// files' SHA-256 sums, in the format of sha256sum.
func requireSums(t *testing.T, dir string, names []string) {
	t.Helper()
	sums, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	require.NoError(t, err)
	var want strings.Builder
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		require.NoError(t, err)
		fmt.Fprintf(&want, "%x  %s\n", sha256.Sum256(b), n)
	}
	require.Equal(t, want.String(), string(sums))
}

// The release build prints the VERSION file's version and the revision it
// was built from when the source is a git checkout; the script names the
// binary after the version and platform and writes its checksum.
func TestReleaseBinaryRunsVersion(t *testing.T) {
	testtool.Long(t, "builds the release binary (every dependency compiled again)")
	t.Parallel()
	bin := releaseBinary(t)
	version := versionFile(t)
	out, err := exec.Command(bin, "version").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Regexp(t, `^wharf `+regexp.QuoteMeta(version)+` \(.*go1\.\S+ \S+/\S+, schema version 9\)\n$`, string(out))
	require.NotContains(t, string(out), "development build")
	require.Contains(t, releaseOut, strings.TrimSpace(string(out)), "the script runs the binary it built")
	if gitCheckout(t) {
		require.Regexp(t, `^wharf \S+ \(revision [0-9a-f]{12} `, string(out), "a build from a git checkout records the revision")
	}
	name := filepath.Base(bin)
	entries, err := os.ReadDir(releaseDir)
	require.NoError(t, err)
	var files []string
	for _, e := range entries {
		files = append(files, e.Name())
	}
	require.ElementsMatch(t, []string{name, "SHA256SUMS"}, files)
	requireSums(t, releaseDir, []string{name})
	// A static binary: no dynamic loader needed (the distroless static
	// image has none).
	f, err := os.ReadFile(bin)
	require.NoError(t, err)
	require.NotContains(t, string(f[:min(len(f), 4096)]), "/lib64/ld-linux", "the binary must be static")
}

// scriptBuildLine is the build command of scripts/build-release.sh and of
// the Dockerfile's build stage.
var scriptBuildLine = regexp.MustCompile(`(?m)^\s*(?:RUN )?(CGO_ENABLED=0 go build .*)$`)

// releaseLDFlags are the script's -ldflags, with the VERSION file read.
func releaseLDFlags(t *testing.T) string {
	t.Helper()
	script, err := os.ReadFile(filepath.Join(repoRoot(t), "scripts", "build-release.sh"))
	require.NoError(t, err)
	line := scriptBuildLine.FindStringSubmatch(string(script))
	require.NotNil(t, line)
	flags := regexp.MustCompile(`-ldflags="([^"]*)"`).FindStringSubmatch(line[1])
	require.NotNil(t, flags, "the build line has no -ldflags=\"...\": %s", line[1])
	require.Contains(t, flags[1], "$(cat VERSION)")
	return strings.ReplaceAll(flags[1], "$(cat VERSION)", versionFile(t))
}

var (
	ldflagsOnce sync.Once
	ldflagsBin  string
	ldflagsOut  string
	ldflagsErr  error
)

// ldflagsBinary builds ./cmd/wharf with the release script's -ldflags, once
// per test run. It leaves out the script's CGO_ENABLED=0 and -trimpath,
// which only change how the packages compile (and would compile every
// dependency again: minutes), not what -ldflags stamp; the long test builds
// with the script itself.
func ldflagsBinary(t *testing.T) string {
	t.Helper()
	flags := releaseLDFlags(t)
	ldflagsOnce.Do(func() {
		dir, err := os.MkdirTemp("", "wharf-ldflags-")
		if err != nil {
			ldflagsErr = err
			return
		}
		ldflagsDir = dir
		ldflagsBin = filepath.Join(dir, "wharf")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-buildvcs=auto", "-ldflags="+flags, "-o", ldflagsBin, "./cmd/wharf")
		cmd.Dir = repoRoot(t)
		out, err := cmd.CombinedOutput()
		ldflagsOut, ldflagsErr = string(out), err
	})
	require.NoError(t, ldflagsErr, "go build -ldflags=%q:\n%s", flags, ldflagsOut)
	return ldflagsBin
}

var ldflagsDir string // removed by TestMain

// A binary built with the release script's -ldflags prints the VERSION
// file's version, not "development build", and still its revision; this
// test binary, built without them, is a development build.
func TestReleaseFlagsSetTheVersion(t *testing.T) {
	t.Parallel()
	version := versionFile(t)
	out, err := exec.Command(ldflagsBinary(t), "version").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Regexp(t, `^wharf `+regexp.QuoteMeta(version)+` \(.*go1\.\S+ \S+/\S+, schema version 9\)\n$`, string(out))
	require.NotContains(t, string(out), "development build")
	if gitCheckout(t) {
		require.Regexp(t, `^wharf \S+ \(revision [0-9a-f]{12} `, string(out), "a build from a git checkout records the revision")
	}

	res, err := wharfCommand(t, "version").CombinedOutput()
	require.NoError(t, err, "%s", res)
	if !testtool.IsLong() {
		require.Regexp(t, `^wharf \S+ \(development build, `, string(res))
	}
}

// scripts/build-release.sh builds every platform with its build line, names
// each binary wharf-<version>-<os>-<arch>, lists their sums in
// SHA256SUMS and runs this machine's binary as a check. The compiler is
// replaced by a stand-in that records each build and writes the binary of
// TestReleaseFlagsSetTheVersion (compiling four platforms takes many
// minutes; CI runs the real script).
func TestReleaseScriptNamesAndSums(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	version := versionFile(t)
	bin := ldflagsBinary(t)
	realGo, err := exec.LookPath("go")
	require.NoError(t, err)
	stubDir := t.TempDir()
	builds := filepath.Join(stubDir, "builds.log")
	stub := `#!/bin/sh
if [ "$1" = build ]; then
  echo "$CGO_ENABLED $GOOS/$GOARCH $*" >> "$WHARF_STUB_BUILDS"
  while [ $# -gt 0 ]; do
    if [ "$1" = -o ]; then cp "$WHARF_STUB_BINARY" "$2"; fi
    shift
  done
  exit 0
fi
exec "$WHARF_STUB_GO" "$@"
`
	require.NoError(t, os.WriteFile(filepath.Join(stubDir, "go"), []byte(stub), 0o755))
	dist := filepath.Join(t.TempDir(), "dist")
	cmd := exec.Command("bash", filepath.Join(root, "scripts", "build-release.sh"), dist)
	cmd.Env = append(testdb.CleanEnv(), "PATH="+stubDir+string(os.PathListSeparator)+os.Getenv("PATH"),
		"WHARF_STUB_GO="+realGo, "WHARF_STUB_BINARY="+bin, "WHARF_STUB_BUILDS="+builds)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	var names []string
	var wantBuilds []string
	for _, p := range []string{"linux/amd64", "linux/arm64", "darwin/amd64", "darwin/arm64"} {
		names = append(names, "wharf-"+version+"-"+strings.Replace(p, "/", "-", 1))
		wantBuilds = append(wantBuilds, "0 "+p+" build -buildvcs=auto -trimpath -ldflags="+releaseLDFlags(t)+" -o ")
	}
	log, err := os.ReadFile(builds)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(log)), "\n")
	require.Len(t, lines, len(wantBuilds), "%s", log)
	for i, l := range lines {
		require.True(t, strings.HasPrefix(l, wantBuilds[i]), "build %d: %s\nwant it to start with %s", i, l, wantBuilds[i])
		require.True(t, strings.HasSuffix(l, " ./cmd/wharf"), l)
	}
	entries, err := os.ReadDir(dist)
	require.NoError(t, err)
	var files []string
	for _, e := range entries {
		files = append(files, e.Name())
	}
	require.ElementsMatch(t, append([]string{"SHA256SUMS"}, names...), files)
	requireSums(t, dist, names)
	require.Contains(t, string(out), "wharf "+version+" (", "the script runs this machine's binary")
}

// The Dockerfile's build stage and scripts/build-release.sh run the same
// build command.
func TestDockerfileAndReleaseScriptBuildAlike(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	docker, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	require.NoError(t, err)
	script, err := os.ReadFile(filepath.Join(root, "scripts", "build-release.sh"))
	require.NoError(t, err)
	d := scriptBuildLine.FindStringSubmatch(string(docker))
	s := scriptBuildLine.FindStringSubmatch(string(script))
	require.NotNil(t, d)
	require.NotNil(t, s)
	require.Equal(t, strings.Replace(d[1], "-o /wharf", `-o "$out/wharf"`, 1), s[1])
	require.Contains(t, d[1], `-trimpath -ldflags="-s -X github.com/wharfhq/wharf/internal/cli.Version=$(cat VERSION)"`)
	require.Regexp(t, `(?m)^FROM gcr.io/distroless/static\S*:nonroot$`, string(docker))
	require.Regexp(t, `(?m)^USER 65532:65532$`, string(docker))
}

// freeAddr returns a loopback address nobody listens on right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// The wharf relay (the release binary in the long run) serves /metrics,
// /healthz and /readyz on --admin-addr (the port the deploy examples scrape
// and probe), and SIGTERM stops it gracefully with exit status 0.
func TestRelayServesMetricsAndProbes(t *testing.T) {
	t.Parallel()
	b := newSchema(t)
	_, err := b.client.Enqueue(context.Background(), wharf.Message{Topic: "orders.paid", Key: "42", Payload: []byte(`{"order":42}`)})
	require.NoError(t, err)
	addr := freeAddr(t)
	cmd := wharfCommand(t, append([]string{"relay", "--sink", "null:", "--lease-ttl", "3s", "--rebalance-interval", "200ms"}, b.args...)...)
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, "WHARF_ADMIN_ADDR="+addr)
	stderrPath := filepath.Join(t.TempDir(), "relay.stderr")
	errf, err := os.Create(stderrPath)
	require.NoError(t, err)
	defer errf.Close()
	cmd.Stderr = errf
	stderr := logFile(stderrPath)
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill()
		<-done
	}()
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	require.Eventually(t, func() bool { code, _ := get("/readyz"); return code == http.StatusOK }, time.Minute, 50*time.Millisecond,
		"/readyz never answered 200\n%s", stderr.String())
	code, body := get("/healthz")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"live":true`)
	require.Eventually(t, func() bool {
		_, body := get("/metrics")
		return strings.Contains(body, `wharf_messages_delivered_total{topic="orders.paid"} 1`)
	}, time.Minute, 50*time.Millisecond, "the delivery is not counted on /metrics")
	_, body = get("/metrics")
	require.Contains(t, body, "wharf_relay_info{")
	require.Contains(t, body, "wharf_lanes_owned 64")

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-done:
		done <- err
		require.NoError(t, err, "exit status after SIGTERM\n%s", stderr.String())
	case <-time.After(15 * time.Second):
		t.Fatalf("the relay did not stop within 15s of SIGTERM\n%s", stderr.String())
	}
	var owned int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.schema+".lanes WHERE owner IS NOT NULL").Scan(&owned))
	require.Zero(t, owned, "a graceful stop hands every lane back")
}

// logFile prints a child process's log file in failure messages.
type logFile string

func (l logFile) String() string {
	b, err := os.ReadFile(string(l))
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// settingNames are the WHARF_* variables some command reads.
func settingNames(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{"WHARF_CONFIG": true}
	mark := func(f *pflag.Flag) {
		if isSetting(f) {
			for _, n := range envNames(f.Name) {
				names[n] = true
			}
		}
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(mark)
		c.PersistentFlags().VisitAll(mark)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRoot(ioStreams{stdout: io.Discard, stderr: io.Discard}))
	require.True(t, names["WHARF_MAX_ATTEMPTS"])
	return names
}

type httpProbe struct {
	HTTPGet struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
}

var wharfVar = regexp.MustCompile(`\bWHARF_[A-Z_]+\b`)

// The deployment examples start what they say: the compose file runs the
// migration as a one-shot before the relays, a relay to NATS JetStream with
// its admin port scraped by Prometheus, Grafana provisioned from
// deploy/grafana; the Kubernetes relays probe /healthz and /readyz on :9090
// and outlast their stop timeout; the systemd unit is hardened; and every
// WHARF_* variable they set is a real setting.
func TestDeployExamples(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	read := func(rel string) string {
		b, err := os.ReadFile(filepath.Join(root, rel))
		require.NoError(t, err, rel)
		return string(b)
	}
	settings := settingNames(t)
	for _, f := range []string{"deploy/compose/compose.yaml", "deploy/kubernetes/deployment.yaml", "deploy/kubernetes/migrate-job.yaml",
		"deploy/kubernetes/secret.yaml", "deploy/systemd/wharf.env.example", "deploy/systemd/wharf-relay.service", "Dockerfile"} {
		for _, v := range wharfVar.FindAllString(read(f), -1) {
			require.Truef(t, settings[v], "%s uses %s, which is no wharf setting", f, v)
		}
	}

	var compose struct {
		Services map[string]struct {
			Command     []string          `yaml:"command"`
			Environment map[string]string `yaml:"environment"`
			Volumes     []string          `yaml:"volumes"`
			Restart     string            `yaml:"restart"`
			DependsOn   map[string]struct {
				Condition string `yaml:"condition"`
			} `yaml:"depends_on"`
		} `yaml:"services"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(read("deploy/compose/compose.yaml")), &compose))
	s := compose.Services
	require.Equal(t, []string{"migrate", "up"}, s["migrate"].Command)
	require.Equal(t, "no", s["migrate"].Restart)
	require.Equal(t, "service_completed_successfully", s["relay"].DependsOn["migrate"].Condition)
	require.Equal(t, []string{"relay"}, s["relay"].Command)
	require.True(t, strings.HasPrefix(s["relay"].Environment["WHARF_SINK"], "nats://nats:4222"))
	require.Equal(t, ":9090", s["relay"].Environment["WHARF_ADMIN_ADDR"])
	require.NotEmpty(t, s["relay"].Environment["WHARF_DATABASE_URL"], "the relay keeps the shared environment")
	require.Contains(t, s["nats"].Command, "--jetstream")
	require.Contains(t, s["prometheus"].Volumes, "../prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro")
	require.Contains(t, s["grafana"].Volumes, "../grafana/provisioning:/etc/grafana/provisioning:ro")
	require.Contains(t, s["grafana"].Volumes, "../grafana/dashboards:/var/lib/grafana/dashboards/wharf:ro")
	prom := read("deploy/compose/prometheus.yml")
	require.Contains(t, prom, "port: 9090")
	require.Contains(t, prom, "metrics_path: /metrics")
	for _, f := range []string{"deploy/grafana/dashboards/wharf.json", "deploy/prometheus/alerts.yml", "deploy/grafana/provisioning/dashboards/wharf.yml"} {
		_, err := os.Stat(filepath.Join(root, f))
		require.NoError(t, err, "compose mounts %s", f)
	}
	t.Run("promtool check config", func(t *testing.T) {
		promtool := testtool.Path(t, "promtool", "checks deploy/compose/prometheus.yml: apt-get install prometheus")
		out, err := exec.Command(promtool, "check", "config", filepath.Join(root, "deploy/compose/prometheus.yml")).CombinedOutput()
		require.NoError(t, err, "%s", out)
	})

	var deploy struct {
		Spec struct {
			Template struct {
				Spec struct {
					TerminationGracePeriodSeconds int `yaml:"terminationGracePeriodSeconds"`
					Containers                    []struct {
						Args  []string `yaml:"args"`
						Ports []struct {
							Name          string `yaml:"name"`
							ContainerPort int    `yaml:"containerPort"`
						} `yaml:"ports"`
						Env []struct {
							Name  string `yaml:"name"`
							Value string `yaml:"value"`
						} `yaml:"env"`
						LivenessProbe  httpProbe `yaml:"livenessProbe"`
						ReadinessProbe httpProbe `yaml:"readinessProbe"`
					} `yaml:"containers"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(read("deploy/kubernetes/deployment.yaml")), &deploy))
	pod := deploy.Spec.Template.Spec
	c := pod.Containers[0]
	require.Equal(t, []string{"relay"}, c.Args)
	require.Equal(t, 9090, c.Ports[0].ContainerPort)
	require.Equal(t, "/healthz", c.LivenessProbe.HTTPGet.Path)
	require.Equal(t, "/readyz", c.ReadinessProbe.HTTPGet.Path)
	require.Equal(t, c.Ports[0].Name, c.LivenessProbe.HTTPGet.Port)
	require.Equal(t, c.Ports[0].Name, c.ReadinessProbe.HTTPGet.Port)
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	require.Equal(t, ":9090", env["WHARF_ADMIN_ADDR"])
	stop, err := time.ParseDuration(env["WHARF_STOP_TIMEOUT"])
	require.NoError(t, err)
	require.Greater(t, time.Duration(pod.TerminationGracePeriodSeconds)*time.Second, stop, "the grace period must outlast --stop-timeout")
	require.Contains(t, read("deploy/kubernetes/pdb.yaml"), "kind: PodDisruptionBudget")
	require.Contains(t, read("deploy/kubernetes/migrate-job.yaml"), `args: ["migrate", "up"]`)
	require.Contains(t, read("deploy/kubernetes/secret.yaml"), "WHARF_DATABASE_URL:")

	unit := read("deploy/systemd/wharf-relay.service")
	for _, want := range []string{"DynamicUser=yes", "NoNewPrivileges=yes", "ProtectSystem=strict", "EnvironmentFile=/etc/wharf/wharf.env", "ExecStart=/usr/local/bin/wharf relay"} {
		require.Contains(t, unit, "\n"+want+"\n")
	}
	require.Contains(t, unit, "\nTimeoutStopSec=45s\n", "longer than the 30s default --stop-timeout")
}
