// Package control operates a queue's consumers while they run: Pause and
// Resume a queue, or one job type of it, optionally until a time, and
// State to read what is paused; Lookup and Cancel find and cancel one job.
//
// A pause is a field of the queue's hash stream.KeysFor(stream).Paused,
// written by one script that also PUBLISHes on the queue's channel
// (Keys.Control). Every consumer subscribes to that channel once and re-reads
// the hash when told, when it (re)subscribes and every few seconds as a
// safety net, so a pause takes effect on every consumer within about a
// second (within the safety net's period for a consumer that cannot
// subscribe), and no consumer polls per job. A pause's end is a time of the
// Redis clock: a timed pause ends by itself, without any message.
//
// What a paused consumer does is documented by the consumer package
// (Consumer pauses, in its doc): running jobs finish; paused jobs are not
// started, stay pending or in the stream untouched (no attempt counted, no
// reschedule, no delivery count growth), and start at once on resume.
//
// Lookup says where a tracked job (stream.Job.Track) is now, from its
// index record (stream.JobKey, rewritten by the scripts that change the
// job's state) and the pending state of its entry; Cancel cancels a tracked
// job that is scheduled, retrying or waiting, in one script (cancel.lua), and
// for a running one records the request and publishes "cancel <entry ID>" on
// the same channel, for the consumer that holds it (consumer.ErrCancelled).
//
// Control depends on package stream and go-redis only; package consumer
// imports it to read the state.
package control
