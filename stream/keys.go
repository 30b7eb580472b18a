package stream

import (
	"fmt"
	"strings"
)

// Keys are the Redis keys of one queue. All of them hash to the stream's
// Redis Cluster slot, so a script may use any of them together.
type Keys struct {
	// Stream is the job stream itself.
	Stream string
	// Dead is the default dead-letter stream.
	Dead string
	// Delayed is the sorted set of jobs waiting for a later attempt.
	Delayed string
	// Crashes is the prefix of the crash counters of redelivered jobs (see
	// consumer.Config.MaxCrashes): Crashes + entry ID is a string key with a
	// time to live.
	Crashes string
}

// KeysFor returns the keys of the queue whose stream is named stream.
//
// A derived key is the stream name with a suffix when the name already has a
// hash tag ("{orders}:jobs" → "{orders}:jobs:dlq"), and otherwise the name
// wrapped in a hash tag ("orders" → "{orders}:dlq"): either way Redis Cluster
// hashes it like the stream. A name with braces that form no hash tag cannot
// share its slot with any derived key, and is rejected.
func KeysFor(stream string) (Keys, error) {
	prefix, err := tagPrefix(stream)
	if err != nil {
		return Keys{}, err
	}
	return Keys{Stream: stream, Dead: prefix + ":dlq", Delayed: prefix + ":delayed", Crashes: prefix + ":crashes:"}, nil
}

// DerivedKey returns stream's key with the given suffix, in the stream's
// cluster slot, as [KeysFor] builds its keys.
func DerivedKey(stream, suffix string) (string, error) {
	prefix, err := tagPrefix(stream)
	if err != nil {
		return "", err
	}
	return prefix + ":" + suffix, nil
}

func tagPrefix(stream string) (string, error) {
	if stream == "" {
		return "", fmt.Errorf("stream: empty stream name")
	}
	if s := strings.IndexByte(stream, '{'); s >= 0 {
		if e := strings.IndexByte(stream[s+1:], '}'); e > 0 {
			return stream, nil // has a hash tag: suffixes keep it
		}
	}
	if strings.ContainsAny(stream, "{}") {
		return "", fmt.Errorf("stream: name %q has braces that form no hash tag; use a name without braces or with a non-empty {tag}", stream)
	}
	return "{" + stream + "}", nil
}
