package ratelimit

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"testing"

	"github.com/tollgate/tollgate/internal/testenv"
)

// tracesFile is where TestWriteLimitsTraces writes internal/limits'
// traces (relative to this package).
const tracesFile = "../limits/testdata/traces.json.gz"

// TestWriteLimitsTraces records the money seeds and random schedules of
// the differential harness, every step's inputs and answer in
// internal/limits' terms and a hash of the state after it, for
// internal/limits' own tests, which replay them without Redis (and so run
// under mutation testing). Every recorded step is one the harness held
// equal on Redis and on internal/limits. Run with LIMITS_TRACES=1 after a
// change of the algebra that the scripts share.
func TestWriteLimitsTraces(t *testing.T) {
	if os.Getenv("LIMITS_TRACES") == "" {
		t.Skip("set LIMITS_TRACES=1 to write " + tracesFile)
	}
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	var steps []map[string]any
	recordOn := func(w *twin) *twin {
		w.m.record = func(step map[string]any) {
			h := sha256.Sum256([]byte(w.m.String()))
			step["tenant"], step["state"] = w.tenant, hex.EncodeToString(h[:8])
			steps = append(steps, step)
		}
		return w
	}
	seeds := moneySeeds(t)
	for _, name := range sortedKeys(seeds) {
		seeds[name](recordOn(newTwin(t, c, r)))
	}
	t.Setenv("RATELIMIT_SEED", "1")
	runAlgebraWith(t, c, 12, 150, recordOn)
	var buf bytes.Buffer
	z := gzip.NewWriter(&buf)
	if err := json.NewEncoder(z).Encode(steps); err != nil {
		t.Fatal(err)
	}
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tracesFile, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d steps, %d bytes", len(steps), buf.Len())
}

func sortedKeys[V any](m map[string]V) []string {
	return union(m, map[string]V{})
}
