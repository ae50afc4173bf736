// Package awstest starts local AWS emulators for the tests of the AWS
// sinks (wharfsqs, wharfkinesis) and of the relay end to end: moto's server
// (moto_server, from the Python package moto), which speaks SQS's JSON and
// SNS's query protocols; fauxqs (npm), which speaks the same two on
// Node.js, and fast enough for the sinks' conformance suite, where moto's
// cost per message grows with the length of its queue; and kinesalite
// (npm), which speaks Kinesis Data Streams'. All accept any credentials.
//
// A test calls [Start], [StartFauxqs] or [StartKinesalite]; the server runs
// on a free port until the test's cleanup. Without the program the test
// fails under CI=true and is skipped otherwise (internal/testtool).
package awstest

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/wharfhq/wharf/internal/tcpgate"
	"github.com/wharfhq/wharf/internal/testtool"
)

// Region is the region the emulator is addressed with.
const Region = "us-east-1"

// AccessKey and SecretKey are the static credentials the tests sign with
// (the emulator accepts any).
const (
	AccessKey = "wharftest"
	SecretKey = "wharftestsecret"
)

// Server is a running emulator.
type Server struct {
	// Endpoint is its base URL, e.g. http://127.0.0.1:40123.
	Endpoint string
	// Account is the AWS account id in the ARNs it makes.
	Account string
	// naturalForm: the server reads a query-protocol request's list
	// members in the order their parameters come (see [Server.HTTPClient]).
	naturalForm bool
}

// HTTPClient returns an HTTP client for s's SDK clients (aws.Config's
// HTTPClient) whose idle connections close at t's cleanup, so that no
// connection goroutine outlives the test.
//
// For fauxqs it also puts the parameters of a form-encoded request (SNS's
// query protocol) in natural order, member.2 before member.10. The SDK
// encodes them sorted as text (member.1, member.10, member.2, ...), which
// AWS reads by index, while fauxqs takes a PublishBatch's entries in the
// order their parameters come, and so would publish the tenth entry of a
// batch to a FIFO topic second. The request says the same either way; the
// emulator does not verify signatures.
func (s *Server) HTTPClient(t testing.TB) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	if !s.naturalForm {
		return &http.Client{Transport: tr}
	}
	return &http.Client{Transport: naturalFormOrder{tr}}
}

// naturalFormOrder re-encodes form bodies with their keys in natural order.
type naturalFormOrder struct{ next http.RoundTripper }

func (n naturalFormOrder) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body == nil || !strings.HasPrefix(req.Header.Get("Content-Type"), "application/x-www-form-urlencoded") {
		return n.next.RoundTrip(req)
	}
	body, err := io.ReadAll(req.Body)
	_ = req.Body.Close()
	if err != nil {
		return nil, err
	}
	vals, err := url.ParseQuery(string(body))
	if err != nil {
		return nil, fmt.Errorf("awstest: form body: %w", err)
	}
	keys := slices.Collect(maps.Keys(vals))
	slices.SortFunc(keys, compareNatural)
	var b strings.Builder
	for _, k := range keys {
		for _, v := range vals[k] {
			if b.Len() > 0 {
				b.WriteByte('&')
			}
			b.WriteString(url.QueryEscape(k) + "=" + url.QueryEscape(v))
		}
	}
	out := req.Clone(req.Context())
	out.Body = io.NopCloser(strings.NewReader(b.String()))
	out.ContentLength = int64(b.Len())
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(b.String())), nil }
	return n.next.RoundTrip(out)
}

// compareNatural orders dotted keys part by part, numeric parts as numbers.
func compareNatural(a, b string) int {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := range min(len(pa), len(pb)) {
		na, errA := strconv.Atoi(pa[i])
		nb, errB := strconv.Atoi(pb[i])
		var c int
		if errA == nil && errB == nil {
			c = cmp.Compare(na, nb)
		} else {
			c = strings.Compare(pa[i], pb[i])
		}
		if c != 0 {
			return c
		}
	}
	return cmp.Compare(len(pa), len(pb))
}

// Config returns an AWS configuration that talks to s with static
// credentials; pass it to sqs.NewFromConfig and the like with
// BaseEndpoint set to s.Endpoint (see [Server.Endpoint]).
func (s *Server) Config() aws.Config {
	return aws.Config{
		Region:       Region,
		Credentials:  credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, ""),
		BaseEndpoint: aws.String(s.Endpoint),
	}
}

// Env returns the environment a child process (wharf relay) needs to reach
// s through the default credential chain and region.
func (s *Server) Env() []string {
	return []string{
		"AWS_ACCESS_KEY_ID=" + AccessKey,
		"AWS_SECRET_ACCESS_KEY=" + SecretKey,
		"AWS_REGION=" + Region,
		"AWS_EC2_METADATA_DISABLED=true",
	}
}

