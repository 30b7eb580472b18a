package consumer

import "testing"

// A request with little room does not cut the batch of one with much: it is
// left out of one read (which does not block) and is in the next whatever
// its room (red: with every request in every read, the first read's COUNT
// is the smallest room, 2).
func TestPickFlight_roomSkew(t *testing.T) {
	big, small := &readReq{stream: "big", count: 100}, &readReq{stream: "small", count: 2}
	flight, skipped := pickFlight([]*readReq{big, small})
	if len(flight) != 1 || flight[0] != big || !skipped {
		t.Fatalf("first read serves %v (skipped %v); want the big room alone, not blocking", streamsOf(flight), skipped)
	}
	big2 := &readReq{stream: "big", count: 100}
	flight, skipped = pickFlight([]*readReq{small, big2})
	if len(flight) != 2 || skipped {
		t.Fatalf("second read serves %v (skipped %v); want both: the request left out goes in the next read", streamsOf(flight), skipped)
	}
	near := &readReq{stream: "near", count: 50}
	flight, skipped = pickFlight([]*readReq{{stream: "big", count: 100}, near})
	if len(flight) != 2 || skipped {
		t.Fatalf("rooms 100 and 50 read %v (skipped %v); want both in one read", streamsOf(flight), skipped)
	}
}

func streamsOf(rs []*readReq) []string {
	var s []string
	for _, r := range rs {
		s = append(s, r.stream)
	}
	return s
}
