package stream

import (
	"encoding/json"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// NewJob returns a job of type typ whose payload is v encoded with msgpack.
func NewJob(typ string, v any) (*Job, error) {
	b, err := msgpack.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("stream: encode %s payload: %w", typ, err)
	}
	return &Job{Type: typ, Payload: b, ContentType: ContentTypeMsgpack}, nil
}

// NewJSONJob returns a job of type typ whose payload is v encoded as JSON,
// the format non-Go producers usually write.
func NewJSONJob(typ string, v any) (*Job, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("stream: encode %s payload: %w", typ, err)
	}
	return &Job{Type: typ, Payload: b, ContentType: ContentTypeJSON}, nil
}

// Decode unmarshals the job's payload into v, as its ContentType says:
// msgpack for application/msgpack, JSON for application/json or an empty
// content type. The error of a payload that does not decode wraps
// [ErrPayload], which the consumer treats as permanent.
func (j *Job) Decode(v any) error {
	var err error
	switch j.ContentType {
	case ContentTypeMsgpack:
		err = msgpack.Unmarshal(j.Payload, v)
	case ContentTypeJSON, "":
		err = json.Unmarshal(j.Payload, v)
	default:
		return fmt.Errorf("%w: unsupported content type %q", ErrPayload, j.ContentType)
	}
	if err != nil {
		return fmt.Errorf("%w: %s payload of job %s: %v", ErrPayload, j.ContentType, j.ID, err)
	}
	return nil
}

// ErrPayload is wrapped by every error of [Job.Decode].
var ErrPayload = errorString("stream: payload does not decode")

type errorString string

func (e errorString) Error() string { return string(e) }
