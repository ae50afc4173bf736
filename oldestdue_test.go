package wharf_test

import (
	"testing"
	"time"
)

// The oldest due message is aged from when it became due: a message enqueued
// an hour ago and scheduled until a moment ago has been due for a moment, not
// an hour; a later message of the same lane that was never scheduled, due for
// longer, is still found.
func TestOldestDueCountsFromWhenTheMessageBecameDue(t *testing.T) {
	t.Parallel()
	b := setupDB(t)
	ago := -2 * time.Second
	insertAged(t, b, "t", "A", time.Hour, &ago) // head of its lane: due for 2 s
	st := statusOf(t, b, nil)
	requireAbout(t, 2*time.Second, st.OldestDueAge, "a rescheduled message is due since its deliver_at")

	insertAged(t, b, "t", sameLaneKey(t, b, "A"), 20*time.Minute, nil) // same lane, behind it, due for 20 min
	st = statusOf(t, b, nil)
	requireAbout(t, 20*time.Minute, st.OldestDueAge, "a lane whose head had a schedule is walked")

}
