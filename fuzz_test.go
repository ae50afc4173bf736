package wharf

import (
	"errors"
	"regexp"
	"strings"
	"testing"
)

// FuzzTopicTemplate checks ParseTopicTemplate and Expand against their
// specification: every {{...}} (from a "{{" to the next "}}") is {{topic}} or
// {{topic|dashes}}, there is at most one, and no "{{" is left unclosed; a
// template with one is the template with the topic in its place (its dots
// as dashes for {{topic|dashes}}); without one, the template itself; "" is
// the topic.
func FuzzTopicTemplate(f *testing.F) {
	for _, s := range [][2]string{
		{"", "orders"}, {"{{topic}}", "a.b"}, {"app.{{topic}}", "x"}, {"{{topic}}.v1", ""}, {"fixed", "t"},
		{"{{topic}}{{topic}}", "t"}, {"a{{topic}}b{{topic}}", "t"}, {"{{topic", "t"}, {"{{top{{topic}}ic}}", "{{topic}}"},
		{"x\n{{topic}}", "y"}, {"wharf-{{topic|dashes}}", "orders.paid"}, {"{{topc}}", "t"}, {"{{topic|dashes}}{{topic}}", "t"},
		{"}}{{topic}}{{", "t"}, {"{{{topic}}", "t"},
	} {
		f.Add(s[0], s[1])
	}
	placeholder := regexp.MustCompile(`(?s)\{\{.*?\}\}`)
	f.Fuzz(func(t *testing.T, tmpl, topic string) {
		tt, err := ParseTopicTemplate(tmpl)
		phs := placeholder.FindAllStringIndex(tmpl, -1)
		valid := len(phs) <= 1 && !strings.Contains(placeholder.ReplaceAllString(tmpl, ""), "{{")
		for _, ph := range phs {
			if p := tmpl[ph[0]:ph[1]]; p != TopicPlaceholder && p != TopicDashesPlaceholder {
				valid = false
			}
		}
		if err != nil {
			if valid {
				t.Fatalf("ParseTopicTemplate(%q): %v, but it is valid", tmpl, err)
			}
			if strings.ContainsAny(err.Error(), "\r\n") {
				t.Fatalf("ParseTopicTemplate(%q): error is not one line: %q", tmpl, err)
			}
			return
		}
		if !valid {
			t.Fatalf("ParseTopicTemplate(%q) accepted an invalid template", tmpl)
		}
		var want string
		switch {
		case tmpl == "":
			want = topic
		case len(phs) == 0:
			want = tmpl
		default:
			in := topic
			if tmpl[phs[0][0]:phs[0][1]] == TopicDashesPlaceholder {
				in = strings.ReplaceAll(topic, ".", "-")
			}
			want = tmpl[:phs[0][0]] + in + tmpl[phs[0][1]:]
		}
		got := tt.Expand(topic)
		if got != want {
			t.Fatalf("template %q, topic %q: Expand = %q, want %q", tmpl, topic, got, want)
		}
		if !strings.HasPrefix(got, tt.Prefix()) {
			t.Fatalf("template %q, topic %q: Expand = %q does not start with Prefix %q", tmpl, topic, got, tt.Prefix())
		}
		if len(phs) == 0 && tmpl != "" && tt.Prefix() != tmpl {
			t.Fatalf("template %q without placeholder: Prefix = %q, want the template", tmpl, tt.Prefix())
		}
	})
}

