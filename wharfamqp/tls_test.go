package wharfamqp

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/testpki"
	"github.com/wharfhq/wharf/internal/testtool"
)

// tlsNodeStart bounds a private RabbitMQ node's start (about 8 s here).
const tlsNodeStart = 90 * time.Second

// A private RabbitMQ node that listens only for TLS, with a private CA's
// server certificate and client certificates required (verify_peer,
// fail_if_no_peer_cert): amqps:// with cacertfile, certfile and keyfile
// publishes, and the queue holds the messages in order; a URL trusting
// another CA fails with a certificate error, and one without a client
// certificate is refused by the broker.
func TestTLSWithPrivateCAAndClientCertificate(t *testing.T) {
	port, pki := startTLSNode(t)
	base := fmt.Sprintf("amqps://guest:guest@localhost:%d/", port)

	ctls, err := pki.ClientTLS()
	if err != nil {
		t.Fatal(err)
	}
	ctls.ServerName = "localhost"
	var admin *amqp.Connection
	deadline := time.Now().Add(tlsNodeStart)
	for {
		if admin, err = amqp.DialTLS(base, ctls); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the private node did not accept a TLS connection within %s: %v", tlsNodeStart, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
	defer admin.Close()
	ch, err := admin.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	id := randomID()
	exchange, queue := "wharftls."+id, "wharftls."+id+".q"
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeDirect, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(queue, "orders", exchange, false, nil); err != nil {
		t.Fatal(err)
	}

	open := func(opts url.Values) (wharf.Sink, error) {
		opts.Set("exchange", exchange)
		opts.Set("routing_key_template", TopicPlaceholder)
		opts.Set("dial_timeout", "5s")
		u, err := url.Parse(base + "?" + opts.Encode())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		return Open(ctx, u)
	}

	s, err := open(url.Values{"cacertfile": {pki.CA}, "certfile": {pki.ClientCert}, "keyfile": {pki.ClientKey}})
	if err != nil {
		t.Fatalf("open over TLS with the private CA and a client certificate: %v", err)
	}
	msgs := []*wharf.Message{
		{ID: wharf.FormatID(1, 11), Seq: 1, Topic: "orders", Key: "k", Payload: []byte("one"), Attempt: 1},
		{ID: wharf.FormatID(2, 12), Seq: 2, Topic: "orders", Key: "k", Payload: []byte("two"), Attempt: 1},
	}
	errs, _ := publish(t, s, msgs)
	_ = s.Close()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("message %d over TLS: %v", i, err)
		}
	}
	for i, want := range []string{"one", "two"} {
		d, ok, err := ch.Get(queue, true)
		if err != nil || !ok {
			t.Fatalf("get message %d from %s: ok=%v err=%v", i, queue, ok, err)
		}
		if string(d.Body) != want || d.MessageId != msgs[i].ID {
			t.Fatalf("message %d: got %q (id %s), want %q (id %s)", i, d.Body, d.MessageId, want, msgs[i].ID)
		}
	}

	// Another CA: the broker's certificate does not verify.
	if s, err := open(url.Values{"cacertfile": {pki.OtherCA}, "certfile": {pki.ClientCert}, "keyfile": {pki.ClientKey}}); err == nil {
		_ = s.Close()
		t.Fatal("open trusting another CA succeeded")
	} else if !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("open trusting another CA: %v: want a certificate error", err)
	}
	// No client certificate: the broker refuses it. With TLS 1.3 the client
	// finishes its side of the handshake first, so the refusal reaches it
	// either as the broker's alert, as the connection reset under the AMQP
	// header it goes on to write, or, when the close is read while the
	// client waits for the broker's first AMQP frame, as amqp091's
	// "channel/connection is not open" (ErrClosed) — whichever comes first.
	// The same broker took the connection with the certificate above.
	if s, err := open(url.Values{"cacertfile": {pki.CA}}); err == nil {
		_ = s.Close()
		t.Fatal("open without a client certificate succeeded against a broker that requires one")
	} else if msg := err.Error(); !strings.Contains(msg, "certificate required") && !strings.Contains(msg, "connection reset by peer") &&
		!strings.Contains(msg, "broken pipe") && !strings.Contains(msg, amqp.ErrClosed.Reason) {
		t.Fatalf("open without a client certificate: %v: want the broker's certificate-required alert or the connection it closed", err)
	}
}

// startTLSNode starts a RabbitMQ node of its own (name, ports, data and
// logs in a temporary directory) with only a TLS listener, and stops it at
// cleanup. It needs rabbitmq-server and rabbitmqctl and, like the package's
// service wrapper, root (the node runs as the rabbitmq user): under CI=true
// a missing one fails the test, otherwise it is skipped.
func startTLSNode(t *testing.T) (int, *testpki.PKI) {
	t.Helper()
	missing := func(why string) {
		testtool.Missing(t, "rabbitmq-server", why+": the TLS case runs a private RabbitMQ node")
	}
	server := testtool.Path(t, "rabbitmq-server", "the TLS case runs a private RabbitMQ node: apt-get install rabbitmq-server")
	ctl := testtool.Path(t, "rabbitmqctl", "the TLS case runs a private RabbitMQ node: apt-get install rabbitmq-server")
	if os.Geteuid() != 0 {
		missing("a private RabbitMQ node needs root (rabbitmq-server runs it as the rabbitmq user)")
	}
	rmq, err := user.Lookup("rabbitmq")
	if err != nil {
		missing("no rabbitmq user")
	}
	uid, _ := strconv.Atoi(rmq.Uid)
	gid, _ := strconv.Atoi(rmq.Gid)

	dir, err := os.MkdirTemp("", "wharf-rabbit-tls-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	pki, err := testpki.New(filepath.Join(dir, "pki"))
	if err != nil {
		t.Fatal(err)
	}
	port, dist := freeTCPPort(t), freeTCPPort(t)
	conf := fmt.Sprintf(`listeners.tcp = none
listeners.ssl.default = 127.0.0.1:%d
ssl_options.cacertfile = %s
ssl_options.certfile = %s
ssl_options.keyfile = %s
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = true
`, port, pki.CA, pki.ServerCert, pki.ServerKey)
	for _, d := range []string{"mnesia", "log"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "rabbitmq.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "plugins"), []byte("[].\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	}); err != nil {
		t.Fatal(err)
	}
	node := "wharftls" + randomID() + "@localhost"
	env := append(os.Environ(),
		"RABBITMQ_NODENAME="+node,
		"RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq.conf"),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "plugins"),
		"RABBITMQ_PID_FILE="+filepath.Join(dir, "node.pid"),
		fmt.Sprintf("RABBITMQ_DIST_PORT=%d", dist))
	cmd := exec.Command(server)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := os.Create(filepath.Join(dir, "server.out"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The service wrapper hands the node to the rabbitmq user in a
		// session of its own: stop it by name, then reap the wrapper.
		stop := exec.Command(ctl, "-n", node, "stop")
		stop.Env = env
		if b, err := stop.CombinedOutput(); err != nil {
			t.Logf("stop the private node %s: %v: %s", node, err, b)
			if b, err := os.ReadFile(filepath.Join(dir, "node.pid")); err == nil {
				if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		_ = out.Close()
		if t.Failed() {
			if b, err := os.ReadFile(filepath.Join(dir, "server.out")); err == nil {
				t.Logf("private node output:\n%s", b)
			}
		}
	})
	return port, pki
}

func freeTCPPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
