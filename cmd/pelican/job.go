package main

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/pelicanqueue/pelican/control"
	"github.com/pelicanqueue/pelican/stream"
)

func init() { commands = append(commands, newJobCmd, newCancelCmd) }

// jobView is the JSON of pelican job.
type jobView struct {
	ID         string     `json:"id"`
	State      string     `json:"state"`
	EntryID    string     `json:"entry_id,omitempty"`
	Due        *time.Time `json:"due,omitempty"`
	At         *time.Time `json:"at,omitempty"`
	Error      string     `json:"error,omitempty"`
	Result     []byte     `json:"result,omitempty"`
	Group      string     `json:"group,omitempty"`
	Consumer   string     `json:"consumer,omitempty"`
	IdleMS     int64      `json:"idle_ms,omitempty"`
	Deliveries int64      `json:"deliveries,omitempty"`
}

func newJobCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "job <stream> <job_id>",
		Short: "Say where a tracked job is now",
		Long: `job prints the state of a tracked job (enqueued with ProducerConfig.Track):
scheduled (due time), waiting in the stream, running (consumer, idle time,
deliveries), retrying (next attempt, last error), dead (reason), done (when,
and the result its handler recorded), cancelled, or unknown. It reads the
job's index record and its entry's pending state, never the whole stream.
It exits with 4 when the job is unknown.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, id := args[0], args[1]
			if _, err := stream.KeysFor(s); err != nil {
				return fail(exitUsage, "%w", err)
			}
			if id == "" || len(id) > control.MaxJobIDBytes {
				return fail(exitUsage, "job ID must be 1 to %d bytes", control.MaxJobIDBytes)
			}
			ctx := cmd.Context()
			return withClient(ctx, a, func(rdb redis.UniversalClient) error {
				info, err := control.Lookup(ctx, rdb, s, id)
				if err != nil {
					return fail(exitError, "%w", err)
				}
				v := jobView{ID: info.ID, State: info.State, EntryID: info.EntryID, Error: info.Error, Result: info.Result,
					Group: info.Group, Consumer: info.Consumer, IdleMS: info.Idle.Milliseconds(), Deliveries: info.Deliveries}
				if !info.Due.IsZero() {
					v.Due = &info.Due
				}
				if !info.At.IsZero() {
					v.At = &info.At
				}
				if a.output == "json" {
					if err := printJSON(a, v); err != nil {
						return err
					}
				} else {
					printJob(a, v)
				}
				if info.State == control.StateUnknown {
					return fail(exitNotFound, "%s: job %s is unknown (not tracked, never enqueued, finished too long ago, or its entry was trimmed)", s, strconv.Quote(clipText(id, 64)))
				}
				return nil
			})
		},
	}
}

func printJob(a *app, v jobView) {
	line := func(k, val string) { fmt.Fprintf(a.out, "%-11s %s\n", k, val) }
	line("job", strconv.Quote(clipText(v.ID, 200)))
	line("state", v.State)
	if v.EntryID != "" {
		line("entry", v.EntryID)
	}
	if v.Due != nil {
		line("due", v.Due.UTC().Format(time.RFC3339Nano))
	}
	if v.At != nil {
		line("finished", v.At.UTC().Format(time.RFC3339Nano))
	}
	if v.Consumer != "" {
		line("consumer", strconv.Quote(clipText(v.Group, 200))+" / "+strconv.Quote(clipText(v.Consumer, 200)))
		line("idle", (time.Duration(v.IdleMS) * time.Millisecond).String())
		line("deliveries", strconv.FormatInt(v.Deliveries, 10))
	}
	if v.Error != "" {
		line("error", strconv.Quote(clipText(v.Error, 500)))
	}
	if v.Result != nil {
		line("result", strconv.Quote(clipText(string(v.Result), 500)))
	}
}

// clipText cuts s to at most n bytes, saying so.
func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + fmt.Sprintf("… (%d bytes)", len(s))
}

func newCancelCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "cancel <stream> <job_id>",
		Short: "Cancel a tracked job, or ask the consumer running it to cancel it",
		Long: `cancel removes a tracked job (enqueued with ProducerConfig.Track) that is
scheduled or retrying from the delayed set, or one waiting in the stream from
the stream, in one script; pelican job then says cancelled. For a running job
it records the request and tells the consumer running it, which cancels the
handler's context (cause consumer.ErrCancelled) within about a second; it
prints "cancelling" and exits 0, and pelican job says cancelling, then
cancelled (or done if the handler completed anyway). A finished job exits 1,
and an unknown one exits 4; neither is changed.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, id := args[0], args[1]
			if _, err := stream.KeysFor(s); err != nil {
				return fail(exitUsage, "%w", err)
			}
			if id == "" || len(id) > control.MaxJobIDBytes {
				return fail(exitUsage, "job ID must be 1 to %d bytes", control.MaxJobIDBytes)
			}
			ctx := cmd.Context()
			return withClient(ctx, a, func(rdb redis.UniversalClient) error {
				was, err := control.Cancel(ctx, rdb, s, id)
				switch {
				case errors.Is(err, control.ErrUnknownJob):
					return fail(exitNotFound, "%s: %w", s, err)
				case err != nil:
					return fail(exitError, "%s: %w", s, err)
				}
				if was == stream.StateCancelling {
					if a.output == "json" {
						return printJSON(a, map[string]string{"id": id, "state": stream.StateCancelling, "was": control.StateRunning})
					}
					fmt.Fprintf(a.out, "cancelling job %s: it is running; the consumer running it was told to cancel it (pelican job says when it has)\n", strconv.Quote(clipText(id, 200)))
					return nil
				}
				if a.output == "json" {
					return printJSON(a, map[string]string{"id": id, "state": stream.StateCancelled, "was": was})
				}
				fmt.Fprintf(a.out, "cancelled job %s (it was %s)\n", strconv.Quote(clipText(id, 200)), was)
				return nil
			})
		},
	}
}
