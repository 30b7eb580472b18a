package stream_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/stream"
)

type emailArgs struct {
	To      string `msgpack:"to" json:"to"`
	Subject string `msgpack:"subject" json:"subject"`
}

func ExampleNewJob() {
	job, err := stream.NewJob("email.send", emailArgs{To: "a@example.com", Subject: "Hi"})
	if err != nil {
		panic(err)
	}
	fmt.Println(job.Type, job.ContentType, len(job.Payload), "bytes")
	// Output: email.send application/msgpack 29 bytes
}

func ExampleJob_Decode() {
	job, err := stream.NewJob("email.send", emailArgs{To: "a@example.com", Subject: "Hi"})
	if err != nil {
		panic(err)
	}

	// The payload goes through the stream entry and back, as msgpack.
	entry := map[string]any{}
	f := stream.Encode(job)
	for i := 0; i < len(f); i += 2 {
		v := f[i+1]
		if b, ok := v.([]byte); ok {
			v = string(b)
		}
		entry[f[i].(string)] = v
	}
	got, err := stream.Decode("1700000000000-0", entry)
	if err != nil {
		panic(err)
	}

	var args emailArgs
	if err := got.Decode(&args); err != nil {
		panic(err)
	}
	fmt.Printf("%s %+v\n", got.ContentType, args)

	// A payload that does not decode is a permanent failure.
	bad := &stream.Job{ID: "j1", Type: "email.send", Payload: []byte("{not json")}
	err = bad.Decode(&args)
	fmt.Println(errors.Is(err, stream.ErrPayload))
	// Output:
	// application/msgpack {To:a@example.com Subject:Hi}
	// true
}

func ExampleProducer_Enqueue() {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer mr.Close()
	mr.SetTime(time.UnixMilli(1700000000000)) // the entry ID's time
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: "{emails}:jobs"})
	job, err := stream.NewJSONJob("email.send", emailArgs{To: "a@example.com"})
	if err != nil {
		panic(err)
	}
	job.IdempotencyKey = "welcome:a@example.com"
	entryID, err := p.Enqueue(ctx, job)
	if err != nil {
		panic(err) // the job may be in the stream all the same: see Producer
	}
	fmt.Println("entry", entryID)
	fmt.Println("job ID is a UUID version", int(uuid.MustParse(job.ID).Version()))

	// What a consumer reads back.
	entries, err := rdb.XRange(ctx, "{emails}:jobs", "-", "+").Result()
	if err != nil {
		panic(err)
	}
	got, err := stream.Decode(entries[0].ID, entries[0].Values)
	if err != nil {
		panic(err)
	}
	fmt.Println(got.Type, got.IdempotencyKey, string(got.Payload), got.ID == job.ID)
	// Output:
	// entry 1700000000000-0
	// job ID is a UUID version 7
	// email.send welcome:a@example.com {"to":"a@example.com","subject":""} true
}

func ExampleKeysFor() {
	for _, name := range []string{"orders", "{shop}:orders", "a}b"} {
		keys, err := stream.KeysFor(name)
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Println(keys.Stream, keys.Dead, keys.Delayed)
		fmt.Println(" ", keys.Idem, keys.Lock, keys.Rate, keys.Limit)
	}
	replay, _ := stream.DerivedKey("{orders}:dlq", "replay")
	fmt.Println(replay)
	// Output:
	// orders {orders}:dlq {orders}:delayed
	//   {orders}:idem: {orders}:lock: {orders}:rate: {orders}:limit:
	// {shop}:orders {shop}:orders:dlq {shop}:orders:delayed
	//   {shop}:orders:idem: {shop}:orders:lock: {shop}:orders:rate: {shop}:orders:limit:
	// stream: name "a}b" has braces that form no hash tag; use a name without braces or with a non-empty {tag}
	// {orders}:dlq:replay
}

func ExampleDecode() {
	// An entry written by another program with a bad attempt count.
	_, err := stream.Decode("1700000000000-0", map[string]any{
		"type":    "email.send",
		"attempt": "first",
	})
	fmt.Println(err)

	var de *stream.DecodeError
	if errors.As(err, &de) {
		fmt.Println("dead-letter field:", de.Field)
	}
	// Output:
	// stream: entry 1700000000000-0: field "attempt": not a non-negative decimal integer (got "first")
	// dead-letter field: attempt
}

// Field reads one value of an entry's fields as Redis sends them; of a
// name given twice, the last value counts, as in decoding.
func ExampleField() {
	fields := []string{"type", "email", "payload", "{}", "type", "sms"}
	fmt.Println(stream.Field(fields, "type"), stream.Field(fields, "payload"), stream.Field(fields, "job_id") == "")
	// Output: sms {} true
}
