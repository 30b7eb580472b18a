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
