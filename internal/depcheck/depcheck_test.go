// Package depcheck holds a test that keeps the core packages' dependencies
// to what they need: no observability library and no embedded Redis reach
// stream, consumer or claim (middleware imports those, users choose them).
package depcheck

import (
	"os/exec"
	"strings"
	"testing"
)

func TestCoreDependencies(t *testing.T) {
	t.Parallel()
	forbidden := []string{
		"go.opentelemetry.io/",
		"github.com/prometheus/",
		"github.com/alicebob/miniredis",
	}
	for _, pkg := range []string{"stream", "consumer", "claim", "lockx", "idem"} {
		path := "github.com/pelicanqueue/pelican/" + pkg
		out, err := exec.Command("go", "list", "-deps", path).CombinedOutput()
		if err != nil {
			if strings.Contains(string(out), "cannot find package") || strings.Contains(string(out), "is not in std") ||
				strings.Contains(string(out), "no required module provides package") || strings.Contains(string(out), "directory not found") {
				continue // not written yet
			}
			t.Fatalf("go list -deps %s: %v\n%s", path, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, f := range forbidden {
				if strings.HasPrefix(dep, f) {
					t.Errorf("%s depends on %s; core packages must not import %s*", pkg, dep, f)
				}
			}
		}
	}
}
