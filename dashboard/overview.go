package dashboard

import (
	"context"
	"net/http"
	"time"

	"github.com/pelicanqueue/pelican/internal/queuestats"
)

// streamNames returns the queues to show: Config.Streams, or the streams
// SCAN found (reused for Config.StreamsTTL), and whether SCAN was denied.
func (d *Dashboard) streamNames(ctx context.Context) ([]string, bool, error) {
	if len(d.cfg.Streams) > 0 {
		return d.cfg.Streams, false, nil
	}
	d.streamsMu.Lock()
	defer d.streamsMu.Unlock()
	if d.streams != nil && time.Since(d.streamsAt) < d.cfg.StreamsTTL {
		return d.streams, d.denied, nil
	}
	names, denied, err := queuestats.Scan(ctx, d.rdb)
	if err != nil {
		return nil, false, err
	}
	d.streams, d.denied, d.streamsAt = names, denied, time.Now()
	return names, denied, nil
}

type overviewRow struct {
	Q                queuestats.Queue
	NotFound         bool
	Denied           bool
	Lag              int64
	Pending          int64
	Consumers        int
	OldestAge        time.Duration
	HasOldest        bool
	Added, Completed chart
}

type overviewData struct {
	Rows       []overviewRow
	Skipped    int // streams the Redis user may not read
	ScanDenied bool
	ReasonScan int
	Elapsed    time.Duration
}

func (d *Dashboard) overview(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	ctx := r.Context()
	names, denied, err := d.streamNames(ctx)
	if err != nil {
		d.fail(w, r, http.StatusBadGateway, "cannot list the streams", err)
		return
	}
	qs, now, err := queuestats.Collect(ctx, d.rdb, names, queuestats.Options{ReasonScan: d.cfg.ReasonScan})
	if err != nil {
		d.fail(w, r, http.StatusBadGateway, "cannot read the queues", err)
		return
	}
	data := overviewData{ScanDenied: denied, ReasonScan: d.cfg.ReasonScan}
	for _, q := range qs {
		row := overviewRow{Q: q}
		switch {
		case queuestats.NoPerm(q.Err) && len(d.cfg.Streams) == 0:
			data.Skipped++ // another team's stream: not even named
			continue
		case q.Err != nil && len(d.cfg.Streams) == 0 && isNotFound(q.Err):
			continue // deleted since the SCAN
		case isNotFound(q.Err):
			row.NotFound = true
		}
		d.rates.record(q, now)
		row.Lag, row.Pending, row.Consumers = q.MaxLag(), q.Pending(), q.Consumers()
		row.OldestAge, row.HasOldest = q.OldestPendingAge()
		row.Added, row.Completed = d.rates.charts(q.Stream, now)
		data.Rows = append(data.Rows, row)
	}
	data.Elapsed = time.Since(start)
	d.render(w, r, http.StatusOK, "overview", "Queues", true, data)
}
