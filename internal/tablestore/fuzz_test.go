package tablestore

import (
	"strings"
	"testing"
)

// FuzzParseSnapshot checks parseSnapshot against pg_snapshot's text form:
// what it accepts has decimal xids with xmin <= xip < xmax in ascending
// order, and is the input again when written back; what it refuses gets a
// one-line error. The relay sends xmax and the xips back to the database and
// compares xmaxes to detect a database that went back in time.
func FuzzParseSnapshot(f *testing.F) {
	for _, s := range []string{"100:104:100,102", "5:5:", "1:2:1", "0:0:", "100:104:102,100", "100:104:104",
		"x:1:", "1:x:", "2:1:", "1:3:1,,2", "1:3", "1:3:2:4", "-1:3:", " 1:3:", "1:18446744073709551616:", "10:20:10,10"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := parseSnapshot(s)
		if err != nil {
			if strings.ContainsAny(err.Error(), "\r\n") {
				t.Fatalf("parseSnapshot(%q): error is not one line: %q", s, err)
			}
			return
		}
		parts := strings.Split(s, ":")
		xmin, _ := parseXid(parts[0])
		xmax, err := parseXid(p.xmax)
		if err != nil || xmin > xmax {
			t.Fatalf("parseSnapshot(%q) accepted xmin %q, xmax %q", s, parts[0], p.xmax)
		}
		prev := xmin
		for i, x := range p.xip {
			v, err := parseXid(x)
			if err != nil || v >= xmax || v < prev || i > 0 && v == prev {
				t.Fatalf("parseSnapshot(%q) accepted xip %q", s, x)
			}
			prev = v
		}
		if back := parts[0] + ":" + p.xmax + ":" + strings.Join(p.xip, ","); back != s {
			t.Fatalf("parseSnapshot(%q) reads back as %q", s, back)
		}
	})
}
