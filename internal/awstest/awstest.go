// Package awstest starts a local AWS emulator for the tests of the AWS sinks
// (wharfsqs, wharfkinesis) and of the relay end to end: moto's server
// (moto_server, from the Python package moto), which speaks the same wire
// protocols as SQS (JSON), SNS (query) and Kinesis Data Streams (JSON) and
// accepts any credentials.
//
// A test calls [Start]; the server runs on a free loopback port until the
// test's cleanup. Without moto_server the test fails under CI=true and is
// skipped otherwise (internal/testtool).
package awstest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os/exec"
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
	cmd := exec.Command(bin, "-H", "127.0.0.1", "-p", fmt.Sprint(port))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatalf("awstest: %v", err)
	}
	cmd.Stdout = nil
	if err := cmd.Start(); err != nil {
		t.Fatalf("awstest: start %s: %v", bin, err)
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
	s := &Server{Endpoint: fmt.Sprintf("http://127.0.0.1:%d", port)}
	// Wait for its HTTP answer; the overall bound only guards a hang.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.Endpoint+"/moto-api/", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			return s
		}
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("awstest: moto_server exited at start-up (%v): %s", err, strings.Join(<-tail, " | "))
		case <-ctx.Done():
			t.Fatalf("awstest: moto_server did not answer on %s within a minute", s.Endpoint)
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
