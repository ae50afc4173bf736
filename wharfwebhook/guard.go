package wharfwebhook

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"syscall"
)

var blockedPrefixes = []struct {
	prefix netip.Prefix
	why    string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "an unspecified (\"this network\") address"},
	{netip.MustParsePrefix("10.0.0.0/8"), "a private (RFC 1918) address"},
	{netip.MustParsePrefix("100.64.0.0/10"), "a carrier-grade NAT (RFC 6598) address"},
	{netip.MustParsePrefix("127.0.0.0/8"), "a loopback address"},
	{netip.MustParsePrefix("169.254.0.0/16"), "a link-local address (where cloud metadata services live)"},
	{netip.MustParsePrefix("172.16.0.0/12"), "a private (RFC 1918) address"},
	{netip.MustParsePrefix("192.0.0.0/24"), "an IETF protocol assignment address"},
	{netip.MustParsePrefix("192.168.0.0/16"), "a private (RFC 1918) address"},
	{netip.MustParsePrefix("198.18.0.0/15"), "a benchmarking (RFC 2544) address"},
	{netip.MustParsePrefix("224.0.0.0/4"), "a multicast address"},
	{netip.MustParsePrefix("240.0.0.0/4"), "a reserved or broadcast address"},
	{netip.MustParsePrefix("::/128"), "the unspecified address"},
	{netip.MustParsePrefix("::1/128"), "a loopback address"},
	{netip.MustParsePrefix("::/96"), "an IPv4-compatible (deprecated, RFC 4291) address"},
	{netip.MustParsePrefix("::ffff:0:0:0/96"), "an IPv4-translated (RFC 2765) address"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "a local-use NAT64 (RFC 8215) address"},
	{netip.MustParsePrefix("fc00::/7"), "a unique local (RFC 4193) address"},
	{netip.MustParsePrefix("fe80::/10"), "a link-local address"},
	{netip.MustParsePrefix("fec0::/10"), "a site-local address"},
	{netip.MustParsePrefix("ff00::/8"), "a multicast address"},
}

// IPv6 prefixes that embed an IPv4 address a translator or relay forwards
// to: the embedded address is what is checked.
var (
	nat64  = netip.MustParsePrefix("64:ff9b::/96") // well-known NAT64 (RFC 6052): the last 32 bits
	sixTo4 = netip.MustParsePrefix("2002::/16")    // 6to4 (RFC 3056): bits 16 to 47
)

// blockedReason says why a is not a public destination, if it is not.
// IPv4-mapped addresses (::ffff:0:0/96) are checked as the IPv4 address they
// map.
func blockedReason(a netip.Addr) (string, bool) {
	a = a.WithZone("").Unmap()
	switch b := a.As16(); {
	case a.Is4():
	case nat64.Contains(a):
		a = netip.AddrFrom4([4]byte(b[12:]))
	case sixTo4.Contains(a):
		a = netip.AddrFrom4([4]byte(b[2:6]))
	}
	for _, p := range blockedPrefixes {
		if p.prefix.Contains(a) {
			return p.why, true
		}
	}
	return "", false
}

// blockedError is a connection the sink refused to make.
type blockedError struct {
	addr, why string
}

func (e *blockedError) Error() string {
	return fmt.Sprintf("refused to connect to %s, %s: add wharf_allow_private=true (Options.AllowPrivate) to allow private, loopback and link-local destinations", e.addr, e.why)
}

// guardControl runs before every connection the sink dials, on the address
// actually dialled, and refuses non-public ones.
func guardControl(_, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return &blockedError{address, "an address that cannot be checked"}
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return &blockedError{address, "an address that cannot be checked"}
	}
	if why, bad := blockedReason(a); bad {
		return &blockedError{address, why}
	}
	return nil
}

// checkResolved refuses a host that is, or resolves only to, non-public
// addresses. A host that does not resolve now is left to the dial-time
// check.
func checkResolved(ctx context.Context, resolver *net.Resolver, host, shown string) error {
	if a, err := netip.ParseAddr(host); err == nil {
		if why, bad := blockedReason(a); bad {
			return fmt.Errorf("sink URL %q: %s is %s: add wharf_allow_private=true to send to private, loopback and link-local destinations", shown, host, why)
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	if resolver == nil {
		resolver = net.DefaultResolver
	}
	addrs, err := resolver.LookupNetIP(ctx, "ip", host)
	if err != nil || len(addrs) == 0 {
		return nil //nolint:nilerr // checked again when dialling
	}
	why := ""
	for _, a := range addrs {
		w, bad := blockedReason(a)
		if !bad {
			return nil
		}
		why = w
	}
	return fmt.Errorf("sink URL %q: host %q resolves to %s, %s: add wharf_allow_private=true to send to private, loopback and link-local destinations", shown, host, addrs[0].WithZone(""), why)
}
