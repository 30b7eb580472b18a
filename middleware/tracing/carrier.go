package tracing

import (
	"github.com/pelicanqueue/pelican/stream"
)

// jobCarrier is a [propagation.TextMapCarrier] over a job's trace context
// fields: the W3C header names traceparent and tracestate map to
// Job.TraceParent and Job.TraceState, which are the entry's traceparent and
// tracestate fields on the wire. Other keys (baggage, vendor headers) are not
// carried: wire format v1 has no field for them.
type jobCarrier struct{ job *stream.Job }

// Get returns the value of a trace context field, or "".
func (c jobCarrier) Get(key string) string {
	switch key {
	case stream.FieldTraceParent:
		return c.job.TraceParent
	case stream.FieldTraceState:
		return c.job.TraceState
	}
	return ""
}

// Set sets a trace context field; other keys are ignored.
func (c jobCarrier) Set(key, value string) {
	switch key {
	case stream.FieldTraceParent:
		c.job.TraceParent = value
	case stream.FieldTraceState:
		c.job.TraceState = value
	}
}

// Keys returns the names of the trace context fields the job has.
func (c jobCarrier) Keys() []string {
	var keys []string
	if c.job.TraceParent != "" {
		keys = append(keys, stream.FieldTraceParent)
	}
	if c.job.TraceState != "" {
		keys = append(keys, stream.FieldTraceState)
	}
	return keys
}
