package wharf

import (
	"fmt"

	"github.com/wharfhq/wharf/internal/store"
)

// checkInvariants is set by the package's tests: the engine then checks its
// bookkeeping after every event and panics on the first inconsistency.
var checkInvariants = false

func (r *relay) checkInvariants() {
	loaded := map[*msg]bool{}
	stubs := 0
	var total memUse
	for _, l := range r.lanes {
		total.msgs += l.mem.msgs
		total.bytes += l.mem.bytes
		var lm memUse
		count := func(m *msg) {
			if !loaded[m] {
				loaded[m] = true
				lm.msgs++
				lm.bytes += m.size
			}
		}
		for k, kq := range l.keys {
			if kq.key != k || kq.lane != l {
				panic(fmt.Sprintf("wharf invariant: key %q filed under %q", kq.key, k))
			}
			for i, m := range kq.msgs {
				if i > 0 && kq.msgs[i-1].Seq >= m.Seq {
					panic(fmt.Sprintf("wharf invariant: key %q messages out of order", k))
				}
				if m.kq != kq {
					panic("wharf invariant: message in another key's queue")
				}
				count(m)
			}
			for i := 1; i < len(kq.stubs); i++ {
				if kq.stubs[i-1] >= kq.stubs[i] {
					panic(fmt.Sprintf("wharf invariant: key %q positions out of order", k))
				}
			}
			stubs += len(kq.stubs)
			running := 0
			for _, m := range kq.msgs {
				if m.atSink {
					running++
				}
			}
			if running > 0 && !kq.running {
				panic(fmt.Sprintf("wharf invariant: key %q has messages at a sink but is not running", k))
			}
		}
		for _, m := range l.unkeyed {
			count(m)
		}
		for _, o := range r.ops.pending {
			if o.Ref.(*msg).lane == l && (o.Kind == store.OpAck || o.Kind == store.OpDead) {
				count(o.Ref.(*msg))
			}
		}
		if !r.ops.busy && lm != l.mem {
			panic(fmt.Sprintf("wharf invariant: lane %d counts %+v loaded, holds %+v", l.id, l.mem, lm))
		}
	}
	if total != r.mem {
		panic(fmt.Sprintf("wharf invariant: relay counts %+v loaded, lanes %+v", r.mem, total))
	}
	acks := 0
	for _, o := range r.ops.pending {
		if o.Kind == store.OpAck {
			acks++
		}
	}
	if acks != r.ops.acks {
		panic(fmt.Sprintf("wharf invariant: %d acknowledgements pending, %d counted", acks, r.ops.acks))
	}
	if stubs != r.stubs {
		panic(fmt.Sprintf("wharf invariant: %d positions counted, %d held", r.stubs, stubs))
	}
}
