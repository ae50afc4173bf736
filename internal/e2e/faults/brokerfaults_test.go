//go:build faults

package faults

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/faultproxy"
)

// kafkaTopics are the Kafka topics the load's wharf topics map to with
// topic_template=wf.{{topic}}.
var kafkaTopics = []string{"wf.orders", "wf.users", "wf.audit"}

// kafkaBroker is a one-broker kfake cluster in the test process that keeps
// its data in a directory, so it can be closed (listener and every client
// connection gone, as when a broker process stops) and started again on the
// same port with what it held. With a fault proxy in front, the broker
// advertises the proxy's address in its metadata, so every client connection
// (the relay's and the collector's) goes through the proxy.
type kafkaBroker struct {
	t       *testing.T
	port    int
	dir     string
	proxied string // the address the broker advertises ("" = its own)
	cl      *kfake.Cluster
	held    int64 // records the broker held when it was closed
}

// records is the number of records the broker holds in the topics.
func (k *kafkaBroker) records() int64 {
	var n int64
	for _, tp := range kafkaTopics {
		for _, p := range k.cl.PartitionInfos(tp) {
			n += p.HighWatermark - p.LogStartOffset
		}
	}
	return n
}

// advertised is a listener that reports another address than its own: kfake
// advertises its listener's address in metadata responses.
type advertised struct {
	net.Listener
	addr net.Addr
}

func (a advertised) Addr() net.Addr { return a.addr }

func startKafka(t *testing.T, withProxy bool) (*kafkaBroker, *faultproxy.Proxy) {
	t.Helper()
	k := &kafkaBroker{t: t, port: freePort(t), dir: t.TempDir()}
	var proxy *faultproxy.Proxy
	if withProxy {
		var err error
		proxy, err = faultproxy.New(fmt.Sprintf("127.0.0.1:%d", k.port))
		must(t, err, "start the fault proxy")
		t.Cleanup(func() { _ = proxy.Close() })
		k.proxied = proxy.Addr()
	}
	k.start()
	t.Cleanup(func() {
		if k.cl != nil {
			k.cl.Close()
		}
	})
	return k, proxy
}

func (k *kafkaBroker) start() {
	k.t.Helper()
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.Ports(k.port),
		kfake.DataDir(k.dir),
		kfake.SeedTopics(4, kafkaTopics...),
	}
	if k.proxied != "" {
		proxyAddr, err := net.ResolveTCPAddr("tcp", k.proxied)
		must(k.t, err, "resolve %s", k.proxied)
		opts = append(opts, kfake.ListenFn(func(network, address string) (net.Listener, error) {
			ln, err := net.Listen(network, address)
			if err != nil {
				return nil, err
			}
			return advertised{Listener: ln, addr: proxyAddr}, nil
		}))
	}
	var err error
	// The port was just released by the previous cluster: retry briefly.
	if !within(10*time.Second, func() bool {
		k.cl, err = kfake.NewCluster(opts...)
		return err == nil
	}) {
		k.t.Fatalf("start kfake on port %d: %v", k.port, err)
	}
	// The count before Close is a lower bound: produce requests the relays
	// had in flight can still be appended (and saved) while it closes. A
	// restart must not lose any of what was counted.
	if n := k.records(); n < k.held {
		k.t.Errorf("kfake restarted with %d records, it held at least %d when it was closed", n, k.held)
	}
}

// stop closes the cluster: it saves its data to its directory, closes its
// listener and every client connection.
func (k *kafkaBroker) stop() {
	k.held = k.records() // a lower bound: see start
	k.cl.Close()
	k.cl = nil
}

// addr is what clients are given as their seed broker.
func (k *kafkaBroker) addr() string {
	if k.proxied != "" {
		return k.proxied
	}
	return fmt.Sprintf("127.0.0.1:%d", k.port)
}

func (k *kafkaBroker) sinkURL() string {
	return "kafka://" + k.addr() + "?topic_template=wf.{{topic}}&delivery_timeout=3s&client_id=wharf-faults"
}

