package wharfflow

// QueuedIDs are the ids of the steps signals leased to r that wait in its
// queue for a free slot (admitLeased).
func QueuedIDs(r *Runner) []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []int64
	for _, q := range r.queued {
		out = append(out, q.c.ID)
	}
	return out
}
