package limits

import (
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"testing"

	"github.com/tollgate/tollgate/internal/quota"
)

// step is one operation of a trace (testdata/traces.json.gz, written by
// internal/ratelimit's TestWriteLimitsTraces): its inputs, its answer and
// a hash of the tenant's state after it, as the differential harness held
// them equal on Redis (today's scripts) and here.
type step struct {
	Op, Tenant, State, Want string
	List, Zone              string
	Anchor                  int
	Req                     Request
	Adm                     Admission
	Units, Now              int64
	Monthly                 bool
	Stamp, Day, Month       int64
	Key, FP                 string
}

func loadTraces(tb testing.TB) []step {
	tb.Helper()
	f, err := os.Open("testdata/traces.json.gz")
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		tb.Fatal(err)
	}
	var steps []step
	if err := json.NewDecoder(z).Decode(&steps); err != nil {
		tb.Fatal(err)
	}
	return steps
}

func hashOf(s *State) string {
	h := sha256.Sum256([]byte(s.String()))
	return hex.EncodeToString(h[:8])
}

// TestTraces replays the traces: every answer and every state after a
// step must be the recorded one (the scripts').
func TestTraces(t *testing.T) {
	t.Parallel()
	steps := loadTraces(t)
	if len(steps) < 1000 {
		t.Fatalf("%d steps in the traces, want at least 1000", len(steps))
	}
	states := map[string]*State{}
	ops := map[string]int{}
	for i, st := range steps {
		s := states[st.Tenant]
		if s == nil {
			s = &State{}
			states[st.Tenant] = s
		}
		l, err := Decode(st.List)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if st.Zone != "" {
			if l.Calendar.Zone, err = quota.LoadZone(st.Zone); err != nil {
				t.Fatal(err)
			}
			l.Calendar.AnchorDay = st.Anchor
		}
		var got any
		switch st.Op {
		case "decide":
			d, err := l.Decide(s, st.Req)
			got = answerOf(d, err)
		case "report":
			got = answerOf(l.Report(s, st.Now), nil)
		case "giveback":
			got = l.GiveBack(s, st.Adm, st.Units)
		case "settle":
			delta, over := l.Settle(s, st.Adm, st.Units)
			got = []int64{delta, over}
		case "grant":
			got = Grant(s, quota.Calendar{}, st.Now, st.Monthly, st.Units, "", 0)
		case "reset":
			got = Reset(s, st.Stamp, st.Day, st.Month, st.Now)
		case "store":
			got = s.StoreAnswer(st.Key, st.FP)
		default:
			t.Fatalf("step %d: op %q", i, st.Op)
		}
		ops[st.Op]++
		if g := fmt.Sprint(got); g != st.Want {
			t.Fatalf("step %d %s %+v:\n got  %s\n want %s", i, st.Op, st, g, st.Want)
		}
		if h := hashOf(s); h != st.State {
			t.Fatalf("step %d %s %+v: state %s\n%s", i, st.Op, st, h, s)
		}
	}
	t.Logf("ops: %v", ops)
}

func answerOf(d Decision, err error) string {
	if err != nil {
		return "error " + err.Error()
	}
	return fmt.Sprint(d.Flat(true))
}
