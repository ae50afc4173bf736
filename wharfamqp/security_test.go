package wharfamqp

import (
	"context"
	"errors"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/testtool"
	"github.com/wharfhq/wharf/wharfsinktest"
)

// On the default exchange a routing key starting with "amq." (a server-named
// queue, such as another client's exclusive reply queue, or direct reply-to)
// fails permanently before sending and never reaches that queue; the later
// messages of its key are not attempted, other messages go out. On an
// exchange of one's own such a routing key is only a routing key.
func TestDefaultExchangeRefusesBrokerQueues(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	admin := requireBroker(t)
	ch, err := admin.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	// Another client's reply queue: server-named, exclusive to its
	// connection, yet reachable through the default exchange by name.
	reply, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(reply.Name, "amq.") {
		t.Fatalf("server-named queue %q: want the amq. prefix", reply.Name)
	}
	for _, mode := range modes {
		s := openSink(t, sinkURL(brokerURL(), "confirm_timeout="+testConfirm.String(), mode.option))
		ours := w.queues[wharfsinktest.TopicOrders]
		msgs := []*wharf.Message{
			msg(reply.Name, "k", []byte("forged reply")),
			msg(reply.Name, "k", []byte("behind it")),
			msg("amq.rabbitmq.reply-to", "", []byte("direct reply-to")),
			msg(ours, "k", []byte("to a queue of ours")),
		}
		errs, _ := publish(t, s, msgs)
		for _, i := range []int{0, 2} {
			if !wharf.IsPermanent(errs[i]) || !strings.Contains(errs[i].Error(), "default exchange") || !strings.Contains(errs[i].Error(), "exchange=") {
				t.Fatalf("%s: message %d: %v: want a permanent error naming the default exchange and what to do", mode.name, i, errs[i])
			}
		}
		if !errors.Is(errs[1], wharf.ErrNotAttempted) {
			t.Fatalf("%s: message 1: %v, want ErrNotAttempted", mode.name, errs[1])
		}
		if errs[3] != nil {
			t.Fatalf("%s: message 3 to %s: %v", mode.name, ours, errs[3])
		}
	}
	if got := w.received([]string{wharfsinktest.TopicOrders}, 2, 5*time.Second); len(got) != 2 {
		t.Fatalf("our queue holds %d messages, want 2", len(got))
	}
	q, err := ch.QueueDeclarePassive(reply.Name, false, true, true, false, nil)
	if err != nil || q.Messages != 0 {
		t.Fatalf("the reply queue holds %d messages (%v), want none", q.Messages, err)
	}

	// A template that can only name broker queues is refused at start.
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	if _, err := New(ctx, brokerURL(), amqp.Config{}, Options{RoutingKeyTemplate: "amq.gen-{{key}}"}); err == nil || !strings.Contains(err.Error(), "the broker's own queues") {
		t.Fatalf("New with routing key template amq.gen-{{key}} on the default exchange: %v, want it refused", err)
	}
	// On an exchange of one's own, amq.* is an ordinary routing key.
	s, err := New(ctx, brokerURL(), amqp.Config{}, Options{Exchange: w.exchange, RoutingKeyTemplate: "amq.{{key}}", DropUnroutable: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	errs, _ := publish(t, s, []*wharf.Message{msg("t", "k", []byte("x"))})
	requireAcked(t, errs)
}

// rabbitmqctl runs rabbitmqctl, or skips the test when it is not installed
// (a broker on another host).
func rabbitmqctl(t *testing.T, args ...string) {
	t.Helper()
	ctl := testtool.Path(t, "rabbitmqctl", "cannot create a user: apt-get install rabbitmq-server")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, ctl, append([]string{"-q"}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("rabbitmqctl %s: %v: %s", args[0], err, out)
	}
}

// The least-privilege user of the documentation works: with write
// permission on the sink's exchange only (no configure, no read), Open passes
// its check of the exchange and messages go out; the same user cannot
// publish through the default exchange to a queue by name (403, retried).
func TestLeastPrivilegeUser(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	if u, _ := url.Parse(brokerURL()); u == nil || !strings.HasPrefix(u.Host, "127.0.0.1") {
		t.Skip("the broker is not local: cannot create a user with rabbitmqctl")
	}
	user, pass := "wharftest-"+w.id, "pw-"+w.id
	rabbitmqctl(t, "add_user", user, pass)
	t.Cleanup(func() { rabbitmqctl(t, "delete_user", user) })
	rabbitmqctl(t, "set_permissions", "-p", "/", user, "", "^"+strings.ReplaceAll(w.exchange, ".", `\.`)+"$", "")
	u, _ := url.Parse(brokerURL())
	u.User = url.UserPassword(user, pass)

	s := openSink(t, sinkURL(u.String(), w.options()...))
	m := msg(wharfsinktest.TopicOrders, "k", []byte("through the exchange"))
	errs, _ := publish(t, s, []*wharf.Message{m})
	requireAcked(t, errs)
	if got := w.received([]string{wharfsinktest.TopicOrders}, 1, 5*time.Second); len(got) != 1 || got[0].ID != m.ID {
		t.Fatalf("the queue holds %v, want %s", got, m.ID)
	}

	direct := openSink(t, sinkURL(u.String(), "confirm_timeout="+testConfirm.String()))
	errs, _ = publish(t, direct, []*wharf.Message{msg(w.queues[wharfsinktest.TopicEvents], "k", []byte("by queue name"))})
	requireRetryable(t, "publish to the default exchange", errs[0])
	if !strings.Contains(errs[0].Error(), "ACCESS_REFUSED") {
		t.Fatalf("publish to the default exchange: %v: want ACCESS_REFUSED", errs[0])
	}
	time.Sleep(200 * time.Millisecond)
	if got := w.received([]string{wharfsinktest.TopicEvents}, 0, 0); len(got) != 0 {
		t.Fatalf("the events queue holds %v, want nothing", got)
	}
}
