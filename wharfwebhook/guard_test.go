package wharfwebhook

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wharfhq/wharf"
)

// The embedded-IPv4 and special-purpose IPv6 forms are refused like the
// addresses they stand for; their public forms are allowed.
func TestBlockedReasonIPv6Forms(t *testing.T) {
	t.Parallel()
	for a, want := range map[string]string{
		"::ffff:127.0.0.1":        "loopback",
		"::ffff:169.254.169.254":  "link-local",
		"64:ff9b::7f00:1":         "loopback",
		"64:ff9b:1::1":            "local-use NAT64",
		"64:ff9b:1:ffff::808:808": "local-use NAT64",
		"::ffff:0:7f00:1":         "IPv4-translated",
		"::ffff:0:808:808":        "IPv4-translated",
		"::7f00:1":                "IPv4-compatible",
		"2002:7f00:1::1":          "loopback",
		"2002:a9fe:a9fe::":        "link-local",
		"2002:c0a8:101::1":        "private",
	} {
		why, bad := blockedReason(netip.MustParseAddr(a))
		if !bad || !strings.Contains(why, want) {
			t.Errorf("%s: %q %v, want it refused as %s", a, why, bad, want)
		}
	}
	for _, a := range []string{"::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1", "2a00:1450:4001::1"} {
		if why, bad := blockedReason(netip.MustParseAddr(a)); bad {
			t.Errorf("%s is refused as %s, want it allowed", a, why)
		}
	}
	// The dial-time check sees the address as the dialler writes it.
	for _, addr := range []string{"[::ffff:127.0.0.1]:80", "0.0.0.0:443", "[::]:80", "[64:ff9b:1::a00:1]:80", "127.0.0.1:8080"} {
		var be *blockedError
		if err := guardControl("tcp", addr, nil); !errors.As(err, &be) {
			t.Errorf("dialling %s: %v, want it refused", addr, err)
		}
	}
}

// A URL host written as IPv4-mapped IPv6 or 0.0.0.0 is refused at Open; a
// decimal, octal or hexadecimal IPv4 form is refused whatever
// wharf_allow_private says, since resolvers disagree on what it means.
func TestAddressFormsInURLs(t *testing.T) {
	t.Parallel()
	srv := newServer(t, nil)
	port := strconv.Itoa(srv.Listener.Addr().(*net.TCPAddr).Port)
	for _, host := range []string{"[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "0.0.0.0", "[::]", "[64:ff9b::a9fe:a9fe]"} {
		raw := "http://" + host + ":" + port + "/hook"
		_, err := Open(context.Background(), mustURL(t, raw))
		if err == nil || !strings.Contains(err.Error(), "wharf_allow_private=true") {
			t.Errorf("Open %s: %v, want it refused", raw, err)
		}
		if _, err := New(Options{URL: raw}); err == nil || !strings.Contains(err.Error(), "Options.AllowPrivate") {
			t.Errorf("New %s: %v, want it refused", raw, err)
		}
	}
	for _, host := range []string{"2130706433", "0177.0.0.1", "0x7f.0.0.1", "0x7f000001", "127.1", "017700000001", "1.2.3", "example.0x10"} {
		for _, q := range []string{"", "?wharf_allow_private=true"} {
			raw := "http://" + host + ":" + port + "/hook" + q
			_, err := Open(context.Background(), mustURL(t, raw))
			if err == nil || !strings.Contains(err.Error(), "dotted decimal") || strings.Contains(err.Error(), "\n") {
				t.Errorf("Open %s: %v, want a one-line error asking for dotted decimal", raw, err)
			}
		}
		if _, err := New(Options{URL: "http://" + host + "/", AllowPrivate: true}); err == nil || !strings.Contains(err.Error(), "dotted decimal") {
			t.Errorf("New %s: %v, want it refused", host, err)
		}
	}
	for _, host := range []string{"hooks.example.com", "1host.example", "example.com.", "h-0x1.example"} {
		if ambiguousIPv4(host) {
			t.Errorf("%s is taken for a numeric IPv4 address", host)
		}
	}
	if n := len(srv.requests()); n != 0 {
		t.Fatalf("%d requests reached the server", n)
	}
}

