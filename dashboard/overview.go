package dashboard

import (
	"context"
	"net/http"
	"sort"
	"time"

	"github.com/pelicanqueue/pelican/internal/queuestats"
)

// streamNames returns the queues to show: Config.Streams, or the streams
// SCAN found (reused for Config.StreamsTTL), and whether SCAN was denied.
func (d *Dashboard) streamNames(ctx context.Context) ([]string, bool, error) {
	names, denied, err := d.scanOrConfigured(ctx)
	if err != nil || len(d.parts) == 0 {
		return names, denied, err
	}
	// The partitioned queues, their partition streams left out.
	out := make([]string, 0, len(names)+len(d.parts))
	for _, n := range names {
		if !d.partOf[n] && d.parts[n] == nil {
			out = append(out, n)
		}
	}
	for q := range d.parts {
		out = append(out, q)
	}
	sort.Strings(out)
	return out, denied, nil
}

// scanOrConfigured returns Config.Streams, or the streams SCAN found.
func (d *Dashboard) scanOrConfigured(ctx context.Context) ([]string, bool, error) {
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
	Partitions       int // partition count of a partitioned queue
	Pauses           pauseView
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
	qs, _, now, err := d.collect(ctx, names)
	if err != nil {
		d.fail(w, r, http.StatusBadGateway, "cannot read the queues", err)
		return
	}
	data := overviewData{ScanDenied: denied, ReasonScan: d.cfg.ReasonScan}
	streams := make([][]string, len(names))
	for i, n := range names {
		if streams[i] = d.partitions(n); streams[i] == nil {
			streams[i] = []string{n}
		}
	}
	pauses := d.readPauses(ctx, streams, now)
	for i, q := range qs {
		row := overviewRow{Q: q, Partitions: len(d.partitions(q.Stream)), Pauses: pauses[i]}
		switch {
		case queuestats.NoPerm(q.Err) && len(d.cfg.Streams) == 0 && row.Partitions == 0:
			data.Skipped++ // another team's stream: not even named
			continue
		case q.Err != nil && len(d.cfg.Streams) == 0 && row.Partitions == 0 && isNotFound(q.Err):
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