// kafkaCollector reads every partition of the topics from the start, with its
// own franz-go client (which reconnects by itself after a link fault). Each
// partition is one stream: a key's records are in one partition, in the
// order the broker appended them.
type kafkaCollector struct {
	t    *testing.T
	k    *kafkaBroker
	cl   *kgo.Client
	got  map[string][]delivery           // "topic/partition" -> records in offset order
	next map[string]map[int32]kgo.Offset // where each partition's reading resumes
}

func newKafkaCollector(t *testing.T, k *kafkaBroker) *kafkaCollector {
	t.Helper()
	c := &kafkaCollector{t: t, k: k, got: map[string][]delivery{}, next: map[string]map[int32]kgo.Offset{}}
	c.connect(kgo.ConsumeTopics(kafkaTopics...), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	t.Cleanup(func() { c.cl.Close() })
	return c
}

func (c *kafkaCollector) connect(consume ...kgo.Opt) {
	c.t.Helper()
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(c.k.addr()),
		kgo.FetchMaxWait(200 * time.Millisecond),
		kgo.ClientID("wharf-faults-collector"),
	}, consume...)
	cl, err := kgo.NewClient(opts...)
	must(c.t, err, "kafka consumer")
	c.cl = cl
}

// brokerRestarted replaces the client with a new one that resumes every
// partition where this one stopped. A client that lived through the restart
// of its only (kfake) broker stopped fetching some partitions for good: in a
// long run it saw 21,846 of 32,668 messages while a new client read all
// 32,668 from the broker. The relays' clients are what the test checks; the
// collector only has to read what the broker holds.
func (c *kafkaCollector) brokerRestarted() {
	c.t.Helper()
	c.cl.Close()
	parts := map[string]map[int32]kgo.Offset{}
	for _, tp := range kafkaTopics {
		parts[tp] = map[int32]kgo.Offset{}
		for _, p := range c.k.cl.PartitionInfos(tp) {
			at := kgo.NewOffset().AtStart()
			if o, ok := c.next[tp][p.Partition]; ok {
				at = o
			}
			parts[tp][p.Partition] = at
		}
	}
	c.connect(kgo.ConsumePartitions(parts))
}

// distinct reads until quiet reads in a row bring nothing new and returns
// the distinct seqs read so far.
func (c *kafkaCollector) distinct(quiet int) map[int64]bool {
	seen := map[int64]bool{}
	for q := 0; q < quiet; {
		before := len(seen)
		ds, _ := c.streams()
		for _, st := range ds {
			for _, d := range st {
				seen[d.seq] = true
			}
		}
		if len(seen) == before {
			q++
		}
	}
	return seen
}

func (c *kafkaCollector) streams() ([][]delivery, error) {
	// Fetch errors (the broker away, a connection reset) are retried by
	// the client: poll until nothing more arrives, for at most a second
	// (under load something always arrives).
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		fs := c.cl.PollFetches(ctx)
		cancel()
		n := 0
		fs.EachRecord(func(r *kgo.Record) {
			n++
			var id string
			for _, h := range r.Headers {
				if h.Key == "wharf-message-id" {
					id = string(h.Value)
				}
			}
			seq, nonce, err := wharf.ParseID(id)
			if err != nil {
				seq = -1 // counted as a message that never committed
			}
			if c.next[r.Topic] == nil {
				c.next[r.Topic] = map[int32]kgo.Offset{}
			}
			c.next[r.Topic][r.Partition] = kgo.NewOffset().At(r.Offset + 1)
			sk := fmt.Sprintf("%s/%d", r.Topic, r.Partition)
			c.got[sk] = append(c.got[sk], delivery{seq: seq, nonce: nonce, topic: strings.TrimPrefix(r.Topic, "wf."), key: string(r.Key)})
		})
		if n == 0 {
			break
		}
	}
	out := make([][]delivery, 0, len(c.got))
	for _, ds := range c.got {
		out = append(out, ds)
	}
	return out, nil
}

// failedPublishes sums wharf_failed_publishes_total over relays' admin
// addresses.
func failedPublishes(t *testing.T, admins ...string) float64 {
	t.Helper()
	var s float64
	for _, a := range admins {
		v, err := metric(a, "wharf_failed_publishes_total")
		if err != nil {
			t.Errorf("read wharf_failed_publishes_total from %s: %v", a, err)
		}
		s += v
	}
	return s
}

