package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/pelicanqueue/pelican/stream"
)

func init() { commands = append(commands, newTrimCmd) }

func newTrimCmd(a *app) *cobra.Command {
	var (
		keep   time.Duration
		dryRun bool
	)
	cmd := &cobra.Command{
		Use:   "trim <stream>",
		Short: "Remove entries every group has read and acknowledged (safe trim)",
		Long: `trim removes the stream entries that every consumer group has read and none
holds pending, keeping those younger than --keep. It never removes an unread
or pending entry, and leaves a stream without consumer groups alone.
--dry-run prints how many entries would be removed, removing nothing.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s := args[0]
			if keep < 0 {
				return fail(exitUsage, "--keep must not be negative, got %s", keep)
			}
			ctx := cmd.Context()
			return withClient(ctx, a, func(rdb redis.UniversalClient) error {
				if err := checkStream(ctx, rdb, s); err != nil {
					return err
				}
				var n int64
				var err error
				if dryRun {
					n, err = trimCount(ctx, rdb, s, keep)
				} else {
					n, err = stream.TrimAcked(ctx, rdb, s, keep)
					if err != nil {
						err = fail(exitError, "%w", err)
					}
				}
				if err != nil {
					return err
				}
				if a.output == "json" {
					key := "removed"
					if dryRun {
						key = "would_remove"
					}
					return printJSON(a, map[string]any{"stream": s, key: n, "dry_run": dryRun})
				}
				if dryRun {
					fmt.Fprintf(a.out, "would remove %d entries from %s (dry run)\n", n, s)
				} else {
					fmt.Fprintf(a.out, "removed %d entries from %s\n", n, s)
				}
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.DurationVar(&keep, "keep", 0, "keep entries younger than this (by the Redis clock), e.g. 1h")
	f.BoolVar(&dryRun, "dry-run", false, "print how many entries would be removed; remove nothing")
	return cmd
}

// trimCount computes the horizon stream.TrimAcked would use (see
// stream/trim.lua) and counts the entries below it, without removing any.
// It reads the state in several commands, so it is an estimate of a trim
// run at the same moment.
func trimCount(ctx context.Context, rdb redis.UniversalClient, s string, keep time.Duration) (int64, error) {
	groups, err := rdb.XInfoGroups(ctx, s).Result()
	if err != nil {
		return 0, fail(exitError, "XINFO GROUPS %s: %w", s, err)
	}
	if len(groups) == 0 {
		return 0, nil
	}
	var horizon string
	for _, g := range groups {
		h := g.LastDeliveredID
		p, err := rdb.XPending(ctx, s, g.Name).Result()
		if err != nil {
			return 0, fail(exitError, "XPENDING %s %s: %w", s, g.Name, err)
		}
		if p.Count > 0 && stream.CompareIDs(p.Lower, h) < 0 {
			h = p.Lower
		}
		if horizon == "" || stream.CompareIDs(h, horizon) < 0 {
			horizon = h
		}
	}
	if keep > 0 {
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			return 0, fail(exitError, "redis TIME: %w", err)
		}
		cutoff := now.UnixMilli() - keep.Milliseconds()
		if cutoff <= 0 {
			return 0, nil
		}
		if c := strconv.FormatInt(cutoff, 10) + "-0"; stream.CompareIDs(c, horizon) < 0 {
			horizon = c
		}
	}
	if horizon == "0-0" {
		return 0, nil
	}
	// XTRIM MINID horizon removes the entries with IDs below horizon.
	var n int64
	start := "-"
	const page = 1000
	for {
		msgs, err := rdb.XRangeN(ctx, s, start, "("+horizon, page).Result()
		if err != nil {
			return 0, fail(exitError, "XRANGE %s: %w", s, err)
		}
		n += int64(len(msgs))
		if len(msgs) < page {
			return n, nil
		}
		start = "(" + msgs[len(msgs)-1].ID
	}
}
