package main

import (
	"context"
	"io"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
)

// Exit codes of the pelican command.
const (
	exitOK       = 0 // success
	exitError    = 1 // the command failed (Redis unreachable, wrong key type, ...)
	exitUsage    = 2 // bad flags, arguments or filter syntax
	exitRefused  = 3 // refused: confirmation declined, another replay active
	exitNotFound = 4 // unknown stream, group or entry
)

// app is what every subcommand shares: where to write, the output format,
// whether to skip confirmations, and how to reach Redis.
type app struct {
	out, errOut io.Writer
	in          io.Reader
	// output is "table" (default) or "json".
	output string
	// yes skips confirmation prompts of destructive commands.
	yes bool
	// connect returns a client for the --redis URL (single node, Cluster
	// or TLS), checked with PING; the caller closes it. It is set before
	// any subcommand runs, once the URL and the TLS flags are checked.
	connect func(ctx context.Context) (redis.UniversalClient, error)
}

// commands are the subcommand constructors; each file registers its own in
// an init function.
var commands []func(a *app) *cobra.Command
