package main

import (
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/pelicanqueue/pelican/internal/leakcheck"
)

func TestMain(m *testing.M) {
	leakcheck.Main(m, 5*time.Second, "pelican/consumer.(*Consumer)", "pelican/claim.", "otel/sdk/trace.", "otlptracehttp.")
}

// receiver is an OTLP/HTTP trace receiver: it keeps the spans POSTed to
// /v1/traces, with their resource's service.name.
type receiver struct {
	mu       sync.Mutex
	spans    []*tracepb.Span
	services []string
	requests int
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		http.Error(w, "content type "+ct, http.StatusUnsupportedMediaType)
		return
	}
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		gz, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = gz
	}
	raw, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req collectortrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(raw, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	rc.mu.Lock()
	rc.requests++
	for _, rs := range req.GetResourceSpans() {
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				rc.services = append(rc.services, kv.GetValue().GetStringValue())
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			rc.spans = append(rc.spans, ss.GetSpans()...)
		}
	}
	rc.mu.Unlock()
	resp, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(resp)
}

// TestRun runs the example embedded against an OTLP/HTTP receiver in the
// test process, configured only by OTEL_* variables, and checks that the
// receiver got the producer and consumer spans, linked as parent and child.
func TestRun(t *testing.T) {
	rc := &receiver{}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	t.Setenv("REDIS_URL", "")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_SERVICE_NAME", "pelican-example-test")
	if err := run(); err != nil {
		t.Fatal(err)
	}
	// run returns after the provider's Shutdown, which flushed every span.
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.requests == 0 {
		t.Fatal("the receiver got no export request")
	}
	for _, s := range rc.services {
		if s != "pelican-example-test" {
			t.Errorf("service.name %q, want OTEL_SERVICE_NAME's", s)
		}
	}
	byID := make(map[string]*tracepb.Span)
	count := make(map[string]int)
	for _, s := range rc.spans {
		byID[hex.EncodeToString(s.GetSpanId())] = s
		name, _, _ := strings.Cut(s.GetName(), " ")
		count[name]++
	}
	// 3 jobs; one snoozed once and one retried once: 5 runs.
	want := map[string]int{"signup": 1, "send": 3, "process": 5, "pelican.handler": 5}
	for name, n := range want {
		if count[name] != n {
			t.Errorf("%d %q spans, want %d (all: %v)", count[name], name, n, count)
		}
	}
	parentOf := func(s *tracepb.Span) *tracepb.Span { return byID[hex.EncodeToString(s.GetParentSpanId())] }
	for _, s := range rc.spans {
		name, _, _ := strings.Cut(s.GetName(), " ")
		var wantParent string
		switch name {
		case "send":
			wantParent = "signup"
		case "process":
			wantParent = "send"
		case "pelican.handler":
			wantParent = "process"
		default:
			continue
		}
		p := parentOf(s)
		if p == nil || !strings.HasPrefix(p.GetName(), wantParent) {
			t.Errorf("span %q: parent %v, want a %q span", s.GetName(), p.GetName(), wantParent)
			continue
		}
		if !bytes.Equal(s.GetTraceId(), p.GetTraceId()) {
			t.Errorf("span %q is not in its parent's trace", s.GetName())
		}
		if name == "process" && s.GetKind() != tracepb.Span_SPAN_KIND_CONSUMER {
			t.Errorf("process span kind %v, want consumer", s.GetKind())
		}
	}
	errors := 0
	for _, s := range rc.spans {
		if strings.HasPrefix(s.GetName(), "process") && s.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR {
			errors++
		}
	}
	if errors != 1 {
		t.Errorf("%d process spans with status error, want 1 (the retried attempt; the snooze is not an error)", errors)
	}
}
