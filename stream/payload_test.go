package stream_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/pelicanqueue/pelican/stream"
)

func TestNewJob(t *testing.T) {
	t.Parallel()

	type args struct {
		N int    `msgpack:"n" json:"n"`
		S string `msgpack:"s" json:"s"`
	}
	in := args{N: 42, S: "x"}
	for _, tt := range []struct {
		name        string
		newJob      func(string, any) (*stream.Job, error)
		contentType string
	}{
		{"Msgpack", stream.NewJob, stream.ContentTypeMsgpack},
		{"JSON", stream.NewJSONJob, stream.ContentTypeJSON},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			job, err := tt.newJob("t", in)
			if err != nil {
				t.Fatalf("error: %v", err)
			}
			if job.Type != "t" || job.ContentType != tt.contentType {
				t.Errorf("Type, ContentType = %q, %q; want t, %q", job.Type, job.ContentType, tt.contentType)
			}
			var out args
			if err := job.Decode(&out); err != nil || out != in {
				t.Errorf("Decode = %+v, %v; want %+v, nil", out, err, in)
			}

			if _, err := tt.newJob("t", make(chan int)); err == nil || !strings.Contains(err.Error(), "encode t payload") {
				t.Errorf("payload of a channel: error %v, want an encode error naming the type", err)
			}
		})
	}
}

func TestJob_Decode(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		job  *stream.Job
		want string // in the error; "" for none
	}{
		{"EmptyContentTypeIsJSON", &stream.Job{ID: "j", Payload: []byte(`{"a":1}`)}, ""},
		{"BadJSON", &stream.Job{ID: "j", Payload: []byte(`{`), ContentType: stream.ContentTypeJSON}, "payload of job j"},
		{"BadMsgpack", &stream.Job{ID: "j", Payload: []byte{0xc1}, ContentType: stream.ContentTypeMsgpack}, "application/msgpack payload of job j"},
		{"UnknownContentType", &stream.Job{ID: "j", Payload: []byte(`x`), ContentType: "text/plain"}, `unsupported content type "text/plain"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			var v map[string]int
			err := tt.job.Decode(&v)
			if tt.want == "" {
				if err != nil {
					t.Errorf("Decode error: %v", err)
				}
				return
			}
			if !errors.Is(err, stream.ErrPayload) {
				t.Errorf("error %v does not wrap ErrPayload", err)
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want it to contain %q", err, tt.want)
			}
		})
	}
}