// A kfake broker (in the test process, persisting to a directory) is closed
// under load, its port refusing connections for the outage, and started again
// on the same port with its data. Per partition the first copies must be in
// per-key order (the sink's documented race needs a partition failing while
// a Publish is still handing its batch over; it would show up here as
// reordered).
func TestKafkaOutage(t *testing.T) {
	k, _ := startKafka(t, false)
	col := newKafkaCollector(t, k)
	outage := pick(5*time.Second, 60*time.Second)
	o := newOutbox(t, databaseURL)
	adm1 := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	adm2 := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	r1 := startRelay(t, o, "", "a", "", "--sink", k.sinkURL(), "--admin-addr", adm1)
	r2 := startRelay(t, o, "", "b", "", "--sink", k.sinkURL(), "--admin-addr", adm2)
	l := startLoad(t, o, nil, loadShape{})
	waitDelivered(t, col, 300, 30*time.Second)
	failedBefore := failedPublishes(t, adm1, adm2)
	k.stop()
	time.Sleep(outage)
	k.start()
	col.brokerRestarted()
	cleared := time.Now()
	if failed := failedPublishes(t, adm1, adm2); failed <= failedBefore {
		t.Errorf("no publish failed during the %s outage (%v before, %v after): the fault did not reach the relays", outage, failedBefore, failed)
	}
	rs := []*relay{r1, r2}
	revive(t, rs)
	time.Sleep(time.Second) // producers commit again before they stop
	verify(t, fmt.Sprintf("Kafka (kfake) broker closed %s under load", outage), o, l, col, cleared, pick(90*time.Second, 5*time.Minute))
	if t.Failed() {
		// Tell a collector that stopped fetching after the restart from
		// records the broker does not have: read everything again with a
		// new client, and count what is still in the outbox.
		fresh := newKafkaCollector(t, k)
		seen := fresh.distinct(3)
		old := col.distinct(1)
		var inOutbox int64
		_ = o.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+o.schema+".outbox").Scan(&inOutbox)
		t.Logf("diagnosis: the test's consumer saw %d distinct messages, a new consumer reading the broker from the start %d; %d rows still in the outbox; %d records in kfake",
			len(old), len(seen), inOutbox, k.records())
	}
	for _, r := range rs {
		r.stop(t, 30*time.Second)
	}
}

// rabbit is the machine's shared RabbitMQ: a fanout exchange and a durable
// queue of the test's own, deleted at the end, and a consumer reading the
// queue into a list in the queue's order.
type rabbit struct {
	listCollector
	url      string
	exchange string
	queue    string
	connName string // the relays' connection name (client property)
}

const rabbitURL = "amqp://guest:guest@127.0.0.1:5672/"

func newRabbit(t *testing.T) *rabbit {
	t.Helper()
	needBinary(t, "rabbitmqctl")
	conn, err := amqp.DialConfig(rabbitURL, amqp.Config{Properties: amqp.Table{"connection_name": "wharf-faults-collector"}})
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("RabbitMQ at %s: %v (required with CI=true)", rabbitURL, err)
		}
		t.Skipf("RabbitMQ at %s: %v", rabbitURL, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	r := &rabbit{url: rabbitURL, exchange: randName("wf-faults-x-"), queue: randName("wf-faults-q-"), connName: randName("wharf-faults-relay-")}
	ch, err := conn.Channel()
	must(t, err, "amqp channel")
	must(t, ch.ExchangeDeclare(r.exchange, "fanout", true, false, false, false, nil), "declare exchange")
	_, err = ch.QueueDeclare(r.queue, true, false, false, false, nil)
	must(t, err, "declare queue")
	must(t, ch.QueueBind(r.queue, "", r.exchange, false, nil), "bind queue")
	t.Cleanup(func() {
		// A channel of its own: the consumer's may be closed by now.
		c, err := amqp.Dial(rabbitURL)
		if err != nil {
			t.Logf("delete queue %s: %v", r.queue, err)
			return
		}
		defer c.Close()
		if dch, err := c.Channel(); err == nil {
			_, _ = dch.QueueDelete(r.queue, false, false, false)
			_ = dch.ExchangeDelete(r.exchange, false, false)
		}
	})
	cch, err := conn.Channel()
	must(t, err, "amqp consumer channel")
	must(t, cch.Qos(2000, 0, false), "qos")
	msgs, err := cch.Consume(r.queue, "wharf-faults", false, true, false, false, nil)
	must(t, err, "consume")
	go func() {
		for d := range msgs {
			seq, nonce, err := wharf.ParseID(d.MessageId)
			if err != nil {
				seq = -1 // counted as a message that never committed
			}
			key, _ := d.Headers["wharf-key"].(string)
			r.add(delivery{seq: seq, nonce: nonce, topic: d.Type, key: key})
			_ = d.Ack(false)
		}
	}()
	return r
}

