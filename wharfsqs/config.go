package wharfsqs

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/wharfhq/wharf/internal/awsurl"
	"github.com/wharfhq/wharf/internal/cloudevents"
	"github.com/wharfhq/wharf/internal/urlmask"
)

// errStructuredBase64 refuses body=base64 with ce=structured: the JSON
// event is text, and carries a binary payload itself (data_base64).
const errStructuredBase64 = "body=base64 with ce=structured: the JSON event is text and carries binary payloads in data_base64 itself; drop body=base64"

// awsURL is what the parts of an sqs:// or sns:// URL common to both say.
type awsURL struct {
	awsurl.Common
	body     Body
	maxBytes int
	strict   bool
	template string
	ce       string
	ceSource string
}

// parseAWSURL reads u, an sqs:// or sns:// URL; templateOpt is the option
// naming the destination template (queue_template or topic_arn_template),
// and extra lists the options only one of the schemes takes, handled by
// the caller.
func parseAWSURL(u *url.URL, scheme, templateOpt string, extra func(k, v string) (bool, error)) (awsURL, error) {
	shown := u.Redacted()
	c := awsURL{maxBytes: defaultMaxBytes}
	var err error
	if c.Common, err = awsurl.Parse(u, scheme, "wharfsqs", scheme+"://[REGION]?"+templateOpt+"=...&option=value"); err != nil {
		return c, err
	}
	q := u.Query()
	for k, vs := range q {
		v := vs[len(vs)-1]
		switch k {
		case templateOpt:
			c.template = v
		case "endpoint", "profile":
			if _, err := c.Option(shown, k, v, "http://127.0.0.1:4566"); err != nil {
				return c, err
			}
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
				return c, fmt.Errorf("sink URL %q: unknown option %q: the %s sink takes %s", urlmask.Option(u, k), k, scheme, optionList(scheme, templateOpt))
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
