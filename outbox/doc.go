// Package outbox enqueues jobs in the caller's PostgreSQL transaction and
// relays them to their Redis streams: a job is in the stream if and only if
// the transaction that wrote it committed, and once.
//
//	app transaction ──Writer.Enqueue──▶ outbox table ──Relay──▶ stream (enqueue once) ──▶ consumer
//
// [Writer.Enqueue] inserts the job as a row of the outbox table within the
// transaction it is given, and notifies the relays (NOTIFY, delivered at
// commit). A rolled-back transaction leaves nothing; a committed one leaves
// a row that survives any crash of the application.
//
// [Relay] moves committed rows to their streams in batches: it locks a batch
// with SELECT … FOR UPDATE SKIP LOCKED, so that several relays (one per
// service instance) never relay a row at the same time, adds the batch with
// the stream package's enqueue-once script keyed by the row's job ID
// (stream.ProducerConfig.OnceNamespace "relayed": marker {stream}:relayed:<job id>, which no idempotency key reaches),
// then deletes the rows and commits. A relay that dies anywhere in between
// leaves its rows locked only until PostgreSQL sees its connection close;
// the next relay adds them again, and the marker makes that add nothing. A
// job is added twice only if its rows outlive the marker's window
// ([RelayConfig].Window) after their first add.
//
// Relays wake on NOTIFY when [RelayConfig].ListenDSN is set (a pgx
// connection of their own) and poll every [RelayConfig].PollInterval in
// any case, so a lost notification, or a relay started after a commit,
// delays a job by at most the interval.
//
// Retention: relayed rows are deleted in the transaction that relays them,
// so the table holds only jobs not yet relayed, and rows that cannot be
// relayed (they do not decode: not written by a Writer), which are marked
// with their error and left for an operator.
//
// The table is created by [CreateSchema] (an explicit call, or run its SQL
// from [SchemaSQL] in a migration). This package uses database/sql for
// every query (any PostgreSQL driver) and pgx only for LISTEN. The handler
// side of "exactly one effect" is idem's SQL store: idem.SQLStore.CompleteTx
// records the job's completion in the transaction of its effect.
package outbox