func (r *rabbit) sinkURL() string {
	return r.url + "?exchange=" + r.exchange + "&strict_order=true&confirm_timeout=3s&name=" + r.connName
}

func rabbitctl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	// Generous: the CLI takes seconds to start on a loaded machine, and the
	// evals below run for the whole fault (a minute in the long form).
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "rabbitmqctl", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("rabbitmqctl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// rabbitmqctl starts an Erlang VM for every call, which takes seconds (15 s
// on a loaded 2-core machine): the faults are driven with one `rabbitmqctl
// eval` each, so that their timing is the broker's and not the CLI's.

// findConns is an Erlang fun listing the pids of the connections whose
// client-provided name is name.
func findConns(name string) string {
	return `Find = fun() -> [P || I <- rabbit_networking:connection_info_all([pid, client_properties]),
		{pid, P} <- [lists:keyfind(pid, 1, I)], {client_properties, Ps} <- [lists:keyfind(client_properties, 1, I)],
		lists:member({<<"connection_name">>, longstr, <<"` + name + `">>}, Ps)] end`
}

// closeRelayConnections force-closes, rounds times, the connections whose
// client-provided name is the relays' (RabbitMQ is shared: nobody else's),
// as `rabbitmqctl close_connection` does: each round waits (up to 10 s) for
// the relays to have connected again, closes their connections, then waits
// gap. It returns how many connections each round closed.
func (r *rabbit) closeRelayConnections(t *testing.T, rounds int, gap time.Duration) []int {
	t.Helper()
	expr := findConns(r.connName) + `,
	Wait = fun W(0) -> []; W(K) -> case Find() of [] -> timer:sleep(100), W(K - 1); Ps -> Ps end end,
	Round = fun R(0, Acc) -> lists:reverse(Acc);
	            R(K, Acc) -> Ps = Wait(100),
	                         [rabbit_networking:close_connection(P, "fault test") || P <- Ps],
	                         timer:sleep(` + strconv.Itoa(int(gap.Milliseconds())) + `),
	                         R(K - 1, [length(Ps) | Acc]) end,
	lists:flatten(io_lib:format("~w", [Round(` + strconv.Itoa(rounds) + `, [])])).`
	out, err := rabbitctl(t, "eval", expr)
	must(t, err, "close the relays' connections")
	m := regexp.MustCompile(`\[([0-9,]*)\]`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("close the relays' connections: unexpected output %q", out)
	}
	var counts []int
	for _, f := range strings.Split(m[1], ",") {
		if n, err := strconv.Atoi(f); err == nil {
			counts = append(counts, n)
		}
	}
	return counts
}

var (
	relWatermark = regexp.MustCompile(`Memory high watermark setting: ([0-9.]+) of available memory`)
	envWatermark = regexp.MustCompile(`\{vm_memory_high_watermark,([^{}\n]+|\{absolute,[^}]+\})\}`)
)

// memoryWatermark reads the broker's memory high watermark as an Erlang term
// that sets it again: a fraction such as 0.4, or {absolute, N}.
func memoryWatermark(t *testing.T) (term string, frac float64, err error) {
	t.Helper()
	out, err := rabbitctl(t, "status")
	if err != nil {
		return "", 0, err
	}
	if m := relWatermark.FindStringSubmatch(out); m != nil {
		f, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			return "", 0, err
		}
		return erlangFloat(f), f, nil
	}
	env, err := rabbitctl(t, "environment")
	if err != nil {
		return "", 0, err
	}
	m := envWatermark.FindStringSubmatch(env)
	if m == nil {
		return "", 0, fmt.Errorf("no memory high watermark in rabbitmqctl status nor environment")
	}
	v := strings.TrimSpace(m[1])
	if strings.HasPrefix(v, "{absolute,") {
		return v, 1, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return "", 0, fmt.Errorf("memory high watermark %q: %w", v, err)
	}
	return erlangFloat(f), f, nil
}