// A redirect to a private address is not followed: the message fails
// permanently, naming the location, and the private target gets nothing.
func TestRedirectToPrivateAddressIsNotFollowed(t *testing.T) {
	t.Parallel()
	private := newServer(t, nil)
	for _, loc := range []string{
		"http://169.254.169.254/latest/meta-data/iam/security-credentials/",
		private.URL + "/admin",
		fmt.Sprintf("http://[::ffff:127.0.0.1]:%d/admin", private.Listener.Addr().(*net.TCPAddr).Port),
	} {
		srv := newServer(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) bool {
			w.Header().Set("Location", loc)
			w.WriteHeader(http.StatusTemporaryRedirect)
			return true
		})
		s := openURL(t, srv.URL+"/hook?wharf_allow_private=true")
		err := errAt(publish(t, s, msg(1, "t", "", "{}")), 0)
		if !wharf.IsPermanent(err) || !strings.Contains(err.Error(), "307 Temporary Redirect") || !strings.Contains(err.Error(), "follows no redirects") {
			t.Errorf("redirect to %s: %v, want a permanent error", loc, err)
		}
		if n := len(srv.requests()); n != 1 {
			t.Errorf("redirect to %s: the destination got %d requests, want 1", loc, n)
		}
	}
	if n := len(private.requests()); n != 0 {
		t.Fatalf("the private target got %d requests", n)
	}
}

// dnsServer is a DNS server on 127.0.0.1 that answers A queries for one name
// with answers[0] the first time, answers[1] every later time, and AAAA
// queries with no address.
type dnsServer struct {
	conn    net.PacketConn
	name    string
	answers [2]netip.Addr
	mu      sync.Mutex
	lookups int
	done    chan struct{}
}

func newDNSServer(t *testing.T, name string, first, later netip.Addr) *dnsServer {
	t.Helper()
	conn, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &dnsServer{conn: conn, name: name, answers: [2]netip.Addr{first, later}, done: make(chan struct{})}
	go d.serve()
	t.Cleanup(func() {
		_ = conn.Close()
		<-d.done
	})
	return d
}

// resolver returns a resolver that asks only this server.
func (d *dnsServer) resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dialer net.Dialer
		return dialer.DialContext(ctx, "udp", d.conn.LocalAddr().String())
	}}
}

func (d *dnsServer) aLookups() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lookups
}

func (d *dnsServer) serve() {
	defer close(d.done)
	buf := make([]byte, 1500)
	for {
		n, from, err := d.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		if reply := d.answer(buf[:n]); reply != nil {
			_, _ = d.conn.WriteTo(reply, from)
		}
	}
}

