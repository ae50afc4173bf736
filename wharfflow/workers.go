package wharfflow

import "sync"

// workers runs steps on goroutines kept from one step to the next. A
// goroutine per step started with a small stack and grew it, copying it,
// at every step (runtime.newstack was 10-15 % of a runner's CPU on empty
// steps); a kept goroutine grows it once. At most as many are kept as ran
// at once; close lets the idle ones end, and those running end after their
// step.
type workers struct {
	mu     sync.Mutex
	idle   []chan func() // each idle worker's own channel (buffered: a send never blocks)
	closed bool
}

// do runs f on an idle worker, or on a new one.
func (w *workers) do(f func()) {
	w.mu.Lock()
	if n := len(w.idle); n > 0 {
		ch := w.idle[n-1]
		w.idle = w.idle[:n-1]
		w.mu.Unlock()
		ch <- f
		return
	}
	w.mu.Unlock()
	go w.work(f)
}

func (w *workers) work(f func()) {
	ch := make(chan func(), 1)
	for {
		f()
		w.mu.Lock()
		if w.closed {
			w.mu.Unlock()
			return
		}
		w.idle = append(w.idle, ch)
		w.mu.Unlock()
		var ok bool
		if f, ok = <-ch; !ok {
			return
		}
	}
}

// close ends the idle workers, and the others once their step ends; do
// still runs what it is given, on a goroutine that ends after it.
func (w *workers) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	for _, ch := range w.idle {
		close(ch)
	}
	w.idle = nil
}
