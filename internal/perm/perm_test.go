package perm_test

import (
	"context"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/perm"
	"github.com/pelicanqueue/pelican/internal/redistest"
)

// needs are a few commands on a queue "orders", of the shapes Pelican
// sends.
var needs = []perm.Need{
	{Args: []string{"XAUTOCLAIM", "orders", "g", "c", "0", "0-0", "COUNT", "1"}, Key: "orders", Use: "sweep"},
	{Args: []string{"ZREM", "{orders}:delayed", "m"}, Key: "{orders}:delayed", Use: "promotion"},
	{Args: []string{"XGROUP", "CREATE", "orders", "g", "$", "MKSTREAM"}, Key: "orders", Use: "group"},
	{Args: []string{"XADD", "{orders}:dlq", "*", "f", "v"}, Key: "{orders}:dlq", Use: "dead letters"},
	{Args: []string{"TIME"}, Use: "clock"},
}

// user returns a client of a new ACL user of srv with the given rules.
func user(t *testing.T, srv *redistest.Server, name string, rules ...string) *redis.Client {
	t.Helper()
	admin := srv.Client(t)
	args := []any{"ACL", "SETUSER", name, "reset", "on", ">pw"}
	for _, r := range rules {
		args = append(args, r)
	}
	if err := admin.Do(context.Background(), args...).Err(); err != nil {
		t.Fatalf("ACL SETUSER %s: %v", name, err)
	}
	return srv.Client(t, func(o *redis.Options) { o.Username, o.Password = name, "pw" })
}

func names(ns []perm.Need) string {
	var s []string
	for _, n := range ns {
		s = append(s, n.Name())
	}
	return strings.Join(s, ",")
}

func TestCheck(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	ctx := context.Background()
	scripts := []string{"+evalsha", "+eval"}
	for _, tc := range []struct {
		name  string
		rules []string
		want  string // names of the denied needs
	}{
		{"all granted", []string{"~orders", "~{orders}:*", "+@all"}, ""},
		{"commands missing", []string{"~orders", "~{orders}:*", "+@all", "-xautoclaim", "-zrem", "-xgroup|create"}, "XAUTOCLAIM,ZREM,XGROUP|CREATE"},
		{"key pattern missing", append([]string{"~orders", "+xautoclaim", "+zrem", "+xgroup|create", "+xadd", "+time"}, scripts...), "ZREM,XADD"},
		{"read-only derived keys", append([]string{"~orders", "%R~{orders}:*", "+xautoclaim", "+zrem", "+xgroup|create", "+xadd", "+time"}, scripts...), "ZREM,XADD"},
	} {
		rdb := user(t, srv, strings.ReplaceAll(tc.name, " ", "-"), tc.rules...)
		denied, checked, err := perm.Check(ctx, rdb, "orders", needs)
		if err != nil || !checked {
			t.Fatalf("%s: Check: checked %v, %v", tc.name, checked, err)
		}
		if got := names(denied); got != tc.want {
			t.Errorf("%s: denied %q, want %q (%s)", tc.name, got, tc.want, perm.Describe(denied))
		}
	}

	// A command the server does not know is reported as such.
	rdb := user(t, srv, "unknown", append([]string{"~orders", "+@all"}, scripts...)...)
	denied, _, err := perm.Check(ctx, rdb, "orders", []perm.Need{{Args: []string{"NOSUCHCOMMAND", "orders"}, Key: "orders"}})
	if err != nil || len(denied) != 1 || !denied[0].Unknown || !strings.Contains(denied[0].String(), "unknown to this server") {
		t.Fatalf("unknown command: denied %v, %v; want it reported unknown", denied, err)
	}

	// Nothing is written.
	if n := srv.Client(t).DBSize(ctx).Val(); n != 0 {
		t.Fatalf("the check wrote %d keys", n)
	}

	// A user that may not run scripts on the key (EVAL needs write access to
	// its keys) gets NOPERM from the check itself.
	for _, rules := range [][]string{{"~orders", "+@all", "-evalsha", "-eval"}, {"%R~orders", "+@all"}} {
		rdb = user(t, srv, "noscripts", rules...)
		if _, _, err := perm.Check(ctx, rdb, "orders", needs); err == nil || !strings.HasPrefix(err.Error(), "NOPERM") {
			t.Fatalf("user %v: %v, want NOPERM", rules, err)
		}
	}
}

// TestCheck_unchecked: a server without redis.acl_check_cmd cannot tell.
func TestCheck_unchecked(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	denied, checked, err := perm.Check(context.Background(), rdb, "orders", needs)
	if err != nil || checked || denied != nil {
		t.Fatalf("miniredis: denied %v, checked %v, %v; want unchecked", denied, checked, err)
	}
}

func TestNeed_String(t *testing.T) {
	t.Parallel()
	got := perm.Describe(needs[1:3])
	want := `ZREM on "{orders}:delayed" (promotion); XGROUP|CREATE on "orders" (group)`
	if got != want {
		t.Fatalf("Describe: %s, want %s", got, want)
	}
}
