package wharfsqs

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/awstest"
	"github.com/wharfhq/wharf/internal/cloudevents/cereader"
)

// ceMessage reads a received SQS message as a CloudEvent by the rules
// docs/sinks/sqs.md gives consumers: structured when the content-type
// attribute starts with application/cloudevents (the body is then the JSON
// event), binary otherwise (attributes from the ce-<name> message
// attributes, the data from the body, base64-decoded with body=base64).
func ceMessage(t *testing.T, m types.Message, b64 bool) cereader.Event {
	t.Helper()
	body := aws.ToString(m.Body)
	if ct := m.MessageAttributes[AttrContentType]; strings.HasPrefix(strings.ToLower(aws.ToString(ct.StringValue)), "application/cloudevents") {
		ev, err := cereader.JSON([]byte(body))
		if err != nil {
			t.Fatalf("structured body %q: %v", body, err)
		}
		return ev
	}
	ev := cereader.Event{Attrs: map[string]string{}, Data: []byte(body)}
	if b64 {
		d, err := base64.StdEncoding.DecodeString(body)
		if err != nil {
			t.Fatalf("body %q is not base64: %v", body, err)
		}
		ev.Data = d
	}
	for k, v := range m.MessageAttributes {
		if name, ok := strings.CutPrefix(k, "ce-"); ok {
			if aws.ToString(v.DataType) != "String" {
				t.Errorf("attribute %s has data type %s, want String", k, aws.ToString(v.DataType))
			}
			ev.Attrs[name] = aws.ToString(v.StringValue)
		}
	}
	return ev
}

// receiveAll receives (and deletes) want messages from queueURL, by
// message, keyed by the CloudEvents id.
func receiveAll(t *testing.T, c *sqs.Client, queueURL string, want int) []types.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	var got []types.Message
	for len(got) < want {
		out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(queueURL), MaxNumberOfMessages: 10,
			MessageAttributeNames: []string{"All"}, WaitTimeSeconds: 1,
		})
		if err != nil {
			t.Fatalf("receive from %s after %d of %d messages: %v", queueURL, len(got), want, err)
		}
		for _, m := range out.Messages {
			got = append(got, m)
			if _, err := c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(queueURL), ReceiptHandle: m.ReceiptHandle}); err != nil {
				t.Fatalf("delete: %v", err)
			}
		}
	}
	return got
}

// Each mode's messages, as SQS delivered them (sent to the queue, or
// published to an SNS topic with a raw-delivery subscription), decode as
// docs/sinks/sqs.md says, with every attribute Wharf sets.
func TestCloudEvents(t *testing.T) {
	t.Parallel()
	srv := awstest.Start(t)
	qc := sqsClient(t, srv, srv.Endpoint)
	nc := snsClient(t, srv, srv.Endpoint)
	ctx := context.Background()
	seq := int64(1)
	for _, useSNS := range []bool{false, true} {
		for _, mode := range []string{"binary", "structured"} {
			name := "SQS/" + mode
			if useSNS {
				name = "SNS/" + mode
			}
			t.Run(name, func(t *testing.T) {
				p := "ce" + randomID()
				queueURL := createQueue(t, qc, p+"-orders")
				// Binary payloads go in base64 in binary mode; the JSON
				// event of structured mode is text whatever the payload.
				opts := Options{Body: BodyBase64, CloudEvents: mode, CloudEventsSource: "urn:svc:orders"}
				if mode == "structured" {
					opts.Body = BodyRaw
				}
				var s wharf.Sink
				var err error
				if useSNS {
					out, err := nc.CreateTopic(ctx, &sns.CreateTopicInput{Name: aws.String(p + "-orders")})
					if err != nil {
						t.Fatal(err)
					}
					subscribe(t, qc, nc, aws.ToString(out.TopicArn), queueURL)
					opts.Template = "arn:aws:sns:" + awstest.Region + ":" + accountID + ":" + p + "-{{topic}}"
					s, err = NewSNS(nc, opts)
					if err != nil {
						t.Fatal(err)
					}
				} else {
					opts.Template = p + "-{{topic}}"
					if s, err = New(qc, opts); err != nil {
						t.Fatal(err)
					}
				}
				defer s.Close()
				cases := cereader.Cases("orders", seq)
				seq += 10
				if errs := s.Publish(ctx, cereader.Messages(cases)); errs != nil {
					t.Fatalf("Publish: %v", errs)
				}
				byID := map[string]types.Message{}
				events := map[string]cereader.Event{}
				for _, m := range receiveAll(t, qc, queueURL, len(cases)) {
					ev := ceMessage(t, m, opts.Body == BodyBase64)
					byID[ev.Attrs["id"]] = m
					events[ev.Attrs["id"]] = ev
				}
				for _, tc := range cases {
					ev, ok := events[tc.Msg.ID]
					if !ok {
						t.Fatalf("no message %s among %d received", tc.Msg.ID, len(events))
					}
					cereader.Check(t, ev, tc, "urn:svc:orders", mode == "structured")
					attrs := byID[tc.Msg.ID].MessageAttributes
					str := func(k string) string { return aws.ToString(attrs[k].StringValue) }
					if mode == "binary" {
						// ce-id, ce-type and ce-subject replace the wharf-
						// attributes; the trace context travels as
						// ce-traceparent and ce-tracestate only.
						for _, k := range []string{AttrID, AttrTopic, AttrKey, "traceparent", "tracestate", "content-type", "Content-Type"} {
							if _, ok := attrs[k]; ok {
								t.Errorf("message %s: attribute %s = %q, want it absent in binary mode", tc.Msg.ID, k, str(k))
							}
						}
					} else {
						if str(AttrID) != tc.Msg.ID || str(AttrTopic) != tc.Msg.Topic || str(AttrKey) != tc.Msg.Key {
							t.Errorf("message %s: wharf attributes id %q topic %q key %q, want them as without CloudEvents", tc.Msg.ID, str(AttrID), str(AttrTopic), str(AttrKey))
						}
						if str(AttrContentType) != "application/cloudevents+json; charset=UTF-8" {
							t.Errorf("message %s: content-type attribute %q", tc.Msg.ID, str(AttrContentType))
						}
						if _, ok := attrs["Content-Type"]; ok {
							t.Errorf("message %s: the message's own Content-Type header was sent as an attribute", tc.Msg.ID)
						}
					}
					if v, ok := tc.Msg.Headers["app"]; ok && str("app") != v {
						t.Errorf("message %s: header app = %q, want %q", tc.Msg.ID, str("app"), v)
					}
				}
			})
		}
	}
}
