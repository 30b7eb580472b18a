package main

import (
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/pelicanqueue/pelican/periodic"
)

func init() { commands = append(commands, newSchedulesCmd) }

func newSchedulesCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "schedules <stream>",
		Short: "List the periodic schedules of a stream and their last tick",
		Long: `schedules lists the records package periodic keeps for the stream: for each
schedule name that has enqueued a tick, the last tick enqueued, its age by the
Redis clock and its job ID. Schedules removed from the code keep their record
until it is deleted (HDEL {<stream>}:periodic:last <name>).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s := args[0]
			ctx := cmd.Context()
			return withClient(ctx, a, func(rdb redis.UniversalClient) error {
				recs, err := periodic.Records(ctx, rdb, s)
				if err != nil {
					return fail(exitError, "%w", err)
				}
				now, err := rdb.Time(ctx).Result()
				if err != nil {
					return fail(exitError, "redis TIME: %w", err)
				}
				if a.output == "json" {
					out := make([]map[string]any, 0, len(recs))
					for _, r := range recs {
						m := map[string]any{"name": shown(r.Name), "last_tick": nil, "job_id": nil}
						if !r.LastTick.IsZero() {
							m["last_tick"], m["job_id"] = r.LastTick.Format(time.RFC3339Nano), r.JobID
						}
						out = append(out, m)
					}
					return printJSON(a, map[string]any{"stream": s, "schedules": out})
				}
				if len(recs) == 0 {
					fmt.Fprintf(a.out, "no schedule has enqueued a tick on %s\n", s)
					return nil
				}
				tb := newTable(a, "SCHEDULE", "LAST TICK (UTC)", "AGE", "JOB ID")
				for _, r := range recs {
					if r.LastTick.IsZero() {
						tb.Row(shown(r.Name), nil, nil, nil)
						continue
					}
					var age any = now.Sub(r.LastTick)
					if r.LastTick.After(now) {
						age = "ahead of the Redis clock" // written by something else
					}
					tb.Row(shown(r.Name), r.LastTick.Format("2006-01-02 15:04:05.000"), age, r.JobID)
				}
				return tb.Flush()
			})
		},
	}
}

// shown returns a record's name as printed: as it is when it is a valid
// schedule name, else quoted and cut (a field another client wrote).
func shown(name string) string {
	if (periodic.Schedule{Name: name, Type: "t", Every: time.Second}).Validate() == nil {
		return name
	}
	if len(name) > periodic.MaxNameLen {
		name = name[:periodic.MaxNameLen]
	}
	return strconv.Quote(name)
}
