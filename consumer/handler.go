package consumer

import (
	"context"
	"fmt"
	"sync"

	"github.com/pelicanqueue/pelican/stream"
)

// Handler processes one job. Its ctx is cancelled when the job's lease is
// lost (cause [ErrLeaseLost]), when the consumer shuts down past its drain
// deadline (cause [ErrShutdown]), or when [Config.MaxRuntime] passes.
type Handler interface {
	Process(ctx context.Context, job *stream.Job) error
}

// HandlerFunc adapts a function to [Handler].
type HandlerFunc func(ctx context.Context, job *stream.Job) error

// Process calls f(ctx, job).
func (f HandlerFunc) Process(ctx context.Context, job *stream.Job) error { return f(ctx, job) }

// Middleware wraps a Handler. The middleware passed first to [Consumer.Use]
// is the outermost.
type Middleware func(Handler) Handler

// Chain returns h wrapped by mws, mws[0] outermost.
func Chain(h Handler, mws ...Middleware) Handler {
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	return h
}

// Mux routes jobs to handlers by job type. A job of a type with no handler
// is dead-lettered with reason [ReasonUnknownType]. It is safe for
// concurrent use.
type Mux struct {
	mu sync.RWMutex
	m  map[string]Handler
}

// NewMux returns an empty Mux.
func NewMux() *Mux { return &Mux{m: make(map[string]Handler)} }

// Handle registers h for jobs of type typ. It panics if typ is empty or
// already registered.
func (m *Mux) Handle(typ string, h Handler) *Mux {
	m.mu.Lock()
	defer m.mu.Unlock()
	if typ == "" || h == nil {
		panic("consumer: Mux.Handle needs a job type and a handler")
	}
	if _, dup := m.m[typ]; dup {
		panic(fmt.Sprintf("consumer: Mux.Handle: job type %q registered twice", typ))
	}
	m.m[typ] = h
	return m
}

// HandleFunc registers f for jobs of type typ.
func (m *Mux) HandleFunc(typ string, f func(ctx context.Context, job *stream.Job) error) *Mux {
	if f == nil {
		panic("consumer: Mux.HandleFunc needs a function")
	}
	return m.Handle(typ, HandlerFunc(f))
}

// Process implements [Handler]: it calls the handler registered for
// job.Type.
func (m *Mux) Process(ctx context.Context, job *stream.Job) error {
	m.mu.RLock()
	h, ok := m.m[job.Type]
	m.mu.RUnlock()
	if !ok {
		return Dead(ReasonUnknownType, fmt.Errorf("consumer: no handler for job type %q", job.Type))
	}
	return h.Process(ctx, job)
}

// Invalid returns the middleware that a middleware constructor returns when
// its configuration is invalid (err names the field): [Consumer.Run] with it
// in the chain returns err before it touches Redis, so that
// New(...).Use(...).Handle(...) stays fluent and nothing panics on a bad
// configuration. A handler wrapped by it outside a consumer returns err for
// every job.
func Invalid(err error) Middleware {
	return func(Handler) Handler { return invalidHandler{err} }
}

// invalidHandler is what an [Invalid] middleware wraps every handler into.
type invalidHandler struct{ err error }

// Process returns the configuration error.
func (h invalidHandler) Process(context.Context, *stream.Job) error { return h.err }

// buildChain returns h wrapped by mws, mws[0] outermost, or the error of
// the first (innermost) [Invalid] middleware among them.
func buildChain(h Handler, mws []Middleware) (Handler, error) {
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
		if ih, ok := h.(invalidHandler); ok {
			return nil, ih.err
		}
	}
	return h, nil
}
