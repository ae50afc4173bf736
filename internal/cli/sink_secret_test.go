package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/wharfhq/wharf/internal/sinkurl"
)

// The CLI shows a sink URL with every unknown query value masked
// ("sasl_pasword=xxxxx"), because an option it does not know may be a
// secret typed in the wrong place. But each sink's "unknown option" error
// quotes the URL through url.URL.Redacted, which masks only user info: a
// user who writes sasl_password=SECRET (Kafka takes sasl_password_env) gets
// SECRET in the error, on stderr and in every log shipped from it. Only the
// webhook sink refuses wharf_secret without echoing it.
func TestUnknownSinkOptionErrorDoesNotEchoItsValue(t *testing.T) {
	const secret = "s3cr3t-value"
	for _, raw := range []string{
		"kafka://127.0.0.1:9092?sasl=plain&sasl_user=u&sasl_password=" + secret,
		"nats://127.0.0.1:4222?password=" + secret,
		"redis://127.0.0.1:6379/0?password=" + secret,
		"amqp://127.0.0.1:5672/?password=" + secret,
		"mqtt://127.0.0.1:1883?password=" + secret,
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s, err := sinkurl.Open(ctx, raw)
		cancel()
		if err == nil {
			_ = s.Close()
			t.Errorf("%s: opened with an unknown option", strings.SplitN(raw, "?", 2)[0])
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("%s: the error echoes the unknown option's value: %v", strings.SplitN(raw, "?", 2)[0], err)
		}
	}
}
