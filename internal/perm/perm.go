// Package perm asks Redis, before a component starts writing, whether the
// client's user may send every command the component will send. Redis
// scripts are not transactions: a script whose later command is denied by
// an ACL fails after its first writes and keeps them (a job removed from the
// delayed set and never added to the stream, or added twice), so such a
// denial must be found before the first script runs, not by it.
//
// The check is one script that calls redis.acl_check_cmd (Redis 7) for each
// command, with arguments of the shape the component sends, keys included,
// so that key patterns are checked too. It reads and writes nothing. A
// server without redis.acl_check_cmd (Redis 6, miniredis) cannot tell; the
// caller then goes on unchecked.
//
// perm is internal: consumer and dlq use it. It imports nothing from
// Pelican.
package perm

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed check.lua
	checkLua    string
	checkScript = redis.NewScript(checkLua)
)

// Need is one command that a component sends.
type Need struct {
	// Args are the command, its subcommand if any, and arguments of the
	// shape the component sends, with its real keys: ACL key patterns are
	// checked against them. Values need not be valid (nothing runs).
	Args []string
	// Key is the key the command is about, named in messages ("" for none).
	Key string
	// Use says what the component needs the command for, for messages.
	Use string
	// Optional marks a command the component works without, with a
	// documented loss: the caller warns instead of failing.
	Optional bool
	// Unknown is set by Check when the server does not know the command.
	Unknown bool
}

// Name returns the command's name as ACL rules write it, upper case:
// "XAUTOCLAIM", or "XGROUP|CREATE" for a subcommand.
func (n Need) Name() string {
	if len(n.Args) == 0 {
		return ""
	}
	name := strings.ToUpper(n.Args[0])
	switch name {
	case "XGROUP", "XINFO", "CLIENT", "CONFIG", "SCRIPT", "CLUSTER":
		if len(n.Args) > 1 {
			name += "|" + strings.ToUpper(n.Args[1])
		}
	}
	return name
}

// String describes the need for a message:
// `XAUTOCLAIM on "orders" (the visibility-timeout sweep)`.
func (n Need) String() string {
	s := n.Name()
	if n.Key != "" {
		s += " on " + strconv.Quote(n.Key)
	}
	if n.Use != "" {
		s += " (" + n.Use + ")"
	}
	if n.Unknown {
		s += " [unknown to this server]"
	}
	return s
}

// Describe joins needs for a message.
func Describe(needs []Need) string {
	parts := make([]string, len(needs))
	for i, n := range needs {
		parts[i] = n.String()
	}
	return strings.Join(parts, "; ")
}

// Check returns the needs the client's user may not send: denied by the
// ACL (the command, or one of its keys), or unknown to the server (marked
// Unknown). It runs one script on the node of key, which must be a key the
// component uses. checked is false when the server cannot tell (no
// redis.acl_check_cmd: Redis older than 7, miniredis); denied is then nil.
// An error is the script's own failure; a NOPERM error means the user may
// not run scripts (EVALSHA, EVAL) with key.
func Check(ctx context.Context, rdb redis.Scripter, key string, needs []Need) (denied []Need, checked bool, err error) {
	args := make([]any, 0, 8*len(needs))
	for _, n := range needs {
		args = append(args, len(n.Args))
		for _, a := range n.Args {
			args = append(args, a)
		}
	}
	res, err := checkScript.Run(ctx, rdb, []string{key}, args...).Result()
	if err != nil {
		return nil, false, err
	}
	if v, ok := res.(int64); ok && v == -1 {
		return nil, false, nil
	}
	list, ok := res.([]any)
	if !ok {
		return nil, false, fmt.Errorf("perm: unexpected reply %v", res)
	}
	for _, v := range list {
		i, ok := v.(int64)
		if !ok || i == 0 || abs(i) > int64(len(needs)) {
			return nil, false, fmt.Errorf("perm: unexpected reply %v", res)
		}
		n := needs[abs(i)-1]
		n.Unknown = i < 0
		denied = append(denied, n)
	}
	return denied, true, nil
}

func abs(i int64) int64 {
	if i < 0 {
		return -i
	}
	return i
}