func erlangFloat(f float64) string {
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}

type watermark struct {
	term string
	err  error
}

// readWatermark reads the broker's memory high watermark in the background
// (rabbitmqctl is slow). Another test may hold the shared broker's alarm
// right now: it waits (up to 90 s) for that watermark to be restored rather
// than later "restore" that one.
func readWatermark(t *testing.T) <-chan watermark {
	ch := make(chan watermark, 1)
	go func() {
		deadline := time.Now().Add(90 * time.Second)
		for {
			term, frac, err := memoryWatermark(t)
			if err != nil || frac >= 0.01 {
				ch <- watermark{term, err}
				return
			}
			if time.Now().After(deadline) {
				ch <- watermark{err: fmt.Errorf("the watermark stayed at %s, below 0.01, for 90s (another test's alarm?): not touching it", term)}
				return
			}
			time.Sleep(time.Second)
		}
	}()
	return ch
}

// memoryAlarm raises the shared broker's memory alarm for d: one `rabbitmqctl
// eval` sets the memory high watermark so low that the alarm goes off at
// once, sleeps d on the broker and sets the watermark it had back, so the
// broker restores it even if this test dies. The restore is also registered
// with t.Cleanup. A probe connection that keeps publishing (to no queue)
// sees connection.blocked and connection.unblocked: memoryAlarm sends the
// first moment to onBlocked (if not nil) and returns both once the broker
// unblocked it.
func memoryAlarm(t *testing.T, d time.Duration, prevWatermark <-chan watermark, onBlocked chan<- time.Time) (blocked, unblocked time.Time) {
	t.Helper()
	w := <-prevWatermark
	if w.err != nil {
		t.Fatalf("read the memory high watermark: %v", w.err)
	}
	prev := w.term
	restore := func() {
		if _, err := rabbitctl(t, "eval", "vm_memory_monitor:set_vm_memory_high_watermark("+prev+")."); err != nil {
			t.Errorf("RESTORE FAILED, set it by hand (rabbitmqctl set_vm_memory_high_watermark %s): %v", prev, err)
			return
		}
		t.Logf("memory high watermark restored to %s", prev)
	}
	t.Cleanup(restore)

	probe, err := amqp.DialConfig(rabbitURL, amqp.Config{Properties: amqp.Table{"connection_name": "wharf-faults-probe"}})
	must(t, err, "probe connection")
	defer probe.Close()
	pch, err := probe.Channel()
	must(t, err, "probe channel")
	notes := probe.NotifyBlocked(make(chan amqp.Blocking, 16))
	stopProbe := make(chan struct{})
	defer close(stopProbe)
	go func() {
		nowhere := randName("wf-faults-nowhere-")
		for {
			select {
			case <-stopProbe:
				return
			case <-time.After(100 * time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = pch.PublishWithContext(ctx, "", nowhere, false, false, amqp.Publishing{Body: []byte("probe")})
			cancel()
		}
	}()

	evalDone := make(chan error, 1)
	go func() {
		_, err := rabbitctl(t, "eval", "vm_memory_monitor:set_vm_memory_high_watermark(0.0000001), timer:sleep("+
			strconv.Itoa(int(d.Milliseconds()))+"), vm_memory_monitor:set_vm_memory_high_watermark("+prev+").")
		evalDone <- err
	}()
	wait := func(active bool, timeout time.Duration) time.Time {
		deadline := time.After(timeout)
		for {
			select {
			case b := <-notes:
				if b.Active == active {
					return time.Now()
				}
			case err := <-evalDone:
				evalDone <- err
				if err != nil {
					t.Fatalf("memory alarm: %v", err)
				}
			case <-deadline:
				t.Fatalf("the probe connection was not %s within %s", map[bool]string{true: "blocked", false: "unblocked"}[active], timeout)
			}
		}
	}
	blocked = wait(true, 90*time.Second)
	if onBlocked != nil {
		onBlocked <- blocked
	}
	unblocked = wait(false, d+90*time.Second)
	if err := <-evalDone; err != nil {
		t.Errorf("memory alarm: %v", err)
	}
	return blocked, unblocked
}

// Two relays publish to the shared RabbitMQ (strict_order=true, so the
// queue's first copies must be in per-key order) while (a) their connections
// are force-closed several times and (b) the broker's memory alarm blocks
// every publisher for a while. Nothing may be lost or reordered, and the
// relays must resume by themselves once the alarm is cleared.
func TestRabbitMQConnectionsClosedAndMemoryAlarm(t *testing.T) {
	rq := newRabbit(t)
	o := newOutbox(t, databaseURL)
	adm1 := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	adm2 := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	r1 := startRelay(t, o, "", "a", "", "--sink", rq.sinkURL(), "--admin-addr", adm1)
	r2 := startRelay(t, o, "", "b", "", "--sink", rq.sinkURL(), "--admin-addr", adm2)
	l := startLoad(t, o, nil, loadShape{})
	waitDelivered(t, rq, 300, 30*time.Second)

	prevWatermark := readWatermark(t)
	rounds := pick(3, 10)
	counts := rq.closeRelayConnections(t, rounds, pick(2*time.Second, 5*time.Second))
	closed := 0
	for _, n := range counts {
		closed += n
	}
	if len(counts) != rounds || slices.Contains(counts, 0) {
		t.Errorf("closed %v relay connections in %d rounds: some round found no relay connection", counts, rounds)
	}
	waitDelivered(t, rq, len(rq.snapshot())+100, 30*time.Second)

	alarm := pick(4*time.Second, 60*time.Second)
	var atBlock int
	var grewLate int
	stopWatch := make(chan struct{})
	watched := make(chan struct{})
	blockedCh := make(chan time.Time, 1)
	go func() {
		// How much the queue took in the second half of the alarm, for the
		// row's note. It need not be zero: RabbitMQ blocks a connection
		// only once it publishes, and the sink opens its connection again
		// during the alarm after a confirm timeout.
		defer close(watched)
		var b time.Time
		select {
		case b = <-blockedCh:
		case <-stopWatch:
			return
		}
		time.Sleep(time.Until(b.Add(alarm / 2)))
		atBlock = len(rq.snapshot())
		<-stopWatch
		grewLate = len(rq.snapshot()) - atBlock
	}()
	failedBefore := failedPublishes(t, adm1, adm2)
	blocked, unblocked := memoryAlarm(t, alarm, prevWatermark, blockedCh)
	close(stopWatch)
	<-watched
	// The relays' publishes must have failed during the alarm (blocked,
	// then confirm_timeout), not hung.
	if failed := failedPublishes(t, adm1, adm2); failed <= failedBefore {
		t.Errorf("no publish failed during the memory alarm (%v before, %v after): the alarm did not reach the relays", failedBefore, failed)
	}
	cleared := unblocked
	rs := []*relay{r1, r2}
	revive(t, rs)
	time.Sleep(time.Second)
	addNote(t, "connections closed per round %v; probe blocked %s, queue took %d messages in the alarm's second half", counts, unblocked.Sub(blocked).Round(10*time.Millisecond), grewLate)
	res := verify(t, fmt.Sprintf("RabbitMQ: relay connections closed x%d, then memory alarm %s", rounds, alarm), o, l, rq, cleared, pick(90*time.Second, 5*time.Minute))
	t.Logf("rabbitmq: %v connections closed; publishers blocked for %s; recovery after the alarm %s", counts, unblocked.Sub(blocked), res.recovery)
	for _, r := range rs {
		r.stop(t, 30*time.Second)
	}
}

func (c *listCollector) snapshot() []delivery {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ds[:len(c.ds):len(c.ds)]
}

// startNATS starts the test's own nats-server with JetStream and a stream
// WF capturing wf.>, and returns it and a collector reading WF
// directly (not through any proxy).
func startNATS(t *testing.T) (*server, *natsCollector) {
	t.Helper()
	bin := needBinary(t, "nats-server")
	port := freePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	srv := startServer(t, "nats-server", bin, addr, "-js", "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-sd", t.TempDir())
	nc, err := nats.Connect("nats://"+addr, nats.MaxReconnects(-1), nats.ReconnectWait(200*time.Millisecond))
	must(t, err, "connect to nats-server")
	t.Cleanup(nc.Close)
	js, err := nc.JetStream()
	must(t, err, "JetStream")
	_, err = js.AddStream(&nats.StreamConfig{Name: "WF", Subjects: []string{"wf.>"}, Storage: nats.FileStorage})
	must(t, err, "create stream")
	return srv, &natsCollector{nc: nc, js: js, stream: "WF", next: 1}
}

// sinkPartition runs one network fault between the relays and their broker:
// two relays whose sink connections go through proxy (their database
// connections are direct), under load; fault runs the fault and returns when
// it ended. For a stall, the relays must fail publishes while the link is
// still stalled (their sink calls time out instead of hanging) and keep
// every lane (no lease lost, all 64 lanes owned throughout).
func sinkPartition(t *testing.T, name, sinkURL string, col collector, stall time.Duration, fault func()) {
	t.Helper()
	o := newOutbox(t, databaseURL)
	adm1 := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	adm2 := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	r1 := startRelay(t, o, "", "a", "", "--sink", sinkURL, "--admin-addr", adm1)
	r2 := startRelay(t, o, "", "b", "", "--sink", sinkURL, "--admin-addr", adm2)
	l := startLoad(t, o, nil, loadShape{})
	waitDelivered(t, col, 300, 30*time.Second)
	sum := func(metricName string) float64 {
		var s float64
		for _, a := range []string{adm1, adm2} {
			v, err := metric(a, metricName)
			if err != nil {
				t.Errorf("read %s from %s: %v", metricName, a, err)
			}
			s += v
		}
		return s
	}
	lossesBefore := sum("wharf_lease_losses_total")
	failedBefore := sum("wharf_failed_publishes_total")

	// Watch the lanes while the fault lasts.
	ctx := context.Background()
	stopWatch := make(chan struct{})
	var watchWG sync.WaitGroup
	var minOwned = 64
	watchWG.Add(1)
	go func() {
		defer watchWG.Done()
		for {
			select {
			case <-stopWatch:
				return
			case <-time.After(250 * time.Millisecond):
			}
			n, err := o.ownedLanes(ctx, r1.id, r2.id)
			if err != nil {
				continue
			}
			if n < minOwned {
				minOwned = n
			}
		}
	}()

	faultStart := time.Now()
	var failedDuring float64
	var timedOut bool
	if stall > 0 {
		// fault stalls and blocks until the stall ends; meanwhile the
		// relays' failed publishes must rise.
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); fault() }()
		timedOut = within(stall-time.Second, func() bool {
			failedDuring = sum("wharf_failed_publishes_total")
			return failedDuring > failedBefore
		})
		wg.Wait()
	} else {
		fault()
	}
	cleared := time.Now()
	close(stopWatch)
	watchWG.Wait()
	if stall > 0 && !timedOut {
		t.Errorf("%s: no publish failed during the stall (%v failed before): the sink calls did not time out", name, failedBefore)
	}
	if losses := sum("wharf_lease_losses_total") - lossesBefore; losses > 0 {
		t.Errorf("%s: the relays lost %v lanes to each other during the fault", name, losses)
	}
	if minOwned < 64 {
		t.Errorf("%s: during the fault the two relays owned only %d of 64 lanes at one point", name, minOwned)
	}
	rs := []*relay{r1, r2}
	revive(t, rs)
	time.Sleep(time.Second)
	res := verify(t, name, o, l, col, cleared, pick(90*time.Second, 5*time.Minute))
	t.Logf("%s: fault %s; publishes failed during it %v; lanes owned at least %d/64; recovery %s",
		name, cleared.Sub(faultStart).Round(10*time.Millisecond), sum("wharf_failed_publishes_total")-failedBefore, minOwned, res.recovery)
	for _, r := range rs {
		r.stop(t, 30*time.Second)
	}
}

