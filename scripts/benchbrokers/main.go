// Command benchbrokers prepares and cleans up the destinations of the per-sink
// benchmark (scripts/sink-bench.sh), so that each sink's run starts from an
// empty destination and leaves nothing behind:
//
//	benchbrokers kafka ADDR TOPIC...          serve Kafka (kfake) on ADDR until killed
//	benchbrokers http ADDR                    answer 204 to every POST on ADDR until killed
//	benchbrokers nats-stream URL NAME SUBJECT create stream NAME on SUBJECT (file storage, newest 1M kept)
//	benchbrokers nats-delete URL NAME         delete stream NAME
//	benchbrokers amqp-queue URL QUEUE         declare a durable queue (default exchange, newest 1M kept)
//	benchbrokers amqp-delete URL QUEUE        delete the queue
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"
)

// maxKept bounds what a destination keeps during a benchmark.
const maxKept = 1_000_000

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "benchbrokers:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) < 2 {
		return fmt.Errorf("usage: benchbrokers kafka|http|nats-stream|nats-delete|amqp-queue|amqp-delete ARGS (see the source)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	switch cmd := args[0]; {
	case cmd == "kafka":
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port(args[1])), kfake.SeedTopics(3, args[2:]...))
		if err != nil {
			return err
		}
		defer c.Close()
		waitSignal()
		return nil
	case cmd == "http":
		srv := &http.Server{Addr: args[1], ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.WriteHeader(http.StatusNoContent)
		})}
		go func() { waitSignal(); _ = srv.Close() }()
		if err := srv.ListenAndServe(); err != http.ErrServerClosed {
			return err
		}
		return nil
	case (cmd == "nats-stream" && len(args) == 4) || (cmd == "nats-delete" && len(args) == 3):
		nc, err := nats.Connect(args[1])
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		if cmd == "nats-delete" {
			return js.DeleteStream(ctx, args[2])
		}
		// Bounded, so that a long sweep does not fill the disk; dropping the
		// oldest messages costs the server little.
		_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: args[2], Subjects: []string{args[3]}, Storage: jetstream.FileStorage, MaxMsgs: maxKept})
		return err
	case cmd == "amqp-queue" || cmd == "amqp-delete":
		conn, err := amqp.Dial(args[1])
		if err != nil {
			return err
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		if cmd == "amqp-delete" {
			_, err = ch.QueueDelete(args[2], false, false, false)
			return err
		}
		_, err = ch.QueueDeclare(args[2], true, false, false, false, amqp.Table{"x-max-length": int64(maxKept)})
		return err
	default:
		return fmt.Errorf("unknown command or wrong arguments: %q", args)
	}
}

func port(addr string) int {
	_, p, err := net.SplitHostPort(addr)
	n, err2 := strconv.Atoi(p)
	if err != nil || err2 != nil {
		fmt.Fprintf(os.Stderr, "benchbrokers: bad address %q: want host:port\n", addr)
		os.Exit(2)
	}
	return n
}

func waitSignal() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM)
	<-c
}
