package redistest

import (
	"flag"
	"runtime"
	"strconv"
)

// WidenParallel sets -test.parallel to n (or GOMAXPROCS, if larger) when
// the command line did not set it. Call it from TestMain, before m.Run. It
// is for a package whose parallel tests wait far more than they compute
// (leases running out, servers restarted, schedules coming due): at go
// test's default, GOMAXPROCS, they leave a 2-core machine idle. On the
// development machine, with -race: the integration package 504 s at the
// default and 324 s at 4 (session 16), periodic 83 s and 46 s (session
// 33). Higher is not better: with integration at 6, two whole-suite runs
// beside busy loops failed tests in other packages on broken timing
// preconditions (session 31), where runs at 4 passed; consumer at 4 (37 s
// instead of 74 s) failed TestConsumer_Heartbeat/OwnSweepDoesNotRunJobTwice
// (a 200 ms visibility timeout) in one of two such runs (session 33).
func WidenParallel(n int) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if f := flag.Lookup("test.parallel"); f != nil && !set {
		_ = f.Value.Set(strconv.Itoa(max(n, runtime.GOMAXPROCS(0))))
	}
}
