package stream_test

import (
	"math/rand"
	"reflect"
	"strings"
	"testing"
	"testing/quick"

	"github.com/pelicanqueue/pelican/internal/keyslot"
	"github.com/pelicanqueue/pelican/stream"
)

// hashTag returns the part of key Redis Cluster hashes: its hash tag, or
// the whole key when it has none.
func hashTag(key string) string {
	if tag, ok := keyslot.Tag(key); ok {
		return tag
	}
	return key
}

// formsNoTag reports whether name has braces that do not form a hash tag: the
// names KeysFor must reject.
func formsNoTag(name string) bool {
	return strings.ContainsAny(name, "{}") && hashTag(name) == name
}

func TestKeySlot(t *testing.T) {
	t.Parallel()

	// The slots this package's keys are checked with, against the values
	// in the Redis documentation.
	tests := []struct {
		key     string
		wantTag string
		want    int
	}{
		{"somekey", "somekey", 11058},       // CLUSTER KEYSLOT docs
		{"foo{hash_tag}", "hash_tag", 2515}, // CLUSTER KEYSLOT docs
		{"bar{hash_tag}", "hash_tag", 2515}, // CLUSTER KEYSLOT docs
		{"foo", "foo", 12182},               // redis-cli -c examples
		{"foo{}{bar}", "foo{}{bar}", -1},    // cluster-spec: the whole key
		{"foo{{bar}}zap", "{bar", -1},       // cluster-spec: "{bar"
		{"foo{bar}{zap}", "bar", -1},        // cluster-spec: "bar"
		{"{user1000}.following", "user1000", -1},
	}
	for _, tt := range tests {
		if got := hashTag(tt.key); got != tt.wantTag {
			t.Errorf("hashTag(%q) = %q, want %q", tt.key, got, tt.wantTag)
		}
		if got := keyslot.Of(tt.key); tt.want >= 0 && got != tt.want {
			t.Errorf("keyslot.Of(%q) = %d, want %d", tt.key, got, tt.want)
		}
	}
}

// streamNames are names KeysFor accepts, picked for how Redis Cluster hashes them.
var streamNames = []string{
	"jobs",
	"a",
	"orders:jobs",
	"app:prod:emails",
	"with space",
	"ütf-8 ✓",
	"{orders}",
	"{orders}:jobs",
	"prefix:{orders}:jobs",
	"{a}b{c}",
	"}{a}",          // a '}' before the tag does not matter
	"foo{{bar}}zap", // tag "{bar"
	"{{}",           // tag "{"
	"x{y}}",
	"{orders}:jobs:dlq",
	"1700000000000-0",
	":",
	"::",
	"\x00\xff",
}

func checkSlots(t *testing.T, name string) {
	t.Helper()
	keys, err := stream.KeysFor(name)
	if err != nil {
		t.Errorf("KeysFor(%q) error: %v", name, err)
		return
	}
	if keys.Stream != name {
		t.Errorf("KeysFor(%q).Stream = %q, want the name itself", name, keys.Stream)
	}
	want := keyslot.Of(name)
	derived := []string{keys.Dead, keys.Delayed, keys.Crashes + "1-0", keys.Idem + "k", keys.Once + "k", keys.Lock + "{k}",
		keys.Rate + "k", keys.Limit + "k", keys.Periodic + "last", keys.Idem + "}{x}", keys.Lock + "{}a}"}
	for _, suffix := range []string{"lock:x", "idem:y", "", "{other}", "}", "{"} {
		k, err := stream.DerivedKey(name, suffix)
		if err != nil {
			t.Errorf("DerivedKey(%q, %q) error: %v", name, suffix, err)
			continue
		}
		derived = append(derived, k)
	}
	seen := map[string]bool{name: true}
	for _, k := range derived {
		if got := keyslot.Of(k); got != want {
			t.Errorf("stream %q (slot %d): derived key %q has slot %d", name, want, k, got)
		}
		if seen[k] {
			t.Errorf("stream %q: derived key %q repeats another key", name, k)
		}
		seen[k] = true
	}
}

