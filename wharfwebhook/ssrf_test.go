package wharfwebhook

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/wharfhq/wharf"
)

// Hosts that are, or may be read as, private, loopback, unspecified or
// link-local addresses are refused at Open and New, with a one-line error
// that says how to allow them, and nothing reaches a server.
func TestSSRFAddressFormsAreRefused(t *testing.T) {
	t.Parallel()
	srv := newServer(t, nil)
	port := strconv.Itoa(srv.Listener.Addr().(*net.TCPAddr).Port)
	// Refused unless wharf_allow_private=true.
	private := []string{
		"[::ffff:127.0.0.1]", "[::ffff:10.0.0.1]", "[::ffff:192.168.1.1]", "[::ffff:172.16.0.1]", "[::ffff:169.254.169.254]",
		"[::ffff:0.0.0.0]", "[0:0:0:0:0:ffff:7f00:1]", "[::FFFF:7F00:1]", "[::ffff:a9fe:a9fe]", "[::127.0.0.1]",
		"0.0.0.0", "[::]", "[::1]", "127.0.0.1", "127.255.255.254", "10.0.0.1", "169.254.169.254", "100.64.0.1",
		"[fe80::1%25eth0]", "[fd00::1]", "[64:ff9b::a00:1]", "[2002:a00:1::]", "user@127.0.0.1", "example.com@10.0.0.1",
	}
	for _, host := range private {
		raw := "http://" + host + ":" + port + "/hook"
		_, err := Open(context.Background(), mustURL(t, raw))
		if err == nil || !strings.Contains(err.Error(), "wharf_allow_private=true") || strings.Contains(err.Error(), "\n") {
			t.Errorf("Open %s: %v, want a one-line refusal naming wharf_allow_private=true", raw, err)
		}
		if _, err := New(Options{URL: raw}); err == nil || !strings.Contains(err.Error(), "Options.AllowPrivate") {
			t.Errorf("New %s: %v, want it refused", raw, err)
		}
	}
	// Refused whatever wharf_allow_private says: readers disagree on them.
	ambiguous := []string{"2130706433", "0177.0.0.1", "0177.0000.0000.0001", "0x7f.0.0.1", "0x7F000001", "127.1", "127.0.1",
		"017700000001", "0", "10.1", "167772161", "012.0.0.1", "127.000.000.001", "0xa9.0xfe.0xa9.0xfe", "3232235777", "0300.0250.0.1"}
	for _, host := range ambiguous {
		for _, q := range []string{"", "?wharf_allow_private=true"} {
			raw := "http://" + host + ":" + port + "/hook" + q
			_, err := Open(context.Background(), mustURL(t, raw))
			if err == nil || !strings.Contains(err.Error(), "dotted decimal") || strings.Contains(err.Error(), "\n") {
				t.Errorf("Open %s: %v, want a one-line error asking for dotted decimal", raw, err)
			}
		}
	}
	// localhost resolves (through /etc/hosts) to loopback: refused at Open.
	if _, err := Open(context.Background(), mustURL(t, "http://localhost:"+port+"/hook")); err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Errorf("Open localhost: %v, want it refused as loopback", err)
	}
	if n := len(srv.requests()); n != 0 {
		t.Fatalf("%d requests reached the server", n)
	}
}

// The dial-time check refuses every non-public address as the dialler
// writes it, whatever the host name said.
func TestSSRFDialTimeCheck(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{
		"[::ffff:127.0.0.1]:80", "[::ffff:10.0.0.1]:443", "[::ffff:0.0.0.0]:80", "0.0.0.0:80", "[::]:443", "10.0.0.1:80",
		"172.31.255.255:80", "192.168.0.1:80", "169.254.169.254:80", "[fe80::1%eth0]:80", "[fc00::1]:80", "[::1]:80",
		"[64:ff9b::7f00:1]:80", "[2002:7f00:1::]:80", "224.0.0.1:80", "255.255.255.255:80", "not-an-address:80", "no-port",
	} {
		var be *blockedError
		if err := guardControl("tcp", addr, nil); !errors.As(err, &be) {
			t.Errorf("dialling %s: %v, want it refused", addr, err)
		}
	}
	for _, addr := range []string{"93.184.215.14:443", "[2606:2800:21f:cb07:6820:80da:af6b:8b2c]:443", "[::ffff:8.8.8.8]:53"} {
		if err := guardControl("tcp", addr, nil); err != nil {
			t.Errorf("dialling public %s: %v, want it allowed", addr, err)
		}
	}
}

