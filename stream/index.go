package stream

import (
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"
)

// The index of tracked jobs: a job with [Job].Track has a record at
// [JobKey], a string that the scripts changing the job's state rewrite in
// the same script (one SET each): enqueue.lua and promote.lua write
// "waiting" with the entry ID, schedule.lua "scheduled" with the due time,
// the consumer's retry.lua "retrying" (or "waiting" for a retry without
// delay), dead.lua "dead" and ack.lua "done", the last two with a time to
// live. That a job is running is not written: it is its entry's pending
// state, which control.Lookup reads. control.Cancel of a running job
// writes "cancelling" with the entry ID and the time of the request; the
// consumer running it then writes "cancelled" (or "done" when its handler
// completed anyway) with its acknowledgement. The record is the values of [Record]
// in order (State, Entry, Due, At, Error, Result), each written as
// "<byte length>:<bytes>".

// Index states of a [Record].
const (
	StateWaiting   = "waiting"
	StateScheduled = "scheduled"
	StateRetrying  = "retrying"
	StateDead      = "dead"
	StateDone      = "done"
	StateCancelled = "cancelled"
	// StateCancelling: control.Cancel asked the consumer that holds the
	// job's entry (Record.Entry) to cancel it, at Record.At.
	StateCancelling = "cancelling"
)

// MaxTrackedIDBytes is the longest ID of a tracked job ([Job].Track): a
// producer refuses a longer one, so that every tracked job can be looked
// up and cancelled (package control takes IDs up to this length).
const MaxTrackedIDBytes = 1024

// DefaultTrackTTL is how long the index record of a finished job lives by
// default (consumer.Config.TrackTTL; control.Cancel's cancelled records).
const DefaultTrackTTL = 24 * time.Hour

// maxKeyID is the longest job ID used in a key as it is; a longer one is
// hashed (as the crash counters do).
const maxKeyID = 128

// JobKey returns the index record key of job ID id in the queue of keys:
// keys.Job + id, or keys.Job + "sha1:" + the hex SHA-1 of id when id is
// over 128 bytes. enqueue.lua, promote.lua and dlq/move.lua check a
// declared key against the same name (SHA-1 because Redis
// scripts have it: redis.sha1hex); it names a key, it protects nothing.
func JobKey(keys Keys, id string) string {
	if len(id) > maxKeyID {
		sum := sha1.Sum([]byte(id))
		return keys.Job + "sha1:" + hex.EncodeToString(sum[:])
	}
	return keys.Job + id
}

// Record is a decoded index record.
type Record struct {
	// State is one of the State constants.
	State string
	// Entry is the stream entry ID of a waiting or cancelling job.
	Entry string
	// Due is when a scheduled or retrying job is due.
	Due time.Time
	// At is when the job was finished (done, dead, cancelled), or when its
	// cancel was requested (cancelling).
	At time.Time
	// Error is the last error of a retrying job, or the reason of a dead
	// one ("reason: error").
	Error string
	// Result is what the handler recorded for a done job, if anything.
	Result []byte
}

// ParseRecord decodes an index record's value.
func ParseRecord(v string) (Record, error) {
	var f []string
	for v != "" {
		n, tail, ok := strings.Cut(v, ":")
		l, err := strconv.Atoi(n)
		if !ok || err != nil || l < 0 || l > len(tail) {
			return Record{}, errors.New("stream: index record does not parse")
		}
		f = append(f, tail[:l])
		v = tail[l:]
	}
	if len(f) != 6 {
		return Record{}, errors.New("stream: index record does not have 6 values")
	}
	switch f[0] {
	case StateWaiting, StateScheduled, StateRetrying, StateDead, StateDone, StateCancelled, StateCancelling:
	default:
		return Record{}, errors.New("stream: index record holds a state Pelican does not write")
	}
	r := Record{State: f[0], Entry: f[1], Error: f[4]}
	ms := func(s string) time.Time {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			return time.Time{}
		}
		return time.UnixMilli(n)
	}
	r.Due, r.At = ms(f[2]), ms(f[3])
	if f[5] != "" {
		r.Result = []byte(f[5])
	}
	return r, nil
}
