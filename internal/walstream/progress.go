package walstream

import (
	"fmt"
	"time"
)

// Progress tells how far a slot may be confirmed: to the end of the longest
// run of streamed transactions, in the order the stream delivered them
// (commit order), whose messages are all settled — delivered, or written to
// a table that keeps them (a retry or dead-letter row). Confirming past a
// transaction with an unsettled message would lose that message if the relay
// stopped: the slot would not stream it again.
//
// Transactions enter with Add in stream order; Settle comes in any order.
// Progress is not safe for concurrent use.
type Progress struct {
	txs         []progressTx // txs[head:]: from the oldest not yet passed, in stream order
	head        int
	first       Tx // the Tx of txs[head]
	confirmable LSN
}

// Tx names a transaction added to a Progress.
type Tx uint64

type progressTx struct {
	end       LSN       // the commit's end: where a confirmation past it points
	committed time.Time // the commit's time (the server's clock)
	open      int       // messages not settled yet
}

// Add registers the next transaction of the stream, ending at end (its
// Commit's EndLSN) and committed at committed, with messages messages to
// settle. A transaction with none (all its messages belonged to other
// outboxes) is settled at once.
func (p *Progress) Add(end LSN, committed time.Time, messages int) (Tx, error) {
	if messages < 0 {
		return 0, fmt.Errorf("walstream: a transaction of %d messages", messages)
	}
	if n := len(p.txs); (n > p.head && end <= p.txs[n-1].end) || end <= p.confirmable {
		return 0, fmt.Errorf("walstream: transaction ending at %s added after one ending at or past it: transactions must be added in stream order", end)
	}
	tx := p.first + Tx(p.Pending())
	p.txs = append(p.txs, progressTx{end: end, committed: committed, open: messages})
	p.advance()
	return tx, nil
}

// Settle records that one message of tx is settled.
func (p *Progress) Settle(tx Tx) error {
	if tx < p.first || tx >= p.first+Tx(p.Pending()) {
		return fmt.Errorf("walstream: settle of transaction %d, which is not pending (pending: %d to %d)", tx, p.first, p.first+Tx(p.Pending()))
	}
	t := &p.txs[p.head+int(tx-p.first)]
	if t.open == 0 {
		return fmt.Errorf("walstream: transaction %d (ending at %s) settled more often than it has messages", tx, t.end)
	}
	t.open--
	p.advance()
	return nil
}

// advance passes the settled transactions at the head. The passed ones are
// dropped from the slice only once they are half of it, so passing one
// transaction at a time in front of a long queue costs no copy each time.
func (p *Progress) advance() {
	for p.head < len(p.txs) && p.txs[p.head].open == 0 {
		p.confirmable = p.txs[p.head].end
		p.head++
		p.first++
	}
	if p.head > 0 && p.head >= len(p.txs)/2 {
		p.txs = append(p.txs[:0], p.txs[p.head:]...)
		p.head = 0
	}
}

// Confirmable is the position the slot may be confirmed up to: the end of
// the last transaction of the settled run (0 before any).
func (p *Progress) Confirmable() LSN { return p.confirmable }

// Oldest is the commit time of the oldest transaction with a message not
// settled yet; zero when every transaction added is settled.
func (p *Progress) Oldest() time.Time {
	if p.Pending() == 0 {
		return time.Time{}
	}
	return p.txs[p.head].committed
}

// Pending is how many transactions are not yet passed: the oldest of them
// still has an unsettled message.
func (p *Progress) Pending() int { return len(p.txs) - p.head }
