package wharf

import (
	"fmt"
	"strconv"
	"strings"
)

// TopicPlaceholder is replaced by a message's topic in the destination
// templates of the broker sinks (Kafka topic, NATS subject, Redis stream).
//
// [ParseTopicTemplate] also takes the form [TopicDashesPlaceholder],
// replaced by the topic with every '.' turned into '-', for destinations
// whose names cannot have dots (SQS queues, SNS topics).
const TopicPlaceholder = "{{topic}}"

// TopicDashesPlaceholder is replaced by a message's topic with every '.'
// replaced by '-': topic orders.paid gives orders-paid.
const TopicDashesPlaceholder = "{{topic|dashes}}"

// TopicTemplate names a message's destination from its topic: the template
// with its placeholder replaced by the topic, or the template itself when it
// has no placeholder (every message to one destination).
type TopicTemplate struct {
	prefix, suffix string
	fixed          bool
	dashes         bool // the placeholder is TopicDashesPlaceholder
}

// ParseTopicTemplate parses tmpl; "" means TopicPlaceholder alone (the
// destination is named like the topic). The template holds at most one
// placeholder, either [TopicPlaceholder] ({{topic}}, the topic as it is) or
// [TopicDashesPlaceholder] ({{topic|dashes}}, the topic with every '.'
// replaced by '-'). Any other {{...}}, and a "{{" without its "}}", is an
// error naming it.
func ParseTopicTemplate(tmpl string) (TopicTemplate, error) {
	if tmpl == "" {
		tmpl = TopicPlaceholder
	}
	t := TopicTemplate{fixed: true}
	rest, at := tmpl, 0
	for {
		i := strings.Index(rest, "{{")
		if i < 0 {
			break
		}
		j := strings.Index(rest[i:], "}}")
		if j < 0 {
			return TopicTemplate{}, fmt.Errorf("unclosed placeholder %s in template %q: templates take %s or %s", shown(rest[i:]), tmpl, TopicPlaceholder, TopicDashesPlaceholder)
		}
		ph := rest[i : i+j+2]
		if ph != TopicPlaceholder && ph != TopicDashesPlaceholder {
			return TopicTemplate{}, fmt.Errorf("unknown placeholder %s in template %q: templates take %s or %s", shown(ph), tmpl, TopicPlaceholder, TopicDashesPlaceholder)
		}
		if !t.fixed {
			return TopicTemplate{}, fmt.Errorf("template %q has a placeholder more than once (%s or %s)", tmpl, TopicPlaceholder, TopicDashesPlaceholder)
		}
		t.fixed = false
		t.dashes = ph == TopicDashesPlaceholder
		t.prefix = tmpl[:at+i]
		t.suffix = tmpl[at+i+j+2:]
		rest, at = rest[i+j+2:], at+i+j+2
	}
	if t.fixed {
		t.prefix = tmpl
	}
	return t, nil
}

// shown is s as written when it is printable on one line, else quoted.
func shown(s string) string {
	if strconv.CanBackquote(s) && !strings.Contains(s, "`") {
		return s
	}
	return strconv.Quote(s)
}

// Expand returns the destination of a message of topic.
func (t TopicTemplate) Expand(topic string) string {
	if t.fixed {
		return t.prefix
	}
	if t.dashes {
		topic = strings.ReplaceAll(topic, ".", "-")
	}
	return t.prefix + topic + t.suffix
}

// Prefix returns the text before the placeholder (the whole template when it
// has none).
func (t TopicTemplate) Prefix() string { return t.prefix }

// Dashes reports whether the placeholder is [TopicDashesPlaceholder]: the
// topic's dots become dashes.
func (t TopicTemplate) Dashes() bool { return t.dashes }

// Fixed reports whether the template has no placeholder: every message goes
// to the one destination.
func (t TopicTemplate) Fixed() bool { return t.fixed }
