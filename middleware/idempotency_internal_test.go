package middleware

import (
	"strings"
	"testing"

	"github.com/pelicanqueue/pelican/stream"
)

// An owner token is the entry ID, ':' and 8 characters of base64url, and
// differs between deliveries, for entry IDs of every length.
func TestIdemOwner_format(t *testing.T) {
	t.Parallel()
	for _, id := range []string{"1-0", "1796446553582-12", strings.Repeat("9", 20) + "-" + strings.Repeat("9", 20)} {
		job := &stream.Job{EntryID: id}
		a, b := idemOwner(job), idemOwner(job)
		rest, ok := strings.CutPrefix(a, id+":")
		if !ok || len(rest) != 8 || strings.Trim(rest, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") != "" {
			t.Errorf("idemOwner(%q) = %q, want the ID, ':' and 8 base64url characters", id, a)
		}
		if a == b {
			t.Errorf("idemOwner(%q) gave %q twice", id, a)
		}
	}
}
