package wharf

import (
	"fmt"
	"strings"
)

// TopicPlaceholder is replaced by a message's topic in the destination
// templates of the broker sinks (Kafka topic, NATS subject, Redis stream).
const TopicPlaceholder = "{{topic}}"

// TopicTemplate names a message's destination from its topic: the template
// with [TopicPlaceholder] replaced by the topic, or the template itself when
// it has no placeholder (every message to one destination).
type TopicTemplate struct {
	prefix, suffix string
	fixed          bool
}

// ParseTopicTemplate parses tmpl; "" means TopicPlaceholder alone (the
// destination is named like the topic). The placeholder may appear at most
// once.
func ParseTopicTemplate(tmpl string) (TopicTemplate, error) {
	if tmpl == "" {
		tmpl = TopicPlaceholder
	}
	if strings.Count(tmpl, TopicPlaceholder) > 1 {
		return TopicTemplate{}, fmt.Errorf("template %q has %s more than once", tmpl, TopicPlaceholder)
	}
	before, after, found := strings.Cut(tmpl, TopicPlaceholder)
	return TopicTemplate{prefix: before, suffix: after, fixed: !found}, nil
}

// Expand returns the destination of a message of topic.
func (t TopicTemplate) Expand(topic string) string {
	if t.fixed {
		return t.prefix
	}
	return t.prefix + topic + t.suffix
}

// Prefix returns the text before the placeholder (the whole template when it
// has none).
func (t TopicTemplate) Prefix() string { return t.prefix }
