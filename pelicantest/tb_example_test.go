package pelicantest_test

import "fmt"

// exampleT is a pelicantest.TB for Example functions, which have no
// *testing.T: Fatalf panics, and done runs the cleanups.
type exampleT struct{ cleanups []func() }

func newExampleT() *exampleT { return &exampleT{} }

func (t *exampleT) Helper()                           {}
func (t *exampleT) Cleanup(f func())                  { t.cleanups = append(t.cleanups, f) }
func (t *exampleT) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

func (t *exampleT) done() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}
