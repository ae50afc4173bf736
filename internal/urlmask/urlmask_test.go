package urlmask

import (
	"net/url"
	"testing"
)

func TestOptionMasksTheOptionAndThePassword(t *testing.T) {
	u, err := url.Parse("kafka://user:pw@127.0.0.1:9092?sasl=plain&sasl_password=s3cr3t&sasl_password=again")
	if err != nil {
		t.Fatal(err)
	}
	got := Option(u, "sasl_password")
	want := "kafka://user:xxxxx@127.0.0.1:9092?sasl=plain&sasl_password=xxxxx&sasl_password=xxxxx"
	if got != want {
		t.Fatalf("Option = %q, want %q", got, want)
	}
	if u.Query().Get("sasl_password") != "s3cr3t" {
		t.Fatal("Option changed its argument")
	}
	if got := Option(u, "absent"); got != u.Redacted() {
		t.Fatalf("an absent option changes nothing: got %q", got)
	}
}
