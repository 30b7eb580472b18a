package dlq

import (
	"context"
	"fmt"
	"time"
)

// PurgeOptions configures one [DLQ.Purge].
type PurgeOptions struct {
	// DryRun only counts what would be deleted.
	DryRun bool
	// Progress, if set, is called with the number of entries deleted so far
	// (in a dry run: matched), at most every ProgressInterval and once at the
	// end.
	Progress func(deleted int)
	// ProgressInterval defaults to [DefaultProgressInterval].
	ProgressInterval time.Duration
}

// Purge deletes the entries matching f, with XDEL in batches of
// Config.PageSize, and returns how many it deleted (in a dry run: how many
// match). The zero Filter matches, and so purges, every entry.
//
// Purge takes no lease: an entry that a running replay moves first is not
// counted, and one that Purge deletes first is skipped by the replay.
func (d *DLQ) Purge(ctx context.Context, f Filter, o PurgeOptions) (int, error) {
	if o.ProgressInterval <= 0 {
		o.ProgressInterval = DefaultProgressInterval
	}
	n := 0
	var batch []string
	last := time.Now()
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if o.DryRun {
			n += len(batch)
		} else {
			del, err := d.rdb.XDel(ctx, d.dead, batch...).Result()
			if err != nil {
				return fmt.Errorf("dlq: XDEL %s: %w", d.dead, err)
			}
			n += int(del)
		}
		batch = batch[:0]
		if o.Progress != nil && time.Since(last) >= o.ProgressInterval {
			last = time.Now()
			o.Progress(n)
		}
		return nil
	}
	err := d.scan(ctx, f, "-", "+", func(e Entry, matched bool) (bool, error) {
		if matched {
			batch = append(batch, e.ID)
			if len(batch) == d.cfg.PageSize {
				return true, flush()
			}
		}
		return true, nil
	})
	if err == nil {
		err = flush()
	}
	if o.Progress != nil {
		o.Progress(n)
	}
	return n, err
}