func TestKeysFor(t *testing.T) {
	t.Parallel()

	t.Run("SameSlot", func(t *testing.T) {
		t.Parallel()

		for _, name := range streamNames {
			checkSlots(t, name)
		}
	})

	t.Run("Shape", func(t *testing.T) {
		t.Parallel()

		tests := []struct {
			name string
			want stream.Keys
		}{
			{"orders", stream.Keys{Stream: "orders", Dead: "{orders}:dlq", Delayed: "{orders}:delayed", Crashes: "{orders}:crashes:",
				Once: "{orders}:once:", Idem: "{orders}:idem:", Lock: "{orders}:lock:", Rate: "{orders}:rate:", Limit: "{orders}:limit:", Periodic: "{orders}:periodic:",
				Paused: "{orders}:paused", Control: "{orders}:control", Job: "{orders}:job:"}},
			{"{shop}:orders", stream.Keys{Stream: "{shop}:orders", Dead: "{shop}:orders:dlq", Delayed: "{shop}:orders:delayed", Crashes: "{shop}:orders:crashes:",
				Once: "{shop}:orders:once:", Idem: "{shop}:orders:idem:", Lock: "{shop}:orders:lock:", Rate: "{shop}:orders:rate:", Limit: "{shop}:orders:limit:", Periodic: "{shop}:orders:periodic:",
				Paused: "{shop}:orders:paused", Control: "{shop}:orders:control", Job: "{shop}:orders:job:"}},
		}
		for _, tt := range tests {
			got, err := stream.KeysFor(tt.name)
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("KeysFor(%q) = %+v, %v; want %+v, nil", tt.name, got, err, tt.want)
			}
		}
	})

	t.Run("Rejects", func(t *testing.T) {
		t.Parallel()

		for _, name := range []string{"", "a}b", "x{}y", "{", "}", "{}", "a{b", "foo{}{bar}", "}{", "{}{a}"} {
			if keys, err := stream.KeysFor(name); err == nil {
				t.Errorf("KeysFor(%q) = %+v, nil; want an error", name, keys)
			} else if !strings.HasPrefix(err.Error(), "stream: ") {
				t.Errorf("KeysFor(%q) error %q lacks the package prefix", name, err)
			}
			if k, err := stream.DerivedKey(name, "x"); err == nil {
				t.Errorf("DerivedKey(%q, \"x\") = %q, nil; want an error", name, k)
			}
		}
	})

	t.Run("Property", func(t *testing.T) {
		t.Parallel()

		// Names from a small alphabet, so that braces are common.
		const alphabet = "ab:{}-"
		f := func(raw []byte) bool {
			var b strings.Builder
			for _, c := range raw {
				b.WriteByte(alphabet[int(c)%len(alphabet)])
			}
			name := b.String()
			_, err := stream.KeysFor(name)
			if wantErr := name == "" || formsNoTag(name); (err != nil) != wantErr {
				t.Errorf("KeysFor(%q) error = %v; want an error: %t", name, err, wantErr)
				return false
			}
			if err == nil {
				checkSlots(t, name)
			}
			return !t.Failed()
		}
		cfg := &quick.Config{MaxCount: 5000, Rand: rand.New(rand.NewSource(1))}
		if err := quick.Check(f, cfg); err != nil {
			t.Error(err)
		}
	})
}

// TestProducerConfig_OnceNamespaceReserved checks that the enqueue-once
// markers cannot take a namespace the queue's other keys use.
func TestProducerConfig_OnceNamespaceReserved(t *testing.T) {
	t.Parallel()
	for _, ns := range []string{"dlq", "delayed", "crashes", "idem", "lock", "rate", "limit", "periodic"} {
		err := (stream.ProducerConfig{Stream: "orders", OnceNamespace: ns}).Validate()
		if err == nil || !strings.Contains(err.Error(), "ProducerConfig.OnceNamespace") {
			t.Errorf("Validate with OnceNamespace %q = %v, want an error naming ProducerConfig.OnceNamespace", ns, err)
		}
	}
}
