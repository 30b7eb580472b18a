package main

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/pelicanqueue/pelican/stream"
)

func init() { commands = append(commands, newEnqueueCmd) }

func newEnqueueCmd(a *app) *cobra.Command {
	var (
		typ, payload, idemKey string
		in                    time.Duration
	)
	cmd := &cobra.Command{
		Use:   "enqueue <stream> --type T --payload JSON",
		Short: "Add a job to a stream (now, or later with --in)",
		Long: `enqueue adds one job with a JSON payload to a stream and prints its entry ID,
or schedules it with --in (measured by the Redis clock) and prints its job ID.
--payload - reads the payload from standard input. The payload must be valid
JSON (exit 2 otherwise, and nothing is added).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s := args[0]
			if _, err := stream.KeysFor(s); err != nil {
				return fail(exitUsage, "stream %q: %v", s, err)
			}
			if typ == "" {
				return fail(exitUsage, "--type must not be empty")
			}
			if in < 0 {
				return fail(exitUsage, "--in must not be negative, got %s", in)
			}
			body := []byte(payload)
			if payload == "-" {
				b, err := io.ReadAll(a.in)
				if err != nil {
					return fail(exitError, "read payload from stdin: %w", err)
				}
				body = b
			}
			if !json.Valid(body) {
				return fail(exitUsage, "--payload is not valid JSON: %s", truncate(string(body), 80))
			}
			job := &stream.Job{Type: typ, Payload: body, ContentType: stream.ContentTypeJSON, IdempotencyKey: idemKey}
			ctx := cmd.Context()
			return withClient(ctx, a, func(rdb redis.UniversalClient) error {
				t, err := rdb.Type(ctx, s).Result()
				if err != nil {
					return fail(exitError, "type of %s: %w", s, err)
				}
				if t != "stream" && t != "none" {
					return fail(exitError, "wrong key type: %q is a %s, not a stream", s, t)
				}
				p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: s})
				if in > 0 {
					if err := p.EnqueueIn(ctx, job, in); err != nil {
						return fail(exitError, "%w", err)
					}
					if a.output == "json" {
						return printJSON(a, map[string]any{"job_id": job.ID, "scheduled_in_ms": in.Milliseconds()})
					}
					fmt.Fprintf(a.out, "scheduled %s in %s\n", job.ID, in)
					return nil
				}
				id, err := p.Enqueue(ctx, job)
				if err != nil {
					return fail(exitError, "%w", err)
				}
				if a.output == "json" {
					return printJSON(a, map[string]any{"entry_id": id, "job_id": job.ID})
				}
				fmt.Fprintln(a.out, id)
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.StringVarP(&typ, "type", "t", "", "job type (required)")
	f.StringVarP(&payload, "payload", "p", "", "JSON payload, or - for standard input (required)")
	f.StringVar(&idemKey, "idempotency-key", "", "idempotency key of the job")
	f.DurationVar(&in, "in", 0, "schedule the job after this delay instead of now (e.g. 5m)")
	_ = cmd.MarkFlagRequired("type")
	_ = cmd.MarkFlagRequired("payload")
	return cmd
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
