package wharf

import (
	"log/slog"
	"time"
)

// outageLog keeps the relay's log short through an outage: the first
// database failure in a row is logged, then every 10th, and one line says
// when the database answers again; lost lane leases are logged once per
// round and one line says when the relay holds lanes again.
type outageLog struct {
	dbFailures int       // database failures in a row
	dbDownAt   time.Time // the first of them
	lostAt     time.Time // when lanes were lost, until some are held again
}

// dbFailed counts a failed database round trip and reports whether to log it.
func (o *outageLog) dbFailed(now time.Time) bool {
	o.dbFailures++
	if o.dbFailures == 1 {
		o.dbDownAt = now
	}
	return o.dbFailures == 1 || o.dbFailures%10 == 0
}

// dbOK notes a successful round trip, logging the recovery after failures.
func (o *outageLog) dbOK(log *slog.Logger, now time.Time) {
	if o.dbFailures == 0 {
		return
	}
	log.Info("wharf: the database answers again", "failed_round_trips", o.dbFailures, "down_for", now.Sub(o.dbDownAt).Round(time.Millisecond))
	o.dbFailures = 0
}

func (o *outageLog) lanesLost(now time.Time) {
	if o.lostAt.IsZero() {
		o.lostAt = now
	}
}

// lanesBack notes lanes acquired, logging the recovery after a loss.
func (o *outageLog) lanesBack(log *slog.Logger, now time.Time, owned int) {
	if o.lostAt.IsZero() {
		return
	}
	log.Info("wharf: holding lanes again after losing leases", "lanes_owned", owned, "since_loss", now.Sub(o.lostAt).Round(time.Millisecond))
	o.lostAt = time.Time{}
}