// answer builds the reply to one query (RFC 1035 section 4): the header,
// the question echoed, and an A record for d.name when asked for one.
func (d *dnsServer) answer(q []byte) []byte {
	if len(q) < 12 || binary.BigEndian.Uint16(q[4:]) != 1 {
		return nil
	}
	var labels []string
	i := 12
	for i < len(q) && q[i] != 0 {
		l := int(q[i])
		if i+1+l > len(q) {
			return nil
		}
		labels = append(labels, string(q[i+1:i+1+l]))
		i += 1 + l
	}
	if i+5 > len(q) {
		return nil
	}
	qtype := binary.BigEndian.Uint16(q[i+1:])
	question := q[12 : i+5]
	name := strings.ToLower(strings.Join(labels, "."))
	rcode := uint16(0)
	var rdata []byte
	switch {
	case name != d.name:
		rcode = 3 // NXDOMAIN
	case qtype == 1: // A
		d.mu.Lock()
		a := d.answers[min(d.lookups, 1)]
		d.lookups++
		d.mu.Unlock()
		b := a.As4()
		rdata = b[:]
	}
	reply := make([]byte, 12, 12+len(question)+16)
	copy(reply, q[:2])                                                // id
	binary.BigEndian.PutUint16(reply[2:], 0x8580|rcode)               // response, authoritative, recursion desired and available
	binary.BigEndian.PutUint16(reply[4:], 1)                          // one question
	binary.BigEndian.PutUint16(reply[6:], uint16(min(len(rdata), 1))) // answers
	reply = append(reply, question...)
	if rdata != nil {
		reply = append(reply, 0xc0, 12)                 // the name: a pointer to the question's
		reply = binary.BigEndian.AppendUint16(reply, 1) // A
		reply = binary.BigEndian.AppendUint16(reply, 1) // IN
		reply = binary.BigEndian.AppendUint32(reply, 0) // TTL: do not cache
		reply = binary.BigEndian.AppendUint16(reply, 4) // length
		reply = append(reply, rdata...)
	}
	return reply
}

// DNS rebinding: the destination's name resolves to a public address when
// the sink is opened and to loopback when it connects. The check made at
// dial time refuses the connection, permanently, and nothing reaches the
// server listening on that loopback address.
func TestDNSRebindingIsRefusedAtDial(t *testing.T) {
	t.Parallel()
	srv := newServer(t, nil)
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	const name = "hooks.rebind.test"
	dns := newDNSServer(t, name, netip.MustParseAddr("93.184.215.14"), netip.MustParseAddr("127.0.0.1"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := openSink(ctx, mustURL(t, fmt.Sprintf("http://%s:%d/hook", name, port)), dns.resolver())
	if err != nil {
		t.Fatalf("Open, while %s resolves to a public address: %v", name, err)
	}
	defer s.Close()
	if n := dns.aLookups(); n != 1 {
		t.Fatalf("Open made %d lookups, want 1", n)
	}
	errs := s.Publish(ctx, []*wharf.Message{msg(1, "t", "k", "{}"), msg(2, "t", "k", "{}")})
	err = errAt(errs, 0)
	want := fmt.Sprintf("refused to connect to 127.0.0.1:%d, a loopback address", port)
	if !wharf.IsPermanent(err) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "wharf_allow_private=true") {
		t.Fatalf("Publish after %s moved to 127.0.0.1: %v, want a permanent error saying %q", name, err, want)
	}
	if !errors.Is(errAt(errs, 1), wharf.ErrNotAttempted) {
		t.Errorf("message 2: %v, want ErrNotAttempted", errAt(errs, 1))
	}
	if n := dns.aLookups(); n < 2 {
		t.Errorf("%d lookups: the sink did not resolve the name again when connecting", n)
	}
	if n := len(srv.requests()); n != 0 {
		t.Fatalf("%d requests reached the loopback server", n)
	}

	// The same name and server with wharf_allow_private=true: delivered,
	// which shows the refusal above came from the address check.
	allowed, err := openSink(ctx, mustURL(t, fmt.Sprintf("http://%s:%d/hook?wharf_allow_private=true", name, port)), dns.resolver())
	if err != nil {
		t.Fatal(err)
	}
	defer allowed.Close()
	if errs := allowed.Publish(ctx, []*wharf.Message{msg(1, "t", "k", "{}")}); errs != nil {
		t.Fatalf("with wharf_allow_private=true: %v", errs)
	}

	// A name that resolves to loopback already when opening is refused then.
	_, err = openSink(ctx, mustURL(t, fmt.Sprintf("http://%s:%d/hook", name, port)), dns.resolver())
	if err == nil || !strings.Contains(err.Error(), "resolves to 127.0.0.1, a loopback address") {
		t.Fatalf("Open while %s resolves to 127.0.0.1: %v, want it refused", name, err)
	}
}