// Start starts moto_server on a free loopback port and stops it at t's
// cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	bin := testtool.Path(t, "moto_server", "the AWS emulator moto (pip install 'moto[server]'; the go-svc machine image has it)")
	port, err := freePort()
	if err != nil {
		t.Fatalf("awstest: no free port: %v", err)
	}
	s := start(t, exec.Command(bin, "-H", "127.0.0.1", "-p", fmt.Sprint(port)), fmt.Sprintf("http://127.0.0.1:%d", port), "/moto-api/")
	s.Account = "123456789012"
	return s
}

// start runs cmd, a server that will answer HTTP on endpoint, and waits
// until it answers a GET of probe.
func start(t testing.TB, cmd *exec.Cmd, endpoint, probe string) *Server {
	t.Helper()
	name := filepath.Base(cmd.Path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatalf("awstest: %v", err)
	}
	cmd.Stdout = cmd.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("awstest: start %s: %v", cmd.Path, err)
	}
	// Keep the log's tail for a failure report, and drain the pipe so the
	// server never blocks on a full one.
	tail := make(chan []string, 1)
	go func() {
		var lines []string
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			lines = append(lines, sc.Text())
			if len(lines) > 20 {
				lines = lines[1:]
			}
		}
		tail <- lines
	}()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		<-tail
	})
	s := &Server{Endpoint: endpoint}
	// Wait for its HTTP answer; the overall bound only guards a hang.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.Endpoint+probe, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			http.DefaultClient.CloseIdleConnections()
			return s
		}
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("awstest: %s exited at start-up (%v): %s", name, err, strings.Join(<-tail, " | "))
		case <-ctx.Done():
			t.Fatalf("awstest: %s did not answer on %s within a minute", name, s.Endpoint)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Reset forgets every queue, topic and stream of s.
func (s *Server) Reset(t testing.TB) {
	t.Helper()
	resp, err := http.Post(s.Endpoint+"/moto-api/reset", "application/json", nil)
	if err != nil {
		t.Fatalf("awstest: reset: %v", err)
	}
	_ = resp.Body.Close()
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// NewGate starts an open gate to s (see [tcpgate.Gate]); it is closed at
// t's cleanup. Its Endpoint is what a sink under test should use.
func (s *Server) NewGate(t testing.TB) *tcpgate.Gate {
	return tcpgate.New(t, strings.TrimPrefix(s.Endpoint, "http://"))
}

// KinesaliteDir is where .ci/run installs kinesalite (npm install --prefix)
// when it is not on PATH.
func KinesaliteDir() string {
	if d := os.Getenv("WHARF_KINESALITE_DIR"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "wharf", "kinesalite")
}

// StartKinesalite starts kinesalite, an implementation of the Kinesis Data
// Streams API on Node.js, in memory on a free loopback port, and stops it
// at t's cleanup. Streams it creates are active at once.
func StartKinesalite(t testing.TB) *Server {
	t.Helper()
	install := "kinesalite from npm: npm install --prefix " + KinesaliteDir() + " kinesalite@3.3.3 (.ci/run does)"
	bin := testtool.Path(t, "kinesalite", install, filepath.Join(KinesaliteDir(), "node_modules", ".bin", "kinesalite"))
	port, err := freePort()
	if err != nil {
		t.Fatalf("awstest: no free port: %v", err)
	}
	return start(t, exec.Command(bin, "--port", fmt.Sprint(port), "--createStreamMs", "0", "--deleteStreamMs", "0", "--updateStreamMs", "0", "--shardLimit", "10000"),
		fmt.Sprintf("http://127.0.0.1:%d", port), "/")
}

// FauxqsDir is where .ci/run installs fauxqs (npm install --prefix) when it
// is not on PATH.
func FauxqsDir() string {
	if d := os.Getenv("WHARF_FAUXQS_DIR"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "wharf", "fauxqs")
}

// FauxqsVersion is the fauxqs release the tests are written against: the
// last that runs on Node.js 20.
const FauxqsVersion = "1.9.2"

// StartFauxqs starts fauxqs, an emulator of SQS (JSON protocol) and SNS on
// Node.js, in memory on a free port, and stops it at t's cleanup. It
// listens on every interface of the machine (it has no option to choose);
// the tests reach it on the loopback address. Queue URLs it hands out name
// sqs.REGION.localhost, which the SDK only uses as the queue's id: requests
// go to the endpoint.
func StartFauxqs(t testing.TB) *Server {
	t.Helper()
	install := "fauxqs from npm: npm install --prefix " + FauxqsDir() + " fauxqs@" + FauxqsVersion + " (.ci/run does)"
	bin := testtool.Path(t, "fauxqs", install, filepath.Join(FauxqsDir(), "node_modules", ".bin", "fauxqs"))
	port, err := freePort()
	if err != nil {
		t.Fatalf("awstest: no free port: %v", err)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), fmt.Sprintf("FAUXQS_PORT=%d", port), "FAUXQS_LOGGER=false", "FAUXQS_DEFAULT_REGION="+Region)
	s := start(t, cmd, fmt.Sprintf("http://127.0.0.1:%d", port), "/")
	s.Account = "000000000000"
	s.naturalForm = true
	return s
}