// FuzzRoutePattern checks ValidatePattern and the router's matching against
// an independent statement of the rules: a valid pattern is dot-separated
// non-empty segments, "*" only as a whole segment, "**" only last; and a
// topic matches exactly when it matches the regular expression in which a
// literal segment stands for itself, "*" for one or more non-dot
// characters and a final "**" for one or more characters.
func FuzzRoutePattern(f *testing.F) {
	for _, s := range [][2]string{
		{"orders.*", "orders.created"}, {"orders.*", "orders"}, {"orders.*", "orders.eu.created"},
		{"orders.**", "orders.eu.created"}, {"orders.**", "orders"}, {"**", "x"}, {"**", ""}, {"*", "a.b"},
		{"a.**.b", "a.x.b"}, {"a..b", "a..b"}, {"", "x"}, {".a", ".a"}, {"a*", "ab"}, {"a.**", "a."}, {"a.**", "a..b"},
		{"a.*", "a."}, {"*.*", ".."}, {"x\ny", "x\ny"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, topic string) {
		err := ValidatePattern(pattern)
		segs := strings.Split(pattern, ".")
		wantValid := pattern != ""
		for i, s := range segs {
			if s == "" || (s == "**" && i != len(segs)-1) || (s != "*" && s != "**" && strings.Contains(s, "*")) {
				wantValid = false
			}
		}
		if (err == nil) != wantValid {
			t.Fatalf("ValidatePattern(%q) = %v, want valid=%v", pattern, err, wantValid)
		}
		if err != nil {
			if strings.ContainsAny(err.Error(), "\r\n") && !strings.ContainsAny(pattern, "\r\n") {
				t.Fatalf("ValidatePattern(%q): error is not one line: %q", pattern, err)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("ValidatePattern(%q): error is not one line: %q", pattern, err)
			}
			return
		}
		var re strings.Builder
		re.WriteString(`\A`)
		for i, s := range segs {
			if i > 0 {
				re.WriteString(`\.`)
			}
			switch s {
			case "*":
				re.WriteString(`[^.]+`)
			case "**":
				re.WriteString(`(?s:.+)`)
			default:
				re.WriteString(regexp.QuoteMeta(latin1(s)))
			}
		}
		re.WriteString(`\z`)
		want := regexp.MustCompile(re.String()).MatchString(latin1(topic))
		compiled, perr := parsePattern(pattern)
		if perr != nil {
			t.Fatal(perr)
		}
		if got := match(compiled, topic); got != want {
			t.Fatalf("pattern %q, topic %q: match = %v, want %v (%s)", pattern, topic, got, want, re.String())
		}
		// The router sends the topic to the first matching route.
		r, rerr := NewRouter(Route{Pattern: pattern, Sink: noRouteSink{}})
		if rerr != nil {
			t.Fatalf("NewRouter(%q): %v", pattern, rerr)
		}
		if got := r.route(topic) == 0; got != want {
			t.Fatalf("router of %q, topic %q: routed = %v, want %v", pattern, topic, got, want)
		}
	})
}

// latin1 maps each byte of s to the rune of the same number, so that the
// regular expressions of FuzzRoutePattern work on bytes, as the router does,
// whatever the encoding of the text.
func latin1(s string) string {
	r := make([]rune, len(s))
	for i := 0; i < len(s); i++ {
		r[i] = rune(s[i])
	}
	return string(r)
}

// FuzzID checks FormatID and ParseID: every position below 2^60 and nonce
// round-trip (the nonce to its low 62 bits); ids sort as text in position
// order; ParseID accepts only what FormatID makes, in either case.
func FuzzID(f *testing.F) {
	f.Add(int64(0), int64(0), int64(1), int64(-1), "00000000-0001-8002-a3f1-9c2e4d5b6a70")
	f.Add(int64(1<<60-1), int64(1<<62-1), int64(4096), int64(1<<62), "00000000-0001-8002-A3F1-9C2E4D5B6A70")
	f.Add(int64(4095), int64(-1), int64(4097), int64(7), "not-an-id")
	f.Add(int64(12345678), int64(99), int64(12345679), int64(0), "00000000-0001-7002-a3f1-9c2e4d5b6a70")
	f.Add(int64(5), int64(5), int64(5), int64(5), "00000000-0001-8002-c3f1-9c2e4d5b6a70")
	f.Fuzz(func(t *testing.T, seq, nonce, seq2, nonce2 int64, text string) {
		const maxSeq = 1 << 60
		seq &= maxSeq - 1
		if seq < 0 {
			seq = -seq
		}
		seq2 &= maxSeq - 1
		id := FormatID(seq, nonce)
		gs, gn, err := ParseID(id)
		if err != nil {
			t.Fatalf("ParseID(FormatID(%d, %d) = %q): %v", seq, nonce, id, err)
		}
		if gs != seq || gn != nonce&(1<<62-1) {
			t.Fatalf("FormatID(%d, %d) = %q parses back as (%d, %d)", seq, nonce, id, gs, gn)
		}
		if len(id) != 36 || strings.ToLower(id) != id {
			t.Fatalf("FormatID(%d, %d) = %q: want 36 lowercase characters", seq, nonce, id)
		}
		id2 := FormatID(seq2, nonce2)
		if seq < seq2 && id >= id2 || seq > seq2 && id <= id2 {
			t.Fatalf("ids out of order: %d -> %q, %d -> %q", seq, id, seq2, id2)
		}
		ts, tn, err := ParseID(text)
		if err != nil {
			if !errors.Is(err, ErrBadID) {
				t.Fatalf("ParseID(%q): %v does not wrap ErrBadID", text, err)
			}
			if strings.ContainsAny(err.Error(), "\r\n") {
				t.Fatalf("ParseID(%q): error is not one line: %q", text, err)
			}
			return
		}
		if back := FormatID(ts, tn); back != strings.ToLower(text) {
			t.Fatalf("ParseID(%q) = (%d, %d), which FormatID writes as %q", text, ts, tn, back)
		}
	})
}
