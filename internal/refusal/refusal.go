// Package refusal tells a write that Redis refused before running it (the
// write did not happen) from one whose outcome is unknown (a network error
// or a timeout: the command may have run). It is the one place that decides
// it; callers name the refusals their command or script can give.
package refusal

import (
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Before are the error replies Redis gives before a command runs, or a
// script (EVAL without flags) reaches its first write: the server's state
// refuses the command (BUSY, LOADING, MASTERDOWN, READONLY, MISCONF,
// NOREPLICAS, OOM), the cluster redirects or refuses it (MOVED, ASK,
// TRYAGAIN, CROSSSLOT, CLUSTERDOWN), the script is not cached (NOSCRIPT), or
// the user may not send it (NOPERM). Redis checks OOM, READONLY, MISCONF and
// NOREPLICAS in a script only until its first write, and none of these
// states changes while a script runs, so a script that wrote goes on. A
// script gives NOPERM before writing only if it checks its commands first
// (redis.acl_check_cmd, as Pelican's scripts do), and the other replies
// of a script depend on it: see its caller.
var Before = []string{"BUSY ", "LOADING ", "MASTERDOWN ", "READONLY ", "MISCONF ", "NOREPLICAS ", "OOM ",
	"MOVED ", "ASK ", "TRYAGAIN ", "CROSSSLOT ", "CLUSTERDOWN ", "NOSCRIPT ", "NOPERM "}

// Command reports whether err is an error reply to one command that writes
// at most once (XADD, SET, ...): Redis refused it and it wrote nothing.
func Command(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !errors.Is(err, redis.Nil)
}

// Script reports whether err is an error reply that begins with one of
// prefixes ("OOM ", "ERR enqueue.lua:"): replies that the caller knows its
// script gives only before its first write.
func Script(err error, prefixes ...string) bool {
	var re redis.Error
	if !errors.As(err, &re) || errors.Is(err, redis.Nil) {
		return false
	}
	for _, p := range prefixes {
		if strings.HasPrefix(re.Error(), p) {
			return true
		}
	}
	return false
}
