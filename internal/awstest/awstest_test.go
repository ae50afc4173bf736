package awstest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
)

// TestNaturalFormOrder checks that the fauxqs client sends a form body's
// list members in index order (member.2 before member.10) and leaves other
// bodies alone.
func TestNaturalFormOrder(t *testing.T) {
	bodies := make(chan string, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		bodies <- string(b)
	}))
	defer srv.Close()
	c := (&Server{naturalForm: true}).HTTPClient(t)

	form := url.Values{"Action": {"PublishBatch"}}
	for _, i := range []string{"1", "2", "10", "11", "3"} {
		form.Set("PublishBatchRequestEntries.member."+i+".Id", i)
	}
	resp, err := c.Post(srv.URL, "application/x-www-form-urlencoded", strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	var ids []string
	for _, kv := range strings.Split(<-bodies, "&") {
		if k, v, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "PublishBatchRequestEntries") {
			ids = append(ids, v)
		}
	}
	if want := []string{"1", "2", "3", "10", "11"}; !slices.Equal(ids, want) {
		t.Errorf("entries sent in order %v, want %v", ids, want)
	}

	resp, err = c.Post(srv.URL, "application/x-amz-json-1.0", strings.NewReader(`{"b":1,"a":2}`))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if got := <-bodies; got != `{"b":1,"a":2}` {
		t.Errorf("a JSON body arrived as %q", got)
	}
}
