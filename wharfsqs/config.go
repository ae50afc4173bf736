package wharfsqs

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/wharfhq/wharf/internal/cloudevents"
)

// errStructuredBase64 refuses body=base64 with ce=structured: the JSON
// event is text, and carries a binary payload itself (data_base64).
const errStructuredBase64 = "body=base64 with ce=structured: the JSON event is text and carries binary payloads in data_base64 itself; drop body=base64"

// awsURL is what the parts of an sqs:// or sns:// URL common to both say.
type awsURL struct {
	region    string
	endpoint  string
	profile   string
	accessKey string
	secretKey string
	body      Body
	maxBytes  int
	strict    bool
	template  string
	ce        string
	ceSource  string
}

// parseAWSURL reads u, an sqs:// or sns:// URL; templateOpt is the option
// naming the destination template (queue_template or topic_arn_template),
// and extra lists the options only one of the schemes takes, handled by
// the caller.
func parseAWSURL(u *url.URL, scheme, templateOpt string, extra func(k, v string) (bool, error)) (awsURL, error) {
	shown := u.Redacted()
	var c awsURL
	c.maxBytes = defaultMaxBytes
	if u.Scheme != scheme {
		return c, fmt.Errorf("sink URL %q: wharfsqs opens %s:// URLs here", shown, scheme)
	}
	if u.Opaque != "" || (u.Path != "" && u.Path != "/") || u.Fragment != "" {
		return c, fmt.Errorf("sink URL %q: write %s://[REGION]?%s=...&option=value", shown, scheme, templateOpt)
	}
	if u.Port() != "" {
		return c, fmt.Errorf("sink URL %q: the host is the AWS region (e.g. eu-west-1) and has no port; an emulator's address goes in endpoint=http://host:port", shown)
	}
	c.region = u.Hostname()
	for i := 0; i < len(c.region); i++ {
		if ch := c.region[i]; (ch < 'a' || ch > 'z') && (ch < '0' || ch > '9') && ch != '-' {
			return c, fmt.Errorf("sink URL %q: the host %q is not an AWS region name such as eu-west-1", shown, c.region)
		}
	}
	if u.User != nil {
		c.accessKey = u.User.Username()
		c.secretKey, _ = u.User.Password()
		if c.accessKey == "" || c.secretKey == "" {
			return c, fmt.Errorf("sink URL %q: credentials in the URL are ACCESS_KEY_ID:SECRET_ACCESS_KEY@; leave them out to use the default AWS credential chain", shown)
		}
	}
	q := u.Query()
	for k, vs := range q {
		v := vs[len(vs)-1]
		switch k {
		case templateOpt:
			c.template = v
		case "endpoint":
			e, err := url.Parse(v)
			if err != nil || (e.Scheme != "http" && e.Scheme != "https") || e.Host == "" {
				return c, fmt.Errorf("sink URL %q: endpoint=%q is not an http:// or https:// URL such as http://127.0.0.1:4566", shown, v)
			}
			c.endpoint = v
		case "profile":
			if v == "" {
				return c, fmt.Errorf("sink URL %q: profile is empty: name a profile of the shared AWS config, or drop the option", shown)
			}
			c.profile = v
		case "body":
			switch v {
			case "raw":
				c.body = BodyRaw
			case "base64":
				c.body = BodyBase64
			default:
				return c, fmt.Errorf("sink URL %q: body=%q: want raw (UTF-8 text payloads) or base64", shown, v)
			}
		case "max_message_bytes":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1024 || n > 1<<20 {
				return c, fmt.Errorf("sink URL %q: max_message_bytes=%q: want a byte count from 1024 to 1048576 (SQS's largest message)", shown, v)
			}
			c.maxBytes = n
		case "strict_order":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return c, fmt.Errorf("sink URL %q: strict_order=%q: want true or false", shown, v)
			}
			c.strict = b
		case "ce":
			if _, err := cloudevents.ParseMode(v); err != nil {
				return c, fmt.Errorf("sink URL %q: ce=%q: want binary or structured", shown, v)
			}
			c.ce = v
		case "ce_source":
			c.ceSource = v
		default:
			ok, err := extra(k, v)
			if err != nil {
				return c, fmt.Errorf("sink URL %q: %w", shown, err)
			}
			if !ok {
				return c, fmt.Errorf("sink URL %q: unknown option %q: the %s sink takes %s", shown, k, scheme, optionList(scheme, templateOpt))
			}
		}
	}
	if c.template == "" {
		return c, fmt.Errorf("sink URL %q: %s is required (e.g. %s)", shown, templateOpt, templateExample(templateOpt))
	}
	ce, err := cloudevents.NewConfig(c.ce, c.ceSource)
	if err != nil {
		return c, fmt.Errorf("sink URL %q: ce=%s&ce_source=%s: %w", shown, c.ce, c.ceSource, err)
	}
	if ce.Mode == cloudevents.Structured && c.body == BodyBase64 {
		return c, fmt.Errorf("sink URL %q: %s", shown, errStructuredBase64)
	}
	return c, nil
}

func optionList(scheme, templateOpt string) string {
	opts := []string{templateOpt, "endpoint", "profile", "body", "max_message_bytes", "strict_order", "ce", "ce_source"}
	return strings.Join(opts, ", ")
}

func templateExample(templateOpt string) string {
	if templateOpt == "topic_arn_template" {
		return "topic_arn_template=arn:aws:sns:eu-west-1:123456789012:wharf-{{topic}}"
	}
	return "queue_template=wharf-{{topic}}, or wharf-{{topic}}.fifo for FIFO queues"
}

// loadConfig builds the AWS configuration a URL asks for: the default
// chain (environment, shared config and credentials files, SSO, web
// identity, container and instance roles) with the URL's region, profile,
// endpoint and credentials on top.
// The HTTP client is the SDK's default one, whose transport the returned
// transport handle reaches so that Close can close its idle connections.
func (c awsURL) loadConfig(ctx context.Context) (aws.Config, *Transport, error) {
	tr := &Transport{}
	hc := awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) { tr.p.Store(t) })
	opts := []func(*config.LoadOptions) error{config.WithHTTPClient(hc)}
	if c.region != "" {
		opts = append(opts, config.WithRegion(c.region))
	}
	if c.profile != "" {
		opts = append(opts, config.WithSharedConfigProfile(c.profile))
	}
	if c.accessKey != "" {
		opts = append(opts, config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(c.accessKey, c.secretKey, "")))
	}
	if c.endpoint != "" {
		opts = append(opts, config.WithBaseEndpoint(c.endpoint))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return cfg, nil, fmt.Errorf("cannot load the AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		return cfg, nil, fmt.Errorf("no AWS region: put it in the URL's host (e.g. sqs://eu-west-1?...) or set AWS_REGION")
	}
	return cfg, tr, nil
}

// Transport reaches the HTTP transport of a client Open made, once the
// client built it.
type Transport struct {
	p atomic.Pointer[http.Transport]
}

// CloseIdle closes the transport's idle connections.
func (t *Transport) CloseIdle() {
	if t == nil {
		return
	}
	if tr := t.p.Load(); tr != nil {
		tr.CloseIdleConnections()
	}
}
