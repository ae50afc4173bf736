package wharfkafka

import (
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// connWatch remembers the last failed broker connection until one succeeds.
// franz-go retries a failed dial until a record's delivery_timeout, so a
// record then fails with a bare timeout; the hint names why it could not be
// written (a refused connection, a certificate the CA does not sign, a
// failed SASL handshake).
type connWatch struct {
	last atomic.Pointer[connFailure]
}

type connFailure struct {
	addr string
	err  error
}

var _ kgo.HookBrokerConnect = (*connWatch)(nil)

// OnBrokerConnect implements kgo.HookBrokerConnect.
func (w *connWatch) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err == nil {
		w.last.Store(nil)
		return
	}
	w.last.Store(&connFailure{addr: net.JoinHostPort(meta.Host, strconv.Itoa(int(meta.Port))), err: err})
}

// hint is "; last connection to broker host:port failed: …" while the last connection
// attempt failed, and empty otherwise.
func (w *connWatch) hint() string {
	f := w.last.Load()
	if f == nil {
		return ""
	}
	return "; last connection to broker " + f.addr + " failed: " + f.err.Error()
}
