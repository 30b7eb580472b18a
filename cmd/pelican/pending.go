package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/pelicanqueue/pelican/stream"
)

func init() { commands = append(commands, newPendingCmd) }

// pendingEntry is one row of pelican pending.
type pendingEntry struct {
	ID         string       `json:"id"`
	Consumer   string       `json:"consumer"`
	Idle       durationJSON `json:"idle_ms"`
	Deliveries int64        `json:"deliveries"`
	// Type is the job type, or "" when the entry is gone from the stream.
	Type    string `json:"type"`
	Deleted bool   `json:"deleted,omitempty"`
}

func newPendingCmd(a *app) *cobra.Command {
	var (
		group, consumer string
		minIdle         time.Duration
		minDeliveries   int64
		limit           int64
		start, end      string
	)
	cmd := &cobra.Command{
		Use:   "pending <stream> --group G",
		Short: "List pending (delivered, unacknowledged) jobs of a consumer group",
		Long: `pending lists the entries a consumer group has delivered but not acknowledged,
oldest first: ID, owning consumer, idle time, delivery count and job type.
Filters: --consumer, --min-idle, --min-deliveries, --start/--end (entry IDs),
--limit. An entry deleted from the stream while pending shows as "(deleted)".`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s := args[0]
			if limit <= 0 {
				return fail(exitUsage, "--limit must be positive, got %d", limit)
			}
			if minIdle < 0 {
				return fail(exitUsage, "--min-idle must not be negative, got %s", minIdle)
			}
			for _, id := range []string{start, end} {
				if !validRangeID(id) {
					return fail(exitUsage, "bad entry ID %q in --start/--end: want -, +, <ms> or <ms>-<seq>", id)
				}
			}
			ctx := cmd.Context()
			return withClient(ctx, a, func(rdb redis.UniversalClient) error {
				if err := checkStream(ctx, rdb, s); err != nil {
					return err
				}
				// XPENDING IDLE filters by idle time on the server; the
				// delivery count is filtered here, so read in pages until
				// limit rows pass.
				var rows []pendingEntry
				from := start
				for int64(len(rows)) < limit {
					page := max(limit-int64(len(rows)), 100)
					p, err := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{
						Stream: s, Group: group, Idle: minIdle, Start: from, End: end, Count: page, Consumer: consumer,
					}).Result()
					if err != nil {
						if strings.HasPrefix(err.Error(), "NOGROUP") {
							return fail(exitNotFound, "unknown group %q of stream %q", group, s)
						}
						return fail(exitError, "XPENDING %s %s: %w", s, group, err)
					}
					for _, e := range p {
						if e.RetryCount < minDeliveries || int64(len(rows)) >= limit {
							continue
						}
						rows = append(rows, pendingEntry{ID: e.ID, Consumer: e.Consumer, Idle: durationJSON(e.Idle), Deliveries: e.RetryCount})
					}
					if int64(len(p)) < page {
						break
					}
					from = "(" + p[len(p)-1].ID
				}
				if err := checkGroup(cmd, rdb, s, group, len(rows)); err != nil {
					return err
				}
				if len(rows) > 0 {
					pipe := rdb.Pipeline()
					cmds := make([]*redis.XMessageSliceCmd, len(rows))
					for i, r := range rows {
						cmds[i] = pipe.XRangeN(ctx, s, r.ID, r.ID, 1)
					}
					_, _ = pipe.Exec(ctx)
					for i, c := range cmds {
						msgs, err := c.Result()
						if err != nil {
							return fail(exitError, "XRANGE %s %s: %w", s, rows[i].ID, err)
						}
						if len(msgs) == 0 {
							rows[i].Deleted = true
							continue
						}
						rows[i].Type, _ = msgs[0].Values[stream.FieldType].(string)
					}
				}
				if a.output == "json" {
					if rows == nil {
						rows = []pendingEntry{}
					}
					return printJSON(a, rows)
				}
				if len(rows) == 0 {
					fmt.Fprintln(a.out, "no pending entries")
					return nil
				}
				t := newTable(a, "ID", "CONSUMER", "IDLE", "DELIVERIES", "TYPE")
				for _, r := range rows {
					typ := r.Type
					if r.Deleted {
						typ = "(deleted)"
					}
					t.Row(r.ID, r.Consumer, time.Duration(r.Idle), r.Deliveries, typ)
				}
				return t.Flush()
			})
		},
	}
	f := cmd.Flags()
	f.StringVarP(&group, "group", "g", "", "consumer group (required)")
	f.StringVarP(&consumer, "consumer", "c", "", "only entries owned by this consumer")
	f.DurationVar(&minIdle, "min-idle", 0, "only entries idle at least this long (e.g. 30s)")
	f.Int64Var(&minDeliveries, "min-deliveries", 0, "only entries delivered at least this many times")
	f.Int64VarP(&limit, "limit", "n", 100, "at most this many entries")
	f.StringVar(&start, "start", "-", "lowest entry ID")
	f.StringVar(&end, "end", "+", "highest entry ID")
	_ = cmd.MarkFlagRequired("group")
	return cmd
}

// checkGroup makes sure group exists when XPENDING returned nothing (a
// filtered XPENDING on a missing group still fails, but be explicit).
func checkGroup(cmd *cobra.Command, rdb redis.UniversalClient, s, group string, found int) error {
	if found > 0 {
		return nil
	}
	gs, err := rdb.XInfoGroups(cmd.Context(), s).Result()
	if err != nil {
		return fail(exitError, "XINFO GROUPS %s: %w", s, err)
	}
	for _, g := range gs {
		if g.Name == group {
			return nil
		}
	}
	return fail(exitNotFound, "unknown group %q of stream %q", group, s)
}

// validRangeID reports whether id is "-", "+", or an entry ID "<ms>" or
// "<ms>-<seq>" (optionally prefixed with "(" for an exclusive bound).
func validRangeID(id string) bool {
	if id == "-" || id == "+" {
		return true
	}
	id = strings.TrimPrefix(id, "(")
	ms, seq, hasSeq := strings.Cut(id, "-")
	return digits(ms) && (!hasSeq || digits(seq))
}

func digits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}
