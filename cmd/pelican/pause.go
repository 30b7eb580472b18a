package main

import (
	"errors"
	"fmt"
	"github.com/pelicanqueue/pelican/stream"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/pelicanqueue/pelican/control"
)

func init() { commands = append(commands, newPauseCmd, newResumeCmd) }

func newPauseCmd(a *app) *cobra.Command {
	var (
		typ   string
		dur   time.Duration
		until string
	)
	cmd := &cobra.Command{
		Use:   "pause <stream>",
		Short: "Pause a queue, or one job type of it, until resumed or for a while",
		Long: `pause stops every consumer of the queue from starting its jobs (with --type,
the jobs of that type only) within about a second. Running jobs finish; paused
jobs stay in the stream or pending, untouched, and start on resume. --for or
--until end the pause by themselves, by the Redis clock. Pausing what is
paused replaces the end. The stream need not exist yet.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts := control.PauseOptions{Type: typ}
			switch {
			case dur != 0 && until != "":
				return fail(exitUsage, "--for and --until exclude each other")
			case cmd.Flags().Changed("for") && dur <= 0:
				return fail(exitUsage, "--for must be positive, got %s", dur)
			case dur > 0:
				opts.Until = time.Now().Add(dur)
			case until != "":
				u, err := time.Parse(time.RFC3339, until)
				if err != nil {
					return fail(exitUsage, "--until: %v (want RFC 3339, e.g. 2026-12-01T18:00:00Z)", err)
				}
				opts.Until = u
			}
			if err := opts.Validate(); err != nil {
				return fail(exitUsage, "%w", err)
			}
			s := args[0]
			if err := checkQueueName(s); err != nil {
				return err
			}
			ctx := cmd.Context()
			return withClient(ctx, a, func(rdb redis.UniversalClient) error {
				if err := control.Pause(ctx, rdb, s, opts); err != nil {
					if errors.Is(err, control.ErrNotFuture) {
						return fail(exitUsage, "--for or --until: the pause would end before Redis's clock (%v)", err)
					}
					return fail(exitError, "%w", err)
				}
				st, err := control.State(ctx, rdb, s)
				if err != nil {
					return fail(exitError, "%w", err)
				}
				if a.output == "json" {
					return printJSON(a, pausedView(s, st))
				}
				what := "queue " + s
				if typ != "" {
					what = fmt.Sprintf("jobs of type %q in %s", typ, s)
				}
				if opts.Until.IsZero() {
					fmt.Fprintf(a.out, "paused %s until resumed\n", what)
				} else {
					fmt.Fprintf(a.out, "paused %s until %s\n", what, opts.Until.UTC().Format(time.RFC3339))
				}
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&typ, "type", "", "pause only the jobs of this type")
	f.DurationVar(&dur, "for", 0, "end the pause after this long, e.g. 10m")
	f.StringVar(&until, "until", "", "end the pause at this time (RFC 3339)")
	return cmd
}

func newResumeCmd(a *app) *cobra.Command {
	var (
		typ string
		all bool
	)
	cmd := &cobra.Command{
		Use:   "resume <stream>",
		Short: "Lift a pause of a queue (or of one job type, or every pause)",
		Long: `resume lifts the pause of the queue (with --type, of that job type; with
--all, every pause of the queue). The consumers start the held jobs within
about a second. It exits with 4 when there was no pause to lift.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts := control.ResumeOptions{Type: typ, All: all}
			if err := opts.Validate(); err != nil {
				return fail(exitUsage, "%w", err)
			}
			s := args[0]
			if err := checkQueueName(s); err != nil {
				return err
			}
			ctx := cmd.Context()
			return withClient(ctx, a, func(rdb redis.UniversalClient) error {
				err := control.Resume(ctx, rdb, s, opts)
				switch {
				case errors.Is(err, control.ErrNotPaused):
					return fail(exitNotFound, "%s: nothing to resume: not paused", s)
				case err != nil:
					return fail(exitError, "%w", err)
				}
				if a.output == "json" {
					st, err := control.State(ctx, rdb, s)
					if err != nil {
						return fail(exitError, "%w", err)
					}
					return printJSON(a, pausedView(s, st))
				}
				fmt.Fprintf(a.out, "resumed %s\n", s)
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&typ, "type", "", "lift the pause of this job type")
	f.BoolVar(&all, "all", false, "lift every pause of the queue")
	return cmd
}

// pauseView is one pause as the CLI prints it.
type pauseView struct {
	// Type is the paused job type; "" for the whole queue.
	Type  string     `json:"type"`
	Until *time.Time `json:"until"` // nil: until resumed
}

// pausedView lists the pauses of st, the queue's first.
func pausedView(s string, st control.Paused) map[string]any {
	return map[string]any{"stream": s, "paused": pauseList(st)}
}

func pauseList(st control.Paused) []pauseView {
	out := []pauseView{}
	opt := func(t time.Time) *time.Time {
		if t.IsZero() {
			return nil
		}
		t = t.UTC()
		return &t
	}
	if st.Queue {
		out = append(out, pauseView{Until: opt(st.QueueUntil)})
	}
	for _, t := range st.TypeNames() {
		out = append(out, pauseView{Type: t, Until: opt(st.Types[t])})
	}
	return out
}

// checkQueueName refuses, as a usage error, a stream name no queue can
// have (empty, or braces that form no hash tag).
func checkQueueName(s string) error {
	if _, err := stream.KeysFor(s); err != nil {
		return fail(exitUsage, "%v", err)
	}
	return nil
}