// No redirect is followed, whatever its status and target (private
// addresses in every form, metadata, localhost), in single and batch mode:
// the message fails permanently and the target gets nothing.
func TestSSRFRedirectsAreNotFollowed(t *testing.T) {
	t.Parallel()
	target := newServer(t, nil)
	tport := target.Listener.Addr().(*net.TCPAddr).Port
	locations := []string{
		fmt.Sprintf("http://127.0.0.1:%d/admin", tport),
		fmt.Sprintf("http://[::ffff:127.0.0.1]:%d/admin", tport),
		fmt.Sprintf("http://localhost:%d/admin", tport),
		fmt.Sprintf("http://2130706433:%d/admin", tport),
		fmt.Sprintf("http://0177.0.0.1:%d/admin", tport),
		"http://[::ffff:10.0.0.1]/", "http://10.0.0.1/", "http://0.0.0.0/", "http://169.254.169.254/latest/meta-data/",
		"/relative/admin",
	}
	for _, status := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		for _, mode := range []string{"single", "batch"} {
			for _, loc := range locations {
				srv := newServer(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) bool {
					w.Header().Set("Location", loc)
					w.WriteHeader(status)
					return true
				})
				s := openURL(t, srv.URL+"/hook?wharf_allow_private=true&wharf_timeout=5s&wharf_mode="+mode)
				err := errAt(publish(t, s, msg(1, "t", "", "{}")), 0)
				if !wharf.IsPermanent(err) || !strings.Contains(err.Error(), "follows no redirects") || !strings.Contains(err.Error(), strconv.Itoa(status)) {
					t.Errorf("%s mode, %d to %s: %v, want a permanent error", mode, status, loc, err)
				}
				if n := len(srv.requests()); n != 1 {
					t.Errorf("%s mode, %d to %s: the destination got %d requests, want 1", mode, status, loc, n)
				}
			}
		}
	}
	if n := len(target.requests()); n != 0 {
		t.Fatalf("the redirect target got %d requests", n)
	}
}

// DNS rebinding to other non-public addresses than loopback: the name
// resolves to a public address when the sink is opened and to a private,
// link-local or unspecified one on the next lookup; the connection is
// refused at dial time, permanently, before any packet is sent there.
func TestSSRFRebindingToPrivateAddresses(t *testing.T) {
	t.Parallel()
	for _, later := range []string{"10.0.0.1", "192.168.1.1", "172.16.5.4", "169.254.169.254", "0.0.0.0", "100.64.0.1"} {
		t.Run(later, func(t *testing.T) {
			t.Parallel()
			const name = "hooks.rebind.test"
			dns := newDNSServer(t, name, netip.MustParseAddr("93.184.215.14"), netip.MustParseAddr(later))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			s, err := openSink(ctx, mustURL(t, "http://"+name+":8080/hook?wharf_timeout=3s"), dns.resolver())
			if err != nil {
				t.Fatalf("Open while the name is public: %v", err)
			}
			defer s.Close()
			err = errAt(s.Publish(ctx, []*wharf.Message{msg(1, "t", "k", "{}")}), 0)
			want := "refused to connect to " + later + ":8080"
			if !wharf.IsPermanent(err) || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("Publish after the name moved to %s: %v, want a permanent one-line error saying %q", later, err, want)
			}
			if n := dns.aLookups(); n < 2 {
				t.Fatalf("%d lookups: the name was not resolved again when connecting", n)
			}
			// Resolving to it when opening: refused then.
			if _, err := openSink(ctx, mustURL(t, "http://"+name+":8080/hook"), dns.resolver()); err == nil || !strings.Contains(err.Error(), "resolves to "+later) {
				t.Fatalf("Open while the name resolves to %s: %v, want it refused", later, err)
			}
		})
	}
}