// The relays' connections to their broker go through a fault proxy:
//
//   - stall: bytes swallowed in both directions, connections left open (a
//     partition, a dead host) for longer than the sink's timeouts
//     (ack_timeout=2s for NATS, delivery_timeout=3s for Kafka, timeout=2s
//     for Redis, confirm_timeout=3s for RabbitMQ). The relays
//     must time out (publishes fail while the link is still stalled), keep
//     their lanes, and deliver everything after the link heals.
//   - reset: every connection closed every 500 ms for the window.
//   - slow: 20 ms added to every chunk in both directions for the window.
func TestNetworkToBroker(t *testing.T) {
	window := pick(5*time.Second, 60*time.Second)
	stallFor := pick(8*time.Second, 60*time.Second)
	natsSink := func(addr string) string {
		return "nats://" + addr + "?stream=WF&subject_template=wf.{{topic}}&strict_order=true&ack_timeout=2s"
	}

	// Every broker behind the proxy: NATS (ack_timeout=2s), Kafka
	// (delivery_timeout=3s), Redis (timeout=2s) and RabbitMQ
	// (confirm_timeout=3s).
	proxyTo := func(t *testing.T, addr string) *faultproxy.Proxy {
		proxy, err := faultproxy.New(addr)
		must(t, err, "start the fault proxy")
		t.Cleanup(func() { _ = proxy.Close() })
		return proxy
	}
	brokers := []struct {
		name  string // in the subtest's name
		label string // in the scenario's name
		start func(t *testing.T) (sinkURL string, col collector, proxy *faultproxy.Proxy)
	}{
		{"nats", "NATS", func(t *testing.T) (string, collector, *faultproxy.Proxy) {
			srv, col := startNATS(t)
			proxy := proxyTo(t, srv.addr)
			return natsSink(proxy.Addr()), col, proxy
		}},
		{"kafka", "Kafka", func(t *testing.T) (string, collector, *faultproxy.Proxy) {
			k, proxy := startKafka(t, true)
			return k.sinkURL(), newKafkaCollector(t, k), proxy
		}},
		{"redis", "Redis", func(t *testing.T) (string, collector, *faultproxy.Proxy) {
			srv, col := startRedis(t)
			proxy := proxyTo(t, srv.addr)
			return redisSink(proxy.Addr()), col, proxy
		}},
		{"rabbitmq", "RabbitMQ", func(t *testing.T) (string, collector, *faultproxy.Proxy) {
			rq := newRabbit(t)
			proxy := proxyTo(t, "127.0.0.1:5672")
			return strings.Replace(rq.sinkURL(), "@127.0.0.1:5672/", "@"+proxy.Addr()+"/", 1), rq, proxy
		}},
	}
	faults := []struct {
		name  string
		label string
		stall time.Duration // how long publishes must fail (0: they need not)
		run   func(p *faultproxy.Proxy)
	}{
		{"stall", fmt.Sprintf("link stalled (no RST) for %s", stallFor), stallFor, func(p *faultproxy.Proxy) {
			p.Stall()
			time.Sleep(stallFor)
			p.Resume()
		}},
		{"reset", fmt.Sprintf("link reset every 500ms for %s", window), 0, func(p *faultproxy.Proxy) {
			for end := time.Now().Add(window); time.Now().Before(end); {
				p.Reset()
				time.Sleep(500 * time.Millisecond)
			}
		}},
		// 20 ms added to every chunk in both directions, well below each
		// sink's timeout: the relays must keep their lanes and deliver
		// everything, in order, through it.
		{"slow", fmt.Sprintf("link +20ms per chunk for %s", window), 0, func(p *faultproxy.Proxy) {
			p.Delay(20 * time.Millisecond)
			time.Sleep(window)
			p.Delay(0)
		}},
	}
	for _, f := range faults {
		for _, b := range brokers {
			t.Run(b.name+"-"+f.name, func(t *testing.T) {
				sinkURL, col, proxy := b.start(t)
				sinkPartition(t, b.label+" "+f.label, sinkURL, col, f.stall, func() { f.run(proxy) })
			})
		}
	}
}
