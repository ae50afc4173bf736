package wharfamqp

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/cloudevents"
	"github.com/wharfhq/wharf/internal/urlmask"
)

// urlConfig is what an amqp:// URL says.
type urlConfig struct {
	uri  string // the URL for amqp091-go: our options removed
	opts Options
	name string
}

// Open opens the sink an amqp:// or amqps:// URL names (see the package
// documentation for its options). It is the opener the CLI registers for
// the "amqp" and "amqps" schemes.
func Open(ctx context.Context, u *url.URL) (wharf.Sink, error) {
	cfg, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(cfg.name)
	s, err := New(ctx, cfg.uri, amqp.Config{Properties: props}, cfg.opts)
	if err != nil {
		msg := strings.TrimPrefix(err.Error(), "wharfamqp: ")
		return nil, &openError{msg: fmt.Sprintf("sink URL %q: %s", u.Redacted(), msg), err: err}
	}
	return s, nil
}

// openError names the sink URL in front of New's error, and unwraps to it.
type openError struct {
	msg string
	err error
}

func (e *openError) Error() string { return e.msg }
func (e *openError) Unwrap() error { return e.err }

func parseURL(u *url.URL) (urlConfig, error) {
	shown := u.Redacted()
	cfg := urlConfig{name: defaultName}
	if u.Scheme != "amqp" && u.Scheme != "amqps" {
		return cfg, fmt.Errorf("sink URL %q: wharfamqp opens amqp:// and amqps:// URLs", shown)
	}
	if u.Opaque != "" || u.Fragment != "" {
		return cfg, fmt.Errorf("sink URL %q: write %s://user:password@host:port/vhost?option=value", shown, u.Scheme)
	}
	if u.Hostname() == "" || strings.Contains(u.Host, ",") {
		return cfg, fmt.Errorf("sink URL %q names no host, or several: write %s://user:password@host:port/vhost", shown, u.Scheme)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n <= 0 || n > 65535 {
			return cfg, fmt.Errorf("sink URL %q: port %q is not a port number", shown, p)
		}
	}
	pass := url.Values{}
	for k, vs := range u.Query() {
		v := vs[len(vs)-1]
		switch k {
		case "exchange":
			cfg.opts.Exchange = v
		case "routing_key_template":
			cfg.opts.RoutingKeyTemplate = v
		case "mandatory":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return cfg, fmt.Errorf("sink URL %q: mandatory=%q: want true or false", shown, v)
			}
			cfg.opts.DropUnroutable = !b
		case "strict_order":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return cfg, fmt.Errorf("sink URL %q: strict_order=%q: want true or false", shown, v)
			}
			cfg.opts.StrictOrder = b
		case "confirm_timeout", "dial_timeout":
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return cfg, fmt.Errorf("sink URL %q: %s=%q is not a positive duration such as 10s", shown, k, v)
			}
			if k == "confirm_timeout" {
				cfg.opts.ConfirmTimeout = d
			} else {
				cfg.opts.DialTimeout = d
			}
		case "max_in_flight":
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return cfg, fmt.Errorf("sink URL %q: max_in_flight=%q is not a positive number of messages", shown, v)
			}
			cfg.opts.MaxInFlight = n
		case "max_message_size":
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return cfg, fmt.Errorf("sink URL %q: max_message_size=%q is not a number of bytes (0 turns the check off)", shown, v)
			}
			cfg.opts.MaxMessageSize = n
			if n == 0 {
				cfg.opts.MaxMessageSize = -1
			}
		case "name":
			cfg.name = v
		case "ce":
			if _, err := cloudevents.ParseMode(v); err != nil {
				return cfg, fmt.Errorf("sink URL %q: ce=%q: want binary or structured", shown, v)
			}
			cfg.opts.CloudEvents = v
		case "ce_source":
			cfg.opts.CloudEventsSource = v
		case "heartbeat":
			if n, err := strconv.ParseUint(v, 10, 16); err != nil {
				return cfg, fmt.Errorf("sink URL %q: heartbeat=%q is not a number of seconds (0 to 65535)", shown, v)
			} else if n == 0 {
				return cfg, fmt.Errorf("sink URL %q: heartbeat=0 turns heartbeats off, and with them the detection of a dead connection: give a number of seconds", shown)
			}
			pass.Set(k, v)
		case "cacertfile", "certfile", "keyfile", "server_name_indication":
			if u.Scheme != "amqps" {
				return cfg, fmt.Errorf("sink URL %q: %s is a TLS option: use amqps://", shown, k)
			}
			pass.Set(k, v)
		default:
			return cfg, fmt.Errorf("sink URL %q: unknown option %q: the amqp sink takes exchange, routing_key_template, mandatory, strict_order, confirm_timeout, max_in_flight, max_message_size, dial_timeout, name, ce, ce_source, heartbeat and, with amqps, cacertfile, certfile, keyfile and server_name_indication", urlmask.Option(u, k), k)
		}
	}
	if _, err := cloudevents.NewConfig(cfg.opts.CloudEvents, cfg.opts.CloudEventsSource); err != nil {
		return cfg, fmt.Errorf("sink URL %q: ce=%s&ce_source=%s: %w", shown, cfg.opts.CloudEvents, cfg.opts.CloudEventsSource, err)
	}
	if strings.Contains(cfg.opts.Exchange, KeyPlaceholder) {
		return cfg, fmt.Errorf("sink URL %q: exchange %q has %s: only %s may name the exchange (put the key in routing_key_template)", shown, cfg.opts.Exchange, KeyPlaceholder, TopicPlaceholder)
	}
	if cfg.opts.Exchange == "" && strings.HasPrefix(literalPrefix(cfg.opts.RoutingKeyTemplate), reservedPrefix) {
		return cfg, fmt.Errorf("sink URL %q: routing_key_template %q on the default exchange names the broker's own queues (%s*), which the sink refuses: name an exchange of yours with exchange=, or use another routing key", shown, cfg.opts.RoutingKeyTemplate, reservedPrefix)
	}
	if len(cfg.opts.Exchange) > maxShortstr {
		return cfg, fmt.Errorf("sink URL %q: exchange is %d bytes, over AMQP's 255", shown, len(cfg.opts.Exchange))
	}
	if pass.Has("certfile") != pass.Has("keyfile") {
		return cfg, fmt.Errorf("sink URL %q: certfile and keyfile go together", shown)
	}
	clean := *u
	clean.RawQuery = pass.Encode()
	cfg.uri = clean.String()
	return cfg, nil
}
