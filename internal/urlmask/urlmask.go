// Package urlmask writes sink URLs into error messages without the values
// that may be secrets.
package urlmask

import "net/url"

// Masked is what stands for a hidden value.
const Masked = "xxxxx"

// Option returns u as url.URL.Redacted shows it (no password), with the
// values of query parameter k masked too. A sink's "unknown option" error
// quotes its URL: an option it does not know may be a secret typed in the
// wrong place (sasl_password= where the sink takes sasl_password_env=), and
// the error goes to stderr and to every log shipped from it.
func Option(u *url.URL, k string) string {
	c := *u
	q := c.Query()
	if vs, ok := q[k]; ok {
		for i := range vs {
			vs[i] = Masked
		}
		c.RawQuery = q.Encode()
	}
	return c.Redacted()
}
