package main

import "testing"

func TestPayload_seqOf(t *testing.T) {
	t.Parallel()
	for _, seq := range []int{0, 7, 123456789, 999999999} {
		p := payload(seq)
		if len(p) != payloadSize {
			t.Fatalf("payload(%d) has %d bytes, want %d", seq, len(p), payloadSize)
		}
		if got, ok := seqOf(string(p)); !ok || got != seq {
			t.Fatalf("seqOf(payload(%d)) = %d, %v", seq, got, ok)
		}
	}
	if _, ok := seqOf(`{"n":12x456789}`); ok {
		t.Fatal("seqOf accepted a payload without a sequence number")
	}
}

// The bench's truth check: a phase passes only when exactly its jobs ran,
// each as often as intended, each under one job ID.
func TestJobSet_check(t *testing.T) {
	t.Parallel()
	run := func(ids bool, seqs []int, jobIDs []string) *jobSet {
		s := newJobSet(3)
		if ids {
			s.withIDs()
		}
		for i, q := range seqs {
			seeJob(s, payload(q), jobIDs[i])
		}
		return s
	}
	for _, tc := range []struct {
		name   string
		ids    bool
		seqs   []int
		jobIDs []string
		runs   int
		ok     bool
	}{
		{"exact", true, []int{0, 1, 2}, []string{"a", "b", "c"}, 3, true},
		{"each twice", true, []int{0, 1, 2, 2, 1, 0}, []string{"a", "b", "c", "c", "b", "a"}, 6, true},
		{"missing", true, []int{0, 1}, []string{"a", "b"}, 3, false},
		{"duplicate run", true, []int{0, 1, 2, 2}, []string{"a", "b", "c", "c"}, 3, false},
		{"out of range", true, []int{0, 1, 2, 3}, []string{"a", "b", "c", "d"}, 4, false},
		{"another job ID", true, []int{0, 1, 2, 2}, []string{"a", "b", "c", "x"}, 4, false},
		{"IDs unchecked", false, []int{0, 1, 2, 2}, []string{"a", "b", "c", "x"}, 4, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := run(tc.ids, tc.seqs, tc.jobIDs).check(tc.runs)
			if (err == nil) != tc.ok {
				t.Fatalf("check(%d) = %v, want ok %v", tc.runs, err, tc.ok)
			}
		})
	}
}

func TestParseConcurrency(t *testing.T) {
	t.Parallel()
	if cs, err := parseConcurrency("0, 50"); err != nil || len(cs) != 2 || cs[0] != 0 || cs[1] != 50 {
		t.Fatalf("parseConcurrency(\"0, 50\") = %v, %v", cs, err)
	}
	for _, bad := range []string{"", "-1", "x", "50,50"} {
		if _, err := parseConcurrency(bad); err == nil {
			t.Fatalf("parseConcurrency(%q) accepted", bad)
		}
	}
}

func TestParseCommandStats(t *testing.T) {
	t.Parallel()
	info := "# Commandstats\r\n" +
		"cmdstat_evalsha:calls=3654,usec=863666,usec_per_call=236.36,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_xinfo|groups:calls=723,usec=3039,usec_per_call=4.20,rejected_calls=0,failed_calls=0\r\n"
	got := parseCommandStats(info)
	want := map[string]cmdStat{"evalsha": {3654, 863666}, "xinfo|groups": {723, 3039}}
	if len(got) != len(want) {
		t.Fatalf("parseCommandStats = %v, want %v", got, want)
	}
	for k, w := range want {
		if got[k] != w {
			t.Fatalf("parseCommandStats[%q] = %v, want %v", k, got[k], w)
		}
	}
}
